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
    /// Also serve this many more hosts (`h<i>.extra.test`, each "/" to a backend of its
    /// own on the same upstreams), to measure the proxy with a large table loaded.
    #[arg(long, default_value_t = 0)]
    extra_hosts: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cp = FakeControlPlane::start(Some(args.listen)).await?;
    let extra: Vec<(String, String)> = (0..args.extra_hosts)
        .map(|i| (format!("h{i}.extra.test"), format!("extra/svc-{i}:80")))
        .collect();
    let mut routes = vec![(args.host.as_str(), "/", "bench")];
    routes.extend(extra.iter().map(|(h, b)| (h.as_str(), "/", b.as_str())));
    let mut backends = vec![("bench", args.upstream.as_slice())];
    backends.extend(
        extra
            .iter()
            .map(|(_, b)| (b.as_str(), args.upstream.as_slice())),
    );
    let mut s = snapshot(1, &routes, &backends);
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let issued = holdfast_tests::tls::Issued {
            cert_pem: std::fs::read_to_string(cert)?,
            key_pem: std::fs::read_to_string(key)?,
        };
        let name = "bench/tls";
        s.certificates = vec![holdfast_tests::tls::certificate_resource(name, &issued)];
        s.default_certificate = name.into();
        for v in s.virtual_hosts.iter_mut().filter(|v| v.host == args.host) {
            v.certificate = name.into();
        }
        holdfast_proto::snapshot::seal(&mut s, 1);
    }
    cp.push(s);
    eprintln!("listening grpc={}", cp.addr());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
