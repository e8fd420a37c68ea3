//! When a queued job enters the scheduling policy's queue: at once, or once its dependency
//! (`--dependency`) is met, or once its array's throttle (`--array ...%N`) lets it, and for
//! jobs restored after a restart of the MM, once the hold for their submitters ends.
//! [`MachineManager::admit_job`] is the one door; a job that went through it is `admitted`.
//!
//! Dependencies:
//! * At submission: every job the dependency names must be known (waiting, running, or in
//!   the history), and a dependency that already can never be met refuses the submission. An
//!   array's id stands for every element of the array.
//! * Every timeslice in which some job ended, started or was submitted held,
//!   [`MachineManager::admit_waiting`] judges the held jobs, in id order, until nothing
//!   changes (an ended job can settle a chain of others at once).
//! * A met dependency is dropped from the job's request, and the job's journal record is
//!   written again without it: a restarted MM does not judge it a second time against a
//!   history that may have forgotten the jobs it named.
//!
//! Arrays: of an array with a throttle of N, at most N elements are admitted or running at
//! once; the next (lowest index first) is admitted when one ends.

use storm_cluster::control::{ArrayElement, JobRef};
use storm_cluster::dependency::{Dependency, Known, MAX_DEPENDENCY_JOBS, Term, Verdict};
use storm_cluster::messages::JobId;

use crate::env::MmEnv;
use crate::journal::JobState;

