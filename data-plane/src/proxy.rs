//! Forwarding one request: check, route, pick an endpoint, forward over a keep-alive
//! upstream connection that the request's own task drives (`upstream`), stream bodies,
//! and answer each failure with the status of its [`Reason`].
//!
//! # Layout
//! - here: [`Forwarder`] (`route` checks and routes, `forward` makes the attempts,
//!   `relay` hands the upstream's response back), the request-body slot the attempts
//!   share, [`Reason`] and the typed `Failure` that maps to it;
//! - `balance`: endpoint choice round-robin and ejection after connect failures;
//! - `upgrade`: which upgrades may pass, and the tunnels they become.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use holdfast_http::forward::{Failure, Retry, Target};
use holdfast_http::headers::{
    BadRequest, Hop, REQUEST_ID, RequestId, add_forwarded, check_framing, set_request_id,
    strip_hop_by_hop,
};
use holdfast_lock::Lock;
use holdfast_process::error_chain;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

use crate::metrics::Metrics;
use crate::table::{Route, RouteTable};
use crate::upstream::{Key, Pool, Upstream};

mod balance;
pub mod native;
mod routing;
mod upgrade;

use balance::Balancer;
pub use balance::is_local_error;
use holdfast_http::tunnel::Tunnels;
pub use routing::{Decision, RequestView, Routed};

/// What the proxy answers: an upstream body streamed through, or a short local body.
pub type ProxyBody = Either<UpstreamBody, Full<Bytes>>;

/// A client connection's place under `--max-connections`, carried in request extensions
/// so that an upgraded tunnel keeps it until the tunnel ends.
#[derive(Clone)]
pub struct ConnectionSlot(pub Arc<holdfast_http::inflight::InFlight>);

