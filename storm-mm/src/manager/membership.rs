//! Membership: how nodes join the heartbeat, and the operator's drain and resume.
//!
//! An NM registers by writing its inventory (the jobs it holds) into `inventory[node]` and
//! then a stamp (its pid and a generation) into `registry[node]` in the MM's memory. The MM
//! answers `Welcome` with the jobs the node keeps; the NM drops the others and writes the
//! stamp into `join_ack[node]`; the MM then sends `Start` with the heartbeat sequence number
//! the node joins at and adds it to the heartbeat's node set.
//!
//! **Silence is not a restart.** A registration from the same NM process (the same pid in
//! the stamp and the same start time in the inventory, [`NmProcess`]) after a gap, or from any
//! NM after the MM restarted, is *re-adoption*: the node keeps every job the MM knows as
//! running there and the inventory lists. A job the MM launched there but the inventory lacks
//! never reached the node (its Launch was in a heartbeat the node missed) and is launched
//! again; a cancel it missed is sent again; jobs it holds that the MM no longer knows are
//! dropped. Only a new NM process means the node lost its processes: its jobs end (or go back
//! to the queue) before the new membership begins. After a restart of the MM the journal says
//! which NM process each launch went to, and only that process's word that it lacks the job
//! sends the launch again (any other NM may have run some of it before it was lost).
//! Unresponsive, down and unknown nodes are nudged (`Evicted`) once a second, so an NM whose
//! link came back, or that outlived an MM restart, registers at once.
//!
//! The registry is read when some NM raised `registered`, and in the once-a-second sweep
//! ([`super::attention`]); in other timeslices only the nodes being welcomed are looked at.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use storm_cluster::messages::{
    Command, HeldJob, Inventory, JobId, Membership, SealedMembership, decode_sealed, encode_sealed,
};
use storm_primitives::{NodeId, NodeSet, Wait};

use super::{MachineManager, MmEnv, Phase};
use crate::nodes::{Life, NmProcess};

/// How long the MM waits for a welcome's acknowledgement before welcoming again.
const WELCOME_RETRY: Duration = Duration::from_secs(1);

/// How often down and unknown nodes are told to register.
const NUDGE_EVERY: Duration = Duration::from_secs(1);

