//! Buddy allocation of nodes (paper Sec. 2.2, after Feitelson's packing schemes).
//!
//! Nodes `0..n` are the leaves of a binary buddy tree over the next power of two. A request
//! for `k` nodes takes the lowest free aligned block of `2^ceil(log2 k)` nodes and gives the
//! unused tail of that block back as smaller buddy blocks, so jobs get contiguous, aligned
//! ranges (which keeps the node sets compact and the gang-scheduling matrix tidy) and no node
//! is wasted. Freed blocks merge with free buddies. Pure bookkeeping: no I/O.
//!
//! Nodes can be made *unavailable* (down, drained, not yet registered). An unavailable leaf
//! is treated like a phantom one: it merges, but is never handed out, and a request is placed
//! in an aligned sub-block of a free block that avoids it.

use std::collections::BTreeSet;

use storm_primitives::NodeSet;

#[derive(Debug, Clone)]
pub struct Buddy {
    /// Real nodes: `0..nodes`.
    nodes: u32,
    /// Leaves of the tree: `nodes` rounded up to a power of two. The *phantom* leaves
    /// `nodes..total` count as free for merging but are never handed out, so a cluster that is
    /// not a power of two can still give all its nodes to one job.
    total: u32,
    /// Free blocks by order: `free[o]` holds the start of each free block of `2^o` leaves.
    free: Vec<BTreeSet<u32>>,
    /// Nodes that must not be handed out (free or not).
    unavailable: BTreeSet<u32>,
}

fn order_for(k: u32) -> usize {
    k.next_power_of_two().trailing_zeros() as usize
}

