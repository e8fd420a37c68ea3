//! The cluster file (TOML): the nodes, the backend and the tunables every daemon reads.
//!
//! ```toml
//! [cluster]
//! name = "demo"
//! backend = "tcp"
//! timeslice_ms = 1.0
//! control_socket = "/run/storm/mm.sock"
//! state_dir = "/var/lib/storm"
//!
//! [mm]
//! address = "10.0.0.1:7000"
//!
//! [[node]]
//! name = "node0"
//! address = "10.0.0.10:7001"
//! spool = "/var/spool/storm"
//! cpus = 16
//! ```
//!
//! Everything but the nodes and addresses has a default; unknown keys are errors (a typo
//! should not be silently ignored).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use storm_primitives::NodeId;
use storm_primitives::tcp::TcpConfig;
use storm_primitives::tcp::auth::{ClusterKey, Protection};

/// Why a cluster file is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read cluster file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cluster file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cluster file: {0}")]
    Invalid(String),
}

/// Which implementation of the primitives the daemons use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// TCP trees: any IP network.
    Tcp,
    /// libfabric: RDMA writes and network atomics (verbs;ofi_rxm on InfiniBand).
    Ofi,
    /// Every node a thread of one process sharing one fabric (`storm-local`): a cluster for
    /// one machine without sockets between its daemons.
    Local,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(BackendKind::Tcp),
            "ofi" => Ok(BackendKind::Ofi),
            "local" => Ok(BackendKind::Local),
            other => Err(format!(
                "unknown backend {other:?} (expected tcp, ofi or local)"
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    pub name: String,
    pub backend: BackendKind,
    /// The heartbeat period: the MM acts only at these boundaries.
    pub timeslice_ms: f64,
    /// Unix socket where the MM takes requests from storm-submit and storm.
    pub control_socket: PathBuf,
    /// Jobs that may run at once (sizes the per-job areas of global memory).
    pub max_jobs: usize,
    /// Tasks one node may run for one job.
    pub max_tasks_per_node: usize,
    /// Heartbeat queue: slots and bytes per slot.
    pub heartbeat_slots: usize,
    pub heartbeat_bytes: usize,
    /// Program transfer (Algorithm 6): bytes per chunk and slots in the chunk queue. Eight
    /// slots, not the paper's two: on tcp an AWAIT-SPACE check travels behind the chunks
    /// already on their way, so a producer that may run only two chunks ahead waits a whole
    /// chunk's journey for every chunk (docs/architecture.md, "Job launch").
    pub transfer_chunk_bytes: usize,
    pub transfer_slots: usize,
    /// Program transfers that may run at once (on disjoint nodes).
    pub max_transfers: usize,
    /// Output queue from each node to the MM: slots and bytes per slot.
    pub output_slots: usize,
    pub output_bytes: usize,
    /// MPI jobs (PMI): bytes of one node's puts to one fence, and of a job's whole key space
    /// as the MM sends it back (docs/mpi.md).
    pub pmi_node_bytes: usize,
    pub pmi_job_bytes: usize,
    /// After SIGTERM, how long a cancelled job has before SIGKILL.
    pub kill_wait_ms: u64,
    /// The storm-pl binary; by default the one next to storm-nm.
    pub pl_path: Option<PathBuf>,
    /// The PMI-1 client library Open MPI loads (`storm-submit --mpi openmpi`); by default
    /// `libstorm_pmi.so` next to storm-nm.
    pub pmi_library: Option<PathBuf>,
    /// Where the MM keeps its journal (jobs, results, drains) and the programs of waiting
    /// jobs, so that a restarted MM loses nothing it accepted.
    pub state_dir: PathBuf,
    /// The secret every daemon of the cluster shares (`storm keygen`). By default
    /// `storm.key` next to the cluster file; a relative path is taken from there too.
    pub key_file: Option<PathBuf>,
    /// The MM's secret signing key (`storm keygen --mm`), on the MM's host only; by default
    /// `mm.key` next to the cluster file (see [`crate::identity`]).
    pub mm_key_file: Option<PathBuf>,
    /// The MM's public key, on every node: NMs carry out only what it sealed. By default
    /// `mm.pub` next to the cluster file.
    pub mm_public_key_file: Option<PathBuf>,
    /// This node's secret identity key (`storm keygen --node NAME`); `{node}` stands for the
    /// node's name. By default `node.key` next to the cluster file.
    pub node_key_file: Option<PathBuf>,
    /// The nodes' public identity keys, enrolled at the MM (`NAME KEY` per line); by default
    /// `nodes.pub` next to the cluster file.
    pub enrolled_file: Option<PathBuf>,
    /// Which cgroups confine each job's processes on the nodes (`auto`: v2 where the host
    /// is v2 only, else v1 where it has v1 controllers, else v2; `none`: process groups
    /// only).
    pub cgroups: CgroupMode,
    /// How PMIx clients prove their account to the node's PMIx server (docs/mpi.md, PMIx).
    pub pmix: PmixSecurity,
    /// The account a root NM runs its PMIx helper as (never root; no job of it is served
    /// PMIx). A dedicated account is best: any process of it can stop the helper.
    pub pmix_user: String,
    /// How a job's ranks are bound to CPUs when storm-submit does not say (`--cpu-bind`):
    /// `cores` (each rank its own CPUs), `rank` or `none` (docs/mpi.md). An embedded local
    /// cluster whose pretend nodes share the host's CPUs is written with `none`.
    pub cpu_bind: crate::cpu_bind::CpuBind,
}

/// How a PMIx client proves which account it runs as (`[cluster] pmix`). The PMIx library
/// takes its clients over loopback TCP, where the kernel vouches for no one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PmixSecurity {
    /// A MUNGE credential, checked by the node's munged; without munged, PMIx is not served.
    #[default]
    Munge,
    /// The account the client says it runs as: any local user can pose as a rank of any
    /// job on the node (its data, its fences, its abort). Only for a node no one else uses.
    Native,
    /// PMIx is not served (PMI-1 and PMI-2 still are).
    Off,
}

/// The cgroup version jobs are confined with (`[cluster] cgroups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    #[default]
    Auto,
    V1,
    V2,
    None,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            name: "storm".into(),
            backend: BackendKind::Tcp,
            timeslice_ms: 1.0,
            control_socket: PathBuf::from("/run/storm/mm.sock"),
            max_jobs: 32,
            max_tasks_per_node: 64,
            heartbeat_slots: 16,
            heartbeat_bytes: 64 * 1024,
            transfer_chunk_bytes: 512 * 1024,
            transfer_slots: 8,
            max_transfers: 4,
            output_slots: 8,
            output_bytes: 16 * 1024,
            pmi_node_bytes: 32 * 1024,
            pmi_job_bytes: 1024 * 1024,
            kill_wait_ms: 2000,
            pl_path: None,
            pmi_library: None,
            state_dir: PathBuf::from("/var/lib/storm"),
            key_file: None,
            mm_key_file: None,
            mm_public_key_file: None,
            node_key_file: None,
            enrolled_file: None,
            cgroups: CgroupMode::Auto,
            pmix: PmixSecurity::Munge,
            pmix_user: "nobody".into(),
            cpu_bind: crate::cpu_bind::CpuBind::Cores,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpSection {
    pub fanout: usize,
    pub chunk_bytes: usize,
    pub op_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Data unacknowledged this long closes the connection (TCP_USER_TIMEOUT): how soon a
    /// node behind a cut link is noticed.
    pub peer_timeout_ms: u64,
    /// Encrypt frames as well as authenticate them (AES-256-GCM): jobs' environments (tokens,
    /// passwords) and output cross the network. On by default; `false` is an explicit
    /// opt-out for a network no one else can read, and the daemons warn about it.
    pub encrypt: bool,
}

impl Default for TcpSection {
    fn default() -> Self {
        let d = TcpConfig::default();
        Self {
            fanout: d.fanout,
            chunk_bytes: d.chunk_size,
            op_timeout_ms: d.op_timeout.as_millis() as u64,
            connect_timeout_ms: d.connect_timeout.as_millis() as u64,
            peer_timeout_ms: d.peer_timeout.as_millis() as u64,
            encrypt: true,
        }
    }
}

/// How the MM schedules jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// First come, first served, space sharing.
    #[default]
    Fcfs,
    /// EASY backfilling (uses `--time`).
    Easy,
    /// Gang scheduling: time slicing over an Ousterhout matrix.
    Gang,
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fcfs" => Ok(PolicyKind::Fcfs),
            "easy" => Ok(PolicyKind::Easy),
            "gang" => Ok(PolicyKind::Gang),
            other => Err(format!(
                "unknown policy {other:?} (expected fcfs, easy or gang)"
            )),
        }
    }
}