/// An upstream response body. Reading it drives its upstream connection, which goes back
/// to the idle pool once the body has ended; it holds its endpoint's connection slot until
/// then.
pub struct UpstreamBody {
    inner: Incoming,
    /// The connection the body arrives on, with the pool it returns to (None: an upgrade's
    /// connection, run by a task of its own).
    up: Option<Returning>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A connection in use, and the pool it goes back to.
type Returning = (Box<Upstream<ReclaimBody>>, Arc<Pool<ReclaimBody>>);

impl UpstreamBody {
    /// The body has ended: its connection can serve another request.
    fn release(&mut self) {
        if let Some((up, pool)) = self.up.take() {
            pool.put(up);
        }
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // Not read to its end (the client left): the connection closes with it.
        // (A body read to its end in `poll_frame` has already given its connection back.)
        if self.inner.is_end_stream() {
            self.release();
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = match &mut this.up {
            Some((up, _)) => up.poll_body(cx, &mut this.inner),
            None => Pin::new(&mut this.inner).poll_frame(cx),
        };
        match &frame {
            Poll::Ready(None) => this.release(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.release(),
            Poll::Ready(Some(Err(_))) => this.up = None,
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Timeouts and limits of forwarding.
#[derive(Debug, Clone)]
pub struct ForwardSettings {
    /// Connecting to an upstream endpoint.
    pub connect_timeout: Duration,
    /// From sending the request to the upstream's response head.
    pub response_timeout: Duration,
    /// How long a failing endpoint is skipped.
    pub eject_for: Duration,
    /// Idle upstream connections kept per endpoint, by each worker.
    pub pool_idle_per_host: usize,
    /// Worker threads forwarding requests (each keeps its own idle connections).
    pub workers: usize,
    /// What to do with `%2F` and `%5C` in request paths.
    pub escaped_slashes: holdfast_http::path::EscapedSlashes,
    /// Error pages say why (backend, endpoint, error chain); otherwise only the status.
    pub verbose_errors: bool,
    /// Largest request body forwarded, in bytes (0: no limit); larger gets 413.
    pub max_request_body: u64,
    /// Longest wait for the next bytes of a request body; then 408.
    pub body_read_timeout: Duration,
    /// An upgraded tunnel (WebSocket) with no bytes either way for this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// Most requests in flight to one endpoint (each holds an upstream connection until
    /// its response ends); more wait up to the connect timeout, then get 503. 0: no cap.
    pub max_connections_per_endpoint: usize,
    /// Upgrade protocols forwarded (lower case; never h2c).
    pub allow_upgrade: Vec<String>,
    /// Peers whose forwarding headers are kept (balancers in front of the proxies).
    pub trust_forwarded_from: Vec<ipnet::IpNet>,
    /// Forward paths with a dot segment carrying parameters (`/..;/`, `/.;x/`), which
    /// Java servlet containers read as `..` and `.` (`--allow-dot-segment-params`).
    pub allow_dot_segment_params: bool,
    /// A Gateway rule's retries, as a share of its requests (`--retry-budget`).
    pub retry_budget: f64,
    /// Each copy of a request for a mirror: its connect, write and the answer's status
    /// line (`--mirror-timeout`).
    pub mirror_timeout: Duration,
    /// Most copies for mirrors in flight; more are dropped (`--max-mirrors-in-flight`).
    pub max_mirrors_in_flight: usize,
    /// This proxy's token in the loop-detection header [`LOOP_HEADER`]: random, made at
    /// start.
    pub loop_token: HeaderValue,
}

/// The header each proxy adds its [`ForwardSettings::loop_token`] to when forwarding: a
/// request that arrives with this proxy's own token has passed it already (an endpoint
/// that is this proxy, or a chain of proxies back to it) and gets 508. It is removed
/// from responses.
pub const LOOP_HEADER: &str = "x-holdfast-loop";

/// A random loop token (16 hex digits) from the std hasher's random keys.
pub fn new_loop_token() -> HeaderValue {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    HeaderValue::from_str(&format!("{:016x}", h.finish())).expect("hex digits are a header value")
}

/// How the connection a request came on was made: plain HTTP, or HTTPS with the server
/// name the client sent (SNI, lower case), which chose the certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// Plain HTTP.
    Http,
    /// HTTPS.
    Https {
        /// The SNI, if the client sent one.
        sni: Option<Arc<str>>,
        /// The TLS version (`TLSv1.3`), for the access log.
        version: &'static str,
    },
    /// A Gateway listener: routed by that listener's routes alone.
    Gateway {
        /// The listener's name (`<address>:<port>`).
        listener: Arc<str>,
        /// Over TLS, with the SNI if the client sent one.
        tls: Option<Option<Arc<str>>>,
        /// Over TLS, its version.
        version: &'static str,
    },
}

impl Via {
    /// Came over TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Via::Https { .. } | Via::Gateway { tls: Some(_), .. })
    }

    /// Over TLS, its version and the SNI, for the access log.
    pub fn tls(&self) -> Option<(&'static str, Option<&str>)> {
        match self {
            Via::Http | Via::Gateway { tls: None, .. } => None,
            Via::Https { sni, version } => Some((version, sni.as_deref())),
            Via::Gateway {
                tls: Some(sni),
                version,
                ..
            } => Some((version, sni.as_deref())),
        }
    }
}

/// How a TLS version is logged.
pub fn tls_version_name(version: Option<rustls::ProtocolVersion>) -> &'static str {
    match version {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "TLS",
    }
}

/// A passthrough connection's upstream: the connection, holding its endpoint's slot.
pub struct PassthroughUpstream {
    /// The connection to the endpoint.
    pub stream: holdfast_http::upstream::Stream,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// The forwarding service, shared by all connections.
pub struct Forwarder {
    table: Arc<ArcSwapOption<RouteTable>>,
    /// Idle upstream connections (`--upstream-pool-idle` per endpoint).
    pool: Arc<Pool<ReclaimBody>>,
    /// The shared HTTP/2 connections to h2c backends.
    h2c: crate::h2c::H2c<ReclaimBody>,
    settings: ForwardSettings,
    metrics: Metrics,
    /// Endpoint choice, and the endpoints ejected after failing to connect.
    balancer: Balancer,
    /// Connection slots per endpoint (`max_connections_per_endpoint`).
    slots: Mutex<std::collections::HashMap<SocketAddr, Arc<tokio::sync::Semaphore>>>,
    /// Upgraded tunnels.
    tunnels: Tunnels,
    /// What the native engine reads of the settings.
    engine: holdfast_http::h1::engine::Settings,
    /// Shutting down: HTTP/1.1 responses carry `Connection: close`, so keep-alive clients
    /// move to new connections (which balancers send elsewhere) before the listener closes.
    draining: std::sync::atomic::AtomicBool,
    /// What Gateway rules' retries may add (`--retry-budget`).
    retry_budget: holdfast_http::forward::RetryBudget,
    /// The sender of copies for mirrors.
    mirrors: crate::mirror::Mirrors,
    /// The access log, when it is on.
    access_log: Option<crate::access_log::AccessLog>,
    /// Where spans go, when the proxy traces.
    tracer: Option<holdfast_process::otlp::Exporter>,
}

/// The attempts a request hyper serves made upstream, counted as they are made.
#[derive(Clone, Default)]
struct Attempts(Arc<std::sync::atomic::AtomicU32>);

/// Where a response hyper relays came from, for the access log.
#[derive(Clone)]
struct Upstreamed {
    to: String,
    took: Duration,
}

/// What the access log needs of a request hyper serves, kept before it is forwarded.
struct Words {
    time: std::time::SystemTime,
    method: Method,
    uri: Uri,
    host: String,
    protocol: &'static str,
    received: u64,
    headers: HeaderMap,
}

impl Words {
    fn of(req: &Request<Incoming>) -> Words {
        let host = match req.uri().authority() {
            Some(a) => a.as_str(),
            None => req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default(),
        };
        let mut headers = HeaderMap::new();
        for name in [
            header::REFERER,
            header::USER_AGENT,
            http::HeaderName::from_static("traceparent"),
        ] {
            if let Some(v) = req.headers().get(&name) {
                headers.insert(name, v.clone());
            }
        }
        // Every X-Forwarded-For line, as one list (a balancer may add a line of its own).
        let xff = http::HeaderName::from_static("x-forwarded-for");
        let joined = req
            .headers()
            .get_all(&xff)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(", ");
        if let Ok(v) = HeaderValue::from_str(&joined)
            && !joined.is_empty()
        {
            headers.insert(xff, v);
        }
        Words {
            time: std::time::SystemTime::now(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            host: host.to_owned(),
            protocol: match req.version() {
                Version::HTTP_2 => "HTTP/2.0",
                Version::HTTP_10 => "HTTP/1.0",
                _ => "HTTP/1.1",
            },
            // The body's declared length (it is streamed, not counted).
            received: req.body().size_hint().exact().unwrap_or(0),
            headers,
        }
    }

    fn header(&self, name: http::HeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The span of a request (OpenTelemetry's HTTP server span conventions), a child of the
/// client's span when it sent one.
fn span(
    line: &Logged<'_>,
    trace: &holdfast_http::trace::TraceContext,
    route: Option<&str>,
) -> holdfast_process::otlp::Span {
    use holdfast_process::otlp::{Kind, Span, Value};
    let method = line
        .method
        .get(..line.method.floor_char_boundary(64))
        .unwrap_or_default();
    let name = match line.route {
        Some(r) if !r.path.is_empty() => format!("{method} {}", r.path),
        _ => method.to_owned(),
    };
    // What a client wrote is kept short: a span waits in a bounded queue.
    let short = |s: &str| {
        s.get(..s.floor_char_boundary(1024))
            .unwrap_or_default()
            .to_owned()
    };
    let mut attributes = vec![
        ("http.request.method", Value::Str(short(line.method))),
        ("url.path", Value::Str(short(line.path))),
        ("server.address", Value::Str(short(line.host))),
        ("client.address", Value::Str(line.peer.to_string())),
        (
            "network.protocol.version",
            Value::Str(
                match line.protocol {
                    "HTTP/2.0" => "2",
                    "HTTP/1.0" => "1.0",
                    _ => "1.1",
                }
                .into(),
            ),
        ),
        ("http.response.status_code", Value::Int(line.status.into())),
        ("holdfast.attempts", Value::Int(line.attempts.into())),
        ("holdfast.request_id", Value::Str(line.request_id.into())),
    ];
    if let Some(r) = line.route {
        attributes.push(("http.route", Value::Str(r.path.to_string())));
    }
    if let Some(route) = route {
        attributes.push(("holdfast.route", Value::Str(route.into())));
    }
    if let Some(upstream) = line.upstream {
        attributes.push(("holdfast.upstream.address", Value::Str(upstream.into())));
    }
    if let Some(reason) = line.reason {
        attributes.push(("holdfast.reason", Value::Str(reason.as_str().into())));
    }
    Span {
        trace_id: trace.trace_id,
        span_id: trace.span_id,
        parent: trace.parent,
        name,
        kind: Kind::Server,
        start: line.time,
        end: line.time + line.took,
        attributes,
        error: line.status >= 500,
    }
}

/// A request as either engine saw it, for its access log line ([`Forwarder::log`]).
pub(crate) struct Logged<'a> {
    pub time: std::time::SystemTime,
    pub peer: std::net::IpAddr,
    pub via: &'a Via,
    pub method: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub protocol: &'static str,
    pub status: u16,
    pub received: u64,
    pub sent: u64,
    pub took: Duration,
    pub upstream_took: Option<Duration>,
    pub upstream: Option<&'a str>,
    pub route: Option<&'a Route>,
    pub reason: Option<Reason>,
    pub request_id: &'a str,
    pub trace: Option<holdfast_http::trace::TraceContext>,
    pub attempts: u32,
    pub referer: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub forwarded_for: Option<&'a str>,
    pub traceparent: Option<&'a str>,
}

/// Why the proxy answered a request itself with an error, and the status that carries:
/// the one mapping from a failure to its status code, and the `reason` label of
/// `holdfast_proxy_error_responses_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// 400: a malformed or ambiguous request (framing, Host, path).
    BadRequest,
    /// 404: no virtual host or path matches.
    NoRoute,
    /// 408: the request body stalled past --body-read-timeout.
    BodyStalled,
    /// 413: the request body is over --max-request-body.
    BodyTooLarge,
    /// 502: no endpoint could be connected to.
    UpstreamConnectFailed,
    /// 502: the upstream failed mid-exchange (reset, bad response).
    UpstreamFailed,
    /// 503: no snapshot applied yet.
    NoSnapshot,
    /// 503: the route's backend has no usable endpoint (or its Service is missing).
    BackendUnavailable,
    /// 503: every connection slot of the endpoint stayed busy.
    EndpointBusy,
    /// 504: no response head within --upstream-response-timeout.
    UpstreamTimeout,
    /// 421: the Host names a host served with another certificate than the one the
    /// connection was made with.
    Misdirected,
    /// 508: the request has passed this proxy already (a forwarding loop).
    LoopDetected,
    /// 503: an HTTP/2 stream found no slot left under --max-connections (the listener's
    /// connection memory is taken).
    Overloaded,
    /// 500: a Gateway API rule's chosen backend reference does not resolve (or the rule
    /// has no backend).
    InvalidBackend,
    /// 403: the client address is refused by the route's source ranges (an Ingress's
    /// `whitelist-source-range` or `denylist-source-range`).
    Forbidden,
    /// 503: the client address is over the route's request rate (an Ingress's
    /// `limit-rps`).
    RateLimited,
    /// 502: an HTTP/1.1 request to an h2c backend, which the native HTTP/1.1 engine does
    /// not send (HTTP/2 clients, and `--h1-engine=hyper`, reach such backends).
    UpstreamProtocol,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 17] = [
        Reason::BadRequest,
        Reason::NoRoute,
        Reason::BodyStalled,
        Reason::BodyTooLarge,
        Reason::UpstreamConnectFailed,
        Reason::UpstreamFailed,
        Reason::NoSnapshot,
        Reason::BackendUnavailable,
        Reason::EndpointBusy,
        Reason::UpstreamTimeout,
        Reason::Misdirected,
        Reason::LoopDetected,
        Reason::Overloaded,
        Reason::InvalidBackend,
        Reason::Forbidden,
        Reason::RateLimited,
        Reason::UpstreamProtocol,
    ];

    /// The status code answered.
    pub fn status(self) -> StatusCode {
        match self {
            Reason::BadRequest => StatusCode::BAD_REQUEST,
            Reason::NoRoute => StatusCode::NOT_FOUND,
            Reason::BodyStalled => StatusCode::REQUEST_TIMEOUT,
            Reason::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Reason::UpstreamConnectFailed | Reason::UpstreamFailed | Reason::UpstreamProtocol => {
                StatusCode::BAD_GATEWAY
            }
            Reason::NoSnapshot
            | Reason::BackendUnavailable
            | Reason::EndpointBusy
            | Reason::Overloaded
            | Reason::RateLimited => StatusCode::SERVICE_UNAVAILABLE,
            Reason::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Reason::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            Reason::LoopDetected => StatusCode::LOOP_DETECTED,
            Reason::InvalidBackend => StatusCode::INTERNAL_SERVER_ERROR,
            Reason::Forbidden => StatusCode::FORBIDDEN,
        }
    }

    /// The status code as the metric label.
    fn status_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "400",
            Reason::NoRoute => "404",
            Reason::BodyStalled => "408",
            Reason::BodyTooLarge => "413",
            Reason::UpstreamConnectFailed | Reason::UpstreamFailed | Reason::UpstreamProtocol => {
                "502"
            }
            Reason::NoSnapshot
            | Reason::BackendUnavailable
            | Reason::EndpointBusy
            | Reason::Overloaded
            | Reason::RateLimited => "503",
            Reason::UpstreamTimeout => "504",
            Reason::Misdirected => "421",
            Reason::LoopDetected => "508",
            Reason::InvalidBackend => "500",
            Reason::Forbidden => "403",
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "bad_request",
            Reason::NoRoute => "no_route",
            Reason::BodyStalled => "body_stalled",
            Reason::BodyTooLarge => "body_too_large",
            Reason::UpstreamConnectFailed => "upstream_connect_failed",
            Reason::UpstreamFailed => "upstream_failed",
            Reason::NoSnapshot => "no_snapshot",
            Reason::BackendUnavailable => "backend_unavailable",
            Reason::EndpointBusy => "endpoint_busy",
            Reason::UpstreamTimeout => "upstream_timeout",
            Reason::Misdirected => "misdirected",
            Reason::LoopDetected => "loop_detected",
            Reason::Overloaded => "overloaded",
            Reason::InvalidBackend => "invalid_backend",
            Reason::Forbidden => "forbidden",
            Reason::RateLimited => "rate_limited",
            Reason::UpstreamProtocol => "upstream_protocol",
        }
    }
}

/// A local answer: status and a short plain body saying why.
fn local(status: StatusCode, message: impl Into<String>) -> Response<ProxyBody> {
    let mut body = message.into();
    body.push('\n');
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header("x-holdfast-reason", status.canonical_reason().unwrap_or(""))
        .body(Either::Right(Full::new(Bytes::from(body))))
        .expect("static response parts are valid")
}

/// The body of an error page a client sees: the status and its reason phrase only.
fn generic(status: StatusCode) -> String {
    format!(
        "{} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error")
    )
}

/// A routed request as the hyper engine forwards it: the host is copied out of the
/// request head, whose parts are rewritten for the upstream.
pub struct Forwarding<'t> {
    /// The route it matched.
    pub route: &'t Route,
    /// The host as the client gave it: the backend's Host.
    pub raw_host: HeaderValue,
    /// The normalised path and query, when normalising changed the path.
    pub forward_path: Option<PathAndQuery>,
    /// A Gateway rule's request header changes.
    pub header_changes: Option<&'t crate::gateway::HeaderChanges>,
    /// A Gateway rule's rewritten host: the backend's Host instead of `raw_host`.
    pub upstream_host: Option<HeaderValue>,
    /// A Gateway rule's response header changes.
    pub response_changes: holdfast_http::routing::ResponseChanges<'t>,
    /// A Gateway rule's timeouts.
    pub timeouts: crate::gateway::Timeouts,
    /// A Gateway rule's retry policy.
    pub retry: Option<&'t Retry>,
    /// An Ingress's own request body limit (under `--max-request-body`).
    pub max_body: Option<std::num::NonZeroU64>,
    /// What the request holds while in progress (a place under `limit-connections`):
    /// kept until the response head is sent.
    pub hold: Option<holdfast_http::routing::Hold>,
    /// Where the endpoint choice starts (a sticky session's), instead of the round robin.
    pub start: Option<usize>,
}

impl<'t> Forwarding<'t> {
    /// From a routing decision's; None when the host cannot be a header value.
    pub fn new(routed: Routed<'t, '_>) -> Option<Self> {
        Some(Forwarding {
            route: routed.route,
            raw_host: HeaderValue::from_str(routed.raw_host).ok()?,
            forward_path: routed.forward_path,
            header_changes: routed.header_changes,
            upstream_host: match routed.upstream_host {
                Some(h) => Some(HeaderValue::from_str(h).ok()?),
                None => None,
            },
            response_changes: routed.response_changes,
            timeouts: routed.timeouts.copied().unwrap_or_default(),
            retry: routed.retry,
            max_body: routed.max_body,
            hold: routed.hold,
            start: routed.start,
        })
    }
}

/// A response head, with the connection it came on (None: an upgrade's).
type Exchanged = (Response<Incoming>, Option<Box<Upstream<ReclaimBody>>>);

/// Why one exchange with an upstream failed.
enum ExchangeError {
    /// No connection took the request; its headers come back when it was built (it was
    /// not sent).
    Connect(crate::upstream::ConnectError, Option<HeaderMap>),
    Upstream(hyper::Error),
    Timeout,
}

/// The reason an error answer for a failure is counted under, which says its status:
/// the one mapping from a [`Failure`] to a [`Reason`].
pub(crate) trait FailureReason {
    /// The reason.
    fn reason(&self) -> Reason;
}

impl FailureReason for Failure {
    fn reason(&self) -> Reason {
        match self {
            Failure::NoEndpoint | Failure::Connect { .. } => Reason::UpstreamConnectFailed,
            Failure::Upstream { .. } => Reason::UpstreamFailed,
            Failure::Timeout(_) => Reason::UpstreamTimeout,
            Failure::Busy(_) => Reason::EndpointBusy,
            Failure::DeclaredTooLarge(_) | Failure::BodyTooLarge => Reason::BodyTooLarge,
            Failure::BodyStalled => Reason::BodyStalled,
            Failure::BadBody(_) => Reason::BadRequest,
        }
    }
}

impl Forwarder {
    /// Builds the forwarder over the shared route table.
    pub fn new(
        table: Arc<ArcSwapOption<RouteTable>>,
        settings: ForwardSettings,
        metrics: Metrics,
    ) -> Self {
        Forwarder {
            table,
            pool: Arc::new(Pool::new(settings.pool_idle_per_host, settings.workers)),
            h2c: crate::h2c::H2c::default(),
            balancer: Balancer::new(settings.eject_for),
            tunnels: Tunnels::new(settings.tunnel_idle_timeout),
            engine: holdfast_http::h1::engine::Settings {
                connect_timeout: settings.connect_timeout,
                response_timeout: settings.response_timeout,
                body_read_timeout: settings.body_read_timeout,
                max_request_body: settings.max_request_body,
                pool_idle_per_host: settings.pool_idle_per_host,
                allow_upgrade: settings.allow_upgrade.clone(),
                loop_header: LOOP_HEADER,
                loop_token: settings.loop_token.clone(),
                trace_ratio: None,
            },
            retry_budget: holdfast_http::forward::RetryBudget::new(settings.retry_budget),
            mirrors: crate::mirror::Mirrors::new(
                settings.max_mirrors_in_flight,
                settings.mirror_timeout,
                metrics.clone(),
            ),
            settings,
            metrics,
            slots: Mutex::new(Default::default()),
            draining: std::sync::atomic::AtomicBool::new(false),
            access_log: None,
            tracer: None,
        }
    }

