//! Endpoint choice and passive health checking: round-robin over a backend's endpoints,
//! skipping those that recently failed to connect (ejected for `--eject-for`), and telling
//! a connect error that is the endpoint's fault from one that is this machine's own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use holdfast_lock::Lock;

/// The endpoints that failed to connect, and how a request's endpoint is chosen.
pub(super) struct Balancer {
    /// Endpoints that failed to connect, and until when (ms since `epoch`) they are
    /// skipped. A std mutex: touched briefly, never across an await.
    ejected: Mutex<HashMap<SocketAddr, u64>>,
    /// Fast path: no lock while nothing is ejected.
    any_ejected: AtomicU64,
    epoch: Instant,
    eject_for: Duration,
}

impl Balancer {
    /// A balancer that skips an endpoint for `eject_for` after it fails to connect.
    pub(super) fn new(eject_for: Duration) -> Self {
        Balancer {
            ejected: Mutex::new(HashMap::new()),
            any_ejected: AtomicU64::new(0),
            epoch: Instant::now(),
            eject_for,
        }
    }

    fn now_ms(&self) -> u64 {
        // The worker's coarse clock: ejections last seconds.
        holdfast_http::clock::now()
            .into_std()
            .saturating_duration_since(self.epoch)
            .as_millis() as u64
    }

    fn is_ejected(&self, addr: &SocketAddr, now: u64) -> bool {
        if self.any_ejected.load(Ordering::Relaxed) <= now {
            return false;
        }
        let ejected = self.ejected.locked();
        ejected.get(addr).is_some_and(|until| *until > now)
    }

    fn eject(&self, addr: SocketAddr) {
        let until = self.now_ms() + self.eject_for.as_millis() as u64;
        let mut ejected = self.ejected.locked();
        let now = self.now_ms();
        ejected.retain(|_, u| *u > now);
        ejected.insert(addr, until);
        self.any_ejected.fetch_max(until, Ordering::Relaxed);
    }

    /// Picks an endpoint round-robin from `start` (its index and address), skipping
    /// ejected ones and `avoid` (unless nothing else is left).
    pub(super) fn pick(
        &self,
        endpoints: &[SocketAddr],
        start: usize,
        avoid: Option<SocketAddr>,
    ) -> Option<(usize, SocketAddr)> {
        self.pick_at(endpoints, start, avoid, self.now_ms())
    }

    /// [`Balancer::pick`] at `now` (ms since `epoch`).
    fn pick_at(
        &self,
        endpoints: &[SocketAddr],
        start: usize,
        avoid: Option<SocketAddr>,
        now: u64,
    ) -> Option<(usize, SocketAddr)> {
        let n = endpoints.len();
        let ok = |(_, a): &(usize, SocketAddr)| Some(*a) != avoid && !self.is_ejected(a, now);
        let order = || (0..n).map(|i| ((start + i) % n, endpoints[(start + i) % n]));
        order()
            .find(ok)
            .or_else(|| order().find(|(_, a)| Some(*a) != avoid))
    }

