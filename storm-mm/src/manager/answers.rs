//! What `storm queue`, `storm nodes` (and its history) and `storm metrics` are told: each
//! job's and node's state as clients see it, and why a queued job waits.

use storm_cluster::control::{self, JobInfo, JobState, NodeInfo};
use storm_cluster::messages::{JobId, JobUsage};
use storm_cluster::sample::{NodeInventory, NodeRecords, NodeSample, NodeTrace};
use storm_cluster::usage::NodeUsage;
use storm_primitives::{NodeId, NodeSet};

use crate::env::MmEnv;

use super::records::read_twice;
use super::{Job, MachineManager, Phase, restart};

/// Samples one history answer holds at most (a point is about 20 bytes in a reply frame of
/// 16 MiB).
const MAX_HISTORY_POINTS: usize = 500_000;

impl<E: MmEnv> MachineManager<E> {
    /// Why a queued job cannot start right now, if it cannot.
    pub(super) fn wait_reason(&self, job: JobId) -> Option<String> {
        if let Some(j) = self.jobs.get(&job) {
            if let Some(f) = &j.flocked {
                return Some(match f.remote {
                    Some(r) => format!("flocked to peer cluster {}, where it is job {r}", f.peer),
                    None => format!("flocked to peer cluster {}", f.peer),
                });
            }
            if !j.req.flock.may_run_at_home(&self.cfg.cluster.name) {
                return Some(format!(
                    "waiting for one of the clusters it may run on ({}) to offer room",
                    match &j.req.flock {
                        storm_cluster::flock::Flock::Only(names) => names.join(","),
                        _ => String::new(),
                    }
                ));
            }
        }
        if self.reattach.held.is_some() {
            return Some(format!(
                "held after a restart of the machine manager until the submitters of the queued \
                 jobs reattach (at most {} s)",
                restart::REATTACH_GRACE.as_secs()
            ));
        }
        if let Some(why) = self
            .jobs
            .get(&job)
            .and_then(|j| self.dependency_wait(j).or_else(|| self.throttle_wait(j)))
        {
            return Some(why);
        }
        let want = self.jobs.get(&job).map_or(0, |j| j.plan.nodes);
        let available = self.nodes.available_count();
        if want > available {
            return Some(format!(
                "waiting for {want} nodes: {available} of {} are up and not drained ({} up)",
                self.nodes.len(),
                self.nodes.up_count()
            ));
        }
        if self.slots.iter().all(Option::is_some) {
            return Some(format!(
                "waiting: {} jobs already run (max_jobs)",
                self.slots.len()
            ));
        }
        self.policy.reason(job)
    }

    pub(super) fn job_info(&self, j: &Job) -> JobInfo {
        let state = match (&j.cancel, j.phase) {
            (Some(_), _) => JobState::Cancelling,
            (None, Phase::Queued) if j.flocked.as_ref().is_some_and(|f| f.started) => {
                JobState::Running
            }
            (None, Phase::Queued) => JobState::Queued,
            (None, Phase::Allocated) => JobState::Starting,
            (None, Phase::Checking { .. } | Phase::Sending { .. } | Phase::Verifying { .. }) => {
                JobState::Sending
            }
            (None, Phase::Recording { .. } | Phase::Launching) => JobState::Launching,
            (None, Phase::Recovering) => JobState::Recovering,
            (None, Phase::Running) if j.terminating => JobState::Ending,
            // Gang scheduling: placed, but not in this timeslice's slot.
            (None, Phase::Running) if self.gang && !self.run_set.contains(&j.id) => {
                JobState::Suspended
            }
            (None, Phase::Running) => JobState::Running,
        };
        JobInfo {
            job: j.id,
            name: j.req.name.clone(),
            uid: j.uid,
            state,
            nodes: j.nodes.clone(),
            cpus: j.cpus.clone(),
            ntasks: j.plan.ntasks,
            elapsed_ms: self
                .now()
                .saturating_duration_since(j.submitted)
                .as_millis() as u64,
            reason: (j.phase == Phase::Queued && !j.flocked.as_ref().is_some_and(|f| f.started))
                .then(|| self.wait_reason(j.id))
                .flatten(),
            time_slot: (self.gang && j.phase != Phase::Queued).then_some(j.time_slot as u32),
            exit_code: None,
            usage: JobUsage::default(),
            element: j.req.element,
            submitted_ms: j.submitted_ms,
            started_ms: j.launched_ms,
            ended_ms: None,
            runs_on: j.flocked.as_ref().map(|f| f.peer.clone()),
            from_cluster: j.req.flock.flocked_from().map(str::to_string),
        }
    }

