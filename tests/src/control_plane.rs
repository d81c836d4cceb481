//! `holdfast-control-plane` as a real process for end-to-end tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::process::{Proc, addr_in};

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    /// The process.
    pub proc: Proc,
    /// gRPC address (RouteDiscovery, Admin, health, reflection).
    pub grpc: SocketAddr,
    /// HTTP admin address (/healthz, /readyz, /metrics).
    pub admin: SocketAddr,
    /// Whether gRPC is mutual TLS (the default) rather than `--insecure-plaintext`.
    pub tls: bool,
}

impl ControlPlane {
    /// Starts one with `kubeconfig`, on free ports, with `extra` flags; logs go to
    /// `<log_dir>/<name>.log`. gRPC is mutual TLS with the process's test certificates
    /// ([`crate::tls::Planes`]) unless `extra` has `--insecure-plaintext` or its own
    /// `--tls-cert`.
    pub fn start(name: &str, kubeconfig: &Path, log_dir: &Path, extra: &[&str]) -> Result<Self> {
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        Self::start_at(name, kubeconfig, log_dir, extra, any, any)
    }

    /// Like [`ControlPlane::start`], on the given addresses (to replace a control plane
    /// that proxies already know).
    pub fn start_at(
        name: &str,
        kubeconfig: &Path,
        log_dir: &Path,
        extra: &[&str],
        grpc: SocketAddr,
        admin: SocketAddr,
    ) -> Result<Self> {
        let (grpc, admin) = (grpc.to_string(), admin.to_string());
        let mut args: Vec<String> = [
            "--grpc-listen",
            grpc.as_str(),
            "--admin-listen",
            admin.as_str(),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .map(String::from)
        .collect();
        // One Lease and one host claims ledger per test (its log directory is named after
        // its namespace), shared by the replicas a test starts, not with other tests on
        // the shared API server; a test that names its own (or their namespace) keeps them.
        if !extra.contains(&"--lease-name")
            && !extra.contains(&"--lease-namespace")
            && let Some(scope) = log_dir.file_name().and_then(|n| n.to_str())
        {
            let scope = scope.to_ascii_lowercase().replace('_', "-");
            args.extend([
                "--lease-name".to_string(),
                format!("holdfast-{scope}"),
                "--host-claims-configmap".to_string(),
                format!("holdfast-host-claims-{scope}"),
            ]);
        }
        let plaintext = extra.contains(&"--insecure-plaintext");
        if !plaintext && !extra.contains(&"--tls-cert") {
            args.extend(crate::tls::Planes::get().control_plane_flags());
        }
        args.extend(["--instance".to_string(), name.to_string()]);
        let mut proc = Proc::spawn(
            name,
            &crate::workspace_bin("holdfast-control-plane"),
            args,
            vec![(
                "KUBECONFIG".into(),
                kubeconfig.to_string_lossy().into_owned(),
            )],
            log_dir.join(format!("{name}.log")),
        )?;
        let line = proc.wait_log("listening", 0, crate::wait::T)?;
        let grpc = addr_in(&line, "grpc")?;
        let admin = addr_in(&line, "admin")?;
        // Restarts reuse the same ports, so proxies find it again.
        let mut fixed = proc.args().to_vec();
        for (flag, addr) in [("--grpc-listen", grpc), ("--admin-listen", admin)] {
            if let Some(i) = fixed.iter().position(|a| a == flag) {
                fixed[i + 1] = addr.to_string();
            }
        }
        proc.restart_with_args_later(fixed);
        Ok(ControlPlane {
            proc,
            grpc,
            admin,
            tls: !plaintext,
        })
    }

    /// `https://<grpc>` (or `http://` in plaintext mode) for clients.
    pub fn grpc_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.grpc)
    }

    /// GET on the admin listener: (status, body).
    pub async fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        crate::http::get(self.admin, "localhost", path).await
    }

    /// The value of a metric (first sample whose line starts with `name`), if present.
    pub async fn metric(&self, series: impl Into<crate::metrics::Series>) -> Result<Option<f64>> {
        let (_, body) = self.admin_get("/metrics").await?;
        crate::http::metric(&body, series)
    }

    /// The value of a metric that must be there: a missing series is an error.
    pub async fn metric_value(&self, series: impl Into<crate::metrics::Series>) -> Result<f64> {
        let (_, body) = self.admin_get("/metrics").await?;
        crate::http::metric_value(&body, series)
    }

    /// Restarts the process (same ports) and waits until it listens again.
    pub fn restart(&mut self) -> Result<()> {
        let skip = self.proc.log().len();
        self.proc.restart()?;
        self.proc.wait_log("listening", skip, crate::wait::T)?;
        Ok(())
    }
}

/// Writes a copy of `kubeconfig` whose server is `https://<addr>` (through a fault proxy,
/// for example) and returns its path.
pub fn kubeconfig_via(kubeconfig: &Path, addr: SocketAddr, out: PathBuf) -> Result<PathBuf> {
    let text = std::fs::read_to_string(kubeconfig)?;
    let rewritten: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("server: ") {
                format!("    server: https://{addr}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&out, rewritten + "\n")?;
    Ok(out)
}
