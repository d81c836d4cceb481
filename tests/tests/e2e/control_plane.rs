//! The control plane against the real kube-apiserver: snapshots, versions, health,
//! reflection, 503 backends, held mass deletions, coalescing, Events, proxies' status.
//!
//! Each test gets its own namespace and its own IngressClass (`--ingress-class`), so tests
//! share one API server without seeing each other's routes.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use holdfast_proto::v1::Snapshot;
use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::{ControlPlane, kubeconfig_via};
use holdfast_tests::faultproxy::{FaultProxy, Mode};
use holdfast_tests::grpcurl::{call, grpcurl};
use holdfast_tests::objects::{self, create, create_class, delete};
use holdfast_tests::subscriber::{Subscriber, routes};
use holdfast_tests::wait;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use holdfast_tests::wait::T;

struct Setup {
    cluster: &'static LocalCluster,
    client: kube::Client,
    ns: String,
    class: String,
    logs: PathBuf,
}

async fn setup(prefix: &str) -> anyhow::Result<Setup> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, prefix).await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    let logs = holdfast_tests::e2e_logs(&ns)?;
    Ok(Setup {
        cluster,
        client,
        ns,
        class,
        logs,
    })
}

impl Setup {
    fn control_plane(&self, extra: &[&str]) -> anyhow::Result<ControlPlane> {
        let mut args = vec!["--ingress-class", self.class.as_str()];
        args.extend_from_slice(extra);
        for (flag, value) in [("--debounce", "50ms"), ("--max-delay", "500ms")] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        ControlPlane::start(
            "control-plane",
            &self.cluster.kubeconfig(),
            &self.logs,
            &args,
        )
    }

    fn host(&self, name: &str) -> String {
        format!("{name}.{}.test", self.ns)
    }

    /// Service `web` (80 → 8080) with one ready endpoint, and Ingress `name` to it.
    async fn web_and_ingress(&self, name: &str) -> anyhow::Result<()> {
        let ns = Some(self.ns.as_str());
        if Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .get_opt("web")
            .await?
            .is_none()
        {
            create(&self.client, ns, &objects::service("web", 80, 8080)).await?;
            create(
                &self.client,
                ns,
                &objects::endpoint_slice("web-1", "web", 8080, &["10.200.0.10"]),
            )
            .await?;
        }
        create(
            &self.client,
            ns,
            &objects::ingress(name, &self.class, &self.host(name), "web", 80),
        )
        .await?;
        Ok(())
    }
}

fn route_hosts(s: &Snapshot) -> Vec<String> {
    routes(s).into_iter().map(|r| r.0).collect()
}

#[tokio::test]
async fn grpcurl_lists_and_describes_services_and_reflection_v1alpha_answers() -> anyhow::Result<()>
{
    let s = setup("reflect").await?;
    let cp = s.control_plane(&[])?;
    let listed = wait::until("grpcurl list", T, || async {
        grpcurl(cp.grpc, None, &["list"])
            .map(Some)
            .map_err(|e| e.to_string())
    })
    .await?;
    for service in [
        "holdfast.v1.Admin",
        "holdfast.v1.RouteDiscovery",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            listed.lines().any(|l| l == service),
            "{service} not in:\n{listed}"
        );
    }
    let described = grpcurl(cp.grpc, None, &["describe", "holdfast.v1.Admin"])?;
    assert!(described.contains("rpc ApproveHeldSnapshot"), "{described}");
    let described = grpcurl(cp.grpc, None, &["describe", "holdfast.v1.Snapshot"])?;
    assert!(described.contains("cluster_revision"), "{described}");

    // Older clients speak reflection v1alpha.
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    let channel = holdfast_tests::tls::Planes::get()
        .channel(&cp.grpc_url(), None)
        .await?;
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(futures::stream::iter([request]))
        .await?
        .into_inner();
    let response = responses.next().await.expect("a reflection response")?;
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected v1alpha response {response:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "holdfast.v1.RouteDiscovery"),
        "{list:?}"
    );
    Ok(())
}

#[tokio::test]
async fn subscriber_gets_a_snapshot_of_created_objects_and_a_new_version_per_change()
-> anyhow::Result<()> {
    let s = setup("versions").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let first = sub
        .wait_for("the route to web", T, |snap| !routes(snap).is_empty())
        .await?;
    assert_eq!(
        routes(&first),
        [(s.host("a"), "/".into(), format!("{}/web:80", s.ns))]
    );
    let backend = &first.backends[0];
    let eps: Vec<_> = backend
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.port))
        .collect();
    assert_eq!(eps, [("10.200.0.10", 8080)]);
    let source = holdfast_proto::snapshot::ingress_hosts(&first)[0].routes[0]
        .source
        .clone()
        .unwrap();
    assert_eq!(
        (source.namespace.as_str(), source.name.as_str()),
        (s.ns.as_str(), "a")
    );
    assert_eq!(
        first.version,
        format!("{}-{}", first.cluster_revision, &first.content_hash[..16])
    );

    // An Ingress change: a second path.
    let ingresses: Api<Ingress> = Api::namespaced(s.client.clone(), &s.ns);
    let two_paths = objects::ingress_paths(
        "a",
        &s.class,
        &s.host("a"),
        &[("/", "Prefix", "web", 80), ("/v2", "Exact", "web", 80)],
    );
    let mut current = ingresses.get("a").await?;
    current.spec = two_paths.spec;
    ingresses
        .replace("a", &Default::default(), &current)
        .await?;
    let second = sub
        .wait_for("two routes", T, |snap| routes(snap).len() == 2)
        .await?;
    assert!(second.cluster_revision > first.cluster_revision);
    assert_ne!(second.content_hash, first.content_hash);

    // A Service port change: the Ingress's port 80 no longer exists -> 503 backend, route kept.
    let services: Api<Service> = Api::namespaced(s.client.clone(), &s.ns);
    let patch =
        json!({ "spec": { "ports": [{ "name": "http", "port": 81, "targetPort": 8080 }] } });
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let third = sub
        .wait_for("the port change", T, |snap| {
            !snap.backends[0].unavailable_reason.is_empty()
        })
        .await?;
    assert_eq!(
        third.backends[0].unavailable_reason,
        format!("service {}/web has no port 80", s.ns)
    );
    assert_eq!(routes(&third).len(), 2, "routes are kept");
    assert!(third.cluster_revision > second.cluster_revision);
    let patch =
        json!({ "spec": { "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }] } });
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let fourth = sub
        .wait_for("the port restored", T, |snap| {
            snap.backends[0].unavailable_reason.is_empty()
        })
        .await?;

    // An EndpointSlice change: a second ready endpoint.
    let slices: Api<EndpointSlice> = Api::namespaced(s.client.clone(), &s.ns);
    let mut slice = slices.get("web-1").await?;
    slice.endpoints =
        objects::endpoint_slice("web-1", "web", 8080, &["10.200.0.10", "10.200.0.11"]).endpoints;
    slices.replace("web-1", &Default::default(), &slice).await?;
    let fifth = sub
        .wait_for("two endpoints", T, |snap| {
            snap.backends[0].endpoints.len() == 2
        })
        .await?;
    assert!(fifth.cluster_revision > fourth.cluster_revision);

    // GetSnapshot through grpcurl shows the same version, in readable JSON.
    let got = call(cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}")?;
    assert_eq!(got["version"], fifth.version.as_str());
    assert_eq!(
        holdfast_tests::grpcurl::ingress_hosts(&got, "gatewayHosts")[0]["routes"][1]["matchKind"],
        "MATCH_KIND_PREFIX"
    );
    Ok(())
}

#[tokio::test]
async fn cold_start_with_the_api_server_unreachable_sends_nothing_and_is_not_serving()
-> anyhow::Result<()> {
    let s = setup("cold").await?;
    s.web_and_ingress("a").await?;
    let proxy = FaultProxy::start(([127, 0, 0, 1], s.cluster.apiserver_port()?).into()).await?;
    proxy.set(Mode::Refuse);
    let kubeconfig = kubeconfig_via(
        &s.cluster.kubeconfig(),
        proxy.addr(),
        s.logs.join("via-proxy.kubeconfig"),
    )?;
    let cp = ControlPlane::start(
        "control-plane",
        &kubeconfig,
        &s.logs,
        &[
            "--ingress-class",
            &s.class,
            "--debounce",
            "50ms",
            "--max-delay",
            "500ms",
            "--api-connect-timeout",
            "1s",
        ],
    )?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "early-proxy", None).await?;

    // Wait until the control plane has tried and failed, then look for a while.
    wait::until("a recorded watch error", T, || async {
        let status =
            call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        let failed = status["caches"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["lastError"].is_string()));
        Ok(failed.then_some(()))
    })
    .await?;
    assert!(
        sub.next(Duration::from_secs(3)).await?.is_none(),
        "a snapshot was sent without a complete cache"
    );
    let health = call(cp.grpc, "grpc.health.v1.Health/Check", "{}")?;
    assert_eq!(health["status"], "NOT_SERVING");
    let rd = call(
        cp.grpc,
        "grpc.health.v1.Health/Check",
        r#"{"service":"holdfast.v1.RouteDiscovery"}"#,
    )?;
    assert_eq!(rd["status"], "NOT_SERVING");
    let (code, body) = cp.admin_get("/readyz").await?;
    assert_eq!(code, 503, "{body}");
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    assert_ne!(status["ready"], true);
    assert!(grpcurl(cp.grpc, Some("{}"), &["holdfast.v1.Admin/GetSnapshot"]).is_err());

    // The API server comes back: the first snapshot is complete.
    proxy.set(Mode::Pass);
    let first = sub
        .next(T)
        .await?
        .expect("a snapshot once the API server is reachable");
    let first = sub.ack(first).await?;
    assert_eq!(route_hosts(&first), [s.host("a")]);
    assert_eq!(first.backends[0].endpoints.len(), 1);
    wait::until("health SERVING", T, || async {
        let h = call(cp.grpc, "grpc.health.v1.Health/Check", "{}").map_err(|e| e.to_string())?;
        Ok((h["status"] == "SERVING").then_some(()))
    })
    .await?;
    assert_eq!(cp.admin_get("/readyz").await?.0, 200);
    Ok(())
}

