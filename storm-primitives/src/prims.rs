//! The contract: the three STORM primitives as one trait that every backend implements.

use std::time::Duration;

use bytes::Bytes;

use crate::error::{PrimError, Result};
use crate::event::Wait;
use crate::layout::{EventId, Layout, VarId};
use crate::memory::GlobalMemory;
use crate::nodeset::{NodeId, NodeSet};
use crate::relation::Relation;

/// One node's handle on the fabric.
///
/// * `xfer_and_signal` PUTs `data` at `offset` in the global memory of every node of `dest`,
///   then raises `remote` on each of them, then raises `local` here. It does not block: its
///   outcome is observed only through `local`. It is all-or-nothing: if any destination cannot
///   be reached, no destination sees `remote` and `local` is raised with the failure.
/// * `test_event` consumes one signal of a local event, polling or parking the thread.
/// * `compare_and_write` returns whether `global[var] REL value` holds on every node of `dest`;
///   when it does and `write` is given, it sets `global[write.0] = write.1` on every node of
///   `dest`. Calls with the same node set are sequentially consistent: concurrent callers that
///   differ only in the value written leave every node with the same final value.
///
/// Each node also reads and writes its own global memory directly through [`memory`].
///
/// **Deadlines and blame.** Every operation has a timeout: the backend's configured one, or
/// the one given to the `_within` forms (a heartbeat's deadline is a few heartbeat periods,
/// not the seconds a program transfer may take). A failure names the destinations that did not
/// complete: [`PrimError::Unreachable`] the one whose connection failed,
/// [`PrimError::Timeout`] those that did not answer in time (a frozen or overloaded node, not
/// the healthy nodes that waited behind it). A caller can leave them out and go on with the
/// others.
///
/// [`memory`]: Primitives::memory
pub trait Primitives: Send + Sync {
    /// This node's id.
    fn node_id(&self) -> NodeId;
    /// Every node of the fabric.
    fn nodes(&self) -> NodeSet;
    /// The global-memory layout shared by all nodes.
    fn layout(&self) -> &Layout;
    /// This node's own global memory.
    fn memory(&self) -> &GlobalMemory;

    /// XFER-AND-SIGNAL, with the backend's configured timeout.
    fn xfer_and_signal(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: Bytes,
        remote: Option<EventId>,
        local: Option<EventId>,
    ) -> Result<()> {
        self.xfer_and_signal_within(dest, offset, data, remote, local, None)
    }

    /// XFER-AND-SIGNAL that fails (through `local`) if it has not completed within `timeout`
    /// (`None`: the backend's configured timeout), naming the destinations that had not.
    fn xfer_and_signal_within(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: Bytes,
        remote: Option<EventId>,
        local: Option<EventId>,
        timeout: Option<Duration>,
    ) -> Result<()>;

    /// XFER-AND-SIGNAL applied at each destination as soon as its data has arrived there,
    /// without the all-or-nothing guarantee: where the backend commits in two phases (tcp),
    /// this saves a round trip and a wake-up per node.
    ///
    /// * When it fails, some destinations may have been written and signalled already.
    /// * At each node, on-arrival transfers from one origin apply in issue order: one
    ///   overtaken there by a later one (it went by a slower path, behind a frozen node) is
    ///   not applied there, and the transfer fails. Its stale bytes never land on newer ones.
    ///
    /// For a caller that sends the same bytes again after a failure to receivers that skip
    /// what they already took, such as the heartbeat queue. The default is the all-or-nothing
    /// transfer, which keeps every promise made here.
    fn xfer_and_signal_on_arrival_within(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: Bytes,
        remote: Option<EventId>,
        local: Option<EventId>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.xfer_and_signal_within(dest, offset, data, remote, local, timeout)
    }

    /// TEST-EVENT.
    fn test_event(&self, event: EventId, wait: Wait) -> Result<bool>;

