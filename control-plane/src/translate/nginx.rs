//! ingress-nginx annotations (`nginx.ingress.kubernetes.io/<name>`), read into the one
//! route model: what each of an Ingress's paths does besides forwarding (a pure function
//! of the annotations, with unit tests; docs/ingress-nginx.md has the table).
//!
//! Rules:
//! - A served annotation changes every entry of the Ingress's paths (`app-root` adds an
//!   entry for `/` on each of its hosts), as ingress-nginx applies it to every location
//!   the Ingress makes.
//! - An annotation holdfast does not serve, or a value it cannot use, is never silently
//!   ignored: it is a [`ProblemReason::UnservedAnnotation`] or
//!   [`ProblemReason::InvalidAnnotation`] problem (an Event on the Ingress), and the rest
//!   of the Ingress is served.
//! - `*-snippet` annotations (raw nginx configuration) are refused on purpose
//!   ([`ProblemReason::SnippetRefused`]): they would let whoever writes an Ingress inject
//!   configuration into a proxy every tenant shares.
//! - With `--ingress-nginx-annotations=false` none is read, and an Ingress carrying any
//!   gets one problem saying so.

use std::collections::BTreeMap;

use holdfast_proto::v1::{
    Cors, GatewayHost, GatewayRoute, HeaderMatch, HeaderModifier, IngressRef, MatchKind,
    PathModifier, RequestRedirect, RouteTimeouts, UrlRewrite, WeightedBackend,
};

use super::ProblemReason;
use super::rules::{Speaks, TlsAsked};

/// The annotations' prefix.
pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// ingress-nginx's default `cors-allow-methods`.
pub const CORS_DEFAULT_METHODS: &str = "GET, PUT, POST, DELETE, PATCH, OPTIONS";
/// ingress-nginx's default `cors-allow-headers`.
pub const CORS_DEFAULT_HEADERS: &str = "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization";
/// The longest upstream timeout an annotation may set (seconds): a tenant must not hold a
/// proxy's connections for days.
pub const MAX_TIMEOUT_SECONDS: u64 = 3600;

/// The highest `limit-rps` read.
pub const MAX_RPS: u32 = 1_000_000;

/// ingress-nginx's default `cors-max-age` (seconds).
pub const CORS_DEFAULT_MAX_AGE: u32 = 1_728_000;

/// The annotations served (the names after [`PREFIX`]).
pub const SERVED: &[&str] = &[
    "app-root",
    "backend-protocol",
    "proxy-ssl-name",
    "proxy-ssl-secret",
    "proxy-ssl-server-name",
    "proxy-ssl-verify",
    "canary",
    "canary-by-cookie",
    "canary-by-header",
    "canary-by-header-pattern",
    "canary-by-header-value",
    "canary-weight",
    "canary-weight-total",
    "cors-allow-credentials",
    "cors-allow-headers",
    "cors-allow-methods",
    "cors-allow-origin",
    "cors-expose-headers",
    "cors-max-age",
    "denylist-source-range",
    "enable-cors",
    "force-ssl-redirect",
    "limit-burst-multiplier",
    "limit-connections",
    "limit-rps",
    "permanent-redirect",
    "permanent-redirect-code",
    "proxy-body-size",
    "proxy-connect-timeout",
    "proxy-read-timeout",
    "proxy-send-timeout",
    "rewrite-target",
    "ssl-redirect",
    "temporal-redirect",
    "temporal-redirect-code",
    "upstream-vhost",
    "use-regex",
    "whitelist-source-range",
    "x-forwarded-prefix",
    "affinity",
    "affinity-mode",
    "session-cookie-name",
    "session-cookie-path",
    "session-cookie-max-age",
    "session-cookie-expires",
    "session-cookie-secure",
    "session-cookie-samesite",
];

/// What an Ingress's ingress-nginx annotations ask of its paths.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NginxFilters {
    /// Every path answers with this redirect (`temporal-redirect`, `permanent-redirect`).
    pub redirect: Option<RequestRedirect>,
    /// `/` (Exact) of each of its hosts redirects here with 302 (`app-root`).
    pub app_root: Option<String>,
    /// Plain-HTTP requests are redirected to https (`force-ssl-redirect`).
    pub force_ssl_redirect: bool,
    /// The Host sent upstream (`upstream-vhost`).
    pub upstream_vhost: Option<String>,
    /// The `X-Forwarded-Prefix` header sent upstream (`x-forwarded-prefix`).
    pub forwarded_prefix: Option<String>,
    /// Cross-origin requests (`enable-cors` and `cors-*`).
    pub cors: Option<Cors>,
    /// The path sent upstream, `$1`…`$9` the groups of the path's regular expression
    /// (`rewrite-target`).
    pub rewrite_target: Option<String>,
    /// Client addresses allowed, as CIDRs (`whitelist-source-range`).
    pub allow_sources: Vec<String>,
    /// Client addresses refused, as CIDRs (`denylist-source-range`).
    pub deny_sources: Vec<String>,
    /// Most request body bytes (`proxy-body-size`; None: the proxy's limit alone).
    pub max_body_bytes: Option<u64>,
    /// Upstream timeouts (`proxy-connect-timeout`, `proxy-read-timeout`,
    /// `proxy-send-timeout`; None: the proxy's).
    pub timeouts: Option<RouteTimeouts>,
    /// Requests a second per client address, and at once (`limit-rps`,
    /// `limit-burst-multiplier`).
    pub rate_limit: Option<(u32, u32)>,
    /// Requests in progress at once per client address (`limit-connections`).
    pub limit_connections: Option<u32>,
    /// A sticky-session cookie (`affinity: cookie` and `session-cookie-*`): its name,
    /// its Path (None: each path's own), and the attributes after it.
    pub affinity: Option<(String, Option<String>, String)>,
    /// A `backend-protocol` the proxy does not speak: the paths answer 500 with this
    /// reason rather than send in cleartext what was meant to go over TLS.
    pub refused_protocol: Option<String>,
}

/// The sticky-session cookie of `affinity: cookie` from the `session-cookie-*`
/// annotations, with ingress-nginx's defaults: `INGRESSCOOKIE`, the path's own Path,
/// HttpOnly, no lifetime (a session cookie); `session-cookie-max-age` or
/// `session-cookie-expires` (seconds) as Max-Age (which RFC 6265 has win over Expires, so
/// only Max-Age is sent), `session-cookie-secure`, `session-cookie-samesite`. None, with a
/// problem, when the name or path cannot be a cookie's.
fn affinity<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    invalid: &mut impl FnMut(&str, String),
) -> Option<(String, Option<String>, String)> {
    let name = get("session-cookie-name").unwrap_or("INGRESSCOOKIE");
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    if !token(name) {
        invalid(
            "session-cookie-name",
            format!("{name:?} is not a cookie name; no affinity"),
        );
        return None;
    }
    let path = match get("session-cookie-path") {
        Some(p) if p.starts_with('/') && p.bytes().all(|b| b.is_ascii_graphic() && b != b';') => {
            Some(p.to_owned())
        }
        Some(p) => {
            invalid(
                "session-cookie-path",
                format!("{p:?} is not a cookie path; no affinity"),
            );
            return None;
        }
        None => None,
    };
    let mut rest = String::new();
    let lifetime = ["session-cookie-max-age", "session-cookie-expires"]
        .into_iter()
        .find_map(|n| Some((n, get(n)?)));
    if let Some((n, seconds)) = lifetime {
        match seconds.parse::<u64>() {
            Ok(s) => rest.push_str(&format!("; Max-Age={s}")),
            Err(_) => invalid(
                n,
                format!("{seconds:?} is not seconds; a session cookie is set"),
            ),
        }
    }
    match get("session-cookie-samesite") {
        None => {}
        Some(v @ ("None" | "Lax" | "Strict")) => rest.push_str(&format!("; SameSite={v}")),
        Some(v) => invalid(
            "session-cookie-samesite",
            format!("{v:?} is not None, Lax or Strict; ignored"),
        ),
    }
    match get("session-cookie-secure").map(parse_bool) {
        Some(Some(true)) => rest.push_str("; Secure"),
        Some(Some(false)) | None => {}
        Some(None) => invalid(
            "session-cookie-secure",
            "is neither true nor false; ignored".into(),
        ),
    }
    match get("affinity-mode") {
        None | Some("balanced" | "persistent") => {}
        Some(m) => invalid(
            "affinity-mode",
            format!("{m:?} is not balanced or persistent; ignored"),
        ),
    }
    rest.push_str("; HttpOnly");
    Some((name.to_owned(), path, rest))
}

