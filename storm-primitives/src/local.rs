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
//! A cut node ([`LocalFabric::cut`], a pulled cable) fails the same way as a destination, and
//! every operation it starts toward another node fails too, while its own process runs on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    cut: AtomicBool,
}

/// A whole in-process cluster.
pub struct LocalFabric {
    nodes: Box<[NodeState]>,
    all: NodeSet,
    layout: Layout,
    sequencer: Mutex<()>,
    /// Whether the primitives add the processor time of the network's part to `network_ns`.
    measure: AtomicBool,
    network_ns: AtomicU64,
}

/// Times the network's part of one primitive, if the fabric measures it
/// ([`LocalFabric::measure_network`]); ends when dropped.
struct NetworkPart<'a> {
    fabric: &'a LocalFabric,
    start: Option<Duration>,
}

impl Drop for NetworkPart<'_> {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let spent = thread_cpu().saturating_sub(start).as_nanos() as u64;
            self.fabric.network_ns.fetch_add(spent, Ordering::Relaxed);
        }
    }
}

/// The calling thread's processor time.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl std::fmt::Debug for LocalFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalFabric({} nodes)", self.nodes.len())
    }
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
                cut: AtomicBool::new(false),
            })
            .collect();
        Arc::new(Self {
            nodes,
            all: NodeSet::first_n(n),
            layout,
            sequencer: Mutex::new(()),
            measure: AtomicBool::new(false),
            network_ns: AtomicU64::new(0),
        })
    }

    /// From now on, add the processor time each primitive spends on the network's part of
    /// its work to [`network_cpu`](Self::network_cpu): for XFER-AND-SIGNAL, finding the
    /// unreachable destinations and copying into every other one and raising its events; for
    /// COMPARE-AND-WRITE, the same search, the comparison on every destination and the write.
    /// NICs and switches do that on a real machine (the paper's COMPARE-AND-WRITE is one
    /// hardware global query); a simulator subtracts it from what it charges the caller.
    pub fn measure_network(&self, on: bool) {
        self.measure.store(on, Ordering::Relaxed);
    }

    /// Processor time spent on the network's part of the primitives while measured.
    pub fn network_cpu(&self) -> Duration {
        Duration::from_nanos(self.network_ns.load(Ordering::Relaxed))
    }

    /// The layout every node's memory follows.
    pub fn layout(&self) -> &Layout {
        &self.layout
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

    /// Starts a new process on node `id` (after [`kill`](Self::kill), or in place of a live
    /// one): its global memory is zero and its events have no signals, as in a process that
    /// just started, and it takes part in operations again.
    pub fn restart(&self, id: NodeId) {
        let _seq = self.sequencer.lock();
        if let Some(n) = self.nodes.get(id as usize) {
            n.memory.clear();
            n.events.reset();
            n.frozen.store(false, Ordering::SeqCst);
            n.cut.store(false, Ordering::SeqCst);
            n.alive.store(true, Ordering::SeqCst);
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

    /// Cuts (or mends) node `id`'s link: operations between it and any other node fail as
    /// timed out, until it is mended.
    pub fn cut(&self, id: NodeId, cut: bool) {
        let _seq = self.sequencer.lock();
        if let Some(n) = self.nodes.get(id as usize) {
            n.cut.store(cut, Ordering::SeqCst);
        }
    }

    /// The nodes of `dest` that `from` cannot reach: frozen or cut off, or every other node
    /// if `from` itself is cut off.
    fn unreachable_from(&self, from: NodeId, dest: &NodeSet) -> NodeSet {
        let from_cut = self.nodes[from as usize].cut.load(Ordering::SeqCst);
        dest.iter()
            .filter(|&id| {
                let n = &self.nodes[id as usize];
                n.frozen.load(Ordering::SeqCst)
                    || (id != from && (from_cut || n.cut.load(Ordering::SeqCst)))
            })
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

    fn network_part(&self) -> NetworkPart<'_> {
        NetworkPart {
            fabric: &self.fabric,
            start: self.fabric.measure.load(Ordering::Relaxed).then(thread_cpu),
        }
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
            detail: format!("nodes {nodes} are frozen or cut off"),
            nodes,
        }
    }

    /// Copies `data` into every destination, then raises `remote` on each under the
    /// sequencer lock. The outer error is a bad argument; the inner one the outcome to report
    /// (a destination that died).
    fn deliver(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: &[u8],
        remote: Option<EventId>,
    ) -> Result<std::result::Result<(), PrimError>> {
        for id in dest.iter() {
            let node = &self.fabric.nodes[id as usize];
            if !node.alive.load(Ordering::SeqCst) {
                return Ok(Err(Self::dead_node_error(id)));
            }
            node.memory.write(offset, data)?;
        }
        let _seq = self.fabric.sequencer.lock();
        if let Some(dead) = self.fabric.first_dead(dest) {
            return Ok(Err(Self::dead_node_error(dead)));
        }
        if let Some(ev) = remote {
            for id in dest.iter() {
                self.fabric.nodes[id as usize].events.signal(ev);
            }
        }
        Ok(Ok(()))
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
        let measured = self.network_part();
        let frozen = self.fabric.unreachable_from(self.id, dest);
        if !frozen.is_empty() {
            drop(measured);
            self.report(local, Err(Self::frozen_error(frozen, timeout)));
            return Ok(());
        }
        let outcome = self.deliver(dest, offset, &data, remote);
        drop(measured);
        self.report(local, outcome?);
        Ok(())
    }

    fn test_event(&self, event: EventId, wait: Wait) -> Result<bool> {
        check_event(&self.fabric.layout, self.id, event)?;
        self.check_alive()?;
        self.state().events.test(event, wait)
    }

    fn wake_local(&self, event: EventId) -> Result<()> {
        check_event(&self.fabric.layout, self.id, event)?;
        self.check_alive()?;
        self.state().events.wake(event);
        Ok(())
    }

    fn ready_events(&self, out: &mut Vec<EventId>) {
        self.state().events.take_ready(out);
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
        let _measured = self.network_part();
        if let Some(dead) = self.fabric.first_dead(dest) {
            return Err(Self::dead_node_error(dead));
        }
        let frozen = self.fabric.unreachable_from(self.id, dest);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Primitives;

    fn fabric() -> (Arc<LocalFabric>, VarId, EventId) {
        let mut b = Layout::builder();
        let v = b.var("v");
        let e = b.event("e");
        (LocalFabric::new(3, b.build().unwrap()), v, e)
    }

    #[test]
    fn a_cut_node_reaches_nobody_and_nobody_reaches_it_until_mended() {
        let (f, v, e) = fabric();
        let (n0, n1, n2) = (f.node(0), f.node(1), f.node(2));
        f.cut(1, true);
        let to1 = n0.compare_and_write(&NodeSet::single(1), v, Relation::Eq, 0, None);
        assert!(matches!(to1, Err(PrimError::Timeout { .. })), "{to1:?}");
        let from1 = n1.compare_and_write(&NodeSet::single(2), v, Relation::Eq, 0, None);
        assert!(matches!(from1, Err(PrimError::Timeout { .. })), "{from1:?}");
        n1.xfer_and_signal(
            &NodeSet::single(2),
            v.offset(),
            Bytes::from_static(&[7; 8]),
            Some(e),
            None,
        )
        .unwrap();
        assert!(
            !n2.test_event(e, Wait::Poll).unwrap(),
            "a cut node's transfer arrived"
        );
        assert_eq!(n2.memory().load(v), 0);
        // Its own memory it still reaches; the others reach each other.
        assert!(
            n1.compare_and_write(&NodeSet::single(1), v, Relation::Eq, 0, None)
                .unwrap()
        );
        assert!(
            n0.compare_and_write(&NodeSet::single(2), v, Relation::Eq, 0, None)
                .unwrap()
        );
        f.cut(1, false);
        assert!(
            n0.compare_and_write(&NodeSet::single(1), v, Relation::Eq, 0, None)
                .unwrap()
        );
    }

    #[test]
    fn a_restarted_node_has_zero_memory_no_signals_and_takes_part_again() {
        let (f, v, e) = fabric();
        let (n0, n1) = (f.node(0), f.node(1));
        n0.xfer_and_signal(
            &NodeSet::single(1),
            v.offset(),
            Bytes::from_static(&[9; 8]),
            Some(e),
            None,
        )
        .unwrap();
        f.kill(1);
        assert!(
            n1.test_event(e, Wait::Poll).is_err(),
            "a killed node's events are closed"
        );
        f.restart(1);
        assert_eq!(n1.memory().load(v), 0, "memory of the old process survived");
        assert!(
            !n1.test_event(e, Wait::Poll).unwrap(),
            "a signal of the old process survived"
        );
        n0.xfer_and_signal(
            &NodeSet::single(1),
            v.offset(),
            Bytes::from_static(&[3; 8]),
            Some(e),
            None,
        )
        .unwrap();
        assert!(n1.test_event(e, Wait::Poll).unwrap());
        assert_eq!(n1.memory().load(v), u64::from_ne_bytes([3; 8]));
    }
}
