//! The fault suite: zero failed requests through API-server, etcd and control-plane
//! outages (docs/design.md, "What holdfast is for"). Every scenario runs real processes:
//! a private kube-apiserver and etcd, the control plane behind a TCP fault proxy, two
//! proxies, echo backends in a test network namespace, and steady traffic.
//!
//! Outage lengths (30 s, 20 s, 60 s) are the faults themselves, so they are timed; every
//! other wait is for a condition with a deadline.

use std::time::{Duration, Instant};

use futures::StreamExt;
use holdfast_tests::cluster::Component;
use holdfast_tests::control_plane::{ControlPlane, kubeconfig_via};
use holdfast_tests::fake_control_plane::FakeControlPlane;
use holdfast_tests::faultproxy::{FaultProxy, Mode};
use holdfast_tests::grpcurl::{call, grpcurl};
use holdfast_tests::objects::{self, create, delete};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::scenario::{Options, Scenario, T, base_cp_args, create_app, route_count};
use holdfast_tests::subscriber::Subscriber;
use holdfast_tests::traffic::{Report, Traffic};
use holdfast_tests::wait;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const RATE: u32 = 200;

fn assert_clean(report: &Report) {
    assert!(
        report.unexpected.is_empty(),
        "non-2xx answers: {}",
        report.summary()
    );
    assert!(report.total > 0, "no traffic was sent");
}

/// Lines of the control plane's log that report a completed list of Ingresses.
fn ingress_lists(cp: &ControlPlane) -> usize {
    cp.proc
        .log()
        .lines()
        .filter(|l| l.contains("cache complete") && l.contains("kind=\"Ingress\""))
        .count()
}

/// Holds the outage for `d`: the fault's own duration, not synchronisation.
async fn outage(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test]
async fn s01_incident_replay_api_server_refuses_connections_for_30s() -> anyhow::Result<()> {
    let s = Scenario::start("s01", Options::default()).await?;
    let hash = s.published_hash()?;
    let published = s.published_total().await?;
    let versions = s.applied_versions().await?;
    let traffic = s.traffic(RATE);

    s.api_fault.set(Mode::Refuse);
    s.api_fault.reset_existing();
    s.wait_cp_watch_error(T).await?;
    outage(Duration::from_secs(30)).await;
    assert_eq!(
        s.published_total().await?,
        published,
        "a snapshot was published during the outage"
    );
    assert_eq!(s.applied_versions().await?, versions);

    s.api_fault.set(Mode::Pass);
    s.wait_cp_synced().await?;
    wait::until("the control plane to read the API again", T, || async {
        let st = call(s.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        Ok((st["ready"] == true).then_some(()))
    })
    .await?;
    let report = traffic.stop().await;
    assert_clean(&report);
    assert_eq!(
        s.published_hash()?,
        hash,
        "content changed across the outage"
    );
    assert_eq!(s.published_total().await?, published);
    assert_eq!(s.applied_versions().await?, versions);
    Ok(())
}

#[tokio::test]
async fn s02_lists_cut_mid_response_during_a_relist_never_publish_a_partial_snapshot()
-> anyhow::Result<()> {
    // Small LIST pages, so a re-list takes several requests and a cut can land after some
    // pages have arrived: a genuinely partial list.
    let opts = Options {
        cp_args: vec!["--list-page-size".into(), "3".into()],
        ..Options::default()
    };
    let s = Scenario::start("s02", opts).await?;
    let hash = s.published_hash()?;
    // Observe everything the control plane publishes from now on.
    let mut observer = Subscriber::connect(&s.cp.grpc_url(), "observer", None).await?;
    let first = observer.next(T).await?.expect("current snapshot");
    let first = observer.ack(first).await?;
    let full = route_count(&first);
    assert_eq!(full, 10);
    let observed = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Ok(Some(r)) = observer.next(Duration::from_secs(120)).await {
            match observer.ack(r).await {
                Ok(snap) => seen.push(route_count(&snap)),
                Err(_) => break,
            }
        }
        seen
    });
    let lists_before = ingress_lists(&s.cp);
    let traffic = s.traffic(RATE);

    // Every connection is cut after 8.5 kB from the server: past the TLS handshake and a
    // few pages, partway into the re-list. Restarting kube-apiserver forces a re-list.
    s.api_fault.set(Mode::CutAfter(8_500));
    s.api_fault.reset_existing();
    s.cluster.stop(Component::KubeApiserver, false)?;
    s.cluster.restart(Component::KubeApiserver)?;
    wait::until("several lists cut mid-response", T, || async {
        Ok((s.api_fault.stats().cut >= 5).then_some(()))
    })
    .await?;
    s.api_fault.set(Mode::Pass);
    s.wait_cp_synced().await?;
    wait::until("a completed re-list of Ingresses", T, || async {
        Ok((ingress_lists(&s.cp) > lists_before).then_some(()))
    })
    .await?;

    let report = traffic.stop().await;
    assert_clean(&report);
    assert_eq!(
        s.published_hash()?,
        hash,
        "routes changed across the cut re-list"
    );
    observed.abort();
    let seen = observed.await.unwrap_or_default();
    assert!(
        seen.iter().all(|n| *n == full),
        "a partial snapshot was published: route counts {seen:?}"
    );
    Ok(())
}

#[tokio::test]
async fn s03_kube_apiserver_and_etcd_sigkilled_and_restarted() -> anyhow::Result<()> {
    let s = Scenario::start("s03", Options::default()).await?;
    let hash = s.published_hash()?;
    let versions = s.applied_versions().await?;
    let traffic = s.traffic(RATE);

    s.cluster.stop(Component::KubeApiserver, true)?;
    s.wait_cp_watch_error(T).await?;
    outage(Duration::from_secs(20)).await;
    s.cluster.restart(Component::KubeApiserver)?;
    s.wait_cp_synced().await?;

    s.cluster.stop(Component::Etcd, true)?;
    outage(Duration::from_secs(5)).await;
    s.cluster.restart(Component::Etcd)?;
    wait::until(
        "the API answering through the restarted etcd",
        T,
        || async {
            let api: Api<Ingress> = Api::namespaced(s.client.clone(), &s.ns);
            api.list(&Default::default())
                .await
                .map(|l| Some(l.items.len()))
                .map_err(|e| e.to_string())
        },
    )
    .await?;
    s.wait_cp_synced().await?;

    let report = traffic.stop().await;
    assert_clean(&report);
    assert_eq!(s.published_hash()?, hash, "routes changed");
    assert_eq!(s.applied_versions().await?, versions);
    Ok(())
}

