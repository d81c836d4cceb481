//! The proxy's request path without sockets, at 10,000 routes: route a request head,
//! build the upstream request, map the upstream response head, count the request. It
//! also prints the heap allocations one request makes on this path.
//!
//! `request_filters/<case>` is the same path through a Gateway listener's rule with
//! each filter (and with none, and with a header modifier and a rewrite together): what
//! each filter costs per request, beside a rule without one.
//!
//! `cargo bench -p holdfast-data-plane --bench request`.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use holdfast_data_plane::metrics::Metrics;
use holdfast_data_plane::proxy::{ForwardSettings, Forwarder, LOOP_HEADER, Via};
use holdfast_data_plane::table::RouteTable;
use holdfast_http::path::EscapedSlashes;
use holdfast_proto::snapshot::{gateway_host_name, seal};
use holdfast_proto::v1::{
    Backend, Endpoint, GatewayHost, GatewayListener, GatewayRef, GatewayRoute, HeaderMatch,
    HeaderModifier, MatchKind, PathModifier, UrlRewrite, WeightedBackend,
};
use http::{Request, Response, Uri, Version};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

mod common;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

fn forwarder() -> Forwarder {
    let mut registry = prometheus_client::registry::Registry::default();
    Forwarder::new(
        Arc::new(ArcSwapOption::empty()),
        ForwardSettings {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(60),
            eject_for: Duration::from_secs(10),
            pool_idle_per_host: 64,
            workers: 1,
            escaped_slashes: EscapedSlashes::Reject,
            verbose_errors: false,
            max_request_body: 0,
            body_read_timeout: Duration::from_secs(60),
            tunnel_idle_timeout: Duration::from_secs(60),
            max_connections_per_endpoint: 0,
            allow_upgrade: vec!["websocket".into()],
            trust_forwarded_from: vec![],
            allow_dot_segment_params: false,
            retry_budget: 0.2,
            mirror_timeout: std::time::Duration::from_secs(5),
            max_mirrors_in_flight: 1024,
            loop_token: holdfast_data_plane::proxy::new_loop_token(),
        },
        Metrics::new(&mut registry),
    )
}

/// A browser-like request head and a typical response head, as hyper hands them over.
fn heads(host: &str) -> (Request<()>, Response<()>) {
    let request = Request::builder()
        .uri("/api/v1/users/42/orders?page=2")
        .header("host", host)
        .header(
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101",
        )
        .header("accept", "application/json")
        .header("accept-encoding", "gzip, deflate, br")
        .header("x-request-id", "7f0e2a9c-5b1d-4c3e-9a8f-1d2e3f4a5b6c")
        .header("connection", "keep-alive")
        .body(())
        .expect("valid request");
    let response = Response::builder()
        .header("content-type", "application/json")
        .header("content-length", "512")
        .header("date", "Fri, 04 Dec 2026 12:00:00 GMT")
        .header("connection", "keep-alive")
        .body(())
        .expect("valid response");
    (request, response)
}

/// One request through the path (on `via`); what it sends upstream and answers.
fn forward_via(
    f: &Forwarder,
    table: &RouteTable,
    via: &Via,
    client: SocketAddr,
    (request, response): (Request<()>, Response<()>),
) -> (Request<()>, Response<()>) {
    let started = Instant::now();
    let (mut parts, ()) = request.into_parts();
    let Ok(mut routed) = f.route_hyper(
        &parts.method,
        parts.version,
        &parts.uri,
        &parts.headers,
        (via, None, true, "test-id"),
        Some(table),
    ) else {
        panic!("the request is routed");
    };
    let route = routed.route;
    let response_changes = std::mem::take(&mut routed.response_changes);
    let target = f.upstream_head(&mut parts, routed, client, false, 80, false);
    let mut upstream = Request::new(());
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = Uri::from(target);
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.headers_mut() = parts.headers;
    let (mut answer, ()) = response.into_parts();
    Forwarder::downstream_head(&mut answer, false);
    if let Some(changes) = response_changes.get() {
        changes.apply_to_response(&mut answer.headers, LOOP_HEADER);
    }
    f.metrics().count_route(
        || route.series_key(),
        &route.counters,
        answer.status.as_u16(),
        started.elapsed(),
    );
    (upstream, Response::from_parts(answer, ()))
}

/// One request through the path on the proxy's own listener.
fn forward(
    f: &Forwarder,
    table: &RouteTable,
    client: SocketAddr,
    heads: (Request<()>, Response<()>),
) -> (Request<()>, Response<()>) {
    forward_via(f, table, &Via::Http, client, heads)
}

/// The Gateway listener of [`filters_table`].
const LISTENER: &str = "127.0.0.1:8080";

