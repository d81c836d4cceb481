//! Our Gateways and what attaches to them, resolved once from the caches: what both the
//! status the leader writes ([`super::status`]) and the routes the proxies serve
//! ([`super::routes`]) are made from, so that the two can never disagree.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::attach::{
    self, GatewaySpec, Hostnames, HttpRouteSpec, Listener, NotAttached, SecretCheck,
};
use super::services::ServiceMode;
use super::status::Pool;
use super::{GROUP, Gateway, HttpRoute};
use crate::translate::ClusterState;

/// A Gateway of one of our accepted GatewayClasses.
#[derive(Debug, Clone)]
pub struct OurGateway {
    /// The object.
    pub object: Arc<Gateway>,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its spec, parsed.
    pub spec: GatewaySpec,
    /// Its listeners, checked (same order as the spec's).
    pub listeners: Vec<Listener>,
    /// The address the proxies bind its listeners on: its own from the pool, or the bind
    /// address when Gateways have Services; None: not served.
    pub address: Option<Ipv4Addr>,
    /// With Services: each listener port's container port (a port missing: not served).
    /// None: the listeners' own ports are bound.
    pub ports: Option<BTreeMap<u16, u16>>,
    /// Its `status.addresses`: its pool address, or its Service's addresses.
    pub addresses: Vec<Value>,
    /// With Services: its Service maps every listener port to its container port, as
    /// assigned (a write still to be made, or refused, leaves it false). Always true
    /// without Services.
    pub service_matches: bool,
}

impl OurGateway {
    /// The port the proxies bind for listener port `port` (None: not served).
    pub fn bind_port(&self, port: u16) -> Option<u16> {
        match &self.ports {
            None => Some(port),
            Some(mapped) => mapped.get(&port).copied(),
        }
    }
}

/// One `parentRef` of an HTTPRoute that names a Gateway of ours.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// The route.
    pub route: Arc<HttpRoute>,
    /// Its spec, parsed.
    pub spec: Arc<HttpRouteSpec>,
    /// The `parentRef` as written in the route (echoed in its status).
    pub parent_ref: Value,
    /// Index into [`Resolved::gateways`].
    pub gateway: usize,
    /// The listeners (indices into the Gateway's) it attaches to, with the hostnames it
    /// serves on each, or why it attaches to none.
    pub result: Result<Vec<(usize, Hostnames)>, NotAttached>,
}

/// Our Gateways (oldest first) and every attachment to them (routes in cache order).
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// Gateways of our classes.
    pub gateways: Vec<OurGateway>,
    /// Each HTTPRoute `parentRef` naming one of them.
    pub attachments: Vec<Attachment>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// The FNV-1a hash of `s`: a Gateway's first-choice slot in the pool.
