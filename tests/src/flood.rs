//! Hostile clients for admin-listener tests: connections that say nothing, held open and
//! re-opened as soon as the server closes them, from a source address of their own.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::task::JoinSet;

/// Keeps `n` silent connections to `target` open from `from` (a loopback address other
/// than 127.0.0.1, so the server sees another peer than the probes), re-opening each one
/// the server closes, until `for_` has passed. Returns how many connections it opened.
pub async fn silent_connections(
    target: SocketAddr,
    from: IpAddr,
    n: usize,
    for_: Duration,
) -> usize {
    let until = Instant::now() + for_;
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        tasks.spawn(async move {
            let mut opened = 0usize;
            while Instant::now() < until {
                let socket = match from {
                    IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                    IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
                };
                let Ok(socket) = socket else { break };
                if socket.bind(SocketAddr::new(from, 0)).is_err() {
                    break;
                }
                let Ok(Ok(mut stream)) =
                    tokio::time::timeout(Duration::from_secs(1), socket.connect(target)).await
                else {
                    // Refused or not accepted in time: try again (bounded by `until`).
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                opened += 1;
                // Silent: wait for the server to close it (or the time to run out).
                let left = until.saturating_duration_since(Instant::now());
                let mut buf = [0u8; 64];
                let _ = tokio::time::timeout(left, async {
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                })
                .await;
            }
            opened
        });
    }
    let mut opened = 0;
    while let Some(r) = tasks.join_next().await {
        // A task that panicked is the test's own failure, not zero connections.
        opened += r.expect("a flooding task panicked");
    }
    opened
}
