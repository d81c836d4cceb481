use proptest::prelude::*;

use super::*;
use crate::v1::{Backend, Certificate, DefaultBackend, Endpoint, MatchKind, Route, VirtualHost};

fn route(path: &str, backend: &str) -> Route {
    Route {
        match_kind: MatchKind::Prefix as i32,
        path: path.into(),
        backend: backend.into(),
        source: None,
    }
}

fn backend(name: &str, port: u32) -> Backend {
    Backend {
        name: name.into(),
        endpoints: vec![Endpoint {
            address: "10.0.0.1".into(),
            port,
            zone: String::new(),
            ready: true,
        }],
        ..Default::default()
    }
}

fn certificate(name: &str, serial: &str) -> Certificate {
    Certificate {
        name: name.into(),
        certificate_chain: b"chain".to_vec(),
        private_key: b"key".to_vec(),
        serial: serial.into(),
        ..Default::default()
    }
}

/// A sealed snapshot: hosts `h<i>.test` (route "/" to backend `b<j>`, certificate `c<k>`
/// or none), backends `b<j>` (port p), certificates `c<k>` (serial s), a default backend,
/// and the first certificate as the default one.
fn build(
    hosts: &BTreeMap<u8, (u8, Option<u8>)>,
    backends: &BTreeMap<u8, u16>,
    certs: &BTreeMap<u8, u8>,
    default: Option<u8>,
    revision: u64,
) -> Snapshot {
    let mut s = Snapshot {
        virtual_hosts: hosts
            .iter()
            .filter(|(_, (b, c))| {
                backends.contains_key(b) && c.is_none_or(|c| certs.contains_key(&c))
            })
            .map(|(h, (b, c))| VirtualHost {
                host: format!("h{h}.test"),
                routes: vec![route("/", &format!("b{b}"))],
                certificate: c.map(|c| format!("c{c}")).unwrap_or_default(),
                ssl_redirect: false,
            })
            .collect(),
        backends: backends
            .iter()
            .map(|(b, p)| backend(&format!("b{b}"), u32::from(*p)))
            .collect(),
        default_backend: default
            .filter(|b| backends.contains_key(b))
            .map(|b| DefaultBackend {
                backend: format!("b{b}"),
                source: None,
            }),
        certificates: certs
            .iter()
            .map(|(c, s)| certificate(&format!("c{c}"), &s.to_string()))
            .collect(),
        ..Default::default()
    };
    // Sorted as the translator sorts: by the names' bytes.
    s.virtual_hosts.sort_by(|a, b| a.host.cmp(&b.host));
    s.backends.sort_by(|a, b| a.name.cmp(&b.name));
    s.certificates.sort_by(|a, b| a.name.cmp(&b.name));
    s.default_certificate = s
        .certificates
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    snapshot::seal(&mut s, revision);
    s
}

prop_compose! {
    fn arb_snapshot(revision: u64)(
        hosts in prop::collection::btree_map(0u8..12, (0u8..6, prop::option::of(0u8..4)), 0..10),
        backends in prop::collection::btree_map(0u8..6, 1u16..4, 0..6),
        certs in prop::collection::btree_map(0u8..4, 0u8..3, 0..4),
        default in prop::option::of(0u8..6),
    ) -> Snapshot {
        build(&hosts, &backends, &certs, default, revision)
    }
}

proptest! {
    /// For any two snapshots, the delta from the first's inventory applied to the first
    /// makes exactly the second (same content hash, same bytes), and carries only what
    /// changed.
    #[test]
    fn base_plus_the_diff_is_the_next_snapshot(base in arb_snapshot(1), next in arb_snapshot(2)) {
        let before = inventory(&base);
        let delta = diff(&base.version, &before, &next);
        let made = apply(&base, &delta).expect("a diff applies to its base");
        prop_assert_eq!(&made, &next);
        // The hashes kept beside the base, updated by the delta alone, are the next
        // snapshot's hashes, and their sum is its content hash.
        let mut hashed = Hashed::of(&base);
        let (made, edit) = apply_hashed(&base, &hashed, &delta).expect("applies");
        prop_assert_eq!(&made, &next);
        hashed.commit(edit);
        prop_assert_eq!(&hashed, &Hashed::of(&next));
        prop_assert_eq!(hashed.content_hash(), next.content_hash.clone());
        // Only changed resources travel.
        let after = inventory(&next);
        for v in &delta.upserted_virtual_hosts {
            let key = (ResourceKind::VirtualHost, v.host.clone());
            prop_assert_ne!(before.get(&key), after.get(&key));
        }
        for b in &delta.upserted_backends {
            let key = (ResourceKind::Backend, b.name.clone());
            prop_assert_ne!(before.get(&key), after.get(&key));
        }
        // The wire form of the inventory round-trips.
        prop_assert_eq!(from_wire(&to_wire(&before)), Ok(before));
    }
}

