//! Building virtual hosts from the Ingresses that route each host, resolving backends
//! (Service port → targetPort → ready endpoints), and choosing each TLS host's certificate.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use holdfast_proto::certificate;
use holdfast_proto::v1::{
    Backend, BackendProtocol, Certificate, Endpoint, GatewayHost, IngressRef, MatchKind, Route,
    VirtualHost,
};

use super::{
    BackendRef, FastMap, FastSet, HostOwnership, IngressDigest, Options, PortRef, Problem,
    ProblemReason, RouteDigest, SecretDigest, ServiceDigest, SliceDigest, TLS_SECRET_TYPE,
    Translator, by_age, by_name, sort_prefix, sort_routes,
};

/// One virtual host as built: the message, the conflicts decided in it, and the
/// backends its routes use.
pub(super) struct HostEntry {
    /// The host as snapshots carry it, in the one route model: the Gateway host of
    /// listener `ingress` (`snapshot::ingress_gateway_host`). Shared with the snapshots
    /// published from it (changed only by copy on write).
    pub(super) wire: Arc<GatewayHost>,
    /// The namespace that owns the host ([`crate::claims::owner`]); with
    /// `HostOwnership::Shared`, the namespace of its oldest Ingress.
    pub(super) owner: String,
    pub(super) problems: Vec<Problem>,
    pub(super) backends: Vec<Arc<BackendRef>>,
}

impl HostEntry {
    pub(super) fn new(
        vhost: VirtualHost,
        owner: String,
        problems: Vec<Problem>,
        backends: Vec<Arc<BackendRef>>,
    ) -> Self {
        HostEntry {
            wire: Arc::new(holdfast_proto::snapshot::ingress_gateway_host(&vhost)),
            owner,
            problems,
            backends,
        }
    }

    /// Sets the host's certificate and redirect, copying the shared host only if they
    /// change.
    pub(super) fn set_tls(&mut self, certificate: &str, redirect: bool) {
        if self.wire.certificate != certificate || self.wire.ssl_redirect != redirect {
            let g = Arc::make_mut(&mut self.wire);
            certificate.clone_into(&mut g.certificate);
            g.ssl_redirect = redirect;
        }
    }
}

/// One resolved backend: the message, and how many virtual hosts (and the default
/// backend) use it.
pub(super) struct BackendEntry {
    pub(super) users: usize,
    /// Shared with the snapshots published from it.
    pub(super) backend: Arc<Backend>,
    /// An ExternalName Service, refused because `allow_external_name` is off.
    pub(super) refused_external: bool,
    /// Endpoint addresses refused (see [`refused_address`]).
    pub(super) refused_addresses: Vec<String>,
}

impl BackendEntry {
    /// An entry with `users` users, to be resolved before the snapshot is built.
    pub(super) fn unresolved(users: usize) -> Self {
        BackendEntry {
            users,
            backend: Arc::default(),
            refused_external: false,
            refused_addresses: Vec::new(),
        }
    }
}

/// The TLS part of a build.
pub(super) struct TlsOut {
    /// Sorted by name.
    pub(super) certificates: Vec<Certificate>,
    pub(super) default_certificate: String,
    pub(super) users: Vec<(String, IngressRef)>,
}

