//! Commits off the MM's loop: a thread that owns the journal's store and writes each batch the
//! loop hands it, so that the loop's timeslices do not wait for the disk (an fsync takes
//! milliseconds).
//!
//! Batches are numbered in the order they are handed over. Batches that queue up while a write
//! is under way are written together in one transaction (a group commit); each change is a
//! whole record, so applying them in order is the same as applying them one by one. The
//! thread says which batch it has *settled*: written, or tried and failed. A failed batch's
//! changes are kept and written with the next one (or tried again after [`RETRY`] if none
//! comes), as the in-place journal keeps them staged.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use storm_cluster::messages::JobId;

use super::{Change, JournalStore, ProgramStore, Settled};

/// How long failed changes wait before they are tried again when no new batch comes.
const RETRY: Duration = Duration::from_millis(500);

/// One batch of staged changes.
pub(super) struct Batch {
    pub number: u64,
    pub changes: Vec<Change>,
    pub next_job: Option<JobId>,
    /// Program copies to delete once the batch is written (their jobs ended).
    pub unneeded: Vec<JobId>,
}

pub(super) struct Committer {
    tx: Option<Sender<Batch>>,
    rx: Receiver<Settled>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub fn start(
        store: Box<dyn JournalStore>,
        programs: Option<ProgramStore>,
        settled: crate::Waker,
    ) -> std::io::Result<Self> {
        let (tx, batches) = mpsc::channel();
        let (done, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || commit_loop(store, programs, batches, done, settled))?;
        Ok(Self {
            tx: Some(tx),
            rx,
            thread: Some(thread),
        })
    }

    pub fn send(&self, batch: Batch) {
        // The thread ends only when this side closes the channel.
        if let Some(tx) = &self.tx {
            let _ = tx.send(batch);
        }
    }

    /// The writes settled since the last call, oldest first.
    pub fn settled(&self) -> Vec<Settled> {
        self.rx.try_iter().collect()
    }
}

impl Drop for Committer {
    /// Writes what was handed over before the MM goes.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn commit_loop(
    mut store: Box<dyn JournalStore>,
    programs: Option<ProgramStore>,
    batches: Receiver<Batch>,
    done: Sender<Settled>,
    wake: crate::Waker,
) {
    // Changes of failed writes, to go first in the next one.
    let mut failed: Option<Batch> = None;
    loop {
        let first = match batches.recv_timeout(if failed.is_some() {
            RETRY
        } else {
            Duration::from_secs(3600)
        }) {
            Ok(b) => Some(b),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // The MM is stopping: one last try for what failed.
                if let Some(b) = failed.take() {
                    let _ = store.write(&b.changes, b.next_job);
                }
                return;
            }
        };
        let mut batch = failed.take();
        for b in first.into_iter().chain(batches.try_iter()) {
            batch = Some(match batch {
                None => b,
                Some(mut acc) => {
                    acc.number = b.number;
                    acc.changes.extend(b.changes);
                    acc.next_job = b.next_job.or(acc.next_job);
                    acc.unneeded.extend(b.unneeded);
                    acc
                }
            });
        }
        let Some(batch) = batch else { continue };
        let started = Instant::now();
        let outcome = store.write(&batch.changes, batch.next_job);
        let took = started.elapsed();
        let number = batch.number;
        if outcome.is_ok() {
            super::remove_programs(programs.as_ref(), batch.unneeded.iter().copied());
        } else {
            failed = Some(batch);
        }
        if done
            .send(Settled {
                batch: number,
                outcome,
                took,
            })
            .is_err()
        {
            return;
        }
        wake.wake();
    }
}
