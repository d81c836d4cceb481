//! The world a fault scenario runs in: a private kube-apiserver and etcd, a TCP fault proxy
//! between the control plane and the API server, the control plane, proxies, and N
//! Ingresses (hosts `h<i>.<ns>.test`) whose Services point at two echo backends in a test
//! network namespace.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use holdfast_proto::v1::Snapshot;

use crate::cluster::{AuditLog, LocalCluster};
use crate::control_plane::{ControlPlane, kubeconfig_via};
use crate::faultproxy::FaultProxy;
use crate::netns::TestNet;
use crate::objects::{self, create, create_class};
use crate::proxy::ProxyProc;
use crate::traffic::Traffic;
use crate::wait;

pub use crate::wait::T;

/// How a scenario is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Ingresses (one host and Service each).
    pub ingresses: usize,
    /// Proxy replicas.
    pub proxies: usize,
    /// Extra control-plane flags; one the base also gives replaces the base's.
    pub cp_args: Vec<String>,
    /// The control plane keeps its default API timeouts (the suite shortens them).
    pub default_api_timeouts: bool,
    /// kube-apiserver logs every request it receives ([`Scenario::audit`]).
    pub audit: bool,
    /// Extra flags for each proxy the scenario starts.
    pub proxy_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ingresses: 10,
            proxies: 2,
            cp_args: Vec::new(),
            default_api_timeouts: false,
            audit: false,
            proxy_args: Vec::new(),
        }
    }
}

/// A running scenario.
pub struct Scenario {
    /// The private cluster (killed and restarted by fault tests).
    pub cluster: LocalCluster,
    /// Admin client (direct, not through the fault proxy).
    pub client: kube::Client,
    /// Namespace of the test objects.
    pub ns: String,
    /// Our IngressClass for this scenario.
    pub class: String,
    /// Test hosts with the echo backends.
    pub net: TestNet,
    /// The two echo backends' addresses.
    pub backends: Vec<String>,
    /// Fault proxy between the control plane and the API server.
    pub api_fault: FaultProxy,
    /// The control plane's kubeconfig (through `api_fault`).
    pub cp_kubeconfig: PathBuf,
    /// The control plane.
    pub cp: ControlPlane,
    /// Proxy replicas.
    pub proxies: Vec<ProxyProc>,
    /// Where logs go.
    pub logs: PathBuf,
    /// The proxies' state directories.
    pub state_dirs: Vec<tempfile::TempDir>,
    /// Number of Ingresses created.
    pub ingresses: usize,
    /// kube-apiserver's log of every request, with [`Options::audit`].
    pub audit: Option<AuditLog>,
}

