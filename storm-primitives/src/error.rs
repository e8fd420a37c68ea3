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
    #[error("operation on nodes {nodes} did not complete within {timeout_ms} ms: {detail}")]
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
}

impl PrimError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        PrimError::InvalidArgument(msg.into())
    }
}

pub type Result<T, E = PrimError> = std::result::Result<T, E>;
