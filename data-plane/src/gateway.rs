//! Gateway API routing on one Gateway address and port: the weighted choice of a
//! backend, the request header changes and the redirect location (pure functions), and
//! [`Listener`], one `GatewayListener` of a snapshot with its `GatewayHost`s compiled for
//! them.
//!
//! A listener's routes are looked up by the same [`crate::matching::Hosts`] as the
//! Ingress routes, with [`Selection::Gateway`], which differs from Ingress's where the
//! Gateway API specification says so:
//! - A hostname wildcard `*.example.com` covers one or more labels (`a.example.com` and
//!   `a.b.example.com`, never `example.com`), and the longest wildcard is tried first.
//! - Hostname levels fall through: the exact hostname's entries, then each wildcard's from
//!   the longest, then the entries for any hostname; the first entry that matches wins.
//! - Within a hostname, the path lookup is the one Ingress virtual hosts use
//!   ([`crate::matching::Paths`]): Exact first, then the longest PathPrefix, and at one
//!   path the entries in the order the control plane gave them (most header matches
//!   first, then the oldest route). Header matches are exact; names are case-insensitive.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use holdfast_http::forward::Retry;
pub use holdfast_http::headers::HeaderChanges;
pub use holdfast_http::routing::Timeouts;
use holdfast_proto::v1::{GatewayHost, GatewayListener, MatchKind};
use http::{HeaderName, HeaderValue};

use crate::metrics::RouteCounters;
use crate::table::{Backend, CompileError, Label, Route, TlsCertificate};

use crate::cors::Cors;
use crate::matching::{Asked, Conditions, Hosts, Paths, Selection};
pub use crate::matching::{Entry, PathRule};

/// The backend to use for the `n`-th request, by weight: over every `sum` consecutive
/// requests each backend gets exactly its `weight`, in a spread order (request `n` takes
/// slot `n × P mod sum` for a prime `P`, a permutation of the slots, so one backend's
/// share does not come in one run). None when every weight is 0.
pub fn pick(weights: &[u32], n: u64) -> Option<usize> {
    /// A prime (Knuth's multiplicative hash constant).
    const SPREAD: u64 = 2_654_435_761;
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if total == 0 {
        return None;
    }
    let n = n % total;
    let slot = if total.is_multiple_of(SPREAD) {
        n
    } else {
        ((u128::from(n) * u128::from(SPREAD)) % u128::from(total)) as u64
    };
    let mut upto = 0;
    weights.iter().position(|w| {
        upto += u64::from(*w);
        slot < upto
    })
}

/// A `RequestRedirect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// `http` or `https`; None: the request's.
    pub scheme: Option<String>,
    /// None: the request's host.
    pub hostname: Option<String>,
    /// None: the scheme's well-known port when the redirect names a scheme, else the
    /// listener's port (Gateway API `RequestRedirect.port`).
    pub port: Option<u16>,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
    /// The path (None: the request's).
    pub path: Option<PathModifier>,
    /// The whole location, nothing of the request kept (ingress-nginx's
    /// `permanent-redirect`); the fields above are then unused.
    pub location: Option<String>,
    /// The request's query is not kept (ingress-nginx's `app-root`).
    pub drop_query: bool,
}

/// A path replacement (`URLRewrite` and `RequestRedirect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathModifier {
    /// True: `value` replaces the whole path; false: the prefix the entry matched.
    pub full: bool,
    /// The replacement (starts with `/`).
    pub value: String,
    /// With `full`: `$1` to `$9` in `value` are the capture groups of the entry's regular
    /// expression (ingress-nginx `rewrite-target`).
    pub captures: bool,
}

impl PathModifier {
    /// The path that replaces `path` (normalised), which the entry `matched` matched. A
    /// prefix is replaced element-wise: what follows the matched prefix is kept (the
    /// replacement's trailing `/` dropped first), and an empty result is `/`. An `Exact`
    /// rule's prefix is the whole path.
    pub fn apply(&self, matched: &PathRule, path: &str) -> String {
        if self.full {
            if !self.captures {
                return self.value.clone();
            }
            let groups = match matched {
                PathRule::Regex(r) => r.regex.captures(path),
                _ => None,
            };
            return with_groups(&self.value, groups.as_ref());
        }
        let rest = match matched {
            PathRule::Exact(_) | PathRule::Regex(_) => "",
            PathRule::Prefix(p) => path.get(p.trim_end_matches('/').len()..).unwrap_or(""),
        };
        let mut out = String::with_capacity(self.value.len() + rest.len());
        out.push_str(self.value.trim_end_matches('/'));
        out.push_str(rest);
        if !out.starts_with('/') {
            out.insert(0, '/');
        }
        out
    }
}

