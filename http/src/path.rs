//! The request path as the backend will see it: routing matches the normalised path and
//! the normalised path is what is forwarded, so `//admin`, `/./admin`, `/%61dmin` or
//! `/x/../admin` cannot reach a route other than `/admin`'s (pure; Envoy's
//! `normalize_path`, `merge_slashes` and `path_with_escaped_slashes_action` are the model).
//!
//! In order:
//! 1. **Percent-decoding of unreserved characters** (RFC 3986 §2.3: letters, digits,
//!    `-`, `.`, `_`, `~`): `%61` → `a`, `%2E` → `.`. Other escapes stay escaped, with
//!    upper-case hex (`%3f` → `%3F`). A `%` not followed by two hex digits is refused.
//! 2. **Escaped slashes**: `%2F` and `%5C` (`/` and `\`) are refused by default, since a
//!    backend that decodes them would see another path than the one routed. With
//!    [`EscapedSlashes::Keep`] they stay as they are, inside their segment (for
//!    applications that put `%2F` in paths on purpose; the backend must not decode them
//!    before routing).
//! 3. **Merging slashes**: `//` → `/`.
//! 4. **Removing dot segments** (RFC 3986 §5.2.4): `/a/./b` → `/a/b`, `/a/b/../c` →
//!    `/a/c`. A `..` that would climb above the root is refused, not clamped.
//!
//! Also refused: NUL (`%00`), and a raw `\` (some servers treat it as `/`). The query is
//! not part of the path and is not touched; `*` (the asterisk-form of OPTIONS) is left as
//! it is.

use std::borrow::Cow;

/// What to do with `%2F` and `%5C` in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// Refuse the request (400).
    #[default]
    Reject,
    /// Keep them escaped, as part of their segment.
    Keep,
}

/// Why a path cannot be normalised safely (the request gets 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%2F` or `%5C` with [`EscapedSlashes::Reject`].
    #[error("the path contains an escaped '/' or '\\'")]
    EscapedSlash,
    /// A raw backslash.
    #[error("the path contains '\\'")]
    Backslash,
    /// `%00`.
    #[error("the path contains NUL")]
    Nul,
    /// A `%` not followed by two hex digits.
    #[error("the path contains a malformed percent-escape")]
    BadEscape,
    /// `..` above the root.
    #[error("the path climbs above the root with '..'")]
    AboveRoot,
    /// The path does not start with `/`.
    #[error("the path does not start with '/'")]
    NotAbsolute,
    /// `..;` or `.;x` as a segment (see [`has_dot_segment_params`]).
    #[error("the path has a dot segment with parameters ('..;' or '.;')")]
    DotSegmentParams,
}

/// Whether `path` has a segment that is `.` or `..` followed by path parameters (`..;`,
/// `.;x`). Java servlet containers drop the parameters and then read the segment as a dot
/// segment, so `/public/..;/admin` reaches `/admin` there while routing matched
/// `/public/`: refused with 400 unless `--allow-dot-segment-params`.
pub fn has_dot_segment_params(path: &str) -> bool {
    path.contains(';')
        && path.split('/').any(|seg| {
            let name = seg.split(';').next().unwrap_or_default();
            seg.contains(';') && (name == "." || name == "..")
        })
}

/// A hex digit's value.
pub(crate) fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Does `path` need any work? (The common case: no `%`, no `\`, no `//`, no dot
/// segment, so it is returned as it is without allocating.)
fn is_normal(path: &str) -> bool {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') || b.iter().any(|c| matches!(c, b'%' | b'\\' | 0)) {
        return false;
    }
    // Every segment after a '/' is non-empty (except a trailing one) and not "." or "..".
    let mut segments = path[1..].split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        if (seg.is_empty() && !last) || seg == "." || seg == ".." {
            return false;
        }
    }
    true
}

