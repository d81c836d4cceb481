//! The heap a proxy holds for a large snapshot, by part: the decoded snapshot (what a
//! response brings), its hashes ([`Hashed`]), the snapshot held for the next delta
//! ([`Held`]) and the compiled route table, each counted alone, and the table and the
//! held snapshot as the applier keeps them, sharing the names of hosts and backends.
//! Live bytes are counted with a counting allocator over the system allocator (the
//! proxy's mimalloc rounds differently).
//! `cargo bench -p holdfast-data-plane --bench memory [-- HOSTS]` (default 10,001).

use holdfast_data_plane::table::RouteTable;
use holdfast_proto::delta::{Hashed, Held, diff, inventory};
use holdfast_proto::snapshot::seal;
use holdfast_proto::v1::{Backend, Endpoint, MatchKind, Route, Snapshot, VirtualHost};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// `hosts` hosts as `tests/bench/proxy-memory.sh` serves them (holdfast-fake-cp): each
/// `h<i>.extra.test` with a Prefix "/" route to a backend of its own, one endpoint each.
fn snapshot(hosts: usize, revision: u64) -> Snapshot {
    let mut s = Snapshot::default();
    for i in 0..hosts {
        let backend = format!("extra/svc-{i}:80");
        s.virtual_hosts.push(VirtualHost {
            host: format!("h{i}.extra.test"),
            routes: vec![Route {
                match_kind: MatchKind::Prefix as i32,
                path: "/".into(),
                backend: backend.clone(),
                source: None,
            }],
            ..Default::default()
        });
        s.backends.push(Backend {
            name: backend,
            endpoints: vec![Endpoint {
                address: "127.0.0.1".into(),
                port: 8080,
                zone: String::new(),
                ready: true,
            }],
            ..Default::default()
        });
    }
    seal(&mut s, revision);
    s
}

/// Bytes `make` leaves allocated, and what it made.
fn live<T>(make: impl FnOnce() -> T) -> (i64, T) {
    let region = Region::new(GLOBAL);
    let made = make();
    let c = region.change();
    // A realloc's growth is in bytes_allocated, its shrinking in bytes_deallocated.
    let bytes = c.bytes_allocated as i64 - c.bytes_deallocated as i64;
    (bytes, made)
}

fn mib(bytes: i64) -> String {
    format!("{:.2} MiB ({bytes})", bytes as f64 / (1024.0 * 1024.0))
}

fn main() {
    let hosts: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_001);
    let s = snapshot(hosts, 1);
    let (decoded, copy) = live(|| s.clone());
    drop(copy);
    let (hashed, _) = live(|| Hashed::of(&s));
    // Each alone: no names shared.
    let (table_alone, table) = live(|| RouteTable::compile(&s).expect("compiles"));
    drop(table);
    // The copy it takes is made and freed within the count.
    let (held_alone, held) = live(|| Held::new(s.clone(), Hashed::of(&s)));
    drop(held);
    // As the applier keeps them: the table compiled first, the held snapshot taking its
    // names (Hashed included in both figures of the held snapshot).
    let (both, (table, mut held)) = live(|| {
        let table = RouteTable::compile(&s).expect("compiles");
        let held = Held::sharing(s.clone(), Hashed::of(&s), &table);
        (table, held)
    });
    // Then a delta that adds a host and its backend, taken in the same way.
    let next = snapshot(hosts + 1, 2);
    let delta = diff(&s.version, &inventory(&s), &next);
    let (after_delta, table) = live(|| {
        let checked = held.check(&delta).expect("valid");
        let table = table.apply_delta(&held, &delta).expect("compiles");
        held.commit_sharing(&delta, checked, &table);
        table
    });
    println!("{hosts} hosts, each with one route and a backend of its own:");
    println!("| part | live heap |\n| --- | --- |");
    println!("| decoded snapshot | {} |", mib(decoded));
    println!("| hashes (Hashed) | {} |", mib(hashed));
    println!("| route table alone | {} |", mib(table_alone));
    println!(
        "| held snapshot alone (with its hashes) | {} |",
        mib(held_alone)
    );
    println!(
        "| route table and held snapshot, sharing names | {} (apart: {}) |",
        mib(both),
        mib(table_alone + held_alone)
    );
    println!(
        "| a delta of one more host, taken in (old table kept) | {} |",
        mib(after_delta)
    );
    drop((table, held));
}
