//! The node manager's loop.
//!
//! Join the cluster (see [`crate::membership`]); block on the heartbeat queue (Algorithm 5);
//! carry out each heartbeat's commands for this node; then, on every heartbeat interval, look
//! at the NM-PL table for tasks that ended and, when all of a job's local tasks have ended and
//! their output is delivered, report their exit statuses to the MM and set `terminated[slot]`
//! (Algorithm 9). The job's last node also announces the termination to the MM.
//!
//! The tasks outlive the node's membership: when the NM registers again (it was cut off,
//! frozen, or the MM restarted) it keeps every job the MM still knows, and when the MM is a
//! new process, it reports again the jobs that ended (their reports were in the old MM's
//! memory) once their output has been sent again.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use storm_cluster::config::PolicyKind;
use storm_cluster::endpoint::{self, Listen};
use storm_cluster::messages::{
    Command, FileInfo, Heartbeat, HeldJob, JobId, LaunchSpec, MpiMode, Program, RankStatus, Stream,
    decode,
};
use storm_cluster::tasks::ranks_on;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_pl::{Hold, PlSpec, PlTable};
use storm_primitives::{NodeId, PrimError, Primitives};

use crate::launch::start_pl;
use crate::membership::{Event, Identity, Registration};
use crate::output::{Drained, Output, Watch};
use crate::pmi::{JobFacts, PmiService, process_mapping};
use crate::procstat::TaskStates;
use crate::receive;
use crate::report::Reporter;

/// How long after its tasks ended a job's output pipes may stay open (held by a process the
/// task left behind) before the NM stops reading them and reports the job.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// How often `poll_tasks` waits on the launchers (see there).
const LAUNCHER_CHECK: Duration = Duration::from_millis(10);

/// How long a gang switch waits, inside the heartbeat, for the old slot's tasks to stop
/// before it leaves the rest to the NM's loop (which looks again every millisecond).
const SWITCH_INLINE_WAIT: Duration = Duration::from_millis(5);
/// A switch whose old slot still has not stopped after this long is logged.
const SWITCH_WARN: Duration = Duration::from_millis(50);
/// A task that has not acted on SIGSTOP after this long is stuck in the kernel (a hung file
/// system): its pending SIGSTOP still stops it before it runs user code again, so the new
/// slot runs rather than wait for it indefinitely.
const SWITCH_GIVE_UP: Duration = Duration::from_secs(1);

/// A gang switch in progress: the old slot's jobs have been sent SIGSTOP; the new slot's are
/// continued once those have stopped.
struct Switch {
    /// The heartbeat whose schedule the switch carries out (the latest, if several came
    /// while it waited) and the one that began it.
    seq: u64,
    from: u64,
    received_ns: u128,
    since: Instant,
    stopped: Vec<JobId>,
    warned: bool,
}

/// How to start a node manager.
pub struct NmOptions {
    pub config: ClusterConfig,
    pub node: NodeId,
    pub listen: Listen,
    /// The storm-pl binary.
    pub pl_path: PathBuf,
    /// The PMI-1 client library for `--mpi openmpi` jobs (`libstorm_pmi.so`).
    pub pmi_library: PathBuf,
    /// Set to stop the NM (signal handlers set it).
    pub stop: Arc<AtomicBool>,
}

struct LocalRank {
    rank: u32,
    slot: Option<usize>,
    pl: Option<Child>,
    status: Option<RankStatus>,
    output: Drained,
    /// Gang scheduling has stopped the task's process group, or holds its launcher before
    /// the task starts.
    stopped: bool,
}

impl LocalRank {
    /// Makes the task not runnable: SIGSTOP to its process group, or a hold on its launcher
    /// if the task has not begun to start. False while the launcher is starting the task:
    /// there is no process to stop yet, so ask again shortly.
    fn halt(&mut self, table: &PlTable) -> bool {
        if self.stopped || self.status.is_some() {
            return true;
        }
        let Some(slot) = self.slot else {
            return true;
        };
        match table.hold(slot) {
            Ok(Hold::Held) => self.stopped = true,
            Ok(Hold::Running(pid)) => {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGSTOP);
                self.stopped = true;
            }
            Ok(Hold::Spawning) => return false,
            Ok(Hold::Ended) | Err(_) => {}
        }
        true
    }

    /// Lets a halted task run again: SIGCONT, or the launcher's hold released.
    fn resume(&mut self, table: &PlTable) {
        if self.status.is_some() {
            return;
        }
        if let Some(slot) = self.slot {
            match table.pid(slot) {
                Ok(Some(pid)) => {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGCONT);
                }
                _ => {
                    let _ = table.unhold(slot);
                }
            }
        }
        self.stopped = false;
    }
}

