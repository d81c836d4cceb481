//! A small echo upstream: answers every request with its own name, so a test can see which
//! backend served. It speaks HTTP/1.1 and h2c, and reports what it received in headers:
//! `x-echo-name`, `x-echo-path` (path and query), `x-echo-host`, `x-echo-version` (the
//! HTTP version it was asked in, `HTTP/1.1` or `HTTP/2.0`), `x-echo-headers` (the names
//! of all request headers) and `x-echo-body-len`; forwarded headers
//! (`x-forwarded-*`, `x-real-ip`, `forwarded`), `x-request-id`, `traceparent` and `tracestate` are copied back as
//! `x-echo-<name>`.
//!
//! A request with `?seen_key=K` is recorded under K (in this process): `?seen=K` answers
//! how many were, in `x-echo-seen`, with the last one's path and query in
//! `x-echo-seen-path`, its Host in `x-echo-seen-host` and its header names in
//! `x-echo-seen-headers` (what a mirror got).
//!
//! `?delay_ms=N` makes it wait N ms before answering (a slow upstream; `--delay-ms` makes
//! every answer wait); `?bytes=N`
//! answers N bytes of `x` instead of the name; `?status=S` answers S (a failing
//! upstream), and with `&fail_first=N&key=K` only the first N requests with key K do.
//! A request with
//! `Upgrade` is answered `101 Switching Protocols`, and the upgraded connection echoes
//! every byte back, unless the query has `refuse_upgrade` (then it is answered normally).
//!
//! Over TLS ([`serve_tls`]) every answer also says what the handshake was:
//! `x-echo-tls-sni` (the server name the client sent, empty when none) and
//! `x-echo-tls-alpn` (the protocol agreed, empty when none).

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use holdfast_lock::Lock;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// Requests seen per `key` by the failing answers (`fail_first`).
static FAILED: std::sync::Mutex<std::collections::BTreeMap<String, u32>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// What was recorded of a `seen_key`'s requests: how many, and the last one's path, Host
/// and header names.
type Seen = (u32, String, String, String);

/// The requests recorded per `seen_key`.
static SEEN: std::sync::Mutex<std::collections::BTreeMap<String, Seen>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Serves the echo backend `name` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, name: String) -> std::io::Result<()> {
    serve_after(listener, name, std::time::Duration::ZERO).await
}

/// [`serve`], every answer after `delay` (a slow backend).
pub async fn serve_after(
    listener: TcpListener,
    name: String,
    delay: std::time::Duration,
) -> std::io::Result<()> {
    let name: std::sync::Arc<str> = name.into();
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(serve_connection(stream, name.clone(), delay, None));
    }
}

/// Serves one connection (HTTP/1.1 with upgrades, or HTTP/2), every answer after `delay`;
/// over TLS, `handshake` (SNI, ALPN) is added to every answer.
async fn serve_connection<I>(
    io: I,
    name: std::sync::Arc<str>,
    delay: std::time::Duration,
    handshake: Option<(String, String)>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let (name, handshake) = (name.clone(), handshake.clone());
        async move {
            if !delay.is_zero() {
                // The upstream's own behaviour under test, not synchronisation.
                tokio::time::sleep(delay).await;
            }
            let mut response = respond(name, req).await?;
            if let Some((sni, alpn)) = handshake {
                for (header, value) in [("x-echo-tls-sni", sni), ("x-echo-tls-alpn", alpn)] {
                    if let Ok(v) = http::HeaderValue::from_str(&value) {
                        response.headers_mut().insert(header, v);
                    }
                }
            }
            Ok::<_, Infallible>(response)
        }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(TokioIo::new(io), svc)
        .await;
}

/// [`serve_after`] over TLS with `config` (its certificate; ALPN as it says): each
/// handshake within 10 s, and every answer says what the handshake was.
pub async fn serve_tls(
    listener: TcpListener,
    name: String,
    delay: std::time::Duration,
    config: std::sync::Arc<rustls::ServerConfig>,
) -> std::io::Result<()> {
    let name: std::sync::Arc<str> = name.into();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let (stream, _) = listener.accept().await?;
        let (name, acceptor) = (name.clone(), acceptor.clone());
        tokio::spawn(async move {
            let handshake = acceptor.accept(stream);
            let Ok(Ok(tls)) =
                tokio::time::timeout(std::time::Duration::from_secs(10), handshake).await
            else {
                return;
            };
            let session = tls.get_ref().1;
            let sni = session.server_name().unwrap_or_default().to_owned();
            let alpn = session
                .alpn_protocol()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .unwrap_or_default();
            serve_connection(tls, name, delay, Some((sni, alpn))).await;
        });
    }
}

