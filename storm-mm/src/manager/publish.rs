//! Write-ahead: what the MM tells anyone (replies, launches) goes out only once the journal
//! holds it; journal commits, their failures, and the records of finished jobs.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use storm_cluster::control::Reply;
use storm_cluster::messages::JobId;

use crate::env::{ClientId, MmEnv};
use crate::journal::{JobRecord, Journal, JournalError};
use crate::log_limit::LogLimit;

use super::requests::Client;
use super::{MachineManager, Phase, job_record};

/// Write-ahead in one place: the clients, the replies waiting for the journal, and the
/// journal with what must go into its next commit.
pub(super) struct Outbox {
    pub(super) clients: HashMap<ClientId, Client>,
    /// Submissions not yet answered (answered after the next scheduling decision).
    pub(super) unanswered: Vec<(ClientId, JobId)>,
    /// Replies to send, each with the journal commit it waits for (`None`: this
    /// timeslice's, not yet made).
    pub(super) replies: Vec<(ClientId, Reply, Option<u64>)>,
    /// Jobs, results and drains, kept so that a restarted MM loses nothing it accepted.
    pub(super) journal: Journal,
    /// Jobs whose journal record must be written with the next commit.
    pub(super) unrecorded: BTreeSet<JobId>,
    /// Jobs whose program copy is under way: not journaled yet, their submitters' replies
    /// held.
    pub(super) saving: BTreeSet<JobId>,
    /// Program copies beside the journal that ended, as their inputs came, not yet taken up.
    pub(super) saved_programs: Vec<(JobId, Result<(), JournalError>)>,
    /// Jobs whose nodes are to forget them, each with the journal commit that records its end
    /// (`None`: this timeslice's, not yet made). A node forgets a job only once the journal
    /// holds its end: an MM that took over (restarted, or the next leader of a group) from a
    /// journal that still says "running" finds the job's tasks' statuses at its nodes.
    pub(super) forgets: Vec<(JobId, Option<u64>)>,
    pub(super) journal_errors: LogLimit,
}

impl Outbox {
    /// Whether nothing waits to be answered, replied, recorded or forgotten.
    pub(super) fn is_idle(&self) -> bool {
        self.unanswered.is_empty()
            && self.replies.is_empty()
            && self.unrecorded.is_empty()
            && self.saving.is_empty()
            && self.saved_programs.is_empty()
            && self.forgets.is_empty()
            && !self.journal.dirty()
    }

    pub(super) fn new(journal: Journal) -> Self {
        Self {
            clients: HashMap::new(),
            unanswered: Vec::new(),
            replies: Vec::new(),
            journal,
            unrecorded: BTreeSet::new(),
            saving: BTreeSet::new(),
            saved_programs: Vec::new(),
            forgets: Vec::new(),
            journal_errors: LogLimit::new(Duration::from_secs(10)),
        }
    }
}

/// How long a job given nodes as it came goes without a copy of its program while the
/// program travels to its nodes: past this its copy is made after all, so that its submitter
/// hears of it (its replies wait for its record), `storm queue` lists it, and a restart of
/// the MM keeps it. A quarter of a second covers the launches where the copy costs most (12
/// MB to 8 nodes takes 160 ms on the 2-core test host); a longer transfer hides the copy,
/// made beside it, and a progress bar shows only after a second.
pub const COPY_WAITS_AT_MOST: Duration = Duration::from_millis(250);

/// Whether job `j`'s program copy beside the journal can wait, at `now`, the last scheduling
/// pass having begun at `last_tick`. The copy is needed only if a restarted MM could have to
/// run the job from its beginning; a job whose program reaches its nodes before its copy is
/// made is journaled with its launch, and nothing reads the copy. So the copy waits while
///
/// * the job has not been through a scheduling pass yet (it came after the last one began):
///   the next pass may give it nodes at once, and it waits at most a timeslice;
/// * or it was given nodes and its program is on its way to them (sent, or checked in
///   place), it cannot be requeued, it is no element of an array (an array is journaled as
///   one), and it came less than [`COPY_WAITS_AT_MOST`] ago.
///
/// Making the copy anyway costs every such launch the copy's write and sync: on a disk, a
/// journal commit behind 12 MB of it waited 14 ms, and the job's own exec behind it 12 ms.
/// A restart before the launch's record finds no record of the job, and its submitter, told
/// nothing yet, sends it again, as when the launch came before the copy.
fn copy_can_wait(
    j: &super::job::Job,
    last_tick: std::time::Instant,
    now: std::time::Instant,
) -> bool {
    if j.submitted > last_tick {
        return true;
    }
    let on_its_way = matches!(
        j.phase,
        Phase::Allocated | Phase::Checking { .. } | Phase::Sending { .. } | Phase::Verifying { .. }
    );
    on_its_way
        && !j.req.requeue
        && j.req.element.is_none()
        && now.saturating_duration_since(j.submitted) < COPY_WAITS_AT_MOST
}

