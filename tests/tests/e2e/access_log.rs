//! The access log of a real proxy process: one line per request with its fields, the
//! request id it sent upstream, and a writer that never holds requests up.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use holdfast_tests::fake_control_plane::{FakeControlPlane, snapshot};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::tls::{TestCa, certificate_resource, client_config, https_get};
use holdfast_tests::wait::{T, until};

use holdfast_tests::{echo, http};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn dirs(test: &str) -> (tempfile::TempDir, PathBuf) {
    let logs = holdfast_tests::repo_root()
        .join("target/e2e-logs")
        .join(format!("access-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    (tempfile::tempdir().unwrap(), logs)
}

/// The hyper engine (HTTP/1.1 with `HOLDFAST_H1_ENGINE=hyper`) logs a body's declared
/// length; the native engine counts the bytes.
fn native() -> bool {
    std::env::var("HOLDFAST_H1_ENGINE").map_or(true, |e| e != "hyper")
}

/// The log's lines once it has at least `n` (within the deadline), parsed.
async fn lines(log: &Path, n: usize) -> anyhow::Result<Vec<Value>> {
    until("the access log's lines", T, || async {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{e}: {text}"))?;
        Ok((lines.len() >= n).then_some(lines))
    })
    .await
}

/// Sends `request` on a new connection and reads the answer until the proxy closes it.
async fn raw(addr: SocketAddr, request: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.write_all(request).await?;
    let mut answer = Vec::new();
    tokio::time::timeout(T, c.read_to_end(&mut answer)).await??;
    Ok(answer)
}

fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    answer.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test]
async fn each_request_has_one_access_log_line_with_its_fields_and_the_request_id_sent_upstream()
-> anyhow::Result<()> {
    let (state, logs) = dirs("fields");
    let ca = TestCa::new("holdfast test CA");
    let site = ca.server(&["a.test"]);
    let web = echo::spawn(([127, 0, 0, 1], 0).into(), "echo-web").await?.0;
    let cp = FakeControlPlane::start(None).await?;
    let mut s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[web])]);
    s.certificates = vec![certificate_resource("a", &site)];
    s.virtual_hosts[0].certificate = "a".into();
    holdfast_proto::snapshot::seal(&mut s, 1);
    cp.push(s.clone());
    let log = logs.join("access.log");
    let p = ProxyProc::start(
        "proxy-access-fields",
        &[cp.url()],
        &state.path().join("one"),
        &logs,
        &[
            "--listen-tls",
            "127.0.0.1:0",
            "--access-log",
            log.to_str().unwrap(),
        ],
    )?;
    p.wait_version(&s.version, T).await?;

    // A request with a body, a trace and an id of its own (from an untrusted client: not
    // kept), its path not normalised and with a query (left out of the log by default).
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let request = format!(
        "POST /p/../q?token=secret HTTP/1.1\r\nhost: a.test\r\nuser-agent: tester/1.0\r\nreferer: https://from.test/\r\ntraceparent: 00-{trace}-00f067aa0ba902b7-01\r\nx-request-id: chosen-by-client\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"
    );
    let answer = raw(p.addr, request.as_bytes()).await?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let sent_upstream = header(&text, "x-echo-x-request-id").expect("an id upstream");
    // Answered by the proxy itself: 404, with the reason.
    assert_eq!(p.get("nothing.test", "/").await?.0, 404);
    // Over TLS, HTTP/2 (hyper serves it whatever the HTTP/1.1 engine).
    let https = p.https.expect("started with --listen-tls");
    let h2 = https_get(https, client_config(&ca.cert_pem, &["h2"]), "a.test", "/h2").await?;
    assert_eq!(h2.status, 200);

    let got = lines(&log, 3).await?;
    assert_eq!(got.len(), 3, "one line a request: {got:#?}");
    // Found by what they are: two engines write them, so their order is not fixed.
    let find = |path: &str| {
        got.iter()
            .find(|l| l["path"] == path)
            .unwrap_or_else(|| panic!("{path} in {got:#?}"))
    };
    let first = find("/q");
    for (field, want) in [
        ("client", "127.0.0.1"),
        ("method", "POST"),
        ("host", "a.test"),
        ("path", "/q"),
        ("protocol", "HTTP/1.1"),
        ("upstream", &web.to_string()),
        ("request_id", sent_upstream),
        ("trace_id", trace),
        ("user_agent", "tester/1.0"),
        ("referer", "https://from.test/"),
    ] {
        assert_eq!(first[field].as_str(), Some(want), "{field}: {first}");
    }
    assert_ne!(sent_upstream, "chosen-by-client");
    assert_eq!(sent_upstream.len(), 32, "{sent_upstream}");
    assert_eq!(first["status"], 200);
    assert!(
        first["route"]
            .as_str()
            .is_some_and(|r| r.ends_with("a.test/")),
        "{first}"
    );
    if native() {
        assert_eq!(first["bytes_received"], request.len());
        assert_eq!(first["bytes_sent"], answer.len());
    } else {
        assert_eq!(first["bytes_received"], 5);
    }
    let total = first["duration_ms"].as_f64().expect("a duration");
    let upstream = first["upstream_duration_ms"]
        .as_f64()
        .expect("an upstream time");
    assert!(upstream <= total, "{first}");
    assert!(first["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    for absent in ["reason", "tls_version", "sni"] {
        assert!(first.get(absent).is_none(), "{absent}: {first}");
    }

    let second = got
        .iter()
        .find(|l| l["host"] == "nothing.test")
        .expect("the 404's line");
    assert_eq!(second["status"], 404);
    assert_eq!(second["reason"], "no_route");
    assert!(second.get("upstream").is_none(), "{second}");
    assert_ne!(second["request_id"], first["request_id"]);

    let third = find("/h2");
    assert_eq!(third["protocol"], "HTTP/2.0");
    assert_eq!(third["tls_version"], "TLSv1.3");
    assert_eq!(third["sni"], "a.test");
    assert_eq!(third["path"], "/h2");
    assert_eq!(
        third["request_id"].as_str(),
        h2.headers
            .get("x-echo-x-request-id")
            .and_then(|v| v.to_str().ok())
    );
    drop(p);

    // Behind a trusted balancer: its request id is kept, the client is the address it
    // forwarded for, and with --access-log-query the query is logged.
    let log = logs.join("access-trusted.log");
    let p = ProxyProc::start(
        "proxy-access-trusted",
        &[cp.url()],
        &state.path().join("two"),
        &logs,
        &[
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-query",
            "--trust-forwarded-from",
            "127.0.0.1",
            "--drain-delay",
            "0s",
        ],
    )?;
    p.wait_version(&s.version, T).await?;
    let (status, headers, _) = http::get_with(
        p.addr,
        "a.test",
        "/x?page=2",
        &[
            ("x-request-id", "from-the-balancer-7"),
            ("x-forwarded-for", "203.0.113.9"),
        ],
    )
    .await?;
    assert_eq!(status, 200);
    assert_eq!(headers["x-echo-x-request-id"], "from-the-balancer-7");
    let got = lines(&log, 1).await?;
    assert_eq!(got[0]["request_id"], "from-the-balancer-7");
    assert_eq!(got[0]["client"], "203.0.113.9");
    assert_eq!(got[0]["path"], "/x?page=2");

    // The last request's line is written before the proxy exits, not lost with it.
    let (status, _, _) = http::get_with(p.addr, "a.test", "/last", &[]).await?;
    assert_eq!(status, 200);
    let mut p = p;
    assert!(p.proc.terminate(T)?.success());
    let text = std::fs::read_to_string(&log)?;
    let last: Vec<Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(last.len(), 2, "{text}");
    assert_eq!(last[1]["path"], "/last", "{text}");
    Ok(())
}

