//! Snapshot deltas: per-resource hashes, the inventory a proxy
//! states, the delta from an inventory to a snapshot, and applying a delta to a base.
//!
//! A snapshot is a set of named resources: virtual hosts (by host), backends and
//! certificates (by name), and the two singletons default backend and default
//! certificate. A resource's hash is SHA-256 over its kind's tag byte and its protobuf
//! encoding (deterministic: prost writes fields in tag order and the translator sorts
//! every list), so two resources with the same kind and hash are the same resource.
//!
//! [`diff`] compares an inventory (what the proxy holds) with a snapshot and names what to
//! upsert and remove. [`apply`] rebuilds the snapshot from its base and a delta, and
//! refuses the result unless it passes [`crate::snapshot::validate`]: the stated content
//! hash must match the content (so a delta that was computed against another base, lost
//! a resource or corrupted one is caught), and every route's backend and every host's
//! certificate must exist. Nothing is served that a full snapshot with the same identity
//! would not have been.

use std::collections::BTreeMap;

use crate::content::{ContentSum, Hasher, default_certificate_hash, for_each_resource, hash_all};
use crate::snapshot::{self, InvalidSnapshot};
use crate::v1::{ResourceHash, ResourceKind, Snapshot, SnapshotDelta};

/// A resource's identity: its kind and name.
pub type Key = (ResourceKind, String);

/// What a proxy holds: each resource's hash by identity.
pub type Inventory = BTreeMap<Key, [u8; 32]>;

/// Every resource of `snapshot` with its hash.
pub fn inventory(snapshot: &Snapshot) -> Inventory {
    let mut out = Inventory::new();
    for_each_resource(snapshot, |kind, name, hash| {
        out.insert((kind, name.to_owned()), hash);
    });
    out
}

/// The inventory as sent in a `DiscoveryRequest`.
pub fn to_wire(inventory: &Inventory) -> Vec<ResourceHash> {
    inventory
        .iter()
        .map(|((kind, name), hash)| ResourceHash {
            kind: *kind as i32,
            name: name.clone(),
            hash: hash.to_vec(),
        })
        .collect()
}

/// Why a stated inventory cannot be used (the control plane then sends a full snapshot).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadInventory {
    /// An entry has an unknown kind or a hash that is not 32 bytes.
    #[error("inventory entry {kind}/{name:?} is malformed")]
    Malformed {
        /// The kind as sent.
        kind: i32,
        /// The name as sent.
        name: String,
    },
    /// Two entries name the same resource.
    #[error("inventory names {0:?} twice")]
    Duplicate(String),
}

/// The inventory a proxy sent, checked.
pub fn from_wire(entries: &[ResourceHash]) -> Result<Inventory, BadInventory> {
    let mut out = Inventory::new();
    for e in entries {
        let kind = ResourceKind::try_from(e.kind)
            .ok()
            .filter(|k| *k != ResourceKind::Unspecified);
        let hash: Option<[u8; 32]> = e.hash.as_slice().try_into().ok();
        let (Some(kind), Some(hash)) = (kind, hash) else {
            return Err(BadInventory::Malformed {
                kind: e.kind,
                name: e.name.clone(),
            });
        };
        if out.insert((kind, e.name.clone()), hash).is_some() {
            return Err(BadInventory::Duplicate(e.name.clone()));
        }
    }
    Ok(out)
}

/// The delta that turns the snapshot `base_version`, whose resources are `base`, into
/// `next`: the resources of `next` whose hash differs from (or is missing in) `base`,
/// and the names `base` has that `next` does not.
pub fn diff(base_version: &str, base: &Inventory, next: &Snapshot) -> SnapshotDelta {
    diff_to(base_version, base, next, &inventory(next))
}