#[tokio::test]
async fn a_missing_service_gives_a_503_backend_and_never_removes_the_route() -> anyhow::Result<()> {
    let s = setup("missing").await?;
    s.web_and_ingress("a").await?;
    let ns = Some(s.ns.as_str());
    create(
        &s.client,
        ns,
        &objects::ingress("ghost", &s.class, &s.host("ghost"), "ghost", 80),
    )
    .await?;
    let cp = s.control_plane(&[])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let snap = sub
        .wait_for("both routes", T, |snap| routes(snap).len() == 2)
        .await?;
    let ghost = snap
        .backends
        .iter()
        .find(|b| b.name.ends_with("/ghost:80"))
        .expect("ghost backend");
    assert!(ghost.endpoints.is_empty());
    assert_eq!(
        ghost.unavailable_reason,
        format!("service {}/ghost not found", s.ns)
    );

    // Deleting a Service that exists keeps its route too.
    delete::<Service>(&s.client, &s.ns, "web").await?;
    let snap = sub
        .wait_for("web unavailable", T, |snap| {
            snap.backends
                .iter()
                .any(|b| b.name.ends_with("/web:80") && !b.unavailable_reason.is_empty())
        })
        .await?;
    assert_eq!(route_hosts(&snap), [s.host("a"), s.host("ghost")]);
    Ok(())
}

/// Deletes every Ingress in the namespace at once.
async fn delete_all_ingresses(s: &Setup) -> anyhow::Result<()> {
    Api::<Ingress>::namespaced(s.client.clone(), &s.ns)
        .delete_collection(&Default::default(), &ListParams::default())
        .await?;
    Ok(())
}

async fn held_version(cp: &ControlPlane) -> anyhow::Result<String> {
    wait::until("a held snapshot in GetStatus", T, || async {
        let status =
            call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        Ok(status["held"]["version"].as_str().map(str::to_owned))
    })
    .await
}

