//! The HTTPS listener's TLS: rustls with the certificate picked by SNI from the route
//! table being served, ALPN `h2` and `http/1.1`, TLS 1.2 and 1.3, session resumption
//! (a session cache and TLS 1.3 tickets).
//!
//! The resolver reads the current table at every handshake, so a renewed certificate is
//! used for new handshakes as soon as its snapshot is applied, and open connections keep
//! the certificate they were made with.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;

use crate::table::RouteTable;

/// Picks the certificate for a handshake from the served route table.
#[derive(Debug)]
pub struct SniResolver {
    table: Arc<ArcSwapOption<RouteTable>>,
}

impl SniResolver {
    /// Resolves from `table`.
    pub fn new(table: Arc<ArcSwapOption<RouteTable>>) -> Self {
        SniResolver { table }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let table = self.table.load();
        let sni = hello.server_name().map(|n| n.to_ascii_lowercase());
        table
            .as_ref()?
            .certificate_for(sni.as_deref())
            .map(|c| c.key.clone())
    }
}

/// Picks the certificate for a handshake on a Gateway listener from that listener's
/// certificates in the served route table.
#[derive(Debug)]
pub struct GatewayResolver {
    table: Arc<ArcSwapOption<RouteTable>>,
    listener: Arc<str>,
}

impl ResolvesServerCert for GatewayResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let table = self.table.load();
        let sni = hello.server_name().map(|n| n.to_ascii_lowercase());
        table
            .as_ref()?
            .gateway_listener(&self.listener)?
            .certificate_for(sni.as_deref())
            .map(|c| c.key.clone())
    }
}

/// Sessions remembered for resumption (TLS 1.2 session ids and TLS 1.3 stateful
/// resumption); tickets need no server memory.
const SESSION_CACHE: usize = 20_000;

/// The server configuration of the HTTPS listener.
pub fn server_config(
    table: Arc<ArcSwapOption<RouteTable>>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    config_with(Arc::new(SniResolver::new(table)))
}

/// The server configuration of Gateway listener `listener`'s HTTPS.
pub fn gateway_server_config(
    table: Arc<ArcSwapOption<RouteTable>>,
    listener: Arc<str>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    config_with(Arc::new(GatewayResolver { table, listener }))
}

fn config_with(resolver: Arc<dyn ResolvesServerCert>) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE);
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(Arc::new(config))
}
