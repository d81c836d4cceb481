//! Host claims: which namespace owns each host (docs/design.md, Tenancy).
//!
//! The threat: Ingress hosts are mutable, so a rule "the namespace of the oldest Ingress
//! owns the host" lets a tenant with any old Ingress (another class, a dormant one) edit
//! it to name a victim's host and take the host, its routes and its certificate. Here a
//! namespace's claim on a host dates from when that namespace first **named** the host in
//! one of our Ingresses (a rule's host or a `spec.tls` host), and that date is recorded:
//!
//! - The leader (the `coordination.k8s.io` Lease of [`crate::status`]) keeps the
//!   **ledger** in one ConfigMap (`--host-claims-configmap`, in the control plane's own
//!   namespace), one key per host. Every replica watches that ConfigMap like any other
//!   kind, so every replica computes the same owner from the same ledger, whichever
//!   replica leads and whatever its clock says.
//! - The **owner** of a host is the namespace of its first recorded claim. Claims are kept
//!   in the order they were recorded (a new one is appended), so no clock decides it: a
//!   leader whose clock runs behind cannot date a later claim before an earlier one. A
//!   namespace that names the host but whose claim is not recorded yet ranks after every
//!   recorded claim, so it never displaces a recorded owner. Namespaces that name a host
//!   nobody has claimed yet, in the same step, are recorded oldest Ingress first (then
//!   namespace/name), and the translator orders unrecorded namers the same way: on an
//!   upgrade from ownership by Ingress age, and for a brand-new host named by two
//!   namespaces before the leader records either (a window of about a second), the
//!   Ingress age decides, as it did before; afterwards it never does.
//! - A namespace may hold at most `--max-host-claims-per-namespace` claims (1,000): one
//!   tenant cannot fill the ledger for everyone.
//! - A claim is **released** only when its namespace has named the host in none of its
//!   Ingresses for the grace period (`--host-claim-grace`): during a redeploy (delete, then
//!   create) nobody else can take the host. While the released claim is in its grace
//!   period it still owns the host.
//!
//! Nothing here does I/O: [`next`] is the leader's step, [`owner`] the translator's rule,
//! [`parse`] and [`render`] the ConfigMap's encoding. The writing loop is
//! [`crate::status::run`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use serde::{Deserialize, Serialize};

/// One namespace's claim on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Claim {
    /// The claiming namespace.
    pub namespace: String,
    /// When the leader first saw the namespace name the host (RFC 3339, seconds).
    #[serde(with = "rfc3339")]
    pub since: SystemTime,
    /// Since when the namespace names the host in none of its Ingresses (released once
    /// the grace period has passed).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rfc3339_option"
    )]
    pub unnamed_since: Option<SystemTime>,
}

/// Every recorded claim, by host; each host's claims in the order they were recorded (the
/// first is the owner).
pub type Ledger = BTreeMap<String, Vec<Claim>>;

/// The namespaces naming each host in our Ingresses now, each once, oldest Ingress first
/// (then namespace/name): the order new claims are recorded in.
pub type Named = BTreeMap<String, Vec<String>>;

/// A ConfigMap holds at most 1 MiB; the leader records no new claim past this many bytes
/// of data, counted as if every claim were marked unnamed (about 7,000 hosts with one
/// claim each), so the ledger itself can always be written, whatever namespaces stop
/// naming. Hosts it cannot record keep waiting (and are counted).
pub const MAX_LEDGER_BYTES: usize = 900 * 1024;

/// The ConfigMap key of a host: the host, with a wildcard's `*` written `_` (keys allow
/// only `[-._a-zA-Z0-9]`; `_` never appears in a valid host).
pub fn key_of(host: &str) -> String {
    match host.strip_prefix('*') {
        Some(rest) => format!("_{rest}"),
        None => host.to_owned(),
    }
}

/// The host a ConfigMap key names (see [`key_of`]).
pub fn host_of(key: &str) -> String {
    match key.strip_prefix('_') {
        Some(rest) => format!("*{rest}"),
        None => key.to_owned(),
    }
}

