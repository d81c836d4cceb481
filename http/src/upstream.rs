//! Upstream connections: where one goes ([`Key`]), an endpoint's number in a worker's
//! idle pool ([`Number`]), and opening one ([`open`]): an ExternalName is resolved and
//! never connected to this host, and a backend that speaks TLS ([`Secure`]) gets its
//! handshake, verified as its settings say, before a byte of a request is written.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use holdfast_lock::Lock;
use http::uri::Authority;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// An idle upstream connection older than this is closed, not reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Where an upstream connection goes: an endpoint's address, or a name resolved when
/// connecting (ExternalName backends).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// An endpoint's address (a Service's ready endpoint).
    Addr(SocketAddr),
    /// A DNS name and port (an ExternalName Service), resolved when connecting.
    Name(Authority),
    /// One of the above over TLS: a connection is kept and reused only for the same
    /// destination with the same TLS settings.
    Secure(Arc<Secure>),
}

impl Key {
    /// Where the connection goes, TLS or not.
    pub fn destination(&self) -> &Key {
        match self {
            Key::Secure(s) => &s.to,
            plain => plain,
        }
    }
}

/// A destination reached over TLS, with the settings its handshake is made and verified
/// with (the data plane builds them from the backend's snapshot entry).
pub struct Secure {
    /// The endpoint or name (never `Secure` itself).
    pub to: Key,
    /// The name the certificate is checked against (and sent as SNI when the config
    /// enables it).
    pub name: rustls::pki_types::ServerName<'static>,
    /// Roots, verification and ALPN.
    pub config: Arc<rustls::ClientConfig>,
    /// Equal for equal settings: connections are pooled only with their own settings.
    pub settings: u64,
}

impl std::fmt::Debug for Secure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secure")
            .field("to", &self.to)
            .field("name", &self.name)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Secure {
    fn eq(&self, other: &Self) -> bool {
        self.to == other.to && self.settings == other.settings
    }
}

impl Eq for Secure {}

impl std::hash::Hash for Secure {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.to.hash(state);
        self.settings.hash(state);
    }
}

/// An endpoint's number: the same in every compiled table while any holds the endpoint,
/// and the index of its connections in a worker's idle pool (the native engine's), so a
/// request finds them without hashing its endpoint. Numbers are assigned when a table is
/// compiled ([`Number::of`]) and given back when no table holds the endpoint any more
/// ([`Number::release`]); a number can then be given to another endpoint, so what is
/// kept under a number is kept with its [`Key`] and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Number(u32);

/// The endpoints numbered now: each with its number and how many holders it has.
#[derive(Default)]
struct Numbers {
    held: HashMap<Key, (u32, u32)>,
    free: Vec<u32>,
    next: u32,
}

static NUMBERS: std::sync::LazyLock<Mutex<Numbers>> = std::sync::LazyLock::new(Default::default);

impl Numbers {
    fn hold(&mut self, key: &Key) -> u32 {
        if let Some((n, holders)) = self.held.get_mut(key) {
            *holders += 1;
            return *n;
        }
        let n = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.held.insert(key.clone(), (n, 1));
        n
    }

    fn release(&mut self, key: &Key) {
        let Some((n, holders)) = self.held.get_mut(key) else {
            return;
        };
        *holders -= 1;
        if *holders == 0 {
            let n = *n;
            self.held.remove(key);
            self.free.push(n);
        }
    }
}

impl Number {
    /// `key`'s number, held once more (a compiled backend holds one per endpoint).
    pub fn of(key: &Key) -> Number {
        Number(NUMBERS.locked().hold(key))
    }

    /// Gives back one hold of `key`'s number; the last frees it.
    pub fn release(key: &Key) {
        NUMBERS.locked().release(key);
    }

    /// Whether `key` has a number now (no compiled table holds an endpoint without one).
    pub fn is_held(key: &Key) -> bool {
        NUMBERS.locked().held.contains_key(key)
    }

    /// The number as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Why no connection could be opened.
#[derive(Debug)]
pub enum ConnectError {
    /// Nothing within the connect timeout.
    Timeout,
    /// The name did not resolve, or resolved to nothing.
    Resolve(Option<std::io::Error>),
    /// The name resolved only to addresses that point at this host (loopback,
    /// link-local, unspecified): an ExternalName must not turn the proxy on itself or on
    /// the node's services.
    Refused,
    /// connect(2) failed.
    Io(std::io::Error),
    /// The TLS handshake failed (the certificate did not verify, the peer does not speak
    /// TLS, ...).
    Tls(std::io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Timeout => f.write_str("connect timed out"),
            ConnectError::Resolve(_) => f.write_str("name did not resolve"),
            ConnectError::Refused => {
                f.write_str("name resolved only to loopback or link-local addresses")
            }
            ConnectError::Io(_) => f.write_str("connect failed"),
            ConnectError::Tls(_) => f.write_str("TLS handshake with the upstream failed"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Io(e) | ConnectError::Tls(e) | ConnectError::Resolve(Some(e)) => Some(e),
            _ => None,
        }
    }
}

/// An upstream connection: TCP, or TLS over it.
pub enum Stream {
    /// Cleartext.
    Plain(TcpStream),
    /// TLS (boxed: its state is large).
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    /// The TCP connection under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    /// Sets TCP_NODELAY.
    pub fn set_nodelay(&self, on: bool) -> std::io::Result<()> {
        self.tcp().set_nodelay(on)
    }

