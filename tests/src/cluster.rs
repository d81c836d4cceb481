//! A private, real Kubernetes API server (etcd + kube-apiserver) for tests.
//!
//! All process management lives in `deploy/local/k8s.sh`; this module only calls it, so the
//! demo, the tests and a person at a terminal start the cluster the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tempfile::TempDir;

/// One of the two server processes `k8s.sh up` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    KubeApiserver,
}

impl Component {
    fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
        }
    }
}

/// Path of `deploy/local/k8s.sh`.
pub fn script() -> PathBuf {
    crate::repo_root().join("deploy/local/k8s.sh")
}

/// Runs `k8s.sh ARGS…` and returns its stdout, or an error with its stderr.
pub fn run_script(args: &[&str]) -> Result<String> {
    run_script_env(args, &[])
}

/// [`run_script`] with `env` added to the script's environment.
pub fn run_script_env(args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .envs(env.iter().copied())
        // Owner of everything `up` / `netns up` start: if this test binary dies without
        // unwinding, a watchdog tears its cluster down.
        .env("HOLDFAST_OWNER_PID", std::process::id().to_string())
        .output()
        .with_context(|| format!("running k8s.sh {args:?}"))?;
    check(out, &format!("k8s.sh {}", args.join(" ")))
}

fn check(out: Output, what: &str) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Directory holding the pinned tools (`etcd`, `kube-apiserver`, `kubectl`, `grpcurl`),
/// built on first use.
pub fn tools_bin() -> Result<PathBuf> {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    if let Some(bin) = BIN.get() {
        return Ok(bin.clone());
    }
    run_script(&["ensure"])?;
    let bin = PathBuf::from(run_script(&["tools-dir"])?.trim());
    Ok(BIN.get_or_init(|| bin).clone())
}

/// The fake Node of a cluster started with [`LocalCluster::start_with_workloads`].
pub const WORKLOAD_NODE: &str = "kwok-node-0";

/// A running `holdfast-pod-agent` (see [`LocalCluster::start_pod_agent`]).
#[derive(Debug)]
pub struct PodAgent {
    child: std::process::Child,
}

impl PodAgent {
    /// The agent's pid: its network namespaces are `hf-<pid>-pod<n>`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PodAgent {
    fn drop(&mut self) {
        // SIGTERM: the agent stops its pods and removes their namespaces and its bridge.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Killed before it cleaned up: its namespaces and bridge go now (their owner is
        // dead), before this cluster's pod subnet is released.
        if let Err(e) = run_script(&["netns", "gc"]) {
            eprintln!("removing the pod agent's namespaces: {e:#}");
        }
    }
}

/// A running local cluster. Dropping it stops both processes and removes its directory.
#[derive(Debug)]
pub struct LocalCluster {
    dir: TempDir,
    /// With workloads: the pods' /24 (`a.b.c`), leased for this cluster, and its lease.
    pod_subnet: Option<([u8; 3], PathBuf)>,
}

impl LocalCluster {
    /// Starts a private etcd + kube-apiserver in a fresh directory and waits for `/readyz`.
    pub fn start() -> Result<Self> {
        Self::start_with(&[], None)
    }

    /// `k8s.sh up DIR EXTRA…` in a fresh directory (with the pods' subnet, if any).
    fn start_with(extra: &[&str], pod_subnet: Option<([u8; 3], PathBuf)>) -> Result<Self> {
        tools_bin()?;
        let root = std::env::temp_dir().join("holdfast-tests");
        std::fs::create_dir_all(&root)?;
        remove_stale_clusters(&root);
        let dir = tempfile::Builder::new()
            .prefix(&format!("k8s-{}-", std::process::id()))
            .tempdir_in(root)?;
        let subnet = pod_subnet
            .as_ref()
            .map(|([a, b, c], _)| format!("{a}.{b}.{c}"));
        let cluster = LocalCluster { dir, pod_subnet };
        let mut args = vec!["up", cluster.dir_str()];
        args.extend_from_slice(extra);
        match &subnet {
            Some(s) => run_script_env(&args, &[("HOLDFAST_POD_SUBNET", s)])?,
            None => run_script(&args)?,
        };
        Ok(cluster)
    }

    /// Starts a private cluster that runs workloads (`k8s.sh up --workloads`): etcd and
    /// kube-apiserver, kube-controller-manager (Deployments, ReplicaSets, EndpointSlices,
    /// ServiceAccounts, garbage collection, namespaces), kube-scheduler and kwok with one
    /// fake Node, [`WORKLOAD_NODE`]. Pods are scheduled to it and given an address from
    /// a /24 leased for this cluster ([`LocalCluster::pod_subnet`]) and phase Running; kwok
    /// never makes them Ready ([`LocalCluster::start_pod_agent`] does, once they serve).
    pub fn start_with_workloads() -> Result<Self> {
        let lease = crate::netns::lease_subnet()?;
        Self::start_with(&["--workloads"], Some(lease))
    }

