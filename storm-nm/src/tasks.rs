//! The daemon's [`TaskRunner`]: one program launcher (storm-pl) per task, the NM-PL
//! shared-memory table, process groups and /proc.
//!
//! A launcher writes its task's pid and then its exit status into its table slot; the NM
//! reads the slot on every pass. Waiting on the launchers themselves (to reap them, and to
//! notice one that died without writing a status) is less eager than the heartbeat, which
//! saves a syscall per task per heartbeat.

use crate::launch::PlProcess;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use storm_cluster::messages::{RankStatus, Stream};
use storm_pl::{Hold, PlSpec, PlTable};
use storm_primitives::NodeId;

use crate::env::{StartedTask, TaskId, TaskRunner, TaskStart, TaskTimes};
use crate::launch::start_pl;
use crate::output::OutputSource;
use crate::procstat::TaskStates;

/// How often the launchers are waited on (see the module's overview).
const LAUNCHER_CHECK: Duration = Duration::from_millis(10);

struct PlTask {
    slot: usize,
    pl: Option<PlProcess>,
    /// The status made up for a launcher that exited without writing one.
    lost: Option<RankStatus>,
}

/// A launcher to reap, and the table slot to free once it is gone (a launcher killed with its
/// job may still write the slot until it exits).
struct Zombie {
    pl: PlProcess,
    slot: Option<usize>,
}

pub struct PlRunner {
    node: NodeId,
    pl_path: PathBuf,
    table: PlTable,
    tasks: HashMap<TaskId, PlTask>,
    next_id: TaskId,
    zombies: Vec<Zombie>,
    /// Open /proc stat files of the tasks gang scheduling stops.
    states: TaskStates,
    next_check: Instant,
}

impl PlRunner {
    /// A runner with room for `slots` tasks at once.
    pub fn new(node: NodeId, pl_path: PathBuf, slots: usize) -> Result<Self, storm_pl::TableError> {
        Ok(Self {
            node,
            pl_path,
            table: PlTable::create(slots)?,
            tasks: HashMap::new(),
            next_id: 1,
            zombies: Vec::new(),
            states: TaskStates::default(),
            next_check: Instant::now(),
        })
    }

    fn pid(&self, slot: usize) -> Option<i32> {
        self.table.pid(slot).ok().flatten()
    }
}

impl TaskRunner for PlRunner {
    fn start(&mut self, task: TaskStart<'_>) -> Result<StartedTask, String> {
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
        };
        match start_pl(&self.pl_path, &self.table, &spec, task.pmi) {
            Ok(started) => {
                let id = self.next_id;
                self.next_id += 1;
                self.tasks.insert(
                    id,
                    PlTask {
                        slot,
                        pl: Some(started.child),
                        lost: None,
                    },
                );
                Ok(StartedTask {
                    id,
                    output: vec![
                        (
                            Stream::Stdout,
                            Box::new(started.stdout) as Box<dyn OutputSource>,
                        ),
                        (Stream::Stderr, Box::new(started.stderr)),
                    ],
                })
            }
            Err(e) => {
                let _ = self.table.release(slot);
                Err(format!(
                    "cannot start storm-pl ({}): {e}",
                    self.pl_path.display()
                ))
            }
        }
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
            }
        }
    }

    fn signal(&mut self, task: TaskId, signal: i32) {
        let Some(t) = self.tasks.get(&task) else {
            return;
        };
        match (self.pid(t.slot), Signal::try_from(signal)) {
            (Some(pid), Ok(sig)) => {
                let _ = killpg(Pid::from_raw(pid), sig);
            }
            (None, _) => {
                // The task has not started yet: stop its launcher, so it never does.
                if let Some(pl) = &t.pl {
                    let _ = kill(Pid::from_raw(pl.id() as i32), Signal::SIGKILL);
                }
            }
            (Some(_), Err(_)) => tracing::warn!(signal, "not a signal"),
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
        if let Some(pid) = self.pid(t.slot) {
            self.states.forget(pid);
        }
        // A launcher that wrote its task's status no longer writes the slot.
        let written = self.table.status(t.slot).ok().flatten().is_some();
        let slot = match written || t.pl.is_none() {
            true => {
                let _ = self.table.release(t.slot);
                None
            }
            false => Some(t.slot),
        };
        match t.pl {
            Some(pl) => self.zombies.push(Zombie { pl, slot }),
            None => {
                if let Some(slot) = slot {
                    let _ = self.table.release(slot);
                }
            }
        }
    }

    fn poll(&mut self) {
        if self.next_check > Instant::now() {
            return;
        }
        self.next_check = Instant::now() + LAUNCHER_CHECK;
        let table = &self.table;
        self.zombies.retain_mut(|z| {
            let gone = matches!(z.pl.try_wait(), Ok(Some(_)) | Err(_));
            if gone && let Some(slot) = z.slot {
                let _ = table.release(slot);
            }
            !gone
        });
        for t in self.tasks.values_mut().filter(|t| t.lost.is_none()) {
            let Some(pl) = t.pl.as_mut() else {
                continue;
            };
            let Ok(Some(exit)) = pl.try_wait() else {
                continue;
            };
            t.pl = None;
            if table.status(t.slot).ok().flatten().is_some() {
                continue;
            }
            // The launcher is gone without a status: make one up from its own end, and make
            // sure nothing it started lives on.
            if let Some(pid) = table.pid(t.slot).ok().flatten() {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            use std::os::unix::process::ExitStatusExt;
            t.lost = Some(match (exit.code(), exit.signal()) {
                (_, Some(sig)) => RankStatus::Signaled(sig),
                (Some(c), _) => RankStatus::Exited(c),
                _ => RankStatus::Exited(1),
            });
        }
    }
}
