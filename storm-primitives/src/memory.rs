//! One node's global-memory region.
//!
//! Global memory is written by remote nodes (a network thread, or a NIC through RDMA) while
//! local code reads it, so every access is a word-sized atomic: there is no data race in the
//! Rust sense however the application and the network interleave. Bytes are copied a word at
//! a time; partial words at the ends of a copy are merged with compare-and-swap so that
//! neighbouring bytes written by someone else are never clobbered.
//!
//! The region is page-aligned and never moves, so a backend may register it with a NIC. It is
//! an anonymous mapping: the kernel gives zero pages as they are first touched, so the areas
//! a node never uses (another role's, or a queue's unused slots) cost address space only. A
//! process simulating thousands of nodes depends on that.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{PrimError, Result};
use crate::layout::VarId;
use crate::relation::Relation;

const WORD: usize = 8;

/// A zero-initialised, page-aligned region of `len` bytes (rounded up to a word).
pub struct GlobalMemory {
    ptr: NonNull<AtomicU64>,
    words: usize,
    len: usize,
}

// SAFETY: the region is only ever accessed through `AtomicU64`, which is Sync; the pointer is
// owned by this value and freed once in Drop.
unsafe impl Send for GlobalMemory {}
unsafe impl Sync for GlobalMemory {}

impl GlobalMemory {
    /// Maps the region; panics (as an allocation failure would) if the system refuses.
    pub fn new(len: usize) -> Self {
        let words = len.div_ceil(WORD).max(1);
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * WORD,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            panic!(
                "cannot map {} bytes of global memory: {}",
                words * WORD,
                std::io::Error::last_os_error()
            );
        }
        let ptr = NonNull::new(raw.cast::<AtomicU64>()).expect("mmap never returns null");
        Self { ptr, words, len }
    }

    /// Bytes of the region in memory now (pages touched and not given back), from mincore(2);
    /// 0 if the kernel will not say.
    pub fn resident_bytes(&self) -> usize {
        // SAFETY: sysconf has no preconditions.
        let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            p if p > 0 => p as usize,
            _ => return 0,
        };
        let len = self.words * WORD;
        let mut pages = vec![0u8; len.div_ceil(page)];
        // SAFETY: the range is our mapping; `pages` has one byte per page of it.
        let rc = unsafe { libc::mincore(self.ptr.as_ptr().cast(), len, pages.as_mut_ptr()) };
        if rc != 0 {
            return 0;
        }
        pages.iter().filter(|p| *p & 1 == 1).count() * page
    }

    /// Zeroes the whole region at once, as a new process's memory would be; the pages go back
    /// to the kernel until touched again.
    pub fn clear(&self) {
        // SAFETY: the mapping is private and anonymous, for which MADV_DONTNEED makes later
        // reads see zeroes; every access goes through atomics, so a concurrent one sees either
        // the old word or zero.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.words * WORD,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            for w in self.words() {
                w.store(0, Ordering::Relaxed);
            }
        }
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: ptr points to `words` zero-initialised AtomicU64 that live as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the region, for registration with a NIC. Anything writing through this pointer
    /// must treat the memory as shared with concurrent atomic readers.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }

    fn word(&self, var: VarId) -> &AtomicU64 {
        &self.words()[var.offset() as usize / WORD]
    }

    /// Reads a global variable.
    pub fn load(&self, var: VarId) -> u64 {
        self.word(var).load(Ordering::Acquire)
    }

    /// Writes a global variable locally.
    pub fn store(&self, var: VarId, value: u64) {
        self.word(var).store(value, Ordering::Release)
    }

    /// Adds to a global variable locally; returns the previous value.
    pub fn fetch_add(&self, var: VarId, delta: u64) -> u64 {
        self.word(var).fetch_add(delta, Ordering::AcqRel)
    }

    /// Whether `var REL value` holds here.
    pub fn compare(&self, var: VarId, rel: Relation, value: u64) -> bool {
        rel.holds(self.load(var), value)
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<usize> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len as u64 => Ok(offset as usize),
            _ => Err(PrimError::invalid(format!(
                "range {offset}+{len} lies outside global memory of {} bytes",
                self.len
            ))),
        }
    }

    /// Merges `bytes` into word `index` starting at byte `at`, leaving the other bytes alone.
    fn merge_into_word(&self, index: usize, at: usize, bytes: &[u8]) {
        let word = &self.words()[index];
        let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
            let mut b = old.to_ne_bytes();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            Some(u64::from_ne_bytes(b))
        });
    }

    /// Copies `data` into global memory at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut off = self.check_range(offset, data.len())?;
        let mut src = data;
        let head = off % WORD;
        if head != 0 && !src.is_empty() {
            let n = (WORD - head).min(src.len());
            self.merge_into_word(off / WORD, head, &src[..n]);
            off += n;
            src = &src[n..];
        }
        let whole = src.len() / WORD;
        let first = off / WORD;
        for (word, chunk) in self.words()[first..first + whole]
            .iter()
            .zip(src.chunks_exact(WORD))
        {
            let mut b = [0u8; WORD];
            b.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
        let tail = &src[whole * WORD..];
        if !tail.is_empty() {
            self.merge_into_word(first + whole, 0, tail);
        }
        std::sync::atomic::fence(Ordering::Release);
        Ok(())
    }

    /// Copies `buf.len()` bytes of global memory at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut off = self.check_range(offset, buf.len())?;
        std::sync::atomic::fence(Ordering::Acquire);
        let mut dst = &mut buf[..];
        let head = off % WORD;
        if head != 0 && !dst.is_empty() {
            let n = (WORD - head).min(dst.len());
            let b = self.words()[off / WORD]
                .load(Ordering::Relaxed)
                .to_ne_bytes();
            dst[..n].copy_from_slice(&b[head..head + n]);
            off += n;
            dst = &mut dst[n..];
        }
        let whole = dst.len() / WORD;
        let first = off / WORD;
        let (body, tail) = dst.split_at_mut(whole * WORD);
        for (word, chunk) in self.words()[first..first + whole]
            .iter()
            .zip(body.chunks_exact_mut(WORD))
        {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        if !tail.is_empty() {
            let b = self.words()[first + whole]
                .load(Ordering::Relaxed)
                .to_ne_bytes();
            let n = tail.len();
            tail.copy_from_slice(&b[..n]);
        }
        Ok(())
    }

    /// Borrows `len` bytes at `offset` without copying.
    ///
    /// # Safety
    ///
    /// Nothing may write these bytes while the borrow lives, neither local code nor a remote
    /// transfer. The caller must know from its protocol that the region is quiescent, as a
    /// remote-queue slot is between its signal and the consumer advancing `dequeued`.
    pub unsafe fn view(&self, offset: u64, len: usize) -> Result<&[u8]> {
        let start = self.check_range(offset, len)?;
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: in range; the caller guarantees no concurrent writer.
        Ok(unsafe { std::slice::from_raw_parts(self.as_ptr().add(start), len) })
    }

    /// The address of `len` bytes at `offset`, for a kernel or a NIC to write into (the way
    /// remote data lands in global memory without an intermediate copy).
    pub fn target(&self, offset: u64, len: usize) -> Result<*mut u8> {
        let start = self.check_range(offset, len)?;
        // SAFETY: in range of our allocation.
        Ok(unsafe { self.as_ptr().add(start) })
    }

    /// Reads `len` bytes at `offset` into a new vector.
    pub fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }
}

