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
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cp = FakeControlPlane::start(Some(args.listen)).await?;
    cp.push(snapshot(
        1,
        &[(&args.host, "/", "bench")],
        &[("bench", &args.upstream)],
    ));
    eprintln!("listening grpc={}", cp.addr());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
