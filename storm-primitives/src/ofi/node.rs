//! An ofi node: global memory registered with the NIC, the three primitives over RMA and
//! network atomics.
//!
//! **XFER-AND-SIGNAL.** An engine thread takes transfers in issue order. For each it writes the
//! data to every destination (`fi_write`, in chunks), waits until every write has completed,
//! and only then writes one word into each destination's signal landing word with
//! `fi_writedata`, whose remote CQ data names the event. The destination's progress thread
//! raises the event when that completion arrives: the signal is observed only after the data
//! is in place, and if any data write fails no signal is sent at all. Transfers to the origin
//! itself are a local copy. Because one engine runs the transfers in order and each waits for
//! its signals to complete, signals from one origin arrive in issue order.
//!
//! **COMPARE-AND-WRITE.** Network atomics only; no CPU on the other nodes is involved. A
//! one-node compare-and-swap (the variable compared is the one written) is a single
//! `fi_compare_atomic` of the FI_CSWAP family. Anything else takes a lock word at the set's
//! root (its smallest node) with FI_CSWAP, reads the variable on every node with
//! FI_ATOMIC_READ, evaluates the relation, writes with FI_ATOMIC_WRITE if it holds everywhere,
//! and releases the lock. The lock serialises every operation on the same node set: that is
//! the sequential consistency of the contract.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use ofi_sys as sys;
use parking_lot::Mutex;

use super::OfiConfig;
use super::bootstrap::{self, BootstrapLayout, PeerRecord};
use super::fabric::{Fabric, fi_error};
use super::progress::{self, Ticket, signal_data};
use crate::error::{PrimError, Result};
use crate::event::{EventTable, Wait};
use crate::layout::{EventId, Layout, VarId};
use crate::memory::GlobalMemory;
use crate::nodeset::{NodeId, NodeSet};
use crate::prims::{Primitives, check_caw, check_event, check_xfer};
use crate::relation::Relation;

/// Backend words after the layout's bytes, in the same registered region.
const LOCK: u64 = 0;
const SIGNAL_LANDING: u64 = 8;
const SIGNAL_SOURCE: u64 = 16;
/// Compare-and-write operands: compare, swap/write value, then one result per node.
const OPERANDS: u64 = 64;

struct Peer {
    addr: sys::fi_addr_t,
    key: u64,
    base: u64,
}

struct XferJob {
    dest: NodeSet,
    offset: u64,
    data: Bytes,
    remote: Option<EventId>,
    local: Option<EventId>,
    timeout: Duration,
}

struct Inner {
    id: NodeId,
    all: NodeSet,
    layout: Layout,
    config: OfiConfig,
    // Declared before `memory`: the registration closes before the memory is freed.
    fabric: Arc<Fabric>,
    memory: GlobalMemory,
    events: Arc<EventTable>,
    peers: Vec<Peer>,
    tail: u64,
    caw: Mutex<()>,
    /// Whether the provider takes FI_DELIVERY_COMPLETE.
    delivery: AtomicBool,
    /// Held shared by callers that touch the endpoint outside the node's own threads, and
    /// exclusively by shutdown while it closes the endpoint.
    open: parking_lot::RwLock<()>,
    stop: Arc<AtomicBool>,
    /// Test hook: completions are not read, as in a stopped process.
    frozen: Arc<AtomicBool>,
}

