//! HTTP/1.1 heads read once, as positions in the connection's read buffer: the request
//! line, each header's name and value, and what the head says about framing, host and
//! the connection. Framing, routing and forwarding all read this one parse, so they cannot
//! disagree about where a request starts or ends (the reason the native engine exists; see
//! [`crate::framing`] for the tracker it replaces).
//!
//! Stricter than RFC 9112 allows a server to be where leniency has been used to smuggle
//! requests: every line ends with CRLF (a bare LF is [`BadRequest::BareLineFeed`]), no
//! obsolete line folding, no whitespace before a header's colon, header names are tokens,
//! values hold no control bytes, the request target is visible ASCII. The framing rules are
//! those of [`crate::headers::check_framing`], the same verdicts for the same heads.
//!
//! Nothing here allocates once a [`RequestHead`]'s header list has grown to the largest
//! head its connection has seen.

pub mod chunked;
pub mod engine;
pub mod onward;
#[cfg(test)]
mod tests;
pub mod timer;

use crate::headers::{BadRequest, refuses_chunked};

/// A byte range of the buffer a head was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// First byte.
    pub start: u32,
    /// One past the last byte.
    pub end: u32,
}

impl Span {
    fn new(start: usize, end: usize) -> Self {
        Span {
            start: start as u32,
            end: end as u32,
        }
    }

    /// The bytes this span covers in `buf` (empty if it is not `buf`'s).
    pub fn of<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        buf.get(self.start as usize..self.end as usize)
            .unwrap_or_default()
    }

    /// Its length.
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// One header line: its name (as sent) and its value (without surrounding whitespace),
/// and the whole line with its CRLF (what is copied when the header is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// The name.
    pub name: Span,
    /// The value, trimmed.
    pub value: Span,
    /// The line, CRLF included.
    pub line: Span,
    /// What the name is, for the headers the proxy acts on.
    pub known: Known,
}

/// Header names the proxy reads or rewrites, recognised once while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Known {
    /// Any other header.
    #[default]
    Other,
    /// Host.
    Host,
    /// Content-Length.
    ContentLength,
    /// Transfer-Encoding.
    TransferEncoding,
    /// Connection.
    Connection,
    /// Upgrade.
    Upgrade,
    /// Expect.
    Expect,
    /// Keep-Alive, Proxy-Connection, Proxy-Authenticate, Proxy-Authorization, TE, Trailer:
    /// hop-by-hop (RFC 9110 §7.6.1), never forwarded.
    HopByHop,
    /// Forwarded, X-Forwarded-For/-Host/-Port/-Proto, X-Real-IP.
    Forwarding,
    /// X-Request-Id: the proxy sends its own ([`crate::headers::RequestId`]).
    RequestId,
    /// traceparent: replaced by this hop's when it traces ([`crate::trace`]).
    Traceparent,
    /// tracestate: dropped with a client's trace context this hop could not continue.
    Tracestate,
}

impl Known {
    fn of(name: &[u8]) -> Known {
        // Compared case-insensitively, by length first.
        let is = |s: &str| name.eq_ignore_ascii_case(s.as_bytes());
        match name.len() {
            4 if is("host") => Known::Host,
            14 if is("content-length") => Known::ContentLength,
            17 if is("transfer-encoding") => Known::TransferEncoding,
            10 if is("connection") => Known::Connection,
            10 if is("keep-alive") => Known::HopByHop,
            7 if is("upgrade") => Known::Upgrade,
            7 if is("trailer") => Known::HopByHop,
            6 if is("expect") => Known::Expect,
            2 if is("te") => Known::HopByHop,
            16 if is("proxy-connection") => Known::HopByHop,
            18 if is("proxy-authenticate") => Known::HopByHop,
            19 if is("proxy-authorization") => Known::HopByHop,
            9 if is("forwarded") => Known::Forwarding,
            9 if is("x-real-ip") => Known::Forwarding,
            15 if is("x-forwarded-for") => Known::Forwarding,
            16 if is("x-forwarded-host") => Known::Forwarding,
            16 if is("x-forwarded-port") => Known::Forwarding,
            17 if is("x-forwarded-proto") => Known::Forwarding,
            12 if is("x-request-id") => Known::RequestId,
            11 if is("traceparent") => Known::Traceparent,
            10 if is("tracestate") => Known::Tracestate,
            _ => Known::Other,
        }
    }
}

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body (a request without Content-Length or Transfer-Encoding; a response to HEAD,
    /// or 1xx, 204 or 304).
    Empty,
    /// Content-Length.
    Length(u64),
    /// Transfer-Encoding ending in chunked.
    Chunked,
    /// A response without either: it ends when the upstream closes.
    UntilClose,
}

