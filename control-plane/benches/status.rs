//! The leader's Gateway API status pass (`gateway_api::status::desired`) over one Gateway
//! and 10,000 HTTPRoutes, each with its own Service, in the steady state: every status is
//! already written, so the pass finds nothing to write. The leader runs it after any
//! change (and every 5 s), so its cost is paid once a second under steady churn.
//! `cargo bench -p holdfast-control-plane --bench status`.

use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use holdfast_control_plane::gateway_api::attach::SecretCheck;
use holdfast_control_plane::gateway_api::status::{Pool, desired};
use holdfast_control_plane::gateway_api::{DEFAULT_CONTROLLER_NAME, HttpRoute};
use holdfast_control_plane::translate::ClusterState;
use serde_json::json;

/// One Gateway of our class and `n` HTTPRoutes attached to it, one Service each, with
/// the statuses the leader writes already in place.
fn cluster(n: usize) -> (ClusterState, Pool) {
    let pool = Pool::parse("127.10.0.0/16").unwrap();
    let mut state = ClusterState {
        gateway_classes: vec![Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": "ours", "generation": 1 },
                "spec": { "controllerName": DEFAULT_CONTROLLER_NAME } }))
            .unwrap(),
        )],
        gateways: vec![Arc::new(
            serde_json::from_value(json!({
                "metadata": { "namespace": "bench", "name": "gw", "generation": 1,
                              "creationTimestamp": "2026-01-01T00:00:00Z" },
                "spec": { "gatewayClassName": "ours", "listeners": [
                    { "name": "http", "port": 80, "protocol": "HTTP",
                      "allowedRoutes": { "namespaces": { "from": "All" } } } ] } }))
            .unwrap(),
        )],
        ..Default::default()
    };
    for i in 0..n {
        let ns = format!("team-{}", i % 100);
        let name = format!("app-{i}");
        state.http_routes.push(Arc::new(
            serde_json::from_value(json!({
                "metadata": { "namespace": ns, "name": name, "generation": 1,
                              "uid": format!("uid-{i}"), "resourceVersion": i.to_string(),
                              "creationTimestamp": "2026-01-01T00:00:00Z" },
                "spec": { "parentRefs": [{ "name": "gw", "namespace": "bench" }],
                          "hostnames": [format!("{name}.example.com")],
                          "rules": [{ "matches": [{ "path": { "type": "PathPrefix", "value": "/" } }],
                                      "backendRefs": [{ "name": name, "port": 80 }] }] } }))
            .unwrap(),
        ));
        state.services.push(Arc::new(
            serde_json::from_value(json!({
                "metadata": { "namespace": ns, "name": name },
                "spec": { "ports": [{ "name": "http", "port": 80 }] } }))
            .unwrap(),
        ));
    }
    // The leader's writes, in place: the steady state.
    let first = pass(&state, &pool);
    assert_eq!(first.routes.len(), n, "every route's first status");
    let written: std::collections::HashMap<(String, String), serde_json::Value> = first
        .routes
        .into_iter()
        .map(|(_, w)| w)
        .chain(first.gateways)
        .map(|w| ((w.namespace, w.name), w.status))
        .collect();
    let key = |m: &kube::api::ObjectMeta| {
        (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    };
    for r in &mut state.http_routes {
        let status = written[&key(&r.metadata)].clone();
        Arc::<HttpRoute>::make_mut(r).status = status;
    }
    for g in &mut state.gateways {
        let status = written[&key(&g.metadata)].clone();
        Arc::make_mut(g).status = status;
    }
    let again = pass(&state, &pool);
    assert!(
        again.routes.is_empty() && again.gateways.is_empty(),
        "the steady state writes nothing"
    );
    (state, pool)
}

fn pass(state: &ClusterState, pool: &Pool) -> holdfast_control_plane::gateway_api::status::Desired {
    let served = BTreeSet::from([("bench/gw".to_owned(), 1)]);
    desired(
        state,
        DEFAULT_CONTROLLER_NAME,
        Some(pool),
        None,
        &served,
        "2026-01-01T00:00:00Z",
        |_, _| SecretCheck::Usable,
    )
}

fn bench_status(c: &mut Criterion) {
    let mut group = c.benchmark_group("gateway_status");
    group.sample_size(10);
    let (state, pool) = cluster(10_000);
    group.bench_function("10000_http_routes_nothing_to_write", |b| {
        b.iter(|| pass(black_box(&state), &pool))
    });
    group.finish();
}

criterion_group!(benches, bench_status);
criterion_main!(benches);
