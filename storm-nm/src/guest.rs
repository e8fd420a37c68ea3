//! The guest NM of a lent node (docs/federation.md, lending).
//!
//! While this cluster lends the node to a peer, the node's own NM runs a second `storm-nm`
//! process for the peer: the *guest* (`storm-nm --config THIS_CLUSTER'S_FILE --guest-of
//! PEER`). It runs as the guest slot that the peer's guest file, as this cluster's operator
//! installed it (`[[peer]] guest_file`), names for this node, and takes from that file only
//! the peer's topology: what it executes and the files it touches as root are this
//! cluster's (`storm_cluster::guest_file`). It joins the peer's fabric like any node (registration, heartbeats, launch, gang slots), runs
//! the peer's jobs as this cluster's account for the peer (`[[peer]] flock_user`, never
//! root), and stops itself at the lease's end whatever it hears. The home NM stops it when
//! the node comes home; its tasks, in the guest's own cgroups, die with it. Whatever a guest
//! leaves there (it was killed outright, as it did not stop in time or an NM before this one
//! was killed under it, and a task had started a process in a session of its own) the home
//! NM kills before it takes the node's next command, so nothing of the borrower's outlives
//! the lease beside the lender's jobs.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use storm_cluster::ClusterConfig;
use storm_cluster::daemon_dir::DaemonDir;
use storm_cluster::guest_file::GuestSetup;
use storm_cluster::identity::LeaseGrant;

use crate::env::GuestRunner;

/// The file of the NM's spool that holds its running guest's pid.
pub const PID_FILE: &str = "guest.pid";

/// How long a guest has to stop (it kills its tasks on the way out) before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// How long a warm guest has to go once its standard input is closed (it has no task, and
/// removes its empty groups) before it is killed.
const RETIRE_WAIT: Duration = Duration::from_secs(1);

/// What starts a guest: the storm-nm binary, this node and its cluster file.
pub struct GuestProcess {
    /// The storm-nm binary (the running one).
    exe: PathBuf,
    /// This cluster's file: its `[[peer]]`s say where each peer's file is and as whom.
    config: std::sync::Arc<ClusterConfig>,
    /// Where this cluster's file is: a guest is started from it (`--guest-of PEER`), and
    /// takes from the peer only what its guest file may say (see
    /// `storm_cluster::guest_file`). `None`: this NM lends nothing.
    config_path: Option<PathBuf>,
    /// This node's name in it.
    node: String,
    /// Where the running guest's pid is kept ([`PID_FILE`]).
    dir: DaemonDir,
    running: Option<Running>,
    /// Whether this NM keeps warm guests (`[federation] warm_guests`, a node's own NM).
    keeps_warm: bool,
    /// The warm guest of each peer this node lends to, set up and waiting for a lend.
    warm: BTreeMap<String, WarmSlot>,
    /// When warm guests are to be started again: as soon as the NM has answered the heartbeat
    /// that brought the node home ([`GuestProcess::warm_up_if_due`]), or [`WARM_AFTER_LEND`]
    /// after a lend took one (the next lend, right after this one's return, finds one ready).
    warm_due: Option<Instant>,
    /// When the warm guests are looked at next (one may have ended, or could not start: the
    /// peer's file was not there yet), and the wait after that one.
    warm_check: (Instant, Duration),
}

/// How often a node at home looks at its warm guests while all wait; a look that finds one
/// missing doubles the wait, up to [`WARM_CHECK_MAX`], so a guest that cannot start is not
/// started again and again.
const WARM_CHECK: Duration = Duration::from_secs(1);
const WARM_CHECK_MAX: Duration = Duration::from_secs(300);

/// How long after a lend took its warm guest the next one is started: after the lent guest's
/// registration (a few milliseconds), so the start takes no core from it.
const WARM_AFTER_LEND: Duration = Duration::from_millis(20);

/// A guest NM started ahead of a lend (`storm-nm --warm`): it has read the peer's cluster
/// file and started its launcher, and waits for the lease's end on its standard input; it
/// reads no key and opens no link before that. It makes its groups when told ([`GROUPS`]):
/// at once if no guest runs on the node as it starts, else once the node is home (the groups
/// are the slot's, and the lent guest of the same borrower owns them until it stops). Told to
/// retire, or its standard input closed (this NM was killed), it goes ([`Told`]).
struct Warm {
    child: Child,
    stdin: ChildStdin,
    /// Whether it was told to make its groups.
    groups_told: bool,
    /// The peer's cluster file as it was before the guest read it.
    file: Option<FileStamp>,
    groups: GuestGroups,
    /// The priority it takes once lent (the peer's `daemon_rt_priority`).
    rt_priority: u8,
}

