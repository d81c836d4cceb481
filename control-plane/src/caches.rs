//! Watch-fed caches (kube-rs reflector stores) of the thirteen kinds translation reads
//! (Namespaces for their labels, which Gateway listeners select routes' namespaces by).
//! Secrets are watched with the field selector `type=kubernetes.io/tls`: no other Secret
//! is ever read. ConfigMaps: only the host claims ledger ([`crate::claims`]), by name, in
//! the control plane's own namespace. The Gateway API kinds ([`crate::gateway_api`]) are
//! watched once API discovery says they are served; a kind discovery says does not exist
//! is complete and empty, and one discovery could not answer for is not complete (see
//! [`watch_optional_kind`]).
//!
//! Snapshots are built only from these stores: no API call happens while building
//! (docs/design.md, invariant 1). Each kind has its own list-then-watch loop (not kube-runtime's
//! watcher, which hides what this needs: the list's resourceVersion and bookmarks):
//! - a (re-)list marks the kind incomplete; its pages (a quorum read, then continue
//!   tokens) are buffered and swapped into the store whole, which marks it complete;
//! - the watch resumes from the last resourceVersion after a timeout or an error, and
//!   only a 410 (that version has expired) re-lists; a watch error alone leaves the store
//!   holding the last complete list;
//! - the kind's **progress** is the resourceVersion up to which its store reflects every
//!   change: the list's resourceVersion once swapped in, then each event's and each
//!   bookmark's (asked for with `allowWatchBookmarks`, so a quiet kind advances too). It
//!   never goes back: a re-list is a quorum read, at or after anything seen before.
//!   Snapshots carry every kind's progress (`Snapshot.progress`).

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use holdfast_lock::ReadWrite;
use holdfast_process::backoff::Backoff;
use holdfast_proto::v1::KindProgress;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::Event;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::gateway_api::{
    self, Discovered, Gateway, GatewayClass, GrpcRoute, HttpRoute, ReferenceGrant, TlsRoute,
};
use crate::state::{KINDS, Shared};
use crate::translate::ClusterState;

/// Readers of the thirteen caches.
#[derive(Clone)]
pub struct Caches {
    ingress_classes: Store<IngressClass>,
    ingresses: Store<Ingress>,
    services: Store<Service>,
    endpoint_slices: Store<EndpointSlice>,
    secrets: Store<Secret>,
    host_claims: Store<ConfigMap>,
    gateway_classes: Store<GatewayClass>,
    gateways: Store<Gateway>,
    http_routes: Store<HttpRoute>,
    grpc_routes: Store<GrpcRoute>,
    tls_routes: Store<TlsRoute>,
    reference_grants: Store<ReferenceGrant>,
    namespaces: Store<Namespace>,
    /// Each kind's progress, in the order of [`KINDS`].
    progress: Arc<[AtomicU64; KINDS.len()]>,
    /// Per kind (order of [`KINDS`]): a change to its store and to its progress happen
    /// under the write lock, a read of both under the read lock, so what is read is
    /// exactly as far as its progress says (never further: a proxy could otherwise take
    /// another replica's older content at the same progress).
    guards: Arc<[RwLock<()>; KINDS.len()]>,
}

/// The writers of [`Caches::written`]: a test applies watch events with them.
#[cfg(test)]
pub struct TestWriters {
    /// Of the IngressClasses.
    pub ingress_classes: Writer<IngressClass>,
    /// Of the Ingresses.
    pub ingresses: Writer<Ingress>,
    /// Of the Services.
    pub services: Writer<Service>,
    /// Of the EndpointSlices.
    pub endpoint_slices: Writer<EndpointSlice>,
}

