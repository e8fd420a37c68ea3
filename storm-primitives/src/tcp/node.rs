//! A tcp node: its listener, its connections, and the dispatch of frames to the transfer and
//! compare-and-write state machines.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};

use super::caw::CawTable;
use super::config::TcpConfig;
use super::conn::{self, Conn};
use super::wire::{Control, Frame, OutFrame};
use super::xfer::{XferRequest, XferTable};
use crate::error::{PrimError, Result};
use crate::event::{EventTable, Wait};
use crate::layout::{EventId, Layout, VarId};
use crate::memory::GlobalMemory;
use crate::nodeset::{NodeId, NodeSet};
use crate::prims::{Primitives, check_caw, check_event, check_xfer};
use crate::relation::Relation;

/// The shortest timeout an operation may have (the wire carries milliseconds).
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// State shared by all threads of one tcp node.
pub(crate) struct Inner {
    pub id: NodeId,
    pub all: NodeSet,
    pub layout: Layout,
    pub config: TcpConfig,
    pub memory: GlobalMemory,
    pub events: EventTable,
    directory: RwLock<Vec<Option<SocketAddr>>>,
    conns: Mutex<HashMap<NodeId, Arc<Conn>>>,
    /// The latest connection each peer opened to this node: a newer one closes the one
    /// before, so a peer holds at most one here (and one it accepted from this node).
    accepted: Mutex<HashMap<NodeId, Arc<Conn>>>,
    pub xfers: Mutex<XferTable>,
    pub caws: Mutex<CawTable>,
    next_seq: AtomicU64,
    shutdown: AtomicBool,
    listen_addr: SocketAddr,
    /// The earliest deadline of an operation here: the sweeper sleeps until then.
    sweep_at: Mutex<Option<Instant>>,
    sweep_wake: Condvar,
    /// Sweeps made: the sweeper wakes at deadlines, not in a loop (a test reads it).
    sweeps: AtomicU64,
    /// Handshakes being made with accepted connections (capped by `max_handshakes` and
    /// `max_handshakes_per_source`).
    pub handshakes: super::conn::Handshakes,
    /// Test hook: frames and deadlines are not handled, as in a stopped process.
    frozen: Mutex<bool>,
    thawed: Condvar,
}

impl Inner {
    pub fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// A sequence number unique to this node, also across restarts (it starts from the clock).
    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes sure the sweeper wakes by `at` to fail operations that are late by then.
    pub fn sweep_by(&self, at: Instant) {
        let mut next = self.sweep_at.lock();
        if next.is_none_or(|n| at < n) {
            *next = Some(at);
            self.sweep_wake.notify_one();
        }
    }

    /// How long reaching `peer` may take before it can answer: nothing over a connection that
    /// is up, the connect timeout otherwise.
    pub fn connect_grace(&self, peer: NodeId) -> Duration {
        match self.conns.lock().get(&peer) {
            Some(c) if c.is_connected() => Duration::ZERO,
            _ => self.config.connect_timeout,
        }
    }

    /// Blocks while the node is frozen (a test's stand-in for SIGSTOP).
    pub fn wait_while_frozen(&self) {
        let mut frozen = self.frozen.lock();
        while *frozen && !self.is_shut_down() {
            self.thawed.wait(&mut frozen);
        }
    }

    /// Queues `frame` for `peer`, connecting first if needed. Failures come back through
    /// [`Inner::conn_lost`].
    pub fn send(self: &Arc<Self>, peer: NodeId, frame: OutFrame) {
        if self.is_shut_down() {
            return;
        }
        debug_assert_ne!(peer, self.id, "a node never sends to itself");
        for _ in 0..2 {
            let conn = {
                let mut conns = self.conns.lock();
                // Checked under the lock that shutting down drains: a connection started now
                // would outlive the node.
                if self.is_shut_down() {
                    return;
                }
                match conns.get(&peer) {
                    Some(c) if !c.is_closed() => c.clone(),
                    _ => {
                        let addr = self.directory.read().get(peer as usize).copied().flatten();
                        let c = conn::connect(self, peer, addr);
                        conns.insert(peer, c.clone());
                        c
                    }
                }
            };
            if conn.send(frame.clone()) {
                return;
            }
        }
    }

