//! EASY backfilling (Lifka's Extensible Argonne Scheduling sYstem).
//!
//! Jobs start in queue order while they fit. When the first queued job (the head) does not
//! fit, it gets a *reservation*: the earliest time at which enough nodes will be free, counting
//! each running job as ending at its start plus its limit (a job past its limit is killed, so
//! it cannot end later). A later job may start now (it is *backfilled*) if it fits in the free
//! nodes and either ends before the reservation, or uses only nodes the head will not need at
//! the reservation (the *extra* nodes). So backfilling never delays the head.
//!
//! Allocation is by count (the lowest free node ids), which keeps the reservation arithmetic
//! exact. Jobs without `--time` are given the cluster's default limit.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use storm_cluster::JobId;
use storm_primitives::{NodeId, NodeSet};

use super::{Decision, JobAsk, Placement, Policy, withdraw_from};

pub struct Easy {
    free: NodeSet,
    /// Nodes kept out of allocation.
    unavailable: NodeSet,
    queue: VecDeque<JobAsk>,
    /// Running jobs: nodes and estimated end.
    running: HashMap<JobId, (NodeSet, Duration)>,
    default_limit: Duration,
    /// The head's reservation after the last tick: (job, time).
    reservation: Option<(JobId, Duration)>,
}

impl Easy {
    pub fn new(nodes: u32, default_limit: Duration) -> Self {
        Self {
            free: NodeSet::first_n(nodes),
            unavailable: NodeSet::new(),
            queue: VecDeque::new(),
            running: HashMap::new(),
            default_limit,
            reservation: None,
        }
    }

    /// The head's reservation, if it is waiting: (job, the time it will start by).
    pub fn reservation(&self) -> Option<(JobId, Duration)> {
        self.reservation
    }

    fn limit(&self, ask: &JobAsk) -> Duration {
        ask.limit.unwrap_or(self.default_limit)
    }

    fn take(&mut self, n: u32) -> NodeSet {
        let nodes: NodeSet = self.free.iter().take(n as usize).collect();
        self.free = self.free.difference(&nodes);
        nodes
    }

    fn start(&mut self, ask: JobAsk, now: Duration, out: &mut Vec<Decision>) {
        let nodes = self.take(ask.nodes);
        let end = now + self.limit(&ask);
        self.running.insert(ask.job, (nodes.clone(), end));
        out.push(Decision::Start {
            job: ask.job,
            nodes,
            time_slot: 0,
        });
    }

    /// When the head can start, and how many nodes it leaves spare then.
    fn shadow(&self, head: &JobAsk, now: Duration) -> (Duration, u32) {
        let mut avail = self.free.len() as u32;
        if avail >= head.nodes {
            return (now, avail - head.nodes);
        }
        let mut ends: Vec<(Duration, u32)> = self
            .running
            .values()
            .map(|(n, end)| (*end, n.difference(&self.unavailable).len() as u32))
            .collect();
        ends.sort_unstable();
        for (end, n) in ends {
            avail += n;
            if avail >= head.nodes {
                return (end.max(now), avail - head.nodes);
            }
        }
        (Duration::MAX, 0) // larger than the cluster: the MM rejects such jobs
    }
}

