//! holdfast's data plane: a reverse proxy that serves route snapshots from the control
//! plane, applies each one atomically, ACKs or NACKs it, persists it, and keeps serving
//! the last applied one through any outage.
//!
//! # Layout
//! - [`table`]: a snapshot compiled into an immutable lookup structure (pure).
//! - [`headers`]: request framing checks and header rewriting (pure).
//! - [`framing`]: follows HTTP/1.1 framing on the raw byte stream to reject
//!   request-smuggling shapes hyper would otherwise normalise silently (pure).
//! - [`proxy`]: forwarding one request: route, balance, retry, 502/503/504.
//! - [`server`]: the client listener (HTTP/1.1 + h2c), limits, idle timeout, draining.
//! - [`subscriber`]: the control-plane stream, and the [`subscriber::Applier`] that
//!   validates, persists and swaps tables.
//! - [`persist`]: the state file (atomic write, checksum).
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`, `/debug/snapshot`, `/debug/explain`.
//! - [`metrics`], [`config`], and [`run`] (wiring).

pub mod admin;
pub mod config;
pub mod framing;
pub mod headers;
pub mod metrics;
pub mod persist;
pub mod proxy;
pub mod server;
pub mod subscriber;
pub mod table;

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwapOption;
use holdfast_proto::v1::Node;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::proxy::{ForwardSettings, Forwarder};
use crate::server::ListenSettings;
use crate::subscriber::Applier;
use crate::table::RouteTable;

/// Runs the proxy until `shutdown` turns true, then drains.
pub async fn run(config: Config, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let args = &config.args;
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("creating --state-dir {}", args.state_dir.display()))?;
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let table: Arc<ArcSwapOption<RouteTable>> = Arc::new(ArcSwapOption::empty());
    let applier = Arc::new(Applier::new(
        table.clone(),
        args.state_dir.clone(),
        metrics.clone(),
    ));

    // Serve the persisted snapshot at once, before any control plane answers.
    match persist::load(&args.state_dir) {
        Ok(Some(snapshot)) => match RouteTable::compile(&snapshot) {
            Ok(t) => {
                tracing::info!(version = %t.version, routes = t.route_count(), "serving the persisted snapshot");
                applier.install(t);
            }
            Err(error) => {
                tracing::error!(%error, "persisted snapshot does not compile; not ready until a control plane delivers one")
            }
        },
        Ok(None) => {
            tracing::info!("no persisted snapshot; not ready until a control plane delivers one")
        }
        Err(error) => {
            tracing::error!(%error, "rejected the state file; not ready until a control plane delivers a snapshot")
        }
    }

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let admin_listener = TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("binding --admin-listen {}", args.admin_listen))?;
    tracing::info!(proxy = %listener.local_addr()?, admin = %admin_listener.local_addr()?, node = %config.node_id, "listening");

    let forwarder = Arc::new(Forwarder::new(
        table.clone(),
        ForwardSettings {
            connect_timeout: args.upstream_connect_timeout,
            response_timeout: args.upstream_response_timeout,
            eject_for: args.eject_for,
            pool_idle_per_host: args.upstream_pool_idle,
        },
        metrics.clone(),
    ));
    let node = Node {
        id: config.node_id.clone(),
        zone: args.zone.clone(),
    };
    let subscriber = tokio::spawn(subscriber::run(
        args.control_planes.clone(),
        node,
        applier,
        metrics,
        shutdown.clone(),
    ));
    let admin = tokio::spawn(admin::serve(
        admin_listener,
        table,
        Arc::new(registry),
        shutdown.clone(),
    ));
    server::serve(
        listener,
        forwarder,
        ListenSettings {
            header_read_timeout: args.header_read_timeout,
            idle_timeout: args.idle_timeout,
            max_headers: args.max_headers,
            max_header_bytes: args.max_header_bytes,
            shutdown_grace: args.shutdown_grace,
        },
        shutdown,
    )
    .await;
    subscriber.abort();
    admin.abort();
    Ok(())
}

/// Turns `tx` true on SIGTERM or Ctrl-C.
pub async fn shutdown_signal(tx: watch::Sender<bool>) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    tracing::info!("shutting down: no new connections; draining in-flight requests");
    let _ = tx.send(true);
}
