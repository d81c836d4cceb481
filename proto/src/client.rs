//! Client settings for route discovery, shared by the proxy and the test subscribers.

use tonic::transport::{Channel, Endpoint};

use crate::v1::route_discovery_client::RouteDiscoveryClient;

/// Largest `DiscoveryResponse` a subscriber accepts. tonic's default (4 MiB) is smaller
/// than the snapshot of a large cluster (10,000 Ingresses encode to about 1.4 MB).
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// A subscriber's HTTP/2 stream receive window: a multi-megabyte snapshot arrives without
/// waiting for a window update every 64 KiB (the HTTP/2 default).
pub const STREAM_WINDOW: u32 = 8 << 20;
/// A subscriber's HTTP/2 connection receive window (several streams may share one).
pub const CONNECTION_WINDOW: u32 = 32 << 20;

/// `endpoint` with the receive windows a snapshot subscriber needs.
pub fn endpoint(endpoint: Endpoint) -> Endpoint {
    endpoint
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
}

/// A route discovery client on `channel` that accepts snapshots up to
/// [`MAX_RESPONSE_BYTES`].
pub fn route_discovery(channel: Channel) -> RouteDiscoveryClient<Channel> {
    RouteDiscoveryClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES)
}
