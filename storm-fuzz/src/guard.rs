//! Allocation accounting around one call: the largest single allocation and the peak of
//! live bytes the call made on its own thread.
//!
//! A decoder that trusts a length it read (a `Vec::with_capacity(len)` before the bytes are
//! there) shows up here as an allocation far larger than its input. [`Guard`] is a global
//! allocator over the system's that counts only while [`measure`] runs on the calling thread;
//! the program that fuzzes installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static GUARD: storm_fuzz::Guard = storm_fuzz::Guard;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator (see the module's documentation).
pub struct Guard;

/// An allocation this large while a call is measured cannot be an input's due: the process
/// would abort in the allocator, taking the input with it, so the guard names it first.
pub const HOPELESS: usize = 1 << 32;

/// Called (once, from the allocator) with the size of a hopeless allocation, just before
/// the process aborts: the runner prints the input there.
static ON_HOPELESS: std::sync::OnceLock<fn(usize)> = std::sync::OnceLock::new();

/// Sets what to do about a hopeless allocation (the first call wins).
pub fn on_hopeless(f: fn(usize)) {
    let _ = ON_HOPELESS.set(f);
}

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn grew(by: usize) {
    // `try_with`: the allocator also runs while a thread's locals are being torn down.
    let _ = WATCHING.try_with(|w| {
        if w.get() && by >= HOPELESS {
            // Whatever the hook allocates is not counted.
            w.set(false);
            if let Some(f) = ON_HOPELESS.get() {
                f(by);
            }
            std::process::abort();
        }
        if w.get() {
            let live = LIVE.with(|l| {
                l.set(l.get() + by as isize);
                l.get()
            });
            PEAK.with(|p| p.set(p.get().max(live)));
            LARGEST.with(|m| m.set(m.get().max(by)));
        }
    });
}

fn shrank(by: usize) {
    let _ = WATCHING.try_with(|w| {
        if w.get() {
            LIVE.with(|l| l.set(l.get() - by as isize));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the accounting touches
// only const-initialised thread locals, which never allocate.
unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        shrank(layout.size());
        grew(new_size);
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What one call allocated on its thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The largest single allocation (or reallocation's new size), in bytes.
    pub largest: usize,
    /// The most bytes the call held at once, above what was live when it began.
    pub peak: usize,
}

/// Runs `f` with the thread's allocations counted. Nested calls are not supported (the inner
/// one resets the counts).
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Usage) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    LARGEST.with(|m| m.set(0));
    WATCHING.with(|w| w.set(true));
    let out = f();
    WATCHING.with(|w| w.set(false));
    let usage = Usage {
        largest: LARGEST.with(Cell::get),
        peak: PEAK.with(Cell::get).max(0) as usize,
    };
    (out, usage)
}

/// Whether [`Guard`] is this program's allocator: without it every [`Usage`] reads zero, and
/// the allocation check would pass without looking.
pub fn installed() -> bool {
    let (_, usage) = measure(|| std::hint::black_box(vec![0u8; 4096]));
    usage.largest >= 4096
}

/// Stops counting on this thread (after a panic unwound out of [`measure`]).
pub(crate) fn stop() {
    WATCHING.with(|w| w.set(false));
}
