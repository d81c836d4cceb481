//! TLSRoute, read as the HTTPRoute it amounts to.
//!
//! A TLSRoute attaches to TLS listeners in mode Passthrough: the proxy reads the server
//! name a client's ClientHello asks for, selects the hostname as a Gateway does (exact,
//! then the longest wildcard, then a listener without a hostname), and relays the
//! connection unopened to one of its rule's backends, by weight. So a TLSRoute is an
//! HTTPRoute whose one rule has no match (any path) and no filter: its hostnames, parent
//! references and backend references are taken as written, and everything downstream
//! (attachment, ReferenceGrants, status) is the HTTPRoute code, with the route's
//! [`RouteKind`] saying which listeners take it and where its status is written.

use serde_json::{Map, Value};

use super::{HttpRoute, RouteKind, TlsRoute};

/// `route` as an HTTPRoute of kind [`RouteKind::Tls`]: its metadata and status as they
/// are; its spec's hostnames, parent references and each rule's name and backend
/// references (a TLSRoute rule has nothing else).
pub fn as_http_route(route: &TlsRoute) -> HttpRoute {
    let mut spec = Map::new();
    for key in ["parentRefs", "hostnames"] {
        if let Some(v) = route.spec.get(key) {
            spec.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(rules) = route.spec.get("rules").and_then(Value::as_array) {
        let rules = rules
            .iter()
            .map(|r| {
                let mut rule = Map::new();
                for key in ["name", "backendRefs"] {
                    if let Some(v) = r.get(key) {
                        rule.insert(key.to_owned(), v.clone());
                    }
                }
                Value::Object(rule)
            })
            .collect();
        spec.insert("rules".to_owned(), Value::Array(rules));
    }
    HttpRoute {
        metadata: route.metadata.clone(),
        spec: Value::Object(spec),
        status: route.status.clone(),
        kind: RouteKind::Tls,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tlsroute_is_an_httproute_of_its_hostnames_and_backends_with_no_match() {
        let route = TlsRoute {
            spec: json!({
                "parentRefs": [{ "name": "gw", "sectionName": "tls" }],
                "hostnames": ["abc.example.com"],
                "rules": [{ "name": "r", "backendRefs": [{ "name": "tcp", "port": 8443, "weight": 2 }],
                            "unknown": true }],
            }),
            ..Default::default()
        };
        let http = as_http_route(&route);
        assert_eq!(http.kind, RouteKind::Tls);
        assert_eq!(
            http.spec,
            json!({
                "parentRefs": [{ "name": "gw", "sectionName": "tls" }],
                "hostnames": ["abc.example.com"],
                "rules": [{ "name": "r", "backendRefs": [{ "name": "tcp", "port": 8443, "weight": 2 }] }],
            })
        );
    }
}
