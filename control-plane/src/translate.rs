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

use holdfast_proto::content;
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

/// A Service port as an Ingress backend names it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PortRef {
    Number(i32),
    Name(String),
}

impl std::fmt::Display for PortRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortRef::Number(n) => write!(f, "{n}"),
            PortRef::Name(n) => f.write_str(n),
        }
    }
}

/// One backend: (namespace, Service, port as written), named `ns/service:port`. Names
/// and keys correspond one to one: namespaces and Service names are DNS labels (no `/`
/// or `:`), and a port name must contain a letter (see [`backend_ref`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct BackendRef {
    name: String,
    /// [`sort_prefix`] of `name`.
    name_key: u128,
    namespace: String,
    service: String,
    port: PortRef,
}

/// The backend an Ingress backend refers to, or why it cannot be used.
fn backend_ref(ns: &str, backend: &IngressBackend) -> Result<BackendRef, String> {
    if backend.resource.is_some() {
        return Err("resource backends are not supported; use a Service backend".into());
    }
    let svc = backend.service.as_ref().ok_or("backend names no Service")?;
    let port = svc.port.as_ref().ok_or("backend names no Service port")?;
    let port = match (port.number, port.name.as_deref()) {
        (Some(n), _) if (1..=65535).contains(&n) => PortRef::Number(n),
        (Some(n), _) => return Err(format!("Service port {n} is out of range")),
        (None, Some(name)) if name.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty() => {
            return Err(format!(
                "Service port name {name:?} is not a port name (names contain a letter)"
            ));
        }
        (None, Some(name)) if !name.is_empty() => PortRef::Name(name.to_owned()),
        _ => return Err("backend names no Service port".into()),
    };
    let name = format!("{ns}/{}:{port}", svc.name);
    Ok(BackendRef {
        name_key: sort_prefix(&name),
        name,
        namespace: ns.to_owned(),
        service: svc.name.clone(),
        port,
    })
}

/// One path of an Ingress rule, checked and normalised.
#[derive(Debug)]
struct RouteDigest {
    /// [`sort_prefix`] of `host` and of `path`.
    keys: (u128, u128),
    host: String,
    kind: MatchKind,
    path: String,
    backend: BackendRef,
}

/// What translation needs from one Ingress, computed once per version of the object
/// (see [`Translator`]): its identity and age, its class, its valid routes and default
/// backend, and the problems found in the object on its own. Cross-object rules (class
/// selection, merging, conflicts, backend resolution) apply when a snapshot is built.
#[derive(Debug)]
pub struct IngressDigest {
    /// Creation time, then [`sort_prefix`] of namespace and name.
    age_key: (Option<k8s_openapi::jiff::Timestamp>, u128, u128),
    source: IngressRef,
    class: Option<String>,
    default_backend: Option<BackendRef>,
    routes: Vec<RouteDigest>,
    problems: Vec<(&'static str, String)>,
}

/// Digests one Ingress.
pub fn digest_ingress(ing: &Ingress) -> IngressDigest {
    let class = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
                .cloned()
        });
    let source = ingress_ref(ing);
    let created = ing.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let mut digest = IngressDigest {
        age_key: (
            created,
            sort_prefix(&source.namespace),
            sort_prefix(&source.name),
        ),
        source,
        class,
        default_backend: None,
        routes: Vec::new(),
        problems: Vec::new(),
    };
    let ns = ing.metadata.namespace.as_deref().unwrap_or("");
    let Some(spec) = &ing.spec else {
        return digest;
    };
    if let Some(db) = &spec.default_backend {
        match backend_ref(ns, db) {
            Ok(b) => digest.default_backend = Some(b),
            Err(e) => digest.problems.push((
                "InvalidDefaultBackend",
                format!("defaultBackend skipped: {e}"),
            )),
        }
    }
    for rule in spec.rules.iter().flatten() {
        let host = rule.host.as_deref().unwrap_or("").to_ascii_lowercase();
        if !is_valid_host(&host) {
            digest.problems.push((
                "InvalidHost",
                format!(
                    "rule for host {host:?} skipped: not a valid host name or one-label wildcard"
                ),
            ));
            continue;
        }
        let Some(http) = &rule.http else { continue };
        for p in &http.paths {
            let kind = match match_kind(&p.path_type) {
                Ok(k) => k,
                Err(e) => {
                    digest.problems.push((
                        "InvalidPath",
                        format!(
                            "path {:?} on host {host:?} skipped: {e}",
                            p.path.as_deref().unwrap_or("")
                        ),
                    ));
                    continue;
                }
            };
            let path = match normalise_path(p.path.as_deref(), kind) {
                Ok(path) => path,
                Err(e) => {
                    digest
                        .problems
                        .push(("InvalidPath", format!("path on host {host:?} skipped: {e}")));
                    continue;
                }
            };
            match backend_ref(ns, &p.backend) {
                Ok(backend) => digest.routes.push(RouteDigest {
                    keys: (sort_prefix(&host), sort_prefix(&path)),
                    host: host.clone(),
                    kind,
                    path,
                    backend,
                }),
                Err(e) => digest.problems.push((
                    "InvalidBackend",
                    format!("path {path:?} on host {host:?} skipped: {e}"),
                )),
            }
        }
    }
    digest
}

