//! The simulated MM's journal: a memory store that every MM of one simulation opens in turn
//! (a restarted MM reads what the last one committed). It commits in place, or (with
//! `SimOptions::background_journal`) hands its commits to the environment, as the daemon's
//! does: [`JournalWriter`] writes them at the simulation's next step, or holds them while the
//! journal is held ([`crate::Sim::hold_journal`]), as a disk that has stopped answering.

use std::time::Duration;

use storm_mm::journal::{
    Batch, Journal, JournalError, JournalStore, MemoryStore, Restored, Settled,
};

pub(crate) struct SimJournal {
    store: MemoryStore,
    background: bool,
}

impl SimJournal {
    pub fn new(background: bool) -> Self {
        Self {
            store: MemoryStore::default(),
            background,
        }
    }

    /// The journal of a replica of a replicated MM, over its own store: it hands its commits
    /// over (to the group, see [`crate::group`]).
    pub fn over(store: MemoryStore) -> Self {
        Self {
            store,
            background: true,
        }
    }

    /// A journal for a new MM over what the earlier ones committed, and the writer of its
    /// handed commits if it hands them off.
    pub fn open(&self) -> Result<(Journal, Restored, Option<JournalWriter>), JournalError> {
        let (journal, restored) = Journal::with_store(Box::new(self.store.clone()), None)?;
        if !self.background {
            return Ok((journal, restored, None));
        }
        let (journal, _) = journal.hand_off();
        let writer = JournalWriter {
            store: self.store.clone(),
            queued: Vec::new(),
            held: false,
        };
        Ok((journal, restored, Some(writer)))
    }

    /// What the journal holds now.
    pub fn committed(&self) -> Restored {
        self.store
            .clone()
            .read()
            .expect("a memory store always reads")
    }
}

/// Writes the batches a handed-off journal commits, in virtual time.
pub struct JournalWriter {
    store: MemoryStore,
    queued: Vec<Batch>,
    held: bool,
}

impl JournalWriter {
    pub fn persist(&mut self, batch: Batch) {
        self.queued.push(batch);
    }

    /// The batches handed over since the last call, to be written elsewhere (a replicated
    /// MM's group).
    pub fn take(&mut self) -> Vec<Batch> {
        std::mem::take(&mut self.queued)
    }

    pub fn hold(&mut self, held: bool) {
        self.held = held;
    }

    /// Writes what was handed over, unless held, as one transaction (the daemon's thread
    /// writes batches that queued up together); how it settled.
    pub fn write(&mut self) -> Option<Settled> {
        if self.held {
            return None;
        }
        self.write_all()
    }

    /// Writes what was handed over, held or not (the MM goes: the daemon's thread writes
    /// what it was handed before it ends).
    pub fn write_all(&mut self) -> Option<Settled> {
        let batches = std::mem::take(&mut self.queued);
        let last = batches.last()?.number;
        let mut changes = Vec::new();
        let mut next_job = None;
        for b in batches {
            changes.extend(b.changes);
            next_job = b.next_job.or(next_job);
        }
        let outcome = self.store.write(&changes, next_job);
        Some(Settled {
            batch: last,
            outcome,
            took: Duration::ZERO,
        })
    }
}
