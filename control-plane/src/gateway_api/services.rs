//! Gateways in a cluster: each Gateway of ours gets a Service in the proxies' namespace
//! (`--gateway-service-namespace`) that selects the proxies' pods
//! (`--gateway-service-selector`). The Service's ports are the Gateway's listener ports;
//! each maps to a container port of the Gateway's own, from `--gateway-port-range`, that
//! the proxies bind on `--gateway-bind-address`. The Gateway's `status.addresses` are its
//! Service's (the load balancer's, else the cluster IP). Pure: what the leader writes is
//! [`desired`]; the ports are chosen by [`assign`].
//!
//! Ports are kept: a Gateway keeps the container port its Service already maps a listener
//! port to (while it is in the range and no older Gateway has it); a new one takes the
//! first free port from a slot chosen by its name and port, so Gateways keep their ports
//! as others come and go.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::model::OurGateway;
use crate::translate::ClusterState;

/// The label on every Service holdfast made for a Gateway.
pub const MANAGED_LABEL: &str = "holdfast.dev/gateway-service";
/// The annotation naming a Service's Gateway (`namespace/name`).
pub const GATEWAY_ANNOTATION: &str = "holdfast.dev/gateway";
/// The annotation naming the controller (`--gateway-controller-name`) whose Service it is:
/// installations sharing a namespace never take or delete each other's.
pub const CONTROLLER_ANNOTATION: &str = "holdfast.dev/gateway-controller";

/// How Gateways are given Services (the `--gateway-service-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceMode {
    /// The proxies' namespace, where the Services are made.
    pub namespace: String,
    /// The proxies' pod labels.
    pub selector: BTreeMap<String, String>,
    /// `ClusterIP`, `NodePort` or `LoadBalancer`.
    pub service_type: String,
    /// What the proxies bind the Gateways' container ports on.
    pub bind_address: Ipv4Addr,
    /// The container ports Gateways get (inclusive).
    pub first_port: u16,
    /// How many.
    pub port_count: u16,
}

impl ServiceMode {
    /// Parses `k=v,k2=v2` (a label selector of equalities; at least one).
    pub fn parse_selector(s: &str) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not key=value"))?;
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(format!("{pair:?} has no key"));
            }
            out.insert(k.to_owned(), v.to_owned());
        }
        if out.is_empty() {
            return Err("give the proxies' pod labels, for example app=holdfast-proxy".into());
        }
        Ok(out)
    }

    /// Parses `first-last` (inclusive, 1024 to 65535).
    pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
        let (a, b) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?} is not first-last"))?;
        let parse = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p >= 1024)
                .ok_or_else(|| format!("{p:?} is not a port from 1024 to 65535"))
        };
        let (first, last) = (parse(a)?, parse(b)?);
        if last < first {
            return Err(format!("{s:?}: the last port is below the first"));
        }
        Ok((first, last - first + 1))
    }

    /// Checks the Service type.
    pub fn parse_type(s: &str) -> Result<String, String> {
        match s {
            "ClusterIP" | "NodePort" | "LoadBalancer" => Ok(s.to_owned()),
            other => Err(format!(
                "{other:?} is not ClusterIP, NodePort or LoadBalancer"
            )),
        }
    }

    fn contains(&self, port: u16) -> bool {
        port >= self.first_port && u32::from(port - self.first_port) < u32::from(self.port_count)
    }

    fn nth(&self, i: u32) -> u16 {
        // In range: first_port + (i mod count) <= first_port + count - 1 <= 65535.
        self.first_port + (i % u32::from(self.port_count)) as u16
    }
}

/// The FNV-1a hash of `s`.
fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

/// The name of Gateway `namespace/name`'s Service: `gw-<name>-<hash>`, a DNS label of at
/// most 63 characters.
pub fn service_name(namespace: &str, name: &str) -> String {
    let readable: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let readable = readable.trim_matches('-');
    format!("gw-{readable}-{:08x}", fnv(&format!("{namespace}/{name}")))
}

/// Whether `s` is a Gateway Service of `controller`'s (our label and annotation).
fn is_ours(s: &Service, controller: &str) -> bool {
    let label = s
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_LABEL));
    let by = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_ANNOTATION));
    label.is_some_and(|v| v == "true") && by.is_some_and(|c| c == controller)
}