fn two() -> (Snapshot, Snapshot) {
    let backends = BTreeMap::from([(0, 1), (1, 1)]);
    let certs = BTreeMap::from([(0, 0)]);
    let base = build(
        &BTreeMap::from([(0, (0, None)), (1, (1, Some(0)))]),
        &backends,
        &certs,
        Some(0),
        1,
    );
    let next = build(
        &BTreeMap::from([(0, (1, None)), (1, (1, Some(0)))]),
        &backends,
        &certs,
        Some(0),
        2,
    );
    (base, next)
}

#[test]
fn a_one_host_change_carries_that_host_only() {
    let (base, next) = two();
    let delta = diff(&base.version, &inventory(&base), &next);
    assert_eq!(delta.upserted_virtual_hosts.len(), 1);
    assert_eq!(delta.upserted_virtual_hosts[0].host, "h0.test");
    assert!(delta.upserted_backends.is_empty() && delta.upserted_certificates.is_empty());
    assert!(delta.removed_virtual_hosts.is_empty() && delta.removed_backends.is_empty());
    assert!(!delta.default_backend_changed && !delta.default_certificate_changed);
    assert_eq!(apply(&base, &delta), Ok(next));
}

#[test]
fn a_delta_for_another_base_is_refused() {
    let (base, next) = two();
    let delta = diff("1-0000000000000000", &inventory(&base), &next);
    assert!(matches!(
        apply(&base, &delta),
        Err(InvalidDelta::UnknownBase { .. })
    ));
}

#[test]
fn a_corrupted_or_incomplete_delta_is_refused_by_the_content_hash_or_a_reference() {
    let (base, next) = two();
    let good = diff(&base.version, &inventory(&base), &next);

    // A changed resource: the content hash no longer matches.
    let mut corrupted = good.clone();
    corrupted.upserted_virtual_hosts[0].routes[0].path = "/x".into();
    assert!(matches!(
        apply(&base, &corrupted),
        Err(InvalidDelta::Result(InvalidSnapshot::HashMismatch { .. }))
    ));
    // A lost upsert: the hash again.
    let mut lost = good.clone();
    lost.upserted_virtual_hosts.clear();
    assert!(matches!(
        apply(&base, &lost),
        Err(InvalidDelta::Result(InvalidSnapshot::HashMismatch { .. }))
    ));
    // A removed backend a route still names: a missing reference.
    let mut dangling = good.clone();
    dangling.removed_backends.push("b0".into());
    assert!(matches!(
        apply(&base, &dangling),
        Err(InvalidDelta::Result(InvalidSnapshot::MissingBackend { .. }))
    ));
    // Removing what the base does not have, or naming a resource twice.
    let mut unknown = good.clone();
    unknown.removed_certificates.push("c9".into());
    assert!(matches!(
        apply(&base, &unknown),
        Err(InvalidDelta::UnknownRemoval { .. })
    ));
    let mut twice = good;
    twice.removed_virtual_hosts.push("h0.test".into());
    assert!(matches!(
        apply(&base, &twice),
        Err(InvalidDelta::Duplicate { .. })
    ));
}

#[test]
fn a_malformed_inventory_is_refused() {
    let entry = |kind: i32, hash: Vec<u8>| ResourceHash {
        kind,
        name: "h".into(),
        hash,
    };
    assert!(from_wire(&[entry(0, vec![0; 32])]).is_err());
    assert!(from_wire(&[entry(99, vec![0; 32])]).is_err());
    assert!(from_wire(&[entry(1, vec![0; 31])]).is_err());
    assert!(from_wire(&[entry(1, vec![0; 32]), entry(1, vec![1; 32])]).is_err());
    assert!(from_wire(&[entry(1, vec![0; 32]), entry(2, vec![1; 32])]).is_ok());
}

#[test]
fn an_empty_inventory_gets_every_resource() {
    let (_, next) = two();
    let delta = diff("", &Inventory::new(), &next);
    assert_eq!(delta.upserted_virtual_hosts, next.virtual_hosts);
    assert_eq!(delta.upserted_backends, next.backends);
    assert_eq!(delta.upserted_certificates, next.certificates);
    assert!(delta.default_backend_changed && delta.default_certificate_changed);
}

#[test]
fn a_large_snapshot_hashed_on_several_threads_has_the_same_hashes_and_sum() {
    // Above the size where the work is split over threads.
    let mut s = build(
        &BTreeMap::new(),
        &BTreeMap::new(),
        &BTreeMap::new(),
        None,
        1,
    );
    for i in 0..5_000 {
        s.backends.push(Backend {
            name: format!("ns/svc-{i:05}:80"),
            ..Default::default()
        });
    }
    let mut one_by_one = Vec::new();
    for_each_resource(&s, |kind, name, hash| {
        one_by_one.push((kind, name.to_owned(), hash))
    });
    let (all, sum) = hash_all(&s);
    let all: Vec<_> = all
        .into_iter()
        .map(|(k, n, h)| (k, n.to_owned(), h))
        .collect();
    assert_eq!(all, one_by_one);
    assert_eq!(sum, ContentSum::of(one_by_one.iter().map(|(_, _, h)| h)));
    assert_eq!(Hashed::of(&s).inventory(), &inventory(&s));
}
