//! The request head sent upstream, written from a parsed client head: the lines kept are
//! copied as they arrived, and only what the proxy adds is rendered (Host, the forwarding
//! headers, the request id, the loop header, the framing). The rules are those the hyper engine applies
//! to a `HeaderMap`, in the same order: a Gateway rule's header changes, then hop-by-hop
//! headers removed (with those `Connection` names, except forwarding headers and Host),
//! then the forwarding headers ([`crate::headers::add_forwarded`]'s rules), then Host and
//! the loop header. The head is written into one reused buffer: once it has grown to the
//! largest head of its connection, writing allocates nothing. [`plan_upstream_head`]
//! leaves the kept lines where they are and says where each run of the head is, for one
//! vectored write.

use std::io::Write as _;
use std::net::IpAddr;

use http::HeaderName;

use super::{BodyFraming, Known, RequestHead};
use crate::headers::{HeaderChanges, Hop};

/// What the proxy decided about a request, for its upstream head.
#[derive(Debug, Clone, Copy)]
pub struct Onward<'a> {
    /// The origin-form target sent (the normalised path and query, or as sent).
    pub target: &'a [u8],
    /// How the request reached the proxy; `hop.host` is also the Host sent.
    pub hop: Hop<'a>,
    /// An allowed upgrade: `Upgrade` and `Connection: upgrade` go upstream.
    pub keep_upgrade: bool,
    /// This proxy's loop header and token, appended.
    pub loop_header: (&'a str, &'a [u8]),
    /// A Gateway rule's header changes.
    pub changes: Option<&'a HeaderChanges>,
    /// A Gateway rule's rewritten host, sent as Host instead of `hop.host`.
    pub upstream_host: Option<&'a str>,
    /// The request's id, sent as `X-Request-Id` unless a rule sets its own or removes it.
    pub request_id: &'a [u8],
    /// This hop's `traceparent`, sent instead of any other (None: as they came).
    pub traceparent: Option<&'a [u8]>,
    /// This hop started a new trace (the client sent no valid `traceparent`): the
    /// client's `tracestate`, which belongs to no trace it continues, is not sent.
    pub drop_tracestate: bool,
}

/// One header of the request as changed by a Gateway rule: a line of the client's head
/// or a pair of the rule's.
#[derive(Clone, Copy)]
enum Line<'a> {
    Client(&'a super::Header),
    Rule(&'a HeaderName, &'a [u8]),
}

