//! When an Ingress's change is served everywhere: the leader's `Programmed` Event and the
//! `holdfast_object_programmed_seconds` histogram, in plain functions.
//!
//! Writing the rollout to every Ingress's status on every publish would be a write per
//! Ingress per change anywhere. Instead the leader notes when it first sees each new
//! generation of one of our Ingresses, and once every proxy connected to it serves a
//! version that reflects that generation (the rule of [`crate::rollout::reflects`]: the
//! version's build read the Ingress cache at least as far as the object's
//! resourceVersion), it records one `Programmed` Event and observes how long it took.
//! Each generation is reported once; a generation superseded before it was served
//! everywhere is never reported (its successor is). What existed when the tracker
//! started (a new leader) is its baseline: earlier generations were the previous
//! leader's to report.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use holdfast_proto::v1::KindProgress;

use crate::rollout::reflects;

/// The kind tracked.
pub const KIND: &str = "Ingress";

/// One Ingress as the cache holds it: namespace, name, generation, resourceVersion.
pub type Seen<'a> = (&'a str, &'a str, i64, &'a str);

/// A generation served by every connected proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programmed {
    /// The Ingress's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The generation served.
    pub generation: i64,
    /// The number of proxies serving it.
    pub proxies: usize,
    /// From when the tracker first saw the generation until it saw every proxy serve it.
    pub took: Duration,
}

#[derive(Debug, Clone)]
struct Pending {
    generation: i64,
    resource_version: String,
    since: Instant,
}

/// The generations seen and those not yet served everywhere.
#[derive(Debug, Default)]
pub struct Tracker {
    started: bool,
    /// The last generation seen of each Ingress.
    known: HashMap<(String, String), i64>,
    /// Generations seen since the baseline and not yet served everywhere.
    pending: HashMap<(String, String), Pending>,
}

impl Tracker {
    /// Notes `ours` (every Ingress of ours in the cache, complete): a generation not seen
    /// before becomes pending from `now`, except on the first call (the baseline). An
    /// Ingress no longer there is forgotten.
    pub fn observe<'a>(&mut self, ours: impl IntoIterator<Item = Seen<'a>>, now: Instant) {
        let mut present: HashMap<(String, String), i64> = HashMap::with_capacity(self.known.len());
        for (namespace, name, generation, resource_version) in ours {
            let key = (namespace.to_owned(), name.to_owned());
            let new = self.known.get(&key) != Some(&generation);
            if new && self.started {
                self.pending.insert(
                    key.clone(),
                    Pending {
                        generation,
                        resource_version: resource_version.to_owned(),
                        since: now,
                    },
                );
            }
            present.insert(key, generation);
        }
        self.pending.retain(|k, _| present.contains_key(k));
        self.known = present;
        self.started = true;
    }

    /// The pending generations every proxy serves: `proxies` holds the progress of the
    /// version each connected proxy serves (None: a version this replica does not know,
    /// or none yet). They stop being pending. None while no proxy is connected.
    pub fn programmed(
        &mut self,
        proxies: &[Option<Vec<KindProgress>>],
        now: Instant,
    ) -> Vec<Programmed> {
        if proxies.is_empty() || self.pending.is_empty() {
            return Vec::new();
        }
        let mut done = Vec::new();
        self.pending.retain(|(namespace, name), p| {
            let everywhere = proxies.iter().all(|progress| {
                progress
                    .as_deref()
                    .is_some_and(|progress| reflects(progress, KIND, &p.resource_version))
            });
            if everywhere {
                done.push(Programmed {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    generation: p.generation,
                    proxies: proxies.len(),
                    took: now.saturating_duration_since(p.since),
                });
            }
            !everywhere
        });
        done.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        done
    }

    /// How many Ingresses are tracked.
    pub fn tracked(&self) -> usize {
        self.known.len()
    }

    /// How many generations wait to be served everywhere.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// The Event's message.
pub fn message(p: &Programmed) -> String {
    format!(
        "generation {} is served by all {} connected proxies ({:.1}s after the control plane saw it)",
        p.generation,
        p.proxies,
        p.took.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rv: u64) -> Option<Vec<KindProgress>> {
        Some(vec![KindProgress {
            kind: KIND.into(),
            resource_version: rv,
        }])
    }

    #[test]
    fn a_new_generation_is_programmed_once_every_proxy_serves_it_and_only_once() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.observe([("shop", "web", 1, "100")], t0);
        assert_eq!(t.pending(), 0, "the baseline is not reported");
        t.observe([("shop", "web", 2, "120")], t0 + Duration::from_secs(1));
        assert_eq!(t.pending(), 1);
        // One proxy serves it, the other an older version, a third an unknown one.
        let later = t0 + Duration::from_secs(3);
        assert!(t.programmed(&[at(120), at(119)], later).is_empty());
        assert!(t.programmed(&[at(120), None], later).is_empty());
        assert!(
            t.programmed(&[], later).is_empty(),
            "no proxy: not programmed"
        );
        let done = t.programmed(&[at(125), at(120)], later);
        assert_eq!(
            done,
            vec![Programmed {
                namespace: "shop".into(),
                name: "web".into(),
                generation: 2,
                proxies: 2,
                took: Duration::from_secs(2),
            }]
        );
        assert_eq!(
            message(&done[0]),
            "generation 2 is served by all 2 connected proxies (2.0s after the control plane saw it)"
        );
        assert!(t.programmed(&[at(125), at(125)], later).is_empty(), "once");
        // Our own status write bumps the resourceVersion, not the generation.
        t.observe([("shop", "web", 2, "130")], later);
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn new_objects_count_superseded_generations_do_not_and_deleted_ones_are_forgotten() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.observe([("a", "one", 1, "10")], t0);
        t.observe([("a", "one", 2, "20"), ("a", "two", 1, "21")], t0);
        t.observe([("a", "one", 3, "30"), ("a", "two", 1, "21")], t0);
        let done = t.programmed(&[at(25)], t0);
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].name.as_str(), done[0].generation), ("two", 1));
        assert_eq!(t.pending(), 1, "one's generation 3 still waits");
        t.observe([], t0);
        assert_eq!(t.pending(), 0);
        assert!(t.programmed(&[at(99)], t0).is_empty());
    }
}
