//! End-to-end test support for holdfast: real processes, real sockets, real API server.
//!
//! # Layout
//! - [`cluster`]: a private etcd + kube-apiserver per test (or one shared per test binary),
//!   started through `deploy/local/k8s.sh`, with helpers to stop, SIGKILL and restart each
//!   component and to mint ServiceAccount kubeconfigs.
//! - [`netns`]: test hosts with real, non-loopback addresses inside a network namespace the
//!   test creates (the API server rejects loopback addresses in EndpointSlices), and echo
//!   backends running inside them.
//! - [`echo`]: the echo server those backends run (binary `holdfast-echo`): it answers every
//!   request with its own name, so a test sees which backend served.
//! - [`process`]: our binaries as child processes (logs, signals, restart);
//!   [`control_plane`]: `holdfast-control-plane` on free ports.
//! - [`proxy`]: `holdfast-proxy` as a process; [`fake_control_plane`]: an in-test
//!   RouteDiscovery server that pushes any snapshot (valid or not) and records ACK/NACKs.
//! - [`scenario`]: the world of a fault scenario; [`traffic`]: a bounded traffic driver
//!   that records every status code.
//! - [`subscriber`]: a route-discovery client that ACKs and NACKs like a proxy.
//! - [`faultproxy`]: a TCP fault proxy (refuse, reset, blackhole, latency, cut mid-response).
//! - [`flood`]: silent connections held and re-opened from another loopback address.
//! - [`objects`]: the Kubernetes objects tests create; [`grpcurl`]: the real grpcurl.
//! - [`load`]: the open-loop load driver's schedule and summary (binary `holdfast-load`).
//! - [`http`]: a small HTTP client for admin endpoints and traffic; [`tls`]: a test CA
//!   (rcgen), the certificates it signs, and an HTTPS client that reports ALPN and serial.
//! - [`h2raw`]: raw HTTP/2 frames for abuse tests (resets, floods), plaintext or TLS.
//! - [`wait`]: waiting for a condition with a deadline (tests never sleep to synchronise).
//!
//! Everything here cleans up after itself on drop, including when a test panics; processes
//! left by a test binary that was killed outright are removed by watchdogs and by the next
//! start (see `k8s.sh`).

pub mod balancer;
pub mod cluster;
pub mod control_plane;
pub mod echo;
pub mod fake_control_plane;
pub mod faultproxy;
pub mod flood;
pub mod grpcurl;
pub mod h2raw;
pub mod http;
pub mod load;
pub mod metrics;
pub mod netns;
pub mod objects;
pub mod otelcol;
pub mod pod_agent;
pub mod process;
pub mod proxy;
pub mod scenario;
pub mod subscriber;
pub mod tls;
pub mod traffic;
pub mod wait;

use std::path::PathBuf;

/// `target/e2e-logs/<name>`, made if missing: where a test's processes write their logs.
pub fn e2e_logs(name: &str) -> std::io::Result<PathBuf> {
    let dir = repo_root().join("target/e2e-logs").join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The repository root (the workspace this crate sits in).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Path of a binary built by this workspace (`cargo build --workspace --bins` builds them
/// all; cargo builds this crate's own binaries before running its tests).
///
/// Integration tests run from `target/<profile>/deps/`, and the binaries sit one level up.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe has a directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}
