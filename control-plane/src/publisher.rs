//! The reconcile loop: coalesce cache changes, build a snapshot only from complete caches,
//! seal and validate it, apply the bounded-destruction guard, publish.
//!
//! Building is `build_with()`: a function of the cache contents only (translate → seal →
//! validate). Everything here that talks to the API server is off the build path: Events
//! for skipped rules, and the fresh read that confirms a held snapshot.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use holdfast_proto::snapshot::{InvalidSnapshot, content_hash};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use tokio::sync::Notify;

use crate::caches::{Caches, identity};
use crate::guard::{
    Sizes, Verdict, assess, assess_change, held_name, held_removals, keep_held, removed_routes,
};
use crate::metrics::{CertificateLabel, ReasonLabel};
use crate::state::{Hold, Published, Shared};
use crate::translate::{self, ClusterState, Content, Problem, ProblemReason, Since, Translator};

/// A certificate this close to its notAfter gets a warning Event on the Ingresses it
/// serves.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// Settings of the reconcile loop.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What makes an Ingress ours.
    pub translate: translate::Options,
    /// Quiet period: a change this soon after the last build waits until no change has
    /// arrived for this long; a change after a quiet period is built at once.
    pub debounce: Duration,
    /// Build at the latest this long after the first change of a burst.
    pub max_delay: Duration,
    /// Share of published routes a snapshot may remove without being held.
    pub max_removal_share: f64,
    /// A held snapshot is released once its content has been stable this long and a fresh
    /// read confirms it.
    pub confirm_after: Duration,
    /// Largest snapshot published, encoded (`--max-snapshot-bytes`); a larger one is held.
    pub max_snapshot_bytes: usize,
    /// Builds traced to a collector (`--otlp-endpoint`), if any.
    pub tracing: Option<Tracing>,
}

/// Where builds' spans go, and the share of builds traced.
#[derive(Debug, Clone)]
pub struct Tracing {
    /// The collector's OTLP/gRPC endpoint.
    pub endpoint: String,
    /// The share of builds traced.
    pub ratio: f64,
}

/// Translates, seals and validates: the whole build, with no I/O. The translator is
/// long-lived: it redoes only what changed since its last build.
pub fn build_with(
    translator: &mut Translator,
    state: &ClusterState,
    opts: &translate::Options,
    revision: u64,
) -> Result<(Published, Vec<Problem>), InvalidSnapshot> {
    let translation = translator.translate(state, opts);
    let built = Published::built(translation.content, translation.since, revision);
    // The translator hashed the content while building it.
    debug_assert_eq!(built.content_hash, content_hash(built.snapshot()));
    built.validate()?;
    let mut problems = translation.problems;
    problems.extend(expiry_problems(
        &built.content,
        &translation.certificate_users,
        SystemTime::now(),
    ));
    problems.sort();
    Ok((built, problems))
}

/// Warnings for certificates that have expired or expire within [`EXPIRY_WARNING`] of
/// `now`, one per Ingress served with them. (An expired certificate is still served, as
/// nginx does; it is made visible instead.)
pub fn expiry_problems(
    content: &Content,
    users: &[(String, holdfast_proto::v1::IngressRef)],
    now: SystemTime,
) -> Vec<Problem> {
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut out = Vec::new();
    for (name, ingress) in users {
        let Some(certificate) = content.certificate(name) else {
            continue;
        };
        let not_after = certificate.not_after;
        // The date, not a count of days: the message (and so the Event) stays the same from
        // one day to the next.
        let date = k8s_openapi::jiff::Timestamp::from_second(not_after)
            .map_or_else(|_| not_after.to_string(), |t| t.to_string());
        let (reason, message) = if not_after <= now {
            (
                ProblemReason::CertificateExpired,
                format!("the certificate of Secret {name:?} expired at {date}; it is still served"),
            )
        } else if not_after - now <= EXPIRY_WARNING.as_secs() as i64 {
            (
                ProblemReason::CertificateExpiresSoon,
                format!("the certificate of Secret {name:?} expires at {date}"),
            )
        } else {
            continue;
        };
        out.push(Problem {
            namespace: ingress.namespace.clone(),
            name: ingress.name.clone(),
            reason,
            message,
        });
    }
    out
}

/// Writes of one Event tried before it is given up (about 15 s of pauses in all).
const EVENT_ATTEMPTS: u32 = 5;
/// The pause after the first failed Event write; each later pause doubles.
const EVENT_RETRY_FIRST: Duration = Duration::from_secs(1);

/// Where the control plane's Events go: its client and its name as their reporter.
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
}

/// Event writes in flight at once in this process, at most [`EVENT_WRITERS`]: a change to
/// thousands of Ingresses queues their Events rather than opening thousands of requests.
fn event_writers() -> &'static tokio::sync::Semaphore {
    static WRITERS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    WRITERS.get_or_init(|| tokio::sync::Semaphore::new(EVENT_WRITERS))
}

/// Event writes in flight at once.
const EVENT_WRITERS: usize = 8;

impl Events {
    /// Events recorded through `client`, reported by `instance` of the control plane.
    pub fn new(client: Client, instance: String) -> Self {
        Events {
            client,
            reporter: Reporter {
                controller: "holdfast-control-plane".into(),
                instance: Some(instance),
            },
        }
    }

    /// Records `event` on `reference` in a task of its own. A failed write (a busy or
    /// restarting API server) is retried [`EVENT_ATTEMPTS`] times, then given up with a
    /// warning. Each is an Event of its own: kube's `Recorder` would make a later Event of
    /// the same reason on the same object a repeat of the first, with the first's message,
    /// so each write gets a recorder with nothing cached.
    pub fn record(&self, event: Event, reference: k8s_openapi::api::core::v1::ObjectReference) {
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        tokio::spawn(async move {
            let mut pause = EVENT_RETRY_FIRST;
            for attempt in 1..=EVENT_ATTEMPTS {
                // A place is held for the write only, not through the pause after it.
                let written = match event_writers().acquire().await {
                    Ok(_writing) => recorder.publish(&event, &reference).await,
                    Err(_) => return,
                };
                match written {
                    Ok(()) => return,
                    Err(error) if attempt == EVENT_ATTEMPTS => {
                        tracing::warn!(%error, attempts = attempt, reason = %event.reason, "could not record Event");
                    }
                    Err(error) => {
                        tracing::debug!(%error, attempt, "could not record Event; retrying");
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                }
            }
        });
    }
}

/// Reports skipped Ingress rules as Kubernetes Events, each once per process.
pub struct ProblemReporter {
    events: Option<Events>,
    reported: BTreeSet<Problem>,
}

impl ProblemReporter {
    /// Events are recorded through `client` (None: log only).
    pub fn new(client: Option<Client>, instance: String) -> Self {
        ProblemReporter {
            events: client.map(|c| Events::new(c, instance)),
            reported: BTreeSet::new(),
        }
    }

    fn report(&mut self, problems: &[Problem], state: &ClusterState) {
        let current: BTreeSet<Problem> = problems.iter().cloned().collect();
        for p in current.difference(&self.reported) {
            tracing::warn!(
                ingress = %format!("{}/{}", p.namespace, p.name),
                reason = p.reason.as_str(),
                "{}", p.message
            );
            let Some(events) = &self.events else {
                continue;
            };
            let Some(ing) = state.ingresses.iter().find(|i| {
                i.metadata.namespace.as_deref() == Some(&p.namespace)
                    && i.metadata.name.as_deref() == Some(&p.name)
            }) else {
                continue;
            };
            let reference = ing.object_ref(&());
            let event = Event {
                type_: EventType::Warning,
                reason: p.reason.as_str().into(),
                note: Some(p.message.clone()),
                action: "Translate".into(),
                secondary: None,
            };
            // Off the build path: an API outage must not slow publishing. The problem is
            // also in the log and `GetStatus`.
            events.record(event, reference);
        }
        self.reported = current;
    }
}

/// Confirms a held snapshot with a fresh, consistent (quorum) read of the objects routes
/// come from. "Could not read" is never confirmation.
pub struct FreshRead {
    client: Client,
    page_size: u32,
}

impl FreshRead {
    /// Reads through `client`, `page_size` objects per LIST page (`--list-page-size`).
    pub fn new(client: Client, page_size: u32) -> Self {
        FreshRead { client, page_size }
    }

    /// True when the API server's Ingresses, IngressClasses, Gateway API objects and
    /// Namespaces are exactly the cached ones (the kinds in `absent`, which the API
    /// server does not serve, left out).
    pub async fn confirms(&self, caches: &Caches, absent: &[&str]) -> Result<bool, kube::Error> {
        Ok(self.read(absent).await? == caches.routing_objects(absent))
    }

