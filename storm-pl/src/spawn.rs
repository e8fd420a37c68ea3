//! Starting one task: a `vfork`-like clone of the launcher that runs nothing but system calls
//! until it executes the task's program.
//!
//! The child shares the launcher's memory (CLONE_VM) and the launcher waits until the child
//! has executed the program or given up (CLONE_VFORK), so nothing is copied: the start costs
//! what `posix_spawn` costs. `posix_spawn` itself cannot be used, as it cannot change the
//! child's user. In the child, in this order:
//!
//! 1. every signal's action back to the default, and an empty signal mask;
//! 2. the task's descriptors placed (standard input, output and error, the PMI socket);
//! 3. a process group of its own, which the NM signals for gang switches and kills;
//! 4. the user's groups, group and user (when the launcher runs as root), and the memory
//!    marked not to be traced (it is the launcher's until the exec);
//! 5. death with the launcher (after the change of user, which would clear it);
//! 6. the working directory, reached with the user's rights;
//! 7. the program, executed with the user's rights.
//!
//! The change of user comes as late as it can: from then until the exec, the user could stop
//! the child, and the launcher with it. A step that fails writes which step and the error
//! number into memory the launcher reads once the child is gone.
//!
//! Credentials are changed with the raw system calls: glibc's `setuid` would try to change
//! them in every thread of the (shared) process, and the child is not a thread glibc knows.

use std::ffi::{CString, c_void};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

/// Where the child stopped, if it did not reach the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The clone itself (in the launcher).
    Clone = 0,
    Signals = 1,
    Descriptors = 2,
    ProcessGroup = 3,
    User = 4,
    DeathSignal = 5,
    Directory = 6,
    Exec = 7,
}

impl Step {
    fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            1 => Self::Signals,
            2 => Self::Descriptors,
            3 => Self::ProcessGroup,
            4 => Self::User,
            5 => Self::DeathSignal,
            6 => Self::Directory,
            7 => Self::Exec,
            _ => return None,
        })
    }
}

/// Why a task did not start: the step and its `errno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnError {
    pub step: Step,
    pub errno: i32,
}

impl SpawnError {
    pub fn io(&self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno)
    }
}

/// The user a task runs as, when the launcher must change to it.
pub struct User {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
}

/// Everything the child needs, prepared before the clone: the child may not allocate.
pub struct TaskImage {
    program: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    user: Option<User>,
    /// (from, to): from is above every `to` and closed on exec.
    fds: Vec<(RawFd, RawFd)>,
    /// The launcher's pid, to die with.
    launcher: libc::pid_t,
}

/// A NUL byte in a path, argument or variable (which no exec could pass).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} contains a NUL byte")]
pub struct NulError(pub &'static str);

impl TaskImage {
    /// `fds` are placed in the child as (from, to); every `from` must be above every `to`.
    pub fn new(
        program: &std::path::Path,
        args: &[String],
        env: &[(String, String)],
        cwd: &std::path::Path,
        user: Option<User>,
        fds: Vec<(RawFd, RawFd)>,
    ) -> Result<Self, NulError> {
        use std::os::unix::ffi::OsStrExt;
        let c = |bytes: &[u8], what| CString::new(bytes).map_err(|_| NulError(what));
        let program = c(program.as_os_str().as_bytes(), "the program's path")?;
        let mut argv = vec![program.clone()];
        for a in args {
            argv.push(c(a.as_bytes(), "an argument")?);
        }
        let env = env
            .iter()
            .map(|(k, v)| c(format!("{k}={v}").as_bytes(), "an environment variable"))
            .collect::<Result<_, _>>()?;
        let cwd = c(cwd.as_os_str().as_bytes(), "the working directory")?;
        let top = fds.iter().map(|&(_, to)| to).max().unwrap_or(-1);
        assert!(
            fds.iter().all(|&(from, _)| from > top),
            "every source descriptor must be above every target"
        );
        Ok(Self {
            program,
            argv,
            env,
            cwd,
            user,
            fds,
            // SAFETY: getpid has no preconditions.
            launcher: unsafe { libc::getpid() },
        })
    }
}

/// What the child reads (through the shared memory) and where it writes its failure.
struct Child<'a> {
    image: &'a TaskImage,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    failed_step: AtomicI32,
    failed_errno: AtomicI32,
}

