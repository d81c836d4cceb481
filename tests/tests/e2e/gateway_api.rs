//! The pinned Gateway API (`GATEWAY_API_VERSION` in deploy/local/versions.env): its
//! standard-channel CRDs on the real API server, and echo-basic, the conformance suite's
//! backend, built from the suite's own module.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;

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
    cluster.install_gateway_api()?;
    for kind in [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "referencegrants",
    ] {
        let name = format!("{kind}.gateway.networking.k8s.io");
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

/// What answered at an endpoint: the probe that got a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A TLS handshake that verified the certificate the test put in the pod's Secret.
    Tls,
    /// Bytes in reply to an HTTP/1.1 request (an HTTP server, or a TCP echo server).
    Http,
    /// An HTTP/2 SETTINGS frame in reply to the h2c preface (`appProtocol:
    /// kubernetes.io/h2c`).
    H2c,
    /// A DNS reply to a query (UDP).
    Dns,
}

const PROBE: Duration = Duration::from_secs(5);

/// Whether `addr` answers a probe for its protocol, and which.
async fn probe(
    addr: SocketAddr,
    protocol: &str,
    app_protocol: Option<&str>,
    tls: &std::sync::Arc<rustls::ClientConfig>,
) -> Result<Answer, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if protocol == "UDP" {
        // A query for foo.bar.com (the suite's Corefile answers it with `whoami`).
        let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in ["foo", "bar", "com"] {
            query.push(label.len() as u8);
            query.extend_from_slice(label.as_bytes());
        }
        query.extend_from_slice(&[0, 0, 1, 0, 1]);
        let socket = tokio::net::UdpSocket::bind("0.0.0.0:0")
            .await
            .map_err(|e| e.to_string())?;
        socket
            .send_to(&query, addr)
            .await
            .map_err(|e| e.to_string())?;
        let mut reply = [0u8; 512];
        let (n, from) = tokio::time::timeout(PROBE, socket.recv_from(&mut reply))
            .await
            .map_err(|_| "no DNS reply".to_owned())?
            .map_err(|e| e.to_string())?;
        let is_reply = n >= 12 && reply[..2] == [0x12, 0x34] && reply[2] & 0x80 != 0;
        return (from == addr && is_reply)
            .then_some(Answer::Dns)
            .ok_or_else(|| format!("not a DNS reply: {:?}", &reply[..n]));
    }
    let connect = || async {
        tokio::time::timeout(PROBE, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| e.to_string())
    };
    if app_protocol == Some("kubernetes.io/h2c") {
        let mut s = connect().await?;
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        s.write_all(&hello).await.map_err(|e| e.to_string())?;
        let mut head = [0u8; 9];
        tokio::time::timeout(PROBE, s.read_exact(&mut head))
            .await
            .map_err(|_| "no HTTP/2 frame".to_owned())?
            .map_err(|e| e.to_string())?;
        return (head[3] == 4)
            .then_some(Answer::H2c)
            .ok_or_else(|| format!("first frame is not SETTINGS: {head:?}"));
    }
    let connector = tokio_rustls::TlsConnector::from(tls.clone());
    let name =
        rustls::pki_types::ServerName::try_from(SMOKE_TLS_NAME).map_err(|e| e.to_string())?;
    let tcp = connect().await?;
    if let Ok(Ok(_)) = tokio::time::timeout(PROBE, connector.connect(name, tcp)).await {
        return Ok(Answer::Tls);
    }
    let mut s = connect().await?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: smoke.test\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut reply = [0u8; 64];
    let n = tokio::time::timeout(PROBE, s.read(&mut reply))
        .await
        .map_err(|_| "no reply".to_owned())?
        .map_err(|e| e.to_string())?;
    (n > 0)
        .then_some(Answer::Http)
        .ok_or_else(|| "closed without a reply".to_owned())
}

/// The name in the certificates the smoke test puts in the backends' Secrets.
const SMOKE_TLS_NAME: &str = "backend.smoke.test";

fn pod_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod_condition(pod, "Ready").is_some_and(|c| c.status == "True")
}

fn pod_condition<'a>(
    pod: &'a k8s_openapi::api::core::v1::Pod,
    kind: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == kind))
}

/// The Secrets the Deployments in `namespaces` mount: (namespace, name).
async fn mounted_secrets(
    client: &kube::Client,
    namespaces: &[&str],
) -> anyhow::Result<Vec<(String, String)>> {
    use k8s_openapi::api::apps::v1::Deployment;
    let mut out = Vec::new();
    for ns in namespaces {
        let api: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), ns);
        for d in api.list(&Default::default()).await?.items {
            let volumes = d.spec.and_then(|s| s.template.spec).and_then(|s| s.volumes);
            for v in volumes.into_iter().flatten() {
                if let Some(name) = v.secret.and_then(|s| s.secret_name) {
                    let key = (ns.to_string(), name);
                    if !out.contains(&key) {
                        out.push(key);
                    }
                }
            }
        }
    }
    Ok(out)
}

