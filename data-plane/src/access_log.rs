//! The access log's sink: one line per request, formatted on the serving thread and
//! written by a thread of its own, so that logging never slows or blocks serving.
//!
//! A line is formatted on the serving thread into a reused scratch buffer and appended to
//! one shared batch (a short lock, no wake-up); the writer thread takes the whole batch
//! every [`FLUSH_EVERY`] (or sooner once it is half full) and writes it in one write, as
//! nginx's `access_log ... buffer= flush=` does. The batch holds at most [`Sink::start`]'s
//! `capacity` lines: when the writer falls behind (a slow disk, a blocked pipe) and the
//! batch is full, a line is dropped and counted ([`Sink::dropped`]), and the request that
//! made it goes on: [`Sink::log`] never waits for the writer.
//!
//! Two formats: JSON, one object per line with the field names of [`Record`] (stable:
//! docs/operating.md lists them), and nginx's `combined`, for pipelines that parse it.
//! [`Sample`] keeps a ratio of the requests, and every error (a status of 400 or more,
//! or a local answer with a reason).

use std::borrow::Cow;
use std::io::Write;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast_lock::Lock;
use prometheus_client::metrics::counter::Counter;

/// What one line says of a request.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// When the request's head was read.
    pub time: SystemTime,
    /// The client's address, after the trusted-forwarder rules.
    pub client: IpAddr,
    /// The method.
    pub method: &'a str,
    /// The Host (or `:authority`).
    pub host: &'a str,
    /// The normalised path, with the query only when the log keeps queries.
    pub path: &'a str,
    /// `HTTP/1.1`, `HTTP/1.0` or `HTTP/2.0`.
    pub protocol: &'a str,
    /// The TLS version (`TLSv1.3`) and SNI of the client's connection, over TLS.
    pub tls: Option<(&'a str, Option<&'a str>)>,
    /// The status answered.
    pub status: u16,
    /// Bytes of the request read from the client (head and body).
    pub bytes_received: u64,
    /// Bytes of the response written to the client (head and body).
    pub bytes_sent: u64,
    /// From the head read to the response's last byte written.
    pub duration: Duration,
    /// From the request sent upstream to the response head back, when it went upstream.
    pub upstream_duration: Option<Duration>,
    /// The endpoint (or ExternalName) it went to.
    pub upstream: Option<&'a str>,
    /// The route that matched (`ingress ns/name host path`, or a Gateway API route).
    pub route: Option<&'a str>,
    /// Why the proxy answered itself (`no_route`, `rate_limited`, ...), when it did.
    pub reason: Option<&'a str>,
    /// The request's `X-Request-Id`.
    pub request_id: Option<&'a str>,
    /// The W3C trace id of its `traceparent`.
    pub trace_id: Option<&'a str>,
    /// `Referer` (the combined format's).
    pub referer: Option<&'a str>,
    /// `User-Agent` (the combined format's).
    pub user_agent: Option<&'a str>,
}

impl Record<'_> {
    /// Whether it is an error, which sampling always keeps.
    pub fn is_error(&self) -> bool {
        self.status >= 400 || self.reason.is_some()
    }
}

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Json,
    /// nginx's `combined`: `$remote_addr - - [$time_local] "$request" $status
    /// $body_bytes_sent "$http_referer" "$http_user_agent"`.
    Combined,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(Format::Json),
            "combined" => Ok(Format::Combined),
            other => Err(format!(
                "{other:?} is not an access log format (json, combined)"
            )),
        }
    }
}

/// Which requests are logged: a ratio of them, spread evenly (every `1/ratio`-th), and
/// every error.
#[derive(Debug)]
pub struct Sample {
    /// Parts per million kept.
    ppm: u64,
    seen: AtomicU64,
}