/// A canary Ingress (`canary: "true"`): its paths join the main Ingress's routes at the
/// same host, path and kind, taking the requests these say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Canary {
    /// Its share of the requests the header rule leaves, out of `total`
    /// (`canary-weight`, `canary-weight-total`).
    pub weight: u32,
    /// `canary-weight-total` (100 by default).
    pub total: u32,
    /// `canary-by-header` (lower case): its value `always` sends a request to the canary,
    /// `never` to the main backend; with `canary-by-header-value`, that value alone sends it
    /// to the canary. Other values are left to the weight.
    pub header: Option<(String, Option<String>)>,
    /// `canary-by-cookie`: that cookie's value `always` sends a request to the canary,
    /// `never` to the main backend (after the header rule, before the weight).
    pub cookie: Option<String>,
    /// `canary-by-header-pattern` (without `-value`): a header value matching this
    /// regular expression sends a request to the canary (`always` and `never` are then
    /// not special).
    pub header_pattern: Option<String>,
}

/// What [`read`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Read {
    /// The filters.
    pub filters: NginxFilters,
    /// Set for a canary Ingress (whose other annotations are its main Ingress's).
    pub canary: Option<Canary>,
    /// Its paths are regular expressions (`use-regex`, or `rewrite-target`, which implies
    /// it).
    pub regex: bool,
    /// `ssl-redirect` (None: not set).
    pub ssl_redirect: Option<bool>,
    /// `backend-protocol` and `proxy-ssl-*`: how its backends are spoken to (their names
    /// say so: [`super::rules::backend_ref`]).
    pub speaks: Speaks,
    /// What was not served, and why.
    pub problems: Vec<(ProblemReason, String)>,
}

impl NginxFilters {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == NginxFilters::default()
    }

    /// Gives `r` (an entry of one of the Ingress's paths) these filters.
    pub fn apply(&self, r: &mut GatewayRoute) {
        r.https_redirect |= self.force_ssl_redirect;
        if let Some(why) = &self.refused_protocol {
            for b in &mut r.backends {
                b.backend.clear();
                b.unresolved.clone_from(why);
            }
        }
        if let Some(redirect) = &self.redirect {
            // Answered here: nothing is forwarded, so nothing else applies.
            r.redirect = Some(redirect.clone());
            r.backends.clear();
            return;
        }
        if let Some(host) = &self.upstream_vhost {
            r.rewrite.get_or_insert_with(UrlRewrite::default).hostname = host.clone();
        }
        if let Some(target) = &self.rewrite_target {
            r.rewrite.get_or_insert_with(UrlRewrite::default).path = Some(PathModifier {
                full: true,
                value: target.clone(),
                captures: true,
            });
        }
        if let Some(prefix) = &self.forwarded_prefix {
            r.request_headers
                .get_or_insert_with(HeaderModifier::default)
                .set
                .push(HeaderMatch {
                    name: "x-forwarded-prefix".into(),
                    value: prefix.clone(),
                });
        }
        if let Some(cors) = &self.cors {
            r.cors = Some(cors.clone());
        }
        r.allow_sources.clone_from(&self.allow_sources);
        r.deny_sources.clone_from(&self.deny_sources);
        r.max_body_bytes = self.max_body_bytes.unwrap_or(0);
        if let Some(t) = &self.timeouts {
            r.timeouts = Some(*t);
        }
        if let Some((rps, burst)) = self.rate_limit {
            r.limit_rps = rps;
            r.limit_burst = burst;
        }
        r.limit_connections = self.limit_connections.unwrap_or(0);
        if let Some((name, path, rest)) = &self.affinity {
            // ingress-nginx's default Path is the Ingress path's (a regular expression's
            // is no cookie path: "/").
            let path = path.clone().unwrap_or_else(|| {
                if r.match_kind == MatchKind::Regex as i32 {
                    "/".to_owned()
                } else {
                    r.path.clone()
                }
            });
            r.affinity = Some(holdfast_proto::v1::Affinity {
                cookie_name: name.clone(),
                attributes: format!("; Path={path}{rest}"),
            });
        }
    }
}

/// Gives the entries of Ingress host `g` the filters of the Ingress each comes from
/// (`filters_of`), and adds the `app-root` entries of `ingresses` (oldest first) ahead of
/// the others (entries stay in the Ingress order: Exact first, longer paths first).
pub(super) fn apply_to_host<'a>(
    g: &mut GatewayHost,
    ingresses: impl Iterator<Item = (&'a IngressRef, &'a NginxFilters)> + Clone,
) {
    let filters_of = |source: Option<&IngressRef>| {
        let source = source?;
        ingresses
            .clone()
            .find(|(i, _)| i.namespace == source.namespace && i.name == source.name)
            .map(|(_, f)| f)
    };
    for r in &mut g.routes {
        if let Some(f) = filters_of(r.ingress.as_ref()) {
            f.apply(r);
        }
    }
    let mut roots: Vec<GatewayRoute> = ingresses
        .filter_map(|(source, f)| {
            let root = f.app_root.as_ref()?;
            let mut r = GatewayRoute {
                match_kind: MatchKind::Exact as i32,
                path: "/".into(),
                ingress: Some(source.clone()),
                ..GatewayRoute::default()
            };
            r.https_redirect = f.force_ssl_redirect;
            r.redirect = Some(RequestRedirect {
                status_code: 302,
                path: Some(PathModifier {
                    full: true,
                    value: root.clone(),
                    captures: false,
                }),
                // nginx's `return 302 <url>` adds nothing of the request.
                drop_query: true,
                ..RequestRedirect::default()
            });
            Some(r)
        })
        .collect();
    if !roots.is_empty() {
        roots.append(&mut g.routes);
        g.routes = roots;
        super::sort_ingress_routes(&mut g.routes);
    }
}