#[tokio::test]
async fn the_combined_format_is_nginx_s_and_sampling_keeps_every_error() -> anyhow::Result<()> {
    let (state, logs) = dirs("combined");
    let web = echo::spawn(([127, 0, 0, 1], 0).into(), "echo-web").await?.0;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[web])]);
    cp.push(s.clone());
    let log = logs.join("access.log");
    let p = ProxyProc::start(
        "proxy-access-combined",
        &[cp.url()],
        state.path(),
        &logs,
        &[
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-format",
            "combined",
            "--access-log-sample",
            "0",
        ],
    )?;
    p.wait_version(&s.version, T).await?;
    for _ in 0..5 {
        assert_eq!(p.get("a.test", "/fine").await?.0, 200);
    }
    assert_eq!(p.get("a.test", "/broken?status=500").await?.0, 500);
    assert_eq!(p.get("nothing.test", "/gone").await?.0, 404);
    // The two errors, and none of the successes (sampled at 0).
    let text = until("two lines", T, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        Ok((text.lines().count() >= 2).then_some(text))
    })
    .await?;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    // `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent "$http_referer"
    // "$http_user_agent"`, time as `07/Dec/2026:21:10:00 +0000`.
    let seen: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            let q: Vec<&str> = l.split('"').collect();
            assert_eq!(q.len(), 7, "{l}");
            let time = q[0]
                .strip_prefix("127.0.0.1 - - [")
                .and_then(|t| t.strip_suffix("] "))
                .unwrap_or_else(|| panic!("{l}"));
            assert_eq!(time.len(), "07/Dec/2026:21:10:00 +0000".len(), "{l}");
            assert!(time.ends_with(" +0000"), "{l}");
            let request: Vec<&str> = q[1].split(' ').collect();
            assert_eq!((request[0], request[2]), ("GET", "HTTP/1.1"), "{l}");
            let numbers: Vec<&str> = q[2].split_whitespace().collect();
            assert_eq!(numbers.len(), 2, "{l}");
            assert!(numbers[1].parse::<u64>().is_ok(), "{l}");
            assert_eq!((q[3], q[4], q[5], q[6]), ("-", " ", "-", ""), "{l}");
            (request[1].to_owned(), numbers[0].to_owned())
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("/broken".to_owned(), "500".to_owned()),
            ("/gone".to_owned(), "404".to_owned())
        ]
    );
    Ok(())
}

