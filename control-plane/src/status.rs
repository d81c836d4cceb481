//! Ingress status: the leader (a `coordination.k8s.io` Lease, via kube-lease-manager)
//! writes `status.loadBalancer` of our Ingresses from `--publish-address` or from the
//! proxies' Service (`--publish-service`). Every replica watches and serves proxies; only
//! this writing is leader-only. Desired status is computed from the caches by pure
//! functions; the loop only patches what differs.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::caches::Caches;
use crate::state::Shared;
use crate::translate::{self, ClusterState};

/// Where the address to publish comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// Fixed IPs or host names.
    Addresses(Vec<String>),
    /// The proxies' Service: its load-balancer ingress, else external IPs, else cluster IP.
    Service {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// Leader election and status settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What to publish.
    pub publish: Publish,
    /// Lease name.
    pub lease_name: String,
    /// Lease namespace (the control plane's own).
    pub lease_namespace: String,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Renew this long before the lease expires.
    pub lease_grace: Duration,
    /// This replica's identity.
    pub identity: String,
    /// What makes an Ingress ours.
    pub translate: translate::Options,
}

fn entry(address: &str) -> IngressLoadBalancerIngress {
    if address.parse::<std::net::IpAddr>().is_ok() {
        IngressLoadBalancerIngress {
            ip: Some(address.to_owned()),
            ..Default::default()
        }
    } else {
        IngressLoadBalancerIngress {
            hostname: Some(address.to_owned()),
            ..Default::default()
        }
    }
}

/// The `status.loadBalancer.ingress` our Ingresses should carry, if it is known.
pub fn desired(
    publish: &Publish,
    services: &[Arc<Service>],
) -> Option<Vec<IngressLoadBalancerIngress>> {
    let addresses: Vec<String> = match publish {
        Publish::Addresses(a) => a.clone(),
        Publish::Service { namespace, name } => {
            let svc = services.iter().find(|s| {
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.metadata.name.as_deref() == Some(name)
            })?;
            let lb: Vec<String> = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect();
            let spec = svc.spec.as_ref();
            if !lb.is_empty() {
                lb
            } else if let Some(ips) = spec
                .and_then(|s| s.external_ips.clone())
                .filter(|v| !v.is_empty())
            {
                ips
            } else {
                spec.and_then(|s| s.cluster_ip.clone())
                    .filter(|ip| !ip.is_empty() && ip != "None")
                    .into_iter()
                    .collect()
            }
        }
    };
    if addresses.is_empty() {
        return None;
    }
    let mut entries: Vec<IngressLoadBalancerIngress> = addresses.iter().map(|a| entry(a)).collect();
    entries.sort_by(|a, b| (&a.ip, &a.hostname).cmp(&(&b.ip, &b.hostname)));
    entries.dedup();
    Some(entries)
}

/// Our Ingresses whose status differs from `desired`.
pub fn stale<'a>(
    state: &'a ClusterState,
    opts: &translate::Options,
    desired: &[IngressLoadBalancerIngress],
) -> Vec<&'a Ingress> {
    translate::our_ingresses(state, opts)
        .into_iter()
        .filter(|ing| {
            let current = ing
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.clone())
                .unwrap_or_default();
            current != desired
        })
        .collect()
}

