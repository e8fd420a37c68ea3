//! Failure detection (paper Sec. 2.4.3) and what follows from a failed node.
//!
//! Every heartbeat has a deadline of `deadline_heartbeats` periods (`[failure]`), not the
//! seconds a program transfer may take, and the primitives name the nodes that did not
//! complete. Three signs of a failing member, all from the primitives:
//!
//! * a heartbeat whose XFER-AND-SIGNAL fails naming it (its connection closed or was refused:
//!   a dead NM, a crashed host; or it did not answer by the deadline: a frozen, overloaded or
//!   cut-off node, whose kernel may still acknowledge TCP);
//! * AWAIT-SPACE that finds its heartbeat queue full (it stopped taking heartbeats);
//! * a receipt check: every `check_interval_ms` one COMPARE-AND-WRITE asks whether every
//!   member took every heartbeat delivered before the previous check (a member admitted since
//!   then is judged from the next check on: its NM may not have taken its `Start` yet).
//!
//! A member named by any of them becomes *unresponsive* at once: it leaves the heartbeat (the
//! tcp tree is rebuilt over the others, and the failed heartbeat goes to them again under the
//! same sequence number; any that took it already skip the repeat), leaves allocation, keeps
//! its jobs, and is told to register again. It is DOWN once it has taken no heartbeat for K
//! periods (`missed_heartbeats`) without registering back; then each job that used it ends
//! with a reason naming the node, goes back to the queue if it never started or was submitted
//! with `--requeue`, and its processes on the other nodes are killed (`Forget`). Every
//! primitive the MM's loop waits on has the same deadline, so a slow node can hold the loop
//! (and the heartbeat to everyone) for at most one deadline, once.

use std::time::Instant;

use bytes::Bytes;
use storm_cluster::control::Reply;
use storm_cluster::messages::{JobId, Membership};
use storm_primitives::{NodeId, NodeSet, PrimError, Relation};

use super::{MachineManager, MmEnv, Phase};

/// Where a job goes back in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Requeue {
    /// It never started: ahead of every job waiting.
    Front,
    /// It ran (`--requeue`): behind every job waiting.
    Back,
}

impl<E: MmEnv> MachineManager<E> {
    /// The heartbeat in flight failed: the nodes it names leave the heartbeat, and the same
    /// heartbeat goes again, byte for byte, to the others. Nodes that took it all the same (a
    /// heartbeat is applied on each node as it arrives, so a failure leaves some signalled)
    /// skip the repeat.
    pub(super) fn heartbeat_failed(&mut self, e: PrimError, sent: Bytes) {
        self.hb.queue.unsend_last();
        self.hb.resend = Some(sent);
        if let Some(more) = self.hb.errors.allow(self.now()) {
            tracing::warn!(
                suppressed = more,
                "a heartbeat did not reach every node: {e}"
            );
        }
        self.blame(&e);
    }

    /// The members `e` names leave the heartbeat.
    pub(super) fn blame(&mut self, e: &PrimError) {
        self.blame_nodes(&e.blamed(), &e.to_string());
    }

    /// The members of `nodes` leave the heartbeat, for `reason`.
    pub(super) fn blame_nodes(&mut self, nodes: &NodeSet, reason: &str) {
        for n in nodes.iter() {
            if self.hb.queue.dest().contains(n) {
                self.set_unresponsive(n, reason.to_string());
            }
        }
    }

