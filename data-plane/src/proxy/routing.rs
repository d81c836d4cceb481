//! Routing: from a request's host, target and headers alone (no I/O, no response built)
//! to a [`Decision`]: forward on a route, refuse with a [`Reason`], or redirect. Both
//! HTTP/1.1 engines and HTTP/2 read requests into a [`RequestView`] and act on the
//! decision their own way.

use http::uri::PathAndQuery;

use holdfast_http::headers::{BadRequest, HeaderLookup, Hop, valid_authority};
use holdfast_http::path::{PathError, has_dot_segment_params, normalise};

use super::{Forwarder, LOOP_HEADER, Reason, Via};
use crate::gateway::{Action, HeaderChanges, Matched, Mirror, PathRule, Target, Timeouts};
use crate::matching::Asked;
use crate::table::{Found, Miss, Route, RouteTable, normalise_host};

pub use holdfast_http::routing::RequestView;
use holdfast_http::routing::ResponseChanges;

/// What to do with a request ([`holdfast_http::routing::Decision`] on this proxy's routes
/// and reasons).
pub type Decision<'t, 'r> = holdfast_http::routing::Decision<'t, 'r, Route, Reason>;

/// Where a routed request goes.
pub type Routed<'t, 'r> = holdfast_http::routing::Routed<'t, 'r, Route>;

/// ACME HTTP-01 challenges are answered over plain HTTP (a certificate is being issued),
/// so they are never redirected.
const ACME_CHALLENGE: &str = "/.well-known/acme-challenge/";

fn refuse<'t, 'r>(reason: Reason, detail: impl Into<String>) -> Decision<'t, 'r> {
    Decision::Refuse {
        reason,
        detail: detail.into(),
        route: None,
    }
}

/// A host served with another certificate than the connection's (RFC 9110 §15.5.20).
fn misdirected<'t, 'r>(host: &str) -> Decision<'t, 'r> {
    refuse(
        Reason::Misdirected,
        format!("misdirected: {host} is not served with the certificate this connection uses"),
    )
}

impl Forwarder {
    /// Decides from a request alone where it goes (`via`: how its connection was made).
    /// The framing checks come before this, in each engine.
    pub fn route<'t, 'r>(
        &self,
        request: &RequestView<'r>,
        via: &Via,
        table: Option<&'t RouteTable>,
    ) -> Decision<'t, 'r> {
        if self.has_passed_here(request.headers) {
            return refuse(
                Reason::LoopDetected,
                "loop: the request has passed this proxy already",
            );
        }
        // An absolute-form target (HTTP/1.1) or :authority (HTTP/2) wins over Host, and
        // replaces it upstream: the host routed on is the host the backend sees. The
        // authority is checked whole: user info or a port that is not one is refused,
        // never dropped.
        let Some(raw_host) = request.host.filter(|h| !h.is_empty()) else {
            return refuse(
                Reason::BadRequest,
                format!("bad request: {}", BadRequest::NoHost),
            );
        };
        if !valid_authority(raw_host) {
            return refuse(
                Reason::BadRequest,
                format!("bad request: {}", BadRequest::BadHost),
            );
        }
        let host = normalise_host(raw_host);
        let Some(table) = table else {
            return refuse(
                Reason::NoSnapshot,
                "no route table yet: waiting for a snapshot",
            );
        };
        if let Via::Gateway { listener, tls, .. } = via {
            return self.route_gateway(request, &host, raw_host, listener, tls, table);
        }
        if let Via::Https { sni, .. } = via {
            // The connection's certificate is the one its SNI chose; a Host served with
            // another one (a client reusing a connection for another host) is misdirected
            // (RFC 9110 §15.5.20): the client retries on a connection of its own.
            let made_with = table.certificate_for(sni.as_deref()).map(|c| &c.name);
            let wanted = table.certificate_for(Some(&host)).map(|c| &c.name);
            if made_with != wanted {
                return misdirected(&host);
            }
        }
        // Route on, and forward, the path the backend will see (see `holdfast_http::path`).
        let (normalised, forward_path) = match self.request_path(request) {
            Ok(p) => p,
            Err(refused) => return *refused,
        };
        let path = normalised
            .as_deref()
            .unwrap_or_else(|| request.path_or_root());
        if !via.is_tls() && table.redirects_to_https(&host) && !path.starts_with(ACME_CHALLENGE) {
            let target = sent_or_normalised(request, forward_path.as_ref());
            return Decision::Redirect {
                status: 308,
                location: format!("https://{host}{target}"),
            };
        }
        let asked = Asked {
            method: request.method,
            query: request.query,
            headers: request.headers,
        };
        let route = match table.lookup_entry(&host, path, Some(&asked)) {
            Ok(Found::Route(r)) => r,
            Ok(Found::Matched(matched_path, matched)) => {
                // The port the client asked for (a redirect keeps it), else the scheme's.
                let port = raw_host
                    .parse::<http::uri::Authority>()
                    .ok()
                    .and_then(|a| a.port_u16())
                    .unwrap_or(if via.is_tls() { 443 } else { 80 });
                let place = Place {
                    host: &host,
                    raw_host,
                    tls: via.is_tls(),
                    port,
                };
                return self.act(matched_path, matched, request, place, path, forward_path);
            }
            Err(miss) => {
                let why = match miss {
                    Miss::NoHost => format!("no route: no virtual host for {host}"),
                    Miss::NoPath { vhost } => {
                        format!("no route: no path of {vhost:?} matches {path}")
                    }
                };
                return refuse(Reason::NoRoute, why);
            }
        };
        forward_to(route, raw_host, forward_path, None)
    }

