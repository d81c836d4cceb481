//! Route lookup in a compiled table of 100 / 1,000 / 10,000 / 100,000 routes.
//! `cargo bench -p holdfast-data-plane --bench lookup`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
mod common;

use common::table;

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
