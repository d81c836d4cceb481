//! Request-smuggling detection and head timing on the raw client byte stream.
//!
//! hyper already handles ambiguous framing safely (with both Content-Length and
//! Transfer-Encoding it drops the length and closes the connection; it folds identical
//! duplicate lengths into one), but it hides these shapes from the handler. holdfast
//! rejects them with 400, so this tracker follows the client's bytes: each request head
//! (checked as a whole) and its body framing (Content-Length or chunked), so it knows where
//! the next head starts. It flags the index of the first offending request; the handler of
//! that request answers 400 and closes the connection.
//!
//! The same walk times request heads for the header read timeout, whatever the client
//! sends: heads with bytes that are not UTF-8 are followed like any other, an upgrade
//! request waits for the upstream's answer (tracking resumes if it was refused), and after
//! an HTTP/2 preface the tracker follows frames ([`FrameScanner`]): a stream's header block
//! is pending from its first byte until END_HEADERS, and only frames that carry requests
//! (HEADERS, CONTINUATION, DATA) count as activity, not PING, SETTINGS or WINDOW_UPDATE.
//! It stops only after a flag or at what hyper itself refuses (and closes).
//!
//! **One verdict per request, before it is handled.** hyper parses each head too, and two
//! readers of one byte stream can be put out of step (a request pipelined behind an
//! upgrade request that is then refused, a chunked body's trailers ended by a bare LF,
//! bytes that are not ASCII in `Connection`). So the handler of HTTP/1.1 request N asks
//! [`Tracker::verdict`] first: it is served only if the tracker has read request N's head
//! whole and flagged no request up to N; otherwise it gets 400 and the connection closes.
//! Where the two readers could disagree, the tracker refuses (bare LF anywhere in the
//! framing, a `Connection` that is not ASCII), so a disagreement ends the connection
//! rather than moving a flag onto another request.

use crate::headers::BadRequest;

/// Most bytes of a request head the tracker keeps (`--max-header-bytes` cannot be larger).
pub const MAX_HEAD: usize = 256 * 1024;

/// Longest chunk-size line followed: more than hyper accepts (16 KiB of extensions), so
/// a line past it has been refused by hyper, which closed the connection.
const MAX_CHUNK_LINE: usize = 64 * 1024;

/// The rest of the HTTP/2 connection preface after its `PRI * HTTP/2.0\r\n\r\n` "head".
const PREFACE_TAIL: usize = b"SM\r\n\r\n".len();

#[derive(Debug)]
enum State {
    /// Reading a request head.
    Head(HeadScan),
    /// Skipping a fixed-length body.
    Fixed(u64),
    /// Reading a chunk-size line.
    ChunkSize(Vec<u8>),
    /// Skipping chunk data, then its CRLF.
    ChunkData(u64),
    /// Reading trailer lines until an empty one.
    Trailers(Vec<u8>),
    /// An upgrade request (index) waits for its answer; bytes that arrive meanwhile are
    /// kept (a refused upgrade goes on as HTTP/1.1, and they are its next request).
    UpgradeWait(u64, Vec<u8>),
    /// Too much arrived before an upgrade's answer to keep; if the upgrade is refused the
    /// stream cannot be followed, so it is treated as a head that never ends (the header
    /// timeout closes the connection).
    Lost,
    /// HTTP/2 frames, after skipping what is left of the preface.
    H2(usize, FrameScanner),
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
    /// An upgrade request with a body: its index, while the body is followed (the upgrade
    /// is answered after it, RFC 9110 §7.8).
    upgrade_after_body: Option<u64>,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            state: State::Head(HeadScan::default()),
            request: 0,
            flagged: None,
            upgrade_after_body: None,
        }
    }
}

/// What a head says about its framing.
#[derive(Debug, PartialEq, Eq)]
struct HeadInfo {
    length: Option<u64>,
    chunked: bool,
    upgrade: bool,
    h2_preface: bool,
}

/// Most bytes of framing header values (Content-Length, Transfer-Encoding, Connection,
/// Upgrade, all of them together) the tracker keeps of one head; a head with more is
/// refused. It bounds the tracker's own copy of a head.
const MAX_FRAMING_VALUE: usize = 8 * 1024;

