//! `holdfast-control-plane`: parse config, set up tracing, run until SIGTERM or Ctrl-C.

use clap::Parser;
use holdfast_control_plane::config::Args;
use holdfast_process::{exit_code, init_tracing, shutdown_signal, usage_error};
use tokio_util::sync::CancellationToken;

/// mimalloc: snapshot builds allocate hundreds of thousands of small strings; it builds
/// them faster than the system allocator (see docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = match Args::parse().validate() {
        Ok(c) => c,
        Err(e) => return usage_error("holdfast-control-plane", e),
    };
    init_tracing(config.log_format);
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_signal(shutdown.clone(), "shutting down"));
    exit_code(holdfast_control_plane::server::run(config, shutdown).await)
}