/// One node of the ofi backend.
pub struct OfiNode {
    inner: Arc<Inner>,
    xfers: Mutex<Option<Sender<XferJob>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Where the backend's own words start on node `node`: after its global memory.
fn tail_offset(layout: &Layout, node: NodeId) -> u64 {
    (layout.size_at(node) as u64).next_multiple_of(64)
}

impl OfiNode {
    /// Starts node `boot.node_id()`: opens the provider, registers global memory, exchanges
    /// addresses with every other node through `boot` (a node of another backend built with
    /// [`bootstrap::bootstrap_layout`]), and starts the progress and transfer threads.
    pub fn start(
        layout: Layout,
        config: OfiConfig,
        boot: &dyn Primitives,
        bl: &BootstrapLayout,
    ) -> Result<OfiNode> {
        let id = boot.node_id();
        let all = boot.nodes();
        let tail = tail_offset(&layout, id);
        let memory = GlobalMemory::new((tail + OPERANDS + 8 * (all.len() as u64 + 2)) as usize);
        let opening = std::time::Instant::now();
        let fabric = Arc::new(Fabric::open(
            &config.provider,
            config.node.as_deref(),
            memory.as_ptr(),
            memory.len(),
            config.force_mr_local,
        )?);
        let me = PeerRecord {
            name: fabric.name()?,
            key: fabric.key(),
            base: memory.as_ptr() as u64,
        };
        let opened_in = opening.elapsed();
        let records =
            bootstrap::exchange(boot, bl, &me, config.bootstrap_timeout).map_err(|e| match e {
                // Say how long this node's own provider took to open: a node slow there is
                // the node every other one waits for.
                PrimError::Timeout {
                    nodes,
                    timeout_ms,
                    detail,
                } => PrimError::Timeout {
                    nodes,
                    timeout_ms,
                    detail: format!(
                        "{detail} (node {id} opened its {} endpoint in {} ms)",
                        config.provider,
                        opened_in.as_millis()
                    ),
                },
                other => other,
            })?;
        let names: Vec<Vec<u8>> = records.iter().map(|r| r.name.clone()).collect();
        let addrs = fabric.insert(&names)?;
        let peers = records
            .iter()
            .zip(addrs)
            .map(|(r, addr)| Peer {
                addr,
                key: r.key,
                base: r.base,
            })
            .collect();
        tracing::debug!(node = id, provider = %fabric.provider, mr_mode = ?fabric.mr_mode.names(), "ofi endpoint ready");
        let events = Arc::new(EventTable::new(layout.event_count_at(id)));
        let inner = Arc::new(Inner {
            id,
            all,
            layout,
            config,
            fabric,
            memory,
            events,
            peers,
            tail,
            caw: Mutex::new(()),
            delivery: AtomicBool::new(true),
            open: parking_lot::RwLock::new(()),
            stop: Arc::new(AtomicBool::new(false)),
            frozen: Arc::new(AtomicBool::new(false)),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut threads = Vec::new();
        let p = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("storm-ofi-cq-{id}"))
                .spawn(move || {
                    progress::run(
                        p.fabric.clone(),
                        p.events.clone(),
                        p.stop.clone(),
                        p.frozen.clone(),
                    )
                })
                .map_err(|e| PrimError::invalid(format!("cannot start a thread: {e}")))?,
        );
        let e = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("storm-ofi-xfer-{id}"))
                .spawn(move || engine(e, rx))
                .map_err(|e| PrimError::invalid(format!("cannot start a thread: {e}")))?,
        );
        Ok(OfiNode {
            inner,
            xfers: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
        })
    }

    /// The provider in use.
    pub fn provider(&self) -> &str {
        &self.inner.fabric.provider
    }

    /// The provider's memory-registration requirements (names of the FI_MR_* bits).
    pub fn mr_mode(&self) -> Vec<&'static str> {
        self.inner.fabric.mr_mode.names()
    }

    /// Test hook: stops (or resumes) reading the completion queue, as SIGSTOP (SIGCONT) of the
    /// node's process would. On a provider with manual progress nothing then reaches this
    /// node; on hardware RDMA, data still lands and only signals wait.
    pub fn freeze(&self, frozen: bool) {
        self.inner.frozen.store(frozen, Ordering::Release);
    }

    /// Stops the node abruptly, as a crash would: the endpoint closes and peers see it gone.
    pub fn shutdown(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.xfers.lock().take();
        self.inner.events.close();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        // No transfer or progress thread is left; wait out a compare-and-write in progress
        // (new ones see `stop` under this lock), then close.
        let _caw = self.inner.caw.lock();
        let _closing = self.inner.open.write();
        self.inner.fabric.close();
    }
}

impl Drop for OfiNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Runs transfers in issue order.
fn engine(inner: Arc<Inner>, rx: Receiver<XferJob>) {
    for job in rx {
        if inner.stop.load(Ordering::Acquire) {
            break;
        }
        let result = inner.run_xfer(&job);
        match (job.local, result) {
            (Some(ev), Ok(())) => inner.events.signal(ev),
            (Some(ev), Err(e)) => inner.events.fail(ev, e),
            (None, Err(e)) => tracing::warn!(
                node = inner.id,
                "transfer failed with nobody listening: {e}"
            ),
            (None, Ok(())) => {}
        }
    }
}

