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
//!   Loopback, link-local, unspecified and multicast addresses are left out with a
//!   [`Problem`]: they point at the proxy itself or at the node.
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
//!
//! # Layout
//! This file holds the rules above and the public API ([`translate`], [`Translator`] and
//! what they return). A build runs in five named phases ([`Translator::translate`]):
//! apply object changes, rebuild hosts, choose the default backend, resolve dirty
//! backends, emit. Their parts:
//! - `rules`: which Ingresses and classes are ours, paths and match kinds, backend
//!   references, sort orders;
//! - `digest`: what a build needs of each object, made once per object version;
//! - `incremental`: the per-object memo, the scoped-thread pool, the running content sum;
//! - `resolve`: virtual hosts, backend resolution and certificate choice;
//! - `tests`: the unit tests, including a long-lived translator against a fresh one after
//!   every change of a sequence.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use holdfast_proto::delta;

use crate::claims;
use holdfast_proto::v1::{
    Backend, Certificate, DefaultBackend, GatewayHost, GatewayListener, IngressRef, ResourceKind,
    Snapshot, VirtualHost,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use std::collections::HashMap;

mod digest;
mod gateway;
mod incremental;
pub mod nginx;
mod resolve;
mod rules;

use digest::RouteDigest;
pub use digest::{
    H2C_APP_PROTOCOL, IngressDigest, IngressReading, InvalidSecret, SecretDigest, ServiceDigest,
    SliceDigest, digest_ingress, digest_ingress_within, digest_secret, digest_service,
    digest_slice,
};
use incremental::{
    BACKENDS_TAG, CERTIFICATES_TAG, GATEWAY_HOSTS_TAG, GATEWAY_LISTENERS_TAG, Memo, Summed,
    VIRTUAL_HOSTS_TAG, addr, encoded_len, parallel_map,
};
use resolve::{Backends, HostEntry, build_host, hosts_of, resolve_backend};
use rules::{
    BackendRef, PortRef, backend_ref, by_age, by_name, class_is_ours, class_of, ingress_ref,
    our_classes, service_port_ref, sort_prefix,
};
pub use rules::{
    InvalidBackend, InvalidPath, Speaks, TlsAsked, escape_never_matched, is_ours, match_kind,
    normalise_path, our_ingresses, sort_ingress_routes, sort_routes, unnormalised,
    wildcard_over_public_suffix,
};

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
    /// The host claims ConfigMap ([`crate::claims`]): none, or the one named by
    /// `--host-claims-configmap`.
    pub host_claims: Vec<Arc<ConfigMap>>,
    /// All GatewayClasses (none while the Gateway API is not installed).
    pub gateway_classes: Vec<Arc<crate::gateway_api::GatewayClass>>,
    /// All Gateways.
    pub gateways: Vec<Arc<crate::gateway_api::Gateway>>,
    /// All HTTPRoutes.
    pub http_routes: Vec<Arc<crate::gateway_api::HttpRoute>>,
    /// All ReferenceGrants.
    pub reference_grants: Vec<Arc<crate::gateway_api::ReferenceGrant>>,
    /// All Namespaces (for their labels).
    pub namespaces: Vec<Arc<k8s_openapi::api::core::v1::Namespace>>,
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
    pub ingress_reading: IngressReading,
    /// `namespace/name` of the proxies' own Service (`--publish-service`): an endpoint
    /// address of any of its pods is refused as a backend endpoint (it would send the
    /// proxies to themselves).
    pub proxy_service: Option<String>,
    /// The namespaces whose Ingresses may set the cluster-wide `defaultBackend` or add
    /// rules without a host, which catch every host no rule names
    /// (`--default-backend-namespaces`); None: all.
    pub default_backend_namespaces: Option<BTreeSet<String>>,
    /// The GatewayClass `spec.controllerName` that makes a Gateway ours
    /// (`--gateway-controller-name`).
    pub gateway_controller: String,
    /// The addresses our Gateways get (`--gateway-address-pool`); None: Gateways get none,
    /// and no Gateway listener is served.
    pub gateway_pool: Option<crate::gateway_api::status::Pool>,
    /// Or: a Service per Gateway (`--gateway-service-namespace` and the flags with it).
    pub gateway_services: Option<crate::gateway_api::services::ServiceMode>,
}