#[tokio::test]
async fn removing_all_ingresses_is_held_until_approved_with_grpcurl() -> anyhow::Result<()> {
    let s = setup("heldapprove").await?;
    s.web_and_ingress("a").await?;
    s.web_and_ingress("b").await?;
    let cp = s.control_plane(&["--hold-confirm-after", "1h"])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let before = sub
        .wait_for("two routes", T, |snap| routes(snap).len() == 2)
        .await?;

    delete_all_ingresses(&s).await?;
    let held = held_version(&cp).await?;
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    assert_eq!(status["held"]["routesPublished"], 2);
    assert_eq!(status["held"]["routesHeld"].as_u64().unwrap_or(0), 0);
    assert!(
        status["held"]["reason"]
            .as_str()
            .unwrap()
            .contains("removes all 2 routes"),
        "{status}"
    );
    assert_eq!(status["held"]["heldRouteCount"], 2);
    assert_eq!(status["publishedVersion"], before.version.as_str());
    assert_eq!(cp.metric("holdfast_snapshot_held").await?, Some(1.0));
    assert!(
        sub.next(Duration::from_secs(2)).await?.is_none(),
        "the held removal was sent"
    );

    // Approving another version is refused; approving the held one publishes it.
    let wrong = grpcurl(
        cp.grpc,
        Some(r#"{"version":"1-0000000000000000"}"#),
        &["holdfast.v1.Admin/ApproveHeldSnapshot"],
    );
    assert!(
        wrong
            .unwrap_err()
            .to_string()
            .contains("FailedPrecondition")
    );
    let approved = call(
        cp.grpc,
        "holdfast.v1.Admin/ApproveHeldSnapshot",
        &json!({ "version": held }).to_string(),
    )?;
    let after = sub
        .wait_for("the approved snapshot", T, |snap| routes(snap).is_empty())
        .await?;
    assert_eq!(approved["publishedVersion"], after.version.as_str());
    assert_eq!(cp.metric("holdfast_snapshot_held").await?, Some(0.0));
    assert_eq!(
        cp.metric(r#"holdfast_snapshot_hold_releases_total{by="approval"}"#)
            .await?,
        Some(1.0)
    );
    Ok(())
}

#[tokio::test]
async fn removing_all_ingresses_is_released_after_a_stable_period_and_a_fresh_read()
-> anyhow::Result<()> {
    let s = setup("heldconfirm").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&["--hold-confirm-after", "2s"])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    sub.wait_for("the route", T, |snap| routes(snap).len() == 1)
        .await?;

    delete_all_ingresses(&s).await?;
    held_version(&cp).await?;
    let after = sub
        .wait_for("the confirmed snapshot", T, |snap| routes(snap).is_empty())
        .await?;
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    assert!(status.get("held").is_none(), "{status}");
    assert_eq!(status["publishedVersion"], after.version.as_str());
    assert_eq!(
        cp.metric(r#"holdfast_snapshot_hold_releases_total{by="confirmation"}"#)
            .await?,
        Some(1.0)
    );
    assert_eq!(
        cp.metric(r#"holdfast_snapshot_hold_releases_total{by="approval"}"#)
            .await?,
        None,
        "released by confirmation, not by an operator"
    );
    Ok(())
}

#[tokio::test]
async fn a_burst_of_1000_changes_yields_a_handful_of_snapshots() -> anyhow::Result<()> {
    let s = setup("burst").await?;
    // One Ingress with 1,000 paths to 1,000 Services that do not exist yet.
    let paths: Vec<(String, String)> = (0..1000)
        .map(|i| (format!("/p{i}"), format!("s{i}")))
        .collect();
    let path_refs: Vec<(&str, &str, &str, i32)> = paths
        .iter()
        .map(|(p, svc)| (p.as_str(), "Prefix", svc.as_str(), 80))
        .collect();
    create(
        &s.client,
        Some(&s.ns),
        &objects::ingress_paths("many", &s.class, &s.host("many"), &path_refs),
    )
    .await?;
    let cp = s.control_plane(&["--debounce", "100ms", "--max-delay", "1s"])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    sub.wait_for("1,000 routes", T, |snap| routes(snap).len() == 1000)
        .await?;
    let published_before = cp
        .metric_value("holdfast_snapshots_published_total")
        .await?;

    // 1,000 changes: every Service appears, each one changing its backend.
    let services: Api<Service> = Api::namespaced(s.client.clone(), &s.ns);
    futures::stream::iter(0..1000)
        .map(|i| {
            let services = services.clone();
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": { "name": format!("s{i}") },
                    "spec": { "clusterIP": "None", "ports": [{ "port": 80 }] }
                }))?;
                services.create(&Default::default(), &svc).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    sub.wait_for("every Service resolved", T, |snap| {
        snap.backends
            .iter()
            .all(|b| b.unavailable_reason.starts_with("no ready endpoints"))
    })
    .await?;
    let published = cp
        .metric_value("holdfast_snapshots_published_total")
        .await?
        - published_before;
    eprintln!("1,000 changes produced {published} snapshots");
    assert!(
        (1.0..=20.0).contains(&published),
        "1,000 changes produced {published} snapshots"
    );
    Ok(())
}

#[tokio::test]
async fn a_conflicting_rule_is_skipped_with_an_event_and_other_routes_are_unaffected()
-> anyhow::Result<()> {
    let s = setup("conflict").await?;
    s.web_and_ingress("alpha").await?;
    let ns = Some(s.ns.as_str());
    // Created after "alpha" (or in the same second: then namespace/name decides, and
    // "alpha" < "beta" too). Same host and path as "alpha", plus a path of its own.
    let beta = objects::ingress_paths(
        "beta",
        &s.class,
        &s.host("alpha"),
        &[("/", "Prefix", "web", 80), ("/mine", "Prefix", "web", 80)],
    );
    create(&s.client, ns, &beta).await?;
    let cp = s.control_plane(&[])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let snap = sub
        .wait_for("both paths", T, |snap| routes(snap).len() == 2)
        .await?;
    let sources: Vec<_> = holdfast_proto::snapshot::ingress_hosts(&snap)[0]
        .routes
        .iter()
        .map(|r| (r.path.clone(), r.source.clone().unwrap().name))
        .collect();
    assert_eq!(
        sources,
        [
            ("/mine".to_string(), "beta".to_string()),
            ("/".into(), "alpha".into())
        ]
    );

    let event = objects::warning_event(&s.client, &s.ns, "ConflictingRoute", "beta").await?;
    assert!(event.note.unwrap_or_default().contains("alpha"));
    assert_eq!(
        cp.metric(r#"holdfast_problems{reason="ConflictingRoute"}"#)
            .await?,
        Some(1.0)
    );
    Ok(())
}

/// A proxy that refuses a snapshot as not newer than the one it serves (behind for some
/// kind) is offered the same content again once this replica has seen further (here: a
/// Service no route uses, so the content does not change), and no sooner than 2 s after
/// the refusal.
#[tokio::test]
async fn a_snapshot_refused_as_not_newer_is_offered_again_at_newer_progress() -> anyhow::Result<()>
{
    let s = setup("reoffer").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "waiting-proxy", None).await?;
    let first = sub.next(T).await?.expect("a snapshot");
    let refused = std::time::Instant::now();
    sub.nack_not_newer(&first, "waiting: test").await?;
    create(
        &s.client,
        Some(&s.ns),
        &objects::service("unused", 80, 8080),
    )
    .await?;
    let again = sub.next(T).await?.expect("offered again");
    assert!(
        refused.elapsed() >= Duration::from_secs(2),
        "offered again after {:?}",
        refused.elapsed()
    );
    let progress = |s: &Snapshot| s.progress.iter().map(|p| p.resource_version).sum::<u64>();
    let (a, b) = (
        first.into_snapshot().expect("a complete snapshot"),
        again.into_snapshot().expect("a complete snapshot"),
    );
    assert_eq!(a.content_hash, b.content_hash, "the same content");
    assert!(
        progress(&b) > progress(&a),
        "{:?} -> {:?}",
        a.progress,
        b.progress
    );
    Ok(())
}

#[tokio::test]
async fn list_proxies_shows_acked_versions_and_the_last_nack() -> anyhow::Result<()> {
    let s = setup("proxies").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut good = Subscriber::connect(&cp.grpc_url(), "good-proxy", None).await?;
    let snap = good
        .wait_for("the route", T, |snap| !routes(snap).is_empty())
        .await?;
    let mut bad = Subscriber::connect(&cp.grpc_url(), "bad-proxy", None).await?;
    let response = bad.next(T).await?.expect("a snapshot");
    bad.nack(&response, "route table rejected: test NACK")
        .await?;

    let proxies = wait::until("both proxies reported", T, || async {
        let list =
            call(cp.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        let proxies = list["proxies"].as_array().cloned().unwrap_or_default();
        let nacked = proxies.iter().any(|p| p["lastNackError"].is_string());
        let acked = proxies
            .iter()
            .any(|p| p["ackedVersion"] == snap.version.as_str());
        Ok((nacked && acked).then_some(proxies))
    })
    .await?;
    let find = |id: &str| {
        proxies
            .iter()
            .find(|p| p["id"] == id)
            .cloned()
            .expect("listed")
    };
    let g = find("good-proxy");
    assert_eq!(g["ackedVersion"], snap.version.as_str());
    assert!(g["peerAddress"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(g["connectedSince"].is_string());
    let b = find("bad-proxy");
    assert_eq!(b["lastNackVersion"], snap.version.as_str());
    assert_eq!(b["lastNackError"], "route table rejected: test NACK");
    assert!(
        b.get("ackedVersion").is_none(),
        "the NACKing proxy has acked nothing: {b}"
    );
    assert_eq!(cp.metric("holdfast_proxy_nacks_total").await?, Some(1.0));
    assert_eq!(cp.metric("holdfast_proxies_connected").await?, Some(2.0));
    // The NACKed snapshot is not resent.
    assert!(bad.next(Duration::from_secs(1)).await?.is_none());
    assert!(g.get("persistError").is_none(), "{g}");

    // A proxy that serves a snapshot it could not persist says so in its ACK.
    let mut full = Subscriber::connect(&cp.grpc_url(), "full-disk-proxy", None).await?;
    let response = full.next(T).await?.expect("a snapshot");
    full.ack_persisted(response, "no space left on device")
        .await?;
    wait::until("the persist error in ListProxies", T, || async {
        let list =
            call(cp.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        let proxies = list["proxies"].as_array().cloned().unwrap_or_default();
        Ok(proxies
            .iter()
            .any(|p| p["id"] == "full-disk-proxy" && p["persistError"] == "no space left on device")
            .then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_reconnecting_proxy_that_holds_the_current_snapshot_is_not_resent_it()
-> anyhow::Result<()> {
    let s = setup("reconnect").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let snap = sub
        .wait_for("the route", T, |snap| !routes(snap).is_empty())
        .await?;
    drop(sub);

    let mut again = Subscriber::connect(&cp.grpc_url(), "proxy-1", Some(snap.clone())).await?;
    assert!(
        again.next(Duration::from_secs(2)).await?.is_none(),
        "an unchanged snapshot was resent"
    );
    // A real change still arrives.
    s.web_and_ingress("b").await?;
    let next = again
        .wait_for("the new route", T, |snap| routes(snap).len() == 2)
        .await?;
    assert!(next.cluster_revision > snap.cluster_revision);
    Ok(())
}

#[tokio::test]
async fn a_stuck_proxy_delays_nobody_and_is_sent_the_newest_snapshot_when_it_answers()
-> anyhow::Result<()> {
    let s = setup("stuck").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut stuck = Subscriber::connect(&cp.grpc_url(), "stuck-proxy", None).await?;
    let unanswered = stuck.next(T).await?.expect("a first snapshot");
    let mut live = Subscriber::connect(&cp.grpc_url(), "live-proxy", None).await?;
    live.wait_for("one route", T, |snap| routes(snap).len() == 1)
        .await?;

    // Two changes flow to the live proxy while the stuck one answers nothing.
    s.web_and_ingress("b").await?;
    live.wait_for("two routes", T, |snap| routes(snap).len() == 2)
        .await?;
    s.web_and_ingress("c").await?;
    let newest = live
        .wait_for("three routes", T, |snap| routes(snap).len() == 3)
        .await?;
    assert!(
        stuck.next(Duration::from_millis(500)).await?.is_none(),
        "a backlog built up for the stuck proxy"
    );

    // It answers: the next thing it gets is the newest snapshot, not the one in between.
    stuck.ack(unanswered).await?;
    let next = stuck.next(T).await?.expect("the newest snapshot");
    assert_eq!(next.version_info, newest.version);
    Ok(())
}

/// Tenants: a host belongs to the namespace of its oldest Ingress (another namespace
/// cannot take a path on it), ExternalName backends are off by default, and only the
/// namespaces in --default-backend-namespaces may set the cluster-wide default backend;
/// each is skipped with a Warning Event and a problem in GetStatus, and nothing else
/// changes.
#[tokio::test]
async fn another_namespace_cannot_take_a_path_on_a_host_and_external_names_are_off()
-> anyhow::Result<()> {
    let s = setup("tenants").await?;
    s.web_and_ingress("site").await?;
    let other = s.cluster.namespace(&s.client, "tenants-b").await?;
    create(&s.client, Some(&other), &objects::service("web", 80, 8080)).await?;
    let grab = objects::ingress_paths(
        "grab",
        &s.class,
        &s.host("site"),
        &[("/admin", "Prefix", "web", 80)],
    );
    create(&s.client, Some(&other), &grab).await?;
    // Both namespaces set a defaultBackend; the other namespace's Ingress is older, so
    // it would win if --default-backend-namespaces did not leave it out.
    let with_default = |name: &str| -> anyhow::Result<Ingress> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "ingressClassName": s.class,
                      "defaultBackend": { "service": { "name": "web", "port": { "number": 80 } } } }
        }))?)
    };
    create(&s.client, Some(&other), &with_default("catch-all")?).await?;
    create(&s.client, Some(&s.ns), &with_default("fallback")?).await?;
    let external: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "ext" },
        "spec": { "type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local",
                  "ports": [{ "name": "http", "port": 80 }] }
    }))?;
    create(&s.client, Some(&s.ns), &external).await?;
    create(
        &s.client,
        Some(&s.ns),
        &objects::ingress("to-ext", &s.class, &s.host("ext"), "ext", 80),
    )
    .await?;

    let cp = s.control_plane(&["--default-backend-namespaces", &s.ns])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let snap = sub
        .wait_for("the site and the ExternalName route", T, |snap| {
            route_hosts(snap).len() == 2
        })
        .await?;
    let default = snap.default_backend.as_ref().expect("a default backend");
    assert_eq!(default.backend, format!("{}/web:80", s.ns), "{default:?}");
    let hosts = holdfast_proto::snapshot::ingress_hosts(&snap);
    let site = hosts
        .iter()
        .find(|v| v.host == s.host("site"))
        .expect("site");
    assert_eq!(site.routes.len(), 1, "only the owner's path: {site:?}");
    let ext = snap
        .backends
        .iter()
        .find(|b| b.name.ends_with("/ext:80"))
        .expect("ext backend");
    assert!(ext.external_name.is_empty(), "{ext:?}");
    assert!(!ext.unavailable_reason.is_empty(), "{ext:?}");

    objects::warning_event(&s.client, &other, "HostOwnedByOtherNamespace", "grab").await?;
    objects::warning_event(&s.client, &s.ns, "ExternalNameDisabled", "to-ext").await?;
    objects::warning_event(&s.client, &other, "DefaultBackendNotAllowed", "catch-all").await?;
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    let problems = status["problems"].as_array().cloned().unwrap_or_default();
    for (reason, name) in [
        ("HostOwnedByOtherNamespace", "grab"),
        ("ExternalNameDisabled", "to-ext"),
        ("DefaultBackendNotAllowed", "catch-all"),
    ] {
        assert!(
            problems
                .iter()
                .any(|p| p["reason"] == reason && p["name"] == name),
            "{reason}: {status}"
        );
    }
    Ok(())
}

