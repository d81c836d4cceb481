//! `holdfast.v1.DiscoveryResponse`, written by hand so that a snapshot is encoded once and
//! its bytes are shared by every stream (docs/design.md, "The protocol": encoded once).
//!
//! On the wire it is exactly the message in `holdfast.proto`: field 3 holds the encoded
//! `Snapshot`. The control plane builds it from [`EncodedSnapshot`] (a cheap `Bytes` clone
//! per stream); the proxy decodes field 3 into a [`Snapshot`] as usual.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint};
use prost::{DecodeError, Message};

use crate::v1::{Snapshot, SnapshotDelta};

const SNAPSHOT_TAG: u32 = 3;
const DELTA_TAG: u32 = 4;

/// A snapshot encoded once, shared by reference count.
#[derive(Clone, Default, PartialEq)]
pub struct EncodedSnapshot {
    bytes: Bytes,
}

/// The length only: the bytes hold certificates' private keys.
impl std::fmt::Debug for EncodedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncodedSnapshot(<{} bytes>)", self.bytes.len())
    }
}

impl EncodedSnapshot {
    /// Encodes `snapshot` once.
    pub fn new(snapshot: &Snapshot) -> Self {
        EncodedSnapshot {
            bytes: snapshot.encode_to_vec().into(),
        }
    }

    /// Wraps a snapshot's encoding made elsewhere.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        EncodedSnapshot {
            bytes: bytes.into(),
        }
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// One gRPC message (length-prefixed, uncompressed) carrying a `DiscoveryResponse` with
/// `snapshot`, as two buffers: a small head (the 5-byte gRPC prefix, the version and nonce
/// fields, the snapshot field's key and length) and the snapshot's shared bytes. Written
/// one after the other they are exactly the message tonic's encoder would produce, but the
/// snapshot is not copied: a thousand streams hold a thousand heads and one snapshot.
pub fn grpc_message_frames(
    version_info: &str,
    nonce: &str,
    snapshot: &EncodedSnapshot,
) -> Result<[Bytes; 2], TooLarge> {
    frames(version_info, nonce, SNAPSHOT_TAG, snapshot.bytes.clone())
}

/// Like [`grpc_message_frames`], for a response carrying an encoded `SnapshotDelta`
/// (field 4) instead of a snapshot.
pub fn grpc_delta_frames(
    version_info: &str,
    nonce: &str,
    delta: Bytes,
) -> Result<[Bytes; 2], TooLarge> {
    frames(version_info, nonce, DELTA_TAG, delta)
}

fn frames(version_info: &str, nonce: &str, tag: u32, body: Bytes) -> Result<[Bytes; 2], TooLarge> {
    let response = DiscoveryResponse {
        version_info: version_info.to_owned(),
        nonce: nonce.to_owned(),
        ..Default::default()
    };
    let len = body.len();
    let message_len = response.encoded_len()
        + prost::encoding::key_len(tag)
        + encoded_len_varint(len as u64)
        + len;
    let prefix_len = u32::try_from(message_len).map_err(|_| TooLarge(message_len))?;
    let mut head = bytes::BytesMut::with_capacity(5 + message_len - len);
    head.put_u8(0); // not compressed
    head.put_u32(prefix_len);
    response.encode_raw(&mut head);
    encode_key(tag, WireType::LengthDelimited, &mut head);
    encode_varint(len as u64, &mut head);
    Ok([head.freeze(), body])
}

/// A message too large for gRPC's 32-bit length prefix.
#[derive(Debug, thiserror::Error)]
#[error("a {0}-byte message does not fit gRPC's 32-bit length prefix")]
pub struct TooLarge(pub usize);

/// The snapshot a response carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum SnapshotPayload {
    /// No snapshot.
    #[default]
    None,
    /// Decoded (what a receiver sees).
    Decoded(Box<Snapshot>),
    /// Pre-encoded and shared (what the control plane sends).
    Encoded(EncodedSnapshot),
}

/// Control plane → proxy: one version of the route table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiscoveryResponse {
    /// Equal to the snapshot's version.
    pub version_info: String,
    /// Unique per response on a stream; echoed in the proxy's ACK or NACK.
    pub nonce: String,
    /// The complete snapshot (or none, when `delta` is set).
    pub snapshot: SnapshotPayload,
    /// The difference from the proxy's snapshot, instead of a complete one (field 4).
    pub delta: Option<Box<SnapshotDelta>>,
}

impl DiscoveryResponse {
    /// Takes the decoded snapshot out of a received response.
    pub fn into_snapshot(self) -> Option<Snapshot> {
        match self.snapshot {
            SnapshotPayload::None => None,
            SnapshotPayload::Decoded(s) => Some(*s),
            SnapshotPayload::Encoded(e) => Snapshot::decode(e.bytes.clone()).ok(),
        }
    }
}

