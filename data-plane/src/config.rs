//! Command line and environment, validated once into [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use holdfast_proto::v1::Node;

use crate::proxy::ForwardSettings;
use crate::server::ListenSettings;
use holdfast_http::path::EscapedSlashes;
use holdfast_process::tls;
pub use holdfast_process::{ConfigError, LogFormat};

/// What to do with an escaped `/` or `\` (`%2F`, `%5C`) in a request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EscapedSlashesArg {
    /// 400: a backend that decodes them would see another path than the one routed.
    Reject,
    /// Keep them escaped, inside their segment (for APIs that put `%2F` in paths on
    /// purpose). Safe only if the backend does not decode them before routing.
    Keep,
}

/// Which engine serves HTTP/1.1 (HTTP/2 is always hyper's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum H1Engine {
    /// holdfast's own: each request head parsed once for framing, routing and forwarding.
    Native,
    /// hyper's server and client, with the framing tracker beside them (kept for one
    /// release).
    Hyper,
}

/// holdfast proxy: serves HTTP/1.1 and h2c from the route snapshots of a holdfast control
/// plane, and keeps serving its last applied snapshot (persisted in --state-dir) while the
/// control plane or the Kubernetes API server is down.
#[derive(Debug, Clone, Parser)]
#[command(name = "holdfast-proxy", version)]
pub struct Args {
    /// Address for client traffic (HTTP/1.1 and h2c).
    #[arg(long, env = "HOLDFAST_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Address for HTTPS client traffic (TLS 1.2/1.3, HTTP/1.1 and h2 by ALPN), with the
    /// certificates of the snapshot's virtual hosts, chosen by SNI. Off when unset.
    #[arg(long, env = "HOLDFAST_LISTEN_TLS")]
    pub listen_tls: Option<SocketAddr>,
    /// Address of the admin listener (/healthz, /readyz, /metrics).
    #[arg(long, env = "HOLDFAST_ADMIN_LISTEN", default_value = "0.0.0.0:9901")]
    pub admin_listen: SocketAddr,
    /// Address of the debug listener (/debug/snapshot, /debug/explain). They show every
    /// route, backend and pod address, so the default is loopback (reach it with
    /// `kubectl port-forward`).
    #[arg(long, env = "HOLDFAST_DEBUG_LISTEN", default_value = "127.0.0.1:9902")]
    pub debug_listen: SocketAddr,
    /// Control-plane gRPC URL (https://host:port; http:// only with --insecure-plaintext);
    /// repeat (or comma-separate) for several, tried in turn.
    #[arg(
        long = "control-plane",
        env = "HOLDFAST_CONTROL_PLANE",
        value_delimiter = ',',
        required = true
    )]
    pub control_planes: Vec<String>,
    /// Client certificate chain (PEM) presented to the control plane; its URI or DNS
    /// SANs must include --node-id.
    #[arg(long, env = "HOLDFAST_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "HOLDFAST_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA certificate(s) (PEM) the control plane's serving certificate must chain to.
    #[arg(long, env = "HOLDFAST_CONTROL_PLANE_CA")]
    pub control_plane_ca: Option<PathBuf>,
    /// The name the control plane's certificate must be valid for (default: the host of
    /// each --control-plane URL).
    #[arg(long, env = "HOLDFAST_CONTROL_PLANE_NAME")]
    pub control_plane_name: Option<String>,
    /// How often the TLS files are checked for changes (cert-manager renews in place).
    #[arg(long, env = "HOLDFAST_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,
    /// Allow http:// control-plane URLs (no TLS: routes, and the private keys of the
    /// certificates in them, travel in the clear). Local development only.
    #[arg(long, env = "HOLDFAST_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// Directory for the persisted snapshot (created if missing, mode 0700; the file is
    /// 0600, since it holds the private keys of the snapshot's certificates).
    #[arg(long, env = "HOLDFAST_STATE_DIR")]
    pub state_dir: PathBuf,
    /// This proxy's identity towards the control plane (default: the host name).
    #[arg(long, env = "HOLDFAST_NODE_ID")]
    pub node_id: Option<String>,
    /// Zone this proxy runs in (informational).
    #[arg(long, env = "HOLDFAST_ZONE", default_value = "")]
    pub zone: String,
    /// A client must send a whole request head within this time.
    #[arg(long, env = "HOLDFAST_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
    /// Close a client connection idle (no request, no bytes) for this long.
    #[arg(long, env = "HOLDFAST_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// Timeout for connecting to an upstream endpoint (then the next one is tried once).
    #[arg(long, env = "HOLDFAST_UPSTREAM_CONNECT_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub upstream_connect_timeout: Duration,
    /// Timeout from sending a request upstream to its response head (then 504).
    #[arg(long, env = "HOLDFAST_UPSTREAM_RESPONSE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub upstream_response_timeout: Duration,
    /// How long an endpoint that failed to connect is skipped.
    #[arg(long, env = "HOLDFAST_EJECT_FOR", default_value = "10s", value_parser = humantime::parse_duration)]
    pub eject_for: Duration,
    /// Most request headers accepted.
    #[arg(long, env = "HOLDFAST_MAX_HEADERS", default_value_t = 100)]
    pub max_headers: usize,
    /// Largest request head accepted, in bytes (1024 to 262144: the framing checks read
    /// heads up to 256 KiB, and a larger limit is refused at start rather than left
    /// unchecked).
    #[arg(long, env = "HOLDFAST_MAX_HEADER_BYTES", default_value_t = 65536)]
    pub max_header_bytes: usize,
    /// Largest request body forwarded, in bytes (0: unlimited). A larger Content-Length
    /// gets 413 at once; a chunked body is cut when it passes the limit (413).
    #[arg(long, env = "HOLDFAST_MAX_REQUEST_BODY", default_value_t = 100 * 1024 * 1024)]
    pub max_request_body: u64,
    /// A request body that sends nothing for this long gets 408 and the connection closes.
    #[arg(long, env = "HOLDFAST_BODY_READ_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub body_read_timeout: Duration,
    /// A response write that makes no progress for this long (a client that stopped
    /// reading) closes the connection.
    #[arg(long, env = "HOLDFAST_SEND_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub send_timeout: Duration,
    /// Most client connections open at once, per listening address, all workers together.
    /// Default: as many as --connection-memory holds at their worst (each holding a
    /// partial head of --max-header-bytes; see `connection_bytes`), shared by the
    /// listening addresses. Past it new connections are closed at once and counted in
    /// holdfast_proxy_connections_refused_total; open connections are unaffected. A value
    /// that --connection-memory cannot hold is refused at start.
    #[arg(long, env = "HOLDFAST_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most HTTP/2 streams a client may have open at once on one connection (the
    /// SETTINGS_MAX_CONCURRENT_STREAMS the proxy announces). Each one in flight also takes
    /// a slot of --max-connections (see `connection_bytes`).
    #[arg(
        long,
        env = "HOLDFAST_H2_MAX_CONCURRENT_STREAMS",
        default_value_t = 100
    )]
    pub h2_max_concurrent_streams: u32,
    /// Memory the client connections may take at their worst, in bytes (default 512 MiB):
    /// what the default --max-connections is derived from, and what an explicit one must
    /// fit. The manifests' memory limit counts it (deploy/kubernetes/data-plane.yaml).
    #[arg(long, env = "HOLDFAST_CONNECTION_MEMORY", default_value_t = 512 << 20)]
    pub connection_memory: usize,
    /// On SIGTERM, /readyz fails at once and the listeners keep accepting for this long,
    /// so that load balancers take the proxy out first; then it stops accepting and
    /// drains. The manifests' preStop hook waits as long.
    #[arg(long, env = "HOLDFAST_DRAIN_DELAY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub drain_delay: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, env = "HOLDFAST_SHUTDOWN_GRACE", default_value = "15s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// Most requests in flight to one endpoint (each holds an upstream connection until
    /// its response ends; 0: no cap). More wait up to --upstream-connect-timeout for a
    /// slot, then get 503.
    #[arg(
        long,
        env = "HOLDFAST_MAX_UPSTREAM_CONNECTIONS_PER_ENDPOINT",
        default_value_t = 1024
    )]
    pub max_upstream_connections_per_endpoint: usize,
    /// Idle upstream connections kept per endpoint, by each worker thread.
    #[arg(long, env = "HOLDFAST_UPSTREAM_POOL_IDLE", default_value_t = 64)]
    pub upstream_pool_idle: usize,
    /// Worker threads serving the proxy listeners (default: one per CPU). Each runs a
    /// single-threaded runtime with its own listening socket (SO_REUSEPORT) and upstream
    /// idle pool, like an nginx worker; the control-plane stream and the admin listeners
    /// run on a two-thread control runtime.
    #[arg(long, env = "HOLDFAST_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Requests whose path contains `%2F` or `%5C`: `reject` (400) or `keep` (forwarded
    /// escaped; see the path policy in docs/reference.md for the risk).
    #[arg(
        long,
        env = "HOLDFAST_ESCAPED_SLASHES",
        value_enum,
        default_value = "reject"
    )]
    pub escaped_slashes: EscapedSlashesArg,
    /// The HTTP/1.1 engine: `native` (one parse per request head) or `hyper` (the previous
    /// engine, kept for one release). HTTP/2 is served by hyper either way.
    #[arg(long, env = "HOLDFAST_H1_ENGINE", value_enum, default_value = "native")]
    pub h1_engine: H1Engine,
    /// Error pages (400, 404, 502, 503, 504) say why: the backend, the endpoint address,
    /// the error chain. For development only: without it a client learns the status and
    /// nothing else, and the detail goes to the debug log and /debug/explain.
    #[arg(long, env = "HOLDFAST_VERBOSE_ERRORS")]
    pub verbose_errors: bool,
    /// Upgrade protocols passed through to backends (comma-separated). Other upgrade
    /// requests go upstream as plain requests with Upgrade removed; `h2c` is refused here
    /// and never forwarded.
    #[arg(
        long,
        env = "HOLDFAST_ALLOW_UPGRADE",
        value_delimiter = ',',
        default_value = "websocket"
    )]
    pub allow_upgrade: Vec<String>,
    /// Balancers in front of the proxies whose X-Forwarded-Proto/Host/Port, X-Real-IP and
    /// Forwarded headers are kept (CIDRs, comma-separated; like nginx set_real_ip_from).
    /// From any other peer these headers are replaced with what the proxy saw.
    /// X-Forwarded-For always gets the peer appended.
    #[arg(long, env = "HOLDFAST_TRUST_FORWARDED_FROM", value_delimiter = ',', value_parser = parse_net)]
    pub trust_forwarded_from: Vec<ipnet::IpNet>,
    /// Forward request paths with a dot segment that carries parameters (`/..;/`,
    /// `/.;x/`). Off by default, such requests get 400: Java servlet containers (Tomcat,
    /// Jetty, Spring) drop the parameters and read the segment as `..` or `.`, so
    /// `/public/..;/admin` would reach `/admin` behind a route that only allows
    /// `/public`. Turn it on only if no backend does that.
    #[arg(long, env = "HOLDFAST_ALLOW_DOT_SEGMENT_PARAMS")]
    pub allow_dot_segment_params: bool,
    /// Retries a Gateway rule's retry policy may add, as a share of the requests on
    /// routes with one (0 to 1): each such request earns this much of a retry, a retry
    /// spends one, and at most 10 are saved up. A retry past the budget is not made (and
    /// is counted).
    #[arg(long, env = "HOLDFAST_RETRY_BUDGET", default_value_t = 0.2)]
    pub retry_budget: f64,
    /// How long each copy of a request for a mirror (a Gateway rule's RequestMirror) may
    /// take: its connect, its write and the mirror's status line. A slower one is dropped
    /// and counted; the request it copies never waits for it.
    #[arg(long, env = "HOLDFAST_MIRROR_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub mirror_timeout: Duration,
    /// Most copies for mirrors in flight at once; past that a copy is dropped (and
    /// counted), never queued.
    #[arg(long, env = "HOLDFAST_MAX_MIRRORS_IN_FLIGHT", default_value_t = 1024)]
    pub max_mirrors_in_flight: usize,
    /// Largest snapshot applied, in encoded bytes (default 64 MiB); larger ones are
    /// NACKed and the current one keeps serving. Memory: about three times this while
    /// applying, plus the state file (in a memory-backed volume in deploy/kubernetes).
    #[arg(long, env = "HOLDFAST_MAX_SNAPSHOT_BYTES", default_value_t = 64 << 20)]
    pub max_snapshot_bytes: usize,
    /// Log format (filter with RUST_LOG, default info).
    #[arg(long, env = "HOLDFAST_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Where the access log goes, one line per request: `stdout`, a file (appended to;
    /// created if missing), or `off`. The proxy's own log is on stderr.
    #[arg(long, env = "HOLDFAST_ACCESS_LOG", default_value = "stdout")]
    pub access_log: String,
    /// The access log's format: `json` (one object per line, the fields docs/operating.md lists) or
    /// `combined` (nginx's, for pipelines that parse it).
    #[arg(long, env = "HOLDFAST_ACCESS_LOG_FORMAT", default_value = "json")]
    pub access_log_format: crate::access_log::Format,
    /// Log paths with their query string (off: the path alone; queries often carry
    /// tokens).
    #[arg(long, env = "HOLDFAST_ACCESS_LOG_QUERY")]
    pub access_log_query: bool,
    /// Share of requests logged (0 to 1), spread evenly; errors (a status of 400 or
    /// more, or the proxy's own answer) are always logged.
    #[arg(long, env = "HOLDFAST_ACCESS_LOG_SAMPLE", default_value_t = 1.0)]
    pub access_log_sample: f64,
    /// Lines waiting for the access log's writer at most; past that (the sink is slower
    /// than the traffic) lines are dropped and counted in
    /// holdfast_proxy_access_log_dropped_total. Requests never wait for the log.
    #[arg(long, env = "HOLDFAST_ACCESS_LOG_BUFFER", default_value_t = 16384)]
    pub access_log_buffer: usize,
    /// An OpenTelemetry Collector's OTLP/gRPC endpoint (`http://collector:4317`): the proxy
    /// then sends each request's W3C `traceparent` upstream as its own span's, and
    /// exports the span of each sampled request there. Off when not set (`traceparent`
    /// and `tracestate` pass as they came).
    #[arg(long, env = "HOLDFAST_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Share of new traces sampled (0 to 1); a request that comes with a `traceparent` is
    /// sampled as its parent was.
    #[arg(long, env = "HOLDFAST_TRACE_SAMPLE_RATIO", default_value_t = 1.0)]
    pub trace_sample_ratio: f64,
}