/// Most bytes kept while an upgrade request waits for its answer; past it the stream
/// cannot be followed (see [`State::Lost`]).
const MAX_UPGRADE_WAIT: usize = 16 * 1024;

/// Longest trailer line followed; past it tracking stops (hyper refuses such trailers).
const MAX_TRAILER_LINE: usize = 8 * 1024;

/// Which header a head line is, as far as framing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Field {
    /// Still reading the name.
    #[default]
    Name,
    ContentLength,
    TransferEncoding,
    Connection,
    Upgrade,
    /// Any other header: its value is skipped.
    Other,
}

/// A request head read as it arrives, keeping only what framing needs: the start of the
/// request line (an HTTP/2 preface) and the values of Content-Length, Transfer-Encoding,
/// Connection and Upgrade. The head itself stays in one place, hyper's read buffer: a slow
/// client's partial head is held once, not twice.
#[derive(Debug, Default)]
struct HeadScan {
    /// Bytes of this head so far.
    seen: usize,
    /// Lines ended so far (0 while reading the request line).
    lines: usize,
    /// Bytes of the current line so far.
    line_len: usize,
    /// A CR was read and its LF (or not) is next.
    cr: bool,
    field: Field,
    /// The current header's name, lower case, while it is short enough to matter.
    name: Vec<u8>,
    /// The current framing header's value.
    value: Vec<u8>,
    /// Bytes of framing header values kept so far in this head.
    kept: usize,
    /// The first bytes of the request line.
    request_line: Vec<u8>,
    lengths: Vec<Vec<u8>>,
    te: Vec<Vec<u8>>,
    connection: Vec<Vec<u8>>,
    upgrade: bool,
    /// A line ended by a bare LF (refused before anything else).
    bare_lf: bool,
    /// The first other line that makes the head refused: with why, or None for a header
    /// line without a colon (which hyper refuses too).
    problem: Option<Option<BadRequest>>,
}

/// What reading one more byte of a head gave.
enum Scanned {
    More,
    /// The head ended with this byte.
    Done,
}

impl HeadScan {
    fn feed_byte(&mut self, b: u8) -> Scanned {
        self.seen += 1;
        if self.cr {
            self.cr = false;
            if b == b'\n' {
                return self.end_line();
            }
            // A lone CR inside a line is part of it.
            self.content(b'\r');
        }
        match b {
            b'\r' => self.cr = true,
            b'\n' => {
                // A line ended by a bare LF (RFC 9112 §2.2): hyper accepts it, another
                // parser in front of or behind holdfast may split the head elsewhere.
                self.bare_lf = true;
                return self.end_line();
            }
            _ => self.content(b),
        }
        Scanned::More
    }

    fn content(&mut self, b: u8) {
        self.line_len += 1;
        if self.lines == 0 {
            if self.request_line.len() < 16 {
                self.request_line.push(b);
            }
            return;
        }
        match self.field {
            Field::Name if b == b':' => {
                self.field = match self.name.trim_ascii() {
                    b"content-length" => Field::ContentLength,
                    b"transfer-encoding" => Field::TransferEncoding,
                    b"connection" => Field::Connection,
                    b"upgrade" => Field::Upgrade,
                    _ => Field::Other,
                };
            }
            Field::Name => {
                // Longer than any name that matters: keep counting, stop keeping.
                if self.name.len() <= 32 {
                    self.name.push(b.to_ascii_lowercase());
                }
            }
            Field::Other => {}
            _ => {
                if self.kept < MAX_FRAMING_VALUE {
                    self.value.push(b);
                    self.kept += 1;
                } else {
                    let bad = match self.field {
                        Field::ContentLength => BadRequest::BadLength,
                        Field::TransferEncoding => BadRequest::BadTransferEncoding,
                        _ => BadRequest::BadConnection,
                    };
                    self.problem.get_or_insert(Some(bad));
                }
            }
        }
    }

