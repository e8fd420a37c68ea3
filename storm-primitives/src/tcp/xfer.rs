//! XFER-AND-SIGNAL over the tcp tree: a pipelined broadcast with a two-phase commit.
//!
//! 1. **Data.** The origin sends `Begin` and then the data in chunks to its children in the
//!    k-ary tree over the destination set. Every node keeps each chunk with the transfer and
//!    forwards it to its own children as soon as it has read it, so chunk `i` travels down
//!    one level while chunk `i+1` arrives (the pipeline of the paper's Fig. 6).
//! 2. **Ack.** A node whose data is complete and whose children have all acknowledged sends
//!    `Ack` to its parent. No node has signalled anything yet.
//! 3. **Commit.** When the origin has every acknowledgement it sends `Commit` down the tree;
//!    each node forwards it, writes the data into its global memory, raises the remote event,
//!    and answers `Committed` once its subtree has. When all have, the origin raises the local
//!    event with success.
//!
//! **Memory changes only at the commit.** A transfer's data reaches a node's global memory
//! when the node commits it, never before: an aborted transfer leaves memory untouched, and
//! the data of an earlier transfer still in flight on a slow path (behind a frozen node, say)
//! cannot land on top of a later transfer to the same region that went around it and
//! committed. Commits from one origin reach each node in issue order wherever their
//! destinations meet (below), so the last committed transfer's bytes are what a node holds.
//! A node that commits a transfer drops any earlier, uncommitted one from the same origin to
//! an overlapping region: the origin has given up on it, or it could not commit later.
//!
//! A node that cannot reach a child (its connection closes, or it misses the deadline) sends
//! `Nack` up; the origin then sends `Abort` down and raises the local event with the failure.
//!
//! **Deadlines name the node that stopped answering.** `Begin` carries the origin's timeout,
//! and each node waits on its children for its level's share of it ([`Tree::patience`]: the
//! deeper, the shorter, evenly spaced), so a node gives up on its children before its parent
//! gives up on it: the first deadline to pass is that of the lowest node whose data is complete
//! and whose child did not answer, and its `Nack` names exactly that child (a frozen node), not
//! the healthy nodes waiting behind it. A node still missing data does not time out: its parent
//! is the one waiting on someone.
//! Before the commit phase no destination has been signalled, so a failure during the data
//! phase (which is almost all of a transfer's time) leaves no node with a partial signal.
//! Failures inside the short commit phase are reported as failures too, but some nodes may
//! already have been signalled; docs/primitives.md discusses this window.
//!
//! **Applied on arrival** ([`XferBegin::on_arrival`], for the MM's heartbeats and program
//! chunks): one phase. Each node writes the data and raises the remote event as soon as its
//! data is complete, and answers `Committed` once its subtree has; there is no `Ack` and no
//! `Commit`, so a heartbeat costs each node one wake-up of its receiving thread instead of
//! two, and a chunk is consumed at the top of the tree while it still travels below. It is
//! not all-or-nothing (a failure may leave some nodes signalled), and the ordering rule above
//! becomes: a node applies one origin's on-arrival transfers to the same bytes in issue
//! order, refusing (with `Nack`) one older than the latest it applied there, so stale bytes
//! relayed late by a thawed node never land on newer ones. Transfers to other bytes (a
//! heartbeat and a program chunk) may be applied in either order.
//!
//! The origin commits its own transfers in the order it issued them wherever their
//! destinations meet (a later transfer over the same tree may commit right behind an earlier
//! one, since frames on one connection stay in order), so remote events from one origin are
//! raised in issue order on every node; transfers to disjoint node sets do not wait for each
//! other.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::node::Inner;
use super::tree::Tree;
use super::wire::{Control, OpKey, OutFrame, XferBegin, XferMsg};
use crate::error::PrimError;
use crate::layout::EventId;
use crate::nodeset::{NodeId, NodeSet};

