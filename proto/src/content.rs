//! A snapshot's content hash, built from its resources' hashes so that either plane can
//! update it in O(change).
//!
//! # Construction
//! A snapshot is a set of resources: virtual hosts, backends, certificates, the default
//! backend and the default certificate (see [`crate::delta`]).
//!
//! 1. Each resource has a *resource hash*: SHA-256 over its kind's tag byte and its
//!    protobuf encoding ([`resource_hash`]). The encoding holds the
//!    resource's name, so kind and hash identify the resource and its content.
//! 2. Each resource hash is expanded into an *element* of `(Z/2^16)^1024`: 2,048 bytes of
//!    BLAKE3 in extendable-output mode, keyed for this purpose alone (derive-key context
//!    [`ELEMENT_CONTEXT`]), read as 1,024 little-endian `u16` lanes.
//! 3. The *sum* of a snapshot is the lane-wise sum, modulo 2^16, of its resources'
//!    elements (LtHash16, Lewi, Kim, Maykov and Weis, "Securing Update Propagation with
//!    Homomorphic Hashing", IACR ePrint 2019/227; the same construction is in Facebook's
//!    folly as `LtHash<16, 1024>`). Adding or removing a resource adds or subtracts its
//!    element: O(1) per changed resource, independent of the snapshot's size and of the
//!    order resources are visited in.
//! 4. The content hash is SHA-256 (lower-case hex) of the sum's 2,048 bytes.
//!
//! # Why it is collision-resistant
//! Two snapshots with different content and the same content hash give either a SHA-256
//! collision (step 4), or two different sets of resources with the same sum. In the
//! second case, either two different resources share a resource hash (a SHA-256
//! collision, step 1), or two different sets of resource hashes have element sums that
//! agree: a collision of LtHash16, which with the element function modelled as a random
//! oracle is as hard as finding a short non-zero vector in a random lattice (the Short
//! Integer Solution problem in dimension 1,024 modulo 2^16). The paper above estimates
//! over 200 bits of security for these parameters; a sum over 256 bits (one SHA-256 per
//! resource, added) would be broken by Wagner's generalised birthday attack, and XOR by
//! linear algebra, which is why the elements are this wide. A snapshot never holds a
//! resource twice (names are unique per kind, and validation refuses duplicates), so the
//! sum is over a set, not a multiset.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::v1::{ResourceKind, Snapshot};

/// The BLAKE3 derive-key context of the element function (domain separation: these
/// bytes are used for nothing else).
pub const ELEMENT_CONTEXT: &str = "holdfast 2026-12-03 snapshot content element v1";

/// Lanes of a sum.
const LANES: usize = 1024;

/// The order-independent sum of a set of resource hashes; see the module documentation.
#[derive(Clone, PartialEq, Eq)]
pub struct ContentSum {
    lanes: Box<[u16; LANES]>,
}

impl Default for ContentSum {
    fn default() -> Self {
        ContentSum {
            lanes: Box::new([0; LANES]),
        }
    }
}

impl std::fmt::Debug for ContentSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContentSum({})", self.content_hash())
    }
}

impl ContentSum {
    /// The sum of `resource_hashes`.
    pub fn of<'a>(resource_hashes: impl IntoIterator<Item = &'a [u8; 32]>) -> Self {
        let mut sum = ContentSum::default();
        for h in resource_hashes {
            sum.add(h);
        }
        sum
    }

    /// Adds the resource with this hash.
    pub fn add(&mut self, resource_hash: &[u8; 32]) {
        let e = element(resource_hash);
        for (lane, x) in self.lanes.iter_mut().zip(e.iter()) {
            *lane = lane.wrapping_add(*x);
        }
    }

    /// Takes out the resource with this hash (which must have been added).
    pub fn remove(&mut self, resource_hash: &[u8; 32]) {
        let e = element(resource_hash);
        for (lane, x) in self.lanes.iter_mut().zip(e.iter()) {
            *lane = lane.wrapping_sub(*x);
        }
    }

    /// Replaces the resource hashed `old` (if any) by the one hashed `new` (if any).
    pub fn replace(&mut self, old: Option<&[u8; 32]>, new: Option<&[u8; 32]>) {
        if old == new {
            return;
        }
        if let Some(old) = old {
            self.remove(old);
        }
        if let Some(new) = new {
            self.add(new);
        }
    }

    /// Adds every resource of `other`.
    pub fn merge(&mut self, other: &ContentSum) {
        for (lane, x) in self.lanes.iter_mut().zip(other.lanes.iter()) {
            *lane = lane.wrapping_add(*x);
        }
    }

    /// The content hash: SHA-256 (lower-case hex) of the sum's bytes.
    pub fn content_hash(&self) -> String {
        let mut bytes = [0u8; LANES * 2];
        for (chunk, lane) in bytes.chunks_exact_mut(2).zip(self.lanes.iter()) {
            chunk.copy_from_slice(&lane.to_le_bytes());
        }
        hex(&Sha256::digest(bytes))
    }
}

