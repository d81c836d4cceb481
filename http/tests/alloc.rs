//! The parse allocates nothing once a connection's head has grown to its largest: a
//! counting allocator counts every allocation of this test binary, which runs this one
//! test alone (no other thread allocates meanwhile).

use holdfast_http::h1::chunked::{Chunked, Piece};
use holdfast_http::h1::{HeadEnd, Limits, RequestHead, ResponseHead};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const REQUEST: &[u8] = b"POST /api/v1/items?page=2 HTTP/1.1\r\nHost: a.test\r\nUser-Agent: bench\r\nAccept: */*\r\nX-Forwarded-For: 10.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\nx-t: 1\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nDate: Sun, 06 Dec 2026 12:00:00 GMT\r\n\r\nok";

/// One keep-alive exchange's parsing: the request head found and parsed, its chunked
/// body followed, the response head found and parsed.
fn exchange(request: &mut RequestHead, response: &mut ResponseHead) -> u64 {
    let limits = Limits {
        max_bytes: 64 * 1024,
        max_headers: 100,
    };
    let mut end = HeadEnd::default();
    let len = end.find(REQUEST).expect("a whole head");
    request.parse(REQUEST, len, limits).expect("a valid head");
    let mut body = Chunked::default();
    let mut at = len;
    while !body.is_done() {
        match body.next(&REQUEST[at..]).expect("a valid body") {
            Piece::Framing(n) | Piece::Data(n) | Piece::End(n) => at += n,
        }
    }
    let len = HeadEnd::default().find(RESPONSE).expect("a whole head");
    response
        .parse(RESPONSE, len, false)
        .expect("a valid response");
    body.data_len()
}

#[test]
fn parsing_a_keep_alive_exchange_allocates_nothing_once_warm() {
    let (mut request, mut response) = (RequestHead::default(), ResponseHead::default());
    // The first exchange grows the header lists.
    assert_eq!(exchange(&mut request, &mut response), 5);
    let region = Region::new(GLOBAL);
    let mut data = 0;
    for _ in 0..1000 {
        data += exchange(&mut request, &mut response);
    }
    let stats = region.change();
    assert_eq!(data, 5000, "every exchange was parsed whole");
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "allocations in 1000 warm exchanges"
    );
}
