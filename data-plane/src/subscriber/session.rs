//! One stream to a control plane, as the proxy keeps it, as a value: the requests it
//! sends (the first, an answer to each response, and the last one again when its persist
//! or listener state changes) and whether to leave a control plane that offers nothing
//! newer. [`super::stream_once`] is the I/O around it: it applies each response and
//! sends what the session makes.

use std::time::Instant;

use holdfast_proto::v1::{DiscoveryRequest, ErrorDetail, Node, ResourceHash};

use super::leave_for_another;

/// What the proxy states in every request: what it serves, and its own state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stated {
    /// The served snapshot's version ("" when none is served).
    pub version: String,
    /// The served snapshot's content hash ("" when none is served).
    pub content_hash: String,
    /// Why the served snapshot is not in the state file ("" when it is).
    pub persist_error: String,
    /// The Gateway listeners of the served snapshot that could not be bound.
    pub unbound_listeners: Vec<String>,
}

/// A stream's requests, and how long its control plane has offered nothing newer.
#[derive(Debug)]
pub struct Session {
    node: Node,
    max_snapshot_bytes: u64,
    /// The last request sent (the first, then each answer), repeated when the proxy's
    /// state changes so that `ListProxies` is current.
    last: DiscoveryRequest,
    /// Since when every offer on this stream was refused as not newer.
    waiting_since: Option<Instant>,
    /// The last such refusal.
    last_refusal: Option<Instant>,
}

impl Session {
    /// A session and its first request: the proxy names itself, states what it serves
    /// and its `--max-snapshot-bytes` (so the control plane sends nothing larger), takes
    /// deltas, and lists the resources it holds (`inventory`, the base of the first delta).
    pub fn open(
        node: Node,
        max_snapshot_bytes: u64,
        stated: Stated,
        inventory: Vec<ResourceHash>,
    ) -> (Session, DiscoveryRequest) {
        let mut session = Session {
            node,
            max_snapshot_bytes,
            last: DiscoveryRequest::default(),
            waiting_since: None,
            last_refusal: None,
        };
        let mut first = session.request(String::new(), None, stated);
        session.last = first.clone();
        first.inventory = inventory;
        (session, first)
    }

    /// The answer to the response with `nonce`, sent at `now`: an ACK, or a NACK with
    /// the refusal's text and whether the snapshot was refused only as not newer.
    pub fn answer(
        &mut self,
        nonce: String,
        refused: Option<(String, bool)>,
        stated: Stated,
        now: Instant,
    ) -> DiscoveryRequest {
        match &refused {
            Some((_, true)) => {
                self.waiting_since.get_or_insert(now);
                self.last_refusal = Some(now);
            }
            _ => self.waiting_since = None,
        }
        let error_detail = refused.map(|(message, not_newer)| ErrorDetail { message, not_newer });
        let request = self.request(nonce, error_detail, stated);
        self.last = request.clone();
        request
    }

    /// The last request again, with the proxy's persist error (and its unbound
    /// listeners, when they changed) as they now stand.
    pub fn repeat(
        &mut self,
        persist_error: String,
        unbound: Option<Vec<String>>,
    ) -> DiscoveryRequest {
        self.last.persist_error = persist_error;
        if let Some(unbound) = unbound {
            self.last.unbound_listeners = unbound;
        }
        self.last.clone()
    }

    /// Whether to leave this control plane for another (when one is configured): it has
    /// offered nothing newer than what is served for over [`super::WAIT_LIMIT`], and is
    /// still offering.
    pub fn leave(&self, now: Instant) -> bool {
        leave_for_another(self.waiting_since, self.last_refusal, now)
    }

    fn request(
        &self,
        response_nonce: String,
        error_detail: Option<ErrorDetail>,
        stated: Stated,
    ) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(self.node.clone()),
            version_info: stated.version,
            content_hash: stated.content_hash,
            response_nonce,
            error_detail,
            persist_error: stated.persist_error,
            unbound_listeners: stated.unbound_listeners,
            // Read from the first request only.
            max_snapshot_bytes: self.max_snapshot_bytes,
            accepts_deltas: true,
            inventory: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::WAIT_LIMIT;
    use super::*;

    fn node() -> Node {
        Node {
            id: "proxy-1".into(),
            zone: "z".into(),
        }
    }

    fn serving(version: &str) -> Stated {
        Stated {
            version: version.into(),
            content_hash: format!("hash-{version}"),
            persist_error: String::new(),
            unbound_listeners: vec![],
        }
    }

    #[test]
    fn the_first_request_states_what_is_served_the_limit_and_the_inventory() {
        let inventory = vec![ResourceHash::default(); 3];
        let (mut session, first) = Session::open(node(), 1 << 20, serving("v1"), inventory);
        assert_eq!(first.node, Some(node()));
        assert_eq!(
            (first.version_info.as_str(), first.content_hash.as_str()),
            ("v1", "hash-v1")
        );
        assert_eq!(first.max_snapshot_bytes, 1 << 20);
        assert!(first.accepts_deltas);
        assert_eq!(first.inventory.len(), 3);
        assert_eq!(first.response_nonce, "");
        // A repeat of it carries the new state, never the inventory again.
        let again = session.repeat("disk full".into(), None);
        assert_eq!(again.persist_error, "disk full");
        assert!(again.inventory.is_empty());
        assert_eq!(again.version_info, "v1");
    }

    #[test]
    fn answers_are_acks_or_nacks_with_the_nonce_and_the_state_then() {
        let (mut session, _) = Session::open(node(), 0, Stated::default(), vec![]);
        let now = Instant::now();
        let ack = session.answer("1".into(), None, serving("v2"), now);
        assert_eq!(ack.response_nonce, "1");
        assert_eq!(ack.error_detail, None);
        assert_eq!(ack.version_info, "v2");
        let nack = session.answer("2".into(), Some(("bad".into(), false)), serving("v2"), now);
        assert_eq!(
            nack.error_detail,
            Some(ErrorDetail {
                message: "bad".into(),
                not_newer: false
            })
        );
        // The last answer is what a change of state repeats.
        let unbound = vec!["0.0.0.0:8080".to_owned()];
        let again = session.repeat(String::new(), Some(unbound.clone()));
        assert_eq!(again.response_nonce, "2");
        assert_eq!(again.unbound_listeners, unbound);
        assert_eq!(again.error_detail, nack.error_detail);
    }

    #[test]
    fn a_control_plane_that_offers_nothing_newer_is_left_and_one_that_offers_newer_is_kept() {
        let (mut session, _) = Session::open(node(), 0, Stated::default(), vec![]);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let not_newer = || Some(("not newer".to_owned(), true));
        session.answer("1".into(), not_newer(), serving("v1"), at(0));
        assert!(!session.leave(at(10)));
        session.answer(
            "2".into(),
            not_newer(),
            serving("v1"),
            at(WAIT_LIMIT.as_secs()),
        );
        assert!(session.leave(at(WAIT_LIMIT.as_secs() + 1)));
        // An applied snapshot (or any other answer) starts the wait again.
        session.answer(
            "3".into(),
            None,
            serving("v2"),
            at(WAIT_LIMIT.as_secs() + 1),
        );
        session.answer(
            "4".into(),
            not_newer(),
            serving("v2"),
            at(WAIT_LIMIT.as_secs() + 2),
        );
        assert!(!session.leave(at(WAIT_LIMIT.as_secs() + 3)));
    }
}
