//! Test hosts with real addresses: a network namespace the test creates itself.
//!
//! The API server rejects loopback addresses in EndpointSlices, so backend "pods" live in a
//! namespace joined to the host by a veth pair, on a private /24 (10.X.Y.0/24) allocated
//! per [`TestNet`]. Traffic goes only to those self-made hosts and 127.0.0.1.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cluster::run_script;

/// A network namespace with one veth link to the host. Dropping it kills every process
/// inside, deletes the namespace and releases its subnet.
#[derive(Debug)]
pub struct TestNet {
    name: String,
    subnet: [u8; 3],
    lock: PathBuf,
    next_host: u8,
    children: Vec<Child>,
}

/// Where subnet leases are kept: one file per /24, holding the owner's pid.
fn lease_dir() -> PathBuf {
    std::env::temp_dir().join("holdfast-netns-leases")
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Leases a free 10.X.Y.0/24 for this process (stale leases of dead owners are reclaimed).
pub(crate) fn lease_subnet() -> Result<([u8; 3], PathBuf)> {
    let dir = lease_dir();
    std::fs::create_dir_all(&dir)?;
    let me = std::process::id();
    for x in 200..=250u8 {
        for y in 0..=255u8 {
            let path = dir.join(format!("10.{x}.{y}"));
            if let Ok(owner) = std::fs::read_to_string(&path) {
                match owner.trim().parse::<u32>() {
                    Ok(pid) if pid_alive(pid) => continue,
                    _ => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    write!(f, "{me}")?;
                    return Ok(([10, x, y], path));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    bail!("no free test subnet in 10.200.0.0-10.250.255.0")
}

impl TestNet {
    /// Creates namespace `hf-<pid>-<suffix><n>` with the host at `10.X.Y.1` and the
    /// namespace's first address at `10.X.Y.2`.
    pub fn create(suffix: &str) -> Result<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "hf-{}-{suffix}{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let (subnet, lock) = lease_subnet()?;
        let prefix = format!("{}.{}.{}", subnet[0], subnet[1], subnet[2]);
        let net = TestNet {
            name,
            subnet,
            lock,
            next_host: 3,
            children: Vec::new(),
        };
        run_script(&["netns", "up", &net.name, &prefix])?;
        Ok(net)
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's address on the link.
    pub fn host_addr(&self) -> IpAddr {
        self.addr(1)
    }

    fn addr(&self, host: u8) -> IpAddr {
        let [a, b, c] = self.subnet;
        IpAddr::V4(Ipv4Addr::new(a, b, c, host))
    }

    /// Adds one more address inside the namespace (a new "pod") and returns it.
    pub fn add_host(&mut self) -> Result<IpAddr> {
        if self.next_host == 255 {
            bail!("test net {} has no addresses left", self.name);
        }
        let ip = self.addr(self.next_host);
        self.next_host += 1;
        let status = Command::new("ip")
            .args([
                "-n",
                &self.name,
                "addr",
                "add",
                &format!("{ip}/32"),
                "dev",
                "lo",
            ])
            .status()?;
        if !status.success() {
            bail!("adding {ip} to {} failed", self.name);
        }
        Ok(ip)
    }

    /// Runs `program args…` inside the namespace; it is killed when this net is dropped.
    pub fn spawn(&mut self, program: &std::path::Path, args: &[&str]) -> Result<u32> {
        self.spawn_env(program, args, &[])
    }

    /// [`TestNet::spawn`], with `env` added to the program's environment.
    pub fn spawn_env(
        &mut self,
        program: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<u32> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {} in {}", program.display(), self.name))?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Starts an echo backend named `name` on a new address inside the namespace, port
    /// `port`, and waits until the host can connect to it.
    pub fn spawn_echo(&mut self, name: &str, port: u16) -> Result<SocketAddr> {
        let ip = self.add_host()?;
        let addr = SocketAddr::new(ip, port);
        let echo = crate::workspace_bin("holdfast-echo");
        self.spawn(&echo, &["--listen", &addr.to_string(), "--name", name])?;
        crate::wait::until_blocking(
            &format!("echo backend {name} at {addr}"),
            Duration::from_secs(10),
            || match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(_) => Ok(Some(())),
                Err(e) => Err(e.to_string()),
            },
        )?;
        Ok(addr)
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Err(e) = run_script(&["netns", "down", &self.name]) {
            eprintln!("removing test net {}: {e:#}", self.name);
        }
        let _ = std::fs::remove_file(&self.lock);
    }
}
