//! Request mirrors (the Gateway API's `RequestMirror` filter): a copy of a request goes to
//! another backend as well, and the copy's answer is read as far as its status line and
//! dropped.
//!
//! A copy never delays or fails the request it copies. It is made when the request is
//! routed, and sent from a task of its own, which the request never waits for. Each copy
//! is bounded by its own timeout (`--mirror-timeout`, for the connect, the write and the
//! answer's status line together), and at most `--max-mirrors-in-flight` copies are in
//! flight: past that a copy is dropped, never queued. Each copy is counted by how it
//! ended ([`Outcome`], `holdfast_proxy_mirror_requests_total{outcome}`), when it ends (one
//! still in flight when the proxy stops is not).
//!
//! Only a request without a body is copied (a copy of a body would hold the request's
//! bytes for a second reader, or slow the request to the mirror's pace); a request with a
//! body is counted as `has_body` and not copied. Copies go over HTTP/1.1 to a Service's
//! endpoints only: a mirror backend that speaks h2c, or an ExternalName Service (whose
//! name lookup a timeout cannot stop), gets none (`unsupported`).

use std::sync::Arc;
use std::time::Duration;

use holdfast_http::headers::{
    FORWARDING, HOP_BY_HOP, HeaderChanges, HeaderLookup, Hop, add_forwarded, strip_hop_by_hop,
};
use holdfast_http::upstream::Key;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::metrics::Metrics;

/// How a request's copy to a mirror ended: the `outcome` label of
/// `holdfast_proxy_mirror_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The mirror answered (any status).
    Answered,
    /// The connect or the write failed, or what came back is not an HTTP/1 answer.
    Failed,
    /// No answer within `--mirror-timeout`.
    TimedOut,
    /// Not sent: `--max-mirrors-in-flight` copies were in flight already.
    Dropped,
    /// Not sent: the mirror's backend has no ready endpoint, or its reference does not
    /// resolve.
    NoEndpoint,
    /// Not sent: the request has a body.
    HasBody,
    /// Not sent: the mirror's backend speaks h2c, or is an ExternalName Service.
    Unsupported,
}

impl Outcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Dropped => "dropped",
            Outcome::NoEndpoint => "no_endpoint",
            Outcome::HasBody => "has_body",
            Outcome::Unsupported => "unsupported",
        }
    }
}

/// What a request's copy is made from: the request as it is forwarded (after its rule's
/// header changes and URL rewrite).
pub struct Copy<'a> {
    /// The method, as sent.
    pub method: &'a str,
    /// The path and query sent upstream.
    pub target: &'a str,
    /// The Host sent upstream.
    pub host: &'a str,
    /// The request's headers, as the client sent them.
    pub headers: &'a (dyn HeaderLookup + Sync),
    /// How the request reached this proxy, for the forwarding headers (None: the peer is
    /// not known, and the client's forwarding headers are left out).
    pub hop: Option<Hop<'a>>,
    /// The rule's request header changes.
    pub changes: Option<&'a HeaderChanges>,
    /// The loop-detection header and this proxy's token in it.
    pub loop_header: (&'a str, &'a HeaderValue),
    /// The original's `X-Request-Id` (sent unless the rule sets one).
    pub request_id: &'a str,
}

