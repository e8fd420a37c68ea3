//! # storm-pl: the program launcher
//!
//! The paper (Sec. 2.2) has one PL per application process. Here one `storm-pl` per node
//! serves every task its node manager starts, as a Slurm step daemon serves a step's tasks:
//! a launcher's own start (exec, dynamic loading, runtime setup) cost as much processor time
//! as the task it started, and a short job paid it every time. What a PL does for its task is
//! unchanged: it sets up the task (environment, working directory, user, its own process
//! group, output on the NM's pipes), runs it, waits for it, and writes its exit status into
//! its slot of the shared table, where the NM finds it at its next heartbeat (Algorithm 9).
//!
//! - [`table`]: the NM-PL shared-memory table, one slot per task.
//! - [`request`]: the NM's requests on the link between them (start a task, look again).
//! - [`spawn`]: starting one task, by a `vfork`-like clone that copies nothing.
//! - [`server`]: the launcher's loop.
//!
//! The NM starts `storm-pl` with its pid as the argument, the table on descriptor 3 and the
//! link on descriptor 4. The PL never talks to other nodes.

pub mod request;
pub mod server;
pub mod spawn;
mod spec;
pub mod table;

pub use server::PMI_FD;
pub use spec::PlSpec;
pub use table::{Begin, Cancel, Hold, PlTable, SlotState, TableError};

/// The descriptor on which the launcher finds the shared-memory table.
pub const TABLE_FD: i32 = 3;
/// The descriptor on which the launcher finds its link to the NM.
pub const LINK_FD: i32 = 4;

/// Called by the launcher as it starts, or in a child before exec: the calling process
/// gets SIGKILL when the process that started it (`parent`, its pid) dies, so that a killed NM
/// takes its launcher with it and a killed launcher its tasks, and nothing of a job outlives
/// the daemons that track it. Must run after any change of credentials, which clears the
/// setting. Async-signal-safe.
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
