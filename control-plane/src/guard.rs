//! Bounded destruction (DESIGN invariant 7), as pure functions.
//!
//! A candidate snapshot that removes more than `max_removal_share` of the published routes,
//! or all of them, is held back. A held snapshot is published when an operator approves it
//! (`ApproveHeldSnapshot`), or when it is confirmed: its content has stayed the same for
//! `confirm_after` and a fresh, consistent read of Ingresses and IngressClasses from the API
//! server agrees with the caches (see `publisher`). A newer candidate replaces the hold and
//! is assessed afresh against the published snapshot.

use std::collections::HashSet;

use holdfast_proto::snapshot::route_count;
use holdfast_proto::v1::Snapshot;

/// The identity of a route: host, match kind and path ("" host and "*" path for the
/// default backend).
fn route_keys(s: &Snapshot) -> HashSet<(&str, i32, &str)> {
    let mut keys: HashSet<(&str, i32, &str)> = s
        .virtual_hosts
        .iter()
        .flat_map(|v| {
            v.routes
                .iter()
                .map(move |r| (v.host.as_str(), r.match_kind, r.path.as_str()))
        })
        .collect();
    if s.default_backend.is_some() {
        keys.insert(("", -1, "*"));
    }
    keys
}

/// What to do with a candidate.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Publish it.
    Publish,
    /// Hold it back.
    Hold {
        /// Why, for logs, metrics and `GetStatus`.
        reason: String,
        /// Routes in the published snapshot.
        routes_published: usize,
        /// Routes in the candidate.
        routes_held: usize,
    },
}

/// Assesses `candidate` against the `published` snapshot.
pub fn assess(
    published: Option<&Snapshot>,
    candidate: &Snapshot,
    max_removal_share: f64,
) -> Verdict {
    let Some(published) = published else {
        return Verdict::Publish;
    };
    let before = route_keys(published);
    if before.is_empty() {
        return Verdict::Publish;
    }
    let after = route_keys(candidate);
    let removed = before.difference(&after).count();
    let share = removed as f64 / before.len() as f64;
    let routes_published = route_count(published);
    let routes_held = route_count(candidate);
    if after.is_empty() {
        return Verdict::Hold {
            reason: format!("snapshot removes all {removed} routes"),
            routes_published,
            routes_held,
        };
    }
    if share > max_removal_share {
        return Verdict::Hold {
            reason: format!(
                "snapshot removes {removed} of {} routes ({:.0}% > {:.0}% allowed without confirmation)",
                before.len(),
                share * 100.0,
                max_removal_share * 100.0
            ),
            routes_published,
            routes_held,
        };
    }
    Verdict::Publish
}

#[cfg(test)]
mod tests {
    use holdfast_proto::v1::{DefaultBackend, MatchKind, Route, VirtualHost};

    use super::*;

    fn snapshot(hosts: &[&str]) -> Snapshot {
        Snapshot {
            virtual_hosts: hosts
                .iter()
                .map(|h| VirtualHost {
                    host: (*h).into(),
                    routes: vec![Route {
                        match_kind: MatchKind::Prefix as i32,
                        path: "/".into(),
                        backend: "b".into(),
                        source: None,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    const HOSTS: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];

    #[test]
    fn the_first_snapshot_and_additions_publish() {
        assert_eq!(assess(None, &snapshot(&[]), 0.5), Verdict::Publish);
        assert_eq!(
            assess(Some(&snapshot(&["a"])), &snapshot(&["a", "b"]), 0.5),
            Verdict::Publish
        );
        assert_eq!(
            assess(Some(&snapshot(&[])), &snapshot(&["a"]), 0.5),
            Verdict::Publish
        );
    }

    #[test]
    fn removing_everything_is_held() {
        let v = assess(Some(&snapshot(&HOSTS)), &snapshot(&[]), 0.5);
        match v {
            Verdict::Hold {
                reason,
                routes_published,
                routes_held,
            } => {
                assert_eq!((routes_published, routes_held), (10, 0));
                assert_eq!(reason, "snapshot removes all 10 routes");
            }
            Verdict::Publish => panic!("removing all routes was published"),
        }
    }

    #[test]
    fn removing_all_is_held_even_with_a_permissive_threshold() {
        assert!(matches!(
            assess(Some(&snapshot(&["a"])), &snapshot(&[]), 1.0),
            Verdict::Hold { .. }
        ));
    }

    #[test]
    fn a_small_removal_flows_and_a_large_one_is_held() {
        let published = snapshot(&HOSTS);
        assert_eq!(
            assess(Some(&published), &snapshot(&HOSTS[1..]), 0.5),
            Verdict::Publish
        );
        assert_eq!(
            assess(Some(&published), &snapshot(&HOSTS[5..]), 0.5),
            Verdict::Publish,
            "exactly 50%"
        );
        assert!(matches!(
            assess(Some(&published), &snapshot(&HOSTS[6..]), 0.5),
            Verdict::Hold { .. }
        ));
    }

    #[test]
    fn replacing_routes_counts_as_removal() {
        // Same count, but every published route is gone.
        let v = assess(Some(&snapshot(&["a", "b"])), &snapshot(&["x", "y"]), 0.5);
        assert!(matches!(v, Verdict::Hold { .. }), "{v:?}");
    }

    #[test]
    fn the_default_backend_counts_as_a_route() {
        let mut published = snapshot(&[]);
        published.default_backend = Some(DefaultBackend {
            backend: "b".into(),
            source: None,
        });
        assert!(matches!(
            assess(Some(&published), &snapshot(&[]), 0.5),
            Verdict::Hold { .. }
        ));
    }
}
