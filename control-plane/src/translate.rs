//! `cluster objects → snapshot`: a pure function with the route semantics of docs/design.md.
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
//!   `Prefix`, and refused (with a [`Problem`]) if it holds `%`, `\`, `//` or a dot
//!   segment, which normalised request paths never do. A path must start with `/` and contain no whitespace, `?` or `#`. A Prefix
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
//!   An ExternalName Service resolves to its DNS name only with `allow_external_name`;
//!   otherwise its backend is unavailable (503) and its Ingresses get a [`Problem`].
//! - **Unknown is not absent.** A missing Service, a missing port or no ready endpoints
//!   keeps the route, with a backend that has no endpoints and an `unavailable_reason`
//!   (the proxy answers 503). Routes are removed only when their Ingress rule is.
//! - A resource backend (not a Service) is not supported: that path is skipped with a
//!   [`Problem`].
//! - **TLS.** Each `spec.tls` host is served with the certificate of the named
//!   `kubernetes.io/tls` Secret (same namespace), carried once in the snapshot as the
//!   resource `namespace/secret`; only Secrets our Ingresses name (and the operator's
//!   `--default-certificate`) ever enter a snapshot. The oldest Ingress wins a host named
//!   with two different Secrets. A host gets the certificate only if it has a virtual host
//!   of its own (rules for exactly that host) and the certificate covers it (exact name,
//!   or a one-label wildcard). A missing Secret, a malformed PEM, a key that does not
//!   match, or a renewed certificate that no longer covers a host it covered is a
//!   [`Problem`], and the Secret's hosts keep its last good certificate (as long as this
//!   translator has seen one); hosts without a usable certificate get no TLS and no
//!   redirect. Plain-HTTP requests to a host with a certificate are redirected (308) unless
//!   an Ingress routing it or naming it in `spec.tls` sets
//!   `holdfast.dev/ssl-redirect: "false"`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use holdfast_proto::certificate;
use holdfast_proto::content::ContentSum;
use holdfast_proto::delta;
use holdfast_proto::snapshot::is_valid_host;
use holdfast_proto::v1::{
    Backend, Certificate, DefaultBackend, Endpoint, IngressRef, MatchKind, ResourceKind, Route,
    Snapshot, VirtualHost,
};
use k8s_openapi::api::core::v1::{Secret, Service};
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
/// The Ingress annotation that turns the HTTP→HTTPS redirect off (`"false"`).
pub const SSL_REDIRECT_ANNOTATION: &str = "holdfast.dev/ssl-redirect";
/// The Secret type that carries a certificate and key.
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

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
    /// All Secrets of type `kubernetes.io/tls`.
    pub secrets: Vec<Arc<Secret>>,
}

/// What makes an Ingress ours.
#[derive(Debug, Clone)]
pub struct Options {
    /// Our `spec.controller` value.
    pub controller: String,
    /// Only this IngressClass name, if set.
    pub ingress_class: Option<String>,
    /// `namespace/name` of the Secret whose certificate answers TLS clients whose SNI
    /// names no host with a certificate (or that send none); None: such handshakes fail.
    pub default_certificate: Option<String>,
    /// Whether certificates (and their private keys) may enter snapshots. False when the
    /// control plane serves plaintext gRPC without `--allow-plaintext-secrets`: TLS hosts
    /// then get no certificate, with a problem saying why.
    pub allow_certificates: bool,
    /// Whether ExternalName Services may be backends (`--allow-external-name`). Off, such
    /// a backend answers 503 and its Ingresses get an `ExternalNameDisabled` problem: an
    /// ExternalName can point the proxies at any host, including cluster-internal ones
    /// another namespace owns (CVE-2021-25740).
    pub allow_external_name: bool,
    /// Who may add rules to a host (`--host-ownership`).
    pub host_ownership: HostOwnership,
    /// How large one Ingress may be.
    pub ingress_limits: IngressLimits,
    /// The namespaces whose Ingresses may set the cluster-wide `defaultBackend`
    /// (`--default-backend-namespaces`); None: all.
    pub default_backend_namespaces: Option<BTreeSet<String>>,
}

/// Who may add rules to a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HostOwnership {
    /// A host belongs to the namespace of its oldest Ingress; rules for it from other
    /// namespaces are skipped with a problem, so one namespace cannot take paths on
    /// another's host.
    #[default]
    FirstNamespace,
    /// Every namespace may add paths to any host (the oldest Ingress still wins a
    /// path both route).
    Shared,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller: "holdfast.dev/ingress-controller".into(),
            ingress_class: None,
            default_certificate: None,
            allow_certificates: true,
            allow_external_name: false,
            host_ownership: HostOwnership::FirstNamespace,
            ingress_limits: IngressLimits::default(),
            default_backend_namespaces: None,
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

/// A snapshot's content, each virtual host and backend shared (`Arc`) with the
/// translator that built it and with the next builds: publishing a build copies
/// pointers, not resources.
#[derive(Debug, Clone, Default)]
pub struct Content {
    /// The content hash.
    pub content_hash: String,
    /// Virtual hosts, by host.
    pub virtual_hosts: Vec<Arc<VirtualHost>>,
    /// Backends, by name.
    pub backends: Vec<Arc<Backend>>,
    /// Certificates, by name.
    pub certificates: Vec<Certificate>,
    /// The default backend.
    pub default_backend: Option<DefaultBackend>,
    /// The default certificate's name.
    pub default_certificate: String,
    /// The encoded length of the virtual hosts, backends and certificates in a snapshot.
    pub resources_len: usize,
    /// The virtual hosts' routes (the default backend not counted).
    pub routes: RouteCounts,
}

impl Content {
    /// The content of a complete snapshot: O(snapshot).
    pub fn of(snapshot: &Snapshot) -> Self {
        let mut routes = RouteCounts::default();
        for v in &snapshot.virtual_hosts {
            routes.add(v);
        }
        let resources_len = snapshot
            .virtual_hosts
            .iter()
            .map(|v| encoded_len(VIRTUAL_HOSTS_TAG, v))
            .chain(
                snapshot
                    .backends
                    .iter()
                    .map(|b| encoded_len(BACKENDS_TAG, b)),
            )
            .chain(
                snapshot
                    .certificates
                    .iter()
                    .map(|c| encoded_len(CERTIFICATES_TAG, c)),
            )
            .sum();
        Content {
            content_hash: snapshot.content_hash.clone(),
            virtual_hosts: snapshot
                .virtual_hosts
                .iter()
                .cloned()
                .map(Arc::new)
                .collect(),
            backends: snapshot.backends.iter().cloned().map(Arc::new).collect(),
            certificates: snapshot.certificates.clone(),
            default_backend: snapshot.default_backend.clone(),
            default_certificate: snapshot.default_certificate.clone(),
            resources_len,
            routes,
        }
    }

    /// The encoding of the snapshot with this content and `identity`'s other fields,
    /// written straight from the shared resources (nothing is copied first).
    pub fn encode(&self, identity: &Snapshot) -> Vec<u8> {
        use prost::Message;
        let mut buf = Vec::with_capacity(identity.encoded_len() + self.resources_len);
        // A Vec grows, so encoding into it cannot fail. Field order does not matter to a
        // decoder; the resources follow the identity fields.
        let _ = identity.encode(&mut buf);
        for v in &self.virtual_hosts {
            prost::encoding::message::encode(VIRTUAL_HOSTS_TAG, &**v, &mut buf);
        }
        for b in &self.backends {
            prost::encoding::message::encode(BACKENDS_TAG, &**b, &mut buf);
        }
        for c in &self.certificates {
            prost::encoding::message::encode(CERTIFICATES_TAG, c, &mut buf);
        }
        buf
    }

    /// The content as an (unsealed) snapshot: O(snapshot), for a complete send.
    pub fn to_snapshot(&self) -> Snapshot {
        Snapshot {
            content_hash: self.content_hash.clone(),
            virtual_hosts: self.virtual_hosts.iter().map(|v| (**v).clone()).collect(),
            backends: self.backends.iter().map(|b| (**b).clone()).collect(),
            default_backend: self.default_backend.clone(),
            certificates: self.certificates.clone(),
            default_certificate: self.default_certificate.clone(),
            ..Default::default()
        }
    }

    /// The virtual host for `host`.
    pub fn virtual_host(&self, host: &str) -> Option<&Arc<VirtualHost>> {
        self.virtual_hosts
            .binary_search_by(|v| v.host.as_str().cmp(host))
            .ok()
            .map(|i| &self.virtual_hosts[i])
    }