/// A Service port: its number, its name ("" if unnamed) and its numeric target port
/// (None for a named targetPort, resolved per EndpointSlice).
#[derive(Debug)]
struct ServicePortDigest {
    port: i32,
    name: String,
    numeric_target: Option<i32>,
}

/// What translation needs from one Service.
#[derive(Debug)]
pub struct ServiceDigest {
    namespace: Option<String>,
    name: Option<String>,
    /// `Some` for an ExternalName Service: its DNS name, lower-cased ("" if unset).
    external_name: Option<String>,
    ports: Vec<ServicePortDigest>,
}

/// Digests one Service.
pub fn digest_service(svc: &Service) -> ServiceDigest {
    let spec = svc.spec.as_ref();
    let external_name = spec
        .filter(|s| s.type_.as_deref() == Some("ExternalName"))
        .map(|s| {
            s.external_name
                .as_deref()
                .unwrap_or("")
                .to_ascii_lowercase()
        });
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| ServicePortDigest {
            port: p.port,
            name: p.name.clone().unwrap_or_default(),
            numeric_target: match &p.target_port {
                Some(IntOrString::Int(n)) => Some(*n),
                Some(IntOrString::String(_)) => None,
                None => Some(p.port),
            },
        })
        .collect();
    ServiceDigest {
        namespace: svc.metadata.namespace.clone(),
        name: svc.metadata.name.clone(),
        external_name,
        ports,
    }
}

/// What translation needs from one EndpointSlice: its Service, its ports, and its ready
/// endpoints (first address, which parses as an IP address; zone or "").
#[derive(Debug)]
pub struct SliceDigest {
    namespace: Option<String>,
    service: Option<String>,
    ports: Vec<(String, Option<i32>)>,
    /// Each endpoint's address and zone, as ranges of `text` (one allocation per slice,
    /// not two per endpoint: resolving reads them all, and they stay on few cache lines).
    endpoints: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
    text: String,
}

/// Digests one EndpointSlice. A slice of another address type (FQDN) has no endpoints.
pub fn digest_slice(slice: &EndpointSlice) -> SliceDigest {
    let ip = matches!(slice.address_type.as_str(), "IPv4" | "IPv6");
    let mut text = String::new();
    let mut endpoints = Vec::new();
    for ep in slice.endpoints.iter().filter(|_| ip) {
        let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        let Some(address) = ep.addresses.first() else {
            continue;
        };
        if !ready || address.parse::<std::net::IpAddr>().is_err() {
            continue;
        }
        let start = text.len();
        text.push_str(address);
        let middle = text.len();
        text.push_str(ep.zone.as_deref().unwrap_or(""));
        endpoints.push((start..middle, middle..text.len()));
    }
    SliceDigest {
        namespace: slice.metadata.namespace.clone(),
        service: slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .cloned(),
        ports: slice
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.port))
            .collect(),
        endpoints,
        text,
    }
}

