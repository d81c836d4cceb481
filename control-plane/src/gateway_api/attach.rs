//! Which routes attach to which Gateway listeners, and the conditions that say so: pure
//! functions of the Gateway API specification (v1.6), each with its reasons.
//!
//! - [`listeners`]: a Gateway's listeners checked one by one (protocol, TLS certificate
//!   references through ReferenceGrant, route kinds) and against each other (a port's
//!   protocol, duplicate hostnames), with their `Accepted`, `ResolvedRefs` and
//!   `Conflicted` conditions and supported kinds.
//! - [`intersect`]: a listener's hostname and a route's hostnames, as the specification
//!   intersects them (`*.example.com` matches any number of labels in Gateway API, unlike
//!   Ingress's one).
//! - [`attach`]: one `parentRef` of an HTTPRoute to a Gateway: which listeners take it (by
//!   `sectionName`, `port`, `allowedRoutes` and hostname) or why none does.
//! - [`granted`]: whether a ReferenceGrant lets an object refer to another namespace's.
//! - [`backend_ref`]: whether a route's `backendRef` resolves, or its `ResolvedRefs` reason.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{GROUP, ReferenceGrant, RouteKind};

/// `spec` of a Gateway, as far as attachment reads it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewaySpec {
    /// The GatewayClass.
    pub gateway_class_name: String,
    /// Its listeners.
    pub listeners: Vec<ListenerSpec>,
}

/// One listener of a Gateway.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListenerSpec {
    /// Unique within the Gateway.
    pub name: String,
    /// The hostname it serves (a one-or-more-label wildcard `*.example.com` allowed); None:
    /// every hostname.
    pub hostname: Option<String>,
    /// Port.
    pub port: i64,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or an implementation's own.
    pub protocol: String,
    /// TLS settings (HTTPS).
    pub tls: Option<TlsSpec>,
    /// Which routes may attach.
    pub allowed_routes: Option<AllowedRoutes>,
}

/// A listener's TLS settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsSpec {
    /// `Terminate` (the default) or `Passthrough`.
    pub mode: Option<String>,
    /// The certificates (Secrets).
    pub certificate_refs: Vec<ObjectRef>,
}

/// A reference to an object (`certificateRefs`, `backendRefs`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectRef {
    /// API group ("" or None: core).
    pub group: Option<String>,
    /// Kind (None: the field's default, `Secret` or `Service`).
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace (None: the referring object's).
    pub namespace: Option<String>,
    /// Port (`backendRefs`).
    pub port: Option<i64>,
}

/// A listener's `allowedRoutes`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AllowedRoutes {
    /// From which namespaces.
    pub namespaces: Option<RouteNamespaces>,
    /// Which kinds (empty: the protocol's defaults).
    pub kinds: Vec<RouteGroupKind>,
}

/// `allowedRoutes.namespaces`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteNamespaces {
    /// `Same` (the default), `All` or `Selector`.
    pub from: Option<String>,
    /// With `Selector`: the namespaces' labels must match.
    pub selector: Option<LabelSelector>,
}

/// A Kubernetes label selector.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    /// Each label must have this value.
    pub match_labels: BTreeMap<String, String>,
    /// Each expression must hold.
    pub match_expressions: Vec<LabelExpression>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelExpression {
    /// The label.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// For `In` and `NotIn`.
    pub values: Vec<String>,
}

/// A route kind (`allowedRoutes.kinds`, `supportedKinds`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteGroupKind {
    /// Group (None: gateway.networking.k8s.io).
    pub group: Option<String>,
    /// Kind.
    pub kind: String,
}

/// `spec` of an HTTPRoute, as far as attachment reads it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteSpec {
    /// The Gateways (and listeners) it attaches to.
    pub parent_refs: Vec<ParentRef>,
    /// Hostnames it serves (empty: the listeners').
    pub hostnames: Vec<String>,
}

/// One `parentRef` of a route.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct ParentRef {
    /// Group (None: gateway.networking.k8s.io).
    pub group: Option<String>,
    /// Kind (None: Gateway).
    pub kind: Option<String>,
    /// Namespace (None: the route's).
    pub namespace: Option<String>,
    /// The Gateway.
    pub name: String,
    /// One listener by name.
    pub section_name: Option<String>,
    /// Listeners on this port.
    pub port: Option<i64>,
}