    /// The backend named `name`.
    pub fn backend(&self, name: &str) -> Option<&Arc<Backend>> {
        self.backends
            .binary_search_by(|b| b.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.backends[i])
    }

    /// The certificate named `name`.
    pub fn certificate(&self, name: &str) -> Option<&Certificate> {
        self.certificates
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.certificates[i])
    }
}

/// The resources whose hash differs between two builds (added, changed or removed), by
/// name: what a delta between them carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// Virtual hosts, sorted.
    pub virtual_hosts: Vec<String>,
    /// Backends, sorted.
    pub backends: Vec<String>,
    /// Certificates, sorted.
    pub certificates: Vec<String>,
    /// The default backend changed.
    pub default_backend: bool,
    /// The default certificate changed.
    pub default_certificate: bool,
}

impl Changed {
    /// What differs between two complete snapshots, resource by resource: O(snapshot),
    /// the reference the translator's change lists are tested against.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let (before, after) = (delta::inventory(before), delta::inventory(after));
        let differs = |kind: ResourceKind| -> Vec<String> {
            let names: BTreeSet<&String> = before
                .keys()
                .chain(after.keys())
                .filter(|(k, _)| *k == kind)
                .map(|(_, n)| n)
                .collect();
            names
                .into_iter()
                .filter(|n| {
                    let key = (kind, (*n).clone());
                    before.get(&key) != after.get(&key)
                })
                .cloned()
                .collect()
        };
        Changed {
            virtual_hosts: differs(ResourceKind::VirtualHost),
            backends: differs(ResourceKind::Backend),
            certificates: differs(ResourceKind::Certificate),
            default_backend: !differs(ResourceKind::DefaultBackend).is_empty(),
            default_certificate: !differs(ResourceKind::DefaultCertificate).is_empty(),
        }
    }
}

/// What changed since a translator's previous build.
#[derive(Debug, Clone, Default)]
pub struct Since {
    /// The previous build's content hash.
    pub content_hash: String,
    /// What differs from it.
    pub changed: Changed,
}

/// The result of translation: the content (no version yet), what changed since the
/// previous build, and the problems.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// The content; [`Translation::snapshot`] makes it a snapshot to seal.
    pub content: Content,
    /// What changed since this translator's previous build (None on its first).
    pub since: Option<Since>,
    /// Skipped rules and lost conflicts, sorted.
    pub problems: Vec<Problem>,
    /// (certificate name, Ingress) for every Ingress whose `spec.tls` is served with a
    /// certificate in the snapshot, sorted: who to tell when a certificate nears expiry.
    pub certificate_users: Vec<(String, IngressRef)>,
}

impl Translation {
    /// The content as an unsealed snapshot (`content_hash` set): O(snapshot).
    pub fn snapshot(&self) -> Snapshot {
        self.content.to_snapshot()
    }
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

/// The class an Ingress names: `spec.ingressClassName`, else the legacy annotation.
fn class_of(ing: &Ingress) -> Option<&str> {
    ing.spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
                .map(String::as_str)
        })
}

/// Is an Ingress naming `class` ours?
fn class_is_ours(class: Option<&str>, classes: &HashSet<String>, default_is_ours: bool) -> bool {
    match class {
        Some(class) => classes.contains(class),
        None => default_is_ours,
    }
}

/// Is this Ingress ours?
pub fn is_ours(ing: &Ingress, classes: &HashSet<String>, default_is_ours: bool) -> bool {
    class_is_ours(class_of(ing), classes, default_is_ours)
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

/// Why a rule path could never match a normalised request path (the proxy decodes
/// escapes, merges `//` and removes dot segments before matching), if it could not.
/// The API server refuses such paths for `Exact` and `Prefix`; `ImplementationSpecific`
/// is checked here.
pub fn unnormalised(path: &str) -> Option<&'static str> {
    if path.contains('%') {
        Some("contains '%'")
    } else if path.contains('\\') {
        Some("contains '\\'")
    } else if path.contains("//") {
        Some("contains '//'")
    } else if path.split('/').any(|s| s == "." || s == "..") {
        Some("contains a '.' or '..' segment")
    } else {
        None
    }
}

/// Why an `Exact` or `Prefix` path the API server accepts could still never match a
/// normalised request path, if so: proxies decode escaped unreserved characters
/// (`%7E` → `~`), write other escapes with upper-case hex, and refuse a raw `\`, so a rule
/// holding any of those forms is never reached. (The API server itself refuses `//`, dot
/// segments and `%2F` in these paths.)
pub fn escape_never_matched(path: &str) -> Option<String> {
    if path.contains('\\') {
        return Some("contains '\\'".into());
    }
    let bytes = path.as_bytes();
    for (i, _) in path.match_indices('%') {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit));
        let Some(hex) = hex else {
            return Some(format!("has a malformed escape at byte {i}"));
        };
        let escape = &path[i..i + 3];
        let value = u8::from_str_radix(&path[i + 1..i + 3], 16).unwrap_or(0);
        if value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~') {
            return Some(format!(
                "escapes {:?} as {escape} (write it unescaped)",
                value as char
            ));
        }
        if hex.iter().any(u8::is_ascii_lowercase) {
            return Some(format!(
                "writes {escape} in lower-case hex (write {})",
                escape.to_ascii_uppercase()
            ));
        }
    }
    None
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// One backend: (namespace, Service, port as written), named `ns/service:port`. Names
/// and keys correspond one to one: namespaces and Service names are DNS labels (no `/`
/// or `:`), and a port name must contain a letter (see [`backend_ref`]).
///
/// The parts are ranges of the name (one allocation, not four).
#[derive(Debug, Clone, PartialEq, Eq)]
struct BackendRef {
    name: String,
    /// [`sort_prefix`] of `name`.
    name_key: u128,
    /// Byte offsets of the `/` after the namespace and the `:` after the Service.
    slash: usize,
    colon: usize,
    /// The port's number, or None when it is named (the name ends `name`).
    number: Option<i32>,
}

impl BackendRef {
    fn namespace(&self) -> &str {
        &self.name[..self.slash]
    }

    fn service(&self) -> &str {
        &self.name[self.slash + 1..self.colon]
    }

    /// `namespace/service`: the key of [`ServiceDigest::key`] and [`SliceDigest::key`].
    fn service_key(&self) -> &str {
        &self.name[..self.colon]
    }

    fn port(&self) -> PortRef<'_> {
        match self.number {
            Some(n) => PortRef::Number(n),
            None => PortRef::Name(&self.name[self.colon + 1..]),
        }
    }
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
        (None, Some(name)) if !name.is_empty() => PortRef::Name(name),
        _ => return Err("backend names no Service port".into()),
    };
    let name = format!("{ns}/{}:{port}", svc.name);
    Ok(BackendRef {
        name_key: sort_prefix(&name),
        slash: ns.len(),
        colon: ns.len() + 1 + svc.name.len(),
        number: match port {
            PortRef::Number(n) => Some(n),
            PortRef::Name(_) => None,
        },
        name,
    })
}

/// One path of an Ingress rule, checked and normalised.
#[derive(Debug)]
struct RouteDigest {
    /// [`sort_prefix`] of `path`.
    path_key: u128,
    host: String,
    kind: MatchKind,
    path: String,
    backend: Arc<BackendRef>,
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
    default_backend: Option<Arc<BackendRef>>,
    routes: Vec<RouteDigest>,
    /// (host, `namespace/secret`) of each valid `spec.tls` host.
    tls: Vec<(String, String)>,
    /// False when the Ingress turns the HTTP→HTTPS redirect off.
    ssl_redirect: bool,
    problems: Vec<(&'static str, String)>,
}

/// Digests one Ingress's `spec.tls` and redirect annotation into `digest`.
fn digest_tls(ing: &Ingress, ns: &str, digest: &mut IngressDigest) {
    let annotation = ing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SSL_REDIRECT_ANNOTATION));
    digest.ssl_redirect = match annotation.map(String::as_str) {
        None | Some("true") => true,
        Some("false") => false,
        Some(other) => {
            digest.problems.push((
                "InvalidAnnotation",
                format!(
                    "{SSL_REDIRECT_ANNOTATION}: {other:?} is neither \"true\" nor \"false\"; redirecting"
                ),
            ));
            true
        }
    };
    let Some(spec) = &ing.spec else { return };
    for entry in spec.tls.iter().flatten() {
        let hosts = entry.hosts.as_deref().unwrap_or_default();
        let Some(secret) = entry.secret_name.as_deref().filter(|s| !s.is_empty()) else {
            digest.problems.push((
                "InvalidTLS",
                format!("spec.tls entry for hosts {hosts:?} names no secretName; those hosts get no certificate"),
            ));
            continue;
        };
        if hosts.is_empty() {
            digest.problems.push((
                "InvalidTLS",
                format!("spec.tls entry for Secret {secret:?} lists no hosts; it is not used"),
            ));
        }
        for host in hosts {
            let host = host.to_ascii_lowercase();
            if host.is_empty() || !is_valid_host(&host) {
                digest.problems.push((
                    "InvalidTLS",
                    format!("spec.tls host {host:?} skipped: not a valid host name or one-label wildcard"),
                ));
                continue;
            }
            if let Some(suffix) = wildcard_over_public_suffix(&host) {
                digest.problems.push((
                    "PublicSuffixWildcard",
                    format!("spec.tls host {host:?} skipped: it covers every name under the public suffix {suffix:?}"),
                ));
                continue;
            }
            digest.tls.push((host, format!("{ns}/{secret}")));
        }
    }
}

