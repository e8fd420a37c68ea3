//! Gang scheduling over an Ousterhout matrix: `mpl` time slots by the cluster's nodes.
//!
//! A job is placed, first fit in queue order, in the first slot whose buddy allocator has an
//! aligned block for it. Every timeslice the active slot moves to the next non-empty one, and
//! exactly the jobs of that slot run, on all their nodes at once. Nodes that the active slot
//! leaves idle may run another slot's job if *all* of that job's nodes are idle (alternative
//! scheduling), so the job stays coscheduled. With one non-empty slot nothing switches.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use storm_cluster::JobId;
use storm_primitives::{NodeId, NodeSet};

use super::{Decision, JobAsk, Placement, Policy, withdraw_from};
use crate::buddy::Buddy;

pub struct Gang {
    slots: Vec<Buddy>,
    /// Jobs by slot, in placement order.
    matrix: Vec<BTreeMap<JobId, NodeSet>>,
    placed: HashMap<JobId, usize>,
    queue: VecDeque<JobAsk>,
    active: usize,
}

impl Gang {
    pub fn new(nodes: u32, mpl: usize) -> Self {
        Self {
            slots: (0..mpl).map(|_| Buddy::new(nodes)).collect(),
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
    pub fn matrix(&self) -> &[BTreeMap<JobId, NodeSet>] {
        &self.matrix
    }

    fn run_set(&self) -> Vec<JobId> {
        let mpl = self.matrix.len();
        let mut run: Vec<JobId> = self.matrix[self.active].keys().copied().collect();
        let mut busy: NodeSet = self.matrix[self.active]
            .values()
            .fold(NodeSet::new(), |a, n| a.union(n));
        for k in 1..mpl {
            let s = (self.active + k) % mpl;
            for (job, nodes) in &self.matrix[s] {
                if busy.is_disjoint(nodes) {
                    busy = busy.union(nodes);
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
        if slot >= self.slots.len() || !self.slots[slot].take(&placed.nodes) {
            return false;
        }
        self.matrix[slot].insert(ask.job, placed.nodes.clone());
        self.placed.insert(ask.job, slot);
        true
    }

    fn withdraw(&mut self, job: JobId) -> bool {
        withdraw_from(&mut self.queue, job)
    }

    fn ended(&mut self, job: JobId, _now: Duration) {
        if let Some(slot) = self.placed.remove(&job)
            && let Some(nodes) = self.matrix[slot].remove(&job)
        {
            self.slots[slot].release(&nodes);
        }
    }

    fn tick(&mut self, _now: Duration, max_starts: usize) -> Vec<Decision> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.queue.len() && out.len() < max_starts {
            let ask = self.queue[i];
            let placed = (0..self.slots.len())
                .find_map(|s| self.slots[s].allocate(ask.nodes).map(|n| (s, n)));
            match placed {
                Some((slot, nodes)) => {
                    self.queue.remove(i);
                    self.matrix[slot].insert(ask.job, nodes.clone());
                    self.placed.insert(ask.job, slot);
                    out.push(Decision::Start {
                        job: ask.job,
                        nodes,
                        time_slot: slot,
                    });
                }
                None => i += 1,
            }
        }
        let mpl = self.matrix.len();
        if let Some(next) = (1..=mpl)
            .map(|k| (self.active + k) % mpl)
            .find(|&s| !self.matrix[s].is_empty())
        {
            self.active = next;
        }
        out.push(Decision::Run {
            jobs: self.run_set(),
        });
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

    fn reason(&self, job: JobId) -> Option<String> {
        let ask = self.queue.iter().find(|a| a.job == job)?;
        Some(format!(
            "waiting for {} free nodes in one of the {} time slots (most free in a slot: {})",
            ask.nodes,
            self.slots.len(),
            self.slots.iter().map(Buddy::free_count).max().unwrap_or(0)
        ))
    }

    fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run_of(d: &[Decision]) -> Vec<JobId> {
        d.iter()
            .find_map(|d| match d {
                Decision::Run { jobs } => Some(jobs.clone()),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn two_full_size_jobs_alternate_and_a_new_one_starts_at_once() {
        let mut g = Gang::new(8, 2);
        let t = Duration::ZERO;
        g.submit(
            JobAsk {
                job: 1,
                nodes: 8,
                limit: None,
            },
            t,
        );
        g.submit(
            JobAsk {
                job: 2,
                nodes: 8,
                limit: None,
            },
            t,
        );
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
        g.submit(
            JobAsk {
                job: 3,
                nodes: 4,
                limit: None,
            },
            t,
        );
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
        let mut g = Gang::new(8, 2);
        let t = Duration::ZERO;
        g.submit(
            JobAsk {
                job: 1,
                nodes: 4,
                limit: None,
            },
            t,
        ); // slot 0, nodes 0-3
        g.submit(
            JobAsk {
                job: 2,
                nodes: 8,
                limit: None,
            },
            t,
        ); // slot 1, all nodes
        g.tick(t, usize::MAX);
        g.submit(
            JobAsk {
                job: 3,
                nodes: 4,
                limit: None,
            },
            t,
        ); // slot 0, nodes 4-7
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

    proptest! {
        /// No node holds two jobs in one slot; no node runs two jobs in one timeslice; every
        /// placed job runs within any `mpl` consecutive timeslices.
        #[test]
        fn the_matrix_and_the_schedule_stay_consistent(
            mpl in 1usize..4,
            ops in proptest::collection::vec((1u32..=16, any::<bool>()), 1..60)) {
            let mut g = Gang::new(16, mpl);
            let t = Duration::ZERO;
            let mut next = 1;
            let mut waiting_since: HashMap<JobId, usize> = HashMap::new();
            for (tick, (nodes, end_one)) in ops.into_iter().enumerate() {
                if end_one && let Some(&j) = g.placed.keys().min() {
                    g.ended(j, t);
                    waiting_since.remove(&j);
                } else {
                    g.submit(JobAsk { job: next, nodes, limit: None }, t);
                    next += 1;
                }
                let d = g.tick(t, usize::MAX);
                for slot in &g.matrix {
                    let mut seen = NodeSet::new();
                    for n in slot.values() {
                        prop_assert!(seen.is_disjoint(n), "two jobs share a node in one slot");
                        seen = seen.union(n);
                    }
                }
                let run = run_of(&d);
                let mut busy = NodeSet::new();
                for j in &run {
                    let n = &g.matrix[g.placed[j]][j];
                    prop_assert!(busy.is_disjoint(n), "a node runs two jobs in one timeslice");
                    busy = busy.union(n);
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
