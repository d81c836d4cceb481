//! W3C trace context (`traceparent`, <https://www.w3.org/TR/trace-context/>): the
//! context of the span the proxy makes of a request, continued from the client's or
//! started here, and the `traceparent` sent upstream (pure).
//!
//! Sampling is parent-based: a request whose `traceparent` is valid is sampled as its
//! flags say; a new trace is sampled when its id falls under the ratio (its lower 64 bits
//! as a fraction of 2^64, the `TraceIdRatioBased` rule, so every hop that sees one trace id
//! decides alike).

/// The `traceparent` header.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// The length of a version-00 `traceparent` value.
pub const TRACEPARENT_LEN: usize = 55;

/// One request's place in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace's id.
    pub trace_id: [u8; 16],
    /// This hop's span: the parent the upstream is told of.
    pub span_id: [u8; 8],
    /// The client's span, when the request came with a valid `traceparent`.
    pub parent: Option<[u8; 8]>,
    /// The span is recorded (and the upstream told so).
    pub sampled: bool,
}

/// A `traceparent` read: (trace id, parent span id, flags).
pub fn parse(value: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    let value = value.trim_ascii();
    // Version 00 is exactly 55 bytes; a later version may append fields after a `-`.
    if value.len() < TRACEPARENT_LEN
        || (value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-')
    {
        return None;
    }
    let version = hex::<1>(&value[0..2])?;
    if version[0] == 0xff || (version[0] == 0 && value.len() != TRACEPARENT_LEN) {
        return None;
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let trace_id = hex::<16>(&value[3..35])?;
    let parent = hex::<8>(&value[36..52])?;
    let flags = hex::<1>(&value[53..55])?;
    if trace_id == [0; 16] || parent == [0; 8] {
        return None;
    }
    Some((trace_id, parent, flags[0]))
}

/// `N` bytes from `2N` lower-case hex digits (upper case is invalid in trace context).
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = nibble(digits[2 * i])? << 4 | nibble(digits[2 * i + 1])?;
    }
    Some(out)
}

impl TraceContext {
    /// This hop's context: the client's trace continued (sampled as its flags say), or a
    /// new one sampled by `ratio` (0 to 1).
    pub fn start(incoming: Option<&[u8]>, ratio: f64) -> TraceContext {
        let random = crate::headers::random_u128();
        let span_id = ((random as u64) | 1).to_be_bytes();
        match incoming.and_then(parse) {
            Some((trace_id, parent, flags)) => TraceContext {
                trace_id,
                span_id,
                parent: Some(parent),
                sampled: flags & 1 == 1,
            },
            None => {
                let trace_id = crate::headers::random_u128().to_be_bytes();
                TraceContext {
                    trace_id,
                    span_id,
                    parent: None,
                    sampled: ratio_samples(&trace_id, ratio),
                }
            }
        }
    }

    /// The `traceparent` sent upstream: this trace, this hop's span as the parent.
    pub fn traceparent(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [0; TRACEPARENT_LEN];
        out[..3].copy_from_slice(b"00-");
        write_hex(&mut out[3..35], &self.trace_id);
        out[35] = b'-';
        write_hex(&mut out[36..52], &self.span_id);
        out[52] = b'-';
        out[53..].copy_from_slice(if self.sampled { b"01" } else { b"00" });
        out
    }

    /// Whether the upstream is sent this hop's `traceparent` instead of the client's:
    /// when this hop records its span, or the client sent none (or an invalid one). An
    /// unsampled client trace goes on as it came.
    pub fn replaces_client(&self) -> bool {
        self.sampled || self.parent.is_none()
    }

    /// The trace id in hex (the access log's `trace_id`).
    pub fn trace_id_hex(&self) -> [u8; 32] {
        let mut out = [0; 32];
        write_hex(&mut out, &self.trace_id);
        out
    }
}

/// Whether a new trace with this id is sampled at `ratio`.
fn ratio_samples(trace_id: &[u8; 16], ratio: f64) -> bool {
    if ratio.is_nan() || ratio <= 0.0 {
        return false;
    }
    if ratio >= 1.0 {
        return true;
    }
    let mut low = [0; 8];
    low.copy_from_slice(&trace_id[8..]);
    let below = (ratio * (u64::MAX as f64)) as u64;
    u64::from_be_bytes(low) < below
}

fn write_hex(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLED: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_continued_and_an_invalid_one_starts_a_new_trace() {
        let ctx = TraceContext::start(Some(SAMPLED), 0.0);
        assert_eq!(&ctx.trace_id_hex(), b"4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            ctx.parent,
            Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7])
        );
        assert!(ctx.sampled, "the parent's flag, whatever the ratio");
        let sent = ctx.traceparent();
        let (trace, parent, flags) = parse(&sent).expect("what is sent parses");
        assert_eq!((trace, parent, flags), (ctx.trace_id, ctx.span_id, 1));
        assert_ne!(ctx.span_id, [0; 8]);
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!TraceContext::start(Some(unsampled), 1.0).sampled);
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
            let ctx = TraceContext::start(Some(bad), 1.0);
            assert_eq!(ctx.parent, None);
            assert_ne!(&ctx.trace_id_hex(), b"4bf92f3577b34da6a3ce929d0e0e4736");
        }
        // A later version's extra fields are allowed.
        assert!(parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x").is_some());
    }

    #[test]
    fn new_traces_are_sampled_at_the_ratio() {
        let sampled = |ratio: f64| {
            (0..10_000)
                .filter(|_| TraceContext::start(None, ratio).sampled)
                .count()
        };
        assert_eq!(sampled(0.0), 0);
        assert_eq!(sampled(1.0), 10_000);
        let quarter = sampled(0.25);
        assert!((2_200..2_800).contains(&quarter), "{quarter}");
    }
}
