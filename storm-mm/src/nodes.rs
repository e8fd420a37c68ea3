//! The MM's table of nodes: each node's membership (unknown, joining, up, down), the missed
//! heartbeats that lead to DOWN, and the operator's drain. Pure bookkeeping: the manager does
//! the talking (docs/operations.md describes the states as an operator sees them).

use std::time::{Duration, Instant};

use storm_primitives::{NodeId, NodeSet};

/// Where a node stands with the MM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Life {
    /// Its NM has not registered since the MM started.
    Unknown,
    /// Its NM registered with `stamp`; the MM welcomed it at `sent` and waits for the
    /// acknowledgement.
    Joining { stamp: u64, sent: Instant },
    /// A member: it receives every heartbeat.
    Up { stamp: u64 },
    /// Failed; out of the heartbeat and of allocation until its NM registers again.
    Down { reason: String, since: Instant },
}

#[derive(Debug, Clone)]
pub struct Node {
    pub life: Life,
    /// Set by `storm drain`: kept out of allocation until `storm resume`.
    pub drain: Option<String>,
    /// The last registration stamp the MM acted on.
    pub stamp_seen: u64,
    /// Epoch of the node's output queue in its current membership.
    pub output_epoch: u32,
    /// When the MM last told this node (down or unknown) to register.
    pub last_nudge: Option<Instant>,
    /// When a heartbeat last reached this node (or it joined).
    last_heard: Option<Instant>,
    /// Consecutive receipt checks that found this node behind.
    lagging: u32,
}

/// Every node of the cluster.
#[derive(Debug, Clone)]
pub struct NodeTable {
    nodes: Vec<Node>,
    /// K: misses (or lagging checks) that make a node DOWN.
    limit: u32,
}

