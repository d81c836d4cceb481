//! holdfast-pod-agent: runs the pods that kwok schedules to its fake Node as real processes,
//! with no container runtime. For each pod that kwok has given an address, it makes a
//! network namespace holding that address on a bridge to the host, starts each container's
//! program (known images only: echo-basic and coredns) with the container's args and
//! environment and its Secret and ConfigMap volumes written to disk and mounted read-only
//! at their paths (in the process's own mount namespace), writes the output as CRI log
//! lines, and marks the pod Ready once every declared TCP port listens. A pod whose image
//! it does not know, or whose environment or mounts it cannot make, is reported in the
//! pod's Ready condition and never marked Ready; one whose Secret or ConfigMap does not
//! exist yet waits for it (as a kubelet does), and says so. A deleted pod's process and
//! namespace are removed. The decisions are in `holdfast_tests::pod_agent`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::StreamExt;
use holdfast_tests::pod_agent::{
    Mount, Volume, VolumeObject, cri_line, environment, logs_object, mounts, ports, program_args,
    program_for, readiness_patch, volume_files,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Debug, Parser)]
struct Args {
    /// Admin kubeconfig of the cluster.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The Node whose pods this agent runs.
    #[arg(long)]
    node: String,
    /// The pods' /24 (`a.b.c`, the Node's podCIDR): the bridge takes `a.b.c.254`.
    #[arg(long)]
    subnet: String,
    /// Where the programs are (`k8s.sh tools-dir`).
    #[arg(long)]
    tools_bin: PathBuf,
    /// Pod logs: `<dir>/<namespace>_<pod>_<uid>/<container>/0.log`.
    #[arg(long)]
    log_dir: PathBuf,
    /// Exits (cleaning up) once this process is gone.
    #[arg(long)]
    owner_pid: Option<u32>,
}

/// A pod the agent runs.
struct Running {
    /// The pod as the agent started it (to report on when the agent stops).
    pod: Option<Pod>,
    netns: String,
    host_if: String,
    /// Its processes' waiters (each owns its child, killed when the task is aborted), log
    /// copiers and readiness check.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn ip(args: &[&str]) -> Result<()> {
    run_tool("ip", args)
}

/// Runs `program` (found on the system path, whatever this process's environment) and
/// fails with its error output if it fails.
fn run_tool(program: &str, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new(program)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Whether `addr` is `a.b.c.1` to `a.b.c.253` of `subnet` (`a.b.c`).
fn in_subnet(addr: IpAddr, subnet: &str) -> bool {
    match addr {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            format!("{a}.{b}.{c}") == subnet && (1..=253).contains(&d)
        }
        IpAddr::V6(_) => false,
    }
}

fn now() -> String {
    humantime::format_rfc3339_nanos(SystemTime::now()).to_string()
}

struct Agent {
    args: Args,
    client: Client,
    reporter: Reporter,
    bridge: String,
    next: u32,
    running: HashMap<String, Running>,
    /// Pods waiting for a Secret or ConfigMap their volumes hold, with the reason last
    /// reported: tried again each second, reported again when the reason changes.
    waiting: HashMap<String, (Pod, String)>,
}

/// A container the agent will start: its program, args, environment and mounts.
struct Planned {
    container: k8s_openapi::api::core::v1::Container,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    mounts: Vec<Mount>,
}

impl Agent {
    fn key(pod: &Pod) -> String {
        pod.metadata.uid.clone().unwrap_or_default()
    }

