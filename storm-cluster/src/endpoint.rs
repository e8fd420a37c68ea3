//! Starting a daemon's primitives endpoint from the cluster file.
//!
//! The daemons never see sockets: they get an `Arc<dyn Primitives>`. The listener is either
//! bound to the address in the cluster file or inherited, already bound, on a descriptor
//! (`--listen-fd`, the way `storm-submit --local` starts a cluster without racing for ports).

use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::Arc;

use storm_primitives::tcp::TcpNode;
use storm_primitives::{NodeId, Primitives};

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
            let node = TcpNode::start(id, listener, directory, rm.layout.clone(), cfg.tcp_config())
                .map_err(|e| format!("cannot start the tcp endpoint: {e}"))?;
            Ok(Arc::new(node))
        }
    }
}
