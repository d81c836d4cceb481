//! Command line and environment, validated once into [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use holdfast_process::tls;
pub use holdfast_process::{ConfigError, LogFormat};

use crate::caches::{self, WatchSettings};
use crate::{publisher, status, translate};

/// holdfast control plane: watches Ingresses, IngressClasses, Services and EndpointSlices,
/// and streams complete, versioned route snapshots to holdfast proxies over gRPC.
/// Kubernetes access comes from KUBECONFIG or the in-cluster ServiceAccount.
#[derive(Debug, Clone, Parser)]
#[command(name = "holdfast-control-plane", version)]
pub struct Args {
    /// Address of the gRPC listener (RouteDiscovery, Admin, health, reflection).
    #[arg(long, env = "HOLDFAST_GRPC_LISTEN", default_value = "0.0.0.0:18000")]
    pub grpc_listen: SocketAddr,
    /// Certificate chain (PEM) the gRPC listener presents. With --tls-key and --client-ca,
    /// the listener speaks mutual TLS: every client needs a certificate from --client-ca.
    #[arg(long, env = "HOLDFAST_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "HOLDFAST_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA certificate(s) (PEM) that sign proxies' and operators' client certificates.
    #[arg(long, env = "HOLDFAST_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Identities (URI or DNS SANs of a client certificate) allowed to call the Admin
    /// service; comma-separated or repeated. Proxies' identities must not be listed.
    #[arg(long, env = "HOLDFAST_ADMIN_IDENTITIES", value_delimiter = ',')]
    pub admin_identities: Vec<String>,
    /// Patterns of the identities (URI or DNS SANs) allowed to stream routes, that is to
    /// act as proxies and receive snapshots with their private keys; comma-separated or
    /// repeated, `*` matches any run of characters (`spiffe://holdfast/proxy/*`,
    /// `holdfast-proxy-*`). Required with mutual TLS. An identity in --admin-identities
    /// never streams routes, whatever the patterns say.
    #[arg(long, env = "HOLDFAST_PROXY_IDENTITIES", value_delimiter = ',')]
    pub proxy_identities: Vec<String>,
    /// How often the TLS files are checked for changes (cert-manager renews in place).
    #[arg(long, env = "HOLDFAST_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,
    /// Serve gRPC without TLS: anyone who reaches the port can read every route and call
    /// Admin. For local development only; a warning is logged at start.
    #[arg(long, env = "HOLDFAST_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// With --insecure-plaintext, still put certificates and their private keys into
    /// snapshots (otherwise TLS hosts get no certificate, with a problem saying why).
    #[arg(long, env = "HOLDFAST_ALLOW_PLAINTEXT_SECRETS")]
    pub allow_plaintext_secrets: bool,
    /// Most concurrent HTTP/2 streams per gRPC connection.
    #[arg(
        long,
        env = "HOLDFAST_GRPC_MAX_CONCURRENT_STREAMS",
        default_value_t = 100
    )]
    pub grpc_max_concurrent_streams: u32,
    /// A gRPC connection is asked to close (GOAWAY) after this long, so that proxies
    /// spread over the replicas again after a rollout; they reconnect at once.
    #[arg(long, env = "HOLDFAST_GRPC_MAX_CONNECTION_AGE", default_value = "30m", value_parser = humantime::parse_duration)]
    pub grpc_max_connection_age: std::time::Duration,
    /// After --grpc-max-connection-age, how long its streams may stay before the
    /// connection is closed.
    #[arg(long, env = "HOLDFAST_GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub grpc_max_connection_age_grace: std::time::Duration,
    /// Most route streams open at once per proxy identity (its certificate's identity,
    /// or its node id over plaintext); more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "HOLDFAST_MAX_STREAMS_PER_IDENTITY", default_value_t = 4)]
    pub max_streams_per_identity: usize,
    /// Largest snapshot published, in encoded bytes (default 64 MiB). A larger one is
    /// held (GetStatus says why) and cannot be approved; the proxies keep the last one.
    /// Every proxy holds about three copies in memory while applying one; see the memory
    /// limits in deploy/kubernetes.
    #[arg(long, env = "HOLDFAST_MAX_SNAPSHOT_BYTES", default_value_t = 64 << 20)]
    pub max_snapshot_bytes: usize,
    /// Most rules one Ingress may have; a larger Ingress is skipped with a Warning Event.
    #[arg(long, env = "HOLDFAST_MAX_RULES_PER_INGRESS", default_value_t = 1_000)]
    pub max_rules_per_ingress: usize,
    /// Most paths (over all its rules) one Ingress may have; a larger one is skipped.
    #[arg(long, env = "HOLDFAST_MAX_PATHS_PER_INGRESS", default_value_t = 5_000)]
    pub max_paths_per_ingress: usize,
    /// Serve the ingress-nginx annotations (`nginx.ingress.kubernetes.io/...`) of
    /// Ingresses (docs/ingress-nginx.md lists them). An annotation not served, and every
    /// `*-snippet`, is ignored with a Warning Event. `=false`: none is served, and an
    /// Ingress carrying any gets a Warning Event saying so.
    #[arg(
        long,
        env = "HOLDFAST_INGRESS_NGINX_ANNOTATIONS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub ingress_nginx_annotations: bool,
    /// Let ExternalName Services be backends. Off by default: an ExternalName can send the
    /// proxies to any DNS name, including another namespace's internal Services
    /// (CVE-2021-25740). Off, such a route answers 503 and its Ingress gets a Warning Event.
    #[arg(long, env = "HOLDFAST_ALLOW_EXTERNAL_NAME")]
    pub allow_external_name: bool,
    /// Who may add rules to a host: `first-namespace` (the namespace that named the host
    /// first, as the leader records in --host-claims-configmap; rules, `spec.tls` entries
    /// and annotations from other namespaces are skipped with a Warning Event) or `shared`
    /// (any namespace may add paths to any host: the explicit opt-out).
    #[arg(
        long,
        env = "HOLDFAST_HOST_OWNERSHIP",
        value_enum,
        default_value = "first-namespace"
    )]
    pub host_ownership: crate::translate::HostOwnership,
    /// The ConfigMap, in the control plane's namespace (--lease-namespace), where the
    /// leader records which namespace claimed each host first. Every replica watches it.
    #[arg(
        long,
        env = "HOLDFAST_HOST_CLAIMS_CONFIGMAP",
        default_value = "holdfast-host-claims"
    )]
    pub host_claims_configmap: String,
    /// A namespace's claim on a host is released once the namespace has named the host in
    /// none of its Ingresses for this long; until then no other namespace can take the
    /// host (a redeploy that deletes and re-creates an Ingress keeps it).
    #[arg(long, env = "HOLDFAST_HOST_CLAIM_GRACE", default_value = "10m", value_parser = humantime::parse_duration)]
    pub host_claim_grace: Duration,
    /// Most host claims one namespace may hold in the ledger, so that no tenant can fill
    /// it (it holds about 8,000 claims); past it the namespace's new claims wait.
    #[arg(
        long,
        env = "HOLDFAST_MAX_HOST_CLAIMS_PER_NAMESPACE",
        default_value_t = 1000
    )]
    pub max_host_claims_per_namespace: usize,
    /// Namespaces whose Ingresses may set the `defaultBackend`, the cluster-wide catch-all
    /// for requests no rule matches, or add rules without a host, which catch every host
    /// no rule names (comma-separated; default: all, as the Ingress spec expects). An
    /// Ingress elsewhere gets a Warning Event for either, and those requests get 404.
    #[arg(
        long,
        env = "HOLDFAST_DEFAULT_BACKEND_NAMESPACES",
        value_delimiter = ','
    )]
    pub default_backend_namespaces: Option<Vec<String>>,
    /// Address of the HTTP admin listener (/healthz, /readyz, /metrics).
    #[arg(long, env = "HOLDFAST_ADMIN_LISTEN", default_value = "0.0.0.0:18001")]
    pub admin_listen: SocketAddr,
    /// Serve only Ingresses of this IngressClass (which must name our controller).
    /// Default: every IngressClass whose spec.controller is --controller-name.
    #[arg(long, env = "HOLDFAST_INGRESS_CLASS")]
    pub ingress_class: Option<String>,
    /// The spec.controller value of our IngressClasses.
    #[arg(
        long,
        env = "HOLDFAST_CONTROLLER_NAME",
        default_value = "holdfast.dev/ingress-controller"
    )]
    pub controller_name: String,
    /// `namespace/name` of a kubernetes.io/tls Secret whose certificate proxies offer to TLS
    /// clients whose SNI names no host with a certificate, or that send no SNI. Without
    /// it such handshakes fail.
    #[arg(long, env = "HOLDFAST_DEFAULT_CERTIFICATE")]
    pub default_certificate: Option<String>,
    /// Quiet period that makes a burst: a change after a quiet period is built at once; a
    /// change within this long of the last build waits until none has come for this long
    /// (bursts coalesce). Short by default: a build and its delta cost O(change), so
    /// waiting longer saves little.
    #[arg(long, env = "HOLDFAST_DEBOUNCE", default_value = "20ms", value_parser = humantime::parse_duration)]
    pub debounce: Duration,
    /// Longest a burst of changes can delay a build: under steady churn (changes closer
    /// together than --debounce) a build is made this often.
    #[arg(long, env = "HOLDFAST_MAX_DELAY", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub max_delay: Duration,
    /// Share of published routes (0 to 1) a new snapshot may remove without being held
    /// for confirmation. Removing all routes is always held.
    #[arg(long, env = "HOLDFAST_MAX_REMOVAL_SHARE", default_value_t = 0.5)]
    pub max_removal_share: f64,
    /// A held snapshot is published once unchanged for this long and confirmed by a fresh
    /// read of Ingresses and IngressClasses (or at once by ApproveHeldSnapshot).
    #[arg(long, env = "HOLDFAST_HOLD_CONFIRM_AFTER", default_value = "60s", value_parser = humantime::parse_duration)]
    pub hold_confirm_after: Duration,
    /// Timeout for connecting to the Kubernetes API server.
    #[arg(long, env = "HOLDFAST_API_CONNECT_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub api_connect_timeout: Duration,
    /// Timeout for a read from the Kubernetes API server; a watch that stays silent this
    /// long is considered dead and re-established from its last resourceVersion (no
    /// list). Watches ask the API server to end them at 3/4 of it (`timeoutSeconds`,
    /// with bookmarks), so a healthy watch is never silent this long. The default
    /// notices a silent partition (no FIN, no RST) within about 11 s, for about 43 watch
    /// requests a minute in all (five kinds, one every 7 s each).
    #[arg(long, env = "HOLDFAST_API_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub api_read_timeout: Duration,
    /// Objects per LIST page when (re-)listing a kind, and in the fresh read that
    /// confirms a held removal. A list is complete only once every page has arrived.
    #[arg(long, env = "HOLDFAST_LIST_PAGE_SIZE", default_value_t = 500)]
    pub list_page_size: u32,
    /// The `spec.controllerName` of the GatewayClasses this control plane implements: the
    /// leader marks each Accepted, with the features holdfast supports.
    #[arg(long, env = "HOLDFAST_GATEWAY_CONTROLLER_NAME", default_value = crate::gateway_api::DEFAULT_CONTROLLER_NAME)]
    pub gateway_controller_name: String,
    /// The IPv4 CIDR our Gateways get their addresses from (one each, kept in the
    /// Gateway's status.addresses), for example 127.10.0.0/16 on one machine. Without it,
    /// Gateways get no address (Programmed False, AddressNotAssigned).
    #[arg(long, env = "HOLDFAST_GATEWAY_ADDRESS_POOL")]
    pub gateway_address_pool: Option<String>,
    /// In a cluster: give each Gateway of ours a Service in this namespace (the proxies'),
    /// selecting the proxies' pods (--gateway-service-selector). Its ports are the
    /// Gateway's listener ports, each mapped to a container port of the Gateway's own
    /// (--gateway-port-range) that the proxies bind; the Gateway's status.addresses are
    /// the Service's. Exclusive with --gateway-address-pool.
    #[arg(long, env = "HOLDFAST_GATEWAY_SERVICE_NAMESPACE")]
    pub gateway_service_namespace: Option<String>,
    /// The proxies' pod labels, `key=value[,key=value]`: each Gateway Service's selector.
    #[arg(long, env = "HOLDFAST_GATEWAY_SERVICE_SELECTOR")]
    pub gateway_service_selector: Option<String>,
    /// The type of the Gateway Services: ClusterIP, NodePort or LoadBalancer.
    #[arg(
        long,
        env = "HOLDFAST_GATEWAY_SERVICE_TYPE",
        default_value = "LoadBalancer"
    )]
    pub gateway_service_type: String,
    /// The container ports Gateways get (`first-last`), one per Gateway listener port.
    #[arg(
        long,
        env = "HOLDFAST_GATEWAY_PORT_RANGE",
        default_value = "20000-29999"
    )]
    pub gateway_port_range: String,
    /// What the proxies bind the Gateways' container ports on.
    #[arg(long, env = "HOLDFAST_GATEWAY_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub gateway_bind_address: std::net::Ipv4Addr,
    /// How often a Gateway API kind that API discovery says does not exist (its
    /// CustomResourceDefinition is not installed) is looked for again: installing the
    /// CRDs later needs no restart. A discovery request gets --api-read-timeout; one that
    /// fails or times out leaves the kind as it was (never answered: not complete).
    #[arg(long, env = "HOLDFAST_GATEWAY_API_REDISCOVER_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub gateway_api_rediscover_interval: Duration,
    /// Write this IP or host name (repeatable) into `status.loadBalancer` of our Ingresses
    /// (leader only). Exclusive with --publish-service.
    #[arg(
        long = "publish-address",
        env = "HOLDFAST_PUBLISH_ADDRESS",
        value_delimiter = ','
    )]
    pub publish_addresses: Vec<String>,
    /// `namespace/name` of the proxies' Service, whose address is written into
    /// `status.loadBalancer` of our Ingresses (leader only).
    #[arg(long, env = "HOLDFAST_PUBLISH_SERVICE")]
    pub publish_service: Option<String>,
    /// Name of the leader-election Lease (the leader records host claims and writes
    /// Ingress status).
    #[arg(
        long,
        env = "HOLDFAST_LEASE_NAME",
        default_value = "holdfast-control-plane"
    )]
    pub lease_name: String,
    /// The control plane's own namespace, of the Lease and the host claims ConfigMap
    /// (default: this pod's namespace, else "default").
    #[arg(long, env = "HOLDFAST_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long a leader's Lease lasts without renewal; a standby takes over after it.
    #[arg(long, env = "HOLDFAST_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// The leader renews this long before its Lease expires.
    #[arg(long, env = "HOLDFAST_LEASE_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub lease_grace: Duration,
    /// Name of this replica in Kubernetes Events (default: the host name).
    #[arg(long, env = "HOLDFAST_INSTANCE")]
    pub instance: Option<String>,
    /// Log format (filter with RUST_LOG, default info).
    #[arg(long, env = "HOLDFAST_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// An OpenTelemetry Collector's OTLP/gRPC endpoint (`http://collector:4317`): each
    /// sampled build exports a `build` span, with a `publish` child when it offered a
    /// snapshot. Off when not set.
    #[arg(long, env = "HOLDFAST_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Share of builds traced (0 to 1).
    #[arg(long, env = "HOLDFAST_TRACE_SAMPLE_RATIO", default_value_t = 1.0)]
    pub trace_sample_ratio: f64,
}

