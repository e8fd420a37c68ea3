//! Starting a daemon's primitives endpoint from the cluster file.
//!
//! The daemons never see sockets: they get an `Arc<dyn Primitives>`. The listener is either
//! bound to the address in the cluster file or inherited, already bound, on a descriptor
//! (`--listen-fd`, the way `storm-submit --local` starts a cluster without racing for ports).

use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::Arc;

use storm_primitives::tcp::TcpNode;
use storm_primitives::tcp::auth::ClusterKey;
use storm_primitives::{NodeId, NodeSet, Primitives};

use crate::config::{BackendKind, ClusterConfig};
use crate::layout::RmLayout;

/// Where the endpoint listens.
#[derive(Debug, Clone, Copy)]
pub enum Listen {
    /// Bind the address the cluster file gives this node.
    Configured,
    /// Use this inherited, bound listening socket.
    Fd(RawFd),
}

/// Starts fabric node `id` (a compute node, or the MM at `cfg.mm_id()`).
pub fn start(
    cfg: &ClusterConfig,
    rm: &RmLayout,
    id: NodeId,
    listen: Listen,
    key: ClusterKey,
) -> Result<Arc<dyn Primitives>, String> {
    let directory = cfg.directory();
    let addr = directory
        .get(id as usize)
        .copied()
        .flatten()
        .ok_or_else(|| format!("node id {id} is not in the cluster file"))?;
    let listener = match listen {
        Listen::Configured => {
            TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?
        }
        Listen::Fd(fd) => {
            // Check the descriptor is open before taking ownership of it.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(format!("--listen-fd {fd}: no such open descriptor"));
            }
            // SAFETY: the caller passed us this inherited, open descriptor to own.
            let l = unsafe { TcpListener::from_raw_fd(fd) };
            l.local_addr()
                .map_err(|e| format!("descriptor {fd} is not a listening socket: {e}"))?;
            l
        }
    };
    match cfg.cluster.backend {
        BackendKind::Tcp => {
            let mut tcp = cfg.tcp_config(key);
            if id != cfg.mm_id() {
                // A compute node's memory holds commands: only the MM writes it.
                tcp.writers = Some(NodeSet::single(cfg.mm_id()));
            }
            let node = TcpNode::start(id, listener, directory, rm.layout.clone(), tcp)
                .map_err(|e| format!("cannot start the tcp endpoint: {e}"))?;
            Ok(Arc::new(node))
        }
        BackendKind::Ofi => start_ofi(cfg, rm, id, listener, directory, addr, key),
    }
}

/// The ofi endpoint, bootstrapped over a tcp node on the configured address. The tcp node
/// stays up beside it: a slower peer may still be publishing its address into it.
fn start_ofi(
    cfg: &ClusterConfig,
    rm: &RmLayout,
    id: NodeId,
    listener: TcpListener,
    directory: Vec<Option<std::net::SocketAddr>>,
    addr: std::net::SocketAddr,
    key: ClusterKey,
) -> Result<Arc<dyn Primitives>, String> {
    use storm_primitives::ofi::{OfiConfig, OfiNode, bootstrap_layout, default_provider};
    let bl = bootstrap_layout(directory.len() as u32);
    // Addresses and memory keys are exchanged over this authenticated link only.
    let boot = TcpNode::start(
        id,
        listener,
        directory,
        bl.layout.clone(),
        cfg.tcp_config(key),
    )
    .map_err(|e| format!("cannot start the bootstrap endpoint: {e}"))?;
    let provider = cfg.ofi.provider.clone().unwrap_or_else(default_provider);
    let mut config = OfiConfig::new(&provider);
    if provider != "shm" {
        config.node = Some(addr.ip().to_string());
    }
    config.op_timeout = std::time::Duration::from_millis(cfg.tcp.op_timeout_ms);
    let ofi = OfiNode::start(rm.layout.clone(), config, &boot, &bl)
        .map_err(|e| format!("cannot start the ofi endpoint: {e}"))?;
    tracing::info!(node = id, provider, mr_mode = ?ofi.mr_mode(), "ofi endpoint up");
    Ok(Arc::new(WithBootstrap { ofi, _boot: boot }))
}

/// An ofi node and the tcp node that bootstrapped it.
struct WithBootstrap {
    ofi: storm_primitives::ofi::OfiNode,
    _boot: TcpNode,
}

impl Primitives for WithBootstrap {
    fn node_id(&self) -> NodeId {
        self.ofi.node_id()
    }
    fn nodes(&self) -> storm_primitives::NodeSet {
        self.ofi.nodes()
    }
    fn layout(&self) -> &storm_primitives::Layout {
        self.ofi.layout()
    }
    fn memory(&self) -> &storm_primitives::GlobalMemory {
        self.ofi.memory()
    }
    fn xfer_and_signal_within(
        &self,
        dest: &storm_primitives::NodeSet,
        offset: u64,
        data: bytes::Bytes,
        remote: Option<storm_primitives::EventId>,
        local: Option<storm_primitives::EventId>,
        timeout: Option<std::time::Duration>,
    ) -> storm_primitives::Result<()> {
        self.ofi
            .xfer_and_signal_within(dest, offset, data, remote, local, timeout)
    }
    fn test_event(
        &self,
        event: storm_primitives::EventId,
        wait: storm_primitives::Wait,
    ) -> storm_primitives::Result<bool> {
        self.ofi.test_event(event, wait)
    }
    fn ready_events(&self, out: &mut Vec<storm_primitives::EventId>) {
        self.ofi.ready_events(out)
    }
    fn compare_and_write_within(
        &self,
        dest: &storm_primitives::NodeSet,
        var: storm_primitives::VarId,
        rel: storm_primitives::Relation,
        value: u64,
        write: Option<(storm_primitives::VarId, u64)>,
        timeout: Option<std::time::Duration>,
    ) -> storm_primitives::Result<bool> {
        self.ofi
            .compare_and_write_within(dest, var, rel, value, write, timeout)
    }
}
