//! A Gateway rule's CORS filter (`HTTPCORSFilter`), pure: whether an origin is allowed,
//! and the headers of a preflight's answer and of an actual response. The routing
//! decision ([`crate::proxy::routing`]) answers a preflight itself and adds the actual
//! response's headers to the upstream's (replacing any it sent).
//!
//! Origins are compared as the Fetch standard serialises them (`scheme://host[:port]`,
//! case-insensitively, a scheme's default port, 80 or 443, the same as none): `*` allows
//! any; `https://*.example.com` allows any host with one or more labels before
//! `.example.com` on that scheme, and no other port unless it names one.

use holdfast_http::headers::HeaderChanges;
use http::{HeaderName, HeaderValue, header};

/// A compiled CORS filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cors {
    /// `*`, or `scheme://host[:port]` with the host possibly `*.suffix`; lower case.
    pub allow_origins: Vec<String>,
    /// Access-Control-Allow-Credentials: true.
    pub allow_credentials: bool,
    /// Methods, or `*`.
    pub allow_methods: Vec<String>,
    /// Header names, or `*`.
    pub allow_headers: Vec<String>,
    /// Header names the client may read.
    pub expose_headers: Vec<String>,
    /// A preflight's Access-Control-Max-Age, in seconds.
    pub max_age: u32,
}

/// An origin or pattern as compared: lower case, without its scheme's default port.
pub fn normal_origin(origin: &str) -> String {
    let lower = origin.to_ascii_lowercase();
    for (scheme, port) in [("http://", ":80"), ("https://", ":443")] {
        if lower.starts_with(scheme)
            && let Some(bare) = lower.strip_suffix(port)
        {
            return bare.to_owned();
        }
    }
    lower
}

/// One pattern against one origin, both as [`normal_origin`] makes them.
fn origin_matches(pattern: &str, origin: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let Some((p_scheme, p_rest)) = pattern.split_once("://") else {
        return false;
    };
    let Some((o_scheme, o_rest)) = origin.split_once("://") else {
        return false;
    };
    if p_scheme != o_scheme {
        return false;
    }
    match p_rest.strip_prefix('*') {
        // `*.example.com[:port]`: the origin's host and port end with `.example.com[:port]`
        // after at least one character of its own.
        Some(suffix) => {
            o_rest.len() > suffix.len()
                && o_rest.ends_with(suffix)
                && !o_rest[..o_rest.len() - suffix.len()].contains([':', '/'])
        }
        None => p_rest == o_rest,
    }
}

fn value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

impl Cors {
    /// Whether `origin` (as the request's Origin sent it) is allowed; the patterns are
    /// as [`normal_origin`] makes them.
    pub fn allows(&self, origin: &str) -> bool {
        let origin = normal_origin(origin);
        origin != "null"
            && self
                .allow_origins
                .iter()
                .any(|p| origin_matches(p, &origin))
    }

    fn wildcard(list: &[String]) -> bool {
        list.iter().any(|m| m == "*")
    }

    /// Whether every origin gets `*` (so no answer depends on the Origin).
    fn any(&self) -> bool {
        Self::wildcard(&self.allow_origins) && !self.allow_credentials
    }

