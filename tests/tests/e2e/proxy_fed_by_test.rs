//! The proxy as a real process, fed by an in-test control plane (so any snapshot, valid or
//! not, can be pushed) and forwarding to echo upstreams on 127.0.0.1.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use holdfast_tests::fake_control_plane::{FakeControlPlane, snapshot};
use holdfast_tests::h2raw::{self, connect as h2_connect, frame as h2_frame, get_block as h2_get};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::{echo, wait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use holdfast_tests::wait::T;

fn dirs(test: &str) -> (tempfile::TempDir, PathBuf) {
    let logs = holdfast_tests::repo_root()
        .join("target/e2e-logs")
        .join(format!("dp-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    (tempfile::tempdir().unwrap(), logs)
}

async fn echo_on_loopback(name: &str) -> SocketAddr {
    echo::spawn(([127, 0, 0, 1], 0).into(), name)
        .await
        .unwrap()
        .0
}

/// A 127.0.0.1 port with nothing listening.
fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn wait_version(p: &ProxyProc, version: &str) -> anyhow::Result<()> {
    p.wait_version(version, T).await
}

/// A proxy with `args`, fed one route (`a.test/` to an echo named `echo-a`) by an
/// in-test control plane, serving it. Keep the returned parts alive while it runs.
struct OneRoute {
    p: ProxyProc,
    _state: tempfile::TempDir,
    _cp: FakeControlPlane,
}

async fn one_route(test: &str, args: &[&str]) -> anyhow::Result<OneRoute> {
    let (state, logs) = dirs(test);
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(s.clone());
    let p = ProxyProc::start(
        &format!("proxy-{test}"),
        &[cp.url()],
        state.path(),
        &logs,
        args,
    )?;
    wait_version(&p, &s.version).await?;
    Ok(OneRoute {
        p,
        _state: state,
        _cp: cp,
    })
}

#[tokio::test]
async fn an_invalid_snapshot_is_nacked_with_the_reason_and_the_old_routes_keep_serving()
-> anyhow::Result<()> {
    let (state, logs) = dirs("nack");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let good = snapshot(10, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(good.clone());
    let p = ProxyProc::start("proxy-nack", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &good.version).await?;
    assert_eq!(p.get("a.test", "/").await?, (200, "echo-a\n".into()));

    // A route to a backend that is not in the snapshot (sealed, so only consistency fails).
    let mut bad = snapshot(
        11,
        &[("a.test", "/", "web"), ("b.test", "/", "missing")],
        &[("web", &[a])],
    );
    holdfast_proto::snapshot::seal(&mut bad, 11);
    cp.push(bad.clone());
    let nack = wait::until("a NACK", T, || async {
        Ok(cp.requests().into_iter().find(|r| r.error_detail.is_some()))
    })
    .await?;
    let reason = nack.error_detail.unwrap().message;
    assert!(
        reason.contains("missing") && reason.contains("not in the snapshot"),
        "{reason}"
    );
    assert_eq!(
        nack.version_info, good.version,
        "a NACK names the version still in use"
    );
    assert_eq!(
        p.get("a.test", "/").await?,
        (200, "echo-a\n".into()),
        "old routes keep serving"
    );
    assert_eq!(p.get("b.test", "/").await?.0, 404);
    assert_eq!(
        p.metric("holdfast_proxy_snapshot_nacks_total").await?,
        Some(1.0)
    );

    // An older cluster revision is refused too (never backwards).
    let older = snapshot(9, &[("c.test", "/", "web")], &[("web", &[a])]);
    cp.push(older);
    wait::until("a second NACK", T, || async {
        let n = cp
            .requests()
            .iter()
            .filter(|r| {
                r.error_detail
                    .as_ref()
                    .is_some_and(|e| e.message.contains("older"))
            })
            .count();
        Ok((n == 1).then_some(()))
    })
    .await?;
    assert_eq!(p.get("c.test", "/").await?.0, 404);

    // A tampered snapshot (hash no longer matches) is refused.
    let mut tampered = snapshot(12, &[("d.test", "/", "web")], &[("web", &[a])]);
    tampered.virtual_hosts[0].host = "e.test".into();
    cp.push(tampered);
    wait::until("a hash NACK", T, || async {
        Ok(cp
            .requests()
            .iter()
            .any(|r| {
                r.error_detail
                    .as_ref()
                    .is_some_and(|e| e.message.contains("hash"))
            })
            .then_some(()))
    })
    .await?;

    // A valid newer one applies and is ACKed with its version.
    let newer = snapshot(
        13,
        &[("a.test", "/", "web"), ("f.test", "/", "web")],
        &[("web", &[a])],
    );
    cp.push(newer.clone());
    wait_version(&p, &newer.version).await?;
    assert_eq!(p.get("f.test", "/").await?.0, 200);
    let acked = wait::until("the ACK", T, || async {
        Ok(cp
            .requests()
            .into_iter()
            .find(|r| r.error_detail.is_none() && r.version_info == newer.version))
    })
    .await?;
    assert_eq!(acked.content_hash, newer.content_hash);
    Ok(())
}

#[tokio::test]
async fn status_codes_404_503_502_504_with_short_bodies_saying_which() -> anyhow::Result<()> {
    let (state, logs) = dirs("codes");
    let a = echo_on_loopback("echo-a").await;
    let down = closed_port();
    let cp = FakeControlPlane::start(None).await?;
    let mut s = snapshot(
        1,
        &[
            ("ok.test", "/", "web"),
            ("empty.test", "/", "empty"),
            ("down.test", "/", "down"),
            ("slow.test", "/", "web"),
        ],
        &[("web", &[a]), ("empty", &[]), ("down", &[down])],
    );
    s.backends[1].unavailable_reason = "service ns/empty not found".into();
    holdfast_proto::snapshot::seal(&mut s, 1);
    cp.push(s.clone());
    let p = ProxyProc::start(
        "proxy-codes",
        &[cp.url()],
        state.path(),
        &logs,
        &["--upstream-response-timeout", "500ms"],
    )?;
    wait_version(&p, &s.version).await?;

    // A client learns the status and nothing else: no Service name, no pod address.
    let pages = [
        ("nothing.test", "/", 404, "404 Not Found\n"),
        ("empty.test", "/", 503, "503 Service Unavailable\n"),
        ("down.test", "/", 502, "502 Bad Gateway\n"),
        ("slow.test", "/?delay_ms=3000", 504, "504 Gateway Timeout\n"),
    ];
    for (host, path, code, page) in pages {
        assert_eq!(p.get(host, path).await?, (code, page.to_owned()), "{host}");
    }
    assert_eq!(p.get("ok.test", "/").await?.0, 200);

    let (_, metrics) = p.admin_get("/metrics").await?;
    assert!(
        metrics.contains(r#"holdfast_proxy_requests_total{route="ok.test/",class="2xx"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"holdfast_proxy_requests_total{route="empty.test/",class="5xx"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("holdfast_proxy_upstream_latency_seconds_bucket"),
        "{metrics}"
    );
    // Each error answer the proxy made itself is counted by why (the dashboard's "5xx by
    // reason").
    for (reason, status) in [
        ("no_route", 404),
        ("backend_unavailable", 503),
        ("upstream_connect_failed", 502),
        ("upstream_timeout", 504),
    ] {
        let line = format!(
            r#"holdfast_proxy_error_responses_total{{reason="{reason}",status="{status}"}} 1"#
        );
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    drop(p);

    // --verbose-errors (development): the pages say why.
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start(
        "proxy-codes-verbose",
        &[cp.url()],
        state.path(),
        &logs,
        &["--upstream-response-timeout", "500ms", "--verbose-errors"],
    )?;
    wait_version(&p, &s.version).await?;
    for (host, path, code, says) in [
        (
            "nothing.test",
            "/",
            404,
            "no virtual host for nothing.test".to_owned(),
        ),
        (
            "empty.test",
            "/",
            503,
            "service ns/empty not found".to_owned(),
        ),
        ("down.test", "/", 502, format!("connect failed: {down}")),
        (
            "slow.test",
            "/?delay_ms=3000",
            504,
            "did not answer within".to_owned(),
        ),
    ] {
        let (got, body) = p.get(host, path).await?;
        assert_eq!(got, code, "{host}: {body}");
        assert!(body.contains(&says), "{host}: {body}");
    }
    Ok(())
}

#[tokio::test]
async fn the_per_route_latency_histogram_measures_the_whole_exchange() -> anyhow::Result<()> {
    let w = one_route("latency", &[]).await?;
    let p = &w.p;
    // The apply that made the route is timed too (the dashboard's apply panel); it is
    // observed just after the swap that wait_version sees.
    wait::until("the apply timed", T, || async {
        let applies = p
            .metric("holdfast_proxy_snapshot_apply_duration_seconds_count")
            .await
            .map_err(|e| e.to_string())?;
        Ok(applies.filter(|&n| n >= 1.0))
    })
    .await?;
    // Two answers that each take at least 300 ms upstream.
    for _ in 0..2 {
        let (code, body) = p.get("a.test", "/?delay_ms=300").await?;
        assert_eq!(code, 200, "{body}");
    }
    let series = |suffix: &str| format!("holdfast_proxy_request_duration_seconds{suffix}");
    let route = r#"route="a.test/""#;
    assert_eq!(
        p.metric(&series(&format!("_count{{{route}}}"))).await?,
        Some(2.0)
    );
    let sum = p.metric(&series(&format!("_sum{{{route}}}"))).await?;
    assert!(
        sum.is_some_and(|s| s >= 0.6),
        "sum {sum:?} under 2 × 300 ms"
    );
    // None is in the buckets below the delay (up to 0.2048 s).
    let bucket = |le: &str| series(&format!("_bucket{{le=\"{le}\",{route}}}"));
    assert_eq!(p.metric(&bucket("0.2048")).await?, Some(0.0));
    assert_eq!(p.metric(&bucket("+Inf")).await?, Some(2.0));
    Ok(())
}

#[tokio::test]
async fn a_connection_failure_is_retried_on_another_endpoint_which_is_then_preferred()
-> anyhow::Result<()> {
    let (state, logs) = dirs("retry");
    let a = echo_on_loopback("echo-a").await;
    let b = echo_on_loopback("echo-b").await;
    let dead = closed_port();
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[dead, a, b])]);
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-retry", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (code, body) = p.get("a.test", "/").await?;
        assert_eq!(code, 200, "{body}");
        served.insert(body);
    }
    assert_eq!(
        served.into_iter().collect::<Vec<_>>(),
        ["echo-a\n", "echo-b\n"],
        "round robin over the live endpoints"
    );
    assert_eq!(
        p.metric("holdfast_proxy_upstream_connect_errors_total")
            .await?,
        Some(1.0),
        "the dead endpoint was ejected after one failure"
    );
    Ok(())
}

#[tokio::test]
async fn upstream_connections_are_reused_across_requests_and_client_connections()
-> anyhow::Result<()> {
    let opened = "holdfast_proxy_upstream_connections_opened_total";
    // Each GET is a client connection of its own; a HEAD's response has no body.
    async fn twenty_requests(p: &ProxyProc) -> anyhow::Result<()> {
        for i in 0..10 {
            let (code, body) = p.get("a.test", &format!("/{i}")).await?;
            assert_eq!(code, 200, "{body}");
            let head = raw_head(
                p.addr,
                "HEAD / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
            )
            .await?;
            assert!(head.starts_with("http/1.1 200"), "{head}");
        }
        Ok(())
    }
    let one = one_route("reuse", &["--worker-threads", "1"]).await?;
    twenty_requests(&one.p).await?;
    assert_eq!(
        one.p.metric(opened).await?,
        Some(1.0),
        "20 requests one after another need one upstream connection"
    );
    // Two workers, each with its own idle pool; the kernel spreads the 20 client
    // connections over them.
    let two = one_route("reuse-two-workers", &["--worker-threads", "2"]).await?;
    twenty_requests(&two.p).await?;
    let n = two.p.metric_value(opened).await?;
    assert!(
        (1.0..=2.0).contains(&n),
        "at most one upstream connection per worker, opened {n}"
    );

    let none = one_route("no-reuse", &["--upstream-pool-idle", "0"]).await?;
    for i in 0..3 {
        let (code, body) = none.p.get("a.test", &format!("/{i}")).await?;
        assert_eq!(code, 200, "{body}");
    }
    assert_eq!(
        none.p.metric(opened).await?,
        Some(3.0),
        "--upstream-pool-idle 0 keeps no connection"
    );
    Ok(())
}

/// Sends raw bytes to the proxy and returns the status line.
async fn raw(addr: SocketAddr, request: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(request.as_bytes()).await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(T, s.read(&mut buf)).await??;
    Ok(String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned())
}

/// The proxy runs with mimalloc's purge delay at 0, so memory goes back to the kernel as it
/// is freed (an idle proxy does not run the allocator again to act on a delay): started
/// without `MIMALLOC_PURGE_DELAY`, the same process (same pid) runs with it at 0 and serves;
/// a value the environment sets is kept.
#[tokio::test]
async fn the_proxy_runs_with_the_allocators_purge_delay_at_zero_unless_one_is_set()
-> anyhow::Result<()> {
    fn environ(p: &ProxyProc) -> anyhow::Result<Vec<String>> {
        let pid = p
            .proc
            .pid()
            .ok_or_else(|| anyhow::anyhow!("the proxy has no pid"))?;
        let raw = std::fs::read(format!("/proc/{pid}/environ"))?;
        Ok(raw
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect())
    }
    anyhow::ensure!(
        std::env::var_os("MIMALLOC_PURGE_DELAY").is_none(),
        "this test needs MIMALLOC_PURGE_DELAY unset in its own environment"
    );
    let (state, logs) = dirs("purge");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(s.clone());
    // MIMALLOC_VERBOSE: mimalloc reports its options as it starts, the only observation of
    // the value it runs with (the first image reports its default, the second the one set).
    let verbose = vec![("MIMALLOC_VERBOSE".to_owned(), "1".to_owned())];
    let p = ProxyProc::start_with_env(
        "proxy-purge",
        &[cp.url()],
        state.path(),
        &logs,
        &[],
        verbose,
    )?;
    wait_version(&p, &s.version).await?;
    let env = environ(&p)?;
    assert!(env.iter().any(|v| v == "MIMALLOC_PURGE_DELAY=0"), "{env:?}");
    let log = p.proc.log();
    let reported: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("option 'purge_delay'"))
        .collect();
    assert_eq!(
        reported
            .last()
            .map(|l| l.trim_end().ends_with("option 'purge_delay': 0")),
        Some(true),
        "mimalloc's own report of its purge delay: {reported:?}"
    );
    assert_eq!(p.get("a.test", "/").await?.0, 200);

    let (state, logs) = dirs("purge-set");
    let set = vec![("MIMALLOC_PURGE_DELAY".to_owned(), "25".to_owned())];
    let q = ProxyProc::start_with_env(
        "proxy-purge-set",
        &[cp.url()],
        state.path(),
        &logs,
        &[],
        set,
    )?;
    wait_version(&q, &s.version).await?;
    let env = environ(&q)?;
    assert!(
        env.iter().any(|v| v == "MIMALLOC_PURGE_DELAY=25"),
        "{env:?}"
    );
    assert!(
        !env.iter().any(|v| v == "MIMALLOC_PURGE_DELAY=0"),
        "{env:?}"
    );
    assert_eq!(q.get("a.test", "/").await?.0, 200);
    Ok(())
}

#[tokio::test]
async fn smuggling_shapes_get_400_and_hop_by_hop_headers_never_reach_the_upstream()
-> anyhow::Result<()> {
    let (state, logs) = dirs("headers");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-headers", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;

    let both = "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert!(raw(p.addr, both).await?.contains(" 400 "));
    let twice =
        "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd";
    assert!(raw(p.addr, twice).await?.contains(" 400 "));
    let listed = "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4, 4\r\n\r\nabcd";
    assert!(raw(p.addr, listed).await?.contains(" 400 "));
    let two_hosts = "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n";
    assert!(raw(p.addr, two_hosts).await?.contains(" 400 "));
    // A chunked body on a method without one: refused, not forwarded without its body.
    for method in ["GET", "HEAD"] {
        let req = format!(
            "{method} / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let line = raw(p.addr, &req).await?;
        assert!(line.contains(" 400 "), "{method}: {line}");
    }
    let by_length = "GET / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello";
    assert!(raw(p.addr, by_length).await?.contains(" 200 "));
    // A Host that is not host[:port] (RFC 3986) is refused before routing.
    for host in [
        "a.test/admin",
        "user@a.test",
        "a.test:80:80",
        "a.test:http",
        "[a.test]",
        "a.test\"x",
    ] {
        let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let line = raw(p.addr, &req).await?;
        assert!(line.contains(" 400 "), "{host}: {line}");
    }
    // So is the authority of an absolute-form target, whole (not only its host and port).
    for authority in ["user@a.test", "a.test:8o", "a.test:123456"] {
        let req = format!("GET http://{authority}/ HTTP/1.1\r\nHost: a.test\r\n\r\n");
        let line = raw(p.addr, &req).await?;
        assert!(line.contains(" 400 "), "{authority}: {line}");
    }
    // And an HTTP/2 :authority: 400 from the proxy, or a stream reset (PROTOCOL_ERROR)
    // where the HTTP/2 layer finds it malformed first. User info passes that layer: only
    // the proxy's check refuses it.
    let mut h2 = h2_connect(p.addr).await?;
    let authorities = [
        "a.test",
        "user@a.test",
        "a.test:8o",
        "a.test:123456",
        "a.test:80:80",
        "a.test/x",
    ];
    for (i, authority) in authorities.iter().enumerate() {
        let id = 1 + 2 * i as u32;
        let headers = h2_frame(h2raw::HEADERS, 0x5, id, &h2_get(authority, "/"));
        h2.write_all(&headers).await?;
        let got = h2raw::answer(&mut h2, id, T).await?;
        match *authority {
            "a.test" => assert_eq!(got, h2raw::Answer::Status(200)),
            "user@a.test" => assert_eq!(got, h2raw::Answer::Status(400)),
            _ => assert!(
                matches!(got, h2raw::Answer::Status(400) | h2raw::Answer::Reset(1)),
                "{authority}: {got:?}"
            ),
        }
    }
    let line = raw(p.addr, "GET / HTTP/1.1\r\nHost: A.test:8080\r\n\r\n").await?;
    assert!(line.contains(" 200 "), "{line}");
    let fine = "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n\r\nabcd";
    assert!(raw(p.addr, fine).await?.contains(" 200 "));

    // Hop-by-hop headers (and those Connection names) are removed; X-Forwarded-* added.
    let mut c = tokio::net::TcpStream::connect(p.addr).await?;
    // A client cannot name forwarding headers in Connection, nor set them: they are
    // replaced with what the proxy saw (X-Forwarded-For is appended to).
    let req = "GET /x?y=1 HTTP/1.1\r\nHost: A.test:80\r\nConnection: keep-alive, x-secret, x-forwarded-for\r\nKeep-Alive: timeout=5\r\nX-Secret: 1\r\nTE: trailers\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nX-Real-IP: 203.0.113.9\r\nForwarded: for=203.0.113.9\r\nX-Kept: yes\r\n\r\n";
    c.write_all(req.as_bytes()).await?;
    let mut buf = vec![0u8; 8192];
    let n = tokio::time::timeout(T, c.read(&mut buf)).await??;
    let head = String::from_utf8_lossy(&buf[..n]).to_lowercase();
    let seen = head
        .lines()
        .find_map(|l| l.strip_prefix("x-echo-headers: "))
        .expect("echo headers")
        .to_owned();
    let seen: Vec<&str> = seen.trim().split(',').collect();
    for gone in ["connection", "keep-alive", "x-secret", "te"] {
        assert!(
            !seen.contains(&gone),
            "{gone} reached the upstream: {seen:?}"
        );
    }
    assert!(seen.contains(&"x-kept"), "{seen:?}");
    assert!(
        head.contains("x-echo-x-forwarded-for: 203.0.113.9, 127.0.0.1"),
        "{head}"
    );
    assert!(head.contains("x-echo-x-forwarded-proto: http"), "{head}");
    assert!(
        head.contains("x-echo-x-forwarded-host: a.test:80"),
        "{head}"
    );
    assert!(head.contains("x-echo-path: /x?y=1"), "{head}");
    assert_eq!(header(&head, "x-echo-x-real-ip"), Some("127.0.0.1"));
    // The port the request came in on, not the one the client wrote in Host.
    let port = p.addr.port().to_string();
    assert_eq!(
        header(&head, "x-echo-x-forwarded-port"),
        Some(port.as_str())
    );
    assert_eq!(
        header(&head, "x-echo-forwarded"),
        Some("for=127.0.0.1;host=\"a.test:80\";proto=http")
    );
    drop(p);

    // From a balancer in --trust-forwarded-from, what it says is kept.
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start(
        "proxy-headers-trusted",
        &[cp.url()],
        state.path(),
        &logs,
        &["--trust-forwarded-from", "127.0.0.0/8"],
    )?;
    wait_version(&p, &s.version).await?;
    let req = "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Port: 443\r\nX-Real-IP: 203.0.113.9\r\n\r\n";
    let head = raw_head(p.addr, req).await?;
    assert_eq!(
        header(&head, "x-echo-x-forwarded-for"),
        Some("203.0.113.9, 127.0.0.1")
    );
    assert_eq!(header(&head, "x-echo-x-forwarded-proto"), Some("https"));
    assert_eq!(header(&head, "x-echo-x-forwarded-port"), Some("443"));
    assert_eq!(header(&head, "x-echo-x-real-ip"), Some("203.0.113.9"));
    Ok(())
}

#[tokio::test]
async fn h2c_with_prior_knowledge_and_websocket_upgrades_pass_through() -> anyhow::Result<()> {
    let (state, logs) = dirs("h2-ws");
    let a = echo_on_loopback("echo-a").await;
    let b = echo_on_loopback("echo-b").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(
        1,
        &[("a.test", "/", "web"), ("b.test", "/", "other")],
        &[("web", &[a]), ("other", &[b])],
    );
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-h2", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;

    // h2c, prior knowledge.
    let stream = tokio::net::TcpStream::connect(p.addr).await?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await?;
    tokio::spawn(conn);
    let req =
        http::Request::get("http://a.test/h2").body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.headers()["x-echo-name"], "echo-a");

    // :authority wins over a Host header, and is the Host the backend sees.
    let req = http::Request::get("http://b.test/h2")
        .header(http::header::HOST, "a.test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    assert_eq!(resp.headers()["x-echo-name"], "echo-b");
    assert_eq!(resp.headers()["x-echo-host"], "b.test");

    // So does an absolute-form target over HTTP/1.1.
    let head = raw_head(
        p.addr,
        "GET http://b.test/abs HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert_eq!(header(&head, "x-echo-name"), Some("echo-b"), "{head}");
    assert_eq!(header(&head, "x-echo-host"), Some("b.test"), "{head}");

    // Upgrade: 101 from the upstream, then bytes flow both ways.
    let mut ws = tokio::net::TcpStream::connect(p.addr).await?;
    ws.write_all(
        b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(T, ws.read(&mut buf)).await??;
    let head = String::from_utf8_lossy(&buf[..n]).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    ws.write_all(b"ping through the proxy").await?;
    let mut got = vec![0u8; 22];
    tokio::time::timeout(T, ws.read_exact(&mut got)).await??;
    assert_eq!(&got, b"ping through the proxy");

    // An h2c upgrade, or a protocol not on --allow-upgrade, goes upstream as a plain
    // request without Upgrade (the echo answers 101 to any Upgrade it sees).
    let upgrade = |protocol: &str| {
        format!(
            "GET /up HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: {protocol}\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
        )
    };
    for protocol in ["h2c", "foo"] {
        let head = raw_head(p.addr, &upgrade(protocol)).await?;
        assert!(head.starts_with("http/1.1 200"), "{protocol}: {head}");
        let seen = header(&head, "x-echo-headers").unwrap_or_default();
        assert!(!seen.contains("upgrade"), "{protocol}: {seen}");
    }
    drop(p);
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start(
        "proxy-h2-allow",
        &[cp.url()],
        state.path(),
        &logs,
        &["--allow-upgrade", "websocket,foo"],
    )?;
    wait_version(&p, &s.version).await?;
    let head = raw_head(p.addr, &upgrade("foo")).await?;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let head = raw_head(p.addr, &upgrade("h2c")).await?;
    assert!(head.starts_with("http/1.1 200"), "never h2c: {head}");
    Ok(())
}

#[tokio::test]
async fn admin_endpoints_explain_routes_and_report_readiness() -> anyhow::Result<()> {
    let (state, logs) = dirs("admin");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let p = ProxyProc::start("proxy-admin", &[cp.url()], state.path(), &logs, &[])?;
    // No snapshot yet: not ready, and requests get 503 (never a partial table).
    assert_eq!(p.admin_get("/readyz").await?.0, 503);
    assert_eq!(p.admin_get("/healthz").await?.0, 200);
    assert_eq!(p.get("a.test", "/").await?.0, 503);

    let s = snapshot(3, &[("a.test", "/api", "web")], &[("web", &[a])]);
    cp.push(s.clone());
    p.wait_ready(T).await?;
    let (_, snap) = p.admin_get("/debug/snapshot").await?;
    let snap: serde_json::Value = serde_json::from_str(&snap)?;
    assert_eq!(snap["version"], s.version.as_str());
    assert_eq!(
        (
            snap["routes"].as_u64(),
            snap["backends"].as_u64(),
            snap["endpoints"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );

    let (_, hit) = p
        .admin_get("/debug/explain?host=A.test:8080&path=/api/v1")
        .await?;
    let hit: serde_json::Value = serde_json::from_str(&hit)?;
    assert_eq!(hit["matched"], true);
    assert_eq!(hit["route"]["path"], "/api");
    assert_eq!(hit["backend"]["endpoints"][0], a.to_string());
    let (_, miss) = p.admin_get("/debug/explain?host=a.test&path=/apix").await?;
    let miss: serde_json::Value = serde_json::from_str(&miss)?;
    assert_eq!(miss["matched"], false);
    assert!(
        miss["reason"]
            .as_str()
            .unwrap()
            .contains("no Exact or Prefix route"),
        "{miss}"
    );
    assert_eq!(
        p.metric("holdfast_proxy_control_plane_connected").await?,
        Some(1.0)
    );
    assert_eq!(
        p.metric("holdfast_proxy_snapshot_cluster_revision").await?,
        Some(3.0)
    );
    // The HTTP/1.1 engine is the one this run asks for (the test command runs the
    // data-plane tests on both; native is the default).
    let engine = std::env::var("HOLDFAST_H1_ENGINE").unwrap_or_else(|_| "native".into());
    let series = format!("holdfast_proxy_h1_engine{{engine=\"{engine}\"}}");
    assert_eq!(p.metric(&series).await?, Some(1.0), "{series}");

    // /debug/* (every route and pod address) is only on the debug listener, and the
    // admin address serves only the probes and metrics.
    let on_admin = holdfast_tests::http::get(p.admin, "localhost", "/debug/snapshot").await?;
    assert_eq!(on_admin.0, 404, "{on_admin:?}");
    let on_debug = holdfast_tests::http::get(p.debug, "localhost", "/metrics").await?;
    assert_eq!(on_debug.0, 404, "{on_debug:?}");
    assert!(p.debug.ip().is_loopback());
    Ok(())
}

/// An upstream that reports when a request has arrived and answers only when released.
async fn gated_upstream() -> (
    SocketAddr,
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived_tx, arrived_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            head.extend_from_slice(&buf[..n]);
        }
        let _ = arrived_tx.send(());
        let _ = release_rx.await;
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nslow\n")
            .await
            .unwrap();
    });
    (addr, arrived_rx, release_tx)
}

#[tokio::test]
async fn sigterm_stops_accepting_and_finishes_in_flight_requests() -> anyhow::Result<()> {
    let (state, logs) = dirs("drain");
    let (upstream, arrived, release) = gated_upstream().await;
    let echo = echo_on_loopback("echo").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(
        1,
        &[("a.test", "/", "web"), ("ws.test", "/", "ws")],
        &[("web", &[upstream]), ("ws", &[echo])],
    );
    cp.push(s.clone());
    // Accepting stops after the drain delay; the grace period runs from then.
    const DRAIN: Duration = Duration::from_secs(1);
    const GRACE: Duration = Duration::from_secs(3);
    let mut p = ProxyProc::start(
        "proxy-drain",
        &[cp.url()],
        state.path(),
        &logs,
        &["--shutdown-grace", "3s", "--drain-delay", "1s"],
    )?;
    wait_version(&p, &s.version).await?;
    let addr = p.addr;
    let mut ws = tokio::net::TcpStream::connect(addr).await?;
    ws.write_all(
        b"GET / HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(T, ws.read(&mut buf)).await??;
    assert!(buf[..n].starts_with(b"HTTP/1.1 101"));
    let in_flight =
        tokio::spawn(async move { holdfast_tests::http::get(addr, "a.test", "/").await });
    tokio::time::timeout(T, arrived).await??;

    // SIGTERM: not ready at once, but still serving new connections for the drain delay.
    let signalled = std::time::Instant::now();
    p.proc.signal("TERM")?;
    // At once: well within the 1 s drain delay, during which it keeps accepting.
    wait::until("/readyz to fail", Duration::from_millis(700), || async {
        let (code, _) = p.admin_get("/readyz").await.map_err(|e| e.to_string())?;
        Ok((code == 503).then_some(()))
    })
    .await?;
    assert_eq!(
        p.get("ws.test", "/").await?.0,
        200,
        "accepting during the drain delay"
    );
    wait::until("the proxy to stop accepting", T, || async {
        Ok(tokio::net::TcpStream::connect(addr)
            .await
            .is_err()
            .then_some(()))
    })
    .await?;
    // The tunnel still works in the grace period; the in-flight request finishes.
    ws.write_all(b"still here").await?;
    let mut got = [0u8; 10];
    tokio::time::timeout(T, ws.read_exact(&mut got)).await??;
    assert_eq!(&got, b"still here");
    release
        .send(())
        .map_err(|_| anyhow::anyhow!("upstream gone"))?;
    let (code, body) = in_flight.await??;
    assert_eq!(
        (code, body.as_str()),
        (200, "slow\n"),
        "the in-flight request finished"
    );
    // The tunnel is closed at the end of the grace period (not before, and not long
    // after), and the proxy exits.
    let end = DRAIN + GRACE;
    closed_within(
        &mut ws,
        (end + Duration::from_secs(2)).saturating_sub(signalled.elapsed()),
    )
    .await
    .map_err(|e| {
        e.context(format!(
            "the tunnel outlived the grace (it ends {end:?} after SIGTERM, plus 2 s)"
        ))
    })?;
    let took = signalled.elapsed();
    eprintln!("the tunnel closed {took:?} after SIGTERM (the grace ends after {end:?})");
    assert!(
        took >= end - Duration::from_millis(100),
        "the tunnel closed {took:?} after SIGTERM, before the grace ended"
    );
    let status = p.proc.wait_exit(T)?;
    assert!(status.success(), "{status}");
    Ok(())
}

/// An upgraded tunnel with nothing moving for the idle timeout is closed.
#[tokio::test]
async fn an_idle_upgraded_tunnel_is_closed_after_the_idle_timeout() -> anyhow::Result<()> {
    let w = one_route("tunnel-idle", &["--idle-timeout", "1s"]).await?;
    let mut ws = tokio::net::TcpStream::connect(w.p.addr).await?;
    ws.write_all(
        b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(T, ws.read(&mut buf)).await??;
    assert!(buf[..n].starts_with(b"HTTP/1.1 101"));
    let took = closed_within(&mut ws, Duration::from_secs(10)).await?;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    Ok(())
}

/// The header read timeout runs from a request head's first byte, not while a keep-alive
/// connection waits for its next request (that is the idle timeout): an idle connection
/// outlives the header timeout and is reused, a head that never completes is cut.
#[tokio::test]
async fn the_header_timeout_cuts_a_slow_head_but_not_an_idle_keep_alive_connection()
-> anyhow::Result<()> {
    let (state, logs) = dirs("header-timeout");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("ka.test", "/", "web")], &[("web", &[a])]);
    cp.push(s.clone());
    let p = ProxyProc::start(
        "proxy-header-timeout",
        &[cp.url()],
        state.path(),
        &logs,
        &["--header-read-timeout", "1s", "--idle-timeout", "60s"],
    )?;
    wait_version(&p, &s.version).await?;

    let request = b"GET / HTTP/1.1\r\nHost: ka.test\r\n\r\n";
    let mut idle = tokio::net::TcpStream::connect(p.addr).await?;
    idle.write_all(request).await?;
    let first = read_response(&mut idle).await?;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // The behaviour under test: the connection stays idle for longer than the header
    // read timeout (not a synchronisation wait).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    idle.write_all(request).await?;
    let second = read_response(&mut idle).await?;
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "an idle keep-alive connection was closed by the header timeout: {second:?}"
    );

    let mut slow = tokio::net::TcpStream::connect(p.addr).await?;
    slow.write_all(b"GET / HTTP/1.1\r\nHost: ka").await?;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(T, slow.read(&mut buf)).await?;
    assert!(
        matches!(closed, Ok(0) | Err(_)),
        "an incomplete head got an answer: {closed:?}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "an incomplete head was cut after {waited:?}, not about 1 s"
    );
    Ok(())
}

/// Reads one HTTP/1.1 response with a Content-Length body; its head and body as text.
async fn read_response(s: &mut tokio::net::TcpStream) -> anyhow::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return Ok(text);
            }
        }
        let n = tokio::time::timeout(T, s.read(&mut chunk)).await??;
        if n == 0 {
            return Ok(text);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sends one raw request on a fresh connection; returns the response head, lower-cased.
pub(crate) async fn raw_head(addr: SocketAddr, request: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(T, s.read(&mut buf)).await??;
        anyhow::ensure!(n > 0, "connection closed before a response head");
        head.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&head).to_lowercase())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

