//! One test per translation rule; each fails if its rule is removed.

use std::sync::Arc;

use holdfast_proto::v1::MatchKind;
use serde_json::{Value, json};

use super::resolve::refused_address;
use super::*;
use crate::gateway_api::HttpRoute;

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
        ..Default::default()
    }
}

/// Translates, checking on the way that the content hash the translator computed while
/// building is the snapshot's content hash, and that a long-lived translator (digests
/// remembered from an earlier build of other objects) gives the same result.
fn run(state: &ClusterState) -> Translation {
    run_with(state, &Options::default())
}

fn run_with(state: &ClusterState, opts: &Options) -> Translation {
    let t = translate(state, opts);
    assert_eq!(
        t.snapshot().content_hash,
        holdfast_proto::snapshot::content_hash(&t.snapshot())
    );
    let mut warm = Translator::default();
    warm.translate(&self::state(vec![]), opts);
    let again = warm.translate(state, opts);
    assert_eq!(again.snapshot(), t.snapshot());
    assert_eq!(again.problems, t.problems);
    t
}

/// (host, kind, path, backend) of every route, in snapshot order.
fn routes(t: &Translation) -> Vec<(String, MatchKind, String, String)> {
    holdfast_proto::snapshot::ingress_hosts(&t.snapshot())
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
    t.content
        .backend(name)
        .unwrap_or_else(|| panic!("no backend {name} in {:?}", t.content.backends))
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
        ..Default::default()
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
        ..Default::default()
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
        ..Default::default()
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
        ..Default::default()
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
fn external_name_services_resolve_to_their_dns_name_only_when_allowed() {
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
        ..Default::default()
    };
    let allowed = Options {
        allow_external_name: true,
        ..Options::default()
    };
    let t = run_with(&st, &allowed);
    let b = backend(&t, "default/ext:https");
    assert_eq!(
        (b.external_name.as_str(), b.external_port),
        ("api.example.org", 443)
    );
    assert!(b.unavailable_reason.is_empty());
    assert!(t.problems.is_empty());

    // Off by default: 503, and the Ingress hears why.
    let t = run(&st);
    let b = backend(&t, "default/ext:https");
    assert!(b.external_name.is_empty());
    assert_eq!(
        b.unavailable_reason,
        "ExternalName service default/ext is not allowed (--allow-external-name is off)"
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        (t.problems[0].reason.as_str(), t.problems[0].name.as_str()),
        ("ExternalNameDisabled", "a")
    );
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
        holdfast_proto::snapshot::ingress_hosts(&t.snapshot())
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
    assert!(
        holdfast_proto::snapshot::ingress_hosts(&translate(&st, &narrowed).snapshot()).is_empty()
    );
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
    // Sent in the one route model: Gateway hosts of listener `ingress`.
    assert!(t.content.virtual_hosts.is_empty());
    let hosts: Vec<_> = t
        .content
        .gateway_hosts
        .iter()
        .map(|g| (g.listener.as_str(), g.host.as_str()))
        .collect();
    assert_eq!(
        hosts,
        [
            ("ingress", ""),
            ("ingress", "*.example.com"),
            ("ingress", "a.example.com")
        ]
    );
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
    assert_eq!(t.problems[0].reason.as_str(), "InvalidHost");
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
    assert_eq!(
        holdfast_proto::snapshot::ingress_hosts(&t.snapshot()).len(),
        1
    );
    let sources: Vec<_> = holdfast_proto::snapshot::ingress_hosts(&t.snapshot())[0]
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
        (t.problems[0].name.as_str(), t.problems[0].reason.as_str()),
        ("newer", "ConflictingRoute")
    );
    assert!(
        t.problems[0].message.contains("default/older"),
        "{}",
        t.problems[0].message
    );
    // Unused backends of the loser are not in the snapshot.
    assert!(
        t.snapshot()
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
        holdfast_proto::snapshot::ingress_hosts(&t.snapshot())[0].routes[0]
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
    let d = t.content.default_backend.as_ref().expect("default backend");
    assert_eq!(d.backend, "default/web:80");
    assert_eq!(d.source.as_ref().unwrap().name, "first");
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].reason.as_str(), "ConflictingDefaultBackend");
    assert!(backend(&t, "default/web:80").endpoints.len() == 2);
}

#[test]
fn only_listed_namespaces_may_set_the_default_backend() {
    let db = |svc: &str| json!({ "ingressClassName": "holdfast", "defaultBackend": { "service": { "name": svc, "port": { "number": 80 } } } });
    let st = state(vec![
        ingress_with("tenant", "catch-all", 1, db("web")),
        ingress_with("edge", "fallback", 3, db("web")),
    ]);
    let opts = Options {
        default_backend_namespaces: Some(["edge".to_owned()].into()),
        ..Options::default()
    };
    let t = run_with(&st, &opts);
    let d = t.content.default_backend.as_ref().expect("default backend");
    assert_eq!(d.source.as_ref().unwrap().namespace, "edge");
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        (
            t.problems[0].reason.as_str(),
            t.problems[0].namespace.as_str()
        ),
        ("DefaultBackendNotAllowed", "tenant")
    );
    let only_tenant = state(vec![ingress_with("tenant", "catch-all", 1, db("web"))]);
    let t = run_with(&only_tenant, &opts);
    assert_eq!(
        t.snapshot().default_backend,
        None,
        "unmatched requests get 404"
    );
}

/// Rules without a host catch every host no rule names, as a default backend does: the
/// same `--default-backend-namespaces` policy decides who may add them.
#[test]
fn only_listed_namespaces_may_add_rules_without_a_host() {
    let hostless = |ns: &str, name: &str, path: &str| {
        ingress(
            ns,
            name,
            1,
            json!([{ "http": { "paths": [{ "path": path, "pathType": "Prefix",
                "backend": { "service": { "name": "web", "port": { "number": 80 } } } }] } }]),
        )
    };
    let st = state(vec![
        hostless("tenant", "grab-all", "/"),
        hostless("edge", "fallback", "/edge"),
    ]);
    let opts = Options {
        default_backend_namespaces: Some(["edge".to_owned()].into()),
        ..Options::default()
    };
    let t = run_with(&st, &opts);
    assert_eq!(
        routes(&t),
        [r("", MatchKind::Prefix, "/edge", "edge/web:80")]
    );
    assert_eq!(
        t.problems
            .iter()
            .map(|p| (p.reason.as_str(), p.namespace.as_str()))
            .collect::<Vec<_>>(),
        [("HostlessRuleNotAllowed", "tenant")]
    );
    // Without the policy every namespace may (as the Ingress spec expects).
    assert_eq!(routes(&run(&st)).len(), 2);
}

/// Endpoint addresses that point at the proxy itself or at the node (loopback,
/// link-local such as a metadata service, unspecified, multicast) are left out, with a
/// problem on the Ingresses that route there; the other endpoints serve.
#[test]
fn endpoint_addresses_that_point_at_the_proxy_or_the_node_are_left_out_with_a_problem() {
    let mut st = state(vec![ingress(
        "default",
        "site",
        0,
        json!([rule("a.test", "/", "Prefix", "web", json!({"number": 80}))]),
    )]);
    st.endpoint_slices = vec![slice(
        "default",
        "web-1",
        "web",
        json!([{ "name": "http", "port": 8080 }]),
        json!([
            ready("127.0.0.1"),
            ready("169.254.169.254"),
            ready("0.0.0.0"),
            ready("224.0.0.1"),
            ready("10.0.0.5")
        ]),
    )];
    let t = run(&st);
    let b = backend(&t, "default/web:80");
    let addresses: Vec<&str> = b.endpoints.iter().map(|e| e.address.as_str()).collect();
    assert_eq!(addresses, ["10.0.0.5"]);
    assert_eq!(reasons(&t), ["RefusedEndpointAddress"]);
    assert_eq!(t.problems[0].name, "site");
    for refused in [
        "::1",
        "fe80::1",
        "::",
        "::ffff:127.0.0.1",
        "ff02::1",
        "255.255.255.255",
    ] {
        assert!(refused_address(refused), "{refused}");
    }
    for fine in ["10.0.0.5", "2001:db8::1", "fd00::1", "192.168.1.1"] {
        assert!(!refused_address(fine), "{fine}");
    }
}

/// An endpoint that is one of the proxies' own pods (the `--publish-service` Service's
/// endpoints) would send the proxies to themselves: it is left out, with the problem,
/// and a long-lived translator follows the proxies' pods as they change.
#[test]
fn an_endpoint_that_is_one_of_the_proxies_own_pods_is_left_out() {
    let mut st = state(vec![ingress(
        "default",
        "site",
        0,
        json!([rule("a.test", "/", "Prefix", "web", json!({"number": 80}))]),
    )]);
    let proxies = |addresses: &[&str]| {
        slice(
            "edge",
            "proxy-1",
            "proxy",
            json!([{ "name": "http", "port": 8080 }]),
            Value::Array(addresses.iter().map(|a| ready(a)).collect()),
        )
    };
    st.endpoint_slices.push(proxies(&["10.0.0.2"]));
    let opts = Options {
        proxy_service: Some("edge/proxy".into()),
        ..Options::default()
    };
    let mut long_lived = Translator::default();
    let t = long_lived.translate(&st, &opts);
    assert_eq!(t.snapshot(), run_with(&st, &opts).snapshot());
    let addresses = |t: &Translation| -> Vec<String> {
        backend(t, "default/web:80")
            .endpoints
            .iter()
            .map(|e| e.address.clone())
            .collect()
    };
    assert_eq!(addresses(&t), ["10.0.0.1"], "10.0.0.2 is a proxy");
    assert_eq!(reasons(&t), ["RefusedEndpointAddress"]);
    // The proxy pod moves: the web pod at 10.0.0.2 serves again.
    st.endpoint_slices.pop();
    st.endpoint_slices.push(proxies(&["10.0.0.9"]));
    let t = long_lived.translate(&st, &opts);
    assert_eq!(t.snapshot(), run_with(&st, &opts).snapshot());
    assert_eq!(addresses(&t), ["10.0.0.1", "10.0.0.2"]);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    // Without --publish-service nothing is known of the proxies' pods.
    assert_eq!(addresses(&run(&st)).len(), 2);
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
    assert_eq!(t.problems[0].reason.as_str(), "InvalidBackend");
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
    assert_eq!(forward.snapshot(), backward.snapshot());
    assert_eq!(
        holdfast_proto::snapshot::content_hash(&forward.snapshot()),
        holdfast_proto::snapshot::content_hash(&backward.snapshot())
    );
}