/// The Service named for `g` in the proxies' namespace: Ok (ours, or none), or Err when a
/// Service of that name is someone else's (never used, changed or deleted).
fn service_of<'a>(
    mode: &ServiceMode,
    controller: &str,
    state: &'a ClusterState,
    g: &OurGateway,
) -> Result<Option<&'a Service>, ()> {
    let name = service_name(&g.namespace, &g.name);
    let found = state.services.iter().map(|s| &**s).find(|s| {
        s.metadata.namespace.as_deref() == Some(&mode.namespace)
            && s.metadata.name.as_deref() == Some(&name)
    });
    match found {
        Some(s) if !is_ours(s, controller) => Err(()),
        found => Ok(found),
    }
}

/// Gives each Gateway (oldest first) the bind address, a container port for each of its
/// listener ports, and its Service's addresses.
pub fn assign(
    mode: &ServiceMode,
    controller: &str,
    state: &ClusterState,
    gateways: &mut [OurGateway],
) {
    let mut taken: BTreeSet<u16> = BTreeSet::new();
    let mut waiting: Vec<(usize, u16)> = Vec::new();
    // What each Gateway's Service maps now (listener port → container port).
    let mut serviced: Vec<BTreeMap<i32, i32>> = Vec::with_capacity(gateways.len());
    for (i, g) in gateways.iter_mut().enumerate() {
        g.address = Some(mode.bind_address);
        let service = service_of(mode, controller, state, g).ok().flatten();
        let held: BTreeMap<i32, i32> = service
            .and_then(|s| s.spec.as_ref()?.ports.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| match &p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(t)) => {
                    Some((p.port, *t))
                }
                _ => None,
            })
            .collect();
        let ports: BTreeSet<u16> = g
            .listeners
            .iter()
            .filter_map(|l| u16::try_from(l.port).ok())
            .collect();
        let mut mapped = BTreeMap::new();
        for port in ports {
            let kept = held
                .get(&i32::from(port))
                .and_then(|t| u16::try_from(*t).ok())
                .filter(|t| mode.contains(*t) && !taken.contains(t));
            match kept {
                Some(t) => {
                    taken.insert(t);
                    mapped.insert(port, t);
                }
                None => waiting.push((i, port)),
            }
        }
        g.ports = Some(mapped);
        g.addresses = service.map(addresses_of).unwrap_or_default();
        serviced.push(held);
    }
    for (i, port) in waiting {
        let g = &mut gateways[i];
        let start = fnv(&format!("{}/{}:{port}", g.namespace, g.name));
        if let Some(t) = (0..u32::from(mode.port_count))
            .map(|n| mode.nth(start.wrapping_add(n)))
            .find(|t| !taken.contains(t))
        {
            taken.insert(t);
            if let Some(m) = g.ports.as_mut() {
                m.insert(port, t);
            }
        }
    }
    // Programmed needs the Service to send each listener port where the proxies listen.
    for (g, held) in gateways.iter_mut().zip(serviced) {
        let wanted: BTreeMap<i32, i32> = g
            .ports
            .iter()
            .flatten()
            .map(|(p, t)| (i32::from(*p), i32::from(*t)))
            .collect();
        g.service_matches = held == wanted;
    }
}

/// A Service's addresses as a Gateway's `status.addresses`: its load balancer's, else its
/// cluster IP (none while it has neither).
fn addresses_of(s: &Service) -> Vec<Value> {
    let lb: Vec<Value> = s
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref()?.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => Some(json!({ "type": "IPAddress", "value": ip })),
            (None, Some(h)) => Some(json!({ "type": "Hostname", "value": h })),
            _ => None,
        })
        .collect();
    // A LoadBalancer's address is its load balancer's: its cluster IP is not one that
    // clients outside the cluster reach.
    let load_balancer = s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) == Some("LoadBalancer");
    if !lb.is_empty() || load_balancer {
        return lb;
    }
    s.spec
        .as_ref()
        .and_then(|sp| sp.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .map(|ip| vec![json!({ "type": "IPAddress", "value": ip })])
        .unwrap_or_default()
}

/// What the leader should do to the Gateway Services.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    /// Services to create (whole objects).
    pub create: Vec<Value>,
    /// Services to change: (name, merge patch with the cached resourceVersion).
    pub patch: Vec<(String, Value)>,
    /// Services of ours whose Gateway is gone (names).
    pub delete: Vec<String>,
}

