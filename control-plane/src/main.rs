//! `holdfast-control-plane`: parse config, set up tracing, run until SIGTERM or Ctrl-C.

use clap::Parser;
use holdfast_control_plane::config::{Args, LogFormat};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// mimalloc: snapshot builds allocate hundreds of thousands of small strings; it builds
/// them faster than the system allocator (see docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = match Args::parse().validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast-control-plane: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.args.log_format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().init(),
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(holdfast_control_plane::shutdown_signal(shutdown.clone()));
    match holdfast_control_plane::server::run(config, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
