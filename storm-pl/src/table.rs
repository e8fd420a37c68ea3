//! The NM-PL table: one slot per local task in a shared anonymous memory file (memfd).
//!
//! A slot moves FREE -> STARTING (the NM claimed it and asked the launcher to start its task)
//! -> SPAWNING (the launcher is starting the task) -> RUNNING (the launcher wrote the task's
//! process id, which is also its process group) -> EXITED (the launcher wrote the exit
//! status). Every field is an atomic; the state is written last with release ordering, so a
//! reader that sees EXITED also sees the status. The launcher also records when
//! (CLOCK_MONOTONIC) the task started and ended, for `storm-submit --timing`.
//!
//! Gang scheduling may stop a job whose task does not exist yet. The NM then moves the slot
//! STARTING -> HELD, and the launcher, finding it held, keeps the request until the NM moves
//! it back and tells it to look again. A job killed before its task started moves STARTING or
//! HELD -> CANCELLED, with the signal beside it; the launcher then writes EXITED without
//! starting anything. The compare-and-swaps decide every race: either the NM holds or cancels
//! the slot before the launcher begins (the task does not start), or the launcher began first
//! (SPAWNING), and the NM waits for the process id to signal the task. Only the NM ever stops
//! or continues a task, so no stop can be undone by a late continue.
//!
//! Every request the launcher takes ends with it writing EXITED, and the NM frees a slot only
//! once it reads EXITED (or the launcher is gone): a slot is never claimed again while an old
//! request for it may still be acted on.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use storm_cluster::messages::RankStatus;

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Free = 0,
    Starting = 1,
    Held = 2,
    Spawning = 3,
    Running = 4,
    Exited = 5,
    Cancelled = 6,
}

impl SlotState {
    fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Free,
            1 => Self::Starting,
            2 => Self::Held,
            3 => Self::Spawning,
            4 => Self::Running,
            6 => Self::Cancelled,
            _ => Self::Exited,
        }
    }
}

/// What [`PlTable::hold`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The task has not started and will not until [`PlTable::unhold`].
    Held,
    /// The PL is starting the task; its process id comes shortly.
    Spawning,
    /// The task runs as this process (and process group): stop it with a signal.
    Running(i32),
    /// The task ended (or never could start).
    Ended,
}

/// What [`PlTable::try_begin_spawn`] found: whether the launcher may start the task now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// The slot is SPAWNING now: start the task.
    Go,
    /// The NM holds the slot: keep the request until told to look again.
    Held,
    /// The job was killed before its task started: the status to write as EXITED.
    Cancelled(RankStatus),
    /// The slot is in a state no request of this launcher should find.
    OutOfStep(SlotState),
}

/// What [`PlTable::cancel`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The task will never start; the launcher writes EXITED once it sees the request.
    Cancelled,
    /// The launcher is starting the task: signal it once its process id is there.
    Spawning,
    /// The task runs as this process (and process group): signal it.
    Running(i32),
    /// The task already ended (or was already cancelled).
    Ended,
}

#[repr(C)]
struct Slot {
    state: AtomicU32,
    /// The signal of a cancel, written by the NM before it moves the slot to CANCELLED.
    cancel: AtomicU32,
    pid: AtomicI64,
    status: AtomicI64,
    /// CLOCK_MONOTONIC nanoseconds when the task was started, and when it ended.
    started_ns: AtomicI64,
    exited_ns: AtomicI64,
}

impl Slot {
    /// Moves the state from `from` to `to` if it is `from` (one compare-and-swap: acquire and
    /// release, so what was written before the move is seen with it); else the state found.
    fn move_state(&self, from: SlotState, to: SlotState) -> Result<(), SlotState> {
        self.state
            .compare_exchange(from as u32, to as u32, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(SlotState::from_raw)
    }
}

const SLOT_BYTES: usize = std::mem::size_of::<Slot>();
const MAGIC: u64 = 0x5354_4f52_4d50_4c34; // "STORMPL4"

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("shared memory: {0}")]
    Sys(#[from] nix::Error),
    #[error("descriptor {0} is not a storm-pl table")]
    NotATable(i32),
    #[error("slot {slot} outside a table of {len}")]
    NoSlot { slot: usize, len: usize },
}