/// Each filter case: its path on host `filters.example.com`, and its rule.
fn filter_cases() -> Vec<(&'static str, GatewayRoute)> {
    let pair = |n: &str, v: &str| HeaderMatch {
        name: n.into(),
        value: v.into(),
    };
    let modifier = HeaderModifier {
        set: vec![pair("x-tenant", "blue")],
        add: vec![pair("x-via", "holdfast")],
        remove: vec!["x-request-id".into()],
    };
    let rewrite = UrlRewrite {
        hostname: String::new(),
        path: Some(PathModifier {
            full: false,
            value: "/v2".into(),
            captures: false,
        }),
    };
    let rule = |path: &str| GatewayRoute {
        match_kind: MatchKind::Prefix as i32,
        path: path.into(),
        backends: vec![WeightedBackend {
            backend: "ns/filters:80".into(),
            weight: 1,
            ..Default::default()
        }],
        ..Default::default()
    };
    vec![
        ("none", rule("/none")),
        (
            "request_headers",
            GatewayRoute {
                request_headers: Some(modifier.clone()),
                ..rule("/request_headers")
            },
        ),
        (
            "response_headers",
            GatewayRoute {
                response_headers: Some(modifier.clone()),
                ..rule("/response_headers")
            },
        ),
        (
            "rewrite",
            GatewayRoute {
                rewrite: Some(rewrite.clone()),
                ..rule("/rewrite")
            },
        ),
        (
            "headers_and_rewrite",
            GatewayRoute {
                request_headers: Some(modifier),
                rewrite: Some(rewrite),
                ..rule("/headers_and_rewrite")
            },
        ),
    ]
}

/// [`common::table`]'s 10,000 routes and a Gateway listener whose host
/// `filters.example.com` has the rules of [`filter_cases`].
fn filters_table() -> RouteTable {
    let mut s = common::snapshot(10_000);
    s.backends.push(Backend {
        name: "ns/filters:80".into(),
        endpoints: vec![Endpoint {
            address: "10.9.9.9".into(),
            port: 8080,
            zone: String::new(),
            ready: true,
        }],
        ..Default::default()
    });
    s.backends.sort_by(|a, b| a.name.cmp(&b.name));
    s.gateway_listeners.push(GatewayListener {
        name: LISTENER.into(),
        address: "127.0.0.1".into(),
        port: 8080,
        protocol: "HTTP".into(),
        gateway: Some(GatewayRef {
            namespace: "ns".into(),
            name: "gw".into(),
            generation: 1,
        }),
        ..Default::default()
    });
    let mut routes: Vec<GatewayRoute> = filter_cases().into_iter().map(|(_, r)| r).collect();
    // Longer paths first, as the control plane orders a host's entries.
    routes.sort_by(|a, b| b.path.len().cmp(&a.path.len()).then(a.path.cmp(&b.path)));
    s.gateway_hosts.push(GatewayHost {
        name: gateway_host_name(LISTENER, "filters.example.com"),
        listener: LISTENER.into(),
        host: "filters.example.com".into(),
        routes,
        ..Default::default()
    });
    seal(&mut s, 1);
    RouteTable::compile(&s).expect("compiles")
}

fn bench_filters(c: &mut Criterion) {
    let f = forwarder();
    let table = filters_table();
    let via = Via::Gateway {
        listener: Arc::from(LISTENER),
        tls: None,
        version: "",
    };
    let client: SocketAddr = ([10, 1, 2, 3], 40000).into();
    let heads = |case: &str| {
        let (mut request, response) = heads("filters.example.com");
        *request.uri_mut() =
            Uri::try_from(format!("/{case}/users/42/orders?page=2")).expect("a path");
        (request, response)
    };
    let mut group = c.benchmark_group("request_filters");
    for (case, _) in filter_cases() {
        // Each case does what it says (checked once, outside the timing).
        let (sent, answered) = forward_via(&f, &table, &via, client, heads(case));
        match case {
            "request_headers" | "headers_and_rewrite" => {
                assert_eq!(sent.headers()["x-tenant"], "blue");
                assert!(sent.headers().get("x-request-id").is_none());
            }
            "response_headers" => assert_eq!(answered.headers()["x-tenant"], "blue"),
            _ => assert!(sent.headers().get("x-tenant").is_none()),
        }
        let rewritten = matches!(case, "rewrite" | "headers_and_rewrite");
        assert_eq!(
            sent.uri().path().starts_with("/v2/users"),
            rewritten,
            "{case}: {}",
            sent.uri()
        );
        group.bench_function(case, |b| {
            b.iter_batched(
                || heads(case),
                |h| forward_via(&f, &table, &via, black_box(client), h),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn bench_request(c: &mut Criterion) {
    let f = forwarder();
    let table = common::table(10_000);
    let host = "app-1250.example.com";
    let client: SocketAddr = ([10, 1, 2, 3], 40000).into();

    // The first request creates its route's metric series and the like: count a later one.
    drop(forward(&f, &table, client, heads(host)));
    let heads_made = heads(host);
    let region = Region::new(GLOBAL);
    let sent = black_box(forward(&f, &table, client, heads_made));
    let change = region.change();
    drop(sent);
    eprintln!(
        "request path: {} allocations, {} bytes per request (route, upstream head, response head, metrics)",
        change.allocations + change.reallocations,
        change.bytes_allocated
    );

    c.bench_function("request_path/10000", |b| {
        b.iter_batched(
            || heads(host),
            |h| forward(&f, &table, black_box(client), h),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, bench_request, bench_filters);
criterion_main!(benches);
