//! `storm-bench sample`: what one sample of a node costs its NM (`storm_nm::sample`), in CPU
//! time, and as a fraction of one core at the sample period; beside a fork/exec of
//! `/bin/true` (what a health-check script would cost at the least) in the same run.
//!
//! The sampler reads this host's `/proc` (and, for `node_cgroup`, a cgroup subtree: this
//! process's own v1 `cpuacct` and `memory` groups, or its v2 group) as an NM does; the CPU
//! time is this thread's own (`CLOCK_THREAD_CPUTIME_ID`) over many samples.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use storm_cluster::sample::Source;
use storm_nm::sample::{NodeCgroupFiles, Sampler, SamplerOptions};

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
            cpu: PathBuf::from("/sys/fs/cgroup/cpuacct")
                .join(cpu)
                .join("cpuacct.usage"),
            memory: PathBuf::from("/sys/fs/cgroup/memory")
                .join(mem)
                .join("memory.usage_in_bytes"),
        }),
        _ => {
            let v2 = text.lines().find_map(|l| l.strip_prefix("0::"))?;
            let base = PathBuf::from("/sys/fs/cgroup").join(v2.trim_start_matches('/'));
            Some(NodeCgroupFiles {
                cpu: base.join("cpu.stat"),
                memory: base.join("memory.current"),
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
    for (name, source) in [("host", Source::Host), ("node_cgroup", Source::NodeCgroup)] {
        let per = cost(source, args.samples, args.period)?;
        table.push(vec![
            name.into(),
            fmt_time(per.as_secs_f64()),
            format!(
                "{:.4} %",
                100.0 * per.as_secs_f64() / args.period.as_secs_f64()
            ),
            fmt_time(baseline),
            format!("{:.2}", per.as_secs_f64() / baseline),
        ]);
    }
    Ok(table)
}
