//! A link of sealed frames over a stream socket, as the control relay and the links between
//! peer clusters' MMs use it: a handshake of plain frames ([`send_plain`], [`recv_plain`],
//! at most [`HANDSHAKE_LIMIT`] bytes each) that proves a key both ways, then frames encrypted
//! and authenticated under the handshake's per-direction session keys ([`link`]).
//!
//! Each sealed frame is `[length: u32 LE][body: AES-256-GCM ciphertext][tag: 16 bytes]`, the
//! length authenticated with the body, numbered implicitly per direction: a forged, altered,
//! replayed, reordered or dropped frame fails and ends the link. Bodies are bincode values.
//! A frame longer than the reader's limit is refused before anything is allocated for it.

use std::io::{Read, Write};

use bytes::Bytes;
use serde::{Serialize, de::DeserializeOwned};
use storm_primitives::tcp::auth::{ClusterKey, Opener, Protection, Sealer, Transcript};

/// The largest handshake frame.
pub const HANDSHAKE_LIMIT: usize = 4096;

const TAG_LEN: usize = 16;

/// Why a sealed link failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection closed")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("a frame of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("{0}")]
    Refused(String),
    #[error("frame {0} failed authentication (forged, altered, replayed or out of order)")]
    Forged(u64),
}

/// Writes one unsealed frame (a handshake's).
pub fn send_plain<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), WireError> {
    let body = bincode::serde::encode_to_vec(msg, bincode::config::standard())
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()?;
    Ok(())
}

/// Reads exactly `buf.len()` bytes; end of stream before the first byte is [`WireError::Closed`].
fn read_exact(r: &mut impl Read, buf: &mut [u8]) -> Result<(), WireError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => WireError::Closed,
        _ => WireError::Io(e),
    })
}

/// Reads a length prefix and a body of at most `limit` bytes; the buffer grows with what
/// arrives, not with what the peer claimed.
fn read_body(r: &mut impl Read, limit: usize) -> Result<Vec<u8>, WireError> {
    let mut len = [0u8; 4];
    read_exact(r, &mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(WireError::TooLarge { len, limit });
    }
    let mut body = Vec::with_capacity(len.min(64 << 10));
    if r.take(len as u64).read_to_end(&mut body)? != len {
        return Err(WireError::Closed);
    }
    Ok(body)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    storm_primitives::codec::decode(body)
        .map(|(msg, _)| msg)
        .map_err(|e| WireError::Malformed(e.to_string()))
}

pub fn recv_plain<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, WireError> {
    decode(&read_body(r, HANDSHAKE_LIMIT)?)
}

/// Seals frames one way.
pub struct SealedWriter<W: Write> {
    w: W,
    sealer: Sealer,
}

impl<W: Write> SealedWriter<W> {
    pub fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), WireError> {
        let body = bincode::serde::encode_to_vec(msg, bincode::config::standard())
            .map_err(|e| WireError::Malformed(e.to_string()))?;
        let head = (body.len() as u32).to_le_bytes();
        let (body, tag) = self.sealer.seal(&head, Bytes::from(body));
        self.w.write_all(&head)?;
        self.w.write_all(&body)?;
        self.w.write_all(&tag)?;
        self.w.flush()?;
        Ok(())
    }
}

/// Opens frames the other way.
pub struct SealedReader<R: Read> {
    r: R,
    opener: Opener,
    limit: usize,
}

impl<R: Read> SealedReader<R> {
    /// The next frame; after an error the link must be closed.
    pub fn recv<T: DeserializeOwned>(&mut self) -> Result<T, WireError> {
        let mut head = [0u8; 4];
        read_exact(&mut self.r, &mut head)?;
        let len = u32::from_le_bytes(head) as usize;
        if len > self.limit {
            return Err(WireError::TooLarge {
                len,
                limit: self.limit,
            });
        }
        let mut body = Vec::with_capacity(len.min(64 << 10));
        if (&mut self.r).take(len as u64).read_to_end(&mut body)? != len {
            return Err(WireError::Closed);
        }
        let mut tag = [0u8; TAG_LEN];
        read_exact(&mut self.r, &mut tag)?;
        self.opener
            .open(&head, &mut body, &tag)
            .map_err(|e| WireError::Forged(e.seq))?;
        decode(&body)
    }
}

/// The two directions of a link past its handshake, over a reader and a writer (two handles
/// of one socket).
pub struct Link<R: Read, W: Write> {
    pub reader: SealedReader<R>,
    pub writer: SealedWriter<W>,
}

pub fn link<R: Read, W: Write>(
    transcript: &Transcript,
    key: &ClusterKey,
    client: bool,
    r: R,
    w: W,
    limit: usize,
) -> Link<R, W> {
    let session = transcript.session(key, Protection::Encrypt, client);
    Link {
        reader: SealedReader {
            r,
            opener: session.opener,
            limit,
        },
        writer: SealedWriter {
            w,
            sealer: session.sealer,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storm_primitives::tcp::auth::NONCE_LEN;

    const LIMIT: usize = 1 << 20;

    /// A sealer and an opener of one direction of a link.
    fn one_way(key: &ClusterKey) -> (Sealer, Opener) {
        let t = Transcript::relay(3, 8, &[1; NONCE_LEN], &[2; NONCE_LEN]);
        (
            t.session(key, Protection::Encrypt, true).sealer,
            t.session(key, Protection::Encrypt, false).opener,
        )
    }

    #[test]
    fn an_altered_or_replayed_frame_ends_the_link() {
        let key = ClusterKey::random();
        let (sealer, _) = one_way(&key);
        let mut sent = Vec::new();
        let mut writer = SealedWriter {
            w: &mut sent,
            sealer,
        };
        writer.send(&vec![7u8; 100]).unwrap();
        let reader = |bytes: Vec<u8>| SealedReader {
            r: std::io::Cursor::new(bytes),
            opener: one_way(&key).1,
            limit: LIMIT,
        };
        let mut altered = sent.clone();
        altered[10] ^= 1;
        assert!(matches!(
            reader(altered).recv::<Vec<u8>>(),
            Err(WireError::Forged(0))
        ));
        let mut twice = sent.clone();
        twice.extend_from_slice(&sent);
        let mut r = reader(twice);
        assert!(matches!(r.recv::<Vec<u8>>(), Ok(c) if c == vec![7; 100]));
        assert!(
            matches!(r.recv::<Vec<u8>>(), Err(WireError::Forged(1))),
            "a replay fails"
        );
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_before_it_is_read() {
        let key = ClusterKey::random();
        let mut bytes = (u32::MAX).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        let mut reader = SealedReader {
            r: bytes.as_slice(),
            opener: one_way(&key).1,
            limit: LIMIT,
        };
        assert!(matches!(
            reader.recv::<Vec<u8>>(),
            Err(WireError::TooLarge { .. })
        ));
    }
}
