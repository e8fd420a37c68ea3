//! Allocation of CPUs, the columns of the Ousterhout matrix (the paper's processing
//! elements), by buddy allocation at two levels.
//!
//! * A job that needs several nodes, or asks for them whole (`--exclusive`), takes whole
//!   nodes from a buddy allocator over the nodes ([`Need::Nodes`]).
//! * A job whose tasks fit on one node takes that many of one node's CPUs
//!   ([`Need::Cpus`]) from a buddy allocator over that node's CPUs, so several small jobs
//!   share a node side by side. It goes to the shared node where it fits most tightly (which
//!   keeps whole nodes free for large jobs), else it opens a whole free node for sharing.
//!
//! A node counts as free for whole-node jobs only while no job holds any of its CPUs. Every
//! node is planned with the same number of CPUs (the smallest node's, as
//! `storm_cluster::tasks` plans task counts). Pure bookkeeping: no I/O.

use std::collections::BTreeMap;

use storm_primitives::{NodeId, NodeSet};

use crate::buddy::Buddy;

/// What a job needs of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// This many whole nodes.
    Nodes(u32),
    /// This many CPUs of one node, which other jobs may share.
    Cpus(u32),
}

impl Need {
    /// The need of a job of `ntasks` tasks on `nodes` nodes of `cpus` CPUs: CPUs of one node
    /// when its tasks fit on one node and it does not ask for whole nodes, else whole nodes.
    pub fn of(nodes: u32, ntasks: u32, cpus: u32, exclusive: bool) -> Self {
        if !exclusive && nodes == 1 && ntasks < cpus {
            Need::Cpus(ntasks.max(1))
        } else {
            Need::Nodes(nodes)
        }
    }

    /// "3 free nodes", "2 free CPUs of a node".
    pub fn describe(&self) -> String {
        match *self {
            Need::Nodes(n) => format!("{n} free nodes"),
            Need::Cpus(1) => "1 free CPU of a node".into(),
            Need::Cpus(c) => format!("{c} free CPUs of a node"),
        }
    }
}

/// What a job holds: whole nodes, or some CPUs (their indices within the node) of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub nodes: NodeSet,
    /// For a job sharing its one node: which of its CPUs.
    pub cpus: Option<NodeSet>,
}

impl Share {
    /// Whole nodes.
    pub fn whole(nodes: NodeSet) -> Self {
        Self { nodes, cpus: None }
    }

    /// CPUs `cpus` of node `node`.
    pub fn cpus_of(node: NodeId, cpus: NodeSet) -> Self {
        Self {
            nodes: NodeSet::single(node),
            cpus: Some(cpus),
        }
    }

    /// Whether the two hold a CPU in common.
    pub fn overlaps(&self, other: &Share) -> bool {
        if self.nodes.is_disjoint(&other.nodes) {
            return false;
        }
        match (&self.cpus, &other.cpus) {
            (Some(a), Some(b)) => !a.is_disjoint(b),
            _ => true,
        }
    }
}

/// The CPUs a set of jobs holds, for asking quickly whether another job's are all idle.
#[derive(Debug, Clone, Default)]
pub struct Occupancy {
    /// Nodes held whole.
    whole: NodeSet,
    /// Nodes with some CPUs held by jobs sharing them, and which CPUs.
    shared: BTreeMap<NodeId, NodeSet>,
}

impl Occupancy {
    /// Whether none of `share`'s CPUs is held.
    pub fn is_idle(&self, share: &Share) -> bool {
        match &share.cpus {
            None => {
                share.nodes.is_disjoint(&self.whole)
                    && share.nodes.iter().all(|n| !self.shared.contains_key(&n))
            }
            Some(cpus) => share.nodes.iter().all(|n| {
                !self.whole.contains(n) && self.shared.get(&n).is_none_or(|c| c.is_disjoint(cpus))
            }),
        }
    }

    /// Marks `share`'s CPUs held.
    pub fn hold(&mut self, share: &Share) {
        match &share.cpus {
            None => self.whole = self.whole.union(&share.nodes),
            Some(cpus) => {
                for n in share.nodes.iter() {
                    let held = self.shared.entry(n).or_default();
                    *held = held.union(cpus);
                }
            }
        }
    }
}

