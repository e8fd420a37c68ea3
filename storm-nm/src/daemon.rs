//! The `storm-nm` daemon: the node manager's core ([`crate::NodeManager`]) in a process, with
//! its fabric endpoint, its storm-pl launcher, a spool directory, output and PMI threads, and
//! the optional heartbeat and switch logs.
//!
//! [`start`] checks what the node needs (the cluster key, this node in the cluster file, the
//! launcher binary, the spool directory) and opens it all; [`Daemon::run`] steps the core
//! until a heartbeat says to shut down or a signal sets the stop flag. `start` is two halves:
//! [`prepare`] (spool, launcher, cgroups: nothing that needs a key or sends) and
//! [`Prepared::open`] (keys, endpoint, threads). A warm guest NM (docs/federation.md) runs
//! the first half ahead of its lend and the second once lent.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use storm_cluster::clock::{Clock, SystemClock};
use storm_cluster::daemon_dir::DaemonDir;
use storm_cluster::endpoint::{self, Listen};
use storm_cluster::messages::{CheckProgram, Command, FileInfo, JobId, MpiMode, file_ack};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::{NodeId, PrimError, Primitives};

use storm_cluster::keywatch::{Due, KeyWatch};

use crate::cgroup::Cgroups;
use crate::env::{NmEnv, OutputForwarder, PmiServer, Spool, SwitchRecord, TaskRunner};
use crate::manager::{NmParts, NodeManager};
use crate::membership::Identity;
use crate::monitor::Monitor;
use crate::output::Output;
use crate::pmi::{JobFacts, PmiService};
use crate::sample::SamplerOptions;
use crate::tasks::PlRunner;
use crate::{in_place, receive};

/// How to start a node manager.
pub struct NmOptions {
    pub config: ClusterConfig,
    /// The file `config` was read from: a node's own NM starts its guests from it
    /// (`storm-nm --config FILE --guest-of PEER`); `None` where nodes are not lent (NMs run
    /// as threads of `storm-local`), and for a guest.
    pub config_path: Option<PathBuf>,
    pub node: NodeId,
    pub listen: Listen,
    /// The storm-pl binary.
    pub pl_path: PathBuf,
    /// The PMI-1 client library for `--mpi openmpi` jobs (`libstorm_pmi.so`).
    pub pmi_library: PathBuf,
    /// The node's PMIx server (`storm-pmix`).
    pub pmix_helper: PathBuf,
    /// Set to stop the NM (signal handlers set it).
    pub stop: Arc<AtomicBool>,
    /// A guest NM: this node is lent to the cluster of `config` (docs/federation.md).
    pub guest: Option<Guest>,
}

/// What makes an NM a guest on a lent node: whose account its jobs run as, and when the
/// lease ends.
#[derive(Debug, Clone, Copy)]
pub struct Guest {
    /// The lending cluster's account for the borrower's jobs (never root).
    pub user: (u32, u32),
    pub lease: Lease,
}

/// When a guest's lease ends: the guest stops itself and its tasks then, whatever it hears
/// from either cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// At this time (Unix ms): the node is lent already (`--lease-until`).
    Until(u64),
    /// A warm guest (`--warm`): started ahead of a lend, it is [`prepare`]d, then waits for
    /// its node's NM to write the lease's end on its standard input
    /// ([`crate::guest::wait_for_lend`]). It makes its cgroups only when its NM says it may
    /// ([`Prepared::make_groups`]): they are the lent slot's, which another guest of the same
    /// borrower may own while this one waits.
    OnLend,
}

/// The programs and library a node manager uses beside itself.
pub struct Helpers {
    /// The launcher, `storm-pl`.
    pub pl_path: PathBuf,
    /// The PMI-1 library Open MPI 4 loads, `libstorm_pmi.so`.
    pub pmi_library: PathBuf,
    /// The node's PMIx server, `storm-pmix`.
    pub pmix_helper: PathBuf,
}