/// The form of a request target (RFC 9112 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetForm {
    /// `/path?query`.
    Origin,
    /// `http://authority/path?query`: the authority is the host routed on.
    Absolute,
    /// `*` (OPTIONS).
    Asterisk,
    /// `host:port` (CONNECT).
    Authority,
}

/// Limits on a request head.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest head, in bytes, CRLFs included.
    pub max_bytes: usize,
    /// Most header lines.
    pub max_headers: usize,
}

/// Why a head cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// Past `max_bytes` without its end (431).
    #[error("the request head is larger than accepted")]
    TooLarge,
    /// More header lines than `max_headers` (431).
    #[error("the request head has more headers than accepted")]
    TooManyHeaders,
    /// Not HTTP/1.x (400).
    #[error("the request is not HTTP/1.0 or HTTP/1.1")]
    Version,
    /// Not a request line, a header line or a target this parser reads (400).
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
    /// A framing rule (400).
    #[error(transparent)]
    Bad(#[from] BadRequest),
}

impl HeadError {
    /// The status a client gets for it.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::TooLarge | HeadError::TooManyHeaders => 431,
            HeadError::Version => 505,
            HeadError::Malformed(_) | HeadError::Bad(_) => 400,
        }
    }
}

/// Where a head ends, found as its bytes arrive: each read is scanned once.
#[derive(Debug, Clone, Default)]
pub struct HeadEnd {
    /// Bytes scanned so far.
    scanned: usize,
    /// Bytes of the current line so far, its CR excluded.
    line: usize,
    /// Lines ended so far.
    lines: usize,
}

impl HeadEnd {
    /// With `buf` holding what arrived of a head (from its first byte), the head's length
    /// once its final empty line is in; None while it is not. A line ended by a bare LF
    /// ends lines too, so such a head ends and is refused instead of timing out.
    pub fn find(&mut self, buf: &[u8]) -> Option<usize> {
        while let Some(rest) = buf.get(self.scanned..).filter(|r| !r.is_empty()) {
            let Some(lf) = memchr::memchr(b'\n', rest) else {
                // No line end yet: a CR last is decided when the next byte comes (it
                // counts only when its LF follows).
                let undecided = usize::from(rest.ends_with(b"\r"));
                self.line += rest.len() - undecided;
                self.scanned += rest.len() - undecided;
                return None;
            };
            let line = self.line + lf - usize::from(lf > 0 && rest[lf - 1] == b'\r');
            self.scanned += lf + 1;
            if line == 0 && self.lines > 0 {
                let end = self.scanned;
                *self = HeadEnd::default();
                return Some(end);
            }
            self.lines += 1;
            self.line = 0;
        }
        None
    }

    /// Bytes of the head read so far.
    pub fn scanned(&self) -> usize {
        self.scanned
    }
}

/// An HTTP/1.x request head.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    /// Its length, final CRLF included: the body (if any) starts there.
    pub len: usize,
    /// The method.
    pub method: Span,
    /// The request target as sent.
    pub target: Span,
    /// In the target: its authority (absolute and authority forms), path and query.
    pub authority: Option<Span>,
    /// The path (empty for the asterisk and authority forms).
    pub path: Span,
    /// The query without its `?`, if there is one.
    pub query: Option<Span>,
    /// The target's form.
    pub form: Option<TargetForm>,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// Header lines, in order.
    pub headers: Vec<Header>,
    /// The Host header's value, if there is one.
    pub host: Option<Span>,
    /// How the body is delimited: `Empty`, `Length` or `Chunked`.
    pub body: Option<BodyFraming>,
    /// `Upgrade` and `Connection: upgrade`: an upgrade request.
    pub upgrade: bool,
    /// The connection closes after this request: `Connection: close`, or HTTP/1.0 without
    /// `Connection: keep-alive`.
    pub close: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
}