/// `template` with each `$1` to `$9` replaced by that capture group of `groups` ("" when
/// there is no such group), as nginx's `rewrite` fills them; a `$` not before a digit 1-9
/// is kept. A result that does not start with `/` gets one.
pub fn with_groups(template: &str, groups: Option<&regex::Captures<'_>>) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut chars = template.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        match (c, chars.peek()) {
            ('$', Some((_, d @ '1'..='9'))) => {
                let n = (*d as usize) - ('0' as usize);
                if let Some(m) = groups.and_then(|g| g.get(n)) {
                    out.push_str(m.as_str());
                }
                chars.next();
            }
            (c, _) => out.push(c),
        }
    }
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    out
}

/// An Ingress's source ranges (ingress-nginx `denylist-source-range` and
/// `whitelist-source-range`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    /// Allowed (when not empty, every other address is refused).
    pub allow: Vec<ipnet::IpNet>,
    /// Refused, before `allow` is read.
    pub deny: Vec<ipnet::IpNet>,
}

impl Sources {
    /// A route's source ranges (None: it has none; Err: one is not a CIDR).
    pub fn of(r: &holdfast_proto::v1::GatewayRoute) -> Result<Option<Self>, ipnet::AddrParseError> {
        if r.allow_sources.is_empty() && r.deny_sources.is_empty() {
            return Ok(None);
        }
        let parse = |list: &[String]| {
            list.iter()
                .map(|c| c.parse::<ipnet::IpNet>())
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Some(Sources {
            allow: parse(&r.allow_sources)?,
            deny: parse(&r.deny_sources)?,
        }))
    }

    /// Whether a request from `client` is let through: not in `deny`, and in `allow`
    /// when it has any (as nginx reads `deny`, `allow`, then `deny all`).
    pub fn allows(&self, client: IpAddr) -> bool {
        let client = match client {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
            v4 => v4,
        };
        !self.deny.iter().any(|n| n.contains(&client))
            && (self.allow.is_empty() || self.allow.iter().any(|n| n.contains(&client)))
    }
}

/// A `URLRewrite`: the host and path the backend is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rewrite {
    /// The host (None: the request's).
    pub hostname: Option<String>,
    /// The path (None: the request's).
    pub path: Option<PathModifier>,
}

impl Redirect {
    /// The `Location` for a request with `scheme`, `host` (without port), `port` (the
    /// listener's) and `path_and_query`. A port that is the scheme's default is left out.
    pub fn location(&self, scheme: &str, host: &str, port: u16, path_and_query: &str) -> String {
        if let Some(location) = &self.location {
            return location.clone();
        }
        let new_scheme = self.scheme.as_deref().unwrap_or(scheme);
        let default = |s: &str| if s == "https" { 443 } else { 80 };
        let new_port = match (self.port, self.scheme.as_deref()) {
            (Some(p), _) => p,
            (None, Some(s)) => default(s),
            (None, None) => port,
        };
        let host = self.hostname.as_deref().unwrap_or(host);
        if new_port == default(new_scheme) {
            format!("{new_scheme}://{host}{path_and_query}")
        } else {
            format!("{new_scheme}://{host}:{new_port}{path_and_query}")
        }
    }
}

/// Where one weighted share of a rule goes.
#[derive(Debug)]
pub enum Target {
    /// This backend (a route of its own, for the request metrics).
    Route(Arc<Route>),
    /// Nowhere: the reference does not resolve (500), and why.
    Unresolved(String),
}

/// What a matched entry does.
#[derive(Debug)]
pub enum Action {
    /// Forward to one of `targets` by `weights`, after changing the request's headers
    /// (and host and path, for a rewrite); the response's headers are changed too.
    Forward {
        /// Relative weights, one per target.
        weights: Box<[u32]>,
        /// The targets.
        targets: Vec<Target>,
        /// Request header changes.
        headers: HeaderChanges,
        /// Response header changes.
        response: HeaderChanges,
        /// The host and path sent upstream (None: the request's).
        rewrite: Option<Box<Rewrite>>,
        /// How long a request may take.
        timeouts: Timeouts,
        /// A CORS filter.
        cors: Option<Box<Cors>>,
        /// When a response is tried again.
        retry: Option<Box<Retry>>,
        /// Per target, the header changes when it has its own (a backendRef's filters):
        /// the rule's and its own, made one.
        per_target: Vec<Option<Box<TargetChanges>>>,
        /// Where copies of the requests go (RequestMirror filters).
        mirrors: Box<[Mirror]>,
    },
    /// Answer with a redirect.
    Redirect(Redirect),
}

/// A sticky-session cookie (ingress-nginx `affinity: cookie`): its value is a token of
/// the endpoint the request went to, and a request that brings it goes there again while
/// that endpoint is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affinity {
    /// The cookie's name.
    pub cookie: String,
    /// What follows the value in Set-Cookie (`; Path=/; HttpOnly`).
    pub attributes: String,
}

