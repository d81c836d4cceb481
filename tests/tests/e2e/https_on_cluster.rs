//! HTTPS from Ingress `spec.tls` end to end: the real kube-apiserver and etcd, the real
//! control plane (mutual TLS to the proxy), a real proxy with `--listen-tls`, echo
//! backends in a test network namespace, certificates from a test CA in Secrets.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::grpcurl::call;
use holdfast_tests::netns::TestNet;
use holdfast_tests::objects::{self, create, create_class};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::tls::{Issued, TestCa, client_config, client_config_at, https_get};
use holdfast_tests::wait;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use holdfast_tests::wait::T;

struct World {
    _net: TestNet,
    client: kube::Client,
    ns: String,
    ca: TestCa,
    cp: ControlPlane,
    p: ProxyProc,
    state: tempfile::TempDir,
    _logs: PathBuf,
    /// The certificate of `*.wild.<ns>.test` (Ingress `wild`).
    wild: Issued,
    /// An expired certificate (Ingress `old`).
    old: Issued,
    /// The certificate of `*.shop.<ns>.test`, listed as that in Ingress `shop`'s
    /// `spec.tls`, whose rule host is `www.shop.<ns>.test`.
    shop: Issued,
}

impl World {
    fn host(&self, name: &str) -> String {
        format!("{name}.{}.test", self.ns)
    }
}

/// Service `web` with an echo backend; Ingresses `secure` (HTTPS, Secret `site`), `open`
/// (HTTPS with the redirect turned off, Secret `open`), `nginxopen` (the same with
/// ingress-nginx's `ssl-redirect: "false"`), `broken` (Secret `broken`, which
/// holds garbage), `wild` (`*.wild.<ns>.test`, a wildcard certificate), `old` (an
/// expired certificate) and `shop` (rule host `www.shop.<ns>.test`, `spec.tls` host
/// `*.shop.<ns>.test`); a control plane and a proxy with an HTTPS listener.
async fn world(prefix: &str) -> anyhow::Result<(World, Issued)> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, prefix).await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    let mut net = TestNet::create("tls")?;
    let a = net.spawn_echo("echo-tls", 8080)?.ip().to_string();
    let nsr = Some(ns.as_str());
    create(&client, nsr, &objects::service("web", 80, 8080)).await?;
    create(
        &client,
        nsr,
        &objects::endpoint_slice("web-1", "web", 8080, &[&a]),
    )
    .await?;
    let ca = TestCa::new("holdfast test site CA");
    let host = |n: &str| format!("{n}.{ns}.test");
    let site = ca.server(&[&host("secure")]);
    let open = ca.server(&[&host("open")]);
    let nginx_open = ca.server(&[&host("nginxopen")]);
    let wild = ca.server(&[&host("*.wild")]);
    let old = ca.expired_server(&[&host("old")]);
    let shop = ca.server(&[&host("*.shop")]);
    for (name, cert, key) in [
        ("shop", shop.cert_pem.as_str(), shop.key_pem.as_str()),
        ("site", site.cert_pem.as_str(), site.key_pem.as_str()),
        ("open", open.cert_pem.as_str(), open.key_pem.as_str()),
        (
            "nginxopen",
            nginx_open.cert_pem.as_str(),
            nginx_open.key_pem.as_str(),
        ),
        ("broken", "not a certificate", "not a key"),
        ("wild", wild.cert_pem.as_str(), wild.key_pem.as_str()),
        ("old", old.cert_pem.as_str(), old.key_pem.as_str()),
    ] {
        create(&client, nsr, &objects::tls_secret(name, cert, key)).await?;
    }
    // A good certificate in a Secret of another type: the control plane never reads it
    // (its Secret watch selects type=kubernetes.io/tls), so to it the Secret is missing.
    let opaque = ca.server(&[&host("opaque")]);
    let mut secret = objects::tls_secret("opaque", &opaque.cert_pem, &opaque.key_pem);
    secret.type_ = Some("Opaque".into());
    create(&client, nsr, &secret).await?;
    for (name, secret, annotations) in [
        ("secure", "site", json!({})),
        (
            "open",
            "open",
            json!({ "holdfast.dev/ssl-redirect": "false" }),
        ),
        // The same opt-out, as ingress-nginx users write it.
        (
            "nginxopen",
            "nginxopen",
            json!({ "nginx.ingress.kubernetes.io/ssl-redirect": "false" }),
        ),
        ("broken", "broken", json!({})),
        ("opaque", "opaque", json!({})),
        ("wild", "wild", json!({})),
        ("old", "old", json!({})),
    ] {
        let h = if name == "wild" {
            host("*.wild")
        } else {
            host(name)
        };
        create(
            &client,
            nsr,
            &objects::tls_ingress(name, &class, &h, "web", 80, secret, annotations),
        )
        .await?;
    }
    // As ingress-nginx reads it: the tls entry lists the wildcard, the rule names a host
    // under it, and the entry's certificate covers that host.
    let mut ingress = serde_json::to_value(objects::ingress(
        "shop",
        &class,
        &host("www.shop"),
        "web",
        80,
    ))?;
    ingress["spec"]["tls"] = json!([{ "hosts": [host("*.shop")], "secretName": "shop" }]);
    create(
        &client,
        nsr,
        &serde_json::from_value::<k8s_openapi::api::networking::v1::Ingress>(ingress)?,
    )
    .await?;
    let logs = holdfast_tests::e2e_logs(&ns)?;
    let cp = ControlPlane::start(
        "control-plane",
        &cluster.kubeconfig(),
        &logs,
        &["--ingress-class", &class, "--debounce", "50ms"],
    )?;
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start(
        "proxy-tls",
        &[cp.grpc_url()],
        state.path(),
        &logs,
        &["--listen-tls", "127.0.0.1:0"],
    )?;
    p.wait_ready(T).await?;
    Ok((
        World {
            _net: net,
            client,
            ns,
            ca,
            cp,
            p,
            state,
            _logs: logs,
            wild,
            old,
            shop,
        },
        site,
    ))
}