    /// The request path normalised as the backend will see it (None: unchanged), and the
    /// path and query to forward when normalising changed it; Err is the refusal.
    #[allow(clippy::type_complexity)]
    fn request_path<'t, 'r>(
        &self,
        request: &RequestView<'r>,
    ) -> Result<(Option<String>, Option<PathAndQuery>), Box<Decision<'t, 'r>>> {
        let bad = |e: &dyn std::fmt::Display| {
            Box::new(refuse(Reason::BadRequest, format!("bad request: {e}")))
        };
        let normalised = match normalise(request.path_or_root(), self.settings.escaped_slashes) {
            Ok(std::borrow::Cow::Borrowed(_)) => None,
            Ok(std::borrow::Cow::Owned(p)) => Some(p),
            Err(e) => return Err(bad(&e)),
        };
        let forward_path = match &normalised {
            Some(p) => {
                let pq = match request.query {
                    Some(q) => format!("{p}?{q}"),
                    None => p.clone(),
                };
                match PathAndQuery::try_from(pq) {
                    Ok(pq) => Some(pq),
                    Err(_) => return Err(bad(&"unusable path")),
                }
            }
            None => None,
        };
        let path = normalised
            .as_deref()
            .unwrap_or_else(|| request.path_or_root());
        if !self.settings.allow_dot_segment_params && has_dot_segment_params(path) {
            return Err(bad(&PathError::DotSegmentParams));
        }
        Ok((normalised, forward_path))
    }

    /// [`Self::route`] for a request on a Gateway listener: that listener's routes, by
    /// hostname, path and headers; a redirect or a 500 (an unresolved backend).
    fn route_gateway<'t, 'r>(
        &self,
        request: &RequestView<'r>,
        host: &str,
        raw_host: &'r str,
        listener: &str,
        tls: &Option<Option<std::sync::Arc<str>>>,
        table: &'t RouteTable,
    ) -> Decision<'t, 'r> {
        let Some(l) = table.gateway_listener(listener) else {
            return refuse(
                Reason::NoRoute,
                format!("no route: listener {listener} is no longer served"),
            );
        };
        if let Some(sni) = tls {
            let made_with = l.certificate_for(sni.as_deref()).map(|c| &c.name);
            let wanted = l.certificate_for(Some(host)).map(|c| &c.name);
            if made_with != wanted {
                return misdirected(host);
            }
        }
        let (normalised, forward_path) = match self.request_path(request) {
            Ok(p) => p,
            Err(refused) => return *refused,
        };
        let path = normalised
            .as_deref()
            .unwrap_or_else(|| request.path_or_root());
        let asked = Asked {
            method: request.method,
            query: request.query,
            headers: request.headers,
        };
        let Some(entry) = l.lookup(host, path, &asked) else {
            return refuse(
                Reason::NoRoute,
                format!("no route: no rule of listener {listener} matches {host}{path}"),
            );
        };
        self.act(
            &entry.path,
            &entry.action,
            request,
            Place {
                host,
                raw_host,
                tls: tls.is_some(),
                port: l.public_port,
            },
            path,
            forward_path,
        )
    }

