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
    /// Wait this long before every answer (a slow backend).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Listen with a backlog of 1 and never accept (an endpoint whose connects hang):
    /// once its queue is full, the kernel drops every new SYN.
    #[arg(long)]
    never_accept: bool,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.never_accept {
        let socket = match args.listen {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(args.listen)?;
        let _listener = socket.listen(1)?;
        std::future::pending::<()>().await;
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let delay = std::time::Duration::from_millis(args.delay_ms);
    holdfast_tests::echo::serve_after(listener, args.name, delay).await?;
    Ok(())
}
