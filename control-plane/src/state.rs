//! State shared by the watchers, the publisher, the gRPC services and the admin listener:
//! the published snapshot (a `watch` every proxy stream subscribes to), cache sync status,
//! the held snapshot, and the connected proxies.
//!
//! Locks here are `std::sync::Mutex`, none held across an `.await`. Every critical
//! section is a few field updates, except `publishing`, which serialises the decisions
//! that publish (the reconcile loop's offer, an approval, a confirmation) so that none
//! publishes over a newer one. Lock order: `publishing`, then `status`, then `history`;
//! `proxies` and a `Published`'s `deltas` are taken alone. Nothing is encoded while
//! `status` is held (a `Published` encodes lazily, outside these locks).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use holdfast_lock::Lock;

use std::collections::HashMap;
use std::sync::OnceLock;

use bytes::Bytes;
use holdfast_proto::delta::Inventory;
use holdfast_proto::snapshot::{
    InvalidSnapshot, validate_structure, validate_virtual_host, version_string,
};
use holdfast_proto::v1::{self, KindProgress, Snapshot, SnapshotDelta};
use holdfast_proto::wire::EncodedSnapshot;
use tokio::sync::watch;

use crate::guard::RouteKey;
use crate::metrics::{KindLabel, Metrics};
use crate::translate::{Changed, Content, Since};

/// The kinds the control plane watches, in the order they are reported.
pub const KINDS: [&str; 13] = [
    "IngressClass",
    "Ingress",
    "Service",
    "EndpointSlice",
    "Secret",
    "ConfigMap",
    "GatewayClass",
    "Gateway",
    "HTTPRoute",
    "GRPCRoute",
    "TLSRoute",
    "ReferenceGrant",
    "Namespace",
];

/// A snapshot built, and published if the guard lets it: its content shared with the
/// translator resource by resource, what changed since the build before it, and its
/// encodings, made when first needed and then shared by every stream.
pub struct Published {
    /// `<cluster revision>-<content hash prefix>`.
    pub version: String,
    /// The content hash.
    pub content_hash: String,
    /// The cluster revision it reflects: the highest of `progress` when its content was
    /// built (a re-publish at newer progress keeps it, and so its version).
    pub cluster_revision: u64,
    /// How far each watched kind had been seen when it was built (see `caches`).
    pub progress: Vec<KindProgress>,
    /// When it was built.
    pub created_at: Option<prost_types::Timestamp>,
    /// Its content.
    pub content: Content,
    /// What differs from the build before it (for deltas in O(change)).
    since: Option<Since>,
    /// The length of its complete encoding.
    pub encoded_len: usize,
    /// When it was made.
    pub at: SystemTime,
    /// The complete snapshot (made for `GetSnapshot` and deltas from a stated inventory).
    snapshot: OnceLock<Snapshot>,
    /// The complete encoding, for streams that get the whole snapshot.
    encoded: OnceLock<EncodedSnapshot>,
    /// Its resources' hashes (made for a delta from a base it has no change list from).
    inventory: OnceLock<Arc<Inventory>>,
    /// Encoded deltas to it by base version, shared by the streams that hold that base;
    /// `None` where the complete snapshot is smaller.
    deltas: Mutex<HashMap<String, Option<Bytes>>>,
}

/// The version and sizes only: the content holds private keys.
impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Published")
            .field("version", &self.version)
            .field("encoded_len", &self.encoded_len)
            .finish_non_exhaustive()
    }
}

impl Published {
    /// A build: `content` at `cluster_revision`, with what changed since the build
    /// before (from the translator).
    pub fn built(content: Content, since: Option<Since>, cluster_revision: u64) -> Self {
        let version = version_string(cluster_revision, &content.content_hash);
        let created_at = Some(SystemTime::now().into());
        let mut p = Published {
            version,
            content_hash: content.content_hash.clone(),
            cluster_revision,
            progress: Vec::new(),
            created_at,
            content,
            since,
            encoded_len: 0,
            at: SystemTime::now(),
            snapshot: OnceLock::new(),
            encoded: OnceLock::new(),
            inventory: OnceLock::new(),
            deltas: Mutex::new(HashMap::new()),
        };
        p.encoded_len = prost::Message::encoded_len(&p.identity()) + p.content.resources_len;
        p
    }

    /// The build stamped with every kind's `progress` (its cluster revision, and so its
    /// version, become the highest of them).
    pub fn with_progress(mut self, progress: Vec<KindProgress>) -> Self {
        self.cluster_revision = progress
            .iter()
            .map(|p| p.resource_version)
            .max()
            .unwrap_or(0);
        self.version = version_string(self.cluster_revision, &self.content_hash);
        self.progress = progress;
        self.encoded_len =
            prost::Message::encoded_len(&self.identity()) + self.content.resources_len;
        // Whatever was made from the identity before (a check may have made the complete
        // snapshot) is made again with it.
        if let Some(s) = self.snapshot.get_mut() {
            s.version.clone_from(&self.version);
            s.cluster_revision = self.cluster_revision;
            s.progress.clone_from(&self.progress);
        }
        self.encoded = OnceLock::new();
        self.deltas = Mutex::new(HashMap::new());
        self
    }

