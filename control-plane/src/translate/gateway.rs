//! The Gateway API part of a build: our Gateways' listeners and routes
//! ([`crate::gateway_api::routes`]) as snapshot resources, one `GatewayListener` per
//! address and port and one `GatewayHost` per listener and hostname. Their backends are
//! the Ingress backends' (`namespace/service:port`, resolved and kept current by the same
//! use counts and dirty-Service tracking), and the certificates of HTTPS listeners join
//! the snapshot's certificates.
//!
//! Work is in proportion to the change. Our Gateways and their listeners are resolved
//! again only when an object they are made from changed (a GatewayClass, Gateway,
//! ReferenceGrant or Namespace, a Service or a TLS Secret: then every route is attached
//! again). Otherwise only the HTTPRoutes whose `generation` moved (or that came or went)
//! are attached again, and only the hostname tables they touch, now or before, are
//! rebuilt. Resources equal to the last build's keep their shared copy, so only the
//! changed ones are hashed and sent.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::Ipv4Addr;
use std::sync::Arc;

use holdfast_proto::snapshot::{gateway_host_name, listener_name};
use holdfast_proto::v1::{
    GatewayHost, GatewayListener, GatewayRef, GatewayRoute, HeaderMatch, HeaderModifier,
    ListenerCertificates, MatchKind, PathModifier, RequestRedirect, RouteRef, RouteTimeouts,
    UrlRewrite, WeightedBackend,
};

use super::resolve::TlsOut;
use super::{BackendRef, ClusterState, Options, RouteCounts, Translator, service_port_ref};
use crate::gateway_api::attach::SecretCheck;
use crate::gateway_api::routes::{Action, HostKey, PathMatch, PortRoutes};
use crate::gateway_api::{HttpRoute, RouteKind};
use crate::gateway_api::{model, routes};

/// One built Gateway host and the backends its routes use.
pub(super) struct GatewayHostEntry {
    pub(super) host: Arc<GatewayHost>,
    pub(super) backends: Vec<Arc<BackendRef>>,
}

/// One HTTPRoute's part of the hostname tables, as last made.
struct RouteMemo {
    generation: Option<i64>,
    tables: BTreeMap<HostKey, Vec<routes::Entry>>,
}

/// The Gateway API resources of the last build, and what they were made from.
#[derive(Default)]
pub(super) struct GatewayPart {
    /// What our Gateways were resolved from (see [`environment`]); None before the first
    /// build.
    environment: Option<u64>,
    /// Our Gateways, as last resolved.
    gateways: model::Gateways,
    /// The Services, as last indexed.
    services: routes::ServicePorts,
    /// The addresses and ports served.
    served: BTreeSet<(Ipv4Addr, u16)>,
    /// Each HTTPRoute's part (by uid, else `namespace/name`).
    routes_made: HashMap<String, RouteMemo>,
    /// Which HTTPRoutes have entries in each hostname table.
    tables: BTreeMap<HostKey, BTreeSet<String>>,
    pub(super) listeners: BTreeMap<String, Arc<GatewayListener>>,
    pub(super) hosts: BTreeMap<String, GatewayHostEntry>,
    /// Listeners and hosts changed since the last build's content sum.
    pub(super) unsummed_listeners: Vec<String>,
    pub(super) unsummed_hosts: Vec<String>,
    /// The routes of the hosts (what the guard counts).
    pub(super) routes: RouteCounts,
    /// How many builds made anything again, and how many HTTPRoutes' parts were made (for
    /// tests of when they are not).
    pub(super) builds: u64,
    pub(super) route_builds: u64,
}