impl Affinity {
    /// The token naming `endpoint` in the cookie: 16 hex digits of a hash of its address
    /// (not a secret: a client can learn only which of the backend's endpoints it uses).
    pub fn token(endpoint: &std::net::SocketAddr) -> String {
        // FNV-1a: stable across proxies and restarts, so every proxy reads every cookie.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in endpoint.to_string().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }

    /// Where a request goes among `endpoints`: the one its cookie names, if it is there
    /// (and no cookie to set); else the one `next` gives, and the Set-Cookie naming it.
    /// (None, None) without endpoints.
    pub fn pick(
        &self,
        headers: &dyn holdfast_http::headers::HeaderLookup,
        endpoints: &[std::net::SocketAddr],
        next: impl FnOnce() -> usize,
    ) -> (Option<usize>, Option<HeaderValue>) {
        if endpoints.is_empty() {
            return (None, None);
        }
        if let Some(token) = crate::matching::cookie(headers, &self.cookie)
            && let Some(i) = endpoints
                .iter()
                .position(|e| Self::token(e).as_bytes() == token.as_slice())
        {
            return (Some(i), None);
        }
        let i = next() % endpoints.len();
        let value = format!(
            "{}={}{}",
            self.cookie,
            Self::token(&endpoints[i]),
            self.attributes
        );
        (Some(i), HeaderValue::from_str(&value).ok())
    }
}

/// A RequestMirror: where copies of a rule's requests go, and which share of them.
#[derive(Debug)]
pub struct Mirror {
    /// The backend copies go to (None: the reference does not resolve, and nothing is
    /// copied).
    pub backend: Option<Arc<Backend>>,
    /// `numerator` of every `denominator` requests are copied.
    numerator: u32,
    /// At least 1, and at least `numerator`.
    denominator: u32,
    /// Requests seen, which spreads the copies evenly.
    seen: AtomicU64,
}

impl Mirror {
    /// A mirror of `numerator` in `denominator` requests (a share over 1 is 1; a
    /// denominator of 0 is 1).
    pub fn new(backend: Option<Arc<Backend>>, numerator: u32, denominator: u32) -> Self {
        let denominator = denominator.max(1);
        Mirror {
            backend,
            numerator: numerator.min(denominator),
            denominator,
            seen: AtomicU64::new(0),
        }
    }

    /// Whether the next request is copied, with its number among the requests this
    /// mirror has seen (where the copy's endpoint choice starts, apart from the rule's
    /// own): exactly `numerator` of every `denominator` requests in a row, spread evenly
    /// (request `i` of the `denominator` is copied when `(i + 1) * numerator /
    /// denominator` passes a whole number). The count is this proxy's, from when the
    /// listener's table was last compiled.
    pub fn takes_next(&self) -> Option<u64> {
        let (k, d) = (u64::from(self.numerator), u64::from(self.denominator));
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let i = n % d;
        ((i + 1) * k / d > i * k / d).then_some(n)
    }
}

/// A target's header changes with its rule's: requests get the rule's, then the target's;
/// responses the target's, then the rule's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetChanges {
    /// Request header changes.
    pub request: HeaderChanges,
    /// Response header changes.
    pub response: HeaderChanges,
}

/// One compiled entry: its action, and the count that spreads requests over the weights.
#[derive(Debug)]
pub struct Matched {
    /// What it does.
    pub action: Action,
    /// A plain-HTTP request is redirected to https first (an Ingress's
    /// `force-ssl-redirect`).
    pub https_redirect: bool,
    /// The client addresses refused or allowed (an Ingress's source ranges).
    pub sources: Option<Box<Sources>>,
    /// Its own request body limit in bytes (an Ingress's `proxy-body-size`).
    pub max_body: Option<std::num::NonZeroU64>,
    /// Requests a second per client address (an Ingress's `limit-rps`), shared by the
    /// entries of one Ingress path (a canary's header, cookie and weighted entries).
    pub rate_limit: Option<Arc<crate::limit::RateLimit>>,
    /// Requests in progress at once per client address (an Ingress's
    /// `limit-connections`), shared like `rate_limit`.
    pub conn_limit: Option<Arc<crate::limit::ConnLimit>>,
    /// A sticky-session cookie (an Ingress's `affinity: cookie`).
    pub affinity: Option<Box<Affinity>>,
    requests: AtomicU64,
}

impl Matched {
    /// Its targets' routes (what counts its requests).
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        let targets = match &self.action {
            Action::Forward { targets, .. } => targets.as_slice(),
            Action::Redirect(_) => &[],
        };
        targets.iter().filter_map(|t| match t {
            Target::Route(r) => Some(r),
            Target::Unresolved(_) => None,
        })
    }

    /// The target of the next request (None: every weight is 0, or there is no target).
    pub fn next_target(&self) -> Option<&Target> {
        self.next_pick().map(|(_, t)| t)
    }

    /// The target of the next request, and its index among the rule's.
    pub fn next_pick(&self) -> Option<(usize, &Target)> {
        let Action::Forward {
            weights, targets, ..
        } = &self.action
        else {
            return None;
        };
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        pick(weights, n).and_then(|i| Some((i, targets.get(i)?)))
    }
}

