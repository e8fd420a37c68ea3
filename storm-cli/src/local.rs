//! The embedded cluster behind `storm-submit --local N`: an MM and N NMs on this machine,
//! talking over loopback, each NM with its own spool directory under one temporary directory.
//!
//! Every daemon's listening socket is bound here first (port 0, so the kernel picks free
//! ports) and handed to the daemon as descriptor 3 (`--listen-fd 3`): the cluster file lists
//! the real addresses and no daemon can lose a race for its port.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cluster::config::{
    BackendKind, ClusterConfig, ClusterSection, FailureSection, MmSection, NodeEntry, OfiSection,
    SchedulerSection, TcpSection,
};
use storm_cluster::control::{Client, Reply, Request};

/// Options of the embedded cluster.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub nodes: u32,
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
    /// The primitives backend, and the libfabric provider for `ofi` (default if `None`).
    pub backend: BackendKind,
    pub provider: Option<String>,
    /// Scheduling policy, MPL, default limit.
    pub scheduler: SchedulerSection,
    /// Failure detection.
    pub failure: FailureSection,
}

impl LocalOptions {
    pub fn new(nodes: u32) -> Self {
        Self {
            nodes,
            timeslice_ms: 1.0,
            keep: false,
            kill_wait_ms: None,
            transfer_chunk_bytes: None,
            transfer_slots: None,
            fanout: None,
            backend: BackendKind::Tcp,
            provider: None,
            scheduler: SchedulerSection::default(),
            failure: FailureSection::default(),
        }
    }
}

/// A running embedded cluster.
pub struct LocalCluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    daemons: Vec<(String, Child)>,
    pub config: ClusterConfig,
    pub config_path: PathBuf,
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

