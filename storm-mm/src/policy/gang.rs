//! Gang scheduling over an Ousterhout matrix: `mpl` time slots by the cluster's CPUs.
//!
//! A job is placed, first fit in queue order, in the first slot whose allocator has room for
//! it (whole nodes, or CPUs of a node that small jobs of the slot share side by side). Every
//! timeslice the active slot moves to the next non-empty one, and exactly the jobs of that
//! slot run, on all their CPUs at once. CPUs that the active slot leaves idle may run another
//! slot's job if *all* of that job's CPUs are idle (alternative scheduling), so the job stays
//! coscheduled. With one non-empty slot nothing switches.
//!
//! Memory is counted across the slots ([`NodeFit`]): a job that asks for memory goes only to
//! nodes where it fits beside the jobs of *every* slot placed there, since a suspended job
//! keeps its memory. Timesharing never over-commits a node's memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use storm_cluster::JobId;
use storm_primitives::NodeId;

use super::{Decision, JobAsk, NodeFit, Placement, Policy, Share, withdraw_from};
use crate::alloc::{Allocator, Occupancy};

pub struct Gang {
    slots: Vec<Allocator>,
    /// Memory and features, one for all slots.
    fit: NodeFit,
    /// Jobs by slot, in placement order.
    matrix: Vec<BTreeMap<JobId, Share>>,
    placed: HashMap<JobId, usize>,
    queue: VecDeque<JobAsk>,
    active: usize,
}

impl Gang {
    pub fn new(nodes: u32, cpus: u32, mpl: usize) -> Self {
        Self::with_fit(NodeFit::new(nodes), cpus, mpl)
    }

    /// Over the nodes of `fit` (their memory and features), of `cpus` CPUs each.
    pub fn with_fit(fit: NodeFit, cpus: u32, mpl: usize) -> Self {
        let nodes = fit.len();
        Self {
            fit,
            slots: (0..mpl).map(|_| Allocator::new(nodes, cpus)).collect(),
            matrix: vec![BTreeMap::new(); mpl],
            placed: HashMap::new(),
            queue: VecDeque::new(),
            active: mpl - 1,
        }
    }

    /// The slot that ran last.
    pub fn active_slot(&self) -> usize {
        self.active
    }

    /// The jobs of the matrix, by slot.
    pub fn matrix(&self) -> &[BTreeMap<JobId, Share>] {
        &self.matrix
    }

    /// The non-empty slot after `slot`, round-robin (`slot` itself if it is the only one).
    fn next_slot(&self, slot: usize) -> Option<usize> {
        let mpl = self.matrix.len();
        (1..=mpl)
            .map(|k| (slot + k) % mpl)
            .find(|&s| !self.matrix[s].is_empty())
    }

    /// The jobs that run while `active` is the active slot: its own, and those of other slots
    /// whose CPUs it leaves idle (alternative scheduling).
    fn run_set(&self, active: usize) -> Vec<JobId> {
        let mpl = self.matrix.len();
        let mut run: Vec<JobId> = self.matrix[active].keys().copied().collect();
        let mut busy = Occupancy::default();
        for share in self.matrix[active].values() {
            busy.hold(share);
        }
        for k in 1..mpl {
            let s = (active + k) % mpl;
            for (job, share) in &self.matrix[s] {
                if busy.is_idle(share) {
                    busy.hold(share);
                    run.push(*job);
                }
            }
        }
        run.sort_unstable();
        run
    }
}

