//! The mutual-TLS flags both planes take, checked the same way, and the watcher that
//! reloads their files and counts what happened.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use holdfast_proto::mtls::{Files, Reloading};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::ConfigError;

/// The shortest `--tls-reload-interval`: the files are hashed on every poll.
pub const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(100);

/// One plane's TLS flags as given: `--tls-cert`, `--tls-key`, a CA flag, and
/// `--insecure-plaintext`.
#[derive(Debug, Clone, Copy)]
pub struct Flags<'a> {
    /// `--tls-cert`.
    pub cert: &'a Option<PathBuf>,
    /// `--tls-key`.
    pub key: &'a Option<PathBuf>,
    /// The CA flag's value.
    pub ca: &'a Option<PathBuf>,
    /// The CA flag's name (`client-ca`, `control-plane-ca`).
    pub ca_flag: &'static str,
    /// `--insecure-plaintext`.
    pub insecure_plaintext: bool,
    /// `--tls-reload-interval`.
    pub reload_interval: Duration,
    /// What needs the files, for the error when none are given ("the gRPC listener").
    pub needed_by: &'static str,
}

impl Flags<'_> {
    /// The three files, or `None` with `--insecure-plaintext`. The files go together,
    /// and exactly one of them and `--insecure-plaintext` must be chosen.
    pub fn validate(&self) -> Result<Option<Files>, ConfigError> {
        let ca_flag = self.ca_flag;
        let files = match (self.cert, self.key, self.ca) {
            (Some(cert), Some(key), Some(ca)) => Some(Files {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            (None, None, None) => None,
            _ => {
                return Err(ConfigError::new(
                    "tls-cert",
                    format!("--tls-cert, --tls-key and --{ca_flag} go together"),
                ));
            }
        };
        match (&files, self.insecure_plaintext) {
            (Some(_), true) => Err(ConfigError::new(
                "insecure-plaintext",
                "cannot be combined with --tls-cert",
            )),
            (None, false) => Err(ConfigError::new(
                "tls-cert",
                format!(
                    "{} needs --tls-cert, --tls-key and --{ca_flag} (mutual TLS), or --insecure-plaintext for local development",
                    self.needed_by
                ),
            )),
            _ if self.reload_interval < MIN_RELOAD_INTERVAL => Err(ConfigError::new(
                "tls-reload-interval",
                "must be at least 100ms",
            )),
            _ => Ok(files),
        }
    }
}

/// What a reload watcher counts.
#[derive(Debug, Clone, Default)]
pub struct ReloadCounters {
    /// Files that changed and now serve new connections.
    pub reloads: Counter,
    /// Files that changed but do not load (the previous ones stay in use).
    pub failures: Counter,
}

impl ReloadCounters {
    /// Registers `<prefix>_reloads_total` and `<prefix>_reload_failures_total` in
    /// `registry`; `files` says whose files they are in the help text.
    pub fn register(&self, registry: &mut Registry, prefix: &str, files: &str) {
        registry.register(
            format!("{prefix}_reloads"),
            format!("Reloads of {files} TLS files"),
            self.reloads.clone(),
        );
        registry.register(
            format!("{prefix}_reload_failures"),
            "Changed TLS files that did not load (the previous ones stay in use)",
            self.failures.clone(),
        );
    }
}

/// Polls `tls`'s files every `interval` until the returned task is aborted; counts and
/// logs each reload and each failing stretch. `files` names them in the log.
pub fn watch_reloads<T: Send + Sync + 'static>(
    tls: &Arc<Reloading<T>>,
    interval: Duration,
    counters: ReloadCounters,
    files: &'static str,
) -> tokio::task::JoinHandle<()> {
    tls.watch(interval, move |outcome| match outcome {
        Ok(()) => {
            counters.reloads.inc();
            tracing::info!(files, "reloaded TLS files; new connections use them");
        }
        Err(error) => {
            counters.failures.inc();
            tracing::warn!(files, error = %crate::error_chain(error), "TLS files changed but do not load; keeping the previous ones");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags<'a>(
        cert: &'a Option<PathBuf>,
        key: &'a Option<PathBuf>,
        ca: &'a Option<PathBuf>,
        insecure_plaintext: bool,
    ) -> Flags<'a> {
        Flags {
            cert,
            key,
            ca,
            ca_flag: "client-ca",
            insecure_plaintext,
            reload_interval: Duration::from_secs(10),
            needed_by: "the gRPC listener",
        }
    }

    #[test]
    fn the_three_files_go_together_and_exclude_plaintext() {
        let some = Some(PathBuf::from("/x.pem"));
        let none = None;
        let files = flags(&some, &some, &some, false)
            .validate()
            .unwrap()
            .unwrap();
        assert_eq!(files.ca, PathBuf::from("/x.pem"));
        assert!(
            flags(&none, &none, &none, true)
                .validate()
                .unwrap()
                .is_none()
        );

        let partial = flags(&some, &none, &some, false).validate().unwrap_err();
        assert_eq!(partial.flag, "tls-cert");
        assert!(
            partial.reason.contains("--client-ca go together"),
            "{partial}"
        );
        let both = flags(&some, &some, &some, true).validate().unwrap_err();
        assert_eq!(both.flag, "insecure-plaintext");
        let neither = flags(&none, &none, &none, false).validate().unwrap_err();
        assert!(
            neither
                .to_string()
                .starts_with("invalid --tls-cert: the gRPC listener needs"),
            "{neither}"
        );
    }

    #[test]
    fn a_reload_interval_under_100ms_is_refused() {
        let none = None;
        let mut f = flags(&none, &none, &none, true);
        f.reload_interval = Duration::from_millis(99);
        assert_eq!(f.validate().unwrap_err().flag, "tls-reload-interval");
        f.reload_interval = MIN_RELOAD_INTERVAL;
        assert!(f.validate().is_ok());
    }
}
