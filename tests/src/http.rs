//! A minimal HTTP/1.1 client for tests (admin endpoints, traffic through proxies).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::metrics::{Scrape, Series};

/// GET `path` with `Host: host` from `addr` on a fresh connection: (status, body).
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Result<(u16, String)> {
    let (status, _, body) = get_full(addr, host, path).await?;
    Ok((status, body))
}

/// Like [`get`], also returning the response headers.
pub async fn get_full(
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(u16, http::HeaderMap, String)> {
    get_with(addr, host, path, &[]).await
}

/// Like [`get_full`], sending `headers` too.
pub async fn get_with(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, http::HeaderMap, String)> {
    request_with(addr, "GET", host, path, headers).await
}

/// Like [`get_with`], with `method` (no body).
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, http::HeaderMap, String)> {
    let fut = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, host);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Empty::<Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, anyhow::Error>((status, headers, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .with_context(|| format!("{method} http://{addr}{path} (Host {host}) timed out"))?
}

/// The value of the first sample of `series` in Prometheus text `body`, if there is one
/// ([`crate::metrics`]); text that does not parse is an error.
pub fn metric(body: &str, series: impl Into<Series>) -> Result<Option<f64>> {
    Ok(Scrape::parse(body)?.get(&series.into()))
}

/// Like [`metric`], for a series that must be there: a missing series is an error, never
/// read as zero (a test comparing counts must not pass because the metric is gone).
pub fn metric_value(body: &str, series: impl Into<Series>) -> Result<f64> {
    Scrape::parse(body)?.value(&series.into())
}
