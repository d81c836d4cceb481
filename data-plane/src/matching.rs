//! The one route lookup of both APIs, pure: [`Hosts`] selects a request's hostname entry,
//! and [`Paths`] the route within it. Ingress virtual hosts ([`crate::table`]) and Gateway
//! API hostnames ([`crate::gateway`]) both compile into them, and every request is matched
//! by [`Hosts::lookup`].
//!
//! Path precedence: an `Exact` path first; then `Prefix` paths from the longest,
//! element-wise on `/` (`/a` matches `/a`, `/a/` and `/a/b`, never `/ab`; a trailing `/`
//! of the request is not significant), one hash look-up per `/` boundary; at one path, the
//! entries in the order they were given, the first whose header matches all hold. Ingress
//! entries have no header matches (and the control plane sends one route per path and
//! kind, the oldest Ingress's); Gateway entries come most header matches first, then the
//! oldest route.
//!
//! Host selection is where the two specifications differ, and the one place the lookup
//! asks which API it serves ([`Selection`]): an Ingress wildcard covers exactly one label
//! and the host selected is final (a host without a matching path answers 404, or the
//! default backend); a Gateway API wildcard covers one or more labels and the hostname
//! levels fall through (exact, each wildcard from the longest, any).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use holdfast_http::headers::HeaderLookup;
use http::{HeaderName, HeaderValue};

use crate::shards::Shards;

/// How an entry matches the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRule {
    /// The whole path.
    Exact(String),
    /// Element-wise on `/`; no trailing `/` (except `/`).
    Prefix(String),
    /// A regular expression from the start of the path, case-insensitive (an Ingress's
    /// ingress-nginx `use-regex`): tried after the exact paths, in the order given, before
    /// the prefixes.
    Regex(PathRegex),
}

/// A compiled Ingress path regular expression
/// ([`holdfast_proto::snapshot::ingress_path_regex`]), with the path it was written as.
#[derive(Debug, Clone)]
pub struct PathRegex {
    /// The path as written.
    pub source: String,
    /// What it compiles to.
    pub regex: std::sync::Arc<regex::Regex>,
}

impl PartialEq for PathRegex {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for PathRegex {}

/// One route entry: its path rule, its header matches, any other conditions and what it
/// does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<A> {
    /// Path.
    pub path: PathRule,
    /// Header matches (all must hold).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// A Gateway match's method and query parameter conditions (None: there are none;
    /// boxed, as most entries have none).
    pub more: Option<Box<Conditions>>,
    /// What a match does.
    pub action: A,
}

/// A Gateway match's conditions besides path and headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditions {
    /// The method (upper case; None: any).
    pub method: Option<String>,
    /// Query parameters: the first parameter of each name (case-sensitive) must have
    /// exactly the value, both compared percent-decoded (`%74rue` is `true`, as a
    /// backend reads it; `+` is kept as it is).
    pub query: Vec<(String, String)>,
    /// Cookies (an Ingress canary's `canary-by-cookie`): a cookie of each name
    /// (case-sensitive) must have exactly the value.
    pub cookies: Vec<(String, String)>,
    /// Header patterns (an Ingress canary's `canary-by-header-pattern`): a value of each
    /// header must match its regular expression.
    pub header_patterns: Vec<(String, HeaderPattern)>,
}

/// A compiled header pattern, with the text it was written as.
#[derive(Debug, Clone)]
pub struct HeaderPattern(pub std::sync::Arc<regex::Regex>);

impl PartialEq for HeaderPattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for HeaderPattern {}

impl Conditions {
    /// Whether `request` meets every condition.
    pub fn hold(&self, request: &Asked<'_>) -> bool {
        self.method.as_deref().is_none_or(|m| m == request.method)
            && self.query.iter().all(|(name, value)| {
                first_parameter(request.query, name).is_some_and(|v| v == value.as_str())
            })
            && self
                .cookies
                .iter()
                .all(|(name, value)| has_cookie(request.headers, name, value))
            && self.header_patterns.iter().all(|(name, pattern)| {
                request.headers.any_value(name, &mut |v| {
                    std::str::from_utf8(v).is_ok_and(|v| pattern.0.is_match(v))
                })
            })
    }
}

/// Whether the first cookie named `name` (case-insensitively, as nginx's `$cookie_`
/// reads it) in the `Cookie` headers of `headers` has exactly `value` (`a=1; b=2`; spaces
/// around the pairs ignored).
pub fn has_cookie(headers: &dyn HeaderLookup, name: &str, value: &str) -> bool {
    cookie(headers, name).is_some_and(|v| v == value.as_bytes())
}