#[test]
fn every_translated_snapshot_is_consistent() {
    let t = run(&state(vec![
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
    let mut s = t.snapshot();
    holdfast_proto::snapshot::seal(&mut s, 1);
    assert_eq!(holdfast_proto::snapshot::validate(&s), Ok(()));
}

/// What the translator reports alongside a build, kept one change at a time, must be
/// what the whole snapshots say: the names whose resource differs from the previous
/// build's (the change list deltas are made from), the encoded length and the route
/// counts.
fn check_incremental(previous: Option<&Snapshot>, t: &Translation, step: usize) {
    let now = t.snapshot();
    let whole = Content::of(&now);
    assert_eq!(
        t.content.resources_len, whole.resources_len,
        "length at step {step}"
    );
    assert_eq!(
        t.content.routes, whole.routes,
        "route counts at step {step}"
    );
    let Some(previous) = previous else {
        assert!(
            t.since.is_none(),
            "a first build has nothing to differ from"
        );
        return;
    };
    let since = t.since.as_ref().expect("a later build says what changed");
    assert_eq!(since.content_hash, previous.content_hash, "step {step}");
    let want = Changed::between(previous, &now);
    assert_eq!(since.changed, want, "change list at step {step}");
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
    long_lived_builds_what_fresh_builds(Options::default());
}

#[test]
fn a_long_lived_translator_builds_what_a_fresh_one_builds_with_external_names_allowed() {
    long_lived_builds_what_fresh_builds(Options {
        allow_external_name: true,
        ..Options::default()
    });
}

fn long_lived_builds_what_fresh_builds(opts: Options) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut st = ClusterState {
        ingress_classes: vec![ours()],
        ..Default::default()
    };
    let mut translator = Translator::default();
    let (mut with_routes, mut with_problems) = (0, 0);
    let mut previous: Option<Snapshot> = None;
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
            warm.snapshot(),
            fresh.snapshot(),
            "snapshot differs at step {step}"
        );
        assert_eq!(
            warm.problems, fresh.problems,
            "problems differ at step {step}"
        );
        assert_eq!(
            warm.snapshot().content_hash,
            holdfast_proto::snapshot::content_hash(&warm.snapshot()),
            "content hash at step {step}"
        );
        let mut sealed = warm.snapshot().clone();
        holdfast_proto::snapshot::seal(&mut sealed, 1);
        assert_eq!(
            holdfast_proto::snapshot::validate(&sealed),
            Ok(()),
            "step {step}"
        );
        with_routes +=
            usize::from(!holdfast_proto::snapshot::ingress_hosts(&warm.snapshot()).is_empty());
        with_problems += usize::from(!warm.problems.is_empty());
        check_incremental(previous.as_ref(), &warm, step);
        previous = Some(warm.snapshot());
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
    assert_eq!(t.problems[0].reason.as_str(), "InvalidBackend");
    assert!(
        t.problems[0].message.contains("not a port name"),
        "{}",
        t.problems[0].message
    );
}

// ---------------------------------------------------------------------------------------
// TLS

/// A self-signed certificate for `sans` and its key, as PEM.
fn cert_pem(sans: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

fn tls_secret(ns: &str, name: &str, chain: &str, key: &str) -> Arc<Secret> {
    use k8s_openapi::ByteString;
    let mut s = Secret::default();
    s.metadata.namespace = Some(ns.into());
    s.metadata.name = Some(name.into());
    s.type_ = Some(TLS_SECRET_TYPE.into());
    s.data = Some(
        [
            ("tls.crt".to_string(), ByteString(chain.as_bytes().to_vec())),
            ("tls.key".to_string(), ByteString(key.as_bytes().to_vec())),
        ]
        .into(),
    );
    Arc::new(s)
}

/// An Ingress routing each of `hosts` to web:80, with one spec.tls entry naming `secret`
/// for `tls_hosts`, and `annotations`.
fn tls_ingress(
    name: &str,
    age: u32,
    hosts: &[&str],
    tls_hosts: &[&str],
    secret: &str,
    annotations: Value,
) -> Arc<Ingress> {
    let rules: Vec<Value> = hosts
        .iter()
        .map(|h| rule(h, "/", "Prefix", "web", json!({ "number": 80 })))
        .collect();
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {
                "namespace": "default", "name": name, "annotations": annotations,
                "creationTimestamp": format!("2026-01-01T00:00:{:02}Z", age)
            },
            "spec": {
                "ingressClassName": "holdfast",
                "rules": rules,
                "tls": [{ "hosts": tls_hosts, "secretName": secret }]
            }
        }))
        .unwrap(),
    )
}

fn with_secrets(ingresses: Vec<Arc<Ingress>>, secrets: Vec<Arc<Secret>>) -> ClusterState {
    let mut st = state(ingresses);
    st.secrets = secrets;
    st
}

/// (host, certificate, redirect) of every virtual host.
fn tls_of(t: &Translation) -> Vec<(String, String, bool)> {
    holdfast_proto::snapshot::ingress_hosts(&t.snapshot())
        .iter()
        .map(|v| (v.host.clone(), v.certificate.clone(), v.ssl_redirect))
        .collect()
}

fn reasons(t: &Translation) -> Vec<&'static str> {
    t.problems.iter().map(|p| p.reason.as_str()).collect()
}

#[test]
fn a_tls_host_gets_its_secrets_certificate_once_and_a_redirect_and_keys_stay_in_the_hash() {
    let (chain, key) = cert_pem(&["a.example.test", "b.example.test"]);
    let st = with_secrets(
        vec![tls_ingress(
            "web",
            1,
            &["a.example.test", "b.example.test", "plain.example.test"],
            &["a.example.test", "b.example.test"],
            "site",
            json!({}),
        )],
        vec![tls_secret("default", "site", &chain, &key)],
    );
    let t = run(&st);
    assert_eq!(
        tls_of(&t),
        [
            ("a.example.test".into(), "default/site".into(), true),
            ("b.example.test".into(), "default/site".into(), true),
            ("plain.example.test".into(), String::new(), false),
        ]
    );
    assert_eq!(t.snapshot().certificates.len(), 1);
    let c = &t.snapshot().certificates[0];
    assert_eq!(c.name, "default/site");
    assert_eq!(c.private_key, key.as_bytes());
    assert_eq!(c.dns_names, ["a.example.test", "b.example.test"]);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(
        t.certificate_users,
        [(
            "default/site".to_string(),
            IngressRef {
                namespace: "default".into(),
                name: "web".into()
            }
        )]
    );
    // The hash covers the key: another key (and certificate) is another snapshot.
    let (chain2, key2) = cert_pem(&["a.example.test", "b.example.test"]);
    let mut st2 = st.clone();
    st2.secrets = vec![tls_secret("default", "site", &chain2, &key2)];
    assert_ne!(run(&st2).snapshot().content_hash, t.snapshot().content_hash);
}

#[test]
fn a_combined_pem_in_tls_crt_never_puts_the_key_into_the_certificate_chain() {
    let (chain, key) = cert_pem(&["a.example.test"]);
    let t = run(&with_secrets(
        vec![tls_ingress(
            "web",
            1,
            &["a.example.test"],
            &["a.example.test"],
            "site",
            json!({}),
        )],
        vec![tls_secret(
            "default",
            "site",
            &format!("{key}{chain}"),
            &key,
        )],
    ));
    let c = &t.snapshot().certificates[0];
    let shown = String::from_utf8(c.certificate_chain.clone()).unwrap();
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    assert!(shown.contains("BEGIN CERTIFICATE"));
}

