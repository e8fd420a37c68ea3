//! The embedded cluster behind `storm-submit --local N`: an MM and N NMs on this machine,
//! talking over loopback, each NM with its own spool directory under one temporary directory.
//!
//! Every daemon's listening socket is bound here first (port 0, so the kernel picks free
//! ports) and handed to the daemon as descriptor 3 (`--listen-fd 3`): the cluster file lists
//! the real addresses and no daemon can lose a race for its port. With `--backend local` one
//! `storm-local` process runs the MM and every NM as threads instead (the addresses are then
//! not used).
//!
//! Each daemon tells when it is ready through the systemd notification protocol
//! (`NOTIFY_SOCKET`, see `storm_cluster::daemon`); the cluster records how long each took from
//! fork/exec to ready ([`LocalCluster::ready_times`]).

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cluster::config::{
    BackendKind, CgroupMode, ClusterConfig, ClusterSection, FailureSection, LimitsSection,
    ManagerEntry, MmSection, NodeEntry, OfiSection, SchedulerSection, SecuritySection, TcpSection,
};
use storm_cluster::control::{Client, NodeState, Reply, Request};

/// Options of the embedded cluster.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub nodes: u32,
    /// CPUs of every node (`None`: this machine's cores, as each node runs on all of them).
    pub cpus: Option<u32>,
    pub timeslice_ms: f64,
    /// Keep the temporary directory (logs, spools) after shutdown.
    pub keep: bool,
    /// Grace between SIGTERM and SIGKILL for cancelled jobs (the cluster default if `None`).
    pub kill_wait_ms: Option<u64>,
    /// Program transfer chunk size and queue slots (cluster defaults if `None`).
    pub transfer_chunk_bytes: Option<usize>,
    pub transfer_slots: Option<usize>,
    /// Tree fanout of the tcp backend (default if `None`).
    pub fanout: Option<usize>,
    /// Encrypt the tcp links (`[tcp] encrypt`, on by default).
    pub encrypt: bool,
    /// The cgroups jobs run in (`[cluster] cgroups`).
    pub cgroups: CgroupMode,
    /// How PMIx clients prove their account (`[cluster] pmix`).
    pub pmix: storm_cluster::config::PmixSecurity,
    /// The primitives backend, and the libfabric provider for `ofi` (default if `None`).
    pub backend: BackendKind,
    pub provider: Option<String>,
    /// Scheduling policy, MPL, default limit.
    pub scheduler: SchedulerSection,
    /// Failure detection.
    pub failure: FailureSection,
    /// Who may run jobs.
    pub security: SecuritySection,
    /// What one user may hold at the MM.
    pub limits: LimitsSection,
    /// How long ended jobs stay in the history.
    pub history: storm_cluster::config::HistorySection,
    /// The daemons' log filter (`RUST_LOG` syntax); by default `$RUST_LOG`, else `warn`.
    pub log_filter: Option<String>,
    /// MM replicas: 1 for a single MM, else a replicated group of this many (`m0`, `m1`, …,
    /// each with its own state directory, socket and log).
    pub managers: u32,
    /// How the replicas keep in touch (with `managers` above 1).
    pub replication: storm_cluster::config::ReplicationSection,
    /// The cluster's name (`None`: `local-` and its directory's suffix, unique on this host;
    /// the name keys the cluster's cgroups, so a given one must be unique too).
    pub name: Option<String>,
    /// Peer clusters (docs/federation.md): this cluster's `[federation]` and `[[peer]]`s.
    pub federation: storm_cluster::federation::FederationSection,
    pub peers: Vec<storm_cluster::federation::PeerEntry>,
    /// Guest slots for nodes peers may lend this cluster, after its own nodes: slot
    /// `<cluster>-<node>` on a free loopback port, with the feature `guest` (`--borrow -C
    /// guest` keeps a job on borrowed nodes), its identity key beside the others (no NM runs
    /// there until a peer lends the node and its NM starts the guest).
    pub guests: Vec<storm_cluster::federation::GuestOf>,
}

