//! One test per translation rule; each fails if its rule is removed.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;

fn class(name: &str, controller: &str, default: bool) -> Arc<IngressClass> {
    let mut v = json!({
        "metadata": { "name": name },
        "spec": { "controller": controller }
    });
    if default {
        v["metadata"]["annotations"] = json!({ DEFAULT_CLASS_ANNOTATION: "true" });
    }
    Arc::new(serde_json::from_value(v).unwrap())
}

fn ours() -> Arc<IngressClass> {
    class("holdfast", "holdfast.dev/ingress-controller", false)
}

/// An Ingress of class holdfast created at second `age` with the given rules.
fn ingress(ns: &str, name: &str, age: u32, rules: Value) -> Arc<Ingress> {
    ingress_with(
        ns,
        name,
        age,
        json!({ "ingressClassName": "holdfast", "rules": rules }),
    )
}

fn ingress_with(ns: &str, name: &str, age: u32, spec: Value) -> Arc<Ingress> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {
                "namespace": ns, "name": name,
                "creationTimestamp": format!("2026-01-01T00:00:{:02}Z", age)
            },
            "spec": spec
        }))
        .unwrap(),
    )
}

fn rule(host: &str, path: &str, path_type: &str, svc: &str, port: Value) -> Value {
    json!({
        "host": host,
        "http": { "paths": [{
            "path": path, "pathType": path_type,
            "backend": { "service": { "name": svc, "port": port } }
        }]}
    })
}

fn service(ns: &str, name: &str, ports: Value) -> Arc<Service> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": { "namespace": ns, "name": name },
            "spec": { "ports": ports }
        }))
        .unwrap(),
    )
}

fn slice(ns: &str, name: &str, svc: &str, ports: Value, endpoints: Value) -> Arc<EndpointSlice> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": { "namespace": ns, "name": name,
                          "labels": { SERVICE_NAME_LABEL: svc } },
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints
        }))
        .unwrap(),
    )
}

fn ready(addr: &str) -> Value {
    json!({ "addresses": [addr], "conditions": { "ready": true } })
}

/// Service `web` (port 80 "http" → 8080) with two ready endpoints, in namespace `ns`.
fn web(ns: &str) -> (Arc<Service>, Arc<EndpointSlice>) {
    (
        service(
            ns,
            "web",
            json!([{ "name": "http", "port": 80, "targetPort": 8080 }]),
        ),
        slice(
            ns,
            "web-1",
            "web",
            json!([{ "name": "http", "port": 8080 }]),
            json!([ready("10.0.0.2"), ready("10.0.0.1")]),
        ),
    )
}

fn state(ingresses: Vec<Arc<Ingress>>) -> ClusterState {
    let (svc, eps) = web("default");
    ClusterState {
        ingress_classes: vec![ours()],
        ingresses,
        services: vec![svc],
        endpoint_slices: vec![eps],
    }
}

/// Translates, checking on the way that the content hash the translator computed while
/// building is the snapshot's content hash, and that a long-lived translator (digests
/// remembered from an earlier build of other objects) gives the same result.
fn run(state: &ClusterState) -> Translation {
    let t = translate(state, &Options::default());
    assert_eq!(
        t.snapshot.content_hash,
        holdfast_proto::snapshot::content_hash(&t.snapshot)
    );
    let mut warm = Translator::default();
    warm.translate(&self::state(vec![]), &Options::default());
    let again = warm.translate(state, &Options::default());
    assert_eq!(again.snapshot, t.snapshot);
    assert_eq!(again.problems, t.problems);
    t
}

/// (host, kind, path, backend) of every route, in snapshot order.
fn routes(t: &Translation) -> Vec<(String, MatchKind, String, String)> {
    t.snapshot
        .virtual_hosts
        .iter()
        .flat_map(|v| {
            v.routes.iter().map(move |r| {
                (
                    v.host.clone(),
                    MatchKind::try_from(r.match_kind).unwrap(),
                    r.path.clone(),
                    r.backend.clone(),
                )
            })
        })
        .collect()
}

fn backend<'a>(t: &'a Translation, name: &str) -> &'a Backend {
    t.snapshot
        .backends
        .iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("no backend {name} in {:?}", t.snapshot.backends))
}