/// Reads the ingress-nginx annotations of `annotations` (all of an Ingress's; others are
/// left alone). `on`: `--ingress-nginx-annotations`.
pub fn read(annotations: &BTreeMap<String, String>, on: bool) -> Read {
    let ours: BTreeMap<&str, &str> = annotations
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(PREFIX)?, v.as_str())))
        .collect();
    if ours.is_empty() {
        return Read::default();
    }
    let mut problems = Vec::new();
    let mut filters = NginxFilters::default();
    if !on {
        let names: Vec<&str> = ours.keys().copied().collect();
        problems.push((
            ProblemReason::UnservedAnnotation,
            format!(
                "ingress-nginx annotations ignored ({}): --ingress-nginx-annotations is off",
                names.join(", ")
            ),
        ));
        return Read {
            problems,
            ..Read::default()
        };
    }
    let mut problem = |reason, message: String| problems.push((reason, message));
    for (name, _) in ours.iter().filter(|(n, _)| !SERVED.contains(n)) {
        if name.ends_with("-snippet") {
            problem(
                ProblemReason::SnippetRefused,
                format!(
                    "{PREFIX}{name} refused: raw nginx configuration is never applied (it would let an Ingress inject configuration into proxies every tenant shares)"
                ),
            );
        } else {
            problem(
                ProblemReason::UnservedAnnotation,
                format!(
                    "{PREFIX}{name} is not served by holdfast and is ignored; docs/ingress-nginx.md lists what is"
                ),
            );
        }
    }
    let get = |name: &str| ours.get(name).map(|v| v.trim());
    let mut invalid = |name: &str, why: String| {
        problems.push((
            ProblemReason::InvalidAnnotation,
            format!("{PREFIX}{name}: {why}"),
        ));
    };
    let boolean = |name: &str, invalid: &mut dyn FnMut(&str, String)| {
        let value = get(name)?;
        let read = parse_bool(value);
        if read.is_none() {
            invalid(
                name,
                format!("{value:?} is neither true nor false; ignored"),
            );
        }
        read
    };
    if boolean("canary", &mut invalid) == Some(true) {
        let canary = read_canary(&get, &mut invalid);
        // A canary takes its main Ingress's annotations (as in ingress-nginx): its own
        // are not applied, and it hears so.
        for name in ours
            .keys()
            .filter(|n| SERVED.contains(n) && !n.starts_with("canary") && **n != "use-regex")
        {
            invalid(
                name,
                "ignored on a canary Ingress: its paths take the main Ingress's annotations".into(),
            );
        }
        // Its paths are read as regular expressions when it says so (to join a main
        // Ingress's on a host with use-regex).
        let regex =
            boolean("use-regex", &mut invalid) == Some(true) || get("rewrite-target").is_some();
        return Read {
            canary: Some(canary),
            regex,
            problems,
            ..Read::default()
        };
    } else if let Some(name) = ours.keys().find(|n| n.starts_with("canary-")) {
        invalid(
            name,
            "ignored: canary is not \"true\" (as in ingress-nginx)".into(),
        );
    }
    // Redirects: temporal-redirect wins over permanent-redirect, as in ingress-nginx.
    for (name, code_name, default) in [
        ("temporal-redirect", "temporal-redirect-code", 302),
        ("permanent-redirect", "permanent-redirect-code", 301),
    ] {
        let Some(url) = get(name).filter(|u| !u.is_empty()) else {
            continue;
        };
        if !is_absolute_url(url) || url.contains('$') {
            invalid(
                name,
                format!(
                    "{url:?} is not an absolute http or https URL without nginx variables; ignored"
                ),
            );
            continue;
        }
        let code = match get(code_name) {
            None => default,
            Some(c) => match c.parse::<u32>() {
                Ok(c @ (301 | 302 | 303 | 307 | 308)) => c,
                _ => {
                    invalid(
                        code_name,
                        format!(
                            "{c:?} is not one of 301, 302, 303, 307 and 308; {default} is used"
                        ),
                    );
                    default
                }
            },
        };
        if filters.redirect.is_some() {
            invalid(
                name,
                "ignored: temporal-redirect is set too, and wins (as in ingress-nginx)".into(),
            );
            continue;
        }
        filters.redirect = Some(RequestRedirect {
            status_code: code,
            location: url.to_owned(),
            ..RequestRedirect::default()
        });
    }
    if let Some(root) = get("app-root") {
        if is_plain_path(root) {
            filters.app_root = Some(root.to_owned());
        } else {
            invalid(
                "app-root",
                format!(
                    "{root:?} is not a path (it starts with '/' and holds no whitespace, '?', '#' or '$'); ignored"
                ),
            );
        }
    }
    let ssl_redirect = boolean("ssl-redirect", &mut invalid);
    // backend-protocol: HTTP (its default) is HTTP/1.1 to the backends; GRPC and H2C are
    // HTTP/2 with prior knowledge (gRPC without TLS is h2c); HTTPS and GRPCS are the same
    // over TLS, made as the proxy-ssl-* annotations say.
    let (speaks, unserved_protocol) =
        backend_protocol(&get, &mut invalid, &mut filters.refused_protocol);
    let mut regex = boolean("use-regex", &mut invalid) == Some(true);
    if let Some(target) = get("rewrite-target") {
        // nginx variables besides $1-$9 are not expanded: refuse them.
        let variables = target
            .match_indices('$')
            .any(|(i, _)| !target[i + 1..].starts_with(|c: char| ('1'..='9').contains(&c)));
        if target.starts_with('/') && !variables && is_plain_path(&target.replace('$', "")) {
            filters.rewrite_target = Some(target.to_owned());
            regex = true;
        } else {
            invalid(
                "rewrite-target",
                format!(
                    "{target:?} is not a path (it starts with '/', holds no whitespace, '?' or '#', and no nginx variable but $1-$9); ignored"
                ),
            );
        }
    }
    filters.force_ssl_redirect = boolean("force-ssl-redirect", &mut invalid) == Some(true);
    if let Some(host) = get("upstream-vhost") {
        let lower = host.to_ascii_lowercase();
        if valid_authority(&lower) {
            filters.upstream_vhost = Some(lower);
        } else {
            invalid(
                "upstream-vhost",
                format!(
                    "{host:?} is not a host name (with an optional port); nginx variables are not served; ignored"
                ),
            );
        }
    }
    if let Some(prefix) = get("x-forwarded-prefix") {
        if !prefix.is_empty()
            && !prefix.contains('$')
            && http::HeaderValue::from_str(prefix).is_ok()
        {
            filters.forwarded_prefix = Some(prefix.to_owned());
        } else {
            invalid(
                "x-forwarded-prefix",
                format!("{prefix:?} is not a header value without nginx variables; ignored"),
            );
        }
    }
    // Source ranges. An entry that is not an address or CIDR fails closed: left out of an
    // allow list (fewer clients let through), and in a deny list it refuses every client.
    let cidrs = |name: &str, invalid: &mut dyn FnMut(&str, String)| {
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for entry in get(name).unwrap_or_default().split(',').map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            match cidr(entry) {
                Some(c) => out.push(c),
                None => bad.push(entry.to_owned()),
            }
        }
        if !bad.is_empty() {
            invalid(name, format!("{bad:?} are not addresses or CIDRs"));
        }
        (out, !bad.is_empty())
    };
    let (allow, _) = cidrs("whitelist-source-range", &mut invalid);
    let (mut deny, deny_bad) = cidrs("denylist-source-range", &mut invalid);
    if deny_bad {
        deny = vec!["0.0.0.0/0".into(), "::/0".into()];
        invalid(
            "denylist-source-range",
            "holds an entry that is not one: every client is refused until it is fixed".into(),
        );
    }
    if get("whitelist-source-range").is_some_and(|v| !v.trim().is_empty()) && allow.is_empty() {
        // Every entry was bad: nothing is allowed (never everything).
        deny = vec!["0.0.0.0/0".into(), "::/0".into()];
    }
    filters.allow_sources = allow;
    filters.deny_sources = deny;
    let mut timeouts = RouteTimeouts::default();
    for name in [
        "proxy-connect-timeout",
        "proxy-read-timeout",
        "proxy-send-timeout",
    ] {
        let Some(value) = get(name) else { continue };
        let seconds = value
            .strip_suffix('s')
            .unwrap_or(value)
            .parse::<u64>()
            .ok()
            .filter(|s| *s >= 1);
        let Some(mut seconds) = seconds else {
            invalid(
                name,
                format!("{value:?} is not a number of seconds; the proxy's is used"),
            );
            continue;
        };
        if seconds > MAX_TIMEOUT_SECONDS {
            invalid(
                name,
                format!("{value:?} is over {MAX_TIMEOUT_SECONDS} s; {MAX_TIMEOUT_SECONDS} is used"),
            );
            seconds = MAX_TIMEOUT_SECONDS;
        }
        let ms = seconds * 1000;
        match name {
            "proxy-connect-timeout" => timeouts.connect_ms = ms,
            "proxy-read-timeout" => timeouts.backend_request_ms = Some(ms),
            _ => timeouts.send_ms = ms,
        }
    }
    if timeouts != RouteTimeouts::default() {
        filters.timeouts = Some(timeouts);
    }
    if let Some(rps) = get("limit-rps") {
        let multiplier = match get("limit-burst-multiplier") {
            None => 5,
            Some(m) => m.parse::<u32>().ok().filter(|m| *m > 0).unwrap_or_else(|| {
                invalid(
                    "limit-burst-multiplier",
                    format!("{m:?} is not a positive number; 5 is used"),
                );
                5
            }),
        };
        match rps.parse::<u32>() {
            Ok(0) => {}
            Ok(n) if n <= MAX_RPS => {
                filters.rate_limit = Some((n, n.saturating_mul(multiplier)));
            }
            _ => invalid(
                "limit-rps",
                format!(
                    "{rps:?} is not a number of requests a second from 0 to {MAX_RPS}; no limit is applied"
                ),
            ),
        }
    } else if get("limit-burst-multiplier").is_some() {
        invalid(
            "limit-burst-multiplier",
            "ignored: it needs limit-rps".into(),
        );
    }
    if let Some(kind) = get("affinity") {
        if kind == "cookie" {
            filters.affinity = affinity(&get, &mut invalid);
        } else {
            invalid(
                "affinity",
                format!("{kind:?} is not \"cookie\", the one affinity served; ignored"),
            );
        }
    }
    if let Some(n) = get("limit-connections") {
        match n.parse::<u32>() {
            Ok(0) => {}
            Ok(n) => filters.limit_connections = Some(n),
            Err(_) => invalid(
                "limit-connections",
                format!("{n:?} is not a number of connections; no limit is applied"),
            ),
        }
    }
    if let Some(size) = get("proxy-body-size") {
        match nginx_size(size) {
            // 0: no limit of its own (nginx's `client_max_body_size 0`).
            Some(0) => {}
            Some(n) => filters.max_body_bytes = Some(n),
            None => invalid(
                "proxy-body-size",
                format!("{size:?} is not a size (a number, with k, m or g); ignored"),
            ),
        }
    }
    if boolean("enable-cors", &mut invalid) == Some(true) {
        filters.cors = Some(cors(&get, &mut invalid));
    } else if let Some(name) = ours.keys().find(|n| n.starts_with("cors-")) {
        invalid(
            name,
            "ignored: enable-cors is not \"true\" (as in ingress-nginx)".into(),
        );
    }
    if let Some(message) = unserved_protocol {
        problems.push((ProblemReason::UnservedAnnotation, message));
    }
    Read {
        filters,
        canary: None,
        regex,
        ssl_redirect,
        speaks,
        problems,
    }
}

