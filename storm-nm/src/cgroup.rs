//! A control group per job: its processes live and die together, and what they used is
//! counted.
//!
//! Every task of a job joins the job's cgroup before it executes its program (the launcher's
//! child writes itself into `cgroup.procs`), so whatever the task forks, and whatever calls
//! `setsid` or double-forks to leave its process group, stays in it. When the job's tasks
//! here have ended, or the job is cancelled, the NM kills every process left in the cgroup,
//! reads its CPU time and peak memory for the job's record, and removes it.
//!
//! Both cgroup versions are served, as Slurm serves them:
//!
//! * **v1** (separate hierarchies per controller, as on this project's CI machine): a
//!   directory in each of the `freezer`, `cpuacct`, `memory` and `pids` hierarchies that is
//!   mounted; a kill freezes the group (no fork can slip by), SIGKILLs every process in it and
//!   thaws it. CPU time from `cpuacct.usage`, peak memory from `memory.max_usage_in_bytes`.
//! * **v2** (one unified hierarchy): one directory; a kill writes `cgroup.kill` (Linux 5.14)
//!   or freezes with `cgroup.freeze` and SIGKILLs. CPU time from `cpu.stat`, peak memory from
//!   `memory.peak` where the memory controller is enabled.
//!
//! The groups live at `<hierarchy>/storm/<cluster>/<node>/job-<id>`: nodes of a cluster
//! sharing one kernel (the namespace testbed) and clusters sharing a host never share a
//! group. Everything here is root's (only root may write a cgroup directory), so users
//! cannot interfere with it. An NM that cannot make its groups (not root, no cgroup file
//! system) says so once and kills jobs by process group, as before.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use storm_cluster::messages::{JobId, JobUsage};

use crate::sample::read_number;

/// Which cgroup version to use (`[cluster] cgroups` in the cluster file).
pub use storm_cluster::config::CgroupMode;

/// The v1 controllers a job's group is made in (those mounted).
const V1_CONTROLLERS: [&str; 4] = ["freezer", "cpuacct", "memory", "pids"];

