//! COMPARE-AND-WRITE over the tcp tree: a reduction of local comparisons, then a write.
//!
//! Every COMPARE-AND-WRITE on a node set runs at that set's *root*, its smallest node, over
//! the k-ary tree rooted there. The origin sends the request to the root; the root runs the
//! operations it receives one at a time:
//!
//! 1. `Compare` goes down the tree; every node evaluates `global[var] REL value` and answers
//!    `Vote` with the AND of its own result and its children's votes.
//! 2. If the root's AND is true and a write was asked, `Write` goes down and every node writes
//!    before answering `Written`; otherwise `Release` tells nodes holding the operation to
//!    forget it.
//! 3. The root sends `Done` with the result to the origin.
//!
//! Because all operations on one node set pass through one root in one order, concurrent
//! callers with the same set are sequentially consistent: they take effect one after another,
//! and every node sees the same last write. Any node that cannot be reached fails the
//! operation; if that happens during the write phase, nodes that already wrote keep the value
//! (docs/primitives.md explains this window).
//!
//! **Time.** An operation of timeout T spends at most T/4 queued at the root, T/2 comparing and
//! T/4 writing, so the root answers within T; the origin blames the root itself only if it
//! has not answered by then. Each node waits for its children's votes for its level's share of
//! the compare time ([`Tree::patience`]: the deeper, the shorter, evenly spaced), so the
//! lowest node with a silent child gives up first and names that child.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::node::Inner;
use super::tree::Tree;
use super::wire::{CawMsg, CawRequest, Control, OpKey};
use crate::error::{PrimError, Result};
use crate::layout::VarId;
use crate::nodeset::{NodeId, NodeSet};
use crate::relation::Relation;

const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// The compare phase's share of an operation's time (the root's; deeper nodes wait less).
fn compare_time(timeout_ms: u64) -> Duration {
    Duration::from_millis(timeout_ms) / 2
}

