//! Who is calling: the gRPC listener's mutual TLS, the identities a client certificate
//! proves, and the two rules built on them.
//!
//! - **RouteDiscovery**: only a client whose certificate proves a proxy identity (one
//!   matching `--proxy-identities`, and none of `--admin-identities`) may open a stream,
//!   and that is checked before the stream's first message is read or decoded, so a peer
//!   without such a certificate makes the control plane read nothing. A proxy's `node.id`
//!   must then be one of those identities (a URI SAN such as a SPIFFE ID, or a DNS SAN);
//!   otherwise the stream is refused with `PERMISSION_DENIED`. The verified identity is
//!   what `ListProxies` shows. An operator's certificate never opens a stream, so it never
//!   receives a snapshot's private keys.
//! - **Admin**: only callers whose certificate proves one of `--admin-identities` (the
//!   operators); everyone else, proxies included, gets `PERMISSION_DENIED`.
//! - Health and reflection stay open: a client without a certificate may use them (one
//!   with a certificate from another CA fails the handshake). Such clients hold at most
//!   [`UNAUTHENTICATED_PER_PEER`] connections per address and [`UNAUTHENTICATED_TOTAL`] in
//!   all; more are closed at once, so they cannot exhaust the port. Their messages are at
//!   most [`UNAUTHENTICATED_MESSAGE_BYTES`] (health and reflection requests are a name),
//!   so what such a connection holds is bounded by its receive window.
//! - Before anyone is known, handshakes in progress are capped too:
//!   [`HANDSHAKES_PER_PEER`] per address, [`HANDSHAKES_TOTAL`] in all (a peer with none in
//!   progress may go past that up to four times), each at most [`HANDSHAKE_TIMEOUT`].
//!
//! In plaintext mode (`--insecure-plaintext`, development only) nobody is authenticated:
//! both rules are off.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use holdfast_process::tls::{self as mtls, Reloading};
use http::Extensions;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most gRPC connections without a client certificate from one address.
pub const UNAUTHENTICATED_PER_PEER: usize = 8;
/// Most gRPC connections without a client certificate in all: with tonic's 1 MiB
/// receive window each, at most 64 MiB of what they send is held.
pub const UNAUTHENTICATED_TOTAL: usize = 64;
/// Largest message health and reflection decode (the services anyone may call).
pub const UNAUTHENTICATED_MESSAGE_BYTES: usize = 16 * 1024;
/// Most TLS handshakes in progress from one address.
pub const HANDSHAKES_PER_PEER: usize = 8;
/// Most TLS handshakes in progress in all (a peer with none in progress may go up to
/// four times this, so that a proxy or an operator gets in while others hold every slot).
pub const HANDSHAKES_TOTAL: usize = 256;

/// A gRPC connection, with the slot it holds if it came without a client certificate.
#[derive(Debug)]
pub struct Accepted {
    inner: TlsStream<TcpStream>,
    _slot: Option<holdfast_process::admin::Slot>,
}

