//! The native HTTP/1.1 engine ([`holdfast_http::h1::engine`]) serving this proxy's
//! routes: the forwarder is its [`Service`], so the engine's connection loop reads
//! routing, balancing, the answers' reasons and the metrics from here.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use holdfast_http::forward::{Failure, Target};
use holdfast_http::h1::engine::{Served, Service, Settings};
use holdfast_http::routing::{Decision, RequestView};
use holdfast_http::tunnel::Tunnels;
use holdfast_http::upstream::ConnectError;
use http::StatusCode;

pub use holdfast_http::h1::engine::{H1Conn, Timeouts};

use super::{FailureReason, Forwarder, Reason, Via};
use crate::table::{Route, RouteTable};

impl Service for Forwarder {
    type Via = Via;
    type Route = Route;
    type Table = Option<Arc<RouteTable>>;
    type Reason = Reason;

    const BAD_REQUEST: Reason = Reason::BadRequest;

    fn settings(&self) -> &Settings {
        &self.engine
    }

    fn table(&self) -> Self::Table {
        self.table.load_full()
    }

    fn decide<'t, 'r>(
        &self,
        request: &RequestView<'r>,
        via: &Via,
        table: &'t Self::Table,
    ) -> Decision<'t, 'r, Route, Reason> {
        match self.route(request, via, table.as_deref()) {
            Decision::Forward(routed) if routed.route.backend.h2c => Decision::Refuse {
                reason: Reason::UpstreamProtocol,
                detail: format!(
                    "backend {} speaks h2c: the native HTTP/1.1 engine does not send to it",
                    routed.route.backend.name
                ),
                route: Some(routed.route),
            },
            decided => decided,
        }
    }

    fn is_tls(&self, via: &Via) -> bool {
        via.is_tls()
    }

    fn trusted(&self, peer: IpAddr) -> bool {
        self.trusts(peer)
    }

    fn status(&self, reason: Reason) -> StatusCode {
        reason.status()
    }

    fn failed(&self, failure: &Failure) -> (Reason, String) {
        (failure.reason(), holdfast_process::error_chain(failure))
    }

    fn error_page(&self, reason: Reason, detail: String) -> (StatusCode, String) {
        Forwarder::error_page(self, reason, detail)
    }

    fn count(&self, route: Option<&Route>, status: u16, took: Duration) {
        match route {
            Some(r) => self
                .metrics
                .count_route(|| r.series_key(), &r.counters, status, took),
            None => self.metrics.count_unrouted(status),
        }
    }

    fn first_index(&self, route: &Route) -> usize {
        route.backend.next_index()
    }

    async fn target<'b>(
        &self,
        route: &'b Route,
        attempt: usize,
        start: usize,
        tried: &mut Option<SocketAddr>,
    ) -> Target<'b> {
        Forwarder::target(self, &route.backend, attempt, start, tried).await
    }

    fn connect_failed(&self, route: &Route, endpoint: Option<SocketAddr>, error: &ConnectError) {
        self.metrics.upstream_connect_errors.inc();
        if let Some(a) = endpoint {
            self.balancer.connect_failed(a, &route.backend.name, error);
        }
    }

    fn connection_opened(&self) {
        self.metrics.upstream_connections_opened.inc();
    }

    fn upstream_answered(&self, took: Duration) {
        self.metrics.upstream_latency.observe(took.as_secs_f64());
    }

    fn retry(&self, route: &Route) -> bool {
        Forwarder::retry(self, route)
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    fn tunnels(&self) -> &Tunnels {
        &self.tunnels
    }

    fn logs(&self) -> bool {
        self.observes()
    }

    fn log(&self, route: Option<&Route>, via: &Via, served: &Served<'_, Reason>) {
        Forwarder::log(
            self,
            &super::Logged {
                time: served.time,
                peer: served.peer,
                via,
                method: served.method,
                host: served.host,
                path: served.path,
                query: served.query,
                protocol: if served.http10 {
                    "HTTP/1.0"
                } else {
                    "HTTP/1.1"
                },
                status: served.status,
                received: served.received,
                sent: served.sent,
                took: served.took,
                upstream_took: served.upstream_took,
                upstream: served.upstream,
                route,
                reason: served.reason,
                request_id: served.request_id,
                trace: served.trace.copied(),
                attempts: served.attempts,
                referer: served.referer,
                user_agent: served.user_agent,
                forwarded_for: served.forwarded_for,
                traceparent: served.traceparent,
            },
        );
    }
}
