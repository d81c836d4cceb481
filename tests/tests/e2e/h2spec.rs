//! HTTP/2 conformance: h2spec (pinned in deploy/local/versions.env, built by
//! `deploy/local/k8s.sh ensure`) against the proxy's h2c listener and its TLS listener.
//! It must pass, except the cases listed in `tests/h2spec-allowlist.txt`, each with the
//! reason it is allowed.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use holdfast_tests::fake_control_plane::{FakeControlPlane, snapshot};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::tls::{TestCa, certificate_resource};
use holdfast_tests::{cluster, echo};

use holdfast_tests::wait::T;

/// The allowed failures: `<listener>: <case id>` (like `h2c: http2/3.5/2`) before `#` on
/// each line of the allowlist.
fn allowlist() -> BTreeSet<String> {
    let path = holdfast_tests::repo_root().join("tests/h2spec-allowlist.txt");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split('#').next())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Runs h2spec against `addr` (TLS with `tls`); returns the ids of the failed cases and
/// the whole report.
fn h2spec(addr: SocketAddr, tls: bool) -> anyhow::Result<(BTreeSet<String>, String)> {
    let report = tempfile::NamedTempFile::new()?;
    let mut cmd = std::process::Command::new(cluster::tools_bin()?.join("h2spec"));
    cmd.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-o", "5", "-j"])
        .arg(report.path());
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let out = cmd.output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // JUnit: a <testcase package="http2/6.9.1" classname="..."> with <failure> or
    // <error> inside failed. The id is the package and the case's number in it.
    let xml = std::fs::read_to_string(report.path())?;
    let mut failed = BTreeSet::new();
    for suite in xml.split("<testsuite ").skip(1) {
        let package = attr(suite, "package").unwrap_or_default();
        for (i, case) in suite.split("<testcase ").skip(1).enumerate() {
            let body = case.split("</testcase>").next().unwrap_or("");
            if body.contains("<failure") || body.contains("<error") {
                failed.insert(format!("{package}/{}", i + 1));
            }
        }
    }
    anyhow::ensure!(
        xml.contains("<testcase"),
        "h2spec ran no case (exit {}): {text}",
        out.status
    );
    Ok((failed, text))
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!("{name}=\""))? + name.len() + 2;
    let end = tag[start..].find('"')? + start;
    Some(tag[start..end].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_on_the_h2c_and_tls_listeners() -> anyhow::Result<()> {
    let logs = holdfast_tests::repo_root()
        .join("target/e2e-logs")
        .join(format!("h2spec-{}", std::process::id()));
    std::fs::create_dir_all(&logs)?;
    let state = tempfile::tempdir()?;
    let ca = TestCa::new("holdfast h2spec CA");
    let cert = ca.server(&["h2spec.test"]);
    let web = echo::spawn(([127, 0, 0, 1], 0).into(), "echo").await?.0;
    let cp = FakeControlPlane::start(None).await?;
    // h2spec asks for 127.0.0.1:PORT, and sends no SNI over TLS (an IP address): the
    // default certificate answers.
    let mut s = snapshot(1, &[("127.0.0.1", "/", "web")], &[("web", &[web])]);
    s.certificates = vec![certificate_resource("h2spec", &cert)];
    s.default_certificate = "h2spec".into();
    holdfast_proto::snapshot::seal(&mut s, 1);
    cp.push(s.clone());
    let p = ProxyProc::start(
        "proxy-h2spec",
        &[cp.url()],
        state.path(),
        &logs,
        &["--listen-tls", "127.0.0.1:0"],
    )?;
    p.wait_version(&s.version, T).await?;

    let allowed = allowlist();
    let mut failures = BTreeSet::new();
    for (what, addr, tls) in [
        ("h2c", p.addr, false),
        ("tls", p.https.expect("the TLS listener"), true),
    ] {
        let (failed, text) = h2spec(addr, tls)?;
        let summary = text.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        eprintln!("h2spec {what}: {summary}; failed: {failed:?}");
        if !failed.is_empty() {
            eprintln!("{text}");
        }
        failures.extend(failed.iter().map(|id| format!("{what}: {id}")));
    }
    let unexpected: Vec<_> = failures.difference(&allowed).collect();
    assert!(
        unexpected.is_empty(),
        "h2spec failures not in tests/h2spec-allowlist.txt: {unexpected:?}"
    );
    let stale: Vec<_> = allowed.difference(&failures).collect();
    assert!(
        stale.is_empty(),
        "tests/h2spec-allowlist.txt allows cases that pass now; remove them: {stale:?}"
    );
    Ok(())
}