    /// The Allow-Origin and Allow-Credentials headers for an allowed `origin`.
    fn origin_headers(&self, origin: &str, out: &mut Vec<(HeaderName, HeaderValue)>) {
        let allowed = if self.any() {
            value("*")
        } else {
            value(origin)
        };
        if let Some(v) = allowed {
            out.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, v));
        }
        if self.allow_credentials {
            out.push((
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            ));
        }
    }

    /// The headers of the answer to a preflight from an allowed `origin` that asks for
    /// `method` and `headers` (Access-Control-Request-Method and -Headers).
    pub fn preflight(&self, origin: &str, method: &str, headers: Option<&str>) -> HeaderChanges {
        let mut set = Vec::new();
        self.origin_headers(origin, &mut set);
        let methods = if Self::wildcard(&self.allow_methods) {
            if self.allow_credentials {
                method.to_owned()
            } else {
                "*".to_owned()
            }
        } else {
            self.allow_methods.join(", ")
        };
        if let Some(v) = value(&methods).filter(|_| !methods.is_empty()) {
            set.push((header::ACCESS_CONTROL_ALLOW_METHODS, v));
        }
        let allowed_headers = if Self::wildcard(&self.allow_headers) {
            match (self.allow_credentials, headers) {
                (true, Some(asked)) => asked.to_owned(),
                (true, None) => String::new(),
                (false, _) => "*".to_owned(),
            }
        } else {
            self.allow_headers.join(", ")
        };
        if let Some(v) = value(&allowed_headers).filter(|_| !allowed_headers.is_empty()) {
            set.push((header::ACCESS_CONTROL_ALLOW_HEADERS, v));
        }
        self.expose(&mut set);
        set.push((
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from(self.max_age),
        ));
        HeaderChanges {
            set,
            add: self.vary(),
            ..HeaderChanges::default()
        }
    }

    /// Access-Control-Expose-Headers; with credentials a `*` is not a wildcard (the Fetch
    /// standard), so it is left out.
    fn expose(&self, out: &mut Vec<(HeaderName, HeaderValue)>) {
        let names: Vec<&str> = self
            .expose_headers
            .iter()
            .map(String::as_str)
            .filter(|h| !(self.allow_credentials && *h == "*"))
            .collect();
        let exposed = names.join(", ");
        if let Some(v) = value(&exposed).filter(|_| !exposed.is_empty()) {
            out.push((header::ACCESS_CONTROL_EXPOSE_HEADERS, v));
        }
    }

    /// `Vary: origin` appended (the backend's own Vary kept) when the answer depends on
    /// the Origin, so a cache never serves one origin's answer to another.
    fn vary(&self) -> Vec<(HeaderName, HeaderValue)> {
        if self.any() {
            Vec::new()
        } else {
            vec![(header::VARY, HeaderValue::from_static("origin"))]
        }
    }

    /// The changes to an actual response to a request from `origin`: the CORS headers
    /// when it is allowed, and `Vary: origin` whether it is or not.
    pub fn actual(&self, origin: &str) -> HeaderChanges {
        let mut set = Vec::new();
        if self.allows(origin) {
            self.origin_headers(origin, &mut set);
            self.expose(&mut set);
        }
        HeaderChanges {
            set,
            add: self.vary(),
            ..HeaderChanges::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: &[&str], credentials: bool, methods: &[&str], headers: &[&str]) -> Cors {
        let list = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
        Cors {
            allow_origins: list(origins),
            allow_credentials: credentials,
            allow_methods: list(methods),
            allow_headers: list(headers),
            expose_headers: list(&["x-header-3", "x-header-4"]),
            max_age: 3600,
        }
    }

    fn get<'a>(h: &'a HeaderChanges, name: &str) -> Option<&'a str> {
        h.set
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.to_str().ok())
    }

    #[test]
    fn origins_match_exactly_or_by_a_wildcard_of_one_or_more_labels() {
        let c = cors(
            &[
                "https://www.foo.com",
                "https://*.bar.com",
                "http://*.p.test:8080",
                "https://d.test",
            ],
            true,
            &["GET"],
            &[],
        );
        for allowed in [
            "https://www.foo.com",
            "HTTPS://WWW.FOO.COM",
            "https://www.bar.com",
            "https://xpto.www.bar.com",
            "http://a.p.test:8080",
            "https://d.test:443",
            "https://x.bar.com:443",
        ] {
            assert!(c.allows(allowed), "{allowed}");
        }
        assert_eq!(normal_origin("HTTPS://A.test:443"), "https://a.test");
        assert_eq!(normal_origin("http://a.test:80"), "http://a.test");
        assert_eq!(normal_origin("http://a.test:443"), "http://a.test:443");
        for refused in [
            "https://foobar.com",
            "http://www.foo.com",
            "https://www.foo.com:8443",
            "https://bar.com",
            "https://x.bar.com:8443",
            "http://a.p.test",
            "null",
            "",
        ] {
            assert!(!c.allows(refused), "{refused}");
        }
        assert!(cors(&["*"], false, &[], &[]).allows("https://foobar.com:12345"));
    }

    #[test]
    fn a_preflight_lists_or_echoes_what_is_allowed_and_credentials_never_meet_a_wildcard() {
        let listed = cors(
            &["https://www.foo.com"],
            true,
            &["GET", "OPTIONS"],
            &["x-header-1", "x-header-2"],
        );
        let h = listed.preflight("https://www.foo.com", "GET", Some("x-header-1"));
        assert_eq!(
            get(&h, "access-control-allow-origin"),
            Some("https://www.foo.com")
        );
        assert_eq!(
            get(&h, "access-control-allow-methods"),
            Some("GET, OPTIONS")
        );
        assert_eq!(
            get(&h, "access-control-allow-headers"),
            Some("x-header-1, x-header-2")
        );
        assert_eq!(
            get(&h, "access-control-expose-headers"),
            Some("x-header-3, x-header-4")
        );
        assert_eq!(get(&h, "access-control-max-age"), Some("3600"));
        assert_eq!(get(&h, "access-control-allow-credentials"), Some("true"));
        assert_eq!(h.add.len(), 1, "Vary: origin appended, the backend's kept");

        // Wildcards with credentials: the origin, method and headers asked for are echoed.
        let echoing = cors(&["*"], true, &["*"], &["*"]);
        let h = echoing.preflight("https://other.foo.com", "PUT", Some("x-a, x-b"));
        assert_eq!(
            get(&h, "access-control-allow-origin"),
            Some("https://other.foo.com")
        );
        assert_eq!(get(&h, "access-control-allow-methods"), Some("PUT"));
        assert_eq!(get(&h, "access-control-allow-headers"), Some("x-a, x-b"));
        // Without credentials: the wildcards themselves, and no Allow-Credentials.
        let open = cors(&["*"], false, &["*"], &["*"]);
        let h = open.preflight("https://other.foo.com", "PUT", Some("x-a"));
        assert_eq!(get(&h, "access-control-allow-origin"), Some("*"));
        assert_eq!(get(&h, "access-control-allow-methods"), Some("*"));
        assert_eq!(get(&h, "access-control-allow-headers"), Some("*"));
        assert_eq!(get(&h, "access-control-allow-credentials"), None);
        assert!(h.add.is_empty(), "no answer depends on the origin");
    }

    #[test]
    fn an_actual_response_gets_the_origin_credentials_and_exposed_headers() {
        let mut c = cors(&["https://www.foo.com"], true, &["GET"], &[]);
        let set = c.actual("https://www.foo.com");
        assert_eq!(
            get(&set, "access-control-allow-origin"),
            Some("https://www.foo.com")
        );
        assert_eq!(get(&set, "access-control-allow-credentials"), Some("true"));
        assert_eq!(
            get(&set, "access-control-expose-headers"),
            Some("x-header-3, x-header-4")
        );
        assert_eq!(get(&set, "access-control-allow-methods"), None);
        let other = c.actual("https://evil.test");
        assert!(other.set.is_empty(), "{other:?}");
        assert_eq!(other.add.len(), 1, "Vary: origin all the same");
        // With credentials, `*` is not a wildcard for exposed headers: left out.
        c.expose_headers = vec!["*".into(), "x-a".into()];
        assert_eq!(
            get(
                &c.actual("https://www.foo.com"),
                "access-control-expose-headers"
            ),
            Some("x-a")
        );
    }
}
