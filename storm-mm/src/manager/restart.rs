//! Restarting from the journal, re-adopting the jobs that ran, and submitters that reattach.
//!
//! A restarted MM reads the journal before it takes any request:
//!
//! * finished jobs keep their outcome (`storm history`, and `Finished` for a submitter that
//!   reattaches);
//! * queued jobs are queued again, in their order, with the program saved when they were
//!   queued; so are jobs that had nodes but whose launch had not gone out (no task of theirs
//!   can have started), from the copy saved before their first record (see `publish`; only a
//!   copy that failed, which was logged, leaves such a job to end here);
//! * jobs whose launch went out are *recovering*: they take back their nodes, job slot and
//!   time slot, and wait for their NMs, which kept their tasks running, to register again
//!   (the MM nudges every node at once). Each NM lists the jobs it holds. A job that all its
//!   nodes list runs on as if nothing had happened once they all take heartbeats: its NMs
//!   send again the output and the reports the old MM may not have passed on (an NM clears
//!   its termination flags before it acknowledges the welcome, so a job that ended meanwhile
//!   ends here only after its output came again). A node that comes back without it (its NM
//!   restarted too) ends it, or requeues it with `--requeue`, or, when none of its nodes had
//!   started it, requeues it at the head of the queue. Nodes that do not come back within
//!   `[failure] readopt_within_ms` end it with a reason that names them.
//!
//! Restored queued jobs are held out of scheduling until every one of their submitters has
//! reattached (storm-submit reconnects by itself) or [`REATTACH_GRACE`] has passed, so that
//! no output is produced before anyone listens, and they start in their original order. The
//! output of a recovering job is held, unreleased on its nodes, until its submitter reattaches
//! or the same grace has passed; a job nobody reattached to runs to its end (its output is
//! dropped; its outcome goes to `storm history`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use storm_cluster::control::{JobOutcome, Reply, Timing};
use storm_cluster::messages::{JobId, OutputChunk};
use storm_cluster::tasks::TaskPlan;
use storm_primitives::{NodeId, NodeSet};

use super::{Job, MachineManager, MmEnv, NewJob, Phase};
use crate::journal::{JobRecord, JobState, Restored};
use crate::nodes::NmProcess;
use crate::policy::{Placement, Share};

/// How long restored jobs wait for their submitters to reattach.
pub(super) const REATTACH_GRACE: Duration = Duration::from_secs(5);

/// What the nodes of a recovering job said so far.
#[derive(Debug, Clone)]
pub(super) struct Recovery {
    /// When the job ends if some of its nodes have not come back.
    pub until: Instant,
    /// Nodes that registered holding the job.
    pub held: NodeSet,
    /// Nodes that registered without it from another NM process than the one its launch
    /// went to: its tasks there may have run, and were lost.
    pub missing: NodeSet,
    /// Nodes that registered without it from the very NM process its launch went to: the
    /// launch never reached them.
    pub unlaunched: NodeSet,
}

/// What an MM restarted over its journal holds back for the submitters that reattach.
pub(super) struct Reattach {
    /// Jobs restored from the journal, held out of the queue until their submitters reattach
    /// or this instant passes.
    pub(super) held: Option<Instant>,
    /// Until when submitters of jobs restored after a restart may reattach.
    pub(super) until: Option<Instant>,
    /// Output held for restored jobs that ended before their submitters reattached: given
    /// to the submitter that reattaches, before the outcome (see `output`).
    pub(super) finished_output: HashMap<JobId, Vec<(NodeId, u64, OutputChunk)>>,
    /// Until when the nodes may still send again output of jobs that ended under the MM
    /// before this one (its end journaled while the output was on its way to the
    /// submitter): set when the journal held an ended job (see `output`).
    pub(super) resends_until: Option<Instant>,
    /// Submitters that followed such a job, told its outcome once its nodes joined this MM
    /// (see `output`).
    pub(super) parked: Vec<super::output::ParkedOutcome>,
    /// Which MM process this is (NMs send again what an earlier one held in its memory).
    pub(super) incarnation: u64,
}

