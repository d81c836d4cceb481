//! Fuzzing of the parsers that take bytes from the network or the disk, with proptest on
//! stable Rust. The properties live in `data-plane/fuzz/targets.rs`, shared with the
//! coverage-guided AFL++ harness (`data-plane/fuzz/afl`, run by `data-plane/fuzz/afl.sh`).
//! Each target replays its committed seed corpus (`data-plane/fuzz/corpus/<target>/`), then
//! runs inputs made by mutating the seeds (byte flips, insertions, deletions, splices,
//! truncations) and fully random bytes, for `HOLDFAST_FUZZ_SECONDS` per target (default
//! 2). A failure is shrunk and printed by proptest.
//!
//! Targets and what must hold for every input:
//! - `framing`: the smuggling tracker never panics, and splitting the same bytes into
//!   reads anywhere gives the same verdict;
//! - `h1`: the native engine's HTTP/1.1 parse never panics, finds a head's end at the
//!   same place in reads of any size, refuses every head the framing tracker refuses, and
//!   follows a chunked body the same way in reads of any size;
//! - `differential`: the same bytes on one connection to each HTTP/1.1 engine get the
//!   same answers and forward the same requests, up to where the native engine refuses a
//!   request hyper serves (never the other way round), its parse saying why;
//! - `path`: the normaliser never panics; what it returns starts with `/`, has no empty,
//!   `.` or `..` segment, is a fixed point, and routes the same as itself;
//! - `snapshot`: decoding, validating and compiling any bytes as a snapshot never panics;
//! - `state_file`: the state-file loader never panics, and refuses any change to a valid
//!   file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use holdfast_data_plane::persist;
use holdfast_proto::v1::Snapshot;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

#[path = "../fuzz/targets.rs"]
mod targets;

fn corpus_dir(target: &str) -> PathBuf {
    corpus().join(target)
}

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus")
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    targets::seeds(&corpus(), target)
}

fn budget() -> Duration {
    let secs = std::env::var("HOLDFAST_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(2);
    Duration::from_secs(secs)
}

/// One mutation of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    Splice(usize, usize, usize),
}

fn apply(seed: &[u8], edits: &[Edit], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for e in edits {
        let n = v.len().max(1);
        match e {
            Edit::Flip(i, b) => {
                if !v.is_empty() {
                    v[i % n] ^= b | 1;
                }
            }
            Edit::Insert(i, bytes) => {
                let at = i % (v.len() + 1);
                v.splice(at..at, bytes.iter().copied());
            }
            Edit::Delete(i, len) => {
                if !v.is_empty() {
                    let at = i % v.len();
                    let end = (at + len % 64).min(v.len());
                    v.drain(at..end);
                }
            }
            Edit::Truncate(i) => v.truncate(i % n),
            Edit::Splice(i, j, len) => {
                if !other.is_empty() {
                    let from = j % other.len();
                    let end = (from + len % 256).min(other.len());
                    let at = i % (v.len() + 1);
                    v.splice(at..at, other[from..end].iter().copied());
                }
            }
        }
    }
    v
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(i, n)| Edit::Delete(i, n)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(i, j, n)| Edit::Splice(i, j, n)),
    ]
}

/// Mutated seeds (most inputs) and random bytes.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    let mutated = (0..n, 0..n, prop::collection::vec(edit(), 0..8))
        .prop_map(move |(s, o, edits)| apply(&seeds[s], &edits, &seeds[o]));
    prop_oneof![
        9 => mutated,
        1 => prop::collection::vec(any::<u8>(), 0..512),
    ]
}

/// Runs `check` on every seed, then on generated inputs until the time budget is spent.
fn fuzz(target: &str, check: impl Fn(&[u8]) -> Result<(), String>) {
    let seeds = seeds(target);
    for (i, seed) in seeds.iter().enumerate() {
        if let Err(e) = check(seed) {
            panic!("{target}: seed {i} fails: {e}");
        }
    }
    let strategy = inputs(seeds);
    let started = Instant::now();
    let mut runs = 0u64;
    while started.elapsed() < budget() {
        let mut runner = TestRunner::new(Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        });
        if let Err(e) = runner.run(&strategy, |input| {
            check(&input).map_err(TestCaseError::fail)
        }) {
            panic!("{target}: {e}");
        }
        runs += 256;
    }
    eprintln!(
        "fuzz {target}: {runs} inputs in {:?}, no failure",
        started.elapsed()
    );
}

#[test]
fn fuzz_framing() {
    fuzz("framing", targets::framing);
}

#[test]
fn fuzz_h1() {
    fuzz("h1", targets::h1);
}

#[test]
fn fuzz_differential() {
    let engines = targets::Engines::new();
    fuzz("differential", |bytes| {
        targets::differential(&engines, bytes)
    });
}

#[test]
fn fuzz_path() {
    let table = targets::sample_table();
    fuzz("path", |bytes| targets::path(&table, bytes));
}

#[test]
fn fuzz_snapshot() {
    fuzz("snapshot", targets::snapshot);
}

#[test]
fn fuzz_state_file() {
    let valid = seeds("state_file");
    // The seeds must be valid files, or the property is empty: a new file format or
    // content-hash rule needs them written again (`cargo test -p holdfast-data-plane
    // --test fuzz -- --ignored write_seed_corpora`).
    for v in &valid {
        if let Err(e) = persist::decode(Path::new("seed"), v) {
            panic!("a state_file seed is no longer a valid file ({e}); write the seeds again");
        }
    }
    fuzz("state_file", |bytes| targets::state_file(&valid, bytes));
}

/// Writes the seed corpora (run once with `--ignored`; the files are committed).
#[test]
#[ignore]
fn write_seed_corpora() {
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        std::fs::write(dir.join(name), bytes).expect("seed");
    };
    let heads: [(&str, &[u8]); 8] = [
        ("get", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        (
            "post-length",
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        (
            "post-chunked",
            b"POST /y HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        ),
        (
            "smuggle",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        (
            "duplicate-length",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
        ),
        (
            "upgrade",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        ),
        ("bare-lf", b"GET / HTTP/1.1\nHost: a\n\n"),
        (
            "h2",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x08\x06\x00\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x00\x00\x03\x01\x00\x00\x00\x00\x01abc\x00\x00\x01\x09\x04\x00\x00\x00\x01d",
        ),
    ];
    for (name, bytes) in heads {
        write("framing", name, bytes);
        write("h1", name, bytes);
        write("differential", name, bytes);
    }
    let paths = [
        "/",
        "/admin",
        "//admin",
        "/./admin",
        "/%61dmin",
        "/x/../admin",
        "/public/..%2fadmin",
        "/a%5cb",
        "/a%00",
        "/../admin",
        "/a%zz",
        "/api/v1/users?x=1",
        "/exact/",
        "*",
        "/%2e%2e/%2E%2e/x",
        "/a/b/c/./../../d//e",
    ];
    for (i, p) in paths.iter().enumerate() {
        write("path", &format!("{i:02}"), p.as_bytes());
    }
    let sample = targets::sample_snapshot();
    write(
        "snapshot",
        "sample",
        &prost::Message::encode_to_vec(&sample),
    );
    let mut empty = Snapshot::default();
    holdfast_proto::snapshot::seal(&mut empty, 1);
    write("snapshot", "empty", &prost::Message::encode_to_vec(&empty));
    write("state_file", "sample", &persist::encode(&sample));
}
