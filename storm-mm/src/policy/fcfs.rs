//! First-come first-served space sharing: the head of the queue starts as soon as the buddy
//! allocator has room for it, and nothing overtakes it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use storm_cluster::JobId;
use storm_primitives::{NodeId, NodeSet};

use super::{Decision, JobAsk, Placement, Policy, withdraw_from};
use crate::buddy::Buddy;

pub struct Fcfs {
    buddy: Buddy,
    queue: VecDeque<JobAsk>,
    running: HashMap<JobId, NodeSet>,
}

impl Fcfs {
    pub fn new(nodes: u32) -> Self {
        Self {
            buddy: Buddy::new(nodes),
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
        if !self.buddy.take(&placed.nodes) {
            return false;
        }
        self.running.insert(ask.job, placed.nodes.clone());
        true
    }

    fn withdraw(&mut self, job: JobId) -> bool {
        withdraw_from(&mut self.queue, job)
    }

    fn ended(&mut self, job: JobId, _now: Duration) {
        if let Some(nodes) = self.running.remove(&job) {
            self.buddy.release(&nodes);
        }
    }

    fn tick(&mut self, _now: Duration, max_starts: usize) -> Vec<Decision> {
        let mut out = Vec::new();
        while out.len() < max_starts
            && let Some(head) = self.queue.front().copied()
        {
            let Some(nodes) = self.buddy.allocate(head.nodes) else {
                break;
            };
            self.queue.pop_front();
            self.running.insert(head.job, nodes.clone());
            out.push(Decision::Start {
                job: head.job,
                nodes,
                time_slot: 0,
            });
        }
        out
    }

    fn set_unavailable(&mut self, node: NodeId) {
        self.buddy.set_unavailable(node);
    }

    fn set_available(&mut self, node: NodeId) {
        self.buddy.set_available(node);
    }

    fn reason(&self, job: JobId) -> Option<String> {
        let pos = self.queue.iter().position(|a| a.job == job)?;
        Some(if pos > 0 {
            format!(
                "waiting behind job {} (first come, first served)",
                self.queue[0].job
            )
        } else {
            format!(
                "waiting for {} free nodes ({} free now)",
                self.queue[0].nodes,
                self.buddy.free_count()
            )
        })
    }

    fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_blocks_later_jobs_that_would_fit() {
        let mut p = Fcfs::new(4);
        let t = Duration::ZERO;
        for (job, nodes) in [(1, 3), (2, 4), (3, 1)] {
            p.submit(
                JobAsk {
                    job,
                    nodes,
                    limit: None,
                },
                t,
            );
        }
        let d = p.tick(t, usize::MAX);
        assert_eq!(d.len(), 1, "only job 1 starts: {d:?}");
        assert!(p.reason(3).unwrap().contains("behind job 2"));
        assert!(p.reason(2).unwrap().contains("1 free now"));
        p.ended(1, t);
        let d = p.tick(t, usize::MAX);
        assert!(matches!(&d[..], [Decision::Start { job: 2, .. }]), "{d:?}");
        assert!(p.withdraw(3));
        assert_eq!(p.queued(), 0);
    }
}
