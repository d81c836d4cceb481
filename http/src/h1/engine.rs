//! The native HTTP/1.1 engine: one task per client connection owns a read buffer, a
//! buffer for the upstream's bytes and one for heads it writes. Each request head is
//! parsed once ([`crate::h1`]): the framing rules, routing and the upstream head
//! all read that parse. Bodies are relayed from the buffers as they are (a chunked body
//! keeps its coding, checked as it passes), and the upstream connection goes back to this
//! worker's idle pool once its response has been relayed whole. HTTP/2 (the h2c preface)
//! is handed to hyper with the bytes already read.
//!
//! The engine knows HTTP and upstream connections, not routes: what a request's
//! route is, which endpoint an attempt goes to, why the proxy answers an error and how
//! it counts answers come from the proxy through [`Service`].
//!
//! Timeouts: the idle timeout while waiting for a request's first byte, the header read
//! timeout from that byte until the head is whole, the body read timeout between a
//! request body's reads, the response timeout from the end of the request body to the
//! response head, the send timeout for every write to the client. The waits every
//! keep-alive request makes (for its head, its body's reads, the upstream write and the
//! response head, the writes to the client) and the rarer ones (the 100 Continue,
//! connecting, the last shutdown) all share the connection's one timer ([`super::timer`]):
//! none of the engine's waits arms a timer of its own (the proxy's wait for a free slot
//! of an endpoint whose requests in flight are at their cap, outside this crate, does). `http/clippy.toml` refuses `tokio::time::timeout` and
//! `sleep` in this crate to keep it so.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use std::future::Future;
use std::net::IpAddr;

use http::{HeaderValue, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::chunked::{Chunked, Piece};
use super::onward::{Back, MAX_PIECES, Onward, Run, plan_upstream_head, write_downstream_head};
use super::timer::{Timer, Until};
use super::{
    BodyFraming, H2_PREFACE, HeadEnd, HeadError, HeadHeaders, Limits, RequestHead, ResponseHead,
    TargetForm,
};
use crate::clock;
use crate::forward::{Failure, Retry, Target};
use crate::headers::{HeaderChanges, HeaderLookup, Hop, RequestId};
use crate::routing::{Decision, RequestView};
use crate::tunnel::Tunnels;
use crate::upstream::{ConnectError, IDLE_TIMEOUT, Key, Number, Stream};

/// The largest read into a connection's buffer.
const READ_CHUNK: usize = 16 * 1024;

/// Largest upstream response head read.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Most body bytes read and dropped after a request answered here, to keep its
/// connection (hyper drains about as much).
const DISCARD_MAX: usize = 64 * 1024;

/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How long an upstream that stopped taking a request body has to answer it.
const EARLY_ANSWER: Duration = Duration::from_secs(1);

/// What the engine asks of the proxy it serves: routing, balancing, the reasons and
/// pages of its own answers, and the counts. The data plane's forwarder implements it.
pub trait Service: Sync {
    /// How a connection was made (plain, TLS with its SNI, a Gateway listener).
    type Via: Sync;
    /// A route a request matched.
    type Route: Sync;
    /// The routes held while a request is served (routes are borrowed from it).
    type Table: Send;
    /// Why the proxy answers a request itself; it says the status.
    type Reason: Copy + Send;

    /// The reason of a malformed request (400).
    const BAD_REQUEST: Self::Reason;

    /// The settings the engine reads.
    fn settings(&self) -> &Settings;
    /// The routes now.
    fn table(&self) -> Self::Table;
    /// Decides from a request alone where it goes.
    fn decide<'t, 'r>(
        &self,
        request: &RequestView<'r>,
        via: &Self::Via,
        table: &'t Self::Table,
    ) -> Decision<'t, 'r, Self::Route, Self::Reason>;
    /// Whether the connection came over TLS.
    fn is_tls(&self, via: &Self::Via) -> bool;
    /// Whether a peer's forwarding headers are kept (a balancer in front).
    fn trusted(&self, peer: IpAddr) -> bool;
    /// The status a reason answers with.
    fn status(&self, reason: Self::Reason) -> StatusCode;
    /// The reason and the detail (the error with its sources) of a failure.
    fn failed(&self, failure: &Failure) -> (Self::Reason, String);
    /// An error answer's status and page (counted in the error metrics).
    fn error_page(&self, reason: Self::Reason, detail: String) -> (StatusCode, String);
    /// Counts an answered request, under its route if it matched one.
    fn count(&self, route: Option<&Self::Route>, status: u16, took: Duration);
    /// Where a request's attempts start among its route's endpoints.
    fn first_index(&self, route: &Self::Route) -> usize;
    /// Where attempt `attempt` goes, not to `tried` (set to the endpoint picked).
    fn target<'b>(
        &self,
        route: &'b Self::Route,
        attempt: usize,
        start: usize,
        tried: &mut Option<SocketAddr>,
    ) -> impl Future<Output = Target<'b>> + Send;
    /// Connecting to `endpoint` (the one `target` picked, if any) failed.
    fn connect_failed(
        &self,
        route: &Self::Route,
        endpoint: Option<SocketAddr>,
        error: &ConnectError,
    );
    /// An upstream connection was opened.
    fn connection_opened(&self);
    /// An upstream's response head came `took` after the request went.
    fn upstream_answered(&self, took: Duration);
    /// Shutting down: keep-alive connections close after their next response.
    fn draining(&self) -> bool;
    /// The upgraded tunnels.
    fn tunnels(&self) -> &Tunnels;
    /// A request on `route` that its rule's retry policy would send again: whether the
    /// proxy's retry budget lets it (counted either way).
    fn retry(&self, route: &Self::Route) -> bool;
    /// Whether requests are logged ([`Service::log`]); read once per connection. Off, the
    /// engine keeps nothing for a log line.
    fn logs(&self) -> bool {
        false
    }
    /// An answered request, for the access log (called only when [`Service::logs`]).
    fn log(&self, route: Option<&Self::Route>, via: &Self::Via, served: &Served<'_, Self::Reason>) {
        let _ = (route, via, served);
    }
}

/// What the access log says of a request the engine answered.
#[derive(Debug)]
pub struct Served<'a, R> {
    /// When its head was read (wall clock).
    pub time: SystemTime,
    /// The connection's peer.
    pub peer: std::net::IpAddr,
    /// The method ("" when the head was not read far enough).
    pub method: &'a str,
    /// The host routed by (Host or the target's authority).
    pub host: &'a str,
    /// The path as sent.
    pub path: &'a str,
    /// The query, without its `?`.
    pub query: Option<&'a str>,
    /// The request was HTTP/1.0.
    pub http10: bool,
    /// The status answered.
    pub status: u16,
    /// Bytes read from the client: the head, and the body as far as it was read.
    pub received: u64,
    /// Bytes written to the client (a tunnel's after its 101 are not counted).
    pub sent: u64,
    /// From the head read to the answer written.
    pub took: Duration,
    /// From the request sent upstream to the response head back, when one came.
    pub upstream_took: Option<Duration>,
    /// The endpoint (or name) the last attempt went to.
    pub upstream: Option<&'a str>,
    /// Why the proxy answered itself, when it did.
    pub reason: Option<R>,
    /// The request's id (`X-Request-Id`, sent upstream).
    pub request_id: &'a str,
    /// Its place in a trace, when the proxy traces.
    pub trace: Option<&'a crate::trace::TraceContext>,
    /// Attempts made upstream (connections tried, and a retry's).
    pub attempts: u32,
    /// The request's `Referer`, `User-Agent`, first `X-Forwarded-For` and `traceparent`.
    pub referer: Option<&'a str>,
    /// See `referer`.
    pub user_agent: Option<&'a str>,
    /// See `referer`.
    pub forwarded_for: Option<&'a str>,
    /// See `referer`.
    pub traceparent: Option<&'a str>,
}

/// What a request's log line needs that the engine does not keep otherwise: its words,
/// copied out of the read buffer (which a body's reads compact), the bytes each way, the
/// upstream. One per connection, reused: once its strings have grown, a request copies
/// without allocating.
#[derive(Debug, Default)]
struct Account {
    time: Option<SystemTime>,
    received: u64,
    sent: u64,
    upstream_took: Option<Duration>,
    upstream: String,
    /// The fields of [`Field`], one after the other; `ends[f]` is where field `f` ends.
    text: String,
    ends: [usize; FIELDS],
    /// Which fields were there (an empty one differs from none).
    present: u8,
}

/// The text fields of an [`Account`], in order.
#[derive(Debug, Clone, Copy)]
enum Field {
    Method,
    Host,
    Path,
    Query,
    Referer,
    UserAgent,
    ForwardedFor,
    Traceparent,
}

const FIELDS: usize = 8;

impl Account {
    /// A new request whose head is `head_len` bytes.
    fn begin(&mut self, head_len: usize) {
        self.time = Some(SystemTime::now());
        self.received = head_len as u64;
        self.sent = 0;
        self.upstream_took = None;
        self.upstream.clear();
        self.text.clear();
        // A connection keeps its buffers, but not at a huge head's size.
        self.text.shrink_to(4 << 10);
        self.ends = [0; FIELDS];
        self.present = 0;
    }

    /// Appends `field` (fields are appended in [`Field`]'s order).
    fn put(&mut self, field: Field, value: Option<&str>) {
        if let Some(v) = value {
            self.text.push_str(v);
            self.present |= 1 << field as u8;
        }
        let end = self.text.len();
        self.ends[field as usize..].fill(end);
    }

    fn get(&self, field: Field) -> Option<&str> {
        if self.present & (1 << field as u8) == 0 {
            return None;
        }
        let i = field as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..self.ends[i])
    }
}