/// Buddy allocation of whole nodes and of the CPUs of shared nodes.
#[derive(Debug, Clone)]
pub struct Allocator {
    /// CPUs of every node.
    cpus: u32,
    /// Nodes of which no job holds a CPU.
    nodes: Buddy,
    /// Nodes that jobs share, with their CPUs' allocator.
    shared: BTreeMap<NodeId, Buddy>,
    /// Nodes kept out of allocation (down, drained, not registered).
    unavailable: NodeSet,
}

impl Allocator {
    /// `nodes` free nodes of `cpus` CPUs each.
    pub fn new(nodes: u32, cpus: u32) -> Self {
        Self {
            cpus: cpus.max(1),
            nodes: Buddy::new(nodes),
            shared: BTreeMap::new(),
            unavailable: NodeSet::new(),
        }
    }

    /// CPUs of every node.
    pub fn cpus_per_node(&self) -> u32 {
        self.cpus
    }

    /// Takes what `need` asks for, or `None` if it is not free now. Whole nodes come as an
    /// aligned block where one is free (see [`Buddy::allocate`]); CPUs come from the shared
    /// node with the fewest free CPUs that fit them, else from a whole free node.
    pub fn allocate(&mut self, need: Need) -> Option<Share> {
        match need {
            Need::Nodes(k) => self.nodes.allocate(k).map(Share::whole),
            Need::Cpus(k) if k == 0 || k > self.cpus => None,
            Need::Cpus(k) => {
                let tightest = self
                    .shared
                    .iter()
                    .filter(|(n, b)| !self.unavailable.contains(**n) && b.fits(k))
                    .min_by_key(|(n, b)| (b.free_count(), **n))
                    .map(|(n, _)| *n);
                let node = match tightest {
                    Some(n) => n,
                    None => {
                        let n = self.nodes.allocate(1)?.first()?;
                        self.shared.insert(n, Buddy::new(self.cpus));
                        n
                    }
                };
                let cpus = self.shared.get_mut(&node)?.allocate(k)?;
                Some(Share::cpus_of(node, cpus))
            }
        }
    }

    /// As [`Allocator::allocate`], but none of `avoid` (nodes without the job's features,
    /// or without room for its memory: `crate::policy::fit`).
    pub fn allocate_avoiding(&mut self, need: Need, avoid: &NodeSet) -> Option<Share> {
        if avoid.is_empty() {
            return self.allocate(need);
        }
        let kept_out: Vec<NodeId> = avoid
            .iter()
            .filter(|n| !self.unavailable.contains(*n))
            .collect();
        for &n in &kept_out {
            self.set_unavailable(n);
        }
        let got = self.allocate(need);
        for &n in &kept_out {
            self.set_available(n);
        }
        got
    }

    /// Takes exactly `share` (a job that held it before the MM restarted takes it back),
    /// available or not. False, taking nothing, if any of it is not free.
    pub fn take(&mut self, share: &Share) -> bool {
        let Some(cpus) = &share.cpus else {
            return self.nodes.take(&share.nodes);
        };
        let (Some(node), 1) = (share.nodes.first(), share.nodes.len()) else {
            return false;
        };
        if cpus.last().is_none_or(|c| c >= self.cpus) {
            return false;
        }
        let opened = !self.shared.contains_key(&node);
        if opened {
            if !self.nodes.take(&share.nodes) {
                return false;
            }
            self.shared.insert(node, Buddy::new(self.cpus));
        }
        if self.shared.get_mut(&node).is_some_and(|b| b.take(cpus)) {
            return true;
        }
        if opened {
            self.shared.remove(&node);
            self.nodes.release(&share.nodes);
        }
        false
    }

    /// Gives `share` back. A shared node whose CPUs are all free again is a free node.
    pub fn release(&mut self, share: &Share) {
        let Some(cpus) = &share.cpus else {
            self.nodes.release(&share.nodes);
            return;
        };
        for node in share.nodes.iter() {
            let Some(b) = self.shared.get_mut(&node) else {
                continue;
            };
            b.release(cpus);
            if b.free_count() == self.cpus {
                self.shared.remove(&node);
                self.nodes.release(&NodeSet::single(node));
            }
        }
    }