/// Who may add rules to a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HostOwnership {
    /// A host belongs to the namespace that named it first, as the host claims ledger
    /// records ([`crate::claims`]); rules, `spec.tls` entries and annotations for it from
    /// other namespaces are skipped with a problem, so one namespace cannot take paths,
    /// certificates or settings of another's host.
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
            ingress_reading: IngressReading::default(),
            default_backend_namespaces: None,
            proxy_service: None,
            gateway_controller: crate::gateway_api::DEFAULT_CONTROLLER_NAME.into(),
            gateway_pool: None,
            gateway_services: None,
        }
    }
}

/// Why an Ingress, or part of it, was skipped or warned about: the Warning Event's
/// reason, and the `reason` label of `holdfast_problems`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemReason {
    /// An annotation of ours (or an ingress-nginx one) with a value that cannot work.
    InvalidAnnotation,
    /// An ingress-nginx annotation holdfast does not serve (ignored; the rest is served).
    UnservedAnnotation,
    /// An ingress-nginx `*-snippet` annotation: raw nginx configuration, refused on
    /// purpose.
    SnippetRefused,
    /// A canary Ingress's path that no Ingress without canary routes, or that another
    /// (older) canary joined first.
    CanaryNotJoined,
    /// A `tls` entry that cannot be used.
    InvalidTls,
    /// A wildcard host that would cover a public suffix.
    PublicSuffixWildcard,
    /// Over `--max-rules-per-ingress` or `--max-paths-per-ingress`.
    IngressTooLarge,
    /// A `defaultBackend` that cannot be used.
    InvalidDefaultBackend,
    /// A rule's host that is not a valid host name.
    InvalidHost,
    /// A path that is invalid or could never match.
    InvalidPath,
    /// A backend that cannot be used (a resource backend, a bad port).
    InvalidBackend,
    /// Two Ingresses name different certificates for one host.
    ConflictingTls,
    /// A TLS Secret whose certificate or key does not load.
    InvalidTlsSecret,
    /// A TLS Secret that does not exist (or is not of type kubernetes.io/tls).
    MissingTlsSecret,
    /// A host that another namespace's Ingress claimed first.
    HostOwnedByOtherNamespace,
    /// A path another Ingress routes already (the older one wins).
    ConflictingRoute,
    /// An ExternalName Service while `--allow-external-name` is off.
    ExternalNameDisabled,
    /// Endpoint addresses that point at the proxy itself or the node (left out).
    RefusedEndpointAddress,
    /// A `defaultBackend` from a namespace not allowed to set it.
    DefaultBackendNotAllowed,
    /// Rules without a host from a namespace not allowed to add them.
    HostlessRuleNotAllowed,
    /// A second `defaultBackend` (the older one wins).
    ConflictingDefaultBackend,
    /// A served certificate has expired.
    CertificateExpired,
    /// A served certificate expires within 14 days.
    CertificateExpiresSoon,
    /// A `tls` entry while certificates may not travel (plaintext control channel).
    TlsDisabled,
    /// A `tls` host that the Secret's certificate does not cover.
    TlsHostNotCovered,
    /// A `tls` host with no rules of its own.
    TlsHostWithoutRules,
}

impl ProblemReason {
    /// The Event reason, as Kubernetes shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemReason::InvalidAnnotation => "InvalidAnnotation",
            ProblemReason::UnservedAnnotation => "UnservedAnnotation",
            ProblemReason::SnippetRefused => "SnippetRefused",
            ProblemReason::CanaryNotJoined => "CanaryNotJoined",
            ProblemReason::InvalidTls => "InvalidTLS",
            ProblemReason::PublicSuffixWildcard => "PublicSuffixWildcard",
            ProblemReason::IngressTooLarge => "IngressTooLarge",
            ProblemReason::InvalidDefaultBackend => "InvalidDefaultBackend",
            ProblemReason::InvalidHost => "InvalidHost",
            ProblemReason::InvalidPath => "InvalidPath",
            ProblemReason::InvalidBackend => "InvalidBackend",
            ProblemReason::ConflictingTls => "ConflictingTLS",
            ProblemReason::InvalidTlsSecret => "InvalidTLSSecret",
            ProblemReason::MissingTlsSecret => "MissingTLSSecret",
            ProblemReason::HostOwnedByOtherNamespace => "HostOwnedByOtherNamespace",
            ProblemReason::ConflictingRoute => "ConflictingRoute",
            ProblemReason::ExternalNameDisabled => "ExternalNameDisabled",
            ProblemReason::RefusedEndpointAddress => "RefusedEndpointAddress",
            ProblemReason::DefaultBackendNotAllowed => "DefaultBackendNotAllowed",
            ProblemReason::HostlessRuleNotAllowed => "HostlessRuleNotAllowed",
            ProblemReason::ConflictingDefaultBackend => "ConflictingDefaultBackend",
            ProblemReason::CertificateExpired => "CertificateExpired",
            ProblemReason::CertificateExpiresSoon => "CertificateExpiresSoon",
            ProblemReason::TlsDisabled => "TLSDisabled",
            ProblemReason::TlsHostNotCovered => "TLSHostNotCovered",
            ProblemReason::TlsHostWithoutRules => "TLSHostWithoutRules",
        }
    }
}

