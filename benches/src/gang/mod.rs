//! `storm-bench gang`: gang scheduling on an embedded cluster (the paper's Figs. 3 and 5).
//!
//! * Quantum sweep (Fig. 3): MPL jobs of a CPU-bound SPMD program that synchronises every
//!   `sync_ms` of computation run together on N nodes with quanta from 0.3 ms to 1 s; their
//!   makespan is compared with MPL times the same job run alone on the same cluster, and with
//!   MPL times the program run bare (fork/exec, no resource manager) in the same run.
//! * MPL sweep (Fig. 5): 1, 2, 4, 8 jobs at once at one quantum.
//! * For every run: switches, NM CPU time per switch, NM and MM CPU time as a share of wall
//!   time (per node, this is what a node of a real cluster would lose), and the strobe skew (the
//!   spread between the first and the last node finishing the same switch).
//! * Skew with light jobs: two jobs that sleep, switched every quantum on 8 and 16 nodes, so
//!   the skew is the mechanism's and not CPU contention from the test program; beside it the
//!   wake-up spread of this host (one thread waking N blocked threads), measured in the run.
//!
//! All nodes share this machine's cores: with N ranks per job on C cores every rank gets C/N of
//! a core, and every NM competes with the ranks for CPU. Ratios are what carries over.

mod observe;
mod spmd;
mod tasks;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cluster::config::{BackendKind, PolicyKind, SchedulerSection};

use crate::report::{Csv, Table};
use crate::stats::{Samples, fmt_time};
use observe::{DaemonCpu, SwitchLogs, SwitchSummary, wakeup_spread};
use spmd::{Rank0, Span, Spmd};

/// The measurements `storm-bench gang` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Quantum,
    Mpl,
    Skew,
    /// Overlap, co-run, run windows and skew as CPU-bound ranks saw them (`tasks`).
    Tasks,
}

pub struct GangArgs {
    pub nodes: u32,
    pub mpl: usize,
    pub parts: Vec<Part>,
    pub quanta_ms: Vec<f64>,
    pub mpls: Vec<usize>,
    pub mpl_quantum_ms: f64,
    pub skew_nodes: Vec<u32>,
    pub skew_quantum_ms: f64,
    pub skew_seconds: f64,
    pub alone_s: f64,
    pub sync_ms: f64,
    pub backend: BackendKind,
    pub provider: Option<String>,
    /// Tree fanout of the tcp backend (cluster default if `None`).
    pub fanout: Option<usize>,
    /// `[scheduler] daemon_rt_priority` of the cluster (0: the normal policy).
    pub daemon_rt_priority: u8,
    pub tasks_nodes: u32,
    pub tasks_quanta_ms: Vec<f64>,
    pub tasks_cpu_s: f64,
    pub tasks_loss_percent: u32,
    pub tasks_leases: Vec<bool>,
}

pub const CSV_HEADER: &[&str] = &[
    "table",
    "nodes",
    "mpl",
    "quantum_ms",
    "bare_s",
    "alone_s",
    "together_s",
    "slowdown",
    "vs_bare",
    "switches",
    "heartbeat_period_s",
    "nm_cpu_per_switch_s",
    "nm_share",
    "mm_share",
    "skew_p50_s",
    "skew_p99_s",
    "wakeup_p50_s",
    "wakeup_p99_s",
];

fn start_cluster(args: &GangArgs, nodes: u32, mpl: usize, quantum_ms: f64) -> Result<LocalCluster> {
    LocalCluster::start(&LocalOptions {
        timeslice_ms: quantum_ms,
        backend: args.backend,
        provider: args.provider.clone(),
        fanout: args.fanout,
        scheduler: SchedulerSection {
            policy: PolicyKind::Gang,
            mpl,
            switch_log: true,
            daemon_rt_priority: args.daemon_rt_priority,
            ..SchedulerSection::default()
        },
        ..LocalOptions::new(nodes)
    })
}

/// What the daemons did while some jobs ran together.
struct Overhead {
    switches: SwitchSummary,
    /// NM CPU seconds summed over nodes, MM CPU seconds, wall seconds.
    nm_cpu: f64,
    mm_cpu: f64,
    wall: f64,
    nodes: u32,
}

impl Overhead {
    /// NaN when nothing switched (MPL 1).
    fn nm_per_switch(&self) -> f64 {
        if self.switches.switches == 0 {
            return f64::NAN;
        }
        self.nm_cpu / self.switches.switches as f64
    }

    fn heartbeat_period(&self) -> f64 {
        self.switches.heartbeat_period.unwrap_or(f64::NAN)
    }

    /// NM CPU time per node as a share of wall time: NM CPU per quantum over the quantum.
    fn nm_share(&self) -> f64 {
        self.nm_cpu / self.nodes as f64 / self.wall
    }

