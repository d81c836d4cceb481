//! Delays between failed attempts, one kind for the whole workspace: the proxy's
//! reconnects to a control plane and the control plane's watches of the API server.
//! Each delay is uniform in [ceiling/2, ceiling], the ceiling doubling from a base up to
//! a cap, so retries from many replicas spread out.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Delays between failed attempts: capped exponential with jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// First delay.
    pub base: Duration,
    /// Largest delay.
    pub cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// Starts at `base`, never above `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            attempt: 0,
        }
    }

    /// The next delay: uniform in [ceiling/2, ceiling], ceiling = min(cap, base·2^attempt).
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << self.attempt.min(16))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let half = ceiling / 2;
        half + Duration::from_nanos(random % (half.as_nanos().max(1) as u64 + 1))
    }

    /// Sleeps for the next delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// After a success: start over.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let delays: Vec<Duration> = (0..10).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(50) && delays[0] <= Duration::from_millis(100));
        assert!(delays[3] >= Duration::from_millis(400) && delays[3] <= Duration::from_millis(800));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(2)));
        assert!(delays[9] >= Duration::from_secs(1));
        let mut again = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let spread: std::collections::HashSet<Duration> = (0..20)
            .map(|_| {
                again.reset();
                again.next_delay()
            })
            .collect();
        assert!(spread.len() > 1, "no jitter");
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