/// The first 16 bytes of `s`, big-endian, zero-padded: comparing these first, then the
/// whole strings on a tie, orders strings as comparing the strings does, while touching
/// only the (inline) keys in the common case.
fn sort_prefix(s: &str) -> u128 {
    let mut bytes = [0u8; 16];
    let n = s.len().min(16);
    bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
    u128::from_be_bytes(bytes)
}

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Digests of one kind, keyed by the address of the cached object's `Arc`. The reflector
/// stores replace an object's `Arc` whenever it changes and hand out clones of the same
/// `Arc` otherwise, so an unchanged object is digested once. Each entry keeps its `Arc`
/// alive, so an address cannot be reused by another object while it is a key here.
struct Memo<K, D> {
    entries: FastMap<usize, (Arc<K>, Arc<D>, u64)>,
}

impl<K, D> Default for Memo<K, D> {
    fn default() -> Self {
        Memo {
            entries: FastMap::default(),
        }
    }
}

impl<K: Sync + Send, D: Send + Sync> Memo<K, D> {
    /// The digests of `objects` (in their order); digests what is new, forgets what is
    /// gone.
    fn refresh(&mut self, objects: &[Arc<K>], generation: u64, digest: fn(&K) -> D) -> Vec<Arc<D>> {
        let mut out: Vec<Option<Arc<D>>> = Vec::with_capacity(objects.len());
        let mut missing: Vec<usize> = Vec::new();
        for (i, object) in objects.iter().enumerate() {
            match self.entries.get_mut(&(Arc::as_ptr(object) as usize)) {
                Some(entry) => {
                    entry.2 = generation;
                    out.push(Some(entry.1.clone()));
                }
                None => {
                    missing.push(i);
                    out.push(None);
                }
            }
        }
        let made = parallel_map(&missing, |&i| Arc::new(digest(&objects[i])));
        for (i, d) in missing.into_iter().zip(made) {
            let object = &objects[i];
            self.entries.insert(
                Arc::as_ptr(object) as usize,
                (object.clone(), d.clone(), generation),
            );
            out[i] = Some(d);
        }
        if self.entries.len() > objects.len() {
            self.entries.retain(|_, e| e.2 == generation);
        }
        out.into_iter().flatten().collect()
    }
}

/// How many threads a build uses (the machine's parallelism, at most 4).
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// `items.iter().map(f)`, in order, on up to [`threads`] threads when there are enough
/// items to be worth it.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads();
    if threads < 2 || items.len() < 512 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let mut chunks = items.chunks(chunk);
        let first = chunks.next().unwrap_or(&[]);
        let handles: Vec<_> = chunks
            .map(|c| scope.spawn(move || c.iter().map(f).collect::<Vec<R>>()))
            .collect();
        let mut out: Vec<R> = Vec::with_capacity(items.len());
        out.extend(first.iter().map(f));
        for h in handles {
            out.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        out
    })
}

/// Runs `a` and `b`, on two threads when the machine has them and `big` says the work is
/// worth a thread.
fn join<A: Send, B: Send>(
    big: bool,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    if !big || threads() < 2 {
        return (a(), b());
    }
    std::thread::scope(|scope| {
        let hb = scope.spawn(b);
        let ra = a();
        (
            ra,
            hb.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
        )
    })
}

