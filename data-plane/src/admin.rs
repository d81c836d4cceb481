//! The proxy's admin listeners: `/healthz`, `/readyz` and `/metrics` on the admin address;
//! `/debug/snapshot` and `/debug/explain?host=H&path=P` on the debug address (loopback
//! by default: they show every route and pod address).

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use holdfast_process::admin::{Limits, Page, healthz, metrics, reply, text};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::gateway::Action;
use crate::table::{Found, Miss, RouteTable, normalise_host};
use holdfast_http::path::EscapedSlashes;

fn json_reply(status: StatusCode, v: serde_json::Value) -> Page {
    reply(status, "application/json", format!("{v:#}\n"))
}

/// What `/debug/explain` says about a request to `host` and `path`: the path as
/// received and as routed and forwarded (normalised the way the proxy does, see
/// [`holdfast_http::path`]), and the route, or why there is none.
pub fn explain(
    table: Option<&RouteTable>,
    host: &str,
    raw_path: &str,
    escaped: EscapedSlashes,
) -> serde_json::Value {
    let path = match holdfast_http::path::normalise(raw_path, escaped) {
        Ok(p) => p.into_owned(),
        Err(e) => {
            return json!({ "matched": false, "status": 400, "path": raw_path, "reason": format!("the path cannot be normalised safely: {e}") });
        }
    };
    let mut out = explain_normalised(table, host, &path);
    if let Some(o) = out.as_object_mut() {
        o.insert("path".into(), json!(raw_path));
        o.insert("normalised_path".into(), json!(path));
    }
    out
}

fn explain_normalised(table: Option<&RouteTable>, host: &str, path: &str) -> serde_json::Value {
    let Some(t) = table else {
        return json!({ "matched": false, "status": 503, "reason": "no route table yet: waiting for a snapshot" });
    };
    let normalised = normalise_host(host);
    let found = t.lookup_entry(&normalised, path, None).map(|f| match f {
        Found::Route(r) => (Some(r), None),
        Found::Matched(_, m) => (m.routes().next().map(|r| &**r), Some(m)),
    });
    match found {
        // A path with filters that forwards nowhere: a redirect (or 500).
        Ok((None, m)) => {
            let status = match m.map(|m| &m.action) {
                Some(Action::Redirect(r)) => r.status,
                _ => 500,
            };
            json!({ "matched": true, "status": status, "version": t.version, "filters": true })
        }
        Ok((Some(r), filters)) => {
            let b = &r.backend;
            let endpoints: Vec<String> = b.endpoints.iter().map(|e| e.to_string()).collect();
            let status = if b.unavailable_reason.is_some() {
                503
            } else {
                200
            };
            let certificate = t.certificate_for(Some(&normalised)).map(|c| {
                json!({
                    "name": c.name,
                    "fingerprint_sha256": c.facts.fingerprint_sha256,
                    "subject": c.facts.subject,
                    "dns_names": c.facts.dns_names,
                    "not_after": c.facts.not_after,
                })
            });
            json!({
                "matched": true,
                "status": status,
                "version": t.version,
                "https_redirect": t.redirects_to_https(&normalised),
                "certificate": certificate,
                "route": { "host": &*r.host, "kind": format!("{:?}", r.kind), "path": &*r.path, "ingress": r.source },
                "filters": filters.is_some(),
                "backend": {
                    "name": &*b.name,
                    "endpoints": endpoints,
                    "external": b.external.as_ref().map(|e| &e.target),
                    "unavailable_reason": b.unavailable_reason,
                }
            })
        }
        Err(miss) => {
            let reason = match miss {
                Miss::NoHost => format!(
                    "no virtual host matches {normalised:?} (exact, one-label wildcard or hostless) and there is no default backend"
                ),
                Miss::NoPath { vhost } => format!(
                    "virtual host {vhost:?} has no Exact or Prefix route matching {path:?} and there is no default backend"
                ),
            };
            json!({ "matched": false, "status": 404, "version": t.version, "reason": reason })
        }
    }
}