    /// Logs every request to `log`.
    pub fn with_access_log(mut self, log: crate::access_log::AccessLog) -> Self {
        self.access_log = Some(log);
        self
    }

    /// Traces requests: a span of each sampled one (parent-based; new traces at `ratio`)
    /// to `exporter`, and this hop's `traceparent` upstream.
    pub fn with_tracing(mut self, exporter: holdfast_process::otlp::Exporter, ratio: f64) -> Self {
        self.tracer = Some(exporter);
        self.engine.trace_ratio = Some(ratio);
        self
    }

    /// At shutdown, once connections have drained: waits, at most `within` each, for the
    /// spans queued to be sent and the access log's waiting lines to be written, so that
    /// the last requests' are not lost with the process.
    pub async fn flush_observers(self: &Arc<Self>, within: Duration) {
        if let Some(tracer) = &self.tracer
            && !tracer.flush(within).await
        {
            tracing::warn!(?within, "spans still queued at exit were not sent");
        }
        if self.access_log.is_some() {
            let me = self.clone();
            let written = tokio::task::spawn_blocking(move || {
                me.access_log
                    .as_ref()
                    .is_none_or(|log| log.sink.close(within))
            })
            .await;
            if !matches!(written, Ok(true)) {
                tracing::warn!(?within, "access log lines waiting at exit were not written");
            }
        }
    }

    /// Whether each request is seen when it ends (the access log, or tracing).
    pub(crate) fn observes(&self) -> bool {
        self.access_log.is_some() || self.tracer.is_some()
    }

    /// Whether a peer's forwarding headers are kept (`--trust-forwarded-from`).
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        self.settings
            .trust_forwarded_from
            .iter()
            .any(|net| net.contains(&peer))
    }

    /// Writes a request's line to the access log (when it is on): `line` as the engine
    /// saw the request, completed here with the client's address after the trusted
    /// forwarders, the normalised path, the route and the trace id.
    pub(crate) fn log(&self, line: &Logged<'_>) {
        thread_local! {
            /// Each serving thread's route name, written once per request without allocating.
            static ROUTE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        ROUTE.with(|name| {
            let mut name = name.borrow_mut();
            let route = line.route.map(|r| {
                r.log_name(&mut name);
                name.as_str()
            });
            self.observe(line, route);
        });
    }

    fn observe(&self, line: &Logged<'_>, route: Option<&str>) {
        if let (Some(tracer), Some(trace)) = (&self.tracer, line.trace.filter(|t| t.sampled)) {
            tracer.export(span(line, &trace, route));
        }
        let Some(log) = &self.access_log else {
            return;
        };
        // The trace this hop is part of (when it traces), else the client's.
        let traced = line.trace.map(|t| t.trace_id_hex());
        let path = crate::access_log::logged_path(
            line.path,
            line.query,
            log.query,
            self.settings.escaped_slashes,
        );
        let record = crate::access_log::Record {
            time: line.time,
            client: crate::access_log::client_address(line.peer, line.forwarded_for, |ip| {
                self.trusts(ip)
            }),
            method: line.method,
            host: line.host,
            path: &path,
            protocol: line.protocol,
            tls: line.via.tls(),
            status: line.status,
            bytes_received: line.received,
            bytes_sent: line.sent,
            duration: line.took,
            upstream_duration: line.upstream_took,
            upstream: line.upstream,
            route,
            reason: line.reason.map(Reason::as_str),
            request_id: Some(line.request_id).filter(|id| !id.is_empty()),
            trace_id: match &traced {
                Some(hex) => std::str::from_utf8(hex).ok(),
                None => line.traceparent.and_then(crate::access_log::trace_id),
            },
            referer: line.referer,
            user_agent: line.user_agent,
        };
        log.sink.log(&record);
    }

    /// A request on `route` whose rule's policy allows a retry: true when the retry
    /// budget has a token (the retry is counted on the route), false when it has none
    /// (counted as over the budget).
    pub fn retry(&self, route: &Route) -> bool {
        if self.retry_budget.take() {
            self.metrics
                .count_retry(|| route.series_key(), &route.counters);
            true
        } else {
            self.metrics.retries_over_budget.inc();
            false
        }
    }

    /// Starts draining: keep-alive connections are closed after their next response.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// On shutdown: waits until `deadline` for upgraded tunnels to end, then closes the
    /// rest.
    pub async fn finish_tunnels(&self, deadline: tokio::time::Instant) {
        self.tunnels.finish(deadline).await;
    }

    /// The tunnels (upgrades, and TLS passthrough connections).
    pub fn tunnels(&self) -> &Tunnels {
        &self.tunnels
    }

    /// For a TLS passthrough connection on Gateway listener `listener` asking for
    /// `server_name`: a connection (made within the connect timeout) to an endpoint of
    /// the backend its TLSRoute picks, with the endpoint's connection slot, trying a
    /// second endpoint when the first does not connect; Err when none does. None when no
    /// route serves the name, or its backend reference does not resolve.
    pub async fn passthrough_connect(
        &self,
        listener: &str,
        server_name: &str,
    ) -> Option<Result<PassthroughUpstream, ()>> {
        let route = {
            let table = self.table.load();
            let l = table.as_deref()?.gateway_listener(listener)?;
            let no_headers = HeaderMap::new();
            let asked = crate::matching::Asked {
                method: "",
                query: None,
                headers: &no_headers,
            };
            let entry = l.lookup(server_name, "/", &asked)?;
            match entry.action.next_pick()? {
                (_, crate::gateway::Target::Route(route)) => route.clone(),
                (_, crate::gateway::Target::Unresolved(_)) => return None,
            }
        };
        let backend = &route.backend;
        let start = backend.next_index();
        let mut tried = None;
        for attempt in 0..2 {
            let (key, permit) = match self.target(backend, attempt, start, &mut tried).await {
                Target::Go(key, _, _, permit) => (key, permit),
                Target::Busy(_) => continue,
                Target::None => break,
            };
            // Passthrough relays the client's own TLS: never a handshake of ours, even to
            // a backend that a policy says speaks TLS.
            let opened = tokio::time::timeout(
                self.settings.connect_timeout,
                holdfast_http::upstream::open(key.destination()),
            )
            .await
            .unwrap_or(Err(crate::upstream::ConnectError::Timeout));
            match opened {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    self.metrics.upstream_connections_opened.inc();
                    return Some(Ok(PassthroughUpstream {
                        stream,
                        _slot: permit,
                    }));
                }
                Err(error) => {
                    self.metrics.upstream_connect_errors.inc();
                    if let Some(a) = tried {
                        self.balancer.connect_failed(a, &backend.name, &error);
                    }
                }
            }
        }
        Some(Err(()))
    }

    /// Open upgraded tunnels.
    pub fn tunnels_open(&self) -> usize {
        self.tunnels.len()
    }

    /// Answers a request the framing tracker flagged: 400, and the connection is closed.
    pub fn reject(&self, bad: &BadRequest) -> Response<ProxyBody> {
        let mut response = self.fail(Reason::BadRequest, format!("bad request: {bad}"));
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        self.metrics.count_unrouted(400);
        response
    }

    /// The answer to an HTTP/2 stream that found no slot under --max-connections.
    pub fn overloaded(&self) -> Response<ProxyBody> {
        self.metrics.count_unrouted(503);
        self.fail(
            Reason::Overloaded,
            "no connection slot left for this HTTP/2 stream",
        )
    }

