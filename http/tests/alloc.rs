//! The parse allocates nothing once a connection's head has grown to its largest: a
//! counting allocator counts every allocation of this test binary, which runs this one
//! test alone (no other thread allocates meanwhile).

use holdfast_http::h1::chunked::{Chunked, Piece};
use holdfast_http::h1::onward::{Onward, write_upstream_head};
use holdfast_http::h1::{HeadEnd, Limits, RequestHead, ResponseHead};
use holdfast_http::headers::Hop;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const REQUEST: &[u8] = b"POST /api/v1/items?page=2 HTTP/1.1\r\nHost: a.test\r\nUser-Agent: bench\r\nAccept: */*\r\nX-Forwarded-For: 10.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\nx-t: 1\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nDate: Sun, 06 Dec 2026 12:00:00 GMT\r\n\r\nok";

/// One keep-alive exchange's parsing and writing: the request head found and parsed, the
/// upstream head written, the chunked body followed, the response head found and parsed.
fn exchange(request: &mut RequestHead, response: &mut ResponseHead, out: &mut Vec<u8>) -> u64 {
    let limits = Limits {
        max_bytes: 64 * 1024,
        max_headers: 100,
    };
    let mut end = HeadEnd::default();
    let len = end.find(REQUEST).expect("a whole head");
    request.parse(REQUEST, len, limits).expect("a valid head");
    // Each request gets an id of its own.
    let id = holdfast_http::headers::RequestId::choose(None, false);
    let onward = Onward {
        target: request.target.of(REQUEST),
        hop: Hop {
            client: std::net::Ipv4Addr::new(10, 1, 2, 3).into(),
            port: 80,
            proto: "http",
            host: "a.test",
            trusted: false,
        },
        keep_upgrade: false,
        loop_header: ("x-holdfast-loop", b"token"),
        changes: None,
        upstream_host: None,
        request_id: id.as_bytes(),
        traceparent: None,
        drop_tracestate: false,
    };
    write_upstream_head(out, request, REQUEST, &onward);
    assert!(out.ends_with(b"\r\n\r\n"));
    let mut body = Chunked::default();
    let mut at = len;
    while !body.is_done() {
        match body.next(&REQUEST[at..]).expect("a valid body") {
            Piece::Framing(n) | Piece::Data(n) | Piece::Trailer(n) | Piece::End(n) => at += n,
        }
    }
    let len = HeadEnd::default().find(RESPONSE).expect("a whole head");
    response
        .parse(RESPONSE, len, false)
        .expect("a valid response");
    body.data_len()
}

fn parsing_a_keep_alive_exchange_allocates_nothing_once_warm() {
    let (mut request, mut response) = (RequestHead::default(), ResponseHead::default());
    let mut out = Vec::new();
    // The first exchange grows the header lists and the write buffer.
    assert_eq!(exchange(&mut request, &mut response, &mut out), 5);
    let region = Region::new(GLOBAL);
    let mut data = 0;
    for _ in 0..1000 {
        data += exchange(&mut request, &mut response, &mut out);
    }
    let stats = region.change();
    assert_eq!(data, 5000, "every exchange was parsed whole");
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "allocations in 1000 warm exchanges"
    );
}

/// No harness (see Cargo.toml): the test alone, on the main thread.
fn main() {
    parsing_a_keep_alive_exchange_allocates_nothing_once_warm();
    println!("test parsing_a_keep_alive_exchange_allocates_nothing_once_warm ... ok");
}
