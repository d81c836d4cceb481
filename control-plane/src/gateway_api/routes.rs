//! The routes of our Gateways, as the proxies will serve them: per Gateway address and
//! port, per hostname, the route entries in the specification's precedence order. Pure:
//! made from [`super::model::Resolved`].
//!
//! Precedence (Gateway API v1.6, HTTPRouteRule): hostnames first (an exact hostname, then
//! wildcards from the longest, then routes for any hostname: a request falls through to
//! the next hostname level when no entry of one matches); within a hostname, an `Exact`
//! path, then the longest `PathPrefix`, then a method match, then the most header
//! matches, then the most query parameter matches, then the oldest route, then
//! `namespace/name`, then rule and match order. The first entry that matches wins.
//!
//! What this version serves of a rule: path matches (`Exact`, `PathPrefix`; a trailing
//! `/` of a prefix is ignored, and a match without a path is `PathPrefix /`), method
//! matches, header matches of type `Exact` (names compared case-insensitively) and query
//! parameter matches of type `Exact` (names case-sensitive; of several matches for one
//! name only the first counts, for headers and parameters alike), weighted `backendRefs`
//! (weight 1 by default; an unresolvable backend keeps its share and answers 500; a rule
//! with no backend answers 500), and the filters `RequestHeaderModifier`,
//! `ResponseHeaderModifier`, `URLRewrite` (hostname, `ReplaceFullPath`,
//! `ReplacePrefixMatch`) and `RequestRedirect` (scheme, hostname, port, path, status
//! code). A match or filter it cannot serve is refused with the reason and the entry is
//! left out, never served more broadly than written.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use serde::Deserialize;

/// A CORS filter as the snapshot carries it (origins lower case; max age in seconds, the
/// specification's default 5).
pub use holdfast_proto::v1::Cors;
/// A rule's retry policy as the snapshot carries it.
pub use holdfast_proto::v1::RetryPolicy;

use super::attach::{self, Hostnames, ObjectRef, Unresolved};
use super::model::{Attachment, OurGateway, Resolved};
use super::{HttpRoute, RouteKind};
use crate::translate::ClusterState;