/// The normalised form of `path` (the path of a request target, without its query), or
/// why it cannot be normalised safely.
pub fn normalise(path: &str, escaped: EscapedSlashes) -> Result<Cow<'_, str>, PathError> {
    // The asterisk-form of OPTIONS names no resource: nothing to normalise.
    if is_normal(path) || path == "*" {
        return Ok(Cow::Borrowed(path));
    }
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    // 1 and 2: decode unreserved escapes, normalise the hex of the others, check slashes.
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(PathError::BadEscape);
                };
                let value = hi * 16 + lo;
                match value {
                    0 => return Err(PathError::Nul),
                    b'/' | b'\\' if escaped == EscapedSlashes::Reject => {
                        return Err(PathError::EscapedSlash);
                    }
                    v if unreserved(v) => decoded.push(v as char),
                    v => {
                        decoded.push('%');
                        decoded.push(char::from(b"0123456789ABCDEF"[usize::from(v >> 4)]));
                        decoded.push(char::from(b"0123456789ABCDEF"[usize::from(v & 15)]));
                    }
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            0 => return Err(PathError::Nul),
            _ => {
                // Bytes of a multi-byte character are copied whole, below.
                let ch_len = path[i..].chars().next().map_or(1, char::len_utf8);
                decoded.push_str(&path[i..i + ch_len]);
                i += ch_len;
            }
        }
    }
    // 3 and 4: merge slashes and remove dot segments, segment by segment.
    let trailing = decoded.ends_with('/')
        || decoded.ends_with("/.")
        || decoded.ends_with("/..")
        || decoded == "/";
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (trailing && !segments.is_empty()) {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, PathError> {
        normalise(p, EscapedSlashes::Reject).map(Cow::into_owned)
    }

    #[test]
    fn the_bypass_shapes_of_a_protected_prefix_all_become_it_or_are_refused() {
        for p in [
            "//admin",
            "/./admin",
            "/%61dmin",
            "/x/../admin",
            "/%2E/admin",
            "/x/%2e%2E/admin",
        ] {
            assert_eq!(n(p).as_deref(), Ok("/admin"), "{p}");
        }
        assert_eq!(n("/public/..%2fadmin"), Err(PathError::EscapedSlash));
        assert_eq!(n("/a%5Cb"), Err(PathError::EscapedSlash));
        assert_eq!(n("/a\\b"), Err(PathError::Backslash));
        assert_eq!(n("/a%00b"), Err(PathError::Nul));
        assert_eq!(n("/../admin"), Err(PathError::AboveRoot));
        assert_eq!(n("/a/../../admin"), Err(PathError::AboveRoot));
        assert_eq!(n("/a%2"), Err(PathError::BadEscape));
        assert_eq!(n("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(n("admin"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn normal_paths_are_returned_untouched_without_allocating() {
        for p in ["/", "/a", "/a/b/", "/a.b/c..d/.e", "/a-b_c~d", "/é/ü"] {
            assert!(
                matches!(normalise(p, EscapedSlashes::Reject), Ok(Cow::Borrowed(x)) if x == p),
                "{p}"
            );
        }
    }

    #[test]
    fn trailing_slashes_and_other_escapes_are_kept() {
        assert_eq!(n("/a/b/").as_deref(), Ok("/a/b/"));
        assert_eq!(n("/a/b/.").as_deref(), Ok("/a/b/"));
        assert_eq!(n("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(n("/a/..").as_deref(), Ok("/"));
        assert_eq!(n("//").as_deref(), Ok("/"));
        assert_eq!(n("/a%20b%3f").as_deref(), Ok("/a%20b%3F"));
        assert_eq!(n("/caf%C3%A9").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(n("/a//b///c").as_deref(), Ok("/a/b/c"));
    }

    #[test]
    fn escaped_slashes_can_be_kept_inside_their_segment() {
        let keep = |p| normalise(p, EscapedSlashes::Keep).map(Cow::into_owned);
        assert_eq!(keep("/api/a%2Fb").as_deref(), Ok("/api/a%2Fb"));
        assert_eq!(keep("/api/a%2fb").as_deref(), Ok("/api/a%2Fb"));
        // Not a dot segment: the escaped slash keeps "..%2F" one segment.
        assert_eq!(
            keep("/public/..%2fadmin").as_deref(),
            Ok("/public/..%2Fadmin")
        );
        assert_eq!(keep("/a%00"), Err(PathError::Nul));
    }
}
