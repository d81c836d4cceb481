//! Snapshot build (translate → seal → validate) from 10,000 Ingresses, Services and
//! EndpointSlices: from scratch (every object digested, as at start-up), and the rebuild
//! after a one-object change by the control plane's long-lived translator (one object
//! digested; the snapshot itself is still built whole).
//! `cargo bench -p holdfast-control-plane --bench build`.

use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use holdfast_control_plane::publisher::build_with;
use holdfast_control_plane::translate::{ClusterState, Options, Translator};
use serde_json::json;

/// `n` namespaces' worth of one Ingress, one Service and one 3-endpoint slice each.
pub fn cluster(n: usize) -> ClusterState {
    let class = json!({ "metadata": { "name": "holdfast" },
                        "spec": { "controller": "holdfast.dev/ingress-controller" } });
    let mut state = ClusterState {
        ingress_classes: vec![Arc::new(serde_json::from_value(class).unwrap())],
        ..Default::default()
    };
    for i in 0..n {
        let ns = format!("team-{}", i % 100);
        let name = format!("app-{i}");
        state.ingresses.push(Arc::new(
            serde_json::from_value(json!({
                "metadata": { "namespace": ns, "name": name, "resourceVersion": i.to_string(),
                              "creationTimestamp": "2026-01-01T00:00:00Z" },
                "spec": { "ingressClassName": "holdfast", "rules": [{
                    "host": format!("{name}.example.com"),
                    "http": { "paths": [
                        { "path": "/", "pathType": "Prefix",
                          "backend": { "service": { "name": name, "port": { "number": 80 } } } },
                        { "path": "/api", "pathType": "Exact",
                          "backend": { "service": { "name": name, "port": { "name": "http" } } } }
                    ]}
                }]}
            }))
            .unwrap(),
        ));
        state.services.push(Arc::new(
            serde_json::from_value(json!({
                "metadata": { "namespace": ns, "name": name },
                "spec": { "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }] }
            }))
            .unwrap(),
        ));
        let octets = [(i >> 8) as u8, i as u8];
        state.endpoint_slices.push(Arc::new(
            serde_json::from_value(json!({
                "metadata": { "namespace": ns, "name": format!("{name}-1"),
                              "labels": { "kubernetes.io/service-name": name } },
                "addressType": "IPv4",
                "ports": [{ "name": "http", "port": 8080 }],
                "endpoints": (1..=3).map(|h| json!({
                    "addresses": [format!("10.{}.{}.{h}", octets[0], octets[1])],
                    "conditions": { "ready": true }, "zone": "zone-a"
                })).collect::<Vec<_>>()
            }))
            .unwrap(),
        ));
    }
    state
}

fn bench_build(c: &mut Criterion) {
    let opts = Options::default();
    let mut group = c.benchmark_group("snapshot_build");
    group.sample_size(20);
    // From scratch: a new translator digests every object. Only the build is timed: the
    // translator and the snapshot are dropped outside the measurement.
    for n in [1_000, 10_000] {
        let state = cluster(n);
        group.bench_function(format!("{n}_ingresses_services_slices"), |b| {
            b.iter_with_large_drop(|| {
                let mut translator = Translator::default();
                let built = build_with(&mut translator, black_box(&state), &opts, 1).unwrap();
                (translator, built)
            })
        });
    }
    // The parts of a 10,000 build, to see where time goes.
    let state = cluster(10_000);
    let translated = holdfast_control_plane::translate::translate(&state, &opts).snapshot();
    let mut sealed = translated.clone();
    holdfast_proto::snapshot::seal(&mut sealed, 1);
    group.bench_function("10000_translate_only", |b| {
        b.iter_with_large_drop(|| {
            let mut translator = Translator::default();
            let t = translator.translate(black_box(&state), &opts);
            (translator, t)
        })
    });
    group.bench_function("10000_content_hash_only", |b| {
        b.iter(|| holdfast_proto::snapshot::content_hash(black_box(&translated)))
    });
    group.bench_function("10000_validate_only", |b| {
        b.iter(|| holdfast_proto::snapshot::validate(black_box(&sealed)).unwrap())
    });
    // A one-object change: one Ingress gains a path, and the control plane's translator
    // (which has built the previous state) rebuilds. Iterations alternate between the two
    // states, so each one digests exactly one changed Ingress.
    let before = cluster(10_000);
    let mut after = before.clone();
    let mut changed = (*after.ingresses[0]).clone();
    if let Some(rules) = changed.spec.as_mut().and_then(|s| s.rules.as_mut()) {
        let mut extra = rules[0].http.as_ref().unwrap().paths[0].clone();
        extra.path = Some("/new".into());
        rules[0].http.as_mut().unwrap().paths.push(extra);
    }
    after.ingresses[0] = Arc::new(changed);
    let mut translator = Translator::default();
    let mut last = build_with(&mut translator, &before, &opts, 1).unwrap().0;
    // Rebuild and encode: the build, and the delta from the build before it that every
    // proxy holding that one is sent (encoded once, shared by the streams).
    let mut rebuild = |name: &str, after: &ClusterState| {
        let mut flip = false;
        group.bench_function(name, |b| {
            b.iter_with_large_drop(|| {
                flip = !flip;
                let state = if flip { after } else { &before };
                let (built, _) = build_with(&mut translator, black_box(state), &opts, 2).unwrap();
                let delta = built
                    .delta_from_published(&last)
                    .expect("a delta is smaller");
                last = built;
                delta
            })
        });
    };
    rebuild("10000_rebuild_after_one_ingress_change", &after);
    // The most frequent change in a cluster: one EndpointSlice's endpoints change (a pod
    // becomes unready), so one backend is resolved again.
    let mut after = before.clone();
    let mut changed = (*after.endpoint_slices[0]).clone();
    if let Some(c) = changed.endpoints[0].conditions.as_mut() {
        c.ready = Some(false);
    }
    after.endpoint_slices[0] = Arc::new(changed);
    rebuild("10000_rebuild_after_one_endpointslice_change", &after);
    group.finish();
}

criterion_group!(benches, bench_build);
criterion_main!(benches);