/// The start of the HTTP/2 connection preface (RFC 9113 §3.4): a connection that begins
/// with it is HTTP/2 with prior knowledge.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl RequestHead {
    /// The body framing (`Empty` before a head was parsed).
    pub fn framing(&self) -> BodyFraming {
        self.body.unwrap_or(BodyFraming::Empty)
    }

    /// The host routed on: the target's authority (absolute form), else Host.
    pub fn routing_host(&self) -> Option<Span> {
        match self.form {
            Some(TargetForm::Absolute | TargetForm::Authority) => self.authority,
            _ => self.host,
        }
    }

    /// Parses `buf[..len]`, a whole head as [`HeadEnd::find`] delimited it, reusing this
    /// head's header list. The framing rules are applied; routing decides the rest.
    pub fn parse(&mut self, buf: &[u8], len: usize, limits: Limits) -> Result<(), HeadError> {
        self.headers.clear();
        self.len = len;
        self.authority = None;
        self.query = None;
        self.form = None;
        self.host = None;
        self.body = None;
        self.upgrade = false;
        self.close = false;
        self.expect_continue = false;
        if len > limits.max_bytes {
            return Err(HeadError::TooLarge);
        }
        let head = buf.get(..len).ok_or(HeadError::Malformed("truncated"))?;
        // Every LF is a CRLF's (RFC 9112 §2.2), checked before anything else so that a
        // head another parser would split elsewhere is refused as such.
        if has_bare_lf(head) {
            return Err(BadRequest::BareLineFeed.into());
        }
        let mut lines = Lines { head, at: 0 };
        let (start, end) = lines.next().ok_or(HeadError::Malformed("empty"))?;
        self.request_line(head, start, end)?;
        let mut lengths = 0usize;
        let mut length: Option<u64> = None;
        let mut te: Option<Span> = None;
        let mut connection_upgrade = false;
        let mut keep_alive = false;
        let mut close = false;
        let mut upgrade_header = false;
        for (start, end) in lines {
            if start == end {
                break;
            }
            if self.headers.len() == limits.max_headers {
                return Err(HeadError::TooManyHeaders);
            }
            let header = header_line(head, start, end)?;
            let value = header.value.of(head);
            match header.known {
                Known::Host => {
                    if self.host.is_some() {
                        return Err(BadRequest::DuplicateHost.into());
                    }
                    self.host = Some(header.value);
                }
                Known::ContentLength => {
                    lengths += 1;
                    if !value.is_ascii() {
                        return Err(BadRequest::BadLength.into());
                    }
                    if value.contains(&b',') {
                        return Err(BadRequest::DuplicateLength.into());
                    }
                    length = Some(parse_length(value).ok_or(BadRequest::BadLength)?);
                }
                Known::TransferEncoding => {
                    te = Some(header.value);
                    if !value.is_ascii() {
                        return Err(BadRequest::BadTransferEncoding.into());
                    }
                }
                Known::Connection | Known::Upgrade => {
                    if !value
                        .iter()
                        .all(|b| *b == b'\t' || (b' '..=b'~').contains(b))
                    {
                        return Err(BadRequest::BadConnection.into());
                    }
                    if header.known == Known::Upgrade {
                        upgrade_header = true;
                    } else {
                        for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                            connection_upgrade |= token.eq_ignore_ascii_case(b"upgrade");
                            close |= token.eq_ignore_ascii_case(b"close");
                            keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                        }
                    }
                }
                Known::Expect => {
                    self.expect_continue |= value.eq_ignore_ascii_case(b"100-continue");
                }
                _ => {}
            }
            self.headers.push(header);
        }
        if lengths > 0 && te.is_some() {
            return Err(BadRequest::LengthAndChunked.into());
        }
        // Transfer-Encoding is not HTTP/1.0's (RFC 9112 §6.1): faulty framing, refused.
        if self.minor == 0 && te.is_some() {
            return Err(BadRequest::BadTransferEncoding.into());
        }
        if lengths > 1 {
            return Err(BadRequest::DuplicateLength.into());
        }
        self.body = Some(match (length, te) {
            (Some(n), _) => BodyFraming::Length(n),
            (None, Some(_)) => {
                self.codings_end_in_chunked(head)?;
                if refuses_chunked(self.method.of(head)) {
                    return Err(BadRequest::ChunkedWithoutBodyMethod.into());
                }
                BodyFraming::Chunked
            }
            (None, None) => BodyFraming::Empty,
        });
        self.upgrade = upgrade_header && connection_upgrade;
        self.close = close || (self.minor == 0 && !keep_alive);
        Ok(())
    }

    /// Method, target and version.
    fn request_line(&mut self, head: &[u8], start: usize, end: usize) -> Result<(), HeadError> {
        let line = &head[start..end];
        let sp1 = line
            .iter()
            .position(|b| *b == b' ')
            .ok_or(HeadError::Malformed("request line"))?;
        let rest = &line[sp1 + 1..];
        let sp2 = rest
            .iter()
            .position(|b| *b == b' ')
            .ok_or(HeadError::Malformed("request line"))?;
        let (method, target, version) = (&line[..sp1], &rest[..sp2], &rest[sp2 + 1..]);
        if method.is_empty() || !method.iter().all(|b| is_tchar(*b)) {
            return Err(HeadError::Malformed("method"));
        }
        self.minor = match version {
            b"HTTP/1.1" => 1,
            b"HTTP/1.0" => 0,
            v if v.starts_with(b"HTTP/") && v.len() == 8 && v[6] == b'.' => {
                return Err(HeadError::Version);
            }
            _ => return Err(HeadError::Malformed("version")),
        };
        self.method = Span::new(start, start + sp1);
        let t = start + sp1 + 1;
        self.target = Span::new(t, t + target.len());
        self.split_target(target, t, method == b"CONNECT")
    }

    /// The target's form, authority, path and query. Its bytes are visible ASCII, and the
    /// path and query hold none that `http`'s URI parser refuses (so the two engines read
    /// the same targets); a fragment is refused.
    fn split_target(&mut self, target: &[u8], at: usize, connect: bool) -> Result<(), HeadError> {
        if target == b"*" {
            self.form = Some(TargetForm::Asterisk);
            self.path = Span::new(at, at);
            return Ok(());
        }
        let (form, path_at) = if target.starts_with(b"/") {
            (TargetForm::Origin, 0)
        } else if let Some(after) = scheme_len(target) {
            let authority_len = target[after..]
                .iter()
                .position(|b| matches!(b, b'/' | b'?'))
                .unwrap_or(target.len() - after);
            if authority_len == 0 {
                return Err(HeadError::Malformed("absolute target without authority"));
            }
            self.authority = Some(Span::new(at + after, at + after + authority_len));
            (TargetForm::Absolute, after + authority_len)
        } else {
            if !connect {
                return Err(HeadError::Malformed("request target"));
            }
            if !target.iter().all(|b| is_authority_byte(*b)) || target.is_empty() {
                return Err(HeadError::Malformed("request target"));
            }
            self.form = Some(TargetForm::Authority);
            self.authority = Some(Span::new(at, at + target.len()));
            self.path = Span::new(at + target.len(), at + target.len());
            return Ok(());
        };
        if let Some(a) = self.authority
            && !a
                .of_target(target, at)
                .iter()
                .all(|b| is_authority_byte(*b))
        {
            return Err(HeadError::Malformed("authority"));
        }
        let rest = &target[path_at..];
        let (path, query) = match rest.iter().position(|b| *b == b'?') {
            Some(q) => (&rest[..q], Some(&rest[q + 1..])),
            None => (rest, None),
        };
        if !path.iter().all(|b| is_path_byte(*b)) {
            return Err(HeadError::Malformed("path"));
        }
        if let Some(q) = query
            && !q.iter().all(|b| is_query_byte(*b))
        {
            return Err(HeadError::Malformed("query"));
        }
        let p = at + path_at;
        self.path = Span::new(p, p + path.len());
        self.query = query.map(|q| Span::new(p + path.len() + 1, p + path.len() + 1 + q.len()));
        self.form = Some(form);
        Ok(())
    }

    /// Every Transfer-Encoding line together: `chunked` exactly once, and last.
    fn codings_end_in_chunked(&self, head: &[u8]) -> Result<(), HeadError> {
        let mut codings = self
            .headers
            .iter()
            .filter(|h| h.known == Known::TransferEncoding)
            .flat_map(|h| h.value.of(head).split(|b| *b == b','))
            .map(<[u8]>::trim_ascii);
        let mut chunked = 0;
        let mut last: &[u8] = b"";
        for c in codings.by_ref() {
            if c.eq_ignore_ascii_case(b"chunked") {
                chunked += 1;
            }
            last = c;
        }
        if chunked != 1 || !last.eq_ignore_ascii_case(b"chunked") {
            return Err(BadRequest::BadTransferEncoding.into());
        }
        Ok(())
    }
}

