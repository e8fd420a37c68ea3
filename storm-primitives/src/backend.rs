//! Starting one node's endpoint on a backend: the factory every daemon goes through.
//!
//! A [`Backend`] says which backend and carries what that backend needs for one node (a
//! listening socket and the peers' addresses for tcp; also the libfabric settings for ofi;
//! the shared fabric for local); [`Backend::start`] gives the node's `Arc<dyn Primitives>`.
//! Callers above this crate never name a backend's node type.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use crate::local::LocalFabric;
use crate::ofi::{OfiConfig, OfiNode, bootstrap_layout};
use crate::tcp::{TcpConfig, TcpNode};
use crate::{Layout, NodeId, NodeSet, PrimError, Primitives};

/// Which backend a node starts on, with what it needs.
pub enum Backend {
    /// A node of a fabric shared by every node in this process (a cluster of threads).
    Local(Arc<LocalFabric>),
    /// Tcp trees: this node listens on `listener`; `directory[id]` is node `id`'s address.
    Tcp {
        listener: TcpListener,
        directory: Vec<Option<SocketAddr>>,
        config: TcpConfig,
    },
    /// libfabric, its addresses and memory keys exchanged over a tcp endpoint (configured
    /// by `tcp`) that stays up beside it: a slower peer may still be publishing into it.
    Ofi {
        listener: TcpListener,
        directory: Vec<Option<SocketAddr>>,
        tcp: TcpConfig,
        ofi: OfiConfig,
    },
}

/// Why a node's endpoint did not start.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("node {id} is not in the local fabric of {nodes} nodes")]
    NotInFabric { id: NodeId, nodes: u32 },
    #[error(
        "the local fabric was made for another layout (every node of a cluster must share one)"
    )]
    OtherLayout,
    #[error("cannot start the tcp endpoint: {0}")]
    Tcp(PrimError),
    #[error("cannot start the ofi bootstrap endpoint: {0}")]
    Bootstrap(PrimError),
    #[error("cannot start the ofi endpoint: {0}")]
    Ofi(PrimError),
}

impl Backend {
    /// Starts node `id`'s endpoint over global memory laid out as `layout`.
    pub fn start(self, id: NodeId, layout: Layout) -> Result<Arc<dyn Primitives>, BackendError> {
        match self {
            Backend::Local(fabric) => {
                let nodes = fabric.size();
                if id >= nodes {
                    return Err(BackendError::NotInFabric { id, nodes });
                }
                if fabric.layout() != &layout {
                    return Err(BackendError::OtherLayout);
                }
                Ok(Arc::new(fabric.node(id)))
            }
            Backend::Tcp {
                listener,
                directory,
                config,
            } => {
                let node = TcpNode::start(id, listener, directory, layout, config)
                    .map_err(BackendError::Tcp)?;
                Ok(Arc::new(node))
            }
            Backend::Ofi {
                listener,
                directory,
                tcp,
                ofi,
            } => {
                let bl = bootstrap_layout(directory.len() as u32);
                // Addresses and memory keys are exchanged over this (authenticated) link only.
                let boot = TcpNode::start(id, listener, directory, bl.layout.clone(), tcp)
                    .map_err(BackendError::Bootstrap)?;
                let provider = ofi.provider.clone();
                let node = OfiNode::start(layout, ofi, &boot, &bl).map_err(BackendError::Ofi)?;
                tracing::info!(node = id, provider, mr_mode = ?node.mr_mode(), "ofi endpoint up");
                Ok(Arc::new(WithBootstrap {
                    ofi: node,
                    _boot: boot,
                }))
            }
        }
    }
}

/// An ofi node and the tcp node that bootstrapped it.
struct WithBootstrap {
    ofi: OfiNode,
    _boot: TcpNode,
}

impl Primitives for WithBootstrap {
    fn node_id(&self) -> NodeId {
        self.ofi.node_id()
    }
    fn nodes(&self) -> NodeSet {
        self.ofi.nodes()
    }
    fn layout(&self) -> &Layout {
        self.ofi.layout()
    }
    fn memory(&self) -> &crate::GlobalMemory {
        self.ofi.memory()
    }
    fn xfer_and_signal_within(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: bytes::Bytes,
        remote: Option<crate::EventId>,
        local: Option<crate::EventId>,
        timeout: Option<std::time::Duration>,
    ) -> crate::Result<()> {
        self.ofi
            .xfer_and_signal_within(dest, offset, data, remote, local, timeout)
    }
    fn test_event(&self, event: crate::EventId, wait: crate::Wait) -> crate::Result<bool> {
        self.ofi.test_event(event, wait)
    }
    fn wake_local(&self, event: crate::EventId) -> crate::Result<()> {
        self.ofi.wake_local(event)
    }
    fn ready_events(&self, out: &mut Vec<crate::EventId>) {
        self.ofi.ready_events(out)
    }
    fn compare_and_write_within(
        &self,
        dest: &NodeSet,
        var: crate::VarId,
        rel: crate::Relation,
        value: u64,
        write: Option<(crate::VarId, u64)>,
        timeout: Option<std::time::Duration>,
    ) -> crate::Result<bool> {
        self.ofi
            .compare_and_write_within(dest, var, rel, value, write, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout of `vars` variables, and the first of them.
    fn layout(vars: usize) -> (Layout, crate::VarId) {
        let mut b = Layout::builder();
        let ids: Vec<_> = (0..vars).map(|i| b.var(&format!("v{i}"))).collect();
        (b.build().expect("layout"), ids[0])
    }

    /// A local node is a handle on the shared fabric: what one node writes, another reads.
    #[test]
    fn local_nodes_started_from_one_fabric_share_it() {
        let (l, x) = layout(1);
        let fabric = LocalFabric::new(2, l.clone());
        let a = Backend::Local(fabric.clone()).start(0, l.clone()).unwrap();
        let b = Backend::Local(fabric).start(1, l).unwrap();
        assert_eq!((a.node_id(), b.node_id()), (0, 1));
        a.compare_and_write(&NodeSet::single(1), x, crate::Relation::Eq, 0, Some((x, 7)))
            .unwrap();
        assert_eq!(b.memory().load(x), 7);
    }

    #[test]
    fn a_local_node_outside_the_fabric_or_on_another_layout_is_refused() {
        let (l, _) = layout(1);
        let fabric = LocalFabric::new(2, l.clone());
        let e = Backend::Local(fabric.clone()).start(2, l).err().unwrap();
        assert!(
            matches!(e, BackendError::NotInFabric { id: 2, nodes: 2 }),
            "{e}"
        );
        let e = Backend::Local(fabric).start(0, layout(2).0).err().unwrap();
        assert!(matches!(e, BackendError::OtherLayout), "{e}");
    }
}
