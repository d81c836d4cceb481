//! Rules both planes apply to a snapshot: its identity (content hash and version), its
//! ordering, and its consistency. The control plane seals and validates a snapshot before
//! publishing it; the proxy validates it again before applying it (docs/design.md, invariant 4).
//!
//! # Version rule
//! - `content_hash` = SHA-256 (hex) of the LtHash16 sum of the snapshot's resource hashes
//!   (each SHA-256 over a resource's kind and protobuf encoding; [`crate::content`]). It
//!   covers every content field (5 to 9, 11 and 12) and none of the identity fields; it does not
//!   depend on the order resources are listed in, and either plane updates it in O(1) per
//!   changed resource. prost encodes fields in tag order and the translator sorts every
//!   list inside a resource, so the same content gives the same hash on every replica.
//! - `progress` = per watched kind, the resourceVersion up to which the control plane's
//!   watch of that kind had delivered every change when it built the snapshot (the list's
//!   resourceVersion, then each event's and bookmark's).
//! - `cluster_revision` = the highest of those: one number for display.
//! - `version` = `"<cluster_revision>-<first 16 hex digits of content_hash>"`.
//! - Ordering: a proxy accepts a snapshot only if it is behind the one it serves for no
//!   kind ([`check_not_older`]), so it never moves back to an older view of any kind,
//!   even after reconnecting to a control-plane replica whose watch of one kind lags. One
//!   ahead for some kinds and behind for others is waited out.

use std::collections::HashSet;

use foldhash::fast::RandomState;

use crate::v1::{
    GatewayHost, GatewayListener, GatewayRoute, KindProgress, MatchKind, Route, Snapshot,
    VirtualHost, WeightedBackend,
};

/// Why a snapshot is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSnapshot {
    /// A route (or the default backend) names a backend the snapshot does not contain.
    #[error("route {host}{path} names backend {backend:?}, which is not in the snapshot")]
    MissingBackend {
        /// Virtual host of the route ("" for the default backend).
        host: String,
        /// Path of the route.
        path: String,
        /// The missing backend's name.
        backend: String,
    },
    /// Two backends share a name.
    #[error("backend {0:?} appears twice")]
    DuplicateBackend(String),
    /// A virtual host (or the default certificate) names a certificate the snapshot does
    /// not contain.
    #[error(
        "virtual host {host:?} names certificate {certificate:?}, which is not in the snapshot"
    )]
    MissingCertificate {
        /// The virtual host ("" for the default certificate).
        host: String,
        /// The missing certificate's name.
        certificate: String,
    },
    /// Two certificates share a name.
    #[error("certificate {0:?} appears twice")]
    DuplicateCertificate(String),
    /// A virtual host redirects to HTTPS but has no certificate.
    #[error("virtual host {0:?} redirects to https but has no certificate")]
    RedirectWithoutCertificate(String),
    /// Two virtual hosts share a host.
    #[error("virtual host {0:?} appears twice")]
    DuplicateHost(String),
    /// A host is not a lower-case DNS name, a one-label wildcard or "".
    #[error("virtual host {0:?} is not a valid host")]
    BadHost(String),
    /// A route's path or match kind is malformed.
    #[error("route {host}{path}: {reason}")]
    BadRoute {
        /// Virtual host of the route.
        host: String,
        /// Path of the route.
        path: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The stated hash does not match the content.
    #[error("content hash {stated} does not match the content ({computed})")]
    HashMismatch {
        /// Hash the snapshot states.
        stated: String,
        /// Hash of its content.
        computed: String,
    },
    /// The version is not `<cluster_revision>-<hash prefix>`.
    #[error("version {version:?} does not match revision {revision} and the content hash")]
    BadVersion {
        /// Version the snapshot states.
        version: String,
        /// Its cluster revision.
        revision: u64,
    },
    /// The snapshot reflects an older cluster state than the one being served.
    #[error(
        "snapshot {offered} is older than the one in use ({held}): cluster revision {offered_revision} < {held_revision}"
    )]
    Older {
        /// Offered version.
        offered: String,
        /// Offered cluster revision.
        offered_revision: u64,
        /// Version in use.
        held: String,
        /// Cluster revision in use.
        held_revision: u64,
    },
    /// The snapshot is behind the one being served for a kind and ahead for none.
    #[error(
        "snapshot {} is older than the one in use ({}) for {}: resourceVersion {} < {}",
        .0.offered, .0.held, .0.kind, .0.offered_revision, .0.held_revision
    )]
    Behind(Box<Lag>),
    /// Neither snapshot is newer: the offered one is behind for a kind and ahead for
    /// another (two control-plane replicas whose watches lag on different kinds). The one
    /// in use is kept until a snapshot that is behind for no kind arrives.
    #[error(
        "waiting: snapshot {} is behind the one in use ({}) for {} (resourceVersion {} < {}) and ahead for {}; keeping the one in use until a snapshot is behind for no kind",
        .0.offered, .0.held, .0.kind, .0.offered_revision, .0.held_revision, .0.ahead
    )]
    Incomparable(Box<Lag>),
    /// A Gateway API listener or host is malformed, appears twice, or names a listener,
    /// backend or certificate the snapshot does not contain.
    #[error("gateway {kind} {name:?}: {reason}")]
    BadGateway {
        /// "listener" or "host".
        kind: &'static str,
        /// Its name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// How an offered snapshot is behind the one in use (see [`check_not_older`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lag {
    /// Offered version.
    pub offered: String,
    /// Version in use.
    pub held: String,
    /// The first kind it is behind for.
    pub kind: String,
    /// That kind's progress in the offered snapshot.
    pub offered_revision: u64,
    /// That kind's progress in the snapshot in use.
    pub held_revision: u64,
    /// The first kind it is ahead for ("" when none).
    pub ahead: String,
}

/// The snapshot's content hash: SHA-256 (hex) of the LtHash16 sum of its resources'
/// hashes (see [`crate::content`] for the construction and why it is collision-resistant).
/// Certificates and their private keys are resources, so they are covered.
pub fn content_hash(snapshot: &Snapshot) -> String {
    crate::content::content_sum(snapshot).content_hash()
}

/// The version string for a revision and content hash.
pub fn version_string(cluster_revision: u64, content_hash: &str) -> String {
    let prefix = content_hash.get(..16).unwrap_or(content_hash);
    format!("{cluster_revision}-{prefix}")
}

/// Stamps the snapshot's identity: content hash, revision and version.
pub fn seal(snapshot: &mut Snapshot, cluster_revision: u64) {
    snapshot.content_hash = content_hash(snapshot);
    stamp(snapshot, cluster_revision);
}

