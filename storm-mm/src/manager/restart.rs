//! Restarting from the journal, and submitters that reattach.
//!
//! A restarted MM reads the journal before it takes any request:
//!
//! * finished jobs keep their outcome (`storm history`, and `Finished` for a submitter that
//!   reattaches);
//! * queued jobs are queued again, in their order, with the program saved when they were
//!   queued;
//! * jobs that had nodes (their program was being sent, or they ran) cannot be followed: their
//!   NMs kill them when they register with the new MM. They end with a reason that says so,
//!   or, submitted with `--requeue`, go back to the queue.
//!
//! Restored queued jobs are held out of scheduling until every one of their submitters has
//! reattached (storm-submit reconnects by itself) or [`REATTACH_GRACE`] has passed, so that
//! no output is produced before anyone listens, and they start in their original order.

use std::time::{Duration, Instant};

use storm_cluster::control::{JobOutcome, Reply, Timing};
use storm_cluster::messages::JobId;

use super::{Job, MachineManager, NewJob, Phase};
use crate::journal::{self, JobRecord, JobState, Restored};
use crate::policy::JobAsk;

/// How long restored queued jobs wait for their submitters to reattach.
pub(super) const REATTACH_GRACE: Duration = Duration::from_secs(5);

impl MachineManager {
    /// Takes up what the journal held.
    pub(super) fn restore(&mut self, restored: Restored) {
        self.next_job = restored.next_job;
        for (n, rec) in restored.nodes {
            if (n as usize) < self.nodes.len() {
                self.nodes.get_mut(n).drain = rec.drain;
            }
        }
        let (mut queued, mut ended, mut requeued) = (0, 0, 0);
        for rec in restored.jobs {
            match &rec.state {
                JobState::Finished { .. } => {
                    self.finished.insert(rec.id, rec);
                }
                JobState::Queued => match self.readmit(&rec) {
                    Ok(()) => queued += 1,
                    Err(why) => {
                        self.end_restored(rec, why);
                        ended += 1;
                    }
                },
                JobState::Started { nodes } => {
                    let why = format!(
                        "the machine manager restarted while the job ran on nodes {nodes}; \
                         its processes were killed"
                    );
                    let again = if rec.req.requeue {
                        self.readmit(&rec)
                    } else {
                        Err(why.clone())
                    };
                    match again {
                        Ok(()) => {
                            tracing::warn!(job = rec.id, "requeued: {why}");
                            requeued += 1;
                        }
                        Err(e) => {
                            self.end_restored(rec, e);
                            ended += 1;
                        }
                    }
                }
            }
        }
        if queued + requeued > 0 {
            self.held = Some(Instant::now() + REATTACH_GRACE);
        }
        if queued + ended + requeued + self.finished.len() > 0 {
            tracing::info!(
                queued,
                requeued,
                ended,
                finished = self.finished.len(),
                next_job = self.next_job,
                "restored from the journal"
            );
        }
    }

    /// Puts a journaled job back in the queue (held; see [`MachineManager::release_held`]).
    fn readmit(&mut self, rec: &JobRecord) -> Result<(), String> {
        let plan = self
            .plan(&rec.req)
            .map_err(|e| format!("it no longer fits this cluster: {e}"))?;
        let program = if rec.req.bcast {
            Some(self.journal.program(rec.id).ok_or_else(|| {
                "the machine manager restarted and the copy of its program is missing".to_string()
            })?)
        } else {
            None
        };
        let age = Duration::from_millis(journal::now_ms().saturating_sub(rec.submitted_ms));
        let now = Instant::now();
        let mut job = Job::queued(NewJob {
            id: rec.id,
            uid: rec.uid,
            gid: rec.gid,
            req: rec.req.clone(),
            plan,
            program,
            client: None,
            submitted: now.checked_sub(age).unwrap_or(now),
            submitted_ms: rec.submitted_ms,
        });
        job.program_saved = job.program.is_some();
        self.jobs.insert(rec.id, job);
        self.unrecorded.insert(rec.id);
        Ok(())
    }

    /// Ends a journaled job that cannot go on.
    fn end_restored(&mut self, rec: JobRecord, reason: String) {
        tracing::warn!(job = rec.id, "{reason}");
        let nodes = match &rec.state {
            JobState::Started { nodes } => nodes.clone(),
            _ => Default::default(),
        };
        let total_us = journal::now_ms().saturating_sub(rec.submitted_ms) * 1000;
        let outcome = JobOutcome {
            job: rec.id,
            ranks: Vec::new(),
            reason: Some(reason),
            timing: Timing {
                total_us,
                ..Timing::default()
            },
        };
        self.record_finished(JobRecord {
            state: JobState::Finished {
                nodes,
                outcome,
                ended_ms: journal::now_ms(),
            },
            ..rec
        });
    }

    /// Restored jobs (and jobs submitted meanwhile) enter the queue, in their order, once all
    /// the restored jobs' submitters are back or the grace period is over.
    pub(super) fn release_held(&mut self) {
        let Some(until) = self.held else {
            return;
        };
        let waiting = self
            .jobs
            .values()
            .any(|j| j.phase == Phase::Queued && j.client.is_none());
        if waiting && Instant::now() < until {
            return;
        }
        self.held = None;
        let queued: Vec<JobAsk> = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Queued)
            .map(|j| JobAsk {
                job: j.id,
                nodes: j.plan.nodes,
                limit: j.limit,
            })
            .collect();
        for ask in queued {
            self.policy.submit(ask, self.epoch.elapsed());
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
                return self.reply(client, Reply::Error(format!("no job {job}")));
            }
            Some(o) if uid != 0 && uid != o => {
                return self.reply(
                    client,
                    Reply::Error(format!(
                        "job {job} belongs to uid {o}; only its owner or root may follow it"
                    )),
                );
            }
            Some(_) => {}
        }
        if let Some(rec) = self.finished.get(&job) {
            if let JobState::Finished { outcome, .. } = &rec.state {
                let outcome = outcome.clone();
                self.reply(client, Reply::Finished(outcome));
            }
            return;
        }
        let queued = self.wait_reason(job);
        let j = self.jobs.get_mut(&job).expect("owner found it");
        j.client = Some(client);
        let started = (j.phase != Phase::Queued).then(|| Reply::Started {
            job,
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
        tracing::info!(job, "submitter reattached");
    }
}
