//! What the node manager's core asks of the world it runs in.
//!
//! [`crate::NodeManager`] makes every decision itself (which heartbeat commands apply here,
//! when a gang switch is complete, when a job's tasks have all ended and may be reported) but
//! does no I/O of its own besides the fabric it is handed: processes, files, the tasks'
//! output pipes, the PMI sockets and the logs are behind [`NmEnv`].
//!
//! The daemon's environment ([`crate::daemon`]) hands every task to the node's program
//! launcher ([`crate::tasks::PlRunner`], storm-pl and /proc), receives programs into the spool with a
//! thread per transfer, and forwards output and serves PMI on their own threads. The
//! simulator (`storm-sim`) brings a virtual clock and tasks that only use virtual time.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use storm_cluster::clock::Clock;
use storm_cluster::messages::{
    CheckProgram, Command, FileInfo, JobId, JobUsage, MpiMode, RankStatus, Stream,
};

use crate::output::{Drained, ForwarderState, OutputSource};
use crate::pmi::JobFacts;

/// The node manager's view of the world around it.
pub trait NmEnv {
    /// Where the NM reads the time.
    fn clock(&self) -> &dyn Clock;
    /// The tasks' processes.
    fn tasks(&mut self) -> &mut dyn TaskRunner;
    /// Programs received from the MM, and the jobs' directories.
    fn spool(&mut self) -> &mut dyn Spool;
    /// The tasks' output on its way to the MM.
    fn output(&mut self) -> &mut dyn OutputForwarder;
    /// The PMI server of MPI jobs.
    fn pmi(&mut self) -> &mut dyn PmiServer;
    /// The guest NM of a lent node.
    fn guest(&mut self) -> &mut dyn GuestRunner;
    /// A heartbeat was taken from the queue (recorded if the cluster asks for it).
    fn heard(&mut self, seq: u64, received_ns: u128, commands: &[Command]);
    /// A gang switch was completed (recorded if the cluster asks for it).
    fn switched(&mut self, switch: &SwitchRecord);
    /// A timestamp for the records above, in nanoseconds (CLOCK_MONOTONIC in the daemon).
    fn stamp_ns(&self) -> u128;
}

/// The guest NM this node runs while it is lent to a peer cluster (docs/federation.md).
pub trait GuestRunner {
    /// Runs the guest NM for peer `peer` until `until_ms` (Unix ms), if none runs yet, with
    /// this cluster's MM's `grant` of the lease to show the borrower.
    fn start(&mut self, peer: &str, until_ms: u64, grant: &storm_cluster::identity::LeaseGrant);
    /// Stops the guest NM, if one runs, and returns once it and its tasks are gone.
    fn stop(&mut self);
}

/// One task to start: what storm-pl needs to run it.
pub struct TaskStart<'a> {
    pub job: JobId,
    pub rank: u32,
    pub program: &'a Path,
    pub args: &'a [OsString],
    pub env: Vec<(OsString, OsString)>,
    pub cwd: &'a Path,
    pub uid: u32,
    pub gid: u32,
    /// The task's end of its PMI socket (MPI jobs).
    pub pmi: Option<&'a OwnedFd>,
    /// A batch script's output file, and its error file if it has its own: the task opens
    /// them as its user, in place of its output streams (which then carry only what the
    /// runner itself says of a task that could not start).
    pub output_file: Option<PathBuf>,
    pub error_file: Option<PathBuf>,
    /// The task reads storm-submit's standard input (else `/dev/null`).
    pub stdin: bool,
    /// The job's memory on this node (`--mem`): its cgroup's limit.
    pub mem: Option<u64>,
}

/// A task the runner started, and its output streams (the read ends of its pipes).
pub struct StartedTask {
    pub id: TaskId,
    pub output: Vec<(Stream, Box<dyn OutputSource>)>,
    /// The write end of the task's standard input, for a task that reads the job's input
    /// (`TaskStart::stdin`) and has a pipe for it.
    pub input: Option<OwnedFd>,
    /// What the user should know of how the task was started (a `--mem` not enforced
    /// here), told on the job's standard error.
    pub notice: Option<String>,
}