/// Longest timeout a peer may ask for (guards against absurd values on the wire).
const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// How long past its deadline a member still missing data keeps a transfer before dropping
/// it quietly (its upstream decides the outcome).
const DATA_WAIT_FACTOR: u32 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Receiving data and waiting for the children's acks.
    Gathering,
    /// Subtree complete; a member waits for `Commit`, the origin for its turn to commit.
    Prepared,
    /// Commit sent down; waiting for the children's `Committed`.
    Committing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Child {
    Pending,
    Acked,
    Committed,
}

struct XferOp {
    begin: XferBegin,
    /// `None` at the origin.
    parent: Option<NodeId>,
    /// The origin's local event.
    local: Option<EventId>,
    children: Vec<(NodeId, Child)>,
    received: u64,
    /// Data received so far, as `(position in the transfer, bytes)`: written into global
    /// memory at the commit.
    staged: Vec<(u64, Bytes)>,
    phase: Phase,
    deadline: Instant,
}

impl XferOp {
    fn all_children(&self, state: Child) -> bool {
        self.children.iter().all(|&(_, s)| s == state)
    }
    fn set_child(&mut self, child: NodeId, from: Child, to: Child) -> bool {
        match self.children.iter_mut().find(|(c, _)| *c == child) {
            Some((_, s)) if *s == from => {
                *s = to;
                true
            }
            _ => false,
        }
    }
    fn child_ids(&self) -> Vec<NodeId> {
        self.children.iter().map(|&(c, _)| c).collect()
    }
}

/// Transfers in flight at one node.
#[derive(Default)]
pub(crate) struct XferTable {
    ops: HashMap<OpKey, XferOp>,
    /// This node's own transfers, in issue order.
    own: VecDeque<OpKey>,
    /// Bytes held in `staged` over all transfers (bounded by `max_staged_bytes`).
    staged_bytes: u64,
    /// Per origin, the latest on-arrival transfer this node applied to each region of its
    /// memory: an earlier one to overlapping bytes that arrives after it was overtaken and is
    /// not applied.
    latest_on_arrival: HashMap<NodeId, AppliedRegions>,
}

/// Most regions remembered per origin. The resource manager sends on-arrival transfers to a
/// handful of fixed queue slots; past this many, the region applied longest ago is forgotten.
const MAX_APPLIED_REGIONS: usize = 4096;

/// The on-arrival transfers one origin applied here, by region of memory: the latest
/// (highest sequence) to each range of bytes. Regions never overlap one another.
#[derive(Default)]
struct AppliedRegions(Vec<Applied>);

struct Applied {
    start: u64,
    end: u64,
    seq: u64,
}

impl AppliedRegions {
    /// Records transfer `seq` to `[start, end)` as applied, unless a later transfer from the
    /// same origin was applied to any of those bytes: then it was overtaken, and the answer
    /// is false. Transfers to other bytes may come in any order: one origin's threads number
    /// their transfers from one counter but send them independently, so a heartbeat may pass
    /// a program chunk issued just before it.
    fn admit(&mut self, start: u64, end: u64, seq: u64) -> bool {
        let overlaps = |r: &Applied| r.start < end && start < r.end;
        if self.0.iter().any(|r| overlaps(r) && r.seq > seq) {
            return false;
        }
        self.0.retain(|r| !overlaps(r));
        if self.0.len() >= MAX_APPLIED_REGIONS
            && let Some(oldest) = (0..self.0.len()).min_by_key(|&i| self.0[i].seq)
        {
            self.0.swap_remove(oldest);
        }
        self.0.push(Applied { start, end, seq });
        true
    }
}

impl XferTable {
    /// Forgets a transfer, and the data it held.
    fn remove(&mut self, key: &OpKey) -> Option<XferOp> {
        let op = self.ops.remove(key)?;
        self.staged_bytes -= staged_len(&op.staged);
        Some(op)
    }
}

/// Bytes held in a transfer's staged chunks.
fn staged_len(staged: &[(u64, Bytes)]) -> u64 {
    staged.iter().map(|(_, b)| b.len() as u64).sum()
}