/// The value of the first cookie named `name` (case-insensitively) in the `Cookie`
/// headers of `headers`, as [`has_cookie`] reads them.
pub fn cookie(headers: &dyn HeaderLookup, name: &str) -> Option<Vec<u8>> {
    let mut first: Option<Vec<u8>> = None;
    headers.any_value("cookie", &mut |line| {
        for pair in line.split(|b| *b == b';') {
            let pair = pair.trim_ascii();
            let (n, v) = match pair.iter().position(|b| *b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &b""[..]),
            };
            if n.eq_ignore_ascii_case(name.as_bytes()) {
                first = Some(v.to_vec());
                return true;
            }
        }
        false
    });
    first
}

/// The value of the first parameter named `name` in `query` (`a=1&b&c=3`: `b` has the
/// value ""), name and value percent-decoded.
pub fn first_parameter<'q>(query: Option<&'q str>, name: &str) -> Option<Cow<'q, str>> {
    query?.split('&').find_map(|pair| {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decoded(n) == name).then(|| percent_decoded(v))
    })
}

/// `text` with each `%XX` decoded; as it is when it has none, or when the decoded bytes
/// are not UTF-8 (then it matches only a value written that way).
fn percent_decoded(text: &str) -> Cow<'_, str> {
    if !text.contains('%') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(_) => Cow::Borrowed(text),
    }
}

/// Whether `e`'s header matches and other conditions hold for `request` (None: only an
/// entry without them).
fn conditions_hold<A>(e: &Entry<A>, request: Option<&Asked<'_>>) -> bool {
    e.headers.iter().all(|(n, v)| {
        request.is_some_and(|r| {
            r.headers
                .any_value(n.as_str(), &mut |have| have == v.as_bytes())
        })
    }) && e
        .more
        .as_ref()
        .is_none_or(|c| request.is_some_and(|r| c.hold(r)))
}

/// What the lookup reads of a request besides its host and path.
pub struct Asked<'a> {
    /// The method, as sent.
    pub method: &'a str,
    /// The query, without its `?`.
    pub query: Option<&'a str>,
    /// The headers.
    pub headers: &'a dyn HeaderLookup,
}

/// One hostname's entries, indexed by path once there are more than [`SCANNED`].
#[derive(Debug, Clone)]
pub struct Paths<A> {
    entries: Vec<Entry<A>>,
    /// The positions of the regular-expression entries, in order (tried one by one).
    regexes: Vec<usize>,
    /// None for a few entries: they are scanned in order. Most hosts have one or two
    /// routes, and an index of hash tables would cost each a few hundred bytes.
    index: Option<Box<PathIndex>>,
}

/// Up to this many entries are scanned, not indexed.
const SCANNED: usize = 4;

/// A [`Paths`]'s entries by path: the positions of each exact path's and each prefix's
/// entries, in order.
#[derive(Debug, Clone, Default)]
struct PathIndex {
    exact: HashMap<String, Vec<usize>>,
    prefix: HashMap<String, Vec<usize>>,
}

impl<A> Default for Paths<A> {
    fn default() -> Self {
        Paths {
            entries: Vec::new(),
            regexes: Vec::new(),
            index: None,
        }
    }
}

impl<A> Paths<A> {
    /// The entries, in precedence order at each path.
    pub fn new(entries: Vec<Entry<A>>) -> Self {
        let indexed = entries.len() > SCANNED;
        Self::build(entries, indexed)
    }