/// The shared table, mapped in this process.
pub struct PlTable {
    base: NonNull<u8>,
    bytes: usize,
    slots: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is only accessed through atomics.
unsafe impl Send for PlTable {}
unsafe impl Sync for PlTable {}

fn encode(status: RankStatus) -> i64 {
    match status {
        RankStatus::Exited(c) => c as i64,
        RankStatus::Signaled(s) => -(s as i64),
    }
}

fn decode(raw: i64) -> RankStatus {
    if raw < 0 {
        RankStatus::Signaled((-raw) as i32)
    } else {
        RankStatus::Exited(raw as i32)
    }
}

impl PlTable {
    /// Creates a table of `slots` slots (NM side).
    pub fn create(slots: usize) -> Result<Self, TableError> {
        let fd = nix::sys::memfd::memfd_create(
            "storm-pl-table",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )?;
        let bytes = SLOT_BYTES * (slots + 1);
        nix::unistd::ftruncate(&fd, bytes as i64)?;
        let table = Self::map(fd, bytes, slots)?;
        // Slot "-1" (the header) holds the magic and the slot count.
        let header = table.raw_slot(0);
        header.pid.store(MAGIC as i64, Ordering::Relaxed);
        header.status.store(slots as i64, Ordering::Release);
        Ok(table)
    }

    /// Maps a table created by an NM (PL side).
    pub fn open(fd: OwnedFd) -> Result<Self, TableError> {
        let raw = fd.as_raw_fd();
        let stat = nix::sys::stat::fstat(&fd)?;
        let bytes = stat.st_size as usize;
        if bytes < SLOT_BYTES || bytes % SLOT_BYTES != 0 {
            return Err(TableError::NotATable(raw));
        }
        let table = Self::map(fd, bytes, bytes / SLOT_BYTES - 1)?;
        let header = table.raw_slot(0);
        if header.pid.load(Ordering::Relaxed) != MAGIC as i64
            || header.status.load(Ordering::Acquire) != table.slots as i64
        {
            return Err(TableError::NotATable(raw));
        }
        Ok(table)
    }

    fn map(fd: OwnedFd, bytes: usize, slots: usize) -> Result<Self, TableError> {
        // SAFETY: a fresh shared mapping of a file we hold open; unmapped in Drop.
        let ptr = unsafe {
            mmap(
                None,
                std::num::NonZeroUsize::new(bytes).expect("non-empty"),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )?
        };
        Ok(Self {
            base: ptr.cast(),
            bytes,
            slots,
            fd,
        })
    }

    fn raw_slot(&self, index: usize) -> &Slot {
        // SAFETY: index <= slots, inside the mapping; Slot is all atomics.
        unsafe { &*self.base.as_ptr().add(index * SLOT_BYTES).cast::<Slot>() }
    }

    fn slot(&self, slot: usize) -> Result<&Slot, TableError> {
        if slot >= self.slots {
            return Err(TableError::NoSlot {
                slot,
                len: self.slots,
            });
        }
        Ok(self.raw_slot(slot + 1))
    }

    pub fn len(&self) -> usize {
        self.slots
    }

    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }

