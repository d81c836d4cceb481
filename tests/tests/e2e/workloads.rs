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

/// A pod's address, if kwok gave it one from the cluster's pod subnet.
fn pod_ip(pod: &Pod, subnet: [u8; 3]) -> Option<Ipv4Addr> {
    let ip: Ipv4Addr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    (ip.octets()[..3] == subnet).then_some(ip)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The running pods labelled `app=<app>` (scheduled to the kwok Node, with an address),
/// once there are exactly `n`.
async fn running_pods(
    pods: &Api<Pod>,
    app: &str,
    n: usize,
    subnet: [u8; 3],
) -> anyhow::Result<Vec<Pod>> {
    let found = wait::until(&format!("{n} running pods of {app}"), T, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .map_err(|e| e.to_string())?;
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && pod_ip(p, subnet).is_some()
            })
            .collect();
        Ok((running.len() == n).then_some(running))
    })
    .await?;
    Ok(found)
}

/// A client and a new namespace, once the ServiceAccount controller has given it its
/// default ServiceAccount (pods cannot be created before).
async fn namespace_with_account(
    cluster: &LocalCluster,
    prefix: &str,
) -> anyhow::Result<(kube::Client, String)> {
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, prefix).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    wait::until("the default ServiceAccount", T, || async {
        accounts.get_opt("default").await.map_err(|e| e.to_string())
    })
    .await?;
    Ok((client, ns))
}

#[tokio::test]
async fn a_deployment_becomes_scheduled_pods_with_addresses_and_endpoint_slices_and_kwok_never_makes_them_ready()
-> anyhow::Result<()> {
    let cluster = LocalCluster::start_with_workloads()?;
    let subnet = cluster
        .pod_subnet()
        .expect("a workloads cluster has a pod subnet");
    let (client, ns) = namespace_with_account(&cluster, "workloads").await?;

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
    let running = running_pods(&pods, "web", 2, subnet).await?;
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
        .filter_map(|p| pod_ip(p, subnet))
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
    let running = running_pods(&pods, "web", 3, subnet).await?;
    let ips: BTreeSet<String> = running
        .iter()
        .filter_map(|p| pod_ip(p, subnet))
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

fn has_condition(pod: &Pod, kind: &str, status: &str, reason: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.type_ == kind && c.status == status && c.reason.as_deref() == Some(reason)
            })
        })
}

/// The pod agent's network namespaces (`hf-<agent pid>-pod<n>`) that exist now.
fn agent_namespaces(agent_pid: u32) -> anyhow::Result<Vec<String>> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()?;
    let prefix = format!("hf-{agent_pid}-pod");
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect())
}

