//! Request checks and header rewriting, as pure functions over `http` types.

use std::net::IpAddr;

use http::Method;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that apply to one hop only (RFC 9110 §7.6.1), always removed when forwarding.
pub const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// A request's headers as routing reads them, from either engine (hyper's `HeaderMap`, or
/// the native engine's parse in place).
pub trait HeaderLookup {
    /// Whether a value of header `name` (lower case) satisfies `f`; each value is one
    /// header line's (a list in one line is one value).
    fn any_value(&self, name: &str, f: &mut dyn FnMut(&[u8]) -> bool) -> bool;

    /// Calls `f` with each header line's name and value, in order (a request mirror's
    /// copy).
    fn each(&self, f: &mut dyn FnMut(&[u8], &[u8]));
}

impl HeaderLookup for HeaderMap {
    fn any_value(&self, name: &str, f: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        self.get_all(name).iter().any(|v| f(v.as_bytes()))
    }

    fn each(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for (name, value) in self {
            f(name.as_str().as_bytes(), value.as_bytes());
        }
    }
}

/// A Gateway API `RequestHeaderModifier`: changes to a request's headers before it is
/// forwarded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderChanges {
    /// Replaced (or added).
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Appended.
    pub add: Vec<(HeaderName, HeaderValue)>,
    /// Removed.
    pub remove: Vec<HeaderName>,
}

impl HeaderChanges {
    /// Applies the changes to a request's headers: set, then add, then remove.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (n, v) in &self.set {
            headers.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            headers.append(n.clone(), v.clone());
        }
        for n in &self.remove {
            headers.remove(n);
        }
    }
}