impl Sample {
    /// Keeps `ratio` (0 to 1; out of range is clamped) of the requests that are not errors.
    pub fn new(ratio: f64) -> Self {
        let ratio = if ratio.is_nan() {
            1.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        Sample {
            ppm: (ratio * 1_000_000.0).round() as u64,
            seen: AtomicU64::new(0),
        }
    }

    /// Whether `record` is logged.
    pub fn keeps(&self, record: &Record<'_>) -> bool {
        if record.is_error() || self.ppm >= 1_000_000 {
            return true;
        }
        // Kept when the running count of kept requests steps up: exactly `ratio` of
        // them over any long run, none two in a row for a small ratio.
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        (n + 1) * self.ppm / 1_000_000 > n * self.ppm / 1_000_000
    }
}

/// How long a line waits for the writer at most, when the batch is not half full.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// Most bytes a batch holds, whatever its line count (a client's long paths and headers
/// make long lines); past it lines are dropped and counted.
pub const MAX_BATCH_BYTES: usize = 8 << 20;

/// The writer end: the shared batch of lines, and the thread that writes it.
pub struct Sink {
    batch: Arc<Shared>,
    format: Format,
    sample: Sample,
    dropped: Counter,
}

/// The lines waiting for the writer.
struct Shared {
    batch: Mutex<Batch>,
    /// Signalled when the batch is half full, and when the sink closes.
    ready: Condvar,
    /// Signalled when the writer has ended.
    ended: Condvar,
    /// Most lines waiting.
    capacity: usize,
}

#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    lines: usize,
    closed: bool,
    /// The writer has written what it will and ended.
    ended: bool,
}

thread_local! {
    /// Each serving thread's line, formatted before the batch's lock is taken.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(512));
}

/// What became of a record given to [`Sink::log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logged {
    /// Queued for the writer.
    Queued,
    /// Left out by sampling.
    Sampled,
    /// The queue was full (the writer is behind): dropped and counted.
    Dropped,
}

