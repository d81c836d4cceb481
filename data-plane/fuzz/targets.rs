//! The fuzz targets: what must hold for every input, as plain functions shared by the two
//! fuzzers (the proptest runner in `data-plane/tests/fuzz.rs` and the coverage-guided AFL++
//! harness in `data-plane/fuzz/afl`). Each returns why an input breaks its property; a
//! panic inside one is a failure too.

use std::path::Path;

use holdfast_data_plane::persist;
use holdfast_data_plane::table::RouteTable;
use holdfast_http::framing::Tracker;
use holdfast_http::h1::chunked::{ChunkError, Chunked, Piece};
use holdfast_http::h1::{BodyFraming, HeadEnd, Limits, RequestHead};
use holdfast_http::path::{EscapedSlashes, normalise};
use holdfast_proto::v1::{Backend, MatchKind, Route, Snapshot, VirtualHost};

macro_rules! ensure {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err(format!($($why)+));
        }
    };
}

/// The smuggling tracker never panics, and the same bytes split into reads anywhere get
/// the same verdict.
pub fn framing(bytes: &[u8]) -> Result<(), String> {
    let mut whole = Tracker::default();
    whole.feed(bytes);
    let verdict = whole.flagged().cloned();
    for step in [1usize, 3, 7, 64] {
        let mut t = Tracker::default();
        for chunk in bytes.chunks(step) {
            t.feed(chunk);
        }
        let split = t.flagged().cloned();
        ensure!(
            split == verdict,
            "reads of {step}: {split:?}, in one read: {verdict:?}"
        );
    }
    Ok(())
}

/// The native engine's HTTP/1.1 parse never panics; a head's end is found at the same
/// place in reads of any size; the parse refuses every head the smuggling tracker
/// refuses (it is never looser); a chunked body after an accepted head is followed the
/// same way in reads of any size.
pub fn h1(bytes: &[u8]) -> Result<(), String> {
    let whole = HeadEnd::default().find(bytes);
    for step in [1usize, 3, 7, 64] {
        let mut end = HeadEnd::default();
        let (mut found, mut have) = (None, 0);
        while found.is_none() && have < bytes.len() {
            have = (have + step).min(bytes.len());
            found = end.find(&bytes[..have]);
        }
        ensure!(
            found == whole,
            "reads of {step}: the head ends at {found:?}, in one read at {whole:?}"
        );
    }
    let Some(len) = whole else {
        return Ok(());
    };
    let limits = Limits {
        max_bytes: 64 * 1024,
        max_headers: 100,
    };
    let mut head = RequestHead::default();
    let parsed = head.parse(bytes, len, limits);
    let mut tracker = Tracker::default();
    tracker.feed(&bytes[..len]);
    if let Some((0, why)) = tracker.flagged() {
        ensure!(
            parsed.is_err(),
            "the tracker refuses the head ({why}), the parse accepts it"
        );
    }
    if parsed.is_ok() && head.framing() == BodyFraming::Chunked {
        let body = &bytes[len..];
        let whole = follow_chunked(body, body.len().max(1));
        for step in [1usize, 3, 7, 64] {
            let split = follow_chunked(body, step);
            ensure!(
                split == whole,
                "a chunked body in reads of {step}: {split:?}, in one read: {whole:?}"
            );
        }
    }
    Ok(())
}

/// Follows a chunked body in reads of `step`: its data bytes and where it ends, if it does.
fn follow_chunked(body: &[u8], step: usize) -> Result<(u64, Option<usize>), ChunkError> {
    let mut c = Chunked::default();
    let mut read_at = 0;
    for read in body.chunks(step) {
        let mut at = 0;
        while at < read.len() {
            match c.next(&read[at..])? {
                Piece::Framing(n) | Piece::Data(n) | Piece::Trailer(n) => at += n,
                Piece::End(n) => return Ok((c.data_len(), Some(read_at + at + n))),
            }
        }
        read_at += read.len();
    }
    Ok((c.data_len(), None))
}

