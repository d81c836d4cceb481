//! The proxy listeners: HTTP/1.1 and h2c (prior knowledge) on one port, and, with TLS,
//! HTTPS (HTTP/1.1 and h2 by ALPN) on another, with header limits, a client header read
//! timeout (which also bounds the TLS handshake), an idle timeout, and graceful shutdown
//! (stop accepting, let in-flight requests finish within a grace period).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use holdfast_http::framing::{FrameScanner, Tracker};
use holdfast_http::headers::{BadRequest, is_upgrade};
use holdfast_http::inflight::InFlight;
use holdfast_lock::Lock;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

use crate::proxy::{Forwarder, Via};

/// Client-side limits and timeouts.
#[derive(Debug, Clone)]
pub struct ListenSettings {
    /// A client must send a whole request head within this time.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no bytes moving is closed after this.
    pub idle_timeout: Duration,
    /// Most request headers accepted (HTTP/1.1).
    pub max_headers: usize,
    /// Largest request head accepted, in bytes.
    pub max_header_bytes: usize,
    /// How long in-flight requests may take to finish on shutdown.
    pub shutdown_grace: Duration,
    /// A response write that makes no progress for this long closes the connection.
    pub send_timeout: Duration,
    /// Most client connections open at once on one listening address (all workers
    /// together); past it new ones are closed at once. HTTP/2 streams in flight and
    /// HTTP/2 receive windows take slots too (see `config::connection_bytes`).
    pub max_connections: usize,
    /// SETTINGS_MAX_CONCURRENT_STREAMS announced to HTTP/2 clients.
    pub h2_max_concurrent_streams: u32,
    /// HTTP/1.1 is served by the native engine (`--h1-engine=native`), not hyper.
    pub native_h1: bool,
}

/// An HTTP/2 connection holding this many stream slots takes more only while an eighth
/// ([`H2_RESERVE_FRACTION`]) of the listener's slots stay free: a few connections with
/// many slow streams cannot take the slots that new connections and other clients' first
/// streams need. Past it, its new streams get 503 (`overloaded`).
const H2_STREAMS_BEFORE_RESERVE: usize = 4;
const H2_RESERVE_FRACTION: usize = 8;

/// A connection's timeouts are checked four times per the shorter of the idle and header
/// read timeouts (so one fires at most a quarter late), but no more often than this.
const CHECK_AT_MOST_EVERY: Duration = Duration::from_millis(50);

