//! The tcp backend's wire format.
//!
//! Every frame is a 12-byte header followed by a body:
//!
//! ```text
//! magic "STRM" | version u8 | kind u8 | reserved u16 | body length u32 (LE)
//! ```
//!
//! `kind` is [`KIND_CONTROL`] (body: one bincode-encoded [`Control`]) or [`KIND_DATA`] (body: a
//! 20-byte chunk prefix, then raw bytes of an XFER-AND-SIGNAL). After the handshake every frame
//! is followed by its tag (see [`super::auth`]), whose length the link's protection sets and
//! which the body length does not count. The body length is checked
//! against the configured limit before anything is allocated, and every decode error is a
//! [`WireError`]: bytes from the network never panic.

use std::io::{self, Read};

use bytes::{Buf, Bytes};
use serde::{Deserialize, Serialize};

use crate::error::PrimError;
use crate::nodeset::{NodeId, NodeSet};
use crate::relation::Relation;

pub const MAGIC: [u8; 4] = *b"STRM";
pub const VERSION: u8 = 3;
pub const HEADER_LEN: usize = 12;
pub const KIND_CONTROL: u8 = 1;
pub const KIND_DATA: u8 = 2;
/// origin u32 + sequence u64 + offset-in-transfer u64.
pub const DATA_PREFIX_LEN: usize = 20;
/// Control messages are small; this bounds what a peer can make us decode.
pub const MAX_CONTROL_LEN: usize = 1 << 20;

/// Identifies one operation cluster-wide: the node that started it and its sequence there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpKey {
    pub origin: NodeId,
    pub seq: u64,
}

/// How people read an operation's key: `node 4's operation 17`, as in reasons and logs.
impl std::fmt::Display for OpKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {}'s operation {}", self.origin, self.seq)
    }
}

/// First frame on every connection, from the connecting side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub node: NodeId,
    pub cluster_size: u32,
    pub layout_fingerprint: u64,
    /// [`super::auth::Protection::code`] of the frames after the handshake.
    pub protection: u8,
    /// Fresh for every connection.
    pub nonce: [u8; 32],
}

/// Header of one XFER-AND-SIGNAL, sent down the tree before its data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XferBegin {
    pub key: OpKey,
    pub dest: NodeSet,
    pub fanout: u32,
    pub offset: u64,
    pub len: u64,
    pub remote_event: Option<u32>,
    pub timeout_ms: u64,
    /// Each node applies the data and raises the event as soon as its data has arrived, and
    /// answers `Committed` once its subtree has (no `Ack`, no `Commit`): see
    /// [`crate::Primitives::xfer_and_signal_on_arrival_within`].
    pub on_arrival: bool,
}

/// The messages of the tree transfer: two phases, or one for a transfer applied on arrival.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum XferMsg {
    Begin(XferBegin),
    /// Up: my subtree holds all the data.
    Ack(OpKey),
    /// Up: my subtree cannot complete.
    Nack(OpKey, PrimError),
    /// Down: raise the remote event.
    Commit(OpKey),
    /// Up: my subtree raised it.
    Committed(OpKey),
    /// Down: forget the operation without signalling.
    Abort(OpKey),
}

/// One COMPARE-AND-WRITE as the origin asks the root to run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CawRequest {
    pub key: OpKey,
    pub dest: NodeSet,
    pub fanout: u32,
    pub var: u64,
    pub rel: Relation,
    pub value: u64,
    pub write: Option<(u64, u64)>,
    pub timeout_ms: u64,
}

/// The messages of the tree reduction behind COMPARE-AND-WRITE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CawMsg {
    /// Origin to root: run this operation.
    Request(CawRequest),
    /// Down: compare locally, gather the subtree's votes.
    Compare(CawRequest),
    /// Up: whether the relation holds everywhere in my subtree.
    Vote(OpKey, bool),
    /// Down: the relation held everywhere; write.
    Write(OpKey),
    /// Up: my subtree wrote.
    Written(OpKey),
    /// Down: no write; forget the operation.
    Release(OpKey),
    /// Up: my subtree failed.
    Nack(OpKey, PrimError),
    /// Root to origin: the result.
    Done(OpKey, Result<bool, PrimError>),
}

/// Every control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    Hello(Hello),
    /// The accepting side's fresh nonce and its proof that it holds the cluster key.
    Challenge {
        nonce: [u8; 32],
        proof: [u8; 32],
    },
    /// The connecting side's proof.
    Proof([u8; 32]),
    /// The connecting side's signature, with its identity key, over the handshake (sent just
    /// before its proof when it has such a key): 64 bytes.
    Identify(Vec<u8>),
    HelloAck,
    /// Always just "refused": the reason is logged where it was decided, not told.
    HelloReject(String),
    Xfer(XferMsg),
    Caw(CawMsg),
}

