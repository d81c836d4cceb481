//! The proxy's HTTPS listener as a real process, fed by an in-test control plane with
//! certificates from a test CA: SNI (exact, wildcard, unknown), ALPN h2 and http/1.1,
//! the HTTP→HTTPS redirect and its opt-out, rotation under traffic, and that no key
//! material leaves the proxy through its admin endpoints or lands in a readable file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use holdfast_proto::v1::Snapshot;
use holdfast_tests::fake_control_plane::{FakeControlPlane, snapshot};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::tls::{Issued, TestCa, certificate_resource, client_config, https_get};
use holdfast_tests::{echo, wait};

use holdfast_tests::wait::T;

fn dirs(test: &str) -> (tempfile::TempDir, PathBuf) {
    let logs = holdfast_tests::repo_root()
        .join("target/e2e-logs")
        .join(format!("https-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    (tempfile::tempdir().unwrap(), logs)
}

/// Routes for a.test, *.example.test, open.test and plain.test to `web`; certificates:
/// `a` (for a.test), `wild` (for *.example.test), `open` (open.test, no redirect).
fn tls_snapshot(revision: u64, web: SocketAddr, certs: &[(&str, &Issued)]) -> Snapshot {
    let mut s = snapshot(
        revision,
        &[
            ("a.test", "/", "web"),
            ("*.example.test", "/", "web"),
            ("open.test", "/", "web"),
            ("plain.test", "/", "web"),
        ],
        &[("web", &[web])],
    );
    s.certificates = certs
        .iter()
        .map(|(n, i)| certificate_resource(n, i))
        .collect();
    s.certificates.sort_by(|a, b| a.name.cmp(&b.name));
    for v in &mut s.virtual_hosts {
        (v.certificate, v.ssl_redirect) = match v.host.as_str() {
            "a.test" => ("a".into(), true),
            "*.example.test" => ("wild".into(), true),
            "open.test" => ("open".into(), false),
            _ => (String::new(), false),
        };
    }
    holdfast_proto::snapshot::seal(&mut s, revision);
    s
}

struct Setup {
    ca: TestCa,
    a: Issued,
    wild: Issued,
    open: Issued,
    web: SocketAddr,
    cp: FakeControlPlane,
    p: ProxyProc,
    _state: tempfile::TempDir,
}

async fn setup(test: &str) -> anyhow::Result<Setup> {
    let (state, logs) = dirs(test);
    let ca = TestCa::new("holdfast test CA");
    let a = ca.server(&["a.test"]);
    let wild = ca.server(&["*.example.test"]);
    let open = ca.server(&["open.test"]);
    let web = echo::spawn(([127, 0, 0, 1], 0).into(), "echo-web").await?.0;
    let cp = FakeControlPlane::start(None).await?;
    let s = tls_snapshot(1, web, &[("a", &a), ("wild", &wild), ("open", &open)]);
    cp.push(s.clone());
    let p = ProxyProc::start(
        &format!("proxy-{test}"),
        &[cp.url()],
        &state.path().join("state"),
        &logs,
        &["--listen-tls", "127.0.0.1:0"],
    )?;
    p.wait_version(&s.version, T).await?;
    Ok(Setup {
        ca,
        a,
        wild,
        open,
        web,
        cp,
        p,
        _state: state,
    })
}

fn roots(ca_pem: &str) -> rustls::RootCertStore {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    roots
}

#[tokio::test]
async fn https_is_served_by_sni_over_h2_and_http1_and_unknown_names_fail_the_handshake()
-> anyhow::Result<()> {
    let s = setup("sni").await?;
    let https = s.p.https.expect("started with --listen-tls");

    let h2 = client_config(&s.ca.cert_pem, &["h2", "http/1.1"]);
    let seen = https_get(https, h2.clone(), "a.test", "/x").await?;
    assert_eq!((seen.status, seen.body.as_str()), (200, "echo-web\n"));
    assert_eq!(seen.alpn, "h2");
    assert_eq!(seen.serial, s.a.serial());
    assert_eq!(seen.headers["x-echo-x-forwarded-proto"], "https");

    let h1 = client_config(&s.ca.cert_pem, &["http/1.1"]);
    let seen = https_get(https, h1.clone(), "a.test", "/x").await?;
    assert_eq!((seen.status, seen.alpn.as_str()), (200, "http/1.1"));
    assert_eq!(seen.headers["x-echo-x-forwarded-proto"], "https");
    assert!(!seen.resumed);
    // Session resumption: the same client's next connection skips the full handshake.
    let again = https_get(https, h1, "a.test", "/x").await?;
    assert_eq!(again.status, 200);
    assert!(again.resumed, "the session was not resumed");

    // TLS 1.2 too.
    let mut tls12 = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])?
    .with_root_certificates(roots(&s.ca.cert_pem))
    .with_no_client_auth();
    tls12.alpn_protocols = vec![b"http/1.1".to_vec()];
    let seen = https_get(https, std::sync::Arc::new(tls12), "a.test", "/").await?;
    assert_eq!(seen.status, 200);

    // A wildcard certificate covers one label, not two.
    let seen = https_get(https, h2.clone(), "b.example.test", "/").await?;
    assert_eq!((seen.status, seen.serial), (200, s.wild.serial()));
    let deeper = https_get(https, h2.clone(), "a.b.example.test", "/").await;
    assert!(deeper.is_err(), "a.b.example.test got a certificate");

    // No certificate for the name (and no default certificate): the handshake fails.
    for name in ["unknown.test", "plain.test"] {
        assert!(
            https_get(https, h2.clone(), name, "/").await.is_err(),
            "{name}"
        );
    }
    assert!(
        s.p.metric_value("holdfast_proxy_tls_handshake_failures_total")
            .await?
            >= 3.0
    );
    Ok(())
}