/// Tracing's settings (`--otlp-endpoint`, `--trace-sample-ratio`).
#[derive(Debug, Clone)]
pub struct TracingSettings {
    /// The collector.
    pub endpoint: String,
    /// The share of new traces sampled.
    pub ratio: f64,
}

/// Where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTo {
    /// Standard output.
    Stdout,
    /// This file, appended to.
    File(PathBuf),
}

/// The access log's settings (`--access-log*`); None in [`Config`] when it is off.
#[derive(Debug, Clone)]
pub struct AccessLogSettings {
    /// `--access-log`.
    pub to: AccessLogTo,
    /// `--access-log-format`.
    pub format: crate::access_log::Format,
    /// `--access-log-query`.
    pub query: bool,
    /// `--access-log-sample`.
    pub sample: f64,
    /// `--access-log-buffer`.
    pub buffer: usize,
}

/// A CIDR (`10.0.0.0/8`) or a single address (`10.0.0.1`, `::1`).
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s:?} is not an address or a CIDR (like 10.0.0.0/8)"))
}

/// Validated configuration: one settings value per component, which wiring hands over
/// as it is (nothing is checked or converted again).
#[derive(Debug, Clone)]
pub struct Config {
    /// The addresses listened on.
    pub addresses: Addresses,
    /// Worker threads serving the proxy listeners (`--worker-threads`, default: CPUs).
    pub workers: usize,
    /// The client listeners' limits and timeouts.
    pub listen: ListenSettings,
    /// Forwarding: upstream timeouts, limits, balancing, error pages.
    pub forward: ForwardSettings,
    /// The control-plane stream.
    pub subscribe: SubscribeSettings,
    /// The state file's directory (`--state-dir`).
    pub state_dir: PathBuf,
    /// Largest snapshot accepted, encoded (`--max-snapshot-bytes`).
    pub max_snapshot_bytes: usize,
    /// How long a shutting-down proxy keeps accepting, not ready (`--drain-delay`).
    pub drain_delay: Duration,
    /// `--log-format`.
    pub log_format: LogFormat,
    /// The access log; None when `--access-log off`.
    pub access_log: Option<AccessLogSettings>,
    /// Tracing; None without `--otlp-endpoint`.
    pub tracing: Option<TracingSettings>,
}

