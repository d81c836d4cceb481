//! Kubernetes objects the tests create, and small API helpers.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Our controller name.
pub const CONTROLLER: &str = "holdfast.dev/ingress-controller";

fn typed<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

/// An IngressClass of our controller.
pub fn ingress_class(name: &str) -> IngressClass {
    typed(json!({ "metadata": { "name": name }, "spec": { "controller": CONTROLLER } }))
}

/// A Service `name` with one port `port` named "http" targeting `target`.
pub fn service(name: &str, port: i32, target: i32) -> Service {
    typed(json!({
        "metadata": { "name": name },
        "spec": { "ports": [{ "name": "http", "port": port, "targetPort": target }] }
    }))
}

/// An EndpointSlice for Service `svc` with ready `addresses` on port "http" = `port`.
pub fn endpoint_slice(name: &str, svc: &str, port: i32, addresses: &[&str]) -> EndpointSlice {
    typed(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/service-name": svc } },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": port, "protocol": "TCP" }],
        "endpoints": addresses.iter().map(|a| json!({
            "addresses": [a], "conditions": { "ready": true }
        })).collect::<Vec<_>>()
    }))
}

/// An Ingress of class `class` routing `host` + Prefix `/` to `svc`:`port`.
pub fn ingress(name: &str, class: &str, host: &str, svc: &str, port: i32) -> Ingress {
    ingress_paths(name, class, host, &[("/", "Prefix", svc, port)])
}

/// An Ingress of class `class` with paths `(path, pathType, service, port)` on `host`.
pub fn ingress_paths(
    name: &str,
    class: &str,
    host: &str,
    paths: &[(&str, &str, &str, i32)],
) -> Ingress {
    typed(json!({
        "metadata": { "name": name },
        "spec": {
            "ingressClassName": class,
            "rules": [{ "host": host, "http": { "paths": paths.iter().map(|(p, t, s, port)| json!({
                "path": p, "pathType": t,
                "backend": { "service": { "name": s, "port": { "number": port } } }
            })).collect::<Vec<_>>() } }]
        }
    }))
}

/// Creates `obj` in `ns` (or cluster-wide when `ns` is None).
pub async fn create<K>(client: &kube::Client, ns: Option<&str>, obj: &K) -> anyhow::Result<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::default_namespaced(client.clone()),
    };
    Ok(api.create(&PostParams::default(), obj).await?)
}

/// Creates, in `ns`, Service `web` (port 80 to 8080), its EndpointSlice `web-1` with
/// `addresses`, and Ingress `ingress` of class `class` routing `host` to it.
pub async fn create_web(
    client: &kube::Client,
    ns: &str,
    addresses: &[&str],
    ingress: &str,
    class: &str,
    host: &str,
) -> anyhow::Result<()> {
    create(client, Some(ns), &service("web", 80, 8080)).await?;
    create(
        client,
        Some(ns),
        &endpoint_slice("web-1", "web", 8080, addresses),
    )
    .await?;
    create(
        client,
        Some(ns),
        &self::ingress(ingress, class, host, "web", 80),
    )
    .await?;
    Ok(())
}

/// Creates a cluster-scoped IngressClass of our controller.
pub async fn create_class(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    Api::<IngressClass>::all(client.clone())
        .create(&PostParams::default(), &ingress_class(name))
        .await?;
    Ok(())
}

/// Deletes `name` of kind `K` in `ns`.
pub async fn delete<K>(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// A `kubernetes.io/tls` Secret with `cert_pem` and `key_pem`.
pub fn tls_secret(name: &str, cert_pem: &str, key_pem: &str) -> k8s_openapi::api::core::v1::Secret {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "type": "kubernetes.io/tls",
        "stringData": { "tls.crt": cert_pem, "tls.key": key_pem }
    }))
    .expect("a valid Secret")
}

/// Ingress `name` of `class` routing `host` `/` to `svc:port`, serving `host` over HTTPS
/// with Secret `secret`, with `annotations`.
pub fn tls_ingress(
    name: &str,
    class: &str,
    host: &str,
    svc: &str,
    port: i32,
    secret: &str,
    annotations: serde_json::Value,
) -> Ingress {
    let mut ing = ingress(name, class, host, svc, port);
    let mut v = serde_json::to_value(&ing).expect("serialisable");
    v["spec"]["tls"] = serde_json::json!([{ "hosts": [host], "secretName": secret }]);
    v["metadata"]["annotations"] = annotations;
    ing = serde_json::from_value(v).expect("a valid Ingress");
    ing
}

/// Waits for a Warning Event with `reason` on Ingress `name` in `ns`.
pub async fn warning_event(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    name: &str,
) -> anyhow::Result<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let event = crate::wait::until(
        &format!("a {reason} Event on {ns}/{name}"),
        crate::wait::T,
        || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(list.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                }))
            }
        },
    )
    .await?;
    anyhow::ensure!(event.type_.as_deref() == Some("Warning"), "{event:?}");
    Ok(event)
}
