//! The RouteDiscovery service: the gRPC method, its limits on what a proxy may send,
//! and one task per stream around its [`Subscription`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use futures::StreamExt;
use holdfast_lock::Lock;
use holdfast_proto::v1::{DiscoveryRequest, ProxyStatus};
use holdfast_proto::wire::{DiscoveryResponse, grpc_delta_frames, grpc_message_frames};
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, Streaming};
use tonic::server::NamedService;
use tonic::{Code, Status};

use super::stream::{Answered, Refusal, Step, Subscription};
use crate::authn::{self, Mode};
use crate::state::Shared;

/// The one method of `holdfast.v1.RouteDiscovery`.
pub const STREAM_ROUTES_PATH: &str = "/holdfast.v1.RouteDiscovery/StreamRoutes";
/// A proxy that refused a snapshot as not newer is offered the same content again (at
/// newer progress) at most this often.
pub const REOFFER_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Largest proxy → control plane message accepted. ACKs and NACKs are small; the first
/// request carries the inventory of the proxy's snapshot, about 70 bytes per resource
/// (1.4 MB at 10,000 Ingresses, 14 MB at 100,000).
pub const MAX_REQUEST_BYTES: usize = 32 << 20;
/// Most inventory entries accepted in a first request: room for about 500,000 resources
/// (a cluster of 100,000 Ingresses states about 200,000). Entries are counted on the wire
/// before anything is decoded: a message of tiny entries (a few bytes each on the wire,
/// about 80 in memory once decoded) cannot make a decode allocate gigabytes.
pub const MAX_INVENTORY_ENTRIES: usize = 500_000;
/// How long a stream may take to send its first request; then it is ended with
/// `DEADLINE_EXCEEDED`.
pub const FIRST_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// `DiscoveryRequest.inventory`'s field number.
const INVENTORY_FIELD: u64 = 8;

/// Longest node id accepted (a DNS name's length; ids are host or pod names).
pub const MAX_NODE_ID_BYTES: usize = 253;
/// Longest zone accepted (a label value's length).
pub const MAX_ZONE_BYTES: usize = 63;

/// The route discovery service.
///
/// It is a hand-written gRPC service rather than tonic's generated one so that responses
/// can hand hyper the shared snapshot bytes: tonic's encoder copies every message into a
/// per-stream buffer, which at 1,000 streams meant 1,000 copies of the snapshot in memory.
/// Requests are decoded with tonic's own [`Streaming`]; the bytes on the wire are those of
/// `holdfast.proto`, so generated clients, grpcurl and reflection see no difference.
#[derive(Debug, Clone)]
pub struct Discovery {
    shared: Shared,
    mode: Mode,
    streams: Arc<StreamCounts>,
}

impl Discovery {
    /// Serves snapshots published into `shared` to proxies authenticated by `mode`, at
    /// most `max_streams_per_identity` streams at once per proven identity (or node id).
    pub fn new(shared: Shared, mode: Mode, max_streams_per_identity: usize) -> Self {
        Discovery {
            shared,
            mode,
            streams: Arc::new(StreamCounts {
                max: max_streams_per_identity,
                open: Mutex::new(HashMap::new()),
            }),
        }
    }
}

/// Open streams per identity: one proxy (or one stolen certificate) cannot hold more.
#[derive(Debug)]
struct StreamCounts {
    max: usize,
    open: Mutex<HashMap<String, usize>>,
}

/// One open stream of `identity`, counted until dropped.
struct StreamSlot {
    counts: Arc<StreamCounts>,
    identity: String,
}

impl StreamCounts {
    fn enter(self: &Arc<Self>, identity: &str) -> Option<StreamSlot> {
        let mut open = self.open.locked();
        let n = open.entry(identity.to_owned()).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            counts: self.clone(),
            identity: identity.to_owned(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.locked();
        if let Some(n) = open.get_mut(&self.identity) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.identity);
            }
        }
    }
}

