//! `storm-bench scale`: the real MM core driving simulated clusters of growing size
//! (storm-sim, virtual time, one process), with the growth of each figure per 8× nodes.
//!
//! For each node count it measures:
//!
//! * the MM's own processor time per timeslice (per heartbeat), idle and while a
//!   full-machine job runs, and in all for that job from submission to its outcome (the
//!   network's part of the primitives, a NIC's work on a real machine, is left out:
//!   `SimCpu::mm_logic`); beside it the same run's baseline, one pass that reads a word per
//!   node, and the ratio (how many such passes the MM's timeslice is worth);
//! * the global memory of the MM and of one NM: what the layout reserves and what was touched;
//! * placing and launching a full-machine job, in virtual time (timeslices) from submission to
//!   the job's start and to its outcome;
//! * detecting a stopped node (virtual time from its last heartbeat to DOWN);
//! * draining 10,000 queued single-node jobs: virtual time, and the MM's processor time;
//! * the critical path of a 12 MB full-machine launch at the default 1 ms timeslice: the
//!   program transfer takes the launch model's time (`storm_sim::TransferModel`), the rest is
//!   the real MM's rounds (acknowledgement check, launch, termination), in virtual time;
//! * node monitoring: every node's sample record put into the MM's memory where the NMs' own
//!   transfers put it, then gathered as `storm nodes` gathers it (the MM reads and judges
//!   every record) and queried as `storm nodes --where 'cpu>0.5'` filters: the wall time of
//!   each (best of five), beside the same scan baseline.
//!
//! Virtual times count the protocol's rounds and do not depend on the machine; processor
//! times do, hence the baseline.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use storm_cluster::control::Reply;
use storm_sim::{Sim, SimJob, SimOptions, TransferModel};

use crate::report::{Csv, Table};
use storm_cluster::control::NodeState;

pub const CSV_HEADER: &[&str] = &[
    "nodes",
    "mm_idle_us",
    "mm_running_us",
    "mm_job_ms",
    "scan_ns",
    "mm_reserved_bytes",
    "mm_touched_bytes",
    "nm_reserved_bytes",
    "nm_touched_bytes",
    "launch_virtual_ms",
    "job_virtual_ms",
    "detect_virtual_ms",
    "drain_jobs",
    "drain_virtual_ms",
    "drain_mm_cpu_ms",
    "launch12_transfer_model_ms",
    "launch12_send_ms",
    "launch12_total_ms",
    "gather_ms",
    "query_ms",
    "wall_s",
];

pub struct ScaleArgs {
    pub nodes: Vec<u32>,
    pub drain_jobs: usize,
    pub idle_slices: u64,
}

/// One node count's figures.
struct Point {
    nodes: u32,
    mm_idle: Duration,
    mm_running: Duration,
    mm_job: Duration,
    scan: Duration,
    mm_mem: (usize, usize),
    nm_mem: (usize, usize),
    launch: Duration,
    job: Duration,
    detect: Duration,
    drain: Duration,
    drain_cpu: Duration,
    launch12: Launch12,
    monitoring: Monitoring,
    wall: Duration,
}

/// Gathering and querying every node's record.
struct Monitoring {
    /// The MM reading and judging every node's sample, usage and inventory (`storm nodes`).
    gather: Duration,
    /// `--where cpu>0.5` over what was gathered.
    query: Duration,
}