impl Message for DiscoveryResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.version_info.is_empty() {
            prost::encoding::string::encode(1, &self.version_info, buf);
        }
        if !self.nonce.is_empty() {
            prost::encoding::string::encode(2, &self.nonce, buf);
        }
        match &self.snapshot {
            SnapshotPayload::None => {}
            SnapshotPayload::Decoded(s) => {
                prost::encoding::message::encode(SNAPSHOT_TAG, &**s, buf)
            }
            SnapshotPayload::Encoded(e) => {
                encode_key(SNAPSHOT_TAG, WireType::LengthDelimited, buf);
                encode_varint(e.bytes.len() as u64, buf);
                buf.put_slice(&e.bytes);
            }
        }
        if let Some(d) = &self.delta {
            prost::encoding::message::encode(DELTA_TAG, &**d, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => prost::encoding::string::merge(wire_type, &mut self.version_info, buf, ctx),
            2 => prost::encoding::string::merge(wire_type, &mut self.nonce, buf, ctx),
            SNAPSHOT_TAG => {
                let mut snapshot = match std::mem::take(&mut self.snapshot) {
                    SnapshotPayload::Decoded(s) => s,
                    _ => Box::default(),
                };
                let merged = prost::encoding::message::merge(wire_type, &mut *snapshot, buf, ctx);
                self.snapshot = SnapshotPayload::Decoded(snapshot);
                merged
            }
            DELTA_TAG => {
                let delta = self.delta.get_or_insert_with(Box::default);
                prost::encoding::message::merge(wire_type, &mut **delta, buf, ctx)
            }
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut len = 0;
        if !self.version_info.is_empty() {
            len += prost::encoding::string::encoded_len(1, &self.version_info);
        }
        if !self.nonce.is_empty() {
            len += prost::encoding::string::encoded_len(2, &self.nonce);
        }
        len += match &self.snapshot {
            SnapshotPayload::None => 0,
            SnapshotPayload::Decoded(s) => {
                prost::encoding::message::encoded_len(SNAPSHOT_TAG, &**s)
            }
            SnapshotPayload::Encoded(e) => {
                prost::encoding::key_len(SNAPSHOT_TAG)
                    + encoded_len_varint(e.bytes.len() as u64)
                    + e.bytes.len()
            }
        };
        if let Some(d) = &self.delta {
            len += prost::encoding::message::encoded_len(DELTA_TAG, &**d);
        }
        len
    }

    fn clear(&mut self) {
        *self = DiscoveryResponse::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::VirtualHost;

    #[test]
    fn a_delta_response_is_framed_and_decoded_like_the_proto_message() {
        let delta = SnapshotDelta {
            base_version: "1-aaaa".into(),
            version: "2-bbbb".into(),
            removed_virtual_hosts: vec!["gone.test".into()],
            ..Default::default()
        };
        let [head, body] = grpc_delta_frames("2-bbbb", "9", delta.encode_to_vec().into()).unwrap();
        let framed = [&head[..], &body[..]].concat();
        let back = DiscoveryResponse::decode(&framed[5..]).unwrap();
        assert_eq!(back.nonce, "9");
        assert_eq!(back.delta.as_deref(), Some(&delta));
        assert_eq!(back.snapshot, SnapshotPayload::None);
        let again = back.encode_to_vec();
        assert_eq!(again, framed[5..]);
    }

    #[test]
    fn pre_encoded_and_decoded_forms_are_the_same_bytes_on_the_wire() {
        let snapshot = Snapshot {
            version: "7-abc".into(),
            virtual_hosts: vec![VirtualHost {
                host: "a.example.com".into(),
                routes: vec![],
                ..Default::default()
            }],
            ..Default::default()
        };
        let encoded = DiscoveryResponse {
            version_info: "7-abc".into(),
            nonce: "1".into(),
            snapshot: SnapshotPayload::Encoded(EncodedSnapshot::new(&snapshot)),
            delta: None,
        };
        let decoded_form = DiscoveryResponse {
            snapshot: SnapshotPayload::Decoded(Box::new(snapshot.clone())),
            ..encoded.clone()
        };
        let wire = encoded.encode_to_vec();
        assert_eq!(wire, decoded_form.encode_to_vec());
        assert_eq!(wire.len(), encoded.encoded_len());

        let back = DiscoveryResponse::decode(wire.as_slice()).unwrap();
        assert_eq!(back.version_info, "7-abc");
        assert_eq!(back.nonce, "1");
        assert_eq!(back.into_snapshot(), Some(snapshot));
    }

    #[test]
    fn hand_framed_message_is_the_grpc_framing_of_the_encoded_response() {
        // Large enough that the snapshot length needs a multi-byte varint.
        let snapshot = Snapshot {
            virtual_hosts: (0..500)
                .map(|i| VirtualHost {
                    host: format!("app-{i}.example.com"),
                    routes: vec![],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let shared = EncodedSnapshot::new(&snapshot);
        let [head, body] = grpc_message_frames("12-abcdef", "42", &shared).unwrap();
        // The snapshot travels as the shared buffer itself, not a copy.
        assert_eq!(body.as_ptr(), shared.bytes().as_ptr());

        let message = DiscoveryResponse {
            version_info: "12-abcdef".into(),
            nonce: "42".into(),
            snapshot: SnapshotPayload::Encoded(shared.clone()),
            delta: None,
        }
        .encode_to_vec();
        let mut expected = vec![0u8];
        expected.extend_from_slice(&(message.len() as u32).to_be_bytes());
        expected.extend_from_slice(&message);
        assert_eq!([&head[..], &body[..]].concat(), expected);

        let back = DiscoveryResponse::decode(&expected[5..]).unwrap();
        assert_eq!(back.nonce, "42");
        assert_eq!(back.into_snapshot(), Some(snapshot));
    }
}