/// Why part of a ledger was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host claims key {key:?} is not a list of claims: {reason}")]
pub struct InvalidClaims {
    /// The ConfigMap key.
    pub key: String,
    /// What the decoder said.
    pub reason: String,
}

/// Reads the ledger from its ConfigMap. A key that does not decode is left out and
/// reported; the leader writes it again from what the Ingresses name.
pub fn parse(cm: Option<&ConfigMap>) -> (Ledger, Vec<InvalidClaims>) {
    let mut ledger = Ledger::new();
    let mut errors = Vec::new();
    for (key, value) in cm.and_then(|c| c.data.as_ref()).into_iter().flatten() {
        match serde_json::from_str::<Vec<Claim>>(value) {
            Ok(claims) if !claims.is_empty() => {
                ledger.insert(host_of(key), claims);
            }
            Ok(_) => {}
            Err(e) => errors.push(InvalidClaims {
                key: key.clone(),
                reason: e.to_string(),
            }),
        }
    }
    (ledger, errors)
}

/// The ConfigMap data that records `ledger`.
pub fn render(ledger: &Ledger) -> BTreeMap<String, String> {
    ledger
        .iter()
        .map(|(host, claims)| {
            // A Vec of plain structs always serialises.
            let json = serde_json::to_string(claims).unwrap_or_default();
            (key_of(host), json)
        })
        .collect()
}

/// The size of `data` as the API server counts it (keys and values).
pub fn data_bytes(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Truncated to whole seconds, as recorded.
fn seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// The leader's step: the ledger after `now`, given what the Ingresses name.
///
/// - A namespace that names a host keeps its claim (its place and date unchanged), or
///   gets one appended after the recorded ones, dated `now` (several new ones in the order
///   of `named`), unless it holds `max_per_namespace` claims already.
/// - A claim whose namespace names the host no longer is marked unnamed from `now` (or
///   keeps its earlier mark), and is released once `grace` has passed since the mark.
/// - A namespace that names the host again before that keeps its original date.
///
/// New claims stop being added (existing ones still change) when the rendered ledger
/// would exceed `max_bytes`; the second value counts the claims left waiting (for either
/// limit).
pub fn next(
    current: &Ledger,
    named: &Named,
    now: SystemTime,
    grace: Duration,
    limits: Limits,
) -> (Ledger, usize) {
    let now = seconds(now);
    let mut out = Ledger::new();
    let hosts: BTreeSet<&String> = current.keys().chain(named.keys()).collect();
    let mut wanting: Vec<(&String, &String)> = Vec::new();
    for host in hosts {
        let namers = named.get(host);
        let names = |ns: &str| namers.is_some_and(|n| n.iter().any(|x| x == ns));
        let mut claims: Vec<Claim> = Vec::new();
        for c in current.get(host).into_iter().flatten() {
            if names(&c.namespace) {
                claims.push(Claim {
                    unnamed_since: None,
                    ..c.clone()
                });
                continue;
            }
            let mark = c.unnamed_since.map_or(now, seconds);
            if now.duration_since(mark).unwrap_or_default() < grace {
                claims.push(Claim {
                    unnamed_since: Some(mark),
                    ..c.clone()
                });
            }
        }
        for ns in namers.into_iter().flatten() {
            if !claims.iter().any(|c| c.namespace == *ns) {
                wanting.push((host, ns));
            }
        }
        if !claims.is_empty() {
            out.insert(host.clone(), claims);
        }
    }
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    for claims in out.values() {
        for c in claims {
            *held.entry(c.namespace.clone()).or_default() += 1;
        }
    }
    // Sizes are counted as if every claim were marked unnamed: marks are added without a
    // check (a namespace stops naming its hosts), so they must already fit, or a ledger
    // near the cap could outgrow a ConfigMap and never be written again.
    let marked = |c: &Claim| Claim {
        unnamed_since: Some(c.unnamed_since.unwrap_or(now)),
        ..c.clone()
    };
    let all_marked: Ledger = out
        .iter()
        .map(|(host, claims)| (host.clone(), claims.iter().map(marked).collect()))
        .collect();
    let mut size = data_bytes(&render(&all_marked));
    let mut waiting = 0;
    for (host, ns) in wanting {
        let count = held.entry(ns.clone()).or_default();
        if *count >= limits.max_per_namespace {
            waiting += 1;
            continue;
        }
        let claim = Claim {
            namespace: ns.clone(),
            since: now,
            unnamed_since: None,
        };
        // What adding it costs: its JSON, a separator, and the key if the host is new.
        let cost = serde_json::to_string(&marked(&claim)).map_or(0, |j| j.len() + 1)
            + if out.contains_key(host) {
                0
            } else {
                key_of(host).len() + 1
            };
        if size + cost > limits.max_bytes {
            waiting += 1;
            continue;
        }
        size += cost;
        *count += 1;
        out.entry(host.clone()).or_default().push(claim);
    }
    (out, waiting)
}

/// How large the ledger may grow.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of ConfigMap data ([`MAX_LEDGER_BYTES`]).
    pub max_bytes: usize,
    /// Claims one namespace may hold (`--max-host-claims-per-namespace`).
    pub max_per_namespace: usize,
}