    /// Starts `pod` if it has an address and is not running yet.
    async fn start(&mut self, pod: &Pod) {
        let key = Self::key(pod);
        if key.is_empty() || self.running.contains_key(&key) {
            return;
        }
        let Some(addr) = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|s| s.parse::<IpAddr>().ok())
        else {
            return;
        };
        // Only an address on the bridge's /24 (not the bridge's own .254): anything else
        // would be reached through the host's routes, off this machine.
        if !in_subnet(addr, &self.args.subnet) {
            let why = format!(
                "address {addr} is outside the agent's {}.0/24",
                self.args.subnet
            );
            self.reporter
                .report(pod, false, "AddressOutsideSubnet", &why)
                .await;
            self.running.insert(key, Running::none());
            return;
        }
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.clone())
            .unwrap_or_default();
        let mut planned = Vec::new();
        let mut volumes: Vec<Volume> = Vec::new();
        for c in &containers {
            let image = c.image.clone().unwrap_or_default();
            let Some(program) = program_for(&image, &self.args.tools_bin) else {
                let why = format!("the pod agent runs no program for image {image:?}");
                eprintln!("pod-agent: {why}");
                self.reporter.report(pod, false, "UnknownImage", &why).await;
                // Remembered, so it is reported once and never started.
                self.running.insert(key, Running::none());
                return;
            };
            let made = program_args(c).and_then(|args| {
                let (v, m) = mounts(pod, c)?;
                let env = environment(pod, c).map_err(|e| e.0)?;
                Ok((args, v, m, env))
            });
            match made {
                Ok((args, v, m, env)) => {
                    for v in v {
                        if !volumes.iter().any(|known| known.name == v.name) {
                            volumes.push(v);
                        }
                    }
                    planned.push(Planned {
                        container: c.clone(),
                        program,
                        args,
                        env,
                        mounts: m,
                    });
                }
                Err(why) => {
                    self.reporter.report(pod, false, "Unsupported", &why).await;
                    self.running.insert(key, Running::none());
                    return;
                }
            }
        }
        let meta = &pod.metadata;
        let pod_dir = self.args.log_dir.join(format!(
            "{}_{}_{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
            key
        ));
        // The volumes' files, before anything else is made: a pod whose Secret or
        // ConfigMap is missing waits for it, as a kubelet's does.
        if let Err(why) = self.write_volumes(pod, &volumes, &pod_dir).await {
            let reported = self.waiting.insert(key, (pod.clone(), why.clone()));
            if reported.is_none_or(|(_, before)| before != why) {
                self.reporter
                    .report(pod, false, "VolumeNotReady", &why)
                    .await;
            }
            return;
        }
        self.waiting.remove(&key);
        self.next += 1;
        let pid = std::process::id();
        let netns = format!("hf-{pid}-pod{}", self.next);
        let host_if = format!("hp{pid:x}x{}", self.next);
        let ns_if = format!("hn{pid:x}x{}", self.next);
        let mut running = Running {
            pod: Some(pod.clone()),
            netns: netns.clone(),
            host_if: host_if.clone(),
            tasks: Vec::new(),
        };
        let setup = (|| -> Result<()> {
            ip(&["netns", "add", &netns])?;
            ip(&[
                "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
            ])?;
            ip(&["link", "set", &ns_if, "netns", &netns])?;
            ip(&["link", "set", &host_if, "master", &self.bridge])?;
            ip(&["link", "set", &host_if, "up"])?;
            ip(&[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &ns_if,
            ])?;
            ip(&["-n", &netns, "link", "set", &ns_if, "up"])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
            // No default route: a pod reaches its /24 (the other pods, and the host at
            // .254) and nothing else, so nothing it runs can send traffic off this machine.
            Ok(())
        })();
        if let Err(e) = setup {
            eprintln!("pod-agent: network for {key}: {e:#}");
            running.stop().await;
            self.reporter
                .report(pod, false, "NetworkSetupFailed", &e.to_string())
                .await;
            self.running.insert(key, Running::none());
            return;
        }
        let mut wanted_ports = Vec::new();
        let mut files = Vec::new();
        for p in planned {
            let c = &p.container;
            files.push((c.name.clone(), pod_dir.join(&c.name).join("0.log")));
            let binds: Vec<(PathBuf, PathBuf)> = p
                .mounts
                .iter()
                .map(|m| (pod_dir.join("volumes").join(&m.volume), m.target.clone()))
                .collect();
            let how = Launch {
                netns: &netns,
                program: &p.program,
                args: &p.args,
                env: &p.env,
                binds: &binds,
                dir: &pod_dir.join(&c.name),
            };
            match spawn(how).await {
                Ok((mut child, tasks)) => {
                    running.tasks.extend(tasks);
                    // A process that ends takes its pod out of Ready. Aborting this task
                    // (the pod stopped) drops the child, which kills it.
                    let (client, pod2, name) = (self.client.clone(), pod.clone(), c.name.clone());
                    running.tasks.push(tokio::spawn(async move {
                        let status = child.wait().await;
                        let why = format!("container {name} exited: {status:?}");
                        Reporter { client }
                            .report(&pod2, false, "ContainerExited", &why)
                            .await;
                    }));
                }
                Err(e) => {
                    self.reporter
                        .report(pod, false, "StartFailed", &format!("{e:#}"))
                        .await;
                    running.stop().await;
                    self.running.insert(key, Running::none());
                    return;
                }
            }
            wanted_ports.extend(ports(c));
        }
        // kwok serves the files through pods/log once a Logs object names them.
        if let Err(e) = self.publish_logs(pod, &files).await {
            eprintln!("pod-agent: Logs object for {key}: {e:#}");
        }
        // Ready once every declared port accepts a connection at the pod's address.
        let (client, pod2) = (self.client.clone(), pod.clone());
        running.tasks.push(tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            for port in &wanted_ports {
                let target = SocketAddr::new(addr, *port);
                loop {
                    let tried = tokio::time::timeout(
                        Duration::from_millis(500),
                        tokio::net::TcpStream::connect(target),
                    )
                    .await;
                    if matches!(tried, Ok(Ok(_))) {
                        break;
                    }
                    if tokio::time::Instant::now() > deadline {
                        let why = format!("port {port} did not listen within 120 s");
                        Reporter { client }
                            .report(&pod2, false, "PortsNotListening", &why)
                            .await;
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            let listed: Vec<String> = wanted_ports.iter().map(u16::to_string).collect();
            Reporter { client }
                .report(
                    &pod2,
                    true,
                    "PortsListening",
                    &format!("listening: {}", listed.join(",")),
                )
                .await;
        }));
        self.running.insert(key, running);
    }

    async fn publish_logs(&self, pod: &Pod, files: &[(String, PathBuf)]) -> Result<()> {
        let ns = pod.metadata.namespace.as_deref().context("no namespace")?;
        let name = pod.metadata.name.as_deref().context("no name")?;
        let gvk = kube::api::GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "Logs");
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "logs");
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &resource);
        let object: kube::api::DynamicObject = serde_json::from_value(logs_object(pod, files))?;
        api.patch(
            name,
            &PatchParams::apply("holdfast-pod-agent").force(),
            &Patch::Apply(&object),
        )
        .await?;
        Ok(())
    }

    /// Writes each volume's files under `<pod_dir>/volumes/<name>/`, or says what is
    /// missing.
    async fn write_volumes(
        &self,
        pod: &Pod,
        volumes: &[Volume],
        pod_dir: &Path,
    ) -> Result<(), String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        for v in volumes {
            let data: Option<std::collections::BTreeMap<String, Vec<u8>>> = match &v.object {
                VolumeObject::Secret(name) => {
                    let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
                    let got = api
                        .get_opt(name)
                        .await
                        .map_err(|e| format!("Secret {name:?}: {e}"))?;
                    got.map(|s| {
                        s.data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0))
                            .collect()
                    })
                }
                VolumeObject::ConfigMap(name) => {
                    let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
                    let got = api
                        .get_opt(name)
                        .await
                        .map_err(|e| format!("ConfigMap {name:?}: {e}"))?;
                    got.map(|c| {
                        let text = c
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.into_bytes()));
                        let binary = c
                            .binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0));
                        text.chain(binary).collect()
                    })
                }
            };
            let files = volume_files(v, data.as_ref())?;
            let dir = pod_dir.join("volumes").join(&v.name);
            let written = (|| -> std::io::Result<()> {
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)?;
                }
                std::fs::create_dir_all(&dir)?;
                for (path, bytes) in &files {
                    let file = dir.join(path);
                    if let Some(parent) = file.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    std::fs::write(file, bytes)?;
                }
                Ok(())
            })();
            written.map_err(|e| format!("volume {:?}: writing {}: {e}", v.name, dir.display()))?;
        }
        Ok(())
    }

    async fn stop(&mut self, pod: &Pod) {
        self.waiting.remove(&Self::key(pod));
        if let Some(r) = self.running.remove(&Self::key(pod)) {
            r.stop().await;
        }
    }
}

