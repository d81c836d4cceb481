//! Mutual TLS between the planes, against the real kube-apiserver, the real control plane,
//! real proxies and the real grpcurl: who may stream routes, who may call Admin, rotation
//! of the serving certificate on disk, and plaintext mode refusing to send keys.

use std::path::PathBuf;

use holdfast_proto::v1::{DiscoveryRequest, Node};
use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::grpcurl::{call, grpcurl_with};
use holdfast_tests::objects::{self, create, create_class};
use holdfast_tests::proxy::ProxyProc;
use holdfast_tests::tls::{OPERATOR, Planes, TestCa};
use holdfast_tests::wait;
use serde_json::json;
use tokio_stream::wrappers::ReceiverStream;

use holdfast_tests::wait::T;

struct Setup {
    client: kube::Client,
    ns: String,
    class: String,
    logs: PathBuf,
}

/// A namespace and IngressClass of its own, with Ingress `web` routing `web.<ns>.test`.
async fn setup(prefix: &str) -> anyhow::Result<Setup> {
    let cluster = LocalCluster::shared();
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, prefix).await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    let logs = holdfast_tests::e2e_logs(&ns)?;
    let s = Setup {
        client,
        ns,
        class,
        logs,
    };
    s.ingress("web").await?;
    Ok(s)
}

impl Setup {
    async fn ingress(&self, name: &str) -> anyhow::Result<()> {
        let host = format!("{name}.{}.test", self.ns);
        create(
            &self.client,
            Some(&self.ns),
            &objects::ingress(name, &self.class, &host, "web", 80),
        )
        .await?;
        Ok(())
    }

    fn control_plane(&self, extra: &[&str]) -> anyhow::Result<ControlPlane> {
        let mut args = vec!["--ingress-class", self.class.as_str(), "--debounce", "50ms"];
        args.extend_from_slice(extra);
        ControlPlane::start(
            "control-plane",
            &LocalCluster::shared().kubeconfig(),
            &self.logs,
            &args,
        )
    }
}

/// A gRPC channel to `url` over `tls`; a failure is a status, as the calls' are.
async fn tls_channel(
    url: &str,
    tls: tonic::transport::ClientTlsConfig,
) -> Result<tonic::transport::Channel, tonic::Status> {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|e| tonic::Status::internal(e.to_string()))?
        .tls_config(tls)
        .map_err(|e| tonic::Status::internal(e.to_string()))?
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))
}

