//! What a node offers beyond its CPUs: memory, which every job placed on the node holds in
//! every time slot at once, and features, which `--constraint` selects by.
//!
//! CPUs are a column of the Ousterhout matrix: under gang scheduling two jobs may hold the
//! same CPU in different time slots, since they take turns. Memory is not: a suspended job
//! keeps its pages. So the policies keep one [`NodeFit`] across all their slots, and a job
//! that asks for memory (`--mem`, `--mem-per-cpu`) is placed only on nodes where it fits
//! beside every job already placed there, whatever their slots (Slurm's precondition for its
//! gang mode: all jobs fit in memory at once). A job that asks for none holds none.
//!
//! A node's memory is what the cluster file declares (`mem`), else what its NM detects when
//! it registers; until then it is 0, and jobs that ask for memory do not go there.

use std::collections::HashMap;

use storm_cluster::JobId;
use storm_primitives::{NodeId, NodeSet};

use super::JobAsk;

/// Memory and features of every node, and the memory placed jobs hold.
#[derive(Debug, Clone, Default)]
pub struct NodeFit {
    /// Bytes jobs may use on each node (0: not known yet).
    mem: Vec<u64>,
    /// Bytes held on each node by placed jobs, every time slot counted.
    held: Vec<u64>,
    /// Each node's features, one bit per feature of the cluster.
    features: Vec<u64>,
    /// What each placed job holds: its nodes, and the bytes on each.
    placed: HashMap<JobId, (NodeSet, u64)>,
}

impl NodeFit {
    /// `nodes` nodes of unknown memory, without features.
    pub fn new(nodes: u32) -> Self {
        Self::with_features(vec![0; nodes as usize])
    }

    /// Nodes with these features (one bit per feature), of unknown memory.
    pub fn with_features(features: Vec<u64>) -> Self {
        let n = features.len();
        Self {
            mem: vec![0; n],
            held: vec![0; n],
            features,
            placed: HashMap::new(),
        }
    }

    /// Nodes.
    pub fn len(&self) -> u32 {
        self.features.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
    }

    /// Node `node` offers `bytes` to jobs from now on (jobs placed there keep what they hold).
    pub fn set_memory(&mut self, node: NodeId, bytes: u64) {
        if let Some(m) = self.mem.get_mut(node as usize) {
            *m = bytes;
        }
    }

    /// The bytes node `node` offers.
    pub fn memory(&self, node: NodeId) -> u64 {
        self.mem.get(node as usize).copied().unwrap_or(0)
    }

    /// The bytes held on node `node`.
    pub fn held(&self, node: NodeId) -> u64 {
        self.held.get(node as usize).copied().unwrap_or(0)
    }

    /// Whether `ask` may go anywhere as far as memory and features go (nothing asked).
    pub fn indifferent(ask: &JobAsk) -> bool {
        ask.mem == 0 && ask.features == 0
    }

    /// Whether node `n` has the features `ask` wants, and room for its memory beside what is
    /// held there now (`now`), or at all (`!now`: what it would have once every job ended).
    fn suits(&self, n: usize, ask: &JobAsk, now: bool) -> bool {
        let held = if now { self.held[n] } else { 0 };
        self.features[n] & ask.features == ask.features
            && (ask.mem == 0 || self.mem[n].saturating_sub(held) >= ask.mem)
    }

    /// The nodes `ask` must not be given now: without its features, or without room for its
    /// memory beside the jobs placed there.
    pub fn avoid(&self, ask: &JobAsk) -> NodeSet {
        self.unsuited(ask, true)
    }

    /// The nodes `ask` could never be given (features, or memory with no job there).
    pub fn never(&self, ask: &JobAsk) -> NodeSet {
        self.unsuited(ask, false)
    }

    fn unsuited(&self, ask: &JobAsk, now: bool) -> NodeSet {
        let mut out = NodeSet::new();
        if Self::indifferent(ask) {
            return out;
        }
        for n in 0..self.features.len() {
            if !self.suits(n, ask, now) {
                out.insert(n as NodeId);
            }
        }
        out
    }

    /// Job `ask` was placed on `nodes`: it holds its memory there until [`NodeFit::release`].
    pub fn hold(&mut self, ask: &JobAsk, nodes: &NodeSet) {
        if ask.mem == 0 {
            return;
        }
        for n in nodes.iter() {
            if let Some(h) = self.held.get_mut(n as usize) {
                *h = h.saturating_add(ask.mem);
            }
        }
        self.placed.insert(ask.job, (nodes.clone(), ask.mem));
    }

    /// Job `job` ended: its memory is free.
    pub fn release(&mut self, job: JobId) {
        if let Some((nodes, mem)) = self.placed.remove(&job) {
            for n in nodes.iter() {
                if let Some(h) = self.held.get_mut(n as usize) {
                    *h = h.saturating_sub(mem);
                }
            }
        }
    }

    /// Why `ask` waits, as far as memory and features go: `None` if they are not what holds
    /// it back.
    pub fn reason(&self, ask: &JobAsk) -> Option<String> {
        // A job kept on its cluster's own nodes (guest slots aside) waits as any other.
        let named = ask.features & !storm_cluster::config::OWN_NODE_BIT;
        if ask.mem == 0 && named == 0 {
            return None;
        }
        let suited_now = (0..self.features.len())
            .filter(|&n| self.suits(n, ask, true))
            .count();
        let with_features = (0..self.features.len())
            .filter(|&n| self.features[n] & ask.features == ask.features)
            .count();
        Some(format!(
            "{suited_now} of {with_features} nodes{} have {} free now",
            if named != 0 { " with its features" } else { "" },
            storm_cluster::size::human_bytes(ask.mem)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Need;

    fn ask(job: JobId, mem: u64, features: u64) -> JobAsk {
        JobAsk {
            job,
            need: Need::Nodes(1),
            limit: None,
            mem,
            features,
        }
    }

    #[test]
    fn memory_is_held_across_jobs_and_features_are_required() {
        let mut f = NodeFit::with_features(vec![0b01, 0b11, 0b10]);
        for n in 0..3 {
            f.set_memory(n, 8 << 30);
        }
        let big = ask(1, 6 << 30, 0);
        assert!(f.avoid(&big).is_empty());
        f.hold(&big, &NodeSet::single(1));
        assert_eq!(f.held(1), 6 << 30);
        let second = ask(2, 4 << 30, 0);
        assert_eq!(f.avoid(&second), NodeSet::single(1), "6 + 4 > 8 GiB");
        assert_eq!(f.never(&second), NodeSet::new(), "it fits once job 1 ends");
        let picky = ask(3, 0, 0b10);
        assert_eq!(
            f.avoid(&picky),
            NodeSet::single(0),
            "node 0 lacks feature 1"
        );
        assert_eq!(
            f.reason(&second).unwrap(),
            "2 of 3 nodes have 4 GiB free now"
        );
        f.release(1);
        assert_eq!(f.held(1), 0);
        assert!(f.avoid(&second).is_empty());
        let unknown = NodeFit::new(2);
        assert_eq!(
            unknown.avoid(&ask(4, 1, 0)),
            NodeSet::range(0, 1),
            "nodes whose memory is unknown take no job that asks for memory"
        );
        assert!(unknown.avoid(&ask(5, 0, 0)).is_empty());
    }
}
