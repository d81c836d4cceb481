//! TLS passthrough: a Gateway listener of protocol `TLS` with `tls.mode: Passthrough`
//! (its TLSRoutes). The proxy never terminates the TLS connection: it reads the client's
//! first handshake message (the ClientHello) to learn the server name it asks for (SNI),
//! picks that hostname's TLSRoute backend (the Gateway hostname rules: exact, then the
//! longest wildcard, then a listener without a hostname; weights as written), connects to
//! one of its endpoints, sends the bytes it read and then relays both ways until either
//! side closes or the connection is idle for `--idle-timeout` (as upgraded connections).
//! A connection already relayed keeps going when its route is removed, until one side
//! closes or it goes idle.
//!
//! The client controls what is read first, so it is bounded: the ClientHello must arrive
//! within `--header-read-timeout` and be at most [`MAX_HELLO`] bytes. A connection with
//! no ClientHello, no server name, or a name no route serves is closed without a byte
//! sent (what a client learns is only that it was refused), and counted by outcome
//! (`holdfast_proxy_passthrough_connections_total`). Connections count against
//! `--max-connections` with the listener's others.
//!
//! The parsing ([`client_hello_sni`]) is a pure function over the bytes read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::proxy::Forwarder;
use crate::server::ListenSettings;

/// The most bytes of TLS records read before the ClientHello must be whole.
pub const MAX_HELLO: usize = 64 * 1024;
/// The most records a ClientHello may span (clients send one, or two for a large one).
pub const MAX_RECORDS: usize = 16;

/// A TLS record's header: content type, version, length.
const RECORD_HEADER: usize = 5;
/// The content type of handshake records.
const HANDSHAKE: u8 = 22;
/// The handshake type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// The extension type of server_name (RFC 6066).
const SERVER_NAME: u16 = 0;
/// The largest plaintext record (RFC 8446, 5.1).
const MAX_RECORD: usize = 1 << 14;

/// What the bytes read so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not enough yet: read until the bytes are at least this long, then parse again (so
    /// a client sending a byte at a time costs one parse per record, not per byte).
    Incomplete(usize),
    /// A whole ClientHello, with the server name it asks for (lower case), if any.
    Complete(Option<String>),
    /// Not a TLS ClientHello (or one that breaks the format).
    Invalid(&'static str),
}

/// Parses the start of a TLS connection: the handshake records up to a whole
/// ClientHello, and its server_name extension.
pub fn client_hello_sni(bytes: &[u8]) -> Hello {
    // The handshake message, gathered from the records (it may span several).
    let mut message = Vec::new();
    let mut rest = bytes;
    let mut records = 0;
    loop {
        if message.len() >= 4 {
            let len = u32::from_be_bytes([0, message[1], message[2], message[3]]) as usize;
            if message[0] != CLIENT_HELLO {
                return Hello::Invalid("the first handshake message is not a ClientHello");
            }
            if len + 4 > MAX_HELLO {
                return Hello::Invalid("the ClientHello is too large");
            }
            if message.len() >= len + 4 {
                return match server_name(&message[4..4 + len]) {
                    Ok(name) => Hello::Complete(name),
                    Err(why) => Hello::Invalid(why),
                };
            }
        }
        let at = bytes.len() - rest.len();
        if rest.len() < RECORD_HEADER {
            return Hello::Incomplete(at + RECORD_HEADER);
        }
        records += 1;
        if records > MAX_RECORDS {
            return Hello::Invalid("the ClientHello spans too many records");
        }
        if rest[0] != HANDSHAKE {
            return Hello::Invalid("not a TLS handshake record");
        }
        if rest[1] != 3 {
            return Hello::Invalid("not a TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_RECORD {
            return Hello::Invalid("a TLS record length out of range");
        }
        if rest.len() < RECORD_HEADER + len {
            return Hello::Incomplete(at + RECORD_HEADER + len);
        }
        message.extend_from_slice(&rest[RECORD_HEADER..RECORD_HEADER + len]);
        rest = &rest[RECORD_HEADER + len..];
    }
}

/// A cursor over a handshake message; every read is checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("a ClientHello field runs past its end");
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<usize, &'static str> {
        Ok(usize::from(self.take(1)?[0]))
    }

    fn u16(&mut self) -> Result<usize, &'static str> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A field with a length prefix of `width` bytes.
    fn vector(&mut self, width: usize) -> Result<&'a [u8], &'static str> {
        let n = if width == 1 { self.u8()? } else { self.u16()? };
        self.take(n)
    }
}