/// A status condition, before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Accepted`, `ResolvedRefs`, `Conflicted`, ...
    pub kind: &'static str,
    /// True or False.
    pub status: bool,
    /// The specification's reason.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl Condition {
    fn new(
        kind: &'static str,
        status: bool,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Condition {
            kind,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// A listener after its checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Its name.
    pub name: String,
    /// Port.
    pub port: i64,
    /// Protocol as written.
    pub protocol: String,
    /// Hostname (None: any).
    pub hostname: Option<String>,
    /// The route kinds it takes (those of `allowedRoutes.kinds` holdfast serves, or the
    /// protocol's defaults).
    pub supported_kinds: Vec<RouteGroupKind>,
    /// Its certificates (`namespace/name` of Secrets), for HTTPS.
    pub certificates: Vec<String>,
    /// Accepted, ResolvedRefs and Conflicted.
    pub conditions: Vec<Condition>,
}

impl Listener {
    /// Whether it can be served: Accepted, not Conflicted, and every reference resolved.
    pub fn usable(&self) -> bool {
        self.conditions.iter().all(|c| match c.kind {
            "Conflicted" => !c.status,
            _ => c.status,
        })
    }

    /// Whether routes may attach: Accepted and not Conflicted. Unresolved references
    /// (a missing certificate) do not stop attachment, as the specification says: the
    /// listener counts its routes, and serves them once its references resolve.
    pub fn takes_routes(&self) -> bool {
        self.conditions.iter().all(|c| match c.kind {
            "Conflicted" => !c.status,
            "Accepted" => c.status,
            _ => true,
        })
    }
}

/// What a Secret reference resolves to, as the caller found it in its caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretCheck {
    /// A `kubernetes.io/tls` Secret holding a certificate and key that match.
    Usable,
    /// Not in the cache of TLS Secrets (missing, or of another type).
    Missing,
    /// Present, but its certificate or key cannot be used.
    Invalid,
}

fn route_group_kind(kind: RouteKind) -> RouteGroupKind {
    RouteGroupKind {
        group: Some(GROUP.into()),
        kind: kind.name().into(),
    }
}

/// The route kinds a listener of `protocol` takes (none: holdfast does not serve it):
/// HTTPRoute and GRPCRoute on HTTP and HTTPS; TLSRoute on TLS (passthrough).
fn route_kinds(protocol: &str) -> &'static [RouteKind] {
    match protocol {
        "HTTP" | "HTTPS" => &[RouteKind::Http, RouteKind::Grpc],
        "TLS" => &[RouteKind::Tls],
        _ => &[],
    }
}

/// `gateway`'s listeners (in namespace `namespace`) checked: see the module
/// documentation. `secret` says what a Secret reference is; `grants` are every
/// ReferenceGrant.
pub fn listeners(
    namespace: &str,
    gateway: &GatewaySpec,
    grants: &[std::sync::Arc<ReferenceGrant>],
    secret: impl Fn(&str, &str) -> SecretCheck,
) -> Vec<Listener> {
    let mut out = Vec::with_capacity(gateway.listeners.len());
    for l in &gateway.listeners {
        let mut conditions = Vec::new();
        let kinds_of_protocol = route_kinds(&l.protocol);
        let supported_protocol = !kinds_of_protocol.is_empty();
        // Route kinds: those asked for that holdfast serves; an unknown kind is refused.
        let (mut supported_kinds, kinds_ok) = match l.allowed_routes.as_ref().map(|a| &a.kinds) {
            Some(kinds) if !kinds.is_empty() => {
                let served: Vec<RouteGroupKind> = kinds
                    .iter()
                    .filter_map(|k| {
                        let ours = k.group.as_deref().unwrap_or(GROUP) == GROUP;
                        kinds_of_protocol
                            .iter()
                            .find(|r| ours && k.kind == r.name())
                            .map(|r| route_group_kind(*r))
                    })
                    .collect();
                let all = served.len() == kinds.len();
                let mut served = served;
                let mut seen = Vec::new();
                served.retain(|k| {
                    let first = !seen.contains(k);
                    seen.push(k.clone());
                    first
                });
                (served, all)
            }
            _ => (
                kinds_of_protocol
                    .iter()
                    .map(|r| route_group_kind(*r))
                    .collect(),
                true,
            ),
        };
        if supported_protocol {
            conditions.push(Condition::new(
                "Accepted",
                true,
                "Accepted",
                "the listener is accepted",
            ));
        } else {
            conditions.push(Condition::new(
                "Accepted",
                false,
                "UnsupportedProtocol",
                format!(
                    "protocol {:?} is not supported (HTTP, HTTPS and TLS are)",
                    l.protocol
                ),
            ));
        }
        let mut certificates = Vec::new();
        let mut resolved: Result<(), (&'static str, String)> = Ok(());
        if !kinds_ok {
            resolved = Err((
                "InvalidRouteKinds",
                "allowedRoutes.kinds names a kind holdfast does not serve".into(),
            ));
        }
        if l.protocol == "TLS"
            && l.tls
                .as_ref()
                .and_then(|t| t.mode.as_deref())
                .unwrap_or("Terminate")
                != "Passthrough"
        {
            conditions[0] = Condition::new(
                "Accepted",
                false,
                "UnsupportedValue",
                "a TLS listener is served in mode Passthrough only (Terminate is not served)",
            );
            // It takes no route of any kind.
            supported_kinds.clear();
        }
        if l.protocol == "HTTPS" {
            let tls = l.tls.clone().unwrap_or_default();
            if tls.mode.as_deref().unwrap_or("Terminate") != "Terminate" {
                conditions[0] = Condition::new(
                    "Accepted",
                    false,
                    "UnsupportedValue",
                    "an HTTPS listener terminates TLS (mode Terminate)",
                );
            }
            if tls.certificate_refs.is_empty() {
                resolved = resolved.and(Err((
                    "InvalidCertificateRef",
                    "an HTTPS listener needs a certificateRef".into(),
                )));
            }
            for r in &tls.certificate_refs {
                let ns = r.namespace.as_deref().unwrap_or(namespace);
                let group = r.group.as_deref().unwrap_or("");
                let kind = r.kind.as_deref().unwrap_or("Secret");
                let this = if !group.is_empty() || kind != "Secret" {
                    Err((
                        "InvalidCertificateRef",
                        format!("certificateRef {group}/{kind} {:?} is not a Secret", r.name),
                    ))
                } else if ns != namespace
                    && !granted(grants, "Gateway", namespace, "", "Secret", ns, &r.name)
                {
                    Err((
                        "RefNotPermitted",
                        format!(
                            "no ReferenceGrant in {ns} lets this Gateway use Secret {ns}/{}",
                            r.name
                        ),
                    ))
                } else {
                    match secret(ns, &r.name) {
                        SecretCheck::Usable => {
                            certificates.push(format!("{ns}/{}", r.name));
                            Ok(())
                        }
                        SecretCheck::Missing => Err((
                            "InvalidCertificateRef",
                            format!(
                                "Secret {ns}/{} is not a kubernetes.io/tls Secret that exists",
                                r.name
                            ),
                        )),
                        SecretCheck::Invalid => Err((
                            "InvalidCertificateRef",
                            format!("Secret {ns}/{} holds no usable certificate and key", r.name),
                        )),
                    }
                };
                // The first failure is the one reported.
                resolved = resolved.and(this);
            }
        }
        conditions.push(match resolved {
            Ok(()) => Condition::new(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "every reference is resolved",
            ),
            Err((reason, message)) => Condition::new("ResolvedRefs", false, reason, message),
        });
        out.push(Listener {
            name: l.name.clone(),
            port: l.port,
            protocol: l.protocol.clone(),
            hostname: l.hostname.as_ref().map(|h| h.to_ascii_lowercase()),
            supported_kinds,
            certificates,
            conditions,
        });
    }
    // Conflicts: one port, one protocol; and no two listeners of a port with one hostname.
    let snapshot: Vec<(i64, String, Option<String>)> = out
        .iter()
        .map(|l| (l.port, l.protocol.clone(), l.hostname.clone()))
        .collect();
    for (i, l) in out.iter_mut().enumerate() {
        let protocol_conflict = snapshot
            .iter()
            .any(|(port, protocol, _)| *port == l.port && *protocol != l.protocol);
        let hostname_conflict = snapshot
            .iter()
            .enumerate()
            .any(|(j, (port, protocol, host))| {
                j != i && *port == l.port && *protocol == l.protocol && *host == l.hostname
            });
        l.conditions.push(if protocol_conflict {
            Condition::new(
                "Conflicted",
                true,
                "ProtocolConflict",
                "another listener uses this port with another protocol",
            )
        } else if hostname_conflict {
            Condition::new(
                "Conflicted",
                true,
                "HostnameConflict",
                "another listener on this port has the same hostname",
            )
        } else {
            Condition::new("Conflicted", false, "NoConflicts", "no conflicts")
        });
    }
    out
}

/// The hostnames a route serves on a listener: `Any` (neither names one), the
/// intersection, or `None` when they share no hostname.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hostnames {
    /// Any hostname.
    Any,
    /// These (lower-case; a wildcard `*.example.com` matches one or more labels).
    Some(Vec<String>),
    /// No hostname in common.
    None,
}

