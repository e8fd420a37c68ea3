//! `storm-bench gang --parts tasks`: gang scheduling as the tasks see it (issue 32).
//!
//! CPU-bound ranks ([`storm_cli::run_windows`]'s probe, one per node) record the wall-time
//! windows in which they actually ran. For every quantum and both daemon policies (real-time,
//! the default where the daemons have the privilege, and the normal policy) the bench runs
//! one job alone, then two jobs together, on a namespace testbed (as root) or else on an
//! embedded cluster, and reports from the ranks' windows alone:
//!
//! * overlap: the time the two jobs ran at once, anywhere, over the shorter one's run time;
//! * co-run: the time all of a job's ranks ran together over the time any of them ran (the
//!   lower of the two jobs; beside it, the job alone);
//! * run windows, median and p99, against the quantum;
//! * the skew of switches across nodes (how far apart a job's ranks start a window);
//! * slowdown: the two jobs' makespan over twice the job's alone.
//!
//! With `--tasks-loss PCT` the last node's link drops PCT % of its packets (testbed only): a
//! heartbeat that a lost packet delays by a retransmission is what the slot's lease
//! (`[scheduler] slot_lease`) is for; `--tasks-lease true,false` measures every row with it
//! and without it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::run_windows::{GangView, ProbeClock, ProbeJobs, Runs, build_probe, run_probes};
use storm_cli::testbed::{Testbed, TestbedOptions, namespaces_available};
use storm_cluster::config::{PolicyKind, SchedulerSection};

use crate::report::Table;

/// Where the jobs run: a namespace testbed or an embedded cluster, and how storm-submit
/// reaches its MM.
enum Cluster {
    Testbed(Testbed),
    Local(LocalCluster),
}

impl Cluster {
    fn start(dir: &Path, nodes: u32, quantum_ms: f64, rt: u8, lease: bool) -> Result<Cluster> {
        let scheduler = SchedulerSection {
            policy: PolicyKind::Gang,
            mpl: 2,
            daemon_rt_priority: rt,
            slot_lease: lease,
            ..SchedulerSection::default()
        };
        if namespaces_available().is_ok() {
            let tb = Testbed::up(&TestbedOptions {
                name: format!("bt{:05}", std::process::id() % 100_000),
                nodes,
                // One CPU per node: every job needs whole nodes, so the two take turns.
                cpus: 1,
                dir: dir.join(format!("testbed-{quantum_ms}-{rt}-{lease}")),
                timeslice_ms: quantum_ms,
                scheduler,
                failure: Default::default(),
                managers: 1,
                replication: Default::default(),
                health: Default::default(),
                sysfs: None,
                cluster_name: None,
                federation: Default::default(),
                peers: Vec::new(),
                net: storm_cli::testbed::SINGLE_NET,
                guests: Vec::new(),
                limits: Default::default(),
            })?;
            return Ok(Cluster::Testbed(tb));
        }
        Ok(Cluster::Local(LocalCluster::start(&LocalOptions {
            timeslice_ms: quantum_ms,
            cpus: Some(1),
            scheduler,
            ..LocalOptions::new(nodes)
        })?))
    }

    /// storm-submit (from `bin`) pointed at this cluster's MM.
    fn submit(&self, bin: &Path) -> Command {
        let mut cmd = Command::new(bin.join("storm-submit"));
        match self {
            Cluster::Testbed(tb) => cmd.arg("--config").arg(&tb.config_path),
            Cluster::Local(c) => cmd.arg("--socket").arg(c.socket()),
        };
        cmd
    }
}

/// From the first window's start to the last window's end, in seconds.
fn makespan(runs: &Runs) -> f64 {
    let spans = || runs.values().flat_map(|r| r.values()).flatten();
    let start = spans().map(|w| w.0).min().unwrap_or(0);
    let end = spans().map(|w| w.1).max().unwrap_or(0);
    end.saturating_sub(start) as f64 / 1e9
}

pub struct TasksArgs {
    pub nodes: u32,
    pub quanta_ms: Vec<f64>,
    pub cpu_s: f64,
    /// The real-time priorities to compare (0: the normal policy).
    pub rt_priorities: Vec<u8>,
    /// Percent of packets the last node's link drops (0: none).
    pub loss_percent: u32,
    /// `[scheduler] slot_lease` settings to compare.
    pub leases: Vec<bool>,
}