/// The element of a resource hash: 1,024 lanes of BLAKE3 output.
fn element(resource_hash: &[u8; 32]) -> [u16; LANES] {
    let mut hasher = blake3::Hasher::new_derive_key(ELEMENT_CONTEXT);
    hasher.update(resource_hash);
    let mut bytes = [0u8; LANES * 2];
    hasher.finalize_xof().fill(&mut bytes);
    let mut out = [0u16; LANES];
    for (lane, chunk) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *lane = u16::from_le_bytes([chunk[0], chunk[1]]);
    }
    out
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// SHA-256 of `kind`'s tag and `encoded`, a resource's protobuf encoding.
pub fn resource_hash(kind: ResourceKind, encoded: &[u8]) -> [u8; 32] {
    let mut sha = Sha256::new();
    sha.update([kind as u8]);
    sha.update(encoded);
    sha.finalize().into()
}

/// Hashes resources through one reused encoding buffer.
#[derive(Default)]
pub(crate) struct Hasher {
    buf: Vec<u8>,
}

impl Hasher {
    /// The hash of resource `m` of kind `kind`.
    pub(crate) fn hash(&mut self, kind: ResourceKind, m: &impl Message) -> [u8; 32] {
        self.buf.clear();
        // A Vec grows, so encoding into it cannot fail.
        let _ = m.encode(&mut self.buf);
        resource_hash(kind, &self.buf)
    }
}

/// The hash of the default certificate's name (none when it is empty).
pub(crate) fn default_certificate_hash(name: &str) -> Option<[u8; 32]> {
    (!name.is_empty()).then(|| resource_hash(ResourceKind::DefaultCertificate, name.as_bytes()))
}

/// Calls `f` with each resource of `snapshot`: its kind, name and hash.
pub fn for_each_resource(snapshot: &Snapshot, mut f: impl FnMut(ResourceKind, &str, [u8; 32])) {
    let mut h = Hasher::default();
    for resource in resources(snapshot) {
        let (kind, name, hash) = resource.hashed(&mut h);
        f(kind, name, hash);
    }
}

/// The content sum of `snapshot` (see the module's docs).
pub fn content_sum(snapshot: &Snapshot) -> ContentSum {
    hash_all(snapshot).1
}

