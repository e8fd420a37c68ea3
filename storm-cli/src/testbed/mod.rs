//! A test cluster in network namespaces: every node a network namespace of its own, with its
//! own address, running one storm-nm; the MM in another; all joined by a bridge that lives in a
//! "switch" namespace. No address is ever configured outside these namespaces, so nothing
//! reaches the host's network, and a link can be cut (`ip link set ... down`) like a cable.
//!
//! Layout for a testbed named `T` with N nodes (addresses in 10.200.0.0/16):
//!
//! * `T-sw`: bridge `br0`; one veth end per node (`n0`..) and one for the MM (`mm`);
//! * `T-mm`: `eth0` = 10.200.0.1, storm-mm listening on port 7000 (and the manager side of
//!   the control relay on 7001);
//! * `T-n<i>`: `eth0` = 10.200.0.2 + i, storm-nm for node `node<i>` on port 7000;
//! * with `managers` above 1, a replicated MM: `T-m<j>` with `eth0` = 10.200.255.10 + j (veth
//!   end `m<j>` on the bridge), storm-mm `--manager m<j>` with its endpoint on port 7000 and
//!   the replicas' fabric on 7010, and the manager side of the control relay beside it on
//!   7001 (`storm-relay --manager --replica m<j>`); `T-mm` then runs nothing.
//!
//! The cluster file, logs, spools, the MM's control socket and a state file (namespaces and
//! daemon pids) live in one directory. [`Testbed::down`] (also run on drop) kills the daemons
//! and deletes the namespaces, which deletes their links; [`down_by_state`] does the same from
//! the state file, for `storm-testbed down` and for testbeds left behind by an interrupted run.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cluster::config::{
    ClusterConfig, ClusterSection, FailureSection, ManagerEntry, MmSection, NodeEntry, OfiSection,
    RelaySection, SchedulerSection, TcpSection,
};

use crate::local::{bin_dir, tail, wait_for_nodes};

pub mod capture;
mod delay;
pub mod federation;

/// The port every daemon listens on, each in its own namespace.
const PORT: u16 = 7000;
/// Where the manager side of the control relay listens, on the MM's address.
const RELAY_PORT: u16 = 7001;
const STATE_FILE: &str = "testbed.state";

/// What to build.
#[derive(Debug, Clone)]
pub struct TestbedOptions {
    /// Namespace prefix; at most 8 characters so that names stay short.
    pub name: String,
    pub nodes: u32,
    /// CPUs of every node (they all share this machine's).
    pub cpus: u32,
    /// Where the cluster file, logs, spools and state go (created; must not exist).
    pub dir: PathBuf,
    pub timeslice_ms: f64,
    pub scheduler: SchedulerSection,
    pub failure: FailureSection,
    /// MM replicas: 1 for a single MM, else a replicated group of this many.
    pub managers: u32,
    /// How the replicas keep in touch (`[replication]`), with more than one.
    pub replication: storm_cluster::config::ReplicationSection,
    /// The health checks (`[health]`).
    pub health: storm_cluster::health::HealthSection,
    /// Where the NMs read the fabric ports' counters (`[monitoring] sysfs`; `/sys` if not
    /// given): tests point it at a tree of their own.
    pub sysfs: Option<PathBuf>,
    /// The cluster's `[cluster] name` (`None`: `testbed-NAME`).
    pub cluster_name: Option<String>,
    /// Peer clusters (`[federation]`, `[[peer]]`): set by [`federation`] for each cluster of
    /// a testbed of several.
    pub federation: storm_cluster::federation::FederationSection,
    pub peers: Vec<storm_cluster::federation::PeerEntry>,
    /// The second octet of the testbed's addresses (10.NET.0.0/16): [`SINGLE_NET`] for a
    /// testbed alone; cluster `k` of several has its own, so that their nodes can reach each
    /// other's (a lent node, the borrower's fabric).
    pub net: u8,
    /// Guest slots after the nodes (`guest_of`): set by [`federation`] for the nodes of the
    /// other clusters that may be lent to this one. No NM runs there but a lent node's guest.
    pub guests: Vec<NodeEntry>,
    /// `[limits]` of the cluster.
    pub limits: storm_cluster::config::LimitsSection,
}