    /// Where `peer` is reached from now on.
    pub(crate) fn set_address(&self, peer: NodeId, addr: SocketAddr) {
        if let Some(slot) = self.directory.write().get_mut(peer as usize) {
            *slot = Some(addr);
        }
    }

    pub fn send_control(self: &Arc<Self>, peer: NodeId, msg: &Control) {
        self.send(peer, OutFrame::control(msg));
    }

    /// Why `origin`'s operation, which came over peer `from`'s link, may not write `len`
    /// bytes at `offset` in this node's memory, if it may not: only `TcpConfig::writers`
    /// write here; with `bind_origins`, a node acts only for itself; and each origin writes
    /// only what `write_check` allows it.
    pub fn refused_write(
        &self,
        origin: NodeId,
        from: NodeId,
        offset: u64,
        len: u64,
    ) -> Option<PrimError> {
        let refuse = |why: String| Some(PrimError::TransferFailed(why));
        if let Some(writers) = &self.config.writers
            && !writers.contains(origin)
        {
            return refuse(format!(
                "node {origin} may not write into node {}'s memory (only {writers} may)",
                self.id
            ));
        }
        if self.config.bind_origins && origin != from {
            return refuse(format!(
                "node {from} may not act for node {origin} at node {}",
                self.id
            ));
        }
        if let Some(check) = &self.config.write_check
            && origin != self.id
            && !(check.0)(origin, offset, len)
        {
            return refuse(format!(
                "node {origin} may not write {len} bytes at {offset} in node {}'s memory \
                 (not its own area)",
                self.id
            ));
        }
        None
    }

    /// Registers an accepted connection unless a live one to that peer exists, and closes
    /// the connection the peer opened before this one, if it is still open.
    pub fn adopt(self: &Arc<Self>, conn: Arc<Conn>) {
        let before = {
            let mut accepted = self.accepted.lock();
            // Checked under the lock that shutting down drains: a connection adopted by a
            // node that stopped would live on, taking the peer's frames to nobody.
            if self.is_shut_down() {
                drop(accepted);
                conn.close();
                return;
            }
            accepted.insert(conn.peer, conn.clone())
        };
        if let Some(old) = before
            && !old.is_closed()
        {
            tracing::info!(
                node = self.id,
                peer = conn.peer,
                "the peer connected again; closing its previous connection"
            );
            self.conn_lost(&old, "the peer connected again".into());
        }
        let mut conns = self.conns.lock();
        match conns.get(&conn.peer) {
            Some(c) if !c.is_closed() => {}
            _ => {
                conns.insert(conn.peer, conn);
            }
        }
    }

    /// A connection failed. Every operation waiting on that peer fails now.
    pub fn conn_lost(self: &Arc<Self>, conn: &Arc<Conn>, reason: String) {
        let first = conn.mark_closed();
        conn.close();
        {
            let mut conns = self.conns.lock();
            if conns.get(&conn.peer).is_some_and(|c| c.id == conn.id) {
                conns.remove(&conn.peer);
            }
        }
        if !first || self.is_shut_down() {
            return;
        }
        tracing::debug!(
            node = self.id,
            peer = conn.peer,
            "connection lost: {reason}"
        );
        let err = PrimError::Unreachable {
            node: conn.peer,
            reason,
        };
        self.xfer_peer_lost(conn.peer, &err);
        self.caw_peer_lost(conn.peer, &err);
    }

    /// Handles one frame from `from`. An error means the peer broke the protocol and the
    /// connection is closed.
    pub fn dispatch(
        self: &Arc<Self>,
        from: NodeId,
        frame: Frame,
    ) -> std::result::Result<(), String> {
        match frame {
            Frame::Data(chunk) => Err(format!(
                "data frame for {:?} outside the data path",
                chunk.key
            )),
            Frame::Control(Control::Xfer(msg)) => self.on_xfer(from, msg),
            Frame::Control(Control::Caw(msg)) => self.on_caw(from, msg),
            Frame::Control(other) => Err(format!("unexpected message after handshake: {other:?}")),
        }
    }

