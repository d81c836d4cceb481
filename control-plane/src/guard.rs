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
use holdfast_proto::v1::{Snapshot, VirtualHost};

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

/// Assesses `candidate` against the `published` snapshot, comparing every route:
/// O(snapshot). [`assess_change`] decides the same from what changed.
pub fn assess(
    published: Option<&Snapshot>,
    candidate: &Snapshot,
    max_removal_share: f64,
) -> Verdict {
    let Some(published) = published else {
        return Verdict::Publish;
    };
    let before = route_keys(published);
    let after = route_keys(candidate);
    let removed = before.difference(&after).count();
    decide(
        Sizes {
            keys_before: before.len(),
            keys_after: after.len(),
            routes_published: route_count(published),
            routes_held: route_count(candidate),
        },
        removed,
        max_removal_share,
    )
}

/// Route counts of the two snapshots compared.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Distinct route keys in the published snapshot (the default backend is one).
    pub keys_before: usize,
    /// Same, in the candidate.
    pub keys_after: usize,
    /// Routes in the published snapshot.
    pub routes_published: usize,
    /// Routes in the candidate.
    pub routes_held: usize,
}

/// [`assess`] in O(change): given both snapshots' [`Sizes`], each virtual host that
/// differs between them (before, after; `None` where absent), and whether the default
/// backend goes, counts the route keys the candidate loses.
pub fn assess_change<'a>(
    sizes: Sizes,
    changed_hosts: impl IntoIterator<Item = (Option<&'a VirtualHost>, Option<&'a VirtualHost>)>,
    default_backend_removed: bool,
    max_removal_share: f64,
) -> Verdict {
    let keys = |v: &'a VirtualHost| -> HashSet<(i32, &'a str)> {
        v.routes
            .iter()
            .map(|r| (r.match_kind, r.path.as_str()))
            .collect()
    };
    let mut removed = usize::from(default_backend_removed);
    for (before, after) in changed_hosts {
        let Some(before) = before else { continue };
        let after = after.map(keys).unwrap_or_default();
        removed += keys(before).difference(&after).count();
    }
    decide(sizes, removed, max_removal_share)
}

fn decide(sizes: Sizes, removed: usize, max_removal_share: f64) -> Verdict {
    let Sizes {
        keys_before,
        keys_after,
        routes_published,
        routes_held,
    } = sizes;
    if keys_before == 0 {
        return Verdict::Publish;
    }
    let share = removed as f64 / keys_before as f64;
    if keys_after == 0 {
        return Verdict::Hold {
            reason: format!("snapshot removes all {removed} routes"),
            routes_published,
            routes_held,
        };
    }
    if share > max_removal_share {
        return Verdict::Hold {
            reason: format!(
                "snapshot removes {removed} of {keys_before} routes ({:.0}% > {:.0}% allowed without confirmation)",
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

#[cfg(test)]
mod change_tests {
    use holdfast_proto::v1::{DefaultBackend, MatchKind, Route, VirtualHost};
    use proptest::prelude::*;

    use super::*;

    /// Hosts `h<i>` with routes `/p<j>` (Prefix or Exact by bit), and a default backend.
    fn build(hosts: &std::collections::BTreeMap<u8, Vec<(bool, u8)>>, default: bool) -> Snapshot {
        Snapshot {
            virtual_hosts: hosts
                .iter()
                .map(|(h, routes)| VirtualHost {
                    host: format!("h{h}"),
                    routes: routes
                        .iter()
                        .map(|(exact, p)| Route {
                            match_kind: if *exact {
                                MatchKind::Exact
                            } else {
                                MatchKind::Prefix
                            } as i32,
                            path: format!("/p{p}"),
                            backend: "b".into(),
                            source: None,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            default_backend: default.then(|| DefaultBackend {
                backend: "b".into(),
                source: None,
            }),
            ..Default::default()
        }
    }

    fn keys(s: &Snapshot) -> usize {
        route_keys(s).len()
    }

    proptest! {
        /// From the hosts that differ alone, the guard decides as it does comparing
        /// every route.
        #[test]
        fn the_guard_decides_from_the_change_as_from_every_route(
            before in prop::collection::btree_map(0u8..8, prop::collection::vec((any::<bool>(), 0u8..4), 0..4), 0..8),
            after in prop::collection::btree_map(0u8..8, prop::collection::vec((any::<bool>(), 0u8..4), 0..4), 0..8),
            defaults in (any::<bool>(), any::<bool>()),
            share in 0.0f64..1.0,
        ) {
            let (published, candidate) = (build(&before, defaults.0), build(&after, defaults.1));
            let host = |s: &Snapshot, h: &str| s.virtual_hosts.iter().find(|v| v.host == h).cloned();
            let names: std::collections::BTreeSet<String> = published
                .virtual_hosts
                .iter()
                .chain(&candidate.virtual_hosts)
                .map(|v| v.host.clone())
                .filter(|h| host(&published, h) != host(&candidate, h))
                .collect();
            let pairs: Vec<(Option<VirtualHost>, Option<VirtualHost>)> = names
                .iter()
                .map(|h| (host(&published, h), host(&candidate, h)))
                .collect();
            let sizes = Sizes {
                keys_before: keys(&published),
                keys_after: keys(&candidate),
                routes_published: route_count(&published),
                routes_held: route_count(&candidate),
            };
            let by_change = assess_change(
                sizes,
                pairs.iter().map(|(a, b)| (a.as_ref(), b.as_ref())),
                defaults.0 && !defaults.1,
                share,
            );
            prop_assert_eq!(by_change, assess(Some(&published), &candidate, share));
        }
    }
}
