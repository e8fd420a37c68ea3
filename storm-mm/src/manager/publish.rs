//! Write-ahead: what the MM tells anyone (replies, launches) goes out only once the journal
//! holds it; journal commits, their failures, and the records of finished jobs.

use std::collections::{BTreeSet, HashSet};

use storm_cluster::control::Reply;

use crate::control_server::ClientId;
use crate::env::MmEnv;
use crate::journal::JobRecord;

use super::{MachineManager, Phase, job_record};

impl<E: MmEnv> MachineManager<E> {
    /// Commits this timeslice's changes to the journal, then sends the replies that tell of
    /// them: a client never learns of a state a restarted MM would not know. A job whose
    /// program is being copied is journaled once the copy is complete, and its submitter's
    /// replies wait for that.
    pub(super) fn publish(&mut self) {
        for (id, saved) in self.saver.finished() {
            self.saving.remove(&id);
            match (self.jobs.get_mut(&id), saved) {
                (Some(j), Ok(())) => {
                    j.program_saved = true;
                    // From now on the program is read from the copy.
                    j.program = None;
                }
                (Some(_), Err(e @ crate::journal::JournalError::ProgramChanged { .. })) => {
                    self.fail(id, e.to_string());
                }
                (Some(j), Err(e)) => {
                    j.program_save_failed = true;
                    tracing::error!(
                        job = id,
                        "the job would not survive a restart of the MM: {e}"
                    );
                }
                // It ended while its copy was made; nothing will need the copy.
                (None, _) => {
                    if let Some(store) = self.journal.program_store() {
                        store.remove(id);
                    }
                }
            }
        }
        let mut later = BTreeSet::new();
        let mut recording = Vec::new();
        for id in std::mem::take(&mut self.unrecorded) {
            let Some(j) = self.jobs.get_mut(&id) else {
                continue;
            };
            if self.saving.contains(&id) {
                later.insert(id);
                continue;
            }
            // A waiting job (or one that may be requeued) needs its program after a restart.
            if !j.program_saved
                && !j.program_save_failed
                && (j.phase == Phase::Queued || j.req.requeue)
                && let Some(program) = &j.program
            {
                let size = j.size;
                match program
                    .try_clone()
                    .map(|copy| self.saver.save(id, copy, size))
                {
                    Ok(true) => {
                        self.saving.insert(id);
                        later.insert(id);
                        continue;
                    }
                    Ok(false) => {
                        j.program_save_failed = true;
                        tracing::error!(
                            job = id,
                            "the job would not survive a restart of the MM: its program cannot be copied beside the journal"
                        );
                    }
                    Err(e) => {
                        j.program_save_failed = true;
                        tracing::error!(
                            job = id,
                            "the job would not survive a restart of the MM: cannot read its program: {e}"
                        );
                    }
                }
            }
            let rec = job_record(j);
            self.journal.put_job(rec);
            if j.phase == (Phase::Recording { batch: None }) {
                recording.push(id);
            }
        }
        self.unrecorded = later;
        let batch = self.journal.commit().unwrap_or_else(|e| {
            self.journal_failed(e);
            // Replies and launches go all the same, as they did before commits were made
            // apart.
            self.journal.settled()
        });
        for id in recording {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.phase = Phase::Recording { batch: Some(batch) };
            }
        }
        for settled in self.journal.settle() {
            match settled.outcome {
                Ok(()) => self.metrics.journal_committed(settled.took),
                // A failed write settles too: its replies go, the error is logged, and the
                // changes are tried again with the next commit.
                Err(e) => self.journal_failed(e),
            }
        }
        let settled = self.journal.settled();
        let mut held: HashSet<ClientId> = self
            .saving
            .iter()
            .filter_map(|id| self.jobs.get(id)?.client)
            .collect();
        let mut kept = Vec::new();
        for (client, mut r, waits_for) in self.outbox.drain(..) {
            // A reply of this timeslice waits for this timeslice's commit, except output,
            // which the journal does not hold.
            let waits_for = waits_for.unwrap_or(match r {
                Reply::Output(_) => 0,
                _ => batch,
            });
            // A listing made this timeslice may name a job whose copy just began: it is not
            // accepted until its record is journaled.
            if let Reply::Queue(list) = &mut r {
                list.retain(|j| !self.saving.contains(&j.job));
            }
            // A client's replies keep their order: once one waits, the later ones wait too.
            if held.contains(&client) || waits_for > settled {
                held.insert(client);
                kept.push((client, r, Some(waits_for)));
            } else if let Some(c) = self.clients.get(&client) {
                let _ = c.tx.send(r);
            }
        }
        self.outbox = kept;
    }

    /// A commit failed: what changed would not survive a restart of the MM until a later
    /// commit succeeds (the changes are tried again with it).
    pub(super) fn journal_failed(&mut self, e: crate::journal::JournalError) {
        if let Some(more) = self.journal_errors.allow(self.now()) {
            tracing::error!(
                suppressed = more,
                "cannot write the journal; what changed now would not survive a restart of the MM: {e}"
            );
        }
    }

    // ---------------------------------------------------------------- control requests

    /// Keeps a finished job for `storm history` and reattaching submitters, in memory and in
    /// the journal.
    pub(super) fn record_finished(&mut self, rec: JobRecord) {
        self.unrecorded.remove(&rec.id);
        self.finished.insert(rec.id, rec.clone());
        while self.finished.len() > crate::journal::KEEP_FINISHED {
            self.finished.pop_first();
        }
        self.journal.put_job(rec);
    }
}
