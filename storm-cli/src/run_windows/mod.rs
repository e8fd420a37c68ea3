//! Gang scheduling as the tasks see it: CPU-bound ranks ([`PROBE_C`]) record the windows of
//! wall time in which they actually ran, and [`GangView::of`] turns those windows into the
//! figures a user of gang scheduling cares about:
//!
//! * **overlap**: the time two jobs ran at once, anywhere on the cluster, as a fraction of the
//!   shorter job's run time (the time any of its ranks ran). Gang scheduling promises 0.
//! * **co-run**: for each job, the time all its ranks ran together as a fraction of the time
//!   any of them ran, while every rank still has work (until the first one finishes: a rank
//!   that lost time earlier would otherwise count it twice, once when it lost it and again
//!   when it ran alone to make it up). Gang scheduling promises 1.
//! * **run windows**: how long a rank runs before it is taken off the CPU, against the
//!   quantum it was promised.
//! * **switch skew**: how far apart the ranks of one job start running after a switch.
//!
//! Every figure comes from the tasks' own clocks (`CLOCK_MONOTONIC`, one clock for all the
//! nodes of a namespace testbed or an embedded cluster), never from the daemons' bookkeeping.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The probe: `probe DIR CPU_SECONDS [GAP_US]` spins until it has run CPU_SECONDS, and writes
/// its run windows to `DIR/job-J.rank-R`.
pub const PROBE_C: &str = include_str!("probe.c");

/// The gap (in microseconds) that ends a probe's run window at quantum `quantum_ms`: a
/// quarter of the quantum, at most 1 ms. Shorter gaps are the kernel's or the daemons' brief
/// preemptions; a gap as long as the other slot's quantum must end the window, or two
/// windows around another job's turn would count as one.
pub fn gap_us(quantum_ms: f64) -> u64 {
    ((quantum_ms * 250.0) as u64).clamp(50, 1000)
}

/// A stretch of time, in nanoseconds of `CLOCK_MONOTONIC`: `[start, end)`.
pub type Span = (u64, u64);

/// The run windows of every rank of every job: job id, then rank.
pub type Runs = BTreeMap<u64, BTreeMap<u32, Vec<Span>>>;

/// Compiles the probe into `dir` with the system's C compiler; its path.
pub fn build_probe(dir: &Path) -> Result<PathBuf, String> {
    let src = dir.join("probe.c");
    let bin = dir.join("probe");
    std::fs::write(&src, PROBE_C).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .map_err(|e| format!("running cc (a C compiler is needed for the probe): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed on the probe: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(bin)
}

/// The clock the probes read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeClock {
    /// `CLOCK_MONOTONIC`: one clock where every node shares a kernel (a testbed, an
    /// embedded cluster).
    Monotonic,
    /// `CLOCK_REALTIME`: nodes that are hosts of their own, as far as their time
    /// synchronization keeps their clocks together.
    Realtime,
}

/// What [`run_probes`] runs.
#[derive(Debug, Clone)]
pub struct ProbeJobs {
    pub nodes: u32,
    /// Ranks on each node (all of a node's CPUs, for jobs that cannot share a node).
    pub ranks_per_node: u32,
    /// Jobs submitted at once.
    pub jobs: usize,
    /// CPU seconds each rank runs.
    pub cpu_s: f64,
    pub quantum_ms: f64,
    pub clock: ProbeClock,
}

/// Runs `p.jobs` jobs of probe ranks at once, each rank running `p.cpu_s` of CPU time at
/// quantum `p.quantum_ms`, through the storm-submit commands `submit` makes (each already
/// pointed at its cluster), and returns the windows they wrote into `out` (made afresh,
/// writable by every user). An error names the job that failed and what storm-submit said.
pub fn run_probes(
    submit: impl Fn() -> Command,
    probe: &Path,
    out: &Path,
    p: &ProbeJobs,
) -> Result<Runs, String> {
    use std::os::unix::fs::PermissionsExt;
    let (nodes, jobs) = (p.nodes, p.jobs);
    let ranks = nodes * p.ranks_per_node.max(1);
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", out.display());
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| io("clearing", e))?;
    }
    std::fs::create_dir_all(out).map_err(|e| io("making", e))?;
    std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| io("opening", e))?;
    let mut running = Vec::new();
    for _ in 0..jobs {
        let mut cmd = submit();
        cmd.args([
            "-N",
            &nodes.to_string(),
            "-n",
            &ranks.to_string(),
            "--no-bcast",
        ])
        .arg(probe)
        .arg(out)
        .arg(p.cpu_s.to_string())
        .arg(gap_us(p.quantum_ms).to_string())
        .arg(match p.clock {
            ProbeClock::Monotonic => "monotonic",
            ProbeClock::Realtime => "realtime",
        })
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
        running.push(
            cmd.spawn()
                .map_err(|e| format!("starting storm-submit: {e}"))?,
        );
    }
    for (i, child) in running.into_iter().enumerate() {
        let o = child
            .wait_with_output()
            .map_err(|e| format!("waiting for storm-submit: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "probe job {} of {jobs} failed: {}",
                i + 1,
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    let runs = read_runs(out)?;
    if runs.len() != jobs || runs.values().any(|r| r.len() != ranks as usize) {
        return Err(format!(
            "the probes wrote windows for {} jobs of {:?} ranks, not {jobs} of {ranks}",
            runs.len(),
            runs.values().map(|r| r.len()).collect::<Vec<_>>()
        ));
    }
    Ok(runs)
}

/// Reads the windows the probes wrote into `dir`.
pub fn read_runs(dir: &Path) -> Result<Runs, String> {
    let mut runs = Runs::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((job, rank)) = name
            .strip_prefix("job-")
            .and_then(|rest| rest.split_once(".rank-"))
        else {
            continue;
        };
        let (Ok(job), Ok(rank)) = (job.parse::<u64>(), rank.parse::<u32>()) else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path())
            .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        let mut spans = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let mut parts = line.split_whitespace().map(str::parse::<u64>);
            match (parts.next(), parts.next()) {
                (Some(Ok(s)), Some(Ok(e))) if e >= s => spans.push((s, e)),
                _ => return Err(format!("{name}:{}: not a window: {line:?}", i + 1)),
            }
        }
        spans.sort_unstable();
        runs.entry(job).or_default().insert(rank, spans);
    }
    Ok(runs)
}