impl Reattach {
    pub(super) fn new(incarnation: u64) -> Self {
        Self {
            held: None,
            until: None,
            finished_output: HashMap::new(),
            resends_until: None,
            parked: Vec::new(),
            incarnation,
        }
    }
}

/// Where a job the journal knows as started stood.
struct Started<'a> {
    nodes: &'a NodeSet,
    cpus: &'a Option<NodeSet>,
    slot: u32,
    time_slot: u32,
    launched_ms: u64,
    launched_to: &'a [(NodeId, NmProcess)],
    program_hash: Option<[u8; 32]>,
}

impl<E: MmEnv> MachineManager<E> {
    /// The size of job `id`'s program copy beside the journal, if there is one (the copy is
    /// opened again when it is sent: no descriptor is held while the job waits).
    fn saved_program(&self, id: JobId) -> Option<u64> {
        self.env.saved_program_len(id)
    }

    /// Takes up what the journal held.
    pub(super) fn restore(&mut self, restored: Restored) {
        self.next_job = restored.next_job;
        for (n, rec) in restored.nodes {
            if (n as usize) < self.nodes.len() {
                let node = self.nodes.get_mut(n);
                node.drain = rec.drain;
                node.lent = rec.lent;
            }
        }
        self.take_home_from_peers_not_lent_to();
        let (mut queued, mut ended, mut requeued, mut recovering) = (0, 0, 0, 0);
        let mut had_ended = false;
        for rec in restored.jobs {
            let outcome = match &rec.state {
                JobState::Finished { .. } => {
                    had_ended = true;
                    // Past the history's bounds (a smaller max_jobs since): forgotten.
                    for gone in self.finished.insert(rec) {
                        self.outbox.journal.remove_job(gone);
                    }
                    continue;
                }
                JobState::Queued => self.readmit(&rec).map(|()| &mut queued),
                // A peer runs it: it waits for the peer agent's news of it, or comes back
                // if that peer stays away (see `flock`).
                JobState::Flocked { peer, since_ms } => self.readmit(&rec).map(|()| {
                    self.held.remove(&rec.id);
                    if let Some(j) = self.jobs.get_mut(&rec.id) {
                        j.flocked = Some(super::flock::Flocked {
                            peer: peer.clone(),
                            since_ms: *since_ms,
                            remote: None,
                            started: false,
                            unread: Default::default(),
                            input: Vec::new(),
                        });
                    }
                    &mut queued
                }),
                JobState::Started {
                    nodes,
                    cpus,
                    slot,
                    time_slot,
                    launched_ms: Some(launched_ms),
                    launched_to,
                    program_hash,
                } => self
                    .recover(
                        &rec,
                        Started {
                            nodes,
                            cpus,
                            slot: *slot,
                            time_slot: *time_slot,
                            launched_ms: *launched_ms,
                            launched_to,
                            program_hash: *program_hash,
                        },
                    )
                    .map(|()| &mut recovering),
                JobState::Started {
                    nodes,
                    launched_ms: None,
                    ..
                } => {
                    let result = self.readmit(&rec).map_err(|e| {
                        format!(
                            "the machine manager restarted while the job was starting on nodes \
                             {nodes}, and {e}"
                        )
                    });
                    if result.is_ok() {
                        tracing::warn!(
                            job = rec.id,
                            "requeued: the machine manager restarted before its launch went out"
                        );
                    }
                    result.map(|()| &mut requeued)
                }
            };
            match outcome {
                Ok(count) => *count += 1,
                Err(why) => {
                    self.end_restored(rec, why);
                    ended += 1;
                }
            }
        }
        if queued + requeued > 0 {
            self.reattach.held = Some(self.now() + REATTACH_GRACE);
        }
        if queued + requeued + recovering > 0 {
            self.reattach.until = Some(self.now() + REATTACH_GRACE);
        }
        if had_ended {
            self.reattach.resends_until = Some(self.now() + REATTACH_GRACE);
        }
        if queued + ended + requeued + recovering + self.finished.len() > 0 {
            tracing::info!(
                queued,
                requeued,
                recovering,
                ended,
                finished = self.finished.len(),
                next_job = self.next_job,
                "restored from the journal"
            );
        }
    }