/// Why an upstream's response head cannot be relayed (the client gets 502).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// Not a status line, a header line or a framing this parser reads.
    #[error("malformed response head: {0}")]
    Malformed(&'static str),
    /// Content-Length values that disagree, or one that is not a number.
    #[error("the response's Content-Length is not one number")]
    BadLength,
}

/// A parsed request head's headers, read in its buffer.
#[derive(Debug, Clone, Copy)]
pub struct HeadHeaders<'a> {
    /// The head.
    pub head: &'a RequestHead,
    /// The buffer it was parsed from.
    pub buf: &'a [u8],
}

impl crate::headers::HeaderLookup for HeadHeaders<'_> {
    fn any_value(&self, name: &str, f: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        self.head
            .headers
            .iter()
            .filter(|h| h.name.of(self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .any(|h| f(h.value.of(self.buf)))
    }

    fn each(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for h in &self.head.headers {
            f(h.name.of(self.buf), h.value.of(self.buf));
        }
    }
}

/// An HTTP/1.x response head.
#[derive(Debug, Clone, Default)]
pub struct ResponseHead {
    /// Its length, final CRLF included.
    pub len: usize,
    /// The status code.
    pub status: u16,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// Header lines, in order.
    pub headers: Vec<Header>,
    /// How the body is delimited.
    pub body: Option<BodyFraming>,
    /// The upstream closes the connection after this response (or must be closed).
    pub close: bool,
}

impl ResponseHead {
    /// The body framing (`Empty` before a head was parsed).
    pub fn framing(&self) -> BodyFraming {
        self.body.unwrap_or(BodyFraming::Empty)
    }

    /// An interim (1xx) response other than 101: another head follows.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }

    /// Parses `buf[..len]`, a whole head as [`HeadEnd::find`] delimited it. `head_request`:
    /// the request was HEAD, so the response has no body whatever it says.
    pub fn parse(
        &mut self,
        buf: &[u8],
        len: usize,
        head_request: bool,
    ) -> Result<(), ResponseError> {
        self.headers.clear();
        self.len = len;
        self.body = None;
        self.close = false;
        let head = buf
            .get(..len)
            .ok_or(ResponseError::Malformed("truncated"))?;
        if has_bare_lf(head) {
            return Err(ResponseError::Malformed("a line ends without CR"));
        }
        let mut lines = Lines { head, at: 0 };
        let (start, end) = lines.next().ok_or(ResponseError::Malformed("empty"))?;
        let line = &head[start..end];
        self.minor = match line.get(..9) {
            Some(b"HTTP/1.1 ") => 1,
            Some(b"HTTP/1.0 ") => 0,
            _ => return Err(ResponseError::Malformed("status line")),
        };
        let code = &line[9..];
        let digits = code.get(..3).ok_or(ResponseError::Malformed("status"))?;
        if !digits.iter().all(u8::is_ascii_digit) || code.get(3).is_some_and(|b| *b != b' ') {
            return Err(ResponseError::Malformed("status"));
        }
        self.status = digits
            .iter()
            .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
        if self.status < 100 {
            return Err(ResponseError::Malformed("status"));
        }
        let mut length: Option<u64> = None;
        let mut chunked_last = None;
        let mut keep_alive = false;
        for (start, end) in lines {
            if start == end {
                break;
            }
            let header = header_line(head, start, end).map_err(|e| match e {
                HeadError::Malformed(why) => ResponseError::Malformed(why),
                _ => ResponseError::Malformed("header line"),
            })?;
            let value = header.value.of(head);
            match header.known {
                Known::ContentLength => {
                    // A list of one number repeated is that number (RFC 9110 §8.6).
                    for v in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                        let n = parse_length(v).ok_or(ResponseError::BadLength)?;
                        if length.is_some_and(|l| l != n) {
                            return Err(ResponseError::BadLength);
                        }
                        length = Some(n);
                    }
                }
                Known::TransferEncoding => {
                    let last = value
                        .split(|b| *b == b',')
                        .next_back()
                        .map(<[u8]>::trim_ascii);
                    chunked_last = Some(last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
                }
                Known::Connection => {
                    for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                        self.close |= token.eq_ignore_ascii_case(b"close");
                        keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                    }
                }
                _ => {}
            }
            self.headers.push(header);
        }
        if self.minor == 0 && !keep_alive {
            self.close = true;
        }
        let no_body = head_request
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304;
        self.body = Some(match (chunked_last, length) {
            _ if no_body => BodyFraming::Empty,
            // Transfer-Encoding wins over Content-Length (RFC 9112 §6.3); not ending in
            // chunked, the body ends when the connection does.
            (Some(true), _) => BodyFraming::Chunked,
            (Some(false), _) => BodyFraming::UntilClose,
            (None, Some(n)) => BodyFraming::Length(n),
            (None, None) => BodyFraming::UntilClose,
        });
        if matches!(self.body, Some(BodyFraming::UntilClose))
            || chunked_last.is_some() && length.is_some()
        {
            // Either way the connection cannot carry another response.
            self.close = true;
        }
        Ok(())
    }
}

