//! Subscribing to the control plane and applying snapshots.
//!
//! [`Applier::apply`] is the only way a route table changes: validate (consistency, hash,
//! version), refuse anything older than what is served (docs/design.md, invariant 8), compile,
//! persist, then swap the whole table in one step (invariant 5). Anything wrong leaves the
//! served table untouched and is NACKed with the reason.
//!
//! [`run`] keeps one stream to a control plane open, trying the configured URLs in turn
//! with capped, jittered exponential backoff, and states the version it serves on every
//! (re)connect so an unchanged snapshot is not resent. What it sends on a stream is a
//! [`session::Session`]'s, a plain value tested without sockets. Over mutual TLS each connection
//! uses the client configuration current when it is made ([`ClientTls`]), so renewed
//! certificates are picked up without dropping an established stream.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use holdfast_lock::Lock;
use holdfast_process::backoff::Backoff;
use holdfast_process::error_chain;
use holdfast_process::tls::Reloading;
use holdfast_proto::delta::InvalidDelta;
use holdfast_proto::snapshot::{InvalidSnapshot, Stamp, check_not_older};
use holdfast_proto::v1::{Node, Snapshot, SnapshotDelta};
use holdfast_proto::{client, delta};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

pub mod session;

use session::{Session, Stated};

use crate::metrics::Metrics;
use crate::persist;
use crate::table::CompileError;
use crate::table::RouteTable;

