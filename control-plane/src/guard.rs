//! Bounded destruction (docs/design.md, invariant 7), as pure functions.
//!
//! A candidate snapshot that removes more than `max_removal_share` of the published routes,
//! or all of them, has that removal held back, and only that: the routes it removes stay
//! in the published snapshot ([`keep_held`]) while every other change of the candidate
//! (additions, endpoints, small removals) is published with them. The held routes are
//! removed when an operator approves the held set by name (`ApproveHeldSnapshot`), or
//! when it is confirmed: the held set has stayed the same for `confirm_after` and a
//! fresh, consistent read of Ingresses and IngressClasses from the API server agrees with
//! the caches (see `publisher`). A held route that comes back leaves the set; a new large
//! removal joins it; either makes a new set, with a new name and a new period.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};

use sha2::{Digest, Sha256};

use holdfast_proto::snapshot::{
    gateway_route_key, ingress_gateway_host, ingress_virtual_host, is_ingress_host, route_count,
};
use holdfast_proto::v1::{GatewayHost, GatewayRoute, Snapshot, VirtualHost};

/// The identity of a route: host, match kind and path ("" host and "*" path for the
/// default backend). An Ingress route has the same key in either form of its host (a
/// virtual host, or the Gateway host of listener `ingress`). A Gateway route's "host" is
/// its Gateway host's name (`<address>:<port> <hostname>`, which no Ingress host can be)
/// and its "path" its [`gateway_route_key`] (path and header matches).
fn route_keys(s: &Snapshot) -> HashSet<(Cow<'_, str>, i32, Cow<'_, str>)> {
    let mut keys: HashSet<(Cow<'_, str>, i32, Cow<'_, str>)> = s
        .virtual_hosts
        .iter()
        .flat_map(|v| {
            v.routes.iter().map(move |r| {
                (
                    Cow::Borrowed(v.host.as_str()),
                    r.match_kind,
                    Cow::Borrowed(r.path.as_str()),
                )
            })
        })
        .collect();
    for g in &s.gateway_hosts {
        // An Ingress host is keyed alike in either form: by its host.
        let host = if is_ingress_host(g) { &g.host } else { &g.name };
        for r in &g.routes {
            keys.insert((
                Cow::Borrowed(host.as_str()),
                r.match_kind,
                Cow::Owned(gateway_route_key(r)),
            ));
        }
    }
    if s.default_backend.is_some() {
        keys.insert((Cow::Borrowed(""), -1, Cow::Borrowed("*")));
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

/// The route keys of a Gateway host (see [`route_keys`]).
fn gateway_keys(g: &GatewayHost) -> HashSet<(i32, String)> {
    g.routes
        .iter()
        .map(|r| (r.match_kind, gateway_route_key(r)))
        .collect()
}

/// [`assess`] in O(change): given both snapshots' [`Sizes`], each virtual host and each
/// Gateway host that differs between them (before, after; `None` where absent), and
/// whether the default backend goes, counts the route keys the candidate loses.
pub fn assess_change<'a>(
    sizes: Sizes,
    changed_hosts: impl IntoIterator<Item = (Option<&'a VirtualHost>, Option<&'a VirtualHost>)>,
    changed_gateway_hosts: impl IntoIterator<Item = (Option<&'a GatewayHost>, Option<&'a GatewayHost>)>,
    default_backend_removed: bool,
    max_removal_share: f64,
) -> Verdict {
    // Ingress hosts by host, in either form (a host may change form in one change):
    // the route keys before and after.
    type Keys<'k> = HashSet<(i32, Cow<'k, str>)>;
    let mut ingress: HashMap<&'a str, (Keys<'a>, Keys<'a>)> = HashMap::new();
    let virtual_keys = |v: &'a VirtualHost| -> Keys<'a> {
        v.routes
            .iter()
            .map(|r| (r.match_kind, Cow::Borrowed(r.path.as_str())))
            .collect()
    };
    let owned = |g: &GatewayHost| -> Keys<'a> {
        gateway_keys(g)
            .into_iter()
            .map(|(k, p)| (k, Cow::Owned(p)))
            .collect()
    };
    let mut removed = usize::from(default_backend_removed);
    for (before, after) in changed_hosts {
        if let Some(v) = before {
            ingress
                .entry(&v.host)
                .or_default()
                .0
                .extend(virtual_keys(v));
        }
        if let Some(v) = after {
            ingress
                .entry(&v.host)
                .or_default()
                .1
                .extend(virtual_keys(v));
        }
    }
    for (before, after) in changed_gateway_hosts {
        match (before, after) {
            (Some(g), _) | (None, Some(g)) if is_ingress_host(g) => {
                for (side, g) in [(0, before), (1, after)] {
                    let Some(g) = g.filter(|g| is_ingress_host(g)) else {
                        continue;
                    };
                    let entry = ingress.entry(&g.host).or_default();
                    if side == 0 {
                        &mut entry.0
                    } else {
                        &mut entry.1
                    }
                    .extend(owned(g));
                }
            }
            (Some(before), after) => {
                let after = after.map(gateway_keys).unwrap_or_default();
                removed += gateway_keys(before).difference(&after).count();
            }
            (None, _) => {}
        }
    }
    removed += ingress
        .values()
        .map(|(before, after)| before.difference(after).count())
        .sum::<usize>();
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