/// Where cgroups are mounted, and how jobs' groups are made there. Dropped (the NM stops),
/// it kills what is left in this node's groups and removes them.
#[derive(Debug)]
pub enum Cgroups {
    /// One directory per job in each mounted v1 controller: (controller, this node's base).
    V1(Vec<(&'static str, PathBuf)>),
    /// One directory per job under this node's base in the unified hierarchy.
    V2(PathBuf),
    /// No cgroups: jobs are killed by process group.
    None,
}

/// The mount points of cgroup file systems, from /proc/self/mountinfo: (v1 controller or
/// "" for v2, mount point).
fn mounts() -> Vec<(String, PathBuf)> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in info.lines() {
        // ... mount-point ... - fstype source super-options
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let point = left.split(' ').nth(4).unwrap_or("");
        let mut r = right.split(' ');
        let (fstype, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
        match fstype {
            Some("cgroup2") => out.push((String::new(), PathBuf::from(point))),
            Some("cgroup") => {
                for opt in options.split(',') {
                    if V1_CONTROLLERS.contains(&opt) {
                        out.push((opt.to_string(), PathBuf::from(point)));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// A job's group, made.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The `cgroup.procs` files a task of the job writes itself into.
    pub procs: Vec<PathBuf>,
    /// Why the job's `--mem` is not enforced here, where it is not.
    pub unenforced: Option<String>,
}

/// Why job `job`'s memory limit is not enforced (logged; the text for the user).
fn unenforced(job: JobId, why: &str) -> String {
    tracing::warn!(job, "--mem not enforced: {why}");
    format!("--mem is not enforced: {why}")
}

impl Cgroups {
    /// Finds the cgroup file systems `mode` allows, and makes this node's base directories
    /// (`storm/<cluster>/<node>`), removing what an earlier NM of this node left there (its
    /// processes killed first). `None` (with the reason logged) where groups cannot be made.
    pub fn open(mode: CgroupMode, cluster: &str, node: &str) -> Self {
        let groups = Self::locate(mode, cluster, node);
        if !groups.enabled() {
            if mode != CgroupMode::None {
                tracing::warn!(
                    ?mode,
                    "no cgroup file system for jobs here: a job's processes that leave its \
                     process group can outlive it, and no CPU time or memory is recorded"
                );
            }
            return groups;
        }
        for base in groups.bases() {
            if base.exists() {
                kill_tree(&base);
            }
            if let Err(e) = std::fs::create_dir_all(&base) {
                tracing::warn!(
                    "cannot make {} ({e}): jobs run without cgroups (a process that leaves its \
                     job's process group can outlive it)",
                    base.display()
                );
                return Cgroups::None;
            }
        }
        if let Cgroups::V2(base) = &groups {
            enable_v2_controllers(base);
        }
        tracing::info!(cgroups = ?groups, "jobs run in cgroups");
        groups
    }

    /// Kills every process left in node `node` of cluster `cluster`'s groups, where `mode`
    /// puts them, and removes the groups: what a guest NM killed outright leaves behind (its
    /// tasks, in the borrower's groups on this node). Whether any group was there.
    pub fn sweep(mode: CgroupMode, cluster: &str, node: &str) -> bool {
        let groups = Self::locate(mode, cluster, node);
        let found = groups.bases().iter().any(|b| b.exists());
        // Dropped, they kill what is left in them and go.
        drop(groups);
        found
    }

    /// Where `mode` puts node `node` of cluster `cluster`'s groups, without making them.
    fn locate(mode: CgroupMode, cluster: &str, node: &str) -> Self {
        if mode == CgroupMode::None {
            return Cgroups::None;
        }
        let found = mounts();
        let v1: Vec<(&'static str, PathBuf)> = V1_CONTROLLERS
            .iter()
            .filter_map(|&c| {
                found
                    .iter()
                    .find(|(name, _)| name == c)
                    .map(|(_, p)| (c, p.clone()))
            })
            .collect();
        let v2 = found
            .iter()
            .find(|(name, _)| name.is_empty())
            .map(|(_, p)| p.clone());
        // Where /sys/fs/cgroup itself is cgroup2, the host is v2 only.
        let pure_v2 = v2.as_deref() == Some(Path::new("/sys/fs/cgroup"));
        let sub = |root: &Path| root.join("storm").join(cluster).join(node);
        let chosen = match mode {
            CgroupMode::V1 => (!v1.is_empty()).then_some(true),
            CgroupMode::V2 => v2.is_some().then_some(false),
            CgroupMode::Auto if pure_v2 => Some(false),
            CgroupMode::Auto if !v1.is_empty() => Some(true),
            CgroupMode::Auto => v2.is_some().then_some(false),
            CgroupMode::None => None,
        };
        match chosen {
            Some(true) => Cgroups::V1(v1.iter().map(|(c, p)| (*c, sub(p))).collect()),
            Some(false) => Cgroups::V2(sub(v2.as_deref().expect("chosen"))),
            None => Cgroups::None,
        }
    }

    fn bases(&self) -> Vec<PathBuf> {
        match self {
            Cgroups::V1(list) => list.iter().map(|(_, p)| p.clone()).collect(),
            Cgroups::V2(p) => vec![p.clone()],
            Cgroups::None => Vec::new(),
        }
    }

    /// Where this node's subtree (every job's group under it) counts its CPU time and memory:
    /// a node's own figures where nodes share one kernel (`[monitoring] source =
    /// "node_cgroup"`). `None` without cgroups, or without a v1 `cpuacct` or `memory`
    /// hierarchy.
    pub fn node_usage_files(&self) -> Option<crate::sample::NodeCgroupFiles> {
        use crate::sample::{CgroupVersion, NodeCgroupFiles};
        match self {
            Cgroups::V1(list) => {
                let base = |controller: &str| {
                    list.iter()
                        .find(|(c, _)| *c == controller)
                        .map(|(_, p)| p.clone())
                };
                Some(NodeCgroupFiles {
                    version: CgroupVersion::V1,
                    cpu_dir: base("cpuacct")?,
                    memory_dir: base("memory")?,
                })
            }
            Cgroups::V2(base) => Some(NodeCgroupFiles {
                version: CgroupVersion::V2,
                cpu_dir: base.clone(),
                memory_dir: base.clone(),
            }),
            Cgroups::None => None,
        }
    }

    /// The directories of job `job`'s group (none without cgroups).
    pub fn job_dirs(&self, job: JobId) -> Vec<PathBuf> {
        let name = format!("job-{job}");
        self.bases().into_iter().map(|b| b.join(&name)).collect()
    }

    /// Makes job `job`'s group if it is not there, confined to `mem` bytes if given (swap
    /// included: a job over its memory is killed, not swapped): the `cgroup.procs` files a
    /// task of it writes itself into, and why `mem` is not enforced where it cannot be
    /// (for the user: the job still runs, unconfined).
    pub fn prepare(&self, job: JobId, mem: Option<u64>) -> Result<Prepared, String> {
        let dirs = self.job_dirs(job);
        for d in &dirs {
            match std::fs::create_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot make the job's cgroup {}: {e}", d.display())),
            }
        }
        let unenforced = match mem {
            Some(bytes) => self.confine(job, bytes)?,
            None => None,
        };
        Ok(Prepared {
            procs: dirs.into_iter().map(|d| d.join("cgroup.procs")).collect(),
            unenforced,
        })
    }

    /// Caps job `job`'s group at `bytes` of memory, and as much memory and swap together.
    /// Without cgroups, or without the memory controller, the job runs unconfined: the MM
    /// still places it by its memory, and the NM says why (returned, for the user, and in
    /// its log).
    fn confine(&self, job: JobId, bytes: u64) -> Result<Option<String>, String> {
        let name = format!("job-{job}");
        let (limit, with_swap, swap_only) = match self {
            Cgroups::V1(list) => match list.iter().find(|(c, _)| *c == "memory") {
                Some((_, base)) => {
                    let d = base.join(&name);
                    (
                        d.join("memory.limit_in_bytes"),
                        Some(d.join("memory.memsw.limit_in_bytes")),
                        None,
                    )
                }
                None => {
                    return Ok(Some(unenforced(
                        job,
                        "no cgroup memory hierarchy is mounted",
                    )));
                }
            },
            Cgroups::V2(base) => {
                let d = base.join(&name);
                (d.join("memory.max"), None, Some(d.join("memory.swap.max")))
            }
            Cgroups::None => {
                return Ok(Some(unenforced(
                    job,
                    "this node manager keeps no cgroups (it is not root, or may write no cgroup \
                     file system here)",
                )));
            }
        };
        if !limit.exists() {
            let why = format!("{} is missing", limit.display());
            return Ok(Some(unenforced(job, &why)));
        }
        let write = |path: &Path, value: &str| {
            std::fs::write(path, value).map_err(|e| {
                format!(
                    "cannot confine the job to its memory ({} = {value}): {e}",
                    path.display()
                )
            })
        };
        write(&limit, &bytes.to_string())?;
        // Optional files: kernels without swap accounting have neither.
        if let Some(p) = with_swap.filter(|p| p.exists()) {
            write(&p, &bytes.to_string())?;
        }
        if let Some(p) = swap_only.filter(|p| p.exists()) {
            write(&p, "0")?;
        }
        Ok(None)
    }

    /// Kills every process left in job `job`'s group, reads what the group used, and removes
    /// it. Nothing to do (and nothing known) without cgroups or without a group for the job.
    pub fn end_job(&self, job: JobId) -> JobUsage {
        let dirs = self.job_dirs(job);
        if dirs.iter().all(|d| !d.exists()) {
            return JobUsage::default();
        }
        match self {
            Cgroups::V1(list) => {
                let dir = |controller: &str| {
                    list.iter()
                        .position(|(c, _)| *c == controller)
                        .map(|i| dirs[i].clone())
                };
                kill_v1(dir("freezer").as_deref(), &dirs);
                let usage = JobUsage {
                    cpu_us: dir("cpuacct")
                        .and_then(|d| read_number(&d.join("cpuacct.usage")))
                        .map(|ns| ns / 1000),
                    peak_memory_bytes: dir("memory")
                        .and_then(|d| read_number(&d.join("memory.max_usage_in_bytes"))),
                    oom_kills: dir("memory").and_then(|d| {
                        let control = std::fs::read_to_string(d.join("memory.oom_control")).ok()?;
                        stat_field(&control, "oom_kill")
                    }),
                };
                for d in &dirs {
                    remove_group(d);
                }
                usage
            }
            Cgroups::V2(_) => {
                let d = &dirs[0];
                kill_v2(d);
                let usage = JobUsage {
                    cpu_us: std::fs::read_to_string(d.join("cpu.stat"))
                        .ok()
                        .and_then(|s| stat_field(&s, "usage_usec")),
                    peak_memory_bytes: read_number(&d.join("memory.peak")),
                    oom_kills: std::fs::read_to_string(d.join("memory.events"))
                        .ok()
                        .and_then(|s| stat_field(&s, "oom_kill")),
                };
                remove_group(d);
                usage
            }
            Cgroups::None => JobUsage::default(),
        }
    }

    /// Whether jobs run in cgroups here.
    pub fn enabled(&self) -> bool {
        !matches!(self, Cgroups::None)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for base in self.bases() {
            kill_tree(&base);
            // The cluster's directory, and storm's, once no node of theirs is left.
            if let Some(cluster) = base.parent() {
                let _ = std::fs::remove_dir(cluster);
                if let Some(storm) = cluster.parent() {
                    let _ = std::fs::remove_dir(storm);
                }
            }
        }
    }
}

/// Enables the memory, cpu and pids controllers for the groups under `base` (v2), where the
/// hierarchy has them; those it lacks are simply not counted.
fn enable_v2_controllers(base: &Path) {
    let mut chain = Vec::new();
    let mut at = base.parent();
    while let Some(p) = at {
        if !p.join("cgroup.subtree_control").exists() {
            break;
        }
        chain.push(p.to_path_buf());
        at = p.parent();
    }
    chain.reverse();
    chain.push(base.to_path_buf());
    for dir in chain {
        let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        for c in ["memory", "cpu", "pids"] {
            if available.split_whitespace().any(|a| a == c) {
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"));
            }
        }
    }
}

/// The value of `field` in a `key value` per line file (cpu.stat).
fn stat_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(' ')?;
        (key == field).then(|| value.trim().parse().ok())?
    })
}

/// The processes in the group at `dir`.
fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// SIGKILLs every process in `dir`'s group until it is empty (bounded: a group that will not
/// empty is logged and left).
fn kill_all(dir: &Path) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = procs(dir);
        if pids.is_empty() {
            return true;
        }
        for pid in pids {
            // SAFETY: kill with a pid read from the group; a pid that went away is ESRCH.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if Instant::now() > until {
            tracing::warn!("{} will not empty; left as it is", dir.display());
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// v1: freeze (so no process forks while the others are killed), kill, thaw, wait until empty.
fn kill_v1(freezer: Option<&Path>, dirs: &[PathBuf]) {
    let Some(first) = dirs.first() else {
        return;
    };
    if procs(first).is_empty() {
        return;
    }
    if let Some(f) = freezer {
        let state = f.join("freezer.state");
        let _ = std::fs::write(&state, "FROZEN");
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until
            && std::fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FREEZING")
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        for pid in procs(f) {
            // SAFETY: as in `kill_all`.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::write(&state, "THAWED");
        kill_all(f);
    } else {
        kill_all(first);
    }
}

/// v2: `cgroup.kill` where the kernel has it, else freeze and kill.
fn kill_v2(dir: &Path) {
    if procs(dir).is_empty() {
        return;
    }
    if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
        let _ = std::fs::write(dir.join("cgroup.freeze"), "1");
        for pid in procs(dir) {
            // SAFETY: as in `kill_all`.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
    }
    kill_all(dir);
}

/// Removes an empty group directory (a cgroup is removed with rmdir, files and all).
fn remove_group(dir: &Path) {
    if let Err(e) = std::fs::remove_dir(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("cannot remove {}: {e}", dir.display());
    }
}

/// Kills what is in every group under `root` and removes them, deepest first.
fn kill_tree(root: &Path) {
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                kill_tree(&e.path());
            }
        }
    }
    kill_all(root);
    let _ = std::fs::remove_dir(root);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_from_its_line_of_cpu_stat() {
        let s = "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n";
        assert_eq!(stat_field(s, "usage_usec"), Some(1234));
        assert_eq!(stat_field(s, "nr_periods"), None);
    }

    #[test]
    fn oom_kills_are_read_from_their_own_line_not_a_longer_key() {
        // v1's memory.oom_control, where `oom_kill_disable` comes first.
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(stat_field(v1, "oom_kill"), Some(3));
        // v2's memory.events, where `oom_group_kill` follows.
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(stat_field(v2, "oom_kill"), Some(2));
    }

    #[test]
    fn without_cgroups_nothing_is_made_or_known() {
        let g = Cgroups::None;
        assert!(g.job_dirs(3).is_empty());
        let prepared = g.prepare(3, Some(1 << 20)).unwrap();
        assert_eq!(prepared.procs, Vec::<PathBuf>::new());
        assert!(
            prepared
                .unenforced
                .is_some_and(|why| why.contains("keeps no cgroups")),
            "a limit that cannot be kept is said"
        );
        assert_eq!(g.end_job(3), JobUsage::default());
    }
}