impl Buddy {
    /// All of `nodes` free.
    pub fn new(nodes: u32) -> Self {
        let total = nodes.max(1).next_power_of_two();
        let mut b = Self {
            nodes,
            total,
            free: vec![BTreeSet::new(); order_for(total) + 1],
            unavailable: BTreeSet::new(),
        };
        b.release_range(0, total);
        b
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// Free leaves that are real nodes, as `(start, end)` of each free block.
    fn blocks(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let nodes = self.nodes;
        self.free
            .iter()
            .enumerate()
            .flat_map(move |(o, starts)| {
                starts.iter().map(move |&s| (s, (s + (1 << o)).min(nodes)))
            })
            .filter(|(s, e)| s < e)
    }

    /// Number of free nodes that can be handed out.
    pub fn free_count(&self) -> u32 {
        self.free_set().len() as u32
    }

    /// The free nodes that can be handed out.
    pub fn free_set(&self) -> NodeSet {
        self.blocks()
            .flat_map(|(s, e)| s..e)
            .filter(|n| !self.unavailable.contains(n))
            .collect()
    }

    /// The lowest aligned sub-block of `2^want` leaves, inside a free block, whose first `k`
    /// leaves are usable: (order of the free block, its start, the sub-block's start).
    fn find(&self, k: u32, want: usize) -> Option<(usize, u32, u32)> {
        // The smallest free blocks first, as a buddy allocator does; the lowest within them.
        (want..self.free.len()).find_map(|o| {
            self.free[o].iter().find_map(|&s| {
                (0..1u32 << (o - want))
                    .map(|i| s + (i << want))
                    .find(|&c| self.usable(c, c + k))
                    .map(|c| (o, s, c))
            })
        })
    }

    /// Takes `k` nodes: an aligned block when one is free; otherwise, when at least `k` nodes
    /// are free but scattered (around a down node, say), the lowest `k` of them, so a job never
    /// waits while enough nodes are free. `None` if fewer than `k` are free.
    pub fn allocate(&mut self, k: u32) -> Option<NodeSet> {
        if k == 0 || k > self.nodes {
            return None;
        }
        let want = order_for(k);
        let Some((order, start, at)) = self.find(k, want) else {
            return self.scatter(k);
        };
        self.free[order].remove(&start);
        // Give back the rest of the free block: before the sub-block, and after the job.
        self.release_range(start, at);
        self.release_range(at + k, start + (1 << order));
        Some(NodeSet::range(at, at + k - 1))
    }

    /// The lowest `k` free nodes, each cut out of its free block.
    fn scatter(&mut self, k: u32) -> Option<NodeSet> {
        let chosen: NodeSet = self.free_set().iter().take(k as usize).collect();
        if chosen.len() < k as usize {
            return None;
        }
        for n in chosen.iter() {
            self.take_leaf(n);
        }
        Some(chosen)
    }

    /// Takes exactly the nodes of `set` (a job that held them before the MM restarted takes
    /// them back), available or not. False, taking nothing, if one of them is not free.
    pub fn take(&mut self, set: &NodeSet) -> bool {
        let free = self.blocks().flat_map(|(s, e)| s..e).collect::<NodeSet>();
        if set.is_empty() || !set.is_subset(&free) {
            return false;
        }
        for n in set.iter() {
            self.take_leaf(n);
        }
        true
    }

    /// Removes the single free leaf `node` from the free block holding it.
    fn take_leaf(&mut self, node: u32) {
        let found = self.free.iter().enumerate().find_map(|(o, starts)| {
            starts
                .range(..=node)
                .next_back()
                .filter(|&&s| node < s + (1 << o))
                .map(|&s| (o, s))
        });
        if let Some((order, start)) = found {
            self.free[order].remove(&start);
            self.release_range(start, node);
            self.release_range(node + 1, start + (1 << order));
        }
    }

    /// Returns nodes to the pool.
    pub fn release(&mut self, set: &NodeSet) {
        for &(lo, hi) in set.ranges() {
            self.release_range(lo, hi.saturating_add(1).min(self.nodes));
        }
    }

    /// Keeps `node` out of every allocation from now on. It stays in the free blocks (so
    /// they keep merging), like a phantom leaf, but is never handed out.
    pub fn set_unavailable(&mut self, node: u32) {
        if node < self.nodes {
            self.unavailable.insert(node);
        }
    }

    /// Lets `node` be allocated again.
    pub fn set_available(&mut self, node: u32) {
        self.unavailable.remove(&node);
    }

    /// Whether leaves `lo..hi` are all real, available nodes.
    fn usable(&self, lo: u32, hi: u32) -> bool {
        hi <= self.nodes && self.unavailable.range(lo..hi).next().is_none()
    }

    /// Frees leaves `lo..hi` as maximal aligned blocks, merging with free buddies.
    fn release_range(&mut self, mut lo: u32, hi: u32) {
        let hi = hi.min(self.total);
        while lo < hi {
            let mut order = (lo.trailing_zeros() as usize).min(self.free.len() - 1);
            while order > 0 && lo + (1 << order) > hi {
                order -= 1;
            }
            self.free_block(lo, order);
            lo += 1 << order;
        }
    }

    fn free_block(&mut self, mut start: u32, mut order: usize) {
        while order + 1 < self.free.len() {
            let buddy = start ^ (1 << order);
            if !self.free[order].remove(&buddy) {
                break;
            }
            start = start.min(buddy);
            order += 1;
        }
        self.free[order].insert(start);
    }

    /// Whether `k` nodes could be allocated now.
    pub fn fits(&self, k: u32) -> bool {
        k > 0 && k <= self.nodes && self.free_count() >= k
    }

    /// Whether `k` nodes could be allocated now as one aligned block.
    pub fn fits_aligned(&self, k: u32) -> bool {
        k > 0 && k <= self.nodes && self.find(k, order_for(k)).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blocks_are_aligned_and_tails_are_returned() {
        let mut b = Buddy::new(8);
        assert_eq!(b.allocate(3), Some(NodeSet::range(0, 2)));
        assert_eq!(b.free_count(), 5);
        assert_eq!(
            b.allocate(1),
            Some(NodeSet::single(3)),
            "the tail of the first block"
        );
        assert_eq!(b.allocate(4), Some(NodeSet::range(4, 7)));
        assert_eq!(b.allocate(1), None);
        b.release(&NodeSet::range(0, 2));
        b.release(&NodeSet::single(3));
        assert_eq!(
            b.allocate(4),
            Some(NodeSet::range(0, 3)),
            "freed buddies merge"
        );
    }

    #[test]
    fn nodes_taken_back_are_not_handed_out_and_merge_when_released() {
        let mut b = Buddy::new(8);
        b.set_unavailable(5);
        assert!(
            b.take(&"1,5".parse().unwrap()),
            "unavailable nodes can be taken back"
        );
        assert!(!b.take(&NodeSet::single(1)), "node 1 is taken already");
        assert!(!b.take(&"0,1".parse().unwrap()), "all or nothing");
        assert_eq!(
            b.free_count(),
            6,
            "node 0 is still free: {:?}",
            b.free_set()
        );
        assert_eq!(b.allocate(2), Some(NodeSet::range(2, 3)));
        b.set_available(5);
        b.release(&"1,5".parse().unwrap());
        b.release(&NodeSet::range(2, 3));
        assert!(b.fits_aligned(8));
    }

    #[test]
    fn a_cluster_that_is_not_a_power_of_two() {
        let mut b = Buddy::new(6);
        assert_eq!(b.free_count(), 6);
        assert_eq!(b.allocate(6), Some(NodeSet::range(0, 5)));
        assert_eq!(b.free_count(), 0);
        b.release(&NodeSet::range(0, 5));
        assert!(b.fits(6));
        assert!(b.fits(4));
        assert_eq!(b.allocate(4), Some(NodeSet::range(0, 3)));
        assert_eq!(b.allocate(2), Some(NodeSet::range(4, 5)));
        assert!(!b.fits(1));
        assert_eq!(b.allocate(7), None, "more than the cluster");
    }

    #[test]
    fn an_unavailable_node_is_never_handed_out_until_available_again() {
        let mut b = Buddy::new(8);
        b.set_unavailable(2);
        assert_eq!(b.free_count(), 7);
        assert!(!b.fits(8), "the whole cluster is not free");
        assert_eq!(b.allocate(4), Some(NodeSet::range(4, 7)));
        assert_eq!(b.allocate(2), Some(NodeSet::range(0, 1)));
        assert_eq!(b.allocate(1), Some(NodeSet::single(3)));
        assert_eq!(b.allocate(1), None);
        // A node that fails while allocated stays out when its job ends.
        b.set_unavailable(5);
        b.release(&NodeSet::range(4, 7));
        assert_eq!(b.free_count(), 3);
        b.set_available(5);
        b.set_available(2);
        b.release(&NodeSet::range(0, 1));
        b.release(&NodeSet::single(3));
        assert!(b.fits_aligned(8), "everything merges back once available");
    }

    #[test]
    fn a_job_fits_around_an_unavailable_node() {
        let mut b = Buddy::new(4);
        b.set_unavailable(3);
        assert_eq!(
            b.allocate(3),
            Some(NodeSet::range(0, 2)),
            "the 3 nodes left"
        );
        let mut b = Buddy::new(4);
        b.set_unavailable(0);
        assert_eq!(b.allocate(2), Some(NodeSet::range(2, 3)));
        assert_eq!(b.allocate(1), Some(NodeSet::single(1)));
        assert_eq!(b.allocate(1), None);
        // No aligned block of 4 holds 3 usable nodes: they are taken scattered.
        let mut b = Buddy::new(4);
        b.set_unavailable(2);
        assert_eq!(b.allocate(3), Some("0-1,3".parse().unwrap()));
        assert_eq!(b.free_count(), 0);
        b.set_available(2);
        b.release(&"0-1,3".parse().unwrap());
        assert!(b.fits_aligned(4), "the scattered nodes merge back");
    }

    proptest! {
        #[test]
        fn unavailable_nodes_stay_out_and_come_back(
            n in 1u32..40,
            ops in proptest::collection::vec((0u8..4, 0u32..40, 1u32..12), 1..80)) {
            let mut b = Buddy::new(n);
            let mut held: Vec<NodeSet> = Vec::new();
            let mut down: BTreeSet<u32> = BTreeSet::new();
            for (op, node, k) in ops {
                match op {
                    0 => if let Some(s) = b.allocate(k) {
                        for d in &down {
                            prop_assert!(!s.contains(*d), "{:?} includes unavailable {}", s, d);
                        }
                        held.push(s);
                    },
                    1 => if !held.is_empty() {
                        let s = held.remove(0);
                        b.release(&s);
                    },
                    2 => if node < n {
                        b.set_unavailable(node);
                        down.insert(node);
                    },
                    _ => {
                        b.set_available(node);
                        down.remove(&node);
                    }
                }
                let in_use: NodeSet = held.iter().fold(NodeSet::new(), |a, s| a.union(s));
                let free = b.free_set();
                prop_assert!(free.is_disjoint(&in_use));
                for d in &down {
                    prop_assert!(!free.contains(*d));
                }
                let out = down.iter().filter(|d| !in_use.contains(**d)).count() as u32;
                prop_assert_eq!(b.free_count() + in_use.len() as u32 + out, n);
            }
            for s in held.drain(..) {
                b.release(&s);
            }
            for d in std::mem::take(&mut down) {
                b.set_available(d);
            }
            prop_assert!(b.fits_aligned(n));
        }

        #[test]
        fn allocations_never_overlap_and_freeing_everything_restores_the_pool(
            n in 1u32..70, ops in proptest::collection::vec((1u32..20, any::<bool>()), 1..60)) {
            let mut b = Buddy::new(n);
            let mut held: Vec<NodeSet> = Vec::new();
            for (k, free_one) in ops {
                if free_one && !held.is_empty() {
                    let s = held.remove(0);
                    b.release(&s);
                } else if let Some(s) = b.allocate(k) {
                    prop_assert_eq!(s.len() as u32, k);
                    prop_assert!(s.last().unwrap() < n);
                    for h in &held {
                        prop_assert!(h.is_disjoint(&s), "{:?} overlaps {:?}", h, s);
                    }
                    held.push(s);
                }
                let in_use: u32 = held.iter().map(|s| s.len() as u32).sum();
                prop_assert_eq!(b.free_count() + in_use, n);
                let free = b.free_set();
                for h in &held {
                    prop_assert!(free.is_disjoint(h));
                }
            }
            for s in held.drain(..) {
                b.release(&s);
            }
            prop_assert_eq!(b.free_count(), n);
            prop_assert!(b.fits_aligned(n), "fully merged: the whole cluster is free again");
        }
    }
}