/// Stamps revision and version on a snapshot whose `content_hash` is already set (by a
/// translator that hashed its content while building it, see [`crate::content`]).
pub fn stamp(snapshot: &mut Snapshot, cluster_revision: u64) {
    snapshot.cluster_revision = cluster_revision;
    snapshot.version = version_string(cluster_revision, &snapshot.content_hash);
}

/// Number of routes (virtual hosts' and Gateway hosts'), counting the default backend
/// as one.
pub fn route_count(snapshot: &Snapshot) -> usize {
    snapshot
        .virtual_hosts
        .iter()
        .map(|v| v.routes.len())
        .sum::<usize>()
        + snapshot
            .gateway_hosts
            .iter()
            .map(|g| g.routes.len())
            .sum::<usize>()
        + usize::from(snapshot.default_backend.is_some())
}

/// What identifies a Gateway route within its Gateway host, beside its match kind (the
/// bounded-destruction guard's key): its path, then each header match as
/// ` name:value`. (Paths hold no whitespace, so the parts cannot run together.)
pub fn gateway_route_key(r: &crate::v1::GatewayRoute) -> String {
    let mut key = r.path.clone();
    for h in &r.headers {
        key.push(' ');
        key.push_str(&h.name);
        key.push(':');
        key.push_str(&h.value);
    }
    for c in &r.cookies {
        key.push_str(" cookie ");
        key.push_str(&c.name);
        key.push('=');
        key.push_str(&c.value);
    }
    key
}

/// Most bytes of an Ingress path that is a regular expression ([`ingress_path_regex`]).
pub const MAX_PATH_REGEX_LEN: usize = 1024;

/// Most regular-expression entries one Ingress host may have: a request is matched
/// against them one by one, and each holds compiled state in every proxy.
pub const MAX_PATH_REGEXES_PER_HOST: usize = 100;

/// Most mirrors one route may have: each is a copy of every request it takes. The
/// Gateway API allows a rule as many RequestMirror filters as filters (16).
pub const MAX_MIRRORS_PER_ROUTE: usize = 16;

/// The regular expression of an Ingress path of kind `Regex` (ingress-nginx `use-regex`):
/// matched case-insensitively from the start of the request path (nginx's
/// `location ~* ^<path>`), at most [`MAX_PATH_REGEX_LEN`] bytes, 256 KiB compiled and a
/// 256 KiB match cache, so a tenant's pattern cannot grow every proxy without bound
/// (matching is linear in the path: the `regex` crate has no backtracking). Err says why
/// it is not one.
pub fn ingress_path_regex(path: &str) -> Result<regex::Regex, String> {
    if !path.starts_with('/') {
        return Err("does not start with '/'".into());
    }
    if path.chars().any(char::is_whitespace) {
        return Err("holds whitespace".into());
    }
    if path.len() > MAX_PATH_REGEX_LEN {
        return Err(format!("is over {MAX_PATH_REGEX_LEN} bytes"));
    }
    regex::RegexBuilder::new(&format!("^(?:{path})"))
        .case_insensitive(true)
        .size_limit(256 << 10)
        .dfa_size_limit(256 << 10)
        .build()
        .map_err(|e| format!("is not a regular expression holdfast reads: {e}"))
}

