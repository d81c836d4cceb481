//! Request-smuggling detection on the raw HTTP/1.1 byte stream.
//!
//! hyper already handles ambiguous framing safely (with both Content-Length and
//! Transfer-Encoding it drops the length and closes the connection; it folds identical
//! duplicate lengths into one), but it hides these shapes from the handler. holdfast
//! rejects them with 400, so this tracker follows the client's bytes: each request head
//! (checked as a whole) and its body framing (Content-Length or chunked), so it knows where
//! the next head starts. It flags the index of the first offending request; the handler of
//! that request answers 400 and closes the connection. It stops at an HTTP/2 preface, an
//! upgrade, anything it cannot parse (hyper then rejects it itself), or after a flag.

use crate::headers::BadRequest;

/// Most bytes of a request head the tracker keeps (hyper refuses larger heads anyway).
const MAX_HEAD: usize = 256 * 1024;

#[derive(Debug)]
enum State {
    /// Collecting a request head.
    Head(Vec<u8>),
    /// Skipping a fixed-length body.
    Fixed(u64),
    /// Reading a chunk-size line.
    ChunkSize(Vec<u8>),
    /// Skipping chunk data, then its CRLF.
    ChunkData(u64),
    /// Reading trailer lines until an empty one.
    Trailers(Vec<u8>),
    /// Not tracking any more.
    Off,
}

/// Follows one connection's client-to-server bytes.
#[derive(Debug)]
pub struct Tracker {
    state: State,
    /// Index (0-based) of the request whose head is being read.
    request: u64,
    /// The first offending request and why.
    flagged: Option<(u64, BadRequest)>,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            state: State::Head(Vec::new()),
            request: 0,
            flagged: None,
        }
    }
}

/// What a head says about its framing.
struct HeadInfo {
    length: Option<u64>,
    chunked: bool,
    upgrade: bool,
    h2_preface: bool,
}

fn parse_head(head: &[u8]) -> Result<HeadInfo, Option<BadRequest>> {
    let text = std::str::from_utf8(head).map_err(|_| None)?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    if request_line.starts_with("PRI * HTTP/2.0") {
        return Ok(HeadInfo {
            length: None,
            chunked: false,
            upgrade: false,
            h2_preface: true,
        });
    }
    let mut lengths: Vec<&str> = Vec::new();
    let mut te: Vec<&str> = Vec::new();
    let mut upgrade_header = false;
    let mut connection_upgrade = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            return Err(None);
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => lengths.push(value),
            "transfer-encoding" => te.push(value),
            "upgrade" => upgrade_header = true,
            "connection" => {
                connection_upgrade |= value
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            }
            _ => {}
        }
    }
    if !lengths.is_empty() && !te.is_empty() {
        return Err(Some(BadRequest::LengthAndChunked));
    }
    if lengths.len() > 1 || lengths.iter().any(|l| l.contains(',')) {
        return Err(Some(BadRequest::DuplicateLength));
    }
    let length = match lengths.first() {
        Some(l) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) => {
            Some(l.parse().map_err(|_| Some(BadRequest::BadLength))?)
        }
        Some(_) => return Err(Some(BadRequest::BadLength)),
        None => None,
    };
    let chunked = te
        .iter()
        .flat_map(|v| v.split(','))
        .last()
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
    if !te.is_empty() && !chunked {
        return Err(Some(BadRequest::BadTransferEncoding));
    }
    Ok(HeadInfo {
        length,
        chunked,
        upgrade: upgrade_header && connection_upgrade,
        h2_preface: false,
    })
}

impl Tracker {
    /// The first offending request (index) and why, if any.
    pub fn flagged(&self) -> Option<&(u64, BadRequest)> {
        self.flagged.as_ref()
    }

    /// True while part of a request head has arrived but not all of it: the time a client
    /// may take for that is the header read timeout. Not between requests (an idle
    /// keep-alive connection is governed by the idle timeout), and not once tracking has
    /// stopped (HTTP/2, an upgrade, or a connection hyper rejects itself).
    pub fn head_pending(&self) -> bool {
        matches!(&self.state, State::Head(buf) if !buf.is_empty())
    }

