//! The access log's sink: one line per request, formatted on the serving thread and
//! written by a thread of its own, so that logging never slows or blocks serving.
//!
//! Lines go through a bounded queue ([`Sink::start`]'s `capacity` lines). When the writer
//! falls behind (a slow disk, a blocked pipe) and the queue is full, a line is dropped and
//! counted ([`Sink::dropped`]), and the request that made it goes on: [`Sink::log`] never
//! waits. The writer drains everything queued before it flushes, so a busy log is written
//! in large writes and an idle one is flushed at once.
//!
//! Two formats: JSON, one object per line with the field names of [`Record`] (stable:
//! the README lists them), and nginx's `combined`, for pipelines that parse it.
//! [`Sample`] keeps a ratio of the requests, and every error (a status of 400 or more,
//! or a local answer with a reason).

use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// The writer end: a bounded queue of lines and the thread that writes them.
pub struct Sink {
    lines: SyncSender<Vec<u8>>,
    format: Format,
    sample: Sample,
    dropped: Arc<AtomicU64>,
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
    /// Starts the writer thread on `out`, with room for `capacity` lines waiting.
    pub fn start(
        out: Box<dyn Write + Send>,
        format: Format,
        capacity: usize,
        sample: Sample,
    ) -> std::io::Result<Sink> {
        let (lines, queue) = sync_channel(capacity.max(1));
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(out, queue))?;
        Ok(Sink {
            lines,
            format,
            sample,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Logs `record` if sampling keeps it; never waits.
    pub fn log(&self, record: &Record<'_>) -> Logged {
        if !self.sample.keeps(record) {
            return Logged::Sampled;
        }
        let mut line = Vec::with_capacity(256);
        match self.format {
            Format::Json => json(&mut line, record),
            Format::Combined => combined(&mut line, record),
        }
        line.push(b'\n');
        match self.lines.try_send(line) {
            Ok(()) => Logged::Queued,
            // Disconnected: the writer thread ended (its sink failed); counted as dropped.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Logged::Dropped
            }
        }
    }

    /// Lines dropped so far because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The writer thread: everything queued, then a flush; until every sender is gone or the
/// sink fails.
fn write_lines(mut out: Box<dyn Write + Send>, queue: Receiver<Vec<u8>>) {
    while let Ok(first) = queue.recv() {
        if out.write_all(&first).is_err() {
            return;
        }
        while let Ok(more) = queue.try_recv() {
            if out.write_all(&more).is_err() {
                return;
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
}

/// A JSON string (quoted and escaped).
fn string(out: &mut Vec<u8>, s: &str) {
    // Writing a &str to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn json(out: &mut Vec<u8>, r: &Record<'_>) {
    out.extend_from_slice(b"{\"time\":\"");
    rfc3339(out, r.time);
    out.extend_from_slice(b"\",\"client\":\"");
    let _ = write!(out, "{}", r.client);
    out.extend_from_slice(b"\",\"method\":");
    string(out, r.method);
    out.extend_from_slice(b",\"host\":");
    string(out, r.host);
    out.extend_from_slice(b",\"path\":");
    string(out, r.path);
    out.extend_from_slice(b",\"protocol\":");
    string(out, r.protocol);
    let _ = write!(
        out,
        ",\"status\":{},\"bytes_received\":{},\"bytes_sent\":{},\"duration_ms\":{:.3}",
        r.status,
        r.bytes_received,
        r.bytes_sent,
        r.duration.as_secs_f64() * 1000.0
    );
    if let Some(d) = r.upstream_duration {
        let _ = write!(
            out,
            ",\"upstream_duration_ms\":{:.3}",
            d.as_secs_f64() * 1000.0
        );
    }
    let optional = [
        ("tls_version", r.tls.map(|(v, _)| v)),
        ("sni", r.tls.and_then(|(_, sni)| sni)),
        ("upstream", r.upstream),
        ("route", r.route),
        ("reason", r.reason),
        ("request_id", r.request_id),
        ("trace_id", r.trace_id),
        ("referer", r.referer),
        ("user_agent", r.user_agent),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            let _ = write!(out, ",\"{name}\":");
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

/// `2026-12-07T17:56:33.123Z`.
fn rfc3339(out: &mut Vec<u8>, t: SystemTime) {
    let (y, mo, d, h, mi, s, ms) = parts(t);
    let _ = write!(out, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z");
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
    use std::sync::Mutex;

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
            let _open = self.gate.lock().unwrap_or_else(|e| e.into_inner());
            self.bytes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
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
        let sink = Sink::start(Box::new(kept.clone()), Format::Json, 16, Sample::new(1.0)).unwrap();
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
    fn a_combined_line_is_nginx_s() {
        let kept = Kept::default();
        let sink = Sink::start(
            Box::new(kept.clone()),
            Format::Combined,
            16,
            Sample::new(1.0),
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
        let sink = Sink::start(Box::new(kept.clone()), Format::Json, 4, Sample::new(1.0)).unwrap();
        let outcomes: Vec<Logged> = (0..20).map(|_| sink.log(&record())).collect();
        // The writer holds at most one line (blocked in its write) and the queue four:
        // the rest are dropped, and every call returned (none waited for the writer).
        let queued = outcomes.iter().filter(|o| **o == Logged::Queued).count();
        assert!((4..=5).contains(&queued), "{outcomes:?}");
        assert_eq!(sink.dropped(), 20 - queued as u64);
        drop(gate);
        // What was queued is written once the writer can go on.
        assert_eq!(wait_for(&kept, queued).lines().count(), queued);
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
