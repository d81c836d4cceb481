//! `cluster objects → snapshot`: a pure function with the route semantics of DESIGN.md.
//!
//! Rules, in the order they apply:
//! - **Class.** An Ingress is ours when `spec.ingressClassName` (or the legacy
//!   `kubernetes.io/ingress.class` annotation) names an IngressClass whose
//!   `spec.controller` is ours, or when it names none and one of our classes is the cluster
//!   default (`ingressclass.kubernetes.io/is-default-class: "true"`). `--ingress-class`
//!   narrows "ours" to that one class name.
//! - **Order.** Ingresses are taken oldest first (creation time, then namespace/name); on a
//!   true conflict the earlier one wins and the later one gets a [`Problem`].
//! - **Hosts.** Lower-cased; `*.example.com` is a one-label wildcard; a rule without a
//!   host goes to the virtual host `""`. An invalid host skips that rule.
//! - **Paths.** `Exact` and `Prefix` as written; `ImplementationSpecific` is treated as
//!   `Prefix`. A path must start with `/` and contain no whitespace, `?` or `#`. A Prefix
//!   path loses its trailing `/` (`/foo/` ≡ `/foo`; `/` stays). An invalid path skips
//!   that path only.
//! - **Merge.** Rules for one host from several Ingresses merge. The same host, path and
//!   kind twice is a conflict: the older Ingress wins.
//! - **defaultBackend.** The oldest Ingress's wins; later ones get a [`Problem`].
//! - **Backends.** One per (namespace, Service, port as written), named
//!   `ns/service:port`. The Service port is found by number or name; endpoints come from
//!   the EndpointSlices labelled `kubernetes.io/service-name`, on the slice port named like
//!   the Service port (falling back to a numeric targetPort), per slice. Only ready
//!   endpoints (`ready` unset counts as ready), first address, deduplicated and sorted.
//!   An ExternalName Service resolves to its DNS name.
//! - **Unknown is not absent.** A missing Service, a missing port or no ready endpoints
//!   keeps the route, with a backend that has no endpoints and an `unavailable_reason`
//!   (the proxy answers 503). Routes are removed only when their Ingress rule is.
//! - A resource backend (not a Service) is not supported: that path is skipped with a
//!   [`Problem`].

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use holdfast_proto::snapshot::is_valid_host;
use holdfast_proto::v1::{
    Backend, DefaultBackend, Endpoint, IngressRef, MatchKind, Route, Snapshot, VirtualHost,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::HashMap;

/// The annotation that marks the cluster's default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// The legacy annotation that names an Ingress's class.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Everything translation reads: the contents of the watch-fed caches.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// All IngressClasses.
    pub ingress_classes: Vec<Arc<IngressClass>>,
    /// All Ingresses (ours or not).
    pub ingresses: Vec<Arc<Ingress>>,
    /// All Services.
    pub services: Vec<Arc<Service>>,
    /// All EndpointSlices.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
}

/// What makes an Ingress ours.
#[derive(Debug, Clone)]
pub struct Options {
    /// Our `spec.controller` value.
    pub controller: String,
    /// Only this IngressClass name, if set.
    pub ingress_class: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller: "holdfast.dev/ingress-controller".into(),
            ingress_class: None,
        }
    }
}

/// An Ingress rule that was skipped or lost a conflict; it becomes a Kubernetes Event on
/// that Ingress and a warning log line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    /// The Ingress concerned.
    pub namespace: String,
    /// The Ingress concerned.
    pub name: String,
    /// Short machine-readable reason (Event reason).
    pub reason: &'static str,
    /// What was skipped and why.
    pub message: String,
}

/// The result of translation: an unsealed snapshot (no version yet) and the problems.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// The snapshot content; seal it with `holdfast_proto::snapshot::seal`.
    pub snapshot: Snapshot,
    /// Skipped rules and lost conflicts, sorted.
    pub problems: Vec<Problem>,
}

