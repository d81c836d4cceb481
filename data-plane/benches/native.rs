//! The native HTTP/1.1 engine's keep-alive path on real sockets on 127.0.0.1: a client,
//! the engine serving its connection, and an upstream, on one current-thread runtime (so
//! the time is all three's, per request). It also prints the heap allocations per warm
//! request. `cargo bench -p holdfast-data-plane --bench native`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[path = "common/native.rs"]
mod native;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

fn bench_native(c: &mut Criterion) {
    let rt = native::runtime(true);
    let (mut client, _f) = rt.block_on(native::start());
    let mut buf = vec![0u8; 8192];
    rt.block_on(async {
        for _ in 0..20 {
            native::exchange(&mut client, &mut buf).await;
        }
    });
    let region = Region::new(GLOBAL);
    rt.block_on(async {
        for _ in 0..1000 {
            native::exchange(&mut client, &mut buf).await;
        }
    });
    let change = region.change();
    eprintln!(
        "native keep-alive request: {} allocations, {} bytes per 1,000 requests",
        change.allocations + change.reallocations,
        change.bytes_allocated
    );
    c.bench_function("native_keep_alive_request", |b| {
        b.iter(|| rt.block_on(native::exchange(black_box(&mut client), &mut buf)))
    });
}

criterion_group!(benches, bench_native);
criterion_main!(benches);