/// The table of what the tasks saw, one row per quantum and daemon policy.
pub fn tasks_table(args: &TasksArgs) -> Result<Table> {
    let work = tempfile::Builder::new()
        .prefix("storm-bench-gang-tasks-")
        .tempdir()?;
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let probe: PathBuf = build_probe(work.path()).map_err(anyhow::Error::msg)?;
    let bin = storm_cli::local::bin_dir()?;
    let where_ = if namespaces_available().is_ok() {
        "namespace testbed"
    } else if args.loss_percent > 0 {
        anyhow::bail!(
            "--tasks-loss needs a namespace testbed (root, ip netns): {}",
            namespaces_available().unwrap_err()
        );
    } else {
        "embedded cluster (no network namespaces here)"
    };
    let lossy = args.nodes - 1;
    let mut table = Table::new(
        format!(
            "Gang scheduling seen from the tasks: {} nodes ({where_}), 1 CPU each, two jobs of \
             one CPU-bound rank per node, {} s of CPU per rank; the same quantum's job alone \
             beside it{}",
            args.nodes,
            args.cpu_s,
            if args.loss_percent > 0 {
                format!(
                    "; node {lossy}'s link drops {} % of its packets",
                    args.loss_percent
                )
            } else {
                String::new()
            }
        ),
        &[
            "quantum",
            "daemons",
            "slot lease",
            "overlap",
            "co-run",
            "co-run alone",
            "window p50/q",
            "window p99/q",
            "skew p50",
            "skew p90",
            "skew p99",
            "slowdown",
        ],
    );
    for &q in &args.quanta_ms {
        for (&rt, &lease) in args
            .rt_priorities
            .iter()
            .flat_map(|rt| args.leases.iter().map(move |l| (rt, l)))
        {
            let cluster = Cluster::start(work.path(), args.nodes, q, rt, lease)?;
            if let (Cluster::Testbed(tb), true) = (&cluster, args.loss_percent > 0) {
                tb.set_loss(lossy, args.loss_percent)?;
            }
            let out = work.path().join("windows");
            let probes = |jobs| {
                let submit = || cluster.submit(&bin);
                let jobs = ProbeJobs {
                    nodes: args.nodes,
                    ranks_per_node: 1,
                    jobs,
                    cpu_s: args.cpu_s,
                    quantum_ms: q,
                    clock: ProbeClock::Monotonic,
                };
                run_probes(submit, &probe, &out, &jobs).map_err(anyhow::Error::msg)
            };
            let alone = probes(1)?;
            let together = probes(2)?;
            drop(cluster);
            let a = GangView::of(&alone);
            let t = GangView::of(&together);
            let ms = |ns: u64| format!("{:.2} ms", ns as f64 / 1e6);
            let per_q = |ns: u64| format!("{:.2}", ns as f64 / 1e6 / q);
            table.push(vec![
                format!("{q} ms"),
                // What the daemons ran under: more nodes than cores keep the default out.
                match storm_cli::local::embedded_scheduler(
                    &SchedulerSection {
                        daemon_rt_priority: rt,
                        ..SchedulerSection::default()
                    },
                    args.nodes,
                )
                .daemon_rt_priority
                {
                    0 => "normal".into(),
                    p => format!("SCHED_FIFO {p}"),
                },
                if lease { "on" } else { "off" }.into(),
                format!("{:.3}", t.overlap),
                format!("{:.3}", t.corun_min),
                format!("{:.3}", a.corun_min),
                per_q(t.window_p50_ns),
                per_q(t.window_p99_ns),
                ms(t.skew_p50_ns),
                ms(t.skew_p90_ns),
                ms(t.skew_p99_ns),
                format!("{:.3}", makespan(&together) / (2.0 * makespan(&alone))),
            ]);
            eprintln!(
                "  tasks: {q} ms, rt {rt}, lease {lease}: overlap {:.3}, co-run {:.3}",
                t.overlap, t.corun_min
            );
        }
    }
    Ok(table)
}