/// The Ingress's namespace and name.
fn ingress_ref(ing: &Ingress) -> IngressRef {
    IngressRef {
        namespace: ing.metadata.namespace.clone().unwrap_or_default(),
        name: ing.metadata.name.clone().unwrap_or_default(),
    }
}

/// The set of IngressClass names that are ours, and whether one of them is the default.
fn our_classes(classes: &[Arc<IngressClass>], opts: &Options) -> (HashSet<String>, bool) {
    let mut ours = HashSet::new();
    let mut default_is_ours = false;
    for class in classes {
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        let controller = class.spec.as_ref().and_then(|s| s.controller.as_deref());
        if controller != Some(opts.controller.as_str()) {
            continue;
        }
        if opts
            .ingress_class
            .as_deref()
            .is_some_and(|only| only != name)
        {
            continue;
        }
        ours.insert(name.to_owned());
        let is_default = class
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v == "true");
        default_is_ours |= is_default;
    }
    (ours, default_is_ours)
}

/// Is this Ingress ours?
pub fn is_ours(ing: &Ingress, classes: &HashSet<String>, default_is_ours: bool) -> bool {
    let named = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
                .map(String::as_str)
        });
    match named {
        Some(class) => classes.contains(class),
        None => default_is_ours,
    }
}

/// The Ingresses that are ours, in cache order.
pub fn our_ingresses<'a>(state: &'a ClusterState, opts: &Options) -> Vec<&'a Ingress> {
    let (classes, default_is_ours) = our_classes(&state.ingress_classes, opts);
    state
        .ingresses
        .iter()
        .map(|i| &**i)
        .filter(|i| is_ours(i, &classes, default_is_ours))
        .collect()
}

/// Oldest first, then namespace/name: the order conflicts are decided in.
fn age_and_name(
    i: &Ingress,
) -> (
    Option<k8s_openapi::jiff::Timestamp>,
    Option<&str>,
    Option<&str>,
) {
    let m = &i.metadata;
    (
        m.creation_timestamp.as_ref().map(|t| t.0),
        m.namespace.as_deref(),
        m.name.as_deref(),
    )
}

/// Normalises an Ingress path for its kind, or says why it is invalid.
pub fn normalise_path(path: Option<&str>, kind: MatchKind) -> Result<String, String> {
    let path = path.unwrap_or("/");
    let path = if path.is_empty() { "/" } else { path };
    if !path.starts_with('/') {
        return Err(format!("path {path:?} does not start with '/'"));
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c == '?' || c == '#')
    {
        return Err(format!("path {path:?} contains whitespace, '?' or '#'"));
    }
    Ok(match kind {
        MatchKind::Prefix => {
            let trimmed = path.trim_end_matches('/');
            if trimmed.is_empty() {
                "/".to_owned()
            } else {
                trimmed.to_owned()
            }
        }
        _ => path.to_owned(),
    })
}

/// The match kind for an Ingress `pathType`.
pub fn match_kind(path_type: &str) -> Result<MatchKind, String> {
    match path_type {
        "Exact" => Ok(MatchKind::Exact),
        "Prefix" | "ImplementationSpecific" => Ok(MatchKind::Prefix),
        other => Err(format!("unknown pathType {other:?}")),
    }
}

/// A Service port as an Ingress backend names it (borrowed from the Ingress).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum PortRef<'a> {
    Number(i32),
    Name(&'a str),
}

impl std::fmt::Display for PortRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortRef::Number(n) => write!(f, "{n}"),
            PortRef::Name(n) => f.write_str(n),
        }
    }
}

/// (namespace, service, port): one backend, borrowed from the cluster state.
type BackendKey<'a> = (&'a str, &'a str, PortRef<'a>);

fn backend_name((ns, svc, port): &BackendKey<'_>) -> String {
    format!("{ns}/{svc}:{port}")
}

