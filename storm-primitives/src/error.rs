//! Errors of the primitives layer.

use crate::nodeset::{NodeId, NodeSet};

/// Why a primitive could not be carried out.
///
/// `InvalidArgument` is the caller's mistake and is returned at once. The others describe the
/// network or the cluster; for XFER-AND-SIGNAL they arrive through the local event, because the
/// transfer is non-blocking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum PrimError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("node {node} is unreachable: {reason}")]
    Unreachable { node: NodeId, reason: String },
    /// `nodes` are the ones that did not answer in time (not those waiting behind them).
    #[error("nodes {nodes} did not answer within {timeout_ms} ms: {detail}")]
    Timeout {
        nodes: NodeSet,
        timeout_ms: u64,
        detail: String,
    },
    #[error("transfer failed: {0}")]
    TransferFailed(String),
    #[error("protocol error from node {node}: {detail}")]
    Protocol { node: NodeId, detail: String },
    #[error("this node has been shut down")]
    ShutDown,
    /// The backend cannot run on this machine (e.g. its library is not installed).
    #[error("{0}")]
    Unavailable(String),
    /// AWAIT-SPACE gave up: the queues of `nodes` answered, but had not dequeued `needed`
    /// entries (consumers that fell behind, or have not joined the queue's epoch yet). Last, so
    /// that the variants before it keep their numbers on the wire (tcp `Nack`).
    #[error(
        "the queues of nodes {nodes} stayed full (waiting for their consumers to take entry \
         {} of epoch {})",
        .needed & 0xffff_ffff,
        .needed >> 32
    )]
    QueueFull { nodes: NodeSet, needed: u64 },
}

impl PrimError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        PrimError::InvalidArgument(msg.into())
    }

    /// The nodes this error blames: the one whose connection failed, or those that did not
    /// answer in time. Empty for errors about the caller or this node.
    pub fn blamed(&self) -> NodeSet {
        match self {
            PrimError::Unreachable { node, .. } | PrimError::Protocol { node, .. } => {
                NodeSet::single(*node)
            }
            PrimError::Timeout { nodes, .. } | PrimError::QueueFull { nodes, .. } => nodes.clone(),
            _ => NodeSet::new(),
        }
    }
}

pub type Result<T, E = PrimError> = std::result::Result<T, E>;