#[tokio::test]
async fn s04_blackholed_api_server_is_noticed_and_nothing_wrong_is_published() -> anyhow::Result<()>
{
    let s = Scenario::start("s04", Options::default()).await?;
    let hash = s.published_hash()?;
    let published = s.published_total().await?;
    let traffic = s.traffic(RATE);

    let start = Instant::now();
    s.api_fault.set(Mode::Blackhole);
    // --api-read-timeout is 5s: the control plane must notice within a few of those.
    s.wait_cp_watch_error(Duration::from_secs(20)).await?;
    eprintln!("blackhole noticed after {:?}", start.elapsed());
    outage(Duration::from_secs(10)).await;
    assert_eq!(s.published_total().await?, published);

    s.api_fault.set(Mode::Pass);
    s.wait_cp_synced().await?;
    let report = traffic.stop().await;
    assert_clean(&report);
    assert_eq!(s.published_hash()?, hash);
    assert_eq!(s.published_total().await?, published);
    Ok(())
}

#[tokio::test]
async fn s05_control_plane_cold_start_while_the_api_server_is_unreachable() -> anyhow::Result<()> {
    let mut s = Scenario::start("s05", Options::default()).await?;
    let hash = s.published_hash()?;
    let versions = s.applied_versions().await?;
    let traffic = s.traffic(RATE);

    s.cp.proc.kill();
    s.api_fault.set(Mode::Refuse);
    s.api_fault.reset_existing();
    s.cp.restart()?;
    s.wait_cp_watch_error(T).await?;
    // Proxies reconnect to it, and get nothing.
    wait::until(
        "both proxies connected to the new control plane",
        T,
        || async {
            let l = call(s.cp.grpc, "holdfast.v1.Admin/ListProxies", "{}")
                .map_err(|e| e.to_string())?;
            Ok((l["proxies"].as_array().map_or(0, Vec::len) == 2).then_some(()))
        },
    )
    .await?;
    let health = call(s.cp.grpc, "grpc.health.v1.Health/Check", "{}")?;
    assert_eq!(health["status"], "NOT_SERVING");
    assert_eq!(s.cp.admin_get("/readyz").await?.0, 503);
    assert_eq!(s.published_total().await?, 0.0);
    assert_eq!(
        s.applied_versions().await?,
        versions,
        "proxies keep their snapshot"
    );

    s.api_fault.set(Mode::Pass);
    wait::until("the first snapshot", T, || async {
        Ok(s.published_hash().ok())
    })
    .await?;
    assert_eq!(
        s.published_hash()?,
        hash,
        "the first snapshot after the outage differs"
    );
    let snap = s.published()?;
    assert_eq!(
        snap["virtualHosts"].as_array().map(Vec::len),
        Some(10),
        "incomplete first snapshot"
    );
    let report = traffic.stop().await;
    assert_clean(&report);
    Ok(())
}

#[tokio::test]
async fn s06_control_plane_sigkilled_for_60s() -> anyhow::Result<()> {
    let mut s = Scenario::start("s06", Options::default()).await?;
    let versions = s.applied_versions().await?;
    let applied: Vec<Option<f64>> = futures::future::join_all(s.proxies.iter().map(|p| async {
        p.metric("holdfast_proxy_snapshots_applied_total")
            .await
            .ok()
            .flatten()
    }))
    .await;
    let traffic = s.traffic(RATE);

    s.cp.proc.kill();
    outage(Duration::from_secs(60)).await;
    let during = traffic.snapshot();
    assert_clean(&during);
    s.cp.restart()?;
    wait::until(
        "both proxies reconnected, acked at their version",
        T,
        || async {
            let l = call(s.cp.grpc, "holdfast.v1.Admin/ListProxies", "{}")
                .map_err(|e| e.to_string())?;
            let acked: Vec<String> = l["proxies"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|p| p["ackedVersion"].as_str().unwrap_or("").to_owned())
                .collect();
            Ok((acked.len() == 2 && acked.iter().all(|v| versions.contains(v))).then_some(()))
        },
    )
    .await?;
    let report = traffic.stop().await;
    assert_clean(&report);
    assert_eq!(
        s.applied_versions().await?,
        versions,
        "content unchanged, nothing re-applied"
    );
    for (p, before) in s.proxies.iter().zip(applied) {
        assert_eq!(
            p.metric("holdfast_proxy_snapshots_applied_total").await?,
            before,
            "a proxy re-applied"
        );
    }
    Ok(())
}

#[tokio::test]
async fn s07_proxy_restarted_while_the_control_plane_is_down_serves_its_persisted_snapshot()
-> anyhow::Result<()> {
    let mut s = Scenario::start("s07", Options::default()).await?;
    s.cp.proc.kill();
    let other = Traffic::start(&[s.proxies[1].addr], s.hosts(), RATE);

    let started = Instant::now();
    s.proxies[0].restart()?;
    let host = s.host(0);
    wait::until("the restarted proxy serving", T, || async {
        Ok(matches!(s.proxies[0].get(&host, "/").await, Ok((200, _))).then_some(()))
    })
    .await?;
    let took = started.elapsed();
    eprintln!("restarted proxy served from its state file {took:?} after starting");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let restarted = Traffic::start(&[s.proxies[0].addr], s.hosts(), RATE);
    wait::until("traffic through the restarted proxy", T, || async {
        Ok((restarted.snapshot().total >= 500).then_some(()))
    })
    .await?;
    assert_clean(&restarted.stop().await);
    assert_clean(&other.stop().await);
    Ok(())
}