/// One XFER-AND-SIGNAL as its origin asks for it.
pub(crate) struct XferRequest {
    pub dest: NodeSet,
    pub offset: u64,
    pub data: Bytes,
    pub remote: Option<EventId>,
    pub local: Option<EventId>,
    /// It fails if it has not completed within this.
    pub timeout: Duration,
    /// Applied at each node as its data arrives, in one phase (see [`XferBegin::on_arrival`]).
    pub on_arrival: bool,
}

fn xfer(msg: XferMsg) -> Control {
    Control::Xfer(msg)
}

impl Inner {
    /// Starts a transfer from this node (the origin).
    pub(crate) fn start_xfer(self: &Arc<Self>, request: XferRequest) {
        let XferRequest {
            dest,
            offset,
            data,
            remote,
            local,
            timeout,
            on_arrival,
        } = request;
        let dest = &dest;
        let key = OpKey {
            origin: self.id,
            seq: self.next_seq(),
        };
        let tree = Tree::new(self.id, dest, self.config.fanout);
        let tree_children = tree.children(self.id);
        if dest.contains(self.id) {
            // Checked against the layout by the caller.
            let _ = self.memory.write(offset, &data);
        }
        let begin = XferBegin {
            key,
            dest: dest.clone(),
            fanout: self.config.fanout as u32,
            offset,
            len: data.len() as u64,
            remote_event: remote.map(|e| e.index() as u32),
            timeout_ms: (timeout.as_millis() as u64).max(1),
            on_arrival,
        };
        let begin_frame = OutFrame::control(&xfer(XferMsg::Begin(begin.clone())));
        // The origin is the tree's root: it waits the whole timeout.
        let deadline = Instant::now() + tree.patience(self.id, timeout);
        self.sweep_by(deadline);
        let mut table = self.xfers.lock();
        table.ops.insert(
            key,
            XferOp {
                begin,
                parent: None,
                local,
                children: tree_children.iter().map(|&c| (c, Child::Pending)).collect(),
                received: data.len() as u64,
                staged: Vec::new(),
                phase: Phase::Gathering,
                deadline,
            },
        );
        table.own.push_back(key);
        for &c in &tree_children {
            self.send(c, begin_frame.clone());
        }
        let chunk = self.config.chunk_size;
        let mut at = 0usize;
        while at < data.len() {
            let end = (at + chunk).min(data.len());
            let frame = OutFrame::data(key, at as u64, data.slice(at..end));
            for &c in &tree_children {
                self.send(c, frame.clone());
            }
            at = end;
        }
        self.xfer_progress(&mut table, key);
        self.commit_own(&mut table);
    }

    pub(crate) fn on_xfer(self: &Arc<Self>, from: NodeId, msg: XferMsg) -> Result<(), String> {
        let mut table = self.xfers.lock();
        match msg {
            XferMsg::Begin(begin) => self.on_begin(&mut table, from, begin)?,
            XferMsg::Ack(key) => {
                if let Some(op) = table.ops.get_mut(&key) {
                    if op.begin.on_arrival || !op.set_child(from, Child::Pending, Child::Acked) {
                        return Err(format!("unexpected ack for {key}"));
                    }
                    self.xfer_progress(&mut table, key);
                }
            }
            XferMsg::Committed(key) => {
                if let Some(op) = table.ops.get_mut(&key) {
                    // On arrival, a child may finish before this node has applied the data
                    // it forwarded.
                    let confirmed = if op.begin.on_arrival {
                        op.set_child(from, Child::Pending, Child::Committed)
                    } else {
                        op.phase == Phase::Committing
                            && op.set_child(from, Child::Acked, Child::Committed)
                    };
                    if !confirmed {
                        return Err(format!("unexpected commit confirmation for {key}"));
                    }
                    self.xfer_progress(&mut table, key);
                }
            }
            XferMsg::Nack(key, err) => {
                if table
                    .ops
                    .get(&key)
                    .is_some_and(|op| op.children.iter().any(|c| c.0 == from))
                {
                    self.xfer_fail(&mut table, key, err);
                }
            }
            XferMsg::Commit(key) => {
                let Some(op) = table.ops.get_mut(&key) else {
                    tracing::warn!(
                        node = self.id,
                        %key,
                        "commit for a transfer this node already dropped"
                    );
                    return Ok(());
                };
                if op.parent != Some(from) || op.phase != Phase::Prepared {
                    return Err(format!("unexpected commit for {key}"));
                }
                self.xfer_commit(&mut table, key);
            }
            XferMsg::Abort(key) => {
                if table
                    .ops
                    .get(&key)
                    .is_some_and(|op| op.parent == Some(from))
                {
                    self.xfer_abort(&mut table, key);
                }
            }
        }
        self.commit_own(&mut table);
        Ok(())
    }