#[tokio::test]
async fn the_suites_base_manifests_run_with_every_pod_ready_and_every_endpoint_slice_address_answering()
-> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::Api;
    use kube::api::{ListParams, PostParams};

    let cluster = LocalCluster::start_with_workloads()?;
    let _agent = cluster.start_pod_agent()?;
    cluster.install_gateway_api()?;
    // The suite's own base manifests, with the GatewayClass name it would fill in.
    let module = run_script(&["gateway-api-conformance"])?;
    let manifests =
        std::fs::read_to_string(std::path::Path::new(module.trim()).join("base/manifests.yaml"))?
            .replace("{GATEWAY_CLASS_NAME}", "holdfast-smoke");
    let file = cluster.dir().join("base-manifests.yaml");
    std::fs::write(&file, &manifests)?;
    cluster.kubectl_run(&["apply", "--server-side", "-f", &file.to_string_lossy()])?;

    let client = cluster.client().await?;
    let namespaces = [
        "gateway-conformance-infra",
        "gateway-conformance-app-backend",
        "gateway-conformance-web-backend",
    ];
    let secrets = mounted_secrets(&client, &namespaces).await?;
    assert!(!secrets.is_empty(), "the base manifests mount Secrets");

    // Before the Secrets exist, a pod that mounts one waits for it and says why.
    let (ns, secret) = &secrets[0];
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait::until(
        &format!("a pod mounting {ns}/{secret} to wait for it"),
        wait::T,
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok(list.items.iter().find_map(|p| {
                let mounts = p.spec.as_ref()?.volumes.as_ref()?.iter().any(|v| {
                    v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret)
                });
                let waiting = pod_condition(p, "Ready").is_some_and(|c| {
                    c.status == "False" && c.reason.as_deref() == Some("VolumeNotReady")
                });
                (mounts && waiting).then_some(())
            }))
        },
    )
    .await?;

    // The Secrets, as the suite makes them: a certificate for each, from a CA the probes
    // trust.
    let ca = holdfast_tests::tls::TestCa::new("smoke");
    let issued = ca.server(&[SMOKE_TLS_NAME]);
    for (ns, name) in &secrets {
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "type": "kubernetes.io/tls",
            "stringData": { "tls.crt": issued.cert_pem, "tls.key": issued.key_pem },
        }))?;
        api.create(&PostParams::default(), &secret).await?;
    }

    // Every pod of every namespace the manifests make is Ready (the agent runs each one).
    let mut pod_ips = std::collections::BTreeSet::new();
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let ready = wait::until(
            &format!("every pod in {ns} Ready"),
            Duration::from_secs(180),
            || async {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let live: Vec<&Pod> = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .collect();
                let not_ready: Vec<String> = live
                    .iter()
                    .filter(|p| !pod_ready(p))
                    .map(|p| {
                        let why = pod_condition(p, "Ready").and_then(|c| c.message.clone());
                        format!(
                            "{} ({why:?})",
                            p.metadata.name.as_deref().unwrap_or_default()
                        )
                    })
                    .collect();
                if live.is_empty() || !not_ready.is_empty() {
                    return Err(format!("not ready: {not_ready:?}"));
                }
                Ok(Some(list.items))
            },
        )
        .await?;
        pod_ips.extend(
            ready
                .iter()
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone()),
        );
    }

    // Every address in every EndpointSlice Kubernetes made answers on every port.
    let tls = holdfast_tests::tls::client_config(&ca.cert_pem, &[]);
    let mut answers = Vec::new();
    let mut sliced = std::collections::BTreeSet::new();
    for ns in namespaces {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let slices = wait::until(
            &format!("every endpoint in {ns} ready"),
            wait::T,
            || async {
                let list = api
                    .list(&ListParams::default().labels(
                        "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io",
                    ))
                    .await
                    .map_err(|e| e.to_string())?;
                let all_ready = list.items.iter().all(|s| {
                    !s.endpoints.is_empty()
                        && s.endpoints
                            .iter()
                            .all(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                });
                Ok((!list.items.is_empty() && all_ready).then_some(list.items))
            },
        )
        .await?;
        for slice in &slices {
            for port in slice.ports.iter().flatten() {
                let number = port
                    .port
                    .context("an EndpointSlice port without a number")?;
                let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".into());
                for endpoint in &slice.endpoints {
                    for address in &endpoint.addresses {
                        sliced.insert(address.clone());
                        let addr = SocketAddr::new(address.parse()?, u16::try_from(number)?);
                        let answer = probe(addr, &protocol, port.app_protocol.as_deref(), &tls)
                            .await
                            .map_err(|e| anyhow::anyhow!("{ns} {addr} {protocol}: {e}"))?;
                        answers.push((addr, answer));
                    }
                }
            }
        }
    }
    assert_eq!(sliced, pod_ips, "every pod is behind a Service");
    // The Secret volumes reached the programs: each backend on 8443 serves the certificate
    // the test put in its Secret.
    let tls_ports: Vec<_> = answers.iter().filter(|(a, _)| a.port() == 8443).collect();
    assert!(!tls_ports.is_empty(), "{answers:?}");
    assert!(
        tls_ports.iter().all(|(_, a)| *a == Answer::Tls),
        "{answers:?}"
    );
    for kind in [Answer::Http, Answer::H2c, Answer::Dns] {
        assert!(
            answers.iter().any(|(_, a)| *a == kind),
            "no {kind:?}: {answers:?}"
        );
    }
    Ok(())
}

/// The `caches` entry of `kind` in a GetStatus answer.
fn cache_of(status: &serde_json::Value, kind: &str) -> Option<serde_json::Value> {
    status["caches"]
        .as_array()?
        .iter()
        .find(|c| c["kind"] == kind)
        .cloned()
}

const GATEWAY_KINDS: [&str; 6] = [
    "GatewayClass",
    "Gateway",
    "HTTPRoute",
    "GRPCRoute",
    "TLSRoute",
    "ReferenceGrant",
];

