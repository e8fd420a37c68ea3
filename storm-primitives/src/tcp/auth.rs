//! Authenticated links: the cluster key, the handshake's proofs and session keys, and the seal
//! on every frame after the handshake.
//!
//! * **Handshake.** The connecting node sends a fresh 32-byte nonce in its `Hello`; the
//!   accepting node answers with its own fresh nonce and a proof, a keyed BLAKE3 hash under
//!   the cluster key of everything said so far (the [`Transcript`]); the connecting node
//!   checks it and answers with its own proof. Each proof covers both nonces, so a recorded
//!   handshake proves nothing when replayed: the other side's nonce is new every time.
//! * **Session keys.** One per direction, derived from the cluster key and the transcript.
//! * **Frames.** Every frame after the handshake is tagged under its direction's session key
//!   with AES-256-GCM, the nonce being an implicit sequence number (frames counted per
//!   direction):
//!   * [`Protection::Authenticate`]: the body stays in the clear. Two GMAC tags (AES-GCM with
//!     nothing to encrypt), one over the header and one over the body, under the nonces
//!     `(seq, 0)` and `(seq, 1)`; a frame passes only if both do. Two tags rather than one
//!     because the header and the body are separate buffers, and joining them would copy
//!     every transfer chunk.
//!   * [`Protection::Encrypt`]: the body encrypted, the header authenticated with it (one tag).
//!
//!   A forged, altered, replayed, reordered or dropped frame fails its check, and the reader
//!   closes the connection before acting on it. Every nonce is used once per key: the
//!   sequence number only grows, and each connection and direction has its own key.
//! * **Why AES-GCM.** With AES and carry-less multiply instructions (every x86 and Arm server
//!   CPU of the last decade), aws-lc's GMAC runs at 11–15 GB/s per core here, about three
//!   times keyed BLAKE3 (3.9 GB/s), which this module used before (`storm-bench links`
//!   measures what each costs a transfer).
//!
//! No primitive is written here: BLAKE3 (proofs, key derivation) and AES-GCM (aws-lc-rs) come
//! from their crates.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use bytes::Bytes;
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
    /// Tagged with AES-256-GMAC (two 16-byte tags: header, body); bodies in the clear.
    #[default]
    Authenticate,
    /// Bodies encrypted and tagged with AES-256-GCM (one 16-byte tag).
    Encrypt,
    /// Neither (the handshake still proves the key). Only for measuring what protection
    /// costs; cluster files cannot ask for it.
    Unprotected,
}

