//! Failure detection (paper Sec. 2.4.3) and what follows from a failed node.
//!
//! Two signs of a failed node, both from the primitives:
//!
//! * a heartbeat whose XFER-AND-SIGNAL fails naming the node (its connection closed, was
//!   refused, or timed out: a dead NM, a crashed host, a cut link). Nothing was signalled
//!   anywhere (all or nothing), so the heartbeat is sent again under the same sequence number.
//!   The node has missed every heartbeat since the last one that reached it; once that is K
//!   heartbeat intervals, it is DOWN;
//! * a receipt check: every `check_interval_ms` one COMPARE-AND-WRITE asks whether every
//!   member took every heartbeat delivered before the previous check. When it says no, each
//!   member is asked alone, and the ones behind have missed that check (an NM that is alive on
//!   the network but no longer takes heartbeats).
//!
//! K (`missed_heartbeats`) makes the node DOWN: it leaves the heartbeat (the
//! tcp tree is built over the remaining members, so it heals at once) and allocation; each job
//! that used it ends with a reason naming the node, or goes back to the queue if it was
//! submitted with `--requeue`; its processes on the other nodes are killed (`Forget`).

use std::time::Instant;

use bytes::Bytes;
use storm_cluster::control::Reply;
use storm_cluster::messages::JobId;
use storm_primitives::{NodeId, NodeSet, PrimError, Relation};

use super::{MachineManager, Phase};
use crate::policy::JobAsk;

impl MachineManager {
    /// The heartbeat in flight failed: count the miss against the node the error names, and
    /// send the same heartbeat again. Nodes that took it all the same (a node failing during
    /// the commit phase leaves some signalled) skip the repeat; the others take it.
    pub(super) fn heartbeat_failed(&mut self, e: PrimError, sent: Bytes) {
        self.heartbeats.unsend_last();
        self.hb_resend = Some(sent);
        if let Some(more) = self.hb_errors.allow(Instant::now()) {
            tracing::warn!(
                suppressed = more,
                "a heartbeat did not reach every node: {e}"
            );
        }
        self.blame(&e);
    }

    /// Counts a missed heartbeat against the node `e` names, if it names a member; marks it
    /// DOWN after K.
    pub(super) fn blame(&mut self, e: &PrimError) {
        let node = match e {
            PrimError::Unreachable { node, .. } | PrimError::Protocol { node, .. } => *node,
            PrimError::Timeout { nodes, .. } if nodes.len() == 1 => {
                nodes.first().expect("one node")
            }
            _ => return,
        };
        if !self.heartbeats.dest().contains(node) {
            return;
        }
        if self
            .nodes
            .missed(node, Instant::now(), self.cfg.timeslice())
        {
            let k = self.cfg.failure.missed_heartbeats;
            self.mark_down(node, format!("missed {k} heartbeats in a row ({e})"));
        }
    }

    /// The receipt check: COMPARE-AND-WRITE on every member's heartbeat counter.
    pub(super) fn check_receipt(&mut self) {
        let now = Instant::now();
        if now < self.next_check {
            return;
        }
        self.next_check =
            now + std::time::Duration::from_millis(self.cfg.failure.check_interval_ms);
        let target = std::mem::replace(&mut self.check_target, self.hb_delivered);
        let members = self.heartbeats.dest().clone();
        if members.is_empty() {
            return;
        }
        let dequeued = self.rm.heartbeat.dequeued;
        match self
            .prims
            .compare_and_write(&members, dequeued, Relation::Ge, target, None)
        {
            Ok(true) => {
                for n in members.iter() {
                    self.nodes.caught_up(n);
                }
                return;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("receipt check failed: {e}");
                self.blame(&e);
            }
        }
        // Someone is behind (or the check failed): ask each member alone.
        for n in members.iter() {
            if !self.heartbeats.dest().contains(n) {
                continue;
            }
            match self.prims.compare_and_write(
                &NodeSet::single(n),
                dequeued,
                Relation::Ge,
                target,
                None,
            ) {
                Ok(true) => self.nodes.caught_up(n),
                Ok(false) => {
                    if self.nodes.lagging(n) {
                        let k = self.cfg.failure.missed_heartbeats;
                        self.mark_down(
                            n,
                            format!("stopped taking heartbeats ({k} receipt checks behind)"),
                        );
                    }
                }
                Err(e) => self.blame(&e),
            }
        }
    }

    /// Takes node `n` out of the cluster: out of the heartbeat, out of allocation; its jobs end
    /// (or go back to the queue).
    pub(super) fn mark_down(&mut self, n: NodeId, reason: String) {
        if !self.nodes.set_down(n, reason.clone(), Instant::now()) {
            return;
        }
        tracing::error!(node = n, name = %self.node_name(n), "node is DOWN: {reason}");
        self.heartbeats.remove(n);
        self.policy.set_unavailable(n);
        let hit: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase != Phase::Queued && j.nodes.contains(n))
            .map(|j| j.id)
            .collect();
        let why = format!("node {n} ({}) failed: {reason}", self.node_name(n));
        for id in hit {
            let requeue = self
                .jobs
                .get(&id)
                .is_some_and(|j| j.req.requeue && j.cancel.is_none());
            if requeue {
                self.requeue(id, why.clone());
            } else {
                self.fail(id, why.clone());
            }
        }
    }

    /// Puts a started job back in the queue after a node failure: its processes elsewhere are
    /// killed, and it will run again from the start, on nodes the policy picks.
    fn requeue(&mut self, id: JobId, reason: String) {
        let Some(j) = self.jobs.remove(&id) else {
            return;
        };
        self.release(&j);
        let mut j = j;
        j.phase = Phase::Queued;
        j.nodes = NodeSet::new();
        j.slot = None;
        j.allocated = None;
        j.ready = None;
        j.launched = None;
        j.worker_cancel = None;
        j.terminating = false;
        j.time_slot = 0;
        let ask = JobAsk {
            job: id,
            nodes: j.plan.nodes,
            limit: j.limit,
        };
        let client = j.client;
        self.jobs.insert(id, j);
        self.policy.submit(ask, self.epoch.elapsed());
        self.unrecorded.insert(id);
        tracing::warn!(job = id, "requeued: {reason}");
        if let Some(c) = client {
            self.reply(c, Reply::Requeued { job: id, reason });
        }
    }
}
