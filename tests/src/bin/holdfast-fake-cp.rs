//! `holdfast-fake-cp`: a stand-in control plane serving one fixed route (and optionally many
//! more, replaced on SIGHUP), for benchmarks that measure the proxy alone (no API server).
//! Not used by the end-to-end suite's real paths.

use clap::Parser;
use holdfast_proto::v1::Snapshot;
use holdfast_tests::fake_control_plane::{FakeControlPlane, snapshot};

/// Serves one Prefix "/" route for `--host` to `--upstream` over RouteDiscovery.
#[derive(Parser, Debug)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Host of the route.
    #[arg(long)]
    host: String,
    /// Upstream endpoint (repeatable).
    #[arg(long, required = true)]
    upstream: Vec<std::net::SocketAddr>,
    /// Certificate (PEM) for the host, served over HTTPS (also as the default
    /// certificate, for clients that send no SNI); with --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Also serve this many more hosts (`h<i>.extra.test`, each "/" to a backend of its
    /// own on the same upstreams), to measure the proxy with a large table loaded.
    #[arg(long, default_value_t = 0)]
    extra_hosts: usize,
    /// On each SIGHUP, push a new snapshot that replaces the whole table: every extra
    /// host goes to a backend of a new name, and host `round<N>.test` (N = 1, 2, ...) is
    /// added, so a client can tell when round N is served. To measure an apply.
    #[arg(long)]
    replace_on_hup: bool,
    /// Also serve a Gateway listener on this address (protocol HTTP) whose host `--host`
    /// has two rules to the same upstreams: `/api` with a request header modifier (set
    /// `x-tenant: blue`, add `x-via: holdfast`, remove `x-request-id`) and a prefix rewrite
    /// to `/v2`, and `/` with no filter. To measure what filters cost per request.
    #[arg(long)]
    filters_listen: Option<std::net::SocketAddr>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cp = FakeControlPlane::start(Some(args.listen)).await?;
    cp.push(table(&args, 0)?);
    eprintln!("listening grpc={}", cp.addr());
    if !args.replace_on_hup {
        return Ok(tokio::signal::ctrl_c().await?);
    }
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut round = 0;
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => return Ok(r?),
            Some(()) = hup.recv() => {
                round += 1;
                cp.push(table(&args, round)?);
                eprintln!("pushed round {round}");
            }
        }
    }
}

/// The snapshot of `round`: round 0 is the table the flags describe; each later round
/// renames every extra host's backend and adds `round<N>.test`.
fn table(args: &Args, round: u64) -> anyhow::Result<Snapshot> {
    let suffix = if round == 0 {
        String::new()
    } else {
        format!("-r{round}")
    };
    let extra: Vec<(String, String)> = (0..args.extra_hosts)
        .map(|i| {
            (
                format!("h{i}.extra.test"),
                format!("extra/svc-{i}{suffix}:80"),
            )
        })
        .collect();
    let marker = format!("round{round}.test");
    let mut routes = vec![(args.host.as_str(), "/", "bench")];
    if round > 0 {
        routes.push((marker.as_str(), "/", "bench"));
    }
    routes.extend(extra.iter().map(|(h, b)| (h.as_str(), "/", b.as_str())));
    let mut backends = vec![("bench", args.upstream.as_slice())];
    backends.extend(
        extra
            .iter()
            .map(|(_, b)| (b.as_str(), args.upstream.as_slice())),
    );
    let mut s = snapshot(round + 1, &routes, &backends);
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let issued = holdfast_tests::tls::Issued {
            cert_pem: std::fs::read_to_string(cert)?,
            key_pem: std::fs::read_to_string(key)?,
        };
        let name = "bench/tls";
        s.certificates = vec![holdfast_tests::tls::certificate_resource(name, &issued)];
        s.default_certificate = name.into();
        for v in s.virtual_hosts.iter_mut().filter(|v| v.host == args.host) {
            v.certificate = name.into();
        }
        holdfast_proto::snapshot::seal(&mut s, round + 1);
    }
    if let Some(at) = args.filters_listen {
        filters_listener(&mut s, at, &args.host);
        holdfast_proto::snapshot::seal(&mut s, round + 1);
    }
    Ok(s)
}

/// Adds `--filters-listen`'s Gateway listener and its host (see [`Args`]).
fn filters_listener(s: &mut Snapshot, at: std::net::SocketAddr, host: &str) {
    use holdfast_proto::snapshot::{gateway_host_name, listener_name};
    use holdfast_proto::v1::{
        GatewayHost, GatewayListener, GatewayRef, GatewayRoute, HeaderMatch, HeaderModifier,
        MatchKind, PathModifier, UrlRewrite, WeightedBackend,
    };
    let name = listener_name(&at.ip().to_string(), u32::from(at.port()));
    s.gateway_listeners.push(GatewayListener {
        name: name.clone(),
        address: at.ip().to_string(),
        port: u32::from(at.port()),
        protocol: "HTTP".into(),
        gateway: Some(GatewayRef {
            namespace: "bench".into(),
            name: "filters".into(),
            generation: 1,
        }),
        ..Default::default()
    });
    let pair = |n: &str, v: &str| HeaderMatch {
        name: n.into(),
        value: v.into(),
    };
    let rule = |path: &str| GatewayRoute {
        match_kind: MatchKind::Prefix as i32,
        path: path.into(),
        backends: vec![WeightedBackend {
            backend: "bench".into(),
            weight: 1,
            ..Default::default()
        }],
        ..Default::default()
    };
    let filtered = GatewayRoute {
        request_headers: Some(HeaderModifier {
            set: vec![pair("x-tenant", "blue")],
            add: vec![pair("x-via", "holdfast")],
            remove: vec!["x-request-id".into()],
        }),
        rewrite: Some(UrlRewrite {
            hostname: String::new(),
            path: Some(PathModifier {
                full: false,
                value: "/v2".into(),
                captures: false,
            }),
        }),
        ..rule("/api")
    };
    s.gateway_hosts.push(GatewayHost {
        name: gateway_host_name(&name, host),
        listener: name.clone(),
        host: host.into(),
        routes: vec![filtered, rule("/")],
        ..Default::default()
    });
}