    /// Whether an idle connection is still quiet: a read would block. Bytes waiting (or
    /// the end) mean the upstream closed it or sent something unasked: not reusable.
    /// Over TLS the read goes through the session, so records it already holds (a
    /// close_notify) count, and TLS's own messages (a late session ticket) do not. Called
    /// only on a connection about to be reused or dropped: what a read takes is lost.
    pub fn is_quiet(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self {
            Stream::Plain(s) => matches!(s.try_read(&mut probe),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            Stream::Tls(s) => {
                let mut buf = ReadBuf::new(&mut probe);
                let mut cx = Context::from_waker(std::task::Waker::noop());
                Pin::new(&mut **s).poll_read(&mut cx, &mut buf).is_pending()
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// A connection to `key` (an ExternalName resolved, never to this host), its TLS
/// handshake made and verified when `key` is [`Key::Secure`]. The caller bounds the
/// whole of it with its connect timeout.
pub async fn open(key: &Key) -> Result<Stream, ConnectError> {
    match key {
        Key::Secure(secure) => {
            let tcp = connect(&secure.to).await?;
            let _ = tcp.set_nodelay(true);
            let connector = tokio_rustls::TlsConnector::from(secure.config.clone());
            let tls = connector
                .connect(secure.name.clone(), tcp)
                .await
                .map_err(ConnectError::Tls)?;
            Ok(Stream::Tls(Box::new(tls)))
        }
        plain => connect(plain).await.map(Stream::Plain),
    }
}

/// A TCP connection to a plain key.
async fn connect(key: &Key) -> Result<TcpStream, ConnectError> {
    match key {
        Key::Secure(_) => Err(ConnectError::Io(std::io::Error::other(
            "TLS settings wrap a destination, not another TLS key",
        ))),
        Key::Addr(addr) => TcpStream::connect(addr).await.map_err(ConnectError::Io),
        Key::Name(authority) => {
            let host = authority.host();
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let port = authority.port_u16().unwrap_or(80);
            let addrs = tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| ConnectError::Resolve(Some(e)))?;
            let mut last = None;
            let mut refused = false;
            for addr in addrs {
                if points_at_this_host(addr.ip()) {
                    refused = true;
                    continue;
                }
                match TcpStream::connect(addr).await {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = Some(e),
                }
            }
            Err(match last {
                Some(e) => ConnectError::Io(e),
                None if refused => ConnectError::Refused,
                None => ConnectError::Resolve(None),
            })
        }
    }
}

/// Loopback, link-local (metadata services), unspecified: where a resolved ExternalName
/// must not send the proxy.
fn points_at_this_host(ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    match ip {
        std::net::IpAddr::V4(a) => a.is_loopback() || a.is_link_local() || a.is_unspecified(),
        std::net::IpAddr::V6(a) => {
            a.is_loopback() || a.is_unicast_link_local() || a.is_unspecified()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_keeps_its_number_while_held_and_a_freed_number_is_given_again() {
        let a = Key::Addr("10.0.0.1:80".parse().unwrap());
        let b = Key::Addr("10.0.0.2:80".parse().unwrap());
        let c = Key::Name("svc.example:80".parse().unwrap());
        let mut numbers = super::Numbers::default();
        let na = numbers.hold(&a);
        let nb = numbers.hold(&b);
        assert_ne!(na, nb);
        assert_eq!(numbers.hold(&a), na, "a second holder, the same number");
        numbers.release(&a);
        assert_eq!(numbers.hold(&c), 2, "a is still held: c gets a new number");
        numbers.release(&a);
        assert!(!numbers.held.contains_key(&a), "the last holder freed it");
        let d = Key::Addr("10.0.0.4:80".parse().unwrap());
        assert_eq!(numbers.hold(&d), na, "a's number, free again, goes to d");
        assert_eq!(numbers.hold(&b), nb, "b kept its number throughout");
        numbers.release(&b);
        numbers.release(&b);
        numbers.release(&b);
        assert_eq!(numbers.free, vec![nb], "released once per hold, no more");
    }

    #[tokio::test]
    async fn opening_a_connection_says_why_it_could_not() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let Err(e) = open(&Key::Addr(closed)).await else {
            panic!("connected to a closed port");
        };
        assert!(
            matches!(e, ConnectError::Io(ref io) if io.kind() == std::io::ErrorKind::ConnectionRefused),
            "{e:?}"
        );
        // A name (an ExternalName backend) is resolved first; one that resolves only to
        // this host (loopback, link-local) is refused without connecting.
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listening.local_addr().unwrap().port();
        for name in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("169.254.169.254:{port}"),
        ] {
            let Err(e) = open(&Key::Name(name.parse().unwrap())).await else {
                panic!("connected to {name}");
            };
            assert!(matches!(e, ConnectError::Refused), "{name}: {e:?}");
        }
        let Ok(_) = open(&Key::Addr(listening.local_addr().unwrap())).await else {
            panic!("did not connect to a listening address");
        };
    }
}
