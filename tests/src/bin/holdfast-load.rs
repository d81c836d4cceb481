//! `holdfast-load`: open-loop HTTP/1.1 load at a fixed rate over keep-alive connections,
//! printing oha's JSON summary (the fields `tests/bench/proxy.sh` reads). The benchmark
//! smoke run uses it instead of oha, which takes minutes to install.
//!
//! Requests are due at even intervals from the start; each of `--connections` connections
//! takes the next due request, waits until it is due, sends it and reads the response.
//! Latency counts from when a request was due, so a late one counts its wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use holdfast_tests::load::{Run, due};
use http_body_util::{BodyExt, Empty};
use tokio::time::Instant;

/// Open-loop load at a fixed rate.
#[derive(Parser, Debug)]
struct Args {
    /// http://host:port/path to request.
    url: http::Uri,
    /// Requests per second.
    #[arg(short = 'q', long)]
    rate: f64,
    /// How long to send, e.g. 5s.
    #[arg(short = 'z', long, value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Keep-alive connections.
    #[arg(short = 'c', long, default_value_t = 50)]
    connections: usize,
    /// The Host header.
    #[arg(long)]
    host: Option<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rate > 0.0, "--rate must be more than 0");
    anyhow::ensure!(args.connections > 0, "--connections must be at least 1");
    let authority = args
        .url
        .authority()
        .ok_or_else(|| anyhow::anyhow!("the URL needs host:port"))?
        .clone();
    let addr = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let host = args.host.clone().unwrap_or_else(|| authority.to_string());
    let path = args
        .url
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    let start = Instant::now();
    let end = start + args.duration;
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.connections {
        let (next, addr, host, path, rate) = (
            next.clone(),
            addr.clone(),
            host.clone(),
            path.clone(),
            args.rate,
        );
        workers.spawn(async move {
            let mut run = Run::default();
            let mut conn = None;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let at = start + due(n, rate);
                if at >= end {
                    break;
                }
                tokio::time::sleep_until(at).await;
                // A keep-alive connection the server closed (nginx does after
                // keepalive_requests) is replaced, not counted as a failed request.
                if conn
                    .as_ref()
                    .is_some_and(|c: &hyper::client::conn::http1::SendRequest<_>| c.is_closed())
                {
                    conn = None;
                }
                let exchange = async {
                    if conn.is_none() {
                        let stream = tokio::net::TcpStream::connect(&addr).await?;
                        stream.set_nodelay(true)?;
                        let (send, connection) = hyper::client::conn::http1::handshake(
                            hyper_util::rt::TokioIo::new(stream),
                        )
                        .await?;
                        tokio::spawn(connection);
                        conn = Some(send);
                    }
                    let send = conn.as_mut().expect("connected");
                    send.ready().await?;
                    let request = http::Request::get(path.as_str())
                        .header(http::header::HOST, host.as_str())
                        .body(Empty::<bytes::Bytes>::new())?;
                    let response = send.send_request(request).await?;
                    let status = response.status().as_u16();
                    response.into_body().collect().await?;
                    anyhow::Ok(status)
                };
                match tokio::time::timeout_at(end, exchange).await {
                    Ok(Ok(status)) => {
                        run.latencies.push(at.elapsed());
                        *run.statuses.entry(status).or_default() += 1;
                    }
                    Ok(Err(e)) => {
                        conn = None;
                        *run.errors.entry(e.to_string()).or_default() += 1;
                    }
                    Err(_) => {
                        run.cut += 1;
                        break;
                    }
                }
            }
            run
        });
    }
    let mut all = Run::default();
    while let Some(run) = workers.join_next().await {
        let run = run?;
        all.latencies.extend(run.latencies);
        for (s, n) in run.statuses {
            *all.statuses.entry(s).or_default() += n;
        }
        for (e, n) in run.errors {
            *all.errors.entry(e).or_default() += n;
        }
        all.cut += run.cut;
    }
    all.elapsed = start.elapsed();
    // Requests that were due but that no connection took before the end (overload) are
    // cut too, not forgotten.
    let due_in_run = (args.duration.as_secs_f64() * args.rate).ceil() as u64;
    let counted = all.latencies.len() as u64 + all.errors.values().sum::<u64>() + all.cut;
    all.cut += due_in_run.saturating_sub(counted);
    println!("{}", all.to_json());
    Ok(())
}
