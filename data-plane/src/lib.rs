//! holdfast's data plane: a reverse proxy that serves route snapshots from the control
//! plane, applies each one atomically, ACKs or NACKs it, persists it, and keeps serving
//! the last applied one through any outage.
//!
//! # Layout
//! - [`table`]: a snapshot compiled into an immutable lookup structure (pure).
//! - [`matching`]: the one route lookup of both APIs, host selection then path (pure).
//! - [`gateway`]: Gateway API listeners, weighted choice, header changes and redirects
//!   (pure).
//! - [`proxy`]: forwarding one request: route, balance, retry, 502/503/504.
//! - [`h2c`]: the shared HTTP/2 (cleartext) connections to backends that speak it.
//! - [`passthrough`]: Gateway TLS listeners in Passthrough mode: the ClientHello's server
//!   name picks a TLSRoute backend, and the TLS bytes are relayed unopened.
//! - [`server`]: the client listeners (HTTP/1.1 + h2c; HTTPS), limits, idle timeout,
//!   draining.
//! - [`tls`]: the HTTPS listener's rustls configuration: certificates by SNI from the
//!   served table, ALPN, resumption.
//! - [`subscriber`]: the control-plane stream, and the [`subscriber::Applier`] that
//!   validates, persists and swaps tables.
//! - [`persist`]: the state file (atomic write, checksum).
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`, `/debug/snapshot`, `/debug/explain`.
//! - [`metrics`], [`config`], and [`run`] (wiring: the control-plane stream and the admin
//!   listeners on a small control runtime, the proxy listeners on worker threads, one
//!   single-threaded runtime each).
//!
//! The HTTP mechanics (framing, header rules, path normalisation, in-flight counting,
//! upstream connections, tunnels, the connection timer, the workers' coarse clock and the
//! native HTTP/1.1 engine, which serves the forwarder through its `Service` trait) are in
//! the `holdfast-http` crate (`http/`).
//!
//! Logging, the shutdown signal, the node name and the admin HTTP listener are shared with
//! the control plane, in the `holdfast-process` crate (`process/`).

pub mod access_log;
pub mod admin;
pub mod config;
pub mod cors;
pub mod gateway;
pub mod h2c;
pub mod limit;
pub mod listeners;
pub mod matching;
pub mod metrics;
pub mod mirror;
pub mod passthrough;
pub mod persist;
pub mod proxy;
pub mod server;
mod shards;
pub mod subscriber;
pub mod table;
pub mod tls;
pub mod upstream;

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwapOption;
use holdfast_lock::Lock;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::proxy::Forwarder;
use crate::server::ListenSettings;
use crate::subscriber::Applier;
use crate::table::RouteTable;

/// At exit, how long the access log's writer and the span exporter each get to write
/// what is waiting.
const FLUSH_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs the proxy until `shutdown` is cancelled, then drains.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let Config {
        addresses,
        workers,
        listen,
        forward,
        subscribe,
        state_dir,
        max_snapshot_bytes,
        drain_delay,
        log_format: _,
        access_log,
        tracing,
    } = config;
    persist::prepare_dir(&state_dir)
        .with_context(|| format!("preparing --state-dir {}", state_dir.display()))?;
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let engine = if listen.native_h1 { "native" } else { "hyper" };
    metrics
        .h1_engine
        .get_or_create(&metrics::EngineLabel { engine })
        .set(1);
    let table: Arc<ArcSwapOption<RouteTable>> = Arc::new(ArcSwapOption::empty());
    let applier = Arc::new(Applier::new(
        table.clone(),
        state_dir.clone(),
        metrics.clone(),
        max_snapshot_bytes,
    ));

    // Serve the persisted snapshot at once, before any control plane answers.
    let outcome = match persist::load(&state_dir) {
        Ok(Some(snapshot)) => match RouteTable::compile(&snapshot) {
            Ok(t) => {
                tracing::info!(version = %t.version, routes = t.route_count(), "serving the persisted snapshot");
                applier.install(snapshot, t);
                "served"
            }
            Err(error) => {
                tracing::error!(error = %holdfast_process::error_chain(&error), "persisted snapshot does not compile; not ready until a control plane delivers one");
                "rejected"
            }
        },
        Ok(None) => {
            tracing::info!("no persisted snapshot; not ready until a control plane delivers one");
            "none"
        }
        Err(error) => {
            tracing::error!(error = %holdfast_process::error_chain(&error), "rejected the state file; not ready until a control plane delivers a snapshot");
            "rejected"
        }
    };
    metrics
        .state_file_loads
        .get_or_create(&metrics::LoadLabel { outcome })
        .inc();

    let listeners = bind_per_worker(addresses.listen, workers)
        .with_context(|| format!("binding --listen {}", addresses.listen))?;
    let tls_listeners = match addresses.listen_tls {
        Some(addr) => Some(
            bind_per_worker(addr, workers)
                .with_context(|| format!("binding --listen-tls {addr}"))?,
        ),
        None => None,
    };
    let admin_listener = TcpListener::bind(addresses.admin)
        .await
        .with_context(|| format!("binding --admin-listen {}", addresses.admin))?;
    let debug_listener = TcpListener::bind(addresses.debug)
        .await
        .with_context(|| format!("binding --debug-listen {}", addresses.debug))?;
    let https = match &tls_listeners {
        Some(l) => l[0].local_addr()?.to_string(),
        None => "off".into(),
    };
    tracing::info!(proxy = %listeners[0].local_addr()?, https = %https, admin = %admin_listener.local_addr()?, debug = %debug_listener.local_addr()?, node = %subscribe.node.id, workers, "listening");

    let escaped_slashes = forward.escaped_slashes;
    let mut forwarder = Forwarder::new(table.clone(), forward, metrics.clone());
    if let Some(settings) = access_log {
        forwarder = forwarder.with_access_log(access_log::open(&settings, &metrics)?);
    }
    if let Some(settings) = tracing {
        let exporter = holdfast_process::otlp::Exporter::start(
            &settings.endpoint,
            "holdfast-proxy",
            8192,
            metrics.spans_dropped.clone(),
        )
        .with_context(|| format!("--otlp-endpoint {}", settings.endpoint))?;
        forwarder = forwarder.with_tracing(exporter, settings.ratio);
    }
    let forwarder = Arc::new(forwarder);
    let tls = match &subscribe.tls {
        Some(files) => {
            let reloading = holdfast_process::tls::Reloading::new(
                files.clone(),
                holdfast_process::tls::client_config,
            )
            .context("loading --tls-cert, --tls-key and --control-plane-ca")?;
            Some(subscriber::ClientTls {
                config: reloading,
                server_name: subscribe.server_name.clone(),
            })
        }
        None => {
            tracing::warn!(
                "INSECURE: the control-plane connection is plaintext (--insecure-plaintext): routes, backend addresses and certificate keys travel in the clear, and the control plane is not authenticated. Local development only."
            );
            None
        }
    };
    let tls_watch = tls.as_ref().map(|t| {
        holdfast_process::tls::watch_reloads(
            &t.config,
            subscribe.tls_reload_interval,
            metrics.tls_reloads.clone(),
            "the control-plane connection's",
        )
    });
    let subscriber = tokio::spawn(subscriber::run(
        subscribe.control_planes,
        subscribe.node,
        applier.clone(),
        metrics.clone(),
        tls,
        shutdown.clone(),
    ));
    let registry = Arc::new(registry);
    let admin_limits = holdfast_process::admin::Limits::default();
    let admin = tokio::spawn(admin::serve(
        admin_listener,
        admin::Pages::Admin,
        admin_limits,
        table.clone(),
        registry.clone(),
        escaped_slashes,
        shutdown.clone(),
    ));
    let debug = tokio::spawn(admin::serve(
        debug_listener,
        admin::Pages::Debug,
        admin_limits,
        table.clone(),
        registry,
        escaped_slashes,
        shutdown.clone(),
    ));
    // On SIGTERM: /readyz fails at once (above), the listeners keep accepting for
    // --drain-delay so that balancers notice, then stop accepting and drain.
    let (stop_tx, stop_accepting) = watch::channel(false);
    let signalled = shutdown.clone();
    let drain_started = Arc::new(std::sync::OnceLock::new());
    let started = drain_started.clone();
    let draining = forwarder.clone();
    let delay = tokio::spawn(async move {
        signalled.cancelled().await;
        {
            draining.start_draining();
            tracing::info!(
                ?drain_delay,
                "shutting down: not ready; still accepting for the drain delay"
            );
            tokio::time::sleep(drain_delay).await;
        }
        let _ = started.set(tokio::time::Instant::now());
        let _ = stop_tx.send(true);
    });
    let acceptor = match &tls_listeners {
        Some(_) => Some(tokio_rustls::TlsAcceptor::from(
            tls::server_config(table.clone()).context("TLS configuration")?,
        )),
        None => None,
    };
    let mut workers = Workers::start(
        listeners,
        tls_listeners.zip(acceptor),
        &forwarder,
        &listen,
        &stop_accepting,
    )?;
    // The Gateway listeners: bound with each snapshot applied, before its ACK, and tried
    // again while one could not be bound.
    let gateway_listeners = Arc::new(std::sync::Mutex::new(listeners::GatewayListeners::new(
        workers.handles.clone(),
        forwarder.clone(),
        table.clone(),
        listen.clone(),
        stop_accepting.clone(),
        metrics.clone(),
        applier.unbound_listeners().clone(),
    )));
    let hooked = gateway_listeners.clone();
    let draining_gateways = gateway_listeners.clone();
    applier.on_install(Box::new(move |t| {
        hooked.locked().reconcile(t);
    }));
    let retry_table = table.clone();
    let retry = tokio::spawn(async move {
        let mut tick = tokio::time::interval(listeners::RETRY_EVERY);
        loop {
            tick.tick().await;
            // The lock first, then the table: a table installed meanwhile is stored
            // before its hook takes the lock, so this never reconciles an older one.
            let mut listeners = gateway_listeners.locked();
            if let Some(t) = retry_table.load_full() {
                listeners.reconcile(&t);
            }
        }
    });
    if let Err(index) = workers.served().await {
        // A worker ended without a shutdown (a panic): its listening socket is gone and
        // this proxy serves less than it says; exit so that the supervisor restarts it.
        anyhow::ensure!(
            shutdown.is_cancelled(),
            "worker {index} stopped unexpectedly; exiting"
        );
    }
    delay.abort();
    // Connections drained within the grace period (counted from when accepting stopped);
    // upgraded tunnels get what is left of it, then are closed. The workers keep running
    // until then: the tunnels are their tasks.
    let deadline = drain_started
        .get()
        .copied()
        .unwrap_or_else(tokio::time::Instant::now)
        + listen.shutdown_grace;
    // The Gateway listeners drain as the proxy's own do, within the same grace period.
    let gateway_tasks = draining_gateways.locked().take_tasks();
    for task in gateway_tasks {
        let _ = tokio::time::timeout_at(deadline, task).await;
    }
    forwarder.finish_tunnels(deadline).await;
    workers.stop().await;
    // The last requests' access log lines and spans, written before the process ends.
    forwarder.flush_observers(FLUSH_AT_EXIT).await;
    subscriber.abort();
    retry.abort();
    admin.abort();
    debug.abort();
    if let Some(w) = tls_watch {
        w.abort();
    }
    Ok(())
}

/// Listening sockets on `addr`, one per worker, with `SO_REUSEPORT`: the kernel spreads
/// new connections over them, and each worker accepts from its own (nginx's `reuseport`).
/// Port 0 picks one free port for all of them.
fn bind_per_worker(
    addr: std::net::SocketAddr,
    workers: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    // SO_REUSEPORT would let these sockets join another process's on the same port (a
    // stale proxy of the same user) and split the traffic with it: a plain bind first
    // fails with "address in use" as a single listener's would.
    if addr.port() != 0 {
        drop(std::net::TcpListener::bind(addr)?);
    }
    let mut addr = addr;
    let mut listeners = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(1024)?.into_std()?;
        addr = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// The proxy's worker threads: each runs a single-threaded runtime with its own
/// listening sockets and upstream idle pool, so a request is accepted, forwarded and
/// answered on one thread without handing tasks or wakers between threads (nginx's
/// worker processes, as threads). The control-plane stream and the admin listeners run
/// on the control runtime.
struct Workers {
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Each worker's runtime (the Gateway listeners are served on them too).
    handles: Vec<tokio::runtime::Handle>,
    /// Each worker says when its listeners have drained (`Ok`), or that it ended
    /// otherwise (`Err`: it panicked).
    served: tokio::sync::mpsc::UnboundedReceiver<Result<usize, usize>>,
    /// Turns true when the workers may stop (their tunnels are over).
    release: watch::Sender<bool>,
}

impl Workers {
    fn start(
        listeners: Vec<std::net::TcpListener>,
        tls: Option<(Vec<std::net::TcpListener>, tokio_rustls::TlsAcceptor)>,
        forwarder: &Arc<Forwarder>,
        listen: &ListenSettings,
        stop_accepting: &watch::Receiver<bool>,
    ) -> anyhow::Result<Self> {
        let (release, released) = watch::channel(false);
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let open_tls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (mut tls_listeners, acceptor) = match tls {
            Some((l, a)) => (l.into_iter().map(Some).collect(), Some(a)),
            None => (Vec::new(), None),
        };
        let (served_tx, served) = tokio::sync::mpsc::unbounded_channel();
        let mut workers = Workers {
            threads: Vec::new(),
            handles: Vec::new(),
            served,
            release,
        };
        for (index, listener) in listeners.into_iter().enumerate() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // The worker's coarse clock: read once per turn of its event loop.
                .on_thread_unpark(holdfast_http::clock::turn)
                .build()
                .context("starting a worker's runtime")?;
            // Registered with the worker's runtime, whose thread polls them.
            let (listener, tls_listener) = {
                let _entered = runtime.enter();
                let tls_listener = match tls_listeners.get_mut(index).and_then(Option::take) {
                    Some(l) => Some(TcpListener::from_std(l)?),
                    None => None,
                };
                (TcpListener::from_std(listener)?, tls_listener)
            };
            workers.handles.push(runtime.handle().clone());
            let served = Served {
                tx: served_tx.clone(),
                index,
                drained: false,
            };
            let forwarder = forwarder.clone();
            let listen = listen.clone();
            let stop = stop_accepting.clone();
            let mut released = released.clone();
            let acceptor = acceptor.clone();
            let (open, open_tls) = (open.clone(), open_tls.clone());
            let thread = std::thread::Builder::new()
                .name(format!("holdfast-worker-{index}"))
                .spawn(move || {
                    let mut served = served;
                    upstream::enter_worker(index);
                    runtime.block_on(async move {
                        let https = tls_listener.zip(acceptor).map(|(l, acceptor)| {
                            tokio::spawn(server::serve(
                                l,
                                forwarder.clone(),
                                listen.clone(),
                                Some(acceptor),
                                open_tls,
                                stop.clone(),
                                None,
                            ))
                        });
                        server::serve(listener, forwarder, listen, None, open, stop, None).await;
                        if let Some(https) = https {
                            let _ = https.await;
                        }
                        served.drained();
                        let _ = released.wait_for(|r| *r).await;
                    });
                })
                .context("starting a worker thread")?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// Waits until every worker has stopped accepting and drained its connections, or
    /// until one ends otherwise (`Err` with its index).
    async fn served(&mut self) -> Result<(), usize> {
        for _ in 0..self.threads.len() {
            match self.served.recv().await {
                Some(Ok(_)) => {}
                Some(Err(index)) => {
                    tracing::error!(worker = index, "a worker thread stopped unexpectedly");
                    return Err(index);
                }
                None => return Err(usize::MAX),
            }
        }
        Ok(())
    }

    /// Lets the workers end, and waits for their threads.
    async fn stop(self) {
        self.release.send_replace(true);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// A worker's report to the control runtime: drained, or (when dropped before that, as a
/// panic unwinds the worker's thread) ended unexpectedly.
struct Served {
    tx: tokio::sync::mpsc::UnboundedSender<Result<usize, usize>>,
    index: usize,
    drained: bool,
}

impl Served {
    fn drained(&mut self) {
        self.drained = true;
        let _ = self.tx.send(Ok(self.index));
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if !self.drained {
            let _ = self.tx.send(Err(self.index));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_workers_share_one_port_that_nothing_else_can_join() {
        let group = bind_per_worker("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let addr = group[0].local_addr().unwrap();
        assert!(group.iter().all(|l| l.local_addr().unwrap() == addr));
        // A second proxy on the same address (its sockets would join the group and take
        // a share of the connections) is refused, as a single listener's bind would be.
        let again = bind_per_worker(addr, 2).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AddrInUse);
    }
}
