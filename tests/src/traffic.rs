//! A bounded traffic driver: steady requests through each proxy across a set of hosts,
//! recording every status code, with a report of anything unexpected. It stops when
//! stopped, or by itself after its maximum duration.

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
}

/// Longest a driver runs if nobody stops it.
const MAX_RUN: Duration = Duration::from_secs(300);

impl Traffic {
    /// Sends `rate` requests per second through each of `proxies`, cycling over `hosts`.
    pub fn start(proxies: &[SocketAddr], hosts: Vec<String>, rate: u32) -> Self {
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
                while started.elapsed() < MAX_RUN {
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

    /// Stops and returns the full report.
    pub async fn stop(mut self) -> Report {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        self.report.lock().expect("report lock").clone()
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