fn r(
    host: &str,
    kind: MatchKind,
    path: &str,
    backend: &str,
) -> (String, MatchKind, String, String) {
    (host.into(), kind, path.into(), backend.into())
}

#[test]
fn service_port_by_number_resolves_to_ready_endpoints_on_the_target_port() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([rule(
            "a.example.com",
            "/",
            "Prefix",
            "web",
            json!({"number": 80})
        )]),
    )]));
    assert_eq!(
        routes(&t),
        [r("a.example.com", MatchKind::Prefix, "/", "default/web:80")]
    );
    let b = backend(&t, "default/web:80");
    let eps: Vec<_> = b
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.port))
        .collect();
    assert_eq!(
        eps,
        [("10.0.0.1", 8080), ("10.0.0.2", 8080)],
        "sorted, on the slice's port"
    );
    assert!(b.unavailable_reason.is_empty());
    assert!(t.problems.is_empty());
}

#[test]
fn service_port_by_name_resolves_like_by_number() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([rule(
            "a.example.com",
            "/",
            "Prefix",
            "web",
            json!({"name": "http"})
        )]),
    )]));
    let b = backend(&t, "default/web:http");
    assert_eq!(b.endpoints.len(), 2);
    assert_eq!(b.endpoints[0].port, 8080);
}

#[test]
fn named_target_ports_are_resolved_per_slice() {
    let svc = service(
        "default",
        "api",
        json!([{ "name": "http", "port": 80, "targetPort": "web" }]),
    );
    // Two slices whose pods expose the named port on different numbers.
    let s1 = slice(
        "default",
        "api-1",
        "api",
        json!([{ "name": "http", "port": 8080 }]),
        json!([ready("10.0.1.1")]),
    );
    let s2 = slice(
        "default",
        "api-2",
        "api",
        json!([{ "name": "http", "port": 9090 }]),
        json!([ready("10.0.1.2")]),
    );
    let st = ClusterState {
        ingress_classes: vec![ours()],
        ingresses: vec![ingress(
            "default",
            "a",
            0,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "api",
                json!({"number": 80})
            )]),
        )],
        services: vec![svc],
        endpoint_slices: vec![s1, s2],
    };
    let t = run(&st);
    let eps: Vec<_> = backend(&t, "default/api:80")
        .endpoints
        .iter()
        .map(|e| (e.address.clone(), e.port))
        .collect();
    assert_eq!(
        eps,
        [
            ("10.0.1.1".to_string(), 8080),
            ("10.0.1.2".to_string(), 9090)
        ]
    );
}

#[test]
fn numeric_target_port_is_used_when_the_slice_has_no_port_of_that_name() {
    let svc = service(
        "default",
        "api",
        json!([{ "port": 80, "targetPort": 7070 }]),
    );
    let s = slice(
        "default",
        "api-1",
        "api",
        json!([{ "name": "other", "port": 1 }]),
        json!([ready("10.0.1.1")]),
    );
    let st = ClusterState {
        ingress_classes: vec![ours()],
        ingresses: vec![ingress(
            "default",
            "a",
            0,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "api",
                json!({"number": 80})
            )]),
        )],
        services: vec![svc],
        endpoint_slices: vec![s],
    };
    let t = run(&st);
    assert_eq!(backend(&t, "default/api:80").endpoints[0].port, 7070);
}

#[test]
fn only_ready_endpoints_are_used_and_unset_ready_counts_as_ready() {
    let svc = service("default", "api", json!([{ "name": "http", "port": 80 }]));
    let s = slice(
        "default",
        "api-1",
        "api",
        json!([{ "name": "http", "port": 80 }]),
        json!([
            { "addresses": ["10.0.1.1"], "conditions": { "ready": false } },
            { "addresses": ["10.0.1.2"], "conditions": {} },
            { "addresses": ["10.0.1.3"], "conditions": { "ready": true }, "zone": "z1" }
        ]),
    );
    let st = ClusterState {
        ingress_classes: vec![ours()],
        ingresses: vec![ingress(
            "default",
            "a",
            0,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "api",
                json!({"number": 80})
            )]),
        )],
        services: vec![svc],
        endpoint_slices: vec![s],
    };
    let t = run(&st);
    let eps = &backend(&t, "default/api:80").endpoints;
    let addrs: Vec<_> = eps.iter().map(|e| e.address.as_str()).collect();
    assert_eq!(addrs, ["10.0.1.2", "10.0.1.3"]);
    assert_eq!(eps[1].zone, "z1");
}

