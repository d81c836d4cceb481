//! Counting what is in flight: requests on a connection, connections on a listening
//! address (all workers together), HTTP/2 streams and receive windows in slots of
//! `--max-connections`. A count is taken with a guard and given back when it is dropped,
//! so nothing that ends (an answer sent, a connection closed, a stream reset) can keep
//! its slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One request in flight on a connection (or one open connection), counted until it is
/// dropped.
pub struct InFlight(Arc<AtomicUsize>, usize);

impl InFlight {
    /// Counts one more, whatever the count.
    pub fn enter(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::AcqRel);
        InFlight(counter.clone(), 1)
    }

    /// Counts one more unless `max` are counted already.
    pub fn enter_below(counter: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        Self::enter_n_below(counter, 1, max)
    }

    /// Counts `n` more, all or none, unless that would pass `max`.
    pub fn enter_n_below(counter: &Arc<AtomicUsize>, n: usize, max: usize) -> Option<Self> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                c.checked_add(n).filter(|after| *after <= max)
            })
            .ok()
            .map(|_| InFlight(counter.clone(), n))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_is_checked_and_counted_in_one_step_across_threads() {
        let open = Arc::new(AtomicUsize::new(0));
        let max = 100;
        // Four "workers" race for more slots than there are; none may get past the limit.
        let held: Vec<Vec<InFlight>> = std::thread::scope(|s| {
            let racers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..max)
                            .filter_map(|_| InFlight::enter_below(&open, max))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(held.iter().map(Vec::len).sum::<usize>(), max);
        assert_eq!(open.load(Ordering::SeqCst), max);
        assert!(InFlight::enter_below(&open, max).is_none());
        drop(held);
        assert_eq!(
            open.load(Ordering::SeqCst),
            0,
            "a closed connection frees its slot"
        );
        assert!(InFlight::enter_below(&open, max).is_some());
    }

    /// An HTTP/2 receive window takes its slots all or none, and gives them all back.
    #[test]
    fn several_slots_are_taken_all_or_none() {
        let open = Arc::new(AtomicUsize::new(0));
        let one = InFlight::enter_below(&open, 4).expect("a slot");
        let three = InFlight::enter_n_below(&open, 3, 4).expect("three slots");
        assert_eq!(open.load(Ordering::SeqCst), 4);
        drop(three);
        let _two = InFlight::enter_n_below(&open, 2, 4).expect("two slots");
        assert!(
            InFlight::enter_n_below(&open, 2, 4).is_none(),
            "two more than the one left"
        );
        assert_eq!(open.load(Ordering::SeqCst), 3, "a refusal takes nothing");
        drop(one);
        assert_eq!(open.load(Ordering::SeqCst), 2);
    }
}
