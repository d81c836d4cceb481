//! The route table: a snapshot compiled into an immutable lookup structure.
//!
//! Lookup is two hash steps and a walk over the request path's `/` boundaries; it never
//! scans the routes:
//! 1. **Host** (lower-cased, port dropped): the exact virtual host if there is one; else
//!    the one-label wildcard (`a.example.com` → `*.example.com`; not `a.b.example.com`,
//!    not `example.com`); else the virtual host of rules without a host. The first that
//!    exists is used; if none of its paths match, the `defaultBackend`; else 404.
//! 2. **Path** within the virtual host: an Exact route whose path equals the request path
//!    (case-sensitive); else the longest Prefix route: candidates are the request path and
//!    each of its prefixes ending before a `/` (`/a/b/c` → `/a/b/c`, `/a/b`, `/a`, `/`),
//!    longest first, each one hash look-up. So `/foo` matches `/foo`, `/foo/`, `/foo/bar`,
//!    not `/foobar`.
//!
//! TLS: each certificate of the snapshot is parsed once here, into what rustls serves.
//! [`RouteTable::certificate_for`] picks one by SNI: the exact virtual host's, else the
//! one-label wildcard's (if its certificate covers the name), else the default
//! certificate, else none (the handshake fails).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use holdfast_proto::certificate::{self, Facts};
use holdfast_proto::v1::{MatchKind, Snapshot};
use http::uri::Authority;
use rustls::sign::CertifiedKey;

use crate::metrics::RouteCounters;

/// A backend ready to forward to.
#[derive(Debug)]
pub struct Backend {
    /// `namespace/service:port`.
    pub name: String,
    /// Ready endpoints.
    pub endpoints: Vec<SocketAddr>,
    /// The endpoints as URI authorities (same order), built once here, not per request.
    pub authorities: Vec<Authority>,
    /// Zones of the endpoints (same order), informational.
    pub zones: Vec<String>,
    /// ExternalName target (`host:port`), when the Service is an ExternalName.
    pub external: Option<(String, u16)>,
    /// The ExternalName target as a URI authority.
    pub external_authority: Option<Authority>,
    /// Why the backend cannot serve (503 body), when it cannot.
    pub unavailable_reason: Option<String>,
    /// Round-robin position.
    next: AtomicUsize,
}

impl Backend {
    /// The next endpoint index in round-robin order.
    pub fn next_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// A matched route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Virtual host it belongs to ("" for rules without a host, "*" for the default
    /// backend).
    pub host: String,
    /// Exact or Prefix.
    pub kind: MatchKind,
    /// Its path ("" for the default backend).
    pub path: String,
    /// Index into [`RouteTable::backends`].
    pub backend: usize,
    /// `namespace/name` of the Ingress it came from.
    pub source: String,
    /// Metric label: `<host><path>`.
    pub label: String,
    /// Its request counters.
    pub counters: RouteCounters,
}

/// A certificate ready to serve, and what an operator may see of it.
#[derive(Debug)]
pub struct TlsCertificate {
    /// `namespace/secret`.
    pub name: String,
    /// What rustls hands out.
    pub key: Arc<CertifiedKey>,
    /// Fingerprint, subject, DNS names, notAfter, serial (never the key).
    pub facts: Facts,
}

#[derive(Debug, Default)]
struct PathTable {
    exact: HashMap<String, usize>,
    prefix: HashMap<String, usize>,
    /// Index into [`RouteTable::certificates`] of the host's certificate.
    certificate: Option<usize>,
    /// Plain-HTTP requests get 308 to https.
    ssl_redirect: bool,
}

impl PathTable {
    fn lookup(&self, path: &str) -> Option<usize> {
        if let Some(r) = self.exact.get(path) {
            return Some(*r);
        }
        if self.prefix.is_empty() {
            return None;
        }
        // The whole path (a trailing '/' is not significant), then each '/' boundary from
        // the longest prefix down to "/".
        let trimmed = path.trim_end_matches('/');
        if !trimmed.is_empty()
            && let Some(r) = self.prefix.get(trimmed)
        {
            return Some(*r);
        }
        let bytes = trimmed.as_bytes();
        for i in (1..bytes.len()).rev() {
            if bytes[i] == b'/'
                && let Some(r) = self.prefix.get(&trimmed[..i])
            {
                return Some(*r);
            }
        }
        self.prefix.get("/").copied()
    }
}

/// A compiled snapshot.
#[derive(Debug)]
pub struct RouteTable {
    /// Version of the snapshot it was compiled from.
    pub version: String,
    /// Content hash of that snapshot.
    pub content_hash: String,
    /// Cluster revision of that snapshot.
    pub cluster_revision: u64,
    /// All routes (the default backend last, if any).
    pub routes: Vec<Route>,
    /// All backends.
    pub backends: Vec<Backend>,
    /// All certificates, in snapshot order.
    pub certificates: Vec<TlsCertificate>,
    default_certificate: Option<usize>,
    exact_hosts: HashMap<String, PathTable>,
    wildcard_hosts: HashMap<String, PathTable>,
    no_host: Option<PathTable>,
    default_route: Option<usize>,
}

