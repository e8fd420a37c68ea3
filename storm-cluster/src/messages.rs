//! What travels through the primitives between the MM and the NMs: heartbeats (MM to all NMs,
//! Algorithms 4 and 5), per-node reports of exit statuses (NM to MM, Algorithm 9) and output
//! (NM to MM). All are bincode with an explicit size limit; decoding never panics.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use storm_primitives::{NodeId, NodeSet};

pub type JobId = u64;

/// How one task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankStatus {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

impl RankStatus {
    pub fn success(self) -> bool {
        self == RankStatus::Exited(0)
    }

    /// The shell's convention: the exit code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            RankStatus::Exited(c) => c,
            RankStatus::Signaled(s) => 128 + s,
        }
    }

    /// From a `waitpid` status.
    pub fn from_wait_status(status: i32) -> Self {
        if libc::WIFSIGNALED(status) {
            RankStatus::Signaled(libc::WTERMSIG(status))
        } else {
            RankStatus::Exited(libc::WEXITSTATUS(status))
        }
    }
}

impl std::fmt::Display for RankStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RankStatus::Exited(c) => write!(f, "exit code {c}"),
            RankStatus::Signaled(s) => write!(f, "killed by signal {s} ({})", signal_name(s)),
        }
    }
}

/// `SIGKILL`-style name of a signal number.
pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// A program to distribute (RECEIVE-FILE-INFO of Algorithm 5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Transfer number: the chunk queue's epoch, and what the NM acknowledges in `file.ack`.
    pub transfer: u32,
    pub job: JobId,
    pub nodes: NodeSet,
    /// Bytes of program data; after them the chunk queue carries one [`FileTrailer`].
    pub size: u64,
    /// File name under the job's spool directory.
    pub name: String,
    /// Owner of the received file when the NM runs as root.
    pub uid: u32,
    pub gid: u32,
}

impl FileInfo {
    /// Why this file cannot be received, if it cannot: its name must be one plain file name,
    /// so that it lands in the job's spool directory and nowhere else, and it may not be
    /// larger than `max_bytes` (`[limits] max_program_bytes`).
    pub fn problem(&self, max_bytes: u64) -> Option<String> {
        if self.size > max_bytes {
            return Some(format!(
                "a file of {} bytes exceeds [limits] max_program_bytes = {max_bytes}",
                self.size
            ));
        }
        let mut parts = std::path::Path::new(&self.name).components();
        match (parts.next(), parts.next()) {
            (Some(std::path::Component::Normal(_)), None) => None,
            _ => Some(format!(
                "file name {:?} is not one plain file name",
                self.name
            )),
        }
    }
}

/// What a node writes in its `file.ack` once it is done with program transfer `transfer`:
/// `2 * transfer + 1` if it received and verified the program, `2 * transfer` if not. Every
/// value at or above `file_ack(transfer, false)` is an answer for that transfer.
pub fn file_ack(transfer: u32, verified: bool) -> u64 {
    2 * transfer as u64 + u64::from(verified)
}

/// What tells a program file apart besides its bytes, as `fstat` gives it: a program runs in
/// place only where the file at its path has the submitted one's size, modification time,
/// permission bits and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramStamp {
    pub size: u64,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

impl ProgramStamp {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            size: meta.size(),
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
            mode: meta.mode() & 0o7777,
        }
    }
}

/// The 64-bit digest of a program file, its stamp and the BLAKE3 hash of its bytes, that a
/// node writes in its `program.digest` and the MM compares on every node at once with one
/// COMPARE-AND-WRITE. Never 0, which a node writes when it has no such file.
pub fn program_digest(stamp: &ProgramStamp, hash: &[u8; 32]) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(b"storm program digest 1");
    h.update(&stamp.size.to_le_bytes());
    h.update(&stamp.mtime_s.to_le_bytes());
    h.update(&stamp.mtime_ns.to_le_bytes());
    h.update(&stamp.mode.to_le_bytes());
    h.update(hash);
    let d = u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"));
    d.max(1)
}