/// A launcher to reap, and the NM-PL table slot to free once it is gone (a launcher killed
/// with its job may still write the slot until it exits).
struct Zombie {
    pl: Child,
    slot: Option<usize>,
}

struct LocalJob {
    spec: LaunchSpec,
    ranks: Vec<LocalRank>,
    /// Out of its time slot: its tasks are kept stopped.
    suspended: bool,
    /// Signalled to end: it runs until it does, whatever the schedule.
    ending: bool,
    exited_at: Option<Instant>,
    output_closed: bool,
    reported: bool,
    /// Reported to another MM process: reported again to this one once the output that
    /// process may not have passed on has been sent again.
    report_again: bool,
}

impl LocalJob {
    /// A job as it starts on this node; `ending` for one whose tasks never start here.
    fn new(spec: LaunchSpec, ranks: Vec<LocalRank>, ending: bool) -> Self {
        Self {
            spec,
            ranks,
            suspended: false,
            ending,
            exited_at: None,
            output_closed: false,
            reported: false,
            report_again: false,
        }
    }
}

pub struct NodeManager {
    cfg: ClusterConfig,
    node: NodeId,
    mm: NodeId,
    rm: RmLayout,
    prims: Arc<dyn Primitives>,
    spool: PathBuf,
    pl_path: PathBuf,
    pmi_library: PathBuf,
    table: PlTable,
    output: Output,
    pmi: PmiService,
    jobs: BTreeMap<JobId, LocalJob>,
    receivers: BTreeMap<JobId, receive::Receiver>,
    /// PLs that reported (or were killed) and still have to be reaped.
    zombies: Vec<Zombie>,
    /// Jobs launched under gang scheduling whose time slot has not come yet.
    pending: BTreeMap<JobId, LaunchSpec>,
    /// The jobs the latest gang schedule runs.
    run: Vec<JobId>,
    /// A gang switch waiting for the old slot to stop.
    switch: Option<Switch>,
    /// Where applied schedules are recorded, if the cluster asks for it.
    switch_log: Option<std::io::LineWriter<std::fs::File>>,
    /// Where heartbeats are recorded as they are taken, if the cluster asks for it.
    heartbeat_log: Option<std::io::LineWriter<std::fs::File>>,
    /// Open /proc stat files of the tasks gang scheduling stops.
    task_states: TaskStates,
    /// When `poll_tasks` next waits on the launchers.
    next_launcher_check: Instant,
    /// The MM process (incarnation) and output queue epoch of the current membership.
    incarnation: Option<u64>,
    output_epoch: u32,
    stop: Arc<AtomicBool>,
}

impl NodeManager {
    pub fn start(opts: NmOptions) -> Result<Self> {
        let NmOptions {
            config: cfg,
            node,
            listen,
            pl_path,
            pmi_library,
            stop,
        } = opts;
        // First: without the key this daemon must not run at all.
        let key = cfg.load_key()?;
        let entry = cfg
            .nodes
            .get(node as usize)
            .with_context(|| format!("node {node} is not in the cluster file"))?
            .clone();
        if !pl_path.is_file() {
            bail!(
                "storm-pl not found at {} (set pl_path in the cluster file)",
                pl_path.display()
            );
        }
        std::fs::create_dir_all(&entry.spool).with_context(|| {
            format!(
                "cannot create the spool directory {}",
                entry.spool.display()
            )
        })?;
        let rm = RmLayout::new(&cfg)?;
        let prims = endpoint::start(&cfg, &rm, node, listen, key).map_err(anyhow::Error::msg)?;
        let table = PlTable::create(cfg.cluster.max_tasks_per_node * cfg.cluster.max_jobs)?;
        let mm = cfg.mm_id();
        // Sends from the first welcome on, at that membership's output queue epoch.
        let output = Output::start(prims.clone(), &rm, node, mm)?;
        let pmi = PmiService::start(
            prims.clone(),
            &rm,
            node,
            mm,
            Duration::from_millis(cfg.tcp.op_timeout_ms * 2),
        )?;
        let log = |enabled: bool, name: &str| -> Result<_> {
            if !enabled {
                return Ok(None);
            }
            let path = entry.spool.join(name);
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            Ok(Some(std::io::LineWriter::new(f)))
        };
        let switch_log = log(cfg.scheduler.switch_log, "switches.log")?;
        let heartbeat_log = log(cfg.scheduler.heartbeat_log, "heartbeats.log")?;
        tracing::info!(node, name = %entry.name, spool = %entry.spool.display(), "node manager started");
        Ok(Self {
            node,
            mm,
            rm,
            prims,
            spool: entry.spool,
            pl_path,
            pmi_library,
            table,
            output,
            pmi,
            jobs: BTreeMap::new(),
            receivers: BTreeMap::new(),
            zombies: Vec::new(),
            switch_log,
            heartbeat_log,
            task_states: TaskStates::default(),
            next_launcher_check: Instant::now(),
            incarnation: None,
            output_epoch: 0,
            pending: BTreeMap::new(),
            run: Vec::new(),
            switch: None,
            stop,
            cfg,
        })
    }