/// The second octet of a testbed's addresses when it is alone.
pub const SINGLE_NET: u8 = 200;

/// The address of replica `j` of a testbed's replicated MM.
pub fn manager_addr(j: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 255, 10 + j as u8)
}

/// Where a replica listens for the others (the replicas' own fabric).
const PEER_PORT: u16 = 7010;

/// The replicas' nodes on the bridge: everything outside this is a node (or the relay).
const MANAGERS_NET: &str = "10.200.255.0/24";

/// A testbed's replicated MM has at most this many replicas.
const MAX_MANAGERS: u32 = 7;

/// A running testbed. Dropping it tears it down.
#[derive(Debug)]
pub struct Testbed {
    pub name: String,
    pub dir: PathBuf,
    pub config: ClusterConfig,
    pub config_path: PathBuf,
    namespaces: Vec<String>,
    /// (daemon name, pid)
    daemons: Vec<(String, u32)>,
    /// The daemons as our children, reaped after teardown (empty once handed to a CLI user).
    children: Vec<std::process::Child>,
    /// Delay lines inserted on nodes' links, by node.
    delay_lines: std::collections::BTreeMap<u32, delay::DelayLine>,
    torn_down: bool,
    /// The second octet of its addresses ([`TestbedOptions::net`]).
    net: u8,
}

/// Runs `ip` with `args`; the error names the command and what ip said.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs the nftables script `script` in namespace `ns`; the error says what nft said.
pub(crate) fn nft(ns: &str, script: &str) -> Result<()> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", script])
        .stdin(Stdio::null())
        .output()
        .context("running ip netns exec ... nft (install iproute2 and nftables)")?;
    if !out.status.success() {
        bail!(
            "nft {script:?} in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The address of node `i` of a testbed alone.
pub fn node_addr(i: u32) -> Ipv4Addr {
    node_addr_in(SINGLE_NET, i)
}

/// The address of node `i` of the testbed whose addresses are 10.`net`.0.0/16.
pub fn node_addr_in(net: u8, i: u32) -> Ipv4Addr {
    let host = i + 2;
    Ipv4Addr::new(10, net, (host >> 8) as u8, (host & 0xff) as u8)
}

/// The MM's address in a testbed alone.
pub const MM_ADDR: Ipv4Addr = mm_addr_in(SINGLE_NET);

/// The MM's address in the testbed whose addresses are 10.`net`.0.0/16.
pub const fn mm_addr_in(net: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, net, 0, 1)
}

/// Whether this process may create network namespaces: tries one.
pub fn namespaces_available() -> Result<(), String> {
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("stbprobe{}-{n}", std::process::id());
    match ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = ip(&["netns", "del", &probe]);
            Ok(())
        }
        Err(e) => Err(format!("{e:#}")),
    }
}

impl Testbed {
    pub fn switch_ns(&self) -> String {
        format!("{}-sw", self.name)
    }

    pub fn node_ns(&self, i: u32) -> String {
        format!("{}-n{i}", self.name)
    }

    /// The TCP payloads seen on node `i`'s link during `window` (see [`capture`]).
    pub fn capture(&self, i: u32, window: Duration) -> Result<Vec<capture::Segment>> {
        capture::capture(&self.switch_ns(), &format!("n{i}"), window)
    }