/// What the engine reads of the proxy's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Connecting to an upstream endpoint.
    pub connect_timeout: Duration,
    /// From sending the request to the upstream's response head.
    pub response_timeout: Duration,
    /// Longest wait for the next bytes of a request body; then 408.
    pub body_read_timeout: Duration,
    /// Largest request body forwarded, in bytes (0: no limit); larger gets 413.
    pub max_request_body: u64,
    /// Idle upstream connections kept per endpoint, by each worker.
    pub pool_idle_per_host: usize,
    /// Upgrade protocols forwarded (lower case; never h2c).
    pub allow_upgrade: Vec<String>,
    /// The loop-detection header, added upstream and removed from responses.
    pub loop_header: &'static str,
    /// This proxy's token in it.
    pub loop_token: HeaderValue,
    /// Tracing, with the ratio of new traces sampled (None: off; `traceparent` passes
    /// as it came).
    pub trace_ratio: Option<f64>,
}

/// What the engine needs of its listener.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A whole head within this, from its first byte.
    pub header_read: Duration,
    /// No request for this long: the connection is closed.
    pub idle: Duration,
    /// A write to the client that makes no progress for this long closes it.
    pub send: Duration,
}

/// How a connection ends after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    KeepAlive,
    Close,
}

/// What came of reading a request head.
enum Read {
    /// A whole head of this length at `start`.
    Head(usize),
    /// The connection starts with the HTTP/2 preface.
    H2,
    /// The client closed (or idled out, or the proxy is draining) between requests.
    Gone,
    /// Answer with this status and close.
    Refuse(u16),
}

/// One client connection's buffers and parse state, reused by all its requests.
pub struct H1Conn<'f, F: Service, S> {
    io: S,
    service: &'f F,
    /// Bytes read from the client: `buf[start..end]` is not consumed yet.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes read from the upstream.
    up: Vec<u8>,
    up_start: usize,
    up_end: usize,
    head: RequestHead,
    /// Where the current request's head starts in `buf` (its spans count from there, until
    /// the buffer is compacted while its body is read).
    head_at: usize,
    /// The current request is HEAD (its answer has no body).
    head_request: bool,
    /// The current request is GET.
    get: bool,
    /// The upstream answered before the client's body was read whole.
    body_cut: bool,
    response: ResponseHead,
    out: Vec<u8>,
    /// Where the upstream head's runs are: kept in `buf` (from `head_at`) or in `out`.
    pieces: Vec<Run>,
    limits: Limits,
    timeouts: Timeouts,
    /// The timer of the waits every keep-alive request makes ([`super::timer`]).
    timer: Timer,
    /// The current request's wait for each response head (its rule's, else the proxy's
    /// response timeout; `Duration::MAX` none).
    wait: Duration,
    /// The current request's body limit in bytes (its route's under the proxy's; 0 none).
    max_body: u64,
    /// The current request's connect timeout (its route's, else the proxy's).
    connect_wait: Duration,
    /// The current request's limit on each write upstream (its route's, else the wait's,
    /// at most the proxy's response timeout).
    send_wait: Duration,
    /// When the current request's rule says it must have its response head by, and the
    /// rule's limit.
    deadline: Option<(Instant, Duration)>,
    peer: SocketAddr,
    port: u16,
    requests: u64,
    /// The access log is on ([`Service::logs`]).
    logs: bool,
    /// The current request's account for the access log (kept only when `logs`).
    account: Account,
    /// Why the current request was answered here, if it was.
    reason: Option<F::Reason>,
    /// The current request's id.
    request_id: RequestId,
    /// The current request's trace context (when tracing), and its `traceparent`.
    trace: Option<crate::trace::TraceContext>,
    traceparent: [u8; crate::trace::TRACEPARENT_LEN],
    /// Attempts the current request made upstream.
    attempts: u32,
}

/// An error relaying bytes, and on which side.
#[derive(Debug)]
enum Relay {
    /// The client went away, or stopped reading past the send timeout.
    Client,
    /// The upstream failed mid-body.
    Upstream(std::io::Error),
}

