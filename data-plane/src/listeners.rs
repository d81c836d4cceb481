//! The Gateway listeners: each address and port of the served snapshot's Gateways, bound
//! on every worker (`SO_REUSEPORT`, as the proxy's own listeners) and served with that
//! listener's routes alone ([`crate::proxy::Via::Gateway`]).
//!
//! [`GatewayListeners::reconcile`] runs with each snapshot applied, before it is ACKed:
//! it binds the listeners the snapshot has and the proxy does not serve yet, and stops
//! those it no longer has (or whose protocol changed), which then drain as the proxy's own
//! listeners do on shutdown (and at shutdown they drain with the proxy's own, within
//! `--shutdown-grace`). Their connections count together against `--max-connections`, as
//! one listening address's do. The listeners that did not change are left alone. A listener
//! that cannot be bound (its address is not on this host, its port is taken) is counted,
//! reported with the ACKs (so its Gateway is not called Programmed through this proxy)
//! and tried again every [`RETRY_EVERY`], never fatal: the other listeners and every
//! Ingress route keep being served.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::proxy::Forwarder;
use crate::server::{self, ListenSettings};
use crate::table::RouteTable;

/// How often listeners that could not be bound are tried again.
pub const RETRY_EVERY: Duration = Duration::from_secs(2);

/// One Gateway listener being served.
struct Bound {
    kind: Serving,
    /// Turns true to stop accepting (then its connections drain).
    stop: Arc<watch::Sender<bool>>,
}

/// What a listener is served as (a listener whose protocol changes is bound again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serving {
    /// HTTP.
    Http,
    /// HTTPS: TLS terminated here.
    Https,
    /// TLS passthrough ([`crate::passthrough`]).
    Passthrough,
}

/// The Gateway listeners served, and what serving them takes.
pub struct GatewayListeners {
    /// One per worker: each serves every listener from its own socket.
    workers: Vec<Handle>,
    forwarder: Arc<Forwarder>,
    table: Arc<ArcSwapOption<RouteTable>>,
    settings: ListenSettings,
    /// Turns true when the proxy stops accepting (shutdown).
    stopping: watch::Receiver<bool>,
    metrics: Metrics,
    bound: HashMap<String, Bound>,
    /// The connections of every Gateway listener together, held to `--max-connections`
    /// as one listening address is: how many Gateways tenants make does not multiply it.
    open: Arc<AtomicUsize>,
    /// Every Gateway listener's serving task on every worker (finished ones pruned), for
    /// the drain at shutdown.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Listeners whose last bind failed (logged once, at warn, until one succeeds).
    failing: std::collections::HashSet<String>,
    /// Where the listeners not bound are reported (sorted), for the ACKs
    /// ([`crate::subscriber::Applier::unbound_listeners`]).
    unbound: watch::Sender<Vec<String>>,
}

impl GatewayListeners {
    /// Serves on the runtimes of `workers`.
    pub fn new(
        workers: Vec<Handle>,
        forwarder: Arc<Forwarder>,
        table: Arc<ArcSwapOption<RouteTable>>,
        settings: ListenSettings,
        stopping: watch::Receiver<bool>,
        metrics: Metrics,
        unbound: watch::Sender<Vec<String>>,
    ) -> Self {
        GatewayListeners {
            workers,
            forwarder,
            table,
            settings,
            stopping,
            metrics,
            bound: HashMap::new(),
            open: Arc::new(AtomicUsize::new(0)),
            tasks: Vec::new(),
            failing: std::collections::HashSet::new(),
            unbound,
        }
    }