impl Policy for Gang {
    fn name(&self) -> &'static str {
        "gang"
    }

    fn submit(&mut self, ask: JobAsk, _now: Duration) {
        self.queue.push_back(ask);
    }

    fn submit_front(&mut self, ask: JobAsk, _now: Duration) {
        self.queue.push_front(ask);
    }

    fn adopt(&mut self, ask: JobAsk, placed: &Placement, _ran: Duration, _now: Duration) -> bool {
        let slot = placed.time_slot;
        if slot >= self.slots.len() || !self.slots[slot].take(&placed.share) {
            return false;
        }
        self.fit.hold(&ask, &placed.share.nodes);
        self.matrix[slot].insert(ask.job, placed.share.clone());
        self.placed.insert(ask.job, slot);
        true
    }

    fn withdraw(&mut self, job: JobId) -> bool {
        withdraw_from(&mut self.queue, job)
    }

    fn ended(&mut self, job: JobId, _now: Duration) {
        if let Some(slot) = self.placed.remove(&job)
            && let Some(share) = self.matrix[slot].remove(&job)
        {
            self.slots[slot].release(&share);
            self.fit.release(job);
        }
    }

    fn tick(&mut self, _now: Duration, max_starts: usize) -> Vec<Decision> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.queue.len() && out.len() < max_starts {
            let ask = self.queue[i];
            let avoid = self.fit.avoid(&ask);
            let placed = (0..self.slots.len()).find_map(|s| {
                self.slots[s]
                    .allocate_avoiding(ask.need, &avoid)
                    .map(|n| (s, n))
            });
            match placed {
                Some((slot, share)) => {
                    self.queue.remove(i);
                    self.fit.hold(&ask, &share.nodes);
                    self.matrix[slot].insert(ask.job, share.clone());
                    self.placed.insert(ask.job, slot);
                    out.push(Decision::Start {
                        job: ask.job,
                        placed: Placement {
                            share,
                            time_slot: slot,
                        },
                    });
                }
                None => i += 1,
            }
        }
        if let Some(next) = self.next_slot(self.active) {
            self.active = next;
        }
        let jobs = self.run_set(self.active);
        // Unless jobs end or start, the next timeslice runs this.
        let rotates = self
            .next_slot(self.active)
            .is_some_and(|next| self.run_set(next) != jobs);
        out.push(Decision::Run { jobs, rotates });
        out
    }

    fn set_unavailable(&mut self, node: NodeId) {
        for slot in &mut self.slots {
            slot.set_unavailable(node);
        }
    }

    fn set_available(&mut self, node: NodeId) {
        for slot in &mut self.slots {
            slot.set_available(node);
        }
    }

    fn set_node_memory(&mut self, node: NodeId, bytes: u64) {
        self.fit.set_memory(node, bytes);
    }

    fn reason(&self, job: JobId) -> Option<String> {
        let ask = self.queue.iter().find(|a| a.job == job)?;
        if let Some(room) = self.fit.reason(ask) {
            return Some(format!(
                "waiting for {} where its memory fits beside every time slot's jobs ({room})",
                ask.need.describe()
            ));
        }
        Some(format!(
            "waiting for {} in one of the {} time slots (most free in a slot: {} whole nodes, {} CPUs)",
            ask.need.describe(),
            self.slots.len(),
            self.slots
                .iter()
                .map(Allocator::free_nodes)
                .max()
                .unwrap_or(0),
            self.slots
                .iter()
                .map(Allocator::free_cpus)
                .max()
                .unwrap_or(0)
        ))
    }

    fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Need;
    use crate::policy::ask;
    use proptest::prelude::*;

    /// The run decision of a tick: its jobs, and whether the next timeslice runs others.
    fn run_decision(d: &[Decision]) -> (Vec<JobId>, bool) {
        d.iter()
            .find_map(|d| match d {
                Decision::Run { jobs, rotates } => Some((jobs.clone(), *rotates)),
                _ => None,
            })
            .unwrap()
    }

    fn run_of(d: &[Decision]) -> Vec<JobId> {
        run_decision(d).0
    }

    fn rotates(d: &[Decision]) -> bool {
        run_decision(d).1
    }

    /// A timeslice is leased (it must not outlast its slice on a late node) exactly when the
    /// next one runs other jobs.
    #[test]
    fn a_run_rotates_only_when_the_next_timeslice_runs_other_jobs() {
        let t = Duration::ZERO;
        let mut g = Gang::new(8, 1, 2);
        g.submit(ask(1, Need::Nodes(8)), t);
        assert!(
            !rotates(&g.tick(t, usize::MAX)),
            "one job alone never switches"
        );
        g.submit(ask(2, Need::Nodes(8)), t);
        assert!(rotates(&g.tick(t, usize::MAX)));
        assert!(rotates(&g.tick(t, usize::MAX)));
        // Two half-size jobs side by side in one slot.
        g.ended(1, t);
        g.ended(2, t);
        g.submit(ask(3, Need::Nodes(4)), t);
        g.submit(ask(4, Need::Nodes(4)), t);
        assert!(
            !rotates(&g.tick(t, usize::MAX)),
            "jobs side by side in one slot never switch"
        );
        // A full-size job needs the other slot: now every timeslice switches.
        g.submit(ask(5, Need::Nodes(8)), t);
        assert!(rotates(&g.tick(t, usize::MAX)));
    }

    #[test]
    fn two_full_size_jobs_alternate_and_a_new_one_starts_at_once() {
        let mut g = Gang::new(8, 1, 2);
        let t = Duration::ZERO;
        g.submit(ask(1, Need::Nodes(8)), t);
        g.submit(ask(2, Need::Nodes(8)), t);
        let d = g.tick(t, usize::MAX);
        assert_eq!(
            d.iter()
                .filter(|d| matches!(d, Decision::Start { .. }))
                .count(),
            2,
            "both start in the first timeslice"
        );
        let first = run_of(&d);
        let second = run_of(&g.tick(t, usize::MAX));
        assert_eq!(first.len(), 1);
        assert_ne!(first, second, "the slots alternate");
        assert_eq!(run_of(&g.tick(t, usize::MAX)), first);
        // A third job does not fit (both slots full); when job 1 ends, it takes its place.
        g.submit(ask(3, Need::Nodes(4)), t);
        assert!(
            g.tick(t, usize::MAX)
                .iter()
                .all(|d| !matches!(d, Decision::Start { .. }))
        );
        assert!(g.reason(3).unwrap().contains("2 time slots"));
        g.ended(1, t);
        assert!(
            g.tick(t, usize::MAX)
                .iter()
                .any(|d| matches!(d, Decision::Start { job: 3, .. }))
        );
    }

    #[test]
    fn idle_nodes_run_another_slots_job_that_fits_entirely() {
        let mut g = Gang::new(8, 1, 2);
        let t = Duration::ZERO;
        g.submit(ask(1, Need::Nodes(4)), t); // slot 0, nodes 0-3
        g.submit(ask(2, Need::Nodes(8)), t); // slot 1, all nodes
        g.tick(t, usize::MAX);
        g.submit(ask(3, Need::Nodes(4)), t); // slot 0, nodes 4-7
        g.tick(t, usize::MAX);
        // Whenever slot 0 is active it runs jobs 1 and 3; slot 1 runs job 2 alone.
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(run_of(&g.tick(t, usize::MAX)));
        }
        assert!(
            seen.contains(&vec![1, 3]) && seen.contains(&vec![2]),
            "{seen:?}"
        );
    }

    #[test]
    fn small_jobs_share_a_node_side_by_side_in_one_slot() {
        let mut g = Gang::new(2, 4, 2);
        let t = Duration::ZERO;
        for job in 1..=8 {
            g.submit(ask(job, Need::Cpus(2)), t);
        }
        let d = g.tick(t, usize::MAX);
        let slot_of = |job| {
            d.iter().find_map(|d| match d {
                Decision::Start { job: j, placed } if *j == job => Some(placed.time_slot),
                _ => None,
            })
        };
        // Two jobs per node, both nodes, both slots: 8 jobs of 2 CPUs in 2 x 2 x 4 CPUs.
        assert_eq!((1..=4).map(slot_of).collect::<Vec<_>>(), vec![Some(0); 4]);
        assert_eq!((5..=8).map(slot_of).collect::<Vec<_>>(), vec![Some(1); 4]);
        assert_eq!(run_of(&d), vec![1, 2, 3, 4]);
        assert_eq!(run_of(&g.tick(t, usize::MAX)), vec![5, 6, 7, 8]);
    }

    /// A job with `mem` bytes per node and `features` bits.
    fn ask_mem(job: JobId, need: Need, mem: u64, features: u64) -> JobAsk {
        JobAsk {
            mem,
            features,
            ..ask(job, need)
        }
    }

    #[test]
    fn jobs_whose_memory_does_not_fit_together_never_share_a_node_in_any_slot() {
        // 2 nodes of 8 GiB and 4 CPUs, 2 slots: CPUs would fit 4 whole-node jobs at once.
        let mut fit = NodeFit::new(2);
        fit.set_memory(0, 8 << 30);
        fit.set_memory(1, 8 << 30);
        let mut g = Gang::with_fit(fit, 4, 2);
        let t = Duration::ZERO;
        for job in 1..=4 {
            g.submit(ask_mem(job, Need::Nodes(1), 5 << 30, 0), t);
        }
        g.tick(t, usize::MAX);
        let placed: Vec<JobId> = g.placed.keys().copied().collect();
        assert_eq!(placed.len(), 2, "5 + 5 GiB do not fit in 8: {placed:?}");
        assert!(
            g.reason(3)
                .unwrap()
                .contains("0 of 2 nodes have 5 GiB free now"),
            "{:?}",
            g.reason(3)
        );
        g.ended(1, t);
        g.tick(t, usize::MAX);
        assert!(g.placed.contains_key(&3), "job 1's memory came free");
    }

    proptest! {
        /// Whatever jobs come and go, the memory of the jobs placed on a node, in every time
        /// slot together, never exceeds what the node offers; and a job lands only on nodes
        /// with the features it asks for. The check reads the matrix (where each job is),
        /// not the policy's own count of memory.
        #[test]
        fn the_gang_policy_never_over_commits_a_nodes_memory_across_slots(
            mpl in 1usize..5,
            mems in proptest::collection::vec(1u64..=16, 8),
            features in proptest::collection::vec(0u64..4, 8),
            ops in proptest::collection::vec(
                (1u32..=8, any::<bool>(), 0u64..=12, 0u64..4, any::<bool>()), 1..80)) {
            let mut fit = NodeFit::with_features(features.clone());
            for (n, gib) in mems.iter().enumerate() {
                fit.set_memory(n as NodeId, gib << 30);
            }
            let mut g = Gang::with_fit(fit, 4, mpl);
            let t = Duration::ZERO;
            let mut asked: HashMap<JobId, (u64, u64)> = HashMap::new();
            let mut next = 1;
            for (size, small, gib, want, end_one) in ops {
                if end_one && let Some(&j) = g.placed.keys().min() {
                    g.ended(j, t);
                } else {
                    let need = if small { Need::Cpus(1 + size % 4) } else { Need::Nodes(size) };
                    // Some jobs ask for no memory (0): they hold none.
                    let mem = gib << 29;
                    g.submit(ask_mem(next, need, mem, want), t);
                    asked.insert(next, (mem, want));
                    next += 1;
                }
                g.tick(t, usize::MAX);
                let mut held = [0u64; 8];
                for slot in &g.matrix {
                    for (job, share) in slot {
                        let (mem, want) = asked[job];
                        for n in share.nodes.iter() {
                            held[n as usize] += mem;
                            prop_assert_eq!(
                                features[n as usize] & want, want,
                                "job {} on node {} without its features", job, n
                            );
                        }
                    }
                }
                for (n, h) in held.iter().enumerate() {
                    prop_assert!(
                        *h <= mems[n] << 30,
                        "node {} holds {} bytes across its slots, more than its {} GiB",
                        n, h, mems[n]
                    );
                }
            }
        }

        /// No CPU holds two jobs in one slot; no CPU runs two jobs in one timeslice; every
        /// placed job runs within any `mpl` consecutive timeslices. Jobs take whole nodes or
        /// CPUs of one node.
        #[test]
        fn the_matrix_and_the_schedule_stay_consistent(
            mpl in 1usize..4,
            ops in proptest::collection::vec((1u32..=16, any::<bool>(), any::<bool>()), 1..60)) {
            let mut g = Gang::new(16, 4, mpl);
            let t = Duration::ZERO;
            let mut next = 1;
            let mut waiting_since: HashMap<JobId, usize> = HashMap::new();
            for (tick, (size, small, end_one)) in ops.into_iter().enumerate() {
                if end_one && let Some(&j) = g.placed.keys().min() {
                    g.ended(j, t);
                    waiting_since.remove(&j);
                } else {
                    let need = if small { Need::Cpus(1 + size % 4) } else { Need::Nodes(size) };
                    g.submit(ask(next, need), t);
                    next += 1;
                }
                let d = g.tick(t, usize::MAX);
                for slot in &g.matrix {
                    let shares: Vec<&Share> = slot.values().collect();
                    for (i, a) in shares.iter().enumerate() {
                        for b in &shares[i + 1..] {
                            prop_assert!(!a.overlaps(b), "two jobs share a CPU in one slot");
                        }
                    }
                }
                let run = run_of(&d);
                let running: Vec<&Share> = run.iter().map(|j| &g.matrix[g.placed[j]][j]).collect();
                for (i, a) in running.iter().enumerate() {
                    for b in &running[i + 1..] {
                        prop_assert!(!a.overlaps(b), "a CPU runs two jobs in one timeslice");
                    }
                }
                for j in &run {
                    waiting_since.insert(*j, tick);
                }
                for j in g.placed.keys() {
                    let since = *waiting_since.entry(*j).or_insert(tick);
                    prop_assert!(tick - since < mpl, "job {} has not run for {} timeslices", j, tick - since);
                }
            }
        }
    }
}