    /// The same content at newer `progress`: shares everything, keeps its version and
    /// cluster revision (the version names content and the revision it was first built
    /// at), and changes nothing from the build it repeats.
    pub fn restamped(&self, progress: Vec<KindProgress>) -> Published {
        let mut p = self.shadow();
        p.since = Some(Since {
            content_hash: self.content_hash.clone(),
            changed: Changed::default(),
        });
        p.progress = progress;
        p.encoded_len = prost::Message::encoded_len(&p.identity()) + p.content.resources_len;
        p
    }

    /// The sum of the progress values: grows whenever any kind's does (a replica's
    /// progress never goes back), so it tells two stampings of the same content apart.
    pub fn progress_sum(&self) -> u64 {
        self.progress
            .iter()
            .fold(0u64, |sum, p| sum.wrapping_add(p.resource_version))
    }

    /// Wraps a sealed, validated complete snapshot (no change list: deltas to it are
    /// computed from inventories).
    pub fn new(snapshot: Snapshot) -> Self {
        let mut p = Published::built(Content::of(&snapshot), None, snapshot.cluster_revision);
        p.progress.clone_from(&snapshot.progress);
        p.version.clone_from(&snapshot.version);
        p.created_at = snapshot.created_at;
        p.encoded_len = prost::Message::encoded_len(&snapshot);
        let _ = p.snapshot.set(snapshot);
        p
    }

    /// The same build, sharing its resources, without the complete snapshot, encodings
    /// and deltas made for it so far.
    pub fn shadow(&self) -> Published {
        Published {
            version: self.version.clone(),
            content_hash: self.content_hash.clone(),
            cluster_revision: self.cluster_revision,
            progress: self.progress.clone(),
            created_at: self.created_at,
            content: self.content.clone(),
            since: self.since.clone(),
            encoded_len: self.encoded_len,
            at: self.at,
            snapshot: OnceLock::new(),
            encoded: OnceLock::new(),
            inventory: OnceLock::new(),
            deltas: Mutex::new(HashMap::new()),
        }
    }

    /// The fields other than the repeated resources.
    fn identity(&self) -> Snapshot {
        Snapshot {
            version: self.version.clone(),
            content_hash: self.content_hash.clone(),
            cluster_revision: self.cluster_revision,
            progress: self.progress.clone(),
            created_at: self.created_at,
            default_backend: self.content.default_backend.clone(),
            default_certificate: self.content.default_certificate.clone(),
            ..Snapshot::default()
        }
    }

    /// Checks the build as a proxy would: each changed host (virtual, Ingress in the one
    /// model, or Gateway) well formed and what it names present (O(change)); a build with no change list (or, in debug builds,
    /// every build) is checked whole.
    pub fn validate(&self) -> Result<(), InvalidSnapshot> {
        let Some(since) = &self.since else {
            return validate_structure(self.snapshot());
        };
        let c = &self.content;
        for host in &since.changed.virtual_hosts {
            let Some(v) = c.virtual_host(host) else {
                continue;
            };
            validate_virtual_host(v)?;
            if !v.certificate.is_empty() && c.certificate(&v.certificate).is_none() {
                return Err(InvalidSnapshot::MissingCertificate {
                    host: v.host.clone(),
                    certificate: v.certificate.clone(),
                });
            }
            if let Some(r) = v.routes.iter().find(|r| c.backend(&r.backend).is_none()) {
                return Err(InvalidSnapshot::MissingBackend {
                    host: v.host.clone(),
                    path: r.path.clone(),
                    backend: r.backend.clone(),
                });
            }
        }
        for name in &since.changed.gateway_listeners {
            let Some(l) = c.gateway_listener(name) else {
                continue;
            };
            holdfast_proto::snapshot::validate_gateway_listener(l)?;
            if let Some(cert) = holdfast_proto::snapshot::listener_certificates(l)
                .find(|n| c.certificate(n).is_none())
            {
                return Err(InvalidSnapshot::BadGateway {
                    kind: "listener",
                    name: l.name.clone(),
                    reason: format!("certificate {cert:?} is not in the snapshot"),
                });
            }
        }
        for name in &since.changed.gateway_hosts {
            let Some(g) = c.gateway_host(name) else {
                continue;
            };
            holdfast_proto::snapshot::validate_gateway_host(g)?;
            let ingress = holdfast_proto::snapshot::is_ingress_host(g);
            if ingress && c.virtual_host(&g.host).is_some() {
                return Err(InvalidSnapshot::DuplicateHost(g.host.clone()));
            }
            if ingress && !g.certificate.is_empty() && c.certificate(&g.certificate).is_none() {
                return Err(InvalidSnapshot::MissingCertificate {
                    host: g.host.clone(),
                    certificate: g.certificate.clone(),
                });
            }
            let missing = if !ingress && c.gateway_listener(&g.listener).is_none() {
                Some(format!("listener {:?} is not in the snapshot", g.listener))
            } else {
                holdfast_proto::snapshot::gateway_host_backends(g)
                    .find(|b| c.backend(b).is_none())
                    .map(|b| format!("backend {b:?} is not in the snapshot"))
            };
            if let Some(reason) = missing {
                return Err(InvalidSnapshot::BadGateway {
                    kind: "host",
                    name: g.name.clone(),
                    reason,
                });
            }
        }
        if let Some(d) = &c.default_backend
            && c.backend(&d.backend).is_none()
        {
            return Err(InvalidSnapshot::MissingBackend {
                host: String::new(),
                path: "(default backend)".into(),
                backend: d.backend.clone(),
            });
        }
        if !c.default_certificate.is_empty() && c.certificate(&c.default_certificate).is_none() {
            return Err(InvalidSnapshot::MissingCertificate {
                host: String::new(),
                certificate: c.default_certificate.clone(),
            });
        }
        // The whole check, in debug builds (tests): the change-list check must never
        // pass a build it refuses. (A backend the build removed while an unchanged host
        // still routes to it is ruled out by the translator's use counts, and refused by
        // every proxy's check.)
        debug_assert_eq!(
            validate_structure(self.snapshot()),
            Ok(()),
            "the change-list check passed a build the whole check refuses"
        );
        Ok(())
    }

