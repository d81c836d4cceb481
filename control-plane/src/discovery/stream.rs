//! One route stream's state as a value: what the proxy serves, what it refused, the
//! response awaiting its answer, and the base of its next delta.
//!
//! [`Subscription::next`] says what to do with the published snapshot, and
//! [`Subscription::answer`] takes the proxy's answer to a response. Both are plain
//! functions of the state, tested without sockets; [`super::service`] is the I/O around
//! them (the gRPC stream, metrics, logs and `ListProxies`). At most one response awaits
//! an answer at a time, so a slow proxy holds no backlog and is sent the newest snapshot
//! once it answers.

use std::sync::Arc;

use bytes::Bytes;
use holdfast_proto::delta::Inventory;
use holdfast_proto::v1::DiscoveryRequest;
use tokio::time::Instant;

use super::REOFFER_EVERY;
use crate::state::Published;

/// A stream's state.
pub struct Subscription {
    /// The proxy's `--max-snapshot-bytes` (0: no limit stated).
    max_snapshot_bytes: u64,
    /// The proxy applies deltas.
    accepts_deltas: bool,
    /// The content the proxy serves.
    serving_hash: String,
    /// Content the proxy refused for good (invalid to it, too large): never offered again.
    refused_hash: String,
    /// What the proxy refused last as not newer: content hash and progress. The same
    /// content seen further is offered again: a proxy that waited on this replica's
    /// progress may take it.
    rejected: (String, u64),
    /// When the proxy last refused a snapshot as not newer: a re-offer of that content
    /// comes at most once per [`REOFFER_EVERY`].
    refused_at: Option<Instant>,
    /// The response awaiting the proxy's answer.
    unanswered: Option<Unanswered>,
    /// The base of the next delta, when the proxy accepts deltas.
    base: Option<Base>,
    /// The nonce last answered ("" before any): a request repeating it tells a change of
    /// the proxy's persist or listener state.
    answered: String,
    /// The last nonce sent.
    nonce: u64,
}

/// The response a stream awaits an answer to.
#[derive(Clone)]
struct Unanswered {
    nonce: String,
    /// The snapshot it carries (whole or as a delta).
    published: Arc<Published>,
    /// It was a delta.
    delta: bool,
}

/// What a proxy holds, as the base of its next delta.
enum Base {
    /// The version and resources it stated when it connected.
    Stated {
        version: String,
        inventory: Inventory,
    },
    /// A snapshot this control plane sent it and it ACKed: deltas from it are shared
    /// across streams, and computed from the change list when it is the build before.
    Acked(Arc<Published>),
}

impl Base {
    fn version(&self) -> &str {
        match self {
            Base::Stated { version, .. } => version,
            Base::Acked(p) => &p.version,
        }
    }
}

/// What to do with the published snapshot.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing: the proxy serves it or refused it, or a response awaits its answer.
    Idle,
    /// Nothing until this instant: then it is offered again (content the proxy refused
    /// as not newer, now at newer progress).
    WaitUntil(Instant),
    /// Not sent: it is over the proxy's `--max-snapshot-bytes`. Record this as the
    /// proxy's NACK; it waits for the next snapshot.
    TooLarge {
        /// The snapshot's version.
        version: String,
        /// The NACK's text.
        error: String,
    },
    /// Send it, with this nonce: as this encoded delta, or whole when `None`.
    Send {
        /// The response's nonce.
        nonce: String,
        /// The encoded delta from what the proxy holds.
        delta: Option<Bytes>,
    },
}

/// What a request from the proxy was.
#[derive(Debug, PartialEq, Eq)]
pub enum Answered {
    /// A repeat of the last answer: the proxy's persist or listener state changed.
    Repeat,
    /// A request while no response awaits an answer, that repeats no answer: ignored.
    Unsolicited,
    /// An answer to a response other than the one awaited: ignored.
    StaleNonce,
    /// The proxy serves the response's snapshot.
    Acked {
        /// Its version.
        version: String,
    },
    /// The proxy refused the response's snapshot.
    Nacked {
        /// Its version.
        version: String,
        /// Why, as the proxy said.
        message: String,
        /// What the refusal means for the stream.
        refusal: Refusal,
    },
}