/// The gRPC server caps what one client can hold: streams per proven identity, and the
/// length of node ids and zones.
#[tokio::test]
async fn route_streams_are_capped_per_identity_and_node_ids_are_bounded() -> anyhow::Result<()> {
    let s = setup("grpc-limits").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&["--max-streams-per-identity", "2"])?;
    let code = |r: anyhow::Result<Subscriber>| match r {
        Ok(_) => None,
        Err(e) => e.downcast_ref::<tonic::Status>().map(tonic::Status::code),
    };
    let first = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let _second = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    assert_eq!(
        code(Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await),
        Some(tonic::Code::ResourceExhausted)
    );
    // Another identity is unaffected, and a closed stream frees its slot.
    let _other = Subscriber::connect(&cp.grpc_url(), "proxy-2", None).await?;
    drop(first);
    wait::until("a free slot for proxy-1", T, || async {
        Ok(Subscriber::connect(&cp.grpc_url(), "proxy-1", None)
            .await
            .ok()
            .map(|_| ()))
    })
    .await?;

    // A node id longer than a DNS name, over a channel with a valid certificate.
    let channel = holdfast_tests::tls::Planes::get()
        .channel(&cp.grpc_url(), Some("proxy-3"))
        .await?;
    let first = holdfast_proto::v1::DiscoveryRequest {
        node: Some(holdfast_proto::v1::Node {
            id: "p".repeat(254),
            zone: String::new(),
        }),
        ..Default::default()
    };
    let refused = holdfast_proto::client::route_discovery(channel.clone())
        .stream_routes(tokio_stream::iter([first]))
        .await
        .expect_err("a 254-byte node id is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    let long_zone = holdfast_proto::v1::DiscoveryRequest {
        node: Some(holdfast_proto::v1::Node {
            id: "proxy-3".into(),
            zone: "z".repeat(64),
        }),
        ..Default::default()
    };
    let refused = holdfast_proto::client::route_discovery(channel)
        .stream_routes(tokio_stream::iter([long_zone]))
        .await
        .expect_err("a 64-byte zone is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    // The admin listener closes a connection that sends nothing.
    let mut silent = tokio::net::TcpStream::connect(cp.admin).await?;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let read =
        tokio::time::timeout(T, tokio::io::AsyncReadExt::read(&mut silent, &mut buf)).await?;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // After the 1 s first-byte deadline, well before the 5 s head deadline.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "closed after {took:?}"
    );
    drop(cp);

    // --grpc-max-connection-age: at its age a connection gets GOAWAY (NO_ERROR), its open
    // streams run on for the grace, then it is closed; proxies reconnect (and spread over
    // replicas after a rollout). Watched frame by frame, with a route stream open: neither
    // the GOAWAY nor the close may come early, and the stream ends by nothing else.
    const AGE: Duration = Duration::from_secs(1);
    const GRACE: Duration = Duration::from_secs(1);
    let cp = s.control_plane(&[
        "--grpc-max-connection-age",
        "1s",
        "--grpc-max-connection-age-grace",
        "1s",
    ])?;
    use holdfast_tests::h2raw::{self, DATA, GOAWAY, HEADERS, RST_STREAM};
    use tokio::io::AsyncWriteExt;
    let connecting = std::time::Instant::now();
    let mut conn = holdfast_tests::tls::Planes::get()
        .raw_h2(cp.grpc, "proxy-1")
        .await?;
    h2raw::start(&mut conn).await?;
    let request = holdfast_proto::v1::DiscoveryRequest {
        node: Some(holdfast_proto::v1::Node {
            id: "proxy-1".into(),
            zone: String::new(),
        }),
        ..Default::default()
    };
    let call = h2raw::grpc_block("localhost", "/holdfast.v1.RouteDiscovery/StreamRoutes");
    conn.write_all(&h2raw::frame(HEADERS, 0x4, 1, &call))
        .await?;
    let message = h2raw::grpc_message(&prost::Message::encode_to_vec(&request));
    conn.write_all(&h2raw::frame(DATA, 0, 1, &message)).await?;
    let (frames, closed) =
        h2raw::frames_until_closed(&mut conn, connecting, AGE + GRACE + Duration::from_secs(5))
            .await?;
    let summary: Vec<(Duration, u8, u32, Option<u32>)> = frames
        .iter()
        .map(|f| (f.at, f.kind, f.stream, f.goaway_code()))
        .collect();
    eprintln!("closed after {closed:?}; frames (at, type, stream, GOAWAY code): {summary:?}");
    let goaway = frames
        .iter()
        .find(|f| f.kind == GOAWAY)
        .ok_or_else(|| anyhow::anyhow!("closed without a GOAWAY: {summary:?}"))?;
    assert!(
        frames
            .iter()
            .any(|f| f.kind == DATA && f.stream == 1 && f.at < goaway.at),
        "the route stream was not served before the GOAWAY: {summary:?}"
    );
    assert!(
        goaway.at >= AGE,
        "GOAWAY after {:?}, before the connection's age",
        goaway.at
    );
    assert!(
        goaway.at < AGE + Duration::from_secs(2),
        "GOAWAY only after {:?}",
        goaway.at
    );
    assert!(
        frames
            .iter()
            .all(|f| f.goaway_code().is_none_or(|c| c == 0)),
        "a GOAWAY with an error: {summary:?}"
    );
    assert!(
        !frames.iter().any(|f| f.stream == 1
            && (f.kind == RST_STREAM || (f.kind == HEADERS && f.flags & 0x1 != 0))),
        "the route stream ended by itself, not with the connection: {summary:?}"
    );
    assert!(
        closed >= AGE + GRACE,
        "closed after {closed:?}, before the age and the grace"
    );
    Ok(())
}