/// Binds `addr` and serves; returns the bound address and the serving task.
pub async fn spawn(
    addr: SocketAddr,
    name: &str,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, tokio::spawn(serve(listener, name.to_owned()))))
}

async fn respond(
    name: std::sync::Arc<str>,
    mut req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let refuse_upgrade = req
        .uri()
        .query()
        .is_some_and(|q| q.contains("refuse_upgrade"));
    if let Some(protocol) = req
        .headers()
        .get(http::header::UPGRADE)
        .filter(|_| !refuse_upgrade)
        .cloned()
    {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let (mut r, mut w) = tokio::io::split(TokioIo::new(upgraded));
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        return Ok(Response::builder()
            .status(http::StatusCode::SWITCHING_PROTOCOLS)
            .header(http::header::CONNECTION, "upgrade")
            .header(http::header::UPGRADE, protocol)
            .header("x-echo-name", &*name)
            .body(Full::new(Bytes::new()))
            .expect("static response parts are valid"));
    }
    // A failing backend: `status=S` answers S; with `fail_first=N&key=K`, only the first
    // N requests with key K do (counted in this process), the rest are answered normally.
    let query = req.uri().query().unwrap_or_default().to_owned();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    if let Some(status) = param("status").and_then(|s| s.parse::<u16>().ok()) {
        let fails = match (param("fail_first"), param("key")) {
            (Some(n), Some(key)) => {
                let n: u32 = n.parse().unwrap_or(0);
                let mut seen = FAILED.locked();
                let count = seen.entry(key).or_insert(0);
                *count += 1;
                *count <= n
            }
            _ => true,
        };
        if fails {
            return Ok(Response::builder()
                .status(status)
                .header("x-echo-name", &*name)
                .body(Full::new(Bytes::from_static(b"failing on purpose\n")))
                .unwrap_or_default());
        }
    }
    let names: Vec<&str> = req.headers().keys().map(|k| k.as_str()).collect();
    let names = names.join(",");
    let path_and_query = req.uri().path_and_query().map(|p| p.as_str().to_owned());
    let path_and_query = path_and_query.unwrap_or_default();
    let seen_host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let recorded = {
        let mut seen = SEEN.locked();
        if let Some(key) = param("seen_key") {
            let entry = seen.entry(key).or_default();
            *entry = (entry.0 + 1, path_and_query, seen_host, names.clone());
        }
        param("seen").map(|key| seen.get(&key).cloned().unwrap_or_default())
    };
    let delay = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("delay_ms=")))
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = delay {
        // The upstream's own behaviour under test (a slow backend), not synchronisation.
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().host().map(str::to_owned))
        .unwrap_or_default();
    let mut resp = Response::builder()
        .header("x-echo-headers", names)
        .header("x-echo-name", &*name)
        .header("x-echo-path", &path)
        .header("x-echo-host", host)
        .header("x-echo-version", format!("{:?}", req.version()));
    if let Some((count, path, host, headers)) = recorded {
        resp = resp
            .header("x-echo-seen", count.to_string())
            .header("x-echo-seen-path", path)
            .header("x-echo-seen-host", host)
            .header("x-echo-seen-headers", headers);
    }
    for (k, v) in req.headers() {
        if k.as_str().starts_with("x-forwarded-")
            || k == "x-real-ip"
            || k == "forwarded"
            || k == "x-request-id"
            || k == "traceparent"
            || k == "tracestate"
        {
            resp = resp.header(format!("x-echo-{}", k.as_str()), v.clone());
        }
    }
    // Drain the request body so the connection stays reusable; report its length.
    let len = match req.into_body().collect().await {
        Ok(b) => b.to_bytes().len(),
        Err(_) => 0,
    };
    let size = req_query_value(&path, "bytes").and_then(|v| v.parse::<usize>().ok());
    let body = match size {
        Some(n) => Bytes::from(vec![b'x'; n]),
        None => Bytes::from(format!("{name}\n")),
    };
    let resp = resp
        .header("x-echo-body-len", len.to_string())
        .body(Full::new(body))
        .expect("static response parts are valid");
    Ok(resp)
}

/// The value of `key` in the query of `path_and_query`.
fn req_query_value<'a>(path_and_query: &'a str, key: &str) -> Option<&'a str> {
    path_and_query
        .split_once('?')?
        .1
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}
