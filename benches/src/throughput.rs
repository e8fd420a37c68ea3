//! `storm-bench throughput`: how many single-task jobs a cluster runs per second, and how long
//! each waits from submission to its result.
//!
//! Many clients (threads of this process, each a control connection per job as
//! `storm-submit` makes) submit single-task `/bin/true` jobs onto an embedded cluster and
//! follow each to its end. It reports jobs/s and the p50/p99 submit-to-exit latency, and the
//! median of the MM's own phases (`--timing`), so that the time can be placed.
//!
//! Under a replicated MM (`--managers 3`) the clients follow the group as `storm-submit` does:
//! a client that loses its leader (a failover: on a loaded host a leader can lose its lease)
//! finds the next one and sends its submission again with its token, or follows its job there.
//! The leader changes are counted and reported beside the rate, which includes their cost.
//!
//! The baseline, measured in the same run with no cluster running (half before, half after):
//! the same number of threads each fork/exec and wait for `/bin/true` in a loop, the same
//! number of times. That is what running the jobs costs on this host with no resource manager.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::submit;
use storm_cluster::control::{Client, Delivery, JobRequest, Timing};
use storm_cluster::tasks::TaskRequest;

use crate::mm_metrics::{CountSum, MmMetrics};
use crate::report::{Csv, Table};
use crate::stats::{Samples, fmt_time};

pub struct ThroughputArgs {
    pub jobs: usize,
    pub clients: usize,
    pub nodes: u32,
    pub cpus: u32,
    pub timeslice_ms: f64,
    /// How the program reaches the nodes: copied with each job, checked in place, or run
    /// from its path with no check.
    pub delivery: Delivery,
    pub backend: storm_cluster::config::BackendKind,
    pub provider: Option<String>,
    /// MM replicas: with more than one, the same jobs also run under a single MM in the same
    /// run, and what replication costs per job is reported beside it.
    pub managers: u32,
    /// The group's `[replication]` settings.
    pub replication: storm_cluster::config::ReplicationSection,
}

pub const CSV_HEADER: &[&str] = &[
    "what",
    "jobs",
    "clients",
    "seconds",
    "jobs_per_s",
    "p50_s",
    "p99_s",
];

/// The program every job runs.
const PROGRAM: &str = "/bin/true";

/// What one pass of `jobs` runs from `clients` threads gave.
struct Pass {
    wall: f64,
    latency: Samples,
    timings: Vec<Timing>,
    /// Clients that had to find the leader again (a failover during the pass).
    failovers: u64,
}

/// Runs `jobs` calls of `one` spread over `clients` threads; each returns its own latency.
fn spread(
    jobs: usize,
    clients: usize,
    one: impl Fn() -> Result<(Duration, Option<Timing>)> + Sync,
) -> Result<Pass> {
    let latencies = Mutex::new(Vec::with_capacity(jobs));
    let timings = Mutex::new(Vec::new());
    let start = Instant::now();
    thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..clients)
            .map(|c| {
                let share = jobs / clients + usize::from(c < jobs % clients);
                let (one, latencies, timings) = (&one, &latencies, &timings);
                s.spawn(move || -> Result<()> {
                    for _ in 0..share {
                        let (took, timing) = one()?;
                        latencies
                            .lock()
                            .expect("no panics")
                            .push(took.as_secs_f64());
                        if let Some(t) = timing {
                            timings.lock().expect("no panics").push(t);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a client thread panicked")?;
        }
        Ok(())
    })?;
    Ok(Pass {
        wall: start.elapsed().as_secs_f64(),
        latency: Samples::from_secs(latencies.into_inner().expect("no panics")),
        timings: timings.into_inner().expect("no panics"),
        failovers: 0,
    })
}

fn fork_exec_once() -> Result<(Duration, Option<Timing>)> {
    let start = Instant::now();
    let status = std::process::Command::new(PROGRAM).status()?;
    if !status.success() {
        bail!("{PROGRAM} failed: {status}");
    }
    Ok((start.elapsed(), None))
}

/// A client's view of the MM: every replica's socket, and how often it had to find the
/// leader again.
struct Group<'a> {
    sockets: &'a [PathBuf],
    failovers: &'a AtomicU64,
}

/// Follows a job across leader changes, as storm-submit does.
struct Follow<'a>(&'a Group<'a>);

impl Follow<'_> {
    fn again(&mut self, why: &str) -> Option<Client> {
        self.0.failovers.fetch_add(1, Ordering::Relaxed);
        match storm_cli::connect_any(self.0.sockets) {
            Ok((c, _)) => Some(c),
            Err(e) => {
                eprintln!("storm-bench: a client lost the MM ({why}), and {e}");
                None
            }
        }
    }
}