/// The HTTP/1.1 head of a request's copy, made as a forwarded request's: its method and
/// target, the Host sent upstream, the client's headers without the hop-by-hop ones (and
/// those `Connection` names) and its framing (a copy has no body), the forwarding headers
/// as the peer's trust sets them, the rule's changes, the original's request id, the loop-detection values the
/// request came with and this proxy's token after them, and `Connection: close`. A header
/// line that is not a valid name and value is left out.
pub fn copy_head(copy: &Copy<'_>) -> Vec<u8> {
    let mut headers = HeaderMap::new();
    copy.headers.each(&mut |name, value| {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    });
    strip_hop_by_hop(&mut headers, false);
    let (loop_name, loop_token) = copy.loop_header;
    let came_with: Vec<HeaderValue> = headers.get_all(loop_name).iter().cloned().collect();
    match copy.hop {
        Some(hop) => add_forwarded(&mut headers, hop),
        None => {
            for name in FORWARDING {
                headers.remove(name);
            }
        }
    }
    headers.remove(holdfast_http::headers::REQUEST_ID);
    if let Some(changes) = copy.changes {
        changes.apply(&mut headers);
    }
    let removed = copy
        .changes
        .is_some_and(|c| c.remove.contains(&holdfast_http::headers::REQUEST_ID));
    if !headers.contains_key(holdfast_http::headers::REQUEST_ID)
        && !removed
        && let Ok(id) = HeaderValue::from_str(copy.request_id)
    {
        headers.insert(holdfast_http::headers::REQUEST_ID, id);
    }
    // What the changes may not touch: this hop's framing and the loop-detection values.
    for name in HOP_BY_HOP
        .iter()
        .chain([&header::HOST, &header::CONTENT_LENGTH, &header::UPGRADE])
    {
        headers.remove(name);
    }
    headers.remove(loop_name);
    let mut out = Vec::with_capacity(256);
    for piece in [
        copy.method,
        " ",
        copy.target,
        " HTTP/1.1\r\nhost: ",
        copy.host,
        "\r\n",
    ] {
        out.extend_from_slice(piece.as_bytes());
    }
    let mut line = |name: &[u8], value: &[u8]| {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    };
    for (name, value) in &headers {
        line(name.as_str().as_bytes(), value.as_bytes());
    }
    for value in &came_with {
        line(loop_name.as_bytes(), value.as_bytes());
    }
    line(loop_name.as_bytes(), loop_token.as_bytes());
    line(b"connection", b"close");
    out.extend_from_slice(b"\r\n");
    out
}

/// The sender of every copy of this proxy: its cap on copies in flight and their timeout.
pub struct Mirrors {
    in_flight: Arc<Semaphore>,
    timeout: Duration,
    metrics: Metrics,
}

impl Mirrors {
    /// At most `max_in_flight` copies at once (at most [`Semaphore::MAX_PERMITS`]), each
    /// within `timeout`; counted in `metrics`.
    pub fn new(max_in_flight: usize, timeout: Duration, metrics: Metrics) -> Self {
        Mirrors {
            in_flight: Arc::new(Semaphore::new(max_in_flight.min(Semaphore::MAX_PERMITS))),
            timeout,
            metrics,
        }
    }

    /// Counts a copy that was not sent.
    pub fn not_sent(&self, outcome: Outcome) {
        self.metrics.count_mirror(outcome);
    }

    /// Sends `head` to the endpoint `to` from a task of its own and returns at once;
    /// without an endpoint, a free place among the copies in flight, or a runtime to run
    /// on, the copy is counted and not sent.
    pub fn send(&self, to: Option<Key>, head: Vec<u8>) {
        let Some(key) = to else {
            return self.not_sent(Outcome::NoEndpoint);
        };
        let Ok(place) = self.in_flight.clone().try_acquire_owned() else {
            return self.not_sent(Outcome::Dropped);
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.not_sent(Outcome::Dropped);
        };
        let (timeout, metrics) = (self.timeout, self.metrics.clone());
        runtime.spawn(async move {
            let outcome = match tokio::time::timeout(timeout, exchange(&key, &head)).await {
                Ok(Ok(())) => Outcome::Answered,
                Ok(Err(_)) => Outcome::Failed,
                Err(_) => Outcome::TimedOut,
            };
            metrics.count_mirror(outcome);
            drop(place);
        });
    }
}

