//! Prometheus metrics of the proxy (served on the admin listener's `/metrics`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use holdfast_lock::Lock;
use holdfast_process::tls::ReloadCounters;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// What names a route's request series: the names of its route, shared with the route
/// table (one copy of a host's name serves its entry, its routes and their series), and
/// rendered into the `route` label only when the metrics are scraped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum SeriesKey {
    /// An Ingress route's: `<host><path>`.
    HostPath(Arc<str>, Arc<str>),
    /// A label of its own: the default backend's, a Gateway rule's.
    Named(Arc<str>),
}

impl SeriesKey {
    /// The `route` label.
    pub fn label(&self) -> Cow<'_, str> {
        match self {
            SeriesKey::HostPath(host, path) => format!("{host}{path}").into(),
            SeriesKey::Named(name) => (**name).into(),
        }
    }
}

/// The `route` label of the requests that matched no route.
pub const UNROUTED: &str = "(none)";

/// The request series (`requests` and `request_duration_seconds`): each route's, by its
/// [`SeriesKey`], and the requests that matched no route. Encoded as a [`Collector`], so
/// a series holds no label: each is rendered when the metrics are scraped.
#[derive(Debug, Default)]
pub struct RequestSeries {
    routes: Mutex<HashMap<SeriesKey, Arc<RouteSeries>>>,
    unrouted: [OnceLock<Counter>; 4],
}

impl RequestSeries {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<SeriesKey, Arc<RouteSeries>>> {
        self.routes.locked()
    }

    /// The series of `key`, made if it has none: every route with that label counts into
    /// it, whichever table it is in.
    fn series(&self, key: SeriesKey) -> Arc<RouteSeries> {
        self.routes()
            .entry(key)
            .or_insert_with(|| {
                Arc::new(RouteSeries {
                    classes: Default::default(),
                    latency: latency_histogram(),
                    retries: OnceLock::new(),
                })
            })
            .clone()
    }

    /// Number of routes with series.
    pub fn len(&self) -> usize {
        self.routes().len()
    }

    /// Whether no route has series.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Encodes the counter of each status class seen, labelled `route`.
fn encode_classes(
    family: &mut MetricEncoder<'_>,
    route: &str,
    classes: &[OnceLock<Counter>; 4],
) -> Result<(), std::fmt::Error> {
    for (class, counter) in CLASSES.iter().zip(classes) {
        if let Some(counter) = counter.get() {
            counter.encode(family.encode_family(&[("route", route), ("class", class)])?)?;
        }
    }
    Ok(())
}

impl Collector for RequestSeries {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // The labels are rendered outside the lock, which counting a route's first
        // response takes.
        let series: Vec<(SeriesKey, Arc<RouteSeries>)> = self
            .routes()
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        let mut series: Vec<(Cow<'_, str>, &RouteSeries)> =
            series.iter().map(|(k, s)| (k.label(), &**s)).collect();
        series.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        {
            let mut family = encoder.encode_descriptor(
                "requests",
                "Requests served, by route and status class",
                None,
                MetricType::Counter,
            )?;
            for (route, s) in &series {
                encode_classes(&mut family, route, &s.classes)?;
            }
            encode_classes(&mut family, UNROUTED, &self.unrouted)?;
        }
        {
            let mut family = encoder.encode_descriptor(
                "request_duration_seconds",
                "Time from a request's head to its response's head (the proxy's own work, retries and the upstream's answer), by route",
                None,
                MetricType::Histogram,
            )?;
            for (route, s) in &series {
                s.latency
                    .encode(family.encode_family(&[("route", &**route)])?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "route_retries",
            "Requests sent again by their rule's retry policy, by route",
            None,
            MetricType::Counter,
        )?;
        for (route, s) in &series {
            if let Some(retries) = s.retries.get() {
                retries.encode(family.encode_family(&[("route", &**route)])?)?;
            }
        }
        Ok(())
    }
}

/// A route's request counters, one per status class, and its latency histogram, found in
/// the [`RequestSeries`] on first use so that counting a request costs no allocation and
/// no lock. Not part of a route's identity: two routes compare equal whatever their
/// counters.
#[derive(Debug, Default)]
pub struct RouteCounters {
    /// Found (or made) at the route's first response: most routes of a large table may
    /// never answer one, and each then costs only this pointer.
    series: OnceLock<Arc<RouteSeries>>,
    /// Set when the route is no longer served and its series are dropped: a request still
    /// in flight on it must not make them again.
    retired: AtomicBool,
}

/// A route's series: its counter per status class (each made at the first response of
/// its class) and its latency histogram. Shared by the routes of one [`SeriesKey`].
#[derive(Debug)]
struct RouteSeries {
    classes: [OnceLock<Counter>; 4],
    latency: Histogram,
    /// Requests sent again by a rule's retry policy (made at the first).
    retries: OnceLock<Counter>,
}

/// A copy is a route of a new table: it counts into the same series, and is not retired.
impl Clone for RouteCounters {
    fn clone(&self) -> Self {
        RouteCounters {
            series: self.series.clone(),
            retired: AtomicBool::new(false),
        }
    }
}

impl RouteCounters {
    /// The route is no longer served (its series are being dropped).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }
}

impl PartialEq for RouteCounters {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RouteCounters {}

/// The status class labels, by their index in a route's series.
const CLASSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];

/// Labels of a local error answer: why, and its status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// A [`crate::proxy::Reason`], e.g. `no_route` or `upstream_timeout`.
    pub reason: &'static str,
    /// Its status code, e.g. `404`.
    pub status: &'static str,
}

/// Label of the HTTP/1.1 engine in use.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabel {
    /// `native` or `hyper` (`--h1-engine`).
    pub engine: &'static str,
}

/// Label of the state-file loads at start.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoadLabel {
    /// `served` (the persisted snapshot is served), `none` (no state file yet) or
    /// `rejected` (corrupt, truncated, or not a valid snapshot: not used at all).
    pub outcome: &'static str,
}