/// A fingerprint of what our Gateways are made from, besides Services and Secrets: each
/// GatewayClass, Gateway and ReferenceGrant by identity and `generation` (which moves
/// with its spec, not its status), each Gateway's status addresses (an address is kept
/// from there), and each Namespace by resourceVersion (its labels). HTTPRoutes are not in
/// it: each is followed on its own, by `generation`, so the leader's own status writes on
/// thousands of HTTPRoutes make nothing again.
fn environment(state: &ClusterState, opts: &Options) -> u64 {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let mut h = std::hash::DefaultHasher::new();
    opts.gateway_controller.hash(&mut h);
    opts.gateway_pool.map(|p| format!("{p:?}")).hash(&mut h);
    format!("{:?}", opts.gateway_services).hash(&mut h);
    opts.allow_certificates.hash(&mut h);
    let mut spec = |kind: u8, m: &ObjectMeta| {
        (kind, &m.namespace, &m.name, &m.uid, m.generation).hash(&mut h);
    };
    for o in &state.gateway_classes {
        spec(0, &o.metadata);
    }
    for o in &state.gateways {
        spec(1, &o.metadata);
    }
    for o in &state.reference_grants {
        spec(3, &o.metadata);
    }
    for o in &state.gateways {
        o.status["addresses"].to_string().hash(&mut h);
    }
    for o in &state.namespaces {
        (&o.metadata.name, &o.metadata.resource_version).hash(&mut h);
    }
    h.finish()
}

/// An HTTPRoute's identity: its uid, else (objects made in tests) `namespace/name`.
fn route_id(r: &HttpRoute) -> std::borrow::Cow<'_, str> {
    match &r.metadata.uid {
        Some(uid) => std::borrow::Cow::Borrowed(uid),
        None => std::borrow::Cow::Owned(format!(
            "{}/{}",
            r.metadata.namespace.as_deref().unwrap_or_default(),
            r.metadata.name.as_deref().unwrap_or_default()
        )),
    }
}

/// The backend `namespace/service:port` (as [`routes`] names it).
fn backend_ref_of(name: &str) -> Option<BackendRef> {
    let (ns, rest) = name.split_once('/')?;
    let (svc, port) = rest.rsplit_once(':')?;
    let port: i32 = port.parse().ok()?;
    Some(service_port_ref(ns, svc, port))
}

/// One route entry as the snapshot carries it.
fn route_of(e: &routes::Entry) -> GatewayRoute {
    let (match_kind, path) = match &e.path {
        PathMatch::Exact(p) => (MatchKind::Exact, p.clone()),
        PathMatch::Prefix(p) => (MatchKind::Prefix, p.clone()),
    };
    let pair = |n: &str, v: &str| HeaderMatch {
        name: n.to_ascii_lowercase(),
        value: v.to_owned(),
    };
    let mut r = GatewayRoute {
        match_kind: match_kind as i32,
        path,
        headers: e.headers.iter().map(|(n, v)| pair(n, v)).collect(),
        method: e.method.clone().unwrap_or_default(),
        query_params: e
            .query
            .iter()
            .map(|(n, v)| HeaderMatch {
                name: n.clone(),
                value: v.clone(),
            })
            .collect(),
        source: e.source.0.split_once('/').map(|(ns, name)| RouteRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            rule: u32::try_from(e.source.1).unwrap_or(u32::MAX),
            kind: match e.kind {
                RouteKind::Http => String::new(),
                other => other.name().to_owned(),
            },
        }),
        ..Default::default()
    };
    match &e.action {
        Action::Forward {
            backends,
            headers,
            response_headers,
            rewrite,
            timeouts,
            cors,
            retry,
            mirrors,
        } => {
            r.mirrors = mirrors
                .iter()
                .map(|m| {
                    let (backend, unresolved) = named_or_why(&m.backend);
                    holdfast_proto::v1::Mirror {
                        backend,
                        unresolved,
                        numerator: m.numerator,
                        denominator: m.denominator,
                    }
                })
                .collect();
            r.backends = backends
                .iter()
                .map(|w| {
                    let (backend, unresolved) = named_or_why(&w.backend);
                    WeightedBackend {
                        backend,
                        weight: w.weight,
                        unresolved,
                        request_headers: modifier_of(&w.request_headers),
                        response_headers: modifier_of(&w.response_headers),
                    }
                })
                .collect();
            r.request_headers = modifier_of(headers);
            r.response_headers = modifier_of(response_headers);
            if *timeouts != routes::Timeouts::default() {
                let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                r.timeouts = Some(RouteTimeouts {
                    request_ms: timeouts.request.map(ms),
                    backend_request_ms: timeouts.backend_request.map(ms),
                    ..RouteTimeouts::default()
                });
            }
            r.cors = cors.as_deref().cloned();
            r.retry = retry.as_deref().cloned();
            r.rewrite = rewrite.as_ref().map(|w| UrlRewrite {
                hostname: w.hostname.clone().unwrap_or_default(),
                path: w.path.as_ref().map(path_of),
            });
        }
        Action::Redirect(d) => {
            r.redirect = Some(RequestRedirect {
                scheme: d.scheme.clone().unwrap_or_default(),
                hostname: d
                    .hostname
                    .as_deref()
                    .map(str::to_ascii_lowercase)
                    .unwrap_or_default(),
                port: d.port.map_or(0, u32::from),
                status_code: u32::from(d.status),
                path: d.path.as_ref().map(path_of),
                location: String::new(),
                drop_query: false,
            });
        }
    }
    r
}

