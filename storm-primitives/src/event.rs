//! Local events: counters raised by remote signals (paper Sec. 2.4.1).
//!
//! Each signal is consumed by exactly one TEST-EVENT that returns true, like a counting
//! semaphore; this is what lets DEQUEUE (Algorithm 3) take one queue entry per signal. A failed
//! XFER-AND-SIGNAL raises its local event with a failure that carries the reason; a TEST-EVENT
//! that consumes it returns that error. A blocking TEST-EVENT parks the thread on a condition
//! variable; it never spins.
//!
//! The table also keeps a *ready list*: every event raised since the last
//! [`EventTable::take_ready`], each once. A consumer of many events (the MM, with one output
//! queue per node) asks which were raised instead of testing them all, as with epoll.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{PrimError, Result};
use crate::layout::EventId;

/// How TEST-EVENT waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Return at once.
    Poll,
    /// Park until the event is signalled.
    Block,
    /// Park at most this long.
    Timeout(Duration),
}

#[derive(Default)]
struct Signals {
    ok: u64,
    failed: VecDeque<PrimError>,
    /// A wake-up waits for a TEST-EVENT that waits (see [`EventTable::wake`]).
    woken: bool,
}

#[derive(Default)]
struct Cell {
    signals: Mutex<Signals>,
    raised: Condvar,
    /// On the ready list now.
    listed: AtomicBool,
}

/// The events of one node.
pub struct EventTable {
    cells: Box<[Cell]>,
    closed: Mutex<bool>,
    ready: Mutex<Vec<EventId>>,
}

