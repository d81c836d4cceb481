//! Mutual TLS between the planes, and the flags both planes take for it.
//!
//! # The configurations
//!
//! The control plane's gRPC server and the proxies' (and operators') clients, from PEM
//! files that are reloaded when they change on disk.
//!
//! - The server presents `--tls-cert`/`--tls-key`. A client certificate, when presented,
//!   must chain to `--client-ca` (else the handshake fails); a caller's identity is in it:
//!   the DNS and URI subject alternative names ([`identities`]), never what the caller
//!   says. A client without a certificate completes the handshake with no identity: it may
//!   use health and reflection only (the services check identities themselves).
//! - A client presents `--tls-cert`/`--tls-key` and verifies the server against its CA
//!   and the expected server name.
//! - Both offer ALPN `h2` (gRPC clients such as grpcurl insist on it).
//! - [`Reloading`] polls the files (cert-manager renews Secrets in place, which a mounted
//!   volume shows as new file contents) and swaps in a new configuration when they change.
//!   A configuration is only used for new connections: established streams are untouched.
//!   Files that do not load keep the last good configuration and are reported.
//!
//! # The flags
//!
//! [`Flags`] are the mutual-TLS flags both planes take, checked the same way;
//! [`watch_reloads`] reloads their files and counts what happened.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use holdfast_lock::Lock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};

use crate::ConfigError;

/// Why a TLS configuration could not be built (what failed; the cause, where there is
/// one, is the source).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is missing or wrong (never key bytes).
        what: String,
    },
    /// rustls refused the combination (for example a key that does not match).
    #[error("TLS configuration")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built from the CA.
    #[error("client CA: {0}")]
    Verifier(String),
}

/// The three files of one side of mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// Our certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// Our private key (PEM).
    pub key: PathBuf,
    /// The CA that signs the other side's certificates (PEM).
    pub ca: PathBuf,
}

impl Files {
    fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    }

    /// A digest of the three files' contents: what [`Reloading`] compares.
    fn fingerprint(&self) -> Result<[u8; 32], TlsError> {
        let mut sha = Sha256::new();
        for p in [&self.cert, &self.key, &self.ca] {
            let bytes = Self::read(p)?;
            sha.update((bytes.len() as u64).to_le_bytes());
            sha.update(&bytes);
        }
        Ok(sha.finalize().into())
    }

    /// The three files' contents.
    pub fn read_all(&self) -> Result<Pems, TlsError> {
        Ok(Pems {
            cert: Self::read(&self.cert)?,
            key: Self::read(&self.key)?,
            ca: Self::read(&self.ca)?,
            names: [self.cert.clone(), self.key.clone(), self.ca.clone()],
        })
    }
}

/// The contents of one side's three PEM documents (from [`Files`], or from a Secret's
/// `tls.crt`, `tls.key` and `ca.crt`), with the names errors call them by.
#[derive(Clone)]
pub struct Pems {
    /// Our certificate chain (leaf first).
    pub cert: Vec<u8>,
    /// Our private key.
    pub key: Vec<u8>,
    /// The CA that signs the other side's certificates.
    pub ca: Vec<u8>,
    /// What errors call the three (file paths, or `secret/NAME:tls.crt` and so on).
    pub names: [PathBuf; 3],
}

impl std::fmt::Debug for Pems {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pems").field("names", &self.names).finish()
    }
}

impl Pems {
    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        certificates(&self.cert, &self.names[0])
    }

    fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.key).map_err(|_| TlsError::Pem {
            path: self.names[1].clone(),
            what: "holds no usable PEM private key".into(),
        })
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in certificates(&self.ca, &self.names[2])? {
            roots.add(c).map_err(|e| TlsError::Pem {
                path: self.names[2].clone(),
                what: format!("not a usable CA certificate: {e}"),
            })?;
        }
        Ok(roots)
    }
}

fn certificates(bytes: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::Pem {
            path: path.to_owned(),
            what: "holds malformed PEM".into(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "holds no PEM certificate".into(),
        });
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The control plane's server configuration: our certificate; a client certificate, if
/// presented, must chain to `files.ca`. Connections without one carry no identity, and
/// every service that needs one refuses them.
pub fn server_config(files: &Files) -> Result<Arc<ServerConfig>, TlsError> {
    let files = files.read_all()?;
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(files.roots()?), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(files.chain()?, files.private_key()?)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration: our certificate, and the server verified against `files.ca`.
pub fn client_config(files: &Files) -> Result<Arc<ClientConfig>, TlsError> {
    client_config_from(&files.read_all()?)
}

/// [`client_config`] from contents already read.
pub fn client_config_from(files: &Pems) -> Result<Arc<ClientConfig>, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(files.roots()?)
        .with_client_auth_cert(files.chain()?, files.private_key()?)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The identities a certificate proves: its URI subject alternative names (for example a
/// SPIFFE ID) and its DNS names, in that order.
pub fn identities(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::prelude::*;
    let Ok((_, cert)) = X509Certificate::from_der(cert.as_ref()) else {
        return Vec::new();
    };
    let mut uris = Vec::new();
    let mut dns = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::URI(u) => uris.push((*u).to_owned()),
                GeneralName::DNSName(d) => dns.push(d.to_ascii_lowercase()),
                _ => {}
            }
        }
    }
    uris.extend(dns);
    uris
}

