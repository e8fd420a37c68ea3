//! Starting one program launcher (PL) per local task (step 3 of the paper's Sec. 2.3).
//!
//! The PL gets its task description on standard input and the NM's table on descriptor 3;
//! its standard output and error are pipes the NM reads, which the task inherits.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use storm_pl::{PlSpec, PlTable, TABLE_FD};

/// A started PL and the read ends of its task's output pipes.
pub struct Started {
    pub child: Child,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Starts a PL; `pmi`, if given, is the task's end of its PMI socket, which the PL and its
/// task find on descriptor [`crate::pmi::PMI_FD`].
pub fn start_pl(
    pl: &Path,
    table: &PlTable,
    spec: &PlSpec,
    pmi: Option<&OwnedFd>,
) -> std::io::Result<Started> {
    let table_fd = table.fd().as_raw_fd();
    let pmi_fd = pmi.map(|fd| fd.as_raw_fd());
    let mut cmd = Command::new(pl);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let me = std::process::id() as libc::pid_t;
    // SAFETY: dup2, fcntl, prctl and getppid are async-signal-safe; they only touch the child.
    unsafe {
        cmd.pre_exec(move || {
            storm_pl::die_with_parent(me)?;
            // Each descriptor is first copied above the fixed numbers, so that placing one
            // cannot overwrite the other; dup2 leaves the copies open across exec.
            // (No allocation here: this runs between fork and exec.)
            let high = |from: i32| {
                let fd = libc::fcntl(from, libc::F_DUPFD_CLOEXEC, 10);
                if fd < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(fd)
                }
            };
            let table_high = high(table_fd)?;
            let pmi_high = match pmi_fd {
                Some(fd) => Some(high(fd)?),
                None => None,
            };
            if libc::dup2(table_high, TABLE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = pmi_high
                && libc::dup2(fd, crate::pmi::PMI_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = OwnedFd::from(child.stdout.take().expect("piped"));
    let stderr = OwnedFd::from(child.stderr.take().expect("piped"));
    if let Err(e) = stdin.write_all(&spec.encode()) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    drop(stdin);
    Ok(Started {
        child,
        stdout,
        stderr,
    })
}
