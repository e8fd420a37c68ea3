//! Steps: jobs that run inside a running job's allocation, as srun does inside sbatch or
//! salloc. `storm-submit` run within a job (a batch script, `storm alloc`'s shell, another
//! task) asks for a step of it (`JobRequest::step_of`).
//!
//! * A step is checked at submission: its allocation must be running and the submitter's
//!   (or the submitter root), and it may ask for at most the allocation's nodes. A step of a
//!   step is a step of the same allocation.
//! * It never enters the scheduling policy: at the next timeslice it is placed on the first
//!   nodes of its allocation (and the CPUs it holds there), in its time slot, as soon as a
//!   job area is free; under gang scheduling it runs exactly when its allocation does.
//! * It ends with its allocation: cancelling the allocation cancels its steps, and a step
//!   whose allocation is gone is cancelled at the next timeslice.

use storm_cluster::control::JobRequest;
use storm_cluster::messages::JobId;
use storm_cluster::tasks::TaskPlan;
use storm_primitives::NodeSet;

use crate::alloc::Share;
use crate::env::MmEnv;
use crate::policy::Placement;

use super::{MachineManager, Phase};

impl<E: MmEnv> MachineManager<E> {
    /// Checks a step's request from user `uid` (`root`: uid 0 with root's rights over the
    /// cluster, who may run steps in any allocation), and points it at its allocation (a
    /// step of a step is a step of the same allocation).
    pub(super) fn check_step(
        &self,
        uid: u32,
        root: bool,
        req: &mut JobRequest,
        plan: &TaskPlan,
    ) -> Result<(), String> {
        let Some(of) = req.step_of else {
            return Ok(());
        };
        let parent = self.jobs.get(&of).ok_or_else(|| {
            format!("job {of}, whose step this would be, is not running (it may have ended)")
        })?;
        let alloc_id = parent.req.step_of.unwrap_or(of);
        let alloc = self
            .jobs
            .get(&alloc_id)
            .ok_or_else(|| format!("job {alloc_id}, whose step this would be, has ended"))?;
        if !(root && uid == 0) && uid != alloc.uid {
            return Err(format!(
                "job {alloc_id} belongs to uid {}; only its owner may run steps in it",
                alloc.uid
            ));
        }
        if alloc.cancel.is_some() || alloc.terminating {
            return Err(format!("job {alloc_id} is ending; it takes no more steps"));
        }
        if alloc.phase == Phase::Queued {
            return Err(format!(
                "job {alloc_id} has not started; a step runs inside a running job"
            ));
        }
        if req.batch.is_some() {
            return Err("a step cannot be a batch job; run storm batch outside jobs".into());
        }
        if req.dependency.is_some() {
            return Err("a step takes no --dependency: it runs inside its job at once".into());
        }
        let have = alloc.plan.nodes;
        if plan.nodes > have {
            return Err(format!(
                "the step asks for {} nodes; its job {alloc_id} holds {have}",
                plan.nodes
            ));
        }
        req.step_of = Some(alloc_id);
        Ok(())
    }

    /// The steps there are (an index kept beside the job table: no walk over every job).
    fn steps_now(&self) -> impl Iterator<Item = &super::Job> + '_ {
        self.steps.iter().filter_map(|id| self.jobs.get(id))
    }

    /// Steps to place at this timeslice, with where: at most `free` of them (free job
    /// areas). A step whose allocation has not started yet waits.
    pub(super) fn steps_to_place(&self, free: usize) -> Vec<(JobId, Placement)> {
        self.steps_now()
            .filter(|j| j.phase == Phase::Queued && j.cancel.is_none())
            .filter_map(|j| {
                let alloc = self.jobs.get(&j.req.step_of?)?;
                let running = alloc.phase.started() || alloc.phase == Phase::Launching;
                if !running || alloc.cancel.is_some() {
                    return None;
                }
                let nodes: NodeSet = alloc.nodes.iter().take(j.plan.nodes as usize).collect();
                let cpus = (nodes.len() == 1).then(|| alloc.cpus.clone()).flatten();
                Some((
                    j.id,
                    Placement {
                        share: Share { nodes, cpus },
                        time_slot: alloc.time_slot,
                    },
                ))
            })
            .take(free)
            .collect()
    }

    /// `jobs` (the policy's run set of a timeslice) and the placed steps of each.
    pub(super) fn with_steps(&self, mut jobs: Vec<JobId>) -> Vec<JobId> {
        let steps: Vec<JobId> = self
            .steps_now()
            .filter(|j| j.phase != Phase::Queued)
            .filter(|j| j.req.step_of.is_some_and(|a| jobs.contains(&a)))
            .map(|j| j.id)
            .collect();
        jobs.extend(steps);
        jobs
    }

    /// The steps of allocation `id`.
    pub(super) fn steps_of(&self, id: JobId) -> Vec<JobId> {
        self.steps_now()
            .filter(|j| j.req.step_of == Some(id))
            .map(|j| j.id)
            .collect()
    }

    /// Cancels every step whose allocation ended or went back to the queue (requeued).
    pub(super) fn end_orphan_steps(&mut self) {
        let orphans: Vec<(JobId, JobId)> = self
            .steps_now()
            .filter(|j| j.cancel.is_none())
            .filter_map(|j| {
                let of = j.req.step_of?;
                let gone = self.jobs.get(&of).is_none_or(|a| a.phase == Phase::Queued);
                gone.then_some((j.id, of))
            })
            .collect();
        for (step, of) in orphans {
            self.cancel(step, format!("its job {of} ended"));
        }
    }
}