/// A backend reference as the snapshot carries it: its backend's name, or "" and why it
/// does not resolve.
fn named_or_why(b: &Result<String, crate::gateway_api::attach::Unresolved>) -> (String, String) {
    match b {
        Ok(name) => (name.clone(), String::new()),
        Err(why) => (String::new(), why.reason().to_owned()),
    }
}

/// A header modifier as the snapshot carries it (None: it changes nothing).
fn modifier_of(m: &routes::HeaderModifier) -> Option<HeaderModifier> {
    if *m == routes::HeaderModifier::default() {
        return None;
    }
    let pair = |h: &routes::NameValue| HeaderMatch {
        name: h.name.to_ascii_lowercase(),
        value: h.value.clone(),
    };
    Some(HeaderModifier {
        set: m.set.iter().map(pair).collect(),
        add: m.add.iter().map(pair).collect(),
        remove: m.remove.iter().map(|n| n.to_ascii_lowercase()).collect(),
    })
}

/// A path modifier as the snapshot carries it.
fn path_of(m: &routes::PathModifier) -> PathModifier {
    PathModifier {
        full: m.full,
        value: m.value.clone(),
        captures: false,
    }
}

/// The listener of one address and port.
fn listener_of(
    p: &PortRoutes,
    gateway: Option<GatewayRef>,
    certificates_allowed: bool,
) -> GatewayListener {
    let address = p.address.to_string();
    GatewayListener {
        name: listener_name(&address, u32::from(p.port)),
        address,
        port: u32::from(p.port),
        protocol: p.protocol.clone(),
        certificates: if certificates_allowed {
            p.certificates
                .iter()
                .map(|(hostname, certs)| ListenerCertificates {
                    hostname: hostname.clone(),
                    certificates: certs.clone(),
                })
                .collect()
        } else {
            Vec::new()
        },
        gateway,
        public_port: if p.public_port == p.port {
            0
        } else {
            u32::from(p.public_port)
        },
    }
}

/// The snapshot name of a hostname table.
fn host_name_of((address, port, host): &HostKey) -> String {
    gateway_host_name(&listener_name(&address.to_string(), u32::from(*port)), host)
}

/// The Gateway host of a hostname table with `entries` (in precedence order).
fn host_of((address, port, host): &HostKey, entries: &[routes::Entry]) -> GatewayHost {
    let listener = listener_name(&address.to_string(), u32::from(*port));
    GatewayHost {
        name: gateway_host_name(&listener, host),
        listener,
        host: host.clone(),
        routes: entries.iter().map(route_of).collect(),
        ..Default::default()
    }
}