/// The status writer, for tasks that outlive a borrow of the agent.
struct Reporter {
    client: Client,
}

impl Reporter {
    async fn report(&self, pod: &Pod, ready: bool, reason: &str, message: &str) {
        let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let patch = readiness_patch(pod, ready, reason, message, &now());
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            eprintln!("pod-agent: status of {ns}/{name}: {e}");
        }
    }
}

impl Running {
    fn none() -> Self {
        Running {
            pod: None,
            netns: String::new(),
            host_if: String::new(),
            tasks: Vec::new(),
        }
    }

    async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        // Aborted tasks drop their children (kill_on_drop) once they have stopped.
        for t in self.tasks {
            let _ = t.await;
        }
        if !self.netns.is_empty() {
            let _ = ip(&["netns", "del", &self.netns]);
        }
        if !self.host_if.is_empty() {
            let _ = ip(&["link", "del", &self.host_if]);
        }
    }
}

/// How to start one container's program.
struct Launch<'a> {
    netns: &'a str,
    program: &'a Path,
    args: &'a [String],
    env: &'a [(String, String)],
    /// Volume directories and where the program sees them.
    binds: &'a [(PathBuf, PathBuf)],
    /// Its log (`0.log`) and its mounts' scratch space.
    dir: &'a Path,
}

