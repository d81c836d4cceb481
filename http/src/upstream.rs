//! Upstream connections: where one goes ([`Key`]), an endpoint's number in a worker's
//! idle pool ([`Number`]), and opening one ([`open`]): an ExternalName is resolved and
//! never connected to this host.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use http::uri::Authority;
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
        Number(NUMBERS.lock().unwrap_or_else(|e| e.into_inner()).hold(key))
    }

    /// Gives back one hold of `key`'s number; the last frees it.
    pub fn release(key: &Key) {
        NUMBERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release(key);
    }

    /// Whether `key` has a number now (no compiled table holds an endpoint without one).
    pub fn is_held(key: &Key) -> bool {
        NUMBERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held
            .contains_key(key)
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
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Io(e) | ConnectError::Resolve(Some(e)) => Some(e),
            _ => None,
        }
    }
}

/// A TCP connection to `key` (an ExternalName resolved, never to this host).
pub async fn open(key: &Key) -> Result<TcpStream, ConnectError> {
    match key {
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
