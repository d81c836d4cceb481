//! Per-object digests: what translation needs of each Ingress, Service, EndpointSlice and
//! Secret, made once per object version (rules checked, paths normalised, problems noted),
//! so that a build reads digests, never the objects again.

use std::sync::Arc;

use holdfast_proto::certificate;
use holdfast_proto::snapshot::is_valid_host;
use holdfast_proto::v1::{Certificate, IngressRef, MatchKind};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    BackendRef, ProblemReason, SERVICE_NAME_LABEL, SSL_REDIRECT_ANNOTATION, Speaks,
    TLS_SECRET_TYPE, backend_ref, class_of, escape_never_matched, ingress_ref, match_kind,
    normalise_path, sort_prefix, unnormalised, wildcard_over_public_suffix,
};

/// One path of an Ingress rule, checked and normalised.
#[derive(Debug, Clone)]
pub(super) struct RouteDigest {
    /// [`sort_prefix`] of `path`.
    pub(super) path_key: u128,
    pub(super) host: String,
    pub(super) kind: MatchKind,
    pub(super) path: String,
    /// The path as written ("/" when empty): what a host's `use-regex` reads as a regular
    /// expression.
    pub(super) written: String,
    pub(super) backend: Arc<BackendRef>,
}

/// What translation needs from one Ingress, computed once per version of the object
/// (see [`Translator`]): its identity and age, its class, its valid routes and default
/// backend, and the problems found in the object on its own. Cross-object rules (class
/// selection, merging, conflicts, backend resolution) apply when a snapshot is built.
#[derive(Debug)]
pub struct IngressDigest {
    /// Creation time, then [`sort_prefix`] of namespace and name.
    pub(super) age_key: (Option<k8s_openapi::jiff::Timestamp>, u128, u128),
    pub(super) source: IngressRef,
    pub(super) class: Option<String>,
    pub(super) default_backend: Option<Arc<BackendRef>>,
    pub(super) routes: Vec<RouteDigest>,
    /// (host, `namespace/secret`) of each valid `spec.tls` host.
    pub(super) tls: Vec<(String, String)>,
    /// False when the Ingress turns the HTTP→HTTPS redirect off.
    pub(super) ssl_redirect: bool,
    /// What its ingress-nginx annotations ask of its paths (None: nothing).
    pub(super) nginx: Option<Box<super::nginx::NginxFilters>>,
    /// Set for a canary Ingress (ingress-nginx `canary: "true"`): its paths join the main
    /// Ingress's instead of routing on their own.
    pub(super) canary: Option<Box<super::nginx::Canary>>,
    /// Its paths are regular expressions (ingress-nginx `use-regex` or `rewrite-target`),
    /// and so are those of every Ingress on its hosts, as in ingress-nginx.
    pub(super) regex: bool,
    pub(super) problems: Vec<(ProblemReason, String)>,
}

/// Digests one Ingress's `spec.tls` and redirect annotation into `digest`.
pub(super) fn digest_tls(ing: &Ingress, ns: &str, digest: &mut IngressDigest) {
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
                ProblemReason::InvalidAnnotation,
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
                ProblemReason::InvalidTls,
                format!("spec.tls entry for hosts {hosts:?} names no secretName; those hosts get no certificate"),
            ));
            continue;
        };
        if hosts.is_empty() {
            digest.problems.push((
                ProblemReason::InvalidTls,
                format!("spec.tls entry for Secret {secret:?} lists no hosts; it is not used"),
            ));
        }
        for host in hosts {
            let host = host.to_ascii_lowercase();
            if host.is_empty() || !is_valid_host(&host) {
                digest.problems.push((
                    ProblemReason::InvalidTls,
                    format!("spec.tls host {host:?} skipped: not a valid host name or one-label wildcard"),
                ));
                continue;
            }
            if let Some(suffix) = wildcard_over_public_suffix(&host) {
                digest.problems.push((
                    ProblemReason::PublicSuffixWildcard,
                    format!("spec.tls host {host:?} skipped: it covers every name under the public suffix {suffix:?}"),
                ));
                continue;
            }
            digest.tls.push((host, format!("{ns}/{secret}")));
        }
    }
}

/// Digests one Ingress.
pub fn digest_ingress(ing: &Ingress) -> IngressDigest {
    digest_ingress_within(ing, IngressReading::default())
}

/// How one Ingress is read: how large it may be (one tenant's huge Ingress must not grow
/// every proxy's table and snapshot without bound), and whether its ingress-nginx
/// annotations are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngressReading {
    /// Most rules (`--max-rules-per-ingress`).
    pub max_rules: usize,
    /// Most paths over all rules (`--max-paths-per-ingress`).
    pub max_paths: usize,
    /// Serve `nginx.ingress.kubernetes.io/` annotations (`--ingress-nginx-annotations`).
    pub nginx_annotations: bool,
}

