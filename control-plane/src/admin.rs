//! Operators' interfaces: the `holdfast.v1.Admin` gRPC service and the HTTP admin
//! listener (`/healthz`, `/readyz`, `/metrics`).

use std::sync::Arc;

use holdfast_process::admin::{Page, healthz, metrics, text};
use holdfast_proto::v1::admin_server::Admin;
use holdfast_proto::v1::{
    ApproveHeldSnapshotRequest, ApproveHeldSnapshotResponse, GetChangesRequest, GetRolloutRequest,
    GetRolloutResponse, GetSnapshotRequest, GetStatusRequest, GetStatusResponse,
    ListProxiesRequest, ListProxiesResponse, Snapshot, SnapshotDelta,
};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tonic::Status;

use crate::state::{ApproveError, Shared};

/// The admin gRPC service.
#[derive(Clone)]
pub struct AdminService {
    shared: Shared,
    /// The caches (the objects `GetRollout` looks up); None in tests of the rest.
    caches: Option<crate::caches::Caches>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").finish_non_exhaustive()
    }
}

impl AdminService {
    /// Reports on `shared`, and on the objects in `caches`.
    pub fn new(shared: Shared, caches: Option<crate::caches::Caches>) -> Self {
        AdminService { shared, caches }
    }
}

/// The kinds `GetRollout` answers for.
const ROLLOUT_KINDS: [&str; 5] = ["Ingress", "HTTPRoute", "GRPCRoute", "TLSRoute", "Gateway"];

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

    async fn get_rollout(
        &self,
        request: tonic::Request<GetRolloutRequest>,
    ) -> Result<tonic::Response<GetRolloutResponse>, Status> {
        let r = request.into_inner();
        let Some(kind) = ROLLOUT_KINDS
            .iter()
            .find(|k| k.eq_ignore_ascii_case(&r.kind))
        else {
            return Err(Status::invalid_argument(format!(
                "kind {:?} is not one of {}",
                r.kind,
                ROLLOUT_KINDS.join(", ")
            )));
        };
        if r.namespace.is_empty() || r.name.is_empty() {
            return Err(Status::invalid_argument(
                "name the object's namespace and name",
            ));
        }
        let Some(caches) = &self.caches else {
            return Err(Status::unavailable("this replica has no caches"));
        };
        let Some((generation, resource_version)) = caches.generation(kind, &r.namespace, &r.name)
        else {
            return Err(Status::not_found(format!(
                "{kind} {}/{} is not in this replica's caches",
                r.namespace, r.name
            )));
        };
        let object = crate::rollout::Object {
            kind: (*kind).to_owned(),
            namespace: r.namespace,
            name: r.name,
            generation,
            resource_version,
        };
        let published = self.shared.published();
        let status = self.shared.status();
        // The build's problems name Ingresses (a Gateway API object's are in its status).
        let problems = status
            .problems
            .into_iter()
            .filter(|p| {
                object.kind == "Ingress" && p.namespace == object.namespace && p.name == object.name
            })
            .collect();
        let stamp = |v: &str| self.shared.stamp(v);
        let connected = self.shared.proxies();
        let departed = self.shared.departed();
        let seen = crate::rollout::Seen {
            published: published
                .as_deref()
                .map(|p| (p.version.as_str(), p.progress.as_slice())),
            stamp: &stamp,
            connected: &connected,
            departed: &departed,
            held: status.held.is_some(),
            problems,
        };
        Ok(tonic::Response::new(crate::rollout::rollout(
            &object, &seen,
        )))
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
