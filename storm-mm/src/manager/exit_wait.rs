//! `--wait` (srun's `-W`, Flux's `exit-timeout`): a job whose ranks outlive the first of them
//! to end by the request's `exit_wait_s` ends, named after that rank.
//!
//! Two clocks count, so that no rank outlives the wait for long wherever it runs:
//!
//! * **On a node** the NM counts from its first local rank's end and stops the job's other
//!   local ranks when the wait runs out; its report then says so (`waited`) and raises the
//!   termination hint, and [`MachineManager::end_waited_jobs`] ends the job everywhere.
//! * **Across nodes** a node whose ranks all ended has written its report into the MM's
//!   memory without a word to the MM (only the job's reporter node raises the hint). The MM
//!   looks for such reports of its multi-node jobs at most every [`SCAN_EVERY`] (reads of its
//!   own memory, no traffic), and ends the job `exit_wait_s` after it first finds one.
//!
//! The job's exit code and reason are the first rank's, as for `--kill-on-bad-exit`
//! ([`Culprit`]): its own code if it failed, else 1; never the SIGTERM the others then got.
//! The clock is wall time, gang-scheduled or not. After an MM restart the cross-node count
//! starts again from the first report the new MM finds.

use std::time::{Duration, Instant};

use storm_cluster::messages::{JobId, NodeReport};
use storm_primitives::{NodeId, NodeSet};

use super::pmi::Culprit;
use super::{MachineManager, MmEnv, Phase};

/// How often the MM reads its multi-node `--wait` jobs' report areas for a node that ended.
pub(super) const SCAN_EVERY: Duration = Duration::from_millis(100);

/// The first end of a job's ranks the MM learned of: when it found it, and whose it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FirstEnd {
    pub(super) found: Instant,
    pub(super) node: NodeId,
    pub(super) rank: u32,
}

/// The rank a node's report names as its first to end (a node none of whose ranks started
/// names none: then its first failed rank, else its first).
fn first_rank(report: &NodeReport) -> Option<u32> {
    report.first_ended.or_else(|| report.telling_rank())
}

/// The reason beside the first rank's end.
fn message(wait_s: u32) -> String {
    format!(
        "it ended first, and the job's other ranks still ran {wait_s} s later (--wait {wait_s}; \
         --wait 0 lets them run on)"
    )
}

impl<E: MmEnv> MachineManager<E> {
    /// Running `--wait` jobs not being ended already, with their slot, nodes and wait.
    fn exit_wait_jobs(&self) -> Vec<(JobId, usize, NodeSet, u32, Option<FirstEnd>)> {
        self.jobs
            .values()
            .filter(|j| j.req.exit_wait_s > 0 && j.phase == Phase::Running)
            .filter(|j| j.cancel.is_none() && j.culprit.is_none())
            .filter_map(|j| {
                let slot = j.slot?;
                Some((j.id, slot, j.nodes.clone(), j.req.exit_wait_s, j.first_end))
            })
            .collect()
    }

    /// Ends every job a node of which stopped its ranks because they outlived `--wait`
    /// (its report says so; its NM raised the termination hint).
    pub(super) fn end_waited_jobs(&mut self) {
        for (id, slot, nodes, wait_s, _) in self.exit_wait_jobs() {
            let waited = |r: &NodeReport| r.waited.then(|| first_rank(r)).flatten();
            if let Some((node, rank)) = self.named_rank(id, slot, &nodes, waited) {
                self.end_for_wait(id, node, rank, wait_s);
            }
        }
    }

    /// Notes the first node found to have ended each multi-node `--wait` job's ranks there,
    /// and ends the jobs whose wait since has run out.
    pub(super) fn enforce_exit_waits(&mut self) {
        let now = self.now();
        let scan = now >= self.next_wait_scan;
        if scan {
            self.next_wait_scan = now + SCAN_EVERY;
        }
        for (id, slot, nodes, wait_s, first) in self.exit_wait_jobs() {
            // One node: its NM counts the wait itself.
            if nodes.len() < 2 {
                continue;
            }
            let first = match first {
                Some(f) => f,
                None if scan => {
                    let Some((node, rank)) = self.named_rank(id, slot, &nodes, first_rank) else {
                        continue;
                    };
                    let f = FirstEnd {
                        found: now,
                        node,
                        rank,
                    };
                    tracing::debug!(job = id, node, rank, wait_s, "a node's ranks ended");
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.first_end = Some(f);
                    }
                    f
                }
                None => continue,
            };
            let wait = Duration::from_secs(u64::from(wait_s));
            if now.saturating_duration_since(first.found) >= wait {
                self.end_for_wait(id, first.node, first.rank, wait_s);
            }
        }
    }

    fn end_for_wait(&mut self, id: JobId, node: NodeId, rank: u32, wait_s: u32) {
        tracing::info!(
            job = id,
            node,
            rank,
            wait_s,
            "ending the job: --wait ran out"
        );
        self.end_for_rank(
            id,
            Culprit {
                rank,
                node,
                code: None,
                message: message(wait_s),
            },
        );
    }
}
