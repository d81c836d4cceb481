//! `holdfast-bench-scale`: the control plane at scale, against a real local API server.
//!
//! Loads N Ingresses (each with a Service and an EndpointSlice), starts the real control
//! plane, connects M subscribers (real gRPC streams that ACK like proxies), then R times
//! changes one Ingress through the API server and measures the time until every subscriber
//! has ACKed a snapshot containing the change. Prints a markdown table: convergence
//! p50/p99, control-plane RSS, snapshot size, load time.
//!
//! With `--churn-per-second N`, it then changes N EndpointSlices per second for
//! `--churn-seconds` (each change a new endpoint address on one Service, as pod rollouts
//! do) and reports, per change, the time until every subscriber has ACKed a snapshot of
//! that cluster revision or newer, how far the last subscriber trails the first on each
//! version, and the control plane's CPU over the churn.
//!
//! With `--http-routes`, the N routes are HTTPRoutes (hostname `app-<i>.<ns>.test`, each to
//! its own Service) on one Gateway instead of Ingresses, and each round adds a rule to
//! HTTPRoute `app-0`: the same measurement for the Gateway API.
//!
//! With `--inventory-streams N`, it then opens N more streams, each stating a real inventory
//! (every resource of the published snapshot, as a proxy that held an older snapshot
//! states it when it reconnects) and never ACKing, so the control plane keeps each stated
//! inventory as that stream's delta base; it reports the control plane's memory per such
//! stream.
//!
//! Subscriber 0 decodes every snapshot and finds the version that carries the change. The
//! others are lightweight: they receive every response in full over their own stream but
//! parse only the version and nonce (decoding a 1.4 MB snapshot is each proxy's own cost on
//! its own machine; a thousand decodes in this one process would measure this process).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use holdfast_proto::client;
use holdfast_proto::v1::{DiscoveryRequest, Node};
use holdfast_tests::cluster::LocalCluster;
use holdfast_tests::control_plane::ControlPlane;
use holdfast_tests::objects::{self, create_class};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Control plane at scale.
#[derive(Parser, Debug)]
struct Args {
    /// Ingresses (each with its own Service and EndpointSlice).
    #[arg(long, default_value_t = 10_000)]
    ingresses: usize,
    /// Subscriber streams.
    #[arg(long, default_value_t = 1_000)]
    subscribers: usize,
    /// Streams per gRPC connection.
    #[arg(long, default_value_t = 50)]
    streams_per_connection: usize,
    /// Changes to measure.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Extra control-plane flags, e.g. "--debounce=20ms".
    #[arg(long, allow_hyphen_values = true)]
    cp_arg: Vec<String>,
    /// Subscribers accept deltas (as proxies do); without it, they take complete
    /// snapshots only.
    #[arg(long)]
    deltas: bool,
    /// EndpointSlice changes per second after the rounds (0: none).
    #[arg(long, default_value_t = 0)]
    churn_per_second: u32,
    /// How long the churn lasts, in seconds.
    #[arg(long, default_value_t = 60)]
    churn_seconds: u64,
    /// Streams opened at the end stating a real inventory (0: none).
    #[arg(long, default_value_t = 0)]
    inventory_streams: usize,
    /// HTTPRoutes on one Gateway instead of Ingresses.
    #[arg(long)]
    http_routes: bool,
}

/// The GatewayClass, Gateway and HTTPRoute kinds' group and version.
const GATEWAY_API: &str = "gateway.networking.k8s.io/v1";

/// HTTPRoute `name` for `host` on Gateway `gw`: one rule to Service `name` port 80 with a
/// PathPrefix match per path of `paths` (a rule takes up to 64 matches; a route only 16
/// rules).
fn http_route(name: &str, host: &str, paths: &[String]) -> serde_json::Value {
    let matches: Vec<serde_json::Value> = paths
        .iter()
        .map(|p| serde_json::json!({ "path": { "type": "PathPrefix", "value": p } }))
        .collect();
    serde_json::json!({ "apiVersion": GATEWAY_API, "kind": "HTTPRoute",
        "metadata": { "name": name },
        "spec": { "parentRefs": [{ "name": "gw" }], "hostnames": [host],
                  "rules": [{ "matches": matches, "backendRefs": [{ "name": name, "port": 80 }] }] } })
}

