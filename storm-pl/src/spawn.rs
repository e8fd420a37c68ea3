//! Starting one task: a clone of the launcher that shares its memory (nothing is copied) and
//! runs nothing but system calls until it executes the task's program.
//!
//! The launcher does not wait for the child: from the clone on, the task is a process of its
//! own, and the launcher serves the node's other tasks while it starts. (A `vfork` would make
//! the launcher wait until the exec, and the task's user can stop the child between its
//! change of user and its exec: every start on the node, other users' too, would then wait
//! with it.) Until its exec the child reads what [`Spawned`] keeps for it (the image, its
//! stack, the word where it records a failure), so the launcher keeps a `Spawned` until the
//! child is reaped. The kernel clears [`Spawned::exec_pending`]'s word when the child leaves
//! the shared memory, by exec or by exit (`CLONE_CHILD_CLEARTID`); a child still short of its
//! exec after the task start deadline is killed by the launcher, and its task fails with the
//! reason.
//!
//! In the child, in this order:
//!
//! 1. every signal's action back to the default, and an empty signal mask;
//! 2. the task's descriptors placed (standard input, output and error, the PMI socket);
//! 3. a process group of its own, which the NM signals for gang switches and kills (the
//!    launcher sets it too, so it exists as soon as the clone returns), and the job's cgroup
//!    (it writes itself into each `cgroup.procs` the launcher opened), so that nothing it
//!    forks can leave the job, and the CPUs its NM bound it to (`--cpu-bind`);
//! 4. the user's groups, group and user (when the launcher runs as root), and the memory
//!    marked not to be traced (it is the launcher's until the exec);
//! 5. death with the launcher (after the change of user, which would clear it);
//! 6. the submitter's umask (`STORM_UMASK`), then the working directory, reached with the
//!    user's rights;
//! 7. a batch script's output and error files, opened (created, truncated, mode 0666 less
//!    the umask) with the user's rights, in place of its standard output and error;
//! 8. the program, executed with the user's rights.
//!
//! A step that fails records which step and the error number where the launcher reads them
//! once the child is reaped. The child makes its system calls directly ([`raw`]), never
//! through libc: it runs beside the launcher's thread on that thread's thread-local storage,
//! where a libc wrapper would write `errno` under the launcher's feet.

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
    Cgroup = 8,
    OutputFile = 9,
    ErrorFile = 10,
    Affinity = 11,
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
            8 => Self::Cgroup,
            9 => Self::OutputFile,
            10 => Self::ErrorFile,
            11 => Self::Affinity,
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
    /// The job's `cgroup.procs` files, open for writing (closed on exec).
    cgroups: Vec<RawFd>,
    /// The launcher's pid, to die with.
    launcher: libc::pid_t,
    /// Files for standard output and error (a batch script's), opened in the child.
    files: OutputFiles,
    /// The submitter's file-creation mask (`STORM_UMASK` in the task's environment, as its
    /// submitter's command set it; Slurm's `SLURM_UMASK`), set in the child before it opens
    /// or makes anything; `None` keeps the launcher's.
    umask: Option<u32>,
    /// The CPUs the task is bound to (`STORM_CPU_BIND_LIST`, set by its NM: `--cpu-bind`),
    /// as the kernel's `cpu_set_t` bits; `None` leaves the launcher's affinity.
    cpus: Option<CpuMask>,
}

/// A `cpu_set_t` of 1024 CPUs, as `sched_setaffinity` takes it.
type CpuMask = [u64; CPU_MASK_WORDS];
const CPU_MASK_WORDS: usize = (storm_cluster::cpu_bind::MAX_CPU as usize + 1) / 64;