#[tokio::test]
async fn routing_sees_the_normalised_path_the_backend_sees_and_unsafe_paths_get_400()
-> anyhow::Result<()> {
    let (state, logs) = dirs("paths");
    let app = echo_on_loopback("app").await;
    let auth = echo_on_loopback("auth").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(
        1,
        &[("a.test", "/", "app"), ("a.test", "/admin", "auth")],
        &[("app", &[app]), ("auth", &[auth])],
    );
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-paths", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;
    let get =
        |path: &str| format!("GET {path} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");

    // Every shape of "/admin" reaches the admin route, and the backend sees "/admin".
    for path in [
        "/admin",
        "//admin",
        "/./admin",
        "/%61dmin",
        "/x/../admin",
        "/x/%2e%2e/admin?q=1",
    ] {
        let head = raw_head(p.addr, &get(path)).await?;
        assert!(head.starts_with("http/1.1 200"), "{path}: {head}");
        assert_eq!(header(&head, "x-echo-name"), Some("auth"), "{path}");
        let seen = header(&head, "x-echo-path").unwrap_or_default();
        assert!(
            seen == "/admin" || seen == "/admin?q=1",
            "{path}: backend saw {seen}"
        );
    }
    // What cannot be normalised safely is refused.
    for path in [
        "/public/..%2fadmin",
        "/a%5cb",
        "/a%00",
        "/../admin",
        "/a%zz",
        // Dot segments with parameters, which Java servlet containers read as `..`/`.`.
        "/public/..;/admin",
        "/public/.;x/admin",
        "/public/%2e%2e;/admin",
    ] {
        let head = raw_head(p.addr, &get(path)).await?;
        assert!(head.starts_with("http/1.1 400"), "{path}: {head}");
    }
    // The debug endpoint shows both forms.
    let (_, body) = p
        .admin_get("/debug/explain?host=a.test&path=%2F%2Fadmin")
        .await?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(
        (v["path"].as_str(), v["normalised_path"].as_str()),
        (Some("//admin"), Some("/admin"))
    );
    assert_eq!(v["route"]["path"], "/admin");
    drop(p);

    // --escaped-slashes=keep: an escaped slash stays inside its segment.
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start(
        "proxy-paths-keep",
        &[cp.url()],
        state.path(),
        &logs,
        &["--escaped-slashes", "keep"],
    )?;
    wait_version(&p, &s.version).await?;
    let head = raw_head(p.addr, &get("/public/..%2fadmin")).await?;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(header(&head, "x-echo-name"), Some("app"));
    assert_eq!(header(&head, "x-echo-path"), Some("/public/..%2fadmin"));
    drop(p);

    // --allow-dot-segment-params: forwarded as they are, to the route they match.
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start(
        "proxy-paths-dot-params",
        &[cp.url()],
        state.path(),
        &logs,
        &["--allow-dot-segment-params"],
    )?;
    wait_version(&p, &s.version).await?;
    let head = raw_head(p.addr, &get("/public/..;/admin")).await?;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(header(&head, "x-echo-name"), Some("app"));
    assert_eq!(header(&head, "x-echo-path"), Some("/public/..;/admin"));
    Ok(())
}