    /// Takes back a job whose launch went out before the restart: its nodes, job slot and time
    /// slot are its own again, and it waits for its nodes to say they still run it.
    fn recover(&mut self, rec: &JobRecord, at: Started) -> Result<(), String> {
        let lost = |why: String| {
            format!(
                "the machine manager restarted while the job ran on nodes {}, and {why}",
                at.nodes
            )
        };
        let plan = self
            .plan(&rec.req)
            .map_err(|e| lost(format!("it no longer fits this cluster: {e}")))?;
        let slot = at.slot as usize;
        if plan.nodes as usize != at.nodes.len()
            || at
                .nodes
                .last()
                .is_none_or(|n| n as usize >= self.nodes.len())
        {
            return Err(lost("the cluster file changed under it".into()));
        }
        if self.slots.get(slot).is_none_or(Option::is_some) {
            return Err(lost(format!(
                "its job area {slot} is no longer free (max_jobs changed?)"
            )));
        }
        let ran = Duration::from_millis(self.unix_ms().saturating_sub(at.launched_ms));
        let ask = super::job_ask(
            rec.id,
            &rec.req,
            &plan,
            self.cfg.capacity().cpus_per_node,
            self.feature_bits(&rec.req, plan.nodes),
        );
        let placed = Placement {
            share: Share {
                nodes: at.nodes.clone(),
                cpus: at.cpus.clone(),
            },
            time_slot: at.time_slot as usize,
        };
        // A step's nodes are its allocation's, which took them back before it.
        if rec.req.step_of.is_none() && !self.policy.adopt(ask, &placed, ran, self.since_epoch()) {
            return Err(lost(format!(
                "its nodes (time slot {}) are no longer free for it",
                at.time_slot
            )));
        }
        // With --requeue it may have to run again: it needs its program.
        let program = (rec.req.delivery.carries_program() && rec.req.requeue)
            .then(|| self.saved_program(rec.id))
            .flatten();
        let now = self.now();
        let mut job = restored_job(rec, plan, program, (now, self.unix_ms()));
        job.phase = Phase::Recovering;
        job.nodes = at.nodes.clone();
        job.cpus = at.cpus.clone();
        job.slot = Some(slot);
        job.time_slot = at.time_slot as usize;
        job.program_hash = at.program_hash;
        // Only a copied program has a hash in the record.
        job.in_place = at.program_hash.is_none();
        job.allocated = Some(now.checked_sub(ran).unwrap_or(now));
        job.ready = job.allocated;
        job.launched = job.allocated;
        job.launched_ms = Some(at.launched_ms);
        job.launched_to = at.launched_to.to_vec();
        job.recovery = Some(Recovery {
            until: now + Duration::from_millis(self.cfg.failure.readopt_within_ms),
            held: NodeSet::new(),
            missing: NodeSet::new(),
            unlaunched: NodeSet::new(),
        });
        self.slots[slot] = Some(rec.id);
        self.add_job(job);
        tracing::info!(job = rec.id, nodes = %at.nodes, "waiting for the nodes of a job that ran to register again");
        Ok(())
    }

