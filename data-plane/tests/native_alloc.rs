//! The native HTTP/1.1 engine's keep-alive path allocates nothing per request once its
//! connection is warm: a counting allocator counts every allocation of this test binary
//! (one test, one thread: the client, the proxy's connection and the upstream all run on
//! one current-thread runtime) over 1,000 requests on one client connection, proxied over
//! one pooled upstream connection, on real sockets on 127.0.0.1.

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[path = "../benches/common/native.rs"]
mod native;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

fn a_warm_keep_alive_request_through_the_native_engine_allocates_nothing() {
    let rt = native::runtime(true);
    rt.block_on(async {
        let (mut client, f) = native::start().await;
        let mut buf = vec![0u8; 8192];
        // Warm: the buffers grow, the route's metric series and the pooled upstream
        // connection are made.
        for _ in 0..20 {
            native::exchange(&mut client, &mut buf).await;
        }
        let region = Region::new(GLOBAL);
        for _ in 0..1000 {
            native::exchange(&mut client, &mut buf).await;
        }
        let change = region.change();
        assert_eq!(
            (change.allocations, change.reallocations),
            (0, 0),
            "allocations in 1,000 warm keep-alive requests ({} bytes)",
            change.bytes_allocated
        );
        assert_eq!(
            f.metrics().upstream_connections_opened.get(),
            1,
            "one upstream connection, pooled and reused"
        );
    });
}

/// No harness (see Cargo.toml): the test alone, on the main thread.
fn main() {
    a_warm_keep_alive_request_through_the_native_engine_allocates_nothing();
    println!("test a_warm_keep_alive_request_through_the_native_engine_allocates_nothing ... ok");
}
