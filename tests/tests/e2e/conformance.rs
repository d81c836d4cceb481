//! The Gateway API conformance suite (`sigs.k8s.io/gateway-api/conformance`, pinned in
//! deploy/local/versions.env and built unmodified by `k8s.sh ensure`), run against holdfast
//! on a local cluster that runs the suite's workloads: the GATEWAY-HTTP, GATEWAY-GRPC and
//! GATEWAY-TLS profiles, with the features holdfast's GatewayClass claims
//! (`status.supportedFeatures`), and the tests listed in docs/conformance/skip-tests.txt
//! skipped (each with its reason there).
//!
//! The report the suite writes is checked here (core: `success`, none failed or skipped)
//! and kept with the test's logs; with `HOLDFAST_CONFORMANCE_REPORT=<file>` it is also
//! copied there, which is how `deploy/local/conformance.sh` makes the committed report in
//! docs/conformance/ (its `implementation.version` names the commit it was made from).

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use holdfast_tests::cluster::{LocalCluster, tools_bin};
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::wait;

/// The GatewayClass the suite runs with.
const CLASS: &str = "holdfast";

/// The conformance profiles run, each checked in the report, and whether its extended
/// part must have run: GATEWAY-GRPC's and GATEWAY-TLS's extended features are the
/// Gateway's (whose tests are HTTPRoute tests, counted in GATEWAY-HTTP) and TLSRoute's
/// Terminate and Mixed modes (not claimed), so no extended test of theirs runs and their
/// reports have no extended part (one there must be `success`).
const PROFILES: [(&str, bool); 3] = [
    ("GATEWAY-HTTP", true),
    ("GATEWAY-GRPC", false),
    ("GATEWAY-TLS", false),
];

/// The tests to skip: the first word of each line of docs/conformance/skip-tests.txt that
/// is not blank or a `#` comment (the rest of the line is the reason).
fn skipped_tests() -> anyhow::Result<Vec<String>> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/conformance/skip-tests.txt");
    let text = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, reason) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        anyhow::ensure!(
            !reason.trim().is_empty(),
            "{}: skipped test {name} has no reason",
            file.display()
        );
        out.push(name.to_owned());
    }
    Ok(out)
}

/// The `result` of one part (`core` or `extended`) of a profile in a ConformanceReport.
fn profile_result(report: &serde_json::Value, profile: &str, part: &str) -> Option<String> {
    report["profiles"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == profile)?[part]["result"]
        .as_str()
        .map(str::to_owned)
}

/// A count (`Passed`, `Failed`, `Skipped`) of a profile's core tests in a ConformanceReport.
fn profile_core_count(report: &serde_json::Value, profile: &str, counted: &str) -> Option<u64> {
    report["profiles"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == profile)?["core"]["statistics"][counted]
        .as_u64()
}

/// The version the report names: the crate's, and the commit it was built from
/// (`0.1.0+<commit>`, `-dirty` when the work tree has uncommitted changes to tracked files
/// besides the committed reports), so a committed report says what it was made from.
fn implementation_version() -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&repo)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return env!("CARGO_PKG_VERSION").to_owned();
    };
    let dirty = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":(exclude)docs/conformance",
    ])
    .is_some_and(|s| !s.is_empty());
    format!(
        "{}+{commit}{}",
        env!("CARGO_PKG_VERSION"),
        if dirty { "-dirty" } else { "" }
    )
}