    /// The complete snapshot (made on first use: O(snapshot)).
    pub fn snapshot(&self) -> &Snapshot {
        self.snapshot.get_or_init(|| {
            let mut s = self.content.to_snapshot();
            let identity = self.identity();
            s.version = identity.version;
            s.cluster_revision = identity.cluster_revision;
            s.progress = identity.progress;
            s.created_at = identity.created_at;
            s
        })
    }

    /// The complete encoding (made on first use), shared by every stream.
    pub fn encoded(&self) -> &EncodedSnapshot {
        self.encoded
            .get_or_init(|| EncodedSnapshot::from_bytes(self.content.encode(&self.identity())))
    }

    /// Whether the complete encoding has been made (for tests of who encodes when).
    #[cfg(test)]
    pub fn encoded_yet(&self) -> bool {
        self.encoded.get().is_some()
    }

    /// Routes, the default backend counting as one.
    pub fn route_count(&self) -> usize {
        self.content.routes.routes + usize::from(self.content.default_backend.is_some())
    }

    /// What differs from the build before it, as the translator said.
    pub fn since(&self) -> Option<&Since> {
        self.since.as_ref()
    }

    /// Replaces what it says differs from an earlier build (see
    /// `publisher::carry_changes`).
    pub fn set_since(&mut self, since: Option<Since>) {
        self.since = since;
    }

    /// What changed since the build whose content hash is `base`, if this build knows.
    pub fn changed_since(&self, base: &str) -> Option<&Changed> {
        self.since
            .as_ref()
            .filter(|s| s.content_hash == base)
            .map(|s| &s.changed)
    }

    /// The snapshot's resources with their hashes.
    pub fn inventory(&self) -> Arc<Inventory> {
        self.inventory
            .get_or_init(|| Arc::new(holdfast_proto::delta::inventory(self.snapshot())))
            .clone()
    }

    /// The delta from `base`, a snapshot this control plane published, to this one: from
    /// this build's change list when `base` is the content it was built after, else by
    /// comparing inventories.
    pub fn delta_since(&self, base: &Published) -> SnapshotDelta {
        match self.changed_since(&base.content_hash) {
            Some(changed) => self.delta_of(&base.version, changed),
            None => holdfast_proto::delta::diff_to(
                &base.version,
                &base.inventory(),
                self.snapshot(),
                &self.inventory(),
            ),
        }
    }

    /// The encoded delta from `base`, a snapshot this control plane published, to this
    /// one; `None` when the complete snapshot is no larger. Computed once per base and
    /// shared by every stream: from this build's change list when `base` is the content
    /// it was built after (O(change)), else by comparing inventories (O(snapshot)).
    pub fn delta_from_published(&self, base: &Published) -> Option<Bytes> {
        let mut deltas = self.deltas.locked();
        if let Some(known) = deltas.get(&base.version) {
            return known.clone();
        }
        let made = self.smaller(self.delta_since(base));
        // Proxies hold a handful of versions; a bound keeps a pathological spread small.
        if deltas.len() < 64 {
            deltas.insert(base.version.clone(), made.clone());
        }
        made
    }

    /// The encoded delta from the snapshot `base_version` whose resources a proxy stated
    /// (`base`), for that stream only; `None` when the complete snapshot is no larger.
    pub fn delta_from_inventory(&self, base_version: &str, base: &Inventory) -> Option<Bytes> {
        self.smaller(holdfast_proto::delta::diff_to(
            base_version,
            base,
            self.snapshot(),
            &self.inventory(),
        ))
    }

    fn smaller(&self, delta: SnapshotDelta) -> Option<Bytes> {
        let bytes = prost::Message::encode_to_vec(&delta);
        (bytes.len() < self.encoded_len).then(|| Bytes::from(bytes))
    }