/// A route's identity, owned: host, match kind and path; the default backend is
/// `("", -1, "*")`.
pub type RouteKey = (String, i32, String);

/// The key of the default backend.
fn default_key() -> RouteKey {
    (String::new(), -1, "*".into())
}

/// The routes of `published` that `candidate` does not have: O(snapshot).
pub fn removed_routes(published: &Snapshot, candidate: &Snapshot) -> BTreeSet<RouteKey> {
    let after = route_keys(candidate);
    route_keys(published)
        .into_iter()
        .filter(|k| !after.contains(k))
        .map(|(h, m, p)| (h.into_owned(), m, p.into_owned()))
        .collect()
}

/// Which removals are held. `removed`: the routes the candidate removes from the
/// published snapshot (`published_keys` routes, which include any routes held so far);
/// `held`: the routes held so far. Routes held so far that the candidate still removes
/// stay held; the other removals flow unless they are more than `max_removal_share` of
/// the published routes not held, or all of them, in which case they are held too. Returns the routes now held and, when that set is new, why.
pub fn held_removals(
    published_keys: usize,
    candidate_keys: usize,
    removed: &BTreeSet<RouteKey>,
    held: &BTreeSet<RouteKey>,
    max_removal_share: f64,
) -> (BTreeSet<RouteKey>, Option<String>) {
    let still: BTreeSet<RouteKey> = held.intersection(removed).cloned().collect();
    let new: BTreeSet<RouteKey> = removed.difference(held).cloned().collect();
    // The new removals are judged against the routes not held: with most routes held,
    // losing what remains is still a large removal.
    let verdict = decide(
        Sizes {
            keys_before: published_keys.saturating_sub(still.len()),
            keys_after: candidate_keys,
            routes_published: published_keys,
            routes_held: candidate_keys,
        },
        new.len(),
        max_removal_share,
    );
    match verdict {
        Verdict::Publish => (still, None),
        Verdict::Hold { reason, .. } => (still.union(&new).cloned().collect(), Some(reason)),
    }
}