/// Creates `object` (any kind) in `ns` (None: cluster-scoped) through the dynamic API.
async fn create_dynamic(
    client: &kube::Client,
    ns: Option<&str>,
    kind: &str,
    plural: &str,
    object: serde_json::Value,
) -> anyhow::Result<()> {
    let gvk = kube::api::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind);
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<kube::api::DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let object: kube::api::DynamicObject = serde_json::from_value(object)?;
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// What the subscribers ACKed.
#[derive(Default)]
struct Seen {
    /// Per subscriber: (cluster revision of the version, when it was ACKed), in order.
    acks: Vec<Vec<(u64, Instant)>>,
    /// Subscriber 0's decoded snapshots: (cluster revision, paths on the marker host).
    decoded: Vec<(u64, usize)>,
}

impl Seen {
    /// The revision of the first snapshot subscriber 0 saw with `paths` on the marker host.
    fn revision_with(&self, paths: usize) -> Option<u64> {
        self.decoded
            .iter()
            .find(|(_, p)| *p == paths)
            .map(|(rev, _)| *rev)
    }

    /// When the last subscriber first ACKed revision `rev` or newer, once all have.
    fn all_acked(&self, rev: u64) -> Option<Instant> {
        self.first_acks(rev)
            .try_fold(None::<Instant>, |latest, t| Some(latest.max(Some(t?))))?
    }

    /// When the first subscriber ACKed revision `rev` or newer.
    fn first_acked(&self, rev: u64) -> Option<Instant> {
        self.first_acks(rev).flatten().min()
    }

    /// When each subscriber first ACKed revision `rev` or newer (its ACKs are in order).
    fn first_acks(&self, rev: u64) -> impl Iterator<Item = Option<Instant>> + '_ {
        self.acks.iter().map(move |acks| {
            let i = acks.partition_point(|(r, _)| *r < rev);
            acks.get(i).map(|(_, t)| *t)
        })
    }
}

/// A `DiscoveryResponse` read without its snapshot (field 3 is skipped, not parsed).
#[derive(Clone, PartialEq, prost::Message)]
struct VersionOnly {
    #[prost(string, tag = "1")]
    version_info: String,
    #[prost(string, tag = "2")]
    nonce: String,
}