/// The addresses the proxy listens on.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    /// HTTP/1.1 and h2c (`--listen`).
    pub listen: SocketAddr,
    /// HTTPS (`--listen-tls`), if served.
    pub listen_tls: Option<SocketAddr>,
    /// `/healthz`, `/readyz`, `/metrics` (`--admin-listen`).
    pub admin: SocketAddr,
    /// `/debug/*` (`--debug-listen`).
    pub debug: SocketAddr,
}

/// The control-plane stream's settings.
#[derive(Debug, Clone)]
pub struct SubscribeSettings {
    /// Control-plane URLs, tried in turn.
    pub control_planes: Vec<String>,
    /// This proxy's identity (`--node-id`, default the hostname) and zone.
    pub node: Node,
    /// The mutual-TLS files; None with `--insecure-plaintext`.
    pub tls: Option<holdfast_process::tls::Files>,
    /// The name the control plane's certificate must have (`--control-plane-name`;
    /// default: the URL's host).
    pub server_name: Option<String>,
    /// How often the TLS files are checked for changes.
    pub tls_reload_interval: Duration,
}

impl Args {
    /// Checks the values together.
    pub fn validate(self) -> Result<Config, ConfigError> {
        for url in &self.control_planes {
            let scheme = url
                .parse::<http::Uri>()
                .ok()
                .filter(|u| u.authority().is_some())
                .and_then(|u| u.scheme_str().map(str::to_owned));
            match scheme.as_deref() {
                Some("https") if self.insecure_plaintext => {
                    return Err(ConfigError::new(
                        "control-plane",
                        format!("{url:?} is https://, but --insecure-plaintext is set"),
                    ));
                }
                Some("http") if !self.insecure_plaintext => {
                    return Err(ConfigError::new(
                        "control-plane",
                        format!(
                            "{url:?} is plaintext http://; use https:// with --tls-cert, --tls-key and --control-plane-ca, or --insecure-plaintext for local development"
                        ),
                    ));
                }
                Some("http" | "https") => {}
                _ => {
                    return Err(ConfigError::new(
                        "control-plane",
                        format!("{url:?} is not an https:// (or http://) URL with a host"),
                    ));
                }
            }
        }
        if let Some(p) = self
            .allow_upgrade
            .iter()
            .find(|p| p.eq_ignore_ascii_case("h2c") || p.trim().is_empty())
        {
            return Err(ConfigError::new(
                "allow-upgrade",
                format!("{p:?} cannot be allowed (h2c upgrades are never forwarded)"),
            ));
        }
        let tls = tls::Flags {
            cert: &self.tls_cert,
            key: &self.tls_key,
            ca: &self.control_plane_ca,
            ca_flag: "control-plane-ca",
            insecure_plaintext: self.insecure_plaintext,
            reload_interval: self.tls_reload_interval,
            needed_by: "the control-plane connection",
        }
        .validate()?;
        for (flag, d) in [
            ("header-read-timeout", self.header_read_timeout),
            ("idle-timeout", self.idle_timeout),
            ("upstream-connect-timeout", self.upstream_connect_timeout),
            ("upstream-response-timeout", self.upstream_response_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(flag, "must be more than 0"));
            }
        }
        if self.max_headers == 0 {
            return Err(ConfigError::new("max-headers", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.retry_budget) {
            return Err(ConfigError::new("retry-budget", "must be from 0 to 1"));
        }
        if !(0.0..=1.0).contains(&self.access_log_sample) {
            return Err(ConfigError::new("access-log-sample", "must be from 0 to 1"));
        }
        if !(0.0..=1.0).contains(&self.trace_sample_ratio) {
            return Err(ConfigError::new(
                "trace-sample-ratio",
                "must be from 0 to 1",
            ));
        }
        let tracing = match self.otlp_endpoint {
            None => None,
            Some(e) if e.starts_with("http://") => Some(TracingSettings {
                endpoint: e,
                ratio: self.trace_sample_ratio,
            }),
            Some(_) => {
                return Err(ConfigError::new(
                    "otlp-endpoint",
                    "must be an http:// URL (http://collector:4317): TLS to the collector is not supported yet (run the collector beside the proxy, or behind a local agent)",
                ));
            }
        };
        if self.access_log_buffer == 0 {
            return Err(ConfigError::new("access-log-buffer", "must be at least 1"));
        }
        let access_log = match self.access_log.as_str() {
            "off" => None,
            "" => {
                return Err(ConfigError::new(
                    "access-log",
                    "must be stdout, off or a file path",
                ));
            }
            to => Some(AccessLogSettings {
                to: if to == "stdout" {
                    AccessLogTo::Stdout
                } else {
                    AccessLogTo::File(PathBuf::from(to))
                },
                format: self.access_log_format,
                query: self.access_log_query,
                sample: self.access_log_sample,
                buffer: self.access_log_buffer,
            }),
        };
        if self.max_header_bytes < 1024 {
            return Err(ConfigError::new(
                "max-header-bytes",
                "must be at least 1024",
            ));
        }
        if self.max_header_bytes > holdfast_http::framing::MAX_HEAD {
            // The framing tracker reads heads up to that size; a larger head would pass
            // to hyper without its framing checked.
            return Err(ConfigError::new(
                "max-header-bytes",
                format!(
                    "must be at most {} (the largest head the framing checks read)",
                    holdfast_http::framing::MAX_HEAD
                ),
            ));
        }
        let per_connection = connection_bytes(self.max_header_bytes);
        let listeners = 1 + usize::from(self.listen_tls.is_some());
        let fits = self.connection_memory / per_connection / listeners;
        if fits == 0 {
            return Err(ConfigError::new(
                "connection-memory",
                format!(
                    "holds no connection: each may take {per_connection} bytes with --max-header-bytes {}",
                    self.max_header_bytes
                ),
            ));
        }
        if let Some(max) = self.max_connections
            && max > fits
        {
            return Err(ConfigError::new(
                "max-connections",
                format!(
                    "{max} per listening address ({listeners}) at up to {per_connection} bytes each need {} MiB, more than --connection-memory ({} MiB); raise --connection-memory (and the memory limit) or lower --max-header-bytes",
                    (max * listeners * per_connection) >> 20,
                    self.connection_memory >> 20
                ),
            ));
        }
        if self.h2_max_concurrent_streams == 0 {
            return Err(ConfigError::new(
                "h2-max-concurrent-streams",
                "must be at least 1",
            ));
        }
        if self.worker_threads == Some(0) {
            return Err(ConfigError::new("worker-threads", "must be at least 1"));
        }
        // The workers' sockets share their address (SO_REUSEPORT), so the kernel would not
        // refuse the second of two listeners on one address: refuse it here.
        if self
            .listen_tls
            .is_some_and(|tls| tls == self.listen && tls.port() != 0)
        {
            return Err(ConfigError::new(
                "listen-tls",
                "must differ from --listen (one address cannot serve both)",
            ));
        }
        let node_id = match &self.node_id {
            Some(id) if id.is_empty() => {
                return Err(ConfigError::new("node-id", "must not be empty"));
            }
            given => holdfast_process::node_name(given.as_deref(), "holdfast-proxy"),
        };
        let workers = self.worker_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        });
        Ok(Config {
            addresses: Addresses {
                listen: self.listen,
                listen_tls: self.listen_tls,
                admin: self.admin_listen,
                debug: self.debug_listen,
            },
            workers,
            listen: ListenSettings {
                header_read_timeout: self.header_read_timeout,
                idle_timeout: self.idle_timeout,
                max_headers: self.max_headers,
                max_header_bytes: self.max_header_bytes,
                shutdown_grace: self.shutdown_grace,
                send_timeout: self.send_timeout,
                max_connections: self.max_connections.unwrap_or(fits),
                h2_max_concurrent_streams: self.h2_max_concurrent_streams,
                native_h1: self.h1_engine == H1Engine::Native,
            },
            forward: ForwardSettings {
                connect_timeout: self.upstream_connect_timeout,
                response_timeout: self.upstream_response_timeout,
                eject_for: self.eject_for,
                pool_idle_per_host: self.upstream_pool_idle,
                workers,
                escaped_slashes: match self.escaped_slashes {
                    EscapedSlashesArg::Reject => EscapedSlashes::Reject,
                    EscapedSlashesArg::Keep => EscapedSlashes::Keep,
                },
                verbose_errors: self.verbose_errors,
                max_connections_per_endpoint: self.max_upstream_connections_per_endpoint,
                tunnel_idle_timeout: self.idle_timeout,
                max_request_body: self.max_request_body,
                body_read_timeout: self.body_read_timeout,
                trust_forwarded_from: self.trust_forwarded_from,
                allow_dot_segment_params: self.allow_dot_segment_params,
                retry_budget: self.retry_budget,
                mirror_timeout: self.mirror_timeout,
                max_mirrors_in_flight: self.max_mirrors_in_flight,
                loop_token: crate::proxy::new_loop_token(),
                allow_upgrade: self
                    .allow_upgrade
                    .iter()
                    .map(|p| p.trim().to_ascii_lowercase())
                    .collect(),
            },
            subscribe: SubscribeSettings {
                control_planes: self.control_planes,
                node: Node {
                    id: node_id,
                    zone: self.zone,
                },
                tls,
                server_name: self.control_plane_name,
                tls_reload_interval: self.tls_reload_interval,
            },
            state_dir: self.state_dir,
            max_snapshot_bytes: self.max_snapshot_bytes,
            drain_delay: self.drain_delay,
            log_format: self.log_format,
            access_log,
            tracing,
        })
    }
}