impl Caches {
    /// Caches that stay empty (no watch feeds them), for tests of what reads them.
    #[cfg(test)]
    pub fn empty() -> Caches {
        Caches {
            ingress_classes: reflector::store().0,
            ingresses: reflector::store().0,
            services: reflector::store().0,
            endpoint_slices: reflector::store().0,
            secrets: reflector::store().0,
            host_claims: reflector::store().0,
            gateway_classes: reflector::store().0,
            gateways: reflector::store().0,
            http_routes: reflector::store().0,
            grpc_routes: reflector::store().0,
            tls_routes: reflector::store().0,
            reference_grants: reflector::store().0,
            namespaces: reflector::store().0,
            progress: Arc::new(Default::default()),
            guards: Arc::new(Default::default()),
        }
    }

    /// Caches whose IngressClasses, Ingresses, Services and EndpointSlices a test writes
    /// (the other kinds stay empty), for tests of the loops that read them.
    #[cfg(test)]
    pub fn written() -> (Caches, TestWriters) {
        let (ingress_classes, classes) = reflector::store();
        let (ingresses, ingress_writer) = reflector::store();
        let (services, service_writer) = reflector::store();
        let (endpoint_slices, slice_writer) = reflector::store();
        let caches = Caches {
            ingress_classes,
            ingresses,
            services,
            endpoint_slices,
            ..Caches::empty()
        };
        let writers = TestWriters {
            ingress_classes: classes,
            ingresses: ingress_writer,
            services: service_writer,
            endpoint_slices: slice_writer,
        };
        (caches, writers)
    }

    /// The `metadata.generation` and `resourceVersion` of one object of `kind` (Ingress,
    /// HTTPRoute, GRPCRoute, TLSRoute, Gateway) as cached; None when it is not.
    pub fn generation(&self, kind: &str, namespace: &str, name: &str) -> Option<(i64, String)> {
        fn get<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<(i64, String)>
        where
            K: Resource + Clone + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone,
        {
            let key = reflector::ObjectRef::new(name).within(namespace);
            let o = store.get(&key)?;
            let meta = o.meta();
            Some((
                meta.generation.unwrap_or_default(),
                meta.resource_version.clone().unwrap_or_default(),
            ))
        }
        match kind {
            "Ingress" => get(&self.ingresses, namespace, name),
            "HTTPRoute" => get(&self.http_routes, namespace, name),
            "GRPCRoute" => get(&self.grpc_routes, namespace, name),
            "TLSRoute" => get(&self.tls_routes, namespace, name),
            "Gateway" => get(&self.gateways, namespace, name),
            _ => None,
        }
    }

    /// Everything translation needs, read from the stores (no API calls).
    pub fn state(&self) -> ClusterState {
        self.read().1
    }

    /// Everything translation needs, read from the stores (no API calls), and every
    /// kind's progress (see the module documentation), sorted by kind: each kind's store
    /// and progress read together, so its store reflects exactly that much.
    pub fn read(&self) -> (Vec<KindProgress>, ClusterState) {
        let mut progress = Vec::with_capacity(KINDS.len());
        let mut http_routes = self.read_kind(&self.http_routes, &mut progress);
        // GRPCRoutes and TLSRoutes are served as the HTTPRoutes they amount to (their
        // kind says so).
        http_routes.extend(
            self.read_kind(&self.grpc_routes, &mut progress)
                .iter()
                .map(|r| Arc::new(gateway_api::grpc::as_http_route(r))),
        );
        http_routes.extend(
            self.read_kind(&self.tls_routes, &mut progress)
                .iter()
                .map(|r| Arc::new(gateway_api::tls_route::as_http_route(r))),
        );
        let state = ClusterState {
            ingress_classes: self.read_kind(&self.ingress_classes, &mut progress),
            ingresses: self.read_kind(&self.ingresses, &mut progress),
            services: self.read_kind(&self.services, &mut progress),
            endpoint_slices: self.read_kind(&self.endpoint_slices, &mut progress),
            secrets: self.read_kind(&self.secrets, &mut progress),
            host_claims: self.read_kind(&self.host_claims, &mut progress),
            gateway_classes: self.read_kind(&self.gateway_classes, &mut progress),
            gateways: self.read_kind(&self.gateways, &mut progress),
            http_routes,
            reference_grants: self.read_kind(&self.reference_grants, &mut progress),
            namespaces: self.read_kind(&self.namespaces, &mut progress),
        };
        progress.sort_by(|a, b| a.kind.cmp(&b.kind));
        (progress, state)
    }