/// An endpoint that is the proxy itself (or any chain of hops back to it) would forward
/// each request to itself until something runs out: the proxy adds its own token to the
/// loop header when forwarding, and a request that arrives with it gets 508.
#[tokio::test]
async fn a_request_that_comes_back_to_the_proxy_gets_508() -> anyhow::Result<()> {
    let (state, logs) = dirs("loop");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-loop", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;
    // The echo shows what it received: the proxy's token, on one line of the header.
    let head = raw_head(
        p.addr,
        "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let seen = header(&head, "x-echo-headers")
        .unwrap_or_default()
        .to_owned();
    assert!(seen.split(',').any(|h| h == "x-holdfast-loop"), "{seen}");

    // Now loop.test's endpoint is the proxy's own listener.
    let looped = snapshot(
        2,
        &[("a.test", "/", "web"), ("loop.test", "/", "self")],
        &[("web", &[a]), ("self", &[p.addr])],
    );
    cp.push(looped.clone());
    wait_version(&p, &looped.version).await?;
    let head = raw_head(
        p.addr,
        "GET / HTTP/1.1\r\nHost: loop.test\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert!(head.starts_with("http/1.1 508"), "{head}");
    assert_eq!(
        p.metric(r#"holdfast_proxy_error_responses_total{reason="loop_detected",status="508"}"#)
            .await?,
        Some(1.0),
        "the second pass was refused, and only it"
    );
    // A client that sends the header with another token is served as usual.
    let head = raw_head(
        p.addr,
        "GET / HTTP/1.1\r\nHost: a.test\r\nx-holdfast-loop: 0123456789abcdef\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    Ok(())
}

/// An upstream response with neither Content-Length nor Transfer-Encoding, its body ended by
/// the upstream closing (RFC 9112 §6.3), reaches the client whole: 70,003 bytes written in
/// pieces, more than the proxy's buffers hold. The native engine relays it as it comes and
/// closes the connection after it (no length to give); hyper re-frames it as chunked.
#[tokio::test]
async fn an_upstream_response_delimited_by_its_close_reaches_the_client_whole() -> anyhow::Result<()>
{
    let body: Vec<u8> = (0..70_000u32)
        .map(|i| b'a' + (i % 26) as u8)
        .chain(b"end".iter().copied())
        .collect();
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = upstream.local_addr()?;
    let sent = body.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = upstream.accept().await {
            let sent = sent.clone();
            tokio::spawn(async move {
                if !read_a_request_head(&mut c).await {
                    return;
                }
                if c.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                for piece in sent.chunks(10_000) {
                    if c.write_all(piece).await.is_err() {
                        return;
                    }
                }
                let _ = c.shutdown().await;
            });
        }
    });
    let all = one_request_through_a_proxy_to(addr, "until-close").await?;
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no response head in {} bytes", all.len()))?;
    let head = String::from_utf8_lossy(&all[..end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    let got = if head.contains("transfer-encoding: chunked") {
        dechunk(&all[end + 4..])?
    } else {
        all[end + 4..].to_vec()
    };
    assert_eq!(got.len(), body.len(), "{head}");
    assert!(got == body, "the body arrived changed");
    Ok(())
}

/// What a client reads for `GET /` (`Connection: close`) through a new proxy (named after
/// `tag`) whose one route goes to `addr`.
async fn one_request_through_a_proxy_to(addr: SocketAddr, tag: &str) -> anyhow::Result<Vec<u8>> {
    let (state, logs) = dirs(tag);
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[addr])]);
    cp.push(s.clone());
    let name = format!("proxy-{tag}");
    let p = ProxyProc::start(&name, &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;
    let mut c = tokio::net::TcpStream::connect(p.addr).await?;
    c.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        .await?;
    let mut all = Vec::new();
    tokio::time::timeout(T, c.read_to_end(&mut all)).await??;
    Ok(all)
}

/// Reads `c` until a request head's end has arrived: false if it closes or fails first.
async fn read_a_request_head(c: &mut tokio::net::TcpStream) -> bool {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// The data of a whole chunked body (no extensions, no trailers).
fn dechunk(mut rest: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut data = Vec::new();
    loop {
        let line = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow::anyhow!("a chunk size line never ended"))?;
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line])?.trim(), 16)?;
        rest = &rest[line + 2..];
        if size == 0 {
            return Ok(data);
        }
        anyhow::ensure!(rest.len() >= size + 2, "a chunk cut short");
        data.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// An upstream response with both Transfer-Encoding and Content-Length reaches the client
/// without the Content-Length (RFC 9112 §6.1), and its chunked body whole.
#[tokio::test]
async fn an_upstream_response_with_both_lengths_loses_its_content_length() -> anyhow::Result<()> {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = upstream.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut c, _)) = upstream.accept().await {
            tokio::spawn(async move {
                if !read_a_request_head(&mut c).await {
                    return;
                }
                let _ = c
                    .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\nx-holdfast-loop: 0123456789abcdef\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
                    .await;
            });
        }
    });
    let all = one_request_through_a_proxy_to(addr, "te-and-cl").await?;
    let text = String::from_utf8_lossy(&all).to_ascii_lowercase();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(
        !head.contains("x-holdfast-loop"),
        "the loop header is removed from responses: {head}"
    );
    assert_eq!(body, "5\r\nhello\r\n0\r\n\r\n");
    Ok(())
}