/// Connects to `key`, writes `head`, and reads the answer's status line far enough to
/// know it is one (`HTTP/1.x NNN`); the rest is dropped with the connection.
async fn exchange(key: &Key, head: &[u8]) -> std::io::Result<()> {
    let mut stream = holdfast_http::upstream::open(key)
        .await
        .map_err(std::io::Error::other)?;
    stream.write_all(head).await?;
    let mut start = [0u8; 12];
    let mut got = 0;
    while got < start.len() {
        let n = stream.read(&mut start[got..]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    let status = &start[9..12];
    if start.starts_with(b"HTTP/1.") && status.iter().all(u8::is_ascii_digit) {
        Ok(())
    } else {
        Err(std::io::ErrorKind::InvalidData.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(lines: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in lines {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_copy_is_the_request_as_forwarded_with_the_loop_values_it_came_with_and_ours() {
        // And with the original's request id, not the one the client sent.
        let h = headers(&[
            ("host", "client.example"),
            ("x-keep", "1"),
            ("x-keep", "2"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "secret"),
            ("keep-alive", "timeout=5"),
            ("content-length", "0"),
            ("x-holdfast-loop", "another-proxy"),
            ("x-request-id", "the-clients-own"),
            ("x-forwarded-for", "192.0.2.9"),
            ("x-real-ip", "192.0.2.9"),
            ("x-remove", "gone"),
            ("x-set", "old"),
        ]);
        let changes = HeaderChanges {
            set: vec![
                (
                    HeaderName::from_static("x-set"),
                    HeaderValue::from_static("new"),
                ),
                // A change cannot give the copy a body, or drop the loop values.
                (
                    HeaderName::from_static("content-length"),
                    HeaderValue::from_static("9"),
                ),
            ],
            add: vec![(
                HeaderName::from_static("x-add"),
                HeaderValue::from_static("a"),
            )],
            remove: vec![
                HeaderName::from_static("x-remove"),
                HeaderName::from_static("x-holdfast-loop"),
            ],
        };
        let token = HeaderValue::from_static("ours");
        let head = copy_head(&Copy {
            method: "GET",
            target: "/rewritten?q=1",
            host: "upstream.example",
            headers: &h,
            hop: Some(Hop {
                client: "198.51.100.7".parse().unwrap(),
                port: 80,
                proto: "http",
                host: "client.example",
                trusted: false,
            }),
            changes: Some(&changes),
            loop_header: ("x-holdfast-loop", &token),
            request_id: "the-originals",
        });
        let text = String::from_utf8(head).unwrap();
        let lines: Vec<&str> = text.split("\r\n").collect();
        assert_eq!(lines[0], "GET /rewritten?q=1 HTTP/1.1");
        assert_eq!(lines[1], "host: upstream.example");
        assert!(text.ends_with("connection: close\r\n\r\n"), "{text}");
        let loop_values: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("x-holdfast-loop: "))
            .collect();
        assert_eq!(
            loop_values,
            ["another-proxy", "ours"],
            "appended, as forwarding does"
        );
        let has = |line: &str| lines.contains(&line);
        for kept in [
            "x-keep: 1",
            "x-keep: 2",
            "x-set: new",
            "x-add: a",
            "x-request-id: the-originals",
        ] {
            assert!(has(kept), "{kept}: {text}");
        }
        // From an untrusted peer: its address appended, its own claim replaced.
        assert!(has("x-forwarded-for: 192.0.2.9, 198.51.100.7"), "{text}");
        assert!(has("x-real-ip: 198.51.100.7"), "{text}");
        for gone in [
            "x-private",
            "keep-alive",
            "content-length",
            "x-remove",
            "x-set: old",
            "the-clients-own",
        ] {
            assert!(!text.contains(gone), "{gone}: {text}");
        }
        assert_eq!(lines.iter().filter(|l| l.starts_with("host:")).count(), 1);
    }

    #[tokio::test]
    async fn a_copy_without_an_endpoint_or_a_free_place_is_counted_and_not_sent() {
        let metrics = Metrics::new(&mut prometheus_client::registry::Registry::default());
        let mirrors = Mirrors::new(0, Duration::from_secs(1), metrics.clone());
        mirrors.send(None, b"GET / HTTP/1.1\r\n\r\n".to_vec());
        let key = Key::Addr("127.0.0.1:9".parse().unwrap());
        mirrors.send(Some(key), b"GET / HTTP/1.1\r\n\r\n".to_vec());
        assert_eq!(metrics.mirror_count(Outcome::NoEndpoint), Some(1));
        assert_eq!(metrics.mirror_count(Outcome::Dropped), Some(1));
        assert_eq!(metrics.mirror_count(Outcome::Answered), None);
    }
}