/// A rule of an HTTPRoute, as far as this version serves it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Rule {
    matches: Vec<Match>,
    filters: Vec<Filter>,
    backend_refs: Vec<BackendRef>,
    timeouts: Option<TimeoutsSpec>,
    retry: Option<RetrySpec>,
    /// A GRPCRoute rule that cannot be served, with why ([`super::grpc::UNSERVED`]).
    #[serde(rename = "holdfast.dev/unserved")]
    unserved: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RetrySpec {
    codes: Vec<i64>,
    attempts: Option<i64>,
    backoff: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct TimeoutsSpec {
    request: Option<String>,
    backend_request: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Match {
    path: Option<PathSpec>,
    headers: Vec<HeaderSpec>,
    method: Option<String>,
    query_params: Vec<HeaderSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PathSpec {
    #[serde(rename = "type")]
    kind: Option<String>,
    value: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct HeaderSpec {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: String,
    value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Filter {
    #[serde(rename = "type")]
    kind: String,
    request_header_modifier: Option<HeaderModifier>,
    response_header_modifier: Option<HeaderModifier>,
    request_redirect: Option<RedirectSpec>,
    #[serde(rename = "urlRewrite")]
    url_rewrite: Option<RewriteSpec>,
    cors: Option<CorsSpec>,
    request_mirror: Option<MirrorSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MirrorSpec {
    backend_ref: ObjectRef,
    percent: Option<i64>,
    fraction: Option<FractionSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct FractionSpec {
    numerator: i64,
    denominator: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct CorsSpec {
    allow_origins: Vec<String>,
    allow_credentials: Option<bool>,
    allow_methods: Vec<String>,
    allow_headers: Vec<String>,
    expose_headers: Vec<String>,
    max_age: Option<i64>,
}

/// A CORS filter checked, or why it cannot be served.
fn cors(spec: &CorsSpec) -> Result<Cors, String> {
    let mut origins = Vec::new();
    for o in &spec.allow_origins {
        let lower = o.to_ascii_lowercase();
        let ok = lower == "*"
            || lower.split_once("://").is_some_and(|(scheme, rest)| {
                !scheme.is_empty()
                    && scheme
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
                    && !rest.is_empty()
                    && !rest.contains(['/', '?', '#', ' '])
            });
        if !ok {
            return Err(format!(
                "CORS origin {o:?} is not \"*\" or scheme://host[:port]"
            ));
        }
        origins.push(lower);
    }
    let token = |t: &String| t == "*" || http::Method::from_bytes(t.as_bytes()).is_ok();
    if let Some(bad) = spec.allow_methods.iter().find(|m| !token(m)) {
        return Err(format!("CORS method {bad:?} is not a method"));
    }
    let name = |h: &String| h == "*" || http::HeaderName::from_bytes(h.as_bytes()).is_ok();
    if let Some(bad) = spec
        .allow_headers
        .iter()
        .chain(&spec.expose_headers)
        .find(|h| !name(h))
    {
        return Err(format!("CORS header {bad:?} is not a header name"));
    }
    Ok(Cors {
        allow_origins: origins,
        allow_credentials: spec.allow_credentials.unwrap_or(false),
        allow_methods: spec.allow_methods.clone(),
        allow_headers: spec.allow_headers.clone(),
        expose_headers: spec.expose_headers.clone(),
        max_age_seconds: spec
            .max_age
            .map_or(5, |s| u32::try_from(s.max(0)).unwrap_or(u32::MAX)),
    })
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RewriteSpec {
    hostname: Option<String>,
    path: Option<PathModifierSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PathModifierSpec {
    #[serde(rename = "type")]
    kind: String,
    replace_full_path: Option<String>,
    replace_prefix_match: Option<String>,
}

/// A `RequestHeaderModifier`: headers set (replacing), added (appended) and removed.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct HeaderModifier {
    /// Replace (or add) these.
    pub set: Vec<NameValue>,
    /// Append these.
    pub add: Vec<NameValue>,
    /// Remove these (names).
    pub remove: Vec<String>,
}

/// A header name and value.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct NameValue {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RedirectSpec {
    scheme: Option<String>,
    hostname: Option<String>,
    port: Option<i64>,
    status_code: Option<i64>,
    path: Option<PathModifierSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct BackendRef {
    #[serde(flatten)]
    target: ObjectRef,
    weight: Option<i64>,
    filters: Vec<Filter>,
}

/// How a path is matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathMatch {
    /// The whole path.
    Exact(String),
    /// Element-wise on `/` (no trailing `/`, except `/` itself).
    Prefix(String),
}

/// A backend of a rule and its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weighted {
    /// `namespace/service:port`, or why the reference does not resolve (its share
    /// answers 500).
    pub backend: Result<String, Unresolved>,
    /// Relative weight (0: never chosen).
    pub weight: u32,
    /// This backend's request header changes (after the rule's).
    pub request_headers: HeaderModifier,
    /// This backend's response header changes (before the rule's).
    pub response_headers: HeaderModifier,
}

/// A `RequestMirror`: where copies of the rule's requests go, and which share of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// `namespace/service:port`, or why the reference does not resolve (nothing is
    /// copied).
    pub backend: Result<String, Unresolved>,
    /// `numerator` of every `denominator` requests are copied.
    pub numerator: u32,
    /// At least 1, and at least `numerator`.
    pub denominator: u32,
}

/// A redirect (`RequestRedirect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// `http` or `https` (None: the request's).
    pub scheme: Option<String>,
    /// Host (None: the request's).
    pub hostname: Option<String>,
    /// Port (None: the scheme's default when the scheme changes, else the request's).
    pub port: Option<u16>,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
    /// The path (None: the request's).
    pub path: Option<PathModifier>,
}

/// A path replacement (`URLRewrite` and `RequestRedirect`); the query is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathModifier {
    /// True: `value` replaces the whole path; false: the prefix the entry matched.
    pub full: bool,
    /// The replacement.
    pub value: String,
}

/// A `URLRewrite`: what the backend is sent instead of the request's host and path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rewrite {
    /// The host (None: the request's).
    pub hostname: Option<String>,
    /// The path (None: the request's).
    pub path: Option<PathModifier>,
}

/// A rule's timeouts (`HTTPRouteRule.timeouts`): None is not given; zero is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, to the response head.
    pub request: Option<std::time::Duration>,
    /// Each attempt, from the request sent to the response head.
    pub backend_request: Option<std::time::Duration>,
}

/// A Gateway API `Duration` (GEP-2257): one to four numbers of at most five digits, each
/// with a unit `h`, `m`, `s` or `ms`, added (`1h30m`, `500ms`, `0s`).
pub fn gateway_duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{text:?} is not a duration (like 10s, 500ms or 1m30s)");
    let mut total = std::time::Duration::ZERO;
    let mut rest = text;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (std::time::Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (std::time::Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (std::time::Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (std::time::Duration::from_secs(1), 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += unit * u32::try_from(n).map_err(|_| bad())?;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok(total)
}

/// What a matched entry does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Forward to one of `backends` by weight, after changing the request's headers,
    /// host and path; the response's headers are changed too.
    Forward {
        /// The backends (an empty list, or only weight 0: 500).
        backends: Vec<Weighted>,
        /// Request header changes.
        headers: HeaderModifier,
        /// Response header changes.
        response_headers: HeaderModifier,
        /// The host and path sent upstream.
        rewrite: Option<Rewrite>,
        /// How long a request may take.
        timeouts: Timeouts,
        /// A CORS filter.
        cors: Option<Box<Cors>>,
        /// When a response is tried again.
        retry: Option<Box<RetryPolicy>>,
        /// Where copies of the requests go.
        mirrors: Box<[Mirror]>,
    },
    /// Answer with a redirect.
    Redirect(Redirect),
}

/// One entry of a hostname's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path.
    pub path: PathMatch,
    /// The method (upper case; None: any).
    pub method: Option<String>,
    /// Header matches: lower-case name, exact value.
    pub headers: Vec<(String, String)>,
    /// Query parameter matches: name (case-sensitive), exact value.
    pub query: Vec<(String, String)>,
    /// What it does.
    pub action: Action,
    /// `namespace/name` of the HTTPRoute, and the rule's index.
    pub source: (String, usize),
    /// The kind of route it came from.
    pub kind: RouteKind,
    /// Precedence among entries of one hostname (lower first).
    order: Order,
}

/// An entry's precedence key: Exact before PathPrefix, the longer path, a method match,
/// more header matches, more query parameter matches, the older route, `namespace/name`,
/// then rule and match index.
type Order = (
    u8,
    std::cmp::Reverse<usize>,
    bool,
    std::cmp::Reverse<usize>,
    std::cmp::Reverse<usize>,
    Option<String>,
    String,
    usize,
    usize,
);

/// The routes served on one Gateway address and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRoutes {
    /// The address the proxies bind.
    pub address: Ipv4Addr,
    /// The port the proxies bind.
    pub port: u16,
    /// The listener's port as clients reach it (`port` unless a Service maps it).
    pub public_port: u16,
    /// Index of its Gateway in the resolved Gateways.
    pub gateway: usize,
    /// `HTTP` or `HTTPS`.
    pub protocol: String,
    /// Per hostname (lower case; `*.example.com` covers one or more labels; "" any), the
    /// entries in precedence order.
    pub hosts: BTreeMap<String, Vec<Entry>>,
    /// For HTTPS: per listener hostname ("" any), the certificates (`namespace/name`).
    pub certificates: BTreeMap<String, Vec<String>>,
}

/// A rule part that was left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// `namespace/name` of the HTTPRoute.
    pub route: String,
    /// The rule's index.
    pub rule: usize,
    /// Why.
    pub reason: String,
}

/// Every `(namespace, Service, port)`: what a `backendRef` resolves against.
#[derive(Debug, Clone, Default)]
pub struct ServicePorts(HashMap<String, HashMap<String, Vec<i64>>>);

impl ServicePorts {
    /// The Services of `state`, indexed once: each `backendRef` is one look-up.
    pub fn of(state: &ClusterState) -> Self {
        let mut by_ns: HashMap<String, HashMap<String, Vec<i64>>> = HashMap::new();
        for s in &state.services {
            let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) else {
                continue;
            };
            let ports = s
                .spec
                .iter()
                .flat_map(|spec| spec.ports.iter().flatten())
                .map(|p| i64::from(p.port));
            by_ns
                .entry(ns.clone())
                .or_default()
                .entry(name.clone())
                .or_default()
                .extend(ports);
        }
        ServicePorts(by_ns)
    }

    fn has(&self, ns: &str, name: &str, port: i64) -> bool {
        self.0
            .get(ns)
            .and_then(|n| n.get(name))
            .is_some_and(|ports| ports.contains(&port))
    }
}

