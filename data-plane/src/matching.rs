//! The path lookup of one hostname, shared by Ingress virtual hosts ([`crate::table`]) and
//! Gateway API hostnames ([`crate::gateway`]): both compile their routes into [`Entry`]s
//! of a [`Paths`], and a request is matched by the one [`Paths::lookup`]. Pure.
//!
//! Precedence: an `Exact` path first; then `Prefix` paths from the longest, element-wise
//! on `/` (`/a` matches `/a`, `/a/` and `/a/b`, never `/ab`; a trailing `/` of the request
//! is not significant), one hash look-up per `/` boundary; at one path, the entries in
//! the order they were given, the first whose header matches all hold. Ingress entries
//! have no header matches (and the control plane sends one route per path and kind, the
//! oldest Ingress's); Gateway entries come most header matches first, then the oldest
//! route.
//!
//! What differs between the two APIs is above this, in how a hostname selects its
//! `Paths` (the specifications differ): an Ingress wildcard covers exactly one label and
//! a host without a matching path answers 404 (or the default backend); a Gateway API
//! wildcard covers one or more labels and the hostname levels fall through (exact, the
//! longest wildcard, any).

use std::collections::HashMap;

use http::{HeaderMap, HeaderName, HeaderValue};

/// How an entry matches the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRule {
    /// The whole path.
    Exact(String),
    /// Element-wise on `/`; no trailing `/` (except `/`).
    Prefix(String),
}

/// One route entry: its path rule, its header matches and what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<A> {
    /// Path.
    pub path: PathRule,
    /// Header matches (all must hold).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// What a match does.
    pub action: A,
}

/// One hostname's entries, indexed by path.
#[derive(Debug, Clone)]
pub struct Paths<A> {
    entries: Vec<Entry<A>>,
    exact: HashMap<String, Vec<usize>>,
    prefix: HashMap<String, Vec<usize>>,
}

impl<A> Default for Paths<A> {
    fn default() -> Self {
        Paths {
            entries: Vec::new(),
            exact: HashMap::new(),
            prefix: HashMap::new(),
        }
    }
}

impl<A> Paths<A> {
    /// The entries, in precedence order at each path.
    pub fn new(entries: Vec<Entry<A>>) -> Self {
        let mut exact: HashMap<String, Vec<usize>> = HashMap::new();
        let mut prefix: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            match &e.path {
                PathRule::Exact(p) => exact.entry(p.clone()).or_default().push(i),
                PathRule::Prefix(p) => prefix.entry(p.clone()).or_default().push(i),
            }
        }
        Paths {
            entries,
            exact,
            prefix,
        }
    }

    /// Every entry, in the order given.
    pub fn entries(&self) -> &[Entry<A>] {
        &self.entries
    }

    fn first(&self, at: Option<&Vec<usize>>, headers: Option<&HeaderMap>) -> Option<&Entry<A>> {
        at?.iter().map(|i| &self.entries[*i]).find(|e| {
            e.headers
                .iter()
                .all(|(n, v)| headers.is_some_and(|h| h.get_all(n).iter().any(|have| have == v)))
        })
    }

    /// The entry for a request at `path` (normalised) with `headers` (None: an entry with
    /// header matches never matches), if any.
    pub fn lookup(&self, path: &str, headers: Option<&HeaderMap>) -> Option<&Entry<A>> {
        if let Some(e) = self.first(self.exact.get(path), headers) {
            return Some(e);
        }
        if self.prefix.is_empty() {
            return None;
        }
        let trimmed = path.trim_end_matches('/');
        if !trimmed.is_empty()
            && let Some(e) = self.first(self.prefix.get(trimmed), headers)
        {
            return Some(e);
        }
        let bytes = trimmed.as_bytes();
        for i in (1..bytes.len()).rev() {
            if bytes[i] == b'/'
                && let Some(e) = self.first(self.prefix.get(&trimmed[..i]), headers)
            {
                return Some(e);
            }
        }
        self.first(self.prefix.get("/"), headers)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn e(
        path: PathRule,
        headers: &[(&str, &str)],
        action: &'static str,
    ) -> Entry<&'static str> {
        Entry {
            path,
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

    #[test]
    fn paths_exact_then_longest_prefix_and_headers_in_the_given_order() {
        let t = Paths::new(vec![
            e(PathRule::Exact("/a".into()), &[], "exact"),
            e(p("/a/b"), &[("x-v", "2"), ("x-w", "1")], "ab-two-headers"),
            e(p("/a/b"), &[("X-V", "2")], "ab-one-header"),
            e(p("/a/b"), &[], "ab"),
            e(p("/a"), &[], "a"),
        ]);
        let at =
            |path: &str, h: &[(&str, &str)]| t.lookup(path, Some(&headers(h))).map(|e| e.action);
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
}