    /// The pods' /24 (`[a, b, c]` of `a.b.c.0/24`) of a cluster with workloads.
    pub fn pod_subnet(&self) -> Option<[u8; 3]> {
        self.pod_subnet.as_ref().map(|(s, _)| *s)
    }

    /// Starts `holdfast-pod-agent` for this cluster's kwok Node: it runs the pods kwok
    /// schedules there as real processes, each in a network namespace holding the pod's
    /// address, and marks them Ready once they listen. Stopped (and its namespaces and
    /// bridge removed) when the returned handle is dropped.
    pub fn start_pod_agent(&self) -> Result<PodAgent> {
        let [a, b, c] = self
            .pod_subnet()
            .context("the pod agent needs a cluster started with workloads")?;
        let log = std::fs::File::create(self.dir().join("pod-agent.log"))?;
        let child = Command::new(crate::workspace_bin("holdfast-pod-agent"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--node", WORKLOAD_NODE, "--subnet", &format!("{a}.{b}.{c}")])
            .arg("--tools-bin")
            .arg(tools_bin()?)
            .arg("--log-dir")
            .arg(self.dir().join("pods"))
            .args(["--owner-pid", &std::process::id().to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting holdfast-pod-agent")?;
        Ok(PodAgent { child })
    }

    /// One cluster shared by every test in this test binary; give each test its own
    /// namespace with [`LocalCluster::namespace`]. Fault tests that stop or kill a component
    /// must use [`LocalCluster::start`] instead. The shared cluster is torn down by the
    /// watchdog when the test binary exits.
    pub fn shared() -> &'static LocalCluster {
        static SHARED: OnceLock<LocalCluster> = OnceLock::new();
        SHARED.get_or_init(|| LocalCluster::start().expect("starting the shared local cluster"))
    }

    /// The cluster's directory (certificates, logs, pid files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn dir_str(&self) -> &str {
        self.dir.path().to_str().expect("temp dir path is UTF-8")
    }

    /// Admin kubeconfig (system:masters).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir().join("kubeconfig")
    }

    /// Port kube-apiserver listens on (127.0.0.1).
    pub fn apiserver_port(&self) -> Result<u16> {
        let s = std::fs::read_to_string(self.dir().join("kube-apiserver.port"))?;
        Ok(s.trim().parse()?)
    }

    /// Pid of a component, if it is running.
    pub fn pid(&self, component: Component) -> Option<u32> {
        let s =
            std::fs::read_to_string(self.dir().join(format!("{}.pid", component.name()))).ok()?;
        let pid: u32 = s.trim().parse().ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// An admin `kube::Client` (create one per test: a client belongs to its runtime).
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig()).await
    }

    /// `kubectl --kubeconfig <admin>` ready for arguments.
    pub fn kubectl(&self) -> Result<Command> {
        let mut cmd = Command::new(tools_bin()?.join("kubectl"));
        cmd.arg("--kubeconfig").arg(self.kubeconfig());
        Ok(cmd)
    }

    /// Runs kubectl with `args`, failing with its output if it fails.
    pub fn kubectl_run(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl()?.args(args).output()?;
        check(out, &format!("kubectl {}", args.join(" ")))
    }

    /// Installs the pinned Gateway API standard-channel CRDs (`k8s.sh gateway-api-crds`)
    /// and waits until GatewayClass, Gateway, HTTPRoute and ReferenceGrant are
    /// Established.
    pub fn install_gateway_api(&self) -> Result<()> {
        self.install_gateway_api_channel("gateway-api-crds")
    }

    /// Installs Gateway API's experimental-channel CRDs at the pinned version (a superset
    /// of the standard channel: what features still experimental there need) and waits
    /// until they are established.
    pub fn install_gateway_api_experimental(&self) -> Result<()> {
        self.install_gateway_api_channel("gateway-api-experimental-crds")
    }