    /// Runs until told to shut down (by a heartbeat or a signal).
    pub fn run(mut self) -> Result<()> {
        let mut membership = Registration::new(
            self.prims.clone(),
            self.rm.clone(),
            self.node,
            self.mm,
            Duration::from_millis(self.cfg.failure.rejoin_after_ms),
            Identity::this_process(),
        );
        let idle_wait =
            (self.cfg.timeslice() * 10).clamp(Duration::from_millis(1), Duration::from_millis(50));
        let mut shutdown = false;
        while !shutdown && !self.stop.load(Ordering::Acquire) {
            if membership.registering() {
                // Before a registration goes out: see `Output::hold`.
                self.output.hold();
            }
            // A switch waiting for tasks to stop is looked at again every millisecond.
            let wait = if self.switch.is_some() {
                Duration::from_millis(1)
            } else {
                idle_wait
            };
            let next = membership.next(wait, &|| self.held_jobs());
            match next {
                Ok(Event::Heartbeat(bytes)) => shutdown = self.heartbeat(&bytes),
                Ok(Event::Welcomed {
                    output_epoch,
                    incarnation,
                    keep,
                }) => self.new_membership(output_epoch, incarnation, &keep),
                Ok(Event::Idle) => {}
                Err(PrimError::ShutDown) => break,
                Err(e) => bail!("heartbeat queue: {e}"),
            }
            if self.output.stalled() {
                membership.rejoin("output could not be delivered to the MM");
            }
            self.finish_switch(Duration::ZERO);
            self.poll_tasks();
        }
        tracing::info!(node = self.node, "node manager stopping");
        for job in self.jobs.keys().copied().collect::<Vec<_>>() {
            self.signal_job(job, libc::SIGKILL);
        }
        Ok(())
    }

    /// Carries out one heartbeat; true if it says to shut down.
    fn heartbeat(&mut self, bytes: &Bytes) -> bool {
        let received_ns = storm_cluster::daemon::monotonic_ns();
        let hb: Heartbeat = match decode("heartbeat", bytes, self.cfg.cluster.heartbeat_bytes) {
            Ok(hb) => hb,
            Err(e) => {
                tracing::error!(node = self.node, "ignoring a heartbeat: {e}");
                return false;
            }
        };
        if let Some(log) = self.heartbeat_log.as_mut() {
            let _ = writeln!(log, "{} {received_ns}", hb.seq);
        }
        let mut shutdown = false;
        for cmd in hb.commands {
            if cmd.nodes().is_some_and(|n| !n.contains(self.node)) {
                continue;
            }
            match cmd {
                Command::ReceiveFile(info) => self.receive_file(info),
                Command::Launch(spec) => self.launch(spec),
                Command::Signal { job, signal } => self.signal_job(job, signal),
                Command::Forget { job } => self.forget(job),
                Command::Schedule { run } => self.apply_schedule(hb.seq, received_ns, &run),
                Command::Shutdown => shutdown = true,
            }
        }
        shutdown
    }

    /// The jobs this node holds, for its registration.
    fn held_jobs(&self) -> Vec<HeldJob> {
        let running = self.jobs.iter().map(|(&job, j)| HeldJob {
            job,
            slot: j.spec.slot,
            ended: j.ranks.iter().all(|r| r.status.is_some()),
        });
        let waiting = self.pending.iter().map(|(&job, spec)| HeldJob {
            job,
            slot: spec.slot,
            ended: false,
        });
        running.chain(waiting).collect()
    }

