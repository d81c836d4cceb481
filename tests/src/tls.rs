//! Test certificates and an HTTPS client: a private CA made with rcgen, certificates it
//! signs (for Ingress Secrets, the control plane's serving certificate, proxies' and
//! operators' client certificates), and a client that verifies a server against the CA,
//! offers ALPN, and reports what it saw (status, body, protocol, the leaf's serial).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use holdfast_lock::Lock;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::TlsConnector;

/// A certificate and its key, as PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (leaf only).
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl Issued {
    /// Writes `<dir>/<name>.crt` and `<dir>/<name>.key`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
        let (crt, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&crt, &self.cert_pem)?;
        // A key is private to this user, as a key should be.
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&key)?
            .write_all(self.key_pem.as_bytes())?;
        Ok((crt, key))
    }

    /// The certificate's serial number as lower-case hex.
    pub fn serial(&self) -> String {
        let der = CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).expect("our PEM");
        serial_of(&der)
    }
}

/// The serial number (lower-case hex) of a DER certificate.
pub fn serial_of(der: &CertificateDer<'_>) -> String {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).expect("a certificate");
    cert.raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A private certificate authority (ECDSA P-256).
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("self-signed CA");
        TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for the DNS names (or IP addresses) in `sans`.
    pub fn server(&self, sans: &[&str]) -> Issued {
        self.issue(sans, &[], ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose identity is the DNS names in `sans` and the URIs in
    /// `uris` (for example `spiffe://holdfast/proxy/p1`).
    pub fn client(&self, sans: &[&str], uris: &[&str]) -> Issued {
        self.issue(sans, uris, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A server certificate for `sans` that expired on 2021-01-01 (valid from 2020-01-01).
    pub fn expired_server(&self, sans: &[&str]) -> Issued {
        self.issue_with(sans, &[], ExtendedKeyUsagePurpose::ServerAuth, |p| {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        })
    }

    fn issue(&self, sans: &[&str], uris: &[&str], usage: ExtendedKeyUsagePurpose) -> Issued {
        self.issue_with(sans, uris, usage, |_| {})
    }

    fn issue_with(
        &self,
        sans: &[&str],
        uris: &[&str],
        usage: ExtendedKeyUsagePurpose,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Issued {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        adjust(&mut params);
        for san in sans {
            params.subject_alt_names.push(match san.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*san).try_into().expect("a DNS name")),
            });
        }
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*uri).try_into().expect("a URI")));
        }
        params.distinguished_name.push(
            DnType::CommonName,
            sans.first().or(uris.first()).copied().unwrap_or("x"),
        );
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes the CA certificate to `<dir>/<name>.crt`.
    pub fn write(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        let path = dir.join(format!("{name}.crt"));
        std::fs::write(&path, &self.cert_pem)?;
        Ok(path)
    }
}

/// What an HTTPS request saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Response status.
    pub status: u16,
    /// Response headers.
    pub headers: http::HeaderMap,
    /// Response body.
    pub body: String,
    /// The protocol ALPN chose ("h2", "http/1.1", or "" for none).
    pub alpn: String,
    /// The server certificate's serial (lower-case hex).
    pub serial: String,
    /// Whether the TLS session was resumed (no full handshake).
    pub resumed: bool,
}

/// A rustls client configuration that trusts `ca_pem` and offers `alpn`.
pub fn client_config(ca_pem: &str, alpn: &[&str]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// Like [`client_config`], but the server's certificate is verified as of `at` (chain,
/// name and signatures all checked): to see that an expired certificate is served.
pub fn client_config_at(
    ca_pem: &str,
    alpn: &[&str],
    at: std::time::SystemTime,
) -> Arc<rustls::ClientConfig> {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::UnixTime;
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    struct At(Arc<rustls::client::WebPkiServerVerifier>, UnixTime);
    impl ServerCertVerifier for At {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            self.0.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                self.1,
            )
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }

    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(At(verifier, UnixTime::since_unix_epoch(since))))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// Key and chain of `issued` for rustls.
