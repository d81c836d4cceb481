//! The route table: a snapshot compiled into an immutable lookup structure.
//!
//! Lookup is [`crate::matching::Hosts::lookup`], the one lookup Gateway listeners use too,
//! here with Ingress host selection: two hash steps and a walk over the request path's
//! `/` boundaries; it never scans the routes:
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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use holdfast_proto::certificate::{self, Facts};
use holdfast_proto::delta::{Held, SharedNames};
use holdfast_proto::snapshot;
use holdfast_proto::v1::{
    GatewayHost, MatchKind, ResourceKind, Snapshot, SnapshotDelta, VirtualHost,
};
use http::uri::Authority;
use rustls::sign::CertifiedKey;

use crate::matching::{Entry, HostEntry, HostMiss, Hosts, Level, PathRule, Paths, Selection};
use crate::metrics::{RouteCounters, SeriesKey};
use crate::shards::Shards;
use crate::upstream::{Key, Number, Secure};

/// A backend ready to forward to.
#[derive(Debug)]
pub struct Backend {
    /// `namespace/service:port` (the table's key shares it).
    pub name: Arc<str>,
    /// Ready endpoints.
    pub endpoints: Vec<SocketAddr>,
    /// How each endpoint (same order) is reached: as a URI authority, built once here,
    /// not per request, and by its number.
    pub dial: Vec<Dial>,
    /// The ExternalName target, when the Service is an ExternalName (boxed: most
    /// backends have none, and a table holds one `Backend` per Service port).
    pub external: Option<Box<External>>,
    /// Why the backend cannot serve (503 body), when it cannot.
    pub unavailable_reason: Option<String>,
    /// It speaks HTTP/2 over cleartext (its Service port's `appProtocol` is
    /// `kubernetes.io/h2c`): requests go on the shared connections of [`crate::h2c`].
    pub h2c: bool,
    /// It is reached over TLS (its endpoints' keys are [`Key::Secure`]).
    pub tls: bool,
    /// Round-robin position.
    next: AtomicUsize,
}

/// How an endpoint is reached.
#[derive(Debug)]
pub struct Dial {
    /// `ip:port` as a URI authority.
    pub authority: Authority,
    /// The endpoint's number ([`Number`]).
    pub number: Number,
    /// Where its connections go: the address, over TLS when the backend says so.
    pub key: Key,
}

impl Drop for Backend {
    /// Gives back its endpoints' numbers.
    fn drop(&mut self) {
        for dial in &self.dial {
            Number::release(&dial.key);
        }
        if let Some(key) = self.external.as_ref().and_then(|e| e.key.as_ref()) {
            Number::release(key);
        }
    }
}

impl Backend {
    /// The next endpoint index in round-robin order.
    pub fn next_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// An ExternalName Service's target.
#[derive(Debug)]
pub struct External {
    /// `host:port`.
    pub target: String,
    /// The target as a URI authority (none when it is not a valid host and port).
    pub authority: Option<Authority>,
    /// The target's number, when it has an authority ([`Number`]).
    pub number: Option<Number>,
    /// Where its connections go, when it has an authority: the name, over TLS when the
    /// backend says so.
    pub key: Option<Key>,
}

/// A matched route.
#[derive(Debug)]
pub struct Route {
    /// Virtual host it belongs to ("" for rules without a host, "*" for the default
    /// backend). One copy for all the host's routes, which an exact host's entry in the
    /// table and the snapshot held share too.
    pub host: Arc<str>,
    /// Exact or Prefix.
    pub kind: MatchKind,
    /// Its path ("" for the default backend).
    pub path: Arc<str>,
    /// The backend it forwards to.
    pub backend: Arc<Backend>,
    /// `namespace/name` of the Ingress it came from.
    pub source: String,
    /// Its metric label ([`Route::label`]).
    pub label: Label,
    /// Its request counters.
    pub counters: RouteCounters,
}

/// What a route's metric label is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// `<host><path>` (an Ingress route's): the route's own host and path, rendered
    /// into a label only when the metrics are scraped.
    HostPath,
    /// This one (shared by the routes that count into one series).
    Named(Arc<str>),
}

impl Route {
    /// What names the route's request series: its interned names, not a label made
    /// from them ([`SeriesKey`] renders it at scrape time).
    pub fn series_key(&self) -> SeriesKey {
        match &self.label {
            Label::HostPath => SeriesKey::HostPath(self.host.clone(), self.path.clone()),
            Label::Named(name) => SeriesKey::Named(name.clone()),
        }
    }