/// Validated configuration: one settings value per component, which wiring hands over
/// as it is (nothing is checked or converted again).
#[derive(Debug, Clone)]
pub struct Config {
    /// Talking to the Kubernetes API server.
    pub api: ApiSettings,
    /// The gRPC listener (RouteDiscovery, Admin, health, reflection).
    pub grpc: GrpcSettings,
    /// The HTTP admin listener (`--admin-listen`).
    pub admin_listen: SocketAddr,
    /// The watch-fed caches.
    pub watch: WatchSettings,
    /// The reconcile loop: translation, coalescing, bounded destruction.
    pub publisher: publisher::Settings,
    /// Leader election and what the leader writes (host claims, Ingress status).
    pub status: status::Settings,
    /// This replica's name (Events, the Lease).
    pub instance: String,
    /// `--log-format`.
    pub log_format: LogFormat,
}

/// How the control plane talks to the API server.
#[derive(Debug, Clone, Copy)]
pub struct ApiSettings {
    /// Connecting must finish within this (`--api-connect-timeout`).
    pub connect_timeout: Duration,
    /// A response (or the next watch event) must come within this (`--api-read-timeout`).
    pub read_timeout: Duration,
}

/// The gRPC listener's settings.
#[derive(Debug, Clone)]
pub struct GrpcSettings {
    /// Its address (`--grpc-listen`).
    pub listen: SocketAddr,
    /// The mutual-TLS files; None in plaintext mode.
    pub tls: Option<holdfast_process::tls::Files>,
    /// How often the TLS files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Identities allowed to call Admin.
    pub admin_identities: Vec<String>,
    /// Patterns of the identities allowed to stream routes.
    pub proxy_identities: Vec<String>,
    /// Most concurrent streams per connection.
    pub max_concurrent_streams: u32,
    /// Connections are closed after this long (so proxies spread over new replicas).
    pub max_connection_age: Duration,
    /// Grace for streams on a connection past its age.
    pub max_connection_age_grace: Duration,
    /// Most route streams per client identity.
    pub max_streams_per_identity: usize,
}