    fn build(entries: Vec<Entry<A>>, indexed: bool) -> Self {
        let index = indexed.then(|| {
            let mut index = PathIndex::default();
            for (i, e) in entries.iter().enumerate() {
                match &e.path {
                    PathRule::Exact(p) => index.exact.entry(p.clone()).or_default().push(i),
                    PathRule::Prefix(p) => index.prefix.entry(p.clone()).or_default().push(i),
                    PathRule::Regex(_) => {}
                }
            }
            Box::new(index)
        });
        let regexes = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.path, PathRule::Regex(_)))
            .map(|(i, _)| i)
            .collect();
        Paths {
            entries,
            regexes,
            index,
        }
    }

    /// Every entry, in the order given.
    pub fn entries(&self) -> &[Entry<A>] {
        &self.entries
    }

    /// The first entry whose rule is `Exact(path)` (`exact`) or `Prefix(path)` and whose
    /// header matches hold.
    fn first(&self, exact: bool, path: &str, request: Option<&Asked<'_>>) -> Option<&Entry<A>> {
        let holds = |e: &&Entry<A>| conditions_hold(e, request);
        match &self.index {
            Some(index) => {
                let at = if exact { &index.exact } else { &index.prefix };
                at.get(path)?.iter().map(|i| &self.entries[*i]).find(holds)
            }
            None => self
                .entries
                .iter()
                .filter(|e| match &e.path {
                    PathRule::Exact(p) => exact && p == path,
                    PathRule::Prefix(p) => !exact && p == path,
                    PathRule::Regex(_) => false,
                })
                .find(holds),
        }
    }

    fn has_prefixes(&self) -> bool {
        match &self.index {
            Some(index) => !index.prefix.is_empty(),
            None => self
                .entries
                .iter()
                .any(|e| matches!(e.path, PathRule::Prefix(_))),
        }
    }

    /// The entry for a request at `path` (normalised) that is `request` (None: an entry
    /// with header or other conditions never matches), if any.
    pub fn lookup(&self, path: &str, headers: Option<&Asked<'_>>) -> Option<&Entry<A>> {
        if let Some(e) = self.first(true, path, headers) {
            return Some(e);
        }
        if let Some(e) = self.regexes.iter().map(|i| &self.entries[*i]).find(|e| {
            matches!(&e.path, PathRule::Regex(r) if r.regex.is_match(path))
                && conditions_hold(e, headers)
        }) {
            return Some(e);
        }
        if !self.has_prefixes() {
            return None;
        }
        let trimmed = path.trim_end_matches('/');
        if !trimmed.is_empty()
            && let Some(e) = self.first(false, trimmed, headers)
        {
            return Some(e);
        }
        let bytes = trimmed.as_bytes();
        for i in (1..bytes.len()).rev() {
            if bytes[i] == b'/'
                && let Some(e) = self.first(false, &trimmed[..i], headers)
            {
                return Some(e);
            }
        }
        self.first(false, "/", headers)
    }
}

/// How a request's host selects among the hostnames of a [`Hosts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Ingress: the exact host; else the wildcard `*.suffix` when the host is one label
    /// followed by `.suffix`; else the rules without a host. The first of these that
    /// exists is the only one tried: when none of its paths match, the lookup misses.
    Ingress,
    /// Gateway API: the exact hostname, then each wildcard covering the host (one or more
    /// labels) from the longest, then any hostname; the first whose paths match wins.
    Gateway,
}

/// A hostname level of a [`Hosts`] that a request's host selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level<'a> {
    /// The host itself.
    Exact(&'a str),
    /// A wildcard, by its suffix (`example.com` for `*.example.com`).
    Wildcard(&'a str),
    /// The entry for any host ("").
    Any,
}

impl Level<'_> {
    /// The hostname as a snapshot names it: the host, `*.suffix`, or "" for any.
    pub fn name(&self) -> String {
        match self {
            Level::Exact(h) => (*h).to_owned(),
            Level::Wildcard(suffix) => format!("*.{suffix}"),
            Level::Any => String::new(),
        }
    }
}

/// What a hostname's entry in a [`Hosts`] holds: its routes, indexed by path.
pub trait HostEntry {
    /// What a route does.
    type Action;
    /// The hostname's routes.
    fn paths(&self) -> &Paths<Self::Action>;
}

impl<A> HostEntry for Paths<A> {
    type Action = A;
    fn paths(&self) -> &Paths<A> {
        self
    }
}

impl<T: HostEntry> HostEntry for Arc<T> {
    type Action = T::Action;
    fn paths(&self) -> &Paths<T::Action> {
        (**self).paths()
    }
}

/// Why [`Hosts::lookup`] found no route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMiss<'a> {
    /// A hostname was selected (the first, for Gateway API), and no path of it matched.
    NoPath(Level<'a>),
    /// No hostname covers the host.
    NoHost,
}

/// The hostnames of one Ingress route table or one Gateway listener, each with its entry.
/// A copy shares every entry and copies only what a change touches ([`Shards`]).
#[derive(Debug, Clone)]
pub struct Hosts<V> {
    selection: Selection,
    exact: Shards<V>,
    /// By the wildcard's suffix (`example.com` for `*.example.com`).
    wildcard: Shards<V>,
    any: Option<V>,
}

impl<V: Clone> Hosts<V> {
    /// No hostnames, selected as `selection` says.
    pub fn new(selection: Selection) -> Self {
        Hosts {
            selection,
            exact: Shards::default(),
            wildcard: Shards::default(),
            any: None,
        }
    }