use super::{Job, MachineManager, Phase};
use crate::env::ProgramId;

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
        for named in dep.jobs() {
            // Every element was turned into its job's id on the way in (`expand_arrays`).
            let JobRef::Id(id) = named else {
                return Err(format!("--dependency names {named}, which is no job"));
            };
            if self.known(id) == Known::Unknown {
                return Err(if id >= self.next_job {
                    format!("--dependency names job {id}, which does not exist yet")
                } else {
                    format!(
                        "--dependency names job {id}, which is neither waiting, running nor \
                         in the history (ended jobs are kept {} days)",
                        self.cfg.history.keep_days
                    )
                });
            }
        }
        match self.judge(j, dep) {
            Verdict::Never(why) => Err(why),
            Verdict::Met | Verdict::Waiting(_) => Ok(()),
        }
    }

    /// The dependency `dep` with every array id it names replaced by the ids of all the
    /// array's elements (an array's elements have consecutive ids from the array's), and
    /// every element named by index (`12_3`) by that element's id.
    pub(super) fn expand_arrays(&self, dep: Dependency) -> Result<Dependency, String> {
        let element = |id: JobId| self.array_element_of(id);
        let mut terms = Vec::with_capacity(dep.terms.len());
        for t in dep.terms {
            let mut jobs = Vec::new();
            for named in t.jobs {
                match named {
                    JobRef::Id(id) => match element(id) {
                        Some(e) if e.array == id => {
                            jobs.extend((id..id + e.count as JobId).map(JobRef::Id));
                        }
                        _ => jobs.push(named),
                    },
                    JobRef::Element { array, index } => {
                        jobs.push(JobRef::Id(self.array_element(array, index)?));
                    }
                }
            }
            terms.push(Term {
                jobs,
                condition: t.condition,
            });
        }
        let dep = Dependency {
            terms,
            any: dep.any,
        };
        let named = dep.jobs().count();
        if named > MAX_DEPENDENCY_JOBS {
            return Err(format!(
                "--dependency names {named} jobs once arrays are counted by their elements, over \
                 the limit of {MAX_DEPENDENCY_JOBS}"
            ));
        }
        Ok(dep)
    }

    /// Which array job `id` is an element of, if it is one (waiting, running, or in the
    /// history).
    fn array_element_of(&self, id: JobId) -> Option<ArrayElement> {
        self.jobs
            .get(&id)
            .map(|j| &j.req)
            .or_else(|| self.finished.get(&id).map(|r| &r.req))
            .and_then(|r| r.element)
    }

    /// The id of element `index` of array job `array` (waiting, running, or in the
    /// history), or why there is none.
    pub(super) fn array_element(&self, array: JobId, index: u32) -> Result<JobId, String> {
        let element = |id: JobId| self.array_element_of(id).filter(|e| e.array == array);
        let Some(first) = element(array) else {
            return Err(format!(
                "job {array} is no array job that is waiting, running or in the history"
            ));
        };
        (array..array + JobId::from(first.count))
            .find(|&id| element(id).is_some_and(|e| e.index == index))
            .ok_or_else(|| {
                format!(
                    "array job {array} has no element {index} (it has {} elements)",
                    first.count
                )
            })
    }

    /// Why queued job `j` waits for its array's throttle, if it does.
    pub(super) fn throttle_wait(&self, j: &Job) -> Option<String> {
        let e = j.req.element?;
        let limit = e.throttle?;
        (!j.admitted && self.array_active(e.array, e.count) >= limit as usize).then(|| {
            format!(
                "waiting: array job {} runs at most {limit} of its elements at once (%{limit})",
                e.array
            )
        })
    }

    /// Elements of array `array` (of `count`) admitted, started or flocked, and not ended.
    fn array_active(&self, array: JobId, count: u32) -> usize {
        self.jobs
            .range(array..array + count as JobId)
            .filter(|(_, o)| o.admitted || o.phase != Phase::Queued || o.flocked.is_some())
            .count()
    }

    /// Puts queued job `id` in the scheduling policy's queue if nothing holds it: not a step,
    /// no dependency left, its array's throttle has room, no hold after a restart.
    pub(super) fn admit_job(&mut self, id: JobId) {
        let Some(j) = self.jobs.get(&id) else {
            return;
        };
        let held = j.admitted
            || j.phase != Phase::Queued
            || j.flocked.is_some()
            || !j.req.flock.may_run_at_home(&self.cfg.cluster.name)
            || j.cancel.is_some()
            || j.req.step_of.is_some()
            || j.req.dependency.is_some()
            || self.reattach.held.is_some();
        if held {
            return;
        }
        if let Some(e) = j.req.element
            && let Some(limit) = e.throttle
            && self.array_active(e.array, e.count) >= limit as usize
        {
            return;
        }
        let ask = self.ask(j);
        self.policy.submit(ask, self.since_epoch());
        self.jobs.get_mut(&id).expect("found").admitted = true;
        self.held.remove(&id);
    }

    /// Admits the held jobs that may go now: those whose dependency is met (ending those
    /// whose dependency never can be) and those their array's throttle now lets go; repeats
    /// while a job ends. Waits, like the queue itself, while jobs restored after a restart
    /// are held.
    pub(super) fn admit_waiting(&mut self) {
        if !std::mem::take(&mut self.queue_changed) || self.reattach.held.is_some() {
            return;
        }
        loop {
            let mut ended = false;
            let held: Vec<JobId> = self.held.iter().copied().collect();
            for id in held {
                let Some(j) = self.jobs.get(&id).filter(|j| j.cancel.is_none()) else {
                    continue;
                };
                if let Some(dep) = &j.req.dependency {
                    match self.judge(j, dep) {
                        Verdict::Waiting(_) => continue,
                        Verdict::Met => {
                            tracing::info!(job = id, dependency = %dep, "dependency met");
                            self.jobs.get_mut(&id).expect("listed").req.dependency = None;
                            // Recorded again without it: met once is met for good.
                            self.outbox.unrecorded.insert(id);
                        }
                        Verdict::Never(why) => {
                            self.fail(id, why);
                            ended = true;
                            continue;
                        }
                    }
                }
                self.admit_job(id);
            }
            if !ended {
                break;
            }
        }
    }

    /// `holders` jobs hold submitted program `p` (an array's elements share one).
    pub(super) fn hold_program(&mut self, p: ProgramId, holders: usize) {
        self.program_holders.insert(p, holders);
    }

    /// A job lets go of submitted program `p`; the environment lets go of it once no job
    /// holds it.
    pub(super) fn let_go_of_program(&mut self, p: ProgramId) {
        match self.program_holders.get_mut(&p) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.program_holders.remove(&p);
                self.env.release_program(p);
            }
        }
    }
}