    /// Member `n` did not take a heartbeat in time (`reason`): it leaves the heartbeat and
    /// allocation, keeps its jobs, and is told to register again. It is DOWN if it has not
    /// come back K heartbeat periods after the last heartbeat it took.
    pub(super) fn set_unresponsive(&mut self, n: NodeId, reason: String) {
        if !self.nodes.set_unresponsive(n, reason.clone()) {
            return;
        }
        tracing::warn!(node = n, name = %self.node_name(n), "node is unresponsive; the heartbeat goes on without it: {reason}");
        self.metrics.heartbeat_missed();
        self.hb.queue.remove(n);
        self.policy.set_unavailable(n);
        let stamp = self.nodes.get(n).stamp_seen;
        self.send_membership(n, &Membership::Evicted { stamp });
        // A job that has not started cannot go on without the node (it would miss the
        // program's commands and the launch), and none of its code ran: it is placed again.
        let unstarted: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase != Phase::Queued && !j.phase.started() && j.nodes.contains(n))
            .map(|j| j.id)
            .collect();
        let why = format!(
            "node {n} ({}) stopped answering: {reason}",
            self.node_name(n)
        );
        for id in unstarted {
            self.node_lost_job(id, why.clone());
        }
    }

    /// Whether this MM looks cut off from its nodes rather than they failed: at least two of
    /// the nodes it heartbeats, and more than still answer, are unresponsive (they stopped
    /// answering within the last K heartbeat periods, or they would be DOWN). What it saw, if
    /// so. A single MM cannot act on it (nobody else can reach the nodes for it); the leader
    /// of a replicated group hands the group to another replica before any of them is DOWN
    /// (see the daemon).
    pub fn cut_off_from_nodes(&self) -> Option<String> {
        let unresponsive = self.nodes.unresponsive_count();
        if unresponsive < 2 {
            return None;
        }
        let answering = self.hb.queue.dest().len();
        (unresponsive > answering).then(|| {
            format!(
                "{unresponsive} of the {} nodes it heartbeats stopped answering ({answering} \
                 still answer)",
                unresponsive + answering
            )
        })
    }

    /// Whether the leader of a replicated group should hand the group over now, and why: it
    /// has looked cut off from its nodes ([`Self::cut_off_from_nodes`]) for half the time
    /// that makes a node DOWN (a stall that every node comes back from, as they register
    /// again at once when told they were evicted, is no cut), or the first of them would be
    /// DOWN within a quarter of that time, whichever comes first. Either way the hand-over
    /// comes before any node is DOWN, so no job ends for the leader's cut; how long finding
    /// the cut took (receipt checks, a quiet heartbeat's older last receipt) does not eat
    /// into that. The host calls it between timeslices and hands over when it says so.
    pub fn hand_over_due(&mut self) -> Option<String> {
        let Some(cut) = self.cut_off_from_nodes() else {
            self.hb.cut_since = None;
            return None;
        };
        let now = self.now();
        let since = *self.hb.cut_since.get_or_insert(now);
        let period = self.cfg.timeslice();
        let hold = period * (self.cfg.failure.missed_heartbeats / 2).max(1);
        let held = now.saturating_duration_since(since) >= hold;
        let down_soon = self
            .nodes
            .first_down_at(period)
            .is_some_and(|down| now + hold / 2 >= down);
        (held || down_soon).then_some(cut)
    }

    /// Nodes silent for K heartbeat periods are DOWN.
    pub(super) fn enforce_silence(&mut self, now: Instant) {
        let k = self.cfg.failure.missed_heartbeats;
        for (n, reason) in self.nodes.silent_too_long(now, self.cfg.timeslice()) {
            self.mark_down(
                n,
                format!("took no heartbeat for {k} heartbeat periods ({reason})"),
            );
        }
    }

    /// The receipt check: COMPARE-AND-WRITE on every member's heartbeat counter. A member
    /// found behind (alive on the network, but no longer taking heartbeats) is unresponsive.
    pub(super) fn check_receipt(&mut self) {
        let now = self.now();
        if now < self.hb.next_check {
            return;
        }
        self.hb.next_check =
            now + std::time::Duration::from_millis(self.cfg.failure.check_interval_ms);
        let target = std::mem::replace(&mut self.hb.check_target, self.hb.delivered);
        // A member admitted since the last check may not have taken its `Start` yet: its
        // counter is its last process's, behind a target it was never asked to meet.
        let joined = std::mem::take(&mut self.hb.joined_since_check);
        let members = self.hb.queue.dest().difference(&joined);
        if members.is_empty() {
            return;
        }
        let dequeued = self.rm.heartbeat.dequeued;
        let deadline = Some(self.cfg.heartbeat_deadline());
        match self.prims.compare_and_write_within(
            &members,
            dequeued,
            Relation::Ge,
            target,
            None,
            deadline,
        ) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("receipt check failed: {e}");
                self.blame(&e);
            }
        }
        // Someone is behind (or the check failed): ask each member alone.
        for n in members.iter() {
            if !self.hb.queue.dest().contains(n) {
                continue;
            }
            match self.prims.compare_and_write_within(
                &NodeSet::single(n),
                dequeued,
                Relation::Ge,
                target,
                None,
                deadline,
            ) {
                Ok(true) => {}
                Ok(false) => self.set_unresponsive(
                    n,
                    "stopped taking heartbeats (behind at a receipt check)".into(),
                ),
                Err(e) => self.blame(&e),
            }
        }
    }

    /// Takes node `n` out of the cluster: out of the heartbeat, out of allocation; its jobs end
    /// (or go back to the queue).
    pub(super) fn mark_down(&mut self, n: NodeId, reason: String) {
        let called_home = self.nodes.get(n).recalled.clone();
        if !self.nodes.set_down(n, reason.clone(), self.now()) {
            return;
        }
        tracing::error!(node = n, name = %self.node_name(n), "node is DOWN: {reason}");
        self.hb.queue.remove(n);
        self.policy.set_unavailable(n);
        let hit = self.jobs_on(n);
        // A borrowed node its owner called home with notice says why; one that went silent
        // without notice failed, or its owner took it without being able to say so (the
        // clusters could not speak, its lease ran out, or `storm reclaim --now`).
        let preempted = called_home.is_some();
        let why = match (self.cfg.nodes[n as usize].guest_of.as_ref(), called_home) {
            (Some(g), Some(home)) => format!(
                "node {n} ({}), borrowed from cluster {}: its owner took it back ({home})",
                self.node_name(n),
                g.cluster
            ),
            (Some(g), None) => format!(
                "node {n} ({}), borrowed from cluster {}, went silent without notice: it \
                 failed, or its owner took it back unannounced ({reason})",
                self.node_name(n),
                g.cluster
            ),
            (None, _) => format!("node {n} ({}) failed: {reason}", self.node_name(n)),
        };
        for id in hit {
            if preempted {
                self.node_called_home_under_job(id, why.clone());
            } else {
                self.node_lost_job(id, why.clone());
            }
        }
    }

    /// Job `id` lost a node, or its processes there (`why`). If none of its tasks can have
    /// started (its program was being sent, or its launch had not gone out), no user code ran:
    /// it goes back to the head of the queue by itself. A job that started ends, or, submitted
    /// with `--requeue`, goes back to the end of the queue. A cancelled job just ends.
    pub(super) fn node_lost_job(&mut self, id: JobId, why: String) {
        self.lose_job_node(id, why, storm_cluster::control::EndCause::NodeFail);
    }

    /// As [`Self::node_lost_job`], for a node its owner called home (a borrowed node): a job
    /// that started and did not ask to be requeued ends as `preempted`, not `node_fail`.
    pub(super) fn node_called_home_under_job(&mut self, id: JobId, why: String) {
        self.lose_job_node(id, why, storm_cluster::control::EndCause::Preempted);
    }

    /// Job `id` lost a node for `why`; a job that started, and ends for it, ends for `cause`.
    fn lose_job_node(&mut self, id: JobId, why: String, cause: storm_cluster::control::EndCause) {
        let Some(j) = self.jobs.get(&id) else {
            return;
        };
        if j.cancel.is_some() {
            self.fail(id, why);
            return;
        }
        match j.phase {
            Phase::Queued => {}
            Phase::Allocated
            | Phase::Checking { .. }
            | Phase::Sending { .. }
            | Phase::Verifying { .. }
            | Phase::Recording { .. }
            | Phase::Launching => self.requeue(
                id,
                format!("{why} (none of its tasks had started)"),
                Requeue::Front,
            ),
            Phase::Running | Phase::Recovering if j.req.requeue => {
                self.requeue(id, why, Requeue::Back)
            }
            Phase::Running | Phase::Recovering => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.end_cause = Some(cause);
                }
                self.fail(id, why)
            }
        }
    }

    /// Puts a started job back in the queue after a node failure: its processes elsewhere are
    /// killed, and it will run again from the start, on nodes the policy picks.
    pub(super) fn requeue(&mut self, id: JobId, reason: String, place: Requeue) {
        let Some(j) = self.remove_job(id) else {
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
        j.launched_ms = None;
        j.launched_to.clear();
        j.recovery = None;
        j.terminating = false;
        j.pmi_epoch = 0;
        j.first_end = None;
        j.time_slot = 0;
        // Other nodes: the program may be in place there, or not.
        j.forget_program_place();
        // The run that read it is gone; the next run's input starts afresh.
        j.held_input.clear();
        let ask = self.ask(&j);
        let client = j.client;
        // Restored jobs enter the policy when the hold after a restart ends.
        j.admitted = self.reattach.held.is_none();
        self.add_job(j);
        let now = self.since_epoch();
        match place {
            _ if self.reattach.held.is_some() => {}
            Requeue::Front => self.policy.submit_front(ask, now),
            Requeue::Back => self.policy.submit(ask, now),
        }
        self.outbox.unrecorded.insert(id);
        tracing::warn!(job = id, "requeued: {reason}");
        if let Some(c) = client {
            self.reply(c, Reply::Requeued { job: id, reason });
        }
    }
}