/// The owner of a host: the namespace of its first recorded claim (`claims`, in ledger
/// order); without one, the first of `namers` (given oldest Ingress first, the order the
/// leader records new claims in). None when nobody claims or names the host.
pub fn owner<'a>(
    claims: &'a [Claim],
    namers: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    match claims.first() {
        Some(c) => Some(c.namespace.as_str()),
        None => namers.into_iter().next(),
    }
}

mod rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_seconds(*t))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

mod rfc3339_option {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        t: &Option<SystemTime>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::rfc3339::serialize(t, s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    /// What the Ingresses name, each host's namers oldest Ingress first (as given).
    fn named(pairs: &[(&str, &str)]) -> Named {
        let mut n = Named::new();
        for (host, ns) in pairs {
            n.entry((*host).to_owned())
                .or_default()
                .push((*ns).to_owned());
        }
        n
    }

    const GRACE: Duration = Duration::from_secs(600);

    const LIMITS: Limits = Limits {
        max_bytes: MAX_LEDGER_BYTES,
        max_per_namespace: 1000,
    };

    fn step(ledger: &Ledger, n: &Named, secs: u64) -> Ledger {
        next(ledger, n, at(secs), GRACE, LIMITS).0
    }

    fn owner_of<'a>(ledger: &'a Ledger, n: &'a Named, host: &str) -> Option<&'a str> {
        owner(
            ledger.get(host).map_or(&[][..], Vec::as_slice),
            n.get(host).into_iter().flatten().map(String::as_str),
        )
    }

    /// The takeover the ledger exists for: namespace `attacker` has an Ingress older than
    /// the victim's and edits it to name the victim's host. Its claim dates from the edit,
    /// so the victim keeps the host.
    #[test]
    fn a_later_namer_never_takes_a_recorded_host_whatever_its_ingress_age() {
        let n = named(&[("shop.test", "victim")]);
        let ledger = step(&Ledger::new(), &n, 0);
        assert_eq!(owner_of(&ledger, &n, "shop.test"), Some("victim"));
        // "attacker" sorts before "victim": only the recorded date can keep the host.
        let n = named(&[("shop.test", "victim"), ("shop.test", "attacker")]);
        assert_eq!(
            owner_of(&ledger, &n, "shop.test"),
            Some("victim"),
            "an unrecorded namer ranks after the recorded owner"
        );
        let ledger = step(&ledger, &n, 60);
        assert_eq!(owner_of(&ledger, &n, "shop.test"), Some("victim"));
        let claims = &ledger["shop.test"];
        assert_eq!(claims[0].namespace, "victim");
        assert_eq!(claims[0].since, at(0));
        assert_eq!(claims[1].namespace, "attacker");
        assert_eq!(claims[1].since, at(60));
    }

    #[test]
    fn a_claim_is_released_only_after_the_grace_period_without_naming() {
        let n = named(&[("shop.test", "a")]);
        let ledger = step(&Ledger::new(), &n, 0);
        // a stops naming the host (a redeploy), b names it.
        let n2 = named(&[("shop.test", "b")]);
        let ledger = step(&ledger, &n2, 100);
        assert_eq!(ledger["shop.test"][0].unnamed_since, Some(at(100)));
        assert_eq!(owner_of(&ledger, &n2, "shop.test"), Some("a"), "in grace");
        let ledger = step(&ledger, &n2, 100 + 599);
        assert_eq!(owner_of(&ledger, &n2, "shop.test"), Some("a"), "in grace");
        let released = step(&ledger, &n2, 100 + 600);
        assert_eq!(owner_of(&released, &n2, "shop.test"), Some("b"));
        assert_eq!(released["shop.test"].len(), 1);
        // Named again within the grace period: the original date stays.
        let back = step(&ledger, &n, 650);
        assert_eq!(back["shop.test"][0].namespace, "a");
        assert_eq!(back["shop.test"][0].since, at(0));
        assert_eq!(back["shop.test"][0].unnamed_since, None);
    }

    #[test]
    fn a_host_nobody_names_leaves_the_ledger_after_the_grace_period() {
        let n = named(&[("shop.test", "a")]);
        let ledger = step(&Ledger::new(), &n, 0);
        let ledger = step(&ledger, &Named::new(), 10);
        assert!(ledger.contains_key("shop.test"));
        let ledger = step(&ledger, &Named::new(), 10 + 600);
        assert!(ledger.is_empty());
    }

    /// Namespaces that name a host nobody has claimed, in one step, are recorded in the
    /// order given (oldest Ingress first), whatever their names; the translator orders
    /// unrecorded namers the same way.
    #[test]
    fn unrecorded_namers_are_ordered_by_their_oldest_ingress_as_the_leader_records_them() {
        let n = named(&[("new.test", "zeta"), ("new.test", "alpha")]);
        assert_eq!(owner_of(&Ledger::new(), &n, "new.test"), Some("zeta"));
        let ledger = step(&Ledger::new(), &n, 5);
        assert_eq!(owner_of(&ledger, &n, "new.test"), Some("zeta"));
        assert_eq!(ledger["new.test"][1].namespace, "alpha");
        assert_eq!(owner_of(&ledger, &Named::new(), "other.test"), None);
    }

    /// A leader whose clock runs behind records a later claim with an earlier date: the
    /// recorded order still decides, never the dates.
    #[test]
    fn the_order_claims_were_recorded_in_decides_not_their_dates() {
        let ledger = step(&Ledger::new(), &named(&[("shop.test", "victim")]), 1000);
        let n = named(&[("shop.test", "aaa"), ("shop.test", "victim")]);
        // A new leader, its clock 900 s behind.
        let ledger = step(&ledger, &n, 100);
        assert_eq!(ledger["shop.test"][1].namespace, "aaa");
        assert!(ledger["shop.test"][1].since < ledger["shop.test"][0].since);
        assert_eq!(owner_of(&ledger, &n, "shop.test"), Some("victim"));
        // And it survives the ConfigMap.
        let cm = ConfigMap {
            data: Some(render(&ledger)),
            ..Default::default()
        };
        assert_eq!(parse(Some(&cm)).0, ledger);
    }

    /// One tenant cannot fill the ledger for everyone: past its quota its new claims wait
    /// (counted), and other namespaces' claims are still recorded.
    #[test]
    fn a_namespace_holds_at_most_its_quota_of_claims() {
        let limits = Limits {
            max_per_namespace: 2,
            ..LIMITS
        };
        let n = named(&[
            ("a.test", "greedy"),
            ("b.test", "greedy"),
            ("c.test", "greedy"),
            ("d.test", "other"),
        ]);
        let (ledger, waiting) = next(&Ledger::new(), &n, at(0), GRACE, limits);
        assert_eq!(waiting, 1);
        let greedy = ledger
            .values()
            .flatten()
            .filter(|c| c.namespace == "greedy")
            .count();
        assert_eq!(greedy, 2);
        assert!(ledger.contains_key("d.test"));
    }

    #[test]
    fn the_ledger_round_trips_through_its_configmap_with_wildcard_keys() {
        let n = named(&[("*.shop.test", "a"), ("shop.test", "b"), ("shop.test", "a")]);
        let ledger = step(&Ledger::new(), &n, 0);
        let ledger = step(&ledger, &named(&[("*.shop.test", "a")]), 30);
        let data = render(&ledger);
        assert!(data.contains_key("_.shop.test"), "{data:?}");
        assert_eq!(
            data["_.shop.test"],
            r#"[{"namespace":"a","since":"2027-01-15T08:00:00Z"}]"#
        );
        let cm = ConfigMap {
            data: Some(data),
            ..Default::default()
        };
        let (back, errors) = parse(Some(&cm));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(back, ledger);
        assert_eq!(
            back["shop.test"][1].unnamed_since,
            Some(at(30)),
            "b stopped naming it"
        );
    }

    #[test]
    fn an_undecodable_key_is_reported_and_the_rest_is_read() {
        let cm = ConfigMap {
            data: Some(
                [
                    ("a.test".to_owned(), "not json".to_owned()),
                    (
                        "b.test".to_owned(),
                        r#"[{"namespace":"b","since":"2027-01-15T08:00:00Z"}]"#.to_owned(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let (ledger, errors) = parse(Some(&cm));
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].key, "a.test");
        assert_eq!(ledger.len(), 1);
        assert_eq!(ledger["b.test"][0].since, at(0));
    }

    #[test]
    fn new_claims_wait_when_the_ledger_is_full_and_existing_ones_keep_changing() {
        let n = named(&[("a.test", "a")]);
        let ledger = step(&Ledger::new(), &n, 0);
        let full = Limits {
            max_bytes: data_bytes(&render(&ledger)),
            ..LIMITS
        };
        let more = named(&[("a.test", "a"), ("b.test", "b")]);
        let (out, waiting) = next(&ledger, &more, at(1), GRACE, full);
        assert_eq!(waiting, 1);
        assert_eq!(out, ledger);
        let (out, waiting) = next(&ledger, &more, at(1), GRACE, LIMITS);
        assert_eq!(waiting, 0);
        assert_eq!(out.len(), 2);
        assert!(data_bytes(&render(&out)) <= MAX_LEDGER_BYTES);
    }

    /// A ledger filled to its cap still fits when every namespace stops naming its hosts
    /// at once (each claim gains an `unnamedSince`), so it can be written and its claims
    /// released after the grace period.
    #[test]
    fn a_full_ledger_still_fits_when_every_claim_is_marked_unnamed() {
        let hosts: Vec<(String, String)> = (0..400)
            .map(|i| {
                (
                    format!("host-{i:04}.{}.test", "x".repeat(40)),
                    format!("ns-{i}"),
                )
            })
            .collect();
        let pairs: Vec<(&str, &str)> = hosts
            .iter()
            .map(|(h, n)| (h.as_str(), n.as_str()))
            .collect();
        let limits = Limits {
            max_bytes: 40 * 1024,
            ..LIMITS
        };
        let (ledger, waiting) = next(&Ledger::new(), &named(&pairs), at(0), GRACE, limits);
        assert!(waiting > 0, "the cap was reached");
        assert!(data_bytes(&render(&ledger)) <= limits.max_bytes);
        let (marked, _) = next(&ledger, &Named::new(), at(1), GRACE, limits);
        assert_eq!(
            marked.len(),
            ledger.len(),
            "nothing released before the grace"
        );
        assert!(marked.values().flatten().all(|c| c.unnamed_since.is_some()));
        assert!(
            data_bytes(&render(&marked)) <= limits.max_bytes,
            "{} bytes once marked, over {}",
            data_bytes(&render(&marked)),
            limits.max_bytes
        );
        let released = next(&marked, &Named::new(), at(1) + GRACE, GRACE, limits).0;
        assert!(released.is_empty(), "released after the grace");
    }
}