impl NodeTable {
    pub fn new(count: u32, limit: u32) -> Self {
        let node = Node {
            life: Life::Unknown,
            drain: None,
            stamp_seen: 0,
            output_epoch: 1,
            last_nudge: None,
            last_heard: None,
            lagging: 0,
        };
        Self {
            nodes: vec![node; count as usize],
            limit: limit.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn get(&self, n: NodeId) -> &Node {
        &self.nodes[n as usize]
    }

    pub fn get_mut(&mut self, n: NodeId) -> &mut Node {
        &mut self.nodes[n as usize]
    }

    pub fn is_up(&self, n: NodeId) -> bool {
        matches!(self.nodes[n as usize].life, Life::Up { .. })
    }

    /// Up and not drained: the policy may give it to jobs.
    pub fn is_available(&self, n: NodeId) -> bool {
        self.is_up(n) && self.nodes[n as usize].drain.is_none()
    }

    pub fn available_count(&self) -> u32 {
        (0..self.nodes.len() as NodeId)
            .filter(|&n| self.is_available(n))
            .count() as u32
    }

    pub fn up_count(&self) -> u32 {
        (0..self.nodes.len() as NodeId)
            .filter(|&n| self.is_up(n))
            .count() as u32
    }

    pub fn down_set(&self) -> NodeSet {
        (0..self.nodes.len() as NodeId)
            .filter(|&n| matches!(self.nodes[n as usize].life, Life::Down { .. }))
            .collect()
    }

    /// A heartbeat addressed to `n` failed because of it (its connection closed or was
    /// refused, or timed out). The node has missed every heartbeat since the last one that
    /// reached it: true if that is K heartbeat intervals (`interval`) or more.
    pub fn missed(&mut self, n: NodeId, now: Instant, interval: Duration) -> bool {
        let Some(heard) = self.nodes[n as usize].last_heard else {
            return true;
        };
        let silent = now.saturating_duration_since(heard);
        silent.as_nanos() >= interval.as_nanos().max(1) * self.limit as u128
    }

    /// A heartbeat issued at `sent` reached every member.
    pub fn heard_all(&mut self, sent: Instant) {
        for node in &mut self.nodes {
            if matches!(node.life, Life::Up { .. }) {
                node.last_heard = Some(sent);
            }
        }
    }

    /// A receipt check found `n` behind; true if it has been behind K checks in a row.
    pub fn lagging(&mut self, n: NodeId) -> bool {
        let node = &mut self.nodes[n as usize];
        node.lagging += 1;
        node.lagging >= self.limit
    }

    /// A receipt check found `n` caught up.
    pub fn caught_up(&mut self, n: NodeId) {
        self.nodes[n as usize].lagging = 0;
    }

    /// Marks `n` up with registration `stamp`.
    pub fn set_up(&mut self, n: NodeId, stamp: u64) {
        let node = &mut self.nodes[n as usize];
        node.life = Life::Up { stamp };
        node.last_heard = Some(Instant::now());
        node.lagging = 0;
    }

    /// Marks `n` down; false if it already was.
    pub fn set_down(&mut self, n: NodeId, reason: String, now: Instant) -> bool {
        let node = &mut self.nodes[n as usize];
        if matches!(node.life, Life::Down { .. }) {
            return false;
        }
        node.life = Life::Down { reason, since: now };
        node.last_heard = None;
        node.lagging = 0;
        node.last_nudge = Some(now);
        true
    }

    /// The state `storm nodes` shows, and why.
    pub fn describe(&self, n: NodeId, has_jobs: bool) -> (&'static str, Option<String>) {
        let node = &self.nodes[n as usize];
        let drain = node.drain.clone();
        match (&node.life, has_jobs) {
            (Life::Unknown, _) => ("unknown", drain),
            (Life::Joining { .. }, _) => ("joining", drain),
            (Life::Down { reason, .. }, _) => (
                "down",
                Some(match drain {
                    Some(d) => format!("{reason}; drained: {d}"),
                    None => reason.clone(),
                }),
            ),
            (Life::Up { .. }, true) if drain.is_some() => ("draining", drain),
            (Life::Up { .. }, false) if drain.is_some() => ("drained", drain),
            (Life::Up { .. }, true) => ("allocated", None),
            (Life::Up { .. }, false) => ("idle", None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_down_once_k_heartbeat_intervals_passed_since_it_last_heard_one() {
        let ms = Duration::from_millis;
        let mut t = NodeTable::new(4, 3);
        t.set_up(1, 7);
        let t0 = Instant::now();
        t.heard_all(t0);
        assert!(!t.missed(1, t0 + ms(1), ms(1)), "one interval: one miss");
        assert!(!t.missed(1, t0 + ms(2), ms(1)));
        assert!(t.missed(1, t0 + ms(3), ms(1)), "the third interval");
        t.heard_all(t0 + ms(3));
        assert!(
            !t.missed(1, t0 + ms(4), ms(1)),
            "a heartbeat that arrived resets the count"
        );
        assert!(
            t.missed(1, t0 + ms(500), ms(1)),
            "a failure after 500 intervals of silence (a cut link)"
        );
    }

    #[test]
    fn lagging_checks_count_separately_and_reset_when_caught_up() {
        let mut t = NodeTable::new(2, 2);
        t.set_up(0, 1);
        assert!(!t.lagging(0));
        t.caught_up(0);
        assert!(!t.lagging(0));
        assert!(t.lagging(0));
    }

    #[test]
    fn states_as_storm_nodes_shows_them() {
        let mut t = NodeTable::new(3, 3);
        assert_eq!(t.describe(0, false).0, "unknown");
        t.set_up(0, 1);
        assert_eq!(t.describe(0, false), ("idle", None));
        assert_eq!(t.describe(0, true), ("allocated", None));
        t.get_mut(0).drain = Some("bad fan".into());
        assert_eq!(t.describe(0, true), ("draining", Some("bad fan".into())));
        assert_eq!(t.describe(0, false), ("drained", Some("bad fan".into())));
        assert!(!t.is_available(0), "drained nodes are not allocated");
        assert!(t.set_down(0, "missed 3 heartbeats".into(), Instant::now()));
        assert!(!t.set_down(0, "again".into(), Instant::now()));
        assert_eq!(
            t.describe(0, false),
            ("down", Some("missed 3 heartbeats; drained: bad fan".into()))
        );
        assert_eq!(t.down_set(), NodeSet::single(0));
        assert_eq!(t.up_count(), 0);
    }
}
