//! `holdfast-proxy`: parse config, set up tracing, serve until SIGTERM or Ctrl-C, drain.

use clap::Parser;
use holdfast_data_plane::config::{Args, LogFormat};
use tracing_subscriber::EnvFilter;

/// mimalloc: every request allocates a handful of small buffers (headers, URI, body
/// frames); it serves them faster than the system allocator (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let config = match Args::parse().validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast-proxy: {e}");
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
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(holdfast_data_plane::shutdown_signal(tx));
        match holdfast_data_plane::run(config, rx).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e:#}");
                std::process::ExitCode::FAILURE
            }
        }
    })
}
