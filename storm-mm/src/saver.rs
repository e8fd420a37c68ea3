//! Copies the programs of waiting jobs beside the journal, on a thread of its own: a copy of
//! a large program (up to `[limits] max_program_bytes`) takes seconds, and on the main loop it
//! would stop the heartbeat long enough for every node to leave it.
//!
//! A job whose copy is under way is not journaled yet and its submitter's replies are held
//! (see `manager::publish`): a submitter never hears of a job that a restarted MM would not
//! know, nor of one whose program it could not send.

use std::fs::File;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, unbounded};
use storm_cluster::messages::JobId;

use crate::journal::{JournalError, ProgramStore};

/// The copying thread, fed one program at a time, in the order asked. It starts with the
/// first copy asked for, so a manager that never copies (a journal in memory) has no thread.
pub(crate) struct Saver {
    store: Option<ProgramStore>,
    requests: Option<Sender<(JobId, File, u64)>>,
    results: Option<Receiver<(JobId, Result<(), JournalError>)>>,
    thread: Option<JoinHandle<()>>,
}

impl Saver {
    /// Copies into `store`; with none, every copy fails, saying so.
    pub(crate) fn new(store: Option<ProgramStore>) -> Self {
        Self {
            store,
            requests: None,
            results: None,
            thread: None,
        }
    }

    fn start(&mut self, store: ProgramStore) -> std::io::Result<()> {
        let (requests, todo) = unbounded::<(JobId, File, u64)>();
        let (done, results) = unbounded();
        let thread = std::thread::Builder::new()
            .name("program-saver".into())
            .spawn(move || {
                for (job, program, size) in todo {
                    let saved = store.save(job, &program, size);
                    // The user's descriptor closes here: the MM keeps none for a job whose
                    // copy is made.
                    drop(program);
                    if done.send((job, saved)).is_err() {
                        return;
                    }
                }
            })?;
        self.requests = Some(requests);
        self.results = Some(results);
        self.thread = Some(thread);
        Ok(())
    }

    /// Asks for a copy of the first `size` bytes of `program` (the size checked at
    /// submission) as job `job`'s; false if no copy can be made (this journal keeps no
    /// programs, or the thread cannot start).
    pub(crate) fn save(&mut self, job: JobId, program: File, size: u64) -> bool {
        if self.requests.is_none() {
            let Some(store) = self.store.clone() else {
                return false;
            };
            if let Err(e) = self.start(store) {
                tracing::error!("cannot start the thread that copies programs: {e}");
                return false;
            }
        }
        // The thread lives as long as `self`.
        self.requests
            .as_ref()
            .is_some_and(|tx| tx.send((job, program, size)).is_ok())
    }

    /// Copies finished since the last call, with their outcome.
    pub(crate) fn finished(&self) -> Vec<(JobId, Result<(), JournalError>)> {
        self.results
            .as_ref()
            .map(|r| r.try_iter().collect())
            .unwrap_or_default()
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        // Closing the request channel ends the thread after the copy in progress.
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
