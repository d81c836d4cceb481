//! What the leader writes: the leader (a `coordination.k8s.io` Lease, via
//! kube-lease-manager) records the host claims ledger ([`crate::claims`]) in its
//! ConfigMap, writes `status.loadBalancer` of our Ingresses from `--publish-address`
//! or from the proxies' Service (`--publish-service`), and marks our GatewayClasses
//! Accepted ([`crate::gateway_api::gateway_class_status`]). Every replica watches and serves
//! proxies; only this writing is leader-only. What to write is computed from the caches
//! by pure functions; the loop only writes what differs.

use std::sync::Arc;
use std::time::Duration;

use std::time::{Instant, SystemTime};

use holdfast_proto::v1::KindProgress;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::PostParams;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Client, Resource};
use kube_lease_manager::LeaseManagerBuilder;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::caches::{Caches, ClaimsConfigMap};
use crate::claims;
use crate::discovery::UNBOUND_UNKNOWN;
use crate::gateway_api;
use crate::programmed::{self, Tracker};
use crate::publisher::Events;
use crate::state::Shared;
use crate::translate::{self, ClusterState};

/// Where the address to publish comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// Fixed IPs or host names.
    Addresses(Vec<String>),
    /// The proxies' Service: its load-balancer ingress, else external IPs, else cluster IP.
    Service {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// The host claims ledger's settings.
#[derive(Debug, Clone)]
pub struct ClaimsSettings {
    /// Where the ledger is recorded.
    pub configmap: ClaimsConfigMap,
    /// A claim is released once its namespace has named the host in none of its
    /// Ingresses for this long (`--host-claim-grace`).
    pub grace: Duration,
    /// Claims one namespace may hold (`--max-host-claims-per-namespace`).
    pub max_per_namespace: usize,
}

/// Leader election and what the leader writes.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What to publish in Ingress status; None: status is not written.
    pub publish: Option<Publish>,
    /// The host claims ledger; None with `--host-ownership shared`.
    pub claims: Option<ClaimsSettings>,
    /// Lease name.
    pub lease_name: String,
    /// Lease namespace (the control plane's own).
    pub lease_namespace: String,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Renew this long before the lease expires.
    pub lease_grace: Duration,
    /// This replica's identity.
    pub identity: String,
    /// What makes an Ingress ours.
    pub translate: translate::Options,
    /// The GatewayClass `spec.controllerName` that is ours (`--gateway-controller-name`).
    pub gateway_controller: String,
    /// Where our Gateways' addresses come from (`--gateway-address-pool`).
    pub gateway_pool: Option<gateway_api::status::Pool>,
}

fn entry(address: &str) -> IngressLoadBalancerIngress {
    if address.parse::<std::net::IpAddr>().is_ok() {
        IngressLoadBalancerIngress {
            ip: Some(address.to_owned()),
            ..Default::default()
        }
    } else {
        IngressLoadBalancerIngress {
            hostname: Some(address.to_owned()),
            ..Default::default()
        }
    }
}

/// The `status.loadBalancer.ingress` our Ingresses should carry, if it is known.
pub fn desired(
    publish: &Publish,
    services: &[Arc<Service>],
) -> Option<Vec<IngressLoadBalancerIngress>> {
    let addresses: Vec<String> = match publish {
        Publish::Addresses(a) => a.clone(),
        Publish::Service { namespace, name } => {
            let svc = services.iter().find(|s| {
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.metadata.name.as_deref() == Some(name)
            })?;
            let lb: Vec<String> = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect();
            let spec = svc.spec.as_ref();
            if !lb.is_empty() {
                lb
            } else if let Some(ips) = spec
                .and_then(|s| s.external_ips.clone())
                .filter(|v| !v.is_empty())
            {
                ips
            } else {
                spec.and_then(|s| s.cluster_ip.clone())
                    .filter(|ip| !ip.is_empty() && ip != "None")
                    .into_iter()
                    .collect()
            }
        }
    };
    if addresses.is_empty() {
        return None;
    }
    let mut entries: Vec<IngressLoadBalancerIngress> = addresses.iter().map(|a| entry(a)).collect();
    entries.sort_by(|a, b| (&a.ip, &a.hostname).cmp(&(&b.ip, &b.hostname)));
    entries.dedup();
    Some(entries)
}

