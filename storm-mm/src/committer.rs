//! Commits off the MM's loop: a thread of the daemon's that owns the journal's store and
//! writes each batch the core hands over ([`crate::journal::Journal::hand_off`],
//! `MmEnv::persist`), so that the loop's timeslices do not wait for the disk (an fsync takes
//! milliseconds). Each outcome goes back to the core as `Input::Persisted`.
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

use crate::journal::{Batch, JournalStore, ProgramStore, Settled, remove_programs};

/// How long failed changes wait before they are tried again when no new batch comes.
const RETRY: Duration = Duration::from_millis(500);

/// The committing thread, fed batches in order.
pub(crate) struct Committer {
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
            remove_programs(programs.as_ref(), batch.unneeded.iter().copied());
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use storm_cluster::messages::JobId;

    use super::*;
    use crate::journal::tests::{finished, job};
    use crate::journal::{Change, JobState, Journal, JournalError, MemoryStore, Restored};

    /// A journal handed off to a committer, as the daemon runs it.
    fn background(store: Box<dyn JournalStore>) -> (Journal, Committer) {
        let (j, _) = Journal::with_store(store, None).unwrap();
        let (j, store) = j.hand_off();
        let c = Committer::start(store.unwrap(), None, crate::Waker::none()).unwrap();
        (j, c)
    }

    /// Hands the committer what the journal committed, and the journal what settled.
    fn pump(j: &mut Journal, c: &Committer) -> Vec<Settled> {
        for b in j.take_handed() {
            c.send(b);
        }
        for s in c.settled() {
            j.persisted(s);
        }
        j.settle()
    }

    /// A store that refuses its first `failures` writes, as a full or failing disk would.
    struct FailingStore {
        inner: MemoryStore,
        failures: std::sync::Arc<std::sync::atomic::AtomicU32>,
    }

    impl JournalStore for FailingStore {
        fn read(&mut self) -> Result<Restored, JournalError> {
            self.inner.read()
        }
        fn write(&mut self, changes: &[Change], next: Option<JobId>) -> Result<(), JournalError> {
            use std::sync::atomic::Ordering;
            if self
                .failures
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(JournalError::Store {
                    path: "failing".into(),
                    message: "no space left on device".into(),
                });
            }
            self.inner.write(changes, next)
        }
        fn replace(&mut self, state: &Restored, applied: u64) -> Result<(), JournalError> {
            self.inner.replace(state, applied)
        }
    }

    /// Waits (without a time limit of its own: the test harness has one) until every commit
    /// up to `batch` has settled, and returns how those settled.
    fn settle_until(j: &mut Journal, c: &Committer, batch: u64) -> Vec<Settled> {
        let mut all = Vec::new();
        while j.settled() < batch {
            all.extend(pump(j, c));
            std::thread::sleep(Duration::from_millis(1));
        }
        all
    }

    /// The daemon's commits run on a thread: a commit returns at once with its batch number,
    /// the batch settles later, and what settled is what the next MM reads.
    #[test]
    fn background_commits_settle_in_order_and_are_read_back() {
        let store = MemoryStore::default();
        let (mut j, c) = background(Box::new(store.clone()));
        assert_eq!(
            j.commit().unwrap(),
            0,
            "nothing staged: nothing to wait for"
        );
        j.put_job(job(1, JobState::Queued));
        j.set_next_job(2);
        assert_eq!(j.commit().unwrap(), 1);
        j.put_job(finished(1));
        assert_eq!(j.commit().unwrap(), 2);
        assert_eq!(
            j.commit().unwrap(),
            2,
            "a clean journal waits for the last batch"
        );
        let settled = settle_until(&mut j, &c, 2);
        assert!(settled.iter().all(|s| s.outcome.is_ok()), "{settled:?}");
        j.put_job(job(3, JobState::Queued));
        j.commit().unwrap();
        pump(&mut j, &c);
        // Dropped with a batch maybe still under way: it is written before the thread ends.
        drop(c);
        let (_, restored) = Journal::with_store(Box::new(store), None).unwrap();
        assert_eq!(restored.jobs, vec![finished(1), job(3, JobState::Queued)]);
        assert_eq!(restored.next_job, 4);
    }

    /// A failed background write settles (the MM answers and logs the error), and its
    /// changes are not lost: they go with the next batch, or on their own a little later.
    #[test]
    fn a_failed_background_write_is_tried_again() {
        let store = MemoryStore::default();
        let failures = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(1));
        let failing = FailingStore {
            inner: store.clone(),
            failures: failures.clone(),
        };
        let (mut j, c) = background(Box::new(failing));
        j.put_job(job(1, JobState::Queued));
        let first = j.commit().unwrap();
        let settled = settle_until(&mut j, &c, first);
        assert!(
            settled.iter().any(|s| s
                .outcome
                .as_ref()
                .is_err_and(|e| e.to_string().contains("no space"))),
            "the failure is reported: {settled:?}"
        );
        assert!(store.held().jobs.is_empty(), "the write failed");
        // With the next batch: both changes.
        j.put_job(job(2, JobState::Queued));
        let second = j.commit().unwrap();
        let settled = settle_until(&mut j, &c, second);
        assert!(settled.iter().all(|s| s.outcome.is_ok()), "{settled:?}");
        let ids: Vec<JobId> = store.held().jobs.iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![1, 2]);

        // On their own, when no batch follows.
        failures.store(1, std::sync::atomic::Ordering::Release);
        j.put_job(job(3, JobState::Queued));
        let third = j.commit().unwrap();
        settle_until(&mut j, &c, third);
        while store.held().jobs.len() < 3 {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(store.held().jobs[2], job(3, JobState::Queued));
    }
}