/// The helpers a node manager uses: those the cluster file names; else the ones beside the
/// running executable (where `cargo build` puts them); else where `make install` and the
/// Debian package put them, `PREFIX/libexec/storm/storm-pl`, `PREFIX/libexec/storm/storm-pmix`
/// and `PREFIX/lib/storm/libstorm_pmi.so` for an executable in `PREFIX/bin`.
pub fn helpers(cfg: &ClusterConfig) -> Result<Helpers> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let find = |name: &str, installed: &str| -> PathBuf {
        let beside = exe.with_file_name(name);
        let prefix = exe.parent().and_then(Path::parent);
        match prefix.map(|p| p.join(installed).join(name)) {
            Some(p) if !beside.exists() && p.exists() => p,
            _ => beside,
        }
    };
    let pl_path = match &cfg.cluster.pl_path {
        Some(p) => p.clone(),
        None => find("storm-pl", "libexec/storm"),
    };
    let pmi_library = match &cfg.cluster.pmi_library {
        Some(p) => p.clone(),
        None => find("libstorm_pmi.so", "lib/storm"),
    };
    Ok(Helpers {
        pl_path,
        pmi_library,
        pmix_helper: find("storm-pmix", "libexec/storm"),
    })
}

/// A started node manager daemon.
pub struct Daemon {
    core: NodeManager<DaemonEnv>,
    stop: Arc<AtomicBool>,
    /// A guest NM's lease end (Unix ms).
    lease_until_ms: Option<u64>,
    node: NodeId,
    /// This node's identity key, which its links sign with (read again on SIGHUP).
    node_key: Arc<parking_lot::RwLock<ed25519_dalek::SigningKey>>,
    keys: KeyWatch,
    /// How many jobs the core holds, for the node's samples.
    jobs: Arc<AtomicUsize>,
    /// The sampling thread (stopped when the daemon is dropped).
    _monitor: Monitor,
}

/// Checks this node's setup and opens its endpoint; nothing is sent before [`Daemon::run`].
/// A warm guest ([`Lease::OnLend`]) is not for this: see [`prepare`].
pub fn start(opts: NmOptions) -> Result<Daemon> {
    let until_ms = match opts.guest.map(|g| g.lease) {
        Some(Lease::OnLend) => bail!("a warm guest NM is started with prepare, then open"),
        Some(Lease::Until(ms)) => Some(ms),
        None => None,
    };
    prepare(opts)?.open(until_ms)
}

/// What [`prepare`] readied: everything of a node manager that sends nothing and needs no
/// key, so that a warm guest can have it done before it is lent.
pub struct Prepared {
    cfg: ClusterConfig,
    node: NodeId,
    entry: storm_cluster::config::NodeEntry,
    listen: Listen,
    pmi_library: PathBuf,
    pmix_helper: PathBuf,
    stop: Arc<AtomicBool>,
    guest_user: Option<(u32, u32)>,
    spool: DaemonDir,
    rm: RmLayout,
    /// The jobs' cgroup files the node's samples read.
    usage_files: Option<crate::sample::NodeCgroupFiles>,
    /// Whether its cgroups are made (a warm guest's wait for [`Prepared::make_groups`]).
    groups_made: bool,
    tasks: PlRunner,
    guest: crate::guest::GuestProcess,
    switch_log: Option<std::io::LineWriter<std::fs::File>>,
    heartbeat_log: Option<std::io::LineWriter<std::fs::File>>,
    /// A guest's lease grant, shown in its registrations ([`Prepared::show_lease`]).
    lease: Option<storm_cluster::identity::LeaseGrant>,
}

