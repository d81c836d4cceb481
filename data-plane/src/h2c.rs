//! HTTP/2 over cleartext (prior knowledge) to backends whose Service port says
//! `appProtocol: kubernetes.io/h2c`: gRPC servers, mostly.
//!
//! HTTP/2 multiplexes, so each endpoint gets one shared connection, driven by a task of
//! its own, and every request to it is a stream on that connection (trailers included,
//! which gRPC answers its status in). A connection that has closed (the backend went
//! away, or sent GOAWAY) is replaced by a new one on the next request. A connection stays
//! open while it is in the map, idle or not; HTTP/2 keep-alive pings, sent while idle too,
//! close one whose backend stopped answering. A request that fails on a connection the
//! backend closed under it (GOAWAY) is answered 502, not sent to another endpoint.
//!
//! The map of connections is capped: past [`MAX_ENDPOINTS`] entries, the closed ones are
//! swept out before another is added, so endpoints that came and went cannot grow it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use holdfast_lock::Lock;
use http::header::{CONTENT_TYPE, HOST, TE};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Method, Request, Uri, Version};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use crate::upstream::{ConnectError, Key, SendBody, open};

/// How many endpoints' connections are kept before closed ones are swept out.
pub const MAX_ENDPOINTS: usize = 4096;

/// How often an idle HTTP/2 connection to a backend is pinged, and how long the answer
/// may take before the connection counts as dead.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The shared HTTP/2 connections, one per endpoint.
pub struct H2c<B: SendBody> {
    connections: Mutex<HashMap<Key, http2::SendRequest<B>>>,
}

impl<B: SendBody> Default for H2c<B> {
    fn default() -> Self {
        H2c {
            connections: Mutex::new(HashMap::new()),
        }
    }
}

impl<B: SendBody> H2c<B> {
    /// A sender on `key`'s connection, ready for a request: the open one, or a new one
    /// (connected and handshaken within `timeout`; `true` says it is new).
    pub async fn sender(
        &self,
        key: &Key,
        timeout: Duration,
    ) -> Result<(http2::SendRequest<B>, bool), ConnectError> {
        let open_one = self.lock().get(key).filter(|s| !s.is_closed()).cloned();
        if let Some(mut send) = open_one {
            // Ready at once unless the connection is closing (then a new one).
            if send.ready().await.is_ok() {
                return Ok((send, false));
            }
        }
        let mut send = tokio::time::timeout(timeout, connect::<B>(key))
            .await
            .unwrap_or(Err(ConnectError::Timeout))?;
        send.ready()
            .await
            .map_err(|e| ConnectError::Io(std::io::Error::other(e)))?;
        let mut connections = self.lock();
        if connections.len() >= MAX_ENDPOINTS {
            connections.retain(|_, s| !s.is_closed());
        }
        connections.insert(key.clone(), send.clone());
        Ok((send, true))
    }

    /// How many endpoints have a connection that is still open.
    pub fn open(&self) -> usize {
        self.lock().values().filter(|s| !s.is_closed()).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, http2::SendRequest<B>>> {
        self.connections.locked()
    }
}

/// Opens a connection to `key` and starts its task.
async fn connect<B: SendBody>(key: &Key) -> Result<http2::SendRequest<B>, ConnectError> {
    let stream = open(key).await?;
    let _ = stream.set_nodelay(true);
    let (send, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ConnectError::Io(std::io::Error::other(e)))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "h2c upstream connection ended");
        }
    });
    Ok(send)
}

/// The request sent to an h2c backend: the head the proxy made for upstream (`headers`,
/// Host set to the site), as HTTP/2. Its Host becomes the `:authority` (an HTTP/2 request
/// names its authority there), and a gRPC request says it takes trailers (`te: trailers`,
/// which HTTP/2 allows as the one value of TE and gRPC servers may ask for).
pub fn request<B>(
    method: Method,
    path_and_query: PathAndQuery,
    mut headers: HeaderMap,
    body: B,
) -> Request<B> {
    let authority = headers
        .get(HOST)
        .and_then(|h| Authority::try_from(h.as_bytes()).ok());
    let mut parts = http::uri::Parts::default();
    parts.path_and_query = Some(path_and_query.clone());
    if let Some(authority) = authority {
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(authority);
        headers.remove(HOST);
    }
    let uri = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from(path_and_query));
    let grpc = headers
        .get(CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_2;
    *request.headers_mut() = headers;
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_becomes_the_authority_and_a_grpc_call_takes_trailers() {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("grpc.example.com"));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        let r = request(
            Method::POST,
            PathAndQuery::from_static("/pkg.Echo/Call"),
            headers,
            (),
        );
        assert_eq!(r.version(), Version::HTTP_2);
        assert_eq!(r.uri(), "http://grpc.example.com/pkg.Echo/Call");
        assert!(r.headers().get(HOST).is_none(), "the authority says it");
        assert_eq!(r.headers()[TE], "trailers");

        // Not gRPC: no TE; a Host that is no authority stays a header.
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("bad host"));
        let r = request(Method::GET, PathAndQuery::from_static("/x?y"), headers, ());
        assert_eq!(r.uri(), "/x?y");
        assert_eq!(r.headers()[HOST], "bad host");
        assert!(r.headers().get(TE).is_none());
    }
}
