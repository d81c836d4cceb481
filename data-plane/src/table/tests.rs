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
        .map(|r| r.backend.name.to_string())
}

use MatchKind::{Exact, Prefix};

/// `s` with each virtual host given instead as the Gateway host of listener `ingress`:
/// the one route model the control plane sends.
fn unified(s: &Snapshot) -> Snapshot {
    let mut out = s.clone();
    out.gateway_hosts.extend(
        std::mem::take(&mut out.virtual_hosts)
            .iter()
            .map(holdfast_proto::snapshot::ingress_gateway_host),
    );
    out.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Compiles `s` with its Ingress hosts in both forms (virtual hosts, as older control
/// planes send them, and Gateway hosts of listener `ingress`), checks that both are
/// valid alike and serve the same, and returns the one model's table: every Ingress
/// matching test here runs on it.
fn compile(s: &Snapshot) -> RouteTable {
    use holdfast_proto::snapshot::validate;
    let one = unified(s);
    assert!(
        !s.virtual_hosts.is_empty() && one.virtual_hosts.is_empty(),
        "a snapshot with Ingress hosts, moved to the one model"
    );
    assert_eq!(
        validate(s).is_ok(),
        validate(&one).is_ok(),
        "{:?}",
        validate(&one)
    );
    let legacy = RouteTable::compile(s).unwrap();
    let table = RouteTable::compile(&one).unwrap();
    assert_eq!(served(&legacy), served(&table));
    table
}

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
        let t = compile(&snapshot(&owned, None));
        assert_eq!(
            backend_for(&t, "a.example.com", request).as_deref(),
            *expected,
            "rules {rules:?}, request {request}"
        );
    }
}

#[test]
fn exact_is_case_sensitive() {
    let t = compile(&snapshot(&[("a.example.com", Exact, "/Foo", "b")], None));
    assert_eq!(
        backend_for(&t, "a.example.com", "/Foo").as_deref(),
        Some("b")
    );
    assert_eq!(backend_for(&t, "a.example.com", "/foo"), None);
}

#[test]
fn host_precedence_exact_then_wildcard_then_no_host_then_default() {
    let t = compile(&snapshot(
        &[
            ("a.example.com", Prefix, "/", "exact"),
            ("*.example.com", Prefix, "/", "wildcard"),
            ("", Prefix, "/", "no-host"),
        ],
        Some("default"),
    ));
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

    let without_no_host = compile(&snapshot(
        &[("a.example.com", Prefix, "/x", "exact")],
        Some("default"),
    ));
    assert_eq!(
        backend_for(&without_no_host, "other.test", "/").as_deref(),
        Some("default")
    );
    assert_eq!(
        backend_for(&without_no_host, "a.example.com", "/y").as_deref(),
        Some("default"),
        "host matched, path did not"
    );

    let nothing = compile(&snapshot(&[("a.example.com", Prefix, "/x", "exact")], None));
    assert_eq!(nothing.lookup("other.test", "/").err(), Some(Miss::NoHost));
    assert_eq!(
        nothing.lookup("a.example.com", "/y").err(),
        Some(Miss::NoPath {
            vhost: "a.example.com".into()
        })
    );
}

