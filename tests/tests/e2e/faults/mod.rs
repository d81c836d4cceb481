//! The fault suite: zero failed requests through API-server, etcd and control-plane
//! outages (docs/design.md, "What holdfast is for"). Every scenario runs real processes:
//! a private kube-apiserver and etcd, the control plane behind a TCP fault proxy, two
//! proxies, echo backends in a test network namespace, and steady traffic.
//!
//! Outage lengths (30 s, 20 s, 60 s) are the faults themselves, so they are timed; every
//! other wait is for a condition with a deadline.
//!
//! # Layout
//! - `api_server`: the API server and etcd refused, cut, killed, blackholed, partitioned,
//!   compacted; permissions lost.
//! - `control_plane`: the control plane killed; lagging replicas; held removals.
//! - `proxy`: proxy restarts, corrupt state files, invalid snapshots.
//! - `routes`: route changes under traffic.
//!
//! The helpers below are shared by the scenarios.

mod api_server;
mod control_plane;
mod proxy;
mod routes;

use std::time::{Duration, Instant};

use holdfast_tests::control_plane::{ControlPlane, kubeconfig_via};
use holdfast_tests::objects::{self, create};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::scenario::{Scenario, T, base_cp_args, create_app};
use holdfast_tests::traffic::Report;
use holdfast_tests::wait;
use kube::Api;
use serde_json::json;

pub(super) const RATE: u32 = 200;

pub(super) fn assert_clean(report: &Report) {
    assert!(
        !report.ran_out,
        "the traffic driver stopped by itself: the scenario outlived it; {}",
        report.summary()
    );
    assert!(
        report.unexpected.is_empty(),
        "non-2xx answers: {}",
        report.summary()
    );
    assert!(report.total > 0, "no traffic was sent");
}

/// Complete lists of Ingresses the control plane has made (`holdfast_cache_lists_total`).
pub(super) async fn ingress_lists(cp: &ControlPlane) -> anyhow::Result<f64> {
    cp.metric(r#"holdfast_cache_lists_total{kind="Ingress"}"#)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no holdfast_cache_lists_total for Ingress"))
}

/// Holds the outage for `d`: the fault's own duration, not synchronisation.
pub(super) async fn outage(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Compacts etcd at its current revision through its JSON gateway on 127.0.0.1.
pub(super) fn compact_etcd(s: &Scenario) -> anyhow::Result<u64> {
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

/// The requests the API server has completed with `verb` (its `apiserver_request_total`,
/// summed over resources and codes). In a private cluster these are the control plane's
/// and the test's own.
pub(super) async fn api_requests(client: &kube::Client, verb: &str) -> anyhow::Result<f64> {
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

/// Sets the endpoints of app `app`'s EndpointSlice in `ns` to `addresses`.
pub(super) async fn set_endpoints(
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
pub(super) async fn endpoints_at(p: &ProxyProc, host: &str) -> anyhow::Result<usize> {
    let (_, body) = p
        .admin_get(&format!("/debug/explain?host={host}&path=/"))
        .await?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["backend"]["endpoints"].as_array().map_or(0, Vec::len))
}

/// Waits until `p` answers 200 for `host`.
pub(super) async fn served(p: &ProxyProc, host: &str) -> anyhow::Result<()> {
    wait::until(&format!("{host} served by {}", p.addr), T, || async {
        Ok(matches!(p.get(host, "/").await, Ok((200, _))).then_some(()))
    })
    .await
}

/// ServiceAccounts `holdfast-<r>` for each replica `r`, each bound to three ClusterRoles
/// (`<ns>-ingresses`, `<ns>-services`, `<ns>-rest`) by a binding of the same name plus
/// `-<r>`: deleting one binding takes one kind (or the rest) from one replica.
pub(super) fn apply_split_rbac(s: &Scenario, replicas: &[&str]) -> anyhow::Result<()> {
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
- apiGroups: [gateway.networking.k8s.io]
  resources: [gatewayclasses, gateways, httproutes, grpcroutes, tlsroutes, referencegrants]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update]
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

/// Restarts the control plane, on the same ports and through the fault proxy, as
/// ServiceAccount `holdfast-cp` (see [`apply_split_rbac`]); its log is `<name>.log`.
pub(super) fn restart_cp_as_service_account(s: &mut Scenario, name: &str) -> anyhow::Result<()> {
    let sa = s.cluster.service_account_kubeconfig(&s.ns, "holdfast-cp")?;
    let sa = kubeconfig_via(&sa, s.api_fault.addr(), s.logs.join("cp-sa.kubeconfig"))?;
    let args = base_cp_args(&s.class);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (grpc, admin) = (s.cp.grpc, s.cp.admin);
    s.cp.proc.kill();
    s.cp = ControlPlane::start_at(name, &sa, &s.logs, &args, grpc, admin)?;
    Ok(())
}

/// A kind's progress in a snapshot as the real grpcurl prints it (uint64 as a string).
pub(super) fn progress_of(snapshot: &serde_json::Value, kind: &str) -> u64 {
    snapshot["progress"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["kind"] == kind)
        .and_then(|p| p["resourceVersion"].as_str()?.parse().ok())
        .unwrap_or(0)
}

/// The proxy's served version and progress per kind (its admin API).
pub(super) async fn served_progress(
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

/// Waits until `cp` counts a refused (403) list or watch of `kind`
/// (`holdfast_watch_forbidden_total{kind}`).
pub(super) async fn wait_denied(cp: &ControlPlane, kind: &str) -> anyhow::Result<()> {
    let counter = format!("holdfast_watch_forbidden_total{{kind=\"{kind}\"}}");
    wait::until(
        &format!("a refused watch of {kind} at {}", cp.grpc),
        T,
        || async {
            let refused = cp.metric(&counter).await.map_err(|e| e.to_string())?;
            Ok(refused.is_some_and(|n| n >= 1.0).then_some(()))
        },
    )
    .await
}