impl Span {
    /// This span's bytes in `target`, which starts at `at` in the buffer.
    fn of_target<'t>(&self, target: &'t [u8], at: usize) -> &'t [u8] {
        let (s, e) = (self.start as usize - at, self.end as usize - at);
        target.get(s..e).unwrap_or_default()
    }
}

/// The lines of a head whose every LF follows a CR: (start, end) of each line's content.
struct Lines<'h> {
    head: &'h [u8],
    at: usize,
}

impl Iterator for Lines<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        let rest = self.head.get(self.at..)?;
        let lf = memchr::memchr(b'\n', rest)?;
        let start = self.at;
        self.at += lf + 1;
        // The byte before the LF is its CR (checked by `parse`).
        Some((start, start + lf.saturating_sub(1)))
    }
}

/// `name: value` with the name a token, no whitespace before the colon, and a value of
/// visible ASCII, obs-text, spaces and tabs.
fn header_line(head: &[u8], start: usize, end: usize) -> Result<Header, HeadError> {
    let line = &head[start..end];
    let colon =
        memchr::memchr(b':', line).ok_or(HeadError::Malformed("header line without a colon"))?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|b| is_tchar(*b)) {
        return Err(HeadError::Malformed("header name"));
    }
    let raw = &line[colon + 1..];
    if !is_field_value(raw) {
        return Err(HeadError::Malformed("header value"));
    }
    let lead = raw
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(raw.len());
    let trail = raw[lead..]
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(0, |p| p + 1);
    let v = start + colon + 1 + lead;
    Ok(Header {
        name: Span::new(start, start + colon),
        value: Span::new(v, v + trail),
        line: Span::new(start, end + 2),
        known: Known::of(name),
    })
}

