//! The daemon's [`TaskRunner`]: the node's program launcher (storm-pl), the NM-PL
//! shared-memory table, process groups and /proc.
//!
//! The launcher writes each task's pid and then its exit status into the task's table slot;
//! the NM reads the slot on every pass. Whether the launcher itself still lives is checked
//! less eagerly than the heartbeat, which saves a system call per heartbeat. A launcher that
//! died (it should not) takes its tasks with it: they are reported killed, and a new launcher
//! serves the node's next tasks.
//!
//! Requests to the launcher never block the NM (a [`storm_pl::request::Outbox`]). A launcher
//! that leaves a request unanswered for `[failure] launcher_timeout_ms` (stopped, or starved)
//! is killed and handled as one that died: one stuck launcher costs its node's tasks, never
//! the NM's heartbeats.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use storm_cluster::messages::{JobId, JobUsage, RankStatus, Stream};
use storm_pl::{Cancel, Hold, PlSpec, PlTable, SlotState};
use storm_primitives::NodeId;

use crate::cgroup::Cgroups;
use crate::env::{StartedTask, TaskId, TaskRunner, TaskStart, TaskTimes};
use crate::launch::{PlProcess, pipe, start_launcher};
use crate::output::OutputSource;
use crate::procstat::TaskStates;

/// How often the launcher, and the slots and signals that wait for it, are looked at.
const LAUNCHER_CHECK: Duration = Duration::from_millis(10);

struct PlTask {
    slot: usize,
    /// The status made up for a task whose launcher died before writing one.
    lost: Option<RankStatus>,
    /// Since when the launcher owes this task an answer (to start it, or to end it as
    /// cancelled), if it does.
    owed: Option<Instant>,
}

/// The running launcher and the NM's end of its link.
struct Launcher {
    process: PlProcess,
    outbox: storm_pl::request::Outbox,
    /// Killed as stuck; gone once reaped.
    killed: bool,
}

pub struct PlRunner {
    node: NodeId,
    pl_path: PathBuf,
    table: PlTable,
    /// None once the launcher died, until the next task needs one.
    launcher: Option<Launcher>,
    tasks: HashMap<TaskId, PlTask>,
    next_id: TaskId,
    /// Slots of released tasks the launcher may still write (their task is being killed).
    draining: Vec<usize>,
    /// Signals sent while the launcher was starting the task: delivered once it runs.
    pending: Vec<(TaskId, Signal)>,
    /// Open /proc stat files of the tasks gang scheduling stops.
    states: TaskStates,
    next_check: Instant,
    /// How long the launcher may owe a task an answer before it counts as stuck.
    stuck_after: Duration,
    /// How long a task's process may take to reach its exec (the launcher's deadline).
    start_timeout: Duration,
    /// The jobs' cgroups.
    cgroups: Cgroups,
}

impl PlRunner {
    /// A runner with room for `slots` tasks at once, and its launcher started; a launcher
    /// that owes a task an answer for `stuck_after` is killed as stuck.
    pub fn new(
        node: NodeId,
        pl_path: PathBuf,
        slots: usize,
        stuck_after: Duration,
        start_timeout: Duration,
        cgroups: Cgroups,
    ) -> anyhow::Result<Self> {
        let mut runner = Self {
            node,
            pl_path,
            table: PlTable::create(slots)?,
            launcher: None,
            tasks: HashMap::new(),
            next_id: 1,
            draining: Vec::new(),
            pending: Vec::new(),
            states: TaskStates::default(),
            next_check: Instant::now(),
            stuck_after,
            start_timeout,
            cgroups,
        };
        runner.launcher().map_err(anyhow::Error::msg)?;
        Ok(runner)
    }

    fn pid(&self, slot: usize) -> Option<i32> {
        self.table.pid(slot).ok().flatten()
    }

    /// The launcher, starting one if there is none.
    /// Puts the launcher under SCHED_FIFO at `priority`: a warm guest's, started before its
    /// NM took real-time priority (as its node was lent).
    pub fn raise_launcher(&self, priority: u8) {
        if let Some(l) = &self.launcher
            && let Err(e) =
                storm_cluster::daemon::set_rt_priority_of(l.process.id(), priority, false)
        {
            tracing::warn!(
                node = self.node,
                "the launcher stays under the normal policy: {e}"
            );
        }
    }

    /// Runs the jobs from now on in `cgroups`: a warm guest's, made once it may own its
    /// groups (docs/federation.md, warm guests). No task has run before.
    pub fn use_cgroups(&mut self, cgroups: Cgroups) {
        debug_assert!(self.tasks.is_empty(), "groups change under running tasks");
        self.cgroups = cgroups;
    }

    fn launcher(&mut self) -> Result<&mut Launcher, String> {
        if self.launcher.is_none() {
            let (process, outbox) = start_launcher(&self.pl_path, &self.table, self.start_timeout)
                .map_err(|e| format!("cannot start storm-pl ({}): {e}", self.pl_path.display()))?;
            tracing::debug!(node = self.node, pid = process.id(), "launcher started");
            self.launcher = Some(Launcher {
                process,
                outbox,
                killed: false,
            });
        }
        Ok(self.launcher.as_mut().expect("just started"))
    }