impl HeaderChanges {
    /// The changes that make what `self` and then `next` make (a rule's, then its
    /// backend's): [`Self::apply`] of the result equals applying both in turn.
    pub fn then(&self, next: &HeaderChanges) -> HeaderChanges {
        let mut names: Vec<&HeaderName> = Vec::new();
        for c in [self, next] {
            let touched = c.set.iter().chain(&c.add).map(|(n, _)| n).chain(&c.remove);
            for n in touched {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        let last_set = |c: &HeaderChanges, n: &HeaderName| {
            c.set
                .iter()
                .rev()
                .find(|(m, _)| m == n)
                .map(|(_, v)| v.clone())
        };
        let adds = |c: &HeaderChanges, n: &HeaderName| -> Vec<HeaderValue> {
            c.add
                .iter()
                .filter(|(m, _)| m == n)
                .map(|(_, v)| v.clone())
                .collect()
        };
        let mut out = HeaderChanges::default();
        for n in names {
            let pairs = |values: Vec<HeaderValue>| values.into_iter().map(|v| (n.clone(), v));
            if next.remove.contains(n) {
                out.remove.push(n.clone());
            } else if let Some(v) = last_set(next, n) {
                out.set.push((n.clone(), v));
                out.add.extend(pairs(adds(next, n)));
            } else if self.remove.contains(n) {
                // Gone after `self`: only what `next` adds is left.
                let mut added = adds(next, n).into_iter();
                match added.next() {
                    None => out.remove.push(n.clone()),
                    Some(first) => {
                        out.set.push((n.clone(), first));
                        out.add.extend(added.map(|v| (n.clone(), v)));
                    }
                }
            } else {
                if let Some(v) = last_set(self, n) {
                    out.set.push((n.clone(), v));
                }
                out.add.extend(pairs(adds(self, n)));
                out.add.extend(pairs(adds(next, n)));
            }
        }
        out
    }

    /// Applies the changes to a response's headers as [`Self::apply`] does, except to
    /// the headers this hop owns (the framing, the connection's and an upgrade's) and to
    /// `loop_header`: those a rule never changes.
    pub fn apply_to_response(&self, headers: &mut HeaderMap, loop_header: &str) {
        let changeable = |n: &HeaderName| {
            !HOP_BY_HOP.contains(n)
                && *n != header::CONTENT_LENGTH
                && *n != header::UPGRADE
                && !n.as_str().eq_ignore_ascii_case(loop_header)
        };
        for (n, v) in self.set.iter().filter(|(n, _)| changeable(n)) {
            headers.insert(n.clone(), v.clone());
        }
        for (n, v) in self.add.iter().filter(|(n, _)| changeable(n)) {
            headers.append(n.clone(), v.clone());
        }
        for n in self.remove.iter().filter(|n| changeable(n)) {
            headers.remove(n);
        }
    }
}

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
    /// A Host (or `:authority`) that is not a host with an optional port (RFC 3986 §3.2.2).
    #[error("the Host is not a valid host name, IP address or port")]
    BadHost,
    /// A `Connection` or `Upgrade` header with bytes that are not visible ASCII.
    #[error("Connection or Upgrade holds bytes that are not ASCII")]
    BadConnection,
    /// The request's head was not read whole by the framing checks when it was to be
    /// handled: the two readers of the connection disagree, so it is refused.
    #[error("the request's framing could not be followed")]
    Unframed,
    /// A chunked body on GET, HEAD or CONNECT. It is not forwarded: hyper's client cannot
    /// send one (it would drop the body), and an upstream that reads no body on these
    /// methods would take the body for the next request.
    #[error("a chunked body on GET, HEAD or CONNECT")]
    ChunkedWithoutBodyMethod,
}

/// The methods on which a chunked request body is refused
/// ([`BadRequest::ChunkedWithoutBodyMethod`]).
pub fn refuses_chunked(method: &[u8]) -> bool {
    matches!(method, b"GET" | b"HEAD" | b"CONNECT")
}

/// Whether `authority` is `host[:port]` as RFC 3986 §3.2.2 allows it in a Host header or
/// `:authority`: a reg-name (unreserved characters, percent-escapes, sub-delimiters), an
/// IPv4 address, or a bracketed IPv6 literal, then optionally `:` and at most five
/// digits. No user info, no path, no whitespace or controls.
pub fn valid_authority(authority: &str) -> bool {
    let (host_ok, rest) = if authority.starts_with('[') {
        let Some(end) = authority.find(']') else {
            return false;
        };
        let literal = &authority[1..end];
        (
            literal.parse::<std::net::Ipv6Addr>().is_ok(),
            &authority[end + 1..],
        )
    } else {
        let (host, rest) = match authority.find(':') {
            Some(i) => (&authority[..i], &authority[i..]),
            None => (authority, ""),
        };
        (!host.is_empty() && valid_reg_name(host.as_bytes()), rest)
    };
    let port_ok = match rest.strip_prefix(':') {
        None => rest.is_empty(),
        Some(port) => port.len() <= 5 && port.bytes().all(|c| c.is_ascii_digit()),
    };
    host_ok && port_ok
}

/// reg-name = *( unreserved / pct-encoded / sub-delims ); an IPv4 address is one too.
fn valid_reg_name(b: &[u8]) -> bool {
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c if c.is_ascii_alphanumeric() => {}
            b'-' | b'.' | b'_' | b'~' => {}
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' => {}
            b'%' => {
                let hex = |j: usize| b.get(j).is_some_and(u8::is_ascii_hexdigit);
                if !(hex(i + 1) && hex(i + 2)) {
                    return false;
                }
                i += 2;
            }
            _ => return false,
        }
        i += 1;
    }
    true
}

/// Refuses the request shapes used for request smuggling.
pub fn check_framing(method: &Method, headers: &HeaderMap) -> Result<(), BadRequest> {
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
        if refuses_chunked(method.as_str().as_bytes()) {
            return Err(BadRequest::ChunkedWithoutBodyMethod);
        }
    }
    Ok(())
}

/// Is this an HTTP/1.1 upgrade request (WebSocket and the like)?
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_has(headers, "upgrade")
}