/// `namespace/name` split in two, if `s` has that form.
fn namespace_name(s: &str) -> Option<(&str, &str)> {
    s.split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
}

impl Args {
    /// Checks the values together.
    pub fn validate(self) -> Result<Config, ConfigError> {
        if !(0.0..=1.0).contains(&self.trace_sample_ratio) {
            return Err(ConfigError::new(
                "trace-sample-ratio",
                "must be from 0 to 1",
            ));
        }
        let tracing = match &self.otlp_endpoint {
            None => None,
            Some(e) if e.starts_with("http://") => Some(publisher::Tracing {
                endpoint: e.clone(),
                ratio: self.trace_sample_ratio,
            }),
            Some(_) => {
                return Err(ConfigError::new(
                    "otlp-endpoint",
                    "must be an http:// URL (http://collector:4317): TLS to the collector is not supported yet (run the collector beside the proxy, or behind a local agent)",
                ));
            }
        };
        if !(0.0..=1.0).contains(&self.max_removal_share) {
            return Err(ConfigError::new(
                "max-removal-share",
                "must be between 0 and 1",
            ));
        }
        if self.max_delay.is_zero() {
            return Err(ConfigError::new("max-delay", "must be more than 0"));
        }
        if self.debounce > self.max_delay {
            return Err(ConfigError::new("debounce", "must not exceed --max-delay"));
        }
        if self.api_read_timeout < Duration::from_secs(2) {
            return Err(ConfigError::new("api-read-timeout", "must be at least 2s"));
        }
        if !self.publish_addresses.is_empty() && self.publish_service.is_some() {
            return Err(ConfigError::new(
                "publish-address",
                "cannot be combined with --publish-service",
            ));
        }
        if let Some(cert) = &self.default_certificate
            && namespace_name(cert).is_none()
        {
            return Err(ConfigError::new(
                "default-certificate",
                "must be namespace/name",
            ));
        }
        let publish_service = match self.publish_service.as_deref().map(namespace_name) {
            Some(None) => {
                return Err(ConfigError::new(
                    "publish-service",
                    "must be namespace/name",
                ));
            }
            Some(Some((namespace, name))) => Some(status::Publish::Service {
                namespace: namespace.into(),
                name: name.into(),
            }),
            None => None,
        };
        if self.lease_duration.as_secs() < 2
            || self.lease_grace.is_zero()
            || self.lease_grace >= self.lease_duration
        {
            return Err(ConfigError::new(
                "lease-grace",
                "needs --lease-duration of at least 2s and a grace of at least 1s below it",
            ));
        }
        let tls = tls::Flags {
            cert: &self.tls_cert,
            key: &self.tls_key,
            ca: &self.client_ca,
            ca_flag: "client-ca",
            insecure_plaintext: self.insecure_plaintext,
            reload_interval: self.tls_reload_interval,
            needed_by: "the gRPC listener",
        }
        .validate()?;
        if tls.is_some()
            && (self.proxy_identities.is_empty()
                || self.proxy_identities.iter().any(|p| p.trim().is_empty()))
        {
            return Err(ConfigError::new(
                "proxy-identities",
                "is required with mutual TLS: the identities (patterns) that may stream routes, for example holdfast-proxy-* or spiffe://holdfast/proxy/*",
            ));
        }
        if self.allow_plaintext_secrets && !self.insecure_plaintext {
            return Err(ConfigError::new(
                "allow-plaintext-secrets",
                "only means something with --insecure-plaintext",
            ));
        }
        if !valid_controller_name(&self.gateway_controller_name) {
            return Err(ConfigError::new(
                "gateway-controller-name",
                "must be a domain-prefixed path, as GatewayClass spec.controllerName is (for example holdfast.dev/gateway-controller)",
            ));
        }
        if self.gateway_api_rediscover_interval < Duration::from_secs(1) {
            return Err(ConfigError::new(
                "gateway-api-rediscover-interval",
                "must be at least 1s",
            ));
        }
        if self.list_page_size == 0 {
            return Err(ConfigError::new("list-page-size", "must be at least 1"));
        }
        if self.controller_name.is_empty() {
            return Err(ConfigError::new("controller-name", "must not be empty"));
        }
        if self.ingress_class.as_deref() == Some("") {
            return Err(ConfigError::new("ingress-class", "must not be empty"));
        }
        let instance =
            holdfast_process::node_name(self.instance.as_deref(), "holdfast-control-plane");
        let lease_namespace = self.lease_namespace.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .map(|n| n.trim().to_owned())
                .unwrap_or_else(|_| "default".into())
        });
        let gateway_pool = self
            .gateway_address_pool
            .as_deref()
            .map(crate::gateway_api::status::Pool::parse)
            .transpose()
            .map_err(|e| ConfigError::new("gateway-address-pool", e))?;
        let gateway_services = match (&self.gateway_service_namespace, &gateway_pool) {
            (None, _) => None,
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "gateway-service-namespace",
                    "is exclusive with --gateway-address-pool",
                ));
            }
            (Some(namespace), None) => {
                use crate::gateway_api::services::ServiceMode;
                let selector = ServiceMode::parse_selector(
                    self.gateway_service_selector.as_deref().unwrap_or_default(),
                )
                .map_err(|e| ConfigError::new("gateway-service-selector", e))?;
                let (first_port, port_count) =
                    ServiceMode::parse_port_range(&self.gateway_port_range)
                        .map_err(|e| ConfigError::new("gateway-port-range", e))?;
                Some(ServiceMode {
                    namespace: namespace.clone(),
                    selector,
                    service_type: ServiceMode::parse_type(&self.gateway_service_type)
                        .map_err(|e| ConfigError::new("gateway-service-type", e))?,
                    bind_address: self.gateway_bind_address,
                    first_port,
                    port_count,
                })
            }
        };
        let translate = translate::Options {
            controller: self.controller_name.clone(),
            ingress_class: self.ingress_class.clone(),
            default_certificate: self.default_certificate.clone(),
            allow_certificates: tls.is_some() || self.allow_plaintext_secrets,
            allow_external_name: self.allow_external_name,
            host_ownership: self.host_ownership,
            ingress_reading: translate::IngressReading {
                max_rules: self.max_rules_per_ingress,
                max_paths: self.max_paths_per_ingress,
                nginx_annotations: self.ingress_nginx_annotations,
            },
            default_backend_namespaces: self
                .default_backend_namespaces
                .as_ref()
                .map(|list| list.iter().map(|n| n.trim().to_owned()).collect()),
            proxy_service: match &publish_service {
                Some(status::Publish::Service { namespace, name }) => {
                    Some(format!("{namespace}/{name}"))
                }
                _ => None,
            },
            gateway_controller: self.gateway_controller_name.clone(),
            gateway_pool,
            gateway_services,
        };
        let publish = match (publish_service, self.publish_addresses.is_empty()) {
            (Some(service), _) => Some(service),
            (None, false) => Some(status::Publish::Addresses(self.publish_addresses.clone())),
            (None, true) => None,
        };
        let claims_configmap = caches::ClaimsConfigMap {
            namespace: lease_namespace.clone(),
            name: self.host_claims_configmap.clone(),
        };
        let claims = (self.host_ownership == translate::HostOwnership::FirstNamespace).then(|| {
            status::ClaimsSettings {
                configmap: claims_configmap.clone(),
                grace: self.host_claim_grace,
                max_per_namespace: self.max_host_claims_per_namespace,
            }
        });
        let status = status::Settings {
            publish,
            claims,
            lease_name: self.lease_name.clone(),
            lease_namespace,
            lease_duration: self.lease_duration,
            lease_grace: self.lease_grace,
            identity: instance.clone(),
            translate: translate.clone(),
            gateway_controller: self.gateway_controller_name.clone(),
            gateway_pool,
        };
        Ok(Config {
            api: ApiSettings {
                connect_timeout: self.api_connect_timeout,
                read_timeout: self.api_read_timeout,
            },
            grpc: GrpcSettings {
                listen: self.grpc_listen,
                tls,
                tls_reload_interval: self.tls_reload_interval,
                admin_identities: self.admin_identities.clone(),
                proxy_identities: self.proxy_identities.clone(),
                max_concurrent_streams: self.grpc_max_concurrent_streams,
                max_connection_age: self.grpc_max_connection_age,
                max_connection_age_grace: self.grpc_max_connection_age_grace,
                max_streams_per_identity: self.max_streams_per_identity,
            },
            admin_listen: self.admin_listen,
            watch: WatchSettings {
                watch_timeout_secs: self.watch_timeout_secs(),
                page_size: self.list_page_size,
                discovery_timeout: self.api_read_timeout,
                rediscover_every: self.gateway_api_rediscover_interval,
                claims: claims_configmap,
            },
            publisher: publisher::Settings {
                translate,
                debounce: self.debounce,
                max_delay: self.max_delay,
                max_removal_share: self.max_removal_share,
                confirm_after: self.hold_confirm_after,
                max_snapshot_bytes: self.max_snapshot_bytes,
                tracing,
            },
            status,
            instance,
            log_format: self.log_format,
        })
    }

    /// Server-side timeout for each watch request: renewed before the read timeout fires.
    pub fn watch_timeout_secs(&self) -> u32 {
        ((self.api_read_timeout.as_secs() * 3) / 4).max(1) as u32
    }
}

