//! Route lookup in a compiled table of 100 / 1,000 / 10,000 / 100,000 routes.
//! `cargo bench -p holdfast-data-plane --bench lookup`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use holdfast_data_plane::table::RouteTable;
use holdfast_proto::v1::{Backend, Endpoint, MatchKind, Route, Snapshot, VirtualHost};

/// `n` routes: n/4 hosts with an Exact route and three nested Prefix routes each.
fn table(n: usize) -> RouteTable {
    let hosts = (n / 4).max(1);
    let mut s = Snapshot::default();
    for h in 0..hosts {
        let backend = format!("ns/svc-{h}:80");
        s.backends.push(Backend {
            name: backend.clone(),
            endpoints: vec![Endpoint {
                address: format!("10.{}.{}.1", (h >> 8) & 255, h & 255),
                port: 8080,
                zone: String::new(),
                ready: true,
            }],
            ..Default::default()
        });
        let route = |kind: MatchKind, path: &str| Route {
            match_kind: kind as i32,
            path: path.into(),
            backend: backend.clone(),
            source: None,
        };
        s.virtual_hosts.push(VirtualHost {
            host: format!("app-{h}.example.com"),
            routes: vec![
                route(MatchKind::Exact, "/healthz"),
                route(MatchKind::Prefix, "/api/v1/users"),
                route(MatchKind::Prefix, "/api"),
                route(MatchKind::Prefix, "/"),
            ],
            ..Default::default()
        });
    }
    RouteTable::compile(&s).expect("compiles")
}

fn bench_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("route_lookup");
    for n in [100, 1_000, 10_000, 100_000] {
        let t = table(n);
        let host = format!("app-{}.example.com", n / 8);
        group.bench_with_input(BenchmarkId::new("deep_prefix", n), &n, |b, _| {
            b.iter(|| {
                t.lookup(black_box(&host), black_box("/api/v1/users/42/orders"))
                    .unwrap()
                    .backend
                    .endpoints
                    .len()
            })
        });
        group.bench_with_input(BenchmarkId::new("exact", n), &n, |b, _| {
            b.iter(|| {
                t.lookup(black_box(&host), black_box("/healthz"))
                    .unwrap()
                    .backend
                    .endpoints
                    .len()
            })
        });
        group.bench_with_input(BenchmarkId::new("miss", n), &n, |b, _| {
            b.iter(|| {
                t.lookup(black_box("nowhere.example.org"), black_box("/x"))
                    .is_err()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_lookup);
criterion_main!(benches);