/// The distinct hosts an Ingress routes.
pub(super) fn hosts_of(d: &IngressDigest) -> Vec<&String> {
    let mut hosts: Vec<&String> = d.routes.iter().map(|r| &r.host).collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

/// The built backends, by name (snapshot order), and their names by the Service they
/// resolve against.
#[derive(Default)]
pub(super) struct Backends {
    pub(super) entries: BTreeMap<String, BackendEntry>,
    pub(super) by_service: FastMap<String, Vec<Arc<BackendRef>>>,
    /// Backends removed or resolved again since the last build's content sum.
    pub(super) unsummed: Vec<String>,
}

impl Backends {
    /// One more user of backend `b`; a backend not built yet is noted in `new`.
    pub(super) fn acquire(&mut self, b: &Arc<BackendRef>, new: &mut Vec<Arc<BackendRef>>) {
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
    pub(super) fn acquire_all(
        &mut self,
        mut refs: Vec<Arc<BackendRef>>,
        new: &mut Vec<Arc<BackendRef>>,
    ) {
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
    pub(super) fn added(&mut self, b: &Arc<BackendRef>, new: &mut Vec<Arc<BackendRef>>) {
        self.by_service
            .entry(b.service_key().to_owned())
            .or_default()
            .push(b.clone());
        if let Some(secret) = b.verify_secret() {
            self.by_service
                .entry(super::rules::secret_dependency(secret))
                .or_default()
                .push(b.clone());
        }
        new.push(b.clone());
    }

    /// One user fewer of backend `b`; an unused backend leaves the snapshot.
    pub(super) fn release(&mut self, b: &BackendRef) {
        let Some(entry) = self.entries.get_mut(&b.name) else {
            return;
        };
        entry.users -= 1;
        if entry.users > 0 {
            return;
        }
        self.entries.remove(&b.name);
        self.unsummed.push(b.name.clone());
        let secret = b.verify_secret().map(super::rules::secret_dependency);
        for key in std::iter::once(b.service_key()).chain(secret.as_deref()) {
            if let Some(list) = self.by_service.get_mut(key) {
                list.retain(|x| x.name != b.name);
                if list.is_empty() {
                    self.by_service.remove(key);
                }
            }
        }
    }
}

/// Builds one virtual host from the Ingresses that route it: with
/// `HostOwnership::FirstNamespace` only the owner's (by `claims`, the host's recorded
/// claims); on the same host, path and kind twice, the oldest Ingress wins and the others
/// (if other Ingresses) get a problem.
///
/// Rules without a host (`host` is `""`) catch every host no rule names: only namespaces
/// allowed by `--default-backend-namespaces` may add them (the others get a problem), and
/// those namespaces share the catch-all (no claims: it is not a host).
pub(super) fn build_host(
    host: &str,
    contributors: &[Arc<IngressDigest>],
    opts: &Options,
    claims: &[crate::claims::Claim],
) -> HostEntry {
    let mut ordered: Vec<&IngressDigest> = contributors.iter().map(|d| &**d).collect();
    ordered.sort_unstable_by(|a, b| by_age(a, b));
    let mut problems = Vec::new();
    let mut ownership = opts.host_ownership;
    if host.is_empty() {
        ownership = HostOwnership::Shared;
        if let Some(allowed) = &opts.default_backend_namespaces {
            ordered.retain(|d| {
                let ok = allowed.contains(&d.source.namespace);
                if !ok {
                    problems.push(Problem {
                        namespace: d.source.namespace.clone(),
                        name: d.source.name.clone(),
                        reason: ProblemReason::HostlessRuleNotAllowed,
                        message: format!(
                            "rules without a host skipped: they catch every host no rule names, and namespace {:?} may not add them (--default-backend-namespaces)",
                            d.source.namespace
                        ),
                    });
                }
                ok
            });
        }
    }
    let owner = match ownership {
        HostOwnership::FirstNamespace => {
            crate::claims::owner(claims, ordered.iter().map(|d| d.source.namespace.as_str()))
        }
        HostOwnership::Shared => ordered.first().map(|d| d.source.namespace.as_str()),
    }
    .unwrap_or_default()
    .to_owned();
    if ownership == HostOwnership::FirstNamespace && !owner.is_empty() {
        ordered.retain(|d| {
            let own = d.source.namespace == owner;
            if !own {
                problems.push(Problem {
                    namespace: d.source.namespace.clone(),
                    name: d.source.name.clone(),
                    reason: ProblemReason::HostOwnedByOtherNamespace,
                    message: format!(
                        "rules for host {host:?} skipped: the host belongs to namespace {owner:?}, which named it first; see --host-ownership"
                    ),
                });
            }
            own
        });
    }
    // ingress-nginx `use-regex` (or `rewrite-target`) on one Ingress of the host makes
    // every path of the host, as written, a regular expression, as ingress-nginx does
    // ("enforced on all paths for a given host"); one that is not a regular expression
    // keeps its kind, with a problem.
    let regex_host = ordered.iter().any(|d| d.regex);
    let mut promoted: Vec<(RouteDigest, usize)> = Vec::new();
    let mut kept: std::collections::HashSet<*const RouteDigest> = Default::default();
    if regex_host {
        for (rank, d) in ordered.iter().enumerate() {
            for r in d
                .routes
                .iter()
                .filter(|r| r.host == host && r.kind != MatchKind::Regex)
            {
                if holdfast_proto::snapshot::ingress_path_regex(&r.written).is_ok() {
                    let mut as_regex = r.clone();
                    as_regex.kind = MatchKind::Regex;
                    as_regex.path.clone_from(&r.written);
                    as_regex.path_key = sort_prefix(&r.written);
                    promoted.push((as_regex, rank));
                } else {
                    kept.insert(std::ptr::from_ref(r));
                    problems.push(Problem {
                        namespace: d.source.namespace.clone(),
                        name: d.source.name.clone(),
                        reason: ProblemReason::InvalidPath,
                        message: format!(
                            "path {:?} on host {host:?} kept as written: an Ingress of the host sets use-regex, and it is not a regular expression",
                            r.written
                        ),
                    });
                }
            }
        }
    }
    let mut candidates: Vec<(&RouteDigest, usize)> = ordered
        .iter()
        .enumerate()
        .flat_map(|(rank, d)| {
            d.routes
                .iter()
                .filter(|r| {
                    r.host == host
                        && (!regex_host
                            || r.kind == MatchKind::Regex
                            || kept.contains(&std::ptr::from_ref(*r)))
                })
                .map(move |r| (r, rank))
        })
        .chain(promoted.iter().map(|(r, rank)| (r, *rank)))
        .collect();
    candidates.sort_unstable_by(|(a, ra), (b, rb)| {
        (a.kind as i32, a.path_key)
            .cmp(&(b.kind as i32, b.path_key))
            .then_with(|| (&a.path, ra).cmp(&(&b.path, rb)))
    });
    // A canary Ingress's paths never conflict: they join the main Ingress's (below).
    let (canaries, candidates): (Vec<_>, Vec<_>) = candidates
        .into_iter()
        .partition(|(_, rank)| ordered[*rank].canary.is_some());
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
                    reason: ProblemReason::ConflictingRoute,
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
    // At most MAX_PATH_REGEXES_PER_HOST regular expressions a host, the oldest Ingresses'
    // first: a request is matched against them one by one.
    let limit = holdfast_proto::snapshot::MAX_PATH_REGEXES_PER_HOST;
    let mut regexes: Vec<(usize, &String)> = winners
        .iter()
        .filter(|(r, _)| r.kind == MatchKind::Regex)
        .map(|(r, rank)| (*rank, &r.path))
        .collect();
    if regexes.len() > limit {
        regexes.sort_unstable();
        let over: std::collections::HashSet<(usize, String)> = regexes[limit..]
            .iter()
            .map(|(rank, path)| (*rank, (*path).clone()))
            .collect();
        winners.retain(|(r, rank)| {
            let drop = r.kind == MatchKind::Regex && over.contains(&(*rank, r.path.clone()));
            if drop {
                let d = ordered[*rank];
                problems.push(Problem {
                    namespace: d.source.namespace.clone(),
                    name: d.source.name.clone(),
                    reason: ProblemReason::InvalidPath,
                    message: format!(
                        "regular-expression path {:?} on host {host:?} skipped: the host has more than {limit} (older Ingresses' first)",
                        r.path
                    ),
                });
            }
            !drop
        });
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
    // Each canary path joins the main route at its path and kind (the oldest canary
    // wins; ingress-nginx serves one canary per path).
    // A canary's backends are spoken to as the main Ingress's are (its backend-protocol and
    // proxy-ssl-* are the main Ingress's, as all its other annotations).
    let mut joined: Vec<(&RouteDigest, &IngressDigest, Arc<BackendRef>)> = Vec::new();
    for (route, rank) in canaries {
        let canary = ordered[rank];
        let skip = |why: String| Problem {
            namespace: canary.source.namespace.clone(),
            name: canary.source.name.clone(),
            reason: ProblemReason::CanaryNotJoined,
            message: format!(
                "canary {:?} path {:?} on host {host:?} not served: {why}",
                route.kind, route.path
            ),
        };
        let main = winners
            .iter()
            .find(|(w, _)| (w.kind, &w.path) == (route.kind, &route.path));
        if let Some((_, first, _)) = joined
            .iter()
            .find(|(j, _, _)| (j.kind, &j.path) == (route.kind, &route.path))
        {
            problems.push(skip(format!(
                "{}/{} (older) is its canary already",
                first.source.namespace, first.source.name
            )));
        } else if let Some((main, _)) = main {
            let backend = Arc::new(route.backend.speaking_like(&main.backend));
            joined.push((route, canary, backend));
        } else {
            problems.push(skip("no Ingress without canary routes it".into()));
        }
    }
    let mut backends: Vec<Arc<BackendRef>> = winners
        .iter()
        .map(|(r, _)| r.backend.clone())
        .chain(joined.iter().map(|(_, _, b)| b.clone()))
        .collect();
    backends.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    backends.dedup_by(|a, b| a.name == b.name);
    let vhost = VirtualHost {
        host: host.to_owned(),
        routes,
        ..Default::default()
    };
    let mut entry = HostEntry::new(vhost, owner, problems, backends);
    if !joined.is_empty() {
        let g = Arc::make_mut(&mut entry.wire);
        for (route, canary, backend) in &joined {
            let rules = canary.canary.as_deref().cloned().unwrap_or_default();
            if let Some(i) = g
                .routes
                .iter()
                .position(|r| r.match_kind == route.kind as i32 && r.path == route.path)
            {
                let entries = super::nginx::with_canary(&g.routes[i], &backend.name, &rules);
                g.routes.splice(i..=i, entries);
            }
        }
    }
    // The ingress-nginx annotations of the Ingresses routing the host.
    let annotated = ordered
        .iter()
        .filter_map(|d| Some((&d.source, d.nginx.as_deref()?)));
    if annotated.clone().next().is_some() {
        super::nginx::apply_to_host(Arc::make_mut(&mut entry.wire), annotated);
    }
    entry
}

/// What resolving a backend refused, besides the backend itself.
pub(super) struct Refused {
    /// An ExternalName Service while `allow_external_name` is off.
    pub(super) external: bool,
    /// Endpoint addresses that point at the proxy itself ([`refused_address`], or one
    /// of the proxies' own pods).
    pub(super) addresses: Vec<String>,
}

/// Whether an endpoint address points at the proxy itself or at no pod: loopback,
/// link-local (which includes cloud metadata services at 169.254.169.254),
/// unspecified, multicast or broadcast. Such an endpoint would turn the proxy on itself
/// or on the node's services; it is left out, with a problem. (The API server refuses
/// loopback and link-local addresses in EndpointSlices today; this does not rely on it.)
pub fn refused_address(address: &str) -> bool {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => {
            a.is_loopback()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_broadcast()
        }
        Ok(std::net::IpAddr::V6(a)) => {
            let v4 = a.to_ipv4_mapped();
            a.is_loopback()
                || a.is_unicast_link_local()
                || a.is_unspecified()
                || a.is_multicast()
                || v4.is_some_and(|v4| refused_address(&v4.to_string()))
        }
        // Not an IP address (an FQDN slice): not ours to judge here.
        Err(_) => false,
    }
}

/// Resolves one backend against its Service and that Service's EndpointSlices, with what
/// it refused.
pub(super) fn resolve_backend(
    key: &BackendRef,
    svc: Option<&ServiceDigest>,
    slices: &[Arc<SliceDigest>],
    secrets: &FastMap<String, Arc<SecretDigest>>,
    allow_external: bool,
    proxies: &FastSet<String>,
) -> (Backend, Refused) {
    let mut addresses = Vec::new();
    let mut backend =
        resolve_allowed_backend(key, svc, slices, allow_external, proxies, &mut addresses);
    // Verified TLS: the Secret's ca.crt, or 503 with why (never unverified).
    if let (Some(tls), Some(secret)) = (backend.tls.as_mut(), key.verify_secret()) {
        match secrets.get(secret).map(|d| d.ca.as_deref()) {
            Some(Some(ca)) => {
                tls.verify = true;
                tls.ca_pem = ca.to_owned();
            }
            found => {
                let why = if found.is_none() {
                    "is not a kubernetes.io/tls Secret that exists"
                } else {
                    "has no ca.crt"
                };
                backend.unavailable_reason = format!(
                    "TLS to backend {}: Secret {secret} (proxy-ssl-secret) {why}",
                    backend.name
                );
            }
        }
    }
    // TLS the proxy could not set up (a name that is none) answers 503 with why; the
    // proxy would refuse the whole snapshot for it.
    if let Some(tls) = &backend.tls
        && backend.unavailable_reason.is_empty()
    {
        let h2 = backend.protocol == BackendProtocol::H2c as i32;
        if let Err(e) = holdfast_proto::backend_tls::client_config(tls, h2) {
            backend.unavailable_reason = format!("TLS to backend {}: {e}", backend.name);
        }
    }
    let external = !allow_external && svc.is_some_and(|s| s.external_name.is_some());
    (
        backend,
        Refused {
            external,
            addresses,
        },
    )
}

pub(super) fn resolve_allowed_backend(
    key: &BackendRef,
    svc: Option<&ServiceDigest>,
    slices: &[Arc<SliceDigest>],
    allow_external: bool,
    proxies: &FastSet<String>,
    refused: &mut Vec<String>,
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
    if key.h2c {
        backend.protocol = BackendProtocol::H2c as i32;
    }
    if let Some(tls) = &key.tls {
        // Set before anything else: no way out of here leaves it cleartext. Unverified
        // (ingress-nginx `proxy-ssl-verify: "off"`): no CA, and the name matters only as
        // SNI, when asked for; by default the ExternalName's name or the Service's.
        let name = match &svc.external_name {
            Some(external) if !external.is_empty() => external.clone(),
            _ => format!("{svc_name}.{ns}.svc"),
        };
        backend.tls = Some(holdfast_proto::v1::BackendTls {
            server_name: tls.name.clone().unwrap_or(name),
            verify: false,
            ca_pem: String::new(),
            sni: tls.sni,
            subject_alt_names: Vec::new(),
        });
    }
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
    if service_port.h2c || key.h2c {
        backend.protocol = BackendProtocol::H2c as i32;
    }
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
            let address = &text[address.clone()];
            if refused_address(address) || proxies.contains(address) {
                refused.push(address.to_owned());
                continue;
            }
            endpoints.push((address, port as u32, &text[zone.clone()]));
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

impl Translator {
    /// An `ExternalNameDisabled` problem for each Ingress routing to a refused
    /// ExternalName backend, and a `RefusedEndpointAddress` one for each routing to a
    /// backend with refused endpoint addresses. Walks the routes only while there is such
    /// a backend.
    pub(super) fn refused_backend_problems(&self, problems: &mut BTreeSet<Problem>) {
        let refused: FastMap<&str, &BackendEntry> = self
            .backends
            .entries
            .iter()
            .filter(|(_, e)| e.refused_external || !e.refused_addresses.is_empty())
            .map(|(name, e)| (name.as_str(), e))
            .collect();
        if refused.is_empty() {
            return;
        }
        for entry in self.hosts.values() {
            for route in &entry.wire.routes {
                // An Ingress entry has one backend.
                let backend = route.backends.first().map_or("", |b| b.backend.as_str());
                let (Some(e), Some(src)) = (refused.get(backend), &route.ingress) else {
                    continue;
                };
                let mut tell = |reason: ProblemReason, message: String| {
                    problems.insert(Problem {
                        namespace: src.namespace.clone(),
                        name: src.name.clone(),
                        reason,
                        message,
                    })
                };
                if e.refused_external {
                    tell(
                        ProblemReason::ExternalNameDisabled,
                        format!(
                            "backend {backend} is an ExternalName Service, and ExternalName backends are off (--allow-external-name): it answers 503",
                        ),
                    );
                }
                if !e.refused_addresses.is_empty() {
                    tell(
                        ProblemReason::RefusedEndpointAddress,
                        format!(
                            "backend {backend}: endpoint addresses {:?} left out: loopback, link-local, unspecified or multicast addresses, and the proxies' own pods, point at the proxy itself or at the node",
                            e.refused_addresses
                        ),
                    );
                }
            }
        }
    }

    /// Decides which certificate serves each `spec.tls` host, sets `certificate` and
    /// `ssl_redirect` on the built virtual hosts, and returns the certificates in use.
    /// Runs in full on every build: its cost is in the TLS entries, not the cluster.
    pub(super) fn assign_certificates(
        &mut self,
        opts: &Options,
        problems: &mut BTreeSet<Problem>,
    ) -> TlsOut {
        let before: Vec<(String, String, bool)> = self
            .tls_hosts
            .iter()
            .filter_map(|h| {
                let v = &self.hosts.get(h)?.wire;
                Some((h.clone(), v.certificate.clone(), v.ssl_redirect))
            })
            .collect();
        let out = self.assign_certificates_afresh(opts, problems);
        // The hosts whose certificate or redirect changed must be hashed again.
        let had: FastSet<&str> = before.iter().map(|(h, _, _)| h.as_str()).collect();
        for (host, certificate, redirect) in &before {
            if self.hosts.get(host).is_some_and(|e| {
                e.wire.certificate != *certificate || e.wire.ssl_redirect != *redirect
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

    /// [`Self::assign_certificates`] without the bookkeeping of what it changed. The
    /// phases, each a function below: refuse every `spec.tls` when certificates may not be
    /// sent; each host's Secret from the owner's `spec.tls` entries, then for a routed host
    /// no entry lists, an entry whose certificate covers it; each Secret's certificate
    /// (current, or last good); the hosts each covers; and the snapshot's certificates.
    pub(super) fn assign_certificates_afresh(
        &mut self,
        opts: &Options,
        problems: &mut BTreeSet<Problem>,
    ) -> TlsOut {
        // The oldest Ingress naming a host decides its Secret.
        let mut tls_ingresses: Vec<&IngressDigest> = self.with_tls.values().map(|d| &**d).collect();
        tls_ingresses.sort_unstable_by(|a, b| by_age(a, b));
        if !opts.allow_certificates {
            refuse_certificates(
                &tls_ingresses,
                &mut self.tls_hosts,
                &mut self.hosts,
                problems,
            );
            return TlsOut {
                certificates: Vec::new(),
                default_certificate: String::new(),
                users: Vec::new(),
            };
        }
        let (mut wanted, listed) =
            listed_secrets(&tls_ingresses, &self.hosts, opts.host_ownership, problems);
        let covering = covering_secrets(
            &self.hosts,
            &wanted,
            &listed,
            &self.secrets_by_key,
            &self.last_good,
        );
        // The entries that serve a host by their certificate alone.
        let mut by_cover: FastSet<(&str, *const IngressDigest)> = FastSet::default();
        for (host, secret, d) in &covering {
            wanted.insert(host, (secret, d));
            by_cover.insert((secret, *d as *const IngressDigest));
        }
        let default_secret = opts.default_certificate.as_deref();
        let chosen = choose_certificates(
            &wanted,
            default_secret,
            &self.secrets_by_key,
            &mut self.last_good,
            problems,
        );
        let assigned = assign_hosts(
            &wanted,
            &chosen,
            &by_cover,
            &self.hosts,
            &self.contributors,
            problems,
        );
        install_certificates(
            assigned,
            &tls_ingresses,
            &wanted,
            &chosen,
            default_secret,
            &mut self.hosts,
            &mut self.tls_hosts,
        )
    }
}

/// Each host's Secret, by host: the Secret's key and the Ingress whose entry names it.
type Wanted<'a> = BTreeMap<&'a str, (&'a str, &'a IngressDigest)>;

/// The `spec.tls` entries that passed, by namespace: each (Secret, Ingress) once.
type Listed<'a> = FastMap<&'a str, Vec<(&'a str, &'a IngressDigest)>>;

/// A problem of the Ingress `src`.
fn tls_problem(src: &IngressRef, reason: ProblemReason, message: String) -> Problem {
    Problem {
        namespace: src.namespace.clone(),
        name: src.name.clone(),
        reason,
        message,
    }
}

/// Certificates may not be sent (plaintext gRPC without --allow-plaintext-secrets):
/// every Ingress with `spec.tls` gets a problem, and no host keeps a certificate.
fn refuse_certificates(
    tls_ingresses: &[&IngressDigest],
    tls_hosts: &mut Vec<String>,
    hosts: &mut BTreeMap<String, HostEntry>,
    problems: &mut BTreeSet<Problem>,
) {
    for d in tls_ingresses {
        problems.insert(tls_problem(
            &d.source,
            ProblemReason::TlsDisabled,
            "spec.tls ignored: the control plane serves plaintext gRPC, so it sends no private keys (use mutual TLS, or --allow-plaintext-secrets)".into(),
        ));
    }
    for host in std::mem::take(tls_hosts) {
        if let Some(entry) = hosts.get_mut(&host) {
            entry.set_tls("", false);
        }
    }
}

/// Each host's Secret from the owner's Ingresses alone: the `spec.tls` entry that lists
/// the host (the oldest Ingress decides; another Secret from a younger one is a
/// conflict), and the entries that passed, by namespace.
fn listed_secrets<'a>(
    tls_ingresses: &[&'a IngressDigest],
    hosts: &BTreeMap<String, HostEntry>,
    ownership: HostOwnership,
    problems: &mut BTreeSet<Problem>,
) -> (Wanted<'a>, Listed<'a>) {
    let mut wanted: Wanted<'a> = BTreeMap::new();
    let mut listed: Listed<'a> = FastMap::default();
    let mut seen: FastSet<(&str, *const IngressDigest)> = FastSet::default();
    for &d in tls_ingresses {
        for (host, secret) in &d.tls {
            if ownership == HostOwnership::FirstNamespace
                && let Some(entry) = hosts.get(host.as_str())
                && entry.owner != d.source.namespace
            {
                problems.insert(tls_problem(
                    &d.source,
                    ProblemReason::HostOwnedByOtherNamespace,
                    format!(
                        "spec.tls host {host:?} ignored: the host belongs to namespace {:?}, which named it first; see --host-ownership",
                        entry.owner
                    ),
                ));
                continue;
            }
            if seen.insert((secret.as_str(), d as *const IngressDigest)) {
                listed
                    .entry(d.source.namespace.as_str())
                    .or_default()
                    .push((secret, d));
            }
            match wanted.get(host.as_str()) {
                None => {
                    wanted.insert(host, (secret, d));
                }
                Some((s, w)) if *s != secret.as_str() => {
                    problems.insert(tls_problem(
                        &d.source,
                        ProblemReason::ConflictingTls,
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
    (wanted, listed)
}

/// A routed host no entry lists: the owner's first entry (oldest Ingress first) whose
/// certificate covers it, as ingress-nginx does (`hosts: ['*.shop.test']` serves the rule
/// host `www.shop.test`).
fn covering_secrets<'a>(
    hosts: &BTreeMap<String, HostEntry>,
    wanted: &Wanted<'a>,
    listed: &Listed<'a>,
    secrets_by_key: &FastMap<String, Arc<SecretDigest>>,
    last_good: &FastMap<String, Arc<SecretDigest>>,
) -> Vec<(String, &'a str, &'a IngressDigest)> {
    hosts
        .iter()
        .filter(|(host, _)| !host.is_empty() && !wanted.contains_key(host.as_str()))
        .filter_map(|(host, entry)| {
            let entries = listed.get(entry.owner.as_str())?;
            let (secret, d) = entries.iter().find(|(secret, _)| {
                secrets_by_key
                    .get(*secret)
                    .and_then(|s| s.certificate.as_ref().ok())
                    .or_else(|| {
                        last_good
                            .get(*secret)
                            .and_then(|s| s.certificate.as_ref().ok())
                    })
                    .is_some_and(|c| certificate::covers(&c.dns_names, host))
            })?;
            Some((host.clone(), *secret, *d))
        })
        .collect()
}

/// Each Secret in use, and the default certificate's: its current certificate if good,
/// else its last good one, with a problem for each Ingress using it (or for the Secret,
/// for the default certificate) when the current one is not used. `last_good` then holds
/// what was chosen, for the Secrets in use only.
fn choose_certificates<'a>(
    wanted: &Wanted<'a>,
    default_secret: Option<&'a str>,
    secrets_by_key: &FastMap<String, Arc<SecretDigest>>,
    last_good: &mut FastMap<String, Arc<SecretDigest>>,
    problems: &mut BTreeSet<Problem>,
) -> BTreeMap<&'a str, Arc<SecretDigest>> {
    let mut secrets: BTreeMap<&'a str, (Vec<&str>, Vec<&IngressRef>)> = BTreeMap::new();
    for (host, (secret, d)) in wanted {
        let e = secrets.entry(secret).or_default();
        e.0.push(host);
        if !e.1.contains(&&d.source) {
            e.1.push(&d.source);
        }
    }
    if let Some(s) = default_secret {
        secrets.entry(s).or_default();
    }
    let mut chosen: BTreeMap<&'a str, Arc<SecretDigest>> = BTreeMap::new();
    for (secret, (hosts, users)) in &secrets {
        let current = secrets_by_key.get(*secret);
        let last = last_good.get(*secret);
        let mut tell = |reason: ProblemReason, message: String| {
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
                problems.insert(tls_problem(u, reason, message.clone()));
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
                            ProblemReason::InvalidTlsSecret,
                            format!(
                                "Secret {secret:?} now holds a certificate that does not cover {dropped:?}; its hosts keep the previous certificate"
                            ),
                        );
                        last.cloned()
                    }
                }
                Err(e) => {
                    tell(
                        ProblemReason::InvalidTlsSecret,
                        format!("Secret {secret:?} {e}; {keeps}"),
                    );
                    last.cloned()
                }
            },
            None => {
                tell(
                    ProblemReason::MissingTlsSecret,
                    format!(
                        "Secret {secret:?} not found (or not of type {TLS_SECRET_TYPE}); {keeps}"
                    ),
                );
                last.cloned()
            }
        };
        if let Some(p) = pick {
            last_good.insert((*secret).to_owned(), p.clone());
            chosen.insert(secret, p);
        }
    }
    last_good.retain(|k, _| secrets.contains_key(k.as_str()));
    chosen
}

/// Each wanted host with its chosen certificate, when the certificate covers it and the
/// host is routed: (host, certificate name, whether plain HTTP is redirected), with a
/// problem for each that is not.
fn assign_hosts(
    wanted: &Wanted<'_>,
    chosen: &BTreeMap<&str, Arc<SecretDigest>>,
    by_cover: &FastSet<(&str, *const IngressDigest)>,
    hosts: &BTreeMap<String, HostEntry>,
    contributors: &FastMap<String, Vec<Arc<IngressDigest>>>,
    problems: &mut BTreeSet<Problem>,
) -> Vec<(String, String, bool)> {
    let mut assigned: Vec<(String, String, bool)> = Vec::new();
    for (host, (secret, d)) in wanted {
        let Some(cert) = chosen.get(secret).and_then(|c| c.certificate.as_ref().ok()) else {
            continue;
        };
        if !certificate::covers(&cert.dns_names, host) {
            problems.insert(tls_problem(
                &d.source,
                ProblemReason::TlsHostNotCovered,
                format!("the certificate in Secret {secret:?} does not cover host {host:?} (it names {:?}); the host gets no certificate", cert.dns_names),
            ));
            continue;
        }
        if !hosts.contains_key(*host) {
            if by_cover.contains(&(*secret, *d as *const IngressDigest)) {
                // The entry serves other hosts by its certificate.
                continue;
            }
            problems.insert(tls_problem(
                &d.source,
                ProblemReason::TlsHostWithoutRules,
                format!("spec.tls host {host:?} has no rules of its own in any Ingress of this class; it gets no certificate"),
            ));
            continue;
        }
        // Per-host settings come from the owner's Ingresses alone.
        let owner = hosts.get(*host).map(|e| e.owner.as_str());
        let redirect = d.ssl_redirect
            && contributors.get(*host).is_none_or(|list| {
                list.iter()
                    .filter(|c| Some(c.source.namespace.as_str()) == owner)
                    .all(|c| c.ssl_redirect)
            });
        assigned.push(((*host).to_owned(), cert.name.clone(), redirect));
    }
    assigned
}

/// Sets each assigned host's certificate and redirect, clears them on the hosts that had
/// one and lost it, and says what the snapshot carries: the certificates in use (the
/// default one too) and which Ingresses use each.
fn install_certificates(
    assigned: Vec<(String, String, bool)>,
    tls_ingresses: &[&IngressDigest],
    wanted: &Wanted<'_>,
    chosen: &BTreeMap<&str, Arc<SecretDigest>>,
    default_secret: Option<&str>,
    hosts: &mut BTreeMap<String, HostEntry>,
    tls_hosts: &mut Vec<String>,
) -> TlsOut {
    let mut users: BTreeSet<(String, String, String)> = BTreeSet::new();
    let served: FastMap<&str, &str> = assigned
        .iter()
        .map(|(h, c, _)| (h.as_str(), c.as_str()))
        .collect();
    for d in tls_ingresses {
        for (h, s) in &d.tls {
            if served.get(h.as_str()) == Some(&s.as_str()) {
                users.insert((s.clone(), d.source.namespace.clone(), d.source.name.clone()));
            }
        }
    }
    let kept: FastSet<&str> = served.keys().copied().collect();
    for host in std::mem::take(tls_hosts) {
        if !kept.contains(host.as_str())
            && let Some(entry) = hosts.get_mut(&host)
        {
            entry.set_tls("", false);
        }
    }
    drop(kept);
    drop(served);
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for (host, name, redirect) in assigned {
        if let Some(entry) = hosts.get_mut(&host) {
            entry.set_tls(&name, redirect);
        }
        if let Some((secret, _)) = wanted.get(host.as_str()) {
            names.insert(secret);
        }
        tls_hosts.push(host);
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