    /// The delta from `base_version` given what changed: each changed name is upserted
    /// if this content has it and removed if not.
    fn delta_of(&self, base_version: &str, changed: &Changed) -> SnapshotDelta {
        let c = &self.content;
        let mut d = SnapshotDelta {
            base_version: base_version.to_owned(),
            version: self.version.clone(),
            content_hash: self.content_hash.clone(),
            cluster_revision: self.cluster_revision,
            progress: self.progress.clone(),
            default_backend_changed: changed.default_backend,
            default_backend: c.default_backend.clone(),
            default_certificate_changed: changed.default_certificate,
            default_certificate: c.default_certificate.clone(),
            ..SnapshotDelta::default()
        };
        for name in &changed.virtual_hosts {
            match c.virtual_host(name) {
                Some(v) => d.upserted_virtual_hosts.push((**v).clone()),
                None => d.removed_virtual_hosts.push(name.clone()),
            }
        }
        for name in &changed.backends {
            match c.backend(name) {
                Some(b) => d.upserted_backends.push((**b).clone()),
                None => d.removed_backends.push(name.clone()),
            }
        }
        for name in &changed.certificates {
            match c.certificate(name) {
                Some(cert) => d.upserted_certificates.push(cert.clone()),
                None => d.removed_certificates.push(name.clone()),
            }
        }
        for name in &changed.gateway_listeners {
            match c.gateway_listener(name) {
                Some(l) => d.upserted_gateway_listeners.push((**l).clone()),
                None => d.removed_gateway_listeners.push(name.clone()),
            }
        }
        for name in &changed.gateway_hosts {
            match c.gateway_host(name) {
                Some(g) => d.upserted_gateway_hosts.push((**g).clone()),
                None => d.removed_gateway_hosts.push(name.clone()),
            }
        }
        d
    }
}

/// Sync state of one watched kind.
#[derive(Debug, Clone, Default)]
pub struct CacheStatus {
    /// Complete list held, not re-listing.
    pub synced: bool,
    /// Last watch error and when it happened.
    pub last_error: Option<(String, SystemTime)>,
    /// Why API discovery says the kind does not exist (its CRD is not installed): the
    /// cache is then complete and empty. None: served (or not asked about).
    pub absent: Option<String>,
}

/// A snapshot held back by the bounded-destruction guard.
#[derive(Debug, Clone)]
pub struct Hold {
    /// The name of what is held (`GetStatus` `held.version`, what `ApproveHeldSnapshot`
    /// takes): the held set's name for a removal hold, the snapshot's version for a size
    /// hold.
    pub name: String,
    /// The routes held back (a removal hold; empty for a size hold). They stay in the
    /// published snapshot until approved or confirmed.
    pub routes: BTreeSet<RouteKey>,
    /// The newest build (sealed and valid), without the held routes: what approval or
    /// confirmation publishes.
    pub snapshot: Arc<Published>,
    /// False for a hold nothing may release (over --max-snapshot-bytes): no fresh read
    /// confirms it and no operator approves it; only a smaller snapshot replaces it.
    pub confirmable: bool,
    /// Why it is held.
    pub reason: String,
    /// Routes in the published snapshot when it was held.
    pub routes_published: usize,
    /// Routes in the newest build.
    pub routes_held: usize,
    /// When the held set was first held (the rest of the snapshot may change since).
    pub since: SystemTime,
    /// Same, monotonic (for the confirmation period).
    pub since_instant: Instant,
}