/// The union of sorted spans, as sorted disjoint spans.
pub fn union(spans: impl IntoIterator<Item = Span>) -> Vec<Span> {
    let mut all: Vec<Span> = spans.into_iter().collect();
    all.sort_unstable();
    let mut out: Vec<Span> = Vec::with_capacity(all.len());
    for (s, e) in all {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The intersection of two sets of sorted disjoint spans.
pub fn intersect(a: &[Span], b: &[Span]) -> Vec<Span> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let s = a[i].0.max(b[j].0);
        let e = a[i].1.min(b[j].1);
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The total length of disjoint spans.
pub fn measure(spans: &[Span]) -> u64 {
    spans.iter().map(|(s, e)| e - s).sum()
}

/// The value at quantile `q` (0..=1) of sorted values, or 0 for none.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// One job's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    pub ranks: usize,
    /// The time any of its ranks ran, in ns.
    pub run_ns: u64,
    /// The time all of its ranks ran together over the time any of them ran, both counted
    /// until the first of its ranks finished.
    pub corun: f64,
}

/// What gang scheduling looked like from the tasks' side.
#[derive(Debug, Clone, PartialEq)]
pub struct GangView {
    pub jobs: BTreeMap<u64, JobView>,
    /// The largest, over pairs of jobs, of the time both ran at once (anywhere) over the
    /// shorter one's run time. 0 with fewer than two jobs.
    pub overlap: f64,
    /// The lowest co-run fraction of any job.
    pub corun_min: f64,
    /// Run windows of every rank (without each rank's first and last, which the start and
    /// the end cut short): median and 99th percentile, and how many.
    pub window_p50_ns: u64,
    pub window_p99_ns: u64,
    pub windows: usize,
    /// How far from the nearest start of the job's lowest rank every other rank's windows
    /// start: median, 90th and 99th percentile.
    pub skew_p50_ns: u64,
    pub skew_p90_ns: u64,
    pub skew_p99_ns: u64,
}

impl GangView {
    /// The figures of `runs`.
    pub fn of(runs: &Runs) -> GangView {
        let unions: BTreeMap<u64, Vec<Span>> = runs
            .iter()
            .map(|(&job, ranks)| (job, union(ranks.values().flatten().copied())))
            .collect();
        let mut jobs = BTreeMap::new();
        for (&job, ranks) in runs {
            let any = &unions[&job];
            let mut all: Option<Vec<Span>> = None;
            for spans in ranks.values() {
                let spans = union(spans.iter().copied());
                all = Some(match all {
                    None => spans,
                    Some(acc) => intersect(&acc, &spans),
                });
            }
            let run_ns = measure(any);
            // Co-run counts while every rank still has work: until the first rank's last
            // window ends. After it, the others run alone only because they have more left,
            // and the time they lost to make it so already counted against co-run.
            let first_done = ranks
                .values()
                .filter_map(|spans| spans.iter().map(|w| w.1).max())
                .min()
                .unwrap_or(0);
            let working = [(0, first_done)];
            let any_working = measure(&intersect(any, &working));
            let together = all.map_or(0, |a| measure(&intersect(&a, &working)));
            jobs.insert(
                job,
                JobView {
                    ranks: ranks.len(),
                    run_ns,
                    corun: if any_working == 0 {
                        0.0
                    } else {
                        together as f64 / any_working as f64
                    },
                },
            );
        }
        let ids: Vec<u64> = unions.keys().copied().collect();
        let mut overlap = 0.0f64;
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                let both = measure(&intersect(&unions[a], &unions[b]));
                let shorter = jobs[a].run_ns.min(jobs[b].run_ns);
                if shorter > 0 {
                    overlap = overlap.max(both as f64 / shorter as f64);
                }
            }
        }
        let mut windows: Vec<u64> = runs
            .values()
            .flat_map(|ranks| ranks.values())
            .filter(|spans| spans.len() > 2)
            .flat_map(|spans| spans[1..spans.len() - 1].iter().map(|(s, e)| e - s))
            .collect();
        windows.sort_unstable();
        let mut skews = Vec::new();
        for ranks in runs.values() {
            let mut it = ranks.values();
            let Some(first) = it.next() else { continue };
            let starts: Vec<u64> = first.iter().map(|w| w.0).collect();
            for other in it {
                for &(s, _) in other {
                    let at = starts.partition_point(|&t| t < s);
                    let near = [at.checked_sub(1), Some(at)]
                        .into_iter()
                        .flatten()
                        .filter_map(|k| starts.get(k))
                        .map(|&t| t.abs_diff(s))
                        .min();
                    skews.extend(near);
                }
            }
        }
        skews.sort_unstable();
        GangView {
            corun_min: jobs.values().map(|j| j.corun).fold(1.0, f64::min),
            jobs,
            overlap,
            window_p50_ns: quantile(&windows, 0.5),
            window_p99_ns: quantile(&windows, 0.99),
            windows: windows.len(),
            skew_p50_ns: quantile(&skews, 0.5),
            skew_p90_ns: quantile(&skews, 0.9),
            skew_p99_ns: quantile(&skews, 0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(jobs: &[(u64, &[&[Span]])]) -> Runs {
        jobs.iter()
            .map(|(job, ranks)| {
                (
                    *job,
                    ranks
                        .iter()
                        .enumerate()
                        .map(|(r, s)| (r as u32, s.to_vec()))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn jobs_taking_turns_in_step_overlap_nowhere_and_corun_fully() {
        let a: &[Span] = &[(0, 5), (10, 15), (20, 25)];
        let b: &[Span] = &[(5, 10), (15, 20), (25, 30)];
        let v = GangView::of(&runs(&[(1, &[a, a]), (2, &[b, b])]));
        assert_eq!(v.overlap, 0.0);
        assert_eq!(v.corun_min, 1.0);
        assert_eq!((v.window_p50_ns, v.windows), (5, 4));
        assert_eq!(v.skew_p99_ns, 0);
    }

    #[test]
    fn nodes_switching_out_of_step_show_as_overlap_skew_and_lost_corun() {
        // Job 1 on node 0 runs [0,5); on node 1 one unit late, [1,6). Job 2 likewise.
        let a0: &[Span] = &[(0, 5), (10, 15)];
        let a1: &[Span] = &[(1, 6), (11, 16)];
        let b0: &[Span] = &[(5, 10), (15, 20)];
        let b1: &[Span] = &[(6, 11), (16, 21)];
        let v = GangView::of(&runs(&[(1, &[a0, a1]), (2, &[b0, b1])]));
        // Job 1 ran during [0,6) and [10,16): 12; job 2 ran [5,11) and [15,21): 12; at once
        // [5,6), [10,11), [15,16): 3.
        assert!((v.overlap - 3.0 / 12.0).abs() < 1e-9, "{v:?}");
        // Job 1's ranks together [1,5) and [11,15): 8 of the 11 until its first rank ended
        // (at 15); rank 1's [15,16) alone after it is left out.
        assert!((v.jobs[&1].corun - 8.0 / 11.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.skew_p50_ns, 1);
    }

    #[test]
    fn a_rank_that_ran_alone_to_make_up_lost_time_counts_it_once() {
        // Rank 1 was held off its CPU for [4,6) while rank 0 ran, so it ends 2 later.
        let r0: &[Span] = &[(0, 10)];
        let r1: &[Span] = &[(0, 4), (6, 12)];
        let v = GangView::of(&runs(&[(1, &[r0, r1])]));
        // Until rank 0 ended (10): any [0,10), together [0,4) and [6,10): 8 of 10. The
        // [10,12) rank 1 then ran alone is the same 2 made up, not counted again.
        assert!((v.jobs[&1].corun - 0.8).abs() < 1e-9, "{v:?}");
        assert_eq!(v.jobs[&1].run_ns, 12);
    }

    #[test]
    fn union_and_intersection_of_spans() {
        assert_eq!(union([(3, 4), (0, 2), (1, 3)]), vec![(0, 4)]);
        assert_eq!(
            intersect(&[(0, 4), (6, 9)], &[(3, 7)]),
            vec![(3, 4), (6, 7)]
        );
        assert_eq!(measure(&[(0, 4), (6, 9)]), 7);
    }
}
