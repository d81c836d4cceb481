//! Tracing against a real OpenTelemetry Collector (deploy/local/otelcol): the proxy's span
//! of each sampled request, a child of the client's, with the route, status, upstream
//! and attempts, the `traceparent` the upstream gets naming it; and the control plane's
//! `build` and `publish` spans.

use std::net::SocketAddr;
use std::path::PathBuf;

use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::fake_control_plane::{FakeControlPlane, snapshot};
use holdfast_tests::otelcol::Collector;
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::wait::T;
use holdfast_tests::{echo, http};

fn dirs(test: &str) -> (tempfile::TempDir, PathBuf) {
    let logs = holdfast_tests::repo_root()
        .join("target/e2e-logs")
        .join(format!("traces-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    (tempfile::tempdir().unwrap(), logs)
}

/// A 127.0.0.1 port with nothing listening.
fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn a_sampled_request_is_one_server_span_under_the_clients_with_route_status_upstream_and_attempts()
-> anyhow::Result<()> {
    let (state, logs) = dirs("proxy");
    let collector = Collector::start("collector", &logs)?;
    let web = echo::spawn(([127, 0, 0, 1], 0).into(), "echo-web").await?.0;
    let cp = FakeControlPlane::start(None).await?;
    let s = snapshot(
        1,
        &[("a.test", "/api", "web"), ("down.test", "/", "down")],
        &[("web", &[web]), ("down", &[closed_port(), closed_port()])],
    );
    cp.push(s.clone());
    let access = logs.join("access.log");
    let p = ProxyProc::start(
        "proxy-traces",
        &[cp.url()],
        state.path(),
        &logs,
        &[
            "--otlp-endpoint",
            &collector.endpoint,
            "--access-log",
            access.to_str().unwrap(),
        ],
    )?;
    p.wait_version(&s.version, T).await?;

    // A request in the client's sampled trace.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let sent = format!("00-{trace}-{parent}-01");
    let (status, headers, _) = http::get_with(
        p.addr,
        "a.test",
        "/api/items",
        &[("traceparent", &sent), ("tracestate", "vendor=1")],
    )
    .await?;
    assert_eq!(status, 200);
    let span = collector
        .span("the proxy's span of the request", |s| {
            s.field("traceId") == trace
        })
        .await?;
    assert_eq!(span.service, "holdfast-proxy");
    assert_eq!(span.field("parentSpanId"), parent, "{:?}", span.json);
    assert_eq!(span.json["kind"], 2, "SPAN_KIND_SERVER: {:?}", span.json);
    assert_eq!(span.field("name"), "GET /api");
    for (key, want) in [
        ("http.request.method", "GET".to_owned()),
        ("http.response.status_code", "200".to_owned()),
        ("http.route", "/api".to_owned()),
        ("url.path", "/api/items".to_owned()),
        ("server.address", "a.test".to_owned()),
        ("holdfast.upstream.address", web.to_string()),
        ("holdfast.attempts", "1".to_owned()),
    ] {
        assert_eq!(span.attribute(key), Some(want), "{key}: {:?}", span.json);
    }
    assert!(
        span.attribute("holdfast.route")
            .is_some_and(|r| r.ends_with("a.test/api")),
        "{:?}",
        span.json
    );
    // The upstream is told this span is its parent, in the same trace; tracestate goes on.
    let span_id = span.field("spanId");
    assert_eq!(span_id.len(), 16);
    assert_eq!(
        headers["x-echo-traceparent"],
        format!("00-{trace}-{span_id}-01").as_str()
    );
    assert_eq!(headers["x-echo-tracestate"], "vendor=1");

    // An invalid traceparent: a new trace (sampled at the default ratio of 1), this span
    // its root; the client's tracestate, of no trace continued, is not sent on.
    let (status, headers, _) = http::get_with(
        p.addr,
        "a.test",
        "/api/new",
        &[
            ("traceparent", "00-not-a-trace-context"),
            ("tracestate", "vendor=stale"),
        ],
    )
    .await?;
    assert_eq!(status, 200);
    assert!(
        headers.get("x-echo-tracestate").is_none(),
        "{:?}",
        headers.get("x-echo-tracestate")
    );
    let upstream_got = headers["x-echo-traceparent"].to_str()?.to_owned();
    let new_trace = upstream_got
        .split('-')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert_eq!(new_trace.len(), 32, "{upstream_got}");
    let root = collector
        .span("the new trace's span", |s| s.field("traceId") == new_trace)
        .await?;
    assert_eq!(root.field("parentSpanId"), "", "{:?}", root.json);
    assert!(upstream_got.ends_with(&format!("{}-01", root.field("spanId"))));

    // An unsampled client trace is not recorded, and goes upstream as it came.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let (_, headers, _) = http::get_with(
        p.addr,
        "a.test",
        "/api/quiet",
        &[("traceparent", unsampled)],
    )
    .await?;
    assert_eq!(headers["x-echo-traceparent"], unsampled);

    // Both endpoints refuse: two attempts, a 502, the span an error.
    assert_eq!(p.get("down.test", "/").await?.0, 502);
    let failed = collector
        .span("the failed request's span", |s| {
            s.attribute("server.address").as_deref() == Some("down.test")
        })
        .await?;
    assert_eq!(failed.attribute("holdfast.attempts").as_deref(), Some("2"));
    assert_eq!(
        failed.attribute("http.response.status_code").as_deref(),
        Some("502")
    );
    assert_eq!(
        failed.json["status"]["code"], 2,
        "STATUS_CODE_ERROR: {:?}",
        failed.json
    );
    // The quiet request made no span: the only spans are the three above.
    let spans = collector.spans()?;
    assert!(
        spans
            .iter()
            .all(|s| s.field("traceId") != "0af7651916cd43dd8448eb211c80319c"),
        "{spans:?}"
    );

    // The access log names each request's trace.
    let first = holdfast_tests::wait::until("the first request's log line", T, || async {
        let lines = std::fs::read_to_string(&access).unwrap_or_default();
        Ok(lines
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["path"] == "/api/items"))
    })
    .await?;
    assert_eq!(first["trace_id"], trace);
    assert_eq!(
        p.metric_value("holdfast_proxy_spans_dropped_total").await?,
        0.0
    );
    Ok(())
}

#[tokio::test]
async fn each_build_of_the_control_plane_is_a_build_span_with_its_publish_under_it()
-> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "traces").await?;
    let logs = holdfast_tests::e2e_logs(&ns)?;
    let collector = Collector::start("collector", &logs)?;
    let class = format!("hf-{ns}");
    let cp = ControlPlane::start(
        "control-plane",
        &cluster.kubeconfig(),
        &logs,
        &[
            "--ingress-class",
            &class,
            "--otlp-endpoint",
            &collector.endpoint,
        ],
    )?;
    let publish = collector
        .span("the first build's publish span", |s| {
            s.service == "holdfast-control-plane" && s.field("name") == "publish"
        })
        .await?;
    let build = collector
        .span("its build span", |s| {
            s.field("name") == "build" && s.field("traceId") == publish.field("traceId")
        })
        .await?;
    assert_eq!(publish.field("parentSpanId"), build.field("spanId"));
    assert_eq!(build.field("parentSpanId"), "");
    assert_eq!(
        build.attribute("holdfast.build.outcome").as_deref(),
        Some("offered")
    );
    assert!(
        publish
            .attribute("holdfast.snapshot.version")
            .is_some_and(|v| !v.is_empty()),
        "{:?}",
        publish.json
    );
    assert_eq!(cp.metric_value("holdfast_spans_dropped_total").await?, 0.0);
    Ok(())
}