/// Serves `listener` until `shutdown` turns true, then drains. With `tls`, every
/// connection is a TLS connection (HTTPS); the handshake must finish within the header
/// read timeout. `open` counts the connections of every worker serving the same address,
/// so that `max_connections` holds for the address, not per worker. With `gateway` (a
/// Gateway listener's name), requests are routed by that listener's routes alone.
pub async fn serve(
    listener: TcpListener,
    forwarder: Arc<Forwarder>,
    settings: ListenSettings,
    tls: Option<TlsAcceptor>,
    open: Arc<AtomicUsize>,
    mut shutdown: watch::Receiver<bool>,
    gateway: Option<Arc<str>>,
) {
    let builder = hyper_builder(&settings);
    // Over TLS, ALPN has already said "h2": such a connection is HTTP/2 only, so bytes
    // that are not the connection preface get a GOAWAY, not an HTTP/1.1 answer.
    let h2_only = Arc::new(builder.clone().http2_only());
    let builder = Arc::new(builder);
    let connections = TaskTracker::new();
    let (drain_tx, drain_rx) = watch::channel(false);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                forwarder.metrics().accept_errors.inc();
                holdfast_process::admin::accept_backoff(&error).await;
                continue;
            }
        };
        // Checked and counted in one step: other workers count into `open` too.
        let Some(open_guard) = InFlight::enter_below(&open, settings.max_connections) else {
            forwarder.metrics().connections_refused.inc();
            tracing::debug!(%peer, max = settings.max_connections, "connection limit reached; closing");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = Connection::new(
            stream.local_addr().map_or(0, |a| a.port()),
            open_guard,
            &open,
            &settings,
            builder.clone(),
            forwarder.clone(),
            drain_rx.clone(),
        );
        match &tls {
            None => {
                let via = match &gateway {
                    Some(listener) => Via::Gateway {
                        listener: listener.clone(),
                        tls: None,
                        version: "",
                    },
                    None => Via::Http,
                };
                connections.spawn(conn.serve(stream, peer, via));
            }
            Some(acceptor) => {
                let handshake = acceptor.accept(stream);
                let h2_only = h2_only.clone();
                let gateway = gateway.clone();
                connections.spawn(async move {
                    match tokio::time::timeout(conn.header_read_timeout, handshake).await {
                        Ok(Ok(stream)) => {
                            let mut conn = conn;
                            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                                conn.builder = h2_only.clone();
                                conn.h2_only = true;
                            }
                            let sni = stream.get_ref().1.server_name().map(|n| {
                                Arc::<str>::from(n.to_ascii_lowercase())
                            });
                            let version = crate::proxy::tls_version_name(
                                stream.get_ref().1.protocol_version(),
                            );
                            let via = match gateway {
                                Some(listener) => Via::Gateway {
                                    listener,
                                    tls: Some(sni),
                                    version,
                                },
                                None => Via::Https { sni, version },
                            };
                            conn.serve(stream, peer, via).await
                        }
                        Ok(Err(error)) => {
                            conn.forwarder.metrics().tls_handshake_failures.inc();
                            tracing::debug!(%peer, %error, "TLS handshake failed");
                        }
                        Err(_) => {
                            conn.forwarder.metrics().tls_handshake_failures.inc();
                            tracing::debug!(%peer, "TLS handshake not complete within the header read timeout");
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    tracing::info!(connections = connections.len(), grace = ?settings.shutdown_grace, "draining");
    let _ = drain_tx.send(true);
    connections.close();
    if tokio::time::timeout(settings.shutdown_grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = connections.len(),
            "grace period over; closing remaining connections"
        );
    }
}

/// The hyper server for a listener's connections: HTTP/2, and HTTP/1.1 with
/// `--h1-engine=hyper`.
fn hyper_builder(settings: &ListenSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper's own header timer also runs while a keep-alive connection waits for its
        // next request, which closed idle connections after this timeout instead of
        // --idle-timeout, racing clients that reuse them. The connection loop below times
        // a head from its first byte instead.
        .header_read_timeout(None)
        .max_headers(settings.max_headers)
        .max_buf_size(settings.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(settings.max_header_bytes as u32)
        // What an HTTP/2 connection and its streams may hold, counted in slots of
        // --max-connections (config::connection_bytes).
        .max_concurrent_streams(settings.h2_max_concurrent_streams)
        .initial_connection_window_size(crate::config::H2_CONNECTION_WINDOW)
        .initial_stream_window_size(crate::config::H2_STREAM_WINDOW)
        .max_send_buf_size(crate::config::H2_SEND_BUFFER);
    builder
}

struct Connection {
    /// The local port the connection came in on.
    port: u16,
    /// Negotiated HTTP/2 by ALPN: served as HTTP/2 only.
    h2_only: bool,
    /// Counts this connection against `--max-connections` until it is dropped.
    open_slot: Arc<InFlight>,
    /// The listener's slots (`open_slot` is one of them), which HTTP/2 streams and
    /// receive windows take too, up to `max_connections`.
    open: Arc<AtomicUsize>,
    max_connections: usize,
    /// The slots an HTTP/2 connection's receive window takes, from its first stream on.
    h2_window_slots: usize,
    send_timeout: Duration,
    builder: Arc<auto::Builder<TokioExecutor>>,
    forwarder: Arc<Forwarder>,
    idle_timeout: Duration,
    header_read_timeout: Duration,
    drain: watch::Receiver<bool>,
    native_h1: bool,
    head_limits: holdfast_http::h1::Limits,
}

/// Serves one client connection (`stream`, from `peer`, on local `port`) as a plain HTTP
/// listener with `settings` would, until it ends: for tests and the differential fuzz
/// target, which drive both engines over in-memory streams and end their input with EOF.
/// So hyper, too, answers what it read before an EOF (`half_close`; the native engine
/// always does).
pub async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    port: u16,
    forwarder: Arc<Forwarder>,
    settings: &ListenSettings,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let open = Arc::new(AtomicUsize::new(0));
    let Some(slot) = InFlight::enter_below(&open, settings.max_connections) else {
        return;
    };
    let (_drain, drain_rx) = watch::channel(false);
    let mut builder = hyper_builder(settings);
    builder.http1().half_close(true);
    let conn = Connection::new(
        port,
        slot,
        &open,
        settings,
        Arc::new(builder),
        forwarder,
        drain_rx,
    );
    conn.serve(stream, peer, Via::Http).await;
}

impl Connection {
    fn new(
        port: u16,
        slot: InFlight,
        open: &Arc<AtomicUsize>,
        settings: &ListenSettings,
        builder: Arc<auto::Builder<TokioExecutor>>,
        forwarder: Arc<Forwarder>,
        drain: watch::Receiver<bool>,
    ) -> Self {
        Connection {
            port,
            h2_only: false,
            open_slot: Arc::new(slot),
            open: open.clone(),
            max_connections: settings.max_connections,
            h2_window_slots: crate::config::h2_window_slots(settings.max_header_bytes),
            send_timeout: settings.send_timeout,
            builder,
            forwarder,
            idle_timeout: settings.idle_timeout,
            header_read_timeout: settings.header_read_timeout,
            drain,
            native_h1: settings.native_h1,
            head_limits: holdfast_http::h1::Limits {
                max_bytes: settings.max_header_bytes,
                max_headers: settings.max_headers,
            },
        }
    }

    /// Serves one connection with the engine configured for HTTP/1.1: the native engine
    /// hands a connection that turns out to be HTTP/2 (the h2c preface) to hyper, with
    /// the bytes it read. A connection that negotiated h2 by ALPN goes to hyper at once.
    async fn serve<S>(self, stream: S, peer: SocketAddr, via: Via)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if !self.native_h1 || self.h2_only {
            return self.run(stream, peer, via).await;
        }
        let forwarder = self.forwarder.clone();
        let timeouts = crate::proxy::native::Timeouts {
            header_read: self.header_read_timeout,
            idle: self.idle_timeout,
            send: self.send_timeout,
        };
        let mut drain = self.drain.clone();
        let conn = crate::proxy::native::H1Conn::new(
            stream,
            &*forwarder,
            self.head_limits,
            timeouts,
            peer,
            self.port,
        );
        if let Err((stream, read)) = conn.serve(&via, &mut drain).await {
            self.run(
                Rewind {
                    read,
                    at: 0,
                    inner: stream,
                },
                peer,
                via,
            )
            .await;
        }
    }

    /// Serves one connection (`via`: plain HTTP, or HTTPS with the client's SNI).
    async fn run<S>(mut self, stream: S, peer: SocketAddr, via: Via)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let smuggling = Arc::new(OnceLock::new());
        let upgrades = Arc::new(AtomicU64::new(0));
        // Shared by the connection's reader (IdleIo) and its request handler, which asks
        // for the verdict on each HTTP/1.1 request before handling it. A std mutex: both
        // run on this connection's task, never across an await, so it is never contended.
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        // The first flagged request's index, as soon as the tracker flags it: a request in
        // flight whose own body is flagged stops waiting for its answer.
        let (flag_tx, flag_rx) = watch::channel(None::<u64>);
        let io = TokioIo::new(IdleIo {
            inner: stream,
            activity: activity.clone(),
            tracker: tracker.clone(),
            flag_tx,
            out: FrameScanner::default(),
            flagged: smuggling.clone(),
            upgrades: upgrades.clone(),
        });
        let forwarder = self.forwarder.clone();
        let port = self.port;
        let open_slot = self.open_slot.clone();
        let (open, max_slots, window_slots) = (
            self.open.clone(),
            self.max_connections,
            self.h2_window_slots,
        );
        // The slots of this HTTP/2 connection's receive window, taken with its first
        // stream that finds them free, and held until the connection ends.
        let h2_window = Arc::new(Mutex::new(None::<InFlight>));
        // The stream slots this connection holds: past [`H2_STREAMS_BEFORE_RESERVE`] it
        // leaves the listener's reserve to other connections.
        let h2_streams = Arc::new(AtomicUsize::new(0));
        let counter = in_flight.clone();
        let requests = Arc::new(AtomicU64::new(0));
        let bodies = activity.clone();
        let via = Arc::new(via);
        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let forwarder = forwarder.clone();
            let via = via.clone();
            // Dropped when the handler finishes or is dropped (an HTTP/2 stream reset).
            let guard = InFlight::enter(&counter);
            // An upgraded tunnel outlives this connection's task: it keeps the
            // connection counted against --max-connections until it ends.
            let mut req = req;
            req.extensions_mut()
                .insert(crate::proxy::ConnectionSlot(open_slot.clone()));
            // HTTP/1.1 requests on a connection are handled in order: this is the index
            // the framing tracker counts in. Its verdict comes before anything else.
            let index = requests.fetch_add(1, Ordering::AcqRel);
            let refused = (req.version() < http::Version::HTTP_2)
                .then(|| {
                    tracker
                        .locked()
                        .verdict(index, upgrades.load(Ordering::Acquire))
                        .err()
                })
                .flatten();
            // As the tracker sees it: any HTTP/1.x head asking for an upgrade waits for
            // its answer (HTTP/1.0 ones are always refused).
            let upgrade = req.version() < http::Version::HTTP_2 && is_upgrade(req.headers());
            // An HTTP/2 stream takes a slot of its own (and, with the connection's first
            // one, the receive window's) or is answered 503 at once, its head freed.
            let stream_slot = (req.version() == http::Version::HTTP_2).then(|| {
                let mut window = h2_window.locked();
                if window.is_none() {
                    *window = InFlight::enter_n_below(&open, window_slots, max_slots);
                }
                let share = if h2_streams.load(Ordering::Acquire) < H2_STREAMS_BEFORE_RESERVE {
                    max_slots
                } else {
                    max_slots - max_slots / H2_RESERVE_FRACTION
                };
                window
                    .as_ref()
                    .and_then(|_| InFlight::enter_below(&open, share))
                    .map(|slot| (slot, InFlight::enter(&h2_streams)))
            });
            let upgrades = upgrades.clone();
            let tracker = tracker.clone();
            let mut flag_rx = flag_rx.clone();
            let stalled = bodies.register_body();
            async move {
                let http1 = req.version() < http::Version::HTTP_2;
                let (overloaded, stream_slot) = match stream_slot {
                    Some(None) => (true, None),
                    Some(slot) => (false, slot),
                    None => (false, None),
                };
                let response = match refused {
                    Some(bad) => forwarder.reject(&bad),
                    None if overloaded => {
                        drop(req);
                        forwarder.overloaded()
                    }
                    None => {
                        // A flag on this request's own body (its chunked framing) that
                        // arrives while it is forwarded: it is answered 400 all the same,
                        // at once (the body may never end as hyper reads it).
                        let flagged_here = async {
                            if http1 {
                                let _ = flag_rx.wait_for(|f| f.is_some_and(|i| i <= index)).await;
                            } else {
                                std::future::pending::<()>().await;
                            }
                        };
                        let late = |tracker: &Mutex<Tracker>| {
                            tracker
                                .locked()
                                .flagged()
                                .filter(|(i, _)| *i <= index)
                                .map(|(_, bad)| bad.clone())
                        };
                        tokio::select! {
                            answer = forwarder.handle(req, peer, &via, port) => {
                                match late(&tracker).filter(|_| http1) {
                                    Some(bad) => forwarder.reject(&bad),
                                    None => answer,
                                }
                            }
                            () = flagged_here => match late(&tracker) {
                                Some(bad) => forwarder.reject(&bad),
                                None => forwarder.reject(&BadRequest::Unframed),
                            },
                        }
                    }
                };
                if upgrade {
                    let switched = response.status() == http::StatusCode::SWITCHING_PROTOCOLS;
                    upgrades.store(((index + 1) << 1) | u64::from(switched), Ordering::Release);
                }
                // The request stays in flight until its response body has been sent (a
                // streaming response is not an idle connection). Its body waits for the
                // client from now until hyper first polls it (over HTTP/2, not before
                // the client's flow-control window has room).
                stalled.set(true);
                Ok::<_, std::convert::Infallible>(response.map(|inner| Guarded {
                    inner,
                    _guard: guard,
                    _slot: stream_slot,
                    stalled,
                }))
            }
        });
        let builder = self.builder.clone();
        if self.h2_only {
            // hyper-util's upgrade-capable connection sniffs the version whatever the
            // builder says; HTTP/2 needs no upgrades.
            let conn = builder.serve_connection(io, svc);
            self.drive(conn, &activity, &in_flight, peer).await;
        } else {
            let conn = builder.serve_connection_with_upgrades(io, svc);
            self.drive(conn, &activity, &in_flight, peer).await;
        }
    }

    /// Polls `conn` to its end, enforcing the header, send and idle timeouts and drain.
    async fn drive<C: Served>(
        &mut self,
        conn: C,
        activity: &Activity,
        in_flight: &AtomicUsize,
        peer: SocketAddr,
    ) {
        tokio::pin!(conn);
        let mut draining = false;
        // Set when an idle connection was asked to close: a client that does not take
        // part in a graceful close (an unanswered HTTP/2 GOAWAY PING) loses the socket.
        let mut idle_close: Option<Instant> = None;
        let check = (self.idle_timeout.min(self.header_read_timeout) / 4).max(CHECK_AT_MOST_EVERY);
        loop {
            tokio::select! {
                _ = conn.as_mut() => break,
                _ = self.drain.wait_for(|d| *d), if !draining => {
                    draining = true;
                    conn.as_mut().shutdown();
                }
                _ = tokio::time::sleep(check) => {
                    if activity.head_pending_for().is_some_and(|t| t >= self.header_read_timeout) {
                        tracing::debug!(%peer, "request head not complete within the header read timeout; closing");
                        break;
                    }
                    if activity.write_blocked_for().is_some_and(|t| t >= self.send_timeout)
                        || activity.stalled_for().is_some_and(|t| t >= self.send_timeout)
                    {
                        tracing::debug!(%peer, "a response made no progress to the client within the send timeout; closing");
                        break;
                    }
                    if let Some(since) = idle_close {
                        if since.elapsed() >= self.idle_timeout.min(self.header_read_timeout) {
                            tracing::debug!(%peer, "idle connection did not close gracefully; closing");
                            break;
                        }
                        continue;
                    }
                    if draining {
                        continue;
                    }
                    if in_flight.load(Ordering::Acquire) == 0 && activity.idle_for() >= self.idle_timeout {
                        draining = true;
                        idle_close = Some(Instant::now());
                        conn.as_mut().shutdown();
                    }
                }
            }
        }
    }
}

