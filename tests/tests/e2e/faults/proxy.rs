//! Faults at the proxy: restarted while the control plane is down, a corrupt state file,
//! and an invalid snapshot (NACKed, old routes kept).

use std::time::{Duration, Instant};

use holdfast_tests::fake_control_plane::FakeControlPlane;
use holdfast_tests::grpcurl::call;
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::scenario::{Options, Scenario, T};
use holdfast_tests::traffic::Traffic;
use holdfast_tests::wait;

use super::*;

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
    assert_clean(&restarted.stop().await?);
    assert_clean(&other.stop().await?);
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
        assert_eq!(
            s.proxies[0]
                .metric(r#"holdfast_proxy_state_file_loads_total{outcome="rejected"}"#)
                .await?,
            Some(1.0)
        );
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
    // Ingress hosts come in the one route model: Gateway hosts of listener `ingress`.
    let first_ingress = |s: &holdfast_proto::v1::Snapshot| {
        s.gateway_hosts
            .iter()
            .position(holdfast_proto::snapshot::is_ingress_host)
            .expect("an Ingress host in the real snapshot")
    };
    let mut extra = newer.gateway_hosts[first_ingress(&newer)].clone();
    extra.host = format!("extra.{}.test", s.ns);
    extra.name = holdfast_proto::snapshot::gateway_host_name(
        holdfast_proto::snapshot::INGRESS_LISTENER,
        &extra.host,
    );
    extra.certificate.clear();
    extra.ssl_redirect = false;
    newer.gateway_hosts.push(extra);
    newer.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
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
    let i = first_ingress(&bad);
    bad.gateway_hosts[i].routes[0].backends[0].backend = "nowhere/none:80".into();
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
    assert_clean(&traffic.stop().await?);

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