    /// Sets the entry of `host` (lower case, as a snapshot names it: `*.suffix` a
    /// wildcard, "" any host), returning the one it replaces. An exact host's key is
    /// `host` itself, so an entry that holds the name too can share it.
    pub fn insert(&mut self, host: impl Into<Arc<str>>, entry: V) -> Option<V> {
        let host: Arc<str> = host.into();
        if host.is_empty() {
            self.any.replace(entry)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            self.wildcard.insert(suffix.into(), entry)
        } else {
            self.exact.insert(host, entry)
        }
    }

    /// The copy of exact host `host`'s name its entry is kept under, to share.
    pub fn key_of(&self, host: &str) -> Option<Arc<str>> {
        if host.is_empty() || host.starts_with("*.") {
            return None;
        }
        self.exact.key_of(host)
    }

    /// Removes the entry of `host` (as [`insert`](Self::insert) names it).
    pub fn remove(&mut self, host: &str) -> Option<V> {
        if host.is_empty() {
            self.any.take()
        } else if let Some(suffix) = host.strip_prefix("*.") {
            self.wildcard.remove(suffix)
        } else {
            self.exact.remove(host)
        }
    }

    /// The entry of `host` (as [`insert`](Self::insert) names it).
    pub fn get(&self, host: &str) -> Option<&V> {
        if host.is_empty() {
            self.any.as_ref()
        } else if let Some(suffix) = host.strip_prefix("*.") {
            self.wildcard.get(suffix)
        } else {
            self.exact.get(host)
        }
    }

    /// Every entry: any host's, the exact hosts', the wildcards' (in no particular order
    /// within each).
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.any
            .iter()
            .chain(self.exact.values())
            .chain(self.wildcard.values())
    }

    /// The first hostname level covering `host` (normalised: lower case, without port),
    /// with its entry: for Ingress, the only one its requests use. Exact, then a wildcard
    /// (Ingress: the one for the text after the first label; Gateway API: the longest that
    /// covers the host), then any host.
    pub fn select<'s, 'h>(&'s self, host: &'h str) -> Option<(Level<'h>, &'s V)> {
        if let Some(v) = self.exact.get(host) {
            return Some((Level::Exact(host), v));
        }
        match self.selection {
            Selection::Ingress => {
                if let Some((first, rest)) = host.split_once('.')
                    && !first.is_empty()
                    && !rest.is_empty()
                    && let Some(v) = self.wildcard.get(rest)
                {
                    return Some((Level::Wildcard(rest), v));
                }
            }
            Selection::Gateway => {
                if let Some(found) = self.wildcards(host).next() {
                    return Some(found);
                }
            }
        }
        self.any.as_ref().map(|v| (Level::Any, v))
    }

    /// Gateway API: each wildcard covering `host`, longest first (a.b.example.com tries
    /// b.example.com, then example.com, then com).
    fn wildcards<'s, 'h>(&'s self, host: &'h str) -> impl Iterator<Item = (Level<'h>, &'s V)> {
        let none = self.wildcard.is_empty();
        host.match_indices('.')
            .take_while(move |_| !none)
            .filter_map(move |(i, _)| {
                let suffix = &host[i + 1..];
                self.wildcard
                    .get(suffix)
                    .map(|v| (Level::Wildcard(suffix), v))
            })
    }
}

