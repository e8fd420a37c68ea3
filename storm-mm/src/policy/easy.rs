//! EASY backfilling (Lifka's Extensible Argonne Scheduling sYstem).
//!
//! Jobs start in queue order while they fit. When the first queued job (the head) does not
//! fit, it gets a *reservation*: the earliest time at which what it needs will be free,
//! counting each running job as ending at its start plus its limit (a job past its limit is
//! killed, so it cannot end later), and the nodes it would take then. A later job may start
//! now (it is *backfilled*) if it fits and either ends before the reservation, or keeps off
//! the nodes reserved for the head. So backfilling never delays the head.
//!
//! Allocation is the buddy allocator's (whole nodes, or CPUs of a node small jobs share),
//! which never leaves a job waiting while as many nodes (or a node with as many CPUs) as it
//! needs are free, so the reservation is exact. Jobs without `--time` are given the
//! cluster's default limit.
//!
//! Memory and features ([`NodeFit`]) keep a job off the nodes that lack them, now and in its
//! reservation. The reservation leaves out only the nodes the head could never have
//! (features, or memory with every job gone): it does not replay when each job's memory
//! comes free, so while jobs that share nodes hold memory, it can be early.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use storm_cluster::JobId;
use storm_primitives::NodeId;

use super::{Decision, JobAsk, NodeFit, Placement, Policy, Share, withdraw_from};
use crate::alloc::Allocator;

pub struct Easy {
    alloc: Allocator,
    fit: NodeFit,
    queue: VecDeque<JobAsk>,
    /// Running jobs: what they hold and their estimated end.
    running: HashMap<JobId, (Share, Duration)>,
    default_limit: Duration,
    /// The head's reservation after the last tick: (job, time).
    reservation: Option<(JobId, Duration)>,
    /// Something changed since the last tick (a job came, started, ended or left, a node's
    /// availability). A tick after which nothing changed, allowed no more starts than the
    /// last, would start nothing and find the same reservation (time only makes a backfill
    /// harder), so it skips that work: with a head waiting, a tick would otherwise replay the
    /// running jobs' ends and try every queued job, every timeslice.
    changed: bool,
    /// The last tick's `max_starts`.
    max_starts: usize,
}

impl Easy {
    pub fn new(nodes: u32, cpus: u32, default_limit: Duration) -> Self {
        Self::with_fit(NodeFit::new(nodes), cpus, default_limit)
    }

    /// Over the nodes of `fit` (their memory and features), of `cpus` CPUs each.
    pub fn with_fit(fit: NodeFit, cpus: u32, default_limit: Duration) -> Self {
        Self {
            alloc: Allocator::new(fit.len(), cpus),
            fit,
            queue: VecDeque::new(),
            running: HashMap::new(),
            default_limit,
            reservation: None,
            changed: true,
            max_starts: 0,
        }
    }

    /// The head's reservation, if it is waiting: (job, the time it will start by).
    pub fn reservation(&self) -> Option<(JobId, Duration)> {
        self.reservation
    }

    fn limit(&self, ask: &JobAsk) -> Duration {
        ask.limit.unwrap_or(self.default_limit)
    }

    fn start(&mut self, ask: JobAsk, share: Share, now: Duration, out: &mut Vec<Decision>) {
        let end = now + self.limit(&ask);
        self.changed = true;
        self.fit.hold(&ask, &share.nodes);
        self.running.insert(ask.job, (share.clone(), end));
        out.push(Decision::Start {
            job: ask.job,
            placed: Placement {
                share,
                time_slot: 0,
            },
        });
    }

    /// When the head can start, and what it would take then: running jobs are given back in
    /// the order of their ends until it fits. `None` if it never fits (larger than the
    /// available machine).
    fn shadow(&self, head: &JobAsk, now: Duration) -> Option<(Duration, Share)> {
        let mut future = self.alloc.clone();
        let never = self.fit.never(head);
        if let Some(share) = future.allocate_avoiding(head.need, &self.fit.avoid(head)) {
            return Some((now, share));
        }
        let mut ends: Vec<(Duration, &Share)> =
            self.running.values().map(|(s, end)| (*end, s)).collect();
        ends.sort_unstable_by_key(|(end, _)| *end);
        // Jobs that end together are given back together, so the head is reserved what
        // they free rather than nodes free now, which later jobs could use meanwhile.
        for (i, (end, share)) in ends.iter().enumerate() {
            future.release(share);
            if ends.get(i + 1).is_some_and(|(next, _)| next == end) {
                continue;
            }
            if let Some(reserved) = future.allocate_avoiding(head.need, &never) {
                return Some(((*end).max(now), reserved));
            }
        }
        None
    }
}

