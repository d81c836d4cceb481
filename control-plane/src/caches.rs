//! Watch-fed caches (kube-rs reflectors) of the five kinds translation reads. Secrets are
//! watched with the field selector `type=kubernetes.io/tls`: no other Secret is ever read.
//!
//! Snapshots are built only from these stores: no API call happens while building
//! (DESIGN invariant 1). Each kind's sync state follows the watcher's events: `Init`
//! (a list starts or restarts) marks the kind incomplete, `InitDone` (kube-rs has swapped
//! the complete list into the store) marks it complete. A watch error alone does not: the
//! store still holds the last complete list, and the watcher resumes from its
//! resourceVersion, or re-lists (`Init` again) if that version has expired.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::state::Shared;
use crate::translate::ClusterState;

/// Readers of the five caches.
#[derive(Clone)]
pub struct Caches {
    ingress_classes: Store<IngressClass>,
    ingresses: Store<Ingress>,
    services: Store<Service>,
    endpoint_slices: Store<EndpointSlice>,
    secrets: Store<Secret>,
    revision: Arc<AtomicU64>,
}

impl Caches {
    /// Everything translation needs, read from the stores (no API calls).
    pub fn state(&self) -> ClusterState {
        ClusterState {
            ingress_classes: self.ingress_classes.state(),
            ingresses: self.ingresses.state(),
            services: self.services.state(),
            endpoint_slices: self.endpoint_slices.state(),
            secrets: self.secrets.state(),
        }
    }

    /// The highest resourceVersion observed on any watched kind.
    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    /// (namespace/name, resourceVersion) of every cached Ingress and IngressClass, sorted:
    /// what a fresh read must agree with to confirm a held snapshot.
    pub fn routing_objects(&self) -> Vec<(String, String)> {
        identity(self.ingresses.state().iter().map(|o| &**o))
            .into_iter()
            .chain(identity(self.ingress_classes.state().iter().map(|o| &**o)))
            .collect()
    }
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

/// Timeouts for the watches.
#[derive(Debug, Clone, Copy)]
pub struct WatchSettings {
    /// Server-side timeout of each watch request, in seconds: an idle watch is renewed
    /// before the client's read timeout would call it dead.
    pub watch_timeout_secs: u32,
    /// Objects per LIST page while (re-)listing.
    pub page_size: u32,
}

/// Starts one watcher per kind. Each notifies `changed` after every change and after each
/// completed (re-)list.
pub fn start(
    client: Client,
    shared: Shared,
    changed: Arc<Notify>,
    settings: WatchSettings,
    tasks: &mut JoinSet<()>,
) -> Caches {
    let revision = Arc::new(AtomicU64::new(0));
    let ctx = WatchCtx {
        shared,
        changed,
        revision: revision.clone(),
        settings,
    };
    Caches {
        ingress_classes: spawn_watch(
            Api::all(client.clone()),
            "IngressClass",
            None,
            ctx.clone(),
            tasks,
        ),
        ingresses: spawn_watch(
            Api::all(client.clone()),
            "Ingress",
            None,
            ctx.clone(),
            tasks,
        ),
        services: spawn_watch(
            Api::all(client.clone()),
            "Service",
            None,
            ctx.clone(),
            tasks,
        ),
        endpoint_slices: spawn_watch(
            Api::all(client.clone()),
            "EndpointSlice",
            None,
            ctx.clone(),
            tasks,
        ),
        secrets: spawn_watch(Api::all(client), "Secret", Some(TLS_SECRETS), ctx, tasks),
        revision,
    }
}

#[derive(Clone)]
struct WatchCtx {
    shared: Shared,
    changed: Arc<Notify>,
    revision: Arc<AtomicU64>,
    settings: WatchSettings,
}

impl WatchCtx {
    fn observe<K: Resource>(&self, obj: &K) {
        if let Some(rv) = obj
            .meta()
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
        {
            self.revision.fetch_max(rv, Ordering::AcqRel);
        }
    }
}

/// The field selector of the Secret watch: certificates only.
pub const TLS_SECRETS: &str = "type=kubernetes.io/tls";

fn spawn_watch<K>(
    api: Api<K>,
    kind: &'static str,
    fields: Option<&str>,
    ctx: WatchCtx,
    tasks: &mut JoinSet<()>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let mut config = watcher::Config::default()
        .timeout(ctx.settings.watch_timeout_secs)
        .page_size(ctx.settings.page_size);
    if let Some(fields) = fields {
        config = config.fields(fields);
    }
    let stream =
        reflector::reflector(writer, watcher::watcher(api, config).modify(prune)).default_backoff();
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Init) => {
                    tracing::debug!(kind, "listing");
                    ctx.shared.set_synced(kind, false);
                }
                Ok(Event::InitApply(obj)) => ctx.observe(&obj),
                Ok(Event::InitDone) => {
                    tracing::info!(kind, "cache complete");
                    ctx.shared.set_synced(kind, true);
                    ctx.changed.notify_one();
                }
                Ok(Event::Apply(obj) | Event::Delete(obj)) => {
                    ctx.observe(&obj);
                    ctx.changed.notify_one();
                }
                Err(error) => {
                    let message = describe_watch_error(&error);
                    tracing::warn!(kind, error = %message, "watch failed; retrying with backoff");
                    ctx.shared.record_watch_error(kind, message);
                }
            }
        }
    });
    reader
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

/// A watch error in words an operator can act on (a 403 names the missing permission,
/// as the API server's message does).
fn describe_watch_error(error: &watcher::Error) -> String {
    let api = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => Some(&**s),
        watcher::Error::WatchError(s) => Some(&**s),
        _ => None,
    };
    match api {
        Some(s) if s.code == 403 => format!("permission denied (403): {}", s.message),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