    /// How the access log names it, written into `out` (cleared first):
    /// `<namespace>/<ingress> <host><path>` for an Ingress route, its series label for a
    /// Gateway API route.
    pub fn log_name(&self, out: &mut String) {
        out.clear();
        match &self.label {
            Label::HostPath => {
                if !self.source.is_empty() {
                    out.push_str(&self.source);
                    out.push(' ');
                }
                out.push_str(&self.host);
                out.push_str(&self.path);
            }
            Label::Named(name) => out.push_str(name),
        }
    }

    /// Whether `other` has this route's label (without making either).
    pub fn same_label(&self, other: &Route) -> bool {
        match (&self.label, &other.label) {
            (Label::HostPath, Label::HostPath) => {
                self.host == other.host && self.path == other.path
            }
            (Label::Named(a), Label::Named(b)) => a == b,
            _ => self.series_key().label() == other.series_key().label(),
        }
    }
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

/// What an Ingress path does.
#[derive(Debug, Clone)]
pub enum IngressAction {
    /// Forward on its one route (a path without filters).
    Route(Arc<Route>),
    /// What a Gateway entry does (a path whose Ingress has ingress-nginx annotations:
    /// a redirect, a rewrite, header changes, CORS, timeouts).
    Matched(Arc<crate::gateway::Matched>),
}

/// Where the Ingress lookup sends a request.
#[derive(Debug, Clone, Copy)]
pub enum Found<'a> {
    /// Forward on this route (a path without filters, or the default backend).
    Route(&'a Route),
    /// A path with filters: the path rule it matched with, and what it does.
    Matched(&'a PathRule, &'a crate::gateway::Matched),
}

/// One virtual host, compiled: what a delta that changes the host (or its backend or
/// certificate) replaces, and what every other host's entry is shared with.
#[derive(Debug, Default)]
struct PathTable {
    /// Its routes, matched by the path lookup Gateway hostnames use too
    /// ([`crate::matching`]).
    paths: Paths<IngressAction>,
    /// The host's certificate.
    certificate: Option<Arc<TlsCertificate>>,
    /// Plain-HTTP requests get 308 to https.
    ssl_redirect: bool,
}

impl PathTable {
    /// Its routes in snapshot order (an entry with filters: one per target).
    fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.paths.entries().iter().flat_map(|e| {
            let (one, many) = match &e.action {
                IngressAction::Route(r) => (Some(r), None),
                IngressAction::Matched(m) => (None, Some(m.routes())),
            };
            one.into_iter().chain(many.into_iter().flatten())
        })
    }
}

impl HostEntry for PathTable {
    type Action = IngressAction;
    fn paths(&self) -> &Paths<IngressAction> {
        &self.paths
    }
}

/// A compiled snapshot.
#[derive(Debug, Clone)]
pub struct RouteTable {
    /// Version of the snapshot it was compiled from.
    pub version: String,
    /// Content hash of that snapshot.
    pub content_hash: String,
    /// Cluster revision of that snapshot.
    pub cluster_revision: u64,
    /// Its progress per kind (`Snapshot.progress`), for operators.
    pub progress: Vec<holdfast_proto::v1::KindProgress>,
    backends: Shards<Arc<Backend>>,
    certificates: Shards<Arc<TlsCertificate>>,
    default_certificate_name: String,
    default_certificate: Option<Arc<TlsCertificate>>,
    /// The Ingress virtual hosts, selected as the Ingress specification says.
    hosts: Hosts<Arc<PathTable>>,
    default_route: Option<Arc<Route>>,
    /// Routes of all hosts (the default backend not counted).
    host_routes: usize,
    /// The Gateway listeners, by name.
    gateways: Arc<HashMap<String, Arc<crate::gateway::Listener>>>,
}

/// The names of its exact hosts, backends and certificates, for the snapshot held
/// ([`Held`]) to share.
impl SharedNames for RouteTable {
    fn shared(&self, kind: ResourceKind, name: &str) -> Option<Arc<str>> {
        match kind {
            ResourceKind::VirtualHost => self.hosts.key_of(name),
            ResourceKind::Backend => self.backends.key_of(name),
            ResourceKind::Certificate => self.certificates.key_of(name),
            _ => None,
        }
    }
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
    #[error("certificate {name}")]
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
    /// A Gateway listener or one of its routes cannot be served.
    #[error("gateway listener {name}: unusable {reason}")]
    Gateway {
        /// The listener's name.
        name: String,
        /// What is unusable.
        reason: String,
    },
    /// A backend's TLS settings cannot be used.
    #[error("backend {backend}: TLS")]
    BackendTls {
        /// Backend name.
        backend: String,
        /// Why.
        #[source]
        source: holdfast_proto::backend_tls::BackendTlsError,
    },
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

/// The Ingress hosts (as a virtual host names them) that `delta` replaces or removes, in
/// either form: virtual hosts, and Gateway hosts of listener `ingress`.
pub fn ingress_hosts_touched(delta: &SnapshotDelta) -> impl Iterator<Item = &str> {
    delta
        .removed_virtual_hosts
        .iter()
        .map(String::as_str)
        .chain(delta.upserted_virtual_hosts.iter().map(|v| v.host.as_str()))
        .chain(
            delta
                .removed_gateway_hosts
                .iter()
                .filter_map(|n| snapshot::ingress_host_of(n)),
        )
        .chain(
            delta
                .upserted_gateway_hosts
                .iter()
                .filter(|g| snapshot::is_ingress_host(g))
                .map(|g| g.host.as_str()),
        )
}

/// Lower-cases a Host header value and drops its port.
pub fn normalise_host(host: &str) -> std::borrow::Cow<'_, str> {
    let host = if let Some(rest) = host.strip_prefix('[') {
        // IPv6 literal: keep the brackets' content.
        rest.split(']').next().unwrap_or(rest)
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(h, _)| h)
    };
    let host = host.trim_end_matches('.');
    // Most hosts arrive in lower case: no copy then.
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