/// The first half of a node manager's start: checks what the node needs (this node in the
/// cluster file, the launcher binary, the spool directory), and starts its launcher and makes
/// its cgroups (a warm guest: when told, [`Prepared::make_groups`]). Nothing here reads a key
/// or opens a link: [`Prepared::open`] does, when the node manager is to run (a warm guest:
/// once its node is lent).
pub fn prepare(opts: NmOptions) -> Result<Prepared> {
    let NmOptions {
        config: cfg,
        config_path,
        node,
        listen,
        pl_path,
        pmi_library,
        pmix_helper,
        stop,
        guest,
    } = opts;
    if guest.is_some_and(|g| g.user.0 == 0) {
        bail!("a guest NM runs the borrower's jobs as an account of its own, never root");
    }
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
    // The spool is the NM's alone: users reach their programs in it, and change nothing.
    let spool = DaemonDir::open_or_create(&entry.spool, receive::SPOOL_DIR_MODE)
        .context("the spool directory")?;
    let rm = RmLayout::new(&cfg)?;
    let log = |enabled: bool, name: &str| -> Result<_> {
        if !enabled {
            return Ok(None);
        }
        let f = spool
            .append_file(name)
            .with_context(|| format!("opening {}", spool.join(name).display()))?;
        Ok(Some(std::io::LineWriter::new(f)))
    };
    let switch_log = log(cfg.scheduler.switch_log, "switches.log")?;
    let heartbeat_log = log(cfg.scheduler.heartbeat_log, "heartbeats.log")?;
    // A warm guest's groups are the slot's, which the guest lent now may own: it makes them
    // when its NM says no guest runs.
    let groups_made = !guest.is_some_and(|g| g.lease == Lease::OnLend);
    let cgroups = if groups_made {
        Cgroups::open(cfg.cluster.cgroups, &cfg.cluster.name, &entry.name)
    } else {
        Cgroups::None
    };
    let usage_files = cgroups.node_usage_files();
    let tasks = PlRunner::new(
        node,
        pl_path,
        cfg.cluster.max_tasks_per_node * cfg.cluster.max_jobs,
        Duration::from_millis(cfg.failure.launcher_timeout_ms),
        Duration::from_millis(cfg.failure.task_start_timeout_ms),
        cgroups,
    )?;
    let guest_runner = crate::guest::GuestProcess::new(
        Arc::new(cfg.clone()),
        config_path,
        entry.name.clone(),
        spool.try_clone().context("the spool directory")?,
        guest.is_none(),
    );
    Ok(Prepared {
        cfg,
        node,
        entry,
        listen,
        pmi_library,
        pmix_helper,
        stop,
        guest_user: guest.map(|g| g.user),
        spool,
        rm,
        usage_files,
        groups_made,
        tasks,
        guest: guest_runner,
        switch_log,
        heartbeat_log,
        lease: None,
    })
}

impl Prepared {
    /// A guest's lease grant from this node's cluster, which it shows the borrower in every
    /// registration.
    pub fn show_lease(&mut self, grant: storm_cluster::identity::LeaseGrant) {
        self.lease = Some(grant);
    }

    /// Takes `[scheduler] daemon_rt_priority` for this thread and the launcher: what a warm
    /// guest, which waits for its lend at normal priority, does once lent.
    pub fn take_rt_priority(&self) {
        let priority = self.cfg.scheduler.daemon_rt_priority;
        storm_cluster::daemon::set_rt_priority(priority);
        self.tasks.raise_launcher(priority);
    }

    /// Makes this node's cgroups, if not made yet: a warm guest's, once its NM says no other
    /// guest owns them (`groups`), or as it takes the lease. Any process an earlier owner left
    /// in them is killed first.
    pub fn make_groups(&mut self) {
        if std::mem::replace(&mut self.groups_made, true) {
            return;
        }
        let cgroups = Cgroups::open(
            self.cfg.cluster.cgroups,
            &self.cfg.cluster.name,
            &self.entry.name,
        );
        self.usage_files = cgroups.node_usage_files();
        self.tasks.use_cgroups(cgroups);
    }