/// The backend an Ingress backend refers to, or why it cannot be used.
fn backend_key<'a>(ns: &'a str, backend: &'a IngressBackend) -> Result<BackendKey<'a>, String> {
    if backend.resource.is_some() {
        return Err("resource backends are not supported; use a Service backend".into());
    }
    let svc = backend.service.as_ref().ok_or("backend names no Service")?;
    let port = svc.port.as_ref().ok_or("backend names no Service port")?;
    let port = match (port.number, port.name.as_deref()) {
        (Some(n), _) if (1..=65535).contains(&n) => PortRef::Number(n),
        (Some(n), _) => return Err(format!("Service port {n} is out of range")),
        (None, Some(name)) if !name.is_empty() => PortRef::Name(name),
        _ => return Err("backend names no Service port".into()),
    };
    Ok((ns, svc.name.as_str(), port))
}

/// Resolves one backend against the Services and EndpointSlices.
fn resolve_backend(
    key: &BackendKey<'_>,
    name: String,
    services: &HashMap<(&str, &str), &Service>,
    slices: &HashMap<(&str, &str), Vec<&EndpointSlice>>,
) -> Backend {
    let (ns, svc_name, port_ref) = *key;
    let mut backend = Backend {
        name,
        ..Default::default()
    };
    let Some(svc) = services.get(&(ns, svc_name)) else {
        backend.unavailable_reason = format!("service {ns}/{svc_name} not found");
        return backend;
    };
    let no_spec = Default::default();
    let spec = svc.spec.as_ref().unwrap_or(&no_spec);
    if spec.type_.as_deref() == Some("ExternalName") {
        let Some(external) = spec.external_name.as_deref().filter(|n| !n.is_empty()) else {
            backend.unavailable_reason =
                format!("ExternalName service {ns}/{svc_name} has no externalName");
            return backend;
        };
        let port = match port_ref {
            PortRef::Number(n) => Some(n),
            PortRef::Name(name) => spec
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.port),
        };
        match port {
            Some(p) => {
                backend.external_name = external.to_ascii_lowercase();
                backend.external_port = p as u32;
            }
            None => {
                backend.unavailable_reason =
                    format!("service {ns}/{svc_name} has no port {port_ref}")
            }
        }
        return backend;
    }
    let service_port = spec.ports.iter().flatten().find(|p| match port_ref {
        PortRef::Number(n) => p.port == n,
        PortRef::Name(name) => p.name.as_deref() == Some(name),
    });
    let Some(service_port) = service_port else {
        backend.unavailable_reason = format!("service {ns}/{svc_name} has no port {port_ref}");
        return backend;
    };
    let port_name = service_port.name.as_deref().unwrap_or("");
    let numeric_target = match &service_port.target_port {
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(_)) => None,
        None => Some(service_port.port),
    };
    // (address, port, zone), borrowed; sorted and deduplicated before anything is copied.
    let mut endpoints: Vec<(&str, u32, &str)> = Vec::new();
    for slice in slices.get(&(ns, svc_name)).into_iter().flatten() {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        // Named target ports are resolved per slice: its port named like the Service port.
        let slice_port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
            .and_then(|p| p.port)
            .or(numeric_target);
        let Some(port) = slice_port.filter(|p| (1..=65535).contains(p)) else {
            continue;
        };
        for ep in &slice.endpoints {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let Some(address) = ep.addresses.first() else {
                continue;
            };
            if !ready || address.parse::<std::net::IpAddr>().is_err() {
                continue;
            }
            endpoints.push((address, port as u32, ep.zone.as_deref().unwrap_or("")));
        }
    }
    // One entry per address and port (a pod listed in two slices counts once).
    endpoints.sort_unstable();
    endpoints.dedup_by(|a, b| (a.0, a.1) == (b.0, b.1));
    if endpoints.is_empty() {
        backend.unavailable_reason = format!("no ready endpoints for service {ns}/{svc_name}");
    }
    backend.endpoints = endpoints
        .into_iter()
        .map(|(address, port, zone)| Endpoint {
            address: address.to_owned(),
            port,
            zone: zone.to_owned(),
            ready: true,
        })
        .collect();
    backend
}

