//! `deploy/kubernetes` against the real API server: every manifest is accepted, the RBAC
//! and pod specs follow the allowlist, mutual TLS between the planes is wired consistently,
//! and the control plane works with exactly that RBAC. `deploy/observability` against
//! Prometheus's own promtool and the real `/metrics` of both binaries.
//!
//! `certificates.yaml` holds cert-manager objects, so cert-manager's CRDs (pinned in
//! `deploy/local/versions.env`, fetched by `k8s.sh cert-manager-crds`) are installed first.

use std::collections::BTreeSet;
use std::sync::Mutex;

use holdfast_lock::Lock;
use holdfast_tests::cluster::{LocalCluster, client_from_kubeconfig, run_script};
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::objects::{self, create};
use holdfast_tests::subscriber::{Subscriber, routes};
use holdfast_tests::wait;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use serde_json::Value;

use holdfast_tests::wait::T;

fn kustomize_dir() -> String {
    holdfast_tests::repo_root()
        .join("deploy/kubernetes")
        .to_string_lossy()
        .into_owned()
}

/// Serialises the tests that apply the kustomization to the shared API server: a server
/// dry run racing a real apply of the same objects can see one missing, then try to
/// create it after the real apply did (AlreadyExists).
static KUSTOMIZE_APPLY: Mutex<()> = Mutex::new(());

/// Installs cert-manager's CRDs at the pinned version into `cluster` (once per test binary)
/// and waits until the API server serves their kinds.
fn install_cert_manager_crds(cluster: &LocalCluster) -> anyhow::Result<()> {
    static INSTALLED: Mutex<bool> = Mutex::new(false);
    let mut installed = INSTALLED.locked();
    if *installed {
        return Ok(());
    }
    let dir = run_script(&["cert-manager-crds"])?;
    let dir = dir.trim();
    // Server-side: the biggest CRDs exceed the size limit of the annotation that a
    // client-side apply writes.
    cluster.kubectl_run(&["apply", "--server-side", "-f", dir])?;
    cluster.kubectl_run(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "-f",
        dir,
    ])?;
    holdfast_tests::wait::until_blocking("cert-manager.io/v1 served", T, || {
        let served = cluster
            .kubectl_run(&["get", "--raw", "/apis/cert-manager.io/v1"])
            .unwrap_or_default();
        let all = ["\"certificates\"", "\"issuers\"", "\"clusterissuers\""]
            .iter()
            .all(|r| served.contains(r));
        if all { Ok(Some(())) } else { Err(served) }
    })?;
    *installed = true;
    Ok(())
}

/// The rendered manifests as JSON objects.
fn rendered(cluster: &LocalCluster) -> anyhow::Result<Vec<Value>> {
    // kubectl maps every kind through discovery, even in a client dry run.
    install_cert_manager_crds(cluster)?;
    let out = cluster.kubectl_run(&[
        "apply",
        "--dry-run=client",
        "-o",
        "json",
        "-k",
        &kustomize_dir(),
    ])?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[tokio::test]
async fn every_manifest_passes_server_side_dry_run() -> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    // Namespaced objects need their namespace to exist even in a dry run.
    let _ = cluster.kubectl_run(&["create", "namespace", "holdfast-system"]);
    // The Certificates and Issuers are checked against cert-manager's real schemas.
    install_cert_manager_crds(cluster)?;
    let out = {
        let _serial = KUSTOMIZE_APPLY.locked();
        cluster.kubectl_run(&["apply", "--dry-run=server", "-k", &kustomize_dir()])?
    };
    let kinds: BTreeSet<&str> = out.lines().filter_map(|l| l.split('/').next()).collect();
    for kind in [
        "namespace",
        "serviceaccount",
        "clusterrole.rbac.authorization.k8s.io",
        "role.rbac.authorization.k8s.io",
        "deployment.apps",
        "service",
        "poddisruptionbudget.policy",
        "horizontalpodautoscaler.autoscaling",
        "networkpolicy.networking.k8s.io",
        "ingressclass.networking.k8s.io",
        "certificate.cert-manager.io",
        "issuer.cert-manager.io",
    ] {
        assert!(
            kinds.contains(kind),
            "{kind} missing from the server dry run:\n{out}"
        );
    }
    assert!(
        out.lines().all(|l| l.ends_with("(server dry run)")),
        "{out}"
    );
    Ok(())
}