impl Inner {
    fn remote_addr(&self, node: NodeId, offset: u64) -> u64 {
        if self.fabric.mr_mode.virt_addr() {
            self.peers[node as usize].base + offset
        } else {
            offset
        }
    }

    /// Address of a backend word in this node's registered region.
    fn word(&self, offset: u64) -> *mut libc::c_void {
        self.memory
            .target(self.tail + offset, 8)
            .expect("backend words are in range")
            .cast()
    }

    /// Descriptor for local operands in the registered region (FI_MR_LOCAL), else null.
    fn local_desc(&self) -> *mut libc::c_void {
        if self.fabric.mr_mode.local() {
            self.fabric.desc()
        } else {
            std::ptr::null_mut()
        }
    }

    /// Posts one operation, retrying while the provider's queues are full.
    fn post(
        &self,
        node: NodeId,
        what: &str,
        deadline: Instant,
        op: impl Fn(*mut libc::c_void) -> isize,
    ) -> Result<Arc<Ticket>> {
        let ticket = Ticket::new();
        loop {
            let ctx = ticket.context();
            let rc = op(ctx);
            if rc == 0 {
                return Ok(ticket);
            }
            // SAFETY: the operation was not posted, so its context reference is ours again.
            unsafe { Ticket::reclaim(ctx) };
            if rc != -(sys::FI_EAGAIN as isize) {
                let e = fi_error(what, rc);
                return Err(PrimError::Unreachable {
                    node,
                    reason: e.to_string(),
                });
            }
            if Instant::now() > deadline || self.stop.load(Ordering::Acquire) {
                return Err(PrimError::Timeout {
                    nodes: NodeSet::single(node),
                    timeout_ms: 0,
                    detail: format!("{what}: the provider's queue stayed full"),
                });
            }
            std::thread::yield_now();
        }
    }