#[derive(Debug, Default)]
struct Status {
    caches: BTreeMap<&'static str, CacheStatus>,
    held: Option<Hold>,
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

/// How many published versions a replica keeps for `Admin/GetChanges`.
pub const HISTORY: usize = 16;

/// How many published versions' progress a replica keeps for `Admin/GetRollout`.
pub const STAMPS: usize = 4096;

/// How many proxies that left a replica keeps for `Admin/GetRollout`, and for how long.
pub const DEPARTED: usize = 256;
const DEPARTED_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

#[derive(Debug)]
struct Inner {
    published: watch::Sender<Option<Arc<Published>>>,
    /// The versions published last, newest last (they share their resources).
    /// Held while deciding and publishing (offers, approvals, confirmations).
    publishing: Mutex<()>,
    history: Mutex<std::collections::VecDeque<Arc<Published>>>,
    status: Mutex<Status>,
    proxies: Mutex<BTreeMap<u64, v1::ProxyStatus>>,
    /// The versions published last ([`STAMPS`] of them, newest last) and the furthest
    /// progress each was published at.
    stamps: Mutex<std::collections::VecDeque<(String, Vec<KindProgress>)>>,
    /// Proxies whose stream ended, and when (at most [`DEPARTED`], for an hour).
    departed: Mutex<std::collections::VecDeque<(v1::ProxyStatus, SystemTime)>>,
    next_stream: AtomicU64,
    metrics: Metrics,
}

impl Shared {
    /// Empty state: nothing published, no cache synced.
    pub fn new(metrics: Metrics) -> Self {
        let status = Status {
            caches: KINDS.iter().map(|k| (*k, CacheStatus::default())).collect(),
            held: None,
            problems: Vec::new(),
        };
        // Every kind's series exist from the start (synced 0, no watch errors), so that
        // alerts and rate() see them before the first change.
        for kind in KINDS {
            let label = KindLabel { kind: kind.into() };
            metrics.cache_synced.get_or_create(&label).set(0);
            let _ = metrics.watch_errors.get_or_create(&label);
            let _ = metrics.watch_forbidden.get_or_create(&label);
            let _ = metrics.cache_lists.get_or_create(&label);
            metrics.cache_absent.get_or_create(&label).set(0);
        }
        Shared {
            inner: Arc::new(Inner {
                published: watch::channel(None).0,
                publishing: Mutex::new(()),
                history: Mutex::new(std::collections::VecDeque::new()),
                status: Mutex::new(status),
                proxies: Mutex::new(BTreeMap::new()),
                stamps: Mutex::new(std::collections::VecDeque::new()),
                departed: Mutex::new(std::collections::VecDeque::new()),
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
    pub fn publish(&self, published: Arc<Published>) {
        self.stamp_published(&published.version, &published.progress);
        let m = &self.inner.metrics;
        let restamp = self
            .published()
            .is_some_and(|p| p.content_hash == published.content_hash);
        if restamp {
            // The same content at newer progress: no new snapshot for the proxies that
            // serve it, so neither logged as one nor counted.
            tracing::debug!(version = %published.version, "published progress");
            self.inner.published.send_replace(Some(published));
            return;
        }
        m.snapshot_revision.set(published.cluster_revision as i64);
        m.snapshot_routes.set(published.route_count() as i64);
        m.published.inc();
        tracing::info!(
            version = %published.version,
            routes = published.route_count(),
            backends = published.content.backends.len(),
            bytes = published.encoded_len,
            "published snapshot"
        );
        {
            let mut history = self.inner.history.locked();
            if history.len() == HISTORY {
                history.pop_front();
            }
            // A copy sharing the resources but none of the encodings a stream made, so
            // the history costs pointers, not snapshots.
            history.push_back(Arc::new(published.shadow()));
        }
        self.inner.published.send_replace(Some(published));
    }

    /// The published snapshot `version`, if it is among the last [`HISTORY`].
    pub fn recently_published(&self, version: &str) -> Option<Arc<Published>> {
        self.inner
            .history
            .locked()
            .iter()
            .rev()
            .find(|p| p.version == version)
            .cloned()
    }

    /// True once the first complete snapshot has been published.
    pub fn ready(&self) -> bool {
        self.inner.published.borrow().is_some()
    }

    /// Records the sync state of a kind.
    pub fn set_synced(&self, kind: &'static str, synced: bool) {
        self.inner
            .status
            .locked()
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

    /// The kinds API discovery says do not exist (see [`CacheStatus::absent`]).
    pub fn absent_kinds(&self) -> Vec<&'static str> {
        self.inner
            .status
            .locked()
            .caches
            .iter()
            .filter(|(_, c)| c.absent.is_some())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Records what API discovery last answered of an optional kind: `Some(why)` it does
    /// not exist, `None` it is served.
    pub fn set_absent(&self, kind: &'static str, absent: Option<String>) {
        self.inner
            .metrics
            .cache_absent
            .get_or_create(&KindLabel { kind: kind.into() })
            .set(i64::from(absent.is_some()));
        self.inner
            .status
            .locked()
            .caches
            .entry(kind)
            .or_default()
            .absent = absent;
    }

    /// Counts a complete list of a kind.
    pub fn count_list(&self, kind: &'static str) {
        self.inner
            .metrics
            .cache_lists
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Records a watch error of a kind (`forbidden`: the API server answered 403).
    pub fn record_watch_error(&self, kind: &'static str, error: String, forbidden: bool) {
        if forbidden {
            self.inner
                .metrics
                .watch_forbidden
                .get_or_create(&KindLabel { kind: kind.into() })
                .inc();
        }
        self.inner
            .status
            .locked()
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
        self.inner.status.locked().caches.values().all(|c| c.synced)
    }

    /// Kinds whose cache is not complete.
    pub fn unsynced(&self) -> Vec<&'static str> {
        self.inner
            .status
            .locked()
            .caches
            .iter()
            .filter(|(_, c)| !c.synced)
            .map(|(k, _)| *k)
            .collect()
    }

    /// The held snapshot, if any.
    pub fn held(&self) -> Option<Hold> {
        self.inner.status.locked().held.clone()
    }

    /// Holds `held` back. If the same set is already held (same name, or for a size hold
    /// the same content), the hold keeps
    /// its name and `since`, so the name an operator read from `GetStatus` stays
    /// approvable and the confirmation period runs on, while the newest build it would
    /// publish is updated. Returns true if this is a new hold.
    pub fn hold(&self, held: Hold) -> bool {
        let mut status = self.inner.status.locked();
        // A size hold is named by its snapshot's version; the same content at a newer
        // cluster revision is the same hold.
        let same_size_hold = |old: &Hold| {
            !old.confirmable
                && !held.confirmable
                && old.snapshot.content_hash == held.snapshot.content_hash
        };
        if let Some(old) = status.held.as_mut()
            && (old.name == held.name || same_size_hold(old))
        {
            old.snapshot = held.snapshot;
            old.routes = held.routes;
            old.routes_published = held.routes_published;
            old.routes_held = held.routes_held;
            return false;
        }
        status.held = Some(held);
        self.inner.metrics.held.set(1);
        self.inner.metrics.holds.inc();
        true
    }

    /// Drops any hold (nothing is held back any more).
    pub fn clear_hold(&self) {
        let mut status = self.inner.status.locked();
        if status.held.take().is_some() {
            self.inner.metrics.held.set(0);
        }
    }

    /// Serialises what decides and publishes: the reconcile loop's offers, approvals and
    /// confirmations (see the lock order at the top of this file).
    pub fn publishing(&self) -> MutexGuard<'_, ()> {
        self.inner.publishing.locked()
    }

    /// Publishes the newest build of the hold named `name` (the held routes go), if it is
    /// still held. Returns the version published.
    pub fn release_hold_if(&self, name: &str) -> Option<String> {
        let _publishing = self.publishing();
        let held = {
            let mut status = self.inner.status.locked();
            if status.held.as_ref().is_none_or(|h| h.name != name) {
                return None;
            }
            status.held.take()?
        };
        self.inner.metrics.held.set(0);
        self.count_release("confirmation");
        let version = held.snapshot.version.clone();
        self.publish(held.snapshot);
        Some(version)
    }

    fn count_release(&self, by: &'static str) {
        self.inner
            .metrics
            .hold_releases
            .get_or_create(&crate::metrics::ReleaseLabel { by })
            .inc();
    }

    /// Operator approval of the hold named `name`: publishes its newest build, without
    /// the held routes. Returns the version published.
    pub fn approve(&self, name: &str) -> Result<String, ApproveError> {
        let _publishing = self.publishing();
        let held = {
            let mut status = self.inner.status.locked();
            let held = status.held.as_ref().ok_or(ApproveError::NothingHeld)?;
            if held.name != name {
                return Err(ApproveError::VersionMismatch {
                    held: held.name.clone(),
                    requested: name.to_owned(),
                });
            }
            if !held.confirmable {
                return Err(ApproveError::TooLarge);
            }
            status.held.take().ok_or(ApproveError::NothingHeld)?
        };
        self.inner.metrics.held.set(0);
        self.count_release("approval");
        let version = held.snapshot.version.clone();
        tracing::warn!(held = name, %version, reason = %held.reason, routes = held.routes.len(), "held removal approved by an operator");
        self.publish(held.snapshot);
        Ok(version)
    }

    /// Records the problems of the last build (for `Admin.GetStatus`).
    pub fn set_problems(&self, problems: Vec<crate::translate::Problem>) {
        self.inner.status.locked().problems = problems;
    }

    /// The status for `Admin.GetStatus`.
    pub fn status(&self) -> v1::GetStatusResponse {
        let status = self.inner.status.locked();
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
                        absent: c.absent.unwrap_or_default(),
                    }
                })
                .collect(),
            published_version: published
                .as_ref()
                .map(|p| p.version.clone())
                .unwrap_or_default(),
            last_publish_time: published.map(|p| p.at.into()),
            held: status.held.as_ref().map(|h| v1::HeldSnapshot {
                version: h.name.clone(),
                reason: h.reason.clone(),
                routes_published: h.routes_published as u32,
                routes_held: h.routes_held as u32,
                held_since: Some(h.since.into()),
                held_route_count: h.routes.len() as u32,
                held_routes: h
                    .routes
                    .iter()
                    .take(100)
                    .map(|(host, _, path)| {
                        if host.is_empty() && path == "*" {
                            "(default backend)".to_owned()
                        } else {
                            format!("{host}{path}")
                        }
                    })
                    .collect(),
            }),
            problems: status
                .problems
                .iter()
                .map(|p| v1::Problem {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    reason: p.reason.as_str().into(),
                    message: p.message.clone(),
                })
                .collect(),
        }
    }