#[tokio::test]
async fn rbac_and_pod_security_follow_the_allowlist() -> anyhow::Result<()> {
    let objects = rendered(LocalCluster::shared())?;
    let role = find(&objects, "ClusterRole", "holdfast-control-plane");
    let mut granted: BTreeSet<(String, String, String)> = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert!(rule.get("resourceNames").is_none());
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for v in rule["verbs"].as_array().unwrap() {
                    granted.insert((
                        g.as_str().unwrap().into(),
                        r.as_str().unwrap().into(),
                        v.as_str().unwrap().into(),
                    ));
                }
            }
        }
    }
    let mut allowed: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (g, r) in [
        ("networking.k8s.io", "ingresses"),
        ("networking.k8s.io", "ingressclasses"),
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
        // Certificates for spec.tls (the watch is narrowed to kubernetes.io/tls).
        ("", "secrets"),
        ("", "namespaces"),
        ("gateway.networking.k8s.io", "gatewayclasses"),
        ("gateway.networking.k8s.io", "gateways"),
        ("gateway.networking.k8s.io", "httproutes"),
        ("gateway.networking.k8s.io", "grpcroutes"),
        ("gateway.networking.k8s.io", "tlsroutes"),
        ("gateway.networking.k8s.io", "referencegrants"),
    ] {
        for v in ["get", "list", "watch"] {
            allowed.insert((g.into(), r.into(), v.into()));
        }
    }
    for v in ["update", "patch"] {
        allowed.insert((
            "networking.k8s.io".into(),
            "ingresses/status".into(),
            v.into(),
        ));
        for status in [
            "gatewayclasses/status",
            "gateways/status",
            "httproutes/status",
            "grpcroutes/status",
            "tlsroutes/status",
        ] {
            allowed.insert(("gateway.networking.k8s.io".into(), status.into(), v.into()));
        }
    }
    for g in ["", "events.k8s.io"] {
        for v in ["create", "patch"] {
            allowed.insert((g.into(), "events".into(), v.into()));
        }
    }
    assert_eq!(
        granted, allowed,
        "the ClusterRole grants exactly the allowlist"
    );

    // No wildcards anywhere, and Secrets only read (no Role grants more); leases only in
    // our namespace, by name where Kubernetes allows.
    for o in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        let text = o.to_string();
        assert!(!text.contains("\"*\""), "wildcard in {text}");
    }
    assert_eq!(
        objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole")
            .count(),
        1
    );
    // The Lease and the host claims ConfigMap: only in our namespace, by name where
    // Kubernetes allows.
    for (role, resource, name) in [
        (
            "holdfast-control-plane-lease",
            "leases",
            "holdfast-control-plane",
        ),
        (
            "holdfast-control-plane-claims",
            "configmaps",
            "holdfast-host-claims",
        ),
    ] {
        let role = find(&objects, "Role", role);
        assert_eq!(role["metadata"]["namespace"], "holdfast-system");
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(rule["resources"], serde_json::json!([resource]));
            let verbs: Vec<&str> = rule["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            if verbs != ["create"] {
                assert_eq!(rule["resourceNames"], serde_json::json!([name]), "{rule}");
            }
        }
    }

    // Gateway Services: written only in our namespace, and only these verbs.
    let role = find(&objects, "Role", "holdfast-control-plane-gateway-services");
    assert_eq!(role["metadata"]["namespace"], "holdfast-system");
    assert_eq!(
        role["rules"],
        serde_json::json!([{ "apiGroups": [""], "resources": ["services"],
                             "verbs": ["create", "patch", "delete"] }])
    );
    let binding = find(
        &objects,
        "RoleBinding",
        "holdfast-control-plane-gateway-services",
    );
    assert_eq!(binding["subjects"][0]["name"], "holdfast-control-plane");

    for name in ["holdfast-control-plane", "holdfast-proxy"] {
        let d = find(&objects, "Deployment", name);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        for c in pod["containers"].as_array().unwrap() {
            let sc = &c["securityContext"];
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
            assert_eq!(
                sc["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{name}"
            );
            assert!(sc["capabilities"].get("add").is_none(), "{name}");
            assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
            assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
            assert!(
                c["resources"]["requests"].is_object() && c["resources"]["limits"].is_object(),
                "{name}"
            );
        }
    }
    let cp = find(&objects, "Deployment", "holdfast-control-plane");
    assert_eq!(cp["spec"]["replicas"], 2);
    let dp = find(&objects, "Deployment", "holdfast-proxy");
    assert_eq!(dp["spec"]["replicas"], 3);
    let pod = &dp["spec"]["template"]["spec"];
    assert_eq!(
        pod["automountServiceAccountToken"], false,
        "the proxy must have no API token"
    );
    // Shutdown fits in the termination grace period: preStop, drain delay, grace.
    let proxy = &pod["containers"][0];
    let secs = |flag: &str| {
        humantime::parse_duration(arg(proxy, flag))
            .unwrap_or_else(|e| panic!("--{flag}: {e}"))
            .as_secs()
    };
    let pre_stop = proxy["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .expect("a preStop sleep");
    assert_eq!(
        pre_stop,
        secs("drain-delay"),
        "the preStop matches --drain-delay"
    );
    assert!(
        pod["terminationGracePeriodSeconds"].as_u64().unwrap()
            > pre_stop + secs("drain-delay") + secs("shutdown-grace"),
        "terminationGracePeriodSeconds leaves no room to drain"
    );
    // Memory follows --max-snapshot-bytes (the arithmetic is in the manifest's comment):
    // three copies while applying, the memory-backed state volume, and room for
    // connections.
    let max: u64 = arg(proxy, "max-snapshot-bytes").parse()?;
    let mib = |q: &Value| {
        q.as_str()
            .and_then(|q| q.strip_suffix("Mi"))
            .and_then(|n| n.parse::<u64>().ok())
            .map(|n| n << 20)
            .unwrap_or_else(|| panic!("not a quantity in Mi: {q}"))
    };
    let state_volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "state")
        .expect("the state volume");
    let size_limit = mib(&state_volume["emptyDir"]["sizeLimit"]);
    assert!(
        size_limit >= 4 * max,
        "the state volume holds the state file, a replacement being written, and the delta log (up to about twice the state file before it is compacted)"
    );
    let memory = mib(&proxy["resources"]["limits"]["memory"]);
    let connections: u64 = arg(proxy, "connection-memory").parse()?;
    assert!(
        memory >= 3 * max + size_limit + connections,
        "the proxy's memory limit is below 3 x --max-snapshot-bytes + the state volume + --connection-memory"
    );
    let cp_container = &cp["spec"]["template"]["spec"]["containers"][0];
    let cp_max: u64 = arg(cp_container, "max-snapshot-bytes").parse()?;
    assert!(
        cp_max <= max,
        "the proxies would NACK what the control plane publishes"
    );
    // The control plane's memory follows its own limit (the arithmetic is in its
    // manifest's comment): four snapshot-sized copies (published, its encoding, a held
    // one, the candidate) plus 256 MiB for the caches and digests at 10,000 Ingresses.
    let cp_memory = mib(&cp_container["resources"]["limits"]["memory"]);
    assert!(
        cp_memory >= 4 * cp_max + (256 << 20),
        "the control plane's memory limit is below 4 x --max-snapshot-bytes + 256 MiB"
    );
    let mounts = pod["containers"][0]["volumeMounts"].to_string();
    let args = pod["containers"][0]["args"].to_string();
    assert!(mounts.contains("/var/lib/holdfast") && args.contains("--state-dir=/var/lib/holdfast"));
    assert_eq!(
        find(&objects, "Service", "holdfast-proxy")["spec"]["type"],
        "LoadBalancer"
    );
    find(&objects, "HorizontalPodAutoscaler", "holdfast-proxy");
    find(&objects, "PodDisruptionBudget", "holdfast-proxy");
    find(&objects, "PodDisruptionBudget", "holdfast-control-plane");
    assert_eq!(
        find(&objects, "IngressClass", "holdfast")["spec"]["controller"],
        "holdfast.dev/ingress-controller"
    );

    // Only proxies reach the gRPC port.
    let np = find(&objects, "NetworkPolicy", "holdfast-control-plane-grpc");
    let grpc_rule = np["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ports"][0]["port"] == 18000)
        .expect("a rule for 18000");
    assert_eq!(
        grpc_rule["from"],
        serde_json::json!([{ "podSelector": { "matchLabels": { "app.kubernetes.io/name": "holdfast-proxy" } } }])
    );
    Ok(())
}