pub fn identity(issued: &Issued) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("chain");
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("key");
    (chain, key)
}

/// GET `https://<sni><path>` from `addr` on a fresh connection, verifying the server
/// against `config`'s roots for the name `sni`, with `Host: sni`.
pub async fn https_get(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    sni: &str,
    path: &str,
) -> Result<Seen> {
    let fut = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from(sni.to_owned())?;
        let tls = TlsConnector::from(config).connect(name, tcp).await?;
        let (_, conn) = tls.get_ref();
        let alpn = conn
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let serial = conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(serial_of)
            .unwrap_or_default();
        let uri = format!("https://{sni}{path}");
        let (status, headers, body) = if alpn == "h2" {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await?;
            tokio::spawn(conn);
            let req = http::Request::get(uri).body(Empty::<Bytes>::new())?;
            let resp = sender.send_request(req).await?;
            let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
            (
                status,
                headers,
                resp.into_body().collect().await?.to_bytes(),
            )
        } else {
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
            tokio::spawn(conn);
            let req = http::Request::get(path)
                .header(http::header::HOST, sni)
                .body(Empty::<Bytes>::new())?;
            let resp = sender.send_request(req).await?;
            let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
            (
                status,
                headers,
                resp.into_body().collect().await?.to_bytes(),
            )
        };
        Ok::<_, anyhow::Error>(Seen {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            alpn,
            serial,
            resumed,
        })
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .with_context(|| format!("GET https://{sni}{path} via {addr} timed out"))?
}

/// The identity (a URI SAN) of the operators' test certificate, given to control planes
/// as `--admin-identities`.
pub const OPERATOR: &str = "spiffe://holdfast.test/operator";

/// The certificates of the planes for one test process: a CA, the control plane's
/// serving certificate (127.0.0.1, localhost and the Service's name), an operator's client certificate, and a
/// client certificate per proxy node id, all as files.
pub struct Planes {
    /// The CA that signs everything here.
    pub ca: TestCa,
    /// Where the files are.
    pub dir: PathBuf,
    /// `ca.crt`.
    pub ca_file: PathBuf,
    /// The control plane's serving certificate and key.
    pub server: (PathBuf, PathBuf),
    /// The operator's client certificate and key ([`OPERATOR`]).
    pub operator: (PathBuf, PathBuf),
    proxies: std::sync::Mutex<std::collections::BTreeMap<String, (PathBuf, PathBuf)>>,
}