/// Asks a job's nodes whether its program is already at `path`, readable by its user: each
/// node writes the [`program_digest`] of what it finds there in `program.digest`, then
/// `file_ack(transfer, true)` in `file.ack` (the check takes a transfer's number: a node
/// answers for one check or transfer at a time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckProgram {
    pub transfer: u32,
    pub job: JobId,
    pub nodes: NodeSet,
    #[serde(with = "crate::os_bytes::path")]
    pub path: PathBuf,
    /// The user whose rights the node reads the file with.
    pub uid: u32,
    pub gid: u32,
}

/// The last entry of a program transfer: what the receiver must have got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileTrailer {
    pub size: u64,
    pub checksum: u64,
}

impl FileTrailer {
    pub const BYTES: usize = 16;

    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        (b.len() == Self::BYTES).then(|| Self {
            size: u64::from_le_bytes(b[..8].try_into().expect("8")),
            checksum: u64::from_le_bytes(b[8..].try_into().expect("8")),
        })
    }
}

/// Where the program of a job is found on the nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Program {
    /// Transferred to each node's spool directory under this name.
    Spooled(String),
    /// Already present on every node at this path (`--no-bcast`).
    Path(#[serde(with = "crate::os_bytes::path")] PathBuf),
}

/// Start a job's processes (LAUNCH-JOB of Algorithm 5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub job: JobId,
    pub slot: u32,
    pub nodes: NodeSet,
    pub ntasks: u32,
    pub program: Program,
    /// The BLAKE3 hash of a program the MM sent (`Program::Spooled`): a node runs the file
    /// it received only if it is this one.
    pub program_hash: Option<[u8; 32]>,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    #[serde(with = "crate::os_bytes::path")]
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// The node that announces the job's termination to the MM (Algorithm 9).
    pub reporter: NodeId,
    /// Which PMI protocols the NMs serve the job's tasks (MPI wire-up).
    pub mpi: MpiMode,
    /// Which tasks read storm-submit's standard input (the others read `/dev/null`).
    pub input: InputTarget,
    /// A batch job: `ntasks` is 1 (the script, on the first node), its standard output and
    /// error go to these files, and `alloc_tasks` is what its allocation holds.
    pub batch: Option<BatchLaunch>,
    /// The memory the job may use on each node (bytes, `--mem`): its cgroup's limit there.
    pub mem: Option<u64>,
    /// A local rank that exits non-zero or by a signal ends the job (`--kill-on-bad-exit`):
    /// its NM stops the job's other local ranks and names it in its report.
    pub kill_on_bad_exit: bool,
    /// Seconds after a local rank ends that the NM stops the job's other local ranks, naming
    /// the first to end in its report (`--wait`); 0: never.
    pub exit_wait_s: u32,
    /// How the job's ranks are bound to CPUs (`--cpu-bind`; `None`: the node's `[cluster]
    /// cpu_bind`), and which of the node's CPUs (indices, `0..cpus`) the job holds when it
    /// shares the node with other jobs (`None`: all of them).
    pub cpu_bind: Option<crate::cpu_bind::CpuBind>,
    pub cpus: Option<NodeSet>,
}

/// Where a batch script's output goes (`storm batch -o/-e`): patterns, relative to the
/// job's working directory unless absolute, in which the node replaces `%j` (job id), `%N`
/// (node name), `%t` (rank), `%A` and `%a` (array job and index: the job id and 0 outside
/// arrays) and `%%`; the submitter has replaced `%u` (user) and `%x` (job name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutput {
    pub output: String,
    /// Standard error's pattern; `None` sends it to the output file.
    pub error: Option<String>,
}

/// What a node needs to run a batch script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchLaunch {
    pub files: BatchOutput,
    /// Tasks the allocation holds (the script's `STORM_NTASKS`: a step's default).
    pub alloc_tasks: u32,
    /// An element of a job array: the array's id, this element's index, the array's size.
    pub array: Option<(JobId, u32, u32)>,
}

impl BatchOutput {
    /// Slurm's default: standard output and error to `storm-%j.out`.
    pub fn default_files() -> Self {
        Self {
            output: "storm-%j.out".into(),
            error: None,
        }
    }
}