/// The CPUs `STORM_CPU_BIND_LIST` in `env` names, as a mask; `None` without the variable.
/// A list that does not parse is refused with the reason (its NM wrote it: it parses).
pub fn cpus_of(
    env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Result<Option<CpuMask>, String> {
    use storm_cluster::cpu_bind::{LIST_VAR, parse_list};
    let Some((_, v)) = env.iter().rev().find(|(k, _)| k == LIST_VAR) else {
        return Ok(None);
    };
    let text = v
        .to_str()
        .ok_or_else(|| format!("{LIST_VAR} is not text"))?;
    let mut mask = [0u64; CPU_MASK_WORDS];
    for cpu in parse_list(text)? {
        mask[cpu as usize / 64] |= 1 << (cpu % 64);
    }
    Ok(Some(mask))
}

/// The variable that carries the submitter's umask to its tasks (octal, as `umask` prints
/// it).
pub const UMASK_VAR: &str = "STORM_UMASK";

/// The umask `STORM_UMASK` in `env` names, if it names one (octal, at most 0777).
pub fn umask_of(env: &[(std::ffi::OsString, std::ffi::OsString)]) -> Option<u32> {
    let (_, v) = env.iter().rev().find(|(k, _)| k == UMASK_VAR)?;
    let m = u32::from_str_radix(v.to_str()?.trim(), 8).ok()?;
    (m <= 0o777).then_some(m)
}

/// Where a task's standard output and error go instead of the NM's pipes: a batch script's
/// files, opened by the task's own process with its user's rights after it changed to its
/// working directory (relative paths are relative to it). Standard error goes to the output
/// file unless `error` names another.
struct OutputFiles {
    output: Option<CString>,
    error: Option<CString>,
}

/// Why a task's image cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// A NUL byte in a path, argument or variable (which no exec could pass).
    #[error("{0} contains a NUL byte")]
    Nul(&'static str),
    /// `STORM_CPU_BIND_LIST` names no CPUs the launcher can bind to.
    #[error("{0}")]
    CpuList(String),
}

impl TaskImage {
    /// `fds` are placed in the child as (from, to); every `from` must be above every `to`.
    /// The child writes itself into each of `cgroups` (open `cgroup.procs` files), which must
    /// stay open until [`spawn`] returns.
    pub fn new(
        spec: &crate::PlSpec,
        user: Option<User>,
        fds: Vec<(RawFd, RawFd)>,
        cgroups: Vec<RawFd>,
    ) -> Result<Self, ImageError> {
        use std::os::unix::ffi::OsStrExt;
        let c = |bytes: &[u8], what| CString::new(bytes).map_err(|_| ImageError::Nul(what));
        let program = c(spec.program.as_os_str().as_bytes(), "the program's path")?;
        let mut argv = vec![program.clone()];
        for a in &spec.args {
            argv.push(c(a.as_bytes(), "an argument")?);
        }
        let env = spec
            .env
            .iter()
            .map(|(k, v)| {
                let pair = [k.as_bytes(), b"=", v.as_bytes()].concat();
                c(&pair, "an environment variable")
            })
            .collect::<Result<_, _>>()?;
        let cwd = c(spec.cwd.as_os_str().as_bytes(), "the working directory")?;
        let path = |p: &Option<std::path::PathBuf>, what| {
            p.as_ref()
                .map(|p| c(p.as_os_str().as_bytes(), what))
                .transpose()
        };
        let files = OutputFiles {
            output: path(&spec.output_file, "the output file's path")?,
            error: path(&spec.error_file, "the error file's path")?,
        };
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
            cgroups,
            // SAFETY: getpid has no preconditions.
            launcher: unsafe { libc::getpid() },
            files,
            umask: umask_of(&spec.env),
            cpus: cpus_of(&spec.env).map_err(ImageError::CpuList)?,
        })
    }
}

/// What the child reads (through the shared memory) and where it writes its failure. Boxed,
/// so that it stays where the child found it while the launcher moves its owner around.
struct Child {
    image: TaskImage,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    failed_step: AtomicI32,
    failed_errno: AtomicI32,
    /// Not zero until the child has executed its program or exited: the kernel clears it
    /// then (`CLONE_CHILD_CLEARTID`).
    in_launcher_memory: AtomicI32,
}

/// The child's stack: it runs only system calls, but a signal arriving before the mask is
/// cleared needs some room.
const STACK_BYTES: usize = 64 * 1024;

/// A task's process, started; its memory until its exec is the launcher's, so this must be
/// kept until the process is reaped.
pub struct Spawned {
    pid: libc::pid_t,
    child: Box<Child>,
    /// Never read: it is the child's stack until its exec.
    _stack: Vec<u8>,
}

// SAFETY: the raw pointers in `Child` point into its own `image`, which moves with it (boxed).
unsafe impl Send for Spawned {}