impl LocalOptions {
    pub fn new(nodes: u32) -> Self {
        Self {
            nodes,
            cpus: None,
            timeslice_ms: 1.0,
            keep: false,
            kill_wait_ms: None,
            transfer_chunk_bytes: None,
            transfer_slots: None,
            fanout: None,
            encrypt: TcpSection::default().encrypt,
            cgroups: CgroupMode::Auto,
            pmix: storm_cluster::config::PmixSecurity::Munge,
            backend: BackendKind::Tcp,
            provider: None,
            scheduler: SchedulerSection::default(),
            failure: FailureSection::default(),
            security: SecuritySection::default(),
            limits: LimitsSection::default(),
            history: Default::default(),
            log_filter: None,
            managers: 1,
            replication: Default::default(),
            name: None,
            federation: Default::default(),
            peers: Vec::new(),
            guests: Vec::new(),
        }
    }
}

/// One daemon of the cluster.
pub(crate) struct Daemon {
    /// "storm-mm", or "storm-nm node3".
    name: String,
    pub(crate) child: Child,
    /// CLOCK_MONOTONIC (microseconds) just before its fork/exec.
    started_usec: u64,
    /// How long after `started` it said it was ready.
    ready_after: Option<Duration>,
}

/// A running embedded cluster.
pub struct LocalCluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    daemons: Vec<Daemon>,
    /// Where the daemons send their readiness (`NOTIFY_SOCKET`).
    notify: UnixDatagram,
    /// The daemons' log filter, for restarts.
    log_filter: Option<String>,
    pub config: ClusterConfig,
    pub config_path: PathBuf,
}

/// The name of every embedded cluster's directory (in the temporary directory) starts so.
const LOCAL_PREFIX: &str = "storm-local-";
/// In an embedded cluster's directory: the pid of the process that started it.
const OWNER_FILE: &str = "owner.pid";

/// Removes the directories of embedded clusters whose owner died without removing them (its
/// daemons ended with it, by their parent-death signal). Only this user's, and only those
/// with an owner file whose process is gone: a kept cluster (`--keep`) has none.
pub fn remove_abandoned_clusters(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with(LOCAL_PREFIX) {
            continue;
        }
        let dir = e.path();
        let mine = std::fs::symlink_metadata(&dir)
            .is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == me);
        let owner = std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        let Some(pid) = owner.filter(|_| mine) else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// This machine's CPUs: what each node of a cluster on it may use.
pub fn host_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// How an embedded cluster of `nodes` pretend nodes of `cpus` CPUs each binds ranks by
/// default: as a real node (`cores`) when it has one node that fits in this host's CPUs.
/// Pretend nodes share the host's CPUs: every node's NM may use them all and numbers them
/// alike, so binding would put each node's first rank on the same first CPU (two nodes of one
/// CPU each would take turns on CPU 0 while CPU 1 idles): `none` (docs/mpi.md).
pub fn embedded_cpu_bind(nodes: u32, cpus: u32) -> storm_cluster::cpu_bind::CpuBind {
    if nodes > 1 || cpus > host_cpus() {
        storm_cluster::cpu_bind::CpuBind::None
    } else {
        storm_cluster::cpu_bind::CpuBind::Cores
    }
}

/// The scheduler settings of an embedded cluster (or a testbed) of `nodes` nodes on this
/// host: as given, except that real-time daemons, the default, are left out when there are
/// more NMs than cores. Real-time priority serves one NM per node; with more NMs than cores on
/// one host their own work at real-time priority starves the tasks they start and stop
/// (measured with `storm-bench launch`: 32 nodes on 2 cores took 352 ms to run a
/// do-nothing job instead of 53). A priority other than the default is kept as asked.
pub fn embedded_scheduler(asked: &SchedulerSection, nodes: u32) -> SchedulerSection {
    let mut scheduler = asked.clone();
    if nodes > host_cpus()
        && scheduler.daemon_rt_priority == storm_cluster::config::DEFAULT_DAEMON_RT_PRIORITY
    {
        scheduler.daemon_rt_priority = 0;
    }
    scheduler
}

/// Where the storm daemons' binaries are: `$STORM_BIN_DIR`, or next to this program.
pub fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("STORM_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("locating storm-submit")?;
    Ok(exe
        .parent()
        .context("storm-submit has no directory")?
        .to_path_buf())
}