impl EventTable {
    pub fn new(count: usize) -> Self {
        Self {
            cells: (0..count).map(|_| Cell::default()).collect(),
            closed: Mutex::new(false),
            ready: Mutex::new(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Event `raw` of this table, if it has one (for ids decoded from the network).
    pub fn event(&self, raw: u32) -> Option<EventId> {
        ((raw as usize) < self.len()).then_some(EventId(raw))
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    fn cell(&self, ev: EventId) -> Result<&Cell> {
        self.cells.get(ev.index()).ok_or_else(|| {
            PrimError::invalid(format!(
                "event {} does not exist (the layout has {})",
                ev.index(),
                self.cells.len()
            ))
        })
    }

    /// Raises `ev` once with success.
    pub fn signal(&self, ev: EventId) {
        if let Ok(cell) = self.cell(ev) {
            cell.signals.lock().ok += 1;
            cell.raised.notify_one();
            self.list(ev, cell);
        }
    }

    /// Raises `ev` once with a failure.
    pub fn fail(&self, ev: EventId, why: PrimError) {
        if let Ok(cell) = self.cell(ev) {
            cell.signals.lock().failed.push_back(why);
            cell.raised.notify_one();
            self.list(ev, cell);
        }
    }

    /// Ends a wait for `ev` without a signal: the TEST-EVENT that waits for it now, or else the
    /// next one that would wait, returns false at once, as if its time had run out. A poll
    /// neither sees nor takes it. A thread of the node wakes another this way; unlike a
    /// signal, a wake-up says nothing arrived (a queue's consumer reads no slot for it).
    pub fn wake(&self, ev: EventId) {
        if let Ok(cell) = self.cell(ev) {
            cell.signals.lock().woken = true;
            cell.raised.notify_all();
        }
    }

    /// Puts `ev` on the ready list unless it is there already (so the list never holds more
    /// entries than the table has events).
    fn list(&self, ev: EventId, cell: &Cell) {
        if !cell.listed.swap(true, Ordering::AcqRel) {
            self.ready.lock().push(ev);
        }
    }

    /// Moves into `out` every event raised since the last call, each once. A hint: its
    /// signals may have been consumed since by TEST-EVENT, which says what is really there.
    pub fn take_ready(&self, out: &mut Vec<EventId>) {
        let taken = std::mem::take(&mut *self.ready.lock());
        for &ev in &taken {
            // Cleared before the caller tests it: a signal raised from now on lists it again.
            self.cells[ev.index()]
                .listed
                .store(false, Ordering::Release);
        }
        out.extend(taken);
    }

    /// Wakes every blocked waiter with [`PrimError::ShutDown`].
    pub fn close(&self) {
        *self.closed.lock() = true;
        for cell in self.cells.iter() {
            let _guard = cell.signals.lock();
            cell.raised.notify_all();
        }
    }

    /// Forgets every signal and opens the table again: the events of a new process.
    pub fn reset(&self) {
        *self.closed.lock() = false;
        let mut ready = Vec::new();
        self.take_ready(&mut ready);
        for cell in self.cells.iter() {
            let mut s = cell.signals.lock();
            s.ok = 0;
            s.failed.clear();
            s.woken = false;
        }
    }

    fn is_closed(&self) -> bool {
        *self.closed.lock()
    }

    /// TEST-EVENT: consumes one signal if there is one. `Ok(true)` for a success, the failure's
    /// error for a failure, `Ok(false)` when nothing arrived in time. Failures are reported
    /// before successes so that an error is never hidden behind later good news.
    pub fn test(&self, ev: EventId, wait: Wait) -> Result<bool> {
        let cell = self.cell(ev)?;
        let deadline = match wait {
            Wait::Timeout(d) => Some(Instant::now() + d),
            _ => None,
        };
        let mut s = cell.signals.lock();
        loop {
            if let Some(err) = s.failed.pop_front() {
                return Err(err);
            }
            if s.ok > 0 {
                s.ok -= 1;
                return Ok(true);
            }
            if self.is_closed() {
                return Err(PrimError::ShutDown);
            }
            if wait != Wait::Poll && std::mem::take(&mut s.woken) {
                return Ok(false);
            }
            match (wait, deadline) {
                (Wait::Poll, _) => return Ok(false),
                (Wait::Block, _) => cell.raised.wait(&mut s),
                (Wait::Timeout(_), Some(deadline)) => {
                    if cell.raised.wait_until(&mut s, deadline).timed_out() {
                        if let Some(err) = s.failed.pop_front() {
                            return Err(err);
                        }
                        if s.ok > 0 {
                            s.ok -= 1;
                            return Ok(true);
                        }
                        return Ok(false);
                    }
                }
                (Wait::Timeout(_), None) => unreachable!("deadline set for timeouts"),
            }
        }
    }

    /// Signals not yet consumed (successes, failures), without consuming them.
    pub fn pending(&self, ev: EventId) -> Result<(u64, usize)> {
        let s = self.cell(ev)?.signals.lock();
        Ok((s.ok, s.failed.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn each_signal_is_consumed_once() {
        let t = EventTable::new(2);
        let e = EventId(1);
        assert_eq!(t.test(e, Wait::Poll), Ok(false));
        t.signal(e);
        t.signal(e);
        assert_eq!(t.test(e, Wait::Poll), Ok(true));
        assert_eq!(t.test(e, Wait::Poll), Ok(true));
        assert_eq!(t.test(e, Wait::Poll), Ok(false));
        assert_eq!(
            t.test(EventId(0), Wait::Poll),
            Ok(false),
            "events are independent"
        );
    }

    #[test]
    fn failures_come_back_as_errors_before_successes() {
        let t = EventTable::new(1);
        let e = EventId(0);
        t.signal(e);
        t.fail(e, PrimError::TransferFailed("node 3 died".into()));
        assert_eq!(
            t.test(e, Wait::Poll),
            Err(PrimError::TransferFailed("node 3 died".into()))
        );
        assert_eq!(t.test(e, Wait::Poll), Ok(true));
    }

    #[test]
    fn blocking_wait_wakes_on_signal_and_on_close() {
        let t = Arc::new(EventTable::new(1));
        let e = EventId(0);
        let t2 = t.clone();
        let waiter = std::thread::spawn(move || t2.test(e, Wait::Block));
        std::thread::sleep(Duration::from_millis(20));
        t.signal(e);
        assert_eq!(waiter.join().unwrap(), Ok(true));
        let t3 = t.clone();
        let waiter = std::thread::spawn(move || t3.test(e, Wait::Block));
        std::thread::sleep(Duration::from_millis(20));
        t.close();
        assert_eq!(waiter.join().unwrap(), Err(PrimError::ShutDown));
    }

    #[test]
    fn timeout_returns_false_when_nothing_arrives() {
        let t = EventTable::new(1);
        assert_eq!(
            t.test(EventId(0), Wait::Timeout(Duration::from_millis(5))),
            Ok(false)
        );
        assert!(matches!(
            t.test(EventId(7), Wait::Poll),
            Err(PrimError::InvalidArgument(_))
        ));
    }
}