/// The value of `--flag=value` in a container's args.
fn arg<'a>(container: &'a Value, flag: &str) -> &'a str {
    let prefix = format!("--{flag}=");
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str().unwrap().strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no --{flag} in {}", container["args"]))
}

/// The volume `path` is on (mounted at it or at a parent of it), and its mount path.
fn volume_under<'a>(pod: &'a Value, container: &Value, path: &str) -> (&'a Value, String) {
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            let dir = m["mountPath"].as_str().unwrap();
            let rest = path.strip_prefix(dir);
            rest.is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .unwrap_or_else(|| panic!("{path} is on no volume"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    (volume, mount["mountPath"].as_str().unwrap().to_owned())
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The gRPC link is mutual TLS from cert-manager, and every name on both sides agrees: the
/// control plane's certificate is valid for the host proxies dial and its CA is the one
/// that signs proxies; a proxy's certificate names its pod, which is its node id; the
/// operator identity is the one Admin allows. Plus HTTPS end to end, and the state volume.
#[tokio::test]
async fn mutual_tls_between_the_planes_is_wired_consistently() -> anyhow::Result<()> {
    let objects = rendered(LocalCluster::shared())?;
    let issuer = |name: &str| find(&objects, "Issuer", name);
    let certificate = |name: &str| find(&objects, "Certificate", name);

    // The CA: self-signed, ECDSA P-256, its Secret behind the CA Issuer.
    let ca = certificate("holdfast-ca");
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(ca["spec"]["privateKey"]["algorithm"], "ECDSA");
    assert_eq!(ca["spec"]["privateKey"]["size"], 256);
    let root = issuer(ca["spec"]["issuerRef"]["name"].as_str().unwrap());
    assert!(root["spec"]["selfSigned"].is_object());
    assert_eq!(
        issuer("holdfast-ca")["spec"]["ca"]["secretName"],
        ca["spec"]["secretName"]
    );

    // Control plane: serving certificate, key and client CA from its Certificate's Secret.
    let cp_dep = find(&objects, "Deployment", "holdfast-control-plane");
    let cp_pod = &cp_dep["spec"]["template"]["spec"];
    let cp = &cp_pod["containers"][0];
    let serving = certificate("holdfast-control-plane");
    assert_eq!(serving["spec"]["issuerRef"]["name"], "holdfast-ca");
    assert!(strings(&serving["spec"]["usages"]).contains(&"server auth"));
    for (flag, file) in [
        ("tls-cert", "tls.crt"),
        ("tls-key", "tls.key"),
        ("client-ca", "ca.crt"),
    ] {
        let path = arg(cp, flag);
        let (volume, dir) = volume_under(cp_pod, cp, path);
        assert_eq!(path, format!("{dir}/{file}"), "--{flag}");
        assert_eq!(
            volume["secret"]["secretName"], serving["spec"]["secretName"],
            "--{flag}"
        );
    }
    assert!(!cp["args"].to_string().contains("--insecure-plaintext"));

    // The operator: a client certificate whose identity is the only admin identity.
    let operator = certificate("holdfast-operator");
    assert_eq!(operator["spec"]["issuerRef"]["name"], "holdfast-ca");
    assert_eq!(
        strings(&operator["spec"]["usages"]),
        ["digital signature", "client auth"]
    );
    assert_eq!(
        strings(&operator["spec"]["uris"]),
        [arg(cp, "admin-identities")],
        "--admin-identities is exactly the operator's identity"
    );
    // Only the proxies' pod names may stream routes: the pattern matches the proxy
    // Deployment's pods and neither the operator's nor the control plane's identity.
    let proxies = arg(cp, "proxy-identities");
    assert_eq!(proxies, "holdfast-proxy-*");
    for not_a_proxy in strings(&operator["spec"]["uris"])
        .into_iter()
        .chain(strings(&serving["spec"]["dnsNames"]))
    {
        assert!(
            !holdfast_control_plane::authn::matches(proxies, not_a_proxy),
            "{not_a_proxy} may stream routes"
        );
    }
    assert!(holdfast_control_plane::authn::matches(
        proxies,
        "holdfast-proxy-7c9f8d6b5-x2x4q"
    ));

    // Proxies dial an https URL whose host the serving certificate names.
    let dp_dep = find(&objects, "Deployment", "holdfast-proxy");
    let dp_pod = &dp_dep["spec"]["template"]["spec"];
    let dp = &dp_pod["containers"][0];
    let url = arg(dp, "control-plane");
    let host = url
        .strip_prefix("https://")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("--control-plane {url} is not https://host:port"));
    assert!(
        strings(&serving["spec"]["dnsNames"]).contains(&host),
        "the serving certificate does not name {host}"
    );
    assert!(url.ends_with(":18000"), "{url}");
    assert!(!dp["args"].to_string().contains("--insecure-plaintext"));

    // Each proxy's certificate comes from the csi-driver volume, for its own pod name,
    // which is also its node id; the CA it trusts comes with it.
    for (flag, file) in [
        ("tls-cert", "tls.crt"),
        ("tls-key", "tls.key"),
        ("control-plane-ca", "ca.crt"),
    ] {
        let path = arg(dp, flag);
        let (volume, dir) = volume_under(dp_pod, dp, path);
        assert_eq!(path, format!("{dir}/{file}"), "--{flag}");
        let csi = &volume["csi"];
        assert_eq!(csi["driver"], "csi.cert-manager.io", "--{flag}");
        assert_eq!(csi["readOnly"], true);
        let attrs = &csi["volumeAttributes"];
        let attr = |k: &str| attrs[format!("csi.cert-manager.io/{k}")].clone();
        assert_eq!(attr("issuer-name"), "holdfast-ca");
        assert_eq!(attr("issuer-kind"), "Issuer");
        assert_eq!(attr("dns-names"), "${POD_NAME}");
        assert!(attr("key-usages").as_str().unwrap().contains("client auth"));
        // The files are mode 0440 owned by root: readable through the group only.
        assert_eq!(
            attr("fs-group").as_str().unwrap(),
            dp_pod["securityContext"]["runAsGroup"].to_string()
        );
    }
    let node_id = dp["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "HOLDFAST_NODE_ID")
        .expect("HOLDFAST_NODE_ID");
    assert_eq!(
        node_id["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert!(!dp["args"].to_string().contains("--node-id"));

    // HTTPS: listener, container port, Service port 443, NetworkPolicy.
    let tls_port: u16 = arg(dp, "listen-tls").rsplit(':').next().unwrap().parse()?;
    let https = dp["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "https")
        .expect("an https container port");
    assert_eq!(https["containerPort"], tls_port);
    let svc = find(&objects, "Service", "holdfast-proxy");
    assert!(
        svc["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"] == 443 && p["targetPort"] == "https")
    );
    let np = find(&objects, "NetworkPolicy", "holdfast-proxy");
    assert!(
        np["spec"]["ingress"]
            .to_string()
            .contains(&format!("\"port\":{tls_port}"))
    );

    // The state directory holds private keys: in memory, and a directory the proxy creates
    // (it makes it 0700; the volume's root is not its own to chmod).
    let state = arg(dp, "state-dir");
    let (volume, dir) = volume_under(dp_pod, dp, state);
    assert_ne!(
        state.trim_end_matches('/'),
        dir,
        "--state-dir is the volume root"
    );
    assert_eq!(volume["emptyDir"]["medium"], "Memory");
    assert!(volume["emptyDir"]["sizeLimit"].is_string());
    Ok(())
}

/// One control plane at a time runs the RBAC check: each must take the Lease and write
/// status and Events itself.
static RBAC_CHECK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_control_plane_works_with_exactly_the_deploy_rbac() -> anyhow::Result<()> {
    let _serial = RBAC_CHECK.lock().await;
    control_plane_works_with_the_rbac_applied_by(&["apply", "-k", &kustomize_dir()], "kustomize")
        .await
}

#[tokio::test]
async fn the_control_plane_works_with_exactly_the_helm_charts_rbac() -> anyhow::Result<()> {
    let _serial = RBAC_CHECK.lock().await;
    // Nothing left over from the kustomization may stand in for what the chart lacks.
    let cluster = LocalCluster::shared();
    {
        let _serial = KUSTOMIZE_APPLY.locked();
        cluster.kubectl_run(&[
            "delete",
            "--ignore-not-found",
            "clusterrole/holdfast-control-plane",
            "clusterrolebinding/holdfast-control-plane",
        ])?;
        cluster.kubectl_run(&[
            "-n",
            "holdfast-system",
            "delete",
            "--ignore-not-found",
            "role/holdfast-control-plane-lease",
            "rolebinding/holdfast-control-plane-lease",
            "serviceaccount/holdfast-control-plane",
        ])?;
    }
    let chart = helm_template(&["--set", "namespace.create=true"])?;
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), chart)?;
    let path = file.path().to_string_lossy().into_owned();
    control_plane_works_with_the_rbac_applied_by(&["apply", "-f", &path], "helm").await
}

/// Applies the deploy objects with `kubectl <apply>`, then runs a control plane with the
/// token of the ServiceAccount they create and checks that it reads, writes status and
/// Events, and holds the Lease with exactly that RBAC.
async fn control_plane_works_with_the_rbac_applied_by(
    apply: &[&str],
    how: &str,
) -> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let _ = cluster.kubectl_run(&["create", "namespace", "holdfast-system"]);
    install_cert_manager_crds(cluster)?;
    {
        let _serial = KUSTOMIZE_APPLY.locked();
        cluster.kubectl_run(apply)?;
    }
    let admin = cluster.client().await?;
    let ns = cluster.namespace(&admin, &format!("rbac{how}")).await?;
    // Two Ingresses with a true conflict, so an Event has to be written too.
    let host = format!("web.{ns}.test");
    objects::create_web(&admin, &ns, &["10.200.0.10"], "a", "holdfast", &host).await?;
    create(
        &admin,
        Some(&ns),
        &objects::ingress("b", "holdfast", &host, "web", 80),
    )
    .await?;

    let kubeconfig =
        cluster.service_account_kubeconfig("holdfast-system", "holdfast-control-plane")?;
    // The token is the deploy ServiceAccount's: it can read (TLS) Secrets, but not write
    // them, and cannot read ConfigMaps, for example.
    let sa = client_from_kubeconfig(&kubeconfig).await?;
    assert!(
        Api::<k8s_openapi::api::core::v1::ConfigMap>::all(sa.clone())
            .list(&Default::default())
            .await
            .is_err()
    );
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "nope" } }))?;
    assert!(
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(sa, &ns)
            .create(&Default::default(), &secret)
            .await
            .is_err()
    );

    let logs = holdfast_tests::e2e_logs(&ns)?;
    let cp = ControlPlane::start(
        &format!("control-plane-rbac-{how}"),
        &kubeconfig,
        &logs,
        &[
            "--ingress-class",
            "holdfast",
            "--lease-namespace",
            "holdfast-system",
            "--publish-address",
            "203.0.113.9",
            "--debounce",
            "50ms",
        ],
    )?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "rbac-proxy", None).await?;
    sub.wait_for("the route", T, |s| routes(s).iter().any(|r| r.0 == host))
        .await?;

    let ingresses: Api<Ingress> = Api::namespaced(admin.clone(), &ns);
    wait::until("Ingress status written by the leader", T, || {
        let ingresses = ingresses.clone();
        async move {
            let ing = ingresses.get("a").await.map_err(|e| e.to_string())?;
            let ip = ing
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .and_then(|i| i.first().and_then(|e| e.ip.clone()));
            Ok((ip.as_deref() == Some("203.0.113.9")).then_some(()))
        }
    })
    .await?;
    // The leader recorded the host's claim with the deploy RBAC (create, then update).
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), "holdfast-system");
    wait::until("the host claim recorded in the ledger", T, || {
        let configmaps = configmaps.clone();
        let (host, ns) = (host.clone(), ns.clone());
        async move {
            let cm = configmaps
                .get_opt("holdfast-host-claims")
                .await
                .map_err(|e| e.to_string())?;
            let claims = cm
                .and_then(|c| c.data)
                .and_then(|d| d.get(&host).cloned())
                .unwrap_or_default();
            Ok(claims
                .contains(&format!("\"namespace\":\"{ns}\""))
                .then_some(()))
        }
    })
    .await?;
    let events: Api<Event> = Api::namespaced(admin, &ns);
    wait::until("the conflict Event", T, || {
        let events = events.clone();
        async move {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok(list
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("ConflictingRoute"))
                .then_some(()))
        }
    })
    .await?;
    // No list or watch of any kind was refused (403) on the way.
    let (_, page) = cp.admin_get("/metrics").await?;
    let scrape = holdfast_tests::metrics::Scrape::parse(&page)?;
    let forbidden = scrape.all(&"holdfast_watch_forbidden_total".into());
    assert_eq!(
        forbidden.len(),
        holdfast_control_plane::state::KINDS.len(),
        "one series per kind: {forbidden:?}"
    );
    assert!(
        forbidden.iter().all(|s| s.value == 0.0),
        "a permission was missing: {forbidden:?}"
    );
    Ok(())
}

