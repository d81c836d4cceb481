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
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
pub use holdfast_http::upstream::{ConnectError, IDLE_TIMEOUT, Key, Number, Secure, Stream, open};
use holdfast_lock::Lock;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a request body must be to be sent upstream.
pub trait SendBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B> SendBody for B where B: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

/// One HTTP/1.1 connection to an upstream, with the future that runs it.
pub struct Upstream<B: SendBody> {
    key: Key,
    send: http1::SendRequest<B>,
    /// None once the connection has finished (closed or failed). Dropping it then matters:
    /// a request queued on a connection that closed without taking it comes back (as
    /// unsent) only when the connection is dropped.
    conn: Option<http1::Connection<TokioIo<Stream>, B>>,
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
                let mut idle = self.shard().locked();
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
            let mut guard = self.shard().locked();
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
                let idle = shard.locked();
                idle.by_key.values().map(Vec::len).sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::Empty;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
                    tokio::select! {
                        () = answer_ok(&mut s) => {}
                        _ = async { close.wait_for(|c| *c).await.map(|_| ()) } => {}
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

    /// Answers `ok` to every request head on `s` until it ends.
    async fn answer_ok<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while let Ok(n) = s.read(&mut chunk).await {
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if s.write_all(ok).await.is_err() {
                    return;
                }
                // Over TLS the answer may wait in the session until flushed.
                if s.flush().await.is_err() {
                    return;
                }
            }
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
        // Resolving names and refusing this host's addresses: `holdfast_http::upstream`'s
        // tests.
    }

    /// A TLS server for `sans` from a CA of its own, answering `ok` over HTTP/1.1 on each
    /// connection; returns its address, the CA (PEM) and how many handshakes completed.
    async fn tls_server(sans: &[&str]) -> (SocketAddr, String, Arc<AtomicUsize>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
        let cert = rcgen::CertificateParams::new(sans)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let count = handshakes.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(s).await else {
                        return;
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                    answer_ok(&mut s).await;
                });
            }
        });
        (addr, ca.pem(), handshakes)
    }

    fn secure(to: SocketAddr, tls: &holdfast_proto::v1::BackendTls) -> Key {
        let c = holdfast_proto::backend_tls::client_config(tls, false).unwrap();
        Key::Secure(Arc::new(Secure {
            to: Key::Addr(to),
            name: c.name,
            config: c.config,
            settings: c.settings,
        }))
    }

    #[tokio::test]
    async fn a_tls_backend_is_verified_as_its_settings_say_and_its_connections_are_reused() {
        let (addr, ca, handshakes) = tls_server(&["web.internal"]).await;
        let (_, other_ca, _) = tls_server(&["web.internal"]).await;
        let verified = holdfast_proto::v1::BackendTls {
            server_name: "web.internal".into(),
            verify: true,
            ca_pem: ca.clone(),
            sni: true,
            subject_alt_names: Vec::new(),
        };
        let pool = Pool::new(4, 1);
        let key = secure(addr, &verified);
        for _ in 0..3 {
            assert_eq!(exchange(&pool, &key).await, b"ok");
        }
        assert_eq!(
            handshakes.load(Ordering::SeqCst),
            1,
            "three requests, one handshake"
        );
        assert_eq!(pool.idle(), 1);
        assert!(
            pool.take(&Key::Addr(addr)).is_none(),
            "a TLS connection is never given to a cleartext key"
        );
        let unverified_key = secure(
            addr,
            &holdfast_proto::v1::BackendTls {
                verify: false,
                ..verified.clone()
            },
        );
        assert!(
            pool.take(&unverified_key).is_none(),
            "a connection is given only to a key with the same TLS settings"
        );
        assert!(pool.take(&key).is_some(), "its own key takes it");
        let refused = |tls: holdfast_proto::v1::BackendTls| async move {
            let e = Up::connect(secure(addr, &tls), Duration::from_secs(5))
                .await
                .err();
            assert!(matches!(e, Some(ConnectError::Tls(_))), "{tls:?}: {e:?}");
        };
        // Another CA, another name, SANs none of which the certificate has: refused.
        refused(holdfast_proto::v1::BackendTls {
            ca_pem: other_ca.clone(),
            ..verified.clone()
        })
        .await;
        refused(holdfast_proto::v1::BackendTls {
            server_name: "other.internal".into(),
            ..verified.clone()
        })
        .await;
        refused(holdfast_proto::v1::BackendTls {
            subject_alt_names: vec!["a.internal".into(), "b.internal".into()],
            ..verified.clone()
        })
        .await;
        // One of the SANs on the certificate: taken, whatever the server name.
        let sans = holdfast_proto::v1::BackendTls {
            server_name: "other.internal".into(),
            subject_alt_names: vec!["a.internal".into(), "web.internal".into()],
            ..verified.clone()
        };
        assert_eq!(
            exchange(&Pool::new(0, 1), &secure(addr, &sans)).await,
            b"ok"
        );
        // Unverified: any certificate, encrypted all the same.
        let unverified = holdfast_proto::v1::BackendTls {
            verify: false,
            ca_pem: other_ca,
            server_name: "other.internal".into(),
            ..verified
        };
        let before = handshakes.load(Ordering::SeqCst);
        assert_eq!(
            exchange(&Pool::new(0, 1), &secure(addr, &unverified)).await,
            b"ok"
        );
        assert_eq!(handshakes.load(Ordering::SeqCst), before + 1);
    }
}
