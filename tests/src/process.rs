//! Our binaries as real child processes: logs captured to a file, readiness found by
//! reading the log, SIGTERM / SIGKILL / restart, killed on drop.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// A child process of ours.
#[derive(Debug)]
pub struct Proc {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Spawns `program args…` with extra `envs`, logging stdout and stderr to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: Vec<String>,
        envs: Vec<(String, String)>,
        log: PathBuf,
    ) -> Result<Self> {
        let mut p = Proc {
            name: name.into(),
            program: program.into(),
            args,
            envs,
            log,
            child: None,
        };
        // A fresh log per spawn; restarts append to it.
        File::create(&p.log)?;
        p.start()?;
        Ok(p)
    }

    fn start(&mut self) -> Result<()> {
        let out = File::options().create(true).append(true).open(&self.log)?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env(
                "RUST_LOG",
                std::env::var("HOLDFAST_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("spawning {}", self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Path of its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its pid, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Is it still running?
    pub fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Waits until a log line contains `needle` (after `skip` bytes of log) and returns it.
    pub fn wait_log(&mut self, needle: &str, skip: usize, timeout: Duration) -> Result<String> {
        let name = self.name.clone();
        let log = self.log.clone();
        crate::wait::until_blocking(&format!("{name} to log {needle:?}"), timeout, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text
                .get(skip..)
                .and_then(|t| t.lines().find(|l| l.contains(needle)))
            {
                return Ok(Some(line.to_owned()));
            }
            if !self.running() {
                return Err(format!("{name} exited; log:\n{text}"));
            }
            Ok(None)
        })
    }

    /// Sends a signal ("TERM", "KILL", "STOP", "CONT").
    pub fn signal(&self, sig: &str) -> Result<()> {
        let pid = self.pid().context("not running")?;
        let ok = Command::new("kill")
            .args(["-s", sig, &pid.to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill -s {sig} {pid} failed");
        }
        Ok(())
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERMs it and waits (up to `timeout`) for it to exit; returns its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        self.signal("TERM")?;
        self.wait_exit(timeout)
    }

    /// Waits (up to `timeout`) for it to exit by itself; returns its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("not running")?;
        let status =
            crate::wait::until_blocking(&format!("{} to exit", self.name), timeout, || {
                child.try_wait().map_err(|e| e.to_string())
            });
        if status.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        status
    }

    /// Starts it again with the same arguments (after `kill` or `terminate`).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.start()
    }

    /// Starts it again with changed arguments.
    pub fn restart_with(&mut self, args: Vec<String>) -> Result<()> {
        self.kill();
        self.args = args;
        self.start()
    }

    /// Replaces the arguments used by the next `restart` (the running process keeps its own).
    pub fn restart_with_args_later(&mut self, args: Vec<String>) {
        self.args = args;
    }

    /// Its arguments.
    pub fn args(&self) -> &[String] {
        &self.args
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Parses `key=ADDR` out of a log line such as `listening grpc=127.0.0.1:1 admin=…`.
pub fn addr_in(line: &str, key: &str) -> Result<SocketAddr> {
    let prefix = format!("{key}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix))
        .with_context(|| format!("no {key}= in {line:?}"))?
        .trim_matches('"')
        .parse()
        .with_context(|| format!("bad {key}= in {line:?}"))
}
