//! A proxy's apply of a one-host delta to a served snapshot of 10,000 hosts: check
//! (content hash, references), compile, persist (append to the delta log; the background
//! compaction runs as it would in service) and swap.
//! `cargo bench -p holdfast-data-plane --bench apply`.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use holdfast_data_plane::metrics::Metrics;
use holdfast_data_plane::subscriber::Applier;
use holdfast_proto::delta;
use holdfast_proto::snapshot::seal;
use holdfast_proto::v1::{Backend, Endpoint, MatchKind, Route, Snapshot, VirtualHost};

/// `hosts` hosts, each with a Prefix route to its own backend of three endpoints.
fn snapshot(hosts: usize, first_path: &str) -> Snapshot {
    let mut s = Snapshot::default();
    for h in 0..hosts {
        let backend = format!("ns/svc-{h:05}:80");
        s.backends.push(Backend {
            name: backend.clone(),
            endpoints: (1..=3)
                .map(|i| Endpoint {
                    address: format!("10.{}.{}.{i}", (h >> 8) & 255, h & 255),
                    port: 8080,
                    zone: String::new(),
                    ready: true,
                })
                .collect(),
            ..Default::default()
        });
        s.virtual_hosts.push(VirtualHost {
            host: format!("app-{h:05}.example.com"),
            routes: vec![Route {
                match_kind: MatchKind::Prefix as i32,
                path: if h == 0 {
                    first_path.into()
                } else {
                    "/".into()
                },
                backend,
                source: None,
            }],
            ..Default::default()
        });
    }
    seal(&mut s, 7);
    s
}

fn bench_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("proxy_apply_delta");
    group.sample_size(200);
    for hosts in [1_000, 10_000] {
        let a = snapshot(hosts, "/");
        let b = snapshot(hosts, "/changed");
        // Two deltas that take the served snapshot back and forth (same revision, so
        // neither is older than the other).
        let deltas = [
            delta::diff(&a.version, &delta::inventory(&a), &b),
            delta::diff(&b.version, &delta::inventory(&b), &a),
        ];
        assert_eq!(deltas[0].upserted_virtual_hosts.len(), 1);
        let dir = tempfile::tempdir().expect("temp dir");
        holdfast_data_plane::persist::prepare_dir(&dir.path().join("state")).expect("state dir");
        let mut registry = prometheus_client::registry::Registry::default();
        let applier = Applier::new(
            Arc::new(ArcSwapOption::empty()),
            dir.path().join("state"),
            Metrics::new(&mut registry),
            usize::MAX,
        );
        applier.apply(a.clone()).expect("the base applies");
        let mut i = 0usize;
        group.bench_with_input(BenchmarkId::new("one_host", hosts), &hosts, |bench, _| {
            bench.iter(|| {
                let persist_error = applier
                    .apply_delta(&deltas[i % 2])
                    .expect("the delta applies");
                assert_eq!(persist_error, None);
                i += 1;
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_apply);
criterion_main!(benches);