    /// Only the IngressClasses and Ingresses (what says which Ingresses are ours), the
    /// rest of the state empty: for readers that need no more, without copying every
    /// store.
    pub fn ingress_state(&self) -> ClusterState {
        let mut progress = Vec::with_capacity(2);
        ClusterState {
            ingress_classes: self.read_kind(&self.ingress_classes, &mut progress),
            ingresses: self.read_kind(&self.ingresses, &mut progress),
            ..ClusterState::default()
        }
    }

    /// One kind's objects, with its progress pushed onto `progress`, under its lock.
    fn read_kind<K>(&self, store: &Store<K>, progress: &mut Vec<KindProgress>) -> Vec<Arc<K>>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let kind = kind_name::<K>();
        let i = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
        let _guard = self.guards[i].read_locked();
        progress.push(KindProgress {
            kind: kind.to_owned(),
            resource_version: self.progress[i].load(Ordering::Acquire),
        });
        store.state()
    }

    /// (namespace/name, resourceVersion) of every cached Ingress and IngressClass, then
    /// (`Kind:`namespace/name, resourceVersion) of every cached object of the Gateway API
    /// kinds and Namespaces, except the kinds in `absent` (not served by the API server):
    /// what a fresh read must agree with to confirm a held snapshot.
    pub fn routing_objects(&self, absent: &[&str]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = identity(self.ingresses.state().iter().map(|o| &**o))
            .into_iter()
            .chain(identity(self.ingress_classes.state().iter().map(|o| &**o)))
            .collect();
        let mut kind = |name: &str, ids: Vec<(String, String)>| {
            if !absent.contains(&name) {
                out.extend(tagged(name, ids));
            }
        };
        kind(
            "GatewayClass",
            identity(self.gateway_classes.state().iter().map(|o| &**o)),
        );
        kind(
            "Gateway",
            identity(self.gateways.state().iter().map(|o| &**o)),
        );
        kind(
            "HTTPRoute",
            identity(self.http_routes.state().iter().map(|o| &**o)),
        );
        kind(
            "GRPCRoute",
            identity(self.grpc_routes.state().iter().map(|o| &**o)),
        );
        kind(
            "TLSRoute",
            identity(self.tls_routes.state().iter().map(|o| &**o)),
        );
        kind(
            "ReferenceGrant",
            identity(self.reference_grants.state().iter().map(|o| &**o)),
        );
        kind(
            "Namespace",
            identity(self.namespaces.state().iter().map(|o| &**o)),
        );
        out
    }
}

/// `ids` with each name prefixed `kind:` (so that objects of two kinds never compare
/// equal).
pub fn tagged(kind: &str, ids: Vec<(String, String)>) -> Vec<(String, String)> {
    ids.into_iter()
        .map(|(name, rv)| (format!("{kind}:{name}"), rv))
        .collect()
}

/// Sorted (namespace/name, resourceVersion) of objects.
pub fn identity<'a, K: ResourceExt + 'a>(
    objects: impl Iterator<Item = &'a K>,
) -> Vec<(String, String)> {
    let mut ids: Vec<(String, String)> = objects
        .map(|o| {
            (
                format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                o.resource_version().unwrap_or_default(),
            )
        })
        .collect();
    ids.sort();
    ids
}

/// Timeouts for the watches, and which ConfigMap to watch.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    /// Server-side timeout of each watch request, in seconds: an idle watch is renewed
    /// before the client's read timeout would call it dead.
    pub watch_timeout_secs: u32,
    /// Objects per LIST page while (re-)listing.
    pub page_size: u32,
    /// How long an API discovery request may take before the answer counts as unknown.
    pub discovery_timeout: std::time::Duration,
    /// How often a kind that discovery says does not exist is looked for again (its CRD
    /// may be installed later).
    pub rediscover_every: std::time::Duration,
    /// The host claims ConfigMap, the one ConfigMap watched.
    pub claims: ClaimsConfigMap,
}

