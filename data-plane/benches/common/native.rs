//! A keep-alive client, the native engine serving its one connection, and an upstream on
//! real sockets on 127.0.0.1, all on the caller's current-thread runtime: what the native
//! engine's allocation test and its benchmark share.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use holdfast_data_plane::metrics::Metrics;
use holdfast_data_plane::proxy::native::{H1Conn, Timeouts};
use holdfast_data_plane::proxy::{ForwardSettings, Forwarder, Via};
use holdfast_data_plane::table::RouteTable;
use holdfast_http::h1::Limits;
use holdfast_http::path::EscapedSlashes;
use holdfast_proto::v1::{Backend, Endpoint, MatchKind, Route, Snapshot, VirtualHost};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const REQUEST: &[u8] = b"GET /api/v1/users/42?page=2 HTTP/1.1\r\nHost: app.example.com\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0)\r\nAccept: application/json\r\nAccept-Encoding: gzip, deflate, br\r\nX-Request-Id: 7f0e2a9c-5b1d-4c3e-9a8f-1d2e3f4a5b6c\r\n\r\n";
pub const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nDate: Sun, 06 Dec 2026 12:00:00 GMT\r\n\r\n{\"id\": 42}\n";

/// A current-thread runtime; `coarse`: with the worker's coarse clock, as the proxy's
/// workers have it.
pub fn runtime(coarse: bool) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    if coarse {
        builder.on_thread_unpark(holdfast_http::clock::turn);
    }
    builder.build().expect("a runtime")
}

/// A route table with one host whose backend is `upstream`.
pub fn table(upstream: SocketAddr) -> RouteTable {
    let s = Snapshot {
        backends: vec![Backend {
            name: "ns/app:80".into(),
            endpoints: vec![Endpoint {
                address: upstream.ip().to_string(),
                port: u32::from(upstream.port()),
                zone: String::new(),
                ready: true,
            }],
            ..Default::default()
        }],
        virtual_hosts: vec![VirtualHost {
            host: "app.example.com".into(),
            routes: vec![Route {
                match_kind: MatchKind::Prefix as i32,
                path: "/".into(),
                backend: "ns/app:80".into(),
                source: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    RouteTable::compile(&s).expect("compiles")
}

pub fn forwarder(table: RouteTable) -> Forwarder {
    let mut registry = prometheus_client::registry::Registry::default();
    Forwarder::new(
        Arc::new(ArcSwapOption::from_pointee(table)),
        ForwardSettings {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(60),
            eject_for: Duration::from_secs(10),
            pool_idle_per_host: 64,
            workers: 1,
            escaped_slashes: EscapedSlashes::Reject,
            verbose_errors: false,
            max_request_body: 0,
            body_read_timeout: Duration::from_secs(60),
            tunnel_idle_timeout: Duration::from_secs(60),
            // The flag's default: the endpoint slot is taken and given back per request.
            max_connections_per_endpoint: 1024,
            allow_upgrade: vec!["websocket".into()],
            trust_forwarded_from: vec![],
            allow_dot_segment_params: false,
            retry_budget: 0.2,
            mirror_timeout: std::time::Duration::from_secs(5),
            max_mirrors_in_flight: 1024,
            loop_token: holdfast_data_plane::proxy::new_loop_token(),
        },
        Metrics::new(&mut registry),
    )
}

/// Answers every request on `stream` with [`RESPONSE`], from a fixed buffer, once its
/// head and its body by Content-Length (if any) are in.
pub async fn upstream(mut stream: TcpStream) {
    let mut buf = [0u8; 8192];
    let mut have = 0;
    loop {
        match stream.read(&mut buf[have..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => have += n,
        }
        while let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
            let whole = end + 4 + body_length(&buf[..end]);
            if have < whole {
                break;
            }
            buf.copy_within(whole..have, 0);
            have -= whole;
            if stream.write_all(RESPONSE).await.is_err() {
                return;
            }
        }
    }
}

/// The Content-Length of a request head (0 without one).
fn body_length(head: &[u8]) -> usize {
    head.split(|b| *b == b'\n')
        .filter_map(|line| {
            let line = std::str::from_utf8(line).ok()?;
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .next()
        .unwrap_or(0)
}

/// A POST whose 5-byte body is sent after its head, once the proxy has had a turn to read
/// the head (so its read of the body has to wait), and its whole response.
// Used by the timer test, not by every target that includes this file.
#[allow(dead_code)]
pub async fn exchange_with_late_body(client: &mut TcpStream, buf: &mut [u8]) {
    client
        .write_all(
            b"POST /api/v1/items HTTP/1.1\r\nHost: app.example.com\r\nContent-Length: 5\r\n\r\n",
        )
        .await
        .expect("head sent");
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    client.write_all(b"hello").await.expect("body sent");
    read_response(client, buf).await;
}

/// One request on `client` and its whole response (its body is the upstream's).
pub async fn exchange(client: &mut TcpStream, buf: &mut [u8]) {
    client.write_all(REQUEST).await.expect("request sent");
    read_response(client, buf).await;
}

/// Reads one whole response (its body is the upstream's) on `client`.
async fn read_response(client: &mut TcpStream, buf: &mut [u8]) {
    let mut have = 0;
    loop {
        let n = client.read(&mut buf[have..]).await.expect("response read");
        assert!(n > 0, "the proxy closed the connection");
        have += n;
        let got = &buf[..have];
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n")
            && got.len() == end + 4 + 11
        {
            assert!(
                got.starts_with(b"HTTP/1.1 200 OK\r\n"),
                "{:?}",
                String::from_utf8_lossy(got)
            );
            assert!(got.ends_with(b"{\"id\": 42}\n"));
            return;
        }
    }
}

/// Starts the upstream and the proxy (serving one client connection with the native
/// engine) on the current runtime; the client's connection and the forwarder.
pub async fn start() -> (TcpStream, Arc<Forwarder>) {
    let backends = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let backend_addr = backends.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = backends.accept().await {
            tokio::spawn(upstream(s));
        }
    });
    let f = Arc::new(forwarder(table(backend_addr)));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let proxy_addr = listener.local_addr().expect("addr");
    let proxy = f.clone();
    tokio::spawn(async move {
        let (stream, peer) = listener.accept().await.expect("accept");
        let conn = H1Conn::new(
            stream,
            &*proxy,
            Limits {
                max_bytes: 65536,
                max_headers: 100,
            },
            Timeouts {
                header_read: Duration::from_secs(10),
                idle: Duration::from_secs(60),
                send: Duration::from_secs(10),
            },
            peer,
            proxy_addr.port(),
        );
        let (_drain, mut draining) = tokio::sync::watch::channel(false);
        let _ = conn.serve(&Via::Http, &mut draining).await;
    });
    let client = TcpStream::connect(proxy_addr).await.expect("connect");
    (client, f)
}