    fn mm_share(&self) -> f64 {
        self.mm_cpu / self.wall
    }

    /// Spread of the switches' completion across nodes.
    fn skew(&self, q: f64) -> f64 {
        Samples::from_secs(self.switches.skews.clone()).quantile(q)
    }

    /// Spread of the heartbeat's receipt across nodes.
    fn receipt_skew(&self, q: f64) -> f64 {
        Samples::from_secs(self.switches.receipt_skews.clone()).quantile(q)
    }

    /// The CSV columns from `switches` to `skew_p99_s`.
    fn csv_cells(&self) -> [String; 7] {
        [
            self.switches.switches.to_string(),
            format!("{:.9}", self.heartbeat_period()),
            format!("{:.9}", self.nm_per_switch()),
            format!("{:.5}", self.nm_share()),
            format!("{:.5}", self.mm_share()),
            format!("{:.9}", self.skew(0.5)),
            format!("{:.9}", self.skew(0.99)),
        ]
    }

    /// On one node, from taking the heartbeat to the switch being complete.
    fn handling(&self, q: f64) -> f64 {
        Samples::from_secs(self.switches.handling.clone()).quantile(q)
    }
}

/// Runs `jobs` at once (through `run`) and accounts for what the daemons did meanwhile.
fn observed<T>(
    cluster: &LocalCluster,
    nodes: u32,
    run: impl FnOnce() -> Result<T>,
) -> Result<(T, Overhead)> {
    let logs = SwitchLogs::mark(cluster.root(), nodes);
    let before = DaemonCpu::now(cluster)?;
    let out = run()?;
    let after = DaemonCpu::now(cluster)?;
    let (mm_cpu, nm_cpu, wall) = before.used_until(&after);
    Ok((
        out,
        Overhead {
            switches: logs.summary()?,
            nm_cpu,
            mm_cpu,
            wall,
            nodes,
        },
    ))
}

/// One measurement point: the program run bare (fork/exec, no cluster) before and after, and
/// between them one cluster running one job alone, then `mpl` jobs together.
struct GangRun {
    mpl: usize,
    quantum_ms: f64,
    /// Mean of the bare runs before and after the cluster's.
    bare: f64,
    alone: f64,
    together: f64,
    overhead: Overhead,
}

fn gang_run(args: &GangArgs, program: &Spmd, mpl: usize, quantum_ms: f64) -> Result<GangRun> {
    let before = program.run_bare(args.nodes)?.secs();
    let cluster = start_cluster(args, args.nodes, mpl, quantum_ms)?;
    let (alone, slot) = program.run_job(&cluster, args.nodes)?;
    if slot.is_none() {
        bail!("the MM did not report a time slot for a gang-scheduled job");
    }
    let (spans, overhead) = observed(&cluster, args.nodes, || {
        program.run_jobs(&cluster, args.nodes, mpl)
    })?;
    cluster.shutdown()?;
    let after = program.run_bare(args.nodes)?.secs();
    Ok(GangRun {
        mpl,
        quantum_ms,
        bare: (before + after) / 2.0,
        alone: alone.secs(),
        together: Span::makespan(&spans),
        overhead,
    })
}

fn fmt_pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

/// A time, or "-" where there was nothing to measure.
fn fmt_opt(secs: f64) -> String {
    if secs.is_nan() {
        "-".into()
    } else {
        fmt_time(secs)
    }
}

fn gang_columns(first: &str) -> Vec<&str> {
    vec![
        first,
        "bare",
        "alone",
        "together",
        "slowdown",
        "vs bare",
        "switches/node",
        "real quantum",
        "NM CPU/switch",
        "NM CPU/node",
        "MM CPU",
        "skew p50",
        "skew p99",
        "receipt skew p99",
    ]
}

fn gang_row(first: String, run: &GangRun, table: &mut Table, csv: &mut Csv, csv_table: &str) {
    let (mpl, bare) = (run.mpl, run.bare);
    let m = mpl as f64;
    let o = &run.overhead;
    table.push(vec![
        first,
        fmt_time(bare),
        fmt_time(run.alone),
        fmt_time(run.together),
        format!("{:.3}", run.together / (m * run.alone)),
        format!("{:.3}", run.together / (m * bare)),
        (o.switches.switches / o.nodes as usize).to_string(),
        fmt_opt(o.heartbeat_period()),
        fmt_opt(o.nm_per_switch()),
        fmt_pct(o.nm_share()),
        fmt_pct(o.mm_share()),
        fmt_opt(o.skew(0.5)),
        fmt_opt(o.skew(0.99)),
        fmt_opt(o.receipt_skew(0.99)),
    ]);
    csv.push(gang_csv_row(run, csv_table));
}

