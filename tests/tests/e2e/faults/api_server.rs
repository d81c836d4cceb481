//! Faults of the API server and etcd: refused, cut mid-list, killed, blackholed, silently
//! partitioned, compacted (410), and permissions lost; routes keep serving and nothing
//! partial or older is published.

use std::time::{Duration, Instant};

use futures::StreamExt;
use holdfast_tests::cluster::Component;
use holdfast_tests::faultproxy::Mode;
use holdfast_tests::grpcurl::call;
use holdfast_tests::scenario::{Options, Scenario, T};
use holdfast_tests::subscriber::Subscriber;
use holdfast_tests::wait;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use super::*;

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
    let report = traffic.stop().await?;
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

/// A re-list whose LIST responses are cut mid-way never publishes a partial snapshot. A
/// route count cannot tell (a partial list of Services keeps every route, answering 503),
/// so every snapshot published meanwhile is checked kind by kind against what the
/// cluster holds: every app's route (Ingress), its Service and its endpoints
/// (EndpointSlice).
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
    // Observe everything the control plane publishes from now on: the snapshot it holds,
    // then every later one, each sent down a channel as it arrives.
    let mut observer = Subscriber::connect(&s.cp.grpc_url(), "observer", None).await?;
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let observing = tokio::spawn(async move {
        loop {
            let snapshot = match observer.next(T).await {
                Ok(Some(r)) => observer.ack(r).await,
                Ok(None) => continue,
                Err(e) => Err(e),
            };
            let failed = snapshot.is_err();
            if seen_tx.send(snapshot).is_err() || failed {
                break;
            }
        }
    });
    let first = seen.recv().await.expect("the observer's first snapshot")?;
    let missing = incomplete(&s, &first, s.ingresses);
    assert!(missing.is_empty(), "the first snapshot lacks {missing:?}");
    let lists_before = ingress_lists(&s.cp).await?;
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
        let lists = ingress_lists(&s.cp).await.map_err(|e| e.to_string())?;
        Ok((lists > lists_before).then_some(()))
    })
    .await?;
    let hash_after = s.published_hash()?;

    // One more app, so that the observer must have been listening all along: its
    // snapshot is the last it sees.
    let new = s.ingresses;
    s.create_app(new).await?;
    let new_host = s.host(new);
    wait::until("the new app served", T, || async {
        Ok(matches!(s.proxies[0].get(&new_host, "/").await, Ok((200, _))).then_some(()))
    })
    .await?;
    let report = traffic.stop().await?;
    let mut published = vec![first];
    let last = loop {
        let snapshot = tokio::time::timeout(T, seen.recv())
            .await?
            .expect("the observer is running")?;
        published.push(snapshot);
        let last = published.last().expect("just pushed");
        if holdfast_proto::snapshot::ingress_hosts(last)
            .iter()
            .any(|v| v.host == new_host)
        {
            break last.clone();
        }
    };
    observing.abort();
    // Complete, kind by kind, every time: the ten apps in everything published, and the
    // new one at the end. (A partial snapshot still has every route: its count shows it.)
    let partial: Vec<String> = published
        .iter()
        .enumerate()
        .filter_map(|(n, snapshot)| {
            let missing = incomplete(&s, snapshot, s.ingresses);
            (!missing.is_empty()).then(|| {
                format!(
                    "snapshot {n} ({}, {} routes) lacks {missing:?}",
                    snapshot.version,
                    holdfast_proto::snapshot::route_count(snapshot)
                )
            })
        })
        .collect();
    assert!(
        partial.is_empty(),
        "{} of {} published snapshots were partial ({}); {partial:#?}",
        partial.len(),
        published.len(),
        report.summary()
    );
    let missing = incomplete(&s, &last, s.ingresses + 1);
    assert!(missing.is_empty(), "the last snapshot lacks {missing:?}");
    eprintln!("{} snapshots observed, every one complete", published.len());
    assert_clean(&report);
    assert_eq!(hash_after, hash, "routes changed across the cut re-list");
    Ok(())
}

