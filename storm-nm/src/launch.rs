//! Starting this node's program launcher (storm-pl), which starts every local task (step 3
//! of the paper's Sec. 2.3).
//!
//! The launcher gets the NM's table on descriptor 3 and its link to the NM on descriptor 4;
//! its standard output and error are the NM's own (its messages go to the NM's log).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use storm_pl::request::Outbox;
use storm_pl::{LINK_FD, PlTable, TABLE_FD};

/// The launcher process this NM started, to be waited for (it is not waited for when
/// dropped: the NM reaps it with [`PlProcess::try_wait`]).
#[derive(Debug)]
pub struct PlProcess {
    pid: libc::pid_t,
    exited: Option<ExitStatus>,
}

impl PlProcess {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Sends it SIGKILL (it is reaped by [`PlProcess::try_wait`]).
    pub fn kill(&self) {
        if self.exited.is_none() {
            // SAFETY: a signal to our own child, not yet reaped (its pid is still ours).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    /// Its exit status if it has ended (reaping it), without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if let Some(status) = self.exited {
            return Ok(Some(status));
        }
        let mut raw = 0;
        // SAFETY: waitpid on our own child, with a valid pointer to an int.
        match unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) } {
            0 => Ok(None),
            pid if pid == self.pid => {
                let status = ExitStatus::from_raw(raw);
                self.exited = Some(status);
                Ok(Some(status))
            }
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

/// A pipe whose ends are closed on exec (a child gets its end by a placement of its spawn).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A copy of `fd` numbered 10 or above and closed on exec: placing it at a fixed low number
/// in the child can then not overwrite another descriptor the child is still to get.
fn high_copy(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: fcntl duplicates a descriptor we hold; the copy is ours.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
    if copy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// `posix_spawn`'s file actions and attributes, destroyed on drop.
struct SpawnSetup {
    actions: libc::posix_spawn_file_actions_t,
    attr: libc::posix_spawnattr_t,
}

impl SpawnSetup {
    /// The child gets `dups` (from, to) in order, an empty signal mask and every signal's
    /// default action (the NM ignores SIGPIPE, as Rust programs do, and an ignored signal
    /// would stay ignored across exec).
    fn new(dups: &[(RawFd, RawFd)]) -> std::io::Result<Box<Self>> {
        let check = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::from_raw_os_error(rc))
            }
        };
        // SAFETY: zeroed storage is initialised by the init calls before any other use (and
        // destroying zeroed storage frees nothing); the box keeps it at one address, as the C
        // API expects.
        let mut s: Box<Self> = Box::new(unsafe { std::mem::zeroed() });
        unsafe {
            check(libc::posix_spawn_file_actions_init(&mut s.actions))?;
            check(libc::posix_spawnattr_init(&mut s.attr))?;
            for &(from, to) in dups {
                check(libc::posix_spawn_file_actions_adddup2(
                    &mut s.actions,
                    from,
                    to,
                ))?;
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            check(libc::posix_spawnattr_setsigmask(&mut s.attr, &none))?;
            check(libc::posix_spawnattr_setsigdefault(&mut s.attr, &all))?;
            check(libc::posix_spawnattr_setflags(
                &mut s.attr,
                (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
            ))?;
        }
        Ok(s)
    }
}

impl Drop for SpawnSetup {
    fn drop(&mut self) {
        // SAFETY: both were initialised in `new`.
        unsafe {
            libc::posix_spawn_file_actions_destroy(&mut self.actions);
            libc::posix_spawnattr_destroy(&mut self.attr);
        }
    }
}

unsafe extern "C" {
    static environ: *const *const libc::c_char;
}

/// Starts the node's launcher; gives the process and the NM's end of the link.
///
/// The launcher is started with `posix_spawn`, which glibc carries out with a `vfork`-like
/// clone: the NM's address space is not copied (a `fork` of the NM copies its page tables and
/// write-protects its memory on every CPU). The launcher arranges to die with the NM itself
/// (it gets the NM's pid as its argument), since nothing can run in the child between the
/// spawn and the exec.
pub fn start_launcher(
    pl: &Path,
    table: &PlTable,
    start_timeout: std::time::Duration,
) -> std::io::Result<(PlProcess, Outbox)> {
    let (nm_end, pl_end) = UnixStream::pair()?;
    // Made before the spawn, so that nothing can fail once a launcher runs.
    let outbox = Outbox::new(nm_end)?;
    let null = std::fs::File::open("/dev/null")?;
    // Every descriptor the child gets comes from a copy numbered 10 or above, so that no
    // placement overwrites a source still to be placed (a daemon whose own standard
    // descriptors are closed gets low numbers for everything it opens).
    let sources = [
        (high_copy(null.as_raw_fd())?, 0),
        (high_copy(table.fd().as_raw_fd())?, TABLE_FD),
        (high_copy(pl_end.as_raw_fd())?, LINK_FD),
    ];
    drop((null, pl_end));
    let dups: Vec<(RawFd, RawFd)> = sources
        .iter()
        .map(|(fd, to)| (fd.as_raw_fd(), *to))
        .collect();
    let setup = SpawnSetup::new(&dups)?;
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
    let path =
        CString::new(pl.as_os_str().as_bytes()).map_err(|_| invalid("a NUL in the PL's path"))?;
    let nm_pid = CString::new(std::process::id().to_string()).expect("digits");
    let timeout = CString::new(start_timeout.as_millis().to_string()).expect("digits");
    let argv = [
        path.as_ptr(),
        nm_pid.as_ptr(),
        timeout.as_ptr(),
        std::ptr::null(),
    ];
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is valid for the call; argv is NULL-terminated; `environ` is the
    // process's environment, which the NM does not change while it runs.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            &setup.actions,
            &setup.attr,
            argv.as_ptr() as *const *mut libc::c_char,
            environ as *const *mut libc::c_char,
        )
    };
    drop(setup);
    // The child's ends stay with the child only.
    drop(sources);
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok((PlProcess { pid, exited: None }, outbox))
}