/// Builds snapshots, remembering each cached object's digest between builds (see
/// [`Memo`]) and reusing its encoding buffers. A fresh `Translator` gives the same result
/// as a long-lived one: it only does more work.
#[derive(Default)]
pub struct Translator {
    ingresses: Memo<Ingress, IngressDigest>,
    services: Memo<Service, ServiceDigest>,
    slices: Memo<EndpointSlice, SliceDigest>,
    generation: u64,
    /// Content encoding of the virtual hosts, then of the backends in two parts.
    bytes: [Vec<u8>; 3],
}

/// Translates the cluster state into a snapshot (unsealed; its `content_hash` set) and
/// the problems found, from scratch.
pub fn translate(state: &ClusterState, opts: &Options) -> Translation {
    Translator::default().translate(state, opts)
}

/// A route while translating: where it came from and the order it was declared in.
struct Candidate<'a> {
    /// `route.keys` and kind, copied here so sorting rarely follows a pointer.
    keys: (u128, i32, u128),
    route: &'a RouteDigest,
    /// Position of its Ingress in age order: lower wins a conflict.
    rank: usize,
    ingress: &'a IngressDigest,
}

impl Translator {
    /// Translates the cluster state into a snapshot (unsealed; its `content_hash` set) and
    /// the problems found.
    pub fn translate(&mut self, state: &ClusterState, opts: &Options) -> Translation {
        self.generation += 1;
        let generation = self.generation;
        let ingresses = self
            .ingresses
            .refresh(&state.ingresses, generation, digest_ingress);
        let services = self
            .services
            .refresh(&state.services, generation, digest_service);
        let slices = self
            .slices
            .refresh(&state.endpoint_slices, generation, digest_slice);

        let (classes, default_is_ours) = our_classes(&state.ingress_classes, opts);
        let mut ours: Vec<&IngressDigest> = ingresses
            .iter()
            .map(|d| &**d)
            .filter(|d| match &d.class {
                Some(class) => classes.contains(class),
                None => default_is_ours,
            })
            .collect();
        ours.sort_unstable_by(|a, b| {
            a.age_key.cmp(&b.age_key).then_with(|| {
                (&a.source.namespace, &a.source.name).cmp(&(&b.source.namespace, &b.source.name))
            })
        });

        let mut problems = BTreeSet::new();
        let mut problem = |ing: &IngressDigest, reason: &'static str, message: String| {
            problems.insert(Problem {
                namespace: ing.source.namespace.clone(),
                name: ing.source.name.clone(),
                reason,
                message,
            });
        };

        let mut candidates: Vec<Candidate<'_>> =
            Vec::with_capacity(ours.iter().map(|d| d.routes.len()).sum());
        let mut default_backend: Option<(&BackendRef, &IngressDigest)> = None;
        for (rank, ing) in ours.iter().copied().enumerate() {
            for (reason, message) in &ing.problems {
                problem(ing, reason, message.clone());
            }
            if let Some(db) = &ing.default_backend {
                match default_backend {
                    Some((_, winner)) => problem(
                        ing,
                        "ConflictingDefaultBackend",
                        format!(
                            "defaultBackend ignored: {}/{} (older) already sets one",
                            winner.source.namespace, winner.source.name
                        ),
                    ),
                    None => default_backend = Some((db, ing)),
                }
            }
            candidates.extend(ing.routes.iter().map(|route| Candidate {
                keys: (route.keys.0, route.kind as i32, route.keys.1),
                route,
                rank,
                ingress: ing,
            }));
        }