impl Planes {
    /// The process's planes certificates (made on first use).
    pub fn get() -> &'static Planes {
        static PLANES: std::sync::OnceLock<Planes> = std::sync::OnceLock::new();
        PLANES.get_or_init(|| {
            let dir = crate::repo_root()
                .join("target/e2e-pki")
                .join(std::process::id().to_string());
            std::fs::create_dir_all(&dir).expect("PKI directory");
            let ca = TestCa::new("holdfast test planes CA");
            let ca_file = ca.write(&dir, "ca").expect("CA file");
            let server = ca
                .server(&[
                    "127.0.0.1",
                    "localhost",
                    // The name `kubectl holdfast` checks by default (the Service's).
                    "holdfast-control-plane.holdfast-system.svc",
                ])
                .write(&dir, "control-plane")
                .expect("server files");
            let operator = ca
                .client(&[], &[OPERATOR])
                .write(&dir, "operator")
                .expect("operator files");
            Planes {
                ca,
                dir,
                ca_file,
                server,
                operator,
                proxies: Default::default(),
            }
        })
    }

    /// A client certificate whose identity is the DNS name `node_id` (issued once).
    pub fn proxy(&self, node_id: &str) -> (PathBuf, PathBuf) {
        let mut proxies = self.proxies.locked();
        proxies
            .entry(node_id.to_owned())
            .or_insert_with(|| {
                self.ca
                    .client(&[node_id], &[])
                    .write(&self.dir, &format!("proxy-{node_id}"))
                    .expect("proxy files")
            })
            .clone()
    }

    /// A gRPC channel to `url`: plaintext for http://, mutual TLS for https:// with the
    /// certificate of proxy `node_id` (or the operator's, for None).
    pub async fn channel(
        &self,
        url: &str,
        node_id: Option<&str>,
    ) -> Result<tonic::transport::Channel> {
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())?;
        if !url.starts_with("https://") {
            return Ok(endpoint.connect().await?);
        }
        let (cert, key) = match node_id {
            Some(id) => self.proxy(id),
            None => self.operator.clone(),
        };
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(
                &self.ca_file,
            )?))
            .identity(tonic::transport::Identity::from_pem(
                std::fs::read(cert)?,
                std::fs::read(key)?,
            ))
            .domain_name("localhost");
        Ok(endpoint.tls_config(tls)?.connect().await?)
    }

    /// A raw TLS connection to the control plane's gRPC port at `addr`, ALPN h2, with the
    /// certificate of proxy `node_id`: for tests that write HTTP/2 frames themselves.
    pub async fn raw_h2(
        &self,
        addr: SocketAddr,
        node_id: &str,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let (cert, key) = self.proxy(node_id);
        let issued = Issued {
            cert_pem: std::fs::read_to_string(cert)?,
            key_pem: std::fs::read_to_string(key)?,
        };
        let (chain, key) = identity(&issued);
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&self.ca_file)? {
            roots.add(c?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        Ok(TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?)
    }

    /// The control plane's mutual-TLS flags (serving certificate, client CA, operator
    /// identity, a fast reload interval for rotation tests).
    pub fn control_plane_flags(&self) -> Vec<String> {
        let p = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            "--tls-cert".into(),
            p(&self.server.0),
            "--tls-key".into(),
            p(&self.server.1),
            "--client-ca".into(),
            p(&self.ca_file),
            "--admin-identities".into(),
            OPERATOR.into(),
            // Every test proxy's certificate names its node id; the operator's never
            // streams routes whatever the pattern.
            "--proxy-identities".into(),
            "*".into(),
            "--tls-reload-interval".into(),
            "200ms".into(),
        ]
    }

    /// A proxy's mutual-TLS flags for node `node_id`.
    pub fn proxy_flags(&self, node_id: &str) -> Vec<String> {
        let (cert, key) = self.proxy(node_id);
        let p = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            "--tls-cert".into(),
            p(&cert),
            "--tls-key".into(),
            p(&key),
            "--control-plane-ca".into(),
            p(&self.ca_file),
            "--tls-reload-interval".into(),
            "200ms".into(),
        ]
    }

    /// grpcurl's flags for the operator: `-cacert -cert -key`.
    pub fn grpcurl_flags(&self) -> Vec<String> {
        let p = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            "-cacert".into(),
            p(&self.ca_file),
            "-cert".into(),
            p(&self.operator.0),
            "-key".into(),
            p(&self.operator.1),
        ]
    }
}

/// A snapshot's certificate resource named `name` for `issued` (facts filled in as the
/// control plane fills them).
pub fn certificate_resource(name: &str, issued: &Issued) -> holdfast_proto::v1::Certificate {
    let facts =
        holdfast_proto::certificate::parse(issued.cert_pem.as_bytes(), issued.key_pem.as_bytes())
            .expect("a good certificate")
            .facts;
    holdfast_proto::v1::Certificate {
        name: name.into(),
        certificate_chain: issued.cert_pem.clone().into_bytes(),
        private_key: issued.key_pem.clone().into_bytes(),
        fingerprint_sha256: facts.fingerprint_sha256,
        subject: facts.subject,
        dns_names: facts.dns_names,
        not_after: facts.not_after,
        serial: facts.serial,
    }
}