/// What a NACK means for the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Valid, but the proxy serves something at least as new for some kind: its snapshot
    /// stays the base, and this content is offered again once this replica has seen
    /// further.
    NotNewer,
    /// The proxy could not build the delta from its base: the whole snapshot goes next.
    Delta,
    /// The proxy refused the whole snapshot: that content is never offered again.
    Snapshot,
}

impl Subscription {
    /// The stream of a proxy whose first request is `first`: it serves
    /// `first.content_hash` (version `first.version_info`) and, when it accepts deltas,
    /// holds the resources of `stated` (its decoded inventory).
    pub fn new(first: &DiscoveryRequest, stated: Option<Inventory>) -> Self {
        let base = stated
            .filter(|inventory| {
                first.accepts_deltas && !first.version_info.is_empty() && !inventory.is_empty()
            })
            .map(|inventory| Base::Stated {
                version: first.version_info.clone(),
                inventory,
            });
        Subscription {
            max_snapshot_bytes: first.max_snapshot_bytes,
            accepts_deltas: first.accepts_deltas,
            serving_hash: first.content_hash.clone(),
            refused_hash: String::new(),
            rejected: (String::new(), 0),
            refused_at: None,
            unanswered: None,
            base,
            answered: String::new(),
            nonce: 0,
        }
    }

    /// What to do with `current`, the published snapshot, at `now`. A [`Step::Send`]
    /// makes it the response awaiting an answer.
    pub fn next(&mut self, current: &Arc<Published>, now: Instant) -> Step {
        if self.unanswered.is_some() {
            return Step::Idle;
        }
        let hash = &current.content_hash;
        // The proxy holds what is published: its stated inventory (megabytes at scale)
        // gives way to the published snapshot as the base of its next delta.
        if *hash == self.serving_hash && matches!(self.base, Some(Base::Stated { .. })) {
            self.base = Some(Base::Acked(current.clone()));
        }
        if *hash == self.serving_hash || *hash == self.refused_hash {
            return Step::Idle;
        }
        let size = current.encoded_len as u64;
        if self.max_snapshot_bytes > 0 && size > self.max_snapshot_bytes {
            self.refused_hash = hash.clone();
            return Step::TooLarge {
                version: current.version.clone(),
                error: format!(
                    "not sent: snapshot {} is {size} bytes, over the proxy's --max-snapshot-bytes ({})",
                    current.version, self.max_snapshot_bytes
                ),
            };
        }
        if (hash.clone(), current.progress_sum()) == self.rejected {
            return Step::Idle;
        }
        if let Some(at) = self
            .refused_at
            .filter(|_| *hash == self.rejected.0)
            .map(|t| t + REOFFER_EVERY)
            .filter(|t| *t > now)
        {
            return Step::WaitUntil(at);
        }
        self.nonce += 1;
        let nonce = self.nonce.to_string();
        let delta = self.delta_to(current);
        self.unanswered = Some(Unanswered {
            nonce: nonce.clone(),
            published: current.clone(),
            delta: delta.is_some(),
        });
        Step::Send { nonce, delta }
    }

    /// The encoded delta to `current` from what the proxy holds, if it holds something
    /// else and the delta is smaller than the whole snapshot. From a snapshot it ACKed,
    /// the delta is shared across streams (and O(change) when that is the build before);
    /// from a stated inventory it is this stream's own, O(snapshot) once.
    fn delta_to(&self, current: &Published) -> Option<Bytes> {
        match self
            .base
            .as_ref()
            .filter(|b| b.version() != current.version)?
        {
            Base::Acked(held) => current.delta_from_published(held),
            Base::Stated { version, inventory } => current.delta_from_inventory(version, inventory),
        }
    }