/// Over mutual TLS, the gRPC server announces its per-connection stream cap and closes a
/// connection that resets its requests as fast as it opens them (CVE-2023-44487); a
/// proxy's route stream on another connection keeps being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_server_caps_streams_per_connection_and_cuts_a_rapid_reset_flood()
-> anyhow::Result<()> {
    use holdfast_tests::h2raw::{self, HEADERS, MAX_CONCURRENT_STREAMS, RST_STREAM};
    let s = setup("grpc-h2").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&["--grpc-max-concurrent-streams", "7"])?;
    anyhow::ensure!(cp.tls, "this test is about the mutual-TLS listener");
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    sub.wait_for("the route", T, |snap| routes(snap).len() == 1)
        .await?;

    const CALLS: u32 = 20_000;
    let call = h2raw::grpc_block("localhost", "/grpc.health.v1.Health/Check");
    let per_call = 2 * 9 + call.len() + 4;
    let rapid = (0..CALLS).flat_map(move |i| {
        let id = 2 * i + 1;
        [
            h2raw::frame(HEADERS, 0x4, id, &call),
            h2raw::frame(RST_STREAM, 0, id, &8u32.to_be_bytes()), // CANCEL
        ]
    });
    let mut conn = holdfast_tests::tls::Planes::get()
        .raw_h2(cp.grpc, "proxy-flood")
        .await?;
    h2raw::start(&mut conn).await?;
    let flooded = h2raw::flood(conn, rapid).await?;
    eprintln!("{flooded:?}");
    assert!(
        flooded.settings.contains(&(MAX_CONCURRENT_STREAMS, 7)),
        "SETTINGS_MAX_CONCURRENT_STREAMS: {:?}",
        flooded.settings
    );
    // ENHANCE_YOUR_CALM (RFC 9113 §7): the flood is what ended it, not another error.
    assert_eq!(
        flooded.goaway,
        Some(0xb),
        "no GOAWAY ENHANCE_YOUR_CALM: {flooded:?}"
    );
    assert!(
        flooded.written < CALLS as usize * per_call,
        "the rapid reset ran to the end: {} bytes",
        flooded.written
    );

    // The proxy's stream on its own connection still gets the next change.
    s.web_and_ingress("b").await?;
    sub.wait_for("the new route", T, |snap| routes(snap).len() == 2)
        .await?;
    Ok(())
}

/// To a proxy that accepts deltas and states what it holds, a change goes as a delta
/// from that base; a NACKed delta is answered with the complete snapshot and counted.
#[tokio::test]
async fn a_nacked_delta_is_answered_with_the_complete_snapshot() -> anyhow::Result<()> {
    let s = setup("delta-resync").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut plain = Subscriber::connect(&cp.grpc_url(), "plain", None).await?;
    let held = plain
        .wait_for("the route", T, |snap| routes(snap).len() == 1)
        .await?;
    let mut sub =
        Subscriber::connect_with(&cp.grpc_url(), "deltas", Some(held.clone()), 0, true).await?;
    assert!(
        sub.next(Duration::from_millis(300)).await?.is_none(),
        "it holds the current snapshot: nothing to send"
    );

    s.web_and_ingress("b").await?;
    let response = sub.next(T).await?.expect("a response");
    let change = response
        .delta
        .clone()
        .expect("a delta, not the complete snapshot");
    assert_eq!(change.base_version, held.version);
    // The new Ingress host, in the one route model.
    assert_eq!(change.upserted_gateway_hosts.len(), 1, "{change:?}");
    assert_eq!(
        change.upserted_gateway_hosts[0].listener,
        holdfast_proto::snapshot::INGRESS_LISTENER
    );
    assert!(change.upserted_virtual_hosts.is_empty() && change.removed_virtual_hosts.is_empty());
    assert!(change.removed_gateway_hosts.is_empty());
    sub.nack(&response, "delta to a base I do not have").await?;

    let full = sub.next(T).await?.expect("the resync");
    assert!(full.delta.is_none());
    let snapshot = full.clone().into_snapshot().expect("the complete snapshot");
    assert_eq!(snapshot.version, change.version);
    assert_eq!(routes(&snapshot).len(), 2);
    assert_eq!(cp.metric("holdfast_delta_resyncs_total").await?, Some(1.0));
    assert_eq!(cp.metric("holdfast_deltas_sent_total").await?, Some(1.0));
    sub.ack(full).await?;
    Ok(())
}

/// A proxy states its --max-snapshot-bytes in its first request: the control plane does
/// not send it a larger snapshot (it would be refused, or not even decodable) and shows
/// why in ListProxies, while proxies with room get it.
#[tokio::test]
async fn a_snapshot_over_a_proxys_stated_limit_is_not_sent_to_it() -> anyhow::Result<()> {
    let s = setup("proxy-limit").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut roomy = Subscriber::connect(&cp.grpc_url(), "roomy", None).await?;
    let first = roomy
        .wait_for("the route", T, |snap| routes(snap).len() == 1)
        .await?;
    let size = prost::Message::encoded_len(&first) as u64;
    let mut tight = Subscriber::connect_limited(&cp.grpc_url(), "tight", None, size + 64).await?;
    tight
        .wait_for("the route", T, |snap| routes(snap).len() == 1)
        .await?;

    // Ten more Ingresses: far over the tight proxy's limit.
    for i in 0..10 {
        s.web_and_ingress(&format!("more-{i}")).await?;
    }
    let bigger = roomy
        .wait_for("eleven routes", T, |snap| routes(snap).len() == 11)
        .await?;
    assert!(prost::Message::encoded_len(&bigger) as u64 > size + 64);
    let nack = wait::until("the tight proxy's NACK in ListProxies", T, || async {
        let list =
            call(cp.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        let proxies = list["proxies"].as_array().cloned().unwrap_or_default();
        Ok(proxies
            .into_iter()
            .find(|p| p["id"] == "tight" && p["lastNackVersion"] == bigger.version.as_str()))
    })
    .await?;
    let reason = nack["lastNackError"].as_str().unwrap_or_default();
    assert!(reason.contains("--max-snapshot-bytes"), "{nack}");
    assert_eq!(nack["ackedVersion"], first.version.as_str(), "{nack}");
    // Recorded instead of sent: nothing reaches the tight proxy.
    assert!(tight.next(Duration::from_millis(300)).await?.is_none());
    Ok(())
}

/// A snapshot over --max-snapshot-bytes is held with the reason in GetStatus; neither a
/// fresh read nor an operator can release it, and the proxies keep the last one. An
/// Ingress over the per-Ingress limits is skipped with an Event.
#[tokio::test]
async fn a_snapshot_over_the_size_limit_is_held_and_cannot_be_approved() -> anyhow::Result<()> {
    let s = setup("snapshot-limit").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[
        "--max-snapshot-bytes",
        "3000",
        "--max-paths-per-ingress",
        "100",
        "--hold-confirm-after",
        "1s",
    ])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let before = sub
        .wait_for("the route", T, |snap| routes(snap).len() == 1)
        .await?;

    let many = |n: usize| -> Vec<(String, &'static str, &'static str, i32)> {
        (0..n)
            .map(|i| (format!("/path-number-{i}"), "Prefix", "web", 80))
            .collect()
    };
    let paths = many(60);
    let paths: Vec<(&str, &str, &str, i32)> = paths
        .iter()
        .map(|(p, k, b, n)| (p.as_str(), *k, *b, *n))
        .collect();
    let big = objects::ingress_paths("big", &s.class, &s.host("big"), &paths);
    create(&s.client, Some(&s.ns), &big).await?;
    let held = held_version(&cp).await?;
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    let reason = status["held"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("--max-snapshot-bytes"), "{status}");
    assert_eq!(status["publishedVersion"], before.version.as_str());
    let refused = grpcurl(
        cp.grpc,
        Some(&json!({ "version": held }).to_string()),
        &["holdfast.v1.Admin/ApproveHeldSnapshot"],
    );
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("FailedPrecondition")
    );
    // Past the confirmation period it is still held, and nothing was sent.
    assert!(sub.next(Duration::from_secs(3)).await?.is_none());
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    assert_eq!(status["held"]["version"], held.as_str());

    // Over --max-paths-per-ingress: that Ingress is skipped, so the rest publishes.
    let paths = many(101);
    let paths: Vec<(&str, &str, &str, i32)> = paths
        .iter()
        .map(|(p, k, b, n)| (p.as_str(), *k, *b, *n))
        .collect();
    let bigger = objects::ingress_paths("big", &s.class, &s.host("big"), &paths);
    Api::<Ingress>::namespaced(s.client.clone(), &s.ns)
        .patch(
            "big",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&bigger),
        )
        .await?;
    objects::warning_event(&s.client, &s.ns, "IngressTooLarge", "big").await?;
    wait::until("no hold", T, || async {
        let status =
            call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        Ok(status.get("held").is_none().then_some(()))
    })
    .await?;
    // The skipped Ingress leaves what was published as it was: nothing new to send.
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    assert_eq!(status["publishedVersion"], before.version.as_str());
    Ok(())
}