    /// An error answer. What went wrong (`detail`) can name backends, pod addresses and
    /// error chains: it goes to the debug log, and to the client only with
    /// `--verbose-errors`. The client otherwise learns the status and nothing else.
    fn fail(&self, reason: Reason, detail: impl Into<String>) -> Response<ProxyBody> {
        let (status, body) = self.error_page(reason, detail);
        let mut answer = local(status, body);
        if self.observes() {
            answer.extensions_mut().insert(reason);
        }
        answer
    }

    /// An error answer's status and page (without its final newline), counted in the
    /// error metrics.
    fn error_page(&self, reason: Reason, detail: impl Into<String>) -> (StatusCode, String) {
        let status = reason.status();
        self.metrics
            .errors
            .get_or_create(&crate::metrics::ErrorLabels {
                reason: reason.as_str(),
                status: reason.status_str(),
            })
            .inc();
        let detail = detail.into();
        tracing::debug!(status = status.as_u16(), %detail, "error answer");
        let body = if self.settings.verbose_errors {
            format!("{} {detail}", status.as_u16())
        } else {
            generic(status)
        };
        (status, body)
    }

    /// Waits (up to the connect timeout) for a connection slot of `endpoint`; None when
    /// none frees up in time. Always a slot when there is no cap.
    async fn slot(
        &self,
        endpoint: SocketAddr,
    ) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
        let max = self.settings.max_connections_per_endpoint;
        if max == 0 {
            return Some(None);
        }
        loop {
            let semaphore = {
                let mut slots = self.slots.locked();
                if slots.len() > 4096 {
                    // Endpoints come and go: forget those nobody holds or waits on (the
                    // map is the only owner, so no one can be between cloning and
                    // acquiring).
                    slots.retain(|_, s| Arc::strong_count(s) > 1);
                }
                slots
                    .entry(endpoint)
                    .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(max)))
                    .clone()
            };
            if semaphore.available_permits() == 0 {
                let timeout = self.settings.connect_timeout;
                return match tokio::time::timeout(timeout, semaphore.acquire_owned()).await {
                    Ok(Ok(permit)) => Some(Some(permit)),
                    _ => None,
                };
            }
            // A free slot is taken at once, with no timer; one taken meanwhile by another
            // worker sends this round again.
            match semaphore.try_acquire_owned() {
                Ok(permit) => return Some(Some(permit)),
                Err(tokio::sync::TryAcquireError::Closed) => return None,
                Err(tokio::sync::TryAcquireError::NoPermits) => continue,
            }
        }
    }

    /// Waits for `response` (an upstream's response head); Err when it does not come
    /// within the response timeout, counted from when the request body has been read whole
    /// (a slow upload is bounded by the body read timeout between its bytes, not by the
    /// response timeout).
    async fn timed<F: Future>(
        &self,
        response: F,
        slot: &BodySlot,
        timeout: Duration,
    ) -> Result<F::Output, ()> {
        tokio::pin!(response);
        // A rule's "no limit" is a timeout too long to have an instant.
        let Some(_) = tokio::time::Instant::now().checked_add(timeout) else {
            return Ok(response.await);
        };
        let mut deadline = slot
            .is_done()
            .then(|| tokio::time::Instant::now() + timeout);
        loop {
            let sleep = tokio::time::sleep_until(
                deadline.unwrap_or_else(|| tokio::time::Instant::now() + timeout),
            );
            tokio::select! {
                r = &mut response => return Ok(r),
                _ = slot.done_notify.notified(), if deadline.is_none() => {
                    deadline = Some(tokio::time::Instant::now() + timeout);
                }
                _ = sleep, if deadline.is_some() => return Err(()),
            }
        }
    }

    /// An idle connection to `key`, or a new one (an upgrade always gets a new one).
    async fn connection(
        &self,
        key: &Key,
        fresh: bool,
        connect_timeout: Duration,
    ) -> Result<Box<Upstream<ReclaimBody>>, crate::upstream::ConnectError> {
        if !fresh && let Some(up) = self.pool.take(key) {
            return Ok(up);
        }
        let up = Upstream::connect(key.clone(), connect_timeout).await?;
        self.metrics.upstream_connections_opened.inc();
        Ok(up)
    }

    /// Sends `request` on `up` (an upgrade on a connection of its own) and waits for the
    /// response head (`wait`). A reused connection that the upstream closed before the
    /// request went out is replaced by a new one (connecting within `connect`).
    async fn exchange(
        &self,
        mut up: Box<Upstream<ReclaimBody>>,
        key: &Key,
        mut request: Request<ReclaimBody>,
        upgrade: bool,
        slot: &BodySlot,
        (wait, connect): (Duration, Duration),
    ) -> Result<Exchanged, ExchangeError> {
        if upgrade {
            let mut send = up.spawn_with_upgrades();
            return match self.timed(send.send_request(request), slot, wait).await {
                Ok(Ok(response)) => Ok((response, None)),
                Ok(Err(e)) => Err(ExchangeError::Upstream(e)),
                Err(()) => Err(ExchangeError::Timeout),
            };
        }
        loop {
            match self.timed(up.send(request), slot, wait).await {
                Ok(Ok(response)) => return Ok((response, Some(up))),
                Ok(Err(Ok(unsent))) if up.reused() => {
                    up = match self.connection(key, true, connect).await {
                        Ok(up) => up,
                        Err(e) => {
                            return Err(ExchangeError::Connect(
                                e,
                                Some(unsent.into_parts().0.headers),
                            ));
                        }
                    };
                    request = unsent;
                }
                Ok(Err(Ok(unsent))) => {
                    // A new connection the upstream closed at once: nothing was sent.
                    let closed = std::io::Error::other("closed before the request was sent");
                    let e = crate::upstream::ConnectError::Io(closed);
                    return Err(ExchangeError::Connect(
                        e,
                        Some(unsent.into_parts().0.headers),
                    ));
                }
                Ok(Err(Err(e))) => return Err(ExchangeError::Upstream(e)),
                Err(()) => return Err(ExchangeError::Timeout),
            }
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Handles one request from `client` (`via`: how its connection was made; `port`: the
    /// local port it came in on).
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        client: SocketAddr,
        via: &Via,
        port: u16,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let mut req = req;
        let request_id = RequestId::choose(
            req.headers().get(REQUEST_ID).map(HeaderValue::as_bytes),
            self.trusts(client.ip()),
        );
        req.extensions_mut().insert(request_id);
        let trace = self.engine.trace_ratio.map(|ratio| {
            let incoming = req
                .headers()
                .get(holdfast_http::trace::TRACEPARENT)
                .map(HeaderValue::as_bytes);
            holdfast_http::trace::TraceContext::start(incoming, ratio)
        });
        if let Some(trace) = trace {
            req.extensions_mut().insert(trace);
        }
        let attempts = self.observes().then(|| {
            let counted = Attempts::default();
            req.extensions_mut().insert(counted.clone());
            counted
        });
        let words = self.observes().then(|| Words::of(&req));
        let table = self.table.load_full();
        let http1 = req.version() <= Version::HTTP_11;
        let (mut response, route) = self
            .route_and_forward(req, client, via, port, table.as_deref())
            .await;
        if http1
            && self.draining.load(Ordering::Relaxed)
            && response.status() != StatusCode::SWITCHING_PROTOCOLS
        {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let status = response.status().as_u16();
        match route {
            Some(route) => self.metrics.count_route(
                || route.series_key(),
                &route.counters,
                status,
                started.elapsed(),
            ),
            None => self.metrics.count_unrouted(status),
        }
        if let Some(words) = &words {
            let upstream = response.extensions().get::<Upstreamed>();
            let upstream_to = upstream.map(|u| u.to.to_string());
            self.log(&Logged {
                time: words.time,
                peer: client.ip(),
                via,
                method: words.method.as_str(),
                host: &words.host,
                path: words.uri.path(),
                query: words.uri.query(),
                protocol: words.protocol,
                status,
                received: words.received,
                // What hyper will write: the body's length when it is known.
                sent: response.body().size_hint().exact().unwrap_or(0),
                took: started.elapsed(),
                upstream_took: upstream.map(|u| u.took),
                upstream: upstream_to.as_deref(),
                route,
                reason: response.extensions().get::<Reason>().copied(),
                request_id: request_id.as_str(),
                trace,
                attempts: attempts.map_or(0, |a| a.0.load(Ordering::Relaxed)),
                referer: words.header(header::REFERER),
                user_agent: words.header(header::USER_AGENT),
                forwarded_for: words.header(http::HeaderName::from_static("x-forwarded-for")),
                traceparent: words.header(http::HeaderName::from_static("traceparent")),
            });
        }
        response
    }

    /// Rewrites a routed request head into the one sent upstream: hop-by-hop headers
    /// removed (Upgrade kept for an allowed `upgrade`), forwarding headers, Host; returns
    /// its origin-form target. No I/O.
    pub fn upstream_head(
        &self,
        parts: &mut http::request::Parts,
        routed: Forwarding<'_>,
        client: SocketAddr,
        tls: bool,
        port: u16,
        upgrade: bool,
    ) -> PathAndQuery {
        let trusted = self.trusts(client.ip());
        // The request's id, as `handle` chose it (or chosen here): the client's header is
        // replaced by it, unless the rule sets its own.
        let id = match parts.extensions.get::<RequestId>() {
            Some(id) => *id,
            None => RequestId::choose(
                parts.headers.get(REQUEST_ID).map(HeaderValue::as_bytes),
                trusted,
            ),
        };
        parts.headers.remove(REQUEST_ID);
        if let Some(changes) = routed.header_changes {
            changes.apply(&mut parts.headers);
        }
        strip_hop_by_hop(&mut parts.headers, upgrade);
        let hop = Hop {
            client: client.ip(),
            port,
            proto: if tls { "https" } else { "http" },
            host: routed.raw_host.to_str().unwrap_or_default(),
            trusted,
        };
        add_forwarded(&mut parts.headers, hop);
        set_request_id(&mut parts.headers, &id, routed.header_changes);
        if let Some(trace) = parts
            .extensions
            .get::<holdfast_http::trace::TraceContext>()
            .filter(|t| t.replaces_client())
        {
            let ours = trace.traceparent();
            if let Ok(v) = HeaderValue::from_bytes(&ours) {
                parts.headers.insert(holdfast_http::trace::TRACEPARENT, v);
            }
            // A trace started here: the client's tracestate belongs to none it continues.
            if trace.parent.is_none() {
                parts
                    .headers
                    .remove(http::HeaderName::from_static("tracestate"));
            }
        }
        parts.headers.insert(
            header::HOST,
            routed.upstream_host.unwrap_or(routed.raw_host),
        );
        parts
            .headers
            .append(LOOP_HEADER, self.settings.loop_token.clone());
        routed
            .forward_path
            .or_else(|| parts.uri.path_and_query().cloned())
            .unwrap_or_else(|| PathAndQuery::from_static("/"))
    }

    /// Maps an upstream response head to the client's: hop-by-hop headers removed
    /// (Upgrade kept when an allowed upgrade was switched to), the loop header removed,
    /// and a Content-Length beside a Transfer-Encoding dropped (RFC 9112 §6.1: the
    /// transfer coding decides the length, and a client must not see both). No I/O.
    pub fn downstream_head(parts: &mut http::response::Parts, upgrade: bool) {
        if parts.headers.contains_key(header::TRANSFER_ENCODING) {
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        let switching = parts.status == StatusCode::SWITCHING_PROTOCOLS;
        strip_hop_by_hop(&mut parts.headers, switching && upgrade);
        parts.headers.remove(LOOP_HEADER);
    }

    /// Decides where a request read by hyper goes: the framing checks (HTTP/1.1), then
    /// [`Self::route`]. Err is the answer instead, with the route matched, if any.
    // The Err is the response itself, made once per request: boxing it would only add an
    // allocation.
    #[allow(clippy::result_large_err)]
    pub fn route_hyper<'t>(
        &self,
        method: &Method,
        version: Version,
        uri: &Uri,
        headers: &HeaderMap,
        (via, peer, bodyless, request_id): (&Via, Option<std::net::IpAddr>, bool, &str),
        table: Option<&'t RouteTable>,
    ) -> Result<Forwarding<'t>, (Response<ProxyBody>, Option<&'t Route>)> {
        if version <= Version::HTTP_11
            && let Err(e) = check_framing(method, headers)
        {
            // A framing 400 always closes the connection: what follows cannot be trusted.
            let mut answer = self.fail(Reason::BadRequest, format!("bad request: {e}"));
            answer
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Err((answer, None));
        }
        let host = match uri.authority() {
            Some(a) => Some(a.as_str()),
            None => headers.get(header::HOST).and_then(|h| h.to_str().ok()),
        };
        let view = RequestView {
            method: method.as_str(),
            host,
            path: uri.path(),
            query: uri.query(),
            headers,
            peer,
            bodyless,
            request_id,
        };
        match self.route(&view, via, table) {
            Decision::Forward(routed) => {
                let route = routed.route;
                Forwarding::new(routed).ok_or_else(|| {
                    let why = format!("bad request: {}", BadRequest::BadHost);
                    (self.fail(Reason::BadRequest, why), Some(route))
                })
            }
            Decision::Refuse {
                reason,
                detail,
                route,
            } => Err((self.fail(reason, detail), route)),
            Decision::Redirect { status, location } => Err((redirect(status, &location), None)),
            Decision::Answer { status, headers } => Err((answer_with(status, &headers), None)),
        }
    }

    /// Routes and forwards; also returns the route matched, if any.
    async fn route_and_forward<'t>(
        &self,
        req: Request<Incoming>,
        client: SocketAddr,
        via: &Via,
        port: u16,
        table: Option<&'t RouteTable>,
    ) -> (Response<ProxyBody>, Option<&'t Route>) {
        let tls = via.is_tls();
        let routed = match self.route_hyper(
            req.method(),
            req.version(),
            req.uri(),
            req.headers(),
            (
                via,
                Some(client.ip()),
                req.body().is_end_stream(),
                req.extensions()
                    .get::<RequestId>()
                    .map_or("", RequestId::as_str),
            ),
            table,
        ) {
            Ok(routed) => routed,
            Err(answer) => return answer,
        };
        let route = routed.route;
        let forwarded = match routed.timeouts.request {
            // A rule's limit on the whole request: every attempt, to the response head.
            Some(limit) => {
                tokio::time::timeout(limit, self.forward(req, routed, client, tls, port))
                    .await
                    .unwrap_or(Err(Failure::Timeout(limit)))
            }
            None => self.forward(req, routed, client, tls, port).await,
        };
        let answer = match forwarded {
            Ok(response) => response,
            Err(failure) => {
                let mut answer = self.fail(failure.reason(), error_chain(&failure));
                if matches!(failure, Failure::BodyStalled) {
                    // The rest of the body may never come: do not wait for it.
                    answer
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                answer
            }
        };
        (answer, Some(route))
    }

    /// Forwards a routed request: at most two attempts, on different endpoints, and a
    /// second only while the request body is unsent.
    async fn forward(
        &self,
        mut req: Request<Incoming>,
        mut routed: Forwarding<'_>,
        client: SocketAddr,
        tls: bool,
        port: u16,
    ) -> Result<Response<ProxyBody>, Failure> {
        let backend = &routed.route.backend;
        // An upgrade not on the allowlist (or h2c), or to an h2c backend, goes upstream as
        // a plain request, its Upgrade header removed.
        let upgrade = !backend.h2c && upgrade::requested(&req, &self.settings.allow_upgrade);
        let mut client_upgrade = upgrade.then(|| {
            let slot = req.extensions().get::<ConnectionSlot>().cloned();
            (hyper::upgrade::on(&mut req), slot)
        });
        let (mut parts, body) = req.into_parts();
        let response_changes = std::mem::take(&mut routed.response_changes);
        // Held until the response head is returned.
        let _hold = routed.hold.take();
        let sticky = routed.start;
        let wait = routed
            .timeouts
            .backend
            .unwrap_or(self.settings.response_timeout);
        let connect = routed
            .timeouts
            .connect
            .unwrap_or(self.settings.connect_timeout);
        let route = routed.route;
        let retry = routed.retry;
        let max_body =
            holdfast_http::routing::body_limit(self.settings.max_request_body, routed.max_body);
        let path_and_query = self.upstream_head(&mut parts, routed, client, tls, port, upgrade);
        let slot = Arc::new(
            self.body_slot(body, max_body)
                .map_err(Failure::DeclaredTooLarge)?,
        );

        // A rule's retry policy sends again only a request that can go twice; its
        // headers are kept for that.
        let retry = retry
            .filter(|_| Retry::safe(parts.method.as_str().as_bytes(), !slot.is_done()) && !upgrade);
        let again = retry.map(|_| parts.headers.clone());
        let mut retried = 0;
        let mut headers = Some(parts.headers);
        // A sticky session's endpoint first, else the backend's round robin.
        let mut start = sticky.unwrap_or_else(|| backend.next_index());
        let mut tried: Option<SocketAddr> = None;
        let attempts = parts.extensions.get::<Attempts>().cloned();
        let mut failure = Failure::NoEndpoint;
        'retry: loop {
            for attempt in 0..2 {
                let (key, authority, slot_permit) =
                    match self.target(backend, attempt, start, &mut tried).await {
                        Target::Go(key, _, authority, permit) => (key, authority, permit),
                        Target::Busy(endpoint) => {
                            failure = Failure::Busy(endpoint);
                            continue;
                        }
                        Target::None => break,
                    };
                if let Some(counted) = &attempts {
                    counted.0.fetch_add(1, Ordering::Relaxed);
                }
                let sent = Instant::now();
                let result = if backend.h2c {
                    match self.h2c.sender(&key, connect).await {
                        Ok((mut send, opened)) => {
                            if opened {
                                self.metrics.upstream_connections_opened.inc();
                            }
                            let Some(request_headers) = headers.take() else {
                                break;
                            };
                            let upstream = crate::h2c::request(
                                parts.method.clone(),
                                path_and_query.clone(),
                                request_headers,
                                ReclaimBody::new(slot.clone()),
                            );
                            match self.timed(send.send_request(upstream), &slot, wait).await {
                                Ok(Ok(response)) => Ok((response, None)),
                                Ok(Err(e)) => Err(ExchangeError::Upstream(e)),
                                Err(()) => Err(ExchangeError::Timeout),
                            }
                        }
                        Err(e) => Err(ExchangeError::Connect(e, None)),
                    }
                } else {
                    match self.connection(&key, upgrade, connect).await {
                        Ok(up) => {
                            // Taken only once connected: a failed connect leaves them for the
                            // next endpoint, so they are never copied.
                            let Some(request_headers) = headers.take() else {
                                break;
                            };
                            // Origin-form: the connection is to the endpoint, Host names the site.
                            let mut upstream = Request::new(ReclaimBody::new(slot.clone()));
                            *upstream.method_mut() = parts.method.clone();
                            *upstream.uri_mut() = Uri::from(path_and_query.clone());
                            *upstream.version_mut() = Version::HTTP_11;
                            *upstream.headers_mut() = request_headers;
                            self.exchange(up, &key, upstream, upgrade, &slot, (wait, connect))
                                .await
                        }
                        Err(e) => Err(ExchangeError::Connect(e, None)),
                    }
                };
                match result {
                    Ok((resp, up)) => {
                        self.metrics
                            .upstream_latency
                            .observe(sent.elapsed().as_secs_f64());
                        if let Some(policy) = retry
                            && policy.wants(resp.status().as_u16(), retried)
                            && self.retry(route)
                        {
                            // The answer is dropped with its connection, unread.
                            drop((resp, up, slot_permit));
                            retried += 1;
                            if !policy.backoff.is_zero() {
                                tokio::time::sleep(policy.backoff).await;
                            }
                            headers = again.clone();
                            start = backend.next_index();
                            tried = None;
                            continue 'retry;
                        }
                        let client_upgrade = client_upgrade.take();
                        let took = sent.elapsed();
                        let mut answer = self.relay(resp, up, upgrade, client_upgrade, slot_permit);
                        if self.observes() {
                            answer.extensions_mut().insert(Upstreamed {
                                to: tried.map_or_else(|| authority.to_string(), |a| a.to_string()),
                                took,
                            });
                        }
                        if let Some(changes) = response_changes.get() {
                            changes.apply_to_response(answer.headers_mut(), LOOP_HEADER);
                        }
                        return Ok(answer);
                    }
                    Err(ExchangeError::Timeout) => {
                        failure = Failure::Timeout(wait);
                        break;
                    }
                    Err(ExchangeError::Connect(e, unsent)) => {
                        // Its headers go to the next endpoint.
                        if unsent.is_some() {
                            headers = unsent;
                        }
                        self.metrics.upstream_connect_errors.inc();
                        if let Some(a) = tried {
                            self.balancer.connect_failed(a, &backend.name, &e);
                        }
                        failure = Failure::Connect {
                            authority: authority.to_string(),
                            source: e,
                        };
                        // Retry only if the request body was never sent.
                        let unsent = slot.body.lock().map(|s| s.is_some()).unwrap_or(false);
                        if !unsent {
                            break;
                        }
                    }
                    Err(ExchangeError::Upstream(e)) => {
                        failure = Failure::Upstream {
                            authority: authority.to_string(),
                            source: e.into(),
                        };
                        break;
                    }
                }
            }
            break;
        }
        // A body cut short by our own limits says so, whatever the upstream did then.
        Err(match slot.limit.get() {
            Some(BodyLimit::TooLarge) => Failure::BodyTooLarge,
            Some(BodyLimit::Stalled) => Failure::BodyStalled,
            None => failure,
        })
    }

    /// The request body, shared by the attempts; its declared length when that is over
    /// `max` (`--max-request-body`, or the route's lower limit; refused at once, 413).
    fn body_slot(&self, body: Incoming, max: u64) -> Result<BodySlot, u64> {
        if let Some(n) = body.size_hint().exact().filter(|&n| max > 0 && n > max) {
            return Err(n);
        }
        let empty = body.is_end_stream();
        Ok(BodySlot {
            body: Mutex::new(Some(body)),
            limit: OnceLock::new(),
            max_bytes: max,
            read_timeout: self.settings.body_read_timeout,
            done: std::sync::atomic::AtomicBool::new(empty),
            done_notify: tokio::sync::Notify::new(),
        })
    }

    /// Where attempt `attempt` goes: an ExternalName's authority (once), or the next
    /// endpoint the balancer picks that is not `tried`, with a connection slot.
    async fn target<'b>(
        &self,
        backend: &'b crate::table::Backend,
        attempt: usize,
        start: usize,
        tried: &mut Option<SocketAddr>,
    ) -> Target<'b> {
        if let Some(((authority, number), key)) = backend
            .external
            .as_deref()
            .and_then(|e| e.authority.as_ref().zip(e.number).zip(e.key.as_ref()))
        {
            return if attempt == 0 {
                Target::Go(key.clone(), number, authority, None)
            } else {
                Target::None
            };
        }
        match self.balancer.pick(&backend.endpoints, start, *tried) {
            Some((i, a)) if Some(a) != *tried => {
                *tried = Some(a);
                match self.slot(a).await {
                    Some(permit) => {
                        let dial = &backend.dial[i];
                        Target::Go(dial.key.clone(), dial.number, &dial.authority, permit)
                    }
                    None => {
                        // Busy past the connect timeout: the next endpoint, if any.
                        self.metrics.upstream_queue_timeouts.inc();
                        Target::Busy(a)
                    }
                }
            }
            _ => Target::None,
        }
    }

    /// The client's response from the upstream's: its head mapped, its body driving the
    /// upstream connection. A switch to an allowed upgrade opens the tunnel, which holds
    /// the client connection's and the endpoint's slots until it ends.
    fn relay(
        &self,
        mut resp: Response<Incoming>,
        up: Option<Box<Upstream<ReclaimBody>>>,
        upgrade: bool,
        client_upgrade: Option<(hyper::upgrade::OnUpgrade, Option<ConnectionSlot>)>,
        mut slot_permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Response<ProxyBody> {
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some((client_upgrade, connection_slot)) = client_upgrade
        {
            let held = (connection_slot, slot_permit.take());
            let upstream_upgrade = hyper::upgrade::on(&mut resp);
            let (down, up) = (client_upgrade, upstream_upgrade);
            use hyper_util::rt::TokioIo;
            self.tunnels.open(
                async { down.await.map(TokioIo::new) },
                async { up.await.map(TokioIo::new) },
                held,
            );
        }
        let (mut parts, body) = resp.into_parts();
        Self::downstream_head(&mut parts, upgrade);
        let body = UpstreamBody {
            inner: body,
            up: up.map(|up| (up, self.pool.clone())),
            _slot: slot_permit,
        };
        Response::from_parts(parts, Either::Left(body))
    }
}

