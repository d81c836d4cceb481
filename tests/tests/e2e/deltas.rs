//! Delta delivery as a whole, as a property: over random sequences of
//! Ingress, Service, EndpointSlice and Secret changes, with reconnects, lost ACKs, NACKs
//! and switches between control-plane replicas injected at random points, every proxy
//! ends each step serving exactly (same content hash) what a fresh translator builds from
//! the control plane's caches.
//!
//! The parts are real, in one process: two control-plane replicas (a long-lived
//! `Translator` each, `build_with` and `offer` as the reconcile loop calls them, the
//! `Discovery` gRPC service on a real socket); two proxies (the data plane's `Applier`
//! and its `subscriber::run` loop, with state directories), each reaching each replica
//! through its own TCP fault proxy; and a scripted subscriber that applies deltas itself
//! and NACKs one when told to. The caches are the test's `ClusterState`, so a step is one
//! change to it, which both replicas build.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use holdfast_control_plane::authn;
use holdfast_control_plane::discovery::Discovery;
use holdfast_control_plane::publisher::{build_with, offer};
use holdfast_control_plane::state::Shared;
use holdfast_control_plane::translate::{self, ClusterState, Options, Translator};
use holdfast_data_plane::subscriber::{self, Applier};
use holdfast_proto::delta;
use holdfast_proto::v1::{Node, Snapshot};
use holdfast_tests::faultproxy::{FaultProxy, Mode};
use holdfast_tests::objects;
use holdfast_tests::subscriber::Subscriber;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const CLASS: &str = "holdfast";
const HOSTS: usize = 4;
const SERVICES: usize = 3;

/// One step of a sequence.
#[derive(Debug, Clone)]
enum Op {
    /// Ingress `i` (host `h<i>.test`) routes to Service `s<svc>`, over TLS or not; or is
    /// deleted.
    Ingress {
        i: usize,
        svc: usize,
        tls: bool,
        delete: bool,
    },
    /// Service `s<i>`'s port changes (or it is deleted).
    Service { i: usize, port: i32, delete: bool },
    /// Service `s<i>`'s endpoints change (or its EndpointSlice is deleted).
    Slice {
        i: usize,
        endpoints: u8,
        delete: bool,
    },
    /// The Secret is renewed with the other certificate.
    RotateSecret,
    /// Proxy (or, for 2, the scripted subscriber) reconnects.
    Reconnect(usize),
    /// Proxy `p`'s ACK of the next change is lost, then it reconnects.
    LoseAck(usize),
    /// The scripted subscriber NACKs the next delta it gets.
    Nack,
    /// Proxy `p` moves to the other replica (the one it used refuses connections).
    Switch(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..HOSTS, 0..SERVICES, any::<bool>(), prop::bool::weighted(0.15))
            .prop_map(|(i, svc, tls, delete)| Op::Ingress { i, svc, tls, delete }),
        1 => (0..SERVICES, 80..83i32, prop::bool::weighted(0.2))
            .prop_map(|(i, port, delete)| Op::Service { i, port, delete }),
        3 => (0..SERVICES, 0..4u8, prop::bool::weighted(0.15))
            .prop_map(|(i, endpoints, delete)| Op::Slice { i, endpoints, delete }),
        1 => Just(Op::RotateSecret),
        1 => (0..3usize).prop_map(Op::Reconnect),
        1 => (0..2usize).prop_map(Op::LoseAck),
        1 => Just(Op::Nack),
        1 => (0..2usize).prop_map(Op::Switch),
    ]
}

/// The caches: objects by name, turned into a `ClusterState` (each change is a new
/// object, as a watch delivers).
struct Cluster {
    ingresses: BTreeMap<usize, Arc<k8s_openapi::api::networking::v1::Ingress>>,
    services: BTreeMap<usize, Arc<k8s_openapi::api::core::v1::Service>>,
    slices: BTreeMap<usize, Arc<k8s_openapi::api::discovery::v1::EndpointSlice>>,
    secret: Arc<Secret>,
    certs: [(String, String); 2],
    cert: usize,
}

