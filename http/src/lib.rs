//! holdfast's HTTP mechanics, the protocol side of the proxy: what a byte stream and a
//! request head mean, independent of routes and backends (pingora's `protocols::http`
//! and linkerd's `proxy/http` draw the same line). The data plane keeps routing,
//! balancing and its answers' reasons.
//!
//! - [`framing`]: follows HTTP/1.1 framing on the raw byte stream to reject
//!   request-smuggling shapes, and times request heads (pure).
//! - [`h1`]: HTTP/1.1 heads parsed once into positions in the read buffer, with the
//!   framing rules applied; the chunked coding followed without copying (pure); and the
//!   native engine ([`h1::engine`]) that serves client connections with them, for any
//!   proxy that implements its [`h1::engine::Service`].
//! - [`headers`]: request framing checks and header rewriting: hop-by-hop headers,
//!   forwarding headers, upgrades (pure).
//! - [`path`]: the request path normalised as the backend will see it (pure).
//! - [`inflight`]: counted slots (requests, connections, HTTP/2 streams) given back
//!   when dropped.
//! - [`upstream`]: upstream connections: where each goes, an endpoint's number in a
//!   worker's idle pool, opening one.
//! - [`routing`]: what routing reads of a request and what it decides, generic over
//!   the proxy's routes.
//! - [`forward`]: where each attempt to forward goes, and why forwarding failed.
//! - [`tunnel`]: upgraded connections' tunnels, with their idle timeout and shutdown.
//! - [`clock`]: a worker's coarse clock, read once per turn of its event loop.
//! - [`trace`]: W3C trace context: a request's span continued or started, and the
//!   `traceparent` sent upstream (pure).

pub mod clock;
pub mod forward;
pub mod framing;
pub mod h1;
pub mod headers;
pub mod inflight;
pub mod path;
pub mod routing;
pub mod trace;
pub mod tunnel;
pub mod upstream;