    fn end_line(&mut self) -> Scanned {
        let empty = self.line_len == 0;
        if empty && self.lines > 0 {
            return Scanned::Done;
        }
        if self.lines > 0 {
            let value = std::mem::take(&mut self.value);
            let value = value.trim_ascii().to_vec();
            match self.field {
                Field::Name => {
                    self.problem.get_or_insert(None);
                }
                Field::ContentLength => self.lengths.push(value),
                Field::TransferEncoding => self.te.push(value),
                field @ (Field::Connection | Field::Upgrade) => {
                    // hyper reads a value that is not visible ASCII as no token at all,
                    // this parser would read the ASCII in it: they could disagree on an
                    // upgrade.
                    if !value
                        .iter()
                        .all(|b| *b == b'\t' || (b' '..=b'~').contains(b))
                    {
                        self.problem.get_or_insert(Some(BadRequest::BadConnection));
                    }
                    if field == Field::Upgrade {
                        self.upgrade = true;
                    } else {
                        self.connection.push(value);
                    }
                }
                Field::Other => {}
            }
        }
        self.lines += 1;
        self.line_len = 0;
        self.field = Field::Name;
        self.name.clear();
        Scanned::More
    }

    /// What the whole head says about its framing.
    fn decide(self) -> Result<HeadInfo, Option<BadRequest>> {
        if self.bare_lf {
            return Err(Some(BadRequest::BareLineFeed));
        }
        if self.request_line.starts_with(b"PRI * HTTP/2.0") {
            return Ok(HeadInfo {
                length: None,
                chunked: false,
                upgrade: false,
                h2_preface: true,
            });
        }
        if let Some(problem) = self.problem {
            return Err(problem);
        }
        let (lengths, te) = (self.lengths, self.te);
        if !lengths.is_empty() && !te.is_empty() {
            return Err(Some(BadRequest::LengthAndChunked));
        }
        if lengths.len() > 1 || lengths.iter().any(|l| l.contains(&b',')) {
            return Err(Some(BadRequest::DuplicateLength));
        }
        let length = match lengths.first() {
            Some(l) if !l.is_empty() && l.iter().all(u8::is_ascii_digit) => Some(
                std::str::from_utf8(l)
                    .ok()
                    .and_then(|l| l.parse().ok())
                    .ok_or(Some(BadRequest::BadLength))?,
            ),
            Some(_) => return Err(Some(BadRequest::BadLength)),
            None => None,
        };
        let chunked = te
            .iter()
            .flat_map(|v| v.split(|b| *b == b','))
            .last()
            .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        if !te.is_empty() && !chunked {
            return Err(Some(BadRequest::BadTransferEncoding));
        }
        let connection_upgrade = self
            .connection
            .iter()
            .flat_map(|v| v.split(|b| *b == b','))
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"));
        Ok(HeadInfo {
            length,
            chunked,
            upgrade: self.upgrade && connection_upgrade,
            h2_preface: false,
        })
    }
}

impl Tracker {
    /// The first offending request (index) and why, if any.
    pub fn flagged(&self) -> Option<&(u64, BadRequest)> {
        self.flagged.as_ref()
    }

    /// Whether HTTP/1.1 request `index` (0-based, in the order hyper hands them over) may
    /// be handled: the tracker has read its head whole and flagged no request up to it.
    /// `upgrade_answer` is the last upgrade answer (`(index + 1) << 1 | switched`, 0 for
    /// none): a request pipelined behind a refused upgrade arrived with it, and is read
    /// from what the tracker kept, here, before the verdict.
    pub fn verdict(&mut self, index: u64, upgrade_answer: u64) -> Result<(), BadRequest> {
        if let Some(waiting) = self.awaiting_upgrade()
            && upgrade_answer >> 1 == waiting + 1
        {
            self.upgrade_answered(upgrade_answer & 1 == 1);
        }
        if let Some((flagged, bad)) = &self.flagged
            && *flagged <= index
        {
            return Err(bad.clone());
        }
        if self.request > index {
            Ok(())
        } else {
            Err(BadRequest::Unframed)
        }
    }

    /// True while part of a request head has arrived but not all of it: the time a client
    /// may take for that is the header read timeout. Not between requests (an idle
    /// keep-alive connection is governed by the idle timeout). Over HTTP/2, true while a
    /// stream's header block is arriving.
    pub fn head_pending(&self) -> bool {
        match &self.state {
            State::Head(scan) => scan.seen > 0,
            State::H2(_, frames) => frames.headers_pending(),
            // Bytes sent before the upgrade's answer: if it is refused they are the next
            // head, so they are timed from now on (a tunnel is not timed at all).
            State::UpgradeWait(_, pending) => !pending.is_empty(),
            State::Lost => true,
            _ => false,
        }
    }