    /// Runs `f` on a thread inside node `i`'s network namespace.
    pub fn in_node<T: Send + 'static>(
        &self,
        i: u32,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let ns = self.node_ns(i);
        std::thread::spawn(move || -> Result<T> {
            delay::enter_netns(&ns)?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the thread in node {i}'s namespace panicked"))?
    }

    pub fn socket(&self) -> &Path {
        &self.config.cluster.control_socket
    }

    /// Builds the namespaces, writes the cluster file, starts the daemons and waits until the
    /// MM sees every NM.
    pub fn up(opts: &TestbedOptions) -> Result<Self> {
        if opts.nodes == 0 || opts.nodes > 60_000 {
            bail!("a testbed has 1 to 60000 nodes, not {}", opts.nodes);
        }
        if opts.managers == 0 || opts.managers > MAX_MANAGERS {
            bail!(
                "a testbed has 1 to {MAX_MANAGERS} MM replicas, not {}",
                opts.managers
            );
        }
        if opts.name.is_empty()
            || opts.name.len() > 8
            || !opts.name.chars().all(|c| c.is_ascii_alphanumeric())
        {
            bail!("testbed name {:?}: use 1 to 8 letters or digits", opts.name);
        }
        std::fs::create_dir(&opts.dir)
            .with_context(|| format!("creating {}", opts.dir.display()))?;
        // Jobs run as their submitter, who must reach the spools.
        std::fs::set_permissions(
            &opts.dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let mut config = make_config(opts)?;
        storm_cluster::identity::use_one_host_keys(&mut config, &opts.dir);
        let config_path = opts.dir.join("cluster.toml");
        std::fs::write(&config_path, config.to_toml())?;
        // A fresh key for every testbed, next to its file (where the daemons look).
        storm_cluster::key::generate(&opts.dir.join(storm_cluster::key::DEFAULT_NAME))?;
        let names: Vec<&str> = config.nodes.iter().map(|n| n.name.as_str()).collect();
        storm_cluster::identity::generate_for_one_host(&opts.dir, &names)?;
        let mut tb = Testbed::empty(opts, config, config_path);
        // On any error below, dropping `tb` removes what was made so far.
        tb.build_network(opts.nodes)?;
        tb.start_daemons()?;
        let daemons = tb.daemons.clone();
        let dir = tb.dir.clone();
        let sockets = tb.config.control_sockets();
        wait_for_nodes(&sockets, opts.nodes, Duration::from_secs(30), || {
            for (name, pid) in &daemons {
                if !alive(*pid) {
                    let log = dir.join(format!("{}.log", name.replace(' ', "-")));
                    bail!("{name} exited during start-up:\n{}", tail(&log));
                }
            }
            Ok(())
        })?;
        // Every node's relay is listening.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for i in 0..opts.nodes {
            while !tb.relay_socket(i).exists() {
                if std::time::Instant::now() > deadline {
                    let log = tb.dir.join(format!("storm-relay-node{i}.log"));
                    bail!("node{i}'s control relay did not start:\n{}", tail(&log));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(tb)
    }

    /// Only the network of `opts`: the namespaces, the bridge and every address, with no
    /// daemon, key or cluster file (for tests that bring their own daemons, such as sshd
    /// for `storm start --hosts`, through [`Testbed::spawn_program`]).
    pub fn network_only(opts: &TestbedOptions) -> Result<Self> {
        std::fs::create_dir(&opts.dir)
            .with_context(|| format!("creating {}", opts.dir.display()))?;
        let mut tb = Testbed::empty(opts, make_config(opts)?, opts.dir.join("cluster.toml"));
        tb.build_network(opts.nodes)?;
        Ok(tb)
    }

    /// A testbed of `opts` with nothing made yet.
    fn empty(opts: &TestbedOptions, config: ClusterConfig, config_path: PathBuf) -> Self {
        Testbed {
            name: opts.name.clone(),
            dir: opts.dir.clone(),
            config,
            config_path,
            namespaces: Vec::new(),
            daemons: Vec::new(),
            children: Vec::new(),
            delay_lines: Default::default(),
            torn_down: false,
            net: opts.net,
        }
    }

    /// Runs `program` with `args` in namespace `ns` as a daemon of the testbed (killed at
    /// teardown), its standard error in `DIR/NAME.log`.
    pub fn spawn_program(
        &mut self,
        ns: &str,
        name: &str,
        program: &Path,
        args: &[String],
    ) -> Result<()> {
        self.spawn_path_in(ns, name, program, args)
    }

    fn add_ns(&mut self, ns: String) -> Result<()> {
        ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        self.save_state()?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])
    }

    /// One veth pair: `sw_end` on the bridge, `eth0` with `addr` in `ns`.
    fn plug(&self, ns: &str, sw_end: &str, addr: Ipv4Addr) -> Result<()> {
        let sw = self.switch_ns();
        ip(&[
            "link", "add", sw_end, "netns", &sw, "type", "veth", "peer", "name", "eth0", "netns",
            ns,
        ])?;
        ip(&["-n", &sw, "link", "set", sw_end, "master", "br0", "up"])?;
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{addr}/16"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])
    }

    fn build_network(&mut self, nodes: u32) -> Result<()> {
        let sw = self.switch_ns();
        self.add_ns(sw.clone())?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        let mm = format!("{}-mm", self.name);
        self.add_ns(mm.clone())?;
        self.plug(&mm, "mm", mm_addr_in(self.net))?;
        for j in 0..self.config.managers.len() as u32 {
            let ns = self.manager_ns(j);
            self.add_ns(ns.clone())?;
            self.plug(&ns, &format!("m{j}"), manager_addr(j))?;
        }
        for i in 0..nodes {
            let ns = self.node_ns(i);
            self.add_ns(ns.clone())?;
            self.plug(&ns, &format!("n{i}"), node_addr_in(self.net, i))?;
        }
        Ok(())
    }

    /// The MM's namespace (of a testbed with one MM).
    pub fn mm_ns(&self) -> String {
        format!("{}-mm", self.name)
    }

    fn spawn_in(&mut self, ns: &str, name: &str, program: &str, args: &[String]) -> Result<()> {
        let bin = bin_dir()?.join(program);
        if !bin.is_file() {
            bail!(
                "{} not found (build the workspace, or set STORM_BIN_DIR)",
                bin.display()
            );
        }
        self.spawn_path_in(ns, name, &bin, args)
    }

    fn spawn_path_in(&mut self, ns: &str, name: &str, bin: &Path, args: &[String]) -> Result<()> {
        let log = self.dir.join(format!("{}.log", name.replace(' ', "-")));
        // Appended to: a restarted daemon keeps its predecessor's log.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        // nsenter enters the network namespace only. `ip netns exec` would also give the
        // daemon a mount namespace with a fresh /sys, without the cgroup file systems under
        // it: the NMs could then keep no job in a cgroup, nor read a node's own CPU and
        // memory from its subtree (docs/monitoring.md). /proc/net follows the namespace.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{ns}"))
            .arg("--")
            .arg(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own session: it outlives `storm-testbed up`, and Ctrl-C in the terminal does
            // not reach it.
            .process_group(0);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        // nsenter enters the namespace and execs the daemon: same pid.
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} in {ns}"))?;
        self.daemons.push((name.to_string(), child.id()));
        self.children.push(child);
        self.save_state()
    }

    fn start_daemons(&mut self) -> Result<()> {
        if self.config.replicated() {
            for j in 0..self.config.managers.len() as u32 {
                self.start_manager(j)?;
            }
        } else {
            self.start_mm()?;
        }
        let cfg = self.config_path.display().to_string();
        if self.config.replicated() {
            // A manager-side relay beside each replica, as on hosts of their own: the node
            // relays try each, and only the leader's takes connections.
            for j in 0..self.config.managers.len() as u32 {
                let ns = self.manager_ns(j);
                self.spawn_in(
                    &ns,
                    &format!("storm-relay manager m{j}"),
                    "storm-relay",
                    &[
                        "--config".into(),
                        cfg.clone(),
                        "--manager".into(),
                        "--replica".into(),
                        format!("m{j}"),
                    ],
                )?;
            }
        } else {
            let mm_ns = format!("{}-mm", self.name);
            self.spawn_in(
                &mm_ns,
                "storm-relay manager",
                "storm-relay",
                &["--config".into(), cfg.clone(), "--manager".into()],
            )?;
        }
        // Guest slots come after the nodes; a lent node's NM runs their guest.
        for i in 0..self.config.home_node_count() {
            self.start_nm(i)?;
            let ns = self.node_ns(i);
            self.spawn_in(
                &ns,
                &format!("storm-relay node{i}"),
                "storm-relay",
                &[
                    "--config".into(),
                    cfg.clone(),
                    "--node".into(),
                    format!("node{i}"),
                ],
            )?;
        }
        Ok(())
    }

    /// Node `i`'s control relay socket, where its users (and its jobs' steps) reach the MM.
    pub fn relay_socket(&self, i: u32) -> PathBuf {
        self.config.relay.socket_of(&format!("node{i}"))
    }

    /// Starts the MM in its namespace (again, after [`Testbed::kill`]).
    pub fn start_mm(&mut self) -> Result<()> {
        let cfg = self.config_path.display().to_string();
        let mm_ns = format!("{}-mm", self.name);
        self.spawn_in(&mm_ns, "storm-mm", "storm-mm", &["--config".into(), cfg])
    }

    /// Starts the cluster's peer agent (`storm-peer`) in the MM's namespace (again, after
    /// [`Testbed::kill`]): a cluster of several that share ([`federation`]).
    pub fn start_peer_agent(&mut self) -> Result<()> {
        let cfg = self.config_path.display().to_string();
        let mm_ns = self.mm_ns();
        self.spawn_in(
            &mm_ns,
            "storm-peer",
            "storm-peer",
            &["--config".into(), cfg],
        )
    }

    /// The namespace of replica `j` of a replicated MM.
    pub fn manager_ns(&self, j: u32) -> String {
        format!("{}-m{j}", self.name)
    }

    /// Starts replica `j` of a replicated MM ("storm-mm m<j>") in its namespace (again,
    /// after [`Testbed::kill`]).
    pub fn start_manager(&mut self, j: u32) -> Result<()> {
        let cfg = self.config_path.display().to_string();
        let ns = self.manager_ns(j);
        self.spawn_in(
            &ns,
            &format!("storm-mm m{j}"),
            "storm-mm",
            &["--config".into(), cfg, "--manager".into(), format!("m{j}")],
        )
    }

    /// Which replica of a replicated MM leads ("m1"), by which control socket answers.
    pub fn leader(&self) -> Option<String> {
        self.config
            .managers
            .iter()
            .zip(self.config.control_sockets())
            .find(|(_, s)| {
                storm_cluster::control::Client::connect_within(s, Some(Duration::from_millis(300)))
                    .is_ok()
            })
            .map(|(m, _)| m.name.clone())
    }

    /// Cuts (or restores) replica `j` from the other replicas only (`from_replicas`), or from
    /// everything but them: an nftables rule in its namespace drops what it exchanges with
    /// that side. `None` restores it.
    pub fn partition_manager(&self, j: u32, from_replicas: Option<bool>) -> Result<()> {
        let ns = self.manager_ns(j);
        let _ = nft(&ns, "delete table inet storm_partition");
        let Some(from_replicas) = from_replicas else {
            return Ok(());
        };
        let op = if from_replicas { "==" } else { "!=" };
        nft(
            &ns,
            &format!(
                "table inet storm_partition {{ \
                   chain input {{ type filter hook input priority 0; \
                     iifname \"eth0\" ip saddr {op} {MANAGERS_NET} drop; }}; \
                   chain output {{ type filter hook output priority 0; \
                     oifname \"eth0\" ip daddr {op} {MANAGERS_NET} drop; }}; }}"
            ),
        )
    }

    /// Starts node `i`'s NM in its namespace (again, after [`Testbed::kill`]).
    pub fn start_nm(&mut self, i: u32) -> Result<()> {
        let cfg = self.config_path.display().to_string();
        let ns = self.node_ns(i);
        self.spawn_in(
            &ns,
            &format!("storm-nm node{i}"),
            "storm-nm",
            &["--config".into(), cfg, "--node".into(), format!("node{i}")],
        )
    }

    /// Kills a daemon ("storm-mm", "storm-nm node3") with SIGKILL, as a crash would, and
    /// reaps it.
    pub fn kill(&mut self, daemon: &str) -> Result<()> {
        let Some(pos) = self.daemons.iter().position(|(n, _)| n == daemon) else {
            bail!("testbed {} runs no {daemon}", self.name);
        };
        let (_, pid) = self.daemons.remove(pos);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .with_context(|| format!("killing {daemon} (pid {pid})"))?;
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let mut child = self.children.remove(i);
            let _ = child.wait();
        }
        self.save_state()
    }

    /// Whether a daemon ("storm-mm m1") still runs: false once it exited by itself (it is
    /// reaped) or was killed.
    pub fn is_running(&mut self, daemon: &str) -> bool {
        let Some(pid) = self.pid(daemon) else {
            return false;
        };
        match self.children.iter_mut().find(|c| c.id() == pid) {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            // Handed over to a CLI user: signal 0 says whether it still exists.
            None => nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok(),
        }
    }

    /// The pid of a daemon ("storm-mm", "storm-nm node3").
    pub fn pid(&self, daemon: &str) -> Option<u32> {
        self.daemons
            .iter()
            .find(|(n, _)| n == daemon)
            .map(|(_, p)| *p)
    }

    /// Cuts (or restores) node `i`'s cable.
    pub fn set_link(&self, i: u32, up: bool) -> Result<()> {
        set_link(&self.name, i, up)
    }

    /// Makes node `i`'s link drop `percent` % of the packets it sends and of those it
    /// receives, at random (0 restores it). This kernel has no netem, so it is an nftables
    /// rule in the node's namespace (`numgen random`); needs the `nft` tool (Debian package
    /// `nftables`).
    pub fn set_loss(&self, i: u32, percent: u32) -> Result<()> {
        let ns = self.node_ns(i);
        // Deleting a table that is not there fails; that is fine.
        let _ = nft(&ns, "delete table inet storm_loss");
        if percent == 0 {
            return Ok(());
        }
        nft(
            &ns,
            &format!(
                "table inet storm_loss {{ \
                   chain input {{ type filter hook input priority 0; \
                     numgen random mod 100 < {percent} drop; }}; \
                   chain output {{ type filter hook output priority 0; \
                     numgen random mod 100 < {percent} drop; }}; }}"
            ),
        )
    }

    /// Delays every frame node `i` sends and every frame sent to it by `delay`, so its round
    /// trip grows by twice that (`Duration::ZERO` takes the delay away). This kernel has no
    /// netem: a relay in this process carries the node's traffic (see `delay.rs`), for as
    /// long as this value lives.
    pub fn set_delay(&mut self, i: u32, delay: Duration) -> Result<()> {
        if let Some(line) = self.delay_lines.get(&i) {
            line.set_delay(delay);
            return Ok(());
        }
        let line = delay::DelayLine::insert(&self.switch_ns(), &format!("n{i}"), delay)
            .with_context(|| format!("putting a delay line on node {i}'s link"))?;
        self.delay_lines.insert(i, line);
        Ok(())
    }

    fn save_state(&self) -> Result<()> {
        let mut text = String::new();
        for ns in &self.namespaces {
            text.push_str(&format!("ns {ns}\n"));
        }
        for (name, pid) in &self.daemons {
            text.push_str(&format!("pid {pid} {name}\n"));
        }
        std::fs::write(self.dir.join(STATE_FILE), text)
            .with_context(|| format!("writing the state of testbed {}", self.name))
    }

    /// Kills the daemons and deletes the namespaces; the directory stays (logs).
    pub fn down(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        self.delay_lines.clear();
        let result = down_by_state(&self.dir);
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
        result
    }

    /// Leaves the testbed running when this value goes away (`storm-testbed up`): the state
    /// file in its directory is what `storm-testbed down` uses.
    pub fn detach(mut self) {
        self.torn_down = true;
        self.children.clear();
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("storm-testbed: tearing down {}: {e:#}", self.name);
        }
    }
}

