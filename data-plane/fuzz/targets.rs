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
