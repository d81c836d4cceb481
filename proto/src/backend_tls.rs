//! TLS to a backend as both planes build it: a snapshot's [`BackendTls`] turned into the
//! rustls client configuration every connection to the backend handshakes with.
//!
//! The control plane runs [`client_config`] on every backend it publishes with TLS, so a
//! CA bundle that does not parse or a name that is not one never reaches a snapshot (the
//! backend answers 503 with the reason instead); the proxy runs it again when it compiles
//! a snapshot (and NACKs on failure).
//!
//! With `verify` the chain is checked against the backend's own CAs (never the system's)
//! and the leaf's name against `server_name`, or against any of `subject_alt_names` when
//! they are given. Without it any certificate is taken, as ingress-nginx does with
//! `proxy-ssl-verify: "off"`: the handshake's signature is still checked, so the
//! connection is encrypted to whoever holds the key of the certificate it was shown.

use std::hash::BuildHasher;
use std::sync::{Arc, LazyLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::v1::BackendTls;

/// Why TLS to a backend cannot be set up as its snapshot entry says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendTlsError {
    /// `server_name` is neither a DNS name nor an IP address.
    #[error("server name {0:?} is not a DNS name or an IP address")]
    ServerName(String),
    /// A subject alternative name is not a DNS name.
    #[error("subject alternative name {0:?} is not a DNS name")]
    SubjectAltName(String),
    /// Verification asked for without a CA certificate that parses.
    #[error("no usable CA certificate: {0}")]
    Roots(String),
}

/// A backend's TLS, ready to connect with.
#[derive(Debug, Clone)]
pub struct Client {
    /// The name the handshake is made for.
    pub name: ServerName<'static>,
    /// The configuration (roots, verifier, ALPN, SNI).
    pub config: Arc<ClientConfig>,
    /// Equal for equal settings (within this process): connections are pooled by it.
    pub settings: u64,
}

/// The configuration for `tls`; `h2` offers ALPN `h2`, otherwise `http/1.1`.
pub fn client_config(tls: &BackendTls, h2: bool) -> Result<Client, BackendTlsError> {
    let name = ServerName::try_from(tls.server_name.clone())
        .map_err(|_| BackendTlsError::ServerName(tls.server_name.clone()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = if tls.verify {
        let mut roots = RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(tls.ca_pem.as_bytes()) {
            let der = der.map_err(|e| BackendTlsError::Roots(e.to_string()))?;
            roots
                .add(der)
                .map_err(|e| BackendTlsError::Roots(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(BackendTlsError::Roots("no PEM certificate".to_owned()));
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| BackendTlsError::Roots(e.to_string()))?;
        if tls.subject_alt_names.is_empty() {
            webpki
        } else {
            let names = tls
                .subject_alt_names
                .iter()
                .map(|n| {
                    ServerName::try_from(n.clone())
                        .ok()
                        .filter(|s| matches!(s, ServerName::DnsName(_)))
                        .ok_or_else(|| BackendTlsError::SubjectAltName(n.clone()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Arc::new(AnyName { webpki, names })
        }
    } else {
        Arc::new(Unverified(provider.clone()))
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BackendTlsError::Roots(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.enable_sni = tls.sni;
    config.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    Ok(Client {
        name,
        config: Arc::new(config),
        settings: settings_of(tls, h2),
    })
}

/// A hash of the settings, keyed per process (so nobody can choose two settings that
/// collide).
fn settings_of(tls: &BackendTls, h2: bool) -> u64 {
    static KEYS: LazyLock<std::collections::hash_map::RandomState> =
        LazyLock::new(std::collections::hash_map::RandomState::new);
    KEYS.hash_one((
        &tls.server_name,
        tls.verify,
        &tls.ca_pem,
        tls.sni,
        &tls.subject_alt_names,
        h2,
    ))
}

/// Takes any certificate; checks only the handshake's signature with it.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Checks the chain, and the leaf against any of `names` instead of the handshake's
/// server name.
#[derive(Debug)]
struct AnyName {
    webpki: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut first = None;
        for name in &self.names {
            match self.webpki.verify_server_cert(
                end_entity,
                intermediates,
                name,
                ocsp_response,
                now,
            ) {
                Ok(ok) => return Ok(ok),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        Err(first.unwrap_or(rustls::Error::General("no subject alternative name".into())))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert, rcgen::Issuer::new(params, key))
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason_and_good_ones_configure_alpn_and_sni() {
        let (ca, _) = ca();
        let good = BackendTls {
            server_name: "web.default.svc".into(),
            verify: true,
            ca_pem: ca.pem(),
            sni: true,
            subject_alt_names: vec!["other.test".into()],
        };
        let c = client_config(&good, true).unwrap();
        assert_eq!(c.config.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(c.config.enable_sni);
        let c1 = client_config(&good, false).unwrap();
        assert_eq!(c1.config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert_ne!(c.settings, c1.settings, "h2 and http/1.1 are pooled apart");
        assert_eq!(
            client_config(&good, false).unwrap().settings,
            c1.settings,
            "equal settings, one pool"
        );
        let cases = [
            (
                BackendTls {
                    server_name: "not a name".into(),
                    ..good.clone()
                },
                BackendTlsError::ServerName("not a name".into()),
            ),
            (
                BackendTls {
                    ca_pem: String::new(),
                    ..good.clone()
                },
                BackendTlsError::Roots("no PEM certificate".into()),
            ),
            (
                BackendTls {
                    subject_alt_names: vec!["10.0.0.1".into()],
                    ..good.clone()
                },
                BackendTlsError::SubjectAltName("10.0.0.1".into()),
            ),
        ];
        for (tls, want) in cases {
            assert_eq!(client_config(&tls, false).unwrap_err(), want);
        }
        // Without verification no CA is needed.
        let open = BackendTls {
            verify: false,
            ca_pem: String::new(),
            ..good
        };
        assert!(client_config(&open, false).is_ok());
    }
}