/// `backend-protocol` with the `proxy-ssl-*` annotations: how the Ingress's backends are
/// spoken to, and the problem when they cannot be as asked (then `refused` is set: the
/// paths answer 500 rather than send in cleartext, or unverified, what was meant to go
/// over verified TLS).
fn backend_protocol<'v>(
    get: &impl Fn(&str) -> Option<&'v str>,
    invalid: &mut dyn FnMut(&str, String),
    refused: &mut Option<String>,
) -> (Speaks, Option<String>) {
    let protocol = get("backend-protocol").unwrap_or("HTTP");
    let (h2c, tls) = match protocol.to_ascii_uppercase().as_str() {
        "HTTP" => (false, false),
        "GRPC" | "H2C" => (true, false),
        "HTTPS" => (false, true),
        "GRPCS" => (true, true),
        _ => {
            *refused = Some(format!("backend-protocol {protocol} is not served"));
            return (
                Speaks::default(),
                Some(format!(
                    "{PREFIX}backend-protocol: {protocol:?} is not served (HTTP, HTTPS, GRPC, GRPCS and H2C are): the Ingress's paths answer 500"
                )),
            );
        }
    };
    let ssl = [
        "proxy-ssl-verify",
        "proxy-ssl-name",
        "proxy-ssl-server-name",
        "proxy-ssl-secret",
    ];
    if !tls {
        for name in ssl.iter().filter(|n| get(n).is_some()) {
            invalid(
                name,
                format!("ignored: backend-protocol is {protocol:?}, not HTTPS or GRPCS"),
            );
        }
        return (Speaks { h2c, tls: None }, None);
    }
    // proxy-ssl-verify: "off" by default, as in ingress-nginx: encrypted, not verified.
    // "on" checks the backend's certificate against proxy-ssl-secret's ca.crt.
    let secret = get("proxy-ssl-secret").filter(|v| !v.is_empty());
    let verify = match get("proxy-ssl-verify")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("off") => None,
        Some("on") if secret.is_some() => secret.map(str::to_owned),
        Some(value) => {
            *refused = Some(format!("proxy-ssl-verify {value} is not served"));
            let why = if value == "on" {
                "it needs proxy-ssl-secret, the Secret whose ca.crt the certificate is checked against"
            } else {
                "it is neither \"on\" nor \"off\""
            };
            return (
                Speaks::default(),
                Some(format!(
                    "{PREFIX}proxy-ssl-verify: {value:?} cannot be served ({why}): the Ingress's paths answer 500 rather than send to a backend whose certificate was meant to be checked"
                )),
            );
        }
    };
    if secret.is_some() {
        invalid(
            "proxy-ssl-secret",
            if verify.is_some() {
                "its ca.crt checks the backend's certificate; its tls.crt is not presented to the backend (client certificates to backends are not built)".into()
            } else {
                "ignored without proxy-ssl-verify: \"on\" (its ca.crt is used only to verify; its tls.crt is not presented to the backend: client certificates to backends are not built)".into()
            },
        );
    }
    let name = get("proxy-ssl-name").and_then(|n| {
        let lower = n.to_ascii_lowercase();
        let ok = !lower.is_empty()
            && lower
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b':')
            && rustls::pki_types::ServerName::try_from(lower.as_str()).is_ok();
        if !ok {
            invalid(
                "proxy-ssl-name",
                format!("{n:?} is not a DNS name or an IP address; ignored"),
            );
        }
        ok.then_some(lower)
    });
    let sni = match get("proxy-ssl-server-name")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("off") => false,
        Some("on") => true,
        Some(other) => {
            invalid(
                "proxy-ssl-server-name",
                format!("{other:?} is neither \"on\" nor \"off\"; off, its default"),
            );
            false
        }
    };
    (
        Speaks {
            h2c,
            tls: Some(TlsAsked { name, sni, verify }),
        },
        None,
    )
}

/// The canary rules of a `canary: "true"` Ingress, each defaulting as in ingress-nginx.
fn read_canary<'v>(
    get: &impl Fn(&str) -> Option<&'v str>,
    invalid: &mut dyn FnMut(&str, String),
) -> Canary {
    let total = match get("canary-weight-total") {
        None => 100,
        Some(v) => match v.parse::<u32>() {
            Ok(t) if t > 0 => t,
            _ => {
                invalid(
                    "canary-weight-total",
                    format!("{v:?} is not a positive number; 100 is used"),
                );
                100
            }
        },
    };
    let weight = match get("canary-weight") {
        None => 0,
        Some(v) => match v.parse::<u32>() {
            Ok(w) if w <= total => w,
            _ => {
                invalid(
                    "canary-weight",
                    format!("{v:?} is not a number from 0 to {total}; 0 is used"),
                );
                0
            }
        },
    };
    let header = match get("canary-by-header") {
        None => None,
        Some(name) => {
            let lower = name.to_ascii_lowercase();
            if http::HeaderName::from_bytes(lower.as_bytes()).is_ok() {
                let value = get("canary-by-header-value").filter(|v| !v.is_empty());
                match value {
                    Some(v) if http::HeaderValue::from_str(v).is_err() => {
                        invalid(
                            "canary-by-header-value",
                            format!("{v:?} is not a header value; the header rule is not applied"),
                        );
                        None
                    }
                    _ => Some((lower, value.map(str::to_owned))),
                }
            } else {
                invalid(
                    "canary-by-header",
                    format!("{name:?} is not a header name; not applied"),
                );
                None
            }
        }
    };
    let header_pattern = match (&header, get("canary-by-header-pattern")) {
        (_, None) => None,
        (Some((_, None)), Some(pattern)) => {
            match holdfast_proto::snapshot::header_pattern_regex(pattern) {
                Ok(_) => Some(pattern.to_owned()),
                Err(why) => {
                    invalid(
                        "canary-by-header-pattern",
                        format!("{pattern:?} {why}; not applied"),
                    );
                    None
                }
            }
        }
        (Some((_, Some(_))), Some(_)) => {
            invalid(
                "canary-by-header-pattern",
                "ignored: canary-by-header-value is set (as in ingress-nginx)".into(),
            );
            None
        }
        (None, Some(_)) => {
            invalid(
                "canary-by-header-pattern",
                "ignored: it needs canary-by-header".into(),
            );
            None
        }
    };
    let cookie = get("canary-by-cookie").and_then(|name| {
        let ok = !name.is_empty()
            && !name.contains('$')
            && http::HeaderName::from_bytes(name.as_bytes()).is_ok();
        if !ok {
            invalid(
                "canary-by-cookie",
                format!("{name:?} is not a cookie name; not applied"),
            );
        }
        ok.then(|| name.to_owned())
    });
    if header.is_none() && get("canary-by-header-value").is_some() {
        invalid(
            "canary-by-header-value",
            "ignored: it needs canary-by-header".into(),
        );
    }
    Canary {
        weight,
        total,
        header,
        cookie,
        header_pattern,
    }
}

/// The entries that replace `main` (an entry of the main Ingress, to its one backend)
/// when a canary to `backend` joins it, in precedence order: the header rule's, then the
/// weighted one (as ingress-nginx orders them: header, then weight).
pub fn with_canary(main: &GatewayRoute, backend: &str, canary: &Canary) -> Vec<GatewayRoute> {
    let to = |name: &str, weight: u32| WeightedBackend {
        backend: name.to_owned(),
        weight,
        ..WeightedBackend::default()
    };
    let on_header = |value: &str, backends: Vec<WeightedBackend>| {
        let mut r = main.clone();
        r.headers = vec![HeaderMatch {
            name: canary
                .header
                .as_ref()
                .map(|(n, _)| n.clone())
                .unwrap_or_default(),
            value: value.to_owned(),
        }];
        r.backends = backends;
        r
    };
    let on_cookie = |value: &str, backends: Vec<WeightedBackend>| {
        let mut r = main.clone();
        r.cookies = vec![HeaderMatch {
            name: canary.cookie.clone().unwrap_or_default(),
            value: value.to_owned(),
        }];
        r.backends = backends;
        r
    };
    let mut out = Vec::new();
    match &canary.header {
        None => {}
        Some((name, None)) if canary.header_pattern.is_some() => {
            let mut r = main.clone();
            r.header_patterns = vec![HeaderMatch {
                name: name.clone(),
                value: canary.header_pattern.clone().unwrap_or_default(),
            }];
            r.backends = vec![to(backend, 1)];
            out.push(r);
        }
        Some((_, Some(value))) => out.push(on_header(value, vec![to(backend, 1)])),
        Some((_, None)) => {
            out.push(on_header("always", vec![to(backend, 1)]));
            out.push(on_header("never", main.backends.clone()));
        }
    }
    if canary.cookie.is_some() {
        out.push(on_cookie("always", vec![to(backend, 1)]));
        out.push(on_cookie("never", main.backends.clone()));
    }
    let mut weighted = main.clone();
    if canary.weight > 0 {
        if let Some(b) = weighted.backends.first_mut() {
            b.weight = canary.total - canary.weight;
        }
        weighted.backends.push(to(backend, canary.weight));
    }
    out.push(weighted);
    out
}

