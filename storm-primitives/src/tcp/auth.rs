//! Authenticated links: the cluster key, the handshake's proofs and session keys, and the seal
//! on every frame after the handshake.
//!
//! * **Handshake.** The connecting node sends a fresh 32-byte nonce in its `Hello`; the
//!   accepting node answers with its own fresh nonce and a proof, a keyed BLAKE3 hash under
//!   the cluster key of everything said so far (the [`Transcript`]); the connecting node
//!   checks it and answers with its own proof. Each proof covers both nonces, so a recorded
//!   handshake proves nothing when replayed: the other side's nonce is new every time.
//! * **Session keys.** One per direction, derived from the cluster key and the transcript.
//! * **Frames.** Every frame after the handshake carries a tag over an implicit sequence
//!   number (frames counted per direction), its header and its body: keyed BLAKE3
//!   ([`Protection::Authenticate`]), or ChaCha20-Poly1305 with the body encrypted
//!   ([`Protection::Encrypt`]). A forged, altered, replayed, reordered or dropped frame fails
//!   its check, and the reader closes the connection before acting on it.
//!
//! No primitive is written here: BLAKE3 and ChaCha20-Poly1305 come from their crates.

use bytes::Bytes;
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use rand::TryRngCore;

pub const KEY_LEN: usize = 32;
pub const NONCE_LEN: usize = 32;

/// The secret every daemon of a cluster shares (`storm keygen`).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; KEY_LEN]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// A new key from the operating system's random source.
    pub fn random() -> Self {
        Self(random_bytes())
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The key as 64 lowercase hex digits (the key file's contents).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads 64 hex digits; the error says what is wrong.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.len() != 2 * KEY_LEN {
            return Err(format!(
                "a key is {} hex digits, this is {} characters",
                2 * KEY_LEN,
                text.len()
            ));
        }
        let mut key = [0u8; KEY_LEN];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|_| "a key is made of hex digits only".to_string())?;
        }
        Ok(Self(key))
    }
}

/// Fresh random bytes from the operating system. Without a random source nothing about the
/// links could be trusted, so its failure is fatal.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    rand::rngs::OsRng
        .try_fill_bytes(&mut out)
        .expect("the operating system's random source failed");
    out
}

/// How frames are protected after the handshake. Both ends must agree; it is part of the
/// handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protection {
    /// Tagged with keyed BLAKE3 (32-byte tags); bodies in the clear.
    #[default]
    Authenticate,
    /// Bodies encrypted and tagged with ChaCha20-Poly1305 (16-byte tags).
    Encrypt,
    /// Neither (the handshake still proves the key). Only for measuring what protection
    /// costs; cluster files cannot ask for it.
    Unprotected,
}

impl Protection {
    /// Bytes of the tag after each frame.
    pub fn tag_len(self) -> usize {
        match self {
            Protection::Authenticate => 32,
            Protection::Encrypt => 16,
            Protection::Unprotected => 0,
        }
    }

    pub fn code(self) -> u8 {
        match self {
            Protection::Authenticate => 1,
            Protection::Encrypt => 2,
            Protection::Unprotected => 3,
        }
    }
}

/// What a handshake binds, in order: both node ids, the cluster's size and layout, the frame
/// protection and both nonces.
pub struct Transcript(Vec<u8>);

impl Transcript {
    pub fn new(
        client: u32,
        server: u32,
        cluster_size: u32,
        layout_fingerprint: u64,
        protection: Protection,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
    ) -> Self {
        let mut t = Vec::with_capacity(24 + 2 * NONCE_LEN);
        t.extend_from_slice(&client.to_le_bytes());
        t.extend_from_slice(&server.to_le_bytes());
        t.extend_from_slice(&cluster_size.to_le_bytes());
        t.extend_from_slice(&layout_fingerprint.to_le_bytes());
        t.push(protection.code());
        t.extend_from_slice(client_nonce);
        t.extend_from_slice(server_nonce);
        Self(t)
    }

