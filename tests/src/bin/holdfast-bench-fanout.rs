//! `holdfast-bench-fanout`: how long the control plane's route discovery takes to deliver
//! one snapshot of a given size to M streams, and how much memory its process uses doing
//! it, as M grows.
//!
//! The server is a child process running the control plane's real `Discovery` service
//! (the one `holdfast-control-plane` serves) on a real gRPC listener, with a synthetic
//! snapshot of the requested size published into it; no Kubernetes is involved, so sizes
//! of 10 MB (about 70,000 Ingresses' worth) are cheap to set up. The subscribers are raw
//! HTTP/2 gRPC streams in this process: each receives every response in full, reads only
//! the version and nonce at its head (the snapshot bytes are counted and dropped, never
//! buffered), and ACKs it like a proxy. Each round publishes a changed snapshot and times
//! until every stream has ACKed it. The server's peak RSS (VmHWM) is read from /proc.
//!
//! `holdfast-bench-fanout --sizes-mb 1,10 --streams 1,100,1000 --rounds 5`

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use holdfast_proto::v1::{
    Backend, DiscoveryRequest, Endpoint, IngressRef, MatchKind, Node, Route, Snapshot, VirtualHost,
};

#[derive(Parser, Debug)]
struct Args {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Snapshot sizes to try, in MB (10^6 bytes).
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    sizes_mb: Vec<f64>,
    /// Stream counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    streams: Vec<usize>,
    /// Streams per HTTP/2 connection.
    #[arg(long, default_value_t = 50)]
    streams_per_connection: usize,
    /// Snapshots delivered (and timed) per configuration.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// (internal) Serve route discovery with a synthetic snapshot; a line on stdin
    /// publishes the next one.
    Serve {
        #[arg(long)]
        bytes: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    match args.command {
        Some(Cmd::Serve { bytes }) => runtime.block_on(serve(bytes)),
        None => runtime.block_on(measure(&args)),
    }
}

/// A snapshot of about `bytes` encoded bytes, revision `rev`: hosts of two routes each, a
/// backend of three endpoints per host (the shape of the scale benchmark's Ingresses).
pub fn synthetic_snapshot(bytes: usize, rev: u64) -> Snapshot {
    let mut snapshot = Snapshot::default();
    let mut i = 0usize;
    while snapshot.encoded_len() < bytes {
        // Grow in steps of ~1% so the size lands close to the target.
        for _ in 0..(bytes / 100 / 150).max(1) {
            let (host, backend) = (
                format!("app-{i}.team-{}.example.com", i % 100),
                format!("team-{}/app-{i}:80", i % 100),
            );
            let source = Some(IngressRef {
                namespace: format!("team-{}", i % 100),
                name: format!("app-{i}"),
            });
            let route = |kind: MatchKind, path: &str| Route {
                match_kind: kind as i32,
                path: path.into(),
                backend: backend.clone(),
                source: source.clone(),
            };
            snapshot.virtual_hosts.push(VirtualHost {
                host,
                routes: vec![
                    route(MatchKind::Exact, "/api"),
                    route(MatchKind::Prefix, "/"),
                ],
                ..Default::default()
            });
            snapshot.backends.push(Backend {
                name: backend,
                endpoints: (1..=3)
                    .map(|h| Endpoint {
                        address: format!("10.{}.{}.{h}", (i >> 8) & 255, i & 255),
                        port: 8080,
                        zone: "zone-a".into(),
                        ready: true,
                    })
                    .collect(),
                ..Default::default()
            });
            i += 1;
        }
    }
    // Each revision differs in content (one extra path on the first host).
    let marker = Route {
        match_kind: MatchKind::Exact as i32,
        path: format!("/rev-{rev}"),
        ..snapshot.virtual_hosts[0].routes[0].clone()
    };
    snapshot.virtual_hosts[0].routes.push(marker);
    holdfast_proto::snapshot::seal(&mut snapshot, rev);
    snapshot
}

/// The child: the real `Discovery` service over a real listener.
async fn serve(bytes: usize) -> anyhow::Result<()> {
    use holdfast_control_plane::discovery::Discovery;
    use holdfast_control_plane::metrics::Metrics;
    use holdfast_control_plane::state::{Published, Shared};

    let mut registry = prometheus_client::registry::Registry::default();
    let shared = Shared::new(Metrics::new(&mut registry));
    let mut rev = 1;
    shared.publish(Arc::new(Published::new(synthetic_snapshot(bytes, rev))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!(
        "{} {}",
        listener.local_addr()?,
        shared
            .published()
            .expect("published")
            .encoded()
            .bytes()
            .len()
    );
    let server = tonic::transport::Server::builder()
        .add_service(Discovery::new(
            shared.clone(),
            holdfast_control_plane::authn::Mode::Plaintext,
            usize::MAX,
        ))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    // Commands on stdin: "next" publishes the prepared revision (publishing encodes it
    // once, and is timed); "prepare" builds the following one, outside the timed part, so
    // that building never competes with a fan-out. EOF ends the process.
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    let mut next = None;
    while let Some(line) = lines.next_line().await? {
        match (line.as_str(), next.take()) {
            ("prepare", _) => {
                next = Some(synthetic_snapshot(bytes, rev + 1));
                println!("prepared {}", rev + 1);
            }
            ("next", Some(snapshot)) => {
                rev += 1;
                shared.publish(Arc::new(Published::new(snapshot)));
                println!("published {rev}");
            }
            (other, _) => println!("unexpected command {other:?}"),
        }
    }
    Ok(())
}

/// The parent's handle on a serving child.
struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    addr: String,
    encoded: usize,
}

impl Server {
    fn start(bytes: usize) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["serve", "--bytes", &bytes.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let (addr, encoded) = line
            .trim()
            .split_once(' ')
            .context("server did not start")?;
        Ok(Server {
            addr: addr.to_owned(),
            encoded: encoded.parse()?,
            child,
            stdin,
            stdout,
        })
    }

    /// Sends `command` and checks that the answer starts with `answer`.
    fn command(&mut self, command: &str, answer: &str) -> anyhow::Result<()> {
        writeln!(self.stdin, "{command}")?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if !line.starts_with(answer) {
            bail!("server answered {command:?} with {line:?}");
        }
        Ok(())
    }

    /// Publishes the next revision (built beforehand); returns when it was asked to.
    fn publish_next(&mut self) -> anyhow::Result<Instant> {
        self.command("prepare", "prepared")?;
        let t0 = Instant::now();
        self.command("next", "published")?;
        Ok(t0)
    }

    fn kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Per stream: the latest revision ACKed and when.
type Acks = Arc<Mutex<Vec<(u64, Instant)>>>;

/// Reads the version (field 1) and nonce (field 2) from the head of a `DiscoveryResponse`;
/// they precede the snapshot (field 3) on the wire.
fn version_and_nonce(mut head: &[u8]) -> Option<(String, String)> {
    let (mut version, mut nonce) = (None, None);
    while let (Some(&key), true) = (head.first(), version.is_none() || nonce.is_none()) {
        if key != 0x0a && key != 0x12 {
            break;
        }
        head.advance(1);
        let len = prost::encoding::decode_varint(&mut head).ok()? as usize;
        let value = String::from_utf8(head.get(..len)?.to_vec()).ok()?;
        head.advance(len);
        if key == 0x0a {
            version = Some(value)
        } else {
            nonce = Some(value)
        }
    }
    Some((version?, nonce?))
}

/// gRPC length-prefixed framing of an ACK.
fn framed_ack(node: &Node, version: &str, nonce: &str) -> Bytes {
    let ack = DiscoveryRequest {
        node: Some(node.clone()),
        version_info: version.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    let mut buf = BytesMut::with_capacity(5 + ack.encoded_len());
    buf.put_u8(0);
    buf.put_u32(ack.encoded_len() as u32);
    ack.encode(&mut buf).expect("capacity reserved");
    buf.freeze()
}

/// An HTTP/2 connection's request handle; request bodies are channels of ACK frames.
type Sender = hyper::client::conn::http2::SendRequest<
    StreamBody<ReceiverStream<Result<Frame<Bytes>, std::convert::Infallible>>>,
>;

/// One stream: receives responses without buffering their snapshots and ACKs each.
async fn subscriber(mut send: Sender, addr: String, id: usize, acks: Acks) -> anyhow::Result<()> {
    let node = Node {
        id: format!("fanout-{id}"),
        zone: String::new(),
    };
    let (tx, rx) = mpsc::channel(4);
    tx.send(Ok(Frame::data(framed_ack(&node, "", "")))).await?;
    let request = http::Request::post(format!(
        "http://{addr}/holdfast.v1.RouteDiscovery/StreamRoutes"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(StreamBody::new(ReceiverStream::new(rx)))?;
    send.ready().await?;
    let mut body = send.send_request(request).await?.into_body();
    // Parser state: the prefix of the current message, its remaining length, its head.
    let mut prefix = BytesMut::new();
    let mut remaining = 0usize;
    let mut head = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(mut data) = frame?.into_data() else {
            continue;
        };
        while data.has_remaining() {
            if remaining == 0 && prefix.len() < 5 {
                let take = (5 - prefix.len()).min(data.remaining());
                prefix.put(data.split_to(take));
                if prefix.len() == 5 {
                    remaining =
                        u32::from_be_bytes(prefix[1..5].try_into().expect("4 bytes")) as usize;
                    head.clear();
                }
                if remaining > 0 || prefix.len() < 5 {
                    continue;
                }
            }
            let take = remaining.min(data.remaining());
            if head.len() < 256 {
                head.put(data.slice(..take.min(256 - head.len())));
            }
            data.advance(take);
            remaining -= take;
            if remaining == 0 {
                prefix.clear();
                let (version, nonce) =
                    version_and_nonce(&head).context("response without version and nonce")?;
                tx.send(Ok(Frame::data(framed_ack(&node, &version, &nonce))))
                    .await?;
                let rev = version
                    .split_once('-')
                    .and_then(|(r, _)| r.parse().ok())
                    .unwrap_or(0);
                acks.lock().await[id] = (rev, Instant::now());
            }
        }
    }
    Ok(())
}

/// Waits until every stream has ACKed revision `rev`; the time the last one did.
async fn all_acked(acks: &Acks, rev: u64, limit: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        {
            let acks = acks.lock().await;
            if acks.iter().all(|(r, _)| *r >= rev) {
                return Ok(acks
                    .iter()
                    .map(|(_, t)| *t)
                    .max()
                    .expect("at least one stream"));
            }
        }
        if Instant::now() > deadline {
            bail!("streams did not all ACK revision {rev} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn measure(args: &Args) -> anyhow::Result<()> {
    println!(
        "| snapshot | streams | first delivery to all | change to all ACKed, p50 / max ({} rounds) | server RSS before streams | server peak RSS |",
        args.rounds
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for &mb in &args.sizes_mb {
        for &streams in &args.streams {
            let mut server = Server::start((mb * 1e6) as usize)?;
            let before = server.kib("VmRSS:");
            let acks: Acks = Arc::new(Mutex::new(vec![(0, Instant::now()); streams]));
            let t0 = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for conn in 0..streams.div_ceil(args.streams_per_connection) {
                let tcp = tokio::net::TcpStream::connect(&server.addr).await?;
                tcp.set_nodelay(true)?;
                let (send, connection) =
                    hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                        .initial_stream_window_size(holdfast_proto::client::STREAM_WINDOW)
                        .initial_connection_window_size(holdfast_proto::client::CONNECTION_WINDOW)
                        .handshake(TokioIo::new(tcp))
                        .await?;
                tasks.spawn(async move { connection.await.map_err(anyhow::Error::from) });
                let ids = conn * args.streams_per_connection
                    ..((conn + 1) * args.streams_per_connection).min(streams);
                for id in ids {
                    tasks.spawn(subscriber(
                        send.clone(),
                        server.addr.clone(),
                        id,
                        acks.clone(),
                    ));
                }
            }
            let first = all_acked(&acks, 1, Duration::from_secs(300))
                .await?
                .duration_since(t0);
            let mut times = Vec::new();
            for round in 0..args.rounds {
                let t0 = server.publish_next()?;
                let done = all_acked(&acks, round as u64 + 2, Duration::from_secs(300)).await?;
                times.push(done.duration_since(t0));
            }
            times.sort();
            let peak = server.kib("VmHWM:");
            println!(
                "| {:.1} MB ({} bytes) | {streams} | {:.0} ms | {:.0} / {:.0} ms | {} MiB | {} MiB |",
                server.encoded as f64 / 1e6,
                server.encoded,
                first.as_secs_f64() * 1e3,
                times[times.len() / 2].as_secs_f64() * 1e3,
                times[times.len() - 1].as_secs_f64() * 1e3,
                before / 1024,
                peak / 1024,
            );
            tasks.abort_all();
            drop(server);
        }
    }
    Ok(())
}
