//! The limits a submission must fit: its program's size, its name, arguments and environment,
//! its array, what waiting jobs' requests hold, and each user's queue (`[limits]` in the
//! cluster file). Each refusal names the setting that would let it through.

use std::path::Path;

use storm_cluster::control::JobRequest;

use crate::env::MmEnv;

use super::{MachineManager, Phase};

impl<E: MmEnv> MachineManager<E> {
    /// `[limits] max_program_bytes` and `max_spooled_bytes_per_user` for a program of
    /// `size` bytes that user `uid` sends with a new job.
    pub(super) fn check_program_limits(
        &self,
        uid: u32,
        program: &Path,
        size: u64,
    ) -> Result<(), String> {
        let l = &self.cfg.limits;
        if size > l.max_program_bytes {
            return Err(format!(
                "{} is {size} bytes, over the limit for a program sent with its job ([limits] \
                 max_program_bytes = {}); put it where every node can read it and submit with \
                 --no-bcast",
                program.display(),
                l.max_program_bytes
            ));
        }
        let held: u64 = self
            .jobs
            .values()
            .filter(|j| j.uid == uid && j.req.delivery.carries_program())
            .map(|j| j.size)
            .sum();
        if held + size > l.max_spooled_bytes_per_user {
            return Err(format!(
                "the machine manager already holds {held} bytes of programs for user {uid}'s \
                 unfinished jobs; {size} more would pass the limit ([limits] \
                 max_spooled_bytes_per_user = {}); wait for some jobs to finish",
                l.max_spooled_bytes_per_user
            ));
        }
        Ok(())
    }

    /// `[limits] max_job_name_bytes` and `max_argument_bytes` for a new job's request.
    pub(super) fn check_request_sizes(&self, req: &JobRequest) -> Result<(), String> {
        let l = &self.cfg.limits;
        if req.name.len() > l.max_job_name_bytes as usize {
            return Err(format!(
                "the job's name is {} bytes, over the limit ([limits] max_job_name_bytes = {}); \
                 give a shorter one with -J",
                req.name.len(),
                l.max_job_name_bytes
            ));
        }
        let args = argument_bytes(req);
        if args as u64 > l.max_argument_bytes {
            return Err(format!(
                "the job's arguments and environment are {args} bytes, over the cluster's limit \
                 of {} ([limits] max_argument_bytes in the cluster file raises it, up to the \
                 kernel's ARG_MAX on the nodes: `getconf ARG_MAX`); pass fewer variables with \
                 --export",
                l.max_argument_bytes
            ));
        }
        Ok(())
    }

    /// A job array's request (`--array`): a batch job within `[limits] max_array_size`; its
    /// indices, or `None` for a job that is not an array.
    pub(super) fn check_array(&self, req: &mut JobRequest) -> Result<Option<Vec<u32>>, String> {
        // Only the MM names elements.
        req.element = None;
        let Some(spec) = &req.array else {
            return Ok(None);
        };
        if req.batch.is_none() || req.step_of.is_some() {
            return Err("a job array is a batch job: use storm batch --array".into());
        }
        let limit = self.cfg.limits.max_array_size as usize;
        match spec.indices.len() {
            0 => Err("--array names no index".into()),
            n if n > limit => Err(format!(
                "--array asks for {n} elements, over the limit ([limits] max_array_size = \
                 {limit})"
            )),
            _ => Ok(Some(spec.indices.clone())),
        }
    }

    /// `[limits] max_held_request_bytes_per_user` for `count` new jobs of user `uid`, each
    /// with `req`'s arguments and environment.
    pub(super) fn check_held_request_bytes(
        &self,
        uid: u32,
        req: &JobRequest,
        count: usize,
    ) -> Result<(), String> {
        let limit = self.cfg.limits.max_held_request_bytes_per_user;
        let held: u64 = self
            .jobs
            .values()
            .filter(|j| j.uid == uid)
            .map(|j| argument_bytes(&j.req) as u64)
            .sum();
        let more = argument_bytes(req) as u64 * count as u64;
        if held + more > limit {
            return Err(format!(
                "the machine manager already holds {held} bytes of arguments and environment \
                 for user {uid}'s unfinished jobs; {more} more would pass the limit ([limits] \
                 max_held_request_bytes_per_user = {limit}); wait for some jobs to finish, or \
                 pass fewer variables (--export)"
            ));
        }
        Ok(())
    }

    /// `[limits] max_queued_jobs_per_user` for `count` new jobs of user `uid`.
    pub(super) fn check_queue_limit(&self, uid: u32, count: usize) -> Result<(), String> {
        let limit = self.cfg.limits.max_queued_jobs_per_user;
        let waiting = self
            .jobs
            .values()
            .filter(|j| j.uid == uid && j.phase == Phase::Queued)
            .count();
        if waiting + count > limit as usize {
            let more = if count > 1 {
                format!("; {count} more would pass it")
            } else {
                String::new()
            };
            return Err(format!(
                "user {uid} already has {waiting} jobs waiting to start, the limit ([limits] \
                 max_queued_jobs_per_user = {limit}){more}; wait for some to start, or cancel some"
            ));
        }
        Ok(())
    }
}

/// The bytes of a job's arguments and environment, as the kernel counts them against
/// `ARG_MAX` (each string with its terminating zero; `KEY=VALUE` for a variable).
pub(super) fn argument_bytes(req: &JobRequest) -> usize {
    req.args.iter().map(|a| a.len() + 1).sum::<usize>()
        + req
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>()
}