    fn mac(&self, key: &ClusterKey, label: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&key.0);
        h.update(label);
        h.update(&self.0);
        h.finalize()
    }

    /// The accepting node's proof that it holds the key.
    pub fn server_proof(&self, key: &ClusterKey) -> [u8; 32] {
        *self.mac(key, b"storm handshake: server proof").as_bytes()
    }

    /// The connecting node's proof.
    pub fn client_proof(&self, key: &ClusterKey) -> [u8; 32] {
        *self.mac(key, b"storm handshake: client proof").as_bytes()
    }

    /// Whether `proof` is the server's (or client's) proof; compared in constant time.
    pub fn verify(&self, key: &ClusterKey, proof: &[u8; 32], server: bool) -> bool {
        let label: &[u8] = if server {
            b"storm handshake: server proof"
        } else {
            b"storm handshake: client proof"
        };
        self.mac(key, label) == blake3::Hash::from_bytes(*proof)
    }

    /// The sealers and openers of this connection, for the connecting (`client`) or the
    /// accepting side.
    pub fn session(&self, key: &ClusterKey, protection: Protection, client: bool) -> Session {
        let up = *self.mac(key, b"storm session: client to server").as_bytes();
        let down = *self.mac(key, b"storm session: server to client").as_bytes();
        let (send, recv) = if client { (up, down) } else { (down, up) };
        Session {
            sealer: Sealer::new(protection, send),
            opener: Opener::new(protection, recv),
        }
    }
}

/// Both directions of a connection.
pub struct Session {
    pub sealer: Sealer,
    pub opener: Opener,
}

enum Cipher {
    Mac([u8; KEY_LEN]),
    Aead(Box<ChaCha20Poly1305>),
    Unprotected,
}

impl Cipher {
    fn new(protection: Protection, key: [u8; KEY_LEN]) -> Self {
        match protection {
            Protection::Authenticate => Cipher::Mac(key),
            Protection::Encrypt => Cipher::Aead(Box::new(ChaCha20Poly1305::new(&key.into()))),
            Protection::Unprotected => Cipher::Unprotected,
        }
    }
}

fn mac(key: &[u8; KEY_LEN], seq: u64, head: &[u8], body: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(&seq.to_le_bytes());
    h.update(head);
    h.update(body);
    h.finalize()
}

fn nonce(seq: u64) -> chacha20poly1305::Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    n.into()
}

/// Seals the frames one side sends, numbering them.
pub struct Sealer {
    cipher: Cipher,
    seq: u64,
}

impl Sealer {
    fn new(protection: Protection, key: [u8; KEY_LEN]) -> Self {
        Self {
            cipher: Cipher::new(protection, key),
            seq: 0,
        }
    }

    /// The body to send (encrypted, if the link encrypts) and the tag that follows it.
    pub fn seal(&mut self, head: &[u8], body: Bytes) -> (Bytes, Bytes) {
        let seq = self.seq;
        self.seq += 1;
        match &self.cipher {
            Cipher::Mac(key) => {
                let tag = mac(key, seq, head, &body);
                (body, Bytes::copy_from_slice(tag.as_bytes()))
            }
            Cipher::Aead(aead) => {
                let mut buf = body.to_vec();
                let tag = aead
                    .encrypt_in_place_detached(&nonce(seq), head, &mut buf)
                    .expect("a frame is far below ChaCha20-Poly1305's length limit");
                (Bytes::from(buf), Bytes::copy_from_slice(&tag))
            }
            Cipher::Unprotected => (body, Bytes::new()),
        }
    }
}

/// A frame that failed its check.
#[derive(Debug, thiserror::Error)]
#[error("frame {seq} failed authentication (forged, altered, replayed or out of order)")]
pub struct AuthError {
    pub seq: u64,
}

/// Checks (and decrypts) the frames one side receives, in order.
pub struct Opener {
    cipher: Cipher,
    seq: u64,
}

impl Opener {
    fn new(protection: Protection, key: [u8; KEY_LEN]) -> Self {
        Self {
            cipher: Cipher::new(protection, key),
            seq: 0,
        }
    }

    /// Whether the link reads data frames straight into memory (only when unprotected).
    pub fn unprotected(&self) -> bool {
        matches!(self.cipher, Cipher::Unprotected)
    }

