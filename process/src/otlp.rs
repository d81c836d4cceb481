//! Spans exported over OTLP/gRPC (`--otlp-endpoint`) to an OpenTelemetry Collector, as
//! linkerd's and Envoy's proxies do: a span is handed to [`Exporter::export`], which never
//! waits; a bounded queue holds it for a task that sends batches to the collector's
//! `TraceService/Export`. When the collector is slow or gone and the queue is full, a
//! span is dropped and counted (as is a batch the collector refused or did not take in
//! time); serving never waits for tracing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status, span, status};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

/// Most spans sent in one export.
const BATCH: usize = 512;

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
}

/// What a span is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request served (the proxy's span of a request).
    Server,
    /// Work of the process's own (the control plane's build and publish).
    Internal,
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    /// Its trace.
    pub trace_id: [u8; 16],
    /// Its own id.
    pub span_id: [u8; 8],
    /// Its parent's id, if it has one.
    pub parent: Option<[u8; 8]>,
    /// Its name (`GET /api` or `build`).
    pub name: String,
    /// Server or internal.
    pub kind: Kind,
    /// When it started.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Its attributes (OpenTelemetry semantic conventions where one applies).
    pub attributes: Vec<(&'static str, Value)>,
    /// It failed (a 5xx answered, a failed publish).
    pub error: bool,
}

/// A new random span id (never all zero).
pub fn span_id() -> [u8; 8] {
    use std::hash::{BuildHasher, RandomState};
    (RandomState::new().hash_one(SystemTime::now()) | 1).to_be_bytes()
}

/// A new random trace id (never all zero).
pub fn trace_id() -> [u8; 16] {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&span_id());
    id[8..].copy_from_slice(&span_id());
    id
}

/// The sender of spans to one collector.
#[derive(Debug, Clone)]
pub struct Exporter {
    queue: mpsc::Sender<Queued>,
    dropped: Counter,
}

/// What the export task takes: spans, and requests to say when what came before them
/// has been sent.
#[derive(Debug)]
enum Queued {
    Span(Box<Span>),
    Flushed(tokio::sync::oneshot::Sender<()>),
}

impl Exporter {
    /// Starts exporting to `endpoint` (`http://host:4317`) as `service` (the resource's
    /// `service.name`), with room for `capacity` spans waiting; spans that could not be
    /// delivered are counted in `dropped`. Must be called within a Tokio runtime.
    pub fn start(
        endpoint: &str,
        service: &'static str,
        capacity: usize,
        dropped: Counter,
    ) -> Result<Exporter, tonic::transport::Error> {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())?
            .connect_timeout(Duration::from_secs(5))
            .timeout(EXPORT_TIMEOUT)
            .connect_lazy();
        let (queue, spans) = mpsc::channel(capacity.max(1));
        tokio::spawn(send_batches(
            TraceServiceClient::new(channel),
            spans,
            resource(service),
            dropped.clone(),
        ));
        Ok(Exporter { queue, dropped })
    }

    /// Queues `span` for the collector; never waits (a full queue drops it, counted).
    pub fn export(&self, span: Span) {
        if self.queue.try_send(Queued::Span(Box::new(span))).is_err() {
            self.dropped.inc();
        }
    }

    /// Waits, at most `within`, until the spans queued so far have been sent (or given up
    /// on): at shutdown, so that the last requests' spans are not lost with the process.
    /// True when they were.
    pub async fn flush(&self, within: Duration) -> bool {
        let (told, sent) = tokio::sync::oneshot::channel();
        let asked =
            async { self.queue.send(Queued::Flushed(told)).await.is_ok() && sent.await.is_ok() };
        tokio::time::timeout(within, asked).await.unwrap_or(false)
    }
}

fn resource(service: &'static str) -> Resource {
    Resource {
        attributes: vec![attribute("service.name", Value::Str(service.into()))],
        ..Default::default()
    }
}