/// A backend of the snapshot, ready to forward to.
/// Compiles `b`, named `name` (the table's key shares it).
fn compile_backend(
    b: &holdfast_proto::v1::Backend,
    name: Arc<str>,
) -> Result<Backend, CompileError> {
    let mut endpoints = Vec::with_capacity(b.endpoints.len());
    let mut authorities = Vec::with_capacity(b.endpoints.len());
    // A TLS backend that cannot serve (its settings refused by the control plane) keeps no
    // endpoint: nothing could ever dial one of them without its TLS.
    let tls_refused = b.tls.is_some() && !b.unavailable_reason.is_empty();
    // Checked whole before any number is taken: a backend that does not compile holds
    // none.
    for e in b.endpoints.iter().filter(|e| e.ready && !tls_refused) {
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
    }
    let h2c = b.protocol == holdfast_proto::v1::BackendProtocol::H2c as i32;
    // TLS is set up only for a backend that can serve: one that cannot answers 503 and
    // never connects (the control plane says why there, a CA that does not parse say).
    let tls = match &b.tls {
        Some(tls) if b.unavailable_reason.is_empty() => Some(
            holdfast_proto::backend_tls::client_config(tls, h2c).map_err(|source| {
                CompileError::BackendTls {
                    backend: b.name.clone(),
                    source,
                }
            })?,
        ),
        _ => None,
    };
    let secure = |to: Key| match &tls {
        Some(c) => Key::Secure(Arc::new(Secure {
            to,
            name: c.name.clone(),
            config: c.config.clone(),
            settings: c.settings,
        })),
        None => to,
    };
    let external = (!b.external_name.is_empty() && !tls_refused).then(|| {
        let port = u16::try_from(b.external_port).unwrap_or(0);
        let target = format!("{}:{port}", b.external_name);
        let authority = Authority::try_from(target.as_str()).ok();
        let key = authority.as_ref().map(|a| secure(Key::Name(a.clone())));
        Box::new(External {
            number: key.as_ref().map(Number::of),
            key,
            authority,
            target,
        })
    });
    let dial = endpoints
        .iter()
        .zip(authorities)
        .map(|(addr, authority)| {
            let key = secure(Key::Addr(*addr));
            Dial {
                authority,
                number: Number::of(&key),
                key,
            }
        })
        .collect();
    let unavailable_reason = if !b.unavailable_reason.is_empty() {
        Some(b.unavailable_reason.clone())
    } else if let Some(e) = external.as_ref().filter(|e| e.authority.is_none()) {
        Some(format!(
            "ExternalName target {} is not a valid host and port",
            e.target
        ))
    } else if endpoints.is_empty() && external.is_none() {
        Some(format!("no ready endpoints for backend {}", b.name))
    } else {
        None
    };
    Ok(Backend {
        name,
        endpoints,
        dial,
        external,
        unavailable_reason,
        h2c,
        tls: b.tls.is_some(),
        next: AtomicUsize::new(0),
    })
}

/// A certificate of the snapshot, parsed for rustls.
fn compile_certificate(
    c: &holdfast_proto::v1::Certificate,
) -> Result<TlsCertificate, CompileError> {
    certificate_with(c, |c| {
        certificate::parse(&c.certificate_chain, &c.private_key)
    })
}

/// A certificate from a snapshot shown without private keys (`Admin/GetSnapshot`).
fn certificate_without_key(
    c: &holdfast_proto::v1::Certificate,
) -> Result<TlsCertificate, CompileError> {
    certificate_with(c, |c| certificate::parse_without_key(&c.certificate_chain))
}

