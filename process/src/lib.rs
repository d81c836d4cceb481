//! Process plumbing that both holdfast binaries share, so that the control plane and the
//! proxy start, log, stop and answer probes the same way.
//!
//! # Layout
//! - [`LogFormat`] and [`init_tracing`]: the `--log-format` flag and the tracing subscriber
//!   (to stderr, `RUST_LOG` or `info`).
//! - [`shutdown_signal`]: SIGTERM or Ctrl-C cancels a [`CancellationToken`].
//! - [`node_name`]: a flag's value, else the kernel's hostname (the pod name), else a
//!   fallback.
//! - [`ConfigError`]: a flag value that cannot work; [`tls`]: mutual TLS between the
//!   planes (configurations from files, reloaded on change; identities from
//!   certificates) and the flags both planes take for it.
//! - [`exit_code`], [`usage_error`]: how a binary ends; [`error_chain`]: an error and its
//!   causes on one line.
//! - [`out_of_resources`]: the errnos that retrying at once cannot cure.
//! - [`flags`]: the flag reference of a binary, made from its clap definition, and the
//!   check that docs/reference.md holds it.
//! - [`backoff::Backoff`]: delays between failed attempts, capped and jittered.
//! - [`metrics!`]: a plane's metrics declared once, each with its name and help.
//! - [`otlp`]: spans exported over OTLP/gRPC to an OpenTelemetry Collector, never
//!   waited for.
//! - [`admin`]: the admin HTTP listeners (`/healthz`, `/readyz`, `/metrics`, debug pages),
//!   hardened against slow and greedy clients, and the pages both planes answer alike.

pub mod admin;
pub mod backoff;
pub mod flags;
pub mod metrics;
pub mod otlp;
pub mod tls;

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Log output format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Sends logs to stderr in `format`, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// A flag value that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid --{flag}: {reason}")]
pub struct ConfigError {
    /// The flag.
    pub flag: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl ConfigError {
    /// `--flag` is wrong because of `reason`.
    pub fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        ConfigError {
            flag,
            reason: reason.into(),
        }
    }
}

/// The exit status of a binary's run: success, or the error (with its causes) logged and
/// 1.
pub fn exit_code<E: std::fmt::Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `error` and each of its sources, joined by ": ".
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Is `errno` a lack of file descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): this
/// machine's own limit, which does not go away by retrying at once?
pub fn out_of_resources(errno: i32) -> bool {
    matches!(
        errno,
        libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM
    )
}

/// The exit status of a binary whose flags did not validate: the error on stderr, and 2,
/// as for clap's own usage errors.
pub fn usage_error(binary: &str, error: impl std::fmt::Display) -> ExitCode {
    eprintln!("{binary}: {error}");
    ExitCode::from(2)
}

/// Waits for SIGTERM or Ctrl-C, logs `what` and cancels `token`. If SIGTERM cannot be
/// listened for, Ctrl-C alone ends the wait.
pub async fn shutdown_signal(token: CancellationToken, what: &'static str) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    tracing::info!("{what}");
    token.cancel();
}

/// `given` (a flag's value) if set; else this machine's hostname (in Kubernetes, the pod's
/// name); else `fallback`.
pub fn node_name(given: Option<&str>, fallback: &str) -> String {
    given.map(str::to_owned).unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| fallback.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_names_every_cause_in_order() {
        let error = Wrapped(std::io::Error::other("connection refused"));
        assert_eq!(error_chain(&error), "connecting: connection refused");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("connecting")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn descriptor_and_memory_exhaustion_are_out_of_resources() {
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(out_of_resources(errno), "{errno}");
        }
        assert!(!out_of_resources(libc::ECONNRESET));
    }

    #[test]
    fn a_given_name_wins_and_the_hostname_is_the_default() {
        assert_eq!(node_name(Some("proxy-7"), "holdfast-proxy"), "proxy-7");
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let expected = if host.is_empty() {
            "holdfast-proxy".to_owned()
        } else {
            host
        };
        assert_eq!(node_name(None, "holdfast-proxy"), expected);
    }
}