/// Control-plane flags every scenario uses: quick builds, short API timeouts.
pub fn base_cp_args(class: &str) -> Vec<String> {
    [
        "--ingress-class",
        class,
        "--debounce",
        "50ms",
        "--max-delay",
        "500ms",
        "--api-connect-timeout",
        "1s",
        "--api-read-timeout",
        "5s",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// Control-plane flags for a scenario with Gateways: addresses from `pool` (a CIDR no other
/// test uses), and the Gateway API CRDs (installed after the start) looked for every second.
pub fn gateway_cp_args(pool: &str) -> Vec<String> {
    [
        "--gateway-address-pool",
        pool,
        "--gateway-api-rediscover-interval",
        "1s",
    ]
    .map(String::from)
    .to_vec()
}

impl Scenario {
    /// Starts everything and waits until every proxy serves every host.
    pub async fn start(name: &str, opts: Options) -> Result<Self> {
        let cluster = LocalCluster::start()?;
        let audit = opts.audit.then(|| cluster.enable_audit_log()).transpose()?;
        let client = cluster.client().await?;
        let ns = cluster.namespace(&client, name).await?;
        let class = format!("hf-{ns}");
        create_class(&client, &class).await?;
        let mut net = TestNet::create("f")?;
        let a = net.spawn_echo("echo-a", 8080)?.ip().to_string();
        let b = net.spawn_echo("echo-b", 8080)?.ip().to_string();
        let backends = vec![a, b];
        let logs = crate::e2e_logs(&ns)?;
        let api_fault =
            FaultProxy::start(([127, 0, 0, 1], cluster.apiserver_port()?).into()).await?;
        for i in 0..opts.ingresses {
            create_app(&client, &ns, &class, &backends, &host_of(&ns, i), i).await?;
        }
        let cp_kubeconfig = kubeconfig_via(
            &cluster.kubeconfig(),
            api_fault.addr(),
            logs.join("cp.kubeconfig"),
        )?;
        let mut args = base_cp_args(&class);
        if opts.default_api_timeouts {
            for flag in ["--api-connect-timeout", "--api-read-timeout"] {
                if let Some(i) = args.iter().position(|a| a == flag) {
                    args.drain(i..i + 2);
                }
            }
        }
        // A flag in `opts.cp_args` replaces the base's (each is given once).
        for flag in opts.cp_args.iter().filter(|a| a.starts_with("--")) {
            if let Some(i) = args.iter().position(|a| a == flag) {
                args.drain(i..i + 2);
            }
        }
        args.extend(opts.cp_args.iter().cloned());
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let cp = ControlPlane::start("control-plane", &cp_kubeconfig, &logs, &arg_refs)?;
        let mut s = Scenario {
            cluster,
            client,
            ns,
            class,
            net,
            backends,
            api_fault,
            cp_kubeconfig,
            cp,
            proxies: Vec::new(),
            logs,
            state_dirs: Vec::new(),
            ingresses: opts.ingresses,
            audit,
        };
        let proxy_args: Vec<&str> = opts.proxy_args.iter().map(String::as_str).collect();
        for i in 0..opts.proxies {
            s.add_proxy_with(&format!("proxy-{i}"), &[s.cp.grpc_url()], &proxy_args)?;
        }
        s.wait_all_served().await?;
        Ok(s)
    }

    /// Starts one more proxy with its own state directory.
    pub fn add_proxy(&mut self, name: &str, control_planes: &[String]) -> Result<()> {
        self.add_proxy_with(name, control_planes, &[])
    }

    /// Starts one more proxy with its own state directory and `args`.
    pub fn add_proxy_with(
        &mut self,
        name: &str,
        control_planes: &[String],
        args: &[&str],
    ) -> Result<()> {
        let state = tempfile::tempdir()?;
        let p = ProxyProc::start(name, control_planes, state.path(), &self.logs, args)?;
        self.state_dirs.push(state);
        self.proxies.push(p);
        Ok(())
    }

    /// Host of app `i`.
    pub fn host(&self, i: usize) -> String {
        host_of(&self.ns, i)
    }

    /// Every app host.
    pub fn hosts(&self) -> Vec<String> {
        (0..self.ingresses).map(|i| self.host(i)).collect()
    }

    /// Creates app `i` (see [`create_app`]).
    pub async fn create_app(&self, i: usize) -> Result<()> {
        create_app(
            &self.client,
            &self.ns,
            &self.class,
            &self.backends,
            &self.host(i),
            i,
        )
        .await
    }

    /// Proxy client addresses.
    pub fn proxy_addrs(&self) -> Vec<SocketAddr> {
        self.proxies.iter().map(|p| p.addr).collect()
    }

    /// Steady traffic: `rate` requests per second per proxy over every host.
    pub fn traffic(&self, rate: u32) -> Traffic {
        Traffic::start(&self.proxy_addrs(), self.hosts(), rate)
    }

    /// Waits until every proxy answers 200 for every host.
    pub async fn wait_all_served(&self) -> Result<()> {
        for p in &self.proxies {
            for host in self.hosts() {
                wait::until(&format!("{host} served by {}", p.addr), T, || async {
                    match p.get(&host, "/").await {
                        Ok((200, _)) => Ok(Some(())),
                        Ok((code, body)) => Err(format!("{code} {body}")),
                        Err(e) => Err(e.to_string()),
                    }
                })
                .await?;
            }
        }
        Ok(())
    }

    /// The control plane's published snapshot (through the real grpcurl's JSON).
    pub fn published(&self) -> Result<serde_json::Value> {
        crate::grpcurl::call(self.cp.grpc, "holdfast.v1.Admin/GetSnapshot", "{}")
    }

    /// The control plane's published content hash.
    pub fn published_hash(&self) -> Result<String> {
        Ok(self.published()?["contentHash"]
            .as_str()
            .context("no contentHash")?
            .to_owned())
    }

    /// `holdfast_snapshots_published_total` of the control plane (a missing series is an
    /// error: "nothing published" must not pass because the metric is gone).
    pub async fn published_total(&self) -> Result<f64> {
        self.cp
            .metric_value("holdfast_snapshots_published_total")
            .await
    }

    /// The version each proxy serves.
    pub async fn applied_versions(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for p in &self.proxies {
            let (_, body) = p.admin_get("/debug/snapshot").await?;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            out.push(v["version"].as_str().unwrap_or("").to_owned());
        }
        Ok(out)
    }

    /// Waits until the control plane reports every cache complete.
    pub async fn wait_cp_synced(&self) -> Result<()> {
        wait::until("control plane caches complete", T, || async {
            let s = crate::grpcurl::call(self.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")
                .map_err(|e| e.to_string())?;
            let caches = s["caches"].as_array().cloned().unwrap_or_default();
            Ok((caches.len() == holdfast_control_plane::state::KINDS.len()
                && caches.iter().all(|c| c["synced"] == true))
            .then_some(()))
        })
        .await
    }

    /// Waits until the control plane has recorded a watch error (it noticed a fault).
    pub async fn wait_cp_watch_error(&self, within: Duration) -> Result<()> {
        wait::until("a watch error in GetStatus", within, || async {
            let s = crate::grpcurl::call(self.cp.grpc, "holdfast.v1.Admin/GetStatus", "{}")
                .map_err(|e| e.to_string())?;
            let failed = s["caches"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["lastError"].is_string()));
            Ok(failed.then_some(()))
        })
        .await
    }
}

fn host_of(ns: &str, i: usize) -> String {
    format!("h{i}.{ns}.test")
}

/// Creates app `i`: Service `app<i>`, its EndpointSlice (the echo backends) and Ingress
/// `app<i>` for `host`.
pub async fn create_app(
    client: &kube::Client,
    ns: &str,
    class: &str,
    backends: &[String],
    host: &str,
    i: usize,
) -> Result<()> {
    let name = format!("app{i}");
    let eps: Vec<&str> = backends.iter().map(String::as_str).collect();
    create(client, Some(ns), &objects::service(&name, 80, 8080)).await?;
    create(
        client,
        Some(ns),
        &objects::endpoint_slice(&format!("{name}-1"), &name, 8080, &eps),
    )
    .await?;
    create(
        client,
        Some(ns),
        &objects::ingress(&name, class, host, &name, 80),
    )
    .await?;
    Ok(())
}

/// Route count of a snapshot.
pub fn route_count(s: &Snapshot) -> usize {
    holdfast_proto::snapshot::route_count(s)
}
