//! The guest NM of a lent node (docs/federation.md, lending).
//!
//! While this cluster lends the node to a peer, the node's own NM runs a second `storm-nm`
//! process for the peer: the *guest*, started from the peer's cluster file as this cluster's
//! operator installed it (`[[peer]] guest_file`), as that file's guest slot for this node. It
//! joins the peer's fabric like any node (registration, heartbeats, launch, gang slots), runs
//! the peer's jobs as this cluster's account for the peer (`[[peer]] flock_user`, never
//! root), and stops itself at the lease's end whatever it hears. The home NM stops it when
//! the node comes home; its tasks, in the guest's own cgroups, die with it. Whatever a guest
//! leaves there (it was killed outright, as it did not stop in time or an NM before this one
//! was killed under it, and a task had started a process in a session of its own) the home
//! NM kills before it takes the node's next command, so nothing of the borrower's outlives
//! the lease beside the lender's jobs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use storm_cluster::ClusterConfig;
use storm_cluster::daemon_dir::DaemonDir;

use crate::env::GuestRunner;

/// The file of the NM's spool that holds its running guest's pid.
pub const PID_FILE: &str = "guest.pid";

/// How long a guest has to stop (it kills its tasks on the way out) before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// What starts a guest: the storm-nm binary, this node and its cluster file.
pub struct GuestProcess {
    /// The storm-nm binary (the running one).
    exe: PathBuf,
    /// This cluster's file: its `[[peer]]`s say where each peer's file is and as whom.
    config: std::sync::Arc<ClusterConfig>,
    /// This node's name in it.
    node: String,
    /// Where the running guest's pid is kept ([`PID_FILE`]).
    dir: DaemonDir,
    running: Option<Running>,
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
        node: String,
        dir: DaemonDir,
        home: bool,
    ) -> Self {
        stop_orphan(&dir);
        let me = Self {
            exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("storm-nm")),
            config,
            node,
            dir,
            running: None,
        };
        // No guest runs now: whatever one left in any borrower's groups here goes.
        for p in me.config.peers.iter().filter(|p| home && p.lend) {
            if let Ok((_, groups)) = me.guest_of(&p.name) {
                groups.sweep();
            }
        }
        me
    }

    /// Peer `peer`'s entry in this cluster's file and where its guest's groups are (from the
    /// peer's cluster file as this cluster installed it), or why it cannot lend to it.
    fn guest_of(
        &self,
        peer: &str,
    ) -> Result<(&storm_cluster::federation::PeerEntry, GuestGroups), String> {
        let entry = self
            .config
            .peers
            .iter()
            .find(|p| p.name == peer && p.lend)
            .ok_or_else(|| format!("this cluster does not lend to {peer}"))?;
        let file = entry.guest_file.as_ref().ok_or_else(|| {
            format!("[[peer]] {peer} names no guest_file (the peer's cluster file on this node)")
        })?;
        let theirs = ClusterConfig::load(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let slot = theirs
            .guest_slot(&self.config.cluster.name, &self.node)
            .ok_or_else(|| {
                format!(
                    "{} has no guest slot for node {} of cluster {}",
                    file.display(),
                    self.node,
                    self.config.cluster.name
                )
            })?;
        let groups = GuestGroups {
            mode: theirs.cluster.cgroups,
            cluster: theirs.cluster.name.clone(),
            slot: theirs.nodes[slot as usize].name.clone(),
        };
        Ok((entry, groups))
    }

    /// The guest's command line for peer `peer`, and where its groups will be, or why it
    /// cannot run.
    fn command(&self, peer: &str, until_ms: u64) -> Result<(Command, GuestGroups), String> {
        let (entry, groups) = self.guest_of(peer)?;
        let file = entry.guest_file.as_ref().expect("guest_of checked it");
        let user = entry.flock_user.as_ref().ok_or_else(|| {
            format!("[[peer]] {peer} names no flock_user to run its jobs as on lent nodes")
        })?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("--config")
            .arg(file)
            .arg("--node")
            .arg(&groups.slot)
            .arg("--guest-user")
            .arg(user)
            .arg("--lease-until")
            .arg(until_ms.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // Its log goes where this NM's goes (stderr).
        Ok((cmd, groups))
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
    fn start(&mut self, peer: &str, until_ms: u64) {
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
        let child = self.command(peer, until_ms).and_then(|(mut c, groups)| {
            let child = c
                .spawn()
                .map_err(|e| format!("starting the guest NM: {e}"))?;
            Ok((child, groups))
        });
        match child {
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
            }
            Err(e) => tracing::error!(%peer, "cannot lend this node: {e}"),
        }
    }

    fn stop(&mut self) {
        if !self.alive() {
            return;
        }
        let mut r = self.running.take().expect("alive");
        let _ = self.dir.remove_file(PID_FILE);
        let pid = nix::unistd::Pid::from_raw(r.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            match r.child.try_wait() {
                Ok(Some(status)) if status.success() => {
                    // It stopped as asked, and took its jobs' groups along.
                    tracing::info!(peer = %r.peer, %status, "home again: guest NM stopped");
                    return;
                }
                Ok(Some(status)) => {
                    tracing::warn!(peer = %r.peer, %status, "home again: the guest NM failed as it stopped");
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    tracing::warn!(peer = %r.peer, "the guest NM did not stop in time: killed");
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    break;
                }
            }
        }
        // A guest killed outright, or one that failed, may have left processes behind.
        r.groups.sweep();
    }
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
            .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == b"--guest-user"))
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
    while is_guest(pid.as_raw()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if is_guest(pid.as_raw()) {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

impl Drop for GuestProcess {
    /// A stopping NM stops its guest: the lease needs a home NM to hand the node back.
    fn drop(&mut self) {
        self.stop();
    }
}