    /// Keeps `node` out of every allocation from now on; jobs holding it keep it.
    pub fn set_unavailable(&mut self, node: NodeId) {
        self.nodes.set_unavailable(node);
        self.unavailable.insert(node);
    }

    /// Lets `node` be allocated again.
    pub fn set_available(&mut self, node: NodeId) {
        self.nodes.set_available(node);
        self.unavailable.remove(node);
    }

    /// Whole nodes free and available.
    pub fn free_nodes(&self) -> u32 {
        self.nodes.free_count()
    }

    /// CPUs free and available, on whole free nodes and on shared ones (not all of them may
    /// be in one node).
    pub fn free_cpus(&self) -> u32 {
        let shared: u32 = self
            .shared
            .iter()
            .filter(|(n, _)| !self.unavailable.contains(**n))
            .map(|(_, b)| b.free_count())
            .sum();
        self.free_nodes() * self.cpus + shared
    }

    /// How much of what `need` counts is free, as the reason a job waits gives it: "0 free
    /// now" of nodes, or of CPUs.
    pub fn describe_free(&self, need: Need) -> String {
        match need {
            Need::Nodes(_) => format!("{} free now", self.free_nodes()),
            Need::Cpus(_) => format!("{} free now", self.free_cpus()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_jobs_share_a_node_and_large_ones_take_whole_nodes() {
        let mut a = Allocator::new(4, 4);
        let one = a.allocate(Need::Cpus(1)).unwrap();
        let two = a.allocate(Need::Cpus(2)).unwrap();
        assert_eq!(one.nodes, NodeSet::single(0));
        assert_eq!(two.nodes, NodeSet::single(0), "packed beside the first");
        assert!(!one.overlaps(&two));
        assert_eq!(a.free_nodes(), 3);
        let big = a.allocate(Need::Nodes(2)).unwrap();
        assert_eq!(big.nodes, NodeSet::range(2, 3), "an aligned block");
        assert_eq!(a.free_cpus(), 4 + 1);
        let three = a.allocate(Need::Cpus(3)).unwrap();
        assert_eq!(
            three.nodes,
            NodeSet::single(1),
            "node 0 has only one CPU left"
        );
        assert_eq!(a.allocate(Need::Nodes(1)), None);
        a.release(&one);
        a.release(&two);
        assert_eq!(
            a.free_nodes(),
            1,
            "node 0 is whole again once its CPUs are free"
        );
        assert_eq!(
            a.allocate(Need::Nodes(1)).unwrap().nodes,
            NodeSet::single(0)
        );
    }

    #[test]
    fn a_shared_node_that_goes_down_takes_no_more_jobs_but_keeps_its_own() {
        let mut a = Allocator::new(2, 2);
        let first = a.allocate(Need::Cpus(1)).unwrap();
        a.set_unavailable(0);
        let second = a.allocate(Need::Cpus(1)).unwrap();
        assert_eq!(second.nodes, NodeSet::single(1));
        a.release(&first);
        assert_eq!(a.free_nodes(), 0, "node 0 is free but unavailable");
        a.set_available(0);
        assert_eq!(a.free_nodes(), 1);
    }

    #[test]
    fn a_share_taken_back_is_exactly_the_one_held() {
        let mut a = Allocator::new(2, 4);
        let held = Share::cpus_of(1, NodeSet::range(2, 3));
        assert!(a.take(&held));
        assert!(!a.take(&held), "not twice");
        assert!(!a.take(&Share::whole(NodeSet::single(1))));
        assert!(!a.take(&Share::cpus_of(0, NodeSet::single(4))), "no CPU 4");
        let next = a.allocate(Need::Cpus(2)).unwrap();
        assert_eq!(next, Share::cpus_of(1, NodeSet::range(0, 1)));
        assert!(a.take(&Share::whole(NodeSet::single(0))));
    }

    #[test]
    fn occupancy_tells_whole_nodes_from_cpus() {
        let mut o = Occupancy::default();
        o.hold(&Share::cpus_of(0, NodeSet::single(0)));
        assert!(o.is_idle(&Share::cpus_of(0, NodeSet::single(1))));
        assert!(!o.is_idle(&Share::cpus_of(0, NodeSet::range(0, 1))));
        assert!(!o.is_idle(&Share::whole(NodeSet::range(0, 1))));
        o.hold(&Share::whole(NodeSet::single(1)));
        assert!(!o.is_idle(&Share::cpus_of(1, NodeSet::single(3))));
        assert!(o.is_idle(&Share::whole(NodeSet::single(2))));
    }

    #[test]
    fn the_need_follows_the_plan() {
        assert_eq!(Need::of(1, 1, 2, false), Need::Cpus(1));
        assert_eq!(
            Need::of(1, 2, 2, false),
            Need::Nodes(1),
            "a full node is whole"
        );
        assert_eq!(Need::of(1, 1, 2, true), Need::Nodes(1), "--exclusive");
        assert_eq!(Need::of(2, 2, 4, false), Need::Nodes(2));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(Need),
        Release(usize),
        Down(u32),
        Up(u32),
    }

    fn op(nodes: u32, cpus: u32) -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1..=cpus).prop_map(|k| Op::Alloc(Need::Cpus(k))),
            2 => (1..=nodes).prop_map(|k| Op::Alloc(Need::Nodes(k))),
            2 => (0usize..64).prop_map(Op::Release),
            1 => (0..nodes).prop_map(Op::Down),
            1 => (0..nodes).prop_map(Op::Up),
        ]
    }

