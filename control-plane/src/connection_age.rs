//! The end of a gRPC connection's life: `--grpc-max-connection-age`, then its grace.
//!
//! At the age the server sends GOAWAY (NO_ERROR) and takes no new streams, so that proxies
//! reconnect and spread over the replicas again after a rollout; the streams already open
//! (route streams never end by themselves) get the grace, then the connection is closed.
//!
//! tonic's own grace (`Server::max_connection_age_grace`) does not follow the GOAWAY, it
//! replaces it: with a grace set, tonic 0.14 sleeps for the age and the grace, then drops
//! the connection, and sends no GOAWAY at all. So tonic is given the age alone (it sends
//! the GOAWAY), and each accepted connection is wrapped in [`Aged`], which ends it once
//! the age and the grace have passed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// A connection that fails every read and write once its lifetime has passed (the server
/// then drops it, which closes the socket).
#[derive(Debug)]
pub struct Aged<IO> {
    inner: IO,
    end: Pin<Box<Sleep>>,
}

impl<IO> Aged<IO> {
    /// `inner`, ending `lifetime` from now.
    pub fn new(inner: IO, lifetime: Duration) -> Self {
        Aged {
            inner,
            end: Box::pin(tokio::time::sleep(lifetime)),
        }
    }

    /// Whether the lifetime is over; otherwise `cx` is woken when it is.
    fn over(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.end.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection has outlived --grpc-max-connection-age and its grace",
            )
        })
    }
}

/// Every connection of `incoming`, ending `lifetime` after it was accepted.
pub fn aged<S, IO, E>(incoming: S, lifetime: Duration) -> impl Stream<Item = Result<Aged<IO>, E>>
where
    S: Stream<Item = Result<IO, E>>,
{
    incoming.map(move |accepted| accepted.map(|io| Aged::new(io, lifetime)))
}

impl<IO: AsyncRead + Unpin> AsyncRead for Aged<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(over) = this.over(cx) {
            return Poll::Ready(Err(over));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Aged<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(over) = this.over(cx) {
            return Poll::Ready(Err(over));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(over) = this.over(cx) {
            return Poll::Ready(Err(over));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The identity and address of the connection are the wrapped connection's.
impl<IO: Connected> Connected for Aged<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Bytes pass both ways until the lifetime is over; then a pending read fails at
    /// once (nothing else wakes it) and so does a write.
    #[tokio::test]
    async fn a_connection_works_until_its_lifetime_is_over_then_fails() {
        let (client, server) = tokio::io::duplex(64);
        let (mut client, started) = (client, Instant::now());
        let mut server = Aged::new(server, Duration::from_millis(300));
        client.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        server.write_all(b"back").await.unwrap();
        let mut back = [0u8; 4];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"back");

        let error = server.read(&mut got).await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(took >= Duration::from_millis(300), "ended after {took:?}");
        assert!(took < Duration::from_secs(5), "ended only after {took:?}");
        assert!(server.write_all(b"late").await.is_err());
    }
}
