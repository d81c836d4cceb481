//! What routing reads of a request ([`RequestView`]) and what it decides ([`Decision`]):
//! the boundary between the HTTP mechanics and the proxy's routes. The engines read a
//! request into a view, the proxy decides from the view alone (no I/O, no response
//! built), and the engine acts on the decision. Generic over the proxy's route `R` and
//! the reason `E` it answers an error with.

use std::time::Duration;

use http::uri::PathAndQuery;

use crate::headers::{HeaderChanges, HeaderLookup};

/// A request as routing reads it.
pub struct RequestView<'r> {
    /// The method, as sent.
    pub method: &'r str,
    /// The target's authority (absolute form, `:authority`), else Host; None when there
    /// is neither or it is not UTF-8.
    pub host: Option<&'r str>,
    /// The path as sent (empty: `/`).
    pub path: &'r str,
    /// The query, without its `?`.
    pub query: Option<&'r str>,
    /// The headers (Gateway header matches, the loop header).
    pub headers: &'r (dyn HeaderLookup + Sync),
    /// The connection's peer address (None: not known; a source range then refuses).
    pub peer: Option<std::net::IpAddr>,
    /// The request has no body: its framing says none or a length of 0 (HTTP/2: its
    /// stream ended with its headers). Only such a request is copied to a mirror.
    pub bodyless: bool,
    /// The request's id (`X-Request-Id`), which its mirrors' copies carry too.
    pub request_id: &'r str,
}

impl RequestView<'_> {
    /// The path, `/` when none was sent.
    pub fn path_or_root(&self) -> &str {
        if self.path.is_empty() { "/" } else { self.path }
    }
}

/// What to do with a request.
pub enum Decision<'t, 'r, R, E> {
    /// Forward it on a route.
    Forward(Routed<'t, 'r, R>),
    /// Answer it here with the reason's status; `detail` is for the debug log (and the
    /// client only with `--verbose-errors`); `route` is the route matched, if any.
    Refuse {
        /// Why.
        reason: E,
        /// What went wrong, for the log.
        detail: String,
        /// The route matched, if any (its metrics count the answer).
        route: Option<&'t R>,
    },
    /// Redirect it.
    Redirect {
        /// 301, 302, 303, 307 or 308.
        status: u16,
        /// The Location.
        location: String,
    },
    /// Answer it here, without a body (a CORS preflight).
    Answer {
        /// The status.
        status: u16,
        /// The answer's headers (`set`, then `add`).
        headers: Box<HeaderChanges>,
    },
}

/// The response header changes of one forwarded request.
#[derive(Debug, Default)]
pub enum ResponseChanges<'t> {
    /// None.
    #[default]
    None,
    /// A Gateway rule's.
    Rule(&'t HeaderChanges),
    /// Made for this request: a rule's, then a CORS filter's.
    Made(Box<HeaderChanges>),
}

impl ResponseChanges<'_> {
    /// The changes, if any.
    pub fn get(&self) -> Option<&HeaderChanges> {
        match self {
            ResponseChanges::None => None,
            ResponseChanges::Rule(c) => Some(c),
            ResponseChanges::Made(c) => Some(c),
        }
    }
}

/// Where a routed request goes.
pub struct Routed<'t, 'r, R> {
    /// The route it matched.
    pub route: &'t R,
    /// The host as the client gave it (the target's authority, or Host): what the
    /// backend gets as Host.
    pub raw_host: &'r str,
    /// The normalised path and query, when normalising changed the path.
    pub forward_path: Option<PathAndQuery>,
    /// A Gateway rule's request header changes.
    pub header_changes: Option<&'t HeaderChanges>,
    /// A Gateway rule's rewritten host: what the backend gets as Host instead of
    /// `raw_host` (the forwarding headers still name `raw_host`).
    pub upstream_host: Option<&'t str>,
    /// A Gateway rule's response header changes.
    pub response_changes: ResponseChanges<'t>,
    /// A Gateway rule's timeouts (None: the proxy's own).
    pub timeouts: Option<&'t Timeouts>,
    /// A Gateway rule's retry policy.
    pub retry: Option<&'t crate::forward::Retry>,
    /// An Ingress's own request body limit in bytes (ingress-nginx `proxy-body-size`),
    /// under the proxy's (see [`body_limit`]).
    pub max_body: Option<std::num::NonZeroU64>,
    /// What the request holds while it is in progress (a place under an Ingress's
    /// `limit-connections`): the engine keeps it until the request ends.
    pub hold: Option<Hold>,
    /// Where the endpoint choice starts (an index into the backend's endpoints; a sticky
    /// session's), instead of the backend's round robin.
    pub start: Option<usize>,
}

/// Something a request holds while it is in progress, given back when dropped.
pub type Hold = Box<dyn std::any::Any + Send + Sync>;

/// The request body limit in bytes for a proxy limit of `proxy` (0: none) and a route's
/// own `route`: the lower of the two (0: none).
pub fn body_limit(proxy: u64, route: Option<std::num::NonZeroU64>) -> u64 {
    match (proxy, route.map(std::num::NonZeroU64::get)) {
        (p, None) => p,
        (0, Some(r)) => r,
        (p, Some(r)) => p.min(r),
    }
}

/// A Gateway rule's timeouts (`HTTPRouteRule.timeouts`); the default is the proxy's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, from its head read to the response head, over every attempt
    /// (then 504); None: no such limit.
    pub request: Option<Duration>,
    /// Each attempt's wait for the response head after the request went whole, instead
    /// of the proxy's response timeout (then 504); `Duration::MAX`: no limit.
    pub backend: Option<Duration>,
    /// Each connect to an endpoint, instead of the proxy's connect timeout (an Ingress's
    /// `proxy-connect-timeout`).
    pub connect: Option<Duration>,
    /// Each write of the request upstream, instead of the proxy's (an Ingress's
    /// `proxy-send-timeout`).
    pub send: Option<Duration>,
}