/// The server name of a ClientHello body (RFC 8446, 4.1.2; RFC 6066, 3): None when it
/// has no server_name extension.
fn server_name(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vector(1)?; // legacy_session_id
    r.vector(2)?; // cipher_suites
    r.vector(1)?; // legacy_compression_methods
    if r.0.is_empty() {
        return Ok(None); // no extensions at all
    }
    let mut extensions = Reader(r.vector(2)?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vector(2)?;
        if kind != usize::from(SERVER_NAME) {
            continue;
        }
        let mut list = Reader(Reader(data).vector(2)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vector(2)?;
            if name_type != 0 {
                continue; // only host_name is defined
            }
            let valid = !name.is_empty()
                && name
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            if !valid {
                return Err("the server name is not a hostname");
            }
            let text = String::from_utf8_lossy(name).to_ascii_lowercase();
            return Ok(Some(text.trim_end_matches('.').to_owned()));
        }
        return Ok(None);
    }
    Ok(None)
}

/// Serves passthrough listener `name` on `listener` until `shutdown` turns true; then
/// stops accepting and lets its connections end (the caller bounds that by the
/// shutdown grace).
pub async fn serve(
    listener: TcpListener,
    forwarder: Arc<Forwarder>,
    name: Arc<str>,
    settings: ListenSettings,
    open: Arc<AtomicUsize>,
    mut shutdown: watch::Receiver<bool>,
) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                forwarder.metrics().accept_errors.inc();
                holdfast_process::admin::accept_backoff(&error).await;
                continue;
            }
        };
        let Some(slot) =
            holdfast_http::inflight::InFlight::enter_below(&open, settings.max_connections)
        else {
            forwarder.metrics().connections_refused.inc();
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (forwarder, name, settings) = (forwarder.clone(), name.clone(), settings.clone());
        connections.spawn(async move {
            let outcome = connection(stream, peer, &forwarder, &name, &settings).await;
            forwarder.metrics().count_passthrough(outcome);
            drop(slot);
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// How a passthrough connection ended (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Relayed to a backend until one side closed or it went idle.
    Forwarded,
    /// No whole ClientHello in time, or not one.
    BadHello,
    /// A ClientHello without a server name.
    NoServerName,
    /// No TLSRoute serves the name (or its backend reference does not resolve).
    NoRoute,
    /// No endpoint of the backend could be connected to (or it has none), or the
    /// backend did not take the ClientHello within `--send-timeout`.
    ConnectFailed,
}

impl Outcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::BadHello => "bad_hello",
            Outcome::NoServerName => "no_server_name",
            Outcome::NoRoute => "no_route",
            Outcome::ConnectFailed => "connect_failed",
        }
    }
}

