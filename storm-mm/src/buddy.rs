//! Buddy allocation of nodes (paper Sec. 2.2, after Feitelson's packing schemes).
//!
//! Nodes `0..n` are the leaves of a binary buddy tree over the next power of two. A request
//! for `k` nodes takes the lowest free aligned block of `2^ceil(log2 k)` nodes and gives the
//! unused tail of that block back as smaller buddy blocks, so jobs get contiguous, aligned
//! ranges (which keeps the node sets compact and the gang-scheduling matrix tidy) and no node
//! is wasted. Freed blocks merge with free buddies. Pure bookkeeping: no I/O.

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
        };
        b.release_range(0, total);
        b
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

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

    /// Number of free (real) nodes.
    pub fn free_count(&self) -> u32 {
        self.blocks().map(|(s, e)| e - s).sum()
    }

    /// The free nodes.
    pub fn free_set(&self) -> NodeSet {
        self.blocks().flat_map(|(s, e)| s..e).collect()
    }

    /// The lowest free block of order at least `want` whose first `k` leaves are real nodes.
    fn find(&self, k: u32, want: usize) -> Option<(usize, u32)> {
        (want..self.free.len()).find_map(|o| {
            self.free[o]
                .iter()
                .find(|&&s| s + k <= self.nodes)
                .map(|&s| (o, s))
        })
    }

    /// Takes `k` nodes, or `None` if no aligned block is free.
    pub fn allocate(&mut self, k: u32) -> Option<NodeSet> {
        if k == 0 || k > self.nodes {
            return None;
        }
        let want = order_for(k);
        let (order, start) = self.find(k, want)?;
        self.free[order].remove(&start);
        // Split down to the wanted order, freeing the upper halves.
        for o in (want..order).rev() {
            self.free[o].insert(start + (1 << o));
        }
        // Give back the tail of the block the job does not use.
        self.release_range(start + k, start + (1 << want));
        Some(NodeSet::range(start, start + k - 1))
    }

    /// Returns nodes to the pool.
    pub fn release(&mut self, set: &NodeSet) {
        for &(lo, hi) in set.ranges() {
            self.release_range(lo, hi.saturating_add(1).min(self.nodes));
        }
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

    proptest! {
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
            prop_assert!(b.fits(n), "fully merged: the whole cluster is free again");
        }
    }
}