    /// The MM welcomed this node into a new membership that keeps the jobs of `keep`: any
    /// other job ended with the earlier membership (its nodes were told to forget it, or the
    /// MM no longer knows it), so it goes here too. Program transfers start afresh; output
    /// goes on in the new queue epoch, starting with what the MM may not have passed on.
    fn new_membership(&mut self, output_epoch: u32, incarnation: u64, keep: &[JobId]) {
        let jobs: Vec<JobId> = self
            .jobs
            .keys()
            .chain(self.pending.keys())
            .copied()
            .filter(|job| !keep.contains(job))
            .collect();
        for job in jobs {
            tracing::warn!(
                node = self.node,
                job,
                "ending a job the MM no longer knows here"
            );
            self.forget(job);
        }
        // A new MM process lost the reports in the old one's memory.
        if self.incarnation.is_some_and(|i| i != incarnation) {
            for j in self.jobs.values_mut().filter(|j| j.reported) {
                j.reported = false;
                j.report_again = true;
            }
        }
        self.incarnation = Some(incarnation);
        for (_, receiver) in std::mem::take(&mut self.receivers) {
            receiver.stop();
        }
        // A restarted MM numbers its transfers afresh, so the chunk queue's epochs start
        // over: the queue goes back to its never-used state (a producer then waits for this
        // node's receiver, whatever epoch it starts at), and an acknowledgement left from the
        // earlier membership must not answer for a new transfer.
        self.prims.memory().store(self.rm.chunks.dequeued, 0);
        self.prims.memory().store(self.rm.file_ack, 0);
        self.output_epoch = output_epoch;
        self.output.new_epoch(output_epoch);
        self.pmi.resend();
    }

    fn job_dir(&self, job: JobId) -> PathBuf {
        self.spool.join(format!("job-{job}"))
    }

    fn receive_file(&mut self, info: FileInfo) {
        if let Some(why) = info.problem(self.cfg.limits.max_program_bytes) {
            tracing::error!(
                node = self.node,
                job = info.job,
                "ignoring a file transfer: {why}"
            );
            return;
        }
        let path = self.job_dir(info.job).join(&info.name);
        let owner = nix::unistd::geteuid()
            .is_root()
            .then_some((info.uid, info.gid));
        // One receiver at a time takes from the chunk queue: earlier ones have finished, or
        // were cancelled with their job and stop now.
        for (_, receiver) in std::mem::take(&mut self.receivers) {
            receiver.stop();
        }
        let stall =
            Duration::from_millis(self.cfg.tcp.op_timeout_ms * 6).max(Duration::from_secs(30));
        let job = info.job;
        let receiver = receive::spawn(
            self.prims.clone(),
            self.rm.clone(),
            info,
            path,
            owner,
            stall,
        );
        self.receivers.insert(job, receiver);
    }

    fn task_env(
        &self,
        spec: &LaunchSpec,
        rank: u32,
        local_rank: u32,
        local_size: u32,
    ) -> Vec<(String, String)> {
        let name = self.cfg.nodes[self.node as usize].name.clone();
        let storm = [
            ("STORM_JOB_ID", spec.job.to_string()),
            ("STORM_RANK", rank.to_string()),
            ("STORM_SIZE", spec.ntasks.to_string()),
            ("STORM_NODEID", self.node.to_string()),
            ("STORM_NODENAME", name),
            ("STORM_LOCAL_RANK", local_rank.to_string()),
            ("STORM_LOCAL_SIZE", local_size.to_string()),
            ("STORM_NNODES", spec.nodes.len().to_string()),
            ("STORM_NODELIST", spec.nodes.to_string()),
        ];
        let mut env: Vec<(String, String)> = spec
            .env
            .iter()
            .filter(|(k, _)| !k.starts_with("STORM_"))
            .cloned()
            .collect();
        env.extend(storm.into_iter().map(|(k, v)| (k.to_string(), v)));
        if spec.mpi != MpiMode::None {
            // The PMI server's socket (see `pmi`), as MPICH's and Slurm's launchers set it.
            env.retain(|(k, _)| !k.starts_with("PMI_"));
            env.extend([
                ("PMI_FD".to_string(), crate::pmi::PMI_FD.to_string()),
                ("PMI_RANK".to_string(), rank.to_string()),
                ("PMI_SIZE".to_string(), spec.ntasks.to_string()),
                ("PMI_JOBID".to_string(), format!("storm-{}", spec.job)),
            ]);
        }
        if spec.mpi == MpiMode::OpenMpi {
            // Open MPI 4's `flux` component is chosen when FLUX_JOB_ID is set, and loads the
            // PMI-1 library named here (docs/mpi.md).
            env.retain(|(k, _)| !k.starts_with("FLUX_"));
            env.extend([
                ("FLUX_JOB_ID".to_string(), spec.job.to_string()),
                (
                    "FLUX_PMI_LIBRARY_PATH".to_string(),
                    self.pmi_library.display().to_string(),
                ),
            ]);
        }
        env
    }