/// Puts a sample and a usage record (one job) into every node's slots in the MM's memory (a
/// quarter of the nodes busy), then times a gather and a query, best of five.
fn monitoring(s: &Sim) -> Result<Monitoring> {
    use storm_cluster::clock::Clock;
    use storm_cluster::sample::{NodeSample, Source};
    use storm_cluster::usage::{JobFigures, NodeUsage};
    let nodes = s.config().node_count() as usize;
    let now_ms = s.mm().env().clock.unix_ms();
    let (prims, rm) = s.mm().fabric();
    for n in 0..nodes {
        let sample = NodeSample {
            seq: 1,
            taken_ms: now_ms,
            period_ms: 1000,
            source: Source::Host,
            cpus: 32,
            cpu_util: if n % 4 == 0 { 0.9 } else { 0.1 },
            load: [1.0, 1.0, 1.0],
            mem_total: 256 << 30,
            mem_avail: 200 << 30,
            spool_free: 100 << 30,
            state_free: 100 << 30,
            ..NodeSample::default()
        };
        prims
            .memory()
            .write(rm.sample_offset(n), &sample.encode())
            .map_err(|e| anyhow::anyhow!("writing node {n}'s sample: {e}"))?;
        // One job per node, as a cluster of whole-node jobs has.
        let usage = NodeUsage {
            seq: 1,
            taken_ms: now_ms,
            jobs_total: 1,
            jobs: vec![JobFigures {
                job: 1 + n as u64,
                cpu_us: 1_000_000,
                cpus_busy: sample.cpu_util * 32.0,
                mem: 8 << 30,
                mem_peak: 9 << 30,
            }],
            fabric: None,
        };
        prims
            .memory()
            .write(rm.usage_record_offset(n), &usage.encode())
            .map_err(|e| anyhow::anyhow!("writing node {n}'s usage: {e}"))?;
    }
    let filter =
        storm_cli::node_filter::NodeFilter::parse("cpu>0.5").map_err(anyhow::Error::msg)?;
    let (mut gather, mut query) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        let t = Instant::now();
        let infos = std::hint::black_box(s.mm().nodes_view());
        gather = gather.min(t.elapsed());
        let t = Instant::now();
        let busy = infos.iter().filter(|n| filter.matches(n)).count();
        query = query.min(t.elapsed());
        if infos
            .iter()
            .any(|n| n.fresh_usage().is_none_or(|u| u.jobs.len() != 1))
        {
            bail!("the gather did not read every node's usage record");
        }
        if busy != nodes.div_ceil(4) {
            bail!("--where cpu>0.5 found {busy} of {nodes} nodes, not the quarter that is busy");
        }
    }
    Ok(Monitoring { gather, query })
}

/// A 12 MB program launched on every node, with 1 ms timeslices (virtual time).
struct Launch12 {
    model: Duration,
    send: Duration,
    total: Duration,
}

const PROGRAM_BYTES: u64 = 12_000_000;

fn launch12(nodes: u32) -> Result<Launch12> {
    let mut s = Sim::new(SimOptions {
        nodes,
        timeslice: Duration::from_millis(1),
        ..SimOptions::default()
    })?;
    s.run_until_up(Duration::from_secs(10))?;
    let model = TransferModel::default().time(nodes, PROGRAM_BYTES);
    let job = s
        .submit(&SimJob::new(nodes, Duration::ZERO).with_program(PROGRAM_BYTES))
        .map_err(anyhow::Error::msg)?;
    if !s.run_until(Duration::from_secs(30), |s| s.outcome(job).is_some()) {
        bail!("the 12 MB launch on {nodes} nodes did not end");
    }
    let o = s.outcome(job).expect("ended");
    if o.exit_code() != 0 {
        bail!("the 12 MB launch on {nodes} nodes failed: {o:?}");
    }
    Ok(Launch12 {
        model,
        send: Duration::from_micros(o.timing.send_us),
        total: Duration::from_micros(o.timing.total_us),
    })
}

/// The baseline: one pass reading a word per node, the floor of any O(N) bookkeeping.
fn scan(nodes: u32) -> Duration {
    let words: Vec<u64> = (0..nodes as u64).collect();
    let mut best = Duration::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        let sum: u64 = words.iter().map(|w| std::hint::black_box(*w)).sum();
        std::hint::black_box(sum);
        best = best.min(t.elapsed());
    }
    best
}

/// The full-machine job's work, and the timeslices measured while it runs.
const JOB_WORK: Duration = Duration::from_millis(300);
const RUNNING_SLICES: u32 = 20;

fn per_slice(cpu: Duration, slices: u64) -> Duration {
    cpu / slices.max(1) as u32
}