/// For a wildcard such as `*.com` or `*.co.uk`, the public suffix it covers: such a host
/// would take every site under a registry. The list is Mozilla's Public Suffix List
/// (the `psl` crate); only its explicit rules count, so private names such as `*.test`
/// or `*.internal` (under the list's implicit `*` rule) are allowed.
pub fn wildcard_over_public_suffix(host: &str) -> Option<&str> {
    let parent = host.strip_prefix("*.")?;
    let suffix = psl::suffix(parent.as_bytes())?;
    (suffix.is_known() && suffix.as_bytes() == parent.as_bytes()).then_some(parent)
}

/// Digests one Ingress.
pub fn digest_ingress(ing: &Ingress) -> IngressDigest {
    digest_ingress_within(ing, IngressLimits::default())
}

/// How large one Ingress may be: one tenant's huge Ingress must not grow every proxy's
/// table (and snapshot) without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngressLimits {
    /// Most rules (`--max-rules-per-ingress`).
    pub max_rules: usize,
    /// Most paths over all rules (`--max-paths-per-ingress`).
    pub max_paths: usize,
}

impl Default for IngressLimits {
    fn default() -> Self {
        IngressLimits {
            max_rules: 1_000,
            max_paths: 5_000,
        }
    }
}

/// Digests one Ingress; one over `limits` is skipped whole, with a problem.
pub fn digest_ingress_within(ing: &Ingress, limits: IngressLimits) -> IngressDigest {
    let rules = ing
        .spec
        .as_ref()
        .and_then(|s| s.rules.as_ref())
        .map_or(0, Vec::len);
    let paths: usize = ing
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .filter_map(|r| r.http.as_ref())
        .map(|h| h.paths.len())
        .sum();
    if rules > limits.max_rules || paths > limits.max_paths {
        let mut trimmed = Ingress {
            metadata: ing.metadata.clone(),
            ..Default::default()
        };
        trimmed.spec = ing
            .spec
            .as_ref()
            .map(|s| k8s_openapi::api::networking::v1::IngressSpec {
                ingress_class_name: s.ingress_class_name.clone(),
                ..Default::default()
            });
        let mut digest = digest_ingress_unchecked(&trimmed);
        digest.problems.push((
            "IngressTooLarge",
            format!(
                "Ingress skipped: {rules} rules and {paths} paths, over the limits of {} rules (--max-rules-per-ingress) and {} paths (--max-paths-per-ingress)",
                limits.max_rules, limits.max_paths
            ),
        ));
        return digest;
    }
    digest_ingress_unchecked(ing)
}