    /// LAUNCH-JOB. Under gang scheduling the job's launchers start at the first strobe that
    /// runs the job, so no task ever runs outside its time slot, not even briefly.
    fn launch(&mut self, spec: LaunchSpec) {
        if spec.nodes.rank(self.node).is_none() {
            return;
        }
        let c = &self.cfg.cluster;
        let root_refused = (spec.uid == 0 && !self.cfg.security.allow_root_jobs)
            .then(|| "a job as root, which [security] allow_root_jobs forbids".to_string());
        if let Some(why) = root_refused
            .or_else(|| spec.problem(self.cfg.node_count(), c.max_jobs, c.max_tasks_per_node))
        {
            tracing::error!(
                node = self.node,
                job = spec.job,
                "ignoring an impossible launch: {why}"
            );
            return;
        }
        if self.jobs.contains_key(&spec.job) || self.pending.contains_key(&spec.job) {
            // Launched again for a node that missed the first launch; this one did not.
            return;
        }
        self.reporter().prepare_slot(&spec);
        if self.cfg.scheduler.policy == PolicyKind::Gang {
            self.pending.insert(spec.job, spec);
        } else {
            self.spawn_job(spec);
        }
    }

    fn spawn_job(&mut self, spec: LaunchSpec) {
        let Some(k) = spec.nodes.rank(self.node) else {
            return;
        };
        let (first, count) = ranks_on(spec.ntasks, spec.nodes.len() as u32, k as u32);
        let program = match &spec.program {
            Program::Spooled(name) => self.job_dir(spec.job).join(name),
            Program::Path(p) => p.clone(),
        };
        let mut ranks = Vec::new();
        let mut pmi_conns = Vec::new();
        for local in 0..count {
            let rank = first + local;
            let task_end = if spec.mpi == MpiMode::None {
                None
            } else {
                match std::os::unix::net::UnixStream::pair() {
                    Ok((ours, theirs)) => {
                        pmi_conns.push((rank, ours));
                        Some(OwnedFd::from(theirs))
                    }
                    Err(e) => {
                        tracing::error!(node = self.node, job = spec.job, "no PMI socket: {e}");
                        None
                    }
                }
            };
            // The task's end is closed here once its PL has it: the NM sees end of file when
            // the task and its PL are gone.
            let started = self.start_rank(&spec, &program, rank, local, count, task_end.as_ref());
            ranks.push(started);
        }
        if spec.mpi != MpiMode::None {
            let facts = JobFacts {
                job: spec.job,
                size: spec.ntasks,
                mapping: process_mapping(spec.ntasks, spec.nodes.len() as u32),
                v1: spec.mpi.serves_v1(),
                v2: spec.mpi.serves_v2(),
                node_bytes: self.rm.pmi_node_bytes,
                job_bytes: self.rm.pmi_job_bytes,
            };
            self.pmi.add_job(spec.slot as usize, facts, pmi_conns);
        }
        tracing::info!(node = self.node, job = spec.job, ranks = count, "launched");
        self.jobs
            .insert(spec.job, LocalJob::new(spec, ranks, false));
    }

    /// A job whose tasks never started on this node: report them with `status`.
    fn record_unstarted(&mut self, spec: LaunchSpec, status: RankStatus) {
        let Some(k) = spec.nodes.rank(self.node) else {
            return;
        };
        let (first, count) = ranks_on(spec.ntasks, spec.nodes.len() as u32, k as u32);
        let ranks = (first..first + count)
            .map(|rank| LocalRank {
                rank,
                slot: None,
                pl: None,
                status: Some(status),
                output: Arc::new(std::sync::atomic::AtomicU32::new(0)),
                stopped: false,
            })
            .collect();
        self.jobs.insert(spec.job, LocalJob::new(spec, ranks, true));
    }