    /// Records that `version` was published at `progress` (a restamp of the same version
    /// raises its progress).
    fn stamp_published(&self, version: &str, progress: &[KindProgress]) {
        let mut stamps = self.inner.stamps.locked();
        if let Some((_, p)) = stamps.iter_mut().rev().find(|(v, _)| v == version) {
            for newer in progress {
                match p.iter_mut().find(|k| k.kind == newer.kind) {
                    Some(k) => k.resource_version = k.resource_version.max(newer.resource_version),
                    None => p.push(newer.clone()),
                }
            }
            return;
        }
        if stamps.len() == STAMPS {
            stamps.pop_front();
        }
        stamps.push_back((version.to_owned(), progress.to_vec()));
    }

    /// The furthest progress `version` was published at, if it is among the last
    /// [`STAMPS`] versions published.
    pub fn stamp(&self, version: &str) -> Option<Vec<KindProgress>> {
        self.inner
            .stamps
            .locked()
            .iter()
            .rev()
            .find(|(v, _)| v == version)
            .map(|(_, p)| p.clone())
    }

    /// Proxies whose stream ended within the last hour, and when.
    pub fn departed(&self) -> Vec<(v1::ProxyStatus, SystemTime)> {
        let now = SystemTime::now();
        self.inner
            .departed
            .locked()
            .iter()
            .filter(|(_, at)| now.duration_since(*at).unwrap_or_default() < DEPARTED_FOR)
            .cloned()
            .collect()
    }