/// A peer's warm guest: being started, on a thread of its own (the NM's thread goes on
/// answering heartbeats, and the guest starts at normal priority), or started.
enum WarmSlot {
    Starting(std::thread::JoinHandle<Result<Warm, String>>),
    Started(Warm),
    /// Its start failed (the lend itself says why, if one comes).
    Failed,
}

impl WarmSlot {
    /// The warm guest, once started (waiting for its start if it is under way).
    fn started(self) -> Option<Warm> {
        match self {
            WarmSlot::Started(w) => Some(w),
            WarmSlot::Starting(t) => match t.join() {
                Ok(Ok(w)) => Some(w),
                Ok(Err(e)) => {
                    tracing::debug!("no warm guest NM: {e}");
                    None
                }
                Err(_) => None,
            },
            WarmSlot::Failed => None,
        }
    }

    /// Whether it is starting, or started and still waiting.
    fn waits(&mut self) -> bool {
        if matches!(self, WarmSlot::Starting(t) if t.is_finished()) {
            let slot = std::mem::replace(self, WarmSlot::Failed);
            if let Some(w) = slot.started() {
                *self = WarmSlot::Started(w);
            }
        }
        match self {
            WarmSlot::Starting(_) => true,
            WarmSlot::Started(w) => matches!(w.child.try_wait(), Ok(None)),
            WarmSlot::Failed => false,
        }
    }
}

/// What tells that a file changed: its inode, size and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileStamp {
    fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }
}

impl Warm {
    /// Hands this warm guest the lease (it opens its link and registers with the borrower at
    /// once), or says why it cannot take it: it ended, or the peer's file changed since it read
    /// it (`file`: that file as it is now).
    fn lend(
        mut self,
        until_ms: u64,
        grant: &LeaseGrant,
        file: Option<FileStamp>,
    ) -> Result<Child, String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(format!("it ended ({status})"));
        }
        if file.is_none() || file != self.file {
            self.retire();
            return Err("the peer's cluster file changed since it started".into());
        }
        // Lent, it is a daemon of this node at work, even if still setting up (lent again
        // just after the node came home): it goes on at the priority it takes once lent.
        if let Err(e) =
            storm_cluster::daemon::set_rt_priority_of(self.child.id(), self.rt_priority, false)
        {
            tracing::warn!("the lent guest NM sets up at normal priority: {e}");
        }
        if let Err(e) = writeln!(self.stdin, "{until_ms} {}", grant.to_hex()) {
            self.retire();
            return Err(format!("it does not take the lease: {e}"));
        }
        // It reads nothing more.
        drop(self.stdin);
        Ok(self.child)
    }

    /// Tells it to make its groups, if not told yet: no other guest runs on the node.
    fn tell_groups(&mut self) {
        if self.groups_told {
            return;
        }
        self.groups_told = true;
        // One that ended is found at the lend, or at the next look.
        if let Err(e) = writeln!(self.stdin, "{GROUPS}") {
            tracing::debug!(slot = %self.groups.slot, "a warm guest NM is not told to make its groups: {e}");
        }
    }

    /// Stops it: told to ([`Told::Retire`]), it goes by itself, removing its groups if it
    /// made them; killed if it has not within [`RETIRE_WAIT`].
    fn retire(self) {
        retire_all(vec![self]);
    }
}

/// How to start a guest ([`GuestProcess::command`]).
struct GuestStart {
    cmd: Command,
    groups: GuestGroups,
    /// The peer's file the guest reads.
    file: PathBuf,
    /// `[scheduler] daemon_rt_priority` in that file: the guest's once lent.
    rt_priority: u8,
}

/// Starts a warm guest, on a thread of its own at normal priority (the guest inherits it):
/// the start takes no time of the NM's real-time thread. `groups_now`: no guest runs on the
/// node, so it makes its groups at once.
fn start_warm(start: GuestStart, groups_now: bool) -> Result<Warm, String> {
    let GuestStart {
        mut cmd,
        groups,
        file,
        rt_priority,
    } = start;
    storm_cluster::daemon::set_normal_priority();
    // Before it reads the file: a change after this is seen at the lend.
    let file = FileStamp::of(&file);
    let mut child = cmd
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting a warm guest NM: {e}"))?;
    tracing::debug!(pid = child.id(), slot = %groups.slot, "a warm guest NM waits for a lend");
    let stdin = child.stdin.take().expect("piped");
    let mut warm = Warm {
        child,
        stdin,
        groups_told: false,
        file,
        groups,
        rt_priority,
    };
    if groups_now {
        warm.tell_groups();
    }
    Ok(warm)
}

