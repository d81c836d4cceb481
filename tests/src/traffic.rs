//! A bounded traffic driver: steady requests through each proxy across a set of hosts,
//! recording every status code, with a report of anything unexpected. It stops when
//! stopped, or by itself after its maximum duration; then stopping it is an error, since
//! the scenario outlived it and part of it went without traffic.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// One request that did not get a 2xx.
#[derive(Debug, Clone)]
pub struct Unexpected {
    /// Time since the driver started.
    pub at: Duration,
    /// Proxy it went through.
    pub proxy: SocketAddr,
    /// Host asked for.
    pub host: String,
    /// Status, or 0 for a connection-level failure.
    pub status: u16,
    /// Body or error text.
    pub detail: String,
}

/// What the driver saw.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Requests by (host, status); status 0 is a connection failure.
    pub by_host_status: BTreeMap<(String, u16), u64>,
    /// Every non-2xx, in order.
    pub unexpected: Vec<Unexpected>,
    /// Requests sent.
    pub total: u64,
    /// The driver stopped by itself at its maximum duration (nothing was sent after).
    pub ran_out: bool,
}

impl Report {
    /// Requests for `host` that got `status`.
    pub fn count(&self, host: &str, status: u16) -> u64 {
        self.by_host_status
            .get(&(host.to_owned(), status))
            .copied()
            .unwrap_or(0)
    }

    /// Requests that got a 2xx.
    pub fn ok(&self) -> u64 {
        self.by_host_status
            .iter()
            .filter(|((_, s), _)| (200..300).contains(s))
            .map(|(_, n)| n)
            .sum()
    }

    /// Non-2xx answers excluding `hosts`.
    pub fn unexpected_except(&self, hosts: &[&str]) -> Vec<&Unexpected> {
        self.unexpected
            .iter()
            .filter(|u| !hosts.contains(&u.host.as_str()))
            .collect()
    }

    /// A short summary for assertion messages.
    pub fn summary(&self) -> String {
        let first: Vec<String> = self
            .unexpected
            .iter()
            .take(5)
            .map(|u| {
                format!(
                    "{:?} {} {} {} {}",
                    u.at,
                    u.proxy,
                    u.host,
                    u.status,
                    u.detail.trim()
                )
            })
            .collect();
        format!(
            "{} requests, {} ok, {} unexpected; first: {first:#?}",
            self.total,
            self.ok(),
            self.unexpected.len()
        )
    }
}

/// A running driver.
pub struct Traffic {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    report: Arc<Mutex<Report>>,
    hosts: Arc<Mutex<Vec<String>>>,
    max_run: Duration,
}

/// Longest a driver runs if nobody stops it.
pub const MAX_RUN: Duration = Duration::from_secs(300);

impl Traffic {
    /// Sends `rate` requests per second through each of `proxies`, cycling over `hosts`,
    /// for at most [`MAX_RUN`].
    pub fn start(proxies: &[SocketAddr], hosts: Vec<String>, rate: u32) -> Self {
        Self::start_for(proxies, hosts, rate, MAX_RUN)
    }

    /// Like [`Traffic::start`], for at most `max_run`.
    pub fn start_for(
        proxies: &[SocketAddr],
        hosts: Vec<String>,
        rate: u32,
        max_run: Duration,
    ) -> Self {
        let (stop, rx) = watch::channel(false);
        let report = Arc::new(Mutex::new(Report::default()));
        let hosts = Arc::new(Mutex::new(hosts));
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for &proxy in proxies {
            let (mut stop, report, hosts) = (rx.clone(), report.clone(), hosts.clone());
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut conn: Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> = None;
                let mut i = 0usize;
                loop {
                    if started.elapsed() >= max_run {
                        report.lock().expect("report lock").ran_out = true;
                        break;
                    }
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => break,
                        _ = tick.tick() => {}
                    }
                    let host = {
                        let hosts = hosts.lock().expect("hosts lock");
                        if hosts.is_empty() {
                            continue;
                        }
                        hosts[i % hosts.len()].clone()
                    };
                    i += 1;
                    let (status, detail) = match one(&mut conn, proxy, &host).await {
                        Ok((s, body)) => (s, body),
                        Err(e) => {
                            conn = None;
                            (0, e)
                        }
                    };
                    let mut r = report.lock().expect("report lock");
                    r.total += 1;
                    *r.by_host_status.entry((host.clone(), status)).or_default() += 1;
                    if !(200..300).contains(&status) {
                        r.unexpected.push(Unexpected {
                            at: started.elapsed(),
                            proxy,
                            host,
                            status,
                            detail,
                        });
                    }
                }
            });
        }
        Traffic {
            stop,
            tasks,
            report,
            hosts,
            max_run,
        }
    }

    /// Replaces the hosts in rotation.
    pub fn set_hosts(&self, hosts: Vec<String>) {
        *self.hosts.lock().expect("hosts lock") = hosts;
    }

    /// The report so far.
    pub fn snapshot(&self) -> Report {
        self.report.lock().expect("report lock").clone()
    }

    /// Stops and returns the full report; an error if the driver had stopped by itself
    /// (the scenario outlived it: its end went without traffic).
    pub async fn stop(mut self) -> anyhow::Result<Report> {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        let report = self.report.lock().expect("report lock").clone();
        anyhow::ensure!(
            !report.ran_out,
            "the traffic driver stopped by itself before the scenario ended (it runs at most \
             {:?}): {}",
            self.max_run,
            report.summary()
        );
        Ok(report)
    }
}

async fn one(
    conn: &mut Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>,
    proxy: SocketAddr,
    host: &str,
) -> Result<(u16, String), String> {
    let fut = async {
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            let stream = tokio::net::TcpStream::connect(proxy)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(connection);
            *conn = Some(sender);
        }
        let sender = conn.as_mut().expect("set above");
        sender
            .ready()
            .await
            .map_err(|e| format!("not ready: {e}"))?;
        let req = http::Request::get("/")
            .header(http::header::HOST, host)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    match tokio::time::timeout(Duration::from_secs(5), fut).await {
        Ok(r) => r,
        Err(_) => Err("timed out after 5s".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver that outlives its maximum duration says so: stopping it fails. (Requests
    /// to a closed port fail at once; they are recorded as connection failures.)
    #[tokio::test]
    async fn a_driver_that_ran_out_fails_when_stopped() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let limit = Duration::from_millis(300);
        let traffic = Traffic::start_for(&[closed], vec!["a.test".into()], 100, limit);
        crate::wait::until("the driver to run out", crate::wait::T, || async {
            Ok(traffic.snapshot().ran_out.then_some(()))
        })
        .await
        .expect("it runs out");
        let error = traffic
            .stop()
            .await
            .expect_err("stopping a driver that ran out fails");
        assert!(error.to_string().contains("stopped by itself"), "{error}");

        let running = Traffic::start_for(&[closed], vec!["a.test".into()], 100, crate::wait::T);
        crate::wait::until("some requests", crate::wait::T, || async {
            Ok((running.snapshot().total > 3).then_some(()))
        })
        .await
        .expect("requests");
        let report = running.stop().await.expect("stopped in time");
        assert!(!report.ran_out);
        assert_eq!(report.count("a.test", 0), report.total);
    }
}
