//! The MM's table of nodes: each node's membership (unknown, joining, up, unresponsive,
//! down), the silence that leads to DOWN, and the operator's drain. Pure bookkeeping: the
//! manager does the talking (docs/operations.md describes the states as an operator sees
//! them).
//!
//! **The rule.** A member that misses a heartbeat's deadline, or falls behind in taking them,
//! is *unresponsive*: it leaves the heartbeat (the others go on without it) and allocation,
//! keeps its jobs, and is told to register again. It is DOWN once K heartbeat periods have
//! passed since the last heartbeat it took, unless its NM registered again and was welcomed
//! back before then. Killed, frozen and cut-off nodes all follow this one rule; only how fast
//! they leave the heartbeat differs (a closed connection at once, silence at the deadline).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use storm_cluster::control::NodeState;
use storm_cluster::messages::Inventory;
use storm_primitives::{NodeId, NodeSet};

/// One NM process, as its registrations name it: its pid (a stamp's upper half) and when it
/// started by its node's own clock (the inventory's `since_ms`). Two registrations come from
/// the same process exactly when these are equal; the start time is only ever compared with
/// itself, so the node's clock need not agree with the MM's, and a pid that a later NM takes
/// again (an NM in a container is often pid 1) comes with another start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NmProcess {
    pub pid: u32,
    pub started_ms: u64,
}

impl NmProcess {
    /// The process that registered with `stamp` and `inventory`.
    pub fn of(stamp: u64, inventory: &Inventory) -> Self {
        Self {
            pid: (stamp >> 32) as u32,
            started_ms: inventory.since_ms,
        }
    }
}

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
    /// Missed a heartbeat's deadline (or fell behind): out of the heartbeat and of allocation,
    /// its jobs kept, waiting for its NM to register again; DOWN at K periods of silence.
    Unresponsive { stamp: u64, reason: String },
    /// Failed; out of the heartbeat and of allocation until its NM registers again.
    Down { reason: String, since: Instant },
}

#[derive(Debug, Clone)]
pub struct Node {
    life: Life,
    /// Set by `storm drain`: kept out of allocation until `storm resume`.
    pub drain: Option<String>,
    /// Lent to a peer cluster (`storm lend`, docs/federation.md): kept out of allocation
    /// until it comes home (`storm reclaim`, or the lease's end).
    pub lent: Option<storm_cluster::federation::Lease>,
    /// Set by the node's own health verdict (`storm_cluster::health`): kept out of
    /// allocation until a fresh verdict says it is healthy again.
    pub sick: Option<String>,
    /// A guest slot whose owner calls it home, and why (soft state: the owner says it again
    /// every period until its guest stops): kept out of allocation until it goes down.
    pub recalled: Option<String>,
    /// A guest slot lent on this cluster's asking and given back idle: its owner takes it
    /// home, so it is kept out of allocation until it goes down (a job placed on it meanwhile
    /// would lose it without notice).
    pub given_back: bool,
    /// A guest slot's lease, as its lender's grant says (Unix ms): it is a member until then
    /// at most.
    pub lease_until_ms: Option<u64>,
    /// The last registration stamp the MM acted on.
    pub stamp_seen: u64,
    /// The NM process of that registration; `None` before this MM heard from the node.
    pub nm: Option<NmProcess>,
    /// Epoch of the node's output queue in its current membership.
    pub output_epoch: u32,
    /// When the MM last told this node (down or unknown) to register.
    pub last_nudge: Option<Instant>,
    /// The jobs its current welcome lets it keep (sent again with the welcome).
    pub keep: Vec<storm_cluster::messages::JobId>,
    /// When the last heartbeat this node took was issued (or it joined); `None` once DOWN.
    /// For a member, the later of this and [`NodeTable::all_heard`].
    last_heard: Option<Instant>,
}

impl Node {
    pub fn life(&self) -> &Life {
        &self.life
    }
}

/// Every node of the cluster.
#[derive(Debug, Clone)]
pub struct NodeTable {
    nodes: Vec<Node>,
    /// K: heartbeat periods of silence that make a node DOWN.
    limit: u32,
    /// When the last heartbeat that reached every member was issued: one time for all of
    /// them, so a heartbeat costs the table nothing per node.
    all_heard: Option<Instant>,
    /// The nodes whose silence counts towards DOWN: out of the heartbeat (unresponsive, or
    /// registering again after that) and heard at some time. Only these are looked at.
    silent: BTreeSet<NodeId>,
    /// The nodes registering: welcomed, not members yet.
    joining: BTreeSet<NodeId>,
}

