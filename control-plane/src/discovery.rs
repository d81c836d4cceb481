//! `holdfast.v1.RouteDiscovery`: one stream per proxy, state-of-the-world with ACK/NACK.
//!
//! Each stream is its own task holding a `watch` receiver of the published snapshot, so a
//! slow or stuck proxy delays nobody else. A stream has at most one snapshot awaiting its
//! ACK or NACK; when the proxy answers, it is sent the newest snapshot, never a backlog.
//! Responses carry the snapshot's shared encoding.
//!
//! - [`stream`]: a stream's state ([`stream::Subscription`]) as plain functions: what to
//!   send next, and what an answer means.
//! - `service`: the gRPC method around it: the limits on what a proxy may send, the
//!   identity checks, and the task per stream.

mod service;
pub mod stream;

pub use service::{
    Discovery, FIRST_REQUEST_TIMEOUT, MAX_INVENTORY_ENTRIES, MAX_NODE_ID_BYTES, MAX_REQUEST_BYTES,
    MAX_ZONE_BYTES, REOFFER_EVERY, STREAM_ROUTES_PATH, UNBOUND_UNKNOWN, reported_unbound,
};