#[tokio::test]
async fn gateway_api_kinds_are_empty_only_when_discovery_says_they_do_not_exist_and_are_watched_once_installed_and_our_class_is_accepted()
-> anyhow::Result<()> {
    use holdfast_tests::control_plane::ControlPlane;
    use holdfast_tests::grpcurl::call;
    use holdfast_tests::objects;
    use holdfast_tests::subscriber::{Subscriber, routes};

    // A cluster of its own (its discovery binding is removed for a while), with the
    // control plane running as the deploy ServiceAccount, under the deploy RBAC.
    let cluster = LocalCluster::start()?;
    cluster.kubectl_run(&["create", "namespace", "holdfast-system"])?;
    let rbac = holdfast_tests::repo_root().join("deploy/kubernetes/rbac.yaml");
    cluster.kubectl_run(&[
        "apply",
        "-n",
        "holdfast-system",
        "-f",
        &rbac.to_string_lossy(),
    ])?;
    let kubeconfig =
        cluster.service_account_kubeconfig("holdfast-system", "holdfast-control-plane")?;
    let sa = holdfast_tests::cluster::client_from_kubeconfig(&kubeconfig).await?;

    // API discovery cannot answer for this identity: every authenticated user's right to
    // read /apis is the system:discovery binding, removed here (it is made only when
    // kube-apiserver starts).
    cluster.kubectl_run(&["delete", "clusterrolebinding", "system:discovery"])?;
    let refused = sa
        .list_api_group_resources("gateway.networking.k8s.io/v1")
        .await
        .expect_err("discovery is refused");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused}"
    );

    let admin = cluster.client().await?;
    let ns = cluster.namespace(&admin, "gwdisc").await?;
    objects::create_class(&admin, "holdfast").await?;
    let host = format!("web.{ns}.test");
    objects::create_web(&admin, &ns, &["10.200.0.10"], "a", "holdfast", &host).await?;

    let logs = holdfast_tests::e2e_logs(&ns)?;
    let cp = ControlPlane::start(
        "control-plane-gateway-discovery",
        &kubeconfig,
        &logs,
        &[
            "--ingress-class",
            "holdfast",
            "--lease-namespace",
            "holdfast-system",
            "--debounce",
            "50ms",
            "--gateway-api-rediscover-interval",
            "1s",
        ],
    )?;
    let mut sub = Subscriber::connect(&cp.grpc_url(), "gw-proxy", None).await?;

    // Could not find out: the Ingress kinds are complete, the Gateway API kinds are not
    // (discovery was refused), so nothing is served.
    let status = wait::until(
        "Ingress complete and HTTPRoute discovery refused",
        wait::T,
        || async {
            let status =
                call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
            let ingress = cache_of(&status, "Ingress").ok_or("no Ingress cache")?;
            let route = cache_of(&status, "HTTPRoute").ok_or("no HTTPRoute cache")?;
            let refused = route["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("403"));
            Ok((ingress["synced"] == true && refused).then_some(status))
        },
    )
    .await?;
    for kind in GATEWAY_KINDS {
        let c = cache_of(&status, kind).expect("every Gateway API kind is reported");
        assert_ne!(c["synced"], true, "{kind} counted as complete: {c}");
        assert!(c["absent"].as_str().unwrap_or_default().is_empty(), "{c}");
    }
    assert_ne!(status["ready"], true, "{status}");
    assert!(
        sub.next(Duration::from_secs(2)).await?.is_none(),
        "a snapshot was served while a kind was unknown"
    );

    // Discovery answers that the group does not exist: the kinds are empty and complete,
    // and the Ingress is served.
    cluster.kubectl_run(&[
        "create",
        "clusterrolebinding",
        "system:discovery",
        "--clusterrole=system:discovery",
        "--group=system:authenticated",
    ])?;
    sub.wait_for("the Ingress route", wait::T, |s| {
        routes(s).iter().any(|r| r.0 == host)
    })
    .await?;
    let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    for kind in GATEWAY_KINDS {
        let absent = cp
            .metric_value(&format!("holdfast_cache_absent{{kind=\"{kind}\"}}"))
            .await?;
        assert_eq!(absent, 1.0, "{kind}");
        let c = cache_of(&status, kind).expect("every Gateway API kind is reported");
        assert_eq!(c["synced"], true, "{c}");
        assert!(
            c["absent"]
                .as_str()
                .is_some_and(|a| a.contains("not installed")),
            "{c}"
        );
    }

    // The CRDs are installed: the kinds are picked up without a restart, and an
    // HTTPRoute moves that kind's progress in the next snapshot.
    cluster.install_gateway_api()?;
    wait::until("every Gateway API kind watched", wait::T, || async {
        let status =
            call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        let watched = GATEWAY_KINDS.iter().all(|kind| {
            cache_of(&status, kind).is_some_and(|c| {
                c["synced"] == true && c["absent"].as_str().unwrap_or_default().is_empty()
            })
        });
        Ok(watched.then_some(()))
    })
    .await?;
    cluster.kubectl_run(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/httproutes.gateway.networking.k8s.io",
        "crd/grpcroutes.gateway.networking.k8s.io",
        "crd/tlsroutes.gateway.networking.k8s.io",
        "crd/gatewayclasses.gateway.networking.k8s.io",
    ])?;
    for kind in GATEWAY_KINDS {
        let absent = cp
            .metric_value(&format!("holdfast_cache_absent{{kind=\"{kind}\"}}"))
            .await?;
        assert_eq!(absent, 0.0, "{kind} is watched");
    }
    assert_eq!(
        cp.metric_value("holdfast_cache_absent{kind=\"Ingress\"}")
            .await?,
        0.0,
        "a kind that always exists has the series too"
    );

    // The leader accepts our GatewayClass, at each generation, and leaves another
    // controller's alone.
    let classes = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
            {{"apiVersion":"gateway.networking.k8s.io/v1","kind":"GatewayClass",
              "metadata":{{"name":"{ns}-ours"}},"spec":{{"controllerName":"holdfast.dev/gateway-controller"}}}},
            {{"apiVersion":"gateway.networking.k8s.io/v1","kind":"GatewayClass",
              "metadata":{{"name":"{ns}-theirs"}},"spec":{{"controllerName":"example.com/other"}}}}]}}"#
    );
    let file = cluster.dir().join("classes.json");
    std::fs::write(&file, classes)?;
    cluster.kubectl_run(&["create", "-f", &file.to_string_lossy()])?;
    let accepted_at = |generation: i64| {
        let (cluster, name) = (&cluster, format!("{ns}-ours"));
        async move {
            wait::until(
                &format!("{name} Accepted at generation {generation}"),
                wait::T,
                || async {
                    let out = cluster
                        .kubectl_run(&["get", "gatewayclass", &name, "-o", "json"])
                        .map_err(|e| e.to_string())?;
                    let class: serde_json::Value =
                        serde_json::from_str(&out).map_err(|e| e.to_string())?;
                    let accepted = class["status"]["conditions"]
                        .as_array()
                        .and_then(|c| c.iter().find(|c| c["type"] == "Accepted"))
                        .cloned()
                        .unwrap_or_default();
                    let done = class["metadata"]["generation"] == generation
                        && accepted["status"] == "True"
                        && accepted["reason"] == "Accepted"
                        && accepted["observedGeneration"] == generation;
                    Ok(done.then_some(class))
                },
            )
            .await
        }
    };
    let class = accepted_at(1).await?;
    // Exactly the features served are claimed: the leader writes the control plane's
    // list (each feature in it is proven by the conformance suite's tests for it).
    let claimed: Vec<serde_json::Value> = holdfast_control_plane::gateway_api::SUPPORTED_FEATURES
        .iter()
        .map(|f| serde_json::json!({ "name": f }))
        .collect();
    assert_eq!(
        class["status"]["supportedFeatures"],
        serde_json::Value::Array(claimed),
        "exactly the features served are claimed: {class}"
    );
    cluster.kubectl_run(&[
        "patch",
        "gatewayclass",
        &format!("{ns}-ours"),
        "--type=merge",
        "-p",
        r#"{"spec":{"description":"bumped"}}"#,
    ])?;
    accepted_at(2).await?;
    // Another controller's class keeps exactly the status the API server defaulted.
    let theirs = get_json(&cluster, &["gatewayclass", &format!("{ns}-theirs")])
        .map_err(anyhow::Error::msg)?;
    let conditions = theirs["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !conditions.is_empty()
            && conditions
                .iter()
                .all(|c| c["status"] == "Unknown" && c["reason"] == "Pending"),
        "another controller's class was written: {theirs}"
    );
    assert!(
        theirs["status"].get("supportedFeatures").is_none(),
        "{theirs}"
    );
    let route = format!(
        r#"{{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute",
            "metadata":{{"name":"r","namespace":"{ns}"}},
            "spec":{{"parentRefs":[{{"name":"gw"}}],"rules":[{{"backendRefs":[{{"name":"web","port":80}}]}}]}}}}"#
    );
    let file = cluster.dir().join("route.json");
    std::fs::write(&file, route)?;
    let created = cluster.kubectl_run(&[
        "create",
        "-f",
        &file.to_string_lossy(),
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ])?;
    let created: u64 = created.trim().parse()?;
    // The published snapshot's progress for the kind passes the route (GetSnapshot: the
    // same content seen further is published again with the newer progress).
    let snapshot = wait::until("HTTPRoute progress past the route", wait::T, || async {
        let snapshot =
            call(cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}").map_err(|e| e.to_string())?;
        let at = snapshot["progress"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["kind"] == "HTTPRoute"))
            .and_then(|p| p["resourceVersion"].as_str()?.parse::<u64>().ok());
        Ok(at.is_some_and(|at| at >= created).then_some(snapshot))
    })
    .await?;
    let hosts: Vec<&str> = holdfast_tests::grpcurl::ingress_hosts(&snapshot, "gatewayHosts")
        .into_iter()
        .filter_map(|v| v["host"].as_str())
        .collect();
    assert!(
        hosts.contains(&host.as_str()),
        "the Ingress route stays: {hosts:?}"
    );

    // The HTTPRoute CRD is deleted: its watch is answered 404, discovery (and /apis) say
    // it does not exist, and the kind is empty and complete again.
    cluster.kubectl_run(&["delete", "crd", "httproutes.gateway.networking.k8s.io"])?;
    wait::until("HTTPRoute absent again", wait::T, || async {
        let status =
            call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        let c = cache_of(&status, "HTTPRoute").ok_or("no HTTPRoute cache")?;
        let absent = c["absent"]
            .as_str()
            .is_some_and(|a| a.contains("not installed"));
        Ok((absent && c["synced"] == true).then_some(()))
    })
    .await?;
    drop(sub);
    Ok(())
}

/// `kubectl create` of `objects` (a JSON array), through a file in the cluster's directory.
pub(crate) fn create_all(
    cluster: &LocalCluster,
    name: &str,
    objects: serde_json::Value,
) -> anyhow::Result<()> {
    let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": objects });
    let file = cluster.dir().join(format!("{name}.json"));
    std::fs::write(&file, list.to_string())?;
    cluster.kubectl_run(&["create", "-f", &file.to_string_lossy()])?;
    Ok(())
}

/// An object as `kubectl get -o json` prints it.
pub(crate) fn get_json(cluster: &LocalCluster, args: &[&str]) -> Result<serde_json::Value, String> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    let out = cluster.kubectl_run(&all).map_err(|e| e.to_string())?;
    serde_json::from_str(&out).map_err(|e| e.to_string())
}

