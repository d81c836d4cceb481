//! Rule helpers: which Ingresses and classes are ours, Ingress paths and match kinds, the
//! backend an Ingress names, and the orders the translator sorts by.

use std::collections::HashSet;
use std::sync::Arc;

use holdfast_proto::v1::{IngressRef, MatchKind, Route};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};

use super::{
    ClusterState, DEFAULT_CLASS_ANNOTATION, IngressDigest, LEGACY_CLASS_ANNOTATION, Options,
};

/// The Ingress's namespace and name.
pub(super) fn ingress_ref(ing: &Ingress) -> IngressRef {
    IngressRef {
        namespace: ing.metadata.namespace.clone().unwrap_or_default(),
        name: ing.metadata.name.clone().unwrap_or_default(),
    }
}

/// The set of IngressClass names that are ours, and whether one of them is the default.
pub(super) fn our_classes(
    classes: &[Arc<IngressClass>],
    opts: &Options,
) -> (HashSet<String>, bool) {
    let mut ours = HashSet::new();
    let mut default_is_ours = false;
    for class in classes {
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        let controller = class.spec.as_ref().and_then(|s| s.controller.as_deref());
        if controller != Some(opts.controller.as_str()) {
            continue;
        }
        if opts
            .ingress_class
            .as_deref()
            .is_some_and(|only| only != name)
        {
            continue;
        }
        ours.insert(name.to_owned());
        let is_default = class
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v == "true");
        default_is_ours |= is_default;
    }
    (ours, default_is_ours)
}

/// The class an Ingress names: `spec.ingressClassName`, else the legacy annotation.
pub(super) fn class_of(ing: &Ingress) -> Option<&str> {
    ing.spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
                .map(String::as_str)
        })
}

/// Is an Ingress naming `class` ours?
pub(super) fn class_is_ours(
    class: Option<&str>,
    classes: &HashSet<String>,
    default_is_ours: bool,
) -> bool {
    match class {
        Some(class) => classes.contains(class),
        None => default_is_ours,
    }
}

/// Is this Ingress ours?
pub fn is_ours(ing: &Ingress, classes: &HashSet<String>, default_is_ours: bool) -> bool {
    class_is_ours(class_of(ing), classes, default_is_ours)
}

/// The Ingresses that are ours, in cache order.
pub fn our_ingresses<'a>(state: &'a ClusterState, opts: &Options) -> Vec<&'a Ingress> {
    let (classes, default_is_ours) = our_classes(&state.ingress_classes, opts);
    state
        .ingresses
        .iter()
        .map(|i| &**i)
        .filter(|i| is_ours(i, &classes, default_is_ours))
        .collect()
}

/// Why an Ingress path cannot be routed (the message of its [`Problem`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPath {
    /// The path does not start with `/`.
    #[error("path {0:?} does not start with '/'")]
    NotAbsolute(String),
    /// The path holds whitespace, `?` or `#`.
    #[error("path {0:?} contains whitespace, '?' or '#'")]
    ForbiddenCharacter(String),
    /// The `pathType` is none of `Exact`, `Prefix`, `ImplementationSpecific`.
    #[error("unknown pathType {0:?}")]
    UnknownPathType(String),
}

/// Why an Ingress backend cannot be used (the message of its [`Problem`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBackend {
    /// A resource backend (not a Service).
    #[error("resource backends are not supported; use a Service backend")]
    Resource,
    /// No Service named.
    #[error("backend names no Service")]
    NoService,
    /// No Service port named.
    #[error("backend names no Service port")]
    NoPort,
    /// A port number outside 1–65535.
    #[error("Service port {0} is out of range")]
    PortOutOfRange(i32),
    /// A port "name" of digits only.
    #[error("Service port name {0:?} is not a port name (names contain a letter)")]
    NumericPortName(String),
}

