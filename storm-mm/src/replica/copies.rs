//! Program copies too large for the log ([`super::program`]): a replica that applies the note
//! of one fetches it beside the log, one [`Chunk`] per request, from the leader (or, once it
//! leads itself, from the other replicas in turn); whichever replica holds the copy answers
//! from its file. A part asked for but not answered within an election timeout is asked for
//! again; fetching stops once the copy is whole or its job has ended. A replica that starts
//! fetches every copy its journal's jobs should have and it lacks (it restarted in the middle
//! of a fetch, or the note is behind its journal's applied entry).

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use storm_cluster::messages::JobId;

use crate::journal::Restored;
use storm_primitives::NodeId;

use super::program::{Chunk, Far, WantCopy};
use super::resync::Wire;
use super::{Host, member};

/// A copy being fetched.
#[derive(Debug)]
pub(super) struct Fetching {
    /// The copy's size (`None`: learnt from the first part).
    total: Option<u64>,
    /// The offset of the next part to ask for.
    next: u64,
    /// When the part at `next` was asked for, and of which replica.
    asked: Option<(Instant, usize)>,
    /// Requests made, to turn to another replica while this one leads.
    requests: usize,
}

/// The copies a replica fetches, by job.
pub(super) type Fetches = BTreeMap<JobId, Fetching>;

impl Host {
    /// A note of a copy too large for the log was applied: fetch the copy unless this replica
    /// holds it (the leader that made it does).
    pub(super) fn note_far_copy(&mut self, far: Far) {
        let Some(store) = &self.programs else {
            return;
        };
        if store.open(far.job).is_some() || self.fetching.contains_key(&far.job) {
            return;
        }
        tracing::info!(
            job = far.job,
            bytes = far.total,
            "fetching job {}'s program copy ({} MiB, too large for the log) from the leader",
            far.job,
            far.total >> 20
        );
        self.fetching.insert(
            far.job,
            Fetching {
                total: Some(far.total),
                next: 0,
                asked: None,
                requests: 0,
            },
        );
    }

    /// On start: every job in `state` that a leader may have to run from its beginning has a
    /// copy beside the leader's journal (such a job is recorded once its copy is complete);
    /// fetch those this replica lacks.
    pub(super) fn fetch_missing_copies(&mut self, state: &Restored) {
        let Some(store) = &self.programs else {
            return;
        };
        let missing: Vec<JobId> = state
            .jobs
            .iter()
            .filter(|rec| rec.needs_program_copy())
            .map(|rec| rec.id)
            .filter(|&job| store.open(job).is_none() && !self.fetching.contains_key(&job))
            .collect();
        if !missing.is_empty() {
            tracing::warn!(
                jobs = ?missing,
                "this replica lacks the program copies of {} jobs: it fetches them",
                missing.len()
            );
        }
        for job in missing {
            self.fetching.insert(
                job,
                Fetching {
                    total: None,
                    next: 0,
                    asked: None,
                    requests: 0,
                },
            );
        }
    }

    /// Job `job` ended (or left the journal): its copy is needed no more, and the part of it
    /// written aside, if any, is deleted.
    pub(super) fn forget_far_copy(&mut self, job: JobId) {
        if self.fetching.remove(&job).is_some()
            && let Some(store) = &self.programs
        {
            self.receiving.abandon(store, job);
        }
    }

    /// Asks for the next part of each copy being fetched, and again for one whose answer is
    /// overdue: of the leader, or of each other replica in turn while this one leads.
    pub(super) fn fetch_copies(&mut self) {
        if self.fetching.is_empty() {
            return;
        }
        let leader = member::position_of(self.node.raft.leader_id);
        let others: Vec<usize> = (0..self.replicas).filter(|&p| p != self.me).collect();
        let mut asks = Vec::new();
        for (&job, f) in self.fetching.iter_mut() {
            if f.asked
                .is_some_and(|(at, _)| at.elapsed() < self.election_timeout)
            {
                continue;
            }
            let to = match leader {
                Some(l) if l != self.me => l,
                _ if others.is_empty() => continue,
                _ => others[f.requests % others.len()],
            };
            f.requests += 1;
            f.asked = Some((Instant::now(), to));
            asks.push((
                to,
                WantCopy {
                    job,
                    offset: f.next,
                },
            ));
        }
        for (to, want) in asks {
            self.outbox.send(
                &*self.fabric,
                &self.group,
                to as NodeId,
                &Wire::want_copy(&want),
            );
        }
    }

    /// Replica `to` asks for a part of a copy: the part, read from this replica's file, or an
    /// empty chunk if it holds no whole copy.
    pub(super) fn offer_copy(&mut self, to: usize, want: WantCopy) {
        let chunk = self.read_copy(want).unwrap_or(Chunk {
            job: want.job,
            offset: 0,
            total: 0,
            bytes: Vec::new(),
        });
        self.outbox.send(
            &*self.fabric,
            &self.group,
            to as NodeId,
            &Wire::copy_part(&chunk),
        );
    }

    fn read_copy(&self, want: WantCopy) -> Option<Chunk> {
        let file = self.programs.as_ref()?.open(want.job)?;
        let total = file.metadata().ok()?.len();
        if want.offset >= total {
            return None;
        }
        let len = (total - want.offset).min(self.part_bytes() as u64) as usize;
        let mut bytes = vec![0; len];
        file.read_exact_at(&mut bytes, want.offset).ok()?;
        Some(Chunk {
            job: want.job,
            offset: want.offset,
            total,
            bytes,
        })
    }

    /// A part of a copy, from replica `from`: written aside if it is the one awaited (the copy
    /// is renamed into place with its last part), and the next asked for at once.
    pub(super) fn take_copy_part(&mut self, from: usize, chunk: Chunk) {
        let Some(store) = self.programs.clone() else {
            return;
        };
        let job = chunk.job;
        let Some(f) = self.fetching.get_mut(&job) else {
            return;
        };
        if f.asked.is_none_or(|(_, to)| to != from) {
            return;
        }
        if chunk.total == 0 {
            // That replica holds no copy (yet): asked again, of the leader of the moment,
            // once the answer counts as overdue.
            return;
        }
        if chunk.offset != f.next || f.total.is_some_and(|t| t != chunk.total) {
            tracing::debug!(
                job,
                "a part of a program copy that was not awaited: dropped"
            );
            return;
        }
        let (last, len, chunk_total) = (chunk.is_last(), chunk.bytes.len() as u64, chunk.total);
        match self.receiving.take(&store, chunk) {
            Ok(()) if last => {
                self.fetching.remove(&job);
                tracing::info!(
                    job,
                    "took job {job}'s program copy from {}",
                    self.names[from]
                );
            }
            Ok(()) => {
                f.total = Some(chunk_total);
                f.next += len;
                f.asked = None;
            }
            Err(e) => {
                tracing::warn!(job, "job {job}'s program copy: {e}; fetching it again");
                f.next = 0;
                f.asked = None;
            }
        }
    }
}