impl Drop for GlobalMemory {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this exact length; no reference outlives self.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.words * WORD);
        }
    }
}

impl std::fmt::Debug for GlobalMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GlobalMemory({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use proptest::prelude::*;

    const PAGE: usize = 4096;

    /// Resident pages of this process, from /proc/self/statm.
    fn resident_pages() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        statm.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_large_region_costs_only_the_pages_touched_and_clear_zeroes_it() {
        // 1 GiB, of which one word per 16 MiB is written: resident memory must grow by a
        // handful of pages, not by the gigabyte (a simulator holds thousands of these).
        let len = 1 << 30;
        let before = resident_pages();
        let mem = GlobalMemory::new(len);
        for off in (0..len).step_by(16 << 20) {
            mem.write(off as u64, &[0xAB; 8]).unwrap();
        }
        let grown = resident_pages().saturating_sub(before);
        assert!(grown < 4096, "{grown} pages resident for 64 touched");
        assert_eq!(
            mem.resident_bytes(),
            64 * PAGE,
            "mincore sees the pages touched"
        );
        assert_eq!(mem.read_vec(16 << 20, 8).unwrap(), vec![0xAB; 8]);
        mem.clear();
        assert_eq!(mem.read_vec(16 << 20, 8).unwrap(), vec![0; 8]);
        mem.write(8, &[1]).unwrap();
        assert_eq!(mem.read_vec(0, 16).unwrap()[8], 1, "usable after clear");
    }

    #[test]
    fn variables_and_bytes_share_one_region() {
        let mut b = Layout::builder();
        let v = b.var("v");
        let layout = b.build().unwrap();
        let mem = GlobalMemory::new(layout.size_at(0));
        assert_eq!(mem.as_ptr() as usize % PAGE, 0);
        mem.store(v, 0x0102_0304_0506_0708);
        assert_eq!(mem.load(v), 0x0102_0304_0506_0708);
        assert_eq!(mem.fetch_add(v, 2), 0x0102_0304_0506_0708);
        assert!(mem.compare(v, Relation::Eq, 0x0102_0304_0506_070a));
        mem.write(v.offset(), &7u64.to_ne_bytes()).unwrap();
        assert_eq!(mem.load(v), 7);
    }

    #[test]
    fn out_of_range_access_is_an_error_not_a_panic() {
        let mem = GlobalMemory::new(64);
        assert!(mem.write(60, &[0u8; 8]).is_err());
        assert!(mem.write(u64::MAX, &[1]).is_err());
        assert!(mem.read(64, &mut [0u8; 1]).is_err());
        assert!(
            mem.write(64, &[]).is_ok(),
            "an empty write at the end is in range"
        );
    }

    proptest! {
        #[test]
        fn unaligned_writes_land_exactly_and_leave_neighbours_alone(
            offset in 0usize..40, data in proptest::collection::vec(any::<u8>(), 0..70)) {
            let mem = GlobalMemory::new(128);
            mem.write(0, &[0xAA; 128]).unwrap();
            mem.write(offset as u64, &data).unwrap();
            let all = mem.read_vec(0, 128).unwrap();
            let mut expect = vec![0xAAu8; 128];
            expect[offset..offset + data.len()].copy_from_slice(&data);
            prop_assert_eq!(&all, &expect);
            let back = mem.read_vec(offset as u64, data.len()).unwrap();
            prop_assert_eq!(back, data);
        }
    }
}
