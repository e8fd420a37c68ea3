//! `storm-bench sample`: what one sample of a node costs its NM (`storm_nm::sample`), in CPU
//! time, and as a fraction of one core at the sample period; beside a fork/exec of
//! `/bin/true` (what a health-check script would cost at the least) in the same run.
//!
//! The sampler reads this host's `/proc` (and, for `node_cgroup`, a cgroup subtree: this
//! process's own v1 `cpuacct` and `memory` groups, or its v2 group) as an NM does; the CPU
//! time is this thread's own (`CLOCK_THREAD_CPUTIME_ID`) over many samples. A last row adds
//! what the usage record costs on top ([`storm_nm::usage`]): the groups of four jobs, made
//! for the run under a group of its own (root only), and the fabric ports looked for.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use storm_cluster::sample::Source;
use storm_nm::sample::{CgroupVersion, NodeCgroupFiles, Sampler, SamplerOptions};
use storm_nm::usage::UsageSampler;

use crate::report::Table;
use crate::stats::fmt_time;

pub struct SampleArgs {
    pub samples: usize,
    pub period: Duration,
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// This process's own cgroup files (v1 `cpuacct` and `memory`, else v2), for the
/// `node_cgroup` source.
fn own_cgroup() -> Option<NodeCgroupFiles> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path_of = |want: &str| {
        text.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == want)
                .then(|| path.trim_start_matches('/').to_string())
        })
    };
    match (path_of("cpuacct"), path_of("memory")) {
        (Some(cpu), Some(mem)) => Some(NodeCgroupFiles {
            version: CgroupVersion::V1,
            cpu_dir: PathBuf::from("/sys/fs/cgroup/cpuacct").join(cpu),
            memory_dir: PathBuf::from("/sys/fs/cgroup/memory").join(mem),
        }),
        _ => {
            let v2 = text.lines().find_map(|l| l.strip_prefix("0::"))?;
            let base = PathBuf::from("/sys/fs/cgroup").join(v2.trim_start_matches('/'));
            Some(NodeCgroupFiles {
                version: CgroupVersion::V2,
                cpu_dir: base.clone(),
                memory_dir: base,
            })
        }
    }
}

/// CPU per sample of `source`, over `n` samples.
fn cost(source: Source, n: usize, period: Duration) -> Result<Duration> {
    let dir = std::env::temp_dir();
    let mut sampler = Sampler::new(SamplerOptions {
        source,
        node_cpus: 2,
        spool_dir: dir.clone(),
        state_dir: dir,
        cgroup: own_cgroup(),
        period,
        proc_dir: "/proc".into(),
        sys_dir: "/sys".into(),
    });
    // The first sample has no rate to take; the inventory is taken once per NM.
    let _ = sampler.inventory();
    let _ = sampler.take(0, 0);
    let before = thread_cpu();
    for i in 0..n {
        std::hint::black_box(sampler.take(i as u64, 1).encode());
    }
    Ok((thread_cpu() - before) / n.max(1) as u32)
}

/// Jobs' groups made for the usage row, removed when dropped.
struct BenchGroups {
    dirs: Vec<PathBuf>,
}

impl BenchGroups {
    /// `jobs` empty job groups (`job-1`...) under a group of this run's own, in the v1
    /// `cpuacct` and `memory` hierarchies or in v2's: `None` where they cannot be made (not
    /// root, no cgroup file system).
    fn make(jobs: usize) -> Option<(Self, NodeCgroupFiles)> {
        let name = format!("storm-bench-sample-{}", std::process::id());
        let root = PathBuf::from("/sys/fs/cgroup");
        let (cpu_dir, memory_dir, version) =
            if root.join("cpuacct").is_dir() && root.join("memory").is_dir() {
                (
                    root.join("cpuacct").join(&name),
                    root.join("memory").join(&name),
                    CgroupVersion::V1,
                )
            } else {
                (root.join(&name), root.join(&name), CgroupVersion::V2)
            };
        let mut groups = BenchGroups { dirs: Vec::new() };
        for base in [&cpu_dir, &memory_dir] {
            if groups.dirs.contains(base) {
                continue;
            }
            std::fs::create_dir(base).ok()?;
            groups.dirs.push(base.clone());
            for j in 1..=jobs {
                let d = base.join(format!("job-{j}"));
                std::fs::create_dir(&d).ok()?;
                groups.dirs.push(d);
            }
        }
        let files = NodeCgroupFiles {
            version,
            cpu_dir,
            memory_dir,
        };
        Some((groups, files))
    }
}

impl Drop for BenchGroups {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Jobs the usage row reads.
const USAGE_JOBS: usize = 4;

/// CPU per usage record with [`USAGE_JOBS`] jobs' groups (and the fabric ports looked for),
/// over `n` records; `None` where the groups cannot be made.
fn usage_cost(n: usize) -> Option<Duration> {
    let (_groups, files) = BenchGroups::make(USAGE_JOBS)?;
    let mut usage = UsageSampler::new(Some(files), Path::new("/sys"));
    let first = usage.take(0, 0);
    if first.jobs.len() != USAGE_JOBS {
        tracing::warn!("the usage row read {} jobs' groups", first.jobs.len());
        return None;
    }
    let before = thread_cpu();
    for i in 0..n {
        std::hint::black_box(usage.take(i as u64, 0).encode());
    }
    Some((thread_cpu() - before) / n.max(1) as u32)
}

pub fn run(args: &SampleArgs) -> Result<Table> {
    let baseline = crate::faults::fork_exec()?;
    let mut table = Table::new(
        format!(
            "What one sample of a node costs its NM: CPU time per sample (this thread's, mean \
             over {} samples, the record encoded), and as a share of one core at a {} ms \
             sample period (the target: at most 0.1 %); baseline: fork/exec of /bin/true, \
             same run (wall time)",
            args.samples,
            args.period.as_millis()
        ),
        &[
            "source",
            "CPU per sample",
            "share of one core",
            "baseline",
            "ratio",
        ],
    );
    // A row: CPU per sample, its share of one core at the period, and the ratio to fork/exec.
    let measured = |name: String, per: Duration| {
        vec![
            name,
            fmt_time(per.as_secs_f64()),
            format!(
                "{:.4} %",
                100.0 * per.as_secs_f64() / args.period.as_secs_f64()
            ),
            fmt_time(baseline),
            format!("{:.2}", per.as_secs_f64() / baseline),
        ]
    };
    for (name, source) in [("host", Source::Host), ("node_cgroup", Source::NodeCgroup)] {
        let per = cost(source, args.samples, args.period)?;
        table.push(measured(name.into(), per));
    }
    let row = format!("+ usage, {USAGE_JOBS} jobs' cgroups");
    match usage_cost(args.samples) {
        Some(per) => table.push(measured(row, per)),
        None => table.push(vec![
            row,
            "not measured: making cgroups needs root and a cgroup file system".into(),
            String::new(),
            String::new(),
            String::new(),
        ]),
    }
    Ok(table)
}
