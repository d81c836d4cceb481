//! The proxy end to end: real kube-apiserver and etcd, the real control plane, echo
//! backends in a test network namespace, and the state file across restarts.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::netns::TestNet;
use holdfast_tests::objects::{self, create, create_class};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::wait;

use holdfast_tests::wait::T;

struct World {
    _net: TestNet,
    client: kube::Client,
    class: String,
    ns: String,
    logs: PathBuf,
    cp: ControlPlane,
    state: tempfile::TempDir,
}

/// Two echo backends behind Service `web`, Ingress `web` for host `web.<ns>.test`, an
/// Ingress to a missing Service for `ghost.<ns>.test`, and a control plane.
async fn world(prefix: &str) -> anyhow::Result<World> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, prefix).await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    let mut net = TestNet::create("dp")?;
    let a = net.spawn_echo("echo-a", 8080)?;
    let b = net.spawn_echo("echo-b", 8080)?;
    let (a, b) = (a.ip().to_string(), b.ip().to_string());
    let ns_ref = Some(ns.as_str());
    objects::create_web(
        &client,
        &ns,
        &[&a, &b],
        "web",
        &class,
        &format!("web.{ns}.test"),
    )
    .await?;
    create(
        &client,
        ns_ref,
        &objects::ingress("ghost", &class, &format!("ghost.{ns}.test"), "ghost", 80),
    )
    .await?;
    let logs = holdfast_tests::e2e_logs(&ns)?;
    let cp = ControlPlane::start(
        "control-plane",
        &cluster.kubeconfig(),
        &logs,
        &["--ingress-class", &class, "--debounce", "50ms"],
    )?;
    Ok(World {
        _net: net,
        client,
        class,
        ns,
        logs,
        cp,
        state: tempfile::tempdir()?,
    })
}

impl World {
    fn host(&self, name: &str) -> String {
        format!("{name}.{}.test", self.ns)
    }

    fn proxy(&self, name: &str) -> anyhow::Result<ProxyProc> {
        ProxyProc::start(
            name,
            &[self.cp.grpc_url()],
            self.state.path(),
            &self.logs,
            &[],
        )
    }
}

