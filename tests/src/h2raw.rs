//! Raw HTTP/2 frames for abuse tests: what a well-behaved client library will not send
//! (a reset after every request, a header block that never ends, a PING flood), written
//! byte by byte to a plaintext or TLS connection.

use std::net::SocketAddr;
use std::time::Duration;

use holdfast_lock::Lock;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Frame type DATA (RFC 9113 §6.1).
pub const DATA: u8 = 0x0;
/// Frame type HEADERS (§6.2).
pub const HEADERS: u8 = 0x1;
/// Frame type RST_STREAM (§6.4).
pub const RST_STREAM: u8 = 0x3;
/// Frame type SETTINGS (§6.5).
pub const SETTINGS: u8 = 0x4;
/// Frame type PING (§6.7).
pub const PING: u8 = 0x6;
/// Frame type GOAWAY (§6.8).
pub const GOAWAY: u8 = 0x7;
/// Frame type CONTINUATION (§6.10).
pub const CONTINUATION: u8 = 0x9;

/// SETTINGS_MAX_CONCURRENT_STREAMS.
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One frame: the 9-byte header and `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK header block for `GET http://{authority}{path}` (literals, no Huffman).
pub fn get_block(authority: &str, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    push_indexed_name(&mut block, 4, path);
    push_indexed_name(&mut block, 1, authority);
    block
}

/// An HPACK header block for a gRPC call of `path` over https (literals, no Huffman).
pub fn grpc_block(authority: &str, path: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x87]; // :method POST, :scheme https
    push_indexed_name(&mut block, 4, path);
    push_indexed_name(&mut block, 1, authority);
    // content-type is static index 31: 4-bit prefix 15, then 16.
    block.extend_from_slice(&[0x0f, 0x10, 16]);
    block.extend_from_slice(b"application/grpc");
    block.extend_from_slice(&[0x00, 2]);
    block.extend_from_slice(b"te");
    block.push(8);
    block.extend_from_slice(b"trailers");
    block
}

/// A literal header field without indexing whose name is static-table entry `index`
/// (< 15) and whose value is shorter than 127 bytes.
fn push_indexed_name(block: &mut Vec<u8>, index: u8, value: &str) {
    assert!(index < 15 && value.len() < 127);
    block.push(index);
    block.push(value.len() as u8);
    block.extend_from_slice(value.as_bytes());
}

/// A plaintext (h2c prior knowledge) connection to `addr`, preface and SETTINGS sent.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpStream> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    start(&mut s).await?;
    Ok(s)
}

/// Sends the client preface and an empty SETTINGS frame on `s`.
pub async fn start<S: AsyncWrite + Unpin>(s: &mut S) -> anyhow::Result<()> {
    s.write_all(PREFACE).await?;
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await?;
    Ok(())
}

/// One frame the server sent.
#[derive(Debug, Clone)]
pub struct Frame {
    /// When it arrived, since the reading started (see [`frames_until_closed`]).
    pub at: Duration,
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream identifier.
    pub stream: u32,
    /// Payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a GOAWAY frame.
    pub fn goaway_code(&self) -> Option<u32> {
        let p = &self.payload;
        (self.kind == GOAWAY && p.len() >= 8).then(|| u32::from_be_bytes([p[4], p[5], p[6], p[7]]))
    }
}

/// Reads one frame, or None once the connection ends (or fails).
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Option<Frame> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.ok()?;
    Some(Frame {
        at: Duration::ZERO,
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    })
}

/// Every frame the server sends on `stream` until it closes the connection, each with
/// the time since `since` it arrived, and when the connection closed; an error if it is
/// still open at `since + limit`.
pub async fn frames_until_closed<S: AsyncRead + Unpin>(
    stream: &mut S,
    since: std::time::Instant,
    limit: Duration,
) -> anyhow::Result<(Vec<Frame>, Duration)> {
    let mut frames = Vec::new();
    loop {
        let left = limit.saturating_sub(since.elapsed());
        match tokio::time::timeout(left, read_frame(stream)).await {
            Err(_) => anyhow::bail!("the connection was still open after {limit:?}: {frames:?}"),
            Ok(None) => return Ok((frames, since.elapsed())),
            Ok(Some(mut f)) => {
                f.at = since.elapsed();
                frames.push(f);
            }
        }
    }
}

/// How the server answered one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A response head whose `:status` is a static-table entry (200, 204, 206, 304, 400,
    /// 404 or 500: what a client can read without decoding HPACK strings).
    Status(u16),
    /// A response head whose `:status` is encoded otherwise (its header block).
    OtherHead(Vec<u8>),
    /// RST_STREAM with this error code.
    Reset(u32),
    /// GOAWAY with this error code.
    GoAway(u32),
}