impl<'f, F, S> H1Conn<'f, F, S>
where
    F: Service,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// A connection's state, its buffers empty.
    pub fn new(
        io: S,
        service: &'f F,
        limits: Limits,
        timeouts: Timeouts,
        peer: SocketAddr,
        port: u16,
    ) -> Self {
        H1Conn {
            io,
            service,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            up: vec![0; READ_CHUNK],
            up_start: 0,
            up_end: 0,
            head: RequestHead::default(),
            head_at: 0,
            head_request: false,
            get: false,
            body_cut: false,
            response: ResponseHead::default(),
            out: Vec::with_capacity(1024),
            pieces: Vec::with_capacity(MAX_PIECES + 1),
            limits,
            timeouts,
            timer: Timer::new(),
            wait: service.settings().response_timeout,
            deadline: None,
            max_body: 0,
            connect_wait: service.settings().connect_timeout,
            send_wait: service.settings().response_timeout,
            peer,
            port,
            requests: 0,
            logs: service.logs(),
            account: Account::default(),
            reason: None,
            request_id: RequestId::new_random(),
            trace: None,
            traceparent: [0; crate::trace::TRACEPARENT_LEN],
            attempts: 0,
        }
    }

    /// Serves requests until the connection ends. Err(stream, bytes) when it turned out to
    /// be HTTP/2: the caller serves it with hyper, replaying the bytes read.
    pub async fn serve(
        mut self,
        via: &F::Via,
        draining: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), (S, Vec<u8>)> {
        loop {
            let len = match self.read_head(draining).await {
                Read::Head(len) => len,
                Read::H2 => {
                    let bytes = self.buf[self.start..self.end].to_vec();
                    return Err((self.io, bytes));
                }
                Read::Gone => return Ok(()),
                Read::Refuse(status) => {
                    let reason = if status == 431 {
                        None
                    } else {
                        Some(F::BAD_REQUEST)
                    };
                    let started = clock::now();
                    self.begin(self.end - self.start);
                    self.request_id = RequestId::new_random();
                    let _ = self
                        .answer_status(status, reason, "bad request head", true)
                        .await;
                    self.log(via, None, status, started);
                    return Ok(());
                }
            };
            self.requests += 1;
            let started = clock::now();
            let next = self.request(len, via, started).await;
            if next == Next::Close || *draining.borrow() {
                let send = Until::After(self.timeouts.send);
                let _ = self.timer.within(send, self.io.shutdown()).await;
                return Ok(());
            }
        }
    }

    /// Reads the next request head: Gone when the client closes or stays idle before its
    /// first byte, or the proxy drains.
    async fn read_head(&mut self, draining: &mut tokio::sync::watch::Receiver<bool>) -> Read {
        let mut end = HeadEnd::default();
        let mut first_byte: Option<Instant> = None;
        self.head_request = false;
        loop {
            // Empty lines before a request line are skipped (RFC 9112 §2.2: some clients
            // send a CRLF after a body); they count as the head's first bytes.
            while end.scanned() == 0 && self.buf[self.start..self.end].starts_with(b"\r\n") {
                self.start += 2;
                first_byte.get_or_insert_with(clock::now);
            }
            let have = &self.buf[self.start..self.end];
            if self.requests == 0 && !have.is_empty() {
                let n = have.len().min(H2_PREFACE.len());
                if have[..n] == H2_PREFACE[..n] {
                    if n == H2_PREFACE.len() {
                        return Read::H2;
                    }
                } else if let Some(len) = end.find(have) {
                    return Read::Head(len);
                }
            } else if let Some(len) = end.find(have) {
                return Read::Head(len);
            }
            if have.len() >= self.limits.max_bytes {
                return Read::Refuse(431);
            }
            // The head's first byte is the time of the wait that read it, taken when the
            // head turns out not to be whole with it (most are).
            let until = match first_byte {
                None if self.start == self.end => Until::After(self.timeouts.idle),
                None => {
                    let now = clock::now();
                    first_byte = Some(now);
                    Until::after(now, self.timeouts.header_read)
                }
                Some(at) => Until::after(at, self.timeouts.header_read),
            };
            let idle = first_byte.is_none() && self.start == self.end;
            let read = tokio::select! {
                r = self.timer.within(until, fill(&mut self.io, &mut self.buf, &mut self.start, &mut self.end, self.limits.max_bytes + READ_CHUNK)) => r,
                _ = draining.wait_for(|d| *d), if idle => return Read::Gone,
            };
            match read {
                Ok(Ok(0)) | Ok(Err(_)) => return Read::Gone,
                Ok(Ok(_)) => {}
                // Idle between requests, or a head not whole in time: closed either way.
                Err(_) => return Read::Gone,
            }
        }
    }

    /// Handles one request whose head is `buf[start..start + len]`.
    async fn request(&mut self, len: usize, via: &F::Via, started: Instant) -> Next {
        let head_at = self.start;
        self.head_at = head_at;
        self.head_request = false;
        self.begin(len);
        let parsed = {
            let buf = &self.buf[head_at..self.end];
            self.head.parse(buf, len, self.limits)
        };
        let method = self.head.method.of(&self.buf[head_at..]);
        self.head_request = parsed.is_ok() && method == b"HEAD";
        self.get = parsed.is_ok() && method == b"GET";
        if let Err(e) = parsed {
            let (status, reason) = match &e {
                HeadError::TooLarge | HeadError::TooManyHeaders => (431, None),
                HeadError::Version => (505, None),
                _ => (400, Some(F::BAD_REQUEST)),
            };
            let detail = format!("bad request: {e}");
            let _ = self.answer_status(status, reason, &detail, true).await;
            self.request_id = RequestId::new_random();
            self.log(via, None, status, started);
            return Next::Close;
        }
        let table = self.service.table();
        let buf = &self.buf[head_at..self.end];
        let trusted = self.service.trusted(self.peer.ip());
        self.request_id = RequestId::choose(
            self.head
                .headers
                .iter()
                .find(|h| h.known == super::Known::RequestId)
                .map(|h| h.value.of(buf)),
            trusted,
        );
        if let Some(ratio) = self.service.settings().trace_ratio {
            let incoming = self
                .head
                .headers
                .iter()
                .find(|h| h.known == super::Known::Traceparent)
                .map(|h| h.value.of(buf));
            let ctx = crate::trace::TraceContext::start(incoming, ratio);
            self.traceparent = ctx.traceparent();
            self.trace = Some(ctx);
        }
        let text = |s: super::Span| std::str::from_utf8(s.of(buf)).ok();
        let headers = HeadHeaders {
            head: &self.head,
            buf,
        };
        let view = RequestView {
            method: text(self.head.method).unwrap_or_default(),
            host: self.head.routing_host().and_then(text),
            path: if self.head.form == Some(TargetForm::Asterisk) {
                "*"
            } else {
                text(self.head.path).unwrap_or_default()
            },
            query: self.head.query.and_then(text),
            headers: &headers,
            peer: Some(self.peer.ip()),
            bodyless: matches!(
                self.head.framing(),
                BodyFraming::Empty | BodyFraming::Length(0)
            ),
            request_id: self.request_id.as_str(),
        };
        if self.logs {
            keep_words(&mut self.account, &view, &headers);
        }
        let decision = self.service.decide(&view, via, &table);
        let (route, upgrade, (response_changes, retry, _hold, start)) = match decision {
            Decision::Forward(r) => {
                let upgrade = self.head.minor == 1
                    && self.head.upgrade
                    && upgrade_allowed(&headers, &self.service.settings().allow_upgrade);
                let settings = self.service.settings();
                let target = match &r.forward_path {
                    Some(pq) => pq.as_str().as_bytes(),
                    None => origin_target(&self.head, buf),
                };
                let onward = Onward {
                    target,
                    hop: Hop {
                        client: self.peer.ip(),
                        port: self.port,
                        proto: if self.service.is_tls(via) {
                            "https"
                        } else {
                            "http"
                        },
                        host: r.raw_host,
                        trusted,
                    },
                    keep_upgrade: upgrade,
                    loop_header: (settings.loop_header, settings.loop_token.as_bytes()),
                    changes: r.header_changes,
                    upstream_host: r.upstream_host,
                    request_id: self.request_id.as_bytes(),
                    traceparent: self
                        .trace
                        .filter(crate::trace::TraceContext::replaces_client)
                        .map(|_| &self.traceparent[..]),
                    drop_tracestate: self.trace.is_some_and(|t| t.parent.is_none()),
                };
                let rule = r.timeouts.copied().unwrap_or_default();
                self.wait = rule.backend.unwrap_or(settings.response_timeout);
                self.max_body = crate::routing::body_limit(settings.max_request_body, r.max_body);
                self.connect_wait = rule.connect.unwrap_or(settings.connect_timeout);
                // A rule's "no limit" is on the wait for an answer: writes keep the
                // proxy's, unless the route sets its own.
                self.send_wait = rule
                    .send
                    .unwrap_or(self.wait.min(settings.response_timeout));
                self.deadline = rule
                    .request
                    .and_then(|d| Some((started.checked_add(d)?, d)));
                plan_upstream_head(&mut self.out, &mut self.pieces, &self.head, buf, &onward);
                (
                    r.route,
                    upgrade,
                    (r.response_changes, r.retry, r.hold, r.start),
                )
            }
            Decision::Refuse {
                reason,
                detail,
                route,
            } => {
                let close = self.head.close || !self.discardable();
                let status = self.service.status(reason).as_u16();
                let _ = self.answer(reason, detail, close).await;
                self.count(via, route, status, started);
                return self.after_answer(len, close).await;
            }
            Decision::Redirect { status, location } => {
                let close = self.head.close || !self.discardable();
                let _ = self.redirect(status, &location, close).await;
                self.count(via, None, status, started);
                return self.after_answer(len, close).await;
            }
            Decision::Answer { status, headers } => {
                let close = self.head.close || !self.discardable();
                let _ = self.answer_with(status, &headers, close).await;
                self.count(via, None, status, started);
                return self.after_answer(len, close).await;
            }
        };
        let body = self.head.framing();
        let max = self.max_body;
        if let BodyFraming::Length(n) = body
            && max > 0
            && n > max
        {
            let (reason, detail) = self.service.failed(&Failure::DeclaredTooLarge(n));
            let _ = self.answer(reason, detail, true).await;
            self.count(via, Some(route), 413, started);
            return Next::Close;
        }
        self.start = head_at + len;
        let (status, next) = self
            .forward(route, body, upgrade, response_changes.get(), (retry, start))
            .await;
        self.count(via, Some(route), status, started);
        next
    }

    /// Whether the body of a request answered here can be read and dropped to keep the
    /// connection: none, or one of at most [`DISCARD_MAX`] bytes that the client sends
    /// without waiting for a 100 Continue.
    fn discardable(&self) -> bool {
        match self.head.framing() {
            BodyFraming::Empty | BodyFraming::Length(0) => true,
            BodyFraming::Length(n) => n <= DISCARD_MAX as u64 && !self.head.expect_continue,
            BodyFraming::Chunked => !self.head.expect_continue,
            BodyFraming::UntilClose => false,
        }
    }

    /// After a request of `len` head bytes answered here: its body is read and dropped
    /// (within the body read timeout, at most [`DISCARD_MAX`] bytes of data, the chunked
    /// coding checked) and the next request follows, or the connection closes.
    async fn after_answer(&mut self, len: usize, close: bool) -> Next {
        self.start += len;
        if close {
            return Next::Close;
        }
        let dropped = match self.head.framing() {
            BodyFraming::Length(n) => self.discard_length(n).await,
            BodyFraming::Chunked => self.discard_chunked().await,
            _ => Ok(()),
        };
        match dropped {
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Close,
        }
    }

    async fn discard_length(&mut self, mut left: u64) -> Result<(), Exchange> {
        while left > 0 {
            if self.start == self.end {
                self.read_body_more().await?;
            }
            let n = ((self.end - self.start) as u64).min(left) as usize;
            self.start += n;
            self.account.received += n as u64;
            left -= n as u64;
        }
        Ok(())
    }

    async fn discard_chunked(&mut self) -> Result<(), Exchange> {
        let mut coding = Chunked::default();
        loop {
            if self.start == self.end {
                self.read_body_more().await?;
            }
            while self.start < self.end {
                let piece = coding
                    .next(&self.buf[self.start..self.end])
                    .map_err(|_| Exchange::ClientGone)?;
                self.account.received += piece.bytes() as u64;
                match piece {
                    Piece::Framing(n) | Piece::Data(n) | Piece::Trailer(n) => self.start += n,
                    Piece::End(n) => {
                        self.start += n;
                        return Ok(());
                    }
                }
                if coding.data_len() > DISCARD_MAX as u64 {
                    return Err(Exchange::ClientGone);
                }
            }
        }
    }

    /// Counts an answered request in the route's (or the unrouted) metrics, and logs it.
    fn count(&self, via: &F::Via, route: Option<&F::Route>, status: u16, started: Instant) {
        let took = clock::now().duration_since(started);
        self.service.count(route, status, took);
        self.log(via, route, status, started);
    }

    /// A new request whose head is `len` bytes: nothing of the last one's answer is kept.
    fn begin(&mut self, len: usize) {
        self.reason = None;
        self.trace = None;
        self.attempts = 0;
        if self.logs {
            self.account.begin(len);
        }
    }

    /// Logs an answered request, when the access log is on.
    fn log(&self, via: &F::Via, route: Option<&F::Route>, status: u16, started: Instant) {
        if !self.logs {
            return;
        }
        let a = &self.account;
        let served = Served {
            time: a.time.unwrap_or_else(SystemTime::now),
            peer: self.peer.ip(),
            method: a.get(Field::Method).unwrap_or_default(),
            host: a.get(Field::Host).unwrap_or_default(),
            path: a.get(Field::Path).unwrap_or_default(),
            query: a.get(Field::Query),
            http10: self.head.minor == 0,
            status,
            received: a.received,
            sent: a.sent,
            took: clock::now().duration_since(started),
            upstream_took: a.upstream_took,
            upstream: Some(a.upstream.as_str()).filter(|u| !u.is_empty()),
            reason: self.reason,
            request_id: self.request_id.as_str(),
            trace: self.trace.as_ref(),
            attempts: self.attempts,
            referer: a.get(Field::Referer),
            user_agent: a.get(Field::UserAgent),
            forwarded_for: a.get(Field::ForwardedFor),
            traceparent: a.get(Field::Traceparent),
        };
        self.service.log(route, via, &served);
    }

    /// Forwards the request whose upstream head is in `out` and whose body starts at
    /// `start`: at most two attempts on different endpoints, the second only while no
    /// byte of the body has gone. The status answered and what follows.
    async fn forward(
        &mut self,
        route: &F::Route,
        body: BodyFraming,
        upgrade: bool,
        changes: Option<&HeaderChanges>,
        (retry, start): (Option<&Retry>, Option<usize>),
    ) -> (u16, Next) {
        // A sticky session's endpoint first, else the backend's round robin.
        let mut index = start.unwrap_or_else(|| self.service.first_index(route));
        let mut tried = None;
        let mut failure = Failure::NoEndpoint;
        // A rule's retry policy sends again only a request that can go twice.
        let has_body = !matches!(body, BodyFraming::Empty | BodyFraming::Length(0));
        let retry = retry.filter(|_| {
            Retry::safe(self.head.method.of(&self.buf[self.head_at..]), has_body) && !upgrade
        });
        let mut retried = 0;
        'retry: loop {
            for attempt in 0..2 {
                // Past the rule's deadline nothing more is tried (below: 504).
                if self.past_deadline() {
                    break 'retry;
                }
                let (key, number, authority, permit) =
                    match self.service.target(route, attempt, index, &mut tried).await {
                        Target::Go(key, number, authority, permit) => {
                            (key, number, authority, permit)
                        }
                        Target::Busy(endpoint) => {
                            failure = Failure::Busy(endpoint);
                            continue;
                        }
                        Target::None => break,
                    };
                self.attempts += 1;
                if self.logs {
                    self.account.upstream.clear();
                    write_key(&mut self.account.upstream, &key);
                }
                let (mut upstream, reused) = match self.connection(&key, number, upgrade).await {
                    Ok(c) => c,
                    // The rule's deadline cut the connect, not the endpoint: not ejected.
                    Err(_) if self.past_deadline() => break 'retry,
                    Err(e) => {
                        self.service.connect_failed(route, tried, &e);
                        failure = Failure::Connect {
                            authority: authority.to_string(),
                            source: e,
                        };
                        continue;
                    }
                };
                let sent = clock::now();
                let mut exchanged = self.exchange(&mut upstream, body).await;
                // A pooled connection the upstream closed meanwhile fails before any byte of
                // an answer: a request without a body goes again on a new one.
                if reused
                    && body == BodyFraming::Empty
                    && (self.get || self.head_request)
                    && matches!(exchanged, Err(Exchange::Stale))
                {
                    match self.connection(&key, number, true).await {
                        Ok((fresh, _)) => {
                            upstream = fresh;
                            exchanged = self.exchange(&mut upstream, body).await;
                        }
                        Err(e) => {
                            failure = Failure::Connect {
                                authority: authority.to_string(),
                                source: e,
                            };
                            break;
                        }
                    }
                }
                match exchanged {
                    Ok(()) => {
                        let took = clock::now().duration_since(sent);
                        self.service.upstream_answered(took);
                        self.account.upstream_took = Some(took);
                        if let Some(policy) = retry
                            && policy.wants(self.response.status, retried)
                            && self.service.retry(route)
                        {
                            // The answer is dropped with its connection, unread.
                            drop((upstream, permit));
                            retried += 1;
                            if !policy.backoff.is_zero() {
                                let by = self.by(policy.backoff);
                                let _ = self.timer.within(by, std::future::pending::<()>()).await;
                            }
                            index = self.service.first_index(route);
                            tried = None;
                            continue 'retry;
                        }
                        return self
                            .relay_response(upstream, key, number, upgrade, permit, changes)
                            .await;
                    }
                    Err(Exchange::Refused(failure)) => {
                        let (reason, detail) = self.service.failed(&failure);
                        let _ = self.answer(reason, detail, true).await;
                        return (self.service.status(reason).as_u16(), Next::Close);
                    }
                    Err(Exchange::ClientGone) => return (499, Next::Close),
                    Err(Exchange::Timeout) => {
                        failure = Failure::Timeout(self.wait);
                        break;
                    }
                    Err(Exchange::Stale) => {
                        let e = std::io::Error::other("the upstream closed the connection");
                        failure = Failure::Upstream {
                            authority: authority.to_string(),
                            source: e.into(),
                        };
                        break;
                    }
                    Err(Exchange::Upstream(e)) => {
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
        // Past the rule's deadline, whatever failed last, the request timed out.
        if let Some((deadline, limit)) = self.deadline
            && clock::now() >= deadline
        {
            failure = Failure::Timeout(limit);
        }
        let (reason, detail) = self.service.failed(&failure);
        let _ = self.answer(reason, detail, true).await;
        (self.service.status(reason).as_u16(), Next::Close)
    }

    /// Whether the request's rule deadline has passed.
    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|(d, _)| clock::now() >= d)
    }

    /// The earlier of `after` from now and the request's deadline.
    fn by(&self, after: Duration) -> Until {
        match (
            self.deadline.map(|d| d.0),
            Until::after(clock::now(), after),
        ) {
            (None, own) => own,
            (Some(deadline), Until::At(at)) => Until::At(at.min(deadline)),
            (Some(deadline), _) => Until::At(deadline),
        }
    }

    /// A pooled connection to `key` (checked still open), or a new one; an upgrade always
    /// gets a new one. True when it came from the pool.
    async fn connection(
        &mut self,
        key: &Key,
        number: Number,
        fresh: bool,
    ) -> Result<(Stream, bool), ConnectError> {
        // A GET or HEAD without a body goes again on a new connection if a pooled one
        // turns out closed (nothing of an answer came): it needs no check before.
        let check = !(self.head_request || self.get) || self.head.framing() != BodyFraming::Empty;
        if !fresh && let Some(up) = take_idle(number, key, check) {
            return Ok((up, true));
        }
        let by = self.by(self.connect_wait);
        let stream = self
            .timer
            .within(by, crate::upstream::open(key))
            .await
            .unwrap_or(Err(ConnectError::Timeout))?;
        let _ = stream.set_nodelay(true);
        self.service.connection_opened();
        Ok((stream, false))
    }

    /// Sends the head in `out` and the request body to `upstream`, then reads the
    /// response head into `response` (interim answers skipped, as hyper does). An
    /// `Expect: 100-continue` client is told to go on once the head has gone (hyper's
    /// server does the same when the body is first read). An upstream that stops taking
    /// the body and answers early is answered with: `body_cut` then says the client's
    /// body was not read whole, so neither connection can carry another request.
    async fn exchange(&mut self, upstream: &mut Stream, body: BodyFraming) -> Result<(), Exchange> {
        self.up_start = 0;
        self.up_end = 0;
        self.body_cut = false;
        // The body's first bytes, already read, go with the head in one write.
        let first = match body {
            BodyFraming::Length(n) => (self.end - self.start).min(n as usize),
            _ => 0,
        };
        let planned = self.pieces.len();
        if first > 0 {
            let at = self.start - self.head_at;
            self.pieces.push(Run::Kept(at, at + first));
        }
        let wrote = self.write_up(upstream, None).await;
        self.pieces.truncate(planned);
        if wrote.is_err() {
            return Err(Exchange::Stale);
        }
        self.start += first;
        self.account.received += first as u64;
        let body_left = match body {
            BodyFraming::Length(n) => n > first as u64,
            BodyFraming::Chunked => true,
            _ => false,
        };
        if body_left && self.head.expect_continue && self.head.minor == 1 {
            let send = Until::After(self.timeouts.send);
            let go_on = self
                .timer
                .within(send, write_flushed(&mut self.io, CONTINUE));
            if !matches!(go_on.await, Ok(Ok(()))) {
                return Err(Exchange::ClientGone);
            }
            self.account.sent += CONTINUE.len() as u64;
        }
        let sent = match body {
            BodyFraming::Length(n) => self.relay_length_up(upstream, n - first as u64).await,
            BodyFraming::Chunked => self.relay_chunked_up(upstream).await,
            _ => Ok(()),
        };
        match sent {
            Ok(()) => {}
            // The upstream stopped taking the body: it may have answered already (a 413
            // or 401 before the body), which the client gets; otherwise it failed.
            Err(Exchange::Upstream(e)) => {
                self.body_cut = true;
                let by = Until::after(clock::now(), EARLY_ANSWER);
                return match self.read_final(upstream, by).await {
                    Ok(()) => Ok(()),
                    Err(_) => Err(Exchange::Upstream(e)),
                };
            }
            Err(other) => return Err(other),
        }
        self.read_final(upstream, self.by(self.wait)).await
    }

    /// Writes `buf[from..to]` to the upstream, or with `None` the planned head (and the
    /// body's first bytes) in one vectored write, within the response timeout.
    async fn write_up(
        &mut self,
        upstream: &mut Stream,
        bytes: Option<(usize, usize)>,
    ) -> std::io::Result<()> {
        let by = self.by(self.send_wait);
        let written = match bytes {
            Some((from, to)) => {
                let data = &self.buf[from..to];
                self.timer.within(by, write_flushed(upstream, data)).await
            }
            None => {
                let base = &self.buf[self.head_at..];
                let write = async {
                    write_runs(upstream, &self.pieces, base, &self.out).await?;
                    upstream.flush().await
                };
                self.timer.within(by, write).await
            }
        };
        match written {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the upstream took no bytes within the response timeout",
            )),
        }
    }

    /// Reads response heads until a final one, `by` then (else `Exchange::Timeout`);
    /// interim ones (100, 103) are skipped.
    async fn read_final(&mut self, upstream: &mut Stream, by: Until) -> Result<(), Exchange> {
        let mut received = false;
        loop {
            if !self.read_response(upstream, received, by).await? {
                return Ok(());
            }
            received = true;
        }
    }

    /// Reads one response head. Ok(true): it was interim (and skipped); Ok(false): final.
    /// `received`: part of an answer came already, so a close is a failure, not a stale
    /// connection.
    async fn read_response(
        &mut self,
        upstream: &mut Stream,
        received: bool,
        by: Until,
    ) -> Result<bool, Exchange> {
        let mut end = HeadEnd::default();
        let len = loop {
            if let Some(len) = end.find(&self.up[self.up_start..self.up_end]) {
                break len;
            }
            if self.up_end - self.up_start >= MAX_RESPONSE_HEAD {
                return Err(Exchange::Upstream(std::io::Error::other(
                    "response head too large",
                )));
            }
            let read = self.timer.within(
                by,
                fill(
                    upstream,
                    &mut self.up,
                    &mut self.up_start,
                    &mut self.up_end,
                    MAX_RESPONSE_HEAD + READ_CHUNK,
                ),
            );
            let Ok(read) = read.await else {
                return Err(Exchange::Timeout);
            };
            let nothing_yet = !received && self.up_end == self.up_start;
            match read {
                Ok(0) if nothing_yet => return Err(Exchange::Stale),
                Ok(0) => {
                    return Err(Exchange::Upstream(std::io::Error::other(
                        "the upstream closed mid-head",
                    )));
                }
                Ok(_) => {}
                Err(_) if nothing_yet => return Err(Exchange::Stale),
                Err(e) => return Err(Exchange::Upstream(e)),
            }
        };
        self.response
            .parse(&self.up[self.up_start..self.up_end], len, self.head_request)
            .map_err(|e| Exchange::Upstream(std::io::Error::other(e.to_string())))?;
        if self.response.is_interim() {
            self.up_start += len;
            return Ok(true);
        }
        Ok(false)
    }

    /// Relays `left` bytes of a Content-Length body from the client to `upstream`.
    async fn relay_length_up(
        &mut self,
        upstream: &mut Stream,
        mut left: u64,
    ) -> Result<(), Exchange> {
        while left > 0 {
            if self.start == self.end {
                self.read_body_more().await?;
            }
            let n = ((self.end - self.start) as u64).min(left) as usize;
            self.write_up(upstream, Some((self.start, self.start + n)))
                .await
                .map_err(Exchange::Upstream)?;
            self.start += n;
            self.account.received += n as u64;
            left -= n as u64;
        }
        Ok(())
    }

    /// Relays a chunked body from the client to `upstream`, its coding as it came but for
    /// trailer fields (dropped), checking it and `--max-request-body` as it passes.
    async fn relay_chunked_up(&mut self, upstream: &mut Stream) -> Result<(), Exchange> {
        let max = self.max_body;
        let mut coding = Chunked::default();
        loop {
            if self.start == self.end {
                self.read_body_more().await?;
            }
            let mut run = self.start;
            let mut done = false;
            while self.start < self.end && !done {
                let piece = coding
                    .next(&self.buf[self.start..self.end])
                    .map_err(|e| Exchange::Refused(Failure::BadBody(e.to_string())))?;
                self.account.received += piece.bytes() as u64;
                match piece {
                    Piece::Framing(n) | Piece::Data(n) => self.start += n,
                    Piece::End(n) => {
                        self.start += n;
                        done = true;
                    }
                    Piece::Trailer(n) => {
                        if self.start > run {
                            self.write_up(upstream, Some((run, self.start)))
                                .await
                                .map_err(Exchange::Upstream)?;
                        }
                        self.start += n;
                        run = self.start;
                    }
                }
                if max > 0 && coding.data_len() > max {
                    return Err(Exchange::Refused(Failure::BodyTooLarge));
                }
            }
            if self.start > run {
                self.write_up(upstream, Some((run, self.start)))
                    .await
                    .map_err(Exchange::Upstream)?;
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Reads more of a request body, within the body read timeout.
    async fn read_body_more(&mut self) -> Result<(), Exchange> {
        let timeout = self.service.settings().body_read_timeout;
        let read = self
            .timer
            .within(
                Until::After(timeout),
                fill(
                    &mut self.io,
                    &mut self.buf,
                    &mut self.start,
                    &mut self.end,
                    READ_CHUNK * 4,
                ),
            )
            .await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => Err(Exchange::ClientGone),
            Ok(Ok(_)) => Ok(()),
            Err(_) => Err(Exchange::Refused(Failure::BodyStalled)),
        }
    }

    /// Sends the response whose head is in `response` to the client and relays its
    /// body; pools the upstream connection when it can carry another request.
    async fn relay_response(
        &mut self,
        mut upstream: Stream,
        key: Key,
        number: Number,
        upgrade: bool,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        changes: Option<&HeaderChanges>,
    ) -> (u16, Next) {
        let status = self.response.status;
        let len = self.response.len;
        let framing = self.response.framing();
        let client_http10 = self.head.minor == 0;
        // What the client can be sent: a chunked body as it is to HTTP/1.1, its data
        // alone to HTTP/1.0 (then delimited by the close); a body read until the
        // upstream closes is delimited by the close too.
        let pass_chunked = framing == BodyFraming::Chunked && !client_http10;
        let switched = status == 101 && upgrade;
        if status == 101 && !upgrade {
            // A switch nobody asked for (Upgrade was not forwarded): the upstream broke
            // the exchange.
            let why = Failure::Upstream {
                authority: key_authority(&key),
                source: "101 Switching Protocols to a request that did not upgrade".into(),
            };
            let (reason, detail) = self.service.failed(&why);
            let _ = self.answer(reason, detail, true).await;
            return (self.service.status(reason).as_u16(), Next::Close);
        }
        let close = self.head.close
            || self.body_cut
            || self.service.draining()
            || framing == BodyFraming::UntilClose
            || (framing == BodyFraming::Chunked && client_http10);
        with_date(|date_line| {
            let back = Back {
                upgrade,
                chunked: pass_chunked,
                close: close && !switched,
                keep_alive: !close && client_http10,
                loop_header: self.service.settings().loop_header,
                date_line,
                changes,
            };
            let buf = &self.up[self.up_start..self.up_end];
            write_downstream_head(&mut self.out, &self.response, buf, &back);
        });
        self.up_start += len;
        if switched {
            return self.tunnel(upstream, permit).await;
        }
        let sent = match framing {
            BodyFraming::Empty => self.send_out().await,
            BodyFraming::Length(n) => self.relay_length_down(&mut upstream, n).await,
            BodyFraming::Chunked => self.relay_chunked_down(&mut upstream, !pass_chunked).await,
            BodyFraming::UntilClose => self.relay_until_close(&mut upstream).await,
        };
        drop(permit);
        match sent {
            Ok(()) => {
                let reusable =
                    !self.response.close && !self.body_cut && self.up_start == self.up_end;
                if reusable {
                    put_idle(
                        number,
                        key,
                        upstream,
                        self.service.settings().pool_idle_per_host,
                    );
                }
                (status, if close { Next::Close } else { Next::KeepAlive })
            }
            Err(cut) => {
                if let Relay::Upstream(error) = cut {
                    tracing::debug!(%error, "upstream failed mid-response; closing");
                }
                (status, Next::Close)
            }
        }
    }

    /// Writes `out` (a head, with any body bytes appended) to the client.
    async fn send_out(&mut self) -> Result<(), Relay> {
        let send = Until::After(self.timeouts.send);
        let write = write_flushed(&mut self.io, &self.out);
        match self.timer.within(send, write).await {
            Ok(Ok(())) => {
                self.account.sent += self.out.len() as u64;
                Ok(())
            }
            _ => Err(Relay::Client),
        }
    }

    /// Writes `bytes` of the upstream buffer to the client.
    async fn send_up_bytes(&mut self, from: usize, to: usize) -> Result<(), Relay> {
        let send = Until::After(self.timeouts.send);
        let write = write_flushed(&mut self.io, &self.up[from..to]);
        match self.timer.within(send, write).await {
            Ok(Ok(())) => {
                self.account.sent += (to - from) as u64;
                Ok(())
            }
            _ => Err(Relay::Client),
        }
    }

    /// Relays a Content-Length response body of `n` bytes.
    async fn relay_length_down(&mut self, upstream: &mut Stream, n: u64) -> Result<(), Relay> {
        let mut left = n;
        // The first bytes go with the head.
        let first = ((self.up_end - self.up_start) as u64).min(left) as usize;
        self.out
            .extend_from_slice(&self.up[self.up_start..self.up_start + first]);
        self.up_start += first;
        left -= first as u64;
        self.send_out().await?;
        while left > 0 {
            self.up_start = 0;
            self.up_end = 0;
            self.read_up_into(upstream).await?;
            let n = (self.up_end as u64).min(left) as usize;
            self.send_up_bytes(0, n).await?;
            self.up_start = n;
            left -= n as u64;
        }
        Ok(())
    }

    /// Relays a chunked response body, its coding kept (but for trailer fields, dropped)
    /// or (`data_only`) reduced to its data.
    async fn relay_chunked_down(
        &mut self,
        upstream: &mut Stream,
        data_only: bool,
    ) -> Result<(), Relay> {
        let mut coding = Chunked::default();
        self.send_out().await?;
        loop {
            let mut run = self.up_start;
            let mut done = false;
            while self.up_start < self.up_end && !done {
                let piece = coding
                    .next(&self.up[self.up_start..self.up_end])
                    .map_err(|e| Relay::Upstream(std::io::Error::other(e.to_string())))?;
                let (n, keep) = match piece {
                    Piece::Data(n) => (n, true),
                    Piece::Framing(n) => (n, !data_only),
                    Piece::End(n) => {
                        done = true;
                        (n, !data_only)
                    }
                    Piece::Trailer(n) => (n, false),
                };
                if !keep {
                    if self.up_start > run {
                        self.send_up_bytes(run, self.up_start).await?;
                    }
                    self.up_start += n;
                    run = self.up_start;
                } else {
                    self.up_start += n;
                }
            }
            if self.up_start > run {
                self.send_up_bytes(run, self.up_start).await?;
            }
            if done {
                return Ok(());
            }
            self.up_start = 0;
            self.up_end = 0;
            self.read_up_into(upstream).await?;
        }
    }

    /// Relays a response body that ends when the upstream closes.
    async fn relay_until_close(&mut self, upstream: &mut Stream) -> Result<(), Relay> {
        self.out
            .extend_from_slice(&self.up[self.up_start..self.up_end]);
        self.up_start = self.up_end;
        self.send_out().await?;
        loop {
            self.up_start = 0;
            self.up_end = 0;
            let n = match upstream.read(&mut self.up[..]).await {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) => return Err(Relay::Upstream(e)),
            };
            self.up_end = n;
            self.send_up_bytes(0, n).await?;
            self.up_start = n;
        }
    }

    /// Reads from the upstream into the emptied upstream buffer; the upstream closing
    /// here cuts a body short.
    async fn read_up_into(&mut self, upstream: &mut Stream) -> Result<(), Relay> {
        match upstream.read(&mut self.up[..]).await {
            Ok(0) => Err(Relay::Upstream(std::io::Error::other(
                "the upstream closed mid-body",
            ))),
            Ok(n) => {
                self.up_end = n;
                Ok(())
            }
            Err(e) => Err(Relay::Upstream(e)),
        }
    }

    /// A switch to an allowed upgrade: the 101 goes to the client, then both sides'
    /// bytes are copied under the tunnel idle timeout (the tunnel holds the endpoint's
    /// slot). The connection is the tunnel's from now on.
    async fn tunnel(
        &mut self,
        mut upstream: Stream,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> (u16, Next) {
        // What the upstream sent after its 101, and what the client sent after its
        // request, are the tunnel's first bytes.
        self.out
            .extend_from_slice(&self.up[self.up_start..self.up_end]);
        self.up_start = self.up_end;
        if self.send_out().await.is_err() {
            return (101, Next::Close);
        }
        if self.start < self.end {
            if upstream
                .write_all(&self.buf[self.start..self.end])
                .await
                .is_err()
            {
                return (101, Next::Close);
            }
            self.start = self.end;
        }
        let _permit = permit;
        self.service
            .tunnels()
            .run(&mut self.io, &mut upstream)
            .await;
        (101, Next::Close)
    }

    /// A local error answer for `reason`.
    async fn answer(
        &mut self,
        reason: F::Reason,
        detail: String,
        close: bool,
    ) -> std::io::Result<()> {
        self.reason = Some(reason);
        let (status, body) = self.service.error_page(reason, detail);
        self.local(
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            &body,
            None,
            close,
        )
        .await
    }

    /// A local answer with `status` (431 and 505 have no reason: the head was not
    /// read far enough to route).
    async fn answer_status(
        &mut self,
        status: u16,
        reason: Option<F::Reason>,
        detail: &str,
        close: bool,
    ) -> std::io::Result<()> {
        if let Some(reason) = reason {
            return self.answer(reason, detail.to_owned(), close).await;
        }
        let code = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST);
        let phrase = code.canonical_reason().unwrap_or("");
        self.service.count(None, status, Duration::ZERO);
        let body = format!("{status} {phrase}");
        self.local(status, phrase, &body, None, close).await
    }

    /// A redirect answer.
    /// Answers with `status`, `headers` (their `set` and `add`) and no body (a 204
    /// preflight).
    async fn answer_with(
        &mut self,
        status: u16,
        headers: &HeaderChanges,
        close: bool,
    ) -> std::io::Result<()> {
        use std::io::Write as _;
        let code = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::NO_CONTENT);
        self.out.clear();
        let phrase = code.canonical_reason().unwrap_or("");
        let _ = write!(self.out, "HTTP/1.1 {} {phrase}\r\n", code.as_u16());
        for (name, value) in headers.set.iter().chain(&headers.add) {
            self.out.extend_from_slice(name.as_str().as_bytes());
            self.out.extend_from_slice(b": ");
            self.out.extend_from_slice(value.as_bytes());
            self.out.extend_from_slice(b"\r\n");
        }
        if code != http::StatusCode::NO_CONTENT {
            self.out.extend_from_slice(b"content-length: 0\r\n");
        }
        self.end_local_head(close);
        self.send_out()
            .await
            .map_err(|_| std::io::Error::other("client gone"))
    }

    /// Ends a head written here: how the connection goes on, the Date, the blank line.
    fn end_local_head(&mut self, close: bool) {
        if close {
            self.out.extend_from_slice(b"connection: close\r\n");
        } else if self.head.minor == 0 {
            self.out.extend_from_slice(b"connection: keep-alive\r\n");
        }
        with_date(|line| self.out.extend_from_slice(line));
        self.out.extend_from_slice(b"\r\n");
    }

    async fn redirect(&mut self, status: u16, location: &str, close: bool) -> std::io::Result<()> {
        if location.bytes().any(|b| !(b' '..=b'~').contains(&b)) {
            let body = "400 bad request: unusable host or path";
            return self.local(400, "Bad Request", body, None, close).await;
        }
        let code = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::FOUND);
        let body = format!("{} redirecting", code.as_u16());
        let phrase = code.canonical_reason().unwrap_or("");
        self.local(code.as_u16(), phrase, &body, Some(location), close)
            .await
    }

    /// Writes a local answer: a short plain page saying why.
    async fn local(
        &mut self,
        status: u16,
        phrase: &str,
        body: &str,
        location: Option<&str>,
        close: bool,
    ) -> std::io::Result<()> {
        use std::io::Write as _;
        self.out.clear();
        let _ = write!(
            self.out,
            "HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\nx-holdfast-reason: {phrase}\r\ncontent-length: {}\r\n",
            body.len() + 1
        );
        if let Some(location) = location {
            let _ = write!(self.out, "location: {location}\r\n");
        }
        self.end_local_head(close);
        // No body for HEAD.
        if !self.head_request {
            self.out.extend_from_slice(body.as_bytes());
            self.out.push(b'\n');
        }
        self.send_out()
            .await
            .map_err(|_| std::io::Error::other("client gone"))
    }
}