/// Scheduling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSection {
    pub policy: PolicyKind,
    /// Time slots of the gang scheduler's matrix (multiprogramming level).
    pub mpl: usize,
    /// Limit given to jobs submitted without `--time` (EASY needs one for every job).
    pub default_time_limit_s: u64,
    /// Each NM appends every schedule it applies to `<spool>/switches.log` (for benchmarks and
    /// tests), one line per switch: `SEQ DONE_NS stop=JOBS cont=JOBS start=JOBS recv=NS
    /// from=SEQ`, with CLOCK_MONOTONIC times of the switch's completion and of the heartbeat's
    /// receipt. `from` is the heartbeat that began the switch: earlier than `SEQ` when the old
    /// slot's tasks took longer than a heartbeat to stop. A line that ends `lease=expired` is
    /// no switch: heartbeat `SEQ`'s lease ran out (`slot_lease`) and the NM stopped `stop`
    /// at `recv`.
    pub switch_log: bool,
    /// Each NM appends every heartbeat it takes to `<spool>/heartbeats.log` (for benchmarks),
    /// one line each: `SEQ RECV_NS`, the CLOCK_MONOTONIC time it took the heartbeat from its
    /// queue.
    pub heartbeat_log: bool,
    /// Run the MM and the NMs under the real-time policy SCHED_FIFO at this priority (1-99;
    /// 0: the normal policy). A heartbeat then preempts the jobs' tasks at once instead of
    /// waiting out their time slice of the kernel's scheduler, which is what keeps the nodes
    /// of a gang in step, and a millisecond quantum real, on busy nodes. The launcher and the
    /// tasks run under the normal policy. On by default (`DEFAULT_DAEMON_RT_PRIORITY`);
    /// it needs root or CAP_SYS_NICE, and without them a daemon warns and runs under the
    /// normal policy, where busy nodes switch up to a kernel time slice apart
    /// (docs/scheduling.md).
    pub daemon_rt_priority: u8,
    /// Gang scheduling: each heartbeat that ends with a switch gives its slot a lease of one
    /// timeslice plus this grace, counted from the node's receipt. A node whose next
    /// heartbeat has not come by then stops the slot's tasks until it comes, so a late (or
    /// lost) heartbeat lets a node run the old slot beside the other nodes' new one for at
    /// most this long. `slot_lease = false` lets the slot run on until the heartbeat comes
    /// (docs/scheduling.md).
    pub slot_lease: bool,
    pub slot_grace_ms: f64,
}

/// The daemons' SCHED_FIFO priority unless the cluster file says otherwise: low among
/// real-time priorities (the kernel's own threads use 50 and up), above every normal task.
pub const DEFAULT_DAEMON_RT_PRIORITY: u8 = 10;

impl Default for SchedulerSection {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Fcfs,
            mpl: 2,
            default_time_limit_s: 24 * 3600,
            switch_log: false,
            heartbeat_log: false,
            daemon_rt_priority: DEFAULT_DAEMON_RT_PRIORITY,
            slot_lease: true,
            slot_grace_ms: 5.0,
        }
    }
}

/// Failure detection (docs/operations.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailureSection {
    /// K: a node that has taken no heartbeat for this many heartbeat periods (and has not
    /// registered back) is DOWN.
    pub missed_heartbeats: u32,
    /// A heartbeat's deadline, in heartbeat periods: a member that has not taken it by then
    /// leaves the heartbeat (unresponsive) and the others go on without it. Less than K.
    pub deadline_heartbeats: u32,
    /// The least a heartbeat's deadline may be, in milliseconds, whatever the period: a
    /// healthy node on a loaded host can go unscheduled for tens of milliseconds (more than
    /// 50 ms was seen on a 2-core host running 8 NMs), and leaving the heartbeat for that
    /// makes it register again and sends a job being started there back to the queue.
    pub deadline_min_ms: u64,
    /// How often the MM checks with COMPARE-AND-WRITE that every member took the heartbeats
    /// delivered to it; one found behind is unresponsive.
    pub check_interval_ms: u64,
    /// After a restart of the MM, how long jobs that ran wait for their nodes to register
    /// again and say they still hold them; a job some of whose nodes did not come back by then
    /// ends, naming them.
    pub readopt_within_ms: u64,
    /// An NM that hears no heartbeat for this long assumes the MM dropped it (or restarted)
    /// and registers again. Longer than any stall of the MM.
    pub rejoin_after_ms: u64,
    /// A node's launcher (storm-pl) that leaves a task request unanswered this long is
    /// stuck (stopped, or starved of processor time): the NM kills it, reports the tasks it
    /// held as killed, and starts a new one for the next task.
    pub launcher_timeout_ms: u64,
    /// A task's process that has not reached its program this long after the launcher
    /// started it (its user stopped it before its exec, say) is killed, and the task fails
    /// with the reason. The launcher never waits for it meanwhile.
    pub task_start_timeout_ms: u64,
}

impl Default for FailureSection {
    fn default() -> Self {
        Self {
            missed_heartbeats: 1000,
            deadline_heartbeats: 10,
            deadline_min_ms: 200,
            check_interval_ms: 100,
            readopt_within_ms: 30_000,
            rejoin_after_ms: 10_000,
            launcher_timeout_ms: 10_000,
            task_start_timeout_ms: 10_000,
        }
    }
}

/// The libfabric backend.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OfiSection {
    /// The provider, e.g. `tcp;ofi_rxm` or `verbs;ofi_rxm`; by default `verbs;ofi_rxm` where an
    /// RDMA device exists, else `tcp;ofi_rxm`.
    pub provider: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmSection {
    /// Where the MM's primitives endpoint listens. With a replicated group (`[[manager]]`)
    /// the section may be left out: each replica listens at its own entry's address.
    pub address: SocketAddr,
}

/// No `[mm]` section: only valid with `[[manager]]` entries, which then give the address.
impl Default for MmSection {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }
}

/// How a replicated MM's replicas keep in touch (`[replication]`; only with `[[manager]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationSection {
    /// The Raft tick: the leader's heartbeat to the other replicas.
    pub heartbeat_ms: u64,
    /// A follower that hears nothing from the leader for this long (up to twice as long,
    /// drawn at random) stands for election. The leader stops acting as the cluster's MM once
    /// it has not heard from a majority for half of it, before anyone can replace it.
    pub election_timeout_ms: u64,
    /// Every this many log entries, the replicas compare a hash of their journals; one that
    /// differs from the majority takes the leader's state (0: never compare).
    pub checksum_every: u64,
    /// Each replica drops the log entries its journal holds durably once the log holds twice
    /// this many, keeping the newest this many (a replica that was away briefly catches up
    /// from them). One that lacks entries the leader dropped takes the leader's state instead.
    pub log_entries_kept: u64,
    /// For measuring only: replicas do not sync their Raft logs before they acknowledge
    /// entries (so a killed replica loses the entries and votes it wrote since its last
    /// checkpoint, up to a second: jobs can be lost or run twice, and two leaders can be
    /// elected in one term). It shows what the sync costs (docs/operations.md).
    pub unsafe_no_log_sync: bool,
}

impl Default for ReplicationSection {
    fn default() -> Self {
        Self {
            heartbeat_ms: 10,
            election_timeout_ms: 100,
            checksum_every: 256,
            log_entries_kept: 4096,
            unsafe_no_log_sync: false,
        }
    }
}

/// One replica of a replicated machine manager (`[[manager]]`): three (2f+1) MMs that keep
/// one journal through Raft; the leader of the moment is the cluster's MM (docs/operations.md,
/// "A replicated manager group").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerEntry {
    pub name: String,
    /// Where this replica's MM endpoint listens while it leads; the NMs try each replica's
    /// in turn until they find the leader.
    pub address: SocketAddr,
    /// Where this replica takes the other replicas' messages (the managers' own fabric).
    pub peer_address: SocketAddr,
    /// This replica's `[cluster] state_dir`, where it differs (replicas sharing a host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// This replica's `[cluster] control_socket`, where it differs (replicas sharing a host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_socket: Option<PathBuf>,
    /// Where the manager side of the control relay beside this replica listens
    /// (`storm-relay --manager --replica NAME`), in place of `[relay] address`: the node
    /// relays try each replica's in turn, and only the leader's takes a user's connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_address: Option<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub name: String,
    /// Where this node's NM listens for the primitives.
    pub address: SocketAddr,
    /// Node-local directory for transferred programs.
    pub spool: PathBuf,
    /// Processors: how many tasks of one job the node runs without `--overcommit` (and how
    /// many `-n` alone puts on it). Default 1, as in Slurm.
    #[serde(default = "one")]
    pub cpus: u32,
    /// Memory jobs may use on the node (`mem = "64G"`); none: what the node has, as its NM
    /// detects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<crate::size::ByteSize>,
    /// What `--constraint` selects the node by (`features = ["ib", "gpu"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// A guest slot (docs/federation.md, lending): this entry is the place in this cluster's
    /// fabric of a node that a peer cluster lends here, not a node of this cluster. It is
    /// down, and given no job, but while that node's guest NM is a member; only jobs that
    /// allow borrowing (`--borrow`) go there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_of: Option<crate::federation::GuestOf>,
}

