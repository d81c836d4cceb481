//! TLS certificates as both planes check them: a PEM chain and key from a
//! `kubernetes.io/tls` Secret, parsed into what rustls serves, with the facts an operator
//! sees instead of the key (fingerprint, subject, DNS names, notAfter, serial).
//!
//! The control plane runs [`parse`] on every Secret an Ingress names, so a malformed PEM,
//! an unsupported key or a key that does not match the certificate never reaches a
//! snapshot; the proxy runs it again when it compiles a snapshot (and NACKs on failure).
//! Error messages never contain key bytes.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

/// Why a certificate and key cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    /// `tls.crt` holds no PEM certificate, or one that does not decode.
    #[error("tls.crt holds no usable PEM certificate: {0}")]
    Chain(String),
    /// `tls.key` holds no PEM private key, or one that does not decode.
    #[error("tls.key holds no usable PEM private key ({0})")]
    Key(String),
    /// The key is of a kind rustls cannot sign with.
    #[error("tls.key is not a supported key (RSA, ECDSA P-256/P-384 or Ed25519)")]
    UnsupportedKey,
    /// The key is not the certificate's key.
    #[error("tls.key does not match the certificate in tls.crt")]
    KeyMismatch,
    /// The leaf certificate does not parse as X.509.
    #[error("the certificate in tls.crt is not valid X.509: {0}")]
    X509(String),
}

/// What an operator sees of a certificate (never the key).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Facts {
    /// SHA-256 of the leaf's DER, lower-case hex.
    pub fingerprint_sha256: String,
    /// The leaf's subject.
    pub subject: String,
    /// The leaf's DNS subject alternative names, lower-cased.
    pub dns_names: Vec<String>,
    /// notAfter, seconds since the Unix epoch.
    pub not_after: i64,
    /// Serial number, lower-case hex.
    pub serial: String,
}

/// A certificate chain and key ready to serve, and its facts.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// What rustls hands out for a matching SNI.
    pub key: Arc<CertifiedKey>,
    /// What an operator sees.
    pub facts: Facts,
}

/// Parses a PEM chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or SEC1), and
/// checks that the key is the leaf's.
pub fn parse(chain_pem: &[u8], key_pem: &[u8]) -> Result<Parsed, CertificateError> {
    let (chain, facts) = chain_and_facts(chain_pem)?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertificateError::Key(pem_error(&e)))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|_| CertificateError::UnsupportedKey)?;
    let key = CertifiedKey::new(chain, signing);
    match key.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(_) => return Err(CertificateError::KeyMismatch),
    }
    Ok(Parsed {
        key: Arc::new(key),
        facts,
    })
}

/// A chain without its private key (what `Admin/GetSnapshot` shows): the facts, and a
/// key that cannot sign, for looking routes up offline (`kubectl holdfast explain`). A
/// proxy never serves one: its snapshots always carry keys, parsed by [`parse`].
pub fn parse_without_key(chain_pem: &[u8]) -> Result<Parsed, CertificateError> {
    let (chain, facts) = chain_and_facts(chain_pem)?;
    Ok(Parsed {
        key: Arc::new(CertifiedKey::new(chain, Arc::new(NoKey))),
        facts,
    })
}

/// The signing key of a certificate shown without its key: offers no scheme, so a
/// handshake with it fails.
#[derive(Debug)]
struct NoKey;

impl rustls::sign::SigningKey for NoKey {
    fn choose_scheme(
        &self,
        _offered: &[rustls::SignatureScheme],
    ) -> Option<Box<dyn rustls::sign::Signer>> {
        None
    }

    fn algorithm(&self) -> rustls::SignatureAlgorithm {
        rustls::SignatureAlgorithm::Anonymous
    }
}

/// The chain's certificates (leaf first) and the leaf's facts.
fn chain_and_facts(
    chain_pem: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, Facts), CertificateError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CertificateError::Chain(pem_error(&e)))?;
    let Some(leaf) = chain.first() else {
        return Err(CertificateError::Chain("no CERTIFICATE block".into()));
    };
    let facts = facts(leaf)?;
    Ok((chain, facts))
}

/// A PEM error in words, without the bytes it was reading.
fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::NoItemsFound => "no PEM block found".into(),
        Error::MissingSectionEnd { .. } => "a PEM block has no END line".into(),
        Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".into(),
        Error::Base64Decode(_) => "a PEM block is not valid base64".into(),
        _ => "PEM does not decode".into(),
    }
}