/// The route table the `path` target matches against: exact, prefix and nested prefix
/// routes on one host.
pub fn sample_snapshot() -> Snapshot {
    let route = |kind: MatchKind, path: &str, backend: &str| Route {
        match_kind: kind as i32,
        path: path.into(),
        backend: backend.into(),
        source: None,
    };
    let mut s = Snapshot {
        virtual_hosts: vec![VirtualHost {
            host: "a.test".into(),
            routes: vec![
                route(MatchKind::Exact, "/exact", "auth"),
                route(MatchKind::Prefix, "/admin", "auth"),
                route(MatchKind::Prefix, "/api/v1", "app"),
                route(MatchKind::Prefix, "/", "app"),
            ],
            ..Default::default()
        }],
        backends: vec![
            Backend {
                name: "app".into(),
                endpoints: vec![holdfast_proto::v1::Endpoint {
                    address: "10.0.0.1".into(),
                    port: 8080,
                    zone: "a".into(),
                    ready: true,
                }],
                ..Default::default()
            },
            Backend {
                name: "auth".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    holdfast_proto::snapshot::seal(&mut s, 1);
    s
}

/// The table of [`sample_snapshot`].
pub fn sample_table() -> RouteTable {
    RouteTable::compile(&sample_snapshot()).expect("the fuzz table compiles")
}

/// The normaliser never panics; what it returns starts with `/`, has no empty, `.` or
/// `..` segment and no escaped unreserved character, is a fixed point, and is routed as
/// a plain reading of the Ingress rules says.
pub fn path(table: &RouteTable, bytes: &[u8]) -> Result<(), String> {
    let raw = String::from_utf8_lossy(bytes);
    for mode in [EscapedSlashes::Reject, EscapedSlashes::Keep] {
        let Ok(once) = normalise(&raw, mode) else {
            continue;
        };
        if once == "*" {
            continue; // OPTIONS * is left alone
        }
        ensure!(once.starts_with('/'), "{raw:?} -> {once:?}");
        let segments: Vec<&str> = once.split('/').skip(1).collect();
        // Every segment but the last (empty after a trailing slash) is a real name.
        for segment in segments.iter().rev().skip(1) {
            ensure!(
                !segment.is_empty() && *segment != "." && *segment != "..",
                "{raw:?} -> {once:?}"
            );
        }
        let twice = normalise(&once, mode).map(|p| p.into_owned());
        ensure!(
            twice.as_deref() == Ok(&*once),
            "not a fixed point: {raw:?} -> {once:?} -> {twice:?}"
        );
        // Unreserved characters are never left encoded (a backend would decode them).
        for (i, _) in once.match_indices('%') {
            let byte = once
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok());
            ensure!(
                byte.is_some_and(|b| !is_unreserved(b)),
                "{raw:?} -> {once:?}: escape at {i}"
            );
        }
        // The matcher against a reference reading of the Ingress rules of the sample
        // table: what a backend would see under /admin is routed to /admin.
        let routed = table.lookup("a.test", &once).map(|r| r.path.clone()).ok();
        let expected = expected_route(&once);
        ensure!(
            routed.as_deref() == Some(expected),
            "{raw:?} -> {once:?} routed to {routed:?}, not {expected:?}"
        );
    }
    Ok(())
}

/// RFC 3986 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~".
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The route of [`sample_snapshot`] a normalised `path` matches, read from the Ingress
/// rules directly: Exact `/exact`, else the longest Prefix (`/api/v1`, `/admin`, `/`)
/// equal to the path or followed in it by `/`.
fn expected_route(path: &str) -> &'static str {
    if path == "/exact" {
        return "/exact";
    }
    ["/api/v1", "/admin"]
        .into_iter()
        .find(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
        .unwrap_or("/")
}

/// Decoding, validating and compiling any bytes as a snapshot never panics.
pub fn snapshot(bytes: &[u8]) -> Result<(), String> {
    if let Ok(s) = <Snapshot as prost::Message>::decode(bytes)
        && holdfast_proto::snapshot::validate(&s).is_ok()
    {
        let _ = RouteTable::compile(&s);
    }
    Ok(())
}

/// The state-file loader never panics, and a valid file's only accepted form is itself
/// (`valid`: the valid files of the corpus): any change is refused.
pub fn state_file(valid: &[Vec<u8>], bytes: &[u8]) -> Result<(), String> {
    if persist::decode(Path::new("fuzz"), bytes).is_ok() {
        ensure!(
            valid.iter().any(|v| v == bytes),
            "a changed state file was accepted"
        );
    }
    Ok(())
}

/// The seed files of `target`'s corpus under `corpus` (sorted by name).
pub fn seeds(corpus: &Path, target: &str) -> Vec<Vec<u8>> {
    let dir = corpus.join(target);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).expect("seed"))
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// Both HTTP/1.1 engines, each serving in-memory client connections with the same route
/// table, and the upstream they forward to (on 127.0.0.1), on one current-thread runtime:
/// the `differential` target's world, made once per fuzzing process.
pub struct Engines {
    rt: tokio::runtime::Runtime,
    native: std::sync::Arc<holdfast_data_plane::proxy::Forwarder>,
    hyper: std::sync::Arc<holdfast_data_plane::proxy::Forwarder>,
    settings: holdfast_data_plane::server::ListenSettings,
    forwarded: std::sync::Arc<std::sync::Mutex<Vec<Forwarded>>>,
}

/// A request as the upstream received it: what the two engines must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// Method and target.
    pub line: String,
    /// Header lines, names lower case, sorted, framing and Date left out (each engine
    /// frames a body its own way).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body's data.
    pub body: Vec<u8>,
    /// The body came chunked.
    pub chunked: bool,
}