impl<'a> Line<'a> {
    fn name(&self, buf: &'a [u8]) -> &'a [u8] {
        match self {
            Line::Client(h) => h.name.of(buf),
            Line::Rule(n, _) => n.as_str().as_bytes(),
        }
    }
    fn value(&self, buf: &'a [u8]) -> &'a [u8] {
        match self {
            Line::Client(h) => h.value.of(buf),
            Line::Rule(_, v) => v,
        }
    }
    fn known(&self) -> Known {
        match self {
            Line::Client(h) => h.known,
            Line::Rule(n, _) => Known::of(n.as_str().as_bytes()),
        }
    }
    fn write(&self, buf: &[u8], out: &mut Vec<u8>) {
        match self {
            Line::Client(h) => out.extend_from_slice(h.line.of(buf)),
            Line::Rule(n, v) => {
                out.extend_from_slice(n.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(v);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

/// The forwarding headers the proxy sets, by name.
const FORWARDING_SET: [&str; 4] = [
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-real-ip",
];

/// The headers after a Gateway rule's changes (set, then add, then remove), in order:
/// the client's lines the rule leaves, then the pairs it sets, then those it adds.
fn changed<'a>(
    head: &'a RequestHead,
    buf: &'a [u8],
    changes: Option<&'a HeaderChanges>,
) -> impl Iterator<Item = Line<'a>> + Clone {
    let named = move |list: &'a [(HeaderName, http::HeaderValue)], name: &[u8]| {
        list.iter()
            .any(|(n, _)| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    };
    let removed = move |name: &[u8]| {
        changes.is_some_and(|c| {
            c.remove
                .iter()
                .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
        })
    };
    let (set, add): (&[_], &[_]) = match changes {
        Some(c) => (&c.set, &c.add),
        None => (&[], &[]),
    };
    // The body's framing is the client's: a rule never changes Content-Length or
    // Transfer-Encoding (the upstream would read another body than the one relayed).
    let framing = |name: &[u8]| {
        matches!(
            Known::of(name),
            Known::ContentLength | Known::TransferEncoding
        )
    };
    // A client line's name was recognised when it was parsed (`known`).
    let client = head.headers.iter().filter(move |h| {
        changes.is_none()
            || matches!(h.known, Known::ContentLength | Known::TransferEncoding)
            || (!named(set, h.name.of(buf)) && !removed(h.name.of(buf)))
    });
    // A name set twice keeps the last value (an insert replaces).
    let set_pairs = set.iter().enumerate().filter(move |(i, (n, _))| {
        let name = n.as_str().as_bytes();
        !framing(name) && !removed(name) && !set[i + 1..].iter().any(|(later, _)| later == n)
    });
    let add_pairs = add.iter().filter(move |(n, _)| {
        let name = n.as_str().as_bytes();
        !framing(name) && !removed(name)
    });
    client
        .map(Line::Client)
        .chain(set_pairs.map(|(_, (n, v))| Line::Rule(n, v.as_bytes())))
        .chain(add_pairs.map(|(n, v)| Line::Rule(n, v.as_bytes())))
}

/// Whether `Connection` (after the rule's changes) names `name` for removal: a token
/// that is neither `close`, `upgrade` nor a hop-by-hop header removed anyway.
fn connection_names<'a>(lines: impl Iterator<Item = Line<'a>>, buf: &'a [u8], name: &[u8]) -> bool {
    lines
        .filter(|l| l.known() == Known::Connection)
        .map(|l| l.value(buf))
        // A value that is not visible ASCII names nothing (hyper's `to_str` fails).
        .filter(|v| v.iter().all(|b| (b' '..=b'~').contains(b) || *b == b'\t'))
        .flat_map(|v| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"upgrade"))
        .any(|t| t.eq_ignore_ascii_case(name))
}

/// Whether a value is what `HeaderValue::to_str` accepts (visible ASCII, space, tab).
fn is_text(v: &[u8]) -> bool {
    v.iter().all(|b| (b' '..=b'~').contains(b) || *b == b'\t')
}

/// Writes the head sent upstream for `head` (parsed from `buf`) into `out`, replacing
/// what it held. `body`: the framing of the body that follows (a chunked body keeps its
/// coding; a length keeps the client's Content-Length line).
pub fn write_upstream_head(out: &mut Vec<u8>, head: &RequestHead, buf: &[u8], onward: &Onward<'_>) {
    upstream_head(out, None, head, buf, onward);
}

/// Where the bytes of an upstream head are, in order ([`plan_upstream_head`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// `buf[start..end]`: client lines kept as they came.
    Kept(usize, usize),
    /// `out[start..end]`: what was rendered.
    Rendered(usize, usize),
}

impl Run {
    /// Its bytes.
    pub fn of<'a>(&self, buf: &'a [u8], out: &'a [u8]) -> &'a [u8] {
        match *self {
            Run::Kept(start, end) => &buf[start..end],
            Run::Rendered(start, end) => &out[start..end],
        }
    }
}

/// Most pieces a head is planned in: past that, kept lines are copied into `out` too.
pub const MAX_PIECES: usize = 8;

/// [`write_upstream_head`]'s head, for one vectored write: the kept client lines stay in
/// `buf` and only what is rendered is written into `out`; `pieces` (cleared first) says
/// where each run of the head is, at most [`MAX_PIECES`] of them.
pub fn plan_upstream_head(
    out: &mut Vec<u8>,
    pieces: &mut Vec<Run>,
    head: &RequestHead,
    buf: &[u8],
    onward: &Onward<'_>,
) {
    pieces.clear();
    upstream_head(out, Some(pieces), head, buf, onward);
}

fn upstream_head(
    out: &mut Vec<u8>,
    mut pieces: Option<&mut Vec<Run>>,
    head: &RequestHead,
    buf: &[u8],
    onward: &Onward<'_>,
) {
    out.clear();
    // Where the rendered bytes not yet in a piece begin.
    let mut mark = 0;
    out.extend_from_slice(head.method.of(buf));
    out.push(b' ');
    // An absolute form's target without a path (`http://h?q`) is sent as `/?q`.
    if !onward.target.starts_with(b"/") && onward.target != b"*" {
        out.push(b'/');
    }
    out.extend_from_slice(onward.target);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let lines = changed(head, buf, onward.changes);
    let trusted = onward.hop.trusted;
    // Only a head with a `Connection` line can name headers for removal.
    let connection = lines.clone().any(|l| l.known() == Known::Connection);
    // A rule's X-Request-Id was kept.
    let mut own_id = false;
    for line in lines.clone() {
        let name = line.name(buf);
        let keep = match line.known() {
            Known::Host | Known::Connection | Known::TransferEncoding | Known::HopByHop => false,
            Known::Upgrade => onward.keep_upgrade,
            // The body's framing goes as it came, whatever `Connection` names.
            Known::ContentLength => true,
            // Rendered below, from what the rule left.
            Known::Forwarding => {
                trusted
                    && FORWARDING_SET
                        .iter()
                        .any(|f| f.as_bytes().eq_ignore_ascii_case(name))
            }
            // The client's is replaced by the request's id (which keeps a trusted
            // peer's); a rule's own is sent instead of it.
            Known::RequestId if matches!(line, Line::Client(_)) => false,
            Known::Traceparent if onward.traceparent.is_some() => false,
            Known::Tracestate if onward.drop_tracestate => false,
            _ => !(connection && connection_names(lines.clone(), buf, name)),
        };
        if !keep {
            continue;
        }
        own_id |= line.known() == Known::RequestId;
        match (line, pieces.as_deref_mut()) {
            // Room for the rendered run before it, itself and the rendered rest.
            (Line::Client(h), Some(pieces)) if pieces.len() + 3 <= MAX_PIECES => {
                if out.len() > mark {
                    pieces.push(Run::Rendered(mark, out.len()));
                    mark = out.len();
                }
                let (start, end) = (h.line.start as usize, h.line.end as usize);
                match pieces.last_mut() {
                    Some(Run::Kept(_, last)) if *last == start => *last = end,
                    _ => pieces.push(Run::Kept(start, end)),
                }
            }
            _ => line.write(buf, out),
        }
    }
    forwarding(out, lines, buf, &onward.hop);
    let removed = onward
        .changes
        .is_some_and(|c| c.remove.contains(&crate::headers::REQUEST_ID));
    if !own_id && !removed {
        out.extend_from_slice(b"x-request-id: ");
        out.extend_from_slice(onward.request_id);
        out.extend_from_slice(b"\r\n");
    }
    if let Some(traceparent) = onward.traceparent {
        out.extend_from_slice(b"traceparent: ");
        out.extend_from_slice(traceparent);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"host: ");
    out.extend_from_slice(onward.upstream_host.unwrap_or(onward.hop.host).as_bytes());
    out.extend_from_slice(b"\r\n");
    if onward.keep_upgrade {
        out.extend_from_slice(b"connection: upgrade\r\n");
    }
    if head.framing() == BodyFraming::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(onward.loop_header.0.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(onward.loop_header.1);
    out.extend_from_slice(b"\r\n\r\n");
    if let Some(pieces) = pieces {
        pieces.push(Run::Rendered(mark, out.len()));
    }
}

/// X-Forwarded-For (the peer appended to what came), Forwarded, and the four headers set
/// from what the proxy saw unless a trusted peer sent them.
fn forwarding<'a>(
    out: &mut Vec<u8>,
    lines: impl Iterator<Item = Line<'a>> + Clone,
    buf: &'a [u8],
    hop: &Hop<'_>,
) {
    // The peer's address, rendered once for the three headers that carry it.
    let mut rendered = [0u8; 64];
    let client = {
        let mut at = std::io::Cursor::new(&mut rendered[..]);
        let _ = write!(at, "{}", hop.client);
        let len = usize::try_from(at.position()).unwrap_or(0);
        &rendered[..len]
    };
    let named = |l: &Line<'a>, name: &[u8]| {
        l.known() == Known::Forwarding && l.name(buf).eq_ignore_ascii_case(name)
    };
    out.extend_from_slice(b"x-forwarded-for: ");
    for l in lines
        .clone()
        .filter(|l| named(l, b"x-forwarded-for") && is_text(l.value(buf)))
    {
        out.extend_from_slice(l.value(buf));
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(client);
    out.extend_from_slice(b"\r\nforwarded: ");
    // From a trusted peer, the first Forwarded line's value (if it is text) comes first.
    if hop.trusted
        && let Some(prior) = lines
            .clone()
            .find(|l| named(l, b"forwarded"))
            .map(|l| l.value(buf))
            .filter(|v| is_text(v))
    {
        out.extend_from_slice(prior);
        out.extend_from_slice(b", ");
    }
    match hop.client {
        IpAddr::V4(_) => {
            out.extend_from_slice(b"for=");
            out.extend_from_slice(client);
        }
        IpAddr::V6(_) => {
            out.extend_from_slice(b"for=\"[");
            out.extend_from_slice(client);
            out.extend_from_slice(b"]\"");
        }
    }
    out.extend_from_slice(b";host=\"");
    out.extend(hop.host.bytes().filter(|c| !matches!(c, b'"' | b'\\')));
    out.extend_from_slice(b"\";proto=");
    out.extend_from_slice(hop.proto.as_bytes());
    out.extend_from_slice(b"\r\n");
    for name in FORWARDING_SET {
        if hop.trusted && lines.clone().any(|l| named(&l, name.as_bytes())) {
            // Kept above, as they came.
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        let _ = match name {
            "x-forwarded-proto" => out.write_all(hop.proto.as_bytes()),
            "x-forwarded-host" => out.write_all(hop.host.as_bytes()),
            "x-forwarded-port" => write!(out, "{}", hop.port),
            _ => out.write_all(client),
        };
        out.extend_from_slice(b"\r\n");
    }
}

/// How the proxy sends an upstream's response to its client.
#[derive(Debug, Clone, Copy)]
pub struct Back<'a> {
    /// An allowed upgrade was asked for: a 101's `Upgrade` goes to the client.
    pub upgrade: bool,
    /// The body goes chunked (the upstream's chunked coding passed on).
    pub chunked: bool,
    /// The client connection closes after this response.
    pub close: bool,
    /// An HTTP/1.0 client's connection stays open (it must be told so).
    pub keep_alive: bool,
    /// This proxy's loop header, never shown to clients.
    pub loop_header: &'a str,
    /// `date: ...\r\n`, added when the upstream sent none.
    pub date_line: &'a [u8],
    /// A Gateway rule's response header changes (set, then add, then remove); never
    /// to the framing or hop-by-hop headers, which are this hop's.
    pub changes: Option<&'a HeaderChanges>,
}

/// Writes the response head sent to the client for `response` (parsed from `buf`) into
/// `out`: hop-by-hop headers removed (with those `Connection` names; Upgrade kept for a
/// switch to an allowed upgrade), the loop header removed, Content-Length dropped when
/// the body is chunked (RFC 9112 §6.1: a client must not see both), the framing and
/// `Connection: close` added as this hop needs them.
pub fn write_downstream_head(
    out: &mut Vec<u8>,
    response: &super::ResponseHead,
    buf: &[u8],
    back: &Back<'_>,
) {
    out.clear();
    let status_line = buf.get(..response.len).unwrap_or_default();
    let line_end = status_line
        .iter()
        .position(|b| *b == b'\r')
        .unwrap_or(status_line.len());
    // The upstream's status line as HTTP/1.1 (`HTTP/1.x` is its first eight bytes).
    out.extend_from_slice(b"HTTP/1.1");
    out.extend_from_slice(status_line.get(8..line_end).unwrap_or_default());
    out.extend_from_slice(b"\r\n");
    let switching = response.status == 101 && back.upgrade;
    let chunked_response = response.framing() == BodyFraming::Chunked
        || response
            .headers
            .iter()
            .any(|h| h.known == Known::TransferEncoding);
    let lines = response.headers.iter().map(Line::Client);
    let mut dated = false;
    let (set, add, remove): (&[_], &[_], &[_]) = match back.changes {
        Some(c) => (&c.set, &c.add, &c.remove),
        None => (&[], &[], &[]),
    };
    let in_list = |list: &[HeaderName], name: &[u8]| {
        list.iter()
            .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    };
    let set_names = |name: &[u8]| {
        set.iter()
            .any(|(n, _)| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    };
    // What a rule may change: not this hop's framing and connection headers, nor the
    // loop header.
    let changeable = |name: &[u8]| {
        !matches!(
            Known::of(name),
            Known::Connection
                | Known::TransferEncoding
                | Known::HopByHop
                | Known::ContentLength
                | Known::Upgrade
        ) && !name.eq_ignore_ascii_case(back.loop_header.as_bytes())
    };
    for header in &response.headers {
        let name = header.name.of(buf);
        let keep = match header.known {
            Known::Connection | Known::TransferEncoding | Known::HopByHop => false,
            Known::Upgrade => switching,
            Known::ContentLength => !chunked_response && !back.chunked,
            _ => {
                !name.eq_ignore_ascii_case(back.loop_header.as_bytes())
                    && !connection_names(lines.clone(), buf, name)
                    && !set_names(name)
                    && !in_list(remove, name)
            }
        };
        if keep {
            dated |= name.eq_ignore_ascii_case(b"date");
            out.extend_from_slice(header.line.of(buf));
        }
    }
    // A name set twice keeps the last value (an insert replaces).
    let set_pairs = set
        .iter()
        .enumerate()
        .filter(|(i, (n, _))| !set[i + 1..].iter().any(|(later, _)| later == n))
        .map(|(_, pair)| pair);
    for (n, v) in set_pairs.chain(add) {
        let name = n.as_str().as_bytes();
        if changeable(name) && !in_list(remove, name) {
            dated |= name == b"date";
            Line::Rule(n, v.as_bytes()).write(buf, out);
        }
    }
    if !dated {
        out.extend_from_slice(back.date_line);
    }
    if switching {
        out.extend_from_slice(b"connection: upgrade\r\n");
    } else if back.close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if back.keep_alive {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if back.chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
}