/// `Admin/GetChanges` shows an operator, with the real grpcurl, what changed from a recent
/// version to the published one: the delta a proxy holding that version is sent, with
/// certificates' private keys left out. A version the replica does not keep is NOT_FOUND.
#[tokio::test]
async fn get_changes_shows_the_delta_from_a_recent_version_with_grpcurl() -> anyhow::Result<()> {
    let s = setup("changes").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let published = || {
        call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")
            .ok()
            .and_then(|st| st["publishedVersion"].as_str().map(str::to_owned))
    };
    let first = wait::until("a published version", T, || async { Ok(published()) }).await?;

    // A new host served over TLS with a certificate from a Secret.
    let issued = holdfast_tests::tls::TestCa::new("changes-ca").server(&[&s.host("b")]);
    let ns = Some(s.ns.as_str());
    create(
        &s.client,
        ns,
        &objects::tls_secret("b-tls", &issued.cert_pem, &issued.key_pem),
    )
    .await?;
    create(
        &s.client,
        ns,
        &objects::tls_ingress("b", &s.class, &s.host("b"), "web", 80, "b-tls", json!({})),
    )
    .await?;
    let second = wait::until("a version with host b", T, || async {
        let snap =
            call(cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}").map_err(|e| e.to_string())?;
        let has_b = holdfast_tests::grpcurl::ingress_hosts(&snap, "gatewayHosts")
            .iter()
            .any(|h| h["host"] == s.host("b").as_str());
        Ok(has_b.then(|| snap["version"].as_str().unwrap_or_default().to_owned()))
    })
    .await?;
    assert_ne!(first, second);

    let changes = call(
        cp.grpc,
        "holdfast.v1.Admin/GetChanges",
        &json!({ "fromVersion": first }).to_string(),
    )?;
    assert_eq!(changes["baseVersion"], first.as_str(), "{changes}");
    assert_eq!(changes["version"], second.as_str(), "{changes}");
    let hosts: Vec<&str> = holdfast_tests::grpcurl::ingress_hosts(&changes, "upsertedGatewayHosts")
        .iter()
        .filter_map(|h| h["host"].as_str())
        .collect();
    assert_eq!(
        hosts,
        [s.host("b").as_str()],
        "only the new host: {changes}"
    );
    let certs = changes["upsertedCertificates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(certs.len(), 1, "{changes}");
    assert_eq!(certs[0]["name"], format!("{}/b-tls", s.ns).as_str());
    assert!(certs[0]["certificateChain"].is_string(), "{changes}");
    assert!(
        certs[0].get("privateKey").is_none(),
        "a private key was shown: {changes}"
    );

    // From the published version itself: nothing changed.
    let none = call(
        cp.grpc,
        "holdfast.v1.Admin/GetChanges",
        &json!({ "fromVersion": second }).to_string(),
    )?;
    assert!(none.get("upsertedGatewayHosts").is_none(), "{none}");
    assert!(none.get("upsertedVirtualHosts").is_none(), "{none}");
    assert_eq!(none["version"], second.as_str());

    let unknown = grpcurl(
        cp.grpc,
        Some(&json!({ "fromVersion": "1-0000000000000000" }).to_string()),
        &["holdfast.v1.Admin/GetChanges"],
    )
    .expect_err("an unknown version is refused");
    assert!(unknown.to_string().contains("NotFound"), "{unknown}");
    Ok(())
}

/// A proxy restarting from the state file of a large cluster states an inventory of tens
/// of thousands of resources in its first request (about 70 bytes each): the control plane
/// takes it and answers, rather than refusing the stream as an oversized message.
#[tokio::test]
async fn a_first_request_with_the_inventory_of_a_large_snapshot_is_accepted() -> anyhow::Result<()>
{
    let s = setup("inventory").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    wait::until("a published version", T, || async {
        Ok(call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")
            .ok()
            .and_then(|st| st["publishedVersion"].as_str().map(str::to_owned)))
    })
    .await?;
    // What a proxy of a 10,000-app cluster holds: 20,000 resources.
    let mut held = Snapshot::default();
    for i in 0..10_000 {
        let name = format!("{}/app-{i:05}:80", s.ns);
        held.backends.push(holdfast_proto::v1::Backend {
            name: name.clone(),
            ..Default::default()
        });
        held.virtual_hosts.push(holdfast_proto::v1::VirtualHost {
            host: format!("app-{i:05}.{}.test", s.ns),
            routes: vec![holdfast_proto::v1::Route {
                match_kind: holdfast_proto::v1::MatchKind::Prefix as i32,
                path: "/".into(),
                backend: name,
                source: None,
            }],
            ..Default::default()
        });
    }
    holdfast_proto::snapshot::seal(&mut held, 1);
    let inventory = holdfast_proto::delta::to_wire(&holdfast_proto::delta::inventory(&held));
    let stated = prost::Message::encoded_len(&holdfast_proto::v1::DiscoveryRequest {
        inventory,
        ..Default::default()
    });
    assert!(
        stated > 1 << 20,
        "the inventory is {stated} bytes: not large enough to test"
    );
    let mut sub = Subscriber::connect_with(&cp.grpc_url(), "proxy-1", Some(held), 0, true).await?;
    let response = sub
        .next(T)
        .await?
        .expect("an answer to the large first request");
    assert!(response.delta.is_some() || response.clone().into_snapshot().is_some());
    Ok(())
}

/// The takeover the host claims ledger stops, against the real API server: namespace A
/// holds a dormant Ingress (another class) created before the victim's, and edits it to
/// our class and the victim's host. Ownership by Ingress age would hand A the host; the
/// ledger (recorded by the leader in its ConfigMap) keeps it with the victim, A gets a
/// Warning Event, and A's claim is recorded after the victim's. Once the victim stops
/// naming the host, its claim is released only after `--host-claim-grace`.
#[tokio::test]
async fn a_tenant_editing_an_older_ingress_cannot_take_another_namespaces_host()
-> anyhow::Result<()> {
    let s = setup("tenancy").await?;
    let attacker = s.cluster.namespace(&s.client, "attacker").await?;
    let host = s.host("shop");
    // The dormant Ingress, older than every Ingress of the victim.
    create(
        &s.client,
        Some(&attacker),
        &objects::ingress(
            "old",
            "not-ours",
            &format!("decoy.{attacker}.test"),
            "web",
            80,
        ),
    )
    .await?;
    s.web_and_ingress("keep-1").await?;
    s.web_and_ingress("keep-2").await?;
    create(
        &s.client,
        Some(&s.ns),
        &objects::ingress("site", &s.class, &host, "web", 80),
    )
    .await?;
    let grace = Duration::from_secs(6);
    let cp = s.control_plane(&["--host-claim-grace", "6s"])?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let victims = format!("{}/web:80", s.ns);
    let served_by = |snap: &Snapshot| -> Vec<(String, String)> {
        routes(snap)
            .into_iter()
            .filter(|r| r.0 == host)
            .map(|r| (r.1, r.2))
            .collect()
    };
    sub.wait_for("the victim's host", T, |snap| {
        served_by(snap) == [("/".to_string(), victims.clone())]
    })
    .await?;
    let ledger: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(s.client.clone(), "default");
    let ledger_name = format!("holdfast-host-claims-{}", s.ns);
    let claimants = |ledger: Api<k8s_openapi::api::core::v1::ConfigMap>| {
        let (name, host) = (ledger_name.clone(), host.clone());
        async move {
            let cm = ledger.get_opt(&name).await.map_err(|e| e.to_string())?;
            let Some(json) = cm.and_then(|c| c.data).and_then(|d| d.get(&host).cloned()) else {
                return Ok::<_, String>(Vec::new());
            };
            let claims: Vec<serde_json::Value> =
                serde_json::from_str(&json).map_err(|e| e.to_string())?;
            Ok(claims
                .iter()
                .map(|c| c["namespace"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<String>>())
        }
    };
    wait::until("the victim's claim recorded", T, || async {
        Ok((claimants(ledger.clone()).await? == [s.ns.clone()]).then_some(()))
    })
    .await?;

    // The attack: the old Ingress, edited to our class and the victim's host.
    let attack = objects::ingress_paths(
        "old",
        &s.class,
        &host,
        &[("/", "Prefix", "web", 80), ("/admin", "Prefix", "web", 80)],
    );
    let ingresses: Api<Ingress> = Api::namespaced(s.client.clone(), &attacker);
    ingresses
        .patch(
            "old",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": attack.spec })),
        )
        .await?;
    objects::warning_event(&s.client, &attacker, "HostOwnedByOtherNamespace", "old").await?;
    wait::until(
        "the attacker's claim recorded after the victim's",
        T,
        || async {
            let c = claimants(ledger.clone()).await?;
            Ok((c == [s.ns.clone(), attacker.clone()]).then_some(()))
        },
    )
    .await?;
    // What the control plane publishes now (it built from the edited Ingress: the Event).
    let published = call(cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}")?;
    let vhost = holdfast_tests::grpcurl::ingress_hosts(&published, "gatewayHosts")
        .into_iter()
        .find(|v| v["host"] == host.as_str())
        .cloned()
        .expect("the victim's host is published");
    let served: Vec<(String, String)> = vhost["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["path"].as_str().unwrap_or_default().to_owned(),
                r["backends"][0]["backend"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        served,
        [("/".to_string(), victims.clone())],
        "the attacker's older Ingress took the host"
    );

    // The victim stops naming the host: its claim holds for the grace period, then the
    // attacker's (the next oldest) owns the host.
    let deleted = std::time::Instant::now();
    delete::<Ingress>(&s.client, &s.ns, "site").await?;
    let attackers = format!("{attacker}/web:80");
    sub.wait_for(
        "the host handed over after the grace period",
        3 * T,
        |snap| served_by(snap).iter().any(|(_, b)| *b == attackers),
    )
    .await?;
    assert!(
        deleted.elapsed() >= grace,
        "the claim was released after {:?}, within the {grace:?} grace period",
        deleted.elapsed()
    );
    Ok(())
}

/// The kubelet's probes cannot be starved: silent connections to each plane's admin
/// port from 40 other addresses, 8 each (320 a plane: more than the listener's 256
/// slots), held and re-opened as soon as they are closed for 20 s, while `/readyz` of the
/// control plane and of a proxy is asked every 250 ms; every probe answers 200 within 1 s.
#[tokio::test]
async fn silent_connections_never_starve_the_probes_of_either_plane() -> anyhow::Result<()> {
    let s = setup("probes").await?;
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let state = tempfile::tempdir()?;
    let proxy = holdfast_tests::proxy::ProxyProc::start(
        "proxy-probes",
        &[cp.grpc_url()],
        state.path(),
        &s.logs,
        &[],
    )?;
    for (name, admin) in [("control plane", cp.admin), ("proxy", proxy.admin)] {
        wait::until(&format!("the {name} ready"), T, || async {
            let (code, _) = holdfast_tests::http::get(admin, "localhost", "/readyz")
                .await
                .map_err(|e| e.to_string())?;
            Ok((code == 200).then_some(()))
        })
        .await?;
    }
    let flood_for = Duration::from_secs(20);
    // The flood runs on a thread of its own: its 640 reconnecting tasks never delay the
    // probes' task, so what a probe's time measures is the planes' answer.
    let admins = [cp.admin, proxy.admin];
    let flood = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let floods: Vec<_> = admins
                .into_iter()
                .flat_map(|admin| {
                    (2..42u8).map(move |last| {
                        let from: std::net::IpAddr = [127, 0, 0, last].into();
                        tokio::spawn(holdfast_tests::flood::silent_connections(
                            admin, from, 8, flood_for,
                        ))
                    })
                })
                .collect();
            let mut opened = 0;
            for f in floods {
                opened += f.await?;
            }
            anyhow::Ok(opened)
        })
    });
    let started = std::time::Instant::now();
    let mut probes = 0;
    let mut slowest = Duration::ZERO;
    while started.elapsed() < flood_for {
        for (name, admin) in [("control plane", cp.admin), ("proxy", proxy.admin)] {
            let asked = std::time::Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(1),
                holdfast_tests::http::get(admin, "localhost", "/readyz"),
            )
            .await;
            let took = asked.elapsed();
            match answer {
                Ok(Ok((200, _))) => {}
                other => anyhow::bail!(
                    "the {name}'s /readyz failed after {:?} of flooding: {other:?}",
                    started.elapsed()
                ),
            }
            slowest = slowest.max(took);
            probes += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let opened = tokio::task::spawn_blocking(move || flood.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the flooding thread panicked"))??;
    // The flood was real: far more connections than the 640 held at once, since the
    // listeners close silent ones (after 1 s, or at once past a cap) and they come back.
    assert!(
        opened > 2_000,
        "only {opened} silent connections were opened"
    );
    assert!(probes >= 100, "{probes} probes");
    assert!(
        slowest < Duration::from_secs(1),
        "slowest probe {slowest:?}"
    );
    Ok(())
}

/// `Admin/GetRollout` (with the real grpcurl): an Ingress's generation, whether the
/// published snapshot reflects it, which proxies serve it, and why the others do not (a
/// NACK, a version from before the change, a stream that ended).
#[tokio::test]
async fn get_rollout_says_which_proxies_serve_an_ingress_generation_and_why_the_others_do_not()
-> anyhow::Result<()> {
    let s = setup("rollout").await?;
    let (cp, mut one, mut two) = two_proxies_serving_a(&s).await?;
    let rollout = || rollout_of_a(&s, &cp);
    let first = wait::until("both proxies serving generation 1", T, || async {
        let r = rollout().map_err(|e| e.to_string())?;
        Ok((r["proxiesServing"] == 2).then_some(r))
    })
    .await?;
    assert_eq!(first["generation"], "1", "{first}");
    assert_eq!(first["publishedGeneration"], "1", "{first}");
    assert_eq!(first["proxiesConnected"], 2, "{first}");

    // A new generation: proxy-1 takes it, proxy-2 refuses it.
    new_generation_of_a(&s, "/v2").await?;
    let second = one
        .wait_for("the second path", T, |snap| routes(snap).len() == 2)
        .await?;
    let refused = two.next(T).await?.expect("the new version");
    two.nack(&refused, "refused by the test").await?;
    let r = wait::until("generation 2 on proxy-1 only", T, || async {
        let r = rollout().map_err(|e| e.to_string())?;
        Ok((r["generation"] == "2" && proxy_2_nacked(&r)).then_some(r))
    })
    .await?;
    assert_eq!(r["publishedGeneration"], "2", "{r}");
    assert_eq!(r["publishedVersion"], second.version.as_str(), "{r}");
    assert_eq!(r["proxiesServing"], 1, "{r}");
    let proxy = |r: &serde_json::Value, id: &str| {
        r["proxies"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} in {r}"))
    };
    assert_eq!(proxy(&r, "proxy-1")["serving"], true, "{r}");
    assert_eq!(
        proxy(&r, "proxy-2")["reason"],
        format!("nacked {}: refused by the test", second.version).as_str(),
        "{r}"
    );

    // proxy-1's stream ends: listed as disconnected, and no longer counted as serving.
    drop(one);
    let r = wait::until("proxy-1 disconnected", T, || async {
        let r = rollout().map_err(|e| e.to_string())?;
        Ok((r["proxiesConnected"] == 1).then_some(r))
    })
    .await?;
    let gone = proxy(&r, "proxy-1");
    assert!(gone.get("connected").is_none_or(|c| c == false), "{r}");
    assert!(
        gone["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("disconnected at ")),
        "{r}"
    );
    assert!(r.get("proxiesServing").is_none_or(|n| n == 0), "{r}");

    // Bad questions get clear errors.
    let missing = json!({ "kind": "Ingress", "namespace": s.ns, "name": "nope" }).to_string();
    let e = grpcurl(cp.grpc, Some(&missing), &["holdfast.v1.Admin/GetRollout"]).unwrap_err();
    assert!(e.to_string().contains("NotFound"), "{e}");
    let bad = json!({ "kind": "Pod", "namespace": s.ns, "name": "a" }).to_string();
    let e = grpcurl(cp.grpc, Some(&bad), &["holdfast.v1.Admin/GetRollout"]).unwrap_err();
    assert!(e.to_string().contains("InvalidArgument"), "{e}");
    Ok(())
}

/// Ingress `a` (generation 1) served by two proxies, `proxy-1` and `proxy-2`, of a new
/// control plane; and how to ask that control plane for `a`'s rollout.
async fn two_proxies_serving_a(
    s: &Setup,
) -> anyhow::Result<(ControlPlane, Subscriber, Subscriber)> {
    s.web_and_ingress("a").await?;
    let cp = s.control_plane(&[])?;
    let mut one = Subscriber::connect(&cp.grpc_url(), "proxy-1", None).await?;
    let mut two = Subscriber::connect(&cp.grpc_url(), "proxy-2", None).await?;
    for sub in [&mut one, &mut two] {
        sub.wait_for("the route", T, |snap| routes(snap).len() == 1)
            .await?;
    }
    Ok((cp, one, two))
}

/// `Admin/GetRollout` of Ingress `a`.
fn rollout_of_a(s: &Setup, cp: &ControlPlane) -> anyhow::Result<serde_json::Value> {
    let asked = json!({ "kind": "Ingress", "namespace": s.ns, "name": "a" }).to_string();
    call(cp.grpc, "holdfast.v1.Admin/GetRollout", &asked)
}

/// Gives Ingress `a` a new generation: paths `/` and `extra`.
async fn new_generation_of_a(s: &Setup, extra: &str) -> anyhow::Result<()> {
    let paths = [("/", "Prefix", "web", 80), (extra, "Prefix", "web", 80)];
    let changed = objects::ingress_paths("a", &s.class, &s.host("a"), &paths);
    Api::<Ingress>::namespaced(s.client.clone(), &s.ns)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": changed.spec })),
        )
        .await?;
    Ok(())
}

/// Whether `proxy-2`'s row in a rollout says it refused the version.
fn proxy_2_nacked(r: &serde_json::Value) -> bool {
    r["proxies"].as_array().into_iter().flatten().any(|p| {
        p["id"] == "proxy-2"
            && p["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("nacked"))
    })
}

/// The `Programmed` Events on Ingress `name` in the test's namespace: (message, series
/// count), oldest first.
async fn programmed_events(s: &Setup, name: &str) -> anyhow::Result<Vec<(String, i32)>> {
    use k8s_openapi::api::events::v1::Event;
    let list = Api::<Event>::namespaced(s.client.clone(), &s.ns)
        .list(&ListParams::default())
        .await?;
    let mut found: Vec<_> = list
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Programmed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect();
    found.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(found
        .into_iter()
        .map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count);
            (e.note.unwrap_or_default(), count)
        })
        .collect())
}