/// The images cannot be built here (no Docker engine); this checks what can be checked
/// without one: two stages, a distroless non-root runtime, and the right binary.
#[test]
fn dockerfiles_are_multi_stage_and_run_the_binary_as_non_root() {
    for (dir, package, binary) in [
        (
            "control-plane",
            "holdfast-control-plane",
            "holdfast-control-plane",
        ),
        ("data-plane", "holdfast-data-plane", "holdfast-proxy"),
    ] {
        let path = holdfast_tests::repo_root().join(dir).join("Dockerfile");
        let text = std::fs::read_to_string(&path).unwrap();
        let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
        assert_eq!(froms.len(), 2, "{dir}: a build stage and a runtime stage");
        assert!(froms[0].contains(" AS build"), "{dir}");
        assert!(
            froms[1].contains("distroless") && froms[1].ends_with(":nonroot"),
            "{dir}: {}",
            froms[1]
        );
        assert!(
            text.contains(&format!(
                "cargo build --release --locked -p {package} --bin {binary}"
            )),
            "{dir}"
        );
        let runtime = &text[text.rfind("FROM ").unwrap()..];
        assert!(runtime.contains("USER 65532:65532"), "{dir}: runs as root");
        assert!(
            runtime.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{binary}\"]")),
            "{dir}"
        );
        // The binary it names exists in the workspace.
        assert!(holdfast_tests::workspace_bin(binary).exists());
    }
}