fn digest_ingress_unchecked(ing: &Ingress) -> IngressDigest {
    let class = class_of(ing).map(str::to_owned);
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
        tls: Vec::new(),
        ssl_redirect: true,
        problems: Vec::new(),
    };
    let ns = ing.metadata.namespace.as_deref().unwrap_or("");
    digest_tls(ing, ns, &mut digest);
    let Some(spec) = &ing.spec else {
        return digest;
    };
    if let Some(db) = &spec.default_backend {
        match backend_ref(ns, db) {
            Ok(b) => digest.default_backend = Some(Arc::new(b)),
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
        if let Some(suffix) = wildcard_over_public_suffix(&host) {
            digest.problems.push((
                "PublicSuffixWildcard",
                format!(
                    "rule for host {host:?} skipped: it covers every name under the public suffix {suffix:?}"
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
            if p.path_type == "ImplementationSpecific"
                && let Some(why) = p.path.as_deref().and_then(unnormalised)
            {
                digest.problems.push((
                    "InvalidPath",
                    format!(
                        "ImplementationSpecific path {:?} on host {host:?} skipped: it {why}, and proxies match normalised request paths, which never do",
                        p.path.as_deref().unwrap_or("")
                    ),
                ));
                continue;
            }
            if p.path_type != "ImplementationSpecific"
                && let Some(why) = p.path.as_deref().and_then(escape_never_matched)
            {
                digest.problems.push((
                    "InvalidPath",
                    format!(
                        "{} path {:?} on host {host:?} skipped: it {why}; proxies match normalised request paths, which never have that form",
                        p.path_type,
                        p.path.as_deref().unwrap_or("")
                    ),
                ));
                continue;
            }
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
                    path_key: sort_prefix(&path),
                    host: host.clone(),
                    kind,
                    path,
                    backend: Arc::new(backend),
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
    /// `namespace/name`.
    key: Option<String>,
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
        key: svc
            .metadata
            .namespace
            .as_deref()
            .zip(svc.metadata.name.as_deref())
            .map(|(ns, name)| format!("{ns}/{name}")),
        external_name,
        ports,
    }
}

/// What translation needs from one EndpointSlice: its Service, its ports, and its ready
/// endpoints (first address, which parses as an IP address; zone or "").
#[derive(Debug)]
pub struct SliceDigest {
    /// `namespace/service` of the Service it belongs to.
    key: Option<String>,
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
        key: slice
            .metadata
            .namespace
            .as_deref()
            .zip(
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL)),
            )
            .map(|(ns, svc)| format!("{ns}/{svc}")),
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

/// What translation needs from one `kubernetes.io/tls` Secret: its certificate, checked
/// (parsed, key matching), or why it cannot be served.
#[derive(Debug)]
pub struct SecretDigest {
    /// `namespace/name`.
    key: Option<String>,
    /// The certificate resource (named `namespace/name`), or why there is none. The
    /// reason never contains key bytes.
    certificate: Result<Certificate, String>,
}

/// Digests one Secret: parses and checks `tls.crt` and `tls.key`.
pub fn digest_secret(secret: &Secret) -> SecretDigest {
    let key = secret
        .metadata
        .namespace
        .as_deref()
        .zip(secret.metadata.name.as_deref())
        .map(|(ns, name)| format!("{ns}/{name}"));
    let certificate = (|| {
        if secret.type_.as_deref() != Some(TLS_SECRET_TYPE) {
            return Err(format!("is not of type {TLS_SECRET_TYPE}"));
        }
        let data = secret.data.as_ref();
        let field = |name: &str| data.and_then(|d| d.get(name)).map(|b| b.0.as_slice());
        let (Some(chain), Some(private_key)) = (field("tls.crt"), field("tls.key")) else {
            return Err("lacks tls.crt or tls.key".to_owned());
        };
        let parsed = certificate::parse(chain, private_key).map_err(|e| e.to_string())?;
        let f = parsed.facts;
        Ok(Certificate {
            name: key.clone().unwrap_or_default(),
            // Only the certificates: a combined tls.crt also holds the key.
            certificate_chain: certificate::certificate_blocks(chain),
            private_key: private_key.to_vec(),
            fingerprint_sha256: f.fingerprint_sha256,
            subject: f.subject,
            dns_names: f.dns_names,
            not_after: f.not_after,
            serial: f.serial,
        })
    })();
    SecretDigest { key, certificate }
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
type FastSet<K> = HashSet<K, foldhash::fast::RandomState>;

/// The address of an `Arc`'s value: the identity of a digest or cached object.
fn addr<T>(a: &Arc<T>) -> usize {
    Arc::as_ptr(a) as usize
}

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

/// What changed in one kind since the last build: a modified object is a removal of its
/// old digest and an addition of its new one.
struct Changes<D> {
    added: Vec<Arc<D>>,
    removed: Vec<Arc<D>>,
}

impl<K: Sync + Send, D: Send + Sync> Memo<K, D> {
    /// Digests what is new in `objects`, forgets what is gone, and says which is which.
    fn refresh(
        &mut self,
        objects: &[Arc<K>],
        generation: u64,
        digest: impl Fn(&K) -> D + Sync,
    ) -> Changes<D> {
        let mut missing: Vec<&Arc<K>> = Vec::new();
        for object in objects {
            match self.entries.get_mut(&addr(object)) {
                Some(entry) => entry.2 = generation,
                None => missing.push(object),
            }
        }
        let added = parallel_map(&missing, |o| Arc::new(digest(o.as_ref())));
        for (object, d) in missing.into_iter().zip(&added) {
            self.entries
                .insert(addr(object), (object.clone(), d.clone(), generation));
        }
        let mut removed = Vec::new();
        if self.entries.len() > objects.len() {
            self.entries.retain(|_, e| {
                let keep = e.2 == generation;
                if !keep {
                    removed.push(e.1.clone());
                }
                keep
            });
        }
        Changes { added, removed }
    }

    /// Every current digest.
    fn digests(&self) -> impl Iterator<Item = &Arc<D>> {
        self.entries.values().map(|e| &e.1)
    }
}

/// How many threads a build uses (the machine's parallelism, at most 4).
fn threads() -> usize {
    // Asked once: `available_parallelism` reads the affinity mask and cgroup quota.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
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

/// Backends by name.
fn by_name(a: &BackendRef, b: &BackendRef) -> std::cmp::Ordering {
    a.name_key
        .cmp(&b.name_key)
        .then_with(|| a.name.cmp(&b.name))
}

/// Oldest first, then namespace/name: the order conflicts are decided in.
fn by_age(a: &IngressDigest, b: &IngressDigest) -> std::cmp::Ordering {
    a.age_key.cmp(&b.age_key).then_with(|| {
        (&a.source.namespace, &a.source.name).cmp(&(&b.source.namespace, &b.source.name))
    })
}

/// One virtual host as built: the message, the conflicts decided in it, and the
/// backends its routes use.
struct HostEntry {
    /// Shared with the snapshots published from it (changed only by copy on write).
    vhost: Arc<VirtualHost>,
    /// The namespace of the host's oldest Ingress (who owns it, with
    /// `HostOwnership::FirstNamespace`).
    owner: String,
    problems: Vec<Problem>,
    backends: Vec<Arc<BackendRef>>,
}

impl HostEntry {
    /// Sets the host's certificate and redirect, copying the shared virtual host only if
    /// they change.
    fn set_tls(&mut self, certificate: &str, redirect: bool) {
        if self.vhost.certificate != certificate || self.vhost.ssl_redirect != redirect {
            let v = Arc::make_mut(&mut self.vhost);
            certificate.clone_into(&mut v.certificate);
            v.ssl_redirect = redirect;
        }
    }
}

/// One resolved backend: the message, and how many virtual hosts (and the default
/// backend) use it.
struct BackendEntry {
    users: usize,
    /// Shared with the snapshots published from it.
    backend: Arc<Backend>,
    /// An ExternalName Service, refused because `allow_external_name` is off.
    refused_external: bool,
}

impl BackendEntry {
    /// An entry with `users` users, to be resolved before the snapshot is built.
    fn unresolved(users: usize) -> Self {
        BackendEntry {
            users,
            backend: Arc::default(),
            refused_external: false,
        }
    }
}

/// Builds snapshots, keeping what it built last time and redoing only what changed.
///
/// Each cached object is digested once per version ([`Memo`]). From the digests that
/// were added or removed since the last build it knows which virtual hosts (those the
/// changed Ingresses route) and which backends (those of changed Services and
/// EndpointSlices) to rebuild; every other virtual host and backend is reused. A change of which IngressClasses are ours rebuilds
/// everything. The result is always the whole snapshot, identical to what a fresh
/// `Translator` builds from the same objects (the unit tests check this over sequences
/// of changes).
#[derive(Default)]
pub struct Translator {
    ingresses: Memo<Ingress, IngressDigest>,
    services: Memo<Service, ServiceDigest>,
    slices: Memo<EndpointSlice, SliceDigest>,
    secrets: Memo<Secret, SecretDigest>,
    generation: u64,
    /// Our class names and whether the default class is ours, as of the last build.
    classes: Option<(HashSet<String>, bool)>,
    /// Services and EndpointSlices by `namespace/service`.
    services_by_key: FastMap<String, Arc<ServiceDigest>>,
    slices_by_key: FastMap<String, Vec<Arc<SliceDigest>>>,
    /// Secrets by `namespace/name`.
    secrets_by_key: FastMap<String, Arc<SecretDigest>>,
    /// The last certificate of each Secret in use that was good (its hosts keep it while
    /// the Secret is missing or broken).
    last_good: FastMap<String, Arc<SecretDigest>>,
    /// Hosts given a certificate by the last build.
    tls_hosts: Vec<String>,
    /// Our Ingresses with `spec.tls` entries.
    with_tls: FastMap<usize, Arc<IngressDigest>>,
    /// Our Ingresses routing each host.
    contributors: FastMap<String, Vec<Arc<IngressDigest>>>,
    /// Our Ingresses with a default backend, and with problems of their own.
    with_default: FastMap<usize, Arc<IngressDigest>>,
    with_problems: FastMap<usize, Arc<IngressDigest>>,
    /// The built virtual hosts (by host) and backends (by name): snapshot order.
    hosts: BTreeMap<String, HostEntry>,
    backends: Backends,
    hosts_with_problems: BTreeSet<String>,
    /// The backend the default backend uses (one of the `users` of its entry).
    default_user: Option<Arc<BackendRef>>,
    /// The content sum of the last build, kept up to date one changed resource at a time.
    sum: Summed,
    /// Hosts changed since the last build's sum (their hash is computed again).
    unsummed_hosts: Vec<String>,
    /// A build has been made (so the next one reports what changed since).
    built: bool,
    /// The routes of the built virtual hosts.
    routes: RouteCounts,
}

/// Counts of routes, kept one virtual host at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteCounts {
    /// Routes.
    pub routes: usize,
    /// Distinct (host, match kind, path) keys: what the bounded-destruction guard counts.
    pub keys: usize,
}

impl RouteCounts {
    /// The counts of one virtual host.
    pub fn of(vhost: &VirtualHost) -> Self {
        let keys: HashSet<(i32, &str)> = vhost
            .routes
            .iter()
            .map(|r| (r.match_kind, r.path.as_str()))
            .collect();
        RouteCounts {
            routes: vhost.routes.len(),
            keys: keys.len(),
        }
    }

    fn add(&mut self, vhost: &VirtualHost) {
        let c = RouteCounts::of(vhost);
        self.routes += c.routes;
        self.keys += c.keys;
    }

    fn remove(&mut self, vhost: &VirtualHost) {
        let c = RouteCounts::of(vhost);
        self.routes -= c.routes;
        self.keys -= c.keys;
    }
}

/// The content sum of the last build and the resource hash each resource had in it
/// (`holdfast_proto::content`): a build hashes only the resources that changed.
#[derive(Default)]
struct Summed {
    sum: ContentSum,
    /// Each resource's hash and the length of its encoding in a snapshot.
    hosts: FastMap<String, ([u8; 32], usize)>,
    backends: FastMap<String, ([u8; 32], usize)>,
    /// The encoded length of the snapshot's repeated resources.
    resources_len: usize,
    certificates: FastMap<String, (Certificate, [u8; 32])>,
    default_backend: Option<[u8; 32]>,
    default_certificate: Option<[u8; 32]>,
}

impl Summed {
    /// Sets the hash of resource `name` in `map` (and in the sum) to `new`; true if it
    /// changed.
    fn set(
        sum: &mut ContentSum,
        resources_len: &mut usize,
        map: &mut FastMap<String, ([u8; 32], usize)>,
        name: &str,
        new: Option<([u8; 32], usize)>,
    ) -> bool {
        let old = match new {
            Some(h) => map.insert(name.to_owned(), h),
            None => map.remove(name),
        };
        sum.replace(old.as_ref().map(|o| &o.0), new.as_ref().map(|n| &n.0));
        *resources_len = *resources_len + new.map_or(0, |n| n.1) - old.map_or(0, |o| o.1);
        old.map(|o| o.0) != new.map(|n| n.0)
    }
}

/// Field numbers of `Snapshot`'s repeated resources.
const VIRTUAL_HOSTS_TAG: u32 = 5;
const BACKENDS_TAG: u32 = 6;
const CERTIFICATES_TAG: u32 = 8;

/// The length of `message` encoded as field `tag` of a snapshot.
fn encoded_len(tag: u32, message: &impl prost::Message) -> usize {
    prost::encoding::message::encoded_len(tag, message)
}

/// The resource hash of `message`, of kind `kind`.
fn hash_of(kind: ResourceKind, message: &impl prost::Message) -> [u8; 32] {
    delta::resource_hash(kind, &message.encode_to_vec())
}

/// Translates the cluster state into a snapshot (unsealed; its `content_hash` set) and
/// the problems found, from scratch.
pub fn translate(state: &ClusterState, opts: &Options) -> Translation {
    Translator::default().translate(state, opts)
}

impl Translator {
    /// Translates the cluster state into a snapshot (unsealed; its `content_hash` set) and
    /// the problems found.
    pub fn translate(&mut self, state: &ClusterState, opts: &Options) -> Translation {
        self.generation += 1;
        let generation = self.generation;
        let ingresses = self.ingresses.refresh(&state.ingresses, generation, |ing| {
            digest_ingress_within(ing, opts.ingress_limits)
        });
        let services = self
            .services
            .refresh(&state.services, generation, digest_service);
        let slices = self
            .slices
            .refresh(&state.endpoint_slices, generation, digest_slice);
        let secrets = self
            .secrets
            .refresh(&state.secrets, generation, digest_secret);
        for d in &secrets.removed {
            if let Some(key) = &d.key
                && self
                    .secrets_by_key
                    .get(key)
                    .is_some_and(|s| Arc::ptr_eq(s, d))
            {
                self.secrets_by_key.remove(key);
            }
        }
        for d in &secrets.added {
            if let Some(key) = &d.key {
                self.secrets_by_key.insert(key.clone(), d.clone());
            }
        }

        // Services and EndpointSlices: keep the index current, note whose changed.
        let mut dirty_services: FastSet<String> = FastSet::default();
        for d in &services.removed {
            if let Some(key) = &d.key {
                if self
                    .services_by_key
                    .get(key)
                    .is_some_and(|s| Arc::ptr_eq(s, d))
                {
                    self.services_by_key.remove(key);
                }
                dirty_services.insert(key.clone());
            }
        }
        for d in &services.added {
            if let Some(key) = &d.key {
                self.services_by_key.insert(key.clone(), d.clone());
                dirty_services.insert(key.clone());
            }
        }
        for d in &slices.removed {
            if let Some(key) = &d.key {
                if let Some(list) = self.slices_by_key.get_mut(key) {
                    list.retain(|s| !Arc::ptr_eq(s, d));
                    if list.is_empty() {
                        self.slices_by_key.remove(key);
                    }
                }
                dirty_services.insert(key.clone());
            }
        }
        for d in &slices.added {
            if let Some(key) = &d.key {
                self.slices_by_key
                    .entry(key.clone())
                    .or_default()
                    .push(d.clone());
                dirty_services.insert(key.clone());
            }
        }

        // Ingresses: which are ours, and which hosts they touch.
        let classes = our_classes(&state.ingress_classes, opts);
        let ours = |d: &IngressDigest| class_is_ours(d.class.as_deref(), &classes.0, classes.1);
        let (added, removed): (Vec<Arc<IngressDigest>>, Vec<Arc<IngressDigest>>) =
            if self.classes.as_ref() == Some(&classes) {
                (ingresses.added, ingresses.removed)
            } else {
                // Which Ingresses are ours may have changed: start over.
                self.contributors.clear();
                self.with_default.clear();
                self.with_problems.clear();
                self.with_tls.clear();
                self.hosts_with_problems.clear();
                self.routes = RouteCounts::default();
                for (host, entry) in std::mem::take(&mut self.hosts) {
                    self.unsummed_hosts.push(host);
                    for b in &entry.backends {
                        self.backends.release(b);
                    }
                }
                if let Some(b) = self.default_user.take() {
                    self.backends.release(&b);
                }
                (self.ingresses.digests().cloned().collect(), Vec::new())
            };
        let mut dirty_hosts: Vec<String> = Vec::new();
        for d in removed.iter().filter(|d| ours(d)) {
            for host in hosts_of(d) {
                if let Some(list) = self.contributors.get_mut(host) {
                    list.retain(|c| !Arc::ptr_eq(c, d));
                }
                dirty_hosts.push(host.clone());
            }
            self.with_default.remove(&addr(d));
            self.with_problems.remove(&addr(d));
            self.with_tls.remove(&addr(d));
        }
        for d in added.iter().filter(|d| ours(d)) {
            for host in hosts_of(d) {
                self.contributors
                    .entry(host.clone())
                    .or_default()
                    .push(d.clone());
                dirty_hosts.push(host.clone());
            }
            if d.default_backend.is_some() {
                self.with_default.insert(addr(d), d.clone());
            }
            if !d.problems.is_empty() {
                self.with_problems.insert(addr(d), d.clone());
            }
            if !d.tls.is_empty() {
                self.with_tls.insert(addr(d), d.clone());
            }
        }
        self.classes = Some(classes);

        // Rebuild the virtual hosts the changes touch.
        dirty_hosts.sort_unstable();
        dirty_hosts.dedup();
        self.unsummed_hosts.extend(dirty_hosts.iter().cloned());
        for host in &dirty_hosts {
            if let Some(old) = self.hosts.remove(host) {
                self.routes.remove(&old.vhost);
                for b in &old.backends {
                    self.backends.release(b);
                }
            }
            self.hosts_with_problems.remove(host);
            if self.contributors.get(host).is_some_and(Vec::is_empty) {
                self.contributors.remove(host);
            }
        }
        let contributors = &self.contributors;
        let built = parallel_map(&dirty_hosts, |host| {
            contributors
                .get(host)
                .map(|list| build_host(host, list, opts.host_ownership))
        });
        let mut acquired: Vec<Arc<BackendRef>> = Vec::new();
        let mut new_hosts: Vec<(String, HostEntry)> = Vec::with_capacity(dirty_hosts.len());
        for (host, entry) in dirty_hosts.into_iter().zip(built) {
            let Some(entry) = entry else { continue };
            acquired.extend(entry.backends.iter().cloned());
            if !entry.problems.is_empty() {
                self.hosts_with_problems.insert(host.clone());
            }
            self.routes.add(&entry.vhost);
            new_hosts.push((host, entry));
        }
        if self.hosts.is_empty() {
            // From scratch: the hosts are sorted, so the map is built in one pass.
            self.hosts = new_hosts.into_iter().collect();
        } else {
            self.hosts.extend(new_hosts);
        }
        let mut new_backends: Vec<Arc<BackendRef>> = Vec::new();
        self.backends.acquire_all(acquired, &mut new_backends);

        // The default backend: the oldest Ingress's wins.
        let mut defaults: Vec<&Arc<IngressDigest>> = self.with_default.values().collect();
        defaults.sort_unstable_by(|a, b| by_age(a, b));
        let mut problems: BTreeSet<Problem> = BTreeSet::new();
        if let Some(allowed) = &opts.default_backend_namespaces {
            defaults.retain(|d| {
                let ok = allowed.contains(&d.source.namespace);
                if !ok {
                    problems.insert(Problem {
                        namespace: d.source.namespace.clone(),
                        name: d.source.name.clone(),
                        reason: "DefaultBackendNotAllowed",
                        message: format!(
                            "defaultBackend ignored: namespace {:?} may not set the cluster-wide default backend (--default-backend-namespaces)",
                            d.source.namespace
                        ),
                    });
                }
                ok
            });
        }
        let winner = defaults.first().copied().cloned();
        for loser in defaults.iter().skip(1) {
            let w = winner.as_ref().map(|w| &w.source);
            problems.insert(Problem {
                namespace: loser.source.namespace.clone(),
                name: loser.source.name.clone(),
                reason: "ConflictingDefaultBackend",
                message: format!(
                    "defaultBackend ignored: {}/{} (older) already sets one",
                    w.map_or("", |w| w.namespace.as_str()),
                    w.map_or("", |w| w.name.as_str())
                ),
            });
        }
        let default_user = winner.as_ref().and_then(|w| w.default_backend.clone());
        if default_user != self.default_user {
            if let Some(b) = &default_user {
                self.backends.acquire(b, &mut new_backends);
            }
            if let Some(b) = self.default_user.take() {
                self.backends.release(&b);
            }
            self.default_user = default_user;
        }

        // Resolve new backends, and again those whose Service or EndpointSlices changed.
        let mut to_resolve: Vec<Arc<BackendRef>> = new_backends
            .into_iter()
            .filter(|b| self.backends.entries.contains_key(&b.name))
            .collect();
        for key in &dirty_services {
            if let Some(list) = self.backends.by_service.get(key) {
                to_resolve.extend(list.iter().cloned());
            }
        }
        to_resolve.sort_unstable_by(|a, b| by_name(a, b));
        to_resolve.dedup_by(|a, b| a.name == b.name);
        let (by_key, slices_by_key) = (&self.services_by_key, &self.slices_by_key);
        let resolved = parallel_map(&to_resolve, |key| {
            let slices = slices_by_key
                .get(key.service_key())
                .map_or(&[][..], Vec::as_slice);
            resolve_backend(
                key,
                by_key.get(key.service_key()).map(|s| &**s),
                slices,
                opts.allow_external_name,
            )
        });
        if to_resolve.len() > self.backends.entries.len() / 8 {
            // Many: walk the map and the (sorted) results together.
            let mut results = to_resolve.iter().zip(resolved).peekable();
            for (name, entry) in self.backends.entries.iter_mut() {
                while results.next_if(|(key, _)| key.name < *name).is_some() {}
                if let Some((_, (backend, refused))) = results.next_if(|(key, _)| key.name == *name)
                {
                    entry.backend = Arc::new(backend);
                    entry.refused_external = refused;
                }
            }
        } else {
            for (key, (backend, refused)) in to_resolve.iter().zip(resolved) {
                if let Some(entry) = self.backends.entries.get_mut(&key.name) {
                    entry.backend = Arc::new(backend);
                    entry.refused_external = refused;
                }
            }
        }

        // The snapshot: every virtual host and backend, in order, and its content hash.
        let default_backend = winner.as_ref().and_then(|w| {
            w.default_backend.as_ref().map(|b| DefaultBackend {
                backend: b.name.clone(),
                source: Some(w.source.clone()),
            })
        });
        let tls = self.assign_certificates(opts, &mut problems);
        self.backends
            .unsummed
            .extend(to_resolve.iter().map(|b| b.name.clone()));
        let previous_hash = self.built.then(|| self.sum.sum.content_hash());
        let (content_hash, changed) = self.update_sum(default_backend.as_ref(), &tls);
        let since = previous_hash.map(|content_hash| Since {
            content_hash,
            changed,
        });
        self.built = true;

        // Pointers to the shared resources, in order.
        let virtual_hosts: Vec<Arc<VirtualHost>> =
            self.hosts.values().map(|e| e.vhost.clone()).collect();
        let backends_out: Vec<Arc<Backend>> = self
            .backends
            .entries
            .values()
            .map(|e| e.backend.clone())
            .collect();

        for host in &self.hosts_with_problems {
            if let Some(entry) = self.hosts.get(host) {
                problems.extend(entry.problems.iter().cloned());
            }
        }
        self.refused_external_problems(&mut problems);
        for d in self.with_problems.values() {
            problems.extend(d.problems.iter().map(|(reason, message)| Problem {
                namespace: d.source.namespace.clone(),
                name: d.source.name.clone(),
                reason,
                message: message.clone(),
            }));
        }
        Translation {
            content: Content {
                content_hash,
                virtual_hosts,
                backends: backends_out,
                default_backend,
                certificates: tls.certificates,
                default_certificate: tls.default_certificate,
                resources_len: self.sum.resources_len,
                routes: self.routes,
            },
            since,
            problems: problems.into_iter().collect(),
            certificate_users: tls.users,
        }
    }

    /// Brings the content sum up to date with the hosts and backends changed since the
    /// last build and this build's default backend and certificates, and returns the
    /// content hash. Hashes only what changed (the certificates are compared first).
    fn update_sum(
        &mut self,
        default_backend: Option<&DefaultBackend>,
        tls: &TlsOut,
    ) -> (String, Changed) {
        let mut changed = Changed::default();
        let mut hosts = std::mem::take(&mut self.unsummed_hosts);
        hosts.sort_unstable();
        hosts.dedup();
        let mut backends = std::mem::take(&mut self.backends.unsummed);
        backends.sort_unstable();
        backends.dedup();
        let (host_map, backend_map) = (&self.hosts, &self.backends.entries);
        let (host_hashes, backend_hashes) = join(
            hosts.len() + backends.len() > 2_000,
            || {
                parallel_map(&hosts, |h| {
                    host_map.get(h).map(|e| {
                        (
                            hash_of(ResourceKind::VirtualHost, &*e.vhost),
                            encoded_len(VIRTUAL_HOSTS_TAG, &*e.vhost),
                        )
                    })
                })
            },
            || {
                parallel_map(&backends, |b| {
                    backend_map.get(b).map(|e| {
                        (
                            hash_of(ResourceKind::Backend, &*e.backend),
                            encoded_len(BACKENDS_TAG, &*e.backend),
                        )
                    })
                })
            },
        );
        let s = &mut self.sum;
        for (name, new) in hosts.into_iter().zip(host_hashes) {
            if Summed::set(&mut s.sum, &mut s.resources_len, &mut s.hosts, &name, new) {
                changed.virtual_hosts.push(name);
            }
        }
        for (name, new) in backends.into_iter().zip(backend_hashes) {
            if Summed::set(
                &mut s.sum,
                &mut s.resources_len,
                &mut s.backends,
                &name,
                new,
            ) {
                changed.backends.push(name);
            }
        }
        let current: FastSet<&str> = tls.certificates.iter().map(|c| c.name.as_str()).collect();
        let gone: Vec<String> = s
            .certificates
            .keys()
            .filter(|name| !current.contains(name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some((c, h)) = s.certificates.remove(&name) {
                s.sum.remove(&h);
                s.resources_len -= encoded_len(CERTIFICATES_TAG, &c);
                changed.certificates.push(name);
            }
        }
        for c in &tls.certificates {
            if s.certificates
                .get(&c.name)
                .is_some_and(|(held, _)| held == c)
            {
                continue;
            }
            let h = hash_of(ResourceKind::Certificate, c);
            let old = s.certificates.insert(c.name.clone(), (c.clone(), h));
            s.resources_len += encoded_len(CERTIFICATES_TAG, c);
            if let Some((o, _)) = &old {
                s.resources_len -= encoded_len(CERTIFICATES_TAG, o);
            }
            if old.as_ref().map(|(_, h)| h) != Some(&h) {
                changed.certificates.push(c.name.clone());
            }
            s.sum.replace(old.as_ref().map(|(_, h)| h), Some(&h));
        }
        changed.certificates.sort_unstable();
        let new = default_backend.map(|d| hash_of(ResourceKind::DefaultBackend, d));
        changed.default_backend = s.default_backend != new;
        s.sum.replace(s.default_backend.as_ref(), new.as_ref());
        s.default_backend = new;
        let new = (!tls.default_certificate.is_empty()).then(|| {
            delta::resource_hash(
                ResourceKind::DefaultCertificate,
                tls.default_certificate.as_bytes(),
            )
        });
        changed.default_certificate = s.default_certificate != new;
        s.sum.replace(s.default_certificate.as_ref(), new.as_ref());
        s.default_certificate = new;
        (s.sum.content_hash(), changed)
    }

    /// An `ExternalNameDisabled` problem for each Ingress routing to a refused
    /// ExternalName backend. Walks the routes only while there is such a backend.
    fn refused_external_problems(&self, problems: &mut BTreeSet<Problem>) {
        let refused: HashSet<&str> = self
            .backends
            .entries
            .iter()
            .filter(|(_, e)| e.refused_external)
            .map(|(name, _)| name.as_str())
            .collect();
        if refused.is_empty() {
            return;
        }
        for entry in self.hosts.values() {
            for route in &entry.vhost.routes {
                if let (true, Some(src)) = (refused.contains(route.backend.as_str()), &route.source)
                {
                    problems.insert(Problem {
                        namespace: src.namespace.clone(),
                        name: src.name.clone(),
                        reason: "ExternalNameDisabled",
                        message: format!(
                            "backend {} is an ExternalName Service, and ExternalName backends are off (--allow-external-name): it answers 503",
                            route.backend
                        ),
                    });
                }
            }
        }
    }

    /// Decides which certificate serves each `spec.tls` host, sets `certificate` and
    /// `ssl_redirect` on the built virtual hosts, and returns the certificates in use.
    /// Runs in full on every build: its cost is in the TLS entries, not the cluster.
    fn assign_certificates(&mut self, opts: &Options, problems: &mut BTreeSet<Problem>) -> TlsOut {
        let before: Vec<(String, String, bool)> = self
            .tls_hosts
            .iter()
            .filter_map(|h| {
                let v = &self.hosts.get(h)?.vhost;
                Some((h.clone(), v.certificate.clone(), v.ssl_redirect))
            })
            .collect();
        let out = self.assign_certificates_afresh(opts, problems);
        // The hosts whose certificate or redirect changed must be hashed again.
        let had: FastSet<&str> = before.iter().map(|(h, _, _)| h.as_str()).collect();
        for (host, certificate, redirect) in &before {
            if self.hosts.get(host).is_some_and(|e| {
                e.vhost.certificate != *certificate || e.vhost.ssl_redirect != *redirect
            }) {
                self.unsummed_hosts.push(host.clone());
            }
        }
        for host in &self.tls_hosts {
            if !had.contains(host.as_str()) {
                self.unsummed_hosts.push(host.clone());
            }
        }
        out
    }

    /// [`Self::assign_certificates`] without the bookkeeping of what it changed.
    fn assign_certificates_afresh(
        &mut self,
        opts: &Options,
        problems: &mut BTreeSet<Problem>,
    ) -> TlsOut {
        let problem = |src: &IngressRef, reason: &'static str, message: String| Problem {
            namespace: src.namespace.clone(),
            name: src.name.clone(),
            reason,
            message,
        };
        // Each host's Secret: the oldest Ingress naming the host decides.
        let mut tls_ingresses: Vec<&Arc<IngressDigest>> = self.with_tls.values().collect();
        tls_ingresses.sort_unstable_by(|a, b| by_age(a, b));
        if !opts.allow_certificates {
            for d in &tls_ingresses {
                problems.insert(problem(
                    &d.source,
                    "TLSDisabled",
                    "spec.tls ignored: the control plane serves plaintext gRPC, so it sends no private keys (use mutual TLS, or --allow-plaintext-secrets)".into(),
                ));
            }
            for host in std::mem::take(&mut self.tls_hosts) {
                if let Some(entry) = self.hosts.get_mut(&host) {
                    entry.set_tls("", false);
                }
            }
            return TlsOut {
                certificates: Vec::new(),
                default_certificate: String::new(),
                users: Vec::new(),
            };
        }
        let mut wanted: BTreeMap<&str, (&str, &IngressDigest)> = BTreeMap::new();
        for d in &tls_ingresses {
            for (host, secret) in &d.tls {
                if opts.host_ownership == HostOwnership::FirstNamespace
                    && let Some(entry) = self.hosts.get(host.as_str())
                    && entry.owner != d.source.namespace
                {
                    problems.insert(problem(
                        &d.source,
                        "HostOwnedByOtherNamespace",
                        format!(
                            "spec.tls host {host:?} ignored: the host belongs to namespace {:?} (its oldest Ingress); see --host-ownership",
                            entry.owner
                        ),
                    ));
                    continue;
                }
                match wanted.get(host.as_str()) {
                    None => {
                        wanted.insert(host, (secret, d));
                    }
                    Some((s, w)) if *s != secret.as_str() => {
                        problems.insert(problem(
                            &d.source,
                            "ConflictingTLS",
                            format!(
                                "spec.tls host {host:?} with Secret {secret:?} ignored: {}/{} (older) serves it with {s:?}",
                                w.source.namespace, w.source.name
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        // Each Secret in use: its current certificate if good, else its last good one.
        let mut secrets: BTreeMap<&str, (Vec<&str>, Vec<&IngressRef>)> = BTreeMap::new();
        for (host, (secret, d)) in &wanted {
            let e = secrets.entry(secret).or_default();
            e.0.push(host);
            if !e.1.contains(&&d.source) {
                e.1.push(&d.source);
            }
        }
        let default_secret = opts.default_certificate.as_deref();
        if let Some(s) = default_secret {
            secrets.entry(s).or_default();
        }
        let mut chosen: BTreeMap<&str, Arc<SecretDigest>> = BTreeMap::new();
        for (secret, (hosts, users)) in &secrets {
            let current = self.secrets_by_key.get(*secret);
            let last = self.last_good.get(*secret);
            let mut tell = |reason: &'static str, message: String| {
                if users.is_empty() {
                    // The operator's default certificate: reported under the Secret.
                    let (namespace, name) = secret.split_once('/').unwrap_or(("", secret));
                    problems.insert(Problem {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        reason,
                        message: format!("--default-certificate: {message}"),
                    });
                }
                for u in users {
                    problems.insert(problem(u, reason, message.clone()));
                }
            };
            let keeps = if last.is_some() {
                "its hosts keep the previous certificate"
            } else {
                "its hosts get no certificate"
            };
            let pick = match current {
                Some(cur) => match &cur.certificate {
                    Ok(c) => {
                        let dropped: Vec<&str> = last
                            .filter(|l| !Arc::ptr_eq(l, cur))
                            .and_then(|l| l.certificate.as_ref().ok())
                            .map(|l| {
                                hosts
                                    .iter()
                                    .copied()
                                    .filter(|h| {
                                        certificate::covers(&l.dns_names, h)
                                            && !certificate::covers(&c.dns_names, h)
                                    })
                                    .collect()
                            })
                            .unwrap_or_default();
                        if dropped.is_empty() {
                            Some(cur.clone())
                        } else {
                            tell(
                                "InvalidTLSSecret",
                                format!(
                                    "Secret {secret:?} now holds a certificate that does not cover {dropped:?}; its hosts keep the previous certificate"
                                ),
                            );
                            last.cloned()
                        }
                    }
                    Err(e) => {
                        tell(
                            "InvalidTLSSecret",
                            format!("Secret {secret:?} {e}; {keeps}"),
                        );
                        last.cloned()
                    }
                },
                None => {
                    tell(
                        "MissingTLSSecret",
                        format!(
                            "Secret {secret:?} not found (or not of type {TLS_SECRET_TYPE}); {keeps}"
                        ),
                    );
                    last.cloned()
                }
            };
            if let Some(p) = pick {
                self.last_good.insert((*secret).to_owned(), p.clone());
                chosen.insert(secret, p);
            }
        }
        self.last_good
            .retain(|k, _| secrets.contains_key(k.as_str()));

        // Each host: the chosen certificate, if it covers the host and the host is routed.
        let mut assigned: Vec<(String, String, bool)> = Vec::new();
        let mut users: BTreeSet<(String, String, String)> = BTreeSet::new();
        for (host, (secret, d)) in &wanted {
            let Some(cert) = chosen.get(secret).and_then(|c| c.certificate.as_ref().ok()) else {
                continue;
            };
            if !certificate::covers(&cert.dns_names, host) {
                problems.insert(problem(
                    &d.source,
                    "TLSHostNotCovered",
                    format!("the certificate in Secret {secret:?} does not cover host {host:?} (it names {:?}); the host gets no certificate", cert.dns_names),
                ));
                continue;
            }
            if !self.hosts.contains_key(*host) {
                problems.insert(problem(
                    &d.source,
                    "TLSHostWithoutRules",
                    format!("spec.tls host {host:?} has no rules of its own in any Ingress of this class; it gets no certificate"),
                ));
                continue;
            }
            let redirect = d.ssl_redirect
                && self
                    .contributors
                    .get(*host)
                    .is_none_or(|list| list.iter().all(|c| c.ssl_redirect));
            assigned.push(((*host).to_owned(), cert.name.clone(), redirect));
        }
        let served: FastMap<&str, &str> = assigned
            .iter()
            .map(|(h, c, _)| (h.as_str(), c.as_str()))
            .collect();
        for d in &tls_ingresses {
            for (h, s) in &d.tls {
                if served.get(h.as_str()) == Some(&s.as_str()) {
                    users.insert((s.clone(), d.source.namespace.clone(), d.source.name.clone()));
                }
            }
        }
        let kept: FastSet<&str> = served.keys().copied().collect();
        for host in std::mem::take(&mut self.tls_hosts) {
            if !kept.contains(host.as_str())
                && let Some(entry) = self.hosts.get_mut(&host)
            {
                entry.set_tls("", false);
            }
        }
        drop(kept);
        drop(served);
        let mut names: BTreeSet<&str> = BTreeSet::new();
        for (host, name, redirect) in assigned {
            if let Some(entry) = self.hosts.get_mut(&host) {
                entry.set_tls(&name, redirect);
            }
            if let Some((secret, _)) = wanted.get(host.as_str()) {
                names.insert(secret);
            }
            self.tls_hosts.push(host);
        }
        let default_certificate = default_secret
            .filter(|s| chosen.contains_key(s))
            .map(str::to_owned)
            .unwrap_or_default();
        if !default_certificate.is_empty() {
            names.insert(default_secret.unwrap_or_default());
        }
        let certificates = names
            .into_iter()
            .filter_map(|n| chosen.get(n))
            .filter_map(|d| d.certificate.as_ref().ok().cloned())
            .collect();
        TlsOut {
            certificates,
            default_certificate,
            users: users
                .into_iter()
                .map(|(c, namespace, name)| (c, IngressRef { namespace, name }))
                .collect(),
        }
    }
}

/// The TLS part of a build.
struct TlsOut {
    /// Sorted by name.
    certificates: Vec<Certificate>,
    default_certificate: String,
    users: Vec<(String, IngressRef)>,
}

/// The distinct hosts an Ingress routes.
fn hosts_of(d: &IngressDigest) -> Vec<&String> {
    let mut hosts: Vec<&String> = d.routes.iter().map(|r| &r.host).collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

/// The built backends, by name (snapshot order), and their names by the Service they
/// resolve against.
#[derive(Default)]
struct Backends {
    entries: BTreeMap<String, BackendEntry>,
    by_service: FastMap<String, Vec<Arc<BackendRef>>>,
    /// Backends removed or resolved again since the last build's content sum.
    unsummed: Vec<String>,
}

impl Backends {
    /// One more user of backend `b`; a backend not built yet is noted in `new`.
    fn acquire(&mut self, b: &Arc<BackendRef>, new: &mut Vec<Arc<BackendRef>>) {
        match self.entries.get_mut(&b.name) {
            Some(entry) => entry.users += 1,
            None => {
                self.entries
                    .insert(b.name.clone(), BackendEntry::unresolved(1));
                self.added(b, new);
            }
        }
    }

    /// [`Backends::acquire`] for each of `refs`; from scratch, in one pass.
    fn acquire_all(&mut self, mut refs: Vec<Arc<BackendRef>>, new: &mut Vec<Arc<BackendRef>>) {
        if !self.entries.is_empty() {
            for b in &refs {
                self.acquire(b, new);
            }
            return;
        }
        refs.sort_unstable_by(|a, b| by_name(a, b));
        let mut entries = Vec::new();
        for group in refs.chunk_by(|a, b| a.name == b.name) {
            let b = &group[0];
            entries.push((b.name.clone(), BackendEntry::unresolved(group.len())));
            self.added(b, new);
        }
        self.entries = entries.into_iter().collect();
    }

    /// Indexes a backend just added by its Service, and notes it in `new` (to resolve).
    fn added(&mut self, b: &Arc<BackendRef>, new: &mut Vec<Arc<BackendRef>>) {
        self.by_service
            .entry(b.service_key().to_owned())
            .or_default()
            .push(b.clone());
        new.push(b.clone());
    }

    /// One user fewer of backend `b`; an unused backend leaves the snapshot.
    fn release(&mut self, b: &BackendRef) {
        let Some(entry) = self.entries.get_mut(&b.name) else {
            return;
        };
        entry.users -= 1;
        if entry.users > 0 {
            return;
        }
        self.entries.remove(&b.name);
        self.unsummed.push(b.name.clone());
        if let Some(list) = self.by_service.get_mut(b.service_key()) {
            list.retain(|x| x.name != b.name);
            if list.is_empty() {
                self.by_service.remove(b.service_key());
            }
        }
    }
}

/// Builds one virtual host from the Ingresses that route it: on the same host, path and
/// kind twice, the oldest Ingress wins and the others (if other Ingresses) get a problem.
fn build_host(
    host: &str,
    contributors: &[Arc<IngressDigest>],
    ownership: HostOwnership,
) -> HostEntry {
    let mut ordered: Vec<&IngressDigest> = contributors.iter().map(|d| &**d).collect();
    ordered.sort_unstable_by(|a, b| by_age(a, b));
    let mut problems = Vec::new();
    let owner = ordered
        .first()
        .map(|d| d.source.namespace.clone())
        .unwrap_or_default();
    if ownership == HostOwnership::FirstNamespace && !owner.is_empty() {
        ordered.retain(|d| {
            let own = d.source.namespace == owner;
            if !own {
                problems.push(Problem {
                    namespace: d.source.namespace.clone(),
                    name: d.source.name.clone(),
                    reason: "HostOwnedByOtherNamespace",
                    message: format!(
                        "rules for host {host:?} skipped: the host belongs to namespace {owner:?} (its oldest Ingress); see --host-ownership"
                    ),
                });
            }
            own
        });
    }
    let mut candidates: Vec<(&RouteDigest, usize)> = ordered
        .iter()
        .enumerate()
        .flat_map(|(rank, d)| {
            d.routes
                .iter()
                .filter(|r| r.host == host)
                .map(move |r| (r, rank))
        })
        .collect();
    candidates.sort_unstable_by(|(a, ra), (b, rb)| {
        (a.kind as i32, a.path_key)
            .cmp(&(b.kind as i32, b.path_key))
            .then_with(|| (&a.path, ra).cmp(&(&b.path, rb)))
    });
    let mut winners: Vec<(&RouteDigest, usize)> = Vec::with_capacity(candidates.len());
    for (route, rank) in candidates {
        if let Some((w, wrank)) = winners.last()
            && (w.kind, &w.path) == (route.kind, &route.path)
        {
            let (winner, loser) = (ordered[*wrank], ordered[rank]);
            if !std::ptr::eq(winner, loser) {
                problems.push(Problem {
                    namespace: loser.source.namespace.clone(),
                    name: loser.source.name.clone(),
                    reason: "ConflictingRoute",
                    message: format!(
                        "{:?} path {:?} on host {:?} ignored: {}/{} (older) already routes it",
                        route.kind, route.path, host, winner.source.namespace, winner.source.name
                    ),
                });
            }
            continue;
        }
        winners.push((route, rank));
    }
    let mut routes: Vec<Route> = winners
        .iter()
        .map(|(r, rank)| Route {
            match_kind: r.kind as i32,
            path: r.path.clone(),
            backend: r.backend.name.clone(),
            source: Some(ordered[*rank].source.clone()),
        })
        .collect();
    sort_routes(&mut routes);
    let mut backends: Vec<Arc<BackendRef>> =
        winners.iter().map(|(r, _)| r.backend.clone()).collect();
    backends.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    backends.dedup_by(|a, b| a.name == b.name);
    let vhost = VirtualHost {
        host: host.to_owned(),
        routes,
        ..Default::default()
    };
    HostEntry {
        vhost: Arc::new(vhost),
        owner,
        problems,
        backends,
    }
}

/// Resolves one backend against its Service and that Service's EndpointSlices; true with
/// it if it is an ExternalName Service refused because `allow_external` is off.
fn resolve_backend(
    key: &BackendRef,
    svc: Option<&ServiceDigest>,
    slices: &[Arc<SliceDigest>],
    allow_external: bool,
) -> (Backend, bool) {
    (
        resolve_allowed_backend(key, svc, slices, allow_external),
        !allow_external && svc.is_some_and(|s| s.external_name.is_some()),
    )
}

fn resolve_allowed_backend(
    key: &BackendRef,
    svc: Option<&ServiceDigest>,
    slices: &[Arc<SliceDigest>],
    allow_external: bool,
) -> Backend {
    let (ns, svc_name, port_ref) = (key.namespace(), key.service(), key.port());
    let mut backend = Backend {
        name: key.name.clone(),
        ..Default::default()
    };
    let Some(svc) = svc else {
        backend.unavailable_reason = format!("service {ns}/{svc_name} not found");
        return backend;
    };
    if let Some(external) = &svc.external_name {
        if !allow_external {
            backend.unavailable_reason = format!(
                "ExternalName service {ns}/{svc_name} is not allowed (--allow-external-name is off)"
            );
            return backend;
        }
        if external.is_empty() {
            backend.unavailable_reason =
                format!("ExternalName service {ns}/{svc_name} has no externalName");
            return backend;
        }
        let port = match port_ref {
            PortRef::Number(n) => Some(n),
            PortRef::Name(name) => svc.ports.iter().find(|p| p.name == name).map(|p| p.port),
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
        PortRef::Number(n) => p.port == n,
        PortRef::Name(name) => p.name == name,
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