    /// Recovering jobs whose nodes have all answered, or whose time is up, go on or end.
    pub(super) fn advance_recoveries(&mut self, now: Instant) {
        let recovering: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Recovering)
            .map(|j| j.id)
            .collect();
        let within = self.cfg.failure.readopt_within_ms;
        for id in recovering {
            let j = &self.jobs[&id];
            let Some(r) = j.recovery.clone() else {
                continue;
            };
            let answered = r.held.union(&r.missing).union(&r.unlaunched);
            if j.nodes.is_subset(&answered) {
                if r.missing.is_empty() {
                    // It goes on once its nodes take heartbeats: they acknowledged their
                    // welcome, so a node's termination flag no longer says the job ended
                    // there before the output the old MM lost has come again (the node
                    // cleared it), and a launch sent again reaches them (a node that has
                    // only registered would miss it, and the job would never end).
                    let members = self.hb.queue.dest();
                    if !j.nodes.iter().all(|n| members.contains(n)) {
                        continue;
                    }
                    if !r.unlaunched.is_empty() {
                        // None of its code ran there: the launch goes out again (a node that
                        // holds the job already ignores it).
                        tracing::info!(
                            job = id,
                            nodes = %r.unlaunched,
                            "launching again where the launch never arrived before the restart"
                        );
                        let spec = j.launch_spec(self.cfg.capacity().cpus_per_node);
                        self.launch_in_heartbeats(spec);
                    }
                    self.recovered(id);
                } else {
                    // Its launch went out, so its code may have run: the rule for a started
                    // job applies (it ends, or goes back to the queue with --requeue).
                    self.node_lost_job(
                        id,
                        format!(
                            "its processes on nodes {} were gone when the machine manager \
                             restarted (their node managers restarted too)",
                            r.missing
                        ),
                    );
                }
            } else if now >= r.until {
                let absent = j.nodes.difference(&answered);
                self.node_lost_job(
                    id,
                    format!(
                        "nodes {absent} did not come back within {} ms of the machine \
                         manager's restart",
                        within
                    ),
                );
            }
        }
    }

    /// Every node of a recovering job holds it: it runs on.
    fn recovered(&mut self, id: JobId) {
        let hint = self.rm.term_hint;
        let mem = self.prims.memory();
        let j = self.jobs.get_mut(&id).expect("recovering job");
        j.phase = Phase::Running;
        j.recovery = None;
        // Its reporter may have said already, to this MM, that it ended.
        if let Some(slot) = j.slot
            && mem.load(hint.at(slot)) == id
        {
            j.terminating = true;
        }
        tracing::info!(job = id, nodes = %j.nodes, "re-adopted a job that ran across the restart");
    }

    /// Once every restored job's submitter is back, or the grace has passed, output held for
    /// those that did not reattach is dropped (the jobs run on).
    pub(super) fn end_reattach_window(&mut self, now: Instant) {
        let Some(until) = self.reattach.until else {
            return;
        };
        let unattached: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.restored && j.client.is_none() && j.req.batch.is_none())
            .map(|j| j.id)
            .collect();
        if (!unattached.is_empty() || !self.reattach.finished_output.is_empty()) && now < until {
            return;
        }
        self.reattach.until = None;
        for id in self
            .reattach
            .finished_output
            .keys()
            .copied()
            .collect::<Vec<_>>()
        {
            self.drop_held_output(id);
        }
        for id in unattached {
            if self.jobs[&id].phase != Phase::Queued {
                tracing::warn!(
                    job = id,
                    "its submitter did not reattach within {} s; it runs on, its output \
                     dropped, its outcome kept for storm history",
                    REATTACH_GRACE.as_secs()
                );
            }
            self.drop_held_output(id);
        }
    }

    /// Puts a journaled job back in the queue (held; see [`MachineManager::release_held`]).
    fn readmit(&mut self, rec: &JobRecord) -> Result<(), String> {
        let plan = self
            .plan(&rec.req)
            .map_err(|e| format!("it no longer fits this cluster: {e}"))?;
        let program = if rec.req.delivery.carries_program() {
            Some(self.saved_program(rec.id).ok_or_else(|| {
                "the machine manager restarted and the copy of its program is missing".to_string()
            })?)
        } else {
            None
        };
        let at = (self.now(), self.unix_ms());
        self.add_job(restored_job(rec, plan, program, at));
        self.outbox.unrecorded.insert(rec.id);
        Ok(())
    }

    /// Ends a journaled job that cannot go on.
    fn end_restored(&mut self, rec: JobRecord, reason: String) {
        tracing::warn!(job = rec.id, "{reason}");
        let nodes = match &rec.state {
            JobState::Started { nodes, .. } => nodes.clone(),
            _ => Default::default(),
        };
        let total_us = self.unix_ms().saturating_sub(rec.submitted_ms) * 1000;
        let outcome = JobOutcome {
            job: rec.id,
            ranks: Vec::new(),
            reason: Some(reason),
            abort_code: None,
            timing: Timing {
                total_us,
                ..Timing::default()
            },
            usage: Default::default(),
            cause: None,
            broadcast: false,
        };
        self.record_finished(JobRecord {
            state: JobState::Finished {
                nodes,
                outcome,
                ended_ms: self.unix_ms(),
            },
            ..rec
        });
    }

    /// Restored jobs (and jobs submitted meanwhile) enter the queue, in their order, once all
    /// the restored jobs' submitters are back or the grace period is over.
    pub(super) fn release_held(&mut self) {
        let Some(until) = self.reattach.held else {
            return;
        };
        // Batch jobs have no submitter to wait for.
        let waiting = self
            .jobs
            .values()
            .any(|j| j.phase == Phase::Queued && j.client.is_none() && j.req.batch.is_none());
        if waiting && self.now() < until {
            return;
        }
        self.reattach.held = None;
        // In their order; those with a dependency or throttled enter once they may (looked
        // at in this timeslice).
        self.queue_changed = true;
        let queued: Vec<JobId> = self.held.iter().copied().collect();
        for id in queued {
            self.admit_job(id);
        }
    }

    /// `Attach`: the client follows job `job` from now on.
    pub(super) fn attach(&mut self, client: super::ClientId, uid: u32, job: JobId) {
        let owner = self
            .jobs
            .get(&job)
            .map(|j| j.uid)
            .or_else(|| self.finished.get(&job).map(|r| r.uid));
        match owner {
            None => {
                self.reply(client, Reply::Error(format!("no job {job}")));
                return;
            }
            Some(o) if uid != 0 && uid != o => {
                self.reply(
                    client,
                    Reply::Error(format!(
                        "job {job} belongs to uid {o}; only its owner or root may follow it"
                    )),
                );
                return;
            }
            Some(_) => {}
        }
        if let Some(rec) = self.finished.get(&job) {
            if let JobState::Finished { outcome, nodes, .. } = &rec.state {
                let (outcome, nodes) = (outcome.clone(), nodes.clone());
                // It ended while its submitter was away: first the output held for it, and
                // what its nodes may still send again.
                self.tell_outcome_after_output(client, job, nodes, outcome);
            }
            return;
        }
        let queued = self.wait_reason(job);
        let j = self.jobs.get_mut(&job).expect("owner found it");
        j.client = Some(client);
        let started = (j.phase != Phase::Queued).then(|| Reply::Started {
            job,
            ntasks: super::job::tasks_launched(&j.req, &j.plan),
            nodes: j.nodes.clone(),
            node_names: j
                .nodes
                .iter()
                .map(|n| self.cfg.nodes[n as usize].name.clone())
                .collect(),
            time_slot: self.gang.then_some(j.time_slot as u32),
        });
        let queued = if started.is_some() { None } else { queued };
        self.reply(client, Reply::Accepted { job, queued });
        if let Some(s) = started {
            self.reply(client, s);
        }
        self.send_held_output(job);
        tracing::info!(job, "submitter reattached");
    }
}

/// A job as its journal record describes it, queued, with no submitter attached yet; its
/// submission time is set back by the age the record gives it. `program` is the size of its
/// saved program, if it has one (read from the copy when it is sent).
fn restored_job(
    rec: &JobRecord,
    plan: TaskPlan,
    program: Option<u64>,
    (now, unix_ms): (Instant, u64),
) -> Job {
    let age = Duration::from_millis(unix_ms.saturating_sub(rec.submitted_ms));
    let mut job = Job::queued(NewJob {
        id: rec.id,
        uid: rec.uid,
        gid: rec.gid,
        req: rec.req.clone(),
        plan,
        program: None,
        size: program.unwrap_or(0),
        stamp: None,
        client: None,
        submitted: now.checked_sub(age).unwrap_or(now),
        submitted_ms: rec.submitted_ms,
    });
    job.program_saved = program.is_some();
    job.restored = true;
    job
}
