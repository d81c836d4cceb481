//! Route changes under traffic: one Ingress of ten deleted, a Service deleted while its
//! Ingress stays (503, never 404), and a burst of changes that the control plane follows
//! through its watches alone (no n+1).

use std::time::{Duration, Instant};

use holdfast_tests::objects::delete;
use holdfast_tests::scenario::{Options, Scenario, T};
use holdfast_tests::wait;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::*;

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
    let report = traffic.stop().await?;
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
    let report = traffic.stop().await?;
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

/// Invariant 1, no n+1: a build reads only the watch caches. During a burst of 330 changes
/// to 60 objects, kube-apiserver's audit log shows that the control plane (its own
/// ServiceAccount) read no object by itself (no GET of a kind it watches) and listed
/// nothing again, and that its watch requests are bounded by time (each kind renews its
/// watch every 3 s), not by objects times changes. The routes follow the changes, with
/// zero non-2xx.
#[tokio::test]
async fn s19_a_burst_of_changes_is_read_through_the_watches_alone() -> anyhow::Result<()> {
    const APPS: usize = 20;
    const ROUNDS: usize = 5;
    // The resources the control plane watches, as the audit log names them.
    let watched: Vec<String> = holdfast_control_plane::state::KINDS
        .iter()
        .map(|kind| {
            let kind = kind.to_ascii_lowercase();
            if kind.ends_with('s') {
                format!("{kind}es")
            } else {
                format!("{kind}s")
            }
        })
        .collect();
    let watched = |r: &holdfast_tests::cluster::AuditedRequest| watched.contains(&r.resource);
    // `--api-read-timeout 5s` (the suite's): each watch asks to end after 3/4 of it.
    const WATCH_TIMEOUT: Duration = Duration::from_secs(3);
    let mut s = Scenario::start(
        "s19",
        Options {
            audit: true,
            ..Options::default()
        },
    )
    .await?;
    let hash = s.published_hash()?;
    let audit = s.audit.clone().expect("an audit log");
    // Every kind is watched, the Gateway API's too (installed, so the control plane
    // started below lists and watches all of them).
    s.cluster.install_gateway_api()?;
    apply_split_rbac(&s, &["cp"])?;
    let restarted = audit.position()?;
    restart_cp_as_service_account(&mut s, "control-plane-sa")?;
    wait::until("the ServiceAccount control plane publishing", T, || async {
        Ok(s.published_hash().ok().filter(|h| *h == hash))
    })
    .await?;
    let identity = format!("system:serviceaccount:{}:holdfast-cp", s.ns);
    let traffic = s.traffic(RATE);

    // The burst: ten more apps (a Service, an EndpointSlice and an Ingress each), then
    // five rounds that change every app's three objects.
    let started = Instant::now();
    let from = audit.position()?;
    for i in s.ingresses..APPS {
        s.create_app(i).await?;
    }
    let (a, b) = (s.backends[0].clone(), s.backends[1].clone());
    let services: Api<Service> = Api::namespaced(s.client.clone(), &s.ns);
    let ingresses: Api<Ingress> = Api::namespaced(s.client.clone(), &s.ns);
    let merge = |v: serde_json::Value| Patch::Merge(v);
    for round in 0..ROUNDS {
        let only = if round.is_multiple_of(2) { &a } else { &b };
        for i in 0..APPS {
            let app = format!("app{i}");
            set_endpoints(&s.client, &s.ns, &app, &[only]).await?;
            let label = json!({ "metadata": { "labels": { "round": round.to_string() } } });
            services
                .patch(&app, &PatchParams::default(), &merge(label))
                .await?;
            let note = json!({ "metadata": { "annotations": { "holdfast.test/round": round.to_string() } } });
            ingresses
                .patch(&app, &PatchParams::default(), &merge(note))
                .await?;
        }
    }
    let changes = 3 * (APPS - s.ingresses) + 3 * APPS * ROUNDS;
    s.ingresses = APPS;
    traffic.set_hosts(s.hosts());
    // Followed: every host served, every backend at the last round's one endpoint.
    let last = if (ROUNDS - 1).is_multiple_of(2) {
        &a
    } else {
        &b
    };
    wait::until("the last round published", T, || async {
        let snap = s.published().map_err(|e| e.to_string())?;
        let backends = snap["backends"].as_array().cloned().unwrap_or_default();
        let done = holdfast_tests::grpcurl::ingress_hosts(&snap, "gatewayHosts").len() == APPS
            && backends.len() == APPS
            && backends.iter().all(|b| {
                b["endpoints"]
                    .as_array()
                    .is_some_and(|e| e.len() == 1 && e[0]["address"] == last.as_str())
            });
        Ok(done.then_some(()))
    })
    .await?;
    for p in &s.proxies {
        for host in s.hosts() {
            served(p, &host).await?;
        }
    }
    let took = started.elapsed();
    let requests: Vec<_> = audit
        .since(from)?
        .into_iter()
        .filter(|r| r.user == identity)
        .collect();
    let count = |verb: &str| {
        requests
            .iter()
            .filter(|r| r.verb == verb && watched(r))
            .count()
    };
    let gets: Vec<String> = requests
        .iter()
        .filter(|r| r.verb == "get" && watched(r))
        .map(|r| format!("{} {}", r.resource, r.object))
        .collect();
    let (lists, watches) = (count("list"), count("watch"));
    let kinds = holdfast_control_plane::state::KINDS.len();
    let bound = kinds * (took.as_millis() / WATCH_TIMEOUT.as_millis() + 2) as usize;
    eprintln!(
        "{changes} changes followed in {took:?}: the control plane made {} GETs, {lists} LISTs \
         and {watches} WATCHes of the watched kinds (at most {bound} watches allowed); all its \
         requests: {:?}",
        gets.len(),
        tally(&requests)
    );
    // The log shows this control plane's requests: its first list of every kind.
    let first_lists: std::collections::BTreeSet<String> = audit
        .since(restarted)?
        .into_iter()
        .filter(|r| r.user == identity && r.verb == "list" && watched(r))
        .map(|r| r.resource)
        .collect();
    assert_eq!(
        first_lists.len(),
        kinds,
        "the audit log lacks the first lists of {identity}: {first_lists:?}"
    );
    assert!(
        gets.is_empty(),
        "{} per-object GETs during the burst (n+1): {:?}",
        gets.len(),
        &gets[..gets.len().min(10)]
    );
    assert_eq!(lists, 0, "the control plane listed again during the burst");
    assert!(
        watches <= bound,
        "{watches} watch requests in {took:?} for {changes} changes (bound {bound})"
    );
    assert!(
        bound * 4 < changes,
        "the bound ({bound}) does not tell watches from a request per change ({changes})"
    );
    assert_clean(&traffic.stop().await?);
    Ok(())
}

/// How many requests of each verb and resource.
fn tally(
    requests: &[holdfast_tests::cluster::AuditedRequest],
) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for r in requests {
        *out.entry(format!("{} {}", r.verb, r.resource)).or_default() += 1;
    }
    out
}
