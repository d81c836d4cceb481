//! `holdfast.v1.RouteDiscovery`: one stream per proxy, state-of-the-world with ACK/NACK.
//!
//! Each stream is its own task holding a `watch` receiver of the published snapshot, so a
//! slow or stuck proxy delays nobody else. A stream has at most one snapshot awaiting its
//! ACK or NACK; when the proxy answers, it is sent the newest snapshot, never a backlog.
//! Responses carry the snapshot's shared encoding.

use std::pin::Pin;
use std::time::SystemTime;

use futures::Stream;
use holdfast_proto::v1::route_discovery_server::RouteDiscovery;
use holdfast_proto::v1::{DiscoveryRequest, ProxyStatus};
use holdfast_proto::wire::{DiscoveryResponse, SnapshotPayload};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::state::Shared;

/// The route discovery service.
#[derive(Debug, Clone)]
pub struct Discovery {
    shared: Shared,
}

impl Discovery {
    /// Serves snapshots published into `shared`.
    pub fn new(shared: Shared) -> Self {
        Discovery { shared }
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RouteDiscovery for Discovery {
    type StreamRoutesStream = ResponseStream;

    async fn stream_routes(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamRoutesStream>, Status> {
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("stream closed before the first request"))?;
        let node = first.node.clone().unwrap_or_default();
        if node.id.is_empty() {
            return Err(Status::invalid_argument(
                "the first request must name the node (node.id)",
            ));
        }
        // Capacity 1: a proxy that does not read holds at most one response in flight.
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(serve_stream(self.shared.clone(), first, inbound, tx, peer));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

async fn serve_stream(
    shared: Shared,
    first: DiscoveryRequest,
    mut inbound: Streaming<DiscoveryRequest>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    peer: String,
) {
    let node = first.node.clone().unwrap_or_default();
    let id = shared.add_proxy(ProxyStatus {
        id: node.id.clone(),
        zone: node.zone.clone(),
        peer_address: peer.clone(),
        connected_since: Some(SystemTime::now().into()),
        acked_version: first.version_info.clone(),
        ..Default::default()
    });
    tracing::info!(proxy.id = %node.id, %peer, holds = %first.version_info, "proxy connected");
    let mut published = shared.subscribe();
    // What the proxy serves, what it refused, and what is in flight (hash, nonce, version).
    let mut serving_hash = first.content_hash.clone();
    let mut rejected_hash = String::new();
    let mut in_flight: Option<(String, String, String)> = None;
    let mut nonce: u64 = 0;

    loop {
        // Send the current snapshot if the proxy neither has nor refused it, and nothing is
        // awaiting its ACK: at most one snapshot is in flight per stream, so a stuck proxy
        // holds no backlog and is sent the newest snapshot once it answers.
        let current = published.borrow_and_update().clone();
        if let (Some(current), None) = (current, &in_flight) {
            let hash = &current.snapshot.content_hash;
            if *hash != serving_hash && *hash != rejected_hash {
                nonce += 1;
                let response = DiscoveryResponse {
                    version_info: current.snapshot.version.clone(),
                    nonce: nonce.to_string(),
                    snapshot: SnapshotPayload::Encoded(current.encoded.clone()),
                };
                in_flight = Some((
                    hash.clone(),
                    nonce.to_string(),
                    current.snapshot.version.clone(),
                ));
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
                continue;
            }
        }
        tokio::select! {
            changed = published.changed() => {
                if changed.is_err() { break; }
            }
            message = inbound.message() => match message {
                Ok(Some(req)) => {
                    let Some((hash, sent_nonce, version)) = in_flight.clone() else {
                        tracing::debug!(proxy.id = %node.id, "request with no response outstanding; ignored");
                        continue;
                    };
                    if req.response_nonce != sent_nonce {
                        tracing::debug!(proxy.id = %node.id, nonce = %req.response_nonce, "stale nonce; ignored");
                        continue;
                    }
                    in_flight = None;
                    match req.error_detail {
                        Some(error) => {
                            rejected_hash = hash;
                            shared.metrics().nacks.inc();
                            tracing::warn!(proxy.id = %node.id, %version, error = %error.message, "proxy NACKed snapshot");
                            shared.update_proxy(id, |p| {
                                p.acked_version = req.version_info.clone();
                                p.last_nack_version = version;
                                p.last_nack_error = error.message;
                                p.last_nack_at = Some(SystemTime::now().into());
                            });
                        }
                        None => {
                            serving_hash = hash;
                            shared.metrics().acks.inc();
                            tracing::debug!(proxy.id = %node.id, %version, "proxy ACKed snapshot");
                            shared.update_proxy(id, |p| p.acked_version = req.version_info);
                        }
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(proxy.id = %node.id, %status, "stream error");
                    break;
                }
            }
        }
    }
    shared.remove_proxy(id);
    tracing::info!(proxy.id = %node.id, %peer, "proxy disconnected");
}