// ---------------------------------------------------------------------------------------
// deploy/observability: the alerts and the dashboard.

fn observability(file: &str) -> std::path::PathBuf {
    holdfast_tests::repo_root()
        .join("deploy/observability")
        .join(file)
}

/// A tool `k8s.sh ensure` builds at its pinned version (promtool, helm).
fn tool(name: &str) -> anyhow::Result<std::path::PathBuf> {
    run_script(&["ensure"])?;
    Ok(std::path::PathBuf::from(run_script(&["tools-dir"])?.trim()).join(name))
}

/// The PrometheusRule's `spec` as a plain Prometheus rule file (the lines under `spec:`,
/// de-indented), which is what promtool reads.
fn rule_file() -> anyhow::Result<String> {
    let text = std::fs::read_to_string(observability("prometheusrule.yaml"))?;
    let spec = text
        .lines()
        .skip_while(|l| *l != "spec:")
        .skip(1)
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    anyhow::ensure!(
        spec.starts_with("groups:"),
        "no spec.groups in prometheusrule.yaml"
    );
    Ok(spec + "\n")
}

/// Every `holdfast_*` name in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("holdfast_") {
        let boundary = rest[..i]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let len = rest[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len() - i);
        if boundary {
            names.push(rest[i..i + len].to_string());
        }
        rest = &rest[i + len..];
    }
    names
}

