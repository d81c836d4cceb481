//! The admin listeners of both planes (`/healthz`, `/readyz`, `/metrics`, debug pages):
//! small HTTP servers that a hostile or broken client must not exhaust. Each connection
//! must send its first byte, and each request head, within the header read timeout, and
//! has a lifetime; the listener has a connection cap; and a failed accept for lack of
//! file descriptors backs off instead of spinning. The pages both planes answer alike
//! (plain text, `/healthz`, `/metrics`) are here too.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// A page of the admin listeners.
pub type Page = Response<Full<Bytes>>;

/// A page with `status`, `content_type` and `body`.
pub fn reply(status: StatusCode, content_type: &str, body: String) -> Page {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// A plain-text page.
pub fn text(status: StatusCode, body: String) -> Page {
    reply(status, "text/plain; charset=utf-8", body)
}

/// `/healthz`: the process answers (liveness; readiness is each plane's own).
pub fn healthz() -> Page {
    text(StatusCode::OK, "ok\n".into())
}

/// `/metrics`: `registry` in the OpenMetrics text format.
pub fn metrics(registry: &Registry) -> Page {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body,
        ),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        ),
    }
}

/// Limits of an admin listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request head must arrive within this time.
    pub header_read_timeout: Duration,
    /// A connection is closed after this long, whatever it is doing.
    pub max_connection_age: Duration,
    /// Most connections open at once; past it new ones are closed at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(60),
            max_connections: 64,
        }
    }
}

/// After a failed accept: a lack of file descriptors or memory (EMFILE, ENFILE, ENOBUFS,
/// ENOMEM) does not go away by retrying at once, so wait a little instead of spinning;
/// other errors (a connection reset before it was accepted) are retried at once.
pub async fn accept_backoff(error: &std::io::Error) {
    if error.raw_os_error().is_some_and(crate::out_of_resources) {
        tracing::warn!(%error, "accept failed: out of file descriptors or memory; backing off");
        tokio::time::sleep(Duration::from_millis(100)).await;
    } else {
        tracing::debug!(%error, "accept failed");
    }
}

/// Serves `handler` on `listener` under `limits` until `shutdown` completes.
pub async fn serve<H>(
    listener: TcpListener,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(&Request<Incoming>) -> Page + Clone + Send + Sync + 'static,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                accept_backoff(&error).await;
                continue;
            }
        };
        if open.fetch_add(1, Ordering::AcqRel) >= limits.max_connections {
            open.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(
                max = limits.max_connections,
                "admin connection limit reached; closing"
            );
            continue;
        }
        let handler = handler.clone();
        let open = open.clone();
        tokio::spawn(async move {
            // A connection that sends nothing must not hold a slot either (hyper's header
            // timer starts only once it has chosen HTTP/1 or HTTP/2 from the first bytes).
            let mut first = [0u8; 1];
            let spoke = tokio::time::timeout(limits.header_read_timeout, stream.peek(&mut first));
            if !matches!(spoke.await, Ok(Ok(n)) if n > 0) {
                open.fetch_sub(1, Ordering::AcqRel);
                return;
            }
            let svc = hyper::service::service_fn(move |req| {
                let response = handler(&req);
                async move { Ok::<_, Infallible>(response) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            builder.http2().timer(TokioTimer::new());
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(limits.max_connection_age, conn).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}
