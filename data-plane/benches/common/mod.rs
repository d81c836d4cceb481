//! What the benchmarks share: a compiled route table of a given size.

use holdfast_data_plane::table::RouteTable;
use holdfast_proto::v1::{Backend, Endpoint, MatchKind, Route, Snapshot, VirtualHost};

/// `n` routes: n/4 hosts with an Exact route and three nested Prefix routes each.
pub fn table(n: usize) -> RouteTable {
    RouteTable::compile(&snapshot(n)).expect("compiles")
}

/// The snapshot of [`table`].
#[allow(dead_code)] // not every benchmark that shares this module builds on it
pub fn snapshot(n: usize) -> Snapshot {
    let hosts = (n / 4).max(1);
    let mut s = Snapshot::default();
    for h in 0..hosts {
        let backend = format!("ns/svc-{h}:80");
        s.backends.push(Backend {
            name: backend.clone(),
            endpoints: vec![Endpoint {
                address: format!("10.{}.{}.1", (h >> 8) & 255, h & 255),
                port: 8080,
                zone: String::new(),
                ready: true,
            }],
            ..Default::default()
        });
        let route = |kind: MatchKind, path: &str| Route {
            match_kind: kind as i32,
            path: path.into(),
            backend: backend.clone(),
            source: None,
        };
        s.virtual_hosts.push(VirtualHost {
            host: format!("app-{h}.example.com"),
            routes: vec![
                route(MatchKind::Exact, "/healthz"),
                route(MatchKind::Prefix, "/api/v1/users"),
                route(MatchKind::Prefix, "/api"),
                route(MatchKind::Prefix, "/"),
            ],
            ..Default::default()
        });
    }
    s
}
