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

pub fn start_pl(pl: &Path, table: &PlTable, spec: &PlSpec) -> std::io::Result<Started> {
    let table_fd = table.fd().as_raw_fd();
    let mut cmd = Command::new(pl);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let me = std::process::id() as libc::pid_t;
    // SAFETY: dup2, fcntl, prctl and getppid are async-signal-safe; they only touch the child.
    unsafe {
        cmd.pre_exec(move || {
            storm_pl::die_with_parent(me)?;
            if table_fd == TABLE_FD {
                let flags = libc::fcntl(TABLE_FD, libc::F_GETFD);
                if flags < 0 || libc::fcntl(TABLE_FD, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(table_fd, TABLE_FD) < 0 {
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
