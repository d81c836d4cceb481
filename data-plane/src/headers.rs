//! Request checks and header rewriting, as pure functions over `http` types.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that apply to one hop only (RFC 9110 §7.6.1), always removed when forwarding.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Why a request is refused with 400 before routing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// Both Content-Length and Transfer-Encoding (a request-smuggling shape).
    #[error("both Content-Length and Transfer-Encoding are present")]
    LengthAndChunked,
    /// More than one Content-Length header, or a list of lengths.
    #[error("more than one Content-Length")]
    DuplicateLength,
    /// A Content-Length that is not a plain number.
    #[error("Content-Length is not a number")]
    BadLength,
    /// A Transfer-Encoding other than a final `chunked`.
    #[error("unsupported Transfer-Encoding")]
    BadTransferEncoding,
    /// No host to route on.
    #[error("no Host header")]
    NoHost,
    /// More than one Host header (RFC 9112 §3.2): which one routes is ambiguous.
    #[error("more than one Host header")]
    DuplicateHost,
    /// A head line ended by a bare LF instead of CRLF (RFC 9112 §2.2).
    #[error("a line of the request head ends without CR")]
    BareLineFeed,
}

/// Refuses the request shapes used for request smuggling.
pub fn check_framing(headers: &HeaderMap) -> Result<(), BadRequest> {
    let lengths: Vec<&HeaderValue> = headers.get_all(header::CONTENT_LENGTH).iter().collect();
    let te: Vec<&HeaderValue> = headers.get_all(header::TRANSFER_ENCODING).iter().collect();
    if !lengths.is_empty() && !te.is_empty() {
        return Err(BadRequest::LengthAndChunked);
    }
    if lengths.len() > 1 {
        return Err(BadRequest::DuplicateLength);
    }
    if headers.get_all(header::HOST).iter().nth(1).is_some() {
        return Err(BadRequest::DuplicateHost);
    }
    if let Some(v) = lengths.first() {
        let s = v.to_str().map_err(|_| BadRequest::BadLength)?;
        if s.contains(',') {
            return Err(BadRequest::DuplicateLength);
        }
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(BadRequest::BadLength);
        }
    }
    if !te.is_empty() {
        let codings: Vec<String> = te
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("\u{0}").split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .collect();
        if codings.last().map(String::as_str) != Some("chunked")
            || codings.iter().filter(|c| *c == "chunked").count() != 1
        {
            return Err(BadRequest::BadTransferEncoding);
        }
    }
    Ok(())
}

/// Is this an HTTP/1.1 upgrade request (WebSocket and the like)?
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_has(headers, "upgrade")
}

fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Removes hop-by-hop headers, including those named in `Connection`. For an upgrade,
/// `Connection: upgrade` and `Upgrade` are kept (they must reach the other side).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if keep_upgrade && name == header::UPGRADE {
            continue;
        }
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// Adds `X-Forwarded-For` (appending the client), `X-Forwarded-Proto` and
/// `X-Forwarded-Host` (the host the client asked for).
pub fn add_forwarded(headers: &mut HeaderMap, client: IpAddr, proto: &'static str, host: &str) {
    let xff = HeaderName::from_static("x-forwarded-for");
    let prior: Vec<String> = headers
        .get_all(&xff)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    let value = if prior.is_empty() {
        client.to_string()
    } else {
        format!("{}, {client}", prior.join(", "))
    };
    headers.remove(&xff);
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(xff, v);
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static(proto),
    );
    if let Ok(v) = HeaderValue::from_str(host) {
        headers.insert(HeaderName::from_static("x-forwarded-host"), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        assert_eq!(
            check_framing(&map(&[
                ("content-length", "5"),
                ("transfer-encoding", "chunked")
            ])),
            Err(BadRequest::LengthAndChunked)
        );
        assert_eq!(
            check_framing(&map(&[("content-length", "5"), ("content-length", "5")])),
            Err(BadRequest::DuplicateLength)
        );
        assert_eq!(
            check_framing(&map(&[("content-length", "5, 5")])),
            Err(BadRequest::DuplicateLength)
        );
        assert_eq!(
            check_framing(&map(&[("content-length", "+5")])),
            Err(BadRequest::BadLength)
        );
        assert_eq!(
            check_framing(&map(&[("transfer-encoding", "chunked, gzip")])),
            Err(BadRequest::BadTransferEncoding)
        );
        assert_eq!(
            check_framing(&map(&[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked")
            ])),
            Err(BadRequest::BadTransferEncoding)
        );
        assert_eq!(
            check_framing(&map(&[("transfer-encoding", "xchunked")])),
            Err(BadRequest::BadTransferEncoding)
        );
        assert_eq!(
            check_framing(&map(&[("host", "a.test"), ("host", "b.test")])),
            Err(BadRequest::DuplicateHost)
        );
    }

    #[test]
    fn ordinary_framing_passes() {
        assert_eq!(check_framing(&map(&[])), Ok(()));
        assert_eq!(check_framing(&map(&[("content-length", "42")])), Ok(()));
        assert_eq!(
            check_framing(&map(&[("transfer-encoding", "Chunked")])),
            Ok(())
        );
        assert_eq!(
            check_framing(&map(&[("transfer-encoding", "gzip, chunked")])),
            Ok(())
        );
    }

    #[test]
    fn hop_by_hop_headers_are_removed_including_those_named_in_connection() {
        let mut h = map(&[
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic x"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["accept"]);
    }

    #[test]
    fn upgrades_keep_their_upgrade_headers() {
        let mut h = map(&[
            ("connection", "Upgrade, x-secret"),
            ("upgrade", "websocket"),
            ("x-secret", "1"),
        ]);
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get("upgrade").unwrap(), "websocket");
        assert_eq!(h.get("connection").unwrap(), "upgrade");
        assert!(h.get("x-secret").is_none());
        assert!(!is_upgrade(&map(&[("upgrade", "websocket")])));
    }

    #[test]
    fn forwarded_headers_append_the_client_and_name_the_host() {
        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-proto", "https"),
        ]);
        add_forwarded(&mut h, "10.0.0.7".parse().unwrap(), "http", "a.example.com");
        assert_eq!(h.get("x-forwarded-for").unwrap(), "203.0.113.1, 10.0.0.7");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        assert_eq!(h.get("x-forwarded-host").unwrap(), "a.example.com");
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, "10.0.0.7".parse().unwrap(), "http", "b");
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.7");
    }
}
