use std::time::{Duration, SystemTime};

use holdfast_proto::v1::{
    GetRolloutResponse, GetStatusResponse, ListProxiesResponse, Problem, ProxyRollout, ProxyStatus,
};
use serde_json::json;

use super::*;

#[test]
fn objects_are_kind_slash_name_in_any_case_plural_or_short() {
    assert_eq!(parse_object("ingress/web"), Ok(("Ingress", "web".into())));
    assert_eq!(parse_object("Ingresses/web"), Ok(("Ingress", "web".into())));
    assert_eq!(parse_object("ing/web"), Ok(("Ingress", "web".into())));
    assert_eq!(
        parse_object("HTTPRoute/api"),
        Ok(("HTTPRoute", "api".into()))
    );
    assert_eq!(parse_object("grpcroutes/g"), Ok(("GRPCRoute", "g".into())));
    assert_eq!(parse_object("gateway/edge"), Ok(("Gateway", "edge".into())));
    for bad in ["web", "ingress/", "service/web", "ingress/a/b"] {
        assert!(parse_object(bad).is_err(), "{bad}");
    }
}

#[test]
fn urls_are_host_and_path_without_scheme_port_or_query() {
    let p = |u: &str| parse_url(u).map(|(h, p)| format!("{h} {p}"));
    assert_eq!(p("example.com/api/v1"), Ok("example.com /api/v1".into()));
    assert_eq!(p("example.com"), Ok("example.com /".into()));
    assert_eq!(
        p("https://example.com:8443/a?b=c#d"),
        Ok("example.com /a".into())
    );
    assert_eq!(p("[::1]:80/x"), Ok("[::1] /x".into()));
    assert_eq!(p("example.com?x=1"), Ok("example.com /".into()));
    assert_eq!(p("example.com#top"), Ok("example.com /".into()));
    assert_eq!(
        p("http://user:pw@example.com/a"),
        Ok("example.com /a".into())
    );
    assert!(parse_url("/just/a/path").is_err());
    assert!(parse_url("http:///x").is_err());
}

#[test]
fn ages_read_as_kubectl_shows_them() {
    assert_eq!(age(Duration::from_secs(45)), "45s");
    assert_eq!(age(Duration::from_secs(192)), "3m12s");
    assert_eq!(age(Duration::from_secs(5 * 3600 + 180)), "5h3m");
    assert_eq!(age(Duration::from_secs(2 * 86400 + 4 * 3600)), "2d4h");
}

fn at(now: SystemTime, ago: u64) -> Option<prost_types::Timestamp> {
    Some((now - Duration::from_secs(ago)).into())
}

#[test]
fn status_says_which_proxies_are_synced_behind_or_nacked_and_why() {
    let now = SystemTime::now();
    let status = GetStatusResponse {
        ready: true,
        published_version: "120-aaaa".into(),
        last_publish_time: at(now, 30),
        ..Default::default()
    };
    let proxies = ListProxiesResponse {
        proxies: vec![
            ProxyStatus {
                id: "proxy-b".into(),
                zone: "z2".into(),
                acked_version: "100-bbbb".into(),
                connected_since: at(now, 200),
                last_nack_version: "120-aaaa".into(),
                last_nack_error: "listener 8443 in use".into(),
                ..Default::default()
            },
            ProxyStatus {
                id: "proxy-a".into(),
                zone: "z1".into(),
                acked_version: "120-aaaa".into(),
                connected_since: at(now, 4000),
                ..Default::default()
            },
            ProxyStatus {
                id: "proxy-c".into(),
                acked_version: "117-cccc".into(),
                connected_since: at(now, 5),
                ..Default::default()
            },
        ],
    };
    let one = |status: &GetStatusResponse, proxies: &ListProxiesResponse| Replica {
        name: "cp-0".to_owned(),
        answer: Ok((status.clone(), proxies.clone())),
    };
    let down = Replica {
        name: "cp-1".to_owned(),
        answer: Err("connection refused".to_owned()),
    };
    let out = status_table(&[one(&status, &proxies), down], now);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "Replica cp-0: published 120-aaaa (30s ago)");
    assert_eq!(lines[1], "Replica cp-1: no answer: connection refused");
    let rows: Vec<Vec<&str>> = lines[3..7]
        .iter()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            vec![
                "PROXY",
                "ZONE",
                "REPLICA",
                "VERSION",
                "STATE",
                "BEHIND",
                "CONNECTED"
            ],
            vec!["proxy-a", "z1", "cp-0", "120-aaaa", "SYNCED", "0", "1h6m"],
            vec![
                "proxy-b",
                "z2",
                "cp-0",
                "100-bbbb",
                "NACKED",
                "20 revisions",
                "3m20s"
            ],
            vec![
                "proxy-c",
                "-",
                "cp-0",
                "117-cccc",
                "BEHIND",
                "3 revisions",
                "5s"
            ],
        ]
    );
    assert!(
        out.ends_with("\nproxy-b refused 120-aaaa: listener 8443 in use\n"),
        "{out}"
    );
    let starting = status_table(&[one(&GetStatusResponse::default(), &proxies)], now);
    assert!(
        starting.starts_with(
            "Replica cp-0: nothing published yet, not ready: no complete snapshot yet\n"
        ),
        "{starting}"
    );
    let none = status_table(&[one(&status, &ListProxiesResponse::default())], now);
    assert!(none.contains("No proxies are connected"), "{none}");
}