/// Normalises an Ingress path for its kind, or says why it is invalid.
pub fn normalise_path(path: Option<&str>, kind: MatchKind) -> Result<String, InvalidPath> {
    let path = path.unwrap_or("/");
    let path = if path.is_empty() { "/" } else { path };
    if !path.starts_with('/') {
        return Err(InvalidPath::NotAbsolute(path.to_owned()));
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c == '?' || c == '#')
    {
        return Err(InvalidPath::ForbiddenCharacter(path.to_owned()));
    }
    Ok(match kind {
        MatchKind::Prefix => {
            let trimmed = path.trim_end_matches('/');
            if trimmed.is_empty() {
                "/".to_owned()
            } else {
                trimmed.to_owned()
            }
        }
        _ => path.to_owned(),
    })
}

/// Why a rule path could never match a normalised request path (the proxy decodes
/// escapes, merges `//` and removes dot segments before matching), if it could not.
/// The API server refuses such paths for `Exact` and `Prefix`; `ImplementationSpecific`
/// is checked here.
pub fn unnormalised(path: &str) -> Option<&'static str> {
    if path.contains('%') {
        Some("contains '%'")
    } else if path.contains('\\') {
        Some("contains '\\'")
    } else if path.contains("//") {
        Some("contains '//'")
    } else if path.split('/').any(|s| s == "." || s == "..") {
        Some("contains a '.' or '..' segment")
    } else {
        None
    }
}

/// Why an `Exact` or `Prefix` path the API server accepts could still never match a
/// normalised request path, if so: proxies decode escaped unreserved characters
/// (`%7E` → `~`), write other escapes with upper-case hex, and refuse a raw `\`, so a rule
/// holding any of those forms is never reached. (The API server itself refuses `//`, dot
/// segments and `%2F` in these paths.)
pub fn escape_never_matched(path: &str) -> Option<String> {
    if path.contains('\\') {
        return Some("contains '\\'".into());
    }
    let bytes = path.as_bytes();
    for (i, _) in path.match_indices('%') {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit));
        let Some(hex) = hex else {
            return Some(format!("has a malformed escape at byte {i}"));
        };
        let escape = &path[i..i + 3];
        let value = u8::from_str_radix(&path[i + 1..i + 3], 16).unwrap_or(0);
        if value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~') {
            return Some(format!(
                "escapes {:?} as {escape} (write it unescaped)",
                value as char
            ));
        }
        if hex.iter().any(u8::is_ascii_lowercase) {
            return Some(format!(
                "writes {escape} in lower-case hex (write {})",
                escape.to_ascii_uppercase()
            ));
        }
    }
    None
}

/// The match kind for an Ingress `pathType`.
pub fn match_kind(path_type: &str) -> Result<MatchKind, InvalidPath> {
    match path_type {
        "Exact" => Ok(MatchKind::Exact),
        "Prefix" | "ImplementationSpecific" => Ok(MatchKind::Prefix),
        other => Err(InvalidPath::UnknownPathType(other.to_owned())),
    }
}

/// A Service port as an Ingress backend names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PortRef<'a> {
    Number(i32),
    Name(&'a str),
}

impl std::fmt::Display for PortRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortRef::Number(n) => write!(f, "{n}"),
            PortRef::Name(n) => f.write_str(n),
        }
    }
}

/// One backend: (namespace, Service, port as written), named `ns/service:port`, and
/// `ns/service:port (h2c)` when it is reached over HTTP/2 with prior knowledge because an
/// Ingress says so (ingress-nginx `backend-protocol: GRPC` or `H2C`; a Service port's own
/// `appProtocol: kubernetes.io/h2c` needs no second name). Names and keys correspond one
/// to one: namespaces and Service names are DNS labels (no `/`, `:` or space), and a port
/// name must contain a letter (see [`backend_ref`]).
///
/// The parts are ranges of the name (one allocation, not four).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BackendRef {
    pub(super) name: String,
    /// [`sort_prefix`] of `name`.
    pub(super) name_key: u128,
    /// Byte offsets of the `/` after the namespace and the `:` after the Service.
    pub(super) slash: usize,
    pub(super) colon: usize,
    /// The port's number, or None when it is named (the name's `port_end` ends it).
    pub(super) number: Option<i32>,
    /// Where the port ends in `name` (what follows says how the backend is spoken to).
    pub(super) port_end: usize,
    /// Reached over HTTP/2 (the name ends ` (h2c)`, or ` (grpcs ...)` over TLS).
    pub(super) h2c: bool,
    /// Reached over TLS (the name ends ` (https ...)` or ` (grpcs ...)`).
    pub(super) tls: Option<TlsAsked>,
}

