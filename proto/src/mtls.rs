//! Mutual TLS between the planes: the control plane's gRPC server and the proxies' (and
//! operators') clients, from PEM files that are reloaded when they change on disk.
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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};

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
        .map(|(_, c)| crate::certificate::hex(c.raw_serial()))
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
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
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

#[cfg(test)]
mod tests {
    use super::*;

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