/// Why an exchange with an upstream failed.
enum Exchange {
    /// The connection failed before any byte of an answer (a pooled one the upstream
    /// closed): a request without a body can go again.
    Stale,
    /// No response head within the response timeout.
    Timeout,
    /// The upstream failed.
    Upstream(std::io::Error),
    /// The request body broke a rule: answered for this failure, then closed.
    Refused(Failure),
    /// The client went away.
    ClientGone,
}

/// The origin-form target sent when normalising left the path as it was: the target as
/// sent, or an absolute form's path and query (a `/` is written before one that has no
/// path).
fn origin_target<'b>(head: &RequestHead, buf: &'b [u8]) -> &'b [u8] {
    match head.form {
        Some(TargetForm::Absolute) => {
            let end = head.query.map_or(head.path.end, |q| q.end) as usize;
            buf.get(head.path.start as usize..end).unwrap_or_default()
        }
        _ => head.target.of(buf),
    }
}

/// Writes where `key` goes (its address or name) into `out`, for the access log.
fn write_key(out: &mut String, key: &Key) {
    use std::fmt::Write as _;
    let _ = match key {
        Key::Addr(a) => write!(out, "{a}"),
        Key::Name(a) => write!(out, "{a}"),
        Key::Secure(s) => {
            write_key(out, &s.to);
            Ok(())
        }
    };
}