    fn install_gateway_api_channel(&self, command: &str) -> Result<()> {
        let crds = run_script(&[command])?;
        self.kubectl_run(&["apply", "--server-side", "-f", crds.trim()])?;
        self.kubectl_run(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/gatewayclasses.gateway.networking.k8s.io",
            "crd/gateways.gateway.networking.k8s.io",
            "crd/httproutes.gateway.networking.k8s.io",
            "crd/grpcroutes.gateway.networking.k8s.io",
            "crd/tlsroutes.gateway.networking.k8s.io",
            "crd/referencegrants.gateway.networking.k8s.io",
        ])?;
        Ok(())
    }

    /// Stops a component with SIGTERM (or SIGKILL when `kill`) and waits until it is gone.
    pub fn stop(&self, component: Component, kill: bool) -> Result<()> {
        let sig = if kill { "KILL" } else { "TERM" };
        run_script(&["stop", component.name(), self.dir_str(), sig]).map(drop)
    }

    /// Starts a stopped component again with the same flags, ports and data; for
    /// kube-apiserver this waits for `/readyz`.
    pub fn restart(&self, component: Component) -> Result<()> {
        run_script(&["start", component.name(), self.dir_str()]).map(drop)
    }

    /// Creates a fresh namespace named `<prefix>-<pid>-<n>` and returns its name.
    pub async fn namespace(&self, client: &kube::Client, prefix: &str) -> Result<String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        kube::Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(name)
    }

    /// Restarts kube-apiserver so that it logs every request it receives (audit level
    /// Metadata, at the RequestReceived stage: one line a request, watches included, as
    /// it arrives) to the returned file. Later restarts keep the log.
    pub fn enable_audit_log(&self) -> Result<AuditLog> {
        let policy = self.dir().join("audit-policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\n\
             omitStages: [ResponseStarted, ResponseComplete, Panic]\n\
             rules:\n- level: Metadata\n",
        )?;
        let log = self.dir().join("audit.log");
        // `start` restarts a component with the flags in its args file, one a line.
        let args = self.dir().join("kube-apiserver.args");
        let mut flags = std::fs::read_to_string(&args)?;
        if !flags.contains("--audit-log-path") {
            if !flags.ends_with('\n') {
                flags.push('\n');
            }
            flags.push_str(&format!(
                "--audit-policy-file={}\n--audit-log-path={}\n--audit-log-mode=blocking\n",
                policy.display(),
                log.display()
            ));
            std::fs::write(&args, flags)?;
        }
        self.stop(Component::KubeApiserver, false)?;
        self.restart(Component::KubeApiserver)?;
        Ok(AuditLog { path: log })
    }

    /// Writes a kubeconfig for ServiceAccount `sa` in `namespace` (a TokenRequest token)
    /// and returns its path.
    pub fn service_account_kubeconfig(&self, namespace: &str, sa: &str) -> Result<PathBuf> {
        let out = self.dir().join(format!("sa-{namespace}-{sa}.kubeconfig"));
        let out_str = out.to_str().expect("UTF-8 path");
        run_script(&["sa-kubeconfig", namespace, sa, out_str, self.dir_str()])?;
        Ok(out)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if let Err(e) = run_script(&["down", self.dir_str()]) {
            eprintln!("tearing down {}: {e:#}", self.dir().display());
        }
        if let Some((_, lease)) = &self.pod_subnet {
            let _ = std::fs::remove_file(lease);
        }
    }
}

/// kube-apiserver's audit log (see [`LocalCluster::enable_audit_log`]).
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
}

/// One request kube-apiserver received, as its audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditedRequest {
    /// Who asked (`system:serviceaccount:<namespace>:<name>` for a ServiceAccount).
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `patch`, …
    pub verb: String,
    /// The resource (`services`, `ingresses`, …); empty for a non-resource URL.
    pub resource: String,
    /// The object's namespace and name, when the request names them.
    pub object: String,
}

impl AuditLog {
    /// Where the log is up to: pass it to [`AuditLog::since`] for what comes after.
    pub fn position(&self) -> Result<u64> {
        Ok(std::fs::metadata(&self.path).map_or(0, |m| m.len()))
    }

    /// The requests logged after `position`.
    pub fn since(&self, position: u64) -> Result<Vec<AuditedRequest>> {
        let bytes = std::fs::read(&self.path)?;
        let text = String::from_utf8_lossy(bytes.get(position as usize..).unwrap_or_default());
        let mut out = Vec::new();
        // A line being written as this reads is left for the next read.
        for line in text.lines().filter(|l| l.ends_with('}')) {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("an audit line that is not JSON: {line}"))?;
            let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            let o = &v["objectRef"];
            out.push(AuditedRequest {
                user: field(&v["user"]["username"]),
                verb: field(&v["verb"]),
                resource: field(&o["resource"]),
                object: format!("{}/{}", field(&o["namespace"]), field(&o["name"])),
            });
        }
        Ok(out)
    }
}

/// Removes cluster directories of test binaries that are gone (their watchdog already
/// stopped the processes; `down` again is harmless).
fn remove_stale_clusters(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix("k8s-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = owner
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let path = entry.path();
            let _ = run_script(&["down", &path.to_string_lossy()]);
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// A `kube::Client` from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}