/// The condition `kind` in `conditions`, if present.
pub(crate) fn find_condition(conditions: &serde_json::Value, kind: &str) -> serde_json::Value {
    conditions
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn our_gateways_get_addresses_and_listener_conditions_and_routes_get_their_parents_status()
-> anyhow::Result<()> {
    use holdfast_tests::control_plane::ControlPlane;
    use serde_json::json;

    let cluster = LocalCluster::start()?;
    cluster.install_gateway_api()?;
    let admin = cluster.client().await?;
    let ns = cluster.namespace(&admin, "gwstatus").await?;
    let apps = cluster.namespace(&admin, "gwapps").await?;
    let group = "gateway.networking.k8s.io";
    let class = format!("{ns}-class");
    create_all(
        &cluster,
        "gateways",
        json!([
            { "apiVersion": format!("{group}/v1"), "kind": "GatewayClass",
              "metadata": { "name": class }, "spec": { "controllerName": "holdfast.dev/gateway-controller" } },
            { "apiVersion": "v1", "kind": "Service", "metadata": { "name": "web", "namespace": ns },
              "spec": { "ports": [{ "port": 8080 }] } },
            { "apiVersion": format!("{group}/v1"), "kind": "Gateway",
              "metadata": { "name": "gw", "namespace": ns },
              "spec": { "gatewayClassName": class, "listeners": [
                  { "name": "http", "port": 80, "protocol": "HTTP" },
                  { "name": "https", "port": 443, "protocol": "HTTPS", "hostname": "secure.example.com",
                    "tls": { "certificateRefs": [{ "name": "secure-cert" }] } }
              ] } },
            { "apiVersion": format!("{group}/v1"), "kind": "Gateway",
              "metadata": { "name": "gw2", "namespace": ns },
              "spec": { "gatewayClassName": class, "listeners": [
                  { "name": "http", "port": 80, "protocol": "HTTP" } ] } },
            { "apiVersion": format!("{group}/v1"), "kind": "HTTPRoute",
              "metadata": { "name": "ok", "namespace": ns },
              "spec": { "parentRefs": [{ "name": "gw" }],
                        "rules": [{ "backendRefs": [{ "name": "web", "port": 8080 }] }] } },
            { "apiVersion": format!("{group}/v1"), "kind": "HTTPRoute",
              "metadata": { "name": "nobackend", "namespace": ns },
              "spec": { "parentRefs": [{ "name": "gw", "sectionName": "http" }],
                        "rules": [{ "backendRefs": [{ "name": "nosuch", "port": 8080 }] }] } },
            { "apiVersion": format!("{group}/v1"), "kind": "HTTPRoute",
              "metadata": { "name": "elsewhere", "namespace": apps },
              "spec": { "parentRefs": [{ "name": "gw", "namespace": ns }] } }
        ]),
    )?;

    let logs = holdfast_tests::e2e_logs(&ns)?;
    let cp = ControlPlane::start(
        "control-plane-gateway-status",
        &cluster.kubeconfig(),
        &logs,
        &[
            "--ingress-class",
            "holdfast",
            "--debounce",
            "50ms",
            "--gateway-address-pool",
            "127.77.0.0/16",
        ],
    )?;

    // The Gateway: an address from the pool, Accepted with one listener not valid (its
    // Secret is missing), not Programmed (no proxy serves Gateway API listeners yet),
    // two routes attached to its HTTP listener.
    let gw = wait::until("the Gateway's status", wait::T, || async {
        let gw = get_json(&cluster, &["gateway", "-n", &ns, "gw"])?;
        let listeners = gw["status"]["listeners"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let done = listeners.len() == 2 && listeners[0]["attachedRoutes"] == 2;
        Ok(done.then_some(gw))
    })
    .await?;
    let status = &gw["status"];
    let address = status["addresses"][0]["value"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(address.starts_with("127.77."), "{status}");
    assert_eq!(status["addresses"][0]["type"], "IPAddress");
    let accepted = find_condition(&status["conditions"], "Accepted");
    assert_eq!(
        (accepted["status"].as_str(), accepted["reason"].as_str()),
        (Some("True"), Some("ListenersNotValid")),
        "{status}"
    );
    assert_eq!(accepted["observedGeneration"], 1);
    let programmed = find_condition(&status["conditions"], "Programmed");
    assert_eq!(programmed["status"], "False", "{status}");
    let https = &status["listeners"][1];
    assert_eq!(
        find_condition(&https["conditions"], "ResolvedRefs")["reason"],
        "InvalidCertificateRef",
        "{https}"
    );
    assert_eq!(
        status["listeners"][0]["supportedKinds"][0]["kind"],
        "HTTPRoute"
    );
    let gw2 = wait::until("the second Gateway's address", wait::T, || async {
        let gw2 = get_json(&cluster, &["gateway", "-n", &ns, "gw2"])?;
        Ok(gw2["status"]["addresses"][0]["value"]
            .as_str()
            .map(str::to_owned))
    })
    .await?;
    assert_ne!(gw2, address, "each Gateway has its own address");

    // The routes: attached and resolved; attached with a missing backend; refused by the
    // listeners' allowedRoutes (another namespace, `from: Same`).
    let parent_conditions = |ns: String, name: &'static str| {
        let cluster = &cluster;
        async move {
            wait::until(&format!("status of route {name}"), wait::T, || async {
                let r = get_json(cluster, &["httproute", "-n", &ns, name])?;
                Ok(r["status"]["parents"]
                    .as_array()
                    .and_then(|p| {
                        p.iter()
                            .find(|p| p["controllerName"] == "holdfast.dev/gateway-controller")
                    })
                    .map(|p| p["conditions"].clone()))
            })
            .await
        }
    };
    let ok = parent_conditions(ns.clone(), "ok").await?;
    assert_eq!(find_condition(&ok, "Accepted")["status"], "True", "{ok}");
    assert_eq!(
        find_condition(&ok, "ResolvedRefs")["status"],
        "True",
        "{ok}"
    );
    let nobackend = parent_conditions(ns.clone(), "nobackend").await?;
    assert_eq!(find_condition(&nobackend, "Accepted")["status"], "True");
    assert_eq!(
        find_condition(&nobackend, "ResolvedRefs")["reason"],
        "BackendNotFound",
        "{nobackend}"
    );
    let elsewhere = parent_conditions(apps.clone(), "elsewhere").await?;
    assert_eq!(
        find_condition(&elsewhere, "Accepted")["reason"],
        "NotAllowedByListeners",
        "{elsewhere}"
    );
    // The leader counts its writes: the three routes' and the two Gateways' at least.
    for (kind, least) in [("HTTPRoute", 3.0), ("Gateway", 2.0), ("GatewayClass", 1.0)] {
        let series = format!("holdfast_status_writes_total{{kind=\"{kind}\",result=\"ok\"}}");
        let n = cp.metric_value(&series).await?;
        assert!(n >= least, "{series} = {n}");
    }

    // The listener's Secret appears: its references resolve and the Gateway is accepted
    // whole, at the same address.
    let ca = holdfast_tests::tls::TestCa::new("gw");
    let cert = ca.server(&["secure.example.com"]);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": { "name": "secure-cert" },
        "type": "kubernetes.io/tls",
        "stringData": { "tls.crt": cert.cert_pem, "tls.key": cert.key_pem },
    }))?;
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), &ns)
        .create(&Default::default(), &secret)
        .await?;
    let gw = wait::until("the Gateway accepted whole", wait::T, || async {
        let gw = get_json(&cluster, &["gateway", "-n", &ns, "gw"])?;
        let accepted = find_condition(&gw["status"]["conditions"], "Accepted");
        Ok((accepted["reason"] == "Accepted").then_some(gw))
    })
    .await?;
    let https = &gw["status"]["listeners"][1];
    assert_eq!(
        find_condition(&https["conditions"], "ResolvedRefs")["status"],
        "True",
        "{https}"
    );
    assert_eq!(
        gw["status"]["addresses"][0]["value"],
        address.as_str(),
        "the address is kept"
    );
    Ok(())
}

