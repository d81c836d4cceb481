//! State shared by the watchers, the publisher, the gRPC services and the admin listener:
//! the published snapshot (a `watch` every proxy stream subscribes to), cache sync status,
//! the held snapshot, and the connected proxies.
//!
//! Locks here are `std::sync::Mutex`: every critical section is a few field updates and
//! none is held across an `.await`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use holdfast_proto::snapshot::route_count;
use holdfast_proto::v1::{self, Snapshot};
use holdfast_proto::wire::EncodedSnapshot;
use tokio::sync::watch;

use crate::metrics::{KindLabel, Metrics};

/// The kinds the control plane watches, in the order they are reported.
pub const KINDS: [&str; 5] = [
    "IngressClass",
    "Ingress",
    "Service",
    "EndpointSlice",
    "Secret",
];

/// A published snapshot, encoded once for every stream.
#[derive(Debug)]
pub struct Published {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Its encoding, shared by all streams.
    pub encoded: EncodedSnapshot,
    /// When it was published.
    pub at: SystemTime,
    /// Its resources' hashes (made on first use: when a proxy ACKs it, it becomes the
    /// base of that proxy's next delta).
    inventory: std::sync::OnceLock<Arc<holdfast_proto::delta::Inventory>>,
    /// Encoded deltas to it by base version, shared by the streams that hold that base;
    /// `None` where the complete snapshot is smaller.
    deltas: std::sync::Mutex<std::collections::HashMap<String, Option<bytes::Bytes>>>,
}

