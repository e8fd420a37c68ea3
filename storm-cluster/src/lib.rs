//! # storm-cluster
//!
//! What the storm daemons and tools share, so that each side of every exchange is defined in
//! one place:
//!
//! * [`config`]: the cluster file (nodes, backend, timeslice, queue sizes).
//! * [`layout`]: the resource manager's global-memory layout, built identically by the MM and
//!   every NM from the cluster file.
//! * [`messages`]: heartbeats and their commands, per-node reports, output chunks.
//! * [`tasks`]: `-N` / `-n` / `--ntasks-per-node` and the placement of ranks on nodes.
//! * [`control`]: the Unix-socket protocol between storm-submit / storm and the MM.
//!
//! It holds definitions, not behaviour: no threads, and no network access (the control socket
//! is a local Unix socket).

pub mod config;
pub mod control;
pub mod endpoint;
pub mod layout;
pub mod messages;
pub mod tasks;

pub use config::{ClusterConfig, ConfigError};
pub use layout::RmLayout;
pub use messages::JobId;
