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
pub use table::{Hold, PlTable, SlotState, TableError};

/// The descriptor on which a PL finds the shared-memory table.
pub const TABLE_FD: i32 = 3;

/// Called by a PL as it starts, or in a child between fork and exec: the calling process
/// gets SIGKILL when the process that started it (`parent`, its pid) dies, so that a killed NM takes its PLs with it and a killed
/// PL its task, and nothing of a job outlives the daemons that track it. Must run after any
/// change of credentials, which clears the setting. Async-signal-safe.
pub fn die_with_parent(parent: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: prctl and getppid are async-signal-safe and touch only this process.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // The parent died before the setting took effect.
        if libc::getppid() != parent {
            libc::_exit(137);
        }
    }
    Ok(())
}