    /// Fails the operations past their deadline; returns the next deadline, if any.
    fn sweep(self: &Arc<Self>) -> Option<Instant> {
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let next_xfer = self.xfer_sweep(now);
        let next_caw = self.caw_sweep(now);
        next_xfer.into_iter().chain(next_caw).min()
    }

    /// The sweeper's loop: sleeps until the earliest deadline (or a new, earlier one), then
    /// fails what is late. Deadlines of a few milliseconds (heartbeats) are met to within a
    /// scheduling delay, however long the configured operation timeout is.
    fn run_sweeper(self: &Arc<Self>) {
        // Deadlines can only move earlier through `sweep_by`; this bounds a missed wake-up.
        let longest = Duration::from_millis(50);
        while !self.is_shut_down() {
            {
                let mut next = self.sweep_at.lock();
                let until = next
                    .unwrap_or_else(|| Instant::now() + longest)
                    .min(Instant::now() + longest);
                // What the sweeper waits for stays in `sweep_at`: an operation whose deadline
                // is later (nearly all of them) then leaves the sweeper asleep, instead of
                // waking it once per operation (a context switch per message).
                *next = Some(until);
                if Instant::now() < until {
                    self.sweep_wake.wait_until(&mut next, until);
                }
                // Woken for an earlier deadline that is not due yet: wait for that one.
                if next.is_some_and(|at| Instant::now() < at) {
                    continue;
                }
                *next = None;
            }
            if self.is_shut_down() {
                break;
            }
            self.wait_while_frozen();
            if let Some(next) = self.sweep() {
                self.sweep_by(next);
            }
        }
    }

    fn shut_down(&self) {
        if self.shutdown.swap(true, Ordering::AcqRel) {
            return;
        }
        let conns: Vec<_> = self.conns.lock().drain().map(|(_, c)| c).collect();
        let accepted: Vec<_> = self.accepted.lock().drain().map(|(_, c)| c).collect();
        for c in conns.into_iter().chain(accepted) {
            c.close();
        }
        self.events.close();
        self.caw_shut_down();
        self.thawed.notify_all();
        self.sweep_wake.notify_all();
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.listen_addr, Duration::from_millis(100));
    }
}