/// Whether `host` (a name, or a wildcard) is covered by `pattern` (a name, or a wildcard
/// `*.suffix` that matches one or more labels before `.suffix`).
fn covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .strip_suffix(suffix)
            .and_then(|rest| rest.strip_suffix('.'))
            .is_some_and(|rest| !rest.is_empty()),
        None => pattern == host,
    }
}

/// A listener's hostname and a route's `hostnames`, intersected as the specification
/// says: a route hostname the listener's covers is kept; a route wildcard that covers the
/// listener's hostname gives the listener's.
pub fn intersect(listener: Option<&str>, route: &[String]) -> Hostnames {
    let route: Vec<String> = route.iter().map(|h| h.to_ascii_lowercase()).collect();
    match (listener, route.is_empty()) {
        (None, true) => Hostnames::Any,
        (None, false) => Hostnames::Some(route),
        (Some(l), true) => Hostnames::Some(vec![l.to_ascii_lowercase()]),
        (Some(l), false) => {
            let l = l.to_ascii_lowercase();
            let mut out: Vec<String> = Vec::new();
            for h in &route {
                let kept = if covers(&l, h) || *h == l {
                    Some(h.clone())
                } else if covers(h, &l) {
                    Some(l.clone())
                } else {
                    None
                };
                if let Some(k) = kept
                    && !out.contains(&k)
                {
                    out.push(k);
                }
            }
            if out.is_empty() {
                Hostnames::None
            } else {
                Hostnames::Some(out)
            }
        }
    }
}