/// Stops warm guests at once (see [`Warm::retire`]): their inputs closed together, then each
/// waited for.
fn retire_all(warm: Vec<Warm>) {
    let mut children: Vec<(Child, GuestGroups)> = warm
        .into_iter()
        .map(|mut w| {
            // It may have ended: then nothing reads this.
            let _ = writeln!(w.stdin, "{RETIRE}");
            drop(w.stdin);
            (w.child, w.groups)
        })
        .collect();
    let deadline = Instant::now() + RETIRE_WAIT;
    for (child, groups) in &mut children {
        if wait_until(child, deadline).is_none() {
            tracing::warn!(slot = %groups.slot, "a warm guest NM did not go when told: killed");
            let _ = child.kill();
            let _ = child.wait();
            groups.sweep();
        }
    }
}

/// How `child` ended, once it has, or `None` if it still runs at `deadline` (or cannot be
/// waited for). It is asked often at first (a guest stops in a few milliseconds, and the
/// node's way home waits for it), then less.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    let mut pause = Duration::from_micros(100);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            _ => return None,
        }
    }
}

struct Running {
    peer: String,
    until_ms: u64,
    child: Child,
    /// Where its jobs' groups are.
    groups: GuestGroups,
}

/// Where a guest's jobs' cgroups are on this node: the borrower's cgroup mode, its cluster
/// name and the slot's name (`storm/<borrower>/<slot>/job-N`).
#[derive(Debug, Clone)]
struct GuestGroups {
    mode: crate::cgroup::CgroupMode,
    cluster: String,
    slot: String,
}

impl GuestGroups {
    /// Kills what the guest left in its groups, and removes them.
    fn sweep(&self) {
        if crate::cgroup::Cgroups::sweep(self.mode, &self.cluster, &self.slot) {
            tracing::info!(borrower = %self.cluster, slot = %self.slot, "the guest's job groups were swept: nothing of the borrower's runs here now");
        }
    }
}