/// Expands a batch output pattern's node-side fields (see [`BatchOutput`]); `array` is the
/// array's id and the element's index, for an element of an array. An unknown `%c` is kept
/// as it is.
pub fn expand_output_pattern(
    pattern: &str,
    job: JobId,
    array: Option<(JobId, u32)>,
    node: &str,
    rank: u32,
) -> String {
    let (array_id, index) = array.unwrap_or((job, 0));
    expand_pattern_fields(pattern, |field| match field {
        'j' => Some(job.to_string()),
        'A' => Some(array_id.to_string()),
        'a' => Some(index.to_string()),
        'N' => Some(node.to_string()),
        't' => Some(rank.to_string()),
        '%' => Some("%".to_string()),
        _ => None,
    })
}

/// Replaces each `%c` of `pattern` with what `field(c)` gives; a field it gives nothing for,
/// and a `%` at the end, are kept as they are. The submitter (`%u`, `%x`) and the node (the
/// rest) each expand their own fields with it.
pub fn expand_pattern_fields(pattern: &str, field: impl Fn(char) -> Option<String>) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(f) => match field(f) {
                Some(value) => out.push_str(&value),
                None => {
                    out.push('%');
                    out.push(f);
                }
            },
            None => out.push('%'),
        }
    }
    out
}

/// Which PMI protocols a job's tasks are served (`storm-submit --mpi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum MpiMode {
    /// No PMI: tasks get no `PMI_FD` and MPI programs start as singletons.
    None,
    Pmi1,
    Pmi2,
    /// Both on one socket; the task's first line decides (as Slurm's pmi2 plugin does).
    Both,
    /// Both, and what Open MPI 4 needs to load storm's PMI-1 client library through its
    /// `flux` component: `FLUX_JOB_ID` and `FLUX_PMI_LIBRARY_PATH` (docs/mpi.md).
    OpenMpi,
    /// Whatever the program speaks (the default): PMI-1 and PMI-2 on one socket, and Open
    /// MPI 4's way in, so MPICH and Open MPI programs start as one world with no option.
    #[default]
    Auto,
}

impl MpiMode {
    pub fn serves_v1(self) -> bool {
        matches!(
            self,
            MpiMode::Pmi1 | MpiMode::Both | MpiMode::OpenMpi | MpiMode::Auto
        )
    }

    pub fn serves_v2(self) -> bool {
        matches!(
            self,
            MpiMode::Pmi2 | MpiMode::Both | MpiMode::OpenMpi | MpiMode::Auto
        )
    }

    /// Whether the node's PMIx server serves the job (where it runs).
    pub fn serves_pmix(self) -> bool {
        matches!(self, MpiMode::OpenMpi | MpiMode::Auto)
    }

    /// Whether Open MPI 4's tasks are told to load storm's PMI library (`FLUX_JOB_ID`,
    /// `FLUX_PMI_LIBRARY_PATH`).
    pub fn serves_open_mpi(self) -> bool {
        matches!(self, MpiMode::OpenMpi | MpiMode::Auto)
    }

    /// How `--mpi` names it.
    pub fn name(self) -> &'static str {
        match self {
            MpiMode::None => "none",
            MpiMode::Pmi1 => "pmi1",
            MpiMode::Pmi2 => "pmi2",
            MpiMode::Both => "both",
            MpiMode::OpenMpi => "openmpi",
            MpiMode::Auto => "auto",
        }
    }
}

impl std::str::FromStr for MpiMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(MpiMode::None),
            "pmi1" => Ok(MpiMode::Pmi1),
            "pmi2" => Ok(MpiMode::Pmi2),
            "both" | "pmi" => Ok(MpiMode::Both),
            "openmpi" => Ok(MpiMode::OpenMpi),
            "auto" => Ok(MpiMode::Auto),
            other => Err(format!(
                "unknown --mpi {other:?} (expected auto, none, pmi1, pmi2, both or openmpi)"
            )),
        }
    }
}

