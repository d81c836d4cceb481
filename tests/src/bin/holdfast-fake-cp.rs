//! `holdfast-fake-cp`: a stand-in control plane serving one fixed route, for benchmarks that
//! measure the proxy alone (no API server). Not used by the end-to-end suite's real paths.

use clap::Parser;
use holdfast_tests::fake_control_plane::{FakeControlPlane, snapshot};

/// Serves one Prefix "/" route for `--host` to `--upstream` over RouteDiscovery.
#[derive(Parser, Debug)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Host of the route.
    #[arg(long)]
    host: String,
    /// Upstream endpoint (repeatable).
    #[arg(long, required = true)]
    upstream: Vec<std::net::SocketAddr>,
    /// Certificate (PEM) for the host, served over HTTPS (also as the default
    /// certificate, for clients that send no SNI); with --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cp = FakeControlPlane::start(Some(args.listen)).await?;
    let mut s = snapshot(
        1,
        &[(&args.host, "/", "bench")],
        &[("bench", &args.upstream)],
    );
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let issued = holdfast_tests::tls::Issued {
            cert_pem: std::fs::read_to_string(cert)?,
            key_pem: std::fs::read_to_string(key)?,
        };
        let name = "bench/tls";
        s.certificates = vec![holdfast_tests::tls::certificate_resource(name, &issued)];
        s.default_certificate = name.into();
        s.virtual_hosts[0].certificate = name.into();
        holdfast_proto::snapshot::seal(&mut s, 1);
    }
    cp.push(s);
    eprintln!("listening grpc={}", cp.addr());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