/// [`diff`], given the inventory of `next` (`wanted`), which a control plane computes
/// once per snapshot it publishes rather than once per delta.
pub fn diff_to(
    base_version: &str,
    base: &Inventory,
    next: &Snapshot,
    wanted: &Inventory,
) -> SnapshotDelta {
    let changed = |kind: ResourceKind, name: &str| {
        let key = (kind, name.to_owned());
        base.get(&key) != wanted.get(&key)
    };
    let removed = |kind: ResourceKind| -> Vec<String> {
        base.keys()
            .filter(|(k, name)| *k == kind && !wanted.contains_key(&(kind, name.clone())))
            .map(|(_, name)| name.clone())
            .collect()
    };
    SnapshotDelta {
        base_version: base_version.to_owned(),
        version: next.version.clone(),
        content_hash: next.content_hash.clone(),
        cluster_revision: next.cluster_revision,
        progress: next.progress.clone(),
        upserted_virtual_hosts: next
            .virtual_hosts
            .iter()
            .filter(|v| changed(ResourceKind::VirtualHost, &v.host))
            .cloned()
            .collect(),
        removed_virtual_hosts: removed(ResourceKind::VirtualHost),
        upserted_backends: next
            .backends
            .iter()
            .filter(|b| changed(ResourceKind::Backend, &b.name))
            .cloned()
            .collect(),
        removed_backends: removed(ResourceKind::Backend),
        upserted_certificates: next
            .certificates
            .iter()
            .filter(|c| changed(ResourceKind::Certificate, &c.name))
            .cloned()
            .collect(),
        removed_certificates: removed(ResourceKind::Certificate),
        default_backend_changed: changed(ResourceKind::DefaultBackend, ""),
        default_backend: next.default_backend.clone(),
        default_certificate_changed: changed(ResourceKind::DefaultCertificate, ""),
        default_certificate: next.default_certificate.clone(),
        upserted_gateway_listeners: next
            .gateway_listeners
            .iter()
            .filter(|l| changed(ResourceKind::GatewayListener, &l.name))
            .cloned()
            .collect(),
        removed_gateway_listeners: removed(ResourceKind::GatewayListener),
        upserted_gateway_hosts: next
            .gateway_hosts
            .iter()
            .filter(|g| changed(ResourceKind::GatewayHost, &g.name))
            .cloned()
            .collect(),
        removed_gateway_hosts: removed(ResourceKind::GatewayHost),
    }
}