#[test]
fn a_missing_service_keeps_the_route_with_an_unavailable_backend() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([rule(
            "a.example.com",
            "/",
            "Prefix",
            "gone",
            json!({"number": 80})
        )]),
    )]));
    assert_eq!(
        routes(&t),
        [r(
            "a.example.com",
            MatchKind::Prefix,
            "/",
            "default/gone:80"
        )]
    );
    let b = backend(&t, "default/gone:80");
    assert!(b.endpoints.is_empty());
    assert_eq!(b.unavailable_reason, "service default/gone not found");
}

#[test]
fn a_service_without_ready_endpoints_or_the_port_keeps_the_route_and_says_why() {
    let st = ClusterState {
        services: vec![service("default", "idle", json!([{ "port": 80 }]))],
        ingress_classes: vec![ours()],
        ingresses: vec![ingress(
            "default",
            "a",
            0,
            json!([
                rule(
                    "a.example.com",
                    "/",
                    "Prefix",
                    "idle",
                    json!({"number": 80})
                ),
                rule(
                    "b.example.com",
                    "/",
                    "Prefix",
                    "idle",
                    json!({"number": 81})
                )
            ]),
        )],
        endpoint_slices: vec![],
    };
    let t = run(&st);
    assert_eq!(routes(&t).len(), 2);
    assert_eq!(
        backend(&t, "default/idle:80").unavailable_reason,
        "no ready endpoints for service default/idle"
    );
    assert_eq!(
        backend(&t, "default/idle:81").unavailable_reason,
        "service default/idle has no port 81"
    );
}

#[test]
fn external_name_services_resolve_to_their_dns_name() {
    let svc: Arc<Service> = Arc::new(
        serde_json::from_value(json!({
            "metadata": { "namespace": "default", "name": "ext" },
            "spec": { "type": "ExternalName", "externalName": "API.Example.org",
                      "ports": [{ "name": "https", "port": 443 }] }
        }))
        .unwrap(),
    );
    let st = ClusterState {
        services: vec![svc],
        ingress_classes: vec![ours()],
        ingresses: vec![ingress(
            "default",
            "a",
            0,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "ext",
                json!({"name": "https"})
            )]),
        )],
        endpoint_slices: vec![],
    };
    let t = run(&st);
    let b = backend(&t, "default/ext:https");
    assert_eq!(
        (b.external_name.as_str(), b.external_port),
        ("api.example.org", 443)
    );
    assert!(b.unavailable_reason.is_empty());
}

#[test]
fn ingress_class_selection() {
    let mine = |name: &str, spec: Value| ingress_with("default", name, 0, spec);
    let rules = json!([rule(
        "x.example.com",
        "/",
        "Prefix",
        "web",
        json!({"number": 80})
    )]);
    let ingresses = vec![
        mine(
            "named-ours",
            json!({ "ingressClassName": "holdfast", "rules": rules }),
        ),
        mine(
            "named-other",
            json!({ "ingressClassName": "nginx", "rules": [rule("other.example.com", "/", "Prefix", "web", json!({"number": 80}))] }),
        ),
        mine(
            "unnamed",
            json!({ "rules": [rule("unnamed.example.com", "/", "Prefix", "web", json!({"number": 80}))] }),
        ),
    ];
    let mut legacy = (*mine("legacy", json!({ "rules": [rule("legacy.example.com", "/", "Prefix", "web", json!({"number": 80}))] }))).clone();
    legacy.metadata.annotations =
        Some([(LEGACY_CLASS_ANNOTATION.to_string(), "holdfast".to_string())].into());
    let mut all = ingresses.clone();
    all.push(Arc::new(legacy));

    let hosts = |t: &Translation| {
        t.snapshot
            .virtual_hosts
            .iter()
            .map(|v| v.host.clone())
            .collect::<Vec<_>>()
    };

    // Our class is not the default: only Ingresses naming it are ours.
    let mut st = state(all.clone());
    st.ingress_classes = vec![ours(), class("nginx", "k8s.io/ingress-nginx", true)];
    assert_eq!(hosts(&run(&st)), ["legacy.example.com", "x.example.com"]);

    // Our class is the cluster default: Ingresses naming no class are ours too.
    st.ingress_classes = vec![
        class("holdfast", "holdfast.dev/ingress-controller", true),
        class("nginx", "k8s.io/ingress-nginx", false),
    ];
    assert_eq!(
        hosts(&run(&st)),
        ["legacy.example.com", "unnamed.example.com", "x.example.com"]
    );

    // A class named like ours but with another controller is not ours.
    st.ingress_classes = vec![class("holdfast", "example.com/other", true)];
    assert!(hosts(&run(&st)).is_empty());

    // --ingress-class narrows to one of our classes.
    st.ingress_classes = vec![
        ours(),
        class(
            "holdfast-internal",
            "holdfast.dev/ingress-controller",
            false,
        ),
    ];
    let narrowed = Options {
        ingress_class: Some("holdfast-internal".into()),
        ..Options::default()
    };
    assert!(translate(&st, &narrowed).snapshot.virtual_hosts.is_empty());
}