impl Sink {
    /// Starts the writer thread on `out`, with room for `capacity` lines waiting; lines
    /// dropped are counted in `dropped`.
    pub fn start(
        out: Box<dyn Write + Send>,
        (format, capacity): (Format, usize),
        sample: Sample,
        dropped: Counter,
    ) -> std::io::Result<Sink> {
        let batch = Arc::new(Shared {
            batch: Mutex::new(Batch::default()),
            ready: Condvar::new(),
            ended: Condvar::new(),
            capacity: capacity.max(1),
        });
        let writer = batch.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                write_batches(out, &writer);
                let mut batch = writer.batch.locked();
                batch.ended = true;
                writer.ended.notify_all();
            })?;
        Ok(Sink {
            batch,
            format,
            sample,
            dropped,
        })
    }

    /// Logs `record` if sampling keeps it; never waits for the writer.
    pub fn log(&self, record: &Record<'_>) -> Logged {
        if !self.sample.keeps(record) {
            return Logged::Sampled;
        }
        SCRATCH.with(|scratch| {
            let mut line = scratch.borrow_mut();
            line.clear();
            match self.format {
                Format::Json => json(&mut line, record),
                Format::Combined => combined(&mut line, record),
            }
            line.push(b'\n');
            let logged = self.append(&line);
            if line.capacity() > 64 << 10 {
                // The scratch buffer stays, but not at a long line's size.
                line.clear();
                line.shrink_to(512);
            }
            logged
        })
    }

    /// Appends one formatted line to the batch, or drops and counts it.
    fn append(&self, line: &[u8]) -> Logged {
        {
            let mut batch = self.batch.batch.locked();
            // Closed: the writer ended (its sink failed); counted as dropped.
            if batch.lines >= self.batch.capacity
                || batch.bytes.len() + line.len() > MAX_BATCH_BYTES
                || batch.closed
            {
                drop(batch);
                self.dropped.inc();
                return Logged::Dropped;
            }
            let before = batch.bytes.len();
            batch.bytes.extend_from_slice(line);
            batch.lines += 1;
            // Half full, by lines or by bytes: the writer need not wait out its round.
            if batch.lines == self.batch.capacity.div_ceil(2)
                || (before < MAX_BATCH_BYTES / 2 && batch.bytes.len() >= MAX_BATCH_BYTES / 2)
            {
                self.batch.ready.notify_one();
            }
            Logged::Queued
        }
    }

    /// Closes the sink (later lines are dropped and counted) and waits, at most `within`,
    /// for the writer to write what is waiting: at shutdown, so that the last requests'
    /// lines are not lost with the process. True when everything was written.
    pub fn close(&self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        let mut batch = self.batch.batch.locked();
        batch.closed = true;
        self.batch.ready.notify_one();
        while !batch.ended {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            batch = self
                .batch
                .ended
                .wait_timeout(batch, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Lines dropped so far because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

/// The proxy's access log: its sink, and whether paths are logged with their query.
pub struct AccessLog {
    /// Where lines go.
    pub sink: Sink,
    /// `--access-log-query`.
    pub query: bool,
}

/// Opens the access log `settings` say (a file is created if missing and appended to),
/// its dropped lines counted in `metrics`.
pub fn open(
    settings: &crate::config::AccessLogSettings,
    metrics: &crate::metrics::Metrics,
) -> anyhow::Result<AccessLog> {
    use anyhow::Context as _;
    let out: Box<dyn Write + Send> = match &settings.to {
        crate::config::AccessLogTo::Stdout => Box::new(std::io::stdout()),
        crate::config::AccessLogTo::File(path) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening --access-log {}", path.display()))?,
        ),
    };
    let sink = Sink::start(
        out,
        (settings.format, settings.buffer),
        Sample::new(settings.sample),
        metrics.access_log_dropped.clone(),
    )
    .context("starting the access log's writer")?;
    Ok(AccessLog {
        sink,
        query: settings.query,
    })
}

/// The client's address for the log: the peer's, or, when the peer is a trusted balancer
/// (`trusted`), the last address of `X-Forwarded-For` that is not itself trusted (nginx's
/// `real_ip_recursive`). A value that is not an address ends the search at the peer
/// before it.
pub fn client_address(
    peer: IpAddr,
    forwarded_for: Option<&str>,
    trusted: impl Fn(IpAddr) -> bool,
) -> IpAddr {
    let mut client = peer;
    let Some(list) = forwarded_for else {
        return client;
    };
    for hop in list.rsplit(',') {
        if !trusted(client) {
            break;
        }
        match hop.trim().parse::<IpAddr>() {
            Ok(address) => client = address,
            Err(_) => break,
        }
    }
    client
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), if it is one
/// (and not the all-zero invalid id).
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.trim().split('-');
    let (version, id, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let ok = hex(version, 2)
        && version != "ff"
        && hex(id, 32)
        && id.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && hex(flags, 2);
    ok.then_some(id)
}

/// The path logged: normalised as routing reads it (as sent when it does not normalise),
/// with the query when the log keeps queries.
pub fn logged_path<'a>(
    path: &'a str,
    query: Option<&str>,
    keep_query: bool,
    escaped: holdfast_http::path::EscapedSlashes,
) -> Cow<'a, str> {
    let path = holdfast_http::path::normalise(path, escaped).unwrap_or(Cow::Borrowed(path));
    match query {
        Some(q) if keep_query => Cow::Owned(format!("{path}?{q}")),
        _ => path,
    }
}

impl Drop for Sink {
    /// The writer writes what is left, then ends.
    fn drop(&mut self) {
        let mut batch = self.batch.batch.locked();
        batch.closed = true;
        self.batch.ready.notify_one();
    }
}