    /// What [`Caches::routing_objects`] holds, read from the API server: each kind one
    /// consistent list.
    async fn read(&self, absent: &[&str]) -> Result<Vec<(String, String)>, kube::Error> {
        use crate::caches::tagged;
        use crate::gateway_api::{
            Gateway, GatewayClass, GrpcRoute, HttpRoute, ReferenceGrant, TlsRoute,
        };
        let mut fresh = self.list_all::<Ingress>().await?;
        fresh.extend(self.list_all::<IngressClass>().await?);
        if !absent.contains(&"GatewayClass") {
            fresh.extend(tagged(
                "GatewayClass",
                self.list_all::<GatewayClass>().await?,
            ));
        }
        if !absent.contains(&"Gateway") {
            fresh.extend(tagged("Gateway", self.list_all::<Gateway>().await?));
        }
        if !absent.contains(&"HTTPRoute") {
            fresh.extend(tagged("HTTPRoute", self.list_all::<HttpRoute>().await?));
        }
        if !absent.contains(&"GRPCRoute") {
            fresh.extend(tagged("GRPCRoute", self.list_all::<GrpcRoute>().await?));
        }
        if !absent.contains(&"TLSRoute") {
            fresh.extend(tagged("TLSRoute", self.list_all::<TlsRoute>().await?));
        }
        if !absent.contains(&"ReferenceGrant") {
            fresh.extend(tagged(
                "ReferenceGrant",
                self.list_all::<ReferenceGrant>().await?,
            ));
        }
        fresh.extend(tagged(
            "Namespace",
            self.list_all::<k8s_openapi::api::core::v1::Namespace>()
                .await?,
        ));
        Ok(fresh)
    }

    /// Every object of kind `K` in pages of `page_size`: the first page is a quorum read
    /// (no resourceVersion), and its continue token serves the rest from the same
    /// revision, so the pages make one consistent list. An expired token (410) is an
    /// error, as any failed page is: the read is retried whole, never used in part.
    async fn list_all<K>(&self) -> Result<Vec<(String, String)>, kube::Error>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let api = Api::<K>::all(self.client.clone());
        let mut lp = kube::api::ListParams::default().limit(self.page_size.max(1));
        let mut ids = Vec::new();
        loop {
            let page = api.list(&lp).await?;
            ids.extend(identity(page.items.iter()));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => break,
            }
        }
        ids.sort();
        Ok(ids)
    }
}

/// Runs the loop until `shutdown` resolves.
pub async fn run(
    caches: Caches,
    shared: Shared,
    changed: Arc<Notify>,
    settings: Settings,
    reporter: ProblemReporter,
    fresh: Option<FreshRead>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut confirm_tick = tokio::time::interval(
        Duration::from_millis(250).min(settings.confirm_after.max(Duration::from_millis(10))),
    );
    let mut last_confirm_attempt: Option<Instant> = None;
    // The fresh read runs in its own task: a paged read of every Ingress takes a while,
    // and must not hold up building and publishing meanwhile.
    let fresh = fresh.map(Arc::new);
    let mut confirming: Option<tokio::task::JoinHandle<()>> = None;
    // The long-lived translator and the Event reporter, used by one build at a time on
    // tokio's blocking pool (see `rebuild_off_runtime`).
    let tracer = settings.tracing.as_ref().and_then(|t| {
        let dropped = shared.metrics().spans_dropped.clone();
        match holdfast_process::otlp::Exporter::start(
            &t.endpoint,
            "holdfast-control-plane",
            1024,
            dropped,
        ) {
            Ok(exporter) => Some((exporter, t.ratio)),
            Err(error) => {
                tracing::error!(%error, endpoint = %t.endpoint, "not tracing builds");
                None
            }
        }
    });
    // The last builds' spans are sent before the process ends.
    let exporter_at_exit = tracer.as_ref().map(|(exporter, _)| exporter.clone());
    let builder = Arc::new(std::sync::Mutex::new(Builder {
        translator: Translator::default(),
        reporter,
        deferred: None,
        tracer,
    }));
    // Certificates near expiry are noticed without any cluster change.
    let mut expiry_tick = tokio::time::interval(Duration::from_secs(3600));
    // When the last build for a change ended: a change within `debounce` of it is part of
    // a burst.
    let mut last_build: Option<Instant> = None;
    expiry_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                if let Some(task) = confirming {
                    task.abort();
                }
                if let Some(exporter) = &exporter_at_exit
                    && !exporter.flush(Duration::from_secs(2)).await
                {
                    tracing::warn!("build spans still queued at exit were not sent");
                }
                return;
            }
            _ = expiry_tick.tick() => {
                rebuild_off_runtime(&caches, &shared, &settings, &builder, Removals::Guard).await;
            }
            _ = changed.notified() => {
                // A lone change is built at once, and published then only if it takes
                // nothing away; a removal waits for the burst it may begin, so the guard
                // judges it with the rest of that burst (changes less than the quiet
                // period apart, up to --max-delay), as before.
                let lone = !in_burst(last_build, Instant::now(), settings.debounce);
                let deferred = lone
                    && rebuild_off_runtime(&caches, &shared, &settings, &builder, Removals::Defer)
                        .await
                        == Built::Deferred;
                if !lone || deferred {
                    coalesce(&changed, settings.debounce, settings.max_delay).await;
                    rebuild_off_runtime(&caches, &shared, &settings, &builder, Removals::Guard)
                        .await;
                }
                last_build = Some(Instant::now());
            }
            _ = confirm_tick.tick() => {
                if confirming.as_ref().is_some_and(|task| !task.is_finished()) {
                    continue;
                }
                let Some(fresh) = fresh.clone() else { continue };
                let Some(held) = shared.held() else { continue };
                if held.since_instant.elapsed() < settings.confirm_after {
                    continue;
                }
                if last_confirm_attempt.is_some_and(|t| t.elapsed() < settings.confirm_after) {
                    continue;
                }
                last_confirm_attempt = Some(Instant::now());
                let (caches, shared) = (caches.clone(), shared.clone());
                confirming = Some(tokio::spawn(async move {
                    try_confirm(&caches, &shared, &fresh, &held).await;
                }));
            }
        }
    }
}

/// Whether a change noticed at `now` is part of a burst, and so waits for it to settle
/// ([`coalesce`]) before the build: it is when the last build for a change ended less than
/// `debounce` before. A change after a quiet period is built at once: a lone change (one
/// `kubectl apply`) is the common case, and waiting for a burst that never comes would add
/// the whole quiet period to its propagation. That build is published only if it removes
/// nothing ([`Removals::Defer`]). The change after it, if it comes soon, starts the
/// coalescing, so a burst costs one extra build, never one build per change.
fn in_burst(last_build: Option<Instant>, now: Instant, debounce: Duration) -> bool {
    last_build.is_some_and(|t| now.saturating_duration_since(t) < debounce)
}

/// Waits until no change has arrived for `debounce`, or `max_delay` has passed.
async fn coalesce(changed: &Notify, debounce: Duration, max_delay: Duration) {
    let deadline = tokio::time::Instant::now() + max_delay;
    loop {
        let quiet_until = (tokio::time::Instant::now() + debounce).min(deadline);
        tokio::select! {
            _ = changed.notified() => {
                if tokio::time::Instant::now() >= deadline { return; }
            }
            _ = tokio::time::sleep_until(quiet_until) => return,
        }
    }
}

/// Runs one build on tokio's blocking pool and waits for it: a build at 100,000 objects
/// takes tens of milliseconds or more, and the runtime's workers keep serving proxy
/// streams and the Admin API meanwhile. Builds never overlap (the loop awaits each).
async fn rebuild_off_runtime(
    caches: &Caches,
    shared: &Shared,
    settings: &Settings,
    builder: &Arc<std::sync::Mutex<Builder>>,
    removals: Removals,
) -> Built {
    let (caches, shared, settings, builder) = (
        caches.clone(),
        shared.clone(),
        settings.clone(),
        builder.clone(),
    );
    let build = tokio::task::spawn_blocking(move || {
        let mut guard = builder.lock().unwrap_or_else(|poisoned| {
            // The build before panicked: start the next from scratch.
            let mut guard = poisoned.into_inner();
            guard.translator = Translator::default();
            guard.deferred = None;
            builder.clear_poison();
            guard
        });
        rebuild(&caches, &shared, &settings, &mut guard, removals)
    });
    build.await.unwrap_or_else(|error| {
        tracing::error!(%error, "a build panicked; the next one starts from scratch");
        Built::Done
    })
}