    /// One RMA write of `len` bytes at `src` to `node`, with remote CQ data if `data` is given.
    /// It completes only once the data is at the target (FI_DELIVERY_COMPLETE), so a target that
    /// vanished makes it fail rather than report a send into the void. Providers that refuse the
    /// flag fall back to their default completion (remembered in `delivery`).
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        node: NodeId,
        src: *const libc::c_void,
        len: usize,
        desc: *mut libc::c_void,
        raddr: u64,
        data: Option<u64>,
        deadline: Instant,
    ) -> Result<Arc<Ticket>> {
        let peer = &self.peers[node as usize];
        let what = if data.is_some() {
            "fi_writedata"
        } else {
            "fi_write"
        };
        if self.delivery.load(Ordering::Relaxed) {
            let iov = libc::iovec {
                iov_base: src as *mut _,
                iov_len: len,
            };
            let descs = [desc];
            let rma = sys::fi_rma_iov {
                addr: raddr,
                len,
                key: peer.key,
            };
            let flags = sys::FI_DELIVERY_COMPLETE
                | sys::FI_COMPLETION
                | if data.is_some() {
                    sys::FI_REMOTE_CQ_DATA
                } else {
                    0
                };
            let result = self.post(node, what, deadline, |ctx| {
                let msg = sys::fi_msg_rma {
                    msg_iov: (&iov as *const libc::iovec).cast(),
                    desc: descs.as_ptr() as *mut *mut libc::c_void,
                    iov_count: 1,
                    addr: peer.addr,
                    rma_iov: &rma,
                    rma_iov_count: 1,
                    context: ctx,
                    data: data.unwrap_or(0),
                };
                // SAFETY: msg and what it points to live through the call; src outlives the op.
                unsafe { sys::fi_writemsg(self.fabric.ep, &msg, flags) }
            });
            match result {
                Err(PrimError::Unreachable { reason, .. })
                    if reason.contains(&format!("({})", -(sys::FI_EBADFLAGS as isize)))
                        || reason.contains(&format!("({})", -(sys::FI_ENOSYS as isize))) =>
                {
                    tracing::info!(provider = %self.fabric.provider, "FI_DELIVERY_COMPLETE refused; using default completions");
                    self.delivery.store(false, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        self.post(node, what, deadline, |ctx| {
            // SAFETY: src outlives the operation; desc matches its registration.
            unsafe {
                match data {
                    Some(d) => sys::fi_writedata(
                        self.fabric.ep,
                        src,
                        len,
                        desc,
                        d,
                        peer.addr,
                        raddr,
                        peer.key,
                        ctx,
                    ),
                    None => sys::fi_write(
                        self.fabric.ep,
                        src,
                        len,
                        desc,
                        peer.addr,
                        raddr,
                        peer.key,
                        ctx,
                    ),
                }
            }
        })
    }

    fn run_xfer(&self, job: &XferJob) -> Result<()> {
        let deadline = Instant::now() + job.timeout;
        if job.dest.contains(self.id) {
            self.memory.write(job.offset, &job.data)?;
        }
        let mut targets = job.dest.clone();
        targets.remove(self.id);
        let chunk = self.config.chunk_size.max(1);
        // Data of one piece with a signal, to one other node: the data's write carries the
        // signal as its remote CQ data. The target's completion, which raises its event, comes
        // only once the data is in its memory, so the signal still follows the data; the
        // initiator waits for one round trip instead of two. (To several nodes the data goes
        // everywhere before any signal: that is what keeps a transfer to a dead node from
        // signalling the others.)
        let carried = job
            .remote
            .filter(|_| !job.data.is_empty() && job.data.len() <= chunk && targets.len() == 1)
            .map(|ev| signal_data(ev.index() as u32));
        if !job.data.is_empty() && !targets.is_empty() {
            let mr = if self.fabric.mr_mode.local() {
                Some(self.fabric.register_local(&job.data)?)
            } else {
                None
            };
            let desc = mr.as_ref().map_or(std::ptr::null_mut(), |m| m.desc());
            let mut tickets = Vec::new();
            let mut at = 0usize;
            while at < job.data.len() {
                let end = (at + chunk).min(job.data.len());
                let piece = &job.data[at..end];
                for t in targets.iter() {
                    let raddr = self.remote_addr(t, job.offset + at as u64);
                    // `piece` outlives the operation: we wait for every ticket below.
                    let ticket = self.write(
                        t,
                        piece.as_ptr().cast(),
                        piece.len(),
                        desc,
                        raddr,
                        carried,
                        deadline,
                    )?;
                    tickets.push((t, ticket));
                }
                at = end;
            }
            progress::wait_all(&tickets, deadline, "writing the data")?;
            drop(mr);
        }
        let Some(ev) = job.remote else { return Ok(()) };
        if carried.is_none() {
            let mut tickets = Vec::new();
            let data = signal_data(ev.index() as u32);
            let src = self.word(SIGNAL_SOURCE);
            let desc = self.local_desc();
            for t in targets.iter() {
                let raddr = self.remote_addr(t, tail_offset(&self.layout, t) + SIGNAL_LANDING);
                let ticket =
                    self.write(t, src.cast_const(), 8, desc, raddr, Some(data), deadline)?;
                tickets.push((t, ticket));
            }
            progress::wait_all(&tickets, deadline, "signalling")?;
        }
        if job.dest.contains(self.id) {
            self.events.signal(ev);
        }
        Ok(())
    }

    /// One atomic on one node's word, waiting for it.
    fn atomic(
        &self,
        node: NodeId,
        what: &str,
        deadline: Instant,
        op: impl Fn(&Peer, *mut libc::c_void) -> isize,
    ) -> Result<()> {
        let peer = &self.peers[node as usize];
        let ticket = self.post(node, what, deadline, |ctx| op(peer, ctx))?;
        progress::wait_all(&[(node, ticket)], deadline, what)
    }

    fn compare_swap(
        &self,
        node: NodeId,
        offset: u64,
        op: sys::fi_op,
        compare: u64,
        swap: u64,
        deadline: Instant,
    ) -> Result<u64> {
        self.memory.store(self.operand(0), compare);
        self.memory.store(self.operand(1), swap);
        let result = self.result_slot(node);
        let (c, s, r) = (
            self.operand_ptr(0),
            self.operand_ptr(1),
            self.memory.target(result.offset(), 8)?.cast(),
        );
        let desc = self.local_desc();
        let raddr = self.remote_addr(node, offset);
        self.atomic(node, "fi_compare_atomic", deadline, |peer, ctx| {
            // SAFETY: operands and result are words of our registered region; the CAW lock
            // keeps them ours until the operation completes.
            unsafe {
                sys::fi_compare_atomic(
                    self.fabric.ep,
                    s,
                    1,
                    desc,
                    c,
                    desc,
                    r,
                    desc,
                    peer.addr,
                    raddr,
                    peer.key,
                    sys::FI_UINT64,
                    op,
                    ctx,
                )
            }
        })?;
        Ok(self.memory.load(result))
    }

    fn read_remote(
        &self,
        nodes: &NodeSet,
        var: VarId,
        deadline: Instant,
    ) -> Result<Vec<(NodeId, u64)>> {
        let dummy = self.operand_ptr(0);
        self.fetch_atomic_on_all(
            nodes,
            var,
            dummy,
            sys::FI_ATOMIC_READ,
            deadline,
            "reading the variable",
        )?;
        Ok(nodes
            .iter()
            .map(|n| (n, self.memory.load(self.result_slot(n))))
            .collect())
    }

    /// Writes `value` into `var` on every node. A *fetching* atomic write: it completes only
    /// once the target has executed it (a non-fetching one may complete earlier, e.g. on shm),
    /// so when this returns every node holds the value.
    fn write_remote(
        &self,
        nodes: &NodeSet,
        var: VarId,
        value: u64,
        deadline: Instant,
    ) -> Result<()> {
        self.memory.store(self.operand(1), value);
        let src = self.operand_ptr(1);
        self.fetch_atomic_on_all(
            nodes,
            var,
            src,
            sys::FI_ATOMIC_WRITE,
            deadline,
            "writing the variable",
        )
    }

    /// One `fi_fetch_atomic` of `op` with operand `src` on `var` of every node, each fetching
    /// into that node's result slot; waits for all of them.
    fn fetch_atomic_on_all(
        &self,
        nodes: &NodeSet,
        var: VarId,
        src: *mut libc::c_void,
        op: sys::fi_op,
        deadline: Instant,
        what: &str,
    ) -> Result<()> {
        let desc = self.local_desc();
        let mut tickets = Vec::new();
        for n in nodes.iter() {
            let peer = &self.peers[n as usize];
            let r = self.memory.target(self.result_slot(n).offset(), 8)?.cast();
            let raddr = self.remote_addr(n, var.offset());
            let t = self.post(n, "fi_fetch_atomic", deadline, |ctx| {
                // SAFETY: as in compare_swap.
                unsafe {
                    sys::fi_fetch_atomic(
                        self.fabric.ep,
                        src,
                        1,
                        desc,
                        r,
                        desc,
                        peer.addr,
                        raddr,
                        peer.key,
                        sys::FI_UINT64,
                        op,
                        ctx,
                    )
                }
            })?;
            tickets.push((n, t));
        }
        progress::wait_all(&tickets, deadline, what)
    }

    fn operand(&self, i: u64) -> VarId {
        VarId(self.tail + OPERANDS + 8 * i)
    }

    fn operand_ptr(&self, i: u64) -> *mut libc::c_void {
        self.word(OPERANDS + 8 * i)
    }

    fn result_slot(&self, node: NodeId) -> VarId {
        self.operand(2 + node as u64)
    }

    fn run_caw(
        &self,
        dest: &NodeSet,
        var: VarId,
        rel: Relation,
        value: u64,
        write: Option<(VarId, u64)>,
        timeout: Duration,
    ) -> Result<bool> {
        let Some(root) = dest.first() else {
            return Ok(true);
        };
        let _one_at_a_time = self.caw.lock();
        if self.stop.load(Ordering::Acquire) {
            return Err(PrimError::ShutDown);
        }
        let deadline = Instant::now() + timeout;
        // A compare-and-swap on one node is one network atomic.
        if dest.len() == 1
            && let Some((wvar, wval)) = write
            && wvar == var
        {
            let op = match rel {
                Relation::Eq => sys::FI_CSWAP,
                Relation::Ne => sys::FI_CSWAP_NE,
                // The operand is on the left: FI_CSWAP_LE swaps when value <= remote.
                Relation::Ge => sys::FI_CSWAP_LE,
                Relation::Lt => sys::FI_CSWAP_GT,
            };
            let old = self.compare_swap(root, var.offset(), op, value, wval, deadline)?;
            return Ok(rel.holds(old, value));
        }
        self.lock_root(root, deadline)?;
        let result = (|| {
            let values = self.read_remote(dest, var, deadline)?;
            let holds = values.iter().all(|&(_, v)| rel.holds(v, value));
            if holds && let Some((wvar, wval)) = write {
                self.write_remote(dest, wvar, wval, deadline)?;
            }
            Ok(holds)
        })();
        let released = self.unlock_root(root, deadline);
        let holds = result?;
        released?;
        Ok(holds)
    }

    fn lock_root(&self, root: NodeId, deadline: Instant) -> Result<()> {
        let me = self.id as u64 + 1;
        let mut pause = Duration::from_micros(5);
        loop {
            let lock = tail_offset(&self.layout, root) + LOCK;
            let old = self.compare_swap(root, lock, sys::FI_CSWAP, 0, me, deadline)?;
            if old == 0 || old == me {
                return Ok(());
            }
            if Instant::now() + pause > deadline {
                return Err(PrimError::Timeout {
                    nodes: NodeSet::single(root),
                    timeout_ms: 0,
                    detail: format!(
                        "the compare-and-write lock at node {root} stayed held by node {}",
                        old - 1
                    ),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn unlock_root(&self, root: NodeId, deadline: Instant) -> Result<()> {
        let me = self.id as u64 + 1;
        let lock = tail_offset(&self.layout, root) + LOCK;
        self.compare_swap(root, lock, sys::FI_CSWAP, me, 0, deadline)
            .map(|_| ())
    }
}

impl Primitives for OfiNode {
    fn node_id(&self) -> NodeId {
        self.inner.id
    }

    fn nodes(&self) -> NodeSet {
        self.inner.all.clone()
    }

    fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    fn memory(&self) -> &GlobalMemory {
        &self.inner.memory
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
        let inner = &self.inner;
        check_xfer(
            &inner.layout,
            (inner.id, &inner.all),
            dest,
            offset,
            data.len(),
            remote,
            local,
        )?;
        let guard = self.xfers.lock();
        let Some(tx) = guard.as_ref() else {
            return Err(PrimError::ShutDown);
        };
        tx.send(XferJob {
            dest: dest.clone(),
            offset,
            data,
            remote,
            local,
            timeout: timeout.unwrap_or(inner.config.op_timeout),
        })
        .map_err(|_| PrimError::ShutDown)
    }

    fn test_event(&self, event: EventId, wait: Wait) -> Result<bool> {
        let inner = &self.inner;
        check_event(&inner.layout, inner.id, event)?;
        // A signal delivered into our completion queue counts even if the progress thread has
        // not got to it yet.
        {
            let _open = inner.open.read();
            if !inner.stop.load(Ordering::Acquire) {
                progress::drain(&inner.fabric, &inner.events, false);
            }
        }
        inner.events.test(event, wait)
    }

    fn wake_local(&self, event: EventId) -> Result<()> {
        check_event(&self.inner.layout, self.inner.id, event)?;
        self.inner.events.wake(event);
        Ok(())
    }

    fn ready_events(&self, out: &mut Vec<EventId>) {
        let inner = &self.inner;
        // As in `test_event`: what is in the completion queue counts.
        {
            let _open = inner.open.read();
            if !inner.stop.load(Ordering::Acquire) {
                progress::drain(&inner.fabric, &inner.events, false);
            }
        }
        inner.events.take_ready(out);
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
        let inner = &self.inner;
        check_caw(&inner.layout, &inner.all, dest, var, write)?;
        if inner.stop.load(Ordering::Acquire) {
            return Err(PrimError::ShutDown);
        }
        let timeout = timeout.unwrap_or(inner.config.op_timeout);
        inner.run_caw(dest, var, rel, value, write, timeout)
    }
}