/// A hostname table: a Gateway address and port, and a hostname ("" any).
pub type HostKey = (Ipv4Addr, u16, String);

/// Every address and port that our Gateways' usable listeners serve, with its protocol
/// and certificates, and no routes yet.
pub fn listeners(gateways: &[OurGateway]) -> BTreeMap<(Ipv4Addr, u16), PortRoutes> {
    let mut ports: BTreeMap<(Ipv4Addr, u16), PortRoutes> = BTreeMap::new();
    for (gi, g) in gateways.iter().enumerate() {
        let Some(address) = g.address else { continue };
        for l in g.listeners.iter().filter(|l| l.usable()) {
            let Some((public_port, port)) = u16::try_from(l.port)
                .ok()
                .and_then(|p| Some((p, g.bind_port(p)?)))
            else {
                continue;
            };
            let entry = ports.entry((address, port)).or_insert_with(|| PortRoutes {
                address,
                port,
                public_port,
                gateway: gi,
                protocol: l.protocol.clone(),
                hosts: BTreeMap::new(),
                certificates: BTreeMap::new(),
            });
            if l.protocol == "HTTPS" {
                entry.certificates.insert(
                    l.hostname.clone().unwrap_or_default(),
                    l.certificates.clone(),
                );
            }
        }
    }
    ports
}

/// What one HTTPRoute adds, from its `attachments` (all of one route): its entries per
/// hostname table (only tables in `served`), and what was left out.
pub fn route_entries(
    attachments: &[Attachment],
    gateways: &[OurGateway],
    served: &impl Fn(Ipv4Addr, u16) -> bool,
    grants: &[std::sync::Arc<super::ReferenceGrant>],
    services: &ServicePorts,
) -> (BTreeMap<HostKey, Vec<Entry>>, Vec<Refused>) {
    let mut tables: BTreeMap<HostKey, Vec<Entry>> = BTreeMap::new();
    let Some(first) = attachments.first() else {
        return (tables, Vec::new());
    };
    let (entries, refused) = rule_entries(&first.route, grants, services);
    for a in attachments {
        let Ok(on) = &a.result else { continue };
        let g = &gateways[a.gateway];
        let Some(address) = g.address else { continue };
        for (li, hostnames) in on {
            let Some(port) = u16::try_from(g.listeners[*li].port)
                .ok()
                .and_then(|p| g.bind_port(p))
            else {
                continue;
            };
            if !served(address, port) {
                continue;
            }
            let names = match hostnames {
                Hostnames::Any => vec![String::new()],
                Hostnames::Some(names) => names.clone(),
                Hostnames::None => continue,
            };
            for name in names {
                tables
                    .entry((address, port, name))
                    .or_default()
                    .extend(entries.iter().cloned());
            }
        }
    }
    for list in tables.values_mut() {
        in_precedence(list);
    }
    (tables, refused)
}

/// A route's entries (each rule's matches, in no order yet), and the rules, matches and
/// filters left out with why: what [`route_entries`] puts on each listener hostname, and
/// what the route's status says was dropped (`PartiallyInvalid`).
pub fn rule_entries(
    route: &HttpRoute,
    grants: &[std::sync::Arc<super::ReferenceGrant>],
    services: &ServicePorts,
) -> (Vec<Entry>, Vec<Refused>) {
    rules_read(route, grants, services, true)
}

/// What [`rule_entries`] leaves out of a route, without making its entries (the status
/// pass asks this of every route).
pub fn dropped_rules(
    route: &HttpRoute,
    grants: &[std::sync::Arc<super::ReferenceGrant>],
    services: &ServicePorts,
) -> Vec<Refused> {
    rules_read(route, grants, services, false).1
}