    /// Tells the launcher to look at the requests it keeps again; it then owes `task` an
    /// answer.
    fn look(&mut self, task: TaskId) {
        if let Some(t) = self.tasks.get_mut(&task) {
            t.owed = Some(Instant::now());
        }
        if let Some(l) = &mut self.launcher
            && let Err(e) = l.outbox.look()
        {
            tracing::warn!(node = self.node, "telling the launcher to look again: {e}");
        }
    }

    /// Whether the launcher has owed some task an answer for longer than `stuck_after`.
    /// Answers given since are noted here.
    ///
    /// A launcher in the middle of starting a task counts too: it is there only for the
    /// clone (the task's process then goes on alone, and no user can hold the launcher by
    /// stopping it), so one found there for `stuck_after` was stopped or starved itself.
    fn launcher_stuck(&mut self) -> bool {
        let now = Instant::now();
        let mut overdue = false;
        for t in self.tasks.values_mut() {
            let Some(since) = t.owed else {
                continue;
            };
            match self.table.state(t.slot) {
                Ok(SlotState::Starting | SlotState::Cancelled | SlotState::Spawning) => {
                    overdue |= now.duration_since(since) > self.stuck_after;
                }
                // Started, ended, or held by the NM: nothing owed.
                _ => t.owed = None,
            }
        }
        overdue
    }

    /// Whether the launcher died; if so, its tasks are reported killed (they died with it:
    /// any left in their process groups are killed here), and the slots it held are freed.
    fn launcher_died(&mut self) -> bool {
        let Some(l) = self.launcher.as_mut() else {
            return false;
        };
        let exit = match l.process.try_wait() {
            Ok(None) => return false,
            Ok(Some(exit)) => format!("{exit}"),
            Err(e) => format!("cannot be waited for: {e}"),
        };
        tracing::error!(
            node = self.node,
            "the launcher storm-pl ended ({exit}); its tasks are lost"
        );
        self.launcher = None;
        for t in self.tasks.values_mut() {
            t.owed = None;
            if self.table.is_settled(t.slot).unwrap_or(true) || t.lost.is_some() {
                continue;
            }
            if let Some(pid) = self.table.pid(t.slot).ok().flatten() {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            t.lost = Some(RankStatus::Signaled(libc::SIGKILL));
        }
        for slot in self.draining.drain(..) {
            let _ = self.table.release(slot);
        }
        self.pending.clear();
        true
    }
}

/// The first `libmpi` shared object in a memory map as `/proc/PID/maps` lists it.
fn mpi_library_in(maps: &str) -> Option<String> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            std::path::Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libmpi") && n.contains(".so"))
        })
        .map(str::to_string)
}

impl TaskRunner for PlRunner {
    fn mpi_library(&mut self, task: TaskId) -> Option<String> {
        let t = self.tasks.get(&task).filter(|t| t.lost.is_none())?;
        let pid = self.table.pid(t.slot).ok().flatten()?;
        // The kernel's file: no path of the user's is followed.
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        mpi_library_in(&maps)
    }

    fn start(&mut self, task: TaskStart<'_>) -> Result<StartedTask, String> {
        let prepared = self.cgroups.prepare(task.job, task.mem)?;
        let cgroups = prepared.procs;
        let Some(slot) = self.table.claim() else {
            return Err("too many tasks on this node".into());
        };
        let spec = PlSpec {
            job: task.job,
            rank: task.rank,
            node: self.node,
            slot: slot as u32,
            program: task.program.to_path_buf(),
            args: task.args.to_vec(),
            env: task.env,
            cwd: task.cwd.to_path_buf(),
            uid: task.uid,
            gid: task.gid,
            cgroups,
            output_file: task.output_file,
            error_file: task.error_file,
            stdin: task.stdin,
        };
        let pipes = pipe().and_then(|out| Ok((out, pipe()?)));
        let ((stdout, out_w), (stderr, err_w)) = match pipes {
            Ok(p) => p,
            Err(e) => {
                let _ = self.table.release(slot);
                return Err(format!("cannot make the task's output pipes: {e}"));
            }
        };
        // The task's standard input: it reads one end, the output thread writes the other.
        let (stdin_r, stdin_w) = match task.stdin.then(pipe).transpose() {
            Ok(Some((r, w))) => (Some(r), Some(w)),
            Ok(None) => (None, None),
            Err(e) => {
                let _ = self.table.release(slot);
                return Err(format!("cannot make the task's input pipe: {e}"));
            }
        };
        let handed = task
            .pmi
            .map(|fd| fd.try_clone())
            .transpose()
            .map_err(|e| format!("cannot pass the task's PMI socket: {e}"))
            .and_then(|pmi| {
                let launcher = self.launcher()?;
                // A launcher whose end is gone died: the task is then reported with its
                // other tasks once it is reaped (see `launcher_died`).
                if let Err(e) = launcher.outbox.start(&spec, out_w, err_w, stdin_r, pmi) {
                    tracing::warn!(node = self.node, "handing a task to the launcher: {e}");
                }
                Ok(())
            });
        if let Err(e) = handed {
            let _ = self.table.release(slot);
            return Err(e);
        }
        let id = self.next_id;
        self.next_id += 1;
        let owed = Some(Instant::now());
        self.tasks.insert(
            id,
            PlTask {
                slot,
                lost: None,
                owed,
            },
        );
        Ok(StartedTask {
            id,
            output: vec![
                (Stream::Stdout, Box::new(stdout) as Box<dyn OutputSource>),
                (Stream::Stderr, Box::new(stderr)),
            ],
            input: stdin_w,
            notice: prepared.unenforced,
        })
    }

