//! The Gateway API part of a build: our Gateways' listeners and routes
//! ([`crate::gateway_api::routes`]) as snapshot resources, one `GatewayListener` per
//! address and port and one `GatewayHost` per listener and hostname. Their backends are
//! the Ingress backends' (`namespace/service:port`, resolved and kept current by the same
//! use counts and dirty-Service tracking), and the certificates of HTTPS listeners join
//! the snapshot's certificates.
//!
//! The routes are made again only when an object they are made from changed (a Gateway
//! API kind, a Namespace, a Service or a TLS Secret); resources equal to the last build's
//! keep their shared copy, so only the changed ones are hashed and sent.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use holdfast_proto::snapshot::{gateway_host_name, listener_name};
use holdfast_proto::v1::{
    GatewayHost, GatewayListener, GatewayRef, GatewayRoute, HeaderMatch, HeaderModifier,
    ListenerCertificates, MatchKind, RequestRedirect, RouteRef, WeightedBackend,
};

use super::*;
use crate::gateway_api::attach::SecretCheck;
use crate::gateway_api::routes::{Action, PathMatch, PortRoutes};
use crate::gateway_api::{model, routes};

/// One built Gateway host and the backends its routes use.
pub(super) struct GatewayHostEntry {
    pub(super) host: Arc<GatewayHost>,
    pub(super) backends: Vec<Arc<BackendRef>>,
}

/// The Gateway API resources of the last build.
#[derive(Default)]
pub(super) struct GatewayPart {
    /// What the last build was made from (see [`inputs`]); None before the first.
    inputs: Option<u64>,
    pub(super) listeners: BTreeMap<String, Arc<GatewayListener>>,
    pub(super) hosts: BTreeMap<String, GatewayHostEntry>,
    /// Listeners and hosts changed since the last build's content sum.
    pub(super) unsummed_listeners: Vec<String>,
    pub(super) unsummed_hosts: Vec<String>,
    /// The routes of the hosts (what the guard counts).
    pub(super) routes: RouteCounts,
    /// How many times the resources were built (for tests of when they are not).
    pub(super) builds: u64,
}

/// A fingerprint of what the routes are made from among the Gateway API objects and
/// Namespaces: each GatewayClass, Gateway, HTTPRoute and ReferenceGrant by identity and
/// `generation` (which moves with its spec, not its status), each Gateway's status
/// addresses (an address is kept from there), and each Namespace by resourceVersion (its
/// labels). Equal fingerprints, same routes (given the same Services and Secrets): the
/// leader's own status writes on thousands of HTTPRoutes rebuild nothing.
fn inputs(state: &ClusterState, opts: &Options) -> u64 {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let mut h = std::hash::DefaultHasher::new();
    opts.gateway_controller.hash(&mut h);
    opts.gateway_pool.map(|p| format!("{p:?}")).hash(&mut h);
    let mut spec = |kind: u8, m: &ObjectMeta| {
        (kind, &m.namespace, &m.name, &m.uid, m.generation).hash(&mut h);
    };
    for o in &state.gateway_classes {
        spec(0, &o.metadata);
    }
    for o in &state.gateways {
        spec(1, &o.metadata);
    }
    for o in &state.http_routes {
        spec(2, &o.metadata);
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
        source: e.source.0.split_once('/').map(|(ns, name)| RouteRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            rule: u32::try_from(e.source.1).unwrap_or(u32::MAX),
        }),
        ..Default::default()
    };
    match &e.action {
        Action::Forward { backends, headers } => {
            r.backends = backends
                .iter()
                .map(|w| match &w.backend {
                    Ok(name) => WeightedBackend {
                        backend: name.clone(),
                        weight: w.weight,
                        unresolved: String::new(),
                    },
                    Err(why) => WeightedBackend {
                        backend: String::new(),
                        weight: w.weight,
                        unresolved: why.reason().to_owned(),
                    },
                })
                .collect();
            if *headers != routes::HeaderModifier::default() {
                r.request_headers = Some(HeaderModifier {
                    set: headers
                        .set
                        .iter()
                        .map(|h| pair(&h.name, &h.value))
                        .collect(),
                    add: headers
                        .add
                        .iter()
                        .map(|h| pair(&h.name, &h.value))
                        .collect(),
                    remove: headers
                        .remove
                        .iter()
                        .map(|n| n.to_ascii_lowercase())
                        .collect(),
                });
            }
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
            });
        }
    }
    r
}

