//! Two control-plane replicas: both serve proxies; exactly one holds the Lease and writes
//! Ingress status; when it is SIGKILLed the other takes over within the lease duration.

use std::time::{Duration, Instant};

use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::objects::{self, create, create_class};
use holdfast_tests::subscriber::{Subscriber, routes};
use holdfast_tests::wait;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;

use holdfast_tests::wait::T;
const LEASE: Duration = Duration::from_secs(4);

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("hf-leader")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

async fn published_ip(ingresses: &Api<Ingress>, name: &str) -> Option<String> {
    let ing = ingresses.get(name).await.ok()?;
    ing.status?.load_balancer?.ingress?.first()?.ip.clone()
}

#[tokio::test]
async fn one_leader_writes_ingress_status_and_a_standby_takes_over_within_the_lease()
-> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "ha").await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    objects::create_web(
        &client,
        &ns,
        &["10.200.0.10"],
        "a",
        &class,
        &format!("a.{ns}.test"),
    )
    .await?;
    let logs = holdfast_tests::e2e_logs(&ns)?;
    let args = [
        "--ingress-class",
        &class,
        "--lease-namespace",
        &ns,
        "--lease-name",
        "hf-leader",
        "--lease-duration",
        "4s",
        "--lease-grace",
        "1s",
        "--publish-address",
        "203.0.113.7",
        "--debounce",
        "50ms",
    ];
    let mut replicas = vec![
        ControlPlane::start("cp-a", &cluster.kubeconfig(), &logs, &args)?,
        ControlPlane::start("cp-b", &cluster.kubeconfig(), &logs, &args)?,
    ];
    // Both serve proxies.
    let mut subs = Vec::new();
    for cp in &replicas {
        let mut sub = Subscriber::connect(&cp.grpc_url(), "proxy", None).await?;
        sub.wait_for("route a", T, |s| routes(s).len() == 1).await?;
        subs.push(sub);
    }

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &ns);
    let leader = wait::until("a Lease holder", T, || async { Ok(holder(&leases).await) }).await?;
    wait::until("status written", T, || async {
        Ok(published_ip(&ingresses, "a")
            .await
            .filter(|ip| ip == "203.0.113.7"))
    })
    .await?;
    let (li, fi) = if leader == "cp-a" { (0, 1) } else { (1, 0) };
    // The Lease is written before the winner sets its gauge: wait for it.
    leader_gauge_is_one(&replicas[li]).await?;
    assert_eq!(
        replicas[fi].metric("holdfast_leader").await?,
        Some(0.0),
        "two leaders"
    );
    // Not even for a moment: the standby never acquired the Lease.
    assert_eq!(
        replicas[fi]
            .metric("holdfast_leader_acquisitions_total")
            .await?,
        Some(0.0),
        "the standby held the Lease"
    );

    // SIGKILL the leader: the standby takes over within the lease duration.
    let killed = Instant::now();
    replicas[li].proc.kill();
    let standby = if leader == "cp-a" { "cp-b" } else { "cp-a" };
    wait::until("the standby to hold the Lease", T, || async {
        Ok(holder(&leases).await.filter(|h| h == standby))
    })
    .await?;
    let took = killed.elapsed();
    eprintln!("takeover {took:?} after SIGKILL (lease {LEASE:?})");
    assert!(
        took <= LEASE + Duration::from_secs(2),
        "takeover took {took:?}"
    );
    leader_gauge_is_one(&replicas[fi]).await?;
    assert_eq!(
        replicas[fi]
            .metric("holdfast_leader_acquisitions_total")
            .await?,
        Some(1.0)
    );

    // The new leader writes status, and the survivor keeps serving its proxy.
    create(
        &client,
        Some(&ns),
        &objects::ingress("b", &class, &format!("b.{ns}.test"), "web", 80),
    )
    .await?;
    wait::until("status of the new Ingress", T, || async {
        Ok(published_ip(&ingresses, "b")
            .await
            .filter(|ip| ip == "203.0.113.7"))
    })
    .await?;
    subs[fi]
        .wait_for("route b from the surviving replica", T, |s| {
            routes(s).len() == 2
        })
        .await?;
    Ok(())
}

async fn leader_gauge_is_one(cp: &ControlPlane) -> anyhow::Result<()> {
    wait::until("holdfast_leader 1", T, || async {
        Ok(cp
            .metric("holdfast_leader")
            .await
            .map_err(|e| e.to_string())?
            .filter(|v| *v == 1.0))
    })
    .await?;
    Ok(())
}