/// Opens a RouteDiscovery stream to `url` with `tls` as node `node_id` and waits for the
/// first response: Ok(()) if one arrives, else the gRPC status.
async fn first_response(
    url: &str,
    tls: tonic::transport::ClientTlsConfig,
    node_id: &str,
) -> Result<(), tonic::Status> {
    let channel = tls_channel(url, tls).await?;
    let mut client = holdfast_proto::client::route_discovery(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: node_id.into(),
            zone: String::new(),
        }),
        ..Default::default()
    })
    .await
    .expect("channel open");
    let mut inbound = client
        .stream_routes(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(T, inbound.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no response"))??;
    first
        .map(|_| ())
        .ok_or_else(|| tonic::Status::cancelled("stream closed"))
}

fn client_tls(
    ca_pem: &str,
    identity: Option<(String, String)>,
) -> tonic::transport::ClientTlsConfig {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    tls
}

#[tokio::test]
async fn a_proxy_without_a_certificate_from_the_ca_or_whose_node_id_its_certificate_does_not_prove_is_refused()
-> anyhow::Result<()> {
    let s = setup("mtlsauth").await?;
    let cp = s.control_plane(&[])?;
    let url = cp.grpc_url();
    let planes = Planes::get();
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
    let (a_cert, a_key) = planes.proxy("proxy-a");

    // The certificate proves the node id: routes flow.
    let good = client_tls(&planes.ca.cert_pem, Some((read(&a_cert), read(&a_key))));
    first_response(&url, good.clone(), "proxy-a").await?;

    // No client certificate: no identity, so no stream.
    let none = first_response(&url, client_tls(&planes.ca.cert_pem, None), "proxy-a")
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::PermissionDenied, "{none}");
    // A certificate from another CA: not even a TLS connection.
    let other = TestCa::new("another CA").client(&["proxy-a"], &[]);
    let foreign = first_response(
        &url,
        client_tls(&planes.ca.cert_pem, Some((other.cert_pem, other.key_pem))),
        "proxy-a",
    )
    .await;
    assert!(
        foreign.is_err(),
        "a certificate from another CA was accepted"
    );
    assert!(
        cp.metric_value("holdfast_grpc_tls_handshake_failures_total")
            .await?
            >= 1.0
    );

    // A node id the certificate does not prove.
    let status = first_response(&url, good, "proxy-b").await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");

    // A real proxy presenting another node's certificate never gets routes.
    let state = tempfile::tempdir()?;
    let flags = planes.proxy_flags("someone-else");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let p = ProxyProc::start(
        "proxy-x",
        std::slice::from_ref(&url),
        state.path(),
        &s.logs,
        &flags,
    )?;
    wait::until("the control plane to refuse proxy-x", T, || async {
        let refused = cp
            .metric_value("holdfast_proxy_streams_refused_total")
            .await
            .map_err(|e| e.to_string())?;
        Ok((refused >= 3.0).then_some(()))
    })
    .await?;
    assert_eq!(p.admin_get("/readyz").await?.0, 503);

    // ListProxies shows the verified identity of the one accepted stream kept open.
    let (cert, key) = (read(&a_cert), read(&a_key));
    let kept = tokio::spawn(async move {
        let tls = client_tls(&Planes::get().ca.cert_pem, Some((cert, key)));
        let channel = tonic::transport::Endpoint::from_shared(url)?
            .tls_config(tls)?
            .connect()
            .await?;
        let mut client = holdfast_proto::client::route_discovery(channel);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(DiscoveryRequest {
            node: Some(Node {
                id: "proxy-a".into(),
                zone: String::new(),
            }),
            ..Default::default()
        })
        .await?;
        let mut inbound = client
            .stream_routes(ReceiverStream::new(rx))
            .await?
            .into_inner();
        while inbound.message().await?.is_some() {}
        drop(tx);
        anyhow::Ok(())
    });
    let proxies = wait::until("proxy-a in ListProxies", T, || async {
        let v = call(cp.grpc, "holdfast.v1.Admin/ListProxies", "{}").map_err(|e| e.to_string())?;
        let found = v["proxies"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["id"] == "proxy-a")
            .cloned();
        Ok(found)
    })
    .await?;
    assert_eq!(proxies["identity"], "proxy-a");
    kept.abort();
    Ok(())
}

/// Waits until `cp` has counted `at_least` failed TLS handshakes, then checks that the
/// proxy `p` has no control-plane stream and is not ready: it refused the control plane.
async fn refused_by(p: &ProxyProc, cp: &ControlPlane, at_least: f64) -> anyhow::Result<()> {
    wait::until("the proxy to abort its handshakes", T, || async {
        let failed = cp
            .metric_value("holdfast_grpc_tls_handshake_failures_total")
            .await
            .map_err(|e| e.to_string())?;
        Ok((failed >= at_least).then_some(()))
    })
    .await?;
    assert_eq!(
        p.metric("holdfast_proxy_control_plane_connected").await?,
        Some(0.0)
    );
    assert_eq!(p.admin_get("/readyz").await?.0, 503);
    Ok(())
}