    /// Registers a proxy stream; returns its id for later updates.
    pub fn add_proxy(&self, status: v1::ProxyStatus) -> u64 {
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        self.inner.proxies.locked().insert(id, status);
        self.inner.metrics.proxies_connected.inc();
        id
    }

    /// Updates a registered proxy stream.
    pub fn update_proxy(&self, id: u64, f: impl FnOnce(&mut v1::ProxyStatus)) {
        if let Some(p) = self.inner.proxies.locked().get_mut(&id) {
            f(p);
        }
    }

    /// Removes a proxy stream.
    pub fn remove_proxy(&self, id: u64) {
        let Some(status) = self.inner.proxies.locked().remove(&id) else {
            return;
        };
        self.inner.metrics.proxies_connected.dec();
        let mut departed = self.inner.departed.locked();
        departed.retain(|(p, _)| p.id != status.id);
        if departed.len() == DEPARTED {
            departed.pop_front();
        }
        departed.push_back((status, SystemTime::now()));
    }

    /// Every connected proxy.
    pub fn proxies(&self) -> Vec<v1::ProxyStatus> {
        self.inner.proxies.locked().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use holdfast_proto::delta;
    use holdfast_proto::snapshot::seal;
    use holdfast_proto::v1::{Backend, Certificate, DefaultBackend, MatchKind, Route, VirtualHost};
    use proptest::prelude::*;
    use prost::Message;

    use super::*;

    /// Hosts `h<i>` routing to backend `b<j>` (port p) with certificate `c<k>` or none.
    fn build(
        hosts: &BTreeMap<u8, (u8, Option<u8>)>,
        ports: &BTreeMap<u8, u16>,
        certs: &BTreeMap<u8, u8>,
        default: bool,
        revision: u64,
    ) -> Snapshot {
        let mut s = Snapshot {
            virtual_hosts: hosts
                .iter()
                .filter(|(_, (b, c))| {
                    ports.contains_key(b) && c.is_none_or(|c| certs.contains_key(&c))
                })
                .map(|(h, (b, c))| VirtualHost {
                    host: format!("h{h}.test"),
                    routes: vec![Route {
                        match_kind: MatchKind::Prefix as i32,
                        path: "/".into(),
                        backend: format!("b{b}"),
                        source: None,
                    }],
                    certificate: c.map(|c| format!("c{c}")).unwrap_or_default(),
                    ssl_redirect: false,
                })
                .collect(),
            backends: ports
                .iter()
                .map(|(b, p)| Backend {
                    name: format!("b{b}"),
                    external_port: u32::from(*p),
                    ..Default::default()
                })
                .collect(),
            certificates: certs
                .iter()
                .map(|(c, serial)| Certificate {
                    name: format!("c{c}"),
                    serial: serial.to_string(),
                    ..Default::default()
                })
                .collect(),
            default_backend: ports
                .keys()
                .next()
                .filter(|_| default)
                .map(|b| DefaultBackend {
                    backend: format!("b{b}"),
                    source: None,
                }),
            ..Default::default()
        };
        s.default_certificate = s
            .certificates
            .first()
            .map(|c| c.name.clone())
            .unwrap_or_default();
        seal(&mut s, revision);
        s
    }

    prop_compose! {
        fn arb(revision: u64)(
            hosts in prop::collection::btree_map(0u8..10, (0u8..4, prop::option::of(0u8..3)), 0..8),
            ports in prop::collection::btree_map(0u8..4, 1u16..3, 0..4),
            certs in prop::collection::btree_map(0u8..3, 0u8..2, 0..3),
            default in any::<bool>(),
        ) -> Snapshot {
            build(&hosts, &ports, &certs, default, revision)
        }
    }

    /// The change-list check refuses a changed host that names a missing backend (in a
    /// debug build the whole check runs after it, and would panic were it passed).
    #[test]
    fn a_changed_host_naming_a_missing_backend_fails_the_change_list_check() {
        let hosts = BTreeMap::from([(1u8, (0u8, None)), (2, (0, None))]);
        let ports = BTreeMap::from([(0u8, 1u16)]);
        let before = build(&hosts, &ports, &BTreeMap::new(), false, 1);
        let mut after = before.clone();
        after.virtual_hosts[0].routes[0].backend = "b9".into();
        seal(&mut after, 2);
        let since = Since {
            content_hash: before.content_hash.clone(),
            changed: Changed::between(&before, &after),
        };
        let built = Published::built(Content::of(&after), Some(since), 2);
        assert!(matches!(
            built.validate(),
            Err(InvalidSnapshot::MissingBackend { .. })
        ));
    }

    /// The same for an Ingress host in the one route model (the Gateway host of listener
    /// `ingress`, which has no Gateway listener): a missing certificate or backend is
    /// refused, and a valid change passes.
    #[test]
    fn a_changed_ingress_host_in_the_one_model_is_checked_against_what_it_names() {
        let hosts = BTreeMap::from([(1u8, (0u8, Some(0u8))), (2, (0, None))]);
        let ports = BTreeMap::from([(0u8, 1u16)]);
        let certs = BTreeMap::from([(0u8, 0u8)]);
        let mut before = build(&hosts, &ports, &certs, false, 1);
        before.gateway_hosts = std::mem::take(&mut before.virtual_hosts)
            .iter()
            .map(holdfast_proto::snapshot::ingress_gateway_host)
            .collect();
        seal(&mut before, 1);
        let check = |edit: &dyn Fn(&mut Snapshot)| {
            let mut after = before.clone();
            edit(&mut after);
            seal(&mut after, 2);
            let since = Since {
                content_hash: before.content_hash.clone(),
                changed: Changed::between(&before, &after),
            };
            Published::built(Content::of(&after), Some(since), 2).validate()
        };
        assert_eq!(
            check(&|s| s.gateway_hosts[0].routes[0].path = "/x".into()),
            Ok(())
        );
        assert!(matches!(
            check(&|s| s.gateway_hosts[0].certificate = "c9".into()),
            Err(InvalidSnapshot::MissingCertificate { .. })
        ));
        assert!(matches!(
            check(&|s| s.gateway_hosts[1].routes[0].backends[0].backend = "b9".into()),
            Err(InvalidSnapshot::BadGateway { .. })
        ));
    }

    prop_compose! {
        /// A snapshot and a small edit of it: one host added, changed or removed, and one
        /// backend's port set. Most such deltas are smaller than the snapshot.
        fn edited()(
            hosts in prop::collection::btree_map(0u8..10, (0u8..4, prop::option::of(0u8..3)), 0..8),
            ports in prop::collection::btree_map(0u8..4, 1u16..3, 0..4),
            certs in prop::collection::btree_map(0u8..3, 0u8..2, 0..3),
            default in any::<bool>(),
            host in 0u8..10,
            route in (0u8..4, prop::option::of(0u8..3)),
            remove in any::<bool>(),
            port in (0u8..4, 1u16..3),
        ) -> (Snapshot, Snapshot) {
            let before = build(&hosts, &ports, &certs, default, 1);
            let mut hosts = hosts;
            if remove {
                hosts.remove(&host);
            } else {
                hosts.insert(host, route);
            }
            let mut ports = ports;
            ports.insert(port.0, port.1);
            (before, build(&hosts, &ports, &certs, default, 2))
        }
    }

    /// A build's delta from the build before it, made from its change list alone, turns
    /// that snapshot into this one; and its encoding, written from the shared resources,
    /// is the snapshot.
    ///
    /// The delta is checked only when one is sent (it is smaller than the snapshot), so
    /// the pairs are half unrelated snapshots and half small edits, and the test fails
    /// unless a delta was sent in at least a quarter of the cases.
    #[test]
    fn a_delta_from_the_change_list_makes_the_next_snapshot() {
        let (cases, sent) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
        let pairs = prop_oneof![(arb(1), arb(2)), edited()];
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let result = runner.run(&pairs, |(before, after)| {
            cases.set(cases.get() + 1);
            let base = Published::new(before.clone());
            let since = Since {
                content_hash: before.content_hash.clone(),
                changed: Changed::between(&before, &after),
            };
            let next = Published::built(Content::of(&after), Some(since), 2);
            prop_assert_eq!(next.validate(), Ok(()));
            let decoded = Snapshot::decode(next.encoded().bytes().clone()).unwrap();
            prop_assert_eq!(&decoded, next.snapshot());
            prop_assert_eq!(next.encoded_len, next.encoded().bytes().len());
            prop_assert_eq!(
                next.encoded_len,
                prost::Message::encoded_len(next.snapshot())
            );
            let direct = next.delta_since(&base);
            let shared = next.delta_from_published(&base);
            prop_assert_eq!(
                shared.is_some(),
                prost::Message::encoded_len(&direct) < next.encoded_len,
                "a delta is sent exactly when it is smaller than the snapshot"
            );
            if let Some(bytes) = shared {
                sent.set(sent.get() + 1);
                let d = SnapshotDelta::decode(bytes).unwrap();
                prop_assert_eq!(&d, &direct);
                let made = delta::apply(&before, &d).expect("the delta applies to its base");
                let mut want = next.snapshot().clone();
                want.created_at = None;
                prop_assert_eq!(made, want);
                // Shared: the second stream with this base gets the same bytes.
                prop_assert_eq!(
                    next.delta_from_published(&base),
                    Some(prost::Message::encode_to_vec(&d).into())
                );
            }
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
        let (cases, sent) = (cases.get(), sent.get());
        eprintln!("a delta was sent in {sent} of {cases} cases");
        assert!(
            sent * 4 >= cases,
            "a delta was sent in only {sent} of {cases} cases: the property was barely checked"
        );
    }
}