/// Whether `selector` matches `labels`.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().all(|e| {
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| e.values.contains(v)),
                "NotIn" => !value.is_some_and(|v| e.values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// Whether a ReferenceGrant in `to_namespace` lets a `from_kind` of
/// gateway.networking.k8s.io in `from_namespace` refer to `to_group`/`to_kind` `to_name`.
pub fn granted(
    grants: &[std::sync::Arc<ReferenceGrant>],
    from_kind: &str,
    from_namespace: &str,
    to_group: &str,
    to_kind: &str,
    to_namespace: &str,
    to_name: &str,
) -> bool {
    grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(to_namespace))
        .any(|g| {
            let from_ok = g.spec["from"].as_array().is_some_and(|from| {
                from.iter().any(|f| {
                    f["group"] == GROUP
                        && f["kind"] == from_kind
                        && f["namespace"] == from_namespace
                })
            });
            let to_ok = g.spec["to"].as_array().is_some_and(|to| {
                to.iter().any(|t| {
                    t["group"].as_str().unwrap_or("") == to_group
                        && t["kind"] == to_kind
                        && t["name"].as_str().is_none_or(|n| n == to_name)
                })
            });
            from_ok && to_ok
        })
}

/// Why a `parentRef` attached to no listener: the `Accepted` reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAttached {
    /// No listener has that `sectionName` or `port` (or none is usable).
    NoMatchingParent,
    /// The listeners' `allowedRoutes` refuse the route's namespace or kind.
    NotAllowedByListeners,
    /// No listener shares a hostname with the route.
    NoMatchingListenerHostname,
}

impl NotAttached {
    /// The reason as the specification spells it.
    pub fn reason(self) -> &'static str {
        match self {
            NotAttached::NoMatchingParent => "NoMatchingParent",
            NotAttached::NotAllowedByListeners => "NotAllowedByListeners",
            NotAttached::NoMatchingListenerHostname => "NoMatchingListenerHostname",
        }
    }
}

/// One `parentRef` of a route of `kind` against its Gateway (in `gateway_namespace`, with `spec` and
/// its checked `checked` listeners): the listeners it attaches to, each with the
/// hostnames it serves there, or why it attaches to none. `route_namespace_labels` are the
/// labels of the route's namespace (for `from: Selector`; None: not known, which no
/// selector matches).
pub fn attach<'a>(
    (kind, parent): (RouteKind, &ParentRef),
    route_namespace: &str,
    route_hostnames: &[String],
    gateway_namespace: &str,
    spec: &'a GatewaySpec,
    checked: &'a [Listener],
    route_namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<Vec<(&'a Listener, Hostnames)>, NotAttached> {
    let candidates: Vec<(&ListenerSpec, &Listener)> = spec
        .listeners
        .iter()
        .zip(checked)
        .filter(|(l, _)| parent.section_name.as_ref().is_none_or(|s| *s == l.name))
        .filter(|(l, _)| parent.port.is_none_or(|p| p == l.port))
        .filter(|(_, c)| c.takes_routes())
        .collect();
    if candidates.is_empty() {
        return Err(NotAttached::NoMatchingParent);
    }
    let allowed: Vec<(&ListenerSpec, &Listener)> = candidates
        .into_iter()
        .filter(|(l, c)| {
            let from = l
                .allowed_routes
                .as_ref()
                .and_then(|a| a.namespaces.as_ref());
            let namespace_ok = match from.and_then(|n| n.from.as_deref()).unwrap_or("Same") {
                "All" => true,
                "Same" => route_namespace == gateway_namespace,
                "Selector" => match (
                    from.and_then(|n| n.selector.as_ref()),
                    route_namespace_labels,
                ) {
                    (Some(selector), Some(labels)) => selects(selector, labels),
                    _ => false,
                },
                _ => false,
            };
            namespace_ok && c.supported_kinds.contains(&route_group_kind(kind))
        })
        .collect();
    if allowed.is_empty() {
        return Err(NotAttached::NotAllowedByListeners);
    }
    let attached: Vec<(&Listener, Hostnames)> = allowed
        .into_iter()
        .map(|(_, c)| (c, intersect(c.hostname.as_deref(), route_hostnames)))
        .filter(|(_, h)| *h != Hostnames::None)
        .collect();
    if attached.is_empty() {
        return Err(NotAttached::NoMatchingListenerHostname);
    }
    Ok(attached)
}

/// Why a `backendRef` does not resolve: the route's `ResolvedRefs` reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// Not a core Service.
    InvalidKind,
    /// In another namespace without a ReferenceGrant.
    RefNotPermitted,
    /// The Service does not exist (in a complete cache).
    BackendNotFound,
}

impl Unresolved {
    /// The reason as the specification spells it.
    pub fn reason(self) -> &'static str {
        match self {
            Unresolved::InvalidKind => "InvalidKind",
            Unresolved::RefNotPermitted => "RefNotPermitted",
            Unresolved::BackendNotFound => "BackendNotFound",
        }
    }
}