#[test]
fn the_alerts_pass_promtool_check_and_their_unit_tests() -> anyhow::Result<()> {
    let promtool = tool("promtool")?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("rules.yaml"), rule_file()?)?;
    std::fs::copy(
        observability("rules.test.yaml"),
        dir.path().join("rules.test.yaml"),
    )?;
    let run = |args: &[&str]| -> anyhow::Result<String> {
        let o = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        anyhow::ensure!(o.status.success(), "promtool {args:?}:\n{text}");
        Ok(text)
    };
    run(&["check", "rules", "rules.yaml"])?;
    run(&["test", "rules", "rules.test.yaml"])?;

    // Every alert the issue asks for exists and has a unit test.
    let rules = rule_file()?;
    let tests = std::fs::read_to_string(observability("rules.test.yaml"))?;
    for alert in [
        "HoldfastRemovalHeld",
        "HoldfastProxyNacks",
        "HoldfastProxyBehind",
        "HoldfastCacheNotSynced",
        "HoldfastCertificateExpiresSoon",
        "HoldfastProxyHigh5xxRate",
        "HoldfastHostClaimsWaiting",
    ] {
        assert!(
            rules.contains(&format!("alert: {alert}\n")),
            "{alert} missing"
        );
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no unit test"
        );
    }
    Ok(())
}