/// Starts daemon `name` with its output appended to `log` and its readiness sent to
/// `notify`. With `listener` it uses that pre-bound socket (`--listen-fd 3`); without, it
/// binds its configured address (a restart).
pub(crate) fn spawn_daemon(
    name: &str,
    bin: &Path,
    args: &[String],
    listener: Option<&TcpListener>,
    log: &Path,
    log_filter: Option<&str>,
    notify: &Path,
) -> Result<Daemon> {
    if !bin.is_file() {
        bail!(
            "{} not found (build the workspace, or set STORM_BIN_DIR)",
            bin.display()
        );
    }
    // Appended to: a restarted daemon keeps its predecessor's log.
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env(storm_cluster::daemon::NOTIFY_SOCKET, notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    // Out of the terminal's process group: Ctrl-C goes to storm-submit, which cancels the job
    // and then stops the daemons itself.
    cmd.process_group(0);
    match log_filter {
        Some(filter) => {
            cmd.env("RUST_LOG", filter);
        }
        None if std::env::var_os("RUST_LOG").is_none() => {
            cmd.env("RUST_LOG", "warn");
        }
        None => {}
    }
    if let Some(listener) = listener {
        let fd = listener.as_raw_fd();
        cmd.args(["--listen-fd", "3"]);
        // SAFETY: dup2 is async-signal-safe and only touches the child's descriptors.
        unsafe {
            cmd.pre_exec(move || {
                // dup2 onto itself is a no-op that would leave close-on-exec set.
                let ok = if fd == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    flags >= 0 && libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) >= 0
                } else {
                    libc::dup2(fd, 3) >= 0
                };
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    // The daemons end with whoever started them, however it ends (a SIGKILL, a panic, a
    // second Ctrl-C): the kernel sends them SIGTERM when their parent dies.
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl, getppid and kill are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the signal was armed.
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGTERM);
            }
            Ok(())
        });
    }
    let started_usec = storm_cluster::daemon::monotonic_usec();
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Daemon {
        name: name.to_string(),
        child,
        started_usec,
        ready_after: None,
    })
}

/// The name of the one daemon of a cluster on the local backend (`storm-local`).
const LOCAL_DAEMON: &str = "storm-local";

/// The log file of daemon `name` ("storm-mm", "storm-mm m1", "storm-nm node3";
/// "storm-local" logs as the MM does) under `root`.
fn daemon_log(root: &Path, name: &str) -> PathBuf {
    match name
        .strip_prefix("storm-nm ")
        .or_else(|| name.strip_prefix("storm-mm "))
    {
        Some(node) => root.join(format!("{node}.log")),
        None => root.join("mm.log"),
    }
}

/// `n` loopback addresses no one listens on now (for daemons that bind their own later).
///
/// They are drawn at random from below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port the kernel picked (port 0) and that is then
/// freed until the daemon binds it may meanwhile become the local port of any outgoing
/// connection on the host, and the daemon's bind then fails with "Address already in use".
fn free_addresses(n: usize) -> Result<Vec<SocketAddr>> {
    use rand::Rng;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let range = if ephemeral_low > 12_000 {
        10_000..ephemeral_low
    } else {
        // A host whose ephemeral range starts low: ports above it are the ones left.
        ephemeral_low.max(1024)..u16::MAX
    };
    let mut rng = rand::rng();
    let mut held: Vec<TcpListener> = Vec::with_capacity(n);
    let mut tries = 0;
    while held.len() < n {
        tries += 1;
        if tries > 1000 + 10 * n {
            bail!("no free loopback port found in {range:?} after {tries} tries");
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", rng.random_range(range.clone()))) {
            held.push(l);
        }
    }
    Ok(held
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<_>>()?)
}

/// A loopback port no one listens on now, drawn as [`free_addresses`] draws them: for a
/// daemon a caller configures to bind it later (a federation agent's listener).
pub fn free_loopback_port() -> Result<u16> {
    Ok(free_addresses(1)?[0].port())
}

