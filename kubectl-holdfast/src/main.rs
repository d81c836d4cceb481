//! `kubectl-holdfast`, the kubectl plugin (on `PATH`, kubectl runs it as `kubectl
//! holdfast`): finds holdfast's control plane through the kubeconfig, calls its Admin
//! service over mutual TLS with the operator's certificate, and prints what
//! `kubectl_holdfast` makes of the answers.
//!
//! Finding the control plane: the Service `holdfast-control-plane` in `holdfast-system`
//! (both flags), its port named `grpc`, and a ready endpoint of it from its EndpointSlices;
//! the plugin reaches that pod through the API server's port-forward, as `kubectl
//! port-forward` does (the NetworkPolicy keeps the pod network away from the gRPC port).
//! `--control-plane HOST:PORT` connects there directly instead.
//!
//! The operator's certificate: `--cacert`, `--cert` and `--key` (files), or `--credentials
//! DIR` (its `ca.crt`, `tls.crt` and `tls.key`), or else the Secret
//! `holdfast-operator-tls` in the control plane's namespace, read through the kubeconfig
//! (deploy/kubernetes/certificates.yaml issues it).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use holdfast_process::tls::Pems;
use holdfast_proto::v1::admin_client::AdminClient;
use holdfast_proto::v1::{
    GetRolloutRequest, GetSnapshotRequest, GetStatusRequest, ListProxiesRequest,
};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use rustls::pki_types::ServerName;
use tonic::transport::Channel;