/// A `backendRef` of an HTTPRoute in `route_namespace`: its Service's namespace and
/// name, or why it does not resolve. `service_exists` looks the Service up in the (complete)
/// cache.
pub fn backend_ref(
    r: &ObjectRef,
    route_kind: RouteKind,
    route_namespace: &str,
    grants: &[std::sync::Arc<ReferenceGrant>],
    service_exists: impl Fn(&str, &str) -> bool,
) -> Result<(String, String), Unresolved> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        return Err(Unresolved::InvalidKind);
    }
    let ns = r.namespace.as_deref().unwrap_or(route_namespace);
    if ns != route_namespace
        && !granted(
            grants,
            route_kind.name(),
            route_namespace,
            "",
            "Service",
            ns,
            &r.name,
        )
    {
        return Err(Unresolved::RefNotPermitted);
    }
    if !service_exists(ns, &r.name) {
        return Err(Unresolved::BackendNotFound);
    }
    Ok((ns.to_owned(), r.name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn gateway(listeners: serde_json::Value) -> GatewaySpec {
        serde_json::from_value(json!({ "gatewayClassName": "holdfast", "listeners": listeners }))
            .expect("a Gateway spec")
    }

    fn grant(
        ns: &str,
        from_kind: &str,
        from_ns: &str,
        to_kind: &str,
        name: Option<&str>,
    ) -> Arc<ReferenceGrant> {
        let mut to = json!({ "group": "", "kind": to_kind });
        if let Some(n) = name {
            to["name"] = json!(n);
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": "g", "namespace": ns },
                "spec": {
                    "from": [{ "group": GROUP, "kind": from_kind, "namespace": from_ns }],
                    "to": [to],
                }
            }))
            .expect("a ReferenceGrant"),
        )
    }

    fn condition<'a>(l: &'a Listener, kind: &str) -> &'a Condition {
        l.conditions
            .iter()
            .find(|c| c.kind == kind)
            .expect("the condition")
    }

    #[test]
    fn an_http_listener_is_accepted_resolved_and_takes_httproutes_and_grpcroutes() {
        let spec = gateway(json!([{ "name": "http", "port": 80, "protocol": "HTTP" }]));
        let l = &listeners("infra", &spec, &[], |_, _| SecretCheck::Missing)[0];
        assert!(l.usable(), "{l:?}");
        assert_eq!(
            l.supported_kinds,
            vec![
                route_group_kind(RouteKind::Http),
                route_group_kind(RouteKind::Grpc)
            ]
        );
        assert_eq!(condition(l, "Conflicted").reason, "NoConflicts");
    }

    #[test]
    fn unsupported_protocols_and_route_kinds_are_refused_with_their_reasons() {
        let spec = gateway(json!([
            { "name": "udp", "port": 53, "protocol": "UDP" },
            { "name": "foo", "port": 80, "protocol": "HTTP",
              "allowedRoutes": { "kinds": [{ "kind": "FooRoute" }] } },
            { "name": "mixed", "port": 81, "protocol": "HTTP",
              "allowedRoutes": { "kinds": [{ "kind": "FooRoute" }, { "kind": "HTTPRoute" }] } }
        ]));
        let ls = listeners("infra", &spec, &[], |_, _| SecretCheck::Missing);
        assert_eq!(condition(&ls[0], "Accepted").reason, "UnsupportedProtocol");
        assert!(!ls[0].usable());
        assert_eq!(
            condition(&ls[1], "ResolvedRefs").reason,
            "InvalidRouteKinds"
        );
        assert!(ls[1].supported_kinds.is_empty());
        assert_eq!(
            condition(&ls[2], "ResolvedRefs").reason,
            "InvalidRouteKinds"
        );
        assert_eq!(
            ls[2].supported_kinds,
            vec![route_group_kind(RouteKind::Http)]
        );
    }

    #[test]
    fn a_listener_that_allows_one_route_kind_takes_only_that_kind() {
        let spec = gateway(json!([
            { "name": "grpc", "port": 80, "protocol": "HTTP",
              "allowedRoutes": { "kinds": [{ "kind": "GRPCRoute" }, { "kind": "GRPCRoute" }] } },
        ]));
        let ls = listeners("infra", &spec, &[], |_, _| SecretCheck::Missing);
        assert_eq!(
            ls[0].supported_kinds,
            vec![route_group_kind(RouteKind::Grpc)]
        );
        let parent = ParentRef {
            name: "gw".into(),
            ..Default::default()
        };
        let on = |kind| {
            attach((kind, &parent), "infra", &[], "infra", &spec, &ls, None).map(|v| v.len())
        };
        assert_eq!(on(RouteKind::Grpc), Ok(1));
        assert_eq!(on(RouteKind::Http), Err(NotAttached::NotAllowedByListeners));
    }

    #[test]
    fn an_https_listeners_certificate_must_exist_be_usable_and_be_granted_across_namespaces() {
        let https = |r: serde_json::Value| {
            gateway(json!([{ "name": "https", "port": 443, "protocol": "HTTPS",
                "tls": { "certificateRefs": [r] } }]))
        };
        let check = |ns: &str, name: &str| match (ns, name) {
            (_, "good") => SecretCheck::Usable,
            (_, "broken") => SecretCheck::Invalid,
            _ => SecretCheck::Missing,
        };
        let reason = |spec: &GatewaySpec, grants: &[Arc<ReferenceGrant>]| {
            let l = listeners("infra", spec, grants, check).remove(0);
            (condition(&l, "ResolvedRefs").reason, l.certificates)
        };
        assert_eq!(
            reason(&https(json!({ "name": "good" })), &[]),
            ("ResolvedRefs", vec!["infra/good".to_owned()])
        );
        assert_eq!(
            reason(&https(json!({ "name": "nosuch" })), &[]).0,
            "InvalidCertificateRef"
        );
        assert_eq!(
            reason(&https(json!({ "name": "broken" })), &[]).0,
            "InvalidCertificateRef"
        );
        assert_eq!(
            reason(&https(json!({ "name": "good", "kind": "ConfigMap" })), &[]).0,
            "InvalidCertificateRef"
        );
        let other = https(json!({ "name": "good", "namespace": "certs" }));
        assert_eq!(reason(&other, &[]).0, "RefNotPermitted");
        let for_other_kind = grant("certs", "HTTPRoute", "infra", "Secret", None);
        assert_eq!(reason(&other, &[for_other_kind]).0, "RefNotPermitted");
        let for_other_name = grant("certs", "Gateway", "infra", "Secret", Some("another"));
        assert_eq!(reason(&other, &[for_other_name]).0, "RefNotPermitted");
        let all = grant("certs", "Gateway", "infra", "Secret", None);
        assert_eq!(
            reason(&other, &[all]),
            ("ResolvedRefs", vec!["certs/good".to_owned()])
        );
        let named = grant("certs", "Gateway", "infra", "Secret", Some("good"));
        assert_eq!(reason(&other, &[named]).0, "ResolvedRefs");
        let none = gateway(json!([{ "name": "https", "port": 443, "protocol": "HTTPS" }]));
        assert_eq!(reason(&none, &[]).0, "InvalidCertificateRef");
    }

    #[test]
    fn listeners_sharing_a_port_conflict_on_protocol_or_hostname() {
        let spec = gateway(json!([
            { "name": "a", "port": 80, "protocol": "HTTP", "hostname": "a.example.com" },
            { "name": "b", "port": 80, "protocol": "HTTP", "hostname": "a.example.com" },
            { "name": "c", "port": 80, "protocol": "HTTP", "hostname": "c.example.com" },
            { "name": "d", "port": 8443, "protocol": "HTTP" },
            { "name": "e", "port": 8443, "protocol": "HTTPS",
              "tls": { "certificateRefs": [{ "name": "good" }] } }
        ]));
        let ls = listeners("infra", &spec, &[], |_, _| SecretCheck::Usable);
        let reasons: Vec<&str> = ls
            .iter()
            .map(|l| condition(l, "Conflicted").reason)
            .collect();
        assert_eq!(
            reasons,
            [
                "HostnameConflict",
                "HostnameConflict",
                "NoConflicts",
                "ProtocolConflict",
                "ProtocolConflict"
            ]
        );
        assert!(!ls[0].usable() && ls[2].usable() && !ls[3].usable());
    }

    #[test]
    fn hostnames_intersect_as_the_specification_says() {
        let some = |v: &[&str]| Hostnames::Some(v.iter().map(|s| (*s).to_owned()).collect());
        let r = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(intersect(None, &[]), Hostnames::Any);
        assert_eq!(
            intersect(None, &r(&["a.example.com"])),
            some(&["a.example.com"])
        );
        assert_eq!(
            intersect(Some("a.example.com"), &[]),
            some(&["a.example.com"])
        );
        assert_eq!(
            intersect(Some("a.example.com"), &r(&["A.example.com"])),
            some(&["a.example.com"])
        );
        assert_eq!(
            intersect(Some("a.example.com"), &r(&["b.example.com"])),
            Hostnames::None
        );
        // A listener wildcard covers one or more labels, never the bare suffix.
        assert_eq!(
            intersect(
                Some("*.example.com"),
                &r(&[
                    "a.example.com",
                    "a.b.example.com",
                    "example.com",
                    "a.example.net"
                ])
            ),
            some(&["a.example.com", "a.b.example.com"])
        );
        // A route wildcard covering the listener's name gives the listener's name.
        assert_eq!(
            intersect(Some("a.example.com"), &r(&["*.example.com"])),
            some(&["a.example.com"])
        );
        // Two wildcards: the narrower one.
        assert_eq!(
            intersect(Some("*.example.com"), &r(&["*.a.example.com"])),
            some(&["*.a.example.com"])
        );
        assert_eq!(
            intersect(Some("*.a.example.com"), &r(&["*.example.com"])),
            some(&["*.a.example.com"])
        );
        assert_eq!(
            intersect(Some("*.example.com"), &r(&["*.example.com"])),
            some(&["*.example.com"])
        );
        assert_eq!(
            intersect(Some("*.example.com"), &r(&["*.example.net"])),
            Hostnames::None
        );
    }

    #[test]
    fn a_parent_ref_attaches_by_section_port_namespace_and_hostname_or_says_why_not() {
        let spec = gateway(json!([
            { "name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com",
              "allowedRoutes": { "namespaces": { "from": "All" } } },
            { "name": "same", "port": 8080, "protocol": "HTTP" },
            { "name": "selected", "port": 8081, "protocol": "HTTP",
              "allowedRoutes": { "namespaces": { "from": "Selector",
                "selector": { "matchLabels": { "team": "web" } } } } }
        ]));
        let checked = listeners("infra", &spec, &[], |_, _| SecretCheck::Usable);
        let parent = |section: Option<&str>, port: Option<i64>| ParentRef {
            name: "gw".into(),
            section_name: section.map(Into::into),
            port,
            ..Default::default()
        };
        let web: BTreeMap<String, String> = [("team".to_owned(), "web".to_owned())].into();
        let names = |r: Result<Vec<(&Listener, Hostnames)>, NotAttached>| {
            r.map(|v| {
                v.into_iter()
                    .map(|(l, _)| l.name.clone())
                    .collect::<Vec<_>>()
            })
        };
        let hosts = ["a.example.com".to_owned()];
        // From the Gateway's namespace: every listener that admits it.
        assert_eq!(
            names(attach(
                (RouteKind::Http, &parent(None, None)),
                "infra",
                &hosts,
                "infra",
                &spec,
                &checked,
                None
            )),
            Ok(vec!["http".into(), "same".into()])
        );
        // From a labelled namespace: All and the selector.
        assert_eq!(
            names(attach(
                (RouteKind::Http, &parent(None, None)),
                "apps",
                &hosts,
                "infra",
                &spec,
                &checked,
                Some(&web)
            )),
            Ok(vec!["http".into(), "selected".into()])
        );
        assert_eq!(
            names(attach(
                (RouteKind::Http, &parent(Some("same"), None)),
                "apps",
                &hosts,
                "infra",
                &spec,
                &checked,
                None
            )),
            Err(NotAttached::NotAllowedByListeners)
        );
        assert_eq!(
            names(attach(
                (RouteKind::Http, &parent(Some("nosuch"), None)),
                "infra",
                &hosts,
                "infra",
                &spec,
                &checked,
                None
            )),
            Err(NotAttached::NoMatchingParent)
        );
        assert_eq!(
            names(attach(
                (RouteKind::Http, &parent(None, Some(9999))),
                "infra",
                &hosts,
                "infra",
                &spec,
                &checked,
                None
            )),
            Err(NotAttached::NoMatchingParent)
        );
        assert_eq!(
            names(attach(
                (RouteKind::Http, &parent(Some("http"), Some(80))),
                "apps",
                &["a.example.net".to_owned()],
                "infra",
                &spec,
                &checked,
                None
            )),
            Err(NotAttached::NoMatchingListenerHostname)
        );
    }

    #[test]
    fn a_listener_with_an_unresolved_certificate_still_takes_routes_and_one_not_accepted_does_not()
    {
        let spec = gateway(json!([
            { "name": "https", "port": 443, "protocol": "HTTPS",
              "tls": { "certificateRefs": [{ "name": "missing" }] } },
            { "name": "passthrough", "port": 8443, "protocol": "HTTPS",
              "tls": { "mode": "Passthrough", "certificateRefs": [{ "name": "good" }] } },
            { "name": "kinds", "port": 80, "protocol": "HTTP",
              "allowedRoutes": { "kinds": [{ "kind": "InvalidRoute" }, { "kind": "HTTPRoute" }] } },
            { "name": "foreign", "port": 81, "protocol": "HTTP",
              "allowedRoutes": { "kinds": [{ "group": "example.com", "kind": "HTTPRoute" }] } }
        ]));
        let ls = listeners("infra", &spec, &[], |_, name| {
            if name == "good" {
                SecretCheck::Usable
            } else {
                SecretCheck::Missing
            }
        });
        assert!(!ls[0].usable() && ls[0].takes_routes(), "{:?}", ls[0]);
        assert_eq!(condition(&ls[1], "Accepted").reason, "UnsupportedValue");
        assert!(!ls[1].takes_routes());
        assert!(ls[2].takes_routes(), "HTTPRoute is among its kinds");
        assert_eq!(
            ls[3].supported_kinds,
            vec![],
            "an HTTPRoute of another group is not ours"
        );
        let parent = |section: &str| ParentRef {
            name: "gw".into(),
            section_name: Some(section.into()),
            ..Default::default()
        };
        let on = |section: &str| {
            attach(
                (RouteKind::Http, &parent(section)),
                "infra",
                &[],
                "infra",
                &spec,
                &ls,
                None,
            )
            .map(|v| v.len())
        };
        assert_eq!(on("https"), Ok(1));
        assert_eq!(on("passthrough"), Err(NotAttached::NoMatchingParent));
        assert_eq!(on("kinds"), Ok(1));
        assert_eq!(on("foreign"), Err(NotAttached::NotAllowedByListeners));
    }

    #[test]
    fn two_listeners_without_a_hostname_on_one_port_conflict() {
        let spec = gateway(json!([
            { "name": "a", "port": 80, "protocol": "HTTP" },
            { "name": "b", "port": 80, "protocol": "HTTP" }
        ]));
        let ls = listeners("infra", &spec, &[], |_, _| SecretCheck::Usable);
        assert!(
            ls.iter()
                .all(|l| condition(l, "Conflicted").reason == "HostnameConflict")
        );
    }

    #[test]
    fn a_grant_counts_only_in_its_namespace_for_its_source_namespace_and_group() {
        let g = |ns: &str, from_ns: &str, group: &str| -> Arc<ReferenceGrant> {
            Arc::new(serde_json::from_value(json!({
                "metadata": { "name": "g", "namespace": ns },
                "spec": { "from": [{ "group": group, "kind": "HTTPRoute", "namespace": from_ns }],
                          "to": [{ "group": "", "kind": "Service" }] }
            })).unwrap())
        };
        let ok = |grant: Arc<ReferenceGrant>| {
            granted(&[grant], "HTTPRoute", "infra", "", "Service", "apps", "web")
        };
        assert!(ok(g("apps", "infra", GROUP)));
        assert!(
            !ok(g("other", "infra", GROUP)),
            "a grant in another namespace"
        );
        assert!(
            !ok(g("apps", "elsewhere", GROUP)),
            "for another source namespace"
        );
        assert!(
            !ok(g("apps", "infra", "example.com")),
            "for another source group"
        );
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("team".to_owned(), "web".to_owned())].into();
        let s = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        assert!(selects(&s(json!({})), &labels));
        assert!(selects(
            &s(
                json!({ "matchExpressions": [{ "key": "team", "operator": "In", "values": ["web"] }] })
            ),
            &labels
        ));
        assert!(!selects(
            &s(
                json!({ "matchExpressions": [{ "key": "team", "operator": "NotIn", "values": ["web"] }] })
            ),
            &labels
        ));
        assert!(selects(
            &s(json!({ "matchExpressions": [{ "key": "x", "operator": "DoesNotExist" }] })),
            &labels
        ));
        assert!(!selects(
            &s(json!({ "matchExpressions": [{ "key": "x", "operator": "Exists" }] })),
            &labels
        ));
        assert!(!selects(
            &s(json!({ "matchExpressions": [{ "key": "team", "operator": "Bogus" }] })),
            &labels
        ));
    }

    #[test]
    fn a_backend_ref_resolves_to_a_service_or_says_why_not() {
        let exists = |ns: &str, name: &str| name == "web" && (ns == "apps" || ns == "infra");
        let r = |v: serde_json::Value| -> ObjectRef { serde_json::from_value(v).unwrap() };
        assert_eq!(
            backend_ref(
                &r(json!({ "name": "web", "port": 80 })),
                RouteKind::Http,
                "infra",
                &[],
                exists
            ),
            Ok(("infra".into(), "web".into()))
        );
        assert_eq!(
            backend_ref(
                &r(json!({ "name": "nosuch", "port": 80 })),
                RouteKind::Http,
                "infra",
                &[],
                exists
            ),
            Err(Unresolved::BackendNotFound)
        );
        assert_eq!(
            backend_ref(
                &r(json!({ "name": "web", "kind": "Bucket", "group": "storage.example.com" })),
                RouteKind::Http,
                "infra",
                &[],
                exists
            ),
            Err(Unresolved::InvalidKind)
        );
        let across = r(json!({ "name": "web", "namespace": "apps", "port": 80 }));
        assert_eq!(
            backend_ref(&across, RouteKind::Http, "infra", &[], exists),
            Err(Unresolved::RefNotPermitted)
        );
        let g = grant("apps", "HTTPRoute", "infra", "Service", None);
        assert_eq!(
            backend_ref(
                &across,
                RouteKind::Http,
                "infra",
                std::slice::from_ref(&g),
                exists
            ),
            Ok(("apps".into(), "web".into()))
        );
        // A grant names the kind it lets refer: an HTTPRoute's is not a TLSRoute's.
        assert_eq!(
            backend_ref(&across, RouteKind::Tls, "infra", &[g], exists),
            Err(Unresolved::RefNotPermitted)
        );
        let g = grant("apps", "TLSRoute", "infra", "Service", None);
        assert_eq!(
            backend_ref(&across, RouteKind::Tls, "infra", &[g], exists),
            Ok(("apps".into(), "web".into()))
        );
    }

    #[test]
    fn a_tls_listener_takes_tlsroutes_in_passthrough_mode_only() {
        let spec = gateway(json!([
            { "name": "pass", "port": 443, "protocol": "TLS", "tls": { "mode": "Passthrough" } },
            { "name": "term", "port": 8443, "protocol": "TLS", "tls": { "mode": "Terminate" } },
            { "name": "wrong", "port": 9443, "protocol": "TLS", "tls": { "mode": "Passthrough" },
              "allowedRoutes": { "kinds": [{ "kind": "HTTPRoute" }] } },
        ]));
        let ls = listeners("infra", &spec, &[], |_, _| SecretCheck::Missing);
        assert!(ls[0].usable(), "{:?}", ls[0]);
        assert_eq!(
            ls[0].supported_kinds,
            vec![route_group_kind(RouteKind::Tls)]
        );
        assert_eq!(condition(&ls[1], "Accepted").reason, "UnsupportedValue");
        assert!(!ls[1].takes_routes());
        assert!(ls[1].supported_kinds.is_empty());
        assert_eq!(
            condition(&ls[2], "ResolvedRefs").reason,
            "InvalidRouteKinds"
        );
        assert!(ls[2].supported_kinds.is_empty());
        let parent = ParentRef {
            name: "gw".into(),
            section_name: Some("pass".into()),
            ..Default::default()
        };
        let on = |kind| {
            attach((kind, &parent), "infra", &[], "infra", &spec, &ls, None).map(|v| v.len())
        };
        assert_eq!(on(RouteKind::Tls), Ok(1));
        assert_eq!(on(RouteKind::Http), Err(NotAttached::NotAllowedByListeners));
        assert_eq!(on(RouteKind::Grpc), Err(NotAttached::NotAllowedByListeners));
    }
}
