//! Upstream HTTP/1.1 connections, driven by the task that uses them.
//!
//! A pooled client (hyper-util's) runs each upstream connection as a task of its own and
//! hands it requests and responses through channels: every request costs two task
//! switches and a pool checkout. Here the task forwarding a request drives its upstream
//! connection itself: waiting for the response head polls the connection (`Upstream::send`),
//! and so does reading the response body (the proxy's `UpstreamBody`). When the body has
//! ended and the connection can take another request, it goes back to a small idle pool
//! shared by the client connections of its worker: last in, first out per endpoint, at
//! most `max_idle_per_key` per endpoint, dropped after `IDLE_TIMEOUT`. Nobody polls an
//! idle connection; before reuse, one poll tells whether the upstream has closed it
//! meanwhile.
//!
//! Each worker thread has a pool of its own ([`enter_worker`]): a socket is registered
//! with the runtime that opened it, so a connection handed to another worker would be
//! woken through the first worker's thread, and the pool's lock would be contended.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// An idle upstream connection older than this is closed, not reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a request body must be to be sent upstream.
pub trait SendBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B> SendBody for B where B: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

/// Where an upstream connection goes: an endpoint's address, or a name resolved when
/// connecting (ExternalName backends).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// An endpoint's address (a Service's ready endpoint).
    Addr(SocketAddr),
    /// A DNS name and port (an ExternalName Service), resolved when connecting.
    Name(Authority),
}

/// An endpoint's number: the same in every compiled table while any holds the endpoint,
/// and the index of its connections in a worker's idle pool (the native engine's), so a
/// request finds them without hashing its endpoint. Numbers are assigned when a table is
/// compiled ([`Number::of`]) and given back when no table holds the endpoint any more
/// ([`Number::release`]); a number can then be given to another endpoint, so what is
/// kept under a number is kept with its [`Key`] and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Number(u32);

/// The endpoints numbered now: each with its number and how many holders it has.
#[derive(Default)]
struct Numbers {
    held: HashMap<Key, (u32, u32)>,
    free: Vec<u32>,
    next: u32,
}

static NUMBERS: std::sync::LazyLock<Mutex<Numbers>> = std::sync::LazyLock::new(Default::default);

impl Numbers {
    fn hold(&mut self, key: &Key) -> u32 {
        if let Some((n, holders)) = self.held.get_mut(key) {
            *holders += 1;
            return *n;
        }
        let n = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.held.insert(key.clone(), (n, 1));
        n
    }

    fn release(&mut self, key: &Key) {
        let Some((n, holders)) = self.held.get_mut(key) else {
            return;
        };
        *holders -= 1;
        if *holders == 0 {
            let n = *n;
            self.held.remove(key);
            self.free.push(n);
        }
    }
}

impl Number {
    /// `key`'s number, held once more (a compiled backend holds one per endpoint).
    pub fn of(key: &Key) -> Number {
        Number(NUMBERS.lock().unwrap_or_else(|e| e.into_inner()).hold(key))
    }

    /// Gives back one hold of `key`'s number; the last frees it.
    pub fn release(key: &Key) {
        NUMBERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release(key);
    }

    /// Whether `key` has a number now.
    #[cfg(test)]
    pub(crate) fn is_held(key: &Key) -> bool {
        NUMBERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held
            .contains_key(key)
    }

    /// The number as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Why no connection could be opened.
#[derive(Debug)]
pub enum ConnectError {
    /// Nothing within the connect timeout.
    Timeout,
    /// The name did not resolve, or resolved to nothing.
    Resolve(Option<std::io::Error>),
    /// The name resolved only to addresses that point at this host (loopback,
    /// link-local, unspecified): an ExternalName must not turn the proxy on itself or on
    /// the node's services.
    Refused,
    /// connect(2) failed.
    Io(std::io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Timeout => f.write_str("connect timed out"),
            ConnectError::Resolve(_) => f.write_str("name did not resolve"),
            ConnectError::Refused => {
                f.write_str("name resolved only to loopback or link-local addresses")
            }
            ConnectError::Io(_) => f.write_str("connect failed"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Io(e) | ConnectError::Resolve(Some(e)) => Some(e),
            _ => None,
        }
    }
}

/// One HTTP/1.1 connection to an upstream, with the future that runs it.
pub struct Upstream<B: SendBody> {
    key: Key,
    send: http1::SendRequest<B>,
    /// None once the connection has finished (closed or failed). Dropping it then matters:
    /// a request queued on a connection that closed without taking it comes back (as
    /// unsent) only when the connection is dropped.
    conn: Option<http1::Connection<TokioIo<TcpStream>, B>>,
    /// It came from the idle pool.
    reused: bool,
}

impl<B: SendBody> Upstream<B> {
    /// Opens a connection to `key` within `timeout`. Boxed: the connection's state is
    /// large, and it moves between the pool, the request and the response body.
    pub async fn connect(key: Key, timeout: Duration) -> Result<Box<Self>, ConnectError> {
        let stream = tokio::time::timeout(timeout, open(&key))
            .await
            .unwrap_or(Err(ConnectError::Timeout))?;
        let _ = stream.set_nodelay(true);
        // The handshake does no I/O: it only builds the connection's state machine.
        let (send, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ConnectError::Io(std::io::Error::other(e)))?;
        Ok(Box::new(Upstream {
            key,
            send,
            conn: Some(conn),
            reused: false,
        }))
    }