/// The serial number of a certificate, lower-case hex ("" if it does not parse).
pub fn serial(cert: &CertificateDer<'_>) -> String {
    use x509_parser::prelude::*;
    X509Certificate::from_der(cert.as_ref())
        .map(|(_, c)| c.raw_serial().iter().map(|b| format!("{b:02x}")).collect())
        .unwrap_or_default()
}

/// A TLS configuration built from files, rebuilt when their contents change.
pub struct Reloading<T> {
    current: ArcSwap<T>,
    files: Files,
    build: fn(&Files) -> Result<Arc<T>, TlsError>,
    loaded: std::sync::Mutex<[u8; 32]>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Builds the first configuration (an error here is a startup error).
    pub fn new(
        files: Files,
        build: fn(&Files) -> Result<Arc<T>, TlsError>,
    ) -> Result<Arc<Self>, TlsError> {
        let loaded = files.fingerprint()?;
        let current = build(&files)?;
        Ok(Arc::new(Reloading {
            current: ArcSwap::new(current),
            files,
            build,
            loaded: std::sync::Mutex::new(loaded),
        }))
    }

    /// The configuration for the next connection.
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// Rebuilds if the files changed: `Ok(true)` when a new configuration is in use,
    /// `Ok(false)` when nothing changed, and an error (the old configuration stays) when
    /// the new files do not load.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let seen = self.files.fingerprint()?;
        // A std mutex: held for a compare and a store, never across an await.
        let mut loaded = self.loaded.locked();
        if *loaded == seen {
            return Ok(false);
        }
        let config = (self.build)(&self.files)?;
        self.current.store(config);
        *loaded = seen;
        Ok(true)
    }

    /// Polls the files every `interval` until the returned task is aborted; `on_reload`
    /// hears of every outcome that is not "unchanged".
    pub fn watch(
        self: &Arc<Self>,
        interval: Duration,
        on_reload: impl Fn(Result<(), &TlsError>) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tick.tick().await;
                match this.reload() {
                    Ok(true) => {
                        failing = false;
                        on_reload(Ok(()));
                    }
                    Ok(false) => failing = false,
                    // Reported once per failing stretch, not every poll.
                    Err(e) if !failing => {
                        failing = true;
                        on_reload(Err(&e));
                    }
                    Err(_) => {}
                }
            }
        })
    }
}

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

    fn write_pair(dir: &Path, name: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_last_good_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = write_pair(dir.path(), "server", &["cp.test"]);
        let (ca, _) = write_pair(dir.path(), "ca", &["ca.test"]);
        let files = Files { cert, key, ca };
        let r = Reloading::new(files.clone(), server_config).unwrap();
        let first = r.current();
        assert!(!r.reload().unwrap(), "unchanged files are not reloaded");
        assert!(Arc::ptr_eq(&first, &r.current()));

        // Renewed in place.
        let (c2, k2) = write_pair(dir.path(), "renewed", &["cp.test"]);
        std::fs::copy(&c2, &files.cert).unwrap();
        std::fs::copy(&k2, &files.key).unwrap();
        assert!(r.reload().unwrap());
        let second = r.current();
        assert!(!Arc::ptr_eq(&first, &second));

        // Half-written: the key no longer matches, or the file is garbage.
        std::fs::copy(&c2, &files.cert).unwrap();
        let (_, k3) = write_pair(dir.path(), "other", &["cp.test"]);
        std::fs::copy(&k3, &files.key).unwrap();
        assert!(r.reload().is_err());
        std::fs::write(&files.cert, "garbage").unwrap();
        assert!(r.reload().is_err());
        assert!(Arc::ptr_eq(&second, &r.current()));
    }

    #[test]
    fn identities_are_the_uri_and_dns_names() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["Proxy-1.test".to_string()]).unwrap();
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://holdfast/proxy/p1".try_into().unwrap(),
        ));
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            identities(cert.der()),
            ["spiffe://holdfast/proxy/p1", "proxy-1.test"]
        );
    }
}