/// Label of the TLS passthrough connections.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassthroughLabel {
    /// How it ended ([`crate::passthrough::Outcome`]): `forwarded`, `bad_hello`,
    /// `no_server_name`, `no_route` or `connect_failed`.
    pub outcome: &'static str,
}

/// Label of the copies of requests for mirrors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MirrorLabel {
    /// How it ended ([`crate::mirror::Outcome`]): `answered`, `failed`, `timed_out`,
    /// `dropped`, `no_endpoint` or `has_body`.
    pub outcome: &'static str,
}

/// The index of `status`'s class in [`CLASSES`].
fn class_of(status: u16) -> usize {
    match status {
        200..=299 => 0,
        300..=399 => 1,
        400..=499 => 2,
        _ => 3,
    }
}

/// Buckets of the latency histograms: 100 µs to about 13 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

holdfast_process::metrics! {
    /// Every proxy metric; cheap to clone.
    #[derive(Clone, Debug)]
    pub struct Metrics under "holdfast_proxy" {
        /// Requests by route and status class, and the time from a request's head to its
        /// response's head by matched route (a route's series made on its first response,
        /// dropped with the route).
        requests: Arc<RequestSeries> = Arc::default();
        /// The proxy's own error answers (4xx and 5xx it makes itself), by reason.
        errors: Family<ErrorLabels, Counter> = Family::default()
            => "error_responses", "Error answers the proxy made itself, by reason and status (an upstream's own errors are counted in requests only)";
        /// Time from sending upstream to the response head.
        upstream_latency: Histogram = latency_histogram()
            => "upstream_latency_seconds", "Time to the upstream's response head";
        /// The state file at start, by outcome (one load per start).
        state_file_loads: Family<LoadLabel, Counter> = Family::default()
            => "state_file_loads", "The state file read at start, by outcome: served, none (no file yet) or rejected (corrupt or invalid; not used)";
        /// Cluster revision of the applied snapshot.
        applied_revision: Gauge = Gauge::default()
            => "snapshot_cluster_revision", "Cluster revision of the applied snapshot";
        /// Unix time (seconds) of the last apply.
        last_apply: Gauge = Gauge::default()
            => "snapshot_applied_timestamp_seconds", "Unix time of the last apply";
        /// 1 while a control-plane stream is established.
        control_plane_connected: Gauge = Gauge::default()
            => "control_plane_connected", "1 while a control-plane stream is established";
        /// Snapshots applied.
        applied: Counter = Counter::default()
            => "snapshots_applied", "Snapshots applied";
        /// Time to apply a snapshot or delta that was applied: validate, compile, persist and
        /// swap, from the response's arrival.
        apply_duration: Histogram = Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            => "snapshot_apply_duration_seconds", "Time to apply a snapshot or delta (validate, compile, persist, swap); applied ones only";
        /// Snapshots rejected (NACKed).
        nacks: Counter = Counter::default()
            => "snapshot_nacks", "Snapshots rejected (NACKed)";
        /// Snapshots neither newer nor older than the one served (behind for one kind, ahead
        /// for another): the served one is kept (and the offer NACKed) until a snapshot
        /// behind for no kind arrives.
        snapshots_waited: Counter = Counter::default()
            => "snapshots_waited", "Snapshots behind the served one for one kind and ahead for another: kept the served one (a NACK) until a snapshot behind for no kind arrived";
        /// Delta logs folded into a new state file.
        state_compactions: Counter = Counter::default()
            => "state_compactions", "Delta logs folded into a new state file (the log is replayed over the state file at start)";
        /// Responses that carried a delta rather than a complete snapshot.
        deltas_received: Counter = Counter::default()
            => "deltas_received", "Responses that carried a delta rather than a complete snapshot";
        /// Bytes of the snapshots and deltas received (their encodings).
        received_bytes: Counter = Counter::default()
            => "received_bytes", "Bytes of the snapshots and deltas received from control planes (encoded)";
        /// Upstream connection failures (retried or answered 502).
        upstream_connect_errors: Counter = Counter::default()
            => "upstream_connect_errors", "Upstream connection failures";
        /// Upstream connections opened (the rest of the requests reused an idle one).
        upstream_connections_opened: Counter = Counter::default()
            => "upstream_connections_opened", "Upstream connections opened (other requests reused an idle connection)";
        /// Access log lines dropped because its writer was behind.
        access_log_dropped: Counter = Counter::default()
            => "access_log_dropped", "Access log lines dropped because the log's writer was behind (requests never wait for it)";
        /// Spans not delivered to the collector (its queue full, or an export failed).
        spans_dropped: Counter = Counter::default()
            => "spans_dropped", "Spans not delivered to the OpenTelemetry Collector (the export queue full, or an export failed)";
        /// Applied snapshots that could not be written to the state file.
        persist_failures: Counter = Counter::default()
            => "persist_failures", "Applied snapshots that could not be written to the state file (served anyway)";
        /// 1 when the served snapshot is in the state file (it survives a restart).
        snapshot_persisted: Gauge = Gauge::default()
            => "snapshot_persisted", "1 when the served snapshot is in the state file and survives a restart";
        /// Requests answered 503 because their endpoint's connection slots stayed busy.
        upstream_queue_timeouts: Counter = Counter::default()
            => "upstream_queue_timeouts", "Requests answered 503 because every connection slot of their endpoint stayed busy";
        /// Client connections closed at once because --max-connections were open.
        connections_refused: Counter = Counter::default()
            => "connections_refused", "Client connections closed at once because --max-connections were open";
        /// TLS passthrough connections (Gateway TLS listeners), by how they ended.
        passthrough: Family<PassthroughLabel, Counter> = Family::default()
            => "passthrough_connections", "TLS passthrough connections on Gateway TLS listeners, by how they ended";
        /// Copies of requests for mirrors (RequestMirror filters), by how they ended.
        mirrors: Family<MirrorLabel, Counter> = Family::default()
            => "mirror_requests", "Copies of requests for mirrors (RequestMirror filters), by how they ended";
        /// Failed accepts on the client listeners (EMFILE and the like).
        accept_errors: Counter = Counter::default()
            => "accept_errors", "Failed accepts on the client listeners (EMFILE, ENFILE and the like)";
        /// TLS handshakes that failed or timed out (unknown SNI, bad client, too slow).
        tls_handshake_failures: Counter = Counter::default()
            => "tls_handshake_failures", "TLS handshakes that failed or timed out";
        /// Gateway listeners of the served snapshot that are bound and served.
        gateway_listeners: Gauge = Gauge::default()
            => "gateway_listeners", "Gateway listeners (address and port) of the served snapshot that are bound and served";
        /// Gateway listeners of the served snapshot that could not be bound (yet).
        gateway_listeners_unbound: Gauge = Gauge::default()
            => "gateway_listeners_unbound", "Gateway listeners of the served snapshot that could not be bound (tried again every few seconds)";
        /// Failed attempts to bind a Gateway listener.
        gateway_bind_failures: Counter = Counter::default()
            => "gateway_bind_failures", "Failed attempts to bind a Gateway listener";
        /// Retries a rule's policy allowed that the retry budget did not.
        retries_over_budget: Counter = Counter::default()
            => "retries_over_budget", "Retries a Gateway rule's policy allowed that the retry budget (--retry-budget) did not";
        /// Reloads of the control-plane connection's TLS files, and changed files that did
        /// not load.
        tls_reloads: ReloadCounters = ReloadCounters::default();
        /// 1 for the HTTP/1.1 engine serving the proxy listeners.
        h1_engine: Family<EngineLabel, Gauge> = Family::default()
            => "h1_engine", "The HTTP/1.1 engine serving the proxy listeners (--h1-engine): 1 for the one in use";
    }
}