/// Starts a container's program in its network namespace with exactly its environment,
/// through this binary's `exec-in-pod` (which mounts the volumes first), its output
/// written as CRI lines to `<dir>/0.log`.
async fn spawn(
    how: Launch<'_>,
) -> Result<(tokio::process::Child, Vec<tokio::task::JoinHandle<()>>)> {
    let dir = how.dir;
    std::fs::create_dir_all(dir)?;
    let log = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("0.log"))
        .await?;
    let log = std::sync::Arc::new(tokio::sync::Mutex::new(log));
    let mut command = tokio::process::Command::new("ip");
    command
        .args(["netns", "exec", how.netns])
        .arg(std::env::current_exe()?)
        .arg(EXEC_IN_POD)
        .arg(dir.join("mnt"));
    for (source, target) in how.binds {
        command.arg("--bind").arg(source).arg(target);
    }
    let mut child = command
        .arg("--")
        .arg(how.program)
        .args(how.args)
        .env_clear()
        .envs(how.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", how.program.display()))?;
    let mut tasks = Vec::new();
    let streams: Vec<(&'static str, Box<dyn tokio::io::AsyncRead + Send + Unpin>)> = vec![
        ("stdout", Box::new(child.stdout.take().context("stdout")?)),
        ("stderr", Box::new(child.stderr.take().context("stderr")?)),
    ];
    for (name, stream) in streams {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            // Any bytes: a line that is not UTF-8 is written lossily, never ends the copy
            // (which would leave the program blocked on a full pipe).
            while matches!(reader.read_until(b'\n', &mut line).await, Ok(n) if n > 0) {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                let mut f = log.lock().await;
                let _ = f.write_all(cri_line(&now(), name, text).as_bytes()).await;
                line.clear();
            }
        }));
    }
    Ok((child, tasks))
}

async fn run(args: Args) -> Result<()> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = Client::try_from(config)?;
    // Before anything is made: a SIGTERM from here on cleans up.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let bridge = format!("hfb{}", std::process::id());
    let made = ip(&["link", "add", &bridge, "type", "bridge"])
        .and_then(|()| {
            ip(&[
                "addr",
                "add",
                &format!("{}.254/24", args.subnet),
                "dev",
                &bridge,
            ])
        })
        .and_then(|()| ip(&["link", "set", &bridge, "up"]));
    if let Err(e) = made {
        let _ = ip(&["link", "del", &bridge]);
        return Err(e);
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={}", args.node);
    let owner = args.owner_pid;
    let mut agent = Agent {
        args,
        reporter: Reporter {
            client: client.clone(),
        },
        client,
        bridge: bridge.clone(),
        next: 0,
        running: HashMap::new(),
        waiting: HashMap::new(),
    };
    let mut events = std::pin::pin!(
        watcher::watcher(pods, watcher::Config::default().fields(&selector)).default_backoff()
    );
    // The pods a (re-)list saw: after it, those the agent runs that it did not see are
    // gone (no Delete event comes for pods deleted while the watch was down).
    let mut listed: Option<std::collections::HashSet<String>> = None;
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = check.tick() => {
                if owner.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                    break;
                }
                let waiting: Vec<Pod> = agent.waiting.values().map(|(p, _)| p.clone()).collect();
                for pod in waiting {
                    agent.start(&pod).await;
                }
            }
            event = events.next() => match event {
                None => break,
                Some(Err(e)) => eprintln!("pod-agent: watch: {e}"),
                Some(Ok(event @ (Event::Apply(_) | Event::InitApply(_)))) => {
                    let (Event::Apply(pod) | Event::InitApply(pod)) = event else { continue };
                    if let Some(seen) = listed.as_mut() {
                        seen.insert(Agent::key(&pod));
                    }
                    if pod.metadata.deletion_timestamp.is_some() {
                        agent.stop(&pod).await;
                    } else {
                        agent.start(&pod).await;
                    }
                }
                Some(Ok(Event::Delete(pod))) => agent.stop(&pod).await,
                Some(Ok(Event::Init)) => listed = Some(Default::default()),
                Some(Ok(Event::InitDone)) => {
                    let seen = listed.take().unwrap_or_default();
                    let gone: Vec<String> =
                        agent.running.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                    for key in gone {
                        if let Some(r) = agent.running.remove(&key) {
                            r.stop().await;
                        }
                    }
                    agent.waiting.retain(|k, _| seen.contains(k));
                }
            },
        }
    }
    // Stopping: no pod it ran stays Ready.
    for (_, r) in agent.running.drain() {
        if let Some(pod) = r.pod.clone() {
            agent
                .reporter
                .report(&pod, false, "AgentStopped", "the pod agent stopped")
                .await;
        }
        r.stop().await;
    }
    let _ = ip(&["link", "del", &bridge]);
    Ok(())
}

