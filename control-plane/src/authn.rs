//! Who is calling: the gRPC listener's mutual TLS, the identities a client certificate
//! proves, and the two rules built on them.
//!
//! - **RouteDiscovery**: a proxy's `node.id` must be one of its certificate's identities
//!   (a URI SAN such as a SPIFFE ID, or a DNS SAN); otherwise the stream is refused with
//!   `PERMISSION_DENIED`. The verified identity is what `ListProxies` shows.
//! - **Admin**: only callers whose certificate proves one of `--admin-identities` (the
//!   operators); everyone else, proxies included, gets `PERMISSION_DENIED`.
//! - Health and reflection stay open: a client without a certificate may use them (one
//!   with a certificate from another CA fails the handshake).
//!
//! In plaintext mode (`--insecure-plaintext`, development only) nobody is authenticated:
//! both rules are off.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use holdfast_proto::mtls::{self, Reloading};
use http::Extensions;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The authentication mode of the gRPC listener.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Mutual TLS: callers are identified by their certificates.
    MutualTls {
        /// Identities allowed to call Admin.
        admin_identities: Arc<Vec<String>>,
    },
    /// Plaintext, for local development: nobody is authenticated.
    Plaintext,
}

/// The peer's address, over TLS or not.
pub fn peer_addr(extensions: &Extensions) -> Option<SocketAddr> {
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.get_ref().remote_addr())
        .or_else(|| {
            extensions
                .get::<TcpConnectInfo>()
                .and_then(|i| i.remote_addr())
        })
}

/// The identities the peer's client certificate proves (empty over plaintext).
pub fn peer_identities(extensions: &Extensions) -> Vec<String> {
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.peer_certs())
        .and_then(|certs| certs.first().map(mtls::identities))
        .unwrap_or_default()
}

/// The serial of the peer's client certificate ("" over plaintext or without one).
pub fn peer_serial(extensions: &Extensions) -> String {
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.peer_certs())
        .and_then(|certs| certs.first().map(mtls::serial))
        .unwrap_or_default()
}

/// What a proxy's certificate proved: its identity and the certificate's serial (both
/// empty in plaintext mode).
#[derive(Debug, Clone, Default)]
pub struct Proven {
    /// The identity, equal to the node id.
    pub identity: String,
    /// The client certificate's serial.
    pub serial: String,
}

impl Mode {
    /// What a proxy proves for `node_id`, or `PERMISSION_DENIED` when its certificate
    /// does not prove that node id.
    pub fn check_node(&self, extensions: &Extensions, node_id: &str) -> Result<Proven, Status> {
        match self {
            Mode::Plaintext => Ok(Proven::default()),
            Mode::MutualTls { .. } => {
                let identities = peer_identities(extensions);
                if identities.iter().any(|i| i == node_id) {
                    Ok(Proven {
                        identity: node_id.to_owned(),
                        serial: peer_serial(extensions),
                    })
                } else {
                    Err(Status::permission_denied(format!(
                        "node id {node_id:?} is not an identity of the client certificate ({identities:?})"
                    )))
                }
            }
        }
    }

    /// Admits an Admin call only from an operator identity.
    pub fn check_admin(&self, extensions: &Extensions) -> Result<(), Status> {
        match self {
            Mode::Plaintext => Ok(()),
            Mode::MutualTls { admin_identities } => {
                let identities = peer_identities(extensions);
                if identities.iter().any(|i| admin_identities.contains(i)) {
                    Ok(())
                } else {
                    Err(Status::permission_denied(format!(
                        "the Admin service is for operators (--admin-identities); the client certificate proves {identities:?}"
                    )))
                }
            }
        }
    }
}

/// Accepts TCP connections on `listener` and yields those that complete a TLS handshake
/// (with no client certificate, or one the current configuration accepts) within
/// [`HANDSHAKE_TIMEOUT`]. Each handshake uses the configuration current at accept time.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<Reloading<ServerConfig>>,
    on_failure: impl Fn() + Send + Sync + 'static,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let on_failure = Arc::new(on_failure);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(config.current());
            let (out, on_failure) = (tx.clone(), on_failure.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = out.send(Ok(tls)).await;
                    }
                    Ok(Err(error)) => {
                        on_failure();
                        tracing::info!(%peer, %error, "gRPC TLS handshake failed");
                    }
                    Err(_) => {
                        on_failure();
                        tracing::info!(%peer, "gRPC TLS handshake timed out");
                    }
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}