    /// The descriptor to hand to a PL.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn state(&self, slot: usize) -> Result<SlotState, TableError> {
        Ok(SlotState::from_raw(
            self.slot(slot)?.state.load(Ordering::Acquire),
        ))
    }

    /// NM: a free slot, marked STARTING.
    pub fn claim(&self) -> Option<usize> {
        (0..self.slots).find(|&i| {
            self.raw_slot(i + 1)
                .move_state(SlotState::Free, SlotState::Starting)
                .is_ok()
        })
    }

    /// NM: makes a slot free again.
    pub fn release(&self, slot: usize) -> Result<(), TableError> {
        let s = self.slot(slot)?;
        s.pid.store(0, Ordering::Relaxed);
        s.status.store(0, Ordering::Relaxed);
        s.cancel.store(0, Ordering::Relaxed);
        s.started_ns.store(0, Ordering::Relaxed);
        s.exited_ns.store(0, Ordering::Relaxed);
        s.state.store(SlotState::Free as u32, Ordering::Release);
        Ok(())
    }

    /// NM: keeps the slot's task from starting, if it has not begun to (see the module docs).
    pub fn hold(&self, slot: usize) -> Result<Hold, TableError> {
        let s = self.slot(slot)?;
        let now = match s.move_state(SlotState::Starting, SlotState::Held) {
            Ok(()) => return Ok(Hold::Held),
            Err(now) => now,
        };
        Ok(match now {
            SlotState::Held => Hold::Held,
            SlotState::Free | SlotState::Starting | SlotState::Spawning => Hold::Spawning,
            SlotState::Running => match self.pid(slot)? {
                Some(pid) => Hold::Running(pid),
                None => Hold::Spawning,
            },
            SlotState::Exited | SlotState::Cancelled => Hold::Ended,
        })
    }

    /// NM: lets a held slot's task start (tell the launcher to look again).
    pub fn unhold(&self, slot: usize) -> Result<(), TableError> {
        let s = self.slot(slot)?;
        let _ = s.move_state(SlotState::Held, SlotState::Starting);
        Ok(())
    }

    /// NM: makes sure the slot's task never starts, if it has not begun to, and gives it
    /// `signal` as its end (see the module docs). Tell the launcher to look again.
    pub fn cancel(&self, slot: usize, signal: i32) -> Result<Cancel, TableError> {
        let s = self.slot(slot)?;
        s.cancel.store(signal as u32, Ordering::Relaxed);
        for from in [SlotState::Starting, SlotState::Held] {
            if s.move_state(from, SlotState::Cancelled).is_ok() {
                return Ok(Cancel::Cancelled);
            }
        }
        Ok(match self.state(slot)? {
            SlotState::Running => match self.pid(slot)? {
                Some(pid) => Cancel::Running(pid),
                None => Cancel::Spawning,
            },
            SlotState::Exited | SlotState::Cancelled => Cancel::Ended,
            // Held or Starting again only if the NM raced itself; the launcher is at it.
            SlotState::Free | SlotState::Starting | SlotState::Held | SlotState::Spawning => {
                Cancel::Spawning
            }
        })
    }

    /// Launcher: whether it may start the slot's task now; if so, the slot is SPAWNING.
    pub fn try_begin_spawn(&self, slot: usize) -> Result<Begin, TableError> {
        let s = self.slot(slot)?;
        let now = match s.move_state(SlotState::Starting, SlotState::Spawning) {
            Ok(()) => return Ok(Begin::Go),
            Err(now) => now,
        };
        Ok(match now {
            SlotState::Held => Begin::Held,
            SlotState::Cancelled => {
                Begin::Cancelled(RankStatus::Signaled(s.cancel.load(Ordering::Relaxed) as i32))
            }
            other => Begin::OutOfStep(other),
        })
    }

    /// Launcher: the task runs as process `pid` (also its process group).
    pub fn set_running(&self, slot: usize, pid: i32) -> Result<(), TableError> {
        let s = self.slot(slot)?;
        s.pid.store(pid as i64, Ordering::Relaxed);
        s.started_ns.store(now_ns(), Ordering::Relaxed);
        s.state.store(SlotState::Running as u32, Ordering::Release);
        Ok(())
    }

    /// Launcher: the task ended (or never started).
    pub fn set_exited(&self, slot: usize, status: RankStatus) -> Result<(), TableError> {
        let s = self.slot(slot)?;
        s.status.store(encode(status), Ordering::Relaxed);
        s.exited_ns.store(now_ns(), Ordering::Relaxed);
        s.state.store(SlotState::Exited as u32, Ordering::Release);
        Ok(())
    }

    /// The task's process id, once running.
    pub fn pid(&self, slot: usize) -> Result<Option<i32>, TableError> {
        let s = self.slot(slot)?;
        let state = SlotState::from_raw(s.state.load(Ordering::Acquire));
        let pid = s.pid.load(Ordering::Relaxed);
        let started = matches!(state, SlotState::Running | SlotState::Exited);
        Ok((started && pid > 0).then_some(pid as i32))
    }

    /// The exit status, once exited; for a cancelled slot, the signal of the cancel (its
    /// task never runs, though the launcher may not have written EXITED yet).
    pub fn status(&self, slot: usize) -> Result<Option<RankStatus>, TableError> {
        let s = self.slot(slot)?;
        Ok(match SlotState::from_raw(s.state.load(Ordering::Acquire)) {
            SlotState::Exited => Some(decode(s.status.load(Ordering::Relaxed))),
            SlotState::Cancelled => {
                Some(RankStatus::Signaled(s.cancel.load(Ordering::Relaxed) as i32))
            }
            _ => None,
        })
    }

    /// Whether the launcher is done with the slot (it wrote EXITED): the NM may free it.
    pub fn is_settled(&self, slot: usize) -> Result<bool, TableError> {
        Ok(self.state(slot)? == SlotState::Exited)
    }

    /// When the task started and ended (CLOCK_MONOTONIC nanoseconds), as far as it has.
    pub fn times(&self, slot: usize) -> Result<(Option<u128>, Option<u128>), TableError> {
        let s = self.slot(slot)?;
        let state = SlotState::from_raw(s.state.load(Ordering::Acquire));
        let at = |t: &AtomicI64| Some(t.load(Ordering::Relaxed)).filter(|&ns| ns > 0);
        let started = matches!(state, SlotState::Running | SlotState::Exited)
            .then(|| at(&s.started_ns))
            .flatten();
        let exited = (state == SlotState::Exited)
            .then(|| at(&s.exited_ns))
            .flatten();
        Ok((started.map(|n| n as u128), exited.map(|n| n as u128)))
    }
}

fn now_ns() -> i64 {
    storm_cluster::daemon::monotonic_ns() as i64
}

