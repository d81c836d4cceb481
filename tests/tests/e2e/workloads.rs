//! The local cluster that runs workloads (`k8s.sh up --workloads`): Kubernetes' own
//! controllers and scheduler, and kwok's fake Node, turn a Deployment into a ReplicaSet,
//! scheduled pods with addresses, and EndpointSlices, as in a real cluster. kwok never
//! makes a pod Ready: that is for whatever really serves it.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use holdfast_tests::cluster::{LocalCluster, WORKLOAD_NODE};
use holdfast_tests::wait::{self, T};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A pod's address, if kwok gave it one from the pod CIDR (10.244.0.0/16).
fn pod_ip(pod: &Pod) -> Option<Ipv4Addr> {
    let ip: Ipv4Addr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    (ip.octets()[..2] == [10, 244]).then_some(ip)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Deployment's running pods (scheduled to the kwok Node, with an address), once there
/// are exactly `n`.
async fn running_pods(pods: &Api<Pod>, n: usize) -> anyhow::Result<Vec<Pod>> {
    let found = wait::until(&format!("{n} running pods of web"), T, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?;
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && pod_ip(p).is_some()
            })
            .collect();
        Ok((running.len() == n).then_some(running))
    })
    .await?;
    Ok(found)
}

#[tokio::test]
async fn a_deployment_becomes_scheduled_pods_with_addresses_and_endpoint_slices_and_kwok_never_makes_them_ready()
-> anyhow::Result<()> {
    let cluster = LocalCluster::start_with_workloads()?;
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "workloads").await?;
    // The ServiceAccount controller gives the namespace its default ServiceAccount.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    wait::until("the default ServiceAccount", T, || async {
        accounts.get_opt("default").await.map_err(|e| e.to_string())
    })
    .await?;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{
                    "name": "echo",
                    "image": "gcr.io/k8s-staging-gateway-api/echo-basic:v1.6.3",
                    "ports": [{ "containerPort": 3000 }]
                }] }
            }
        }
    }))?;
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "selector": { "app": "web" },
            "ports": [{ "port": 80, "targetPort": 3000 }]
        }
    }))?;
    services.create(&PostParams::default(), &service).await?;

    // The Deployment controller made a ReplicaSet, named after the pod template's hash.
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let set = wait::until("the ReplicaSet of web", T, || async {
        let list = sets
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(list.items.into_iter().find(|rs| {
            rs.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Deployment" && o.name == "web")
        }))
    })
    .await?;
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let hash = set
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"))
        .cloned()
        .unwrap_or_default();
    assert!(!hash.is_empty(), "{set:?}");
    assert_eq!(set_name, format!("web-{hash}"));

    // The ReplicaSet controller made its pods, the scheduler bound them to the kwok Node,
    // and kwok gave them addresses and phase Running, never Ready.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let running = running_pods(&pods, 2).await?;
    for pod in &running {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        assert!(name.starts_with(&format!("{set_name}-")), "{name}");
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        assert_eq!(node, Some(WORKLOAD_NODE), "{name}");
        assert!(
            !is_ready(pod),
            "{name} is Ready without anything serving it"
        );
    }
    let ips: BTreeSet<String> = running
        .iter()
        .filter_map(pod_ip)
        .map(|ip| ip.to_string())
        .collect();
    assert_eq!(ips.len(), 2, "two distinct pod addresses: {ips:?}");

    // The EndpointSlice controller lists them, not ready, under the Service.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    let slice_addresses = |want: BTreeSet<String>| {
        let slices = slices.clone();
        async move {
            wait::until(
                "the Service's EndpointSlice to list the pods",
                T,
                || async {
                    let list = slices
                        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                        .await
                        .map_err(|e| e.to_string())?;
                    let mut seen = BTreeSet::new();
                    let mut any_ready = false;
                    for s in &list.items {
                        let managed = s
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("endpointslice.kubernetes.io/managed-by"))
                            .map(String::as_str);
                        if managed != Some("endpointslice-controller.k8s.io") {
                            continue;
                        }
                        for e in &s.endpoints {
                            seen.extend(e.addresses.iter().cloned());
                            any_ready |= e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                        }
                    }
                    Ok((seen == want).then_some(any_ready))
                },
            )
            .await
        }
    };
    let any_ready = slice_addresses(ips.clone()).await?;
    assert!(
        !any_ready,
        "an endpoint is ready without anything serving it"
    );

    // Scaled up: a third pod, and the slice follows.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 3 } })),
        )
        .await?;
    let running = running_pods(&pods, 3).await?;
    let ips: BTreeSet<String> = running
        .iter()
        .filter_map(pod_ip)
        .map(|ip| ip.to_string())
        .collect();
    assert_eq!(ips.len(), 3, "{ips:?}");
    slice_addresses(ips).await?;

    // Deleted: the garbage collector removes the ReplicaSet and kwok the pods.
    deployments
        .delete("web", &DeleteParams::foreground())
        .await?;
    wait::until("the pods of web to be gone", T, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(list.items.is_empty().then_some(()))
    })
    .await?;
    wait::until("the ReplicaSet of web to be gone", T, || async {
        Ok(sets
            .get_opt(&set_name)
            .await
            .map_err(|e| e.to_string())?
            .is_none()
            .then_some(()))
    })
    .await?;
    Ok(())
}
