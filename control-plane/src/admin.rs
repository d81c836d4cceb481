//! Operators' interfaces: the `holdfast.v1.Admin` gRPC service and the HTTP admin
//! listener (`/healthz`, `/readyz`, `/metrics`).

use std::sync::Arc;

use holdfast_process::admin::{Page, healthz, metrics, text};
use holdfast_proto::v1::admin_server::Admin;
use holdfast_proto::v1::{
    ApproveHeldSnapshotRequest, ApproveHeldSnapshotResponse, GetChangesRequest, GetSnapshotRequest,
    GetStatusRequest, GetStatusResponse, ListProxiesRequest, ListProxiesResponse, Snapshot,
    SnapshotDelta,
};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tonic::Status;

use crate::state::{ApproveError, Shared};

/// The admin gRPC service.
#[derive(Debug, Clone)]
pub struct AdminService {
    shared: Shared,
}

impl AdminService {
    /// Reports on `shared`.
    pub fn new(shared: Shared) -> Self {
        AdminService { shared }
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn get_snapshot(
        &self,
        _: tonic::Request<GetSnapshotRequest>,
    ) -> Result<tonic::Response<Snapshot>, Status> {
        match self.shared.published() {
            Some(p) => Ok(tonic::Response::new(redacted(p.snapshot()))),
            None => Err(Status::unavailable(format!(
                "no complete snapshot yet; caches not complete: {:?}",
                self.shared.unsynced()
            ))),
        }
    }

    async fn get_changes(
        &self,
        request: tonic::Request<GetChangesRequest>,
    ) -> Result<tonic::Response<SnapshotDelta>, Status> {
        let from = request.into_inner().from_version;
        let Some(current) = self.shared.published() else {
            return Err(Status::unavailable("nothing published yet"));
        };
        let Some(base) = self.shared.recently_published(&from) else {
            return Err(Status::not_found(format!(
                "version {from:?} is not among the {} versions this replica published last (it publishes {}); GetSnapshot returns the whole snapshot",
                crate::state::HISTORY,
                current.version
            )));
        };
        let mut delta = current.delta_since(&base);
        for c in &mut delta.upserted_certificates {
            c.private_key.clear();
        }
        Ok(tonic::Response::new(delta))
    }

    async fn list_proxies(
        &self,
        _: tonic::Request<ListProxiesRequest>,
    ) -> Result<tonic::Response<ListProxiesResponse>, Status> {
        Ok(tonic::Response::new(ListProxiesResponse {
            proxies: self.shared.proxies(),
        }))
    }

    async fn get_status(
        &self,
        _: tonic::Request<GetStatusRequest>,
    ) -> Result<tonic::Response<GetStatusResponse>, Status> {
        Ok(tonic::Response::new(self.shared.status()))
    }

    async fn approve_held_snapshot(
        &self,
        request: tonic::Request<ApproveHeldSnapshotRequest>,
    ) -> Result<tonic::Response<ApproveHeldSnapshotResponse>, Status> {
        let version = request.into_inner().version;
        if version.is_empty() {
            return Err(Status::invalid_argument(
                "name the held version (see GetStatus: held.version)",
            ));
        }
        // Approval waits for the publishing lock, which a build during a hold keeps for
        // O(snapshot): off the runtime, so other requests are served meanwhile.
        match crate::off_runtime(|| self.shared.approve(&version)) {
            Ok(published_version) => Ok(tonic::Response::new(ApproveHeldSnapshotResponse {
                published_version,
            })),
            Err(e @ (ApproveError::NothingHeld | ApproveError::TooLarge)) => {
                Err(Status::failed_precondition(e.to_string()))
            }
            Err(e @ ApproveError::VersionMismatch { .. }) => {
                Err(Status::failed_precondition(e.to_string()))
            }
        }
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve_http(
    listener: TcpListener,
    shared: Shared,
    registry: Arc<Registry>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let handler = move |req: &Request<Incoming>| route(req, &shared, &registry);
    let limits = holdfast_process::admin::Limits::default();
    holdfast_process::admin::serve(listener, limits, handler, shutdown).await;
}

fn route(req: &Request<Incoming>, shared: &Shared, registry: &Registry) -> Page {
    match req.uri().path() {
        "/healthz" => healthz(),
        "/readyz" => match shared.published() {
            Some(p) => text(StatusCode::OK, format!("ready: serving {}\n", p.version)),
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "not ready: no complete snapshot yet; caches not complete: {:?}\n",
                    shared.unsynced()
                ),
            ),
        },
        "/metrics" => metrics(registry),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz, /metrics\n".into(),
        ),
    }
}

/// The snapshot as operators see it: every certificate's private key removed (its
/// fingerprint, subject, DNS names, notAfter and serial stay). The content hash still
/// covers the keys, so it does not match what is shown when the snapshot has certificates.
pub fn redacted(snapshot: &Snapshot) -> Snapshot {
    let mut shown = snapshot.clone();
    for c in &mut shown.certificates {
        c.private_key.clear();
    }
    shown
}