#[derive(Parser, Debug)]
#[command(
    name = "kubectl holdfast",
    version,
    about = "holdfast's rollout as its control plane sees it: proxies, objects, routes"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// The kubeconfig (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The control plane's namespace.
    #[arg(long, global = true, default_value = "holdfast-system")]
    control_plane_namespace: String,
    /// The control plane's Service.
    #[arg(long, global = true, default_value = "holdfast-control-plane")]
    control_plane_service: String,
    /// Connect to this HOST:PORT directly (for example a `kubectl port-forward`) instead of
    /// port-forwarding to a pod behind the Service.
    #[arg(long, global = true)]
    control_plane: Option<String>,
    /// The name the control plane's certificate is checked against (default: the
    /// Service's, SERVICE.NAMESPACE.svc).
    #[arg(long, global = true)]
    tls_server_name: Option<String>,
    /// The CA that signs the control plane's certificate (PEM).
    #[arg(long, global = true, requires_all = ["cert", "key"])]
    cacert: Option<PathBuf>,
    /// The operator's client certificate (PEM).
    #[arg(long, global = true, requires_all = ["cacert", "key"])]
    cert: Option<PathBuf>,
    /// The operator's private key (PEM).
    #[arg(long, global = true, requires_all = ["cacert", "cert"])]
    key: Option<PathBuf>,
    /// A directory holding ca.crt, tls.crt and tls.key (a kubernetes.io/tls Secret's keys).
    #[arg(long, global = true, conflicts_with = "cacert")]
    credentials: Option<PathBuf>,
    /// The Secret, in the control plane's namespace, to read the operator's certificate
    /// from when no files are given.
    #[arg(long, global = true, default_value = "holdfast-operator-tls")]
    credentials_secret: String,
    /// Give up after this long.
    #[arg(long, global = true, default_value = "20s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every proxy connected to the control plane: the version it serves, whether that is
    /// the published one, and how far behind it is.
    Status,
    /// How far one object's current generation has rolled out.
    Rollout {
        /// KIND/NAME: ingress/web, httproute/api, grpcroute/NAME, tlsroute/NAME,
        /// gateway/NAME.
        object: String,
        /// The object's namespace (default: the kubeconfig context's, else `default`).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
    /// Which route of the published snapshot serves HOST/PATH, and why (a proxy's
    /// /debug/explain, for the published snapshot).
    Explain {
        /// HOST/PATH, for example example.com/api/v1 (a scheme, port and query are
        /// allowed and left out).
        url: String,
    },
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let timeout = args.timeout;
    match runtime.block_on(async { tokio::time::timeout(timeout, run(args)).await }) {
        Ok(Ok(out)) => {
            print!("{}", kubectl_holdfast::printable(&out));
            std::process::ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("error: {}", kubectl_holdfast::printable(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("error: no answer within {timeout:?} (--timeout)");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<String> {
    let mut kube = Kube::new(&args);
    // Validate the command's input before connecting anywhere.
    let command = match &args.command {
        Command::Status => Ask::Status,
        Command::Rollout { object, namespace } => {
            let (kind, name) = kubectl_holdfast::parse_object(object).map_err(|e| anyhow!(e))?;
            let namespace = match namespace {
                Some(n) => n.clone(),
                None => kube.default_namespace().await,
            };
            Ask::Rollout(GetRolloutRequest {
                kind: kind.into(),
                namespace,
                name,
            })
        }
        Command::Explain { url } => {
            let (host, path) = kubectl_holdfast::parse_url(url).map_err(|e| anyhow!(e))?;
            Ask::Explain(host, path)
        }
    };
    let pems = credentials(&args, &mut kube).await?;
    let config = holdfast_process::tls::client_config_from(&pems)?;
    let replicas = replicas(&args, &mut kube).await?;
    // Each replica is asked within three quarters of --timeout: one that hangs (a Ready pod
    // on a lost node) is listed as not answering, and the others are still shown.
    let each = args.timeout * 3 / 4;
    match command {
        Ask::Status => {
            let asks = replicas.iter().map(|(replica, route)| {
                let (args, config) = (&args, &config);
                async move {
                    let asked = async {
                        let mut admin = admin(connect(args, config, (replica, route)).await?);
                        let status = admin
                            .get_status(GetStatusRequest {})
                            .await
                            .context("Admin/GetStatus")?
                            .into_inner();
                        let proxies = admin
                            .list_proxies(ListProxiesRequest {})
                            .await
                            .context("Admin/ListProxies")?
                            .into_inner();
                        anyhow::Ok((status, proxies))
                    };
                    kubectl_holdfast::Replica {
                        name: replica.clone(),
                        answer: within(each, asked).await,
                    }
                }
            });
            let seen = futures::future::join_all(asks).await;
            no_answer(&seen)?;
            Ok(kubectl_holdfast::status_table(&seen, SystemTime::now()))
        }
        Ask::Rollout(request) => {
            let what = format!("{} {}/{}", request.kind, request.namespace, request.name);
            let asks = replicas.iter().map(|(replica, route)| {
                let (args, config, request, what) = (&args, &config, &request, &what);
                async move {
                    let asked = async {
                        let mut admin = admin(connect(args, config, (replica, route)).await?);
                        let rollout = admin.get_rollout(request.clone()).await.map_err(|s| {
                            if s.code() == tonic::Code::NotFound {
                                anyhow!(
                                    "{what}: the control plane does not know it ({})",
                                    s.message()
                                )
                            } else {
                                anyhow!("Admin/GetRollout: {s}")
                            }
                        })?;
                        anyhow::Ok(rollout.into_inner())
                    };
                    kubectl_holdfast::Replica {
                        name: replica.clone(),
                        answer: within(each, asked).await,
                    }
                }
            });
            let seen = futures::future::join_all(asks).await;
            no_answer(&seen)?;
            Ok(kubectl_holdfast::rollout_text(&seen))
        }
        Ask::Explain(host, path) => {
            // Every replica publishes the same content; the first that answers is asked,
            // each within its share of the time.
            let each = each / u32::try_from(replicas.len()).unwrap_or(u32::MAX).max(1);
            let mut last = None;
            for (replica, route) in &replicas {
                let asked = async {
                    let mut admin = admin(connect(&args, &config, (replica, route)).await?);
                    let snapshot = admin
                        .get_snapshot(GetSnapshotRequest {})
                        .await
                        .context("Admin/GetSnapshot")?
                        .into_inner();
                    anyhow::Ok(snapshot)
                };
                match within(each, asked).await.map_err(|e| anyhow!(e)) {
                    Ok(snapshot) => {
                        let table =
                            holdfast_data_plane::table::RouteTable::compile_without_keys(&snapshot)
                                .context("compiling the published snapshot")?;
                        let explained = holdfast_data_plane::admin::explain(
                            Some(&table),
                            &host,
                            &path,
                            holdfast_http::path::EscapedSlashes::default(),
                        );
                        return Ok(kubectl_holdfast::explain_text(&host, &path, &explained));
                    }
                    Err(e) => last = Some(e.context(format!("replica {replica}"))),
                }
            }
            Err(last.unwrap_or_else(|| anyhow!("no control plane replica")))
        }
    }
}

/// `asked`'s answer, or why there is none (its error, or no answer within `each`).
async fn within<T>(
    each: Duration,
    asked: impl std::future::Future<Output = Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(each, asked).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err(format!("no answer within {each:?}")),
    }
}

/// An error when no replica answered (a view with nothing in it would hide why); a view
/// when at least one did, the others listed with why not.
fn no_answer<T>(seen: &[kubectl_holdfast::Replica<T>]) -> Result<()> {
    if seen.iter().any(|r| r.answer.is_ok()) {
        return Ok(());
    }
    let why: Vec<String> = seen
        .iter()
        .filter_map(|r| r.answer.as_ref().err().map(|e| format!("{}: {e}", r.name)))
        .collect();
    bail!("{}", why.join("; "))
}

/// The Admin client on `channel`, taking snapshots of any size a proxy takes.
fn admin(channel: Channel) -> AdminClient<Channel> {
    AdminClient::new(channel).max_decoding_message_size(holdfast_proto::client::MAX_RESPONSE_BYTES)
}

enum Ask {
    Status,
    Rollout(GetRolloutRequest),
    Explain(String, String),
}

/// The Kubernetes client, made when first needed (not at all with `--control-plane` and
/// certificate files).
struct Kube {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    client: Option<kube::Client>,
}

impl Kube {
    fn new(args: &Args) -> Self {
        Kube {
            kubeconfig: args.kubeconfig.clone(),
            context: args.context.clone(),
            client: None,
        }
    }

    /// The kubeconfig context's namespace, as kubectl takes it; `default` when there is
    /// no kubeconfig or it names none.
    async fn default_namespace(&mut self) -> String {
        match self.config().await {
            Ok(config) => config.default_namespace,
            Err(_) => "default".into(),
        }
    }

    async fn client(&mut self) -> Result<kube::Client> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let client = kube::Client::try_from(self.config().await?)?;
        self.client = Some(client.clone());
        Ok(client)
    }

    async fn config(&self) -> Result<kube::Config> {
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &options).await?
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
            None => kube::Config::infer()
                .await
                .context("no kubeconfig found (--kubeconfig, $KUBECONFIG, ~/.kube/config)")?,
        };
        Ok(config)
    }
}

/// The operator's certificate, key and CA: from the files given, else the Secret.
async fn credentials(args: &Args, kube: &mut Kube) -> Result<Pems> {
    let files = match (&args.cacert, &args.cert, &args.key, &args.credentials) {
        (Some(ca), Some(cert), Some(key), _) => Some((cert.clone(), key.clone(), ca.clone())),
        (_, _, _, Some(dir)) => {
            Some((dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt")))
        }
        _ => None,
    };
    if let Some((cert, key, ca)) = files {
        return Ok(holdfast_process::tls::Files { cert, key, ca }.read_all()?);
    }
    let (ns, name) = (&args.control_plane_namespace, &args.credentials_secret);
    let secrets: Api<Secret> = Api::namespaced(kube.client().await?, ns);
    let secret = secrets.get(name).await.with_context(|| {
        format!(
            "reading the operator's certificate from Secret {ns}/{name} (or give --credentials DIR, or --cacert, --cert and --key)"
        )
    })?;
    let data = secret.data.unwrap_or_default();
    let key = |k: &str| -> Result<Vec<u8>> {
        data.get(k)
            .map(|v| v.0.clone())
            .with_context(|| format!("Secret {ns}/{name} has no {k}"))
    };
    Ok(Pems {
        cert: key("tls.crt")?,
        key: key("tls.key")?,
        ca: key("ca.crt")?,
        names: ["tls.crt", "tls.key", "ca.crt"].map(|k| format!("secret/{name}:{k}").into()),
    })
}

/// Where the connection goes: a TCP address, or a pod's port through the API server.
#[derive(Clone)]
enum Route {
    Direct(String),
    PortForward {
        pods: Box<Api<Pod>>,
        pod: String,
        port: u16,
    },
}

/// The control plane's replicas: the address given, or every ready pod of the Service.
async fn replicas(args: &Args, kube: &mut Kube) -> Result<Vec<(String, Route)>> {
    match &args.control_plane {
        Some(address) => Ok(vec![(address.clone(), Route::Direct(address.clone()))]),
        None => find_pods(args, kube).await,
    }
}

/// A gRPC channel to one replica over mutual TLS.
async fn connect(
    args: &Args,
    config: &std::sync::Arc<rustls::ClientConfig>,
    (replica, route): (&str, &Route),
) -> Result<Channel> {
    let name = args.tls_server_name.clone().unwrap_or_else(|| {
        format!(
            "{}.{}.svc",
            args.control_plane_service, args.control_plane_namespace
        )
    });
    let name = ServerName::try_from(name.clone())
        .map_err(|_| anyhow!("--tls-server-name {name:?} is not a DNS name or IP address"))?;
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let what = match route {
        Route::Direct(_) => replica.to_owned(),
        Route::PortForward { .. } => format!("{replica} (port-forwarded)"),
    };
    let route = route.clone();
    let connect = tower::service_fn(move |_: http::Uri| {
        let (connector, name, route) = (connector.clone(), name.clone(), route.clone());
        async move {
            match route {
                Route::Direct(address) => {
                    let tcp = tokio::net::TcpStream::connect(&address).await?;
                    tcp.set_nodelay(true)?;
                    let tls = connector.connect(name, tcp).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(Box::new(tls) as Box<dyn Io>))
                }
                Route::PortForward { pods, pod, port } => {
                    let mut forward = pods
                        .portforward(&pod, &[port])
                        .await
                        .map_err(std::io::Error::other)?;
                    let stream = forward
                        .take_stream(port)
                        .ok_or_else(|| std::io::Error::other("the port-forward gave no stream"))?;
                    let tls = connector.connect(name, stream).await?;
                    Ok(TokioIo::new(Box::new(tls) as Box<dyn Io>))
                }
            }
        }
    });
    // TLS happens in the connector.
    tonic::transport::Endpoint::from_static("http://holdfast-control-plane")
        .connect_with_connector(connect)
        .await
        .with_context(|| format!("connecting to the control plane at {what}"))
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// Every ready pod behind the control plane's Service (its replicas), each with its
/// `grpc` port.
async fn find_pods(args: &Args, kube: &mut Kube) -> Result<Vec<(String, Route)>> {
    let (ns, name) = (&args.control_plane_namespace, &args.control_plane_service);
    let client = kube.client().await?;
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| {
            format!("finding the control plane's Service {ns}/{name} (--control-plane-namespace, --control-plane-service)")
        })?;
    let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("grpc"))
        .or_else(|| ports.first())
        .with_context(|| format!("Service {ns}/{name} has no ports"))?;
    // An unnamed port is "" in an EndpointSlice.
    let port_name = port.name.clone().unwrap_or_default();
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
        .await
        .with_context(|| format!("listing the EndpointSlices of Service {ns}/{name}"))?;
    let mut found: Vec<(String, Route)> = Vec::new();
    for slice in &slices.items {
        let Some(number) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or_default() == port_name)
            .and_then(|p| p.port)
        else {
            continue;
        };
        let Ok(port) = u16::try_from(number) else {
            continue;
        };
        // An unset `ready` means ready (the EndpointSlice API's rule).
        let ready = slice.endpoints.iter().filter(|e| {
            e.conditions.as_ref().and_then(|c| c.ready) != Some(false)
                && e.target_ref.as_ref().and_then(|t| t.kind.as_deref()) == Some("Pod")
        });
        for pod in ready.filter_map(|e| e.target_ref.as_ref()?.name.clone()) {
            if found.iter().any(|(p, _)| *p == pod) {
                continue;
            }
            let route = Route::PortForward {
                pods: Box::new(Api::namespaced(client.clone(), ns)),
                pod: pod.clone(),
                port,
            };
            found.push((pod, route));
        }
    }
    if found.is_empty() {
        bail!("Service {ns}/{name} has no ready pod (or use --control-plane HOST:PORT)");
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::Args;

    /// docs/reference.md's table of the plugin's flags is made from this definition
    /// (`HOLDFAST_BLESS=1` rewrites it).
    #[test]
    fn the_flag_reference_in_the_docs_is_current() {
        use clap::CommandFactory;
        holdfast_process::flags::assert_documented(env!("CARGO_MANIFEST_DIR"), &Args::command());
    }
}