/// Waits until the proxy closes `s` (EOF or reset), reading and discarding what it sends;
/// returns how long that took.
async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> anyhow::Result<Duration> {
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit.saturating_sub(started.elapsed()), s.read(&mut buf)).await
        {
            Err(_) => anyhow::bail!("the connection was still open after {limit:?}"),
            Ok(Ok(0) | Err(_)) => return Ok(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// The header read timeout holds whatever came before on the connection: a head with
/// bytes that are not UTF-8, and an upgrade the upstream refused. A head ended by bare LFs
/// gets a 400.
#[tokio::test]
async fn the_header_timeout_holds_after_odd_heads_and_refused_upgrades() -> anyhow::Result<()> {
    let w = one_route(
        "header-timeout-2",
        &["--header-read-timeout", "1s", "--idle-timeout", "60s"],
    )
    .await?;
    let p = &w.p;

    let partial = b"GET / HTTP/1.1\r\nHost: a.te";
    // An upgrade that is never forwarded (h2c), on a POST whose body looks like a head
    // with a huge Content-Length: the body must not be taken for the next head.
    let fake_head = "GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n";
    let upgrade_post = format!(
        "POST / HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: {}\r\n\r\n{fake_head}",
        fake_head.len()
    );
    let firsts: [&[u8]; 3] = [
        b"GET / HTTP/1.1\r\nHost: a.test\r\nX-Name: caf\xe9\r\n\r\n",
        b"GET /ws?refuse_upgrade HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        upgrade_post.as_bytes(),
    ];
    for first in firsts {
        let mut c = tokio::net::TcpStream::connect(p.addr).await?;
        c.write_all(first).await?;
        let answer = read_response(&mut c).await?;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        c.write_all(partial).await?;
        let took = closed_within(&mut c, Duration::from_secs(8)).await?;
        assert!(
            took >= Duration::from_millis(900),
            "cut after {took:?}, before the timeout"
        );
    }

    let bare = raw_head(p.addr, "GET / HTTP/1.1\nHost: a.test\n\n").await?;
    assert!(bare.starts_with("http/1.1 400"), "{bare}");
    Ok(())
}

/// Over HTTP/2: PINGs do not keep an idle connection open, a header block must complete
/// within the header read timeout, and a stream the client reset does not count as a
/// request in flight (which would keep the connection from ever being idle).
#[tokio::test]
async fn h2_idle_and_header_timeouts_hold_against_pings_slow_headers_and_resets()
-> anyhow::Result<()> {
    let (_, logs) = dirs("h2-timeouts");
    let (gated, arrived, _release) = gated_upstream().await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[gated])]);
    cp.push(s.clone());
    let start = |name: &str, header: &str, idle: &str| {
        let state = tempfile::tempdir()?;
        let p = ProxyProc::start(
            name,
            &[cp.url()],
            state.path(),
            &logs,
            &["--header-read-timeout", header, "--idle-timeout", idle],
        )?;
        anyhow::Ok((p, state))
    };
    let (p, _state) = start("proxy-h2-timeouts", "1s", "1s")?;
    wait_version(&p, &s.version).await?;
    let limit = Duration::from_secs(6);

    // PINGs every 200 ms for up to 8 s: the connection is idle anyway.
    let (mut r, mut w) = h2_connect(p.addr).await?.into_split();
    let pinger = tokio::spawn(async move {
        for i in 0u64..40 {
            if w.write_all(&h2_frame(0x6, 0, 0, &i.to_be_bytes()))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit.saturating_sub(started.elapsed()), r.read(&mut buf)).await
        {
            Err(_) => anyhow::bail!("PINGs kept an idle HTTP/2 connection open for {limit:?}"),
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => {}
        }
    }
    pinger.abort();

    // A HEADERS frame without END_HEADERS, and no CONTINUATION (idle timeout is 1 s too,
    // so with the header block not counted, the idle close would also come: raise it).
    drop(p);
    let (p, _state) = start("proxy-h2-timeouts-2", "1s", "60s")?;
    wait_version(&p, &s.version).await?;
    let mut c = h2_connect(p.addr).await?;
    c.write_all(&h2_frame(0x1, 0x1, 1, &h2_get("a.test", "/")))
        .await?;
    let took = closed_within(&mut c, limit).await?;
    assert!(took >= Duration::from_millis(900), "cut after {took:?}");
    drop(p);

    // A request in flight, reset by the client: the connection is idle again.
    let (p, _state) = start("proxy-h2-timeouts-3", "60s", "1s")?;
    wait_version(&p, &s.version).await?;
    let mut c = h2_connect(p.addr).await?;
    // END_STREAM | END_HEADERS.
    c.write_all(&h2_frame(0x1, 0x5, 1, &h2_get("a.test", "/")))
        .await?;
    tokio::time::timeout(T, arrived).await??;
    c.write_all(&h2_frame(0x3, 0, 1, &8u32.to_be_bytes()))
        .await?; // RST_STREAM CANCEL
    closed_within(&mut c, limit).await?;
    Ok(())
}

/// Request bodies: over --max-request-body gets 413 (by Content-Length at once, or when a
/// chunked body passes it); a body that stalls gets 408 after --body-read-timeout and the
/// connection closes.
#[tokio::test]
async fn request_bodies_over_the_limit_get_413_and_stalled_ones_408() -> anyhow::Result<()> {
    let w = one_route(
        "bodies",
        &["--max-request-body", "1000", "--body-read-timeout", "1s"],
    )
    .await?;
    let p = &w.p;

    let post = |headers: &str, body: &str| {
        format!("POST / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n{headers}\r\n{body}")
    };
    let fits = raw_head(p.addr, &post("Content-Length: 1000\r\n", &"b".repeat(1000))).await?;
    assert!(fits.starts_with("http/1.1 200"), "{fits}");
    assert_eq!(header(&fits, "x-echo-body-len"), Some("1000"));
    let declared = raw_head(p.addr, &post("Content-Length: 1001\r\n", "")).await?;
    assert!(declared.starts_with("http/1.1 413"), "{declared}");
    let chunk = format!("258\r\n{}\r\n", "c".repeat(600));
    let chunked = raw_head(
        p.addr,
        &post(
            "Transfer-Encoding: chunked\r\n",
            &format!("{chunk}{chunk}0\r\n\r\n"),
        ),
    )
    .await?;
    assert!(chunked.starts_with("http/1.1 413"), "{chunked}");

    // 10 of 100 bytes, then nothing.
    let mut c = tokio::net::TcpStream::connect(p.addr).await?;
    c.write_all(post("Content-Length: 100\r\n", "0123456789").as_bytes())
        .await?;
    let started = std::time::Instant::now();
    let answer = read_response(&mut c).await?;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    closed_within(&mut c, Duration::from_secs(5)).await?;
    Ok(())
}

/// A client that stops reading its response loses the connection after --send-timeout.
#[tokio::test]
async fn a_client_that_stops_reading_is_cut_after_the_send_timeout() -> anyhow::Result<()> {
    // A short header timeout makes the proxy check its connections every 250 ms, so a cut
    // comes within a quarter second of when it is due: early is told from on time.
    let w = one_route(
        "send-timeout",
        &["--send-timeout", "1s", "--header-read-timeout", "1s"],
    )
    .await?;
    let p = &w.p;
    const SIZE: usize = 64 << 20;
    let mut c = tokio::net::TcpStream::connect(p.addr).await?;
    let client = c.local_addr()?;
    c.write_all(format!("GET /?bytes={SIZE} HTTP/1.1\r\nHost: a.test\r\n\r\n").as_bytes())
        .await?;
    let asked = std::time::Instant::now();
    // The client reads nothing: the socket buffers fill within milliseconds and the
    // proxy's writes block. Its side of the connection leaves ESTABLISHED when it closes
    // (the kernel holds the unsent bytes and the FIN behind them), seen in /proc/net/tcp.
    let took = wait::until(
        "the proxy to close the connection of a client that reads nothing",
        Duration::from_secs(15),
        || async {
            let open = established(p.addr, client).map_err(|e| e.to_string())?;
            Ok((!open).then(|| asked.elapsed()))
        },
    )
    .await?;
    eprintln!("the proxy closed the connection {took:?} after the request");
    assert!(
        took >= Duration::from_millis(900),
        "closed after {took:?}, before the send timeout"
    );
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(T, c.read(&mut buf)).await? {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    assert!(
        total < SIZE,
        "the whole {SIZE}-byte response arrived: the proxy waited for the reader"
    );

    // Over HTTP/2 the socket never blocks: the client stalls the stream by granting no
    // flow-control window (SETTINGS_INITIAL_WINDOW_SIZE 0, no WINDOW_UPDATE).
    let mut h2 = h2_connect(p.addr).await?;
    h2.write_all(&h2_frame(h2raw::SETTINGS, 0, 0, &[0, 0x4, 0, 0, 0, 0]))
        .await?;
    h2.write_all(&h2_frame(
        h2raw::HEADERS,
        0x5,
        1,
        &h2_get("a.test", "/?bytes=100000"),
    ))
    .await?;
    let took = closed_within(&mut h2, Duration::from_secs(15)).await?;
    assert!(
        took >= Duration::from_millis(900),
        "closed after {took:?}, before the send timeout"
    );
    Ok(())
}

/// Whether the TCP connection from `local` to `remote` is ESTABLISHED on `local`'s side
/// (its line in /proc/net/tcp; a connection that is gone is not).
fn established(local: SocketAddr, remote: SocketAddr) -> anyhow::Result<bool> {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => Ok(format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        )),
        SocketAddr::V6(_) => anyhow::bail!("IPv4 only: {a}"),
    };
    let (local, remote) = (hex(local)?, hex(remote)?);
    let tcp = std::fs::read_to_string("/proc/net/tcp")?;
    Ok(tcp.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // local address, remote address, state (01: ESTABLISHED)
        f.len() > 3 && f[1] == local && f[2] == remote && f[3] == "01"
    }))
}