/// [`rule_entries`], its entries made only when `make_entries`.
fn rules_read(
    route: &HttpRoute,
    grants: &[std::sync::Arc<super::ReferenceGrant>],
    services: &ServicePorts,
    make_entries: bool,
) -> (Vec<Entry>, Vec<Refused>) {
    let mut refused = Vec::new();
    let route_ns = route.metadata.namespace.as_deref().unwrap_or_default();
    let route_name = route.metadata.name.as_deref().unwrap_or_default();
    let source = format!("{route_ns}/{route_name}");
    // Routes of different kinds may share a name: their entries are ordered apart.
    let order_source = match route.kind {
        RouteKind::Http => source.clone(),
        other => format!("{source} ({})", other.name()),
    };
    let created = route
        .metadata
        .creation_timestamp
        .as_ref()
        .filter(|_| make_entries)
        .map(|t| t.0.to_string());
    let rules: Vec<Rule> = route.spec["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Rule::deserialize(r).unwrap_or_default())
        .collect();
    let service_port = |ns: &str, name: &str, port: i64| services.has(ns, name, port);
    let mut entries = Vec::new();
    for (ri, rule) in rules.iter().enumerate() {
        if let Some(reason) = &rule.unserved {
            refused.push(Refused {
                route: source.clone(),
                rule: ri,
                reason: reason.clone(),
            });
            continue;
        }
        let action = match action(rule, (route.kind, route_ns), grants, &service_port) {
            Ok(a) => a,
            Err(reason) => {
                refused.push(Refused {
                    route: source.clone(),
                    rule: ri,
                    reason,
                });
                continue;
            }
        };
        let matches = if rule.matches.is_empty() {
            vec![Match::default()]
        } else {
            rule.matches.clone()
        };
        let replaces_prefix = replaces_prefix(&action);
        for (mi, m) in matches.iter().enumerate() {
            match entry(m) {
                Ok(c) if replaces_prefix && matches!(c.path, PathMatch::Exact(_)) => {
                    refused.push(Refused {
                        route: source.clone(),
                        rule: ri,
                        reason: "ReplacePrefixMatch needs a PathPrefix match, not Exact".into(),
                    });
                }
                Ok(_) if !make_entries => {}
                Ok(Conditions {
                    path,
                    method,
                    headers,
                    query,
                }) => {
                    let kind = u8::from(matches!(path, PathMatch::Prefix(_)));
                    let len = match &path {
                        PathMatch::Exact(p) | PathMatch::Prefix(p) => p.len(),
                    };
                    let order = (
                        kind,
                        std::cmp::Reverse(len),
                        method.is_none(),
                        std::cmp::Reverse(headers.len()),
                        std::cmp::Reverse(query.len()),
                        created.clone(),
                        order_source.clone(),
                        ri,
                        mi,
                    );
                    entries.push(Entry {
                        path,
                        method,
                        headers,
                        query,
                        action: action.clone(),
                        source: (source.clone(), ri),
                        kind: route.kind,
                        order,
                    });
                }
                Err(reason) => refused.push(Refused {
                    route: source.clone(),
                    rule: ri,
                    reason,
                }),
            }
        }
    }
    (entries, refused)
}

/// Puts a hostname table's entries in precedence order, each once (an entry's order is
/// its route, rule and match, so equal orders are equal entries).
pub fn in_precedence(list: &mut Vec<Entry>) {
    list.sort_by(|a, b| a.order.cmp(&b.order));
    list.dedup();
}

/// Every Gateway address and port with its routes, and what was left out.
pub fn routes(resolved: &Resolved, state: &ClusterState) -> (Vec<PortRoutes>, Vec<Refused>) {
    let services = ServicePorts::of(state);
    let mut ports = listeners(&resolved.gateways);
    let served: std::collections::BTreeSet<(Ipv4Addr, u16)> = ports.keys().copied().collect();
    let served = |a: Ipv4Addr, p: u16| served.contains(&(a, p));
    let mut refused = Vec::new();
    // The attachments of one route are consecutive.
    for group in resolved
        .attachments
        .chunk_by(|a, b| std::sync::Arc::ptr_eq(&a.route, &b.route))
    {
        let (tables, left_out) = route_entries(
            group,
            &resolved.gateways,
            &served,
            &state.reference_grants,
            &services,
        );
        refused.extend(left_out);
        for ((address, port, host), entries) in tables {
            if let Some(p) = ports.get_mut(&(address, port)) {
                p.hosts.entry(host).or_default().extend(entries);
            }
        }
    }
    for p in ports.values_mut() {
        for list in p.hosts.values_mut() {
            in_precedence(list);
        }
    }
    (ports.into_values().collect(), refused)
}

/// What one match of a rule requires of a request.
struct Conditions {
    path: PathMatch,
    method: Option<String>,
    headers: Vec<(String, String)>,
    query: Vec<(String, String)>,
}

/// The methods a match can name (`HTTPMethod`).
const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// A match's conditions, or why it cannot be served.
fn entry(m: &Match) -> Result<Conditions, String> {
    let method = match m.method.as_deref() {
        None => None,
        Some(name) if METHODS.contains(&name) => Some(name.to_owned()),
        Some(other) => return Err(format!("method {other:?} is not an HTTP method")),
    };
    let mut query: Vec<(String, String)> = Vec::new();
    for q in &m.query_params {
        if q.kind.as_deref().unwrap_or("Exact") != "Exact" {
            return Err(format!(
                "query parameter match type {:?} is not served",
                q.kind
            ));
        }
        if q.name.is_empty() || q.name.contains(['&', '=', '#', ' ']) {
            return Err(format!("{:?} is not a query parameter name", q.name));
        }
        // Only the first match of a name counts.
        if !query.iter().any(|(n, _)| *n == q.name) {
            query.push((q.name.clone(), q.value.clone()));
        }
    }
    let path = match &m.path {
        None => PathMatch::Prefix("/".into()),
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            if !value.starts_with('/')
                || value.contains(['?', '#'])
                || value.chars().any(char::is_whitespace)
            {
                return Err(format!("path {value:?} is not an absolute path"));
            }
            match p.kind.as_deref().unwrap_or("PathPrefix") {
                "Exact" => PathMatch::Exact(value),
                "PathPrefix" => {
                    let trimmed = value.trim_end_matches('/');
                    PathMatch::Prefix(if trimmed.is_empty() {
                        "/".into()
                    } else {
                        trimmed.into()
                    })
                }
                other => return Err(format!("path match type {other} is not served")),
            }
        }
    };
    let mut headers: Vec<(String, String)> = Vec::new();
    for h in &m.headers {
        if h.kind.as_deref().unwrap_or("Exact") != "Exact" {
            return Err(format!("header match type {:?} is not served", h.kind));
        }
        let name = h.name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("{:?} is not a header name", h.name));
        }
        // Only the first match of a name counts.
        if !headers.iter().any(|(n, _)| *n == name) {
            headers.push((name, h.value.clone()));
        }
    }
    Ok(Conditions {
        path,
        method,
        headers,
        query,
    })
}

/// Whether a rule's rewrite or redirect replaces the matched path prefix.
fn replaces_prefix(action: &Action) -> bool {
    let path = match action {
        Action::Forward { rewrite, .. } => rewrite.as_ref().and_then(|w| w.path.as_ref()),
        Action::Redirect(r) => r.path.as_ref(),
    };
    path.is_some_and(|p| !p.full)
}

/// A header modifier's names and values checked.
fn checked_modifier(m: &HeaderModifier) -> Result<HeaderModifier, String> {
    for nv in m.set.iter().chain(&m.add) {
        if http::HeaderName::from_bytes(nv.name.as_bytes()).is_err()
            || http::HeaderValue::from_str(&nv.value).is_err()
        {
            return Err(format!("header {:?}: not a valid header", nv.name));
        }
    }
    for name in &m.remove {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("header {name:?}: not a valid header name"));
        }
    }
    Ok(m.clone())
}

/// A path modifier checked: an absolute path without a query or fragment.
fn path_modifier(spec: &PathModifierSpec) -> Result<PathModifier, String> {
    let (full, value) = match spec.kind.as_str() {
        "ReplaceFullPath" => (true, spec.replace_full_path.as_deref()),
        "ReplacePrefixMatch" => (false, spec.replace_prefix_match.as_deref()),
        other => return Err(format!("path modifier type {other:?} is not served")),
    };
    let value = value.unwrap_or(if full { "/" } else { "" });
    // An empty prefix replacement drops the matched prefix (the specification's table).
    if !(value.starts_with('/') || (value.is_empty() && !full))
        || value.contains(['?', '#'])
        || value.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "replacement path {value:?} is not an absolute path"
        ));
    }
    Ok(PathModifier {
        full,
        value: value.to_owned(),
    })
}

