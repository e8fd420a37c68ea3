//! Tunables of the tcp backend.

use std::time::Duration;

/// How a tcp node builds trees, splits data and gives up on peers.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Nodes only talk to nodes presenting the same key (guards against mixing two clusters
    /// on one network; it is not authentication).
    pub cluster_key: u64,
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
            cluster_key: 0,
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
