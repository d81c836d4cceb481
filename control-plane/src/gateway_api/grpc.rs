//! GRPCRoute, read as the HTTPRoute it amounts to.
//!
//! A gRPC call is an HTTP/2 POST to `/<service>/<method>`, so a GRPCRoute's rules are
//! HTTPRoute rules with path matches: a method match of service and method is the exact
//! path `/<service>/<method>`, one of a service alone is the path prefix `/<service>`, and
//! no method match is any path. Header matches, filters, backend references, weights and
//! rule names have the same shape in both kinds and are taken as written. Everything
//! downstream of this (attachment, the rules' translation, status) is the HTTPRoute code;
//! the route's [`RouteKind`] says where its status is written and which listeners take it.
//!
//! What no HTTPRoute path match can say (a method without its service, and the
//! `RegularExpression` match type) is left out: the rule is refused with the reason, as
//! an HTTPRoute rule holdfast cannot serve is (`UNSERVED`).

use serde_json::{Map, Value};

use super::{GrpcRoute, HttpRoute, RouteKind};

/// The key of a converted rule that cannot be served, with why. A key no HTTPRoute can
/// carry (the API server prunes fields its schema does not name), read by the rules'
/// translation ([`super::routes`]).
pub const UNSERVED: &str = "holdfast.dev/unserved";

/// `route` as an HTTPRoute of kind [`RouteKind::Grpc`]: its metadata and status as they
/// are, its spec converted (see the module documentation).
pub fn as_http_route(route: &GrpcRoute) -> HttpRoute {
    HttpRoute {
        metadata: route.metadata.clone(),
        spec: spec(&route.spec),
        status: route.status.clone(),
        kind: RouteKind::Grpc,
    }
}

/// A GRPCRoute `spec` as an HTTPRoute `spec`.
fn spec(grpc: &Value) -> Value {
    let mut out = Map::new();
    for key in ["parentRefs", "hostnames"] {
        if let Some(v) = grpc.get(key) {
            out.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(rules) = grpc.get("rules").and_then(Value::as_array) {
        out.insert(
            "rules".to_owned(),
            Value::Array(rules.iter().map(rule).collect()),
        );
    }
    Value::Object(out)
}

fn rule(grpc: &Value) -> Value {
    let mut out = Map::new();
    for key in ["name", "filters", "backendRefs", "sessionPersistence"] {
        if let Some(v) = grpc.get(key) {
            out.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(matches) = grpc.get("matches").and_then(Value::as_array) {
        let mut converted = Vec::with_capacity(matches.len());
        for m in matches {
            match path_match(m.get("method")) {
                Ok(path) => {
                    let mut http = Map::new();
                    if let Some(path) = path {
                        http.insert("path".to_owned(), path);
                    }
                    if let Some(headers) = m.get("headers") {
                        http.insert("headers".to_owned(), headers.clone());
                    }
                    converted.push(Value::Object(http));
                }
                Err(why) => {
                    out.insert(UNSERVED.to_owned(), Value::String(why));
                    break;
                }
            }
        }
        out.insert("matches".to_owned(), Value::Array(converted));
    }
    Value::Object(out)
}

/// A GRPCRoute method match as an HTTPRoute path match (None: any path), or why it cannot
/// be one.
fn path_match(method: Option<&Value>) -> Result<Option<Value>, String> {
    let Some(m) = method.filter(|m| !m.is_null()) else {
        return Ok(None);
    };
    let kind = m.get("type").and_then(Value::as_str).unwrap_or("Exact");
    if kind != "Exact" {
        return Err(format!("GRPCRoute method match type {kind} is not served"));
    }
    let text = |k: &str| m.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let (service, method) = (text("service"), text("method"));
    if let Some(s) = service
        && !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    {
        return Err(format!("{s:?} is not a gRPC service name"));
    }
    if let Some(m) = method
        && !m.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(format!("{m:?} is not a gRPC method name"));
    }
    Ok(match (service, method) {
        (Some(s), Some(m)) => {
            Some(serde_json::json!({ "type": "Exact", "value": format!("/{s}/{m}") }))
        }
        (Some(s), None) => {
            Some(serde_json::json!({ "type": "PathPrefix", "value": format!("/{s}") }))
        }
        (None, Some(_)) => {
            return Err("a GRPCRoute method match without a service is not served".into());
        }
        (None, None) => None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn converted(spec: Value) -> Value {
        let route = GrpcRoute {
            spec,
            ..Default::default()
        };
        let http = as_http_route(&route);
        assert_eq!(http.kind, RouteKind::Grpc);
        http.spec
    }

    #[test]
    fn a_method_match_is_the_path_of_the_call_and_the_rest_is_taken_as_written() {
        let backend = json!({ "name": "echo", "port": 8080, "weight": 3 });
        let filter = json!({ "type": "RequestHeaderModifier",
            "requestHeaderModifier": { "set": [{ "name": "x", "value": "1" }] } });
        let http = converted(json!({
            "parentRefs": [{ "name": "gw" }],
            "hostnames": ["grpc.example.com"],
            "rules": [{
                "name": "echo",
                "matches": [
                    { "method": { "service": "pkg.Echo", "method": "Call" },
                      "headers": [{ "name": "version", "value": "two" }] },
                    { "method": { "type": "Exact", "service": "pkg.Other" } },
                    { "headers": [{ "name": "only", "value": "headers" }] },
                ],
                "filters": [filter],
                "backendRefs": [backend],
            }, {
                "backendRefs": [backend],
            }],
        }));
        assert_eq!(
            http,
            json!({
                "parentRefs": [{ "name": "gw" }],
                "hostnames": ["grpc.example.com"],
                "rules": [{
                    "name": "echo",
                    "matches": [
                        { "path": { "type": "Exact", "value": "/pkg.Echo/Call" },
                          "headers": [{ "name": "version", "value": "two" }] },
                        { "path": { "type": "PathPrefix", "value": "/pkg.Other" } },
                        { "headers": [{ "name": "only", "value": "headers" }] },
                    ],
                    "filters": [filter],
                    "backendRefs": [backend],
                }, {
                    "backendRefs": [backend],
                }],
            })
        );
    }

    #[test]
    fn what_no_path_match_can_say_leaves_the_rule_unserved_with_the_reason() {
        for (method, why) in [
            (json!({ "method": "Call" }), "without a service"),
            (
                json!({ "type": "RegularExpression", "service": "pkg.*" }),
                "type RegularExpression",
            ),
            (
                json!({ "service": "pkg/../x", "method": "Call" }),
                "service name",
            ),
            (
                json!({ "service": "pkg.Echo", "method": "Call/x" }),
                "method name",
            ),
        ] {
            let http = converted(json!({
                "rules": [{ "matches": [{ "method": method }], "backendRefs": [] }],
            }));
            let reason = http["rules"][0][UNSERVED].as_str().unwrap_or_default();
            assert!(reason.contains(why), "{method}: {reason:?}");
        }
        // A rule that converts has no such key.
        let http =
            converted(json!({ "rules": [{ "matches": [{ "method": { "service": "a.B" } }] }] }));
        assert!(http["rules"][0].get(UNSERVED).is_none());
    }
}