/// One CSV row of the quantum or MPL sweep.
fn gang_csv_row(run: &GangRun, csv_table: &str) -> Vec<String> {
    let (mpl, bare) = (run.mpl, run.bare);
    let m = mpl as f64;
    let o = &run.overhead;
    let mut row = vec![
        csv_table.into(),
        o.nodes.to_string(),
        mpl.to_string(),
        run.quantum_ms.to_string(),
        format!("{bare:.6}"),
        format!("{:.6}", run.alone),
        format!("{:.6}", run.together),
        format!("{:.4}", run.together / (m * run.alone)),
        format!("{:.4}", run.together / (m * bare)),
    ];
    row.extend(o.csv_cells());
    row.extend([String::new(), String::new()]);
    row
}

const NOTES: &str = "slowdown = together / (MPL x alone); vs bare = together / (MPL x the program \
run by fork/exec with no RM, same run); NM CPU/node = NM CPU time per node / wall time = NM CPU per \
quantum / quantum; skew = first-to-last node finishing the same switch; receipt skew = \
first-to-last node taking the heartbeat that orders it; real quantum = time between heartbeats \
as the NMs took them (the MM sends the next heartbeat only when the nodes keep up)";

/// How the daemons were scheduled, for the tables' titles.
fn policy_name(rt_priority: u8) -> String {
    match rt_priority {
        0 => "under the normal policy".into(),
        p => format!("under SCHED_FIFO {p}"),
    }
}

fn quantum_sweep(args: &GangArgs, program: &Spmd, csv: &mut Csv) -> Result<Table> {
    let mut table = Table::new(
        format!(
            "Gang scheduling, quantum sweep (paper Fig. 3): {} jobs of {} ranks of a CPU-bound SPMD \
             program (barrier every {} ms of computation), {} nodes, MPL {}, daemons {}\n{NOTES}",
            args.mpl,
            args.nodes,
            args.sync_ms,
            args.nodes,
            args.mpl,
            policy_name(args.daemon_rt_priority)
        ),
        &gang_columns("quantum"),
    );
    for &q in &args.quanta_ms {
        let run = gang_run(args, program, args.mpl, q)?;
        gang_row(format!("{q} ms"), &run, &mut table, csv, "quantum");
        eprintln!("  measured quantum {q} ms");
    }
    Ok(table)
}

fn mpl_sweep(args: &GangArgs, program: &Spmd, csv: &mut Csv) -> Result<Table> {
    let q = args.mpl_quantum_ms;
    let mut table = Table::new(
        format!(
            "Gang scheduling, multiprogramming levels (paper Fig. 5): MPL jobs at once of {} ranks, \
             {} nodes, quantum {q} ms\n{NOTES}",
            args.nodes, args.nodes
        ),
        &gang_columns("MPL"),
    );
    for &mpl in &args.mpls {
        let run = gang_run(args, program, mpl, q)?;
        gang_row(mpl.to_string(), &run, &mut table, csv, "mpl");
        eprintln!("  measured MPL {mpl}");
    }
    Ok(table)
}

fn sleep_program() -> Result<PathBuf> {
    ["/bin/sleep", "/usr/bin/sleep"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow::anyhow!("no sleep(1) found in /bin or /usr/bin"))
}

fn skew_sweep(args: &GangArgs, csv: &mut Csv) -> Result<Table> {
    let q = args.skew_quantum_ms;
    let mut table = Table::new(
        format!(
            "Strobe skew with light jobs: 2 jobs of sleep({}) on N nodes, MPL 2, quantum {q} ms, \
             every node switches every heartbeat. receipt: spread of the NMs taking the \
             heartbeat; switch on a node: heartbeat taken to switch complete (SIGSTOP, stopped \
             state confirmed in /proc, SIGCONT); skew: spread of the switches' completion; \
             wake-up baseline: one thread writes a byte to N sockets, spread of the N blocked \
             readers waking (same run, no cluster)",
            args.skew_seconds
        ),
        &[
            "N",
            "heartbeats",
            "real quantum",
            "all switched",
            "receipt p50",
            "receipt p99",
            "switch on a node p50",
            "p99",
            "skew p50",
            "skew p99",
            "wake-up p50",
            "wake-up p99",
            "p99 ratio",
            "NM CPU/switch",
            "NM CPU/node",
            "MM CPU",
        ],
    );
    let sleep = sleep_program()?;
    for &n in &args.skew_nodes {
        let wake = Samples::from_secs(wakeup_spread(n, 1000)?);
        let cluster = start_cluster(args, n, 2, q)?;
        let secs = format!("{}", args.skew_seconds);
        let ((), o) = observed(&cluster, n, || {
            std::thread::scope(|s| {
                let jobs: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            spmd::submit(
                                &cluster,
                                &sleep,
                                vec![secs.clone()],
                                n,
                                &mut Rank0::default(),
                            )
                        })
                    })
                    .collect();
                for j in jobs {
                    j.join()
                        .map_err(|_| anyhow::anyhow!("a submitting thread panicked"))??;
                }
                Ok(())
            })
        })?;
        cluster.shutdown()?;
        std::thread::sleep(Duration::from_millis(100));
        let p99 = o.skew(0.99);
        table.push(vec![
            n.to_string(),
            o.switches.heartbeats.to_string(),
            fmt_opt(o.heartbeat_period()),
            o.switches.skews.len().to_string(),
            fmt_time(o.receipt_skew(0.5)),
            fmt_time(o.receipt_skew(0.99)),
            fmt_time(o.handling(0.5)),
            fmt_time(o.handling(0.99)),
            fmt_time(o.skew(0.5)),
            fmt_time(p99),
            fmt_time(wake.median()),
            fmt_time(wake.quantile(0.99)),
            format!("{:.2}", p99 / wake.quantile(0.99)),
            fmt_time(o.nm_per_switch()),
            fmt_pct(o.nm_share()),
            fmt_pct(o.mm_share()),
        ]);
        csv.push(skew_csv_row(n, q, &o, &wake));
        csv.push_distribution(format!("skew, {n} nodes"), o.switches.skews.clone());
        csv.push_distribution(
            format!("skew baseline: waking {n} processes at once"),
            wake.values().to_vec(),
        );
        eprintln!("  measured skew on {n} nodes");
    }
    Ok(table)
}

