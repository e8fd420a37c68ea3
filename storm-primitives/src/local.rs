//! Backend `local`: N virtual nodes inside one process.
//!
//! Every node has its own global memory and events; the "network" is a memory copy. Used by
//! tests, by the embedded single-host cluster and to simulate thousands of nodes cheaply.
//!
//! XFER-AND-SIGNAL copies into each destination in the caller's thread, then raises every
//! remote event under the fabric's sequencer lock, so a node killed during the copy makes the
//! whole transfer fail before any destination is signalled. The transfer is complete when the
//! call returns; its outcome is still reported through the local event, as the contract says.
//! COMPARE-AND-WRITE runs entirely under the sequencer lock, which makes all of them
//! sequentially consistent.
//!
//! A frozen node ([`LocalFabric::freeze`], the stand-in for a stopped process) takes part in
//! nothing: an operation that includes it fails with [`PrimError::Timeout`] naming it, as it
//! would once its timeout passed (no time passes in this backend), and nobody is signalled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::error::{PrimError, Result};
use crate::event::{EventTable, Wait};
use crate::layout::{EventId, Layout, VarId};
use crate::memory::GlobalMemory;
use crate::nodeset::{NodeId, NodeSet};
use crate::prims::{Primitives, check_caw, check_event, check_xfer};
use crate::relation::Relation;

struct NodeState {
    memory: GlobalMemory,
    events: EventTable,
    alive: AtomicBool,
    frozen: AtomicBool,
}

/// A whole in-process cluster.
pub struct LocalFabric {
    nodes: Box<[NodeState]>,
    all: NodeSet,
    layout: Layout,
    sequencer: Mutex<()>,
}

impl LocalFabric {
    /// A cluster of `n` nodes (ids `0..n`) sharing `layout`.
    pub fn new(n: u32, layout: Layout) -> Arc<Self> {
        let nodes = (0..n)
            .map(|id| NodeState {
                memory: GlobalMemory::new(layout.size_at(id)),
                events: EventTable::new(layout.event_count_at(id)),
                alive: AtomicBool::new(true),
                frozen: AtomicBool::new(false),
            })
            .collect();
        Arc::new(Self {
            nodes,
            all: NodeSet::first_n(n),
            layout,
            sequencer: Mutex::new(()),
        })
    }

    /// Number of nodes.
    pub fn size(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// A handle acting as node `id`.
    pub fn node(self: &Arc<Self>, id: NodeId) -> LocalNode {
        assert!(
            (id as usize) < self.nodes.len(),
            "node {id} outside the fabric"
        );
        LocalNode {
            fabric: self.clone(),
            id,
        }
    }

    /// Handles for every node.
    pub fn all_nodes(self: &Arc<Self>) -> Vec<LocalNode> {
        self.all.iter().map(|id| self.node(id)).collect()
    }

    /// Crashes node `id`: it stops taking part in operations and its blocked waiters return
    /// [`PrimError::ShutDown`].
    pub fn kill(&self, id: NodeId) {
        let _seq = self.sequencer.lock();
        if let Some(n) = self.nodes.get(id as usize) {
            n.alive.store(false, Ordering::SeqCst);
            n.events.close();
        }
    }

    /// Freezes (or thaws) node `id`: operations that include it fail as timed out, naming it,
    /// until it is thawed.
    pub fn freeze(&self, id: NodeId, frozen: bool) {
        let _seq = self.sequencer.lock();
        if let Some(n) = self.nodes.get(id as usize) {
            n.frozen.store(frozen, Ordering::SeqCst);
        }
    }

    /// The frozen nodes of `dest`.
    fn frozen_in(&self, dest: &NodeSet) -> NodeSet {
        dest.iter()
            .filter(|&id| self.nodes[id as usize].frozen.load(Ordering::SeqCst))
            .collect()
    }

    pub fn is_alive(&self, id: NodeId) -> bool {
        self.nodes
            .get(id as usize)
            .is_some_and(|n| n.alive.load(Ordering::SeqCst))
    }

    fn first_dead(&self, dest: &NodeSet) -> Option<NodeId> {
        dest.iter().find(|&id| !self.is_alive(id))
    }
}

/// One virtual node of a [`LocalFabric`].
#[derive(Clone)]
pub struct LocalNode {
    fabric: Arc<LocalFabric>,
    id: NodeId,
}

impl LocalNode {
    fn state(&self) -> &NodeState {
        &self.fabric.nodes[self.id as usize]
    }