    fn on_begin(
        self: &Arc<Self>,
        table: &mut XferTable,
        from: NodeId,
        begin: XferBegin,
    ) -> Result<(), String> {
        let key = begin.key;
        if begin.fanout == 0 || begin.timeout_ms == 0 || begin.timeout_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "transfer {key} has fanout {} and timeout {} ms",
                begin.fanout, begin.timeout_ms
            ));
        }
        if !begin.dest.is_subset(&self.all) || !begin.dest.contains(self.id) {
            return Err(format!(
                "transfer {key} to {} does not include this node",
                begin.dest
            ));
        }
        let tree = Tree::new(key.origin, &begin.dest, begin.fanout as usize);
        if tree.parent(self.id) != Some(from) {
            return Err(format!("node {from} is not this node's parent for {key}"));
        }
        if !self
            .layout
            .contains_range_at(self.id, begin.offset, begin.len)
        {
            return Err(format!(
                "transfer {key} of {} bytes at {} overruns global memory",
                begin.len, begin.offset
            ));
        }
        if let Some(ev) = begin.remote_event
            && self.layout.event_at(self.id, ev).is_none()
        {
            return Err(format!("transfer {key} names unknown event {ev}"));
        }
        if table.ops.contains_key(&key) {
            return Err(format!("transfer {key} begun twice"));
        }
        if table.ops.len() >= self.config.max_pending_ops {
            let err = PrimError::TransferFailed(format!(
                "node {} has {} transfers in progress, its limit (max_pending_ops)",
                self.id,
                table.ops.len()
            ));
            tracing::warn!(node = self.id, %key, "refusing a transfer: {err}");
            self.send_control(from, &xfer(XferMsg::Nack(key, err)));
            return Ok(());
        }
        if let Some(err) = self.refused_write(key.origin, from, begin.offset, begin.len) {
            tracing::warn!(node = self.id, %key, from, "refusing a transfer: {err}");
            self.send_control(from, &xfer(XferMsg::Nack(key, err)));
            return Ok(());
        }
        let children = tree.children(self.id);
        let timeout = Duration::from_millis(begin.timeout_ms);
        let frame = OutFrame::control(&xfer(XferMsg::Begin(begin.clone())));
        for &c in &children {
            self.send(c, frame.clone());
        }
        let deadline = Instant::now() + tree.patience(self.id, timeout);
        self.sweep_by(deadline);
        table.ops.insert(
            key,
            XferOp {
                begin,
                parent: Some(from),
                local: None,
                children: children.into_iter().map(|c| (c, Child::Pending)).collect(),
                received: 0,
                staged: Vec::new(),
                phase: Phase::Gathering,
                // Shorter than the parent's by a level's share, so the reason reaches it
                // before it gives up itself.
                deadline,
            },
        );
        self.xfer_progress(table, key);
        Ok(())
    }

    /// A chunk `data` at `at` of transfer `key` has come from `from`: forward it to the
    /// children and keep it for the commit. Data of a transfer this node no longer has (it
    /// was aborted) is dropped. An error means `from` broke the protocol.
    pub(crate) fn xfer_data(
        self: &Arc<Self>,
        from: NodeId,
        key: OpKey,
        at: u64,
        data: Bytes,
    ) -> Result<(), String> {
        let children = {
            let table = self.xfers.lock();
            let Some(op) = table.ops.get(&key) else {
                return Ok(());
            };
            if op.parent != Some(from) {
                return Err(format!(
                    "data for {key} from node {from}, which is not the parent"
                ));
            }
            let end = at.checked_add(data.len() as u64);
            if at != op.received || end.is_none_or(|e| e > op.begin.len) {
                return Err(format!(
                    "data for {key} at {at}+{} out of order or past its length {}",
                    data.len(),
                    op.begin.len
                ));
            }
            if table.staged_bytes + data.len() as u64 > self.config.max_staged_bytes {
                let err = PrimError::TransferFailed(format!(
                    "node {} holds {} bytes of uncommitted transfers, its limit \
                     (max_staged_bytes)",
                    self.id, table.staged_bytes
                ));
                tracing::warn!(node = self.id, %key, "failing a transfer: {err}");
                drop(table);
                let mut table = self.xfers.lock();
                self.xfer_fail(&mut table, key, err);
                return Ok(());
            }
            op.child_ids()
        };
        // Only this connection's reader brings data for `key`, so nothing else moves
        // `received` between the check above and the count below.
        if !children.is_empty() {
            let frame = OutFrame::data(key, at, data.clone());
            for c in children {
                self.send(c, frame.clone());
            }
        }
        let mut table = self.xfers.lock();
        if let Some(op) = table.ops.get_mut(&key) {
            let len = data.len() as u64;
            op.received += len;
            op.staged.push((at, data));
            table.staged_bytes += len;
            self.xfer_progress(&mut table, key);
            self.commit_own(&mut table);
        }
        Ok(())
    }

    /// Moves an operation forward when its subtree has caught up. At the origin this only marks
    /// the transfer prepared or finished; callers then run [`Inner::commit_own`], which keeps
    /// the commit order and avoids recursion.
    fn xfer_progress(self: &Arc<Self>, table: &mut XferTable, key: OpKey) {
        let Some(op) = table.ops.get_mut(&key) else {
            return;
        };
        match op.phase {
            Phase::Gathering if op.begin.on_arrival && op.received == op.begin.len => {
                self.apply_on_arrival(table, key);
            }
            Phase::Gathering
                if !op.begin.on_arrival
                    && op.received == op.begin.len
                    && op.all_children(Child::Acked) =>
            {
                op.phase = Phase::Prepared;
                // At the origin, `commit_own` (run by the caller) takes it from here.
                if let Some(parent) = op.parent {
                    op.deadline = Instant::now() + 2 * Duration::from_millis(op.begin.timeout_ms);
                    self.sweep_by(op.deadline);
                    self.send_control(parent, &xfer(XferMsg::Ack(key)));
                }
            }
            Phase::Committing if op.all_children(Child::Committed) => {
                let op = table.remove(&key).expect("present");
                match op.parent {
                    Some(parent) => self.send_control(parent, &xfer(XferMsg::Committed(key))),
                    None => {
                        table.own.retain(|k| *k != key);
                        if let Some(ev) = op.local {
                            self.events.signal(ev);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Commits this node's prepared transfers, in issue order wherever their destinations
    /// meet. Called at the end of every entry point that may have changed an own transfer's
    /// phase.
    ///
    /// A prepared transfer commits unless an earlier one that shares a destination with it has
    /// not committed yet, or is committing over another tree (its `Commit` frames could be
    /// overtaken on other connections). One over the same tree may commit right behind it:
    /// frames on one connection stay in order. Transfers to other nodes do not wait: a
    /// transfer held up by a silent node (until its deadline) holds up only the later ones
    /// that include that node, never a heartbeat that goes around it.
    fn commit_own(self: &Arc<Self>, table: &mut XferTable) {
        // Destinations of earlier transfers not committed yet.
        let mut uncommitted = NodeSet::new();
        // (dest, fanout) of earlier transfers committing.
        let mut committing: Vec<(NodeSet, u32)> = Vec::new();
        let mut index = 0;
        while index < table.own.len() {
            let key = table.own[index];
            let Some(op) = table.ops.get(&key) else {
                table.own.remove(index);
                continue;
            };
            let tree = (op.begin.dest.clone(), op.begin.fanout);
            index += 1;
            match op.phase {
                Phase::Gathering => uncommitted = uncommitted.union(&tree.0),
                Phase::Committing => committing.push(tree),
                Phase::Prepared => {
                    let free = uncommitted.is_disjoint(&tree.0)
                        && committing
                            .iter()
                            .all(|c| *c == tree || c.0.is_disjoint(&tree.0));
                    if !free {
                        uncommitted = uncommitted.union(&tree.0);
                        continue;
                    }
                    self.xfer_commit(table, key);
                    if table.ops.contains_key(&key) {
                        committing.push(tree);
                    } else {
                        // It finished at once and left `own`: the next one is at its place.
                        index -= 1;
                    }
                }
            }
        }
    }

    /// An on-arrival transfer's data is all here: applies it, unless a later on-arrival
    /// transfer from the same origin to the same bytes has been applied here already, in
    /// which case this one fails (its bytes are older).
    fn apply_on_arrival(self: &Arc<Self>, table: &mut XferTable, key: OpKey) {
        // The origin's own writes are in order already.
        let member = table
            .ops
            .get(&key)
            .filter(|op| op.parent.is_some())
            .map(|op| (op.begin.offset, op.begin.len));
        if let Some((start, len)) = member {
            let admitted = table
                .latest_on_arrival
                .entry(key.origin)
                .or_default()
                .admit(start, start.saturating_add(len), key.seq);
            if !admitted {
                let err = PrimError::TransferFailed(format!(
                    "node {} had applied a later transfer from node {} to the same bytes when \
                     transfer {key} arrived, so it was not applied there",
                    self.id, key.origin
                ));
                tracing::debug!(node = self.id, %key, "{err}");
                self.xfer_fail(table, key, err);
                return;
            }
        }
        self.xfer_commit(table, key);
    }

    /// Sends `Commit` down (unless the children apply the data on arrival), writes the data
    /// into this node's memory and raises its remote event.
    fn xfer_commit(self: &Arc<Self>, table: &mut XferTable, key: OpKey) {
        let Some(op) = table.ops.get_mut(&key) else {
            return;
        };
        op.phase = Phase::Committing;
        op.deadline = Instant::now() + Duration::from_millis(op.begin.timeout_ms);
        self.sweep_by(op.deadline);
        if !op.begin.on_arrival {
            let frame = OutFrame::control(&xfer(XferMsg::Commit(key)));
            for (c, _) in &op.children {
                self.send(*c, frame.clone());
            }
        }
        // The origin wrote its own copy when it issued the transfer.
        let member = op.parent.is_some();
        let staged = std::mem::take(&mut op.staged);
        let (offset, dest, remote_event) = (
            op.begin.offset,
            op.begin.dest.clone(),
            op.begin.remote_event,
        );
        table.staged_bytes -= staged_len(&staged);
        for (at, chunk) in staged {
            // Checked against the layout when the transfer began.
            let _ = self.memory.write(offset + at, &chunk);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        if dest.contains(self.id)
            && let Some(ev) = remote_event.and_then(|e| self.layout.event_at(self.id, e))
        {
            self.events.signal(ev);
        }
        if member {
            self.drop_superseded(table, key);
        }
        self.xfer_progress(table, key);
    }

    /// Aborts the transfers from `key`'s origin, issued before it to an overlapping region,
    /// that this node has not committed: once `key` has committed here they never will (the
    /// origin commits in issue order, so it gave up on them), and their late data must not
    /// follow `key`'s.
    fn drop_superseded(self: &Arc<Self>, table: &mut XferTable, key: OpKey) {
        let Some(op) = table.ops.get(&key) else {
            return;
        };
        let (start, end) = (op.begin.offset, op.begin.offset + op.begin.len);
        let stale: Vec<OpKey> = table
            .ops
            .iter()
            .filter(|(k, o)| {
                k.origin == key.origin
                    && k.seq < key.seq
                    && o.phase != Phase::Committing
                    && o.begin.offset < end
                    && start < o.begin.offset + o.begin.len
            })
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            tracing::debug!(
                node = self.id,
                ?k,
                later = %key,
                "dropping a transfer superseded by a later commit"
            );
            self.xfer_abort(table, k);
        }
    }

    /// Forgets an operation without signalling, telling the subtree to do the same.
    fn xfer_abort(self: &Arc<Self>, table: &mut XferTable, key: OpKey) {
        if let Some(op) = table.remove(&key) {
            let frame = OutFrame::control(&xfer(XferMsg::Abort(key)));
            for (c, _) in op.children {
                self.send(c, frame.clone());
            }
        }
    }

    /// Fails an operation: abort below, report above (or to the local event at the origin).
    fn xfer_fail(self: &Arc<Self>, table: &mut XferTable, key: OpKey, err: PrimError) {
        let parent = match table.ops.get(&key) {
            Some(op) => op.parent,
            None => return,
        };
        let local = table.ops.get(&key).and_then(|op| op.local);
        self.xfer_abort(table, key);
        match parent {
            Some(p) => self.send_control(p, &xfer(XferMsg::Nack(key, err))),
            None => {
                table.own.retain(|k| *k != key);
                match local {
                    Some(ev) => self.events.fail(ev, err),
                    None => tracing::warn!(
                        node = self.id,
                        "transfer failed with nobody listening: {err}"
                    ),
                }
            }
        }
    }

    /// A peer is gone: transfers it was part of fail now. If it comes back it may be a new
    /// process (a restarted MM) whose sequence numbers start from its clock, which may be
    /// behind the old one's: the order of its on-arrival transfers starts afresh.
    pub(crate) fn xfer_peer_lost(self: &Arc<Self>, peer: NodeId, err: &PrimError) {
        let mut table = self.xfers.lock();
        table.latest_on_arrival.remove(&peer);
        let keys: Vec<OpKey> = table.ops.keys().copied().collect();
        for key in keys {
            let Some(op) = table.ops.get(&key) else {
                continue;
            };
            if op.parent == Some(peer) {
                // Our parent died; nobody will commit this. Forget it quietly.
                self.xfer_abort(&mut table, key);
            } else if op
                .children
                .iter()
                .any(|&(c, s)| c == peer && s != Child::Committed)
            {
                self.xfer_fail(&mut table, key, err.clone());
            }
        }
        self.commit_own(&mut table);
    }

    /// Fails or forgets operations past their deadline; returns the next deadline.
    pub(crate) fn xfer_sweep(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        let mut table = self.xfers.lock();
        let late: Vec<OpKey> = table
            .ops
            .iter()
            .filter(|(_, op)| op.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in late {
            let Some(op) = table.ops.get_mut(&key) else {
                continue;
            };
            if op.phase == Phase::Prepared && op.parent.is_some() {
                tracing::warn!(
                    node = self.id,
                    %key,
                    "no commit arrived; dropping the transfer unsignalled"
                );
                table.remove(&key);
                continue;
            }
            if op.received < op.begin.len && op.parent.is_some() {
                // Our data is late: the parent, not a child, is the one waiting on someone,
                // and its deadline (or its parent's) names them. Wait for its Abort, then
                // drop the transfer quietly.
                let timeout = Duration::from_millis(op.begin.timeout_ms);
                if op.deadline + timeout * DATA_WAIT_FACTOR <= now {
                    table.remove(&key);
                } else {
                    op.deadline += timeout;
                }
                continue;
            }
            let waiting: NodeSet = op
                .children
                .iter()
                .filter(|&&(_, s)| s != Child::Committed)
                .filter(|&&(_, s)| op.phase == Phase::Committing || s == Child::Pending)
                .map(|&(c, _)| c)
                .collect();
            let err = PrimError::Timeout {
                nodes: waiting.clone(),
                timeout_ms: op.begin.timeout_ms,
                detail: format!(
                    "node {} had no answer from nodes {waiting} for transfer {key}",
                    self.id
                ),
            };
            self.xfer_fail(&mut table, key, err);
        }
        self.commit_own(&mut table);
        table.ops.values().map(|op| op.deadline).min()
    }
}
