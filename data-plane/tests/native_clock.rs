//! The native engine reads its worker's coarse clock ([`holdfast_http::clock`]):
//! the same 1,000 warm keep-alive requests read the clock at least half as often as with
//! a clock read at every use. The client, the proxy's connection and the upstream run on
//! one current-thread runtime (so several turns of its event loop serve each request), on
//! real sockets on 127.0.0.1.

use holdfast_http::clock;

#[path = "../benches/common/native.rs"]
mod native;

/// The clock reads of 1,000 warm requests on a runtime of its own, on a thread of its own.
fn reads_per_thousand(coarse: bool) -> u64 {
    std::thread::spawn(move || {
        let rt = native::runtime(coarse);
        rt.block_on(async {
            let (mut client, _f) = native::start().await;
            let mut buf = vec![0u8; 8192];
            for _ in 0..20 {
                native::exchange(&mut client, &mut buf).await;
            }
            let before = clock::reads();
            for _ in 0..1000 {
                native::exchange(&mut client, &mut buf).await;
            }
            clock::reads() - before
        })
    })
    .join()
    .expect("the requests' thread")
}

#[test]
fn the_native_engine_reads_the_clock_once_per_turn_not_at_every_use() {
    let every_use = reads_per_thousand(false);
    let coarse = reads_per_thousand(true);
    assert!(
        every_use >= 1000,
        "read at every use, the clock is read at least once per request: {every_use}"
    );
    assert!(
        coarse * 2 <= every_use,
        "the coarse clock read {coarse} times, a clock read at every use {every_use} times"
    );
    eprintln!("clock reads per 1,000 requests: {coarse} coarse, {every_use} at every use");
}