async fn connection(
    mut client: TcpStream,
    peer: SocketAddr,
    forwarder: &Forwarder,
    listener: &str,
    settings: &ListenSettings,
) -> Outcome {
    let read = async {
        let mut bytes = Vec::with_capacity(2048);
        let mut buf = [0u8; 4096];
        let mut wanted = RECORD_HEADER;
        loop {
            // Parsed again only once the bytes the last parse asked for are here.
            if bytes.len() >= wanted {
                match client_hello_sni(&bytes) {
                    Hello::Incomplete(n) if n <= MAX_HELLO + MAX_RECORDS * RECORD_HEADER => {
                        wanted = n;
                    }
                    Hello::Incomplete(_) | Hello::Invalid(_) => return None,
                    Hello::Complete(name) => return Some((bytes, name)),
                }
            }
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    };
    let Ok(Some((hello, name))) = tokio::time::timeout(settings.header_read_timeout, read).await
    else {
        return Outcome::BadHello;
    };
    let Some(name) = name else {
        return Outcome::NoServerName;
    };
    let Some(mut upstream) = forwarder.passthrough_connect(listener, &name).await else {
        tracing::debug!(%peer, %listener, server_name = %name, "passthrough: no route or endpoint");
        return Outcome::NoRoute;
    };
    let Ok(up) = upstream.as_mut() else {
        return Outcome::ConnectFailed;
    };
    // A backend that takes the connection but never reads is given --send-timeout.
    let sent = tokio::time::timeout(settings.send_timeout, up.stream.write_all(&hello)).await;
    if !matches!(sent, Ok(Ok(()))) {
        return Outcome::ConnectFailed;
    }
    forwarder.tunnels().run(client, &mut up.stream).await;
    Outcome::Forwarded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record (or records of at most `split` bytes each) asking for `sni`.
    fn hello(sni: Option<&str>, split: usize) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        let mut extensions = Vec::new();
        // An unrelated extension first (supported_versions).
        extensions.extend_from_slice(&[0, 43, 0, 3, 2, 3, 4]);
        if let Some(name) = sni {
            let n = name.len() as u16;
            extensions.extend_from_slice(&0u16.to_be_bytes());
            extensions.extend_from_slice(&(n + 5).to_be_bytes());
            extensions.extend_from_slice(&(n + 3).to_be_bytes());
            extensions.push(0);
            extensions.extend_from_slice(&n.to_be_bytes());
            extensions.extend_from_slice(name.as_bytes());
        }
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(&extensions);
        let mut message = vec![CLIENT_HELLO];
        message.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        message.extend_from_slice(&body);
        let mut out = Vec::new();
        for chunk in message.chunks(split) {
            out.extend_from_slice(&[HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn the_server_name_is_read_from_a_whole_client_hello_in_one_record_or_several() {
        for split in [MAX_RECORD, 30, 8] {
            let bytes = hello(Some("ABC.Example.com"), split);
            assert_eq!(
                client_hello_sni(&bytes),
                Hello::Complete(Some("abc.example.com".into())),
                "records of {split}"
            );
            // Every proper prefix is incomplete, never an error or a guess, and asks for
            // more than it has, at most the whole.
            for cut in 0..bytes.len() {
                match client_hello_sni(&bytes[..cut]) {
                    Hello::Incomplete(n) => assert!(n > cut && n <= bytes.len(), "{cut}: {n}"),
                    other => panic!("{cut}: {other:?}"),
                }
            }
        }
        assert_eq!(client_hello_sni(&hello(None, 512)), Hello::Complete(None));
        // More records than a ClientHello needs is refused.
        assert!(matches!(
            client_hello_sni(&hello(Some("a.test"), 1)),
            Hello::Invalid(_)
        ));
    }

    #[test]
    fn what_is_not_a_client_hello_is_invalid_and_never_read_past_its_bounds() {
        assert!(matches!(
            client_hello_sni(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Hello::Invalid(_)
        ));
        // A record that is not a handshake, a length out of range, a message that is not
        // a ClientHello.
        assert!(matches!(
            client_hello_sni(&[23, 3, 3, 0, 5, 1, 2, 3, 4, 5]),
            Hello::Invalid(_)
        ));
        assert!(matches!(
            client_hello_sni(&[22, 3, 1, 0x40, 1]),
            Hello::Invalid(_)
        ));
        assert!(matches!(
            client_hello_sni(&[22, 3, 1, 0, 4, 2, 0, 0, 0]),
            Hello::Invalid(_)
        ));
        // A declared message larger than the cap.
        assert!(matches!(
            client_hello_sni(&[22, 3, 1, 0, 4, 1, 0x10, 0, 0]),
            Hello::Invalid(_)
        ));
        // A server name that is not a hostname.
        let bad = hello(Some("a b"), MAX_RECORD);
        assert!(matches!(client_hello_sni(&bad), Hello::Invalid(_)));
        // Fields whose lengths run past the message: every truncation of a ClientHello's
        // body, relabelled as whole, is refused while a fixed field is cut, has no
        // extensions when cut just before them, and never yields the name unless whole.
        let good = hello(Some("x.test"), MAX_RECORD);
        let body = &good[RECORD_HEADER + 4..];
        let before_extensions = 2 + 32 + 1 + 4 + 2;
        for cut in 0..body.len() {
            let mut message = vec![CLIENT_HELLO, 0, 0, cut as u8];
            message.extend_from_slice(&body[..cut]);
            let mut record = vec![HANDSHAKE, 3, 1, 0, message.len() as u8];
            record.extend_from_slice(&message);
            let got = client_hello_sni(&record);
            if cut < before_extensions {
                assert!(matches!(got, Hello::Invalid(_)), "{cut}: {got:?}");
            } else if cut == before_extensions {
                assert_eq!(got, Hello::Complete(None));
            } else {
                assert!(!matches!(got, Hello::Complete(Some(_))), "{cut}: {got:?}");
            }
        }
    }
}