impl<E: MmEnv> MachineManager<E> {
    /// Answers registrations and acknowledgements; nudges nodes that are not members.
    pub(super) fn membership(&mut self) {
        // Signals and completions only say "look"; the registry and the acknowledgements in
        // memory say what happened, and unanswered messages are sent again.
        for event in [self.rm.registered, self.rm.join_sent] {
            while let Ok(true) = self.prims.test_event(event, Wait::Poll) {}
        }
        if self.attention.sweep {
            self.end_run_out_leases();
        }
        let now = self.now();
        let prims = self.prims.clone();
        let mem = prims.memory();
        // Every node when one registered (its registry entry says which) or in a sweep;
        // otherwise only the nodes being welcomed.
        let look: Vec<NodeId> = if self.attention.sweep || self.attention.registrations {
            (0..self.nodes.len() as NodeId).collect()
        } else {
            self.attention.joining.iter().copied().collect()
        };
        for n in look {
            let stamp = mem.load(self.rm.registry.at(n as usize));
            if stamp != 0
                && stamp != self.nodes.get(n).stamp_seen
                && !self.registered(n, stamp, now)
            {
                // Its inventory is still on its way: look again next timeslice.
                self.attention.joining.insert(n);
                continue;
            }
            match self.nodes.get(n).life().clone() {
                Life::Joining { stamp, sent } => {
                    self.attention.joining.insert(n);
                    if mem.load(self.rm.join_ack.at(n as usize)) == stamp {
                        self.admit(n, stamp);
                    } else if now.duration_since(sent) >= WELCOME_RETRY {
                        let keep = self.nodes.get(n).keep.clone();
                        self.welcome(n, stamp, keep, now);
                    }
                }
                Life::Down { .. } | Life::Unknown | Life::Unresponsive { .. } => {
                    self.attention.joining.remove(&n);
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
                Life::Up { .. } => {
                    self.attention.joining.remove(&n);
                }
            }
        }
    }

    /// An NM registered with a stamp the MM has not acted on. False if its inventory is not
    /// all here yet.
    fn registered(&mut self, n: NodeId, stamp: u64, now: Instant) -> bool {
        let Some(inventory) = self.read_inventory(n, stamp) else {
            return false;
        };
        // A guest slot is admitted only under a lease its lender signed: the lending node's
        // root holds the slot's keys for good, not a lease.
        if let Some(why) = self.lease_refused(n, &inventory) {
            let node = self.nodes.get_mut(n);
            node.stamp_seen = stamp;
            tracing::warn!(node = n, name = %self.node_name(n), "refusing the registration of a guest slot: {why}");
            return true;
        }
        self.nodes.get_mut(n).lease_until_ms = inventory.lease.as_ref().map(|g| g.until_ms);
        let process = NmProcess::of(stamp, &inventory);
        // Before any registration (`None`) this MM has just started: whatever the NM holds
        // may be ours to re-adopt.
        let same_process = self.nodes.get(n).nm.is_none_or(|p| p == process);
        if self.nodes.is_up(n) {
            // Registering again while a member: it stopped hearing heartbeats. It rejoins at
            // a new sequence number.
            self.hb.queue.remove(n);
            self.policy.set_unavailable(n);
        }
        let node = self.nodes.get_mut(n);
        node.stamp_seen = stamp;
        node.nm = Some(process);
        // The memory jobs may use there: declared, else what the NM found.
        let mem = self.cfg.nodes[n as usize]
            .mem
            .map_or(inventory.mem, |m| m.0);
        self.node_mem[n as usize] = mem;
        self.policy.set_node_memory(n, mem);
        let keep = if same_process {
            self.readopt(n, process, &inventory)
        } else {
            if !matches!(self.nodes.get(n).life(), Life::Down { .. }) {
                self.mark_down(n, "its node manager restarted".into());
            }
            Vec::new()
        };
        tracing::info!(node = n, name = %self.node_name(n), stamp = format!("{stamp:#x}"), kept = ?keep, "node manager registered");
        self.welcome(n, stamp, keep, now);
        true
    }

    /// Why guest slot `n`'s registration with `inventory` is refused, if it is: it shows no
    /// lease grant from the slot's lender, or one that lends another node, to another
    /// cluster, that ran out, or that the lender's MM did not sign. `None` for an own node.
    fn lease_refused(&mut self, n: NodeId, inventory: &Inventory) -> Option<String> {
        let g = self.cfg.nodes[n as usize].guest_of.clone()?;
        let Some(grant) = &inventory.lease else {
            return Some(format!(
                "it shows no grant of a lease from {} (an NM that is no lent node's guest)",
                g.cluster
            ));
        };
        let keys = self.env.lender_keys(&g.cluster);
        grant
            .check(
                &keys,
                (&g.cluster, &g.node),
                &self.cfg.cluster.name,
                self.unix_ms(),
            )
            .err()
    }

    /// Guest slots whose lease ran out leave: their lender's grant is over, whatever their
    /// guest does (the lending node's root may keep it running).
    pub(super) fn end_run_out_leases(&mut self) {
        let now_ms = self.unix_ms();
        let over: Vec<(NodeId, u64)> = (0..self.nodes.len() as NodeId)
            .filter_map(|n| Some((n, self.nodes.get(n).lease_until_ms?)))
            .filter(|&(_, until)| until <= now_ms)
            .collect();
        for (n, _) in over {
            self.nodes.get_mut(n).lease_until_ms = None;
            let lender = self.cfg.nodes[n as usize]
                .guest_of
                .as_ref()
                .map_or("", |g| g.cluster.as_str())
                .to_string();
            if !matches!(self.nodes.get(n).life(), Life::Down { .. } | Life::Unknown) {
                self.mark_down(n, format!("its lease from cluster {lender} ran out"));
            }
        }
    }

    /// The inventory node `n` wrote with registration `stamp`, once it has arrived whole.
    fn read_inventory(&self, n: NodeId, stamp: u64) -> Option<Inventory> {
        let bytes = self
            .prims
            .memory()
            .read_vec(
                self.rm.inventory_offset(n as usize),
                self.rm.inventory_bytes,
            )
            .ok()?;
        // Another stamp, or bytes that do not decode: the inventory of this registration is
        // still on its way (the NM writes it again with every retry).
        match decode_sealed::<Inventory>("inventory", &bytes, self.rm.inventory_bytes) {
            Ok(inv) if inv.stamp == stamp => Some(inv),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(node = n, "inventory not readable yet: {e}");
                None
            }
        }
    }

