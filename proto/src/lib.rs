//! holdfast's gRPC protocol, generated from `proto/holdfast/v1/holdfast.proto`.
//!
//! # Layout
//! - [`v1`]: messages plus the `RouteDiscovery` and `Admin` clients and servers.
//! - [`wire`]: `DiscoveryResponse`, hand-written so a snapshot is encoded once and its
//!   bytes shared by every stream.
//! - [`backend_tls`]: TLS to a backend, from its snapshot entry (both planes).
//! - [`certificate`]: parsing and checking a TLS certificate and key (both planes).
//! - [`content`]: per-resource hashes and the content sum a snapshot's content hash is
//!   made from.
//! - [`delta`]: inventories, and snapshot deltas (diff and apply).
//! - [`snapshot`]: content hash, version and ordering rule, and validation, applied by both
//!   planes.
//! - `testing` (the `test-support` feature): `SnapshotBuilder`, snapshots for tests.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors (with `google/protobuf` imports) that
//!   the control plane registers with server reflection, so `grpcurl list` and `describe`
//!   work without proto files.

pub mod backend_tls;
pub mod certificate;
pub mod client;
pub mod content;
pub mod delta;
pub mod snapshot;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod wire;

/// Version 1 of the protocol.
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("holdfast.v1");
}

/// Encoded `FileDescriptorSet` of the protocol, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/holdfast_descriptor.bin"));