/// A runner's name for one of its tasks.
pub type TaskId = u64;

/// When a task started and ended, in [`NmEnv::stamp_ns`]'s time, as far as it has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskTimes {
    pub started_ns: Option<u128>,
    pub exited_ns: Option<u128>,
}

/// Starts, signals and watches the tasks on this node.
pub trait TaskRunner {
    /// Starts a task (not waiting for it to run); the error says why it cannot start.
    fn start(&mut self, task: TaskStart<'_>) -> Result<StartedTask, String>;
    /// Makes the task not runnable (SIGSTOP to its process group, or its slot held before the
    /// launcher starts it). False while the launcher is starting the task: there is no process
    /// to stop yet, so ask again shortly.
    fn halt(&mut self, task: TaskId) -> bool;
    /// Lets a halted task run again.
    fn resume(&mut self, task: TaskId);
    /// Sends `signal` to the task's process group; a task not started yet never starts.
    fn signal(&mut self, task: TaskId, signal: i32);
    /// How the task ended, once it has.
    fn status(&mut self, task: TaskId) -> Option<RankStatus>;
    /// When the task started and ended (for `storm-submit --timing`).
    fn times(&mut self, task: TaskId) -> TaskTimes;
    /// Waits at most `wait` until every one of `tasks` has acted on its stop (or is gone);
    /// false if some still runs.
    fn wait_stopped(&mut self, tasks: &[TaskId], wait: Duration) -> bool;
    /// The task is done with (reported or forgotten): free what it holds once it is gone.
    fn release(&mut self, task: TaskId);
    /// Every task of `job` here has ended, or the job is forgotten: kill whatever of it is
    /// left (processes that left their task's process group), and say what it used.
    fn end_job(&mut self, job: JobId) -> JobUsage;
    /// Housekeeping, called on every pass of the NM's loop (watching the launcher).
    fn poll(&mut self);
    /// The MPI library the running task has loaded (a `libmpi` shared object in its memory
    /// map), if it has and is still running.
    fn mpi_library(&mut self, task: TaskId) -> Option<String>;
}

/// Program files sent by the MM, and the per-job directories they go to.
pub trait Spool {
    /// The directory of a job's files on this node.
    fn job_dir(&self, job: JobId) -> PathBuf;
    /// Starts receiving a program into its job's directory, as `info.name` (Algorithm 7),
    /// acknowledging it in `file_ack` when verified. Any receiver still running is stopped
    /// first: one at a time takes from the chunk queue.
    fn receive(&mut self, info: FileInfo);
    /// Starts looking whether the program `check` names is at its path here, readable by its
    /// user: writes the digest of what is there (0 if nothing) in `program.digest`, then
    /// answers in `file_ack`. Like a transfer, it stops any receiver still running first.
    fn check(&mut self, check: CheckProgram);
    /// Stops the receiver of `job`, if there is one (its job ended).
    fn cancel(&mut self, job: JobId);
    /// Whether the program received for `job` is the one whose BLAKE3 hash the MM's sealed
    /// launch names; why not (none arrived, another did, no hash given) if it is not.
    fn verify(&self, job: JobId, expected: Option<[u8; 32]>) -> Result<(), String>;
    /// Stops every receiver and waits for them (a new membership numbers transfers afresh).
    fn stop_all(&mut self);
    /// Removes a job's directory, and its scratch directory.
    fn remove(&mut self, job: JobId);
    /// A directory of job `job`'s own on this node, in memory where the node has it
    /// (`/dev/shm`), that its user `uid`/`gid` may write and no one else may reach: where
    /// its MPI keeps its shared-memory segments and session files apart from another node's
    /// or job's on the same host. Made once per launch; removed with the job ([`Spool::remove`]),
    /// however it ended. `None` if it cannot be made (the job runs without).
    fn scratch_dir(&mut self, job: JobId, uid: u32, gid: u32) -> Option<PathBuf>;
}

/// The tasks' output streams, and messages for the user (see [`crate::output`]).
pub trait OutputForwarder {
    /// Forwards what `source` carries as the rank's `stream`; `remaining` is decremented once
    /// the stream has ended and all of it was delivered.
    fn watch(
        &mut self,
        job: JobId,
        rank: u32,
        stream: Stream,
        source: Box<dyn OutputSource>,
        remaining: Drained,
    );
    /// Delivers `text` as the rank's `stream`: its standard error (the NM could not start
    /// the task) or storm's notice of it; counted in `remaining` until delivered.
    fn tell(&mut self, job: JobId, rank: u32, stream: Stream, text: &str, remaining: &Drained);
    /// Writes the rank's standard input into `pipe` from now on.
    fn feed(&mut self, job: JobId, rank: u32, pipe: OwnedFd);
    /// The rank's standard input from `offset` on (bytes before what it has are dropped);
    /// `eof` closes it after them. Kept until the rank's pipe is fed; how far the rank took
    /// it goes to the MM as [`Stream::InputTaken`].
    fn input(&mut self, job: JobId, rank: u32, offset: u64, data: Vec<u8>, eof: bool);
    /// Stops reading a job's pipes, and writing its input.
    fn close_job(&mut self, job: JobId);
    /// The job is gone from this node: its input pipes close and what waits is dropped.
    fn end_input(&mut self, job: JobId);
    /// Job `job` ended here with an earlier membership: its streams are no longer read, and
    /// what of its output waits to go is dropped (late, it would pass for a later run's).
    fn discard_job(&mut self, job: JobId);
    /// A new membership starts the output queue at `epoch`.
    fn new_epoch(&mut self, epoch: u32);
    /// The forwarder's state: whether it is flushed, stalled or backlogged, and its hold
    /// before a registration goes out.
    fn state(&self) -> &ForwarderState;
}

/// The PMI server of this node.
pub trait PmiServer {
    /// Serves the tasks `ranks` of an MPI job about to start here in `mode`; gives each
    /// task's end of its PMI socket (or `None` for a task whose socket could not be made) and
    /// what PMIx adds to its environment, or why the job cannot be served at all.
    fn start_job(
        &mut self,
        slot: usize,
        mode: MpiMode,
        facts: JobFacts,
        ranks: &[u32],
    ) -> Result<PmiStart, String>;
    fn remove_job(&mut self, job: JobId);
    /// A new membership: send again the contributions of fences still waiting.
    fn resend(&mut self);
    /// Whether rank `rank` of job `job` has spoken to this node's PMI or PMIx server.
    fn contacted(&self, job: JobId, rank: u32) -> bool;
    /// Local rank `rank` of MPI job `job` ended with `status` (before the job's end): its
    /// job's other ranks are told, if it ended badly (PMIx events).
    fn rank_ended(&mut self, job: JobId, rank: u32, status: RankStatus);
}

/// What the PMI server gives a job's local tasks ([`PmiServer::start_job`]), by task, in the
/// order of the ranks asked for.
#[derive(Default)]
pub struct PmiStart {
    /// Each task's end of its PMI socket.
    pub ends: Vec<Option<OwnedFd>>,
    /// What the node's PMIx server puts in each task's environment (`PMIX_NAMESPACE`,
    /// `PMIX_RANK`, its address...); empty where PMIx is not served.
    pub env: Vec<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
}

/// A completed gang switch, as the switch log records it.
#[derive(Debug, Clone)]
pub struct SwitchRecord {
    /// The heartbeat whose schedule the switch carried out, and the one that began it.
    pub seq: u64,
    pub from: u64,
    /// When that heartbeat was taken from the queue ([`NmEnv::stamp_ns`]).
    pub received_ns: u128,
    pub stopped: Vec<JobId>,
    pub continued: Vec<JobId>,
    pub started: Vec<JobId>,
    /// Not a heartbeat's switch: heartbeat `seq`'s lease ran out before the next one came,
    /// and the NM stopped `stopped` (`received_ns` is then when).
    pub lease_expired: bool,
}
