//! # storm-primitives
//!
//! The three network primitives every part of storm is built on (STORM paper Sec. 2.4.1):
//!
//! * **XFER-AND-SIGNAL**: PUT a block of data into the global memory of a set of nodes, then
//!   raise an event on each of them and one here. Non-blocking and all-or-nothing.
//! * **TEST-EVENT**: poll a local event, or park until it is raised.
//! * **COMPARE-AND-WRITE**: check `global[var] REL value` on every node of a set and, if it
//!   holds everywhere, write a global variable on all of them. Sequentially consistent.
//!
//! ## What this crate owns
//!
//! * The contract, as the [`Primitives`] trait, and its building blocks: [`NodeSet`],
//!   [`Layout`] (the map of global memory every node computes alike), [`GlobalMemory`],
//!   events ([`EventTable`], [`Wait`]) and [`Relation`].
//! * The backends: [`local`] (N virtual nodes in one process), [`tcp`] (every node its own
//!   endpoint; pipelined tree broadcast and tree reduction) and [`ofi`] (libfabric: RDMA
//!   writes and network atomics; libfabric is loaded the first time an ofi node starts, so
//!   the other backends never load it).
//! * The factory that starts a node on any of them: [`backend::Backend::start`].
//! * The [`helpers`] built only on the primitives: AWAIT-SPACE flow control and remote queues.
//! * The [`conformance`] suite that states the contract as tests and runs on every backend.
//! * [`log_limit`]: warnings that may recur (a flood of refused peers or requests) logged at
//!   most once per interval, with the count in between; every daemon uses it.
//!
//! ## What it must never do
//!
//! Know anything about jobs, nodes' roles or scheduling. Resource-management crates reach the
//! network only through the [`Primitives`] trait; this crate is the only one in the workspace
//! that opens sockets between nodes (see docs/primitives.md, "Keeping the layering").

pub mod backend;
pub mod codec;
pub mod conformance;
mod error;
mod event;
pub mod helpers;
mod layout;
pub mod local;
pub mod log_limit;
mod memory;
mod nodeset;
pub mod ofi;
mod prims;
mod relation;
pub mod tcp;

pub use backend::{Backend, BackendError};
pub use error::{PrimError, Result};
pub use event::{EventTable, Wait};
pub use layout::{
    Area, EventId, Layout, LayoutBuilder, LayoutError, QUEUE_SLOT_HEADER, QueueLayout, VarArray,
    VarId, fnv1a64,
};
pub use memory::GlobalMemory;
pub use nodeset::{NodeId, NodeSet, NodeSetError};
pub use prims::Primitives;
pub use relation::Relation;