/// A hyper connection being served: a future that can be asked to close gracefully.
trait Served: std::future::Future {
    fn shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Served for auto::Connection<'_, I, S, TokioExecutor>
where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    TokioExecutor: auto::HttpServerConnExec<S::Future, B>,
{
    fn shutdown(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B> Served for auto::UpgradeableConnection<'_, I, S, TokioExecutor>
where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    TokioExecutor: auto::HttpServerConnExec<S::Future, B>,
{
    fn shutdown(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// A response body that keeps its request counted in flight until it is done or dropped,
/// and tells the connection when it is waiting for the client to take more.
struct Guarded<B> {
    inner: B,
    _guard: InFlight,
    /// An HTTP/2 stream's slot of --max-connections and its place in its connection's
    /// count, held until its answer is sent.
    _slot: Option<(InFlight, InFlight)>,
    stalled: BodyStall,
}

impl<B: http_body::Body + Unpin> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        // Polled again: the client took what was sent (or the body has not produced
        // any yet). A frame handed over starts the wait for the next poll: hyper polls
        // only when it can send (HTTP/2 flow-control window, HTTP/1.1 write buffer).
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let handed_over = matches!(&polled, Poll::Ready(Some(Ok(f))) if f.is_data());
        self.stalled.set(handed_over);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// When bytes last moved on a connection, and since when a request head is pending.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    /// 1 + the ms at which the pending request head's first byte arrived; 0 if none.
    head_since: AtomicU64,
    /// 1 + the ms at which a write first could not proceed; 0 if writes are flowing.
    write_blocked_since: AtomicU64,
    /// Response bodies being sent: each one's stall (see [`BodyStall`]).
    bodies: Mutex<Vec<Weak<AtomicU64>>>,
}

/// One response body's wait for the client: 1 + the ms (on its connection's clock) at
/// which it handed over a frame that the client has not made room for since (HTTP/2
/// flow control, or a full HTTP/1.1 write buffer); 0 when it is not waiting on the client.
struct BodyStall {
    since: Arc<AtomicU64>,
    activity: Arc<Activity>,
}

impl BodyStall {
    fn set(&self, waiting: bool) {
        let value = if waiting {
            self.activity.start.elapsed().as_millis() as u64 + 1
        } else {
            0
        };
        self.since.store(value, Ordering::Relaxed);
    }
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            write_blocked_since: AtomicU64::new(0),
            bodies: Mutex::new(Vec::new()),
        }
    }
    /// A new response body's stall, watched by [`Activity::stalled_for`].
    fn register_body(self: &Arc<Self>) -> BodyStall {
        let since = Arc::new(AtomicU64::new(0));
        let mut bodies = self.bodies.locked();
        bodies.retain(|b| b.strong_count() > 0);
        bodies.push(Arc::downgrade(&since));
        BodyStall {
            since,
            activity: self.clone(),
        }
    }
    /// How long the longest-waiting response body has waited for the client to make room
    /// for what it handed over, if one is waiting.
    fn stalled_for(&self) -> Option<Duration> {
        let bodies = self.bodies.locked();
        let oldest = bodies
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|s| s.load(Ordering::Relaxed).checked_sub(1))
            .min()?;
        let now = self.start.elapsed().as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(oldest)))
    }
    /// Records whether a request head is pending after a read.
    fn head_pending(&self, pending: bool) {
        let since = self.head_since.load(Ordering::Relaxed);
        if pending && since == 0 {
            let now = self.start.elapsed().as_millis() as u64;
            self.head_since.store(now + 1, Ordering::Relaxed);
        } else if !pending && since != 0 {
            self.head_since.store(0, Ordering::Relaxed);
        }
    }
    /// How long the pending request head has been arriving, if one is.
    fn head_pending_for(&self) -> Option<Duration> {
        let since = self.head_since.load(Ordering::Relaxed).checked_sub(1)?;
        let now = self.start.elapsed().as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(since)))
    }
    /// Records whether a write had to wait (the client is not reading).
    fn write_blocked(&self, blocked: bool) {
        let since = self.write_blocked_since.load(Ordering::Relaxed);
        if blocked && since == 0 {
            let now = self.start.elapsed().as_millis() as u64;
            self.write_blocked_since.store(now + 1, Ordering::Relaxed);
        } else if !blocked && since != 0 {
            self.write_blocked_since.store(0, Ordering::Relaxed);
        }
    }
    /// How long writes have been waiting, if they are.
    fn write_blocked_for(&self) -> Option<Duration> {
        let since = self
            .write_blocked_since
            .load(Ordering::Relaxed)
            .checked_sub(1)?;
        let now = self.start.elapsed().as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(since)))
    }
    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// A stream that records activity for the idle timeout and times request heads, and
