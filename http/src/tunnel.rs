//! Upgraded connections' tunnels (WebSocket and the other protocols a proxy lets
//! upgrade): bytes copied both ways once the upstream has switched protocols, closed
//! after an idle time, and tracked so that shutdown can wait for them and then close
//! them.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::task::TaskTracker;

/// The open tunnels.
pub struct Tunnels {
    tracker: TaskTracker,
    close: tokio::sync::watch::Sender<bool>,
    /// A tunnel with no bytes either way for this long is closed.
    idle: Duration,
}

impl Tunnels {
    /// No tunnels yet; each closes after `idle` without traffic.
    pub fn new(idle: Duration) -> Self {
        Tunnels {
            tracker: TaskTracker::new(),
            close: tokio::sync::watch::channel(false).0,
            idle,
        }
    }

    /// Opens a tunnel, in a task of its own, between the client's and the upstream's
    /// upgraded connections once both are ready (the hyper engine's, whose upgrades
    /// come as futures). It keeps `held` (the client connection's and the endpoint's
    /// slots) until it ends.
    pub fn open<C, U, A, B, E, F, H>(&self, client: C, upstream: U, held: H)
    where
        C: Future<Output = Result<A, E>> + Send + 'static,
        U: Future<Output = Result<B, F>> + Send + 'static,
        A: AsyncRead + AsyncWrite + Unpin + Send,
        B: AsyncRead + AsyncWrite + Unpin + Send,
        E: Send,
        F: Send,
        H: Send + 'static,
    {
        let (idle, close) = (self.idle, self.close.subscribe());
        self.tracker.spawn(async move {
            let _held = held;
            if let (Ok(down), Ok(up)) = (client.await, upstream.await) {
                tunnel(down, up, idle, close).await;
            }
        });
    }

    /// Copies between two streams that have switched protocols (the native engine's,
    /// in the connection's own task) until the tunnel ends; counted among the tunnels,
    /// so shutdown waits for it and then closes it.
    pub async fn run<A, B>(&self, down: A, up: B)
    where
        A: AsyncRead + AsyncWrite + Unpin,
        B: AsyncRead + AsyncWrite + Unpin,
    {
        let (idle, close) = (self.idle, self.close.subscribe());
        self.tracker
            .track_future(tunnel(down, up, idle, close))
            .await;
    }

    /// On shutdown: waits until `deadline` for the tunnels to end, then closes the rest.
    // Once per shutdown, not per request.
    #[allow(clippy::disallowed_methods)]
    pub async fn finish(&self, deadline: tokio::time::Instant) {
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
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no tunnel is open.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }
}

/// Copies both ways between the client and the upstream of an upgraded connection until
/// either side closes, nothing moves for `idle`, or `close` turns true (shutdown).
// A tunnel lives for many exchanges: its idle check is its own, not a per-request wait.
#[allow(clippy::disallowed_methods)]
async fn tunnel<A, B>(down: A, up: B, idle: Duration, mut close: tokio::sync::watch::Receiver<bool>)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
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

impl<S: AsyncRead + Unpin> AsyncRead for Touched<'_, S> {
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

impl<S: AsyncWrite + Unpin> AsyncWrite for Touched<'_, S> {
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

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes go both ways; a tunnel with nothing moving for its idle time ends, and
    /// `finish` after a grace period closes the ones left.
    #[tokio::test]
    async fn a_tunnel_copies_both_ways_and_ends_when_idle_or_at_shutdown() {
        let tunnels = Tunnels::new(Duration::from_millis(300));
        let (mut client, down) = tokio::io::duplex(1024);
        let (up, mut server) = tokio::io::duplex(1024);
        let ended = std::sync::Arc::new(tokio::sync::Notify::new());
        let held = DropNotes(ended.clone());
        tunnels.open(async { Ok::<_, ()>(down) }, async { Ok::<_, ()>(up) }, held);
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        server.write_all(b"pong").await.unwrap();
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        assert_eq!(tunnels.len(), 1);
        // Nothing moves now: the tunnel ends by itself and gives back what it held.
        tokio::time::timeout(Duration::from_secs(10), ended.notified())
            .await
            .expect("an idle tunnel ended");
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "the client side is closed: {read:?}"
        );

        // A busy tunnel at shutdown: `finish` waits until its deadline, then closes it.
        let tunnels = Tunnels::new(Duration::from_secs(3600));
        let (mut client, down) = tokio::io::duplex(1024);
        let (up, _server) = tokio::io::duplex(1024);
        tunnels.open(async { Ok::<_, ()>(down) }, async { Ok::<_, ()>(up) }, ());
        client.write_all(b"x").await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        tokio::time::timeout(Duration::from_secs(10), tunnels.finish(deadline))
            .await
            .expect("finish closed the tunnel left after its deadline");
        assert_eq!(tunnels.len(), 0);
    }

    /// Tells when it is dropped.
    struct DropNotes(std::sync::Arc<tokio::sync::Notify>);

    impl Drop for DropNotes {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }
}