/// Copies what a log line says of a request out of its head.
fn keep_words(account: &mut Account, view: &RequestView<'_>, headers: &HeadHeaders<'_>) {
    account.put(Field::Method, Some(view.method));
    account.put(Field::Host, view.host);
    account.put(Field::Path, Some(view.path_or_root()));
    account.put(Field::Query, view.query);
    for (field, name) in [
        (Field::Referer, "referer"),
        (Field::UserAgent, "user-agent"),
    ] {
        let mut found = false;
        headers.any_value(name, &mut |v| {
            account.put(field, std::str::from_utf8(v).ok());
            found = true;
            true
        });
        if !found {
            account.put(field, None);
        }
    }
    // Every X-Forwarded-For line, as one list (a balancer may add a line of its own).
    let mut lines = 0;
    headers.any_value("x-forwarded-for", &mut |v| {
        if let Ok(v) = std::str::from_utf8(v) {
            if lines > 0 {
                account.text.push_str(", ");
            }
            account.text.push_str(v);
            lines += 1;
        }
        false
    });
    if lines > 0 {
        account.present |= 1 << Field::ForwardedFor as u8;
    }
    account.put(Field::ForwardedFor, None);
    let mut found = false;
    headers.any_value("traceparent", &mut |v| {
        account.put(Field::Traceparent, std::str::from_utf8(v).ok());
        found = true;
        true
    });
    if !found {
        account.put(Field::Traceparent, None);
    }
}