/// Why a request matched nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// A virtual host was found but none of its paths match, and there is no default.
    NoPath {
        /// The virtual host that was searched.
        vhost: String,
    },
    /// No virtual host matches and there is no default.
    NoHost,
}

/// Why a snapshot could not be compiled (after validation this means a bug, or a
/// certificate the control plane should have refused).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompileError {
    /// A certificate cannot be served (the reason never holds key bytes).
    #[error("certificate {name}: {source}")]
    Certificate {
        /// Its name.
        name: String,
        /// Why.
        #[source]
        source: certificate::CertificateError,
    },
    /// A virtual host names a certificate that is not in the snapshot.
    #[error("virtual host {host:?} names unknown certificate {name:?}")]
    UnknownCertificate {
        /// The host.
        host: String,
        /// The certificate's name.
        name: String,
    },
    /// A route names a backend that is not in the snapshot.
    #[error("route names unknown backend {0:?}")]
    UnknownBackend(String),
    /// An endpoint's address or port is not usable.
    #[error("backend {backend}: endpoint {address}:{port} is not an IP address and port")]
    BadEndpoint {
        /// Backend name.
        backend: String,
        /// Address as sent.
        address: String,
        /// Port as sent.
        port: u32,
    },
}

/// Lower-cases a Host header value and drops its port.
pub fn normalise_host(host: &str) -> String {
    let host = if let Some(rest) = host.strip_prefix('[') {
        // IPv6 literal: keep the brackets' content.
        rest.split(']').next().unwrap_or(rest)
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(h, _)| h)
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

impl RouteTable {
    /// Compiles a validated snapshot.
    pub fn compile(snapshot: &Snapshot) -> Result<Self, CompileError> {
        let mut backends = Vec::with_capacity(snapshot.backends.len());
        let mut index = HashMap::with_capacity(snapshot.backends.len());
        for b in &snapshot.backends {
            let mut endpoints = Vec::with_capacity(b.endpoints.len());
            let mut authorities = Vec::with_capacity(b.endpoints.len());
            let mut zones = Vec::with_capacity(b.endpoints.len());
            for e in b.endpoints.iter().filter(|e| e.ready) {
                let bad = || CompileError::BadEndpoint {
                    backend: b.name.clone(),
                    address: e.address.clone(),
                    port: e.port,
                };
                let ip: IpAddr = e.address.parse().map_err(|_| bad())?;
                let port = u16::try_from(e.port)
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(bad)?;
                let addr = SocketAddr::new(ip, port);
                authorities.push(Authority::try_from(addr.to_string()).map_err(|_| bad())?);
                endpoints.push(addr);
                zones.push(e.zone.clone());
            }
            let external = (!b.external_name.is_empty()).then(|| {
                (
                    b.external_name.clone(),
                    u16::try_from(b.external_port).unwrap_or(0),
                )
            });
            let external_authority = external
                .as_ref()
                .and_then(|(host, port)| Authority::try_from(format!("{host}:{port}")).ok());
            let unavailable_reason = if !b.unavailable_reason.is_empty() {
                Some(b.unavailable_reason.clone())
            } else if external.is_some() && external_authority.is_none() {
                let (host, port) = external.as_ref().expect("checked");
                Some(format!(
                    "ExternalName target {host}:{port} is not a valid host and port"
                ))
            } else if endpoints.is_empty() && external.is_none() {
                Some(format!("no ready endpoints for backend {}", b.name))
            } else {
                None
            };
            index.insert(b.name.as_str(), backends.len());
            backends.push(Backend {
                name: b.name.clone(),
                endpoints,
                authorities,
                zones,
                external,
                external_authority,
                unavailable_reason,
                next: AtomicUsize::new(0),
            });
        }
        let backend_of = |name: &str| {
            index
                .get(name)
                .copied()
                .ok_or_else(|| CompileError::UnknownBackend(name.to_owned()))
        };
        let mut certificates = Vec::with_capacity(snapshot.certificates.len());
        let mut cert_index = HashMap::with_capacity(snapshot.certificates.len());
        for c in &snapshot.certificates {
            let parsed =
                certificate::parse(&c.certificate_chain, &c.private_key).map_err(|source| {
                    CompileError::Certificate {
                        name: c.name.clone(),
                        source,
                    }
                })?;
            cert_index.insert(c.name.as_str(), certificates.len());
            certificates.push(TlsCertificate {
                name: c.name.clone(),
                key: parsed.key,
                facts: parsed.facts,
            });
        }
        let cert_of = |host: &str, name: &str| -> Result<Option<usize>, CompileError> {
            if name.is_empty() {
                return Ok(None);
            }
            cert_index.get(name).copied().map(Some).ok_or_else(|| {
                CompileError::UnknownCertificate {
                    host: host.to_owned(),
                    name: name.to_owned(),
                }
            })
        };
        let default_certificate = cert_of("", &snapshot.default_certificate)?;
        let mut routes = Vec::new();
        let mut exact_hosts = HashMap::new();
        let mut wildcard_hosts = HashMap::new();
        let mut no_host = None;
        for vhost in &snapshot.virtual_hosts {
            let mut table = PathTable {
                certificate: cert_of(&vhost.host, &vhost.certificate)?,
                ..PathTable::default()
            };
            table.ssl_redirect = vhost.ssl_redirect && table.certificate.is_some();
            for r in &vhost.routes {
                let kind = MatchKind::try_from(r.match_kind).unwrap_or(MatchKind::Prefix);
                let id = routes.len();
                let source = r
                    .source
                    .as_ref()
                    .map(|s| format!("{}/{}", s.namespace, s.name))
                    .unwrap_or_default();
                routes.push(Route {
                    host: vhost.host.clone(),
                    kind,
                    path: r.path.clone(),
                    backend: backend_of(&r.backend)?,
                    source,
                    label: format!("{}{}", vhost.host, r.path),
                    counters: RouteCounters::default(),
                });
                let map = match kind {
                    MatchKind::Exact => &mut table.exact,
                    _ => &mut table.prefix,
                };
                map.entry(r.path.clone()).or_insert(id);
            }
            if vhost.host.is_empty() {
                no_host = Some(table);
            } else if let Some(suffix) = vhost.host.strip_prefix("*.") {
                wildcard_hosts.insert(suffix.to_owned(), table);
            } else {
                exact_hosts.insert(vhost.host.clone(), table);
            }
        }
        let default_route = match &snapshot.default_backend {
            Some(d) => {
                routes.push(Route {
                    host: "*".into(),
                    kind: MatchKind::Prefix,
                    path: String::new(),
                    backend: backend_of(&d.backend)?,
                    source: d
                        .source
                        .as_ref()
                        .map(|s| format!("{}/{}", s.namespace, s.name))
                        .unwrap_or_default(),
                    label: "(default backend)".into(),
                    counters: RouteCounters::default(),
                });
                Some(routes.len() - 1)
            }
            None => None,
        };
        Ok(RouteTable {
            version: snapshot.version.clone(),
            content_hash: snapshot.content_hash.clone(),
            cluster_revision: snapshot.cluster_revision,
            routes,
            backends,
            certificates,
            default_certificate,
            exact_hosts,
            wildcard_hosts,
            no_host,
            default_route,
        })
    }

    /// The virtual host a (normalised) host selects, and its name.
    fn vhost(&self, host: &str) -> Option<(&PathTable, String)> {
        if let Some(t) = self.exact_hosts.get(host) {
            return Some((t, host.to_owned()));
        }
        if let Some((first, rest)) = host.split_once('.')
            && !first.is_empty()
            && !rest.is_empty()
            && let Some(t) = self.wildcard_hosts.get(rest)
        {
            return Some((t, format!("*.{rest}")));
        }
        self.no_host.as_ref().map(|t| (t, String::new()))
    }

    /// The route for a request to `host` (normalised: lower case, no port) and `path`.
    pub fn lookup(&self, host: &str, path: &str) -> Result<&Route, Miss> {
        let found = self.vhost(host);
        if let Some((table, _)) = &found
            && let Some(r) = table.lookup(path)
        {
            return Ok(&self.routes[r]);
        }
        if let Some(d) = self.default_route {
            return Ok(&self.routes[d]);
        }
        Err(match found {
            Some((_, vhost)) => Miss::NoPath { vhost },
            None => Miss::NoHost,
        })
    }

    /// The certificate to offer a TLS client that sent `sni` (lower case; None when it
    /// sent no SNI): the exact virtual host's, else the wildcard virtual host's if it
    /// covers the name, else the default certificate. None fails the handshake.
    pub fn certificate_for(&self, sni: Option<&str>) -> Option<&TlsCertificate> {
        let by_host = sni.and_then(|name| {
            let exact = self.exact_hosts.get(name).and_then(|t| t.certificate);
            exact.or_else(|| {
                let (_, rest) = name.split_once('.')?;
                let i = self.wildcard_hosts.get(rest)?.certificate?;
                certificate::covers(&self.certificates[i].facts.dns_names, name).then_some(i)
            })
        });
        by_host
            .or(self.default_certificate)
            .map(|i| &self.certificates[i])
    }

    /// Whether a plain-HTTP request for `host` (normalised) is redirected to https: its
    /// exact or wildcard virtual host has a certificate and redirects.
    pub fn redirects_to_https(&self, host: &str) -> bool {
        match self.vhost(host) {
            Some((t, name)) if !name.is_empty() => t.ssl_redirect,
            _ => false,
        }
    }

    /// Number of routes (the default backend counts as one).
    pub fn route_count(&self) -> usize {
        self.routes.len()
    }
}

#[cfg(test)]
mod tests;