/// A Gateway and an HTTPRoute on the real stack: the proxy binds the Gateway's address
/// (from the pool) and listener port, and serves the route's rules there (path and header
/// matches, a redirect, a rule whose backend does not exist answering 500) and nothing
/// else; the Ingress hosts are not reachable on the Gateway's address and the route's
/// hostname is not reachable on the proxy's own listener. When the Gateway goes, its
/// listener is closed, another Gateway's listener is left alone (its open connection
/// included), and the Ingress routes are still served.
#[tokio::test]
async fn a_gateways_listener_is_bound_by_the_proxy_and_serves_its_routes_and_nothing_else()
-> anyhow::Result<()> {
    use holdfast_tests::http as web;
    use serde_json::json;

    // Removing the Gateway removes most routes: let it through.
    let s = gateway_scenario("gwserve", 2, "127.78.0.0/16", &["--max-removal-share", "1"]).await?;
    let ns = &s.ns;
    let group = "gateway.networking.k8s.io";
    let class = format!("{ns}-gw");
    create_all(
        &s.cluster,
        "gateway",
        class_and_gateway(
            ns,
            json!([
                { "apiVersion": format!("{group}/v1"), "kind": "HTTPRoute",
                  "metadata": { "name": "web", "namespace": ns },
                  "spec": {
                      "parentRefs": [{ "name": "gw" }],
                      "hostnames": ["gw.test"],
                      "rules": [
                          { "matches": [{ "path": { "type": "PathPrefix", "value": "/a" } }],
                            "backendRefs": [{ "name": "app0", "port": 80 }] },
                          { "matches": [{ "path": { "type": "PathPrefix", "value": "/a" },
                                          "headers": [{ "name": "X-Version", "value": "two" }] }],
                            "filters": [{ "type": "RequestHeaderModifier",
                                          "requestHeaderModifier": { "set": [{ "name": "X-Added", "value": "yes" }] } }],
                            "backendRefs": [{ "name": "app1", "port": 80 }] },
                          { "matches": [{ "path": { "type": "Exact", "value": "/old" } }],
                            "filters": [{ "type": "RequestRedirect",
                                          "requestRedirect": { "hostname": "new.test", "statusCode": 301 } }] },
                          { "matches": [{ "path": { "type": "PathPrefix", "value": "/missing" } }],
                            "backendRefs": [{ "name": "nosuch", "port": 80 }] }
                      ] } },
                // A second Gateway, whose listener must not be touched when the first goes.
                { "apiVersion": format!("{group}/v1"), "kind": "Gateway",
                  "metadata": { "name": "other", "namespace": ns },
                  "spec": { "gatewayClassName": class, "listeners": [
                      { "name": "http", "port": 80, "protocol": "HTTP" } ] } },
                { "apiVersion": format!("{group}/v1"), "kind": "HTTPRoute",
                  "metadata": { "name": "other", "namespace": ns },
                  "spec": { "parentRefs": [{ "name": "other" }], "hostnames": ["other.test"],
                            "rules": [{ "backendRefs": [{ "name": "app1", "port": 80 }] }] } }
            ]),
        ),
    )?;
    let address = gateway_address(&s.cluster, ns, "gw").await?;
    assert!(address.starts_with("127.78."), "{address}");
    let gateway: std::net::SocketAddr = format!("{address}:80").parse()?;

    // Served once the snapshot with the route is applied (the listener is bound before
    // the proxy ACKs it).
    let (status, headers, _) = wait::until("the route served on the Gateway", wait::T, || async {
        Ok(web::get_full(gateway, "gw.test", "/a/x")
            .await
            .ok()
            .filter(|(status, _, _)| *status == 200))
    })
    .await?;
    assert_eq!(status, 200);
    assert_eq!(headers["x-echo-path"], "/a/x");

    // A header match takes the request to the other Service, with the header set.
    let (status, headers, _) =
        web::get_with(gateway, "gw.test", "/a/x", &[("x-version", "two")]).await?;
    assert_eq!(status, 200);
    assert!(
        headers["x-echo-headers"]
            .to_str()?
            .split(',')
            .any(|h| h.trim() == "x-added"),
        "{headers:?}"
    );
    // A redirect, and a rule whose only backend does not exist.
    let (status, headers, _) = web::get_full(gateway, "gw.test", "/old").await?;
    assert_eq!(status, 301);
    assert_eq!(headers["location"], "http://new.test/old");
    let (status, _) = web::get(gateway, "gw.test", "/missing").await?;
    assert_eq!(status, 500);
    // Isolation: no rule for another path or hostname, no Ingress host on the Gateway's
    // address, no Gateway hostname on the proxy's own listener.
    assert_eq!(web::get(gateway, "gw.test", "/b").await?.0, 404);
    assert_eq!(web::get(gateway, &s.host(0), "/").await?.0, 404);
    let proxy = s.proxies[0].addr;
    assert_eq!(web::get(proxy, "gw.test", "/a/x").await?.0, 404);
    assert_eq!(web::get(proxy, &s.host(0), "/").await?.0, 200);
    let other_address = gateway_address(&s.cluster, ns, "other").await?;
    assert_ne!(other_address, address);
    let other: std::net::SocketAddr = format!("{other_address}:80").parse()?;
    wait::until("the other Gateway served", wait::T, || async {
        Ok(matches!(web::get(other, "other.test", "/").await, Ok((200, _))).then_some(()))
    })
    .await?;
    // Isolation between Gateways: neither serves the other's hostname.
    assert_eq!(web::get(other, "gw.test", "/a/x").await?.0, 404);
    assert_eq!(web::get(gateway, "other.test", "/").await?.0, 404);
    // A connection to the other Gateway, kept open across the first one's removal.
    let kept = tokio::net::TcpStream::connect(other).await?;
    let metrics = web::get(s.proxies[0].admin, "admin", "/metrics").await?.1;
    assert_eq!(
        web::metric_value(&metrics, "holdfast_proxy_gateway_listeners")?,
        2.0
    );
    // A proxy serves the Gateway's generation: Programmed, on the Gateway and its
    // listener.
    let gw = wait::until("the Gateway programmed", wait::T, || async {
        let gw = get_json(&s.cluster, &["gateway", "-n", ns, "gw"])?;
        let programmed = find_condition(&gw["status"]["conditions"], "Programmed");
        Ok((programmed["status"] == "True").then_some(gw))
    })
    .await?;
    let programmed = find_condition(&gw["status"]["conditions"], "Programmed");
    assert_eq!(programmed["reason"], "Programmed");
    assert_eq!(
        programmed["observedGeneration"],
        gw["metadata"]["generation"]
    );
    let listener = find_condition(&gw["status"]["listeners"][0]["conditions"], "Programmed");
    assert_eq!(listener["status"], "True", "{gw}");

    // A listener added beside the first is bound; the first, unchanged, is left alone (a
    // connection opened before is still served); then the new one moves to another port:
    // bound there, closed on the old one.
    let on_80 = tokio::net::TcpStream::connect(gateway).await?;
    let patch_listeners = |second_port: u16| {
        let body = json!({ "spec": { "listeners": [
            { "name": "http", "port": 80, "protocol": "HTTP" },
            { "name": "second", "port": second_port, "protocol": "HTTP" } ] } });
        patch_gateway(&s.cluster, ns, "gw", &body)
    };
    let served_on = |port: u16| {
        let to: std::net::SocketAddr = format!("{address}:{port}").parse().expect("address");
        async move { matches!(web::get(to, "gw.test", "/a/x").await, Ok((200, _))) }
    };
    patch_listeners(8080)?;
    wait::until("the added listener served", wait::T, || async {
        Ok(served_on(8080).await.then_some(()))
    })
    .await?;
    let moved_from: std::net::SocketAddr = format!("{address}:8080").parse()?;
    patch_listeners(8081)?;
    wait::until(
        "the moved listener served on its new port",
        wait::T,
        || async { Ok(served_on(8081).await.then_some(())) },
    )
    .await?;
    refused(moved_from).await?;
    assert_eq!(
        get_on(on_80, "gw.test", "/a/x").await?,
        200,
        "the unchanged listener's open connection"
    );
    let metrics = web::get(s.proxies[0].admin, "admin", "/metrics").await?.1;
    assert_eq!(
        web::metric_value(&metrics, "holdfast_proxy_gateway_listeners")?,
        3.0,
        "gw's two listeners and the other Gateway's"
    );

    // The Gateway goes: its listeners are closed; the Ingress routes stay.
    s.cluster
        .kubectl_run(&["delete", "gateway", "-n", ns, "gw"])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    refused(gateway).await?;
    refused(format!("{address}:8081").parse()?).await?;
    assert_eq!(web::get(proxy, &s.host(0), "/").await?.0, 200);
    // The other Gateway's listener was left alone: new connections, and the one opened
    // before, are served.
    assert_eq!(web::get(other, "other.test", "/").await?.0, 200);
    assert_eq!(get_on(kept, "other.test", "/").await?, 200);
    let metrics = web::get(s.proxies[0].admin, "admin", "/metrics").await?.1;
    assert_eq!(
        web::metric_value(&metrics, "holdfast_proxy_gateway_listeners")?,
        1.0
    );
    Ok(())
}