    fn start_rank(
        &self,
        spec: &LaunchSpec,
        program: &Path,
        rank: u32,
        local: u32,
        count: u32,
        pmi: Option<&OwnedFd>,
    ) -> LocalRank {
        let output: Drained = Arc::new(std::sync::atomic::AtomicU32::new(2));
        let failed = |why: String, output: Drained| {
            tracing::error!(node = self.node, job = spec.job, rank, "{why}");
            self.tell_user(
                spec.job,
                rank,
                &format!("storm-nm: rank {rank} on node {}: {why}\n", self.node),
                &output,
            );
            LocalRank {
                rank,
                slot: None,
                pl: None,
                status: Some(RankStatus::Exited(127)),
                output,
                stopped: false,
            }
        };
        if spec.mpi == MpiMode::OpenMpi && !self.pmi_library.is_file() {
            return failed(
                format!(
                    "--mpi openmpi needs storm's PMI library, which is not at {} (cargo build --release builds it beside storm-nm; or set [cluster] pmi_library)",
                    self.pmi_library.display()
                ),
                output,
            );
        }
        let Some(slot) = self.table.claim() else {
            return failed("too many tasks on this node".into(), output);
        };
        let pl_spec = PlSpec {
            job: spec.job,
            rank,
            node: self.node,
            slot: slot as u32,
            program: program.to_path_buf(),
            args: spec.args.clone(),
            env: self.task_env(spec, rank, local, count),
            cwd: spec.cwd.clone(),
            uid: spec.uid,
            gid: spec.gid,
        };
        match start_pl(&self.pl_path, &self.table, &pl_spec, pmi) {
            Ok(started) => {
                for (stream, fd) in [
                    (Stream::Stdout, started.stdout),
                    (Stream::Stderr, started.stderr),
                ] {
                    self.output.watch(Watch {
                        job: spec.job,
                        rank,
                        stream,
                        fd,
                        remaining: output.clone(),
                    });
                }
                LocalRank {
                    rank,
                    slot: Some(slot),
                    pl: Some(started.child),
                    status: None,
                    output,
                    stopped: false,
                }
            }
            Err(e) => {
                let _ = self.table.release(slot);
                failed(
                    format!("cannot start storm-pl ({}): {e}", self.pl_path.display()),
                    output,
                )
            }
        }
    }