#[tokio::test]
async fn an_ingress_generation_served_by_every_proxy_gets_one_programmed_event_and_a_histogram_sample()
-> anyhow::Result<()> {
    let s = setup("programmed").await?;
    let (cp, mut one, mut two) = two_proxies_serving_a(&s).await?;
    let rollout = || rollout_of_a(&s, &cp);
    let samples = "holdfast_object_programmed_seconds_count";
    wait::until("both proxies serving generation 1", T, || async {
        let r = rollout().map_err(|e| e.to_string())?;
        Ok((r["proxiesServing"] == 2).then_some(()))
    })
    .await?;
    // Generation 1 existed before this control plane led: its baseline, not reported.
    wait::until("the leader tracking Ingress a", T, || async {
        let tracked = cp
            .metric_value("holdfast_object_programmed_tracked")
            .await
            .map_err(|e| e.to_string())?;
        Ok((tracked == 1.0).then_some(()))
    })
    .await?;
    assert_eq!(cp.metric_value(samples).await?, 0.0);

    // Generation 2: proxy-1 serves it, proxy-2 refuses it, so it is not served everywhere.
    new_generation_of_a(&s, "/v2").await?;
    one.wait_for("the second path", T, |snap| routes(snap).len() == 2)
        .await?;
    let refused = two.next(T).await?.expect("the new version");
    two.nack(&refused, "refused by the test").await?;
    wait::until("generation 2 on proxy-1 only", T, || async {
        let r = rollout().map_err(|e| e.to_string())?;
        Ok(
            (r["generation"] == "2" && r["proxiesServing"] == 1 && proxy_2_nacked(&r))
                .then_some(()),
        )
    })
    .await?;
    assert!(programmed_events(&s, "a").await?.is_empty());
    assert_eq!(cp.metric_value(samples).await?, 0.0);

    // proxy-2 leaves: every connected proxy now serves generation 2.
    drop(two);
    let events = wait::until("the Programmed Event", T, || async {
        let e = programmed_events(&s, "a")
            .await
            .map_err(|e| e.to_string())?;
        Ok((!e.is_empty()).then_some(e))
    })
    .await?;
    assert_eq!(events.len(), 1, "{events:?}");
    let (message, count) = &events[0];
    assert!(
        message.starts_with("generation 2 is served by all 1 connected proxies ("),
        "{message}"
    );
    assert_eq!(*count, 1, "{events:?}");
    assert_eq!(cp.metric_value(samples).await?, 1.0);

    // A metadata-only change (and our own status writes) is no new generation.
    Api::<Ingress>::namespaced(s.client.clone(), &s.ns)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "touched": "yes" } } })),
        )
        .await?;
    // Generation 3 is reported once it is served: the only second sample.
    new_generation_of_a(&s, "/v3").await?;
    one.wait_for("the third path", T, |snap| {
        routes(snap).iter().any(|(_, path, _)| path == "/v3")
    })
    .await?;
    let events = wait::until("the second Programmed Event", T, || async {
        let e = programmed_events(&s, "a")
            .await
            .map_err(|e| e.to_string())?;
        Ok((e.len() >= 2).then_some(e))
    })
    .await?;
    assert!(
        events[1]
            .0
            .starts_with("generation 3 is served by all 1 connected proxies ("),
        "{events:?}"
    );
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(cp.metric_value(samples).await?, 2.0);
    drop(one);
    Ok(())
}
