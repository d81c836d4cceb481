//! holdfast's control plane: Ingresses, IngressClasses, Services and EndpointSlices in;
//! complete, versioned route snapshots out, streamed to every proxy over gRPC.
//!
//! # Layout
//! - [`translate`]: the pure function `cluster objects → snapshot` (route semantics).
//! - [`guard`]: bounded destruction: which snapshots are held back (pure).
//! - [`caches`]: watch-fed reflector caches and their sync state (no API calls at build).
//! - [`gateway_api`]: the Gateway API kinds, and what API discovery says of them.
//! - [`claims`]: which namespace owns each host: the ledger the leader records (pure).
//! - [`publisher`]: the reconcile loop: coalesce, build from complete caches, validate,
//!   guard, publish; Events for skipped rules; fresh-read confirmation of holds.
//! - [`state`]: what the parts share: the published snapshot, status, holds, proxies.
//! - [`authn`]: mutual TLS on the gRPC listener, and who may stream routes or call Admin.
//! - [`connection_age`]: a gRPC connection ends after its age (GOAWAY) and grace.
//! - [`discovery`]: the `RouteDiscovery` gRPC stream (ACK/NACK, nonces, shared bytes).
//! - [`admin`]: the `Admin` gRPC service and the HTTP `/healthz`, `/readyz`, `/metrics`.
//! - [`rollout`]: how far one object's change has rolled out to the proxies (pure).
//! - [`status`]: leader election (a Lease) and `status.loadBalancer` of our Ingresses.
//! - [`metrics`], [`config`], [`server`] (wiring).
//! - `fixtures` (tests only): a mocked API server that pins the exact requests made.
//!
//! Logging, the shutdown signal, the node name and the admin HTTP listener are shared with
//! the proxy, in the `holdfast-process` crate (`process/`).

pub mod admin;
pub mod authn;
pub mod caches;
pub mod claims;
pub mod config;
pub mod connection_age;
pub mod discovery;
#[cfg(test)]
mod fixtures;
pub mod gateway_api;
pub mod guard;
pub mod metrics;
pub mod programmed;
pub mod publisher;
pub mod rollout;
pub mod server;
pub mod state;
pub mod status;
pub mod translate;

/// Runs `f`, which may wait a while (an approval waiting for the publishing lock, which a
/// build during a hold keeps for O(snapshot)), so that the runtime's other tasks do not
/// wait for it: on the multi-thread runtime this worker hands its tasks to another first
/// (`block_in_place`); elsewhere (a current-thread runtime in a test, no runtime) `f`
/// just runs. (Builds themselves run on the blocking pool: `publisher::run`.)
pub fn off_runtime<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Work run through `off_runtime` does not hold up the runtime's other tasks: on a
    /// runtime with one worker, a task queued behind the build runs while it does (here
    /// the build waits for that task, so without the hand-off it would never finish).
    #[test]
    fn a_build_off_the_runtime_lets_the_other_tasks_run() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let waited = rt.block_on(async {
            tokio::spawn(async {
                let (tx, rx) = std::sync::mpsc::channel();
                let _other = tokio::spawn(async move {
                    let _ = tx.send(());
                });
                super::off_runtime(|| rx.recv_timeout(Duration::from_secs(10)))
            })
            .await
            .expect("the task")
        });
        assert!(
            waited.is_ok(),
            "the other task did not run during the build"
        );
    }
}