/// May this upgrade be forwarded? Every protocol in `Upgrade` must be in `allowed`
/// (lower case), and `h2c` never is: an h2c upgrade would turn the proxy's upstream
/// connection into HTTP/2 that no route rule governs.
pub fn upgrade_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let mut protocols = headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("\u{0}").split(','))
        .map(|p| {
            p.trim()
                .split('/')
                .next()
                .unwrap_or("")
                .to_ascii_lowercase()
        })
        .peekable();
    protocols.peek().is_some() && protocols.all(|p| p != "h2c" && allowed.contains(&p))
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
    // Tokens naming a header removed (or kept) below anyway, `keep-alive` and `close`
    // above all, are skipped without making a name of them.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| {
            !t.eq_ignore_ascii_case("close")
                && !t.eq_ignore_ascii_case("upgrade")
                && !HOP_BY_HOP
                    .iter()
                    .any(|h| t.eq_ignore_ascii_case(h.as_str()))
        })
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in named {
        if (keep_upgrade && name == header::UPGRADE) || is_forwarding(&name) || name == header::HOST
        {
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

/// Headers that say who the client is and how it reached the edge. A client cannot name
/// them in `Connection` to have them removed: that would strip what a trusted balancer in
/// front of holdfast added.
pub const FORWARDING: [&str; 6] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-proto",
    "x-real-ip",
];

/// Is this one of the [`FORWARDING`] headers?
fn is_forwarding(name: &HeaderName) -> bool {
    FORWARDING.contains(&name.as_str())
}

/// How the request reached this proxy, for the forwarding headers.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    /// The peer's address.
    pub client: IpAddr,
    /// The local port the request came in on (`X-Forwarded-Port`, like nginx's
    /// `$server_port`; never what the client wrote in Host).
    pub port: u16,
    /// `http` or `https`.
    pub proto: &'static str,
    /// The host the client asked for (Host or the request target's authority).
    pub host: &'a str,
    /// The peer is a balancer in `--trust-forwarded-from`: what it says is kept.
    pub trusted: bool,
}

/// Sets the forwarding headers. `X-Forwarded-For` always gets the peer appended. From an
/// untrusted peer, `X-Forwarded-Proto`, `-Host`, `-Port`, `X-Real-IP` and `Forwarded` are
/// replaced with what this proxy saw; from a trusted one (a balancer in front), they are
/// kept, and only filled in where missing (`Forwarded` gets this hop appended).
pub fn add_forwarded(headers: &mut HeaderMap, hop: Hop<'_>) {
    use std::fmt::Write as _;
    // Six headers are set: grow the map once, not header by header.
    headers.reserve(6);
    let mut client = String::with_capacity(48);
    let _ = write!(client, "{}", hop.client);
    let Ok(client_value) = HeaderValue::from_str(&client) else {
        return;
    };
    let xff = HeaderName::from_static("x-forwarded-for");
    let mut prior = headers.get_all(&xff).iter().filter_map(|v| v.to_str().ok());
    let xff_value = match prior.next() {
        None => Some(client_value.clone()),
        Some(first) => {
            let mut joined = first.to_owned();
            for p in prior {
                joined.push_str(", ");
                joined.push_str(p);
            }
            joined.push_str(", ");
            joined.push_str(&client);
            HeaderValue::from_str(&joined).ok()
        }
    };
    headers.remove(&xff);
    if let Some(v) = xff_value {
        headers.insert(xff, v);
    }
    let mut this_hop = String::with_capacity(32 + client.len() + hop.host.len());
    match hop.client {
        IpAddr::V4(_) => this_hop.push_str("for="),
        IpAddr::V6(_) => this_hop.push_str("for=\"["),
    }
    this_hop.push_str(&client);
    if hop.client.is_ipv6() {
        this_hop.push_str("]\"");
    }
    this_hop.push_str(";host=\"");
    this_hop.extend(hop.host.chars().filter(|c| !matches!(c, '"' | '\\')));
    this_hop.push_str("\";proto=");
    this_hop.push_str(hop.proto);
    let forwarded = HeaderName::from_static("forwarded");
    let forwarded_value = match headers.get(&forwarded).and_then(|v| v.to_str().ok()) {
        Some(prior) if hop.trusted => HeaderValue::from_str(&format!("{prior}, {this_hop}")),
        _ => HeaderValue::from_str(&this_hop),
    };
    let ours = [
        ("x-forwarded-proto", Ok(HeaderValue::from_static(hop.proto))),
        ("x-forwarded-host", HeaderValue::from_str(hop.host)),
        ("x-forwarded-port", Ok(HeaderValue::from(hop.port))),
        ("x-real-ip", Ok(client_value)),
    ];
    for (name, value) in ours {
        let name = HeaderName::from_static(name);
        if hop.trusted && headers.contains_key(&name) {
            continue;
        }
        headers.remove(&name);
        if let Ok(v) = value {
            headers.insert(name, v);
        }
    }
    headers.remove(&forwarded);
    if let Ok(v) = forwarded_value {
        headers.insert(forwarded, v);
    }
}