    /// The second half: reads the keys, opens the endpoint and starts the output, PMI and
    /// sampling threads. `lease_until_ms`: a guest's lease end (Unix ms), `None` for a node's
    /// own NM. Nothing is sent before [`Daemon::run`].
    pub fn open(self, lease_until_ms: Option<u64>) -> Result<Daemon> {
        let Prepared {
            cfg,
            node,
            entry,
            listen,
            pmi_library,
            pmix_helper,
            stop,
            guest_user,
            spool,
            rm,
            usage_files,
            groups_made,
            tasks,
            guest,
            switch_log,
            heartbeat_log,
            lease,
        } = self;
        if !groups_made {
            bail!("a warm guest NM opens only once its groups are made (make_groups)");
        }
        if guest_user.is_some() != lease_until_ms.is_some() {
            bail!("a guest NM, and only a guest, runs until a lease's end");
        }
        if lease_until_ms.is_some_and(|until| until <= storm_cluster::daemon::unix_ms()) {
            bail!("the lease ended before the guest NM started");
        }
        // First: without the key this daemon must not run at all.
        let key = cfg.load_key()?;
        // Every command it carries out is sealed by the MM: without its public key, nothing is.
        let mm_key = cfg.load_mm_verifier().map_err(anyhow::Error::msg)?;
        // Who this node is, to the MM.
        let node_key = Arc::new(parking_lot::RwLock::new(cfg.load_node_key(&entry.name)?));
        let prims = endpoint::start(
            &cfg,
            &rm,
            node,
            listen,
            key,
            endpoint::LinkIdentity::Node(node_key.clone()),
        )
        .map_err(anyhow::Error::msg)?;
        let mm = cfg.mm_id();
        let op_timeout = Duration::from_millis(cfg.tcp.op_timeout_ms);
        // Sends from the first welcome on, at that membership's output queue epoch.
        let output = Output::start(prims.clone(), &rm, node, mm)?;
        // Bounded: a helper that says more than the PMI thread takes waits for it.
        let (pmix_tx, pmix_rx) = crossbeam_channel::bounded(1024);
        let pmi = PmiService::start(prims.clone(), &rm, node, mm, op_timeout * 2, pmix_rx)?;
        let scratch = scratch_root(&cfg.cluster.name, &entry.name, &spool);
        let pmix = start_pmix(
            &cfg,
            &entry.name,
            pmix_helper,
            scratch.as_ref(),
            pmix_tx,
            &pmi,
        );
        let jobs = Arc::new(AtomicUsize::new(0));
        let monitor = Monitor::start(
            prims.clone(),
            &rm,
            node,
            &entry.name,
            mm,
            SamplerOptions {
                source: cfg.monitoring.source,
                node_cpus: entry.cpus,
                spool_dir: entry.spool.clone(),
                state_dir: cfg.cluster.state_dir.clone(),
                cgroup: usage_files,
                period: cfg.monitoring.period(),
                proc_dir: "/proc".into(),
                sys_dir: cfg.monitoring.sysfs.clone(),
            },
            cfg.health.clone(),
            jobs.clone(),
            op_timeout,
        )
        .context("starting the sampling thread")?;
        let env = DaemonEnv {
            guest,
            clock: SystemClock,
            tasks,
            spool: DaemonSpool {
                dir: spool,
                prims: prims.clone(),
                rm: rm.clone(),
                receivers: BTreeMap::new(),
                stall: (op_timeout * 6).max(Duration::from_secs(30)),
                hashes: Default::default(),
                checking: Default::default(),
                checkers: BTreeMap::new(),
                scratch,
            },
            output,
            pmi: DaemonPmi {
                service: pmi,
                library: pmi_library.clone(),
                pmix,
            },
            switch_log,
            heartbeat_log,
        };
        tracing::info!(node, name = %entry.name, spool = %entry.spool.display(), "node manager started");
        let parts = NmParts {
            config: Arc::new(cfg),
            rm,
            node,
            fabric: prims,
            identity: Identity {
                lease,
                ..Identity::this_process(
                    mm_key,
                    // The node's memory as detected (the cluster file's `mem` may say less).
                    std::fs::read_to_string("/proc/meminfo")
                        .map(|t| crate::sample::parse_meminfo(&t).total)
                        .unwrap_or(0),
                )
            },
            report_wait: op_timeout * 2,
            pmi_library,
            guest_user,
            cpus: own_cpus(),
        };
        let keys = KeyWatch::new(
            vec![
                (storm_cluster::key::CLUSTER_KEY, parts.config.key_path()),
                (
                    storm_cluster::key::NODE_KEY,
                    parts.config.node_key_path(&entry.name),
                ),
            ],
            Duration::from_secs(parts.config.security.key_check_interval_s),
        )?;
        Ok(Daemon {
            core: NodeManager::new(parts, env),
            stop,
            lease_until_ms,
            node,
            node_key,
            keys,
            jobs,
            _monitor: monitor,
        })
    }
}