/// What `snapshot` lacks of apps `0..apps` as the scenario made them, kind by kind:
/// each app's host routed to its backend (Ingress, IngressClass), the backend resolved
/// (Service) with the echo backends as its endpoints (EndpointSlice). Empty: complete.
fn incomplete(s: &Scenario, snapshot: &holdfast_proto::v1::Snapshot, apps: usize) -> Vec<String> {
    let want: std::collections::BTreeSet<&str> = s.backends.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for i in 0..apps {
        let (host, backend) = (s.host(i), format!("{}/app{i}:80", s.ns));
        let routed = holdfast_proto::snapshot::ingress_hosts(snapshot)
            .iter()
            .any(|v| v.host == host && v.routes.iter().any(|r| r.backend == backend));
        if !routed {
            out.push(format!("Ingress app{i}: no route from {host} to {backend}"));
        }
        match snapshot.backends.iter().find(|b| b.name == backend) {
            None => out.push(format!("backend {backend}")),
            Some(b) if !b.unavailable_reason.is_empty() => {
                out.push(format!("Service app{i}: {}", b.unavailable_reason));
            }
            Some(b) => {
                let got: std::collections::BTreeSet<&str> =
                    b.endpoints.iter().map(|e| e.address.as_str()).collect();
                if got != want {
                    out.push(format!("EndpointSlice app{i}-1: endpoints {got:?}"));
                }
            }
        }
    }
    out
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

    let report = traffic.stop().await?;
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
    let report = traffic.stop().await?;
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
        holdfast_tests::grpcurl::ingress_hosts(&snap, "gatewayHosts").len(),
        10,
        "incomplete first snapshot"
    );
    let report = traffic.stop().await?;
    assert_clean(&report);
    Ok(())
}

#[tokio::test]
async fn s13_lost_permission_to_list_services_keeps_the_control_plane_not_ready()
-> anyhow::Result<()> {
    let mut s = Scenario::start("s13", Options::default()).await?;
    let hash = s.published_hash()?;
    let versions = s.applied_versions().await?;
    apply_split_rbac(&s, &["cp"])?;

    // With the full ServiceAccount permissions it works.
    restart_cp_as_service_account(&mut s, "control-plane-sa")?;
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
    restart_cp_as_service_account(&mut s, "control-plane-sa-restarted")?;
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
    // Counted as a refused permission, for the kind it was refused for.
    let forbidden = |kind: &'static str| {
        let cp = &s.cp;
        async move {
            cp.metric(&format!(
                "holdfast_watch_forbidden_total{{kind=\"{kind}\"}}"
            ))
            .await
        }
    };
    assert!(forbidden("Service").await?.is_some_and(|n| n >= 1.0));
    assert_eq!(forbidden("Ingress").await?, Some(0.0));
    assert!(
        status["lastError"]
            .as_str()
            .unwrap()
            .starts_with("permission denied (403)"),
        "{status}"
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
    assert_clean(&traffic.stop().await?);
    Ok(())
}

#[tokio::test]
async fn s15_watch_expiry_410_after_etcd_compaction_relists_without_route_flaps()
-> anyhow::Result<()> {
    let s = Scenario::start("s15", Options::default()).await?;
    let hash = s.published_hash()?;
    let versions = s.applied_versions().await?;
    let published = s.published_total().await?;
    let lists_before = ingress_lists(&s.cp).await?;
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
        let lists = ingress_lists(&s.cp).await.map_err(|e| e.to_string())?;
        Ok((lists > lists_before).then_some(()))
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
    let report = traffic.stop().await?;
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
    let report = traffic.stop().await?;
    assert_clean(&report);
    Ok(())
}