impl Default for IngressReading {
    fn default() -> Self {
        IngressReading {
            max_rules: 1_000,
            max_paths: 5_000,
            nginx_annotations: true,
        }
    }
}

/// Digests one Ingress; one over `limits` is skipped whole, with a problem.
pub fn digest_ingress_within(ing: &Ingress, limits: IngressReading) -> IngressDigest {
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
        let mut digest = digest_ingress_unchecked(&trimmed, false, &Speaks::default());
        digest.problems.push((
            ProblemReason::IngressTooLarge,
            format!(
                "Ingress skipped: {rules} rules and {paths} paths, over the limits of {} rules (--max-rules-per-ingress) and {} paths (--max-paths-per-ingress)",
                limits.max_rules, limits.max_paths
            ),
        ));
        return digest;
    }
    let mut read = ing
        .metadata
        .annotations
        .as_ref()
        .map(|a| super::nginx::read(a, limits.nginx_annotations));
    if let Some(r) = read.as_mut() {
        own_proxy_ssl_secret(r, ing.metadata.namespace.as_deref().unwrap_or(""));
    }
    let (regex, speaks) = read
        .as_ref()
        .map_or((false, Speaks::default()), |r| (r.regex, r.speaks.clone()));
    let mut digest = digest_ingress_unchecked(ing, regex, &speaks);
    if let Some(why) = read
        .as_ref()
        .and_then(|r| r.filters.refused_protocol.as_ref())
        && digest.default_backend.take().is_some()
    {
        // Its paths answer 500; the default backend, which no path's filters reach, is
        // not published rather than spoken to otherwise than the Ingress asks.
        digest.problems.push((
            ProblemReason::InvalidAnnotation,
            format!("spec.defaultBackend not served: {why}"),
        ));
    }
    if let Some(read) = read {
        if read.ssl_redirect == Some(false) {
            digest.ssl_redirect = false;
        }
        digest.problems.extend(read.problems);
        if !read.filters.is_empty() {
            digest.nginx = Some(Box::new(read.filters));
        }
        digest.canary = read.canary.map(Box::new);
    }
    digest
}

/// Qualifies `proxy-ssl-secret` with the Ingress's namespace `ns`; a Secret of another
/// namespace, or a name that cannot be a Secret's, is refused (the paths answer 500: the
/// certificate was meant to be checked), as a TLS Secret of `spec.tls` is only ever the
/// Ingress's own.
fn own_proxy_ssl_secret(read: &mut super::nginx::Read, ns: &str) {
    let Some(secret) = read.speaks.tls.as_mut().and_then(|t| t.verify.as_mut()) else {
        return;
    };
    let (namespace, name) = secret.split_once('/').unwrap_or((ns, secret.as_str()));
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if namespace == ns && label(name) {
        *secret = format!("{ns}/{name}");
        return;
    }
    let why = if namespace == ns {
        format!("{secret:?} is not a Secret's name")
    } else {
        format!(
            "Secret {secret:?} is in another namespace than the Ingress's ({ns:?}), which an Ingress may not read"
        )
    };
    read.problems.push((
        ProblemReason::InvalidAnnotation,
        format!(
            "nginx.ingress.kubernetes.io/proxy-ssl-secret: {why}: the Ingress's paths answer 500 rather than send to a backend whose certificate was meant to be checked"
        ),
    ));
    read.speaks = Speaks::default();
    read.filters.refused_protocol = Some("proxy-ssl-secret is not served".into());
}