/// The CORS filter of `enable-cors: "true"` with its `cors-*` annotations, each defaulting
/// as in ingress-nginx.
fn cors<'v>(get: &impl Fn(&str) -> Option<&'v str>, invalid: &mut dyn FnMut(&str, String)) -> Cors {
    let list = |value: &str| -> Vec<String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut origins = Vec::new();
    for origin in list(get("cors-allow-origin").unwrap_or("*")) {
        if origin == "*" || is_origin(&origin) {
            origins.push(origin.to_ascii_lowercase());
        } else {
            invalid(
                "cors-allow-origin",
                format!("{origin:?} is not * or an origin (scheme://host[:port]); left out"),
            );
        }
    }
    let mut credentials = match get("cors-allow-credentials").map(|v| (v, parse_bool(v))) {
        None => true,
        Some((_, Some(b))) => b,
        Some((other, None)) => {
            invalid(
                "cors-allow-credentials",
                format!("{other:?} is neither true nor false; true is used"),
            );
            true
        }
    };
    // ingress-nginx answers a `*` origin with a literal `*`, which browsers never accept
    // for a request with credentials. Echoing the origin with credentials instead would
    // let every site read a logged-in user's responses: with `*`, credentials are not
    // allowed (the same outcome in a browser as ingress-nginx's).
    if credentials && origins.iter().any(|o| o == "*") {
        credentials = false;
    }
    let max_age = match get("cors-max-age") {
        None => CORS_DEFAULT_MAX_AGE,
        Some(v) => v.parse().unwrap_or_else(|_| {
            invalid(
                "cors-max-age",
                format!("{v:?} is not a number of seconds; {CORS_DEFAULT_MAX_AGE} is used"),
            );
            CORS_DEFAULT_MAX_AGE
        }),
    };
    let token_list = |name: &str, default: &str, invalid: &mut dyn FnMut(&str, String)| {
        let mut out = Vec::new();
        for v in list(get(name).unwrap_or(default)) {
            if !v.contains('$') && http::HeaderName::from_bytes(v.as_bytes()).is_ok() {
                out.push(v);
            } else {
                invalid(name, format!("{v:?} is not a token; left out"));
            }
        }
        out
    };
    Cors {
        allow_origins: origins,
        allow_credentials: credentials,
        allow_methods: token_list("cors-allow-methods", CORS_DEFAULT_METHODS, invalid)
            .into_iter()
            .map(|m| m.to_ascii_uppercase())
            .collect(),
        allow_headers: token_list("cors-allow-headers", CORS_DEFAULT_HEADERS, invalid),
        expose_headers: token_list("cors-expose-headers", "", invalid),
        max_age_seconds: max_age,
    }
}

/// `s` (an address, or an address and prefix length) as a CIDR in its canonical form
/// (`10.0.0.1` → `10.0.0.1/32`; `10.0.0.1/8` → `10.0.0.0/8`).
fn cidr(s: &str) -> Option<String> {
    let net = match s.parse::<ipnet::IpNet>() {
        Ok(n) => n.trunc(),
        Err(_) => ipnet::IpNet::from(s.parse::<std::net::IpAddr>().ok()?),
    };
    Some(net.to_string())
}

/// Whether `s` is an absolute http or https URL with a host, usable as a `Location`.
fn is_absolute_url(s: &str) -> bool {
    s.parse::<http::Uri>()
        .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some())
        && http::HeaderValue::from_str(s).is_ok()
}

/// Whether `s` is a path a redirect can name: starts with `/`, no whitespace, query,
/// fragment or nginx variable.
fn is_plain_path(s: &str) -> bool {
    s.starts_with('/')
        && !s
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b"?#$".contains(&b))
        && http::uri::PathAndQuery::try_from(s).is_ok()
}

/// Whether `s` (lower case) is a host name, with an optional port.
fn valid_authority(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    holdfast_proto::snapshot::is_valid_host(host)
        && !host.is_empty()
        && !host.starts_with("*.")
        && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p != 0))
}

/// Whether `s` is an origin: `http(s)://host[:port]`, nothing after; the host may be a
/// wildcard `*.example.com` (one or more labels), as ingress-nginx allows.
fn is_origin(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once("://") else {
        return false;
    };
    let rest = rest.to_ascii_lowercase();
    let rest = rest.strip_prefix("*.").unwrap_or(&rest);
    matches!(scheme, "http" | "https") && valid_authority(rest)
}