/// The longest `X-Request-Id` kept from a trusted peer, in bytes.
pub const MAX_REQUEST_ID: usize = 128;

/// The header.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A request's id, sent upstream as `X-Request-Id` and logged: a trusted peer's (a
/// balancer in front that made one), else 128 random bits in 32 hex digits. Held inline:
/// choosing one allocates nothing.
#[derive(Clone, Copy)]
pub struct RequestId {
    bytes: [u8; MAX_REQUEST_ID],
    len: u8,
}

impl RequestId {
    /// The request's id: `sent` (the first `X-Request-Id` value) when the peer is trusted
    /// and it is one (1 to [`MAX_REQUEST_ID`] visible ASCII bytes), else a new one. An
    /// untrusted client's is never kept: it could reuse another request's id.
    pub fn choose(sent: Option<&[u8]>, trusted: bool) -> RequestId {
        match sent {
            Some(v) if trusted && Self::valid(v) => {
                let mut bytes = [0; MAX_REQUEST_ID];
                bytes[..v.len()].copy_from_slice(v);
                RequestId {
                    bytes,
                    len: v.len() as u8,
                }
            }
            _ => Self::new_random(),
        }
    }

    /// Whether `v` can be kept as an id.
    pub fn valid(v: &[u8]) -> bool {
        !v.is_empty() && v.len() <= MAX_REQUEST_ID && v.iter().all(|b| (b'!'..=b'~').contains(b))
    }