impl NamedService for Discovery {
    const NAME: &'static str = "holdfast.v1.RouteDiscovery";
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Discovery {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> ResponseFuture {
        let (shared, mode, streams) =
            (self.shared.clone(), self.mode.clone(), self.streams.clone());
        Box::pin(async move {
            Ok(stream_routes(shared, mode, streams, request)
                .await
                .unwrap_or_else(|status| status.into_http()))
        })
    }
}

/// Frames sent on one response body: gRPC messages, then the trailers.
type FrameSender = mpsc::Sender<Frame<Bytes>>;

async fn stream_routes(
    shared: Shared,
    mode: Mode,
    streams: Arc<StreamCounts>,
    request: http::Request<tonic::body::Body>,
) -> Result<http::Response<tonic::body::Body>, Status> {
    if request.uri().path() != STREAM_ROUTES_PATH {
        return Err(Status::unimplemented(format!(
            "no method {} on holdfast.v1.RouteDiscovery",
            request.uri().path()
        )));
    }
    if let Some(encoding) = request.headers().get("grpc-encoding")
        && encoding != "identity"
    {
        return Err(Status::unimplemented(format!(
            "request compression {encoding:?} is not supported; send uncompressed messages"
        )));
    }
    let peer = authn::peer_addr(request.extensions())
        .map(|a| a.to_string())
        .unwrap_or_default();
    let extensions = request.extensions().clone();
    // Identity first: a peer whose certificate proves no proxy identity (none at all, or
    // an operator's) is refused before one byte of its stream is read.
    mode.proxy_identities(&extensions).inspect_err(|status| {
        shared.metrics().streams_refused.inc();
        tracing::warn!(%peer, error = %status.message(), "refused a route stream before reading it");
    })?;
    let decoder = RequestDecoder(
        tonic_prost::ProstCodec::<DiscoveryResponse, DiscoveryRequest>::default().decoder(),
    );
    let mut inbound =
        Streaming::new_request(decoder, request.into_body(), None, Some(MAX_REQUEST_BYTES));
    let first = match tokio::time::timeout(FIRST_REQUEST_TIMEOUT, inbound.message()).await {
        Ok(first) => first?
            .ok_or_else(|| Status::invalid_argument("stream closed before the first request"))?,
        Err(_) => {
            shared.metrics().streams_refused.inc();
            return Err(Status::deadline_exceeded(format!(
                "no first request within {FIRST_REQUEST_TIMEOUT:?}"
            )));
        }
    };
    let node = first.node.clone().unwrap_or_default();
    if node.id.is_empty() {
        return Err(Status::invalid_argument(
            "the first request must name the node (node.id)",
        ));
    }
    if node.id.len() > MAX_NODE_ID_BYTES || node.zone.len() > MAX_ZONE_BYTES {
        shared.metrics().streams_refused.inc();
        return Err(Status::invalid_argument(format!(
            "node.id is at most {MAX_NODE_ID_BYTES} bytes and node.zone at most {MAX_ZONE_BYTES}"
        )));
    }
    let proven = mode.check_node(&extensions, &node.id).inspect_err(|status| {
        shared.metrics().streams_refused.inc();
        tracing::warn!(proxy.id = %node.id, %peer, error = %status.message(), "refused a proxy stream");
    })?;
    let who = if proven.identity.is_empty() {
        node.id.clone()
    } else {
        proven.identity.clone()
    };
    let Some(slot) = streams.enter(&who) else {
        shared.metrics().streams_refused.inc();
        tracing::warn!(proxy.id = %node.id, %peer, max = streams.max, "refused a proxy stream: too many streams for this identity");
        return Err(Status::resource_exhausted(format!(
            "{} streams are already open for {who:?}",
            streams.max
        )));
    };
    // Room for one response (head and snapshot) and the trailers: a proxy that does not
    // read holds at most one response in flight.
    let (tx, rx) = mpsc::channel(3);
    tokio::spawn(async move {
        let _slot = slot;
        let end = serve_stream(shared, first, inbound, &tx, peer, proven).await;
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from(end.code() as i32));
        if end.code() != Code::Ok
            && let Ok(message) = HeaderValue::from_str(end.message())
        {
            trailers.insert("grpc-message", message);
        }
        let _ = tx.send(Frame::trailers(trailers)).await;
    });
    let body = http_body_util::StreamBody::new(ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    Ok(response)
}

/// Decodes requests, counting a message's inventory entries on the wire first
/// ([`MAX_INVENTORY_ENTRIES`]).
struct RequestDecoder(tonic_prost::ProstDecoder<DiscoveryRequest>);

impl tonic::codec::Decoder for RequestDecoder {
    type Item = DiscoveryRequest;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<DiscoveryRequest>, Status> {
        use bytes::Buf;
        // The buffer holds exactly one whole message, contiguous.
        let entries = count_field(src.chunk(), INVENTORY_FIELD)
            .ok_or_else(|| Status::invalid_argument("malformed DiscoveryRequest"))?;
        if entries > MAX_INVENTORY_ENTRIES {
            return Err(Status::resource_exhausted(format!(
                "an inventory of at most {MAX_INVENTORY_ENTRIES} entries is accepted"
            )));
        }
        self.0.decode(src)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}

/// How many top-level fields numbered `field` (length-delimited) a protobuf message has,
/// walking its wire format without decoding anything; None if it is malformed.
fn count_field(mut b: &[u8], field: u64) -> Option<usize> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let mut count = 0;
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let skip = match key & 7 {
            0 => {
                varint(&mut b)?;
                0
            }
            1 => 8,
            2 => {
                if key >> 3 == field {
                    count += 1;
                }
                usize::try_from(varint(&mut b)?).ok()?
            }
            5 => 4,
            _ => return None,
        };
        b = b.get(skip..)?;
    }
    Some(count)
}

