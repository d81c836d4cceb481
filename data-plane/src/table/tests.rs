//! Matching: every case of the Ingress spec's path and host rules.

use holdfast_proto::v1::{
    Backend as PBackend, DefaultBackend, Endpoint, Route as PRoute, VirtualHost,
};

use super::*;

/// A snapshot whose routes are `(host, kind, path, backend)`; backends are created with
/// one endpoint each.
fn snapshot(routes: &[(&str, MatchKind, &str, &str)], default: Option<&str>) -> Snapshot {
    let mut hosts: Vec<VirtualHost> = Vec::new();
    let mut backends: Vec<String> = Vec::new();
    for (host, kind, path, backend) in routes {
        if !hosts.iter().any(|v| v.host == *host) {
            hosts.push(VirtualHost {
                host: (*host).into(),
                routes: vec![],
                ..Default::default()
            });
        }
        let v = hosts.iter_mut().find(|v| v.host == *host).unwrap();
        v.routes.push(PRoute {
            match_kind: *kind as i32,
            path: (*path).into(),
            backend: (*backend).into(),
            source: None,
        });
        backends.push((*backend).into());
    }
    backends.extend(default.map(String::from));
    backends.sort();
    backends.dedup();
    Snapshot {
        virtual_hosts: hosts,
        backends: backends
            .into_iter()
            .enumerate()
            .map(|(i, name)| PBackend {
                name,
                endpoints: vec![Endpoint {
                    address: format!("10.0.0.{}", i + 1),
                    port: 80,
                    zone: String::new(),
                    ready: true,
                }],
                ..Default::default()
            })
            .collect(),
        default_backend: default.map(|d| DefaultBackend {
            backend: d.into(),
            source: None,
        }),
        ..Default::default()
    }
}

fn backend_for(t: &RouteTable, host: &str, path: &str) -> Option<String> {
    t.lookup(host, path)
        .ok()
        .map(|r| t.backends[r.backend].name.clone())
}

use MatchKind::{Exact, Prefix};