/// The cluster file of a testbed: every daemon on port 7000 of its namespace's address.
fn make_config(opts: &TestbedOptions) -> Result<ClusterConfig> {
    let v4 = |a: Ipv4Addr| SocketAddr::V4(SocketAddrV4::new(a, PORT));
    let config = ClusterConfig {
        cluster: ClusterSection {
            name: opts
                .cluster_name
                .clone()
                .unwrap_or_else(|| format!("testbed-{}", opts.name)),
            timeslice_ms: opts.timeslice_ms,
            control_socket: opts.dir.join("mm.sock"),
            state_dir: opts.dir.join("mm-state"),
            key_file: Some(opts.dir.join(storm_cluster::key::DEFAULT_NAME)),
            // Its nodes are namespaces of this host: they share its CPUs (see
            // `embedded_cpu_bind`).
            cpu_bind: crate::local::embedded_cpu_bind(opts.nodes, opts.cpus),
            ..ClusterSection::default()
        },
        tcp: TcpSection::default(),
        security: Default::default(),
        limits: opts.limits.clone(),
        ofi: OfiSection::default(),
        scheduler: crate::local::embedded_scheduler(&opts.scheduler, opts.nodes),
        failure: opts.failure.clone(),
        history: Default::default(),
        // Every node has a control relay, as on a cluster whose nodes cannot see the MM's
        // Unix socket: jobs' steps reach the MM through it.
        relay: RelaySection {
            // With a replicated MM, each replica has a relay beside it (`relay_address`).
            address: (opts.managers == 1).then_some(SocketAddr::V4(SocketAddrV4::new(
                mm_addr_in(opts.net),
                RELAY_PORT,
            ))),
            socket: opts.dir.join("relay").join("{node}.sock"),
            ..RelaySection::default()
        },
        mm: MmSection {
            address: match opts.managers {
                1 => v4(mm_addr_in(opts.net)),
                _ => v4(manager_addr(0)),
            },
        },
        // Nodes here share one kernel: each node's CPU and memory are its jobs'.
        monitoring: {
            let defaults = storm_cluster::config::MonitoringSection::default();
            storm_cluster::config::MonitoringSection {
                source: storm_cluster::sample::Source::NodeCgroup,
                sysfs: opts.sysfs.clone().unwrap_or(defaults.sysfs.clone()),
                ..defaults
            }
        },
        replication: opts.replication.clone(),
        health: opts.health.clone(),
        federation: opts.federation.clone(),
        peers: opts.peers.clone(),
        managers: match opts.managers {
            1 => Vec::new(),
            n => (0..n)
                .map(|j| ManagerEntry {
                    name: format!("m{j}"),
                    address: v4(manager_addr(j)),
                    peer_address: SocketAddr::V4(SocketAddrV4::new(manager_addr(j), PEER_PORT)),
                    state_dir: Some(opts.dir.join(format!("m{j}-state"))),
                    control_socket: Some(opts.dir.join(format!("m{j}.sock"))),
                    relay_address: Some(SocketAddr::V4(SocketAddrV4::new(
                        manager_addr(j),
                        RELAY_PORT,
                    ))),
                })
                .collect(),
        },
        nodes: (0..opts.nodes)
            .map(|i| NodeEntry {
                name: format!("node{i}"),
                address: v4(node_addr_in(opts.net, i)),
                spool: opts.dir.join(format!("node{i}")),
                cpus: opts.cpus,
                mem: None,
                features: Vec::new(),
                guest_of: None,
            })
            .chain(opts.guests.iter().cloned())
            .collect(),
    };
    config.validate()?;
    Ok(config)
}