/// Where the host claims ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimsConfigMap {
    /// The control plane's own namespace.
    pub namespace: String,
    /// `--host-claims-configmap`.
    pub name: String,
}

/// Starts one list-then-watch loop per kind. Each notifies `changed` after every change,
/// bookmark and completed (re-)list.
pub fn start(
    client: Client,
    shared: Shared,
    changed: Arc<Notify>,
    settings: WatchSettings,
    tasks: &mut JoinSet<()>,
) -> Caches {
    let claims = settings.claims.clone();
    let progress: Arc<[AtomicU64; KINDS.len()]> = Arc::new(Default::default());
    let guards: Arc<[RwLock<()>; KINDS.len()]> = Arc::new(Default::default());
    let ctx = WatchCtx {
        shared,
        changed,
        progress: progress.clone(),
        guards: guards.clone(),
        settings,
    };
    Caches {
        ingress_classes: spawn_watch(Api::all(client.clone()), None, ctx.clone(), tasks),
        ingresses: spawn_watch(Api::all(client.clone()), None, ctx.clone(), tasks),
        services: spawn_watch(Api::all(client.clone()), None, ctx.clone(), tasks),
        endpoint_slices: spawn_watch(Api::all(client.clone()), None, ctx.clone(), tasks),
        secrets: spawn_watch(
            Api::all(client.clone()),
            Some(TLS_SECRETS.to_owned()),
            ctx.clone(),
            tasks,
        ),
        host_claims: spawn_watch(
            Api::namespaced(client.clone(), &claims.namespace),
            Some(format!("metadata.name={}", claims.name)),
            ctx.clone(),
            tasks,
        ),
        gateway_classes: spawn_optional_watch(client.clone(), ctx.clone(), tasks),
        gateways: spawn_optional_watch(client.clone(), ctx.clone(), tasks),
        http_routes: spawn_optional_watch(client.clone(), ctx.clone(), tasks),
        grpc_routes: spawn_optional_watch(client.clone(), ctx.clone(), tasks),
        tls_routes: spawn_optional_watch(client.clone(), ctx.clone(), tasks),
        reference_grants: spawn_optional_watch(client.clone(), ctx.clone(), tasks),
        namespaces: spawn_watch(Api::all(client), None, ctx, tasks),
        progress,
        guards,
    }
}

#[derive(Clone)]
struct WatchCtx {
    shared: Shared,
    changed: Arc<Notify>,
    progress: Arc<[AtomicU64; KINDS.len()]>,
    guards: Arc<[RwLock<()>; KINDS.len()]>,
    settings: WatchSettings,
}

/// The field selector of the Secret watch: certificates only.
pub const TLS_SECRETS: &str = "type=kubernetes.io/tls";

/// A resourceVersion as a number (Kubernetes documents them as opaque; every API server
/// backed by etcd makes them etcd revisions). One that is not a number advances nothing.
fn revision_of(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

fn spawn_watch<K>(
    api: Api<K>,
    fields: Option<String>,
    ctx: WatchCtx,
    tasks: &mut JoinSet<()>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, mut writer) = reflector::store();
    tasks.spawn(async move { watch_kind(api, fields, &mut writer, ctx, false).await });
    reader
}

/// A kind that may not be installed (a CustomResourceDefinition): see
/// [`watch_optional_kind`].
fn spawn_optional_watch<K>(client: Client, ctx: WatchCtx, tasks: &mut JoinSet<()>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    tasks.spawn(watch_optional_kind(client, writer, ctx));
    reader
}