/// One node of the tcp backend: its own listener, connections to the peers it talks to, and
/// threads that move frames.
pub struct TcpNode {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl TcpNode {
    /// Starts node `id` listening on `listener`. `directory[i]` is node `i`'s listening
    /// address; the directory's length is the cluster size.
    pub fn start(
        id: NodeId,
        listener: TcpListener,
        directory: Vec<Option<SocketAddr>>,
        layout: Layout,
        config: TcpConfig,
    ) -> Result<TcpNode> {
        config.validate().map_err(PrimError::InvalidArgument)?;
        let n = directory.len() as u32;
        if id >= n {
            return Err(PrimError::invalid(format!(
                "node id {id} outside a cluster of {n} nodes"
            )));
        }
        let listen_addr = listener
            .local_addr()
            .map_err(|e| PrimError::invalid(format!("listener has no address: {e}")))?;
        let seq_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let inner = Arc::new(Inner {
            id,
            all: NodeSet::first_n(n),
            memory: GlobalMemory::new(layout.size_at(id)),
            events: EventTable::new(layout.event_count_at(id)),
            layout,
            config,
            directory: RwLock::new(directory),
            conns: Mutex::new(HashMap::new()),
            accepted: Mutex::new(HashMap::new()),
            xfers: Mutex::new(XferTable::default()),
            caws: Mutex::new(CawTable::default()),
            next_seq: AtomicU64::new(seq_start),
            shutdown: AtomicBool::new(false),
            listen_addr,
            sweep_at: Mutex::new(None),
            sweeps: AtomicU64::new(0),
            sweep_wake: Condvar::new(),
            handshakes: Default::default(),
            frozen: Mutex::new(false),
            thawed: Condvar::new(),
        });
        let mut threads = Vec::new();
        let acc = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("storm-listen-{id}"))
                .spawn(move || {
                    for stream in listener.incoming() {
                        if acc.is_shut_down() {
                            break;
                        }
                        match stream {
                            Ok(s) => conn::accept(&acc, s),
                            Err(e) => {
                                tracing::warn!(node = acc.id, "accept failed: {e}");
                                std::thread::sleep(Duration::from_millis(10));
                            }
                        }
                    }
                })
                .map_err(|e| PrimError::invalid(format!("cannot start threads: {e}")))?,
        );
        let sw = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("storm-sweep-{id}"))
                .spawn(move || sw.run_sweeper())
                .map_err(|e| PrimError::invalid(format!("cannot start threads: {e}")))?,
        );
        Ok(TcpNode {
            inner,
            threads: Mutex::new(threads),
        })
    }

    /// Starts `n` nodes on loopback ports chosen by the kernel, all in this process.
    pub fn local_cluster(n: u32, layout: &Layout, config: &TcpConfig) -> Result<Vec<TcpNode>> {
        let listeners = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| PrimError::invalid(format!("cannot bind on loopback: {e}")))?;
        let directory: Vec<Option<SocketAddr>> =
            listeners.iter().map(|l| l.local_addr().ok()).collect();
        listeners
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                TcpNode::start(
                    i as NodeId,
                    l,
                    directory.clone(),
                    layout.clone(),
                    config.clone(),
                )
            })
            .collect()
    }

    /// Where this node listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.listen_addr
    }

    /// Changes where node `id` is reached (a node restarted elsewhere).
    pub fn set_peer_address(&self, id: NodeId, addr: SocketAddr) {
        if let Some(slot) = self.inner.directory.write().get_mut(id as usize) {
            *slot = Some(addr);
        }
    }

    pub fn config(&self) -> &TcpConfig {
        &self.inner.config
    }

    /// How many times the sweeper has looked for late operations.
    pub fn sweeps(&self) -> u64 {
        self.inner.sweeps.load(Ordering::Relaxed)
    }

    /// Test hook: stops (or resumes) handling frames and deadlines, as SIGSTOP (SIGCONT) of a
    /// node's process would, while the kernel keeps accepting its bytes.
    pub fn freeze(&self, frozen: bool) {
        *self.inner.frozen.lock() = frozen;
        if !frozen {
            self.inner.thawed.notify_all();
        }
    }

    /// XFER-AND-SIGNAL in two phases, or applied on arrival.
    fn start_xfer(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: Bytes,
        (remote, local): (Option<EventId>, Option<EventId>),
        timeout: Option<Duration>,
        on_arrival: bool,
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
        if inner.is_shut_down() {
            return Err(PrimError::ShutDown);
        }
        inner.start_xfer(XferRequest {
            dest: dest.clone(),
            offset,
            data,
            remote,
            local,
            timeout: timeout.unwrap_or(inner.config.op_timeout).max(MIN_TIMEOUT),
            on_arrival,
        });
        Ok(())
    }

    /// Stops the node abruptly, as a crash would: connections close, operations in flight
    /// fail, blocked waiters return [`PrimError::ShutDown`].
    pub fn shutdown(&self) {
        self.inner.shut_down();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for TcpNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Primitives for TcpNode {
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
        self.start_xfer(dest, offset, data, (remote, local), timeout, false)
    }

    fn xfer_and_signal_on_arrival_within(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: Bytes,
        remote: Option<EventId>,
        local: Option<EventId>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.start_xfer(dest, offset, data, (remote, local), timeout, true)
    }

    fn test_event(&self, event: EventId, wait: Wait) -> Result<bool> {
        check_event(&self.inner.layout, self.inner.id, event)?;
        self.inner.events.test(event, wait)
    }

    fn wake_local(&self, event: EventId) -> Result<()> {
        check_event(&self.inner.layout, self.inner.id, event)?;
        self.inner.events.wake(event);
        Ok(())
    }

    fn ready_events(&self, out: &mut Vec<EventId>) {
        self.inner.events.take_ready(out);
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
        if inner.is_shut_down() {
            return Err(PrimError::ShutDown);
        }
        let timeout = timeout.unwrap_or(inner.config.op_timeout).max(MIN_TIMEOUT);
        inner.run_caw(dest, var, rel, value, write, timeout)
    }
}
