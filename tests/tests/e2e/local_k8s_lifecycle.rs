//! `k8s.sh up` / `down` and the fault helpers on a private cluster: a warm start is quick,
//! components can be SIGKILLed and restarted with their data, and `down` leaves nothing.

use std::path::Path;
use std::time::{Duration, Instant};

use holdfast_tests::cluster::{Component, LocalCluster};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn warm_up_is_ready_quickly_survives_kills_and_down_leaves_no_process() -> anyhow::Result<()>
{
    // Build (or find) the tools first, so what is timed below is a warm `up`.
    holdfast_tests::cluster::tools_bin()?;
    let started = Instant::now();
    let cluster = LocalCluster::start()?;
    let took = started.elapsed();
    eprintln!("warm up reached /readyz in {took:?}");
    assert!(took < Duration::from_secs(20), "warm up took {took:?}");

    let client = cluster.client().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "survivor" }, "data": { "k": "v" }
    }))?;
    api.create(&PostParams::default(), &cm).await?;

    // SIGKILL kube-apiserver, then etcd; restart both; the data is still there.
    let apiserver = cluster
        .pid(Component::KubeApiserver)
        .expect("apiserver running");
    cluster.stop(Component::KubeApiserver, true)?;
    assert!(!alive(apiserver));
    assert!(
        api.get("survivor").await.is_err(),
        "API answered while killed"
    );
    cluster.restart(Component::KubeApiserver)?;
    assert_eq!(api.get("survivor").await?.data.unwrap()["k"], "v");

    let etcd = cluster.pid(Component::Etcd).expect("etcd running");
    cluster.stop(Component::Etcd, true)?;
    assert!(!alive(etcd));
    cluster.restart(Component::Etcd)?;
    holdfast_tests::wait::until(
        "reads through the restarted etcd",
        holdfast_tests::wait::T,
        || {
            let api = api.clone();
            async move {
                match api.get("survivor").await {
                    Ok(cm) => Ok(Some(cm)),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await?;

    let pids = [
        cluster.pid(Component::Etcd).expect("etcd running"),
        cluster
            .pid(Component::KubeApiserver)
            .expect("apiserver running"),
    ];
    let dir = cluster.dir().to_path_buf();
    drop(cluster); // runs `k8s.sh down`
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived `down`");
    }
    assert!(
        !dir.exists(),
        "cluster directory {} left behind",
        dir.display()
    );
    Ok(())
}