/// What API discovery says of `plural` in the Gateway API group, each request within
/// `timeout`: `GET /apis/GROUP/v1`, and when that says the kind does not exist, `GET /apis`
/// (and the group's other versions) to confirm it ([`gateway_api::confirmed`]).
async fn discover(client: &Client, plural: &str, timeout: std::time::Duration) -> Discovered {
    let answer = tokio::time::timeout(
        timeout,
        client.list_api_group_resources(gateway_api::API_VERSION),
    )
    .await;
    let (first, was_404) = match answer {
        Err(_) => (
            gateway_api::discovered(Err((None, "timed out")), plural),
            false,
        ),
        Ok(Ok(list)) => (gateway_api::discovered(Ok(&list), plural), false),
        Ok(Err(kube::Error::Api(status))) => (
            gateway_api::discovered(Err((Some(status.code), &status.message)), plural),
            status.code == 404,
        ),
        Ok(Err(error)) => (
            gateway_api::discovered(Err((None, &error.to_string())), plural),
            false,
        ),
    };
    let Discovered::Absent(why) = first else {
        return first;
    };
    let groups = match tokio::time::timeout(timeout, client.list_api_groups()).await {
        Ok(Ok(groups)) => groups,
        Ok(Err(error)) => return Discovered::Unknown(format!("API discovery of /apis: {error}")),
        Err(_) => return Discovered::Unknown("API discovery of /apis: timed out".into()),
    };
    let versions: Vec<String> = groups
        .groups
        .iter()
        .filter(|g| g.name == gateway_api::GROUP)
        .flat_map(|g| g.versions.iter().map(|v| v.version.clone()))
        .collect();
    for version in versions.iter().filter(|v| *v != gateway_api::VERSION) {
        let at = format!("{}/{version}", gateway_api::GROUP);
        match tokio::time::timeout(timeout, client.list_api_group_resources(&at)).await {
            Ok(Ok(list)) if list.resources.iter().any(|r| r.name == plural) => {
                return gateway_api::confirmed(why, was_404, &versions, Some(version), plural);
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                return Discovered::Unknown(format!("API discovery of {at}: {error}"));
            }
            Err(_) => return Discovered::Unknown(format!("API discovery of {at}: timed out")),
        }
    }
    gateway_api::confirmed(why, was_404, &versions, None, plural)
}

/// A kind that may not be installed. Its cache is:
/// - watched as any other kind while discovery says it is served (until a list or watch
///   is answered 404: then discovery is asked again);
/// - complete and empty while discovery answers that it does not exist (looked for again
///   every `rediscover_every`, so installing the CRD later needs no restart);
/// - unchanged while discovery cannot answer (a failed or timed-out request): not complete
///   until a first answer, and never emptied by a failure.
async fn watch_optional_kind<K>(client: Client, mut writer: Writer<K>, ctx: WatchCtx)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let kind = kind_name::<K>();
    let index = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
    let plural = K::plural(&()).into_owned();
    let mut backoff = watch_backoff();
    let mut emptied = false;
    loop {
        match discover(&client, &plural, ctx.settings.discovery_timeout).await {
            Discovered::Served => {
                backoff.reset();
                emptied = false;
                ctx.shared.set_absent(kind, None);
                tracing::info!(kind, "served by the API server: watching");
                watch_kind(
                    Api::<K>::all(client.clone()),
                    None,
                    &mut writer,
                    ctx.clone(),
                    true,
                )
                .await;
            }
            Discovered::Absent(why) => {
                backoff.reset();
                if !emptied {
                    tracing::warn!(kind, reason = %why, "not served by the API server: no objects of this kind until it is");
                    // Nothing of the kind exists: an empty list, complete. Its progress
                    // stays where it was (never backwards).
                    ctx.apply(index, &mut writer, Some(&Event::Init), "");
                    ctx.apply(index, &mut writer, Some(&Event::InitDone), "");
                    ctx.shared.set_absent(kind, Some(why));
                    ctx.shared.set_synced(kind, true);
                    ctx.changed.notify_one();
                    emptied = true;
                }
                tokio::time::sleep(ctx.settings.rediscover_every).await;
            }
            Discovered::Unknown(why) => {
                ctx.failed(kind, why.into());
                backoff.wait().await;
            }
        }
    }
}