    /// `endpoint` of `backend` failed to connect with `error`: ejected, unless the
    /// failure is this machine's own (out of ports or descriptors), which is not the
    /// endpoint's fault.
    pub(super) fn connect_failed(
        &self,
        endpoint: SocketAddr,
        backend: &str,
        error: &(dyn std::error::Error + 'static),
    ) {
        let chain = holdfast_process::error_chain(error);
        if is_tls_error(error) {
            // A handshake fails by the backend's TLS settings (its CA, its name), which
            // are one route's: the endpoint stays for the others.
            tracing::warn!(%endpoint, backend, error = %chain, "upstream TLS handshake failed; not ejecting");
        } else if is_local_error(error) {
            tracing::warn!(%endpoint, backend, error = %chain, "upstream connect failed for a local reason; not ejecting");
        } else {
            tracing::warn!(%endpoint, backend, error = %chain, "upstream connect failed; ejecting endpoint");
            self.eject(endpoint);
        }
    }
}

/// Is a connect error this machine's own (EADDRNOTAVAIL: no local port; or out of
/// descriptors or memory), rather than the endpoint's?
pub fn is_local_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.raw_os_error().is_some_and(|errno| {
                errno == libc::EADDRNOTAVAIL || holdfast_process::out_of_resources(errno)
            })
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Whether `e` is a failed TLS handshake (a [`ConnectError::Tls`] in its chain).
///
/// [`ConnectError::Tls`]: holdfast_http::upstream::ConnectError::Tls
pub fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(holdfast_http::upstream::ConnectError::Tls(_)) = err.downcast_ref() {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: u16) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, 0, 1], 8000 + i)))
            .collect()
    }

    #[test]
    fn endpoints_are_taken_round_robin_from_the_start_given() {
        let b = Balancer::new(Duration::from_secs(10));
        let e = addrs(3);
        assert_eq!(b.pick(&e, 0, None), Some((0, e[0])));
        assert_eq!(b.pick(&e, 1, None), Some((1, e[1])));
        assert_eq!(b.pick(&e, 4, None), Some((1, e[1])));
        assert_eq!(b.pick(&[], 0, None), None);
    }

    #[test]
    fn an_ejected_endpoint_is_skipped_unless_nothing_else_is_left() {
        let b = Balancer::new(Duration::from_secs(10));
        let e = addrs(2);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        b.connect_failed(e[0], "web", &refused);
        assert_eq!(b.pick(&e, 0, None), Some((1, e[1])));
        // The retry avoids the endpoint just tried; with only the ejected one left, it is
        // tried rather than nothing.
        assert_eq!(b.pick(&e, 0, Some(e[1])), Some((0, e[0])));
        assert_eq!(b.pick(&e[..1], 0, None), Some((0, e[0])));
    }

    #[test]
    fn a_local_connect_error_ejects_nobody() {
        let b = Balancer::new(Duration::from_secs(10));
        let e = addrs(2);
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        b.connect_failed(e[0], "web", &emfile);
        assert_eq!(b.pick(&e, 0, None), Some((0, e[0])));
    }

    #[test]
    fn a_failed_tls_handshake_ejects_nobody() {
        use holdfast_http::upstream::ConnectError;
        let b = Balancer::new(Duration::from_secs(10));
        let e = addrs(2);
        let tls = ConnectError::Tls(std::io::Error::other("certificate not trusted"));
        b.connect_failed(e[0], "web (https)", &tls);
        assert_eq!(b.pick(&e, 0, None), Some((0, e[0])), "still picked first");
        let refused = ConnectError::Io(std::io::ErrorKind::ConnectionRefused.into());
        b.connect_failed(e[0], "web", &refused);
        assert_eq!(b.pick(&e, 0, None), Some((1, e[1])), "ejected by a refusal");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("connect failed")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn local_connect_errors_are_told_from_the_endpoints_own() {
        use libc::*;
        for errno in [EADDRNOTAVAIL, EMFILE, ENFILE, ENOBUFS, ENOMEM] {
            let e = Wrapped(std::io::Error::from_raw_os_error(errno));
            assert!(is_local_error(&e), "errno {errno} is local");
        }
        for errno in [ECONNREFUSED, EHOSTUNREACH, ETIMEDOUT] {
            let e = Wrapped(std::io::Error::from_raw_os_error(errno));
            assert!(!is_local_error(&e), "errno {errno} is the endpoint's");
        }
    }

    #[test]
    fn an_ejection_ends_after_eject_for() {
        let b = Balancer::new(Duration::from_secs(10));
        let e = addrs(2);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let ejected_at = b.now_ms();
        b.connect_failed(e[0], "web", &refused);
        let done = b.now_ms() + 10_000;
        // Skipped until `eject_for` has passed since the failure, then taken again.
        assert_eq!(b.pick_at(&e, 0, None, ejected_at + 9_999), Some((1, e[1])));
        assert_eq!(b.pick_at(&e, 0, None, done), Some((0, e[0])));
        // A second failure later ejects it again, from then.
        b.connect_failed(e[0], "web", &refused);
        assert_eq!(b.pick(&e, 0, None), Some((1, e[1])));
    }
}