/// The table in the Kubernetes Ingress documentation ("Examples" under path types), with
/// Prefix paths as the control plane sends them (trailing '/' removed).
#[test]
fn ingress_spec_path_examples() {
    /// (rules, request path, matching rule).
    type Case<'a> = (&'a [(MatchKind, &'a str)], &'a str, Option<&'a str>);
    let cases: &[Case<'_>] = &[
        (&[(Prefix, "/")], "/anything/at/all", Some("/")),
        (&[(Exact, "/foo")], "/foo", Some("/foo")),
        (&[(Exact, "/foo")], "/bar", None),
        (&[(Exact, "/foo")], "/foo/", None),
        (&[(Exact, "/foo/")], "/foo", None),
        (&[(Prefix, "/foo")], "/foo", Some("/foo")),
        (&[(Prefix, "/foo")], "/foo/", Some("/foo")),
        (&[(Prefix, "/aaa/bb")], "/aaa/bbb", None),
        (&[(Prefix, "/aaa/bbb")], "/aaa/bbb", Some("/aaa/bbb")),
        (&[(Prefix, "/aaa/bbb")], "/aaa/bbb/", Some("/aaa/bbb")),
        (&[(Prefix, "/aaa/bbb")], "/aaa/bbb/ccc", Some("/aaa/bbb")),
        (&[(Prefix, "/aaa/bbb")], "/aaa/bbbxyz", None),
        (&[(Prefix, "/"), (Prefix, "/aaa")], "/aaa/ccc", Some("/aaa")),
        (
            &[(Prefix, "/"), (Prefix, "/aaa"), (Prefix, "/aaa/bbb")],
            "/aaa/bbb",
            Some("/aaa/bbb"),
        ),
        (
            &[(Prefix, "/"), (Prefix, "/aaa"), (Prefix, "/aaa/bbb")],
            "/ccc",
            Some("/"),
        ),
        (&[(Prefix, "/aaa")], "/ccc", None),
        (
            &[(Prefix, "/foo"), (Exact, "/foo")],
            "/foo",
            Some("exact /foo"),
        ),
    ];
    for (rules, request, expected) in cases {
        let routes: Vec<(&str, MatchKind, &str, String)> = rules
            .iter()
            .map(|(k, p)| {
                let name = if *k == Exact
                    && rules.len() > 1
                    && rules.iter().any(|(k2, p2)| *k2 == Prefix && p2 == p)
                {
                    format!("exact {p}")
                } else {
                    (*p).to_string()
                };
                ("a.example.com", *k, *p, name)
            })
            .collect();
        let owned: Vec<(&str, MatchKind, &str, &str)> = routes
            .iter()
            .map(|(h, k, p, b)| (*h, *k, *p, b.as_str()))
            .collect();
        let t = RouteTable::compile(&snapshot(&owned, None)).unwrap();
        assert_eq!(
            backend_for(&t, "a.example.com", request).as_deref(),
            *expected,
            "rules {rules:?}, request {request}"
        );
    }
}

#[test]
fn exact_is_case_sensitive() {
    let t = RouteTable::compile(&snapshot(&[("a.example.com", Exact, "/Foo", "b")], None)).unwrap();
    assert_eq!(
        backend_for(&t, "a.example.com", "/Foo").as_deref(),
        Some("b")
    );
    assert_eq!(backend_for(&t, "a.example.com", "/foo"), None);
}

#[test]
fn host_precedence_exact_then_wildcard_then_no_host_then_default() {
    let t = RouteTable::compile(&snapshot(
        &[
            ("a.example.com", Prefix, "/", "exact"),
            ("*.example.com", Prefix, "/", "wildcard"),
            ("", Prefix, "/", "no-host"),
        ],
        Some("default"),
    ))
    .unwrap();
    assert_eq!(
        backend_for(&t, "a.example.com", "/").as_deref(),
        Some("exact")
    );
    assert_eq!(
        backend_for(&t, "b.example.com", "/").as_deref(),
        Some("wildcard")
    );
    assert_eq!(
        backend_for(&t, "other.test", "/").as_deref(),
        Some("no-host")
    );

    let without_no_host = RouteTable::compile(&snapshot(
        &[("a.example.com", Prefix, "/x", "exact")],
        Some("default"),
    ))
    .unwrap();
    assert_eq!(
        backend_for(&without_no_host, "other.test", "/").as_deref(),
        Some("default")
    );
    assert_eq!(
        backend_for(&without_no_host, "a.example.com", "/y").as_deref(),
        Some("default"),
        "host matched, path did not"
    );

    let nothing =
        RouteTable::compile(&snapshot(&[("a.example.com", Prefix, "/x", "exact")], None)).unwrap();
    assert_eq!(nothing.lookup("other.test", "/"), Err(Miss::NoHost));
    assert_eq!(
        nothing.lookup("a.example.com", "/y"),
        Err(Miss::NoPath {
            vhost: "a.example.com".into()
        })
    );
}

#[test]
fn wildcards_match_exactly_one_label() {
    let t = RouteTable::compile(&snapshot(&[("*.example.com", Prefix, "/", "w")], None)).unwrap();
    assert_eq!(backend_for(&t, "a.example.com", "/").as_deref(), Some("w"));
    assert_eq!(backend_for(&t, "a.b.example.com", "/"), None);
    assert_eq!(backend_for(&t, "example.com", "/"), None);
    assert_eq!(backend_for(&t, ".example.com", "/"), None);
}

#[test]
fn hosts_are_case_insensitive_and_ports_ignored() {
    assert_eq!(normalise_host("A.Example.COM:8080"), "a.example.com");
    assert_eq!(normalise_host("a.example.com."), "a.example.com");
    assert_eq!(normalise_host("[::1]:80"), "::1");
    assert_eq!(normalise_host("10.0.0.1"), "10.0.0.1");
}

#[test]
fn round_robin_and_unavailable_backends() {
    let mut s = snapshot(
        &[("a", Prefix, "/", "b"), ("c", Prefix, "/", "empty")],
        None,
    );
    s.backends[0].endpoints.push(Endpoint {
        address: "10.0.0.9".into(),
        port: 81,
        zone: "z".into(),
        ready: true,
    });
    s.backends[1].endpoints.clear();
    s.backends[1].unavailable_reason = "service x/empty not found".into();
    let t = RouteTable::compile(&s).unwrap();
    let b = &t.backends[0];
    assert_eq!(b.endpoints.len(), 2);
    assert_ne!(b.next_index() % 2, b.next_index() % 2);
    assert_eq!(
        t.backends[1].unavailable_reason.as_deref(),
        Some("service x/empty not found")
    );
}

#[test]
fn bad_endpoints_and_unknown_backends_fail_compilation() {
    let mut s = snapshot(&[("a", Prefix, "/", "b")], None);
    s.backends[0].endpoints[0].address = "not-an-ip".into();
    assert!(matches!(
        RouteTable::compile(&s),
        Err(CompileError::BadEndpoint { .. })
    ));
    let mut s = snapshot(&[("a", Prefix, "/", "b")], None);
    s.backends.clear();
    assert!(matches!(
        RouteTable::compile(&s),
        Err(CompileError::UnknownBackend(_))
    ));
}

// ---------------------------------------------------------------------------------------
// TLS

fn cert(name: &str, sans: &[&str]) -> holdfast_proto::v1::Certificate {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    holdfast_proto::v1::Certificate {
        name: name.into(),
        certificate_chain: params.self_signed(&key).unwrap().pem().into_bytes(),
        private_key: key.serialize_pem().into_bytes(),
        ..Default::default()
    }
}

/// Hosts a.test, x.example.test and *.example.test: the exact ones with their own
/// certificates (x redirecting, a not), the wildcard with a wildcard certificate.
fn tls_snapshot() -> Snapshot {
    let mut s = snapshot(
        &[
            ("a.test", MatchKind::Prefix, "/", "ns/a:80"),
            ("x.example.test", MatchKind::Prefix, "/", "ns/x:80"),
            ("*.example.test", MatchKind::Prefix, "/", "ns/w:80"),
            ("plain.test", MatchKind::Prefix, "/", "ns/p:80"),
        ],
        None,
    );
    s.certificates = vec![
        cert("ns/a", &["a.test"]),
        cert("ns/wild", &["*.example.test"]),
        cert("ns/x", &["x.example.test"]),
    ];
    for v in &mut s.virtual_hosts {
        (v.certificate, v.ssl_redirect) = match v.host.as_str() {
            "a.test" => ("ns/a".into(), false),
            "x.example.test" => ("ns/x".into(), true),
            "*.example.test" => ("ns/wild".into(), true),
            _ => (String::new(), false),
        };
    }
    s
}

fn cert_name(t: &RouteTable, sni: Option<&str>) -> Option<String> {
    t.certificate_for(sni).map(|c| c.name.clone())
}

#[test]
fn sni_picks_the_exact_hosts_certificate_over_the_wildcard_and_the_wildcard_covers_one_label() {
    let t = RouteTable::compile(&tls_snapshot()).unwrap();
    assert_eq!(cert_name(&t, Some("a.test")).as_deref(), Some("ns/a"));
    assert_eq!(
        cert_name(&t, Some("x.example.test")).as_deref(),
        Some("ns/x")
    );
    assert_eq!(
        cert_name(&t, Some("y.example.test")).as_deref(),
        Some("ns/wild")
    );
    assert_eq!(cert_name(&t, Some("a.b.example.test")), None);
    assert_eq!(cert_name(&t, Some("example.test")), None);
    assert_eq!(cert_name(&t, Some("plain.test")), None);
    assert_eq!(cert_name(&t, None), None);
}

#[test]
fn the_default_certificate_answers_unknown_and_missing_sni() {
    let mut s = tls_snapshot();
    s.default_certificate = "ns/a".into();
    let t = RouteTable::compile(&s).unwrap();
    assert_eq!(cert_name(&t, Some("nope.test")).as_deref(), Some("ns/a"));
    assert_eq!(cert_name(&t, None).as_deref(), Some("ns/a"));
}

#[test]
fn only_hosts_with_a_certificate_and_the_redirect_flag_redirect_plain_http() {
    let t = RouteTable::compile(&tls_snapshot()).unwrap();
    assert!(t.redirects_to_https("x.example.test"));
    assert!(t.redirects_to_https("y.example.test"));
    assert!(!t.redirects_to_https("a.test"));
    assert!(!t.redirects_to_https("plain.test"));
    assert!(!t.redirects_to_https("unknown.test"));
}

#[test]
fn a_certificate_that_does_not_parse_fails_the_compile_without_echoing_the_key() {
    let mut s = tls_snapshot();
    s.certificates[0].private_key =
        b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n".to_vec();
    let e = RouteTable::compile(&s).unwrap_err().to_string();
    assert!(e.contains("ns/a"), "{e}");
    assert!(!e.contains("c2VjcmV0"), "{e}");
}