/// NM to MM: one node's part in a job's PMI exchange, written into `pmi_up[slot][node]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PmiUp {
    /// Every local rank entered fence `epoch`; these are the node's puts since the last one.
    Fence {
        job: JobId,
        epoch: u32,
        pairs: Vec<(String, String)>,
    },
    /// End the job: a rank called abort (with its exit code), broke the protocol, or left
    /// without finalize.
    Abort {
        job: JobId,
        rank: u32,
        code: Option<i32>,
        message: String,
    },
}

mod exchange;
pub use exchange::{PmixDown, PmixUp, RankEnd, events as pmix_events, pmix_down};

/// MM to a job's NMs: the union of every node's puts for fence `epoch`, written into
/// `pmi_down[slot]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmiFenced {
    pub job: JobId,
    pub epoch: u32,
    pub pairs: Vec<(String, String)>,
}

impl LaunchSpec {
    /// What makes this launch impossible on a cluster of `node_count` nodes whose layout has
    /// `max_jobs` job slots and room for `max_tasks_per_node` tasks of a job per node, if
    /// anything: the indices it carries are checked before any of them is used.
    pub fn problem(
        &self,
        node_count: u32,
        max_jobs: usize,
        max_tasks_per_node: usize,
    ) -> Option<String> {
        if self.slot as usize >= max_jobs {
            return Some(format!(
                "job slot {} outside the {max_jobs} slots of the layout",
                self.slot
            ));
        }
        let last = self.nodes.last()?;
        if last >= node_count {
            return Some(format!(
                "node {last} outside the cluster of {node_count} nodes"
            ));
        }
        if self.reporter >= node_count {
            return Some(format!("reporter {} is not a node", self.reporter));
        }
        let per_node = self.ntasks.div_ceil(self.nodes.len() as u32) as usize;
        if per_node > max_tasks_per_node {
            return Some(format!(
                "{per_node} tasks per node, more than the layout's {max_tasks_per_node}"
            ));
        }
        None
    }
}

/// One command carried by a heartbeat.
// A launch is the large one; commands live for one heartbeat, a few at a time, so boxing it
// would cost an allocation per launch to save bytes nobody keeps.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    ReceiveFile(FileInfo),
    Launch(LaunchSpec),
    /// Send `signal` to every process of `job` on this node.
    Signal {
        job: JobId,
        signal: i32,
    },
    /// The job is over: remove its spool directory.
    Forget {
        job: JobId,
    },
    /// Gang scheduling: from this heartbeat on exactly these jobs run; every other job's
    /// processes on the node are stopped.
    Schedule {
        run: Vec<JobId>,
        /// How long after taking this heartbeat the node may run these jobs without the next
        /// one, in microseconds (0: until the next heartbeat, whenever it comes). Set when the
        /// next timeslice runs other jobs: a node whose next heartbeat is late then stops its
        /// slot instead of running it beside the other nodes' next one.
        lease_us: u32,
    },
    /// Stop the node manager.
    Shutdown,
    /// Piece `index` of `count` of a [`LaunchSpec`] too large for one heartbeat (a job whose
    /// arguments and environment approach the kernel's `ARG_MAX`): its encoding, cut in
    /// pieces that go in consecutive heartbeats. A node launches the job once it has every
    /// piece; piece 0 starts the assembly again.
    LaunchPiece {
        job: JobId,
        nodes: NodeSet,
        index: u32,
        count: u32,
        bytes: Vec<u8>,
    },
    /// storm-submit's standard input for the tasks of `job` that read it (its launch's
    /// `input`): `data` is the stream's bytes from `offset` on; `eof` ends the stream after
    /// them. A node keeps each byte once by its offset (input is sent again after an MM
    /// restart), and says how far each task took it with an [`Stream::InputTaken`] chunk.
    Input {
        job: JobId,
        nodes: NodeSet,
        offset: u64,
        data: Vec<u8>,
        eof: bool,
    },
    /// Is the program already in place on these nodes (a shared file system)?
    CheckProgram(CheckProgram),
    /// Lending (docs/federation.md): this node is lent to peer cluster `peer` until
    /// `until_ms` (Unix ms): its NM starts the guest NM that joins the peer's fabric, if it
    /// does not run yet. Sent again whenever the node is welcomed while lent.
    Lend {
        nodes: NodeSet,
        peer: String,
        until_ms: u64,
        /// The MM's signed grant of the lease, which the guest shows the borrower.
        grant: crate::identity::LeaseGrant,
    },
    /// The node comes home: its NM stops the guest NM, whose tasks die with it, before it
    /// takes the next command (so that no job of this cluster starts beside a guest's).
    /// Sent whenever the node is welcomed while not lent, too.
    EndLend {
        nodes: NodeSet,
    },
}