/// The regular expression of an Ingress canary's header pattern (ingress-nginx
/// `canary-by-header-pattern`): unanchored, case-sensitive, with the limits of
/// [`ingress_path_regex`].
pub fn header_pattern_regex(pattern: &str) -> Result<regex::Regex, String> {
    if pattern.is_empty() || pattern.len() > MAX_PATH_REGEX_LEN {
        return Err(format!("is empty or over {MAX_PATH_REGEX_LEN} bytes"));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(256 << 10)
        .dfa_size_limit(256 << 10)
        .build()
        .map_err(|e| format!("is not a regular expression holdfast reads: {e}"))
}

/// Is `host` a lower-case DNS name (labels of `a-z0-9-`), `*.` + such a name, or ""?
pub fn is_valid_host(host: &str) -> bool {
    if host.is_empty() {
        return true;
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// Checks that the snapshot is internally consistent and that its identity matches its
/// content (the proxy's check of what it receives).
pub fn validate(snapshot: &Snapshot) -> Result<(), InvalidSnapshot> {
    validate_structure(snapshot)?;
    validate_identity(snapshot, &content_hash(snapshot))
}

/// Checks that `version` and `content_hash` match the content, given its hash.
pub(crate) fn validate_identity(
    snapshot: &Snapshot,
    computed: &str,
) -> Result<(), InvalidSnapshot> {
    if computed != snapshot.content_hash {
        return Err(InvalidSnapshot::HashMismatch {
            stated: snapshot.content_hash.clone(),
            computed: computed.to_owned(),
        });
    }
    if snapshot.version != version_string(snapshot.cluster_revision, &snapshot.content_hash) {
        return Err(InvalidSnapshot::BadVersion {
            version: snapshot.version.clone(),
            revision: snapshot.cluster_revision,
        });
    }
    Ok(())
}

/// Checks internal consistency only: every route's backend present, no duplicate hosts or
/// backends, well-formed hosts, paths and match kinds. (The control plane uses this right
/// after [`seal`], which has just computed the hash.)
pub fn validate_structure(snapshot: &Snapshot) -> Result<(), InvalidSnapshot> {
    let mut backends =
        HashSet::with_capacity_and_hasher(snapshot.backends.len(), RandomState::default());
    for b in &snapshot.backends {
        if !backends.insert(b.name.as_str()) {
            return Err(InvalidSnapshot::DuplicateBackend(b.name.clone()));
        }
    }
    let mut certificates =
        HashSet::with_capacity_and_hasher(snapshot.certificates.len(), RandomState::default());
    for c in &snapshot.certificates {
        if !certificates.insert(c.name.as_str()) {
            return Err(InvalidSnapshot::DuplicateCertificate(c.name.clone()));
        }
    }
    let certificate_known = |host: &str, name: &str| {
        if name.is_empty() || certificates.contains(name) {
            Ok(())
        } else {
            Err(InvalidSnapshot::MissingCertificate {
                host: host.to_owned(),
                certificate: name.to_owned(),
            })
        }
    };
    certificate_known("", &snapshot.default_certificate)?;
    let mut hosts =
        HashSet::with_capacity_and_hasher(snapshot.virtual_hosts.len(), RandomState::default());
    for vhost in &snapshot.virtual_hosts {
        if !hosts.insert(vhost.host.as_str()) {
            return Err(InvalidSnapshot::DuplicateHost(vhost.host.clone()));
        }
        validate_virtual_host(vhost)?;
        certificate_known(&vhost.host, &vhost.certificate)?;
        for route in &vhost.routes {
            if !backends.contains(route.backend.as_str()) {
                return Err(InvalidSnapshot::MissingBackend {
                    host: vhost.host.clone(),
                    path: route.path.clone(),
                    backend: route.backend.clone(),
                });
            }
        }
    }
    if let Some(default) = &snapshot.default_backend
        && !backends.contains(default.backend.as_str())
    {
        return Err(InvalidSnapshot::MissingBackend {
            host: String::new(),
            path: "(default backend)".into(),
            backend: default.backend.clone(),
        });
    }
    let mut listeners =
        HashSet::with_capacity_and_hasher(snapshot.gateway_listeners.len(), RandomState::default());
    for l in &snapshot.gateway_listeners {
        if !listeners.insert(l.name.as_str()) {
            return Err(bad_listener(l, "appears twice".into()));
        }
        validate_gateway_listener(l)?;
        if let Some(c) = listener_certificates(l).find(|c| !certificates.contains(c)) {
            return Err(bad_listener(
                l,
                format!("certificate {c:?} is not in the snapshot"),
            ));
        }
    }
    let mut gateway_hosts =
        HashSet::with_capacity_and_hasher(snapshot.gateway_hosts.len(), RandomState::default());
    for g in &snapshot.gateway_hosts {
        if !gateway_hosts.insert(g.name.as_str()) {
            return Err(bad_gateway_host(g, "appears twice".into()));
        }
        validate_gateway_host(g)?;
        if is_ingress_host(g) {
            // One form per Ingress host: a VirtualHost or a Gateway host, never both.
            if hosts.contains(g.host.as_str()) {
                return Err(InvalidSnapshot::DuplicateHost(g.host.clone()));
            }
            certificate_known(&g.host, &g.certificate)?;
        } else if !listeners.contains(g.listener.as_str()) {
            return Err(bad_gateway_host(
                g,
                format!("listener {:?} is not in the snapshot", g.listener),
            ));
        }
        if let Some(b) = gateway_host_backends(g).find(|b| !backends.contains(b)) {
            return Err(bad_gateway_host(
                g,
                format!("backend {b:?} is not in the snapshot"),
            ));
        }
    }
    Ok(())
}

fn bad_listener(l: &GatewayListener, reason: String) -> InvalidSnapshot {
    InvalidSnapshot::BadGateway {
        kind: "listener",
        name: l.name.clone(),
        reason,
    }
}

fn bad_gateway_host(g: &GatewayHost, reason: String) -> InvalidSnapshot {
    InvalidSnapshot::BadGateway {
        kind: "host",
        name: g.name.clone(),
        reason,
    }
}

/// The certificates a Gateway listener names.
pub fn listener_certificates(l: &GatewayListener) -> impl Iterator<Item = &str> {
    l.certificates
        .iter()
        .flat_map(|c| c.certificates.iter().map(String::as_str))
}

/// The backends a Gateway host's routes name (unresolved references, "", left out).
pub fn gateway_host_backends(g: &GatewayHost) -> impl Iterator<Item = &str> {
    g.routes.iter().flat_map(gateway_route_backends)
}

/// The backends a Gateway route names, its mirrors' included (unresolved references, "",
/// left out).
pub fn gateway_route_backends(r: &GatewayRoute) -> impl Iterator<Item = &str> {
    let mirrors = r.mirrors.iter().map(|m| m.backend.as_str());
    r.backends
        .iter()
        .map(|b| b.backend.as_str())
        .chain(mirrors)
        .filter(|b| !b.is_empty())
}

/// The name of the Gateway listener on `address` and `port`.
pub fn listener_name(address: &str, port: u32) -> String {
    format!("{address}:{port}")
}

/// The name of a Gateway host: its listener's name and its host.
pub fn gateway_host_name(listener: &str, host: &str) -> String {
    format!("{listener} {host}")
}

/// The listener of Ingress hosts given as Gateway hosts: the proxy's own listeners
/// (`--listen`, `--listen-https`). No Gateway listener has this name (theirs are
/// `<address>:<port>`).
pub const INGRESS_LISTENER: &str = "ingress";

/// Whether `g` is an Ingress host (listener [`INGRESS_LISTENER`]).
pub fn is_ingress_host(g: &GatewayHost) -> bool {
    g.listener == INGRESS_LISTENER
}

/// The Ingress host (as a virtual host names it) of a Gateway host's name, when the name
/// is an Ingress host's: `"ingress a.example.com"` → `"a.example.com"`.
pub fn ingress_host_of(name: &str) -> Option<&str> {
    name.strip_prefix(INGRESS_LISTENER)?.strip_prefix(' ')
}

/// An Ingress virtual host in the one route model: the Gateway host of listener
/// [`INGRESS_LISTENER`] whose entries are its routes, each to its one backend.
pub fn ingress_gateway_host(v: &VirtualHost) -> GatewayHost {
    GatewayHost {
        name: gateway_host_name(INGRESS_LISTENER, &v.host),
        listener: INGRESS_LISTENER.to_owned(),
        host: v.host.clone(),
        routes: v
            .routes
            .iter()
            .map(|r| GatewayRoute {
                match_kind: r.match_kind,
                path: r.path.clone(),
                backends: vec![WeightedBackend {
                    backend: r.backend.clone(),
                    weight: 1,
                    unresolved: String::new(),
                    ..Default::default()
                }],
                ingress: r.source.clone(),
                ..GatewayRoute::default()
            })
            .collect(),
        certificate: v.certificate.clone(),
        ssl_redirect: v.ssl_redirect,
    }
}

/// The virtual host an Ingress host stands for ([`ingress_gateway_host`] inverted), or
/// why `g` is not one: another listener, or an entry that is not one Ingress path to one
/// backend (a header match, a filter, a weight, an unresolved or second backend, an
/// HTTPRoute source).
pub fn ingress_virtual_host(g: &GatewayHost) -> Result<VirtualHost, InvalidSnapshot> {
    if !is_ingress_host(g) {
        return Err(bad_gateway_host(g, "is not an Ingress host".into()));
    }
    let routes = g
        .routes
        .iter()
        .map(|r| {
            let bad = |reason: &str| {
                bad_gateway_host(g, format!("route {}: an Ingress route {reason}", r.path))
            };
            let [b] = r.backends.as_slice() else {
                return Err(bad("has one backend"));
            };
            if b.backend.is_empty() || !b.unresolved.is_empty() || b.weight != 1 {
                return Err(bad("names its backend, with weight 1"));
            }
            if r.source.is_some() {
                return Err(bad("comes from an Ingress, not an HTTPRoute"));
            }
            if !matches!(
                MatchKind::try_from(r.match_kind),
                Ok(MatchKind::Exact | MatchKind::Prefix)
            ) {
                return Err(bad("is Exact or Prefix"));
            }
            // Nothing but its path, its one backend and its Ingress: no match besides the
            // path, no filter (any field a later version adds counts too).
            let plain = GatewayRoute {
                match_kind: r.match_kind,
                path: r.path.clone(),
                backends: vec![WeightedBackend {
                    backend: b.backend.clone(),
                    weight: 1,
                    ..Default::default()
                }],
                ingress: r.ingress.clone(),
                ..GatewayRoute::default()
            };
            if *r != plain {
                return Err(bad("has no header matches and no filters"));
            }
            Ok(Route {
                match_kind: r.match_kind,
                path: r.path.clone(),
                backend: b.backend.clone(),
                source: r.ingress.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(VirtualHost {
        host: g.host.clone(),
        routes,
        certificate: g.certificate.clone(),
        ssl_redirect: g.ssl_redirect,
    })
}

/// The Ingress hosts of `snapshot` as virtual hosts, in either form, sorted by host (a
/// Gateway host of listener `ingress` that is not a valid one is left out).
pub fn ingress_hosts(snapshot: &Snapshot) -> Vec<VirtualHost> {
    let mut out: Vec<VirtualHost> = snapshot
        .virtual_hosts
        .iter()
        .cloned()
        .chain(
            snapshot
                .gateway_hosts
                .iter()
                .filter(|g| is_ingress_host(g))
                .filter_map(|g| ingress_virtual_host(g).ok()),
        )
        .collect();
    out.sort_by(|a, b| a.host.cmp(&b.host));
    out
}

/// Is `host` a lower-case DNS name, `*.` + such a name, or "" (Gateway API hostnames: a
/// wildcard covers one or more labels)?
fn is_valid_gateway_host(host: &str) -> bool {
    is_valid_host(host)
}

/// Checks one Gateway listener on its own (not what it names).
pub fn validate_gateway_listener(l: &GatewayListener) -> Result<(), InvalidSnapshot> {
    if l.address.parse::<std::net::IpAddr>().is_err() {
        return Err(bad_listener(
            l,
            format!("address {:?} is not an IP address", l.address),
        ));
    }
    if l.port == 0 || l.port > u32::from(u16::MAX) {
        return Err(bad_listener(l, format!("port {} is out of range", l.port)));
    }
    if l.public_port > u32::from(u16::MAX) {
        return Err(bad_listener(
            l,
            format!("public port {} is out of range", l.public_port),
        ));
    }
    if l.name != listener_name(&l.address, l.port) {
        return Err(bad_listener(l, "name is not <address>:<port>".into()));
    }
    match l.protocol.as_str() {
        "HTTP" => {
            if !l.certificates.is_empty() {
                return Err(bad_listener(l, "an HTTP listener has certificates".into()));
            }
        }
        "HTTPS" => {}
        // TLS passthrough: the proxy terminates nothing, so holds no certificate.
        "TLS" => {
            if !l.certificates.is_empty() {
                return Err(bad_listener(l, "a TLS listener has certificates".into()));
            }
        }
        other => {
            return Err(bad_listener(
                l,
                format!("protocol {other:?} is not HTTP, HTTPS or TLS"),
            ));
        }
    }
    let mut hostnames = HashSet::with_hasher(RandomState::default());
    for c in &l.certificates {
        if !is_valid_gateway_host(&c.hostname) || !hostnames.insert(c.hostname.as_str()) {
            return Err(bad_listener(
                l,
                format!(
                    "certificate hostname {:?} is invalid or repeated",
                    c.hostname
                ),
            ));
        }
    }
    Ok(())
}

/// Checks one Gateway host on its own (not what it names): its name, host, paths, header
/// matches and filters.
pub fn validate_gateway_host(g: &GatewayHost) -> Result<(), InvalidSnapshot> {
    if !is_valid_gateway_host(&g.host) {
        return Err(bad_gateway_host(g, "host is not a valid hostname".into()));
    }
    if g.name != gateway_host_name(&g.listener, &g.host) {
        return Err(bad_gateway_host(
            g,
            "name is not \"<listener> <host>\"".into(),
        ));
    }
    if is_ingress_host(g) {
        // Without filters: the Ingress rules, checked once, as the virtual host it stands
        // for.
        if let Ok(v) = ingress_virtual_host(g) {
            return validate_virtual_host(&v);
        }
        // With filters (ingress-nginx annotations): the host as a virtual host's, each
        // entry as a Gateway route's below.
        if g.ssl_redirect && g.certificate.is_empty() {
            return Err(InvalidSnapshot::RedirectWithoutCertificate(g.host.clone()));
        }
        if !is_valid_host(&g.host) {
            return Err(InvalidSnapshot::BadHost(g.host.clone()));
        }
        if g.routes
            .iter()
            .any(|r| r.ingress.is_none() || r.source.is_some())
        {
            return Err(bad_gateway_host(
                g,
                "an Ingress host's route names no Ingress, or an HTTPRoute".into(),
            ));
        }
    } else {
        if !g.certificate.is_empty() || g.ssl_redirect {
            return Err(bad_gateway_host(
                g,
                "a Gateway listener's host names a certificate (its listener does)".into(),
            ));
        }
        if g.routes.iter().any(|r| {
            r.ingress.is_some()
                || r.https_redirect
                || !r.allow_sources.is_empty()
                || !r.deny_sources.is_empty()
                || r.limit_rps > 0
                || r.limit_connections > 0
                || r.affinity.is_some()
                || r.max_body_bytes > 0
                || !r.cookies.is_empty()
                || !r.header_patterns.is_empty()
                || r.timeouts
                    .is_some_and(|t| t.connect_ms > 0 || t.send_ms > 0)
        }) {
            return Err(bad_gateway_host(
                g,
                "a Gateway listener's route names an Ingress or has an Ingress-only filter".into(),
            ));
        }
    }
    let mut regexes = 0;
    for r in &g.routes {
        let bad = |reason: &str| bad_gateway_host(g, format!("route {}: {reason}", r.path));
        if !r.path.starts_with('/') {
            return Err(bad("path does not start with '/'"));
        }
        match MatchKind::try_from(r.match_kind) {
            Ok(MatchKind::Exact) => {}
            Ok(MatchKind::Prefix) => {
                if r.path.len() > 1 && r.path.ends_with('/') {
                    return Err(bad("prefix path is not normalised (trailing '/')"));
                }
            }
            Ok(MatchKind::Regex) if is_ingress_host(g) => {
                if let Err(why) = ingress_path_regex(&r.path) {
                    return Err(bad(&format!("the path {why}")));
                }
            }
            _ => {
                return Err(bad(
                    "match kind is not Exact or Prefix (or Regex, for an Ingress)",
                ));
            }
        }
        if r.match_kind == MatchKind::Regex as i32 {
            regexes += 1;
            if regexes > MAX_PATH_REGEXES_PER_HOST {
                return Err(bad(&format!(
                    "more than {MAX_PATH_REGEXES_PER_HOST} regular-expression paths on the host"
                )));
            }
        }
        if !r.header_patterns.iter().all(|p| {
            http::HeaderName::from_bytes(p.name.as_bytes()).is_ok_and(|h| h.as_str() == p.name)
                && header_pattern_regex(&p.value).is_ok()
        }) {
            return Err(bad(
                "a header pattern is not a lower-case name and a regular expression",
            ));
        }
        if !r
            .allow_sources
            .iter()
            .chain(&r.deny_sources)
            .all(|c| c.parse::<ipnet::IpNet>().is_ok())
        {
            return Err(bad("a source range is not a CIDR"));
        }
        let captures = r
            .rewrite
            .iter()
            .filter_map(|w| w.path.as_ref())
            .chain(r.redirect.iter().filter_map(|d| d.path.as_ref()))
            .any(|m| m.captures && (!m.full || !is_ingress_host(g) || r.redirect.is_some()));
        if captures {
            return Err(bad(
                "capture groups are an Ingress rewrite's, of the full path, alone",
            ));
        }
        let header_name_ok =
            |n: &str| http::HeaderName::from_bytes(n.as_bytes()).is_ok_and(|h| h.as_str() == n);
        let header_value_ok = |v: &str| http::HeaderValue::from_str(v).is_ok();
        if !r
            .headers
            .iter()
            .all(|h| header_name_ok(&h.name) && header_value_ok(&h.value))
        {
            return Err(bad(
                "a header match is not a lower-case name and a valid value",
            ));
        }
        if let Some(m) = &r.request_headers
            && !(m
                .set
                .iter()
                .chain(&m.add)
                .all(|h| header_name_ok(&h.name) && header_value_ok(&h.value))
                && m.remove.iter().all(|n| header_name_ok(n)))
        {
            return Err(bad(
                "a header change is not a lower-case name and a valid value",
            ));
        }
        if r.mirrors.len() > MAX_MIRRORS_PER_ROUTE
            || r.mirrors
                .iter()
                .any(|m| m.denominator == 0 || m.numerator > m.denominator)
        {
            return Err(bad(&format!(
                "more than {MAX_MIRRORS_PER_ROUTE} mirrors, or a mirror's share is not a fraction of at most 1"
            )));
        }
        if let Some(a) = &r.affinity {
            let token = !a.cookie_name.is_empty()
                && a.cookie_name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            let attributes = a.attributes.is_empty()
                || (a.attributes.starts_with("; ")
                    && http::HeaderValue::from_str(&a.attributes).is_ok());
            if !token || !attributes {
                return Err(bad("an affinity cookie's name or attributes are not valid"));
            }
        }
        if r.redirect.is_some() && !r.mirrors.is_empty() {
            return Err(bad("a redirect has mirrors"));
        }
        if let Some(redirect) = &r.redirect {
            if !matches!(redirect.status_code, 301 | 302 | 303 | 307 | 308) {
                return Err(bad("a redirect's status is not 301, 302, 303, 307 or 308"));
            }
            if !matches!(redirect.scheme.as_str(), "" | "http" | "https") {
                return Err(bad("a redirect's scheme is not http or https"));
            }
            if redirect.port > u32::from(u16::MAX) {
                return Err(bad("a redirect's port is out of range"));
            }
            if !redirect.hostname.is_empty()
                && (redirect.hostname.starts_with("*.") || !is_valid_host(&redirect.hostname))
            {
                return Err(bad("a redirect's hostname is not a lower-case DNS name"));
            }
            if !redirect.location.is_empty() {
                let absolute = redirect.location.parse::<http::Uri>().is_ok_and(|u| {
                    matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
                });
                if !absolute || http::HeaderValue::from_str(&redirect.location).is_err() {
                    return Err(bad("a redirect's location is not an absolute http(s) URL"));
                }
                if !redirect.scheme.is_empty()
                    || !redirect.hostname.is_empty()
                    || redirect.port != 0
                    || redirect.path.is_some()
                {
                    return Err(bad("a redirect with a location has other fields set"));
                }
            }
        }
    }
    Ok(())
}

/// Checks one virtual host on its own (not what it names): a valid host, a certificate if
/// it redirects, well-formed paths and match kinds.
pub fn validate_virtual_host(vhost: &VirtualHost) -> Result<(), InvalidSnapshot> {
    if vhost.ssl_redirect && vhost.certificate.is_empty() {
        return Err(InvalidSnapshot::RedirectWithoutCertificate(
            vhost.host.clone(),
        ));
    }
    if !is_valid_host(&vhost.host) {
        return Err(InvalidSnapshot::BadHost(vhost.host.clone()));
    }
    for route in &vhost.routes {
        let bad = |reason| InvalidSnapshot::BadRoute {
            host: vhost.host.clone(),
            path: route.path.clone(),
            reason,
        };
        if !route.path.starts_with('/') {
            return Err(bad("path does not start with '/'"));
        }
        match MatchKind::try_from(route.match_kind) {
            Ok(MatchKind::Exact) => {}
            Ok(MatchKind::Prefix) => {
                if route.path.len() > 1 && route.path.ends_with('/') {
                    return Err(bad("prefix path is not normalised (trailing '/')"));
                }
            }
            _ => return Err(bad("match kind is not Exact or Prefix")),
        }
    }
    Ok(())
}

/// What ordering compares: a snapshot's version, cluster revision and per-kind progress.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a> {
    /// Its version.
    pub version: &'a str,
    /// Its cluster revision (the highest progress value).
    pub cluster_revision: u64,
    /// Its progress per kind (empty from a control plane that predates it).
    pub progress: &'a [KindProgress],
}

impl<'a> Stamp<'a> {
    /// The stamp of a snapshot.
    pub fn of(snapshot: &'a Snapshot) -> Self {
        Stamp {
            version: &snapshot.version,
            cluster_revision: snapshot.cluster_revision,
            progress: &snapshot.progress,
        }
    }
}

/// Refuses `offered` if it reflects an older cluster state than `held` for any kind: a
/// component-wise comparison of their progress (a kind one of them lacks counts as 0).
/// Behind for some kind and ahead for none is [`InvalidSnapshot::Behind`]; behind for one
/// and ahead for another is [`InvalidSnapshot::Incomparable`] (wait). Where either has no
/// progress (a snapshot from an older control plane), the cluster revisions are compared.
pub fn check_not_older(offered: Stamp<'_>, held: Stamp<'_>) -> Result<(), InvalidSnapshot> {
    if offered.progress.is_empty() || held.progress.is_empty() {
        if offered.cluster_revision < held.cluster_revision {
            return Err(InvalidSnapshot::Older {
                offered: offered.version.to_owned(),
                offered_revision: offered.cluster_revision,
                held: held.version.to_owned(),
                held_revision: held.cluster_revision,
            });
        }
        return Ok(());
    }
    let of = |p: &[KindProgress], kind: &str| {
        p.iter()
            .find(|k| k.kind == kind)
            .map_or(0, |k| k.resource_version)
    };
    let behind = held.progress.iter().find_map(|h| {
        let o = of(offered.progress, &h.kind);
        (o < h.resource_version).then(|| (h.kind.clone(), o, h.resource_version))
    });
    let Some((kind, offered_revision, held_revision)) = behind else {
        return Ok(());
    };
    let ahead = offered
        .progress
        .iter()
        .find(|o| o.resource_version > of(held.progress, &o.kind))
        .map(|o| o.kind.clone());
    let lag = |ahead: String| {
        Box::new(Lag {
            offered: offered.version.to_owned(),
            held: held.version.to_owned(),
            kind: kind.clone(),
            offered_revision,
            held_revision,
            ahead,
        })
    };
    Err(match ahead {
        None => InvalidSnapshot::Behind(lag(String::new())),
        Some(ahead) => InvalidSnapshot::Incomparable(lag(ahead)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Backend, DefaultBackend, Route, VirtualHost};

    fn sample() -> Snapshot {
        let mut s = Snapshot {
            virtual_hosts: vec![VirtualHost {
                host: "a.example.com".into(),
                routes: vec![Route {
                    match_kind: MatchKind::Prefix as i32,
                    path: "/api".into(),
                    backend: "default/web:80".into(),
                    source: None,
                }],
                ..Default::default()
            }],
            backends: vec![Backend {
                name: "default/web:80".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        seal(&mut s, 42);
        s
    }

    #[test]
    fn an_ingress_host_given_as_a_gateway_host_is_held_to_the_ingress_rules() {
        use crate::v1::{HeaderMatch, HeaderModifier, IngressRef, RequestRedirect, RouteRef};
        let mut s = sample();
        s.virtual_hosts[0].routes[0].source = Some(IngressRef {
            namespace: "default".into(),
            name: "web".into(),
        });
        let v = s.virtual_hosts[0].clone();
        let g = ingress_gateway_host(&v);
        assert_eq!(g.name, "ingress a.example.com");
        assert_eq!(ingress_virtual_host(&g), Ok(v.clone()));
        assert_eq!(ingress_host_of(&g.name), Some("a.example.com"));
        assert_eq!(ingress_host_of("127.0.0.1:80 a.example.com"), None);
        // `s` with its one virtual host given as `edit` makes its Gateway host.
        let one = |edit: &dyn Fn(&mut GatewayHost)| {
            let mut t = s.clone();
            t.virtual_hosts.clear();
            let mut g = ingress_gateway_host(&v);
            edit(&mut g);
            g.name = gateway_host_name(&g.listener, &g.host);
            t.gateway_hosts.push(g);
            seal(&mut t, 42);
            validate(&t)
        };
        assert_eq!(one(&|_| {}), Ok(()));
        type Edit = dyn Fn(&mut GatewayHost);
        // Entries with filters (an Ingress's ingress-nginx annotations) are checked as a
        // Gateway host's, and are no longer virtual hosts.
        fn location(l: &str) -> RequestRedirect {
            RequestRedirect {
                status_code: 301,
                location: l.into(),
                ..Default::default()
            }
        }
        let served: [(&str, &Edit); 5] = [
            (
                "a regular expression path with a rewrite of its groups",
                &|g| {
                    g.routes[0].match_kind = MatchKind::Regex as i32;
                    g.routes[0].path = "/a(/|$)(.*)".into();
                    g.routes[0].rewrite = Some(crate::v1::UrlRewrite {
                        hostname: String::new(),
                        path: Some(crate::v1::PathModifier {
                            full: true,
                            value: "/$2".into(),
                            captures: true,
                        }),
                    });
                },
            ),
            ("a header change", &|g| {
                g.routes[0].request_headers = Some(HeaderModifier::default())
            }),
            ("a redirect to a location", &|g| {
                g.routes[0].redirect = Some(location("https://example.org/new"));
                g.routes[0].backends.clear();
            }),
            ("an https redirect", &|g| g.routes[0].https_redirect = true),
            ("a header match and a weight", &|g| {
                g.routes[0].headers.push(HeaderMatch {
                    name: "x".into(),
                    value: "1".into(),
                });
                g.routes[0].backends[0].weight = 3;
            }),
        ];
        for (what, edit) in served {
            assert_eq!(one(edit), Ok(()), "an Ingress host with {what} is served");
            let mut g = ingress_gateway_host(&v);
            edit(&mut g);
            assert!(
                ingress_virtual_host(&g).is_err(),
                "{what}: not a virtual host"
            );
        }
        let refused: [(&str, &Edit); 11] = [
            ("a path that is not a regular expression", &|g| {
                g.routes[0].match_kind = MatchKind::Regex as i32;
                g.routes[0].path = "/a(".into();
            }),
            ("a regular expression not starting with '/'", &|g| {
                g.routes[0].match_kind = MatchKind::Regex as i32;
                g.routes[0].path = ".*".into();
            }),
            ("groups in a prefix replacement", &|g| {
                g.routes[0].rewrite = Some(crate::v1::UrlRewrite {
                    hostname: String::new(),
                    path: Some(crate::v1::PathModifier {
                        full: false,
                        value: "/$1".into(),
                        captures: true,
                    }),
                });
            }),
            ("an HTTPRoute source", &|g| {
                g.routes[0].source = Some(RouteRef::default())
            }),
            ("an entry that names no Ingress", &|g| {
                g.routes[0].ingress = None;
                g.routes[0].https_redirect = true;
            }),
            ("a redirect to https without a certificate", &|g| {
                g.ssl_redirect = true
            }),
            ("a certificate not in the snapshot", &|g| {
                g.certificate = "default/missing".into()
            }),
            ("a redirect status that is not one", &|g| {
                g.routes[0].redirect = Some(RequestRedirect {
                    status_code: 200,
                    ..Default::default()
                })
            }),
            ("a location that is not absolute", &|g| {
                g.routes[0].redirect = Some(location("/relative"))
            }),
            ("a location that is not http", &|g| {
                g.routes[0].redirect = Some(location("ftp://example.org/"))
            }),
            ("a location with a scheme besides", &|g| {
                let mut r = location("https://example.org/");
                r.scheme = "http".into();
                g.routes[0].redirect = Some(r);
            }),
        ];
        for (what, edit) in refused {
            assert!(one(edit).is_err(), "an Ingress host with {what} is refused");
        }
        // A Gateway listener's host names neither a certificate nor an Ingress.
        let mut gw = ingress_gateway_host(&v);
        gw.listener = "127.10.0.1:80".into();
        gw.name = gateway_host_name(&gw.listener, &gw.host);
        assert!(
            validate_gateway_host(&gw).is_err(),
            "a route that names an Ingress"
        );
        gw.routes[0].ingress = None;
        assert_eq!(validate_gateway_host(&gw), Ok(()));
        let mut regex = gw.clone();
        regex.routes[0].match_kind = MatchKind::Regex as i32;
        assert!(
            validate_gateway_host(&regex).is_err(),
            "a regular expression path is an Ingress's alone"
        );
        gw.certificate = "default/tls".into();
        assert!(
            validate_gateway_host(&gw).is_err(),
            "a host that names a certificate"
        );
    }

    #[test]
    fn identical_content_has_identical_hash_whatever_the_identity_fields() {
        let a = sample();
        let mut b = sample();
        b.created_at = Some(prost_types::Timestamp {
            seconds: 99,
            nanos: 0,
        });
        seal(&mut b, 43);
        assert_eq!(a.content_hash, b.content_hash);
        assert_ne!(a.version, b.version);
        assert_eq!(a.version, format!("42-{}", &a.content_hash[..16]));
    }

    #[test]
    fn the_hash_is_the_sum_of_the_resource_hashes_whatever_their_order() {
        use crate::content::ContentSum;
        use crate::content::resource_hash;
        use crate::v1::ResourceKind;
        use prost::Message;
        let s = sample();
        // Fixed test vectors, computed apart from this code by
        // `proto/testdata/content_vectors.py` (the protobuf encodings written by hand,
        // SHA-256 from Python's hashlib, the elements from a pure-Python BLAKE3): each
        // resource's encoding, its hash (SHA-256 of the kind's tag and the encoding), and
        // the snapshot's content hash.
        let vh = s.virtual_hosts[0].encode_to_vec();
        let backend = s.backends[0].encode_to_vec();
        assert_eq!(
            crate::content::hex(&vh),
            "0a0d612e6578616d706c652e636f6d1218080212042f6170691a0e64656661756c742f7765623a3830"
        );
        assert_eq!(
            crate::content::hex(&backend),
            "0a0e64656661756c742f7765623a3830"
        );
        let mut hashes = vec![
            resource_hash(ResourceKind::VirtualHost, &vh),
            resource_hash(ResourceKind::Backend, &backend),
        ];
        assert_eq!(
            crate::content::hex(&hashes[0]),
            "19ba59a6262ac992acf4d0cc35cc92a35740bab3ce30ff90a278cd76e5c84f41"
        );
        assert_eq!(
            crate::content::hex(&hashes[1]),
            "24a036b20fb036b1130d74cbb1c53e49e78535570134cbe276f92c33532644e1"
        );
        const SAMPLE: &str = "92290b4c13b5dc27a4d65b10b2d8b8cc06ed57ef0c4984d7646d0bed55c9224f";
        assert_eq!(content_hash(&s), SAMPLE);
        assert_eq!(s.content_hash, SAMPLE);
        assert_eq!(s.version, format!("42-{}", &SAMPLE[..16]));
        // Whatever order the resource hashes are summed in.
        hashes.reverse();
        assert_eq!(ContentSum::of(&hashes).content_hash(), SAMPLE);

        // Listing the resources in another order does not change the hash (the order
        // rule is checked apart from it); a default certificate is a resource of its own.
        let mut big = s.clone();
        for i in 0..50 {
            let mut b = big.backends[0].clone();
            b.name = format!("ns/svc-{i}:80");
            big.backends.push(b);
        }
        let mut shuffled = big.clone();
        shuffled.backends.reverse();
        assert_eq!(content_hash(&big), content_hash(&shuffled));
        let mut with_default = big.clone();
        with_default.default_certificate = "ns/tls".into();
        assert_ne!(content_hash(&big), content_hash(&with_default));
    }

    #[test]
    fn different_content_has_a_different_hash() {
        let a = sample();
        let mut b = sample();
        b.virtual_hosts[0].routes[0].path = "/other".into();
        seal(&mut b, 42);
        assert_ne!(a.content_hash, b.content_hash);
    }

    #[test]
    fn a_sealed_consistent_snapshot_is_valid() {
        assert_eq!(validate(&sample()), Ok(()));
    }

    #[test]
    fn a_route_to_a_missing_backend_is_refused() {
        let mut s = sample();
        s.backends.clear();
        seal(&mut s, 42);
        assert!(matches!(
            validate(&s),
            Err(InvalidSnapshot::MissingBackend { .. })
        ));
    }

    #[test]
    fn a_default_backend_that_is_missing_is_refused() {
        let mut s = sample();
        s.default_backend = Some(DefaultBackend {
            backend: "nope".into(),
            source: None,
        });
        seal(&mut s, 42);
        assert!(matches!(
            validate(&s),
            Err(InvalidSnapshot::MissingBackend { .. })
        ));
    }

    #[test]
    fn tampered_content_fails_the_hash() {
        let mut s = sample();
        s.virtual_hosts[0].host = "b.example.com".into();
        assert!(matches!(
            validate(&s),
            Err(InvalidSnapshot::HashMismatch { .. })
        ));
    }

    /// `sample()` with one HTTP Gateway listener and one host routing to its backend.
    fn with_gateway() -> Snapshot {
        use crate::v1::{GatewayHost, GatewayListener, GatewayRoute, HeaderMatch, WeightedBackend};
        let mut s = sample();
        s.gateway_listeners = vec![GatewayListener {
            name: listener_name("127.10.0.1", 80),
            address: "127.10.0.1".into(),
            port: 80,
            protocol: "HTTP".into(),
            ..Default::default()
        }];
        s.gateway_hosts = vec![GatewayHost {
            name: gateway_host_name("127.10.0.1:80", "*.example.com"),
            listener: "127.10.0.1:80".into(),
            host: "*.example.com".into(),
            routes: vec![GatewayRoute {
                match_kind: MatchKind::Exact as i32,
                path: "/x".into(),
                headers: vec![HeaderMatch {
                    name: "version".into(),
                    value: "two".into(),
                }],
                backends: vec![WeightedBackend {
                    backend: "default/web:80".into(),
                    weight: 3,
                    unresolved: String::new(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }];
        seal(&mut s, 1);
        s
    }

    #[test]
    fn gateway_listeners_and_hosts_are_checked_and_what_they_name_must_exist() {
        assert_eq!(validate(&with_gateway()), Ok(()));
        let refused = |edit: &dyn Fn(&mut Snapshot)| {
            let mut s = with_gateway();
            edit(&mut s);
            seal(&mut s, 1);
            match validate(&s) {
                Err(InvalidSnapshot::BadGateway { reason, .. }) => reason,
                other => panic!("not refused as a bad gateway resource: {other:?}"),
            }
        };
        let r = refused(&|s| s.gateway_hosts[0].routes[0].backends[0].backend = "x/y:1".into());
        assert!(r.contains("backend"), "{r}");
        let r = refused(&|s| s.gateway_listeners.clear());
        assert!(r.contains("listener"), "{r}");
        let r = refused(&|s| s.gateway_listeners[0].address = "nowhere".into());
        assert!(r.contains("not an IP address"), "{r}");
        let r = refused(&|s| s.gateway_listeners[0].public_port = 70_000);
        assert!(r.contains("public port"), "{r}");
        let r = refused(&|s| s.gateway_listeners[0].protocol = "TCP".into());
        assert!(r.contains("protocol"), "{r}");
        let r = refused(&|s| {
            s.gateway_listeners[0].protocol = "HTTPS".into();
            s.gateway_listeners[0].certificates = vec![crate::v1::ListenerCertificates {
                hostname: String::new(),
                certificates: vec!["default/missing".into()],
            }];
        });
        assert!(r.contains("certificate"), "{r}");
        let r = refused(&|s| s.gateway_hosts[0].name = "127.10.0.1:80 other".into());
        assert!(r.contains("name"), "{r}");
        let r = refused(&|s| s.gateway_hosts[0].routes[0].headers[0].name = "Version".into());
        assert!(r.contains("header match"), "{r}");
        let r = refused(&|s| {
            s.gateway_hosts[0].routes[0].redirect = Some(crate::v1::RequestRedirect {
                status_code: 304,
                ..Default::default()
            })
        });
        assert!(r.contains("307 or 308"), "{r}");
        let r = refused(&|s| s.gateway_hosts.push(s.gateway_hosts[0].clone()));
        assert!(r.contains("twice"), "{r}");
        // An unresolved reference ("") is not a missing backend: its share answers 500.
        let mut s = with_gateway();
        s.gateway_hosts[0].routes[0]
            .backends
            .push(crate::v1::WeightedBackend {
                backend: String::new(),
                weight: 1,
                unresolved: "service default/gone not found".into(),
                ..Default::default()
            });
        seal(&mut s, 1);
        assert_eq!(validate(&s), Ok(()));
    }

    #[test]
    fn malformed_routes_and_hosts_are_refused() {
        let mut s = sample();
        s.virtual_hosts[0].routes[0].path = "api".into();
        seal(&mut s, 1);
        assert!(matches!(
            validate(&s),
            Err(InvalidSnapshot::BadRoute { .. })
        ));
        let mut s = sample();
        s.virtual_hosts[0].routes[0].match_kind = 0;
        seal(&mut s, 1);
        assert!(matches!(
            validate(&s),
            Err(InvalidSnapshot::BadRoute { .. })
        ));
        let mut s = sample();
        s.virtual_hosts[0].host = "A.example.com".into();
        seal(&mut s, 1);
        assert!(matches!(validate(&s), Err(InvalidSnapshot::BadHost(_))));
        let mut s = sample();
        s.virtual_hosts.push(s.virtual_hosts[0].clone());
        seal(&mut s, 1);
        assert!(matches!(
            validate(&s),
            Err(InvalidSnapshot::DuplicateHost(_))
        ));
    }

    #[test]
    fn a_version_that_does_not_match_is_refused() {
        let mut s = sample();
        s.version = "41-whatever".into();
        assert!(matches!(
            validate(&s),
            Err(InvalidSnapshot::BadVersion { .. })
        ));
    }

    #[test]
    fn older_revisions_are_refused_equal_and_newer_accepted() {
        let held = sample();
        let mut older = sample();
        seal(&mut older, 41);
        let mut newer = sample();
        seal(&mut newer, 43);
        let stamp = Stamp::of;
        assert!(matches!(
            check_not_older(stamp(&older), stamp(&held)),
            Err(InvalidSnapshot::Older { .. })
        ));
        assert_eq!(check_not_older(stamp(&held), stamp(&held)), Ok(()));
        assert_eq!(check_not_older(stamp(&newer), stamp(&held)), Ok(()));
    }

    fn progress(kinds: &[(&str, u64)]) -> Vec<KindProgress> {
        kinds
            .iter()
            .map(|(kind, rv)| KindProgress {
                kind: (*kind).into(),
                resource_version: *rv,
            })
            .collect()
    }

    fn stamped(kinds: &[(&str, u64)]) -> Snapshot {
        let mut s = sample();
        s.progress = progress(kinds);
        let max = kinds.iter().map(|k| k.1).max().unwrap_or(0);
        seal(&mut s, max);
        s
    }

    /// Per kind: behind for a kind is refused even when the highest number is higher
    /// (the one-number rule accepted it), behind for one kind and ahead for another is
    /// "wait", and equal or ahead everywhere is accepted.
    #[test]
    fn progress_is_compared_kind_by_kind() {
        let held = stamped(&[("Ingress", 10), ("Service", 20)]);
        let check =
            |kinds: &[(&str, u64)]| check_not_older(Stamp::of(&stamped(kinds)), Stamp::of(&held));
        assert_eq!(check(&[("Ingress", 10), ("Service", 20)]), Ok(()));
        assert_eq!(check(&[("Ingress", 11), ("Service", 20)]), Ok(()));
        assert!(matches!(
            check(&[("Ingress", 9), ("Service", 20)]),
            Err(InvalidSnapshot::Behind(ref lag)) if lag.kind == "Ingress"
        ));
        // The highest number is higher (25 > 20), yet Ingresses are behind: the view of
        // one kind would move backwards.
        assert!(matches!(
            check(&[("Ingress", 9), ("Service", 25)]),
            Err(InvalidSnapshot::Incomparable(ref lag)) if lag.kind == "Ingress" && lag.ahead == "Service"
        ));
        // A kind the offered snapshot lacks counts as 0: behind.
        assert!(matches!(
            check(&[("Service", 30)]),
            Err(InvalidSnapshot::Incomparable(_))
        ));
        // A kind the served snapshot lacks: the offered one is ahead for it.
        assert_eq!(
            check(&[("Ingress", 10), ("Service", 20), ("Secret", 3)]),
            Ok(())
        );
    }

    #[test]
    fn host_validation() {
        for ok in ["", "a.example.com", "*.example.com", "localhost", "a-b.c1"] {
            assert!(is_valid_host(ok), "{ok}");
        }
        for bad in [
            "A.com",
            "*",
            "*.",
            "a..b",
            "-a.com",
            "a_b.com",
            "a.*.com",
            "1.2.3.4:80",
        ] {
            assert!(!is_valid_host(bad), "{bad}");
        }
    }
}