impl submit::Progress for Follow<'_> {
    fn resubmit(&mut self, why: &str) -> Option<Client> {
        self.again(why)
    }
    fn reconnect(&mut self, _job: storm_cluster::messages::JobId, why: &str) -> Option<Client> {
        self.again(why)
    }
}

/// A token no other submission of this run has, so that one sent again after a lost answer is
/// recognised.
fn token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    u64::from(std::process::id()) << 32 | NEXT.fetch_add(1, Ordering::Relaxed)
}

fn submit_once(group: &Group, delivery: Delivery) -> Result<(Duration, Option<Timing>)> {
    let req = JobRequest {
        tasks: TaskRequest {
            ntasks: Some(1),
            ..TaskRequest::default()
        },
        delivery,
        token: Some(token()),
        ..JobRequest::new("true", PROGRAM, std::env::temp_dir())
    };
    let program = if delivery.carries_program() {
        Some(std::fs::File::open(PROGRAM)?)
    } else {
        None
    };
    let start = Instant::now();
    let (client, _) = storm_cli::connect_any(group.sockets).map_err(anyhow::Error::msg)?;
    let (outcome, _, _) = submit::run_job(client, req, program.as_ref(), &mut Follow(group))
        .map_err(anyhow::Error::msg)?;
    let took = start.elapsed();
    if outcome.exit_code() != 0 {
        bail!("{PROGRAM} failed under storm: {outcome:?}");
    }
    Ok((took, Some(outcome.timing)))
}

/// A pass as a CSV row (see [`CSV_HEADER`]).
fn csv_row(what: &str, p: &Pass, clients: usize) -> Vec<String> {
    vec![
        what.into(),
        p.latency.len().to_string(),
        clients.to_string(),
        format!("{:.6}", p.wall),
        format!("{:.1}", p.latency.len() as f64 / p.wall),
        format!("{:.6}", p.latency.quantile(0.5)),
        format!("{:.6}", p.latency.quantile(0.99)),
    ]
}