    /// Takes a request from the proxy at `now`: an answer to the response awaited (ACK
    /// or NACK), a repeat of the last answer, or something to ignore.
    pub fn answer(&mut self, request: &DiscoveryRequest, now: Instant) -> Answered {
        let Some(sent) = self.unanswered.as_ref() else {
            return if request.response_nonce == self.answered {
                Answered::Repeat
            } else {
                Answered::Unsolicited
            };
        };
        if request.response_nonce != sent.nonce {
            return Answered::StaleNonce;
        }
        let Some(sent) = self.unanswered.take() else {
            return Answered::Unsolicited;
        };
        self.answered = sent.nonce;
        let version = sent.published.version.clone();
        let hash = sent.published.content_hash.clone();
        let Some(error) = &request.error_detail else {
            self.serving_hash = hash;
            if self.accepts_deltas {
                self.base = Some(Base::Acked(sent.published));
            }
            return Answered::Acked { version };
        };
        let refusal = if error.not_newer {
            self.rejected = (hash, sent.published.progress_sum());
            self.refused_at = Some(now);
            Refusal::NotNewer
        } else if sent.delta {
            self.base = None;
            Refusal::Delta
        } else {
            self.refused_hash = hash;
            Refusal::Snapshot
        };
        Answered::Nacked {
            version,
            message: error.message.clone(),
            refusal,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use holdfast_proto::testing::SnapshotBuilder;
    use holdfast_proto::v1::{ErrorDetail, KindProgress};

    use super::*;

    /// A sealed, validated build: `hosts` hosts `h<i>.test` routing `/` to one backend,
    /// at `revision`, with the Ingress kind's progress at `revision`. Twenty hosts make a
    /// delta of one host smaller than the whole snapshot.
    fn build(hosts: usize, revision: u64) -> Arc<Published> {
        let mut snapshot = SnapshotBuilder::new().backend("svc", &[("10.0.0.1", 8080)]);
        for h in 0..hosts {
            snapshot = snapshot.route(&format!("h{h}.test"), "/", "svc");
        }
        let p = Published::new(snapshot.sealed(revision)).with_progress(vec![KindProgress {
            kind: "Ingress".into(),
            resource_version: revision,
        }]);
        p.validate().expect("a valid build");
        Arc::new(p)
    }

    fn first(serving: Option<&Published>, max_snapshot_bytes: u64) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: serving.map(|p| p.version.clone()).unwrap_or_default(),
            content_hash: serving.map(|p| p.content_hash.clone()).unwrap_or_default(),
            max_snapshot_bytes,
            accepts_deltas: true,
            ..Default::default()
        }
    }