/// A hostname for a rewrite or redirect: lower case, a valid name without a wildcard.
fn hostname(name: &str) -> Result<String, String> {
    let lower = name.to_ascii_lowercase();
    let ok = !lower.is_empty()
        && lower.len() <= 253
        && lower.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(lower)
    } else {
        Err(format!("{name:?} is not a hostname"))
    }
}

/// What a rule does, or why it cannot be served.
fn action(
    rule: &Rule,
    (kind, route_ns): (RouteKind, &str),
    grants: &[std::sync::Arc<super::ReferenceGrant>],
    service_port: &impl Fn(&str, &str, i64) -> bool,
) -> Result<Action, String> {
    let mut headers = HeaderModifier::default();
    let mut response_headers = HeaderModifier::default();
    let mut rewrite = None;
    let mut redirect = None;
    let mut cors_filter = None;
    let mut mirrors = Vec::new();
    let resolve = |target: &ObjectRef| {
        attach::backend_ref(target, kind, route_ns, grants, |ns, name| {
            state_has(service_port, ns, name, target.port)
        })
        .and_then(|(ns, name)| match target.port {
            Some(port) => Ok(format!("{ns}/{name}:{port}")),
            None => Err(Unresolved::BackendNotFound),
        })
    };
    for f in &rule.filters {
        match f.kind.as_str() {
            "RequestHeaderModifier" => {
                if let Some(m) = &f.request_header_modifier {
                    headers = checked_modifier(m)?;
                }
            }
            "ResponseHeaderModifier" => {
                if let Some(m) = &f.response_header_modifier {
                    response_headers = checked_modifier(m)?;
                }
            }
            "RequestMirror" if kind == RouteKind::Grpc => {
                return Err(
                    "filter RequestMirror is not served on a GRPCRoute: a gRPC call has a body, \
                     and requests with a body are not copied"
                        .into(),
                );
            }
            "RequestMirror" => {
                if mirrors.len() == holdfast_proto::snapshot::MAX_MIRRORS_PER_ROUTE {
                    return Err(format!(
                        "more than {} RequestMirror filters",
                        holdfast_proto::snapshot::MAX_MIRRORS_PER_ROUTE
                    ));
                }
                if let Some(m) = &f.request_mirror {
                    let (numerator, denominator) = mirror_share(m)?;
                    mirrors.push(Mirror {
                        backend: resolve(&m.backend_ref),
                        numerator,
                        denominator,
                    });
                }
            }
            "CORS" => {
                if let Some(c) = &f.cors {
                    cors_filter = Some(Box::new(cors(c)?));
                }
            }
            "URLRewrite" => {
                let Some(r) = &f.url_rewrite else { continue };
                rewrite = Some(Rewrite {
                    hostname: r.hostname.as_deref().map(hostname).transpose()?,
                    path: r.path.as_ref().map(path_modifier).transpose()?,
                });
            }
            "RequestRedirect" => {
                let Some(r) = &f.request_redirect else {
                    continue;
                };
                let status = match r.status_code.unwrap_or(302) {
                    s @ (301 | 302 | 303 | 307 | 308) => s as u16,
                    other => {
                        return Err(format!(
                            "redirect status {other} is not 301, 302, 303, 307 or 308"
                        ));
                    }
                };
                let scheme = match r.scheme.as_deref() {
                    None => None,
                    Some(s @ ("http" | "https")) => Some(s.to_owned()),
                    Some(other) => return Err(format!("redirect scheme {other:?}")),
                };
                let port = match r.port {
                    None => None,
                    Some(p) => Some(
                        u16::try_from(p)
                            .ok()
                            .filter(|p| *p != 0)
                            .ok_or_else(|| format!("redirect port {p}"))?,
                    ),
                };
                redirect = Some(Redirect {
                    scheme,
                    hostname: r.hostname.as_deref().map(hostname).transpose()?,
                    port,
                    status,
                    path: r.path.as_ref().map(path_modifier).transpose()?,
                });
            }
            other => return Err(format!("filter {other} is not served yet")),
        }
    }
    if let Some(r) = redirect {
        if rewrite.is_some() {
            return Err("a rule cannot both redirect and rewrite".into());
        }
        if !mirrors.is_empty() {
            return Err("a rule cannot both redirect and mirror".into());
        }
        return Ok(Action::Redirect(r));
    }
    let mut backends = Vec::new();
    for b in &rule.backend_refs {
        let mut request_headers = HeaderModifier::default();
        let mut response_headers = HeaderModifier::default();
        for f in &b.filters {
            match (
                f.kind.as_str(),
                &f.request_header_modifier,
                &f.response_header_modifier,
            ) {
                ("RequestHeaderModifier", Some(m), _) => request_headers = checked_modifier(m)?,
                ("ResponseHeaderModifier", _, Some(m)) => response_headers = checked_modifier(m)?,
                (other, _, _) => {
                    return Err(format!("backendRef filter {other} is not served"));
                }
            }
        }
        let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
        backends.push(Weighted {
            backend: resolve(&b.target),
            weight,
            request_headers,
            response_headers,
        });
    }
    let spec = rule.timeouts.clone().unwrap_or_default();
    let timeouts = Timeouts {
        request: spec.request.as_deref().map(gateway_duration).transpose()?,
        backend_request: spec
            .backend_request
            .as_deref()
            .map(gateway_duration)
            .transpose()?,
    };
    if let Timeouts {
        request: Some(request),
        backend_request: Some(backend),
    } = timeouts
        && !request.is_zero()
        && backend > request
    {
        return Err("timeouts.backendRequest must not be longer than timeouts.request".into());
    }
    Ok(Action::Forward {
        backends,
        headers,
        response_headers,
        rewrite,
        timeouts,
        cors: cors_filter,
        retry: rule
            .retry
            .as_ref()
            .map(|r| retry_policy(r).map(Box::new))
            .transpose()?,
        mirrors: mirrors.into_boxed_slice(),
    })
}