/// Whether `name` can be a GatewayClass `spec.controllerName`: `<domain>/<path>`, at most
/// 253 characters, the domain lower-case DNS labels, the path non-empty and free of spaces.
fn valid_controller_name(name: &str) -> bool {
    let Some((domain, path)) = name.split_once('/') else {
        return false;
    };
    name.len() <= 253
        && !path.is_empty()
        && !path.contains(char::is_whitespace)
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
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
        let args = Args::try_parse_from(
            ["holdfast-control-plane", "--insecure-plaintext"]
                .into_iter()
                .chain(extra.iter().copied()),
        )
        .map_err(|e| e.to_string())?;
        args.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn grpc_needs_mutual_tls_or_an_explicit_plaintext_flag() {
        let bare = |extra: &[&str]| {
            Args::try_parse_from(
                std::iter::once("holdfast-control-plane").chain(extra.iter().copied()),
            )
            .unwrap()
            .validate()
            .map(|c| c.grpc.tls.is_some())
            .map_err(|e| e.to_string())
        };
        assert!(bare(&[]).unwrap_err().contains("--insecure-plaintext"));
        assert!(
            bare(&["--tls-cert", "c"])
                .unwrap_err()
                .contains("go together")
        );
        let tls = ["--tls-cert", "c", "--tls-key", "k", "--client-ca", "ca"];
        assert!(
            bare(&tls).unwrap_err().contains("--proxy-identities"),
            "mutual TLS needs the proxies' identities"
        );
        assert!(
            bare(&[&tls[..], &["--proxy-identities", ""]].concat())
                .unwrap_err()
                .contains("--proxy-identities")
        );
        let tls = [&tls[..], &["--proxy-identities", "holdfast-proxy-*"]].concat();
        assert_eq!(bare(&tls), Ok(true));
        assert_eq!(bare(&["--insecure-plaintext"]), Ok(false));
        assert!(
            bare(&[&tls[..], &["--insecure-plaintext"]].concat())
                .unwrap_err()
                .contains("--insecure-plaintext")
        );
        assert!(
            bare(&[&tls[..], &["--allow-plaintext-secrets"]].concat())
                .unwrap_err()
                .contains("--allow-plaintext-secrets")
        );
    }

    #[test]
    fn gateway_services_are_configured_whole_or_refused_with_the_flag_named() {
        let c = parse(&[
            "--gateway-service-namespace",
            "holdfast",
            "--gateway-service-selector",
            "app=holdfast-proxy",
            "--gateway-port-range",
            "21000-21099",
            "--gateway-service-type",
            "ClusterIP",
        ])
        .unwrap();
        let mode = c.status.translate.gateway_services.expect("service mode");
        assert_eq!(mode.namespace, "holdfast");
        assert_eq!((mode.first_port, mode.port_count), (21000, 100));
        assert_eq!(mode.service_type, "ClusterIP");
        assert_eq!(mode.bind_address, std::net::Ipv4Addr::UNSPECIFIED);
        let err = |extra: &[&str]| parse(extra).unwrap_err();
        assert!(err(&["--gateway-service-namespace", "h"]).contains("--gateway-service-selector"));
        assert!(
            err(&[
                "--gateway-service-namespace",
                "h",
                "--gateway-service-selector",
                "a=b",
                "--gateway-address-pool",
                "127.10.0.0/16"
            ])
            .contains("exclusive")
        );
        assert!(
            err(&[
                "--gateway-service-namespace",
                "h",
                "--gateway-service-selector",
                "a=b",
                "--gateway-port-range",
                "10-20"
            ])
            .contains("--gateway-port-range")
        );
        assert!(
            parse(&[])
                .unwrap()
                .status
                .translate
                .gateway_services
                .is_none()
        );
    }

    #[test]
    fn defaults_are_valid() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.grpc.listen.port(), 18000);
        assert_eq!(c.publisher.max_removal_share, 0.5);
        assert_eq!(c.watch.watch_timeout_secs, 7);
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        assert_eq!(
            parse(&["--max-removal-share", "1.5"]).unwrap_err(),
            "invalid --max-removal-share: must be between 0 and 1"
        );
        assert!(
            parse(&["--debounce", "2s", "--max-delay", "1s"])
                .unwrap_err()
                .contains("--debounce")
        );
        assert!(
            parse(&["--grpc-listen", "nope"])
                .unwrap_err()
                .contains("--grpc-listen")
        );
        assert!(
            parse(&["--debounce", "soon"])
                .unwrap_err()
                .contains("--debounce")
        );
        assert!(
            parse(&["--api-read-timeout", "1s"])
                .unwrap_err()
                .contains("--api-read-timeout")
        );
        for bad in [
            "holdfast",
            "Holdfast.dev/x",
            "holdfast.dev/",
            "-a.dev/x",
            "a..b/x",
            "a.dev/x y",
        ] {
            assert!(
                parse(&[&format!("--gateway-controller-name={bad}")])
                    .unwrap_err()
                    .contains("--gateway-controller-name"),
                "{bad}"
            );
        }
        assert!(parse(&["--gateway-controller-name", "example.com/gateway/v2"]).is_ok());
        assert!(
            parse(&["--gateway-address-pool", "127.10.0.0"])
                .unwrap_err()
                .contains("--gateway-address-pool")
        );
        assert!(parse(&["--gateway-address-pool", "127.10.0.0/16"]).is_ok());
        assert!(
            parse(&["--gateway-api-rediscover-interval", "500ms"])
                .unwrap_err()
                .contains("--gateway-api-rediscover-interval")
        );
    }
}