impl Translator {
    /// Brings the Gateway API resources up to date: everything again if what our Gateways
    /// are made from changed (`others_changed`: a Service or TLS Secret did), else only the
    /// HTTPRoutes that changed and the hostname tables they touch. Releases the backends
    /// of the hosts that changed or went and acquires those of the new ones (noted in
    /// `new`).
    pub(super) fn rebuild_gateways(
        &mut self,
        state: &ClusterState,
        opts: &Options,
        others_changed: bool,
        new: &mut Vec<Arc<BackendRef>>,
    ) {
        let environment = environment(state, opts);
        let everything = others_changed || self.gateway.environment != Some(environment);
        let mut dirty: BTreeSet<HostKey> = BTreeSet::new();
        let mut gone_hosts: Vec<String> = Vec::new();
        if everything {
            self.gateway.environment = Some(environment);
            self.resolve_gateways(state, opts);
            let part = &mut self.gateway;
            part.routes_made.clear();
            part.tables.clear();
            gone_hosts = part.hosts.keys().cloned().collect();
        }
        let part = &mut self.gateway;
        // The HTTPRoutes made again: new, gone, or at another generation.
        let mut changed: Vec<(String, Option<&Arc<HttpRoute>>)> = Vec::new();
        let mut known = 0;
        for r in &state.http_routes {
            let id = route_id(r);
            match part.routes_made.get(id.as_ref()) {
                Some(m) if m.generation == r.metadata.generation => known += 1,
                Some(_) => {
                    known += 1;
                    changed.push((id.into_owned(), Some(r)));
                }
                None => changed.push((id.into_owned(), Some(r))),
            }
        }
        if part.routes_made.len() > known {
            let present: HashSet<std::borrow::Cow<'_, str>> =
                state.http_routes.iter().map(|r| route_id(r)).collect();
            changed.extend(
                part.routes_made
                    .keys()
                    .filter(|id| !present.contains(id.as_str()))
                    .map(|id| (id.clone(), None)),
            );
        }
        if !everything && changed.is_empty() {
            return;
        }
        part.builds += 1;
        let served = |a: Ipv4Addr, p: u16| part.served.contains(&(a, p));
        let made: Vec<(String, Option<RouteMemo>)> = changed
            .into_iter()
            .map(|(id, route)| {
                let memo = route.map(|r| {
                    let attachments = model::parse_route(r)
                        .map(|spec| part.gateways.attach(r, &spec))
                        .unwrap_or_default();
                    let (tables, _refused) = routes::route_entries(
                        &attachments,
                        &part.gateways.gateways,
                        &served,
                        &state.reference_grants,
                        &part.services,
                    );
                    RouteMemo {
                        generation: r.metadata.generation,
                        tables,
                    }
                });
                (id, memo)
            })
            .collect();
        for (id, memo) in made {
            if let Some(old) = part.routes_made.remove(&id) {
                for key in old.tables.into_keys() {
                    if let Some(ids) = part.tables.get_mut(&key) {
                        ids.remove(&id);
                        if ids.is_empty() {
                            part.tables.remove(&key);
                        }
                    }
                    dirty.insert(key);
                }
            }
            if let Some(memo) = memo {
                part.route_builds += 1;
                for key in memo.tables.keys() {
                    part.tables
                        .entry(key.clone())
                        .or_default()
                        .insert(id.clone());
                    dirty.insert(key.clone());
                }
                part.routes_made.insert(id, memo);
            }
        }
        // The dirty tables, made again from the parts of the routes in them.
        let mut hosts: BTreeMap<String, Option<GatewayHost>> =
            gone_hosts.into_iter().map(|name| (name, None)).collect();
        for key in &dirty {
            let mut entries: Vec<routes::Entry> = part
                .tables
                .get(key)
                .into_iter()
                .flatten()
                .filter_map(|id| part.routes_made.get(id)?.tables.get(key))
                .flatten()
                .cloned()
                .collect();
            routes::in_precedence(&mut entries);
            let host = (!entries.is_empty()).then(|| host_of(key, &entries));
            hosts.insert(host_name_of(key), host);
        }
        self.install_gateway_hosts(hosts, new);
    }

