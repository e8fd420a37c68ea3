//! Copies the programs of waiting jobs beside the journal, on a thread of its own: a copy of
//! a large program (up to `[limits] max_program_bytes`) takes seconds, and on the main loop it
//! would stop the heartbeat long enough for every node to leave it.
//!
//! A job whose copy is under way is not journaled yet and its submitter's replies are held
//! (see `Manager::publish`): a submitter never hears of a job that a restarted MM would not
//! know, nor of one whose program it could not send.

use std::fs::File;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, unbounded};
use storm_cluster::messages::JobId;

use crate::journal::{JournalError, ProgramStore};

/// The copying thread, fed one program at a time, in the order asked.
pub(super) struct Saver {
    requests: Option<Sender<(JobId, File)>>,
    results: Receiver<(JobId, Result<(), JournalError>)>,
    thread: Option<JoinHandle<()>>,
}

impl Saver {
    pub(super) fn start(store: ProgramStore) -> Self {
        let (requests, todo) = unbounded::<(JobId, File)>();
        let (done, results) = unbounded();
        let thread = std::thread::Builder::new()
            .name("program-saver".into())
            .spawn(move || {
                for (job, program) in todo {
                    let saved = store.save(job, &program);
                    if done.send((job, saved)).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning the program saver");
        Self {
            requests: Some(requests),
            results,
            thread: Some(thread),
        }
    }

    /// Asks for a copy of `program` as job `job`'s.
    pub(super) fn save(&self, job: JobId, program: File) {
        if let Some(tx) = &self.requests {
            // The thread lives as long as `self`.
            let _ = tx.send((job, program));
        }
    }

    /// Copies finished since the last call, with their outcome.
    pub(super) fn finished(&self) -> Vec<(JobId, Result<(), JournalError>)> {
        self.results.try_iter().collect()
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