#[tokio::test]
async fn the_gateway_api_conformance_suite_passes_gateway_http_grpc_and_tls() -> anyhow::Result<()>
{
    let suite = tools_bin()?.join("gateway-conformance");
    let version = std::fs::read_to_string(tools_bin()?.join("gateway-conformance.version"))?;
    let skipped = skipped_tests()?;

    let cluster = LocalCluster::start_with_workloads()?;
    let _agent = cluster.start_pod_agent()?;
    cluster.install_gateway_api()?;
    let class = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": { "name": CLASS },
        "spec": { "controllerName": "holdfast.dev/gateway-controller" },
    });
    let file = cluster.dir().join("gatewayclass.json");
    std::fs::write(&file, class.to_string())?;
    cluster.kubectl_run(&["create", "-f", &file.to_string_lossy()])?;

    let logs = holdfast_tests::e2e_logs("conformance")?;
    let cp = ControlPlane::start(
        "control-plane",
        &cluster.kubeconfig(),
        &logs,
        &[
            "--ingress-class",
            "holdfast-conformance",
            "--debounce",
            "20ms",
            "--max-delay",
            "200ms",
            // Each suite test ends by deleting all its routes, which the guard holds
            // until confirmed: confirm within a second, or the routes of the test before
            // compete with the next test's (see docs/reference.md, "Conformance").
            "--hold-confirm-after",
            "1s",
            "--gateway-address-pool",
            "127.90.0.0/16",
        ],
    )?;
    let state = tempfile::tempdir()?;
    let _proxy = ProxyProc::start("proxy-0", &[cp.grpc_url()], state.path(), &logs, &[])?;
    // The suite reads the features to test from the class's status: wait for it.
    wait::until(
        "our GatewayClass accepted with its features",
        wait::T,
        || async {
            let out = cluster
                .kubectl_run(&["get", "gatewayclass", CLASS, "-o", "json"])
                .map_err(|e| e.to_string())?;
            let class: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            let features = class["status"]["supportedFeatures"]
                .as_array()
                .map_or(0, Vec::len);
            Ok((features > 0).then_some(()))
        },
    )
    .await?;

    let report = logs.join("conformance-report.yaml");
    let mut args: Vec<String> = [
        "-test.run=^TestConformance$",
        "-test.v",
        "-test.timeout=40m",
        "-gateway-class=holdfast",
        "-organization=holdfast",
        "-project=holdfast",
        "-url=https://github.com/holdfast-ingress/holdfast",
        "-contact=https://github.com/holdfast-ingress/holdfast/issues",
        "-allow-crds-mismatch=false",
    ]
    .map(String::from)
    .to_vec();
    let names: Vec<&str> = PROFILES.iter().map(|(name, _)| *name).collect();
    args.push(format!("-conformance-profiles={}", names.join(",")));
    args.push(format!("-version={}", implementation_version()));
    args.push(format!("-report-output={}", report.display()));
    if !skipped.is_empty() {
        args.push(format!("-skip-tests={}", skipped.join(",")));
    }
    let out_file = std::fs::File::create(logs.join("conformance.log"))?;
    let status = Command::new(&suite)
        .args(&args)
        .env("KUBECONFIG", cluster.kubeconfig())
        .current_dir(cluster.dir())
        .stdout(out_file.try_clone()?)
        .stderr(out_file)
        .status()
        .with_context(|| format!("running {}", suite.display()))?;
    let text = std::fs::read_to_string(&report).with_context(|| {
        format!(
            "the suite ({}, exit {status}) wrote no report; see {}",
            version.trim(),
            logs.join("conformance.log").display()
        )
    })?;
    let parsed: serde_json::Value = serde_yaml::from_str(&text)?;
    if let Ok(target) = std::env::var("HOLDFAST_CONFORMANCE_REPORT") {
        std::fs::write(&target, &text).with_context(|| format!("writing {target}"))?;
    }
    for (profile, extended_runs) in PROFILES {
        assert!(
            parsed["profiles"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == profile)),
            "{profile} is not in the report; see {}",
            report.display()
        );
        // No core test failed or was skipped (the suite reports a skipped core test as a
        // success of the rest).
        for counted in ["Failed", "Skipped"] {
            assert_eq!(
                profile_core_count(&parsed, profile, counted),
                Some(0),
                "{profile} core: {counted} is not 0; see {}",
                report.display()
            );
        }
        assert!(
            profile_core_count(&parsed, profile, "Passed").is_some_and(|n| n > 0),
            "{profile} core: no test passed; see {}",
            report.display()
        );
        assert_eq!(
            profile_result(&parsed, profile, "core").as_deref(),
            Some("success"),
            "{profile} core did not pass (suite exit {status}); see {} and {}",
            report.display(),
            logs.join("conformance.log").display()
        );
        // Every extended feature claimed passes its tests (the report names each claimed
        // feature; a claim the suite has no test for is a success with nothing run).
        let extended = profile_result(&parsed, profile, "extended");
        assert!(
            extended.as_deref() == Some("success") || (!extended_runs && extended.is_none()),
            "{profile} extended did not pass ({extended:?}); see {}",
            report.display()
        );
    }
    assert!(
        status.success(),
        "the suite failed: see {}",
        logs.join("conformance.log").display()
    );
    Ok(())
}