impl Engines {
    /// The world: a table routing `a` and `a.test` to the upstream, both engines'
    /// forwarders.
    pub fn new() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let forwarded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let upstream = rt.block_on(recording_upstream(forwarded.clone()));
        let snapshot = Snapshot {
            backends: vec![Backend {
                name: "ns/app:80".into(),
                endpoints: vec![holdfast_proto::v1::Endpoint {
                    address: upstream.ip().to_string(),
                    port: u32::from(upstream.port()),
                    zone: String::new(),
                    ready: true,
                }],
                ..Default::default()
            }],
            // `a` is the seeds' host; `/x` is not routed (404).
            virtual_hosts: ["a", "a.test"]
                .iter()
                .map(|host| VirtualHost {
                    host: (*host).into(),
                    routes: vec![
                        Route {
                            match_kind: MatchKind::Exact as i32,
                            path: "/".into(),
                            backend: "ns/app:80".into(),
                            source: None,
                        },
                        Route {
                            match_kind: MatchKind::Prefix as i32,
                            path: "/y".into(),
                            backend: "ns/app:80".into(),
                            source: None,
                        },
                    ],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let token = holdfast_data_plane::proxy::new_loop_token();
        let forwarder = || {
            let table = RouteTable::compile(&snapshot).expect("the table compiles");
            let mut registry = prometheus_client::registry::Registry::default();
            std::sync::Arc::new(holdfast_data_plane::proxy::Forwarder::new(
                std::sync::Arc::new(arc_swap::ArcSwapOption::from_pointee(table)),
                holdfast_data_plane::proxy::ForwardSettings {
                    connect_timeout: std::time::Duration::from_secs(2),
                    response_timeout: std::time::Duration::from_secs(2),
                    eject_for: std::time::Duration::from_millis(1),
                    pool_idle_per_host: 8,
                    workers: 1,
                    escaped_slashes: EscapedSlashes::Reject,
                    verbose_errors: false,
                    max_request_body: 1 << 20,
                    body_read_timeout: std::time::Duration::from_secs(2),
                    tunnel_idle_timeout: std::time::Duration::from_secs(2),
                    max_connections_per_endpoint: 0,
                    allow_upgrade: vec![],
                    trust_forwarded_from: vec![],
                    allow_dot_segment_params: false,
                    retry_budget: 0.2,
                    mirror_timeout: std::time::Duration::from_secs(5),
                    max_mirrors_in_flight: 1024,
                    loop_token: token.clone(),
                },
                holdfast_data_plane::metrics::Metrics::new(&mut registry),
            ))
        };
        let settings = holdfast_data_plane::server::ListenSettings {
            header_read_timeout: std::time::Duration::from_secs(2),
            idle_timeout: std::time::Duration::from_secs(2),
            max_headers: 100,
            max_header_bytes: 16 * 1024,
            shutdown_grace: std::time::Duration::from_secs(1),
            send_timeout: std::time::Duration::from_secs(2),
            max_connections: 16,
            h2_max_concurrent_streams: 16,
            native_h1: true,
        };
        Engines {
            rt,
            native: forwarder(),
            hyper: forwarder(),
            settings,
            forwarded,
        }
    }

    /// `bytes` sent on one connection to one engine, then its end: the statuses answered,
    /// in order, and the requests the upstream got.
    fn run(&self, bytes: &[u8], native: bool) -> Result<(Vec<u16>, Vec<Forwarded>), String> {
        self.forwarded.lock().expect("not poisoned").clear();
        let mut settings = self.settings.clone();
        settings.native_h1 = native;
        let forwarder = if native { &self.native } else { &self.hyper };
        let out = self.rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut client, server) = tokio::io::duplex(1 << 16);
            let peer: std::net::SocketAddr = ([10, 0, 0, 7], 40000).into();
            let serving = tokio::spawn({
                let forwarder = forwarder.clone();
                async move {
                    holdfast_data_plane::server::serve_connection(
                        server, peer, 80, forwarder, &settings,
                    )
                    .await
                }
            });
            let _ = client.write_all(bytes).await;
            let _ = client.shutdown().await;
            let mut out = Vec::new();
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                client.read_to_end(&mut out),
            )
            .await;
            drop(client);
            let _ = serving.await;
            out
        });
        let statuses = statuses(&out);
        let ok = statuses.iter().filter(|s| **s == 200).count();
        // Requests are compared as far as their answers reached the client: one sent
        // upstream whose answer never came back is not seen here.
        let mut forwarded = self.forwarded.lock().expect("not poisoned").clone();
        forwarded.truncate(ok);
        Ok((statuses, forwarded))
    }
}

