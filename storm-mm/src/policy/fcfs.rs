//! First-come first-served space sharing: the head of the queue starts as soon as the buddy
//! allocator has room for it (whole nodes, or CPUs of a shared node), and nothing overtakes
//! it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use storm_cluster::JobId;
use storm_primitives::NodeId;

use super::{Decision, JobAsk, NodeFit, Placement, Policy, Share, withdraw_from};
use crate::alloc::Allocator;

pub struct Fcfs {
    alloc: Allocator,
    fit: NodeFit,
    queue: VecDeque<JobAsk>,
    running: HashMap<JobId, Share>,
}

impl Fcfs {
    pub fn new(nodes: u32, cpus: u32) -> Self {
        Self::with_fit(NodeFit::new(nodes), cpus)
    }

    /// Over the nodes of `fit` (their memory and features), of `cpus` CPUs each.
    pub fn with_fit(fit: NodeFit, cpus: u32) -> Self {
        Self {
            alloc: Allocator::new(fit.len(), cpus),
            fit,
            queue: VecDeque::new(),
            running: HashMap::new(),
        }
    }
}

impl Policy for Fcfs {
    fn name(&self) -> &'static str {
        "fcfs"
    }

    fn submit(&mut self, ask: JobAsk, _now: Duration) {
        self.queue.push_back(ask);
    }

    fn submit_front(&mut self, ask: JobAsk, _now: Duration) {
        self.queue.push_front(ask);
    }

    fn adopt(&mut self, ask: JobAsk, placed: &Placement, _ran: Duration, _now: Duration) -> bool {
        if !self.alloc.take(&placed.share) {
            return false;
        }
        self.fit.hold(&ask, &placed.share.nodes);
        self.running.insert(ask.job, placed.share.clone());
        true
    }

    fn withdraw(&mut self, job: JobId) -> bool {
        withdraw_from(&mut self.queue, job)
    }

    fn ended(&mut self, job: JobId, _now: Duration) {
        if let Some(share) = self.running.remove(&job) {
            self.alloc.release(&share);
            self.fit.release(job);
        }
    }

    fn tick(&mut self, _now: Duration, max_starts: usize) -> Vec<Decision> {
        let mut out = Vec::new();
        while out.len() < max_starts
            && let Some(head) = self.queue.front().copied()
        {
            let avoid = self.fit.avoid(&head);
            let Some(share) = self.alloc.allocate_avoiding(head.need, &avoid) else {
                break;
            };
            self.queue.pop_front();
            self.fit.hold(&head, &share.nodes);
            self.running.insert(head.job, share.clone());
            out.push(Decision::Start {
                job: head.job,
                placed: Placement {
                    share,
                    time_slot: 0,
                },
            });
        }
        out
    }

    fn set_unavailable(&mut self, node: NodeId) {
        self.alloc.set_unavailable(node);
    }

    fn set_available(&mut self, node: NodeId) {
        self.alloc.set_available(node);
    }

    fn set_node_memory(&mut self, node: NodeId, bytes: u64) {
        self.fit.set_memory(node, bytes);
    }

    fn reason(&self, job: JobId) -> Option<String> {
        let pos = self.queue.iter().position(|a| a.job == job)?;
        Some(if pos > 0 {
            format!(
                "waiting behind job {} (first come, first served)",
                self.queue[0].job
            )
        } else {
            let head = &self.queue[0];
            match self.fit.reason(head) {
                Some(room) => format!("waiting for {} ({room})", head.need.describe()),
                None => format!(
                    "waiting for {} ({})",
                    head.need.describe(),
                    self.alloc.describe_free(head.need)
                ),
            }
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
    use crate::policy::ask;

    #[test]
    fn the_head_blocks_later_jobs_that_would_fit() {
        let mut p = Fcfs::new(4, 2);
        let t = Duration::ZERO;
        for (job, nodes) in [(1, 3), (2, 4), (3, 1)] {
            p.submit(ask(job, Need::Nodes(nodes)), t);
        }
        let d = p.tick(t, usize::MAX);
        assert_eq!(d.len(), 1, "only job 1 starts: {d:?}");
        assert!(p.reason(3).unwrap().contains("behind job 2"));
        let why = p.reason(2).unwrap();
        assert!(
            why.contains("waiting for 4 free nodes (1 free now)"),
            "{why}"
        );
        p.ended(1, t);
        let d = p.tick(t, usize::MAX);
        assert!(matches!(&d[..], [Decision::Start { job: 2, .. }]), "{d:?}");
        assert!(p.withdraw(3));
        assert_eq!(p.queued(), 0);
    }

    #[test]
    fn single_cpu_jobs_fill_every_cpu_of_the_machine() {
        let mut p = Fcfs::new(4, 2);
        let t = Duration::ZERO;
        for job in 1..=9 {
            p.submit(ask(job, Need::Cpus(1)), t);
        }
        let d = p.tick(t, usize::MAX);
        assert_eq!(d.len(), 8, "one job per CPU: {d:?}");
        let why = p.reason(9).unwrap();
        assert!(why.contains("1 free CPU of a node (0 free now)"), "{why}");
        p.ended(3, t);
        assert!(matches!(
            &p.tick(t, usize::MAX)[..],
            [Decision::Start { job: 9, .. }]
        ));
    }
}