/// The Services our Gateways (with their ports assigned) should have, against the cached
/// ones in the proxies' namespace.
pub fn desired(
    mode: &ServiceMode,
    controller: &str,
    gateways: &[OurGateway],
    state: &ClusterState,
) -> Changes {
    let mut out = Changes::default();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for g in gateways {
        let Some(ports) = &g.ports else { continue };
        let name = service_name(&g.namespace, &g.name);
        wanted.insert(name.clone());
        // No port could be given (the range is full): a Service needs one.
        if ports.is_empty() {
            continue;
        }
        let ports: Vec<Value> = ports
            .iter()
            .map(|(port, target)| {
                json!({ "name": format!("listener-{port}"), "port": port,
                        "targetPort": target, "protocol": "TCP" })
            })
            .collect();
        let labels = json!({ MANAGED_LABEL: "true", "app.kubernetes.io/managed-by": "holdfast" });
        let annotations = json!({ GATEWAY_ANNOTATION: format!("{}/{}", g.namespace, g.name),
                                  CONTROLLER_ANNOTATION: controller });
        let spec = json!({ "type": mode.service_type, "selector": mode.selector, "ports": ports });
        let Ok(existing) = service_of(mode, controller, state, g) else {
            // Someone else's Service has the name: left alone (the Gateway gets no
            // address, so it is not Programmed).
            continue;
        };
        match existing {
            None => out.create.push(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": name, "namespace": mode.namespace,
                              "labels": labels, "annotations": annotations },
                "spec": spec,
            })),
            Some(s) => {
                let current = serde_json::to_value(&s.spec).unwrap_or(Value::Null);
                // What of a port we set (the API server adds the rest, nodePort say).
                let ports_of = |spec: &Value| -> Option<Vec<(Value, Value, Value)>> {
                    let list = spec["ports"].as_array()?;
                    Some(
                        list.iter()
                            .map(|p| {
                                (
                                    p["port"].clone(),
                                    p["targetPort"].clone(),
                                    p["name"].clone(),
                                )
                            })
                            .collect(),
                    )
                };
                let same = ports_of(&current) == ports_of(&spec)
                    && current["selector"] == spec["selector"]
                    && current["type"] == spec["type"];
                if !same {
                    // A merge patch merges maps: a selector key not ours is removed by name.
                    let mut spec = spec;
                    if let Some(extra) = current["selector"].as_object() {
                        for key in extra.keys().filter(|k| !mode.selector.contains_key(*k)) {
                            spec["selector"][key] = Value::Null;
                        }
                    }
                    out.patch.push((
                        name,
                        json!({
                            "metadata": { "resourceVersion": s.metadata.resource_version,
                                          "labels": labels, "annotations": annotations },
                            "spec": spec,
                        }),
                    ));
                }
            }
        }
    }
    for s in &state.services {
        let ours =
            s.metadata.namespace.as_deref() == Some(&mode.namespace) && is_ours(s, controller);
        if let (true, Some(name)) = (ours, &s.metadata.name)
            && !wanted.contains(name)
        {
            out.delete.push(name.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway_api::attach::SecretCheck;
    use crate::gateway_api::{DEFAULT_CONTROLLER_NAME as OURS, model};
    use std::sync::Arc;

    fn object<T: serde::de::DeserializeOwned>(v: Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).expect("an object"))
    }

    fn mode(first: u16, count: u16) -> ServiceMode {
        ServiceMode {
            namespace: "holdfast".into(),
            selector: [("app".to_owned(), "proxy".to_owned())].into(),
            service_type: "LoadBalancer".into(),
            bind_address: Ipv4Addr::UNSPECIFIED,
            first_port: first,
            port_count: count,
        }
    }

    fn gateway(name: &str, created: &str, ports: &[u16]) -> Arc<crate::gateway_api::Gateway> {
        let listeners: Vec<Value> = ports
            .iter()
            .map(|p| json!({ "name": format!("l{p}"), "port": p, "protocol": "HTTP" }))
            .collect();
        object(json!({
            "metadata": { "name": name, "namespace": "apps", "creationTimestamp": created },
            "spec": { "gatewayClassName": "c", "listeners": listeners }
        }))
    }

    fn state(
        gateways: Vec<Arc<crate::gateway_api::Gateway>>,
        services: Vec<Value>,
    ) -> ClusterState {
        ClusterState {
            gateway_classes: vec![object(
                json!({ "metadata": { "name": "c" }, "spec": { "controllerName": OURS } }),
            )],
            gateways,
            services: services.into_iter().map(object).collect(),
            ..Default::default()
        }
    }

    fn resolve(m: &ServiceMode, st: &ClusterState) -> Vec<OurGateway> {
        model::resolve_gateways(st, OURS, None, Some(m), |_, _| SecretCheck::Usable).gateways
    }

    #[test]
    fn flags_parse_with_clear_errors() {
        assert_eq!(
            ServiceMode::parse_selector("app=holdfast-proxy, tier=edge").unwrap(),
            BTreeMap::from([
                ("app".to_owned(), "holdfast-proxy".to_owned()),
                ("tier".to_owned(), "edge".to_owned())
            ])
        );
        assert!(
            ServiceMode::parse_selector("")
                .unwrap_err()
                .contains("pod labels")
        );
        assert!(
            ServiceMode::parse_selector("app")
                .unwrap_err()
                .contains("key=value")
        );
        assert_eq!(
            ServiceMode::parse_port_range("20000-20009"),
            Ok((20000, 10))
        );
        assert!(
            ServiceMode::parse_port_range("80-90").is_err(),
            "privileged ports"
        );
        assert!(ServiceMode::parse_port_range("3000-2000").is_err());
        assert!(ServiceMode::parse_port_range("3000").is_err());
        assert!(ServiceMode::parse_type("ExternalName").is_err());
    }

    #[test]
    fn service_names_are_dns_labels_and_distinct() {
        let long = "a".repeat(200);
        for (ns, name) in [
            ("apps", "web"),
            ("apps", "Web.Gateway"),
            ("x", long.as_str()),
        ] {
            let n = service_name(ns, name);
            assert!(n.len() <= 63, "{n}");
            assert!(n.starts_with("gw-"), "{n}");
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{n}"
            );
        }
        assert_ne!(service_name("a", "web"), service_name("b", "web"));
    }

    #[test]
    fn each_gateway_gets_its_own_container_ports_and_keeps_those_its_service_maps() {
        let m = mode(20000, 4);
        let st = state(
            vec![
                gateway("old", "2026-01-01T00:00:00Z", &[80, 443]),
                gateway("new", "2026-01-02T00:00:00Z", &[80]),
            ],
            vec![],
        );
        let gws = resolve(&m, &st);
        let all: Vec<u16> = gws
            .iter()
            .flat_map(|g| g.ports.as_ref().unwrap().values().copied())
            .collect();
        assert_eq!(all.len(), 3);
        assert_eq!(
            all.iter().collect::<BTreeSet<_>>().len(),
            3,
            "distinct: {all:?}"
        );
        assert!(all.iter().all(|p| (20000..20004).contains(p)), "{all:?}");
        assert!(gws.iter().all(|g| g.address == Some(Ipv4Addr::UNSPECIFIED)));
        // The new Gateway's Service maps 80 to 20003: kept, and its address is published.
        let svc = json!({
            "metadata": { "name": service_name("apps", "new"), "namespace": "holdfast",
                          "labels": { MANAGED_LABEL: "true" }, "annotations": { CONTROLLER_ANNOTATION: OURS } },
            "spec": { "type": "LoadBalancer", "clusterIP": "10.96.0.7", "selector": { "app": "proxy" },
                      "ports": [{ "name": "listener-80", "port": 80, "targetPort": 20003, "protocol": "TCP" }] },
            "status": { "loadBalancer": { "ingress": [{ "ip": "192.0.2.10" }] } }
        });
        let st = state(st.gateways.clone(), vec![svc]);
        let gws = resolve(&m, &st);
        let new = gws.iter().find(|g| g.name == "new").unwrap();
        assert_eq!(new.ports.as_ref().unwrap()[&80], 20003);
        assert_eq!(
            new.addresses,
            vec![json!({ "type": "IPAddress", "value": "192.0.2.10" })]
        );
        let old = gws.iter().find(|g| g.name == "old").unwrap();
        assert!(old.addresses.is_empty(), "no Service yet: no address");
        assert!(!old.ports.as_ref().unwrap().values().any(|p| *p == 20003));
        // A LoadBalancer not yet given an address by its load balancer has none (its
        // cluster IP is not one clients outside reach).
        let mut pending = st.services[0].as_ref().clone();
        if let Some(status) = pending.status.as_mut() {
            status.load_balancer = None;
        }
        let st_pending = state(st.gateways.clone(), vec![json!(pending)]);
        let gws = resolve(&m, &st_pending);
        assert!(gws.iter().all(|g| g.addresses.is_empty()));
        // A full range leaves a port unmapped (not served), never shared.
        let gws = resolve(&mode(20000, 2), &st);
        let mapped: usize = gws.iter().map(|g| g.ports.as_ref().unwrap().len()).sum();
        assert_eq!(mapped, 2);
        // A Gateway left with no port at all gets no Service (one needs a port).
        let gws = resolve(&mode(20000, 1), &st);
        let changes = desired(&mode(20000, 1), OURS, &gws, &st);
        let made = changes.create.len() + changes.patch.len();
        assert!(made <= 1, "{changes:?}");
        assert!(
            changes
                .create
                .iter()
                .all(|c| !c["spec"]["ports"].as_array().unwrap().is_empty())
        );
    }

    #[test]
    fn a_gateway_with_a_service_publishes_its_address_and_is_programmed_only_with_one() {
        let m = mode(20000, 100);
        let gw = gateway("web", "2026-01-01T00:00:00Z", &[80]);
        let served = BTreeSet::from([("apps/web".to_owned(), 0)]);
        let status_of = |st: &ClusterState| {
            let d = crate::gateway_api::status::desired(
                st,
                OURS,
                None,
                Some(&m),
                &served,
                "t",
                |_, _| SecretCheck::Usable,
            );
            d.gateways[0].status.clone()
        };
        let programmed = |status: &Value| {
            status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Programmed")
                .cloned()
                .unwrap()
        };
        let none = status_of(&state(vec![gw.clone()], vec![]));
        assert_eq!(none["addresses"], json!([]));
        assert_eq!(programmed(&none)["reason"], "AddressNotAssigned");
        let svc = json!({
            "metadata": { "name": service_name("apps", "web"), "namespace": "holdfast",
                          "labels": { MANAGED_LABEL: "true" }, "annotations": { CONTROLLER_ANNOTATION: OURS } },
            "spec": { "type": "ClusterIP", "clusterIP": "10.96.0.9",
                      "ports": [{ "port": 80, "targetPort": 20001 }] }
        });
        let with = status_of(&state(vec![gw], vec![svc]));
        assert_eq!(
            with["addresses"],
            json!([{ "type": "IPAddress", "value": "10.96.0.9" }])
        );
        assert_eq!(programmed(&with)["status"], "True");
        // Two listener ports and one container port: the listener left without one is
        // not Programmed.
        let two = gateway("web", "2026-01-01T00:00:00Z", &[80, 443]);
        let one_port = mode(20001, 1);
        let svc_80 = json!({
            "metadata": { "name": service_name("apps", "web"), "namespace": "holdfast",
                          "labels": { MANAGED_LABEL: "true" }, "annotations": { CONTROLLER_ANNOTATION: OURS } },
            "spec": { "type": "ClusterIP", "clusterIP": "10.96.0.9",
                      "ports": [{ "port": 80, "targetPort": 20001 }] }
        });
        let d = crate::gateway_api::status::desired(
            &state(vec![two], vec![svc_80.clone()]),
            OURS,
            None,
            Some(&one_port),
            &served,
            "t",
            |_, _| SecretCheck::Usable,
        );
        let listeners = d.gateways[0].status["listeners"]
            .as_array()
            .unwrap()
            .clone();
        let listener_programmed = |name: &str| {
            let l = listeners.iter().find(|l| l["name"] == name).unwrap();
            programmed(l)["status"].clone()
        };
        assert_eq!(listener_programmed("l80"), "True");
        assert_eq!(listener_programmed("l443"), "False");
        // Both ports get container ports, but the Service maps only 80 so far (its
        // patch not yet made, or refused): not Programmed until it maps both.
        let two = gateway("web", "2026-01-01T00:00:00Z", &[80, 443]);
        let st = state(vec![two], vec![svc_80.clone()]);
        let d =
            crate::gateway_api::status::desired(&st, OURS, None, Some(&m), &served, "t", |_, _| {
                SecretCheck::Usable
            });
        let p = programmed(&d.gateways[0].status);
        assert_eq!(
            (p["status"].as_str(), p["reason"].as_str()),
            (Some("False"), Some("Pending"))
        );
        let gws = resolve(&m, &st);
        let mut both = svc_80;
        both["spec"]["ports"] = json!(
            gws[0]
                .ports
                .as_ref()
                .unwrap()
                .iter()
                .map(|(p, t)| json!({ "port": p, "targetPort": t }))
                .collect::<Vec<_>>()
        );
        let st = state(st.gateways.clone(), vec![both]);
        let d =
            crate::gateway_api::status::desired(&st, OURS, None, Some(&m), &served, "t", |_, _| {
                SecretCheck::Usable
            });
        assert_eq!(programmed(&d.gateways[0].status)["status"], "True");
    }

    #[test]
    fn the_leader_creates_missing_services_patches_changed_ones_and_deletes_orphans() {
        let m = mode(20000, 100);
        let st = state(vec![gateway("web", "2026-01-01T00:00:00Z", &[80])], vec![]);
        let gws = resolve(&m, &st);
        let changes = desired(&m, OURS, &gws, &st);
        assert_eq!(changes.create.len(), 1);
        let svc = &changes.create[0];
        assert_eq!(svc["metadata"]["namespace"], "holdfast");
        assert_eq!(
            svc["metadata"]["annotations"][GATEWAY_ANNOTATION],
            "apps/web"
        );
        assert_eq!(svc["spec"]["selector"], json!({ "app": "proxy" }));
        assert_eq!(svc["spec"]["type"], "LoadBalancer");
        assert_eq!(svc["spec"]["ports"][0]["port"], 80);
        let target = svc["spec"]["ports"][0]["targetPort"].as_u64().unwrap();
        assert!((20000..20100).contains(&target));
        // Once it exists as desired: nothing to do.
        let mut existing = svc.clone();
        existing["metadata"]["resourceVersion"] = json!("5");
        let st2 = state(st.gateways.clone(), vec![existing.clone()]);
        let gws2 = resolve(&m, &st2);
        assert_eq!(desired(&m, OURS, &gws2, &st2), Changes::default());
        // Someone changed its selector and added a key: patched back, the added key
        // removed by name (a merge patch keeps what it does not name), with the cached
        // resourceVersion.
        existing["spec"]["selector"] = json!({ "app": "other", "tier": "x" });
        let st3 = state(st.gateways.clone(), vec![existing.clone()]);
        let changes = desired(&m, OURS, &resolve(&m, &st3), &st3);
        assert_eq!(changes.patch.len(), 1);
        assert_eq!(changes.patch[0].1["metadata"]["resourceVersion"], "5");
        assert_eq!(
            changes.patch[0].1["spec"]["selector"],
            json!({ "app": "proxy", "tier": null })
        );
        // A Service of that name that is not ours (no annotation of this controller) is
        // neither used, changed nor deleted, and the Gateway gets no address from it.
        let mut squatter = existing.clone();
        squatter["metadata"]["annotations"] = json!({ CONTROLLER_ANNOTATION: "someone/else" });
        squatter["spec"]["clusterIP"] = json!("10.96.0.50");
        let st5 = state(st.gateways.clone(), vec![squatter.clone()]);
        let gws5 = resolve(&m, &st5);
        assert!(gws5[0].addresses.is_empty());
        assert_eq!(desired(&m, OURS, &gws5, &st5), Changes::default());
        // The Gateway goes: its Service is deleted; a Service not ours (another's, or
        // another controller's Gateway Service) is never touched.
        let foreign = json!({ "metadata": { "name": "other", "namespace": "holdfast" },
                              "spec": { "ports": [{ "port": 80 }] } });
        let mut theirs = squatter;
        theirs["metadata"]["name"] = json!("gw-theirs-00000000");
        let st4 = state(vec![], vec![existing, foreign, theirs]);
        let changes = desired(&m, OURS, &resolve(&m, &st4), &st4);
        assert_eq!(changes.delete, vec![service_name("apps", "web")]);
        assert!(changes.create.is_empty() && changes.patch.is_empty());
    }
}
