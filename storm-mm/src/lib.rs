//! # storm-mm: the machine manager
//!
//! One per cluster (paper Sec. 2.2). It owns the job queue and the allocation of nodes, and
//! drives every node through the heartbeat:
//!
//! * [`control_server`]: the Unix control socket where storm-submit and storm make requests;
//!   the user is identified by the socket's peer credentials.
//! * [`policy`] and [`buddy`]: scheduling policies as pure state machines (FCFS, EASY
//!   backfilling, gang scheduling over an Ousterhout matrix) and buddy allocation of nodes.
//! * [`transfer`]: program transfer to a job's nodes (Algorithm 6).
//! * [`env`]: the seam between the core and the world: the [`Input`]s that reach the core,
//!   and what it asks of its environment (replies, transfers, program copies, the clock).
//! * [`daemon`]: the `storm-mm` process: the host that owns every thread, socket, file and
//!   counter, turns them into inputs, and steps the core.
//! * [`manager`]: the heartbeat loop, as a core without I/O that a host drives: membership of the NMs, heartbeats (Algorithm 4), failure
//!   detection, launch, cancellation, output forwarding and termination detection
//!   (Algorithm 8).
//! * [`nodes`]: the table of node states (unknown, joining, up, down; drained).
//! * [`journal`]: jobs, their results and the drains, in an embedded transactional store, so
//!   that a restarted MM loses nothing it accepted.
//! * [`metrics`]: what `storm metrics` shows, in the Prometheus text format.
//! * [`waker`]: how the MM's threads, and the NMs' termination reports, wake its loop
//!   between timeslices.
//!
//! It reaches the nodes only through `storm-primitives`. It schedules and launches only at
//! heartbeat boundaries; between them it takes termination reports and sends the replies
//! whose journal commit has settled.

pub mod alloc;
pub mod buddy;
mod committer;
pub mod control_server;
pub mod daemon;
pub mod env;
pub mod journal;
pub use storm_primitives::log_limit;
pub mod manager;
pub mod metrics;
pub mod node_history;
pub mod nodes;
pub mod policy;
pub mod replica;
mod saver;
pub mod transfer;
pub mod waker;

pub use daemon::{DaemonEnv, MmOptions, run};
pub use env::{Input, MmEnv};
pub use manager::{MachineManager, MmParts};
pub use waker::Waker;