impl Daemon {
    /// Runs until told to shut down (by a heartbeat or a signal); the jobs' tasks are killed
    /// on the way out.
    pub fn run(mut self) -> Result<()> {
        while !self.core.is_done() && !self.stop.load(Ordering::Acquire) {
            if self.keys.poll(std::time::Instant::now()) == Due::Reload {
                self.reload_keys();
            }
            if self
                .lease_until_ms
                .is_some_and(|until| storm_cluster::daemon::unix_ms() >= until)
            {
                tracing::warn!(
                    node = self.node,
                    "the lease of this lent node ended: stopping"
                );
                break;
            }
            match self.core.step(self.core.poll_timeout()) {
                Ok(_) => {
                    self.jobs.store(self.core.job_count(), Ordering::Relaxed);
                    self.core.env_mut().guest.warm_up_if_due();
                }
                Err(PrimError::ShutDown) => break,
                Err(e) => bail!("node {}: heartbeat queue: {e}", self.node),
            }
        }
        self.core.shut_down();
        Ok(())
    }
}

impl Daemon {
    /// SIGHUP: reads the MM's public keys and this node's identity key again (a key being
    /// rotated, docs/security.md); a file that does not read keeps the key in use.
    fn reload_keys(&mut self) {
        let cfg = self.core.config();
        match cfg.load_mm_verifier() {
            Ok(v) => {
                self.core.set_mm_keys(v);
                tracing::info!(node = self.node, "read the MM's public keys again");
            }
            Err(e) => tracing::error!(node = self.node, "keeping the MM's keys in use: {e}"),
        }
        let name = &cfg.nodes[self.node as usize].name;
        match cfg.load_node_key(name) {
            Ok(k) => {
                *self.node_key.write() = k;
                tracing::info!(node = self.node, "read this node's identity key again");
            }
            Err(e) => tracing::error!(node = self.node, "keeping this node's key in use: {e}"),
        }
    }
}

/// The daemon's environment (see [`crate::env`]).
pub struct DaemonEnv {
    /// The guest NM while the node is lent.
    guest: crate::guest::GuestProcess,
    clock: SystemClock,
    tasks: PlRunner,
    /// Before the spool: the PMIx helper's directory goes before the scratch root does.
    pmi: DaemonPmi,
    spool: DaemonSpool,
    output: Output,
    /// Where applied schedules are recorded, if the cluster asks for it.
    switch_log: Option<std::io::LineWriter<std::fs::File>>,
    /// Where heartbeats are recorded as they are taken, if the cluster asks for it.
    heartbeat_log: Option<std::io::LineWriter<std::fs::File>>,
}

impl NmEnv for DaemonEnv {
    fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    fn tasks(&mut self) -> &mut dyn TaskRunner {
        &mut self.tasks
    }

    fn spool(&mut self) -> &mut dyn Spool {
        &mut self.spool
    }

    fn output(&mut self) -> &mut dyn OutputForwarder {
        &mut self.output
    }

    fn pmi(&mut self) -> &mut dyn PmiServer {
        &mut self.pmi
    }

    fn guest(&mut self) -> &mut dyn crate::env::GuestRunner {
        &mut self.guest
    }

    fn heard(&mut self, seq: u64, received_ns: u128, _commands: &[Command]) {
        if let Some(log) = self.heartbeat_log.as_mut() {
            let _ = writeln!(log, "{seq} {received_ns}");
        }
    }

