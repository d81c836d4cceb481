//! The real grpcurl (built by deploy/local/k8s.sh), as operators use it.

use std::net::SocketAddr;
use std::process::Command;

use anyhow::{Result, bail};

/// Runs `grpcurl -cacert CA -cert OPERATOR.crt -key OPERATOR.key [-d DATA] ADDR ARGS…`
/// against a control plane serving mutual TLS with the test certificates, as an operator;
/// returns stdout, or an error with stderr.
pub fn grpcurl(addr: SocketAddr, data: Option<&str>, args: &[&str]) -> Result<String> {
    grpcurl_with(&crate::tls::Planes::get().grpcurl_flags(), addr, data, args)
}

/// Like [`grpcurl`], with `tls` in place of the operator's TLS flags (for example the
/// flags of another client certificate, or `-plaintext`).
pub fn grpcurl_with(
    tls: &[String],
    addr: SocketAddr,
    data: Option<&str>,
    args: &[&str],
) -> Result<String> {
    let mut cmd = Command::new(crate::cluster::tools_bin()?.join("grpcurl"));
    cmd.args(tls);
    if let Some(d) = data {
        cmd.args(["-d", d]);
    }
    let out = cmd.arg(addr.to_string()).args(args).output()?;
    if !out.status.success() {
        bail!(
            "grpcurl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Calls `method` with JSON `data` and parses the JSON answer.
pub fn call(addr: SocketAddr, method: &str, data: &str) -> Result<serde_json::Value> {
    let out = grpcurl(addr, Some(data), &[method])?;
    Ok(serde_json::from_str(&out)?)
}

/// The Ingress hosts of a snapshot (or of a delta's `field`, e.g. `upsertedGatewayHosts`)
/// as grpcurl shows them: the Gateway hosts of listener `ingress` (the one route model).
/// A missing field is no hosts.
pub fn ingress_hosts<'a>(
    snapshot: &'a serde_json::Value,
    field: &str,
) -> Vec<&'a serde_json::Value> {
    snapshot[field]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["listener"] == holdfast_proto::snapshot::INGRESS_LISTENER)
        .collect()
}