/// Why a delta is refused (the proxy NACKs it and keeps what it serves).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDelta {
    /// The delta applies to another snapshot than the one held.
    #[error("delta applies to {wanted:?}, but the snapshot held is {held:?}")]
    UnknownBase {
        /// The delta's base version.
        wanted: String,
        /// The version held.
        held: String,
    },
    /// The delta removes a resource the base does not have.
    #[error("delta removes {kind} {name:?}, which the base does not have")]
    UnknownRemoval {
        /// "virtual host", "backend" or "certificate".
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The delta names a resource twice (upserted and removed, or twice either way).
    #[error("delta names {kind} {name:?} twice")]
    Duplicate {
        /// "virtual host", "backend" or "certificate".
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The snapshot base + delta makes is not valid (its content hash does not match, a
    /// reference is missing, ...).
    #[error("base + delta")]
    Result(#[from] InvalidSnapshot),
}

/// The resource hashes of a snapshot and their content sum: what checking a delta's
/// content hash takes, kept beside the snapshot a proxy serves so the check costs
/// O(change) ([`apply_hashed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hashed {
    hashes: Inventory,
    sum: ContentSum,
}

impl Hashed {
    /// The hashes of every resource of `snapshot`, and their sum.
    pub fn of(snapshot: &Snapshot) -> Self {
        let (hashed, sum) = hash_all(snapshot);
        Hashed {
            hashes: hashed
                .into_iter()
                .map(|(kind, name, hash)| ((kind, name.to_owned()), hash))
                .collect(),
            sum,
        }
    }

    /// Checks `snapshot` as [`snapshot::validate`] does (structure, references, content
    /// hash, version) and returns its hashes.
    pub fn verified(snapshot: &Snapshot) -> Result<Self, InvalidSnapshot> {
        snapshot::validate_structure(snapshot)?;
        let hashed = Hashed::of(snapshot);
        snapshot::validate_identity(snapshot, &hashed.content_hash())?;
        Ok(hashed)
    }

    /// Each resource's hash.
    pub fn inventory(&self) -> &Inventory {
        &self.hashes
    }

    /// The content hash of the snapshot these are the hashes of.
    pub fn content_hash(&self) -> String {
        self.sum.content_hash()
    }

    /// Takes in the changes [`apply_hashed`] computed: these become the hashes of the
    /// snapshot it made. O(change).
    pub fn commit(&mut self, edit: HashEdit) {
        for (key, hash) in edit.changes {
            match hash {
                Some(h) => self.hashes.insert(key, h),
                None => self.hashes.remove(&key),
            };
        }
        self.sum = edit.sum;
    }
}

/// How a delta changes a [`Hashed`]: each changed resource's new hash (`None`: removed)
/// and the new sum.
#[derive(Debug)]
pub struct HashEdit {
    changes: Vec<(Key, Option<[u8; 32]>)>,
    sum: ContentSum,
}

/// Applies `delta` to `base` by name and returns the snapshot it makes, after checking
/// it as a full snapshot is checked ([`snapshot::validate`]: content hash, version,
/// structure, references). Hashes all of `base`; a proxy keeps its [`Hashed`] and calls
/// [`apply_hashed`].
pub fn apply(base: &Snapshot, delta: &SnapshotDelta) -> Result<Snapshot, InvalidDelta> {
    apply_hashed(base, &Hashed::of(base), delta).map(|(next, _)| next)
}

/// [`apply`], given the hashes of `base`: the content hash of the result is computed
/// from them and the delta's resources alone. Returns the snapshot and the edit that
/// makes `hashed` its hashes ([`Hashed::commit`]). The rest is O(snapshot): it rebuilds
/// the whole snapshot and validates it, which makes it the reference that [`Held`] (what
/// a proxy uses, O(change)) is tested against.
fn apply_hashed(
    base: &Snapshot,
    hashed: &Hashed,
    delta: &SnapshotDelta,
) -> Result<(Snapshot, HashEdit), InvalidDelta> {
    if delta.base_version != base.version {
        return Err(InvalidDelta::UnknownBase {
            wanted: delta.base_version.clone(),
            held: base.version.clone(),
        });
    }
    let virtual_hosts = merge(
        "virtual host",
        &base.virtual_hosts,
        &delta.upserted_virtual_hosts,
        &delta.removed_virtual_hosts,
        |v| &v.host,
    )?;
    let backends = merge(
        "backend",
        &base.backends,
        &delta.upserted_backends,
        &delta.removed_backends,
        |b| &b.name,
    )?;
    let certificates = merge(
        "certificate",
        &base.certificates,
        &delta.upserted_certificates,
        &delta.removed_certificates,
        |c| &c.name,
    )?;
    let gateway_listeners = merge(
        "gateway listener",
        &base.gateway_listeners,
        &delta.upserted_gateway_listeners,
        &delta.removed_gateway_listeners,
        |l| &l.name,
    )?;
    let gateway_hosts = merge(
        "gateway host",
        &base.gateway_hosts,
        &delta.upserted_gateway_hosts,
        &delta.removed_gateway_hosts,
        |g| &g.name,
    )?;
    let next = Snapshot {
        version: delta.version.clone(),
        content_hash: delta.content_hash.clone(),
        cluster_revision: delta.cluster_revision,
        progress: delta.progress.clone(),
        created_at: None,
        virtual_hosts,
        backends,
        default_backend: if delta.default_backend_changed {
            delta.default_backend.clone()
        } else {
            base.default_backend.clone()
        },
        certificates,
        default_certificate: if delta.default_certificate_changed {
            delta.default_certificate.clone()
        } else {
            base.default_certificate.clone()
        },
        gateway_listeners,
        gateway_hosts,
    };
    snapshot::validate_structure(&next)?;
    let edit = hash_edit(hashed, delta);
    snapshot::validate_identity(&next, &edit.sum.content_hash())?;
    Ok((next, edit))
}

/// The hashes `delta` changes, and the sum after it. (Names the base does not have, or
/// names given twice, are refused by the merge before this is used.)
fn hash_edit(hashed: &Hashed, delta: &SnapshotDelta) -> HashEdit {
    let mut sum = hashed.sum.clone();
    let mut changes: Vec<(Key, Option<[u8; 32]>)> = Vec::new();
    let mut change = |kind: ResourceKind, name: &str, new: Option<[u8; 32]>| {
        let key = (kind, name.to_owned());
        sum.replace(hashed.hashes.get(&key), new.as_ref());
        changes.push((key, new));
    };
    let mut h = Hasher::default();
    for name in &delta.removed_virtual_hosts {
        change(ResourceKind::VirtualHost, name, None);
    }
    for name in &delta.removed_backends {
        change(ResourceKind::Backend, name, None);
    }
    for name in &delta.removed_certificates {
        change(ResourceKind::Certificate, name, None);
    }
    for name in &delta.removed_gateway_listeners {
        change(ResourceKind::GatewayListener, name, None);
    }
    for name in &delta.removed_gateway_hosts {
        change(ResourceKind::GatewayHost, name, None);
    }
    for l in &delta.upserted_gateway_listeners {
        let hash = h.hash(ResourceKind::GatewayListener, l);
        change(ResourceKind::GatewayListener, &l.name, Some(hash));
    }
    for g in &delta.upserted_gateway_hosts {
        let hash = h.hash(ResourceKind::GatewayHost, g);
        change(ResourceKind::GatewayHost, &g.name, Some(hash));
    }
    for v in &delta.upserted_virtual_hosts {
        let hash = h.hash(ResourceKind::VirtualHost, v);
        change(ResourceKind::VirtualHost, &v.host, Some(hash));
    }
    for b in &delta.upserted_backends {
        let hash = h.hash(ResourceKind::Backend, b);
        change(ResourceKind::Backend, &b.name, Some(hash));
    }
    for c in &delta.upserted_certificates {
        let hash = h.hash(ResourceKind::Certificate, c);
        change(ResourceKind::Certificate, &c.name, Some(hash));
    }
    if delta.default_backend_changed {
        let hash = delta
            .default_backend
            .as_ref()
            .map(|d| h.hash(ResourceKind::DefaultBackend, d));
        change(ResourceKind::DefaultBackend, "", hash);
    }
    if delta.default_certificate_changed {
        let hash = default_certificate_hash(&delta.default_certificate);
        change(ResourceKind::DefaultCertificate, "", hash);
    }
    HashEdit { changes, sum }
}

/// `base` (sorted by name) with `removed` taken out and `upserted` put in, sorted by name.
fn merge<T: Clone>(
    kind: &'static str,
    base: &[T],
    upserted: &[T],
    removed: &[String],
    name: impl Fn(&T) -> &String,
) -> Result<Vec<T>, InvalidDelta> {
    let mut by_name: BTreeMap<&str, &T> = base.iter().map(|r| (name(r).as_str(), r)).collect();
    let mut named = std::collections::HashSet::new();
    for gone in removed {
        if !named.insert(gone.as_str()) {
            return Err(InvalidDelta::Duplicate {
                kind,
                name: gone.clone(),
            });
        }
        if by_name.remove(gone.as_str()).is_none() {
            return Err(InvalidDelta::UnknownRemoval {
                kind,
                name: gone.clone(),
            });
        }
    }
    for r in upserted {
        if !named.insert(name(r).as_str()) {
            return Err(InvalidDelta::Duplicate {
                kind,
                name: name(r).clone(),
            });
        }
        by_name.insert(name(r).as_str(), r);
    }
    Ok(by_name.into_values().cloned().collect())
}

mod held;
pub use held::{Checked, Held, SharedNames};

#[cfg(test)]
mod tests;