impl Protection {
    /// Bytes of the tag after each frame.
    pub fn tag_len(self) -> usize {
        match self {
            Protection::Authenticate => 2 * GCM_TAG_LEN,
            Protection::Encrypt => GCM_TAG_LEN,
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

    /// The protection a handshake's code names, if any.
    pub fn from_code(code: u8) -> Option<Self> {
        [
            Protection::Authenticate,
            Protection::Encrypt,
            Protection::Unprotected,
        ]
        .into_iter()
        .find(|p| p.code() == code)
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

    /// The handshake of a control relay link (`storm-relay`): node `node` connects to the
    /// relay beside the MM. Its own label first, so that no proof or signature of a relay
    /// handshake holds in a primitives link's handshake, or the other way round.
    pub fn relay(
        node: u32,
        cluster_size: u32,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
    ) -> Self {
        let mut t = b"storm control relay 1".to_vec();
        t.extend_from_slice(&node.to_le_bytes());
        t.extend_from_slice(&cluster_size.to_le_bytes());
        t.push(Protection::Encrypt.code());
        t.extend_from_slice(client_nonce);
        t.extend_from_slice(server_nonce);
        Self(t)
    }

    /// The handshake of a link between two peer clusters' agents (`storm-peer`): cluster
    /// `client` connects to cluster `server`, under the key those two share. Its own label,
    /// and both names, so that nothing proved here holds in any other handshake or between
    /// any other pair.
    pub fn peer(
        client: &str,
        server: &str,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
    ) -> Self {
        let mut t = b"storm peer link 1".to_vec();
        for name in [client, server] {
            t.extend_from_slice(&(name.len() as u32).to_le_bytes());
            t.extend_from_slice(name.as_bytes());
        }
        t.push(Protection::Encrypt.code());
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

    /// What the connecting node signs with its identity key (and the accepting node checks
    /// with the key enrolled for the node it claims to be): this handshake, under its own
    /// label, so the signature proves nothing anywhere else.
    pub fn identity_message(&self) -> Vec<u8> {
        let mut m = b"storm handshake: client identity".to_vec();
        m.extend_from_slice(&self.0);
        m
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

/// One direction's AES-256-GCM key, and how frames use it.
enum Cipher {
    Mac(Box<LessSafeKey>),
    Aead(Box<LessSafeKey>),
    Unprotected,
}

impl Cipher {
    fn new(protection: Protection, key: [u8; KEY_LEN]) -> Self {
        let aes = || {
            Box::new(LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte key is an AES-256 key"),
            ))
        };
        match protection {
            Protection::Authenticate => Cipher::Mac(aes()),
            Protection::Encrypt => Cipher::Aead(aes()),
            Protection::Unprotected => Cipher::Unprotected,
        }
    }
}

const GCM_TAG_LEN: usize = 16;

/// The nonce of part `part` of frame `seq`: unique per key, as GCM requires.
fn nonce(seq: u64, part: u32) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    n[8..].copy_from_slice(&part.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The GMAC tag of `data` (AES-GCM with `data` as associated data and nothing to encrypt).
fn gmac(key: &LessSafeKey, seq: u64, part: u32, data: &[u8]) -> [u8; GCM_TAG_LEN] {
    let tag = key
        .seal_in_place_separate_tag(nonce(seq, part), Aad::from(data), &mut [])
        .expect("AES-GCM accepts associated data of any frame's size");
    tag.as_ref().try_into().expect("a GCM tag is 16 bytes")
}

/// Whether `tag` is the GMAC tag of `data`; aws-lc compares in constant time.
fn gmac_holds(key: &LessSafeKey, seq: u64, part: u32, data: &[u8], tag: &[u8]) -> bool {
    key.open_in_place_separate_tag(nonce(seq, part), Aad::from(data), tag, &mut [])
        .is_ok()
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
                let mut tags = Vec::with_capacity(2 * GCM_TAG_LEN);
                tags.extend_from_slice(&gmac(key, seq, 0, head));
                tags.extend_from_slice(&gmac(key, seq, 1, &body));
                (body, Bytes::from(tags))
            }
            Cipher::Aead(key) => {
                let mut sealed = vec![0u8; body.len()];
                let mut tag = vec![0u8; GCM_TAG_LEN];
                key.seal_out_of_place_scatter(
                    nonce(seq, 2),
                    Aad::from(head),
                    &body,
                    &mut sealed,
                    &[],
                    &mut tag,
                )
                .expect("a frame is far below AES-GCM's length limit");
                (Bytes::from(sealed), Bytes::from(tag))
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

    /// Checks the next frame's tag and decrypts its body in place. After an error the
    /// connection must be closed: the sequence is lost.
    pub fn open(&mut self, head: &[u8], body: &mut [u8], tag: &[u8]) -> Result<(), AuthError> {
        let seq = self.seq;
        self.seq += 1;
        let ok = match &self.cipher {
            Cipher::Mac(key) => {
                tag.len() == 2 * GCM_TAG_LEN
                    && gmac_holds(key, seq, 0, head, &tag[..GCM_TAG_LEN])
                    && gmac_holds(key, seq, 1, body, &tag[GCM_TAG_LEN..])
            }
            Cipher::Aead(key) => {
                tag.len() == GCM_TAG_LEN
                    && key
                        .open_in_place_separate_tag(nonce(seq, 2), Aad::from(head), tag, body)
                        .is_ok()
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
            // An altered tag, in either half of a two-tag seal, or cut short: refused.
            for at in [0, protection.tag_len() - 1] {
                let mut tag = frames[0].1.to_vec();
                tag[at] ^= 1;
                let mut b = frames[0].0.to_vec();
                assert!(opener().open(head, &mut b, &tag).is_err(), "tag byte {at}");
            }
            let mut b = frames[0].0.to_vec();
            let short = &frames[0].1[..protection.tag_len() - 1];
            assert!(opener().open(head, &mut b, short).is_err());
            let mut wrong_way = t.session(&key, protection, true).opener;
            let mut b = frames[0].0.to_vec();
            assert!(wrong_way.open(head, &mut b, &frames[0].1).is_err());
        }
    }
}