fn certificate_with(
    c: &holdfast_proto::v1::Certificate,
    parse: impl FnOnce(
        &holdfast_proto::v1::Certificate,
    ) -> Result<certificate::Parsed, certificate::CertificateError>,
) -> Result<TlsCertificate, CompileError> {
    let parsed = parse(c).map_err(|source| CompileError::Certificate {
        name: c.name.clone(),
        source,
    })?;
    Ok(TlsCertificate {
        name: c.name.clone(),
        key: parsed.key,
        facts: parsed.facts,
    })
}

fn source_name(source: Option<&holdfast_proto::v1::IngressRef>) -> String {
    source
        .map(|s| format!("{}/{}", s.namespace, s.name))
        .unwrap_or_default()
}

impl RouteTable {
    /// Compiles a validated snapshot.
    pub fn compile(snapshot: &Snapshot) -> Result<Self, CompileError> {
        RouteTable::compile_sharing(snapshot, &())
    }

    /// Compiles a snapshot as `Admin/GetSnapshot` shows it, without private keys, to look
    /// routes up offline ([`crate::admin::explain`]). Its certificates cannot serve a
    /// handshake: never serve a table compiled this way.
    pub fn compile_without_keys(snapshot: &Snapshot) -> Result<Self, CompileError> {
        RouteTable::compile_with(snapshot, &(), certificate_without_key)
    }

    /// [`RouteTable::compile`], holding the names of hosts and backends `names` has (the
    /// snapshot held, [`Held`]) rather than copies.
    pub fn compile_sharing(
        snapshot: &Snapshot,
        names: &dyn SharedNames,
    ) -> Result<Self, CompileError> {
        RouteTable::compile_with(snapshot, names, compile_certificate)
    }

    fn compile_with(
        snapshot: &Snapshot,
        names: &dyn SharedNames,
        compile_certificate: fn(
            &holdfast_proto::v1::Certificate,
        ) -> Result<TlsCertificate, CompileError>,
    ) -> Result<Self, CompileError> {
        let mut t = RouteTable {
            version: snapshot.version.clone(),
            content_hash: snapshot.content_hash.clone(),
            cluster_revision: snapshot.cluster_revision,
            progress: snapshot.progress.clone(),
            backends: Shards::default(),
            certificates: Shards::default(),
            default_certificate_name: snapshot.default_certificate.clone(),
            default_certificate: None,
            hosts: Hosts::new(Selection::Ingress),
            default_route: None,
            host_routes: 0,
            gateways: Arc::default(),
        };
        for b in &snapshot.backends {
            t.put_backend(b, names)?;
        }
        for c in &snapshot.certificates {
            t.certificates
                .insert(c.name.as_str().into(), Arc::new(compile_certificate(c)?));
        }
        t.default_certificate = t.certificate_named("", &snapshot.default_certificate)?;
        for vhost in &snapshot.virtual_hosts {
            t.put_host(vhost, names)?;
        }
        t.default_route = snapshot
            .default_backend
            .as_ref()
            .map(|d| t.default_route_for(d))
            .transpose()?;
        let mut by_listener: HashMap<&str, Vec<&holdfast_proto::v1::GatewayHost>> = HashMap::new();
        for h in &snapshot.gateway_hosts {
            if snapshot::is_ingress_host(h) {
                t.put_ingress_host(h)?;
            } else {
                by_listener.entry(h.listener.as_str()).or_default().push(h);
            }
        }
        let mut gateways = HashMap::new();
        for l in &snapshot.gateway_listeners {
            let hosts = by_listener.remove(l.name.as_str()).unwrap_or_default();
            gateways.insert(l.name.clone(), Arc::new(t.compile_listener(l, hosts)?));
        }
        t.gateways = Arc::new(gateways);
        Ok(t)
    }

