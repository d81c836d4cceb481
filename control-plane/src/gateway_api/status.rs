//! What the leader writes on our Gateways and on the HTTPRoutes attached to them, computed
//! from the caches by one pure function ([`desired`]); the leader's loop writes only what
//! differs from the cached status.
//!
//! - A Gateway is ours when its class is one of our accepted GatewayClasses. It gets an
//!   address from `--gateway-address-pool` ([`Pool`]): the one its status already holds
//!   if that is in the pool and no older Gateway holds it, else the first free one from a
//!   slot chosen by its name (so that Gateways keep their addresses as others come and go).
//! - Its conditions: `Accepted` (`Accepted`; `ListenersNotValid` when a listener is not
//!   usable, False when none is), `Programmed` True once a proxy has ACKed a snapshot
//!   with the Gateway at its current generation (`served`), else False (`Pending`;
//!   `AddressNotAssigned` without a pool or a free address; `Invalid` with no usable
//!   listener). Each listener: `supportedKinds`, `attachedRoutes` (routes, each counted
//!   once; a listener whose references do not resolve still takes routes), and
//!   `Accepted`, `Programmed` (True when the Gateway is and the listener is usable; else
//!   `Pending`, or `Invalid` for a listener that is not usable), `ResolvedRefs` and
//!   `Conflicted` from [`super::attach::listeners`].
//! - An HTTPRoute's `status.parents` keeps other controllers' entries and has one entry
//!   per `parentRef` naming a Gateway of ours: `Accepted` (or why not, from
//!   [`super::attach::attach`]) and `ResolvedRefs` (or the first backendRef's reason, from
//!   [`super::attach::backend_ref`]).
//!
//! Every condition carries the object's generation, and keeps its transition time while
//! its status does not change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;

use holdfast_lock::Lock;
use serde::Deserialize;
use serde_json::{Value, json};

use super::attach::{self, ObjectRef, SecretCheck};
use super::services::ServiceMode;
use super::{GROUP, condition, model};
use crate::translate::ClusterState;

/// `--gateway-address-pool`: the IPv4 addresses Gateways get (every address of the CIDR;
/// in a /31 or larger, the first and last are left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    first: u32,
    count: u32,
}

impl Pool {
    /// Parses `a.b.c.d/len` (len 8 to 32).
    pub fn parse(cidr: &str) -> Result<Pool, String> {
        let (addr, len) = cidr
            .split_once('/')
            .ok_or_else(|| format!("{cidr:?} is not a CIDR (a.b.c.d/len)"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
        let len: u32 = len
            .parse()
            .ok()
            .filter(|l| (8..=32).contains(l))
            .ok_or_else(|| format!("prefix length {len:?} must be 8 to 32"))?;
        let size = 1u64 << (32 - len);
        let base = u32::from(addr) & (u32::MAX.checked_shl(32 - len).unwrap_or(0));
        let (first, count) = if size >= 4 {
            (base + 1, (size - 2) as u32)
        } else {
            (base, size as u32)
        };
        Ok(Pool { first, count })
    }

    /// Whether `ip` is one of the pool's addresses.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let ip = u32::from(ip);
        ip >= self.first && ip - self.first < self.count
    }

    /// How many addresses it has.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Its `i`-th address (modulo its size).
    pub fn nth(&self, i: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.first + i % self.count)
    }
}

/// One status to write: the object and the `status` fields holdfast owns.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The object's resourceVersion as cached (the write's precondition).
    pub resource_version: Option<String>,
    /// The `status` to merge.
    pub status: Value,
}

/// The passes made, and each attached route's dropped rules (the `PartiallyInvalid`
/// message, None: none) by uid: the generation they were read at, and the last pass that
/// saw the route. A route's spec is read again only when its generation changes, not on
/// every status pass.
#[allow(clippy::type_complexity)]
static DROPPED: std::sync::Mutex<(u64, BTreeMap<String, (i64, u64, Option<String>)>)> =
    std::sync::Mutex::new((0, BTreeMap::new()));