/// Gateways and HTTPRoutes through the faults the Ingress scenarios see: the API server
/// refuses every connection (s01's incident, shorter), then every connection the control
/// plane holds is cut silently while a new HTTPRoute is created. Traffic through the
/// proxy's own listener (Ingress hosts) and through the Gateway's address (HTTPRoute
/// hostnames) sees zero failed requests, nothing is published during the refusals, and
/// the HTTPRoute created during the cut is served once it is read.
#[tokio::test]
async fn s20_refusals_and_a_silent_cut_while_gateways_and_httproutes_exist_fail_no_request()
-> anyhow::Result<()> {
    let s = Scenario::start(
        "s20",
        Options {
            // One proxy: two on one host cannot both bind the Gateway's address and port
            // (in a cluster each proxy has its own network namespace).
            proxies: 1,
            cp_args: holdfast_tests::scenario::gateway_cp_args("127.79.0.0/16"),
            ..Options::default()
        },
    )
    .await?;
    s.cluster.install_gateway_api()?;
    let ns = &s.ns;
    let group = "gateway.networking.k8s.io/v1";
    let class = format!("{ns}-gw");
    let route = |i: usize| {
        json!({ "apiVersion": group, "kind": "HTTPRoute",
                "metadata": { "name": format!("r{i}"), "namespace": ns },
                "spec": { "parentRefs": [{ "name": "gw" }],
                          "hostnames": [format!("gw{i}.{ns}.test")],
                          "rules": [{ "backendRefs": [{ "name": format!("app{i}"), "port": 80 }] }] } })
    };
    let mut objects = vec![
        json!({ "apiVersion": group, "kind": "GatewayClass", "metadata": { "name": class },
                "spec": { "controllerName": "holdfast.dev/gateway-controller" } }),
        json!({ "apiVersion": group, "kind": "Gateway", "metadata": { "name": "gw", "namespace": ns },
                "spec": { "gatewayClassName": class,
                          "listeners": [{ "name": "http", "port": 80, "protocol": "HTTP" }] } }),
    ];
    let routes = 5;
    objects.extend((0..routes).map(route));
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": objects });
    let file = s.cluster.dir().join("s20-gateway.json");
    std::fs::write(&file, list.to_string())?;
    s.cluster
        .kubectl_run(&["create", "-f", &file.to_string_lossy()])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let address = wait::until("the Gateway's address", T, || async {
        let out = s
            .cluster
            .kubectl_run(&["get", "gateway", "-n", ns, "gw", "-o", "json"])
            .map_err(|e| e.to_string())?;
        let gw: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        Ok(gw["status"]["addresses"][0]["value"]
            .as_str()
            .map(str::to_owned))
    })
    .await?;
    let gateway: std::net::SocketAddr = format!("{address}:80").parse()?;
    let gateway_hosts: Vec<String> = (0..routes).map(|i| format!("gw{i}.{ns}.test")).collect();
    for host in &gateway_hosts {
        wait::until(&format!("{host} served on the Gateway"), T, || async {
            let ok = matches!(
                holdfast_tests::http::get(gateway, host, "/").await,
                Ok((200, _))
            );
            Ok(ok.then_some(()))
        })
        .await?;
    }
    let hash = s.published_hash()?;
    let published = s.published_total().await?;
    let ingress_traffic = s.traffic(RATE);
    let gateway_traffic =
        holdfast_tests::traffic::Traffic::start(&[gateway], gateway_hosts.clone(), RATE);

    // Refused.
    s.api_fault.set(Mode::Refuse);
    s.api_fault.reset_existing();
    s.wait_cp_watch_error(T).await?;
    outage(Duration::from_secs(10)).await;
    assert_eq!(
        s.published_total().await?,
        published,
        "a snapshot was published while the API server refused"
    );
    s.api_fault.set(Mode::Pass);
    s.wait_cp_synced().await?;
    assert_eq!(
        s.published_hash()?,
        hash,
        "content changed across the refusals"
    );

    // Cut silently, then a new HTTPRoute (made directly, not through the fault proxy), to
    // an app whose Service exists.
    s.api_fault.set(Mode::StallExisting);
    let new = routes;
    assert!(new < s.ingresses, "app{new} exists");
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": [route(new)] });
    let file = s.cluster.dir().join("s20-new-route.json");
    std::fs::write(&file, list.to_string())?;
    s.cluster
        .kubectl_run(&["create", "-f", &file.to_string_lossy()])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let new_host = format!("gw{new}.{ns}.test");
    wait::until(
        "the HTTPRoute created during the cut to be served",
        T,
        || async {
            let ok = matches!(
                holdfast_tests::http::get(gateway, &new_host, "/").await,
                Ok((200, _))
            );
            Ok(ok.then_some(()))
        },
    )
    .await?;
    s.api_fault.set(Mode::Pass);

    let report = gateway_traffic.stop().await?;
    assert_clean(&report);
    for host in &gateway_hosts {
        assert!(
            report.count(host, 200) > 0,
            "no answer for {host}: {}",
            report.summary()
        );
    }
    assert_clean(&ingress_traffic.stop().await?);
    Ok(())
}