#[tokio::test]
async fn s08_corrupt_or_truncated_state_file_is_rejected_and_recovered_from() -> anyhow::Result<()>
{
    let mut s = Scenario::start("s08", Options::default()).await?;
    let file = s.proxies[0].state_dir.join("snapshot.bin");
    let good = std::fs::read(&file)?;
    for damaged in [good[..good.len() - 7].to_vec(), {
        let mut c = good.clone();
        c[60] ^= 1;
        c
    }] {
        s.cp.proc.kill();
        s.proxies[0].proc.kill();
        std::fs::write(&file, &damaged)?;
        s.proxies[0].restart()?;
        assert_eq!(s.proxies[0].admin_get("/readyz").await?.0, 503);
        assert_eq!(s.proxies[0].admin_get("/debug/snapshot").await?.0, 503);
        for host in s.hosts() {
            let (code, body) = s.proxies[0].get(&host, "/").await?;
            assert_eq!(code, 503, "served from a partial table? {body}");
        }
        assert!(s.proxies[0].proc.log().contains("rejected the state file"));
        s.cp.restart()?;
        s.proxies[0].wait_ready(T).await?;
        s.wait_all_served().await?;
    }
    Ok(())
}

#[tokio::test]
async fn s09_invalid_snapshot_is_nacked_old_routes_keep_serving_and_list_proxies_shows_nacks()
-> anyhow::Result<()> {
    let mut s = Scenario::start(
        "s09",
        Options {
            proxies: 1,
            ..Options::default()
        },
    )
    .await?;
    // The real snapshot, fetched with the Admin API, is the proxy's good starting point.
    // (As an operator: Admin is for --admin-identities only.)
    let channel = holdfast_tests::tls::Planes::get()
        .channel(&s.cp.grpc_url(), None)
        .await?;
    let mut admin = holdfast_proto::v1::admin_client::AdminClient::new(channel);
    let real = admin
        .get_snapshot(holdfast_proto::v1::GetSnapshotRequest {})
        .await?
        .into_inner();

    let fake = FakeControlPlane::start(None).await?;
    let mut newer = real.clone();
    newer.virtual_hosts.push(holdfast_proto::v1::VirtualHost {
        host: format!("extra.{}.test", s.ns),
        routes: newer.virtual_hosts[0].routes.clone(),
        ..Default::default()
    });
    // Ahead of the real control plane for every kind.
    for p in &mut newer.progress {
        p.resource_version += 1000;
    }
    holdfast_proto::snapshot::seal(&mut newer, real.cluster_revision + 1000);
    fake.push(newer.clone());
    let state = tempfile::tempdir()?;
    let mut p = ProxyProc::start("proxy-fake", &[fake.url()], state.path(), &s.logs, &[])?;
    p.wait_ready(T).await?;
    let traffic = Traffic::start(&[p.addr], s.hosts(), RATE);

    // Invalid: a route to a backend that is not there.
    let mut bad = newer.clone();
    bad.virtual_hosts[0].routes[0].backend = "nowhere/none:80".into();
    holdfast_proto::snapshot::seal(&mut bad, real.cluster_revision + 1001);
    fake.push(bad);
    let nack = wait::until("the NACK", T, || async {
        Ok(fake
            .requests()
            .into_iter()
            .find(|r| r.error_detail.is_some()))
    })
    .await?;
    assert!(
        nack.error_detail
            .unwrap()
            .message
            .contains("nowhere/none:80")
    );
    assert_eq!(
        p.metric("holdfast_proxy_snapshot_nacks_total").await?,
        Some(1.0)
    );
    wait::until("more traffic on the old routes", T, || async {
        Ok((traffic.snapshot().total > 400).then_some(()))
    })
    .await?;
    assert_clean(&traffic.stop().await);

    // A real control plane sees a NACK too: this proxy holds a newer revision than the
    // control plane offers, so it refuses it, and ListProxies says so.
    p.proc.kill();
    drop(fake);
    let mut args = p.proc.args().to_vec();
    let i = args
        .iter()
        .position(|a| a == "--control-plane")
        .expect("flag");
    args[i + 1] = s.cp.grpc_url();
    // The real control plane speaks mutual TLS (the stand-in spoke plaintext).
    args.retain(|a| a != "--insecure-plaintext");
    args.extend(holdfast_tests::tls::Planes::get().proxy_flags("proxy-fake"));
    p.proc.restart_with(args)?;
    let proxies = wait::until("ListProxies showing the NACK", T, || async {
        let l =
            call(s.cp.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        let found = l["proxies"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .find(|p| p["id"] == "proxy-fake" && p["lastNackError"].is_string());
        Ok(found)
    })
    .await?;
    assert!(
        proxies["lastNackError"].as_str().unwrap().contains("older"),
        "{proxies}"
    );
    assert_eq!(proxies["ackedVersion"], newer.version.as_str());
    s.proxies.push(p);
    Ok(())
}

#[tokio::test]
async fn s10_mass_deletion_is_held_until_approved_with_grpcurl() -> anyhow::Result<()> {
    let s = Scenario::start(
        "s10",
        Options {
            cp_args: vec!["--hold-confirm-after".into(), "1h".into()],
            ..Options::default()
        },
    )
    .await?;
    let versions = s.applied_versions().await?;
    let traffic = s.traffic(RATE);

    Api::<Ingress>::namespaced(s.client.clone(), &s.ns)
        .delete_collection(&Default::default(), &ListParams::default())
        .await?;
    let held = wait::until("the held snapshot", T, || async {
        let st = call(s.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        Ok(st["held"]["version"].as_str().map(str::to_owned))
    })
    .await?;
    wait::until("more traffic while held", T, || async {
        Ok((traffic.snapshot().total > 1000).then_some(()))
    })
    .await?;
    assert_clean(&traffic.stop().await);
    assert_eq!(
        s.applied_versions().await?,
        versions,
        "the held snapshot reached a proxy"
    );

    let approved = grpcurl(
        s.cp.grpc,
        Some(&json!({ "version": held }).to_string()),
        &["holdfast.v1.Admin/ApproveHeldSnapshot"],
    )?;
    assert!(approved.contains("publishedVersion"), "{approved}");
    for p in &s.proxies {
        for host in s.hosts() {
            wait::until(&format!("{host} 404 after approval"), T, || async {
                Ok(matches!(p.get(&host, "/").await, Ok((404, _))).then_some(()))
            })
            .await?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn s11_deleting_one_of_ten_ingresses_flows_within_2s_and_others_never_fail()
-> anyhow::Result<()> {
    let s = Scenario::start("s11", Options::default()).await?;
    let traffic = s.traffic(RATE);
    let gone = s.host(3);
    let deleted = Instant::now();
    delete::<Ingress>(&s.client, &s.ns, "app3").await?;
    for p in &s.proxies {
        wait::until(
            "the deleted host to answer 404",
            Duration::from_secs(5),
            || async { Ok(matches!(p.get(&gone, "/").await, Ok((404, _))).then_some(())) },
        )
        .await?;
    }
    let took = deleted.elapsed();
    eprintln!("deletion reached both proxies in {took:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    wait::until("more traffic", T, || async {
        Ok((traffic.snapshot().total > 800).then_some(()))
    })
    .await?;
    let report = traffic.stop().await;
    let others = report.unexpected_except(&[&gone]);
    assert!(
        others.is_empty(),
        "other hosts failed: {}",
        report.summary()
    );
    assert!(
        report.unexpected.iter().all(|u| u.status == 404),
        "{}",
        report.summary()
    );
    Ok(())
}

#[tokio::test]
async fn s12_service_deleted_while_its_ingress_stays_answers_503_not_404() -> anyhow::Result<()> {
    let s = Scenario::start("s12", Options::default()).await?;
    let traffic = s.traffic(RATE);
    let host = s.host(4);
    delete::<Service>(&s.client, &s.ns, "app4").await?;
    for p in &s.proxies {
        wait::until("503 for the Service-less route", T, || async {
            Ok(matches!(p.get(&host, "/").await, Ok((503, _))).then_some(()))
        })
        .await?;
    }
    wait::until("more traffic", T, || async {
        Ok((traffic.snapshot().total > 800).then_some(()))
    })
    .await?;
    let report = traffic.stop().await;
    assert!(
        report.unexpected_except(&[&host]).is_empty(),
        "{}",
        report.summary()
    );
    assert_eq!(
        report.count(&host, 404),
        0,
        "the route was removed: {}",
        report.summary()
    );
    assert!(report.count(&host, 503) > 0);
    Ok(())
}

#[tokio::test]
async fn s13_lost_permission_to_list_services_keeps_the_control_plane_not_ready()
-> anyhow::Result<()> {
    let mut s = Scenario::start("s13", Options::default()).await?;
    let hash = s.published_hash()?;
    let versions = s.applied_versions().await?;
    apply_split_rbac(&s, &["cp"])?;
    let sa = s.cluster.service_account_kubeconfig(&s.ns, "holdfast-cp")?;
    let sa = kubeconfig_via(&sa, s.api_fault.addr(), s.logs.join("cp-sa.kubeconfig"))?;
    let args = base_cp_args(&s.class);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (grpc, admin) = (s.cp.grpc, s.cp.admin);

    // With the full ServiceAccount permissions it works.
    s.cp.proc.kill();
    s.cp = ControlPlane::start_at("control-plane-sa", &sa, &s.logs, &args, grpc, admin)?;
    wait::until("the ServiceAccount control plane publishing", T, || async {
        Ok(s.published_hash().ok())
    })
    .await?;
    assert_eq!(s.published_hash()?, hash);

    let traffic = s.traffic(RATE);
    s.cluster.kubectl_run(&[
        "delete",
        "clusterrolebinding",
        &format!("{}-services-cp", s.ns),
    ])?;
    s.cp.proc.kill();
    s.cp = ControlPlane::start_at(
        "control-plane-sa-restarted",
        &sa,
        &s.logs,
        &args,
        grpc,
        admin,
    )?;
    let status = wait::until("a 403 on Services in GetStatus", T, || async {
        let st = call(s.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        let service = st["caches"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .find(|c| c["kind"] == "Service");
        Ok(service.filter(|c| {
            c["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("permission denied (403)"))
        }))
    })
    .await?;
    assert_ne!(status["synced"], true);
    assert!(
        status["lastError"]
            .as_str()
            .unwrap()
            .contains(r#"cannot list resource \"services\""#)
            || status["lastError"]
                .as_str()
                .unwrap()
                .contains(r#"cannot list resource "services""#),
        "{status}"
    );
    let log = s.cp.proc.log();
    assert!(
        log.contains("permission denied (403)") && log.contains("services"),
        "the log does not say what is missing:\n{log}"
    );
    assert_eq!(
        call(s.cp.grpc, "grpc.health.v1.Health/Check", "{}")?["status"],
        "NOT_SERVING"
    );
    assert_eq!(s.cp.admin_get("/readyz").await?.0, 503);
    wait::until("more traffic", T, || async {
        Ok((traffic.snapshot().total > 800).then_some(()))
    })
    .await?;
    assert_eq!(
        s.published_total().await?,
        0.0,
        "it published without Services"
    );
    assert_eq!(s.applied_versions().await?, versions);
    assert_clean(&traffic.stop().await);
    Ok(())
}

#[tokio::test]
async fn s14_a_proxy_reconnecting_to_a_lagging_replica_does_not_move_backwards()
-> anyhow::Result<()> {
    let mut s = Scenario::start(
        "s14",
        Options {
            proxies: 0,
            ..Options::default()
        },
    )
    .await?;
    // Replica B, with its own path to the API server.
    let fault_b = FaultProxy::start(([127, 0, 0, 1], s.cluster.apiserver_port()?).into()).await?;
    let kube_b = kubeconfig_via(
        &s.cluster.kubeconfig(),
        fault_b.addr(),
        s.logs.join("cp-b.kubeconfig"),
    )?;
    let args = base_cp_args(&s.class);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cp_b = ControlPlane::start("control-plane-b", &kube_b, &s.logs, &args)?;
    wait::until("replica B publishing", T, || async {
        Ok(call(cp_b.grpc, "holdfast.v1.Admin/GetSnapshot", "{}").ok())
    })
    .await?;
    s.add_proxy("proxy-ab", &[s.cp.grpc_url(), cp_b.grpc_url()])?;
    s.wait_all_served().await?;

    // B is cut off from the API server while a change happens.
    fault_b.set(Mode::Refuse);
    fault_b.reset_existing();
    s.create_app(10).await?;
    let new_host = s.host(10);
    wait::until("the new host served", T, || async {
        Ok(matches!(s.proxies[0].get(&new_host, "/").await, Ok((200, _))).then_some(()))
    })
    .await?;
    let mut hosts = s.hosts();
    hosts.push(new_host.clone());
    let traffic = Traffic::start(&s.proxy_addrs(), hosts, RATE);
    let version = s.applied_versions().await?[0].clone();

    // A goes away: the proxy reconnects to B, which offers an older cluster state.
    s.cp.proc.kill();
    let nack = wait::until("the proxy refusing B's older snapshot", T, || async {
        let l =
            call(cp_b.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        Ok(l["proxies"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .find(|p| p["lastNackError"].is_string()))
    })
    .await?;
    // Behind for every kind B watched ("older"), or behind for some and ahead for a
    // quiet kind whose bookmark B saw last ("waiting"): refused either way.
    let why = nack["lastNackError"].as_str().unwrap_or_default();
    assert!(why.contains("older") || why.contains("waiting"), "{nack}");
    assert_eq!(
        s.applied_versions().await?[0],
        version,
        "the proxy moved backwards"
    );
    wait::until("more traffic", T, || async {
        Ok((traffic.snapshot().total > 600).then_some(()))
    })
    .await?;
    let report = traffic.stop().await;
    assert_clean(&report);
    assert!(report.count(&new_host, 200) > 0);
    Ok(())
}

/// Compacts etcd at its current revision through its JSON gateway on 127.0.0.1.
fn compact_etcd(s: &Scenario) -> anyhow::Result<u64> {
    let port = std::fs::read_to_string(s.cluster.dir().join("etcd.port"))?
        .trim()
        .to_owned();
    let post = |path: &str, body: &str| -> anyhow::Result<serde_json::Value> {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "-X",
                "POST",
                &format!("http://127.0.0.1:{port}{path}"),
                "-d",
                body,
            ])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let range = post("/v3/kv/range", r#"{"key":"AA=="}"#)?;
    let rev: u64 = range["header"]["revision"]
        .as_str()
        .unwrap_or("0")
        .parse()?;
    post(
        "/v3/kv/compaction",
        &json!({ "revision": rev.to_string(), "physical": true }).to_string(),
    )?;
    Ok(rev)
}

#[tokio::test]
async fn s15_watch_expiry_410_after_etcd_compaction_relists_without_route_flaps()
-> anyhow::Result<()> {
    let s = Scenario::start("s15", Options::default()).await?;
    let hash = s.published_hash()?;
    let versions = s.applied_versions().await?;
    let published = s.published_total().await?;
    let lists_before = ingress_lists(&s.cp);
    let traffic = s.traffic(RATE);

    // Disconnect the watches, move the cluster on, compact, and restart the API server so
    // resuming from the old resourceVersion is impossible (410 Gone).
    s.api_fault.set(Mode::Refuse);
    s.api_fault.reset_existing();
    s.wait_cp_watch_error(T).await?;
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(s.client.clone(), &s.ns);
    futures::stream::iter(0..50)
        .for_each_concurrent(8, |i| {
            let configmaps = configmaps.clone();
            async move {
                let cm =
                    serde_json::from_value(json!({ "metadata": { "name": format!("churn-{i}") } }))
                        .expect("valid");
                let _ = configmaps.create(&PostParams::default(), &cm).await;
            }
        })
        .await;
    let rev = compact_etcd(&s)?;
    eprintln!("compacted etcd at revision {rev}");
    s.cluster.stop(Component::KubeApiserver, false)?;
    s.cluster.restart(Component::KubeApiserver)?;
    s.api_fault.set(Mode::Pass);

    wait::until("a re-list of Ingresses", T, || async {
        Ok((ingress_lists(&s.cp) > lists_before).then_some(()))
    })
    .await?;
    s.wait_cp_synced().await?;
    // The watch error kube-apiserver sends for a compacted resourceVersion (410 Gone),
    // as GetStatus shows it.
    let status = call(s.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    let expired = status["caches"].as_array().into_iter().flatten().any(|c| {
        c["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("too old resource version") && e.ends_with("Expired (410)"))
    });
    assert!(expired, "no 410 Gone in GetStatus: {status}");
    let report = traffic.stop().await;
    assert_clean(&report);
    assert_eq!(s.published_hash()?, hash, "routes flapped");
    assert_eq!(
        s.published_total().await?,
        published,
        "a snapshot was published during the re-list"
    );
    assert_eq!(s.applied_versions().await?, versions);
    Ok(())
}

/// The requests the API server has completed with `verb` (its `apiserver_request_total`,
/// summed over resources and codes). In a private cluster these are the control plane's
/// and the test's own.
async fn api_requests(client: &kube::Client, verb: &str) -> anyhow::Result<f64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let label = format!("verb=\"{verb}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[tokio::test]
async fn s16_a_silent_partition_from_the_api_server_is_noticed_and_a_later_change_arrives_within_15s()
-> anyhow::Result<()> {
    // Default --api-connect-timeout and --api-read-timeout: the defaults must notice.
    let s = Scenario::start(
        "s16",
        Options {
            default_api_timeouts: true,
            ..Options::default()
        },
    )
    .await?;
    let started = Instant::now();
    let watches = api_requests(&s.client, "WATCH").await?;
    let lists = api_requests(&s.client, "LIST").await?;
    let traffic = s.traffic(RATE);

    // Every connection the control plane has to the API server stops delivering, with no
    // FIN or RST; new connections pass. Then a change is made (directly, not through the
    // fault proxy).
    s.api_fault.set(Mode::StallExisting);
    let cut = Instant::now();
    let new = s.ingresses;
    s.create_app(new).await?;
    let host = s.host(new);
    for p in &s.proxies {
        let left = Duration::from_secs(15).saturating_sub(cut.elapsed());
        wait::until(
            "the Ingress created after the cut to be served",
            left,
            || async { Ok(matches!(p.get(&host, "/").await, Ok((200, _))).then_some(())) },
        )
        .await?;
    }
    let took = cut.elapsed();
    eprintln!("a change after a silent partition reached both proxies in {took:?}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // The partition was real: watches failed (read timeout) and were re-established.
    s.wait_cp_watch_error(T).await?;
    // Re-watched from the last resourceVersion: nothing was listed again.
    assert_eq!(
        api_requests(&s.client, "LIST").await?,
        lists,
        "the control plane re-listed"
    );

    // The cost of noticing: watch requests a minute, over a minute of the default
    // configuration (the measurement window is timed, not a synchronisation).
    outage(Duration::from_secs(60).saturating_sub(started.elapsed())).await;
    let per_minute = (api_requests(&s.client, "WATCH").await? - watches)
        / started.elapsed().as_secs_f64()
        * 60.0;
    eprintln!("watch requests per minute with default flags: {per_minute:.1}");
    assert!(
        per_minute <= 60.0,
        "{per_minute:.1} watch requests a minute"
    );
    let report = traffic.stop().await;
    assert_clean(&report);
    Ok(())
}

/// Sets the endpoints of app `app`'s EndpointSlice in `ns` to `addresses`.
async fn set_endpoints(
    client: &kube::Client,
    ns: &str,
    app: &str,
    addresses: &[&str],
) -> anyhow::Result<()> {
    let api: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), ns);
    let endpoints: Vec<_> = addresses
        .iter()
        .map(|a| json!({ "addresses": [a], "conditions": { "ready": true } }))
        .collect();
    api.patch(
        &format!("{app}-1"),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({ "endpoints": endpoints })),
    )
    .await?;
    Ok(())
}

/// How many endpoints proxy `p` has for `host`'s route (its `/debug/explain`).
async fn endpoints_at(p: &ProxyProc, host: &str) -> anyhow::Result<usize> {
    let (_, body) = p
        .admin_get(&format!("/debug/explain?host={host}&path=/"))
        .await?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["backend"]["endpoints"].as_array().map_or(0, Vec::len))
}

/// Waits until `p` answers 200 for `host`.
async fn served(p: &ProxyProc, host: &str) -> anyhow::Result<()> {
    wait::until(&format!("{host} served by {}", p.addr), T, || async {
        Ok(matches!(p.get(host, "/").await, Ok((200, _))).then_some(()))
    })
    .await
}

#[tokio::test]
async fn s17_a_held_removal_holds_only_its_routes_while_other_namespaces_change()
-> anyhow::Result<()> {
    // Namespace A is the scenario's (10 Ingresses); B has 3, C gets one during the hold.
    let s = Scenario::start(
        "s17",
        Options {
            cp_args: vec!["--hold-confirm-after".into(), "1h".into()],
            ..Options::default()
        },
    )
    .await?;
    let (b, c) = (
        s.cluster.namespace(&s.client, "s17b").await?,
        s.cluster.namespace(&s.client, "s17c").await?,
    );
    let host_in = |ns: &str, i: usize| format!("h{i}.{ns}.test");
    let b_hosts: Vec<String> = (0..3).map(|i| host_in(&b, i)).collect();
    for (i, host) in b_hosts.iter().enumerate() {
        create_app(&s.client, &b, &s.class, &s.backends, host, i).await?;
    }
    for p in &s.proxies {
        for host in &b_hosts {
            served(p, host).await?;
        }
    }
    let mut hosts = s.hosts();
    hosts.extend(b_hosts.iter().cloned());
    let traffic = Traffic::start(&s.proxy_addrs(), hosts, RATE);

    // Every Ingress of A goes: 10 of 13 routes, held.
    Api::<Ingress>::namespaced(s.client.clone(), &s.ns)
        .delete_collection(&Default::default(), &ListParams::default())
        .await?;
    let status = wait::until("the held removal", T, || async {
        let st = call(s.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        Ok((st["held"]["heldRouteCount"] == 10).then_some(st))
    })
    .await?;
    let (name, since) = (
        status["held"]["version"].clone(),
        status["held"]["heldSince"].clone(),
    );

    // B's endpoints churn every 200 ms (bounded: at most 60 s), under the hold.
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let churn = {
        let (client, b) = (s.client.clone(), b.clone());
        let (both, one) = (s.backends.clone(), vec![s.backends[0].clone()]);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            for i in 0..300 {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                let set = if i % 2 == 0 { &one } else { &both };
                let set: Vec<&str> = set.iter().map(String::as_str).collect();
                set_endpoints(&client, &b, "app0", &set).await?;
            }
            anyhow::Ok(())
        })
    };

    // A new Ingress in C reaches both proxies within 1 s.
    let c_host = host_in(&c, 0);
    create_app(&s.client, &c, &s.class, &s.backends, &c_host, 0).await?;
    let created = Instant::now();
    for p in &s.proxies {
        served(p, &c_host).await?;
    }
    let took = created.elapsed();
    eprintln!("a new Ingress under a hold reached both proxies in {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");

    // An endpoint change of B reaches both proxies within 1 s.
    let only_a = [s.backends[0].as_str()];
    set_endpoints(&s.client, &b, "app1", &only_a).await?;
    let changed = Instant::now();
    for p in &s.proxies {
        wait::until("B's endpoint change at the proxy", T, || async {
            let n = endpoints_at(p, &b_hosts[1])
                .await
                .map_err(|e| e.to_string())?;
            Ok((n == 1).then_some(()))
        })
        .await?;
    }
    let took = changed.elapsed();
    eprintln!("an endpoint change under a hold reached both proxies in {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");

    let _ = stop.send(true);
    churn.await??;
    // The held set, its name and its clock did not move with the churn.
    let st = call(s.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    assert_eq!(st["held"]["version"], name);
    assert_eq!(st["held"]["heldSince"], since);
    // A's routes kept serving, with B's, throughout.
    assert_clean(&traffic.stop().await);

    // Approval removes exactly A's routes.
    call(
        s.cp.grpc,
        "holdfast.v1.Admin/ApproveHeldSnapshot",
        &json!({ "version": name }).to_string(),
    )?;
    for p in &s.proxies {
        for host in s.hosts() {
            wait::until(&format!("{host} 404 after approval"), T, || async {
                Ok(matches!(p.get(&host, "/").await, Ok((404, _))).then_some(()))
            })
            .await?;
        }
        for host in b_hosts.iter().chain([&c_host]) {
            assert_eq!(p.get(host, "/").await?.0, 200, "{host}");
        }
    }
    let mut published: Vec<String> = s.published()?["virtualHosts"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|h| h["host"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    published.sort();
    let mut expected: Vec<String> = b_hosts.iter().chain([&c_host]).cloned().collect();
    expected.sort();
    assert_eq!(published, expected);
    Ok(())
}

/// ServiceAccounts `holdfast-<r>` for each replica `r`, each bound to three ClusterRoles
/// (`<ns>-ingresses`, `<ns>-services`, `<ns>-rest`) by a binding of the same name plus
/// `-<r>`: deleting one binding takes one kind (or the rest) from one replica.
fn apply_split_rbac(s: &Scenario, replicas: &[&str]) -> anyhow::Result<()> {
    let ns = &s.ns;
    let mut yaml = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{ name: {ns}-ingresses }}
rules:
- apiGroups: [networking.k8s.io]
  resources: [ingresses]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{ name: {ns}-services }}
rules:
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{ name: {ns}-rest }}
rules:
- apiGroups: [networking.k8s.io]
  resources: [ingressclasses]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
"#
    );
    for r in replicas {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{ name: holdfast-{r}, namespace: {ns} }}\n"
        ));
        for role in ["ingresses", "services", "rest"] {
            yaml.push_str(&format!(
                "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{ name: {ns}-{role}-{r} }}\nroleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {ns}-{role} }}\nsubjects: [{{ kind: ServiceAccount, name: holdfast-{r}, namespace: {ns} }}]\n"
            ));
        }
    }
    let path = s.logs.join("rbac-split.yaml");
    std::fs::write(&path, yaml)?;
    s.cluster
        .kubectl_run(&["apply", "-f", &path.to_string_lossy()])?;
    Ok(())
}

/// A kind's progress in a snapshot as the real grpcurl prints it (uint64 as a string).
fn progress_of(snapshot: &serde_json::Value, kind: &str) -> u64 {
    snapshot["progress"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["kind"] == kind)
        .and_then(|p| p["resourceVersion"].as_str()?.parse().ok())
        .unwrap_or(0)
}

/// The proxy's served version and progress per kind (its admin API).
async fn served_progress(
    proxy: &ProxyProc,
) -> anyhow::Result<(String, std::collections::BTreeMap<String, u64>)> {
    let (_, body) = proxy.admin_get("/debug/snapshot").await?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let progress = v["progress"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, rv)| (k.clone(), rv.as_u64().unwrap_or(0)))
        .collect();
    Ok((
        v["version"].as_str().unwrap_or_default().to_owned(),
        progress,
    ))
}

/// Waits until `cp`'s GetStatus shows a 403 on `kind`'s watch.
async fn wait_denied(cp: &ControlPlane, kind: &str) -> anyhow::Result<()> {
    wait::until(&format!("a 403 on {kind} at {}", cp.grpc), T, || async {
        let st = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        Ok(st["caches"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["kind"] == kind)
            .and_then(|c| c["lastError"].as_str())
            .filter(|e| e.contains("403"))
            .map(|_| ()))
    })
    .await
}

/// Two replicas, each lagging on a different kind: A stops seeing Ingresses, B stops
/// seeing Services (their watches are refused). A Service appears that an Ingress was
/// waiting for: the proxy, on A, serves it, at A's progress (ahead of B on Services). An
/// Ingress appears: B gets ahead on Ingresses. When A goes and the proxy moves to B, B's
/// snapshot is neither newer nor older than the one it serves: the proxy keeps its
/// snapshot (no kind moves back; the one-number rule would have taken B's, whose highest
/// number is higher) and counts the wait. Once B sees Services again it catches up, and
/// the proxy takes its snapshot and serves both. Traffic to the other hosts sees no
/// failure throughout.
#[tokio::test]
async fn s18_replicas_lagging_on_different_kinds_never_move_a_proxy_back_and_it_converges()
-> anyhow::Result<()> {
    let mut s = Scenario::start(
        "s18",
        Options {
            proxies: 0,
            ..Options::default()
        },
    )
    .await?;
    apply_split_rbac(&s, &["a", "b"])?;
    let args = base_cp_args(&s.class);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kube_a = s.cluster.service_account_kubeconfig(&s.ns, "holdfast-a")?;
    let kube_b = s.cluster.service_account_kubeconfig(&s.ns, "holdfast-b")?;
    s.cp.proc.kill();
    let mut cp_a = ControlPlane::start("control-plane-a", &kube_a, &s.logs, &args)?;
    let cp_b = ControlPlane::start("control-plane-b", &kube_b, &s.logs, &args)?;
    for cp in [&cp_a, &cp_b] {
        wait::until(&format!("{} publishing", cp.grpc), T, || async {
            Ok(call(cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}").ok())
        })
        .await?;
    }
    s.add_proxy("proxy-ab", &[cp_a.grpc_url(), cp_b.grpc_url()])?;
    s.wait_all_served().await?;
    // An Ingress whose Service does not exist yet: its route answers 503 until it does.
    let (late, late_host) = ("late", s.host(11));
    let (ns, client) = (s.ns.clone(), s.client.clone());
    create(
        &client,
        Some(&ns),
        &objects::ingress(late, &s.class, &late_host, late, 80),
    )
    .await?;
    wait::until("the late route (503)", T, || async {
        Ok(matches!(s.proxies[0].get(&late_host, "/").await, Ok((503, _))).then_some(()))
    })
    .await?;
    let traffic = Traffic::start(&s.proxy_addrs(), s.hosts(), RATE);
    let mut seen = vec![served_progress(&s.proxies[0]).await?];

    // A loses Ingresses, B loses Services: each watch is refused once it ends.
    for binding in ["ingresses-a", "services-b"] {
        s.cluster.kubectl_run(&[
            "delete",
            "clusterrolebinding",
            &format!("{}-{binding}", s.ns),
        ])?;
    }
    wait_denied(&cp_a, "Ingress").await?;
    wait_denied(&cp_b, "Service").await?;

    // The late Service appears: only A sees it, and the proxy (on A) serves it, at A's
    // progress, ahead of B on Services.
    let eps: Vec<&str> = s.backends.iter().map(String::as_str).collect();
    create(&client, Some(&ns), &objects::service(late, 80, 8080)).await?;
    create(
        &client,
        Some(&ns),
        &objects::endpoint_slice("late-1", late, 8080, &eps),
    )
    .await?;
    wait::until("the late route served through A", T, || async {
        Ok(matches!(s.proxies[0].get(&late_host, "/").await, Ok((200, _))).then_some(()))
    })
    .await?;
    seen.push(served_progress(&s.proxies[0]).await?);
    // A new app: only B sees its Ingress, so B gets ahead on Ingresses.
    s.create_app(10).await?;
    let new_host = s.host(10);
    let ingress_rv: u64 = Api::<Ingress>::namespaced(s.client.clone(), &s.ns)
        .get("app10")
        .await?
        .metadata
        .resource_version
        .unwrap_or_default()
        .parse()?;
    let published = |cp: &ControlPlane| call(cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}");
    wait::until("B past the new Ingress", T, || async {
        let snap = published(&cp_b).map_err(|e| e.to_string())?;
        Ok((progress_of(&snap, "Ingress") >= ingress_rv).then_some(()))
    })
    .await?;
    let before = served_progress(&s.proxies[0]).await?;
    let b = published(&cp_b)?;
    assert!(
        progress_of(&b, "Service") < before.1.get("Service").copied().unwrap_or(0),
        "B is not behind the proxy on Services: {b} {before:?}"
    );
    assert!(
        progress_of(&b, "Ingress") > before.1.get("Ingress").copied().unwrap_or(u64::MAX),
        "B is not ahead of the proxy on Ingresses: {b} {before:?}"
    );
    seen.push(before.clone());

    // A goes: the proxy moves to B, whose snapshot is behind for Services and ahead for
    // Ingresses. It waits, keeping A's snapshot (the late route stays served).
    cp_a.proc.kill();
    let nack = wait::until("the proxy waiting on B", T, || async {
        let l =
            call(cp_b.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        Ok(l["proxies"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| {
                p["lastNackError"]
                    .as_str()
                    .is_some_and(|e| e.contains("waiting"))
            })
            .cloned())
    })
    .await?;
    assert!(
        nack["lastNackError"]
            .as_str()
            .unwrap_or_default()
            .contains("Service"),
        "{nack}"
    );
    assert!(
        s.proxies[0]
            .metric("holdfast_proxy_snapshots_waited_total")
            .await?
            .unwrap_or(0.0)
            >= 1.0
    );
    let waiting = served_progress(&s.proxies[0]).await?;
    assert_eq!(waiting.0, before.0, "the proxy left the snapshot it served");
    seen.push(waiting);
    assert!(matches!(
        s.proxies[0].get(&late_host, "/").await,
        Ok((200, _))
    ));
    assert!(matches!(
        s.proxies[0].get(&new_host, "/").await,
        Ok((404, _))
    ));

    // B sees Services again: it catches up, and the proxy takes its snapshot.
    s.cluster.kubectl_run(&[
        "create",
        "clusterrolebinding",
        &format!("{}-services-b", s.ns),
        &format!("--clusterrole={}-services", s.ns),
        &format!("--serviceaccount={}:holdfast-b", s.ns),
    ])?;
    wait::until(
        "the new host served through B",
        Duration::from_secs(120),
        || async {
            Ok(matches!(s.proxies[0].get(&new_host, "/").await, Ok((200, _))).then_some(()))
        },
    )
    .await?;
    assert!(matches!(
        s.proxies[0].get(&late_host, "/").await,
        Ok((200, _))
    ));
    seen.push(served_progress(&s.proxies[0]).await?);

    // Never backwards, kind by kind, across everything the proxy served.
    for pair in seen.windows(2) {
        for (kind, rv) in &pair[0].1 {
            let next = pair[1].1.get(kind).copied().unwrap_or(0);
            assert!(
                next >= *rv,
                "{kind} went back: {:?} -> {:?}",
                pair[0],
                pair[1]
            );
        }
    }
    let report = traffic.stop().await;
    assert_clean(&report);
    Ok(())
}