/// Our Ingresses whose status differs from `desired`.
pub fn stale<'a>(
    state: &'a ClusterState,
    opts: &translate::Options,
    desired: &[IngressLoadBalancerIngress],
) -> Vec<&'a Ingress> {
    translate::our_ingresses(state, opts)
        .into_iter()
        .filter(|ing| {
            let current = ing
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.clone())
                .unwrap_or_default();
            current != desired
        })
        .collect()
}

/// How often the leader looks for Ingress generations served everywhere.
const PROGRAMMED_EVERY: Duration = Duration::from_millis(200);

/// One look: notes our Ingresses' generations, and for each one every connected proxy now
/// serves, observes the histogram and records a `Programmed` Event.
fn programmed_step(
    tracker: &mut Tracker,
    caches: &Caches,
    shared: &Shared,
    opts: &translate::Options,
    events: &Events,
) {
    let now = std::time::Instant::now();
    let state = caches.ingress_state();
    let ours = translate::our_ingresses(&state, opts);
    tracker.observe(
        ours.iter().filter_map(|i| {
            let m = &i.metadata;
            Some((
                m.namespace.as_deref()?,
                m.name.as_deref()?,
                m.generation.unwrap_or_default(),
                m.resource_version.as_deref()?,
            ))
        }),
        now,
    );
    shared
        .metrics()
        .programmed_tracked
        .set(i64::try_from(tracker.tracked()).unwrap_or(i64::MAX));
    if tracker.pending() == 0 {
        return;
    }
    let proxies: Vec<_> = shared
        .proxies()
        .iter()
        .map(|p| shared.stamp(&p.acked_version))
        .collect();
    for done in tracker.programmed(&proxies, now) {
        shared.metrics().programmed.observe(done.took.as_secs_f64());
        let Some(ingress) = ours.iter().find(|i| {
            i.metadata.namespace.as_deref() == Some(&done.namespace)
                && i.metadata.name.as_deref() == Some(&done.name)
        }) else {
            continue;
        };
        let event = Event {
            type_: EventType::Normal,
            reason: "Programmed".into(),
            note: Some(programmed::message(&done)),
            action: "Serve".into(),
            secondary: None,
        };
        events.record(event, ingress.object_ref(&()));
    }
}

