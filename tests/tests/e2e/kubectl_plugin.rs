//! `kubectl holdfast` (the `kubectl-holdfast` binary) against the real stack: a control
//! plane watching kube-apiserver, a real proxy, the operator's certificate.
//!
//! - Each command with `--control-plane` and certificate files, its output checked against
//!   what the control plane's Admin service says (through the real grpcurl).
//! - Finding the control plane as an operator's machine does: the kubeconfig, the Service
//!   `holdfast-system/holdfast-control-plane`, a ready pod from its EndpointSlices, the
//!   API server's port-forward to it (kwok serves it for its fake Node, forwarding to the
//!   control plane process), and the operator's certificate from the Secret
//!   `holdfast-operator-tls`.

use std::path::Path;
use std::process::Output;

use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::grpcurl::call;
use holdfast_tests::objects::{self, create, create_class};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::subscriber::Subscriber;
use holdfast_tests::tls::Planes;
use holdfast_tests::wait::{T, until};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Runs `kubectl-holdfast ARGS` (with a deadline of its own, `--timeout`).
fn plugin(args: &[&str]) -> anyhow::Result<Output> {
    Ok(
        std::process::Command::new(holdfast_tests::workspace_bin("kubectl-holdfast"))
            .args(["--timeout", "20s"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()?,
    )
}

/// `kubectl-holdfast ARGS`'s stdout, or an error with its stderr.
fn run(args: &[&str]) -> Result<String, String> {
    let out = plugin(args).map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "kubectl-holdfast {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The words of the table row that starts with `first`.
fn row<'a>(out: &'a str, first: &str) -> Option<Vec<&'a str>> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&first))
}

#[tokio::test]
async fn each_plugin_command_shows_what_the_control_plane_knows() -> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "kubectl").await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    let logs = holdfast_tests::e2e_logs(&ns)?;
    let host = format!("web.{ns}.test");
    create(&client, Some(&ns), &objects::service("web", 80, 8080)).await?;
    create(
        &client,
        Some(&ns),
        &objects::endpoint_slice("web-1", "web", 8080, &["10.200.0.10"]),
    )
    .await?;
    create(
        &client,
        Some(&ns),
        &objects::ingress("web", &class, &host, "web", 80),
    )
    .await?;
    let cp = ControlPlane::start(
        "control-plane",
        &cluster.kubeconfig(),
        &logs,
        &["--ingress-class", &class, "--debounce", "50ms"],
    )?;
    let state = tempfile::tempdir()?;
    let proxy = ProxyProc::start("proxy-kubectl", &[cp.grpc_url()], state.path(), &logs, &[])?;

    let planes = Planes::get();
    let address = cp.grpc.to_string();
    let (ca, cert, key) = (
        path(&planes.ca_file),
        path(&planes.operator.0),
        path(&planes.operator.1),
    );
    let flags = [
        "--control-plane",
        &address,
        "--tls-server-name",
        "localhost",
        "--cacert",
        &ca,
        "--cert",
        &cert,
        "--key",
        &key,
    ];
    let with = |args: &[&str]| -> Vec<String> {
        flags
            .iter()
            .chain(args)
            .map(|s| (*s).to_owned())
            .collect::<Vec<_>>()
    };
    let run_with = |args: &[&str]| {
        let all = with(args);
        run(&all.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // status: the proxy serves the published version.
    let published = |cp: &ControlPlane| -> anyhow::Result<String> {
        let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
        Ok(status["publishedVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned())
    };
    let status = until("the proxy SYNCED in kubectl holdfast status", T, || async {
        let out = run_with(&["status"])?;
        let version = published(&cp).map_err(|e| e.to_string())?;
        let synced = row(&out, "proxy-kubectl")
            .is_some_and(|r| r.get(3) == Some(&version.as_str()) && r.get(4) == Some(&"SYNCED"));
        Ok((synced && !version.is_empty()).then_some((out, version)))
    })
    .await?;
    let (out, version) = status;
    assert!(
        out.starts_with(&format!("Replica {address}: published {version} (")),
        "{out}"
    );
    assert_eq!(
        row(&out, "PROXY"),
        Some(vec![
            "PROXY",
            "ZONE",
            "REPLICA",
            "VERSION",
            "STATE",
            "BEHIND",
            "CONNECTED"
        ]),
        "{out}"
    );
    println!("$ kubectl holdfast status\n{out}");
    let proxy_row = row(&out, "proxy-kubectl").expect("the proxy's row");
    assert_eq!(proxy_row[2], address, "{out}");
    assert_eq!(proxy_row[5], "0", "{out}");

    // rollout: the Ingress's generation, in the published version, served by the proxy.
    let rollout = run_with(&["rollout", "ingress/web", "-n", &ns]).map_err(anyhow::Error::msg)?;
    let asked = json!({ "kind": "Ingress", "namespace": ns, "name": "web" }).to_string();
    let admin = call(cp.grpc, "holdfast.v1.Admin/GetRollout", &asked)?;
    println!("$ kubectl holdfast rollout ingress/web -n {ns}\n{rollout}");
    let lines: Vec<&str> = rollout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "Ingress {ns}/web: generation 1 (resourceVersion {})",
            admin["resourceVersion"].as_str().unwrap_or("?")
        ),
        "{rollout}"
    );
    assert_eq!(
        lines[1],
        format!(
            "Replica {address}: generation 1 is in published version {}",
            admin["publishedVersion"].as_str().unwrap_or("?")
        ),
        "{rollout}"
    );
    assert_eq!(lines[2], "Proxies: 1 of 1 connected serve it", "{rollout}");
    let served = row(&rollout, "proxy-kubectl").expect("the proxy's rollout row");
    assert_eq!(served[4], "yes", "{rollout}");

    // explain: the route and backend a proxy would pick for the URL, or why none.
    let explained =
        run_with(&["explain", &format!("{host}/anything/../api")]).map_err(anyhow::Error::msg)?;
    println!("$ kubectl holdfast explain {host}/anything/../api\n{explained}");
    assert!(
        explained.contains("  Path:        routed as /api\n"),
        "{explained}"
    );
    assert!(explained.contains("  Status:      200\n"), "{explained}");
    assert!(
        explained.contains(&format!(
            "  Route:       Prefix / on host \"{host}\", from {ns}/web\n"
        )),
        "{explained}"
    );
    assert!(
        explained.contains(&format!(
            "  Backend:     {ns}/web:80 (endpoints 10.200.0.10:8080)\n"
        )),
        "{explained}"
    );
    let miss =
        run_with(&["explain", &format!("nowhere.{ns}.test/")]).map_err(anyhow::Error::msg)?;
    assert!(miss.contains("  Status:      404, no route\n"), "{miss}");

    // Bad questions: a clear error and a failing exit status.
    let unknown = run_with(&["rollout", "ingress/nope", "-n", &ns]).unwrap_err();
    assert!(
        unknown.contains(&format!(
            "Ingress {ns}/nope: the control plane does not know it"
        )),
        "{unknown}"
    );
    let kind = run_with(&["rollout", "pod/web"]).unwrap_err();
    assert!(kind.contains("not a kind holdfast rolls out"), "{kind}");
    // The wrong CA: the control plane is not trusted.
    let other = holdfast_tests::tls::TestCa::new("another CA");
    let dir = tempfile::tempdir()?;
    let other_ca = path(&other.write(dir.path(), "other")?);
    let refused = run(&[
        "--control-plane",
        &address,
        "--tls-server-name",
        "localhost",
        "--cacert",
        &other_ca,
        "--cert",
        &cert,
        "--key",
        &key,
        "status",
    ])
    .unwrap_err();
    assert!(
        refused.contains("connecting to the control plane"),
        "{refused}"
    );
    drop(proxy);
    Ok(())
}

/// The pods' labels, which the control plane's Service selects.
fn control_plane_labels() -> serde_json::Value {
    json!({ "app.kubernetes.io/name": "holdfast-control-plane" })
}

/// Pod `name` of the control plane's Service on kwok's Node: Ready (as a kubelet would
/// mark it), with its `grpc` port forwarded by kwok to `target`.
async fn control_plane_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    target: std::net::SocketAddr,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": control_plane_labels() },
        "spec": { "containers": [{
            "name": "control-plane",
            "image": "ghcr.io/holdfast-dev/holdfast-control-plane:0.1.0",
            "ports": [{ "name": "grpc", "containerPort": 18000 }],
        }]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = until("the pod Running on kwok's Node", T, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some();
        Ok(running.then_some(p))
    })
    .await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = holdfast_tests::pod_agent::readiness_patch(&running, true, "Serving", "test", &now);
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    let gvk = kube::api::GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "PortForward");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "portforwards");
    let forwards: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &resource);
    let forward: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "PortForward",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "forwards": [{
            "ports": [18000],
            "target": { "address": target.ip().to_string(), "port": target.port() },
        }]},
    }))?;
    forwards.create(&PostParams::default(), &forward).await?;
    Ok(())
}