/// Whether some LF of `head` is not a CRLF's.
fn has_bare_lf(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

/// Whether every byte is visible ASCII, obs-text, a space or a tab: the whole value is
/// looked at without a branch per byte, so the compiler can take many bytes at once.
fn is_field_value(v: &[u8]) -> bool {
    !v.iter().fold(false, |bad, b| {
        bad | ((*b < b' ' && *b != b'\t') | (*b == 0x7f))
    })
}

/// A Content-Length: digits only, fitting in 64 bits.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// `http://` or `https://` (any case): its length.
fn scheme_len(target: &[u8]) -> Option<usize> {
    for scheme in [&b"http://"[..], b"https://"] {
        if target.len() >= scheme.len() && target[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Some(scheme.len());
        }
    }
    None
}

/// RFC 9110 §5.6.2 tchar: one load from [`TCHAR`] per byte (header names and methods
/// are read byte by byte while parsing).
#[inline]
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// Which bytes are tchars (RFC 9110 §5.6.2): letters, digits and ``!#$%&'*+-.^_`|~``.
static TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// Bytes `http` accepts in a path (it refuses `<`, `>`, `` ` `` and controls; `#` would
/// start a fragment, refused here).
fn is_path_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'<' | b'>' | b'`' | b'#')
}

/// Bytes `http` accepts in a query (it refuses `"`, `<`, `>` and controls; `#` is refused
/// here).
fn is_query_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'"' | b'<' | b'>' | b'#')
}

/// Bytes of an authority: a host (names, IPv4, bracketed IPv6) and port. What a valid one
/// is, [`crate::headers::valid_authority`] decides.
fn is_authority_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b'%'
                | b':'
                | b'['
                | b']'
                | b'@'
        )
}