impl Metrics {
    /// Creates the metrics and registers them under `holdfast_proxy_`.
    pub fn new(registry: &mut Registry) -> Self {
        let (m, r) = Self::registered(registry);
        r.register_collector(Box::new(m.requests.clone()));
        m.tls_reloads
            .register(r, "tls", "the control-plane connection's");
        m
    }

    /// Counts a TLS passthrough connection that ended so.
    pub fn count_passthrough(&self, outcome: crate::passthrough::Outcome) {
        self.passthrough
            .get_or_create(&PassthroughLabel {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Counts a copy of a request for a mirror that ended so.
    pub fn count_mirror(&self, outcome: crate::mirror::Outcome) {
        self.mirrors
            .get_or_create(&MirrorLabel {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// The copies for mirrors that ended so (None: no such series yet).
    pub fn mirror_count(&self, outcome: crate::mirror::Outcome) -> Option<u64> {
        let label = MirrorLabel {
            outcome: outcome.as_str(),
        };
        self.mirrors.get(&label).map(|c| c.get())
    }

    /// Counts a response that matched no route (label `route` [`UNROUTED`]).
    pub fn count_unrouted(&self, status: u16) {
        let i = class_of(status);
        self.requests.unrouted[i]
            .get_or_init(Counter::default)
            .inc();
    }

    /// Counts a response of a matched route that took `took` to its head, through the
    /// route's own counters and histogram. `key` names the route's series, which only
    /// finding them on its first response needs.
    pub fn count_route(
        &self,
        key: impl FnOnce() -> SeriesKey,
        counters: &RouteCounters,
        status: u16,
        took: Duration,
    ) {
        let i = class_of(status);
        let Some(series) = self.series_of(key, counters) else {
            return;
        };
        series.classes[i].get_or_init(Counter::default).inc();
        series.latency.observe(took.as_secs_f64());
    }

    /// Counts a retry of a request on a route (its rule's retry policy).
    pub fn count_retry(&self, key: impl FnOnce() -> SeriesKey, counters: &RouteCounters) {
        if let Some(series) = self.series_of(key, counters) {
            series.retries.get_or_init(Counter::default).inc();
        }
    }

    /// A route's series, found (or made) at its first use; None for a route no longer
    /// served.
    fn series_of<'c>(
        &self,
        key: impl FnOnce() -> SeriesKey,
        counters: &'c RouteCounters,
    ) -> Option<&'c Arc<RouteSeries>> {
        let series = match counters.series.get() {
            Some(series) => series,
            None => {
                // A request that ends on a route gone since it started is not counted:
                // making its series would bring back a label no route has.
                if counters.retired.load(Ordering::SeqCst) {
                    return None;
                }
                let key = key();
                let series = counters
                    .series
                    .get_or_init(|| self.requests.series(key.clone()));
                // Retired while the series were being found: `forget_routes` may have run
                // before they existed, so drop them here (retire happens before forget, so
                // one of the two sees the other).
                if counters.retired.load(Ordering::SeqCst) {
                    self.forget_routes(std::slice::from_ref(&key));
                }
                series
            }
        };
        Some(series)
    }

    /// Drops the request series of routes no longer served (`keys`, from
    /// [`RouteTable::labels_gone`](crate::table::RouteTable::labels_gone)): the label set
    /// stays that of the routes served, however many come and go. A route that returns
    /// starts its series again from zero, which Prometheus reads as a counter reset.
    pub fn forget_routes(&self, keys: &[SeriesKey]) {
        let mut routes = self.requests.routes();
        for key in keys {
            routes.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        text
    }

    #[test]
    fn routes_of_one_label_count_into_one_series_whatever_table_they_are_in() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let key = || SeriesKey::HostPath("a.test".into(), "/x".into());
        // The route as one table compiled it, and as the next one compiled it again.
        let (first, second) = (RouteCounters::default(), RouteCounters::default());
        metrics.count_route(key, &first, 200, Duration::from_millis(1));
        metrics.count_route(key, &second, 204, Duration::from_millis(1));
        metrics.count_route(key, &second, 503, Duration::from_millis(1));
        let named = || SeriesKey::Named("gw a.test/y".into());
        metrics.count_route(named, &RouteCounters::default(), 302, Duration::ZERO);
        metrics.count_unrouted(404);
        metrics.count_unrouted(404);
        let text = exposition(&registry);
        for line in [
            r#"holdfast_proxy_requests_total{route="a.test/x",class="2xx"} 2"#,
            r#"holdfast_proxy_requests_total{route="a.test/x",class="5xx"} 1"#,
            r#"holdfast_proxy_requests_total{route="gw a.test/y",class="3xx"} 1"#,
            r#"holdfast_proxy_requests_total{route="(none)",class="4xx"} 2"#,
            r#"holdfast_proxy_request_duration_seconds_count{route="a.test/x"} 3"#,
            r#"holdfast_proxy_request_duration_seconds_bucket{le="0.0016",route="a.test/x"} 3"#,
            r#"holdfast_proxy_request_duration_seconds_count{route="gw a.test/y"} 1"#,
        ] {
            assert!(text.contains(line), "no {line} in {text}");
        }
        // Only the classes seen have series.
        assert!(!text.contains(r#"route="a.test/x",class="4xx""#), "{text}");
        assert!(!text.contains(r#"route="(none)",class="2xx""#), "{text}");
        assert_eq!(metrics.requests.len(), 2);
    }

    #[test]
    fn a_series_holds_its_routes_names_until_the_route_goes() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let (host, path): (Arc<str>, Arc<str>) = ("a.test".into(), "/".into());
        let key = || SeriesKey::HostPath(host.clone(), path.clone());
        let counters = RouteCounters::default();
        metrics.count_route(key, &counters, 200, Duration::ZERO);
        // The caller's copy and the series set's: no label is kept beside them.
        assert_eq!(Arc::strong_count(&host), 2);
        assert_eq!(Arc::strong_count(&path), 2);
        assert!(exposition(&registry).contains(r#"{route="a.test/",class="2xx"} 1"#));

        counters.retire();
        metrics.forget_routes(&[key()]);
        assert_eq!(Arc::strong_count(&host), 1);
        assert!(metrics.requests.is_empty());
        let text = exposition(&registry);
        assert!(!text.contains("a.test/"), "{text}");
        // Requests in flight on the gone route make no series again: one that had its
        // series, and one (another table's copy) that had none yet.
        metrics.count_route(key, &counters, 200, Duration::ZERO);
        let copy = RouteCounters::default();
        copy.retire();
        metrics.count_route(key, &copy, 200, Duration::ZERO);
        assert!(metrics.requests.is_empty());
        assert!(!exposition(&registry).contains("a.test/"));
    }
}