    /// The upgrade request waiting for its answer, if any (see [`Tracker::upgrade_answered`]).
    pub fn awaiting_upgrade(&self) -> Option<u64> {
        match &self.state {
            State::UpgradeWait(index, _) => Some(*index),
            _ => None,
        }
    }

    /// True after the upgrade wait overflowed (see [`State::Lost`]).
    fn lost(&self) -> bool {
        matches!(self.state, State::Lost)
    }

    /// The upgrade request is answered: `switched` (101) hands the connection to a tunnel,
    /// which is not HTTP any more; otherwise HTTP/1.1 goes on, starting with the bytes that
    /// arrived meanwhile.
    pub fn upgrade_answered(&mut self, switched: bool) {
        if self.lost() {
            if switched {
                self.state = State::Off;
            }
            return;
        }
        if let State::UpgradeWait(_, pending) = &mut self.state {
            let pending = std::mem::take(pending);
            if switched {
                self.state = State::Off;
            } else {
                self.state = State::Head(HeadScan::default());
                self.feed(&pending);
            }
        }
    }

    /// Flags the request whose body is being read (the last head read) and stops.
    fn flag_body(&mut self, bad: BadRequest) {
        self.flagged = Some((self.request.saturating_sub(1), bad));
        self.state = State::Off;
    }

    /// Where a request goes once its body (possibly empty) has been read: the next head,
    /// or, after an upgrade request, the wait for its answer.
    fn after_body(&mut self) -> State {
        match self.upgrade_after_body.take() {
            Some(index) => State::UpgradeWait(index, Vec::new()),
            None => State::Head(HeadScan::default()),
        }
    }

    /// True once the connection speaks HTTP/2.
    pub fn is_h2(&self) -> bool {
        matches!(self.state, State::H2(..))
    }