/// Everything the leader should write now: the Gateways and HTTPRoutes whose status
/// differs from what it should be.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Desired {
    /// Gateways.
    pub gateways: Vec<Write>,
    /// HTTPRoutes and GRPCRoutes, each with its kind.
    pub routes: Vec<(super::RouteKind, Write)>,
}

/// What should be written on our Gateways and their HTTPRoutes, given the caches and
/// `served`: the (`namespace/name`, generation) of every Gateway a proxy serves (it has
/// ACKed a snapshot with that Gateway's listeners at that generation).
pub fn desired(
    state: &ClusterState,
    controller: &str,
    pool: Option<&Pool>,
    services: Option<&ServiceMode>,
    served: &BTreeSet<(String, i64)>,
    now: &str,
    secret: impl Fn(&str, &str) -> SecretCheck,
) -> Desired {
    let resolved = model::resolve(state, controller, pool, services, secret);
    let services: BTreeSet<(&str, &str)> = state
        .services
        .iter()
        .filter_map(|s| {
            Some((
                s.metadata.namespace.as_deref()?,
                s.metadata.name.as_deref()?,
            ))
        })
        .collect();
    let grants = &state.reference_grants;
    // The routes (by address) attached to each (Gateway, listener): a route counts once.
    let mut attached: HashMap<(usize, usize), BTreeSet<usize>> = HashMap::new();
    let mut out = Desired::default();

    // The attachments of each route, in order (they are grouped by route).
    let mut by_route: Vec<(&Arc<super::HttpRoute>, Vec<&model::Attachment>)> = Vec::new();
    for a in &resolved.attachments {
        match by_route.last_mut() {
            Some((r, list)) if Arc::ptr_eq(r, &a.route) => list.push(a),
            _ => by_route.push((&a.route, vec![a])),
        }
    }
    // Indexed only when some route's dropped rules are read (its generation is new).
    let ports = std::cell::OnceCell::new();
    let mut memo = DROPPED.locked();
    memo.0 = memo.0.wrapping_add(1);
    let pass = memo.0;
    for (route, attachments) in by_route {
        let route_ns = route.metadata.namespace.as_deref().unwrap_or_default();
        let generation = route.metadata.generation.unwrap_or(0);
        // Rules (or their matches or filters) left out: the route is served without them,
        // and says so (the specification's "Dropped Rule" form of PartiallyInvalid).
        // Which are left out depends on the route's spec alone (a backend that does not
        // resolve is ResolvedRefs', not a dropped rule): remembered per generation.
        // Its uid (every object the API server made has one), else kind and name.
        let key: std::borrow::Cow<'_, str> = match route.metadata.uid.as_deref() {
            Some(uid) => uid.into(),
            None => format!(
                "{} {}/{}",
                route.kind.name(),
                route_ns,
                route.metadata.name.as_deref().unwrap_or_default()
            )
            .into(),
        };
        let dropped = match memo.1.get_mut(key.as_ref()) {
            Some((g, seen, dropped)) if *g == generation => {
                *seen = pass;
                dropped.clone()
            }
            _ => {
                let ports = ports.get_or_init(|| super::routes::ServicePorts::of(state));
                let dropped = super::routes::dropped_rules(route, grants, ports);
                let dropped = (!dropped.is_empty()).then(|| {
                    let each: Vec<String> = dropped
                        .iter()
                        .map(|d| format!("rule {}: {}", d.rule, d.reason))
                        .collect();
                    format!("Dropped Rule(s): {}", each.join("; "))
                });
                memo.1
                    .insert(key.into_owned(), (generation, pass, dropped.clone()));
                dropped
            }
        };
        let resolved_refs = resolved_refs(&route.spec, route.kind, route_ns, grants, |ns, name| {
            services.contains(&(ns, name))
        });
        let current_parents: &[Value] = route.status["parents"]
            .as_array()
            .map_or(&[], Vec::as_slice);
        let mut parents: Vec<Value> = current_parents
            .iter()
            .filter(|p| p["controllerName"].as_str() != Some(controller))
            .cloned()
            .collect();
        for a in attachments {
            // Our entry for this parent as written (its `conditions` are what
            // `condition` keeps the transition times of).
            let current = current_parents
                .iter()
                .find(|p| {
                    p["controllerName"].as_str() == Some(controller)
                        && p["parentRef"] == a.parent_ref
                })
                .unwrap_or(&Value::Null);
            let accepted = match &a.result {
                Ok(on) => {
                    for (l, _) in on {
                        attached
                            .entry((a.gateway, *l))
                            .or_default()
                            .insert(Arc::as_ptr(&a.route) as usize);
                    }
                    condition(
                        current, "Accepted", "True", "Accepted", "attached", generation, now,
                    )
                }
                Err(why) => condition(
                    current,
                    "Accepted",
                    "False",
                    why.reason(),
                    "the route attaches to no listener of this parent",
                    generation,
                    now,
                ),
            };
            let refs = match &resolved_refs {
                Ok(()) => condition(
                    current,
                    "ResolvedRefs",
                    "True",
                    "ResolvedRefs",
                    "every backendRef resolves",
                    generation,
                    now,
                ),
                Err((reason, message)) => condition(
                    current,
                    "ResolvedRefs",
                    "False",
                    reason,
                    message,
                    generation,
                    now,
                ),
            };
            // Built in place: `json!` would copy each value through its serializer (this
            // runs for every route on every pass).
            let mut conditions = vec![accepted, refs];
            if let Some(message) = &dropped {
                conditions.push(condition(
                    current,
                    "PartiallyInvalid",
                    "True",
                    "UnsupportedValue",
                    message,
                    generation,
                    now,
                ));
            }
            let entry = serde_json::Map::from_iter([
                ("parentRef".to_owned(), a.parent_ref.clone()),
                ("controllerName".to_owned(), Value::from(controller)),
                ("conditions".to_owned(), Value::Array(conditions)),
            ]);
            parents.push(Value::Object(entry));
        }
        if parents != current_parents {
            out.routes.push((
                route.kind,
                Write {
                    namespace: route_ns.to_owned(),
                    name: route.metadata.name.clone().unwrap_or_default(),
                    resource_version: route.metadata.resource_version.clone(),
                    status: json!({ "parents": parents }),
                },
            ));
        }
    }

    // Routes gone (or no longer attached) are forgotten.
    memo.1.retain(|_, (_, seen, _)| *seen == pass);
    drop(memo);

    // A route that no longer names a Gateway of ours loses our entries.
    let attached_routes: std::collections::HashSet<*const super::HttpRoute> = resolved
        .attachments
        .iter()
        .map(|a| Arc::as_ptr(&a.route))
        .collect();
    for route in &state.http_routes {
        if attached_routes.contains(&Arc::as_ptr(route)) {
            continue;
        }
        let current = route.status["parents"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let kept: Vec<Value> = current
            .iter()
            .filter(|p| p["controllerName"].as_str() != Some(controller))
            .cloned()
            .collect();
        if kept.len() != current.len() {
            out.routes.push((
                route.kind,
                Write {
                    namespace: route.metadata.namespace.clone().unwrap_or_default(),
                    name: route.metadata.name.clone().unwrap_or_default(),
                    resource_version: route.metadata.resource_version.clone(),
                    status: json!({ "parents": kept }),
                },
            ));
        }
    }

    for (gi, g) in resolved.gateways.iter().enumerate() {
        let (ns, name) = (g.namespace.as_str(), g.name.as_str());
        let generation = g.object.metadata.generation.unwrap_or(0);
        let listeners = &g.listeners;
        let address = g.address;
        let status_now = &g.object.status;
        let usable = listeners.iter().filter(|l| l.usable()).count();
        let accepted = if usable == listeners.len() {
            condition(
                status_now,
                "Accepted",
                "True",
                "Accepted",
                "the Gateway is accepted",
                generation,
                now,
            )
        } else if usable > 0 {
            condition(
                status_now,
                "Accepted",
                "True",
                "ListenersNotValid",
                "some listeners are not valid",
                generation,
                now,
            )
        } else {
            condition(
                status_now,
                "Accepted",
                "False",
                "ListenersNotValid",
                "no listener is valid",
                generation,
                now,
            )
        };
        let is_served = address.is_some()
            && !g.addresses.is_empty()
            && g.service_matches
            && usable > 0
            && served.contains(&(format!("{ns}/{name}"), generation));
        let (programmed_status, programmed_reason, programmed_message) = if is_served {
            (
                "True",
                "Programmed",
                "a proxy serves this generation of the Gateway",
            )
        } else if address.is_none() {
            (
                "False",
                "AddressNotAssigned",
                "no address: set --gateway-address-pool (with a free address) or --gateway-service-namespace",
            )
        } else if g.addresses.is_empty() {
            (
                "False",
                "AddressNotAssigned",
                "its Service has no address yet",
            )
        } else if !g.service_matches {
            (
                "False",
                "Pending",
                "its Service does not map every listener port to the proxies' yet",
            )
        } else if usable == 0 {
            ("False", "Invalid", "no listener is valid")
        } else {
            (
                "False",
                "Pending",
                "no proxy serves this generation of the Gateway with every listener bound yet",
            )
        };
        let programmed = condition(
            status_now,
            "Programmed",
            programmed_status,
            programmed_reason,
            programmed_message,
            generation,
            now,
        );
        let current_listeners = status_now["listeners"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let listener_status: Vec<Value> = listeners
            .iter()
            .enumerate()
            .map(|(li, l)| {
                let current = current_listeners
                    .iter()
                    .find(|c| c["name"] == l.name.as_str())
                    .cloned()
                    .unwrap_or(Value::Null);
                let mut conditions: Vec<Value> = l
                    .conditions
                    .iter()
                    .map(|c| {
                        condition(
                            &current,
                            c.kind,
                            if c.status { "True" } else { "False" },
                            c.reason,
                            &c.message,
                            generation,
                            now,
                        )
                    })
                    .collect();
                // A listener's Programmed reasons are Programmed, Invalid and Pending.
                let bound = u16::try_from(l.port)
                    .ok()
                    .and_then(|p| g.bind_port(p))
                    .is_some();
                let (status, reason, message) = if !l.usable() {
                    ("False", "Invalid", "the listener is not valid")
                } else if !bound {
                    (
                        "False",
                        "Pending",
                        "no container port is free in --gateway-port-range",
                    )
                } else if is_served {
                    ("True", "Programmed", "a proxy serves the listener")
                } else {
                    (
                        "False",
                        "Pending",
                        "no proxy serves this generation of the Gateway with every listener bound yet",
                    )
                };
                conditions.push(condition(
                    &current,
                    "Programmed",
                    status,
                    reason,
                    message,
                    generation,
                    now,
                ));
                let kinds: Vec<Value> = l
                    .supported_kinds
                    .iter()
                    .map(
                        |k| json!({ "group": k.group.as_deref().unwrap_or(GROUP), "kind": k.kind }),
                    )
                    .collect();
                json!({
                    "name": l.name,
                    "supportedKinds": kinds,
                    "attachedRoutes": attached.get(&(gi, li)).map_or(0, BTreeSet::len),
                    "conditions": conditions,
                })
            })
            .collect();
        let addresses = &g.addresses;
        let status = json!({
            "addresses": addresses,
            "conditions": [accepted, programmed],
            "listeners": listener_status,
        });
        let current = json!({
            "addresses": status_now.get("addresses").cloned().unwrap_or(json!([])),
            "conditions": status_now.get("conditions").cloned().unwrap_or(json!([])),
            "listeners": status_now.get("listeners").cloned().unwrap_or(json!([])),
        });
        if status != current {
            out.gateways.push(Write {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                resource_version: g.object.metadata.resource_version.clone(),
                status,
            });
        }
    }
    out
}

/// The route's `ResolvedRefs`: Ok, or the first unresolved backendRef's reason and why.
fn resolved_refs(
    spec: &Value,
    kind: super::RouteKind,
    route_ns: &str,
    grants: &[Arc<super::ReferenceGrant>],
    service_exists: impl Fn(&str, &str) -> bool,
) -> Result<(), (&'static str, String)> {
    for rule in spec["rules"].as_array().into_iter().flatten() {
        let mirrors = rule["filters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["type"] == "RequestMirror")
            .map(|f| &f["requestMirror"]["backendRef"]);
        let backend_refs = rule["backendRefs"].as_array().into_iter().flatten();
        for r in backend_refs.chain(mirrors) {
            let Ok(r) = ObjectRef::deserialize(r) else {
                return Err(("InvalidKind", "a backendRef cannot be read".into()));
            };
            if let Err(why) = attach::backend_ref(&r, kind, route_ns, grants, &service_exists) {
                let ns = r.namespace.as_deref().unwrap_or(route_ns);
                return Err((
                    why.reason(),
                    format!("backendRef {ns}/{}: {}", r.name, why.reason()),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway_api::{DEFAULT_CONTROLLER_NAME as OURS, Gateway, GatewayClass, HttpRoute};

    fn class(name: &str, controller: &str) -> Arc<GatewayClass> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": name }, "spec": { "controllerName": controller }
            }))
            .unwrap(),
        )
    }

    fn gateway(
        ns: &str,
        name: &str,
        class: &str,
        created: &str,
        listeners: Value,
        status: Value,
    ) -> Arc<Gateway> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": name, "namespace": ns, "generation": 1,
                              "creationTimestamp": created, "resourceVersion": "5" },
                "spec": { "gatewayClassName": class, "listeners": listeners },
                "status": status,
            }))
            .unwrap(),
        )
    }

    fn route(ns: &str, name: &str, spec: Value, status: Value) -> Arc<HttpRoute> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": name, "namespace": ns, "generation": 4 },
                "spec": spec, "status": status,
            }))
            .unwrap(),
        )
    }

    fn service(ns: &str, name: &str) -> Arc<k8s_openapi::api::core::v1::Service> {
        Arc::new(
            serde_json::from_value(json!({ "metadata": { "name": name, "namespace": ns } }))
                .unwrap(),
        )
    }

    fn http() -> Value {
        json!([{ "name": "http", "port": 80, "protocol": "HTTP" }])
    }

    #[test]
    fn a_pool_is_parsed_with_its_usable_addresses() {
        let p = Pool::parse("127.10.0.0/16").unwrap();
        assert!(p.contains("127.10.0.1".parse().unwrap()));
        assert!(!p.contains("127.10.0.0".parse().unwrap()));
        assert!(!p.contains("127.10.255.255".parse().unwrap()));
        assert!(!p.contains("127.11.0.1".parse().unwrap()));
        assert_eq!(
            Pool::parse("127.0.0.7/32").unwrap().nth(3),
            "127.0.0.7".parse::<Ipv4Addr>().unwrap()
        );
        for bad in ["127.10.0.0", "nope/16", "127.10.0.0/4", "::1/128"] {
            assert!(Pool::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn gateways_of_our_classes_get_distinct_addresses_and_keep_the_one_they_hold() {
        let pool = Pool::parse("127.10.0.0/30").unwrap(); // two addresses: .1 and .2
        let mut state = ClusterState {
            gateway_classes: vec![class("ours", OURS), class("theirs", "example.com/x")],
            gateways: vec![
                gateway(
                    "a",
                    "old",
                    "ours",
                    "2026-01-01T00:00:00Z",
                    http(),
                    json!({ "addresses": [{ "type": "IPAddress", "value": "127.10.0.2" }] }),
                ),
                gateway(
                    "a",
                    "new",
                    "ours",
                    "2026-02-01T00:00:00Z",
                    http(),
                    Value::Null,
                ),
                gateway(
                    "a",
                    "third",
                    "ours",
                    "2026-03-01T00:00:00Z",
                    http(),
                    Value::Null,
                ),
                gateway(
                    "a",
                    "foreign",
                    "theirs",
                    "2026-01-01T00:00:00Z",
                    http(),
                    Value::Null,
                ),
            ],
            ..Default::default()
        };
        let d = desired(
            &state,
            OURS,
            Some(&pool),
            None,
            &BTreeSet::new(),
            "t",
            |_, _| SecretCheck::Usable,
        );
        let addr = |d: &Desired, name: &str| {
            d.gateways
                .iter()
                .find(|w| w.name == name)
                .map(|w| w.status["addresses"].clone())
        };
        assert_eq!(
            addr(&d, "old"),
            Some(json!([{ "type": "IPAddress", "value": "127.10.0.2" }]))
        );
        assert_eq!(
            addr(&d, "new"),
            Some(json!([{ "type": "IPAddress", "value": "127.10.0.1" }]))
        );
        // The pool is full: the youngest has no address and says so.
        assert_eq!(addr(&d, "third"), Some(json!([])));
        let third = d.gateways.iter().find(|w| w.name == "third").unwrap();
        assert_eq!(
            third.status["conditions"][1]["reason"],
            "AddressNotAssigned"
        );
        assert!(
            d.gateways.iter().all(|w| w.name != "foreign"),
            "another controller's Gateway"
        );
        // What was written is not written again.
        let written: HashMap<String, Value> = d
            .gateways
            .iter()
            .map(|w| (w.name.clone(), w.status.clone()))
            .collect();
        for g in state.gateways.iter_mut() {
            if let Some(s) = written.get(g.metadata.name.as_deref().unwrap()) {
                Arc::make_mut(g).status = s.clone();
            }
        }
        let again = desired(
            &state,
            OURS,
            Some(&pool),
            None,
            &BTreeSet::new(),
            "t2",
            |_, _| SecretCheck::Usable,
        );
        assert_eq!(again.gateways, vec![], "nothing changed");
    }

    #[test]
    fn a_mirrors_backend_that_does_not_resolve_makes_resolved_refs_false() {
        let spec = |mirror_to: &str| {
            json!({ "rules": [{
                "filters": [{ "type": "RequestMirror",
                              "requestMirror": { "backendRef": { "name": mirror_to, "port": 8080 } } }],
                "backendRefs": [{ "name": "web", "port": 8080 }] }] })
        };
        let exists = |_: &str, name: &str| name != "missing";
        let kind = super::super::RouteKind::Http;
        assert_eq!(
            resolved_refs(&spec("web"), kind, "infra", &[], exists),
            Ok(())
        );
        let Err((reason, message)) = resolved_refs(&spec("missing"), kind, "infra", &[], exists)
        else {
            panic!("a missing mirror backend resolves")
        };
        assert_eq!(reason, "BackendNotFound");
        assert!(message.contains("infra/missing"), "{message}");
    }

    #[test]
    fn the_older_gateway_keeps_a_contested_address() {
        let pool = Pool::parse("127.10.0.0/29").unwrap();
        let held = json!({ "addresses": [{ "type": "IPAddress", "value": "127.10.0.3" }] });
        let state = ClusterState {
            gateway_classes: vec![class("ours", OURS)],
            gateways: vec![
                gateway(
                    "a",
                    "young",
                    "ours",
                    "2026-05-01T00:00:00Z",
                    http(),
                    held.clone(),
                ),
                gateway("a", "old", "ours", "2026-01-01T00:00:00Z", http(), held),
            ],
            ..Default::default()
        };
        let d = desired(
            &state,
            OURS,
            Some(&pool),
            None,
            &BTreeSet::new(),
            "t",
            |_, _| SecretCheck::Usable,
        );
        let addr = |name: &str| {
            d.gateways
                .iter()
                .find(|w| w.name == name)
                .map(|w| w.status["addresses"][0]["value"].clone())
        };
        assert_eq!(addr("old"), Some(json!("127.10.0.3")));
        let young = addr("young").expect("written");
        assert!(
            young != json!("127.10.0.3")
                && young.as_str().is_some_and(|a| a.starts_with("127.10.0.")),
            "{young}"
        );
    }

    #[test]
    fn listener_and_route_status_follow_attachment() {
        let listeners = json!([
            { "name": "http", "port": 80, "protocol": "HTTP" },
            { "name": "https", "port": 443, "protocol": "HTTPS",
              "tls": { "certificateRefs": [{ "name": "missing" }] } }
        ]);
        let parent = |section: Option<&str>| {
            let mut p = json!({ "group": GROUP, "kind": "Gateway", "name": "gw" });
            if let Some(s) = section {
                p["sectionName"] = json!(s);
            }
            p
        };
        let other_controller = json!({ "parents": [{
            "parentRef": { "name": "elsewhere" }, "controllerName": "example.com/x", "conditions": []
        }] });
        let state = ClusterState {
            gateway_classes: vec![class("ours", OURS)],
            gateways: vec![gateway(
                "infra",
                "gw",
                "ours",
                "2026-01-01T00:00:00Z",
                listeners,
                Value::Null,
            )],
            services: vec![service("infra", "web")],
            http_routes: vec![
                route(
                    "infra",
                    "ok",
                    json!({ "parentRefs": [parent(None)],
                    "rules": [{ "backendRefs": [{ "name": "web", "port": 8080 }] }] }),
                    other_controller,
                ),
                route(
                    "infra",
                    "nobackend",
                    json!({ "parentRefs": [parent(Some("http"))],
                    "rules": [{ "backendRefs": [{ "name": "nosuch", "port": 8080 }] }] }),
                    Value::Null,
                ),
                route(
                    "infra",
                    "dropped",
                    json!({ "parentRefs": [parent(Some("http"))],
                    "rules": [
                        { "backendRefs": [{ "name": "web", "port": 8080 }] },
                        { "filters": [{ "type": "ExtensionRef",
                                        "extensionRef": { "group": "example.com", "kind": "Thing", "name": "t" } }],
                          "backendRefs": [{ "name": "web", "port": 8080 }] },
                    ] }),
                    Value::Null,
                ),
                route(
                    "infra",
                    "nosection",
                    json!({ "parentRefs": [parent(Some("nosuch"))] }),
                    Value::Null,
                ),
                route(
                    "apps",
                    "elsewhere",
                    json!({ "parentRefs": [{ "name": "gw", "namespace": "infra" }] }),
                    Value::Null,
                ),
                route(
                    "infra",
                    "notours",
                    json!({ "parentRefs": [{ "name": "other-gw" }] }),
                    Value::Null,
                ),
            ],
            ..Default::default()
        };
        let pool = Pool::parse("127.10.0.0/16").unwrap();
        let at = |served: &[(&str, i64)]| {
            let served: BTreeSet<(String, i64)> =
                served.iter().map(|(g, n)| ((*g).to_owned(), *n)).collect();
            desired(&state, OURS, Some(&pool), None, &served, "t", |_, _| {
                SecretCheck::Missing
            })
        };
        // Programmed once a proxy serves this generation, not an older one.
        for (served, status, reason) in [
            (&[][..], "False", "Pending"),
            (&[("infra/gw", 0)][..], "False", "Pending"),
            (&[("infra/gw", 1)][..], "True", "Programmed"),
        ] {
            let d = at(served);
            let gw = &d.gateways[0].status;
            assert_eq!(gw["conditions"][1]["type"], "Programmed");
            assert_eq!(
                (
                    gw["conditions"][1]["status"].as_str(),
                    gw["conditions"][1]["reason"].as_str()
                ),
                (Some(status), Some(reason)),
                "served {served:?}"
            );
            let http_programmed = gw["listeners"][0]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Programmed")
                .unwrap()
                .clone();
            assert_eq!(http_programmed["status"], status, "served {served:?}");
        }
        let d = at(&[("infra/gw", 1)]);
        let gw = &d.gateways[0].status;
        assert_eq!(gw["conditions"][0]["reason"], "ListenersNotValid");
        assert_eq!(gw["conditions"][0]["status"], "True");
        assert_eq!(gw["listeners"][0]["name"], "http");
        assert_eq!(
            gw["listeners"][0]["attachedRoutes"], 3,
            "ok, nobackend and dropped"
        );
        assert_eq!(
            gw["listeners"][0]["supportedKinds"],
            json!([{ "group": GROUP, "kind": "HTTPRoute" }, { "group": GROUP, "kind": "GRPCRoute" }])
        );
        assert_eq!(
            gw["listeners"][1]["attachedRoutes"], 1,
            "ok attaches to the listener whose certificate is missing"
        );
        let https_programmed = gw["listeners"][1]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Programmed")
            .unwrap()
            .clone();
        assert_eq!(
            https_programmed["reason"], "Invalid",
            "an invalid listener of a served Gateway is not programmed"
        );
        let https_refs = gw["listeners"][1]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "ResolvedRefs")
            .unwrap()
            .clone();
        assert_eq!(https_refs["reason"], "InvalidCertificateRef");
        assert_eq!(https_refs["observedGeneration"], 1);

        let parents = |name: &str| {
            d.routes
                .iter()
                .find(|w| w.1.name == name)
                .map(|w| w.1.status["parents"].clone())
                .unwrap_or(Value::Null)
        };
        let ok = parents("ok");
        assert_eq!(
            ok.as_array().unwrap().len(),
            2,
            "another controller's entry is kept: {ok}"
        );
        assert_eq!(ok[0]["controllerName"], "example.com/x");
        assert_eq!(ok[1]["parentRef"], parent(None));
        assert_eq!(ok[1]["conditions"][0]["status"], "True");
        assert_eq!(ok[1]["conditions"][0]["observedGeneration"], 4);
        assert_eq!(ok[1]["conditions"][1]["reason"], "ResolvedRefs");
        assert_eq!(
            ok[1]["conditions"].as_array().map(Vec::len),
            Some(2),
            "no rule dropped: Accepted and ResolvedRefs alone"
        );
        // A route with a rule holdfast cannot serve is served without it, and says so.
        let dropped = &parents("dropped")[0]["conditions"];
        assert_eq!(dropped[0]["status"], "True", "still Accepted");
        assert_eq!(dropped[2]["type"], "PartiallyInvalid");
        assert_eq!(dropped[2]["status"], "True");
        assert_eq!(dropped[2]["reason"], "UnsupportedValue");
        let message = dropped[2]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("Dropped Rule") && message.contains("rule 1: filter ExtensionRef"),
            "{message}"
        );
        let nobackend = parents("nobackend");
        assert_eq!(nobackend[0]["conditions"][0]["status"], "True");
        assert_eq!(nobackend[0]["conditions"][1]["reason"], "BackendNotFound");
        assert_eq!(
            parents("nosection")[0]["conditions"][0]["reason"],
            "NoMatchingParent"
        );
        assert_eq!(
            parents("elsewhere")[0]["conditions"][0]["reason"],
            "NotAllowedByListeners"
        );
        assert_eq!(
            parents("notours"),
            Value::Null,
            "a route of no Gateway of ours is not written"
        );
    }
}
