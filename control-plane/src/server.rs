//! Wires the parts together: Kubernetes client, caches, reconcile loop, gRPC server (route
//! discovery, admin, health, reflection) and the HTTP admin listener.

use std::sync::Arc;

use anyhow::Context;
use holdfast_proto::v1::admin_server::AdminServer;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;

use crate::admin::{AdminService, serve_http};
use crate::authn::{self, Mode};
use crate::caches;
use crate::config::Config;
use crate::connection_age;
use crate::discovery::Discovery;
use crate::metrics::Metrics;
use crate::publisher::{self, FreshRead, ProblemReporter};
use crate::state::Shared;
use crate::status;

/// The gRPC listener pings a connection after this long without frames, so a proxy
/// that vanished without closing its stream (a silent partition, a killed node) is
/// noticed and its stream dropped from `ListProxies`.
pub const KEEP_ALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// A ping unanswered for this long closes the connection.
pub const KEEP_ALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// An idle connection to the API server older than this is not reused. After a silent
/// partition (no FIN, no RST) the connections open at the cut are dead but look alive:
/// a watch that timed out on one must not be retried on another idle since before the
/// cut, which would cost a second `--api-read-timeout`. Shorter than the watch timeout,
/// so by the time a watch notices, every connection idle since the cut is expired.
pub const API_POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// The Kubernetes client: the stack `kube::Client::try_from` builds (TLS, auth, retry on
/// 429/503/504, timeouts), with idle connections kept at most [`API_POOL_IDLE`] (hyper's
/// default is 90 s, which `kube` does not expose).
pub fn api_client(config: kube::Config) -> anyhow::Result<kube::Client> {
    use kube::client::ConfigExt;
    let mut connector = hyper_timeout::TimeoutConnector::new(config.rustls_https_connector()?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(API_POOL_IDLE)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// Runs the control plane until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let Config {
        api,
        grpc,
        admin_listen,
        watch,
        publisher: settings,
        status: status_settings,
        instance,
        log_format: _,
    } = config;
    let mut kube_config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration (KUBECONFIG or in-cluster)")?;
    kube_config.connect_timeout = Some(api.connect_timeout);
    kube_config.read_timeout = Some(api.read_timeout);
    let client = api_client(kube_config).context("building the Kubernetes client")?;

    let tls = match &grpc.tls {
        Some(files) => Some(
            holdfast_process::tls::Reloading::new(
                files.clone(),
                holdfast_process::tls::server_config,
            )
            .context("loading --tls-cert, --tls-key and --client-ca")?,
        ),
        None => {
            tracing::warn!(
                "INSECURE: gRPC is served in plaintext (--insecure-plaintext): anyone who can reach {} can read every route and backend address, register as a proxy, and call Admin (approve held snapshots). Use --tls-cert, --tls-key and --client-ca outside local development.",
                grpc.listen
            );
            None
        }
    };
    let mode = match &tls {
        Some(_) => Mode::MutualTls {
            admin_identities: Arc::new(grpc.admin_identities.clone()),
            proxy_identities: Arc::new(grpc.proxy_identities.clone()),
        },
        None => Mode::Plaintext,
    };
    if tls.is_some() && grpc.admin_identities.is_empty() {
        tracing::warn!("no --admin-identities: every Admin call will be refused");
    }
    let grpc_listener = TcpListener::bind(grpc.listen)
        .await
        .with_context(|| format!("binding --grpc-listen {}", grpc.listen))?;
    let admin_listener = TcpListener::bind(admin_listen)
        .await
        .with_context(|| format!("binding --admin-listen {admin_listen}"))?;
    tracing::info!(
        grpc = %grpc_listener.local_addr()?,
        admin = %admin_listener.local_addr()?,
        "listening"
    );

    let mut registry = Registry::default();
    let shared = Shared::new(Metrics::new(&mut registry));
    let registry = Arc::new(registry);
    let changed = Arc::new(Notify::new());
    let mut tasks = JoinSet::new();

    let page_size = watch.page_size;
    let caches = caches::start(
        client.clone(),
        shared.clone(),
        changed.clone(),
        watch,
        &mut tasks,
    );
    let admin_caches = caches.clone();
    tasks.spawn(status::run(
        client.clone(),
        caches.clone(),
        shared.clone(),
        status_settings,
        shutdown.clone(),
    ));
    tasks.spawn(publisher::run(
        caches,
        shared.clone(),
        changed,
        settings,
        ProblemReporter::new(Some(client.clone()), instance),
        Some(FreshRead::new(client, page_size)),
        shutdown.clone().cancelled_owned(),
    ));

    // Health: NOT_SERVING until the first complete snapshot exists.
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    reporter.set_not_serving::<Discovery>().await;
    let mut published = shared.subscribe();
    tasks.spawn(async move {
        if published.wait_for(|p| p.is_some()).await.is_ok() {
            reporter
                .set_service_status("", ServingStatus::Serving)
                .await;
            reporter.set_serving::<Discovery>().await;
        }
    });

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(holdfast_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    tasks.spawn(serve_http(
        admin_listener,
        shared.clone(),
        registry,
        shutdown.clone().cancelled_owned(),
    ));

    let admin_mode = mode.clone();
    let router = tonic::transport::Server::builder()
        // Detect proxies that vanished without closing their stream.
        .http2_keepalive_interval(Some(KEEP_ALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEP_ALIVE_TIMEOUT))
        // tonic leaves these open: a client could open streams without bound, reset them
        // faster than they are served (CVE-2023-44487), or hold one connection forever
        // (after a rollout every proxy would stay on the replicas that came up first).
        .max_concurrent_streams(grpc.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(20))
        .http2_max_local_error_reset_streams(Some(256))
        .http2_max_header_list_size(16 * 1024)
        // GOAWAY at the age; the grace is [`connection_age::aged`]'s (tonic's own would
        // replace the GOAWAY with a plain close).
        .max_connection_age(grpc.max_connection_age)
        // Anyone may call these: their requests are a name, never megabytes.
        .add_service(health.max_decoding_message_size(authn::UNAUTHENTICATED_MESSAGE_BYTES))
        .add_service(reflection_v1.max_decoding_message_size(authn::UNAUTHENTICATED_MESSAGE_BYTES))
        .add_service(
            reflection_v1alpha.max_decoding_message_size(authn::UNAUTHENTICATED_MESSAGE_BYTES),
        )
        .add_service(Discovery::new(
            shared.clone(),
            mode,
            grpc.max_streams_per_identity,
        ))
        .add_service(AdminServer::with_interceptor(
            AdminService::new(shared.clone(), Some(admin_caches)),
            move |request: tonic::Request<()>| {
                admin_mode.check_admin(request.extensions())?;
                Ok(request)
            },
        ));
    let stop = shutdown.clone().cancelled_owned();
    let lifetime = grpc.max_connection_age + grpc.max_connection_age_grace;
    let result = match tls {
        Some(tls) => {
            let watcher = holdfast_process::tls::watch_reloads(
                &tls,
                grpc.tls_reload_interval,
                shared.metrics().tls_reloads.clone(),
                "the gRPC listener's",
            );
            let handshakes = shared.metrics().tls_handshake_failures.clone();
            let incoming = authn::tls_incoming(grpc_listener, tls, move || {
                handshakes.inc();
            });
            let incoming = connection_age::aged(incoming, lifetime);
            let served = router.serve_with_incoming_shutdown(incoming, stop).await;
            watcher.abort();
            served
        }
        None => {
            let incoming = connection_age::aged(TcpListenerStream::new(grpc_listener), lifetime);
            router.serve_with_incoming_shutdown(incoming, stop).await
        }
    };
    let result = result.context("gRPC server");
    shutdown.cancel();
    tasks.abort_all();
    result
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An HTTP/1.1 server on 127.0.0.1 answering every request with `{}` on keep-alive
    /// connections; counts the connections it accepts.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    hyper::service::service_fn(|_| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(b"{}")),
                        ))
                    }),
                ));
            }
        });
        (url, accepted)
    }

    /// A connection idle longer than [`super::API_POOL_IDLE`] is not reused (one that may
    /// have died silently), while one idle a moment is.
    #[tokio::test]
    async fn an_api_connection_idle_past_the_pool_limit_is_not_reused() {
        let (url, accepted) = counting_server().await;
        let config = kube::Config::new(url.parse().expect("url"));
        let client = super::api_client(config).expect("client");
        let get = || async {
            client
                .request_text(
                    http::Request::get("/version")
                        .body(Vec::new())
                        .expect("req"),
                )
                .await
                .expect("answered")
        };
        get().await;
        get().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "a fresh idle connection is reused"
        );
        // Idle for longer than the limit: the behaviour under test, not a synchronisation.
        tokio::time::sleep(super::API_POOL_IDLE + std::time::Duration::from_millis(500)).await;
        get().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "a long-idle connection was reused"
        );
    }
}