    fn switched(&mut self, s: &SwitchRecord) {
        let Some(log) = self.switch_log.as_mut() else {
            return;
        };
        let ns = storm_cluster::daemon::monotonic_ns();
        let list = |v: &[JobId]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let _ = writeln!(
            log,
            "{} {ns} stop={} cont={} start={} recv={} from={}{}",
            s.seq,
            list(&s.stopped),
            list(&s.continued),
            list(&s.started),
            s.received_ns,
            s.from,
            if s.lease_expired {
                " lease=expired"
            } else {
                ""
            },
        );
    }

    fn stamp_ns(&self) -> u128 {
        storm_cluster::daemon::monotonic_ns()
    }
}

/// The spool directory, and a receiving thread per program transfer.
struct DaemonSpool {
    dir: DaemonDir,
    prims: Arc<dyn Primitives>,
    rm: RmLayout,
    receivers: BTreeMap<JobId, receive::Receiver>,
    /// How long a transfer may make no progress before the receiver gives up.
    stall: Duration,
    /// What each received program hashes to.
    hashes: receive::ProgramHashes,
    /// Checks whether programs are in place here, and the one `file.ack` answers for.
    checking: in_place::Checking,
    checkers: BTreeMap<JobId, in_place::Checker>,
    /// Where jobs' scratch directories go (`/dev/shm/storm-CLUSTER-NODE`, this NM's, 0711),
    /// if it could be made.
    scratch: Option<DaemonDir>,
}

/// A node manager that stops removes its scratch root if no job left anything in it (an
/// embedded cluster's nodes leave nothing behind in `/dev/shm`).
impl Drop for DaemonSpool {
    fn drop(&mut self) {
        if let Some(root) = &self.scratch
            && root.names().is_ok_and(|n| n.is_empty())
        {
            // Root's own directory in a sticky one: no one else can have replaced it.
            let _ = std::fs::remove_dir(root.path());
        }
    }
}

/// The node's PMIx server, where it can run: its helper gets a directory in the jobs'
/// scratch root. Where it cannot, the NM says why once, and serves PMI-1 and PMI-2 alone.
fn start_pmix(
    cfg: &ClusterConfig,
    node: &str,
    helper: PathBuf,
    scratch: Option<&DaemonDir>,
    events: crossbeam_channel::Sender<crate::pmix::PmixEvent>,
    pmi: &PmiService,
) -> Option<crate::pmix::PmixLink> {
    let root = match scratch.map(DaemonDir::try_clone) {
        Some(Ok(root)) => root,
        Some(Err(e)) => {
            tracing::warn!("PMIx is not served on this node: the scratch root: {e}");
            return None;
        }
        None => {
            tracing::warn!("PMIx is not served on this node: it has no scratch root");
            return None;
        }
    };
    let settings = crate::pmix::PmixSettings {
        helper,
        security: cfg.cluster.pmix,
        user: cfg.cluster.pmix_user.clone(),
        node: node.to_string(),
        root,
        node_bytes: cfg.cluster.pmi_node_bytes,
        job_bytes: cfg.cluster.pmi_job_bytes,
    };
    match crate::pmix::PmixLink::start(settings, events, pmi.waker()) {
        Ok(link) => {
            tracing::info!(version = link.version(), "PMIx served on this node");
            Some(link)
        }
        Err(e) => {
            tracing::warn!("PMIx is not served on this node: {e}");
            None
        }
    }
}

/// The directory of node `node`'s jobs' scratch directories (see [`Spool::scratch_dir`]):
/// in `/dev/shm` (memory) where the host has it, else in the spool. A name someone else
/// made first is refused by [`DaemonDir`] (it is not this NM's), and jobs run without.
fn scratch_root(cluster: &str, node: &str, spool: &DaemonDir) -> Option<DaemonDir> {
    let name = format!("storm-{cluster}-{node}");
    let made = if std::path::Path::new("/dev/shm").is_dir() {
        DaemonDir::open_or_create(&std::path::Path::new("/dev/shm").join(&name), 0o711)
    } else {
        spool.subdir("scratch", 0o711)
    };
    match made {
        Ok(d) => {
            remove_left_behind(&d);
            Some(d)
        }
        Err(e) => {
            tracing::warn!("jobs get no scratch directory on this node: {e}");
            None
        }
    }
}