    /// What an entry with filters does with a request (a Gateway listener's entry, or an
    /// Ingress path with ingress-nginx annotations): redirect, answer a CORS preflight, or
    /// forward with its changes. `matched_path` is the path rule it matched with, `path`
    /// the normalised request path.
    fn act<'t, 'r>(
        &self,
        matched_path: &'t PathRule,
        matched: &'t Matched,
        request: &RequestView<'r>,
        place: Place<'_, 'r>,
        path: &str,
        forward_path: Option<PathAndQuery>,
    ) -> Decision<'t, 'r> {
        let Place {
            host,
            raw_host,
            tls,
            port,
        } = place;
        // Redirects first, then the source ranges (nginx's rewrite phase comes before its
        // access phase).
        if matched.https_redirect && !tls && !path.starts_with(ACME_CHALLENGE) {
            let target = sent_or_normalised(request, forward_path.as_ref());
            return Decision::Redirect {
                status: 308,
                location: format!("https://{host}{target}"),
            };
        }
        if let Some(sources) = &matched.sources {
            let client = self.client_address(request);
            if !client.is_some_and(|c| sources.allows(c)) {
                return refuse(
                    Reason::Forbidden,
                    format!("forbidden: client address {client:?} is not allowed here"),
                );
            }
        }
        if let Some(limit) = &matched.rate_limit {
            // An unknown peer shares one bucket with every other unknown one.
            let client = self
                .client_address(request)
                .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
            if !limit.allow(client, std::time::Instant::now()) {
                return refuse(
                    Reason::RateLimited,
                    format!(
                        "rate limited: {client} is over {} requests a second",
                        limit.rate
                    ),
                );
            }
        }
        // A place among the client's requests in progress, held until the request ends.
        let hold = match &matched.conn_limit {
            None => None,
            Some(limit) => {
                let client = self
                    .client_address(request)
                    .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
                match limit.acquire(client) {
                    Some(permit) => Some(permit),
                    None => {
                        return refuse(
                            Reason::RateLimited,
                            format!(
                                "connection limited: {client} has {} requests in progress",
                                limit.max
                            ),
                        );
                    }
                }
            }
        };
        let (changes, response, rewrite, timeouts, cors, retry, per_target, mirrors) =
            match &matched.action {
                Action::Forward {
                    headers,
                    response,
                    rewrite,
                    timeouts,
                    cors,
                    retry,
                    per_target,
                    mirrors,
                    ..
                } => (
                    headers, response, rewrite, timeouts, cors, retry, per_target, mirrors,
                ),
                Action::Redirect(redirect) => {
                    let scheme = if tls { "https" } else { "http" };
                    let query = request.query.filter(|_| !redirect.drop_query);
                    let target = match &redirect.path {
                        Some(m) => with_query(m.apply(matched_path, path), query),
                        None => sent_or_normalised(request, forward_path.as_ref()),
                    };
                    return Decision::Redirect {
                        status: redirect.status,
                        location: redirect.location(scheme, host, port, &target),
                    };
                }
            };
        // A CORS preflight is answered here: with the filter's headers to an allowed
        // origin, without them to another (the browser then refuses the request).
        let origin = cors
            .as_ref()
            .and_then(|_| first_value(request.headers, "origin"));
        if let (Some(cors), Some(origin)) = (cors, origin.as_deref())
            && request.method == "OPTIONS"
            && let Some(method) = first_value(request.headers, "access-control-request-method")
        {
            let headers = if cors.allows(origin) {
                let asked = first_value(request.headers, "access-control-request-headers");
                cors.preflight(origin, &method, asked.as_deref())
            } else {
                HeaderChanges::default()
            };
            return Decision::Answer {
                status: 204,
                headers: Box::new(headers),
            };
        }
        let rule_changes = changes;
        let (picked, target) = match matched.next_pick() {
            Some((i, t)) => (i, Some(t)),
            None => (0, None),
        };
        // A backend with its own header changes: the rule's and its own, made one.
        let (changes, response) = match per_target.get(picked).and_then(Option::as_deref) {
            Some(own) => (&own.request, &own.response),
            None => (changes, response),
        };
        let route = match target {
            Some(Target::Route(r)) => &**r,
            Some(Target::Unresolved(why)) => {
                return refuse(
                    Reason::InvalidBackend,
                    format!("backend reference does not resolve: {why}"),
                );
            }
            None => {
                return refuse(
                    Reason::InvalidBackend,
                    "the rule has no backend to forward to",
                );
            }
        };
        let forward_path = match rewrite.as_ref().and_then(|w| w.path.as_ref()) {
            None => forward_path,
            Some(m) => {
                match PathAndQuery::try_from(with_query(m.apply(matched_path, path), request.query))
                {
                    Ok(pq) => Some(pq),
                    Err(_) => {
                        return refuse(Reason::BadRequest, "bad request: unusable rewritten path");
                    }
                }
            }
        };
        let changes = Some(changes).filter(|c| **c != HeaderChanges::default());
        match forward_to(route, raw_host, forward_path, changes) {
            Decision::Forward(mut routed) => {
                routed.upstream_host = rewrite.as_ref().and_then(|w| w.hostname.as_deref());
                let rule = Some(response).filter(|c| **c != HeaderChanges::default());
                routed.response_changes = match (cors, origin.as_deref()) {
                    (Some(cors), Some(origin)) => {
                        let made = rule.cloned().unwrap_or_default().then(&cors.actual(origin));
                        ResponseChanges::Made(Box::new(made))
                    }
                    _ => rule.map_or(ResponseChanges::None, ResponseChanges::Rule),
                };
                routed.timeouts = Some(timeouts).filter(|t| **t != Timeouts::default());
                routed.retry = retry.as_deref();
                routed.max_body = matched.max_body;
                routed.hold = hold.map(|p| Box::new(p) as holdfast_http::routing::Hold);
                if let Some(affinity) = &matched.affinity {
                    let endpoints = &routed.route.backend.endpoints;
                    let (start, set) = affinity.pick(request.headers, endpoints, || {
                        routed.route.backend.next_index()
                    });
                    routed.start = start;
                    if let Some(cookie) = set {
                        let mut made = routed.response_changes.get().cloned().unwrap_or_default();
                        made.add.push((http::header::SET_COOKIE, cookie));
                        routed.response_changes = ResponseChanges::Made(Box::new(made));
                    }
                }
                if retry.is_some() {
                    self.retry_budget.deposit();
                }
                if !mirrors.is_empty() {
                    let hop = request.peer.map(|client| Hop {
                        client,
                        port,
                        proto: if tls { "https" } else { "http" },
                        host: raw_host,
                        trusted: self
                            .settings
                            .trust_forwarded_from
                            .iter()
                            .any(|n| n.contains(&client)),
                    });
                    self.mirror(mirrors, request, &routed, (hop, rule_changes));
                }
                Decision::Forward(routed)
            }
            other => other,
        }
    }