/// Runs leader election, and while leader keeps our Ingresses' status up to date.
pub async fn run(
    client: Client,
    caches: Caches,
    shared: Shared,
    settings: Settings,
    shutdown: CancellationToken,
) {
    let manager = loop {
        let built = LeaseManagerBuilder::new(client.clone(), &settings.lease_name)
            .with_namespace(&settings.lease_namespace)
            .with_identity(&settings.identity)
            .with_duration(settings.lease_duration.as_secs().max(1))
            .with_grace(settings.lease_grace.as_secs().max(1))
            .build()
            .await;
        match built {
            Ok(m) => break m,
            Err(error) => {
                tracing::warn!(%error, "cannot set up leader election yet; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    };
    let (mut leader, task) = manager.watch().await;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = leader.changed() => {
                if changed.is_err() { break; }
                let is_leader = *leader.borrow_and_update();
                shared.metrics().leader.set(i64::from(is_leader));
                if is_leader {
                    shared.metrics().leader_acquisitions.inc();
                    tracing::info!(identity = %settings.identity, lease = %settings.lease_name, "became leader: writing Ingress status");
                } else {
                    tracing::info!(identity = %settings.identity, "not the leader");
                }
            }
            _ = tick.tick() => {
                if *leader.borrow() && shared.all_synced() {
                    sync(&client, &caches, &settings).await;
                }
            }
        }
    }
    // Dropping the receiver makes the manager release the Lease.
    drop(leader);
    let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
}

async fn sync(client: &Client, caches: &Caches, settings: &Settings) {
    sync_state(client, &caches.state(), settings).await;
}

/// Patches the status of every Ingress of ours in `state` whose addresses are not the
/// desired ones: one status PATCH each, nothing for those already right.
async fn sync_state(client: &Client, state: &ClusterState, settings: &Settings) {
    let Some(desired) = desired(&settings.publish, &state.services) else {
        tracing::debug!("no address to publish yet");
        return;
    };
    for ing in stale(state, &settings.translate, &desired) {
        let (Some(ns), Some(name)) = (
            ing.metadata.namespace.as_deref(),
            ing.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let patch = json!({ "status": { "loadBalancer": { "ingress": desired } } });
        let api: Api<Ingress> = Api::namespaced(client.clone(), ns);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::info!(ingress = %format!("{ns}/{name}"), "updated Ingress status"),
            Err(error) => {
                tracing::warn!(ingress = %format!("{ns}/{name}"), %error, "could not update Ingress status")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn svc(v: serde_json::Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn fixed_addresses_become_ip_or_hostname_entries() {
        let d = desired(
            &Publish::Addresses(vec!["lb.example.com".into(), "203.0.113.7".into()]),
            &[],
        )
        .unwrap();
        assert_eq!(d.len(), 2);
        assert!(d.iter().any(|e| e.ip.as_deref() == Some("203.0.113.7")));
        assert!(
            d.iter()
                .any(|e| e.hostname.as_deref() == Some("lb.example.com"))
        );
    }

    #[test]
    fn a_published_service_gives_its_load_balancer_then_external_ips_then_cluster_ip() {
        let p = Publish::Service {
            namespace: "hf".into(),
            name: "proxy".into(),
        };
        assert_eq!(
            desired(&p, &[]),
            None,
            "unknown Service: nothing to publish"
        );
        let lb = svc(json!({ "metadata": { "namespace": "hf", "name": "proxy" },
            "spec": { "clusterIP": "10.96.0.5", "externalIPs": ["198.51.100.1"] },
            "status": { "loadBalancer": { "ingress": [{ "ip": "192.0.2.1" }] } } }));
        assert_eq!(
            desired(&p, &[lb]).unwrap()[0].ip.as_deref(),
            Some("192.0.2.1")
        );
        let ext = svc(json!({ "metadata": { "namespace": "hf", "name": "proxy" },
            "spec": { "clusterIP": "10.96.0.5", "externalIPs": ["198.51.100.1"] } }));
        assert_eq!(
            desired(&p, &[ext]).unwrap()[0].ip.as_deref(),
            Some("198.51.100.1")
        );
        let cip = svc(
            json!({ "metadata": { "namespace": "hf", "name": "proxy" }, "spec": { "clusterIP": "10.96.0.5" } }),
        );
        assert_eq!(
            desired(&p, &[cip]).unwrap()[0].ip.as_deref(),
            Some("10.96.0.5")
        );
    }

    /// Our class, and four Ingresses in namespace `a`: `fresh` (already the desired
    /// address), `old` (another address), `none` (no status), `theirs` (another class).
    fn state() -> ClusterState {
        let class: Arc<k8s_openapi::api::networking::v1::IngressClass> = Arc::new(
            serde_json::from_value(json!({ "metadata": { "name": "holdfast" }, "spec": { "controller": "holdfast.dev/ingress-controller" } })).unwrap(),
        );
        let ing = |name: &str, class: &str, ip: Option<&str>| -> Arc<Ingress> {
            let mut v = json!({ "metadata": { "namespace": "a", "name": name }, "spec": { "ingressClassName": class } });
            if let Some(ip) = ip {
                v["status"] = json!({ "loadBalancer": { "ingress": [{ "ip": ip }] } });
            }
            Arc::new(serde_json::from_value(v).unwrap())
        };
        ClusterState {
            ingress_classes: vec![class],
            ingresses: vec![
                ing("fresh", "holdfast", Some("203.0.113.7")),
                ing("old", "holdfast", Some("1.2.3.4")),
                ing("none", "holdfast", None),
                ing("theirs", "nginx", None),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn only_our_ingresses_with_a_different_status_are_stale() {
        let state = state();
        let d = desired(&Publish::Addresses(vec!["203.0.113.7".into()]), &[]).unwrap();
        let names: Vec<_> = stale(&state, &translate::Options::default(), &d)
            .iter()
            .map(|i| i.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["old", "none"]);
    }

    /// The exact requests a status sync makes: one merge PATCH of the status subresource
    /// per stale Ingress of ours, carrying only the desired addresses, and nothing else.
    #[tokio::test]
    async fn a_sync_patches_the_status_of_each_stale_ingress_once_and_nothing_else() {
        let (client, mut api) = crate::fixtures::client();
        let settings = Settings {
            publish: Publish::Addresses(vec!["203.0.113.7".into()]),
            lease_name: "holdfast".into(),
            lease_namespace: "holdfast-system".into(),
            lease_duration: Duration::from_secs(15),
            lease_grace: Duration::from_secs(5),
            identity: "cp-0".into(),
            translate: translate::Options::default(),
        };
        let sync = tokio::spawn(async move { sync_state(&client, &state(), &settings).await });
        for name in ["old", "none"] {
            let patch = api
                .expect(
                    http::Method::PATCH,
                    &format!("/apis/networking.k8s.io/v1/namespaces/a/ingresses/{name}/status"),
                    200,
                    |_| json!({ "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": { "namespace": "a", "name": name } }),
                )
                .await;
            // A merge patch of the status alone: nothing else of the Ingress is sent.
            assert_eq!(patch.content_type, "application/merge-patch+json");
            assert_eq!(
                patch.body,
                json!({ "status": { "loadBalancer": { "ingress": [{ "ip": "203.0.113.7" }] } } })
            );
        }
        // Done after those two: a third request would never be answered.
        tokio::time::timeout(Duration::from_secs(5), sync)
            .await
            .expect("the sync made no other request")
            .expect("the sync task");
    }
}