#[test]
fn hosts_are_lower_cased_and_wildcards_and_hostless_rules_kept() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([
            rule("A.Example.COM", "/", "Prefix", "web", json!({"number": 80})),
            rule("*.example.com", "/", "Prefix", "web", json!({"number": 80})),
            { "http": { "paths": [{ "path": "/", "pathType": "Prefix",
                "backend": { "service": { "name": "web", "port": { "number": 80 } } } }] } }
        ]),
    )]));
    let hosts: Vec<_> = t
        .snapshot
        .virtual_hosts
        .iter()
        .map(|v| v.host.as_str())
        .collect();
    assert_eq!(hosts, ["", "*.example.com", "a.example.com"]);
}

#[test]
fn an_invalid_host_skips_that_rule_only_with_a_problem() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([
            rule(
                "bad_host.example.com",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            ),
            rule(
                "good.example.com",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            )
        ]),
    )]));
    assert_eq!(
        routes(&t),
        [r(
            "good.example.com",
            MatchKind::Prefix,
            "/",
            "default/web:80"
        )]
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].reason, "InvalidHost");
    assert_eq!(
        (
            t.problems[0].namespace.as_str(),
            t.problems[0].name.as_str()
        ),
        ("default", "a")
    );
}

#[test]
fn path_types_exact_prefix_and_implementation_specific() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([{ "host": "a.example.com", "http": { "paths": [
            { "path": "/exact", "pathType": "Exact", "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
            { "path": "/foo/", "pathType": "Prefix", "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
            { "path": "/impl", "pathType": "ImplementationSpecific", "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
            { "path": "/", "pathType": "Prefix", "backend": { "service": { "name": "web", "port": { "number": 80 } } } }
        ]}}]),
    )]));
    assert_eq!(
        routes(&t),
        [
            r(
                "a.example.com",
                MatchKind::Exact,
                "/exact",
                "default/web:80"
            ),
            r(
                "a.example.com",
                MatchKind::Prefix,
                "/impl",
                "default/web:80"
            ),
            r("a.example.com", MatchKind::Prefix, "/foo", "default/web:80"),
            r("a.example.com", MatchKind::Prefix, "/", "default/web:80"),
        ],
        "Exact first, then longest prefix; trailing '/' of a Prefix dropped"
    );
}

#[test]
fn invalid_paths_are_skipped_with_a_problem_and_the_rest_kept() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([{ "host": "a.example.com", "http": { "paths": [
            { "path": "relative", "pathType": "Prefix", "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
            { "path": "/a b", "pathType": "Exact", "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
            { "path": "/x", "pathType": "Weird", "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
            { "path": "/ok", "pathType": "Exact", "backend": { "service": { "name": "web", "port": { "number": 80 } } } }
        ]}}]),
    )]));
    assert_eq!(
        routes(&t),
        [r(
            "a.example.com",
            MatchKind::Exact,
            "/ok",
            "default/web:80"
        )]
    );
    assert_eq!(t.problems.len(), 3);
    assert!(t.problems.iter().all(|p| p.reason == "InvalidPath"));
}