    /// Feeds bytes read from the client.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match &mut self.state {
                State::Off => return,
                State::Head(buf) => {
                    // Leading empty lines between requests are allowed (RFC 9112 §2.2).
                    if buf.is_empty() {
                        let skip = data
                            .iter()
                            .take_while(|b| **b == b'\r' || **b == b'\n')
                            .count();
                        data = &data[skip..];
                        if data.is_empty() {
                            return;
                        }
                    }
                    let before = buf.len();
                    buf.extend_from_slice(data);
                    let search_from = before.saturating_sub(3);
                    let Some(end) =
                        find(&buf[search_from..], b"\r\n\r\n").map(|i| search_from + i + 4)
                    else {
                        if buf.len() > MAX_HEAD {
                            self.state = State::Off;
                        }
                        return;
                    };
                    let consumed_now = end - before;
                    let head = std::mem::take(buf);
                    data = &data[consumed_now..];
                    match parse_head(&head[..end]) {
                        Err(Some(bad)) => {
                            self.flagged = Some((self.request, bad));
                            self.state = State::Off;
                            return;
                        }
                        Err(None) => {
                            self.state = State::Off;
                            return;
                        }
                        Ok(info) if info.h2_preface || info.upgrade => {
                            self.state = State::Off;
                            return;
                        }
                        Ok(info) => {
                            self.request += 1;
                            self.state = if info.chunked {
                                State::ChunkSize(Vec::new())
                            } else {
                                match info.length {
                                    Some(n) if n > 0 => State::Fixed(n),
                                    _ => State::Head(Vec::new()),
                                }
                            };
                        }
                    }
                }
                State::Fixed(n) => {
                    let take = (*n).min(data.len() as u64);
                    *n -= take;
                    data = &data[take as usize..];
                    if *n == 0 {
                        self.state = State::Head(Vec::new());
                    }
                }
                State::ChunkSize(line) => {
                    let Some(i) = data.iter().position(|b| *b == b'\n') else {
                        line.extend_from_slice(data);
                        if line.len() > 4096 {
                            self.state = State::Off;
                        }
                        return;
                    };
                    line.extend_from_slice(&data[..=i]);
                    data = &data[i + 1..];
                    let text = String::from_utf8_lossy(line);
                    let size = text
                        .trim_end()
                        .split(';')
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_owned();
                    match u64::from_str_radix(&size, 16) {
                        Ok(0) => self.state = State::Trailers(Vec::new()),
                        // Data, then its CRLF. A size this large is not a real chunk:
                        // stop following (hyper refuses it), never overflow.
                        Ok(n) => match n.checked_add(2) {
                            Some(n) => self.state = State::ChunkData(n),
                            None => self.state = State::Off,
                        },
                        Err(_) => self.state = State::Off,
                    }
                }
                State::ChunkData(n) => {
                    let take = (*n).min(data.len() as u64);
                    *n -= take;
                    data = &data[take as usize..];
                    if *n == 0 {
                        self.state = State::ChunkSize(Vec::new());
                    }
                }
                State::Trailers(line) => {
                    let Some(i) = data.iter().position(|b| *b == b'\n') else {
                        line.extend_from_slice(data);
                        if line.len() > MAX_HEAD {
                            self.state = State::Off;
                        }
                        return;
                    };
                    line.extend_from_slice(&data[..=i]);
                    data = &data[i + 1..];
                    let empty = line.as_slice() == b"\r\n" || line.as_slice() == b"\n";
                    line.clear();
                    if empty {
                        self.state = State::Head(Vec::new());
                    }
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_pending_from_its_first_byte_until_it_is_complete_and_not_between_requests() {
        let mut t = Tracker::default();
        assert!(
            !t.head_pending(),
            "a new connection waits for a request, no head yet"
        );
        t.feed(b"GET / HTTP/1.1\r\nHost: a");
        assert!(t.head_pending());
        t.feed(b"\r\n\r\n");
        assert!(
            !t.head_pending(),
            "complete head, no body: idle until the next request"
        );
        t.feed(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nab");
        assert!(!t.head_pending(), "reading a body is not reading a head");
        t.feed(b"cd");
        assert!(!t.head_pending());
        t.feed(b"\r\n");
        assert!(
            !t.head_pending(),
            "empty lines between requests are not a head"
        );
        t.feed(b"G");
        assert!(t.head_pending());
    }

    #[test]
    fn a_chunk_size_too_large_to_follow_stops_the_tracker_without_overflowing() {
        let mut t = Tracker::default();
        t.feed(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
        t.feed(b"ffffffffffffffff\r\n");
        assert!(t.flagged().is_none());
        assert!(!t.head_pending());
        t.feed(b"more bytes");
        assert!(t.flagged().is_none());
    }

    /// Feeds `stream` in every possible two-way split and in 1-byte pieces; all must agree.
    fn flagged(stream: &str) -> Option<(u64, BadRequest)> {
        let bytes = stream.as_bytes();
        let mut whole = Tracker::default();
        whole.feed(bytes);
        let expected = whole.flagged().cloned();
        for cut in 0..bytes.len() {
            let mut t = Tracker::default();
            t.feed(&bytes[..cut]);
            t.feed(&bytes[cut..]);
            assert_eq!(t.flagged().cloned(), expected, "split at {cut}");
        }
        let mut t = Tracker::default();
        for b in bytes {
            t.feed(std::slice::from_ref(b));
        }
        assert_eq!(t.flagged().cloned(), expected, "byte by byte");
        expected
    }

    const GET: &str = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn clean_pipelines_are_not_flagged() {
        let post = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
        let chunked = "POST /y HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n";
        assert_eq!(flagged(&format!("{GET}{post}{chunked}{GET}")), None);
    }

    #[test]
    fn length_and_chunked_together_are_flagged_at_their_request() {
        let bad = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n";
        assert_eq!(
            flagged(&format!("{GET}{bad}")),
            Some((1, BadRequest::LengthAndChunked))
        );
        let bad = "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nHost: a\r\n\r\n0\r\n\r\n";
        assert_eq!(flagged(bad), Some((0, BadRequest::LengthAndChunked)));
    }

    #[test]
    fn duplicate_lengths_are_flagged_even_when_equal() {
        let bad = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\nabc";
        assert_eq!(flagged(bad), Some((0, BadRequest::DuplicateLength)));
        let bad = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc";
        assert_eq!(flagged(bad), Some((0, BadRequest::DuplicateLength)));
    }

    #[test]
    fn a_smuggled_request_inside_a_body_is_not_mistaken_for_a_head() {
        // The body of the first request looks like a bad head; it is body, not a request.
        let body = "GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let first = format!(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(flagged(&format!("{first}{GET}")), None);
    }

    #[test]
    fn h2_prefaces_and_upgrades_stop_tracking() {
        assert_eq!(
            flagged(
                "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
            ),
            None
        );
        let upgrade =
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        assert_eq!(
            flagged(&format!(
                "{upgrade}POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"
            )),
            None
        );
    }
}