/// What one slot of --max-connections stands for, in bytes: what one HTTP/1.1 client
/// connection may take at its worst, and what one HTTP/2 stream in flight may. An
/// HTTP/1.1 connection: a partial head of `max_header_bytes` in hyper's read buffer, what
/// the framing tracker keeps beside it (at most 16 KiB: 8 KiB of framing header values,
/// 16 KiB waiting for an upgrade's answer, or an 8 KiB trailer line), plus 48 KiB for the
/// rest (the connection's task and state, hyper's write buffer, rustls' buffers over
/// TLS). Measured with slow heads on one worker: 88 KiB a connection over plain HTTP and
/// 103 KiB over TLS for 60,000-byte heads, 39 and 54 KiB for 1,000-byte ones; this bound
/// is 128 KiB at the default 64 KiB.
///
/// An HTTP/2 connection takes one slot for itself (its partial header block of at most
/// `max_header_bytes`, its frame buffers and HPACK tables), [`h2_window_slots`] more for
/// its receive window once it has a stream (body bytes received and not yet forwarded:
/// at most [`H2_CONNECTION_WINDOW`] for all its streams together), and one per stream in
/// flight (the stream's head of at most `max_header_bytes`, its send buffer of
/// [`H2_SEND_BUFFER`] and its task). A connection holding four stream slots takes more
/// only while an eighth of the slots stay free. A stream that finds no slot is answered
/// 503 (`overloaded`) as soon as its head is decoded, and its head freed with the answer.
pub fn connection_bytes(max_header_bytes: usize) -> usize {
    max_header_bytes.max(8192) + (64 << 10)
}