/// Past --max-connections, new connections are closed at once and counted; the open
/// ones keep working.
#[tokio::test]
async fn connections_past_the_limit_are_closed_and_counted() -> anyhow::Result<()> {
    let w = one_route("max-connections", &["--max-connections", "2"]).await?;
    let p = &w.p;
    let request = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
    // One upgraded tunnel (it counts while it is open) and one keep-alive connection.
    let mut ws = tokio::net::TcpStream::connect(p.addr).await?;
    ws.write_all(
        b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(T, ws.read(&mut buf)).await??;
    assert!(buf[..n].starts_with(b"HTTP/1.1 101"));
    let mut open = Vec::new();
    let mut c = tokio::net::TcpStream::connect(p.addr).await?;
    c.write_all(request).await?;
    assert!(read_response(&mut c).await?.starts_with("HTTP/1.1 200"));
    open.push(c);
    let mut third = tokio::net::TcpStream::connect(p.addr).await?;
    let _ = third.write_all(request).await;
    closed_within(&mut third, Duration::from_secs(5)).await?;
    assert!(
        p.metric_value("holdfast_proxy_connections_refused_total")
            .await?
            >= 1.0
    );
    for c in &mut open {
        c.write_all(request).await?;
        assert!(read_response(c).await?.starts_with("HTTP/1.1 200"));
    }
    ws.write_all(b"still open").await?;
    let mut got = [0u8; 10];
    tokio::time::timeout(T, ws.read_exact(&mut got)).await??;
    drop(open);
    drop(ws);
    wait::until("a new connection to be served", T, || async {
        Ok((p.get("a.test", "/").await.map_err(|e| e.to_string())?.0 == 200).then_some(()))
    })
    .await?;
    Ok(())
}

/// The admin listener bounds its clients: a head that never completes is cut after its
/// header timeout, and past its connection cap new connections are closed at once while
/// the probes keep answering once a slot is free.
#[tokio::test]
async fn the_admin_listener_cuts_slow_heads_and_caps_connections() -> anyhow::Result<()> {
    let w = one_route("admin-limits", &[]).await?;
    let p = &w.p;
    let mut slow = tokio::net::TcpStream::connect(p.admin).await?;
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHo").await?;
    closed_within(&mut slow, Duration::from_secs(15)).await?;
    // So is one that sends nothing at all, after the sniff timeout (1 s), well before
    // the header read timeout.
    let mut silent = tokio::net::TcpStream::connect(p.admin).await?;
    let took = closed_within(&mut silent, Duration::from_secs(15)).await?;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "closed after {took:?}"
    );

    // Eight connections from one address that have begun a head hold that address's
    // slots: its ninth is closed at once, while another address is still served.
    let from = |last: u8| async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(([127, 0, 0, last], 0).into())?;
        let mut s = socket.connect(p.admin).await?;
        s.write_all(b"G").await?;
        anyhow::Ok(s)
    };
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(from(3).await?);
    }
    let mut ninth = from(3).await?;
    let took = closed_within(&mut ninth, Duration::from_secs(15)).await?;
    assert!(took < Duration::from_secs(1), "closed after {took:?}");
    assert_eq!(p.admin_get("/healthz").await?.0, 200, "from 127.0.0.1");
    drop(idle);
    wait::until("/healthz again", T, || async {
        Ok((p.admin_get("/healthz").await.map_err(|e| e.to_string())?.0 == 200).then_some(()))
    })
    .await?;
    Ok(())
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()?;
        anyhow::ensure!(status.success(), "mount tmpfs: {status}");
        Ok(Tmpfs { dir })
    }

    /// Fills the file system with `filler` until a write fails (ENOSPC).
    fn fill(&self, filler: &std::path::Path) -> anyhow::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(filler)?;
        let block = vec![0u8; 4096];
        while f.write_all(&block).and_then(|_| f.sync_all()).is_ok() {}
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Invariant 6 with a full disk: the proxy serves the new snapshot but ACKs it with the
/// write error (the control plane shows it), counts it, stays ready, and persists the
/// snapshot (and says so) once space returns.
#[tokio::test]
async fn a_full_disk_is_reported_in_the_ack_while_the_new_snapshot_serves_and_recovers()
-> anyhow::Result<()> {
    let (_, logs) = dirs("disk-full");
    let fs = Tmpfs::mount("256k")?;
    let state = fs.dir.path().join("state");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let first = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(first.clone());
    let p = ProxyProc::start("proxy-disk-full", &[cp.url()], &state, &logs, &[])?;
    wait_version(&p, &first.version).await?;
    assert_eq!(
        p.metric("holdfast_proxy_snapshot_persisted").await?,
        Some(1.0)
    );

    let filler = fs.dir.path().join("filler");
    fs.fill(&filler)?;
    let second = snapshot(2, &[("b.test", "/", "web")], &[("web", &[a])]);
    cp.push(second.clone());
    wait_version(&p, &second.version).await?;
    assert_eq!(
        p.get("b.test", "/").await?.0,
        200,
        "the new snapshot serves"
    );
    assert_eq!(
        p.admin_get("/readyz").await?.0,
        200,
        "readiness is unaffected"
    );
    assert_eq!(
        p.metric("holdfast_proxy_snapshot_persisted").await?,
        Some(0.0)
    );
    assert!(
        p.metric_value("holdfast_proxy_persist_failures_total")
            .await?
            >= 1.0
    );
    let ack = wait::until("an ACK of version 2 with the write error", T, || async {
        Ok(cp
            .requests()
            .into_iter()
            .find(|r| r.version_info == second.version && !r.persist_error.is_empty()))
    })
    .await?;
    assert!(ack.error_detail.is_none(), "an ACK, not a NACK");

    std::fs::remove_file(&filler)?;
    wait::until("the snapshot persisted after space returned", T, || async {
        let gauge = p
            .metric("holdfast_proxy_snapshot_persisted")
            .await
            .map_err(|e| e.to_string())?;
        Ok((gauge == Some(1.0)).then_some(()))
    })
    .await?;
    wait::until("a repeated ACK without the error", T, || async {
        Ok(cp
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.response_nonce == ack.response_nonce && r.persist_error.is_empty()))
    })
    .await?;
    // It survives a restart with no control plane.
    drop(cp);
    let mut p = p;
    p.proc.kill();
    p.restart()?;
    wait_version(&p, &second.version).await?;
    assert_eq!(p.get("b.test", "/").await?.0, 200);
    Ok(())
}

/// A rolling restart of two proxies behind a TCP round-robin balancer that health-checks
/// /readyz, under keep-alive traffic: not one request fails. (SIGTERM fails /readyz at
/// once, the listener keeps accepting for --drain-delay while keep-alive clients are sent
/// `Connection: close`, then in-flight requests finish.)
// Multi-threaded: the traffic and the balancer run while the test waits (blocking) for
// processes to exit and restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_behind_a_balancer_loses_no_request() -> anyhow::Result<()> {
    let (_, logs) = dirs("rolling");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(s.clone());
    let args = ["--drain-delay", "1s", "--shutdown-grace", "5s"];
    let (state_1, state_2) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mut proxies = vec![
        ProxyProc::start("proxy-roll-1", &[cp.url()], state_1.path(), &logs, &args)?,
        ProxyProc::start("proxy-roll-2", &[cp.url()], state_2.path(), &logs, &args)?,
    ];
    for p in &proxies {
        wait_version(p, &s.version).await?;
    }
    let lb = holdfast_tests::balancer::Balancer::start(
        proxies.iter().map(|p| (p.addr, p.admin)).collect(),
    )
    .await?;
    wait::until("both proxies in the balancer", T, || async {
        Ok((lb.ready() == [true, true]).then_some(()))
    })
    .await?;

    // Four keep-alive clients, 50 requests a second each.
    let traffic = holdfast_tests::traffic::Traffic::start(
        &[lb.addr, lb.addr, lb.addr, lb.addr],
        vec!["a.test".into()],
        50,
    );
    for p in &mut proxies {
        p.proc.signal("TERM")?;
        let status = p.proc.wait_exit(T)?;
        assert!(status.success(), "{status}");
        p.restart()?;
        p.wait_ready(T).await?;
        wait::until("the restarted proxy back in the balancer", T, || async {
            Ok((lb.ready() == [true, true]).then_some(()))
        })
        .await?;
    }
    let report = traffic.stop().await?;
    eprintln!("{}", report.summary());
    assert!(
        report.total >= 200,
        "too little traffic: {}",
        report.summary()
    );
    assert!(
        report.unexpected.is_empty(),
        "requests failed: {:?}",
        report.unexpected
    );
    Ok(())
}

/// A snapshot over the proxy's own --max-snapshot-bytes is NACKed; the last one serves.
#[tokio::test]
async fn a_snapshot_over_the_proxys_size_limit_is_nacked() -> anyhow::Result<()> {
    let (state, logs) = dirs("nack-size");
    let a = echo_on_loopback("echo-a").await;
    let cp = FakeControlPlane::start(None).await?;
    let good = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(good.clone());
    let p = ProxyProc::start(
        "proxy-nack-size",
        &[cp.url()],
        state.path(),
        &logs,
        &["--max-snapshot-bytes", "2000"],
    )?;
    wait_version(&p, &good.version).await?;
    let hosts: Vec<String> = (0..100).map(|i| format!("host-{i}.test")).collect();
    let routes: Vec<(&str, &str, &str)> = hosts.iter().map(|h| (h.as_str(), "/", "web")).collect();
    let big = snapshot(2, &routes, &[("web", &[a])]);
    assert!(prost::Message::encoded_len(&big) > 2000);
    cp.push(big.clone());
    let nack = wait::until("a NACK", T, || async {
        Ok(cp.requests().into_iter().find(|r| r.error_detail.is_some()))
    })
    .await?;
    let reason = nack.error_detail.unwrap().message;
    assert!(reason.contains("--max-snapshot-bytes"), "{reason}");
    assert_eq!(nack.version_info, good.version);
    assert_eq!(p.get("a.test", "/").await?.0, 200);
    assert_eq!(p.get("host-1.test", "/").await?.0, 404);
    Ok(())
}

/// Writes `frames` on a new h2c connection until the proxy stops reading or closes; the
/// bytes written.
async fn flood(addr: SocketAddr, frames: impl Iterator<Item = Vec<u8>>) -> anyhow::Result<usize> {
    Ok(h2raw::flood(h2_connect(addr).await?, frames).await?.written)
}

/// HTTP/2 abuse (rapid reset, a CONTINUATION flood, a PING flood, an oversized header
/// list) on their own connections: each is cut or absorbed, and a legitimate client keeps
/// getting answers quickly meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_abuse_is_cut_off_and_legitimate_clients_keep_being_served() -> anyhow::Result<()> {
    let w = one_route("h2-abuse", &[]).await?;
    let addr = w.p.addr;
    let get = h2_get("a.test", "/");
    // Rapid reset: a request and its RST_STREAM, over and over (CVE-2023-44487).
    let rapid = (0..20_000u32).flat_map({
        let get = get.clone();
        move |i| {
            let id = 2 * i + 1;
            [
                h2_frame(0x1, 0x5, id, &get),
                h2_frame(0x3, 0, id, &8u32.to_be_bytes()),
            ]
        }
    });
    // CONTINUATION flood: one header block that never ends (CVE-2024-27316 and kin).
    let block = std::iter::once(h2_frame(0x1, 0x1, 1, &get)).chain(
        std::iter::repeat_with(|| {
            h2_frame(
                0x9,
                0,
                1,
                &[
                    0x40, 3, b'x', b'-', b'a', 10, b'0', b'1', b'2', b'3', b'4', b'5', b'6', b'7',
                    b'8', b'9',
                ],
            )
        })
        .take(50_000),
    );
    let pings = (0..50_000u64).map(|i| h2_frame(0x6, 0, 0, &i.to_be_bytes()));
    // One header list of 1 MiB (well over the 64 KiB limit), in 16 KiB frames.
    let mut huge = get.clone();
    for i in 0..64 {
        huge.extend_from_slice(&[0x40, 5]);
        huge.extend_from_slice(format!("x-{i:03}").as_bytes());
        huge.extend_from_slice(&[0x7f, 0x81, 0x7f]); // length 127 + 16257 = 16384
        huge.extend(std::iter::repeat_n(b'v', 16384));
    }
    let chunks: Vec<Vec<u8>> = huge.chunks(16384).map(<[u8]>::to_vec).collect();
    let last = chunks.len() - 1;
    let oversized: Vec<Vec<u8>> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let end = if i == last { 0x4 } else { 0 };
            if i == 0 {
                h2_frame(0x1, 0x1 | end, 1, c)
            } else {
                h2_frame(0x9, end, 1, c)
            }
        })
        .collect();

    let rapid_total = 20_000 * (2 * 9 + get.len() + 4);
    let block_total = 9 + get.len() + 50_000 * (9 + 16);
    let attacks = tokio::spawn(async move {
        let (a, b, c, d) = tokio::join!(
            flood(addr, rapid),
            flood(addr, block),
            flood(addr, pings),
            flood(addr, oversized.into_iter()),
        );
        (a, b, c, d)
    });
    // A legitimate client meanwhile: every request answered, none slowly.
    let started = std::time::Instant::now();
    let mut served = 0;
    while !attacks.is_finished() && started.elapsed() < Duration::from_secs(60) {
        let t = std::time::Instant::now();
        let (code, _) = w.p.get("a.test", "/").await?;
        assert_eq!(code, 200);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a legitimate request took {:?} under attack",
            t.elapsed()
        );
        served += 1;
    }
    let (a, b, c, d) = attacks.await?;
    let (rapid, block, pings, oversized) = (a?, b?, c?, d?);
    eprintln!(
        "legitimate requests served: {served}; bytes written before the proxy stopped reading: rapid reset {rapid}, CONTINUATION {block}, PING {pings}, oversized {oversized}"
    );
    assert!(served > 0);
    // The rapid-reset and CONTINUATION floods were cut short, not absorbed: well under
    // what they would have written in full.
    assert!(
        rapid < rapid_total / 2,
        "rapid reset ran on: {rapid} of {rapid_total} bytes"
    );
    assert!(
        block < block_total / 2,
        "the CONTINUATION flood ran on: {block} of {block_total} bytes"
    );
    assert_eq!(w.p.get("a.test", "/").await?.0, 200);
    Ok(())
}

/// --max-upstream-connections-per-endpoint: past the cap, a request waits for a slot up
/// to the connect timeout, then gets 503 (counted); the held request is unaffected.
#[tokio::test]
async fn requests_past_the_per_endpoint_cap_wait_then_get_503() -> anyhow::Result<()> {
    let (state, logs) = dirs("endpoint-cap");
    let (upstream, arrived, release) = gated_upstream().await;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[upstream])]);
    cp.push(s.clone());
    let p = ProxyProc::start(
        "proxy-endpoint-cap",
        &[cp.url()],
        state.path(),
        &logs,
        &[
            "--max-upstream-connections-per-endpoint",
            "1",
            "--upstream-connect-timeout",
            "500ms",
        ],
    )?;
    wait_version(&p, &s.version).await?;
    let addr = p.addr;
    let held = tokio::spawn(async move { holdfast_tests::http::get(addr, "a.test", "/").await });
    tokio::time::timeout(T, arrived).await??;
    let started = std::time::Instant::now();
    let (code, _) = p.get("a.test", "/").await?;
    assert_eq!(code, 503, "the endpoint's only slot is taken");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "it waited for a slot"
    );
    assert_eq!(
        p.metric("holdfast_proxy_upstream_queue_timeouts_total")
            .await?,
        Some(1.0)
    );
    release
        .send(())
        .map_err(|_| anyhow::anyhow!("upstream gone"))?;
    assert_eq!(held.await??.0, 200);
    Ok(())
}

