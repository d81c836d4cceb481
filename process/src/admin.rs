//! The admin listeners of both planes (`/healthz`, `/readyz`, `/metrics`, debug pages):
//! small HTTP servers that a hostile or broken client must not exhaust, since the
//! kubelet's probes come here and a failed probe restarts a healthy pod. Each connection
//! must send its first byte within the sniff timeout (1 s) and each request head within
//! the header read timeout; an HTTP/1 connection lives at most `max_connection_age`, an
//! HTTP/2 one at most the header read timeout (nothing here needs a long one); the
//! listener has a connection cap, and each peer address a much smaller one of its own, so
//! that silent or slow connections from one address (or a few) never hold the slots the
//! kubelet's probes need; a failed accept for lack of file descriptors backs off instead
//! of spinning. The pages both planes answer alike (plain text, `/healthz`, `/metrics`)
//! are here too.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use holdfast_lock::Lock;
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
    /// Most connections open at once from one peer address.
    pub max_connections_per_peer: usize,
    /// A connection's first byte must arrive within this time.
    pub sniff_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(60),
            max_connections: 256,
            max_connections_per_peer: 8,
            sniff_timeout: Duration::from_secs(1),
        }
    }
}

/// Open connections, in all and per peer address, taken and given back together: the
/// admin listeners' caps, and the gRPC port's for peers without a certificate.
#[derive(Debug, Default)]
pub struct Open {
    /// Why a mutex: the count in all and the peer's count change together.
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// The caps of an [`Open`].
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Most connections in all.
    pub total: usize,
    /// Most connections from one peer address.
    pub per_peer: usize,
    /// Most connections in all, counting one from a peer with none open (at least
    /// `total`): so that a peer that holds nothing gets in while others hold every slot.
    pub new_peer_total: usize,
}

impl Limits {
    fn caps(&self) -> Caps {
        Caps {
            total: self.max_connections,
            per_peer: self.max_connections_per_peer,
            // A kubelet probing from its own address gets in while other addresses hold
            // every ordinary slot.
            new_peer_total: self.max_connections * 4,
        }
    }
}

impl Open {
    /// A slot for `peer`, or None past the caps.
    pub fn enter(self: &Arc<Self>, peer: IpAddr, caps: Caps) -> Option<Slot> {
        let mut counts = self.counts.locked();
        let (all, by_peer) = &mut *counts;
        let mine = by_peer.entry(peer).or_insert(0);
        let cap = if *mine == 0 {
            caps.new_peer_total.max(caps.total)
        } else {
            caps.total
        };
        if *all >= cap || *mine >= caps.per_peer {
            if *mine == 0 {
                by_peer.remove(&peer);
            }
            return None;
        }
        *mine += 1;
        *all += 1;
        Some(Slot {
            open: self.clone(),
            peer,
        })
    }
}

/// One open connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    open: Arc<Open>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.open.counts.locked();
        let (all, by_peer) = &mut *counts;
        *all -= 1;
        if let Some(n) = by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                by_peer.remove(&self.peer);
            }
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
    let open = Arc::new(Open::default());
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                accept_backoff(&error).await;
                continue;
            }
        };
        let Some(slot) = open.enter(peer.ip(), limits.caps()) else {
            tracing::debug!(
                %peer,
                max = limits.max_connections,
                per_peer = limits.max_connections_per_peer,
                "admin connection limit reached; closing"
            );
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _slot = slot;
            // A connection that sends nothing must not hold a slot either (hyper's header
            // timer starts only once it has chosen HTTP/1 or HTTP/2 from the first bytes).
            let mut first = [0u8; 3];
            let sniffed_by = tokio::time::Instant::now() + limits.sniff_timeout;
            let http2 = loop {
                let spoke = tokio::time::timeout_at(sniffed_by, stream.peek(&mut first));
                let Ok(Ok(n)) = spoke.await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                match is_http2(&first[..n]) {
                    Some(http2) => break http2,
                    // "P" or "PR": wait for the third byte (peek returns at once while
                    // bytes are there), within the same deadline.
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            };
            // HTTP/2 (its preface starts "PRI"): hyper has no header timer for it, and no
            // admin client needs a long-lived one.
            let age = if http2 {
                limits.header_read_timeout
            } else {
                limits.max_connection_age
            };
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
            let _ = tokio::time::timeout(age, conn).await;
        });
    }
}

/// Whether a connection's first bytes are HTTP/2's preface ("PRI"), HTTP/1 (anything
/// else, "POST" and "PUT" included), or too few to tell (a prefix of "PRI").
fn is_http2(first: &[u8]) -> Option<bool> {
    let preface = b"PRI";
    let n = first.len().min(preface.len());
    if first[..n] != preface[..n] {
        Some(false)
    } else if n < preface.len() {
        None
    } else {
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_whole_preface_start_is_http2() {
        assert_eq!(is_http2(b"PRI"), Some(true));
        assert_eq!(is_http2(b"GET"), Some(false));
        assert_eq!(is_http2(b"POS"), Some(false));
        assert_eq!(is_http2(b"PUT"), Some(false));
        assert_eq!(is_http2(b"PO"), Some(false));
        assert_eq!(is_http2(b"P"), None);
        assert_eq!(is_http2(b"PR"), None);
    }

    #[test]
    fn each_peer_has_a_cap_of_its_own_under_the_listeners() {
        let limits = Limits {
            max_connections: 5,
            max_connections_per_peer: 2,
            ..Limits::default()
        };
        let open = Arc::new(Open::default());
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
            [10, 0, 0, 3].into(),
        );
        let a1 = open.enter(a, limits.caps()).expect("a's first");
        let _a2 = open.enter(a, limits.caps()).expect("a's second");
        assert!(open.enter(a, limits.caps()).is_none(), "a's third");
        let _b1 = open.enter(b, limits.caps()).expect("b is not held up by a");
        let _b2 = open.enter(b, limits.caps()).expect("b's second");
        let _c1 = open.enter(c, limits.caps()).expect("the fifth in all");
        assert!(
            open.enter(c, limits.caps()).is_none(),
            "past the listener's cap"
        );
        // A peer with nothing open still gets one (a kubelet's probe), up to 4 x the cap.
        let d: IpAddr = [10, 0, 0, 4].into();
        let d1 = open.enter(d, limits.caps()).expect("a new peer's first");
        assert!(open.enter(d, limits.caps()).is_none(), "but not a second");
        drop(d1);
        drop(a1);
        let _c2 = open.enter(c, limits.caps()).expect("a slot given back");
        assert!(open.enter(a, limits.caps()).is_none(), "full again");
    }
}