/// The name of a held set: what `GetStatus` shows and `ApproveHeldSnapshot` names. It
/// changes whenever the set does, so an approval is always of the routes it read.
pub fn held_name(held: &BTreeSet<RouteKey>) -> String {
    let mut h = Sha256::new();
    for (host, kind, path) in held {
        h.update(host.as_bytes());
        h.update([0]);
        h.update(kind.to_be_bytes());
        h.update(path.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("held-{}-{hex}", held.len())
}

/// `candidate` with the `held` routes of `published` kept in it: each goes back into its
/// virtual host (re-made from `published`, certificate and redirect included, where the
/// candidate has dropped the host; given the published certificate where the candidate's
/// host has none), with its backend and the host's certificate taken from `published`
/// where the candidate has none of that name. Everything else is the
/// candidate's: its additions, endpoints and small removals. Not sealed.
pub fn keep_held(
    candidate: &Snapshot,
    published: &Snapshot,
    held: &BTreeSet<RouteKey>,
) -> Snapshot {
    let mut out = candidate.clone();
    let mut backends: HashSet<String> = out.backends.iter().map(|b| b.name.clone()).collect();
    let mut certificates: HashSet<String> =
        out.certificates.iter().map(|c| c.name.clone()).collect();
    let mut need_backend = |name: &str, out: &mut Snapshot| {
        if backends.insert(name.to_owned())
            && let Some(b) = published.backends.iter().find(|b| b.name == name)
        {
            out.backends.push(b.clone());
        }
    };
    let mut ingress_held: std::collections::BTreeMap<&str, Vec<(i32, &str)>> =
        std::collections::BTreeMap::new();
    for key in held {
        if *key == default_key() {
            if let Some(d) = &published.default_backend {
                out.default_backend = Some(d.clone());
                need_backend(&d.backend, &mut out);
            }
            continue;
        }
        let (host, kind, path) = key;
        if host.contains(' ') {
            keep_held_gateway_route(&mut out, published, key, &mut certificates);
            for b in published
                .gateway_hosts
                .iter()
                .filter(|g| g.name == *host)
                .flat_map(|g| g.routes.iter())
                .filter(|r| r.match_kind == *kind && gateway_route_key(r) == *path)
                .flat_map(holdfast_proto::snapshot::gateway_route_backends)
            {
                need_backend(b, &mut out);
            }
            continue;
        }
        // An Ingress route: put back per host, below.
        ingress_held
            .entry(host.as_str())
            .or_default()
            .push((*kind, path.as_str()));
    }
    for (host, routes) in ingress_held {
        // Its host, in whichever form each snapshot gives it.
        let Some((before, published_form)) = ingress_host(published, host) else {
            continue;
        };
        // The entries of each held key: path and header matches (a canary's header rules
        // are entries, and keys, of their own).
        // In the order they were published in.
        let routes: Vec<&GatewayRoute> = before
            .routes
            .iter()
            .filter(|r| {
                routes
                    .iter()
                    .any(|(kind, key)| r.match_kind == *kind && gateway_route_key(r) == *key)
            })
            .collect();
        if routes.is_empty() {
            continue;
        }
        // The candidate's host, in its form, or the published one re-made without
        // routes, in the form it was published in.
        let (mut v, form) = ingress_host(&out, host).unwrap_or_else(|| {
            let empty = GatewayHost {
                routes: Vec::new(),
                ..before.clone()
            };
            (empty, published_form)
        });
        // A held route is served as it was published: over TLS with the host's
        // certificate, when the candidate's host has none (the Ingress that named it is
        // the one going; another Ingress without TLS keeps the host).
        if v.certificate.is_empty() && !before.certificate.is_empty() {
            v.certificate.clone_from(&before.certificate);
            v.ssl_redirect |= before.ssl_redirect;
        }
        if v.certificate == before.certificate
            && !before.certificate.is_empty()
            && certificates.insert(before.certificate.clone())
            && let Some(c) = published
                .certificates
                .iter()
                .find(|c| c.name == before.certificate)
        {
            out.certificates.push(c.clone());
        }
        for route in routes {
            v.routes.push(route.clone());
            for b in holdfast_proto::snapshot::gateway_route_backends(route) {
                need_backend(b, &mut out);
            }
        }
        crate::translate::sort_ingress_routes(&mut v.routes);
        put_ingress_host(&mut out, v, form);
    }
    out.virtual_hosts.sort_by(|a, b| a.host.cmp(&b.host));
    out.backends.sort_by(|a, b| a.name.cmp(&b.name));
    out.certificates.sort_by(|a, b| a.name.cmp(&b.name));
    out.gateway_listeners.sort_by(|a, b| a.name.cmp(&b.name));
    out.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The form an Ingress host is given in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// A virtual host (as older control planes send them).
    Virtual,
    /// The Gateway host of listener `ingress` (the one route model).
    Gateway,
}

/// Ingress host `host` of `s` in the one route model (a Gateway host of listener
/// `ingress`), and the form `s` gives it in.
fn ingress_host(s: &Snapshot, host: &str) -> Option<(GatewayHost, Form)> {
    if let Some(v) = s.virtual_hosts.iter().find(|v| v.host == host) {
        return Some((ingress_gateway_host(v), Form::Virtual));
    }
    s.gateway_hosts
        .iter()
        .find(|g| is_ingress_host(g) && g.host == host)
        .map(|g| (g.clone(), Form::Gateway))
}

/// Puts Ingress host `g` into `out` in `form`, in place of the host's entry if it has
/// one. A host with filters goes in as a Gateway host whatever `form` says (a virtual
/// host cannot carry them).
fn put_ingress_host(out: &mut Snapshot, g: GatewayHost, form: Form) {
    let virtual_host = match form {
        Form::Virtual => ingress_virtual_host(&g).ok(),
        Form::Gateway => None,
    };
    match virtual_host {
        Some(v) => match out.virtual_hosts.iter_mut().find(|x| x.host == v.host) {
            Some(x) => *x = v,
            None => out.virtual_hosts.push(v),
        },
        None => {
            out.virtual_hosts.retain(|x| x.host != g.host);
            match out.gateway_hosts.iter_mut().find(|x| x.name == g.name) {
                Some(x) => *x = g,
                None => out.gateway_hosts.push(g),
            }
        }
    }
}

/// Puts the held Gateway route `key` of `published` back into `out`: into its Gateway
/// host (re-made from `published` if the candidate dropped it), whose listener (with its
/// certificates) is taken from `published` if the candidate dropped it too. The route
/// goes after the candidate's routes of the same precedence class (Exact before
/// PathPrefix, longer paths, more header matches): the order of the routes it was
/// published beside, as far as the snapshot records it. If the candidate's listener at
/// that address and port belongs to another Gateway (the address went to a new Gateway),
/// the route is not kept there: a Gateway never serves another's routes.
fn keep_held_gateway_route(
    out: &mut Snapshot,
    published: &Snapshot,
    (host, kind, path): &RouteKey,
    certificates: &mut HashSet<String>,
) {
    let Some(before) = published.gateway_hosts.iter().find(|g| g.name == *host) else {
        return;
    };
    let Some(route) = before
        .routes
        .iter()
        .find(|r| r.match_kind == *kind && gateway_route_key(r) == *path)
    else {
        return;
    };
    let owner = |s: &Snapshot| {
        s.gateway_listeners
            .iter()
            .find(|l| l.name == before.listener)
            .map(|l| {
                l.gateway
                    .as_ref()
                    .map(|g| (g.namespace.clone(), g.name.clone()))
            })
    };
    if let (Some(now), Some(then)) = (owner(out), owner(published))
        && now != then
    {
        return;
    }
    if !out
        .gateway_listeners
        .iter()
        .any(|l| l.name == before.listener)
        && let Some(l) = published
            .gateway_listeners
            .iter()
            .find(|l| l.name == before.listener)
    {
        out.gateway_listeners.push(l.clone());
        for name in holdfast_proto::snapshot::listener_certificates(l) {
            if certificates.insert(name.to_owned())
                && let Some(c) = published.certificates.iter().find(|c| c.name == name)
            {
                out.certificates.push(c.clone());
            }
        }
    }
    let i = match out.gateway_hosts.iter().position(|g| g.name == *host) {
        Some(i) => i,
        None => {
            out.gateway_hosts.push(GatewayHost {
                routes: Vec::new(),
                ..before.clone()
            });
            out.gateway_hosts.len() - 1
        }
    };
    let routes = &mut out.gateway_hosts[i].routes;
    let class = |r: &holdfast_proto::v1::GatewayRoute| {
        (
            r.match_kind != holdfast_proto::v1::MatchKind::Exact as i32,
            std::cmp::Reverse(r.path.len()),
            r.method.is_empty(),
            std::cmp::Reverse(r.headers.len()),
            std::cmp::Reverse(r.query_params.len()),
        )
    };
    let at = routes.partition_point(|r| class(r) <= class(route));
    routes.insert(at, route.clone());
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

    /// The listener of Gateway host `h<i>` (one each).
    fn listener_of(h: u8) -> String {
        holdfast_proto::snapshot::listener_name("127.10.0.1", 8000 + u32::from(h))
    }

    /// Hosts `h<i>` with routes `/p<j>` (Prefix or Exact by bit), and a default backend.
    /// Hosts from `h5` on are Gateway hosts (each on a listener of its own), the others
    /// virtual hosts.
    fn build(hosts: &std::collections::BTreeMap<u8, Vec<(bool, u8)>>, default: bool) -> Snapshot {
        use holdfast_proto::v1::{GatewayListener, GatewayRoute, WeightedBackend};
        let kind = |exact: bool| {
            (if exact {
                MatchKind::Exact
            } else {
                MatchKind::Prefix
            }) as i32
        };
        let gateway: Vec<(&u8, &Vec<(bool, u8)>)> =
            hosts.iter().filter(|(h, _)| **h >= 5).collect();
        Snapshot {
            gateway_listeners: gateway
                .iter()
                .map(|(h, _)| GatewayListener {
                    name: listener_of(**h),
                    address: "127.10.0.1".into(),
                    port: 8000 + u32::from(**h),
                    protocol: "HTTP".into(),
                    ..Default::default()
                })
                .collect(),
            gateway_hosts: gateway
                .iter()
                .map(|(h, routes)| GatewayHost {
                    name: holdfast_proto::snapshot::gateway_host_name(
                        &listener_of(**h),
                        &format!("h{h}"),
                    ),
                    listener: listener_of(**h),
                    host: format!("h{h}"),
                    routes: routes
                        .iter()
                        .map(|(exact, p)| GatewayRoute {
                            match_kind: kind(*exact),
                            path: format!("/p{p}"),
                            backends: vec![WeightedBackend {
                                backend: "b".into(),
                                weight: 1,
                                unresolved: String::new(),
                                ..Default::default()
                            }],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            virtual_hosts: hosts
                .iter()
                .filter(|(h, _)| **h < 5)
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

    /// `s` with each virtual host `h<i>` whose bit `i` is set in `forms` given instead as
    /// the Gateway host of listener `ingress` (the one route model).
    fn in_forms(mut s: Snapshot, forms: u8) -> Snapshot {
        let bit = |v: &VirtualHost| {
            v.host
                .trim_start_matches('h')
                .parse::<u8>()
                .is_ok_and(|i| forms & (1 << i) != 0)
        };
        let (one, legacy): (Vec<VirtualHost>, Vec<VirtualHost>) =
            std::mem::take(&mut s.virtual_hosts)
                .into_iter()
                .partition(bit);
        s.virtual_hosts = legacy;
        s.gateway_hosts.extend(
            one.iter()
                .map(holdfast_proto::snapshot::ingress_gateway_host),
        );
        s.gateway_hosts.sort_by(|a, b| a.name.cmp(&b.name));
        s
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
            forms in (any::<u8>(), any::<u8>()),
        ) {
            // Each Ingress host in either form, which may change between the two.
            let (published, candidate) = (
                in_forms(build(&before, defaults.0), forms.0),
                in_forms(build(&after, defaults.1), forms.1),
            );
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
            let gateway_host = |s: &Snapshot, n: &str| s.gateway_hosts.iter().find(|g| g.name == n).cloned();
            let gateway_names: std::collections::BTreeSet<String> = published
                .gateway_hosts
                .iter()
                .chain(&candidate.gateway_hosts)
                .map(|g| g.name.clone())
                .filter(|n| gateway_host(&published, n) != gateway_host(&candidate, n))
                .collect();
            let gateway_pairs: Vec<(Option<GatewayHost>, Option<GatewayHost>)> = gateway_names
                .iter()
                .map(|n| (gateway_host(&published, n), gateway_host(&candidate, n)))
                .collect();
            let by_change = assess_change(
                sizes,
                pairs.iter().map(|(a, b)| (a.as_ref(), b.as_ref())),
                gateway_pairs.iter().map(|(a, b)| (a.as_ref(), b.as_ref())),
                defaults.0 && !defaults.1,
                share,
            );
            prop_assert_eq!(by_change, assess(Some(&published), &candidate, share));
        }

        /// The snapshot published while routes are held is the candidate plus exactly
        /// the held routes (with what they name), and it is valid.
        #[test]
        fn keeping_the_held_routes_adds_exactly_them_to_the_candidate(
            before in prop::collection::btree_map(0u8..8, prop::collection::vec((any::<bool>(), 0u8..4), 1..4), 0..8),
            after in prop::collection::btree_map(0u8..8, prop::collection::vec((any::<bool>(), 0u8..4), 1..4), 0..8),
            defaults in (any::<bool>(), any::<bool>()),
            mask in prop::collection::vec(any::<bool>(), 40),
            forms in (any::<u8>(), any::<u8>()),
        ) {
            let (published, candidate) = (
                in_forms(full(&before, defaults.0, 1), forms.0),
                in_forms(full(&after, defaults.1, 2), forms.1),
            );
            let removed = removed_routes(&published, &candidate);
            let held: BTreeSet<RouteKey> = removed
                .iter()
                .zip(mask.iter().cycle())
                .filter(|(_, m)| **m)
                .map(|(k, _)| k.clone())
                .collect();
            let kept = keep_held(&candidate, &published, &held);
            prop_assert!(holdfast_proto::snapshot::validate_structure(&kept).is_ok());
            prop_assert_eq!(removed_routes(&kept, &candidate), held.clone());
            prop_assert_eq!(
                removed_routes(&published, &kept),
                removed.difference(&held).cloned().collect::<BTreeSet<_>>()
            );
            prop_assert!(removed_routes(&candidate, &kept).is_empty());
            // The candidate's own backends (its endpoints) win over the published ones.
            for b in &candidate.backends {
                prop_assert_eq!(kept.backends.iter().find(|k| k.name == b.name), Some(b));
            }
        }
    }

    /// An Ingress host given in the other form (a virtual host, or the Gateway host of
    /// listener `ingress`) has the same routes: nothing is removed, and with no removal
    /// allowed at all the change is still published, whole or from the change alone.
    #[test]
    fn an_ingress_host_that_changes_form_alone_removes_no_route() {
        let hosts = std::collections::BTreeMap::from([
            (0u8, vec![(false, 0u8), (true, 1)]),
            (1, vec![(false, 0)]),
        ]);
        let legacy = build(&hosts, false);
        let one = in_forms(legacy.clone(), 0xff);
        assert!(one.virtual_hosts.is_empty() && one.gateway_hosts.len() == 2);
        assert!(removed_routes(&legacy, &one).is_empty());
        assert!(removed_routes(&one, &legacy).is_empty());
        assert_eq!(assess(Some(&legacy), &one, 0.0), Verdict::Publish);
        let sizes = Sizes {
            keys_before: keys(&legacy),
            keys_after: keys(&one),
            routes_published: route_count(&legacy),
            routes_held: route_count(&one),
        };
        assert_eq!(sizes.keys_before, 3);
        let verdict = assess_change(
            sizes,
            legacy.virtual_hosts.iter().map(|v| (Some(v), None)),
            one.gateway_hosts.iter().map(|g| (None, Some(g))),
            false,
            0.0,
        );
        assert_eq!(verdict, Verdict::Publish);
        // A real removal (a host gone) is held at this share: the verdicts above are
        // not vacuous.
        let mut gone = one.clone();
        gone.gateway_hosts.truncate(1);
        assert!(matches!(
            assess(Some(&legacy), &gone, 0.0),
            Verdict::Hold { .. }
        ));
    }

    /// A host two Ingresses share, one with TLS: when the TLS one goes and its route is
    /// held, the held route keeps being served over TLS with the published certificate.
    #[test]
    fn a_held_route_keeps_its_hosts_certificate_when_the_host_stays_without_one() {
        let published = full(
            &std::collections::BTreeMap::from([(2u8, vec![(false, 0u8), (false, 1)])]),
            false,
            1,
        );
        assert_eq!(published.virtual_hosts[0].certificate, "c2");
        let mut candidate = published.clone();
        candidate.virtual_hosts[0].routes.remove(0);
        candidate.virtual_hosts[0].certificate.clear();
        candidate.certificates.clear();
        let held = removed_routes(&published, &candidate);
        assert_eq!(held.len(), 1);
        let kept = keep_held(&candidate, &published, &held);
        assert_eq!(kept.virtual_hosts[0].routes.len(), 2);
        assert_eq!(kept.virtual_hosts[0].certificate, "c2");
        assert_eq!(kept.certificates, published.certificates);
        assert!(holdfast_proto::snapshot::validate_structure(&kept).is_ok());
    }

    /// The same in the one route model: the host, its certificate and the held route
    /// come back as the Gateway host of listener `ingress`.
    #[test]
    fn a_held_route_of_an_ingress_host_in_the_one_model_keeps_its_certificate_too() {
        let published = in_forms(
            full(
                &std::collections::BTreeMap::from([(2u8, vec![(false, 0u8), (false, 1)])]),
                false,
                1,
            ),
            0xff,
        );
        assert!(published.virtual_hosts.is_empty());
        assert_eq!(published.gateway_hosts[0].certificate, "c2");
        let mut candidate = published.clone();
        candidate.gateway_hosts[0].routes.remove(0);
        candidate.gateway_hosts[0].certificate.clear();
        candidate.certificates.clear();
        let held = removed_routes(&published, &candidate);
        assert_eq!(held.len(), 1);
        assert_eq!(held.first().map(|k| k.0.as_str()), Some("h2"));
        let kept = keep_held(&candidate, &published, &held);
        assert!(
            kept.virtual_hosts.is_empty(),
            "kept in the form it was published in"
        );
        assert_eq!(kept.gateway_hosts, published.gateway_hosts);
        assert_eq!(kept.certificates, published.certificates);
        assert!(holdfast_proto::snapshot::validate_structure(&kept).is_ok());
        // All its routes gone: the host comes back whole.
        let mut gone = published.clone();
        gone.gateway_hosts.clear();
        gone.certificates.clear();
        let held = removed_routes(&published, &gone);
        assert_eq!(held.len(), 2);
        assert_eq!(
            keep_held(&gone, &published, &held).gateway_hosts,
            published.gateway_hosts
        );
    }

    /// An Ingress host whose entries have filters (ingress-nginx annotations): a held
    /// path comes back with its filters and every entry it has (a canary's header rule),
    /// into the candidate's host or the host re-made.
    #[test]
    fn a_held_ingress_route_with_filters_comes_back_with_them() {
        use holdfast_proto::v1::{HeaderMatch, HeaderModifier, UrlRewrite};
        let mut published = in_forms(
            full(
                &std::collections::BTreeMap::from([(2u8, vec![(false, 0u8), (false, 1)])]),
                false,
                1,
            ),
            0xff,
        );
        for r in &mut published.gateway_hosts[0].routes {
            r.ingress = Some(holdfast_proto::v1::IngressRef {
                namespace: "ns".into(),
                name: "web".into(),
            });
            r.rewrite = Some(UrlRewrite {
                hostname: "internal.example".into(),
                path: None,
            });
            r.request_headers = Some(HeaderModifier {
                set: vec![HeaderMatch {
                    name: "x-forwarded-prefix".into(),
                    value: "/p".into(),
                }],
                ..Default::default()
            });
        }
        // A canary's header rule: a second entry at the first path.
        let mut by_header = published.gateway_hosts[0].routes[0].clone();
        by_header.headers.push(HeaderMatch {
            name: "x-canary".into(),
            value: "always".into(),
        });
        published.gateway_hosts[0].routes.insert(0, by_header);
        assert!(
            holdfast_proto::snapshot::ingress_virtual_host(&published.gateway_hosts[0]).is_err()
        );
        let mut candidate = published.clone();
        candidate.gateway_hosts[0].routes.drain(0..2);
        let held = removed_routes(&published, &candidate);
        assert_eq!(held.len(), 2, "the path and its header rule: {held:?}");
        let kept = keep_held(&candidate, &published, &held);
        assert_eq!(kept.gateway_hosts, published.gateway_hosts);
        let mut sealed = kept.clone();
        holdfast_proto::snapshot::seal(&mut sealed, 2);
        assert_eq!(holdfast_proto::snapshot::validate(&sealed), Ok(()));
        let mut gone = published.clone();
        gone.gateway_hosts.clear();
        let held = removed_routes(&published, &gone);
        assert_eq!(held.len(), 3);
        assert_eq!(
            keep_held(&gone, &published, &held).gateway_hosts,
            published.gateway_hosts
        );
    }

    /// As [`build`], with what the routes name: backend `b<h>` per host (its endpoint
    /// port is `port`), a certificate `c<h>` on even hosts, default backend `bd`.
    fn full(
        hosts: &std::collections::BTreeMap<u8, Vec<(bool, u8)>>,
        default: bool,
        port: u32,
    ) -> Snapshot {
        use holdfast_proto::v1::{Backend, Certificate, Endpoint};
        let mut s = build(hosts, default);
        let backend = |name: String| Backend {
            name,
            endpoints: vec![Endpoint {
                address: "10.0.0.1".into(),
                port,
                zone: String::new(),
                ready: true,
            }],
            ..Default::default()
        };
        for g in &mut s.gateway_hosts {
            let h = g.host.trim_start_matches('h').to_owned();
            for r in &mut g.routes {
                r.backends[0].backend = format!("b{h}");
            }
            s.backends.push(backend(format!("b{h}")));
            if h.parse::<u8>().is_ok_and(|n| n % 2 == 0) {
                let l = s
                    .gateway_listeners
                    .iter_mut()
                    .find(|l| l.name == g.listener)
                    .expect("the host's listener");
                l.protocol = "HTTPS".into();
                l.certificates = vec![holdfast_proto::v1::ListenerCertificates {
                    hostname: String::new(),
                    certificates: vec![format!("c{h}")],
                }];
                s.certificates.push(Certificate {
                    name: format!("c{h}"),
                    ..Default::default()
                });
            }
        }
        s.backends.sort_by(|a, b| a.name.cmp(&b.name));
        s.certificates.sort_by(|a, b| a.name.cmp(&b.name));
        for v in &mut s.virtual_hosts {
            let h = v.host.trim_start_matches('h').to_owned();
            for r in &mut v.routes {
                r.backend = format!("b{h}");
            }
            s.backends.push(backend(format!("b{h}")));
            if h.parse::<u8>().is_ok_and(|n| n % 2 == 0) {
                v.certificate = format!("c{h}");
                s.certificates.push(Certificate {
                    name: format!("c{h}"),
                    ..Default::default()
                });
            }
        }
        if let Some(d) = &mut s.default_backend {
            d.backend = "bd".into();
            s.backends.push(backend("bd".into()));
        }
        s
    }
}

#[cfg(test)]
mod gateway_hold_tests {
    use holdfast_proto::v1::{
        Backend, GatewayHost, GatewayListener, GatewayRef, GatewayRoute, MatchKind, WeightedBackend,
    };

    use super::*;

    fn with_gateway(gateway: &str, routes: &[&str]) -> Snapshot {
        let listener = "127.10.0.1:80".to_string();
        Snapshot {
            backends: vec![Backend {
                name: "ns/b:80".into(),
                ..Default::default()
            }],
            gateway_listeners: vec![GatewayListener {
                name: listener.clone(),
                address: "127.10.0.1".into(),
                port: 80,
                protocol: "HTTP".into(),
                certificates: vec![],
                gateway: Some(GatewayRef {
                    namespace: "ns".into(),
                    name: gateway.into(),
                    generation: 1,
                }),
                public_port: 0,
            }],
            gateway_hosts: vec![GatewayHost {
                name: holdfast_proto::snapshot::gateway_host_name(&listener, ""),
                listener,
                host: String::new(),
                routes: routes
                    .iter()
                    .map(|p| GatewayRoute {
                        match_kind: MatchKind::Prefix as i32,
                        path: (*p).into(),
                        backends: vec![WeightedBackend {
                            backend: "ns/b:80".into(),
                            weight: 1,
                            unresolved: String::new(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A held route of a deleted Gateway is kept on its listener while the address is
    /// still that Gateway's, and never on a new Gateway that took the address.
    #[test]
    fn a_held_gateway_route_is_never_kept_on_another_gateways_listener() {
        let published = with_gateway("old", &["/a", "/b"]);
        let held = removed_routes(&published, &with_gateway("old", &["/a"]));
        assert_eq!(held.len(), 1);
        let kept = keep_held(&with_gateway("old", &["/a"]), &published, &held);
        assert_eq!(
            kept.gateway_hosts[0].routes.len(),
            2,
            "kept on its own Gateway"
        );
        let taken_over = with_gateway("new", &["/a"]);
        let kept = keep_held(&taken_over, &published, &held);
        assert_eq!(
            kept, taken_over,
            "not kept on the Gateway that took the address"
        );
        assert!(holdfast_proto::snapshot::validate_structure(&kept).is_ok());
    }

    /// A held route's mirror backend is kept with it: the route names it, so a snapshot
    /// without it would be invalid and never published.
    #[test]
    fn a_held_gateway_route_keeps_its_mirrors_backend() {
        let mut published = with_gateway("gw", &["/a", "/mirrored"]);
        published.backends.push(Backend {
            name: "ns/copy:80".into(),
            ..Default::default()
        });
        published.gateway_hosts[0].routes[1].mirrors = vec![holdfast_proto::v1::Mirror {
            backend: "ns/copy:80".into(),
            unresolved: String::new(),
            numerator: 1,
            denominator: 1,
        }];
        let candidate = with_gateway("gw", &["/a"]);
        let held = removed_routes(&published, &candidate);
        assert_eq!(held.len(), 1);
        let kept = keep_held(&candidate, &published, &held);
        assert!(kept.backends.iter().any(|b| b.name == "ns/copy:80"));
        holdfast_proto::snapshot::validate_structure(&kept).expect("valid");
    }
}