async fn serve_stream(
    shared: Shared,
    mut first: DiscoveryRequest,
    mut inbound: Streaming<DiscoveryRequest>,
    tx: &FrameSender,
    peer: String,
    proven: authn::Proven,
) -> Status {
    // What the stream keeps of the first request is small: the inventory (megabytes at
    // scale) is taken out, turned into the delta base, and dropped.
    let stated = std::mem::take(&mut first.inventory);
    let node = first.node.clone().unwrap_or_default();
    let id = shared.add_proxy(ProxyStatus {
        id: node.id.clone(),
        identity: proven.identity,
        certificate_serial: proven.serial,
        zone: node.zone.clone(),
        peer_address: peer.clone(),
        connected_since: Some(SystemTime::now().into()),
        acked_version: first.version_info.clone(),
        persist_error: first.persist_error.clone(),
        unbound_listeners: reported_unbound(&first),
        ..Default::default()
    });
    tracing::info!(proxy.id = %node.id, %peer, holds = %first.version_info, "proxy connected");
    let mut published = shared.subscribe();
    let inventory = (first.accepts_deltas && !first.version_info.is_empty())
        .then(|| holdfast_proto::delta::from_wire(&stated).ok())
        .flatten();
    drop(stated);
    let mut subscription = Subscription::new(&first, inventory);
    // A re-offer the subscription deferred: asked again at this instant.
    let mut deferred_until: Option<tokio::time::Instant> = None;
    let mut end = Status::ok("");

    loop {
        let current = published.borrow_and_update().clone();
        if let Some(current) = current {
            match subscription.next(&current, tokio::time::Instant::now()) {
                Step::Idle => {}
                Step::WaitUntil(at) => deferred_until = Some(at),
                Step::TooLarge { version, error } => {
                    tracing::warn!(proxy.id = %node.id, %version, "{error}");
                    shared.metrics().nacks.inc();
                    shared.update_proxy(id, |p| {
                        p.last_nack_version = version;
                        p.last_nack_error = error;
                        p.last_nack_at = Some(SystemTime::now().into());
                    });
                    continue;
                }
                Step::Send { nonce, delta } => {
                    let version = &current.version;
                    let is_delta = delta.is_some();
                    let framed = match delta {
                        Some(bytes) => grpc_delta_frames(version, &nonce, bytes),
                        None => grpc_message_frames(version, &nonce, current.encoded()),
                    };
                    let frames = match framed {
                        Ok(frames) => frames,
                        Err(e) => {
                            tracing::error!(proxy.id = %node.id, %version, "{e}");
                            end = Status::resource_exhausted(e.to_string());
                            break;
                        }
                    };
                    let metrics = shared.metrics();
                    metrics
                        .sent_bytes
                        .inc_by(frames.iter().map(|f| f.len() as u64).sum());
                    if is_delta {
                        metrics.deltas_sent.inc();
                    }
                    let [head, snapshot] = frames;
                    if tx.send(Frame::data(head)).await.is_err()
                        || tx.send(Frame::data(snapshot)).await.is_err()
                    {
                        break;
                    }
                    continue;
                }
            }
        }
        tokio::select! {
            changed = published.changed() => {
                if changed.is_err() { break; }
            }
            _ = async { tokio::time::sleep_until(deferred_until.unwrap_or_else(tokio::time::Instant::now)).await }, if deferred_until.is_some() => {
                deferred_until = None;
            }
            message = inbound.message() => match message {
                Ok(Some(req)) => answered(&shared, id, &node.id, &mut subscription, req),
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(proxy.id = %node.id, %status, "stream error");
                    end = status;
                    break;
                }
            }
        }
    }
    shared.remove_proxy(id);
    tracing::info!(proxy.id = %node.id, %peer, "proxy disconnected");
    end
}