    /// The connection came from the idle pool (a failure before the request was written
    /// may be the upstream having closed it meanwhile).
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Runs the connection as far as it can go now.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = &mut self.conn
            && Pin::new(conn).poll(cx).is_ready()
        {
            self.conn = None;
        }
    }

    /// Sends `request` (origin-form URI, Host set) and drives the connection until the
    /// response head arrives. Err(Ok(request)) when the connection could not take the
    /// request at all (it closed meanwhile): nothing was sent, and it can go elsewhere.
    pub async fn send(
        &mut self,
        request: Request<B>,
    ) -> Result<Response<Incoming>, Result<Request<B>, hyper::Error>> {
        let mut response = std::pin::pin!(self.send.try_send_request(request));
        let result = poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await;
        result.map_err(|mut e| match e.take_message() {
            Some(request) => Ok(request),
            None => Err(e.into_error()),
        })
    }

    /// Hands the connection to a task of its own that also runs an upgrade (101) to its
    /// end; returns the sender to send the upgrade request with.
    pub fn spawn_with_upgrades(self: Box<Self>) -> http1::SendRequest<B> {
        if let Some(conn) = self.conn {
            let conn = conn.with_upgrades();
            tokio::spawn(async move {
                if let Err(error) = conn.await {
                    tracing::debug!(%error, "upgraded upstream connection ended");
                }
            });
        }
        self.send
    }

    /// Drives the connection along while a response body streams.
    pub fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
        body: &mut Incoming,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        self.drive(cx);
        Pin::new(body).poll_frame(cx)
    }

    /// Can take another request now.
    fn is_idle(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()));
        self.conn.is_some() && self.send.is_ready()
    }
}

/// A TCP connection to `key` (an ExternalName resolved, never to this host).
pub(crate) async fn open(key: &Key) -> Result<TcpStream, ConnectError> {
    match key {
        Key::Addr(addr) => TcpStream::connect(addr).await.map_err(ConnectError::Io),
        Key::Name(authority) => {
            let host = authority.host();
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let port = authority.port_u16().unwrap_or(80);
            let addrs = tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| ConnectError::Resolve(Some(e)))?;
            let mut last = None;
            let mut refused = false;
            for addr in addrs {
                if points_at_this_host(addr.ip()) {
                    refused = true;
                    continue;
                }
                match TcpStream::connect(addr).await {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = Some(e),
                }
            }
            Err(match last {
                Some(e) => ConnectError::Io(e),
                None if refused => ConnectError::Refused,
                None => ConnectError::Resolve(None),
            })
        }
    }
}

/// Loopback, link-local (metadata services), unspecified: where a resolved ExternalName
/// must not send the proxy.
fn points_at_this_host(ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    match ip {
        std::net::IpAddr::V4(a) => a.is_loopback() || a.is_link_local() || a.is_unspecified(),
        std::net::IpAddr::V6(a) => {
            a.is_loopback() || a.is_unicast_link_local() || a.is_unspecified()
        }
    }
}

