//! `holdfast-echo`: a test upstream that answers every request with its own name.

use clap::Parser;

/// Echo backend for holdfast's tests and demo.
#[derive(Parser, Debug)]
struct Args {
    /// Address to listen on, e.g. 10.200.0.3:8080.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Name this backend answers with.
    #[arg(long)]
    name: String,
    /// Wait this long before every answer (a slow backend).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Listen with a backlog of 1 and never accept (an endpoint whose connects hang):
    /// once its queue is full, the kernel drops every new SYN.
    #[arg(long)]
    never_accept: bool,
    /// Serve TLS with this certificate chain (PEM), offering ALPN h2 and http/1.1; with
    /// --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.never_accept {
        let socket = match args.listen {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(args.listen)?;
        let _listener = socket.listen(1)?;
        std::future::pending::<()>().await;
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let delay = std::time::Duration::from_millis(args.delay_ms);
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(key)?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        holdfast_tests::echo::serve_tls(listener, args.name, delay, config.into()).await?;
        return Ok(());
    }
    holdfast_tests::echo::serve_after(listener, args.name, delay).await?;
    Ok(())
}