    pub(super) fn node_infos(&self) -> Vec<NodeInfo> {
        let now_ms = self.unix_ms();
        self.cfg
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = i as NodeId;
                let jobs: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.nodes.contains(id))
                    .map(|j| j.id)
                    .collect();
                let (state, mut reason) = self.nodes.describe(id, !jobs.is_empty());
                if let Some(g) = &n.guest_of {
                    // A guest slot says whose node it stands for, lent here or not.
                    let whose = match state {
                        control::NodeState::Idle | control::NodeState::Allocated => {
                            format!("borrowed from cluster {} (its {})", g.cluster, g.node)
                        }
                        _ => format!(
                            "guest slot for node {} of cluster {}, not lent here now",
                            g.node, g.cluster
                        ),
                    };
                    reason = Some(match reason {
                        Some(r) => format!("{whose}; {r}"),
                        None => whose,
                    });
                }
                NodeInfo {
                    id,
                    name: n.name.clone(),
                    state,
                    jobs,
                    reason,
                    records: Some(self.node_records(i, now_ms)),
                }
            })
            .collect()
    }

    /// The history of each node of `names` (all if none) over the last `window_ms`, or why
    /// not: a name that is no node, no history kept, or more points than a reply holds.
    pub(super) fn node_traces(
        &self,
        names: &[String],
        window_ms: u64,
    ) -> Result<Vec<NodeTrace>, String> {
        if self.node_history.capacity() == 0 {
            return Err("this cluster keeps no node history ([monitoring] history_s = 0)".into());
        }
        let nodes: Vec<usize> = if names.is_empty() {
            (0..self.cfg.nodes.len()).collect()
        } else {
            names
                .iter()
                .map(|name| {
                    self.cfg
                        .node_by_name(name)
                        .map(|n| n as usize)
                        .ok_or_else(|| {
                            format!("no node {name:?} in cluster {:?}", self.cfg.cluster.name)
                        })
                })
                .collect::<Result<_, _>>()?
        };
        let since = self.unix_ms().saturating_sub(window_ms);
        let points: usize = nodes
            .iter()
            .map(|&n| self.node_history.count_since(n, since))
            .sum();
        if points > MAX_HISTORY_POINTS {
            return Err(format!(
                "the history asked for is {points} samples, more than one answer holds \
                 ({MAX_HISTORY_POINTS}): name fewer nodes (--node) or ask for a shorter window"
            ));
        }
        Ok(nodes
            .into_iter()
            .map(|n| {
                let (points, mem_total) = self.node_history.since(n, since);
                NodeTrace {
                    name: self.cfg.nodes[n].name.clone(),
                    mem_total,
                    points,
                }
            })
            .collect())
    }

    /// Node `node`'s sample, usage and inventory as its NM last put them into this MM's memory
    /// (`storm_cluster::sample`), judged fresh or stale at `now_ms`. A record caught while
    /// the next one lands is read again once.
    pub(super) fn node_records(&self, node: usize, now_ms: u64) -> NodeRecords {
        let sample = || {
            self.read_record(self.rm.sample_offset(node))
                .and_then(|b| NodeSample::decode(&b))
        };
        let inventory = || {
            self.read_record(self.rm.inventory_record_offset(node))
                .and_then(|b| NodeInventory::decode(&b))
        };
        let usage = || {
            self.read_usage(self.rm.usage_record_offset(node))
                .and_then(|b| NodeUsage::decode(&b))
        };
        NodeRecords::judge(
            read_twice(sample),
            read_twice(usage),
            read_twice(inventory),
            now_ms,
            self.cfg.monitoring.sample_ms,
        )
    }

    /// The metrics, with the node and job gauges set from the state now.
    pub(super) fn metrics_text(&self) -> String {
        let busy = self
            .jobs
            .values()
            .fold(NodeSet::new(), |all, j| all.union(&j.nodes));
        let node_states =
            (0..self.cfg.node_count()).map(|n| self.nodes.describe(n, busy.contains(n)).0);
        let job_states = self.jobs.values().map(|j| self.job_info(j).state);
        let queued = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Queued)
            .count();
        self.metrics.encode(node_states, job_states, queued)
    }
}