/// How an Ingress asks its backends to be spoken to (ingress-nginx `backend-protocol` and
/// `proxy-ssl-*`); the default is HTTP/1.1 in cleartext.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Speaks {
    /// HTTP/2 (`GRPC`, `H2C`, `GRPCS`).
    pub h2c: bool,
    /// Over TLS (`HTTPS`, `GRPCS`).
    pub tls: Option<TlsAsked>,
}

impl Speaks {
    /// What ends the backend's name: nothing for the default, otherwise ` (...)` with
    /// every setting, so backends spoken to differently are different backends.
    fn suffix(&self) -> String {
        match &self.tls {
            None if self.h2c => " (h2c)".to_owned(),
            None => String::new(),
            Some(tls) => {
                let mut s = String::from(if self.h2c { " (grpcs" } else { " (https" });
                if let Some(name) = &tls.name {
                    s.push_str(" name=");
                    s.push_str(name);
                }
                if tls.sni {
                    s.push_str(" sni");
                }
                if let Some(secret) = &tls.verify {
                    s.push_str(" verify=");
                    s.push_str(secret);
                }
                s.push(')');
                s
            }
        }
    }
}

/// TLS to an Ingress's backends (ingress-nginx `backend-protocol: HTTPS`/`GRPCS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsAsked {
    /// The name the handshake is for (`proxy-ssl-name`); None: `<service>.<namespace>.svc`.
    pub name: Option<String>,
    /// Send the name as SNI (`proxy-ssl-server-name: "on"`).
    pub sni: bool,
    /// Check the backend's certificate against the `ca.crt` of this Secret
    /// (`namespace/name`, the Ingress's namespace: `proxy-ssl-verify: "on"` with
    /// `proxy-ssl-secret`); None: unverified (`proxy-ssl-verify: "off"`, the default).
    pub verify: Option<String>,
}

/// The key a backend verified against Secret `ns/name` is indexed under besides its
/// Service's, so a change of the Secret resolves it again (no Service key has a space).
pub(super) fn secret_dependency(secret: &str) -> String {
    format!("secret {secret}")
}

impl BackendRef {
    /// The same Service port spoken to as `other` is (a canary joining its main Ingress's
    /// path).
    pub(super) fn speaking_like(&self, other: &BackendRef) -> BackendRef {
        let speaks = Speaks {
            h2c: other.h2c,
            tls: other.tls.clone(),
        };
        let mut name = self.name[..self.port_end].to_owned();
        name.push_str(&speaks.suffix());
        BackendRef {
            name_key: sort_prefix(&name),
            name,
            h2c: speaks.h2c,
            tls: speaks.tls,
            ..self.clone()
        }
    }

    /// The Secret its TLS is verified with, if any.
    pub(super) fn verify_secret(&self) -> Option<&str> {
        self.tls.as_ref()?.verify.as_deref()
    }
}

impl BackendRef {
    pub(super) fn namespace(&self) -> &str {
        &self.name[..self.slash]
    }

    pub(super) fn service(&self) -> &str {
        &self.name[self.slash + 1..self.colon]
    }

    /// `namespace/service`: the key of [`ServiceDigest::key`] and [`SliceDigest::key`].
    pub(super) fn service_key(&self) -> &str {
        &self.name[..self.colon]
    }

    pub(super) fn port(&self) -> PortRef<'_> {
        match self.number {
            Some(n) => PortRef::Number(n),
            None => PortRef::Name(&self.name[self.colon + 1..self.port_end]),
        }
    }
}