impl Command {
    /// The nodes a command concerns (`None`: every node).
    pub fn nodes(&self) -> Option<&NodeSet> {
        match self {
            Command::ReceiveFile(f) => Some(&f.nodes),
            Command::CheckProgram(c) => Some(&c.nodes),
            Command::Launch(l) => Some(&l.nodes),
            Command::Input { nodes, .. } => Some(nodes),
            Command::LaunchPiece { nodes, .. } => Some(nodes),
            Command::Lend { nodes, .. } | Command::EndLend { nodes } => Some(nodes),
            _ => None,
        }
    }

    /// Makes `(uid, gid)` the owner of whatever files and tasks the command makes (a guest
    /// NM's account, docs/federation.md). A launch in pieces is the NM's to rewrite once
    /// whole.
    pub fn run_as(&mut self, (uid, gid): (u32, u32)) {
        match self {
            Command::ReceiveFile(f) => (f.uid, f.gid) = (uid, gid),
            Command::CheckProgram(c) => (c.uid, c.gid) = (uid, gid),
            Command::Launch(l) => (l.uid, l.gid) = (uid, gid),
            _ => {}
        }
    }
}

/// Membership: what the MM writes into an NM's `join` area (and signals with `joined`).
///
/// An NM registers by writing its [`Inventory`] (the jobs it holds) and then its stamp into
/// the MM's memory. The MM answers `Welcome` with the jobs the node keeps (those the MM still
/// knows as running there: a node that was only silent loses nothing); the NM drops every
/// other job, discards stale heartbeat signals and acknowledges; the MM then sends `Start`
/// with the heartbeat sequence number the node joins at, and adds it to the heartbeat's node
/// set. `Evicted` tells an NM the MM no longer counts it as a member (it missed a deadline,
/// was marked DOWN, or the MM restarted), so it registers again at once. Each names the stamp
/// it answers, so a message meant for an earlier registration is ignored.
/// Bits of an MM incarnation below its term.
const INCARNATION_TERM_SHIFT: u32 = 42;

/// An MM process's incarnation: its Raft term (0 for a single MM) in the high bits, then its
/// start time and pid, so that a later term's MM has the larger value and no two processes
/// share one.
pub fn incarnation(term: u64, now_ms: u64, pid: u32) -> u64 {
    (term << INCARNATION_TERM_SHIFT) | ((now_ms & 0xffff_ffff) << 10) | (pid as u64 & 0x3ff)
}

/// The Raft term an incarnation was made in (0: a single MM).
pub fn incarnation_term(incarnation: u64) -> u64 {
    incarnation >> INCARNATION_TERM_SHIFT
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Membership {
    Welcome {
        stamp: u64,
        /// Epoch of this node's output queue for this membership.
        output_epoch: u32,
        /// Which MM process this is: a new value means the MM restarted, and what the old one
        /// held in its memory (reports, output in its queues) must be sent again.
        incarnation: u64,
        /// The jobs of the inventory the node keeps running.
        keep: Vec<JobId>,
    },
    Start {
        stamp: u64,
        /// Absolute sequence number of the first heartbeat the node takes.
        seq: u64,
    },
    Evicted {
        stamp: u64,
    },
}

/// A membership message with the MM's seal, as it is written into a node's join area.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedMembership {
    pub msg: Membership,
    pub seal: crate::identity::Seal,
}

/// Bytes of the `join` area that carries one [`SealedMembership`] message, for a cluster
/// running at most `max_jobs` jobs at once.
pub fn membership_bytes(max_jobs: usize) -> usize {
    160 + 10 * max_jobs
}

/// A job an NM holds when it registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldJob {
    pub job: JobId,
    /// Its slot (per-job areas of global memory).
    pub slot: u32,
    /// Every local task has ended.
    pub ended: bool,
}