/// One Gateway listener (an address and port), compiled.
#[derive(Debug)]
pub struct Listener {
    /// `<address>:<port>`.
    pub name: String,
    /// The address to bind.
    pub address: IpAddr,
    /// The port to bind.
    pub port: u16,
    /// The port clients reach the listener on (its Gateway's Service maps it to `port`).
    pub public_port: u16,
    /// HTTPS (else plain HTTP, or TLS passthrough).
    pub tls: bool,
    /// TLS passthrough (protocol `TLS`): TLSRoutes by the ClientHello's server name
    /// ([`crate::passthrough`]); its hosts' first entry names the backend.
    pub passthrough: bool,
    /// `namespace/name` and generation of its Gateway.
    pub gateway: Option<(String, i64)>,
    /// Per listener hostname ("" any; `*.suffix` a wildcard), its certificates.
    certificates: Vec<(String, Vec<Arc<TlsCertificate>>)>,
    table: Hosts<Paths<Arc<Matched>>>,
    /// Route entries served.
    pub entries: usize,
}

fn header_pair(name: &str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    Some((
        HeaderName::from_bytes(name.as_bytes()).ok()?,
        HeaderValue::from_str(value).ok()?,
    ))
}

/// A snapshot's rule timeouts: a request limit of 0 is none; a backend limit of 0 is no
/// limit at all (not even the proxy's).
fn timeouts_of(t: Option<&holdfast_proto::v1::RouteTimeouts>) -> Timeouts {
    let Some(t) = t else {
        return Timeouts::default();
    };
    Timeouts {
        request: t
            .request_ms
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis),
        backend: t.backend_request_ms.map(|ms| match ms {
            0 => std::time::Duration::MAX,
            ms => std::time::Duration::from_millis(ms),
        }),
        connect: Some(t.connect_ms)
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis),
        send: Some(t.send_ms)
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis),
    }
}

/// A snapshot's header modifier compiled (None: a name or value that is not one).
fn header_changes(m: Option<&holdfast_proto::v1::HeaderModifier>) -> Option<HeaderChanges> {
    let mut out = HeaderChanges::default();
    let Some(m) = m else { return Some(out) };
    let pairs = |list: &[holdfast_proto::v1::HeaderMatch]| {
        list.iter()
            .map(|p| header_pair(&p.name, &p.value))
            .collect::<Option<Vec<_>>>()
    };
    out.set = pairs(&m.set)?;
    out.add = pairs(&m.add)?;
    out.remove = m
        .remove
        .iter()
        .map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect::<Option<Vec<_>>>()?;
    Some(out)
}