/// Why a snapshot or delta was refused; nothing served changes. Each variant says what
/// was refused and leaves the why to its source: the NACK's text is the whole chain
/// ([`error_chain`]).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// A delta came while no snapshot is served (there is no base to apply it to).
    #[error("delta to {version} for base {base}, but no snapshot is served")]
    NoBase {
        /// The version the delta makes.
        version: String,
        /// The version it applies to.
        base: String,
    },
    /// A delta that does not apply to the served snapshot or does not make the snapshot
    /// it names.
    #[error("delta to {version}")]
    Delta {
        /// The version the delta makes.
        version: String,
        /// What is wrong with it.
        #[source]
        source: InvalidDelta,
    },
    /// Larger than `--max-snapshot-bytes`.
    #[error("snapshot {version} is {size} bytes, over this proxy's --max-snapshot-bytes ({max})")]
    TooLarge {
        /// Its version.
        version: String,
        /// Its encoded size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Older than the served snapshot for some kind (or behind for one kind and ahead
    /// for another: waited out).
    #[error(transparent)]
    NotNewer(InvalidSnapshot),
    /// Fails validation (references, content hash, version).
    #[error("invalid snapshot")]
    Invalid(#[source] InvalidSnapshot),
    /// Valid, but cannot be compiled into a route table (a certificate that does not
    /// load, an endpoint address that does not parse).
    #[error("cannot compile snapshot")]
    Compile(#[source] CompileError),
    /// A response with neither a snapshot nor a delta.
    #[error("response carries no snapshot")]
    Empty,
}

impl Refused {
    /// A valid snapshot that is not newer than the one served (older for a kind, or
    /// waiting): the NACK says so, and the control plane keeps its delta base.
    pub fn is_not_newer(&self) -> bool {
        matches!(self, Refused::NotNewer(_))
    }
}

/// Applies snapshots to the shared route table.
pub struct Applier {
    table: Arc<ArcSwapOption<RouteTable>>,
    /// The state file and the delta log after it.
    files: persist::StateFiles,
    metrics: Metrics,
    /// The served snapshot when it could not be written to the state file, and why.
    unpersisted: std::sync::Mutex<Option<(Arc<Snapshot>, String)>>,
    /// The served snapshot by resource, the base the next delta applies to (so a delta
    /// is checked and applied in O(change)).
    served: std::sync::Mutex<Option<delta::Held>>,
    /// Largest snapshot applied, encoded; larger ones are NACKed.
    max_snapshot_bytes: usize,
    /// Called with each table installed, before it is ACKed (binds the Gateway
    /// listeners it has).
    on_install: std::sync::Mutex<Option<InstallHook>>,
    /// The served table's Gateway listeners that could not be bound (yet), sorted: sent
    /// with each ACK, and again whenever it changes.
    unbound_listeners: watch::Sender<Vec<String>>,
}

/// What [`Applier::on_install`] calls.
pub type InstallHook = Box<dyn FnMut(&RouteTable) + Send>;

impl Applier {
    /// Applies into `table`, persisting under `state_dir`.
    pub fn new(
        table: Arc<ArcSwapOption<RouteTable>>,
        state_dir: PathBuf,
        metrics: Metrics,
        max_snapshot_bytes: usize,
    ) -> Self {
        metrics.snapshot_persisted.set(1);
        Applier {
            table,
            files: persist::StateFiles::new(state_dir, metrics.state_compactions.clone()),
            metrics,
            unpersisted: std::sync::Mutex::new(None),
            served: std::sync::Mutex::new(None),
            max_snapshot_bytes,
            on_install: std::sync::Mutex::new(None),
            unbound_listeners: watch::channel(Vec::new()).0,
        }
    }

    /// Where the Gateway listeners that could not be bound are reported (sorted), for
    /// the ACKs.
    pub fn unbound_listeners(&self) -> &watch::Sender<Vec<String>> {
        &self.unbound_listeners
    }

    /// Calls `hook` with the table served now (if any) and with each table installed
    /// from now on, before it is ACKed.
    pub fn on_install(&self, mut hook: InstallHook) {
        let mut slot = self.on_install.locked();
        if let Some(t) = self.table.load_full() {
            hook(&t);
        }
        *slot = Some(hook);
    }

    fn installed(&self, table: &RouteTable) {
        if let Some(hook) = self.on_install.locked().as_mut() {
            hook(table);
        }
    }

    /// The served table's (version, content hash), if any.
    pub fn serving(&self) -> Option<(String, String)> {
        self.table
            .load()
            .as_ref()
            .map(|t| (t.version.clone(), t.content_hash.clone()))
    }

    /// Installs a table at startup (from the state file, `snapshot`) without persisting
    /// it again.
    pub fn install(&self, snapshot: Snapshot, table: RouteTable) {
        self.files.refresh();
        self.note_applied(&table);
        let hashed = delta::Hashed::of(&snapshot);
        *self.served.locked() = Some(delta::Held::sharing(snapshot, hashed, &table));
        let table = Arc::new(table);
        self.table.store(Some(table.clone()));
        self.installed(&table);
    }

    /// The resources of the served snapshot with their hashes, for the first request of
    /// a stream (empty when nothing is served).
    pub fn inventory(&self) -> Vec<holdfast_proto::v1::ResourceHash> {
        self.served
            .locked()
            .as_ref()
            .map(|held| delta::to_wire(held.inventory()))
            .unwrap_or_default()
    }

    /// Applies `change` to the served snapshot: checks it ([`delta::Held::check`]: the
    /// base, the content hash, references), refuses it if older than what is served or
    /// over the size limit, compiles only what it changes, appends it to the delta log
    /// and swaps the table. O(change) throughout. A delta for another base, or whose
    /// result is not exactly the snapshot it names, is refused and nothing changes.
    pub fn apply_delta(&self, change: &SnapshotDelta) -> Result<Option<String>, Refused> {
        // Applies happen one at a time (one stream); the lock is held throughout.
        let mut served = self.served.locked();
        let Some(held) = served.as_mut() else {
            return Err(Refused::NoBase {
                version: change.version.clone(),
                base: change.base_version.clone(),
            });
        };
        let delta_error = |source| Refused::Delta {
            version: change.version.clone(),
            source,
        };
        let checked = held.check(change).map_err(delta_error)?;
        let offered = Stamp {
            version: &change.version,
            cluster_revision: change.cluster_revision,
            progress: &change.progress,
        };
        self.admissible(offered, checked.encoded_len(), Some(held))?;
        let current = self.table.load_full();
        let table = match current.as_deref() {
            Some(t) if t.version == held.version() => t.apply_delta(held, change),
            // The table is always the held snapshot's; compile whole if it ever is not.
            _ => {
                let mut next = held.clone();
                next.commit(change, held.check(change).map_err(delta_error)?);
                RouteTable::compile(&next.to_snapshot())
            }
        }
        .map_err(Refused::Compile)?;
        held.commit_sharing(change, checked, &table);
        let persist_error = self.persist(Some(change), || Arc::new(held.to_snapshot()));
        drop(served);
        let hosts: Vec<&str> = crate::table::ingress_hosts_touched(change).collect();
        self.install_table(table, Some(&hosts));
        Ok(persist_error)
    }

    fn note_applied(&self, table: &RouteTable) {
        self.metrics
            .applied_revision
            .set(table.cluster_revision as i64);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.metrics.last_apply.set(now.as_secs() as i64);
    }

    /// Why the served snapshot is not in the state file, or "" if it is.
    pub fn persist_error(&self) -> String {
        self.unpersisted
            .locked()
            .as_ref()
            .map(|(_, e)| e.clone())
            .unwrap_or_default()
    }

    /// Tries again to persist a served snapshot whose write failed. Returns true when
    /// that succeeded now (the control plane should hear it).
    pub fn retry_persist(&self) -> bool {
        let mut pending = self.unpersisted.locked();
        let Some((snapshot, _)) = pending.as_ref() else {
            return false;
        };
        match self.files.store(snapshot) {
            Ok(()) => {
                tracing::info!(version = %snapshot.version, "persisted the served snapshot after an earlier failure");
                *pending = None;
                self.metrics.snapshot_persisted.set(1);
                true
            }
            Err(error) => {
                if let Some((_, e)) = pending.as_mut() {
                    *e = error_chain(&error);
                }
                false
            }
        }
    }

    /// Validates, compiles, persists and swaps in `snapshot`; on error nothing changes.
    /// A snapshot that is valid but cannot be written to the state file is still served
    /// (the newest routes matter more than the file), and the write error is returned
    /// for the ACK: such a snapshot would not survive a restart (invariant 6).
    pub fn apply(&self, snapshot: Snapshot) -> Result<Option<String>, Refused> {
        let mut served = self.served.locked();
        // Refused before hashing it whole: a replica that is behind may offer it again.
        self.admissible(
            Stamp::of(&snapshot),
            prost::Message::encoded_len(&snapshot),
            served.as_ref(),
        )?;
        let hashed = delta::Hashed::verified(&snapshot).map_err(Refused::Invalid)?;
        // The names of hosts and backends are held once by the table and the held
        // snapshot: the table takes those held already, the held snapshot the rest.
        let names: &dyn delta::SharedNames = match served.as_ref() {
            Some(held) => held,
            None => &(),
        };
        let table = RouteTable::compile_sharing(&snapshot, names).map_err(Refused::Compile)?;
        let snapshot = Arc::new(snapshot);
        let persist_error = self.persist(None, || snapshot.clone());
        *served = Some(delta::Held::sharing(
            Arc::unwrap_or_clone(snapshot),
            hashed,
            &table,
        ));
        drop(served);
        self.install_table(table, None);
        Ok(persist_error)
    }

    /// The checks a valid snapshot must still pass to be served: its size, and never
    /// older than the one `served` for any kind ([`check_not_older`]). One behind for a
    /// kind and ahead for another is waited out (counted in
    /// `holdfast_proxy_snapshots_waited_total`).
    fn admissible(
        &self,
        offered: Stamp<'_>,
        size: usize,
        served: Option<&delta::Held>,
    ) -> Result<(), Refused> {
        if size > self.max_snapshot_bytes {
            return Err(Refused::TooLarge {
                version: offered.version.to_owned(),
                size,
                max: self.max_snapshot_bytes,
            });
        }
        let Some(served) = served else {
            return Ok(());
        };
        let current = Stamp {
            version: served.version(),
            cluster_revision: served.cluster_revision(),
            progress: served.progress(),
        };
        check_not_older(offered, current).map_err(|e| {
            if matches!(e, InvalidSnapshot::Incomparable(_)) {
                self.metrics.snapshots_waited.inc();
            }
            Refused::NotNewer(e)
        })
    }

    /// Persists the snapshot just applied: appends `change`, the delta that made it, to
    /// the log when the state on disk is the delta's base, else writes `whole()`.
    /// Returns the persist error, if any (the snapshot is served anyway).
    fn persist(
        &self,
        change: Option<&SnapshotDelta>,
        whole: impl Fn() -> Arc<Snapshot>,
    ) -> Option<String> {
        let mut pending = self.unpersisted.locked();
        // While an earlier write is missing, the log has no base: write it whole.
        let persisted = match change {
            Some(change) if pending.is_none() => self.files.append(change),
            _ => self.files.store(&whole()),
        };
        match persisted {
            Ok(()) => {
                *pending = None;
                self.metrics.snapshot_persisted.set(1);
                None
            }
            Err(error) => {
                let snapshot = whole();
                tracing::error!(error = %error_chain(&error), version = %snapshot.version, "could not persist the snapshot; serving it anyway and retrying");
                self.metrics.persist_failures.inc();
                self.metrics.snapshot_persisted.set(0);
                let message = error_chain(&error);
                *pending = Some((snapshot, message.clone()));
                Some(message)
            }
        }
    }

    /// Swaps in `table`: requests in flight keep the one they started with. The request
    /// series of routes it no longer has (among those of `hosts`, the virtual hosts that
    /// changed, or all when None) are dropped.
    fn install_table(&self, table: RouteTable, hosts: Option<&[&str]>) {
        self.note_applied(&table);
        self.metrics.applied.inc();
        tracing::info!(
            version = %table.version,
            routes = table.route_count(),
            backends = table.backend_count(),
            "applied snapshot"
        );
        let table = Arc::new(table);
        let old = self.table.swap(Some(table.clone()));
        self.installed(&table);
        if let Some(old) = old {
            let gone = old.routes_gone(&table, hosts);
            // Retired first: a request in flight on a gone route does not make its
            // series again once they are dropped.
            gone.iter().for_each(|r| r.counters.retire());
            self.metrics.forget_routes(&old.labels_gone(&table, hosts));
        }
    }
}

/// How the proxy reaches the control plane over mutual TLS.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// Our certificate and the CA of the control plane's, reloaded when they change.
    pub config: Arc<Reloading<rustls::ClientConfig>>,
    /// The name the control plane's certificate must be valid for; None: each URL's host.
    pub server_name: Option<String>,
}

/// Keeps a stream to one of `urls` open until `shutdown` is cancelled (over mutual TLS
/// when `tls` is set).
pub async fn run(
    urls: Vec<String>,
    node: Node,
    applier: Arc<Applier>,
    metrics: Metrics,
    tls: Option<ClientTls>,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::new(RECONNECT_FIRST, RECONNECT_MAX);
    let mut attempt = 0usize;
    loop {
        let url = &urls[attempt % urls.len()];
        attempt += 1;
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = stream_once(url, urls.len() > 1, tls.as_ref(), &node, &applier, &metrics, &mut backoff) => r,
        };
        metrics.control_plane_connected.set(0);
        match outcome {
            Ok(()) => tracing::warn!(control_plane = %url, "stream closed; reconnecting"),
            Err(error) => {
                let error = error_chain(&error);
                tracing::warn!(control_plane = %url, %error, "control plane unreachable; serving the last applied snapshot")
            }
        }
        let delay = backoff.next_delay();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The first reconnect delay after a stream fails; it doubles (with full jitter) on each
/// further failure up to [`RECONNECT_MAX`], and starts over once a stream is established.
pub const RECONNECT_FIRST: Duration = Duration::from_millis(200);
/// The longest reconnect delay.
pub const RECONNECT_MAX: Duration = Duration::from_secs(10);
/// Connecting to a control plane (TCP, and TLS when configured) must finish within this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// An HTTP/2 ping goes to the control plane after this long without frames, so a dead
/// peer (a silent partition) is noticed without waiting for TCP.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// A ping unanswered for this long closes the stream (and the proxy reconnects).
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a control-plane stream failed (the proxy keeps serving and reconnects, with
/// backoff).
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The URL does not parse.
    #[error("invalid control-plane URL")]
    Url(#[from] http::uri::InvalidUri),
    /// The URL names no host.
    #[error("control-plane URL {0:?} has no host")]
    NoHost(String),
    /// The TLS server name (`--control-plane-name` or the URL's host) is not a valid name.
    #[error("invalid TLS server name")]
    ServerName(#[from] rustls::pki_types::InvalidDnsNameError),
    /// Connecting failed (TCP, TLS or HTTP/2).
    #[error("cannot connect")]
    Connect(#[from] tonic::transport::Error),
    /// The stream failed or the control plane answered with an error status.
    #[error("stream failed")]
    Status(#[from] tonic::Status),
    /// The stream's request side closed: the control plane stopped reading.
    #[error("the control plane stopped reading requests")]
    Closed,
}

impl<T> From<mpsc::error::SendError<T>> for StreamError {
    fn from(_: mpsc::error::SendError<T>) -> Self {
        StreamError::Closed
    }
}

/// How often a failed write of the served snapshot is tried again.
const PERSIST_RETRY: Duration = Duration::from_secs(2);

/// Connects to `url`, over mutual TLS with the configuration current now when `tls` is
/// set.
async fn connect(
    url: &str,
    tls: Option<&ClientTls>,
) -> Result<tonic::transport::Channel, StreamError> {
    let endpoint = |url: &str| -> Result<tonic::transport::Endpoint, StreamError> {
        Ok(
            client::endpoint(tonic::transport::Endpoint::from_shared(url.to_owned())?)
                .connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
                .keep_alive_timeout(KEEP_ALIVE_TIMEOUT),
        )
    };
    let Some(tls) = tls else {
        return Ok(endpoint(url)?.connect().await?);
    };
    let uri: http::Uri = url.parse()?;
    let host = uri
        .host()
        .ok_or_else(|| StreamError::NoHost(url.to_owned()))?;
    let port = uri.port_u16().unwrap_or(443);
    let name = tls.server_name.clone().unwrap_or_else(|| {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
    });
    let name = ServerName::try_from(name)?;
    let connector = tokio_rustls::TlsConnector::from(tls.config.current());
    let address = format!("{host}:{port}");
    // The configuration current when this stream's connection is made: every reconnect
    // goes through `connect` again and picks up renewed files.
    let connect = tower::service_fn(move |_: http::Uri| {
        let (connector, name, address) = (connector.clone(), name.clone(), address.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&address).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    // TLS happens in the connector; tonic, told https://, would insist on its own.
    let inner = url.replacen("https://", "http://", 1);
    Ok(endpoint(&inner)?.connect_with_connector(connect).await?)
}

/// A stream whose control plane has offered nothing newer than what is served (every
/// offer refused as older or waited out) for this long is closed when another control
/// plane is configured: that replica may be stuck behind on a kind (its watch refused,
/// say), and another may be current.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Whether to leave a control plane (when another is configured): every offer on the
/// stream has been refused as not newer for over [`WAIT_LIMIT`], and it is still offering
/// (a refusal in the last [`WAIT_LIMIT`] / 3: a replica that has since caught up to what
/// is served sends nothing more, and is kept).
fn leave_for_another(
    waiting_since: Option<std::time::Instant>,
    last_refusal: Option<std::time::Instant>,
    now: std::time::Instant,
) -> bool {
    waiting_since.is_some_and(|t| now.duration_since(t) > WAIT_LIMIT)
        && last_refusal.is_some_and(|t| now.duration_since(t) < WAIT_LIMIT / 3)
}

async fn stream_once(
    url: &str,
    others: bool,
    tls: Option<&ClientTls>,
    node: &Node,
    applier: &Applier,
    metrics: &Metrics,
    backoff: &mut Backoff,
) -> Result<(), StreamError> {
    let channel = connect(url, tls).await?;
    // The first request states --max-snapshot-bytes, so the control plane does not send a
    // larger snapshot. Decode a little past it anyway, so one that is sent regardless is
    // NACKed with the reason; one far larger fails the stream (and is never held in memory
    // whole).
    let limit = applier
        .max_snapshot_bytes
        .saturating_add(1 << 20)
        .min(client::MAX_RESPONSE_BYTES);
    let mut client = holdfast_proto::v1::route_discovery_client::RouteDiscoveryClient::new(channel)
        .max_decoding_message_size(limit);
    let (tx, rx) = mpsc::channel(4);
    // Each request states the listeners not bound as it is built; a change after that is
    // sent as a repeat of the last request.
    let mut unbound = applier.unbound_listeners.subscribe();
    let stated = |unbound: Vec<String>| {
        let (version, content_hash) = applier.serving().unwrap_or_default();
        Stated {
            version,
            content_hash,
            persist_error: applier.persist_error(),
            unbound_listeners: unbound,
        }
    };
    let (mut session, first) = Session::open(
        node.clone(),
        applier.max_snapshot_bytes as u64,
        stated(unbound.borrow_and_update().clone()),
        applier.inventory(),
    );
    tx.send(first).await?;
    let mut inbound = client
        .stream_routes(ReceiverStream::new(rx))
        .await?
        .into_inner();
    metrics.control_plane_connected.set(1);
    backoff.reset();
    tracing::info!(control_plane = %url, "connected to control plane");
    let mut retry = tokio::time::interval(PERSIST_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut response = tokio::select! {
            message = inbound.message() => match message? {
                Some(r) => r,
                None => return Ok(()),
            },
            _ = retry.tick() => {
                if others && session.leave(std::time::Instant::now()) {
                    tracing::warn!(control_plane = %url, "this control plane has offered nothing newer than the served snapshot for {WAIT_LIMIT:?}; trying another");
                    return Ok(());
                }
                if applier.retry_persist() {
                    // Repeated as it now stands (also later, when the listeners change).
                    tx.send(session.repeat(applier.persist_error(), None)).await?;
                }
                continue;
            }
            changed = unbound.changed() => {
                // The Applier (and so the sender) outlives the stream.
                if changed.is_ok() {
                    let now_unbound = unbound.borrow_and_update().clone();
                    tx.send(session.repeat(applier.persist_error(), Some(now_unbound))).await?;
                }
                continue;
            }
        };
        let nonce = response.nonce.clone();
        let offered = response.version_info.clone();
        let arrived = std::time::Instant::now();
        let result = match response.delta.take() {
            Some(change) => {
                metrics.deltas_received.inc();
                metrics
                    .received_bytes
                    .inc_by(prost::Message::encoded_len(&*change) as u64);
                applier.apply_delta(&change)
            }
            None => match response.into_snapshot() {
                Some(snapshot) => {
                    metrics
                        .received_bytes
                        .inc_by(prost::Message::encoded_len(&snapshot) as u64);
                    applier.apply(snapshot)
                }
                None => Err(Refused::Empty),
            },
        };
        if result.is_ok() {
            metrics
                .apply_duration
                .observe(arrived.elapsed().as_secs_f64());
        }
        let refused = result.err().map(|refused| {
            let message = error_chain(&refused);
            metrics.nacks.inc();
            let serving = applier.serving().unwrap_or_default().0;
            tracing::warn!(version = %offered, error = %message, "rejected snapshot (NACK); still serving {serving}");
            (message, refused.is_not_newer())
        });
        let answer = session.answer(
            nonce,
            refused,
            stated(unbound.borrow_and_update().clone()),
            std::time::Instant::now(),
        );
        tx.send(answer).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_proto::v1::{Backend, Endpoint, Route, VirtualHost};

    /// A sealed snapshot with one route (`/`) for each of `hosts`.
    fn snapshot_of(hosts: &[&str], revision: u64) -> Snapshot {
        let mut s = Snapshot {
            virtual_hosts: hosts
                .iter()
                .map(|h| VirtualHost {
                    host: (*h).into(),
                    routes: vec![Route {
                        match_kind: holdfast_proto::v1::MatchKind::Prefix as i32,
                        path: "/".into(),
                        backend: "ns/svc:80".into(),
                        source: None,
                    }],
                    ..Default::default()
                })
                .collect(),
            backends: vec![Backend {
                name: "ns/svc:80".into(),
                endpoints: vec![Endpoint {
                    address: "10.0.0.1".into(),
                    port: 8080,
                    zone: String::new(),
                    ready: true,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        holdfast_proto::snapshot::seal(&mut s, revision);
        s
    }

    /// The `route` labels of the request series in the exposition.
    fn series(registry: &prometheus_client::registry::Registry) -> Vec<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        let mut routes: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("holdfast_proxy_requests_total{"))
            .filter_map(|l| {
                l.split("route=\"")
                    .nth(1)?
                    .split('"')
                    .next()
                    .map(String::from)
            })
            .collect();
        routes.sort();
        routes.dedup();
        routes
    }

    #[test]
    fn the_served_table_and_the_held_snapshot_hold_one_copy_of_each_name() {
        use holdfast_proto::delta::SharedNames;
        use holdfast_proto::v1::ResourceKind::{Backend as B, VirtualHost as V};
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        crate::persist::prepare_dir(&state).expect("state dir");
        let mut registry = prometheus_client::registry::Registry::default();
        let table = Arc::new(ArcSwapOption::empty());
        let applier = Applier::new(
            table.clone(),
            state,
            Metrics::new(&mut registry),
            usize::MAX,
        );
        let same = |kind, name: &str| {
            let t = table.load_full().expect("a table");
            let served = applier.served.lock().expect("lock");
            let held = served
                .as_ref()
                .expect("held")
                .shared(kind, name)
                .expect("held");
            let compiled = t.shared(kind, name).expect("in the table");
            Arc::ptr_eq(&held, &compiled)
        };
        let first = snapshot_of(&["a.test"], 1);
        applier.apply(first.clone()).expect("applies");
        assert!(same(V, "a.test") && same(B, "ns/svc:80"));
        // A delta adding a host; then a complete snapshot again.
        let second = snapshot_of(&["a.test", "b.test"], 2);
        let delta = holdfast_proto::delta::diff(
            &first.version,
            &holdfast_proto::delta::inventory(&first),
            &second,
        );
        applier.apply_delta(&delta).expect("applies");
        assert!(same(V, "a.test") && same(V, "b.test") && same(B, "ns/svc:80"));
        applier
            .apply(snapshot_of(&["a.test", "c.test"], 3))
            .expect("applies");
        assert!(same(V, "a.test") && same(V, "c.test") && same(B, "ns/svc:80"));
    }

    #[test]
    fn the_request_series_of_a_route_that_goes_are_dropped_by_snapshots_and_deltas() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        crate::persist::prepare_dir(&state).expect("state dir");
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::new(&mut registry);
        let table = Arc::new(ArcSwapOption::empty());
        let applier = Applier::new(table.clone(), state, metrics.clone(), usize::MAX);
        // Requests as the proxy counts them: through the matched route's counters.
        let serve = |host: &str| {
            let t = table.load_full().expect("a table");
            let r = t.lookup(host, "/").expect("a route");
            metrics.count_route(
                || r.series_key(),
                &r.counters,
                200,
                Duration::from_millis(3),
            );
        };
        let all = ["a.test", "b.test", "c.test"];
        let first = snapshot_of(&all, 1);
        applier.apply(first.clone()).expect("applies");
        all.iter().for_each(|h| serve(h));
        metrics.count_unrouted(404);
        assert_eq!(
            series(&registry),
            ["(none)", "a.test/", "b.test/", "c.test/"]
        );

        // A complete snapshot without b.test.
        let second = snapshot_of(&["a.test", "c.test"], 2);
        applier.apply(second.clone()).expect("applies");
        assert_eq!(series(&registry), ["(none)", "a.test/", "c.test/"]);
        serve("a.test");

        // A delta that removes c.test: a's series stays and keeps counting.
        // A request still in flight on c.test's route when it goes, ending after that.
        let in_flight_table = table.load_full().expect("a table");
        let third = snapshot_of(&["a.test"], 3);
        let delta = holdfast_proto::delta::diff(
            &second.version,
            &holdfast_proto::delta::inventory(&second),
            &third,
        );
        applier.apply_delta(&delta).expect("applies");
        assert_eq!(series(&registry), ["(none)", "a.test/"]);
        let in_flight = in_flight_table.lookup("c.test", "/").expect("a route");
        metrics.count_route(
            || in_flight.series_key(),
            &in_flight.counters,
            503,
            Duration::ZERO,
        );
        metrics.count_route(
            || in_flight.series_key(),
            &in_flight.counters,
            200,
            Duration::ZERO,
        );
        assert_eq!(
            series(&registry),
            ["(none)", "a.test/"],
            "a request ending on a gone route made its series again"
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains("holdfast_proxy_requests_total{route=\"a.test/\",class=\"2xx\"} 2"),
            "{text}"
        );
        // The latency histograms come and go with the request series.
        assert!(
            text.contains("holdfast_proxy_request_duration_seconds_count{route=\"a.test/\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "holdfast_proxy_request_duration_seconds_bucket{le=\"0.0032\",route=\"a.test/\"} 2"
            ) && text.contains(
                "holdfast_proxy_request_duration_seconds_bucket{le=\"0.0016\",route=\"a.test/\"} 0"
            ),
            "{text}"
        );
        for gone in ["b.test/", "c.test/"] {
            assert!(
                !text.contains(&format!("route=\"{gone}\"")),
                "a series of gone route {gone} is left: {text}"
            );
        }
    }

    /// `hosts` at per-kind progress `kinds`.
    fn snapshot_at(hosts: &[&str], kinds: &[(&str, u64)]) -> Snapshot {
        let mut s = snapshot_of(hosts, 0);
        s.progress = kinds
            .iter()
            .map(|(kind, rv)| holdfast_proto::v1::KindProgress {
                kind: (*kind).into(),
                resource_version: *rv,
            })
            .collect();
        let max = kinds.iter().map(|k| k.1).max().unwrap_or(0);
        holdfast_proto::snapshot::seal(&mut s, max);
        s
    }

    /// Never backwards, kind by kind: a snapshot behind for one kind is refused even when
    /// its highest number is higher; one behind for a kind and ahead for another is
    /// waited out (counted); the progress survives a restart from the state file, by
    /// snapshot and by delta.
    #[test]
    fn a_snapshot_behind_for_any_kind_is_refused_and_a_mixed_one_is_waited_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        crate::persist::prepare_dir(&state).expect("state dir");
        let registry = &mut prometheus_client::registry::Registry::default();
        let metrics = Metrics::new(registry);
        let table = Arc::new(ArcSwapOption::empty());
        let applier = Applier::new(table.clone(), state.clone(), metrics.clone(), usize::MAX);
        let served =
            |t: &Arc<ArcSwapOption<RouteTable>>| t.load_full().expect("a table").version.clone();

        let first = snapshot_at(&["a.test"], &[("Ingress", 10), ("Service", 20)]);
        applier.apply(first.clone()).expect("applies");
        // Ingresses behind (9 < 10), Services ahead (25 > 20): the one number (25) is
        // higher, but the Ingress view would move back. Wait.
        let mixed = snapshot_at(&["a.test", "b.test"], &[("Ingress", 9), ("Service", 25)]);
        let refused = applier.apply(mixed).expect_err("waited");
        assert_eq!(served(&table), first.version);
        assert_eq!(metrics.snapshots_waited.get(), 1);
        assert!(refused.is_not_newer(), "a wait is marked not newer");
        // Behind for one kind, ahead for none: refused, not a wait.
        let behind = snapshot_at(&["c.test"], &[("Ingress", 10), ("Service", 19)]);
        let refused = applier.apply(behind).expect_err("older");
        assert_eq!(metrics.snapshots_waited.get(), 1);
        assert!(refused.is_not_newer(), "an older one is marked not newer");
        // An invalid snapshot (content hash wrong) is refused for another reason.
        let mut broken = snapshot_at(&["d.test"], &[("Ingress", 30), ("Service", 30)]);
        broken.virtual_hosts[0].host = "e.test".into();
        let refused = applier.apply(broken).expect_err("invalid");
        assert!(!refused.is_not_newer(), "an invalid one is not");
        assert!(
            error_chain(&refused).starts_with("invalid snapshot: "),
            "the NACK names the cause: {}",
            error_chain(&refused)
        );
        // Caught up on every kind: accepted, as a delta.
        let next = snapshot_at(&["a.test", "b.test"], &[("Ingress", 12), ("Service", 25)]);
        let change = holdfast_proto::delta::diff(
            &first.version,
            &holdfast_proto::delta::inventory(&first),
            &next,
        );
        applier.apply_delta(&change).expect("applies");
        assert_eq!(served(&table), next.version);

        // Restarted from the state file (snapshot + delta log): the progress came back
        // with it, so a snapshot behind for Ingresses is still refused.
        let (snapshot, restored) = crate::persist::load(&state)
            .expect("loads")
            .map(|s| {
                let t = RouteTable::compile(&s).expect("compiles");
                (s, t)
            })
            .expect("a saved snapshot");
        assert_eq!(snapshot.progress, next.progress);
        let table = Arc::new(ArcSwapOption::empty());
        let again = Applier::new(table.clone(), state, metrics.clone(), usize::MAX);
        again.install(snapshot, restored);
        let stale = snapshot_at(&["z.test"], &[("Ingress", 11), ("Service", 99)]);
        assert!(again.apply(stale).is_err());
        assert_eq!(served(&table), next.version);
        assert_eq!(metrics.snapshots_waited.get(), 2);
    }

    /// A proxy leaves a control plane that has kept offering only snapshots it refuses as
    /// not newer for over WAIT_LIMIT, and stays with one that stopped offering (it caught
    /// up to what is served) or that it has not waited on that long.
    #[test]
    fn a_proxy_leaves_a_control_plane_that_keeps_offering_nothing_newer() {
        let start = std::time::Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert!(leave_for_another(Some(start), Some(at(29)), at(31)));
        assert!(
            !leave_for_another(Some(start), Some(at(29)), at(29)),
            "not that long"
        );
        assert!(
            !leave_for_another(Some(start), Some(at(5)), at(31)),
            "no refusal lately: it caught up and sends nothing"
        );
        assert!(
            !leave_for_another(None, Some(at(30)), at(31)),
            "not waiting"
        );
    }
}