/// An nginx size: bytes, or a number with `k`, `m` or `g` (either case).
fn nginx_size(s: &str) -> Option<u64> {
    let (digits, unit) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// A boolean as ingress-nginx reads one (Go's `strconv.ParseBool`).
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), (*v).to_owned()))
            .collect()
    }

    fn reasons(r: &Read) -> Vec<ProblemReason> {
        r.problems.iter().map(|(reason, _)| *reason).collect()
    }

    #[test]
    fn no_ingress_nginx_annotations_read_as_nothing() {
        let mut other = BTreeMap::new();
        other.insert("holdfast.dev/ssl-redirect".into(), "false".into());
        assert_eq!(read(&other, true), Read::default());
    }

    #[test]
    fn temporal_redirect_wins_over_permanent_and_codes_default_as_in_ingress_nginx() {
        let r = read(
            &annotations(&[("permanent-redirect", "https://example.org/new")]),
            true,
        );
        let d = r.filters.redirect.unwrap();
        assert_eq!(
            (d.status_code, d.location.as_str()),
            (301, "https://example.org/new")
        );
        let r = read(
            &annotations(&[
                ("permanent-redirect", "https://a.example/"),
                ("permanent-redirect-code", "308"),
                ("temporal-redirect", "http://b.example/x"),
            ]),
            true,
        );
        let d = r.filters.redirect.clone().unwrap();
        assert_eq!(
            (d.status_code, d.location.as_str()),
            (302, "http://b.example/x")
        );
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
        let r = read(
            &annotations(&[
                ("temporal-redirect", "http://b.example/x"),
                ("temporal-redirect-code", "399"),
            ]),
            true,
        );
        assert_eq!(r.filters.redirect.as_ref().unwrap().status_code, 302);
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
    }

    #[test]
    fn a_redirect_to_something_not_an_absolute_url_is_refused_with_a_problem() {
        for bad in [
            "/relative",
            "ftp://x.example/",
            "https://",
            "https://a.example/$uri x",
        ] {
            let r = read(&annotations(&[("permanent-redirect", bad)]), true);
            assert_eq!(r.filters.redirect, None, "{bad}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{bad}");
        }
    }

    #[test]
    fn unserved_annotations_are_problems_and_snippets_are_refused() {
        let r = read(
            &annotations(&[
                ("configuration-snippet", "more_set_headers \"X: y\";"),
                ("server-snippet", "location /x {}"),
                ("limit-rpm", "5"),
                ("upstream-vhost", "internal.example"),
            ]),
            true,
        );
        let mut got = reasons(&r);
        got.sort_by_key(|r| r.as_str());
        assert_eq!(
            got,
            [
                ProblemReason::SnippetRefused,
                ProblemReason::SnippetRefused,
                ProblemReason::UnservedAnnotation
            ]
        );
        assert!(r.problems.iter().any(|(_, m)| m.contains("limit-rpm")));
        assert_eq!(
            r.filters.upstream_vhost.as_deref(),
            Some("internal.example")
        );
    }

    #[test]
    fn with_the_flag_off_nothing_is_read_and_the_ingress_hears_so_once() {
        let r = read(
            &annotations(&[("upstream-vhost", "a.example"), ("enable-cors", "true")]),
            false,
        );
        assert!(r.filters.is_empty());
        assert_eq!(reasons(&r), [ProblemReason::UnservedAnnotation]);
        assert!(r.problems[0].1.contains("enable-cors, upstream-vhost"));
    }

    #[test]
    fn cors_defaults_are_ingress_nginx_s() {
        let r = read(&annotations(&[("enable-cors", "true")]), true);
        let c = r.filters.cors.unwrap();
        assert_eq!(c.allow_origins, ["*"]);
        // Credentials are ingress-nginx's default, but never with `*`: a browser refuses
        // ingress-nginx's literal `*` with credentials, and echoing the origin would let
        // every site read a logged-in user's responses.
        assert!(!c.allow_credentials);
        assert_eq!(
            c.allow_methods,
            ["GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"]
        );
        assert_eq!(
            c.allow_headers.join(","),
            CORS_DEFAULT_HEADERS,
            "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization"
        );
        assert!(c.expose_headers.is_empty());
        assert_eq!(c.max_age_seconds, 1_728_000);
        assert!(r.problems.is_empty());
        // With origins of its own, credentials default to true; a wildcard origin is one.
        let r = read(
            &annotations(&[
                ("enable-cors", "True"),
                ("cors-allow-origin", "https://*.example.com"),
            ]),
            true,
        );
        let c = r.filters.cors.unwrap();
        assert!(c.allow_credentials);
        assert_eq!(c.allow_origins, ["https://*.example.com"]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
    }

    #[test]
    fn booleans_read_as_ingress_nginx_reads_them_and_nginx_variables_are_refused() {
        for value in ["1", "t", "T", "TRUE", "true", "True"] {
            let r = read(&annotations(&[("force-ssl-redirect", value)]), true);
            assert!(r.filters.force_ssl_redirect, "{value}");
        }
        for value in ["0", "f", "F", "FALSE", "false", "False"] {
            let r = read(&annotations(&[("ssl-redirect", value)]), true);
            assert_eq!(r.ssl_redirect, Some(false), "{value}");
        }
        let r = read(&annotations(&[("ssl-redirect", "yes")]), true);
        assert_eq!((r.ssl_redirect, reasons(&r).len()), (None, 1));
        for (name, value) in [
            ("permanent-redirect", "https://new.example$request_uri"),
            ("temporal-redirect", "https://new.example/$1"),
            ("x-forwarded-prefix", "$scheme"),
        ] {
            let r = read(&annotations(&[(name, value)]), true);
            assert!(r.filters.is_empty(), "{name}: {value}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{name}");
        }
        let r = read(
            &annotations(&[
                ("enable-cors", "true"),
                ("cors-allow-headers", "x-a,$http_x"),
            ]),
            true,
        );
        assert_eq!(r.filters.cors.as_ref().unwrap().allow_headers, ["x-a"]);
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
    }

    #[test]
    fn cors_values_are_read_and_bad_ones_left_out_with_a_problem() {
        let r = read(
            &annotations(&[
                ("enable-cors", "true"),
                (
                    "cors-allow-origin",
                    "https://a.example, http://b.example:8080, nope",
                ),
                ("cors-allow-methods", "get,POST"),
                ("cors-allow-credentials", "false"),
                ("cors-max-age", "60"),
                ("cors-expose-headers", "x-total"),
            ]),
            true,
        );
        let c = r.filters.cors.clone().unwrap();
        assert_eq!(
            c.allow_origins,
            ["https://a.example", "http://b.example:8080"]
        );
        assert_eq!(c.allow_methods, ["GET", "POST"]);
        assert!(!c.allow_credentials);
        assert_eq!(c.max_age_seconds, 60);
        assert_eq!(c.expose_headers, ["x-total"]);
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
        // cors-* without enable-cors: not applied, and said so.
        let r = read(
            &annotations(&[("cors-allow-origin", "https://a.example")]),
            true,
        );
        assert_eq!(r.filters.cors, None);
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
    }

    #[test]
    fn app_root_ssl_redirects_upstream_vhost_and_prefix_are_read() {
        let r = read(
            &annotations(&[
                ("app-root", "/app1"),
                ("ssl-redirect", "false"),
                ("force-ssl-redirect", "true"),
                ("upstream-vhost", "Internal.Example:8080"),
                ("x-forwarded-prefix", "/api"),
            ]),
            true,
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.filters.app_root.as_deref(), Some("/app1"));
        assert_eq!(r.ssl_redirect, Some(false));
        assert!(r.filters.force_ssl_redirect);
        assert_eq!(
            r.filters.upstream_vhost.as_deref(),
            Some("internal.example:8080")
        );
        assert_eq!(r.filters.forwarded_prefix.as_deref(), Some("/api"));
        for (name, bad) in [
            ("app-root", "app1"),
            ("app-root", "/$host"),
            ("upstream-vhost", "$host"),
            ("ssl-redirect", "no"),
        ] {
            let r = read(&annotations(&[(name, bad)]), true);
            assert_eq!(
                reasons(&r),
                [ProblemReason::InvalidAnnotation],
                "{name}: {bad}"
            );
            assert!(
                r.filters.is_empty() && r.ssl_redirect.is_none(),
                "{name}: {bad}"
            );
        }
    }

    #[test]
    fn a_canary_reads_its_rules_with_ingress_nginx_s_defaults_and_nothing_else() {
        let r = read(
            &annotations(&[
                ("canary", "true"),
                ("canary-weight", "30"),
                ("canary-by-header", "X-Canary"),
                ("upstream-vhost", "ignored.example"),
                ("canary-by-cookie", "c"),
                ("limit-rpm", "3"),
            ]),
            true,
        );
        assert_eq!(
            r.canary,
            Some(Canary {
                weight: 30,
                total: 100,
                header: Some(("x-canary".into(), None)),
                cookie: Some("c".into()),
                header_pattern: None,
            })
        );
        assert!(
            r.filters.is_empty(),
            "a canary's own annotations are not applied"
        );
        let mut got = reasons(&r);
        got.sort_by_key(|r| r.as_str());
        assert_eq!(
            got,
            [
                ProblemReason::InvalidAnnotation,
                ProblemReason::UnservedAnnotation
            ]
        );
        let r = read(
            &annotations(&[
                ("canary", "true"),
                ("canary-weight", "7"),
                ("canary-weight-total", "10"),
                ("canary-by-header", "x-env"),
                ("canary-by-header-value", "beta"),
            ]),
            true,
        );
        assert_eq!(
            r.canary,
            Some(Canary {
                weight: 7,
                total: 10,
                header: Some(("x-env".into(), Some("beta".into()))),
                cookie: None,
                header_pattern: None,
            })
        );
        assert!(r.problems.is_empty());
        // Bad values: a weight over the total is 0; rules without canary: "true" are not
        // applied; each is said.
        let r = read(
            &annotations(&[("canary", "true"), ("canary-weight", "101")]),
            true,
        );
        assert_eq!(r.canary.as_ref().map(|c| c.weight), Some(0));
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
        let r = read(&annotations(&[("canary-weight", "50")]), true);
        assert_eq!(r.canary, None);
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
    }

    /// canary-by-header-pattern: a regular expression on the header's value, read only
    /// with canary-by-header and without -value; `always` and `never` are then not special.
    #[test]
    fn a_canary_header_pattern_replaces_always_and_never() {
        let r = read(
            &annotations(&[
                ("canary", "true"),
                ("canary-by-header", "X-Pat"),
                ("canary-by-header-pattern", "^be(ta|tter)$"),
            ]),
            true,
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let c = r.canary.unwrap();
        assert_eq!(c.header_pattern.as_deref(), Some("^be(ta|tter)$"));
        let main = GatewayRoute {
            path: "/".into(),
            backends: vec![WeightedBackend {
                backend: "ns/main:80".into(),
                weight: 1,
                ..Default::default()
            }],
            ..GatewayRoute::default()
        };
        let entries = with_canary(&main, "ns/canary:80", &c);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].header_patterns[0].name, "x-pat");
        assert_eq!(entries[0].backends[0].backend, "ns/canary:80");
        assert!(entries[0].headers.is_empty() && entries[1].header_patterns.is_empty());
        for (pairs, why) in [
            (
                vec![
                    ("canary-by-header", "x"),
                    ("canary-by-header-value", "v"),
                    ("canary-by-header-pattern", "v"),
                ],
                "with -value",
            ),
            (
                vec![("canary-by-header-pattern", "v")],
                "without the header",
            ),
            (
                vec![("canary-by-header", "x"), ("canary-by-header-pattern", "(")],
                "not a regex",
            ),
        ] {
            let mut all = vec![("canary", "true")];
            all.extend(pairs);
            let r = read(&annotations(&all), true);
            assert_eq!(r.canary.as_ref().unwrap().header_pattern, None, "{why}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{why}");
        }
    }

    #[test]
    fn a_canary_joins_its_main_entry_header_rules_first_then_by_weight() {
        let main = GatewayRoute {
            match_kind: MatchKind::Prefix as i32,
            path: "/".into(),
            backends: vec![WeightedBackend {
                backend: "ns/main:80".into(),
                weight: 1,
                ..Default::default()
            }],
            ..GatewayRoute::default()
        };
        /// Per entry: its header matches and its weighted backends.
        type Shape = Vec<(Vec<String>, Vec<(String, u32)>)>;
        let shape = |entries: Vec<GatewayRoute>| -> Shape {
            entries
                .into_iter()
                .map(|r| {
                    (
                        r.headers
                            .iter()
                            .map(|h| format!("{}={}", h.name, h.value))
                            .collect(),
                        r.backends
                            .iter()
                            .map(|b| (b.backend.clone(), b.weight))
                            .collect(),
                    )
                })
                .collect()
        };
        let canary = |weight, header: Option<(&str, Option<&str>)>| Canary {
            weight,
            total: 100,
            header: header.map(|(n, v)| (n.to_owned(), v.map(str::to_owned))),
            cookie: None,
            header_pattern: None,
        };
        let main_only = vec![("ns/main:80".to_owned(), 1)];
        let canary_only = vec![("ns/canary:80".to_owned(), 1)];
        assert_eq!(
            shape(with_canary(&main, "ns/canary:80", &canary(25, None))),
            [(
                vec![],
                vec![
                    ("ns/main:80".to_owned(), 75),
                    ("ns/canary:80".to_owned(), 25)
                ]
            )]
        );
        assert_eq!(
            shape(with_canary(
                &main,
                "ns/canary:80",
                &canary(0, Some(("x-c", None)))
            )),
            [
                (vec!["x-c=always".to_owned()], canary_only.clone()),
                (vec!["x-c=never".to_owned()], main_only.clone()),
                (vec![], main_only.clone()),
            ]
        );
        assert_eq!(
            shape(with_canary(
                &main,
                "ns/canary:80",
                &canary(0, Some(("x-c", Some("beta"))))
            )),
            [
                (vec!["x-c=beta".to_owned()], canary_only.clone()),
                (vec![], main_only.clone()),
            ]
        );
        // canary-by-cookie: after the header rule, before the weight.
        let mut by_cookie = canary(10, Some(("x-c", Some("beta"))));
        by_cookie.cookie = Some("c".into());
        let entries = with_canary(&main, "ns/canary:80", &by_cookie);
        let cookies: Vec<Vec<String>> = entries
            .iter()
            .map(|r| {
                r.cookies
                    .iter()
                    .map(|c| format!("{}={}", c.name, c.value))
                    .collect()
            })
            .collect();
        assert_eq!(
            cookies,
            [
                vec![],
                vec!["c=always".to_owned()],
                vec!["c=never".to_owned()],
                vec![]
            ]
        );
        assert_eq!(
            shape(entries),
            [
                (vec!["x-c=beta".to_owned()], canary_only.clone()),
                (vec![], canary_only),
                (vec![], main_only),
                (
                    vec![],
                    vec![
                        ("ns/main:80".to_owned(), 90),
                        ("ns/canary:80".to_owned(), 10)
                    ]
                ),
            ]
        );
    }

    #[test]
    fn rewrite_target_implies_regex_paths_and_refuses_nginx_variables() {
        let r = read(&annotations(&[("rewrite-target", "/$2")]), true);
        assert!(r.regex, "rewrite-target implies use-regex");
        assert_eq!(r.filters.rewrite_target.as_deref(), Some("/$2"));
        assert!(r.problems.is_empty());
        let r = read(&annotations(&[("use-regex", "true")]), true);
        assert!(r.regex && r.filters.is_empty());
        for bad in ["/$host/x", "new", "/a b", "/$0"] {
            let r = read(&annotations(&[("rewrite-target", bad)]), true);
            assert_eq!(r.filters.rewrite_target, None, "{bad}");
            assert!(!r.regex, "{bad}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{bad}");
        }
        // Applied: the full path replaced, with the groups.
        let mut e = GatewayRoute::default();
        read(&annotations(&[("rewrite-target", "/$1")]), true)
            .filters
            .apply(&mut e);
        let m = e.rewrite.unwrap().path.unwrap();
        assert!(m.full && m.captures && m.value == "/$1");
        // With a redirect nothing is forwarded: no rewrite (a snapshot refuses groups on a
        // redirect).
        let mut e = GatewayRoute::default();
        read(
            &annotations(&[
                ("rewrite-target", "/$1"),
                ("permanent-redirect", "https://a.example/"),
                ("upstream-vhost", "b.example"),
            ]),
            true,
        )
        .filters
        .apply(&mut e);
        assert!(e.redirect.is_some() && e.rewrite.is_none());
    }

    #[test]
    fn source_ranges_are_canonical_cidrs_and_a_bad_entry_fails_closed() {
        let r = read(
            &annotations(&[
                (
                    "whitelist-source-range",
                    "10.0.0.1/8, 192.0.2.7 ,2001:db8::/32",
                ),
                ("denylist-source-range", "10.9.0.0/16"),
            ]),
            true,
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(
            r.filters.allow_sources,
            ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32"]
        );
        assert_eq!(r.filters.deny_sources, ["10.9.0.0/16"]);
        let mut e = GatewayRoute::default();
        r.filters.apply(&mut e);
        assert_eq!(e.allow_sources.len(), 3);
        assert_eq!(e.deny_sources, ["10.9.0.0/16"]);
        // A bad allow entry is left out (fewer let through); a bad deny entry, or an allow
        // list with nothing valid, refuses everyone.
        let r = read(
            &annotations(&[("whitelist-source-range", "10.0.0.0/8, nope")]),
            true,
        );
        assert_eq!(r.filters.allow_sources, ["10.0.0.0/8"]);
        assert!(r.filters.deny_sources.is_empty());
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
        for (name, value) in [
            ("denylist-source-range", "10.0.0.0/8, 300.1.1.1"),
            ("whitelist-source-range", "nope"),
        ] {
            let r = read(&annotations(&[(name, value)]), true);
            assert_eq!(r.filters.deny_sources, ["0.0.0.0/0", "::/0"], "{name}");
            assert!(!r.problems.is_empty(), "{name}");
        }
    }

    #[test]
    fn proxy_body_size_reads_nginx_sizes_and_0_leaves_the_proxy_s_limit() {
        for (value, want) in [
            ("12", Some(12)),
            ("100k", Some(100 << 10)),
            ("8m", Some(8 << 20)),
            ("1G", Some(1 << 30)),
            ("0", None),
        ] {
            let r = read(&annotations(&[("proxy-body-size", value)]), true);
            assert_eq!(r.filters.max_body_bytes, want, "{value}");
            assert!(r.problems.is_empty(), "{value}");
        }
        for bad in ["1.5m", "m", "-1", "99999999999999999999g"] {
            let r = read(&annotations(&[("proxy-body-size", bad)]), true);
            assert_eq!(r.filters.max_body_bytes, None, "{bad}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{bad}");
        }
        let mut e = GatewayRoute::default();
        read(&annotations(&[("proxy-body-size", "2k")]), true)
            .filters
            .apply(&mut e);
        assert_eq!(e.max_body_bytes, 2048);
    }

    #[test]
    fn proxy_timeouts_are_seconds_and_each_replaces_the_proxy_s_own() {
        let r = read(
            &annotations(&[
                ("proxy-connect-timeout", "3"),
                ("proxy-read-timeout", "120s"),
                ("proxy-send-timeout", "7"),
            ]),
            true,
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let t = r.filters.timeouts.unwrap();
        assert_eq!(
            (t.connect_ms, t.backend_request_ms, t.send_ms, t.request_ms),
            (3000, Some(120_000), 7000, None)
        );
        let mut e = GatewayRoute::default();
        r.filters.apply(&mut e);
        assert_eq!(e.timeouts, Some(t));
        for bad in ["0", "-1", "1.5", "ten"] {
            let r = read(&annotations(&[("proxy-read-timeout", bad)]), true);
            assert_eq!(r.filters.timeouts, None, "{bad}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{bad}");
        }
        // Over an hour (86400 is common, for WebSockets): an hour, said so.
        let r = read(&annotations(&[("proxy-read-timeout", "86400")]), true);
        assert_eq!(
            r.filters.timeouts.and_then(|t| t.backend_request_ms),
            Some(3_600_000)
        );
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
    }

    #[test]
    fn affinity_cookie_has_ingress_nginx_s_defaults_and_the_session_cookie_attributes() {
        let affinity_of = |a: &[(&str, &str)], path: &str| {
            let r = read(&annotations(a), true);
            let mut route = GatewayRoute {
                path: path.into(),
                match_kind: MatchKind::Prefix as i32,
                ..Default::default()
            };
            r.filters.apply(&mut route);
            (route.affinity, reasons(&r))
        };
        let (a, problems) = affinity_of(&[("affinity", "cookie")], "/app");
        let a = a.expect("affinity");
        assert_eq!(a.cookie_name, "INGRESSCOOKIE");
        assert_eq!(a.attributes, "; Path=/app; HttpOnly");
        assert!(problems.is_empty());
        let (a, problems) = affinity_of(
            &[
                ("affinity", "cookie"),
                ("session-cookie-name", "route"),
                ("session-cookie-path", "/"),
                ("session-cookie-expires", "172800"),
                ("session-cookie-max-age", "3600"),
                ("session-cookie-samesite", "Lax"),
                ("session-cookie-secure", "true"),
                ("affinity-mode", "persistent"),
            ],
            "/app",
        );
        let a = a.expect("affinity");
        assert_eq!(a.cookie_name, "route");
        assert_eq!(
            a.attributes,
            "; Path=/; Max-Age=3600; SameSite=Lax; Secure; HttpOnly"
        );
        assert!(problems.is_empty());
        for bad in [
            [("affinity", "ip"), ("session-cookie-name", "x")],
            [("affinity", "cookie"), ("session-cookie-name", "a b")],
            [("affinity", "cookie"), ("session-cookie-path", "no-slash")],
        ] {
            let (a, problems) = affinity_of(&bad, "/");
            assert_eq!(a, None, "{bad:?}");
            assert_eq!(problems, [ProblemReason::InvalidAnnotation], "{bad:?}");
        }
    }

    #[test]
    fn limit_connections_is_a_positive_count_and_anything_else_is_a_problem() {
        let r = read(&annotations(&[("limit-connections", "3")]), true);
        assert_eq!(r.filters.limit_connections, Some(3));
        assert!(r.problems.is_empty());
        let mut route = GatewayRoute::default();
        r.filters.apply(&mut route);
        assert_eq!(route.limit_connections, 3);
        let r = read(&annotations(&[("limit-connections", "0")]), true);
        assert_eq!(r.filters.limit_connections, None, "0: no limit");
        for bad in ["-1", "lots", "1.5"] {
            let r = read(&annotations(&[("limit-connections", bad)]), true);
            assert_eq!(r.filters.limit_connections, None, "{bad}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{bad}");
        }
    }

    #[test]
    fn limit_rps_bursts_five_times_by_default() {
        let r = read(&annotations(&[("limit-rps", "10")]), true);
        assert_eq!(r.filters.rate_limit, Some((10, 50)));
        let r = read(
            &annotations(&[("limit-rps", "10"), ("limit-burst-multiplier", "2")]),
            true,
        );
        assert_eq!(r.filters.rate_limit, Some((10, 20)));
        let mut e = GatewayRoute::default();
        r.filters.apply(&mut e);
        assert_eq!((e.limit_rps, e.limit_burst), (10, 20));
        for bad in ["-1", "ten", "1.5"] {
            let r = read(&annotations(&[("limit-rps", bad)]), true);
            assert_eq!(r.filters.rate_limit, None, "{bad}");
            assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation], "{bad}");
        }
    }

    #[test]
    fn backend_protocols_are_served_over_tls_as_proxy_ssl_says_and_others_answer_500_never_cleartext()
     {
        let tls = |name: Option<&str>, sni| {
            Some(TlsAsked {
                name: name.map(str::to_owned),
                sni,
                verify: None,
            })
        };
        for (pairs, h2c, want_tls) in [
            (vec![("backend-protocol", "HTTP")], false, None),
            (vec![("backend-protocol", "http")], false, None),
            (vec![("backend-protocol", "GRPC")], true, None),
            (vec![("backend-protocol", "h2c")], true, None),
            (vec![("backend-protocol", "HTTPS")], false, tls(None, false)),
            (
                vec![("backend-protocol", "GRPCS"), ("proxy-ssl-verify", "off")],
                true,
                tls(None, false),
            ),
            (
                vec![
                    ("backend-protocol", "HTTPS"),
                    ("proxy-ssl-name", "Web.Internal"),
                    ("proxy-ssl-server-name", "on"),
                ],
                false,
                tls(Some("web.internal"), true),
            ),
        ] {
            let r = read(&annotations(&pairs), true);
            assert!(r.problems.is_empty() && r.filters.is_empty(), "{pairs:?}");
            assert_eq!(r.speaks.h2c, h2c, "{pairs:?}");
            assert_eq!(r.speaks.tls, want_tls, "{pairs:?}");
        }
        // Verified with proxy-ssl-secret's ca.crt; that its tls.crt is not presented is
        // said.
        let r = read(
            &annotations(&[
                ("backend-protocol", "HTTPS"),
                ("proxy-ssl-verify", "on"),
                ("proxy-ssl-secret", "ns/upstream"),
            ]),
            true,
        );
        assert_eq!(
            r.speaks.tls.as_ref().and_then(|t| t.verify.as_deref()),
            Some("ns/upstream")
        );
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
        assert!(r.filters.is_empty());
        // A bad name or SNI switch is a problem, and the rest stands.
        let r = read(
            &annotations(&[
                ("backend-protocol", "HTTPS"),
                ("proxy-ssl-name", "not a name"),
                ("proxy-ssl-server-name", "yes"),
            ]),
            true,
        );
        assert_eq!(r.speaks.tls, tls(None, false));
        assert_eq!(
            reasons(&r),
            [
                ProblemReason::InvalidAnnotation,
                ProblemReason::InvalidAnnotation
            ]
        );
        // proxy-ssl-* without TLS is said to do nothing.
        let r = read(&annotations(&[("proxy-ssl-name", "a.test")]), true);
        assert_eq!(reasons(&r), [ProblemReason::InvalidAnnotation]);
        assert_eq!(r.speaks, Speaks::default());
        for pairs in [
            vec![("backend-protocol", "AJP")],
            vec![("backend-protocol", "HTTPS"), ("proxy-ssl-verify", "on")],
            vec![("backend-protocol", "GRPCS"), ("proxy-ssl-verify", "maybe")],
        ] {
            let r = read(&annotations(&pairs), true);
            assert_eq!(
                reasons(&r),
                [ProblemReason::UnservedAnnotation],
                "{pairs:?}"
            );
            // Never sent in cleartext or unverified: the entry's backends do not resolve
            // (500).
            let mut e = GatewayRoute {
                backends: vec![WeightedBackend {
                    backend: "ns/web:443".into(),
                    weight: 1,
                    ..Default::default()
                }],
                ..GatewayRoute::default()
            };
            r.filters.apply(&mut e);
            assert!(e.backends[0].backend.is_empty(), "{pairs:?}");
            assert!(!e.backends[0].unresolved.is_empty(), "{pairs:?}");
        }
    }

    #[test]
    fn filters_change_each_entry_and_app_root_adds_a_redirect_of_slash_first() {
        let source = IngressRef {
            namespace: "ns".into(),
            name: "a".into(),
        };
        let other = IngressRef {
            namespace: "ns".into(),
            name: "b".into(),
        };
        let entry = |path: &str, ingress: &IngressRef| GatewayRoute {
            match_kind: MatchKind::Prefix as i32,
            path: path.into(),
            backends: vec![holdfast_proto::v1::WeightedBackend {
                backend: "ns/web:80".into(),
                weight: 1,
                ..Default::default()
            }],
            ingress: Some(ingress.clone()),
            ..GatewayRoute::default()
        };
        let mut g = GatewayHost {
            routes: vec![entry("/api", &source), entry("/", &other)],
            ..GatewayHost::default()
        };
        let filters = read(
            &annotations(&[
                ("app-root", "/app1"),
                ("upstream-vhost", "internal.example"),
                ("x-forwarded-prefix", "/api"),
            ]),
            true,
        )
        .filters;
        let none = NginxFilters::default();
        apply_to_host(&mut g, [(&source, &filters), (&other, &none)].into_iter());
        let paths: Vec<_> = g
            .routes
            .iter()
            .map(|r| (r.match_kind, r.path.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                (MatchKind::Exact as i32, "/"),
                (MatchKind::Prefix as i32, "/api"),
                (MatchKind::Prefix as i32, "/")
            ]
        );
        let root = g.routes[0].redirect.as_ref().unwrap();
        assert_eq!(root.status_code, 302);
        assert_eq!(root.path.as_ref().unwrap().value, "/app1");
        assert!(g.routes[0].backends.is_empty());
        assert_eq!(
            g.routes[1].rewrite.as_ref().unwrap().hostname,
            "internal.example"
        );
        assert_eq!(
            g.routes[1].request_headers.as_ref().unwrap().set[0].value,
            "/api"
        );
        // The other Ingress's entry is left as it was.
        assert_eq!(g.routes[2], entry("/", &other));
    }
}