impl NodeTable {
    pub fn new(count: u32, limit: u32) -> Self {
        let node = Node {
            life: Life::Unknown,
            drain: None,
            lent: None,
            sick: None,
            recalled: None,
            given_back: false,
            lease_until_ms: None,
            stamp_seen: 0,
            nm: None,
            output_epoch: 1,
            last_nudge: None,
            keep: Vec::new(),
            last_heard: None,
        };
        Self {
            nodes: vec![node; count as usize],
            limit: limit.max(1),
            all_heard: None,
            silent: BTreeSet::new(),
            joining: BTreeSet::new(),
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

    /// Up, not drained, not lent and not sick: the policy may give it to jobs.
    pub fn is_available(&self, n: NodeId) -> bool {
        let node = &self.nodes[n as usize];
        self.is_up(n)
            && node.drain.is_none()
            && node.lent.is_none()
            && node.sick.is_none()
            && node.recalled.is_none()
            && !node.given_back
    }

    /// What the journal keeps of node `n` across a restart.
    pub fn record(&self, n: NodeId) -> crate::journal::NodeRecord {
        let node = &self.nodes[n as usize];
        crate::journal::NodeRecord {
            drain: node.drain.clone(),
            lent: node.lent.clone(),
        }
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

    /// A heartbeat issued at `sent` reached every member.
    pub fn heard_all(&mut self, sent: Instant) {
        self.all_heard = Some(sent);
    }

    /// When node `n` last took a heartbeat, for a member counting the ones that reached
    /// every member.
    fn heard(&self, n: NodeId) -> Option<Instant> {
        let node = &self.nodes[n as usize];
        match node.life {
            Life::Up { .. } => node.last_heard.max(self.all_heard),
            _ => node.last_heard,
        }
    }

    /// `n` leaves the heartbeat: its silence starts at the last heartbeat it took.
    fn leave_heartbeat(&mut self, n: NodeId) {
        let heard = self.heard(n);
        self.nodes[n as usize].last_heard = heard;
        if heard.is_some() {
            self.silent.insert(n);
        }
    }

    /// The MM itself did not run for `by` (a stall of its own): nobody missed anything
    /// meanwhile, so every node's silence is counted from `by` later.
    pub fn excuse(&mut self, by: Duration) {
        if let Some(h) = &mut self.all_heard {
            *h += by;
        }
        for node in &mut self.nodes {
            if let Some(h) = &mut node.last_heard {
                *h += by;
            }
        }
    }

    /// Member `n` missed a heartbeat's deadline or fell behind (`reason`): it leaves the
    /// heartbeat. False if it was not a member.
    pub fn set_unresponsive(&mut self, n: NodeId, reason: String) -> bool {
        let node = &mut self.nodes[n as usize];
        let Life::Up { stamp } = node.life else {
            return false;
        };
        self.leave_heartbeat(n);
        self.nodes[n as usize].life = Life::Unresponsive { stamp, reason };
        self.joining.remove(&n);
        true
    }

    /// Whether every node is a member or out (none joining, none unresponsive).
    pub fn settled(&self) -> bool {
        self.silent.is_empty() && self.joining.is_empty()
    }

    /// How many nodes are unresponsive: out of the heartbeat after missing it, not DOWN yet,
    /// not registering again.
    pub fn unresponsive_count(&self) -> usize {
        self.silent
            .iter()
            .filter(|&&n| matches!(self.nodes[n as usize].life, Life::Unresponsive { .. }))
            .count()
    }

    /// `n` registered with `stamp` and was welcomed at `sent`; it is not a member until
    /// [`NodeTable::set_up`].
    pub fn set_joining(&mut self, n: NodeId, stamp: u64, sent: Instant) {
        if self.is_up(n) {
            self.leave_heartbeat(n);
        }
        self.nodes[n as usize].life = Life::Joining { stamp, sent };
        self.joining.insert(n);
    }

    /// Nodes out of the heartbeat (unresponsive, or registering again after that) whose
    /// silence has lasted K heartbeat periods (`period`) by `now`, with what made them leave.
    pub fn silent_too_long(&self, now: Instant, period: Duration) -> Vec<(NodeId, String)> {
        let limit = period.saturating_mul(self.limit);
        self.silent
            .iter()
            .filter_map(|&n| {
                let node = &self.nodes[n as usize];
                let heard = node.last_heard?;
                let reason = match &node.life {
                    Life::Unresponsive { reason, .. } => reason.clone(),
                    Life::Joining { .. } => "it registered again but did not finish joining".into(),
                    _ => return None,
                };
                (now.saturating_duration_since(heard) >= limit).then_some((n, reason))
            })
            .collect()
    }

    /// The soonest an unresponsive node becomes DOWN: K heartbeat periods (`period`) after
    /// the last heartbeat it took.
    pub fn first_down_at(&self, period: Duration) -> Option<Instant> {
        let limit = period.saturating_mul(self.limit);
        self.silent
            .iter()
            .filter(|&&n| matches!(self.nodes[n as usize].life, Life::Unresponsive { .. }))
            .filter_map(|&n| self.nodes[n as usize].last_heard)
            .min()
            .map(|heard| heard + limit)
    }

    /// When `n` last took a heartbeat (its issue time), if it is not DOWN.
    pub fn last_heard(&self, n: NodeId) -> Option<Instant> {
        self.heard(n)
    }

    /// Marks `n` up with registration `stamp`, at `now`.
    pub fn set_up(&mut self, n: NodeId, stamp: u64, now: Instant) {
        let node = &mut self.nodes[n as usize];
        node.life = Life::Up { stamp };
        node.last_heard = Some(now);
        self.silent.remove(&n);
        self.joining.remove(&n);
    }

    /// Marks `n` down; false if it already was.
    pub fn set_down(&mut self, n: NodeId, reason: String, now: Instant) -> bool {
        let node = &mut self.nodes[n as usize];
        if matches!(node.life, Life::Down { .. }) {
            return false;
        }
        node.life = Life::Down { reason, since: now };
        node.last_heard = None;
        node.recalled = None;
        node.given_back = false;
        node.last_nudge = Some(now);
        self.silent.remove(&n);
        self.joining.remove(&n);
        true
    }

    /// The state `storm nodes` shows, and why.
    pub fn describe(&self, n: NodeId, has_jobs: bool) -> (NodeState, Option<String>) {
        let node = &self.nodes[n as usize];
        // An operator's drain and the node's own health verdict, both shown.
        let mut drain = match (&node.drain, &node.sick) {
            (Some(d), Some(s)) => Some(format!("{d}; health: {s}")),
            (Some(d), None) => Some(d.clone()),
            (None, Some(s)) => Some(format!("health: {s}")),
            (None, None) => None,
        };
        if let Some(why) = &node.recalled {
            let home = format!("its owner calls it home: {why}");
            drain = Some(match drain {
                Some(d) => format!("{home}; {d}"),
                None => home,
            });
        }
        if node.given_back {
            let home = "given back to its owner: idle, on its way home".to_string();
            drain = Some(match drain {
                Some(d) => format!("{home}; {d}"),
                None => home,
            });
        }
        if let Some(lease) = &node.lent {
            let mut lent = format!(
                "lent to cluster {}{} until {}",
                lease.peer,
                if lease.asked { " on its asking" } else { "" },
                storm_cluster::clock::format_unix_ms(lease.until_ms)
            );
            if let Some(r) = &lease.recall {
                lent.push_str(&format!(
                    ", called home ({}): back when the borrower gives it back, by {} at the latest",
                    r.why,
                    storm_cluster::clock::format_unix_ms(r.by_ms)
                ));
            }
            drain = Some(match drain {
                Some(d) => format!("{lent}; {d}"),
                None => lent,
            });
            if matches!(node.life, Life::Up { .. }) {
                return (NodeState::Lent, drain);
            }
        }
        match (&node.life, has_jobs) {
            (Life::Unknown, _) => (NodeState::Unknown, drain),
            (Life::Joining { .. }, _) => (NodeState::Joining, drain),
            (Life::Unresponsive { reason, .. }, _) => (
                NodeState::Unresponsive,
                Some(match drain {
                    Some(d) => format!("{reason}; drained: {d}"),
                    None => reason.clone(),
                }),
            ),
            (Life::Down { reason, .. }, _) => (
                NodeState::Down,
                Some(match drain {
                    Some(d) => format!("{reason}; drained: {d}"),
                    None => reason.clone(),
                }),
            ),
            (Life::Up { .. }, true) if drain.is_some() => (NodeState::Draining, drain),
            (Life::Up { .. }, false) if drain.is_some() => (NodeState::Drained, drain),
            (Life::Up { .. }, true) => (NodeState::Allocated, None),
            (Life::Up { .. }, false) => (NodeState::Idle, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unresponsive_node_is_down_k_periods_after_the_last_heartbeat_it_took() {
        let ms = Duration::from_millis;
        let mut t = NodeTable::new(4, 3);
        t.set_up(1, 7, Instant::now());
        t.set_up(2, 9, Instant::now());
        let t0 = Instant::now();
        t.heard_all(t0);
        assert!(t.set_unresponsive(1, "missed a deadline".into()));
        assert!(!t.set_unresponsive(1, "again".into()), "only members leave");
        assert!(t.silent_too_long(t0 + ms(2), ms(1)).is_empty());
        t.heard_all(t0 + ms(2));
        assert_eq!(
            t.silent_too_long(t0 + ms(3), ms(1)),
            vec![(1, "missed a deadline".to_string())],
            "heartbeats to the others do not count for it; its silence started at t0"
        );
        assert!(
            t.silent_too_long(t0 + ms(4), ms(1))
                .iter()
                .all(|(n, _)| *n != 2),
            "members are never counted here: they are heard or they leave"
        );
        t.excuse(ms(10));
        assert!(
            t.silent_too_long(t0 + ms(12), ms(1)).is_empty(),
            "a stall of the MM's own is not the node's silence"
        );
        t.set_up(1, 8, Instant::now());
        assert!(t.silent_too_long(t0 + ms(100), ms(1)).is_empty(), "back up");
    }

    #[test]
    fn a_member_registering_again_is_silent_from_the_last_heartbeat_every_member_took() {
        let ms = Duration::from_millis;
        let mut t = NodeTable::new(3, 3);
        let t0 = Instant::now();
        t.set_up(0, 1, t0);
        t.set_up(1, 1, t0);
        t.heard_all(t0 + ms(5));
        assert_eq!(
            t.last_heard(0),
            Some(t0 + ms(5)),
            "a member took the last heartbeat"
        );
        t.set_joining(0, 2, t0 + ms(6));
        t.heard_all(t0 + ms(7));
        assert_eq!(
            t.last_heard(0),
            Some(t0 + ms(5)),
            "out of the heartbeat since"
        );
        assert!(t.silent_too_long(t0 + ms(7), ms(1)).is_empty());
        assert_eq!(
            t.silent_too_long(t0 + ms(8), ms(1)),
            vec![(
                0,
                "it registered again but did not finish joining".to_string()
            )]
        );
        t.set_joining(2, 1, t0);
        assert!(
            t.silent_too_long(t0 + ms(100), ms(1))
                .iter()
                .all(|(n, _)| *n != 2),
            "a node never heard (unknown or down before) is not silent: it was never there"
        );
        t.set_up(0, 2, t0 + ms(9));
        assert!(
            t.silent_too_long(t0 + ms(100), ms(1))
                .iter()
                .all(|(n, _)| *n != 0)
        );
    }

    #[test]
    fn states_as_storm_nodes_shows_them() {
        let mut t = NodeTable::new(3, 3);
        assert_eq!(t.describe(0, false).0, NodeState::Unknown);
        t.set_up(0, 1, Instant::now());
        assert_eq!(t.describe(0, false), (NodeState::Idle, None));
        assert_eq!(t.describe(0, true), (NodeState::Allocated, None));
        t.get_mut(0).drain = Some("bad fan".into());
        assert_eq!(
            t.describe(0, true),
            (NodeState::Draining, Some("bad fan".into()))
        );
        assert_eq!(
            t.describe(0, false),
            (NodeState::Drained, Some("bad fan".into()))
        );
        assert!(!t.is_available(0), "drained nodes are not allocated");
        t.get_mut(0).sick = Some("spool_dir has 1 MiB free".into());
        assert_eq!(
            t.describe(0, false),
            (
                NodeState::Drained,
                Some("bad fan; health: spool_dir has 1 MiB free".into())
            ),
            "the operator's drain and the health verdict are both shown"
        );
        t.get_mut(0).drain = None;
        assert_eq!(
            t.describe(0, true),
            (
                NodeState::Draining,
                Some("health: spool_dir has 1 MiB free".into())
            )
        );
        assert!(!t.is_available(0), "sick nodes are not allocated");
        t.get_mut(0).sick = None;
        assert!(t.is_available(0));
        assert!(t.set_unresponsive(0, "missed a deadline".into()));
        assert_eq!(
            t.describe(0, true),
            (NodeState::Unresponsive, Some("missed a deadline".into()))
        );
        t.get_mut(0).drain = Some("bad fan".into());
        assert!(t.set_down(0, "missed 3 heartbeats".into(), Instant::now()));
        assert!(!t.set_down(0, "again".into(), Instant::now()));
        assert_eq!(
            t.describe(0, false),
            (
                NodeState::Down,
                Some("missed 3 heartbeats; drained: bad fan".into())
            )
        );
        assert_eq!(t.down_set(), NodeSet::single(0));
        assert_eq!(t.up_count(), 0);
    }
}