/// What an NM tells the MM when it registers: its stamp, since when its process runs, and
/// every job it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Inventory {
    pub stamp: u64,
    /// When this NM process started (Unix time, milliseconds, by the node's clock): with the
    /// stamp's pid, it names the process, so that an MM tells a registration of the NM its
    /// launch went to from one of a later NM (only ever compared with itself, never with the
    /// MM's clock).
    pub since_ms: u64,
    pub jobs: Vec<HeldJob>,
    /// The memory the node has (bytes, as its NM detects it): what jobs may use there unless
    /// the cluster file declares the node's `mem`.
    pub mem: u64,
    /// A guest NM's lease: its lender's grant, without which the borrower admits no guest
    /// slot (docs/federation.md). `None` for a cluster's own nodes.
    pub lease: Option<crate::identity::LeaseGrant>,
}

/// Bytes of a lease grant at most (names of up to 255 bytes each, the signature).
pub const LEASE_GRANT_BYTES: usize = 3 * 256 + 64 + 32;

/// Bytes of one node's inventory area, for at most `max_jobs` jobs (and a guest's lease).
pub fn inventory_bytes(max_jobs: usize) -> usize {
    64 + 24 * max_jobs + LEASE_GRANT_BYTES
}

/// The heartbeat: one entry of the heartbeat queue, issued every timeslice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Heartbeat {
    pub seq: u64,
    pub commands: Vec<Command>,
    /// The MM's seal over every command but the schedule (see [`crate::identity`]); none
    /// when it carries nothing else.
    pub seal: Option<crate::identity::Seal>,
}

/// One node's exit statuses for a job, PUT into the MM's report area.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub job: JobId,
    /// (rank, status) for each task of the job on this node.
    pub statuses: Vec<(u32, RankStatus)>,
    pub timing: NodeTiming,
    /// The local rank whose failure ended the job here (`--kill-on-bad-exit`): the others
    /// were stopped by its NM because of it.
    pub culprit: Option<u32>,
    /// The local rank that ended first (the one `--wait` counts from).
    pub first_ended: Option<u32>,
    /// The NM stopped the job's other local ranks because they ran on `--wait` seconds
    /// after `first_ended` ended.
    pub waited: bool,
}

impl NodeReport {
    /// The rank that speaks for this node's end: its first failed rank, else its first.
    pub fn telling_rank(&self) -> Option<u32> {
        self.statuses
            .iter()
            .find(|(_, s)| !s.success())
            .or_else(|| self.statuses.first())
            .map(|&(rank, _)| rank)
    }

    /// Whether `rank` is one this report gives a status for (a node names only its own).
    pub fn reports(&self, rank: u32) -> bool {
        self.statuses.iter().any(|&(r, _)| r == rank)
    }
}

/// When a job's tasks ran on one node, in microseconds after the node took the heartbeat
/// that launched them (its own clock: nodes' clocks need not agree).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTiming {
    /// The launch heartbeat's seal was checked.
    pub verified_us: Option<u64>,
    /// The job was readied here: its program checked (a spooled copy hashed against the
    /// launch), its PMI server set up.
    pub prepared_us: Option<u64>,
    /// Every local task was handed to the node's launcher (its cgroup made).
    pub asked_us: Option<u64>,
    /// The first local task started (its launcher forked it); none if none started.
    pub first_started_us: Option<u64>,
    /// The last local task ended; none if the node does not know when (a lost launcher).
    pub last_exited_us: Option<u64>,
    /// The node wrote its report.
    pub reported_us: u64,
    /// What the job's processes used on the node (from its cgroup).
    pub usage: JobUsage,
}

