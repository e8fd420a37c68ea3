//! k-ary spanning trees over a node set, computed identically on every node.
//!
//! The tree has the root at position 0 and the other members in ascending id order at
//! positions 1.., laid out like a binary heap generalised to `fanout` children: the children of
//! position `p` are `fanout*p + 1 ..= fanout*p + fanout`. Any node that knows the root, the
//! member set and the fanout (all carried in an operation's header) can find its parent and
//! children without asking anyone, in time proportional to the number of ranges in the set.

use std::time::Duration;

use crate::nodeset::{NodeId, NodeSet};

#[derive(Debug, Clone)]
pub struct Tree {
    root: NodeId,
    /// Members other than the root.
    others: NodeSet,
    fanout: usize,
}

impl Tree {
    /// A tree rooted at `root` spanning `root` and every node of `members`.
    pub fn new(root: NodeId, members: &NodeSet, fanout: usize) -> Self {
        let mut others = members.clone();
        others.remove(root);
        Self {
            root,
            others,
            fanout: fanout.max(1),
        }
    }

    pub fn root(&self) -> NodeId {
        self.root
    }

    /// Nodes in the tree, root included.
    pub fn size(&self) -> usize {
        self.others.len() + 1
    }

    fn position(&self, node: NodeId) -> Option<usize> {
        if node == self.root {
            Some(0)
        } else {
            self.others.rank(node).map(|r| r + 1)
        }
    }

    fn at(&self, pos: usize) -> Option<NodeId> {
        if pos == 0 {
            Some(self.root)
        } else {
            self.others.nth(pos - 1)
        }
    }

    pub fn contains(&self, node: NodeId) -> bool {
        self.position(node).is_some()
    }

    /// The parent of `node`, `None` for the root or a non-member.
    pub fn parent(&self, node: NodeId) -> Option<NodeId> {
        match self.position(node)? {
            0 => None,
            pos => self.at((pos - 1) / self.fanout),
        }
    }

    /// The children of `node`, in ascending position.
    pub fn children(&self, node: NodeId) -> Vec<NodeId> {
        let Some(pos) = self.position(node) else {
            return Vec::new();
        };
        let size = self.size();
        let first = pos.saturating_mul(self.fanout).saturating_add(1);
        (first..first.saturating_add(self.fanout))
            .take_while(|&p| p < size)
            .filter_map(|p| self.at(p))
            .collect()
    }

    /// Edges on the longest root-to-leaf path.
    pub fn depth(&self) -> usize {
        depth_of(self.size(), self.fanout)
    }

    /// Edges from the root to `node` (0 for the root and for a non-member).
    pub fn level(&self, node: NodeId) -> usize {
        let mut pos = self.position(node).unwrap_or(0);
        let mut level = 0;
        while pos > 0 {
            pos = (pos - 1) / self.fanout;
            level += 1;
        }
        level
    }

    /// How long `node` waits for its children in an operation whose root waits `timeout`.
    ///
    /// Each level down waits `timeout / (2 D)` less than the one above it, in a tree of depth
    /// D: the root waits all of it, a node at level L waits (2D - L) / 2D of it, and none less
    /// than half. So the lowest node whose child is silent gives up first, by a margin of
    /// `timeout / 2D` over its parent, and its report (naming that child, not the healthy nodes
    /// above it) reaches the parent before the parent gives up itself; a loaded host that runs
    /// a node's timer late by less than that margin still blames the right node. And no node
    /// blames a child that had less than half the timeout to answer.
    pub fn patience(&self, node: NodeId, timeout: Duration) -> Duration {
        let depth = self.depth().max(1) as u32;
        let level = (self.level(node) as u32).min(depth);
        timeout * (2 * depth - level) / (2 * depth)
    }
}

/// Depth of a `fanout`-ary heap-shaped tree of `size` nodes.
pub fn depth_of(size: usize, fanout: usize) -> usize {
    let fanout = fanout.max(1);
    if fanout == 1 {
        return size.saturating_sub(1);
    }
    let mut depth = 0;
    let mut last = size.saturating_sub(1);
    while last > 0 {
        last = (last - 1) / fanout;
        depth += 1;
    }
    depth
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lower_levels_give_up_first_by_an_even_share_of_the_timeout() {
        // 0 -> 1,2; 1 -> 3,4; 2 -> 5,6; 3 -> 7: depth 3, so levels are 1/6 of it apart.
        let t = Tree::new(0, &NodeSet::first_n(8), 2);
        let six = Duration::from_secs(6);
        assert_eq!(t.level(0), 0);
        assert_eq!(t.level(2), 1);
        assert_eq!(t.level(5), 2);
        assert_eq!(t.level(7), 3);
        assert_eq!(t.patience(0, six), Duration::from_secs(6));
        assert_eq!(t.patience(1, six), Duration::from_secs(5));
        assert_eq!(t.patience(3, six), Duration::from_secs(4));
        // A leaf waits for no one; no level waits less than half.
        assert_eq!(t.patience(7, six), Duration::from_secs(3));
        // A lone root waits all of it.
        let alone = Tree::new(4, &NodeSet::single(4), 2);
        assert_eq!(alone.patience(4, six), six);
    }

    #[test]
    fn binary_tree_over_a_range() {
        let t = Tree::new(0, &NodeSet::first_n(7), 2);
        assert_eq!(t.children(0), vec![1, 2]);
        assert_eq!(t.children(1), vec![3, 4]);
        assert_eq!(t.children(2), vec![5, 6]);
        assert_eq!(t.children(3), Vec::<u32>::new());
        assert_eq!(t.parent(6), Some(2));
        assert_eq!(t.depth(), 2);
    }

    #[test]
    fn root_outside_the_member_set_is_position_zero() {
        let members: NodeSet = "10-12,20".parse().unwrap();
        let t = Tree::new(3, &members, 2);
        assert_eq!(t.size(), 5);
        assert_eq!(t.children(3), vec![10, 11]);
        assert_eq!(t.children(10), vec![12, 20]);
        assert_eq!(t.parent(20), Some(10));
        assert_eq!(t.parent(3), None);
        assert_eq!(t.parent(4), None, "non-member");
        assert!(t.children(4).is_empty());
    }

    proptest! {
        #[test]
        fn every_member_is_reached_exactly_once_from_the_root(
            ids in proptest::collection::btree_set(0u32..200, 0..60),
            root in 0u32..200, fanout in 1usize..6) {
            let members: NodeSet = ids.iter().copied().collect();
            let t = Tree::new(root, &members, fanout);
            let mut seen = vec![root];
            let mut frontier = vec![root];
            while let Some(n) = frontier.pop() {
                let kids = t.children(n);
                prop_assert!(kids.len() <= fanout);
                for k in kids {
                    prop_assert_eq!(t.parent(k), Some(n));
                    seen.push(k);
                    frontier.push(k);
                }
            }
            seen.sort_unstable();
            let mut expect = members.union(&NodeSet::single(root)).to_vec();
            expect.sort_unstable();
            prop_assert_eq!(seen, expect);
            // Depth matches the longest parent chain.
            let longest = t.others.iter().map(|mut n| {
                let mut d = 0;
                while let Some(p) = t.parent(n) { n = p; d += 1; }
                d
            }).max().unwrap_or(0);
            prop_assert_eq!(t.depth(), longest);
        }
    }
}