#[test]
fn the_rollout_view_lists_each_proxy_and_the_objects_problems() {
    let r = GetRolloutResponse {
        kind: "Ingress".into(),
        namespace: "shop".into(),
        name: "web".into(),
        generation: 3,
        resource_version: "812".into(),
        published_generation: 3,
        published_version: "812-abcd".into(),
        pending: String::new(),
        proxies: vec![
            ProxyRollout {
                id: "p1".into(),
                zone: "z1".into(),
                version: "812-abcd".into(),
                serving: true,
                reason: String::new(),
                connected: true,
            },
            ProxyRollout {
                id: "p2".into(),
                version: "790-ffff".into(),
                reason: "behind: serves 790-ffff".into(),
                connected: true,
                ..Default::default()
            },
        ],
        proxies_serving: 1,
        proxies_connected: 2,
        problems: vec![Problem {
            namespace: "shop".into(),
            name: "web".into(),
            reason: "UnservedAnnotation".into(),
            message: "limit-rpm is not served".into(),
        }],
    };
    let replica = |name: &str, r: &GetRolloutResponse| Replica {
        name: name.to_owned(),
        answer: Ok(r.clone()),
    };
    let other = GetRolloutResponse {
        proxies: vec![ProxyRollout {
            id: "p3".into(),
            version: "812-abcd".into(),
            serving: true,
            connected: true,
            ..Default::default()
        }],
        proxies_serving: 1,
        proxies_connected: 1,
        ..r.clone()
    };
    let out = rollout_text(&[replica("cp-0", &r), replica("cp-1", &other)]);
    assert_eq!(
        out,
        "Ingress shop/web: generation 3 (resourceVersion 812)\n\
         Replica cp-0: generation 3 is in published version 812-abcd\n\
         Replica cp-1: generation 3 is in published version 812-abcd\n\
         Proxies: 2 of 3 connected serve it\n\
         \n\
         PROXY  ZONE  REPLICA  VERSION   SERVING  WHY NOT\n\
         p1     z1    cp-0     812-abcd  yes\n\
         p2     -     cp-0     790-ffff  no       behind: serves 790-ffff\n\
         p3     -     cp-1     812-abcd  yes\n\
         \n\
         Problems:\n  UnservedAnnotation: limit-rpm is not served\n"
    );
    let pending = GetRolloutResponse {
        pending: "no build published since the change".into(),
        published_generation: 0,
        ..r
    };
    let down = Replica {
        name: "cp-1".to_owned(),
        answer: Err("timed out".to_owned()),
    };
    let out = rollout_text(&[replica("cp-0", &pending), down]);
    assert!(
        out.contains(
            "Replica cp-0: generation 3 not published yet (version 812-abcd): no build published since the change\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("Replica cp-1: no answer: timed out\n"),
        "{out}"
    );
}

#[test]
fn explain_shows_the_route_backend_and_certificate_or_why_there_is_none() {
    let hit = json!({
        "matched": true, "status": 200, "version": "9-abc", "https_redirect": true,
        "path": "/api/../api/v1", "normalised_path": "/api/v1",
        "certificate": { "name": "shop/tls", "subject": "CN=shop.example", "not_after": 1900000000 },
        "route": { "host": "shop.example", "kind": "Prefix", "path": "/api", "ingress": "shop/web" },
        "filters": false,
        "backend": { "name": "shop/api:80", "endpoints": ["10.0.0.5:8080"], "external": null, "unavailable_reason": null },
    });
    assert_eq!(
        explain_text("shop.example", "/api/../api/v1", &hit),
        "shop.example/api/../api/v1\n  Path:        routed as /api/v1\n  Status:      200\n  \
         Route:       Prefix /api on host \"shop.example\", from shop/web\n  \
         Backend:     shop/api:80 (endpoints 10.0.0.5:8080)\n  \
         Plain HTTP:  redirected to https (308)\n  \
         Certificate: shop/tls (subject CN=shop.example, not after 1900000000)\n  \
         Snapshot:    9-abc\n"
    );
    let miss = json!({ "matched": false, "status": 404, "version": "9-abc", "reason": "no virtual host matches \"x\"", "path": "/", "normalised_path": "/" });
    assert_eq!(
        explain_text("x", "/", &miss),
        "x/\n  Status:      404, no route\n  Why:         no virtual host matches \"x\"\n  Snapshot:    9-abc\n"
    );
    let down = json!({
        "matched": true, "status": 503, "version": "9-abc",
        "route": { "host": "a", "kind": "Exact", "path": "/", "ingress": "ns/a" },
        "backend": { "name": "ns/gone:80", "endpoints": [], "unavailable_reason": "service ns/gone not found" },
    });
    let out = explain_text("a", "/", &down);
    assert!(
        out.contains("Backend:     ns/gone:80 (no ready endpoints)"),
        "{out}"
    );
    assert!(
        out.contains("Unavailable: service ns/gone not found"),
        "{out}"
    );
}

#[test]
fn tables_pad_every_column_but_the_last() {
    let t = table(&[
        vec!["A".into(), "BB".into(), "C".into()],
        vec!["aaa".into(), "b".into(), "".into()],
    ]);
    assert_eq!(t, "A    BB  C\naaa  b\n");
}

#[test]
fn control_characters_never_reach_the_terminal() {
    assert_eq!(
        printable("refused: \u{1b}[2Jgone\r\nnext line\t."),
        "refused: \\u{1b}[2Jgone\\u{d}\nnext line\\u{9}."
    );
}

#[test]
fn explain_never_panics_on_a_partial_answer() {
    let partial = json!({ "matched": true, "status": 200, "route": {}, "certificate": {} });
    let out = explain_text("a", "/", &partial);
    assert!(out.contains("Status:      200"), "{out}");
}