fn query_param(query: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// Which pages a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// `/healthz`, `/readyz`, `/metrics`: the admin address (probes, Prometheus).
    Admin,
    /// `/debug/*`: every route, backend and pod address, so loopback by default.
    Debug,
}

fn route(
    req: &Request<Incoming>,
    pages: Pages,
    draining: bool,
    table: &ArcSwapOption<RouteTable>,
    registry: &Registry,
    escaped: EscapedSlashes,
) -> Page {
    let path = req.uri().path();
    let debug = path.starts_with("/debug/");
    if debug != (pages == Pages::Debug) {
        let hint = match pages {
            Pages::Admin => {
                "not found: try /healthz, /readyz, /metrics (/debug/* is on --debug-listen)\n"
            }
            Pages::Debug => "not found: try /debug/snapshot, /debug/explain?host=&path=\n",
        };
        return text(StatusCode::NOT_FOUND, hint.into());
    }
    let current = table.load_full();
    match path {
        "/healthz" => healthz(),
        "/readyz" if draining => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: shutting down (draining)\n".into(),
        ),
        "/readyz" => match &current {
            Some(t) => text(StatusCode::OK, format!("ready: serving {}\n", t.version)),
            None => text(StatusCode::SERVICE_UNAVAILABLE, "not ready: no snapshot applied yet\n".into()),
        },
        "/metrics" => metrics(registry),
        "/debug/snapshot" => match &current {
            Some(t) => json_reply(
                StatusCode::OK,
                json!({
                    "version": t.version,
                    "content_hash": t.content_hash,
                    "cluster_revision": t.cluster_revision,
                    // Per kind, how far the control plane had seen when it built this.
                    "progress": t.progress.iter().map(|p| (p.kind.clone(), p.resource_version)).collect::<std::collections::BTreeMap<_, _>>(),
                    "routes": t.route_count(),
                    "backends": t.backend_count(),
                    "endpoints": t.backends().map(|b| b.endpoints.len()).sum::<usize>(),
                    // What an operator may see of each certificate: never the key.
                    "certificates": t.certificates().iter().map(|c| json!({
                        "name": c.name,
                        "fingerprint_sha256": c.facts.fingerprint_sha256,
                        "subject": c.facts.subject,
                        "dns_names": c.facts.dns_names,
                        "not_after": c.facts.not_after,
                        "serial": c.facts.serial,
                    })).collect::<Vec<_>>(),
                }),
            ),
            None => json_reply(StatusCode::SERVICE_UNAVAILABLE, json!({ "error": "no snapshot applied yet" })),
        },
        "/debug/explain" => {
            let query = req.uri().query().unwrap_or("");
            let (Some(host), Some(path)) = (query_param(query, "host"), query_param(query, "path")) else {
                return text(StatusCode::BAD_REQUEST, "usage: /debug/explain?host=HOST&path=/PATH\n".into());
            };
            json_reply(StatusCode::OK, explain(current.as_deref(), &host, &path, escaped))
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz, /metrics, /debug/snapshot, /debug/explain?host=&path=\n".into(),
        ),
    }
}

/// Serves `pages` under `limits` until the task is aborted. Once `shutdown` is cancelled,
/// `/readyz` fails, so that load balancers stop sending new connections while the
/// listeners still accept them for `--drain-delay`.
pub async fn serve(
    listener: TcpListener,
    pages: Pages,
    limits: Limits,
    table: Arc<ArcSwapOption<RouteTable>>,
    registry: Arc<Registry>,
    escaped: EscapedSlashes,
    shutdown: CancellationToken,
) {
    let handler = move |req: &Request<Incoming>| {
        let draining = shutdown.is_cancelled();
        route(req, pages, draining, &table, &registry, escaped)
    };
    holdfast_process::admin::serve(listener, limits, handler, std::future::pending()).await;
}
