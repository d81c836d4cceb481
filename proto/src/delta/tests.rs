use proptest::prelude::*;

use super::*;
use crate::content::{for_each_resource, hash_all};
use crate::v1::{
    Backend, Certificate, DefaultBackend, Endpoint, GatewayHost, GatewayListener, GatewayRoute,
    ListenerCertificates, MatchKind, Route, VirtualHost, WeightedBackend,
};
use prost::Message;

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

/// Gateway listeners (index → certificate or none) and Gateway hosts (index →
/// (listener, backend)).
type Gateways = (BTreeMap<u8, Option<u8>>, BTreeMap<u8, (u8, u8)>);

fn listener(i: u8, cert: Option<u8>) -> GatewayListener {
    let port = 8000 + u32::from(i);
    GatewayListener {
        name: snapshot::listener_name("127.10.0.1", port),
        address: "127.10.0.1".into(),
        port,
        protocol: if cert.is_some() { "HTTPS" } else { "HTTP" }.into(),
        certificates: cert
            .map(|c| ListenerCertificates {
                hostname: String::new(),
                certificates: vec![format!("c{c}")],
            })
            .into_iter()
            .collect(),
        gateway: None,
        public_port: 0,
    }
}

fn gateway_host(i: u8, listener_index: u8, backend: u8) -> GatewayHost {
    let l = snapshot::listener_name("127.10.0.1", 8000 + u32::from(listener_index));
    let host = format!("g{i}.test");
    GatewayHost {
        name: snapshot::gateway_host_name(&l, &host),
        listener: l,
        host,
        routes: vec![GatewayRoute {
            match_kind: MatchKind::Prefix as i32,
            path: "/".into(),
            backends: vec![
                WeightedBackend {
                    backend: format!("b{backend}"),
                    weight: 1,
                    unresolved: String::new(),
                    ..Default::default()
                },
                WeightedBackend {
                    backend: String::new(),
                    weight: 1,
                    unresolved: "not found".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
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
    build_with(
        hosts,
        backends,
        certs,
        default,
        &Gateways::default(),
        revision,
    )
}

/// [`build`] with Gateway listeners and hosts (those whose references exist).
fn build_with(
    hosts: &BTreeMap<u8, (u8, Option<u8>)>,
    backends: &BTreeMap<u8, u16>,
    certs: &BTreeMap<u8, u8>,
    default: Option<u8>,
    gateways: &Gateways,
    revision: u64,
) -> Snapshot {
    let listeners: BTreeMap<u8, Option<u8>> = gateways
        .0
        .iter()
        .filter(|(_, c)| c.is_none_or(|c| certs.contains_key(&c)))
        .map(|(i, c)| (*i, *c))
        .collect();
    let mut s = Snapshot {
        gateway_listeners: listeners.iter().map(|(i, c)| listener(*i, *c)).collect(),
        gateway_hosts: gateways
            .1
            .iter()
            .filter(|(_, (l, b))| listeners.contains_key(l) && backends.contains_key(b))
            .map(|(i, (l, b))| gateway_host(*i, *l, *b))
            .collect(),
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
    s.gateway_listeners.sort_by(|a, b| a.name.cmp(&b.name));
    s.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    s.default_certificate = s
        .certificates
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    snapshot::seal(&mut s, revision);
    s
}

/// `s` with some Ingress hosts in the one model (Gateway hosts of listener `ingress`),
/// the others as virtual hosts (as older control planes send them): those to an odd
/// backend. A host whose backend changes between two snapshots changes form too.
fn mixed(mut s: Snapshot) -> Snapshot {
    let (legacy, one): (Vec<VirtualHost>, Vec<VirtualHost>) = std::mem::take(&mut s.virtual_hosts)
        .into_iter()
        .partition(|v| v.routes[0].backend.ends_with(['0', '2', '4']));
    s.virtual_hosts = legacy;
    s.gateway_hosts
        .extend(one.iter().map(snapshot::ingress_gateway_host));
    s.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    let revision = s.cluster_revision;
    snapshot::seal(&mut s, revision);
    s
}

prop_compose! {
    fn arb_snapshot(revision: u64)(
        hosts in prop::collection::btree_map(0u8..12, (0u8..6, prop::option::of(0u8..4)), 0..10),
        backends in prop::collection::btree_map(0u8..6, 1u16..4, 0..6),
        certs in prop::collection::btree_map(0u8..4, 0u8..3, 0..4),
        default in prop::option::of(0u8..6),
        gateways in arb_gateways(),
    ) -> Snapshot {
        mixed(build_with(&hosts, &backends, &certs, default, &gateways, revision))
    }
}

fn arb_gateways() -> impl Strategy<Value = Gateways> {
    (
        prop::collection::btree_map(0u8..3, prop::option::of(0u8..4), 0..3),
        prop::collection::btree_map(0u8..6, (0u8..3, 0u8..6), 0..5),
    )
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

/// The hosts of `base` that `delta` neither upserts nor removes.
fn untouched<'a>(
    delta: &'a SnapshotDelta,
    base: &'a Snapshot,
) -> impl Iterator<Item = &'a VirtualHost> {
    base.virtual_hosts.iter().filter(|v| {
        !delta.removed_virtual_hosts.contains(&v.host)
            && !delta
                .upserted_virtual_hosts
                .iter()
                .any(|u| u.host == v.host)
    })
}

/// A delta damaged in one of the ways a bug or a lost message could damage it.
fn damaged(good: &SnapshotDelta, base: &Snapshot, how: u8, pick: usize) -> SnapshotDelta {
    let mut d = good.clone();
    let nth = |names: Vec<String>| names.get(pick % names.len().max(1)).cloned();
    match how {
        0 => {}
        1 => {
            if !d.upserted_virtual_hosts.is_empty() {
                d.upserted_virtual_hosts
                    .remove(pick % d.upserted_virtual_hosts.len());
            }
        }
        2 => {
            if !d.upserted_backends.is_empty() {
                d.upserted_backends.remove(pick % d.upserted_backends.len());
            }
        }
        // What a host the delta leaves alone names (so only a reference check can catch
        // the removal).
        3 => d.removed_backends.extend(nth(untouched(good, base)
            .flat_map(|v| v.routes.iter().map(|r| r.backend.clone()))
            .collect())),
        4 => d.removed_certificates.extend(nth(untouched(good, base)
            .map(|v| v.certificate.clone())
            .filter(|c| !c.is_empty())
            .collect())),
        5 => d.removed_virtual_hosts.extend(nth(base
            .virtual_hosts
            .iter()
            .map(|v| v.host.clone())
            .collect())),
        6 => {
            if let Some(v) = d.upserted_virtual_hosts.first_mut() {
                v.routes[0].backend = format!("b{}", pick % 8);
            }
        }
        7 => {
            if let Some(v) = d.upserted_virtual_hosts.first_mut() {
                v.certificate = format!("c{}", pick % 6);
            }
        }
        8 => {
            d.default_backend_changed = true;
            d.default_backend = Some(DefaultBackend {
                backend: format!("b{}", pick % 8),
                source: None,
            });
        }
        9 => d.base_version = "1-0000000000000000".into(),
        // What a Gateway host or listener the delta leaves alone names.
        11 => {
            let untouched_hosts: Vec<String> = base
                .gateway_hosts
                .iter()
                .filter(|g| {
                    !d.removed_gateway_hosts.contains(&g.name)
                        && !d.upserted_gateway_hosts.iter().any(|u| u.name == g.name)
                })
                .flat_map(|g| {
                    snapshot::gateway_host_backends(g)
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .collect();
            d.removed_backends.extend(nth(untouched_hosts));
        }
        12 => d.removed_gateway_listeners.extend(nth(base
            .gateway_hosts
            .iter()
            .map(|g| g.listener.clone())
            .collect())),
        13 => d.removed_certificates.extend(nth(base
            .gateway_listeners
            .iter()
            .flat_map(|l| {
                snapshot::listener_certificates(l)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect())),
        14 => {
            if let Some(g) = d.upserted_gateway_hosts.first_mut() {
                g.routes[0].backends[0].backend = format!("b{}", pick % 8);
            }
        }
        15 => {
            if let Some(g) = d.upserted_gateway_hosts.first_mut() {
                g.listener = snapshot::listener_name("127.10.0.1", 8000 + (pick % 5) as u32);
                g.name = snapshot::gateway_host_name(&g.listener, &g.host);
            }
        }
        _ => d.removed_certificates.push(format!("c{}", pick % 6)),
    }
    d
}

type Maps = (
    BTreeMap<u8, (u8, Option<u8>)>,
    BTreeMap<u8, u16>,
    BTreeMap<u8, u8>,
    Option<u8>,
    Gateways,
);

prop_compose! {
    /// Two snapshots a few changes apart, as consecutive ones usually are.
    fn arb_near_pair()(
        hosts in prop::collection::btree_map(0u8..12, (0u8..6, prop::option::of(0u8..4)), 0..10),
        backends in prop::collection::btree_map(0u8..6, 1u16..4, 0..6),
        certs in prop::collection::btree_map(0u8..4, 0u8..3, 0..4),
        default in prop::option::of(0u8..6),
        host_edits in prop::collection::vec((0u8..12, prop::option::of((0u8..6, prop::option::of(0u8..4)))), 0..3),
        backend_edits in prop::collection::vec((0u8..6, prop::option::of(1u16..4)), 0..2),
        cert_edits in prop::collection::vec((0u8..4, prop::option::of(0u8..3)), 0..2),
        gateways in arb_gateways(),
        listener_edits in prop::collection::vec((0u8..3, prop::option::of(prop::option::of(0u8..4))), 0..2),
        gateway_host_edits in prop::collection::vec((0u8..6, prop::option::of((0u8..3, 0u8..6))), 0..2),
    ) -> (Snapshot, Snapshot) {
        let base: Maps = (hosts, backends, certs, default, gateways);
        let mut next = base.clone();
        fn edit<K: Ord + Copy, V: Copy>(map: &mut BTreeMap<K, V>, edits: &[(K, Option<V>)]) {
            for (k, v) in edits {
                match v {
                    Some(v) => map.insert(*k, *v),
                    None => map.remove(k),
                };
            }
        }
        edit(&mut next.0, &host_edits);
        edit(&mut next.1, &backend_edits);
        edit(&mut next.2, &cert_edits);
        edit(&mut next.4.0, &listener_edits);
        edit(&mut next.4.1, &gateway_host_edits);
        (
            mixed(build_with(&base.0, &base.1, &base.2, base.3, &base.4, 1)),
            mixed(build_with(&next.0, &next.1, &next.2, next.3, &next.4, 2)),
        )
    }
}

fn arb_pair() -> impl Strategy<Value = (Snapshot, Snapshot)> {
    prop_oneof![arb_near_pair(), (arb_snapshot(1), arb_snapshot(2))]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// [`Held`] checks a delta in O(change) but must decide exactly as applying it to the
    /// whole base and validating the result does, and make the same snapshot.
    #[test]
    fn held_accepts_and_makes_what_apply_does(
        (base, next) in arb_pair(),
        how in 0u8..17,
        pick in 0usize..16,
        restamp in any::<bool>(),
    ) {
        let good = diff(&base.version, &inventory(&base), &next);
        let mut delta = damaged(&good, &base, how, pick);
        if restamp {
            // As a buggy control plane would: the hash and version of what the damaged
            // delta makes, so only the references (or names) can catch it.
            delta.content_hash = hash_edit(&Hashed::of(&base), &delta).sum.content_hash();
            delta.version = snapshot::version_string(delta.cluster_revision, &delta.content_hash);
        }
        let mut held = Held::new(base.clone(), Hashed::of(&base));
        prop_assert_eq!(held.to_snapshot(), base.clone());
        prop_assert_eq!(held.encoded_len(), base.encoded_len());
        match (apply(&base, &delta), held.check(&delta)) {
            (Ok(made), Ok(checked)) => {
                held.commit(&delta, checked);
                prop_assert_eq!(&held.to_snapshot(), &made);
                prop_assert_eq!(held.encoded_len(), made.encoded_len());
                prop_assert_eq!(held.inventory(), &inventory(&made));
                for b in &made.backends {
                    let users: std::collections::BTreeSet<&str> =
                        held.hosts_using_backend(&b.name).collect();
                    let want: std::collections::BTreeSet<&str> = made
                        .virtual_hosts
                        .iter()
                        .filter(|v| v.routes.iter().any(|r| r.backend == b.name))
                        .map(|v| v.host.as_str())
                        .chain(
                            made.gateway_hosts
                                .iter()
                                .filter(|g| snapshot::gateway_host_backends(g).any(|n| n == b.name))
                                .map(|g| g.name.as_str()),
                        )
                        .collect();
                    prop_assert_eq!(users, want);
                }
            }
            (Err(_), Err(_)) => {
                // Refused, and nothing held changed.
                prop_assert_eq!(held.to_snapshot(), base);
            }
            (applied, checked) => prop_assert!(
                false,
                "apply: {:?}; held: {:?} (damage {})",
                applied.map(|s| s.version),
                checked.map(|_| ()),
                how
            ),
        }
    }
}

/// `delta` restamped with the hash and version of what it makes from `base`, as a buggy
/// control plane would send it: only the references can catch what is wrong with it.
fn restamped(mut delta: SnapshotDelta, base: &Snapshot) -> SnapshotDelta {
    delta.content_hash = hash_edit(&Hashed::of(base), &delta).sum.content_hash();
    delta.version = snapshot::version_string(delta.cluster_revision, &delta.content_hash);
    delta
}

/// Both ways of checking a delta (the whole result validated, and [`Held`] in
/// O(change)) refuse `delta` with the same error.
fn both_refuse(base: &Snapshot, delta: &SnapshotDelta) -> InvalidDelta {
    let whole = apply(base, delta).expect_err("apply refuses it");
    let held = Held::new(base.clone(), Hashed::of(base));
    let by_held = held.check(delta).expect_err("Held refuses it");
    assert_eq!(whole, by_held);
    whole
}

#[test]
fn an_ingress_host_is_given_in_one_form_only() {
    let backends = BTreeMap::from([(0, 1)]);
    let base = build(
        &BTreeMap::from([(0, (0, None))]),
        &backends,
        &BTreeMap::new(),
        None,
        1,
    );
    assert_eq!(base.virtual_hosts.len(), 1);
    // The same host again, as the Gateway host of listener `ingress`.
    let mut both = base.clone();
    both.gateway_hosts
        .push(snapshot::ingress_gateway_host(&base.virtual_hosts[0]));
    snapshot::seal(&mut both, 2);
    assert_eq!(
        snapshot::validate(&both),
        Err(InvalidSnapshot::DuplicateHost("h0.test".into()))
    );
    let delta = restamped(diff(&base.version, &inventory(&base), &both), &base);
    assert_eq!(delta.upserted_gateway_hosts.len(), 1);
    assert_eq!(
        both_refuse(&base, &delta),
        InvalidDelta::Result(InvalidSnapshot::DuplicateHost("h0.test".into()))
    );
    // Moving it from one form to the other in one delta is fine, both ways.
    let mut moved = both.clone();
    moved.virtual_hosts.clear();
    snapshot::seal(&mut moved, 2);
    let to_one = diff(&base.version, &inventory(&base), &moved);
    let mut held = Held::new(base.clone(), Hashed::of(&base));
    let checked = held.check(&to_one).expect("moved to the one model");
    held.commit(&to_one, checked);
    assert_eq!(held.to_snapshot(), moved);
    let back = diff(&moved.version, &inventory(&moved), &{
        let mut b = base.clone();
        snapshot::seal(&mut b, 3);
        b
    });
    let checked = held.check(&back).expect("moved back");
    held.commit(&back, checked);
    assert_eq!(held.to_snapshot().virtual_hosts, base.virtual_hosts);
}

#[test]
fn an_ingress_host_given_as_a_gateway_host_keeps_its_certificate_and_backends() {
    let backends = BTreeMap::from([(1, 1)]);
    let certs = BTreeMap::from([(0, 0)]);
    let base = mixed(build(
        &BTreeMap::from([(1, (1, Some(0)))]),
        &backends,
        &certs,
        None,
        1,
    ));
    let g = &base.gateway_hosts[0];
    assert!(snapshot::is_ingress_host(g) && g.certificate == "c0");
    let held = Held::new(base.clone(), Hashed::of(&base));
    assert_eq!(
        held.hosts_using_certificate("c0").collect::<Vec<_>>(),
        vec!["ingress h1.test"]
    );
    assert_eq!(
        held.hosts_using_backend("b1").collect::<Vec<_>>(),
        vec!["ingress h1.test"]
    );
    // Its certificate removed, its backend removed, or a certificate it names missing.
    let no_default = |mut s: Snapshot| {
        s.default_certificate.clear();
        s
    };
    let mut without_cert = no_default(base.clone());
    without_cert.certificates.clear();
    snapshot::seal(&mut without_cert, 2);
    let base_nd = {
        let mut b = no_default(base.clone());
        snapshot::seal(&mut b, 1);
        b
    };
    let delta = restamped(
        diff(&base_nd.version, &inventory(&base_nd), &without_cert),
        &base_nd,
    );
    assert_eq!(delta.removed_certificates, vec!["c0".to_string()]);
    assert!(matches!(
        both_refuse(&base_nd, &delta),
        InvalidDelta::Result(InvalidSnapshot::MissingCertificate { .. })
    ));
    let mut without_backend = base.clone();
    without_backend.backends.clear();
    snapshot::seal(&mut without_backend, 2);
    let delta = restamped(
        diff(&base.version, &inventory(&base), &without_backend),
        &base,
    );
    assert!(matches!(
        both_refuse(&base, &delta),
        InvalidDelta::Result(InvalidSnapshot::BadGateway { .. })
    ));
    let mut other_cert = base.clone();
    other_cert.gateway_hosts[0].certificate = "c9".into();
    snapshot::seal(&mut other_cert, 2);
    let delta = restamped(diff(&base.version, &inventory(&base), &other_cert), &base);
    assert!(matches!(
        both_refuse(&base, &delta),
        InvalidDelta::Result(InvalidSnapshot::MissingCertificate { .. })
    ));
}