fn alive(pid: u32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

/// Tears down the testbed whose state file is in `dir`: SIGTERM to its daemons, SIGKILL to any
/// still there after 2 s, then deletes its namespaces. Safe to run twice.
pub fn down_by_state(dir: &Path) -> Result<()> {
    let path = dir.join(STATE_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut pids = Vec::new();
    let mut namespaces = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match (f.next(), f.next()) {
            // Only if that pid still runs a storm daemon: after a reboot or a long time it may
            // belong to something else.
            (Some("pid"), Some(p)) => pids.extend(p.parse::<u32>().ok().filter(|&p| is_daemon(p))),
            (Some("ns"), Some(ns)) => namespaces.push(ns.to_string()),
            _ => bail!("{}: malformed line {line:?}", path.display()),
        }
    }
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for &p in &pids {
        let _ = kill(Pid::from_raw(p as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| alive(p) && !is_zombie(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in &pids {
        let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
    }
    let mut failed = Vec::new();
    for ns in namespaces.iter().rev() {
        if let Err(e) = ip(&["netns", "del", ns])
            && ip_netns_exists(ns)
        {
            failed.push(format!("{e:#}"));
        }
    }
    if !failed.is_empty() {
        bail!("some namespaces remain: {}", failed.join("; "));
    }
    std::fs::remove_file(&path)?;
    Ok(())
}

fn is_daemon(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        c.split(|&b| b == 0).any(|arg| {
            arg.ends_with(b"storm-mm")
                || arg.ends_with(b"storm-nm")
                || arg.ends_with(b"storm-relay")
                || arg.ends_with(b"storm-peer")
        })
    })
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").and_then(|(_, r)| r.chars().next()))
        == Some('Z')
}

fn ip_netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// Cuts (or restores) node `i`'s cable in testbed `name`: its port on the bridge goes down
/// (or up).
pub fn set_link(name: &str, i: u32, up: bool) -> Result<()> {
    ip(&[
        "-n",
        &format!("{name}-sw"),
        "link",
        "set",
        &format!("n{i}"),
        if up { "up" } else { "down" },
    ])
}