    /// Copies of a forwarded request for the mirrors that take it
    /// ([`crate::mirror`]): sent from tasks of their own, never waited for.
    fn mirror(
        &self,
        mirrors: &[Mirror],
        request: &RequestView<'_>,
        routed: &Routed<'_, '_>,
        (hop, changes): (Option<Hop<'_>>, &HeaderChanges),
    ) {
        use crate::mirror::Outcome;
        let mut head: Option<Vec<u8>> = None;
        for (m, n) in mirrors.iter().filter_map(|m| Some((m, m.takes_next()?))) {
            if !request.bodyless {
                self.mirrors.not_sent(Outcome::HasBody);
                continue;
            }
            let Some(backend) = m
                .backend
                .as_ref()
                .filter(|b| b.unavailable_reason.is_none())
            else {
                self.mirrors.not_sent(Outcome::NoEndpoint);
                continue;
            };
            if backend.h2c || backend.external.is_some() {
                self.mirrors.not_sent(Outcome::Unsupported);
                continue;
            }
            // Its own round robin (the mirror's count), not the backend's: copies never
            // shift the rule's own endpoint choice.
            let start = usize::try_from(n).unwrap_or_default();
            let to = self
                .balancer
                .pick(&backend.endpoints, start, None)
                .map(|(i, _)| backend.dial[i].key.clone());
            let head = head.get_or_insert_with(|| {
                let target = sent_or_normalised(request, routed.forward_path.as_ref());
                crate::mirror::copy_head(&crate::mirror::Copy {
                    method: request.method,
                    target: &target,
                    host: routed.upstream_host.unwrap_or(routed.raw_host),
                    headers: request.headers,
                    hop,
                    changes: Some(changes).filter(|c| **c != HeaderChanges::default()),
                    loop_header: (LOOP_HEADER, &self.settings.loop_token),
                    request_id: request.request_id,
                })
            });
            self.mirrors.send(to, head.clone());
        }
    }

    /// The client address source ranges and rate limits use: the peer's; for a peer in
    /// `--trust-forwarded-from` (a balancer in front), the last X-Forwarded-For address
    /// that is not itself trusted (as nginx's `real_ip_recursive`; `ip:port` and `[v6]:port`
    /// entries read as their address). None when the peer is not known, or an entry met on
    /// the way is not an address (the client could have written it: nothing left of it is
    /// believed). IPv4-mapped IPv6 addresses are read as IPv4.
    fn client_address(&self, request: &RequestView<'_>) -> Option<std::net::IpAddr> {
        use std::net::IpAddr;
        let canonical = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let peer = canonical(request.peer?);
        let trusted = |ip: &IpAddr| {
            self.settings
                .trust_forwarded_from
                .iter()
                .any(|n| n.contains(ip))
        };
        if !trusted(&peer) {
            return Some(peer);
        }
        let mut entries: Vec<Option<IpAddr>> = Vec::new();
        request.headers.any_value("x-forwarded-for", &mut |v| {
            let text = std::str::from_utf8(v).unwrap_or_default();
            entries.extend(text.split(',').map(|a| {
                let a = a.trim();
                a.parse::<IpAddr>()
                    .ok()
                    .or_else(|| a.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
                    .map(canonical)
            }));
            false
        });
        for entry in entries.iter().rev() {
            match entry {
                Some(ip) if trusted(ip) => continue,
                Some(ip) => return Some(*ip),
                None => return None,
            }
        }
        // No untrusted address: the request came from the balancer itself.
        Some(peer)
    }

    /// Whether the request carries this proxy's own loop token.
    fn has_passed_here(&self, headers: &dyn HeaderLookup) -> bool {
        let mine = self.settings.loop_token.as_bytes();
        headers.any_value(LOOP_HEADER, &mut |v| {
            v.split(|b| *b == b',').any(|t| t.trim_ascii() == mine)
        })
    }
}

/// Where a request was sent: its host (normalised) and Host as sent, whether over TLS,
/// and the port a redirect keeps.
#[derive(Clone, Copy)]
struct Place<'h, 'r> {
    host: &'h str,
    raw_host: &'r str,
    tls: bool,
    port: u16,
}

/// Forward on `route`, unless its backend has nothing to serve with (503, counted on the
/// route): the end of both APIs' routing.
fn forward_to<'t, 'r>(
    route: &'t Route,
    raw_host: &'r str,
    forward_path: Option<PathAndQuery>,
    header_changes: Option<&'t HeaderChanges>,
) -> Decision<'t, 'r> {
    if let Some(reason) = &route.backend.unavailable_reason {
        return Decision::Refuse {
            reason: Reason::BackendUnavailable,
            detail: format!("backend unavailable: {reason}"),
            route: Some(route),
        };
    }
    Decision::Forward(Routed {
        route,
        raw_host,
        forward_path,
        header_changes,
        upstream_host: None,
        response_changes: ResponseChanges::None,
        timeouts: None,
        retry: None,
        max_body: None,
        hold: None,
        start: None,
    })
}

/// The first value of header `name` as text, if any.
fn first_value(headers: &dyn HeaderLookup, name: &str) -> Option<String> {
    let mut found = None;
    headers.any_value(name, &mut |v| {
        if found.is_none() {
            found = std::str::from_utf8(v).ok().map(str::to_owned);
        }
        found.is_some()
    });
    found
}

/// `path` with the request's query, if it had one.
fn with_query(mut path: String, query: Option<&str>) -> String {
    if let Some(q) = query {
        path.push('?');
        path.push_str(q);
    }
    path
}

/// The path and query a redirect keeps: the normalised ones, or as sent.
fn sent_or_normalised(request: &RequestView<'_>, normalised: Option<&PathAndQuery>) -> String {
    match (normalised, request.query) {
        (Some(pq), _) => pq.as_str().to_owned(),
        (None, Some(q)) => format!("{}?{q}", request.path_or_root()),
        (None, None) => request.path_or_root().to_owned(),
    }
}