impl GuestProcess {
    /// The guest runner of node `node`, whose NM keeps the running guest's pid in `dir`
    /// (its spool, a directory no user can change), as [`PID_FILE`]. A guest that an earlier NM of this node
    /// left running (that NM was killed outright) is stopped here: this NM cannot follow it,
    /// and its MM tells it again to run a guest if the node is still lent. `home`: this is
    /// the node's own NM. A guest NM never lends, so it skips the sweep of leftovers, and
    /// with it the reading of the peers' files, which would slow the lend it is part of.
    pub fn new(
        config: std::sync::Arc<ClusterConfig>,
        config_path: Option<PathBuf>,
        node: String,
        dir: DaemonDir,
        home: bool,
    ) -> Self {
        stop_orphan(&dir);
        let mut me = Self {
            exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("storm-nm")),
            keeps_warm: home && config.federation.warm_guests && config_path.is_some(),
            config,
            config_path,
            node,
            dir,
            running: None,
            warm: BTreeMap::new(),
            warm_due: None,
            warm_check: (Instant::now() + WARM_CHECK, WARM_CHECK),
        };
        // No guest runs now: whatever one left in any borrower's groups here goes.
        let lends_to: Vec<String> = me
            .config
            .peers
            .iter()
            .filter(|p| home && p.lend)
            .map(|p| p.name.clone())
            .collect();
        for peer in lends_to {
            if let Ok((_, groups)) = me.guest_of(&peer) {
                groups.sweep();
            }
        }
        // The peers' files may not be there yet: looked at again at the next check.
        me.warm_up();
        me
    }

    /// Starts a warm guest for each peer this node lends to that has none (it ended, or was
    /// used for a lease), if this NM keeps them; while the node is lent, those started make
    /// their groups only once it is home, as do those waiting then. Whether every peer had one
    /// waiting already.
    fn warm_up(&mut self) -> bool {
        if !self.keeps_warm {
            return true;
        }
        // Reaps a lent guest that ended (and sweeps what it left) before any other guest may
        // make the groups.
        let lent = self.alive();
        let mut all_waited = true;
        let peers: Vec<String> = self
            .config
            .peers
            .iter()
            .filter(|p| p.lend && p.guest_file.is_some() && p.flock_user.is_some())
            .map(|p| p.name.clone())
            .collect();
        for peer in peers {
            if let Some(slot) = self.warm.get_mut(&peer)
                && slot.waits()
            {
                if let (WarmSlot::Started(w), false) = (slot, lent) {
                    w.tell_groups();
                }
                continue;
            }
            all_waited = false;
            if let Some(ended) = self.warm.remove(&peer) {
                if let Some(w) = ended.started() {
                    w.retire();
                }
            }
            match self.command(&peer, None) {
                Ok(start) => {
                    let starting = std::thread::Builder::new()
                        .name("storm-nm-warm".into())
                        .spawn(move || start_warm(start, !lent));
                    match starting {
                        Ok(t) => {
                            self.warm.insert(peer, WarmSlot::Starting(t));
                        }
                        Err(e) => tracing::warn!(%peer, "no warm guest NM: {e}"),
                    }
                }
                // The lend itself says why, if one comes.
                Err(e) => tracing::debug!(%peer, "no warm guest NM: {e}"),
            }
        }
        all_waited
    }

    /// Peer `peer`'s guest setup on this node (its topology from the guest file this
    /// cluster's operator installed, everything else this cluster's) and where its groups
    /// are, or why it cannot lend to it: the guest checks the same again as it starts.
    fn guest_of(&self, peer: &str) -> Result<(GuestSetup, GuestGroups), String> {
        let setup = GuestSetup::load(&self.config, &self.node, peer).map_err(|e| e.to_string())?;
        let groups = GuestGroups {
            mode: setup.config.cluster.cgroups,
            cluster: setup.config.cluster.name.clone(),
            slot: setup.config.nodes[setup.slot as usize].name.clone(),
        };
        Ok((setup, groups))
    }

    /// How to start peer `peer`'s guest until a lease's end, with its grant (`None`: a warm
    /// guest), or why it cannot run.
    fn command(&self, peer: &str, lease: Option<(u64, &LeaseGrant)>) -> Result<GuestStart, String> {
        let config_path = self
            .config_path
            .as_ref()
            .ok_or("this node manager was not started from a cluster file: it lends nothing")?;
        let (setup, groups) = self.guest_of(peer)?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("--config")
            .arg(config_path)
            .arg("--node")
            .arg(&self.node)
            .arg("--guest-of")
            .arg(peer)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // It is not the service: this NM is.
            .env_remove("NOTIFY_SOCKET");
        match lease {
            Some((ms, grant)) => cmd
                .arg("--lease-until")
                .arg(ms.to_string())
                .arg("--lease-grant")
                .arg(grant.to_hex()),
            None => cmd.arg("--warm"),
        };
        // Its log goes where this NM's goes (stderr).
        Ok(GuestStart {
            cmd,
            groups,
            file: setup.file,
            rt_priority: setup.config.scheduler.daemon_rt_priority,
        })
    }

    /// The lease handed to peer `peer`'s warm guest, if it has one that can take it.
    fn lend_warm(
        &mut self,
        peer: &str,
        until_ms: u64,
        grant: &LeaseGrant,
    ) -> Option<(Child, GuestGroups)> {
        let warm = self.warm.remove(peer)?.started()?;
        let groups = warm.groups.clone();
        let file = self
            .config
            .peers
            .iter()
            .find(|p| p.name == peer && p.lend)
            .and_then(|p| p.guest_file.as_deref())
            .and_then(FileStamp::of);
        match warm.lend(until_ms, grant, file) {
            Ok(child) => Some((child, groups)),
            Err(why) => {
                tracing::info!(%peer, "the warm guest NM cannot take this lease ({why}): starting a guest");
                None
            }
        }
    }

    /// Whether the guest still runs (reaping it if it ended).
    fn alive(&mut self) -> bool {
        match &mut self.running {
            Some(r) => match r.child.try_wait() {
                Ok(None) => true,
                Ok(Some(status)) => {
                    tracing::info!(peer = %r.peer, %status, "the guest NM ended");
                    // Ended by itself at its lease's end, it took its jobs' groups along;
                    // killed by someone, or failed, it may have left them.
                    if !status.success() {
                        r.groups.sweep();
                    }
                    self.running = None;
                    false
                }
                Err(_) => true,
            },
            None => false,
        }
    }
}