/// The cluster revision in a version string `<revision>-<hash>`.
fn revision_of(version: &str) -> u64 {
    version
        .split_once('-')
        .and_then(|(rev, _)| rev.parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Each round adds a match to one rule; the HTTPRoute CRD allows 64 matches a rule.
    anyhow::ensure!(
        !args.http_routes || args.rounds <= 62,
        "--rounds {} with --http-routes: at most 62 (an HTTPRoute rule takes 64 matches)",
        args.rounds
    );
    let cluster = tokio::task::spawn_blocking(LocalCluster::start).await??;
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "scale").await?;
    let class = format!("hf-{ns}");
    create_class(&client, &class).await?;
    let marker = format!("app-0.{ns}.test");
    if args.http_routes {
        // kubectl, once: blocking this runtime thread for it is fine here.
        cluster.install_gateway_api()?;
        create_dynamic(
            &client,
            None,
            "GatewayClass",
            "gatewayclasses",
            serde_json::json!({ "apiVersion": GATEWAY_API, "kind": "GatewayClass",
                "metadata": { "name": format!("hf-{ns}") },
                "spec": { "controllerName": "holdfast.dev/gateway-controller" } }),
        )
        .await?;
        create_dynamic(
            &client,
            Some(&ns),
            "Gateway",
            "gateways",
            serde_json::json!({ "apiVersion": GATEWAY_API, "kind": "Gateway",
                "metadata": { "name": "gw" },
                "spec": { "gatewayClassName": format!("hf-{ns}"),
                          "listeners": [{ "name": "http", "port": 8080, "protocol": "HTTP" }] } }),
        )
        .await?;
    }

    let started = Instant::now();
    let (svcs, slices, ings): (Api<Service>, Api<EndpointSlice>, Api<Ingress>) = (
        Api::namespaced(client.clone(), &ns),
        Api::namespaced(client.clone(), &ns),
        Api::namespaced(client.clone(), &ns),
    );
    futures::stream::iter(0..args.ingresses)
        .map(|i| {
            let (svcs, slices, ings, class, ns) = (
                svcs.clone(),
                slices.clone(),
                ings.clone(),
                class.clone(),
                ns.clone(),
            );
            let (client, http_routes) = (client.clone(), args.http_routes);
            async move {
                let name = format!("app-{i}");
                let ip = format!("10.{}.{}.{}", 100 + (i >> 16), (i >> 8) & 255, i & 255);
                let pp = PostParams::default();
                // Headless: a ClusterIP would be allocated from the local API server's
                // /16 range, which slows as it fills and runs out at 65,534 Services.
                // The control plane routes to EndpointSlices, never to the ClusterIP.
                let mut svc = objects::service(&name, 80, 8080);
                if let Some(spec) = svc.spec.as_mut() {
                    spec.cluster_ip = Some("None".into());
                }
                svcs.create(&pp, &svc).await?;
                slices
                    .create(
                        &pp,
                        &objects::endpoint_slice(&format!("{name}-1"), &name, 8080, &[&ip]),
                    )
                    .await?;
                let host = format!("{name}.{ns}.test");
                if http_routes {
                    let route = http_route(&name, &host, &["/".to_string()]);
                    create_dynamic(&client, Some(&ns), "HTTPRoute", "httproutes", route).await?;
                } else {
                    ings.create(&pp, &objects::ingress(&name, &class, &host, &name, 80))
                        .await?;
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let load = started.elapsed();
    let kind = if args.http_routes {
        "HTTPRoute"
    } else {
        "Ingress"
    };
    eprintln!(
        "loaded {} {kind}s/Services/EndpointSlices in {load:?}",
        args.ingresses
    );

    let logs = holdfast_tests::e2e_logs(&ns)?;
    // Plaintext: these lightweight subscribers share connections across many node ids,
    // which mutual TLS (one identity per certificate) would refuse; TLS adds a handshake
    // per connection and encryption of the same shared bytes, not per-change work.
    let mut cp_args = vec![
        "--ingress-class".to_string(),
        class.clone(),
        "--insecure-plaintext".to_string(),
    ];
    if args.http_routes {
        cp_args.extend([
            "--gateway-address-pool".to_string(),
            "127.91.0.0/16".to_string(),
        ]);
    }
    cp_args.extend(args.cp_arg.iter().cloned());
    let cp_refs: Vec<&str> = cp_args.iter().map(String::as_str).collect();
    let cp_started = Instant::now();
    let cp = ControlPlane::start("control-plane", &cluster.kubeconfig(), &logs, &cp_refs)?;
    let pid = cp.proc.pid().context("control plane pid")?;

    // Subscribers: M streams over M / streams_per_connection connections.
    let seen = Arc::new(Mutex::new(Seen {
        acks: vec![Vec::new(); args.subscribers],
        decoded: Vec::new(),
    }));
    let stopping = Arc::new(AtomicBool::new(false));
    let reconnects = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut channels = Vec::new();
    for _ in 0..args.subscribers.div_ceil(args.streams_per_connection) {
        channels.push(
            client::endpoint(tonic::transport::Endpoint::from_shared(cp.grpc_url())?)
                .connect()
                .await?,
        );
    }
    let deltas = args.deltas;
    for sub in 0..args.subscribers {
        let channel = channels[sub / args.streams_per_connection].clone();
        let (seen, marker, stopping) = (seen.clone(), marker.clone(), stopping.clone());
        let http_routes = args.http_routes;
        let reconnects = reconnects.clone();
        tokio::spawn(async move {
            // As a proxy does, a subscriber whose stream ends opens a new one (and, holding
            // no inventory, gets the complete snapshot again). Streams end when the control
            // plane stops after the run.
            for attempt in 0u64.. {
                let result = if sub == 0 {
                    decoding_subscriber(
                        channel.clone(),
                        seen.clone(),
                        marker.clone(),
                        deltas,
                        http_routes,
                    )
                    .await
                } else {
                    light_subscriber(channel.clone(), sub, seen.clone(), deltas).await
                };
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                reconnects.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = result {
                    eprintln!("subscriber {sub}: {e:#}; opening a new stream");
                }
                let jitter = (sub as u64 * 7 + attempt * 13) % 500;
                tokio::time::sleep(Duration::from_millis(100 + jitter)).await;
            }
        });
    }
    let wait_for = |what: String, limit: Duration, paths: usize| {
        let seen = seen.clone();
        async move {
            let deadline = Instant::now() + limit;
            loop {
                {
                    let s = seen.lock().expect("lock");
                    if let Some(rev) = s.revision_with(paths)
                        && let Some(last) = s.all_acked(rev)
                    {
                        return Ok((s.first_acked(rev).unwrap_or(last), last));
                    }
                }
                anyhow::ensure!(Instant::now() < deadline, "{what} did not converge");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    wait_for("the first snapshot".into(), Duration::from_secs(600), 1).await?;
    let first = cp_started.elapsed();
    let bytes = cp
        .proc
        .log()
        .lines()
        .rev()
        .find(|l| l.contains("published snapshot"))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("bytes="))
                .map(str::to_owned)
        })
        .unwrap_or_default();

    // The leader writes every HTTPRoute's first status (one PATCH each, so thousands of
    // watch events): measured once that is done, the steady state a change meets.
    let mut status_settled = None;
    if args.http_routes {
        holdfast_tests::wait::first_statuses_written(&cp, args.ingresses).await?;
        status_settled = Some(cp_started.elapsed());
    }

    // Each round adds one path to the marker Ingress and waits for every subscriber.
    let sent_before = cp.metric_value("holdfast_sent_bytes_total").await?;
    let mut times = Vec::new();
    // The API server's part (the PATCH answered) and what follows (watch, build, send,
    // ACKs): the two parts of each round, reported apart.
    let (mut api_times, mut after_times) = (Vec::new(), Vec::new());
    // PATCH answered → the first subscriber ACKed: the pipeline before the fan-out spread.
    let mut first_times = Vec::new();
    let builds = "holdfast_snapshot_build_duration_seconds";
    let build_before = (
        cp.metric_value(&format!("{builds}_sum")).await?,
        cp.metric_value(&format!("{builds}_count")).await?,
    );
    for round in 0..args.rounds {
        let paths: Vec<serde_json::Value> = (0..=round + 1)
            .map(|p| {
                let path = if p == 0 {
                    "/".to_string()
                } else {
                    format!("/r{p}")
                };
                serde_json::json!({ "path": path, "pathType": "Prefix",
                    "backend": { "service": { "name": "app-0", "port": { "number": 80 } } } })
            })
            .collect();
        let t0 = Instant::now();
        if args.http_routes {
            let paths: Vec<String> = (0..=round + 1)
                .map(|p| {
                    if p == 0 {
                        "/".to_string()
                    } else {
                        format!("/r{p}")
                    }
                })
                .collect();
            let route = http_route("app-0", &marker, &paths);
            let gvk =
                kube::api::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute");
            let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "httproutes");
            let api: Api<kube::api::DynamicObject> =
                Api::namespaced_with(client.clone(), &ns, &resource);
            let patch = serde_json::json!({ "spec": route["spec"] });
            api.patch("app-0", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        } else {
            let patch = serde_json::json!({ "spec": { "rules": [{ "host": marker, "http": { "paths": paths } }] } });
            ings.patch("app-0", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        let answered = Instant::now();
        let (first, done) =
            wait_for(format!("round {round}"), Duration::from_secs(60), round + 2).await?;
        first_times.push(first.saturating_duration_since(answered));
        times.push(done.saturating_duration_since(t0));
        api_times.push(answered.saturating_duration_since(t0));
        after_times.push(done.saturating_duration_since(answered));
    }
    let build_after = (
        cp.metric_value(&format!("{builds}_sum")).await?,
        cp.metric_value(&format!("{builds}_count")).await?,
    );
    let build_count = build_after.1 - build_before.1;
    let build_mean = (build_after.0 - build_before.0) / build_count.max(1.0);
    times.sort();
    api_times.sort();
    after_times.sort();
    first_times.sort();
    let sent = cp.metric_value("holdfast_sent_bytes_total").await? - sent_before;
    let churn = if args.churn_per_second > 0 {
        Some(churn(&args, &slices, pid, &seen).await?)
    } else {
        None
    };
    let per_change = sent / (args.rounds.max(1) * args.subscribers) as f64;
    let (rss, hwm) = (rss_kib(pid, "VmRSS:"), rss_kib(pid, "VmHWM:"));
    let inventories = if args.inventory_streams > 0 {
        Some(inventory_streams(&cp.grpc_url(), args.inventory_streams, pid).await?)
    } else {
        None
    };
    println!("| metric | value |");
    println!("| --- | --- |");
    println!(
        "| {kind}s / Services / EndpointSlices | {} each (loaded in {:.1} s) |",
        args.ingresses,
        load.as_secs_f64()
    );
    println!(
        "| subscribers (streams / connections) | {} / {} |",
        args.subscribers,
        channels.len()
    );
    println!(
        "| streams that ended and were opened again | {} |",
        reconnects.load(Ordering::Relaxed)
    );
    println!("| snapshot size | {bytes} bytes |");
    println!(
        "| subscribers accept deltas | {} |",
        if args.deltas { "yes" } else { "no" }
    );
    println!("| bytes sent per subscriber per change | {per_change:.0} |");
    println!(
        "| control-plane start to all subscribers on the first snapshot | {:.2} s |",
        first.as_secs_f64()
    );
    println!(
        "| one {kind} change → all ACKed, p50 ({} rounds) | {:.0} ms |",
        args.rounds,
        percentile(&times, 0.5).as_secs_f64() * 1e3
    );
    println!(
        "| one {kind} change → all ACKed, p99 | {:.0} ms |",
        percentile(&times, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "| of which the API server answering the PATCH, p50 / p99 | {:.0} / {:.0} ms |",
        percentile(&api_times, 0.5).as_secs_f64() * 1e3,
        percentile(&api_times, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "| PATCH answered → all ACKed, p50 / p99 | {:.0} / {:.0} ms |",
        percentile(&after_times, 0.5).as_secs_f64() * 1e3,
        percentile(&after_times, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "| PATCH answered → the first subscriber ACKed, p50 / p99 | {:.0} / {:.0} ms |",
        percentile(&first_times, 0.5).as_secs_f64() * 1e3,
        percentile(&first_times, 0.99).as_secs_f64() * 1e3
    );
    if let Some(t) = status_settled {
        println!(
            "| control-plane start to every HTTPRoute's first status written (rounds start then) | {:.1} s |",
            t.as_secs_f64()
        );
    }
    println!(
        "| builds during the rounds, and their mean time | {build_count:.0}, {:.1} ms |",
        build_mean * 1e3
    );
    println!(
        "| control-plane RSS now / peak | {} MiB / {} MiB |",
        rss / 1024,
        hwm / 1024
    );
    if let Some(c) = churn {
        println!(
            "| churn: EndpointSlice changes made (target {}/s for {} s) | {} in {:.1} s |",
            args.churn_per_second,
            args.churn_seconds,
            c.changes,
            c.elapsed.as_secs_f64()
        );
        println!(
            "| churn: change → all ACKed, p50 / p99 / max | {:.0} / {:.0} / {:.0} ms |",
            c.latency[0] * 1e3,
            c.latency[1] * 1e3,
            c.latency[2] * 1e3
        );
        println!(
            "| churn: last subscriber behind the first on a version, p99 / max | {:.0} / {:.0} ms |",
            c.spread[0] * 1e3,
            c.spread[1] * 1e3
        );
        println!("| churn: control-plane CPU | {:.2} cores |", c.cpu_cores);
        println!("| churn: versions published | {} |", c.versions);
    }
    if let Some((entries, per_stream)) = inventories {
        println!(
            "| control-plane memory per stream stating a real inventory ({} streams, {entries} entries each) | {per_stream:.0} KiB |",
            args.inventory_streams
        );
    }
    stopping.store(true, Ordering::Relaxed);
    drop(cp);
    drop(cluster);
    Ok(())
}

/// Opens `n` streams that state the inventory of the published snapshot (as proxies that
/// held an older snapshot do when they reconnect) and never ACK: the control plane keeps
/// each stated inventory as the stream's delta base. Returns the entries stated and the
/// control plane's resident memory per stream (KiB), measured once every stream has had
/// its answer.
async fn inventory_streams(url: &str, n: usize, pid: u32) -> anyhow::Result<(usize, f64)> {
    let channel = client::endpoint(tonic::transport::Endpoint::from_shared(url.to_owned())?)
        .connect()
        .await?;
    // The published snapshot, whole, once.
    let (node, tx, rx) = open(usize::MAX, false).await;
    let mut source = client::route_discovery(channel.clone())
        .stream_routes(rx)
        .await?
        .into_inner();
    let response = source.message().await?.context("the published snapshot")?;
    let snapshot = response
        .into_snapshot()
        .context("a complete snapshot, not a delta")?;
    drop((node, tx, source));
    let inventory = holdfast_proto::delta::to_wire(&holdfast_proto::delta::inventory(&snapshot));
    let entries = inventory.len();
    let before = rss_kib(pid, "VmRSS:");
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let (tx, rx) = mpsc::channel(1);
        tx.try_send(DiscoveryRequest {
            node: Some(Node {
                id: format!("inventory-{i}"),
                zone: String::new(),
            }),
            accepts_deltas: true,
            // An older snapshot than the published one: its inventory is kept as the base.
            version_info: "1-0000000000000000".into(),
            content_hash: "0".repeat(64),
            inventory: inventory.clone(),
            ..Default::default()
        })
        .expect("room for the first request");
        let mut stream = client::route_discovery(channel.clone())
            .stream_routes(ReceiverStream::new(rx))
            .await?
            .into_inner();
        stream
            .message()
            .await?
            .context("an answer to the stated inventory")?;
        held.push((tx, stream));
    }
    let after = rss_kib(pid, "VmRSS:");
    drop(held);
    Ok((entries, after.saturating_sub(before) as f64 / n as f64))
}

/// Opens a stream as node `bench-<sub>` and sends the first request.
async fn open(
    sub: usize,
    deltas: bool,
) -> (
    Node,
    mpsc::Sender<DiscoveryRequest>,
    ReceiverStream<DiscoveryRequest>,
) {
    let (tx, rx) = mpsc::channel(4);
    let node = Node {
        id: format!("bench-{sub}"),
        zone: String::new(),
    };
    let first = DiscoveryRequest {
        node: Some(node.clone()),
        accepts_deltas: deltas,
        ..Default::default()
    };
    tx.try_send(first).expect("room for the first request");
    (node, tx, ReceiverStream::new(rx))
}

/// The ACK a proxy sends for `version` / `nonce`.
fn ack(node: &Node, version: String, nonce: String) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(node.clone()),
        version_info: version,
        response_nonce: nonce,
        ..Default::default()
    }
}

/// Decodes every snapshot (applying deltas as a proxy does), records its paths on the
/// marker host, and ACKs.
async fn decoding_subscriber(
    channel: tonic::transport::Channel,
    seen: Arc<Mutex<Seen>>,
    marker: String,
    deltas: bool,
    http_routes: bool,
) -> anyhow::Result<()> {
    let (node, tx, requests) = open(0, deltas).await;
    let mut stream = client::route_discovery(channel)
        .stream_routes(requests)
        .await?
        .into_inner();
    // Held as a proxy holds it (`delta::Held`): a delta is checked and applied in
    // O(change). `delta::apply` (the O(snapshot) reference) would hash all 30,000
    // resources again per change, blocking one of this process's two runtime threads for
    // tens of milliseconds and delaying the other subscribers' ACKs: this process's cost,
    // not the control plane's.
    let mut held: Option<holdfast_proto::delta::Held> = None;
    while let Some(mut resp) = stream.message().await? {
        let nonce = resp.nonce.clone();
        match (resp.delta.take(), held.as_mut()) {
            (Some(change), Some(h)) => {
                let checked = h.check(&change)?;
                h.commit(&change, checked);
            }
            (Some(_), None) => anyhow::bail!("a delta before any snapshot"),
            (None, _) => {
                let snap = resp
                    .into_snapshot()
                    .context("response without a snapshot")?;
                let hashed = holdfast_proto::delta::Hashed::verified(&snap)?;
                held = Some(holdfast_proto::delta::Held::new(snap, hashed));
            }
        }
        let snap = held.as_ref().context("a snapshot is held")?;
        let paths = if http_routes {
            snap.gateway_hosts()
                .find(|g| g.host == marker)
                .map_or(0, |g| g.routes.len())
        } else {
            // Ingress hosts come in the one route model (a Gateway host of listener
            // `ingress`); an older control plane's as a virtual host.
            let name = holdfast_proto::snapshot::gateway_host_name(
                holdfast_proto::snapshot::INGRESS_LISTENER,
                &marker,
            );
            snap.gateway_host(&name)
                .map(|g| g.routes.len())
                .or_else(|| snap.virtual_host(&marker).map(|v| v.routes.len()))
                .unwrap_or(0)
        };
        let rev = snap.cluster_revision();
        let version = snap.version().to_owned();
        tx.send(ack(&node, version, nonce)).await?;
        let mut s = seen.lock().expect("lock");
        s.acks[0].push((rev, Instant::now()));
        s.decoded.push((rev, paths));
    }
    Ok(())
}

/// Receives every response, parses only version and nonce, and ACKs.
async fn light_subscriber(
    channel: tonic::transport::Channel,
    sub: usize,
    seen: Arc<Mutex<Seen>>,
    deltas: bool,
) -> anyhow::Result<()> {
    let (node, tx, requests) = open(sub, deltas).await;
    let mut grpc =
        tonic::client::Grpc::new(channel).max_decoding_message_size(client::MAX_RESPONSE_BYTES);
    grpc.ready().await?;
    let codec = tonic_prost::ProstCodec::<DiscoveryRequest, VersionOnly>::default();
    let path = http::uri::PathAndQuery::from_static("/holdfast.v1.RouteDiscovery/StreamRoutes");
    let mut stream = grpc
        .streaming(tonic::Request::new(requests), path, codec)
        .await?
        .into_inner();
    while let Some(resp) = stream.message().await? {
        let rev = revision_of(&resp.version_info);
        tx.send(ack(&node, resp.version_info, resp.nonce)).await?;
        seen.lock().expect("lock").acks[sub].push((rev, Instant::now()));
    }
    Ok(())
}

/// What the churn measured.
struct Churn {
    changes: usize,
    elapsed: Duration,
    /// Change → all ACKed: p50, p99, max (seconds).
    latency: [f64; 3],
    /// Per version, last subscriber's ACK minus the first's: p99, max (seconds).
    spread: [f64; 2],
    cpu_cores: f64,
    versions: usize,
}

/// User + system CPU time of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// Changes `--churn-per-second` EndpointSlices per second for `--churn-seconds`, then
/// waits for every subscriber and measures.
async fn churn(
    args: &Args,
    slices: &Api<EndpointSlice>,
    pid: u32,
    seen: &Arc<Mutex<Seen>>,
) -> anyhow::Result<Churn> {
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let total = args.churn_per_second as u64 * args.churn_seconds;
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / args.churn_per_second);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut running = tokio::task::JoinSet::new();
    for n in 0..total {
        ticks.tick().await;
        let slices = slices.clone();
        let i = (n as usize * 7919) % args.ingresses;
        let name = format!("app-{i}-1");
        let ip = format!(
            "10.{}.{}.{}",
            200 + ((n >> 16) & 15),
            (n >> 8) & 255,
            n & 255
        );
        running.spawn(async move {
            let patch = serde_json::json!({ "endpoints": [{
                "addresses": [ip], "conditions": { "ready": true }
            }] });
            let sent = Instant::now();
            let slice = slices
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let rev: u64 = slice
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .context("resourceVersion")?;
            Ok::<(u64, Instant), anyhow::Error>((rev, sent))
        });
    }
    let mut changes = Vec::new();
    while let Some(done) = running.join_next().await {
        changes.push(done??);
    }
    let elapsed = started.elapsed();
    let newest = changes.iter().map(|(r, _)| *r).max().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.lock().expect("lock").all_acked(newest).is_none() {
        anyhow::ensure!(Instant::now() < deadline, "the churn did not converge");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cpu_cores = (cpu_seconds(pid) - cpu_before) / started.elapsed().as_secs_f64();
    let s = seen.lock().expect("lock");
    let mut latency: Vec<Duration> = changes
        .iter()
        .map(|(rev, sent)| {
            s.all_acked(*rev)
                .expect("converged")
                .saturating_duration_since(*sent)
        })
        .collect();
    latency.sort();
    // Each version the subscribers ACKed during the churn: how long the last took after
    // the first.
    let mut versions: Vec<u64> = s.acks[0]
        .iter()
        .map(|(r, _)| *r)
        .filter(|r| changes.iter().any(|(c, _)| c <= r))
        .collect();
    versions.dedup();
    let mut spread: Vec<Duration> = versions
        .iter()
        .filter_map(|rev| {
            let firsts: Vec<Instant> = s.first_acks(*rev).collect::<Option<_>>()?;
            let (min, max) = (firsts.iter().min()?, firsts.iter().max()?);
            Some(max.saturating_duration_since(*min))
        })
        .collect();
    spread.sort();
    let secs = |d: Duration| d.as_secs_f64();
    Ok(Churn {
        changes: changes.len(),
        elapsed,
        latency: [
            secs(percentile(&latency, 0.5)),
            secs(percentile(&latency, 0.99)),
            secs(*latency.last().unwrap_or(&Duration::ZERO)),
        ],
        spread: [
            secs(percentile(&spread, 0.99)),
            secs(*spread.last().unwrap_or(&Duration::ZERO)),
        ],
        cpu_cores,
        versions: versions.len(),
    })
}
