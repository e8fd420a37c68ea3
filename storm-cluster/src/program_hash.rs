//! Hashing program files, remembered by what `fstat` says of them.
//!
//! The MM hashes each submitted program, and every node the file at the program's path,
//! before a job may run its program in place (see `messages::program_digest`). Users run
//! the same program again and again, so both sides remember the hash of a file by its
//! device, inode, size and modification and change times: a file rewritten since gets a new
//! change time, and is read again.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

/// How many files' hashes a cache keeps (it starts afresh when full).
const KEPT: usize = 256;

/// What identifies one version of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileVersion {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileVersion {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The hashes of files hashed before, shared by the threads that hash.
#[derive(Debug, Clone, Default)]
pub struct HashCache(Arc<Mutex<HashMap<FileVersion, [u8; 32]>>>);

impl HashCache {
    /// The BLAKE3 hash of `file`'s bytes (read from its start with `pread`, so the
    /// descriptor's offset is left alone), from the cache if this version was hashed before.
    /// `stop` is asked between reads: true gives up with `ErrorKind::Interrupted`.
    pub fn hash(&self, file: &File, stop: &dyn Fn() -> bool) -> std::io::Result<[u8; 32]> {
        let before = FileVersion::of(&file.metadata()?);
        if let Some(h) = self.lock().get(&before) {
            return Ok(*h);
        }
        let hash = hash_file(file, stop)?;
        // A file written while it was read hashes to nothing worth remembering.
        if FileVersion::of(&file.metadata()?) == before {
            let mut kept = self.lock();
            if kept.len() >= KEPT {
                kept.clear();
            }
            kept.insert(before, hash);
        }
        Ok(hash)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileVersion, [u8; 32]>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The BLAKE3 hash of a file's bytes, read through a duplicate of its descriptor from the
/// start.
fn hash_file(file: &File, stop: &dyn Fn() -> bool) -> std::io::Result<[u8; 32]> {
    use std::os::unix::fs::FileExt;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    loop {
        if stop() {
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        let n = match file.read_at(&mut buf, offset) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    Ok(*hasher.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_rewritten_in_place_is_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        std::fs::write(&path, b"first version").unwrap();
        let cache = HashCache::default();
        let never = || false;
        let first = cache.hash(&File::open(&path).unwrap(), &never).unwrap();
        assert_eq!(first, *blake3::hash(b"first version").as_bytes());
        // Same size, same inode: only the change time tells them apart.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(b"other version").unwrap();
        drop(f);
        let second = cache.hash(&File::open(&path).unwrap(), &never).unwrap();
        assert_eq!(second, *blake3::hash(b"other version").as_bytes());
    }

    #[test]
    fn hashing_stops_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        std::fs::write(&path, vec![7u8; 3 << 20]).unwrap();
        let err = HashCache::default()
            .hash(&File::open(&path).unwrap(), &|| true)
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::Interrupted);
    }
}
