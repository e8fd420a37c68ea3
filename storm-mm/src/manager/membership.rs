//! Membership: how nodes join the heartbeat, and the operator's drain and resume.
//!
//! An NM registers by writing a stamp (its pid and a generation) into `registry[node]` in the
//! MM's memory. The MM answers with `Welcome`, the NM clears what it ran before and writes the
//! stamp into `join_ack[node]`; the MM then sends `Start` with the heartbeat sequence number
//! the node joins at and adds it to the heartbeat's node set. A registration with a new stamp
//! from a node that is up means its NM restarted: the old membership is over (the node is
//! marked down, its jobs end) before the new one begins. Down and unknown nodes are nudged
//! (`Evicted`) once a second, so an NM whose link came back, or that outlived an MM restart,
//! registers at once.

use std::time::{Duration, Instant};

use bytes::Bytes;
use storm_cluster::messages::{MEMBERSHIP_BYTES, Membership, encode};
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::{NodeId, NodeSet, Wait};

use super::MachineManager;
use crate::journal::NodeRecord;
use crate::nodes::Life;

/// How long the MM waits for a welcome's acknowledgement before welcoming again.
const WELCOME_RETRY: Duration = Duration::from_secs(1);

/// How often down and unknown nodes are told to register.
const NUDGE_EVERY: Duration = Duration::from_secs(1);

impl MachineManager {
    /// Answers registrations and acknowledgements; nudges nodes that are not members.
    pub(super) fn membership(&mut self) {
        // Signals and completions only say "look"; the registry and the acknowledgements in
        // memory say what happened, and unanswered messages are sent again.
        for event in [self.rm.registered, self.rm.join_sent] {
            while let Ok(true) = self.prims.test_event(event, Wait::Poll) {}
        }
        let now = Instant::now();
        let prims = self.prims.clone();
        let mem = prims.memory();
        for n in 0..self.nodes.len() as NodeId {
            let stamp = mem.load(self.rm.registry.at(n as usize));
            if stamp != 0 && stamp != self.nodes.get(n).stamp_seen {
                self.registered(n, stamp, now);
            }
            match self.nodes.get(n).life.clone() {
                Life::Joining { stamp, sent } => {
                    if mem.load(self.rm.join_ack.at(n as usize)) == stamp {
                        self.admit(n, stamp);
                    } else if now.duration_since(sent) >= WELCOME_RETRY {
                        self.welcome(n, stamp, now);
                    }
                }
                Life::Down { .. } | Life::Unknown => {
                    let node = self.nodes.get_mut(n);
                    if node
                        .last_nudge
                        .is_none_or(|t| now.duration_since(t) >= NUDGE_EVERY)
                    {
                        node.last_nudge = Some(now);
                        let stamp = node.stamp_seen;
                        self.send_membership(n, &Membership::Evicted { stamp });
                    }
                }
                Life::Up { .. } => {}
            }
        }
    }

    /// An NM registered with a stamp the MM has not acted on.
    fn registered(&mut self, n: NodeId, stamp: u64, now: Instant) {
        if self.nodes.is_up(n) {
            self.mark_down(n, "its node manager restarted".into());
        }
        self.nodes.get_mut(n).stamp_seen = stamp;
        tracing::info!(node = n, name = %self.node_name(n), stamp = format!("{stamp:#x}"), "node manager registered");
        self.welcome(n, stamp, now);
    }

    /// Starts a new membership for `n`: a fresh output queue epoch, and `Welcome`.
    fn welcome(&mut self, n: NodeId, stamp: u64, now: Instant) {
        let node = self.nodes.get_mut(n);
        if !matches!(node.life, Life::Joining { stamp: s, .. } if s == stamp) {
            node.output_epoch += 1;
        }
        let output_epoch = node.output_epoch;
        node.life = Life::Joining { stamp, sent: now };
        match QueueConsumer::new(&*self.prims, self.rm.output[n as usize], output_epoch) {
            Ok(c) => self.outputs[n as usize] = c,
            Err(e) => tracing::error!(node = n, "cannot reset the output queue: {e}"),
        }
        self.send_membership(
            n,
            &Membership::Welcome {
                stamp,
                output_epoch,
            },
        );
    }

    /// The NM carried out the welcome: it joins the heartbeat at the next sequence number.
    fn admit(&mut self, n: NodeId, stamp: u64) {
        let seq = self.heartbeats.next_seq();
        self.send_membership(n, &Membership::Start { stamp, seq });
        self.heartbeats.add(n);
        self.nodes.set_up(n, stamp);
        if self.nodes.get(n).drain.is_none() {
            self.policy.set_available(n);
        }
        tracing::info!(node = n, name = %self.node_name(n), "node is up");
    }

    /// Writes a membership message into node `n`'s join area and signals it. Non-blocking:
    /// a message that does not arrive is sent again by whoever waits for its answer.
    fn send_membership(&self, n: NodeId, msg: &Membership) {
        let bytes = match encode("membership", msg, MEMBERSHIP_BYTES) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("cannot encode {msg:?}: {e}");
                return;
            }
        };
        if let Err(e) = self.prims.xfer_and_signal(
            &NodeSet::single(n),
            self.rm.join.offset,
            Bytes::from(bytes),
            Some(self.rm.joined),
            Some(self.rm.join_sent),
        ) {
            tracing::debug!(node = n, "cannot send {msg:?}: {e}");
        }
    }

    pub(super) fn node_name(&self, n: NodeId) -> &str {
        &self.cfg.nodes[n as usize].name
    }

    /// Checks that every node of `nodes` is in the cluster.
    fn check_nodes(&self, nodes: &NodeSet) -> Result<(), String> {
        if nodes.is_empty() {
            return Err("no nodes given".into());
        }
        match nodes.last() {
            Some(last) if last as usize >= self.nodes.len() => Err(format!(
                "node {last} is not in cluster {:?} (nodes 0-{})",
                self.cfg.cluster.name,
                self.nodes.len() - 1
            )),
            _ => Ok(()),
        }
    }

    /// `storm drain`: the nodes take no new jobs until resumed; jobs on them run on.
    pub(super) fn drain(&mut self, nodes: &NodeSet, reason: String) -> Result<(), String> {
        self.check_nodes(nodes)?;
        let reason = if reason.trim().is_empty() {
            "drained by the operator".to_string()
        } else {
            reason
        };
        for n in nodes.iter() {
            self.nodes.get_mut(n).drain = Some(reason.clone());
            self.policy.set_unavailable(n);
            self.journal.put_node(
                n,
                NodeRecord {
                    drain: Some(reason.clone()),
                },
            );
        }
        tracing::info!(nodes = %nodes, "drained: {reason}");
        Ok(())
    }

    /// `storm resume`: ends a drain; nodes that are up take jobs again.
    pub(super) fn resume(&mut self, nodes: &NodeSet) -> Result<(), String> {
        self.check_nodes(nodes)?;
        for n in nodes.iter() {
            self.nodes.get_mut(n).drain = None;
            self.journal.put_node(n, NodeRecord { drain: None });
            if self.nodes.is_up(n) {
                self.policy.set_available(n);
            }
        }
        tracing::info!(nodes = %nodes, "resumed");
        Ok(())
    }
}
