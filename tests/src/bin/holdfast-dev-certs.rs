//! Makes a private CA and the certificates a local holdfast needs, with rcgen, for the
//! demo (`deploy/local/demo.sh`) and local development. Never for production: there,
//! cert-manager issues them (deploy/kubernetes/certificates.yaml).
//!
//! Writes into `--out`: `ca.crt`; `control-plane.crt/.key` (the gRPC serving certificate,
//! for 127.0.0.1 and localhost); `operator.crt/.key` (identity
//! `spiffe://holdfast.local/operator`, for grpcurl); one `<node-id>.crt/.key` per
//! `--proxy` (identity: that DNS name); and `site.crt/.key` for the `--host` names (an
//! Ingress TLS Secret).

use std::path::PathBuf;

use clap::Parser;
use holdfast_tests::tls::TestCa;

/// The operator identity these certificates carry.
const OPERATOR: &str = "spiffe://holdfast.local/operator";

#[derive(Parser)]
#[command(name = "holdfast-dev-certs")]
struct Args {
    /// Directory to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// A proxy node id to issue a client certificate for (repeatable).
    #[arg(long = "proxy")]
    proxies: Vec<String>,
    /// A host name for the site certificate (repeatable).
    #[arg(long = "host")]
    hosts: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)?;
    let ca = TestCa::new("holdfast local CA");
    ca.write(&args.out, "ca")?;
    ca.server(&["127.0.0.1", "localhost"])
        .write(&args.out, "control-plane")?;
    ca.client(&[], &[OPERATOR]).write(&args.out, "operator")?;
    for p in &args.proxies {
        ca.client(&[p.as_str()], &[]).write(&args.out, p)?;
    }
    if !args.hosts.is_empty() {
        let hosts: Vec<&str> = args.hosts.iter().map(String::as_str).collect();
        ca.server(&hosts).write(&args.out, "site")?;
    }
    println!("{OPERATOR}");
    Ok(())
}
