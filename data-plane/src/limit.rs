//! Per-client limits of an Ingress's ingress-nginx annotations: [`ConnLimit`], the
//! requests in progress at once per client address (`limit-connections`), and
//! [`RateLimit`], request rates (`limit-rps`): a token bucket
//! per client address, per route entry and per proxy (as ingress-nginx's are per nginx
//! instance). Pure bookkeeping: the caller passes the time, so tests drive the clock.
//!
//! Bounded: at most [`MAX_CLIENTS`] addresses are tracked per entry. When the table is
//! full, the addresses whose buckets have refilled are forgotten (they are as a new client
//! would be), at most once a second (the sweep is O(table)); meanwhile new addresses share
//! one overflow bucket, so many addresses can neither grow the table, nor cost a sweep a
//! request, nor escape the limit together.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use holdfast_lock::Lock;

/// Requests in progress at once per client address (nginx's `limit_conn`, which counts
/// each request in progress, an HTTP/2 stream included, as a connection). Bounded by
/// itself: an address is tracked only while it has a request in progress.
#[derive(Debug)]
pub struct ConnLimit {
    /// Most requests in progress at once per address.
    pub max: u32,
    in_progress: Mutex<HashMap<IpAddr, u32>>,
}

/// A request in progress under a [`ConnLimit`]: its place is given back when dropped.
#[derive(Debug)]
pub struct ConnPermit {
    limit: Arc<ConnLimit>,
    client: IpAddr,
}

impl ConnLimit {
    /// At most `max` requests in progress at once per address.
    pub fn new(max: u32) -> Self {
        ConnLimit {
            max,
            in_progress: Mutex::new(HashMap::new()),
        }
    }

    /// A place for one more request from `client`, held until the permit is dropped;
    /// None when `max` of its requests are in progress.
    pub fn acquire(self: &Arc<Self>, client: IpAddr) -> Option<ConnPermit> {
        let mut in_progress = self.in_progress.locked();
        let n = in_progress.entry(client).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(ConnPermit {
            limit: self.clone(),
            client,
        })
    }

    /// Requests of `client` in progress.
    pub fn in_progress(&self, client: IpAddr) -> u32 {
        let in_progress = self.in_progress.locked();
        in_progress.get(&client).copied().unwrap_or(0)
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut in_progress = self.limit.in_progress.locked();
        if let Some(n) = in_progress.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                in_progress.remove(&self.client);
            }
        }
    }
}

/// Most client addresses tracked per limited entry.
pub const MAX_CLIENTS: usize = 16_384;

/// A token bucket per client address: `rate` requests a second, and `burst` more at once
/// (nginx's `limit_req ... burst=N nodelay`: N + 1 at once).
#[derive(Debug)]
pub struct RateLimit {
    /// Requests a second.
    pub rate: u32,
    /// Requests allowed at once over the one the rate allows.
    pub burst: u32,
    buckets: Mutex<Buckets>,
}

#[derive(Debug, Default)]
struct Buckets {
    by_client: HashMap<IpAddr, Bucket>,
    overflow: Option<Bucket>,
    /// When the table was last swept.
    swept: Option<Instant>,
}