impl<E: MmEnv> MachineManager<E> {
    /// Commits this timeslice's changes to the journal, then sends the replies that tell of
    /// them: a client never learns of a state a restarted MM would not know. A job whose
    /// program is being copied is journaled once the copy is complete, or with its launch if
    /// that comes first and it cannot be requeued (the copy is needed no more), and its
    /// submitter's replies wait for that.
    pub(super) fn publish(&mut self) {
        for (id, saved) in std::mem::take(&mut self.outbox.saved_programs) {
            self.outbox.saving.remove(&id);
            match (self.jobs.get_mut(&id), saved) {
                (Some(j), Ok(())) => {
                    j.program_saved = true;
                    // From now on the program is read from the copy.
                    if let Some(p) = j.program.take() {
                        self.let_go_of_program(p);
                    }
                }
                // Its launch was recorded before the copy was made, and it cannot be requeued:
                // nothing will read the copy.
                (Some(j), Err(e)) if !j.copy_needed() => {
                    tracing::debug!(job = id, "a copy no longer needed was not made: {e}");
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
                (None, _) => self.env.remove_saved_program(id),
            }
        }
        let unrecorded = std::mem::take(&mut self.outbox.unrecorded);
        let now = self.now();
        // Jobs whose copy waits (see [`copy_can_wait`]): they stay unrecorded, their
        // submitters' replies held and listings without them, as for a copy under way.
        let mut waiting_copy = BTreeSet::new();
        // A job that a restarted MM could have to run from its beginning needs its program
        // then: one that waits, one given nodes whose launch is not out yet, one that may be
        // requeued. Its copy is made first, and the job is recorded once it is complete.
        for &id in &unrecorded {
            let Some(j) = self.jobs.get_mut(&id) else {
                continue;
            };
            if self.outbox.saving.contains(&id)
                || j.program_saved
                || j.program_save_failed
                || !j.copy_needed()
            {
                continue;
            }
            if copy_can_wait(j, self.last_tick, now) {
                waiting_copy.insert(id);
                continue;
            }
            let Some(program) = j.program else {
                continue;
            };
            if self.env.save_program(id, program, j.size) {
                self.outbox.saving.insert(id);
            } else {
                j.program_save_failed = true;
                tracing::error!(
                    job = id,
                    "the job would not survive a restart of the MM: its program cannot be copied beside the journal"
                );
            }
        }
        // An array is accepted as one: none of its elements is recorded (so none launches,
        // and no listing names it) while the copy of any is under way.
        let arrays_copied = self.copying_arrays();
        let mut later = BTreeSet::new();
        let mut recording = Vec::new();
        for id in unrecorded {
            let Some(j) = self.jobs.get(&id) else {
                continue;
            };
            if (self.outbox.saving.contains(&id) && j.copy_needed())
                || waiting_copy.contains(&id)
                || j.req
                    .element
                    .is_some_and(|e| arrays_copied.contains(&e.array))
            {
                later.insert(id);
                continue;
            }
            // A job given nodes at once whose program reached them before its copy was made:
            // its first record is its launch's, after which nothing needs the copy. A
            // restart before that commit finds no record of it, and its submitter, told
            // nothing yet, sends it again. Its launch does not wait for the disk.
            self.outbox.saving.remove(&id);
            self.outbox.journal.put_job(job_record(j));
            if j.phase == (Phase::Recording { batch: None }) {
                recording.push(id);
            }
        }
        self.outbox.unrecorded = later;
        let batch = self.outbox.journal.commit().unwrap_or_else(|e| {
            self.journal_failed(e);
            // Replies and launches go all the same, as they did before commits were made
            // apart.
            self.outbox.journal.settled()
        });
        for handed in self.outbox.journal.take_handed() {
            self.env.persist(handed);
        }
        for id in recording {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.phase = Phase::Recording { batch: Some(batch) };
            }
        }
        for (_, waits_for) in &mut self.outbox.forgets {
            waits_for.get_or_insert(batch);
        }
        for settled in self.outbox.journal.settle() {
            match settled.outcome {
                Ok(()) => self.metrics.journal_committed(settled.took),
                // A failed write settles too: its replies go, the error is logged, and the
                // changes are tried again with the next commit.
                Err(e) => self.journal_failed(e),
            }
        }
        let settled = self.outbox.journal.settled();
        let (due, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.outbox.forgets)
            .into_iter()
            .partition(|(_, b)| b.is_some_and(|b| b <= settled));
        self.outbox.forgets = kept;
        self.hb.commands.extend(
            due.into_iter()
                .map(|(job, _)| storm_cluster::messages::Command::Forget { job }),
        );
        // Clients with a job whose program is still being copied: the job is not journaled
        // yet, so nothing may go to them.
        let copying: HashSet<ClientId> = self
            .outbox
            .saving
            .iter()
            .chain(&waiting_copy)
            .filter_map(|id| self.jobs.get(id)?.client)
            .collect();
        let mut held = copying.clone();
        let mut kept = Vec::new();
        for (client, mut r, waits_for) in self.outbox.replies.drain(..) {
            // A reply of this timeslice waits for this timeslice's commit, except output,
            // which the journal does not hold.
            let waits_for = waits_for.unwrap_or(match r {
                Reply::Output(_) => 0,
                _ => batch,
            });
            // A listing made this timeslice may name a job whose copy just began: it is not
            // accepted until its record is journaled.
            if let Reply::Queue(list) = &mut r {
                list.retain(|j| {
                    !self.outbox.saving.contains(&j.job)
                        && !waiting_copy.contains(&j.job)
                        && !j.element.is_some_and(|e| arrays_copied.contains(&e.array))
                });
            }
            // A client's replies keep their order: once one waits, the later ones wait too.
            if held.contains(&client) || waits_for > settled {
                held.insert(client);
                // Held for a copy, a reply waits, once the copy is done, for the commit of
                // the timeslice that ends it, which records the job: not for this one's.
                let waits_for = (!copying.contains(&client)).then_some(waits_for);
                kept.push((client, r, waits_for));
            } else if self.outbox.clients.contains_key(&client) {
                self.env.send(client, r);
            }
        }
        self.outbox.replies = kept;
    }

