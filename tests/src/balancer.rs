//! A TCP round-robin balancer in front of proxies, like a cloud load balancer or a
//! Service: it health-checks each backend's `/readyz` every 100 ms and sends each new
//! connection to the next ready one, splicing bytes both ways.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A running balancer; stops when dropped.
pub struct Balancer {
    /// Where clients connect.
    pub addr: SocketAddr,
    ready: Arc<Mutex<Vec<bool>>>,
    tasks: JoinSet<()>,
}

/// How often backends are health-checked.
const CHECK_EVERY: Duration = Duration::from_millis(100);

impl Balancer {
    /// Balances over `backends`: (traffic address, admin address for `/readyz`).
    pub async fn start(backends: Vec<(SocketAddr, SocketAddr)>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let ready = Arc::new(Mutex::new(vec![false; backends.len()]));
        let mut tasks = JoinSet::new();
        let (checked, targets) = (ready.clone(), backends.clone());
        tasks.spawn(async move {
            loop {
                for (i, (_, admin)) in targets.iter().enumerate() {
                    let ok = matches!(
                        crate::http::get(*admin, "localhost", "/readyz").await,
                        Ok((200, _))
                    );
                    checked.lock().expect("ready lock")[i] = ok;
                }
                tokio::time::sleep(CHECK_EVERY).await;
            }
        });
        let (picked, next) = (ready.clone(), Arc::new(AtomicUsize::new(0)));
        tasks.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let target = {
                    let ready = picked.lock().expect("ready lock");
                    let n = ready.len();
                    let start = next.fetch_add(1, Ordering::Relaxed);
                    (0..n)
                        .map(|k| (start + k) % n)
                        .find(|&i| ready[i])
                        .map(|i| backends[i].0)
                };
                let Some(target) = target else {
                    continue; // nothing ready: the client sees the connection close
                };
                tokio::spawn(splice(client, target));
            }
        });
        Ok(Balancer { addr, ready, tasks })
    }

    /// Which backends the last health checks found ready.
    pub fn ready(&self) -> Vec<bool> {
        self.ready.lock().expect("ready lock").clone()
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

async fn splice(mut client: TcpStream, target: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