thread_local! {
    /// The worker this thread serves, which picks its pool shard; 0 off worker threads.
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as worker `index`: the connections it pools go to shard
/// `index` and it takes connections only from there.
pub fn enter_worker(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// Idle upstream connections, one shard per worker.
pub struct Pool<B: SendBody> {
    shards: Box<[Mutex<Idle<B>>]>,
    max_idle_per_key: usize,
}

/// An idle connection and since when.
type Parked<B> = (Box<Upstream<B>>, Instant);

struct Idle<B: SendBody> {
    by_key: HashMap<Key, Vec<Parked<B>>>,
    last_sweep: Instant,
}

impl<B: SendBody> Pool<B> {
    /// A pool for `workers` workers, each keeping at most `max_idle_per_key` idle
    /// connections per endpoint (0: none).
    pub fn new(max_idle_per_key: usize, workers: usize) -> Self {
        Pool {
            shards: (0..workers.max(1))
                .map(|_| {
                    Mutex::new(Idle {
                        by_key: HashMap::new(),
                        last_sweep: Instant::now(),
                    })
                })
                .collect(),
            max_idle_per_key,
        }
    }

    /// The calling worker's shard.
    fn shard(&self) -> &Mutex<Idle<B>> {
        &self.shards[WORKER.with(Cell::get) % self.shards.len()]
    }

    /// The most recently used idle connection to `key` that the upstream has not closed.
    pub fn take(&self, key: &Key) -> Option<Box<Upstream<B>>> {
        loop {
            let (mut up, since) = {
                let mut idle = self.shard().lock().unwrap_or_else(|e| e.into_inner());
                let list = idle.by_key.get_mut(key)?;
                let popped = list.pop();
                if list.is_empty() {
                    idle.by_key.remove(key);
                }
                popped?
            };
            // Dropped (closed) outside the lock when stale.
            if since.elapsed() < IDLE_TIMEOUT && up.is_idle() {
                up.reused = true;
                return Some(up);
            }
        }
    }

    /// Keeps `up` for reuse if it can take another request. When its endpoint already has
    /// `max_idle_per_key` idle connections, the longest idle one makes room.
    pub fn put(&self, mut up: Box<Upstream<B>>) {
        if self.max_idle_per_key == 0 || !up.is_idle() {
            return;
        }
        let now = Instant::now();
        // Closed after the lock is released.
        let mut stale = Vec::new();
        {
            let mut guard = self.shard().lock().unwrap_or_else(|e| e.into_inner());
            let idle = &mut *guard;
            if now.duration_since(idle.last_sweep) > IDLE_TIMEOUT / 3 {
                idle.last_sweep = now;
                idle.by_key.retain(|_, list| {
                    let keep = list
                        .iter()
                        .position(|(_, since)| now.duration_since(*since) < IDLE_TIMEOUT)
                        .unwrap_or(list.len());
                    stale.extend(list.drain(..keep));
                    !list.is_empty()
                });
            }
            let list = idle.by_key.entry(up.key.clone()).or_default();
            if list.len() >= self.max_idle_per_key {
                stale.push(list.remove(0));
            }
            list.push((up, now));
        }
        drop(stale);
    }

    /// Idle connections kept now, by all workers.
    pub fn idle(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let idle = shard.lock().unwrap_or_else(|e| e.into_inner());
                idle.by_key.values().map(Vec::len).sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_endpoint_keeps_its_number_while_held_and_a_freed_number_is_given_again() {
        let a = Key::Addr("10.0.0.1:80".parse().unwrap());
        let b = Key::Addr("10.0.0.2:80".parse().unwrap());
        let c = Key::Name("svc.example:80".parse().unwrap());
        let mut numbers = super::Numbers::default();
        let na = numbers.hold(&a);
        let nb = numbers.hold(&b);
        assert_ne!(na, nb);
        assert_eq!(numbers.hold(&a), na, "a second holder, the same number");
        numbers.release(&a);
        assert_eq!(numbers.hold(&c), 2, "a is still held: c gets a new number");
        numbers.release(&a);
        assert!(!numbers.held.contains_key(&a), "the last holder freed it");
        let d = Key::Addr("10.0.0.4:80".parse().unwrap());
        assert_eq!(numbers.hold(&d), na, "a's number, free again, goes to d");
        assert_eq!(numbers.hold(&b), nb, "b kept its number throughout");
        numbers.release(&b);
        numbers.release(&b);
        numbers.release(&b);
        assert_eq!(numbers.free, vec![nb], "released once per hold, no more");
    }

    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::Empty;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    type Up = Upstream<Empty<Bytes>>;

    /// Serves `ok` to every request head, on each connection; counts the connections
    /// accepted and those open. Setting `close` closes the open ones.
    struct Server {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        open: Arc<AtomicUsize>,
        close: tokio::sync::watch::Sender<bool>,
    }

    async fn server() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (close, close_rx) = tokio::sync::watch::channel(false);
        let (count, live) = (accepted.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                live.fetch_add(1, Ordering::SeqCst);
                let (live, mut close) = (live.clone(), close_rx.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        tokio::select! {
                            n = s.read(&mut chunk) => {
                                let n = n.unwrap_or(0);
                                if n == 0 {
                                    break;
                                }
                                buf.extend_from_slice(&chunk[..n]);
                                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                    buf.drain(..end + 4);
                                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                                    if s.write_all(ok).await.is_err() {
                                        break;
                                    }
                                }
                            }
                            _ = async { close.wait_for(|c| *c).await.map(|_| ()) } => break,
                        }
                    }
                    drop(s);
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Server {
            addr,
            accepted,
            open,
            close,
        }
    }

    fn get() -> Request<Empty<Bytes>> {
        Request::builder()
            .uri("/")
            .header(http::header::HOST, "a.test")
            .body(Empty::new())
            .unwrap()
    }

    /// One request on a connection from `pool` (or a new one); the body read to its end;
    /// the connection offered back to the pool.
    async fn exchange(pool: &Pool<Empty<Bytes>>, key: &Key) -> Vec<u8> {
        let mut up: Box<Up> = match pool.take(key) {
            Some(up) => up,
            None => Upstream::connect(key.clone(), Duration::from_secs(5))
                .await
                .unwrap(),
        };
        let response = up.send(get()).await.ok().unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut read = Vec::new();
        while let Some(frame) = poll_fn(|cx| up.poll_body(cx, &mut body)).await {
            read.extend_from_slice(frame.unwrap().data_ref().unwrap());
        }
        pool.put(up);
        read
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_response_body_has_ended() {
        let server = server().await;
        let pool = Pool::new(4, 1);
        let key = Key::Addr(server.addr);
        for _ in 0..3 {
            assert_eq!(exchange(&pool, &key).await, b"ok");
            assert_eq!(pool.idle(), 1);
        }
        let accepted = || server.accepted.load(Ordering::SeqCst);
        assert_eq!(accepted(), 1, "three requests, one connection");

        let none = Pool::new(0, 1);
        for _ in 0..2 {
            assert_eq!(exchange(&none, &key).await, b"ok");
        }
        assert_eq!(none.idle(), 0);
        assert_eq!(accepted(), 3, "a pool of 0 keeps nothing");
    }

    #[tokio::test]
    async fn a_worker_reuses_only_the_connections_it_pooled() {
        let server = server().await;
        let pool = Pool::new(4, 2);
        let key = Key::Addr(server.addr);
        let accepted = || server.accepted.load(Ordering::SeqCst);
        enter_worker(0);
        exchange(&pool, &key).await;
        enter_worker(1);
        assert!(
            pool.take(&key).is_none(),
            "worker 0's connection stays with it"
        );
        exchange(&pool, &key).await;
        assert_eq!(accepted(), 2, "worker 1 opened its own");
        exchange(&pool, &key).await;
        enter_worker(0);
        exchange(&pool, &key).await;
        assert_eq!(accepted(), 2, "each worker reused its own");
        assert_eq!(pool.idle(), 2);
    }

    #[tokio::test]
    async fn an_idle_connection_the_upstream_closed_is_not_reused() {
        let server = server().await;
        let pool = Pool::new(4, 1);
        let key = Key::Addr(server.addr);
        exchange(&pool, &key).await;
        assert_eq!(pool.idle(), 1);
        server.close.send_replace(true);
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.open.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < deadline, "the server never closed");
            tokio::task::yield_now().await;
        }
        // On loopback the FIN is in this socket's queue once the server's close returned.
        assert!(
            pool.take(&key).is_none(),
            "a connection the upstream closed is handed out"
        );
        assert_eq!(pool.idle(), 0);
        server.close.send_replace(false);
        assert_eq!(exchange(&pool, &key).await, b"ok");
        assert_eq!(
            server.accepted.load(Ordering::SeqCst),
            2,
            "a new connection replaced it"
        );
    }

    #[tokio::test]
    async fn a_request_on_a_connection_the_upstream_closed_comes_back_unsent() {
        // What happens when the upstream's FIN arrives between the pool's check and the
        // request: the request must come back (to go out on another connection), not wait.
        let server = server().await;
        let mut up: Box<Up> = Upstream::connect(Key::Addr(server.addr), Duration::from_secs(5))
            .await
            .unwrap();
        let mut body = up.send(get()).await.ok().unwrap().into_body();
        while let Some(frame) = poll_fn(|cx| up.poll_body(cx, &mut body)).await {
            frame.unwrap();
        }
        server.close.send_replace(true);
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.open.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < deadline, "the server never closed");
            tokio::task::yield_now().await;
        }
        let sent = tokio::time::timeout(Duration::from_secs(5), up.send(get())).await;
        assert!(
            matches!(sent, Ok(Err(Ok(_)))),
            "the request is handed back unsent, at once"
        );
    }

    #[tokio::test]
    async fn a_connection_that_cannot_open_says_why() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let Err(e) = Up::connect(Key::Addr(closed), Duration::from_secs(5)).await else {
            panic!("connected to a closed port");
        };
        assert!(
            matches!(e, ConnectError::Io(ref io) if io.kind() == std::io::ErrorKind::ConnectionRefused),
            "{e:?}"
        );
        // A name (an ExternalName backend) is resolved first; one that resolves only to
        // this host (loopback, link-local) is refused without connecting.
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = open.local_addr().unwrap().port();
        for name in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("169.254.169.254:{port}"),
        ] {
            let key = Key::Name(name.parse().unwrap());
            let Err(e) = Up::connect(key, Duration::from_secs(5)).await else {
                panic!("connected to {name}");
            };
            assert!(matches!(e, ConnectError::Refused), "{name}: {e:?}");
        }
    }
}