fn slot(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

/// Our Gateways (oldest first, with their addresses) and what attaching a route to them
/// needs: made once from the Gateway API objects other than routes, then used for each
/// HTTPRoute ([`Gateways::attach`]).
#[derive(Debug, Clone, Default)]
pub struct Gateways {
    /// Gateways of our classes.
    pub gateways: Vec<OurGateway>,
    /// `namespace/name` → index into `gateways`.
    index: HashMap<String, usize>,
    /// Every cached namespace's labels (none: an empty map, which a selector can match).
    labels: HashMap<String, BTreeMap<String, String>>,
}

/// Resolves our Gateways (class `spec.controllerName` = `controller`), their listeners and
/// addresses, and every HTTPRoute `parentRef` to them. `secret` says what a listener's
/// Secret reference is.
pub fn resolve(
    state: &ClusterState,
    controller: &str,
    pool: Option<&Pool>,
    services: Option<&ServiceMode>,
    secret: impl Fn(&str, &str) -> SecretCheck,
) -> Resolved {
    let gateways = resolve_gateways(state, controller, pool, services, secret);
    let mut attachments = Vec::new();
    for route in &state.http_routes {
        if let Some(spec) = parse_route(route) {
            attachments.extend(gateways.attach(route, &spec));
        }
    }
    Resolved {
        gateways: gateways.gateways,
        attachments,
    }
}

/// An HTTPRoute's spec, parsed (None: it does not parse, and attaches nowhere).
pub fn parse_route(route: &HttpRoute) -> Option<Arc<HttpRouteSpec>> {
    // From the cached value in place (no copy of the spec first).
    HttpRouteSpec::deserialize(&route.spec).ok().map(Arc::new)
}

/// Our Gateways, their listeners and addresses (see [`resolve`]): from `pool`, or (with
/// `services`) a Service each.
pub fn resolve_gateways(
    state: &ClusterState,
    controller: &str,
    pool: Option<&Pool>,
    services: Option<&ServiceMode>,
    secret: impl Fn(&str, &str) -> SecretCheck,
) -> Gateways {
    let classes: BTreeSet<&str> = state
        .gateway_classes
        .iter()
        .filter(|c| c.spec["controllerName"].as_str() == Some(controller))
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let mut gateways: Vec<OurGateway> = state
        .gateways
        .iter()
        .filter_map(|g| {
            let spec = GatewaySpec::deserialize(&g.spec).ok()?;
            if !classes.contains(spec.gateway_class_name.as_str()) {
                return None;
            }
            let namespace = g.metadata.namespace.clone()?;
            let name = g.metadata.name.clone()?;
            let listeners = attach::listeners(&namespace, &spec, &state.reference_grants, &secret);
            Some(OurGateway {
                object: g.clone(),
                namespace,
                name,
                spec,
                listeners,
                address: None,
                ports: None,
                addresses: Vec::new(),
                service_matches: true,
            })
        })
        .collect();
    // Oldest first: the older Gateway keeps a contested address.
    gateways.sort_by(|a, b| {
        let at = |g: &OurGateway| {
            (
                g.object.metadata.creation_timestamp.clone().map(|t| t.0),
                key(&g.namespace, &g.name),
            )
        };
        at(a).cmp(&at(b))
    });
    if let Some(pool) = pool {
        assign(pool, &mut gateways);
    } else if let Some(mode) = services {
        super::services::assign(mode, controller, state, &mut gateways);
    }
    let index = gateways
        .iter()
        .enumerate()
        .map(|(i, g)| (key(&g.namespace, &g.name), i))
        .collect();
    let labels = state
        .namespaces
        .iter()
        .filter_map(|n| {
            Some((
                n.metadata.name.clone()?,
                n.metadata.labels.clone().unwrap_or_default(),
            ))
        })
        .collect();
    Gateways {
        gateways,
        index,
        labels,
    }
}

impl Gateways {
    /// Each `parentRef` of `route` (its spec parsed: `spec`) that names one of our
    /// Gateways, attached or with why not.
    pub fn attach(&self, route: &Arc<HttpRoute>, spec: &Arc<HttpRouteSpec>) -> Vec<Attachment> {
        let Some(route_ns) = route.metadata.namespace.as_deref() else {
            return Vec::new();
        };
        let written: Vec<Value> = route.spec["parentRefs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut attachments = Vec::new();
        for (parent, as_written) in spec.parent_refs.iter().zip(written) {
            if parent.group.as_deref().unwrap_or(GROUP) != GROUP
                || parent.kind.as_deref().unwrap_or("Gateway") != "Gateway"
            {
                continue;
            }
            let gw_ns = parent.namespace.as_deref().unwrap_or(route_ns);
            let Some(&i) = self.index.get(&key(gw_ns, &parent.name)) else {
                continue;
            };
            let g = &self.gateways[i];
            let result = attach::attach(
                (route.kind, parent),
                route_ns,
                &spec.hostnames,
                gw_ns,
                &g.spec,
                &g.listeners,
                self.labels.get(route_ns),
            )
            .map(|on| {
                on.into_iter()
                    .filter_map(|(l, h)| {
                        let at = g.listeners.iter().position(|x| std::ptr::eq(x, l))?;
                        Some((at, h))
                    })
                    .collect()
            });
            attachments.push(Attachment {
                route: route.clone(),
                spec: spec.clone(),
                parent_ref: as_written,
                gateway: i,
                result,
            });
        }
        attachments
    }
}

/// Each Gateway's address (oldest first): the one its status holds if it is in the pool
/// and no older Gateway holds it, else the first free one from a slot chosen by its name.
fn assign(pool: &Pool, gateways: &mut [OurGateway]) {
    let mut taken: BTreeSet<Ipv4Addr> = BTreeSet::new();
    let mut waiting = Vec::new();
    for (i, g) in gateways.iter_mut().enumerate() {
        let held = g.object.status["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["value"].as_str()?.parse::<Ipv4Addr>().ok())
            .find(|ip| pool.contains(*ip) && !taken.contains(ip));
        match held {
            Some(ip) => {
                taken.insert(ip);
                g.address = Some(ip);
                g.addresses = vec![ip_address(ip)];
            }
            None => waiting.push(i),
        }
    }
    for i in waiting {
        let g = &mut gateways[i];
        let start = slot(&key(&g.namespace, &g.name)) % pool.count();
        if let Some(ip) = (0..pool.count())
            .map(|n| pool.nth(start + n))
            .find(|ip| !taken.contains(ip))
        {
            taken.insert(ip);
            g.address = Some(ip);
            g.addresses = vec![ip_address(ip)];
        }
    }
}

fn ip_address(ip: Ipv4Addr) -> Value {
    serde_json::json!({ "type": "IPAddress", "value": ip.to_string() })
}
