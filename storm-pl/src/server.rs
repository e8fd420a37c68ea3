//! The launcher's loop: one `storm-pl` per node starts and waits for every task the NM asks
//! it to.
//!
//! It waits on two things: the NM's link ([`crate::request`]) and SIGCHLD (a signalfd). A
//! START whose slot is free to go is started at once ([`crate::spawn`]); one whose slot the
//! NM holds is kept until a LOOK finds it released or cancelled. An ended task's status goes
//! into its slot. When the NM closes the link, the launcher exits, and its tasks with it
//! (each dies with its launcher).
//!
//! The launcher never waits for a process a user controls: a task's process is on its own
//! from its clone on. One still short of its exec after the task start deadline (its user
//! stopped it after it took their identity, say) is killed, and its task fails with the
//! reason on its standard error.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use storm_cluster::messages::RankStatus;

use crate::request::{self, Request, RequestError, StartTask};
use crate::spawn::{self, SpawnError, Spawned, Step, TaskImage, User};
use crate::spec::PlSpec;
use crate::table::{Begin, PlTable};

/// The descriptor numbers a task gets: standard input, output, error, and the PMI socket.
const STDIN: RawFd = 0;
const STDOUT: RawFd = 1;
const STDERR: RawFd = 2;
pub const PMI_FD: RawFd = 4;

/// How long a user's group list is reused before it is looked up again.
const GROUPS_TTL: Duration = Duration::from_secs(60);