impl<V: HostEntry + Clone> Hosts<V> {
    /// The route for a request to `host` (normalised: lower case, no port) at `path`
    /// (normalised) that is `headers` (None: an entry with conditions never matches):
    /// the one lookup of both APIs. Ingress: the entry [`select`](Hosts::select) gives,
    /// final. Gateway API: the first level, in that order, whose paths match.
    pub fn lookup<'s, 'h>(
        &'s self,
        host: &'h str,
        path: &str,
        headers: Option<&Asked<'_>>,
    ) -> Result<&'s Entry<V::Action>, HostMiss<'h>> {
        if self.selection == Selection::Ingress {
            let (level, entry) = self.select(host).ok_or(HostMiss::NoHost)?;
            return entry
                .paths()
                .lookup(path, headers)
                .ok_or(HostMiss::NoPath(level));
        }
        let found = self
            .exact
            .get(host)
            .and_then(|v| v.paths().lookup(path, headers))
            .or_else(|| {
                self.wildcards(host)
                    .find_map(|(_, v)| v.paths().lookup(path, headers))
            })
            .or_else(|| self.any.as_ref()?.paths().lookup(path, headers));
        found.ok_or_else(|| {
            self.select(host)
                .map_or(HostMiss::NoHost, |(l, _)| HostMiss::NoPath(l))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::HeaderMap;

    pub(crate) fn e(
        path: PathRule,
        headers: &[(&str, &str)],
        action: &'static str,
    ) -> Entry<&'static str> {
        Entry {
            path,
            more: None,
            headers: headers
                .iter()
                .map(|(n, v)| {
                    (
                        HeaderName::from_bytes(n.as_bytes()).unwrap(),
                        HeaderValue::from_str(v).unwrap(),
                    )
                })
                .collect(),
            action,
        }
    }

    pub(crate) fn p(s: &str) -> PathRule {
        PathRule::Prefix(s.into())
    }

    /// A GET without a query with these headers.
    pub(crate) fn get(h: &HeaderMap) -> Asked<'_> {
        Asked {
            method: "GET",
            query: None,
            headers: h,
        }
    }

    pub(crate) fn headers(h: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (n, v) in h {
            m.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    /// Regular-expression entries (ingress-nginx `use-regex`): after the exact paths, in
    /// the order given (the first that matches wins, its header matches held), before any
    /// prefix; case-insensitive, from the start of the path, not to its end. The same
    /// scanned or indexed.
    #[test]
    fn regex_paths_come_after_exact_and_before_prefixes_in_the_order_given() {
        let rx = |src: &str| {
            PathRule::Regex(PathRegex {
                source: src.into(),
                regex: std::sync::Arc::new(
                    holdfast_proto::snapshot::ingress_path_regex(src).unwrap(),
                ),
            })
        };
        for filler in [0, 6] {
            let mut entries = vec![
                e(PathRule::Exact("/api/v1".into()), &[], "exact"),
                e(rx("/api/v[0-9]+/users"), &[("x-v", "2")], "users-v2"),
                e(rx("/api/v[0-9]+/users"), &[], "users"),
                e(rx("/api"), &[], "api"),
                e(p("/api/v1/users/me"), &[], "prefix"),
            ];
            for i in 0..filler {
                entries.push(e(p(&format!("/filler{i}")), &[], "filler"));
            }
            let t = Paths::new(entries);
            let at = |path: &str, h: &[(&str, &str)]| {
                t.lookup(path, Some(&get(&headers(h)))).map(|e| e.action)
            };
            assert_eq!(at("/api/v1", &[]), Some("exact"));
            assert_eq!(at("/api/v2/users/7", &[("x-v", "2")]), Some("users-v2"));
            assert_eq!(at("/API/V2/Users", &[]), Some("users"), "case-insensitive");
            assert_eq!(
                at("/api/v1/users/me", &[]),
                Some("users"),
                "a regular expression wins over a longer prefix, as in nginx"
            );
            assert_eq!(
                at("/apifoo", &[]),
                Some("api"),
                "from the start, not element-wise"
            );
            assert_eq!(at("/x/api", &[]), None, "anchored at the start");
            assert_eq!(at("/filler1/x", &[]), (filler > 1).then_some("filler"));
        }
    }

    #[test]
    fn paths_exact_then_longest_prefix_and_headers_in_the_given_order() {
        let t = Paths::new(vec![
            e(PathRule::Exact("/a".into()), &[], "exact"),
            e(p("/a/b"), &[("x-v", "2"), ("x-w", "1")], "ab-two-headers"),
            e(p("/a/b"), &[("X-V", "2")], "ab-one-header"),
            e(p("/a/b"), &[], "ab"),
            e(p("/a"), &[], "a"),
        ]);
        let at = |path: &str, h: &[(&str, &str)]| {
            t.lookup(path, Some(&get(&headers(h)))).map(|e| e.action)
        };
        assert_eq!(at("/a", &[]), Some("exact"));
        assert_eq!(at("/a/", &[]), Some("a"), "exact is the whole path");
        assert_eq!(
            at("/a/b/c", &[("x-v", "2"), ("x-w", "1")]),
            Some("ab-two-headers")
        );
        assert_eq!(at("/a/b/c", &[("x-v", "2")]), Some("ab-one-header"));
        assert_eq!(
            at("/a/b", &[("x-v", "3")]),
            Some("ab"),
            "header values are exact"
        );
        assert_eq!(at("/a/bc", &[]), Some("a"), "element-wise");
        assert_eq!(at("/b", &[]), None);
        assert_eq!(
            at("/a/b", &[("x-v", "1"), ("x-v", "2")]),
            Some("ab-one-header"),
            "any of repeated values"
        );
        // Without request headers (how Ingress looks up), header matches never hold.
        assert_eq!(t.lookup("/a/b/c", None).map(|e| e.action), Some("ab"));
    }

    /// A cookie match (an Ingress canary's `canary-by-cookie`): the cookie of that name,
    /// in any `Cookie` line, has exactly the value.
    #[test]
    fn a_cookie_match_holds_for_that_cookie_s_exact_value() {
        let h = headers(&[("cookie", "a=1; canary=always"), ("cookie", "b=2")]);
        assert!(has_cookie(&h, "canary", "always"));
        assert!(has_cookie(&h, "b", "2"));
        assert!(!has_cookie(&h, "canary", "never"));
        assert!(
            has_cookie(&h, "Canary", "always"),
            "names compare as nginx's $cookie_ does"
        );
        let twice = headers(&[("cookie", "c=never; c=always")]);
        assert!(
            !has_cookie(&twice, "c", "always"),
            "the first of a name counts"
        );
        assert!(!has_cookie(&h, "canary", "alway"));
        assert!(!has_cookie(&headers(&[]), "canary", "always"));
        let mut by_cookie = e(p("/"), &[], "canary");
        by_cookie.more = Some(Box::new(Conditions {
            cookies: vec![("canary".into(), "always".into())],
            ..Conditions::default()
        }));
        let t = Paths::new(vec![by_cookie, e(p("/"), &[], "main")]);
        let at = |h: &[(&str, &str)]| {
            let h = headers(h);
            let asked = Asked {
                method: "GET",
                query: None,
                headers: &h,
            };
            t.lookup("/x", Some(&asked)).map(|e| e.action)
        };
        assert_eq!(at(&[("cookie", "canary=always")]), Some("canary"));
        assert_eq!(at(&[("cookie", "canary=never")]), Some("main"));
        assert_eq!(at(&[]), Some("main")); // A header pattern (canary-by-header-pattern): any value of the header matches.
        let mut by_pattern = e(p("/"), &[], "canary");
        by_pattern.more = Some(Box::new(Conditions {
            header_patterns: vec![(
                "x-pat".into(),
                HeaderPattern(std::sync::Arc::new(
                    holdfast_proto::snapshot::header_pattern_regex("^be(ta|tter)$").unwrap(),
                )),
            )],
            ..Conditions::default()
        }));
        let t = Paths::new(vec![by_pattern, e(p("/"), &[], "main")]);
        let at = |h: &[(&str, &str)]| {
            let h = headers(h);
            let asked = Asked {
                method: "GET",
                query: None,
                headers: &h,
            };
            t.lookup("/x", Some(&asked)).map(|e| e.action)
        };
        assert_eq!(at(&[("x-pat", "better")]), Some("canary"));
        assert_eq!(at(&[("x-pat", "alpha"), ("x-pat", "beta")]), Some("canary"));
        assert_eq!(at(&[("x-pat", "beta2")]), Some("main"));
        assert_eq!(at(&[]), Some("main"));
    }

    #[test]
    fn a_method_and_the_first_query_parameter_of_each_name_must_match() {
        let mut by_method = e(p("/"), &[], "patch");
        by_method.more = Some(Box::new(Conditions {
            method: Some("PATCH".into()),
            query: vec![],
            cookies: vec![],
            header_patterns: vec![],
        }));
        let mut by_query = e(p("/"), &[("v", "1")], "query");
        by_query.more = Some(Box::new(Conditions {
            method: None,
            query: vec![
                ("animal".into(), "whale".into()),
                ("Color".into(), "".into()),
            ],
            cookies: vec![],
            header_patterns: vec![],
        }));
        let t = Paths::new(vec![by_method, by_query, e(p("/"), &[], "any")]);
        let h = headers(&[("v", "1")]);
        let at = |method: &str, query: Option<&str>| {
            let asked = Asked {
                method,
                query,
                headers: &h,
            };
            t.lookup("/x", Some(&asked)).map(|e| e.action)
        };
        assert_eq!(at("PATCH", None), Some("patch"));
        assert_eq!(at("patch", None), Some("any"), "methods are case-sensitive");
        assert_eq!(at("GET", Some("animal=whale&Color=")), Some("query"));
        assert_eq!(at("GET", Some("x=1&animal=whale&Color")), Some("query"));
        assert_eq!(
            at("GET", Some("animal=dolphin&animal=whale&Color=")),
            Some("any"),
            "the first parameter of a name is the one compared"
        );
        assert_eq!(
            at("GET", Some("ANIMAL=whale&Color=")),
            Some("any"),
            "names are case-sensitive"
        );
        assert_eq!(at("GET", Some("animal=whaley&Color=")), Some("any"));
        assert_eq!(at("GET", Some("animal=whale")), Some("any"));
        assert_eq!(
            t.lookup("/x", None).map(|e| e.action),
            Some("any"),
            "without the request, conditions never hold"
        );
        assert_eq!(first_parameter(Some("a=1&b&c=3"), "b").as_deref(), Some(""));
        assert_eq!(first_parameter(Some("a=1=2"), "a").as_deref(), Some("1=2"));
        assert_eq!(first_parameter(None, "a"), None);
        // Compared as a backend reads them: percent-decoded.
        assert_eq!(at("GET", Some("%61nimal=%77hale&Color=")), Some("query"));
        assert_eq!(
            first_parameter(Some("x=%zz%2"), "x").as_deref(),
            Some("%zz%2"),
            "a broken escape stays as it is"
        );
        assert_eq!(first_parameter(Some("x=%ff"), "x").as_deref(), Some("%ff"));
    }

    proptest::proptest! {
        /// A few entries are scanned, more are looked up through the index: both give
        /// the same entry for every path and headers.
        #[test]
        fn scanning_the_entries_finds_what_the_index_finds(
            rules in proptest::collection::vec(
                (proptest::bool::ANY, 0..6usize, proptest::option::of(0..2usize)),
                0..9,
            ),
            path in 0..9usize,
            header in proptest::option::of(0..2usize),
        ) {
            const PATHS: [&str; 9] = ["/", "/a", "/a/b", "/b", "/a/b/c", "/ab", "/a/", "/b/a", "/a/b/"];
            const VALUES: [&str; 2] = ["1", "2"];
            let entries: Vec<Entry<&'static str>> = rules
                .iter()
                .enumerate()
                .map(|(i, (exact, at, value))| {
                    let rule = match (*exact, PATHS[*at].trim_end_matches('/')) {
                        (true, _) => PathRule::Exact(PATHS[*at].into()),
                        // Prefixes are kept without a trailing `/` (but `/`).
                        (false, "") => PathRule::Prefix("/".into()),
                        (false, prefix) => PathRule::Prefix(prefix.into()),
                    };
                    let hs: Vec<(&str, &str)> = value.iter().map(|v| ("x-v", VALUES[*v])).collect();
                    let mut entry = e(rule, &hs, "");
                    entry.action = ["e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8"][i];
                    entry
                })
                .collect();
            let request: Vec<(&str, &str)> = header.iter().map(|v| ("x-v", VALUES[*v])).collect();
            let request = headers(&request);
            let scanned = Paths::build(entries.clone(), false);
            let indexed = Paths::build(entries, true);
            proptest::prop_assert!(scanned.index.is_none() && indexed.index.is_some());
            let found = |t: &Paths<&'static str>| {
                t.lookup(PATHS[path], Some(&get(&request))).map(|e| e.action)
            };
            proptest::prop_assert_eq!(found(&scanned), found(&indexed));
        }
    }

    #[test]
    fn ingress_paths_the_first_given_wins_and_a_trailing_slash_is_not_significant() {
        let t = Paths::new(vec![
            e(p("/api"), &[], "older"),
            e(p("/api"), &[], "newer"),
            e(p("/"), &[], "root"),
            e(PathRule::Exact("/api/v1".into()), &[], "exact"),
        ]);
        let at = |path: &str| t.lookup(path, None).map(|e| e.action);
        assert_eq!(at("/api"), Some("older"));
        assert_eq!(at("/api/"), Some("older"));
        assert_eq!(at("/api/v1"), Some("exact"));
        assert_eq!(at("/api/v1/"), Some("older"), "exact is the whole path");
        assert_eq!(at("/apix"), Some("root"));
        assert_eq!(at("/"), Some("root"));
        assert_eq!(Paths::<&str>::default().lookup("/", None), None);
    }

    /// One set of hostnames, looked up under each API's selection: what the two share
    /// (exact first, then a wildcard, then any host) and where they differ (how many labels
    /// a wildcard covers; whether a path miss falls through).
    fn both(selection: Selection) -> Hosts<Paths<&'static str>> {
        let mut t = Hosts::new(selection);
        for (host, entries) in [
            ("a.example.com", vec![e(p("/only-exact"), &[], "exact")]),
            ("*.example.com", vec![e(p("/w"), &[], "wild")]),
            ("*.b.example.com", vec![e(p("/w"), &[], "longer-wild")]),
            ("", vec![e(p("/"), &[], "any")]),
        ] {
            assert!(t.insert(host, Paths::new(entries)).is_none());
        }
        t
    }

    #[test]
    fn gateway_hostnames_fall_through_exact_then_longest_wildcard_then_any() {
        let t = both(Selection::Gateway);
        let h = HeaderMap::new();
        let at =
            |host: &str, path: &str| t.lookup(host, path, Some(&get(&h))).ok().map(|e| e.action);
        assert_eq!(at("a.example.com", "/only-exact"), Some("exact"));
        assert_eq!(
            at("a.example.com", "/w"),
            Some("wild"),
            "falls through to the wildcard"
        );
        assert_eq!(at("x.b.example.com", "/w"), Some("longer-wild"));
        assert_eq!(
            at("x.y.example.com", "/w"),
            Some("wild"),
            "more than one label"
        );
        assert_eq!(
            at("example.com", "/w"),
            Some("any"),
            "the bare suffix is not covered"
        );
        assert_eq!(at("a.example.com", "/elsewhere"), Some("any"));
        let mut none = Hosts::new(Selection::Gateway);
        none.insert("a.example.com", Paths::new(vec![e(p("/x"), &[], "x")]));
        assert_eq!(
            none.lookup("a.example.com", "/y", Some(&get(&h)))
                .map(|e| e.action),
            Err(HostMiss::NoPath(Level::Exact("a.example.com")))
        );
        assert_eq!(
            none.lookup("b.example.com", "/x", Some(&get(&h)))
                .map(|e| e.action),
            Err(HostMiss::NoHost)
        );
    }

    #[test]
    fn ingress_hosts_select_one_level_and_a_wildcard_covers_one_label() {
        let t = both(Selection::Ingress);
        // The action, or the name of the host selected when no path matched (None: no
        // host covers the request's).
        let at = |host: &str, path: &str| {
            t.lookup(host, path, None)
                .map(|e| e.action)
                .map_err(|miss| match miss {
                    HostMiss::NoPath(level) => Some(level.name()),
                    HostMiss::NoHost => None,
                })
        };
        let selected = |name: &str| Err(Some(name.to_owned()));
        assert_eq!(at("a.example.com", "/only-exact"), Ok("exact"));
        assert_eq!(
            at("a.example.com", "/w"),
            selected("a.example.com"),
            "the exact host is final: no fall-through to the wildcard"
        );
        assert_eq!(at("x.example.com", "/w"), Ok("wild"));
        assert_eq!(
            at("x.example.com", "/elsewhere"),
            selected("*.example.com"),
            "nor from the wildcard to any host"
        );
        assert_eq!(at("x.b.example.com", "/w"), Ok("longer-wild"));
        assert_eq!(
            at("x.y.example.com", "/w"),
            Ok("any"),
            "a wildcard covers one label only: x.y.example.com is any host's"
        );
        assert_eq!(at("example.com", "/"), Ok("any"));
        assert_eq!(
            t.select(".example.com").map(|(l, _)| l),
            Some(Level::Any),
            "an empty first label is not covered"
        );
        let mut no_any = Hosts::new(Selection::Ingress);
        no_any.insert("a.example.com", Paths::new(vec![e(p("/"), &[], "a")]));
        assert_eq!(
            no_any.lookup("b.example.com", "/", None).map(|e| e.action),
            Err(HostMiss::NoHost)
        );
    }

    #[test]
    fn hosts_are_named_as_a_snapshot_names_them_and_replaced_in_place() {
        let mut t = both(Selection::Ingress);
        assert_eq!(Level::Wildcard("example.com").name(), "*.example.com");
        assert_eq!(Level::Exact("a.example.com").name(), "a.example.com");
        assert_eq!(Level::Any.name(), "");
        for host in ["a.example.com", "*.example.com", ""] {
            assert!(t.get(host).is_some(), "{host:?}");
        }
        assert_eq!(t.values().count(), 4);
        let old = t.insert("*.example.com", Paths::new(vec![e(p("/"), &[], "new")]));
        assert_eq!(old.map(|o| o.entries()[0].action), Some("wild"));
        assert_eq!(
            t.lookup("x.example.com", "/w", None).map(|e| e.action),
            Ok("new")
        );
        assert!(t.remove("*.example.com").is_some());
        assert!(t.remove("*.example.com").is_none());
        assert_eq!(
            t.lookup("x.example.com", "/w", None).map(|e| e.action),
            Ok("any")
        );
        assert_eq!(t.values().count(), 3);
    }
}