/// A chunk of transfer data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataChunk {
    pub key: OpKey,
    pub at: u64,
    pub payload: Bytes,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Control(Control),
    Data(DataChunk),
}

/// Why bytes from a peer were not a valid frame.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection closed")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("bad magic {0:02x?}: not a storm peer")]
    BadMagic([u8; 4]),
    #[error("peer speaks protocol version {0}, this node speaks {VERSION}")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("frame of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("malformed frame body: {0}")]
    Malformed(String),
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_CONTROL_LEN>()
}

/// A frame ready to write: a header (with the chunk prefix for data) and a body.
#[derive(Debug, Clone)]
pub struct OutFrame {
    head: [u8; HEADER_LEN + DATA_PREFIX_LEN],
    head_len: usize,
    pub body: Bytes,
}

impl OutFrame {
    pub fn head(&self) -> &[u8] {
        &self.head[..self.head_len]
    }

    pub fn wire_len(&self) -> usize {
        self.head_len + self.body.len()
    }

    fn header(kind: u8, body_len: usize) -> [u8; HEADER_LEN + DATA_PREFIX_LEN] {
        let mut h = [0u8; HEADER_LEN + DATA_PREFIX_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = kind;
        h[8..12].copy_from_slice(&(body_len as u32).to_le_bytes());
        h
    }

    pub fn control(msg: &Control) -> OutFrame {
        let body = bincode::serde::encode_to_vec(msg, bincode_config())
            .expect("control messages always encode");
        OutFrame {
            head: Self::header(KIND_CONTROL, body.len()),
            head_len: HEADER_LEN,
            body: Bytes::from(body),
        }
    }

    pub fn data(key: OpKey, at: u64, payload: Bytes) -> OutFrame {
        let mut head = Self::header(KIND_DATA, DATA_PREFIX_LEN + payload.len());
        head[12..16].copy_from_slice(&key.origin.to_le_bytes());
        head[16..24].copy_from_slice(&key.seq.to_le_bytes());
        head[24..32].copy_from_slice(&at.to_le_bytes());
        OutFrame {
            head,
            head_len: HEADER_LEN + DATA_PREFIX_LEN,
            body: payload,
        }
    }

    /// The whole frame as one buffer (tests and handshakes).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = self.head().to_vec();
        v.extend_from_slice(&self.body);
        v
    }
}

/// Checks a frame header; returns the frame's kind and body length.
pub fn parse_header(head: &[u8; HEADER_LEN], limit: usize) -> Result<(u8, usize), WireError> {
    let magic: [u8; 4] = head[..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    if head[4] != VERSION {
        return Err(WireError::BadVersion(head[4]));
    }
    let kind = head[5];
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    let limit = match kind {
        KIND_CONTROL => MAX_CONTROL_LEN.min(limit),
        KIND_DATA => limit,
        other => return Err(WireError::BadKind(other)),
    };
    if len > limit {
        return Err(WireError::TooLarge { len, limit });
    }
    if kind == KIND_DATA && len < DATA_PREFIX_LEN {
        return Err(WireError::Malformed(format!(
            "data frame of {len} bytes is shorter than its {DATA_PREFIX_LEN}-byte prefix"
        )));
    }
    Ok((kind, len))
}

/// Parses the prefix of a data frame: the operation and the chunk's offset in the transfer.
pub fn parse_data_prefix(prefix: &[u8; DATA_PREFIX_LEN]) -> (OpKey, u64) {
    let origin = u32::from_le_bytes(prefix[..4].try_into().expect("4 bytes"));
    let seq = u64::from_le_bytes(prefix[4..12].try_into().expect("8 bytes"));
    let at = u64::from_le_bytes(prefix[12..20].try_into().expect("8 bytes"));
    (OpKey { origin, seq }, at)
}

/// Reads exactly `buf.len()` bytes; end of stream is [`WireError::Closed`].
pub fn read_exact(r: &mut impl Read, buf: &mut [u8]) -> Result<(), WireError> {
    match r.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(WireError::Closed),
        Err(e) => Err(e.into()),
    }
}

/// Reads exactly `len` bytes into a new buffer, which is not zeroed first: a 512 KiB chunk
/// is written once, by the socket read, not twice.
pub fn read_body(r: &mut impl Read, len: usize) -> Result<Vec<u8>, WireError> {
    let mut body = Vec::with_capacity(len);
    let got = r.take(len as u64).read_to_end(&mut body)?;
    if got != len {
        return Err(WireError::Closed);
    }
    Ok(body)
}

