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

/// Every control-plane metric. Cheap to clone (metrics are shared handles).
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Cluster revision of the published snapshot.
    pub snapshot_revision: Gauge,
    /// Routes in the published snapshot.
    pub snapshot_routes: Gauge,
    /// Time to read the caches, translate, seal and validate.
    pub build_duration: Histogram,
    /// From the leader first seeing an Ingress's new generation to every proxy connected
    /// to it serving that generation.
    pub programmed: Histogram,
    /// Our Ingresses the leader tracks for `Programmed` (0 elsewhere, and until its first
    /// look after becoming leader).
    pub programmed_tracked: Gauge,
    /// Snapshots published.
    pub published: Counter,
    /// Spans not delivered to the OpenTelemetry Collector.
    pub spans_dropped: Counter,
    /// Builds whose content equalled the published snapshot (nothing sent).
    pub unchanged: Counter,
    /// 1 while a snapshot is held back.
    pub held: Gauge,
    /// Snapshots held back.
    pub holds: Counter,
    /// Connected proxy streams.
    pub proxies_connected: Gauge,
    /// ACKs received.
    pub acks: Counter,
    /// NACKs received.
    pub nacks: Counter,
    /// Responses sent as a delta rather than a complete snapshot.
    pub deltas_sent: Counter,
    /// Deltas a proxy could not apply, answered with the complete snapshot.
    pub delta_resyncs: Counter,
    /// Bytes of the route responses sent to proxies (gRPC framing included).
    pub sent_bytes: Counter,
    /// 1 when a kind's cache holds a complete list and is not re-listing.
    pub cache_synced: Family<KindLabel, Gauge>,
    /// Errors from the watch of a kind.
    pub watch_errors: Family<KindLabel, Counter>,
    /// Lists and watches of a kind the API server refused with 403 (a missing permission).
    pub watch_forbidden: Family<KindLabel, Counter>,
    /// Complete lists of a kind: the first, then one per re-list.
    pub cache_lists: Family<KindLabel, Counter>,
    /// 1 when API discovery says a kind does not exist (its CRD is not installed).
    pub cache_absent: Family<KindLabel, Gauge>,
    /// Held removals released, by what released them.
    pub hold_releases: Family<ReleaseLabel, Counter>,
    /// Ingress rules skipped (invalid or losing a conflict) in the last build.
    pub skipped_rules: Gauge,
    /// 1 while this replica holds the leader Lease (writes Ingress status).
    pub leader: Gauge,
    /// Times this replica acquired the leader Lease.
    pub leader_acquisitions: Counter,
    /// Status writes by the leader, by kind and result.
    pub status_writes: Family<StatusWriteLabel, Counter>,
    /// Host claims the leader could not record because the ledger is full.
    pub host_claims_waiting: Gauge,
    /// notAfter of each certificate in the published snapshot.
    pub certificate_expiry: Family<CertificateLabel, Gauge>,
    /// Problems of the last build, by reason.
    pub problems: Family<ReasonLabel, Gauge>,
    /// TLS handshakes on the gRPC listener that failed (no or wrong client certificate,
    /// too slow).
    pub tls_handshake_failures: Counter,
    /// Proxy streams refused (a node id the client certificate does not prove).
    pub streams_refused: Counter,
    /// Reloads of the gRPC listener's TLS files, and changed files that did not load.
    pub tls_reloads: ReloadCounters,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `holdfast_`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Metrics {
            snapshot_revision: Gauge::default(),
            snapshot_routes: Gauge::default(),
            build_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            programmed: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            programmed_tracked: Gauge::default(),
            published: Counter::default(),
            spans_dropped: Counter::default(),
            unchanged: Counter::default(),
            held: Gauge::default(),
            holds: Counter::default(),
            proxies_connected: Gauge::default(),
            acks: Counter::default(),
            nacks: Counter::default(),
            deltas_sent: Counter::default(),
            delta_resyncs: Counter::default(),
            sent_bytes: Counter::default(),
            cache_synced: Family::default(),
            watch_errors: Family::default(),
            watch_forbidden: Family::default(),
            cache_lists: Family::default(),
            cache_absent: Family::default(),
            hold_releases: Family::default(),
            skipped_rules: Gauge::default(),
            leader: Gauge::default(),
            leader_acquisitions: Counter::default(),
            status_writes: Family::default(),
            host_claims_waiting: Gauge::default(),
            certificate_expiry: Family::default(),
            problems: Family::default(),
            tls_handshake_failures: Counter::default(),
            streams_refused: Counter::default(),
            tls_reloads: ReloadCounters::default(),
        };
        let r = registry.sub_registry_with_prefix("holdfast");
        r.register(
            "snapshot_cluster_revision",
            "Cluster revision of the published snapshot",
            m.snapshot_revision.clone(),
        );
        r.register(
            "snapshot_routes",
            "Routes in the published snapshot",
            m.snapshot_routes.clone(),
        );
        r.register(
            "object_programmed_seconds",
            "From the leader first seeing an Ingress's new generation to every proxy connected to it serving that generation",
            m.programmed.clone(),
        );
        r.register(
            "object_programmed_tracked",
            "Our Ingresses whose generations the leader tracks for the Programmed Event (0 on other replicas)",
            m.programmed_tracked.clone(),
        );
        r.register(
            "snapshot_build_duration_seconds",
            "Time to build, seal and validate a snapshot",
            m.build_duration.clone(),
        );
        r.register(
            "spans_dropped",
            "Spans not delivered to the OpenTelemetry Collector (the export queue full, or an export failed)",
            m.spans_dropped.clone(),
        );
        r.register(
            "snapshots_published",
            "Snapshots published to proxies",
            m.published.clone(),
        );
        r.register(
            "snapshot_builds_unchanged",
            "Builds whose content equalled the published snapshot",
            m.unchanged.clone(),
        );
        r.register(
            "snapshot_held",
            "1 while a snapshot is held back for confirmation",
            m.held.clone(),
        );
        r.register(
            "snapshot_holds",
            "Snapshots held back (bounded destruction)",
            m.holds.clone(),
        );
        r.register(
            "proxies_connected",
            "Connected proxy streams",
            m.proxies_connected.clone(),
        );
        r.register("proxy_acks", "ACKs received from proxies", m.acks.clone());
        r.register(
            "proxy_nacks",
            "NACKs received from proxies",
            m.nacks.clone(),
        );
        r.register(
            "deltas_sent",
            "Route responses sent as a delta rather than a complete snapshot",
            m.deltas_sent.clone(),
        );
        r.register(
            "delta_resyncs",
            "Deltas a proxy could not apply, answered with the complete snapshot",
            m.delta_resyncs.clone(),
        );
        r.register(
            "sent_bytes",
            "Bytes of the route responses sent to proxies, gRPC framing included",
            m.sent_bytes.clone(),
        );
        r.register(
            "cache_synced",
            "1 when the cache of a kind is complete",
            m.cache_synced.clone(),
        );
        r.register(
            "watch_errors",
            "Errors from the watch of a kind",
            m.watch_errors.clone(),
        );
        r.register(
            "ingress_rules_skipped",
            "Ingress rules skipped in the last build",
            m.skipped_rules.clone(),
        );
        r.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of each certificate in the published snapshot (Unix seconds)",
            m.certificate_expiry.clone(),
        );
        r.register(
            "problems",
            "Problems (skipped rules, unusable TLS Secrets, expiring certificates) of the last build, by reason",
            m.problems.clone(),
        );
        r.register(
            "grpc_tls_handshake_failures",
            "TLS handshakes on the gRPC listener that failed or timed out",
            m.tls_handshake_failures.clone(),
        );
        r.register(
            "proxy_streams_refused",
            "Proxy streams refused: the node id is not an identity of the client certificate",
            m.streams_refused.clone(),
        );
        m.tls_reloads.register(r, "grpc_tls", "the gRPC listener's");
        r.register(
            "watch_forbidden",
            "Lists and watches of a kind refused with 403: the ServiceAccount lacks a permission",
            m.watch_forbidden.clone(),
        );
        r.register(
            "cache_absent",
            "1 when API discovery says a kind does not exist (a Gateway API CRD that is not installed): its cache is complete and empty",
            m.cache_absent.clone(),
        );
        r.register(
            "cache_lists",
            "Complete lists of a kind (the first, then one per re-list after an expired or lost watch)",
            m.cache_lists.clone(),
        );
        r.register(
            "snapshot_hold_releases",
            "Held removals released, by what released them (confirmation or approval)",
            m.hold_releases.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        r.register(
            "leader_acquisitions",
            "Times this replica acquired the leader Lease (became the one recording host claims and writing Ingress status)",
            m.leader_acquisitions.clone(),
        );
        r.register(
            "status_writes",
            "Writes by the leader: the status of Ingress, GatewayClass, Gateway and HTTPRoute objects, and the Gateways' Services (kind Service); result ok or failed",
            m.status_writes.clone(),
        );
        r.register(
            "host_claims_waiting",
            "Host claims the leader could not record because the ledger ConfigMap is full",
            m.host_claims_waiting.clone(),
        );
        m
    }
}