    /// Serves exactly the Gateway listeners of `table` (see the module documentation).
    pub fn reconcile(&mut self, table: &RouteTable) {
        if *self.stopping.borrow() {
            return;
        }
        let wanted: HashMap<&str, (SocketAddr, Serving)> = table
            .gateway_listeners()
            .map(|l| {
                let kind = match (l.tls, l.passthrough) {
                    (_, true) => Serving::Passthrough,
                    (true, false) => Serving::Https,
                    (false, false) => Serving::Http,
                };
                (l.name.as_str(), (SocketAddr::new(l.address, l.port), kind))
            })
            .collect();
        self.bound.retain(|name, b| {
            let keep = wanted
                .get(name.as_str())
                .is_some_and(|(_, kind)| *kind == b.kind);
            if !keep {
                tracing::info!(listener = %name, "gateway listener removed; draining");
                let _ = b.stop.send(true);
            }
            keep
        });
        self.failing
            .retain(|name| wanted.contains_key(name.as_str()));
        let mut unbound = 0;
        for (name, (addr, kind)) in wanted {
            if self.bound.contains_key(name) {
                continue;
            }
            match self.start(name, addr, kind) {
                Ok(b) => {
                    tracing::info!(listener = %name, ?kind, "gateway listener bound");
                    self.failing.remove(name);
                    self.bound.insert(name.to_owned(), b);
                }
                Err(error) => {
                    unbound += 1;
                    self.metrics.gateway_bind_failures.inc();
                    let error = holdfast_process::error_chain(&*error);
                    if self.failing.insert(name.to_owned()) {
                        tracing::warn!(listener = %name, %error, "could not bind a gateway listener; trying again every few seconds");
                    } else {
                        tracing::debug!(listener = %name, %error, "could not bind a gateway listener");
                    }
                }
            }
        }
        self.metrics.gateway_listeners.set(self.bound.len() as i64);
        self.metrics.gateway_listeners_unbound.set(unbound);
        let mut names: Vec<String> = self.failing.iter().cloned().collect();
        names.sort();
        self.unbound.send_if_modified(|old| {
            let changed = *old != names;
            *old = names;
            changed
        });
    }

    /// The serving tasks of every Gateway listener, to await at shutdown (they drain
    /// once the proxy stops accepting); none are started afterwards.
    pub fn take_tasks(&mut self) -> Vec<tokio::task::JoinHandle<()>> {
        std::mem::take(&mut self.tasks)
    }

    /// Binds `addr` on every worker and serves it there.
    fn start(
        &mut self,
        name: &str,
        addr: SocketAddr,
        kind: Serving,
    ) -> Result<Bound, Box<dyn std::error::Error + Send + Sync>> {
        let sockets = crate::bind_per_worker(addr, self.workers.len())?;
        let acceptor = if kind == Serving::Https {
            Some(tokio_rustls::TlsAcceptor::from(
                crate::tls::gateway_server_config(self.table.clone(), Arc::from(name))?,
            ))
        } else {
            None
        };
        let (tx, rx) = watch::channel(false);
        let stop = Arc::new(tx);
        let listener: Arc<str> = Arc::from(name);
        self.tasks.retain(|t| !t.is_finished());
        for (socket, worker) in sockets.into_iter().zip(&self.workers) {
            let socket = {
                let _entered = worker.enter();
                TcpListener::from_std(socket)?
            };
            let task = if kind == Serving::Passthrough {
                worker.spawn(crate::passthrough::serve(
                    socket,
                    self.forwarder.clone(),
                    listener.clone(),
                    self.settings.clone(),
                    self.open.clone(),
                    rx.clone(),
                ))
            } else {
                worker.spawn(server::serve(
                    socket,
                    self.forwarder.clone(),
                    self.settings.clone(),
                    acceptor.clone(),
                    self.open.clone(),
                    rx.clone(),
                    Some(listener.clone()),
                ))
            };
            self.tasks.push(task);
        }
        // Shutdown stops it too.
        let (mut stopping, forward) = (self.stopping.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stopping.wait_for(|s| *s) => { let _ = forward.send(true); }
                _ = forward.closed() => {}
            }
        });
        Ok(Bound { kind, stop })
    }
}
