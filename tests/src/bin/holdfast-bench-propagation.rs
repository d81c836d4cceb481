//! `holdfast-bench-propagation`: how long a new HTTPRoute takes to be served, on the real
//! stack: a private kube-apiserver and etcd, the control plane, one proxy, a Gateway with
//! an HTTP listener, an echo backend in a test network namespace.
//!
//! It creates `--routes` HTTPRoutes (each its own hostname, to one Service) and waits until
//! the last is served, then `--probes` times creates one more HTTPRoute and measures the
//! time from the create request's answer to the first 200 for its hostname through the
//! proxy (polled on the Gateway's address every millisecond). Prints a markdown table:
//! p50, p99 and max. This is what gateway-api-bench calls route propagation.
//!
//! `cargo run -p holdfast-tests --bin holdfast-bench-propagation -- --routes 1000 --probes 100`

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::netns::TestNet;
use holdfast_tests::objects;
use holdfast_tests::proxy::ProxyProc;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};

/// Route propagation on the real stack.
#[derive(Parser, Debug)]
struct Args {
    /// HTTPRoutes present before the probes.
    #[arg(long, default_value_t = 1_000)]
    routes: usize,
    /// HTTPRoutes created and timed, one at a time.
    #[arg(long, default_value_t = 100)]
    probes: usize,
}

fn api(client: &kube::Client, ns: Option<&str>, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

fn object(v: serde_json::Value) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(v)?)
}

fn route(name: &str, host: &str) -> serde_json::Value {
    serde_json::json!({ "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": { "name": name },
        "spec": { "parentRefs": [{ "name": "gw" }], "hostnames": [host],
                  "rules": [{ "backendRefs": [{ "name": "echo", "port": 80 }] }] } })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Polls `host` on `gateway` every millisecond until it answers 200 (at most `limit`).
async fn first_200(gateway: SocketAddr, host: &str, limit: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok((200, _)) = holdfast_tests::http::get(gateway, host, "/").await {
            return Ok(Instant::now());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{host} was not served within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cluster = tokio::task::spawn_blocking(LocalCluster::start).await??;
    cluster.install_gateway_api()?;
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "propagation").await?;
    let mut net = TestNet::create("prop")?;
    let echo = net.spawn_echo("echo", 8080)?.ip().to_string();
    objects::create(&client, Some(&ns), &objects::service("echo", 80, 8080)).await?;
    objects::create(
        &client,
        Some(&ns),
        &objects::endpoint_slice("echo-1", "echo", 8080, &[&echo]),
    )
    .await?;
    let class = format!("hf-{ns}");
    api(&client, None, "GatewayClass", "gatewayclasses")
        .create(
            &PostParams::default(),
            &object(
                serde_json::json!({ "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "GatewayClass", "metadata": { "name": class },
                "spec": { "controllerName": "holdfast.dev/gateway-controller" } }),
            )?,
        )
        .await?;
    api(&client, Some(&ns), "Gateway", "gateways")
        .create(
            &PostParams::default(),
            &object(
                serde_json::json!({ "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway", "metadata": { "name": "gw" },
                "spec": { "gatewayClassName": class,
                          "listeners": [{ "name": "http", "port": 8080, "protocol": "HTTP" }] } }),
            )?,
        )
        .await?;
    let routes = api(&client, Some(&ns), "HTTPRoute", "httproutes");
    let started = Instant::now();
    futures::stream::iter(0..args.routes)
        .map(|i| {
            let (routes, ns) = (routes.clone(), ns.clone());
            async move {
                let r = route(&format!("r-{i}"), &format!("r-{i}.{ns}.test"));
                routes.create(&PostParams::default(), &object(r)?).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let load = started.elapsed();

    let logs = holdfast_tests::e2e_logs(&ns)?;
    let cp = ControlPlane::start(
        "control-plane",
        &cluster.kubeconfig(),
        &logs,
        &[
            "--ingress-class",
            "none",
            "--gateway-address-pool",
            "127.92.0.0/16",
        ],
    )?;
    let state = tempfile::tempdir()?;
    let _proxy = ProxyProc::start("proxy-0", &[cp.grpc_url()], state.path(), &logs, &[])?;
    let gws = api(&client, Some(&ns), "Gateway", "gateways");
    let address = holdfast_tests::wait::until(
        "the Gateway's address",
        Duration::from_secs(120),
        || async {
            let gw = gws.get("gw").await.map_err(|e| e.to_string())?;
            Ok(gw.data["status"]["addresses"][0]["value"]
                .as_str()
                .map(str::to_owned))
        },
    )
    .await?;
    let gateway: SocketAddr = format!("{address}:8080").parse()?;
    let last = format!("r-{}.{ns}.test", args.routes.saturating_sub(1));
    first_200(gateway, &last, Duration::from_secs(300))
        .await
        .context("the routes present before the probes")?;
    // The leader writes every route's first status (one PATCH each, each a watch event
    // and a build): the probes start once that is done, in the steady state.
    let settling = Instant::now();
    holdfast_tests::wait::first_statuses_written(&cp, args.routes).await?;
    let settled = settling.elapsed();

    let mut times = Vec::with_capacity(args.probes);
    for j in 0..args.probes {
        let host = format!("p-{j}.{ns}.test");
        let r = route(&format!("p-{j}"), &host);
        routes.create(&PostParams::default(), &object(r)?).await?;
        let created = Instant::now();
        let served = first_200(gateway, &host, Duration::from_secs(60)).await?;
        times.push(served.saturating_duration_since(created));
    }
    times.sort();
    println!("| metric | value |");
    println!("| --- | --- |");
    println!(
        "| HTTPRoutes present | {} (created in {:.1} s) |",
        args.routes,
        load.as_secs_f64()
    );
    println!(
        "| then until every route's first status was written (the probes start then) | {:.1} s |",
        settled.as_secs_f64()
    );
    println!(
        "| new HTTPRoute → first 200 through the proxy, p50 ({} probes) | {:.0} ms |",
        args.probes,
        percentile(&times, 0.5).as_secs_f64() * 1e3
    );
    println!(
        "| new HTTPRoute → first 200, p99 | {:.0} ms |",
        percentile(&times, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "| new HTTPRoute → first 200, max | {:.0} ms |",
        percentile(&times, 1.0).as_secs_f64() * 1e3
    );
    drop(net);
    Ok(())
}
