//! The local Kubernetes the other tests stand on: a real kube-apiserver and etcd, kubectl,
//! grpcurl, kube-rs, ServiceAccount identities and test hosts in a network namespace.

use futures::{StreamExt, TryStreamExt};
use holdfast_tests::cluster::{LocalCluster, client_from_kubeconfig, tools_bin};
use holdfast_tests::netns::TestNet;
use holdfast_tests::wait::{self, T};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams, WatchEvent, WatchParams};

fn fixture(name: &str) -> String {
    holdfast_tests::repo_root()
        .join("tests/fixtures")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[tokio::test]
async fn kubectl_applies_service_endpointslice_ingressclass_and_ingress() -> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "kubectl").await?;

    cluster.kubectl_run(&["apply", "-f", &fixture("ingressclass.yaml")])?;
    let applied =
        cluster.kubectl_run(&["-n", &ns, "apply", "-f", &fixture("basic-ingress.yaml")])?;
    assert!(applied.contains("service/web created"), "{applied}");
    assert!(
        applied.contains("endpointslice.discovery.k8s.io/web-1 created"),
        "{applied}"
    );
    assert!(
        applied.contains("ingress.networking.k8s.io/web created"),
        "{applied}"
    );

    let listed = cluster.kubectl_run(&["get", "ingress", "-A"])?;
    let line = listed
        .lines()
        .find(|l| l.starts_with(&ns))
        .unwrap_or_else(|| panic!("ingress of {ns} not listed:\n{listed}"));
    assert!(line.contains("web.example.test"), "{line}");
    assert!(line.contains("holdfast-fixture"), "{line}");

    let version = std::process::Command::new(tools_bin()?.join("grpcurl"))
        .arg("-version")
        .output()?;
    let text = String::from_utf8_lossy(&version.stdout).to_string()
        + &String::from_utf8_lossy(&version.stderr);
    assert!(
        text.contains("grpcurl v1.9."),
        "grpcurl -version printed {text:?}"
    );

    let kubectl_version = cluster.kubectl_run(&["version", "-o", "json"])?;
    let v: serde_json::Value = serde_json::from_str(&kubectl_version)?;
    let pins =
        std::fs::read_to_string(holdfast_tests::repo_root().join("deploy/local/versions.env"))?;
    let pinned = pins
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .expect("versions.env pins KUBERNETES_VERSION");
    assert_eq!(
        v["clientVersion"]["gitVersion"], pinned,
        "{kubectl_version}"
    );
    assert_eq!(
        v["serverVersion"]["gitVersion"], pinned,
        "{kubectl_version}"
    );
    Ok(())
}

fn ingress(name: &str) -> Ingress {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "rules": [{
                "host": "watch.example.test",
                "http": { "paths": [{
                    "path": "/", "pathType": "Prefix",
                    "backend": { "service": { "name": "web", "port": { "number": 80 } } }
                }]}
            }]
        }
    }))
    .expect("valid Ingress")
}

#[tokio::test]
async fn kube_rs_watch_sees_ingress_added_and_deleted() -> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "watch").await?;
    let api: Api<Ingress> = Api::namespaced(client, &ns);

    // Start watching before the changes, from the namespace's current state.
    let list = api.list(&Default::default()).await?;
    assert!(list.items.is_empty());
    let rv = list
        .metadata
        .resource_version
        .expect("list has a resourceVersion");
    let mut events = api.watch(&WatchParams::default(), &rv).await?.boxed();

    api.create(&PostParams::default(), &ingress("watched"))
        .await?;
    let added = tokio::time::timeout(T, events.try_next()).await??;
    match added {
        Some(WatchEvent::Added(ing)) => assert_eq!(ing.metadata.name.as_deref(), Some("watched")),
        other => panic!("expected ADDED, got {other:?}"),
    }

    api.delete("watched", &DeleteParams::default()).await?;
    let deleted = tokio::time::timeout(T, async {
        // A MODIFIED (deletion timestamp) may come first; DELETED must follow.
        while let Some(ev) = events.try_next().await? {
            if let WatchEvent::Deleted(ing) = ev {
                return Ok::<_, kube::Error>(Some(ing));
            }
        }
        Ok(None)
    })
    .await??;
    let deleted = deleted.expect("watch ended without a DELETED event");
    assert_eq!(deleted.metadata.name.as_deref(), Some("watched"));
    assert!(api.get_opt("watched").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn echo_backends_in_a_test_netns_are_published_and_reached_by_endpointslice_address()
-> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "netns").await?;
    let mut net = TestNet::create("eps")?;
    let a = net.spawn_echo("echo-a", 8080)?;
    let b = net.spawn_echo("echo-b", 8080)?;

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            name: Some("echo-1".into()),
            labels: Some([("kubernetes.io/service-name".into(), "echo".into())].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: [a, b]
            .iter()
            .map(|addr| Endpoint {
                addresses: vec![addr.ip().to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    };
    slices.create(&PostParams::default(), &slice).await?;

    // The same slice with a loopback address is refused: that is why test hosts live in a
    // network namespace.
    let mut loopback = slice.clone();
    loopback.metadata.name = Some("echo-loopback".into());
    loopback.endpoints[0].addresses = vec!["127.0.0.1".into()];
    let refused = slices.create(&PostParams::default(), &loopback).await;
    match refused {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 422, "{status:?}"),
        other => panic!("a loopback EndpointSlice address was not refused: {other:?}"),
    }

    // Read the addresses back from the API server and reach each backend by them.
    let stored = slices.get("echo-1").await?;
    let port = stored.ports.as_ref().unwrap()[0].port.unwrap();
    let mut names = Vec::new();
    for ep in &stored.endpoints {
        let addr = format!("{}:{port}", ep.addresses[0]);
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "5", &format!("http://{addr}/")])
            .output()?;
        assert!(
            out.status.success(),
            "curl {addr}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        names.push(String::from_utf8(out.stdout)?.trim().to_owned());
    }
    names.sort();
    assert_eq!(names, ["echo-a", "echo-b"]);
    Ok(())
}

#[tokio::test]
async fn service_account_without_list_services_gets_403() -> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "rbac").await?;
    let pp = PostParams::default();

    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "limited" } }))?;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(&pp, &sa)
        .await?;
    let role = Role {
        metadata: ObjectMeta {
            name: Some("ingress-reader".into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["networking.k8s.io".into()]),
            resources: Some(vec!["ingresses".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), &ns)
        .create(&pp, &role)
        .await?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("limited-ingress-reader".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "ingress-reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "limited".into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .create(&pp, &binding)
        .await?;

    let kubeconfig = cluster.service_account_kubeconfig(&ns, "limited")?;
    let limited = client_from_kubeconfig(&kubeconfig).await?;

    // The identity works (RBAC bindings take effect asynchronously in the authorizer cache).
    let ingresses: Api<Ingress> = Api::namespaced(limited.clone(), &ns);
    wait::until("the ServiceAccount can list ingresses", T, || {
        let ingresses = ingresses.clone();
        async move {
            ingresses
                .list(&Default::default())
                .await
                .map(|_| Some(()))
                .map_err(|e| e.to_string())
        }
    })
    .await?;

    match Api::<Service>::namespaced(limited, &ns)
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status.message.contains("cannot list resource \"services\""),
                "{status:?}"
            );
        }
        other => panic!("listing services without permission was not refused: {other:?}"),
    }
    Ok(())
}
