//! Borrowing nodes for waiting jobs, on the borrower's side (docs/federation.md, lending),
//! and `--less`.
//!
//! **What this cluster asks its lenders for.** The peer agent fetches [`BorrowOrder`]s every
//! `advertise_ms` ([`Request::BorrowOut`]) and passes each to its lender, which lends idle
//! nodes of those asked for (see [`super::lending`]). The orders are worked out afresh from
//! the queue each time, so nothing of them needs a journal:
//!
//! * each `--borrow` job waiting in the policy's queue, in submission order, takes the idle
//!   nodes it may use here (own nodes, and guest slots already up); what it still lacks it
//!   asks of the lenders whose slots it may use, in `[federation] lenders` order (most idle
//!   nodes offered first, or highest `[[peer]] priority`), a lender that has not lent within
//!   [`patience`] passing the job on to the next;
//! * guest slots up and idle that no waiting job counts on are given back: the lender takes
//!   home what it lent on asking (an operator's lease stays until it ends). A slot the
//!   lender said it lent on this cluster's asking ([`LentNode::on_asking`]) takes no new job
//!   once given back, until its guest stops: one placed on it meanwhile would lose it without
//!   notice. A slot lent by the lender's operator stays open to jobs (its lease ignores the
//!   giving back), as does one this MM never heard how it was lent (it restarted since).
//!
//! **Nodes called home.** A lender that calls home a node it lent here says so through the
//! agents ([`Request::Recalled`]): the slot takes no new job, the jobs on it lose it with the
//! lender's reason (requeued if they asked, else ended), and it is given back as soon as none
//! holds it, within the lender's `vacate_ms`.
//!
//! **`--less`.** A job that may start on fewer nodes is shrunk, when it is the first job
//! waiting, to the idle nodes it may use now (once its lenders had their chance, for a
//! `--borrow` job): its request says so from then on (journaled), with as many tasks per node
//! as before.
//!
//! [`Request::BorrowOut`]: storm_cluster::control::Request::BorrowOut
//! [`Request::Recalled`]: storm_cluster::control::Request::Recalled

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use storm_cluster::federation::{BorrowOrder, LenderOrder, LentNode};
use storm_cluster::messages::JobId;
use storm_primitives::NodeId;

use super::{MachineManager, MmEnv, Phase};

/// What the borrower remembers between passes (soft state: lost with the MM, and then the
/// lenders are simply asked again).
#[derive(Debug, Default)]
pub(super) struct Borrowing {
    /// When each waiting job first asked each lender.
    asked: BTreeMap<(JobId, String), Instant>,
    /// When each lender last answered an asking (through the agent).
    answered: BTreeMap<String, Instant>,
    /// The guest slots whose nodes the lenders last said they lend this cluster, not up
    /// yet, and since when each has been so.
    coming: BTreeMap<NodeId, Instant>,
    /// The guest slots whose lenders said they lent them on this cluster's asking, while they
    /// are coming or up: given back, they go home.
    on_asking: BTreeSet<NodeId>,
    /// When the queue was last looked at for `--less` jobs.
    last_pass: Option<Instant>,
}

/// The longest reason of a lender's call home that this cluster keeps (characters): the rest
/// is cut, so that a peer cannot fill the borrower's job records.
const MAX_RECALL_REASON: usize = 200;

/// How often the queue is looked at for `--less` jobs (and, at a lender, for jobs of its own
/// that want lent nodes back).
const PASS_EVERY: Duration = Duration::from_millis(50);

impl<E: MmEnv> MachineManager<E> {
    /// How long a job waits on one lender before it asks the next (and a `--less` job before
    /// it settles for fewer nodes): four of the agents' periods, in which an order reaches the
    /// lender, its node starts a guest NM, and the guest joins this cluster.
    fn patience(&self) -> Duration {
        self.cfg.federation.advertise_every() * 4
    }