fn measure(nodes: u32, args: &ScaleArgs) -> Result<Point> {
    let wall = Instant::now();
    let k = 3;
    let mut s = Sim::new(SimOptions {
        nodes,
        missed_heartbeats: k,
        max_jobs: 256,
        ..SimOptions::default()
    })?;
    s.run_until_up(Duration::from_secs(10))?;
    let slice = s.config().timeslice();
    // Idle: nothing but heartbeats.
    let (c0, t0) = (s.cpu(), s.ticks());
    s.run_for(slice * args.idle_slices as u32);
    let mm_idle = per_slice(s.cpu().mm_logic() - c0.mm_logic(), s.ticks() - t0);
    // A job on every node: its whole life, and some timeslices while it runs.
    let c_job = s.cpu();
    let submitted = s.now();
    let job = s
        .submit(&SimJob::new(nodes, JOB_WORK))
        .map_err(anyhow::Error::msg)?;
    if !s.run_until(Duration::from_secs(30), |s| !s.started(job).is_empty()) {
        bail!("the full-machine job on {nodes} nodes did not start");
    }
    s.run_for(slice * 2);
    let (c0, t0) = (s.cpu(), s.ticks());
    s.run_for(slice * RUNNING_SLICES);
    let mm_running = per_slice(s.cpu().mm_logic() - c0.mm_logic(), s.ticks() - t0);
    if s.outcome(job).is_some() {
        bail!("the full-machine job ended before its running timeslices were measured");
    }
    if !s.run_until(Duration::from_secs(30), |s| s.outcome(job).is_some()) {
        bail!("the full-machine job on {nodes} nodes did not end");
    }
    let mm_job = s.cpu().mm_logic() - c_job.mm_logic();
    let launch = s.started(job)[0] - submitted;
    let job_time = s.finished(job).expect("ended").0 - submitted;
    // Memory, after the job touched what a job touches.
    let mm_mem = s.memory(s.config().mm_id());
    let nm_mem = s.memory(0);
    // A stopped node.
    let victim = nodes - 1;
    s.freeze(victim, true);
    let frozen = s.now();
    if !s.run_until(Duration::from_secs(30), |s| {
        s.state(victim).state == NodeState::Down
    }) {
        bail!("a stopped node of {nodes} was not found DOWN");
    }
    let detect = s.now() - frozen;
    s.freeze(victim, false);
    s.run_until_up(Duration::from_secs(30))?;
    // Drain: many single-node jobs, queued at once.
    let c0 = s.cpu();
    let start = s.now();
    let jobs = vec![SimJob::new(1, Duration::from_millis(10)); args.drain_jobs];
    let from = s.replies.len();
    let ids: std::collections::HashSet<_> = s
        .submit_all(&jobs)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .collect();
    let drained = |s: &Sim| {
        s.replies[from..]
            .iter()
            .filter(|(_, r)| matches!(r, Reply::Finished(o) if ids.contains(&o.job)))
            .count()
            == ids.len()
    };
    if !s.run_until(Duration::from_secs(3600), drained) {
        bail!("{} jobs did not drain on {nodes} nodes", args.drain_jobs);
    }
    let monitoring = monitoring(&s)?;
    Ok(Point {
        nodes,
        mm_idle,
        mm_running,
        mm_job,
        scan: scan(nodes),
        mm_mem,
        nm_mem,
        launch,
        job: job_time,
        detect,
        drain: s.now() - start,
        drain_cpu: s.cpu().mm_logic() - c0.mm_logic(),
        launch12: launch12(nodes)?,
        monitoring,
        wall: wall.elapsed(),
    })
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

fn ms_frac(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn mib(b: usize) -> String {
    format!("{:.2}", b as f64 / (1 << 20) as f64)
}

/// `now / before`, for the growth columns.
fn growth(now: f64, before: Option<f64>) -> String {
    match before {
        Some(b) if b > 0.0 => format!("{:.1}x", now / b),
        _ => "-".into(),
    }
}

pub fn run(args: &ScaleArgs, csv: &mut Csv) -> Result<Vec<Table>> {
    let mut cpu = Table::new(
        "MM processor time (its own work; the network's part of the primitives left out): per \
         timeslice idle and while a full-machine job runs, and for that job's whole life; beside \
         one pass over a word per node",
        &[
            "nodes",
            "idle us",
            "x8",
            "running us",
            "x8",
            "job ms",
            "x8",
            "scan ns",
            "idle/scan",
            "running/scan",
        ],
    );
    let mut mem = Table::new(
        "Global memory: reserved by the layout / touched (MiB)",
        &[
            "nodes",
            "MM reserved",
            "MM touched",
            "x8",
            "NM reserved",
            "NM touched",
            "x8",
        ],
    );
    let mut time = Table::new(
        "Virtual time (ms) and the MM's processor time for the RM functions",
        &[
            "nodes",
            "launch",
            "job of 300 ms",
            "detect",
            "drain jobs",
            "drain",
            "drain MM cpu ms",
            "x8",
            "wall s",
        ],
    );
    let mut launch = Table::new(
        "Critical path of a 12 MB launch on every node, 1 ms timeslices (virtual ms): the \
         launch model's transfer, and the real MM's rounds around it (tasks that exit at once; \
         add T_exec)",
        &[
            "nodes",
            "model transfer",
            "program ready",
            "submit to exit",
            "x8",
        ],
    );
    let mut watch = Table::new(
        "Node monitoring: every node's record gathered as `storm nodes` reads them (the MM \
         reads and judges each record in its own memory) and queried as `--where cpu>0.5` \
         (wall ms, best of 5), beside one pass over a word per node; target: a full-cluster \
         query within 10 ms at 16,384 nodes",
        &[
            "nodes",
            "gather ms",
            "x8",
            "query ms",
            "gather+query ms",
            "gather/scan",
        ],
    );
    let mut prev: Option<Point> = None;
    for &nodes in &args.nodes {
        eprintln!("scale: {nodes} nodes");
        let p = measure(nodes, args)?;
        let before = |f: fn(&Point) -> f64| prev.as_ref().map(f);
        cpu.push(vec![
            p.nodes.to_string(),
            us(p.mm_idle),
            growth(p.mm_idle.as_secs_f64(), before(|q| q.mm_idle.as_secs_f64())),
            us(p.mm_running),
            growth(
                p.mm_running.as_secs_f64(),
                before(|q| q.mm_running.as_secs_f64()),
            ),
            ms_frac(p.mm_job),
            growth(p.mm_job.as_secs_f64(), before(|q| q.mm_job.as_secs_f64())),
            format!("{}", p.scan.as_nanos()),
            format!(
                "{:.0}",
                p.mm_idle.as_secs_f64() / p.scan.as_secs_f64().max(1e-9)
            ),
            format!(
                "{:.0}",
                p.mm_running.as_secs_f64() / p.scan.as_secs_f64().max(1e-9)
            ),
        ]);
        mem.push(vec![
            p.nodes.to_string(),
            mib(p.mm_mem.0),
            mib(p.mm_mem.1),
            growth(p.mm_mem.1 as f64, before(|q| q.mm_mem.1 as f64)),
            mib(p.nm_mem.0),
            mib(p.nm_mem.1),
            growth(p.nm_mem.1 as f64, before(|q| q.nm_mem.1 as f64)),
        ]);
        time.push(vec![
            p.nodes.to_string(),
            ms(p.launch),
            ms(p.job),
            ms(p.detect),
            args.drain_jobs.to_string(),
            ms(p.drain),
            ms(p.drain_cpu),
            growth(
                p.drain_cpu.as_secs_f64(),
                before(|q| q.drain_cpu.as_secs_f64()),
            ),
            format!("{:.1}", p.wall.as_secs_f64()),
        ]);
        launch.push(vec![
            p.nodes.to_string(),
            ms_frac(p.launch12.model),
            ms_frac(p.launch12.send),
            ms_frac(p.launch12.total),
            growth(
                p.launch12.total.as_secs_f64(),
                before(|q| q.launch12.total.as_secs_f64()),
            ),
        ]);
        let m = &p.monitoring;
        watch.push(vec![
            p.nodes.to_string(),
            ms_frac(m.gather),
            growth(
                m.gather.as_secs_f64(),
                before(|q| q.monitoring.gather.as_secs_f64()),
            ),
            ms_frac(m.query),
            ms_frac(m.gather + m.query),
            format!(
                "{:.0}",
                m.gather.as_secs_f64() / p.scan.as_secs_f64().max(1e-9)
            ),
        ]);
        csv.push(vec![
            p.nodes.to_string(),
            us(p.mm_idle),
            us(p.mm_running),
            ms_frac(p.mm_job),
            p.scan.as_nanos().to_string(),
            p.mm_mem.0.to_string(),
            p.mm_mem.1.to_string(),
            p.nm_mem.0.to_string(),
            p.nm_mem.1.to_string(),
            ms(p.launch),
            ms(p.job),
            ms(p.detect),
            args.drain_jobs.to_string(),
            ms(p.drain),
            ms(p.drain_cpu),
            ms_frac(p.launch12.model),
            ms_frac(p.launch12.send),
            ms_frac(p.launch12.total),
            ms_frac(p.monitoring.gather),
            ms_frac(p.monitoring.query),
            format!("{:.1}", p.wall.as_secs_f64()),
        ]);
        prev = Some(p);
    }
    Ok(vec![cpu, mem, time, launch, watch])
}
