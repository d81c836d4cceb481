//! The real grpcurl (built by deploy/local/k8s.sh), as operators use it.

use std::net::SocketAddr;
use std::process::Command;

use anyhow::{Result, bail};

/// Runs `grpcurl -plaintext [-d DATA] ADDR ARGS…`; returns stdout, or an error with stderr.
pub fn grpcurl(addr: SocketAddr, data: Option<&str>, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(crate::cluster::tools_bin()?.join("grpcurl"));
    cmd.arg("-plaintext");
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
