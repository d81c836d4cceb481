//! A route-discovery client that behaves like a proxy: names its node, states what it
//! holds, ACKs or NACKs each response.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use holdfast_proto::client;
use holdfast_proto::v1::{DiscoveryRequest, ErrorDetail, Node, Snapshot};
use holdfast_proto::wire::DiscoveryResponse;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// One subscriber stream.
#[derive(Debug)]
pub struct Subscriber {
    node: Node,
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
    /// The snapshot it serves (last ACKed).
    pub serving: Option<Snapshot>,
}

impl Subscriber {
    /// Connects to `url` as node `id` (over https://, with the test client certificate of
    /// node `id`), stating that it serves `holds`.
    pub async fn connect(url: &str, id: &str, holds: Option<Snapshot>) -> Result<Self> {
        Self::connect_limited(url, id, holds, 0).await
    }

    /// Like [`Subscriber::connect`], stating `max_snapshot_bytes` as a proxy states its
    /// --max-snapshot-bytes (0: no limit).
    pub async fn connect_limited(
        url: &str,
        id: &str,
        holds: Option<Snapshot>,
        max_snapshot_bytes: u64,
    ) -> Result<Self> {
        Self::connect_with(url, id, holds, max_snapshot_bytes, false).await
    }

    /// Like [`Subscriber::connect_limited`]; with `deltas`, it states that it accepts
    /// deltas and the inventory of `holds` (it does not apply deltas itself: a test reads
    /// them from [`Subscriber::next`] and answers them).
    pub async fn connect_with(
        url: &str,
        id: &str,
        holds: Option<Snapshot>,
        max_snapshot_bytes: u64,
        deltas: bool,
    ) -> Result<Self> {
        let channel = crate::tls::Planes::get().channel(url, Some(id)).await?;
        let mut client = client::route_discovery(channel);
        let (tx, rx) = mpsc::channel(16);
        let node = Node {
            id: id.into(),
            zone: "test-zone".into(),
        };
        let inventory = match (&holds, deltas) {
            (Some(s), true) => holdfast_proto::delta::to_wire(&holdfast_proto::delta::inventory(s)),
            _ => Vec::new(),
        };
        tx.send(DiscoveryRequest {
            accepts_deltas: deltas,
            inventory,
            node: Some(node.clone()),
            version_info: holds
                .as_ref()
                .map(|s| s.version.clone())
                .unwrap_or_default(),
            content_hash: holds
                .as_ref()
                .map(|s| s.content_hash.clone())
                .unwrap_or_default(),
            max_snapshot_bytes,
            ..Default::default()
        })
        .await?;
        let rx = client
            .stream_routes(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Subscriber {
            node,
            tx,
            rx,
            serving: holds,
        })
    }

    /// The next response, or None if none arrives within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<DiscoveryResponse>> {
        match tokio::time::timeout(timeout, self.rx.message()).await {
            Err(_) => Ok(None),
            Ok(Ok(Some(r))) => Ok(Some(r)),
            Ok(Ok(None)) => bail!("stream closed by the control plane"),
            Ok(Err(status)) => Err(status.into()),
        }
    }

    /// ACKs `response`: it now serves its snapshot.
    pub async fn ack(&mut self, response: DiscoveryResponse) -> Result<Snapshot> {
        self.ack_persisted(response, "").await
    }

    /// ACKs `response`, saying why it could not be persisted ("" if it was).
    pub async fn ack_persisted(
        &mut self,
        response: DiscoveryResponse,
        persist_error: &str,
    ) -> Result<Snapshot> {
        let nonce = response.nonce.clone();
        let snapshot = response
            .into_snapshot()
            .context("response without a snapshot")?;
        self.tx
            .send(DiscoveryRequest {
                node: Some(self.node.clone()),
                version_info: snapshot.version.clone(),
                response_nonce: nonce,
                content_hash: snapshot.content_hash.clone(),
                error_detail: None,
                persist_error: persist_error.into(),
                ..Default::default()
            })
            .await?;
        self.serving = Some(snapshot.clone());
        Ok(snapshot)
    }

    /// ACKs the response with `nonce` as serving `snapshot` (what a delta made).
    pub async fn ack_with(&mut self, nonce: &str, snapshot: Snapshot) -> Result<()> {
        self.tx
            .send(DiscoveryRequest {
                node: Some(self.node.clone()),
                version_info: snapshot.version.clone(),
                response_nonce: nonce.into(),
                content_hash: snapshot.content_hash.clone(),
                ..Default::default()
            })
            .await?;
        self.serving = Some(snapshot);
        Ok(())
    }

    /// NACKs `response` with `message`; keeps serving what it served.
    pub async fn nack(&mut self, response: &DiscoveryResponse, message: &str) -> Result<()> {
        self.nack_with(response, message, false).await
    }

    /// NACKs `response` as a proxy does a valid snapshot that is not newer than the one
    /// it serves (`ErrorDetail.not_newer`).
    pub async fn nack_not_newer(
        &mut self,
        response: &DiscoveryResponse,
        message: &str,
    ) -> Result<()> {
        self.nack_with(response, message, true).await
    }

    async fn nack_with(
        &mut self,
        response: &DiscoveryResponse,
        message: &str,
        not_newer: bool,
    ) -> Result<()> {
        self.tx
            .send(DiscoveryRequest {
                node: Some(self.node.clone()),
                version_info: self
                    .serving
                    .as_ref()
                    .map(|s| s.version.clone())
                    .unwrap_or_default(),
                response_nonce: response.nonce.clone(),
                content_hash: self
                    .serving
                    .as_ref()
                    .map(|s| s.content_hash.clone())
                    .unwrap_or_default(),
                error_detail: Some(ErrorDetail {
                    message: message.into(),
                    not_newer,
                }),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// Receives and ACKs snapshots until one satisfies `pred`; fails after `timeout`.
    pub async fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Snapshot) -> bool,
    ) -> Result<Snapshot> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(response) = self.next(left).await? else {
                bail!(
                    "no snapshot with {what} within {timeout:?}; serving {:?}",
                    self.serving.as_ref().map(|s| &s.version)
                );
            };
            let snapshot = self.ack(response).await?;
            if pred(&snapshot) {
                return Ok(snapshot);
            }
        }
    }
}

/// Routes of a snapshot's Ingress hosts (in either form) as `(host, path, backend)`.
pub fn routes(s: &Snapshot) -> Vec<(String, String, String)> {
    holdfast_proto::snapshot::ingress_hosts(s)
        .iter()
        .flat_map(|v| {
            v.routes
                .iter()
                .map(move |r| (v.host.clone(), r.path.clone(), r.backend.clone()))
        })
        .collect()
}