        // Group by (host, kind, path); within a group the oldest Ingress (lowest rank)
        // comes first and wins; the others lost a conflict (unless they are the same
        // Ingress).
        candidates.sort_unstable_by(|a, b| {
            let (x, y) = (a.route, b.route);
            a.keys.cmp(&b.keys).then_with(|| {
                (&x.host, x.kind as i32, &x.path, a.rank).cmp(&(
                    &y.host,
                    y.kind as i32,
                    &y.path,
                    b.rank,
                ))
            })
        });
        let mut winners: Vec<Candidate<'_>> = Vec::with_capacity(candidates.len());
        for c in candidates {
            if let Some(w) = winners.last()
                && (&w.route.host, w.route.kind, &w.route.path)
                    == (&c.route.host, c.route.kind, &c.route.path)
            {
                if !std::ptr::eq(w.ingress, c.ingress) {
                    problem(
                        c.ingress,
                        "ConflictingRoute",
                        format!(
                            "{:?} path {:?} on host {:?} ignored: {}/{} (older) already routes it",
                            c.route.kind,
                            c.route.path,
                            c.route.host,
                            w.ingress.source.namespace,
                            w.ingress.source.name
                        ),
                    );
                }
                continue;
            }
            winners.push(c);
        }

        // Each backend is resolved once, however many routes use it; in name order, the
        // order of the snapshot's backends.
        let mut used: Vec<&BackendRef> = winners.iter().map(|c| &c.route.backend).collect();
        used.extend(default_backend.map(|(b, _)| b));
        used.sort_unstable_by(|a, b| {
            a.name_key
                .cmp(&b.name_key)
                .then_with(|| a.name.cmp(&b.name))
        });
        used.dedup_by(|a, b| a.name == b.name);

        // Routes and backends are independent: build (and encode, for the content hash)
        // the routes and the first ~30% of backends on this thread, the other backends on
        // a second one (resolving a backend costs about three times building a route).
        let index = ServiceIndex::new(&services, &slices);
        let big = winners.len() + used.len() > 2_000;
        let (first, second) = used.split_at(if big { used.len() * 3 / 10 } else { used.len() });
        let [vhost_bytes, first_bytes, second_bytes] = &mut self.bytes;
        let ((virtual_hosts, mut backends), rest) = join(
            big,
            || {
                (
                    virtual_hosts(&winners, vhost_bytes),
                    resolve_backends(first, &index, first_bytes),
                )
            },
            || resolve_backends(second, &index, second_bytes),
        );
        backends.extend(rest);
        let default_backend = default_backend.map(|(b, ing)| DefaultBackend {
            backend: b.name.clone(),
            source: Some(ing.source.clone()),
        });
        let mut default_bytes = Vec::new();
        if let Some(d) = &default_backend {
            content::encode_default_backend(d, &mut default_bytes);
        }
        let content_hash = content::hash_hex(
            self.bytes
                .iter()
                .map(Vec::as_slice)
                .chain([default_bytes.as_slice()]),
        );

        Translation {
            snapshot: Snapshot {
                content_hash,
                virtual_hosts,
                backends,
                default_backend,
                ..Default::default()
            },
            problems: problems.into_iter().collect(),
        }
    }
}

/// The virtual hosts of the winning routes (sorted by host, then path), each appended to
/// `bytes` as the content hash covers it.
fn virtual_hosts(winners: &[Candidate<'_>], bytes: &mut Vec<u8>) -> Vec<VirtualHost> {
    bytes.clear();
    let mut out: Vec<VirtualHost> = Vec::new();
    let mut rest = winners;
    while let Some(first) = rest.first() {
        let host = &first.route.host;
        let n = rest.iter().take_while(|c| &c.route.host == host).count();
        let (group, tail) = rest.split_at(n);
        rest = tail;
        let mut routes: Vec<Route> = group
            .iter()
            .map(|c| Route {
                match_kind: c.route.kind as i32,
                path: c.route.path.clone(),
                backend: c.route.backend.name.clone(),
                source: Some(c.ingress.source.clone()),
            })
            .collect();
        sort_routes(&mut routes);
        let vhost = VirtualHost {
            host: host.clone(),
            routes,
        };
        content::encode_virtual_host(&vhost, bytes);
        out.push(vhost);
    }
    out
}

/// Resolves `used` (sorted by name) against the Services and EndpointSlices, each
/// appended to `bytes` as the content hash covers it.
fn resolve_backends(
    used: &[&BackendRef],
    index: &ServiceIndex<'_>,
    bytes: &mut Vec<u8>,
) -> Vec<Backend> {
    bytes.clear();
    used.iter()
        .map(|key| {
            let k = (key.namespace.as_str(), key.service.as_str());
            let slices = index.slices.get(&k).map_or(&[][..], Vec::as_slice);
            let backend = resolve_backend(key, index.services.get(&k).copied(), slices);
            content::encode_backend(&backend, bytes);
            backend
        })
        .collect()
}

/// Services and EndpointSlices by (namespace, Service name).
struct ServiceIndex<'a> {
    services: FastMap<(&'a str, &'a str), &'a ServiceDigest>,
    slices: FastMap<(&'a str, &'a str), Vec<&'a SliceDigest>>,
}