/// What builds keep from one to the next: the long-lived translator, the Event reporter,
/// and the change list of a candidate left for later ([`Built::Deferred`]).
struct Builder {
    translator: Translator,
    reporter: ProblemReporter,
    /// The content hash of the candidate last deferred, and what it changed against the
    /// build before it: the next build's change list is against the deferred candidate,
    /// which was never published, and is joined to this one ([`carry_changes`]) so that
    /// the guard and the delta stay O(change).
    deferred: Option<(String, Since)>,
    /// Where builds' spans go, and the share of builds traced.
    tracer: Option<(holdfast_process::otlp::Exporter, f64)>,
}

/// Joins the change lists across a deferred build: `candidate` was built right after the
/// deferred build whose content hash is `deferred_hash`, and that build changed `older`
/// against its own base. The result is the candidate's change list against that base:
/// both lists, less the names neither `base` (the published build, when it is that base)
/// nor the candidate has (added and gone again in between: a delta must not remove
/// what its receiver never had). A candidate built after anything else keeps its own.
pub fn carry_changes(
    mut candidate: Published,
    deferred_hash: &str,
    older: Since,
    base: Option<&Published>,
) -> Published {
    let Some(newer) = candidate
        .since()
        .filter(|s| s.content_hash == deferred_hash)
    else {
        return candidate;
    };
    let base = base.filter(|b| b.content_hash == older.content_hash);
    let c = &candidate.content;
    let join = |a: &[String], b: &[String], has: &dyn Fn(&Content, &str) -> bool| {
        let all: BTreeSet<&String> = a.iter().chain(b).collect();
        all.into_iter()
            .filter(|n| base.is_none_or(|b| has(&b.content, n)) || has(c, n))
            .cloned()
            .collect::<Vec<_>>()
    };
    let (o, n) = (&older.changed, &newer.changed);
    let changed = translate::Changed {
        virtual_hosts: join(&o.virtual_hosts, &n.virtual_hosts, &|c, n| {
            c.virtual_host(n).is_some()
        }),
        backends: join(&o.backends, &n.backends, &|c, n| c.backend(n).is_some()),
        certificates: join(&o.certificates, &n.certificates, &|c, n| {
            c.certificate(n).is_some()
        }),
        default_backend: o.default_backend || n.default_backend,
        default_certificate: o.default_certificate || n.default_certificate,
        gateway_listeners: join(&o.gateway_listeners, &n.gateway_listeners, &|c, n| {
            c.gateway_listener(n).is_some()
        }),
        gateway_hosts: join(&o.gateway_hosts, &n.gateway_hosts, &|c, n| {
            c.gateway_host(n).is_some()
        }),
    };
    candidate.set_since(Some(Since {
        content_hash: older.content_hash,
        changed,
    }));
    candidate
}

/// What a build may do with a candidate that takes routes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removals {
    /// Offer it: the guard decides (publish, or hold what it removes).
    Guard,
    /// Offer only a candidate that removes nothing and while nothing is held; otherwise
    /// leave it for the build after the quiet period ([`Built::Deferred`]).
    Defer,
}

/// What a build did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Built {
    /// Offered its candidate, or had none to offer (caches incomplete, invalid).
    Done,
    /// Left a candidate that removes routes for the build after the quiet period.
    Deferred,
}

/// Whether offering `candidate` now could take something away: it removes a route of the
/// published snapshot (the guard at a share of 0), a backend that had endpoints has none
/// left (its routes would answer 503: often the first piece of a namespace's deletion),
/// or routes are held already (then every candidate is judged route by route). Without
/// a change list against the published snapshot it is assumed to. A first snapshot
/// takes nothing away.
fn takes_routes_away(shared: &Shared, candidate: &Published) -> bool {
    if shared.held().is_some() {
        return true;
    }
    let Some(published) = shared.published() else {
        return false;
    };
    let Some(changed) = candidate.changed_since(&published.content_hash) else {
        return true;
    };
    let emptied = changed.backends.iter().any(|name| {
        let had = published
            .content
            .backend(name)
            .is_some_and(|b| !b.endpoints.is_empty());
        let has = candidate
            .content
            .backend(name)
            .is_some_and(|b| !b.endpoints.is_empty());
        had && !has
    });
    emptied || guard(Some(&published), candidate, 0.0) != Verdict::Publish
}