    fn check_alive(&self) -> Result<()> {
        if self.fabric.is_alive(self.id) {
            Ok(())
        } else {
            Err(PrimError::ShutDown)
        }
    }

    fn dead_node_error(id: NodeId) -> PrimError {
        PrimError::Unreachable {
            node: id,
            reason: "node is down".into(),
        }
    }

    fn frozen_error(nodes: NodeSet, timeout: Option<Duration>) -> PrimError {
        PrimError::Timeout {
            timeout_ms: timeout.map_or(0, |t| t.as_millis() as u64),
            detail: format!("nodes {nodes} are frozen"),
            nodes,
        }
    }

    fn report(&self, local: Option<EventId>, outcome: std::result::Result<(), PrimError>) {
        let Some(ev) = local else {
            if let Err(e) = outcome {
                tracing::warn!(node = self.id, "transfer failed with nobody listening: {e}");
            }
            return;
        };
        match outcome {
            Ok(()) => self.state().events.signal(ev),
            Err(e) => self.state().events.fail(ev, e),
        }
    }
}

impl Primitives for LocalNode {
    fn node_id(&self) -> NodeId {
        self.id
    }

    fn nodes(&self) -> NodeSet {
        self.fabric.all.clone()
    }

    fn layout(&self) -> &Layout {
        &self.fabric.layout
    }

    fn memory(&self) -> &GlobalMemory {
        &self.state().memory
    }

    fn xfer_and_signal_within(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: Bytes,
        remote: Option<EventId>,
        local: Option<EventId>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        check_xfer(
            &self.fabric.layout,
            (self.id, &self.fabric.all),
            dest,
            offset,
            data.len(),
            remote,
            local,
        )?;
        self.check_alive()?;
        let frozen = self.fabric.frozen_in(dest);
        if !frozen.is_empty() {
            self.report(local, Err(Self::frozen_error(frozen, timeout)));
            return Ok(());
        }
        for id in dest.iter() {
            let node = &self.fabric.nodes[id as usize];
            if !node.alive.load(Ordering::SeqCst) {
                self.report(local, Err(Self::dead_node_error(id)));
                return Ok(());
            }
            node.memory.write(offset, &data)?;
        }
        {
            let _seq = self.fabric.sequencer.lock();
            if let Some(dead) = self.fabric.first_dead(dest) {
                drop(_seq);
                self.report(local, Err(Self::dead_node_error(dead)));
                return Ok(());
            }
            if let Some(ev) = remote {
                for id in dest.iter() {
                    self.fabric.nodes[id as usize].events.signal(ev);
                }
            }
        }
        self.report(local, Ok(()));
        Ok(())
    }

    fn test_event(&self, event: EventId, wait: Wait) -> Result<bool> {
        check_event(&self.fabric.layout, self.id, event)?;
        self.check_alive()?;
        self.state().events.test(event, wait)
    }

    fn compare_and_write_within(
        &self,
        dest: &NodeSet,
        var: VarId,
        rel: Relation,
        value: u64,
        write: Option<(VarId, u64)>,
        timeout: Option<Duration>,
    ) -> Result<bool> {
        check_caw(&self.fabric.layout, &self.fabric.all, dest, var, write)?;
        self.check_alive()?;
        let _seq = self.fabric.sequencer.lock();
        if let Some(dead) = self.fabric.first_dead(dest) {
            return Err(Self::dead_node_error(dead));
        }
        let frozen = self.fabric.frozen_in(dest);
        if !frozen.is_empty() {
            return Err(Self::frozen_error(frozen, timeout));
        }
        let holds = dest.iter().all(|id| {
            self.fabric.nodes[id as usize]
                .memory
                .compare(var, rel, value)
        });
        if holds && let Some((wvar, wval)) = write {
            for id in dest.iter() {
                self.fabric.nodes[id as usize].memory.store(wvar, wval);
            }
        }
        Ok(holds)
    }
}