impl<'a> ServiceIndex<'a> {
    fn new(services: &'a [Arc<ServiceDigest>], slices: &'a [Arc<SliceDigest>]) -> Self {
        let mut index = ServiceIndex {
            services: FastMap::default(),
            slices: FastMap::default(),
        };
        index.services.reserve(services.len());
        for s in services {
            if let (Some(ns), Some(name)) = (s.namespace.as_deref(), s.name.as_deref()) {
                index.services.insert((ns, name), s);
            }
        }
        index.slices.reserve(slices.len());
        for slice in slices {
            if let (Some(ns), Some(svc)) = (slice.namespace.as_deref(), slice.service.as_deref()) {
                index.slices.entry((ns, svc)).or_default().push(slice);
            }
        }
        index
    }
}

/// Resolves one backend against its Service and that Service's EndpointSlices.
fn resolve_backend(
    key: &BackendRef,
    svc: Option<&ServiceDigest>,
    slices: &[&SliceDigest],
) -> Backend {
    let (ns, svc_name, port_ref) = (&key.namespace, &key.service, &key.port);
    let mut backend = Backend {
        name: key.name.clone(),
        ..Default::default()
    };
    let Some(svc) = svc else {
        backend.unavailable_reason = format!("service {ns}/{svc_name} not found");
        return backend;
    };
    if let Some(external) = &svc.external_name {
        if external.is_empty() {
            backend.unavailable_reason =
                format!("ExternalName service {ns}/{svc_name} has no externalName");
            return backend;
        }
        let port = match port_ref {
            PortRef::Number(n) => Some(*n),
            PortRef::Name(name) => svc.ports.iter().find(|p| &p.name == name).map(|p| p.port),
        };
        match port {
            Some(p) => {
                backend.external_name = external.clone();
                backend.external_port = p as u32;
            }
            None => {
                backend.unavailable_reason =
                    format!("service {ns}/{svc_name} has no port {port_ref}")
            }
        }
        return backend;
    }
    let service_port = svc.ports.iter().find(|p| match port_ref {
        PortRef::Number(n) => p.port == *n,
        PortRef::Name(name) => &p.name == name,
    });
    let Some(service_port) = service_port else {
        backend.unavailable_reason = format!("service {ns}/{svc_name} has no port {port_ref}");
        return backend;
    };
    // (address, port, zone), borrowed; sorted and deduplicated before anything is copied.
    let mut endpoints: Vec<(&str, u32, &str)> = Vec::new();
    for slice in slices {
        // Named target ports are resolved per slice: its port named like the Service port.
        let slice_port = slice
            .ports
            .iter()
            .find(|(name, _)| *name == service_port.name)
            .and_then(|(_, port)| *port)
            .or(service_port.numeric_target);
        let Some(port) = slice_port.filter(|p| (1..=65535).contains(p)) else {
            continue;
        };
        for (address, zone) in &slice.endpoints {
            let text = &slice.text;
            endpoints.push((&text[address.clone()], port as u32, &text[zone.clone()]));
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