#[test]
fn rules_for_one_host_merge_across_ingresses() {
    let t = run(&state(vec![
        ingress(
            "default",
            "a",
            0,
            json!([rule(
                "a.example.com",
                "/a",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
        ingress(
            "default",
            "b",
            1,
            json!([rule(
                "a.example.com",
                "/b",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
    ]));
    assert_eq!(t.snapshot.virtual_hosts.len(), 1);
    let sources: Vec<_> = t.snapshot.virtual_hosts[0]
        .routes
        .iter()
        .map(|r| r.source.clone().unwrap().name)
        .collect();
    assert_eq!(sources, ["a", "b"]);
    assert!(t.problems.is_empty());
}

#[test]
fn a_true_conflict_goes_to_the_oldest_ingress_and_the_loser_gets_a_problem() {
    let (svc2, eps2) = (
        service("default", "web2", json!([{ "port": 80 }])),
        slice(
            "default",
            "web2-1",
            "web2",
            json!([{ "port": 80 }]),
            json!([ready("10.0.9.9")]),
        ),
    );
    let mut st = state(vec![
        // Listed first but created later: loses.
        ingress(
            "default",
            "newer",
            5,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "web2",
                json!({"number": 80})
            )]),
        ),
        ingress(
            "default",
            "older",
            1,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
    ]);
    st.services.push(svc2);
    st.endpoint_slices.push(eps2);
    let t = run(&st);
    assert_eq!(
        routes(&t),
        [r("a.example.com", MatchKind::Prefix, "/", "default/web:80")]
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        (t.problems[0].name.as_str(), t.problems[0].reason),
        ("newer", "ConflictingRoute")
    );
    assert!(
        t.problems[0].message.contains("default/older"),
        "{}",
        t.problems[0].message
    );
    // Unused backends of the loser are not in the snapshot.
    assert!(
        t.snapshot
            .backends
            .iter()
            .all(|b| b.name != "default/web2:80")
    );

    // Same age: namespace/name decides.
    let st = state(vec![
        ingress(
            "zzz",
            "a",
            1,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
        ingress(
            "aaa",
            "a",
            1,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
    ]);
    let t = run(&st);
    assert_eq!(
        t.snapshot.virtual_hosts[0].routes[0]
            .source
            .as_ref()
            .unwrap()
            .namespace,
        "aaa"
    );
    assert_eq!(t.problems[0].namespace, "zzz");
}

#[test]
fn default_backend_of_the_oldest_ingress_wins() {
    let db = |svc: &str| json!({ "ingressClassName": "holdfast", "defaultBackend": { "service": { "name": svc, "port": { "number": 80 } } } });
    let t = run(&state(vec![
        ingress_with("default", "later", 3, db("other")),
        ingress_with("default", "first", 1, db("web")),
    ]));
    let d = t
        .snapshot
        .default_backend
        .as_ref()
        .expect("default backend");
    assert_eq!(d.backend, "default/web:80");
    assert_eq!(d.source.as_ref().unwrap().name, "first");
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].reason, "ConflictingDefaultBackend");
    assert!(backend(&t, "default/web:80").endpoints.len() == 2);
}

#[test]
fn resource_backends_are_skipped_with_a_problem() {
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([{ "host": "a.example.com", "http": { "paths": [
            { "path": "/", "pathType": "Prefix", "backend": { "resource": { "apiGroup": "x", "kind": "Bucket", "name": "b" } } }
        ]}}]),
    )]));
    assert!(routes(&t).is_empty());
    assert_eq!(t.problems[0].reason, "InvalidBackend");
}

#[test]
fn translation_is_deterministic_whatever_the_input_order() {
    let ingresses = vec![
        ingress(
            "default",
            "a",
            0,
            json!([rule(
                "a.example.com",
                "/a",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
        ingress(
            "default",
            "b",
            1,
            json!([rule(
                "b.example.com",
                "/b",
                "Exact",
                "web",
                json!({"name": "http"})
            )]),
        ),
        ingress(
            "other",
            "c",
            2,
            json!([rule(
                "a.example.com",
                "/c",
                "Prefix",
                "gone",
                json!({"number": 80})
            )]),
        ),
    ];
    let forward = run(&state(ingresses.clone()));
    let mut reversed = ingresses;
    reversed.reverse();
    let mut st = state(reversed);
    st.endpoint_slices.iter_mut().for_each(|s| {
        let mut rev = (**s).clone();
        rev.endpoints.reverse();
        *s = Arc::new(rev);
    });
    let backward = run(&st);
    assert_eq!(forward.snapshot, backward.snapshot);
    assert_eq!(
        holdfast_proto::snapshot::content_hash(&forward.snapshot),
        holdfast_proto::snapshot::content_hash(&backward.snapshot)
    );
}

#[test]
fn every_translated_snapshot_is_consistent() {
    let mut t = run(&state(vec![
        ingress(
            "default",
            "a",
            0,
            json!([rule(
                "a.example.com",
                "/",
                "Prefix",
                "gone",
                json!({"number": 80})
            )]),
        ),
        ingress(
            "default",
            "b",
            1,
            json!([rule(
                "b.example.com",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
    ]));
    holdfast_proto::snapshot::seal(&mut t.snapshot, 1);
    assert_eq!(holdfast_proto::snapshot::validate(&t.snapshot), Ok(()));
}

/// A small deterministic generator (xorshift), so the sequence below is the same on
/// every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

fn random_ingress(rng: &mut Rng, i: usize) -> Arc<Ingress> {
    let ns = ["default", "other"][i % 2];
    let mut rules = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let port = if rng.below(2) == 0 {
            let number = [80, 8080][rng.below(2)];
            json!({ "number": number })
        } else {
            json!({ "name": "http" })
        };
        rules.push(rule(
            rng.pick(&[
                "a.example.com",
                "B.example.com",
                "*.example.com",
                "",
                "bad_host",
            ]),
            rng.pick(&["/", "/api", "/api/", "/api/v1", "no-slash"]),
            rng.pick(&["Exact", "Prefix", "ImplementationSpecific"]),
            rng.pick(&["web", "api", "db"]),
            port,
        ));
    }
    let mut spec = json!({ "rules": rules });
    match rng.below(4) {
        0 => {}
        1 => spec["ingressClassName"] = json!("other"),
        _ => spec["ingressClassName"] = json!("holdfast"),
    }
    if rng.below(4) == 0 {
        spec["defaultBackend"] = json!({ "service": {
            "name": rng.pick(&["web", "api"]), "port": { "number": 80 } } });
    }
    // Few distinct ages, so ties (broken by namespace and name) are common.
    ingress_with(ns, &format!("ing-{i}"), rng.below(3) as u32, spec)
}

fn random_service(rng: &mut Rng, name: &str, ns: &str) -> Arc<Service> {
    if name == "db" && rng.below(2) == 0 {
        return Arc::new(
            serde_json::from_value(json!({
                "metadata": { "namespace": ns, "name": name },
                "spec": { "type": "ExternalName", "externalName": "DB.example.net",
                          "ports": [{ "name": "http", "port": 5432 }] }
            }))
            .unwrap(),
        );
    }
    let target = if rng.below(2) == 0 {
        json!(8080)
    } else {
        json!("http")
    };
    let port = [80, 8080][rng.below(2)];
    service(
        ns,
        name,
        json!([{ "name": "http", "port": port, "targetPort": target }]),
    )
}

fn random_slice(rng: &mut Rng, name: &str, ns: &str, n: usize) -> Arc<EndpointSlice> {
    let endpoints: Vec<Value> = (0..rng.below(4))
        .map(|h| {
            json!({ "addresses": [format!("10.0.{n}.{h}")],
                    "conditions": { "ready": rng.below(3) != 0 } })
        })
        .collect();
    let port = [8080, 9090][rng.below(2)];
    slice(
        ns,
        &format!("{name}-{n}"),
        name,
        json!([{ "name": "http", "port": port }]),
        json!(endpoints),
    )
}

#[test]
fn a_long_lived_translator_builds_what_a_fresh_one_builds_after_every_change() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let opts = Options::default();
    let mut st = ClusterState {
        ingress_classes: vec![ours()],
        ..Default::default()
    };
    let mut translator = Translator::default();
    let (mut with_routes, mut with_problems) = (0, 0);
    for step in 0..400 {
        match rng.below(10) {
            0..=2 => {
                let i = rng.below(8);
                let ing = random_ingress(&mut rng, i);
                let name = ing.metadata.name.clone();
                let ns = ing.metadata.namespace.clone();
                st.ingresses
                    .retain(|o| (&o.metadata.name, &o.metadata.namespace) != (&name, &ns));
                st.ingresses.push(ing);
            }
            3 if !st.ingresses.is_empty() => {
                let i = rng.below(st.ingresses.len());
                st.ingresses.remove(i);
            }
            4 => {
                let (name, ns) = (
                    rng.pick(&["web", "api", "db"]),
                    rng.pick(&["default", "other"]),
                );
                st.services.retain(|o| {
                    (o.metadata.name.as_deref(), o.metadata.namespace.as_deref())
                        != (Some(name), Some(ns))
                });
                if rng.below(4) != 0 {
                    st.services.push(random_service(&mut rng, name, ns));
                }
            }
            5 | 6 => {
                let (name, ns, n) = (
                    rng.pick(&["web", "api"]),
                    rng.pick(&["default", "other"]),
                    rng.below(2),
                );
                let slice_name = format!("{name}-{n}");
                st.endpoint_slices.retain(|o| {
                    (o.metadata.name.as_deref(), o.metadata.namespace.as_deref())
                        != (Some(slice_name.as_str()), Some(ns))
                });
                if rng.below(4) != 0 {
                    st.endpoint_slices.push(random_slice(&mut rng, name, ns, n));
                }
            }
            7 => {
                // The same content in a new object: nothing may change.
                if let Some(o) = st.ingresses.first_mut() {
                    *o = Arc::new((**o).clone());
                }
            }
            8 => {
                // Which classes are ours changes: the default class flips.
                let default = rng.below(2) == 0;
                st.ingress_classes = vec![class(
                    "holdfast",
                    "holdfast.dev/ingress-controller",
                    default,
                )];
            }
            _ => {
                // Cache order is arbitrary.
                let n = st.ingresses.len();
                if n > 1 {
                    st.ingresses.swap(rng.below(n), rng.below(n));
                }
            }
        }
        let fresh = translate(&st, &opts);
        let warm = translator.translate(&st, &opts);
        assert_eq!(
            warm.snapshot, fresh.snapshot,
            "snapshot differs at step {step}"
        );
        assert_eq!(
            warm.problems, fresh.problems,
            "problems differ at step {step}"
        );
        assert_eq!(
            warm.snapshot.content_hash,
            holdfast_proto::snapshot::content_hash(&warm.snapshot),
            "content hash at step {step}"
        );
        let mut sealed = warm.snapshot.clone();
        holdfast_proto::snapshot::seal(&mut sealed, 1);
        assert_eq!(
            holdfast_proto::snapshot::validate(&sealed),
            Ok(()),
            "step {step}"
        );
        with_routes += usize::from(!warm.snapshot.virtual_hosts.is_empty());
        with_problems += usize::from(!warm.problems.is_empty());
    }
    // The sequence exercised routes and problems, not only empty snapshots.
    assert!(with_routes > 200, "{with_routes}");
    assert!(with_problems > 100, "{with_problems}");
}

#[test]
fn a_port_name_made_of_digits_is_skipped_with_a_problem_and_the_rest_kept() {
    // The API server refuses such names; refusing them here keeps every backend name
    // (`ns/service:port`) naming exactly one (Service, port) pair.
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([
            rule(
                "a.example.com",
                "/digits",
                "Prefix",
                "web",
                json!({ "name": "80" })
            ),
            rule(
                "a.example.com",
                "/",
                "Prefix",
                "web",
                json!({ "number": 80 })
            ),
        ]),
    )]));
    assert_eq!(
        routes(&t),
        vec![r("a.example.com", MatchKind::Prefix, "/", "default/web:80")]
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].reason, "InvalidBackend");
    assert!(
        t.problems[0].message.contains("not a port name"),
        "{}",
        t.problems[0].message
    );
}
