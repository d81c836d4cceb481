//! `holdfast-echo`: a test upstream that answers every request with its own name.

use clap::Parser;

/// Echo backend for holdfast's tests and demo.
#[derive(Parser, Debug)]
struct Args {
    /// Address to listen on, e.g. 10.200.0.3:8080.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Name this backend answers with.
    #[arg(long)]
    name: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    holdfast_tests::echo::serve(listener, args.name).await?;
    Ok(())
}