impl Policy for Easy {
    fn name(&self) -> &'static str {
        "easy"
    }

    fn submit(&mut self, ask: JobAsk, _now: Duration) {
        self.changed = true;
        self.queue.push_back(ask);
    }

    fn submit_front(&mut self, ask: JobAsk, _now: Duration) {
        self.changed = true;
        self.queue.push_front(ask);
    }

    fn adopt(&mut self, ask: JobAsk, placed: &Placement, ran: Duration, now: Duration) -> bool {
        if !self.alloc.take(&placed.share) {
            return false;
        }
        let end = (now + self.limit(&ask)).saturating_sub(ran);
        self.changed = true;
        self.fit.hold(&ask, &placed.share.nodes);
        self.running.insert(ask.job, (placed.share.clone(), end));
        true
    }

    fn withdraw(&mut self, job: JobId) -> bool {
        self.changed = true;
        withdraw_from(&mut self.queue, job)
    }

    fn ended(&mut self, job: JobId, _now: Duration) {
        self.changed = true;
        if let Some((share, _)) = self.running.remove(&job) {
            self.alloc.release(&share);
            self.fit.release(job);
        }
    }

    fn set_unavailable(&mut self, node: NodeId) {
        self.changed = true;
        self.alloc.set_unavailable(node);
    }

    fn set_available(&mut self, node: NodeId) {
        self.changed = true;
        self.alloc.set_available(node);
    }

    fn set_node_memory(&mut self, node: NodeId, bytes: u64) {
        self.changed = true;
        self.fit.set_memory(node, bytes);
    }

    fn tick(&mut self, now: Duration, max_starts: usize) -> Vec<Decision> {
        let mut out = Vec::new();
        let more_starts = max_starts > std::mem::replace(&mut self.max_starts, max_starts);
        if !std::mem::take(&mut self.changed) && !more_starts {
            return out;
        }
        while let Some(head) = self.queue.front().copied() {
            if out.len() >= max_starts {
                break;
            }
            let avoid = self.fit.avoid(&head);
            let Some(share) = self.alloc.allocate_avoiding(head.need, &avoid) else {
                break;
            };
            self.queue.pop_front();
            self.start(head, share, now, &mut out);
        }
        self.reservation = None;
        let Some(head) = self.queue.front().copied() else {
            return out;
        };
        let Some((shadow, reserved)) = self.shadow(&head, now) else {
            self.reservation = Some((head.job, Duration::MAX));
            return out;
        };
        self.reservation = Some((head.job, shadow));
        // The machine as a job that outlasts the reservation sees it: the reserved nodes kept
        // out. Every start below is made in both.
        let mut outlasting = self.alloc.clone();
        for n in reserved.nodes.iter() {
            outlasting.set_unavailable(n);
        }
        let mut i = 1;
        while i < self.queue.len() && out.len() < max_starts {
            let ask = self.queue[i];
            let avoid = self.fit.avoid(&ask);
            let share = if now + self.limit(&ask) <= shadow {
                self.alloc.allocate_avoiding(ask.need, &avoid).inspect(|s| {
                    outlasting.take(s);
                })
            } else {
                outlasting.allocate_avoiding(ask.need, &avoid).inspect(|s| {
                    self.alloc.take(s);
                })
            };
            match share {
                Some(share) => {
                    self.queue.remove(i);
                    self.start(ask, share, now, &mut out);
                }
                None => i += 1,
            }
        }
        out
    }

    fn reason(&self, job: JobId) -> Option<String> {
        let pos = self.queue.iter().position(|a| a.job == job)?;
        let need = self.queue[0].need.describe();
        Some(match (pos, self.reservation) {
            (0, Some((_, at))) if at != Duration::MAX => {
                format!(
                    "waiting for {need}, reserved for t+{:.1}s",
                    at.as_secs_f64()
                )
            }
            (0, _) => format!(
                "waiting for {need} ({})",
                self.fit
                    .reason(&self.queue[0])
                    .unwrap_or_else(|| self.alloc.describe_free(self.queue[0].need))
            ),
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
    use crate::alloc::Need;
    use proptest::prelude::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn ask(job: JobId, nodes: u32, limit: u64) -> JobAsk {
        JobAsk {
            job,
            need: Need::Nodes(nodes),
            limit: Some(s(limit)),
            mem: 0,
            features: 0,
        }
    }

    fn ask_cpus(job: JobId, cpus: u32, limit: u64) -> JobAsk {
        JobAsk {
            job,
            need: Need::Cpus(cpus),
            limit: Some(s(limit)),
            mem: 0,
            features: 0,
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
        let mut p = Easy::new(8, 1, s(3600));
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
        let mut p = Easy::new(10, 1, s(3600));
        p.submit(ask(1, 6, 100), s(0));
        p.tick(s(0), usize::MAX);
        p.submit(ask(2, 7, 50), s(0)); // at t=100 10 free, head needs 7: 3 extra
        p.submit(ask(3, 3, 1000), s(0)); // long, but fits in the 3 extra
        p.submit(ask(4, 1, 1000), s(0)); // no extra left, too long
        assert_eq!(started(&p.tick(s(0), usize::MAX)), vec![3]);
        assert_eq!(p.reservation(), Some((2, s(100))));
    }

    #[test]
    fn a_long_small_job_backfills_onto_a_node_the_head_does_not_need() {
        let mut p = Easy::new(2, 4, s(3600));
        p.submit(ask_cpus(1, 2, 100), s(0)); // node 0, CPUs 0-1, until t=100
        p.tick(s(0), usize::MAX);
        p.submit(ask(2, 2, 50), s(0)); // head: both nodes whole, reserved for t=100
        p.submit(ask_cpus(3, 2, 1000), s(0)); // long: would keep a node the head needs
        p.submit(ask_cpus(4, 1, 10), s(0)); // short: ends before t=100
        assert_eq!(started(&p.tick(s(0), usize::MAX)), vec![4]);
        assert_eq!(p.reservation(), Some((2, s(100))));
        let mut q = Easy::new(3, 4, s(3600));
        q.submit(ask_cpus(1, 2, 100), s(0)); // node 0 until t=100
        q.submit(ask(2, 1, 100), s(0)); // node 1 until t=100
        q.tick(s(0), usize::MAX);
        q.submit(ask(3, 2, 50), s(0)); // head: 2 whole nodes at t=100 (nodes 0 and 1)
        q.submit(ask_cpus(4, 3, 1000), s(0)); // long, fits on node 2, which it keeps
        assert_eq!(started(&q.tick(s(0), usize::MAX)), vec![4]);
        assert_eq!(q.reservation(), Some((3, s(100))));
    }

    /// A tick after which nothing changed starts nothing, but one that allows more starts
    /// than the last (a job area came free in the MM) is not skipped.
    #[test]
    fn a_job_waiting_only_for_a_start_allowance_starts_when_one_comes() {
        let mut p = Easy::new(2, 1, s(3600));
        p.submit(ask(1, 1, 100), s(0));
        assert_eq!(started(&p.tick(s(0), 0)), Vec::<JobId>::new());
        assert_eq!(started(&p.tick(s(1), 0)), Vec::<JobId>::new());
        assert_eq!(started(&p.tick(s(2), 1)), vec![1]);
        p.submit(ask(2, 2, 100), s(3)); // waits for job 1
        assert_eq!(started(&p.tick(s(3), 1)), Vec::<JobId>::new());
        assert_eq!(p.reservation(), Some((2, s(102))));
        assert_eq!(
            started(&p.tick(s(4), 1)),
            Vec::<JobId>::new(),
            "nothing changed"
        );
        assert_eq!(p.reservation(), Some((2, s(102))));
        p.ended(1, s(5));
        assert_eq!(started(&p.tick(s(5), 1)), vec![2]);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Submit { nodes: u32, limit: u64 },
        SubmitSmall { cpus: u32, limit: u64 },
        Advance { secs: u64 },
        EndEarly { index: usize, early: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u32..=16, 1u64..200).prop_map(|(nodes, limit)| Step::Submit { nodes, limit }),
            (1u32..=3, 1u64..200).prop_map(|(cpus, limit)| Step::SubmitSmall { cpus, limit }),
            (1u64..60).prop_map(|secs| Step::Advance { secs }),
            (0usize..8, 0u64..50).prop_map(|(index, early)| Step::EndEarly { index, early }),
        ]
    }

    proptest! {
        /// No CPU is given twice (jobs take whole nodes or CPUs of one node), and while a job
        /// is the head its reservation never moves later (jobs end at or before their limit,
        /// as the MM enforces).
        #[test]
        fn backfilling_never_delays_the_head(steps in proptest::collection::vec(step(), 1..80)) {
            let mut p = Easy::new(16, 4, s(3600));
            let mut now = s(0);
            let mut next = 1;
            let mut held: HashMap<JobId, (Share, Duration)> = HashMap::new();
            let mut last: Option<(JobId, Duration)> = None;
            for st in steps {
                match st {
                    Step::Submit { nodes, limit } => { p.submit(ask(next, nodes, limit), now); next += 1; }
                    Step::SubmitSmall { cpus, limit } => { p.submit(ask_cpus(next, cpus, limit), now); next += 1; }
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
                    if let Decision::Start { job, placed } = d {
                        for (other, (n, _)) in &held {
                            prop_assert!(!n.overlaps(&placed.share), "job {} overlaps job {}", job, other);
                        }
                        let limit = p.running[&job].1;
                        held.insert(job, (placed.share, limit));
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