/// Runs leader election, and while leader keeps the host claims ledger and our
/// Ingresses' status up to date.
pub async fn run(
    client: Client,
    caches: Caches,
    shared: Shared,
    settings: Settings,
    shutdown: CancellationToken,
) {
    let manager = loop {
        let built = LeaseManagerBuilder::new(client.clone(), &settings.lease_name)
            .with_namespace(&settings.lease_namespace)
            .with_identity(&settings.identity)
            .with_duration(settings.lease_duration.as_secs().max(1))
            .with_grace(settings.lease_grace.as_secs().max(1))
            .build()
            .await;
        match built {
            Ok(m) => break m,
            Err(error) => {
                tracing::warn!(%error, "cannot set up leader election yet; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    };
    let (mut leader, task) = manager.watch().await;
    let events = Events::new(client.clone(), settings.identity.clone());
    let mut programmed = Tracker::default();
    let mut programmed_tick = tokio::time::interval(PROGRAMMED_EVERY);
    programmed_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // A pass that took long (thousands of status writes) is not followed by a burst of
    // the ticks it missed: the next is a second after it.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ledger = LedgerWriter::default();
    let mut gateway_writer = GatewayWriter::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = leader.changed() => {
                if changed.is_err() { break; }
                let is_leader = *leader.borrow_and_update();
                shared.metrics().leader.set(i64::from(is_leader));
                // A new leader starts from what exists now.
                programmed = Tracker::default();
                shared.metrics().programmed_tracked.set(0);
                if is_leader {
                    shared.metrics().leader_acquisitions.inc();
                    tracing::info!(identity = %settings.identity, lease = %settings.lease_name, "became leader: recording host claims, writing Ingress status");
                } else {
                    tracing::info!(identity = %settings.identity, "not the leader");
                }
            }
            _ = programmed_tick.tick() => {
                if *leader.borrow() && shared.all_synced() {
                    programmed_step(&mut programmed, &caches, &shared, &settings.translate, &events);
                }
            }
            _ = tick.tick() => {
                if *leader.borrow() && shared.all_synced() {
                    let (progress, state) = caches.read();
                    if let Some(c) = &settings.claims {
                        ledger.step(&client, &progress, &state, c, &settings.translate, &shared).await;
                    }
                    let writes = &shared.metrics().status_writes;
                    if let Some(publish) = &settings.publish {
                        sync_state(&client, &state, publish, &settings.translate, writes).await;
                    }
                    let served = served_gateways(&shared);
                    if gateway_writer.due(&progress, &served) {
                        sync_gateway_classes(&client, &state, &settings.gateway_controller, writes).await;
                        let services = settings.translate.gateway_services.as_ref();
                        let mut written = true;
                        if let Some(mode) = services {
                            written &= sync_gateway_services(&client, &state, &settings.gateway_controller, mode, writes).await;
                        }
                        written &= sync_gateways(&client, &state, &settings.gateway_controller, settings.gateway_pool.as_ref(), services, &served, writes).await;
                        gateway_writer.done(&progress, &served, written);
                    }
                }
            }
        }
    }
    // Dropping the receiver makes the manager release the Lease.
    drop(leader);
    let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
}

/// The leader's recording of the host claims ledger: the last inputs it recorded from,
/// so that an unchanged cluster costs nothing but a periodic check of the grace periods.
#[derive(Default)]
struct LedgerWriter {
    last: Option<(Vec<KindProgress>, Instant)>,
}

/// When the Gateway API statuses are computed again: after any kind's progress moves,
/// after a write failed, and every [`LEDGER_RECHECK`] (nothing is computed each second
/// for an unchanged cluster).
#[derive(Default)]
struct GatewayWriter {
    last: Option<(Vec<KindProgress>, Served, Instant)>,
}

/// (`namespace/name`, generation) of the Gateways a proxy serves.
type Served = std::collections::BTreeSet<(String, i64)>;

impl GatewayWriter {
    fn due(&self, progress: &[KindProgress], served: &Served) -> bool {
        !matches!(&self.last, Some((p, s, at)) if p == progress && s == served && at.elapsed() < LEDGER_RECHECK)
    }

    fn done(&mut self, progress: &[KindProgress], served: &Served, all_written: bool) {
        self.last = all_written.then(|| (progress.to_vec(), served.clone(), Instant::now()));
    }
}

/// The Gateways (`namespace/name`, generation) that the proxies connected to this replica
/// serve: those of the listeners of each snapshot a proxy has ACKed (among the recently
/// published ones), when that proxy has bound every listener of the Gateway there.
/// Proxies connected to other replicas are not counted, so a Gateway is never called
/// Programmed before a proxy serves it.
fn served_gateways(shared: &Shared) -> Served {
    let mut served = Served::new();
    let mut snapshots = std::collections::HashMap::new();
    for proxy in shared.proxies() {
        if proxy.acked_version.is_empty()
            || proxy.unbound_listeners.iter().any(|n| n == UNBOUND_UNKNOWN)
        {
            continue;
        }
        let Some(published) = snapshots
            .entry(proxy.acked_version.clone())
            .or_insert_with(|| shared.recently_published(&proxy.acked_version))
            .clone()
        else {
            continue;
        };
        served.extend(gateways_bound(
            &published.content.gateway_listeners,
            &proxy.unbound_listeners,
        ));
    }
    served
}

/// The Gateways (`namespace/name`, generation) of `listeners` none of whose listeners is
/// among `unbound`.
fn gateways_bound(
    listeners: &[Arc<holdfast_proto::v1::GatewayListener>],
    unbound: &[String],
) -> Served {
    let mut all = Served::new();
    let mut missing = Served::new();
    for l in listeners {
        let Some(g) = l.gateway.as_ref() else {
            continue;
        };
        let key = (format!("{}/{}", g.namespace, g.name), g.generation);
        if unbound.iter().any(|n| *n == l.name) {
            missing.insert(key.clone());
        }
        all.insert(key);
    }
    all.difference(&missing).cloned().collect()
}

/// How often an unchanged ledger is checked again (a claim's grace period may end).
const LEDGER_RECHECK: Duration = Duration::from_secs(5);

impl LedgerWriter {
    async fn step(
        &mut self,
        client: &Client,
        progress: &[KindProgress],
        state: &ClusterState,
        settings: &ClaimsSettings,
        opts: &translate::Options,
        shared: &Shared,
    ) {
        if let Some((p, at)) = &self.last
            && p == progress
            && at.elapsed() < LEDGER_RECHECK
        {
            return;
        }
        match record_claims(client, state, settings, opts, SystemTime::now()).await {
            Ok(waiting) => {
                shared.metrics().host_claims_waiting.set(waiting as i64);
                self.last = Some((progress.to_vec(), Instant::now()));
            }
            // Conflict: the cache is behind a write; the next tick reads it again.
            Err(error) => tracing::warn!(%error, "could not record host claims; retrying"),
        }
    }
}

/// Brings the ledger ConfigMap up to date with what our Ingresses name at `now`: one
/// create or replace (with the cached object's resourceVersion, so a write made from a
/// stale cache fails and is made again), nothing when it is current. Returns how many
/// claims wait because the ledger is full.
async fn record_claims(
    client: &Client,
    state: &ClusterState,
    settings: &ClaimsSettings,
    opts: &translate::Options,
    now: SystemTime,
) -> Result<usize, kube::Error> {
    let current = state.host_claims.first();
    let (ledger, invalid) = claims::parse(current.map(|c| &**c));
    for e in &invalid {
        tracing::warn!(error = %e, "host claims key rewritten");
    }
    let named = translate::named_hosts(state, opts);
    let limits = claims::Limits {
        max_bytes: claims::MAX_LEDGER_BYTES,
        max_per_namespace: settings.max_per_namespace,
    };
    let (next, waiting) = claims::next(&ledger, &named, now, settings.grace, limits);
    if waiting > 0 {
        tracing::warn!(
            waiting,
            "host claims wait: the ledger is full or their namespace holds --max-host-claims-per-namespace (a host no other namespace names is still served)"
        );
    }
    let data = claims::render(&next);
    let current_data = current.and_then(|c| c.data.clone()).unwrap_or_default();
    if current.is_some() && current_data == data {
        return Ok(waiting);
    }
    let cm = &settings.configmap;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
    let mut object = ConfigMap {
        data: Some(data),
        ..Default::default()
    };
    object.metadata.name = Some(cm.name.clone());
    object.metadata.namespace = Some(cm.namespace.clone());
    match current {
        Some(c) => {
            object.metadata.resource_version = c.metadata.resource_version.clone();
            object.metadata.labels = c.metadata.labels.clone();
            api.replace(&cm.name, &PostParams::default(), &object)
                .await?;
        }
        None => {
            api.create(&PostParams::default(), &object).await?;
        }
    }
    tracing::info!(hosts = next.len(), "recorded host claims");
    Ok(waiting)
}

/// The status-write counters (`holdfast_status_writes_total`).
type StatusWrites = prometheus_client::metrics::family::Family<
    crate::metrics::StatusWriteLabel,
    prometheus_client::metrics::counter::Counter,
>;

fn count(writes: &StatusWrites, kind: &'static str, ok: bool) {
    writes
        .get_or_create(&crate::metrics::StatusWriteLabel {
            kind,
            result: if ok { "ok" } else { "failed" },
        })
        .inc();
}

/// Patches the status of every Ingress of ours in `state` whose addresses are not the
/// desired ones: one status PATCH each, nothing for those already right.
async fn sync_state(
    client: &Client,
    state: &ClusterState,
    publish: &Publish,
    opts: &translate::Options,
    writes: &StatusWrites,
) {
    let Some(desired) = desired(publish, &state.services) else {
        tracing::debug!("no address to publish yet");
        return;
    };
    for ing in stale(state, opts, &desired) {
        let (Some(ns), Some(name)) = (
            ing.metadata.namespace.as_deref(),
            ing.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let patch = json!({ "status": { "loadBalancer": { "ingress": desired } } });
        let api: Api<Ingress> = Api::namespaced(client.clone(), ns);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                count(writes, "Ingress", true);
                tracing::info!(ingress = %format!("{ns}/{name}"), "updated Ingress status")
            }
            Err(error) => {
                count(writes, "Ingress", false);
                tracing::warn!(ingress = %format!("{ns}/{name}"), %error, "could not update Ingress status")
            }
        }
    }
}

/// Patches the status of every GatewayClass of ours whose status is not the desired one.
async fn sync_gateway_classes(
    client: &Client,
    state: &ClusterState,
    controller: &str,
    writes: &StatusWrites,
) {
    let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    for class in &state.gateway_classes {
        let Some(status) = gateway_api::gateway_class_status(class, controller, &now) else {
            continue;
        };
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        let api: Api<gateway_api::GatewayClass> = Api::all(client.clone());
        let patch = json!({
            "metadata": { "resourceVersion": class.metadata.resource_version },
            "status": status,
        });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                count(writes, "GatewayClass", true);
                tracing::info!(gateway_class = %name, "GatewayClass accepted")
            }
            Err(error) => {
                count(writes, "GatewayClass", false);
                tracing::warn!(gateway_class = %name, %error, "could not update GatewayClass status")
            }
        }
    }
}