fn in_ns<T: kube::Resource>(mut o: T) -> T {
    o.meta_mut().namespace = Some(NS.into());
    o
}

fn tls_secret(chain: &str, key: &str) -> Secret {
    let mut s = Secret {
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".into(), ByteString(chain.as_bytes().to_vec())),
            ("tls.key".into(), ByteString(key.as_bytes().to_vec())),
        ])),
        ..Default::default()
    };
    s.metadata.name = Some("tls".into());
    in_ns(s)
}

fn certificate() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let names: Vec<String> = (0..HOSTS).map(|i| format!("h{i}.test")).collect();
    let cert = rcgen::CertificateParams::new(names)
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    (cert.pem(), key.serialize_pem())
}

impl Cluster {
    fn new() -> Self {
        let certs = [certificate(), certificate()];
        let secret = Arc::new(tls_secret(&certs[0].0, &certs[0].1));
        let mut c = Cluster {
            ingresses: BTreeMap::new(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            secret,
            certs,
            cert: 0,
        };
        // An Ingress no `Op` touches: the snapshot never loses every route, which the
        // bounded-destruction guard would hold back.
        c.move_anchor(0);
        for i in 0..SERVICES {
            c.apply(&Op::Service {
                i,
                port: 80,
                delete: false,
            });
            c.apply(&Op::Slice {
                i,
                endpoints: 2,
                delete: false,
            });
        }
        c
    }

    /// Gives the anchor Ingress the host `anchor-<n>.test`.
    fn move_anchor(&mut self, n: usize) {
        let host = format!("anchor-{n}.test");
        let anchor = objects::ingress("anchor", CLASS, &host, "s0", 80);
        self.ingresses.insert(HOSTS, Arc::new(in_ns(anchor)));
    }

    /// Applies a cluster change; false for the other kinds of step.
    fn apply(&mut self, op: &Op) -> bool {
        match *op {
            Op::Ingress {
                i,
                svc,
                tls,
                delete,
            } => {
                if delete {
                    self.ingresses.remove(&i);
                } else {
                    let (name, host, svc) =
                        (format!("i{i}"), format!("h{i}.test"), format!("s{svc}"));
                    let ing = if tls {
                        objects::tls_ingress(
                            &name,
                            CLASS,
                            &host,
                            &svc,
                            80,
                            "tls",
                            serde_json::json!({}),
                        )
                    } else {
                        objects::ingress(&name, CLASS, &host, &svc, 80)
                    };
                    self.ingresses.insert(i, Arc::new(in_ns(ing)));
                }
            }
            Op::Service { i, port, delete } => {
                if delete {
                    self.services.remove(&i);
                } else {
                    let mut svc = objects::service(&format!("s{i}"), 80, 8080);
                    if let Some(p) = svc.spec.as_mut().and_then(|s| s.ports.as_mut()) {
                        p[0].port = port;
                    }
                    self.services.insert(i, Arc::new(in_ns(svc)));
                }
            }
            Op::Slice {
                i,
                endpoints,
                delete,
            } => {
                if delete {
                    self.slices.remove(&i);
                } else {
                    let addresses: Vec<String> = (0..endpoints)
                        .map(|e| format!("10.0.{i}.{}", e + 1))
                        .collect();
                    let addresses: Vec<&str> = addresses.iter().map(String::as_str).collect();
                    let slice = objects::endpoint_slice(
                        &format!("s{i}-x"),
                        &format!("s{i}"),
                        8080,
                        &addresses,
                    );
                    self.slices.insert(i, Arc::new(in_ns(slice)));
                }
            }
            Op::RotateSecret => {
                self.cert = 1 - self.cert;
                let (chain, key) = &self.certs[self.cert];
                self.secret = Arc::new(tls_secret(chain, key));
            }
            _ => return false,
        }
        true
    }

    fn state(&self) -> ClusterState {
        ClusterState {
            ingress_classes: vec![Arc::new(objects::ingress_class(CLASS))],
            ingresses: self.ingresses.values().cloned().collect(),
            services: self.services.values().cloned().collect(),
            endpoint_slices: self.slices.values().cloned().collect(),
            secrets: vec![self.secret.clone()],
            host_claims: Vec::new(),
            ..Default::default()
        }
    }
}

/// A control-plane replica: its own long-lived translator and published state, serving
/// route discovery on 127.0.0.1.
struct Replica {
    shared: Shared,
    translator: Translator,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Replica {
    async fn start() -> anyhow::Result<Self> {
        let mut registry = prometheus_client::registry::Registry::default();
        let shared = Shared::new(holdfast_control_plane::metrics::Metrics::new(&mut registry));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let service = Discovery::new(shared.clone(), authn::Mode::Plaintext, usize::MAX);
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Ok(Replica {
            shared,
            translator: Translator::default(),
            addr,
            server,
        })
    }

    /// Builds the caches as the reconcile loop does, and offers the result.
    fn build(&mut self, state: &ClusterState, revision: u64) {
        let (built, _) = build_with(&mut self.translator, state, &Options::default(), revision)
            .expect("a build is valid");
        // Any share of routes may go (the anchor Ingress keeps one): nothing is held.
        offer(&self.shared, built, 1.0, usize::MAX);
    }
}

/// A proxy: the data plane's applier and subscription loop, reaching replica r through
/// `faults[r]`.
struct Proxy {
    applier: Arc<Applier>,
    metrics: holdfast_data_plane::metrics::Metrics,
    faults: [FaultProxy; 2],
    /// The replica it is meant to use (the other refuses it).
    active: usize,
    /// When its connections were last cut: a stream the control plane registered
    /// before then is dead, even if the control plane has not noticed yet.
    cut: SystemTime,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    async fn start(id: &str, replicas: &[Replica]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let state_dir = dir.path().join("state");
        holdfast_data_plane::persist::prepare_dir(&state_dir)?;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = holdfast_data_plane::metrics::Metrics::new(&mut registry);
        let applier = Arc::new(Applier::new(
            Arc::new(ArcSwapOption::empty()),
            state_dir,
            metrics.clone(),
            usize::MAX,
        ));
        let faults = [
            FaultProxy::start(replicas[0].addr).await?,
            FaultProxy::start(replicas[1].addr).await?,
        ];
        faults[1].set(Mode::Refuse);
        let urls = faults
            .iter()
            .map(|f| format!("http://{}", f.addr()))
            .collect();
        let shutdown = CancellationToken::new();
        let node = Node {
            id: id.into(),
            zone: "test".into(),
        };
        let task = tokio::spawn(subscriber::run(
            urls,
            node,
            applier.clone(),
            metrics.clone(),
            None,
            shutdown.clone(),
        ));
        Ok(Proxy {
            applier,
            metrics,
            faults,
            active: 0,
            cut: SystemTime::UNIX_EPOCH,
            shutdown,
            task,
            _dir: dir,
        })
    }