/// Whether `error` is the API server saying the kind is not served (404 for its
/// collection): for an optional kind, discovery is asked again.
fn not_served(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// One kind's loop: list, watch from the list's resourceVersion, re-watch from the last
/// one after a timeout or error, re-list only on 410. An `optional` kind's loop returns
/// when a list or watch is answered 404 (the kind is no longer served).
async fn watch_kind<K>(
    api: Api<K>,
    fields: Option<String>,
    writer: &mut Writer<K>,
    ctx: WatchCtx,
    optional: bool,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let kind = kind_name::<K>();
    let index = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
    let mut backoff = watch_backoff();
    'list: loop {
        tracing::debug!(kind, "listing");
        ctx.shared.set_synced(kind, false);
        writer.apply_watcher_event(&Event::Init);
        let mut lp = ListParams::default().limit(ctx.settings.page_size.max(1));
        if let Some(fields) = &fields {
            lp = lp.fields(fields);
        }
        let mut listed_at: Option<String> = None;
        loop {
            match api.list(&lp).await {
                Ok(page) => {
                    // Every page of one list has the first page's resourceVersion.
                    if listed_at.is_none() {
                        listed_at = page.metadata.resource_version.filter(|v| !v.is_empty());
                    }
                    for mut obj in page.items {
                        prune(&mut obj);
                        writer.apply_watcher_event(&Event::InitApply(obj));
                    }
                    match page.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(token) => lp = lp.continue_token(&token),
                        None => break,
                    }
                }
                Err(error) => {
                    ctx.failed(kind, describe_watch_error(&error));
                    if optional && not_served(&error) {
                        return;
                    }
                    backoff.wait().await;
                    continue 'list;
                }
            }
        }
        let Some(mut rv) = listed_at else {
            ctx.failed(kind, String::from("the list had no resourceVersion").into());
            backoff.wait().await;
            continue 'list;
        };
        ctx.apply(index, writer, Some(&Event::InitDone), &rv);
        // The API server answered a whole list: later failures start from the shortest
        // delay again.
        let listed = std::time::Instant::now();
        backoff.reset();
        tracing::info!(kind, "cache complete");
        ctx.shared.count_list(kind);
        ctx.shared.set_synced(kind, true);
        ctx.changed.notify_one();
        loop {
            let opened = std::time::Instant::now();
            let mut delivered = false;
            let mut failed = false;
            let mut wp = WatchParams::default().timeout(ctx.settings.watch_timeout_secs);
            wp.bookmarks = true;
            if let Some(fields) = &fields {
                wp = wp.fields(fields);
            }
            let stream = match api.watch(&wp, &rv).await {
                Ok(stream) => stream,
                Err(kube::Error::Api(status)) if status.code == 410 => {
                    // Expired (compacted): only a new list can resume.
                    ctx.failed(kind, describe_status(&status));
                    relist_after_expiry(listed, &mut backoff).await;
                    continue 'list;
                }
                Err(error) => {
                    ctx.failed(kind, describe_watch_error(&error));
                    if optional && not_served(&error) {
                        return;
                    }
                    backoff.wait().await;
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let (event, at) = match item {
                    Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                        let at = obj.resource_version();
                        (Some(Event::Apply(obj)), at)
                    }
                    Ok(WatchEvent::Deleted(obj)) => {
                        let at = obj.resource_version();
                        (Some(Event::Delete(obj)), at)
                    }
                    Ok(WatchEvent::Bookmark(bookmark)) => {
                        (None, Some(bookmark.metadata.resource_version))
                    }
                    Ok(WatchEvent::Error(status)) if status.code == 410 => {
                        ctx.failed(kind, describe_status(&status));
                        relist_after_expiry(listed, &mut backoff).await;
                        continue 'list;
                    }
                    Ok(WatchEvent::Error(status)) => {
                        ctx.failed(kind, describe_status(&status));
                        if optional && status.code == 404 {
                            return;
                        }
                        failed = true;
                        break;
                    }
                    Err(error) => {
                        ctx.failed(kind, describe_watch_error(&error));
                        failed = true;
                        break;
                    }
                };
                let Some(at) = at.filter(|v| !v.is_empty()) else {
                    // Cannot resume after it: start over.
                    ctx.failed(
                        kind,
                        String::from("a watch event had no resourceVersion").into(),
                    );
                    backoff.wait().await;
                    continue 'list;
                };
                let mut event = event;
                if let Some(Event::Apply(obj) | Event::Delete(obj)) = &mut event {
                    prune(obj);
                }
                rv = at;
                ctx.apply(index, writer, event.as_ref(), &rv);
                ctx.changed.notify_one();
                delivered = true;
                backoff.reset();
            }
            // The server ended the watch (its timeout) or it failed: resume from `rv`;
            // after a pause if it failed, or ended at once with nothing (no tight loop).
            if failed || (!delivered && opened.elapsed() < std::time::Duration::from_secs(1)) {
                backoff.wait().await;
            }
        }
    }
}

