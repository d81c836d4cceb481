//! Forwarding a routed request: where each attempt goes ([`Target`]) and why forwarding
//! failed ([`Failure`]), the same for both HTTP/1.1 engines.

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::Authority;

use crate::upstream::{ConnectError, Key, Number};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where one attempt to forward a request goes.
pub enum Target<'b> {
    /// To this endpoint or name, with its connection slot (None: no cap).
    Go(
        Key,
        Number,
        &'b Authority,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ),
    /// The endpoint picked stayed busy past the connect timeout.
    Busy(SocketAddr),
    /// No endpoint (left) to try.
    None,
}

/// Why forwarding a routed request failed, with its cause: the proxy maps each to the
/// reason (and so the status) it answers with, and the error with its sources is the
/// detail for the log and `--verbose-errors`.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The backend has no endpoint to try: 502.
    #[error("upstream connect failed: no endpoint")]
    NoEndpoint,
    /// Could not connect to any endpoint tried (the last one's error): 502.
    #[error("upstream connect failed: {authority}")]
    Connect {
        /// The endpoint or name.
        authority: String,
        /// Why.
        #[source]
        source: ConnectError,
    },
    /// The upstream broke the protocol or the connection mid-way: 502.
    #[error("upstream failed: {authority}")]
    Upstream {
        /// The endpoint or name.
        authority: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// No response head within the response timeout: 504.
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// Every connection slot of the endpoint stayed busy past the connect timeout: 503.
    #[error("endpoint {0} busy: --max-upstream-connections-per-endpoint in use")]
    Busy(SocketAddr),
    /// The request body declared a length over `--max-request-body`: 413, at once.
    #[error("request body of {0} bytes is over --max-request-body")]
    DeclaredTooLarge(u64),
    /// The request body grew past `--max-request-body` while it was sent: 413.
    #[error("request body over --max-request-body")]
    BodyTooLarge,
    /// No request body bytes for `--body-read-timeout`: 408.
    #[error("request body stalled")]
    BodyStalled,
    /// The request body broke its coding (chunked): 400.
    #[error("bad request: {0}")]
    BadBody(String),
}

/// A Gateway rule's retry policy: a response with one of `codes` is tried again, at most
/// `attempts` times, `backoff` apart. Only a request without a body and with an idempotent
/// method is retried ([`Retry::may_retry`]), and only while the proxy's [`RetryBudget`]
/// has a token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retry {
    /// Response statuses tried again.
    pub codes: Vec<u16>,
    /// Retries after the first attempt.
    pub attempts: u32,
    /// The wait before each retry.
    pub backoff: Duration,
}

/// The methods RFC 9110 §9.2.2 calls idempotent.
const IDEMPOTENT: [&[u8]; 6] = [b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"];

impl Retry {
    /// Whether a request with `method` and a body (`has_body`), answered `status` after
    /// `retried` retries, may be sent again (the budget aside).
    pub fn may_retry(&self, method: &[u8], has_body: bool, status: u16, retried: u32) -> bool {
        Self::safe(method, has_body) && self.wants(status, retried)
    }

    /// Whether a request may be sent twice at all: no body, an idempotent method.
    pub fn safe(method: &[u8], has_body: bool) -> bool {
        !has_body && IDEMPOTENT.contains(&method)
    }

    /// Whether a response `status` after `retried` retries asks for another.
    pub fn wants(&self, status: u16, retried: u32) -> bool {
        retried < self.attempts && self.codes.contains(&status)
    }
}

/// The proxy's retry budget, shared by every route: each request on a route with a retry
/// policy deposits `ratio` of a token, each retry takes a whole one, and at most
/// [`RetryBudget::CAP`] tokens are kept. However many requests fail, retries add at most
/// `ratio` to the load the backends see (plus the cap, once), so retries cannot multiply
/// an outage.
#[derive(Debug)]
pub struct RetryBudget {
    /// Thousandths of a token deposited per request.
    per_request: u64,
    /// Thousandths of a token held.
    held: std::sync::atomic::AtomicU64,
}

impl RetryBudget {
    /// Tokens held at most (and at the start).
    pub const CAP: u64 = 10;

    /// A full budget that gains `ratio` (0 to 1) of a token per request.
    pub fn new(ratio: f64) -> Self {
        RetryBudget {
            per_request: (ratio.clamp(0.0, 1.0) * 1000.0).round() as u64,
            held: std::sync::atomic::AtomicU64::new(Self::CAP * 1000),
        }
    }

    /// A request on a route with a retry policy: deposits its share.
    pub fn deposit(&self) {
        use std::sync::atomic::Ordering;
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some((h + self.per_request).min(Self::CAP * 1000))
            });
    }

    /// Takes a token for one retry; false when none is left.
    pub fn take(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                h.checked_sub(1000)
            })
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_idempotent_bodyless_request_answered_with_a_listed_code_is_retried() {
        let r = Retry {
            codes: vec![500, 503],
            attempts: 2,
            backoff: Duration::ZERO,
        };
        assert!(r.may_retry(b"GET", false, 500, 0));
        assert!(r.may_retry(b"PUT", false, 503, 1));
        assert!(!r.may_retry(b"GET", false, 500, 2), "attempts spent");
        assert!(!r.may_retry(b"GET", false, 502, 0), "not a listed code");
        assert!(!r.may_retry(b"POST", false, 500, 0), "not idempotent");
        assert!(!r.may_retry(b"PATCH", false, 500, 0), "not idempotent");
        assert!(!r.may_retry(b"PUT", true, 500, 0), "its body was sent");
    }

    #[test]
    fn the_budget_starts_full_and_then_allows_its_ratio_of_requests() {
        let budget = RetryBudget::new(0.2);
        let mut retries = 0;
        for _ in 0..100 {
            budget.deposit();
            if budget.take() {
                retries += 1;
            }
        }
        // The cap's 10, then one in five of the 100 requests: a failing backend sees at
        // most 1.2 times the load, plus the cap once.
        assert!(retries <= 10 + 100 / 5, "{retries}");
        assert!(retries > 100 / 5, "the budget refills: {retries}");
        // Without deposits, the cap alone.
        let drained = RetryBudget::new(0.2);
        assert_eq!((0..20).filter(|_| drained.take()).count(), 10);
        let none = RetryBudget::new(0.0);
        for _ in 0..RetryBudget::CAP {
            assert!(none.take());
        }
        none.deposit();
        assert!(!none.take(), "a zero ratio never refills");
    }
}