/// Tokens left, as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    /// `rate` requests a second per client, `burst` more at once.
    pub fn new(rate: u32, burst: u32) -> Self {
        RateLimit {
            rate,
            burst,
            buckets: Mutex::new(Buckets::default()),
        }
    }

    /// Tokens a bucket holds at most.
    fn capacity(&self) -> f64 {
        f64::from(self.burst) + 1.0
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * f64::from(self.rate)).min(self.capacity());
        b.at = now;
    }

    /// Whether a request from `client` at `now` is let through (it takes a token).
    pub fn allow(&self, client: IpAddr, now: Instant) -> bool {
        let full = Bucket {
            tokens: self.capacity(),
            at: now,
        };
        let mut buckets = self.buckets.locked();
        let due = buckets.swept.is_none_or(|at| {
            now.saturating_duration_since(at) >= std::time::Duration::from_secs(1)
        });
        if !buckets.by_client.contains_key(&client) && buckets.by_client.len() >= MAX_CLIENTS && due
        {
            let capacity = self.capacity();
            let rate = f64::from(self.rate);
            buckets.by_client.retain(|_, b| {
                let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
                b.tokens + elapsed * rate < capacity
            });
            buckets.swept = Some(now);
        }
        let bucket =
            if buckets.by_client.len() < MAX_CLIENTS || buckets.by_client.contains_key(&client) {
                buckets.by_client.entry(client).or_insert(full)
            } else {
                buckets.overflow.get_or_insert(full)
            };
        let mut b = *bucket;
        self.refill(&mut b, now);
        let allowed = b.tokens >= 1.0;
        if allowed {
            b.tokens -= 1.0;
        }
        *bucket = b;
        allowed
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.buckets.locked().by_client.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_has_at_most_max_requests_in_progress_and_each_end_gives_its_place_back() {
        let limit = Arc::new(ConnLimit::new(2));
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let first = limit.acquire(a).expect("first");
        let second = limit.acquire(a).expect("second");
        assert!(limit.acquire(a).is_none(), "a third at once");
        assert!(limit.acquire(b).is_some(), "another address has its own");
        drop(first);
        let third = limit.acquire(a).expect("a place given back");
        drop((second, third));
        assert_eq!(limit.in_progress(a), 0);
        assert!(
            limit.in_progress.lock().unwrap().is_empty(),
            "an address without requests is forgotten"
        );
    }
    use std::time::Duration;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(n.to_be_bytes())
    }

    /// A client gets its burst at once, then the rate; each client has its own bucket.
    #[test]
    fn each_client_gets_its_burst_then_its_rate() {
        let limit = RateLimit::new(2, 4);
        let t0 = Instant::now();
        let allowed = (0..10).filter(|_| limit.allow(ip(1), t0)).count();
        assert_eq!(allowed, 5, "the burst and one, as nginx's nodelay");
        assert!(limit.allow(ip(2), t0), "another client has its own");
        assert!(!limit.allow(ip(1), t0 + Duration::from_millis(400)));
        assert!(
            limit.allow(ip(1), t0 + Duration::from_millis(500)),
            "2 a second"
        );
        assert!(!limit.allow(ip(1), t0 + Duration::from_millis(600)));
        let later = t0 + Duration::from_secs(60);
        let allowed = (0..10).filter(|_| limit.allow(ip(1), later)).count();
        assert_eq!(allowed, 5, "refilled to the burst and one, never over");
    }

    /// The table is bounded: refilled clients are forgotten; when none is, new clients
    /// share one overflow bucket (many addresses cannot escape the limit together).
    #[test]
    fn the_clients_tracked_are_bounded_and_new_ones_share_the_overflow() {
        let limit = RateLimit::new(1, 0);
        let t0 = Instant::now();
        for n in 0..MAX_CLIENTS as u32 {
            assert!(limit.allow(ip(n), t0));
        }
        assert_eq!(limit.tracked(), MAX_CLIENTS);
        let extra = MAX_CLIENTS as u32;
        assert!(limit.allow(ip(extra), t0), "the overflow's token");
        assert!(!limit.allow(ip(extra + 1), t0), "shared: spent");
        assert_eq!(limit.tracked(), MAX_CLIENTS);
        // A sweep is at most once a second: the table stays full meanwhile.
        assert!(!limit.allow(ip(extra + 2), t0 + Duration::from_millis(500)));
        assert_eq!(limit.tracked(), MAX_CLIENTS);
        // Later every bucket has refilled: they are forgotten, and a new client tracked.
        let later = t0 + Duration::from_secs(5);
        assert!(limit.allow(ip(extra + 3), later));
        assert_eq!(limit.tracked(), 1);
    }
}
