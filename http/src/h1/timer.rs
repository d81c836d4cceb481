//! A connection's one timer, shared by all its waits.
//!
//! `tokio::time::timeout` makes a timer entry for each wait, and registers it in the
//! runtime's timer wheel (under its lock) whenever the wait has to wait: on a keep-alive
//! connection that is several per request. Here a connection keeps one [`Sleep`]. Each
//! wait says when it must be over ([`Until`]): a time from when it begins, worked out only
//! if it has to wait, or an instant several waits share, checked as each ends. The timer
//! is touched only when a wait has to wait, and then only if it would fire after that
//! deadline. A timer that fires before the deadline of the wait in progress (left
//! armed by an earlier, shorter wait) is re-armed for it. So a write that is over at its
//! first poll touches no timer and reads no clock, and a busy connection's waits share
//! one registration that moves about once per timeout period (nginx keeps one timer per
//! connection event in the same spirit). Times come from the worker's coarse clock
//! ([`crate::clock`]), read afresh only when the timer has fired.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

thread_local! {
    /// Waits on this thread's timers that had to wait, and how often one was armed.
    static COUNTS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// On this thread so far: the waits on connection timers that had to wait (were not over
/// at their first poll), and the times a timer was armed (moved in the runtime's timer
/// wheel). The second stays far below the first: what one timer per connection is for.
pub fn counts() -> (u64, u64) {
    COUNTS.with(Cell::get)
}

/// When a wait must be over.
#[derive(Debug, Clone, Copy)]
pub enum Until {
    /// This long after it began to wait.
    After(Duration),
    /// By this instant.
    At(Instant),
    /// Whenever: a timeout too long to have an instant (as `tokio::time::timeout` takes
    /// one).
    Never,
}

impl Until {
    /// `after` past `from`.
    pub fn after(from: Instant, after: Duration) -> Self {
        from.checked_add(after).map_or(Until::Never, Until::At)
    }
}

/// A wait was not over in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

/// One connection's timer.
#[derive(Debug)]
pub struct Timer {
    sleep: Pin<Box<Sleep>>,
    /// When `sleep` fires, while it is armed.
    armed: Option<Instant>,
}

impl Default for Timer {
    fn default() -> Self {
        Timer::new()
    }
}

impl Timer {
    /// A timer, not armed.
    // The connection's one Sleep, which every wait shares (see `http/clippy.toml`).
    #[allow(clippy::disallowed_methods)]
    pub fn new() -> Self {
        Timer {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }

    /// `fut`'s output, or `TimedOut` if it is not ready by `until`.
    pub async fn within<F: Future>(&mut self, until: Until, fut: F) -> Result<F::Output, TimedOut> {
        let mut fut = std::pin::pin!(fut);
        let mut deadline: Option<Option<Instant>> = None;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                // A deadline shared by several waits (a head read in pieces, interim
                // answers before the final one) holds even when each is over at once.
                if let Until::At(at) = until
                    && crate::clock::now() >= at
                {
                    return Poll::Ready(Err(TimedOut));
                }
                return Poll::Ready(Ok(out));
            }
            if deadline.is_none() {
                COUNTS.with(|c| c.set((c.get().0 + 1, c.get().1)));
            }
            let at = *deadline.get_or_insert_with(|| match until {
                Until::After(d) => crate::clock::now().checked_add(d),
                Until::At(at) => Some(at),
                Until::Never => None,
            });
            let Some(at) = at else {
                return Poll::Pending;
            };
            loop {
                if self.armed.is_none_or(|armed| armed > at) {
                    self.sleep.as_mut().reset(at);
                    COUNTS.with(|c| c.set((c.get().0, c.get().1 + 1)));
                    self.armed = Some(at);
                }
                match self.sleep.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => {
                        self.armed = None;
                        // The clock read afresh: the worker's may be a turn behind.
                        if Instant::now() >= at {
                            return Poll::Ready(Err(TimedOut));
                        }
                        // It fired for an earlier deadline: armed again for this one.
                    }
                }
            }
        })
        .await
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_is_ready_at_once_neither_times_out_nor_arms_the_timer() {
        let mut timer = Timer::new();
        assert_eq!(
            timer
                .within(Until::After(Duration::ZERO), async { 7 })
                .await,
            Ok(7)
        );
        assert_eq!(timer.armed, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_too_long_for_an_instant_never_ends_the_wait() {
        let mut timer = Timer::new();
        let ready = tokio::time::sleep(3 * SECOND);
        let huge = Until::after(Instant::now(), Duration::MAX);
        assert!(matches!(huge, Until::Never));
        assert_eq!(timer.within(huge, ready).await, Ok(()));
        let ready = tokio::time::sleep(3 * SECOND);
        assert_eq!(
            timer.within(Until::After(Duration::MAX), ready).await,
            Ok(())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waits_over_at_once_still_end_at_the_instant_they_share() {
        let mut timer = Timer::new();
        let by = Until::At(Instant::now() + 2 * SECOND);
        assert_eq!(timer.within(by, async { 1 }).await, Ok(1));
        tokio::time::advance(3 * SECOND).await;
        assert_eq!(timer.within(by, async { 2 }).await, Err(TimedOut));
        // A time from when the wait begins is not shared: over at once is in time.
        assert_eq!(timer.within(Until::After(SECOND), async { 3 }).await, Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_times_out_at_its_deadline_not_before() {
        let mut timer = Timer::new();
        let began = Instant::now();
        let out = timer
            .within(Until::After(5 * SECOND), std::future::pending::<()>())
            .await;
        assert_eq!(out, Err(TimedOut));
        assert_eq!(began.elapsed().as_secs(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ready_before_its_deadline_is_ready() {
        let mut timer = Timer::new();
        let ready = tokio::time::sleep(2 * SECOND);
        assert_eq!(timer.within(Until::After(5 * SECOND), ready).await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_left_armed_early_is_armed_again_for_a_later_deadline() {
        let mut timer = Timer::new();
        // A short wait, over before its deadline, leaves the timer armed at 1 s.
        let quick = timer.within(Until::After(SECOND), tokio::time::sleep(SECOND / 2));
        assert_eq!(quick.await, Ok(()));
        assert!(timer.armed.is_some());
        // A longer wait is not cut at 1 s: it ends when it is ready, at 3 s.
        let began = Instant::now();
        let long = timer.within(Until::After(10 * SECOND), tokio::time::sleep(3 * SECOND));
        assert_eq!(long.await, Ok(()));
        assert_eq!(began.elapsed().as_secs(), 3);
        // And one that never ends times out at its own deadline.
        let began = Instant::now();
        let never = timer.within(Until::After(4 * SECOND), std::future::pending::<()>());
        assert_eq!(never.await, Err(TimedOut));
        assert_eq!(began.elapsed().as_secs(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_deadline_than_the_armed_one_fires_at_its_own_time() {
        let mut timer = Timer::new();
        let slow = timer.within(Until::After(60 * SECOND), tokio::time::sleep(SECOND));
        assert_eq!(slow.await, Ok(()));
        // Armed at 60 s; a 2 s wait must not wait for that.
        let began = Instant::now();
        let at = Instant::now() + 2 * SECOND;
        let short = timer.within(Until::At(at), std::future::pending::<()>());
        assert_eq!(short.await, Err(TimedOut));
        assert_eq!(began.elapsed().as_secs(), 2);
    }
}