    /// The arrays (by id) one of whose elements' program copy is under way.
    fn copying_arrays(&self) -> HashSet<JobId> {
        self.outbox
            .saving
            .iter()
            .filter_map(|id| Some(self.jobs.get(id)?.req.element?.array))
            .collect()
    }

    /// A commit failed: what changed would not survive a restart of the MM until a later
    /// commit succeeds (the changes are tried again with it).
    pub(super) fn journal_failed(&mut self, e: crate::journal::JournalError) {
        if let Some(more) = self.outbox.journal_errors.allow(self.now()) {
            tracing::error!(
                suppressed = more,
                "cannot write the journal; what changed now would not survive a restart of the MM: {e}"
            );
        }
    }

    // ---------------------------------------------------------------- control requests

    /// Keeps a finished job for `storm history` and reattaching submitters, in memory and in
    /// the journal.
    pub(super) fn record_finished(&mut self, mut rec: JobRecord) {
        self.outbox.unrecorded.remove(&rec.id);
        // Nothing reads an ended job's environment again, and it would be most of its record.
        rec.req.env = Vec::new();
        let gone = self.finished.insert(rec.clone());
        // Recorded even if it goes at once (max_jobs): its removal, staged after, wins.
        self.outbox.journal.put_job(rec);
        for id in gone {
            self.outbox.journal.remove_job(id);
        }
    }

    /// Forgets the jobs that ended longer ago than the history keeps them.
    pub(super) fn expire_history(&mut self) {
        let (now, now_ms) = (self.now(), self.unix_ms());
        for gone in self.finished.expire(now, now_ms) {
            self.outbox.journal.remove_job(gone);
        }
    }
}