fn one() -> u32 {
    1
}

/// Who may run jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecuritySection {
    /// Whether root (uid 0) may run jobs, as Slurm allows by default. The MM refuses such
    /// jobs at submission when false, and NMs refuse to start them.
    pub allow_root_jobs: bool,
    /// How often a running daemon checks its key files again (mode and owner), seconds; it
    /// also does on SIGHUP, when it reads its keys again (key rotation, docs/security.md).
    pub key_check_interval_s: u64,
}

impl Default for SecuritySection {
    fn default() -> Self {
        Self {
            allow_root_jobs: true,
            key_check_interval_s: 60,
        }
    }
}

/// What one user may hold at the MM, so that no user can exhaust it for the others. Each limit
/// is checked when something new is asked for; what was accepted before is never dropped for
/// it. The defaults are far above what an interactive user needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Jobs of one user waiting in the queue (not yet started).
    pub max_queued_jobs_per_user: u32,
    /// Size of a program sent with the job, to be copied to the nodes unless it is in place
    /// there (`--no-bcast` sends none).
    pub max_program_bytes: u64,
    /// Total size of the programs the MM holds for one user's unfinished jobs.
    pub max_spooled_bytes_per_user: u64,
    /// Control connections (storm-submit, storm) one user may have open at once.
    pub max_connections_per_user: u32,
    /// Size of one control request.
    pub max_request_bytes: u32,
    /// Bytes of replies (other than output, which is flow-controlled end to end) a client may
    /// leave unread; past it the client is disconnected and its jobs go on without it. In
    /// bytes, not replies: one `storm queue` of a long queue is megabytes.
    pub max_unread_reply_bytes: u64,
    /// Size of a job's name (shown to every user by `storm queue`).
    pub max_job_name_bytes: u32,
    /// Size of a job's arguments and environment together (the kernel's `ARG_MAX` is 2 MiB
    /// with the default stack limit).
    pub max_argument_bytes: u64,
    /// Elements of one job array (`storm batch --array`), as Slurm's MaxArraySize.
    pub max_array_size: u32,
    /// Bytes of arguments and environment the MM holds, in memory and in its journal, for
    /// one user's unfinished jobs (each element of an array counts): without it, a user's
    /// queue of jobs at `max_argument_bytes` each grew the MM by gigabytes.
    pub max_held_request_bytes_per_user: u64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_queued_jobs_per_user: 10_000,
            max_program_bytes: 1 << 30,
            max_spooled_bytes_per_user: 8 << 30,
            max_connections_per_user: 64,
            max_request_bytes: 4 << 20,
            max_unread_reply_bytes: 16 << 20,
            max_job_name_bytes: 256,
            max_argument_bytes: 2 << 20,
            max_array_size: 1001,
            max_held_request_bytes_per_user: 128 << 20,
        }
    }
}

/// How long ended jobs stay in `storm history` (and for `--dependency` on them, and for a
/// submitter that reattaches after an MM restart), as Slurm's `PurgeJobAfter`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistorySection {
    /// Days after its end that a job's record is kept.
    pub keep_days: u32,
    /// The most ended jobs kept whatever their age, oldest dropped first: a bound on the
    /// MM's memory and journal (a record without its environment is about a kilobyte).
    pub max_jobs: usize,
}

impl Default for HistorySection {
    fn default() -> Self {
        Self {
            keep_days: 30,
            max_jobs: 100_000,
        }
    }
}

impl HistorySection {
    /// How long a record is kept after its job ended.
    pub fn keep(&self) -> Duration {
        Duration::from_secs(u64::from(self.keep_days) * 86_400)
    }
}

/// Node monitoring (`[monitoring]`): how often each NM samples its node, and where the CPU
/// and memory figures come from (docs/monitoring.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitoringSection {
    /// The sample period (milliseconds): each NM samples its node and puts the record where
    /// the MM reads it this often.
    pub sample_ms: u64,
    /// Where a node's CPU and memory figures come from: `host` (`/proc`, a node that is a
    /// host of its own) or `node_cgroup` (the node's cgroup subtree, for nodes that share one
    /// kernel, as on the namespace testbed and an embedded cluster).
    pub source: crate::sample::Source,
    /// How far back the MM keeps each node's samples (seconds; 0: none), for `storm nodes
    /// --history`: 12 bytes per node and sample.
    pub history_s: u64,
    /// Where sysfs is mounted: the NM reads the fabric ports' counters under
    /// `SYSFS/class/infiniband` (as node_exporter's `--path.sysfs`, for an NM that sees the
    /// host's sysfs elsewhere).
    pub sysfs: std::path::PathBuf,
}

impl Default for MonitoringSection {
    fn default() -> Self {
        Self {
            sample_ms: 1000,
            source: crate::sample::Source::Host,
            history_s: 3600,
            sysfs: "/sys".into(),
        }
    }
}

impl MonitoringSection {
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.sample_ms)
    }

    /// Samples each node's history holds.
    pub fn history_points(&self) -> usize {
        (self.history_s.saturating_mul(1000) / self.sample_ms.max(1)) as usize
    }
}

/// The control relay (`storm-relay`): how users on the compute nodes reach the MM, whose
/// control socket is a Unix socket on its own host. One `storm-relay --manager` beside the MM
/// listens on `address`; one `storm-relay --node NAME` on each node takes local users'
/// connections on `socket` and carries them there, proving which node it is with the
/// cluster key and its identity key (docs/security.md, "The control relay").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySection {
    /// Where the manager side listens; no relay when absent.
    pub address: Option<SocketAddr>,
    /// The node side's Unix socket, which jobs' tasks get as `STORM_SOCKET`; `{node}` stands
    /// for the node's name (for clusters whose nodes share one file system).
    pub socket: PathBuf,
    /// Whether root on a node (and the MM's own user there) acts as an operator of the
    /// whole cluster through the relay. Off by default: root of one node is then an ordinary
    /// user of the cluster, and cannot drain nodes, cancel other users' jobs, or run jobs as
    /// root through the relay.
    pub root_from_nodes: bool,
    /// The lowest uid a relay may act for, root apart (root's rights through a relay are
    /// `root_from_nodes`'). Root of a compute node holds that node's keys and can name any
    /// user through its relay: system accounts below this (`daemon`, `mail`, `www-data`...),
    /// which own system files, are not reached that way. 1000 is Debian's first user.
    pub min_uid: u32,
}

impl Default for RelaySection {
    fn default() -> Self {
        Self {
            address: None,
            socket: PathBuf::from("/run/storm/relay.sock"),
            root_from_nodes: false,
            min_uid: 1000,
        }
    }
}

impl RelaySection {
    /// The node side's socket on node `name`.
    pub fn socket_of(&self, name: &str) -> PathBuf {
        crate::identity::key_path(Path::new(""), &self.socket, Some(name))
    }
}

/// Distinct node features a cluster may have (`--constraint` selects by them).
pub const MAX_FEATURES: usize = 63;

/// The feature bit of a cluster's own nodes (not guest slots) in a file that names guest
/// slots: a job that does not allow borrowing asks for it, and so goes on own nodes only
/// (the last bit, which no named feature takes).
pub const OWN_NODE_BIT: u64 = 1 << 63;

/// A whole cluster file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub cluster: ClusterSection,
    #[serde(default)]
    pub tcp: TcpSection,
    #[serde(default)]
    pub security: SecuritySection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub ofi: OfiSection,
    #[serde(default)]
    pub scheduler: SchedulerSection,
    #[serde(default)]
    pub failure: FailureSection,
    #[serde(default)]
    pub history: HistorySection,
    #[serde(default)]
    pub relay: RelaySection,
    #[serde(default)]
    pub mm: MmSection,
    #[serde(default)]
    pub replication: ReplicationSection,
    #[serde(default)]
    pub monitoring: MonitoringSection,
    #[serde(default)]
    pub health: crate::health::HealthSection,
    #[serde(default)]
    pub federation: crate::federation::FederationSection,
    /// Peer clusters (docs/federation.md).
    #[serde(rename = "peer", default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<crate::federation::PeerEntry>,
    /// The replicas of a replicated MM, if the cluster runs one (none: a single MM at
    /// `[mm] address`).
    #[serde(rename = "manager", default, skip_serializing_if = "Vec::is_empty")]
    pub managers: Vec<ManagerEntry>,
    /// One entry per node; in the file, a `[[node]]` table may name many (see [`NodeTable`]).
    #[serde(rename = "node", default, deserialize_with = "expand_nodes")]
    pub nodes: Vec<NodeEntry>,
}