/// Why the launcher stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the NM's link: {0}")]
    Link(#[from] RequestError),
    #[error("{0}")]
    Sys(#[from] nix::Error),
}

/// How long a task's process may take from its clone to its exec unless the NM says
/// otherwise (`[failure] task_start_timeout_ms`).
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// A task's process, from its clone until it is reaped.
struct Running {
    slot: usize,
    spawned: Spawned,
    /// Until the process has executed its program: what is needed to tell its user why it
    /// did not.
    starting: Option<Starting>,
}

/// A task's process not known to have reached its program yet.
struct Starting {
    deadline: Instant,
    /// The task's standard error, to say why it did not start.
    stderr: OwnedFd,
    spec: PlSpec,
    /// Killed for missing the deadline.
    killed: bool,
}

/// A launcher serving one NM.
pub struct Launcher {
    table: PlTable,
    link: UnixStream,
    /// Started tasks by pid.
    running: HashMap<libc::pid_t, Running>,
    /// How long a task's process may take to reach its exec.
    start_timeout: Duration,
    /// Requests whose slot the NM holds.
    kept: Vec<StartTask>,
    /// Standard input of every task that does not read the job's input.
    null: OwnedFd,
    /// The launcher's own user; it changes users only as root.
    uid: libc::uid_t,
    groups: HashMap<(libc::uid_t, libc::gid_t), (Instant, Vec<libc::gid_t>)>,
}

impl Launcher {
    /// A launcher whose tasks must reach their exec within `start_timeout`.
    pub fn new(table: PlTable, link: UnixStream, start_timeout: Duration) -> std::io::Result<Self> {
        let null = std::fs::File::open("/dev/null")?;
        Ok(Self {
            table,
            link,
            running: HashMap::new(),
            start_timeout,
            kept: Vec::new(),
            null: above(OwnedFd::from(null))?,
            uid: nix::unistd::geteuid().as_raw(),
            groups: HashMap::new(),
        })
    }

    /// Serves until the NM closes the link.
    pub fn serve(mut self) -> Result<(), ServeError> {
        // Gang scheduling stops and continues tasks every time slice; with SA_NOCLDSTOP the
        // kernel raises SIGCHLD only when a task ends, so a switch never wakes the launcher.
        // (The flag holds for a signal read through a signalfd, too.)
        let only_exits = SigAction::new(SigHandler::SigDfl, SaFlags::SA_NOCLDSTOP, SigSet::empty());
        // SAFETY: the default disposition, with a flag; no handler runs.
        unsafe { sigaction(Signal::SIGCHLD, &only_exits) }?;
        let mut chld = SigSet::empty();
        chld.add(Signal::SIGCHLD);
        chld.thread_block()?;
        let exits = SignalFd::with_flags(&chld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        loop {
            let timeout = match self.check_starts(Instant::now()) {
                None => PollTimeout::NONE,
                Some(wait) => {
                    let ms = wait.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = [
                PollFd::new(self.link.as_fd(), PollFlags::POLLIN),
                PollFd::new(exits.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let request_ready = fds[0].any().unwrap_or(true);
            let exited = fds[1].any().unwrap_or(true);
            if exited {
                while let Ok(Some(_)) = exits.read_signal() {}
                self.reap();
            }
            if request_ready {
                match request::recv(&self.link)? {
                    None => return Ok(()),
                    Some(Request::Start(task)) => self.take(*task),
                    Some(Request::Look) => {
                        for task in std::mem::take(&mut self.kept) {
                            self.take(task);
                        }
                    }
                }
            }
        }
    }

    /// Starts the task, keeps it while held, or ends it as cancelled.
    fn take(&mut self, task: StartTask) {
        let slot = task.spec.slot as usize;
        match self.table.try_begin_spawn(slot) {
            Ok(Begin::Go) => self.start(task),
            Ok(Begin::Held) => self.kept.push(task),
            Ok(Begin::Cancelled(status)) => self.end(slot, status),
            Ok(Begin::OutOfStep(state)) => {
                eprintln!("storm-pl: slot {slot} is {state:?}; its request is dropped");
            }
            Err(e) => eprintln!("storm-pl: {e}; the request is dropped"),
        }
    }

    fn end(&self, slot: usize, status: RankStatus) {
        if let Err(e) = self.table.set_exited(slot, status) {
            eprintln!("storm-pl: {e}");
        }
    }

    fn start(&mut self, task: StartTask) {
        let (slot, rank) = (task.spec.slot as usize, task.spec.rank);
        let task = match above_targets(task) {
            Ok(task) => task,
            Err(e) => {
                eprintln!("storm-pl: rank {rank}: placing its descriptors: {e}");
                self.end(slot, RankStatus::Exited(126));
                return;
            }
        };
        match self.spawn(&task) {
            Ok(spawned) => {
                let pid = spawned.pid();
                if let Err(e) = self.table.set_running(slot, pid) {
                    eprintln!("storm-pl: {e}");
                }
                let StartTask { spec, stderr, .. } = task;
                self.running.insert(
                    pid,
                    Running {
                        slot,
                        spawned,
                        starting: Some(Starting {
                            deadline: Instant::now() + self.start_timeout,
                            stderr,
                            spec,
                            killed: false,
                        }),
                    },
                );
            }
            Err((message, code)) => {
                // The task's standard error, where the user reads it.
                let mut err = std::fs::File::from(task.stderr);
                let _ = writeln!(err, "storm-pl: rank {}: {message}", task.spec.rank);
                self.end(slot, RankStatus::Exited(code));
            }
        }
        // The launcher's copies of the task's other descriptors close here (its standard
        // error once its process has reached its program): the NM then sees the task's
        // output end when the task's own copies close.
    }

    /// Looks at the tasks' processes not known to have reached their program: one that has
    /// is let go of (its standard error closed here); one past the deadline is killed. The
    /// time until the next deadline, if one is pending.
    fn check_starts(&mut self, now: Instant) -> Option<Duration> {
        let mut next: Option<Instant> = None;
        for (&pid, r) in self.running.iter_mut() {
            let Some(s) = &mut r.starting else {
                continue;
            };
            if s.killed {
                continue;
            }
            if !r.spawned.exec_pending() {
                // Executed (or exited, which the reaping tells).
                if r.spawned.failure().is_none() {
                    r.starting = None;
                }
                continue;
            }
            if now >= s.deadline {
                // SAFETY: kill on our own child, not reaped yet (its pid is still ours).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                s.killed = true;
                continue;
            }
            next = Some(next.map_or(s.deadline, |n| n.min(s.deadline)));
        }
        next.map(|at| at.saturating_duration_since(now))
    }

    /// Starts the task's process; why not as (message, exit code), as a shell would report.
    fn spawn(&mut self, task: &StartTask) -> Result<Spawned, (String, i32)> {
        let spec = &task.spec;
        let node = spec.node;
        let root = self.uid == 0;
        if !root && spec.uid != self.uid {
            return Err((
                format!(
                    "storm-nm on node {node} runs as uid {} and cannot start a task as uid {}",
                    self.uid, spec.uid
                ),
                126,
            ));
        }
        let user = (root && spec.uid != 0).then(|| User {
            uid: spec.uid,
            gid: spec.gid,
            groups: self.groups_of(spec.uid, spec.gid),
        });
        let mut fds = vec![
            (task.stdin.as_ref().unwrap_or(&self.null).as_raw_fd(), STDIN),
            (task.stdout.as_raw_fd(), STDOUT),
            (task.stderr.as_raw_fd(), STDERR),
        ];
        fds.extend(task.pmi.as_ref().map(|fd| (fd.as_raw_fd(), PMI_FD)));
        // Root's files under /sys/fs/cgroup, numbered above every descriptor the child
        // places (which would overwrite them), closed once the clone has its copies.
        let cgroups = spec
            .cgroups
            .iter()
            .map(|p| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .and_then(|f| above(OwnedFd::from(f)))
                    .map_err(|e| {
                        (
                            format!("cannot join the job's cgroup {}: {e}", p.display()),
                            126,
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let image = TaskImage::new(
            spec,
            user,
            fds,
            cgroups.iter().map(AsRawFd::as_raw_fd).collect(),
        )
        .map_err(|e| {
            (
                format!(
                    "cannot execute {} on node {node}: {e}",
                    spec.program.display()
                ),
                126,
            )
        })?;
        spawn::spawn(image).map_err(|e| failure(spec, e))
    }

    /// The user's groups, as `initgroups` would set them, looked up at most once a minute.
    fn groups_of(&mut self, uid: libc::uid_t, gid: libc::gid_t) -> Vec<libc::gid_t> {
        if let Some((at, groups)) = self.groups.get(&(uid, gid))
            && at.elapsed() < GROUPS_TTL
        {
            return groups.clone();
        }
        let groups = storm_cluster::daemon::user_groups(uid, gid);
        self.groups
            .insert((uid, gid), (Instant::now(), groups.clone()));
        groups
    }

    /// Writes the status of every task that ended.
    fn reap(&mut self) {
        loop {
            let mut raw = 0;
            // SAFETY: waitpid for any child, with a valid pointer.
            let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            let Some(r) = self.running.remove(&pid) else {
                continue;
            };
            let mut status = if libc::WIFSIGNALED(raw) {
                RankStatus::Signaled(libc::WTERMSIG(raw))
            } else {
                RankStatus::Exited(libc::WEXITSTATUS(raw))
            };
            if let Some(s) = r.starting {
                // It never reached its program: say why, where its user reads it.
                let why = match r.spawned.failure() {
                    Some(e) => Some(failure(&s.spec, e)),
                    None if s.killed => Some((
                        format!(
                            "did not reach its program within {} ms of its start (its process \
                             was stopped or stuck before exec); killed ([failure] \
                             task_start_timeout_ms)",
                            self.start_timeout.as_millis()
                        ),
                        126,
                    )),
                    None => None,
                };
                if let Some((message, code)) = why {
                    let mut err = std::fs::File::from(s.stderr);
                    let _ = writeln!(err, "storm-pl: rank {}: {message}", s.spec.rank);
                    status = RankStatus::Exited(code);
                }
            }
            self.end(r.slot, status);
        }
    }
}

/// The message and exit code for a task that did not reach its program.
fn failure(spec: &PlSpec, e: SpawnError) -> (String, i32) {
    let node = spec.node;
    let io = e.io();
    match e.step {
        Step::Directory => (
            format!(
                "cannot use working directory {} on node {node}: {io}",
                spec.cwd.display()
            ),
            127,
        ),
        Step::Exec => (
            format!(
                "cannot execute {} on node {node}: {io}",
                spec.program.display()
            ),
            if e.errno == libc::ENOENT { 127 } else { 126 },
        ),
        Step::User => (
            format!("cannot become uid {} on node {node}: {io}", spec.uid),
            126,
        ),
        Step::Cgroup => (
            format!("cannot join the job's cgroup on node {node}: {io}"),
            126,
        ),
        Step::Affinity => (
            format!(
                "cannot bind to CPUs {} on node {node} (--cpu-bind): {io}",
                spec.env
                    .iter()
                    .rev()
                    .find(|(k, _)| k == storm_cluster::cpu_bind::LIST_VAR)
                    .map_or("?".into(), |(_, v)| v.to_string_lossy())
            ),
            126,
        ),
        Step::OutputFile | Step::ErrorFile => {
            let (what, path) = match e.step {
                Step::OutputFile => ("output", &spec.output_file),
                _ => ("error", &spec.error_file),
            };
            let path = path.as_deref().unwrap_or(std::path::Path::new("?"));
            (
                format!(
                    "cannot open the {what} file {} on node {node} as uid {}: {io}",
                    spec.cwd.join(path).display(),
                    spec.uid
                ),
                127,
            )
        }
        step => (
            format!("cannot start the task on node {node} ({step:?}): {io}"),
            126,
        ),
    }
}

/// The task with each of its descriptors above every number a task gets.
fn above_targets(task: StartTask) -> std::io::Result<StartTask> {
    Ok(StartTask {
        stdout: above(task.stdout)?,
        stderr: above(task.stderr)?,
        stdin: task.stdin.map(above).transpose()?,
        pmi: task.pmi.map(above).transpose()?,
        spec: task.spec,
    })
}

/// `fd`, or a copy of it numbered 10 or above, closed on exec: above every descriptor number
/// a task gets, so that placing one can never overwrite another still to be placed.
fn above(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    if fd.as_raw_fd() > PMI_FD {
        return Ok(fd);
    }
    // SAFETY: fcntl duplicates a descriptor we hold; the copy is ours.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if copy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}