#[tokio::test]
async fn plain_http_is_redirected_with_308_unless_the_host_opts_out_or_has_no_certificate()
-> anyhow::Result<()> {
    let s = setup("redirect").await?;
    let (status, headers, _) =
        holdfast_tests::http::get_full(s.p.addr, "a.test:8080", "/path?q=1").await?;
    assert_eq!(status, 308);
    assert_eq!(headers["location"], "https://a.test/path?q=1");
    let (status, headers, _) =
        holdfast_tests::http::get_full(s.p.addr, "b.example.test", "/").await?;
    assert_eq!(
        (status, &headers["location"]),
        (308, &"https://b.example.test/".parse()?)
    );
    // The opt-out (holdfast.dev/ssl-redirect: "false") and a host without a certificate.
    assert_eq!(s.p.get("open.test", "/").await?.0, 200);
    assert_eq!(s.p.get("plain.test", "/").await?.0, 200);
    // ACME HTTP-01 challenges are answered over plain HTTP.
    assert_eq!(
        s.p.get("a.test", "/.well-known/acme-challenge/token")
            .await?
            .0,
        200
    );
    Ok(())
}

#[tokio::test]
async fn no_key_material_in_debug_endpoints_and_the_state_file_is_private() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let s = setup("secrets").await?;
    let key_body = |i: &Issued| {
        i.key_pem
            .lines()
            .find(|l| !l.starts_with("-----"))
            .unwrap()
            .to_owned()
    };
    for path in [
        "/debug/snapshot",
        "/debug/explain?host=a.test&path=/",
        "/metrics",
    ] {
        let (_, body) = s.p.admin_get(path).await?;
        assert!(!body.contains("PRIVATE KEY"), "{path}: {body}");
        for i in [&s.a, &s.wild, &s.open] {
            assert!(!body.contains(&key_body(i)), "{path} shows a key");
        }
    }
    let (_, body) = s.p.admin_get("/debug/snapshot").await?;
    let fingerprint =
        holdfast_proto::certificate::parse(s.a.cert_pem.as_bytes(), s.a.key_pem.as_bytes())?
            .facts
            .fingerprint_sha256;
    assert!(body.contains(&fingerprint), "{body}");

    let state = s.p.state_dir.clone();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("snapshot.bin")), 0o600);
    Ok(())
}