/// What an earlier NM of this node left in the scratch root when it was killed (its jobs'
/// directories, its PMIx helper's): a new NM runs none of those jobs, and `/dev/shm` is
/// memory. Removed through the root's descriptor, never following a link.
fn remove_left_behind(root: &DaemonDir) {
    let Ok(names) = root.names() else {
        return;
    };
    for name in names {
        if name.starts_with("job-") || name == "pmix" {
            match root.remove_tree(&name) {
                Ok(()) => tracing::info!(
                    "removed {} (left by an earlier NM)",
                    root.join(&name).display()
                ),
                Err(e) => tracing::warn!("cannot remove {}: {e}", root.join(&name).display()),
            }
        }
    }
}

impl Spool for DaemonSpool {
    fn job_dir(&self, job: JobId) -> PathBuf {
        self.dir.join(&receive::job_dir_name(job))
    }

    fn receive(&mut self, info: FileInfo) {
        let owner = nix::unistd::geteuid()
            .is_root()
            .then_some((info.uid, info.gid));
        // Earlier receivers have finished, or were cancelled with their job and stop now.
        self.stop_all();
        let job = info.job;
        self.checking.latest.set(info.transfer);
        let spool = match self.dir.try_clone() {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(job, "program transfer failed: the spool's descriptor: {e}");
                self.prims
                    .memory()
                    .store(self.rm.file_ack, file_ack(info.transfer, false));
                return;
            }
        };
        let receiver = receive::spawn(
            self.prims.clone(),
            self.rm.clone(),
            info,
            spool,
            owner,
            self.stall,
            self.hashes.clone(),
        );
        self.receivers.insert(job, receiver);
    }

    fn check(&mut self, check: CheckProgram) {
        // A receiver still running would answer for an older transfer after this check.
        self.stop_all();
        self.checking.latest.set(check.transfer);
        let job = check.job;
        let checker = self
            .checking
            .spawn(self.prims.clone(), self.rm.clone(), check);
        self.checkers.insert(job, checker);
    }

    fn cancel(&mut self, job: JobId) {
        if let Some(receiver) = self.receivers.get(&job) {
            receiver.cancel();
        }
        if let Some(checker) = self.checkers.get(&job) {
            checker.cancel();
        }
    }

    fn stop_all(&mut self) {
        for (_, receiver) in std::mem::take(&mut self.receivers) {
            receiver.stop();
        }
        // Checkers are never waited for (a file system may hang): they answer no more.
        for (_, checker) in std::mem::take(&mut self.checkers) {
            checker.cancel();
        }
        self.checking.latest.set(0);
    }

    fn verify(&self, job: JobId, expected: Option<[u8; 32]>) -> Result<(), String> {
        let received = self
            .hashes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&job)
            .copied();
        match (received, expected) {
            (Some(got), Some(want)) if got == want => Ok(()),
            (_, None) => Err("the launch names no hash for the program sent; refused".into()),
            (None, Some(_)) => Err("no program was received for this job here; refused".into()),
            (Some(_), Some(_)) => Err(
                "the program received here is not the one the machine manager sent (its hash \
                 differs); refused"
                    .into(),
            ),
        }
    }

    fn remove(&mut self, job: JobId) {
        if let Some(checker) = self.checkers.remove(&job) {
            checker.cancel();
        }
        self.hashes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&job);
        if let Err(e) = self.dir.remove_tree(&receive::job_dir_name(job)) {
            tracing::warn!("cannot remove {}: {e}", self.job_dir(job).display());
        }
        if let Some(scratch) = &self.scratch
            && let Err(e) = scratch.remove_tree(&receive::job_dir_name(job))
        {
            tracing::warn!(
                "cannot remove {}: {e}",
                scratch.join(&receive::job_dir_name(job)).display()
            );
        }
    }

    fn scratch_dir(&mut self, job: JobId, uid: u32, gid: u32) -> Option<PathBuf> {
        let root = self.scratch.as_ref()?;
        let name = receive::job_dir_name(job);
        let made = root.subdir(&name, 0o700).and_then(|d| {
            if nix::unistd::geteuid().is_root() {
                d.give_to(uid, gid, 0o700).map_err(|e| {
                    storm_cluster::daemon_dir::DirError::Io {
                        path: root.join(&name),
                        source: e,
                    }
                })?;
            }
            Ok(())
        });
        match made {
            Ok(()) => Some(root.join(&name)),
            Err(e) => {
                tracing::warn!(job, "no scratch directory for the job: {e}");
                None
            }
        }
    }
}