/// What a job's processes used on a node, read from its cgroup (unknown without cgroups).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUsage {
    /// CPU time (user and system) of every process the job ran there, microseconds.
    pub cpu_us: Option<u64>,
    /// The most memory the job's processes held there at once, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// Processes of the job the kernel's OOM killer killed there.
    pub oom_kills: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stream {
    Stdout,
    Stderr,
    /// Not output: the node's word that the rank took its standard input up to the chunk's
    /// `offset` (the chunk has no data), or, at [`INPUT_END`], all of it and its end.
    /// storm-submit sends more input only as far as this lets it (see [`Command::Input`]),
    /// and sends the end again until it is taken.
    InputTaken,
    /// Not the task's output: what its NM says of the rank (that it ran as an MPI
    /// singleton), which storm-submit writes to its standard error.
    Notice,
}

/// Which tasks get storm-submit's standard input (`-i`): srun's `--input` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum InputTarget {
    /// Every task's standard input is `/dev/null` (batch jobs, `-i none`).
    #[default]
    None,
    /// This rank's (`-i 0`, the default of storm-submit).
    Rank(u32),
    /// Every rank gets all of it (`-i all`).
    All,
}

impl InputTarget {
    /// Whether `rank` reads the job's input.
    pub fn includes(self, rank: u32) -> bool {
        match self {
            InputTarget::None => false,
            InputTarget::Rank(r) => r == rank,
            InputTarget::All => true,
        }
    }
}

impl std::str::FromStr for InputTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(InputTarget::None),
            "all" => Ok(InputTarget::All),
            _ => s
                .parse::<u32>()
                .map(InputTarget::Rank)
                .map_err(|_| format!("{s:?} is not an input mode: none, all, or a rank number")),
        }
    }
}

/// Largest encoded [`LaunchSpec`] a node assembles from [`Command::LaunchPiece`]s.
pub const MAX_LAUNCH_BYTES: usize = 16 << 20;

/// The commands that launch `spec` when heartbeats carry at most `heartbeat_bytes`: the
/// launch itself if it fits in half of one (the rest holds the schedule and the seal), else
/// its pieces.
pub fn launch_commands(
    spec: LaunchSpec,
    heartbeat_bytes: usize,
) -> Result<Vec<Command>, MessageError> {
    let room = (heartbeat_bytes / 2).max(1);
    let whole = Command::Launch(spec);
    if encode("launch", &whole, room).is_ok() {
        return Ok(vec![whole]);
    }
    let Command::Launch(spec) = whole else {
        unreachable!("built above")
    };
    let bytes = encode("launch", &spec, MAX_LAUNCH_BYTES)?;
    // Each piece's own fields (job, node set, counters) take room too.
    let piece = room
        .saturating_sub(256 + 12 * spec.nodes.ranges().len())
        .max(64);
    let count = bytes.len().div_ceil(piece) as u32;
    Ok(bytes
        .chunks(piece)
        .enumerate()
        .map(|(i, b)| Command::LaunchPiece {
            job: spec.job,
            nodes: spec.nodes.clone(),
            index: i as u32,
            count,
            bytes: b.to_vec(),
        })
        .collect())
}

/// Most bytes of standard input one [`Command::Input`] carries.
pub const MAX_INPUT_CHUNK: usize = 16 * 1024;

/// The offset of an [`Stream::InputTaken`] chunk that says the rank took its whole standard
/// input, the end included (its task read end of file, or no longer reads).
pub const INPUT_END: u64 = u64::MAX;

/// Most bytes of standard input storm-submit sends past what its tasks acknowledged.
pub const INPUT_WINDOW: u64 = 64 * 1024;

/// A piece of a task's output, NM to MM to storm-submit.
///
/// A chunk may arrive twice (an NM sends again what a restarted MM, or a new membership,
/// may not have passed on): `offset` says where its bytes start in the task's stream, so a
/// receiver keeps each byte once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub job: JobId,
    pub rank: u32,
    pub stream: Stream,
    /// Bytes of this stream before this chunk.
    pub offset: u64,
    pub data: Vec<u8>,
}

impl OutputChunk {
    /// The part of this chunk past `seen` bytes of its stream (what a receiver that has
    /// `seen` bytes lacks), or `None` if it has all of it.
    pub fn unseen(&self, seen: u64) -> Option<&[u8]> {
        let end = self.offset.saturating_add(self.data.len() as u64);
        if end <= seen {
            return None;
        }
        let skip = seen.saturating_sub(self.offset) as usize;
        Some(&self.data[skip..])
    }
}

