//! Lending nodes to peer clusters, on the lender's side (docs/federation.md, lending).
//!
//! `storm lend NODES --to PEER --for DURATION` lends idle nodes for a lease: each is kept out
//! of this cluster's allocation (`lent`, journaled), and its NM is told, in a sealed heartbeat
//! command, to start the guest NM that joins the peer's fabric. The node comes home when the
//! operator reclaims it (`storm reclaim`) or when the lease ends (the guest stops itself then,
//! whatever it hears; this MM takes the node back at the same time). Coming home, the NM
//! stops the guest before it takes its next command, so a job of this cluster placed there
//! afterwards never starts beside a guest's task.

use std::time::Duration;

use storm_cluster::federation::Lease;
use storm_cluster::messages::Command;
use storm_primitives::{NodeId, NodeSet};

use super::{MachineManager, MmEnv};

/// The longest lease `storm lend` gives (a week): a lent node that is forgotten comes home.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 86_400);

impl<E: MmEnv> MachineManager<E> {
    /// `storm lend`: lends `nodes` to peer `peer` for `span`. Every node must be up and idle
    /// (no job, not drained, not lent): none is lent otherwise.
    pub(super) fn lend(
        &mut self,
        nodes: &NodeSet,
        peer: &str,
        span: Duration,
    ) -> Result<u64, String> {
        self.check_nodes(nodes)?;
        let entry = self
            .cfg
            .peers
            .iter()
            .find(|p| p.name == peer)
            .ok_or_else(|| format!("{peer} is not a [[peer]] of this cluster"))?;
        if !entry.lend || entry.guest_file.is_none() || entry.flock_user.is_none() {
            return Err(format!(
                "this cluster does not lend nodes to {peer}: its [[peer]] needs lend = true, a \
                 guest_file (the peer's cluster file on the nodes) and a flock_user (the account \
                 its jobs run as)"
            ));
        }
        if span.is_zero() || span > MAX_LEASE {
            return Err(format!(
                "a lease lasts more than 0 s and at most {} days",
                MAX_LEASE.as_secs() / 86_400
            ));
        }
        for n in nodes.iter() {
            let node = self.nodes.get(n);
            let busy = self.jobs.values().any(|j| j.nodes.contains(n));
            let why = if self.cfg.is_guest(n) {
                Some(
                    "it is a guest slot, another cluster's node: not this cluster's to lend".into(),
                )
            } else if let Some(l) = &node.lent {
                Some(format!("it is lent to {} already", l.peer))
            } else if !self.nodes.is_available(n) {
                Some("it is not up and in service (down, drained or sick)".to_string())
            } else if busy {
                Some("jobs run there (drain it first, and lend it once they end)".to_string())
            } else {
                None
            };
            if let Some(why) = why {
                return Err(format!("cannot lend node {}: {why}", self.node_name(n)));
            }
        }
        let until_ms = self.unix_ms() + span.as_millis() as u64;
        for n in nodes.iter() {
            self.nodes.get_mut(n).lent = Some(Lease {
                peer: peer.to_string(),
                until_ms,
            });
            self.policy.set_unavailable(n);
            self.outbox.journal.put_node(n, self.nodes.record(n));
            self.hb.commands.push_back(lend_command(n, peer, until_ms));
        }
        tracing::info!(nodes = %nodes, %peer, until_ms, "lent");
        Ok(until_ms)
    }

    /// `storm reclaim`: the lent nodes among `nodes` come home now; the others are left as
    /// they are. Returns how many came home.
    pub(super) fn reclaim(&mut self, nodes: &NodeSet) -> Result<u32, String> {
        self.check_nodes(nodes)?;
        let lent: Vec<NodeId> = nodes
            .iter()
            .filter(|&n| self.nodes.get(n).lent.is_some())
            .collect();
        for &n in &lent {
            self.come_home(n, "reclaimed by its owner");
        }
        Ok(lent.len() as u32)
    }

    /// Takes back every lent node whose lease has ended (its guest stopped itself).
    pub(super) fn end_leases(&mut self) {
        let now_ms = self.unix_ms();
        let ended: Vec<NodeId> = (0..self.nodes.len() as NodeId)
            .filter(|&n| {
                self.nodes
                    .get(n)
                    .lent
                    .as_ref()
                    .is_some_and(|l| l.until_ms <= now_ms)
            })
            .collect();
        for n in ended {
            self.come_home(n, "its lease ended");
        }
    }

    fn come_home(&mut self, n: NodeId, why: &str) {
        let Some(lease) = self.nodes.get_mut(n).lent.take() else {
            return;
        };
        self.outbox.journal.put_node(n, self.nodes.record(n));
        // Ahead of any launch this cluster sends the node from now on: the NM stops the
        // guest before it takes the next command.
        self.hb.commands.push_back(Command::EndLend {
            nodes: NodeSet::single(n),
        });
        if self.nodes.is_available(n) {
            self.policy.set_available(n);
        }
        tracing::info!(node = n, name = %self.node_name(n), peer = %lease.peer, "home again: {why}");
    }

    /// What a node just admitted is told of its lease: to run its guest if it is lent (it
    /// may have missed the command, or its NM restarted), else to stop any guest still
    /// running (it missed the end). Nothing on a cluster that lends no nodes.
    pub(super) fn lease_command_for(&self, n: NodeId) -> Option<Command> {
        if let Some(l) = &self.nodes.get(n).lent {
            return Some(lend_command(n, &l.peer, l.until_ms));
        }
        self.cfg
            .peers
            .iter()
            .any(|p| p.lend && p.guest_file.is_some())
            .then(|| Command::EndLend {
                nodes: NodeSet::single(n),
            })
    }
}

fn lend_command(n: NodeId, peer: &str, until_ms: u64) -> Command {
    Command::Lend {
        nodes: NodeSet::single(n),
        peer: peer.to_string(),
        until_ms,
    }
}