impl Drop for PlTable {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length.
        let _ = unsafe { munmap(self.base.cast(), self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_goes_through_its_states_and_is_seen_through_a_second_mapping() {
        let nm = PlTable::create(4).unwrap();
        let dup = nm.fd().try_clone_to_owned().unwrap();
        let pl = PlTable::open(dup).unwrap();
        let slot = nm.claim().unwrap();
        assert_eq!(pl.state(slot).unwrap(), SlotState::Starting);
        assert_eq!(nm.pid(slot).unwrap(), None);
        pl.set_running(slot, 4242).unwrap();
        assert_eq!(nm.pid(slot).unwrap(), Some(4242));
        assert_eq!(nm.status(slot).unwrap(), None);
        pl.set_exited(slot, RankStatus::Signaled(9)).unwrap();
        assert_eq!(nm.status(slot).unwrap(), Some(RankStatus::Signaled(9)));
        pl.set_exited(slot, RankStatus::Exited(3)).unwrap();
        assert_eq!(nm.status(slot).unwrap(), Some(RankStatus::Exited(3)));
        nm.release(slot).unwrap();
        assert_eq!(nm.state(slot).unwrap(), SlotState::Free);
        let taken: Vec<_> = std::iter::from_fn(|| nm.claim()).collect();
        assert_eq!(taken, vec![0, 1, 2, 3]);
        assert!(matches!(nm.state(4), Err(TableError::NoSlot { .. })));
    }

    #[test]
    fn a_held_slot_is_not_started_until_the_nm_lets_it_go() {
        let nm = PlTable::create(2).unwrap();
        let pl = PlTable::open(nm.fd().try_clone_to_owned().unwrap()).unwrap();
        let slot = nm.claim().unwrap();
        assert_eq!(nm.hold(slot).unwrap(), Hold::Held);
        assert_eq!(
            nm.hold(slot).unwrap(),
            Hold::Held,
            "holding twice is harmless"
        );
        assert_eq!(pl.try_begin_spawn(slot).unwrap(), Begin::Held);
        assert_eq!(nm.state(slot).unwrap(), SlotState::Held);
        nm.unhold(slot).unwrap();
        assert_eq!(pl.try_begin_spawn(slot).unwrap(), Begin::Go);
        assert_eq!(nm.state(slot).unwrap(), SlotState::Spawning);
        // Too late to hold or cancel: the NM is told to wait for the process id, then gets it.
        assert_eq!(nm.hold(slot).unwrap(), Hold::Spawning);
        assert_eq!(nm.cancel(slot, 15).unwrap(), Cancel::Spawning);
        assert_eq!(nm.status(slot).unwrap(), None, "a spawning task has no end");
        pl.set_running(slot, 777).unwrap();
        assert_eq!(nm.hold(slot).unwrap(), Hold::Running(777));
        assert_eq!(nm.cancel(slot, 15).unwrap(), Cancel::Running(777));
        pl.set_exited(slot, RankStatus::Exited(0)).unwrap();
        assert_eq!(nm.hold(slot).unwrap(), Hold::Ended);
        assert_eq!(
            nm.status(slot).unwrap(),
            Some(RankStatus::Exited(0)),
            "a refused cancel leaves the launcher's status alone"
        );
        nm.unhold(slot).unwrap();
        assert_eq!(
            nm.state(slot).unwrap(),
            SlotState::Exited,
            "unhold moves only a held slot"
        );
    }

    #[test]
    fn a_task_cancelled_before_it_began_never_starts_and_ends_with_the_signal() {
        let nm = PlTable::create(2).unwrap();
        let pl = PlTable::open(nm.fd().try_clone_to_owned().unwrap()).unwrap();
        for held in [false, true] {
            let slot = nm.claim().unwrap();
            if held {
                nm.hold(slot).unwrap();
            }
            assert_eq!(nm.cancel(slot, 9).unwrap(), Cancel::Cancelled);
            assert_eq!(nm.status(slot).unwrap(), Some(RankStatus::Signaled(9)));
            assert!(
                !nm.is_settled(slot).unwrap(),
                "the launcher has not seen the request yet: the slot is not free to reuse"
            );
            nm.unhold(slot).unwrap();
            assert_eq!(
                pl.try_begin_spawn(slot).unwrap(),
                Begin::Cancelled(RankStatus::Signaled(9)),
                "held: {held}"
            );
            pl.set_exited(slot, RankStatus::Signaled(9)).unwrap();
            assert!(nm.is_settled(slot).unwrap());
            assert_eq!(nm.cancel(slot, 15).unwrap(), Cancel::Ended);
            nm.release(slot).unwrap();
        }
    }

    #[test]
    fn a_descriptor_that_is_not_a_table_is_refused() {
        let f = std::fs::File::open("/etc/hostname")
            .unwrap_or_else(|_| std::fs::File::open("/etc/passwd").unwrap());
        assert!(PlTable::open(OwnedFd::from(f)).is_err());
    }
}