/// User plus system CPU time of process `pid`, from /proc.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // USER_HZ is 100 on Linux.
    Ok(Duration::from_millis(ticks * 10))
}

/// Out of file descriptors (EMFILE), the proxy's accept loops (client and admin
/// listeners) back off instead of spinning, count the failures, and serve again once
/// descriptors free up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_accept_loops_back_off_and_recover() -> anyhow::Result<()> {
    let w = one_route("emfile", &[]).await?;
    let pid = w.p.proc.pid().expect("running");
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=64:64"])
        .status()?;
    anyhow::ensure!(status.success(), "prlimit: {status}");
    // More connections than the proxy has descriptors left, on its client listener and
    // on its admin listener: the rest wait in the backlogs while every accept fails with
    // EMFILE. Either accept loop spinning would show in the CPU time.
    let mut held = Vec::new();
    for _ in 0..96 {
        held.push(tokio::net::TcpStream::connect(w.p.addr).await?);
        held.push(tokio::net::TcpStream::connect(w.p.admin).await?);
    }
    let before = cpu_time(pid)?;
    // The behaviour under test: 2 s of failing accepts (not synchronisation).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_time(pid)?.saturating_sub(before);
    assert!(
        used < Duration::from_millis(800),
        "the proxy used {used:?} of CPU in 2 s of EMFILE: its accept loop spins"
    );
    drop(held);
    wait::until("the admin listener to answer again", T, || async {
        Ok(w.p
            .admin_get("/healthz")
            .await
            .ok()
            .filter(|(code, _)| *code == 200)
            .map(|_| ()))
    })
    .await?;
    wait::until("the proxy to serve again", T, || async {
        Ok(w.p
            .get("a.test", "/")
            .await
            .ok()
            .filter(|(code, _)| *code == 200)
            .map(|_| ()))
    })
    .await?;
    assert!(
        w.p.metric_value("holdfast_proxy_accept_errors_total")
            .await?
            >= 1.0
    );
    Ok(())
}

/// The soft RLIMIT_NOFILE of process `pid`.
fn nofile(pid: u32) -> anyhow::Result<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .ok_or_else(|| anyhow::anyhow!("no open-files limit in {limits}"))?;
    let soft = line.split_whitespace().nth(3).unwrap_or_default();
    Ok(soft.parse()?)
}

/// Sets the soft RLIMIT_NOFILE of process `pid` (the hard limit stays).
fn set_nofile(pid: u32, soft: u64) -> anyhow::Result<()> {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:")])
        .status()?;
    anyhow::ensure!(status.success(), "prlimit: {status}");
    Ok(())
}

/// A connect that fails for a local reason (EMFILE: the proxy is out of descriptors) is
/// retried on another endpoint and does not eject the endpoint it was for, which is
/// healthy: once descriptors are back, that endpoint serves again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_connect_error_does_not_eject_a_healthy_endpoint() -> anyhow::Result<()> {
    let (state, logs) = dirs("local-error");
    let a = echo_on_loopback("echo-a").await;
    let b = echo_on_loopback("echo-b").await;
    let cp = FakeControlPlane::start(None).await?;
    let only_b = snapshot(1, &[("a.test", "/", "web")], &[("web", &[b])]);
    cp.push(only_b.clone());
    let p = ProxyProc::start(
        "proxy-local-error",
        &[cp.url()],
        state.path(),
        &logs,
        &["--eject-for", "60s"],
    )?;
    wait_version(&p, &only_b.version).await?;
    // One client connection, kept alive, so that serving it needs no new descriptor;
    // its first request leaves a connection to B in the proxy's pool.
    let stream = tokio::net::TcpStream::connect(p.addr).await?;
    let (mut client, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut get = async || -> anyhow::Result<(u16, String)> {
        let req = http::Request::get("/")
            .header(http::header::HOST, "a.test")
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        // The previous exchange may still be finishing on the connection.
        tokio::time::timeout(T, client.ready()).await??;
        let resp = tokio::time::timeout(T, client.send_request(req)).await??;
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).trim().to_owned()))
    };
    assert_eq!(get().await?, (200, "echo-b".to_owned()));
    let both = snapshot(2, &[("a.test", "/", "web")], &[("web", &[a, b])]);
    cp.push(both.clone());
    wait_version(&p, &both.version).await?;
    let errors_before = p
        .metric_value("holdfast_proxy_upstream_connect_errors_total")
        .await?;

    // No descriptor left: every new socket fails with EMFILE.
    // The limit is on descriptor numbers and the proxy fills the lowest free one, so
    // wait for it to close its side of the admin connections first (which would leave a
    // free number below the limit).
    let admin_port = format!(":{:04X} ", p.admin.port());
    wait::until("the admin connections to close", T, || async {
        let tcp = std::fs::read_to_string("/proc/net/tcp").map_err(|e| e.to_string())?;
        let open = tcp.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local address, state: ESTABLISHED (01) or CLOSE_WAIT (08)
            f.len() > 3
                && format!("{} ", f[1]).ends_with(&admin_port)
                && (f[3] == "01" || f[3] == "08")
        });
        Ok((!open).then_some(()))
    })
    .await?;
    let pid = p.proc.pid().expect("running");
    let lowest_free = (0u64..)
        .find(|fd| !std::path::Path::new(&format!("/proc/{pid}/fd/{fd}")).exists())
        .expect("a free descriptor number");
    let limit = nofile(pid)?;
    set_nofile(pid, lowest_free)?;
    // Round robin sends one of these to A: its connect fails here, and the request is
    // retried on B's pooled connection.
    let under_limit = [get().await, get().await];
    set_nofile(pid, limit)?;
    for answer in under_limit {
        assert_eq!(answer?, (200, "echo-b".to_owned()));
    }
    let errors = p
        .metric_value("holdfast_proxy_upstream_connect_errors_total")
        .await?;
    assert!(
        errors > errors_before,
        "no connect failed under the limit ({errors_before} -> {errors})"
    );
    // A was not ejected (for 60 s it would be skipped): round robin reaches it again.
    let mut served_by = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let (status, by) = get().await?;
        assert_eq!(status, 200);
        served_by.insert(by);
    }
    assert!(served_by.contains("echo-a"), "A was ejected: {served_by:?}");
    Ok(())
}

/// A delta is applied only when base + delta is exactly the snapshot it names: a
/// corrupted one is NACKed with the reason and the proxy keeps serving, and a complete
/// snapshot (the control plane's answer to that NACK) heals it, with no failed request
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_delta_is_nacked_and_a_complete_snapshot_heals_with_no_failed_request()
-> anyhow::Result<()> {
    use holdfast_proto::delta;
    let (state, logs) = dirs("delta-corrupt");
    let a = echo_on_loopback("echo-a").await;
    let b = echo_on_loopback("echo-b").await;
    let cp = FakeControlPlane::start(None).await?;
    let v1 = snapshot(1, &[("a.test", "/", "web")], &[("web", &[a])]);
    cp.push(v1.clone());
    let p = ProxyProc::start("proxy-delta", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &v1.version).await?;
    let first = cp.requests().into_iter().next().expect("the first request");
    assert!(first.accepts_deltas);
    assert!(
        first.inventory.is_empty(),
        "a proxy that held nothing at start states no inventory"
    );

    // Traffic for a.test all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = tokio::spawn({
        let (addr, stop) = (p.addr, stop.clone());
        async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            for _ in 0..100_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                match holdfast_tests::http::get(addr, "a.test", "/").await {
                    Ok((200, _)) => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
            }
            (ok, failed)
        }
    });

    // A valid delta: b.test appears.
    let v2 = snapshot(
        2,
        &[("a.test", "/", "web"), ("b.test", "/", "other")],
        &[("web", &[a]), ("other", &[b])],
    );
    cp.push_delta(delta::diff(&v1.version, &delta::inventory(&v1), &v2));
    wait_version(&p, &v2.version).await?;
    assert_eq!(p.get("b.test", "/").await?, (200, "echo-b\n".to_owned()));
    assert_eq!(
        p.metric("holdfast_proxy_deltas_received_total").await?,
        Some(1.0)
    );

    // A corrupted delta: b.test's route changed, but the stated hash is v3's.
    let v3 = snapshot(
        3,
        &[("a.test", "/", "web"), ("b.test", "/", "web")],
        &[("web", &[a]), ("other", &[b])],
    );
    let mut corrupted = delta::diff(&v2.version, &delta::inventory(&v2), &v3);
    corrupted.upserted_virtual_hosts[0].routes[0].backend = "other".into();
    cp.push_delta(corrupted);
    let nack = wait::until("the NACK of the corrupted delta", T, || async {
        Ok(cp.requests().into_iter().find(|r| r.error_detail.is_some()))
    })
    .await?;
    let reason = nack.error_detail.unwrap().message;
    assert!(reason.contains("content hash"), "{reason}");
    assert_eq!(nack.version_info, v2.version, "still serving v2");
    assert_eq!(p.get("b.test", "/").await?.1, "echo-b\n");

    // The complete snapshot heals it.
    cp.push(v3.clone());
    wait_version(&p, &v3.version).await?;
    assert_eq!(p.get("b.test", "/").await?.1, "echo-a\n");

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = traffic.await?;
    assert!(ok > 0);
    assert!(
        failed.is_empty(),
        "{} failed requests: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    Ok(())
}