/// A sink nobody reads (a FIFO whose reader never reads): requests are served at full
/// speed all the same, and the lines that found no room are counted as dropped.
#[tokio::test]
async fn a_blocked_access_log_drops_and_counts_lines_and_never_holds_requests_up()
-> anyhow::Result<()> {
    let (state, logs) = dirs("blocked");
    let web = echo::spawn(([127, 0, 0, 1], 0).into(), "echo-web").await?.0;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[web])]);
    cp.push(s.clone());
    let fifo = state.path().join("access.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
    assert!(made.success(), "mkfifo");
    // Held open for reading (so the proxy's open does not wait for a reader) and never
    // read: once the pipe's buffer is full, every write blocks.
    // (Linux opens a FIFO for reading and writing at once without waiting.)
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)?;
    let p = ProxyProc::start(
        "proxy-access-blocked",
        &[cp.url()],
        &state.path().join("state"),
        &logs,
        &[
            "--access-log",
            fifo.to_str().unwrap(),
            "--access-log-buffer",
            "16",
        ],
    )?;
    p.wait_version(&s.version, T).await?;
    // Long paths fill the pipe's 64 KiB in a few hundred lines.
    let path = format!("/{}", "x".repeat(2000));
    let requests = 600;
    let served = tokio::time::timeout(Duration::from_secs(60), async {
        let mut ok = 0;
        for _ in 0..requests {
            if p.get("a.test", &path).await?.0 == 200 {
                ok += 1;
            }
        }
        anyhow::Ok(ok)
    })
    .await
    .expect("every request answered while the log is blocked")?;
    assert_eq!(served, requests);
    let dropped = p
        .metric_value("holdfast_proxy_access_log_dropped_total")
        .await?;
    // At most the pipe's buffer (64 KiB of lines over 2,000 bytes each), the batch the
    // writer is blocked writing and a full batch behind it got through.
    assert!(
        dropped >= f64::from(requests - 64 * 1024 / 2000 - 2 * 16),
        "{dropped}"
    );
    assert!(dropped <= f64::from(requests), "{dropped}");
    Ok(())
}

/// The lines of `text` that are access log lines (JSON with a `path`), parsed.
fn access_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("path").is_some() && v.get("status").is_some())
        .collect()
}

#[tokio::test]
async fn the_access_log_goes_to_stdout_by_default_and_nowhere_when_off() -> anyhow::Result<()> {
    let (state, logs) = dirs("stdout");
    let web = echo::spawn(([127, 0, 0, 1], 0).into(), "echo-web").await?.0;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[web])]);
    cp.push(s.clone());
    // No flag: stdout (the test harness writes the process's stdout to its log file).
    let by_default = ProxyProc::start(
        "proxy-access-stdout",
        &[cp.url()],
        &state.path().join("default"),
        &logs,
        &[],
    )?;
    by_default.wait_version(&s.version, T).await?;
    assert_eq!(by_default.get("a.test", "/by-default").await?.0, 200);
    let line = until("the line on stdout", T, || async {
        Ok(access_lines(&by_default.proc.log())
            .into_iter()
            .find(|l| l["path"] == "/by-default"))
    })
    .await?;
    assert_eq!(line["status"], 200);
    assert_eq!(line["host"], "a.test");
    // An upgrade is a line too, with its 101.
    let mut ws = tokio::net::TcpStream::connect(by_default.addr).await?;
    ws.write_all(
        b"GET /ws HTTP/1.1\r\nhost: a.test\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    )
    .await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(T, ws.read_exact(&mut byte)).await??;
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    ws.write_all(b"ping").await?;
    let mut echoed = [0u8; 4];
    tokio::time::timeout(T, ws.read_exact(&mut echoed)).await??;
    assert_eq!(&echoed, b"ping");
    drop(ws);
    let upgrade = until("the upgrade's line", T, || async {
        Ok(access_lines(&by_default.proc.log())
            .into_iter()
            .find(|l| l["path"] == "/ws"))
    })
    .await?;
    assert_eq!(upgrade["status"], 101, "{upgrade}");

    // Off: nothing, even once the proxy has exited (which writes what waits).
    let mut off = ProxyProc::start(
        "proxy-access-off",
        &[cp.url()],
        &state.path().join("off"),
        &logs,
        &["--access-log", "off", "--drain-delay", "0s"],
    )?;
    off.wait_version(&s.version, T).await?;
    assert_eq!(off.get("a.test", "/quiet").await?.0, 200);
    assert!(off.proc.terminate(T)?.success());
    let text = off.proc.log();
    assert!(!text.is_empty(), "the proxy's own log is there");
    assert!(access_lines(&text).is_empty(), "{text}");
    Ok(())
}