/// A redirect's answer; a Location that cannot be a header value (a host or path that
/// cannot be redirected to) is a 400 instead.
fn redirect(status: u16, location: &str) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FOUND);
    match HeaderValue::from_str(location) {
        Ok(v) => {
            let mut response = local(status, format!("{} redirecting", status.as_u16()));
            response.headers_mut().insert(header::LOCATION, v);
            response
        }
        Err(_) => local(
            StatusCode::BAD_REQUEST,
            "400 bad request: unusable host or path",
        ),
    }
}

/// An answer with `status`, `headers` (their `set` and `add`) and no body (a CORS
/// preflight's).
fn answer_with(status: u16, headers: &crate::gateway::HeaderChanges) -> Response<ProxyBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::NO_CONTENT);
    for (name, value) in headers.set.iter().chain(&headers.add) {
        response.headers_mut().append(name.clone(), value.clone());
    }
    response
}

/// Why a request body was cut short by the proxy's own limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyLimit {
    /// Longer than `--max-request-body`: 413.
    TooLarge,
    /// No bytes for `--body-read-timeout`: 408.
    Stalled,
}

impl std::fmt::Display for BodyLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BodyLimit::TooLarge => "request body larger than --max-request-body",
            BodyLimit::Stalled => "request body stalled for --body-read-timeout",
        })
    }
}

