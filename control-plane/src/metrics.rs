//! Prometheus metrics of the control plane (served on the admin listener's `/metrics`).

use holdfast_process::tls::ReloadCounters;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label for per-kind metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// One of `state::KINDS`: "IngressClass", "Ingress", "Service", "EndpointSlice",
    /// "Secret" or "ConfigMap".
    pub kind: String,
}

/// Label of per-certificate metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabel {
    /// `namespace/secret`.
    pub certificate: String,
}

/// Label of per-reason metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// A problem's reason (the Event reason), for example "InvalidTLSSecret".
    pub reason: String,
}

/// Label of the hold releases: `confirmation` (stable, and a fresh read agreed) or
/// `approval` (an operator).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReleaseLabel {
    /// What released the hold.
    pub by: &'static str,
}

/// Label of the status writes: the kind written and whether the API server took it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusWriteLabel {
    /// "Ingress", "GatewayClass", "Gateway", "HTTPRoute" or "Service" (a Gateway's).
    pub kind: &'static str,
    /// "ok", or "failed" (refused, a conflict, or no answer).
    pub result: &'static str,
}

holdfast_process::metrics! {
    /// Every control-plane metric. Cheap to clone (metrics are shared handles).
    #[derive(Clone, Debug)]
    pub struct Metrics under "holdfast" {
        /// Cluster revision of the published snapshot.
        snapshot_revision: Gauge = Gauge::default()
            => "snapshot_cluster_revision", "Cluster revision of the published snapshot";
        /// Routes in the published snapshot.
        snapshot_routes: Gauge = Gauge::default()
            => "snapshot_routes", "Routes in the published snapshot";
        /// Time to read the caches, translate, seal and validate.
        build_duration: Histogram = Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            => "snapshot_build_duration_seconds", "Time to build, seal and validate a snapshot";
        /// From the leader first seeing an Ingress's new generation to every proxy connected
        /// to it serving that generation.
        programmed: Histogram = Histogram::new(exponential_buckets(0.05, 2.0, 14))
            => "object_programmed_seconds", "From the leader first seeing an Ingress's new generation to every proxy connected to it serving that generation";
        /// Our Ingresses the leader tracks for `Programmed` (0 elsewhere, and until its first
        /// look after becoming leader).
        programmed_tracked: Gauge = Gauge::default()
            => "object_programmed_tracked", "Our Ingresses whose generations the leader tracks for the Programmed Event (0 on other replicas)";
        /// Snapshots published.
        published: Counter = Counter::default()
            => "snapshots_published", "Snapshots published to proxies";
        /// Spans not delivered to the OpenTelemetry Collector.
        spans_dropped: Counter = Counter::default()
            => "spans_dropped", "Spans not delivered to the OpenTelemetry Collector (the export queue full, or an export failed)";
        /// Builds whose content equalled the published snapshot (nothing sent).
        unchanged: Counter = Counter::default()
            => "snapshot_builds_unchanged", "Builds whose content equalled the published snapshot";
        /// 1 while a snapshot is held back.
        held: Gauge = Gauge::default()
            => "snapshot_held", "1 while a snapshot is held back for confirmation";
        /// Snapshots held back.
        holds: Counter = Counter::default()
            => "snapshot_holds", "Snapshots held back (bounded destruction)";
        /// Connected proxy streams.
        proxies_connected: Gauge = Gauge::default()
            => "proxies_connected", "Connected proxy streams";
        /// ACKs received.
        acks: Counter = Counter::default()
            => "proxy_acks", "ACKs received from proxies";
        /// NACKs received.
        nacks: Counter = Counter::default()
            => "proxy_nacks", "NACKs received from proxies";
        /// Responses sent as a delta rather than a complete snapshot.
        deltas_sent: Counter = Counter::default()
            => "deltas_sent", "Route responses sent as a delta rather than a complete snapshot";
        /// Deltas a proxy could not apply, answered with the complete snapshot.
        delta_resyncs: Counter = Counter::default()
            => "delta_resyncs", "Deltas a proxy could not apply, answered with the complete snapshot";
        /// Bytes of the route responses sent to proxies (gRPC framing included).
        sent_bytes: Counter = Counter::default()
            => "sent_bytes", "Bytes of the route responses sent to proxies, gRPC framing included";
        /// 1 when a kind's cache holds a complete list and is not re-listing.
        cache_synced: Family<KindLabel, Gauge> = Family::default()
            => "cache_synced", "1 when the cache of a kind is complete";
        /// Errors from the watch of a kind.
        watch_errors: Family<KindLabel, Counter> = Family::default()
            => "watch_errors", "Errors from the watch of a kind";
        /// Lists and watches of a kind the API server refused with 403 (a missing permission).
        watch_forbidden: Family<KindLabel, Counter> = Family::default()
            => "watch_forbidden", "Lists and watches of a kind refused with 403: the ServiceAccount lacks a permission";
        /// Complete lists of a kind: the first, then one per re-list.
        cache_lists: Family<KindLabel, Counter> = Family::default()
            => "cache_lists", "Complete lists of a kind (the first, then one per re-list after an expired or lost watch)";
        /// 1 when API discovery says a kind does not exist (its CRD is not installed).
        cache_absent: Family<KindLabel, Gauge> = Family::default()
            => "cache_absent", "1 when API discovery says a kind does not exist (a Gateway API CRD that is not installed): its cache is complete and empty";
        /// Held removals released, by what released them.
        hold_releases: Family<ReleaseLabel, Counter> = Family::default()
            => "snapshot_hold_releases", "Held removals released, by what released them (confirmation or approval)";
        /// Ingress rules skipped (invalid or losing a conflict) in the last build.
        skipped_rules: Gauge = Gauge::default()
            => "ingress_rules_skipped", "Ingress rules skipped in the last build";
        /// 1 while this replica holds the leader Lease (writes Ingress status).
        leader: Gauge = Gauge::default()
            => "leader", "1 while this replica holds the leader Lease";
        /// Times this replica acquired the leader Lease.
        leader_acquisitions: Counter = Counter::default()
            => "leader_acquisitions", "Times this replica acquired the leader Lease (became the one recording host claims and writing Ingress status)";
        /// Status writes by the leader, by kind and result.
        status_writes: Family<StatusWriteLabel, Counter> = Family::default()
            => "status_writes", "Writes by the leader: the status of Ingress, GatewayClass, Gateway and HTTPRoute objects, and the Gateways' Services (kind Service); result ok or failed";
        /// Host claims the leader could not record because the ledger is full.
        host_claims_waiting: Gauge = Gauge::default()
            => "host_claims_waiting", "Host claims the leader could not record because the ledger ConfigMap is full";
        /// notAfter of each certificate in the published snapshot.
        certificate_expiry: Family<CertificateLabel, Gauge> = Family::default()
            => "certificate_expiry_timestamp_seconds", "notAfter of each certificate in the published snapshot (Unix seconds)";
        /// Problems of the last build, by reason.
        problems: Family<ReasonLabel, Gauge> = Family::default()
            => "problems", "Problems (skipped rules, unusable TLS Secrets, expiring certificates) of the last build, by reason";
        /// TLS handshakes on the gRPC listener that failed (no or wrong client certificate,
        /// too slow).
        tls_handshake_failures: Counter = Counter::default()
            => "grpc_tls_handshake_failures", "TLS handshakes on the gRPC listener that failed or timed out";
        /// Proxy streams refused (a node id the client certificate does not prove).
        streams_refused: Counter = Counter::default()
            => "proxy_streams_refused", "Proxy streams refused: the node id is not an identity of the client certificate";
        /// Reloads of the gRPC listener's TLS files, and changed files that did not load.
        tls_reloads: ReloadCounters = ReloadCounters::default();
    }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `holdfast_`.
    pub fn new(registry: &mut Registry) -> Self {
        let (m, r) = Self::registered(registry);
        m.tls_reloads.register(r, "grpc_tls", "the gRPC listener's");
        m
    }
}