/// The queue's and the write phase's share.
fn quarter(timeout_ms: u64) -> Duration {
    Duration::from_millis(timeout_ms) / 4
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the children's votes.
    Comparing,
    /// A member that voted and waits for `Write` or `Release`.
    Voted,
    /// Waiting for the children's `Written`.
    Writing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Child {
    Pending,
    Voted,
    Written,
}

struct CawOp {
    req: CawRequest,
    /// `None` at the root.
    parent: Option<NodeId>,
    children: Vec<(NodeId, Child)>,
    holds: bool,
    phase: Phase,
    deadline: Instant,
}

impl CawOp {
    fn set_child(&mut self, child: NodeId, from: Child, to: Child) -> bool {
        match self.children.iter_mut().find(|(c, _)| *c == child) {
            Some((_, s)) if *s == from => {
                *s = to;
                true
            }
            _ => false,
        }
    }
    fn all_children(&self, state: Child) -> bool {
        self.children.iter().all(|&(_, s)| s == state)
    }
}

/// A request waiting at the root, with when it arrived.
struct Queued {
    req: CawRequest,
    arrived: Instant,
}

/// COMPARE-AND-WRITE state at one node: callers waiting here, requests queued here as root,
/// and operations in progress here.
#[derive(Default)]
pub(crate) struct CawTable {
    waiters: HashMap<OpKey, (NodeId, Sender<Result<bool>>)>,
    queue: VecDeque<Queued>,
    active: Option<OpKey>,
    ops: HashMap<OpKey, CawOp>,
}

fn caw(msg: CawMsg) -> Control {
    Control::Caw(msg)
}

impl Inner {
    /// Runs a COMPARE-AND-WRITE from this node and waits at most `timeout` for its result.
    pub(crate) fn run_caw(
        self: &Arc<Self>,
        dest: &NodeSet,
        var: VarId,
        rel: Relation,
        value: u64,
        write: Option<(VarId, u64)>,
        timeout: Duration,
    ) -> Result<bool> {
        let Some(root) = dest.first() else {
            return Ok(true); // holds vacuously on no nodes
        };
        let key = OpKey {
            origin: self.id,
            seq: self.next_seq(),
        };
        let req = CawRequest {
            key,
            dest: dest.clone(),
            fanout: self.config.fanout as u32,
            var: var.offset(),
            rel,
            value,
            write: write.map(|(v, x)| (v.offset(), x)),
            timeout_ms: (timeout.as_millis() as u64).max(1),
        };
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.caws.lock().waiters.insert(key, (root, tx));
        if root == self.id {
            let mut table = self.caws.lock();
            self.caw_enqueue(&mut table, req);
        } else {
            self.send_control(root, &caw(CawMsg::Request(req)));
        }
        // The root answers within the timeout, failure included, so this only expires when
        // the root itself stops answering (a new connection may take its connect timeout).
        let grace = (timeout / 4).max(Duration::from_millis(2));
        let wait = if root == self.id {
            timeout + grace
        } else {
            timeout + grace + self.connect_grace(root)
        };
        match rx.recv_timeout(wait) {
            Ok(result) => result,
            Err(_) => {
                self.caws.lock().waiters.remove(&key);
                if self.is_shut_down() {
                    return Err(PrimError::ShutDown);
                }
                Err(PrimError::Timeout {
                    nodes: NodeSet::single(root),
                    timeout_ms: wait.as_millis() as u64,
                    detail: format!("root node {root} of the compare-and-write did not answer"),
                })
            }
        }
    }

    pub(crate) fn on_caw(
        self: &Arc<Self>,
        from: NodeId,
        msg: CawMsg,
    ) -> std::result::Result<(), String> {
        let mut table = self.caws.lock();
        match msg {
            CawMsg::Request(req) => {
                if req.key.origin != from {
                    return Err(format!(
                        "node {from} sent a request of node {}",
                        req.key.origin
                    ));
                }
                self.check_request(&req)?;
                if req.dest.first() != Some(self.id) {
                    return Err(format!(
                        "request {:?} sent to a node that is not its root",
                        req.key
                    ));
                }
                if table.queue.len() >= self.config.max_pending_ops {
                    let err = self.overloaded("requests queued", table.queue.len());
                    self.caw_reply(&mut table, req.key, Err(err));
                    return Ok(());
                }
                if let Some(err) = req
                    .write
                    .and_then(|(var, _)| self.refused_write(req.key.origin, from, var, 8))
                {
                    tracing::warn!(node = self.id, key = ?req.key, "refusing a compare-and-write: {err}");
                    self.caw_reply(&mut table, req.key, Err(err));
                    return Ok(());
                }
                self.caw_enqueue(&mut table, req);
            }
            CawMsg::Compare(req) => self.on_compare(&mut table, from, req)?,
            CawMsg::Vote(key, holds) => {
                if let Some(op) = table.ops.get_mut(&key) {
                    if op.phase != Phase::Comparing
                        || !op.set_child(from, Child::Pending, Child::Voted)
                    {
                        return Err(format!("unexpected vote for {key}"));
                    }
                    op.holds &= holds;
                    self.caw_progress(&mut table, key);
                }
            }
            CawMsg::Write(key) => {
                let Some(op) = table.ops.get_mut(&key) else {
                    tracing::warn!(
                        node = self.id,
                        %key,
                        "write for an operation this node already dropped"
                    );
                    return Ok(());
                };
                if op.parent != Some(from) || op.phase != Phase::Voted {
                    return Err(format!("unexpected write for {key}"));
                }
                self.caw_write(&mut table, key);
            }
            CawMsg::Written(key) => {
                if let Some(op) = table.ops.get_mut(&key) {
                    if op.phase != Phase::Writing
                        || !op.set_child(from, Child::Voted, Child::Written)
                    {
                        return Err(format!("unexpected write confirmation for {key}"));
                    }
                    self.caw_progress(&mut table, key);
                }
            }
            CawMsg::Release(key) => {
                if table
                    .ops
                    .get(&key)
                    .is_some_and(|op| op.parent == Some(from))
                {
                    self.caw_release(&mut table, key);
                }
            }
            CawMsg::Nack(key, err) => {
                if table
                    .ops
                    .get(&key)
                    .is_some_and(|op| op.children.iter().any(|c| c.0 == from))
                {
                    self.caw_fail(&mut table, key, err);
                }
            }
            CawMsg::Done(key, result) => {
                if let Some((root, tx)) = table.waiters.remove(&key) {
                    if root != from {
                        return Err(format!("result for {key} from node {from}, not its root"));
                    }
                    let _ = tx.send(result);
                }
            }
        }
        Ok(())
    }

    /// The error for an operation refused because `count` others are `what` here.
    fn overloaded(&self, what: &str, count: usize) -> PrimError {
        let err = PrimError::TransferFailed(format!(
            "node {} has {count} compare-and-write {what}, its limit (max_pending_ops)",
            self.id
        ));
        tracing::warn!(node = self.id, "refusing a compare-and-write: {err}");
        err
    }

    fn check_request(&self, req: &CawRequest) -> std::result::Result<(), String> {
        if req.fanout == 0 || req.timeout_ms == 0 || req.timeout_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "request {:?} has fanout {} and timeout {}",
                req.key, req.fanout, req.timeout_ms
            ));
        }
        if !req.dest.is_subset(&self.all) || !req.dest.contains(self.id) {
            return Err(format!(
                "request {:?} for nodes {} does not include this node",
                req.key, req.dest
            ));
        }
        let vars = std::iter::once(req.var).chain(req.write.map(|w| w.0));
        for v in vars {
            if self.layout.var_at(self.id, v).is_none() {
                return Err(format!(
                    "request {:?} names variable offset {v} outside global memory",
                    req.key
                ));
            }
        }
        Ok(())
    }

    /// Queues a request at this node as root, and starts it if the root is idle.
    fn caw_enqueue(self: &Arc<Self>, table: &mut CawTable, req: CawRequest) {
        table.queue.push_back(Queued {
            req,
            arrived: Instant::now(),
        });
        if table.active.is_none() {
            self.caw_start_next(table);
        }
    }

    fn local_compare(&self, req: &CawRequest) -> bool {
        match self.layout.var_at(self.id, req.var) {
            Some(var) => self.memory.compare(var, req.rel, req.value),
            None => false,
        }
    }

    /// Starts the next queued operation at this root.
    fn caw_start_next(self: &Arc<Self>, table: &mut CawTable) {
        while table.active.is_none() {
            let Some(Queued { req, arrived }) = table.queue.pop_front() else {
                return;
            };
            if arrived.elapsed() > quarter(req.timeout_ms) {
                let err = self.queued_too_long(req.timeout_ms);
                self.caw_reply(table, req.key, Err(err));
                continue;
            }
            let key = req.key;
            let tree = Tree::new(self.id, &req.dest, req.fanout as usize);
            let children = tree.children(self.id);
            let holds = self.local_compare(&req);
            let frame = caw(CawMsg::Compare(req.clone()));
            for &c in &children {
                self.send_control(c, &frame);
            }
            let deadline = Instant::now() + tree.patience(self.id, compare_time(req.timeout_ms));
            self.sweep_by(deadline);
            table.ops.insert(
                key,
                CawOp {
                    req,
                    parent: None,
                    children: children.into_iter().map(|c| (c, Child::Pending)).collect(),
                    holds,
                    phase: Phase::Comparing,
                    deadline,
                },
            );
            table.active = Some(key);
            self.caw_progress(table, key);
        }
    }

    fn on_compare(
        self: &Arc<Self>,
        table: &mut CawTable,
        from: NodeId,
        req: CawRequest,
    ) -> std::result::Result<(), String> {
        self.check_request(&req)?;
        let Some(root) = req.dest.first() else {
            return Err("compare for an empty node set".into());
        };
        let tree = Tree::new(root, &req.dest, req.fanout as usize);
        if tree.parent(self.id) != Some(from) {
            return Err(format!(
                "node {from} is not this node's parent for {:?}",
                req.key
            ));
        }
        if table.ops.contains_key(&req.key) {
            return Err(format!("compare {} received twice", req.key));
        }
        if table.ops.len() >= self.config.max_pending_ops {
            let err = self.overloaded("operations in progress", table.ops.len());
            self.send_control(from, &caw(CawMsg::Nack(req.key, err)));
            return Ok(());
        }
        if let Some(err) = req
            .write
            .and_then(|(var, _)| self.refused_write(req.key.origin, from, var, 8))
        {
            tracing::warn!(node = self.id, key = ?req.key, from, "refusing a compare-and-write: {err}");
            self.send_control(from, &caw(CawMsg::Nack(req.key, err)));
            return Ok(());
        }
        let key = req.key;
        let children = tree.children(self.id);
        let holds = self.local_compare(&req);
        let frame = caw(CawMsg::Compare(req.clone()));
        for &c in &children {
            self.send_control(c, &frame);
        }
        // Shorter than the parent's by a level's share.
        let deadline = Instant::now() + tree.patience(self.id, compare_time(req.timeout_ms));
        self.sweep_by(deadline);
        table.ops.insert(
            key,
            CawOp {
                req,
                parent: Some(from),
                children: children.into_iter().map(|c| (c, Child::Pending)).collect(),
                holds,
                phase: Phase::Comparing,
                deadline,
            },
        );
        self.caw_progress(table, key);
        Ok(())
    }

    fn caw_progress(self: &Arc<Self>, table: &mut CawTable, key: OpKey) {
        let Some(op) = table.ops.get_mut(&key) else {
            return;
        };
        match op.phase {
            Phase::Comparing if op.all_children(Child::Voted) => match op.parent {
                Some(parent) => {
                    let holds = op.holds;
                    if op.req.write.is_some() {
                        op.phase = Phase::Voted;
                        op.deadline = Instant::now() + Duration::from_millis(op.req.timeout_ms);
                        self.sweep_by(op.deadline);
                    } else {
                        table.ops.remove(&key);
                    }
                    self.send_control(parent, &caw(CawMsg::Vote(key, holds)));
                }
                None => {
                    if op.holds && op.req.write.is_some() {
                        self.caw_write(table, key);
                    } else {
                        let holds = op.holds;
                        self.caw_release(table, key);
                        self.caw_reply(table, key, Ok(holds));
                        table.active = None;
                        self.caw_start_next(table);
                    }
                }
            },
            Phase::Writing if op.all_children(Child::Written) => {
                let op = table.ops.remove(&key).expect("present");
                match op.parent {
                    Some(parent) => self.send_control(parent, &caw(CawMsg::Written(key))),
                    None => {
                        self.caw_reply(table, key, Ok(true));
                        table.active = None;
                        self.caw_start_next(table);
                    }
                }
            }
            _ => {}
        }
    }

    /// Writes here and sends `Write` down.
    fn caw_write(self: &Arc<Self>, table: &mut CawTable, key: OpKey) {
        let Some(op) = table.ops.get_mut(&key) else {
            return;
        };
        if let Some((var, value)) = op.req.write
            && let Some(var) = self.layout.var_at(self.id, var)
        {
            self.memory.store(var, value);
        }
        op.phase = Phase::Writing;
        op.deadline = Instant::now() + quarter(op.req.timeout_ms);
        self.sweep_by(op.deadline);
        let frame = caw(CawMsg::Write(key));
        for (c, _) in &op.children {
            self.send_control(*c, &frame);
        }
        self.caw_progress(table, key);
    }

    /// Forgets an operation here and below (members that voted for a write are waiting).
    fn caw_release(self: &Arc<Self>, table: &mut CawTable, key: OpKey) {
        if let Some(op) = table.ops.remove(&key)
            && op.req.write.is_some()
        {
            let frame = caw(CawMsg::Release(key));
            for (c, _) in op.children {
                self.send_control(c, &frame);
            }
        }
    }

    /// Delivers a root's result to the origin.
    fn caw_reply(self: &Arc<Self>, table: &mut CawTable, key: OpKey, result: Result<bool>) {
        if key.origin == self.id {
            if let Some((_, tx)) = table.waiters.remove(&key) {
                let _ = tx.send(result);
            }
        } else {
            self.send_control(key.origin, &caw(CawMsg::Done(key, result)));
        }
    }

    fn caw_fail(self: &Arc<Self>, table: &mut CawTable, key: OpKey, err: PrimError) {
        let Some(op) = table.ops.get(&key) else {
            return;
        };
        let parent = op.parent;
        // Release whatever the subtree holds, write or not.
        if let Some(op) = table.ops.remove(&key) {
            let frame = caw(CawMsg::Release(key));
            for (c, _) in op.children {
                self.send_control(c, &frame);
            }
        }
        match parent {
            Some(p) => self.send_control(p, &caw(CawMsg::Nack(key, err))),
            None => {
                self.caw_reply(table, key, Err(err));
                table.active = None;
                self.caw_start_next(table);
            }
        }
    }

    pub(crate) fn caw_peer_lost(self: &Arc<Self>, peer: NodeId, err: &PrimError) {
        let mut table = self.caws.lock();
        let lost_waiters: Vec<OpKey> = table
            .waiters
            .iter()
            .filter(|(_, (root, _))| *root == peer)
            .map(|(k, _)| *k)
            .collect();
        for key in lost_waiters {
            if let Some((_, tx)) = table.waiters.remove(&key) {
                let _ = tx.send(Err(err.clone()));
            }
        }
        let keys: Vec<OpKey> = table.ops.keys().copied().collect();
        for key in keys {
            let Some(op) = table.ops.get(&key) else {
                continue;
            };
            if op.parent == Some(peer) {
                self.caw_release(&mut table, key);
                table.ops.remove(&key);
            } else if op
                .children
                .iter()
                .any(|&(c, s)| c == peer && s != Child::Written)
            {
                self.caw_fail(&mut table, key, err.clone());
            }
        }
    }

    /// Fails or forgets operations past their deadline; returns the next deadline.
    pub(crate) fn caw_sweep(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        let mut table = self.caws.lock();
        let late: Vec<OpKey> = table
            .ops
            .iter()
            .filter(|(_, op)| op.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in late {
            let Some(op) = table.ops.get(&key) else {
                continue;
            };
            if op.phase == Phase::Voted {
                tracing::warn!(
                    node = self.id,
                    %key,
                    "no write or release arrived; dropping"
                );
                table.ops.remove(&key);
                continue;
            }
            let waiting: NodeSet = op
                .children
                .iter()
                .filter(|&&(_, s)| {
                    s == Child::Pending || (op.phase == Phase::Writing && s != Child::Written)
                })
                .map(|&(c, _)| c)
                .collect();
            let err = PrimError::Timeout {
                nodes: waiting.clone(),
                timeout_ms: op.req.timeout_ms,
                detail: format!(
                    "node {} had no answer from nodes {waiting} for compare-and-write {key}",
                    self.id
                ),
            };
            self.caw_fail(&mut table, key, err);
        }
        // Requests queued past their time fail here, not only when they reach the front: one
        // left in the queue would have the sweeper wake at once, again and again, for as long
        // as the operation ahead of it waits.
        let mut expired = Vec::new();
        table.queue.retain(|q| {
            let late = q.arrived + quarter(q.req.timeout_ms) <= now;
            if late {
                expired.push((q.req.key, q.req.timeout_ms));
            }
            !late
        });
        for (key, timeout_ms) in expired {
            let err = self.queued_too_long(timeout_ms);
            self.caw_reply(&mut table, key, Err(err));
        }
        let queued = table
            .queue
            .iter()
            .map(|q| q.arrived + quarter(q.req.timeout_ms));
        table.ops.values().map(|op| op.deadline).chain(queued).min()
    }

    /// A request held up behind an operation that waits on a silent node (which that one
    /// names): nothing here is to blame.
    fn queued_too_long(&self, timeout_ms: u64) -> PrimError {
        PrimError::Timeout {
            nodes: NodeSet::new(),
            timeout_ms,
            detail: format!("queued too long at root node {}", self.id),
        }
    }

    /// Wakes every waiting caller with `ShutDown`.
    pub(crate) fn caw_shut_down(&self) {
        let mut table = self.caws.lock();
        for (_, (_, tx)) in table.waiters.drain() {
            let _ = tx.send(Err(PrimError::ShutDown));
        }
    }
}