impl std::error::Error for BodyLimit {}

/// The request body, with the limits it is read under, shared by the attempts.
struct BodySlot {
    body: Mutex<Option<Incoming>>,
    /// Set when a limit cut the body: the answer is 413 or 408, not 502.
    limit: OnceLock<BodyLimit>,
    max_bytes: u64,
    read_timeout: Duration,
    /// The whole body has been read: the upstream response timeout runs from then (an
    /// upload is timed by `read_timeout` between its bytes instead).
    done: std::sync::atomic::AtomicBool,
    done_notify: tokio::sync::Notify,
}

impl BodySlot {
    fn finished(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            self.done_notify.notify_one();
        }
    }
    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// The request body, handed to the upstream client in a way that can be taken back if
/// the client never started sending it (a connection failure), so the request can be
/// retried on another endpoint without buffering the body. It enforces
/// `--max-request-body` (counting what arrives, whatever Content-Length said) and
/// `--body-read-timeout` (the longest wait for the next bytes).
pub struct ReclaimBody {
    slot: Arc<BodySlot>,
    body: Option<Incoming>,
    read: u64,
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ReclaimBody {
    fn new(slot: Arc<BodySlot>) -> Self {
        ReclaimBody {
            slot,
            body: None,
            read: 0,
            stall: None,
        }
    }

    fn with_slot<T>(&self, f: impl FnOnce(Option<&Incoming>) -> T) -> T {
        match &self.body {
            Some(b) => f(Some(b)),
            None => f(self.slot.body.locked().as_ref()),
        }
    }

    fn cut(&mut self, why: BodyLimit) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let _ = self.slot.limit.set(why);
        self.body = None;
        Poll::Ready(Some(Err(Box::new(why))))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Body for ReclaimBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.body.is_none() {
            this.body = this.slot.body.locked().take();
        }
        let Some(b) = &mut this.body else {
            return Poll::Ready(None);
        };
        match Pin::new(b).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.stall = None;
                if let Some(data) = frame.data_ref() {
                    this.read += data.len() as u64;
                    if this.slot.max_bytes > 0 && this.read > this.slot.max_bytes {
                        return this.cut(BodyLimit::TooLarge);
                    }
                }
                if this.body.as_ref().is_some_and(Body::is_end_stream) {
                    this.slot.finished();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                this.stall = None;
                if other.is_none() {
                    this.slot.finished();
                }
                Poll::Ready(other.map(|r| r.map_err(BoxError::from)))
            }
            Poll::Pending => {
                let timeout = this.slot.read_timeout;
                let stall = this
                    .stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stall.as_mut().poll(cx).is_ready() {
                    return this.cut(BodyLimit::Stalled);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.with_slot(|b| b.is_none_or(Body::is_end_stream))
    }

    fn size_hint(&self) -> SizeHint {
        self.with_slot(|b| {
            b.map(Body::size_hint)
                .unwrap_or_else(|| SizeHint::with_exact(0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_status_and_its_label_says_it() {
        for r in Reason::ALL {
            assert_eq!(r.status_str(), r.status().as_str(), "{r:?}");
            assert!(
                r.as_str()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
            );
        }
    }
}

#[cfg(test)]
mod gateway_tests {
    use holdfast_proto::snapshot::{gateway_host_name, listener_name, seal};
    use holdfast_proto::v1::{
        Backend, Endpoint, GatewayHost, GatewayListener, GatewayRoute, HeaderMatch, HeaderModifier,
        MatchKind, PathModifier, RequestRedirect, Snapshot, UrlRewrite, WeightedBackend,
    };

    use super::*;

    fn forwarder() -> Forwarder {
        let mut registry = prometheus_client::registry::Registry::default();
        Forwarder::new(
            Arc::new(ArcSwapOption::empty()),
            ForwardSettings {
                connect_timeout: Duration::from_secs(5),
                response_timeout: Duration::from_secs(60),
                eject_for: Duration::from_secs(10),
                pool_idle_per_host: 1,
                workers: 1,
                escaped_slashes: holdfast_http::path::EscapedSlashes::Reject,
                verbose_errors: false,
                max_request_body: 0,
                body_read_timeout: Duration::from_secs(60),
                tunnel_idle_timeout: Duration::from_secs(60),
                max_connections_per_endpoint: 0,
                allow_upgrade: vec![],
                trust_forwarded_from: vec![],
                allow_dot_segment_params: false,
                retry_budget: 0.2,
                mirror_timeout: Duration::from_secs(5),
                max_mirrors_in_flight: 1024,
                loop_token: new_loop_token(),
            },
            Metrics::new(&mut registry),
        )
    }

    /// Backend `name` with one ready endpoint.
    fn backend(name: &str) -> Backend {
        Backend {
            name: name.into(),
            endpoints: vec![Endpoint {
                address: "10.0.0.1".into(),
                port: 8080,
                zone: String::new(),
                ready: true,
            }],
            ..Default::default()
        }
    }

    fn forward(path: &str, backends: Vec<WeightedBackend>) -> GatewayRoute {
        GatewayRoute {
            match_kind: MatchKind::Prefix as i32,
            path: path.into(),
            backends,
            ..Default::default()
        }
    }

    fn to(backend: &str, weight: u32) -> WeightedBackend {
        WeightedBackend {
            backend: backend.into(),
            weight,
            unresolved: String::new(),
            ..Default::default()
        }
    }

    /// One listener on 127.10.0.1:80 with routes for `gw.test`: `/mod` to `ns/a:80` with
    /// header changes, `/moved` a redirect, `/broken` an unresolved backend, `/` to
    /// `ns/a:80` (weight 1) and `ns/b:80` (weight 0).
    fn table() -> RouteTable {
        let listener = listener_name("127.10.0.1", 80);
        let mut modified = forward("/mod", vec![to("ns/a:80", 1)]);
        let pair = |n: &str, v: &str| HeaderMatch {
            name: n.into(),
            value: v.into(),
        };
        modified.request_headers = Some(HeaderModifier {
            set: vec![pair("x-set", "yes")],
            add: vec![pair("x-add", "more")],
            remove: vec!["x-gone".into()],
        });
        let mut moved = forward("/moved", vec![]);
        moved.redirect = Some(RequestRedirect {
            scheme: String::new(),
            hostname: "elsewhere.test".into(),
            port: 0,
            status_code: 301,
            path: None,
            location: String::new(),
            drop_query: false,
        });
        let broken = forward(
            "/broken",
            vec![WeightedBackend {
                backend: String::new(),
                weight: 1,
                unresolved: "BackendNotFound".into(),
                ..Default::default()
            }],
        );
        let mut s = Snapshot {
            backends: vec![backend("ns/a:80"), backend("ns/b:80")],
            gateway_listeners: vec![GatewayListener {
                name: listener.clone(),
                address: "127.10.0.1".into(),
                port: 80,
                protocol: "HTTP".into(),
                ..Default::default()
            }],
            gateway_hosts: vec![GatewayHost {
                name: gateway_host_name(&listener, "gw.test"),
                listener,
                host: "gw.test".into(),
                routes: vec![
                    modified,
                    moved,
                    broken,
                    {
                        let mut by_header = forward("/hdr", vec![to("ns/b:80", 1)]);
                        by_header.headers = vec![pair("x-v", "2")];
                        by_header
                    },
                    {
                        let mut rewritten = forward("/rw", vec![to("ns/b:80", 1)]);
                        rewritten.rewrite = Some(UrlRewrite {
                            hostname: "up.test".into(),
                            path: Some(PathModifier {
                                full: false,
                                value: "/v2".into(),
                                captures: false,
                            }),
                        });
                        rewritten.response_headers = Some(HeaderModifier {
                            set: vec![pair("x-resp", "r")],
                            ..Default::default()
                        });
                        rewritten
                    },
                    {
                        let mut moved_path = forward("/old", vec![]);
                        moved_path.redirect = Some(RequestRedirect {
                            status_code: 302,
                            path: Some(PathModifier {
                                full: false,
                                value: "/new".into(),
                                captures: false,
                            }),
                            ..Default::default()
                        });
                        moved_path
                    },
                    {
                        let mut by_method = forward("/", vec![to("ns/b:80", 1)]);
                        by_method.method = "PATCH".into();
                        by_method
                    },
                    {
                        let mut by_query = forward("/", vec![to("ns/b:80", 1)]);
                        by_query.query_params = vec![pair("k", "v")];
                        by_query
                    },
                    forward("/", vec![to("ns/a:80", 1), to("ns/b:80", 0)]),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        seal(&mut s, 1);
        holdfast_proto::snapshot::validate(&s).expect("a valid snapshot");
        RouteTable::compile(&s).expect("compiles")
    }

    /// An Ingress host `in.test` whose entries have filters (ingress-nginx annotations):
    /// `/perm` a redirect to a location, Exact `/` an app-root redirect, `/secure` an https
    /// redirect, `/up` a Host rewrite and a header, `/.well-known` an https redirect to
    /// `ns/b:80`; `/` plain, to `ns/b:80`.
    fn ingress_table() -> RouteTable {
        use holdfast_proto::snapshot::{INGRESS_LISTENER, ingress_gateway_host};
        use holdfast_proto::v1::{IngressRef, Route as IngressRoute, VirtualHost};
        let source = IngressRef {
            namespace: "ns".into(),
            name: "web".into(),
        };
        let plain = |path: &str, backend: &str| IngressRoute {
            match_kind: MatchKind::Prefix as i32,
            path: path.into(),
            backend: backend.into(),
            source: Some(source.clone()),
        };
        let mut g = ingress_gateway_host(&VirtualHost {
            host: "in.test".into(),
            routes: vec![
                plain("/secure", "ns/a:80"),
                plain("/perm", "ns/a:80"),
                plain("/up", "ns/a:80"),
                plain("/.well-known", "ns/b:80"),
                plain("/internal", "ns/a:80"),
                plain("/", "ns/b:80"),
            ],
            ..Default::default()
        });
        g.routes[4].allow_sources = vec!["10.0.0.0/8".into()];
        g.routes[4].deny_sources = vec!["10.9.0.0/16".into()];
        g.routes[0].https_redirect = true;
        g.routes[3].https_redirect = true;
        g.routes[1].backends.clear();
        g.routes[1].redirect = Some(RequestRedirect {
            status_code: 301,
            location: "https://example.org/new".into(),
            ..Default::default()
        });
        g.routes[2].rewrite = Some(UrlRewrite {
            hostname: "internal.test".into(),
            path: None,
        });
        g.routes[2].request_headers = Some(HeaderModifier {
            set: vec![HeaderMatch {
                name: "x-forwarded-prefix".into(),
                value: "/up".into(),
            }],
            ..Default::default()
        });
        let mut root = GatewayRoute {
            match_kind: MatchKind::Exact as i32,
            path: "/".into(),
            ingress: Some(source.clone()),
            ..Default::default()
        };
        root.redirect = Some(RequestRedirect {
            status_code: 302,
            path: Some(PathModifier {
                full: true,
                value: "/app".into(),
                captures: false,
            }),
            ..Default::default()
        });
        g.routes.insert(0, root);
        assert_eq!(g.listener, INGRESS_LISTENER);
        let mut s = Snapshot {
            backends: vec![backend("ns/a:80"), backend("ns/b:80")],
            gateway_hosts: vec![g],
            ..Default::default()
        };
        seal(&mut s, 1);
        holdfast_proto::snapshot::validate(&s).expect("a valid snapshot");
        RouteTable::compile(&s).expect("compiles")
    }

    /// An Ingress path with filters acts as a Gateway entry would, with Ingress host
    /// selection: a location redirect, an app-root redirect keeping the Host's port, an
    /// https redirect (not for ACME challenges), a Host rewrite with a header set; the
    /// plain path beside them forwards as before.
    #[test]
    fn an_ingress_path_with_filters_redirects_and_rewrites_as_its_annotations_say() {
        let (f, t) = (forwarder(), ingress_table());
        let h = HeaderMap::new();
        let decide = |host: &str, path: &str| {
            let view = RequestView {
                method: "GET",
                host: Some(host),
                path,
                query: None,
                headers: &h,
                peer: None,
                bodyless: true,
                request_id: "test-id",
            };
            match f.route(&view, &Via::Http, Some(&t)) {
                Decision::Forward(r) => format!(
                    "{} {} {}",
                    r.route.backend.name,
                    r.upstream_host.unwrap_or(r.raw_host),
                    r.header_changes.map_or(0, |c| c.set.len())
                ),
                Decision::Redirect { status, location } => format!("{status} {location}"),
                Decision::Refuse { reason, .. } => format!("{reason:?}"),
                Decision::Answer { status, .. } => format!("answer {status}"),
            }
        };
        assert_eq!(decide("in.test", "/perm/x"), "301 https://example.org/new");
        assert_eq!(decide("in.test:8080", "/"), "302 http://in.test:8080/app");
        assert_eq!(decide("IN.test", "/"), "302 http://in.test/app");
        assert_eq!(
            decide("in.test", "/secure/a"),
            "308 https://in.test/secure/a"
        );
        assert_eq!(
            decide("in.test", "/.well-known/acme-challenge/t"),
            "ns/b:80 in.test 0"
        );
        assert_eq!(
            decide("in.test", "/.well-known/other"),
            "308 https://in.test/.well-known/other"
        );
        assert_eq!(decide("in.test", "/up/a"), "ns/a:80 internal.test 1");
        assert_eq!(decide("in.test", "/other"), "ns/b:80 in.test 0");
        // Ingress host selection: no fall-through to another host.
        assert_eq!(decide("else.test", "/"), "NoRoute");
        // The route table lists each entry's routes once (a redirect has none).
        let mut paths: Vec<&str> = t.routes().map(|r| &*r.path).collect();
        paths.sort_unstable();
        assert_eq!(paths, ["/", "/.well-known", "/internal", "/secure", "/up"]);
    }

    /// Source ranges: the deny list first, then the allow list; the client address is the
    /// peer's, or for a trusted peer (a balancer) the last untrusted X-Forwarded-For
    /// address, else its X-Real-IP; an unknown peer is refused.
    #[test]
    fn an_ingress_path_with_source_ranges_lets_through_only_the_clients_they_allow() {
        let mut f = forwarder();
        let t = ingress_table();
        let decide = |f: &Forwarder, peer: Option<&str>, headers: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in headers {
                h.append(*n, HeaderValue::from_str(v).unwrap());
            }
            let view = RequestView {
                method: "GET",
                host: Some("in.test"),
                path: "/internal/x",
                query: None,
                headers: &h,
                peer: peer.map(|p| p.parse().unwrap()),
                bodyless: true,
                request_id: "test-id",
            };
            match f.route(&view, &Via::Http, Some(&t)) {
                Decision::Forward(_) => 200,
                Decision::Refuse { reason, .. } => reason.status().as_u16(),
                _ => 0,
            }
        };
        assert_eq!(decide(&f, Some("10.1.2.3"), &[]), 200);
        assert_eq!(decide(&f, Some("::ffff:10.1.2.3"), &[]), 200, "v4-mapped");
        assert_eq!(decide(&f, Some("10.9.2.3"), &[]), 403, "denied first");
        assert_eq!(decide(&f, Some("192.0.2.7"), &[]), 403, "not allowed");
        assert_eq!(decide(&f, None, &[]), 403, "unknown: refused");
        // An untrusted peer's forwarding headers are not read.
        assert_eq!(
            decide(&f, Some("192.0.2.7"), &[("x-forwarded-for", "10.1.2.3")]),
            403
        );
        f.settings.trust_forwarded_from = vec!["192.0.2.0/24".parse().unwrap()];
        for (xff, want) in [
            ("10.1.2.3", 200),
            ("10.9.2.3", 403),
            // A client's own X-Forwarded-For entry (left) does not count: the balancer's
            // (right) does.
            ("10.1.2.3, 203.0.113.9", 403),
            ("203.0.113.9, 10.1.2.3, 192.0.2.8", 200),
        ] {
            assert_eq!(
                decide(&f, Some("192.0.2.7"), &[("x-forwarded-for", xff)]),
                want,
                "{xff}"
            );
        }
        for (xff, want) in [
            ("10.1.2.3:5555", 200),
            ("[::ffff:10.1.2.3]:5555", 200),
            ("unknown, 10.1.2.3", 200),
            // An entry that is not an address: nothing left of it is believed.
            ("10.1.2.3, unknown, 192.0.2.8", 403),
        ] {
            assert_eq!(
                decide(&f, Some("192.0.2.7"), &[("x-forwarded-for", xff)]),
                want,
                "{xff}"
            );
        }
        assert_eq!(
            decide(
                &f,
                Some("::ffff:192.0.2.7"),
                &[("x-forwarded-for", "10.1.2.3")]
            ),
            200,
            "a v4-mapped balancer is trusted as its IPv4 address"
        );
        assert_eq!(
            decide(&f, Some("192.0.2.7"), &[("x-real-ip", "10.1.2.3")]),
            403,
            "X-Real-IP is not read (one header is believed: X-Forwarded-For)"
        );
        assert_eq!(
            decide(&f, Some("192.0.2.7"), &[]),
            403,
            "the balancer itself"
        );
    }

    fn on_gateway() -> Via {
        Via::Gateway {
            listener: Arc::from("127.10.0.1:80"),
            tls: None,
            version: "",
        }
    }

    fn head(path: &str) -> (Uri, HeaderMap) {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("gw.test"));
        h.insert("x-gone", HeaderValue::from_static("1"));
        (Uri::try_from(path).unwrap(), h)
    }

    #[test]
    fn a_gateway_listener_serves_its_rules_and_only_its_rules() {
        let (f, t) = (forwarder(), table());
        let status = |via: &Via, path: &str| {
            let (uri, h) = head(path);
            match f.route_hyper(
                &Method::GET,
                Version::HTTP_11,
                &uri,
                &h,
                (via, None, true, "test-id"),
                Some(&t),
            ) {
                Ok(r) => Ok(r.route.backend.name.clone()),
                Err((answer, _)) => Err((
                    answer.status(),
                    answer.headers().get(header::LOCATION).cloned(),
                )),
            }
        };
        // Weight 0 is never chosen.
        for _ in 0..5 {
            assert_eq!(status(&on_gateway(), "/x"), Ok("ns/a:80".into()));
        }
        assert_eq!(
            status(&on_gateway(), "/moved/on?q=1"),
            Err((
                StatusCode::MOVED_PERMANENTLY,
                Some(HeaderValue::from_static(
                    "http://elsewhere.test/moved/on?q=1"
                ))
            ))
        );
        assert_eq!(
            status(&on_gateway(), "/broken"),
            Err((StatusCode::INTERNAL_SERVER_ERROR, None))
        );
        // Isolation: the proxy's own listeners do not see Gateway routes, and another
        // listener's requests do not reach these.
        assert_eq!(status(&Via::Http, "/x"), Err((StatusCode::NOT_FOUND, None)));
        let other = Via::Gateway {
            listener: Arc::from("127.10.0.2:80"),
            tls: None,
            version: "",
        };
        assert_eq!(status(&other, "/x"), Err((StatusCode::NOT_FOUND, None)));
    }

    #[test]
    fn a_rules_header_changes_are_made_to_the_request_sent_upstream() {
        let (f, t) = (forwarder(), table());
        let (uri, h) = head("/mod");
        let Ok(routed) = f.route_hyper(
            &Method::GET,
            Version::HTTP_11,
            &uri,
            &h,
            (&on_gateway(), None, true, "test-id"),
            Some(&t),
        ) else {
            panic!("routed");
        };
        let mut parts = Request::builder().uri(uri).body(()).unwrap().into_parts().0;
        parts.headers = h;
        parts
            .headers
            .insert("x-add", HeaderValue::from_static("first"));
        f.upstream_head(
            &mut parts,
            routed,
            ([10, 0, 0, 9], 1).into(),
            false,
            80,
            false,
        );
        assert_eq!(parts.headers["x-set"], "yes");
        let added: Vec<&HeaderValue> = parts.headers.get_all("x-add").iter().collect();
        assert_eq!(added, ["first", "more"]);
        assert!(!parts.headers.contains_key("x-gone"));
    }

    /// A rule's method and query matches, its URL rewrite (host and path prefix, the
    /// query kept), its response header changes and a redirect's path prefix.
    #[test]
    fn a_rules_matches_rewrite_and_redirect_path_decide_as_written() {
        let (f, t) = (forwarder(), table());
        let h = head("/").1;
        let decide = |method: &str, path: &str, query: Option<&str>| {
            let view = RequestView {
                method,
                host: Some("gw.test"),
                path,
                query,
                headers: &h,
                peer: None,
                bodyless: true,
                request_id: "test-id",
            };
            match f.route(&view, &on_gateway(), Some(&t)) {
                Decision::Forward(r) => format!(
                    "{} {} {:?} {}",
                    r.route.backend.name,
                    r.upstream_host.unwrap_or(r.raw_host),
                    r.forward_path.as_ref().map(PathAndQuery::as_str),
                    r.response_changes.get().is_some()
                ),
                Decision::Redirect { status, location } => format!("{status} {location}"),
                Decision::Refuse { reason, .. } => format!("{reason:?}"),
                Decision::Answer { status, .. } => format!("answer {status}"),
            }
        };
        assert_eq!(decide("GET", "/x", None), "ns/a:80 gw.test None false");
        assert_eq!(decide("PATCH", "/x", None), "ns/b:80 gw.test None false");
        assert_eq!(
            decide("GET", "/x", Some("k=v")),
            "ns/b:80 gw.test None false"
        );
        assert_eq!(
            decide("GET", "/x", Some("k=w&k=v")),
            "ns/a:80 gw.test None false"
        );
        assert_eq!(
            decide("GET", "/rw/a/b", Some("q=1")),
            "ns/b:80 up.test Some(\"/v2/a/b?q=1\") true"
        );
        assert_eq!(
            decide("GET", "/rw", None),
            "ns/b:80 up.test Some(\"/v2\") true"
        );
        assert_eq!(
            decide("GET", "/old/page", Some("q=1")),
            "302 http://gw.test/new/page?q=1"
        );
    }

    /// Routing reads a request the same way from hyper's head and from the native
    /// engine's parse in place: the same decision for each path, header and host.
    #[test]
    fn a_native_parse_and_a_hyper_head_get_the_same_routing_decision() {
        use holdfast_http::h1::{HeadEnd, HeadHeaders, Limits, RequestHead};
        let (f, t) = (forwarder(), table());
        let limits = Limits {
            max_bytes: 8192,
            max_headers: 10,
        };
        let summary = |d: Decision<'_, '_>| match d {
            Decision::Forward(r) => format!(
                "forward {} as {} {:?} {}",
                r.route.backend.name,
                r.raw_host,
                r.forward_path.as_ref().map(PathAndQuery::as_str),
                r.header_changes.is_some()
            ),
            Decision::Refuse { reason, route, .. } => {
                format!(
                    "refuse {} {:?}",
                    reason.as_str(),
                    route.map(|r| &r.backend.name)
                )
            }
            Decision::Redirect { status, location } => format!("redirect {status} {location}"),
            Decision::Answer { status, headers } => format!("answer {status} {headers:?}"),
        };
        let mut decisions = Vec::new();
        for (target, extra) in [
            ("/x", ""),
            ("/hdr", "x-v: 2\r\n"),
            ("/hdr", "x-v: 3\r\n"),
            ("/hdr", ""),
            ("/mod?a=1", ""),
            ("/moved/on?q=1", ""),
            ("/moved/./on?q=1", ""),
            ("/broken", ""),
            ("/a/../x?q", ""),
            ("/a%2Fb", ""),
            ("http://gw.test:80/x", ""),
            ("http://GW.test/hdr", "X-V: 2\r\n"),
        ] {
            let raw = format!("GET {target} HTTP/1.1\r\nHost: gw.test\r\n{extra}\r\n");
            let buf = raw.as_bytes();
            let mut head = RequestHead::default();
            let len = HeadEnd::default().find(buf).expect("a head");
            head.parse(buf, len, limits).expect("a valid head");
            let text = |s: holdfast_http::h1::Span| std::str::from_utf8(s.of(buf)).ok();
            let native = RequestView {
                method: text(head.method).unwrap_or_default(),
                host: head.routing_host().and_then(text),
                path: text(head.path).unwrap_or_default(),
                query: head.query.and_then(text),
                headers: &HeadHeaders { head: &head, buf },
                peer: None,
                bodyless: true,
                request_id: "test-id",
            };
            let ours = summary(f.route(&native, &on_gateway(), Some(&t)));
            let uri = Uri::try_from(target).unwrap();
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("gw.test"));
            if let Some((n, v)) = extra.trim_end().split_once(": ") {
                h.insert(
                    http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            let hyper = RequestView {
                method: "GET",
                host: match uri.authority() {
                    Some(a) => Some(a.as_str()),
                    None => h.get(header::HOST).and_then(|v| v.to_str().ok()),
                },
                path: uri.path(),
                query: uri.query(),
                headers: &h,
                peer: None,
                bodyless: true,
                request_id: "test-id",
            };
            let theirs = summary(f.route(&hyper, &on_gateway(), Some(&t)));
            assert_eq!(ours, theirs, "{target} {extra}");
            decisions.push(ours);
        }
        assert_eq!(decisions[1], "forward ns/b:80 as gw.test None false");
        // Without the header's value, the rule for `/` takes it.
        assert_eq!(decisions[2], "forward ns/a:80 as gw.test None false");
        assert_eq!(
            decisions[6],
            "redirect 301 http://elsewhere.test/moved/on?q=1"
        );
        assert_eq!(
            decisions[8],
            "forward ns/a:80 as gw.test Some(\"/x?q\") false"
        );
        assert!(
            decisions[9].starts_with("refuse bad_request"),
            "{}",
            decisions[9]
        );
        assert_eq!(decisions[11], "forward ns/b:80 as GW.test None false");
    }
}