    /// Resolves our Gateways and their listeners again, keeping the shared copy of each
    /// unchanged listener.
    fn resolve_gateways(&mut self, state: &ClusterState, opts: &Options) {
        let secrets = &self.secrets_by_key;
        let gateways = model::resolve_gateways(
            state,
            &opts.gateway_controller,
            opts.gateway_pool.as_ref(),
            opts.gateway_services.as_ref(),
            |ns, name| match secrets.get(&format!("{ns}/{name}")) {
                None => SecretCheck::Missing,
                Some(d) if d.certificate.is_ok() => SecretCheck::Usable,
                Some(_) => SecretCheck::Invalid,
            },
        );
        let ports = routes::listeners(&gateways.gateways);
        let mut listeners: BTreeMap<String, Arc<GatewayListener>> = ports
            .values()
            .map(|p| {
                let g = &gateways.gateways[p.gateway];
                let gateway = GatewayRef {
                    namespace: g.namespace.clone(),
                    name: g.name.clone(),
                    generation: g.object.metadata.generation.unwrap_or_default(),
                };
                let l = listener_of(p, Some(gateway), opts.allow_certificates);
                (l.name.clone(), Arc::new(l))
            })
            .collect();
        let part = &mut self.gateway;
        part.served = ports.keys().copied().collect();
        part.gateways = gateways;
        part.services = routes::ServicePorts::of(state);
        for (name, old) in &part.listeners {
            match listeners.get(name) {
                Some(new) if new == old => {}
                _ => part.unsummed_listeners.push(name.clone()),
            }
        }
        for (name, l) in listeners.iter_mut() {
            match part.listeners.get(name) {
                Some(old) if old == l => *l = old.clone(),
                Some(_) => {}
                None => part.unsummed_listeners.push(name.clone()),
            }
        }
        part.listeners = listeners;
    }

    /// Installs the hosts made again (None: gone), keeping the shared copy of an unchanged
    /// one: releases what went or changed, acquires what came or changed.
    fn install_gateway_hosts(
        &mut self,
        hosts: BTreeMap<String, Option<GatewayHost>>,
        new: &mut Vec<Arc<BackendRef>>,
    ) {
        let part = &mut self.gateway;
        for (name, host) in hosts {
            if let Some(old) = part.hosts.get(&name) {
                if host.as_ref() == Some(&*old.host) {
                    continue;
                }
                let old = part.hosts.remove(&name).expect("present");
                let c = RouteCounts::of_gateway_host(&old.host);
                part.routes.routes -= c.routes;
                part.routes.keys -= c.keys;
                for b in &old.backends {
                    self.backends.release(b);
                }
                part.unsummed_hosts.push(name.clone());
            }
            let Some(host) = host else { continue };
            let mut backends: Vec<Arc<BackendRef>> =
                holdfast_proto::snapshot::gateway_host_backends(&host)
                    .filter_map(backend_ref_of)
                    .map(Arc::new)
                    .collect();
            backends.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            backends.dedup_by(|a, b| a.name == b.name);
            for b in &backends {
                self.backends.acquire(b, new);
            }
            let c = RouteCounts::of_gateway_host(&host);
            part.routes.routes += c.routes;
            part.routes.keys += c.keys;
            part.unsummed_hosts.push(name.clone());
            part.hosts.insert(
                name,
                GatewayHostEntry {
                    host: Arc::new(host),
                    backends,
                },
            );
        }
    }

    /// How many times the Gateway API resources have been built.
    #[cfg(test)]
    pub(super) fn gateway_builds(&self) -> u64 {
        self.gateway.builds
    }

    /// The certificates of the HTTPS Gateway listeners (those the snapshot does not carry
    /// for Ingress already), from the TLS Secrets as they are now.
    pub(super) fn gateway_certificates(&self, tls: &mut TlsOut) {
        let mut wanted: Vec<&str> = self
            .gateway
            .listeners
            .values()
            .flat_map(|l| holdfast_proto::snapshot::listener_certificates(l))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let before = tls.certificates.len();
        for name in wanted {
            if tls.certificates[..before]
                .binary_search_by(|c| c.name.as_str().cmp(name))
                .is_ok()
            {
                continue;
            }
            if let Some(c) = self
                .secrets_by_key
                .get(name)
                .and_then(|d| d.certificate.as_ref().ok())
            {
                tls.certificates.push(c.clone());
            }
        }
        tls.certificates.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::PortRef;

    #[test]
    fn backend_names_parse_back_into_references() {
        let b = backend_ref_of("gateway-conformance-infra/infra-backend-v1:8080").unwrap();
        assert_eq!(b.namespace(), "gateway-conformance-infra");
        assert_eq!(b.service(), "infra-backend-v1");
        assert_eq!(b.port(), PortRef::Number(8080));
        assert_eq!(b.name, "gateway-conformance-infra/infra-backend-v1:8080");
        assert!(backend_ref_of("no-slash:80").is_none());
        assert!(backend_ref_of("ns/svc:http").is_none());
    }
}
