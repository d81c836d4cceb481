//! A worker's coarse clock: read once per turn of its event loop, shared by every request
//! the turn serves.
//!
//! nginx reads the clock once per `epoll_wait` and serves the events it returned at that
//! time. Here a worker's runtime calls [`turn`] each time it wakes from waiting for events
//! (`on_thread_unpark`); the first [`now`] after that reads the clock, and the reads after
//! it in the same turn get that time. A turn that serves many connections keeps the time
//! it began with, so a busy worker's time is also read afresh after [`USES`] reads (a
//! current-thread runtime looks for new events between tasks without unparking when it
//! has work queued, and calls no hook then). The time is thus at most one turn's work (or
//! [`USES`] reads' work) old: deadlines made from it are that much early, and request
//! durations count from when the turn that read the request began.
//!
//! Request durations and upstream latencies measured with it are coarse too: a request
//! served within one turn records zero. A thread whose runtime never called [`turn`] (a
//! test's own runtime, the control runtime) reads the clock each time, so a runtime with
//! paused time is still followed.

use std::cell::Cell;

use tokio::time::Instant;

/// Reads of one turn's time before it is read afresh.
pub const USES: u32 = 64;

thread_local! {
    /// This worker's time and how many more reads it serves; `None` until its runtime
    /// first calls [`turn`], and after each call, until the next [`now`].
    static NOW: Cell<Option<(Instant, u32)>> = const { Cell::new(None) };
    /// Whether this thread's runtime calls [`turn`].
    static COARSE: Cell<bool> = const { Cell::new(false) };
    /// How many times this thread read the clock for [`now`].
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// A new turn of this thread's event loop: the next [`now`] reads the clock. Given to the
/// worker runtime's `on_thread_unpark`.
pub fn turn() {
    COARSE.with(|c| c.set(true));
    NOW.with(|n| n.set(None));
}

/// The time, as of this turn of the event loop (see the module's text).
pub fn now() -> Instant {
    if !COARSE.with(Cell::get) {
        return read();
    }
    NOW.with(|n| match n.get() {
        Some((at, left)) if left > 0 => {
            n.set(Some((at, left - 1)));
            at
        }
        _ => {
            let at = read();
            n.set(Some((at, USES - 1)));
            at
        }
    })
}

/// How many times this thread has read the clock for [`now`].
pub fn reads() -> u64 {
    READS.with(Cell::get)
}

fn read() -> Instant {
    READS.with(|r| r.set(r.get() + 1));
    Instant::now()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Spins until the clock has moved past `from` (it does within microseconds).
    fn until_the_clock_moves(from: Instant) {
        let give_up = std::time::Instant::now() + Duration::from_secs(5);
        while Instant::now() <= from {
            assert!(
                std::time::Instant::now() < give_up,
                "the clock did not move"
            );
            std::hint::spin_loop();
        }
    }

    fn worker_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_unpark(turn)
            .build()
            .expect("a runtime")
    }

    #[test]
    fn reads_in_one_turn_share_its_time_and_the_next_turn_reads_afresh() {
        std::thread::spawn(|| {
            worker_runtime().block_on(async {
                // A first park and unpark makes the thread's clock coarse.
                tokio::time::sleep(Duration::from_millis(1)).await;
                let first = now();
                until_the_clock_moves(first);
                assert_eq!(now(), first, "a second read in the same turn");
                let before = reads();
                tokio::time::sleep(Duration::from_millis(2)).await;
                let next = now();
                assert!(
                    next >= first + Duration::from_millis(2),
                    "the turn after a wait reads the clock: {:?} after",
                    next - first
                );
                assert_eq!(reads() - before, 1, "one read for the new turn");
            });
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn a_busy_turn_reads_the_clock_again_after_so_many_reads() {
        std::thread::spawn(|| {
            worker_runtime().block_on(async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let first = now();
                until_the_clock_moves(first);
                for _ in 1..USES {
                    assert_eq!(now(), first);
                }
                assert!(now() > first, "read afresh after {USES} reads");
            });
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn a_thread_whose_runtime_has_no_turns_reads_the_clock_each_time() {
        std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(async {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let first = now();
                    until_the_clock_moves(first);
                    assert!(now() > first);
                });
        })
        .join()
        .expect("the test thread");
    }
}