/// The writer thread: every [`FLUSH_EVERY`] (or when the batch is half full, or the sink
/// closes), the whole batch in one write and a flush; until the sink closes or fails.
fn write_batches(mut out: Box<dyn Write + Send>, shared: &Shared) {
    let mut taken = Vec::new();
    let half = shared.capacity.div_ceil(2);
    loop {
        // Lines gather for a whole round: one write per round under load, not one per
        // wake-up.
        let round = std::time::Instant::now() + FLUSH_EVERY;
        let closed = {
            let mut batch = shared.batch.locked();
            while !batch.closed && batch.lines < half && batch.bytes.len() < MAX_BATCH_BYTES / 2 {
                let left = round.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                batch = shared
                    .ready
                    .wait_timeout(batch, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::swap(&mut taken, &mut batch.bytes);
            batch.lines = 0;
            batch.closed
        };
        if !taken.is_empty()
            && let Err(error) = out.write_all(&taken).and_then(|()| out.flush())
        {
            // The sink failed: every later line is dropped and counted.
            tracing::error!(%error, "the access log cannot be written: every later line is dropped (holdfast_proxy_access_log_dropped_total) until the proxy restarts");
            shared.batch.locked().closed = true;
            return;
        }
        taken.clear();
        // A burst of long lines leaves no buffer of its size behind.
        taken.shrink_to(1 << 20);
        if closed {
            return;
        }
    }
}

/// A JSON string (quoted and escaped): copied whole when nothing in it needs escaping
/// (the usual case), else by `serde_json`.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing a &str to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// `n` in decimal, without `core::fmt`.
fn integer(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `d` in milliseconds with three decimals (microseconds, rounded).
fn milliseconds(out: &mut Vec<u8>, d: Duration) {
    let micros = (d.as_nanos() + 500) / 1000;
    let micros = u64::try_from(micros).unwrap_or(u64::MAX);
    integer(out, micros / 1000);
    let rest = (micros % 1000) as u16;
    out.extend_from_slice(&[
        b'.',
        b'0' + (rest / 100) as u8,
        b'0' + (rest / 10 % 10) as u8,
        b'0' + (rest % 10) as u8,
    ]);
}

/// A client address: IPv4 written by hand, IPv6 through `Display`.
fn address(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                integer(out, u64::from(octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

fn json(out: &mut Vec<u8>, r: &Record<'_>) {
    out.extend_from_slice(b"{\"time\":\"");
    rfc3339(out, r.time);
    out.extend_from_slice(b"\",\"client\":\"");
    address(out, r.client);
    out.extend_from_slice(b"\",\"method\":");
    string(out, r.method);
    out.extend_from_slice(b",\"host\":");
    string(out, r.host);
    out.extend_from_slice(b",\"path\":");
    string(out, r.path);
    out.extend_from_slice(b",\"protocol\":");
    string(out, r.protocol);
    out.extend_from_slice(b",\"status\":");
    integer(out, u64::from(r.status));
    out.extend_from_slice(b",\"bytes_received\":");
    integer(out, r.bytes_received);
    out.extend_from_slice(b",\"bytes_sent\":");
    integer(out, r.bytes_sent);
    out.extend_from_slice(b",\"duration_ms\":");
    milliseconds(out, r.duration);
    if let Some(d) = r.upstream_duration {
        out.extend_from_slice(b",\"upstream_duration_ms\":");
        milliseconds(out, d);
    }
    let optional: [(&[u8], Option<&str>); 9] = [
        (b",\"tls_version\":", r.tls.map(|(v, _)| v)),
        (b",\"sni\":", r.tls.and_then(|(_, sni)| sni)),
        (b",\"upstream\":", r.upstream),
        (b",\"route\":", r.route),
        (b",\"reason\":", r.reason),
        (b",\"request_id\":", r.request_id),
        (b",\"trace_id\":", r.trace_id),
        (b",\"referer\":", r.referer),
        (b",\"user_agent\":", r.user_agent),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            out.extend_from_slice(name);
            string(out, value);
        }
    }
    out.push(b'}');
}

/// A value of the combined format in quotes: `"` and `\` and control bytes escaped as
/// nginx does (`\xHH`).
fn quoted(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for &b in s.as_bytes() {
        if b == b'"' || b == b'\\' || b < 0x20 || b == 0x7f {
            let _ = write!(out, "\\x{b:02X}");
        } else {
            out.push(b);
        }
    }
    out.push(b'"');
}

fn combined(out: &mut Vec<u8>, r: &Record<'_>) {
    let _ = write!(out, "{} - - [", r.client);
    time_local(out, r.time);
    out.extend_from_slice(b"] ");
    quoted(out, &format!("{} {} {}", r.method, r.path, r.protocol));
    let _ = write!(out, " {} {} ", r.status, r.bytes_sent);
    quoted(out, r.referer.unwrap_or("-"));
    out.push(b' ');
    quoted(out, r.user_agent.unwrap_or("-"));
}

/// Days since 1970-01-01 as (year, month 1-12, day 1-31), proleptic Gregorian (Howard
/// Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day, hours, minutes, seconds, milliseconds) of `t`, UTC.
fn parts(t: SystemTime) -> (i64, u32, u32, u64, u64, u64, u32) {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil((secs / 86_400) as i64);
    let rest = secs % 86_400;
    (
        year,
        month,
        day,
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis(),
    )
}

/// `2026-12-07T17:56:33.123Z`. The text up to the second is made once a second per
/// thread; the milliseconds are written by hand.
fn rfc3339(out: &mut Vec<u8>, t: SystemTime) {
    thread_local! {
        /// The second last written, and its text (`2026-12-07T17:56:33.`).
        static SECOND: std::cell::Cell<(u64, [u8; 20])> = const { std::cell::Cell::new((u64::MAX, [0; 20])) };
    }
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (second, ms) = (since.as_secs(), since.subsec_millis());
    let (cached, mut text) = SECOND.get();
    if cached != second {
        let (y, mo, d, h, mi, s, _) = parts(t);
        let mut w = &mut text[..];
        let _ = write!(w, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.");
        SECOND.set((second, text));
    }
    out.extend_from_slice(&text);
    out.extend_from_slice(&[
        b'0' + (ms / 100) as u8,
        b'0' + (ms / 10 % 10) as u8,
        b'0' + (ms % 10) as u8,
        b'Z',
    ]);
}

/// nginx's `$time_local` in UTC: `07/Dec/2026:17:56:33 +0000`.
fn time_local(out: &mut Vec<u8>, t: SystemTime) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, s, _) = parts(t);
    let month = MONTHS[(mo as usize - 1) % 12];
    let _ = write!(out, "{d:02}/{month}/{y:04}:{h:02}:{mi:02}:{s:02} +0000");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn the_client_is_the_peer_or_behind_trusted_balancers_the_first_untrusted_forwarded_address() {
        let lb: IpAddr = "10.0.0.1".parse().unwrap();
        let trusted = |ip: IpAddr| ip.to_string().starts_with("10.");
        let client = |peer: IpAddr, xff: Option<&str>| client_address(peer, xff, trusted);
        let stranger: IpAddr = "198.51.100.9".parse().unwrap();
        // An untrusted peer is the client, whatever it says.
        assert_eq!(client(stranger, Some("1.2.3.4")), stranger);
        assert_eq!(client(lb, None), lb);
        assert_eq!(client(lb, Some("203.0.113.5")).to_string(), "203.0.113.5");
        // Trusted hops are walked past, from the right.
        assert_eq!(
            client(lb, Some("203.0.113.5, 10.0.0.2")).to_string(),
            "203.0.113.5"
        );
        // The first untrusted address ends the walk: what is left of it is the client's word.
        assert_eq!(
            client(lb, Some("6.6.6.6, 203.0.113.5")).to_string(),
            "203.0.113.5"
        );
        // Garbage ends it at the last trusted hop.
        assert_eq!(
            client(lb, Some("nonsense, 10.0.0.2")).to_string(),
            "10.0.0.2"
        );
    }

    #[test]
    fn a_trace_id_is_read_only_from_a_valid_traceparent() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(trace_id(&format!("00-{id}-00f067aa0ba902b7-01")), Some(id));
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "",
        ] {
            assert_eq!(trace_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_logged_path_is_normalised_and_keeps_its_query_only_when_asked() {
        use holdfast_http::path::EscapedSlashes;
        let keep = EscapedSlashes::Keep;
        assert_eq!(logged_path("/a/../b/./c", Some("t=1"), false, keep), "/b/c");
        assert_eq!(logged_path("/a/../b", Some("t=1"), true, keep), "/b?t=1");
        assert_eq!(logged_path("/x", None, true, keep), "/x");
    }

    fn record() -> Record<'static> {
        Record {
            // 2026-12-07T17:56:33.250Z
            time: UNIX_EPOCH + Duration::from_millis(1_796_666_193_250),
            client: "10.0.0.7".parse().unwrap(),
            method: "GET",
            host: "a.test",
            path: "/p\"x",
            protocol: "HTTP/1.1",
            tls: Some(("TLSv1.3", Some("a.test"))),
            status: 200,
            bytes_received: 80,
            bytes_sent: 1234,
            duration: Duration::from_micros(2500),
            upstream_duration: Some(Duration::from_micros(1500)),
            upstream: Some("10.1.0.3:8080"),
            route: Some("ingress default/web a.test /"),
            reason: None,
            request_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            trace_id: None,
            referer: None,
            user_agent: Some("curl/8"),
        }
    }

    /// A writer that keeps what it is given, and can be made to block.
    #[derive(Clone, Default)]
    struct Kept {
        bytes: Arc<Mutex<Vec<u8>>>,
        gate: Arc<Mutex<()>>,
    }

    impl Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _open = self.gate.locked();
            self.bytes.locked().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Kept {
        fn text(&self) -> String {
            String::from_utf8(self.bytes.lock().unwrap().clone()).unwrap()
        }
    }

    fn wait_for(kept: &Kept, lines: usize) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = kept.text();
            if text.lines().count() >= lines {
                return text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{lines} lines never came: {text:?}"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_json_line_has_every_field_under_its_documented_name() {
        let kept = Kept::default();
        let sink = Sink::start(
            Box::new(kept.clone()),
            (Format::Json, 16),
            Sample::new(1.0),
            Counter::default(),
        )
        .unwrap();
        assert_eq!(sink.log(&record()), Logged::Queued);
        let line = wait_for(&kept, 1);
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        let want = serde_json::json!({
            "time": "2026-12-07T17:56:33.250Z", "client": "10.0.0.7", "method": "GET",
            "host": "a.test", "path": "/p\"x", "protocol": "HTTP/1.1", "status": 200,
            "bytes_received": 80, "bytes_sent": 1234, "duration_ms": 2.5,
            "upstream_duration_ms": 1.5, "tls_version": "TLSv1.3", "sni": "a.test",
            "upstream": "10.1.0.3:8080", "route": "ingress default/web a.test /",
            "request_id": "4bf92f3577b34da6a3ce929d0e0e4736", "user_agent": "curl/8"
        });
        assert_eq!(v, want);
    }

    #[test]
    fn numbers_durations_addresses_and_times_are_written_as_fmt_would() {
        let text = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut out = Vec::new();
            f(&mut out);
            String::from_utf8(out).unwrap()
        };
        for n in [0, 7, 10, 99_999, u64::MAX] {
            assert_eq!(text(&|o| integer(o, n)), n.to_string());
        }
        for (nanos, want) in [
            (0, "0.000"),
            (1_234_567, "1.235"),
            (2_500_000, "2.500"),
            (999_999_999_999, "1000000.000"),
        ] {
            assert_eq!(
                text(&|o| milliseconds(o, Duration::from_nanos(nanos))),
                want
            );
        }
        for ip in ["10.0.0.7", "255.255.255.0", "0.0.0.0", "2001:db8::7"] {
            assert_eq!(text(&|o| address(o, ip.parse().unwrap())), ip);
        }
        // The second's text is cached per thread: a new second, or an older one, is not
        // mistaken for it.
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(
            text(&|o| rfc3339(o, at(1_796_665_000_999))),
            "2026-12-07T17:36:40.999Z"
        );
        assert_eq!(
            text(&|o| rfc3339(o, at(1_796_665_001_000))),
            "2026-12-07T17:36:41.000Z"
        );
        assert_eq!(
            text(&|o| rfc3339(o, at(1_796_665_000_050))),
            "2026-12-07T17:36:40.050Z"
        );
        assert_eq!(text(&|o| rfc3339(o, at(0))), "1970-01-01T00:00:00.000Z");
        let mut escaped = Vec::new();
        string(&mut escaped, "a\"b\\c\u{1}é");
        assert_eq!(
            serde_json::from_slice::<String>(&escaped).unwrap(),
            "a\"b\\c\u{1}é"
        );
    }

    #[test]
    fn a_combined_line_is_nginx_s() {
        let kept = Kept::default();
        let sink = Sink::start(
            Box::new(kept.clone()),
            (Format::Combined, 16),
            Sample::new(1.0),
            Counter::default(),
        )
        .unwrap();
        sink.log(&record());
        assert_eq!(
            wait_for(&kept, 1),
            "10.0.0.7 - - [07/Dec/2026:17:56:33 +0000] \"GET /p\\x22x HTTP/1.1\" 200 1234 \"-\" \"curl/8\"\n"
        );
    }

    #[test]
    fn a_blocked_writer_drops_and_counts_lines_and_logging_never_waits() {
        let kept = Kept::default();
        let gate = kept.gate.lock().unwrap();
        let sink = Sink::start(
            Box::new(kept.clone()),
            (Format::Json, 4),
            Sample::new(1.0),
            Counter::default(),
        )
        .unwrap();
        let outcomes: Vec<Logged> = (0..20).map(|_| sink.log(&record())).collect();
        // The batch holds four lines and the writer is blocked: the rest are dropped, and
        // every call returned (none waited for the writer).
        // The writer may have taken the first lines (and be blocked writing them) before
        // the batch filled up again.
        let queued = outcomes.iter().filter(|o| **o == Logged::Queued).count();
        assert!((4..=8).contains(&queued), "{outcomes:?}");
        assert_eq!(sink.dropped(), 20 - queued as u64);
        drop(gate);
        // What was queued is written once the writer can go on.
        assert_eq!(wait_for(&kept, queued).lines().count(), queued);
    }

    #[test]
    fn closing_writes_what_waits_before_it_returns_and_gives_up_on_a_blocked_writer() {
        let kept = Kept::default();
        let sink = Sink::start(
            Box::new(kept.clone()),
            (Format::Json, 64),
            Sample::new(1.0),
            Counter::default(),
        )
        .unwrap();
        for _ in 0..3 {
            assert_eq!(sink.log(&record()), Logged::Queued);
        }
        // No waiting for the writer's next round: close returns once they are written.
        assert!(sink.close(Duration::from_secs(10)));
        assert_eq!(kept.text().lines().count(), 3);
        assert_eq!(sink.log(&record()), Logged::Dropped, "closed");

        let blocked = Kept::default();
        let gate = blocked.gate.lock().unwrap();
        let sink = Sink::start(
            Box::new(blocked.clone()),
            (Format::Json, 64),
            Sample::new(1.0),
            Counter::default(),
        )
        .unwrap();
        sink.log(&record());
        assert!(
            !sink.close(Duration::from_millis(200)),
            "the writer is blocked"
        );
        drop(gate);
    }

    #[test]
    fn sampling_keeps_its_ratio_evenly_and_every_error() {
        let sample = Sample::new(0.25);
        let ok = record();
        let kept: Vec<bool> = (0..8).map(|_| sample.keeps(&ok)).collect();
        assert_eq!(kept, [false, false, false, true, false, false, false, true]);
        let failed = Record {
            status: 502,
            ..record()
        };
        let local = Record {
            status: 200,
            reason: Some("redirect"),
            ..record()
        };
        assert!((0..10).all(|_| sample.keeps(&failed) && sample.keeps(&local)));
        let none = Sample::new(0.0);
        assert!(!none.keeps(&ok) && none.keeps(&failed));
        assert!(Sample::new(f64::NAN).keeps(&ok));
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(civil(-1), (1969, 12, 31));
        let mut out = Vec::new();
        rfc3339(&mut out, UNIX_EPOCH + Duration::from_secs(951_782_400));
        assert_eq!(out, b"2000-02-29T00:00:00.000Z");
    }
}
