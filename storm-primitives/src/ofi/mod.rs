//! Backend `ofi`: the primitives over libfabric, with RDMA writes and network atomics.
//!
//! * `fabric`: owned libfabric objects and memory registration (every `FI_MR_*` mode).
//! * `progress`: the completion-queue thread; remote CQ data raises events.
//! * `bootstrap`: exchanging endpoint names, keys and base addresses over another backend.
//! * `node`: [`OfiNode`], XFER-AND-SIGNAL over `fi_write`/`fi_writedata` and
//!   COMPARE-AND-WRITE over the FI_CSWAP family.
//!
//! Tested here on `tcp;ofi_rxm`, `sockets` and `shm`; on InfiniBand it runs on
//! `verbs;ofi_rxm` (see docs/primitives.md for what only real hardware exercises).

pub mod bootstrap;
mod fabric;
mod node;
mod progress;

use std::time::Duration;

pub use bootstrap::{BootstrapLayout, bootstrap_layout};
pub use fabric::{available_providers, library};
pub use node::OfiNode;

/// How an ofi node opens its provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfiConfig {
    /// The libfabric provider, e.g. `tcp;ofi_rxm`, `verbs;ofi_rxm`, `sockets`, `shm`.
    pub provider: String,
    /// The address to bind (for IP-based providers); `None` lets the provider choose.
    pub node: Option<String>,
    /// How long an operation may take before it fails.
    pub op_timeout: Duration,
    /// How long to wait for every node's address at start-up.
    pub bootstrap_timeout: Duration,
    /// Bytes per RMA write of a transfer.
    pub chunk_size: usize,
    /// Register local buffers even if the provider does not ask for it (FI_MR_LOCAL). Lets the
    /// registration path that InfiniBand needs run on providers that do not need it.
    pub force_mr_local: bool,
}

impl OfiConfig {
    pub fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_string(),
            node: None,
            op_timeout: Duration::from_secs(5),
            bootstrap_timeout: Duration::from_secs(30),
            chunk_size: 1 << 20,
            force_mr_local: false,
        }
    }
}

/// The provider to use when none is named: `verbs;ofi_rxm` where an RDMA device exists,
/// otherwise `tcp;ofi_rxm`.
pub fn default_provider() -> String {
    let found = available_providers();
    if found.iter().any(|p| p == "verbs;ofi_rxm") {
        "verbs;ofi_rxm".into()
    } else {
        "tcp;ofi_rxm".into()
    }
}