/// A RequestMirror's share of the requests, as numerator and denominator: `percent` of
/// 100, or its `fraction` (denominator 100 when not given); every request when it gives
/// neither.
fn mirror_share(m: &MirrorSpec) -> Result<(u32, u32), String> {
    let (numerator, denominator) = match (m.percent, &m.fraction) {
        (Some(_), Some(_)) => return Err("a mirror gives both a percent and a fraction".into()),
        (Some(p), None) => (p, 100),
        (None, Some(f)) => (f.numerator, f.denominator.unwrap_or(100)),
        (None, None) => (100, 100),
    };
    match (u32::try_from(numerator), u32::try_from(denominator)) {
        (Ok(n), Ok(d)) if d > 0 && n <= d => Ok((n, d)),
        _ => Err(format!(
            "a mirror's share {numerator}/{denominator} is not a fraction of at most 1"
        )),
    }
}

/// A rule's `retry`, checked: codes 400-599 (the CRD's range); attempts, 1
/// when not given (the specification leaves that default to implementations); backoff a
/// duration.
fn retry_policy(spec: &RetrySpec) -> Result<RetryPolicy, String> {
    let mut codes = Vec::new();
    for c in &spec.codes {
        match u32::try_from(*c) {
            Ok(code @ 400..=599) => codes.push(code),
            _ => return Err(format!("retry code {c} is not 400-599")),
        }
    }
    let attempts = match spec.attempts {
        None => 1,
        Some(n) => u32::try_from(n).map_err(|_| format!("retry attempts {n}"))?,
    };
    let backoff_ms = match spec.backoff.as_deref() {
        None => 0,
        Some(text) => u64::try_from(gateway_duration(text)?.as_millis()).unwrap_or(u64::MAX),
    };
    Ok(RetryPolicy {
        codes,
        attempts,
        backoff_ms,
    })
}