    fn ack(nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn nack(nonce: &str, not_newer: bool) -> DiscoveryRequest {
        DiscoveryRequest {
            response_nonce: nonce.into(),
            error_detail: Some(ErrorDetail {
                message: "refused".into(),
                not_newer,
            }),
            ..Default::default()
        }
    }

    fn sent(step: Step) -> (String, bool) {
        match step {
            Step::Send { nonce, delta } => (nonce, delta.is_some()),
            other => panic!("expected a send, got {other:?}"),
        }
    }

    #[test]
    fn a_new_proxy_is_sent_the_whole_snapshot_and_nothing_more_until_it_answers() {
        let now = Instant::now();
        let a = build(20, 10);
        let mut s = Subscription::new(&first(None, 0), None);
        assert_eq!(sent(s.next(&a, now)), ("1".into(), false));
        assert_eq!(
            s.next(&a, now),
            Step::Idle,
            "one response awaits its answer"
        );
        let b = build(21, 11);
        assert_eq!(
            s.next(&b, now),
            Step::Idle,
            "a newer snapshot waits for the answer"
        );
        assert_eq!(
            s.answer(&ack("1"), now),
            Answered::Acked {
                version: a.version.clone()
            }
        );
        assert_eq!(s.next(&a, now), Step::Idle, "it serves what is published");
        // The newest snapshot next, as a delta from the one it ACKed.
        assert_eq!(sent(s.next(&b, now)), ("2".into(), true));
    }

    #[test]
    fn a_proxy_that_serves_the_published_content_is_sent_nothing() {
        let now = Instant::now();
        let a = build(20, 10);
        let mut s = Subscription::new(&first(Some(&a), 0), Some(a.inventory().as_ref().clone()));
        assert_eq!(s.next(&a, now), Step::Idle);
        let b = build(21, 11);
        assert!(sent(s.next(&b, now)).1, "a delta from what it stated");
    }

    #[test]
    fn a_stated_inventory_is_the_base_of_the_first_delta_and_no_inventory_means_whole() {
        let now = Instant::now();
        let a = build(20, 10);
        let b = build(21, 11);
        let mut stated =
            Subscription::new(&first(Some(&a), 0), Some(a.inventory().as_ref().clone()));
        assert_eq!(sent(stated.next(&b, now)), ("1".into(), true));
        let mut without = Subscription::new(&first(Some(&a), 0), None);
        assert_eq!(sent(without.next(&b, now)), ("1".into(), false));
        let mut refusing_deltas = first(Some(&a), 0);
        refusing_deltas.accepts_deltas = false;
        let mut whole = Subscription::new(&refusing_deltas, Some(a.inventory().as_ref().clone()));
        assert_eq!(sent(whole.next(&b, now)), ("1".into(), false));
    }

    #[test]
    fn a_refused_delta_is_followed_by_the_whole_snapshot() {
        let now = Instant::now();
        let (a, b) = (build(20, 10), build(21, 11));
        let mut s = Subscription::new(&first(Some(&a), 0), Some(a.inventory().as_ref().clone()));
        assert_eq!(sent(s.next(&b, now)), ("1".into(), true));
        assert_eq!(
            s.answer(&nack("1", false), now),
            Answered::Nacked {
                version: b.version.clone(),
                message: "refused".into(),
                refusal: Refusal::Delta
            }
        );
        assert_eq!(sent(s.next(&b, now)), ("2".into(), false));
    }

    #[test]
    fn a_refused_snapshot_is_never_offered_again_but_the_next_one_is() {
        let now = Instant::now();
        let (a, b) = (build(20, 10), build(21, 11));
        let mut s = Subscription::new(&first(None, 0), None);
        sent(s.next(&a, now));
        assert!(matches!(
            s.answer(&nack("1", false), now),
            Answered::Nacked {
                refusal: Refusal::Snapshot,
                ..
            }
        ));
        assert_eq!(s.next(&a, now), Step::Idle);
        assert_eq!(sent(s.next(&b, now)), ("2".into(), false));
    }

    #[test]
    fn content_refused_as_not_newer_is_offered_again_only_at_newer_progress_and_not_at_once() {
        let now = Instant::now();
        let a = build(20, 10);
        let mut s = Subscription::new(&first(None, 0), None);
        sent(s.next(&a, now));
        assert!(matches!(
            s.answer(&nack("1", true), now),
            Answered::Nacked {
                refusal: Refusal::NotNewer,
                ..
            }
        ));
        assert_eq!(
            s.next(&a, now),
            Step::Idle,
            "the same content at the same progress"
        );
        // The same content, seen further by this replica.
        let further = Arc::new(a.restamped(vec![KindProgress {
            kind: "Ingress".into(),
            resource_version: 12,
        }]));
        assert_eq!(s.next(&further, now), Step::WaitUntil(now + REOFFER_EVERY));
        let later = now + REOFFER_EVERY + Duration::from_millis(1);
        assert_eq!(sent(s.next(&further, later)).0, "2");
    }

    #[test]
    fn a_snapshot_over_the_proxys_limit_is_refused_for_it_once_and_not_sent() {
        let now = Instant::now();
        let a = build(20, 10);
        let mut s = Subscription::new(&first(None, 10), None);
        match s.next(&a, now) {
            Step::TooLarge { version, error } => {
                assert_eq!(version, a.version);
                assert!(
                    error.contains("over the proxy's --max-snapshot-bytes (10)"),
                    "{error}"
                );
            }
            other => panic!("expected too large, got {other:?}"),
        }
        assert_eq!(s.next(&a, now), Step::Idle);
        let mut roomy = Subscription::new(&first(None, a.encoded_len as u64), None);
        assert_eq!(
            sent(roomy.next(&a, now)).0,
            "1",
            "exactly at the limit is sent"
        );
    }

    #[test]
    fn requests_that_answer_nothing_awaited_are_told_apart() {
        let now = Instant::now();
        let a = build(20, 10);
        let mut s = Subscription::new(&first(None, 0), None);
        assert_eq!(
            s.answer(&ack(""), now),
            Answered::Repeat,
            "before any response"
        );
        assert_eq!(s.answer(&ack("7"), now), Answered::Unsolicited);
        sent(s.next(&a, now));
        assert_eq!(s.answer(&ack("0"), now), Answered::StaleNonce);
        assert_eq!(
            s.next(&a, now),
            Step::Idle,
            "still awaiting the answer to 1"
        );
        assert!(matches!(s.answer(&ack("1"), now), Answered::Acked { .. }));
        assert_eq!(
            s.answer(&ack("1"), now),
            Answered::Repeat,
            "the answer repeated"
        );
        assert_eq!(s.answer(&ack("2"), now), Answered::Unsolicited);
    }
}