    /// Feeds bytes read from the client. Returns whether they count as activity for the
    /// idle timeout (over HTTP/2, only frames that carry requests do).
    pub fn feed(&mut self, mut data: &[u8]) -> bool {
        let mut active = !self.is_h2();
        while !data.is_empty() {
            match &mut self.state {
                State::Off | State::Lost => break,
                State::UpgradeWait(_, pending) => {
                    if pending.len() + data.len() > MAX_UPGRADE_WAIT {
                        self.state = State::Lost;
                    } else {
                        pending.extend_from_slice(data);
                    }
                    break;
                }
                State::H2(skip, frames) => {
                    let n = (*skip).min(data.len());
                    *skip -= n;
                    data = &data[n..];
                    active |= frames.feed(data);
                    break;
                }
                State::Head(scan) => {
                    // Leading empty lines between requests are allowed (RFC 9112 §2.2).
                    if scan.seen == 0 {
                        let skip = data
                            .iter()
                            .take_while(|b| **b == b'\r' || **b == b'\n')
                            .count();
                        data = &data[skip..];
                        if data.is_empty() {
                            break;
                        }
                    }
                    let mut ended = None;
                    for (i, b) in data.iter().enumerate() {
                        if let Scanned::Done = scan.feed_byte(*b) {
                            ended = Some(i + 1);
                            break;
                        }
                        if scan.seen > MAX_HEAD {
                            break;
                        }
                    }
                    let Some(consumed) = ended else {
                        if scan.seen > MAX_HEAD {
                            self.state = State::Off;
                        }
                        break;
                    };
                    data = &data[consumed..];
                    let scan = std::mem::take(scan);
                    match scan.decide() {
                        Err(Some(bad)) => {
                            self.flagged = Some((self.request, bad));
                            self.state = State::Off;
                            break;
                        }
                        Err(None) => {
                            self.state = State::Off;
                            break;
                        }
                        Ok(info) if info.h2_preface => {
                            self.state = State::H2(PREFACE_TAIL, FrameScanner::default());
                        }
                        Ok(info) => {
                            let index = self.request;
                            self.request += 1;
                            // An upgrade request's body (if any) is still HTTP/1.1: it
                            // is followed first, then the answer is awaited.
                            if info.upgrade {
                                self.upgrade_after_body = Some(index);
                            }
                            self.state = if info.chunked {
                                State::ChunkSize(Vec::new())
                            } else {
                                match info.length {
                                    Some(n) if n > 0 => State::Fixed(n),
                                    _ => self.after_body(),
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
                        self.state = self.after_body();
                    }
                }
                State::ChunkSize(line) => {
                    let Some(i) = data.iter().position(|b| *b == b'\n') else {
                        line.extend_from_slice(data);
                        // hyper refuses (and closes on) chunk extensions over 16 KiB.
                        if line.len() > MAX_CHUNK_LINE {
                            self.state = State::Off;
                        }
                        break;
                    };
                    line.extend_from_slice(&data[..=i]);
                    data = &data[i + 1..];
                    if !line.ends_with(b"\r\n") {
                        self.flag_body(BadRequest::BareLineFeed);
                        break;
                    }
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
                        if line.len() > MAX_TRAILER_LINE {
                            self.state = State::Off;
                        }
                        break;
                    };
                    line.extend_from_slice(&data[..=i]);
                    data = &data[i + 1..];
                    if !line.ends_with(b"\r\n") {
                        self.flag_body(BadRequest::BareLineFeed);
                        break;
                    }
                    let empty = line.as_slice() == b"\r\n";
                    line.clear();
                    if empty {
                        self.state = self.after_body();
                    }
                }
            }
        }
        active
    }
}

/// Follows HTTP/2 frames (RFC 9113 §4.1) in one direction, by their 9-byte headers.
#[derive(Debug, Default)]
pub struct FrameScanner {
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to skip.
    remaining: u32,
    /// Inside the payload of a HEADERS or CONTINUATION frame.
    in_block: bool,
    /// A header block was started and its END_HEADERS has not arrived.
    block_open: bool,
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

impl FrameScanner {
    /// Feeds bytes; returns whether they started a frame that carries a request or
    /// response (HEADERS, CONTINUATION, DATA).
    pub fn feed(&mut self, mut data: &[u8]) -> bool {
        let mut active = false;
        while !data.is_empty() {
            if self.remaining > 0 {
                let take = (self.remaining as usize).min(data.len());
                self.remaining -= take as u32;
                data = &data[take..];
                if self.remaining == 0 {
                    self.in_block = false;
                }
                continue;
            }
            let take = (9 - self.have).min(data.len());
            self.header[self.have..self.have + take].copy_from_slice(&data[..take]);
            self.have += take;
            data = &data[take..];
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let h = self.header;
            let length = u32::from_be_bytes([0, h[0], h[1], h[2]]);
            let (kind, flags) = (h[3], h[4]);
            active |= matches!(kind, DATA | HEADERS | CONTINUATION);
            if matches!(kind, HEADERS | CONTINUATION) {
                self.block_open = flags & END_HEADERS == 0;
                self.in_block = length > 0;
            }
            self.remaining = length;
        }
        active
    }

    /// True from the first byte of a header block until its END_HEADERS frame is whole.
    pub fn headers_pending(&self) -> bool {
        self.block_open || self.in_block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head parser the tracker had before it read heads as they arrive (kept whole,
    /// then parsed): the reference the streaming one must agree with.
    mod reference {
        use super::super::{BadRequest, HeadInfo};

        pub(super) fn parse_head(head: &[u8]) -> Result<HeadInfo, Option<BadRequest>> {
            // A line ended by a bare LF: hyper accepts it, but another parser in front of or
            // behind holdfast may split the head elsewhere (RFC 9112 §2.2 allows refusing it).
            if head
                .iter()
                .enumerate()
                .any(|(i, b)| *b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
            {
                return Err(Some(BadRequest::BareLineFeed));
            }
            // Header values may carry obs-text; only ASCII names and values matter here.
            let text = String::from_utf8_lossy(head);
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
                let name = name.trim().to_ascii_lowercase();
                // hyper reads a header value that is not visible ASCII as no token at all, this
                // parser would read the ASCII in it: they could disagree on an upgrade.
                if matches!(name.as_str(), "connection" | "upgrade")
                    && !value
                        .bytes()
                        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
                {
                    return Err(Some(BadRequest::BadConnection));
                }
                match name.as_str() {
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

        /// The end (exclusive) of the first head in `buf`, searching from `from`: an empty line,
        /// whether lines end in CRLF or (refused later) a bare LF.
        pub(super) fn head_end(buf: &[u8], from: usize) -> Option<usize> {
            (from..buf.len()).find_map(|i| {
                if buf[i] != b'\n' {
                    return None;
                }
                match buf.get(i + 1..) {
                    Some([b'\n', ..]) => Some(i + 2),
                    Some([b'\r', b'\n', ..]) => Some(i + 3),
                    _ => None,
                }
            })
        }
    }

    /// The streaming head reader agrees with the whole-head reference on where a head
    /// ends and what it says, for heads made of framing headers, odd lines and both line
    /// endings.
    #[test]
    fn reading_a_head_as_it_arrives_agrees_with_reading_it_whole() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let request_lines = ["GET / HTTP/1.1", "POST /x HTTP/1.1", "PRI * HTTP/2.0"];
        let lines: [&[u8]; 16] = [
            b"Host: a",
            b"Content-Length: 5",
            b"content-length:  12 ",
            b"Content-Length: 1, 1",
            b"Content-Length: x",
            b"Transfer-Encoding: chunked",
            b"Transfer-Encoding: gzip, chunked",
            b"Transfer-Encoding: gzip",
            b"Connection: keep-alive, Upgrade",
            b"Connection: up\xc3grade",
            b"Upgrade: websocket",
            b"X-Colon: a:b",
            b"NoColon",
            b"Content-Length : 5",
            b" folded",
            b"X-Bin: \xff\xfe",
        ];
        let strategy = (
            0..request_lines.len(),
            proptest::collection::vec((0..lines.len(), any::<bool>()), 0..8),
            any::<bool>(),
        );
        let mut runner = TestRunner::new(Config {
            cases: 2000,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&strategy, |(first, picked, bare_end)| {
                let mut head = request_lines[first].as_bytes().to_vec();
                head.extend_from_slice(b"\r\n");
                for (i, bare) in &picked {
                    head.extend_from_slice(lines[*i]);
                    head.extend_from_slice(if *bare { b"\n" } else { b"\r\n" });
                }
                head.extend_from_slice(if bare_end { b"\n" } else { b"\r\n" });
                let end = reference::head_end(&head, 0);
                let mut scan = HeadScan::default();
                let mut ended = None;
                for (i, b) in head.iter().enumerate() {
                    if let Scanned::Done = scan.feed_byte(*b) {
                        ended = Some(i + 1);
                        break;
                    }
                }
                prop_assert_eq!(ended, end, "{:?}", String::from_utf8_lossy(&head));
                if let Some(end) = end {
                    prop_assert_eq!(
                        scan.decide(),
                        reference::parse_head(&head[..end]),
                        "{:?}",
                        String::from_utf8_lossy(&head)
                    );
                }
                Ok(())
            })
            .unwrap();
    }

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
    fn an_h2_preface_switches_to_frames_and_a_body_shaped_like_a_head_is_not_flagged() {
        assert_eq!(
            flagged(
                "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
            ),
            None
        );
    }

    const UPGRADE: &str =
        "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    const BAD: &str = "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx";

    #[test]
    fn an_accepted_upgrade_stops_tracking_the_tunnel() {
        let mut t = Tracker::default();
        t.feed(UPGRADE.as_bytes());
        assert_eq!(t.awaiting_upgrade(), Some(0));
        assert!(!t.head_pending(), "waiting for the upstream is not a head");
        t.upgrade_answered(true);
        t.feed(BAD.as_bytes());
        assert_eq!(t.flagged(), None, "tunnel bytes are not requests");
        t.feed(b"GET / HTT");
        assert!(!t.head_pending(), "tunnel bytes are not a head");
    }

    #[test]
    fn a_refused_upgrade_goes_on_as_http_1_with_the_bytes_that_arrived_meanwhile() {
        let mut t = Tracker::default();
        t.feed(format!("{GET}{UPGRADE}GET / HT").as_bytes());
        assert_eq!(t.awaiting_upgrade(), Some(1));
        assert!(
            t.head_pending(),
            "bytes after an upgrade request are timed until it is answered"
        );
        t.upgrade_answered(false);
        assert!(t.head_pending(), "the next head is timed again");
        t.feed(b"TP/1.1\r\nHost: a\r\n\r\n");
        assert!(!t.head_pending());
        t.feed(BAD.as_bytes());
        assert_eq!(t.flagged(), Some(&(3, BadRequest::DuplicateLength)));
    }

    /// Request 2 arrived in the same read as the upgrade request 1, before its answer:
    /// when it is to be handled, the verdict applies the (refused) answer and reads it from
    /// what was kept, so it is served; a request whose head the tracker has not read whole
    /// is refused, never served on a guess.
    #[test]
    fn a_request_pipelined_behind_a_refused_upgrade_gets_its_verdict_from_what_was_kept() {
        let mut t = Tracker::default();
        t.feed(format!("{GET}{UPGRADE}{GET}").as_bytes());
        assert_eq!(t.verdict(0, 0), Ok(()));
        assert_eq!(t.verdict(1, 0), Ok(()));
        assert_eq!(
            t.verdict(2, 0),
            Err(BadRequest::Unframed),
            "not before the upgrade is answered"
        );
        let refused = (1 + 1) << 1;
        assert_eq!(t.verdict(2, refused), Ok(()));
        assert_eq!(t.verdict(3, refused), Err(BadRequest::Unframed));
    }

    /// A flag is never moved onto another request: every request from the flagged one on
    /// is refused, whichever of them is handled first.
    #[test]
    fn every_request_from_a_flagged_one_on_is_refused() {
        let mut t = Tracker::default();
        t.feed(format!("{GET}{BAD}{GET}").as_bytes());
        assert_eq!(t.verdict(0, 0), Ok(()));
        assert_eq!(t.verdict(1, 0), Err(BadRequest::DuplicateLength));
        assert_eq!(t.verdict(2, 0), Err(BadRequest::DuplicateLength));
    }

    /// Where hyper and this parser could read the bytes differently, the tracker refuses:
    /// chunk-size lines and trailers ended by a bare LF, and a Connection or Upgrade value
    /// that is not ASCII.
    #[test]
    fn bare_line_feeds_in_chunked_framing_and_non_ascii_connection_values_are_flagged() {
        let chunked = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
        for body in ["1\nx\r\n0\r\n\r\n", "0\r\nx-trailer: 1\n\r\n", "0\r\n\n"] {
            let mut t = Tracker::default();
            t.feed(format!("{chunked}{body}{GET}").as_bytes());
            assert_eq!(
                t.flagged(),
                Some(&(0, BadRequest::BareLineFeed)),
                "{body:?}"
            );
            assert_eq!(t.verdict(1, 0), Err(BadRequest::BareLineFeed));
        }
        for value in [&b"Upgrade\xc3\xa9"[..], b"keep-alive, up\x80grade"] {
            let mut head =
                b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: ".to_vec();
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n\r\n");
            let mut t = Tracker::default();
            t.feed(&head);
            assert_eq!(t.flagged(), Some(&(0, BadRequest::BadConnection)));
        }
        let mut t = Tracker::default();
        t.feed(format!("{chunked}0\r\nx-trailer: 1\r\n\r\n{GET}").as_bytes());
        assert_eq!(t.flagged(), None, "CRLF trailers are fine");
        assert_eq!(t.verdict(1, 0), Ok(()));
    }

    /// An upgrade request with a body (curl --http2 sends `Upgrade: h2c` on a POST): the
    /// body is followed as HTTP/1.1 and the answer awaited after it, so a body that looks
    /// like a head neither becomes the next head nor stops the timing.
    #[test]
    fn an_upgrade_requests_body_is_followed_before_its_answer() {
        let upgrade_post = |framing: &str| {
            format!(
                "POST / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n{framing}\r\n"
            )
        };
        let fake_head = "GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n";
        for (framing, body) in [
            (
                format!("Content-Length: {}\r\n", fake_head.len()),
                fake_head.to_owned(),
            ),
            (
                "Transfer-Encoding: chunked\r\n".to_owned(),
                format!("{:x}\r\n{fake_head}\r\n0\r\n\r\n", fake_head.len()),
            ),
            ("Content-Length: 3\r\n".to_owned(), "a\nb".to_owned()),
        ] {
            let mut t = Tracker::default();
            t.feed(upgrade_post(&framing).as_bytes());
            assert_eq!(t.awaiting_upgrade(), None, "the body comes first");
            t.feed(body.as_bytes());
            assert_eq!(t.awaiting_upgrade(), Some(0), "{framing}");
            assert!(!t.head_pending());
            t.upgrade_answered(false);
            t.feed(b"GET / HT");
            assert!(t.head_pending(), "the next head is timed ({framing})");
            t.feed(b"TP/1.1\r\nHost: a\r\n\r\n");
            assert!(!t.head_pending());
            assert_eq!(t.flagged(), None, "{framing}");
        }
    }

    #[test]
    fn chunk_extensions_hyper_accepts_do_not_stop_the_tracker() {
        let mut t = Tracker::default();
        t.feed(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
        t.feed(format!("1;ext={}\r\nx\r\n0\r\n\r\n", "e".repeat(8000)).as_bytes());
        t.feed(b"GET / HT");
        assert!(t.head_pending(), "the next head is still timed");
    }

    #[test]
    fn too_much_before_an_upgrades_answer_is_timed_until_the_connection_ends() {
        let mut t = Tracker::default();
        t.feed(UPGRADE.as_bytes());
        t.feed(&vec![b'x'; MAX_HEAD + 1]);
        assert!(t.head_pending());
        t.upgrade_answered(false);
        assert!(
            t.head_pending(),
            "a refused upgrade after an overflow stays timed"
        );
        let mut t = Tracker::default();
        t.feed(UPGRADE.as_bytes());
        t.feed(&vec![b'x'; MAX_HEAD + 1]);
        t.upgrade_answered(true);
        assert!(!t.head_pending(), "a tunnel is not timed");
    }

    #[test]
    fn a_head_with_bytes_that_are_not_utf8_is_still_followed_and_timed() {
        let mut t = Tracker::default();
        t.feed(b"GET / HTTP/1.1\r\nHost: a\r\nX-Name: caf\xe9\r\n\r\n");
        assert_eq!(t.flagged(), None);
        t.feed(b"GET / HTTP/1.1\r\nHo");
        assert!(t.head_pending(), "the next head is timed");
    }

    #[test]
    fn a_head_ended_by_bare_line_feeds_is_flagged() {
        assert_eq!(
            flagged("GET / HTTP/1.1\nHost: a\n\n"),
            Some((0, BadRequest::BareLineFeed))
        );
        assert_eq!(
            flagged(&format!("{GET}GET / HTTP/1.1\r\nHost: a\n\r\n")),
            Some((1, BadRequest::BareLineFeed))
        );
    }

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn over_h2_a_header_block_is_pending_until_end_headers_and_pings_are_not_activity() {
        let mut t = Tracker::default();
        assert!(t.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        assert!(t.is_h2());
        assert!(!t.feed(&frame(0x4, 0, &[])), "SETTINGS");
        assert!(!t.feed(&frame(0x6, 0, &[0; 8])), "PING");
        assert!(!t.feed(&frame(0x8, 0, &[0, 0, 1, 0])), "WINDOW_UPDATE");
        assert!(!t.head_pending());
        // HEADERS without END_HEADERS: pending until the CONTINUATION that ends it.
        let headers = frame(0x1, 0, b"abc");
        assert!(!t.feed(&headers[..5]), "part of a frame header");
        assert!(t.feed(&headers[5..10]), "a HEADERS frame is activity");
        assert!(t.head_pending(), "a header block arriving");
        t.feed(&headers[10..]);
        assert!(t.head_pending(), "no END_HEADERS yet");
        assert!(!t.feed(&frame(0x6, 0, &[0; 8])));
        assert!(t.head_pending(), "a PING does not end a header block");
        assert!(t.feed(&frame(0x9, 0x4, b"d")));
        assert!(!t.head_pending());
        assert!(t.feed(&frame(0x0, 0x1, b"body")), "DATA");
    }
}