/// The last ACKed version the fake control plane `cp` has seen, waiting for `version`.
async fn wait_acked(cp: &FakeControlPlane, version: &str) -> anyhow::Result<()> {
    wait::until(&format!("the ACK of {version}"), T, || async {
        Ok(cp
            .requests()
            .iter()
            .any(|r| {
                r.version_info == version
                    && r.error_detail.is_none()
                    && !r.response_nonce.is_empty()
            })
            .then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_while_writing_deltas_every_restart_serves_a_verified_snapshot_no_older_than_the_last_acked()
-> anyhow::Result<()> {
    use holdfast_proto::delta::{diff, inventory};
    let (state, logs) = dirs("delta-crash");
    let a = echo_on_loopback("echo-a").await;
    // Ten hosts; revision r moves host r % 10 to path /v<r>. One delta is about a tenth
    // of the state file, so the log outgrows it every few deltas and compactions run
    // while the proxy is being killed.
    let build = |rev: u64| {
        let routes: Vec<(String, String)> = (0..10u64)
            .map(|i| {
                let path = if rev % 10 == i {
                    format!("/v{rev}")
                } else {
                    "/".into()
                };
                (format!("h{i}.test"), path)
            })
            .collect();
        let routes: Vec<(&str, &str, &str)> = routes
            .iter()
            .map(|(h, p)| (h.as_str(), p.as_str(), "web"))
            .collect();
        snapshot(rev, &routes, &[("web", &[a])])
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    eprintln!("kill points from seed {seed}");
    let mut rng = seed;
    let mut next_random = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };

    let mut cp = FakeControlPlane::start(None).await?;
    let addr = cp.addr();
    let mut current = build(1);
    cp.push(current.clone());
    let mut p = ProxyProc::start("proxy-crash", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &current.version).await?;
    let (mut rev, mut newer) = (1u64, 0);
    for round in 0..25 {
        // Some deltas, each ACKed (so persisted) ...
        for _ in 0..1 + next_random(5) {
            rev += 1;
            let next = build(rev);
            cp.push_delta(diff(&current.version, &inventory(&current), &next));
            wait_acked(&cp, &next.version).await?;
            current = next;
        }
        // ... then one more, and SIGKILL at a random moment of its apply, append, sync or
        // a compaction (the pause picks the fault point; nothing waits on it).
        rev += 1;
        let in_flight = build(rev);
        cp.push_delta(diff(&current.version, &inventory(&current), &in_flight));
        tokio::time::sleep(Duration::from_micros(next_random(1_500))).await;
        p.proc.kill();

        // Restarted with no control plane: it serves the last ACKed snapshot or the one
        // in flight, verified, at once.
        drop(cp);
        p.restart()?;
        p.wait_ready(T).await?;
        let (_, body) = p.admin_get("/debug/snapshot").await?;
        let served: serde_json::Value = serde_json::from_str(&body)?;
        let served = served["version"].as_str().unwrap_or_default().to_owned();
        assert!(
            served == current.version || served == in_flight.version,
            "round {round}: serving {served}; last ACKed {}, in flight {} (seed {seed})",
            current.version,
            in_flight.version
        );
        if served == in_flight.version {
            current = in_flight;
            newer += 1;
        }
        let moved = format!("h{}.test", rev % 10);
        let path = if current.version.starts_with(&format!("{rev}-")) {
            format!("/v{rev}")
        } else {
            "/".into()
        };
        assert_eq!(p.get(&moved, &path).await?.0, 200, "round {round}");

        // The control plane comes back; the proxy states what it serves, and the next
        // deltas apply to it.
        cp = FakeControlPlane::start(Some(addr)).await?;
        let first = wait::until("the proxy to reconnect", T, || async {
            Ok(cp.requests().into_iter().next())
        })
        .await?;
        assert_eq!(first.version_info, current.version, "round {round}");
        assert!(!first.inventory.is_empty());
    }
    eprintln!("{newer} of 25 restarts served the delta in flight");

    // Compactions ran all along (every few deltas); the last process shows one too.
    for _ in 0..8 {
        rev += 1;
        let next = build(rev);
        cp.push_delta(diff(&current.version, &inventory(&current), &next));
        wait_acked(&cp, &next.version).await?;
        current = next;
    }
    wait::until("a compaction", T, || async {
        let n = p
            .metric_value("holdfast_proxy_state_compactions_total")
            .await
            .map_err(|e| e.to_string())?;
        Ok((n >= 1.0).then_some(()))
    })
    .await?;
    p.proc.kill();
    p.restart()?;
    p.wait_ready(T).await?;
    p.wait_version(&current.version, T).await?;
    Ok(())
}

/// The request shapes a pipelined sequence is made of: valid ones (a GET, a body by
/// length, a chunked body with trailers, an upgrade the proxy does not pass, so it goes
/// on as HTTP/1.1) and each framing shape the proxy refuses (both lengths, a bare-LF head,
/// chunked trailers ended by a bare LF, a Connection that is not ASCII).
const SHAPES: [&[u8]; 8] = [
    b"GET /g HTTP/1.1\r\nHost: a.test\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /c HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n",
    b"GET /u HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n",
    b"POST /b HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /lf HTTP/1.1\nHost: a.test\n\n",
    b"POST /t HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx-t: 1\n\r\n",
    b"GET /n HTTP/1.1\r\nHost: a.test\r\nUpgrade: foo\r\nConnection: up\xc3grade\r\n\r\n",
];

/// One answer: its status and the path the echo backend saw ("" for the proxy's own).
type Answer = (u16, String);

/// Reads one HTTP/1.1 response from `s` (`buf` keeps what was read past it): the answer
/// and whether it says `Connection: close`; None at EOF.
async fn next_response(
    s: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Option<(Answer, bool)>> {
    async fn fill(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> anyhow::Result<bool> {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(T, s.read(&mut chunk)).await??;
        buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !fill(s, buf).await? {
            anyhow::ensure!(buf.is_empty(), "EOF inside a response head: {buf:?}");
            return Ok(None);
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head}"))?;
    let close = head.lines().any(|l| l == "connection: close");
    let length: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    anyhow::ensure!(
        header(&head, "transfer-encoding").is_none(),
        "a chunked response: {head}"
    );
    while buf.len() < end + length {
        anyhow::ensure!(fill(s, buf).await?, "EOF inside a response body");
    }
    buf.drain(..end + length);
    let path = header(&head, "x-echo-path").unwrap_or_default().to_owned();
    Ok(Some(((status, path), close)))
}

/// The answers to `requests` sent one at a time, each after the previous answer, until
/// the proxy closes the connection.
async fn answers_one_by_one(addr: SocketAddr, requests: &[&[u8]]) -> anyhow::Result<Vec<Answer>> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for r in requests {
        if s.write_all(r).await.is_err() {
            break;
        }
        match next_response(&mut s, &mut buf).await? {
            Some((answer, close)) => {
                out.push(answer);
                if close {
                    break;
                }
            }
            None => break,
        }
    }
    Ok(out)
}

/// The answers to `requests` pipelined: all their bytes written at once, cut
/// into writes at `cuts` (offsets into the whole), then every answer read.
async fn answers_pipelined(
    addr: SocketAddr,
    requests: &[&[u8]],
    cuts: &[usize],
) -> anyhow::Result<Vec<Answer>> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let all: Vec<u8> = requests.concat();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (all.len() + 1)).collect();
    cuts.push(0);
    cuts.push(all.len());
    cuts.sort_unstable();
    cuts.dedup();
    for pair in cuts.windows(2) {
        // The proxy may close after a 400 before the rest is written.
        if s.write_all(&all[pair[0]..pair[1]]).await.is_err() {
            break;
        }
        s.flush().await?;
    }
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while out.len() < requests.len() {
        match next_response(&mut s, &mut buf).await {
            Ok(Some((answer, close))) => {
                out.push(answer);
                if close {
                    break;
                }
            }
            // EOF, or a reset after the proxy closed with our bytes unread.
            Ok(None) | Err(_) => break,
        }
    }
    Ok(out)
}

/// HTTP/2 is counted in --max-connections too: a connection takes a slot, its receive
/// window two more (at the default --max-header-bytes) with its first stream, and each
/// stream in flight one; past four streams a connection leaves an eighth of the slots to
/// others. With 8 slots, four slow streams take the connection's share: a fifth stream is
/// answered 503 (`overloaded`) at once, while a new connection still gets the reserved
/// slot and is served, and the one after it is closed at once. Once the slow streams end,
/// the connection's streams are served again.
#[tokio::test]
async fn http2_streams_and_receive_windows_take_connection_slots() -> anyhow::Result<()> {
    let w = one_route("h2-slots", &["--max-connections", "8"]).await?;
    let p = &w.p;
    let stream = tokio::net::TcpStream::connect(p.addr).await?;
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await?;
    tokio::spawn(conn);
    let get =
        |uri: &str| http::Request::get(uri).body(http_body_util::Empty::<bytes::Bytes>::new());
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let mut sender = sender.clone();
            let req = get("http://a.test/slow?delay_ms=6000");
            tokio::spawn(async move { anyhow::Ok(sender.send_request(req?).await?.status()) })
        })
        .collect();
    let overloaded = || async {
        p.metric(r#"holdfast_proxy_error_responses_total{reason="overloaded",status="503"}"#)
            .await
    };
    assert_eq!(overloaded().await?, None, "no stream was refused yet");
    // Once the four hold their slots, a fifth stream is refused (before that it may pass).
    wait::until("a fifth stream to be answered 503", T, || async {
        let mut sender = sender.clone();
        let req = get("http://a.test/fast").map_err(|e| e.to_string())?;
        let status = sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?
            .status();
        Ok((status == 503).then_some(()))
    })
    .await?;
    assert!(
        overloaded().await?.is_some_and(|n| n >= 1.0),
        "the 503 is counted as overloaded"
    );
    assert!(
        slow.iter().all(|t| !t.is_finished()),
        "the slow streams were still in flight"
    );
    // The reserve: another client's connection gets in and is served...
    let mut other = tokio::net::TcpStream::connect(p.addr).await?;
    other
        .write_all(b"GET /other HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(T, other.read(&mut buf)).await??;
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // ...and, with every slot taken, the next one is closed at once.
    let mut extra = tokio::net::TcpStream::connect(p.addr).await?;
    let took = closed_within(&mut extra, Duration::from_secs(15)).await?;
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
    drop(other);
    for t in slow {
        assert_eq!(t.await??, 200);
    }
    let mut sender = sender.clone();
    assert_eq!(
        sender
            .send_request(get("http://a.test/after")?)
            .await?
            .status(),
        200
    );
    let (code, _) = holdfast_tests::http::get(p.addr, "a.test", "/after").await?;
    assert_eq!(code, 200, "a new connection is served again");
    Ok(())
}

/// One reading decides framing: for random sequences of valid and refused requests, sent
/// pipelined in random writes, the proxy answers exactly what it answers when each is sent
/// after the previous answer (a refused one gets 400 and closes the connection, and no
/// request after it is served; none is answered for another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_in_any_split_get_the_answers_they_get_one_by_one() -> anyhow::Result<()>
{
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};

    let w = one_route("pipelining", &[]).await?;
    let addr = w.p.addr;
    // Every shape alone, one by one, as a baseline: valid ones 200 from the backend with
    // their own path, refused ones the proxy's 400.
    let paths = ["/g", "/p", "/c", "/u"];
    for (i, shape) in SHAPES.iter().enumerate() {
        let got = answers_one_by_one(addr, &[shape]).await?;
        let want = match paths.get(i) {
            Some(path) => (200, (*path).to_owned()),
            None => (400, String::new()),
        };
        assert_eq!(got, [want], "shape {i}");
    }
    let handle = tokio::runtime::Handle::current();
    let strategy = (
        proptest::collection::vec(0..SHAPES.len(), 1..6),
        proptest::collection::vec(any::<usize>(), 0..8),
    );
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let refused_seen = std::sync::atomic::AtomicUsize::new(0);
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |(sequence, cuts)| {
            let requests: Vec<&[u8]> = sequence.iter().map(|i| SHAPES[*i]).collect();
            let (one, piped) = handle
                .block_on(async {
                    anyhow::Ok((
                        answers_one_by_one(addr, &requests).await?,
                        answers_pipelined(addr, &requests, &cuts).await?,
                    ))
                })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            if one.iter().any(|(status, _)| *status == 400) {
                refused_seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            prop_assert_eq!(&piped, &one, "sequence {:?} cut at {:?}", sequence, cuts);
            Ok(())
        })
    });
    result.map_err(|e| anyhow::anyhow!("{e}"))?;
    let refused_seen = refused_seen.into_inner();
    assert!(
        refused_seen >= 16,
        "only {refused_seen} sequences had a refused request"
    );
    Ok(())
}

/// Resident and peak memory of a process (`VmRSS`, `VmHWM`), in bytes.
fn memory_of(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .ok_or_else(|| anyhow::anyhow!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Bytes the kernel holds unread for `port`'s accepted connections (their receive
/// queues in /proc/net/tcp), and how many such connections there are.
fn unread_on(port: u16) -> anyhow::Result<(u64, usize)> {
    let tcp = std::fs::read_to_string("/proc/net/tcp")?;
    let suffix = format!(":{port:04X}");
    let (mut unread, mut count) = (0, 0);
    for l in tcp.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        // local address, remote address, state (01: ESTABLISHED), tx_queue:rx_queue
        if f.len() > 4 && f[1].ends_with(&suffix) && f[3] == "01" {
            let rx = f[4].split(':').nth(1).unwrap_or("0");
            unread += u64::from_str_radix(rx, 16)?;
            count += 1;
        }
    }
    Ok((unread, count))
}

/// Connection memory is bounded by --connection-memory: with 32 MiB, the default
/// --max-connections lets in as many connections as it holds at their worst, each
/// holding a partial head of nearly --max-header-bytes; once the proxy has read every
/// byte of them its memory has grown by less than 32 MiB, and one connection more is
/// closed at once.
#[tokio::test]
async fn slow_heads_on_every_connection_allowed_stay_within_the_connection_memory()
-> anyhow::Result<()> {
    let budget: usize = 32 << 20;
    let budget_flag = budget.to_string();
    let w = one_route(
        "connection-memory",
        &["--connection-memory", &budget_flag, "--worker-threads", "1"],
    )
    .await?;
    let p = &w.p;
    let pid = p.proc.pid().ok_or_else(|| anyhow::anyhow!("no pid"))?;
    let allowed = budget / holdfast_data_plane::config::connection_bytes(65536);
    let (before, _) = memory_of(pid)?;
    let mut partial = b"GET / HTTP/1.1\r\nHost: a.test\r\nX-Pad: ".to_vec();
    partial.resize(65536 - 1024, b'a');
    let mut held = Vec::with_capacity(allowed);
    for _ in 0..allowed {
        let mut s = tokio::net::TcpStream::connect(p.addr).await?;
        s.write_all(&partial).await?;
        held.push(s);
    }
    // Every byte of every head is in the proxy, not in a kernel queue.
    wait::until("the proxy to read every partial head", T, || async {
        let (unread, count) = unread_on(p.addr.port()).map_err(|e| e.to_string())?;
        Ok((unread == 0 && count >= allowed).then_some(()))
    })
    .await?;
    let (_, peak) = memory_of(pid)?;
    let grown = peak.saturating_sub(before);
    assert!(
        grown < budget as u64,
        "{allowed} slow heads grew the proxy by {} MiB, over the {} MiB budget",
        grown >> 20,
        budget >> 20
    );
    let refused_before = p
        .metric_value("holdfast_proxy_connections_refused_total")
        .await?;
    let mut extra = tokio::net::TcpStream::connect(p.addr).await?;
    let took = closed_within(&mut extra, Duration::from_secs(15)).await?;
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
    assert_eq!(
        p.metric_value("holdfast_proxy_connections_refused_total")
            .await?,
        refused_before + 1.0
    );
    drop(held);
    Ok(())
}

/// An upstream on loopback that records the bytes of every request it is sent and
/// answers each with a small 200. A request ends after its head when it has no body,
/// after its Content-Length, or after a chunked body's last chunk and trailers.
async fn recording_upstream()
-> anyhow::Result<(SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut have = Vec::new();
                let mut buf = vec![0u8; 16384];
                loop {
                    // One whole request in `have`: its length.
                    let whole = |have: &[u8]| -> Option<usize> {
                        let end = have.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
                        let head = String::from_utf8_lossy(&have[..end]).to_lowercase();
                        if head.contains("transfer-encoding: chunked") {
                            let last = have[end..].windows(5).position(|w| w == b"0\r\n\r\n")?;
                            return Some(end + last + 5);
                        }
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        (have.len() >= end + length).then_some(end + length)
                    };
                    while let Some(n) = whole(&have) {
                        let request: Vec<u8> = have.drain(..n).collect();
                        let _ = tx.send(request);
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    Ok((addr, rx))
}

/// The next request the recording upstream got, within the test timeout.
async fn recorded(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) -> anyhow::Result<String> {
    let bytes = tokio::time::timeout(T, rx.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the upstream stopped recording"))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// What reaches the upstream of the request framings RFC 9112 allows and a proxy must
/// not pass on as they came: chunked trailers (dropped: an upstream that merges them into
/// the headers would see fields the proxy never checked), an absolute-form target (sent
/// in origin form with its query), an empty line before a request (skipped),
/// `Expect: 100-continue` (the client is told to go on), and Transfer-Encoding on
/// HTTP/1.0 (refused). Both HTTP/1.1 engines pass it.
/// An upstream that sends interim (1xx) heads without end, as fast as it can, is cut at
/// the response timeout: the deadline covers all the heads before the final one (each
/// read is its own wait, sharing that deadline: `timer::tests::waits_over_at_once_still_end_at_the_instant_they_share`).
#[tokio::test]
async fn an_upstream_sending_interim_heads_without_end_is_cut_at_the_response_timeout()
-> anyhow::Result<()> {
    // The hyper engine (kept for one release) answers 504 only after about 11 s with a
    // 1 s timeout: listed in docs/reference.md under --h1-engine, not run on it.
    if std::env::var("HOLDFAST_H1_ENGINE").is_ok_and(|e| e == "hyper") {
        eprintln!(
            "not run on the hyper engine: it cuts the flood late (docs/reference.md, --h1-engine)"
        );
        return Ok(());
    }
    let (state, logs) = dirs("interim-flood");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let up = listener.local_addr()?;
    let flood = tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return 0u64;
        };
        let mut head = [0u8; 4096];
        let _ = s.read(&mut head).await;
        let heads = "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n".repeat(512);
        // Bounded: until the proxy closes the connection, or 60 s at most.
        let end = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut sent = 0u64;
        while tokio::time::Instant::now() < end && s.write_all(heads.as_bytes()).await.is_ok() {
            sent += 1;
        }
        sent
    });
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[up])]);
    cp.push(s.clone());
    let p = ProxyProc::start(
        "proxy-interim-flood",
        &[cp.url()],
        state.path(),
        &logs,
        &["--upstream-response-timeout", "1s"],
    )?;
    wait_version(&p, &s.version).await?;
    let began = std::time::Instant::now();
    let answer = raw(p.addr, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await?;
    let took = began.elapsed();
    assert!(answer.starts_with("HTTP/1.1 504 "), "{answer:?}");
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    let batches = tokio::time::timeout(T, flood).await??;
    assert!(batches > 0, "the upstream sent no interim heads");
    Ok(())
}

#[tokio::test]
async fn trailers_absolute_targets_leading_empty_lines_and_expect_continue_are_forwarded_safely()
-> anyhow::Result<()> {
    let (state, logs) = dirs("framings");
    let (up, mut got) = recording_upstream().await?;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(1, &[("a.test", "/", "web")], &[("web", &[up])]);
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-framings", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;

    let chunked = "POST /t HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nX-Trailer: 1\r\n\r\n";
    assert!(raw(p.addr, chunked).await?.contains(" 200 "));
    let sent = recorded(&mut got).await?;
    assert!(sent.starts_with("POST /t HTTP/1.1\r\n"), "{sent:?}");
    assert!(sent.contains("hello"), "{sent:?}");
    assert!(
        !sent.contains("6.6.6.6") && !sent.to_lowercase().contains("x-trailer"),
        "a trailer reached the upstream: {sent:?}"
    );

    let absolute = "GET http://a.test/p?q=1 HTTP/1.1\r\nHost: a.test\r\n\r\n";
    assert!(raw(p.addr, absolute).await?.contains(" 200 "));
    let sent = recorded(&mut got).await?;
    assert!(sent.starts_with("GET /p?q=1 HTTP/1.1\r\n"), "{sent:?}");

    let leading = "\r\nGET /lead HTTP/1.1\r\nHost: a.test\r\n\r\n";
    assert!(raw(p.addr, leading).await?.contains(" 200 "));
    assert!(
        recorded(&mut got)
            .await?
            .starts_with("GET /lead HTTP/1.1\r\n")
    );

    let old = "POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert!(raw(p.addr, old).await?.contains(" 400 "));

    // Expect: 100-continue: the client hears 100 before it sends its body, then the
    // upstream's answer; the body arrives whole.
    let mut c = tokio::net::TcpStream::connect(p.addr).await?;
    c.write_all(
        b"PUT /e HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(T, c.read(&mut buf)).await??;
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(first.starts_with("HTTP/1.1 100 Continue\r\n"), "{first:?}");
    c.write_all(b"hello").await?;
    let mut answer = first;
    while !answer.contains(" 200 ") || !answer.ends_with("ok") {
        let n = tokio::time::timeout(T, c.read(&mut buf)).await??;
        anyhow::ensure!(n > 0, "closed before the answer: {answer:?}");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let sent = recorded(&mut got).await?;
    assert!(
        sent.starts_with("PUT /e HTTP/1.1\r\n") && sent.ends_with("\r\n\r\nhello"),
        "{sent:?}"
    );
    Ok(())
}

/// An h2c backend on 127.0.0.1 (HTTP/2 with prior knowledge, as gRPC servers speak):
/// answers every request with headers saying what it got (version, `:authority`, `te`,
/// the body's length) and a `grpc-status: 0` trailer.
async fn h2c_backend() -> anyhow::Result<SocketAddr> {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(
                |req: http::Request<hyper::body::Incoming>| async move {
                    let version = format!("{:?}", req.version());
                    let authority = req
                        .uri()
                        .authority()
                        .map(|a| a.to_string())
                        .unwrap_or_default();
                    let te = req
                        .headers()
                        .get(http::header::TE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let body = req.into_body().collect().await?.to_bytes();
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    let frames = vec![
                        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(body.clone())),
                        Ok(hyper::body::Frame::trailers(trailers)),
                    ];
                    let answer = http::Response::builder()
                        .header("x-seen-version", version)
                        .header("x-seen-authority", authority)
                        .header("x-seen-te", te)
                        .header("x-seen-body", body.len().to_string())
                        .body(http_body_util::StreamBody::new(futures::stream::iter(
                            frames,
                        )))
                        .expect("a response");
                    Ok::<_, hyper::Error>(answer)
                },
            );
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    Ok(addr)
}

#[tokio::test]
async fn an_h2c_backend_gets_http2_with_its_authority_and_answers_with_trailers()
-> anyhow::Result<()> {
    use http_body_util::BodyExt;
    let (state, logs) = dirs("h2c-backend");
    let backend = h2c_backend().await?;
    let cp = FakeControlPlane::start(None).await?;
    let mut s = snapshot(1, &[("grpc.test", "/", "grpc")], &[("grpc", &[backend])]);
    s.backends[0].protocol = holdfast_proto::v1::BackendProtocol::H2c as i32;
    holdfast_proto::snapshot::seal(&mut s, 1);
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-h2c-backend", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;

    // A gRPC-shaped call over h2c: HTTP/2 upstream, the authority, `te: trailers`, the
    // body, and the backend's trailers back.
    let stream = tokio::net::TcpStream::connect(p.addr).await?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await?;
    tokio::spawn(conn);
    for call in 0..3 {
        let req = http::Request::post("http://grpc.test/pkg.Echo/Call")
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"\0\0\0\0\x05hello",
            )))?;
        let resp = tokio::time::timeout(T, sender.send_request(req)).await??;
        assert_eq!(resp.status(), 200, "call {call}");
        assert_eq!(resp.headers()["x-seen-version"], "HTTP/2.0");
        assert_eq!(resp.headers()["x-seen-authority"], "grpc.test");
        assert_eq!(resp.headers()["x-seen-te"], "trailers");
        assert_eq!(resp.headers()["x-seen-body"], "10");
        let collected = tokio::time::timeout(T, resp.into_body().collect()).await??;
        let trailers = collected.trailers().cloned();
        assert_eq!(collected.to_bytes().len(), 10);
        let trailers = trailers.ok_or_else(|| anyhow::anyhow!("no trailers came back"))?;
        assert_eq!(trailers["grpc-status"], "0");
    }
    // The three calls shared one upstream connection.
    let opened = p
        .metric_value("holdfast_proxy_upstream_connections_opened_total")
        .await?;
    assert_eq!(opened, 1.0, "one shared HTTP/2 connection");

    // HTTP/1.1 to it: the hyper engine sends it as HTTP/2; the native engine answers 502.
    let head = raw_head(
        p.addr,
        "GET /plain HTTP/1.1\r\nHost: grpc.test\r\nConnection: close\r\n\r\n",
    )
    .await?;
    if std::env::var("HOLDFAST_H1_ENGINE").is_ok_and(|e| e == "hyper") {
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert_eq!(header(&head, "x-seen-version"), Some("http/2.0"), "{head}");
    } else {
        assert!(head.starts_with("http/1.1 502"), "{head}");
        let refused = p
            .metric_value(
                r#"holdfast_proxy_error_responses_total{reason="upstream_protocol",status="502"}"#,
            )
            .await?;
        assert_eq!(refused, 1.0);
    }
    Ok(())
}