/// The control plane's Service, once `n` of its endpoints are ready.
async fn control_plane_service(client: &kube::Client, ns: &str, n: usize) -> anyhow::Result<()> {
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": "holdfast-control-plane" },
        "spec": {
            "selector": control_plane_labels(),
            "ports": [
                { "name": "grpc", "port": 18000, "targetPort": "grpc" },
            ],
        },
    }))?;
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &service)
        .await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    until("the Service's ready endpoints", T, || async {
        let list = slices
            .list(
                &ListParams::default().labels("kubernetes.io/service-name=holdfast-control-plane"),
            )
            .await
            .map_err(|e| e.to_string())?;
        let ready = list
            .items
            .iter()
            .flat_map(|s| &s.endpoints)
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        Ok((ready == n).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_plugin_finds_the_control_plane_through_its_service_and_the_operator_secret()
-> anyhow::Result<()> {
    let cluster = LocalCluster::start_with_workloads()?;
    let client = cluster.client().await?;
    let ns = "holdfast-system";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": ns } }))?,
        )
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    until("the default ServiceAccount", T, || async {
        accounts.get_opt("default").await.map_err(|e| e.to_string())
    })
    .await?;
    let logs = holdfast_tests::e2e_logs("kubectl-service")?;
    // Two replicas, as deploy/kubernetes runs: each a pod of the Service.
    let cp = ControlPlane::start("control-plane-0", &cluster.kubeconfig(), &logs, &[])?;
    let cp1 = ControlPlane::start("control-plane-1", &cluster.kubeconfig(), &logs, &[])?;
    control_plane_pod(&client, ns, "holdfast-control-plane-0", cp.grpc).await?;
    control_plane_pod(&client, ns, "holdfast-control-plane-1", cp1.grpc).await?;
    control_plane_service(&client, ns, 2).await?;

    // The operator's certificate, as cert-manager writes it (certificates.yaml).
    let planes = Planes::get();
    let file = |p: &Path| -> anyhow::Result<k8s_openapi::ByteString> {
        Ok(k8s_openapi::ByteString(std::fs::read(p)?))
    };
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("holdfast-operator-tls".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                ("ca.crt".to_owned(), file(&planes.ca_file)?),
                ("tls.crt".to_owned(), file(&planes.operator.0)?),
                ("tls.key".to_owned(), file(&planes.operator.1)?),
            ]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;

    // A proxy on each replica: status lists both, each with its replica.
    let mut proxy = Subscriber::connect(&cp.grpc_url(), "proxy-on-0", None).await?;
    proxy.wait_for("a snapshot", T, |_| true).await?;
    let mut other = Subscriber::connect(&cp1.grpc_url(), "proxy-on-1", None).await?;
    other.wait_for("a snapshot", T, |_| true).await?;
    let kubeconfig = path(&cluster.kubeconfig());
    let out = until("kubectl holdfast status through the Service", T, || async {
        let out = run(&["--kubeconfig", &kubeconfig, "status"])?;
        let synced = |id: &str, replica: &str| {
            row(&out, id).is_some_and(|r| r.get(2) == Some(&replica) && r.get(4) == Some(&"SYNCED"))
        };
        Ok((synced("proxy-on-0", "holdfast-control-plane-0")
            && synced("proxy-on-1", "holdfast-control-plane-1"))
        .then_some(out))
    })
    .await?;
    println!("$ kubectl holdfast status\n{out}");
    for (replica, cp) in [
        ("holdfast-control-plane-0", &cp),
        ("holdfast-control-plane-1", &cp1),
    ] {
        let version = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?["publishedVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            out.contains(&format!("Replica {replica}: published {version} (")),
            "{out}"
        );
    }

    // A replica that does not answer is listed with why; the other's proxy still shows.
    drop(other);
    drop(cp1);
    let out = run(&["--kubeconfig", &kubeconfig, "status"]).map_err(anyhow::Error::msg)?;
    assert!(
        out.lines()
            .any(|l| l.starts_with("Replica holdfast-control-plane-1: no answer: ")),
        "{out}"
    );
    assert!(
        row(&out, "proxy-on-0").is_some_and(|r| r.get(4) == Some(&"SYNCED")),
        "{out}"
    );

    // Without the Secret and without files: told where the certificate was looked for.
    Api::<Secret>::namespaced(client.clone(), ns)
        .delete("holdfast-operator-tls", &Default::default())
        .await?;
    let missing = run(&["--kubeconfig", &kubeconfig, "status"]).unwrap_err();
    assert!(
        missing.contains("Secret holdfast-system/holdfast-operator-tls"),
        "{missing}"
    );
    Ok(())
}