impl Published {
    /// Wraps a sealed, validated snapshot.
    pub fn new(snapshot: Snapshot) -> Self {
        Published {
            encoded: EncodedSnapshot::new(&snapshot),
            snapshot,
            at: SystemTime::now(),
            inventory: std::sync::OnceLock::new(),
            deltas: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The snapshot's resources with their hashes.
    pub fn inventory(&self) -> Arc<holdfast_proto::delta::Inventory> {
        self.inventory
            .get_or_init(|| Arc::new(holdfast_proto::delta::inventory(&self.snapshot)))
            .clone()
    }

    /// The encoded delta from the snapshot `base_version`, whose resources are `base`, to
    /// this one; `None` when the complete snapshot is no larger. With `shared` (a base
    /// this control plane published, so its inventory is its own), it is computed once
    /// per base version and shared by every stream; an inventory a proxy stated is used
    /// for that stream only.
    pub fn delta_from(
        &self,
        base_version: &str,
        base: &holdfast_proto::delta::Inventory,
        shared: bool,
    ) -> Option<bytes::Bytes> {
        let compute = || {
            let delta = holdfast_proto::delta::diff_to(
                base_version,
                base,
                &self.snapshot,
                &self.inventory(),
            );
            let bytes = prost::Message::encode_to_vec(&delta);
            (bytes.len() < self.encoded.bytes().len()).then(|| bytes::Bytes::from(bytes))
        };
        if !shared {
            return compute();
        }
        let mut deltas = self.deltas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = deltas.get(base_version) {
            return known.clone();
        }
        let made = compute();
        // Proxies hold a handful of versions; a bound keeps a pathological spread small.
        if deltas.len() < 64 {
            deltas.insert(base_version.to_owned(), made.clone());
        }
        made
    }
}

/// Sync state of one watched kind.
#[derive(Debug, Clone, Default)]
pub struct CacheStatus {
    /// Complete list held, not re-listing.
    pub synced: bool,
    /// Last watch error and when it happened.
    pub last_error: Option<(String, SystemTime)>,
}

/// A snapshot held back by the bounded-destruction guard.
#[derive(Debug, Clone)]
pub struct Held {
    /// The held snapshot (sealed and valid).
    pub snapshot: Arc<Snapshot>,
    /// False for a hold nothing may release (over --max-snapshot-bytes): no fresh read
    /// confirms it and no operator approves it; only a smaller snapshot replaces it.
    pub confirmable: bool,
    /// Why it is held.
    pub reason: String,
    /// Routes in the published snapshot when it was held.
    pub routes_published: usize,
    /// Routes in the held snapshot.
    pub routes_held: usize,
    /// When this content was first held.
    pub since: SystemTime,
    /// Same, monotonic (for the confirmation period).
    pub since_instant: Instant,
}

#[derive(Debug, Default)]
struct Status {
    caches: BTreeMap<&'static str, CacheStatus>,
    held: Option<Held>,
    problems: Vec<crate::translate::Problem>,
}

/// Why an approval was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApproveError {
    /// Nothing is held.
    #[error("no snapshot is held")]
    NothingHeld,
    /// The held snapshot is over --max-snapshot-bytes.
    #[error("the held snapshot is over --max-snapshot-bytes and cannot be approved")]
    TooLarge,
    /// The held snapshot is not the one named.
    #[error("the held snapshot is {held}, not {requested}")]
    VersionMismatch {
        /// Held version.
        held: String,
        /// Version the operator named.
        requested: String,
    },
}

/// Handle to the shared state; cheap to clone.
#[derive(Clone, Debug)]
pub struct Shared {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    published: watch::Sender<Option<Arc<Published>>>,
    status: Mutex<Status>,
    proxies: Mutex<BTreeMap<u64, v1::ProxyStatus>>,
    next_stream: AtomicU64,
    metrics: Metrics,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these short locks leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Empty state: nothing published, no cache synced.
    pub fn new(metrics: Metrics) -> Self {
        let status = Status {
            caches: KINDS.iter().map(|k| (*k, CacheStatus::default())).collect(),
            held: None,
            problems: Vec::new(),
        };
        for kind in KINDS {
            metrics
                .cache_synced
                .get_or_create(&KindLabel { kind: kind.into() })
                .set(0);
        }
        Shared {
            inner: Arc::new(Inner {
                published: watch::channel(None).0,
                status: Mutex::new(status),
                proxies: Mutex::new(BTreeMap::new()),
                next_stream: AtomicU64::new(1),
                metrics,
            }),
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Subscribes to published snapshots.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Published>>> {
        self.inner.published.subscribe()
    }

    /// The current published snapshot.
    pub fn published(&self) -> Option<Arc<Published>> {
        self.inner.published.borrow().clone()
    }

    /// Publishes a sealed, validated snapshot to every stream.
    pub fn publish(&self, snapshot: Snapshot) {
        let m = &self.inner.metrics;
        m.snapshot_revision.set(snapshot.cluster_revision as i64);
        m.snapshot_routes.set(route_count(&snapshot) as i64);
        m.published.inc();
        let published = Published::new(snapshot);
        tracing::info!(
            version = %published.snapshot.version,
            routes = route_count(&published.snapshot),
            backends = published.snapshot.backends.len(),
            bytes = published.encoded.bytes().len(),
            "published snapshot"
        );
        self.inner.published.send_replace(Some(Arc::new(published)));
    }

    /// True once the first complete snapshot has been published.
    pub fn ready(&self) -> bool {
        self.inner.published.borrow().is_some()
    }

    /// Records the sync state of a kind.
    pub fn set_synced(&self, kind: &'static str, synced: bool) {
        lock(&self.inner.status)
            .caches
            .entry(kind)
            .or_default()
            .synced = synced;
        self.inner
            .metrics
            .cache_synced
            .get_or_create(&KindLabel { kind: kind.into() })
            .set(i64::from(synced));
    }

    /// Records a watch error of a kind.
    pub fn record_watch_error(&self, kind: &'static str, error: String) {
        lock(&self.inner.status)
            .caches
            .entry(kind)
            .or_default()
            .last_error = Some((error, SystemTime::now()));
        self.inner
            .metrics
            .watch_errors
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// True when every kind's cache is complete and none is re-listing.
    pub fn all_synced(&self) -> bool {
        lock(&self.inner.status).caches.values().all(|c| c.synced)
    }

    /// Kinds whose cache is not complete.
    pub fn unsynced(&self) -> Vec<&'static str> {
        lock(&self.inner.status)
            .caches
            .iter()
            .filter(|(_, c)| !c.synced)
            .map(|(k, _)| *k)
            .collect()
    }

    /// The held snapshot, if any.
    pub fn held(&self) -> Option<Held> {
        lock(&self.inner.status).held.clone()
    }

    /// Holds `held` back. If the same content is already held, the existing hold is kept
    /// as it is (same version, same `since`), so the version an operator read from
    /// `GetStatus` stays approvable while unrelated changes advance the cluster revision.
    /// Returns true if this is a new hold.
    pub fn hold(&self, held: Held) -> bool {
        let mut status = lock(&self.inner.status);
        if status
            .held
            .as_ref()
            .is_some_and(|old| old.snapshot.content_hash == held.snapshot.content_hash)
        {
            return false;
        }
        status.held = Some(held);
        self.inner.metrics.held.set(1);
        self.inner.metrics.holds.inc();
        true
    }

    /// Drops any hold (a newer candidate superseded it).
    pub fn clear_hold(&self) {
        let mut status = lock(&self.inner.status);
        if status.held.take().is_some() {
            self.inner.metrics.held.set(0);
        }
    }

    /// Publishes the held snapshot if its content hash is still `content_hash`.
    pub fn release_hold_if(&self, content_hash: &str) -> bool {
        let mut status = lock(&self.inner.status);
        match &status.held {
            Some(h) if h.snapshot.content_hash == content_hash => {
                let held = status.held.take().expect("checked above");
                self.inner.metrics.held.set(0);
                self.publish((*held.snapshot).clone());
                true
            }
            _ => false,
        }
    }

    /// Operator approval: publishes the held snapshot if it is `version`.
    pub fn approve(&self, version: &str) -> Result<String, ApproveError> {
        let mut status = lock(&self.inner.status);
        let held = status.held.as_ref().ok_or(ApproveError::NothingHeld)?;
        if held.snapshot.version != version {
            return Err(ApproveError::VersionMismatch {
                held: held.snapshot.version.clone(),
                requested: version.to_owned(),
            });
        }
        if !held.confirmable {
            return Err(ApproveError::TooLarge);
        }
        let held = status.held.take().expect("checked above");
        self.inner.metrics.held.set(0);
        tracing::warn!(version, reason = %held.reason, "held snapshot approved by an operator");
        self.publish((*held.snapshot).clone());
        Ok(version.to_owned())
    }

    /// Records the problems of the last build (for `Admin.GetStatus`).
    pub fn set_problems(&self, problems: Vec<crate::translate::Problem>) {
        lock(&self.inner.status).problems = problems;
    }

    /// The status for `Admin.GetStatus`.
    pub fn status(&self) -> v1::GetStatusResponse {
        let status = lock(&self.inner.status);
        let published = self.published();
        v1::GetStatusResponse {
            ready: published.is_some(),
            caches: KINDS
                .iter()
                .map(|kind| {
                    let c = status.caches.get(kind).cloned().unwrap_or_default();
                    v1::CacheStatus {
                        kind: (*kind).into(),
                        synced: c.synced,
                        last_error: c
                            .last_error
                            .as_ref()
                            .map(|e| e.0.clone())
                            .unwrap_or_default(),
                        last_error_time: c.last_error.map(|e| e.1.into()),
                    }
                })
                .collect(),
            published_version: published
                .as_ref()
                .map(|p| p.snapshot.version.clone())
                .unwrap_or_default(),
            last_publish_time: published.map(|p| p.at.into()),
            held: status.held.as_ref().map(|h| v1::HeldSnapshot {
                version: h.snapshot.version.clone(),
                reason: h.reason.clone(),
                routes_published: h.routes_published as u32,
                routes_held: h.routes_held as u32,
                held_since: Some(h.since.into()),
            }),
            problems: status
                .problems
                .iter()
                .map(|p| v1::Problem {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    reason: p.reason.into(),
                    message: p.message.clone(),
                })
                .collect(),
        }
    }

    /// Registers a proxy stream; returns its id for later updates.
    pub fn add_proxy(&self, status: v1::ProxyStatus) -> u64 {
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.proxies).insert(id, status);
        self.inner.metrics.proxies_connected.inc();
        id
    }

    /// Updates a registered proxy stream.
    pub fn update_proxy(&self, id: u64, f: impl FnOnce(&mut v1::ProxyStatus)) {
        if let Some(p) = lock(&self.inner.proxies).get_mut(&id) {
            f(p);
        }
    }

    /// Removes a proxy stream.
    pub fn remove_proxy(&self, id: u64) {
        if lock(&self.inner.proxies).remove(&id).is_some() {
            self.inner.metrics.proxies_connected.dec();
        }
    }

    /// Every connected proxy.
    pub fn proxies(&self) -> Vec<v1::ProxyStatus> {
        lock(&self.inner.proxies).values().cloned().collect()
    }
}