/// Whether the Service exists with that port (a reference without a port never
/// resolves: the port is required for a Service).
fn state_has(
    service_port: &impl Fn(&str, &str, i64) -> bool,
    ns: &str,
    name: &str,
    port: Option<i64>,
) -> bool {
    port.is_some_and(|p| service_port(ns, name, p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway_api::attach::SecretCheck;
    use crate::gateway_api::{DEFAULT_CONTROLLER_NAME as OURS, model, status::Pool};
    use serde_json::{Value, json};
    use std::sync::Arc;

    fn object<T: serde::de::DeserializeOwned>(v: Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).expect("an object"))
    }

    fn state(routes: Vec<Value>) -> ClusterState {
        ClusterState {
            gateway_classes: vec![object(
                json!({ "metadata": { "name": "c" }, "spec": { "controllerName": OURS } }),
            )],
            gateways: vec![object(json!({
                "metadata": { "name": "gw", "namespace": "infra", "creationTimestamp": "2026-01-01T00:00:00Z" },
                "spec": { "gatewayClassName": "c", "listeners": [
                    { "name": "http", "port": 80, "protocol": "HTTP",
                      "allowedRoutes": { "namespaces": { "from": "All" } } },
                    { "name": "wild", "port": 8080, "protocol": "HTTP", "hostname": "*.example.com" }
                ] }
            }))],
            services: vec![
                object(
                    json!({ "metadata": { "name": "v1", "namespace": "infra" }, "spec": { "ports": [{ "port": 8080 }] } }),
                ),
                object(
                    json!({ "metadata": { "name": "v2", "namespace": "infra" }, "spec": { "ports": [{ "port": 8080 }] } }),
                ),
            ],
            http_routes: routes.into_iter().map(object).collect(),
            ..Default::default()
        }
    }

    fn route(name: &str, created: &str, spec: Value) -> Value {
        json!({ "metadata": { "name": name, "namespace": "infra", "creationTimestamp": created }, "spec": spec })
    }

    fn build(st: &ClusterState) -> (Vec<PortRoutes>, Vec<Refused>) {
        let pool = Pool::parse("127.10.0.0/16").unwrap();
        let resolved = model::resolve(st, OURS, Some(&pool), None, |_, _| SecretCheck::Usable);
        routes(&resolved, st)
    }

    fn paths(p: &PortRoutes, host: &str) -> Vec<String> {
        p.hosts[host]
            .iter()
            .map(|e| {
                let path = match &e.path {
                    PathMatch::Exact(p) => format!("={p}"),
                    PathMatch::Prefix(p) => p.clone(),
                };
                if e.headers.is_empty() {
                    path
                } else {
                    format!("{path}+h{}", e.headers.len())
                }
            })
            .collect()
    }

    #[test]
    fn entries_are_ordered_exact_then_longest_prefix_then_most_headers_then_oldest() {
        let st = state(vec![
            route(
                "b-newer",
                "2026-02-01T00:00:00Z",
                json!({
                "parentRefs": [{ "name": "gw", "sectionName": "http" }],
                "rules": [
                    { "matches": [{ "path": { "type": "PathPrefix", "value": "/a/" } }],
                      "backendRefs": [{ "name": "v2", "port": 8080 }] },
                    { "matches": [{ "path": { "type": "PathPrefix", "value": "/" },
                                    "headers": [{ "name": "X-One", "value": "1" }, { "name": "x-two", "value": "2" }] }],
                      "backendRefs": [{ "name": "v2", "port": 8080 }] }
                ] }),
            ),
            route(
                "a-older",
                "2026-01-15T00:00:00Z",
                json!({
                "parentRefs": [{ "name": "gw", "sectionName": "http" }],
                "rules": [
                    { "matches": [{ "path": { "type": "PathPrefix", "value": "/a" } }, { "path": { "type": "Exact", "value": "/a" } }],
                      "backendRefs": [{ "name": "v1", "port": 8080 }] },
                    { "backendRefs": [{ "name": "v1", "port": 8080 }] }
                ] }),
            ),
        ]);
        let (ports, refused) = build(&st);
        assert_eq!(refused, vec![]);
        let http = ports.iter().find(|p| p.port == 80).expect("port 80");
        assert_eq!(paths(http, ""), ["=/a", "/a", "/a", "/+h2", "/"]);
        let hosts: Vec<&(String, usize)> = http.hosts[""].iter().map(|e| &e.source).collect();
        // Same path /a from both routes: the older route first.
        assert_eq!(hosts[1].0, "infra/a-older");
        assert_eq!(hosts[2].0, "infra/b-newer");
        assert!(
            ports.iter().any(|p| p.port == 8080 && p.hosts.is_empty()),
            "a listener without routes is still there"
        );
    }

    #[test]
    fn at_one_path_a_method_match_comes_first_then_most_headers_then_most_query_parameters() {
        let st = state(vec![route(
            "m",
            "2026-01-01T00:00:00Z",
            json!({
            "parentRefs": [{ "name": "gw", "sectionName": "http" }],
            "rules": [
                { "matches": [{ "queryParams": [{ "name": "a", "value": "1" }, { "name": "b", "value": "2" }] }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "headers": [{ "name": "h", "value": "1" }],
                                "queryParams": [{ "name": "a", "value": "1" }, { "name": "a", "value": "9" }] }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "headers": [{ "name": "h", "value": "1" }] }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "method": "PATCH" }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "method": "FETCH" }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] }
            ] }),
        )]);
        let (ports, refused) = build(&st);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].reason.contains("FETCH"), "{refused:?}");
        let http = ports.iter().find(|p| p.port == 80).unwrap();
        let shape: Vec<(Option<&str>, usize, usize)> = http.hosts[""]
            .iter()
            .map(|e| (e.method.as_deref(), e.headers.len(), e.query.len()))
            .collect();
        assert_eq!(
            shape,
            [
                (Some("PATCH"), 0, 0),
                (None, 1, 1),
                (None, 1, 0),
                (None, 0, 2)
            ],
            "of several matches of one parameter name only the first counts"
        );
    }

    #[test]
    fn durations_are_read_as_the_gateway_api_writes_them() {
        use std::time::Duration;
        assert_eq!(gateway_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(gateway_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(
            gateway_duration("1h30m5s10ms"),
            Ok(Duration::from_millis(5_405_010))
        );
        for bad in ["", "10", "1.5s", "1d", "123456s", "1h1m1s1ms1s", "-1s", "s"] {
            assert!(gateway_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn backends_are_weighted_and_an_unresolved_one_keeps_its_share() {
        let st = state(vec![route(
            "w",
            "2026-01-01T00:00:00Z",
            json!({
            "parentRefs": [{ "name": "gw" }],
            "hostnames": ["a.example.com"],
            "rules": [{ "backendRefs": [
                { "name": "v1", "port": 8080, "weight": 3 },
                { "name": "v2", "port": 8080 },
                { "name": "nosuch", "port": 8080, "weight": 2 },
                { "name": "v1", "port": 9999 }
            ] }] }),
        )]);
        let (ports, _) = build(&st);
        let http = ports.iter().find(|p| p.port == 80).unwrap();
        let wild = ports.iter().find(|p| p.port == 8080).unwrap();
        assert_eq!(http.hosts.keys().collect::<Vec<_>>(), ["a.example.com"]);
        assert_eq!(
            wild.hosts.keys().collect::<Vec<_>>(),
            ["a.example.com"],
            "intersected with *.example.com"
        );
        let Action::Forward { backends, .. } = &http.hosts["a.example.com"][0].action else {
            panic!("a forward");
        };
        assert_eq!(
            backends,
            &vec![
                Weighted {
                    backend: Ok("infra/v1:8080".into()),
                    weight: 3,
                    request_headers: HeaderModifier::default(),
                    response_headers: HeaderModifier::default(),
                },
                Weighted {
                    backend: Ok("infra/v2:8080".into()),
                    weight: 1,
                    request_headers: HeaderModifier::default(),
                    response_headers: HeaderModifier::default(),
                },
                Weighted {
                    backend: Err(Unresolved::BackendNotFound),
                    weight: 2,
                    request_headers: HeaderModifier::default(),
                    response_headers: HeaderModifier::default(),
                },
                Weighted {
                    backend: Err(Unresolved::BackendNotFound),
                    weight: 1,
                    request_headers: HeaderModifier::default(),
                    response_headers: HeaderModifier::default(),
                },
            ]
        );
    }

    #[test]
    fn filters_become_header_changes_or_a_redirect_and_what_is_not_served_is_refused() {
        let st = state(vec![route(
            "f",
            "2026-01-01T00:00:00Z",
            json!({
            "parentRefs": [{ "name": "gw", "sectionName": "http" }],
            "rules": [
                { "matches": [{ "path": { "value": "/h" } }],
                  "filters": [{ "type": "RequestHeaderModifier", "requestHeaderModifier": {
                      "set": [{ "name": "X-Set", "value": "s" }], "add": [{ "name": "X-Add", "value": "a" }], "remove": ["X-Gone"] } }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/r" } }],
                  "filters": [{ "type": "RequestRedirect", "requestRedirect": { "hostname": "Example.org", "statusCode": 301 } }] },
                { "matches": [{ "path": { "value": "/m" },
                                "queryParams": [{ "type": "RegularExpression", "name": "q", "value": "a.*" }] }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/w" } }],
                  "filters": [
                      { "type": "URLRewrite", "urlRewrite": { "hostname": "Up.example", "path": {
                          "type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2/" } } },
                      { "type": "ResponseHeaderModifier", "responseHeaderModifier": {
                          "add": [{ "name": "X-Out", "value": "o" }], "remove": ["Server"] } }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/p" } }],
                  "filters": [{ "type": "RequestRedirect", "requestRedirect": {
                      "path": { "type": "ReplaceFullPath", "replaceFullPath": "/new" } } }] },
                { "matches": [{ "path": { "type": "Exact", "value": "/exact" } }],
                  "filters": [{ "type": "URLRewrite", "urlRewrite": { "path": {
                      "type": "ReplacePrefixMatch", "replacePrefixMatch": "/x" } } }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/strip" } }],
                  "filters": [{ "type": "URLRewrite", "urlRewrite": { "path": {
                      "type": "ReplacePrefixMatch", "replacePrefixMatch": "" } } }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/bad" } }],
                  "filters": [{ "type": "URLRewrite", "urlRewrite": { "path": {
                      "type": "ReplaceFullPath", "replaceFullPath": "no-slash" } } }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "type": "RegularExpression", "value": "/x.*" } }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/c" } }],
                  "filters": [{ "type": "ExtensionRef", "extensionRef": {
                      "group": "example.com", "kind": "Thing", "name": "t" } }],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] }
            ] }),
        )]);
        let (ports, refused) = build(&st);
        let http = ports.iter().find(|p| p.port == 80).unwrap();
        let by_path = |p: &str| {
            http.hosts[""]
                .iter()
                .find(|e| e.path == PathMatch::Prefix(p.into()))
                .map(|e| e.action.clone())
        };
        let Some(Action::Forward { headers, .. }) = by_path("/h") else {
            panic!("/h forwards")
        };
        assert_eq!(
            headers.set,
            vec![NameValue {
                name: "X-Set".into(),
                value: "s".into()
            }]
        );
        assert_eq!(headers.remove, vec!["X-Gone".to_owned()]);
        assert_eq!(
            by_path("/r"),
            Some(Action::Redirect(Redirect {
                scheme: None,
                hostname: Some("example.org".into()),
                port: None,
                status: 301,
                path: None,
            }))
        );
        let Some(Action::Forward {
            rewrite,
            response_headers,
            ..
        }) = by_path("/w")
        else {
            panic!("/w forwards")
        };
        assert_eq!(
            rewrite,
            Some(Rewrite {
                hostname: Some("up.example".into()),
                path: Some(PathModifier {
                    full: false,
                    value: "/v2/".into()
                }),
            })
        );
        assert_eq!(response_headers.remove, vec!["Server".to_owned()]);
        assert_eq!(response_headers.add.len(), 1);
        let Some(Action::Redirect(r)) = by_path("/p") else {
            panic!("/p redirects")
        };
        assert_eq!(
            r.path,
            Some(PathModifier {
                full: true,
                value: "/new".into()
            })
        );
        for p in ["/m", "/x.*", "/c", "/bad"] {
            assert_eq!(
                by_path(p),
                None,
                "{p} is not served more broadly than written"
            );
        }
        let reasons: Vec<&str> = refused.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(refused.len(), 5, "{reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("needs a PathPrefix")));
        assert!(
            by_path("/strip").is_some(),
            "an empty prefix replacement is served"
        );
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("query parameter match type"))
        );
        assert!(reasons.iter().any(|r| r.contains("no-slash")));
        assert!(reasons.iter().any(|r| r.contains("RegularExpression")));
        assert!(reasons.iter().any(|r| r.contains("ExtensionRef")));
    }

    #[test]
    fn mirrors_carry_their_backend_and_share_and_a_bad_share_or_a_redirect_with_one_is_refused() {
        let mirror = |backend: Value, share: Value| {
            let mut m = json!({ "backendRef": backend });
            for (k, v) in share.as_object().into_iter().flatten() {
                m[k] = v.clone();
            }
            json!({ "type": "RequestMirror", "requestMirror": m })
        };
        let v2 = json!({ "name": "v2", "port": 8080 });
        let st = state(vec![route(
            "m",
            "2026-01-01T00:00:00Z",
            json!({
            "parentRefs": [{ "name": "gw", "sectionName": "http" }],
            "rules": [
                { "matches": [{ "path": { "value": "/all" } }],
                  "filters": [mirror(v2.clone(), json!({})),
                              mirror(json!({ "name": "missing", "port": 8080 }), json!({ "percent": 20 }))],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/fraction" } }],
                  "filters": [mirror(v2.clone(), json!({ "fraction": { "numerator": 25, "denominator": 50 } })),
                              mirror(v2.clone(), json!({ "fraction": { "numerator": 3 } }))],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/over" } }],
                  "filters": [mirror(v2.clone(), json!({ "fraction": { "numerator": 3, "denominator": 2 } }))],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/both" } }],
                  "filters": [mirror(v2.clone(), json!({ "percent": 5, "fraction": { "numerator": 1 } }))],
                  "backendRefs": [{ "name": "v1", "port": 8080 }] },
                { "matches": [{ "path": { "value": "/redirect" } }],
                  "filters": [mirror(v2, json!({})),
                              { "type": "RequestRedirect", "requestRedirect": { "statusCode": 301 } }] }
            ] }),
        )]);
        let (ports, refused) = build(&st);
        let http = ports.iter().find(|p| p.port == 80).unwrap();
        let mirrors = |p: &str| {
            http.hosts[""]
                .iter()
                .find(|e| e.path == PathMatch::Prefix(p.into()))
                .map(|e| match &e.action {
                    Action::Forward { mirrors, .. } => mirrors.clone(),
                    Action::Redirect(_) => panic!("{p} redirects"),
                })
        };
        let share = |m: &Mirror| (m.backend.clone(), m.numerator, m.denominator);
        let all = mirrors("/all").expect("/all is served");
        assert_eq!(
            all.iter().map(share).collect::<Vec<_>>(),
            vec![
                (Ok("infra/v2:8080".to_owned()), 100, 100),
                (Err(Unresolved::BackendNotFound), 20, 100),
            ]
        );
        let fraction = mirrors("/fraction").expect("/fraction is served");
        assert_eq!(
            fraction
                .iter()
                .map(|m| (m.numerator, m.denominator))
                .collect::<Vec<_>>(),
            vec![(25, 50), (3, 100)]
        );
        for p in ["/over", "/both", "/redirect"] {
            assert_eq!(mirrors(p), None, "{p} is refused");
        }
        let reasons: Vec<&str> = refused.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(refused.len(), 3, "{reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("3/2")), "{reasons:?}");
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("both a percent and a fraction"))
        );
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("both redirect and mirror"))
        );
        // A GRPCRoute's rule with a mirror is refused: every gRPC call has a body.
        let rule: Rule = serde_json::from_value(json!({
            "filters": [mirror(json!({ "name": "v2", "port": 8080 }), json!({}))],
            "backendRefs": [{ "name": "v1", "port": 8080 }] }))
        .unwrap();
        let any_port = |_: &str, _: &str, _: i64| true;
        let grpc = action(&rule, (RouteKind::Grpc, "infra"), &[], &any_port);
        assert!(grpc.is_err_and(|why| why.contains("GRPCRoute")));
        assert!(action(&rule, (RouteKind::Http, "infra"), &[], &any_port).is_ok());
        // At most 16 mirrors.
        let many: Vec<Value> = (0..17)
            .map(|_| mirror(json!({ "name": "v2", "port": 8080 }), json!({})))
            .collect();
        let rule: Rule = serde_json::from_value(json!({
            "filters": many, "backendRefs": [{ "name": "v1", "port": 8080 }] }))
        .unwrap();
        let refused = action(&rule, (RouteKind::Http, "infra"), &[], &any_port);
        assert!(refused.is_err_and(|why| why.contains("more than 16")));
    }
}
