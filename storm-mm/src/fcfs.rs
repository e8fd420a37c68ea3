//! First-come first-served space sharing: the head of the queue starts as soon as the buddy
//! allocator has room for it, and nothing overtakes it. Pure bookkeeping: no I/O.

use std::collections::VecDeque;

use storm_cluster::JobId;
use storm_primitives::NodeSet;

use crate::buddy::Buddy;

#[derive(Debug, Default)]
pub struct Fcfs {
    queue: VecDeque<(JobId, u32)>,
}

impl Fcfs {
    pub fn push(&mut self, job: JobId, nodes: u32) {
        self.queue.push_back((job, nodes));
    }

    pub fn remove(&mut self, job: JobId) -> bool {
        let before = self.queue.len();
        self.queue.retain(|(j, _)| *j != job);
        before != self.queue.len()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The head job, if it fits now.
    pub fn head_fits(&self, alloc: &Buddy) -> Option<(JobId, u32)> {
        self.queue.front().copied().filter(|&(_, n)| alloc.fits(n))
    }

    /// Starts the head job: allocates its nodes and removes it from the queue.
    pub fn start_head(&mut self, alloc: &mut Buddy) -> Option<(JobId, NodeSet)> {
        let (job, n) = self.head_fits(alloc)?;
        let nodes = alloc.allocate(n)?;
        self.queue.pop_front();
        Some((job, nodes))
    }

    /// Why `job` is still waiting.
    pub fn reason(&self, job: JobId, alloc: &Buddy) -> Option<String> {
        let pos = self.queue.iter().position(|(j, _)| *j == job)?;
        let (_, n) = self.queue[pos];
        Some(if pos > 0 {
            format!(
                "waiting behind job {} (first come, first served)",
                self.queue[0].0
            )
        } else {
            format!(
                "waiting for {n} free nodes ({} free now)",
                alloc.free_count()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_blocks_later_jobs_that_would_fit() {
        let mut alloc = Buddy::new(4);
        let mut q = Fcfs::default();
        q.push(1, 3);
        q.push(2, 4);
        q.push(3, 1);
        assert_eq!(
            q.start_head(&mut alloc).map(|(j, s)| (j, s.len())),
            Some((1, 3))
        );
        assert_eq!(
            q.start_head(&mut alloc),
            None,
            "job 2 needs 4 nodes; job 3 must not overtake it"
        );
        assert!(q.reason(3, &alloc).unwrap().contains("behind job 2"));
        assert!(q.reason(2, &alloc).unwrap().contains("1 free now"));
        alloc.release(&NodeSet::range(0, 2));
        assert_eq!(q.start_head(&mut alloc).map(|(j, _)| j), Some(2));
        assert!(q.remove(3));
        assert!(q.is_empty());
    }
}