/// The names a `/metrics` page exposes: each sample's name, and for each `# TYPE` the
/// names its samples take (`_total` for counters; `_bucket`, `_sum`, `_count` for
/// histograms), so that a family with no series yet counts too.
fn exposed(page: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in page.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut parts = t.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exposed_by_the_binaries()
-> anyhow::Result<()> {
    let mut used: BTreeSet<String> = rule_file()?.lines().flat_map(metric_names).collect();
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(observability("dashboard.json"))?)?;
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            used.extend(metric_names(target["expr"].as_str().expect("expr")));
        }
    }
    assert!(used.len() >= 20, "{used:?}");

    // The real binaries: a control plane on the shared API server and a proxy fed by it.
    // A family appears on /metrics with its first series, so the cluster gets an HTTPS
    // Ingress (certificate expiry) and the proxy one request (requests by route).
    let cluster = LocalCluster::shared();
    let admin = cluster.client().await?;
    let class = "holdfast-observability";
    let _ = objects::create_class(&admin, class).await;
    let ns = cluster.namespace(&admin, "observability").await?;
    let host = format!("web.{ns}.test");
    let issued = holdfast_tests::tls::TestCa::new("observability CA").server(&[&host]);
    create(
        &admin,
        Some(&ns),
        &objects::tls_secret("web-tls", &issued.cert_pem, &issued.key_pem),
    )
    .await?;
    create(&admin, Some(&ns), &objects::service("web", 80, 8080)).await?;
    create(
        &admin,
        Some(&ns),
        &objects::tls_ingress(
            "web",
            class,
            &host,
            "web",
            80,
            "web-tls",
            serde_json::json!({}),
        ),
    )
    .await?;
    let logs = holdfast_tests::repo_root().join("target/e2e-logs/observability");
    std::fs::create_dir_all(&logs)?;
    let cp = ControlPlane::start(
        "control-plane-observability",
        &cluster.kubeconfig(),
        &logs,
        &["--ingress-class", class, "--lease-namespace", "default"],
    )?;
    let state = tempfile::tempdir()?;
    let proxy = holdfast_tests::proxy::ProxyProc::start(
        "proxy-observability",
        &[cp.grpc_url()],
        state.path(),
        &logs,
        &[],
    )?;
    let page = |admin: std::net::SocketAddr, name: &'static str| async move {
        wait::until(&format!("{name} on /metrics"), T, || async move {
            let (_, body) = holdfast_tests::http::get(admin, "localhost", "/metrics")
                .await
                .map_err(|e| e.to_string())?;
            Ok(body.contains(name).then_some(body))
        })
        .await
    };
    let cp_page = page(cp.admin, "holdfast_certificate_expiry_timestamp_seconds{").await?;
    // Requests until one is answered on the route (before the first snapshot the proxy
    // answers 503 itself, matching no route), so the route's request and latency series
    // exist. The host has TLS, so plain HTTP is redirected (matching no route) except for
    // ACME challenges: a challenge path reaches the route.
    let (proxy_addr, proxy_admin) = (proxy.addr, proxy.admin);
    let proxy_page = wait::until("a request answered on the web route", T, || {
        let host = host.clone();
        async move {
            holdfast_tests::http::get(proxy_addr, &host, "/.well-known/acme-challenge/probe")
                .await
                .map_err(|e| e.to_string())?;
            let (_, body) = holdfast_tests::http::get(proxy_admin, "localhost", "/metrics")
                .await
                .map_err(|e| e.to_string())?;
            Ok(body
                .contains("holdfast_proxy_request_duration_seconds_bucket{")
                .then_some(body))
        }
    })
    .await?;
    let mut exposed_names = exposed(&cp_page);
    exposed_names.extend(exposed(&proxy_page));
    let missing: Vec<&String> = used.difference(&exposed_names).collect();
    assert!(
        missing.is_empty(),
        "used by deploy/observability but exposed by neither binary: {missing:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// deploy/helm/holdfast: the chart renders what the kustomization does.

fn chart_dir() -> String {
    holdfast_tests::repo_root()
        .join("deploy/helm/holdfast")
        .to_string_lossy()
        .into_owned()
}

/// Runs helm (built at the pinned version by `k8s.sh ensure`) and returns its output.
fn helm(args: &[&str]) -> anyhow::Result<String> {
    let o = std::process::Command::new(tool("helm")?)
        .args(args)
        .output()?;
    anyhow::ensure!(
        o.status.success(),
        "helm {args:?}:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The chart rendered for namespace holdfast-system with `extra` flags.
fn helm_template(extra: &[&str]) -> anyhow::Result<String> {
    let dir = chart_dir();
    let mut args = vec![
        "template",
        "holdfast",
        &dir,
        "--namespace",
        "holdfast-system",
    ];
    args.extend(extra);
    helm(&args)
}

/// The objects of `kubectl create <args>` (`-k DIR` or `-f FILE`) as JSON, through
/// kubectl's own parser, by kind/namespace/name. A client-side create dry run: nothing is
/// read from or written to the cluster (an apply dry run would merge live objects in).
fn by_identity(
    cluster: &LocalCluster,
    args: &[&str],
) -> anyhow::Result<std::collections::BTreeMap<String, Value>> {
    install_cert_manager_crds(cluster)?;
    let mut all = vec!["create", "--dry-run=client", "-o", "json"];
    all.extend(args);
    // One JSON document per object (or a List).
    let out = cluster.kubectl_run(&all)?;
    let mut items = Vec::new();
    for doc in serde_json::Deserializer::from_str(&out).into_iter::<Value>() {
        let doc = doc?;
        match doc["kind"].as_str() {
            Some("List") => items.extend(doc["items"].as_array().cloned().unwrap_or_default()),
            _ => items.push(doc),
        }
    }
    Ok(items
        .into_iter()
        .map(|o| {
            let key = format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            );
            (key, o)
        })
        .collect())
}

#[tokio::test]
async fn the_helm_chart_passes_lint_and_renders_what_the_kustomization_does() -> anyhow::Result<()>
{
    let lint = helm(&["lint", "--strict", &chart_dir()])?;
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let cluster = LocalCluster::shared();
    let kustomize = by_identity(cluster, &["-k", &kustomize_dir()])?;
    let render = |extra: &[&str]| -> anyhow::Result<_> {
        let file = tempfile::NamedTempFile::new()?;
        std::fs::write(file.path(), helm_template(extra)?)?;
        by_identity(cluster, &["-f", &file.path().to_string_lossy()])
    };
    // Default values: every object of the kustomization but the Namespace, which Helm
    // creates (`--create-namespace`) before it can record the release.
    let mut expected = kustomize.clone();
    assert!(expected.remove("Namespace//holdfast-system").is_some());
    let chart = render(&[])?;
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (key, object) in &expected {
        assert_eq!(
            &chart[key], object,
            "{key} differs between the chart and the kustomization"
        );
    }
    // With the Namespace (for `helm template | kubectl apply`): all of them.
    assert_eq!(render(&["--set", "namespace.create=true"])?, kustomize);

    // Some values, and what they change.
    let changed = render(&[
        "--set",
        "controlPlane.replicas=3",
        "--set",
        "proxy.hpa.enabled=false",
        "--set",
        "proxy.service.type=ClusterIP",
        "--set",
        "ingressClass.name=edge",
        "--set",
        "ingressClass.default=true",
        "--set",
        "proxy.extraArgs={--worker-threads=2}",
        "--set",
        "controlPlane.hpa.enabled=true",
    ])?;
    assert_eq!(
        changed["HorizontalPodAutoscaler/holdfast-system/holdfast-control-plane"]["spec"]["scaleTargetRef"]
            ["name"],
        "holdfast-control-plane"
    );
    let cp = &changed["Deployment/holdfast-system/holdfast-control-plane"];
    assert_eq!(cp["spec"]["replicas"], 3);
    assert!(!changed.contains_key("HorizontalPodAutoscaler/holdfast-system/holdfast-proxy"));
    let svc = &changed["Service/holdfast-system/holdfast-proxy"];
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert!(svc["spec"].get("externalTrafficPolicy").is_none());
    let class = &changed["IngressClass//edge"];
    assert_eq!(
        class["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"],
        "true"
    );
    let proxy = &changed["Deployment/holdfast-system/holdfast-proxy"];
    let args = strings(&proxy["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(args.contains(&"--worker-threads=2"), "{args:?}");

    // Your own CA: no self-signed CA, and the CA Issuer on your Secret still signs.
    let own_ca = render(&["--set", "mtls.certManager.createCA=false"])?;
    assert!(!own_ca.contains_key("Issuer/holdfast-system/holdfast-selfsigned"));
    assert!(!own_ca.contains_key("Certificate/holdfast-system/holdfast-ca"));
    assert!(own_ca.contains_key("Issuer/holdfast-system/holdfast-ca"));
    assert!(own_ca.contains_key("Certificate/holdfast-system/holdfast-control-plane"));
    // No cert-manager: no cert-manager objects at all.
    let none = render(&["--set", "mtls.certManager.enabled=false"])?;
    assert!(
        none.values().all(|o| !o["apiVersion"]
            .as_str()
            .unwrap_or("")
            .starts_with("cert-manager.io/")),
        "{:?}",
        none.keys().collect::<Vec<_>>()
    );
    Ok(())
}

#[tokio::test]
async fn the_helm_chart_passes_server_side_dry_run() -> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let _ = cluster.kubectl_run(&["create", "namespace", "holdfast-system"]);
    install_cert_manager_crds(cluster)?;
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), helm_template(&[])?)?;
    let out = {
        let _serial = KUSTOMIZE_APPLY.locked();
        cluster.kubectl_run(&[
            "apply",
            "--dry-run=server",
            "-f",
            &file.path().to_string_lossy(),
        ])?
    };
    assert!(out.lines().count() >= 20, "{out}");
    assert!(
        out.lines().all(|l| l.ends_with("(server dry run)")),
        "{out}"
    );
    Ok(())
}