/// The child's stack: it runs only system calls, but glibc's wrappers and a signal arriving
/// before the mask is cleared need some room.
const STACK_BYTES: usize = 64 * 1024;

/// Starts the task; its pid (also its process group) once the program is executing.
pub fn spawn(image: &TaskImage) -> Result<libc::pid_t, SpawnError> {
    let mut child = Child {
        image,
        argv: null_terminated(&image.argv),
        envp: null_terminated(&image.env),
        failed_step: AtomicI32::new(0),
        failed_errno: AtomicI32::new(0),
    };
    // Uninitialised memory will do for a stack.
    let mut stack = Vec::<u8>::with_capacity(STACK_BYTES);
    // The stack grows down from its end, which must be 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + STACK_BYTES) & !15;
    // SAFETY: all signals are blocked around the clone so that no handler of the launcher
    // runs in the child; the old mask is restored after.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: `child` and `stack` outlive the child's use of them: with CLONE_VFORK the
    // launcher resumes only once the child has executed a program or exited.
    let pid = unsafe {
        libc::clone(
            run_child,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &mut child as *mut Child as *mut c_void,
        )
    };
    let clone_errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(SpawnError {
            step: Step::Clone,
            errno: clone_errno,
        });
    }
    match Step::from_raw(child.failed_step.load(Ordering::Acquire)) {
        None => Ok(pid),
        Some(step) => {
            // The child has exited already (the launcher resumed); reap it here.
            let mut status = 0;
            // SAFETY: waitpid on our own child with a valid pointer.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            Err(SpawnError {
                step,
                errno: child.failed_errno.load(Ordering::Acquire),
            })
        }
    }
}

/// The pointers of `strings`, then a null pointer, as `execve` takes them.
fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The child: system calls only, no allocation, no locks. Returns only by exiting.
extern "C" fn run_child(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Child` the launcher keeps alive until this child execs or exits.
    let child = unsafe { &*(arg as *const Child) };
    let image = child.image;
    let fail = |step: Step| -> ! {
        let errno = unsafe { *libc::__errno_location() };
        child.failed_errno.store(errno, Ordering::Release);
        child.failed_step.store(step as i32, Ordering::Release);
        // SAFETY: _exit ends only this child.
        unsafe { libc::_exit(127) }
    };
    // SAFETY (whole block): plain system calls on this process with valid pointers into
    // memory prepared before the clone.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            8usize,
        ) != 0
        {
            fail(Step::Signals);
        }
        for &(from, to) in &image.fds {
            if libc::dup2(from, to) < 0 {
                fail(Step::Descriptors);
            }
        }
        if libc::setpgid(0, 0) != 0 {
            fail(Step::ProcessGroup);
        }
        if let Some(user) = &image.user {
            let ok = libc::syscall(libc::SYS_setgroups, user.groups.len(), user.groups.as_ptr())
                == 0
                && libc::syscall(libc::SYS_setgid, user.gid) == 0
                && libc::syscall(libc::SYS_setuid, user.uid) == 0;
            // Until the exec, this child's memory is the (root) launcher's: the user must not
            // trace it, whatever fs.suid_dumpable says (the change of user just set the
            // memory's dumpable flag from it). The exec gives the task memory of its own,
            // which is the user's to trace.
            if !ok || libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
                fail(Step::User);
            }
        }
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            fail(Step::DeathSignal);
        }
        if libc::getppid() != image.launcher {
            // The launcher died before the setting took effect.
            libc::_exit(137);
        }
        if libc::chdir(image.cwd.as_ptr()) != 0 {
            fail(Step::Directory);
        }
        libc::execve(
            image.program.as_ptr(),
            child.argv.as_ptr(),
            child.envp.as_ptr(),
        );
        fail(Step::Exec)
    }
}
