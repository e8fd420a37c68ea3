//! Starting a daemon's primitives endpoint from the cluster file.
//!
//! The daemons never see sockets: they get an `Arc<dyn Primitives>` from
//! `storm_primitives::Backend::start`. On tcp and ofi the listener is either bound to the
//! address in the cluster file or inherited, already bound, on a descriptor (`--listen-fd`,
//! the way `storm-submit --local` starts a cluster without racing for ports). On the local
//! backend every node of the cluster is a thread of one process sharing one fabric
//! (`storm-local`).

use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::Arc;

use parking_lot::RwLock;

use storm_primitives::local::LocalFabric;
use storm_primitives::ofi::{OfiConfig, default_provider};
use storm_primitives::tcp::auth::ClusterKey;
use storm_primitives::tcp::{PeerKeys, WriteCheck};
use storm_primitives::{Backend, NodeId, NodeSet, Primitives};

use crate::config::{BackendKind, ClusterConfig};
use crate::layout::RmLayout;

/// Where the endpoint listens.
#[derive(Debug, Clone)]
pub enum Listen {
    /// Bind the address the cluster file gives this node.
    Configured,
    /// Use this inherited, bound listening socket.
    Fd(RawFd),
    /// The local backend: this process's fabric, shared with every other node of the cluster.
    Local(Arc<LocalFabric>),
}

impl Listen {
    /// The same listening socket for another endpoint (a manager replica that leads again
    /// starts its endpoint anew): an inherited descriptor is duplicated, so that each
    /// endpoint owns a copy and the socket outlives each.
    pub fn again(&self) -> Result<Listen, String> {
        match self {
            Listen::Configured => Ok(Listen::Configured),
            Listen::Fd(fd) => {
                // SAFETY: dup of a descriptor number; a closed one fails with EBADF.
                let copy = unsafe { libc::dup(*fd) };
                if copy < 0 {
                    return Err(format!(
                        "--listen-fd {fd}: {}",
                        std::io::Error::last_os_error()
                    ));
                }
                Ok(Listen::Fd(copy))
            }
            Listen::Local(fabric) => Ok(Listen::Local(fabric.clone())),
        }
    }
}

/// Who a daemon is on its links, beyond holding the cluster key (see [`crate::identity`]).
/// The keys are behind locks the daemon keeps a handle on: it reads them again on SIGHUP.
pub enum LinkIdentity {
    /// A compute node: it signs every handshake it opens with its identity key.
    Node(Arc<RwLock<ed25519_dalek::SigningKey>>),
    /// The MM: every node that connects proves it is the node it claims (with the key
    /// enrolled for it), acts only for itself, and writes only its own areas of the MM's
    /// memory.
    Manager(Arc<RwLock<crate::identity::Enrolled>>),
}