/// Starts a daemon with its output appended to `log`. With `listener` it uses that
/// pre-bound socket (`--listen-fd 3`); without, it binds its configured address (a restart).
fn spawn_daemon(
    bin: &Path,
    args: &[String],
    listener: Option<&TcpListener>,
    log: &Path,
) -> Result<Child> {
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
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    // Out of the terminal's process group: Ctrl-C goes to storm-submit, which cancels the job
    // and then stops the daemons itself.
    cmd.process_group(0);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn");
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
    cmd.spawn()
        .with_context(|| format!("starting {}", bin.display()))
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

/// Waits until the MM answers on `socket` and every NM has joined (none "unknown" or
/// "joining"); `check` runs between tries and fails early when a daemon died.
pub(crate) fn wait_for_nodes(
    socket: &Path,
    limit: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        check()?;
        if let Ok(client) = Client::connect(socket)
            && let Ok(Reply::Nodes(nodes)) = client.call(&Request::Nodes)
            && nodes
                .iter()
                .all(|n| !matches!(n.state.as_str(), "unknown" | "joining"))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the machine manager did not report every node up on {} within {} s",
                socket.display(),
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
        let dir = tempfile::Builder::new()
            .prefix("storm-local-")
            .tempdir()
            .context("creating a temporary directory")?;
        let root = dir.path().to_path_buf();
        // Jobs run as the submitting user, who must be able to reach the spool directories.
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let listeners = (0..=opts.nodes)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()
            .context("binding loopback ports")?;
        let addr = |l: &TcpListener| -> Result<SocketAddr> { Ok(l.local_addr()?) };
        let nodes = (0..opts.nodes as usize)
            .map(|i| {
                Ok(NodeEntry {
                    name: format!("node{i}"),
                    address: addr(&listeners[i])?,
                    spool: root.join(format!("node{i}")),
                    cpus: 1,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let config = ClusterConfig {
            cluster: ClusterSection {
                name: format!("local-{}", std::process::id()),
                timeslice_ms: opts.timeslice_ms,
                control_socket: root.join("mm.sock"),
                state_dir: root.join("mm-state"),
                kill_wait_ms: opts
                    .kill_wait_ms
                    .unwrap_or(ClusterSection::default().kill_wait_ms),
                backend: opts.backend,
                ..ClusterSection::default()
            },
            tcp: TcpSection::default(),
            ofi: OfiSection {
                provider: opts.provider.clone(),
            },
            scheduler: opts.scheduler.clone(),
            failure: opts.failure.clone(),
            mm: MmSection {
                address: addr(&listeners[opts.nodes as usize])?,
            },
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
        config.validate()?;
        let config_path = root.join("cluster.toml");
        std::fs::write(&config_path, config.to_toml())?;
        let bin = bin_dir()?;
        let cfg_arg = config_path.display().to_string();
        let mut cluster = LocalCluster {
            dir: Some(dir),
            root: root.clone(),
            daemons: Vec::new(),
            config,
            config_path,
        };
        let mm = spawn_daemon(
            &bin.join("storm-mm"),
            &["--config".into(), cfg_arg.clone()],
            Some(&listeners[opts.nodes as usize]),
            &root.join("mm.log"),
        )?;
        cluster.daemons.push(("storm-mm".into(), mm));
        for (i, listener) in listeners.iter().take(opts.nodes as usize).enumerate() {
            let nm = spawn_daemon(
                &bin.join("storm-nm"),
                &[
                    "--config".into(),
                    cfg_arg.clone(),
                    "--node".into(),
                    format!("node{i}"),
                ],
                Some(listener),
                &root.join(format!("node{i}.log")),
            )?;
            cluster.daemons.push((format!("storm-nm node{i}"), nm));
        }
        drop(listeners);
        if opts.keep {
            cluster.dir.take().map(|d| d.keep());
        }
        cluster.wait_for_mm()?;
        Ok(cluster)
    }

    /// The directory holding the cluster file, logs and spools.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn socket(&self) -> &Path {
        &self.config.cluster.control_socket
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
        let Some((_, child)) = self.daemons.iter_mut().find(|(n, _)| n == name) else {
            bail!("this cluster has no {name}");
        };
        child.kill().with_context(|| format!("killing {name}"))?;
        child.wait()?;
        Ok(())
    }

    /// Starts the MM again after [`LocalCluster::kill_mm`]; it binds its configured address
    /// and takes up its journal. Returns once it is started (not yet ready).
    pub fn restart_mm(&mut self) -> Result<()> {
        let Some(pos) = self.daemons.iter().position(|(n, _)| n == "storm-mm") else {
            bail!("this cluster has no storm-mm");
        };
        let child = spawn_daemon(
            &bin_dir()?.join("storm-mm"),
            &["--config".into(), self.config_path.display().to_string()],
            None,
            &self.root.join("mm.log"),
        )
        .context("restarting storm-mm")?;
        self.daemons[pos].1 = child;
        Ok(())
    }

    /// Starts node `i`'s NM again after [`LocalCluster::kill_nm`]; it binds its configured
    /// address and registers with the MM.
    pub fn restart_nm(&mut self, i: u32) -> Result<()> {
        let name = format!("storm-nm node{i}");
        let Some(pos) = self.daemons.iter().position(|(n, _)| *n == name) else {
            bail!("this cluster has no {name}");
        };
        let child = spawn_daemon(
            &bin_dir()?.join("storm-nm"),
            &[
                "--config".into(),
                self.config_path.display().to_string(),
                "--node".into(),
                format!("node{i}"),
            ],
            None,
            &self.root.join(format!("node{i}.log")),
        )
        .with_context(|| format!("restarting {name}"))?;
        self.daemons[pos].1 = child;
        Ok(())
    }

    /// The daemons' names ("storm-mm", "storm-nm node3") and process ids, for tools that
    /// account for their CPU time.
    pub fn daemon_pids(&self) -> Vec<(&str, u32)> {
        self.daemons
            .iter()
            .map(|(name, child)| (name.as_str(), child.id()))
            .collect()
    }

    fn wait_for_mm(&mut self) -> Result<()> {
        let root = self.root.clone();
        let socket = self.socket().to_path_buf();
        let daemons = &mut self.daemons;
        wait_for_nodes(&socket, Duration::from_secs(20), || {
            for (name, child) in daemons.iter_mut() {
                if let Some(status) = child.try_wait()? {
                    let log = if name == "storm-mm" {
                        root.join("mm.log")
                    } else {
                        root.join(format!("{}.log", name.trim_start_matches("storm-nm ")))
                    };
                    bail!("{name} exited during start-up ({status}):\n{}", tail(&log));
                }
            }
            Ok(())
        })
        .map_err(|e| e.context(format!("log of the MM:\n{}", tail(&root.join("mm.log")))))
    }

    /// Asks the MM to shut the cluster down, and waits for every daemon.
    pub fn shutdown(mut self) -> Result<()> {
        if let Ok(client) = Client::connect(self.socket()) {
            match client.call(&Request::Shutdown) {
                Ok(Reply::Done) => {}
                Ok(other) => eprintln!("storm-submit: unexpected shutdown reply {other:?}"),
                Err(e) => eprintln!("storm-submit: shutdown: {e}"),
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, child) in &mut self.daemons {
            while child.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.kill();
        Ok(())
    }

    fn kill(&mut self) {
        for (_, child) in &mut self.daemons {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.kill();
    }
}