/// Creates, corrects and deletes the Services of our Gateways (`--gateway-service-namespace`)
/// as [`gateway_api::services::desired`] says. True when every write succeeded.
async fn sync_gateway_services(
    client: &Client,
    state: &ClusterState,
    controller: &str,
    mode: &gateway_api::services::ServiceMode,
    writes: &StatusWrites,
) -> bool {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{DeleteParams, PostParams};
    let gateways =
        gateway_api::model::resolve_gateways(state, controller, None, Some(mode), |ns, name| {
            secret_check(state, ns, name)
        });
    let changes = gateway_api::services::desired(mode, controller, &gateways.gateways, state);
    let api: Api<Service> = Api::namespaced(client.clone(), &mode.namespace);
    let mut all = true;
    for object in changes.create {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let result = match serde_json::from_value::<Service>(object) {
            Ok(svc) => api.create(&PostParams::default(), &svc).await.map(|_| ()),
            Err(error) => {
                tracing::error!(%error, service = %name, "a Gateway Service did not serialize");
                continue;
            }
        };
        all &= service_write(writes, "created", &name, result);
    }
    for (name, patch) in changes.patch {
        let result = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ());
        all &= service_write(writes, "corrected", &name, result);
    }
    for name in changes.delete {
        let result = api
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ());
        all &= service_write(writes, "deleted (its Gateway is gone)", &name, result);
    }
    all
}