/// Starts fabric node `id` (a compute node, or the MM at `cfg.mm_id()`).
pub fn start(
    cfg: &ClusterConfig,
    rm: &RmLayout,
    id: NodeId,
    listen: Listen,
    key: ClusterKey,
    identity: LinkIdentity,
) -> Result<Arc<dyn Primitives>, String> {
    let backend = match (cfg.cluster.backend, listen) {
        (BackendKind::Local, Listen::Local(fabric)) => Backend::Local(fabric),
        (BackendKind::Local, _) => {
            return Err(
                "backend \"local\" runs the MM and every node as threads of one process: \
                 start it with storm-local (or storm-submit --local N --backend local), not as \
                 a daemon of its own"
                    .into(),
            );
        }
        (_, Listen::Local(_)) => {
            return Err(format!(
                "an in-process fabric was given for backend {:?}, which is not \"local\"",
                cfg.cluster.backend
            ));
        }
        (kind, listen) => {
            let directory = cfg.directory();
            let addr = directory
                .get(id as usize)
                .copied()
                .flatten()
                .ok_or_else(|| format!("node id {id} is not in the cluster file"))?;
            let listener = listener(listen, addr)?;
            let mut tcp = cfg.tcp_config(key);
            match identity {
                LinkIdentity::Node(k) => tcp.identity = Some(k),
                LinkIdentity::Manager(enrolled) => {
                    let names: Vec<String> = cfg.nodes.iter().map(|n| n.name.clone()).collect();
                    tcp.peer_keys = Some(PeerKeys(Arc::new(move |n: NodeId| {
                        let name = names.get(n as usize)?;
                        enrolled.read().key(name).copied()
                    })));
                    // On ofi the tcp node only bootstraps the fabric (its own small layout), and
                    // writes into the RM's memory travel as RDMA, which says nothing of who
                    // sent them (docs/security.md).
                    if kind == BackendKind::Tcp {
                        tcp.bind_origins = true;
                        let rm = rm.clone();
                        tcp.write_check = Some(WriteCheck(Arc::new(move |origin, offset, len| {
                            rm.may_write(origin as usize, offset, len)
                        })));
                    }
                }
            }
            if !cfg.tcp.encrypt {
                tracing::warn!(
                    "[tcp] encrypt = false: jobs' environments and output cross the network \
                     in clear text (authenticated, not encrypted); use it only on a network no \
                     one else can read"
                );
            }
            if kind == BackendKind::Ofi {
                let provider = cfg.ofi.provider.clone().unwrap_or_else(default_provider);
                let mut ofi = OfiConfig::new(&provider);
                if provider != "shm" {
                    ofi.node = Some(addr.ip().to_string());
                }
                ofi.op_timeout = std::time::Duration::from_millis(cfg.tcp.op_timeout_ms);
                Backend::Ofi {
                    listener,
                    directory,
                    tcp,
                    ofi,
                }
            } else {
                if id != cfg.mm_id() {
                    // A compute node's memory holds commands: only the MM writes it.
                    tcp.writers = Some(NodeSet::single(cfg.mm_id()));
                    // A replicated MM is wherever its leader is.
                    if cfg.replicated() {
                        tcp.alternates = vec![(cfg.mm_id(), cfg.mm_addresses())];
                    }
                }
                Backend::Tcp {
                    listener,
                    directory,
                    config: tcp,
                }
            }
        }
    };
    backend
        .start(id, rm.layout.clone())
        .map_err(|e| e.to_string())
}

/// Starts replica `index`'s endpoint in the managers' own fabric: node `index` of the
/// `[[manager]]` entries, listening on its `peer_address`, with the group's own key
/// ([`ClusterConfig::load_group_key`]) on every link.
pub fn start_group(
    cfg: &ClusterConfig,
    index: usize,
    layout: storm_primitives::Layout,
    key: ClusterKey,
) -> Result<Arc<dyn Primitives>, String> {
    let directory: Vec<Option<std::net::SocketAddr>> =
        cfg.managers.iter().map(|m| Some(m.peer_address)).collect();
    let addr = directory
        .get(index)
        .copied()
        .flatten()
        .ok_or_else(|| format!("manager {index} is not in the cluster file"))?;
    let listener = listener(Listen::Configured, addr)?;
    let mut config = cfg.tcp_config(key);
    // The group's messages are Raft's: one that does not arrive soon is sent again anyway.
    config.op_timeout = std::time::Duration::from_millis(cfg.replication.election_timeout_ms);
    Backend::Tcp {
        listener,
        directory,
        config,
    }
    .start(index as NodeId, layout)
    .map_err(|e| e.to_string())
}

/// The tcp listener of a daemon at `addr`: bound here, or inherited (`--listen-fd`, made
/// close-on-exec).
pub fn listener(listen: Listen, addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    match listen {
        Listen::Fd(fd) => {
            // Check the descriptor is open before taking ownership of it.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(format!("--listen-fd {fd}: no such open descriptor"));
            }
            // SAFETY: the caller passed us this inherited, open descriptor to own.
            let l = unsafe { TcpListener::from_raw_fd(fd) };
            l.local_addr()
                .map_err(|e| format!("descriptor {fd} is not a listening socket: {e}"))?;
            // Inherited, it is open across exec: every process the daemon starts (its PMIx
            // helper, a guest NM) would hold the daemon's listening socket, able to accept its
            // connections and keeping its port bound after the daemon is gone.
            if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
                return Err(format!(
                    "--listen-fd {fd}: cannot mark it close-on-exec: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(l)
        }
        _ => TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}")),
    }
}