    fn halt(&mut self, task: TaskId) -> bool {
        let Some(t) = self.tasks.get(&task) else {
            return true;
        };
        match self.table.hold(t.slot) {
            Ok(Hold::Running(pid)) => {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGSTOP);
                true
            }
            Ok(Hold::Spawning) => false,
            Ok(Hold::Held | Hold::Ended) | Err(_) => true,
        }
    }

    fn resume(&mut self, task: TaskId) {
        let Some(t) = self.tasks.get(&task) else {
            return;
        };
        match self.pid(t.slot) {
            Some(pid) => {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGCONT);
            }
            None => {
                let _ = self.table.unhold(t.slot);
                self.look(task);
            }
        }
    }

    fn signal(&mut self, task: TaskId, signal: i32) {
        let Some(t) = self.tasks.get(&task) else {
            return;
        };
        let Ok(sig) = Signal::try_from(signal) else {
            tracing::warn!(signal, "not a signal");
            return;
        };
        // A task that ran has a process group, which may outlive it: signal the group.
        if let Some(pid) = self.pid(t.slot) {
            let _ = killpg(Pid::from_raw(pid), sig);
            return;
        }
        match self.table.cancel(t.slot, signal) {
            Ok(Cancel::Cancelled) => self.look(task),
            Ok(Cancel::Running(pid)) => {
                let _ = killpg(Pid::from_raw(pid), sig);
            }
            Ok(Cancel::Spawning) => self.pending.push((task, sig)),
            Ok(Cancel::Ended) | Err(_) => {}
        }
    }

    fn status(&mut self, task: TaskId) -> Option<RankStatus> {
        let t = self.tasks.get(&task)?;
        self.table.status(t.slot).ok().flatten().or(t.lost)
    }

    fn times(&mut self, task: TaskId) -> TaskTimes {
        let Some(t) = self.tasks.get(&task) else {
            return TaskTimes::default();
        };
        let (started_ns, exited_ns) = self.table.times(t.slot).unwrap_or_default();
        TaskTimes {
            started_ns,
            exited_ns,
        }
    }

    fn wait_stopped(&mut self, tasks: &[TaskId], wait: Duration) -> bool {
        let pids: Vec<i32> = tasks
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .filter_map(|t| self.pid(t.slot))
            .collect();
        self.states.wait_until_stopped(&pids, wait)
    }

    fn release(&mut self, task: TaskId) {
        let Some(t) = self.tasks.remove(&task) else {
            return;
        };
        self.pending.retain(|(id, _)| *id != task);
        if let Some(pid) = self.pid(t.slot) {
            self.states.forget(pid);
        }
        // The launcher writes a slot until it wrote EXITED; a dead one writes nothing.
        if t.lost.is_some() || self.table.is_settled(t.slot).unwrap_or(true) {
            let _ = self.table.release(t.slot);
        } else {
            self.draining.push(t.slot);
        }
    }

    fn end_job(&mut self, job: JobId) -> JobUsage {
        self.cgroups.end_job(job)
    }

    fn poll(&mut self) {
        if let Some(l) = &mut self.launcher
            && let Err(e) = l.outbox.flush()
        {
            tracing::debug!(node = self.node, "the launcher's link: {e}");
        }
        if self.next_check > Instant::now() {
            return;
        }
        self.next_check = Instant::now() + LAUNCHER_CHECK;
        if self.launcher_died() {
            return;
        }
        if self.launcher_stuck()
            && let Some(l) = &mut self.launcher
            && !l.killed
        {
            tracing::error!(
                node = self.node,
                pid = l.process.id(),
                "the launcher storm-pl took no request for {} ms (stopped or starved); it is \
                 killed and a new one serves the next tasks",
                self.stuck_after.as_millis()
            );
            l.process.kill();
            l.killed = true;
        }
        let table = &self.table;
        self.draining.retain(|&slot| {
            let settled = table.is_settled(slot).unwrap_or(true);
            if settled {
                let _ = table.release(slot);
            }
            !settled
        });
        let tasks = &self.tasks;
        self.pending.retain(|(id, sig)| {
            let Some(t) = tasks.get(id) else {
                return false;
            };
            match table.pid(t.slot).ok().flatten() {
                Some(pid) => {
                    let _ = killpg(Pid::from_raw(pid), *sig);
                    false
                }
                None => !table.is_settled(t.slot).unwrap_or(true),
            }
        });
    }
}
