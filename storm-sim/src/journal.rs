//! The simulated MM's journal: a memory store that every MM of one simulation opens in turn
//! (a restarted MM reads what the last one committed), written in place, or (with
//! `SimOptions::background_journal`) by the daemon's committer thread, whose writes wait while
//! the journal is held ([`crate::Sim::hold_journal`]), as on a disk that has stopped answering.

use std::sync::{Arc, Condvar, Mutex};

use storm_cluster::messages::JobId;
use storm_mm::journal::{Change, Journal, JournalError, JournalStore, MemoryStore, Restored};

pub(crate) struct SimJournal {
    store: MemoryStore,
    /// Whether writes wait; `None` for a journal that commits in place.
    gate: Option<Gate>,
}

#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn set(&self, held: bool) {
        let (lock, changed) = &*self.0;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = held;
        changed.notify_all();
    }

    fn pass(&self) {
        let (lock, changed) = &*self.0;
        let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
        while *held {
            held = changed.wait(held).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for SimJournal {
    /// Lets held writes go: the MM, dropped after this, writes what it was handed before it
    /// goes (a failed test's simulation must not hang there).
    fn drop(&mut self) {
        self.hold(false);
    }
}

struct GatedStore {
    inner: MemoryStore,
    gate: Gate,
}

impl JournalStore for GatedStore {
    fn read(&mut self) -> Result<Restored, JournalError> {
        self.inner.read()
    }

    fn write(&mut self, changes: &[Change], next_job: Option<JobId>) -> Result<(), JournalError> {
        self.gate.pass();
        self.inner.write(changes, next_job)
    }
}

impl SimJournal {
    pub fn new(background: bool) -> Self {
        Self {
            store: MemoryStore::default(),
            gate: background.then(Gate::default),
        }
    }

    /// A journal for a new MM over what the earlier ones committed.
    pub fn open(&self) -> Result<(Journal, Restored), JournalError> {
        match &self.gate {
            None => Journal::with_store(Box::new(self.store.clone()), None),
            Some(gate) => {
                let store = GatedStore {
                    inner: self.store.clone(),
                    gate: gate.clone(),
                };
                let (journal, restored) = Journal::with_store(Box::new(store), None)?;
                Ok((
                    journal.commit_in_background(storm_mm::Waker::none())?,
                    restored,
                ))
            }
        }
    }

    /// Holds (or lets go) the writes of a background journal; false for one in place.
    pub fn hold(&self, held: bool) -> bool {
        self.gate.as_ref().map(|g| g.set(held)).is_some()
    }

    /// What the journal holds now.
    pub fn committed(&self) -> Restored {
        self.store
            .clone()
            .read()
            .expect("a memory store always reads")
    }
}