/// The last lines of a daemon's log worth showing: its error and causes, without the
/// backtrace that follows them.
pub(crate) fn tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let end = text
        .to_lowercase()
        .find("stack backtrace")
        .unwrap_or(text.len());
    let lines: Vec<&str> = text[..end]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Waits until the MM answers on one of `sockets` (a replicated MM's leader, on any of its
/// replicas') and every NM of the cluster's own nodes, the first `own` of the file, has
/// joined (none "unknown" or "joining"; guest slots come after them and join only while a
/// peer lends their node); `check` runs between tries and fails early when a daemon died.
pub(crate) fn wait_for_nodes(
    sockets: &[PathBuf],
    own: u32,
    limit: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        check()?;
        for socket in sockets {
            if let Ok(client) = Client::connect(socket)
                && let Ok(Reply::Nodes(nodes)) = client.call(&Request::Nodes)
                && nodes
                    .iter()
                    .filter(|n| n.id < own)
                    .all(|n| !matches!(n.state, NodeState::Unknown | NodeState::Joining))
            {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the machine manager did not report every node up on {} within {} s",
                sockets
                    .iter()
                    .map(|s| s.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl LocalCluster {
    pub fn start(opts: &LocalOptions) -> Result<Self> {
        if opts.nodes == 0 {
            bail!("--local needs at least one node");
        }
        remove_abandoned_clusters(&std::env::temp_dir());
        let dir = tempfile::Builder::new()
            .prefix(LOCAL_PREFIX)
            .tempdir()
            .context("creating a temporary directory")?;
        let root = dir.path().to_path_buf();
        // Whose cluster this is: a later one removes the directory if its owner died
        // without removing it (SIGKILL). A kept cluster has no owner file.
        if !opts.keep {
            std::fs::write(root.join(OWNER_FILE), std::process::id().to_string())
                .context("writing the cluster's owner file")?;
        }
        // Only the user who started it can reach the cluster (its socket, files and key).
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let listeners = (0..=opts.nodes)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()
            .context("binding loopback ports")?;
        let addr = |l: &TcpListener| -> Result<SocketAddr> { Ok(l.local_addr()?) };
        let cpus = opts.cpus.unwrap_or_else(host_cpus);
        let nodes = (0..opts.nodes as usize)
            .map(|i| {
                Ok(NodeEntry {
                    name: format!("node{i}"),
                    address: addr(&listeners[i])?,
                    spool: root.join(format!("node{i}")),
                    cpus,
                    mem: None,
                    features: Vec::new(),
                    guest_of: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut nodes = nodes;
        for g in &opts.guests {
            let name = format!("{}-{}", g.cluster, g.node);
            nodes.push(NodeEntry {
                address: free_addresses(1)?[0],
                spool: root.join(&name),
                name,
                cpus,
                mem: None,
                features: vec!["guest".into()],
                guest_of: Some(g.clone()),
            });
        }
        let config = ClusterConfig {
            cluster: ClusterSection {
                // Unique on this host (clusters started by one process too): the name keys
                // the cluster's cgroups.
                name: opts.name.clone().unwrap_or_else(|| {
                    format!(
                        "local-{}",
                        root.file_name()
                            .and_then(|n| n.to_str())
                            .and_then(|n| n.strip_prefix("storm-local-"))
                            .unwrap_or("0")
                    )
                }),
                timeslice_ms: opts.timeslice_ms,
                control_socket: root.join("mm.sock"),
                state_dir: root.join("mm-state"),
                kill_wait_ms: opts
                    .kill_wait_ms
                    .unwrap_or(ClusterSection::default().kill_wait_ms),
                backend: opts.backend,
                cgroups: opts.cgroups,
                pmix: opts.pmix,
                cpu_bind: embedded_cpu_bind(opts.nodes, cpus),
                ..ClusterSection::default()
            },
            tcp: TcpSection {
                encrypt: opts.encrypt,
                ..TcpSection::default()
            },
            security: opts.security.clone(),
            limits: opts.limits.clone(),
            ofi: OfiSection {
                provider: opts.provider.clone(),
            },
            scheduler: embedded_scheduler(&opts.scheduler, opts.nodes),
            failure: opts.failure.clone(),
            history: opts.history.clone(),
            relay: Default::default(),
            mm: MmSection {
                address: addr(&listeners[opts.nodes as usize])?,
            },
            // Nodes here share one kernel: each node's CPU and memory are its jobs'.
            monitoring: storm_cluster::config::MonitoringSection {
                source: storm_cluster::sample::Source::NodeCgroup,
                ..Default::default()
            },
            replication: Default::default(),
            health: Default::default(),
            federation: opts.federation.clone(),
            peers: opts.peers.clone(),
            managers: Vec::new(),
            nodes,
        };
        let mut config = config;
        if let Some(b) = opts.transfer_chunk_bytes {
            config.cluster.transfer_chunk_bytes = b;
        }
        if let Some(s) = opts.transfer_slots {
            config.cluster.transfer_slots = s;
        }
        if let Some(f) = opts.fanout {
            config.tcp.fanout = f;
        }
        if opts.managers > 1 {
            if opts.backend != BackendKind::Tcp {
                bail!("a replicated MM (--managers) needs the tcp backend");
            }
            let addrs = free_addresses(2 * opts.managers as usize)?;
            config.managers = (0..opts.managers as usize)
                .map(|i| ManagerEntry {
                    name: format!("m{i}"),
                    address: addrs[2 * i],
                    peer_address: addrs[2 * i + 1],
                    state_dir: Some(root.join(format!("m{i}-state"))),
                    control_socket: Some(root.join(format!("m{i}.sock"))),
                    relay_address: None,
                })
                .collect();
            config.mm.address = config.managers[0].address;
            config.replication = opts.replication.clone();
        }
        storm_cluster::identity::use_one_host_keys(&mut config, &root);
        config.validate()?;
        let config_path = root.join("cluster.toml");
        std::fs::write(&config_path, config.to_toml())?;
        // A fresh key for every cluster, next to its file (where the daemons look).
        storm_cluster::key::generate(&root.join(storm_cluster::key::DEFAULT_NAME))?;
        let names: Vec<&str> = config.nodes.iter().map(|n| n.name.as_str()).collect();
        storm_cluster::identity::generate_for_one_host(&root, &names)?;
        let bin = bin_dir()?;
        let cfg_arg = config_path.display().to_string();
        let notify_path = root.join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path)
            .with_context(|| format!("binding {}", notify_path.display()))?;
        notify.set_nonblocking(true)?;
        let mut cluster = LocalCluster {
            dir: Some(dir),
            root: root.clone(),
            daemons: Vec::new(),
            notify,
            log_filter: opts.log_filter.clone(),
            config,
            config_path,
        };
        if opts.backend == BackendKind::Local {
            // One process: the MM and every NM as threads over one in-process fabric.
            let all = spawn_daemon(
                LOCAL_DAEMON,
                &bin.join("storm-local"),
                &["--config".into(), cfg_arg.clone()],
                None,
                &root.join("mm.log"),
                opts.log_filter.as_deref(),
                &notify_path,
            )?;
            cluster.daemons.push(all);
        } else {
            if opts.managers > 1 {
                // Each replica binds the MM's endpoint only once it leads.
                for i in 0..opts.managers {
                    let name = format!("m{i}");
                    let mm = spawn_daemon(
                        &format!("storm-mm {name}"),
                        &bin.join("storm-mm"),
                        &[
                            "--config".into(),
                            cfg_arg.clone(),
                            "--manager".into(),
                            name.clone(),
                        ],
                        None,
                        &root.join(format!("{name}.log")),
                        opts.log_filter.as_deref(),
                        &notify_path,
                    )?;
                    cluster.daemons.push(mm);
                }
            } else {
                let mm = spawn_daemon(
                    "storm-mm",
                    &bin.join("storm-mm"),
                    &["--config".into(), cfg_arg.clone()],
                    Some(&listeners[opts.nodes as usize]),
                    &root.join("mm.log"),
                    opts.log_filter.as_deref(),
                    &notify_path,
                )?;
                cluster.daemons.push(mm);
            }
            for (i, listener) in listeners.iter().take(opts.nodes as usize).enumerate() {
                let nm = spawn_daemon(
                    &format!("storm-nm node{i}"),
                    &bin.join("storm-nm"),
                    &[
                        "--config".into(),
                        cfg_arg.clone(),
                        "--node".into(),
                        format!("node{i}"),
                    ],
                    Some(listener),
                    &root.join(format!("node{i}.log")),
                    opts.log_filter.as_deref(),
                    &notify_path,
                )?;
                cluster.daemons.push(nm);
            }
        }
        drop(listeners);
        if opts.keep {
            cluster.dir.take().map(|d| d.keep());
        }
        cluster.wait_for_mm()?;
        Ok(cluster)
    }

    /// The directory holding the cluster file, logs and spools.
    /// The cluster file the daemons run by.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn socket(&self) -> &Path {
        &self.config.cluster.control_socket
    }

    /// Which replica of a replicated MM leads now ("m1"), by which one takes a control
    /// connection (followers do not listen).
    pub fn leader(&self) -> Option<String> {
        self.config
            .managers
            .iter()
            .zip(self.config.control_sockets())
            .find(|(_, s)| Client::connect_within(s, Some(Duration::from_millis(300))).is_ok())
            .map(|(m, _)| m.name.clone())
    }

    /// The control socket of the MM: the leader's, in a replicated group (the first replica's
    /// if none leads now).
    pub fn leader_socket(&self) -> PathBuf {
        let sockets = self.config.control_sockets();
        if sockets.len() == 1 {
            return self.socket().to_path_buf();
        }
        sockets
            .iter()
            .find(|s| Client::connect_within(s, Some(Duration::from_millis(300))).is_ok())
            .unwrap_or(&sockets[0])
            .clone()
    }

    /// Kills replica `name` of a replicated MM ("m1") with SIGKILL, and reaps it.
    pub fn kill_manager(&mut self, name: &str) -> Result<()> {
        self.kill_daemon(&format!("storm-mm {name}"))
    }

    /// Starts replica `name` again after [`LocalCluster::kill_manager`] (it rejoins the
    /// group as a follower).
    pub fn restart_manager(&mut self, name: &str) -> Result<()> {
        self.restart_daemon(&format!("storm-mm {name}"), &[])
    }

    /// Starts replica `name` again with `--join`: on an empty state directory it asks the
    /// group to admit it in the place of the replica removed from it.
    pub fn join_manager(&mut self, name: &str) -> Result<()> {
        self.restart_daemon(&format!("storm-mm {name}"), &["--join"])
    }

    /// Whether daemon `name` ("storm-mm m1") still runs; false once it exited (and it is
    /// reaped).
    pub fn is_running(&mut self, name: &str) -> bool {
        self.daemons
            .iter_mut()
            .find(|d| d.name == name)
            .is_some_and(|d| matches!(d.child.try_wait(), Ok(None)))
    }

    /// Kills node `i`'s NM with SIGKILL, as a crash would (fault injection for tests and
    /// benchmarks), and reaps it.
    pub fn kill_nm(&mut self, i: u32) -> Result<()> {
        self.kill_daemon(&format!("storm-nm node{i}"))
    }

    /// Kills the MM with SIGKILL, as a crash would, and reaps it.
    pub fn kill_mm(&mut self) -> Result<()> {
        self.kill_daemon("storm-mm")
    }

    fn kill_daemon(&mut self, name: &str) -> Result<()> {
        let Some(d) = self.daemons.iter_mut().find(|d| d.name == name) else {
            bail!("this cluster has no {name}");
        };
        d.child.kill().with_context(|| format!("killing {name}"))?;
        d.child.wait()?;
        Ok(())
    }

    /// Starts daemon `name` again after it was killed: it binds its configured address (and
    /// the MM takes up its journal, an NM registers with the MM).
    fn restart_daemon(&mut self, name: &str, extra: &[&str]) -> Result<()> {
        // Make room in the readiness socket's short queue for the restarted daemon's message.
        self.collect_ready();
        let Some(pos) = self.daemons.iter().position(|d| d.name == name) else {
            bail!("this cluster has no {name}");
        };
        // A second one would find the first's socket or address taken, and leave.
        if self.daemons[pos].child.try_wait()?.is_none() {
            bail!("{name} is still running: kill it first");
        }
        let mut args = vec!["--config".into(), self.config_path.display().to_string()];
        let bin = match (
            name.strip_prefix("storm-nm "),
            name.strip_prefix("storm-mm "),
        ) {
            (Some(node), _) => {
                args.extend(["--node".into(), node.to_string()]);
                "storm-nm"
            }
            (_, Some(replica)) => {
                args.extend(["--manager".into(), replica.to_string()]);
                "storm-mm"
            }
            _ => "storm-mm",
        };
        args.extend(extra.iter().map(|a| a.to_string()));
        let log = daemon_log(&self.root, name);
        let daemon = spawn_daemon(
            name,
            &bin_dir()?.join(bin),
            &args,
            None,
            &log,
            self.log_filter.as_deref(),
            &self.root.join("notify.sock"),
        )
        .with_context(|| format!("restarting {name}"))?;
        self.daemons[pos] = daemon;
        Ok(())
    }

    /// How long each daemon took from fork/exec to telling it was ready (`None`: not yet,
    /// or it never did), by name, in start order.
    pub fn ready_times(&mut self) -> Vec<(String, Option<Duration>)> {
        self.collect_ready();
        self.daemons
            .iter()
            .map(|d| (d.name.clone(), d.ready_after))
            .collect()
    }

    /// Takes the readiness messages that arrived, and credits each to its daemon at the time
    /// it was sent (or read, for a message without one).
    fn collect_ready(&mut self) {
        let mut buf = [0u8; 512];
        while let Ok(n) = self.notify.recv(&mut buf) {
            let now = storm_cluster::daemon::monotonic_usec();
            let Some(ready) = storm_cluster::daemon::parse_ready(&buf[..n]) else {
                continue;
            };
            if let Some(d) = self.daemons.iter_mut().find(|d| d.child.id() == ready.pid) {
                let at = ready.monotonic_usec.unwrap_or(now);
                d.ready_after
                    .get_or_insert(Duration::from_micros(at.saturating_sub(d.started_usec)));
            }
        }
    }

    /// Starts the MM again after [`LocalCluster::kill_mm`]; it binds its configured address
    /// and takes up its journal. Returns once it is started (not yet ready).
    pub fn restart_mm(&mut self) -> Result<()> {
        self.restart_daemon("storm-mm", &[])
    }

    /// Starts node `i`'s NM again after [`LocalCluster::kill_nm`]; it binds its configured
    /// address and registers with the MM.
    pub fn restart_nm(&mut self, i: u32) -> Result<()> {
        self.restart_daemon(&format!("storm-nm node{i}"), &[])
    }

    /// The daemons' names ("storm-mm", "storm-nm node3") and process ids, for tools that
    /// account for their CPU time.
    pub fn daemon_pids(&self) -> Vec<(&str, u32)> {
        self.daemons
            .iter()
            .map(|d| (d.name.as_str(), d.child.id()))
            .collect()
    }

    fn wait_for_mm(&mut self) -> Result<()> {
        let root = self.root.clone();
        let sockets = self.config.control_sockets();
        let mut exited = false;
        let own = self.config.home_node_count();
        wait_for_nodes(&sockets, own, Duration::from_secs(20), || {
            // Read readiness as it comes: the socket's queue is short.
            self.collect_ready();
            for d in self.daemons.iter_mut() {
                if let Some(status) = d.child.try_wait()? {
                    exited = true;
                    bail!(
                        "{} exited during start-up ({status}):\n{}",
                        d.name,
                        tail(&daemon_log(&root, &d.name))
                    );
                }
            }
            Ok(())
        })
        .map_err(|e| {
            if exited {
                e
            } else {
                e.context(format!("log of the MM:\n{}", tail(&root.join("mm.log"))))
            }
        })
    }

    /// Asks the MM to shut the cluster down, and waits for every daemon.
    pub fn shutdown(mut self) -> Result<()> {
        if let Ok((client, _)) = crate::connect_any(&self.config.control_sockets()) {
            match client.call(&Request::Shutdown) {
                Ok(Reply::Done) => {}
                Ok(other) => eprintln!("storm-submit: unexpected shutdown reply {other:?}"),
                Err(e) => eprintln!("storm-submit: shutdown: {e}"),
            }
        }
        // The other replicas of a group stop on a signal.
        for d in &mut self.daemons {
            if d.name.starts_with("storm-mm ")
                && d.child.try_wait()?.is_none()
                && let Ok(pid) = i32::try_from(d.child.id())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for d in &mut self.daemons {
            while d.child.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.kill();
        Ok(())
    }

    fn kill(&mut self) {
        for d in &mut self.daemons {
            if let Ok(None) = d.child.try_wait() {
                let _ = d.child.kill();
                let _ = d.child.wait();
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.kill();
    }
}
