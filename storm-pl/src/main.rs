//! `storm-pl`: the launcher of one node's tasks (see the crate docs).
//!
//! Started by storm-nm with the NM's pid as its argument (and the task start deadline in
//! milliseconds as a second one), the NM's table on descriptor 3 and the link to the NM on
//! descriptor 4. It serves until the NM closes the link (or dies).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use anyhow::{Context, Result};
use storm_pl::server::Launcher;
use storm_pl::{LINK_FD, PlTable, TABLE_FD};

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("storm-pl {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storm-pl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    // Started by posix_spawn, with nothing run between fork and exec: this launcher makes
    // itself die with the NM, whose pid is its argument.
    let nm: libc::pid_t = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .context("storm-pl is started by storm-nm, with the NM's pid as its argument")?;
    storm_pl::die_with_parent(nm).context("dying with the NM (prctl)")?;
    // A real-time NM ([scheduler] daemon_rt_priority) starts a real-time launcher; its tasks
    // run under the normal policy all the same.
    storm_cluster::daemon::children_run_normal()
        .context("keeping the tasks under the normal scheduling policy")?;
    let owned = |fd: i32, what: &str| -> Result<OwnedFd> {
        // SAFETY: the NM put this descriptor here for us, and nothing else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        nix::fcntl::fcntl(
            &owned,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .with_context(|| format!("{what} on descriptor {fd}"))?;
        Ok(owned)
    };
    let table =
        PlTable::open(owned(TABLE_FD, "the NM's table")?).context("opening the NM's table")?;
    let link = UnixStream::from(owned(LINK_FD, "the link to the NM")?);
    // The task start deadline, if the NM gives one (its second argument, in milliseconds).
    let start_timeout = std::env::args().nth(2).and_then(|a| a.parse().ok()).map_or(
        storm_pl::server::DEFAULT_START_TIMEOUT,
        std::time::Duration::from_millis,
    );
    let launcher = Launcher::new(table, link, start_timeout).context("setting up the launcher")?;
    launcher.serve().context("serving the NM")?;
    Ok(())
}
