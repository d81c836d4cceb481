//! `holdfast-proxy`: parse config, set up tracing, serve until SIGTERM or Ctrl-C, drain.

use clap::Parser;
use holdfast_data_plane::config::Args;
use holdfast_process::{exit_code, init_tracing, shutdown_signal, usage_error};
use tokio_util::sync::CancellationToken;

/// mimalloc: every request allocates a handful of small buffers (headers, URI, body
/// frames); it serves them faster than the system allocator (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's purge delay, in milliseconds, that the proxy runs with unless
/// `MIMALLOC_PURGE_DELAY` is set: memory goes back to the kernel as it is freed. mimalloc's
/// own default (10 ms) is only acted on when the allocator next runs in that thread, and
/// the request path allocates nothing, so a proxy left idle after applying a large
/// snapshot kept what the apply freed (47.3 against 27.2 MiB once a 10,001-route table was
/// replaced, `tests/bench/proxy-memory.sh`, docs/benchmarks.md).
const PURGE_DELAY_MS: &str = "0";

fn main() -> std::process::ExitCode {
    let config = match Args::parse().validate() {
        Ok(c) => c,
        Err(e) => return usage_error("holdfast-proxy", e),
    };
    // mimalloc reads its options once, before `main`: the only way to set one without
    // unsafe code is to start again with it in the environment. `exec` keeps the process
    // (its pid, its open files, its parent); it returns only when it failed.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        use std::os::unix::process::CommandExt;
        let mut args = std::env::args_os();
        let again = std::env::current_exe().map(|exe| {
            let mut command = std::process::Command::new(exe);
            if let Some(arg0) = args.next() {
                command.arg0(arg0);
            }
            command
                .args(args)
                .env("MIMALLOC_PURGE_DELAY", PURGE_DELAY_MS)
                .exec()
        });
        let why = match again {
            Ok(e) | Err(e) => e,
        };
        eprintln!(
            "holdfast-proxy: could not start again with MIMALLOC_PURGE_DELAY={PURGE_DELAY_MS} ({why}); freed memory goes back to the kernel when the allocator next runs"
        );
    }
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