impl Policy for Easy {
    fn name(&self) -> &'static str {
        "easy"
    }

    fn submit(&mut self, ask: JobAsk, _now: Duration) {
        self.queue.push_back(ask);
    }

    fn submit_front(&mut self, ask: JobAsk, _now: Duration) {
        self.queue.push_front(ask);
    }

    fn adopt(&mut self, ask: JobAsk, placed: &Placement, ran: Duration, now: Duration) -> bool {
        // Free or kept out of allocation, but held by no running job.
        let taken = self
            .running
            .values()
            .fold(NodeSet::new(), |all, (n, _)| all.union(n));
        let idle = self.free.union(&self.unavailable).difference(&taken);
        if placed.nodes.is_empty() || !placed.nodes.is_subset(&idle) {
            return false;
        }
        let end = (now + self.limit(&ask)).saturating_sub(ran);
        self.free = self.free.difference(&placed.nodes);
        self.running.insert(ask.job, (placed.nodes.clone(), end));
        true
    }

    fn withdraw(&mut self, job: JobId) -> bool {
        withdraw_from(&mut self.queue, job)
    }

    fn ended(&mut self, job: JobId, _now: Duration) {
        if let Some((nodes, _)) = self.running.remove(&job) {
            self.free = self.free.union(&nodes.difference(&self.unavailable));
        }
    }

    fn set_unavailable(&mut self, node: NodeId) {
        self.unavailable.insert(node);
        self.free.remove(node);
    }

    fn set_available(&mut self, node: NodeId) {
        if self.unavailable.remove(node) && !self.running.values().any(|(n, _)| n.contains(node)) {
            self.free.insert(node);
        }
    }

    fn tick(&mut self, now: Duration, max_starts: usize) -> Vec<Decision> {
        let mut out = Vec::new();
        while let Some(head) = self.queue.front().copied() {
            if head.nodes > self.free.len() as u32 || out.len() >= max_starts {
                break;
            }
            self.queue.pop_front();
            self.start(head, now, &mut out);
        }
        self.reservation = None;
        let Some(head) = self.queue.front().copied() else {
            return out;
        };
        let (shadow, mut extra) = self.shadow(&head, now);
        self.reservation = Some((head.job, shadow));
        let mut i = 1;
        while i < self.queue.len() && out.len() < max_starts {
            let ask = self.queue[i];
            let fits = ask.nodes <= self.free.len() as u32;
            let ends_in_time = now + self.limit(&ask) <= shadow;
            if fits && (ends_in_time || ask.nodes <= extra) {
                if !ends_in_time {
                    extra -= ask.nodes;
                }
                self.queue.remove(i);
                self.start(ask, now, &mut out);
            } else {
                i += 1;
            }
        }
        out
    }

    fn reason(&self, job: JobId) -> Option<String> {
        let pos = self.queue.iter().position(|a| a.job == job)?;
        Some(match (pos, self.reservation) {
            (0, Some((_, at))) if at != Duration::MAX => {
                format!(
                    "waiting for {} free nodes, reserved for t+{:.1}s",
                    self.queue[0].nodes,
                    at.as_secs_f64()
                )
            }
            (0, _) => format!("waiting for {} free nodes", self.queue[0].nodes),
            _ => format!(
                "waiting behind job {}: not backfillable without delaying it",
                self.queue[0].job
            ),
        })
    }

    fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn ask(job: JobId, nodes: u32, limit: u64) -> JobAsk {
        JobAsk {
            job,
            nodes,
            limit: Some(s(limit)),
        }
    }

    fn started(d: &[Decision]) -> Vec<JobId> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Start { job, .. } => Some(*job),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_short_job_is_backfilled_and_a_long_one_is_not() {
        let mut p = Easy::new(8, s(3600));
        p.submit(ask(1, 6, 100), s(0));
        assert_eq!(started(&p.tick(s(0), usize::MAX)), vec![1]);
        p.submit(ask(2, 8, 50), s(1)); // head: needs all 8, reserved for t=100
        p.submit(ask(3, 2, 200), s(1)); // would hold 2 nodes past t=100: no
        p.submit(ask(4, 2, 60), s(1)); // ends at 61 < 100: backfilled
        assert_eq!(started(&p.tick(s(1), usize::MAX)), vec![4]);
        assert_eq!(p.reservation(), Some((2, s(100))));
        assert!(p.reason(3).unwrap().contains("not backfillable"));
        p.ended(1, s(100));
        p.ended(4, s(61));
        assert_eq!(started(&p.tick(s(100), usize::MAX)), vec![2]);
    }

    #[test]
    fn extra_nodes_can_be_used_by_long_jobs() {
        let mut p = Easy::new(10, s(3600));
        p.submit(ask(1, 6, 100), s(0));
        p.tick(s(0), usize::MAX);
        p.submit(ask(2, 7, 50), s(0)); // at t=100 10 free, head needs 7: 3 extra
        p.submit(ask(3, 3, 1000), s(0)); // long, but fits in the 3 extra
        p.submit(ask(4, 1, 1000), s(0)); // no extra left, too long
        assert_eq!(started(&p.tick(s(0), usize::MAX)), vec![3]);
        assert_eq!(p.reservation(), Some((2, s(100))));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Submit { nodes: u32, limit: u64 },
        Advance { secs: u64 },
        EndEarly { index: usize, early: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u32..=16, 1u64..200).prop_map(|(nodes, limit)| Step::Submit { nodes, limit }),
            (1u64..60).prop_map(|secs| Step::Advance { secs }),
            (0usize..8, 0u64..50).prop_map(|(index, early)| Step::EndEarly { index, early }),
        ]
    }

    proptest! {
        /// Nodes are never given twice, and while a job is the head its reservation never
        /// moves later (jobs end at or before their limit, as the MM enforces).
        #[test]
        fn backfilling_never_delays_the_head(steps in proptest::collection::vec(step(), 1..80)) {
            let mut p = Easy::new(16, s(3600));
            let mut now = s(0);
            let mut next = 1;
            let mut held: HashMap<JobId, (NodeSet, Duration)> = HashMap::new();
            let mut last: Option<(JobId, Duration)> = None;
            for st in steps {
                match st {
                    Step::Submit { nodes, limit } => { p.submit(ask(next, nodes, limit), now); next += 1; }
                    Step::Advance { secs } => {
                        now += s(secs);
                        let due: Vec<JobId> = held.iter().filter(|(_, (_, end))| *end <= now).map(|(j, _)| *j).collect();
                        for j in due { held.remove(&j); p.ended(j, now); }
                    }
                    Step::EndEarly { index, early } => {
                        let mut ids: Vec<JobId> = held.keys().copied().collect();
                        ids.sort_unstable();
                        if let Some(&j) = ids.get(index) {
                            let _ = early;
                            held.remove(&j);
                            p.ended(j, now);
                        }
                    }
                }
                for d in p.tick(now, usize::MAX) {
                    if let Decision::Start { job, nodes, .. } = d {
                        for (other, (n, _)) in &held {
                            prop_assert!(n.is_disjoint(&nodes), "job {} overlaps job {}", job, other);
                        }
                        let limit = p.running[&job].1;
                        held.insert(job, (nodes, limit));
                    }
                }
                let now_res = p.reservation();
                if let (Some((hj, ht)), Some((lj, lt))) = (now_res, last)
                    && hj == lj
                {
                    prop_assert!(ht <= lt, "head {}'s reservation moved from {:?} to {:?}", hj, lt, ht);
                }
                last = now_res;
            }
        }
    }
}