/// One CSV row of the skew measurement.
fn skew_csv_row(n: u32, q: f64, o: &Overhead, wake: &Samples) -> Vec<String> {
    let mut row: Vec<String> = vec![
        "skew".into(),
        n.to_string(),
        "2".into(),
        q.to_string(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    ];
    row.extend(o.csv_cells());
    row.extend([
        format!("{:.9}", wake.median()),
        format!("{:.9}", wake.quantile(0.99)),
    ]);
    row
}

pub fn run(args: &GangArgs, csv: &mut Csv) -> Result<Vec<Table>> {
    let mut tables = Vec::new();
    if args.parts.contains(&Part::Tasks) {
        tables.push(tasks::tasks_table(&tasks::TasksArgs {
            nodes: args.tasks_nodes,
            quanta_ms: args.tasks_quanta_ms.clone(),
            cpu_s: args.tasks_cpu_s,
            rt_priorities: vec![args.daemon_rt_priority.max(1), 0],
            loss_percent: args.tasks_loss_percent,
            leases: args.tasks_leases.clone(),
        })?);
    }
    let sweeps = args.parts.contains(&Part::Quantum) || args.parts.contains(&Part::Mpl);
    if sweeps {
        let work = tempfile::Builder::new()
            .prefix("storm-bench-gang-")
            .tempdir()?;
        let binary = Spmd::build(work.path())?;
        let program = Spmd::calibrate(binary, args.nodes, args.sync_ms, args.alone_s)?;
        eprintln!(
            "  SPMD program: {} iterations of {} loops (about {} ms of CPU each)",
            program.iterations, program.loops, args.sync_ms
        );
        if args.parts.contains(&Part::Quantum) {
            tables.push(quantum_sweep(args, &program, csv)?);
        }
        if args.parts.contains(&Part::Mpl) {
            tables.push(mpl_sweep(args, &program, csv)?);
        }
    }
    if args.parts.contains(&Part::Skew) {
        tables.push(skew_sweep(args, csv)?);
    }
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overhead() -> Overhead {
        Overhead {
            switches: SwitchSummary {
                switches: 8,
                heartbeats: 2,
                heartbeat_period: Some(1e-3),
                skews: vec![1e-4, 2e-4],
                receipt_skews: vec![1e-4, 1e-4],
                handling: vec![5e-5; 8],
            },
            nm_cpu: 4e-4,
            mm_cpu: 1e-4,
            wall: 2e-3,
            nodes: 4,
        }
    }

    #[test]
    fn every_csv_row_has_one_cell_per_header_column() {
        let run = GangRun {
            mpl: 2,
            quantum_ms: 1.0,
            bare: 1.0,
            alone: 1.1,
            together: 2.4,
            overhead: overhead(),
        };
        let wake = Samples::from_secs(vec![1e-5, 2e-5]);
        for row in [
            gang_csv_row(&run, "quantum"),
            skew_csv_row(4, 1.0, &overhead(), &wake),
        ] {
            assert_eq!(row.len(), CSV_HEADER.len(), "{row:?}");
        }
        // 8 switches over 4 nodes: 0.4 ms of NM CPU is 50 us per switch.
        assert_eq!(overhead().nm_per_switch(), 5e-5);
    }
}