    /// Delivers a message to the user as the rank's standard error.
    fn tell_user(&self, job: JobId, rank: u32, text: &str, output: &Drained) {
        output.store(1, Ordering::Release);
        match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok((r, w)) => {
                let _ = nix::unistd::write(&w, text.as_bytes());
                drop(w);
                self.output.watch(Watch {
                    job,
                    rank,
                    stream: Stream::Stderr,
                    fd: r,
                    remaining: output.clone(),
                });
            }
            Err(_) => output.store(0, Ordering::Release),
        }
    }

    /// Gang scheduling: stops every local job that is not in `run`, then, once their tasks
    /// have all acted on SIGSTOP, continues (or starts) every one that is. A node never has
    /// two time slots' tasks runnable: when the old slot takes a while to stop (a busy
    /// node), the new one waits for it in `finish_switch`, called again on every loop.
    /// `received_ns` (CLOCK_MONOTONIC) is when the heartbeat was taken from the queue; the
    /// switch log records it beside the time the switch was complete.
    fn apply_schedule(&mut self, seq: u64, received_ns: u128, run: &[JobId]) {
        self.run.clear();
        self.run.extend_from_slice(run);
        let mut stopped = Vec::new();
        for (job, j) in self
            .jobs
            .iter_mut()
            .filter(|(_, j)| !j.reported && !j.ending)
        {
            let suspend = !run.contains(job);
            // A job whose continuing was still waiting has not run since it was stopped.
            let ran = j.ranks.iter().any(|r| r.status.is_none() && !r.stopped);
            if suspend && !j.suspended && ran {
                stopped.push(*job);
            }
            j.suspended = suspend;
        }
        for job in &stopped {
            self.stop_job(*job, true);
        }
        let switch = self.switch.get_or_insert_with(|| Switch {
            seq,
            from: seq,
            received_ns,
            since: Instant::now(),
            stopped: Vec::new(),
            warned: false,
        });
        switch.seq = seq;
        switch.received_ns = received_ns;
        switch.stopped.extend(stopped);
        self.finish_switch(SWITCH_INLINE_WAIT);
    }

    /// Completes the switch in progress if the tasks it stopped have stopped, waiting for
    /// them at most `wait`: continues every job of the slot and starts those launched for
    /// it. Past `SWITCH_GIVE_UP` (a task stuck in the kernel) the new slot runs anyway.
    fn finish_switch(&mut self, wait: Duration) {
        if self.switch.is_none() {
            return;
        }
        // Launchers that were starting their task when the switch began: stop the task now
        // that it has a process, before the new slot may run.
        let mut spawning = false;
        for j in self
            .jobs
            .values_mut()
            .filter(|j| j.suspended && !j.reported && !j.ending)
        {
            for r in j.ranks.iter_mut() {
                spawning |= !r.halt(&self.table);
            }
        }
        let Some(switch) = self.switch.as_mut() else {
            return;
        };
        let halting: Vec<i32> = self
            .jobs
            .values()
            .filter(|j| j.suspended && !j.reported && !j.ending)
            .flat_map(|j| &j.ranks)
            .filter(|r| r.status.is_none() && r.stopped)
            .filter_map(|r| r.slot.and_then(|s| self.table.pid(s).ok().flatten()))
            .collect();
        let waited = switch.since.elapsed();
        if spawning || !self.task_states.wait_until_stopped(&halting, wait) {
            if waited < SWITCH_GIVE_UP {
                if waited > SWITCH_WARN && !switch.warned {
                    switch.warned = true;
                    tracing::warn!(
                        node = self.node,
                        seq = switch.seq,
                        "tasks of the previous slot have taken over {} ms to stop (overloaded \
                         node?); the new slot waits for them",
                        SWITCH_WARN.as_millis()
                    );
                }
                return;
            }
            tracing::warn!(
                node = self.node,
                seq = switch.seq,
                "tasks of the previous slot did not stop within {} ms; the new slot runs anyway",
                SWITCH_GIVE_UP.as_millis()
            );
        }
        let Some(switch) = self.switch.take() else {
            return;
        };
        let mut started = Vec::new();
        let due: Vec<JobId> = self
            .pending
            .keys()
            .filter(|j| self.run.contains(j))
            .copied()
            .collect();
        for job in due {
            if let Some(spec) = self.pending.remove(&job) {
                started.push(job);
                self.spawn_job(spec);
            }
        }
        let continued: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(job, j)| {
                !j.suspended
                    && !j.reported
                    && !started.contains(job)
                    && j.ranks.iter().any(|r| r.status.is_none() && r.stopped)
            })
            .map(|(job, _)| *job)
            .collect();
        for job in &continued {
            self.stop_job(*job, false);
        }
        let live: Vec<i32> = self
            .jobs
            .values()
            .flat_map(|j| &j.ranks)
            .filter(|r| r.status.is_none())
            .filter_map(|r| r.slot.and_then(|s| self.table.pid(s).ok().flatten()))
            .collect();
        self.task_states.retain(&live);
        if let Some(log) = self.switch_log.as_mut()
            && !(switch.stopped.is_empty() && continued.is_empty() && started.is_empty())
        {
            let ns = storm_cluster::daemon::monotonic_ns();
            let list = |v: &[JobId]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            let _ = writeln!(
                log,
                "{} {ns} stop={} cont={} start={} recv={} from={}",
                switch.seq,
                list(&switch.stopped),
                list(&continued),
                list(&started),
                switch.received_ns,
                switch.from,
            );
        }
    }

    /// Halts (or resumes) every task of a job that has not ended; false if some launcher was
    /// starting its task and must be asked again (see [`LocalRank::halt`]).
    fn stop_job(&mut self, job: JobId, stop: bool) -> bool {
        let Some(j) = self.jobs.get_mut(&job) else {
            return true;
        };
        let mut all = true;
        for r in j.ranks.iter_mut() {
            if stop {
                all &= r.halt(&self.table);
            } else {
                r.resume(&self.table);
            }
        }
        all
    }

    fn signal_job(&mut self, job: JobId, signal: i32) {
        if let Some(spec) = self.pending.remove(&job) {
            // Never started here: its tasks end, unstarted, by this signal.
            self.record_unstarted(spec, RankStatus::Signaled(signal));
            return;
        }
        let was_suspended = self.jobs.get(&job).is_some_and(|j| j.suspended);
        if let Some(j) = self.jobs.get_mut(&job) {
            // A stopped process cannot act on a signal: let the job run until it ends.
            j.ending = true;
            j.suspended = false;
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let sig = Signal::try_from(signal).ok();
        for r in j.ranks.iter_mut().filter(|r| r.status.is_none()) {
            let pid = r.slot.and_then(|s| self.table.pid(s).ok().flatten());
            match (pid, sig) {
                (Some(pid), Some(sig)) => {
                    let _ = killpg(Pid::from_raw(pid), sig);
                }
                (None, _) => {
                    // The task has not started yet: stop its launcher, so it never does.
                    if let Some(pl) = &r.pl {
                        let _ = kill(Pid::from_raw(pl.id() as i32), Signal::SIGKILL);
                    }
                }
                (Some(_), None) => tracing::warn!(signal, "not a signal"),
            }
        }
        if was_suspended {
            self.stop_job(job, false);
        }
    }

    fn forget(&mut self, job: JobId) {
        tracing::info!(node = self.node, job, "forgetting the job");
        self.pending.remove(&job);
        // Cancelled now; joined before the next transfer starts.
        if let Some(receiver) = self.receivers.get(&job) {
            receiver.cancel();
        }
        if self.jobs.get(&job).is_some_and(|j| !j.reported) {
            self.signal_job(job, libc::SIGKILL);
        }
        self.pmi.remove_job(job);
        if let Some(j) = self.jobs.remove(&job) {
            for r in j.ranks {
                match r.pl {
                    Some(pl) => self.zombies.push(Zombie { pl, slot: r.slot }),
                    None => {
                        if let Some(slot) = r.slot {
                            let _ = self.table.release(slot);
                        }
                    }
                }
            }
        }
        let dir = self.job_dir(job);
        if dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            tracing::warn!("cannot remove {}: {e}", dir.display());
        }
    }

    /// Algorithm 9: collect ended tasks; report jobs whose local tasks all ended.
    fn poll_tasks(&mut self) {
        // A launcher writes its task's status into the table before it exits; waiting on the
        // launchers themselves (to reap them, and to notice one that died) can be less eager
        // than the heartbeat, which saves a syscall per task per heartbeat.
        let check_launchers = self.next_launcher_check <= Instant::now();
        if check_launchers {
            self.next_launcher_check = Instant::now() + LAUNCHER_CHECK;
            let table = &self.table;
            self.zombies.retain_mut(|z| {
                let gone = matches!(z.pl.try_wait(), Ok(Some(_)) | Err(_));
                if gone && let Some(slot) = z.slot {
                    let _ = table.release(slot);
                }
                !gone
            });
        }
        let mut ready = Vec::new();
        for (job, j) in self.jobs.iter_mut().filter(|(_, j)| !j.reported) {
            for r in j.ranks.iter_mut().filter(|r| r.status.is_none()) {
                if let Some(s) = r.slot.and_then(|s| self.table.status(s).ok().flatten()) {
                    r.status = Some(s);
                    continue;
                }
                if j.suspended && !j.ending {
                    r.halt(&self.table);
                }
                let Some(pl) = r.pl.as_mut().filter(|_| check_launchers) else {
                    continue;
                };
                if let Ok(Some(exit)) = pl.try_wait() {
                    // The launcher is gone. Take the status it wrote, or make one up from its
                    // own end, and make sure nothing it started lives on.
                    r.status = r
                        .slot
                        .and_then(|s| self.table.status(s).ok().flatten())
                        .or_else(|| {
                            if let Some(pid) = r.slot.and_then(|s| self.table.pid(s).ok().flatten())
                            {
                                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                            }
                            use std::os::unix::process::ExitStatusExt;
                            Some(match (exit.code(), exit.signal()) {
                                (_, Some(sig)) => RankStatus::Signaled(sig),
                                (Some(c), _) => RankStatus::Exited(c),
                                _ => RankStatus::Exited(1),
                            })
                        });
                }
            }
            if j.ranks.iter().any(|r| r.status.is_none()) {
                continue;
            }
            let ended = *j.exited_at.get_or_insert_with(Instant::now);
            let drained = j
                .ranks
                .iter()
                .all(|r| r.output.load(Ordering::Acquire) == 0);
            if self.output.backlogged() {
                // Output waits to be sent (a slow submitter, or no MM): the pipes are not
                // read meanwhile, so their staying open says nothing.
                j.exited_at = Some(Instant::now());
            } else if !drained && !j.output_closed && ended.elapsed() > OUTPUT_GRACE {
                tracing::warn!(job, "tasks ended but their output stays open; closing it");
                self.output.close_job(*job);
                j.output_closed = true;
            }
            // Output sent again in a new membership reaches the MM before the report does.
            if drained && self.output.flushed(self.output_epoch) {
                ready.push(*job);
            }
        }
        for job in ready {
            if let Err(e) = self.report(job) {
                tracing::warn!(node = self.node, job, "cannot report to the MM yet: {e}");
            }
        }
    }

    /// How this node reports to the MM.
    fn reporter(&self) -> Reporter<'_> {
        Reporter {
            prims: &*self.prims,
            rm: &self.rm,
            node: self.node,
            mm: self.mm,
            wait: Duration::from_millis(self.cfg.tcp.op_timeout_ms * 2),
        }
    }

    /// Tells the MM how the job's local tasks ended.
    fn report(&mut self, job: JobId) -> Result<()> {
        let j = self.jobs.get(&job).expect("job present");
        let statuses = j
            .ranks
            .iter()
            .map(|r| (r.rank, r.status.expect("all ended")))
            .collect();
        self.reporter().report(&j.spec, statuses)?;
        let j = self.jobs.get_mut(&job).expect("job present");
        j.reported = true;
        if std::mem::take(&mut j.report_again) {
            tracing::info!(node = self.node, job, "reported again to a restarted MM");
        }
        for r in &mut j.ranks {
            if let Some(slot) = r.slot.take() {
                let _ = self.table.release(slot);
            }
            if let Some(pl) = r.pl.take() {
                self.zombies.push(Zombie { pl, slot: None });
            }
        }
        tracing::info!(node = self.node, job, "reported termination");
        Ok(())
    }
}
