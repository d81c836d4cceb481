//! The pinned Gateway API (`GATEWAY_API_VERSION` in deploy/local/versions.env): its
//! standard-channel CRDs on the real API server, and echo-basic, the conformance suite's
//! backend, built from the suite's own module.

use std::net::SocketAddr;
use std::time::Duration;

use holdfast_tests::cluster::{LocalCluster, run_script, tools_bin};
use holdfast_tests::netns::TestNet;
use holdfast_tests::wait;

/// The version every Gateway API tool is pinned to.
fn pinned_version() -> anyhow::Result<String> {
    let env =
        std::fs::read_to_string(holdfast_tests::repo_root().join("deploy/local/versions.env"))?;
    env.lines()
        .find_map(|l| l.strip_prefix("GATEWAY_API_VERSION="))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| anyhow::anyhow!("no GATEWAY_API_VERSION in versions.env"))
}

#[tokio::test]
async fn the_pinned_gateway_api_crds_are_established_and_echo_basic_answers_as_the_suite_expects()
-> anyhow::Result<()> {
    let version = pinned_version()?;
    // A cluster of its own: the shared one stays without Gateway API, as most clusters are.
    let cluster = LocalCluster::start()?;
    let crds = run_script(&["gateway-api-crds"])?;
    let crds = crds.trim();
    cluster.kubectl_run(&["apply", "--server-side", "-f", crds])?;
    for kind in [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "referencegrants",
    ] {
        let name = format!("{kind}.gateway.networking.k8s.io");
        cluster.kubectl_run(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/{name}"),
        ])?;
        let annotations = cluster.kubectl_run(&[
            "get",
            &format!("crd/{name}"),
            "-o",
            "jsonpath={.metadata.annotations}",
        ])?;
        let annotations: serde_json::Value = serde_json::from_str(&annotations)?;
        assert_eq!(
            annotations["gateway.networking.k8s.io/bundle-version"], version,
            "{name}"
        );
        assert_eq!(
            annotations["gateway.networking.k8s.io/channel"], "standard",
            "{name}"
        );
    }

    // echo-basic in a namespace of its own (it listens on :3000 there): it answers with
    // the request and the pod it says it is, from its environment.
    let bin = tools_bin()?;
    let mut net = TestNet::create("gwecho")?;
    let ip = net.add_host()?;
    net.spawn_env(
        &bin.join("echo-basic"),
        &[],
        &[
            ("POD_NAME", "echo-pod-1"),
            ("NAMESPACE", "gateway-conformance-infra"),
            ("HTTP_PORT", "3000"),
        ],
    )?;
    let addr = SocketAddr::new(ip, 3000);
    wait::until_blocking("echo-basic to listen", Duration::from_secs(10), || {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(_) => Ok(Some(())),
            Err(e) => Err(e.to_string()),
        }
    })?;
    let (status, body) =
        holdfast_tests::http::get(addr, "echo.example.test", "/some/path?x=1").await?;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(answer["path"], "/some/path?x=1", "{answer}");
    assert_eq!(answer["host"], "echo.example.test", "{answer}");
    assert_eq!(answer["pod"], "echo-pod-1", "{answer}");
    assert_eq!(answer["namespace"], "gateway-conformance-infra", "{answer}");

    // The suite's test binary was built from the same pin (its flags are the suite's).
    let help = std::process::Command::new(bin.join("gateway-conformance"))
        .args(["-test.list", "TestConformance"])
        .output()?;
    let listed = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success() && listed.lines().any(|l| l == "TestConformance"),
        "{listed}{}",
        String::from_utf8_lossy(&help.stderr)
    );
    let version_file = std::fs::read_to_string(bin.join("gateway-conformance.version"))?;
    assert_eq!(version_file.trim(), version);
    Ok(())
}