fn service_write(
    writes: &StatusWrites,
    what: &str,
    name: &str,
    result: Result<(), kube::Error>,
) -> bool {
    match result {
        Ok(()) => {
            count(writes, "Service", true);
            tracing::info!(service = %name, "Gateway Service {what}");
            true
        }
        Err(error) => {
            count(writes, "Service", false);
            tracing::warn!(service = %name, %error, "could not write a Gateway Service");
            false
        }
    }
}

/// What a TLS certificate reference of a Gateway listener resolves to in the cache of
/// `kubernetes.io/tls` Secrets.
fn secret_check(state: &ClusterState, ns: &str, name: &str) -> gateway_api::attach::SecretCheck {
    use gateway_api::attach::SecretCheck;
    let Some(secret) = state.secrets.iter().find(|s| {
        s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
    }) else {
        return SecretCheck::Missing;
    };
    let data = secret.data.as_ref();
    let field = |k: &str| data.and_then(|d| d.get(k)).map(|v| v.0.as_slice());
    match (field("tls.crt"), field("tls.key")) {
        (Some(chain), Some(key)) if holdfast_proto::certificate::parse(chain, key).is_ok() => {
            SecretCheck::Usable
        }
        _ => SecretCheck::Invalid,
    }
}

/// Writes the status of our Gateways and of the HTTPRoutes attached to them where it
/// differs from [`gateway_api::status::desired`]; each write carries the cached
/// resourceVersion, so one made from a stale cache fails and is made again. True when
/// every write succeeded.
async fn sync_gateways(
    client: &Client,
    state: &ClusterState,
    controller: &str,
    pool: Option<&gateway_api::status::Pool>,
    services: Option<&gateway_api::services::ServiceMode>,
    served: &Served,
    writes: &StatusWrites,
) -> bool {
    let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    // O(Gateway API objects): off the runtime, so the proxies' streams are not held up.
    let desired = crate::off_runtime(|| {
        gateway_api::status::desired(
            state,
            controller,
            pool,
            services,
            served,
            &now,
            |ns, name| secret_check(state, ns, name),
        )
    });
    let mut all = true;
    for w in &desired.gateways {
        let api: Api<gateway_api::Gateway> = Api::namespaced(client.clone(), &w.namespace);
        all &= write_status(&api, w, "Gateway", writes).await;
    }
    for (kind, w) in &desired.routes {
        all &= match kind {
            gateway_api::RouteKind::Http => {
                let api: Api<gateway_api::HttpRoute> =
                    Api::namespaced(client.clone(), &w.namespace);
                write_status(&api, w, "HTTPRoute", writes).await
            }
            gateway_api::RouteKind::Grpc => {
                let api: Api<gateway_api::GrpcRoute> =
                    Api::namespaced(client.clone(), &w.namespace);
                write_status(&api, w, "GRPCRoute", writes).await
            }
            gateway_api::RouteKind::Tls => {
                let api: Api<gateway_api::TlsRoute> = Api::namespaced(client.clone(), &w.namespace);
                write_status(&api, w, "TLSRoute", writes).await
            }
        };
    }
    all
}