/// One resource of a snapshot.
#[derive(Clone, Copy)]
enum Resource<'a> {
    VirtualHost(&'a crate::v1::VirtualHost),
    Backend(&'a crate::v1::Backend),
    Certificate(&'a crate::v1::Certificate),
    DefaultBackend(&'a crate::v1::DefaultBackend),
    DefaultCertificate(&'a str),
    GatewayListener(&'a crate::v1::GatewayListener),
    GatewayHost(&'a crate::v1::GatewayHost),
}

impl<'a> Resource<'a> {
    /// Its kind, name and hash.
    fn hashed(self, h: &mut Hasher) -> (ResourceKind, &'a str, [u8; 32]) {
        let (kind, name) = match self {
            Resource::VirtualHost(v) => (ResourceKind::VirtualHost, v.host.as_str()),
            Resource::Backend(b) => (ResourceKind::Backend, b.name.as_str()),
            Resource::Certificate(c) => (ResourceKind::Certificate, c.name.as_str()),
            Resource::DefaultBackend(_) => (ResourceKind::DefaultBackend, ""),
            Resource::DefaultCertificate(_) => (ResourceKind::DefaultCertificate, ""),
            Resource::GatewayListener(l) => (ResourceKind::GatewayListener, l.name.as_str()),
            Resource::GatewayHost(g) => (ResourceKind::GatewayHost, g.name.as_str()),
        };
        let hash = match self {
            Resource::VirtualHost(v) => h.hash(kind, v),
            Resource::Backend(b) => h.hash(kind, b),
            Resource::Certificate(c) => h.hash(kind, c),
            Resource::DefaultBackend(d) => h.hash(kind, d),
            Resource::DefaultCertificate(name) => resource_hash(kind, name.as_bytes()),
            Resource::GatewayListener(l) => h.hash(kind, l),
            Resource::GatewayHost(g) => h.hash(kind, g),
        };
        (kind, name, hash)
    }
}

/// Resources' kinds, names and hashes.
pub type Hashes<'a> = Vec<(ResourceKind, &'a str, [u8; 32])>;

/// The hashes of `resources` and their sum.
fn hash_some<'a>(resources: &[Resource<'a>]) -> (Hashes<'a>, ContentSum) {
    let (mut h, mut sum) = (Hasher::default(), ContentSum::default());
    let hashed = resources
        .iter()
        .map(|r| {
            let out = r.hashed(&mut h);
            sum.add(&out.2);
            out
        })
        .collect();
    (hashed, sum)
}

/// Every resource of `snapshot`, in the order of its fields.
fn resources(snapshot: &Snapshot) -> Vec<Resource<'_>> {
    let mut resources: Vec<Resource<'_>> = Vec::with_capacity(
        snapshot.virtual_hosts.len()
            + snapshot.backends.len()
            + snapshot.certificates.len()
            + snapshot.gateway_listeners.len()
            + snapshot.gateway_hosts.len()
            + 2,
    );
    resources.extend(snapshot.virtual_hosts.iter().map(Resource::VirtualHost));
    resources.extend(snapshot.backends.iter().map(Resource::Backend));
    resources.extend(snapshot.certificates.iter().map(Resource::Certificate));
    resources.extend(
        snapshot
            .default_backend
            .as_ref()
            .map(Resource::DefaultBackend),
    );
    if !snapshot.default_certificate.is_empty() {
        resources.push(Resource::DefaultCertificate(&snapshot.default_certificate));
    }
    resources.extend(
        snapshot
            .gateway_listeners
            .iter()
            .map(Resource::GatewayListener),
    );
    resources.extend(snapshot.gateway_hosts.iter().map(Resource::GatewayHost));
    resources
}

/// Every resource of `snapshot` (kind, name, hash) and the sum of their hashes. Most of
/// the cost is expanding each hash into the sum's lanes, so a large snapshot is hashed
/// on several threads, whose partial sums add up (the sum does not depend on order).
pub fn hash_all(snapshot: &Snapshot) -> (Hashes<'_>, ContentSum) {
    let resources = resources(snapshot);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    if threads < 2 || resources.len() < 2_048 {
        return hash_some(&resources);
    }
    let chunk = resources.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = resources
            .chunks(chunk)
            .map(|part| {
                // A thread that cannot be started leaves its part to this one.
                std::thread::Builder::new()
                    .spawn_scoped(scope, move || hash_some(part))
                    .map_err(|_| part)
            })
            .collect();
        let mut all = Vec::with_capacity(resources.len());
        let mut sum = ContentSum::default();
        for part in parts {
            let (hashed, partial) = match part {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(part) => hash_some(part),
            };
            all.extend(hashed);
            sum.merge(&partial);
        }
        (all, sum)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn the_sum_does_not_depend_on_order_and_removal_undoes_addition() {
        let forward = ContentSum::of([&h(1), &h(2), &h(3)]);
        let backward = ContentSum::of([&h(3), &h(2), &h(1)]);
        assert_eq!(forward.content_hash(), backward.content_hash());

        let mut s = forward.clone();
        s.remove(&h(2));
        assert_eq!(s, ContentSum::of([&h(1), &h(3)]));
        s.replace(Some(&h(3)), Some(&h(4)));
        assert_eq!(s, ContentSum::of([&h(4), &h(1)]));
        s.replace(Some(&h(1)), None);
        s.replace(Some(&h(4)), None);
        assert_eq!(s, ContentSum::default());

        let mut merged = ContentSum::of([&h(1)]);
        merged.merge(&ContentSum::of([&h(2), &h(3)]));
        assert_eq!(merged, forward);
    }

    #[test]
    fn different_sets_have_different_hashes() {
        let a = ContentSum::of([&h(1), &h(2)]).content_hash();
        let b = ContentSum::of([&h(1), &h(3)]).content_hash();
        let c = ContentSum::of([&h(1)]).content_hash();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(c, ContentSum::default().content_hash());
        assert_eq!(a.len(), 64);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }

    /// Fixed test vectors, computed apart from this code by
    /// `proto/testdata/content_vectors.py` (a pure-Python BLAKE3 written from its
    /// specification and checked against its published vectors, and Python's `hashlib`).
    /// They pin the construction the module documentation states, so the two planes (and
    /// any other implementation) agree on it.
    #[test]
    fn the_element_and_the_content_hash_match_fixed_test_vectors() {
        // The element of the resource hash [7; 32]: the derive-key XOF output read as
        // little-endian lanes (its first two and its last).
        let e = element(&h(7));
        assert_eq!((e[0], e[1], e[LANES - 1]), (29958, 6183, 5936));
        // The empty set: SHA-256 of 2,048 zero bytes.
        assert_eq!(
            ContentSum::default().content_hash(),
            "e5a00aa9991ac8a5ee3109844d84a55583bd20572ad3ffcd42792f3c36b183ad"
        );
        assert_eq!(
            ContentSum::of([&h(7)]).content_hash(),
            "90e11bd9b126b613039415634e2d8742b072c73deb1f8250f18db15149caa85f"
        );
        // Lanes add modulo 2^16.
        assert_eq!(
            ContentSum::of([&h(1), &h(2)]).content_hash(),
            "79e6d035493b1b8a7dec0969d502a6ba19d08639c514318cacdc661d8cee628c"
        );
    }
}