/// The phases of each pass go to `records` for the regression check.
pub fn run(
    args: &ThroughputArgs,
    csv: &mut Csv,
    records: &mut Vec<crate::regress::Record>,
) -> Result<Vec<Table>> {
    if args.jobs == 0 || args.clients == 0 || args.nodes == 0 || args.cpus == 0 {
        bail!("--jobs, --clients, --nodes and --cpus must be positive");
    }
    let half = args.jobs.div_ceil(2);
    let mut floor = spread(half, args.clients, fork_exec_once)?;
    let (storm, during, MmCpu { all: mm_cpu, .. }, idle) = storm_pass(args, 1)?;
    let group = if args.managers > 1 {
        Some(storm_pass(args, args.managers)?).map(|(p, l, c, _)| (p, l, c))
    } else {
        None
    };
    thread::sleep(Duration::from_millis(100));
    let after = spread(args.jobs - half, args.clients, fork_exec_once)?;
    floor.wall += after.wall;
    floor.latency = Samples::from_secs(
        floor
            .latency
            .values()
            .iter()
            .chain(after.latency.values())
            .copied()
            .collect(),
    );

    let rate = |p: &Pass| p.latency.len() as f64 / p.wall;
    let mut table = Table::new(
        format!(
            "Throughput: {} single-task {PROGRAM} jobs{} from {} concurrent clients onto {} nodes of {} CPUs \
             (embedded {:?} cluster, timeslice {} ms); floor: the same clients fork/exec {PROGRAM} \
             as often, same run",
            args.jobs,
            match args.delivery {
                Delivery::Broadcast => " (program sent with each)",
                Delivery::Auto => " (checked in place on the nodes before each)",
                Delivery::InPlace => "",
            },
            args.clients,
            args.nodes,
            args.cpus,
            args.backend,
            args.timeslice_ms,
        ),
        &["", "jobs/s", "p50 submit to exit", "p99 submit to exit"],
    );
    for (what, p) in [("storm", &storm), ("fork/exec", &floor)] {
        table.push(vec![
            what.into(),
            format!("{:.0}", rate(p)),
            fmt_time(p.latency.quantile(0.5)),
            fmt_time(p.latency.quantile(0.99)),
        ]);
        csv.push(csv_row(what, p, args.clients));
    }
    table.push(vec![
        "storm / fork/exec".into(),
        format!("{:.3}", rate(&storm) / rate(&floor)),
        format!(
            "{:.1}",
            storm.latency.quantile(0.5) / floor.latency.quantile(0.5)
        ),
        format!(
            "{:.1}",
            storm.latency.quantile(0.99) / floor.latency.quantile(0.99)
        ),
    ]);
    let mut phases = crate::phases::table(
        format!(
            "Where a storm job's time went, phase by phase (median over the jobs): {}",
            crate::phases::LEGEND
        ),
        "MM",
    );
    let mut passes = vec![("single".to_string(), &storm)];
    if let Some((g, ..)) = &group {
        passes.push((format!("{} replicas", args.managers), g));
    }
    for (what, p) in passes {
        phases.push(crate::phases::row(
            what.clone(),
            &p.timings,
            p.latency.quantile(0.5),
        ));
        records.push(crate::phases::record(
            format!(
                "throughput-{}jobs-{}clients-{}x{}-{:?}-{:?}-{}",
                args.jobs, args.clients, args.nodes, args.cpus, args.backend, args.delivery, what
            ),
            "fork/exec",
            floor.latency.quantile(0.5),
            &p.timings,
            p.latency.quantile(0.5),
        ));
    }
    let mut mm = Table::new(
        "The MM's loop meanwhile (its metrics: timeslices and journal commits, count and mean)",
        &["timeslices", "mean timeslice", "commits", "mean commit"],
    );
    mm.push(vec![
        during.ticks.0.to_string(),
        fmt_time(during.ticks.mean()),
        during.commits.0.to_string(),
        fmt_time(during.commits.mean()),
    ]);
    let mut tables = vec![
        table,
        phases,
        mm,
        crate::idle::table(&idle, IDLE_WINDOW, args.timeslice_ms),
    ];
    if let Some((g, g_loop, MmCpu { all: g_cpu, leader })) = group {
        let mut cost = Table::new(
            format!(
                "What replication costs: the same jobs under a group of {} MM replicas (Raft, \
                 a commit waits for a majority; replica heartbeat {} ms, election timeout {} \
                 ms) beside a single MM, same run; MM CPU is every MM process's user and \
                 system time over the jobs, leader CPU the leader's alone (what bounds the \
                 rate where each replica has a host of its own){}",
                args.managers,
                args.replication.heartbeat_ms,
                args.replication.election_timeout_ms,
                if args.replication.unsafe_no_log_sync {
                    "; the replicas do NOT sync their Raft logs (--no-log-sync: unsafe, for \
                     measuring what the sync costs)"
                } else {
                    ""
                }
            ),
            &[
                "MM",
                "jobs/s",
                "p50 submit to exit",
                "p99 submit to exit",
                "MM CPU per job",
                "leader CPU per job",
                "mean commit",
                "clients that lost the leader",
            ],
        );
        let per_job = |cpu: f64, p: &Pass| cpu / p.latency.len().max(1) as f64;
        for (what, p, cpu, lead, l) in [
            ("single".to_string(), &storm, mm_cpu, mm_cpu, &during),
            (
                format!("{} replicas", args.managers),
                &g,
                g_cpu,
                leader,
                &g_loop,
            ),
        ] {
            cost.push(vec![
                what.clone(),
                format!("{:.0}", rate(p)),
                fmt_time(p.latency.quantile(0.5)),
                fmt_time(p.latency.quantile(0.99)),
                fmt_time(per_job(cpu, p)),
                fmt_time(per_job(lead, p)),
                fmt_time(l.commits.mean()),
                p.failovers.to_string(),
            ]);
            csv.push(csv_row(&format!("mm {what}"), p, args.clients));
        }
        cost.push(vec![
            "replicas / single".into(),
            format!("{:.3}", rate(&g) / rate(&storm)),
            format!(
                "{:.2}",
                g.latency.quantile(0.5) / storm.latency.quantile(0.5)
            ),
            format!(
                "{:.2}",
                g.latency.quantile(0.99) / storm.latency.quantile(0.99)
            ),
            format!("{:.2}", per_job(g_cpu, &g) / per_job(mm_cpu, &storm)),
            format!("{:.2}", per_job(leader, &g) / per_job(mm_cpu, &storm)),
            format!("{:.2}", g_loop.commits.mean() / during.commits.mean()),
            String::new(),
        ]);
        tables.push(cost);
    }
    Ok(tables)
}