/// A `[[node]]` table as written: `name` and `address` may be hostlist expressions
/// (`name = "node[0000-1023]"`, `address = "10.1.[0-3].[1-254]:7001"`), one node per name.
/// An address that expands to one entry is used by every name (valid only with port 0, for
/// single-host testing); otherwise both must expand to the same count, paired in order.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeTable {
    name: String,
    address: String,
    /// Required of a cluster's own file ([`ClusterConfig::validate`]); a guest file names
    /// none (its guests' spool is the lender's).
    #[serde(default)]
    spool: PathBuf,
    #[serde(default = "one")]
    cpus: u32,
    #[serde(default)]
    mem: Option<crate::size::ByteSize>,
    #[serde(default)]
    features: Vec<String>,
    /// A guest slot's lender (one node per table: two slots never stand for one node).
    #[serde(default)]
    guest_of: Option<crate::federation::GuestOf>,
}

fn expand_nodes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<NodeEntry>, D::Error> {
    use serde::de::Error;
    let tables = Vec::<NodeTable>::deserialize(d)?;
    let mut nodes = Vec::new();
    for t in tables {
        let names = crate::hostlist::expand(&t.name).map_err(D::Error::custom)?;
        let addresses = crate::hostlist::expand(&t.address).map_err(D::Error::custom)?;
        if addresses.len() != 1 && addresses.len() != names.len() {
            return Err(D::Error::custom(format!(
                "node name {:?} stands for {} nodes but address {:?} for {} addresses",
                t.name,
                names.len(),
                t.address,
                addresses.len()
            )));
        }
        for (i, name) in names.into_iter().enumerate() {
            let text = &addresses[i.min(addresses.len() - 1)];
            let address = text
                .parse()
                .map_err(|e| D::Error::custom(format!("node {name}: address {text:?}: {e}")))?;
            nodes.push(NodeEntry {
                name,
                address,
                spool: t.spool.clone(),
                cpus: t.cpus,
                mem: t.mem,
                features: t.features.clone(),
                guest_of: t.guest_of.clone(),
            });
        }
        if nodes.len() > crate::hostlist::MAX_EXPANSION {
            return Err(D::Error::custom(format!(
                "more than {} [[node]] entries",
                crate::hostlist::MAX_EXPANSION
            )));
        }
    }
    Ok(nodes)
}

/// A TOML error in one line: where (line and column) and what, without the snippet that
/// toml's own message draws over several lines.
fn toml_error_line(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}

/// The longest name of a cluster, node or peer (bytes): a guest's lease grant, which names
/// three, must fit its registration (`messages::LEASE_GRANT_BYTES`).
pub const MAX_NAME_BYTES: usize = 255;

/// The most replicas a replicated MM may have (each commit waits for a majority of them).
pub const MAX_MANAGERS: usize = 7;

/// Where the daemons and the commands look for the cluster file by default.
pub const DEFAULT_CLUSTER_FILE: &str = "/etc/storm/cluster.toml";