/// The resources of one address and port.
fn resources_of(
    p: &PortRoutes,
    gateway: Option<GatewayRef>,
    certificates_allowed: bool,
) -> (GatewayListener, Vec<GatewayHost>) {
    let address = p.address.to_string();
    let name = listener_name(&address, u32::from(p.port));
    let listener = GatewayListener {
        name: name.clone(),
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
    };
    let hosts = p
        .hosts
        .iter()
        .map(|(host, entries)| GatewayHost {
            name: gateway_host_name(&name, host),
            listener: name.clone(),
            host: host.clone(),
            routes: entries.iter().map(route_of).collect(),
        })
        .collect();
    (listener, hosts)
}

impl Translator {
    /// Builds the Gateway API resources again if what they are made from changed
    /// (`others_changed`: a Service or TLS Secret did), releasing the backends of the
    /// hosts that changed or went and acquiring those of the new ones (noted in `new`).
    pub(super) fn rebuild_gateways(
        &mut self,
        state: &ClusterState,
        opts: &Options,
        others_changed: bool,
        new: &mut Vec<Arc<BackendRef>>,
    ) {
        let fingerprint = inputs(state, opts);
        if !others_changed && self.gateway.inputs == Some(fingerprint) {
            return;
        }
        self.gateway.inputs = Some(fingerprint);
        self.gateway.builds += 1;
        let secrets = &self.secrets_by_key;
        let resolved = model::resolve(
            state,
            &opts.gateway_controller,
            opts.gateway_pool.as_ref(),
            |ns, name| match secrets.get(&format!("{ns}/{name}")) {
                None => SecretCheck::Missing,
                Some(d) if d.certificate.is_ok() => SecretCheck::Usable,
                Some(_) => SecretCheck::Invalid,
            },
        );
        let by_address: BTreeMap<std::net::Ipv4Addr, GatewayRef> = resolved
            .gateways
            .iter()
            .filter_map(|g| {
                Some((
                    g.address?,
                    GatewayRef {
                        namespace: g.namespace.clone(),
                        name: g.name.clone(),
                        generation: g.object.metadata.generation.unwrap_or_default(),
                    },
                ))
            })
            .collect();
        let (ports, _refused) = routes::routes(&resolved, state);
        let mut listeners: BTreeMap<String, Arc<GatewayListener>> = BTreeMap::new();
        let mut hosts: BTreeMap<String, GatewayHost> = BTreeMap::new();
        for p in &ports {
            let (l, hs) = resources_of(
                p,
                by_address.get(&p.address).cloned(),
                opts.allow_certificates,
            );
            hosts.extend(hs.into_iter().map(|g| (g.name.clone(), g)));
            listeners.insert(l.name.clone(), Arc::new(l));
        }
        let part = &mut self.gateway;
        // Listeners: keep the shared copy of an unchanged one.
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
        // Hosts: release what went or changed, acquire what came or changed.
        let gone: Vec<String> = part
            .hosts
            .iter()
            .filter(|(name, old)| hosts.get(*name).is_none_or(|new| *new != *old.host))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(old) = part.hosts.remove(&name) {
                let c = RouteCounts::of_gateway_host(&old.host);
                part.routes.routes -= c.routes;
                part.routes.keys -= c.keys;
                for b in &old.backends {
                    self.backends.release(b);
                }
            }
            part.unsummed_hosts.push(name);
        }
        for (name, host) in hosts {
            if part.hosts.contains_key(&name) {
                continue;
            }
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