fn facts(leaf: &CertificateDer<'_>) -> Result<Facts, CertificateError> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(leaf.as_ref())
        .map_err(|e| CertificateError::X509(e.to_string()))?;
    let mut dns_names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(n) = name {
                dns_names.push(n.to_ascii_lowercase());
            }
        }
    }
    Ok(Facts {
        fingerprint_sha256: hex(&Sha256::digest(leaf.as_ref())),
        subject: cert.subject().to_string(),
        dns_names,
        not_after: cert.validity().not_after.timestamp(),
        serial: hex(cert.raw_serial()),
    })
}

/// Only the `CERTIFICATE` blocks of a PEM text, each with its BEGIN and END lines, in
/// order. A `tls.crt` sometimes holds the private key too (a "combined" PEM); what is
/// carried and shown as the certificate chain must never contain it.
pub fn certificate_blocks(pem: &[u8]) -> Vec<u8> {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    const END: &[u8] = b"-----END CERTIFICATE-----";
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = find(rest, BEGIN) {
        let after = &rest[start..];
        let Some(end) = find(after, END) else { break };
        out.extend_from_slice(&after[..end + END.len()]);
        out.push(b'\n');
        rest = &after[end + END.len()..];
    }
    out
}

/// What `{:?}` shows of a snapshot's certificate: its name and facts, never the chain's
/// or the key's bytes (a snapshot printed for debugging must not leak keys into logs).
impl std::fmt::Debug for crate::v1::Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("name", &self.name)
            .field(
                "certificate_chain",
                &format_args!("<{} bytes>", self.certificate_chain.len()),
            )
            .field("private_key", &format_args!("<redacted>"))
            .field("fingerprint_sha256", &self.fingerprint_sha256)
            .field("subject", &self.subject)
            .field("dns_names", &self.dns_names)
            .field("not_after", &self.not_after)
            .field("serial", &self.serial)
            .finish()
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Does a certificate with these DNS names cover `host` (lower-case)? A name covers
/// itself; a wildcard name `*.example.com` covers exactly one more label
/// (`a.example.com`, not `a.b.example.com`, not `example.com`), and also the host
/// `*.example.com` itself (an Ingress TLS entry for a wildcard host).
pub fn covers(dns_names: &[String], host: &str) -> bool {
    dns_names.iter().any(|name| {
        if name == host {
            return true;
        }
        match name.strip_prefix("*.") {
            Some(suffix) => host
                .split_once('.')
                .is_some_and(|(label, rest)| !label.is_empty() && label != "*" && rest == suffix),
            None => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_wildcard_covers_one_label_and_an_exact_name_only_itself() {
        let wild = names(&["*.example.test"]);
        assert!(covers(&wild, "a.example.test"));
        assert!(covers(&wild, "*.example.test"));
        assert!(!covers(&wild, "a.b.example.test"));
        assert!(!covers(&wild, "example.test"));
        let exact = names(&["a.example.test"]);
        assert!(covers(&exact, "a.example.test"));
        assert!(!covers(&exact, "b.example.test"));
        assert!(!covers(&exact, "*.example.test"));
    }

    fn issue(sans: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(names(sans)).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A fixed certificate (Ed25519, made once with openssl for this test; the key
    /// protects nothing) and what `openssl x509 -fingerprint -sha256 -enddate -serial
    /// -subject` says of it: the facts are fixed test vectors, not recomputations.
    #[test]
    fn a_fixed_certificate_has_the_facts_openssl_gives_it() {
        const KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIBbyloUP1W4jVUbC9W/qkr4yFilQ4hLSKcTnGtNKTs1S
-----END PRIVATE KEY-----
";
        const CHAIN: &str = "-----BEGIN CERTIFICATE-----
MIIBXjCCARCgAwIBAgICEjQwBQYDK2VwMB0xGzAZBgNVBAMMEmZpeGVkLmV4YW1w
bGUudGVzdDAgFw0yNjEyMDUxMjQ1NTBaGA8yMTI2MTExMTEyNDU1MFowHTEbMBkG
A1UEAwwSZml4ZWQuZXhhbXBsZS50ZXN0MCowBQYDK2VwAyEA66B4bqPHxKm07WKC
YkJOC+iz5u/a4C1+WUDpTi8MjsWjcjBwMB0GA1UdDgQWBBS7z6dMZz6BiSZHIH8e
HQ4WuTdw1DAfBgNVHSMEGDAWgBS7z6dMZz6BiSZHIH8eHQ4WuTdw1DAPBgNVHRMB
Af8EBTADAQH/MB0GA1UdEQQWMBSCEmZpeGVkLmV4YW1wbGUudGVzdDAFBgMrZXAD
QQDJmhMoi9mDFIIPlrAWRk7+oTuTGYk2aYAiMsx3QU0eBMKxncWHAVwOxamdyDbt
IBW5g1frjt3RoIRa5QkrrxYF
-----END CERTIFICATE-----
";
        let facts = parse(CHAIN.as_bytes(), KEY.as_bytes()).unwrap().facts;
        assert_eq!(
            facts.fingerprint_sha256,
            "7d7f17e13610bb1c711b1ea3f85f99c87883c8037ecff96174617df423fcbad0"
        );
        assert_eq!(facts.subject, "CN=fixed.example.test");
        assert_eq!(facts.dns_names, ["fixed.example.test"]);
        // notAfter=Nov 11 12:45:50 2126 GMT.
        assert_eq!(facts.not_after, 4_950_074_750);
        assert_eq!(facts.serial, "1234");
    }

    #[test]
    fn a_good_pair_parses_with_its_facts_and_a_foreign_key_is_refused() {
        let (chain, key) = issue(&["a.example.test", "*.Wild.Example.Test"]);
        let parsed = parse(chain.as_bytes(), key.as_bytes()).unwrap();
        assert_eq!(
            parsed.facts.dns_names,
            ["a.example.test", "*.wild.example.test"]
        );
        assert_eq!(parsed.facts.fingerprint_sha256.len(), 64);
        assert!(parsed.facts.not_after > 0);
        assert!(!parsed.facts.serial.is_empty());
        let (_, other_key) = issue(&["a.example.test"]);
        assert_eq!(
            parse(chain.as_bytes(), other_key.as_bytes()).unwrap_err(),
            CertificateError::KeyMismatch
        );
        assert!(matches!(
            parse(chain.as_bytes(), b"").unwrap_err(),
            CertificateError::Key(_)
        ));
    }

    #[test]
    fn a_combined_pem_yields_only_its_certificate_blocks() {
        let (chain, key) = issue(&["a.example.test"]);
        let combined = format!("{key}{chain}junk\n{chain}");
        let blocks = String::from_utf8(certificate_blocks(combined.as_bytes())).unwrap();
        assert!(!blocks.contains("PRIVATE KEY"), "{blocks}");
        assert!(!blocks.contains("junk"));
        assert_eq!(blocks.matches("BEGIN CERTIFICATE").count(), 2);
        // What is left still parses as the chain.
        assert!(parse(&certificate_blocks(combined.as_bytes()), key.as_bytes()).is_ok());
    }

    #[test]
    fn debug_output_of_a_certificate_never_holds_its_key() {
        let (chain, key) = issue(&["a.example.test"]);
        let c = crate::v1::Certificate {
            name: "ns/site".into(),
            certificate_chain: chain.into_bytes(),
            private_key: key.clone().into_bytes(),
            ..Default::default()
        };
        let shown = format!(
            "{:?}",
            crate::v1::Snapshot {
                certificates: vec![c],
                ..Default::default()
            }
        );
        assert!(
            shown.contains("ns/site") && shown.contains("<redacted>"),
            "{shown}"
        );
        let body = key.lines().nth(1).unwrap();
        assert!(
            !shown.contains(body) && !shown.contains("PRIVATE"),
            "{shown}"
        );
    }

    #[test]
    fn garbage_is_refused_with_a_reason_that_holds_no_key_bytes() {
        let key =
            b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0IGtleSBieXRlcw==\n-----END PRIVATE KEY-----\n";
        for (chain, key) in [
            (&b""[..], &key[..]),
            (b"not pem at all", key),
            (
                b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
                key,
            ),
            (
                b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                key,
            ),
        ] {
            let e = parse(chain, key).unwrap_err().to_string();
            assert!(!e.contains("c2VjcmV0"), "{e}");
            assert!(e.contains("tls.crt"), "{e}");
        }
    }
}