async fn write_status<K>(
    api: &Api<K>,
    w: &gateway_api::status::Write,
    kind: &'static str,
    writes: &StatusWrites,
) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({
        "metadata": { "resourceVersion": w.resource_version },
        "status": w.status,
    });
    let object = format!("{}/{}", w.namespace, w.name);
    match api
        .patch_status(&w.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            count(writes, kind, true);
            tracing::info!(kind, object = %object, "status updated");
            true
        }
        // A conflict: the cache is behind; the next tick computes it again.
        Err(error) => {
            count(writes, kind, false);
            tracing::warn!(kind, object = %object, %error, "could not update status");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A Gateway is served through a proxy only when that proxy bound every listener of
    /// it; a listener without a Gateway counts for none.
    #[test]
    fn a_gateway_is_served_only_with_every_listener_bound() {
        use holdfast_proto::v1::{GatewayListener, GatewayRef};
        let listener = |name: &str, gateway: Option<(&str, i64)>| {
            Arc::new(GatewayListener {
                name: name.into(),
                gateway: gateway.map(|(g, generation)| GatewayRef {
                    namespace: "infra".into(),
                    name: g.into(),
                    generation,
                }),
                ..Default::default()
            })
        };
        let listeners = [
            listener("127.10.0.1:80", Some(("a", 3))),
            listener("127.10.0.1:443", Some(("a", 3))),
            listener("127.10.0.2:80", Some(("b", 1))),
            listener("127.10.0.3:80", None),
        ];
        let names = |served: Served| -> Vec<String> {
            served
                .into_iter()
                .map(|(g, n)| format!("{g}@{n}"))
                .collect()
        };
        assert_eq!(
            names(gateways_bound(&listeners, &[])),
            ["infra/a@3", "infra/b@1"]
        );
        assert_eq!(
            names(gateways_bound(&listeners, &["127.10.0.1:443".to_owned()])),
            ["infra/b@1"],
            "one unbound listener of a"
        );
        assert_eq!(
            names(gateways_bound(&listeners, &["127.10.0.3:80".to_owned()])),
            ["infra/a@3", "infra/b@1"]
        );
    }

    /// The Gateways served through this replica's proxies: those of the snapshot each
    /// proxy ACKed, less any with a listener the proxy could not bind; a proxy whose
    /// report was too large to keep serves none, and one that ACKed nothing serves none.
    #[test]
    fn the_served_gateways_are_those_each_proxy_acked_and_bound() {
        use holdfast_proto::v1::{GatewayListener, GatewayRef, ProxyStatus, Snapshot};
        let shared = Shared::new(crate::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let gateway_listener = |name: &str, gateway: &str| GatewayListener {
            name: name.into(),
            gateway: Some(GatewayRef {
                namespace: "infra".into(),
                name: gateway.into(),
                generation: 2,
            }),
            ..Default::default()
        };
        let mut snapshot = Snapshot {
            gateway_listeners: vec![
                gateway_listener("127.10.0.1:80", "a"),
                gateway_listener("127.10.0.2:80", "b"),
            ],
            ..Default::default()
        };
        holdfast_proto::snapshot::seal(&mut snapshot, 1);
        let published = Arc::new(crate::state::Published::new(snapshot));
        let version = published.version.clone();
        shared.publish(published);
        let proxy = |acked: &str, unbound: &[&str]| ProxyStatus {
            acked_version: acked.into(),
            unbound_listeners: unbound.iter().map(|n| (*n).to_owned()).collect(),
            ..Default::default()
        };
        let served = |shared: &Shared| -> Vec<String> {
            served_gateways(shared)
                .into_iter()
                .map(|(g, n)| format!("{g}@{n}"))
                .collect()
        };
        assert!(served(&shared).is_empty(), "no proxy");
        let unknown = shared.add_proxy(proxy(&version, &[UNBOUND_UNKNOWN]));
        let nothing_yet = shared.add_proxy(proxy("", &[]));
        assert!(
            served(&shared).is_empty(),
            "a report too large; nothing ACKed"
        );
        let partial = shared.add_proxy(proxy(&version, &["127.10.0.2:80"]));
        assert_eq!(served(&shared), ["infra/a@2"]);
        shared.remove_proxy(partial);
        let bound = shared.add_proxy(proxy(&version, &[]));
        assert_eq!(served(&shared), ["infra/a@2", "infra/b@2"]);
        // A version not among the recently published serves nothing.
        for id in [unknown, nothing_yet, bound] {
            shared.remove_proxy(id);
        }
        shared.add_proxy(proxy("v-unknown", &[]));
        assert!(
            served(&shared).is_empty(),
            "a version not recently published"
        );
    }

    fn svc(v: serde_json::Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn fixed_addresses_become_ip_or_hostname_entries() {
        let d = desired(
            &Publish::Addresses(vec!["lb.example.com".into(), "203.0.113.7".into()]),
            &[],
        )
        .unwrap();
        assert_eq!(d.len(), 2);
        assert!(d.iter().any(|e| e.ip.as_deref() == Some("203.0.113.7")));
        assert!(
            d.iter()
                .any(|e| e.hostname.as_deref() == Some("lb.example.com"))
        );
    }

    #[test]
    fn a_published_service_gives_its_load_balancer_then_external_ips_then_cluster_ip() {
        let p = Publish::Service {
            namespace: "hf".into(),
            name: "proxy".into(),
        };
        assert_eq!(
            desired(&p, &[]),
            None,
            "unknown Service: nothing to publish"
        );
        let lb = svc(json!({ "metadata": { "namespace": "hf", "name": "proxy" },
            "spec": { "clusterIP": "10.96.0.5", "externalIPs": ["198.51.100.1"] },
            "status": { "loadBalancer": { "ingress": [{ "ip": "192.0.2.1" }] } } }));
        assert_eq!(
            desired(&p, &[lb]).unwrap()[0].ip.as_deref(),
            Some("192.0.2.1")
        );
        let ext = svc(json!({ "metadata": { "namespace": "hf", "name": "proxy" },
            "spec": { "clusterIP": "10.96.0.5", "externalIPs": ["198.51.100.1"] } }));
        assert_eq!(
            desired(&p, &[ext]).unwrap()[0].ip.as_deref(),
            Some("198.51.100.1")
        );
        let cip = svc(
            json!({ "metadata": { "namespace": "hf", "name": "proxy" }, "spec": { "clusterIP": "10.96.0.5" } }),
        );
        assert_eq!(
            desired(&p, &[cip]).unwrap()[0].ip.as_deref(),
            Some("10.96.0.5")
        );
    }

    /// Our class, and four Ingresses in namespace `a`: `fresh` (already the desired
    /// address), `old` (another address), `none` (no status), `theirs` (another class).
    fn state() -> ClusterState {
        let class: Arc<k8s_openapi::api::networking::v1::IngressClass> = Arc::new(
            serde_json::from_value(json!({ "metadata": { "name": "holdfast" }, "spec": { "controller": "holdfast.dev/ingress-controller" } })).unwrap(),
        );
        let ing = |name: &str, class: &str, ip: Option<&str>| -> Arc<Ingress> {
            let mut v = json!({ "metadata": { "namespace": "a", "name": name }, "spec": { "ingressClassName": class } });
            if let Some(ip) = ip {
                v["status"] = json!({ "loadBalancer": { "ingress": [{ "ip": ip }] } });
            }
            Arc::new(serde_json::from_value(v).unwrap())
        };
        ClusterState {
            ingress_classes: vec![class],
            ingresses: vec![
                ing("fresh", "holdfast", Some("203.0.113.7")),
                ing("old", "holdfast", Some("1.2.3.4")),
                ing("none", "holdfast", None),
                ing("theirs", "nginx", None),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn only_our_ingresses_with_a_different_status_are_stale() {
        let state = state();
        let d = desired(&Publish::Addresses(vec!["203.0.113.7".into()]), &[]).unwrap();
        let names: Vec<_> = stale(&state, &translate::Options::default(), &d)
            .iter()
            .map(|i| i.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["old", "none"]);
    }

    /// The exact requests a status sync makes: one merge PATCH of the status subresource
    /// per stale Ingress of ours, carrying only the desired addresses, and nothing else.
    #[tokio::test]
    async fn a_sync_patches_the_status_of_each_stale_ingress_once_and_nothing_else() {
        let (client, mut api) = crate::fixtures::client();
        let publish = Publish::Addresses(vec!["203.0.113.7".into()]);
        let writes = StatusWrites::default();
        let counted = writes.clone();
        let sync = tokio::spawn(async move {
            sync_state(
                &client,
                &state(),
                &publish,
                &translate::Options::default(),
                &counted,
            )
            .await
        });
        for name in ["old", "none"] {
            let patch = api
                .expect(
                    http::Method::PATCH,
                    &format!("/apis/networking.k8s.io/v1/namespaces/a/ingresses/{name}/status"),
                    200,
                    |_| json!({ "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": { "namespace": "a", "name": name } }),
                )
                .await;
            // A merge patch of the status alone: nothing else of the Ingress is sent.
            assert_eq!(patch.content_type, "application/merge-patch+json");
            assert_eq!(
                patch.body,
                json!({ "status": { "loadBalancer": { "ingress": [{ "ip": "203.0.113.7" }] } } })
            );
        }
        // Done after those two: a third request would never be answered.
        tokio::time::timeout(Duration::from_secs(5), sync)
            .await
            .expect("the sync made no other request")
            .expect("the sync task");
        let ok = crate::metrics::StatusWriteLabel {
            kind: "Ingress",
            result: "ok",
        };
        assert_eq!(writes.get_or_create(&ok).get(), 2, "each write is counted");
    }
}