impl GuestRunner for GuestProcess {
    fn start(&mut self, peer: &str, until_ms: u64, grant: &LeaseGrant) {
        if self.alive() {
            let r = self.running.as_ref().expect("alive");
            if r.peer != peer || r.until_ms != until_ms {
                tracing::warn!(
                    running = %r.peer,
                    asked = %peer,
                    "a guest NM runs already for another lease: it stays until it ends"
                );
            }
            return;
        }
        if until_ms <= storm_cluster::daemon::unix_ms() {
            return;
        }
        let started = match self.lend_warm(peer, until_ms, grant) {
            Some(warm) => Ok(warm),
            None => self
                .command(peer, Some((until_ms, grant)))
                .and_then(|mut start| {
                    let child = start
                        .cmd
                        .spawn()
                        .map_err(|e| format!("starting the guest NM: {e}"))?;
                    Ok((child, start.groups))
                }),
        };
        match started {
            Ok((child, groups)) => {
                tracing::info!(%peer, until_ms, pid = child.id(), "lent: guest NM started");
                let recorded = self.dir.create_file(PID_FILE).and_then(|mut f| {
                    std::io::Write::write_all(&mut f, child.id().to_string().as_bytes())
                });
                if let Err(e) = recorded {
                    tracing::warn!("cannot record the guest's pid: {e}");
                }
                self.running = Some(Running {
                    peer: peer.to_string(),
                    until_ms,
                    child,
                    groups,
                });
                // The next lend, if it comes right after this one's return, finds a guest ready.
                self.warm_due = Some(Instant::now() + WARM_AFTER_LEND);
            }
            Err(e) => tracing::error!(%peer, "cannot lend this node: {e}"),
        }
    }

    fn stop(&mut self) {
        self.stop_guest();
        // The node is home: ready for its next lend, once the heartbeat is answered (a warm
        // guest waiting makes its groups then).
        self.warm_due = Some(Instant::now());
    }
}

impl GuestProcess {
    /// Starts the warm guests again after the node came home ([`GuestRunner::stop`]), and
    /// any found missing at a look (every second or more). Its NM calls this between
    /// heartbeats, so the start is not on the way home.
    pub fn warm_up_if_due(&mut self) {
        if !self.keeps_warm {
            return;
        }
        let now = Instant::now();
        let due = self.warm_due.is_some_and(|at| now >= at);
        if !due && now < self.warm_check.0 {
            return;
        }
        if due {
            self.warm_due = None;
        }
        let wait = if self.warm_up() {
            WARM_CHECK
        } else {
            (self.warm_check.1 * 2).min(WARM_CHECK_MAX)
        };
        self.warm_check = (now + wait, wait);
    }