/// A route while translating: where it came from and the order it was declared in.
struct Candidate<'a> {
    host: std::borrow::Cow<'a, str>,
    kind: MatchKind,
    path: String,
    backend: BackendKey<'a>,
    /// Position of its Ingress in age order: lower wins a conflict.
    rank: usize,
    ingress: &'a Ingress,
}

/// Translates the cluster state into a snapshot (unsealed) and the problems found.
pub fn translate(state: &ClusterState, opts: &Options) -> Translation {
    let (classes, default_is_ours) = our_classes(&state.ingress_classes, opts);
    let mut ingresses: Vec<&Ingress> = state
        .ingresses
        .iter()
        .map(|i| &**i)
        .filter(|i| is_ours(i, &classes, default_is_ours))
        .collect();
    ingresses.sort_unstable_by(|a, b| age_and_name(a).cmp(&age_and_name(b)));

    let mut problems = BTreeSet::new();
    let mut problem = |ing: &Ingress, reason: &'static str, message: String| {
        let r = ingress_ref(ing);
        problems.insert(Problem {
            namespace: r.namespace,
            name: r.name,
            reason,
            message,
        });
    };

    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    let mut default_backend: Option<(BackendKey<'_>, &Ingress)> = None;

    for (rank, ing) in ingresses.iter().copied().enumerate() {
        let ns = ing.metadata.namespace.as_deref().unwrap_or("");
        let Some(spec) = &ing.spec else { continue };
        if let Some(db) = &spec.default_backend {
            match backend_key(ns, db) {
                Err(e) => problem(
                    ing,
                    "InvalidDefaultBackend",
                    format!("defaultBackend skipped: {e}"),
                ),
                Ok(_) if default_backend.is_some() => {
                    let winner = ingress_ref(default_backend.as_ref().expect("checked").1);
                    problem(
                        ing,
                        "ConflictingDefaultBackend",
                        format!(
                            "defaultBackend ignored: {}/{} (older) already sets one",
                            winner.namespace, winner.name
                        ),
                    );
                }
                Ok(key) => default_backend = Some((key, ing)),
            }
        }
        for rule in spec.rules.iter().flatten() {
            let raw = rule.host.as_deref().unwrap_or("");
            let host = if raw.bytes().any(|b| b.is_ascii_uppercase()) {
                std::borrow::Cow::Owned(raw.to_ascii_lowercase())
            } else {
                std::borrow::Cow::Borrowed(raw)
            };
            if !is_valid_host(&host) {
                problem(
                    ing,
                    "InvalidHost",
                    format!(
                        "rule for host {host:?} skipped: not a valid host name or one-label wildcard"
                    ),
                );
                continue;
            }
            let Some(http) = &rule.http else { continue };
            for p in &http.paths {
                let kind = match match_kind(&p.path_type) {
                    Ok(k) => k,
                    Err(e) => {
                        problem(
                            ing,
                            "InvalidPath",
                            format!(
                                "path {:?} on host {host:?} skipped: {e}",
                                p.path.as_deref().unwrap_or("")
                            ),
                        );
                        continue;
                    }
                };
                let path = match normalise_path(p.path.as_deref(), kind) {
                    Ok(path) => path,
                    Err(e) => {
                        problem(
                            ing,
                            "InvalidPath",
                            format!("path on host {host:?} skipped: {e}"),
                        );
                        continue;
                    }
                };
                let backend = match backend_key(ns, &p.backend) {
                    Ok(k) => k,
                    Err(e) => {
                        problem(
                            ing,
                            "InvalidBackend",
                            format!("path {path:?} on host {host:?} skipped: {e}"),
                        );
                        continue;
                    }
                };
                candidates.push(Candidate {
                    host: host.clone(),
                    kind,
                    path,
                    backend,
                    rank,
                    ingress: ing,
                });
            }
        }
    }

    // Group by (host, kind, path); within a group the oldest Ingress (lowest rank) comes
    // first and wins; the others lost a conflict (unless they are the same Ingress).
    candidates.sort_unstable_by(|a, b| {
        (&*a.host, a.kind as i32, &a.path, a.rank).cmp(&(&*b.host, b.kind as i32, &b.path, b.rank))
    });
    let mut winners: Vec<Candidate<'_>> = Vec::with_capacity(candidates.len());
    for c in candidates {
        if let Some(w) = winners.last()
            && (&*w.host, w.kind, &w.path) == (&*c.host, c.kind, &c.path)
        {
            if !std::ptr::eq(w.ingress, c.ingress) {
                let winner = ingress_ref(w.ingress);
                problem(
                    c.ingress,
                    "ConflictingRoute",
                    format!(
                        "{:?} path {:?} on host {:?} ignored: {}/{} (older) already routes it",
                        c.kind, c.path, c.host, winner.namespace, winner.name
                    ),
                );
            }
            continue;
        }
        winners.push(c);
    }

    let services: HashMap<(&str, &str), &Service> = state
        .services
        .iter()
        .filter_map(|s| {
            Some((
                (
                    s.metadata.namespace.as_deref()?,
                    s.metadata.name.as_deref()?,
                ),
                &**s,
            ))
        })
        .collect();
    let mut slices: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for slice in &state.endpoint_slices {
        let ns = slice.metadata.namespace.as_deref();
        let svc = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL));
        if let (Some(ns), Some(svc)) = (ns, svc) {
            slices.entry((ns, svc.as_str())).or_default().push(slice);
        }
    }

    // Each backend is named and resolved once, however many routes use it.
    let mut backend_names: HashMap<BackendKey<'_>, String> = HashMap::new();
    fn name_of<'a>(names: &mut HashMap<BackendKey<'a>, String>, key: BackendKey<'a>) -> String {
        names
            .entry(key)
            .or_insert_with(|| backend_name(&key))
            .clone()
    }
    let default_backend = default_backend.map(|(key, ing)| DefaultBackend {
        backend: name_of(&mut backend_names, key),
        source: Some(ingress_ref(ing)),
    });
    let mut virtual_hosts: Vec<VirtualHost> = Vec::new();
    for c in winners {
        if virtual_hosts.last().is_none_or(|v| v.host != *c.host) {
            virtual_hosts.push(VirtualHost {
                host: c.host.into_owned(),
                routes: Vec::new(),
            });
        }
        let routes = &mut virtual_hosts.last_mut().expect("pushed above").routes;
        routes.push(Route {
            match_kind: c.kind as i32,
            path: c.path,
            backend: name_of(&mut backend_names, c.backend),
            source: Some(ingress_ref(c.ingress)),
        });
    }
    for v in &mut virtual_hosts {
        sort_routes(&mut v.routes);
    }
    let mut backends: Vec<Backend> = backend_names
        .into_iter()
        .map(|(key, name)| resolve_backend(&key, name, &services, &slices))
        .collect();
    backends.sort_unstable_by(|a, b| a.name.cmp(&b.name));

    Translation {
        snapshot: Snapshot {
            virtual_hosts,
            backends,
            default_backend,
            ..Default::default()
        },
        problems: problems.into_iter().collect(),
    }
}

/// Exact before Prefix, then longer paths first, then by path: the order a matcher tries.
pub fn sort_routes(routes: &mut [Route]) {
    routes.sort_by(|a, b| {
        let rank = |r: &Route| {
            if r.match_kind == MatchKind::Exact as i32 {
                0
            } else {
                1
            }
        };
        rank(a)
            .cmp(&rank(b))
            .then(b.path.len().cmp(&a.path.len()))
            .then(a.path.cmp(&b.path))
    });
}

#[cfg(test)]
mod tests;
