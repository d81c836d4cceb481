//! Snapshots for tests, built in a line or two (the `test-support` feature): hosts
//! routing prefixes to backends, backends with endpoints, sealed at a revision.

use crate::v1::{Backend, Endpoint, IngressRef, MatchKind, Route, Snapshot, VirtualHost};

/// A snapshot under construction.
#[derive(Debug, Clone, Default)]
pub struct SnapshotBuilder {
    snapshot: Snapshot,
}

impl SnapshotBuilder {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Host `host` routes the prefix `path` to `backend`; a second call for the same host
    /// adds the route to it. The route's source is `default/<host>`.
    pub fn route(mut self, host: &str, path: &str, backend: &str) -> Self {
        let route = Route {
            match_kind: MatchKind::Prefix as i32,
            path: path.into(),
            backend: backend.into(),
            source: Some(IngressRef {
                namespace: "default".into(),
                name: host.into(),
            }),
        };
        match self
            .snapshot
            .virtual_hosts
            .iter_mut()
            .find(|v| v.host == host)
        {
            Some(v) => v.routes.push(route),
            None => self.snapshot.virtual_hosts.push(VirtualHost {
                host: host.into(),
                routes: vec![route],
                ..Default::default()
            }),
        }
        self
    }

    /// Backend `name` with ready `endpoints` (address, port).
    pub fn backend(mut self, name: &str, endpoints: &[(&str, u32)]) -> Self {
        self.snapshot.backends.push(Backend {
            name: name.into(),
            endpoints: endpoints
                .iter()
                .map(|(address, port)| Endpoint {
                    address: (*address).into(),
                    port: *port,
                    zone: String::new(),
                    ready: true,
                })
                .collect(),
            ..Default::default()
        });
        self
    }

    /// The snapshot as built, sorted and sealed at `cluster_revision` (version and
    /// content hash set): valid when every route's backend exists.
    pub fn sealed(mut self, cluster_revision: u64) -> Snapshot {
        for v in &mut self.snapshot.virtual_hosts {
            v.routes
                .sort_by(|a, b| b.path.len().cmp(&a.path.len()).then(a.path.cmp(&b.path)));
        }
        self.snapshot
            .virtual_hosts
            .sort_by(|a, b| a.host.cmp(&b.host));
        self.snapshot.backends.sort_by(|a, b| a.name.cmp(&b.name));
        crate::snapshot::seal(&mut self.snapshot, cluster_revision);
        self.snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_snapshot_is_sealed_sorted_and_valid() {
        let s = SnapshotBuilder::new()
            .route("b.test", "/", "svc")
            .route("a.test", "/", "svc")
            .route("a.test", "/api", "svc")
            .backend("svc", &[("10.0.0.1", 8080)])
            .sealed(7);
        assert_eq!(s.cluster_revision, 7);
        assert!(!s.version.is_empty() && !s.content_hash.is_empty());
        let hosts: Vec<&str> = s.virtual_hosts.iter().map(|v| v.host.as_str()).collect();
        assert_eq!(hosts, ["a.test", "b.test"]);
        let paths: Vec<&str> = s.virtual_hosts[0]
            .routes
            .iter()
            .map(|r| r.path.as_str())
            .collect();
        assert_eq!(paths, ["/api", "/"], "longer prefixes first");
        crate::snapshot::validate(&s).expect("valid");
    }

    #[test]
    fn a_route_to_a_missing_backend_is_invalid() {
        let s = SnapshotBuilder::new()
            .route("a.test", "/", "nothing")
            .sealed(1);
        assert!(crate::snapshot::validate(&s).is_err());
    }
}