/// Waits until `host` answers 200 through the proxy; returns the body.
async fn until_ok(p: &ProxyProc, host: &str) -> anyhow::Result<String> {
    wait::until(&format!("200 from {host}"), T, || async {
        match p.get(host, "/").await {
            Ok((200, body)) => Ok(Some(body)),
            Ok((code, body)) => Err(format!("{code} {body}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

#[tokio::test]
async fn the_proxy_serves_a_route_created_through_the_api_server() -> anyhow::Result<()> {
    let w = world("dpserve").await?;
    let p = w.proxy("proxy-1")?;
    until_ok(&p, &w.host("web")).await?;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let (code, body) = p.get(&w.host("web"), "/").await?;
        assert_eq!(code, 200);
        seen.insert(body.trim().to_owned());
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["echo-a", "echo-b"],
        "both endpoints serve"
    );
    let (code, body) = p.get(&w.host("ghost"), "/").await?;
    assert_eq!(code, 503, "a missing Service is 503, not 404: {body}");
    let (_, why) = p
        .admin_get(&format!("/debug/explain?host={}&path=/", w.host("ghost")))
        .await?;
    assert!(
        why.contains(&format!("service {}/ghost not found", w.ns)),
        "{why}"
    );
    assert_eq!(p.get(&format!("nothing.{}.test", w.ns), "/").await?.0, 404);
    Ok(())
}

#[tokio::test]
async fn the_persisted_snapshot_is_served_after_a_restart_while_the_control_plane_is_down()
-> anyhow::Result<()> {
    let mut w = world("dppersist").await?;
    let mut p = w.proxy("proxy-1")?;
    until_ok(&p, &w.host("web")).await?;
    let (_, before) = p.admin_get("/debug/snapshot").await?;

    w.cp.proc.kill();
    let started = Instant::now();
    p.restart()?;
    let body = until_ok(&p, &w.host("web")).await?;
    let took = started.elapsed();
    eprintln!("restarted proxy served from its state file {took:?} after starting");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(body.starts_with("echo-"), "{body}");
    assert_eq!(p.admin_get("/readyz").await?.0, 200);
    assert_eq!(
        p.admin_get("/debug/snapshot").await?.1,
        before,
        "the same snapshot"
    );
    assert_eq!(
        p.metric(r#"holdfast_proxy_state_file_loads_total{outcome="served"}"#)
            .await?,
        Some(1.0)
    );
    assert_eq!(
        p.metric("holdfast_proxy_control_plane_connected").await?,
        Some(0.0)
    );
    Ok(())
}

impl World {
    /// Ingress `name` for host `name.<ns>.test` to Service `web`.
    async fn ingress(&self, name: &str) -> anyhow::Result<()> {
        create(
            &self.client,
            Some(&self.ns),
            &objects::ingress(name, &self.class, &self.host(name), "web", 80),
        )
        .await?;
        Ok(())
    }
}

/// Deltas are the default path: a change reaches a running proxy as a delta, and a proxy
/// restarted from its state file while the control plane is down states what it holds,
/// so that when a control plane returns (a new process that never sent it anything) it
/// receives only the difference.
#[tokio::test]
async fn changes_reach_proxies_as_deltas_even_after_a_restart_from_the_state_file()
-> anyhow::Result<()> {
    let mut w = world("dpdelta").await?;
    let mut p = w.proxy("proxy-1")?;
    until_ok(&p, &w.host("web")).await?;
    let metric = |name: &'static str| {
        let p = &p;
        async move { p.metric_value(name).await }
    };
    let full = metric("holdfast_proxy_received_bytes_total").await?;
    assert!(full > 0.0);
    assert_eq!(metric("holdfast_proxy_deltas_received_total").await?, 0.0);

    w.ingress("second").await?;
    until_ok(&p, &w.host("second")).await?;
    assert_eq!(metric("holdfast_proxy_deltas_received_total").await?, 1.0);
    assert_eq!(w.cp.metric("holdfast_deltas_sent_total").await?, Some(1.0));

    // The control plane goes away; the proxy restarts from its state file; a change is
    // made meanwhile; a new control-plane process comes back.
    w.cp.proc.kill();
    p.restart()?;
    until_ok(&p, &w.host("second")).await?;
    w.ingress("third").await?;
    w.cp.restart()?;
    until_ok(&p, &w.host("third")).await?;
    let received = p
        .metric_value("holdfast_proxy_received_bytes_total")
        .await?;
    assert_eq!(
        p.metric("holdfast_proxy_deltas_received_total").await?,
        Some(1.0),
        "the difference came as a delta"
    );
    // Less than even the first complete snapshot, which is smaller than the current one
    // (it lacks two hosts). Every response carries the five kinds' progress (about 90
    // bytes), a large share of a delta in a world this small.
    assert!(
        received < full,
        "received {received} bytes after the restart; the first complete snapshot was {full}"
    );
    Ok(())
}

#[tokio::test]
async fn a_corrupt_or_truncated_state_file_keeps_the_proxy_not_ready_until_a_control_plane_delivers()
-> anyhow::Result<()> {
    let mut w = world("dpcorrupt").await?;
    let mut p = w.proxy("proxy-1")?;
    until_ok(&p, &w.host("web")).await?;
    let file = holdfast_data_plane_state_file(&p);
    let good = std::fs::read(&file)?;

    for (what, damaged) in [
        ("truncated", good[..good.len() / 2].to_vec()),
        ("corrupted", {
            let mut c = good.clone();
            let i = c.len() - 10;
            c[i] ^= 0xff;
            c
        }),
    ] {
        w.cp.proc.kill();
        p.proc.kill();
        std::fs::write(&file, &damaged)?;
        p.restart()?;
        // Never a partial table: not ready, and every request is 503 "no route table".
        assert_eq!(p.admin_get("/readyz").await?.0, 503, "{what}");
        let (code, body) = p.get(&w.host("web"), "/").await?;
        assert_eq!(code, 503, "{what}: {body}");
        let (_, why) = p.admin_get("/debug/explain?host=x&path=/").await?;
        assert!(why.contains("no route table"), "{what}: {why}");
        assert_eq!(
            p.metric(r#"holdfast_proxy_state_file_loads_total{outcome="rejected"}"#)
                .await?,
            Some(1.0),
            "{what}"
        );

        // A control plane comes back: the proxy recovers at once.
        w.cp.restart()?;
        p.wait_ready(T).await?;
        until_ok(&p, &w.host("web")).await?;
        assert_ne!(
            std::fs::read(&file)?,
            damaged,
            "{what}: the state file was rewritten"
        );
    }
    Ok(())
}

fn holdfast_data_plane_state_file(p: &ProxyProc) -> PathBuf {
    p.state_dir.join("snapshot.bin")
}
