//! Tunables of the tcp backend.

use std::sync::Arc;
use std::time::Duration;

use super::auth::{ClusterKey, Protection};
use crate::{NodeId, NodeSet};

/// The public identity key of each peer that must prove who it is (see
/// [`TcpConfig::peer_keys`]); `None` for a node that may not connect at all.
#[derive(Clone)]
pub struct PeerKeys(pub Arc<dyn Fn(NodeId) -> Option<ed25519_dalek::VerifyingKey> + Send + Sync>);

impl std::fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerKeys(..)")
    }
}

/// Which bytes of this node's memory an origin may write: `(origin, offset, len)`.
#[derive(Clone)]
pub struct WriteCheck(pub Arc<dyn Fn(NodeId, u64, u64) -> bool + Send + Sync>);

impl std::fmt::Debug for WriteCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteCheck(..)")
    }
}

/// How a tcp node builds trees, splits data and gives up on peers.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Children per node in the spanning trees (2 is the paper's binary broadcast).
    pub fanout: usize,
    /// Bytes per data frame of a pipelined transfer.
    pub chunk_size: usize,
    /// How long an operation may take before it fails. A dead peer whose connection closes is
    /// noticed at once; this bounds the wait for one that silently stops answering.
    pub op_timeout: Duration,
    /// How long to wait for a TCP connection and its handshake.
    pub connect_timeout: Duration,
    /// How long data sent to a peer may stay unacknowledged before the connection is declared
    /// lost (TCP_USER_TIMEOUT): a peer behind a cut link fails its operations after this
    /// instead of after `op_timeout`.
    pub peer_timeout: Duration,
    /// Largest data frame body accepted from a peer.
    pub max_frame: usize,
    /// Nodes talk only to nodes that prove they hold this key (see [`super::auth`]).
    pub key: ClusterKey,
    /// How frames after the handshake are protected.
    pub protection: Protection,
    /// Handshakes being made at once with peers not yet authenticated; more are refused.
    pub max_handshakes: usize,
    /// Of those, handshakes from one source address: a flood from one host cannot take every
    /// place and keep the cluster's nodes out. (Nodes sharing an address, as on loopback,
    /// share its places too; their handshakes last a round trip, so they rarely overlap.)
    pub max_handshakes_per_source: usize,
    /// Operations one node keeps in progress for others: transfers passing through or ending
    /// here, COMPARE-AND-WRITEs here, and requests queued here as a root, each counted on its
    /// own. More are refused with an error to their origin, so that no peer can grow a node's
    /// tables without bound.
    pub max_pending_ops: usize,
    /// Bytes of transfer data a node holds for transfers not committed yet; a transfer that
    /// would pass it fails.
    pub max_staged_bytes: u64,
    /// The only origins whose XFER-AND-SIGNALs and writing COMPARE-AND-WRITEs this node
    /// carries out on its own memory (`None`: every member). A compute node takes them from
    /// the MM alone; others are refused with an error to their origin and logged.
    pub writers: Option<NodeSet>,
    /// This node's identity key: every handshake it opens carries its signature over the
    /// handshake, so that a peer that knows the key knows which node it is (a node's
    /// `node.key`).
    /// (Behind a lock: a daemon reads it again on SIGHUP, to rotate it.)
    pub identity: Option<Arc<parking_lot::RwLock<ed25519_dalek::SigningKey>>>,
    /// Peers that open a connection here must prove their identity with the key this gives
    /// for the node they claim to be (the MM, with the nodes enrolled there); `None`: the
    /// cluster key is enough.
    pub peer_keys: Option<PeerKeys>,
    /// Operations are carried out only for the node whose own link brought them (the MM:
    /// no compute node relays another's operations to it, so none may act for another).
    pub bind_origins: bool,
    /// Which bytes each origin may write here (the MM: each node its own areas); `None`:
    /// any.
    pub write_check: Option<WriteCheck>,
    /// Peers that may be at any of several addresses (a replicated MM: whichever replica
    /// leads): a connection tries the directory's address first, then these in order, and the
    /// directory keeps the one that answered.
    pub alternates: Vec<(crate::NodeId, Vec<std::net::SocketAddr>)>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            fanout: 2,
            chunk_size: 256 * 1024,
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            peer_timeout: Duration::from_millis(500),
            max_frame: 16 * 1024 * 1024,
            // Nodes started in one process from one config share it; separate processes
            // must be given the same key.
            key: ClusterKey::random(),
            protection: Protection::Encrypt,
            max_handshakes: 64,
            max_handshakes_per_source: 8,
            max_pending_ops: 4096,
            max_staged_bytes: 1 << 30,
            writers: None,
            identity: None,
            peer_keys: None,
            bind_origins: false,
            write_check: None,
            alternates: Vec::new(),
        }
    }
}

impl TcpConfig {
    /// Checks the values make sense; the error names the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.fanout == 0 {
            return Err("fanout must be at least 1".into());
        }
        if self.chunk_size == 0 {
            return Err("chunk_size must be at least 1 byte".into());
        }
        if self.chunk_size + super::wire::DATA_PREFIX_LEN > self.max_frame {
            return Err(format!(
                "chunk_size {} does not fit in max_frame {}",
                self.chunk_size, self.max_frame
            ));
        }
        if self.max_pending_ops == 0 || self.max_staged_bytes == 0 {
            return Err("max_pending_ops and max_staged_bytes must be at least 1".into());
        }
        if self.max_frame > u32::MAX as usize {
            return Err("max_frame must fit in 32 bits".into());
        }
        if self.op_timeout.is_zero()
            || self.connect_timeout.is_zero()
            || self.peer_timeout.is_zero()
        {
            return Err("timeouts must be greater than zero".into());
        }
        Ok(())
    }
}
