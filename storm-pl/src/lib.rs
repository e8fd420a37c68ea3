//! # storm-pl: the program launcher
//!
//! One PL per application process (paper Sec. 2.2). The node manager starts `storm-pl` with
//! the task's description on standard input and a shared-memory table on descriptor 3; the PL
//! sets up the task (environment, working directory, user, its own process group, output on
//! the NM's pipes), runs it, waits for it, and writes its exit status into its slot of the
//! table, where the NM finds it at its next heartbeat (Algorithm 9).
//!
//! This library holds what the NM and the PL share: the [`PlTable`] layout and the
//! [`PlSpec`]. The PL never talks to other nodes.

mod spec;
mod table;

pub use spec::PlSpec;
pub use table::{PlTable, SlotState, TableError};

/// The descriptor on which a PL finds the shared-memory table.
pub const TABLE_FD: i32 = 3;