    fn serving(&self) -> Option<String> {
        self.applier.serving().map(|(_, hash)| hash)
    }

    /// Drops its connections; it reconnects (to the replica it is meant to use).
    fn reconnect(&mut self) {
        self.cut = SystemTime::now();
        self.faults[self.active].reset_existing();
    }

    /// Moves it to the other replica.
    fn switch(&mut self) {
        let (from, to) = (self.active, 1 - self.active);
        self.cut = SystemTime::now();
        self.faults[to].set(Mode::Pass);
        self.faults[from].set(Mode::Refuse);
        self.faults[from].reset_existing();
        self.active = to;
    }
}

/// A subscriber that applies deltas itself (`delta::apply`) and NACKs one on request.
struct Scripted {
    sub: Subscriber,
    url: String,
    nack_next: bool,
    nacked: usize,
    /// A NACK was sent; the next response must be a complete snapshot.
    expect_complete: bool,
}

impl Scripted {
    /// Reads and answers responses until it serves `hash`.
    async fn converge(&mut self, hash: &str, step: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + holdfast_tests::wait::T;
        while self.sub.serving.as_ref().map(|s| s.content_hash.as_str()) != Some(hash) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Some(response) = self.sub.next(left).await? else {
                anyhow::bail!("step {step}: the scripted subscriber never reached {hash}");
            };
            let nonce = response.nonce.clone();
            match response.delta.clone() {
                Some(d) => {
                    anyhow::ensure!(
                        !self.expect_complete,
                        "step {step}: a delta answered a NACK; a complete snapshot must"
                    );
                    if self.nack_next {
                        self.nack_next = false;
                        self.nacked += 1;
                        self.expect_complete = true;
                        self.sub.nack(&response, "told to").await?;
                        continue;
                    }
                    let base = self.sub.serving.as_ref().expect("a delta has a base");
                    let next = delta::apply(base, &d).map_err(|e| {
                        anyhow::anyhow!("step {step}: the delta does not apply: {e}")
                    })?;
                    self.sub.ack_with(&nonce, next).await?;
                }
                None => {
                    self.expect_complete = false;
                    let snapshot: Snapshot = response.clone().into_snapshot().expect("a snapshot");
                    holdfast_proto::snapshot::validate(&snapshot)?;
                    self.sub.ack(response).await?;
                }
            }
        }
        Ok(())
    }