    /// Jobs waiting in the policy's queue for nodes, oldest first.
    pub(super) fn waiting_jobs(&self) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|j| {
                j.phase == Phase::Queued
                    && j.admitted
                    && j.flocked.is_none()
                    && j.cancel.is_none()
                    && j.req.step_of.is_none()
            })
            .map(|j| j.id)
            .collect()
    }

    /// Nodes that may take a job now and run none: up, in service, idle.
    pub(super) fn idle_nodes(&self) -> Vec<NodeId> {
        self.idle_besides(&self.busy_nodes())
    }

    /// Nodes a started job holds.
    fn busy_nodes(&self) -> BTreeSet<NodeId> {
        self.jobs
            .values()
            .filter(|j| j.phase != Phase::Queued)
            .flat_map(|j| j.nodes.iter())
            .collect()
    }

    /// The available nodes that are not in `busy`.
    fn idle_besides(&self, busy: &BTreeSet<NodeId>) -> Vec<NodeId> {
        (0..self.nodes.len() as NodeId)
            .filter(|&n| self.nodes.is_available(n) && !busy.contains(&n))
            .collect()
    }

    /// The started jobs that hold node `n`.
    pub(super) fn jobs_on(&self, n: NodeId) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|j| j.phase != Phase::Queued && j.nodes.contains(n))
            .map(|j| j.id)
            .collect()
    }

    /// The lenders a job asks, in `[federation] lenders` order.
    fn lender_order(&self) -> Vec<String> {
        let mut order = self.lenders_by_priority();
        if self.cfg.federation.lenders == LenderOrder::MostFree {
            order.sort_by_key(|l| std::cmp::Reverse(self.peer_room.offered_nodes(l)));
        }
        order
    }

    /// Answers the lenders gave since the agent last asked (lender, its nodes lent to this
    /// cluster now).
    pub(super) fn lenders_answered(&mut self, lent: Vec<(String, Vec<LentNode>)>) {
        let now = self.now();
        // One index of the slots: a lender's answer costs time in its length only.
        let index: BTreeMap<(&str, &str), NodeId> = self
            .cfg
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let g = e.guest_of.as_ref()?;
                Some(((g.cluster.as_str(), g.node.as_str()), i as NodeId))
            })
            .collect();
        let mut answered: Vec<(String, BTreeSet<NodeId>)> = Vec::new();
        for (lender, nodes) in &lent {
            let mut slots = BTreeSet::new();
            for lent in nodes {
                let Some(&n) = index.get(&(lender.as_str(), lent.node.as_str())) else {
                    continue;
                };
                slots.insert(n);
                if lent.on_asking {
                    self.borrowing.on_asking.insert(n);
                } else {
                    self.borrowing.on_asking.remove(&n);
                }
            }
            answered.push((lender.clone(), slots));
        }
        for (lender, slots) in answered {
            let of_lender = |n: &NodeId| {
                self.cfg.nodes[*n as usize]
                    .guest_of
                    .as_ref()
                    .is_some_and(|g| g.cluster == lender)
            };
            let b = &mut self.borrowing;
            b.coming.retain(|n, _| !of_lender(n) || slots.contains(n));
            for n in slots {
                b.coming.entry(n).or_insert(now);
            }
            b.answered.insert(lender, now);
        }
        let nodes = &self.nodes;
        self.borrowing.coming.retain(|&n, _| !nodes.is_up(n));
    }

    /// Forgets how the slots neither coming nor up were lent: a later lease of the same
    /// node may be an operator's.
    fn forget_slots_gone(&mut self) {
        let (nodes, b) = (&self.nodes, &mut self.borrowing);
        b.on_asking
            .retain(|n| nodes.is_up(*n) || b.coming.contains_key(n));
    }

    /// Whether every lender waiting job `id` asked has answered since (or been given up on
    /// after the patience), and one was asked at all. An answer counts from two of the
    /// agent's periods after the asking: one the agent may take to send it, one in which an
    /// answer to an earlier asking may still arrive.
    fn lenders_have_answered(&self, id: JobId) -> bool {
        let now = self.now();
        let settle = self.cfg.federation.advertise_every() * 2;
        let mut asked = self
            .borrowing
            .asked
            .range((id, String::new())..)
            .take_while(|((job, _), _)| *job == id)
            .peekable();
        if asked.peek().is_none() {
            return false;
        }
        asked.all(|((_, lender), &since)| {
            self.borrowing
                .answered
                .get(lender)
                .is_some_and(|&at| at >= since + settle)
                || now.saturating_duration_since(since) > self.patience()
        })
    }

    /// Whether a guest slot job bits `bits` may use is lent to this cluster and on its way
    /// (for at most ten patiences: a guest that never comes is not waited for).
    fn slot_coming(&self, bits: u64) -> bool {
        let now = self.now();
        let limit = self.patience() * 10;
        self.borrowing.coming.iter().any(|(&n, &since)| {
            !self.nodes.is_up(n)
                && self.node_features[n as usize] & bits == bits
                && now.saturating_duration_since(since) < limit
        })
    }

    /// What this cluster wants of each lender now (the peer agent's
    /// [`storm_cluster::control::Request::BorrowOut`]).
    pub(super) fn borrow_orders(&mut self) -> Vec<BorrowOrder> {
        if !self.has_guests {
            return Vec::new();
        }
        self.forget_slots_gone();
        let now = self.now();
        let patience = self.patience();
        let order = self.lender_order();
        let busy = self.busy_nodes();
        let mut idle = self.idle_besides(&busy);
        let mut counted_on: BTreeSet<NodeId> = BTreeSet::new();
        let mut claimed: BTreeSet<NodeId> = BTreeSet::new();
        let mut orders: BTreeMap<String, BorrowOrder> = BTreeMap::new();
        // Each lender's guest slots, once.
        let mut slots_of: BTreeMap<&str, Vec<NodeId>> = BTreeMap::new();
        for (i, e) in self.cfg.nodes.iter().enumerate() {
            if let Some(g) = &e.guest_of {
                slots_of
                    .entry(g.cluster.as_str())
                    .or_default()
                    .push(i as NodeId);
            }
        }
        let waiting = self.waiting_jobs();
        for &id in &waiting {
            let j = &self.jobs[&id];
            let need = j.plan.nodes;
            let bits = self.feature_bits(&j.req, need);
            let fits = |n: NodeId| self.node_features[n as usize] & bits == bits;
            let mine: Vec<NodeId> = idle
                .iter()
                .copied()
                .filter(|&n| fits(n))
                .take(need as usize)
                .collect();
            idle.retain(|n| !mine.contains(n));
            counted_on.extend(mine.iter().filter(|&&n| self.cfg.is_guest(n)));
            let mut short = need - mine.len() as u32;
            if short == 0 || !j.req.borrow {
                continue;
            }
            let for_ms = j
                .req
                .time_limit_ms
                .map_or(self.cfg.federation.borrow_lease_ms, |limit| limit + 60_000);
            // The lenders this job asked lately first (they may be lending already), then
            // the others in order.
            let waited: BTreeMap<&String, Duration> = order
                .iter()
                .filter_map(|l| {
                    let since = self.borrowing.asked.get(&(id, l.clone()))?;
                    Some((l, now.saturating_duration_since(*since)))
                })
                .collect();
            let lately = |l: &String| waited.get(l).is_some_and(|w| *w <= patience);
            let mut mine_order: Vec<&String> = order.iter().collect();
            mine_order.sort_by_key(|l| !lately(l));
            for lender in mine_order {
                // A lender is asked for the patience, then left for twice as long (the next
                // one's turn), then asked again. One offering nothing is not asked anew.
                match waited.get(lender) {
                    Some(w) if *w > patience * 3 => {
                        self.borrowing.asked.remove(&(id, lender.clone()));
                    }
                    Some(w) if *w > patience => continue,
                    _ => {}
                }
                if !lately(lender) && self.peer_room.offered_nodes(lender) == 0 {
                    continue;
                }
                // Its slots this job may use that are not up here, and not asked for by an
                // earlier job.
                let slots: Vec<NodeId> = slots_of
                    .get(lender.as_str())
                    .into_iter()
                    .flatten()
                    .copied()
                    .filter(|&n| fits(n) && !self.nodes.is_up(n) && !claimed.contains(&n))
                    .collect();
                let take = short.min(slots.len() as u32);
                if take == 0 {
                    continue;
                }
                self.borrowing
                    .asked
                    .entry((id, lender.clone()))
                    .or_insert(now);
                let o = orders.entry(lender.clone()).or_insert_with(|| BorrowOrder {
                    peer: lender.clone(),
                    want: Vec::new(),
                    count: 0,
                    for_ms: 0,
                    give_back: Vec::new(),
                });
                // The lender picks among all of them: any idle one will do.
                for &n in &slots {
                    let name = self.guest_name(n);
                    if !o.want.contains(&name) {
                        o.want.push(name);
                    }
                }
                claimed.extend(slots.iter().take(take as usize));
                o.count += take;
                o.for_ms = o.for_ms.max(for_ms);
                short -= take;
                if short == 0 {
                    break;
                }
            }
        }
        self.borrowing
            .asked
            .retain(|(job, _), _| waiting.contains(job));
        // Slots called home, or given back already, go (again) once no job holds them.
        let going = (0..self.nodes.len() as NodeId).filter(|&n| {
            let node = self.nodes.get(n);
            self.nodes.is_up(n)
                && (node.recalled.is_some() || node.given_back)
                && !busy.contains(&n)
        });
        idle.extend(going);
        // Slots up and idle that no waiting job counts on go back.
        for n in idle {
            let Some(g) = self.cfg.nodes[n as usize].guest_of.as_ref() else {
                continue;
            };
            if counted_on.contains(&n) {
                continue;
            }
            if self.borrowing.on_asking.contains(&n) && !self.nodes.get(n).given_back {
                tracing::info!(node = n, name = %self.node_name(n), lender = %g.cluster,
                    "given back idle: it takes no new job until it is home");
                self.nodes.get_mut(n).given_back = true;
                self.policy.set_unavailable(n);
            }
            orders
                .entry(g.cluster.clone())
                .or_insert_with(|| BorrowOrder {
                    peer: g.cluster.clone(),
                    want: Vec::new(),
                    count: 0,
                    for_ms: 0,
                    give_back: Vec::new(),
                })
                .give_back
                .push(g.node.clone());
        }
        orders.into_values().collect()
    }

    /// Lender `peer` calls `nodes` (its names) home: each slot of them that is up here takes
    /// no new job, and the jobs on it lose it with the lender's reason: requeued if they
    /// asked for it, else ended. It goes back with the next orders once no job holds it.
    pub(super) fn recalled(&mut self, peer: &str, nodes: &[storm_cluster::federation::Recalled]) {
        let slots: BTreeMap<&str, NodeId> = self
            .cfg
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let g = e.guest_of.as_ref().filter(|g| g.cluster == peer)?;
                Some((g.node.as_str(), i as NodeId))
            })
            .collect();
        // The lender's words go into this cluster's job records: at most a line of them.
        let bounded = |why: &str| -> String {
            match why.char_indices().nth(MAX_RECALL_REASON) {
                Some((at, _)) => format!("{}…", &why[..at]),
                None => why.to_string(),
            }
        };
        let called: Vec<(NodeId, String)> = nodes
            .iter()
            .filter_map(|r| Some((*slots.get(r.node.as_str())?, bounded(&r.why))))
            .filter(|&(n, _)| self.nodes.is_up(n) && self.nodes.get(n).recalled.is_none())
            .collect();
        for (n, why) in called {
            tracing::info!(node = n, name = %self.node_name(n), %peer, "its owner calls it home: {why}");
            self.nodes.get_mut(n).recalled = Some(why.clone());
            self.policy.set_unavailable(n);
            let reason = format!(
                "node {n} ({}), borrowed from cluster {peer}: its owner took it back ({why})",
                self.node_name(n)
            );
            for id in self.jobs_on(n) {
                self.node_called_home_under_job(id, reason.clone());
            }
        }
    }

    /// The lender's name of guest slot `n`.
    fn guest_name(&self, n: NodeId) -> String {
        self.cfg.nodes[n as usize]
            .guest_of
            .as_ref()
            .map(|g| g.node.clone())
            .unwrap_or_default()
    }

    /// At most every [`PASS_EVERY`]: shrinks the first waiting job, if it allows it
    /// (`--less`), to the idle nodes it may use; and, at a lender, takes back nodes lent on
    /// asking when a job of this cluster waits for nodes, and every node lent to a peer
    /// gone for the peer timeout.
    pub(super) fn share_nodes(&mut self) {
        let now = self.now();
        if self
            .borrowing
            .last_pass
            .is_some_and(|t| now.saturating_duration_since(t) < PASS_EVERY)
        {
            return;
        }
        self.borrowing.last_pass = Some(now);
        self.shrink_first_waiting();
        // Only a cluster with peers has nodes lent out: spare the others two scans of every
        // job and node, twenty times a second.
        if !self.cfg.peers.is_empty() {
            self.reclaim_for_own_queue();
            self.take_home_from_gone_borrowers();
        }
    }

    /// `--less`: the first waiting job, if it allows fewer nodes and cannot have all it asked
    /// for now, is shrunk to the idle nodes it may use (at least one). A `--borrow` job first
    /// hears from the lenders it asked (or gives each up after the
    /// [`patience`](Self::patience); with none to ask, it waits that long), and waits for the
    /// nodes they said they lend it to come up.
    fn shrink_first_waiting(&mut self) {
        let Some(&id) = self.waiting_jobs().first() else {
            return;
        };
        let j = &self.jobs[&id];
        if !j.req.less || j.plan.nodes <= 1 {
            return;
        }
        let waited = self.now().saturating_duration_since(j.submitted);
        let bits = self.feature_bits(&j.req, j.plan.nodes);
        if j.req.borrow
            && self.has_guests
            && (self.slot_coming(bits)
                || (!self.lenders_have_answered(id) && waited < self.patience()))
        {
            return;
        }
        let have = self
            .idle_nodes()
            .into_iter()
            .filter(|&n| self.node_features[n as usize] & bits == bits)
            .count() as u32;
        if have == 0 || have >= j.plan.nodes {
            return;
        }
        let from = j.plan.nodes;
        let tasks = j.req.tasks.shrunk(&j.plan, have);
        // The rank that reads standard input (`-i N`) must still be there.
        if let storm_cluster::messages::InputTarget::Rank(r) = j.req.input
            && tasks.ntasks.is_some_and(|t| t <= r)
        {
            return;
        }
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        j.req.tasks = tasks;
        let Ok(plan) = self.plan(&self.jobs[&id].req) else {
            return;
        };
        let j = self.jobs.get_mut(&id).expect("the job is here");
        j.plan = plan;
        self.policy.withdraw(id);
        let ask = self.ask(&self.jobs[&id]);
        self.policy.submit_front(ask, self.since_epoch());
        self.outbox.unrecorded.insert(id);
        tracing::info!(
            job = id,
            from,
            to = have,
            "--less: the job starts on fewer nodes"
        );
    }
}