#[tokio::test]
async fn an_ingress_tls_host_is_served_over_https_and_a_broken_secret_touches_nothing_else()
-> anyhow::Result<()> {
    let (w, site) = world("tlse2e").await?;
    let https = w.p.https.expect("https listener");
    let (secure, open, broken) = (w.host("secure"), w.host("open"), w.host("broken"));
    let h2 = client_config(&w.ca.cert_pem, &["h2", "http/1.1"]);
    let seen = wait::until("HTTPS from the Secret's certificate", T, || async {
        https_get(https, h2.clone(), &secure, "/")
            .await
            .map(Some)
            .map_err(|e| e.to_string())
    })
    .await?;
    assert_eq!((seen.status, seen.body.as_str()), (200, "echo-tls\n"));
    assert_eq!((seen.alpn.as_str(), seen.serial), ("h2", site.serial()));
    let h1 = client_config(&w.ca.cert_pem, &["http/1.1"]);
    let seen = https_get(https, h1.clone(), &secure, "/").await?;
    assert_eq!((seen.status, seen.alpn.as_str()), (200, "http/1.1"));
    assert_eq!(seen.headers["x-echo-x-forwarded-proto"], "https");

    // Plain HTTP: 308 to https, unless the Ingress opts out; the opted-out host still
    // serves HTTPS.
    let (status, headers, _) = holdfast_tests::http::get_full(w.p.addr, &secure, "/a?b=c").await?;
    assert_eq!(status, 308);
    assert_eq!(
        headers["location"],
        format!("https://{secure}/a?b=c").as_str()
    );
    assert_eq!(w.p.get(&open, "/").await?.0, 200);
    assert_eq!(https_get(https, h2.clone(), &open, "/").await?.status, 200);
    let nginx_open = w.host("nginxopen");
    assert_eq!(w.p.get(&nginx_open, "/").await?.0, 200);
    assert_eq!(
        https_get(https, h2.clone(), &nginx_open, "/").await?.status,
        200
    );

    // The broken Secret: its host has no certificate (no HTTPS, no redirect, still
    // routed), an Event and a problem say why, and no other host is affected.
    assert!(https_get(https, h2.clone(), &broken, "/").await.is_err());
    assert_eq!(w.p.get(&broken, "/").await?.0, 200);
    objects::warning_event(&w.client, &w.ns, "InvalidTLSSecret", "broken").await?;
    let status = call(w.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
    let problems = status["problems"].as_array().cloned().unwrap_or_default();
    assert!(
        problems
            .iter()
            .any(|p| p["reason"] == "InvalidTLSSecret" && p["name"] == "broken"),
        "{status}"
    );
    assert!(!status.to_string().contains("not a key"));
    assert!(
        problems
            .iter()
            .any(|p| p["reason"] == "MissingTLSSecret" && p["name"] == "opaque"),
        "{status}"
    );
    assert!(
        https_get(https, h2.clone(), &w.host("opaque"), "/")
            .await
            .is_err()
    );

    // Operators see certificates by fingerprint, never their keys.
    let snapshot = call(w.cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}")?;
    let text = snapshot.to_string();
    assert!(
        !text.contains("privateKey") && !text.contains("PRIVATE KEY"),
        "{text}"
    );
    let key_line = site.key_pem.lines().nth(1).unwrap();
    assert!(!text.contains(key_line));
    // Nor do the logs.
    for log in [w.cp.proc.log(), w.p.proc.log()] {
        assert!(!log.contains(key_line) && !log.contains("PRIVATE KEY"));
    }
    let cert = snapshot["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == format!("{}/site", w.ns))
        .cloned()
        .expect("the site certificate");
    assert_eq!(cert["serial"], site.serial());
    let expiry =
        w.cp.metric(&format!(
            "holdfast_certificate_expiry_timestamp_seconds{{certificate=\"{}/site\"}}",
            w.ns
        ))
        .await?;
    assert_eq!(
        expiry.map(|e| e as i64).map(|e| e.to_string()),
        cert["notAfter"].as_str().map(str::to_owned)
    );

    // A wildcard certificate serves one label below it, not two; a name no certificate
    // covers fails the handshake.
    let seen = https_get(https, h2.clone(), &w.host("a.wild"), "/").await?;
    assert_eq!((seen.status, seen.serial), (200, w.wild.serial()));
    assert!(
        https_get(https, h2.clone(), &w.host("a.b.wild"), "/")
            .await
            .is_err()
    );
    assert!(
        https_get(https, h2.clone(), &w.host("nosuch"), "/")
            .await
            .is_err()
    );

    // A rule host under a tls entry's wildcard is served with that entry's certificate,
    // over HTTPS and with the redirect to it.
    let www = w.host("www.shop");
    let seen = https_get(https, h2.clone(), &www, "/").await?;
    assert_eq!((seen.status, seen.serial), (200, w.shop.serial()));
    assert_eq!(
        holdfast_tests::http::get_full(w.p.addr, &www, "/").await?.0,
        308
    );

    // An expired certificate is still served (a client checking it as of 2020 accepts
    // it), with a warning Event and its expiry in the metrics.
    let in_2020 = std::time::UNIX_EPOCH + Duration::from_secs(1_590_000_000);
    let then = client_config_at(&w.ca.cert_pem, &["h2"], in_2020);
    let seen = https_get(https, then, &w.host("old"), "/").await?;
    assert_eq!((seen.status, seen.serial), (200, w.old.serial()));
    assert!(
        https_get(https, h2.clone(), &w.host("old"), "/")
            .await
            .is_err()
    );
    objects::warning_event(&w.client, &w.ns, "CertificateExpired", "old").await?;
    let old_expiry =
        w.cp.metric(&format!(
            "holdfast_certificate_expiry_timestamp_seconds{{certificate=\"{}/old\"}}",
            w.ns
        ))
        .await?;
    assert_eq!(old_expiry, Some(1_609_459_200.0));
    // The problems are counted by reason.
    for reason in ["InvalidTLSSecret", "MissingTLSSecret", "CertificateExpired"] {
        let n =
            w.cp.metric(&format!("holdfast_problems{{reason=\"{reason}\"}}"))
                .await?;
        assert!(n.unwrap_or(0.0) >= 1.0, "{reason}: {n:?}");
    }

    // The proxy's debug endpoints show certificates by fingerprint, subject, names and
    // expiry, never their keys; the state file that holds the keys is the proxy's alone.
    let (_, debug) = w.p.admin_get("/debug/snapshot").await?;
    let (_, explain) =
        w.p.admin_get(&format!("/debug/explain?host={secure}&path=/"))
            .await?;
    for text in [&debug, &explain] {
        assert!(
            !text.contains(key_line) && !text.contains("PRIVATE KEY"),
            "{text}"
        );
    }
    let explained: serde_json::Value = serde_json::from_str(&explain)?;
    let c = &explained["certificate"];
    assert_eq!(c["name"], format!("{}/site", w.ns));
    assert_eq!(c["dns_names"], json!([secure]));
    assert!(
        c["subject"].as_str().is_some_and(|s| s.contains(&secure)),
        "{c}"
    );
    assert!(
        c["fingerprint_sha256"]
            .as_str()
            .is_some_and(|f| f.len() == 64)
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| -> anyhow::Result<u32> {
        Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
    };
    let file = w.state.path().join("snapshot.bin");
    assert_eq!(mode(&file)?, 0o600);
    assert_eq!(
        mode(w.state.path())? & 0o077,
        0,
        "the state directory is private"
    );

    // A Secret that breaks while it serves: its host keeps the certificate it had (with
    // an Event saying why), and no other host is touched.
    let secrets: Api<Secret> = Api::namespaced(w.client.clone(), &w.ns);
    secrets
        .patch(
            "site",
            &PatchParams::default(),
            &Patch::Merge(json!({ "stringData": { "tls.key": "no longer a key" } })),
        )
        .await?;
    objects::warning_event(&w.client, &w.ns, "InvalidTLSSecret", "secure").await?;
    let seen = https_get(https, h2.clone(), &secure, "/").await?;
    assert_eq!((seen.status, seen.serial), (200, site.serial()));
    assert_eq!(https_get(https, h2.clone(), &open, "/").await?.status, 200);
    let seen = https_get(https, h2.clone(), &w.host("a.wild"), "/").await?;
    assert_eq!(seen.serial, w.wild.serial());
    Ok(())
}

#[tokio::test]
async fn renewing_the_secret_under_traffic_fails_no_request_and_new_handshakes_see_the_new_serial()
-> anyhow::Result<()> {
    let (w, site) = world("tlsrenew").await?;
    let https = w.p.https.expect("https listener");
    let secure = w.host("secure");
    let h1 = client_config(&w.ca.cert_pem, &["http/1.1"]);
    wait::until("HTTPS up", T, || async {
        https_get(https, h1.clone(), &secure, "/")
            .await
            .map(|s| (s.serial == site.serial()).then_some(()))
            .map_err(|e| e.to_string())
    })
    .await?;

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let traffic = {
        let (stop, ok, failed, h1, host) = (
            stop.clone(),
            ok.clone(),
            failed.clone(),
            h1.clone(),
            secure.clone(),
        );
        tokio::spawn(async move {
            for _ in 0..50_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match https_get(https, h1.clone(), &host, "/").await {
                    Ok(s) if s.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    // Traffic is under way before the renewal, and again after it: the final
    // count then holds whatever the renewal's timing.
    wait::until("traffic before the renewal", T, || async {
        Ok::<_, String>((ok.load(Ordering::Relaxed) > 10).then_some(()))
    })
    .await?;
    let renewed = w.ca.server(&[&secure]);
    let secrets: Api<Secret> = Api::namespaced(w.client.clone(), &w.ns);
    secrets
        .patch(
            "site",
            &PatchParams::default(),
            &Patch::Merge(json!({ "stringData": {
                "tls.crt": renewed.cert_pem, "tls.key": renewed.key_pem
            }})),
        )
        .await?;
    wait::until(
        "a new handshake to see the renewed certificate",
        T,
        || async {
            let fresh = client_config(&w.ca.cert_pem, &["http/1.1"]);
            let seen = https_get(https, fresh, &secure, "/")
                .await
                .map_err(|e| e.to_string())?;
            Ok((seen.serial == renewed.serial()).then_some(()))
        },
    )
    .await?;
    let before = ok.load(Ordering::Relaxed);
    wait::until("traffic after the renewal", T, || async {
        Ok::<_, String>((ok.load(Ordering::Relaxed) > before + 10).then_some(()))
    })
    .await?;
    stop.store(true, Ordering::Relaxed);
    traffic.await?;
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert_eq!(
        failed, 0,
        "requests failed during the renewal ({ok} answered)"
    );
    assert!(ok > 20, "only {ok} requests answered across the renewal");
    Ok(())
}

#[tokio::test]
async fn without_permission_to_read_tls_secrets_the_control_plane_publishes_nothing()
-> anyhow::Result<()> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "tlsrbac").await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    let host = format!("web.{ns}.test");
    create(
        &client,
        Some(&ns),
        &objects::ingress("web", &class, &host, "web", 80),
    )
    .await?;
    // Everything the control plane reads, except Secrets.
    let rbac = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{ name: holdfast-cp, namespace: {ns} }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{ name: {ns}-no-secrets }}
rules:
- apiGroups: [networking.k8s.io]
  resources: [ingresses, ingressclasses]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps, namespaces]
  verbs: [get, list, watch, create, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{ name: {ns}-no-secrets }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {ns}-no-secrets }}
subjects: [{{ kind: ServiceAccount, name: holdfast-cp, namespace: {ns} }}]
"#
    );
    let logs = holdfast_tests::e2e_logs(&ns)?;
    let path = logs.join("rbac.yaml");
    std::fs::write(&path, rbac)?;
    cluster.kubectl_run(&["apply", "-f", &path.to_string_lossy()])?;
    let kubeconfig = cluster.service_account_kubeconfig(&ns, "holdfast-cp")?;
    let cp = ControlPlane::start(
        "control-plane-no-secrets",
        &kubeconfig,
        &logs,
        &["--ingress-class", &class, "--debounce", "50ms"],
    )?;
    let secret_cache = wait::until("a 403 on Secrets in GetStatus", T, || async {
        let st = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        let cache = st["caches"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["kind"] == "Secret")
            .cloned();
        Ok(cache.filter(|c| {
            c["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("permission denied (403)"))
        }))
    })
    .await?;
    assert_ne!(secret_cache["synced"], true);
    // The other caches complete; still nothing is published.
    let st = wait::until("the other caches complete", T, || async {
        let st = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        let synced = st["caches"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["synced"] == true)
            .count();
        Ok((synced == holdfast_control_plane::state::KINDS.len() - 1).then_some(st))
    })
    .await?;
    assert_ne!(st["ready"], true);
    assert_eq!(
        call(cp.grpc, "grpc.health.v1.Health/Check", "{}")?["status"],
        "NOT_SERVING"
    );
    assert_eq!(
        cp.metric("holdfast_snapshots_published_total").await?,
        Some(0.0)
    );
    Ok(())
}