/// The receive window of an HTTP/2 connection, all its streams together, in bytes.
pub const H2_CONNECTION_WINDOW: u32 = 256 << 10;

/// The receive window of one HTTP/2 stream, in bytes (the connection's window bounds them
/// together).
pub const H2_STREAM_WINDOW: u32 = 128 << 10;

/// The most response bytes one HTTP/2 stream buffers for a client that has not made room.
pub const H2_SEND_BUFFER: usize = 16 << 10;

/// The slots an HTTP/2 connection takes for its receive window, beyond its own: the window
/// over the slot's size, rounded up (2 at the default --max-header-bytes).
pub fn h2_window_slots(max_header_bytes: usize) -> usize {
    (H2_CONNECTION_WINDOW as usize).div_ceil(connection_bytes(max_header_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/reference.md's table of this binary's flags is made from this definition
    /// (`HOLDFAST_BLESS=1` rewrites it).
    #[test]
    fn the_flag_reference_in_the_docs_is_current() {
        use clap::CommandFactory;
        holdfast_process::flags::assert_documented(env!("CARGO_MANIFEST_DIR"), &Args::command());
    }

    fn parse(extra: &[&str]) -> Result<Config, String> {
        let base = [
            "holdfast-proxy",
            "--state-dir",
            "/tmp/x",
            "--insecure-plaintext",
            "--control-plane",
            "http://127.0.0.1:18000",
        ];
        let args =
            Args::try_parse_from(base.iter().chain(extra.iter())).map_err(|e| e.to_string())?;
        args.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_safe_and_valid() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.addresses.listen.port(), 8080);
        assert_eq!(c.listen.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.listen.max_headers, 100);
        // /debug/* shows every route and pod address: loopback unless told otherwise.
        assert!(c.addresses.debug.ip().is_loopback());
        assert!(!c.forward.verbose_errors, "error pages say only the status");
        assert_eq!(c.forward.allow_upgrade, ["websocket"]);
        assert!(c.forward.trust_forwarded_from.is_empty());
        assert_eq!(c.forward.max_request_body, 100 << 20);
        assert_eq!(c.max_snapshot_bytes, 64 << 20);
        assert_eq!(c.drain_delay, Duration::from_secs(5));
        assert!(
            parse(&["--allow-upgrade", "websocket,h2c"]).is_err(),
            "never h2c"
        );
        assert!(parse(&["--trust-forwarded-from", "10.0.0.0/8,192.0.2.1"]).is_ok());
        assert!(parse(&["--trust-forwarded-from", "nonsense"]).is_err());
        assert!(
            parse(&[
                "--listen",
                "127.0.0.1:8443",
                "--listen-tls",
                "127.0.0.1:8443"
            ])
            .unwrap_err()
            .contains("--listen-tls"),
            "the workers' shared sockets would split one address between two protocols"
        );
        assert!(parse(&["--listen", "127.0.0.1:0", "--listen-tls", "127.0.0.1:0"]).is_ok());
    }

    #[test]
    fn the_control_plane_connection_needs_mutual_tls_or_an_explicit_plaintext_flag() {
        let bare = |extra: &[&str]| {
            Args::try_parse_from(
                ["holdfast-proxy", "--state-dir", "/tmp/x"]
                    .into_iter()
                    .chain(extra.iter().copied()),
            )
            .unwrap()
            .validate()
            .map(|c| c.subscribe.tls.is_some())
            .map_err(|e| e.to_string())
        };
        let tls = [
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--control-plane-ca",
            "ca",
        ];
        let https = ["--control-plane", "https://cp:18000"];
        assert_eq!(bare(&[&tls[..], &https].concat()), Ok(true));
        assert!(bare(&https).unwrap_err().contains("--control-plane-ca"));
        assert!(
            bare(&[&tls[..], &["--control-plane", "http://cp:18000"]].concat())
                .unwrap_err()
                .contains("--insecure-plaintext")
        );
        assert_eq!(
            bare(&["--insecure-plaintext", "--control-plane", "http://cp:1"]),
            Ok(false)
        );
        assert!(bare(&["--insecure-plaintext", "--control-plane", "https://cp:1"]).is_err());
    }

    #[test]
    fn several_control_planes_by_repetition_or_comma() {
        let c = parse(&["--control-plane", "http://b:1,http://c:2"]).unwrap();
        assert_eq!(
            c.subscribe.control_planes,
            ["http://127.0.0.1:18000", "http://b:1", "http://c:2"]
        );
    }

    /// HTTP/2's stream cap must allow a stream; its receive window takes two slots at the
    /// default head size, and one where a slot is larger than the window.
    #[test]
    fn http2_settings_are_checked_and_their_window_is_counted_in_slots() {
        let e = parse(&["--h2-max-concurrent-streams", "0"]).unwrap_err();
        assert!(e.contains("--h2-max-concurrent-streams"), "{e}");
        assert!(parse(&["--h2-max-concurrent-streams", "1"]).is_ok());
        assert_eq!(h2_window_slots(65536), 2);
        assert_eq!(h2_window_slots(262144), 1);
        assert_eq!(h2_window_slots(1024), 4);
    }

    /// The default connection cap is what --connection-memory holds at the worst, shared
    /// by the listening addresses; an explicit cap it cannot hold is refused at start.
    #[test]
    fn the_connection_cap_is_derived_from_the_connection_memory() {
        let per = connection_bytes(65536);
        assert_eq!(per, 128 << 10);
        let c = parse(&[]).unwrap();
        assert_eq!(c.listen.max_connections, (512 << 20) / per);
        let c = parse(&["--listen-tls", "127.0.0.1:8443"]).unwrap();
        assert_eq!(
            c.listen.max_connections,
            (512 << 20) / per / 2,
            "two listeners"
        );
        let c = parse(&[
            "--connection-memory",
            "33554432",
            "--max-header-bytes",
            "16384",
        ])
        .unwrap();
        assert_eq!(
            c.listen.max_connections,
            (32 << 20) / connection_bytes(16384)
        );
        let e = parse(&["--max-connections", "100000"]).unwrap_err();
        assert!(
            e.contains("--max-connections") && e.contains("--connection-memory"),
            "{e}"
        );
        assert!(parse(&["--max-connections", "4000"]).is_ok());
        let e = parse(&["--connection-memory", "1000"]).unwrap_err();
        assert!(e.contains("--connection-memory"), "{e}");
    }

    #[test]
    fn bad_values_name_the_flag() {
        assert!(
            parse(&["--control-plane", "b:1"])
                .unwrap_err()
                .contains("--control-plane")
        );
        assert!(
            parse(&["--idle-timeout", "0s"])
                .unwrap_err()
                .contains("--idle-timeout")
        );
        assert!(
            parse(&["--max-header-bytes", "300000"])
                .unwrap_err()
                .contains("--max-header-bytes"),
            "above the framing checks' window"
        );
        assert!(
            parse(&["--max-header-bytes", "10"])
                .unwrap_err()
                .contains("--max-header-bytes")
        );
        assert!(
            Args::try_parse_from(["holdfast-proxy", "--control-plane", "http://a:1"]).is_err(),
            "--state-dir is required"
        );
    }
}