/// The authority of `key`, for error details.
fn key_authority(key: &Key) -> String {
    match key {
        Key::Addr(a) => a.to_string(),
        Key::Name(a) => a.to_string(),
        Key::Secure(s) => key_authority(&s.to),
    }
}

/// Whether every protocol the request's `Upgrade` names is allowed (never h2c).
fn upgrade_allowed(headers: &dyn HeaderLookup, allowed: &[String]) -> bool {
    let mut any = false;
    let mut all = true;
    headers.any_value("upgrade", &mut |v| {
        for p in v.split(|b| *b == b',') {
            let p = p.trim_ascii();
            let name = p.split(|b| *b == b'/').next().unwrap_or_default();
            any = true;
            let ok = !name.eq_ignore_ascii_case(b"h2c")
                && allowed
                    .iter()
                    .any(|a| a.as_bytes().eq_ignore_ascii_case(name));
            all &= ok;
        }
        false
    });
    any && all
}

/// Writes all of `slices`, in as few writes as the socket takes.
/// Writes `bytes` whole, then flushes: over TLS a write can leave records inside the TLS
/// session when the socket is full, and only a flush (or another write) sends them. Over
/// TCP the flush does nothing.
async fn write_flushed<S: AsyncWrite + Unpin>(io: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    io.write_all(bytes).await?;
    io.flush().await
}

