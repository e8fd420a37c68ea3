//! Scheduling policies as pure state machines.
//!
//! A policy is fed jobs, their ends and the time, and answers with decisions; it does no I/O,
//! so it is tested deterministically, with thousands of simulated nodes and property tests of
//! its invariants. The MM applies the decisions at heartbeat boundaries:
//!
//! * [`Decision::Start`]: give a job these nodes (or these CPUs of one node), in this time
//!   slot of the Ousterhout matrix (always 0 for the space-sharing policies);
//! * [`Decision::Run`]: from this timeslice on, exactly these jobs run (gang scheduling); the
//!   others are stopped on their nodes. `rotates` says whether the next timeslice runs
//!   other jobs, so that this one must not outlast its slice on a node whose next heartbeat
//!   is late.
//!
//! The matrix's columns are CPUs: a job needs whole nodes or some CPUs of one node
//! ([`Need`]), which [`crate::alloc::Allocator`] hands out by buddy allocation within and
//! across nodes.
//!
//! Policies: [`Fcfs`] (first come, first served, buddy allocation), [`Easy`] (EASY
//! backfilling: later jobs may start early if they do not delay the first queued job's
//! reservation) and [`Gang`] (an Ousterhout matrix with MPL time slots, buddy allocation
//! within each slot, round-robin time slicing and alternative scheduling).

mod easy;
mod fcfs;
pub mod fit;
mod gang;

use std::time::Duration;

use storm_cluster::JobId;
pub use storm_cluster::config::PolicyKind;
use storm_primitives::NodeId;

pub use crate::alloc::{Need, Share};

pub use easy::Easy;
pub use fcfs::Fcfs;
pub use fit::NodeFit;
pub use gang::Gang;

/// A job as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobAsk {
    pub job: JobId,
    pub need: Need,
    /// Wall-clock limit (`--time`); the MM kills the job when it passes.
    pub limit: Option<Duration>,
    /// Bytes of memory it needs on each of its nodes (0: none counted).
    pub mem: u64,
    /// The features each of its nodes must have, one bit per feature ([`NodeFit`]).
    pub features: u64,
}

/// Where a running job is: its nodes (or CPUs of one node) and its row of the gang
/// scheduler's matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub share: Share,
    pub time_slot: usize,
}

/// What the MM must do at this timeslice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Start { job: JobId, placed: Placement },
    Run { jobs: Vec<JobId>, rotates: bool },
}

/// A scheduling policy.
pub trait Policy: Send {
    fn name(&self) -> &'static str;
    /// A new job joins the queue.
    fn submit(&mut self, ask: JobAsk, now: Duration);
    /// A job that had nodes but never started (a node failed during its program transfer or
    /// before its launch) goes back to the head of the queue.
    fn submit_front(&mut self, ask: JobAsk, now: Duration);
    /// A job that ran when the MM restarted takes back exactly its nodes (and, under gang
    /// scheduling, its time slot), having run for `ran` of its limit. False, changing nothing,
    /// if they are not free (the cluster file changed).
    fn adopt(&mut self, ask: JobAsk, placed: &Placement, ran: Duration, now: Duration) -> bool;
    /// A queued job leaves the queue (cancelled); false if it was not queued.
    fn withdraw(&mut self, job: JobId) -> bool;
    /// A started job ended; its nodes (or CPUs) are free again.
    fn ended(&mut self, job: JobId, now: Duration);
    /// The decisions for the timeslice that starts at `now`, starting at most `max_starts`
    /// jobs (the MM's own limits: free job areas).
    fn tick(&mut self, now: Duration, max_starts: usize) -> Vec<Decision>;
    /// Keeps `node` out of allocation (down, drained, not registered); a job holding it keeps
    /// it until the job ends.
    fn set_unavailable(&mut self, node: NodeId);
    /// Lets `node` be allocated again.
    fn set_available(&mut self, node: NodeId);
    /// Node `node` offers `bytes` of memory to jobs (declared, or detected when it joined).
    fn set_node_memory(&mut self, node: NodeId, bytes: u64);
    /// Why a queued job waits.
    fn reason(&self, job: JobId) -> Option<String>;
    /// Jobs waiting.
    fn queued(&self) -> usize;
}

/// Removes a queued job (cancelled before it started); false if it was not queued.
fn withdraw_from(queue: &mut std::collections::VecDeque<JobAsk>, job: JobId) -> bool {
    let before = queue.len();
    queue.retain(|a| a.job != job);
    before != queue.len()
}

/// Builds a policy for the nodes of `fit`, of `cpus` CPUs each.
pub fn build(
    kind: PolicyKind,
    fit: NodeFit,
    cpus: u32,
    mpl: usize,
    default_limit: Duration,
) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Fcfs => Box::new(Fcfs::with_fit(fit, cpus)),
        PolicyKind::Easy => Box::new(Easy::with_fit(fit, cpus, default_limit)),
        PolicyKind::Gang => Box::new(Gang::with_fit(fit, cpus, mpl.max(1))),
    }
}

/// A job of the policies' tests: it needs `need`, without a time limit.
#[cfg(test)]
fn ask(job: JobId, need: Need) -> JobAsk {
    JobAsk {
        job,
        need,
        limit: None,
        mem: 0,
        features: 0,
    }
}