#[tokio::test]
async fn a_proxy_refuses_a_control_plane_it_cannot_verify() -> anyhow::Result<()> {
    let s = setup("mtlsimpostor").await?;
    let planes = Planes::get();
    let p = |p: &std::path::Path| p.to_string_lossy().into_owned();

    // An impostor with a serving certificate for the right names from another CA (it
    // trusts our proxies' CA, so only the proxy's check can refuse it).
    let dir = tempfile::tempdir()?;
    let impostor = TestCa::new("impostor CA").server(&["127.0.0.1", "localhost"]);
    let (cert, key) = impostor.write(dir.path(), "impostor")?;
    let (cert, key, ca) = (p(&cert), p(&key), p(&planes.ca_file));
    let fake = s.control_plane(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--client-ca",
        &ca,
        "--admin-identities",
        OPERATOR,
        "--proxy-identities",
        "*",
    ])?;
    let state = tempfile::tempdir()?;
    let proxy = ProxyProc::start("proxy-i", &[fake.grpc_url()], state.path(), &s.logs, &[])?;
    refused_by(&proxy, &fake, 2.0).await?;
    drop(proxy);

    // The real control plane, under a name its certificate does not have.
    let real = s.control_plane(&[])?;
    let mut flags = planes.proxy_flags("proxy-n");
    flags.extend([
        "--control-plane-name".into(),
        "not-the-control-plane.test".into(),
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let state = tempfile::tempdir()?;
    let misnamed = ProxyProc::start("proxy-n", &[real.grpc_url()], state.path(), &s.logs, &flags)?;
    refused_by(&misnamed, &real, 2.0).await?;
    drop(misnamed);

    // The same flags with the name the certificate has: served.
    let mut flags = planes.proxy_flags("proxy-n2");
    flags.extend(["--control-plane-name".into(), "localhost".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let state = tempfile::tempdir()?;
    let named = ProxyProc::start(
        "proxy-n2",
        &[real.grpc_url()],
        state.path(),
        &s.logs,
        &flags,
    )?;
    named.wait_ready(T).await?;
    Ok(())
}

#[tokio::test]
async fn admin_is_for_operator_identities_and_a_proxy_certificate_is_denied() -> anyhow::Result<()>
{
    let s = setup("mtlsadmin").await?;
    let cp = s.control_plane(&[])?;
    let planes = Planes::get();
    let (cert, key) = planes.proxy("proxy-admin");
    let p = |p: &PathBuf| p.to_string_lossy().into_owned();
    let proxy_flags = vec![
        "-cacert".to_string(),
        p(&planes.ca_file),
        "-cert".into(),
        p(&cert),
        "-key".into(),
        p(&key),
    ];
    for (method, data) in [
        ("holdfast.v1.Admin/GetSnapshot", "{}"),
        ("holdfast.v1.Admin/ListProxies", "{}"),
        ("holdfast.v1.Admin/GetStatus", "{}"),
        (
            "holdfast.v1.Admin/ApproveHeldSnapshot",
            r#"{"version": "1-x"}"#,
        ),
    ] {
        let err = grpcurl_with(&proxy_flags, cp.grpc, Some(data), &[method])
            .unwrap_err()
            .to_string();
        assert!(err.contains("PermissionDenied"), "{method}: {err}");
    }
    // Health and reflection stay open, even to a client without a certificate; Admin
    // does not.
    let bare = vec!["-cacert".to_string(), p(&planes.ca_file)];
    for flags in [&proxy_flags, &bare] {
        let listed = grpcurl_with(flags, cp.grpc, None, &["list"])?;
        assert!(listed.contains("holdfast.v1.Admin"), "{listed}");
        grpcurl_with(flags, cp.grpc, Some("{}"), &["grpc.health.v1.Health/Check"])?;
    }
    let err = grpcurl_with(&bare, cp.grpc, Some("{}"), &["holdfast.v1.Admin/GetStatus"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("PermissionDenied"), "{err}");
    // An operator identity in a certificate from another CA proves nothing (grpcurl does
    // not even offer it: the server names its CA in the handshake).
    let other = TestCa::new("another CA").client(&[], &[OPERATOR]);
    let (oc, ok) = other.write(&s.logs, "foreign-operator")?;
    let foreign = vec![
        "-cacert".to_string(),
        p(&planes.ca_file),
        "-cert".into(),
        p(&oc),
        "-key".into(),
        p(&ok),
    ];
    let err = grpcurl_with(
        &foreign,
        cp.grpc,
        Some("{}"),
        &["holdfast.v1.Admin/GetStatus"],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("PermissionDenied"), "{err}");
    // The operator's certificate works (identity in --admin-identities).
    let status = wait::until("GetStatus ready", T, || async {
        let v = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}").map_err(|e| e.to_string())?;
        Ok((v["ready"] == true).then_some(v))
    })
    .await?;
    assert!(status["publishedVersion"].is_string());
    Ok(())
}

#[tokio::test]
async fn the_serving_certificate_is_rotated_on_disk_while_proxies_stay_connected_and_keep_acking()
-> anyhow::Result<()> {
    let s = setup("mtlsrotate").await?;
    let planes = Planes::get();
    let dir = tempfile::tempdir()?;
    let first = planes.ca.server(&["127.0.0.1", "localhost"]);
    let (crt, key) = first.write(dir.path(), "serving")?;
    let (crt_s, key_s, ca_s) = (
        crt.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
        planes.ca_file.to_string_lossy().into_owned(),
    );
    let cp = s.control_plane(&[
        "--tls-cert",
        &crt_s,
        "--tls-key",
        &key_s,
        "--client-ca",
        &ca_s,
        "--admin-identities",
        OPERATOR,
        "--proxy-identities",
        "*",
        "--tls-reload-interval",
        "200ms",
    ])?;
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start("proxy-r", &[cp.grpc_url()], state.path(), &s.logs, &[])?;
    p.wait_ready(T).await?;
    let acked = || async {
        let v = call(cp.grpc, "holdfast.v1.Admin/ListProxies", "{}")?;
        let status = call(cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")?;
        let proxy = v["proxies"][0].clone();
        anyhow::Ok((proxy, status["publishedVersion"].clone()))
    };
    let (before, _) = acked().await?;
    let serial = |cfg| async move {
        let tcp = tokio::net::TcpStream::connect(cp.grpc).await?;
        let tls = tokio_rustls::TlsConnector::from(cfg)
            .connect("localhost".try_into()?, tcp)
            .await?;
        let der = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        anyhow::Ok(holdfast_tests::tls::serial_of(&der))
    };
    let operator_config = || {
        holdfast_process::tls::client_config(&holdfast_process::tls::Files {
            cert: planes.operator.0.clone(),
            key: planes.operator.1.clone(),
            ca: planes.ca_file.clone(),
        })
        .expect("the operator's files load")
    };
    assert_eq!(serial(operator_config()).await?, first.serial());

    // cert-manager renews in place.
    let renewed = planes.ca.server(&["127.0.0.1", "localhost"]);
    renewed.write(dir.path(), "serving")?;
    wait::until(
        "new handshakes to see the renewed certificate",
        T,
        || async {
            let now = serial(operator_config()).await.map_err(|e| e.to_string())?;
            Ok((now == renewed.serial()).then_some(()))
        },
    )
    .await?;
    assert!(cp.metric_value("holdfast_grpc_tls_reloads_total").await? >= 1.0);

    // The proxy's stream was not dropped, and it ACKs the next snapshot on it.
    s.ingress("after").await?;
    let (after, published) = wait::until("the proxy to ACK the new snapshot", T, || async {
        let (proxy, published) = acked().await.map_err(|e| e.to_string())?;
        Ok(
            (proxy["ackedVersion"] == published && published != before["ackedVersion"])
                .then_some((proxy, published)),
        )
    })
    .await?;
    assert_eq!(after["connectedSince"], before["connectedSince"]);
    assert_eq!(after["ackedVersion"], published);
    let host = format!("after.{}.test", s.ns);
    assert_eq!(p.get(&host, "/").await?.0, 503, "routed (no endpoints)");
    Ok(())
}

#[tokio::test]
async fn in_plaintext_mode_the_control_plane_sends_no_keys_unless_allowed() -> anyhow::Result<()> {
    let s = setup("plainkeys").await?;
    let site = TestCa::new("site CA").server(&[&format!("secure.{}.test", s.ns)]);
    create(
        &s.client,
        Some(&s.ns),
        &objects::tls_secret("site", &site.cert_pem, &site.key_pem),
    )
    .await?;
    create(
        &s.client,
        Some(&s.ns),
        &objects::tls_ingress(
            "secure",
            &s.class,
            &format!("secure.{}.test", s.ns),
            "web",
            80,
            "site",
            json!({}),
        ),
    )
    .await?;
    let plain = ["-plaintext".to_string()];
    for (extra, keys) in [
        (&["--insecure-plaintext"][..], false),
        (
            &["--insecure-plaintext", "--allow-plaintext-secrets"][..],
            true,
        ),
    ] {
        let cp = s.control_plane(extra)?;
        let status = wait::until("a published snapshot", T, || async {
            let out = grpcurl_with(
                &plain,
                cp.grpc,
                Some("{}"),
                &["holdfast.v1.Admin/GetStatus"],
            )
            .map_err(|e| e.to_string())?;
            let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            Ok((v["ready"] == true).then_some(v))
        })
        .await?;
        let snapshot = grpcurl_with(
            &plain,
            cp.grpc,
            Some("{}"),
            &["holdfast.v1.Admin/GetSnapshot"],
        )?;
        let disabled = status["problems"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["reason"] == "TLSDisabled");
        assert_eq!(disabled, !keys, "{status}");
        assert_eq!(snapshot.contains("certificates"), keys, "{snapshot}");
        // Even when keys are sent to proxies, Admin never shows them.
        assert!(!snapshot.contains("privateKey"), "{snapshot}");
        assert!(!snapshot.contains("PRIVATE KEY"), "{snapshot}");
    }
    Ok(())
}

#[tokio::test]
async fn a_renewed_proxy_certificate_and_a_renewed_client_ca_are_picked_up_from_disk()
-> anyhow::Result<()> {
    let s = setup("mtlsclient").await?;
    let planes = Planes::get();
    let dir = tempfile::tempdir()?;
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();

    // The control plane trusts only its client CA file, which starts with another CA.
    let other = TestCa::new("the proxies' new CA");
    let client_ca = dir.path().join("client-ca.crt");
    std::fs::write(&client_ca, &planes.ca.cert_pem)?;
    let (server_crt, server_key) = planes.server.clone();
    let cp = s.control_plane(&[
        "--tls-cert",
        &path(&server_crt),
        "--tls-key",
        &path(&server_key),
        "--client-ca",
        &path(&client_ca),
        "--admin-identities",
        OPERATOR,
        "--proxy-identities",
        "*",
        "--tls-reload-interval",
        "200ms",
    ])?;

    // The proxy's own files: a certificate from the other CA, which the control plane
    // does not trust yet.
    let first = other.client(&["proxy-c"], &[]);
    let (crt, key) = first.write(dir.path(), "proxy-c")?;
    let flags = [
        "--tls-cert".to_string(),
        path(&crt),
        "--tls-key".into(),
        path(&key),
        "--control-plane-ca".into(),
        path(&planes.ca_file),
        "--tls-reload-interval".into(),
        "200ms".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let state = tempfile::tempdir()?;
    let p = ProxyProc::start("proxy-c", &[cp.grpc_url()], state.path(), &s.logs, &flags)?;
    wait::until("the untrusted proxy to be refused", T, || async {
        let failed = cp
            .metric_value("holdfast_grpc_tls_handshake_failures_total")
            .await
            .map_err(|e| e.to_string())?;
        Ok((failed >= 1.0).then_some(()))
    })
    .await?;
    assert_eq!(p.admin_get("/readyz").await?.0, 503);

    // cert-manager adds the new CA to the bundle: the proxy gets in on its next try.
    std::fs::write(
        &client_ca,
        format!("{}{}", planes.ca.cert_pem, other.cert_pem),
    )?;
    let grpc = cp.grpc;
    let serial_of_proxy = move || async move {
        let v = call(grpc, "holdfast.v1.Admin/ListProxies", "{}")?;
        anyhow::Ok(
            v["proxies"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["id"] == "proxy-c")
                .map(|p| p["certificateSerial"].as_str().unwrap_or("").to_owned()),
        )
    };
    let seen = wait::until(
        "the proxy connected after the client CA reload",
        T,
        || async { serial_of_proxy().await.map_err(|e| e.to_string()) },
    )
    .await?;
    assert_eq!(seen, first.serial());
    p.wait_ready(T).await?;

    // The proxy's certificate is renewed in place; the stream it has stays, and its next
    // connection (here: after the control plane restarts) presents the new certificate.
    let renewed = other.client(&["proxy-c"], &[]);
    renewed.write(dir.path(), "proxy-c")?;
    wait::until("the proxy to reload its files", T, || async {
        let n = p
            .metric_value("holdfast_proxy_tls_reloads_total")
            .await
            .map_err(|e| e.to_string())?;
        Ok((n >= 1.0).then_some(()))
    })
    .await?;
    assert_eq!(serial_of_proxy().await?, Some(first.serial()));
    let mut cp = cp;
    cp.restart()?;
    wait::until(
        "the proxy to reconnect with its renewed certificate",
        T,
        || async {
            let serial = serial_of_proxy().await.map_err(|e| e.to_string())?;
            Ok((serial == Some(renewed.serial())).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Only proxy identities stream routes: an identity outside `--proxy-identities` is
/// refused even when it proves its node id, and the operator's certificate, claiming its
/// own identity as the node id, gets PERMISSION_DENIED and never a snapshot (which would
/// carry certificates' private keys).
#[tokio::test]
async fn only_identities_matching_proxy_identities_stream_routes_and_never_an_operator()
-> anyhow::Result<()> {
    let s = setup("mtlsproxyids").await?;
    let planes = Planes::get();
    let p = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let (crt, key) = planes.server.clone();
    let cp = s.control_plane(&[
        "--tls-cert",
        &p(&crt),
        "--tls-key",
        &p(&key),
        "--client-ca",
        &p(&planes.ca_file),
        "--admin-identities",
        OPERATOR,
        "--proxy-identities",
        "edge-*",
    ])?;
    let url = cp.grpc_url();
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
    let tls_of = |id: &str| {
        let (c, k) = planes.proxy(id);
        client_tls(&planes.ca.cert_pem, Some((read(&c), read(&k))))
    };
    first_response(&url, tls_of("edge-1"), "edge-1").await?;
    let outside = first_response(&url, tls_of("other-1"), "other-1")
        .await
        .unwrap_err();
    assert_eq!(outside.code(), tonic::Code::PermissionDenied, "{outside}");
    let operator = client_tls(
        &planes.ca.cert_pem,
        Some((read(&planes.operator.0), read(&planes.operator.1))),
    );
    let denied = first_response(&url, operator, OPERATOR).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied}");
    // A certificate that proves an operator identity never streams, even under a node id
    // it also proves that matches the pattern.
    let both = planes.ca.client(&["edge-9"], &[OPERATOR]);
    let both = client_tls(
        &planes.ca.cert_pem,
        Some((both.cert_pem.clone(), both.key_pem.clone())),
    );
    let denied = first_response(&url, both, "edge-9").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied}");
    // Even with a pattern that matches everything, the operator's identity never streams.
    drop(cp);
    let cp = s.control_plane(&[])?;
    let operator = client_tls(
        &planes.ca.cert_pem,
        Some((read(&planes.operator.0), read(&planes.operator.1))),
    );
    let denied = first_response(&cp.grpc_url(), operator, OPERATOR)
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied}");
    Ok(())
}

/// Peak resident memory of a process (`VmHWM` of /proc/<pid>/status), in bytes.
fn peak_rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}

/// A first request, already encoded: node `proxy-a`, stating version `1-x`, with
/// `entries` tiny inventory entries (2 bytes each on the wire: about 80 in memory once
/// decoded). Built as bytes, so the test itself never holds the decoded form.
fn tiny_inventory(entries: usize) -> bytes::Bytes {
    use prost::Message;
    let head = DiscoveryRequest {
        node: Some(Node {
            id: "proxy-a".into(),
            zone: String::new(),
        }),
        accepts_deltas: true,
        version_info: "1-x".into(),
        ..Default::default()
    };
    let mut out = head.encode_to_vec();
    // Field 8 (inventory), wire type 2, length 0: an empty ResourceHash.
    out.extend(std::iter::repeat_n([0x42u8, 0x00], entries).flatten());
    out.into()
}

/// A message whose encoding is given as bytes.
#[derive(Debug, Default, Clone)]
struct Raw(bytes::Bytes);

impl prost::Message for Raw {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = bytes::Bytes::new();
    }
}

/// Sends `request` (encoded) as the first message of a stream over `tls` and returns the
/// status the stream ends with (or its first response, as Ok).
async fn send_first(
    url: &str,
    tls: tonic::transport::ClientTlsConfig,
    request: bytes::Bytes,
) -> Result<(), tonic::Status> {
    let channel = tls_channel(url, tls).await?;
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(64 << 20);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Raw, holdfast_proto::wire::DiscoveryResponse>::default();
    let path = http::uri::PathAndQuery::from_static("/holdfast.v1.RouteDiscovery/StreamRoutes");
    let stream = tokio_stream::once(Raw(request));
    let mut inbound =
        tokio::time::timeout(T, grpc.streaming(tonic::Request::new(stream), path, codec))
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no response head"))??
            .into_inner();
    tokio::time::timeout(T, inbound.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no response"))??
        .map(|_| ())
        .ok_or_else(|| tonic::Status::cancelled("stream closed"))
}

/// Whatever an unauthenticated peer sends is refused before it is read: a 30 MiB
/// inventory of tiny entries (millions of them, gigabytes once decoded) from a client
/// without a certificate leaves the control plane's peak memory within 20 MiB. From a
/// real proxy identity, an inventory over the entry cap is refused before decoding too,
/// and a stream that never sends its first request is ended after the deadline.
#[tokio::test]
async fn an_unauthenticated_inventory_is_never_read_and_inventories_are_capped_by_entries()
-> anyhow::Result<()> {
    let s = setup("mtlsinventory").await?;
    let cp = s.control_plane(&[])?;
    let url = cp.grpc_url();
    let planes = Planes::get();
    // Ready, with a first snapshot built: what follows is the stream's cost alone.
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
    let (a_cert, a_key) = planes.proxy("proxy-a");
    let proxy_tls = client_tls(&planes.ca.cert_pem, Some((read(&a_cert), read(&a_key))));
    first_response(&url, proxy_tls.clone(), "proxy-a").await?;
    let pid = cp.proc.pid().ok_or_else(|| anyhow::anyhow!("no pid"))?;
    let before = peak_rss(pid)?;

    let request = tiny_inventory(15 << 20);
    let refused = send_first(&url, client_tls(&planes.ca.cert_pem, None), request)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
    let grown = peak_rss(pid)?.saturating_sub(before);
    assert!(
        grown < 20 << 20,
        "peak RSS grew by {} MiB for an unauthenticated inventory",
        grown >> 20
    );

    // An authenticated proxy over the entry cap: refused, counted on the wire first.
    let over = holdfast_control_plane::discovery::MAX_INVENTORY_ENTRIES + 1;
    let refused = send_first(&url, proxy_tls.clone(), tiny_inventory(over))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");

    // A stream whose first request never comes ends after the deadline (and no sooner).
    let channel = tonic::transport::Endpoint::from_shared(url.clone())?
        .tls_config(proxy_tls)?
        .connect()
        .await?;
    let mut client = holdfast_proto::client::route_discovery(channel);
    let (tx, rx) = tokio::sync::mpsc::channel::<DiscoveryRequest>(1);
    let started = std::time::Instant::now();
    let deadline = holdfast_control_plane::discovery::FIRST_REQUEST_TIMEOUT;
    let ended = tokio::time::timeout(deadline + T, async {
        let mut inbound = client
            .stream_routes(ReceiverStream::new(rx))
            .await?
            .into_inner();
        inbound.message().await.map(|_| ())
    })
    .await
    .expect("the stream ended within the deadline and a margin");
    drop(tx);
    let status = ended.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status}");
    assert!(
        started.elapsed() >= deadline,
        "ended after {:?}",
        started.elapsed()
    );
    Ok(())
}

/// Peers without a client certificate (health and reflection answer them) hold at most
/// `UNAUTHENTICATED_PER_PEER` connections per address: of 12 from one address exactly 4
/// are closed at once, while another address still gets in and a proxy still streams.
/// Handshakes in progress are capped per address the same way, and health and reflection
/// refuse a large message by its size.
#[tokio::test]
async fn connections_without_a_certificate_are_capped_per_address() -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let s = setup("mtlsunauth").await?;
    let cp = s.control_plane(&[])?;
    let url = cp.grpc_url();
    let planes = Planes::get();
    let mut roots = rustls::RootCertStore::empty();
    {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        for c in CertificateDer::pem_slice_iter(planes.ca.cert_pem.as_bytes()) {
            roots.add(c?)?;
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let per_peer = holdfast_control_plane::authn::UNAUTHENTICATED_PER_PEER;
    let mut conns = Vec::new();
    for _ in 0..per_peer + 4 {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(([127, 0, 0, 5], 0).into())?;
        let tcp = socket.connect(cp.grpc).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        conns.push(connector.connect(name, tcp).await?);
    }
    // Each connection: closed by the server within 2 s (EOF or an error), or still open.
    let closed = futures::future::join_all(conns.iter_mut().map(|c| async move {
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout(std::time::Duration::from_secs(2), c.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0) | Err(_)) => return true,
                // The server's SETTINGS and the like: still open.
                Ok(Ok(_)) => continue,
            }
        }
    }))
    .await;
    let closed = closed.iter().filter(|c| **c).count();
    assert_eq!(
        closed,
        4,
        "of {} connections without a certificate",
        per_peer + 4
    );
    // Handshakes in progress are capped per address too: of 12 connections from another
    // address that never start theirs, exactly 4 are closed at once.
    let handshakes = holdfast_control_plane::authn::HANDSHAKES_PER_PEER;
    let mut silent = Vec::new();
    for _ in 0..handshakes + 4 {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(([127, 0, 0, 6], 0).into())?;
        silent.push(socket.connect(cp.grpc).await?);
    }
    let closed = futures::future::join_all(silent.iter_mut().map(|c| async move {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(std::time::Duration::from_secs(2), c.read(&mut buf)).await {
            Err(_) => false,
            Ok(Ok(0) | Err(_)) => true,
            Ok(Ok(_)) => false,
        }
    }))
    .await;
    assert_eq!(
        closed.iter().filter(|c| **c).count(),
        4,
        "of {} silent connections from one address",
        handshakes + 4
    );
    // What anyone may call decodes small messages only: a health check naming a 1 MiB
    // service is refused by its size, not read (without the limit: NOT_FOUND).
    let channel = tonic::transport::Endpoint::from_shared(url.clone())?
        .tls_config(client_tls(&planes.ca.cert_pem, None))?
        .connect()
        .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let big = tonic_health::pb::HealthCheckRequest {
        service: "x".repeat(1 << 20),
    };
    let refused = health.check(big).await.unwrap_err();
    assert!(
        matches!(
            refused.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{refused}"
    );
    let small = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    health.check(small).await?;
    drop(silent);
    // Another address (127.0.0.1) still gets in without a certificate: its route stream is
    // refused by the server, with a gRPC status (so it got a connection).
    let refused = first_response(&url, client_tls(&planes.ca.cert_pem, None), "proxy-a")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
    let (cert, key) = planes.proxy("proxy-a");
    first_response(
        &url,
        client_tls(&planes.ca.cert_pem, Some((read(&cert), read(&key)))),
        "proxy-a",
    )
    .await?;
    drop(conns);
    Ok(())
}