/// The server's answer to `stream` on `s`: its response head, a reset, or a GOAWAY; an
/// error if none comes within `limit` or the connection ends first. Other frames (SETTINGS,
/// WINDOW_UPDATE, other streams) are skipped; SETTINGS are acknowledged.
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    stream: u32,
    limit: Duration,
) -> anyhow::Result<Answer> {
    let until = tokio::time::Instant::now() + limit;
    loop {
        let Ok(next) = tokio::time::timeout_at(until, read_frame(s)).await else {
            anyhow::bail!("no answer on stream {stream} within {limit:?}");
        };
        let Some(f) = next else {
            anyhow::bail!("the connection ended before stream {stream} was answered");
        };
        match f.kind {
            SETTINGS if f.flags & 0x1 == 0 => s.write_all(&frame(SETTINGS, 0x1, 0, &[])).await?,
            GOAWAY => return Ok(Answer::GoAway(f.goaway_code().unwrap_or(u32::MAX))),
            RST_STREAM if f.stream == stream && f.payload.len() == 4 => {
                let p = &f.payload;
                return Ok(Answer::Reset(u32::from_be_bytes([p[0], p[1], p[2], p[3]])));
            }
            HEADERS if f.stream == stream => return Ok(status_of(&f.payload, f.flags)),
            _ => {}
        }
    }
}

/// `:status` of a response header block: the first field after any table size update.
fn status_of(payload: &[u8], flags: u8) -> Answer {
    // PADDED (0x8) and PRIORITY (0x20) come before the block.
    let mut block = payload;
    if flags & 0x8 != 0 {
        let pad = usize::from(block.first().copied().unwrap_or(0));
        block = block.get(1..block.len().saturating_sub(pad)).unwrap_or(&[]);
    }
    if flags & 0x20 != 0 {
        block = block.get(5..).unwrap_or(&[]);
    }
    let mut i = 0;
    // Dynamic table size updates: 001xxxxx, a 5-bit prefix integer.
    while block.get(i).is_some_and(|b| b & 0xe0 == 0x20) {
        if block[i] & 0x1f == 0x1f {
            i += 1;
            while block.get(i).is_some_and(|b| b & 0x80 != 0) {
                i += 1;
            }
        }
        i += 1;
    }
    let statuses = [200, 204, 206, 304, 400, 404, 500];
    match block.get(i) {
        Some(b) if (0x88..=0x8e).contains(b) => Answer::Status(statuses[usize::from(b - 0x88)]),
        _ => Answer::OtherHead(block.to_vec()),
    }
}

/// A gRPC message: the 5-byte prefix (not compressed, length) and `message`.
pub fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// What the server sent while a flood ran.
#[derive(Debug, Default)]
pub struct Flooded {
    /// Bytes of the flood written before the server stopped reading or closed.
    pub written: usize,
    /// The settings of the server's first SETTINGS frame.
    pub settings: Vec<(u16, u32)>,
    /// The error code of the server's GOAWAY, if it sent one.
    pub goaway: Option<u32>,
}

/// Writes `frames` to `stream` (whose preface was sent) until the server stops reading
/// or closes, while reading what it sends so that it never blocks on us.
pub async fn flood<S>(stream: S, frames: impl Iterator<Item = Vec<u8>>) -> anyhow::Result<Flooded>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut r, mut w) = tokio::io::split(stream);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Flooded::default()));
    let reader = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut first_settings = true;
            while let Some(f) = read_frame(&mut r).await {
                let mut seen = seen.locked();
                match f.kind {
                    SETTINGS if f.flags & 0x1 == 0 && first_settings => {
                        first_settings = false;
                        seen.settings = f
                            .payload
                            .chunks_exact(6)
                            .map(|s| {
                                (
                                    u16::from_be_bytes([s[0], s[1]]),
                                    u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                                )
                            })
                            .collect();
                    }
                    GOAWAY => seen.goaway = f.goaway_code().or(seen.goaway),
                    _ => {}
                }
            }
        }
    });
    let mut written = 0;
    for frame in frames {
        match tokio::time::timeout(Duration::from_secs(5), w.write_all(&frame)).await {
            Ok(Ok(())) => written += frame.len(),
            _ => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), w.flush()).await;
    // A server that absorbed the flood may keep the connection open: read for a while.
    let abort = reader.abort_handle();
    if tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .is_err()
    {
        abort.abort();
    }
    let mut seen = std::mem::take(&mut *seen.locked());
    seen.written = written;
    Ok(seen)
}