/// The CPU time (seconds) the MM processes used over a pass: all of them, and the leader.
struct MmCpu {
    all: f64,
    leader: f64,
}

/// How long the cluster is watched idle, after its jobs.
const IDLE_WINDOW: Duration = Duration::from_secs(3);

/// One pass of the jobs on a fresh embedded cluster with `managers` MM replicas: the pass,
/// the MM's loop meanwhile (the leader's), the CPU time of the MM processes, and then each
/// daemon's cost idle ([`crate::idle`]).
fn storm_pass(
    args: &ThroughputArgs,
    managers: u32,
) -> Result<(Pass, MmLoop, MmCpu, crate::idle::IdleCost)> {
    let cluster = LocalCluster::start(&LocalOptions {
        cpus: Some(args.cpus),
        timeslice_ms: args.timeslice_ms,
        backend: args.backend,
        provider: args.provider.clone(),
        managers,
        replication: args.replication.clone(),
        keep: std::env::var_os("KEEP").is_some(),
        log_filter: std::env::var("DAEMON_LOG").ok(),
        ..LocalOptions::new(args.nodes)
    })?;
    let socket = cluster.leader_socket();
    let sockets = cluster.config.control_sockets();
    let warm_up = AtomicU64::new(0);
    let group = Group {
        sockets: &sockets,
        failovers: &warm_up,
    };
    // Warm-up: connections, the page cache, the nodes' first heartbeats.
    spread(args.clients, args.clients, || {
        submit_once(&group, args.delivery)
    })?;
    let mms: Vec<u32> = cluster
        .daemon_pids()
        .into_iter()
        .filter(|(n, _)| n.starts_with("storm-mm"))
        .map(|(_, p)| p)
        .collect();
    // A single MM is named `storm-mm`; a replica `storm-mm NAME`.
    let leader_name = cluster
        .leader()
        .map_or_else(|| "storm-mm".to_string(), |l| format!("storm-mm {l}"));
    let leader: Vec<u32> = cluster
        .daemon_pids()
        .into_iter()
        .filter(|(n, _)| *n == leader_name || (managers == 1 && n.starts_with("storm-mm")))
        .map(|(_, p)| p)
        .collect();
    let leader_before = cpu_seconds(&leader);
    let before = mm_loop(&socket)?;
    let cpu_before = cpu_seconds(&mms);
    let failovers = AtomicU64::new(0);
    let group = Group {
        sockets: &sockets,
        failovers: &failovers,
    };
    let mut pass = spread(args.jobs, args.clients, || {
        submit_once(&group, args.delivery)
    })?;
    pass.failovers = failovers.into_inner();
    let cpu = MmCpu {
        all: cpu_seconds(&mms) - cpu_before,
        leader: cpu_seconds(&leader) - leader_before,
    };
    // After a leader change the loop's figures are the new leader's since it took over.
    let now = cluster.leader_socket();
    let during = if now == socket {
        mm_loop(&socket)?.since(&before)
    } else {
        mm_loop(&now)?
    };
    // Idle once the jobs' ends have settled (their nodes told to forget them).
    thread::sleep(Duration::from_millis(500));
    let idle = crate::idle::measure(&cluster, IDLE_WINDOW);
    cluster.shutdown()?;
    Ok((pass, during, cpu, idle))
}

/// CPU time (user and system) the processes `pids` used so far, in seconds.
fn cpu_seconds(pids: &[u32]) -> f64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100)
        .max(1) as f64;
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .map(|stat| {
            // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (ticks(11) + ticks(12)) / hz
        })
        .sum()
}

/// What the MM's metrics say of its loop: its timeslices and its journal commits.
#[derive(Default)]
struct MmLoop {
    ticks: CountSum,
    commits: CountSum,
}

impl MmLoop {
    fn since(&self, earlier: &MmLoop) -> MmLoop {
        MmLoop {
            ticks: self.ticks.since(earlier.ticks),
            commits: self.commits.since(earlier.commits),
        }
    }
}

fn mm_loop(socket: &std::path::Path) -> Result<MmLoop> {
    let m = MmMetrics::fetch(socket)?;
    Ok(MmLoop {
        ticks: m.histogram("storm_main_loop_tick_seconds"),
        commits: m.histogram("storm_journal_commit_seconds"),
    })
}