async fn write_all_vectored<S: AsyncWrite + Unpin>(
    io: &mut S,
    mut slices: &mut [std::io::IoSlice<'_>],
) -> std::io::Result<()> {
    std::io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match io.write_vectored(slices).await? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => std::io::IoSlice::advance_slices(&mut slices, n),
        }
    }
    Ok(())
}

/// Writes `runs` (of `buf` and `out`) in order: in one vectored write when they fit in
/// one, as a planned head does (`plan_upstream_head` makes at most [`MAX_PIECES`], the
/// body's first bytes one more). More would take several writes, never a cut head.
async fn write_runs<S: AsyncWrite + Unpin>(
    io: &mut S,
    runs: &[Run],
    buf: &[u8],
    out: &[u8],
) -> std::io::Result<()> {
    for runs in runs.chunks(MAX_PIECES + 1) {
        let mut slices = [std::io::IoSlice::new(&[]); MAX_PIECES + 1];
        for (slice, run) in slices.iter_mut().zip(runs) {
            *slice = std::io::IoSlice::new(run.of(buf, out));
        }
        write_all_vectored(io, &mut slices[..runs.len()]).await?;
    }
    Ok(())
}

/// Reads into `buf[end..]`, making room first (compacting, then growing up to `cap`).
async fn fill<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut Vec<u8>,
    start: &mut usize,
    end: &mut usize,
    cap: usize,
) -> std::io::Result<usize> {
    if *start == *end {
        *start = 0;
        *end = 0;
    }
    if *end == buf.len() {
        if *start > 0 {
            buf.copy_within(*start..*end, 0);
            *end -= *start;
            *start = 0;
        } else if buf.len() < cap {
            let grown = (buf.len() * 2).min(cap);
            buf.resize(grown, 0);
        } else {
            return Err(std::io::Error::other("buffer full"));
        }
    }
    let n = io.read(&mut buf[*end..]).await?;
    *end += n;
    Ok(n)
}

/// A worker's idle connections to one endpoint (the one its number is given to now).
#[derive(Default)]
struct Idle {
    key: Option<Key>,
    /// Last in, first out, with when each went idle.
    conns: Vec<(Stream, Instant)>,
}

thread_local! {
    /// This worker's idle upstream connections, by endpoint number.
    static IDLE: RefCell<Vec<Idle>> = const { RefCell::new(Vec::new()) };
    /// When this worker's idle pool was last swept.
    static SWEPT: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    /// `date: <IMF-fixdate>\r\n`, and until when it is the time's.
    static DATE: RefCell<(Option<Instant>, Vec<u8>)> = const { RefCell::new((None, Vec::new())) };
}

/// An idle connection to `key`, numbered `number`; with `check`, one still open (a `recv`
/// that would block).
fn take_idle(number: Number, key: &Key, check: bool) -> Option<Stream> {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let idle = idle.get_mut(number.index())?;
        if idle.key.as_ref() != Some(key) {
            return None;
        }
        let now = clock::now();
        while let Some((mut stream, since)) = idle.conns.pop() {
            if now.duration_since(since) >= IDLE_TIMEOUT {
                continue;
            }
            if !check {
                return Some(stream);
            }
            // Readable now means the upstream closed it (or sent bytes unasked): not
            // reusable.
            if stream.is_quiet() {
                return Some(stream);
            }
        }
        None
    })
}

/// Keeps `stream` for the next request to `key`, numbered `number`, up to `max` per
/// endpoint. What is kept under the number for another endpoint (whose number was freed
/// and given again) is dropped. Now and then the whole pool drops what idled past
/// [`IDLE_TIMEOUT`] (endpoints gone too).
fn put_idle(number: Number, key: Key, stream: Stream, max: usize) {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let now = clock::now();
        if SWEPT.with(|s| {
            s.get()
                .is_none_or(|at| now.duration_since(at) >= IDLE_TIMEOUT / 4)
        }) {
            SWEPT.with(|s| s.set(Some(now)));
            for slot in idle.iter_mut() {
                slot.conns
                    .retain(|(_, since)| now.duration_since(*since) < IDLE_TIMEOUT);
                if slot.conns.is_empty() {
                    slot.key = None;
                }
            }
        }
        if idle.len() <= number.index() {
            idle.resize_with(number.index() + 1, Idle::default);
        }
        let slot = &mut idle[number.index()];
        if slot.key.as_ref() != Some(&key) {
            slot.conns.clear();
            slot.key = Some(key);
        }
        if slot.conns.len() < max {
            slot.conns.push((stream, now));
        }
    });
}

