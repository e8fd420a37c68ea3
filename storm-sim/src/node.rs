//! A simulated node: the node manager's own core ([`storm_nm::NodeManager`]) over the local
//! backend, in an environment whose tasks use virtual time instead of processes.
//!
//! A simulated task needs `work` of virtual CPU time (the job's first argument, in
//! milliseconds) and exits 0 when it has had it. It runs while the NM lets it (launched and,
//! under gang scheduling, continued at its time slot; a halt stops it, as SIGSTOP would). A
//! signal ends it at once (`Signaled(n)`), except SIGTERM for a job whose second argument is
//! `ignore-sigterm`. What the daemon does with processes, files and pipes (storm-pl, the
//! spool, output forwarding, PMI) is what this environment leaves out: program transfers are
//! modelled on the MM's side ([`crate::env`]), tasks write no output and speak no PMI.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use storm_cluster::clock::Clock;
use storm_cluster::messages::{Command, FileInfo, HeldJob, JobId, MpiMode, RankStatus, Stream};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_nm::env::{
    OutputForwarder, PmiServer, Spool, StartedTask, SwitchRecord, TaskId, TaskRunner, TaskStart,
};
use storm_nm::membership::Identity;
use storm_nm::output::Drained;
use storm_nm::pmi::JobFacts;
use storm_nm::{JobState, NmEnv, NmParts, NodeManager, Stepped};
use storm_primitives::{NodeId, Primitives};

/// The argument that makes a simulated task ignore SIGTERM.
pub const IGNORE_SIGTERM: &str = "ignore-sigterm";

/// How many messages a node takes in one step at most (it takes all that arrived).
const MESSAGES_PER_STEP: usize = 1024;

/// A heartbeat as a node took it.
#[derive(Debug, Clone)]
pub struct Heard {
    pub seq: u64,
    pub at: Instant,
    pub commands: Vec<Command>,
}

pub struct SimNode {
    core: NodeManager<SimNodeEnv>,
    frozen: bool,
}

impl SimNode {
    pub fn new(
        cfg: &Arc<ClusterConfig>,
        rm: &RmLayout,
        id: NodeId,
        prims: Arc<dyn Primitives>,
        clock: Arc<dyn Clock>,
        record: bool,
    ) -> Self {
        let identity = Identity {
            clock: clock.clone(),
            pid: 1000 + id,
            started_ms: clock.unix_ms(),
        };
        let env = SimNodeEnv {
            origin: clock.now(),
            tasks: SimTasks {
                tasks: HashMap::new(),
                next: 1,
                last: clock.now(),
            },
            clock,
            none: NoFiles,
            record,
            heard: Vec::new(),
        };
        let parts = NmParts {
            config: Arc::clone(cfg),
            rm: rm.clone(),
            node: id,
            fabric: prims,
            identity,
            report_wait: Duration::ZERO,
            pmi_library: PathBuf::new(),
        };
        Self {
            core: NodeManager::new(parts, env),
            frozen: false,
        }
    }

    /// Stops (or continues) the node manager, as SIGSTOP would: it takes no heartbeat and
    /// sends nothing while frozen; its tasks go on running.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// The jobs this node holds, and whether each has ended here.
    pub fn jobs(&self) -> Vec<(JobId, bool)> {
        self.core
            .held_jobs()
            .into_iter()
            .map(|HeldJob { job, ended, .. }| (job, ended))
            .collect()
    }

    /// Whether job `job`'s tasks run here now.
    pub fn running(&self, job: JobId) -> bool {
        self.job_state(job) == Some(JobState::Running)
    }

    /// Where job `job` stands on this node, as its NM sees it.
    pub fn job_state(&self, job: JobId) -> Option<JobState> {
        self.core.job_state(job)
    }

    /// Every heartbeat this node took, if the simulation records them.
    pub fn heard(&self) -> &[Heard] {
        &self.core.env().heard
    }

    /// One step at the clock's time: the tasks progress, and the NM takes everything that
    /// arrived, carries it out, and reports jobs whose tasks here have all ended.
    pub fn step(&mut self) {
        let env = self.core.env_mut();
        let now = env.clock.now();
        env.tasks.advance(now);
        if self.frozen {
            return;
        }
        for _ in 0..MESSAGES_PER_STEP {
            match self.core.step(Duration::ZERO) {
                Ok(Stepped::Message) => {}
                Ok(Stepped::Idle) | Err(_) => break,
            }
        }
    }
}

/// The simulated node's environment.
pub struct SimNodeEnv {
    clock: Arc<dyn Clock>,
    origin: Instant,
    tasks: SimTasks,
    none: NoFiles,
    record: bool,
    heard: Vec<Heard>,
}

impl NmEnv for SimNodeEnv {
    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    fn tasks(&mut self) -> &mut dyn TaskRunner {
        &mut self.tasks
    }

