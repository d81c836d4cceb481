//! The proxy's request path without sockets, at 10,000 routes: route a request head,
//! build the upstream request, map the upstream response head, count the request. It
//! also prints the heap allocations one request makes on this path.
//! `cargo bench -p holdfast-data-plane --bench request`.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use holdfast_data_plane::metrics::Metrics;
use holdfast_data_plane::proxy::{ForwardSettings, Forwarder};
use holdfast_data_plane::table::RouteTable;
use holdfast_http::path::EscapedSlashes;
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

/// One request through the path; what it sends upstream and answers.
fn forward(
    f: &Forwarder,
    table: &RouteTable,
    client: SocketAddr,
    (request, response): (Request<()>, Response<()>),
) -> (Request<()>, Response<()>) {
    let started = Instant::now();
    let (mut parts, ()) = request.into_parts();
    let Ok(routed) = f.route_hyper(
        &parts.method,
        parts.version,
        &parts.uri,
        &parts.headers,
        (&holdfast_data_plane::proxy::Via::Http, None),
        Some(table),
    ) else {
        panic!("the request is routed");
    };
    let route = routed.route;
    let target = f.upstream_head(&mut parts, routed, client, false, 80, false);
    let mut upstream = Request::new(());
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = Uri::from(target);
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.headers_mut() = parts.headers;
    let (mut answer, ()) = response.into_parts();
    Forwarder::downstream_head(&mut answer, false);
    f.metrics().count_route(
        || route.series_key(),
        &route.counters,
        answer.status.as_u16(),
        started.elapsed(),
    );
    (upstream, Response::from_parts(answer, ()))
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

criterion_group!(benches, bench_request);
criterion_main!(benches);