/// Takes a request from proxy `id` into its subscription, and records what it said:
/// metrics, logs and its `ListProxies` entry.
fn answered(
    shared: &Shared,
    id: u64,
    node: &str,
    subscription: &mut Subscription,
    req: DiscoveryRequest,
) {
    let unbound = reported_unbound(&req);
    match subscription.answer(&req, tokio::time::Instant::now()) {
        Answered::Repeat => {
            tracing::info!(proxy.id = %node, persist_error = %req.persist_error, unbound_listeners = ?req.unbound_listeners, "proxy updated its persist or listener state");
            shared.update_proxy(id, |p| {
                p.persist_error = req.persist_error;
                p.unbound_listeners = unbound;
            });
        }
        Answered::Unsolicited => {
            tracing::debug!(proxy.id = %node, "request with no response outstanding; ignored");
        }
        Answered::StaleNonce => {
            tracing::debug!(proxy.id = %node, nonce = %req.response_nonce, "stale nonce; ignored");
        }
        Answered::Acked { version } => {
            if !req.persist_error.is_empty() {
                tracing::warn!(proxy.id = %node, %version, error = %req.persist_error, "proxy serves the snapshot but could not persist it");
            }
            shared.metrics().acks.inc();
            tracing::debug!(proxy.id = %node, %version, "proxy ACKed snapshot");
            shared.update_proxy(id, |p| {
                p.acked_version = req.version_info;
                p.persist_error = req.persist_error;
                p.unbound_listeners = unbound;
            });
        }
        Answered::Nacked {
            version,
            message,
            refusal,
        } => {
            if !req.persist_error.is_empty() {
                tracing::warn!(proxy.id = %node, %version, error = %req.persist_error, "proxy serves the snapshot but could not persist it");
            }
            if refusal == Refusal::Delta {
                shared.metrics().delta_resyncs.inc();
            }
            shared.metrics().nacks.inc();
            tracing::warn!(proxy.id = %node, %version, error = %message, "proxy NACKed snapshot");
            shared.update_proxy(id, |p| {
                p.persist_error = req.persist_error.clone();
                p.unbound_listeners = unbound;
                p.acked_version = req.version_info.clone();
                p.last_nack_version = version;
                p.last_nack_error = message;
                p.last_nack_at = Some(SystemTime::now().into());
            });
        }
    }
}

/// Most Gateway listeners a proxy's report of those it could not bind is kept for.
const MAX_UNBOUND_REPORTED: usize = 1024;

/// The Gateway listeners a request says the proxy could not bind, as kept for
/// `ListProxies` and the Gateways' `Programmed`: a listener name (`<address>:<port>`) is
/// at most 64 bytes, and at most [`MAX_UNBOUND_REPORTED`] are kept. A report past those
/// bounds (no listener is named so) is kept as [`UNBOUND_UNKNOWN`] alone: the proxy then
/// counts as serving no Gateway.
pub fn reported_unbound(req: &DiscoveryRequest) -> Vec<String> {
    let sane = req.unbound_listeners.len() <= MAX_UNBOUND_REPORTED
        && req.unbound_listeners.iter().all(|n| n.len() <= 64);
    if sane {
        req.unbound_listeners.clone()
    } else {
        vec![UNBOUND_UNKNOWN.to_owned()]
    }
}

/// What [`reported_unbound`] keeps of a report past its bounds.
pub const UNBOUND_UNKNOWN: &str = "(report too large)";

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// A proxy's report of the listeners it could not bind is kept as it is within its
    /// bounds (1,024 names of at most 64 bytes); past them, as "unknown" alone, never
    /// truncated (a truncated list could leave out a listener of a Gateway that is then
    /// called Programmed).
    #[test]
    fn a_report_of_unbound_listeners_past_its_bounds_is_kept_as_unknown() {
        let report = |names: Vec<String>| DiscoveryRequest {
            unbound_listeners: names,
            ..Default::default()
        };
        let name = |i: usize, len: usize| format!("{i:0>len$}");
        let full: Vec<String> = (0..MAX_UNBOUND_REPORTED).map(|i| name(i, 64)).collect();
        assert_eq!(reported_unbound(&report(full.clone())), full);
        assert_eq!(reported_unbound(&report(vec![])), Vec::<String>::new());
        let unknown = vec![UNBOUND_UNKNOWN.to_owned()];
        let mut too_many = full;
        too_many.push(name(MAX_UNBOUND_REPORTED, 10));
        assert_eq!(reported_unbound(&report(too_many)), unknown);
        assert_eq!(
            reported_unbound(&report(vec!["127.0.0.1:80".into(), name(0, 65)])),
            unknown,
            "one name too long"
        );
    }

    #[test]
    fn inventory_entries_are_counted_on_the_wire_before_decoding() {
        let request = DiscoveryRequest {
            version_info: "v".into(),
            inventory: vec![Default::default(); 7],
            max_snapshot_bytes: 9,
            node: Some(holdfast_proto::v1::Node {
                id: "p".into(),
                zone: "z".into(),
            }),
            ..Default::default()
        };
        let bytes = request.encode_to_vec();
        assert_eq!(count_field(&bytes, INVENTORY_FIELD), Some(7));
        assert_eq!(count_field(&bytes, 1), Some(1), "the node");
        assert_eq!(
            count_field(&bytes[..bytes.len() - 1], INVENTORY_FIELD),
            None
        );
        assert_eq!(count_field(&[0x0f], INVENTORY_FIELD), None, "wire type 7");
    }
}