#[test]
fn wildcards_match_exactly_one_label() {
    let t = compile(&snapshot(&[("*.example.com", Prefix, "/", "w")], None));
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
    let t = compile(&s);
    let b = t.backend("b").unwrap();
    assert_eq!(b.endpoints.len(), 2);
    assert_ne!(b.next_index() % 2, b.next_index() % 2);
    assert_eq!(
        t.backend("empty").unwrap().unavailable_reason.as_deref(),
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

/// A Gateway HTTPS listener's certificate follows its listener hostnames: the exact
/// one, then the longest wildcard (over one or more labels), then the listener without a
/// hostname; no match and no such listener fails the handshake.
#[test]
fn a_gateway_listener_picks_its_certificate_by_listener_hostname() {
    use holdfast_proto::v1::{GatewayListener, ListenerCertificates};
    let mut s = snapshot(&[], None);
    s.certificates = vec![
        cert("ns/a", &["a.gw.test"]),
        cert("ns/any", &["fallback.test"]),
        cert("ns/deep", &["*.b.gw.test"]),
        cert("ns/wild", &["*.gw.test"]),
    ];
    let on = |hostnames: &[(&str, &str)]| GatewayListener {
        name: "127.10.0.1:443".into(),
        address: "127.10.0.1".into(),
        port: 443,
        protocol: "HTTPS".into(),
        certificates: hostnames
            .iter()
            .map(|(h, c)| ListenerCertificates {
                hostname: (*h).into(),
                certificates: vec![(*c).into()],
            })
            .collect(),
        gateway: None,
        public_port: 0,
    };
    s.gateway_listeners = vec![on(&[
        ("", "ns/any"),
        ("*.b.gw.test", "ns/deep"),
        ("*.gw.test", "ns/wild"),
        ("a.gw.test", "ns/a"),
    ])];
    let t = RouteTable::compile(&s).unwrap();
    let l = t.gateway_listener("127.10.0.1:443").expect("the listener");
    let name = |sni: Option<&str>| l.certificate_for(sni).map(|c| c.name.clone());
    assert_eq!(name(Some("a.gw.test")).as_deref(), Some("ns/a"));
    assert_eq!(name(Some("x.gw.test")).as_deref(), Some("ns/wild"));
    assert_eq!(
        name(Some("x.y.gw.test")).as_deref(),
        Some("ns/wild"),
        "more than one label"
    );
    assert_eq!(
        name(Some("x.b.gw.test")).as_deref(),
        Some("ns/deep"),
        "the longest wildcard"
    );
    assert_eq!(
        name(Some("gw.test")).as_deref(),
        Some("ns/any"),
        "the bare suffix is not covered"
    );
    assert_eq!(name(None).as_deref(), Some("ns/any"));
    s.gateway_listeners = vec![on(&[("a.gw.test", "ns/a")])];
    let t = RouteTable::compile(&s).unwrap();
    let l = t.gateway_listener("127.10.0.1:443").expect("the listener");
    assert!(l.certificate_for(Some("b.gw.test")).is_none());
    assert!(l.certificate_for(None).is_none());
}

#[test]
fn sni_picks_the_exact_hosts_certificate_over_the_wildcard_and_the_wildcard_covers_one_label() {
    let t = compile(&tls_snapshot());
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

/// `z.example.test` has a virtual host of its own (another namespace may own it) and no
/// certificate: the wildcard host's certificate is never offered for it, even though it
/// covers the name; the operator's default certificate still is.
#[test]
fn an_exact_host_without_a_certificate_never_gets_the_wildcards() {
    let mut s = tls_snapshot();
    s.virtual_hosts.push(VirtualHost {
        host: "z.example.test".into(),
        routes: vec![holdfast_proto::v1::Route {
            match_kind: MatchKind::Prefix as i32,
            path: "/".into(),
            backend: "ns/p:80".into(),
            source: None,
        }],
        ..Default::default()
    });
    s.virtual_hosts.sort_by(|a, b| a.host.cmp(&b.host));
    let t = compile(&s);
    assert_eq!(cert_name(&t, Some("z.example.test")), None);
    assert_eq!(
        cert_name(&t, Some("y.example.test")).as_deref(),
        Some("ns/wild")
    );
    s.default_certificate = "ns/a".into();
    let t = compile(&s);
    assert_eq!(
        cert_name(&t, Some("z.example.test")).as_deref(),
        Some("ns/a")
    );
}

#[test]
fn the_default_certificate_answers_unknown_and_missing_sni() {
    let mut s = tls_snapshot();
    s.default_certificate = "ns/a".into();
    let t = compile(&s);
    assert_eq!(cert_name(&t, Some("nope.test")).as_deref(), Some("ns/a"));
    assert_eq!(cert_name(&t, None).as_deref(), Some("ns/a"));
}

#[test]
fn only_hosts_with_a_certificate_and_the_redirect_flag_redirect_plain_http() {
    let t = compile(&tls_snapshot());
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

/// A snapshot as `Admin/GetSnapshot` shows it (private keys left out) compiles for looking
/// routes up, with each host's certificate facts, and its certificates sign nothing; the
/// proxy's own compile refuses it.
#[test]
fn a_snapshot_without_keys_compiles_for_explaining_only() {
    let mut s = tls_snapshot();
    for c in &mut s.certificates {
        c.private_key.clear();
    }
    assert!(RouteTable::compile(&s).is_err());
    let t = RouteTable::compile_without_keys(&s).unwrap();
    assert_eq!(
        backend_for(&t, "x.example.test", "/"),
        Some("ns/x:80".into())
    );
    let c = t.certificate_for(Some("x.example.test")).unwrap();
    assert_eq!(c.name, "ns/x");
    assert_eq!(c.facts.dns_names, vec!["x.example.test".to_owned()]);
    let offered = [
        rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
        rustls::SignatureScheme::RSA_PSS_SHA256,
        rustls::SignatureScheme::ED25519,
    ];
    assert!(c.key.key.choose_scheme(&offered).is_none());
}

// ---------------------------------------------------------------------------------------
// Deltas: a table changed by a delta is the table compiled from the whole result.

/// What a table serves, in a form two tables can be compared by: every route with its
/// backend's endpoints and reason, each host's certificate and redirect, the default
/// certificate and the counts.
fn served(t: &RouteTable) -> Vec<String> {
    let mut out: Vec<String> = t
        .routes()
        .map(|r| {
            format!(
                "{} {:?} {} -> {} {:?} {:?} from {}",
                r.host,
                r.kind,
                r.path,
                r.backend.name,
                r.backend.endpoints,
                r.backend.unavailable_reason,
                r.source
            )
        })
        .collect();
    for host in t.routes().map(|r| r.host.clone()).collect::<BTreeSet<_>>() {
        let probe = host.replace("*.", "x.");
        out.push(format!(
            "{host}: certificate {:?} redirect {}",
            t.certificate_for(Some(&probe))
                .map(|c| (&c.name, &c.facts.fingerprint_sha256)),
            t.redirects_to_https(&probe)
        ));
    }
    out.push(format!(
        "default certificate {:?}",
        t.certificate_for(None)
            .map(|c| (&c.name, &c.facts.fingerprint_sha256))
    ));
    let mut listeners: Vec<&Arc<crate::gateway::Listener>> = t.gateway_listeners().collect();
    listeners.sort_by(|a, b| a.name.cmp(&b.name));
    for l in listeners {
        out.push(format!(
            "listener {} {} {} tls {} {:?} entries {}",
            l.name, l.address, l.port, l.tls, l.gateway, l.entries
        ));
        for sni in [None, Some("g1.test"), Some("x.gw.test")] {
            out.push(format!(
                "listener {} sni {sni:?}: {:?}",
                l.name,
                l.certificate_for(sni)
                    .map(|c| (&c.name, &c.facts.fingerprint_sha256))
            ));
        }
        for host in ["g0.test", "g1.test", "a.b.gw.test", "other.test"] {
            for path in ["/", "/p0", "/p1/x"] {
                for with in [false, true] {
                    let mut h = http::HeaderMap::new();
                    if with {
                        h.insert("x-v", http::HeaderValue::from_static("1"));
                    }
                    let asked = crate::matching::Asked {
                        method: "GET",
                        query: None,
                        headers: &h,
                    };
                    let what = match l.lookup(host, path, &asked).map(|m| &m.action.action) {
                        None => "none".to_owned(),
                        Some(crate::gateway::Action::Redirect(r)) => {
                            format!("redirect {}", r.location("http", host, l.port, path))
                        }
                        Some(crate::gateway::Action::Forward {
                            weights,
                            targets,
                            headers,
                            ..
                        }) => {
                            let targets: Vec<String> = targets
                                .iter()
                                .map(|t| match t {
                                    crate::gateway::Target::Route(r) => format!(
                                        "{} {:?} {:?}",
                                        r.backend.name,
                                        r.backend.endpoints,
                                        r.backend.unavailable_reason
                                    ),
                                    crate::gateway::Target::Unresolved(why) => {
                                        format!("unresolved {why}")
                                    }
                                })
                                .collect();
                            format!("forward {weights:?} {targets:?} {headers:?}")
                        }
                    };
                    out.push(format!("listener {} {host}{path} {with}: {what}", l.name));
                }
            }
        }
    }
    out.push(format!(
        "{} routes, {} backends, {} certificates, version {}",
        t.route_count(),
        t.backend_count(),
        t.certificates().len(),
        t.version
    ));
    out.sort();
    out
}

/// A small deterministic random walk (xorshift), so a failure names its seed.
struct Walk(u64);

impl Walk {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One random change to `s`: a host upserted or removed, a backend's endpoints changed,
/// a backend added or removed (when unused), the default backend or a host's
/// certificate set or cleared, or a certificate replaced.
fn random_change(s: &mut Snapshot, w: &mut Walk, certs: &[holdfast_proto::v1::Certificate]) {
    let backends: Vec<String> = s.backends.iter().map(|b| b.name.clone()).collect();
    match w.below(11) {
        8 if !backends.is_empty() => random_gateway_host(s, w, &backends),
        9 if !s.gateway_hosts.is_empty() => {
            let i = w.below(s.gateway_hosts.len() as u64) as usize;
            s.gateway_hosts.remove(i);
        }
        10 if !s.gateway_listeners.is_empty() => {
            let i = w.below(s.gateway_listeners.len() as u64) as usize;
            let name = s.gateway_listeners[i].name.clone();
            if s.gateway_hosts.iter().any(|h| h.listener == name) {
                // A new generation of its Gateway.
                let g = s.gateway_listeners[i]
                    .gateway
                    .get_or_insert_with(Default::default);
                g.generation += 1;
            } else {
                s.gateway_listeners.remove(i);
            }
        }
        0 | 1 if !backends.is_empty() => {
            let host = if w.below(6) == 0 {
                "*.wild.test".to_owned()
            } else {
                format!("h{}.test", w.below(12))
            };
            let routes = (0..1 + w.below(3))
                .map(|i| PRoute {
                    match_kind: if i == 0 { Prefix } else { Exact } as i32,
                    path: if i == 0 {
                        "/".into()
                    } else {
                        format!("/p{}", w.below(4))
                    },
                    backend: backends[w.below(backends.len() as u64) as usize].clone(),
                    source: None,
                })
                .collect();
            let certificate = if w.below(3) == 0 && !s.certificates.is_empty() {
                s.certificates[w.below(s.certificates.len() as u64) as usize]
                    .name
                    .clone()
            } else {
                String::new()
            };
            let vhost = VirtualHost {
                host,
                routes,
                ssl_redirect: !certificate.is_empty() && w.below(2) == 0,
                certificate,
            };
            // Either form of an Ingress host: a virtual host (older control planes) or
            // the Gateway host of listener `ingress` (the one model).
            remove_ingress_host(s, &vhost.host);
            if w.below(2) == 0 {
                s.virtual_hosts.push(vhost);
            } else {
                s.gateway_hosts
                    .push(holdfast_proto::snapshot::ingress_gateway_host(&vhost));
            }
        }
        2 if !ingress_hosts(s).is_empty() => {
            let hosts = ingress_hosts(s);
            let host = hosts[w.below(hosts.len() as u64) as usize].clone();
            remove_ingress_host(s, &host);
        }
        7 if !ingress_hosts(s).is_empty() => {
            // An Ingress host moved from one form to the other, unchanged.
            let hosts = ingress_hosts(s);
            let host = hosts[w.below(hosts.len() as u64) as usize].clone();
            if let Some(i) = s.virtual_hosts.iter().position(|v| v.host == host) {
                let v = s.virtual_hosts.remove(i);
                s.gateway_hosts
                    .push(holdfast_proto::snapshot::ingress_gateway_host(&v));
            } else if let Some(i) = s
                .gateway_hosts
                .iter()
                .position(|g| holdfast_proto::snapshot::is_ingress_host(g) && g.host == host)
            {
                let g = s.gateway_hosts.remove(i);
                s.virtual_hosts
                    .push(holdfast_proto::snapshot::ingress_virtual_host(&g).unwrap());
            }
        }
        3 if !s.backends.is_empty() => {
            let i = w.below(s.backends.len() as u64) as usize;
            let n = w.below(3);
            s.backends[i].endpoints = (0..n)
                .map(|e| Endpoint {
                    address: format!("10.1.{}.{e}", w.below(200)),
                    port: 8080,
                    zone: String::new(),
                    ready: true,
                })
                .collect();
        }
        4 => {
            let name = format!("ns/svc-{}:80", w.below(6));
            if !backends.contains(&name) {
                s.backends.push(PBackend {
                    name,
                    ..Default::default()
                });
            } else {
                let used = s
                    .virtual_hosts
                    .iter()
                    .flat_map(|v| &v.routes)
                    .any(|r| r.backend == name)
                    || s.gateway_hosts.iter().any(|g| {
                        holdfast_proto::snapshot::gateway_host_backends(g).any(|b| b == name)
                    })
                    || s.default_backend
                        .as_ref()
                        .is_some_and(|d| d.backend == name);
                if !used {
                    s.backends.retain(|b| b.name != name);
                }
            }
        }
        5 => {
            s.default_backend = (w.below(2) == 0 && !backends.is_empty()).then(|| DefaultBackend {
                backend: backends[w.below(backends.len() as u64) as usize].clone(),
                source: None,
            });
        }
        6 => {
            // A certificate put in (or replaced by another with the same name).
            let c = certs[w.below(certs.len() as u64) as usize].clone();
            let name = format!("ns/tls-{}", w.below(2));
            s.certificates.retain(|x| x.name != name);
            s.certificates
                .push(holdfast_proto::v1::Certificate { name, ..c });
        }
        _ => {
            s.default_certificate = if w.below(2) == 0 {
                s.certificates
                    .first()
                    .map(|c| c.name.clone())
                    .unwrap_or_default()
            } else {
                String::new()
            };
        }
    }
    s.virtual_hosts.sort_by(|a, b| a.host.cmp(&b.host));
    s.backends.sort_by(|a, b| a.name.cmp(&b.name));
    s.certificates.sort_by(|a, b| a.name.cmp(&b.name));
    s.gateway_listeners.sort_by(|a, b| a.name.cmp(&b.name));
    s.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
}

/// The Ingress hosts of `s`, in either form.
fn ingress_hosts(s: &Snapshot) -> Vec<String> {
    s.virtual_hosts
        .iter()
        .map(|v| v.host.clone())
        .chain(
            s.gateway_hosts
                .iter()
                .filter(|g| holdfast_proto::snapshot::is_ingress_host(g))
                .map(|g| g.host.clone()),
        )
        .collect()
}

/// Removes Ingress host `host` from `s`, in whichever form it is.
fn remove_ingress_host(s: &mut Snapshot, host: &str) {
    s.virtual_hosts.retain(|v| v.host != host);
    s.gateway_hosts
        .retain(|g| !(holdfast_proto::snapshot::is_ingress_host(g) && g.host == host));
}

/// A Gateway host upserted on one of two listeners (made if missing: HTTPS with a
/// certificate of `s` when it has one, half the time), with random weighted backends,
/// header matches, header changes and redirects.
fn random_gateway_host(s: &mut Snapshot, w: &mut Walk, backends: &[String]) {
    use holdfast_proto::snapshot::{gateway_host_name, listener_name};
    use holdfast_proto::v1::{
        GatewayHost, GatewayListener, GatewayRef, GatewayRoute, HeaderMatch, HeaderModifier,
        ListenerCertificates, RequestRedirect, WeightedBackend,
    };
    let port = 8000 + w.below(2) as u32;
    let listener = listener_name("127.10.0.1", port);
    if !s.gateway_listeners.iter().any(|l| l.name == listener) {
        let cert = (w.below(2) == 0)
            .then(|| s.certificates.first().map(|c| c.name.clone()))
            .flatten();
        s.gateway_listeners.push(GatewayListener {
            name: listener.clone(),
            address: "127.10.0.1".into(),
            port,
            protocol: if cert.is_some() { "HTTPS" } else { "HTTP" }.into(),
            certificates: cert
                .map(|c| ListenerCertificates {
                    hostname: ["", "*.gw.test"][w.below(2) as usize].into(),
                    certificates: vec![c],
                })
                .into_iter()
                .collect(),
            gateway: Some(GatewayRef {
                namespace: "infra".into(),
                name: format!("gw-{port}"),
                generation: 1,
            }),
            public_port: 0,
        });
    }
    let host = ["", "g0.test", "g1.test", "*.gw.test"][w.below(4) as usize].to_owned();
    let pair = |n: &str, v: &str| HeaderMatch {
        name: n.into(),
        value: v.into(),
    };
    let routes = (0..1 + w.below(3))
        .map(|i| {
            let mut r = GatewayRoute {
                match_kind: if i == 0 { Prefix } else { Exact } as i32,
                path: if i == 0 {
                    "/".into()
                } else {
                    format!("/p{}", w.below(2))
                },
                headers: if w.below(3) == 0 {
                    vec![pair("x-v", "1")]
                } else {
                    Vec::new()
                },
                ..Default::default()
            };
            if w.below(5) == 0 {
                r.redirect = Some(RequestRedirect {
                    scheme: ["", "https"][w.below(2) as usize].into(),
                    hostname: "moved.test".into(),
                    port: 0,
                    status_code: [301, 302][w.below(2) as usize],
                    path: None,
                    location: String::new(),
                    drop_query: false,
                });
            } else {
                r.backends = (0..1 + w.below(2))
                    .map(|_| {
                        if w.below(4) == 0 {
                            WeightedBackend {
                                backend: String::new(),
                                weight: 1,
                                unresolved: "BackendNotFound".into(),
                                ..Default::default()
                            }
                        } else {
                            WeightedBackend {
                                backend: backends[w.below(backends.len() as u64) as usize].clone(),
                                weight: w.below(4) as u32,
                                unresolved: String::new(),
                                ..Default::default()
                            }
                        }
                    })
                    .collect();
                if w.below(3) == 0 {
                    r.request_headers = Some(HeaderModifier {
                        set: vec![pair("x-set", "s")],
                        add: vec![pair("x-add", "a")],
                        remove: vec!["x-v".into()],
                    });
                }
            }
            r
        })
        .collect();
    let name = gateway_host_name(&listener, &host);
    s.gateway_hosts.retain(|h| h.name != name);
    s.gateway_hosts.push(GatewayHost {
        name,
        listener,
        host,
        routes,
        ..Default::default()
    });
}

#[test]
fn a_table_changed_by_deltas_serves_what_the_whole_snapshot_compiles_to() {
    use holdfast_proto::delta::{Hashed, diff, inventory};
    use holdfast_proto::snapshot::seal;
    let certs = [
        cert("c", &["*.test", "h1.test", "x.wild.test"]),
        cert("c", &["h2.test"]),
    ];
    for seed in [1u64, 7, 42, 1234] {
        let mut w = Walk(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut s = snapshot(&[("h0.test", Prefix, "/", "ns/svc-0:80")], None);
        seal(&mut s, 1);
        let mut held = Held::new(s.clone(), Hashed::of(&s));
        let mut table = RouteTable::compile(&s).unwrap();
        for step in 0..300u64 {
            let mut next = s.clone();
            random_change(&mut next, &mut w, &certs);
            seal(&mut next, 2 + step);
            let delta = diff(&s.version, &inventory(&s), &next);
            let checked = held
                .check(&delta)
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: the delta is refused: {e}"));
            let changed = table.apply_delta(&held, &delta).unwrap();
            held.commit(&delta, checked);
            let whole = RouteTable::compile(&next).unwrap();
            assert_eq!(served(&changed), served(&whole), "seed {seed} step {step}");
            // The request series a swap drops: the labels the old table has and the new
            // one has not, found from the hosts the delta names alone.
            // Every route's: the Ingress hosts', the default backend's, the Gateway
            // listeners'.
            let labels = |t: &RouteTable| -> BTreeSet<String> {
                t.routes()
                    .chain(t.gateway_listeners().flat_map(|l| l.routes()))
                    .map(|r| r.series_key().label().into_owned())
                    .collect()
            };
            let gone: Vec<String> = labels(&table)
                .difference(&labels(&changed))
                .cloned()
                .collect();
            let rendered = |keys: Vec<crate::metrics::SeriesKey>| -> Vec<String> {
                let mut labels: Vec<String> = keys.iter().map(|k| k.label().into_owned()).collect();
                labels.sort();
                labels
            };
            let hosts: Vec<&str> = ingress_hosts_touched(&delta).collect();
            assert_eq!(
                rendered(table.labels_gone(&changed, Some(&hosts))),
                gone,
                "seed {seed} step {step}"
            );
            assert_eq!(
                rendered(table.labels_gone(&changed, None)),
                gone,
                "seed {seed} step {step}"
            );
            table = changed;
            s = next;
        }
    }
}

#[test]
fn an_endpoint_has_one_number_in_every_table_holding_it_until_the_last_is_dropped() {
    // Addresses no other test uses: the numbering is the process's.
    let mut s = snapshot(&[("a.example", MatchKind::Prefix, "/", "ns/a:80")], None);
    s.backends[0].endpoints[0].address = "192.0.2.77".into();
    s.backends.push(PBackend {
        name: "ns/ext:80".into(),
        external_name: "numbered.example".into(),
        external_port: 8077,
        ..Default::default()
    });
    let endpoint = Key::Addr("192.0.2.77:80".parse().unwrap());
    let external = Key::Name("numbered.example:8077".parse().unwrap());
    let numbers = |t: &RouteTable| {
        let a = t.backend("ns/a:80").expect("backend a");
        let ext = t.backend("ns/ext:80").expect("backend ext");
        (
            a.dial[0].number,
            ext.external.as_ref().and_then(|e| e.number),
        )
    };
    let first = RouteTable::compile(&s).expect("compiles");
    let second = RouteTable::compile(&s).expect("compiles");
    assert_eq!(numbers(&first), numbers(&second));
    assert!(
        numbers(&first).1.is_some(),
        "the ExternalName target is numbered"
    );
    assert_ne!(Some(numbers(&first).0), numbers(&first).1);
    drop(first);
    assert!(Number::is_held(&endpoint) && Number::is_held(&external));
    drop(second);
    assert!(
        !Number::is_held(&endpoint) && !Number::is_held(&external),
        "no table holds them: their numbers are free"
    );
}

#[test]
fn a_hosts_routes_and_a_backends_entry_share_one_copy_of_their_name() {
    let s = snapshot(
        &[
            ("a.test", Prefix, "/", "ns/svc:80"),
            ("a.test", Exact, "/x", "ns/svc:80"),
        ],
        None,
    );
    let t = RouteTable::compile(&s).unwrap();
    let routes: Vec<&Arc<Route>> = t.routes().collect();
    assert_eq!(routes.len(), 2);
    assert!(Arc::ptr_eq(&routes[0].host, &routes[1].host));
    // The two routes and the host's key in the table.
    assert_eq!(Arc::strong_count(&routes[0].host), 3);
    // The backend and its key in the table.
    let backend = t.backend("ns/svc:80").expect("the backend");
    assert_eq!(Arc::strong_count(&backend.name), 2);
    // A route's series key is its names, not a copy of them.
    match routes[1].series_key() {
        crate::metrics::SeriesKey::HostPath(host, path) => {
            assert!(Arc::ptr_eq(&host, &routes[1].host));
            assert!(Arc::ptr_eq(&path, &routes[1].path));
        }
        other => panic!("an Ingress route's key is its host and path: {other:?}"),
    }
    assert_eq!(routes[1].series_key().label(), "a.test/x");

    // The snapshot held takes the table's names; a delta that replaces the host and the
    // backend (an endpoint moved) keeps the one copy in both.
    use holdfast_proto::delta::{Hashed, diff, inventory};
    use holdfast_proto::snapshot::seal;
    let mut s = s;
    seal(&mut s, 1);
    let t = RouteTable::compile(&s).unwrap();
    let mut held = Held::sharing(s.clone(), Hashed::of(&s), &t);
    let mut next = s.clone();
    next.backends[0].endpoints[0].address = "10.0.0.9".into();
    next.virtual_hosts[0].routes.push(PRoute {
        match_kind: Exact as i32,
        path: "/y".into(),
        backend: "ns/svc:80".into(),
        source: None,
    });
    seal(&mut next, 2);
    let delta = diff(&s.version, &inventory(&s), &next);
    let checked = held.check(&delta).expect("valid");
    let changed = t.apply_delta(&held, &delta).unwrap();
    held.commit_sharing(&delta, checked, &changed);
    let name = |t: &RouteTable| t.backend("ns/svc:80").expect("the backend").name.clone();
    assert!(Arc::ptr_eq(&name(&changed), &name(&t)));
    let shared = |kind, n| held.shared(kind, n).expect("held");
    assert!(Arc::ptr_eq(
        &shared(ResourceKind::Backend, "ns/svc:80"),
        &name(&changed)
    ));
    let host = changed
        .lookup("a.test", "/y")
        .expect("the new route")
        .host
        .clone();
    assert!(Arc::ptr_eq(
        &shared(ResourceKind::VirtualHost, "a.test"),
        &host
    ));
    let before = t.lookup("a.test", "/").expect("the route").host.clone();
    assert!(Arc::ptr_eq(&host, &before));
    assert_eq!(
        changed.backend("ns/svc:80").unwrap().endpoints,
        ["10.0.0.9:80".parse().unwrap()]
    );
}