/// Digests one Ingress; with `regex` (ingress-nginx `use-regex`), its paths, of any type,
/// are regular expressions (as ingress-nginx writes them all `location ~* ^<path>`); its
/// backends are spoken to as `speaks` says (ingress-nginx `backend-protocol`).
pub(super) fn digest_ingress_unchecked(
    ing: &Ingress,
    regex: bool,
    speaks: &Speaks,
) -> IngressDigest {
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
        nginx: None,
        canary: None,
        regex,
        problems: Vec::new(),
    };
    let ns = ing.metadata.namespace.as_deref().unwrap_or("");
    digest_tls(ing, ns, &mut digest);
    let Some(spec) = &ing.spec else {
        return digest;
    };
    if let Some(db) = &spec.default_backend {
        match backend_ref(ns, db, speaks) {
            Ok(b) => digest.default_backend = Some(Arc::new(b)),
            Err(e) => digest.problems.push((
                ProblemReason::InvalidDefaultBackend,
                format!("defaultBackend skipped: {e}"),
            )),
        }
    }
    for rule in spec.rules.iter().flatten() {
        let host = rule.host.as_deref().unwrap_or("").to_ascii_lowercase();
        if !is_valid_host(&host) {
            digest.problems.push((
                ProblemReason::InvalidHost,
                format!(
                    "rule for host {host:?} skipped: not a valid host name or one-label wildcard"
                ),
            ));
            continue;
        }
        if let Some(suffix) = wildcard_over_public_suffix(&host) {
            digest.problems.push((
                ProblemReason::PublicSuffixWildcard,
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
                        ProblemReason::InvalidPath,
                        format!(
                            "path {:?} on host {host:?} skipped: {e}",
                            p.path.as_deref().unwrap_or("")
                        ),
                    ));
                    continue;
                }
            };
            let written = p
                .path
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("/")
                .to_owned();
            let (kind, path) = if regex {
                // As written: a regular expression, matched from the path's start.
                let path = p.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
                if let Err(why) = holdfast_proto::snapshot::ingress_path_regex(path) {
                    digest.problems.push((
                        ProblemReason::InvalidPath,
                        format!("path {path:?} on host {host:?} skipped (use-regex): it {why}"),
                    ));
                    continue;
                }
                (MatchKind::Regex, path.to_owned())
            } else {
                if p.path_type == "ImplementationSpecific"
                    && let Some(why) = p.path.as_deref().and_then(unnormalised)
                {
                    digest.problems.push((
                        ProblemReason::InvalidPath,
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
                        ProblemReason::InvalidPath,
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
                        digest.problems.push((
                            ProblemReason::InvalidPath,
                            format!("path on host {host:?} skipped: {e}"),
                        ));
                        continue;
                    }
                };
                (kind, path)
            };
            match backend_ref(ns, &p.backend, speaks) {
                Ok(backend) => digest.routes.push(RouteDigest {
                    path_key: sort_prefix(&path),
                    host: host.clone(),
                    kind,
                    path,
                    written,
                    backend: Arc::new(backend),
                }),
                Err(e) => digest.problems.push((
                    ProblemReason::InvalidBackend,
                    format!("path {path:?} on host {host:?} skipped: {e}"),
                )),
            }
        }
    }
    digest
}

/// The `appProtocol` of a Service port whose backends speak HTTP/2 over cleartext
/// ([KEP-3726](https://github.com/kubernetes/enhancements/tree/master/keps/sig-network/3726-standard-application-protocols)).
pub const H2C_APP_PROTOCOL: &str = "kubernetes.io/h2c";

/// A Service port: its number, its name ("" if unnamed) and its numeric target port
/// (None for a named targetPort, resolved per EndpointSlice).
#[derive(Debug)]
pub(super) struct ServicePortDigest {
    pub(super) port: i32,
    pub(super) name: String,
    pub(super) numeric_target: Option<i32>,
    /// Its `appProtocol` says HTTP/2 over cleartext (`kubernetes.io/h2c`).
    pub(super) h2c: bool,
}

/// What translation needs from one Service.
#[derive(Debug)]
pub struct ServiceDigest {
    /// `namespace/name`.
    pub(super) key: Option<String>,
    /// `Some` for an ExternalName Service: its DNS name, lower-cased ("" if unset).
    pub(super) external_name: Option<String>,
    pub(super) ports: Vec<ServicePortDigest>,
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
            h2c: p.app_protocol.as_deref() == Some(H2C_APP_PROTOCOL),
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
    pub(super) key: Option<String>,
    pub(super) ports: Vec<(String, Option<i32>)>,
    /// Each endpoint's address and zone, as ranges of `text` (one allocation per slice,
    /// not two per endpoint: resolving reads them all, and they stay on few cache lines).
    pub(super) endpoints: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
    pub(super) text: String,
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
    pub(super) key: Option<String>,
    /// The certificate resource (named `namespace/name`), or why there is none. The
    /// reason never contains key bytes.
    pub(super) certificate: Result<Certificate, InvalidSecret>,
    /// `ca.crt`, when the Secret has one that is text: the CAs a backend's certificate is
    /// checked against (ingress-nginx `proxy-ssl-secret`).
    pub(super) ca: Option<String>,
}

/// Why a TLS Secret gives no certificate (the message of its [`Problem`]; it never holds
/// key bytes).
#[derive(Debug, Clone, thiserror::Error)]
pub enum InvalidSecret {
    /// Not a `kubernetes.io/tls` Secret.
    #[error("is not of type {TLS_SECRET_TYPE}")]
    NotTls,
    /// `tls.crt` or `tls.key` is missing.
    #[error("lacks tls.crt or tls.key")]
    Incomplete,
    /// The certificate or key does not parse, or they do not match.
    #[error(transparent)]
    Certificate(certificate::CertificateError),
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
            return Err(InvalidSecret::NotTls);
        }
        let data = secret.data.as_ref();
        let field = |name: &str| data.and_then(|d| d.get(name)).map(|b| b.0.as_slice());
        let (Some(chain), Some(private_key)) = (field("tls.crt"), field("tls.key")) else {
            return Err(InvalidSecret::Incomplete);
        };
        let parsed = certificate::parse(chain, private_key).map_err(InvalidSecret::Certificate)?;
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
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .and_then(|b| String::from_utf8(b.0.clone()).ok());
    SecretDigest {
        key,
        certificate,
        ca,
    }
}
