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