/// A live listener changed from HTTP to HTTPS on the same port (same name) is rebound
/// with TLS, serving its route with the certificate from its Secret and no longer plain
/// HTTP; changed back, it serves plain HTTP again and no longer TLS. Throughout, the port
/// has one listening socket per proxy worker: the old ones are closed.
#[tokio::test]
async fn a_live_listener_flipped_between_http_and_https_on_its_port_serves_the_new_protocol_only()
-> anyhow::Result<()> {
    use holdfast_tests::http as web;
    use holdfast_tests::tls::{TestCa, client_config, https_get};
    use serde_json::json;

    let s = gateway_scenario("gwflip", 1, "127.76.0.0/16", &[]).await?;
    let ns = &s.ns;
    let ca = TestCa::new("gwflip-ca");
    let issued = ca.server(&["flip.test"]);
    create_all(
        &s.cluster,
        "gateway",
        class_and_gateway(
            ns,
            json!([
                { "apiVersion": "v1", "kind": "Secret",
                  "metadata": { "name": "flip-cert", "namespace": ns },
                  "type": "kubernetes.io/tls",
                  "stringData": { "tls.crt": issued.cert_pem, "tls.key": issued.key_pem } },
                { "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                  "metadata": { "name": "web", "namespace": ns },
                  "spec": { "parentRefs": [{ "name": "gw" }], "hostnames": ["flip.test"],
                            "rules": [{ "backendRefs": [{ "name": "app0", "port": 80 }] }] } }
            ]),
        ),
    )?;
    let address = gateway_address(&s.cluster, ns, "gw").await?;
    let gateway: SocketAddr = format!("{address}:80").parse()?;
    let config = client_config(&ca.cert_pem, &[]);
    let plain_served =
        || async { matches!(web::get(gateway, "flip.test", "/").await, Ok((200, _))) };
    let tls_served = || {
        let config = config.clone();
        async move {
            https_get(gateway, config, "flip.test", "/")
                .await
                .ok()
                .filter(|seen| seen.status == 200)
        }
    };
    wait::until("the route served over HTTP", wait::T, || async {
        Ok(plain_served().await.then_some(()))
    })
    .await?;
    assert!(tls_served().await.is_none(), "an HTTP listener answers TLS");

    let set_listener = |listener: serde_json::Value| {
        let body = json!({ "spec": { "listeners": [listener] } });
        patch_gateway(&s.cluster, ns, "gw", &body)
    };
    // The proxy binds a listener once per worker (its default: one per CPU, as here): the
    // port has exactly that many listening sockets, so an old one left open would show.
    let workers = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    assert_eq!(
        listening_sockets(gateway)?,
        workers,
        "bound on every worker"
    );
    // None of `n` fresh connections is answered in plain HTTP (the workers' sockets
    // share the port, so one left over would take some of them).
    let none_plain = |n: usize| async move {
        for _ in 0..n {
            if plain_served().await {
                return false;
            }
        }
        true
    };
    set_listener(
        json!({ "name": "http", "port": 80, "protocol": "HTTPS", "hostname": "flip.test",
                         "tls": { "certificateRefs": [{ "name": "flip-cert" }] } }),
    )?;
    let seen = wait::until(
        "the route served over TLS on the same port",
        wait::T,
        || async { Ok(tls_served().await) },
    )
    .await?;
    assert_eq!(
        seen.serial,
        issued.serial(),
        "the certificate from the Secret"
    );
    assert_eq!(seen.headers["x-echo-path"], "/");
    // The new sockets are bound before the old ones finish closing (they drain): wait
    // for exactly one per worker again.
    let closed = || async {
        wait::until("the old listening sockets closed", wait::T, || async {
            let n = listening_sockets(gateway).map_err(|e| e.to_string())?;
            Ok((n == workers).then_some(()))
        })
        .await
    };
    closed().await?;
    assert!(
        none_plain(8).await,
        "the HTTPS listener still answers plain HTTP"
    );

    set_listener(json!({ "name": "http", "port": 80, "protocol": "HTTP" }))?;
    wait::until("the route served over HTTP again", wait::T, || async {
        Ok(plain_served().await.then_some(()))
    })
    .await?;
    closed().await?;
    for _ in 0..8 {
        assert!(
            tls_served().await.is_none(),
            "the HTTP listener still answers TLS"
        );
    }
    Ok(())
}

/// How many TCP sockets listen on `addr` (IPv4) in this network namespace, from
/// `/proc/net/tcp` (local address as little-endian hex, state `0A`).
fn listening_sockets(addr: SocketAddr) -> anyhow::Result<usize> {
    let SocketAddr::V4(v4) = addr else {
        anyhow::bail!("{addr} is not IPv4")
    };
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    Ok(table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
        })
        .count())
}