/// A TLS ClientHello record asking for `sni` (the bytes a client sends first; nothing
/// after it is read by a passthrough listener).
fn client_hello(sni: &str) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[9u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    let n = sni.len() as u16;
    let mut ext = 0u16.to_be_bytes().to_vec();
    ext.extend_from_slice(&(n + 5).to_be_bytes());
    ext.extend_from_slice(&(n + 3).to_be_bytes());
    ext.push(0);
    ext.extend_from_slice(&n.to_be_bytes());
    ext.extend_from_slice(sni.as_bytes());
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut message = vec![1];
    message.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    message.extend_from_slice(&body);
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&(message.len() as u16).to_be_bytes());
    record.extend_from_slice(&message);
    record
}

/// A TCP backend on 127.0.0.1 that echoes every byte back, prefixed with its `name` once.
async fn tcp_echo(name: &'static str) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                if s.write_all(name.as_bytes()).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(addr)
}

#[tokio::test]
async fn a_tls_passthrough_listener_relays_the_connection_unopened_to_the_backend_its_server_name_picks()
-> anyhow::Result<()> {
    use holdfast_proto::snapshot::{gateway_host_name, listener_name};
    use holdfast_proto::v1::{GatewayHost, GatewayListener, GatewayRef, GatewayRoute, MatchKind};
    let (state, logs) = dirs("passthrough");
    let exact = tcp_echo("exact:").await?;
    let wild = tcp_echo("wild:").await?;
    let cp = FakeControlPlane::start(None).await?;
    let mut s = snapshot(1, &[], &[("exact", &[exact]), ("wild", &[wild])]);
    // A free port for the listener (bound by the proxy, not by this test).
    let port = closed_port().port();
    let listener = listener_name("127.0.0.1", u32::from(port));
    s.gateway_listeners = vec![GatewayListener {
        name: listener.clone(),
        address: "127.0.0.1".into(),
        port: u32::from(port),
        protocol: "TLS".into(),
        gateway: Some(GatewayRef {
            namespace: "infra".into(),
            name: "gw".into(),
            generation: 1,
        }),
        ..Default::default()
    }];
    let host = |name: &str, backend: &str| GatewayHost {
        name: gateway_host_name(&listener, name),
        listener: listener.clone(),
        host: name.into(),
        routes: vec![GatewayRoute {
            match_kind: MatchKind::Prefix as i32,
            path: "/".into(),
            backends: vec![holdfast_proto::v1::WeightedBackend {
                backend: backend.into(),
                weight: 1,
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    s.gateway_hosts = vec![
        host("*.example.com", "wild"),
        host("abc.example.com", "exact"),
    ];
    s.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    holdfast_proto::snapshot::seal(&mut s, 1);
    cp.push(s.clone());
    let p = ProxyProc::start("proxy-passthrough", &[cp.url()], state.path(), &logs, &[])?;
    wait_version(&p, &s.version).await?;
    let at: SocketAddr = ([127, 0, 0, 1], port).into();

    // The ClientHello and what follows reach the backend byte for byte, and its bytes
    // come back: the exact hostname first, then the wildcard's.
    for (sni, name) in [("abc.example.com", "exact:"), ("x.y.example.com", "wild:")] {
        let mut c = tokio::net::TcpStream::connect(at).await?;
        let hello = client_hello(sni);
        c.write_all(&hello).await?;
        c.write_all(b"opaque application bytes").await?;
        let mut want = name.as_bytes().to_vec();
        want.extend_from_slice(&hello);
        want.extend_from_slice(b"opaque application bytes");
        let mut got = vec![0u8; want.len()];
        tokio::time::timeout(T, c.read_exact(&mut got)).await??;
        assert_eq!(got, want, "{sni}");
    }

    // A name no route serves, and bytes that are not TLS: closed with nothing sent back.
    let refused: [(&str, Vec<u8>); 2] = [
        ("no_route", client_hello("other.test")),
        (
            "bad_hello",
            b"GET / HTTP/1.1\r\nHost: abc.example.com\r\n\r\n".to_vec(),
        ),
    ];
    for (outcome, bytes) in refused {
        let mut c = tokio::net::TcpStream::connect(at).await?;
        c.write_all(&bytes).await?;
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(T, c.read(&mut buf))
            .await?
            .unwrap_or(0);
        assert_eq!(n, 0, "{outcome}: closed, nothing sent");
        // Counted once the connection has ended (just after the client sees it close).
        let series =
            format!("holdfast_proxy_passthrough_connections_total{{outcome=\"{outcome}\"}}");
        wait::until(&format!("{outcome} counted"), T, || async {
            let counted = p.metric_value(&series).await.map_err(|e| e.to_string())?;
            Ok((counted == 1.0).then_some(()))
        })
        .await?;
    }
    Ok(())
}