/// Compiles one route entry of `host` (a Gateway host's, or an Ingress host's with
/// filters): its matches and what it does, its targets' routes labelled `label`.
pub(crate) fn compile_entry(
    r: &holdfast_proto::v1::GatewayRoute,
    host: &Arc<str>,
    label: Label,
    backend: &impl Fn(&str) -> Result<Arc<Backend>, CompileError>,
    bad: &impl Fn(&str) -> CompileError,
) -> Result<Entry<Matched>, CompileError> {
    let source = match (&r.source, &r.ingress) {
        (Some(s), _) => format!("{}/{}", s.namespace, s.name),
        (None, Some(i)) => format!("{}/{}", i.namespace, i.name),
        (None, None) => String::new(),
    };
    let rule = match MatchKind::try_from(r.match_kind) {
        Ok(MatchKind::Exact) => PathRule::Exact(r.path.clone()),
        Ok(MatchKind::Regex) => PathRule::Regex(crate::matching::PathRegex {
            source: r.path.clone(),
            regex: Arc::new(
                holdfast_proto::snapshot::ingress_path_regex(&r.path)
                    .map_err(|_| bad("path regex"))?,
            ),
        }),
        _ => PathRule::Prefix(r.path.clone()),
    };
    let headers = r
        .headers
        .iter()
        .map(|m| header_pair(&m.name, &m.value).ok_or_else(|| bad("header match")))
        .collect::<Result<Vec<_>, _>>()?;
    let header_patterns = r
        .header_patterns
        .iter()
        .map(|p| {
            holdfast_proto::snapshot::header_pattern_regex(&p.value)
                .map(|re| (p.name.clone(), crate::matching::HeaderPattern(Arc::new(re))))
                .map_err(|_| bad("header pattern"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let conditions = Conditions {
        method: Some(r.method.clone()).filter(|m| !m.is_empty()),
        query: r
            .query_params
            .iter()
            .map(|q| (q.name.clone(), q.value.clone()))
            .collect(),
        cookies: r
            .cookies
            .iter()
            .map(|c| (c.name.clone(), c.value.clone()))
            .collect(),
        header_patterns,
    };
    let more = (conditions != Conditions::default()).then(|| Box::new(conditions));
    let path_of = |m: &holdfast_proto::v1::PathModifier| {
        (m.value.starts_with('/') || (m.value.is_empty() && !m.full))
            .then(|| PathModifier {
                full: m.full,
                value: m.value.clone(),
                captures: m.captures,
            })
            .ok_or_else(|| bad("path modifier"))
    };
    let route_path: Arc<str> = r.path.as_str().into();
    let action = match &r.redirect {
        Some(d) => Action::Redirect(Redirect {
            scheme: Some(d.scheme.clone()).filter(|s| !s.is_empty()),
            hostname: Some(d.hostname.clone()).filter(|s| !s.is_empty()),
            port: u16::try_from(d.port).ok().filter(|p| *p != 0),
            status: u16::try_from(d.status_code).unwrap_or(302),
            path: d.path.as_ref().map(path_of).transpose()?,
            location: Some(d.location.clone()).filter(|l| !l.is_empty()),
            drop_query: d.drop_query,
        }),
        None => {
            let changes = |m: &Option<holdfast_proto::v1::HeaderModifier>| {
                header_changes(m.as_ref()).ok_or_else(|| bad("header change"))
            };
            let (rule_request, rule_response) =
                (changes(&r.request_headers)?, changes(&r.response_headers)?);
            let mut weights = Vec::with_capacity(r.backends.len());
            let mut targets = Vec::with_capacity(r.backends.len());
            let mut per_target = Vec::new();
            for w in &r.backends {
                if w.request_headers.is_some() || w.response_headers.is_some() {
                    per_target.resize(targets.len(), None);
                    per_target.push(Some(Box::new(TargetChanges {
                        request: rule_request.then(&changes(&w.request_headers)?),
                        response: changes(&w.response_headers)?.then(&rule_response),
                    })));
                }
                weights.push(w.weight);
                targets.push(if w.backend.is_empty() {
                    Target::Unresolved(w.unresolved.clone())
                } else {
                    Target::Route(Arc::new(Route {
                        host: host.clone(),
                        kind: path_kind(&rule),
                        path: route_path.clone(),
                        backend: backend(&w.backend)?,
                        source: source.clone(),
                        label: label.clone(),
                        counters: RouteCounters::default(),
                    }))
                });
            }
            let mirrors = r
                .mirrors
                .iter()
                .map(|m| {
                    let to = (!m.backend.is_empty())
                        .then(|| backend(&m.backend))
                        .transpose()?;
                    Ok(Mirror::new(to, m.numerator, m.denominator))
                })
                .collect::<Result<Box<[_]>, CompileError>>()?;
            let rewrite = match &r.rewrite {
                None => None,
                Some(w) => Some(Box::new(Rewrite {
                    hostname: Some(w.hostname.clone()).filter(|h| !h.is_empty()),
                    path: w.path.as_ref().map(path_of).transpose()?,
                })),
            };
            Action::Forward {
                weights: weights.into_boxed_slice(),
                targets,
                headers: rule_request,
                response: rule_response,
                per_target,
                rewrite,
                mirrors,
                timeouts: timeouts_of(r.timeouts.as_ref()),
                retry: r.retry.as_ref().map(|p| {
                    Box::new(Retry {
                        codes: p
                            .codes
                            .iter()
                            .filter_map(|c| u16::try_from(*c).ok())
                            .collect(),
                        attempts: p.attempts,
                        backoff: std::time::Duration::from_millis(p.backoff_ms),
                    })
                }),
                cors: r.cors.as_ref().map(|c| {
                    Box::new(Cors {
                        allow_origins: c
                            .allow_origins
                            .iter()
                            .map(|o| crate::cors::normal_origin(o))
                            .collect(),
                        allow_credentials: c.allow_credentials,
                        allow_methods: c.allow_methods.clone(),
                        allow_headers: c.allow_headers.clone(),
                        expose_headers: c.expose_headers.clone(),
                        max_age: c.max_age_seconds,
                    })
                }),
            }
        }
    };
    Ok(Entry {
        path: rule,
        headers,
        more,
        action: Matched {
            action,
            https_redirect: r.https_redirect,
            sources: Sources::of(r)
                .map_err(|_| bad("source range"))?
                .map(Box::new),
            max_body: std::num::NonZeroU64::new(r.max_body_bytes),
            affinity: r.affinity.as_ref().map(|a| {
                Box::new(Affinity {
                    cookie: a.cookie_name.clone(),
                    attributes: a.attributes.clone(),
                })
            }),
            conn_limit: (r.limit_connections > 0)
                .then(|| Arc::new(crate::limit::ConnLimit::new(r.limit_connections))),
            rate_limit: (r.limit_rps > 0)
                .then(|| Arc::new(crate::limit::RateLimit::new(r.limit_rps, r.limit_burst))),
            requests: AtomicU64::new(0),
        },
    })
}

impl Listener {
    /// Its routes: one for each backend of each rule (what counts the rule's requests).
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.table
            .values()
            .flat_map(|paths| paths.entries())
            .flat_map(|e| e.action.routes())
    }

    /// Compiles listener `l` with its `hosts`, naming backends and certificates through
    /// `backend` and `certificate` (a validated snapshot names only ones it has).
    pub fn compile<'a>(
        l: &GatewayListener,
        hosts: impl IntoIterator<Item = &'a GatewayHost>,
        backend: impl Fn(&str) -> Result<Arc<Backend>, CompileError>,
        certificate: impl Fn(&str) -> Option<Arc<TlsCertificate>>,
    ) -> Result<Listener, CompileError> {
        let bad = |reason: &str| CompileError::Gateway {
            name: l.name.clone(),
            reason: reason.to_owned(),
        };
        let address: IpAddr = l.address.parse().map_err(|_| bad("address"))?;
        let port = u16::try_from(l.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("port"))?;
        let mut certificates = Vec::new();
        for c in &l.certificates {
            let mut list = Vec::new();
            for name in &c.certificates {
                list.push(certificate(name).ok_or_else(|| bad("certificate"))?);
            }
            certificates.push((c.hostname.clone(), list));
        }
        // Exact names, then wildcards from the longest, then "".
        certificates.sort_by_key(|(h, _)| {
            (
                h.is_empty(),
                h.starts_with("*."),
                std::cmp::Reverse(h.len()),
                h.clone(),
            )
        });
        let mut entries = 0;
        let mut table = Vec::new();
        for h in hosts {
            let mut list = Vec::with_capacity(h.routes.len());
            // One copy of the name, for the listener's key and every route of the host.
            let host: Arc<str> = h.host.as_str().into();
            for r in &h.routes {
                let label: Arc<str> = format!("{} {}{}", l.name, h.host, r.path).into();
                let e = compile_entry(r, &host, Label::Named(label), &backend, &bad)?;
                list.push(Entry {
                    path: e.path,
                    headers: e.headers,
                    more: e.more,
                    action: Arc::new(e.action),
                });
            }
            entries += list.len();
            table.push((host, list));
        }
        let public_port = match l.public_port {
            0 => port,
            p => u16::try_from(p).map_err(|_| bad("public port"))?,
        };
        Ok(Listener {
            name: l.name.clone(),
            address,
            port,
            public_port,
            tls: l.protocol == "HTTPS",
            passthrough: l.protocol == "TLS",
            gateway: l
                .gateway
                .as_ref()
                .map(|g| (format!("{}/{}", g.namespace, g.name), g.generation)),
            certificates,
            table: {
                let mut hosts = Hosts::new(Selection::Gateway);
                for (host, list) in table {
                    hosts.insert(host, Paths::new(list));
                }
                hosts
            },
            entries,
        })
    }

    /// The entry for `request` to `host` (normalised) at `path` (normalised).
    pub fn lookup(
        &self,
        host: &str,
        path: &str,
        request: &Asked<'_>,
    ) -> Option<&Entry<Arc<Matched>>> {
        self.table.lookup(host, path, Some(request)).ok()
    }

    /// The certificate for a TLS client that sent `sni` (lower case): that of the listener
    /// hostname matching it (exact, then the longest wildcard, then a listener without a
    /// hostname), the first of its certificates that covers the name (else its first).
    /// None fails the handshake.
    pub fn certificate_for(&self, sni: Option<&str>) -> Option<&TlsCertificate> {
        let matches = |hostname: &str| match (hostname, sni) {
            ("", _) => true,
            (_, None) => false,
            (h, Some(name)) => match h.strip_prefix("*.") {
                Some(suffix) => name
                    .strip_suffix(suffix)
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                None => h == name,
            },
        };
        let (_, list) = self.certificates.iter().find(|(h, _)| matches(h))?;
        sni.and_then(|name| {
            list.iter()
                .find(|c| holdfast_proto::certificate::covers(&c.facts.dns_names, name))
        })
        .or_else(|| list.first())
        .map(|c| &**c)
    }
}

fn path_kind(p: &PathRule) -> MatchKind {
    match p {
        PathRule::Exact(_) => MatchKind::Exact,
        PathRule::Prefix(_) => MatchKind::Prefix,
        PathRule::Regex(_) => MatchKind::Regex,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::matching::tests::headers;

    #[test]
    fn a_sticky_cookie_names_its_endpoint_and_a_request_without_a_known_one_gets_one() {
        let a = Affinity {
            cookie: "INGRESSCOOKIE".into(),
            attributes: "; Path=/; HttpOnly".into(),
        };
        let endpoints: Vec<std::net::SocketAddr> = vec![
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        ];
        // No cookie: the next endpoint, and a cookie naming it.
        let (start, set) = a.pick(&headers(&[]), &endpoints, || 3);
        assert_eq!(start, Some(1));
        let set = set.expect("a cookie to set");
        let token = Affinity::token(&endpoints[1]);
        assert_eq!(
            set.to_str().unwrap(),
            format!("INGRESSCOOKIE={token}; Path=/; HttpOnly")
        );
        assert_eq!(token.len(), 16);
        assert_ne!(token, Affinity::token(&endpoints[0]));
        // Its cookie (the name read case-insensitively, as nginx does): that endpoint,
        // whatever the round robin says, and nothing to set.
        let cookie = format!("a=1; ingresscookie={token}");
        let (start, set) = a.pick(&headers(&[("cookie", &cookie)]), &endpoints, || 0);
        assert_eq!((start, set), (Some(1), None));
        // A cookie naming no endpoint of the backend (gone, or made up): a new one.
        let stale = "INGRESSCOOKIE=0123456789abcdef";
        let (start, set) = a.pick(&headers(&[("cookie", stale)]), &endpoints, || 0);
        assert_eq!(start, Some(0));
        assert!(set.is_some());
        assert_eq!(a.pick(&headers(&[]), &[], || 0), (None, None));
    }

    #[test]
    fn a_mirror_takes_exactly_its_share_of_every_denominator_requests_spread_evenly() {
        let taken = |numerator, denominator, requests: usize| {
            let m = Mirror::new(None, numerator, denominator);
            (0..requests)
                .map(|_| m.takes_next().is_some())
                .collect::<Vec<bool>>()
        };
        let count = |v: &[bool]| v.iter().filter(|t| **t).count();
        assert_eq!(count(&taken(20, 100, 500)), 100);
        assert_eq!(count(&taken(25, 50, 100)), 50);
        assert_eq!(count(&taken(35, 100, 100)), 35);
        assert_eq!(count(&taken(0, 100, 300)), 0);
        assert_eq!(count(&taken(100, 100, 7)), 7);
        // Over 1 is every request; a denominator of 0 is read as 1.
        assert_eq!(count(&taken(3, 2, 9)), 9);
        assert_eq!(count(&taken(0, 0, 9)), 0);
        // Spread: a half is every other request, never two in a row.
        let half = taken(1, 2, 10);
        assert!(half.windows(2).all(|w| w[0] != w[1]), "{half:?}");
    }

    #[test]
    fn a_listener_binds_its_port_and_keeps_the_port_clients_reach_for_redirects() {
        let compile = |public_port: u32| {
            let l = GatewayListener {
                name: "0.0.0.0:20001".into(),
                address: "0.0.0.0".into(),
                port: 20001,
                protocol: "HTTP".into(),
                public_port,
                ..Default::default()
            };
            Listener::compile(&l, [], |_| unreachable!("no backend"), |_| None)
        };
        let behind_a_service = compile(80).expect("compiles");
        assert_eq!(
            (behind_a_service.port, behind_a_service.public_port),
            (20001, 80)
        );
        let direct = compile(0).expect("compiles");
        assert_eq!((direct.port, direct.public_port), (20001, 20001));
        assert!(compile(70_000).is_err());
    }

    #[test]
    fn weights_give_each_backend_its_share_and_zero_weights_none() {
        for weights in [
            vec![1u32, 1],
            vec![3, 1],
            vec![0, 5, 5],
            vec![7, 2, 1],
            vec![1],
        ] {
            let total: u32 = weights.iter().sum();
            let rounds = 4;
            let mut count = vec![0u32; weights.len()];
            for n in 0..u64::from(total * rounds) {
                count[pick(&weights, n).expect("a backend")] += 1;
            }
            let want: Vec<u32> = weights.iter().map(|w| w * rounds).collect();
            assert_eq!(count, want, "{weights:?}");
        }
        assert_eq!(pick(&[0, 0], 3), None);
        assert_eq!(pick(&[], 0), None);
        // Spread, not in runs: weights 1:1 alternate.
        let order: Vec<usize> = (0..4).map(|n| pick(&[1, 1], n).unwrap()).collect();
        assert_ne!(order[0], order[1]);
    }

    #[test]
    fn header_changes_set_then_add_then_remove() {
        let mut h = headers(&[
            ("x-keep", "k"),
            ("x-set", "old"),
            ("x-gone", "g"),
            ("x-add", "1"),
        ]);
        let name = |s: &str| HeaderName::from_bytes(s.as_bytes()).unwrap();
        HeaderChanges {
            set: vec![(name("x-set"), HeaderValue::from_static("new"))],
            add: vec![(name("x-add"), HeaderValue::from_static("2"))],
            remove: vec![name("x-gone")],
        }
        .apply(&mut h);
        assert_eq!(h.get("x-set").unwrap(), "new");
        assert_eq!(h.get_all("x-add").iter().collect::<Vec<_>>(), ["1", "2"]);
        assert!(h.get("x-gone").is_none());
        assert_eq!(h.get("x-keep").unwrap(), "k");
    }

    /// A route's timeouts: request and backend as Gateway API has them (backend 0: no
    /// limit); an Ingress's connect and send limits (0: the proxy's).
    #[test]
    fn a_routes_timeouts_compile_to_what_each_wait_uses() {
        use std::time::Duration;
        let t = timeouts_of(Some(&holdfast_proto::v1::RouteTimeouts {
            request_ms: Some(0),
            backend_request_ms: Some(0),
            connect_ms: 3000,
            send_ms: 0,
        }));
        assert_eq!(
            t,
            Timeouts {
                request: None,
                backend: Some(Duration::MAX),
                connect: Some(Duration::from_secs(3)),
                send: None,
            }
        );
        let t = timeouts_of(Some(&holdfast_proto::v1::RouteTimeouts {
            request_ms: None,
            backend_request_ms: Some(120_000),
            connect_ms: 0,
            send_ms: 7000,
        }));
        assert_eq!(t.backend, Some(Duration::from_secs(120)));
        assert_eq!((t.connect, t.send), (None, Some(Duration::from_secs(7))));
        assert_eq!(timeouts_of(None), Timeouts::default());
    }

    /// ingress-nginx `rewrite-target`: `$1`-`$9` are the regular expression's groups on
    /// the request path (empty when absent or not matched); other `$` are kept.
    #[test]
    fn a_rewrite_target_fills_in_the_groups_of_the_path_s_regular_expression() {
        let rx = |src: &str| {
            PathRule::Regex(crate::matching::PathRegex {
                source: src.into(),
                regex: Arc::new(holdfast_proto::snapshot::ingress_path_regex(src).unwrap()),
            })
        };
        let target = |value: &str| PathModifier {
            full: true,
            value: value.into(),
            captures: true,
        };
        let rule = rx("/something(/|$)(.*)");
        for (path, want) in [
            ("/something", "/"),
            ("/something/", "/"),
            ("/something/new", "/new"),
            ("/SomeThing/a/b", "/a/b"),
        ] {
            assert_eq!(target("/$2").apply(&rule, path), want, "{path}");
        }
        assert_eq!(
            target("/v2/$1$9x$$0$").apply(&rx("/api/(v[0-9])"), "/api/v1/x"),
            "/v2/v1x$$0$"
        );
        assert_eq!(
            target("/$1").apply(&PathRule::Exact("/e".into()), "/e"),
            "/",
            "no regular expression: no groups"
        );
        assert_eq!(target("x$1").apply(&rx("/(a)"), "/a"), "/xa");
    }

    #[test]
    fn a_prefix_replacement_keeps_what_follows_the_matched_prefix_element_wise() {
        let prefix = |value: &str| PathModifier {
            full: false,
            value: value.into(),
            captures: false,
        };
        let at = |rule: &str, value: &str, path: &str| {
            prefix(value).apply(&PathRule::Prefix(rule.into()), path)
        };
        // The Gateway API's table (HTTPPathModifier.replacePrefixMatch); a snapshot's
        // prefixes have no trailing `/`.
        assert_eq!(at("/foo", "/xyz", "/foo/bar"), "/xyz/bar");
        assert_eq!(at("/foo", "/xyz/", "/foo/bar"), "/xyz/bar");
        assert_eq!(at("/foo", "/xyz", "/foo"), "/xyz");
        assert_eq!(at("/foo", "/xyz", "/foo/"), "/xyz/");
        assert_eq!(at("/foo", "/", "/foo/bar"), "/bar");
        assert_eq!(at("/foo", "/", "/foo/"), "/");
        assert_eq!(at("/foo", "/", "/foo"), "/");
        assert_eq!(at("/", "/api", "/x/y"), "/api/x/y");
        assert_eq!(at("/", "/", "/"), "/");
        // An empty replacement drops the prefix.
        assert_eq!(at("/foo", "", "/foo/bar"), "/bar");
        assert_eq!(at("/foo", "", "/foo/"), "/");
        assert_eq!(at("/foo", "", "/foo"), "/");
        assert_eq!(
            prefix("/new").apply(&PathRule::Exact("/old".into()), "/old"),
            "/new",
            "an exact match's prefix is the whole path"
        );
        let full = PathModifier {
            full: true,
            value: "/one".into(),
            captures: false,
        };
        assert_eq!(
            full.apply(&PathRule::Prefix("/full".into()), "/full/x/y"),
            "/one"
        );
    }

    #[test]
    fn redirect_locations_change_only_what_they_name() {
        let r = |scheme: Option<&str>, hostname: Option<&str>, port: Option<u16>| Redirect {
            scheme: scheme.map(Into::into),
            hostname: hostname.map(Into::into),
            port,
            status: 302,
            path: None,
            location: None,
            drop_query: false,
        };
        assert_eq!(
            r(None, Some("example.org"), None).location("http", "a.test", 80, "/p?q=1"),
            "http://example.org/p?q=1"
        );
        assert_eq!(
            r(Some("https"), None, None).location("http", "a.test", 8080, "/"),
            "https://a.test/"
        );
        assert_eq!(
            r(None, None, Some(8443)).location("https", "a.test", 443, "/x"),
            "https://a.test:8443/x"
        );
        assert_eq!(
            r(None, None, None).location("http", "a.test", 8080, "/x"),
            "http://a.test:8080/x"
        );
        assert_eq!(
            r(Some("http"), None, Some(80)).location("https", "a.test", 443, "/"),
            "http://a.test/"
        );
        // A scheme named, even the request's own: its well-known port, not the listener's.
        assert_eq!(
            r(Some("http"), Some("b.test"), None).location("http", "a.test", 8080, "/"),
            "http://b.test/"
        );
    }
}