/// The export task: everything queued (up to [`BATCH`]) in one request, until every
/// [`Exporter`] is gone.
async fn send_batches(
    mut client: TraceServiceClient<tonic::transport::Channel>,
    mut queue: mpsc::Receiver<Queued>,
    resource: Resource,
    dropped: Counter,
) {
    let mut taken = Vec::with_capacity(BATCH);
    let mut batch = Vec::with_capacity(BATCH);
    let mut flushed = Vec::new();
    while queue.recv_many(&mut taken, BATCH).await > 0 {
        for item in taken.drain(..) {
            match item {
                Queued::Span(span) => batch.push(*span),
                Queued::Flushed(told) => flushed.push(told),
            }
        }
        if batch.is_empty() {
            for told in flushed.drain(..) {
                let _ = told.send(());
            }
            continue;
        }
        let n = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "holdfast".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans: batch.drain(..).map(to_otlp).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        if let Err(error) = client.export(request).await {
            tracing::debug!(%error, spans = n, "the collector did not take a batch of spans");
            dropped.inc_by(n);
        }
        for told in flushed.drain(..) {
            let _ = told.send(());
        }
    }
}

fn attribute(key: &str, value: Value) -> KeyValue {
    let value = match value {
        Value::Str(s) => any_value::Value::StringValue(s),
        Value::Int(i) => any_value::Value::IntValue(i),
    };
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A span in OTLP's terms.
pub fn to_otlp(s: Span) -> opentelemetry_proto::tonic::trace::v1::Span {
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: s.name,
        kind: match s.kind {
            Kind::Server => span::SpanKind::Server,
            Kind::Internal => span::SpanKind::Internal,
        } as i32,
        start_time_unix_nano: nanos(s.start),
        end_time_unix_nano: nanos(s.end),
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| attribute(k, v))
            .collect(),
        status: Some(Status {
            code: if s.error {
                status::StatusCode::Error
            } else {
                status::StatusCode::Unset
            } as i32,
            message: String::new(),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_becomes_otlp_with_its_ids_times_kind_and_attributes() {
        let start = UNIX_EPOCH + Duration::from_millis(1_700_000_000_000);
        let span = Span {
            trace_id: [7; 16],
            span_id: [8; 8],
            parent: Some([9; 8]),
            name: "GET /api".into(),
            kind: Kind::Server,
            start,
            end: start + Duration::from_millis(3),
            attributes: vec![
                ("http.response.status_code", Value::Int(502)),
                ("http.route", Value::Str("ns/web a.test/api".into())),
            ],
            error: true,
        };
        let otlp = to_otlp(span);
        assert_eq!(otlp.trace_id, vec![7; 16]);
        assert_eq!(otlp.parent_span_id, vec![9; 8]);
        assert_eq!(otlp.kind, span::SpanKind::Server as i32);
        assert_eq!(
            otlp.end_time_unix_nano - otlp.start_time_unix_nano,
            3_000_000
        );
        assert_eq!(otlp.attributes.len(), 2);
        assert_eq!(otlp.attributes[0].key, "http.response.status_code");
        assert_eq!(
            otlp.status.map(|s| s.code),
            Some(status::StatusCode::Error as i32)
        );
        assert_ne!(span_id(), span_id());
        assert_ne!(trace_id(), [0; 16]);
    }

    #[tokio::test]
    async fn spans_past_the_queue_are_dropped_and_counted_never_waited_for() {
        let dropped = Counter::default();
        // Nothing listens there: the one batch in flight waits, the queue fills.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let exporter = Exporter::start(&endpoint, "test", 4, dropped.clone()).unwrap();
        let one = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: None,
            name: "x".into(),
            kind: Kind::Internal,
            start: SystemTime::now(),
            end: SystemTime::now(),
            attributes: vec![],
            error: false,
        };
        // On this one thread the export task has not run yet: four wait, the rest drop
        // at once.
        for _ in 0..100 {
            exporter.export(one.clone());
        }
        assert_eq!(dropped.get(), 96);
        // The four go in one batch the collector never takes: counted too, by the time a
        // flush (what the planes do at exit) returns.
        assert!(exporter.flush(Duration::from_secs(30)).await);
        assert_eq!(dropped.get(), 100);
    }
}