    async fn reconnect(&mut self) -> anyhow::Result<()> {
        let holds = self.sub.serving.clone();
        self.sub = Subscriber::connect_with(&self.url, "scripted", holds, 0, true).await?;
        self.expect_complete = false;
        Ok(())
    }
}

/// Waits until `replica` has the ACK of what `proxy` (node `id`) serves, on a stream
/// opened since the proxy's connections were last cut (the stream that was cut may still
/// be listed, with the same ACK, until the control plane notices).
async fn acked(replica: &Replica, id: &str, proxy: &Proxy) -> anyhow::Result<()> {
    let cut = proxy
        .cut
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    holdfast_tests::wait::until(&format!("{id}'s ACK"), holdfast_tests::wait::T, || async {
        let serving = proxy.applier.serving().map(|(v, _)| v).unwrap_or_default();
        let live: Vec<String> = replica
            .shared
            .proxies()
            .into_iter()
            .filter(|s| s.id == id)
            .filter(|s| {
                s.connected_since.as_ref().is_some_and(|t| {
                    Duration::new(t.seconds.max(0) as u64, t.nanos.max(0) as u32) > cut
                })
            })
            .map(|s| s.acked_version)
            .collect();
        if live.contains(&serving) {
            Ok(Some(()))
        } else {
            Err(format!("serving {serving}, ACKed on live streams {live:?}"))
        }
    })
    .await
}

/// Waits until `proxy` serves `hash`.
async fn converge(proxy: &Proxy, which: usize, hash: &str, step: usize) -> anyhow::Result<()> {
    let what = format!("step {step}: proxy {which} to serve {hash}");
    holdfast_tests::wait::until(&what, holdfast_tests::wait::T, || async {
        match proxy.serving() {
            Some(h) if h == hash => Ok(Some(())),
            other => Err(format!("it serves {other:?}")),
        }
    })
    .await
}

async fn run(ops: Vec<Op>) -> anyhow::Result<()> {
    let mut cluster = Cluster::new();
    let mut replicas = [Replica::start().await?, Replica::start().await?];
    let mut revision = 1;
    for r in replicas.iter_mut() {
        r.build(&cluster.state(), revision);
    }
    let mut proxies = [
        Proxy::start("proxy-0", &replicas).await?,
        Proxy::start("proxy-1", &replicas).await?,
    ];
    let first = translate::translate(&cluster.state(), &Options::default())
        .content
        .content_hash;
    for (i, p) in proxies.iter().enumerate() {
        converge(p, i, &first, 0).await?;
    }
    let url = format!("http://{}", replicas[0].addr);
    let mut scripted = Scripted {
        sub: Subscriber::connect_with(&url, "scripted", None, 0, true).await?,
        url,
        nack_next: false,
        nacked: 0,
        expect_complete: false,
    };
    for (step, op) in ops.iter().enumerate() {
        // A lost ACK: the proxy gets the next change but its answer never arrives. (Its
        // ACK of what it serves now must have arrived first: a stream carries one
        // snapshot at a time.)
        let losing = match op {
            Op::LoseAck(p) => {
                let proxy = &proxies[*p];
                acked(&replicas[proxy.active], &format!("proxy-{p}"), proxy).await?;
                proxy.faults[proxy.active].set(Mode::DropFromClient);
                Some(*p)
            }
            _ => None,
        };
        if cluster.apply(op) || losing.is_some() {
            if losing.is_some() {
                // The change whose ACK is lost: one that changes what is served
                // whatever the sequence did before (an EndpointSlice change may not).
                cluster.move_anchor(step + 1);
            }
            revision += 1;
            for r in replicas.iter_mut() {
                r.build(&cluster.state(), revision);
            }
        }
        let fresh = translate::translate(&cluster.state(), &Options::default())
            .content
            .content_hash;
        if let Some(p) = losing {
            converge(&proxies[p], p, &fresh, step).await?;
            let proxy = &mut proxies[p];
            proxy.faults[proxy.active].set(Mode::Pass);
            proxy.reconnect();
        }
        match op {
            Op::Reconnect(2) => scripted.reconnect().await?,
            Op::Reconnect(p) => proxies[*p].reconnect(),
            Op::Switch(p) => proxies[*p].switch(),
            Op::Nack => scripted.nack_next = true,
            _ => {}
        }
        for (i, p) in proxies.iter().enumerate() {
            converge(p, i, &fresh, step).await?;
        }
        scripted.converge(&fresh, step).await?;
    }
    // Deltas carried the changes: a proxy took a complete snapshot only to start, and at
    // most once for each time its stream was cut (a reconnect, a switch, a lost ACK),
    // when the difference from what it stated was not smaller. A NACKed delta was
    // answered with a complete snapshot (the scripted subscriber checks each).
    for (i, p) in proxies.iter().enumerate() {
        let complete = p.metrics.applied.get() - p.metrics.deltas_received.get();
        let cuts = ops
            .iter()
            .filter(|o| matches!(o, Op::Reconnect(x) | Op::Switch(x) | Op::LoseAck(x) if *x == i))
            .count() as u64;
        assert!(
            complete <= 1 + cuts,
            "proxy {i} took {complete} complete snapshots with {cuts} cut streams ({} deltas)",
            p.metrics.deltas_received.get()
        );
    }
    let resyncs: u64 = replicas
        .iter()
        .map(|r| r.shared.metrics().delta_resyncs.get())
        .sum();
    assert_eq!(
        resyncs as usize, scripted.nacked,
        "each NACKed delta is one resync"
    );
    for p in &proxies {
        p.shutdown.cancel();
    }
    for p in proxies {
        let _ = p.task.await;
    }
    for r in replicas {
        r.server.abort();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 6,
        max_shrink_iters: 16,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_proxy_serves_a_fresh_build_through_changes_reconnects_lost_acks_nacks_and_replica_switches(
        ops in prop::collection::vec(op(), 15..35)
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let outcome = rt.block_on(run(ops));
        prop_assert!(outcome.is_ok(), "{:?}", outcome.err());
    }
}