#[cfg(test)]
thread_local! {
    /// Builds run on this thread (tests: where builds run).
    static BUILDS_ON_THIS_THREAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn rebuild(
    caches: &Caches,
    shared: &Shared,
    settings: &Settings,
    builder: &mut Builder,
    removals: Removals,
) -> Built {
    let Builder {
        translator,
        reporter,
        deferred,
        tracer,
    } = builder;
    #[cfg(test)]
    BUILDS_ON_THIS_THREAD.with(|n| n.set(n.get() + 1));
    if !shared.all_synced() {
        tracing::debug!(unsynced = ?shared.unsynced(), "not building: caches incomplete");
        return Built::Done;
    }
    let mut span = tracer
        .as_ref()
        .filter(|(_, ratio)| sampled(*ratio))
        .map(|(exporter, _)| BuildSpan::start(exporter.clone()));
    let started = Instant::now();
    // Each kind's store with its progress, read together.
    let (progress, state) = caches.read();
    let revision = progress
        .iter()
        .map(|p| p.resource_version)
        .max()
        .unwrap_or(0);
    let built = build_with(translator, &state, &settings.translate, revision)
        .map(|(built, problems)| (built.with_progress(progress), problems));
    shared
        .metrics()
        .build_duration
        .observe(started.elapsed().as_secs_f64());
    let (candidate, problems) = match built {
        Ok(b) => b,
        Err(error) => {
            // A bug, not bad input: translation only emits consistent snapshots. The next
            // build starts from scratch, so it is validated whole rather than by its
            // changes since this one.
            tracing::error!(%error, "built snapshot failed validation; not publishing");
            *translator = Translator::default();
            *deferred = None;
            if let Some(span) = span.take() {
                span.end("invalid", revision, None, true);
            }
            return Built::Done;
        }
    };
    let candidate = match deferred.take() {
        Some((hash, older)) => {
            carry_changes(candidate, &hash, older, shared.published().as_deref())
        }
        None => candidate,
    };
    record_problems(shared, &problems, &candidate);
    reporter.report(&problems, &state);
    // The caches may have started a re-list while we read them; the stores still held the
    // last complete lists, but stay conservative and wait for the next InitDone.
    if !shared.all_synced() {
        return Built::Done;
    }
    if removals == Removals::Defer && takes_routes_away(shared, &candidate) {
        *deferred = candidate
            .since()
            .map(|s| (candidate.content_hash.clone(), s.clone()));
        if let Some(span) = span.take() {
            span.end("deferred", revision, None, false);
        }
        return Built::Deferred;
    }
    let offered = SystemTime::now();
    let routes = candidate.route_count();
    offer(
        shared,
        candidate,
        settings.max_removal_share,
        settings.max_snapshot_bytes,
    );
    if let Some(span) = span.take() {
        let published = shared.published().map(|p| p.version.clone());
        let publish = Publish {
            start: offered,
            version: published.unwrap_or_default(),
            routes,
            held: shared.held().is_some(),
        };
        span.end("offered", revision, Some(publish), false);
    }
    Built::Done
}

/// Whether a build is traced, at `ratio`.
fn sampled(ratio: f64) -> bool {
    let draw = u64::from_be_bytes(holdfast_process::otlp::span_id()) >> 11;
    (draw as f64) < ratio * (1u64 << 53) as f64
}

/// A traced build: its span, exported when it ends ([`BuildSpan::end`]).
struct BuildSpan {
    exporter: holdfast_process::otlp::Exporter,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    start: SystemTime,
}

/// What a build's `publish` child span says: the offer, and what it left published.
struct Publish {
    start: SystemTime,
    version: String,
    routes: usize,
    held: bool,
}

impl BuildSpan {
    fn start(exporter: holdfast_process::otlp::Exporter) -> BuildSpan {
        BuildSpan {
            exporter,
            trace_id: holdfast_process::otlp::trace_id(),
            span_id: holdfast_process::otlp::span_id(),
            start: SystemTime::now(),
        }
    }

    /// Exports the `build` span (`outcome`: offered, deferred, invalid) and, when it
    /// offered its snapshot, the `publish` span under it.
    fn end(self, outcome: &str, revision: u64, publish: Option<Publish>, error: bool) {
        use holdfast_process::otlp::{Kind, Span, Value};
        let end = SystemTime::now();
        if let Some(p) = publish {
            self.exporter.export(Span {
                trace_id: self.trace_id,
                span_id: holdfast_process::otlp::span_id(),
                parent: Some(self.span_id),
                name: "publish".into(),
                kind: Kind::Internal,
                start: p.start,
                end,
                attributes: vec![
                    ("holdfast.snapshot.version", Value::Str(p.version)),
                    ("holdfast.snapshot.routes", Value::Int(p.routes as i64)),
                    ("holdfast.held", Value::Str(p.held.to_string())),
                ],
                error: false,
            });
        }
        self.exporter.export(Span {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: None,
            name: "build".into(),
            kind: Kind::Internal,
            start: self.start,
            end,
            attributes: vec![
                ("holdfast.build.outcome", Value::Str(outcome.into())),
                ("holdfast.cluster.revision", Value::Int(revision as i64)),
            ],
            error,
        });
    }
}

/// Makes the last build's problems and certificates visible: metrics and `GetStatus`.
fn record_problems(shared: &Shared, problems: &[Problem], candidate: &Published) {
    let metrics = shared.metrics();
    metrics.skipped_rules.set(problems.len() as i64);
    metrics.problems.clear();
    for p in problems {
        metrics
            .problems
            .get_or_create(&ReasonLabel {
                reason: p.reason.as_str().into(),
            })
            .inc();
    }
    metrics.certificate_expiry.clear();
    for c in &candidate.content.certificates {
        metrics
            .certificate_expiry
            .get_or_create(&CertificateLabel {
                certificate: c.name.clone(),
            })
            .set(c.not_after);
    }
    shared.set_problems(problems.to_vec());
}

/// Publishes, holds or drops a sealed, valid candidate.
///
/// A removal over `max_removal_share` (or of every route) holds only the routes it
/// removes: they stay in the published snapshot, and every other change of the candidate
/// (additions, endpoints, small removals) is published with them. Routes held before and
/// still removed stay held; a held route the candidate has again is no longer held. The
/// held set has a name; approval or confirmation publishes the newest candidate, which
/// removes exactly the held routes.
///
/// What would be published (the candidate, with any held routes kept) over
/// `max_snapshot_bytes` is held whole: nothing of it is published and nobody can approve
/// it. Routes held for removal stay held through such a hold, so a size hold never lets a
/// held removal through.
///
/// Cost: O(change) when nothing is held and the guard lets the candidate through;
/// O(snapshot) per build while routes are held (the candidate is compared route by route
/// and the held routes are put back into a copy of it).
pub fn offer(
    shared: &Shared,
    candidate: Published,
    max_removal_share: f64,
    max_snapshot_bytes: usize,
) {
    let _publishing = shared.publishing();
    let published = shared.published();
    if let Some(p) = published
        .as_ref()
        .filter(|p| p.content_hash == candidate.content_hash)
    {
        shared.metrics().unchanged.inc();
        shared.clear_hold();
        // The same content, seen further: published again with the newer progress (the
        // proxies that serve this content are sent nothing; one that waits on this
        // replica's progress gets it).
        if p.progress != candidate.progress {
            shared.publish(Arc::new(p.restamped(candidate.progress)));
        }
        return;
    }
    let Some(published) = published else {
        publish_within(shared, None, candidate, BTreeSet::new(), max_snapshot_bytes);
        return;
    };
    let holding = shared.held();
    let held_so_far = holding
        .as_ref()
        .map(|h| h.routes.clone())
        .unwrap_or_default();
    // The common case, in O(change): nothing held and the guard lets it through.
    if held_so_far.is_empty()
        && guard(Some(&published), &candidate, max_removal_share) == Verdict::Publish
    {
        publish_within(
            shared,
            Some(&published),
            candidate,
            BTreeSet::new(),
            max_snapshot_bytes,
        );
        return;
    }
    // A removal to hold, or one held already: route by route, O(snapshot).
    let before = published.snapshot();
    let removed = removed_routes(before, candidate.snapshot());
    let (held, reason) = held_removals(
        route_keys_of(&published),
        route_keys_of(&candidate),
        &removed,
        &held_so_far,
        max_removal_share,
    );
    if held.is_empty() {
        publish_within(
            shared,
            Some(&published),
            candidate,
            held,
            max_snapshot_bytes,
        );
        return;
    }
    // The candidate with the held routes kept: what is published meanwhile.
    let mut kept = keep_held(candidate.snapshot(), before, &held);
    holdfast_proto::snapshot::seal(&mut kept, candidate.cluster_revision);
    let kept = Published::new(kept);
    if let Err(error) = kept.validate() {
        // Cannot happen (the held routes and what they name come from a valid
        // snapshot); publish nothing rather than something wrong.
        tracing::error!(%error, "the snapshot with the held routes kept is invalid; not publishing");
        return;
    }
    if kept.encoded_len > max_snapshot_bytes {
        hold_oversize(
            shared,
            published.route_count(),
            kept,
            held,
            max_snapshot_bytes,
        );
        return;
    }
    let name = held_name(&held);
    let reason = reason
        .or_else(|| {
            holding
                .as_ref()
                .filter(|h| h.confirmable)
                .map(|h| h.reason.clone())
        })
        .unwrap_or_else(|| format!("{} removed routes are held", held.len()));
    let routes_held = candidate.route_count();
    hold(
        shared,
        Hold {
            name,
            routes: held,
            confirmable: true,
            reason,
            routes_published: published.route_count(),
            routes_held,
            snapshot: Arc::new(candidate),
            since: SystemTime::now(),
            since_instant: Instant::now(),
        },
    );
    if kept.content_hash != published.content_hash {
        shared.publish(Arc::new(kept));
    } else if kept.progress != published.progress {
        // Nothing else changed, but this replica has seen further: as on the fast path.
        shared.publish(Arc::new(published.restamped(kept.progress.clone())));
    }
}

/// Publishes `next` (nothing held for removal) unless it is over `max_snapshot_bytes`,
/// in which case it is held whole.
fn publish_within(
    shared: &Shared,
    published: Option<&Arc<Published>>,
    next: Published,
    held: BTreeSet<crate::guard::RouteKey>,
    max_snapshot_bytes: usize,
) {
    if next.encoded_len > max_snapshot_bytes {
        let routes_published = published.map_or(0, |p| p.route_count());
        hold_oversize(shared, routes_published, next, held, max_snapshot_bytes);
        return;
    }
    shared.clear_hold();
    shared.publish(Arc::new(next));
}

/// Holds `next`, over `max_snapshot_bytes`, whole: nothing of it can be published, nor
/// approved, until a smaller candidate replaces it. The routes `held` for removal stay
/// held (the next candidate is judged with them still held).
fn hold_oversize(
    shared: &Shared,
    routes_published: usize,
    next: Published,
    held: BTreeSet<crate::guard::RouteKey>,
    max_snapshot_bytes: usize,
) {
    let size = next.encoded_len;
    let mut reason = format!(
        "the snapshot is {size} bytes, over --max-snapshot-bytes ({max_snapshot_bytes}); it cannot be published or approved: shrink the Ingresses or raise the limit (and the proxies' limit and memory)"
    );
    if !held.is_empty() {
        reason.push_str(&format!(
            "; {} removed routes stay held until then",
            held.len()
        ));
    }
    hold(
        shared,
        Hold {
            name: next.version.clone(),
            routes: held,
            confirmable: false,
            reason,
            routes_published,
            routes_held: next.route_count(),
            snapshot: Arc::new(next),
            since: SystemTime::now(),
            since_instant: Instant::now(),
        },
    );
}

/// Route keys of a build, the default backend counting as one.
fn route_keys_of(p: &Published) -> usize {
    p.content.routes.keys + usize::from(p.content.default_backend.is_some())
}

/// Records `held`; true (and logged) if it is a new hold.
fn hold(shared: &Shared, held: Hold) -> bool {
    let (name, reason) = (held.name.clone(), held.reason.clone());
    let (published, routes) = (held.routes_published, held.routes_held);
    let new = shared.hold(held);
    if new {
        tracing::warn!(
            held = %name, %reason, routes_published = published, routes_held = routes,
            "holding back until confirmed or approved (ApproveHeldSnapshot); other changes are published"
        );
    }
    new
}

/// The bounded-destruction guard on `candidate`: from what changed when it was built
/// right after the published content (O(change)), else route by route.
fn guard(published: Option<&Published>, candidate: &Published, max_removal_share: f64) -> Verdict {
    let Some(published) = published else {
        return Verdict::Publish;
    };
    let Some(changed) = candidate.changed_since(&published.content_hash) else {
        return assess(
            Some(published.snapshot()),
            candidate.snapshot(),
            max_removal_share,
        );
    };
    let sizes = Sizes {
        keys_before: route_keys_of(published),
        keys_after: route_keys_of(candidate),
        routes_published: published.route_count(),
        routes_held: candidate.route_count(),
    };
    let hosts = changed.virtual_hosts.iter().map(|h| {
        (
            published.content.virtual_host(h).map(|v| &**v),
            candidate.content.virtual_host(h).map(|v| &**v),
        )
    });
    let gateway_hosts = changed.gateway_hosts.iter().map(|h| {
        (
            published.content.gateway_host(h).map(|g| &**g),
            candidate.content.gateway_host(h).map(|g| &**g),
        )
    });
    let default_removed =
        published.content.default_backend.is_some() && candidate.content.default_backend.is_none();
    assess_change(
        sizes,
        hosts,
        gateway_hosts,
        default_removed,
        max_removal_share,
    )
}

async fn try_confirm(caches: &Caches, shared: &Shared, fresh: &FreshRead, held: &Hold) {
    if !held.confirmable {
        return;
    }
    let absent = shared.absent_kinds();
    match fresh.confirms(caches, &absent).await {
        Ok(true) => {
            // Waits for the publishing lock (a build during a hold keeps it for
            // O(snapshot)): off the runtime.
            if let Some(version) = crate::off_runtime(|| shared.release_hold_if(&held.name)) {
                tracing::warn!(
                    held = %held.name, %version, reason = %held.reason,
                    "held removal confirmed by a fresh read; published"
                );
            }
        }
        Ok(false) => tracing::info!("fresh read disagrees with the caches; still holding"),
        Err(error) => tracing::warn!(%error, "fresh read failed; still holding"),
    }
}

#[cfg(test)]
mod tests {
    use holdfast_proto::v1::{Certificate, IngressRef, Snapshot};

    use super::*;

    /// A sealed build: hosts `<name>.test` each routing `/` to backend `svc` whose
    /// endpoints are `endpoints`.
    fn build_of(hosts: &[&str], endpoints: &[&str], revision: u64) -> Published {
        use holdfast_proto::v1::{Backend, Endpoint, MatchKind, Route, VirtualHost};
        let mut s = Snapshot {
            virtual_hosts: hosts
                .iter()
                .map(|h| VirtualHost {
                    host: format!("{h}.test"),
                    routes: vec![Route {
                        match_kind: MatchKind::Prefix as i32,
                        path: "/".into(),
                        backend: "svc".into(),
                        source: None,
                    }],
                    ..Default::default()
                })
                .collect(),
            backends: vec![Backend {
                name: "svc".into(),
                endpoints: endpoints
                    .iter()
                    .map(|a| Endpoint {
                        address: (*a).into(),
                        port: 8080,
                        zone: String::new(),
                        ready: true,
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        holdfast_proto::snapshot::seal(&mut s, revision);
        Published::new(s)
    }

    fn hosts_published(shared: &Shared) -> Vec<String> {
        let p = shared.published().expect("published");
        let mut h: Vec<String> = p
            .snapshot()
            .virtual_hosts
            .iter()
            .map(|v| v.host.trim_end_matches(".test").to_owned())
            .collect();
        h.sort();
        h
    }

    fn endpoints_published(shared: &Shared) -> Vec<String> {
        let p = shared.published().expect("published");
        p.snapshot().backends[0]
            .endpoints
            .iter()
            .map(|e| e.address.clone())
            .collect()
    }

    #[test]
    fn a_held_removal_holds_only_its_routes_while_everything_else_is_published() {
        let shared = Shared::new(crate::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let a = ["a1", "a2", "a3", "a4", "a5", "a6"];
        let b = ["b1", "b2", "b3"];
        let all: Vec<&str> = a.iter().chain(&b).copied().collect();
        offer(&shared, build_of(&all, &["10.0.0.1"], 1), 0.5, usize::MAX);
        let first = shared.published().expect("published").version.clone();

        // Every host of A goes (6 of 9 routes): held; nothing to publish.
        offer(&shared, build_of(&b, &["10.0.0.1"], 2), 0.5, usize::MAX);
        let held = shared.held().expect("held");
        assert_eq!(held.routes.len(), 6);
        assert_eq!(shared.published().expect("published").version, first);
        let status = shared.status().held.expect("held in GetStatus");
        assert_eq!(status.version, held.name);
        assert_eq!(status.held_route_count, 6);
        assert!(status.held_routes.contains(&"a1.test/".to_owned()));

        // A new host and new endpoints are published, with A's routes kept; the held
        // set, its name and its clock are unchanged.
        let c = ["b1", "b2", "b3", "c1"];
        offer(&shared, build_of(&c, &["10.0.0.2"], 3), 0.5, usize::MAX);
        let mut expect: Vec<&str> = all.clone();
        expect.push("c1");
        expect.sort();
        assert_eq!(hosts_published(&shared), expect);
        assert_eq!(endpoints_published(&shared), ["10.0.0.2"]);
        let still = shared.held().expect("still held");
        assert_eq!((&still.name, still.since), (&held.name, held.since));

        // A small removal elsewhere flows too.
        let d = ["b1", "b2", "c1"];
        offer(&shared, build_of(&d, &["10.0.0.2"], 4), 0.5, usize::MAX);
        assert!(!hosts_published(&shared).contains(&"b3".to_owned()));
        assert!(hosts_published(&shared).contains(&"a1".to_owned()));
        assert_eq!(shared.held().expect("held").name, held.name);

        // Approval names the held set and removes exactly its routes.
        assert!(shared.approve(&first).is_err());
        shared.approve(&held.name).expect("approved");
        // Approval published without encoding (under its locks or at all): the streams
        // encode it, outside them.
        assert!(!shared.published().expect("published").encoded_yet());
        assert_eq!(hosts_published(&shared), ["b1", "b2", "c1"]);
        assert!(shared.held().is_none());
    }

    /// A snapshot over the size limit holds everything, and the routes held for removal
    /// stay held through it: the next candidate that fits still keeps them.
    #[test]
    fn an_oversize_candidate_during_a_removal_hold_keeps_the_held_routes_held() {
        let shared = Shared::new(crate::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let all = ["a1", "a2", "a3", "a4", "b1", "b2"];
        offer(&shared, build_of(&all, &["10.0.0.1"], 1), 0.5, usize::MAX);
        offer(
            &shared,
            build_of(&["b1", "b2"], &["10.0.0.1"], 2),
            0.5,
            usize::MAX,
        );
        let removal = shared.held().expect("held");
        assert_eq!(removal.routes.len(), 4);
        let published = shared.published().expect("published").version.clone();

        // Too large: held whole, nothing published, not approvable; A still held.
        let big = build_of(&["b1", "b2", "c1"], &["10.0.0.1"], 3);
        offer(&shared, big, 0.5, 10);
        let oversize = shared.held().expect("held");
        assert!(!oversize.confirmable);
        assert_eq!(oversize.routes, removal.routes);
        assert_eq!(shared.published().expect("published").version, published);
        assert!(shared.approve(&oversize.name).is_err());
        assert!(shared.approve(&removal.name).is_err());

        // Fits again: A's routes are still kept and held under the same name, not removed.
        offer(
            &shared,
            build_of(&["b1", "b2", "c1"], &["10.0.0.1"], 4),
            0.5,
            usize::MAX,
        );
        let again = shared.held().expect("still held");
        assert_eq!(again.name, removal.name);
        assert!(again.confirmable);
        assert_eq!(
            hosts_published(&shared),
            ["a1", "a2", "a3", "a4", "b1", "b2", "c1"]
        );
    }

    /// The size limit applies to what is published: the candidate with the held routes
    /// kept, which is larger than the candidate.
    #[test]
    fn the_candidate_with_its_held_routes_kept_is_held_whole_when_over_the_size_limit() {
        let shared = Shared::new(crate::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let all = ["a1", "a2", "a3", "a4", "b1", "b2"];
        offer(&shared, build_of(&all, &["10.0.0.1"], 1), 0.5, usize::MAX);
        let first = shared.published().expect("published");
        let candidate = build_of(&["b1", "b2", "c1"], &["10.0.0.2"], 2);
        // Room for the candidate alone, not for it with A's four routes kept.
        let limit = candidate.encoded_len + 10;
        assert!(first.encoded_len > limit);
        offer(&shared, candidate, 0.5, limit);
        let held = shared.held().expect("held");
        assert!(!held.confirmable, "{}", held.reason);
        assert_eq!(held.routes.len(), 4);
        assert_eq!(
            shared.published().expect("published").version,
            first.version
        );
    }

    fn progress(ingress: u64, service: u64) -> Vec<holdfast_proto::v1::KindProgress> {
        [("Ingress", ingress), ("Service", service)]
            .iter()
            .map(|(kind, rv)| holdfast_proto::v1::KindProgress {
                kind: (*kind).into(),
                resource_version: *rv,
            })
            .collect()
    }

    /// The same content seen further is published again with the newer progress (a proxy
    /// waiting on this replica needs it), under the same version and without counting as
    /// a new snapshot; during a hold too.
    #[test]
    fn the_same_content_at_newer_progress_is_republished_under_the_same_version() {
        let mut registry = prometheus_client::registry::Registry::default();
        let shared = Shared::new(crate::metrics::Metrics::new(&mut registry));
        let hosts = ["a1", "a2", "a3", "b1"];
        offer(
            &shared,
            build_of(&hosts, &["10.0.0.1"], 5).with_progress(progress(5, 3)),
            0.5,
            usize::MAX,
        );
        let first = shared.published().expect("published");
        let count = shared.metrics().published.get();
        offer(
            &shared,
            build_of(&hosts, &["10.0.0.1"], 9).with_progress(progress(5, 9)),
            0.5,
            usize::MAX,
        );
        let again = shared.published().expect("published");
        assert_eq!(again.progress, progress(5, 9));
        assert_eq!(
            (&again.version, &again.content_hash),
            (&first.version, &first.content_hash)
        );
        assert_eq!(again.snapshot().progress, progress(5, 9));
        assert_eq!(shared.metrics().published.get(), count);

        // During a hold (A's routes held, nothing else changed): the kept snapshot is the
        // published content, and the newer progress is still published.
        offer(
            &shared,
            build_of(&["b1"], &["10.0.0.1"], 12).with_progress(progress(12, 9)),
            0.5,
            usize::MAX,
        );
        assert!(shared.held().is_some());
        assert_eq!(
            shared.published().expect("published").progress,
            progress(12, 9)
        );
        offer(
            &shared,
            build_of(&["b1"], &["10.0.0.1"], 14).with_progress(progress(14, 9)),
            0.5,
            usize::MAX,
        );
        assert_eq!(
            shared.published().expect("published").progress,
            progress(14, 9)
        );
    }

    #[test]
    fn the_held_set_changes_name_when_it_grows_and_goes_when_its_routes_return() {
        let shared = Shared::new(crate::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let all = ["a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2"];
        offer(&shared, build_of(&all, &["10.0.0.1"], 1), 0.5, usize::MAX);
        // 5 of 8 removed: held.
        offer(
            &shared,
            build_of(&["c1", "c2", "b3"], &["10.0.0.1"], 2),
            0.5,
            usize::MAX,
        );
        let first = shared.held().expect("held");
        assert_eq!(first.routes.len(), 5);
        // Everything removed: the rest joins the held set, under a new name.
        offer(&shared, build_of(&[], &["10.0.0.1"], 3), 0.5, usize::MAX);
        let second = shared.held().expect("held");
        assert_eq!(second.routes.len(), 8);
        assert_ne!(second.name, first.name);
        assert!(
            shared.approve(&first.name).is_err(),
            "a stale name approves nothing"
        );
        assert_eq!(hosts_published(&shared).len(), 8);
        // Every route back: nothing is held.
        offer(&shared, build_of(&all, &["10.0.0.1"], 4), 0.5, usize::MAX);
        assert!(shared.held().is_none());
        assert_eq!(hosts_published(&shared).len(), 8);
    }

    /// The reconcile loop builds on tokio's blocking pool, not on a runtime worker: run
    /// on a current-thread runtime (whose one thread is this test's), a change is built
    /// and published while no build ever runs on this thread.
    #[test]
    fn the_reconcile_loop_builds_off_the_runtime_thread() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let published = rt.block_on(async {
            let running = Running::start(Duration::from_millis(1), Duration::from_millis(5));
            let mut published = running.shared.subscribe();
            running.changed.notify_one();
            let _ =
                tokio::time::timeout(Duration::from_secs(10), published.wait_for(Option::is_some))
                    .await;
            running.stop().await.published()
        });
        assert!(published.is_some(), "nothing was built");
        assert_eq!(
            BUILDS_ON_THIS_THREAD.with(std::cell::Cell::get),
            0,
            "a build ran on the runtime's thread"
        );
    }

    /// The reconcile loop on complete caches, spawned on the current runtime.
    struct Running {
        shared: Shared,
        changed: Arc<Notify>,
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<()>,
        registry: prometheus_client::registry::Registry,
    }

    impl Running {
        /// On caches that stay empty.
        fn start(debounce: Duration, max_delay: Duration) -> Running {
            Running::start_on(Caches::empty(), debounce, max_delay)
        }

        fn start_on(caches: Caches, debounce: Duration, max_delay: Duration) -> Running {
            let mut registry = prometheus_client::registry::Registry::default();
            let shared = Shared::new(crate::metrics::Metrics::new(&mut registry));
            for kind in crate::state::KINDS {
                shared.set_synced(kind, true);
            }
            let changed = Arc::new(Notify::new());
            let settings = Settings {
                translate: translate::Options::default(),
                debounce,
                max_delay,
                max_removal_share: 0.5,
                confirm_after: Duration::from_secs(3600),
                max_snapshot_bytes: usize::MAX,
                tracing: None,
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(run(
                caches,
                shared.clone(),
                changed.clone(),
                settings,
                ProblemReporter::new(None, "test".into()),
                None,
                async {
                    let _ = stopped.await;
                },
            ));
            Running {
                shared,
                changed,
                stop,
                task,
                registry,
            }
        }

        /// How many snapshots the loop has built (its build-time histogram's count).
        fn builds(&self) -> u64 {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &self.registry)
                .expect("metrics encode");
            text.lines()
                .find_map(|l| l.strip_prefix("holdfast_snapshot_build_duration_seconds_count "))
                .and_then(|v| v.trim().parse().ok())
                .expect("the build-time series")
        }

        /// The routes of the published snapshot, once `ready` holds of it (within 10 s).
        async fn published_when(&self, what: &str, ready: impl Fn(usize) -> bool) -> usize {
            let mut published = self.shared.subscribe();
            let found = tokio::time::timeout(
                Duration::from_secs(10),
                published.wait_for(|p| p.as_ref().is_some_and(|p| ready(p.route_count()))),
            )
            .await
            .unwrap_or_else(|_| panic!("{what}: not published within 10 s"))
            .expect("publication channel")
            .as_ref()
            .map(|p| p.route_count());
            found.expect("published")
        }

        /// Waits (up to 10 s) until `done` holds of the loop.
        async fn until(&self, what: &str, done: impl Fn(&Running) -> bool) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while !done(self) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: not within 10 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }

        /// Stops the loop and waits for it: its shared state.
        async fn stop(self) -> Shared {
            let _ = self.stop.send(());
            let _ = self.task.await;
            self.shared
        }
    }

    /// A change after a quiet period is built at once; one within the quiet period of the
    /// last build waits for the burst to settle.
    #[test]
    fn only_a_change_soon_after_a_build_waits_for_the_burst() {
        let debounce = Duration::from_millis(20);
        let t0 = Instant::now();
        assert!(!in_burst(None, t0, debounce), "the first change");
        assert!(in_burst(Some(t0), t0 + Duration::from_millis(5), debounce));
        assert!(!in_burst(Some(t0), t0 + debounce, debounce));
        assert!(!in_burst(Some(t0), t0 + Duration::from_secs(3), debounce));
        // A clock reading before the build (threads race to read it) is within the burst.
        assert!(in_burst(Some(t0 + Duration::from_millis(1)), t0, debounce));
    }

    /// A build made right after a deferred one carries the deferred one's changes: its
    /// change list is then against the published base, and exactly what differs between
    /// the two (a host added and gone again in between is not in it); so the guard and
    /// the delta of a deferred removal stay O(change).
    #[test]
    fn a_build_after_a_deferred_one_carries_its_changes_against_the_published_base() {
        use crate::translate::Changed;
        let ip = ["10.0.0.1"];
        let since = |before: &Published, after: &Published| Since {
            content_hash: before.content_hash.clone(),
            changed: Changed::between(before.snapshot(), after.snapshot()),
        };
        let base = build_of(&["a", "b"], &ip, 1);
        // Deferred: b goes, x comes. Then x goes again and c comes.
        let mut deferred = build_of(&["a", "x"], &ip, 2);
        deferred.set_since(Some(since(&base, &deferred)));
        let mut next = build_of(&["a", "c"], &ip, 3);
        next.set_since(Some(since(&deferred, &next)));
        let older = deferred.since().expect("since").clone();
        let carried = carry_changes(next, &deferred.content_hash, older.clone(), Some(&base));
        let got = carried.since().expect("since");
        assert_eq!(got.content_hash, base.content_hash);
        let want = Changed::between(base.snapshot(), carried.snapshot());
        assert_eq!(got.changed.virtual_hosts, ["b.test", "c.test"]);
        assert_eq!(got.changed.virtual_hosts, want.virtual_hosts);
        assert_eq!(got.changed.backends, want.backends);
        assert!(carried.changed_since(&base.content_hash).is_some());

        // A build made after anything else keeps its own list.
        let mut other = build_of(&["a"], &ip, 4);
        other.set_since(Some(since(&base, &other)));
        let kept = carry_changes(other, &deferred.content_hash, older, Some(&base));
        assert_eq!(
            kept.since().expect("since").changed.virtual_hosts,
            ["b.test"]
        );
    }

    /// A lone change's build is published before the quiet period only when it takes no
    /// route away: a removal, even one the guard would let through, waits for the burst it
    /// may begin (else a mass deletion arriving in pieces would pass piece by piece).
    #[test]
    fn only_a_candidate_that_removes_nothing_skips_the_quiet_period() {
        use crate::translate::Changed;
        let shared = Shared::new(crate::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        ));
        let ip = ["10.0.0.1"];
        // A candidate with its change list against the published snapshot, as the
        // translator makes it.
        let candidate = |hosts: &[&str], endpoints: &[&str], revision| {
            let mut c = build_of(hosts, endpoints, revision);
            if let Some(p) = shared.published() {
                c.set_since(Some(Since {
                    content_hash: p.content_hash.clone(),
                    changed: Changed::between(p.snapshot(), c.snapshot()),
                }));
            }
            c
        };
        assert!(
            !takes_routes_away(&shared, &candidate(&["a", "b"], &ip, 1)),
            "a first snapshot"
        );
        offer(&shared, build_of(&["a", "b"], &ip, 1), 0.5, usize::MAX);
        assert!(
            !takes_routes_away(&shared, &candidate(&["a", "b", "c"], &ip, 2)),
            "an added host"
        );
        assert!(
            !takes_routes_away(&shared, &candidate(&["a", "b"], &["10.0.0.2"], 2)),
            "new endpoints"
        );
        assert!(
            takes_routes_away(&shared, &candidate(&["a"], &ip, 2)),
            "one host of two goes (within the guard's share, still a removal)"
        );
        assert!(
            takes_routes_away(&shared, &candidate(&["a", "b"], &[], 2)),
            "the backend loses its last endpoint"
        );
        assert!(
            takes_routes_away(&shared, &build_of(&["a", "b", "c"], &ip, 2)),
            "no change list against the published snapshot"
        );
        // Every route goes: held. While anything is held, every candidate waits.
        offer(&shared, build_of(&[], &ip, 3), 0.5, usize::MAX);
        assert!(shared.held().is_some(), "removing every route is held");
        assert!(
            takes_routes_away(&shared, &candidate(&["a", "b", "c"], &ip, 4)),
            "a candidate while routes are held"
        );
    }

    /// The reconcile loop does not hold a lone change for the quiet period: with a quiet
    /// period and a longest delay of an hour, the first change is still published.
    #[tokio::test]
    async fn a_lone_change_is_built_without_waiting_for_the_quiet_period() {
        let hour = Duration::from_secs(3600);
        let running = Running::start(hour, hour);
        let shared = running.shared.clone();
        // The loop's first build (at start, for certificate expiry) publishes.
        let mut published = shared.subscribe();
        tokio::time::timeout(Duration::from_secs(10), published.wait_for(Option::is_some))
            .await
            .expect("the build at start")
            .expect("publication channel");
        // A change then builds again, to the same content: counted as unchanged.
        running.changed.notify_one();
        running
            .until(
                "a lone change built, not after the quiet period (an hour)",
                |r| r.shared.metrics().unchanged.get() > 0,
            )
            .await;
        running.stop().await;
        assert_eq!(shared.metrics().unchanged.get(), 1);
    }

    /// Caches holding our IngressClass and one Ingress per host (`<h>.test`, path `/`)
    /// to Service `web`, which has a ready endpoint: one route per host.
    fn hosts_in_caches(hosts: &[&str]) -> (Caches, crate::caches::TestWriters) {
        use kube::runtime::watcher::Event;
        let (caches, mut w) = Caches::written();
        fn object<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
            serde_json::from_value(v).expect("an object")
        }
        w.ingress_classes
            .apply_watcher_event(&Event::Apply(object(serde_json::json!({
            "metadata": { "name": "holdfast" },
            "spec": { "controller": "holdfast.dev/ingress-controller" } }))));
        w.services
            .apply_watcher_event(&Event::Apply(object(serde_json::json!({
            "metadata": { "namespace": "ns", "name": "web" },
            "spec": { "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }] } }))));
        w.endpoint_slices
            .apply_watcher_event(&Event::Apply(object(serde_json::json!({
            "metadata": { "namespace": "ns", "name": "web-1",
                          "labels": { "kubernetes.io/service-name": "web" } },
            "addressType": "IPv4",
            "ports": [{ "name": "http", "port": 8080 }],
            "endpoints": [{ "addresses": ["10.0.0.1"], "conditions": { "ready": true } }] }))));
        for h in hosts {
            w.ingresses
                .apply_watcher_event(&Event::Apply(host_ingress(h)));
        }
        (caches, w)
    }

    fn host_ingress(h: &str) -> k8s_openapi::api::networking::v1::Ingress {
        serde_json::from_value(serde_json::json!({
            "metadata": { "namespace": "ns", "name": h, "resourceVersion": "1",
                          "creationTimestamp": "2026-01-01T00:00:00Z" },
            "spec": { "ingressClassName": "holdfast", "rules": [{ "host": format!("{h}.test"),
                "http": { "paths": [{ "path": "/", "pathType": "Prefix",
                    "backend": { "service": { "name": "web", "port": { "number": 80 } } } }] } }] } }))
        .expect("an Ingress")
    }

    /// A lone change that removes a route (one of four: within the guard's share) is not
    /// published at once like an addition: it waits out the quiet period, for the burst it
    /// may begin, and is then published.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_removal_is_published_only_after_the_quiet_period() {
        use kube::runtime::watcher::Event;
        let debounce = Duration::from_millis(300);
        let (caches, mut w) = hosts_in_caches(&["a", "b", "c", "d"]);
        let running = Running::start_on(caches, debounce, Duration::from_secs(10));
        // The build at start is not a change's build (no quiet period runs from it), so
        // the removal below is a lone change.
        let first = running
            .published_when("the build at start", |n| n > 0)
            .await;
        assert_eq!(first, 4);
        let before = running.builds();

        w.ingresses
            .apply_watcher_event(&Event::Delete(host_ingress("d")));
        let t0 = Instant::now();
        running.changed.notify_one();
        running.published_when("the removal", |n| n == 3).await;
        let waited = t0.elapsed();
        let builds = running.builds() - before;
        running.stop().await;
        assert!(
            waited >= debounce,
            "a lone removal was published after {waited:?}, before the quiet period ({debounce:?})"
        );
        // Built at once as a lone change (and not published), then again once the quiet
        // period passed: a removal that merely came within a burst is built once.
        assert_eq!(builds, 2, "the lone change's build, then the burst's");
    }

    /// Removals that arrive one by one, each within the quiet period of the one before,
    /// are judged by the guard as one burst: three routes of four go, so the whole burst
    /// is held and the first removal is not published on its own (else a mass deletion
    /// arriving in pieces would pass piece by piece).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn removals_arriving_one_by_one_are_held_as_one_burst() {
        use kube::runtime::watcher::Event;
        let (caches, mut w) = hosts_in_caches(&["a", "b", "c", "d"]);
        let running = Running::start_on(caches, Duration::from_secs(2), Duration::from_secs(20));
        assert_eq!(
            running
                .published_when("the build at start", |n| n > 0)
                .await,
            4
        );
        let before = running.builds();

        // The first removal, alone: built, and not published.
        w.ingresses
            .apply_watcher_event(&Event::Delete(host_ingress("b")));
        running.changed.notify_one();
        running
            .until("the first removal built", |r| r.builds() > before)
            .await;
        let routes = running.shared.published().map(|p| p.route_count());
        assert_eq!(
            routes,
            Some(4),
            "the first removal was published on its own"
        );

        // Two more, within the quiet period: the three are held together.
        for h in ["c", "d"] {
            w.ingresses
                .apply_watcher_event(&Event::Delete(host_ingress(h)));
            running.changed.notify_one();
        }
        running
            .until("the burst held", |r| r.shared.held().is_some())
            .await;
        let routes = running.shared.published().map(|p| p.route_count());
        let shared = running.stop().await;
        assert_eq!(routes, Some(4), "every route is still served while held");
        assert_eq!(shared.metrics().holds.get(), 1);
    }

    /// A page of `IngressList`: Ingresses `ns/ing-<i>` for `i` in `range`, continued at
    /// `range.end` unless that is `total`.
    fn ingress_page(range: std::ops::Range<usize>, total: usize) -> serde_json::Value {
        let items: Vec<_> = range
            .clone()
            .map(|i| serde_json::json!({"metadata": {"namespace": "ns", "name": format!("ing-{i}"), "resourceVersion": "7"}}))
            .collect();
        let mut metadata = serde_json::json!({"resourceVersion": "7"});
        if range.end < total {
            metadata["continue"] = range.end.to_string().into();
        }
        serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressList", "metadata": metadata, "items": items})
    }

    const INGRESSES: &str = "/apis/networking.k8s.io/v1/ingresses";
    const CLASSES: &str = "/apis/networking.k8s.io/v1/ingressclasses";

    /// The exact requests of a fresh read of 5 Ingresses in pages of 2: a quorum LIST
    /// (no resourceVersion), then each continue token in turn, then the IngressClasses,
    /// then the Gateway API kinds the API server serves (here only HTTPRoute), then the
    /// Namespaces.
    #[tokio::test]
    async fn the_fresh_read_lists_in_pages_of_the_page_size_and_gets_every_object() {
        let (client, mut api) = crate::fixtures::client();
        let read = tokio::spawn(async move {
            FreshRead::new(client, 2)
                .read(&["GatewayClass", "Gateway", "ReferenceGrant"])
                .await
        });
        let mut queries = Vec::new();
        for (range, continued) in [(0..2, None), (2..4, Some("2")), (4..5, Some("4"))] {
            let r = api
                .expect(http::Method::GET, INGRESSES, 200, |_| {
                    ingress_page(range, 5)
                })
                .await;
            assert!(r.query.contains("limit=2"), "{}", r.query);
            assert!(
                !r.query.contains("resourceVersion"),
                "not a quorum read: {}",
                r.query
            );
            match continued {
                Some(token) => assert!(
                    r.query.contains(&format!("continue={token}")),
                    "{}",
                    r.query
                ),
                None => assert!(!r.query.contains("continue="), "{}", r.query),
            }
            queries.push(r.query);
        }
        api.expect(http::Method::GET, CLASSES, 200, |_| {
            serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClassList", "metadata": {}, "items": []})
        })
        .await;
        api.expect(http::Method::GET, "/apis/gateway.networking.k8s.io/v1/httproutes", 200, |_| {
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRouteList", "metadata": {},
                "items": [{"metadata": {"namespace": "ns", "name": "r", "resourceVersion": "9"}, "spec": {}}]})
        })
        .await;
        api.expect(http::Method::GET, "/apis/gateway.networking.k8s.io/v1/grpcroutes", 200, |_| {
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRouteList", "metadata": {},
                "items": [{"metadata": {"namespace": "ns", "name": "g", "resourceVersion": "10"}, "spec": {}}]})
        })
        .await;
        api.expect(http::Method::GET, "/apis/gateway.networking.k8s.io/v1/tlsroutes", 200, |_| {
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRouteList", "metadata": {},
                "items": [{"metadata": {"namespace": "ns", "name": "t", "resourceVersion": "11"}, "spec": {}}]})
        })
        .await;
        api.expect(http::Method::GET, "/api/v1/namespaces", 200, |_| {
            serde_json::json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {},
                "items": [{"metadata": {"name": "ns", "resourceVersion": "3"}}]})
        })
        .await;
        let read = read.await.expect("the read task").expect("reads");
        let names: Vec<&str> = read.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "ns/ing-0",
                "ns/ing-1",
                "ns/ing-2",
                "ns/ing-3",
                "ns/ing-4",
                "HTTPRoute:ns/r",
                "GRPCRoute:ns/g",
                "TLSRoute:ns/t",
                "Namespace:/ns"
            ]
        );
    }

    /// A later page answered 410 (an expired continue token): the read is an error, and
    /// nothing more is asked (no IngressClasses: a partial list is never used).
    #[tokio::test]
    async fn a_fresh_read_whose_later_page_fails_is_an_error_never_a_partial_list() {
        let (client, mut api) = crate::fixtures::client();
        let read = tokio::spawn(async move { FreshRead::new(client, 2).read(&[]).await });
        api.expect(http::Method::GET, INGRESSES, 200, |_| ingress_page(0..2, 5))
            .await;
        api.expect(http::Method::GET, INGRESSES, 410, |_| {
            serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Expired", "code": 410, "message": "the continue token has expired"})
        })
        .await;
        let read = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the read ends at the failed page")
            .expect("the read task");
        assert!(read.is_err(), "{read:?}");
    }

    /// The exact Events of skipped rules: one Warning Event (events.k8s.io/v1) on the
    /// Ingress, saying the reason and the message, from this controller and instance;
    /// a problem already reported is not reported again (the next request is the next new
    /// problem's).
    #[tokio::test]
    async fn a_skipped_rule_is_one_warning_event_on_its_ingress_reported_once() {
        let (client, mut api) = crate::fixtures::client();
        let mut reporter = ProblemReporter::new(Some(client), "cp-0".into());
        let ingress: Ingress = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"namespace": "ns", "name": "beta", "uid": "u-1"}
        }))
        .expect("an Ingress");
        let state = ClusterState {
            ingresses: vec![Arc::new(ingress)],
            ..Default::default()
        };
        let problem = |reason: ProblemReason, message: &str| Problem {
            namespace: "ns".into(),
            name: "beta".into(),
            reason,
            message: message.into(),
        };
        let conflict = problem(
            ProblemReason::ConflictingRoute,
            "path / of a.test is ns/alpha's (older)",
        );
        let echo = |r: &crate::fixtures::Received| r.body.clone();
        const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

        reporter.report(std::slice::from_ref(&conflict), &state);
        let event = api.expect(http::Method::POST, EVENTS, 201, echo).await;
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], "ConflictingRoute");
        assert_eq!(event.body["note"], "path / of a.test is ns/alpha's (older)");
        assert_eq!(event.body["action"], "Translate");
        assert_eq!(event.body["regarding"]["name"], "beta");
        assert_eq!(event.body["regarding"]["uid"], "u-1");
        assert_eq!(event.body["reportingController"], "holdfast-control-plane");
        assert_eq!(event.body["reportingInstance"], "cp-0");

        reporter.report(std::slice::from_ref(&conflict), &state);
        let invalid = problem(
            ProblemReason::InvalidPath,
            "path \"x\" on host a.test skipped",
        );
        reporter.report(&[conflict, invalid], &state);
        let next = api.expect(http::Method::POST, EVENTS, 201, echo).await;
        assert_eq!(
            next.body["reason"], "InvalidPath",
            "the conflict was reported twice"
        );
    }

    #[test]
    fn certificates_near_or_past_expiry_are_problems_on_the_ingresses_they_serve() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let day = 86_400;
        let at = |days: i64| 1_000_000_000 + days * day;
        let snapshot = Snapshot {
            certificates: vec![
                Certificate {
                    name: "ns/expired".into(),
                    not_after: at(-3),
                    ..Default::default()
                },
                Certificate {
                    name: "ns/fine".into(),
                    not_after: at(60),
                    ..Default::default()
                },
                Certificate {
                    name: "ns/soon".into(),
                    not_after: at(10),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let user = |cert: &str, ing: &str| {
            (
                cert.to_string(),
                IngressRef {
                    namespace: "ns".into(),
                    name: ing.into(),
                },
            )
        };
        let problems = expiry_problems(
            &Content::of(&snapshot),
            &[
                user("ns/expired", "a"),
                user("ns/fine", "b"),
                user("ns/soon", "c"),
                user("ns/soon", "d"),
            ],
            now,
        );
        let got: Vec<(&str, &str)> = problems
            .iter()
            .map(|p| (p.name.as_str(), p.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "CertificateExpired"),
                ("c", "CertificateExpiresSoon"),
                ("d", "CertificateExpiresSoon")
            ]
        );
        assert!(
            problems[1].message.contains("2001-09-19T01:46:40Z"),
            "{}",
            problems[1].message
        );
    }
}
