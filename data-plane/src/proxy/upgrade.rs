//! Upgraded connections (WebSocket and the other protocols on `--allow-upgrade`): which
//! requests may upgrade, and the tunnels that copy bytes both ways once the upstream
//! answers 101, tracked so that shutdown can wait for them and then close them.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_util::task::TaskTracker;

use holdfast_http::headers::{is_upgrade, upgrade_allowed};

/// Does `req` ask for an upgrade that is forwarded as one? Only HTTP/1.1, and only the
/// protocols on the allowlist (never h2c); any other goes upstream as a plain request,
/// its Upgrade header removed.
pub(super) fn requested<B>(req: &Request<B>, allowed: &[String]) -> bool {
    req.version() == Version::HTTP_11
        && is_upgrade(req.headers())
        && upgrade_allowed(req.headers(), allowed)
}

/// The open tunnels.
pub(super) struct Tunnels {
    tracker: TaskTracker,
    close: tokio::sync::watch::Sender<bool>,
    /// A tunnel with no bytes either way for this long is closed.
    idle: Duration,
}

impl Tunnels {
    /// No tunnels yet; each closes after `idle` without traffic.
    pub(super) fn new(idle: Duration) -> Self {
        Tunnels {
            tracker: TaskTracker::new(),
            close: tokio::sync::watch::channel(false).0,
            idle,
        }
    }

    /// Opens a tunnel between the client's and the upstream's upgraded connections once
    /// both are ready. It keeps `held` (the client connection's and the endpoint's slots)
    /// until it ends.
    pub(super) fn open<H: Send + 'static>(&self, client: OnUpgrade, upstream: OnUpgrade, held: H) {
        let (idle, close) = (self.idle, self.close.subscribe());
        self.tracker.spawn(async move {
            let _held = held;
            if let (Ok(down), Ok(up)) = (client.await, upstream.await) {
                tunnel(TokioIo::new(down), TokioIo::new(up), idle, close).await;
            }
        });
    }

    /// Copies between two streams that have switched protocols (the native engine's,
    /// in the connection's own task) until the tunnel ends; counted among the tunnels,
    /// so shutdown waits for it and then closes it.
    pub(super) async fn run<A, B>(&self, down: A, up: B)
    where
        A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (idle, close) = (self.idle, self.close.subscribe());
        self.tracker
            .track_future(tunnel(down, up, idle, close))
            .await;
    }

    /// On shutdown: waits until `deadline` for the tunnels to end, then closes the rest.
    pub(super) async fn finish(&self, deadline: tokio::time::Instant) {
        self.tracker.close();
        if tokio::time::timeout_at(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::info!(
                tunnels = self.tracker.len(),
                "grace period over; closing upgraded tunnels"
            );
            self.close.send_replace(true);
            self.tracker.wait().await;
        }
    }

    /// Tunnels open.
    pub(super) fn len(&self) -> usize {
        self.tracker.len()
    }
}

/// Copies both ways between the client and the upstream of an upgraded connection until
/// either side closes, nothing moves for `idle`, or `close` turns true (shutdown).
async fn tunnel<A, B>(down: A, up: B, idle: Duration, mut close: tokio::sync::watch::Receiver<bool>)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let epoch = Instant::now();
    let last = AtomicU64::new(0);
    let (mut down, mut up) = (
        Touched::new(down, &last, epoch),
        Touched::new(up, &last, epoch),
    );
    let copy = tokio::io::copy_bidirectional(&mut down, &mut up);
    tokio::pin!(copy);
    let check = (idle / 4).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = &mut copy => return,
            _ = close.wait_for(|c| *c) => return,
            _ = tokio::time::sleep(check) => {
                let now = epoch.elapsed().as_millis() as u64;
                if now.saturating_sub(last.load(Ordering::Relaxed)) >= idle.as_millis() as u64 {
                    tracing::debug!("upgraded tunnel idle; closing");
                    return;
                }
            }
        }
    }
}

/// A stream that records when bytes last moved through it.
struct Touched<'a, S> {
    inner: S,
    last: &'a AtomicU64,
    epoch: Instant,
}

impl<'a, S> Touched<'a, S> {
    fn new(inner: S, last: &'a AtomicU64, epoch: Instant) -> Self {
        Touched { inner, last, epoch }
    }
    fn touch(&self) {
        self.last
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Touched<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Touched<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
