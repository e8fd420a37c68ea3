//! Lending nodes to peer clusters, on the lender's side (docs/federation.md, lending).
//!
//! `storm lend NODES --to PEER --for DURATION` lends idle nodes for a lease: each is kept out
//! of this cluster's allocation (`lent`, journaled), and its NM is told, in a sealed heartbeat
//! command, to start the guest NM that joins the peer's fabric.
//!
//! **Calling a node home.** The owner calls a lent node home when its operator reclaims it
//! (`storm reclaim`), when a job of its own waits for it, and shortly before its lease ends.
//! The lease then carries the reason (`recall`, journaled), which the agent tells the
//! borrower; the borrower preempts its jobs there with that reason and gives the node back
//! (Condor's vacate). It comes home then, or `[federation] vacate_ms` later whether the
//! borrower answered or not. A node comes home at once, without notice, when the borrower
//! cannot be told (it is away, or this cluster's agent is silent), with `storm reclaim --now`,
//! and when the lease has ended (the guest stops itself then, whatever it hears).
//!
//! Coming home, the NM stops the guest before it takes its next command, so a job of this
//! cluster placed there afterwards never starts beside a guest's task.

use std::time::Duration;

use storm_cluster::federation::{Lease, LentNode, Recall, Recalled};
use storm_cluster::messages::{Command, JobId};
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
        self.check_lends_to(peer)?;
        if span.is_zero() || span > MAX_LEASE {
            return Err(format!(
                "a lease lasts more than 0 s and at most {} days",
                MAX_LEASE.as_secs() / 86_400
            ));
        }
        for n in nodes.iter() {
            if let Some(why) = self.not_lendable(n) {
                return Err(format!("cannot lend node {}: {why}", self.node_name(n)));
            }
        }
        let until_ms = self.unix_ms() + span.as_millis() as u64;
        for n in nodes.iter() {
            self.lease_out(n, peer, until_ms, false);
        }
        tracing::info!(nodes = %nodes, %peer, until_ms, "lent");
        Ok(until_ms)
    }

    /// Whether this cluster's file lets it lend nodes to `peer`.
    fn check_lends_to(&self, peer: &str) -> Result<(), String> {
        let entry = self
            .cfg
            .peers
            .iter()
            .find(|p| p.name == peer)
            .ok_or_else(|| {
                if self.cfg.peers.is_empty() {
                    format!(
                        "{peer} is not a [[peer]] of this cluster, which has none: lending is \
                         between clusters whose operators made them peers (a private instance \
                         of storm start has no peers; docs/start.md)"
                    )
                } else {
                    format!("{peer} is not a [[peer]] of this cluster")
                }
            })?;
        if !entry.lend || entry.guest_file.is_none() || entry.flock_user.is_none() {
            return Err(format!(
                "this cluster does not lend nodes to {peer}: its [[peer]] needs lend = true, a \
                 guest_file (the peer's guest file on the nodes) and a flock_user (the account \
                 its jobs run as)"
            ));
        }
        Ok(())
    }

    /// Why node `n` cannot be lent now, if it cannot.
    fn not_lendable(&self, n: NodeId) -> Option<String> {
        let node = self.nodes.get(n);
        if self.cfg.is_guest(n) {
            Some("it is a guest slot, another cluster's node: not this cluster's to lend".into())
        } else if let Some(l) = &node.lent {
            Some(format!("it is lent to {} already", l.peer))
        } else if !self.nodes.is_available(n) {
            Some("it is not up and in service (down, drained or sick)".to_string())
        } else if self.jobs.values().any(|j| j.nodes.contains(n)) {
            Some("jobs run there (drain it first, and lend it once they end)".to_string())
        } else {
            None
        }
    }

    /// Lends node `n` to `peer` until `until_ms`: out of this cluster's allocation,
    /// journaled, and its NM told to start the guest.
    fn lease_out(&mut self, n: NodeId, peer: &str, until_ms: u64, asked: bool) {
        self.nodes.get_mut(n).lent = Some(Lease {
            peer: peer.to_string(),
            until_ms,
            asked,
            recall: None,
        });
        self.policy.set_unavailable(n);
        self.outbox.journal.put_node(n, self.nodes.record(n));
        let cmd = self.lend_command(n, peer, until_ms);
        self.hb.commands.push_back(cmd);
    }

    /// Peer `peer` asks, for its waiting jobs, for up to `count` of `names` (this cluster's
    /// node names) for `for_ms`: idle ones are lent, those lent to it already counting, unless
    /// a job of this cluster waits (a cluster lends only what its own queue does not want) or
    /// the agent last reported the peer away.
    /// Returns the nodes of `names` lent to the peer now, and whether each was lent on asking.
    pub(super) fn lend_asked(
        &mut self,
        peer: &str,
        names: &[String],
        count: u32,
        for_ms: u64,
    ) -> Result<Vec<LentNode>, String> {
        self.check_lends_to(peer)?;
        let asked: Vec<NodeId> = self.own_nodes_named(names).into_iter().collect();
        // A node called home is on its way back: it neither counts nor is named as lent.
        let lent_to_peer = |me: &Self, n: NodeId| {
            me.nodes
                .get(n)
                .lent
                .as_ref()
                .is_some_and(|l| l.peer == peer && l.recall.is_none())
        };
        let have = asked.iter().filter(|&&n| lent_to_peer(self, n)).count() as u32;
        let own_waiting = !self.waiting_own_jobs().is_empty();
        // A peer the agent last reported away is lent nothing new: the lease would go home at
        // the next pass (its borrower away for the peer timeout). It asks again next period.
        let away = self.peer_room.away_for(peer, self.now()).is_some();
        if have < count && !own_waiting && !away {
            let span = Duration::from_millis(for_ms).min(MAX_LEASE);
            let until_ms = self.unix_ms() + span.as_millis() as u64;
            let idle: Vec<NodeId> = asked
                .iter()
                .copied()
                .filter(|&n| self.not_lendable(n).is_none())
                .take((count - have) as usize)
                .collect();
            for &n in &idle {
                self.lease_out(n, peer, until_ms, true);
            }
            if !idle.is_empty() {
                tracing::info!(nodes = ?idle, %peer, until_ms, "lent on the peer's asking");
            }
        }
        Ok(asked
            .into_iter()
            .filter(|&n| lent_to_peer(self, n))
            .map(|n| LentNode {
                node: self.node_name(n).to_string(),
                on_asking: self.nodes.get(n).lent.as_ref().is_some_and(|l| l.asked),
            })
            .collect())
    }

    /// Peer `peer` gives back `names`: those it borrowed on its asking, and those called
    /// home, come home (an operator's lease otherwise runs to its end or to `storm
    /// reclaim`).
    pub(super) fn give_back(&mut self, peer: &str, names: &[String]) {
        for n in self.own_nodes_named(names) {
            if self
                .nodes
                .get(n)
                .lent
                .as_ref()
                .is_some_and(|l| l.peer == peer && (l.asked || l.recall.is_some()))
            {
                self.come_home(n, "given back by the borrower");
            }
        }
    }

    /// Whether borrower `peer` can be told of a node called home now: it is `up` in the last
    /// report of this cluster's agent, and that report is fresh (three of the agent's periods,
    /// or half the peer timeout).
    fn borrower_hears(&self, peer: &str) -> bool {
        let fed = &self.cfg.federation;
        let stale = (3 * fed.advertise_every()).max(fed.peer_timeout() / 2);
        let now = self.now();
        self.peers.as_ref().is_some_and(|(at, infos)| {
            now.saturating_duration_since(*at) <= stale
                && infos
                    .iter()
                    .any(|i| i.name == peer && i.state == storm_cluster::federation::PeerState::Up)
        })
    }

    /// Calls lent node `n` home for `why`: with notice (the borrower is told, and has
    /// `[federation] vacate_ms` to give it back) when the borrower can hear it; else at once,
    /// or, `unless_unheard`, not yet (a lease about to end runs to its end). A node called
    /// home already keeps its first reason and its deadline.
    fn call_home(&mut self, n: NodeId, why: &str, unless_unheard: bool) {
        let Some(lease) = self.nodes.get(n).lent.as_ref() else {
            return;
        };
        if lease.recall.is_some() {
            return;
        }
        let vacate = self.cfg.federation.vacate_ms;
        if vacate == 0 || !self.borrower_hears(&lease.peer) {
            if !unless_unheard {
                self.come_home(
                    n,
                    &format!("{why} (at once: its borrower could not be told)"),
                );
            }
            return;
        }
        let by_ms = self.unix_ms() + vacate;
        let peer = lease.peer.clone();
        if let Some(l) = self.nodes.get_mut(n).lent.as_mut() {
            l.recall = Some(Recall {
                why: why.to_string(),
                by_ms,
            });
        }
        self.outbox.journal.put_node(n, self.nodes.record(n));
        tracing::info!(node = n, name = %self.node_name(n), %peer, by_ms, "called home: {why}");
    }

    /// The lent nodes called home, by borrower, for this cluster's agent to tell them
    /// ([`storm_cluster::control::Request::Recalls`]).
    pub(super) fn recalls(&self) -> Vec<(String, Vec<Recalled>)> {
        let mut by_peer: std::collections::BTreeMap<String, Vec<Recalled>> = Default::default();
        for n in 0..self.nodes.len() as NodeId {
            if let Some(l) = &self.nodes.get(n).lent
                && let Some(r) = &l.recall
            {
                by_peer.entry(l.peer.clone()).or_default().push(Recalled {
                    node: self.node_name(n).to_string(),
                    why: r.why.clone(),
                });
            }
        }
        by_peer.into_iter().collect()
    }

    /// Every node lent to a peer that has been away (its agent or its MM gone, or the link
    /// between the clusters down) for `[federation] peer_timeout_ms` comes home: either
    /// cluster may walk away, and a node lent to one that did serves nobody. (Without this
    /// cluster's own agent, nothing is known of the peers: the guest then runs to its
    /// lease's end.)
    pub(super) fn take_home_from_gone_borrowers(&mut self) {
        let now = self.now();
        let timeout = self.cfg.federation.peer_timeout();
        let gone: Vec<NodeId> = (0..self.nodes.len() as NodeId)
            .filter(|&n| {
                self.nodes.get(n).lent.as_ref().is_some_and(|l| {
                    self.peer_room
                        .away_for(&l.peer, now)
                        .is_some_and(|away| away >= timeout)
                })
            })
            .collect();
        for n in gone {
            self.come_home(
                n,
                &format!(
                    "its borrower has been away for the peer timeout ({} ms)",
                    timeout.as_millis()
                ),
            );
        }
    }

    /// Every node lent to a peer this cluster's file no longer lends to (the operator removed
    /// its `[[peer]]` entry, or its `lend`, and restarted the MM) comes home: walking away
    /// takes back what was lent, not only what would be lent next.
    pub(super) fn take_home_from_peers_not_lent_to(&mut self) {
        let walked_away: Vec<(NodeId, String)> = (0..self.nodes.len() as NodeId)
            .filter_map(|n| {
                let lease = self.nodes.get(n).lent.as_ref()?;
                self.check_lends_to(&lease.peer).err().map(|why| (n, why))
            })
            .collect();
        for (n, why) in walked_away {
            self.come_home(n, &format!("this cluster lends it no more: {why}"));
        }
    }

    /// The nodes of this cluster among `names` (a peer's list: each once, unknown names and
    /// guest slots left out), looked up through one index, so that a long list costs
    /// time in its length, not in its length times the cluster's.
    fn own_nodes_named(&self, names: &[String]) -> std::collections::BTreeSet<NodeId> {
        let index: std::collections::HashMap<&str, NodeId> = self
            .cfg
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, e)| e.guest_of.is_none())
            .map(|(i, e)| (e.name.as_str(), i as NodeId))
            .collect();
        names
            .iter()
            .filter_map(|name| index.get(name.as_str()).copied())
            .collect()
    }

    /// Jobs of this cluster's own waiting for nodes, oldest first, with how long each waited.
    fn waiting_own_jobs(&self) -> Vec<(JobId, Duration)> {
        let now = self.now();
        self.waiting_jobs()
            .into_iter()
            .map(|id| (id, now.saturating_duration_since(self.jobs[&id].submitted)))
            .collect()
    }

    /// A job of this cluster that has waited `[federation] reclaim_after_ms` calls home, of
    /// the nodes lent on a peer's asking that suit it (its `--constraint`), as many as it
    /// lacks beside the idle ones that suit it and those called home already: the
    /// borrower's jobs on them lose those nodes (requeued if they asked, else ended), told
    /// why. Nothing is called home for a job those nodes would not let start (too few of
    /// them suit it, or it needs nodes still busy here): the borrower keeps them until they
    /// would.
    pub(super) fn reclaim_for_own_queue(&mut self) {
        let after = Duration::from_millis(self.cfg.federation.reclaim_after_ms);
        let Some(&(id, _)) = self
            .waiting_own_jobs()
            .iter()
            .find(|(_, waited)| *waited >= after)
        else {
            return;
        };
        let job = &self.jobs[&id];
        let (need, bits) = (job.plan.nodes, self.feature_bits(&job.req, job.plan.nodes));
        let suits = |me: &Self, n: NodeId| me.node_features[n as usize] & bits == bits;
        let (coming, lent): (Vec<NodeId>, Vec<NodeId>) = (0..self.nodes.len() as NodeId)
            .filter(|&n| self.nodes.get(n).lent.as_ref().is_some_and(|l| l.asked))
            .filter(|&n| suits(self, n))
            .partition(|&n| {
                self.nodes
                    .get(n)
                    .lent
                    .as_ref()
                    .is_some_and(|l| l.recall.is_some())
            });
        let idle = self
            .idle_nodes()
            .into_iter()
            .filter(|&n| suits(self, n))
            .count() as u32;
        let have = idle + coming.len() as u32;
        if lent.is_empty() || have + (lent.len() as u32) < need {
            return;
        }
        let back = need.saturating_sub(have) as usize;
        for &n in lent.iter().take(back) {
            self.call_home(
                n,
                &format!("reclaimed for its job {id}, which waits there"),
                false,
            );
        }
    }

    /// `storm reclaim`: the lent nodes among `nodes` are called home (`now`: they come home
    /// at once, without notice); the others are left as they are. Returns how many were lent,
    /// and how many of those are home now.
    pub(super) fn reclaim(&mut self, nodes: &NodeSet, now: bool) -> Result<(u32, u32), String> {
        self.check_nodes(nodes)?;
        let lent: Vec<NodeId> = nodes
            .iter()
            .filter(|&n| self.nodes.get(n).lent.is_some())
            .collect();
        for &n in &lent {
            if now {
                self.come_home(n, "reclaimed at once by its owner's operator");
            } else {
                self.call_home(n, "its owner's operator reclaimed it", false);
            }
        }
        let home = lent
            .iter()
            .filter(|&&n| self.nodes.get(n).lent.is_none())
            .count() as u32;
        Ok((lent.len() as u32, home))
    }

    /// Takes back every lent node whose lease has ended (its guest stopped itself), or whose
    /// borrower did not give it back within `[federation] vacate_ms` of its call home; calls
    /// home, `vacate_ms` ahead, every node whose lease is about to end.
    pub(super) fn end_leases(&mut self) {
        let now_ms = self.unix_ms();
        let vacate = self.cfg.federation.vacate_ms;
        let mut ended = Vec::new();
        let mut ending = Vec::new();
        for n in 0..self.nodes.len() as NodeId {
            let Some(l) = &self.nodes.get(n).lent else {
                continue;
            };
            if l.until_ms <= now_ms {
                ended.push((n, "its lease ended".to_string()));
            } else if let Some(r) = &l.recall {
                if r.by_ms <= now_ms {
                    ended.push((
                        n,
                        format!(
                            "{} (its borrower did not give it back within {vacate} ms)",
                            r.why
                        ),
                    ));
                }
            } else if l.until_ms <= now_ms + vacate {
                ending.push((n, l.until_ms));
            }
        }
        for (n, why) in ended {
            self.come_home(n, &why);
        }
        for (n, until_ms) in ending {
            self.call_home(
                n,
                &format!(
                    "its lease ends at {}",
                    storm_cluster::clock::format_unix_ms(until_ms)
                ),
                true,
            );
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
            return Some(self.lend_command(n, &l.peer, l.until_ms));
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

impl<E: MmEnv> MachineManager<E> {
    /// Node `n`'s order to lend itself to `peer` until `until_ms`, with this MM's signed
    /// grant of the lease, which the guest shows the borrower (it admits no guest slot
    /// without one).
    fn lend_command(&self, n: NodeId, peer: &str, until_ms: u64) -> Command {
        Command::Lend {
            nodes: NodeSet::single(n),
            peer: peer.to_string(),
            until_ms,
            grant: self.signer.grant_lease(peer, self.node_name(n), until_ms),
        }
    }
}