    proptest! {
        /// Whatever the order of requests, releases and failures: no CPU is held twice, a
        /// share is what was asked for, nothing is handed out on a node that is unavailable,
        /// a job never waits while what it needs is free, and everything released is free
        /// again.
        #[test]
        fn shares_never_overlap_and_nothing_is_lost(
            (nodes, cpus, ops) in (1u32..9, 1u32..9).prop_flat_map(|(n, c)| {
                (Just(n), Just(c), proptest::collection::vec(op(n, c), 1..80))
            })
        ) {
            let mut a = Allocator::new(nodes, cpus);
            let mut held: Vec<Share> = Vec::new();
            let mut down = NodeSet::new();
            for op in ops {
                match op {
                    Op::Alloc(need) => {
                        let before = a.free_cpus();
                        let free_nodes = a.free_nodes();
                        match a.allocate(need) {
                            Some(s) => {
                                for h in &held {
                                    prop_assert!(!h.overlaps(&s), "{s:?} overlaps {h:?}");
                                }
                                prop_assert!(s.nodes.is_disjoint(&down), "{s:?} on a down node");
                                match need {
                                    Need::Nodes(k) => {
                                        prop_assert_eq!(s.nodes.len() as u32, k);
                                        prop_assert!(s.cpus.is_none());
                                    }
                                    Need::Cpus(k) => {
                                        prop_assert_eq!(s.nodes.len(), 1);
                                        let c = s.cpus.clone().unwrap();
                                        prop_assert_eq!(c.len() as u32, k);
                                        prop_assert!(c.last().unwrap() < cpus);
                                    }
                                }
                                prop_assert!(a.free_cpus() < before || before == 0);
                                held.push(s);
                            }
                            None => match need {
                                Need::Nodes(k) => prop_assert!(free_nodes < k),
                                Need::Cpus(k) => {
                                    prop_assert!(free_nodes == 0 || k > cpus);
                                    // Every available shared node lacks k free CPUs.
                                    for (n, b) in &a.shared {
                                        prop_assert!(down.contains(*n) || b.free_count() < k);
                                    }
                                }
                            },
                        }
                    }
                    Op::Release(i) if !held.is_empty() => {
                        let s = held.swap_remove(i % held.len());
                        a.release(&s);
                    }
                    Op::Release(_) => {}
                    Op::Down(n) => {
                        a.set_unavailable(n);
                        down.insert(n);
                    }
                    Op::Up(n) => {
                        a.set_available(n);
                        down.remove(n);
                    }
                }
            }
            for s in held.drain(..) {
                a.release(&s);
            }
            for n in down.iter() {
                a.set_available(n);
            }
            prop_assert_eq!(a.free_nodes(), nodes, "everything is free again");
            prop_assert!(a.shared.is_empty());
        }
    }
}
