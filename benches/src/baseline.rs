//! Baselines measured in the same run as the figures they put in perspective.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::stats::{Budget, Samples, sample};

/// One `memcpy` of `len` bytes between two buffers.
pub fn memcpy(len: usize, budget: Budget) -> Result<Samples> {
    let src = vec![0x5au8; len.max(1)];
    let mut dst = vec![0u8; len.max(1)];
    sample::<anyhow::Error>(budget, || {
        let t = Instant::now();
        dst[..len].copy_from_slice(std::hint::black_box(&src[..len]));
        std::hint::black_box(&mut dst);
        Ok(t.elapsed())
    })
}

/// One BLAKE3 hash of `len` bytes, in one pass on one thread (as a node hashes a program
/// it receives, and the MM one it sends).
pub fn blake3(len: usize, budget: Budget) -> Result<Samples> {
    let data = vec![0x3cu8; len];
    sample::<anyhow::Error>(budget, || {
        let t = Instant::now();
        std::hint::black_box(blake3::hash(std::hint::black_box(&data)));
        Ok(t.elapsed())
    })
}

/// AES-256-GCM sealing of `len` bytes in frames of `frame` bytes, in place, one nonce per
/// frame: what the tcp backend's encryption (its default) does to every byte it sends.
pub fn aes_gcm(len: usize, frame: usize, budget: Budget) -> Result<Samples> {
    use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    let key = LessSafeKey::new(
        UnboundKey::new(&AES_256_GCM, &[7u8; 32])
            .map_err(|_| anyhow::anyhow!("cannot make an AES-256-GCM key"))?,
    );
    let mut data = vec![0x96u8; len];
    let mut counter = 0u64;
    sample::<anyhow::Error>(budget, || {
        let t = Instant::now();
        for piece in data.chunks_mut(frame.max(1)) {
            counter += 1;
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&counter.to_le_bytes());
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::empty(),
                    piece,
                )
                .map_err(|_| anyhow::anyhow!("AES-256-GCM sealing failed"))?;
            let _ = std::hint::black_box(tag);
        }
        Ok(t.elapsed())
    })
}

/// A raw TCP connection on loopback, with a peer thread that reads `len` bytes and answers
/// with one byte.
pub struct RawTcp {
    client: TcpStream,
}

impl RawTcp {
    pub fn connect() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            s.set_nodelay(true).ok();
            let mut buf = vec![0u8; 1 << 20];
            let mut len_bytes = [0u8; 8];
            while s.read_exact(&mut len_bytes).is_ok() {
                let mut left = u64::from_le_bytes(len_bytes) as usize;
                while left > 0 {
                    let n = buf.len().min(left);
                    if s.read_exact(&mut buf[..n]).is_err() {
                        return;
                    }
                    left -= n;
                }
                if s.write_all(&[1]).is_err() {
                    return;
                }
            }
        });
        let client = TcpStream::connect(addr).context("raw tcp baseline")?;
        client.set_nodelay(true)?;
        Ok(Self { client })
    }

    /// Sends `data` and waits for the peer's one-byte answer: one transfer, end to end.
    pub fn transfer(&mut self, data: &[u8]) -> Result<Duration> {
        let t = Instant::now();
        self.client.write_all(&(data.len() as u64).to_le_bytes())?;
        self.client.write_all(data)?;
        let mut ack = [0u8; 1];
        self.client.read_exact(&mut ack)?;
        Ok(t.elapsed())
    }
}

/// One raw TCP transfer of `len` bytes, acknowledged by the receiver.
pub fn raw_tcp(len: usize, budget: Budget) -> Result<Samples> {
    let mut conn = RawTcp::connect()?;
    let data = vec![0xa5u8; len];
    sample(budget, || conn.transfer(&data))
}