#[test]
fn unreferenced_secrets_never_enter_the_snapshot() {
    let (chain, key) = cert_pem(&["a.example.test"]);
    let st = with_secrets(
        vec![ingress(
            "default",
            "web",
            1,
            json!([rule(
                "a.example.test",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        )],
        vec![tls_secret("default", "other", &chain, &key)],
    );
    let t = run(&st);
    assert!(t.snapshot().certificates.is_empty());
    assert_eq!(tls_of(&t)[0].1, "");
}

/// Ours, and ingress-nginx's `ssl-redirect` the same way (`"true"` is its default).
#[test]
fn the_redirect_annotation_turns_the_redirect_off_for_its_hosts() {
    let (chain, key) = cert_pem(&["a.example.test"]);
    let nginx = format!("{}ssl-redirect", nginx::PREFIX);
    for (name, value, redirect) in [
        (SSL_REDIRECT_ANNOTATION, "false", false),
        (nginx.as_str(), "false", false),
        (nginx.as_str(), "true", true),
    ] {
        let t = run(&with_secrets(
            vec![tls_ingress(
                "web",
                1,
                &["a.example.test"],
                &["a.example.test"],
                "site",
                json!({ name: value }),
            )],
            vec![tls_secret("default", "site", &chain, &key)],
        ));
        assert_eq!(
            tls_of(&t),
            [("a.example.test".into(), "default/site".into(), redirect)],
            "{name}: {value}"
        );
        assert!(t.problems.is_empty(), "{:?}", t.problems);
    }
}

#[test]
fn a_wildcard_certificate_covers_one_label_and_an_uncovered_host_gets_none_with_a_problem() {
    let (chain, key) = cert_pem(&["*.example.test"]);
    let t = run(&with_secrets(
        vec![tls_ingress(
            "web",
            1,
            &["a.example.test", "a.b.example.test"],
            &["a.example.test", "a.b.example.test"],
            "wild",
            json!({}),
        )],
        vec![tls_secret("default", "wild", &chain, &key)],
    ));
    assert_eq!(
        tls_of(&t),
        [
            ("a.b.example.test".into(), String::new(), false),
            ("a.example.test".into(), "default/wild".into(), true),
        ]
    );
    assert_eq!(reasons(&t), ["TLSHostNotCovered"]);
}

#[test]
fn a_missing_or_malformed_secret_is_a_problem_and_other_hosts_keep_their_certificates() {
    let (chain_a, key_a) = cert_pem(&["a.example.test"]);
    let (chain_b, _) = cert_pem(&["b.example.test"]);
    let (_, foreign_key) = cert_pem(&["b.example.test"]);
    let ingresses = vec![
        tls_ingress(
            "a",
            1,
            &["a.example.test"],
            &["a.example.test"],
            "a",
            json!({}),
        ),
        tls_ingress(
            "b",
            2,
            &["b.example.test"],
            &["b.example.test"],
            "b",
            json!({}),
        ),
    ];
    for (secrets, reason) in [
        (
            vec![tls_secret("default", "a", &chain_a, &key_a)],
            "MissingTLSSecret",
        ),
        (
            vec![
                tls_secret("default", "a", &chain_a, &key_a),
                tls_secret("default", "b", "garbage", "garbage"),
            ],
            "InvalidTLSSecret",
        ),
        (
            vec![
                tls_secret("default", "a", &chain_a, &key_a),
                tls_secret("default", "b", &chain_b, &foreign_key),
            ],
            "InvalidTLSSecret",
        ),
    ] {
        let t = run(&with_secrets(ingresses.clone(), secrets));
        assert_eq!(
            tls_of(&t),
            [
                ("a.example.test".into(), "default/a".into(), true),
                ("b.example.test".into(), String::new(), false),
            ],
            "{reason}"
        );
        assert_eq!(reasons(&t), [reason]);
        assert_eq!(t.problems[0].name, "b");
        // What an operator reads never holds key bytes.
        assert!(!t.problems[0].message.contains("PRIVATE KEY"));
        // The routes stay.
        assert_eq!(routes(&t).len(), 2);
    }
}

#[test]
fn a_secret_that_breaks_later_keeps_serving_its_last_good_certificate() {
    let (chain, key) = cert_pem(&["a.example.test"]);
    let ing = vec![tls_ingress(
        "a",
        1,
        &["a.example.test"],
        &["a.example.test"],
        "a",
        json!({}),
    )];
    let good = with_secrets(ing.clone(), vec![tls_secret("default", "a", &chain, &key)]);
    let mut tr = Translator::default();
    let before = tr.translate(&good, &Options::default());
    assert_eq!(before.snapshot().certificates.len(), 1);
    // Malformed, then deleted, then renewed with a certificate that drops the host.
    let (other_chain, other_key) = cert_pem(&["other.example.test"]);
    for secrets in [
        vec![tls_secret("default", "a", "garbage", &key)],
        vec![],
        vec![tls_secret("default", "a", &other_chain, &other_key)],
    ] {
        let t = tr.translate(&with_secrets(ing.clone(), secrets), &Options::default());
        assert_eq!(t.snapshot().certificates, before.snapshot().certificates);
        assert_eq!(tls_of(&t), tls_of(&before));
        assert_eq!(t.problems.len(), 1, "{:?}", t.problems);
    }
    // A good renewal is used at once.
    let (new_chain, new_key) = cert_pem(&["a.example.test"]);
    let t = tr.translate(
        &with_secrets(
            ing.clone(),
            vec![tls_secret("default", "a", &new_chain, &new_key)],
        ),
        &Options::default(),
    );
    assert_eq!(
        t.snapshot().certificates[0].certificate_chain,
        new_chain.as_bytes()
    );
    assert!(t.problems.is_empty());
}

#[test]
fn the_oldest_ingress_wins_a_tls_host_and_a_host_without_rules_gets_no_certificate() {
    let (chain, key) = cert_pem(&["a.example.test", "norules.example.test"]);
    let t = run(&with_secrets(
        vec![
            tls_ingress(
                "old",
                1,
                &["a.example.test"],
                &["a.example.test", "norules.example.test"],
                "one",
                json!({}),
            ),
            tls_ingress(
                "new",
                2,
                &["a.example.test"],
                &["a.example.test"],
                "two",
                json!({}),
            ),
        ],
        vec![
            tls_secret("default", "one", &chain, &key),
            tls_secret("default", "two", &chain, &key),
        ],
    ));
    assert_eq!(
        tls_of(&t),
        [("a.example.test".into(), "default/one".into(), true)]
    );
    let mut r = reasons(&t);
    r.sort();
    // (The same path twice is also a route conflict.)
    assert_eq!(
        r,
        ["ConflictingRoute", "ConflictingTLS", "TLSHostWithoutRules"]
    );
    assert_eq!(t.snapshot().certificates.len(), 1);
}

#[test]
fn the_default_certificate_is_carried_when_it_is_usable() {
    let (chain, key) = cert_pem(&["fallback.example.test"]);
    let st = with_secrets(vec![], vec![tls_secret("ops", "fallback", &chain, &key)]);
    let opts = Options {
        default_certificate: Some("ops/fallback".into()),
        ..Options::default()
    };
    let t = translate(&st, &opts);
    assert_eq!(t.snapshot().default_certificate, "ops/fallback");
    assert_eq!(t.snapshot().certificates.len(), 1);
    holdfast_proto::snapshot::validate_structure(&t.snapshot()).unwrap();
    let missing = Options {
        default_certificate: Some("ops/missing".into()),
        ..Options::default()
    };
    let t = translate(&st, &missing);
    assert_eq!(t.snapshot().default_certificate, "");
    assert!(t.snapshot().certificates.is_empty());
    assert_eq!(reasons(&t), ["MissingTLSSecret"]);
}

#[test]
fn implementation_specific_paths_a_normalised_request_never_has_are_refused() {
    let paths = json!([
        { "path": "/ok", "pathType": "ImplementationSpecific",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
        { "path": "/a/../admin", "pathType": "ImplementationSpecific",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
        { "path": "//admin", "pathType": "ImplementationSpecific",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
        { "path": "/%61dmin", "pathType": "ImplementationSpecific",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
        { "path": "/a\\b", "pathType": "ImplementationSpecific",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
        { "path": "/v1..2", "pathType": "ImplementationSpecific",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } }
    ]);
    let t = run(&state(vec![ingress(
        "default",
        "web",
        1,
        json!([{ "host": "a.example.com", "http": { "paths": paths } }]),
    )]));
    let kept: Vec<String> = routes(&t).into_iter().map(|r| r.2).collect();
    assert_eq!(kept, ["/v1..2", "/ok"]);
    assert_eq!(t.problems.len(), 4, "{:?}", t.problems);
    assert!(t.problems.iter().all(|p| p.reason == "InvalidPath"));
}

/// Exact and Prefix paths that the API server accepts but no normalised request path
/// has (an escaped unreserved character, lower-case hex, a malformed escape, a `\`) are
/// skipped with InvalidPath; escapes proxies keep (upper-case, reserved or non-ASCII
/// bytes) are fine.
#[test]
fn exact_and_prefix_paths_a_normalised_request_never_has_are_refused() {
    let path = |p: &str, t: &str| {
        json!({ "path": p, "pathType": t,
                "backend": { "service": { "name": "web", "port": { "number": 80 } } } })
    };
    let paths = json!([
        path("/caf%C3%A9", "Exact"),
        path("/a%20b", "Prefix"),
        path("/%7Euser", "Prefix"),
        path("/caf%c3%a9", "Exact"),
        path("/x%zz", "Prefix"),
        path("/x%4", "Exact"),
        path("/a\\b", "Prefix")
    ]);
    let t = run(&state(vec![ingress(
        "default",
        "web",
        1,
        json!([{ "host": "a.example.com", "http": { "paths": paths } }]),
    )]));
    let mut kept: Vec<String> = routes(&t).into_iter().map(|r| r.2).collect();
    kept.sort();
    assert_eq!(kept, ["/a%20b", "/caf%C3%A9"]);
    assert_eq!(t.problems.len(), 5, "{:?}", t.problems);
    assert!(t.problems.iter().all(|p| p.reason == "InvalidPath"));
    assert_eq!(
        escape_never_matched("/%7Euser").as_deref(),
        Some("escapes '~' as %7E (write it unescaped)")
    );
    assert_eq!(
        escape_never_matched("/caf%c3%a9").as_deref(),
        Some("writes %c3 in lower-case hex (write %C3)")
    );
}

#[test]
fn wildcards_over_a_public_suffix_are_refused_and_private_ones_allowed() {
    for host in ["*.com", "*.co.uk", "*.github.io"] {
        assert!(
            wildcard_over_public_suffix(host).is_some(),
            "{host} covers a public suffix"
        );
    }
    for host in [
        "*.example.com",
        "*.example.co.uk",
        "*.test",
        "*.ns.test",
        "a.com",
        "com",
    ] {
        assert_eq!(wildcard_over_public_suffix(host), None, "{host}");
    }
    let t = run(&state(vec![ingress(
        "default",
        "a",
        0,
        json!([
            rule("*.co.uk", "/", "Prefix", "web", json!({"number": 80})),
            rule("*.example.com", "/", "Prefix", "web", json!({"number": 80}))
        ]),
    )]));
    assert_eq!(
        routes(&t),
        [r("*.example.com", MatchKind::Prefix, "/", "default/web:80")]
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].reason.as_str(), "PublicSuffixWildcard");
}

/// The host claims ConfigMap recording `claims`: (host, [(namespace, second)]).
fn claims_cm(claims: &[(&str, &[(&str, u64)])]) -> Arc<k8s_openapi::api::core::v1::ConfigMap> {
    use std::time::{Duration, UNIX_EPOCH};
    let ledger: crate::claims::Ledger = claims
        .iter()
        .map(|(host, list)| {
            let list = list
                .iter()
                .map(|(ns, at)| crate::claims::Claim {
                    namespace: (*ns).to_owned(),
                    since: UNIX_EPOCH + Duration::from_secs(1_800_000_000 + at),
                    unnamed_since: None,
                })
                .collect();
            ((*host).to_owned(), list)
        })
        .collect();
    Arc::new(k8s_openapi::api::core::v1::ConfigMap {
        data: Some(crate::claims::render(&ledger)),
        ..Default::default()
    })
}

/// An Ingress of our class in namespace `ns`.
fn ingress_in(ns: &str, name: &str, age: u32, host: &str, path: &str) -> Arc<Ingress> {
    ingress(
        ns,
        name,
        age,
        json!([rule(host, path, "Prefix", "web", json!({"number": 80}))]),
    )
}

/// The takeover: namespace `aaa` has an Ingress older than the victim's and edits it to
/// name the victim's host. Its claim is recorded after the victim's, so the victim keeps
/// the host; with the claims swapped (the victim's released), `aaa` gets it, and a
/// long-lived translator follows the ledger as a fresh one does.
#[test]
fn a_host_belongs_to_the_namespace_that_named_it_first_not_to_its_oldest_ingress() {
    let ingresses = vec![
        ingress_in("aaa", "old", 0, "shop.example.com", "/admin"),
        ingress_in("victim", "site", 5, "shop.example.com", "/"),
    ];
    let mut st = state(ingresses);
    st.host_claims = vec![claims_cm(&[(
        "shop.example.com",
        &[("victim", 0), ("aaa", 60)],
    )])];
    let mut long_lived = Translator::default();
    let t = long_lived.translate(&st, &Options::default());
    assert_eq!(t.snapshot(), run(&st).snapshot());
    assert_eq!(
        routes(&t),
        [r(
            "shop.example.com",
            MatchKind::Prefix,
            "/",
            "victim/web:80"
        )]
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        (
            t.problems[0].reason.as_str(),
            t.problems[0].namespace.as_str(),
            t.problems[0].name.as_str()
        ),
        ("HostOwnedByOtherNamespace", "aaa", "old")
    );

    // The victim's claim released (after its grace period): aaa's is the only one.
    st.host_claims = vec![claims_cm(&[("shop.example.com", &[("aaa", 60)])])];
    let t = long_lived.translate(&st, &Options::default());
    assert_eq!(t.snapshot(), run(&st).snapshot());
    assert_eq!(
        routes(&t),
        [r(
            "shop.example.com",
            MatchKind::Prefix,
            "/admin",
            "aaa/web:80"
        )]
    );

    // Shared: every namespace adds paths (the explicit opt-out).
    let shared = Options {
        host_ownership: HostOwnership::Shared,
        ..Options::default()
    };
    let t = run_with(&st, &shared);
    assert_eq!(routes(&t).len(), 2);
    assert!(t.problems.is_empty());
}

/// What the leader records: each host's namers once, oldest Ingress first whatever the
/// namespaces' names, `spec.tls` hosts included, and nothing of other classes.
#[test]
fn named_hosts_lists_each_hosts_namespaces_oldest_ingress_first() {
    let mut theirs = (*ingress_in("aaa", "other-class", 0, "shop.example.com", "/")).clone();
    theirs.spec.as_mut().unwrap().ingress_class_name = Some("nginx".into());
    let st = state(vec![
        ingress_in("zzz", "site", 1, "shop.example.com", "/"),
        ingress_in("mmm", "late", 7, "shop.example.com", "/x"),
        ingress_in("zzz", "again", 9, "shop.example.com", "/y"),
        tls_ingress("tls-only", 3, &[], &["secure.example.com"], "s", json!({})),
        Arc::new(theirs),
    ]);
    let named = named_hosts(&st, &Options::default());
    assert_eq!(named["shop.example.com"], ["zzz", "mmm"]);
    assert_eq!(named["secure.example.com"], ["default"]);
    assert_eq!(named.len(), 2);
}

/// Before the leader records anything, namers are ordered by their oldest Ingress (the
/// order the leader then records them in); a recorded claim always ranks first.
#[test]
fn an_unrecorded_namer_never_displaces_a_recorded_owner() {
    let mut st = state(vec![
        ingress_in("aaa", "new", 0, "shop.example.com", "/admin"),
        ingress_in("zzz", "site", 5, "shop.example.com", "/"),
    ]);
    assert_eq!(routes(&run(&st))[0].3, "aaa/web:80", "nothing recorded");
    st.host_claims = vec![claims_cm(&[("shop.example.com", &[("zzz", 0)])])];
    assert_eq!(
        routes(&run(&st)),
        [r("shop.example.com", MatchKind::Prefix, "/", "zzz/web:80")]
    );
}

/// Settings of a host come from its owner's Ingresses alone: another namespace's
/// `ssl-redirect: "false"` and `spec.tls` entry for the host change nothing.
#[test]
fn a_hosts_redirect_and_certificate_come_from_its_owner_alone() {
    let (chain, key) = cert_pem(&["a.example.test"]);
    let (their_chain, their_key) = cert_pem(&["a.example.test"]);
    let owner = tls_ingress(
        "site",
        5,
        &["a.example.test"],
        &["a.example.test"],
        "mine",
        json!({}),
    );
    let mut other = (*tls_ingress(
        "grab",
        0,
        &["a.example.test"],
        &["a.example.test"],
        "theirs",
        json!({ "holdfast.dev/ssl-redirect": "false" }),
    ))
    .clone();
    other.metadata.namespace = Some("aaa".into());
    let mut st = with_secrets(
        vec![owner, Arc::new(other)],
        vec![
            tls_secret("default", "mine", &chain, &key),
            tls_secret("aaa", "theirs", &their_chain, &their_key),
        ],
    );
    st.host_claims = vec![claims_cm(&[(
        "a.example.test",
        &[("default", 0), ("aaa", 1)],
    )])];
    let t = run(&st);
    assert_eq!(
        tls_of(&t),
        [(
            "a.example.test".to_string(),
            "default/mine".to_string(),
            true
        )],
        "the owner's certificate, and the owner's redirect"
    );
    let names: Vec<String> = t
        .snapshot()
        .certificates
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(
        names,
        ["default/mine"],
        "no key of another namespace travels"
    );
}

/// ingress-nginx serves a rule host from a `spec.tls` entry whose certificate covers it
/// (`hosts: ['*.shop.test']` serves `www.shop.test`): so does holdfast, from the owner's
/// entries only. A host another namespace owns never gets that wildcard certificate.
#[test]
fn a_tls_entry_whose_certificate_covers_a_rule_host_serves_it_for_its_owner_only() {
    let (chain, key) = cert_pem(&["*.shop.test"]);
    let owner = tls_ingress(
        "shop",
        0,
        &["www.shop.test"],
        &["*.shop.test"],
        "wild",
        json!({}),
    );
    let mut other = (*ingress_in("other", "api", 1, "api.shop.test", "/")).clone();
    other.metadata.namespace = Some("other".into());
    let mut st = with_secrets(
        vec![owner, Arc::new(other)],
        vec![tls_secret("default", "wild", &chain, &key)],
    );
    st.host_claims = vec![claims_cm(&[
        ("www.shop.test", &[("default", 0)]),
        ("*.shop.test", &[("default", 0)]),
        ("api.shop.test", &[("other", 1)]),
    ])];
    let t = run(&st);
    assert_eq!(
        tls_of(&t),
        [
            ("api.shop.test".to_string(), String::new(), false),
            (
                "www.shop.test".to_string(),
                "default/wild".to_string(),
                true
            ),
        ]
    );
    assert!(
        !reasons(&t).contains(&"TLSHostWithoutRules"),
        "the wildcard entry serves www: {:?}",
        reasons(&t)
    );
}

#[test]
fn an_ingress_over_the_rule_or_path_limits_is_skipped_whole_and_others_are_unaffected() {
    let paths: Vec<Value> = (0..4)
        .map(|i| {
            rule(
                "big.example.com",
                &format!("/p{i}"),
                "Prefix",
                "web",
                json!({"number": 80}),
            )
        })
        .collect();
    let st = state(vec![
        ingress("default", "big", 0, Value::Array(paths)),
        ingress(
            "default",
            "small",
            1,
            json!([rule(
                "small.example.com",
                "/",
                "Prefix",
                "web",
                json!({"number": 80})
            )]),
        ),
    ]);
    let opts = Options {
        ingress_reading: IngressReading {
            nginx_annotations: true,
            max_rules: 3,
            max_paths: 100,
        },
        ..Options::default()
    };
    let t = run_with(&st, &opts);
    assert_eq!(
        routes(&t),
        [r(
            "small.example.com",
            MatchKind::Prefix,
            "/",
            "default/web:80"
        )]
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(
        (t.problems[0].reason.as_str(), t.problems[0].name.as_str()),
        ("IngressTooLarge", "big")
    );
    let by_paths = Options {
        ingress_reading: IngressReading {
            nginx_annotations: true,
            max_rules: 100,
            max_paths: 3,
        },
        ..Options::default()
    };
    assert_eq!(
        run_with(&st, &by_paths).problems[0].reason.as_str(),
        "IngressTooLarge"
    );
    assert_eq!(routes(&run(&st)).len(), 5, "within the defaults");
}

#[test]
fn another_namespace_cannot_set_the_certificate_of_a_host_it_does_not_own() {
    let (chain, key) = cert_pem(&["a.example.test"]);
    let owner = tls_ingress("site", 0, &["a.example.test"], &[], "unused", json!({}));
    let mut grab = (*tls_ingress(
        "grab",
        1,
        &["a.example.test"],
        &["a.example.test"],
        "theirs",
        json!({}),
    ))
    .clone();
    grab.metadata.namespace = Some("other".into());
    let st = with_secrets(
        vec![owner, Arc::new(grab)],
        vec![tls_secret("other", "theirs", &chain, &key)],
    );
    let t = run(&st);
    assert_eq!(
        tls_of(&t),
        [("a.example.test".to_string(), String::new(), false)],
        "no certificate and no redirect from another namespace"
    );
    assert!(t.snapshot().certificates.is_empty());
    assert!(
        t.problems
            .iter()
            .any(|p| p.reason == "HostOwnedByOtherNamespace" && p.namespace == "other"),
        "{:?}",
        reasons(&t)
    );
}

#[test]
fn a_long_lived_translators_content_hash_is_its_snapshots_through_tls_changes() {
    // The translator keeps the content hash up to date one changed resource at a time;
    // after every random change of Ingresses (hosts, spec.tls, the redirect annotation)
    // and Secrets (renewed, broken, deleted, another type of certificate), it must be
    // the hash of the snapshot it built. (A fresh translator may differ from it here:
    // only a long-lived one remembers last good certificates.)
    let hosts = ["a.example.test", "b.example.test", "c.example.test"];
    let certs: Vec<(String, String)> = (0..3).map(|_| cert_pem(&hosts)).collect();
    let narrow = cert_pem(&["a.example.test"]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut tr = Translator::default();
    let mut ingresses: Vec<Arc<Ingress>> = Vec::new();
    let mut secrets: Vec<Arc<Secret>> = Vec::new();
    let mut with_tls = 0;
    let mut previous: Option<Snapshot> = None;
    for step in 0..300 {
        match rng.below(5) {
            0 | 1 => {
                let i = rng.below(4);
                let name = format!("ing-{i}");
                ingresses.retain(|o| o.metadata.name.as_deref() != Some(name.as_str()));
                if rng.below(5) != 0 {
                    let routed: Vec<&str> =
                        (0..1 + rng.below(3)).map(|_| rng.pick(&hosts)).collect();
                    // spec.tls may name hosts other Ingresses route.
                    let tls: Vec<&str> = (0..rng.below(3)).map(|_| rng.pick(&hosts)).collect();
                    let annotations = if rng.below(3) == 0 {
                        json!({ "holdfast.dev/ssl-redirect": "false" })
                    } else {
                        json!({})
                    };
                    let secret = rng.pick(&["s1", "s2"]);
                    ingresses.push(tls_ingress(
                        &name,
                        rng.below(3) as u32,
                        &routed,
                        &tls,
                        secret,
                        annotations,
                    ));
                }
            }
            2 | 3 => {
                let name = rng.pick(&["s1", "s2"]);
                secrets.retain(|o| o.metadata.name.as_deref() != Some(name));
                match rng.below(5) {
                    0 => {}
                    1 => secrets.push(tls_secret("default", name, "garbage", &certs[0].1)),
                    2 => secrets.push(tls_secret("default", name, &narrow.0, &narrow.1)),
                    _ => {
                        let (chain, key) = &certs[rng.below(certs.len())];
                        secrets.push(tls_secret("default", name, chain, key));
                    }
                }
            }
            _ => {
                // The same content in new objects: nothing may change.
                ingresses = ingresses.iter().map(|o| Arc::new((**o).clone())).collect();
            }
        }
        let t = tr.translate(
            &with_secrets(ingresses.clone(), secrets.clone()),
            &Options::default(),
        );
        with_tls += usize::from(
            holdfast_proto::snapshot::ingress_hosts(&t.snapshot())
                .iter()
                .any(|v| !v.certificate.is_empty()),
        );
        assert_eq!(
            t.snapshot().content_hash,
            holdfast_proto::snapshot::content_hash(&t.snapshot()),
            "content hash differs from the snapshot's at step {step}"
        );
        check_incremental(previous.as_ref(), &t, step);
        previous = Some(t.snapshot());
    }
    assert!(
        with_tls > 50,
        "too few steps served a certificate: {with_tls}"
    );
}

// ---------------------------------------------------------------------------------------
// Gateway API

fn gw_object<T: serde::de::DeserializeOwned>(v: Value) -> Arc<T> {
    Arc::new(serde_json::from_value(v).expect("an object"))
}

fn gw_options() -> Options {
    Options {
        gateway_pool: Some(crate::gateway_api::status::Pool::parse("127.10.0.0/16").unwrap()),
        ..Options::default()
    }
}

/// Service `web` in `default`, a Gateway `infra/gw` (HTTP on 80, HTTPS on 443 with the
/// Secret `infra/cert`) and one HTTPRoute to `web` (weight 3) and to a missing Service.
fn gw_state(weight: u32) -> ClusterState {
    let mut st = state(vec![]);
    // One certificate for every state, so that states differ only where a test says.
    static CERT: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (chain, key) = CERT.get_or_init(|| cert_pem(&["gw.example.com"]));
    st.secrets = vec![tls_secret("infra", "cert", chain, key)];
    st.gateway_classes = vec![gw_object(json!({
        "metadata": { "name": "c" },
        "spec": { "controllerName": crate::gateway_api::DEFAULT_CONTROLLER_NAME }
    }))];
    st.gateways = vec![gw_object(json!({
        "metadata": { "name": "gw", "namespace": "infra", "generation": 4,
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": { "gatewayClassName": "c", "listeners": [
            { "name": "http", "port": 80, "protocol": "HTTP",
              "allowedRoutes": { "namespaces": { "from": "All" } } },
            { "name": "https", "port": 443, "protocol": "HTTPS",
              "allowedRoutes": { "namespaces": { "from": "All" } },
              "tls": { "certificateRefs": [{ "name": "cert" }] } }
        ] }
    }))];
    st.http_routes = vec![gw_object(json!({
        "metadata": { "name": "r", "namespace": "default", "generation": weight,
                      "creationTimestamp": "2026-01-02T00:00:00Z" },
        "spec": {
            "parentRefs": [{ "name": "gw", "namespace": "infra" }],
            "hostnames": ["gw.example.com"],
            "rules": [{
                "matches": [{ "path": { "type": "PathPrefix", "value": "/app/" },
                              "headers": [{ "name": "Version", "value": "two" }] }],
                "backendRefs": [{ "name": "web", "port": 80, "weight": weight },
                                { "name": "gone", "port": 80 }]
            }]
        }
    }))];
    st
}

#[test]
fn gateway_routes_become_listeners_and_hosts_with_shared_resolved_backends() {
    let t = run_with(&gw_state(3), &gw_options());
    let mut s = t.snapshot();
    holdfast_proto::snapshot::seal(&mut s, 1);
    assert_eq!(holdfast_proto::snapshot::validate(&s), Ok(()));
    let names: Vec<&str> = s
        .gateway_listeners
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let https = s
        .gateway_listeners
        .iter()
        .find(|l| l.port == 443)
        .expect("the HTTPS listener");
    assert_eq!(https.protocol, "HTTPS");
    assert_eq!(https.certificates[0].certificates, ["infra/cert"]);
    assert!(s.certificates.iter().any(|c| c.name == "infra/cert"));
    assert_eq!(
        https
            .gateway
            .as_ref()
            .map(|g| (g.name.as_str(), g.generation)),
        Some(("gw", 4))
    );
    assert!(https.address.starts_with("127.10."));
    // Each listener serves the route's hostname, with the one entry.
    assert_eq!(s.gateway_hosts.len(), 2);
    let host = &s.gateway_hosts[0];
    assert_eq!(host.host, "gw.example.com");
    let route = &host.routes[0];
    assert_eq!(
        (route.match_kind, route.path.as_str()),
        (MatchKind::Prefix as i32, "/app")
    );
    assert_eq!(
        (
            route.headers[0].name.as_str(),
            route.headers[0].value.as_str()
        ),
        ("version", "two")
    );
    assert_eq!(route.backends.len(), 2);
    assert_eq!(
        (route.backends[0].backend.as_str(), route.backends[0].weight),
        ("default/web:80", 3)
    );
    assert_eq!(route.backends[1].backend, "");
    assert_eq!(route.backends[1].unresolved, "BackendNotFound");
    // The backend is resolved as an Ingress backend is.
    let web = s
        .backends
        .iter()
        .find(|b| b.name == "default/web:80")
        .expect("the backend");
    assert_eq!(web.endpoints.len(), 2);
    // Without a pool, Gateways get no address and nothing is served.
    let none = run_with(&gw_state(3), &Options::default()).snapshot();
    assert!(none.gateway_listeners.is_empty() && none.gateway_hosts.is_empty());
    assert!(none.backends.iter().all(|b| b.name != "default/web:80"));
}

#[test]
fn a_gateway_change_rebuilds_only_what_it_touches_and_a_long_lived_translator_agrees() {
    let opts = gw_options();
    let mut warm = Translator::default();
    let first = warm.translate(&gw_state(3), &opts);
    check_incremental(None, &first, 0);
    // A new weight: both hosts change, the listeners do not.
    let second = warm.translate(&gw_state(5), &opts);
    check_incremental(Some(&first.snapshot()), &second, 1);
    let changed = &second.since.as_ref().unwrap().changed;
    assert_eq!(changed.gateway_hosts.len(), 2);
    assert!(changed.gateway_listeners.is_empty());
    assert!(changed.virtual_hosts.is_empty() && changed.backends.is_empty());
    assert_eq!(second.snapshot(), translate(&gw_state(5), &opts).snapshot());
    // Nothing changed: nothing is rebuilt or listed.
    let third = warm.translate(&gw_state(5), &opts);
    check_incremental(Some(&second.snapshot()), &third, 2);
    assert_eq!(third.since.as_ref().unwrap().changed, Changed::default());
    // The route goes: its hosts go, and its backend with them (no Ingress uses it).
    let mut st = gw_state(5);
    st.http_routes.clear();
    let fourth = warm.translate(&st, &opts);
    check_incremental(Some(&third.snapshot()), &fourth, 3);
    let s = fourth.snapshot();
    assert!(s.gateway_hosts.is_empty());
    assert_eq!(
        s.gateway_listeners.len(),
        2,
        "listeners stay without routes"
    );
    assert!(s.backends.iter().all(|b| b.name != "default/web:80"));
    assert_eq!(s, translate(&st, &opts).snapshot());
}

#[test]
fn a_status_write_on_a_route_rebuilds_no_gateway_resource() {
    let opts = gw_options();
    let mut warm = Translator::default();
    let start = gw_state(3);
    let first = warm.translate(&start, &opts);
    // The leader writes the route's status: a new resourceVersion, the same generation;
    // every other object is the same.
    let mut st = start.clone();
    let mut route = (*st.http_routes[0]).clone();
    route.metadata.resource_version = Some("99".into());
    route.status = serde_json::json!({ "parents": [] });
    st.http_routes = vec![Arc::new(route)];
    let builds = warm.gateway_builds();
    let second = warm.translate(&st, &opts);
    assert_eq!(warm.gateway_builds(), builds, "rebuilt for a status write");
    assert_eq!(second.since.as_ref().unwrap().changed, Changed::default());
    assert_eq!(second.snapshot(), first.snapshot());
    // A new generation (its spec changed) is rebuilt.
    let mut route = (*gw_state(7).http_routes[0]).clone();
    route.metadata.resource_version = Some("100".into());
    st.http_routes = vec![Arc::new(route)];
    let third = warm.translate(&st, &opts);
    assert_eq!(warm.gateway_builds(), builds + 1);
    assert_eq!(third.since.as_ref().unwrap().changed.gateway_hosts.len(), 2);
    assert_eq!(third.snapshot(), translate(&st, &opts).snapshot());
}

/// An HTTPRoute for the long-lived translator's walk: `step` is its generation (a spec
/// change moves it, as the API server does) and `life` its incarnation (its uid).
fn random_http_route(rng: &mut Rng, i: usize, life: usize, step: usize) -> Arc<HttpRoute> {
    let parents = match rng.below(4) {
        0 => json!([{ "name": "gw", "namespace": "infra" }]),
        1 => json!([{ "name": "gw2", "namespace": "infra" }]),
        2 => json!([{ "name": "gw", "namespace": "infra", "sectionName": "http" },
                    { "name": "gw2", "namespace": "infra" }]),
        _ => json!([{ "name": "gw", "namespace": "infra", "sectionName": "https" }]),
    };
    let hostnames: Vec<&str> = (0..rng.below(3))
        .map(|_| {
            rng.pick(&[
                "a.example.com",
                "b.example.com",
                "*.example.com",
                "c.other.org",
            ])
        })
        .collect();
    let rules: Vec<Value> = (0..1 + rng.below(2))
        .map(|_| {
            let path = rng.pick(&["/", "/api", "/api/v1", "/x"]);
            let kind = rng.pick(&["Exact", "PathPrefix"]);
            let backend = rng.pick(&["web", "api", "gone"]);
            let mut m = json!({ "path": { "type": kind, "value": path } });
            if rng.below(3) == 0 {
                m["headers"] = json!([{ "name": "v", "value": rng.pick(&["1", "2"]) }]);
            }
            json!({ "matches": [m],
                    "backendRefs": [{ "name": backend, "port": 80, "weight": rng.below(3) }] })
        })
        .collect();
    let ns = ["default", "other"][i % 2];
    gw_object(json!({
        "metadata": { "name": format!("r{i}"), "namespace": ns,
                      "uid": format!("uid-{i}-{life}"), "generation": step,
                      "creationTimestamp": format!("2026-01-0{}T00:00:00Z", 1 + rng.below(3)) },
        "spec": { "parentRefs": parents, "hostnames": hostnames, "rules": rules }
    }))
}

#[test]
fn a_long_lived_translator_keeps_gateway_routes_exactly_as_a_fresh_one_makes_them() {
    let opts = gw_options();
    let mut rng = Rng(0x5eed_cafe);
    let mut st = gw_state(3);
    let gw2 = |hostname: &str, generation: u32| {
        gw_object(json!({
            "metadata": { "name": "gw2", "namespace": "infra", "generation": generation,
                          "creationTimestamp": "2026-01-03T00:00:00Z" },
            "spec": { "gatewayClassName": "c", "listeners": [
                { "name": "wild", "port": 8080, "protocol": "HTTP", "hostname": hostname,
                  "allowedRoutes": { "namespaces": { "from": "All" } } }
            ] }
        }))
    };
    st.gateways.push(gw2("*.example.com", 1));
    let (api_svc, api_eps) = web("default");
    let rename = |mut s: Service| {
        s.metadata.name = Some("api".into());
        Arc::new(s)
    };
    let api_svc = rename((*api_svc).clone());
    let _ = api_eps;
    let mut lives = [0usize; 12];
    st.http_routes = (0..12)
        .map(|i| random_http_route(&mut rng, i, 0, 1))
        .collect();
    let mut warm = Translator::default();
    let mut previous: Option<Snapshot> = None;
    for step in 0..300 {
        match rng.below(10) {
            // A route's spec changes.
            0..=3 => {
                let i = rng.below(st.http_routes.len());
                let n: usize = st.http_routes[i].metadata.name.as_deref().unwrap()[1..]
                    .parse()
                    .unwrap();
                st.http_routes[i] = random_http_route(&mut rng, n, lives[n], step + 2);
            }
            // A route goes, or comes back as a new object.
            4 | 5 => {
                let n = rng.below(12);
                let name = format!("r{n}");
                if let Some(at) = st
                    .http_routes
                    .iter()
                    .position(|r| r.metadata.name.as_deref() == Some(&name))
                {
                    st.http_routes.remove(at);
                } else {
                    lives[n] += 1;
                    st.http_routes
                        .push(random_http_route(&mut rng, n, lives[n], 1));
                }
            }
            // The leader writes a route's status: nothing to make again.
            6 => {
                if !st.http_routes.is_empty() {
                    let i = rng.below(st.http_routes.len());
                    let mut r = (*st.http_routes[i]).clone();
                    r.status = json!({ "parents": [{ "step": step }] });
                    st.http_routes[i] = Arc::new(r);
                }
            }
            // The second Gateway's listener hostname changes.
            7 => {
                let host = rng.pick(&["*.example.com", "a.example.com", "*.other.org"]);
                st.gateways[1] = gw2(host, step as u32 + 2);
            }
            // Service `api` comes or goes.
            _ => {
                if let Some(at) = st
                    .services
                    .iter()
                    .position(|s| s.metadata.name.as_deref() == Some("api"))
                {
                    st.services.remove(at);
                } else {
                    st.services.push(api_svc.clone());
                }
            }
        }
        let t = warm.translate(&st, &opts);
        check_incremental(previous.as_ref(), &t, step);
        let now = t.snapshot();
        assert_eq!(now, translate(&st, &opts).snapshot(), "step {step}");
        previous = Some(now);
    }
    let hosts = previous.map_or(0, |s| s.gateway_hosts.len());
    assert!(hosts > 0, "the walk ended with no Gateway host to compare");
}

#[test]
fn one_changed_http_route_of_many_makes_only_itself_and_its_hostnames_again() {
    let opts = gw_options();
    let route = |i: usize, generation: usize, path: &str| -> Arc<HttpRoute> {
        gw_object(json!({
            "metadata": { "name": format!("r{i}"), "namespace": "default",
                          "uid": format!("uid-{i}"), "generation": generation },
            "spec": { "parentRefs": [{ "name": "gw", "namespace": "infra", "sectionName": "http" }],
                      "hostnames": [format!("app-{i}.example.com")],
                      "rules": [{ "matches": [{ "path": { "type": "PathPrefix", "value": path } }],
                                  "backendRefs": [{ "name": "web", "port": 80 }] }] }
        }))
    };
    let mut st = gw_state(3);
    st.http_routes = (0..40).map(|i| route(i, 1, "/")).collect();
    let mut warm = Translator::default();
    let first = warm.translate(&st, &opts);
    assert_eq!(first.snapshot().gateway_hosts.len(), 40);
    let (builds, routes_made) = (warm.gateway_builds(), warm.gateway.route_builds);
    st.http_routes[7] = route(7, 2, "/v2");
    let second = warm.translate(&st, &opts);
    check_incremental(Some(&first.snapshot()), &second, 1);
    assert_eq!(warm.gateway_builds(), builds + 1);
    assert_eq!(
        warm.gateway.route_builds,
        routes_made + 1,
        "only r7 is made again"
    );
    let changed = &second.since.as_ref().unwrap().changed;
    assert_eq!(changed.gateway_hosts.len(), 1);
    assert!(changed.gateway_hosts[0].ends_with(" app-7.example.com"));
    assert_eq!(second.snapshot(), translate(&st, &opts).snapshot());
    // A Service appearing makes every route again (backends resolve against Services).
    let (svc, _) = web("other");
    st.services.push(svc);
    warm.translate(&st, &opts);
    assert_eq!(warm.gateway.route_builds, routes_made + 1 + 40);
}

/// An Ingress with ingress-nginx annotations: its paths' entries carry the filters (its
/// host is then no virtual host), `app-root` adds Exact `/` first, another Ingress's paths
/// on the same host stay plain, and what is not served is a problem, the rest served.
/// Ingress `default/name` routing `a.example.com` + `path` to `web`:80, with the
/// ingress-nginx annotations `pairs`.
fn nginx_annotated(name: &str, path: &str, pairs: &[(&str, &str)]) -> Arc<Ingress> {
    let rules = json!([rule(
        "a.example.com",
        path,
        "Prefix",
        "web",
        json!({"number": 80})
    )]);
    let mut ing = (*ingress("default", name, 1, rules)).clone();
    ing.metadata.annotations = Some(
        pairs
            .iter()
            .map(|(k, v)| (format!("{}{k}", nginx::PREFIX), (*v).to_owned()))
            .collect(),
    );
    Arc::new(ing)
}

#[test]
fn ingress_nginx_annotations_become_filters_of_that_ingress_s_entries_only() {
    let annotated = nginx_annotated(
        "annotated",
        "/api",
        &[
            ("app-root", "/app"),
            ("upstream-vhost", "internal.example"),
            ("configuration-snippet", "return 200;"),
            ("limit-rpm", "10"),
        ],
    );
    let plain = ingress(
        "default",
        "plain",
        2,
        json!([rule(
            "a.example.com",
            "/",
            "Prefix",
            "web",
            json!({"number": 80})
        )]),
    );
    let t = run(&state(vec![annotated, plain]));
    let mut snapshot = t.snapshot();
    holdfast_proto::snapshot::seal(&mut snapshot, 1);
    holdfast_proto::snapshot::validate(&snapshot).expect("valid");
    let g = &snapshot.gateway_hosts[0];
    let entries: Vec<_> = g
        .routes
        .iter()
        .map(|r| {
            (
                r.path.as_str(),
                r.ingress.as_ref().unwrap().name.as_str(),
                r.redirect.is_some(),
                r.rewrite.as_ref().map(|w| w.hostname.as_str()),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("/", "annotated", true, None),
            ("/api", "annotated", false, Some("internal.example")),
            ("/", "plain", false, None),
        ]
    );
    let mut reasons: Vec<_> = t
        .problems
        .iter()
        .map(|p| (p.name.as_str(), p.reason.as_str()))
        .collect();
    reasons.sort_unstable();
    assert_eq!(
        reasons,
        [
            ("annotated", "SnippetRefused"),
            ("annotated", "UnservedAnnotation")
        ]
    );
    // With the annotations off: plain entries, and one problem saying so.
    let mut opts = Options::default();
    opts.ingress_reading.nginx_annotations = false;
    let one = nginx_annotated("annotated", "/api", &[("upstream-vhost", "x.example")]);
    let t = run_with(&state(vec![one]), &opts);
    assert!(holdfast_proto::snapshot::ingress_virtual_host(&t.snapshot().gateway_hosts[0]).is_ok());
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].reason.as_str(), "UnservedAnnotation");
}

/// A canary Ingress (ingress-nginx `canary: "true"`) never conflicts: its path joins the
/// main Ingress's entry (header rules first, then the weighted entry), its backend is
/// resolved too; a second canary of the same path and a canary path no main Ingress routes
/// are problems, and the main route is served as before.
#[test]
fn a_canary_ingress_joins_the_main_ingress_s_path_and_never_conflicts() {
    let canary = |name: &str, age: u32, path: &str, svc: &str, weight: &str| {
        let rules = json!([rule(
            "a.example.com",
            path,
            "Prefix",
            svc,
            json!({"number": 80})
        )]);
        let mut ing = (*ingress("default", name, age, rules)).clone();
        ing.metadata.annotations = Some(
            [
                ("canary", "true"),
                ("canary-weight", weight),
                ("canary-by-header", "X-Canary"),
            ]
            .iter()
            .map(|(k, v)| (format!("{}{k}", nginx::PREFIX), (*v).to_owned()))
            .collect(),
        );
        Arc::new(ing)
    };
    let main = ingress(
        "default",
        "main",
        1,
        json!([rule(
            "a.example.com",
            "/",
            "Prefix",
            "web",
            json!({"number": 80})
        )]),
    );
    let t = run(&state(vec![
        main,
        canary("canary", 2, "/", "beta", "20"),
        canary("late", 3, "/", "gamma", "50"),
        canary("orphan", 4, "/nothing", "beta", "50"),
    ]));
    let g = &t.snapshot().gateway_hosts[0];
    let entries: Vec<_> = g
        .routes
        .iter()
        .map(|r| {
            (
                r.path.as_str(),
                r.headers
                    .iter()
                    .map(|h| format!("{}={}", h.name, h.value))
                    .collect::<Vec<_>>(),
                r.backends
                    .iter()
                    .map(|b| format!("{}*{}", b.backend, b.weight))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let v = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        entries,
        [
            ("/", v(&["x-canary=always"]), v(&["default/beta:80*1"])),
            ("/", v(&["x-canary=never"]), v(&["default/web:80*1"])),
            ("/", v(&[]), v(&["default/web:80*80", "default/beta:80*20"])),
        ]
    );
    assert!(t.content.backend("default/beta:80").is_some());
    let mut problems: Vec<_> = t
        .problems
        .iter()
        .map(|p| (p.name.as_str(), p.reason.as_str()))
        .collect();
    problems.sort_unstable();
    assert_eq!(
        problems,
        [("late", "CanaryNotJoined"), ("orphan", "CanaryNotJoined")]
    );
}

/// ingress-nginx `rewrite-target` (which implies `use-regex`): the Ingress's paths, of any
/// type, are regular expressions as written, and, as in ingress-nginx, so are the paths of
/// every other Ingress of the host (as written: `/api/` keeps its `/`); a path that is not
/// a regular expression is skipped (its own) or kept as it was (another's), with a problem.
#[test]
fn use_regex_makes_every_path_of_the_host_a_regular_expression_as_written() {
    let rules = json!([{ "host": "a.example.com", "http": { "paths": [
        { "path": "/something(/|$)(.*)", "pathType": "ImplementationSpecific",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
        { "path": "/bad(", "pathType": "Prefix",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
        { "path": "/exact", "pathType": "Exact",
          "backend": { "service": { "name": "web", "port": { "number": 80 } } } }
    ] } }]);
    let mut rewriting = (*ingress("default", "rewrite", 1, rules)).clone();
    rewriting.metadata.annotations =
        Some([(format!("{}rewrite-target", nginx::PREFIX), "/$2".to_owned())].into());
    let other = ingress(
        "default",
        "other",
        2,
        json!([{ "host": "a.example.com", "http": { "paths": [
            { "path": "/api/", "pathType": "Prefix",
              "backend": { "service": { "name": "web", "port": { "number": 80 } } } },
            { "path": "/a(b", "pathType": "Prefix",
              "backend": { "service": { "name": "web", "port": { "number": 80 } } } }
        ] } }]),
    );
    let t = run(&state(vec![Arc::new(rewriting), other]));
    let mut snapshot = t.snapshot();
    holdfast_proto::snapshot::seal(&mut snapshot, 1);
    holdfast_proto::snapshot::validate(&snapshot).expect("valid");
    let entries: Vec<_> = snapshot.gateway_hosts[0]
        .routes
        .iter()
        .map(|r| {
            (
                MatchKind::try_from(r.match_kind).unwrap(),
                r.path.as_str(),
                r.ingress.as_ref().unwrap().name.as_str(),
                r.rewrite
                    .as_ref()
                    .and_then(|w| w.path.as_ref())
                    .map(|m| (m.value.as_str(), m.captures)),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            (
                MatchKind::Regex,
                "/something(/|$)(.*)",
                "rewrite",
                Some(("/$2", true))
            ),
            (MatchKind::Regex, "/exact", "rewrite", Some(("/$2", true))),
            (MatchKind::Regex, "/api/", "other", None),
            (MatchKind::Prefix, "/a(b", "other", None),
        ]
    );
    let mut problems: Vec<_> = t
        .problems
        .iter()
        .map(|p| (p.name.as_str(), p.reason.as_str()))
        .collect();
    problems.sort_unstable();
    assert_eq!(
        problems,
        [("other", "InvalidPath"), ("rewrite", "InvalidPath")]
    );
}

/// A host holds at most `MAX_PATH_REGEXES_PER_HOST` regular-expression paths (a request
/// is matched against them one by one): the oldest Ingress's first, the rest skipped with a
/// problem; the snapshot stays valid.
#[test]
fn a_host_holds_a_bounded_number_of_regular_expression_paths() {
    let limit = holdfast_proto::snapshot::MAX_PATH_REGEXES_PER_HOST;
    let paths: Vec<_> = (0..=limit)
        .map(|i| {
            json!({ "path": format!("/p{i:03}"), "pathType": "ImplementationSpecific",
                    "backend": { "service": { "name": "web", "port": { "number": 80 } } } })
        })
        .collect();
    let rules = json!([{ "host": "a.example.com", "http": { "paths": paths } }]);
    let mut ing = (*ingress("default", "many", 1, rules)).clone();
    ing.metadata.annotations =
        Some([(format!("{}use-regex", nginx::PREFIX), "true".to_owned())].into());
    let t = run(&state(vec![Arc::new(ing)]));
    let mut snapshot = t.snapshot();
    holdfast_proto::snapshot::seal(&mut snapshot, 1);
    holdfast_proto::snapshot::validate(&snapshot).expect("valid");
    assert_eq!(snapshot.gateway_hosts[0].routes.len(), limit);
    let over: Vec<_> = t
        .problems
        .iter()
        .filter(|p| p.message.contains("regular-expression path"))
        .collect();
    assert_eq!(over.len(), 1, "{:?}", t.problems);
}

#[test]
fn a_backend_is_h2c_by_its_service_ports_app_protocol_or_by_an_ingress_asking_for_grpc() {
    use holdfast_proto::v1::BackendProtocol;
    // web:80 is plain; grpc:80 says appProtocol kubernetes.io/h2c.
    let mut st = state(vec![
        ingress(
            "default",
            "plain",
            1,
            json!([rule(
                "plain.test",
                "/",
                "Prefix",
                "web",
                json!({ "number": 80 })
            )]),
        ),
        tls_ingress(
            "asks",
            2,
            &["asks.test"],
            &[],
            "none",
            json!({
                "nginx.ingress.kubernetes.io/backend-protocol": "GRPC"
            }),
        ),
        ingress(
            "default",
            "declared",
            3,
            json!([rule(
                "declared.test",
                "/",
                "Prefix",
                "grpc",
                json!({ "name": "rpc" })
            )]),
        ),
    ]);
    st.services.push(service(
        "default",
        "grpc",
        json!([{ "name": "rpc", "port": 80, "targetPort": 9000, "appProtocol": "kubernetes.io/h2c" }]),
    ));
    st.endpoint_slices.push(slice(
        "default",
        "grpc-1",
        "grpc",
        json!([{ "name": "rpc", "port": 9000 }]),
        json!([ready("10.0.1.1")]),
    ));
    let t = run(&st);
    let protocol = |name: &str| BackendProtocol::try_from(backend(&t, name).protocol).unwrap();
    assert_eq!(protocol("default/web:80"), BackendProtocol::Http1);
    // The Ingress that asks for GRPC gets a backend of its own, same endpoints, over h2c;
    // the other Ingress's backend on the same port stays HTTP/1.1.
    assert_eq!(protocol("default/web:80 (h2c)"), BackendProtocol::H2c);
    assert_eq!(
        backend(&t, "default/web:80 (h2c)").endpoints,
        backend(&t, "default/web:80").endpoints
    );
    // A port that says h2c itself is h2c for every route, by its own name (a named port
    // too).
    assert_eq!(protocol("default/grpc:rpc"), BackendProtocol::H2c);
    assert_eq!(backend(&t, "default/grpc:rpc").endpoints[0].port, 9000);
    let served: Vec<String> = routes(&t)
        .into_iter()
        .map(|(h, _, _, b)| format!("{h} {b}"))
        .collect();
    assert!(
        served.contains(&"asks.test default/web:80 (h2c)".to_owned()),
        "{served:?}"
    );
    assert!(
        served.contains(&"plain.test default/web:80".to_owned()),
        "{served:?}"
    );
}

#[test]
fn an_ingress_asking_for_https_gets_a_tls_backend_verified_with_its_own_secrets_ca() {
    use k8s_openapi::ByteString;
    let (ca, _) = cert_pem(&["backend ca"]);
    let (chain, key) = cert_pem(&["client.test"]);
    let with_ca = |ca: &str| {
        let mut s = (*tls_secret("default", "upstream", &chain, &key)).clone();
        s.data
            .get_or_insert_default()
            .insert("ca.crt".into(), ByteString(ca.as_bytes().to_vec()));
        Arc::new(s)
    };
    let ing = |name: &str, age: u32, annotations: Value| {
        tls_ingress(
            name,
            age,
            &[&format!("{name}.test")],
            &[],
            "none",
            annotations,
        )
    };
    let mut st = state(vec![
        ing(
            "open",
            1,
            json!({ "nginx.ingress.kubernetes.io/backend-protocol": "HTTPS" }),
        ),
        ing(
            "named",
            2,
            json!({ "nginx.ingress.kubernetes.io/backend-protocol": "GRPCS",
                    "nginx.ingress.kubernetes.io/proxy-ssl-name": "web.internal",
                    "nginx.ingress.kubernetes.io/proxy-ssl-server-name": "on" }),
        ),
        ing(
            "checked",
            3,
            json!({ "nginx.ingress.kubernetes.io/backend-protocol": "HTTPS",
                    "nginx.ingress.kubernetes.io/proxy-ssl-verify": "on",
                    "nginx.ingress.kubernetes.io/proxy-ssl-secret": "default/upstream" }),
        ),
        ing(
            "foreign",
            4,
            json!({ "nginx.ingress.kubernetes.io/backend-protocol": "HTTPS",
                    "nginx.ingress.kubernetes.io/proxy-ssl-verify": "on",
                    "nginx.ingress.kubernetes.io/proxy-ssl-secret": "other/upstream" }),
        ),
    ]);
    let mut translator = Translator::default();
    // The Secret does not exist yet: the verified backend answers 503 and says why; it is
    // never published unverified.
    let t = translator.translate(&st, &Options::default());
    let checked = backend(&t, "default/web:80 (https verify=default/upstream)");
    assert!(
        checked.unavailable_reason.contains("default/upstream"),
        "{checked:?}"
    );
    assert!(checked.tls.is_some(), "{checked:?}");
    let open = backend(&t, "default/web:80 (https)");
    let tls = open.tls.as_ref().expect("TLS");
    assert_eq!(
        (tls.server_name.as_str(), tls.verify, tls.sni),
        ("web.default.svc", false, false)
    );
    assert_eq!(open.endpoints, backend(&t, "default/web:80").endpoints);
    let named = backend(&t, "default/web:80 (grpcs name=web.internal sni)");
    let tls = named.tls.as_ref().expect("TLS");
    assert_eq!((tls.server_name.as_str(), tls.sni), ("web.internal", true));
    assert_eq!(
        named.protocol,
        holdfast_proto::v1::BackendProtocol::H2c as i32
    );
    // Another namespace's Secret: refused, the paths answer 500 (no backend).
    assert!(
        t.problems.iter().any(|p| p.name == "foreign"
            && p.reason == ProblemReason::InvalidAnnotation
            && p.message.contains("another namespace")),
        "{:?}",
        t.problems
    );
    assert!(
        !t.snapshot()
            .backends
            .iter()
            .any(|b| b.name.contains("other/upstream")),
    );
    // Its path answers 500: the entry has no backend, only why.
    let foreign = t
        .snapshot()
        .gateway_hosts
        .iter()
        .find(|g| g.host == "foreign.test")
        .expect("foreign.test is served")
        .clone();
    assert!(
        foreign.routes.iter().all(|r| r
            .backends
            .iter()
            .all(|b| b.backend.is_empty() && !b.unresolved.is_empty())),
        "{foreign:?}"
    );
    // The Secret appears, without ca.crt, then with one: the backend is resolved again
    // each time (the Secret is what changed).
    st.secrets
        .push(tls_secret("default", "upstream", &chain, &key));
    let t = translator.translate(&st, &Options::default());
    let checked = backend(&t, "default/web:80 (https verify=default/upstream)");
    assert!(checked.unavailable_reason.contains("ca.crt"), "{checked:?}");
    st.secrets = vec![with_ca(&ca)];
    let t = translator.translate(&st, &Options::default());
    let checked = backend(&t, "default/web:80 (https verify=default/upstream)");
    assert_eq!(checked.unavailable_reason, "");
    let tls = checked.tls.as_ref().expect("TLS");
    assert!(tls.verify);
    assert_eq!(tls.ca_pem, ca);
    assert_eq!(
        run(&st).snapshot(),
        t.snapshot(),
        "incremental as from scratch"
    );
    // A ca.crt that is no certificate: 503 with why, nothing sent.
    st.secrets = vec![with_ca("not a certificate")];
    let t = translator.translate(&st, &Options::default());
    let checked = backend(&t, "default/web:80 (https verify=default/upstream)");
    assert!(
        checked.unavailable_reason.contains("CA certificate"),
        "{checked:?}"
    );
}

#[test]
fn a_canary_of_an_https_ingress_speaks_tls_too_and_a_refused_protocol_publishes_no_default_backend()
{
    let annotated = |name: &str, age: u32, svc: &str, annotations: &[(&str, &str)]| {
        let rules = json!([rule(
            "a.example.com",
            "/",
            "Prefix",
            svc,
            json!({"number": 80})
        )]);
        let mut ing = (*ingress("default", name, age, rules)).clone();
        ing.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (format!("{}{k}", nginx::PREFIX), (*v).to_owned()))
                .collect(),
        );
        Arc::new(ing)
    };
    let refused = {
        let mut ing = (*annotated(
            "refused",
            3,
            "web",
            &[("backend-protocol", "HTTPS"), ("proxy-ssl-verify", "on")],
        ))
        .clone();
        let spec = ing.spec.as_mut().unwrap();
        spec.rules = None;
        spec.default_backend = Some(
            serde_json::from_value(
                json!({ "service": { "name": "web", "port": { "number": 80 } } }),
            )
            .unwrap(),
        );
        Arc::new(ing)
    };
    let t = run(&state(vec![
        annotated("main", 1, "web", &[("backend-protocol", "HTTPS")]),
        annotated(
            "canary",
            2,
            "beta",
            &[("canary", "true"), ("canary-weight", "100")],
        ),
        refused,
    ]));
    let g = &t.snapshot().gateway_hosts[0];
    let backends: Vec<&str> = g
        .routes
        .iter()
        .flat_map(|r| r.backends.iter().map(|b| b.backend.as_str()))
        .collect();
    assert!(
        backends.contains(&"default/beta:80 (https)") && !backends.contains(&"default/beta:80"),
        "{backends:?}"
    );
    assert!(t.content.backend("default/beta:80 (https)").is_some());
    // The Ingress whose protocol is refused has its default backend left out, and says so.
    assert!(
        t.snapshot().default_backend.is_none(),
        "{:?}",
        t.snapshot().default_backend
    );
    assert!(
        t.problems
            .iter()
            .any(|p| p.name == "refused" && p.message.contains("spec.defaultBackend not served")),
        "{:?}",
        t.problems
    );
}