impl ClusterConfig {
    /// Reads and validates a cluster file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let c = &mut cfg.cluster;
        for (file, default) in [
            (&mut c.key_file, crate::key::DEFAULT_NAME),
            (&mut c.mm_key_file, "mm.key"),
            (&mut c.mm_public_key_file, "mm.pub"),
            (&mut c.node_key_file, "node.key"),
            (&mut c.enrolled_file, "nodes.pub"),
        ] {
            let named = file.take().unwrap_or_else(|| PathBuf::from(default));
            *file = Some(dir.join(named));
        }
        for p in &mut cfg.peers {
            p.key_file = dir.join(&p.key_file);
            p.guest_file = p.guest_file.as_ref().map(|f| dir.join(f));
            p.mm_public_key_file = p.mm_public_key_file.as_ref().map(|f| dir.join(f));
        }
        Ok(cfg)
    }

    /// A key file the cluster file names (made absolute by [`ClusterConfig::load`]), or its
    /// default name, with `{node}` replaced by `node`.
    fn key_file(&self, file: &Option<PathBuf>, default: &str, node: Option<&str>) -> PathBuf {
        let pattern = file.clone().unwrap_or_else(|| PathBuf::from(default));
        crate::identity::key_path(Path::new(""), &pattern, node)
    }

    /// The MM's sealer: its signing key (see [`crate::identity`]).
    pub fn load_mm_signer(&self) -> Result<crate::identity::MmSigner, crate::key::KeyError> {
        let path = self.key_file(&self.cluster.mm_key_file, "mm.key", None);
        let key = crate::identity::load(&path, crate::key::MM_KEY)?;
        Ok(crate::identity::MmSigner::new(key, &self.cluster.name))
    }

    /// The key of the managers' own links (a replicated MM): derived from the MM's signing
    /// key, which every replica holds and no compute node does, so that a node holding only
    /// the cluster key cannot pass for a replica.
    pub fn load_group_key(&self) -> Result<ClusterKey, crate::key::KeyError> {
        let path = self.key_file(&self.cluster.mm_key_file, "mm.key", None);
        let key = crate::identity::load(&path, crate::key::MM_KEY)?;
        Ok(ClusterKey::from_bytes(blake3::derive_key(
            "storm manager group links 2026",
            &key.to_bytes(),
        )))
    }

    /// What nodes check the MM's seals with: its public key.
    pub fn load_mm_verifier(&self) -> Result<crate::identity::MmVerifier, String> {
        let path = self.key_file(&self.cluster.mm_public_key_file, "mm.pub", None);
        let keys = crate::identity::load_public(&path)?;
        Ok(crate::identity::MmVerifier::with_keys(
            keys,
            &self.cluster.name,
        ))
    }

    /// Node `name`'s identity key.
    pub fn load_node_key(
        &self,
        name: &str,
    ) -> Result<ed25519_dalek::SigningKey, crate::key::KeyError> {
        let path = self.key_file(&self.cluster.node_key_file, "node.key", Some(name));
        crate::identity::load(&path, crate::key::NODE_KEY)
    }

    /// Where node `name`'s identity key is.
    pub fn node_key_path(&self, name: &str) -> PathBuf {
        self.key_file(&self.cluster.node_key_file, "node.key", Some(name))
    }

    /// Where the cluster key is.
    pub fn key_path(&self) -> PathBuf {
        self.key_file(&self.cluster.key_file, crate::key::DEFAULT_NAME, None)
    }

    /// Where the MM's keys are: (secret, public).
    pub fn mm_key_paths(&self) -> (PathBuf, PathBuf) {
        (
            self.key_file(&self.cluster.mm_key_file, "mm.key", None),
            self.key_file(&self.cluster.mm_public_key_file, "mm.pub", None),
        )
    }

    /// Where the enrolled nodes' keys are.
    pub fn enrolled_path(&self) -> PathBuf {
        self.key_file(&self.cluster.enrolled_file, "nodes.pub", None)
    }

    /// The nodes enrolled at the MM; every node of the cluster must be.
    pub fn load_enrolled(&self) -> Result<crate::identity::Enrolled, String> {
        let enrolled = crate::identity::Enrolled::load(&self.enrolled_path())?;
        let missing: Vec<&str> = self
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .filter(|n| enrolled.key(n).is_none())
            .take(5)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "{}: no identity key enrolled for node {} (run `storm keygen --node NAME` on \
                 the node and add the line it prints)",
                self.enrolled_path().display(),
                missing.join(", ")
            ));
        }
        Ok(enrolled)
    }

    /// Reads the cluster key (see [`crate::key`]). A config parsed from text rather than
    /// loaded from a file must name its `key_file`.
    pub fn load_key(&self) -> Result<ClusterKey, crate::key::KeyError> {
        let path = self
            .cluster
            .key_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::key::DEFAULT_NAME));
        crate::key::load(&path)
    }

    /// Parses and validates cluster-file text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut cfg: ClusterConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: toml_error_line(text, &e),
        })?;
        cfg.default_mm_address();
        cfg.validate()?;
        Ok(cfg)
    }

    /// A group's NMs dial the first replica until they find the leader: its address is the
    /// MM's when `[mm]` is not set.
    pub fn default_mm_address(&mut self) {
        if self.mm == MmSection::default()
            && let Some(first) = self.managers.first()
        {
            self.mm.address = first.address;
        }
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config always serialises")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.nodes.is_empty() {
            return bad("no [[node]] entries: a cluster needs at least one node".into());
        }
        let names = std::iter::once(("cluster", &self.cluster.name))
            .chain(self.nodes.iter().map(|n| ("node", &n.name)))
            .chain(self.peers.iter().map(|p| ("[[peer]]", &p.name)));
        for (what, name) in names {
            if name.len() > MAX_NAME_BYTES {
                return bad(format!(
                    "{what} name {:?}... is {} bytes: at most {MAX_NAME_BYTES}",
                    name.chars().take(20).collect::<String>(),
                    name.len()
                ));
            }
        }
        if let Some(n) = self.nodes.iter().find(|n| n.spool.as_os_str().is_empty()) {
            return bad(format!(
                "node {} has no spool (the directory its NM keeps programs in)",
                n.name
            ));
        }
        crate::federation::validate(&self.cluster.name, &self.federation, &self.peers)
            .map_err(ConfigError::Invalid)?;
        self.validate_guest_slots().map_err(ConfigError::Invalid)?;
        let c = &self.cluster;
        let features = self.features();
        let lenders = self.lenders().len();
        if features.len() + lenders > MAX_FEATURES {
            return bad(format!(
                "the nodes have {} features in all, and the guest slots stand for {lenders} \
                 lending clusters; at most {MAX_FEATURES} of both are allowed",
                features.len()
            ));
        }
        if let Some(f) = features
            .iter()
            .find(|f| f.is_empty() || f.contains(['&', ',', '|', ' ', '[', ']', '*']))
        {
            return bad(format!(
                "feature {f:?}: a feature is a non-empty name without & , | [ ] * or spaces"
            ));
        }
        let h = &self.health;
        if h.program_every_ms < 1000 || h.program_timeout_ms == 0 {
            return bad(format!(
                "[health] program_every_ms = {} must be at least 1000, and program_timeout_ms \
                 = {} above 0",
                h.program_every_ms, h.program_timeout_ms
            ));
        }
        if let Some(p) = h.program.as_ref().filter(|p| !p.is_absolute()) {
            return bad(format!("[health] program = {p:?} must be an absolute path"));
        }
        if self.monitoring.history_s > 7 * 86_400 {
            return bad(format!(
                "[monitoring] history_s = {} is more than a week (604800)",
                self.monitoring.history_s
            ));
        }
        if !(10..=3_600_000).contains(&self.monitoring.sample_ms) {
            return bad(format!(
                "[monitoring] sample_ms = {} must be between 10 and 3600000",
                self.monitoring.sample_ms
            ));
        }
        if !(c.timeslice_ms > 0.0 && c.timeslice_ms <= 60_000.0) {
            return bad(format!(
                "timeslice_ms = {} must be in (0, 60000]",
                c.timeslice_ms
            ));
        }
        // Counts size tables, events and threads before any memory is laid out: each has a
        // ceiling far above any real cluster's and far below what a typo can ask for.
        for (name, v, most) in [
            ("max_jobs", c.max_jobs, 1 << 16),
            ("max_tasks_per_node", c.max_tasks_per_node, 1 << 16),
            ("heartbeat_slots", c.heartbeat_slots, 1 << 16),
            ("heartbeat_bytes", c.heartbeat_bytes, usize::MAX),
            ("transfer_chunk_bytes", c.transfer_chunk_bytes, usize::MAX),
            ("transfer_slots", c.transfer_slots, 1 << 16),
            ("max_transfers", c.max_transfers, 256),
            ("output_slots", c.output_slots, 1 << 16),
            ("output_bytes", c.output_bytes, usize::MAX),
            ("pmi_node_bytes", c.pmi_node_bytes, 1 << 26),
            ("pmi_job_bytes", c.pmi_job_bytes, 1 << 30),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
            if v > most {
                return bad(format!(
                    "{name} = {v} is more than the {most} storm supports"
                ));
            }
        }
        let l = &self.limits;
        for (name, v) in [
            (
                "max_queued_jobs_per_user",
                l.max_queued_jobs_per_user as u64,
            ),
            ("max_program_bytes", l.max_program_bytes),
            ("max_spooled_bytes_per_user", l.max_spooled_bytes_per_user),
            (
                "max_connections_per_user",
                l.max_connections_per_user as u64,
            ),
            ("max_unread_reply_bytes", l.max_unread_reply_bytes),
            ("max_job_name_bytes", l.max_job_name_bytes as u64),
            ("max_argument_bytes", l.max_argument_bytes),
            ("max_array_size", l.max_array_size as u64),
            (
                "max_held_request_bytes_per_user",
                l.max_held_request_bytes_per_user,
            ),
        ] {
            if v == 0 {
                return bad(format!("[limits] {name} must be at least 1"));
            }
        }
        if !(4096..=crate::control::MAX_FRAME as u32).contains(&l.max_request_bytes) {
            return bad(format!(
                "[limits] max_request_bytes = {} must be in 4096..={}",
                l.max_request_bytes,
                crate::control::MAX_FRAME
            ));
        }
        if self.scheduler.mpl == 0 || self.scheduler.mpl > 64 {
            return bad(format!(
                "[scheduler] mpl = {} must be in 1..=64",
                self.scheduler.mpl
            ));
        }
        let grace = self.scheduler.slot_grace_ms;
        if !(0.0..=60_000.0).contains(&grace) {
            return bad(format!(
                "[scheduler] slot_grace_ms = {grace} must be in [0, 60000]"
            ));
        }
        if self.scheduler.default_time_limit_s == 0 {
            return bad("[scheduler] default_time_limit_s must be at least 1".into());
        }
        if c.heartbeat_bytes < 1024 {
            return bad("heartbeat_bytes must be at least 1024".into());
        }
        let f = &self.failure;
        if f.missed_heartbeats == 0
            || f.deadline_heartbeats == 0
            || f.check_interval_ms == 0
            || f.readopt_within_ms == 0
        {
            return bad(
                "[failure] missed_heartbeats, deadline_heartbeats, check_interval_ms and \
                 readopt_within_ms must be at least 1"
                    .into(),
            );
        }
        if self.heartbeat_deadline() >= self.timeslice() * f.missed_heartbeats {
            return bad(format!(
                "[failure] a heartbeat's deadline ({} ms: deadline_heartbeats = {} periods, at \
                 least deadline_min_ms = {}) must be shorter than missed_heartbeats = {} \
                 periods: a member must leave the heartbeat before it counts as DOWN",
                self.heartbeat_deadline().as_millis(),
                f.deadline_heartbeats,
                f.deadline_min_ms,
                f.missed_heartbeats
            ));
        }
        if self.scheduler.daemon_rt_priority > 99 {
            return bad(format!(
                "[scheduler] daemon_rt_priority = {} is not a SCHED_FIFO priority (1-99, or 0 \
                 for the normal policy)",
                self.scheduler.daemon_rt_priority
            ));
        }
        if f.task_start_timeout_ms == 0 {
            return bad("[failure] task_start_timeout_ms must be at least 1".into());
        }
        if f.launcher_timeout_ms == 0 {
            return bad(
                "[failure] launcher_timeout_ms must be at least 1: a launcher needs some time \
                 to take a task"
                    .into(),
            );
        }
        if f.rejoin_after_ms <= self.tcp.peer_timeout_ms {
            return bad(format!(
                "[failure] rejoin_after_ms = {} must exceed [tcp] peer_timeout_ms = {}: an NM \
                 would leave a cluster that is only waiting for a failed peer",
                f.rejoin_after_ms, self.tcp.peer_timeout_ms
            ));
        }
        self.tcp_config(ClusterKey::from_bytes([0; 32]))
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("[tcp] {e}")))?;
        if self.mm == MmSection::default() && self.managers.is_empty() {
            return bad("no [mm] address: the cluster file must say where the MM listens".into());
        }
        self.validate_managers()?;
        let mut names = HashSet::new();
        let mut addrs = HashSet::from([self.mm.address]);
        for n in &self.nodes {
            if n.name.is_empty() {
                return bad("a node has an empty name".into());
            }
            if !names.insert(&n.name) {
                return bad(format!("node name {:?} appears twice", n.name));
            }
            if !addrs.insert(n.address) && n.address.port() != 0 {
                return bad(format!("address {} is used twice", n.address));
            }
            if n.cpus == 0 {
                return bad(format!("node {} has cpus = 0", n.name));
            }
        }
        Ok(())
    }

    /// The `[[manager]]` entries: distinct names and addresses, an odd count of at most
    /// [`MAX_MANAGERS`], on the tcp backend.
    fn validate_managers(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let m = &self.managers;
        if m.is_empty() {
            return Ok(());
        }
        if m.len() > MAX_MANAGERS {
            return bad(format!(
                "{} [[manager]] entries: a group has at most {MAX_MANAGERS} replicas",
                m.len()
            ));
        }
        if m.len() % 2 == 0 {
            return bad(format!(
                "{} [[manager]] entries: a group needs an odd count (2f+1 replicas survive f \
                 failures; an even count survives no more than one fewer)",
                m.len()
            ));
        }
        let r = &self.replication;
        if r.heartbeat_ms == 0 || r.election_timeout_ms < 4 * r.heartbeat_ms {
            return bad(format!(
                "[replication] election_timeout_ms = {} must be at least 4 heartbeats \
                 (heartbeat_ms = {}, at least 1)",
                r.election_timeout_ms, r.heartbeat_ms
            ));
        }
        if self.cluster.backend != BackendKind::Tcp {
            return bad(format!(
                "[[manager]] entries need backend \"tcp\": a replicated MM on {:?} is not \
                 supported yet (docs/operations.md)",
                self.cluster.backend
            ));
        }
        let mut names = HashSet::new();
        let mut addrs = HashSet::new();
        for e in m {
            if e.name.is_empty() {
                return bad("a [[manager]] entry has an empty name".into());
            }
            if !names.insert(&e.name) {
                return bad(format!("manager name {:?} appears twice", e.name));
            }
            for a in [e.address, e.peer_address] {
                if !addrs.insert(a) || self.nodes.iter().any(|n| n.address == a) {
                    return bad(format!("address {a} is used twice"));
                }
            }
        }
        let with_relay = m.iter().filter(|e| e.relay_address.is_some()).count();
        if with_relay > 0 {
            if let Some(e) = m.iter().find(|e| e.relay_address.is_none()) {
                return bad(format!(
                    "manager {:?} has no relay_address while others have one: give every \
                     [[manager]] entry a relay_address, or none",
                    e.name
                ));
            }
            if let Some(a) = self.relay.address {
                return bad(format!(
                    "[relay] address = {a} and the [[manager]] entries' relay_address both say \
                     where the manager-side relay listens: keep one"
                ));
            }
            for a in m.iter().filter_map(|e| e.relay_address) {
                if !addrs.insert(a) || self.nodes.iter().any(|n| n.address == a) {
                    return bad(format!("address {a} is used twice"));
                }
            }
        }
        if !m.iter().any(|e| e.address == self.mm.address) {
            return bad(format!(
                "[mm] address {} is none of the [[manager]] entries' addresses (leave [mm] out \
                 with a replicated group)",
                self.mm.address
            ));
        }
        Ok(())
    }

    /// Whether the MM is a replicated group.
    pub fn replicated(&self) -> bool {
        !self.managers.is_empty()
    }

    /// Replica `name`'s index among the `[[manager]]` entries (a name, or an index).
    pub fn manager_by_name(&self, name: &str) -> Result<usize, String> {
        self.managers
            .iter()
            .position(|m| m.name == name)
            .or_else(|| {
                name.parse::<usize>()
                    .ok()
                    .filter(|&i| i < self.managers.len())
            })
            .ok_or_else(|| {
                format!(
                    "no manager {name:?} in the cluster file (its [[manager]] entries: {})",
                    self.managers
                        .iter()
                        .map(|m| m.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    /// The cluster as replica `index` sees it: its own endpoint address, state directory and
    /// control socket in `[mm]` and `[cluster]`.
    pub fn as_manager(&self, index: usize) -> ClusterConfig {
        let mut cfg = self.clone();
        if let Some(m) = self.managers.get(index) {
            cfg.mm.address = m.address;
            if let Some(d) = &m.state_dir {
                cfg.cluster.state_dir = d.clone();
            }
            if let Some(s) = &m.control_socket {
                cfg.cluster.control_socket = s.clone();
            }
        }
        cfg
    }

    /// Every control socket a client may find the MM on: the replicas' in order, or the one
    /// MM's.
    pub fn control_sockets(&self) -> Vec<PathBuf> {
        if self.managers.is_empty() {
            return vec![self.cluster.control_socket.clone()];
        }
        (0..self.managers.len())
            .map(|i| self.as_manager(i).cluster.control_socket)
            .collect()
    }

    /// Where the manager side of the control relay may listen, in the order node relays try
    /// them: every replica's `relay_address`, or `[relay] address` (empty: no relay).
    pub fn relay_addresses(&self) -> Vec<SocketAddr> {
        let per_replica: Vec<SocketAddr> = self
            .managers
            .iter()
            .filter_map(|m| m.relay_address)
            .collect();
        if per_replica.is_empty() {
            self.relay.address.into_iter().collect()
        } else {
            per_replica
        }
    }

    /// Every address the MM's endpoint may be at: the replicas' in order, or the one MM's.
    pub fn mm_addresses(&self) -> Vec<SocketAddr> {
        if self.managers.is_empty() {
            return vec![self.mm.address];
        }
        self.managers.iter().map(|m| m.address).collect()
    }

    /// Compute nodes in the cluster.
    pub fn node_count(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// What the cluster offers a job: its nodes, their CPUs and the per-node task limit.
    pub fn capacity(&self) -> crate::tasks::Capacity {
        let cpus = self.nodes.iter().map(|n| n.cpus);
        crate::tasks::Capacity {
            nodes: self.node_count(),
            cpus_per_node: cpus.clone().min().unwrap_or(1),
            max_cpus_per_node: cpus.max().unwrap_or(1),
            max_tasks_per_node: self.cluster.max_tasks_per_node as u32,
        }
    }

    /// Every feature a node of the cluster has, each once, in order: feature `i` is bit `i`
    /// of [`ClusterConfig::feature_mask`].
    pub fn features(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .nodes
            .iter()
            .flat_map(|n| n.features.iter().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The bits of `wanted` (`--constraint`), or which feature no node has.
    pub fn feature_mask(&self, wanted: &[String]) -> Result<u64, String> {
        let all = self.features();
        let mut mask = 0u64;
        for w in wanted {
            match all.iter().position(|f| f == w) {
                Some(i) if i < MAX_FEATURES => mask |= 1 << i,
                _ => {
                    return Err(format!(
                        "--constraint {w}: no node of cluster {:?} has feature {w:?} (it has: {})",
                        self.cluster.name,
                        if all.is_empty() {
                            "none".to_string()
                        } else {
                            all.join(", ")
                        }
                    ));
                }
            }
        }
        Ok(mask)
    }

    /// Each node's features as bits (see [`ClusterConfig::features`]); where the file names
    /// guest slots, the cluster's own nodes also have [`OWN_NODE_BIT`], and each slot its
    /// lender's bit ([`ClusterConfig::lender_bit`]).
    pub fn node_feature_masks(&self) -> Vec<u64> {
        let guests = self.has_guest_slots();
        self.nodes
            .iter()
            .map(|n| {
                let place = match &n.guest_of {
                    Some(g) => self.lender_bit(&g.cluster),
                    None if guests => OWN_NODE_BIT,
                    None => 0,
                };
                self.feature_mask(&n.features).unwrap_or(0) | place
            })
            .collect()
    }

    /// The clusters this file's guest slots stand for nodes of, in the file's order.
    pub fn lenders(&self) -> Vec<&str> {
        let mut all: Vec<&str> = Vec::new();
        for g in self.nodes.iter().filter_map(|n| n.guest_of.as_ref()) {
            if !all.contains(&g.cluster.as_str()) {
                all.push(&g.cluster);
            }
        }
        all
    }

    /// The feature bit every guest slot of lender `cluster` has (0: no slot stands for its
    /// nodes): the bits below [`OWN_NODE_BIT`], downwards, one per lender, so that
    /// `--one-cluster` keeps a job on one lender's nodes. Named features take the bits from
    /// the bottom; validation keeps the two apart.
    pub fn lender_bit(&self, cluster: &str) -> u64 {
        self.lenders()
            .iter()
            .position(|c| *c == cluster)
            .map_or(0, |i| OWN_NODE_BIT >> (1 + i))
    }

    /// Whether node `id` is a guest slot (a node a peer lends here), not one of this
    /// cluster's own.
    pub fn is_guest(&self, id: NodeId) -> bool {
        self.nodes
            .get(id as usize)
            .is_some_and(|n| n.guest_of.is_some())
    }

    /// Whether the file names any guest slot.
    pub fn has_guest_slots(&self) -> bool {
        self.nodes.iter().any(|n| n.guest_of.is_some())
    }

    /// This cluster's own nodes (guest slots left out).
    pub fn home_node_count(&self) -> u32 {
        self.nodes.iter().filter(|n| n.guest_of.is_none()).count() as u32
    }

    /// The guest slot that stands for node `node` of peer `cluster`.
    pub fn guest_slot(&self, cluster: &str, node: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| {
                n.guest_of
                    .as_ref()
                    .is_some_and(|g| g.cluster == cluster && g.node == node)
            })
            .map(|i| i as NodeId)
    }

    /// Guest slots stand for nodes of peers this cluster may borrow from, each node once, and
    /// the cluster keeps at least one node of its own.
    fn validate_guest_slots(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.nodes {
            let Some(g) = &n.guest_of else { continue };
            let Some(peer) = self.peers.iter().find(|p| p.name == g.cluster && p.borrow) else {
                return Err(format!(
                    "node {}: guest_of cluster {:?} is not a [[peer]] this cluster may borrow \
                     from (borrow = true)",
                    n.name, g.cluster
                ));
            };
            if peer.mm_public_key_file.is_none() {
                return Err(format!(
                    "node {}: [[peer]] {:?} names no mm_public_key_file (its MM's public key), \
                     with which this cluster checks the lease of each node it lends here",
                    n.name, g.cluster
                ));
            }
            if !seen.insert(g) {
                return Err(format!(
                    "node {}: another guest slot already stands for node {} of cluster {}",
                    n.name, g.node, g.cluster
                ));
            }
        }
        if self.home_node_count() == 0 {
            return Err("every [[node]] is a guest slot: a cluster needs a node of its own".into());
        }
        Ok(())
    }

    /// The MM's id in the primitives fabric: one past the last compute node.
    pub fn mm_id(&self) -> NodeId {
        self.nodes.len() as NodeId
    }

    /// Node `id`'s index by name.
    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| i as NodeId)
    }

    /// The node a node daemon runs as: `given` (a name, or an index in the file), else the
    /// node named as this host. The error names what was looked for.
    pub fn this_node(&self, given: Option<&str>) -> Result<NodeId, String> {
        let name = match given {
            Some(n) => n.to_string(),
            None => nix::unistd::gethostname()
                .map_err(|e| format!("reading this host's name (or give --node): {e}"))?
                .to_string_lossy()
                .into_owned(),
        };
        self.node_by_name(&name)
            .or_else(|| {
                name.parse::<NodeId>()
                    .ok()
                    .filter(|&id| id < self.node_count())
            })
            .ok_or_else(|| format!("no node {name:?} in the cluster file"))
    }

    /// Every fabric endpoint's address: compute nodes first, then the MM.
    pub fn directory(&self) -> Vec<Option<SocketAddr>> {
        self.nodes
            .iter()
            .map(|n| Some(n.address))
            .chain(std::iter::once(Some(self.mm.address)))
            .collect()
    }

    /// How long a member has to take a heartbeat (and the bound on every primitive the MM's
    /// loop waits for): `deadline_heartbeats` periods, at least `deadline_min_ms` (and 1 ms).
    pub fn heartbeat_deadline(&self) -> Duration {
        (self.timeslice() * self.failure.deadline_heartbeats)
            .max(Duration::from_millis(self.failure.deadline_min_ms.max(1)))
    }

    pub fn timeslice(&self) -> Duration {
        Duration::from_secs_f64(self.cluster.timeslice_ms / 1000.0)
    }

    /// How long a gang slot may run on a node after the heartbeat that began it, when the
    /// next timeslice runs other jobs (`None`: `slot_lease` is off).
    pub fn slot_lease(&self) -> Option<Duration> {
        self.scheduler.slot_lease.then(|| {
            self.timeslice() + Duration::from_secs_f64(self.scheduler.slot_grace_ms / 1000.0)
        })
    }

    /// How the cluster's tcp links protect their frames (`[tcp] encrypt`).
    pub fn protection(&self) -> Protection {
        if self.tcp.encrypt {
            Protection::Encrypt
        } else {
            Protection::Authenticate
        }
    }

    /// The tcp backend's settings, with the cluster's key.
    pub fn tcp_config(&self, key: ClusterKey) -> TcpConfig {
        TcpConfig {
            fanout: self.tcp.fanout,
            chunk_size: self.tcp.chunk_bytes,
            op_timeout: Duration::from_millis(self.tcp.op_timeout_ms),
            connect_timeout: Duration::from_millis(self.tcp.connect_timeout_ms),
            peer_timeout: Duration::from_millis(self.tcp.peer_timeout_ms),
            key,
            protection: self.protection(),
            ..TcpConfig::default()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const SMALL: &str = r#"
        [cluster]
        name = "t"
        [mm]
        address = "127.0.0.1:7000"
        [[node]]
        name = "a"
        address = "127.0.0.1:7001"
        spool = "/tmp/a"
        [[node]]
        name = "b"
        address = "127.0.0.1:7002"
        spool = "/tmp/b"
        cpus = 4
    "#;

    /// A cluster file whose one `[[node]]` table names `n` nodes.
    pub(crate) fn hostlist_file(n: usize) -> String {
        format!(
            r#"
            [cluster]
            name = "big"
            [mm]
            address = "127.0.0.1:7000"
            [[node]]
            name = "node[00000-{:05}]"
            address = "127.0.0.1:0"
            spool = "/tmp/spool"
            cpus = 2
            "#,
            n - 1
        )
    }

    /// [`SMALL`] with a replicated MM of `n` replicas instead of `[mm]`.
    fn group_file(n: usize) -> String {
        let mut text = SMALL.replace("[mm]\n        address = \"127.0.0.1:7000\"", "");
        for i in 0..n {
            text.push_str(&format!(
                "[[manager]]\nname = \"m{i}\"\naddress = \"127.0.0.1:{}\"\npeer_address = \
                 \"127.0.0.1:{}\"\ncontrol_socket = \"/run/m{i}.sock\"\n",
                7100 + i,
                7200 + i
            ));
        }
        text
    }

    /// [`SMALL`] with a peer `p` it may borrow from (`borrow`) and `guests` guest slot
    /// tables after its nodes.
    fn with_guests(borrow: bool, guests: &[(&str, &str, &str)]) -> String {
        let mut text = SMALL.to_string();
        text.push_str(&format!(
            "[federation]\nlisten = \"127.0.0.1:7100\"\n[[peer]]\nname = \"p\"\naddress = \
             \"127.0.0.1:7101\"\nkey_file = \"p.key\"\nmm_public_key_file = \"p-mm.pub\"\nborrow = \
             {borrow}\n"
        ));
        for (i, (name, cluster, node)) in guests.iter().enumerate() {
            text.push_str(&format!(
                "[[node]]\nname = \"{name}\"\naddress = \"127.0.0.1:{}\"\nspool = \
                 \"/tmp/{name}\"\nguest_of = {{ cluster = \"{cluster}\", node = \"{node}\" }}\n",
                7300 + i
            ));
        }
        text
    }

    /// Named features take bits from the bottom, lenders from the top: together they may not
    /// meet (63 bits in all, the last being the own-node bit).
    #[test]
    fn named_features_and_lenders_share_the_63_bits() {
        let mut text = with_guests(true, &[("p-n0", "p", "n0")]);
        let names: Vec<String> = (0..62).map(|i| format!("\"f{i}\"")).collect();
        text = text.replacen(
            "[[node]]",
            &format!("[[node]]\nfeatures = [{}]", names.join(", ")),
            1,
        );
        ClusterConfig::parse(&text).expect("62 features and one lender fit");
        let names: Vec<String> = (0..63).map(|i| format!("\"f{i}\"")).collect();
        let text = with_guests(true, &[("p-n0", "p", "n0")]).replacen(
            "[[node]]",
            &format!("[[node]]\nfeatures = [{}]", names.join(", ")),
            1,
        );
        let e = ClusterConfig::parse(&text).unwrap_err().to_string();
        assert!(e.contains("1 lending clusters"), "{e}");
    }

    #[test]
    fn guest_slots_need_their_lenders_mm_key_to_check_leases_with() {
        let text = with_guests(true, &[("p-n0", "p", "n0")])
            .replace("mm_public_key_file = \"p-mm.pub\"\n", "");
        let err = ClusterConfig::parse(&text).unwrap_err().to_string();
        assert!(err.contains("mm_public_key_file"), "{err}");
    }

    #[test]
    fn guest_slots_stand_once_each_for_nodes_of_peers_the_cluster_may_borrow_from() {
        let c = ClusterConfig::parse(&with_guests(true, &[("p-n0", "p", "n0")])).unwrap();
        assert!(c.has_guest_slots());
        assert_eq!(c.home_node_count(), 2);
        assert_eq!(c.guest_slot("p", "n0"), Some(2));
        assert!(c.is_guest(2) && !c.is_guest(0));
        let masks = c.node_feature_masks();
        assert_eq!(
            masks[0] & OWN_NODE_BIT,
            OWN_NODE_BIT,
            "own nodes carry the bit"
        );
        assert_eq!(masks[2] & OWN_NODE_BIT, 0, "guest slots do not");
        assert_eq!(c.lenders(), ["p"]);
        assert_eq!(c.lender_bit("p"), OWN_NODE_BIT >> 1);
        assert_eq!(
            masks[2] & c.lender_bit("p"),
            c.lender_bit("p"),
            "a slot carries its lender's bit (--one-cluster)"
        );
        assert_eq!(masks[0] & c.lender_bit("p"), 0, "own nodes do not");
        assert_eq!(c.lender_bit("q"), 0, "no slot stands for q's nodes");
        assert_eq!(ClusterConfig::parse(&c.to_toml()).unwrap(), c);
        // Files without guest slots give no node the bit: no job asks for it there.
        let plain = ClusterConfig::parse(SMALL).unwrap();
        assert!(
            plain
                .node_feature_masks()
                .iter()
                .all(|m| m & OWN_NODE_BIT == 0)
        );
        let e = ClusterConfig::parse(&with_guests(false, &[("p-n0", "p", "n0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("may borrow"), "{e}");
        let e = ClusterConfig::parse(&with_guests(true, &[("x-n0", "x", "n0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"x\""), "{e}");
        let twice = with_guests(true, &[("p-n0", "p", "n0"), ("again", "p", "n0")]);
        let e = ClusterConfig::parse(&twice).unwrap_err().to_string();
        assert!(e.contains("already stands for node n0"), "{e}");
    }

    #[test]
    fn a_replicated_mm_needs_no_mm_section_and_each_replica_sees_its_own_address() {
        let c = ClusterConfig::parse(&group_file(3)).unwrap();
        assert!(c.replicated());
        // The nodes dial the first replica until they find the leader.
        assert_eq!(c.mm.address.port(), 7100);
        assert_eq!(c.mm_addresses().len(), 3);
        let m1 = c.as_manager(c.manager_by_name("m1").unwrap());
        assert_eq!(m1.mm.address.port(), 7101);
        assert_eq!(m1.cluster.control_socket, PathBuf::from("/run/m1.sock"));
        assert_eq!(c.control_sockets().len(), 3);
        let e = c.manager_by_name("m9").unwrap_err();
        assert!(e.contains("m0, m1, m2"), "{e}");
        // The file written back reads the same.
        assert_eq!(ClusterConfig::parse(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn a_group_must_be_odd_distinct_on_tcp_and_a_single_mm_needs_its_address() {
        let e = ClusterConfig::parse(&group_file(2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("odd count"), "{e}");
        let twice = group_file(3).replace("127.0.0.1:7201", "127.0.0.1:7100");
        let e = ClusterConfig::parse(&twice).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:7100 is used twice"), "{e}");
        let ofi = group_file(3).replace("name = \"t\"", "name = \"t\"\nbackend = \"ofi\"");
        let e = ClusterConfig::parse(&ofi).unwrap_err().to_string();
        assert!(e.contains("need backend \"tcp\""), "{e}");
        let fast = format!(
            "{}[replication]\nheartbeat_ms = 10\nelection_timeout_ms = 20\n",
            group_file(3)
        );
        let e = ClusterConfig::parse(&fast).unwrap_err().to_string();
        assert!(e.contains("at least 4 heartbeats"), "{e}");
        let none = SMALL.replace("[mm]\n        address = \"127.0.0.1:7000\"", "");
        let e = ClusterConfig::parse(&none).unwrap_err().to_string();
        assert!(e.contains("no [mm] address"), "{e}");
    }

    #[test]
    fn each_replica_may_have_a_relay_of_its_own_and_then_every_one_has() {
        // No relay anywhere, then the one [relay] address.
        assert!(
            ClusterConfig::parse(&group_file(3))
                .unwrap()
                .relay_addresses()
                .is_empty()
        );
        let one = format!("{}[relay]\naddress = \"127.0.0.1:7301\"\n", group_file(3));
        let c = ClusterConfig::parse(&one).unwrap();
        assert_eq!(c.relay_addresses(), ["127.0.0.1:7301".parse().unwrap()]);
        // One per replica, tried in the entries' order.
        let mut each = group_file(3);
        for i in 0..3 {
            each = each.replace(
                &format!("control_socket = \"/run/m{i}.sock\"\n"),
                &format!(
                    "control_socket = \"/run/m{i}.sock\"\nrelay_address = \"127.0.0.1:{}\"\n",
                    7400 + i
                ),
            );
        }
        let c = ClusterConfig::parse(&each).unwrap();
        let ports: Vec<u16> = c.relay_addresses().iter().map(|a| a.port()).collect();
        assert_eq!(ports, [7400, 7401, 7402]);
        assert_eq!(ClusterConfig::parse(&c.to_toml()).unwrap(), c);
        // All or none, never both kinds, never an address used twice.
        let partial = each.replace("relay_address = \"127.0.0.1:7401\"\n", "");
        let e = ClusterConfig::parse(&partial).unwrap_err().to_string();
        assert!(e.contains("manager \"m1\" has no relay_address"), "{e}");
        let both = format!("{each}[relay]\naddress = \"127.0.0.1:7301\"\n");
        let e = ClusterConfig::parse(&both).unwrap_err().to_string();
        assert!(e.contains("keep one"), "{e}");
        let twice = each.replace("127.0.0.1:7402", "127.0.0.1:7100");
        let e = ClusterConfig::parse(&twice).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:7100 is used twice"), "{e}");
    }

    #[test]
    fn a_hostlist_table_names_one_node_per_name_in_order() {
        let c = ClusterConfig::parse(&hostlist_file(16_384)).unwrap();
        assert_eq!(c.node_count(), 16_384);
        assert_eq!(c.nodes[0].name, "node00000");
        assert_eq!(c.nodes[16_383].name, "node16383");
        assert_eq!(c.node_by_name("node00042"), Some(42));
        assert!(c.nodes.iter().all(|n| n.cpus == 2));

        let paired = SMALL.replace(
            "name = \"a\"\n        address = \"127.0.0.1:7001\"",
            "name = \"a[1-3]\"\n        address = \"127.0.0.[11-13]:7001\"",
        );
        let c = ClusterConfig::parse(&paired).unwrap();
        let got: Vec<_> = c
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.address.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("a1", "127.0.0.11:7001".to_string()),
                ("a2", "127.0.0.12:7001".to_string()),
                ("a3", "127.0.0.13:7001".to_string()),
                ("b", "127.0.0.1:7002".to_string()),
            ]
        );
    }

    #[test]
    fn hostlist_mistakes_name_the_table() {
        let uneven = SMALL.replace(
            "name = \"a\"\n        address = \"127.0.0.1:7001\"",
            "name = \"a[1-3]\"\n        address = \"127.0.0.[11-12]:7001\"",
        );
        let e = ClusterConfig::parse(&uneven).unwrap_err().to_string();
        assert!(
            e.contains("stands for 3 nodes") && e.contains("2 addresses"),
            "{e}"
        );
        let shared_port = SMALL.replace("name = \"a\"", "name = \"a[1-2]\"");
        let e = ClusterConfig::parse(&shared_port).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:7001 is used twice"), "{e}");
        let backwards = SMALL.replace("name = \"a\"", "name = \"a[3-1]\"");
        let e = ClusterConfig::parse(&backwards).unwrap_err().to_string();
        assert!(e.contains("runs backwards"), "{e}");
    }

    #[test]
    fn a_minimal_file_gets_defaults_and_a_directory() {
        let c = ClusterConfig::parse(SMALL).unwrap();
        assert_eq!(c.node_count(), 2);
        assert_eq!(c.mm_id(), 2);
        assert_eq!(c.nodes[0].cpus, 1);
        assert_eq!(c.nodes[1].cpus, 4);
        assert_eq!(c.timeslice(), Duration::from_millis(1));
        assert_eq!(c.directory()[2], Some("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(c.node_by_name("b"), Some(1));
        let again = ClusterConfig::parse(&c.to_toml()).unwrap();
        assert_eq!(again, c, "round trip through TOML");
    }

    #[test]
    fn counts_beyond_what_storm_supports_are_named_before_anything_is_sized() {
        // Found by fuzzing: 42949672954 transfers had the layout reserve 171 GB and abort.
        let huge = SMALL.replace("name = \"t\"", "name = \"t\"\nmax_transfers = 42949672954");
        let e = ClusterConfig::parse(&huge).unwrap_err().to_string();
        assert!(
            e.contains("max_transfers = 42949672954 is more than the 256"),
            "{e}"
        );
        let slots = SMALL.replace("name = \"t\"", "name = \"t\"\nheartbeat_slots = 100000");
        let e = ClusterConfig::parse(&slots).unwrap_err().to_string();
        assert!(e.contains("heartbeat_slots"), "{e}");
    }

    #[test]
    fn mistakes_are_named() {
        let typo = SMALL.replace("name = \"t\"", "name = \"t\"\ntimeslise_ms = 2");
        let e = ClusterConfig::parse(&typo).unwrap_err().to_string();
        assert!(e.contains("timeslise_ms"), "{e}");
        let dup = SMALL.replace("name = \"b\"", "name = \"a\"");
        assert!(
            ClusterConfig::parse(&dup)
                .unwrap_err()
                .to_string()
                .contains("\"a\" appears twice")
        );
        let zero = SMALL.replace("name = \"t\"", "name = \"t\"\ntimeslice_ms = 0");
        assert!(
            ClusterConfig::parse(&zero)
                .unwrap_err()
                .to_string()
                .contains("timeslice_ms")
        );
        let none = "[mm]\naddress = \"127.0.0.1:1\"\n";
        assert!(
            ClusterConfig::parse(none)
                .unwrap_err()
                .to_string()
                .contains("no [[node]]")
        );
        let fan = SMALL.replace("[mm]", "[tcp]\nfanout = 0\n[mm]");
        assert!(
            ClusterConfig::parse(&fan)
                .unwrap_err()
                .to_string()
                .contains("fanout")
        );
        let e = ClusterConfig::load(Path::new("/nonexistent/storm.toml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/storm.toml"), "{e}");
    }
}
