//! The gang part of `storm-bench report`: gang scheduling at the instance's size, as the
//! tasks see it.
//!
//! In an instance that gang-schedules (`storm start --policy gang`), a job of CPU-bound
//! probe ranks that fills every node (one rank per CPU the node manager has, so two such
//! jobs cannot share a slot) runs alone, then two of them run at once. From the ranks' own
//! run windows ([`storm_cli::run_windows`]): overlap (the two jobs running at once), co-run
//! (all of a job's ranks running together), run windows against the quantum, the skew of a
//! switch across nodes; and from the submitter's clock alone, the slowdown: the pair's time
//! to the end over twice the job's alone, the cost of the switches (1 is free).
//!
//! The windows need the report's directory on a file system every node sees (the probe and
//! its windows live there) and, across nodes, one clock: `CLOCK_MONOTONIC` where every node
//! is this host (a testbed, a one-host allocation), else `CLOCK_REALTIME`, as close as the
//! hosts' time synchronization keeps it. Where a part cannot be measured, the section says
//! why instead.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;
use storm_cli::run_windows::{GangView, ProbeClock, ProbeJobs, build_probe, run_probes};
use storm_cluster::ClusterConfig;
use storm_cluster::config::PolicyKind;

use crate::report::Table;

/// What the report says of gang scheduling in the instance.
#[derive(Debug, Clone, Serialize)]
pub struct GangFigures {
    pub nodes: u32,
    pub ranks_per_node: u32,
    pub quantum_ms: f64,
    pub clock: &'static str,
    /// Each rank's CPU seconds.
    pub cpu_s: f64,
    /// The job alone, submitted to ended, in seconds.
    pub alone_s: f64,
    /// The two jobs, submitted to both ended.
    pub together_s: f64,
    /// `together_s / (2 * alone_s)`.
    pub slowdown: f64,
    pub overlap: f64,
    pub corun_min: f64,
    pub corun_alone: f64,
    pub window_p50_per_quantum: f64,
    pub skew_p50_ms: f64,
    pub skew_p99_ms: f64,
}

/// The probe jobs' clock for this instance: one host's, or the hosts' real-time clocks.
fn clock_of(cfg: &ClusterConfig) -> ProbeClock {
    if cfg.nodes.iter().all(|n| n.address.ip().is_loopback()) {
        ProbeClock::Monotonic
    } else {
        ProbeClock::Realtime
    }
}

/// Measures gang scheduling in the instance `cfg` describes; `Err(why)` where it cannot.
/// `ranks_per_node`: the probe ranks on each node (default: the fewest CPUs a node has).
pub fn measure(
    cfg: &ClusterConfig,
    bin: &Path,
    dir: &Path,
    cpu_s: f64,
    ranks_per_node: Option<u32>,
) -> Result<GangFigures, String> {
    if cfg.scheduler.policy != PolicyKind::Gang {
        let policy = format!("{:?}", cfg.scheduler.policy).to_lowercase();
        return Err(format!(
            "the instance's policy is {policy}, not gang (storm start --policy gang)"
        ));
    }
    let nodes = cfg.nodes.len() as u32;
    let ranks_per_node = ranks_per_node
        .unwrap_or_else(|| cfg.nodes.iter().map(|n| n.cpus).min().unwrap_or(1))
        .max(1);
    let quantum_ms = cfg.cluster.timeslice_ms;
    let clock = clock_of(cfg);
    let work = dir.join("gang-probe");
    std::fs::create_dir_all(&work).map_err(|e| format!("making {}: {e}", work.display()))?;
    let probe = build_probe(&work)?;
    let out = work.join("windows");
    let submit = || Command::new(bin.join("storm-submit"));
    let timed = |jobs: usize| -> Result<_, String> {
        let t = Instant::now();
        let p = ProbeJobs {
            nodes,
            ranks_per_node,
            jobs,
            cpu_s,
            quantum_ms,
            clock,
        };
        let runs = run_probes(submit, &probe, &out, &p).map_err(|e| {
            format!("{e} (the report's directory must be on a file system every node sees)")
        })?;
        Ok((t.elapsed().as_secs_f64(), GangView::of(&runs)))
    };
    let (alone_s, alone) = timed(1)?;
    let (together_s, pair) = timed(2)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(GangFigures {
        nodes,
        ranks_per_node,
        quantum_ms,
        clock: match clock {
            ProbeClock::Monotonic => "CLOCK_MONOTONIC (one host)",
            ProbeClock::Realtime => "CLOCK_REALTIME (hosts as synchronized as they are)",
        },
        cpu_s,
        alone_s,
        together_s,
        slowdown: together_s / (2.0 * alone_s),
        overlap: pair.overlap,
        corun_min: pair.corun_min,
        corun_alone: alone.corun_min,
        window_p50_per_quantum: pair.window_p50_ns as f64 / 1e6 / quantum_ms,
        skew_p50_ms: pair.skew_p50_ns as f64 / 1e6,
        skew_p99_ms: pair.skew_p99_ns as f64 / 1e6,
    })
}

/// The section as a table: the figures, or why there are none.
pub fn table(figures: &Result<GangFigures, String>) -> Table {
    match figures {
        Ok(g) => {
            let mut t = Table::new(
                format!(
                    "# gang scheduling at the instance's size: two jobs of {} ranks ({} per node \
                     on all {} nodes, {} s of CPU each) alone and together, quantum {} ms; \
                     windows read with {}",
                    g.nodes * g.ranks_per_node,
                    g.ranks_per_node,
                    g.nodes,
                    g.cpu_s,
                    g.quantum_ms,
                    g.clock
                ),
                &[
                    "quantum",
                    "overlap",
                    "co-run",
                    "co-run alone",
                    "window p50/q",
                    "skew p50",
                    "skew p99",
                    "alone",
                    "together",
                    "slowdown",
                ],
            );
            t.push(vec![
                format!("{} ms", g.quantum_ms),
                format!("{:.3}", g.overlap),
                format!("{:.3}", g.corun_min),
                format!("{:.3}", g.corun_alone),
                format!("{:.2}", g.window_p50_per_quantum),
                format!("{:.2} ms", g.skew_p50_ms),
                format!("{:.2} ms", g.skew_p99_ms),
                crate::stats::fmt_time(g.alone_s),
                crate::stats::fmt_time(g.together_s),
                format!("{:.3}", g.slowdown),
            ]);
            t
        }
        Err(why) => {
            let mut t = Table::new(
                "# gang scheduling at the instance's size",
                &["not measured"],
            );
            t.push(vec![why.clone()]);
            t
        }
    }
}
