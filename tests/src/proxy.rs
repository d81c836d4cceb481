//! `holdfast-proxy` as a real process for end-to-end tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::process::{Proc, addr_in};

/// A running proxy.
#[derive(Debug)]
pub struct ProxyProc {
    /// The process.
    pub proc: Proc,
    /// Client traffic address.
    pub addr: SocketAddr,
    /// HTTPS address, when started with `--listen-tls`.
    pub https: Option<SocketAddr>,
    /// Admin address (/healthz, /readyz, /metrics).
    pub admin: SocketAddr,
    /// Debug address (/debug/*).
    pub debug: SocketAddr,
    /// Its state directory.
    pub state_dir: PathBuf,
}

impl ProxyProc {
    /// Starts `holdfast-proxy` named `name` on free ports with `control_planes`, state in
    /// `state_dir`, logs in `<log_dir>/<name>.log`, and `extra` flags. Towards https://
    /// control planes it presents a test client certificate for node `name`; towards
    /// http:// ones it runs with `--insecure-plaintext` (unless `extra` says otherwise).
    pub fn start(
        name: &str,
        control_planes: &[String],
        state_dir: &Path,
        log_dir: &Path,
        extra: &[&str],
    ) -> Result<Self> {
        Self::start_with_env(name, control_planes, state_dir, log_dir, extra, vec![])
    }

    /// [`Self::start`] with `envs` added to its environment.
    pub fn start_with_env(
        name: &str,
        control_planes: &[String],
        state_dir: &Path,
        log_dir: &Path,
        extra: &[&str],
        envs: Vec<(String, String)>,
    ) -> Result<Self> {
        let mut args: Vec<String> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--debug-listen".into(),
            "127.0.0.1:0".into(),
            "--state-dir".into(),
            state_dir.to_string_lossy().into_owned(),
            "--node-id".into(),
            name.into(),
        ];
        if !extra.contains(&"--worker-threads") {
            args.extend(["--worker-threads".into(), "2".into()]);
        }
        for cp in control_planes {
            args.extend(["--control-plane".to_string(), cp.clone()]);
        }
        if !extra.contains(&"--tls-cert") && !extra.contains(&"--insecure-plaintext") {
            if control_planes.iter().any(|c| c.starts_with("https://")) {
                args.extend(crate::tls::Planes::get().proxy_flags(name));
            } else {
                args.push("--insecure-plaintext".into());
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Proc::spawn(
            name,
            &crate::workspace_bin("holdfast-proxy"),
            args,
            envs,
            log_dir.join(format!("{name}.log")),
        )?;
        let line = proc.wait_log("listening", 0, crate::wait::T)?;
        let addr = addr_in(&line, "proxy")?;
        let admin = addr_in(&line, "admin")?;
        let debug = addr_in(&line, "debug")?;
        let https = addr_in(&line, "https").ok();
        let mut fixed = proc.args().to_vec();
        for (flag, a) in [
            ("--listen", addr),
            ("--admin-listen", admin),
            ("--debug-listen", debug),
        ]
        .into_iter()
        .chain(https.map(|h| ("--listen-tls", h)))
        {
            if let Some(i) = fixed.iter().position(|x| x == flag) {
                fixed[i + 1] = a.to_string();
            }
        }
        proc.restart_with_args_later(fixed);
        Ok(ProxyProc {
            proc,
            addr,
            https,
            admin,
            debug,
            state_dir: state_dir.to_path_buf(),
        })
    }

    /// Restarts it on the same ports; returns when it listens again, and how long that took.
    pub fn restart(&mut self) -> Result<Duration> {
        let skip = self.proc.log().len();
        let started = Instant::now();
        self.proc.restart()?;
        self.proc.wait_log("listening", skip, crate::wait::T)?;
        Ok(started.elapsed())
    }

    /// GET through the proxy with `Host: host`: (status, body).
    pub async fn get(&self, host: &str, path: &str) -> Result<(u16, String)> {
        crate::http::get(self.addr, host, path).await
    }

    /// GET on the admin listener, or for `/debug/*` the debug listener.
    pub async fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        let addr = if path.starts_with("/debug/") {
            self.debug
        } else {
            self.admin
        };
        crate::http::get(addr, "localhost", path).await
    }

    /// A metric's first sample.
    pub async fn metric(&self, series: impl Into<crate::metrics::Series>) -> Result<Option<f64>> {
        let (_, body) = self.admin_get("/metrics").await?;
        crate::http::metric(&body, series)
    }

    /// The value of a metric that must be there: a missing series is an error.
    pub async fn metric_value(&self, series: impl Into<crate::metrics::Series>) -> Result<f64> {
        let (_, body) = self.admin_get("/metrics").await?;
        crate::http::metric_value(&body, series)
    }

    /// Waits until `/debug/snapshot` shows the proxy serving `version`.
    pub async fn wait_version(&self, version: &str, timeout: Duration) -> Result<()> {
        crate::wait::until(&format!("proxy serving {version}"), timeout, || async {
            let (_, body) = self
                .admin_get("/debug/snapshot")
                .await
                .map_err(|e| e.to_string())?;
            Ok(body.contains(version).then_some(()))
        })
        .await
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        crate::wait::until("proxy /readyz 200", timeout, || async {
            match self.admin_get("/readyz").await {
                Ok((200, _)) => Ok(Some(())),
                Ok((code, body)) => Err(format!("{code} {body}")),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }
}