impl Default for Engines {
    fn default() -> Self {
        Self::new()
    }
}

/// The statuses of the responses in `out`, in order, up to the first that cannot be
/// read.
fn statuses(out: &[u8]) -> Vec<u16> {
    let mut at = 0;
    let mut found = Vec::new();
    while at < out.len() {
        let Some(len) = HeadEnd::default().find(&out[at..]) else {
            break;
        };
        let mut r = holdfast_http::h1::ResponseHead::default();
        if r.parse(&out[at..], len, false).is_err() {
            break;
        }
        at += len;
        match r.framing() {
            BodyFraming::Length(n) => at += n as usize,
            BodyFraming::Chunked => {
                let Ok((_, Some(end))) = follow_chunked(&out[at..], out.len().max(1)) else {
                    break;
                };
                at += end;
            }
            BodyFraming::UntilClose => at = out.len(),
            BodyFraming::Empty => {}
        }
        if r.status >= 200 || r.status == 101 {
            found.push(r.status);
        }
    }
    found
}

/// An upstream on 127.0.0.1 that records each request it gets and answers it 200.
async fn recording_upstream(
    forwarded: std::sync::Arc<std::sync::Mutex<Vec<Forwarded>>>,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let forwarded = forwarded.clone();
            tokio::spawn(async move {
                let mut have = Vec::new();
                let mut buf = vec![0u8; 16384];
                loop {
                    while let Some((request, used)) = one_request(&have) {
                        have.drain(..used);
                        forwarded.lock().expect("not poisoned").push(request);
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    addr
}

/// The first whole request in `have` and its length.
fn one_request(have: &[u8]) -> Option<(Forwarded, usize)> {
    let len = HeadEnd::default().find(have)?;
    let mut head = RequestHead::default();
    let limits = Limits {
        max_bytes: 1 << 20,
        max_headers: 1000,
    };
    // What the engines send is well-formed: a head that is not would fail the target.
    let parsed = head.parse(have, len, limits);
    let line = format!(
        "{} {}",
        String::from_utf8_lossy(head.method.of(have)),
        String::from_utf8_lossy(head.target.of(have))
    );
    if let Err(e) = parsed {
        let line = format!("unparsable head ({e}): {line}");
        return Some((
            Forwarded {
                line,
                headers: vec![],
                body: have[..len].to_vec(),
                chunked: false,
            },
            have.len(),
        ));
    }
    let mut headers: Vec<(String, Vec<u8>)> = head
        .headers
        .iter()
        .map(|h| {
            (
                String::from_utf8_lossy(h.name.of(have)).to_ascii_lowercase(),
                h.value.of(have).to_vec(),
            )
        })
        .filter(|(n, _)| !matches!(n.as_str(), "content-length" | "transfer-encoding" | "date"))
        // Each engine makes its own random request id: compared by its shape.
        .map(|(n, v)| {
            let made = n == "x-request-id"
                && v.len() == 32
                && v.iter().all(|b| b"0123456789abcdef".contains(b));
            (n, if made { b"<made>".to_vec() } else { v })
        })
        .collect();
    headers.sort();
    let (body, used) = match head.framing() {
        BodyFraming::Length(n) => {
            let end = len.checked_add(n as usize)?;
            (have.get(len..end)?.to_vec(), end)
        }
        BodyFraming::Chunked => {
            let mut c = Chunked::default();
            let mut data = Vec::new();
            let mut at = len;
            loop {
                if at >= have.len() {
                    return None;
                }
                match c.next(&have[at..]).ok()? {
                    Piece::Data(n) => {
                        data.extend_from_slice(&have[at..at + n]);
                        at += n;
                    }
                    Piece::Framing(n) | Piece::Trailer(n) => at += n,
                    Piece::End(n) => break (data, at + n),
                }
            }
        }
        _ => (Vec::new(), len),
    };
    Some((
        Forwarded {
            line,
            headers,
            body,
            chunked: head.framing() == BodyFraming::Chunked,
        },
        used,
    ))
}

/// The same bytes through both engines give the same answers and forward the same
/// requests, or the native engine is the stricter and its parse says why. Precisely: up
/// to the end of the last request the native parse reads whole (head and body), both
/// engines answer the same statuses and forward the same requests (the input cut there,
/// so that what hyper does with a broken request after it, such as dropping answers in
/// flight, does not count); on the whole input, the native engine forwards nothing more
/// and does not serve the request after those, which its parse refuses (an error in its
/// head or chunked body, or a head or body that never ended; the failure message says
/// which). Requests are compared as far as their answers reached the client.
pub fn differential(engines: &Engines, bytes: &[u8]) -> Result<(), String> {
    let ends = request_ends(bytes);
    let cut = ends.last().copied().unwrap_or(0);
    let (ours, ours_sent) = engines.run(&bytes[..cut], true)?;
    let (theirs, theirs_sent) = engines.run(&bytes[..cut], false)?;
    ensure!(
        ours_sent == theirs_sent,
        "whole requests forwarded differently: native {ours_sent:?}, hyper {theirs_sent:?}"
    );
    ensure!(
        ours == theirs,
        "whole requests answered differently: native {ours:?}, hyper {theirs:?}"
    );
    if cut < bytes.len() {
        let (all, all_sent) = engines.run(bytes, true)?;
        ensure!(
            all_sent == ours_sent && all.get(..ours.len()) == Some(&ours[..]),
            "the native engine forwards or answers more than the whole requests: {all:?} {all_sent:?}, against {ours:?} {ours_sent:?}"
        );
        // The request after the whole ones is one the native parse refuses or that never
        // ended (that is how the whole ones are found): it must not be served.
        let why = stricter(bytes, ends.len());
        ensure!(
            why.is_some(),
            "after {} whole requests the native parse gives no reason to stop",
            ends.len()
        );
        ensure!(
            all.get(ours.len()) != Some(&200),
            "after {} whole requests the native engine serves the next one ({why:?})",
            ends.len()
        );
    }
    Ok(())
}

/// Where each whole request of `bytes` ends, as the native engine reads them.
fn request_ends(bytes: &[u8]) -> Vec<usize> {
    let limits = Limits {
        max_bytes: 16 * 1024,
        max_headers: 100,
    };
    let mut ends = Vec::new();
    let mut at = 0;
    loop {
        while bytes.get(at..at + 2) == Some(b"\r\n") {
            at += 2;
        }
        let Some(len) = bytes.get(at..).and_then(|b| HeadEnd::default().find(b)) else {
            return ends;
        };
        let mut head = RequestHead::default();
        if head.parse(&bytes[at..], len, limits).is_err() {
            return ends;
        }
        at += len;
        match head.framing() {
            BodyFraming::Length(n) => match at.checked_add(n as usize) {
                Some(end) if end <= bytes.len() => at = end,
                _ => return ends,
            },
            BodyFraming::Chunked => match follow_chunked(&bytes[at..], bytes.len().max(1)) {
                Ok((_, Some(end))) => at += end,
                _ => return ends,
            },
            _ => {}
        }
        ends.push(at);
    }
}

/// Why the native parse refuses request `index` of `bytes` (heads and bodies followed
/// as the native engine follows them), if it does: its head's or its chunked body's
/// error, or that its head or body never ended before the input did.
fn stricter(bytes: &[u8], index: usize) -> Option<String> {
    let limits = Limits {
        max_bytes: 16 * 1024,
        max_headers: 100,
    };
    let mut at = 0;
    for i in 0..=index {
        while bytes.get(at..at + 2) == Some(b"\r\n") {
            at += 2;
        }
        let Some(len) = HeadEnd::default().find(bytes.get(at..)?) else {
            return (i == index).then(|| "the head never ended".to_owned());
        };
        let mut head = RequestHead::default();
        if let Err(e) = head.parse(&bytes[at..], len, limits) {
            return (i == index).then(|| e.to_string());
        }
        at += len;
        let cut = |why: String| (i == index).then_some(why);
        match head.framing() {
            BodyFraming::Length(n) => match at.checked_add(n as usize) {
                Some(end) if end <= bytes.len() => at = end,
                _ => return cut("the body never ended".to_owned()),
            },
            BodyFraming::Chunked => match follow_chunked(&bytes[at..], bytes.len().max(1)) {
                Ok((_, Some(end))) => at += end,
                Ok((_, None)) => return cut("the body never ended".to_owned()),
                Err(e) => return cut(format!("chunked body: {e}")),
            },
            _ => {}
        }
    }
    None
}