#[tokio::test]
async fn the_pod_agent_runs_echo_basic_pods_at_their_addresses_marks_them_ready_and_reports_an_unknown_image()
-> anyhow::Result<()> {
    let cluster = LocalCluster::start_with_workloads()?;
    let subnet = cluster
        .pod_subnet()
        .expect("a workloads cluster has a pod subnet");
    let agent = cluster.start_pod_agent()?;
    let (client, ns) = namespace_with_account(&cluster, "agent").await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = |name: &str, image: &str| -> anyhow::Result<Deployment> {
        Ok(serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "replicas": 2,
                "selector": { "matchLabels": { "app": name } },
                "template": {
                    "metadata": { "labels": { "app": name } },
                    "spec": { "containers": [{
                        "name": "backend",
                        "image": image,
                        "ports": [{ "containerPort": 3000 }],
                        "env": [
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } }
                        ]
                    }] }
                }
            }
        }))?)
    };
    let pp = PostParams::default();
    deployments
        .create(
            &pp,
            &deployment("echo", "gcr.io/k8s-staging-gateway-api/echo-basic:v1.6.3")?,
        )
        .await?;
    deployments
        .create(&pp, &deployment("other", "nginx:1.27")?)
        .await?;

    // echo-basic pods: Ready once they listen, answering at their own address as the pod
    // they are.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ready = wait::until("both echo pods Ready", T, || async {
        let list = pods
            .list(&ListParams::default().labels("app=echo"))
            .await
            .map_err(|e| e.to_string())?;
        let ready: Vec<Pod> = list.items.into_iter().filter(is_ready).collect();
        Ok((ready.len() == 2).then_some(ready))
    })
    .await?;
    for pod in &ready {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ip = pod_ip(pod, subnet).expect("an address from the pod subnet");
        let addr = std::net::SocketAddr::new(ip.into(), 3000);
        let (status, body) =
            holdfast_tests::http::get(addr, "echo.test", &format!("/from-test/{name}")).await?;
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body)?;
        assert_eq!(answer["pod"], name.as_str(), "{answer}");
        assert_eq!(answer["namespace"], ns.as_str(), "{answer}");
        // Its output, as CRI log lines.
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let log = cluster
            .dir()
            .join("pods")
            .join(format!("{ns}_{name}_{uid}"))
            .join("backend/0.log");
        let line = wait::until("the request in the pod's log", T, || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            Ok(text
                .lines()
                .find(|l| l.contains(&format!("Echoing back request made to /from-test/{name}")))
                .map(str::to_owned))
        })
        .await?;
        let fields: Vec<&str> = line.splitn(4, ' ').collect();
        assert!(
            fields.len() == 4
                && humantime::parse_rfc3339(fields[0]).is_ok()
                && fields[1] == "stdout"
                && fields[2] == "F",
            "not a CRI line: {line}"
        );
        // And through the API server: `kubectl logs`, served by kwok from that file (once
        // kwok has seen the pod's Logs object).
        let echoed = format!("Echoing back request made to /from-test/{name}");
        wait::until("kubectl logs to return the request", T, || async {
            let served = cluster
                .kubectl_run(&["-n", &ns, "logs", &name, "-c", "backend"])
                .map_err(|e| e.to_string())?;
            Ok(served.lines().any(|l| l.starts_with(&echoed)).then_some(()))
        })
        .await?;
    }
    // The Service's EndpointSlice says they are ready.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": { "name": "echo" },
                "spec": { "selector": { "app": "echo" }, "ports": [{ "port": 80, "targetPort": 3000 }] }
            }))?,
        )
        .await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    wait::until("two ready endpoints for echo", T, || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=echo"))
            .await
            .map_err(|e| e.to_string())?;
        let ready = list
            .items
            .iter()
            .flat_map(|s| &s.endpoints)
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        Ok((ready == 2).then_some(()))
    })
    .await?;

    // An image the agent does not know: reported on the pod, never Ready, no namespace.
    let others = wait::until("the unknown image reported on both pods", T, || async {
        let list = pods
            .list(&ListParams::default().labels("app=other"))
            .await
            .map_err(|e| e.to_string())?;
        let reported: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| has_condition(p, "Ready", "False", "UnknownImage"))
            .collect();
        Ok((reported.len() == 2).then_some(reported))
    })
    .await?;
    assert!(others.iter().all(|p| !is_ready(p)));
    assert_eq!(
        agent_namespaces(agent.pid())?.len(),
        2,
        "one namespace per echo pod, none for the unknown image"
    );

    // Deleted: the processes and namespaces go with the pods.
    deployments
        .delete("echo", &DeleteParams::foreground())
        .await?;
    wait::until("the echo pods' namespaces to be removed", T, || async {
        let left = agent_namespaces(agent.pid()).map_err(|e| e.to_string())?;
        Ok(left.is_empty().then_some(()))
    })
    .await?;
    let bridge = format!("hfb{}", agent.pid());
    drop(agent);
    let links = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()?;
    assert!(
        !String::from_utf8_lossy(&links.stdout).contains(&format!(" {bridge}:")),
        "the agent's bridge outlived it"
    );
    Ok(())
}
