//! An in-test RouteDiscovery server that pushes whatever snapshots a test gives it (valid or
//! not) and records every request proxies send back. For testing the proxy, which is the
//! part under test there; the real control plane is tested against the real API server.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use holdfast_proto::v1::route_discovery_server::{RouteDiscovery, RouteDiscoveryServer};
use holdfast_proto::v1::{DiscoveryRequest, Snapshot, SnapshotDelta};
use holdfast_proto::wire::{DiscoveryResponse, SnapshotPayload};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// The fake's shared state.
#[derive(Clone, Default)]
struct Inner {
    requests: Arc<Mutex<Vec<DiscoveryRequest>>>,
}

/// What the fake sends: a complete snapshot or a delta.
#[derive(Clone, Debug)]
enum Push {
    Snapshot(Snapshot),
    Delta(SnapshotDelta),
}

/// A running fake control plane; stops when dropped.
pub struct FakeControlPlane {
    addr: SocketAddr,
    inner: Inner,
    snapshots: watch::Sender<Option<Push>>,
    task: tokio::task::JoinHandle<()>,
}

struct Service {
    inner: Inner,
    snapshots: watch::Receiver<Option<Push>>,
}

#[tonic::async_trait]
impl RouteDiscovery for Service {
    type StreamRoutesStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

    async fn stream_routes(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamRoutesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let mut snapshots = self.snapshots.clone();
        let requests = self.inner.requests.clone();
        tokio::spawn(async move {
            let mut nonce = 0u64;
            // Every pushed snapshot is sent (no dedup: the proxy's own checks are tested).
            snapshots.mark_changed();
            loop {
                tokio::select! {
                    changed = snapshots.changed() => {
                        if changed.is_err() { break; }
                        let Some(push) = snapshots.borrow_and_update().clone() else { continue };
                        nonce += 1;
                        let response = match push {
                            Push::Snapshot(s) => DiscoveryResponse {
                                version_info: s.version.clone(),
                                nonce: nonce.to_string(),
                                snapshot: SnapshotPayload::Decoded(Box::new(s)),
                                delta: None,
                            },
                            Push::Delta(d) => DiscoveryResponse {
                                version_info: d.version.clone(),
                                nonce: nonce.to_string(),
                                snapshot: SnapshotPayload::None,
                                delta: Some(Box::new(d)),
                            },
                        };
                        if tx.send(Ok(response)).await.is_err() { break; }
                    }
                    message = inbound.message() => match message {
                        Ok(Some(r)) => requests.lock().expect("lock").push(r),
                        _ => break,
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl FakeControlPlane {
    /// Starts on 127.0.0.1 (free port), or on `addr` if given.
    pub async fn start(addr: Option<SocketAddr>) -> anyhow::Result<Self> {
        let listener =
            tokio::net::TcpListener::bind(addr.unwrap_or(([127, 0, 0, 1], 0).into())).await?;
        let addr = listener.local_addr()?;
        let (snapshots, rx) = watch::channel(None);
        let inner = Inner::default();
        let service = Service {
            inner: inner.clone(),
            snapshots: rx,
        };
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RouteDiscoveryServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        Ok(FakeControlPlane {
            addr,
            inner,
            snapshots,
            task,
        })
    }

    /// `http://ADDR` for `--control-plane`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Pushes `snapshot` to every connected (and later connecting) proxy.
    pub fn push(&self, snapshot: Snapshot) {
        self.snapshots.send_replace(Some(Push::Snapshot(snapshot)));
    }

    /// Pushes `delta` (valid or not) to every connected (and later connecting) proxy.
    pub fn push_delta(&self, delta: SnapshotDelta) {
        self.snapshots.send_replace(Some(Push::Delta(delta)));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.inner.requests.lock().expect("lock").clone()
    }
}

impl Drop for FakeControlPlane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A sealed, valid snapshot at `revision`: Prefix routes `(host, path, backend)` and
/// backends `(name, endpoints)`.
pub fn snapshot(
    revision: u64,
    routes: &[(&str, &str, &str)],
    backends: &[(&str, &[SocketAddr])],
) -> Snapshot {
    use holdfast_proto::v1::{Backend, Endpoint, MatchKind, Route, VirtualHost};
    let mut hosts: Vec<VirtualHost> = Vec::new();
    for (host, path, backend) in routes {
        if !hosts.iter().any(|v| v.host == *host) {
            hosts.push(VirtualHost {
                host: (*host).into(),
                routes: vec![],
                ..Default::default()
            });
        }
        hosts
            .iter_mut()
            .find(|v| v.host == *host)
            .expect("pushed")
            .routes
            .push(Route {
                match_kind: MatchKind::Prefix as i32,
                path: (*path).into(),
                backend: (*backend).into(),
                source: None,
            });
    }
    hosts.sort_by(|a, b| a.host.cmp(&b.host));
    let mut s = Snapshot {
        virtual_hosts: hosts,
        backends: backends
            .iter()
            .map(|(name, eps)| Backend {
                name: (*name).into(),
                endpoints: eps
                    .iter()
                    .map(|a| Endpoint {
                        address: a.ip().to_string(),
                        port: a.port().into(),
                        zone: String::new(),
                        ready: true,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    // Sorted by name, as the protocol says (deltas rebuild that order).
    s.backends.sort_by(|a, b| a.name.cmp(&b.name));
    holdfast_proto::snapshot::seal(&mut s, revision);
    s
}