    fn compile_listener<'a>(
        &self,
        l: &holdfast_proto::v1::GatewayListener,
        hosts: impl IntoIterator<Item = &'a holdfast_proto::v1::GatewayHost>,
    ) -> Result<crate::gateway::Listener, CompileError> {
        crate::gateway::Listener::compile(
            l,
            hosts,
            |name| self.backend_named(name),
            |name| self.certificates.get(name).cloned(),
        )
    }

    /// Compiles again the Gateway listeners `delta` changes: those it upserts or removes,
    /// those of the Gateway hosts it upserts or removes, and those whose backends or
    /// certificates it replaces; the others are shared.
    fn apply_gateway_delta(
        &mut self,
        held: &Held,
        delta: &SnapshotDelta,
    ) -> Result<(), CompileError> {
        let listener_of = |host_name: &str| -> Option<String> {
            host_name.split_once(' ').map(|(l, _)| l.to_owned())
        };
        let mut affected: BTreeSet<String> = BTreeSet::new();
        let gateway = |listener: &String| listener != snapshot::INGRESS_LISTENER;
        affected.extend(delta.removed_gateway_listeners.iter().cloned());
        affected.extend(
            delta
                .upserted_gateway_listeners
                .iter()
                .map(|l| l.name.clone()),
        );
        affected.extend(
            delta
                .upserted_gateway_hosts
                .iter()
                .map(|h| h.listener.clone())
                .filter(gateway),
        );
        affected.extend(
            delta
                .removed_gateway_hosts
                .iter()
                .filter_map(|h| listener_of(h))
                .filter(gateway),
        );
        for b in &delta.upserted_backends {
            affected.extend(
                held.hosts_using_backend(&b.name)
                    .filter(|h| h.contains(' '))
                    .filter_map(listener_of)
                    .filter(gateway),
            );
        }
        for c in &delta.upserted_certificates {
            affected.extend(
                held.hosts_using_certificate(&c.name)
                    .filter(|h| h.contains(':'))
                    .map(str::to_owned),
            );
        }
        if affected.is_empty() {
            return Ok(());
        }
        let touched: HashSet<&str> = delta
            .removed_gateway_hosts
            .iter()
            .map(String::as_str)
            .chain(delta.upserted_gateway_hosts.iter().map(|h| h.name.as_str()))
            .collect();
        let mut gateways = (*self.gateways).clone();
        for name in &affected {
            // `held` keeps its resources encoded: the ones it gives are decoded here.
            let kept;
            let listener = match delta
                .upserted_gateway_listeners
                .iter()
                .find(|l| l.name == *name)
            {
                Some(l) => l,
                None if delta.removed_gateway_listeners.contains(name) => {
                    gateways.remove(name);
                    continue;
                }
                None => match held.gateway_listener(name) {
                    Some(l) => {
                        kept = l;
                        &kept
                    }
                    None => {
                        gateways.remove(name);
                        continue;
                    }
                },
            };
            let kept_hosts: Vec<GatewayHost> = held
                .hosts_of_listener(name)
                .filter(|h| !touched.contains(h.name.as_str()))
                .collect();
            let hosts = kept_hosts.iter().chain(
                delta
                    .upserted_gateway_hosts
                    .iter()
                    .filter(|h| h.listener == *name),
            );
            let compiled = self.compile_listener(listener, hosts)?;
            gateways.insert(name.clone(), Arc::new(compiled));
        }
        self.gateways = Arc::new(gateways);
        Ok(())
    }

    /// The Gateway listener named `name`.
    pub fn gateway_listener(&self, name: &str) -> Option<&Arc<crate::gateway::Listener>> {
        self.gateways.get(name)
    }

    /// Every Gateway listener, in no particular order.
    pub fn gateway_listeners(&self) -> impl Iterator<Item = &Arc<crate::gateway::Listener>> {
        self.gateways.values()
    }

    /// The table after `delta`, given `held`, the snapshot this table was compiled from
    /// (before the delta), which [`Held::check`] found `delta` valid against. Compiles
    /// only what the delta changes (hosts it upserts, and hosts whose backend or
    /// certificate it upserts) and shares every other host's entry with this table.
    pub fn apply_delta(&self, held: &Held, delta: &SnapshotDelta) -> Result<Self, CompileError> {
        let mut t = self.clone();
        t.version = delta.version.clone();
        t.content_hash = delta.content_hash.clone();
        t.cluster_revision = delta.cluster_revision;
        t.progress.clone_from(&delta.progress);
        for name in &delta.removed_backends {
            t.backends.remove(name);
        }
        for b in &delta.upserted_backends {
            t.put_backend(b, held)?;
        }
        for name in &delta.removed_certificates {
            t.certificates.remove(name);
        }
        for c in &delta.upserted_certificates {
            t.certificates
                .insert(c.name.as_str().into(), Arc::new(compile_certificate(c)?));
        }
        if delta.default_certificate_changed {
            t.default_certificate_name = delta.default_certificate.clone();
        }
        t.default_certificate = t.certificate_named("", &t.default_certificate_name.clone())?;

        // The Ingress hosts the delta replaces or removes, in either form.
        let touched: HashSet<&str> = ingress_hosts_touched(delta).collect();
        // Ingress hosts the delta leaves alone whose backend or certificate it replaces,
        // by the name `held` knows them by (a virtual host's host, or `ingress <host>`).
        let mut affected: BTreeSet<&str> = BTreeSet::new();
        for b in &delta.upserted_backends {
            affected.extend(held.hosts_using_backend(&b.name));
        }
        for c in &delta.upserted_certificates {
            affected.extend(held.hosts_using_certificate(&c.name));
        }
        for host in &delta.removed_virtual_hosts {
            t.remove_host(host);
        }
        for host in delta
            .removed_gateway_hosts
            .iter()
            .filter_map(|n| snapshot::ingress_host_of(n))
        {
            t.remove_host(host);
        }
        for vhost in &delta.upserted_virtual_hosts {
            t.put_host(vhost, held)?;
        }
        for g in delta
            .upserted_gateway_hosts
            .iter()
            .filter(|g| snapshot::is_ingress_host(g))
        {
            t.put_ingress_host(g)?;
        }
        for name in affected {
            match snapshot::ingress_host_of(name) {
                Some(host) if !touched.contains(host) => {
                    if let Some(g) = held.gateway_host(name) {
                        t.put_ingress_host(&g)?;
                    }
                }
                Some(_) => {}
                None if touched.contains(name) => {}
                None => {
                    if let Some(vhost) = held.virtual_host(name) {
                        t.put_host(&vhost, held)?;
                    }
                }
            }
        }
        let default_backend = if delta.default_backend_changed {
            delta.default_backend.as_ref()
        } else {
            held.default_backend().map(|d| &**d)
        };
        let backend_replaced = default_backend
            .is_some_and(|d| delta.upserted_backends.iter().any(|b| b.name == d.backend));
        if delta.default_backend_changed || backend_replaced {
            t.default_route = default_backend
                .map(|d| t.default_route_for(d))
                .transpose()?;
        }
        t.apply_gateway_delta(held, delta)?;
        Ok(t)
    }

    fn backend_named(&self, name: &str) -> Result<Arc<Backend>, CompileError> {
        self.backends
            .get(name)
            .cloned()
            .ok_or_else(|| CompileError::UnknownBackend(name.to_owned()))
    }

    fn certificate_named(
        &self,
        host: &str,
        name: &str,
    ) -> Result<Option<Arc<TlsCertificate>>, CompileError> {
        if name.is_empty() {
            return Ok(None);
        }
        self.certificates
            .get(name)
            .cloned()
            .map(Some)
            .ok_or_else(|| CompileError::UnknownCertificate {
                host: host.to_owned(),
                name: name.to_owned(),
            })
    }

    fn default_route_for(
        &self,
        d: &holdfast_proto::v1::DefaultBackend,
    ) -> Result<Arc<Route>, CompileError> {
        Ok(Arc::new(Route {
            host: "*".into(),
            kind: MatchKind::Prefix,
            path: "".into(),
            backend: self.backend_named(&d.backend)?,
            source: source_name(d.source.as_ref()),
            label: Label::Named("(default backend)".into()),
            counters: RouteCounters::default(),
        }))
    }

    /// Compiles Ingress host `g` (a Gateway host of listener `ingress`): as the virtual
    /// host it stands for when no entry has filters, else entry by entry as a Gateway
    /// host's (with Ingress host selection).
    fn put_ingress_host(&mut self, g: &GatewayHost) -> Result<(), CompileError> {
        if let Ok(vhost) = snapshot::ingress_virtual_host(g) {
            return self.put_host(&vhost, &());
        }
        let bad = |reason: &str| CompileError::Gateway {
            name: g.name.clone(),
            reason: reason.to_owned(),
        };
        let mut table = PathTable {
            certificate: self.certificate_named(&g.host, &g.certificate)?,
            ..PathTable::default()
        };
        table.ssl_redirect = g.ssl_redirect && table.certificate.is_some();
        let host = self
            .hosts
            .key_of(&g.host)
            .unwrap_or_else(|| g.host.as_str().into());
        let backend = |name: &str| self.backend_named(name);
        let mut entries = Vec::with_capacity(g.routes.len());
        // The entries of one Ingress path share its rate limit: a canary's header and
        // cookie entries must not multiply it.
        type PathKey<'a> = (i32, &'a str, Option<&'a str>);
        let mut limits: HashMap<PathKey<'_>, Arc<crate::limit::RateLimit>> = HashMap::new();
        let mut conn_limits: HashMap<PathKey<'_>, Arc<crate::limit::ConnLimit>> = HashMap::new();
        for r in &g.routes {
            let mut e = crate::gateway::compile_entry(r, &host, Label::HostPath, &backend, &bad)?;
            let key = (
                r.match_kind,
                r.path.as_str(),
                r.ingress.as_ref().map(|i| i.name.as_str()),
            );
            if let Some(limit) = e.action.rate_limit.take() {
                e.action.rate_limit = Some(limits.entry(key).or_insert(limit).clone());
            }
            if let Some(limit) = e.action.conn_limit.take() {
                e.action.conn_limit = Some(conn_limits.entry(key).or_insert(limit).clone());
            }
            entries.push(Entry {
                path: e.path,
                headers: e.headers,
                more: e.more,
                action: IngressAction::Matched(Arc::new(e.action)),
            });
        }
        table.paths = Paths::new(entries);
        self.remove_host(&g.host);
        self.host_routes += table.paths.entries().len();
        self.hosts.insert(host, Arc::new(table));
        Ok(())
    }

    /// Compiles `vhost` against this table's backends and certificates, in place of the
    /// host's entry if it has one.
    fn put_host(
        &mut self,
        vhost: &VirtualHost,
        names: &dyn SharedNames,
    ) -> Result<(), CompileError> {
        let mut table = PathTable {
            certificate: self.certificate_named(&vhost.host, &vhost.certificate)?,
            ..PathTable::default()
        };
        table.ssl_redirect = vhost.ssl_redirect && table.certificate.is_some();
        let mut entries = Vec::with_capacity(vhost.routes.len());
        // One copy of the name, for the table's key and every route of the host.
        let host = self
            .hosts
            .key_of(&vhost.host)
            .or_else(|| names.shared(ResourceKind::VirtualHost, &vhost.host))
            .unwrap_or_else(|| vhost.host.as_str().into());
        for r in &vhost.routes {
            let kind = MatchKind::try_from(r.match_kind).unwrap_or(MatchKind::Prefix);
            entries.push(Entry {
                path: match kind {
                    MatchKind::Exact => PathRule::Exact(r.path.clone()),
                    _ => PathRule::Prefix(r.path.clone()),
                },
                headers: Vec::new(),
                more: None,
                action: IngressAction::Route(Arc::new(Route {
                    host: host.clone(),
                    kind,
                    path: r.path.as_str().into(),
                    backend: self.backend_named(&r.backend)?,
                    source: source_name(r.source.as_ref()),
                    label: Label::HostPath,
                    counters: RouteCounters::default(),
                })),
            });
        }
        // In snapshot order: at one path the first route wins.
        table.paths = Paths::new(entries);
        self.remove_host(&vhost.host);
        self.host_routes += table.paths.entries().len();
        self.hosts.insert(host, Arc::new(table));
        Ok(())
    }

    /// Compiles backend `b` in place of the one of its name if any, sharing the name with
    /// that one, or else with `names`.
    fn put_backend(
        &mut self,
        b: &holdfast_proto::v1::Backend,
        names: &dyn SharedNames,
    ) -> Result<(), CompileError> {
        let name = self
            .backends
            .key_of(&b.name)
            .or_else(|| names.shared(ResourceKind::Backend, &b.name))
            .unwrap_or_else(|| b.name.as_str().into());
        let backend = compile_backend(b, name.clone())?;
        self.backends.insert(name, Arc::new(backend));
        Ok(())
    }

    fn remove_host(&mut self, host: &str) {
        if let Some(old) = self.hosts.remove(host) {
            self.host_routes -= old.paths.entries().len();
        }
    }

    /// The backend named `name`.
    pub fn backend(&self, name: &str) -> Option<&Arc<Backend>> {
        self.backends.get(name)
    }

    /// Every backend, in no particular order.
    pub fn backends(&self) -> impl Iterator<Item = &Arc<Backend>> {
        self.backends.values()
    }

    /// Number of backends.
    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// Every certificate, by name.
    pub fn certificates(&self) -> Vec<&Arc<TlsCertificate>> {
        let mut all: Vec<_> = self.certificates.values().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Every route: each host's in snapshot order (hosts in no particular order), then
    /// the default backend's.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.hosts
            .values()
            .flat_map(|t| t.routes())
            .chain(self.default_route.iter())
    }

    /// The entry of virtual host `host` as a snapshot names it ("" for rules without a
    /// host, `*.suffix` for a wildcard).
    fn entry(&self, host: &str) -> Option<&PathTable> {
        self.hosts.get(host).map(|t| &**t)
    }

    /// The request series (by [`SeriesKey`]) of this table's routes that `next` has no
    /// route with the same label for: among the routes of `hosts` (virtual hosts as a
    /// snapshot names them; every host when None), the default backend's, and those of
    /// the Gateway listeners `next` does not share with this table. What a swap to `next`
    /// leaves behind in the request metrics: a delta names the hosts it touches, and
    /// shares the listeners it leaves alone, so this is O(change) for one.
    pub fn labels_gone(&self, next: &RouteTable, hosts: Option<&[&str]>) -> Vec<SeriesKey> {
        let mut gone: Vec<SeriesKey> = self
            .routes_gone(next, hosts)
            .into_iter()
            .map(|r| r.series_key())
            .collect();
        gone.sort();
        gone.dedup();
        gone
    }

    /// The routes whose labels [`labels_gone`](Self::labels_gone) names.
    pub fn routes_gone(&self, next: &RouteTable, hosts: Option<&[&str]>) -> Vec<&Arc<Route>> {
        let mut gone = self.ingress_routes_gone(next, hosts);
        for (name, old) in self.gateways.iter() {
            // A Gateway route's label names its listener: only that listener's routes
            // in `next` can keep it.
            let kept: HashSet<SeriesKey> = match next.gateways.get(name) {
                Some(new) if Arc::ptr_eq(old, new) => continue,
                Some(new) => new.routes().map(|r| r.series_key()).collect(),
                None => HashSet::new(),
            };
            gone.extend(old.routes().filter(|r| !kept.contains(&r.series_key())));
        }
        gone
    }

    fn ingress_routes_gone(&self, next: &RouteTable, hosts: Option<&[&str]>) -> Vec<&Arc<Route>> {
        let old: Vec<&Arc<Route>> = match hosts {
            None => self.routes().collect(),
            Some(hosts) => hosts
                .iter()
                .filter_map(|h| self.entry(h))
                .flat_map(|t| t.routes())
                .chain(self.default_route.iter())
                .collect(),
        };
        old.into_iter()
            .filter(|r| {
                let kept = if &*r.host == "*" {
                    next.default_route.iter().any(|d| d.same_label(r))
                } else {
                    next.entry(&r.host)
                        .is_some_and(|t| t.routes().any(|n| n.same_label(r)))
                };
                !kept
            })
            .collect()
    }

    /// The route for a request to `host` (normalised: lower case, no port) and `path`
    /// ([`Self::lookup_entry`] without headers; an entry with filters gives its first
    /// target's route, and one without a target, such as a redirect, [`Miss::NoHost`]).
    pub fn lookup(&self, host: &str, path: &str) -> Result<&Route, Miss> {
        match self.lookup_entry(host, path, None)? {
            Found::Route(r) => Ok(r),
            Found::Matched(_, m) => m.routes().next().map(|r| &**r).ok_or(Miss::NoHost),
        }
    }

    /// Where a request to `host` (normalised: lower case, no port) and `path` goes: the
    /// one lookup ([`Hosts::lookup`]) with Ingress host selection, then the default
    /// backend. `request` is what header, method and query matches read (None: only
    /// entries without them match).
    pub fn lookup_entry(
        &self,
        host: &str,
        path: &str,
        request: Option<&crate::matching::Asked<'_>>,
    ) -> Result<Found<'_>, Miss> {
        let miss = match self.hosts.lookup(host, path, request) {
            Ok(e) => {
                return Ok(match &e.action {
                    IngressAction::Route(r) => Found::Route(r),
                    IngressAction::Matched(m) => Found::Matched(&e.path, m),
                });
            }
            Err(miss) => miss,
        };
        if let Some(d) = &self.default_route {
            return Ok(Found::Route(d));
        }
        Err(match miss {
            HostMiss::NoPath(level) => Miss::NoPath {
                vhost: level.name(),
            },
            HostMiss::NoHost => Miss::NoHost,
        })
    }

    /// The certificate to offer a TLS client that sent `sni` (lower case; None when it
    /// sent no SNI): the exact virtual host's; for a name with no exact virtual host, the
    /// wildcard virtual host's if it covers the name; else the default certificate. An
    /// exact virtual host without a certificate never gets the wildcard's: the two hosts
    /// may have different owners (docs/design.md, Tenancy). None fails the handshake.
    pub fn certificate_for(&self, sni: Option<&str>) -> Option<&TlsCertificate> {
        let by_host = sni.and_then(|name| match self.hosts.select(name)? {
            (Level::Exact(_), t) => t.certificate.as_deref(),
            (Level::Wildcard(_), t) => {
                let c = t.certificate.as_deref()?;
                certificate::covers(&c.facts.dns_names, name).then_some(c)
            }
            (Level::Any, _) => None,
        });
        by_host.or(self.default_certificate.as_deref())
    }

    /// Whether a plain-HTTP request for `host` (normalised) is redirected to https: its
    /// exact or wildcard virtual host has a certificate and redirects.
    pub fn redirects_to_https(&self, host: &str) -> bool {
        match self.hosts.select(host) {
            Some((Level::Exact(_) | Level::Wildcard(_), t)) => t.ssl_redirect,
            _ => false,
        }
    }

    /// Number of routes (the default backend counts as one), Gateway route entries
    /// included.
    pub fn route_count(&self) -> usize {
        self.host_routes
            + usize::from(self.default_route.is_some())
            + self.gateways.values().map(|l| l.entries).sum::<usize>()
    }
}

#[cfg(test)]
mod tests;