/// The first argument that makes this binary the launcher of one container's program:
/// `exec-in-pod SCRATCH [--bind SOURCE TARGET]... -- PROGRAM ARGS...`, run by
/// `ip netns exec`, which has already given it a mount namespace of its own (no mount it
/// makes reaches the host). Each SOURCE directory is bind-mounted read-only at TARGET; a
/// TARGET that does not exist is made in an overlay of its nearest existing parent, whose
/// writable layer is under SCRATCH. Then PROGRAM replaces this process.
const EXEC_IN_POD: &str = "exec-in-pod";

fn exec_in_pod(args: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let (scratch, rest) = args
        .split_first()
        .context("exec-in-pod: no scratch directory")?;
    let split = rest
        .iter()
        .position(|a| a == "--")
        .context("exec-in-pod: no --")?;
    let (binds, program) = (&rest[..split], &rest[split + 1..]);
    let (program, program_args) = program.split_first().context("exec-in-pod: no program")?;
    if binds.len() % 3 != 0 || binds.chunks(3).any(|b| b[0] != "--bind") {
        bail!("exec-in-pod: expected --bind SOURCE TARGET, got {binds:?}");
    }
    // Opened before anything is mounted: a mount may hide the program's path (a volume at
    // /root hides a program under /root). Executed through /proc/self/fd, whose descriptor
    // closes at exec.
    let file = std::fs::File::open(program).with_context(|| format!("opening {program}"))?;
    for (n, bind) in binds.chunks(3).enumerate() {
        let (source, target) = (Path::new(&bind[1]), Path::new(&bind[2]));
        if !target.is_dir() {
            if target.exists() {
                bail!("{}: exists and is not a directory", target.display());
            }
            let parent = target
                .ancestors()
                .find(|a| a.is_dir())
                .context("no existing parent")?;
            if parent == Path::new("/") {
                bail!("{}: the pod agent does not overlay /", target.display());
            }
            let layer = Path::new(scratch).join(n.to_string());
            let (upper, work) = (layer.join("upper"), layer.join("work"));
            std::fs::create_dir_all(&upper)?;
            std::fs::create_dir_all(&work)?;
            let options = format!(
                "lowerdir={},upperdir={},workdir={}",
                parent.display(),
                upper.display(),
                work.display()
            );
            run_mount(&[
                "-t",
                "overlay",
                "overlay",
                "-o",
                &options,
                &parent.to_string_lossy(),
            ])?;
            std::fs::create_dir_all(target)?;
        }
        let (source, target) = (source.to_string_lossy(), target.to_string_lossy());
        run_mount(&["--bind", &source, &target])?;
        run_mount(&["-o", "remount,bind,ro", &target])?;
    }
    use std::os::fd::AsRawFd;
    let e = std::process::Command::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .arg0(program)
        .args(program_args)
        .exec();
    Err(e).with_context(|| format!("exec {program}"))
}

fn run_mount(args: &[&str]) -> Result<()> {
    run_tool("mount", args)
}

fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(EXEC_IN_POD) {
        return exec_in_pod(&argv[2..]);
    }
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}