    /// Checks the next frame's tag and decrypts its body in place. After an error the
    /// connection must be closed: the sequence is lost.
    pub fn open(&mut self, head: &[u8], body: &mut [u8], tag: &[u8]) -> Result<(), AuthError> {
        let seq = self.seq;
        self.seq += 1;
        let ok = match &self.cipher {
            Cipher::Mac(key) => {
                <[u8; 32]>::try_from(tag).is_ok_and(|t| mac(key, seq, head, body) == t)
            }
            Cipher::Aead(aead) => {
                tag.len() == 16 && {
                    let tag = chacha20poly1305::Tag::from_slice(tag);
                    aead.decrypt_in_place_detached(&nonce(seq), head, body, tag)
                        .is_ok()
                }
            }
            Cipher::Unprotected => tag.is_empty(),
        };
        if ok { Ok(()) } else { Err(AuthError { seq }) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(server_nonce: [u8; NONCE_LEN]) -> Transcript {
        Transcript::new(
            1,
            0,
            4,
            77,
            Protection::Authenticate,
            &[7; NONCE_LEN],
            &server_nonce,
        )
    }

    #[test]
    fn a_proof_holds_only_under_the_same_key_role_and_nonces() {
        let key = ClusterKey::random();
        let t = transcript([9; NONCE_LEN]);
        let proof = t.server_proof(&key);
        assert!(t.verify(&key, &proof, true));
        assert!(
            !t.verify(&key, &proof, false),
            "a server proof is no client proof"
        );
        assert!(!t.verify(&ClusterKey::random(), &proof, true));
        // Replayed into a handshake with a fresh nonce, it proves nothing.
        assert!(!transcript([10; NONCE_LEN]).verify(&key, &proof, true));
    }

    #[test]
    fn keys_round_trip_through_hex_and_bad_text_is_named() {
        let key = ClusterKey::random();
        assert_eq!(ClusterKey::from_hex(&key.to_hex()).unwrap(), key);
        assert!(
            ClusterKey::from_hex("abc")
                .unwrap_err()
                .contains("64 hex digits")
        );
        let bad = "zz".repeat(KEY_LEN);
        assert!(
            ClusterKey::from_hex(&bad)
                .unwrap_err()
                .contains("hex digits only")
        );
        assert_eq!(
            format!("{key:?}"),
            "ClusterKey(..)",
            "Debug never shows the key"
        );
    }

    #[test]
    fn sealed_frames_open_in_order_and_nothing_else_does() {
        for protection in [Protection::Authenticate, Protection::Encrypt] {
            let key = ClusterKey::random();
            let t = transcript([3; NONCE_LEN]);
            let opener = || t.session(&key, protection, false).opener;
            let mut tx = t.session(&key, protection, true).sealer;
            let head = b"head";
            let frames: Vec<(Bytes, Bytes)> = (0..3u8)
                .map(|i| tx.seal(head, Bytes::from(vec![i; 100])))
                .collect();
            if protection == Protection::Encrypt {
                assert_ne!(&frames[0].0[..], &[0u8; 100][..], "the body is encrypted");
            }
            // In order: each opens to what was sealed.
            let mut rx = opener();
            for (i, (body, tag)) in frames.iter().enumerate() {
                let mut b = body.to_vec();
                rx.open(head, &mut b, tag).unwrap();
                assert_eq!(b, vec![i as u8; 100]);
            }
            let mut b = frames[0].0.to_vec();
            assert!(
                rx.open(head, &mut b, &frames[0].1).is_err(),
                "a replay fails"
            );
            // Out of order (frame 1 first), altered body or header, or the other
            // direction's key: refused.
            let mut b = frames[1].0.to_vec();
            assert!(opener().open(head, &mut b, &frames[1].1).is_err());
            let mut b = frames[0].0.to_vec();
            b[5] ^= 1;
            assert!(opener().open(head, &mut b, &frames[0].1).is_err());
            let mut b = frames[0].0.to_vec();
            assert!(opener().open(b"heae", &mut b, &frames[0].1).is_err());
            let mut wrong_way = t.session(&key, protection, true).opener;
            let mut b = frames[0].0.to_vec();
            assert!(wrong_way.open(head, &mut b, &frames[0].1).is_err());
        }
    }
}