    /// The same NM `process` (or any NM, just after this MM started) is back: the jobs it
    /// keeps.
    ///
    /// * A job the MM knows on `n` that the inventory lists stays (a cancel it may have
    ///   missed is sent again).
    /// * A recovering job (it ran when this MM restarted) counts `n` as holding it or not;
    ///   [`MachineManager::advance_recoveries`] decides once all its nodes have answered.
    /// * A job launched on `n` that the inventory lacks never reached it (its heartbeat was
    ///   missed while `n` was out of the heartbeat): it is launched again there.
    fn readopt(&mut self, n: NodeId, process: NmProcess, inventory: &Inventory) -> Vec<JobId> {
        let held: HashMap<JobId, HeldJob> = inventory.jobs.iter().map(|h| (h.job, *h)).collect();
        let mine = self.jobs_on(n);
        let mut keep = Vec::new();
        for id in mine {
            let j = self.jobs.get_mut(&id).expect("listed");
            let holds = held
                .get(&id)
                .is_some_and(|h| Some(h.slot as usize) == j.slot);
            if let Some(r) = &mut j.recovery {
                // The NM process the launch went to, without the job, never got the launch
                // (the MM died before its heartbeat arrived); any other NM may have run some
                // of it before its tasks were lost with the process that held them. (Until
                // 29 November this was judged by the NM's start time against the launch's, on
                // two hosts' clocks: a node's clock behind the MM's by more than 100 ms could
                // run a job's code twice, one ahead failed a job that never ran.)
                let never_reached = j.launched_to.contains(&(n, process));
                if holds {
                    r.held.insert(n);
                } else if never_reached {
                    r.unlaunched.insert(n);
                } else {
                    r.missing.insert(n);
                }
            }
            if holds {
                keep.push(id);
                if let Some(c) = &j.cancel {
                    let signal = if c.killed {
                        libc::SIGKILL
                    } else {
                        libc::SIGTERM
                    };
                    self.hb
                        .commands
                        .push_back(Command::Signal { job: id, signal });
                }
                continue;
            }
            if j.phase == Phase::Running {
                tracing::info!(
                    job = id,
                    node = n,
                    "launching again on a node that missed the launch"
                );
                let spec = j.launch_spec(self.cfg.capacity().cpus_per_node);
                self.launch_in_heartbeats(spec);
            }
        }
        keep
    }

    /// Starts a new membership for `n`: a fresh output queue epoch, and `Welcome` with the
    /// jobs it keeps. A welcome sent again for the same registration (its acknowledgement did
    /// not come) keeps the epoch and the output queue as they are: the NM may have sent output
    /// in that epoch since it took the first welcome.
    fn welcome(&mut self, n: NodeId, stamp: u64, keep: Vec<JobId>, now: Instant) {
        let node = self.nodes.get_mut(n);
        let again = matches!(node.life(), Life::Joining { stamp: s, .. } if *s == stamp);
        if !again {
            node.output_epoch += 1;
        }
        let output_epoch = node.output_epoch;
        node.keep = keep.clone();
        self.nodes.set_joining(n, stamp, now);
        if !again {
            self.restart_output(n, output_epoch);
        }
        self.send_membership(
            n,
            &Membership::Welcome {
                stamp,
                output_epoch,
                incarnation: self.reattach.incarnation,
                keep,
            },
        );
    }

    /// The NM carried out the welcome: it joins the heartbeat at the next sequence number.
    fn admit(&mut self, n: NodeId, stamp: u64) {
        let seq = self.hb.queue.next_seq();
        self.send_membership(n, &Membership::Start { stamp, seq });
        self.hb.queue.add(n);
        self.hb.joined_since_check.insert(n);
        let now = self.now();
        self.nodes.set_up(n, stamp, now);
        if self.nodes.is_available(n) {
            self.policy.set_available(n);
        }
        if let Some(cmd) = self.lease_command_for(n) {
            self.hb.commands.push_back(cmd);
        }
        tracing::info!(node = n, name = %self.node_name(n), "node is up");
    }

    /// Writes a membership message into node `n`'s join area and signals it. Non-blocking:
    /// a message that does not arrive is sent again by whoever waits for its answer.
    pub(super) fn send_membership(&self, n: NodeId, msg: &Membership) {
        let sealed = SealedMembership {
            seal: self.signer.seal_membership(n, msg, self.unix_ms()),
            msg: msg.clone(),
        };
        let bytes = match encode_sealed("membership", &sealed, self.rm.membership_bytes) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("cannot encode {msg:?}: {e}");
                return;
            }
        };
        // A heartbeat's deadline: a message to a silent node must not stay in flight for the
        // seconds of the operation timeout (on ofi it holds up the MM's later transfers).
        if let Err(e) = self.prims.xfer_and_signal_within(
            &NodeSet::single(n),
            self.rm.join.offset,
            Bytes::from(bytes),
            Some(self.rm.joined),
            Some(self.rm.join_sent),
            Some(self.cfg.heartbeat_deadline()),
        ) {
            tracing::debug!(node = n, "cannot send {msg:?}: {e}");
        }
    }

    pub(super) fn node_name(&self, n: NodeId) -> &str {
        &self.cfg.nodes[n as usize].name
    }

    /// Checks that every node of `nodes` is in the cluster.
    pub(super) fn check_nodes(&self, nodes: &NodeSet) -> Result<(), String> {
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
            self.outbox.journal.put_node(n, self.nodes.record(n));
        }
        tracing::info!(nodes = %nodes, "drained: {reason}");
        Ok(())
    }

    /// `storm resume`: ends a drain; nodes that are up take jobs again.
    pub(super) fn resume(&mut self, nodes: &NodeSet) -> Result<(), String> {
        self.check_nodes(nodes)?;
        for n in nodes.iter() {
            self.nodes.get_mut(n).drain = None;
            self.outbox.journal.put_node(n, self.nodes.record(n));
            if self.nodes.is_available(n) {
                self.policy.set_available(n);
            }
        }
        tracing::info!(nodes = %nodes, "resumed");
        Ok(())
    }
}