/// A Gateway whose listener the proxy cannot bind (its address and port are taken) is not
/// Programmed, though the proxy applied and ACKed the snapshot with it: the proxy reports
/// the listener as unbound (ListProxies shows it), and the Gateway becomes Programmed once
/// a retry binds it and serves its route.
#[tokio::test]
async fn a_gateway_is_programmed_only_once_a_proxy_has_bound_its_listeners() -> anyhow::Result<()> {
    use holdfast_tests::grpcurl::call;
    use holdfast_tests::http as web;
    use serde_json::json;

    // One address in the pool, so the test knows it in advance and takes its port 80
    // first (a socket without SO_REUSEPORT: the proxy's bind fails).
    let address = "127.79.0.9";
    let taken = std::net::TcpListener::bind((address, 80))?;
    let s = gateway_scenario("gwbound", 1, &format!("{address}/32"), &[]).await?;
    let ns = &s.ns;
    create_all(
        &s.cluster,
        "gateway",
        class_and_gateway(
            ns,
            json!([
                { "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                  "metadata": { "name": "web", "namespace": ns },
                  "spec": { "parentRefs": [{ "name": "gw" }], "hostnames": ["gw.test"],
                            "rules": [{ "backendRefs": [{ "name": "app0", "port": 80 }] }] } }
            ]),
        ),
    )?;
    let listener = format!("{address}:80");
    // The proxy applied the snapshot with the listener and reports it unbound.
    let acked = wait::until("the unbound listener in ListProxies", wait::T, || async {
        let list =
            call(s.cp.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        let proxy = list["proxies"][0].clone();
        let unbound = proxy["unboundListeners"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(unbound.iter().any(|n| n == listener.as_str()).then(|| {
            proxy["ackedVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }))
    })
    .await?;
    let snapshot = call(s.cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(
        snapshot["version"],
        acked.as_str(),
        "the proxy serves the newest snapshot"
    );
    assert!(
        snapshot["gatewayListeners"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l["name"] == listener.as_str())),
        "{snapshot}"
    );
    // Two retries later (each 2 s; the leader recomputes Gateway status every second), the
    // Gateway has its address but is not Programmed.
    let metric = |body: &str| web::metric_value(body, "holdfast_proxy_gateway_bind_failures_total");
    let failures = wait::until("two more failed binds", wait::T, || async {
        let body = web::get(s.proxies[0].admin, "admin", "/metrics")
            .await
            .map_err(|e| e.to_string())?
            .1;
        Ok(metric(&body).ok().filter(|n| *n >= 3.0))
    })
    .await?;
    assert!(failures >= 3.0);
    // The leader writes the status on its own schedule (under the whole suite a CI run read
    // the CRD's "Waiting for controller" here), so its first write is awaited: Programmed
    // for the Gateway's generation. The port is still taken, so what it says cannot change.
    let gw = wait::until("the Gateway status written by us", wait::T, || async {
        let gw = get_json(&s.cluster, &["gateway", "-n", ns, "gw"])?;
        let programmed = find_condition(&gw["status"]["conditions"], "Programmed");
        let ours = programmed["observedGeneration"] == gw["metadata"]["generation"];
        Ok(ours.then_some(gw))
    })
    .await?;
    assert_eq!(gw["status"]["addresses"][0]["value"], address, "{gw}");
    let programmed = find_condition(&gw["status"]["conditions"], "Programmed");
    assert_eq!(programmed["status"], "False", "{gw}");
    assert_eq!(programmed["reason"], "Pending", "{gw}");

    // The port is freed: the proxy binds on its next retry, says so, and the Gateway is
    // Programmed and served.
    drop(taken);
    wait::until("the Gateway programmed", wait::T, || async {
        let gw = get_json(&s.cluster, &["gateway", "-n", ns, "gw"])?;
        let programmed = find_condition(&gw["status"]["conditions"], "Programmed");
        Ok((programmed["status"] == "True").then_some(()))
    })
    .await?;
    let list = call(s.cp.grpc, "holdfast.v1.Admin/ListProxies", "{}")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert!(
        list["proxies"][0]["unboundListeners"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{list}"
    );
    // Served. Programmed waits for the Gateway's generation on a proxy that bound its
    // listeners, not for the backend's endpoints; twice under the whole suite the first
    // answer right after Programmed was not a 200 (its status was not recorded then), so
    // the answer is awaited within the deadline and the last one is in the failure.
    let gateway: SocketAddr = listener.parse()?;
    wait::until("the bound listener serving the route", wait::T, || async {
        let (status, body) = web::get(gateway, "gw.test", "/")
            .await
            .map_err(|e| e.to_string())?;
        if status == 200 {
            Ok(Some(()))
        } else {
            Err(format!("{status}: {body}"))
        }
    })
    .await?;
    Ok(())
}

/// Waits for the first address in the status of Gateway `name` in `ns`.
pub(crate) async fn gateway_address(
    cluster: &LocalCluster,
    ns: &str,
    name: &str,
) -> anyhow::Result<String> {
    wait::until(&format!("Gateway {name}'s address"), wait::T, || async {
        let gw = get_json(cluster, &["gateway", "-n", ns, name])?;
        Ok(gw["status"]["addresses"][0]["value"]
            .as_str()
            .map(str::to_owned))
    })
    .await
}

/// A merge patch of Gateway `name` in `ns` with `body`.
fn patch_gateway(
    cluster: &LocalCluster,
    ns: &str,
    name: &str,
    body: &serde_json::Value,
) -> anyhow::Result<()> {
    cluster
        .kubectl_run(&[
            "patch",
            "gateway",
            "-n",
            ns,
            name,
            "--type=merge",
            "-p",
            &body.to_string(),
        ])
        .map(drop)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The status of a GET of `path` for `host` on a connection opened before.
async fn get_on(stream: tokio::net::TcpStream, host: &str, path: &str) -> anyhow::Result<u16> {
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let answer = sender
        .send_request(
            ::http::Request::get(path)
                .header("host", host)
                .body(http_body_util::Empty::<bytes::Bytes>::new())?,
        )
        .await?;
    Ok(answer.status().as_u16())
}

/// Waits until connections to `addr` are refused (its listener closed).
async fn refused(addr: SocketAddr) -> anyhow::Result<()> {
    wait::until(&format!("{addr} closed"), wait::T, || async {
        Ok(tokio::net::TcpStream::connect(addr)
            .await
            .is_err()
            .then_some(()))
    })
    .await
}

/// A scenario with `ingresses` Ingresses and one proxy, the Gateway API CRDs installed,
/// and a control plane that gives Gateways addresses from `pool` (and takes `more` flags).
pub(crate) async fn gateway_scenario(
    name: &str,
    ingresses: usize,
    pool: &str,
    more: &[&str],
) -> anyhow::Result<holdfast_tests::scenario::Scenario> {
    use holdfast_tests::scenario::{Options, Scenario};
    let mut cp_args = holdfast_tests::scenario::gateway_cp_args(pool);
    cp_args.extend(more.iter().map(|a| (*a).to_owned()));
    let s = Scenario::start(
        name,
        Options {
            ingresses,
            proxies: 1,
            cp_args,
            ..Options::default()
        },
    )
    .await?;
    s.cluster.install_gateway_api()?;
    Ok(s)
}

/// Our GatewayClass `<ns>-gw` and a Gateway `gw` of it in `ns` with one HTTP listener on
/// port 80, followed by `more` (a JSON array of objects).
pub(crate) fn class_and_gateway(ns: &str, more: serde_json::Value) -> serde_json::Value {
    let group = "gateway.networking.k8s.io";
    let class = format!("{ns}-gw");
    let mut all = vec![
        serde_json::json!({ "apiVersion": format!("{group}/v1"), "kind": "GatewayClass",
          "metadata": { "name": class }, "spec": { "controllerName": "holdfast.dev/gateway-controller" } }),
        serde_json::json!({ "apiVersion": format!("{group}/v1"), "kind": "Gateway",
          "metadata": { "name": "gw", "namespace": ns },
          "spec": { "gatewayClassName": class, "listeners": [
              { "name": "http", "port": 80, "protocol": "HTTP" } ] } }),
    ];
    all.extend(more.as_array().cloned().unwrap_or_default());
    serde_json::Value::Array(all)
}

/// `n` consecutive ports free on 127.0.0.1 now (each bound once, then released): the
/// container ports a test lets the control plane give Gateways.
fn free_port_block(n: u16) -> anyhow::Result<u16> {
    // Below the kernel's ephemeral range, so that no port-0 listener and no outgoing
    // connection of a test running beside this one can take a port of the block between
    // this check and the proxy's bind (that raced once: the Gateway never Programmed).
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    let ephemeral_low: u16 = range
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .context("the ephemeral port range's low end")?;
    let (low, high) = (10_000u16, ephemeral_low.saturating_sub(n));
    anyhow::ensure!(low < high, "no room below the ephemeral range {range:?}");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos()
        ^ std::process::id();
    let span = u32::from(high - low);
    for i in 0..50u32 {
        let offset = seed.wrapping_add(i.wrapping_mul(7_919)) % span;
        let first = low + u16::try_from(offset)?;
        let held: Vec<_> = (first..first + n)
            .map_while(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == usize::from(n) {
            return Ok(first);
        }
    }
    anyhow::bail!("no {n} consecutive free ports on 127.0.0.1 below {ephemeral_low}")
}

/// In a cluster (`--gateway-service-namespace`): a Gateway gets a Service in the proxies'
/// namespace, selecting the proxies, whose listener port maps to a container port of the
/// Gateway's own that the proxy binds (here on 127.0.0.1, where a Service's traffic would
/// arrive at the pod); the Gateway's address is the Service's cluster IP, it is
/// Programmed, a redirect keeps the port clients use (80, not the container port), the
/// leader puts back a Service someone deleted, at the same container port, and deletes
/// it with its Gateway.
#[tokio::test]
async fn in_a_cluster_each_gateway_gets_a_service_whose_port_maps_to_a_container_port_the_proxy_binds()
-> anyhow::Result<()> {
    use holdfast_tests::http as web;
    use holdfast_tests::scenario::{Options, Scenario};
    use serde_json::json;

    let first = free_port_block(10)?;
    let range = format!("{first}-{}", first + 9);
    // The Scenario's cluster is its own: the proxies' namespace is made once it runs
    // (until then the leader's Service writes fail, and are made again).
    let proxies_ns = "holdfast-gateways";
    let cp_args: Vec<String> = [
        "--gateway-api-rediscover-interval",
        "1s",
        "--gateway-service-namespace",
        proxies_ns,
        "--gateway-service-selector",
        "app.kubernetes.io/name=holdfast-proxy",
        "--gateway-service-type",
        "ClusterIP",
        "--gateway-bind-address",
        "127.0.0.1",
        "--gateway-port-range",
        &range,
        "--max-removal-share",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let s = Scenario::start(
        "gwsvc",
        Options {
            ingresses: 1,
            proxies: 1,
            cp_args,
            ..Options::default()
        },
    )
    .await?;
    s.cluster
        .kubectl_run(&["create", "namespace", proxies_ns])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // The proxies' own Service, which is no Gateway's.
    s.cluster
        .kubectl_run(&[
            "create",
            "service",
            "clusterip",
            "holdfast-proxy",
            "-n",
            proxies_ns,
            "--tcp=80:8080",
        ])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    s.cluster.install_gateway_api()?;
    let ns = &s.ns;
    let group = "gateway.networking.k8s.io";
    let class = format!("{ns}-gw");
    create_all(
        &s.cluster,
        "gateway",
        json!([
            { "apiVersion": format!("{group}/v1"), "kind": "GatewayClass",
              "metadata": { "name": class }, "spec": { "controllerName": "holdfast.dev/gateway-controller" } },
            { "apiVersion": format!("{group}/v1"), "kind": "Gateway",
              "metadata": { "name": "gw", "namespace": ns },
              "spec": { "gatewayClassName": class, "listeners": [
                  { "name": "http", "port": 80, "protocol": "HTTP" } ] } },
            { "apiVersion": format!("{group}/v1"), "kind": "HTTPRoute",
              "metadata": { "name": "web", "namespace": ns },
              "spec": {
                  "parentRefs": [{ "name": "gw" }],
                  "hostnames": ["gw.test"],
                  "rules": [
                      { "backendRefs": [{ "name": "app0", "port": 80 }] },
                      { "matches": [{ "path": { "type": "Exact", "value": "/old" } }],
                        "filters": [{ "type": "RequestRedirect",
                                      "requestRedirect": { "hostname": "new.test" } }] }
                  ] } }
        ]),
    )?;
    let name = holdfast_control_plane::gateway_api::services::service_name(ns, "gw");
    let service = wait::until("the Gateway's Service", wait::T, || async {
        Ok(get_json(&s.cluster, &["service", "-n", proxies_ns, &name]).ok())
    })
    .await?;
    assert_eq!(service["spec"]["type"], "ClusterIP", "{service}");
    assert_eq!(
        service["spec"]["selector"],
        json!({ "app.kubernetes.io/name": "holdfast-proxy" })
    );
    assert_eq!(service["spec"]["ports"][0]["port"], 80);
    let target = service["spec"]["ports"][0]["targetPort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .context("a numeric targetPort")?;
    assert!((first..first + 10).contains(&target), "{target} in {range}");
    let cluster_ip = service["spec"]["clusterIP"]
        .as_str()
        .context("a cluster IP")?;

    // The Gateway: the Service's address, Programmed once the proxy serves it.
    let gw = wait::until(
        "the Gateway programmed with its Service's address",
        wait::T,
        || async {
            let gw = get_json(&s.cluster, &["gateway", "-n", ns, "gw"])?;
            let programmed = find_condition(&gw["status"]["conditions"], "Programmed");
            Ok((programmed["status"] == "True").then_some(gw))
        },
    )
    .await?;
    assert_eq!(
        gw["status"]["addresses"],
        json!([{ "type": "IPAddress", "value": cluster_ip }])
    );
    // The proxy binds the container port: what the Service sends to the pod is served.
    let at: SocketAddr = ([127, 0, 0, 1], target).into();
    let (status, headers, _) = web::get_full(at, "gw.test", "/x").await?;
    assert_eq!(status, 200);
    assert_eq!(headers["x-echo-path"], "/x");
    // A redirect that keeps the port keeps the one clients use: 80, so none is written.
    let (status, headers, _) = web::get_full(at, "gw.test", "/old").await?;
    assert_eq!(status, 302);
    assert_eq!(headers["location"], "http://new.test/old");

    // Someone deletes the Service: the leader makes it again, at the same container port.
    s.cluster
        .kubectl_run(&["delete", "service", "-n", proxies_ns, &name])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let again = wait::until("the Service made again", wait::T, || async {
        let svc = get_json(&s.cluster, &["service", "-n", proxies_ns, &name]).ok();
        Ok(svc.filter(|svc| svc["metadata"]["uid"] != service["metadata"]["uid"]))
    })
    .await?;
    assert_eq!(again["spec"]["ports"][0]["targetPort"], target);

    // The Gateway goes: so do its Service and its listener.
    s.cluster
        .kubectl_run(&["delete", "gateway", "-n", ns, "gw"])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    wait::until("the Service deleted with its Gateway", wait::T, || async {
        Ok(get_json(&s.cluster, &["service", "-n", proxies_ns, &name])
            .is_err()
            .then_some(()))
    })
    .await?;
    wait::until("the container port closed", wait::T, || async {
        Ok(tokio::net::TcpStream::connect(at)
            .await
            .is_err()
            .then_some(()))
    })
    .await?;
    // A Service of the proxies' namespace that is not a Gateway's is never touched.
    let services =
        get_json(&s.cluster, &["service", "-n", proxies_ns]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let names: Vec<&str> = services["items"]
        .as_array()
        .context("a list")?
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["holdfast-proxy"], "{services}");
    Ok(())
}