#[tokio::test]
async fn a_rotated_certificate_serves_new_handshakes_with_no_failed_request_and_open_connections_stay()
-> anyhow::Result<()> {
    let s = setup("rotate").await?;
    let https = s.p.https.expect("https");
    let h1 = client_config(&s.ca.cert_pem, &["http/1.1"]);

    // A connection opened before the rotation.
    let tcp = tokio::net::TcpStream::connect(https).await?;
    let tls = tokio_rustls::TlsConnector::from(h1.clone())
        .connect("a.test".try_into()?, tcp)
        .await?;
    let (mut open, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(conn);

    // Traffic: new connections, one after another, until told to stop (bounded).
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let traffic = {
        let (stop, ok, failed, h1) = (stop.clone(), ok.clone(), failed.clone(), h1.clone());
        tokio::spawn(async move {
            for _ in 0..20_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match https_get(https, h1.clone(), "a.test", "/").await {
                    Ok(seen) if seen.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    wait::until("traffic flowing", T, || async {
        Ok::<_, String>((ok.load(Ordering::Relaxed) > 20).then_some(()))
    })
    .await?;

    let renewed = s.ca.server(&["a.test"]);
    let next = tls_snapshot(
        2,
        s.web,
        &[("a", &renewed), ("wild", &s.wild), ("open", &s.open)],
    );
    s.cp.push(next.clone());
    s.p.wait_version(&next.version, T).await?;
    wait::until(
        "a new handshake sees the renewed certificate",
        T,
        || async {
            let seen = https_get(
                https,
                client_config(&s.ca.cert_pem, &["http/1.1"]),
                "a.test",
                "/",
            )
            .await
            .map_err(|e| e.to_string())?;
            if seen.serial == renewed.serial() {
                Ok(Some(()))
            } else {
                Err(format!(
                    "serial {} (want {})",
                    seen.serial,
                    renewed.serial()
                ))
            }
        },
    )
    .await?;
    let before = ok.load(Ordering::Relaxed);
    wait::until("more traffic after the rotation", T, || async {
        Ok::<_, String>((ok.load(Ordering::Relaxed) > before + 20).then_some(()))
    })
    .await?;
    stop.store(true, Ordering::Relaxed);
    traffic.await?;
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during the rotation"
    );

    // The connection opened before the rotation still works.
    let req = http::Request::get("/")
        .header("host", "a.test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    assert_eq!(open.send_request(req).await?.status(), 200);
    Ok(())
}

/// Sends `GET / HTTP/1.1` with `host` over a TLS connection made with `sni`, and returns
/// the status code.
async fn status_on_connection_for(
    s: &Setup,
    sni: &str,
    hosts: &[&str],
) -> anyhow::Result<Vec<u16>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let https = s.p.https.expect("started with --listen-tls");
    let tcp = tokio::net::TcpStream::connect(https).await?;
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned())?;
    let config = client_config(&s.ca.cert_pem, &["http/1.1"]);
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    let mut statuses = Vec::new();
    for host in hosts {
        let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n");
        tls.write_all(req.as_bytes()).await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = tokio::time::timeout(T, tls.read(&mut byte)).await??;
            anyhow::ensure!(n == 1, "closed before a whole head: {head:?}");
            head.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let status: u16 = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no status in {text}"))?;
        let length: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        tokio::time::timeout(T, tls.read_exact(&mut body)).await??;
        statuses.push(status);
    }
    Ok(statuses)
}

/// A client that reuses a TLS connection for a host served with another certificate than
/// the one the connection was made with (its SNI chose it) gets 421 Misdirected Request,
/// so it opens a connection of its own; hosts the same certificate serves pass.
#[tokio::test]
async fn a_host_served_with_another_certificate_than_the_connections_gets_421() -> anyhow::Result<()>
{
    let s = setup("misdirected").await?;
    // The wildcard's connection serves every host it covers.
    assert_eq!(
        status_on_connection_for(&s, "b.example.test", &["b.example.test", "c.example.test"])
            .await?,
        [200, 200]
    );
    // a.test's own certificate is not the wildcard's; plain.test has none.
    assert_eq!(
        status_on_connection_for(&s, "b.example.test", &["a.test"]).await?,
        [421]
    );
    assert_eq!(
        status_on_connection_for(&s, "a.test", &["a.test", "plain.test"]).await?,
        [200, 421]
    );
    assert_eq!(
        s.p.metric(r#"holdfast_proxy_error_responses_total{reason="misdirected",status="421"}"#)
            .await?,
        Some(2.0)
    );
    Ok(())
}