/// Why bytes were not a valid message.
#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {detail}")]
pub struct MessageError {
    pub what: &'static str,
    pub detail: String,
}

/// Encodes a message; fails if it exceeds `limit` bytes.
pub fn encode<T: Serialize>(
    what: &'static str,
    msg: &T,
    limit: usize,
) -> Result<Vec<u8>, MessageError> {
    let bytes = bincode::serde::encode_to_vec(msg, bincode::config::standard()).map_err(|e| {
        MessageError {
            what,
            detail: e.to_string(),
        }
    })?;
    if bytes.len() > limit {
        return Err(MessageError {
            what,
            detail: format!("{} bytes exceed the limit of {limit}", bytes.len()),
        });
    }
    Ok(bytes)
}

/// Decodes a message of at most `limit` bytes.
pub fn decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
    limit: usize,
) -> Result<T, MessageError> {
    if bytes.len() > limit {
        return Err(MessageError {
            what,
            detail: format!("{} bytes exceed the limit of {limit}", bytes.len()),
        });
    }
    storm_primitives::codec::decode(bytes)
        .map(|(v, _)| v)
        .map_err(|e| MessageError {
            what,
            detail: e.to_string(),
        })
}

/// Bytes in front of a sealed message: its length (u32) and its xxh3 checksum (u64).
pub const SEAL_BYTES: usize = 12;

/// Encodes a message for an area that its writer overwrites in place while the area's owner
/// may be reading it: the per-node PMI parts, the PMI fence result, an NM's inventory and
/// membership messages, a node's report. Global memory is copied a word at a time, so a read
/// that overlaps a write sees the new message's front and the old one's back; with hex
/// strings in both (MPI business cards), that mixture often decodes, into values no rank
/// put. The length and checksum in front let [`decode_sealed`] refuse it. Fails if the
/// sealed message exceeds `limit` bytes.
pub fn encode_sealed<T: Serialize>(
    what: &'static str,
    msg: &T,
    limit: usize,
) -> Result<Vec<u8>, MessageError> {
    let body = encode(what, msg, limit.saturating_sub(SEAL_BYTES))?;
    Ok(seal(&body))
}

/// `body` behind its length and checksum (what [`encode_sealed`] writes).
pub fn seal(body: &[u8]) -> Vec<u8> {
    let mut sealed = Vec::with_capacity(SEAL_BYTES + body.len());
    sealed.extend_from_slice(&(body.len() as u32).to_le_bytes());
    sealed.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(body).to_le_bytes());
    sealed.extend_from_slice(body);
    sealed
}

/// Decodes a message written by [`encode_sealed`] into an area of `limit` bytes (`bytes` may
/// be the whole area). Bytes whose checksum does not match are refused: the message is still
/// arriving, was overwritten while it was read, or was never written (zeroes).
pub fn decode_sealed<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
    limit: usize,
) -> Result<T, MessageError> {
    let refuse = |detail: String| MessageError { what, detail };
    if bytes.len() > limit {
        return Err(refuse(format!(
            "{} bytes exceed the limit of {limit}",
            bytes.len()
        )));
    }
    let (Some(len), Some(sum)) = (bytes.get(..4), bytes.get(4..SEAL_BYTES)) else {
        return Err(refuse(format!(
            "{} bytes are no sealed message",
            bytes.len()
        )));
    };
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
    let body = bytes
        .get(SEAL_BYTES..SEAL_BYTES.saturating_add(len))
        .ok_or_else(|| refuse(format!("a length of {len} bytes past the area's end")))?;
    if xxhash_rust::xxh3::xxh3_64(body) != sum {
        return Err(refuse(
            "checksum mismatch (still arriving, or overwritten while read)".into(),
        ));
    }
    decode(what, body, limit)
}

/// Incremental checksum of a program file (xxh3, 64 bit).
#[derive(Clone, Default)]
pub struct Checksum(xxhash_rust::xxh3::Xxh3);

impl Checksum {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes)
    }
    pub fn finish(&self) -> u64 {
        self.0.digest()
    }
}

#[cfg(test)]
mod tests;