/// Reads one frame. `limit` bounds the body length.
pub fn read_frame(r: &mut impl Read, limit: usize) -> Result<Frame, WireError> {
    let mut head = [0u8; HEADER_LEN];
    read_exact(r, &mut head)?;
    let (kind, len) = parse_header(&head, limit)?;
    decode_body(kind, Bytes::from(read_body(r, len)?))
}

/// Decodes a frame body of the given kind.
pub fn decode_body(kind: u8, mut body: Bytes) -> Result<Frame, WireError> {
    match kind {
        KIND_CONTROL => {
            let (msg, used): (Control, usize) =
                crate::codec::decode(&body).map_err(|e| WireError::Malformed(e.to_string()))?;
            if used != body.len() {
                return Err(WireError::Malformed(format!(
                    "{} trailing bytes after the message",
                    body.len() - used
                )));
            }
            Ok(Frame::Control(msg))
        }
        KIND_DATA => {
            if body.len() < DATA_PREFIX_LEN {
                return Err(WireError::Malformed(format!(
                    "data frame of {} bytes is shorter than its {DATA_PREFIX_LEN}-byte prefix",
                    body.len()
                )));
            }
            let origin = body.get_u32_le();
            let seq = body.get_u64_le();
            let at = body.get_u64_le();
            Ok(Frame::Data(DataChunk {
                key: OpKey { origin, seq },
                at,
                payload: body,
            }))
        }
        other => Err(WireError::BadKind(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(f: &OutFrame) -> Result<Frame, WireError> {
        read_frame(&mut &f.to_vec()[..], 1 << 24)
    }

    #[test]
    fn control_and_data_frames_round_trip() {
        let begin = Control::Xfer(XferMsg::Begin(XferBegin {
            key: OpKey { origin: 3, seq: 9 },
            dest: "0-7,12".parse().unwrap(),
            fanout: 2,
            offset: 4096,
            len: 1 << 20,
            remote_event: Some(1),
            timeout_ms: 5000,
            on_arrival: true,
        }));
        assert_eq!(
            roundtrip(&OutFrame::control(&begin)).unwrap(),
            Frame::Control(begin)
        );
        let key = OpKey { origin: 1, seq: 2 };
        let data = OutFrame::data(key, 77, Bytes::from_static(b"hello"));
        assert_eq!(
            roundtrip(&data).unwrap(),
            Frame::Data(DataChunk {
                key,
                at: 77,
                payload: Bytes::from_static(b"hello")
            })
        );
    }

    #[test]
    fn malformed_frames_are_errors_naming_the_problem() {
        let good = OutFrame::control(&Control::HelloAck).to_vec();
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(
            read_frame(&mut &bad[..], 1024),
            Err(WireError::BadMagic(_))
        ));
        let mut bad = good.clone();
        bad[4] = 99;
        let err = read_frame(&mut &bad[..], 1024).unwrap_err();
        assert!(err.to_string().contains("version 99"), "{err}");
        let mut bad = good.clone();
        bad[5] = 7;
        assert!(matches!(
            read_frame(&mut &bad[..], 1024),
            Err(WireError::BadKind(7))
        ));
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_frame(&mut &bad[..], 1024),
            Err(WireError::TooLarge { .. })
        ));
        assert!(matches!(
            read_frame(&mut &good[..good.len() - 1], 1024),
            Err(WireError::Closed)
        ));
        let short_data = [&OutFrame::header(KIND_DATA, 3)[..HEADER_LEN], &[1, 2, 3]].concat();
        assert!(matches!(
            read_frame(&mut &short_data[..], 1024),
            Err(WireError::Malformed(_))
        ));
        // A node set that is not canonical is rejected while decoding.
        let mut body = bincode::serde::encode_to_vec(
            Control::Xfer(XferMsg::Begin(XferBegin {
                key: OpKey { origin: 0, seq: 0 },
                dest: NodeSet::range(0, 3),
                fanout: 2,
                offset: 0,
                len: 0,
                remote_event: None,
                timeout_ms: 1,
                on_arrival: false,
            })),
            bincode_config(),
        )
        .unwrap();
        // The range list sits right after the enum tags and key; flip the range to 3-0.
        let pos = body.windows(2).position(|w| w == [0, 3]).unwrap();
        body[pos] = 3;
        body[pos + 1] = 0;
        assert!(matches!(
            decode_body(KIND_CONTROL, Bytes::from(body)),
            Err(WireError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = read_frame(&mut &bytes[..], 1 << 16);
        }

        #[test]
        fn arbitrary_bodies_after_a_valid_header_never_panic(
            kind in 0u8..4, body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut frame = OutFrame::header(kind, body.len())[..HEADER_LEN].to_vec();
            frame.extend_from_slice(&body);
            let _ = read_frame(&mut &frame[..], 1 << 16);
        }
    }
}
