//! `holdfast-proxy`: parse config, set up tracing, serve until SIGTERM or Ctrl-C, drain.

use clap::Parser;
use holdfast_data_plane::config::Args;
use holdfast_process::{exit_code, init_tracing, shutdown_signal, usage_error};
use tokio_util::sync::CancellationToken;

/// mimalloc: every request allocates a handful of small buffers (headers, URI, body
/// frames); it serves them faster than the system allocator (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let config = match Args::parse().validate() {
        Ok(c) => c,
        Err(e) => return usage_error("holdfast-proxy", e),
    };
    init_tracing(config.log_format);
    // The control-plane stream and the admin listeners run here; the proxy listeners run
    // on --worker-threads threads of their own (see `run`). Two threads, so that /healthz,
    // /readyz and /metrics answer while the other one compiles a large snapshot.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("holdfast-control")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfast-proxy: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(shutdown_signal(
            shutdown.clone(),
            "shutting down: no new connections; draining in-flight requests",
        ));
        exit_code(holdfast_data_plane::run(config, shutdown).await)
    })
}
