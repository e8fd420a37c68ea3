//! Forwarding the tasks' output to the MM.
//!
//! The [`Forwarder`] core makes every decision without I/O of its own besides the fabric: what
//! is read from a task's stream becomes a chunk (carrying its offset in the stream) that it
//! ENQUEUEs into this node's output queue in the MM's global memory (one producer per queue,
//! so the plain remote queue of Algorithm 2 suffices). Two hosts read the tasks' streams
//! ([`OutputSource`]) into it: [`Output`], a thread that polls the daemon's pipes, and
//! [`SteppedOutput`], which reads whatever its sources hold each time it is stepped (the
//! simulator's tasks write into memory).
//!
//! **Nothing is lost when the MM goes away.** The MM releases a queue entry only once it has
//! passed the chunk on to storm-submit (see the MM's `manager::output`), so an entry the
//! producer has not seen released may still be lost with the MM. The forwarder keeps those
//! entries, and when a new membership starts a new queue epoch (after the node was out of the
//! heartbeat, or the MM restarted) it sends them again, before anything new; receivers keep
//! each byte once by its offset. Sending is held from the moment the NM registers until
//! the new epoch starts: once the MM has the registration it may reset the queue's counters
//! to the new epoch, and those would pass for room, and for releases, in the old one. A
//! delivery that fails stops the forwarder until the next epoch, and asks the NM to
//! register again (which brings one).
//!
//! **Memory is bounded.** The queue has `output_slots` slots and the producer never runs more
//! than that ahead of what the MM released, so at most `output_slots` entries are kept for
//! sending again; and while a chunk waits to be sent (no room in the queue, or no MM), the
//! hosts read no stream, so at most one chunk per watched stream waits. Beyond that the
//! tasks' writes wait in their pipes (64 KiB each, then `write` blocks): a task that writes
//! faster than its output reaches the user, or while the MM is away, is slowed down rather
//! than losing output. In all, at most `(output_slots + 2 × local tasks) × output_bytes`.
//!
//! A task's output counts as *drained* once both its streams reached end-of-file and every
//! chunk read from them was delivered; the NM reports a job's termination only after that, so
//! storm-submit always has a task's last words before it learns the task ended.
//!
//! The same hosts write the tasks' **standard input** (storm-submit's, for the ranks `-i`
//! names) with [`InputFeeds`], and acknowledge it through the forwarder's queue.

mod forwarder;
mod input;
mod pipes;
mod stepped;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

pub use forwarder::{Forwarder, ForwarderState, OutputStream};
pub use input::InputFeeds;
pub use pipes::Output;
pub use stepped::SteppedOutput;

/// Streams of one task still open or undelivered; 0 means drained.
pub type Drained = Arc<AtomicU32>;

/// One output stream of a task, as its host reads it.
pub trait OutputSource: Send {
    /// Reads what the stream holds: `Ok(0)` at its end, `WouldBlock` when nothing waits now.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    /// The pipe to wait on, if the stream is one (a stream without one is read on every
    /// pass).
    fn pipe(&self) -> Option<BorrowedFd<'_>>;
}

/// A task's pipe.
impl OutputSource for OwnedFd {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        nix::unistd::read(&*self, buf).map_err(std::io::Error::from)
    }

    fn pipe(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}