    /// 128 random bits, in lower-case hex.
    pub fn new_random() -> RequestId {
        let value = random_u128();
        let mut bytes = [0; MAX_REQUEST_ID];
        for (i, b) in bytes[..32].iter_mut().enumerate() {
            let nibble = (value >> (124 - 4 * i)) & 0xf;
            *b = b"0123456789abcdef"[nibble as usize];
        }
        RequestId { bytes, len: 32 }
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// As text (always visible ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sets `X-Request-Id` on a request head that the rule's `changes` have been applied to:
/// the client's was removed before them (`take_request_id`), so one there now is the
/// rule's, which is sent instead of `id`; a rule that removes the header sends none.
pub fn set_request_id(headers: &mut HeaderMap, id: &RequestId, changes: Option<&HeaderChanges>) {
    if !headers.contains_key(REQUEST_ID)
        && !changes.is_some_and(|c| c.remove.contains(&REQUEST_ID))
        && let Ok(v) = HeaderValue::from_bytes(id.as_bytes())
    {
        headers.insert(REQUEST_ID, v);
    }
}

/// Removes the client's `X-Request-Id` and chooses the request's id from it
/// ([`RequestId::choose`]).
pub fn take_request_id(headers: &mut HeaderMap, trusted: bool) -> RequestId {
    let id = RequestId::choose(headers.get(REQUEST_ID).map(HeaderValue::as_bytes), trusted);
    headers.remove(REQUEST_ID);
    id
}

/// 128 bits from the operating system's random source (request ids and trace ids, which
/// must be neither guessable from earlier ones nor repeated): drawn from a per-thread pool
/// refilled with one `getrandom` call per 32 ids. Should the source fail, a per-thread
/// SplitMix64 (seeded from the standard library's per-process random keys) stands in:
/// unique, not unpredictable.
pub(crate) fn random_u128() -> u128 {
    use std::cell::{Cell, RefCell};
    use std::hash::{BuildHasher, RandomState};
    const POOL: usize = 512;
    thread_local! {
        static RANDOM: RefCell<([u8; POOL], usize)> = const { RefCell::new(([0; POOL], POOL)) };
        static STATE: Cell<u64> = Cell::new(RandomState::new().hash_one(std::thread::current().id()));
    }
    let drawn = RANDOM.with(|pool| {
        let (bytes, used) = &mut *pool.borrow_mut();
        if *used + 16 > POOL {
            getrandom::fill(bytes).ok()?;
            *used = 0;
        }
        let mut out = [0; 16];
        out.copy_from_slice(&bytes[*used..*used + 16]);
        *used += 16;
        Some(u128::from_le_bytes(out))
    });
    if let Some(n) = drawn {
        return n;
    }
    let next = || {
        STATE.with(|s| {
            let mut z = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(z);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
    };
    (u128::from(next()) << 64) | u128::from(next())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_do_not_repeat_across_refills_of_the_pool() {
        // 1,000 draws: about 31 refills of the per-thread pool.
        let drawn: std::collections::HashSet<u128> = (0..1000).map(|_| random_u128()).collect();
        assert_eq!(drawn.len(), 1000);
        assert!(!drawn.contains(&0));
    }

    #[test]
    fn a_request_id_is_a_trusted_peers_valid_one_else_a_new_random_one() {
        let kept = RequestId::choose(Some(b"lb-7f3a"), true);
        assert_eq!(kept.as_str(), "lb-7f3a");
        // An untrusted client's is never kept; nor an invalid one from a trusted peer.
        let long = [b'a'; MAX_REQUEST_ID + 1];
        for (sent, trusted) in [
            (&b"lb-7f3a"[..], false),
            (b"has space", true),
            (b"", true),
            (&long[..], true),
        ] {
            let id = RequestId::choose(Some(sent), trusted);
            assert_ne!(id.as_bytes(), sent);
            assert_eq!(id.as_str().len(), 32, "{id:?}");
            assert!(
                id.as_str()
                    .bytes()
                    .all(|b| b"0123456789abcdef".contains(&b))
            );
        }
        let longest = [b'a'; MAX_REQUEST_ID];
        assert_eq!(RequestId::choose(Some(&longest), true).as_bytes(), longest);
        // New ones differ.
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| RequestId::new_random().as_str().to_owned())
            .collect();
        assert_eq!(ids.len(), 1000);
        // On a request head: the rule's own is kept; else the request's id replaces any.
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("the-client"));
        let id = take_request_id(&mut h, false);
        assert!(h.get(REQUEST_ID).is_none());
        set_request_id(&mut h, &id, None);
        assert_eq!(h.get(REQUEST_ID).unwrap().as_bytes(), id.as_bytes());
        h.insert(REQUEST_ID, HeaderValue::from_static("the-rule"));
        set_request_id(&mut h, &id, None);
        assert_eq!(h.get(REQUEST_ID).unwrap(), "the-rule");
        let removes = HeaderChanges {
            remove: vec![REQUEST_ID],
            ..HeaderChanges::default()
        };
        let mut h = HeaderMap::new();
        set_request_id(&mut h, &id, Some(&removes));
        assert!(h.is_empty(), "a rule that removes it sends none");
    }

    proptest::proptest! {
        /// A rule's changes then its backend's, made one change list, change any headers
        /// as applying the two in turn does.
        #[test]
        fn changes_then_changes_are_one_set_of_changes(
            first in changes(),
            second in changes(),
            start in proptest::collection::vec((0..3usize, 0..3usize), 0..5),
        ) {
            let mut h = HeaderMap::new();
            for (n, v) in start {
                h.append(NAMES[n].clone(), HeaderValue::from_static(VALUES[v]));
            }
            let mut in_turn = h.clone();
            first.apply(&mut in_turn);
            second.apply(&mut in_turn);
            let mut at_once = h;
            first.then(&second).apply(&mut at_once);
            proptest::prop_assert_eq!(at_once, in_turn);
        }
    }

    const NAMES: [HeaderName; 3] = [
        HeaderName::from_static("x-a"),
        HeaderName::from_static("x-b"),
        HeaderName::from_static("x-c"),
    ];
    const VALUES: [&str; 3] = ["1", "2", "3"];

    fn changes() -> impl proptest::strategy::Strategy<Value = HeaderChanges> {
        use proptest::prelude::*;
        let pair = (0..3usize, 0..3usize)
            .prop_map(|(n, v)| (NAMES[n].clone(), HeaderValue::from_static(VALUES[v])));
        (
            proptest::collection::vec(pair.clone(), 0..3),
            proptest::collection::vec(pair, 0..3),
            proptest::collection::vec((0..3usize).prop_map(|n| NAMES[n].clone()), 0..2),
        )
            .prop_map(|(set, add, remove)| HeaderChanges { set, add, remove })
    }

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
            check_framing(
                &Method::POST,
                &map(&[("content-length", "5"), ("transfer-encoding", "chunked")])
            ),
            Err(BadRequest::LengthAndChunked)
        );
        assert_eq!(
            check_framing(
                &Method::POST,
                &map(&[("content-length", "5"), ("content-length", "5")])
            ),
            Err(BadRequest::DuplicateLength)
        );
        assert_eq!(
            check_framing(&Method::POST, &map(&[("content-length", "5, 5")])),
            Err(BadRequest::DuplicateLength)
        );
        assert_eq!(
            check_framing(&Method::POST, &map(&[("content-length", "+5")])),
            Err(BadRequest::BadLength)
        );
        assert_eq!(
            check_framing(
                &Method::POST,
                &map(&[("transfer-encoding", "chunked, gzip")])
            ),
            Err(BadRequest::BadTransferEncoding)
        );
        assert_eq!(
            check_framing(
                &Method::POST,
                &map(&[
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "chunked")
                ])
            ),
            Err(BadRequest::BadTransferEncoding)
        );
        assert_eq!(
            check_framing(&Method::POST, &map(&[("transfer-encoding", "xchunked")])),
            Err(BadRequest::BadTransferEncoding)
        );
        assert_eq!(
            check_framing(
                &Method::POST,
                &map(&[("host", "a.test"), ("host", "b.test")])
            ),
            Err(BadRequest::DuplicateHost)
        );
    }

    #[test]
    fn hosts_are_reg_names_ip_addresses_or_bracketed_ipv6_with_an_optional_port() {
        for good in [
            "a.example.test",
            "A.Example.Test:8080",
            "10.0.0.1",
            "10.0.0.1:443",
            "[::1]",
            "[2001:db8::1]:8443",
            "xn--bcher-kva.test",
            "under_score.test",
            "%41.test",
            "host:",
        ] {
            assert!(valid_authority(good), "{good}");
        }
        for bad in [
            "",
            ":80",
            "a.test:80:80",
            "a.test:123456",
            "a.test:8o",
            "user@a.test",
            "a.test/path",
            "a test",
            "a.test\t",
            "[::1",
            "[not-ipv6]",
            "[::1]x",
            "a%4.test",
            "a.test?x",
            "a.test#x",
            "h\u{e9}.test",
            "a\"b",
        ] {
            assert!(!valid_authority(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_chunked_body_on_a_method_without_one_is_refused_and_a_length_passes() {
        let chunked = map(&[("transfer-encoding", "chunked")]);
        for method in [Method::GET, Method::HEAD, Method::CONNECT] {
            assert_eq!(
                check_framing(&method, &chunked),
                Err(BadRequest::ChunkedWithoutBodyMethod),
                "{method}"
            );
            let length = map(&[("content-length", "5")]);
            assert_eq!(check_framing(&method, &length), Ok(()), "{method}");
        }
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
            assert_eq!(check_framing(&method, &chunked), Ok(()), "{method}");
        }
        // Methods are case-sensitive (RFC 9110 §9.1): `get` is another method.
        let lower = Method::from_bytes(b"get").unwrap();
        assert_eq!(check_framing(&lower, &chunked), Ok(()));
    }

    #[test]
    fn ordinary_framing_passes() {
        assert_eq!(check_framing(&Method::POST, &map(&[])), Ok(()));
        assert_eq!(
            check_framing(&Method::POST, &map(&[("content-length", "42")])),
            Ok(())
        );
        assert_eq!(
            check_framing(&Method::POST, &map(&[("transfer-encoding", "Chunked")])),
            Ok(())
        );
        assert_eq!(
            check_framing(
                &Method::POST,
                &map(&[("transfer-encoding", "gzip, chunked")])
            ),
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
    fn forwarded_headers_from_an_untrusted_client_are_replaced_and_the_peer_appended() {
        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil.test"),
            ("x-forwarded-port", "1"),
            ("x-real-ip", "192.0.2.1"),
            ("forwarded", "for=192.0.2.1;proto=https"),
        ]);
        let hop = Hop {
            client: "10.0.0.7".parse().unwrap(),
            port: 8080,
            proto: "http",
            host: "a.example.com:8080",
            trusted: false,
        };
        add_forwarded(&mut h, hop);
        assert_eq!(h["x-forwarded-for"], "203.0.113.1, 10.0.0.7");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "a.example.com:8080");
        assert_eq!(h["x-forwarded-port"], "8080");
        assert_eq!(h["x-real-ip"], "10.0.0.7");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.7;host=\"a.example.com:8080\";proto=http"
        );
        let mut h = HeaderMap::new();
        add_forwarded(
            &mut h,
            Hop {
                client: "::1".parse().unwrap(),
                port: 8443,
                proto: "https",
                host: "b",
                trusted: false,
            },
        );
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h["x-forwarded-port"], "8443");
        assert_eq!(h["forwarded"], "for=\"[::1]\";host=\"b\";proto=https");
    }

    #[test]
    fn forwarded_headers_from_a_trusted_balancer_are_kept() {
        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-port", "443"),
            ("x-real-ip", "203.0.113.1"),
            ("forwarded", "for=203.0.113.1;proto=https"),
        ]);
        let hop = Hop {
            client: "10.0.0.7".parse().unwrap(),
            port: 8080,
            proto: "http",
            host: "a.example.com",
            trusted: true,
        };
        add_forwarded(&mut h, hop);
        assert_eq!(h["x-forwarded-for"], "203.0.113.1, 10.0.0.7");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-port"], "443");
        assert_eq!(h["x-real-ip"], "203.0.113.1");
        assert_eq!(h["x-forwarded-host"], "a.example.com", "filled in");
        assert_eq!(
            h["forwarded"],
            "for=203.0.113.1;proto=https, for=10.0.0.7;host=\"a.example.com\";proto=http"
        );
    }

    #[test]
    fn only_listed_upgrades_are_allowed_and_never_h2c() {
        let allowed = vec!["websocket".to_owned(), "h2c".to_owned()];
        let up = |v: &str| map(&[("connection", "upgrade"), ("upgrade", v)]);
        assert!(upgrade_allowed(&up("websocket"), &allowed));
        assert!(upgrade_allowed(&up("WebSocket"), &allowed));
        assert!(!upgrade_allowed(&up("h2c"), &allowed), "never h2c");
        assert!(!upgrade_allowed(&up("websocket, h2c"), &allowed));
        assert!(!upgrade_allowed(&up("foo/1"), &allowed));
        assert!(!upgrade_allowed(&map(&[]), &allowed));
    }

    #[test]
    fn connection_cannot_name_forwarding_headers_or_host_for_removal() {
        let mut h = map(&[
            (
                "connection",
                "x-forwarded-for, X-Real-IP, forwarded, host, x-other",
            ),
            ("x-forwarded-for", "203.0.113.1"),
            ("x-real-ip", "203.0.113.1"),
            ("forwarded", "for=203.0.113.1"),
            ("host", "a"),
            ("x-other", "1"),
        ]);
        strip_hop_by_hop(&mut h, false);
        for kept in ["x-forwarded-for", "x-real-ip", "forwarded", "host"] {
            assert!(h.contains_key(kept), "{kept}");
        }
        assert!(!h.contains_key("x-other"));
    }
}