/// The PMI server's thread, the library `--mpi openmpi` tasks load, and the node's PMIx
/// server where libpmix is.
struct DaemonPmi {
    service: PmiService,
    library: PathBuf,
    pmix: Option<crate::pmix::PmixLink>,
}

impl PmiServer for DaemonPmi {
    fn start_job(
        &mut self,
        slot: usize,
        mode: MpiMode,
        facts: JobFacts,
        ranks: &[u32],
    ) -> Result<crate::env::PmiStart, String> {
        // Asked for by name, Open MPI's way in must be there (auto does without it).
        if mode == MpiMode::OpenMpi && !self.library.is_file() {
            return Err(format!(
                "--mpi openmpi needs storm's PMI library, which is not at {} (cargo build --release builds it beside storm-nm; or set [cluster] pmi_library)",
                self.library.display()
            ));
        }
        let job = facts.job;
        let mut conns = Vec::new();
        let mut ends = Vec::new();
        for &rank in ranks {
            match std::os::unix::net::UnixStream::pair() {
                Ok((ours, theirs)) => {
                    conns.push((rank, ours));
                    ends.push(Some(OwnedFd::from(theirs)));
                }
                Err(e) => {
                    tracing::error!(job, rank, "no PMI socket: {e}");
                    ends.push(None);
                }
            }
        }
        // PMIx, for a job of more than one rank (one rank is a world of one either way):
        // registered before its tasks start, their variables for their environment.
        let mut env = Vec::new();
        if let Some(pmix) = &self.pmix
            && mode.serves_pmix()
            && facts.size > 1
        {
            let job_info = storm_pmix::wire::JobInfo {
                nspace: facts.kvsname(),
                size: facts.size,
                nodes: facts.nodes.clone(),
                node: facts.node as u32,
                uid: facts.owner.0,
                gid: facts.owner.1,
            };
            match pmix.register(job_info, ranks) {
                Ok(e) => env = e,
                Err(e) => tracing::warn!(job, "PMIx is not served to this job: {e}"),
            }
        }
        self.service.add_job(slot, facts, conns);
        Ok(crate::env::PmiStart { ends, env })
    }

    fn remove_job(&mut self, job: JobId) {
        self.service.remove_job(job);
        if let Some(pmix) = &self.pmix {
            pmix.deregister(&format!("storm-{job}"));
        }
    }

    fn contacted(&self, job: JobId, rank: u32) -> bool {
        self.service.contacted(job, rank)
    }

    fn resend(&mut self) {
        self.service.resend();
    }

    fn rank_ended(&mut self, job: JobId, rank: u32, status: storm_cluster::messages::RankStatus) {
        self.service.rank_ended(job, rank, status);
    }
}

/// The CPUs this process may run on (its affinity: the machine's, or the cpuset of the Slurm
/// allocation or cgroup it was started in), in order; none if the kernel does not say.
fn own_cpus() -> Vec<u32> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .map(|i| i as u32)
            .collect(),
        Err(e) => {
            tracing::warn!("cannot read this process's CPU affinity ({e}): ranks are not bound");
            Vec::new()
        }
    }
}