    /// Ends a wait for one of this node's own events without a signal: the TEST-EVENT that
    /// waits for it now (or else the next one that would wait) returns false, as if its time
    /// had run out (see [`EventTable::wake`](crate::EventTable::wake)). A thread of this
    /// process wakes another that waits on the fabric; nothing is said to have arrived.
    fn wake_local(&self, event: EventId) -> Result<()>;

    /// Adds to `out` every event of this node raised since the last call, each once (see
    /// [`EventTable::take_ready`](crate::EventTable::take_ready)): which of many events to
    /// test, without testing them all. A hint; TEST-EVENT says what really arrived.
    fn ready_events(&self, out: &mut Vec<EventId>);

    /// COMPARE-AND-WRITE, with the backend's configured timeout.
    fn compare_and_write(
        &self,
        dest: &NodeSet,
        var: VarId,
        rel: Relation,
        value: u64,
        write: Option<(VarId, u64)>,
    ) -> Result<bool> {
        self.compare_and_write_within(dest, var, rel, value, write, None)
    }

    /// COMPARE-AND-WRITE that fails if it has not completed within `timeout` (`None`: the
    /// backend's configured timeout), naming the nodes that had not answered.
    fn compare_and_write_within(
        &self,
        dest: &NodeSet,
        var: VarId,
        rel: Relation,
        value: u64,
        write: Option<(VarId, u64)>,
        timeout: Option<Duration>,
    ) -> Result<bool>;
}

/// Checks the arguments of an XFER-AND-SIGNAL from node `me` against the layout and the
/// cluster.
pub(crate) fn check_xfer(
    layout: &Layout,
    (me, all): (NodeId, &NodeSet),
    dest: &NodeSet,
    offset: u64,
    len: usize,
    remote: Option<EventId>,
    local: Option<EventId>,
) -> Result<()> {
    check_nodes(all, dest)?;
    if !layout.fits(dest, offset, len as u64) {
        return Err(PrimError::invalid(format!(
            "transfer of {len} bytes at offset {offset} does not fit in the global memory of \
             nodes {dest} ({} bytes on each node{})",
            layout.shared().bytes,
            home_note(layout)
        )));
    }
    if let Some(ev) = remote
        && !layout.has_event(dest, ev)
    {
        return Err(PrimError::invalid(format!(
            "event {} does not exist on every node of {dest}{}",
            ev.index(),
            home_note(layout)
        )));
    }
    if let Some(ev) = local {
        check_event(layout, me, ev)?;
    }
    Ok(())
}

/// Checks the arguments of a COMPARE-AND-WRITE.
pub(crate) fn check_caw(
    layout: &Layout,
    all: &NodeSet,
    dest: &NodeSet,
    var: VarId,
    write: Option<(VarId, u64)>,
) -> Result<()> {
    check_nodes(all, dest)?;
    for v in std::iter::once(var).chain(write.map(|w| w.0)) {
        if !layout.var_fits(dest, v.offset()) {
            return Err(PrimError::invalid(format!(
                "variable at offset {} is outside the global memory of nodes {dest}{}",
                v.offset(),
                home_note(layout)
            )));
        }
    }
    Ok(())
}

/// Checks that node `me` has local event `ev`.
pub(crate) fn check_event(layout: &Layout, me: NodeId, ev: EventId) -> Result<()> {
    if ev.index() >= layout.event_count_at(me) {
        return Err(PrimError::invalid(format!(
            "event {} does not exist on node {me} (it has {})",
            ev.index(),
            layout.event_count_at(me)
        )));
    }
    Ok(())
}

/// Where a layout's home section lives, for error messages.
fn home_note(layout: &Layout) -> String {
    match layout.home() {
        Some(home) => format!("; the layout's home section exists on node {home} only"),
        None => String::new(),
    }
}

pub(crate) fn check_nodes(all: &NodeSet, dest: &NodeSet) -> Result<()> {
    let outside = dest.difference(all);
    if !outside.is_empty() {
        return Err(PrimError::invalid(format!(
            "nodes {outside} are not in the cluster ({all})"
        )));
    }
    Ok(())
}