/// follows HTTP/1.1 framing to flag request-smuggling shapes (see `framing`). Over TLS it
/// wraps the decrypted stream.
struct IdleIo<S> {
    inner: S,
    activity: Arc<Activity>,
    tracker: Arc<Mutex<Tracker>>,
    /// Told the first flagged request's index.
    flag_tx: watch::Sender<Option<u64>>,
    /// Over HTTP/2, the frames written (only those carrying responses are activity).
    out: FrameScanner,
    flagged: Arc<OnceLock<(u64, BadRequest)>>,
    /// The last upgrade request answered: `(index + 1) << 1 | switched`.
    upgrades: Arc<AtomicU64>,
}

impl<S> IdleIo<S> {
    fn read(&mut self, data: &[u8]) {
        let mut tracker = self.tracker.locked();
        if let Some(index) = tracker.awaiting_upgrade() {
            let answer = self.upgrades.load(Ordering::Acquire);
            if answer >> 1 == index + 1 {
                tracker.upgrade_answered(answer & 1 == 1);
            }
        }
        let active = tracker.feed(data);
        if active {
            self.activity.touch();
        }
        if self.flagged.get().is_none()
            && let Some(flag) = tracker.flagged()
        {
            let _ = self.flagged.set(flag.clone());
            self.flag_tx.send_replace(Some(flag.0));
        }
        // After a flag the handler answers 400 and closes the connection.
        let pending = self.flagged.get().is_none() && tracker.head_pending();
        self.activity.head_pending(pending);
    }

    fn wrote(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let h2 = self.tracker.locked().is_h2();
        if !h2 || self.out.feed(data) {
            self.activity.touch();
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for IdleIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.read(&buf.filled()[before..]);
        }
        r
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for IdleIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        self.activity.write_blocked(r.is_pending());
        if let Poll::Ready(Ok(n)) = r {
            self.wrote(&data[..n]);
        }
        r
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.activity.write_blocked(r.is_pending());
        if let Poll::Ready(Ok(mut n)) = r {
            for b in bufs {
                let take = n.min(b.len());
                self.wrote(&b[..take]);
                n -= take;
                if n == 0 {
                    break;
                }
            }
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.activity.write_blocked(r.is_pending());
        r
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream whose first bytes were already read: they are read again first.
struct Rewind<S> {
    read: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.read.len() {
            let n = (self.read.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.read[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
