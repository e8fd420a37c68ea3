//! Job dependencies (`--dependency`): a queued job whose request has one stays out of the
//! scheduling policy until it is met, and ends, with the reason, once it never can be.
//!
//! * At submission: every job the dependency names must be known (waiting, running, or in
//!   the history), and a dependency that already can never be met refuses the submission.
//! * Every timeslice in which some job ended, started or was submitted with a dependency,
//!   [`MachineManager::judge_dependencies`] judges the held jobs, in id order, until nothing
//!   changes (an ended job can settle a chain of others at once).
//! * A met dependency is dropped from the job's request, and the job's journal record is
//!   written again without it: a restarted MM does not judge it a second time against a
//!   history that may have forgotten the jobs it named.

use storm_cluster::dependency::{Dependency, Known, Verdict};
use storm_cluster::messages::JobId;

use crate::env::MmEnv;
use crate::journal::JobState;

use super::{Job, MachineManager, Phase};

impl<E: MmEnv> MachineManager<E> {
    /// What the MM knows of job `id`, for a dependency that names it.
    fn known(&self, id: JobId) -> Known {
        if let Some(j) = self.jobs.get(&id) {
            return if j.phase.started() || j.phase == Phase::Launching {
                Known::Started
            } else {
                Known::Waiting
            };
        }
        match self.finished.get(&id).map(|r| &r.state) {
            Some(JobState::Finished { outcome, .. }) => {
                let code = outcome.exit_code();
                let how = match (&outcome.reason, code) {
                    (_, 0) => "completed".to_string(),
                    (Some(reason), _) => format!("ended: {reason}"),
                    (None, code) => format!("failed with exit code {code}"),
                };
                Known::Ended { ok: code == 0, how }
            }
            _ => Known::Unknown,
        }
    }

    /// An earlier unfinished job of `j`'s user with `j`'s name (for `singleton`).
    fn earlier_namesake(&self, j: &Job) -> Option<JobId> {
        self.jobs
            .range(..j.id)
            .find(|(_, o)| o.uid == j.uid && o.req.name == j.req.name)
            .map(|(id, _)| *id)
    }

    /// Judges job `j`'s dependency now.
    fn judge(&self, j: &Job, dep: &Dependency) -> Verdict {
        let namesake = dep
            .has_singleton()
            .then(|| self.earlier_namesake(j))
            .flatten();
        dep.evaluate(|id| self.known(id), namesake)
    }

    /// Why queued job `j` waits for its dependency, if it does.
    pub(super) fn dependency_wait(&self, j: &Job) -> Option<String> {
        let dep = j.req.dependency.as_ref()?;
        Some(match self.judge(j, dep) {
            Verdict::Waiting(why) => format!("waiting for its dependency {why}"),
            // Judged at the next timeslice.
            Verdict::Met => format!("its dependency {dep} is met; it enters the queue"),
            Verdict::Never(why) => why,
        })
    }

    /// Checks a new job's dependency: every job it names must be known, and it must still
    /// be possible to meet. `j` is the job, not yet in the table.
    pub(super) fn check_dependency(&self, j: &Job) -> Result<(), String> {
        let Some(dep) = &j.req.dependency else {
            return Ok(());
        };
        for id in dep.jobs() {
            if self.known(id) == Known::Unknown {
                return Err(if id >= self.next_job {
                    format!("--dependency names job {id}, which does not exist yet")
                } else {
                    format!(
                        "--dependency names job {id}, which is neither waiting, running nor \
                         in the history (the last {} ended jobs)",
                        crate::journal::KEEP_FINISHED
                    )
                });
            }
        }
        match self.judge(j, dep) {
            Verdict::Never(why) => Err(why),
            Verdict::Met | Verdict::Waiting(_) => Ok(()),
        }
    }

    /// Lets held jobs whose dependency is met into the queue, and ends those whose dependency
    /// never can be; repeats while that changes anything. Waits, like the queue itself, while
    /// jobs restored after a restart are held.
    pub(super) fn judge_dependencies(&mut self) {
        if !std::mem::take(&mut self.dependencies_changed) || self.reattach.held.is_some() {
            return;
        }
        loop {
            let mut changed = false;
            let held: Vec<JobId> = self
                .jobs
                .values()
                .filter(|j| j.phase == Phase::Queued && j.cancel.is_none())
                .filter(|j| j.req.dependency.is_some())
                .map(|j| j.id)
                .collect();
            for id in held {
                let Some(j) = self.jobs.get(&id) else {
                    continue;
                };
                let dep = j.req.dependency.as_ref().expect("filtered");
                match self.judge(j, dep) {
                    Verdict::Waiting(_) => {}
                    Verdict::Met => {
                        tracing::info!(job = id, dependency = %dep, "dependency met: queued");
                        let j = self.jobs.get_mut(&id).expect("listed");
                        j.req.dependency = None;
                        // Recorded again without it: met once is met for good.
                        self.outbox.unrecorded.insert(id);
                        let ask = self.ask(&self.jobs[&id]);
                        self.policy.submit(ask, self.since_epoch());
                        changed = true;
                    }
                    Verdict::Never(why) => {
                        self.fail(id, why);
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
    }
}