impl tokio::io::AsyncRead for Accepted {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Accepted {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The identity and address are the TLS connection's.
impl tonic::transport::server::Connected for Accepted {
    type ConnectInfo = <TlsStream<TcpStream> as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The authentication mode of the gRPC listener.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Mutual TLS: callers are identified by their certificates.
    MutualTls {
        /// Identities allowed to call Admin.
        admin_identities: Arc<Vec<String>>,
        /// Patterns of the identities allowed to stream routes (`*` matches any run of
        /// characters).
        proxy_identities: Arc<Vec<String>>,
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

/// Whether `identity` matches `pattern`, where `*` matches any run of characters
/// (`spiffe://holdfast/proxy/*`, `holdfast-proxy-*`).
pub fn matches(pattern: &str, identity: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = identity.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl Mode {
    /// The identities of the peer's certificate that may stream routes: those matching a
    /// `--proxy-identities` pattern, on a certificate that proves no operator identity
    /// (an operator's certificate never streams, whatever else it names). Checked before
    /// a stream's first message is read: a peer with none gets `PERMISSION_DENIED` at once.
    pub fn proxy_identities(&self, extensions: &Extensions) -> Result<Vec<String>, Status> {
        match self {
            Mode::Plaintext => Ok(Vec::new()),
            Mode::MutualTls {
                admin_identities,
                proxy_identities,
            } => {
                let identities = peer_identities(extensions);
                if identities.iter().any(|i| admin_identities.contains(i)) {
                    return Err(Status::permission_denied(
                        "route discovery is for proxies: this client certificate proves an operator identity",
                    ));
                }
                let proven: Vec<String> = identities
                    .into_iter()
                    .filter(|i| proxy_identities.iter().any(|p| matches(p, i)))
                    .collect();
                if proven.is_empty() {
                    return Err(Status::permission_denied(
                        "route discovery is for proxies: the client certificate proves no identity matching --proxy-identities (operator identities never do)",
                    ));
                }
                Ok(proven)
            }
        }
    }

    /// What a proxy proves for `node_id`, or `PERMISSION_DENIED` when its certificate
    /// does not prove that node id as a proxy identity ([`Mode::proxy_identities`]).
    pub fn check_node(&self, extensions: &Extensions, node_id: &str) -> Result<Proven, Status> {
        match self {
            Mode::Plaintext => Ok(Proven::default()),
            Mode::MutualTls { .. } => {
                let identities = self.proxy_identities(extensions)?;
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
            Mode::MutualTls {
                admin_identities, ..
            } => {
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
/// A connection without a client certificate needs a slot (per address and in all);
/// without one it is closed at once.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<Reloading<ServerConfig>>,
    on_failure: impl Fn() + Send + Sync + 'static,
) -> ReceiverStream<Result<Accepted, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let on_failure = Arc::new(on_failure);
    let unauthenticated = Arc::new(holdfast_process::admin::Open::default());
    let handshaking = Arc::new(holdfast_process::admin::Open::default());
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
            let caps = holdfast_process::admin::Caps {
                total: HANDSHAKES_TOTAL,
                per_peer: HANDSHAKES_PER_PEER,
                new_peer_total: HANDSHAKES_TOTAL * 4,
            };
            let Some(handshake_slot) = handshaking.enter(peer.ip(), caps) else {
                on_failure();
                tracing::debug!(%peer, "too many gRPC TLS handshakes in progress; closing");
                drop(stream);
                continue;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(config.current());
            let (out, on_failure) = (tx.clone(), on_failure.clone());
            let unauthenticated = unauthenticated.clone();
            tokio::spawn(async move {
                let handshake =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                drop(handshake_slot);
                match handshake {
                    Ok(Ok(tls)) => {
                        let slot = if tls.get_ref().1.peer_certificates().is_none() {
                            let caps = holdfast_process::admin::Caps {
                                total: UNAUTHENTICATED_TOTAL,
                                per_peer: UNAUTHENTICATED_PER_PEER,
                                new_peer_total: UNAUTHENTICATED_TOTAL,
                            };
                            let Some(slot) = unauthenticated.enter(peer.ip(), caps) else {
                                tracing::debug!(%peer, "gRPC connection without a certificate past its cap; closing");
                                return;
                            };
                            Some(slot)
                        } else {
                            None
                        };
                        let accepted = Accepted {
                            inner: tls,
                            _slot: slot,
                        };
                        let _ = out.send(Ok(accepted)).await;
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

#[cfg(test)]
mod pattern_tests {
    use super::matches;

    #[test]
    fn a_star_matches_any_run_of_characters_and_nothing_else_is_special() {
        for (pattern, identity) in [
            ("spiffe://holdfast/proxy/*", "spiffe://holdfast/proxy/p-1"),
            ("holdfast-proxy-*", "holdfast-proxy-7c9f-abcde"),
            ("*", "anything"),
            ("proxy-1", "proxy-1"),
            ("a*b*c", "a-x-b-y-c"),
            ("*.proxies.test", "p1.proxies.test"),
        ] {
            assert!(matches(pattern, identity), "{pattern} {identity}");
        }
        for (pattern, identity) in [
            ("spiffe://holdfast/proxy/*", "spiffe://holdfast/operator"),
            ("holdfast-proxy-*", "holdfast-control-plane"),
            ("proxy-1", "proxy-10"),
            ("a*b*c", "a-x-c-y-b"),
            ("*.proxies.test", "p1.proxies.test.evil"),
            ("ab*ba", "aba"),
        ] {
            assert!(!matches(pattern, identity), "{pattern} {identity}");
        }
    }
}