impl Spawned {
    /// The task's process id (also its process group).
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Whether the child is still short of its exec (it has neither executed the program nor
    /// exited).
    pub fn exec_pending(&self) -> bool {
        self.child.in_launcher_memory.load(Ordering::Acquire) != 0
    }

    /// Why the child did not reach its program, once it has exited (read after reaping it).
    pub fn failure(&self) -> Option<SpawnError> {
        Step::from_raw(self.child.failed_step.load(Ordering::Acquire)).map(|step| SpawnError {
            step,
            errno: self.child.failed_errno.load(Ordering::Acquire),
        })
    }
}

/// Starts the task and returns at once, its process running towards its exec.
pub fn spawn(image: TaskImage) -> Result<Spawned, SpawnError> {
    let argv = null_terminated(&image.argv);
    let envp = null_terminated(&image.env);
    let child = Box::new(Child {
        image,
        argv,
        envp,
        failed_step: AtomicI32::new(0),
        failed_errno: AtomicI32::new(0),
        in_launcher_memory: AtomicI32::new(-1),
    });
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
    let arg = &*child as *const Child as *mut c_void;
    let clear = child.in_launcher_memory.as_ptr();
    // SAFETY: `child` and `stack` are moved into the returned `Spawned`, which the launcher
    // keeps until the child is reaped; the heap memory they point to does not move.
    let pid = unsafe {
        libc::clone(
            run_child,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD,
            arg,
            std::ptr::null_mut::<libc::pid_t>(),
            std::ptr::null_mut::<c_void>(),
            clear,
        )
    };
    let clone_errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if pid < 0 {
        return Err(SpawnError {
            step: Step::Clone,
            errno: clone_errno,
        });
    }
    // The child makes this its process group too; whichever comes first, the group exists
    // when this returns, so the NM can signal it at once. (Once the child has executed its
    // program this fails, harmlessly.)
    // SAFETY: setpgid on our own child.
    unsafe { libc::setpgid(pid, pid) };
    Ok(Spawned {
        pid,
        child,
        _stack: stack,
    })
}

/// The pointers of `strings`, then a null pointer, as `execve` takes them.
fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// System calls made directly, returning `-errno` on failure: the child never goes through
/// libc, which would write `errno` into the launcher thread's storage.
mod raw {
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn syscall(n: libc::c_long, a: [usize; 4]) -> isize {
        let ret: isize;
        // SAFETY: the caller passes a valid system call and arguments.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") n as isize => ret,
                in("rdi") a[0],
                in("rsi") a[1],
                in("rdx") a[2],
                in("r10") a[3],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    #[cfg(target_arch = "aarch64")]
    pub unsafe fn syscall(n: libc::c_long, a: [usize; 4]) -> isize {
        let ret: isize;
        // SAFETY: the caller passes a valid system call and arguments.
        unsafe {
            core::arch::asm!(
                "svc 0",
                in("x8") n,
                inlateout("x0") a[0] as isize => ret,
                in("x1") a[1],
                in("x2") a[2],
                in("x3") a[3],
                options(nostack),
            );
        }
        ret
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    compile_error!("storm-pl starts tasks with direct system calls on x86_64 and aarch64 only");
}

/// The child: direct system calls only, no allocation, no locks, no libc. Returns only by
/// exiting.
extern "C" fn run_child(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Child` the launcher keeps alive until this child is reaped.
    let child = unsafe { &*(arg as *const Child) };
    let image = &child.image;
    // SAFETY (every call below): plain system calls on this process with valid pointers into
    // memory prepared before the clone.
    let sys = |n: libc::c_long, a: [usize; 4]| unsafe { raw::syscall(n, a) };
    let fail = |step: Step, ret: isize| -> ! {
        child.failed_errno.store((-ret) as i32, Ordering::Release);
        child.failed_step.store(step as i32, Ordering::Release);
        sys(libc::SYS_exit_group, [127, 0, 0, 0]);
        #[allow(clippy::empty_loop)]
        loop {}
    };
    // Every disposition back to the default (a zeroed kernel sigaction is SIG_DFL, no flags,
    // empty mask; signals that cannot be changed just fail).
    let dfl = [0u64; 4];
    for sig in 1..=64usize {
        if sig != libc::SIGKILL as usize && sig != libc::SIGSTOP as usize {
            sys(libc::SYS_rt_sigaction, [sig, dfl.as_ptr() as usize, 0, 8]);
        }
    }
    let none = 0u64;
    let r = sys(
        libc::SYS_rt_sigprocmask,
        [
            libc::SIG_SETMASK as usize,
            &none as *const u64 as usize,
            0,
            8,
        ],
    );
    if r != 0 {
        fail(Step::Signals, r);
    }
    for &(from, to) in &image.fds {
        let r = sys(libc::SYS_dup3, [from as usize, to as usize, 0, 0]);
        if r < 0 {
            fail(Step::Descriptors, r);
        }
    }
    let r = sys(libc::SYS_setpgid, [0, 0, 0, 0]);
    if r != 0 {
        fail(Step::ProcessGroup, r);
    }
    // "0" moves the writing process.
    let me = b"0\n";
    for &fd in &image.cgroups {
        let r = sys(
            libc::SYS_write,
            [fd as usize, me.as_ptr() as usize, me.len(), 0],
        );
        if r < 0 {
            fail(Step::Cgroup, r);
        }
    }
    // `--cpu-bind`: before the change of user, so that a failure is the launcher's to
    // report whatever the user may do.
    if let Some(mask) = &image.cpus {
        let r = sys(
            libc::SYS_sched_setaffinity,
            [0, std::mem::size_of::<CpuMask>(), mask.as_ptr() as usize, 0],
        );
        if r != 0 {
            fail(Step::Affinity, r);
        }
    }
    if let Some(user) = &image.user {
        for (n, a) in [
            (
                libc::SYS_setgroups,
                [user.groups.len(), user.groups.as_ptr() as usize, 0, 0],
            ),
            (libc::SYS_setgid, [user.gid as usize, 0, 0, 0]),
            (libc::SYS_setuid, [user.uid as usize, 0, 0, 0]),
            // Until the exec, this child's memory is the (root) launcher's: the user must
            // not trace it, whatever fs.suid_dumpable says (the change of user just set the
            // memory's dumpable flag from it). The exec gives the task memory of its own,
            // which is the user's to trace.
            (libc::SYS_prctl, [libc::PR_SET_DUMPABLE as usize, 0, 0, 0]),
        ] {
            let r = sys(n, a);
            if r != 0 {
                fail(Step::User, r);
            }
        }
    }
    let r = sys(
        libc::SYS_prctl,
        [
            libc::PR_SET_PDEATHSIG as usize,
            libc::SIGKILL as usize,
            0,
            0,
        ],
    );
    if r != 0 {
        fail(Step::DeathSignal, r);
    }
    if sys(libc::SYS_getppid, [0; 4]) != image.launcher as isize {
        // The launcher died before the setting took effect.
        sys(libc::SYS_exit_group, [137, 0, 0, 0]);
    }
    // The submitter's mask, before anything is made: the batch files below, and what the
    // program makes.
    if let Some(mask) = image.umask {
        sys(libc::SYS_umask, [mask as usize, 0, 0, 0]);
    }
    let r = sys(libc::SYS_chdir, [image.cwd.as_ptr() as usize, 0, 0, 0]);
    if r != 0 {
        fail(Step::Directory, r);
    }
    // A batch script's files, as its user, from its working directory.
    let open = |path: &CString, step: Step| -> isize {
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOCTTY;
        let fd = sys(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as isize as usize,
                path.as_ptr() as usize,
                flags as usize,
                // Less the umask, as a shell's redirection makes it.
                0o666,
            ],
        );
        if fd < 0 {
            fail(step, fd);
        }
        fd
    };
    if let Some(out) = &image.files.output {
        let fd = open(out, Step::OutputFile);
        let r = sys(libc::SYS_dup3, [fd as usize, 1, 0, 0]);
        if r < 0 {
            fail(Step::OutputFile, r);
        }
        let err = match &image.files.error {
            Some(e) => open(e, Step::ErrorFile),
            None => fd,
        };
        let r = sys(libc::SYS_dup3, [err as usize, 2, 0, 0]);
        if r < 0 {
            fail(Step::ErrorFile, r);
        }
    }
    let r = sys(
        libc::SYS_execve,
        [
            image.program.as_ptr() as usize,
            child.argv.as_ptr() as usize,
            child.envp.as_ptr() as usize,
            0,
        ],
    );
    fail(Step::Exec, r)
}