/// Calls `f` with the Date header line for now (`date: <IMF-fixdate>\r\n`), rendered at
/// most once a second per worker.
fn with_date<T>(f: impl FnOnce(&[u8]) -> T) -> T {
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        let now = clock::now();
        if d.0.is_none_or(|until| now >= until) {
            use std::io::Write as _;
            let wall = std::time::SystemTime::now();
            let into = wall
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.subsec_nanos());
            d.1.clear();
            let _ = write!(d.1, "date: {}\r\n", httpdate::HttpDate::from(wall));
            // The line holds until the wall clock's next second.
            d.0 = Some(now + Duration::from_nanos(u64::from(1_000_000_000 - into)));
        }
        f(&d.1)
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    /// A connected socket on 127.0.0.1 (and its listener, kept so it stays open).
    async fn stream() -> (Stream, tokio::net::TcpListener) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        (Stream::Plain(tcp), listener)
    }

    #[tokio::test]
    async fn the_idle_pool_gives_a_numbers_connections_only_to_the_endpoint_they_were_kept_for() {
        let a = Key::Addr("10.0.0.1:80".parse().unwrap());
        let b = Key::Addr("10.0.0.2:80".parse().unwrap());
        // A number of its own, as a compiled table would give; then, once freed, given
        // again to another endpoint.
        let n = Number::of(&a);
        let (kept, _l1) = stream().await;
        let kept_port = kept.tcp().local_addr().unwrap().port();
        put_idle(n, a.clone(), kept, 4);
        assert!(
            take_idle(n, &b, false).is_none(),
            "b has no connections under a's number"
        );
        let (other, _l2) = stream().await;
        put_idle(n, b.clone(), other, 4);
        assert!(
            take_idle(n, &a, false).is_none(),
            "a's connections went when b took the number"
        );
        let got = take_idle(n, &b, false).expect("b's connection");
        assert_ne!(got.tcp().local_addr().unwrap().port(), kept_port);
        assert!(take_idle(n, &b, false).is_none(), "taken once");
        let (again, _l3) = stream().await;
        let again_port = again.tcp().local_addr().unwrap().port();
        put_idle(n, b.clone(), again, 4);
        let got = take_idle(n, &b, true).expect("still open, so given");
        assert_eq!(got.tcp().local_addr().unwrap().port(), again_port);
        Number::release(&a);
    }

    /// A writer taking at most `take` bytes per call, counting its calls.
    struct Taking {
        got: Vec<u8>,
        take: usize,
        calls: usize,
    }

    impl AsyncWrite for Taking {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.calls += 1;
            let mut left = self.take;
            for b in bufs {
                let n = b.len().min(left);
                self.got.extend_from_slice(&b[..n]);
                left -= n;
            }
            std::task::Poll::Ready(Ok(self.take - left))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_planned_head_goes_in_one_vectored_write_or_in_order_over_partial_ones() {
        let parts: [&[u8]; 4] = [b"GET / HTTP/1.1\r\n", b"", b"accept: */*\r\n", b"\r\n"];
        let whole = parts.concat();
        for take in [usize::MAX / 2, 5, 1] {
            let mut slices = parts.map(std::io::IoSlice::new);
            let mut w = Taking {
                got: Vec::new(),
                take,
                calls: 0,
            };
            write_all_vectored(&mut w, &mut slices)
                .await
                .expect("written");
            assert_eq!(w.got, whole, "taking {take} at a time");
            if take > whole.len() {
                assert_eq!(w.calls, 1, "one write");
            }
        }
    }

    #[tokio::test]
    async fn runs_past_one_vectored_write_go_whole_and_in_order() {
        let buf = b"0123456789";
        let out = b"abcdefghij";
        for n in [1, MAX_PIECES + 1, MAX_PIECES + 2, 3 * (MAX_PIECES + 1) + 1] {
            // Alternating one byte of each.
            let runs: Vec<Run> = (0..n)
                .map(|i| match i % 2 {
                    0 => Run::Kept(i % 10, i % 10 + 1),
                    _ => Run::Rendered(i % 10, i % 10 + 1),
                })
                .collect();
            let whole: Vec<u8> = runs.iter().flat_map(|r| r.of(buf, out)).copied().collect();
            let mut w = Taking {
                got: Vec::new(),
                take: usize::MAX / 2,
                calls: 0,
            };
            write_runs(&mut w, &runs, buf, out).await.expect("written");
            assert_eq!(w.got, whole, "{n} runs");
            assert_eq!(w.calls, n.div_ceil(MAX_PIECES + 1), "{n} runs");
        }
    }

    /// A proxy of one route and one endpoint, counting what the engine reports.
    struct One {
        settings: Settings,
        tunnels: Tunnels,
        upstream: SocketAddr,
        authority: &'static http::uri::Authority,
        number: Number,
        counted: std::sync::Mutex<Vec<(bool, u16)>>,
        opened: std::sync::atomic::AtomicUsize,
        logged: std::sync::Mutex<Vec<Line>>,
    }

    /// What the engine gave the access log of one request.
    #[derive(Debug, Clone, PartialEq)]
    struct Line {
        method: String,
        path: String,
        status: u16,
        received: u64,
        sent: u64,
        upstream: Option<String>,
        upstream_took: bool,
        reason: Option<u16>,
        request_id: String,
        user_agent: Option<String>,
    }

    impl Service for One {
        type Via = ();
        type Route = ();
        type Table = ();
        type Reason = u16;

        const BAD_REQUEST: u16 = 400;

        fn settings(&self) -> &Settings {
            &self.settings
        }
        fn table(&self) {}
        fn decide<'t, 'r>(
            &self,
            request: &RequestView<'r>,
            _: &(),
            _: &'t (),
        ) -> Decision<'t, 'r, (), u16> {
            if request.path == "/missing" {
                return Decision::Refuse {
                    reason: 404,
                    detail: "no route".into(),
                    route: None,
                };
            }
            Decision::Forward(crate::routing::Routed {
                route: &(),
                raw_host: request.host.unwrap_or_default(),
                forward_path: None,
                header_changes: None,
                upstream_host: None,
                response_changes: Default::default(),
                timeouts: None,
                retry: None,
                max_body: None,
                hold: None,
                start: None,
            })
        }
        fn is_tls(&self, _: &()) -> bool {
            false
        }
        fn trusted(&self, _: IpAddr) -> bool {
            false
        }
        fn status(&self, reason: u16) -> StatusCode {
            StatusCode::from_u16(reason).unwrap()
        }
        fn failed(&self, failure: &Failure) -> (u16, String) {
            (502, failure.to_string())
        }
        fn error_page(&self, reason: u16, _: String) -> (StatusCode, String) {
            (self.status(reason), reason.to_string())
        }
        fn count(&self, route: Option<&()>, status: u16, _: Duration) {
            self.counted.lock().unwrap().push((route.is_some(), status));
        }
        fn first_index(&self, _: &()) -> usize {
            0
        }
        async fn target<'b>(
            &self,
            _: &'b (),
            attempt: usize,
            _: usize,
            tried: &mut Option<SocketAddr>,
        ) -> Target<'b> {
            if attempt > 0 {
                return Target::None;
            }
            *tried = Some(self.upstream);
            Target::Go(Key::Addr(self.upstream), self.number, self.authority, None)
        }
        fn connect_failed(&self, _: &(), _: Option<SocketAddr>, _: &ConnectError) {}
        fn connection_opened(&self) {
            self.opened
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn upstream_answered(&self, _: Duration) {}
        fn retry(&self, _: &()) -> bool {
            false
        }
        fn draining(&self) -> bool {
            false
        }
        fn tunnels(&self) -> &Tunnels {
            &self.tunnels
        }
        fn logs(&self) -> bool {
            true
        }
        fn log(&self, _: Option<&()>, _: &(), served: &Served<'_, u16>) {
            self.logged.lock().unwrap().push(Line {
                method: served.method.into(),
                path: served.path.into(),
                status: served.status,
                received: served.received,
                sent: served.sent,
                upstream: served.upstream.map(Into::into),
                upstream_took: served.upstream_took.is_some(),
                reason: served.reason,
                request_id: served.request_id.into(),
                user_agent: served.user_agent.map(Into::into),
            });
        }
    }

    /// The engine serves any [`Service`]: here one with a single route and endpoint, no
    /// data plane. A routed request reaches the endpoint the service picked, with the
    /// forwarding and loop headers, and is counted under its route; a refused one gets
    /// the service's status and page and is counted unrouted; the upstream connection
    /// is opened once and reused.
    #[tokio::test]
    async fn the_engine_forwards_and_answers_as_its_service_decides() {
        use tokio::io::AsyncBufReadExt;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            let mut conn = tokio::io::BufReader::new(conn);
            loop {
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                let _ = heads_tx.send(head);
                let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                conn.get_mut().write_all(reply).await.unwrap();
            }
        });
        let key = Key::Addr(upstream);
        let service = One {
            settings: Settings {
                connect_timeout: Duration::from_secs(5),
                response_timeout: Duration::from_secs(5),
                body_read_timeout: Duration::from_secs(5),
                max_request_body: 0,
                pool_idle_per_host: 4,
                allow_upgrade: Vec::new(),
                loop_header: "x-test-loop",
                loop_token: HeaderValue::from_static("tok"),
                trace_ratio: None,
            },
            tunnels: Tunnels::new(Duration::from_secs(5)),
            upstream,
            authority: Box::leak(Box::new(upstream.to_string().parse().unwrap())),
            number: Number::of(&key),
            counted: Default::default(),
            opened: Default::default(),
            logged: Default::default(),
        };
        let (client, proxy_side) = tokio::io::duplex(64 * 1024);
        let limits = Limits {
            max_bytes: 64 * 1024,
            max_headers: 100,
        };
        let timeouts = Timeouts {
            header_read: Duration::from_secs(5),
            idle: Duration::from_secs(5),
            send: Duration::from_secs(5),
        };
        let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let (_drain_tx, mut drain) = tokio::sync::watch::channel(false);
        let conn = H1Conn::new(proxy_side, &service, limits, timeouts, peer, 8080);
        // Each request's bytes each way, as the client counted them.
        let mut sizes = Vec::new();
        let client_side = async {
            let mut client = tokio::io::BufReader::new(client);
            let mut answers = Vec::new();
            let sizes = &mut sizes;
            for path in ["/a", "/missing", "/b"] {
                let request = format!(
                    "GET {path} HTTP/1.1\r\nhost: a.test\r\nuser-agent: t/1\r\nx-request-id: mine\r\n\r\n"
                );
                client
                    .get_mut()
                    .write_all(request.as_bytes())
                    .await
                    .unwrap();
                let mut status = String::new();
                let mut read = client.read_line(&mut status).await.unwrap();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    read += client.read_line(&mut line).await.unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                client.read_exact(&mut body).await.unwrap();
                sizes.push((request.len() as u64, (read + length) as u64));
                answers.push((status, String::from_utf8(body).unwrap()));
            }
            answers
        };
        let (served, answers) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(conn.serve(&(), &mut drain), client_side)
        })
        .await
        .expect("served within 10 s");
        assert!(served.is_ok());
        assert_eq!(
            answers[0],
            ("HTTP/1.1 200 OK\r\n".to_string(), "ok".to_string())
        );
        assert_eq!(answers[1].0, "HTTP/1.1 404 Not Found\r\n");
        assert_eq!(answers[1].1, "404\n", "the service's page");
        assert_eq!(answers[2].0, "HTTP/1.1 200 OK\r\n");
        let first = heads
            .recv()
            .await
            .expect("the upstream got the first request");
        assert!(first.starts_with("GET /a HTTP/1.1\r\n"), "{first}");
        assert!(first.contains("x-forwarded-for: 192.0.2.7\r\n"), "{first}");
        assert!(first.contains("x-test-loop: tok\r\n"), "{first}");
        let second = heads
            .recv()
            .await
            .expect("the upstream got the third request");
        assert!(second.starts_with("GET /b HTTP/1.1\r\n"), "{second}");
        assert_eq!(
            *service.counted.lock().unwrap(),
            vec![(true, 200), (false, 404), (true, 200)]
        );
        assert_eq!(
            service.opened.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one upstream connection, reused"
        );
        // One log line a request, with the bytes the client counted, the endpoint and
        // the upstream's time for those forwarded, the reason for the one answered here;
        // the id sent upstream is the logged one (an untrusted client's is replaced), and
        // each request has its own.
        let logged = service.logged.lock().unwrap().clone();
        assert_eq!(logged.len(), 3, "{logged:?}");
        for (line, (path, status)) in
            logged
                .iter()
                .zip([("/a", 200), ("/missing", 404), ("/b", 200)])
        {
            assert_eq!(
                (line.method.as_str(), line.path.as_str(), line.status),
                ("GET", path, status)
            );
            assert_eq!(line.user_agent.as_deref(), Some("t/1"));
            assert_eq!(line.request_id.len(), 32, "{line:?}");
            assert!(
                line.request_id.bytes().all(|b| b.is_ascii_hexdigit()),
                "{line:?}"
            );
        }
        let (received, sent): (Vec<u64>, Vec<u64>) =
            logged.iter().map(|l| (l.received, l.sent)).unzip();
        assert_eq!(sizes, received.into_iter().zip(sent).collect::<Vec<_>>());
        assert_eq!(logged[0].upstream, Some(upstream.to_string()));
        assert!(logged[0].upstream_took && logged[2].upstream_took);
        assert_eq!(
            (logged[1].upstream.as_deref(), logged[1].upstream_took),
            (None, false)
        );
        assert_eq!(
            logged.iter().map(|l| l.reason).collect::<Vec<_>>(),
            [None, Some(404), None]
        );
        assert_ne!(logged[0].request_id, logged[2].request_id);
        assert!(
            first.contains(&format!("x-request-id: {}\r\n", logged[0].request_id)),
            "{first}"
        );
        assert!(
            second.contains(&format!("x-request-id: {}\r\n", logged[2].request_id)),
            "{second}"
        );
        assert!(!first.contains("mine"), "{first}");
        Number::release(&key);
    }
}
