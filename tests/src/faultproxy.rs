//! A TCP fault proxy for putting between a client (the control plane) and a server (the
//! API server), switchable at run time:
//! pass, refuse new connections, reset all connections (SO_LINGER 0), blackhole (accept,
//! forward nothing), added latency, cut each connection after N bytes from the server,
//! drop what the client sends, and stall the connections open so far (a silent partition).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Close the listening socket: new connections are refused (existing ones continue).
    Refuse,
    /// Reset every open connection (RST) and every new one.
    Reset,
    /// Accept, forward nothing either way (existing connections hang too).
    Blackhole,
    /// Forward, delaying each chunk by this long.
    Latency(Duration),
    /// Forward, but cut each connection (RST) once it has carried this many bytes from
    /// the server: responses break mid-way.
    CutAfter(u64),
    /// Forward what the server sends; read and drop what the client sends (a client's
    /// answers, such as a proxy's ACK, are lost).
    DropFromClient,
    /// The connections open when this mode was set forward nothing either way and are
    /// never closed (a dropped conntrack entry, a middlebox's idle timeout: no FIN, no
    /// RST); new connections pass.
    StallExisting,
}

/// A running fault proxy. Dropping it stops it and closes every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped to reset every established connection.
    generation: watch::Sender<u64>,
    /// Bumped each time `StallExisting` is set: a connection opened before the bump
    /// stalls.
    stalls: Arc<AtomicU64>,
    task: JoinHandle<()>,
    stats: Arc<Mutex<Stats>>,
}

/// Counters of what went through.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections cut by `CutAfter`.
    pub cut: u64,
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 (a free port) forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = bind("127.0.0.1:0".parse().expect("valid address"))?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Pass);
        let (generation, gen_rx) = watch::channel(0);
        let stats = Arc::new(Mutex::new(Stats::default()));
        let stalls = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(
            listener,
            addr,
            upstream,
            rx,
            gen_rx,
            stalls.clone(),
            stats.clone(),
        ));
        Ok(FaultProxy {
            addr,
            mode,
            generation,
            stalls,
            task,
            stats,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches mode; takes effect at once for new and existing connections, except
    /// `StallExisting`, which stalls the connections accepted before it was set and lets
    /// new ones pass.
    pub fn set(&self, mode: Mode) {
        if mode == Mode::StallExisting {
            self.stalls.fetch_add(1, Ordering::SeqCst);
        }
        self.mode.send_replace(mode);
    }

    /// Resets (RST) every connection established so far, whatever the mode.
    pub fn reset_existing(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// What went through so far.
    pub fn stats(&self) -> Stats {
        self.stats.lock().expect("stats lock").clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(
    listener: TcpListener,
    addr: SocketAddr,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    generation: watch::Receiver<u64>,
    stalls: Arc<AtomicU64>,
    stats: Arc<Mutex<Stats>>,
) {
    let mut listener = Some(listener);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let current = *mode.borrow_and_update();
        match (current, listener.is_some()) {
            (Mode::Refuse, true) => listener = None,
            (Mode::Refuse, false) => {}
            (_, false) => match bind(addr) {
                Ok(l) => listener = Some(l),
                Err(e) => eprintln!("fault proxy: re-binding {addr}: {e}"),
            },
            _ => {}
        }
        tokio::select! {
            changed = mode.changed() => if changed.is_err() { return },
            accepted = async { listener.as_ref().expect("listening").accept().await }, if listener.is_some() => {
                let Ok((client, _)) = accepted else { continue };
                stats.lock().expect("stats lock").accepted += 1;
                // Its stall epoch is taken at accept, not when its task first runs.
                let born = stalls.load(Ordering::SeqCst);
                conns.spawn(connection(client, upstream, mode.clone(), generation.clone(), (stalls.clone(), born), stats.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    mut generation: watch::Receiver<u64>,
    (stalls, born): (Arc<AtomicU64>, u64),
    stats: Arc<Mutex<Stats>>,
) {
    generation.borrow_and_update();
    let _ = client.set_nodelay(true);
    if *mode.borrow() == Mode::Reset {
        reset(&client);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let mut up_buf = vec![0u8; 64 * 1024];
    let mut down_buf = vec![0u8; 64 * 1024];
    let mut down_bytes: u64 = 0;
    loop {
        let current = *mode.borrow_and_update();
        if current == Mode::Reset {
            break;
        }
        // Blackhole, or a stalled connection: read nothing, forward nothing, until the
        // mode changes.
        let stalled = current == Mode::StallExisting && stalls.load(Ordering::SeqCst) > born;
        let forwarding = current != Mode::Blackhole && !stalled;
        tokio::select! {
            changed = mode.changed() => if changed.is_err() { break },
            _ = generation.changed() => break,
            n = cr.read(&mut up_buf), if forwarding => {
                let Ok(n) = n else { break };
                if n == 0 { let _ = sw.shutdown().await; break; }
                if let Mode::Latency(d) = current { tokio::time::sleep(d).await; }
                if current == Mode::DropFromClient { continue; }
                if sw.write_all(&up_buf[..n]).await.is_err() { break; }
            }
            n = sr.read(&mut down_buf), if forwarding => {
                let Ok(n) = n else { break };
                if n == 0 { let _ = cw.shutdown().await; break; }
                if let Mode::Latency(d) = current { tokio::time::sleep(d).await; }
                let mut chunk = &down_buf[..n];
                let mut cut = false;
                if let Mode::CutAfter(limit) = current {
                    let room = limit.saturating_sub(down_bytes) as usize;
                    if chunk.len() >= room {
                        chunk = &chunk[..room];
                        cut = true;
                    }
                }
                down_bytes += chunk.len() as u64;
                if cw.write_all(chunk).await.is_err() { break; }
                if cut {
                    stats.lock().expect("stats lock").cut += 1;
                    break;
                }
            }
        }
    }
    // Abortive close: the peer sees a reset, as with a dropped connection mid-response.
    if let (Ok(client), Ok(_server)) = (cr.reunite(cw), sr.reunite(sw)) {
        reset(&client);
    }
}