impl std::fmt::Display for ProblemReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// Ordered by name, as problems are listed (GetStatus, Events).
impl Ord for ProblemReason {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for ProblemReason {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq<&str> for ProblemReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
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
    pub reason: ProblemReason,
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
    /// Gateway API listeners, by name.
    pub gateway_listeners: Vec<Arc<GatewayListener>>,
    /// Gateway API hosts, by name.
    pub gateway_hosts: Vec<Arc<GatewayHost>>,
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
        for g in &snapshot.gateway_hosts {
            routes = routes.plus(RouteCounts::of_gateway_host(g));
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
            .chain(
                snapshot
                    .gateway_listeners
                    .iter()
                    .map(|l| encoded_len(GATEWAY_LISTENERS_TAG, l)),
            )
            .chain(
                snapshot
                    .gateway_hosts
                    .iter()
                    .map(|g| encoded_len(GATEWAY_HOSTS_TAG, g)),
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
            gateway_listeners: snapshot
                .gateway_listeners
                .iter()
                .cloned()
                .map(Arc::new)
                .collect(),
            gateway_hosts: snapshot
                .gateway_hosts
                .iter()
                .cloned()
                .map(Arc::new)
                .collect(),
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
        for l in &self.gateway_listeners {
            prost::encoding::message::encode(GATEWAY_LISTENERS_TAG, &**l, &mut buf);
        }
        for g in &self.gateway_hosts {
            prost::encoding::message::encode(GATEWAY_HOSTS_TAG, &**g, &mut buf);
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
            gateway_listeners: self
                .gateway_listeners
                .iter()
                .map(|l| (**l).clone())
                .collect(),
            gateway_hosts: self.gateway_hosts.iter().map(|g| (**g).clone()).collect(),
            ..Default::default()
        }
    }

    /// The Gateway listener named `name`.
    pub fn gateway_listener(&self, name: &str) -> Option<&Arc<GatewayListener>> {
        self.gateway_listeners
            .binary_search_by(|l| l.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.gateway_listeners[i])
    }

    /// The Gateway host named `name`.
    pub fn gateway_host(&self, name: &str) -> Option<&Arc<GatewayHost>> {
        self.gateway_hosts
            .binary_search_by(|g| g.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.gateway_hosts[i])
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
    /// Gateway listeners, sorted.
    pub gateway_listeners: Vec<String>,
    /// Gateway hosts, sorted.
    pub gateway_hosts: Vec<String>,
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
            gateway_listeners: differs(ResourceKind::GatewayListener),
            gateway_hosts: differs(ResourceKind::GatewayHost),
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

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<K> = HashSet<K, foldhash::fast::RandomState>;

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
    /// The host claims ConfigMap of the last build, and its ledger.
    claims_source: Option<Arc<ConfigMap>>,
    ledger: claims::Ledger,
    /// The proxies' own pod addresses (`Options::proxy_service`), as of the last build.
    proxy_addresses: FastSet<String>,
    /// The Gateway API listeners and hosts.
    gateway: gateway::GatewayPart,
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

    /// The counts of one Gateway host.
    pub fn of_gateway_host(host: &GatewayHost) -> Self {
        let keys: HashSet<(i32, String)> = host
            .routes
            .iter()
            .map(|r| (r.match_kind, holdfast_proto::snapshot::gateway_route_key(r)))
            .collect();
        RouteCounts {
            routes: host.routes.len(),
            keys: keys.len(),
        }
    }

    fn add(&mut self, vhost: &VirtualHost) {
        let c = RouteCounts::of(vhost);
        self.routes += c.routes;
        self.keys += c.keys;
    }

    fn plus(self, other: RouteCounts) -> RouteCounts {
        RouteCounts {
            routes: self.routes + other.routes,
            keys: self.keys + other.keys,
        }
    }

    fn add_host(&mut self, host: &GatewayHost) {
        *self = self.plus(RouteCounts::of_gateway_host(host));
    }

    fn remove(&mut self, host: &GatewayHost) {
        let c = RouteCounts::of_gateway_host(host);
        self.routes -= c.routes;
        self.keys -= c.keys;
    }
}

/// Translates the cluster state into a snapshot (unsealed; its `content_hash` set) and
/// the problems found, from scratch.
pub fn translate(state: &ClusterState, opts: &Options) -> Translation {
    Translator::default().translate(state, opts)
}

/// The namespaces naming each host in our Ingresses, as a rule's host or a `spec.tls`
/// host, each once and oldest Ingress first (then namespace/name): what the host claims
/// ledger records, in the order it records new claims ([`crate::claims`]). Invalid hosts
/// and rules without a host name nothing.
pub fn named_hosts(state: &ClusterState, opts: &Options) -> claims::Named {
    let (classes, default_is_ours) = our_classes(&state.ingress_classes, opts);
    let mut digests: Vec<IngressDigest> = state
        .ingresses
        .iter()
        .map(|ing| digest_ingress_within(ing, opts.ingress_reading))
        .filter(|d| class_is_ours(d.class.as_deref(), &classes, default_is_ours))
        .collect();
    digests.sort_unstable_by(by_age);
    let mut named = claims::Named::new();
    for d in &digests {
        let hosts = d.routes.iter().map(|r| &r.host);
        for host in hosts.chain(d.tls.iter().map(|(h, _)| h)) {
            if host.is_empty() {
                continue;
            }
            let namers = named.entry(host.clone()).or_default();
            if !namers.contains(&d.source.namespace) {
                namers.push(d.source.namespace.clone());
            }
        }
    }
    named
}

/// What phase 1 found changed: the Services (`namespace/name`) whose Service or
/// EndpointSlices changed, and the hosts whose contributing Ingresses did.
struct ObjectChanges {
    services: FastSet<String>,
    hosts: Vec<String>,
    /// The proxies' own addresses changed: every backend is resolved again.
    proxies: bool,
    /// A Service or a TLS Secret was added, changed or removed (what Gateway routes
    /// depend on besides the Gateway API kinds).
    services_or_secrets: bool,
}

impl Translator {
    /// Translates the cluster state into a snapshot (unsealed; its `content_hash` set) and
    /// the problems found.
    pub fn translate(&mut self, state: &ClusterState, opts: &Options) -> Translation {
        let changes = self.apply_object_changes(state, opts);
        let mut new_backends = self.rebuild_hosts(changes.hosts, opts);
        self.rebuild_gateways(state, opts, changes.services_or_secrets, &mut new_backends);
        let mut problems: BTreeSet<Problem> = BTreeSet::new();
        let winner = self.choose_default_backend(opts, &mut problems, &mut new_backends);
        let resolved =
            self.resolve_dirty_backends(new_backends, &changes.services, changes.proxies, opts);
        self.emit(winner.as_deref(), &resolved, opts, problems)
    }

    /// Phase 1, apply object changes: refreshes the digests of the objects changed since
    /// the last build, keeps the Service, EndpointSlice, Secret and host indexes current,
    /// and returns which Services and hosts the changes touch. A change of which classes
    /// are ours starts over (every host is touched).
    fn apply_object_changes(&mut self, state: &ClusterState, opts: &Options) -> ObjectChanges {
        self.generation += 1;
        let generation = self.generation;
        let ingresses = self.ingresses.refresh(&state.ingresses, generation, |ing| {
            digest_ingress_within(ing, opts.ingress_reading)
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
        let services_or_secrets = !(services.added.is_empty()
            && services.removed.is_empty()
            && secrets.added.is_empty()
            && secrets.removed.is_empty());
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
        // A changed Secret resolves again the backends verified with its ca.crt.
        for d in secrets.removed.iter().chain(&secrets.added) {
            if let Some(key) = &d.key {
                dirty_services.insert(rules::secret_dependency(key));
            }
        }
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
        dirty_hosts.extend(self.apply_claims(state));
        let proxies = match &opts.proxy_service {
            Some(key) if dirty_services.contains(key) || self.generation == 1 => {
                let addresses: FastSet<String> = self
                    .slices_by_key
                    .get(key)
                    .into_iter()
                    .flatten()
                    .flat_map(|d| {
                        d.endpoints
                            .iter()
                            .map(|(a, _)| d.text[a.clone()].to_owned())
                    })
                    .collect();
                let changed = addresses != self.proxy_addresses;
                self.proxy_addresses = addresses;
                changed
            }
            _ => false,
        };
        ObjectChanges {
            services: dirty_services,
            hosts: dirty_hosts,
            proxies,
            services_or_secrets,
        }
    }

    /// Reads the host claims ConfigMap if it changed; returns the hosts whose claims
    /// changed.
    fn apply_claims(&mut self, state: &ClusterState) -> Vec<String> {
        let source = state.host_claims.first();
        let same = match (source, &self.claims_source) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if same {
            return Vec::new();
        }
        self.claims_source = source.cloned();
        // A key that does not decode counts as no claim; the leader writes it again.
        let (ledger, _invalid) = claims::parse(source.map(|c| &**c));
        let old = std::mem::replace(&mut self.ledger, ledger);
        let new = &self.ledger;
        old.keys()
            .chain(new.keys())
            .filter(|h| old.get(*h) != new.get(*h))
            .cloned()
            .collect()
    }

    /// Phase 2, rebuild hosts: builds again the virtual hosts the changes touch (in
    /// parallel), releasing their old backends and acquiring their new ones; returns the
    /// backends no host used before.
    fn rebuild_hosts(
        &mut self,
        mut dirty_hosts: Vec<String>,
        opts: &Options,
    ) -> Vec<Arc<BackendRef>> {
        dirty_hosts.sort_unstable();
        dirty_hosts.dedup();
        self.unsummed_hosts.extend(dirty_hosts.iter().cloned());
        for host in &dirty_hosts {
            if let Some(old) = self.hosts.remove(host) {
                self.routes.remove(&old.wire);
                for b in &old.backends {
                    self.backends.release(b);
                }
            }
            self.hosts_with_problems.remove(host);
            if self.contributors.get(host).is_some_and(Vec::is_empty) {
                self.contributors.remove(host);
            }
        }
        let (contributors, ledger) = (&self.contributors, &self.ledger);
        let built = parallel_map(&dirty_hosts, |host| {
            let claims = ledger.get(host).map_or(&[][..], Vec::as_slice);
            contributors
                .get(host)
                .map(|list| build_host(host, list, opts, claims))
        });
        let mut acquired: Vec<Arc<BackendRef>> = Vec::new();
        let mut new_hosts: Vec<(String, HostEntry)> = Vec::with_capacity(dirty_hosts.len());
        for (host, entry) in dirty_hosts.into_iter().zip(built) {
            let Some(entry) = entry else { continue };
            acquired.extend(entry.backends.iter().cloned());
            if !entry.problems.is_empty() {
                self.hosts_with_problems.insert(host.clone());
            }
            self.routes.add_host(&entry.wire);
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
        new_backends
    }

    /// Phase 3, choose the default backend: the oldest allowed Ingress's wins, the others
    /// get a [`Problem`]; returns the winning Ingress.
    fn choose_default_backend(
        &mut self,
        opts: &Options,
        problems: &mut BTreeSet<Problem>,
        new_backends: &mut Vec<Arc<BackendRef>>,
    ) -> Option<Arc<IngressDigest>> {
        let mut defaults: Vec<&Arc<IngressDigest>> = self.with_default.values().collect();
        defaults.sort_unstable_by(|a, b| by_age(a, b));
        if let Some(allowed) = &opts.default_backend_namespaces {
            defaults.retain(|d| {
                let ok = allowed.contains(&d.source.namespace);
                if !ok {
                    problems.insert(Problem {
                        namespace: d.source.namespace.clone(),
                        name: d.source.name.clone(),
                        reason: ProblemReason::DefaultBackendNotAllowed,
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
                reason: ProblemReason::ConflictingDefaultBackend,
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
                self.backends.acquire(b, new_backends);
            }
            if let Some(b) = self.default_user.take() {
                self.backends.release(&b);
            }
            self.default_user = default_user;
        }
        winner
    }

    /// Phase 4, resolve dirty backends: resolves the new backends, and again those whose
    /// Service or EndpointSlices changed (in parallel), into their entries; returns them,
    /// sorted by name.
    fn resolve_dirty_backends(
        &mut self,
        new_backends: Vec<Arc<BackendRef>>,
        dirty_services: &FastSet<String>,
        all: bool,
        opts: &Options,
    ) -> Vec<Arc<BackendRef>> {
        let mut to_resolve: Vec<Arc<BackendRef>> = new_backends
            .into_iter()
            .filter(|b| self.backends.entries.contains_key(&b.name))
            .collect();
        if all {
            to_resolve.extend(self.backends.by_service.values().flatten().cloned());
        } else {
            for key in dirty_services {
                if let Some(list) = self.backends.by_service.get(key) {
                    to_resolve.extend(list.iter().cloned());
                }
            }
        }
        to_resolve.sort_unstable_by(|a, b| by_name(a, b));
        to_resolve.dedup_by(|a, b| a.name == b.name);
        let (by_key, slices_by_key) = (&self.services_by_key, &self.slices_by_key);
        let secrets = &self.secrets_by_key;
        let proxies = &self.proxy_addresses;
        let resolved = parallel_map(&to_resolve, |key| {
            let slices = slices_by_key
                .get(key.service_key())
                .map_or(&[][..], Vec::as_slice);
            resolve_backend(
                key,
                by_key.get(key.service_key()).map(|s| &**s),
                slices,
                secrets,
                opts.allow_external_name,
                proxies,
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
                    entry.refused_external = refused.external;
                    entry.refused_addresses = refused.addresses;
                }
            }
        } else {
            for (key, (backend, refused)) in to_resolve.iter().zip(resolved) {
                if let Some(entry) = self.backends.entries.get_mut(&key.name) {
                    entry.backend = Arc::new(backend);
                    entry.refused_external = refused.external;
                    entry.refused_addresses = refused.addresses;
                }
            }
        }

        to_resolve
    }

    /// Phase 5, emit: assigns certificates, brings the content sum up to date with what
    /// changed, and returns the whole snapshot (pointers to the shared resources, in order)
    /// with every problem found.
    fn emit(
        &mut self,
        winner: Option<&IngressDigest>,
        resolved: &[Arc<BackendRef>],
        opts: &Options,
        mut problems: BTreeSet<Problem>,
    ) -> Translation {
        let default_backend = winner.and_then(|w| {
            w.default_backend.as_ref().map(|b| DefaultBackend {
                backend: b.name.clone(),
                source: Some(w.source.clone()),
            })
        });
        let mut tls = self.assign_certificates(opts, &mut problems);
        self.gateway_certificates(&mut tls);
        self.backends
            .unsummed
            .extend(resolved.iter().map(|b| b.name.clone()));
        let previous_hash = self.built.then(|| self.sum.sum.content_hash());
        let (content_hash, changed) = self.update_sum(default_backend.as_ref(), &tls);
        let since = previous_hash.map(|content_hash| Since {
            content_hash,
            changed,
        });
        self.built = true;

        // Pointers to the shared resources, in order. Ingress hosts travel in the one
        // route model: as Gateway hosts (of listener `ingress`), among the Gateway API's,
        // by name.
        let gateway_hosts = merge_by_name(
            self.hosts.values().map(|e| e.wire.clone()),
            self.gateway.hosts.values().map(|e| e.host.clone()),
        );
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
        self.refused_backend_problems(&mut problems);
        for d in self.with_problems.values() {
            problems.extend(d.problems.iter().map(|(reason, message)| Problem {
                namespace: d.source.namespace.clone(),
                name: d.source.name.clone(),
                reason: *reason,
                message: message.clone(),
            }));
        }
        Translation {
            content: Content {
                content_hash,
                virtual_hosts: Vec::new(),
                backends: backends_out,
                default_backend,
                certificates: tls.certificates,
                default_certificate: tls.default_certificate,
                gateway_listeners: self.gateway.listeners.values().cloned().collect(),
                gateway_hosts,
                resources_len: self.sum.resources_len,
                routes: self.routes.plus(self.gateway.routes),
            },
            since,
            problems: problems.into_iter().collect(),
            certificate_users: tls.users,
        }
    }
}

/// Two lists of Gateway hosts, each sorted by name, as one sorted list: O(n), pointers
/// only.
fn merge_by_name(
    a: impl Iterator<Item = Arc<GatewayHost>>,
    b: impl Iterator<Item = Arc<GatewayHost>>,
) -> Vec<Arc<GatewayHost>> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    let mut out = Vec::with_capacity(a.size_hint().0 + b.size_hint().0);
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.name <= y.name => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(h) => out.push(h),
            None => return out,
        }
    }
}

#[cfg(test)]
mod tests;