    fn spool(&mut self) -> &mut dyn Spool {
        &mut self.none
    }

    fn output(&mut self) -> &mut dyn OutputForwarder {
        &mut self.none
    }

    fn pmi(&mut self) -> &mut dyn PmiServer {
        &mut self.none
    }

    fn heard(&mut self, seq: u64, _received_ns: u128, commands: &[Command]) {
        if self.record {
            self.heard.push(Heard {
                seq,
                at: self.clock.now(),
                commands: commands.to_vec(),
            });
        }
    }

    fn switched(&mut self, _switch: &SwitchRecord) {}

    fn stamp_ns(&self) -> u128 {
        self.clock.now().duration_since(self.origin).as_nanos()
    }
}

struct SimTask {
    /// Virtual CPU time the task still needs.
    left: Duration,
    ignore_term: bool,
    halted: bool,
    status: Option<RankStatus>,
}

/// Tasks that run in virtual time.
struct SimTasks {
    tasks: HashMap<TaskId, SimTask>,
    next: TaskId,
    /// When the tasks last progressed.
    last: Instant,
}

impl SimTasks {
    /// Every task that may run has run from the last advance until `now`.
    fn advance(&mut self, now: Instant) {
        let ran = now.saturating_duration_since(self.last);
        self.last = now;
        for t in self
            .tasks
            .values_mut()
            .filter(|t| t.status.is_none() && !t.halted)
        {
            t.left = t.left.saturating_sub(ran);
            if t.left.is_zero() {
                t.status = Some(RankStatus::Exited(0));
            }
        }
    }
}

impl TaskRunner for SimTasks {
    fn start(&mut self, task: TaskStart<'_>) -> Result<StartedTask, String> {
        let left = task
            .args
            .first()
            .and_then(|a| a.parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        let id = self.next;
        self.next += 1;
        self.tasks.insert(
            id,
            SimTask {
                left,
                ignore_term: task.args.iter().any(|a| a == IGNORE_SIGTERM),
                halted: false,
                status: None,
            },
        );
        Ok(StartedTask {
            id,
            output: Vec::new(),
        })
    }

    fn halt(&mut self, task: TaskId) -> bool {
        if let Some(t) = self.tasks.get_mut(&task) {
            t.halted = true;
        }
        true
    }

    fn resume(&mut self, task: TaskId) {
        if let Some(t) = self.tasks.get_mut(&task) {
            t.halted = false;
        }
    }

    fn signal(&mut self, task: TaskId, signal: i32) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        if t.status.is_none() && !(signal == libc::SIGTERM && t.ignore_term) {
            t.status = Some(RankStatus::Signaled(signal));
        }
    }

    fn status(&mut self, task: TaskId) -> Option<RankStatus> {
        self.tasks.get(&task).and_then(|t| t.status)
    }

    fn wait_stopped(&mut self, _tasks: &[TaskId], _wait: Duration) -> bool {
        // A halted simulated task stops at once.
        true
    }

    fn release(&mut self, task: TaskId) {
        self.tasks.remove(&task);
    }

    fn poll(&mut self) {}
}

/// What the simulated node has no use for: a spool (transfers are modelled by the MM's
/// environment), output (tasks write none) and PMI (tasks speak none).
struct NoFiles;

impl Spool for NoFiles {
    fn job_dir(&self, job: JobId) -> PathBuf {
        PathBuf::from(format!("/storm-sim/job-{job}"))
    }

    fn receive(&mut self, _info: FileInfo, _path: PathBuf) {}

    fn cancel(&mut self, _job: JobId) {}

    fn stop_all(&mut self) {}

    fn remove(&mut self, _job: JobId) {}
}

impl OutputForwarder for NoFiles {
    fn watch(&mut self, _: JobId, _: u32, _: Stream, _: OwnedFd, remaining: Drained) {
        remaining.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn tell(&mut self, job: JobId, rank: u32, text: &str, _remaining: &Drained) {
        tracing::info!(job, rank, "to the user: {}", text.trim_end());
    }

    fn close_job(&mut self, _job: JobId) {}

    fn hold(&mut self) {}

    fn new_epoch(&mut self, _epoch: u32) {}

    fn flushed(&self, _epoch: u32) -> bool {
        true
    }

    fn stalled(&self) -> bool {
        false
    }

    fn backlogged(&self) -> bool {
        false
    }
}

impl PmiServer for NoFiles {
    fn start_job(
        &mut self,
        _slot: usize,
        _mode: MpiMode,
        _facts: JobFacts,
        ranks: &[u32],
    ) -> Result<Vec<Option<OwnedFd>>, String> {
        // Simulated tasks speak no PMI: they get no socket.
        Ok(ranks.iter().map(|_| None).collect())
    }

    fn remove_job(&mut self, _job: JobId) {}

    fn resend(&mut self) {}
}