    /// Stops the running guest, if any (see [`GuestRunner::stop`]).
    fn stop_guest(&mut self) {
        if !self.alive() {
            return;
        }
        let mut r = self.running.take().expect("alive");
        let _ = self.dir.remove_file(PID_FILE);
        let pid = nix::unistd::Pid::from_raw(r.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        match wait_until(&mut r.child, Instant::now() + STOP_WAIT) {
            Some(status) if status.success() => {
                // It stopped as asked, and took its jobs' groups along.
                tracing::info!(peer = %r.peer, %status, "home again: guest NM stopped");
                return;
            }
            Some(status) => {
                tracing::warn!(peer = %r.peer, %status, "home again: the guest NM failed as it stopped");
            }
            None => {
                tracing::warn!(peer = %r.peer, "the guest NM did not stop in time: killed");
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
        // A guest killed outright, or one that failed, may have left processes behind.
        r.groups.sweep();
    }
}

/// What a warm guest is told by its node's NM ([`wait_for_lend`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Told {
    /// It is lent until then (Unix ms), under this grant: it opens its link and registers at
    /// once, showing the grant.
    Lease(u64, Option<LeaseGrant>),
    /// It is not needed (its node's NM stops, or the peer's file changed): it goes, removing
    /// its empty groups.
    Retire,
    /// No other guest runs on its node: it makes its groups now (or, if it is lent first, as
    /// it takes the lease).
    Groups,
    /// Its input closed unsaid: its node's NM died. It goes without touching its groups,
    /// which the node's next NM sweeps before it starts a warm guest of its own (that one's
    /// groups are the same directories).
    NmGone,
}

/// What [`retire_all`] writes before it closes a warm guest's input.
const RETIRE: &str = "retire";

/// What a warm guest is told when it may make its groups ([`Told::Groups`]).
const GROUPS: &str = "groups";

/// What a warm guest's node's NM writes on `input` next: the lease's end
/// ([`GuestRunner::start`]), `groups` or `retire`. Anything else is refused with what was
/// said.
pub fn wait_for_lend(input: &mut impl BufRead) -> anyhow::Result<Told> {
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Ok(Told::NmGone);
    }
    let said = line.trim();
    if said == RETIRE {
        return Ok(Told::Retire);
    }
    if said == GROUPS {
        return Ok(Told::Groups);
    }
    let (until, grant) = match said.split_once(' ') {
        Some((until, grant)) => (until, Some(grant)),
        None => (said, None),
    };
    let until_ms = until.parse::<u64>().map_err(|_| {
        anyhow::anyhow!("a warm guest NM was told {said:?} by its node's NM, not a lease's end")
    })?;
    let grant = grant
        .map(LeaseGrant::from_hex)
        .transpose()
        .map_err(|e| anyhow::anyhow!("a warm guest NM's lease grant: {e}"))?;
    Ok(Told::Lease(until_ms, grant))
}

/// Stops the guest NM whose pid `dir` keeps, if that process still runs and is a guest NM.
fn stop_orphan(dir: &DaemonDir) {
    let mut text = String::new();
    let read = dir
        .open_file(PID_FILE)
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text));
    let _ = dir.remove_file(PID_FILE);
    let Some(pid) = read.ok().and_then(|_| text.trim().parse::<i32>().ok()) else {
        return;
    };
    let is_guest = |pid: i32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == b"--guest-of"))
    };
    if !is_guest(pid) {
        return;
    }
    tracing::warn!(
        pid,
        "stopping the guest NM an earlier NM of this node left running"
    );
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + STOP_WAIT;
    while running(pid.as_raw()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if is_guest(pid.as_raw()) {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let deadline = Instant::now() + STOP_WAIT;
        while running(pid.as_raw()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Whether process `pid` may still hold what it opened (the guest slot's listening port):
/// it exists and is not yet a zombie whose threads have all ended. Its command line alone
/// says too little: it reads empty from the moment the exiting process drops its memory,
/// before its threads have closed its descriptors, and a guest NM started in that moment
/// found the slot's address still in use (lending.rs, about one run in eight).
fn running(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    let zombie = field("State:").starts_with('Z') || field("State:").starts_with('X');
    let threads: u32 = field("Threads:").parse().unwrap_or(1);
    !(zombie && threads <= 1)
}

impl Drop for GuestProcess {
    /// A stopping NM stops its guest: the lease needs a home NM to hand the node back.
    fn drop(&mut self) {
        self.stop_guest();
        retire_all(
            std::mem::take(&mut self.warm)
                .into_values()
                .filter_map(WarmSlot::started)
                .collect(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A warm guest takes the lease's end its node's NM writes, its word to make the groups
    /// (then reads on), or its word to retire; a closed input is its NM gone; anything else
    /// is refused with what was said.
    #[test]
    fn a_warm_guest_reads_its_lease_or_goes() {
        let mut lease = "1796085036972\n".as_bytes();
        assert_eq!(
            wait_for_lend(&mut lease).unwrap(),
            Told::Lease(1796085036972, None)
        );
        let grant = storm_cluster::identity::MmSigner::new(
            ed25519_dalek::SigningKey::from_bytes(&[2; 32]),
            "home",
        )
        .grant_lease("far", "n0", 1796085036972);
        let with_grant = format!("1796085036972 {}\n", grant.to_hex());
        assert_eq!(
            wait_for_lend(&mut with_grant.as_bytes()).unwrap(),
            Told::Lease(1796085036972, Some(grant))
        );
        let retire = format!("{RETIRE}\n");
        assert_eq!(wait_for_lend(&mut retire.as_bytes()).unwrap(), Told::Retire);
        let groups_then_lease = format!("{GROUPS}\n1796085036972\n");
        let mut input = groups_then_lease.as_bytes();
        assert_eq!(wait_for_lend(&mut input).unwrap(), Told::Groups);
        assert_eq!(
            wait_for_lend(&mut input).unwrap(),
            Told::Lease(1796085036972, None)
        );
        assert_eq!(wait_for_lend(&mut "".as_bytes()).unwrap(), Told::NmGone);
        let mut garbage = "soon\n".as_bytes();
        let err = wait_for_lend(&mut garbage).unwrap_err().to_string();
        assert!(err.contains("\"soon\""), "{err}");
    }
}