/// Delays between failed lists and watches: 0.8 s doubling to 30 s, with jitter (as
/// kube-runtime's default backoff).
fn watch_backoff() -> Backoff {
    Backoff::new(
        std::time::Duration::from_millis(800),
        std::time::Duration::from_secs(30),
    )
}

/// After a watch's resourceVersion expired (410 Gone): the API server is answering and
/// only a new list can resume, so the list starts at once, without the delay earlier
/// failures built up (a cache stays stale no longer than it must). Only a kind whose last
/// list completed less than a second ago waits, so expiry can never loop without pause.
async fn relist_after_expiry(listed: std::time::Instant, backoff: &mut Backoff) {
    if listed.elapsed() < std::time::Duration::from_secs(1) {
        backoff.wait().await;
    }
}

/// The name a kind is reported under (one of [`KINDS`]).
fn kind_name<K: Resource>() -> &'static str
where
    K::DynamicType: Default,
{
    let dt = K::DynamicType::default();
    let kind = K::kind(&dt);
    KINDS
        .iter()
        .find(|k| **k == kind.as_ref())
        .copied()
        .unwrap_or("unknown")
}

impl WatchCtx {
    /// Applies `event` (if any) to the kind's store and advances its progress to `rv`,
    /// together (see [`Caches::read`]).
    fn apply<K>(&self, index: usize, writer: &mut Writer<K>, event: Option<&Event<K>>, rv: &str)
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        let _guard = self.guards[index].write_locked();
        if let Some(event) = event {
            writer.apply_watcher_event(event);
        }
        if let Some(rv) = revision_of(rv) {
            self.progress[index].fetch_max(rv, Ordering::AcqRel);
        }
    }

    fn failed(&self, kind: &'static str, failure: WatchFailure) {
        let WatchFailure { message, forbidden } = failure;
        tracing::warn!(kind, error = %message, "watch failed; retrying with backoff");
        self.shared.record_watch_error(kind, message, forbidden);
    }
}

/// The annotation kubectl apply keeps a whole copy of the object in.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what translation never reads before an object enters a cache: `managedFields`
/// and kubectl's last-applied copy of the object are often most of an object's size, and
/// the caches hold every Ingress, Service and EndpointSlice in the cluster.
pub fn prune<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// A failed list or watch: in words an operator can act on (a 403 names the missing
/// permission, as the API server's message does), and whether it was a 403.
struct WatchFailure {
    message: String,
    forbidden: bool,
}

impl From<String> for WatchFailure {
    fn from(message: String) -> Self {
        WatchFailure {
            message,
            forbidden: false,
        }
    }
}

fn describe_watch_error(error: &kube::Error) -> WatchFailure {
    match error {
        kube::Error::Api(status) => describe_status(status),
        _ => error.to_string().into(),
    }
}

