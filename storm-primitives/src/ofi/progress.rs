//! Completions. Every posted operation carries a [`Ticket`] as its libfabric context; a progress
//! thread reads the completion queue (which is also what drives manual-progress providers) and
//! resolves tickets. Completions that carry remote CQ data are signals from other nodes: they
//! raise the named local event.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ofi_sys as sys;
use parking_lot::{Condvar, Mutex};

use super::fabric::Fabric;
use crate::error::PrimError;
use crate::event::EventTable;

/// Remote CQ data that means "raise event N": a tag in the high bits, the event below.
const SIGNAL_TAG: u64 = 0x5354_0000_0000_0000;

pub fn signal_data(event: u32) -> u64 {
    SIGNAL_TAG | event as u64
}

fn decode_signal(data: u64) -> Option<u32> {
    (data & 0xffff_0000_0000_0000 == SIGNAL_TAG).then_some((data & 0xffff_ffff) as u32)
}

/// The completion of one posted operation.
#[derive(Default)]
pub struct Ticket {
    result: Mutex<Option<Result<(), String>>>,
    done: Condvar,
}

impl Ticket {
    pub fn new() -> Arc<Ticket> {
        Arc::new(Ticket::default())
    }

    /// The context to post with: one strong reference travels with the operation.
    pub fn context(self: &Arc<Self>) -> *mut libc::c_void {
        Arc::into_raw(self.clone()) as *mut libc::c_void
    }

    /// Takes back the reference of an operation that was never posted.
    ///
    /// # Safety
    /// `ctx` must come from [`Ticket::context`] and must not have been posted successfully.
    pub unsafe fn reclaim(ctx: *mut libc::c_void) {
        drop(unsafe { Arc::from_raw(ctx as *const Ticket) });
    }

    fn finish(&self, r: Result<(), String>) {
        *self.result.lock() = Some(r);
        self.done.notify_all();
    }

    /// Waits until `deadline`; `None` if the operation has not completed by then.
    pub fn wait(&self, deadline: Instant) -> Option<Result<(), String>> {
        let mut r = self.result.lock();
        while r.is_none() {
            if self.done.wait_until(&mut r, deadline).timed_out() {
                break;
            }
        }
        r.clone()
    }
}

/// Resolves a context from a completion entry.
///
/// # Safety
/// `ctx` must be a context from [`Ticket::context`] that completes exactly once.
unsafe fn complete(ctx: *mut libc::c_void, r: Result<(), String>) {
    if !ctx.is_null() {
        let ticket = unsafe { Arc::from_raw(ctx as *const Ticket) };
        ticket.finish(r);
    }
}

/// Reads what the completion queue holds now (or, with `wait`, blocks briefly for it), resolves
/// tickets and raises events. Returns how many entries it handled. Any thread may call it: the
/// progress thread does so in a loop, and TEST-EVENT once before it looks at its event, so a
/// signal already delivered into this node's queue is never missed.
pub fn drain(fabric: &Fabric, events: &EventTable, wait: bool) -> usize {
    let mut entries: [sys::fi_cq_data_entry; 32] = Default::default();
    let mut handled = 0;
    loop {
        // SAFETY: entries has room for 32 entries of the CQ's format (FI_CQ_FORMAT_DATA).
        let n = unsafe {
            if wait && handled == 0 && fabric.cq_waits {
                sys::fi_cq_sread(
                    fabric.cq,
                    entries.as_mut_ptr().cast(),
                    entries.len(),
                    std::ptr::null(),
                    20,
                )
            } else {
                sys::fi_cq_read(fabric.cq, entries.as_mut_ptr().cast(), entries.len())
            }
        };
        if n > 0 {
            handled += n as usize;
            for e in &entries[..n as usize] {
                // A target-side arrival carries FI_REMOTE_WRITE. Some providers (sockets) also
                // set FI_REMOTE_CQ_DATA on the initiator's own completion of fi_writedata, so
                // that flag alone does not mean a signal arrived.
                if e.flags & sys::FI_REMOTE_WRITE != 0 && e.flags & sys::FI_REMOTE_CQ_DATA != 0 {
                    match decode_signal(e.data).and_then(|ev| events.event(ev)) {
                        Some(ev) => events.signal(ev),
                        None => tracing::warn!(
                            data = e.data,
                            "remote CQ data that is not a storm signal"
                        ),
                    }
                } else {
                    // SAFETY: our operations all carry ticket contexts.
                    unsafe { complete(e.op_context, Ok(())) };
                }
            }
            continue;
        }
        if n == -(sys::FI_EAVAIL as isize) {
            let mut err = sys::fi_cq_err_entry::default();
            // SAFETY: reads one error entry into err.
            let r = unsafe { sys::fi_cq_readerr(fabric.cq, &mut err, 0) };
            if r > 0 {
                handled += 1;
                let text = fabric.strerror(err.err);
                if err.flags & sys::FI_REMOTE_WRITE == 0 {
                    // SAFETY: as above.
                    unsafe { complete(err.op_context, Err(text)) };
                }
            }
            continue;
        }
        return handled; // FI_EAGAIN, or a wait that timed out
    }
}

/// Runs until `stop`: the node's progress engine. While `frozen` (a test's stand-in for a
/// stopped process) it reads nothing.
pub fn run(
    fabric: Arc<Fabric>,
    events: Arc<EventTable>,
    stop: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
) {
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        if frozen.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if drain(&fabric, &events, true) > 0 {
            idle = 0;
            continue;
        }
        if !fabric.cq_waits {
            idle = (idle + 1).min(64);
            if idle > 8 {
                std::thread::sleep(Duration::from_micros(idle as u64 * 4));
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Waits for every ticket until `deadline`. A failure names its node; otherwise the nodes
/// whose operations had not completed by the deadline are named together.
pub fn wait_all(
    tickets: &[(u32, Arc<Ticket>)],
    deadline: Instant,
    what: &str,
) -> Result<(), PrimError> {
    let mut late = crate::nodeset::NodeSet::new();
    for (node, t) in tickets {
        match t.wait(deadline) {
            Some(Ok(())) => {}
            Some(Err(reason)) => {
                return Err(PrimError::Unreachable {
                    node: *node,
                    reason: format!("{what}: {reason}"),
                });
            }
            None => {
                late.insert(*node);
            }
        }
    }
    if late.is_empty() {
        return Ok(());
    }
    Err(PrimError::Timeout {
        detail: format!("{what}: nodes {late} did not complete in time"),
        nodes: late,
        timeout_ms: 0,
    })
}