/// The backend an Ingress backend refers to, or why it cannot be used.
pub(super) fn backend_ref(
    ns: &str,
    backend: &IngressBackend,
    speaks: &Speaks,
) -> Result<BackendRef, InvalidBackend> {
    if backend.resource.is_some() {
        return Err(InvalidBackend::Resource);
    }
    let svc = backend.service.as_ref().ok_or(InvalidBackend::NoService)?;
    let port = svc.port.as_ref().ok_or(InvalidBackend::NoPort)?;
    let port = match (port.number, port.name.as_deref()) {
        (Some(n), _) if (1..=65535).contains(&n) => PortRef::Number(n),
        (Some(n), _) => return Err(InvalidBackend::PortOutOfRange(n)),
        (None, Some(name)) if name.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty() => {
            return Err(InvalidBackend::NumericPortName(name.to_owned()));
        }
        (None, Some(name)) if !name.is_empty() => PortRef::Name(name),
        _ => return Err(InvalidBackend::NoPort),
    };
    let mut name = format!("{ns}/{}:{port}", svc.name);
    let port_end = name.len();
    name.push_str(&speaks.suffix());
    Ok(BackendRef {
        name_key: sort_prefix(&name),
        slash: ns.len(),
        colon: ns.len() + 1 + svc.name.len(),
        number: match port {
            PortRef::Number(n) => Some(n),
            PortRef::Name(_) => None,
        },
        port_end,
        h2c: speaks.h2c,
        tls: speaks.tls.clone(),
        name,
    })
}

/// The backend for port number `port` of Service `ns/svc` (a Gateway API backendRef).
pub(super) fn service_port_ref(ns: &str, svc: &str, port: i32) -> BackendRef {
    let name = format!("{ns}/{svc}:{port}");
    BackendRef {
        name_key: sort_prefix(&name),
        slash: ns.len(),
        colon: ns.len() + 1 + svc.len(),
        number: Some(port),
        port_end: name.len(),
        h2c: false,
        tls: None,
        name,
    }
}

/// For a wildcard such as `*.com` or `*.co.uk`, the public suffix it covers: such a host
/// would take every site under a registry. The list is Mozilla's Public Suffix List
/// (the `psl` crate); only its explicit rules count, so private names such as `*.test`
/// or `*.internal` (under the list's implicit `*` rule) are allowed.
pub fn wildcard_over_public_suffix(host: &str) -> Option<&str> {
    let parent = host.strip_prefix("*.")?;
    let suffix = psl::suffix(parent.as_bytes())?;
    (suffix.is_known() && suffix.as_bytes() == parent.as_bytes()).then_some(parent)
}

/// The first 16 bytes of `s`, big-endian, zero-padded: comparing these first, then the
/// whole strings on a tie, orders strings as comparing the strings does, while touching
/// only the (inline) keys in the common case.
pub(super) fn sort_prefix(s: &str) -> u128 {
    let mut bytes = [0u8; 16];
    let n = s.len().min(16);
    bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
    u128::from_be_bytes(bytes)
}

/// Backends by name.
pub(super) fn by_name(a: &BackendRef, b: &BackendRef) -> std::cmp::Ordering {
    a.name_key
        .cmp(&b.name_key)
        .then_with(|| a.name.cmp(&b.name))
}

/// Oldest first, then namespace/name: the order conflicts are decided in.
pub(super) fn by_age(a: &IngressDigest, b: &IngressDigest) -> std::cmp::Ordering {
    a.age_key.cmp(&b.age_key).then_with(|| {
        (&a.source.namespace, &a.source.name).cmp(&(&b.source.namespace, &b.source.name))
    })
}

/// Exact before Prefix, then longer paths first, then by path: the order a matcher tries.
pub fn sort_routes(routes: &mut [Route]) {
    routes.sort_by(|a, b| {
        let rank = |r: &Route| {
            if r.match_kind == MatchKind::Exact as i32 {
                0
            } else {
                1
            }
        };
        rank(a)
            .cmp(&rank(b))
            .then(b.path.len().cmp(&a.path.len()))
            .then(a.path.cmp(&b.path))
    });
}

/// [`sort_routes`] for an Ingress host's entries in the one route model: the same order;
/// at one path, entries with header matches (a canary's header rules) before those
/// without, each kept in the order given.
pub fn sort_ingress_routes(routes: &mut [holdfast_proto::v1::GatewayRoute]) {
    routes.sort_by(|a, b| {
        let rank = |kind: i32| i32::from(kind != MatchKind::Exact as i32);
        rank(a.match_kind)
            .cmp(&rank(b.match_kind))
            .then(b.path.len().cmp(&a.path.len()))
            .then(a.path.cmp(&b.path))
            .then(a.headers.is_empty().cmp(&b.headers.is_empty()))
    });
}