fn describe_status(status: &kube::core::Status) -> WatchFailure {
    if status.code == 403 {
        WatchFailure {
            message: format!("permission denied (403): {}", status.message),
            forbidden: true,
        }
    } else {
        format!("{}: {} ({})", status.message, status.reason, status.code).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind's store and its progress change together and are read together: a build
    /// never sees an Ingress its progress does not cover. Ingress `i` is applied at
    /// resourceVersion `i`, so a consistent read has exactly `progress` Ingresses.
    #[test]
    fn a_kinds_store_and_progress_are_read_as_one() {
        let shared = Shared::new(crate::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let ctx = WatchCtx {
            shared,
            changed: Arc::new(Notify::new()),
            progress: Arc::new(Default::default()),
            guards: Arc::new(Default::default()),
            settings: WatchSettings {
                watch_timeout_secs: 7,
                page_size: 500,
                discovery_timeout: std::time::Duration::from_secs(10),
                rediscover_every: std::time::Duration::from_secs(10),
                claims: ClaimsConfigMap {
                    namespace: "holdfast-system".into(),
                    name: "holdfast-host-claims".into(),
                },
            },
        };
        let stores = (
            reflector::store::<IngressClass>(),
            reflector::store::<Ingress>(),
            reflector::store::<Service>(),
            reflector::store::<EndpointSlice>(),
            reflector::store::<Secret>(),
        );
        let caches = Caches {
            ingress_classes: stores.0.0,
            ingresses: stores.1.0,
            services: stores.2.0,
            endpoint_slices: stores.3.0,
            secrets: stores.4.0,
            host_claims: reflector::store().0,
            gateway_classes: reflector::store().0,
            gateways: reflector::store().0,
            http_routes: reflector::store().0,
            grpc_routes: reflector::store().0,
            tls_routes: reflector::store().0,
            reference_grants: reflector::store().0,
            namespaces: reflector::store().0,
            progress: ctx.progress.clone(),
            guards: ctx.guards.clone(),
        };
        let mut writer = stores.1.1;
        let index = KINDS.iter().position(|k| *k == "Ingress").expect("a kind");
        ctx.apply(index, &mut writer, Some(&Event::Init), "0");
        ctx.apply(index, &mut writer, Some(&Event::InitDone), "0");
        let writes = std::thread::spawn(move || {
            for i in 1..=3000u64 {
                let mut ing = Ingress::default();
                ing.metadata.namespace = Some("ns".into());
                ing.metadata.name = Some(format!("ing-{i}"));
                ing.metadata.resource_version = Some(i.to_string());
                ctx.apply(index, &mut writer, Some(&Event::Apply(ing)), &i.to_string());
            }
        });
        let mut reads = 0;
        while !writes.is_finished() || reads == 0 {
            let (progress, state) = caches.read();
            let at = progress
                .iter()
                .find(|p| p.kind == "Ingress")
                .map_or(0, |p| p.resource_version);
            assert_eq!(
                state.ingresses.len() as u64,
                at,
                "the store and its progress differ"
            );
            reads += 1;
        }
        writes.join().expect("the writer");
        let (progress, state) = caches.read();
        assert_eq!(state.ingresses.len(), 3000);
        assert!(
            progress.windows(2).all(|w| w[0].kind < w[1].kind),
            "sorted by kind"
        );
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn pruning_drops_managed_fields_and_the_last_applied_copy_and_keeps_the_rest() {
        let mut ing = Ingress::default();
        ing.metadata.name = Some("web".into());
        ing.metadata.resource_version = Some("42".into());
        ing.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            ..Default::default()
        }]);
        ing.metadata.annotations = Some(
            [
                (
                    LAST_APPLIED_ANNOTATION.to_string(),
                    "{\"big\": true}".to_string(),
                ),
                (
                    crate::translate::LEGACY_CLASS_ANNOTATION.to_string(),
                    "holdfast".to_string(),
                ),
            ]
            .into(),
        );
        prune(&mut ing);
        assert_eq!(ing.metadata.managed_fields, None);
        let annotations = ing.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED_ANNOTATION));
        assert_eq!(
            annotations
                .get(crate::translate::LEGACY_CLASS_ANNOTATION)
                .map(String::as_str),
            Some("holdfast")
        );
        assert_eq!(ing.metadata.name.as_deref(), Some("web"));
        assert_eq!(ing.metadata.resource_version.as_deref(), Some("42"));
    }
}
