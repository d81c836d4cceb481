//! A snapshot's content hash, built from its resources' hashes so that either plane can
//! update it in O(change).
//!
//! # Construction
//! A snapshot is a set of resources: virtual hosts, backends, certificates, the default
//! backend and the default certificate (see [`crate::delta`]).
//!
//! 1. Each resource has a *resource hash*: SHA-256 over its kind's tag byte and its
//!    protobuf encoding ([`crate::delta::resource_hash`]). The encoding holds the
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

use sha2::{Digest, Sha256};

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
