//! bincode decoding that trusts no claimed length further than its input can support.
//!
//! bincode reserves a `String` or `Vec<u8>` of the length it reads before it reads the bytes,
//! so ten bytes that claim a 60 MiB string cost 60 MiB, unless the decoder's limit stops the
//! claim first. The limit here follows the input: every decoded value claims at most 8 bytes
//! per input byte (a one-byte varint becomes a `u64`), so a limit of at least 8 times the
//! input's length accepts every valid message and refuses any claim past it. bincode's limit
//! is a constant, so the input's size picks one from a ladder of powers of 4.

use serde::de::DeserializeOwned;

pub use bincode::error::DecodeError;

/// What each input byte may claim, at most, in a valid message.
const CLAIM_PER_BYTE: usize = 8;

fn within<T: DeserializeOwned, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<(T, usize), DecodeError> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard().with_limit::<LIMIT>())
}

/// Decodes a value from the front of `bytes` (standard bincode configuration); returns it
/// and the bytes it used. Claimed lengths beyond what the input supports are
/// [`DecodeError::LimitExceeded`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), DecodeError> {
    let need = bytes.len().saturating_mul(CLAIM_PER_BYTE);
    if need <= 0x1000 {
        within::<T, 0x1000>(bytes)
    } else if need <= 0x4000 {
        within::<T, 0x4000>(bytes)
    } else if need <= 0x1_0000 {
        within::<T, 0x1_0000>(bytes)
    } else if need <= 0x4_0000 {
        within::<T, 0x4_0000>(bytes)
    } else if need <= 0x10_0000 {
        within::<T, 0x10_0000>(bytes)
    } else if need <= 0x40_0000 {
        within::<T, 0x40_0000>(bytes)
    } else if need <= 0x100_0000 {
        within::<T, 0x100_0000>(bytes)
    } else if need <= 0x400_0000 {
        within::<T, 0x400_0000>(bytes)
    } else if need <= 0x1000_0000 {
        within::<T, 0x1000_0000>(bytes)
    } else if need <= 0x4000_0000 {
        within::<T, 0x4000_0000>(bytes)
    } else {
        within::<T, { usize::MAX }>(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap()
    }

    #[test]
    fn valid_messages_of_every_size_decode() {
        // Small varints are the densest claim: one byte each, eight bytes claimed.
        for n in [0, 1, 100, 5000, 300_000] {
            let numbers: Vec<u64> = vec![1; n];
            let bytes = encode(&numbers);
            let (back, used): (Vec<u64>, usize) = decode(&bytes).unwrap();
            assert_eq!((back, used), (numbers, bytes.len()));
            let text = "x".repeat(n);
            let (back, _): (String, usize) = decode(&encode(&text)).unwrap();
            assert_eq!(back, text);
        }
    }

    #[test]
    fn a_claimed_length_past_the_input_is_refused_before_it_is_reserved() {
        // A string claiming 60 MiB, backed by nothing.
        let mut bytes = vec![253];
        bytes.extend((60u64 << 20).to_le_bytes());
        assert!(matches!(
            decode::<String>(&bytes),
            Err(DecodeError::LimitExceeded)
        ));
    }
}
