//! `storm-bench federation`: what sharing capacity between two clusters buys (issue 36).
//!
//! Two embedded clusters on loopback, each with its MM, its nodes and its peer agent
//! (`storm-peer`), joined by a pair key: `fb-home` may borrow from `fb-away`, which lends to
//! it and runs its jobs as `nobody`. A synthetic workload of parallel jobs, a spread of sizes
//! (1 node up to the whole cluster) and run times drawn from a seeded generator, is submitted
//! at once to `fb-home`, which it oversubscribes; `fb-away` is idle.
//!
//! The same workload runs twice on the same two clusters: first every job `--no-flock` (the
//! baseline, no sharing), then every job `--flock` (it runs wherever it can start first). The
//! jobs take their nodes whole (`--exclusive`), under first-come-first-served space sharing,
//! so a job waits until enough nodes are free.
//!
//! Everything is measured from the outside. A job's wait is from the moment its storm-submit
//! was started to the first of its tasks' own clock readings (each task prints `date
//! +%s.%N` as it starts); its end is when its storm-submit returned. The makespan is from the
//! first submission to the last end. Beside them, the floor of each run: the workload's
//! node-seconds over the nodes it may use (one cluster, or both).
//!
//! Then lending, on two clusters of its own ([`crate::lending`]): the time to lend a node and
//! to return it, in heartbeat periods, and launch on borrowed nodes beside home nodes.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cluster::config::{PolicyKind, SchedulerSection};
use storm_cluster::control::{Client, Reply, Request};
use storm_cluster::federation::{FederationSection, PeerEntry, PeerState};

use crate::report::{Csv, Table};
use crate::stats::Samples;

/// The account the jobs run as, at home and (as the peer's `flock_user`) away.
const NOBODY: u32 = 65534;

pub struct FederationArgs {
    /// Nodes of each cluster.
    pub nodes: u32,
    /// Jobs in the workload.
    pub jobs: usize,
    /// Shortest and longest run time of a job, in milliseconds.
    pub min_run_ms: u64,
    pub max_run_ms: u64,
    /// Seed of the workload's generator.
    pub seed: u64,
    /// Rounds of lending (lend, launch, return).
    pub lend_rounds: usize,
}

pub const CSV_HEADER: &[&str] = &[
    "run",
    "jobs",
    "flocked",
    "mean_wait_s",
    "p95_wait_s",
    "makespan_s",
    "floor_s",
];

/// One job of the workload.
#[derive(Debug, Clone, Copy)]
struct Job {
    nodes: u32,
    run_ms: u64,
}

/// The workload: `n` jobs, half of them one node, a quarter half the cluster, a quarter all of
/// it; run times uniform in `[min, max]` ms. A small linear congruential generator keeps it
/// the same for a given seed on every machine.
fn workload(args: &FederationArgs) -> Vec<Job> {
    let mut state = args.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let span = args.max_run_ms.saturating_sub(args.min_run_ms) + 1;
    (0..args.jobs)
        .map(|_| {
            let nodes = match next() % 4 {
                0 | 1 => 1,
                2 => (args.nodes / 2).max(1),
                _ => args.nodes,
            };
            Job {
                nodes,
                run_ms: args.min_run_ms + next() % span,
            }
        })
        .collect()
}

/// What one job's storm-submit saw.
struct Outcome {
    wait_s: f64,
    end_s: f64,
    flocked: bool,
}

/// What one run of the workload measured.
struct Run {
    name: &'static str,
    outcomes: Vec<Outcome>,
    floor_s: f64,
}

impl Run {
    fn waits(&self) -> Samples {
        Samples::from_secs(self.outcomes.iter().map(|o| o.wait_s).collect())
    }
    fn mean_wait(&self) -> f64 {
        let w = self.waits();
        w.values().iter().sum::<f64>() / w.len().max(1) as f64
    }
    fn makespan(&self) -> f64 {
        self.outcomes.iter().map(|o| o.end_s).fold(0.0, f64::max)
    }
    fn flocked(&self) -> usize {
        self.outcomes.iter().filter(|o| o.flocked).count()
    }
}

fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A peer agent, killed when dropped.
pub(crate) struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn start_agent(cluster: &LocalCluster) -> Result<Agent> {
    let config = cluster.root().join("cluster.toml");
    let log = std::fs::File::create(cluster.root().join("storm-peer.log"))?;
    let bin = storm_cli::local::bin_dir()?.join("storm-peer");
    let child = Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Agent(child))
}

fn start_cluster(
    name: &str,
    nodes: u32,
    listen: u16,
    peer: PeerEntry,
    scheduler: &SchedulerSection,
) -> Result<LocalCluster> {
    LocalCluster::start(&LocalOptions {
        name: Some(name.into()),
        scheduler: scheduler.clone(),
        federation: FederationSection {
            listen: Some(format!("127.0.0.1:{listen}").parse()?),
            advertise_ms: 100,
            peer_timeout_ms: 5000,
            ..Default::default()
        },
        peers: vec![peer],
        ..LocalOptions::new(nodes)
    })
    .with_context(|| format!("starting cluster {name}"))
    .and_then(|c| {
        // The jobs are submitted as `nobody`, as on a machine of many users: they must reach
        // the socket. The cluster's key stays private (0600, root's).
        std::fs::set_permissions(
            c.root(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        Ok(c)
    })
}

/// Waits until `home` sees its peer up, offering all its `nodes`.
fn wait_peer_offers(home: &LocalCluster, nodes: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(Reply::Peers { peers, .. }) =
            Client::connect(home.socket()).and_then(|c| c.call(&Request::Peers))
        {
            if let Some(p) = peers.first() {
                if p.state == PeerState::Up
                    && p.offer.as_ref().is_some_and(|o| o.idle_nodes == nodes)
                {
                    return Ok(());
                }
                last = format!("{:?}, offer {:?}, {:?}", p.state, p.offer, p.reason);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the peer cluster did not come up offering {nodes} nodes within 30 s (last: {last})")
}

/// Runs the workload once on `home`, every job with `placement` (`--flock` or `--no-flock`).
fn run_workload(
    home: &LocalCluster,
    jobs: &[Job],
    placement: &str,
    name: &'static str,
    floor_s: f64,
) -> Result<Run> {
    let submit = storm_cli::local::bin_dir()?.join("storm-submit");
    let first = unix_s();
    let mut running = Vec::new();
    for job in jobs {
        let script = format!("date +%s.%N; sleep {}", job.run_ms as f64 / 1000.0);
        let submitted = unix_s();
        let child = Command::new(&submit)
            .arg("--socket")
            .arg(home.socket())
            .args([placement, "--exclusive", "-N"])
            .arg(job.nodes.to_string())
            .args(["-D", "/tmp", "sh", "-c", &script])
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", submit.display()))?;
        // Each job is queued before the next is submitted, so the queue holds them in order.
        std::thread::sleep(Duration::from_millis(20));
        running.push((submitted, child));
    }
    // One thread per job, so each end is seen when it happens.
    let waiters: Vec<_> = running
        .into_iter()
        .map(|(submitted, child)| {
            std::thread::spawn(move || -> Result<Outcome> {
                let out = child.wait_with_output()?;
                let end = unix_s();
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                if !out.status.success() {
                    bail!("a job failed ({}): {stderr}", out.status);
                }
                let started = stdout
                    .lines()
                    .filter_map(|l| l.trim().parse::<f64>().ok())
                    .fold(f64::INFINITY, f64::min);
                if !started.is_finite() {
                    bail!("a job printed no start time: {stdout:?} {stderr}");
                }
                Ok(Outcome {
                    wait_s: (started - submitted).max(0.0),
                    end_s: end - first,
                    flocked: stderr.contains("flocked to peer cluster"),
                })
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for w in waiters {
        outcomes.push(
            w.join()
                .map_err(|_| anyhow::anyhow!("a waiter panicked"))??,
        );
    }
    Ok(Run {
        name,
        outcomes,
        floor_s,
    })
}

/// The two clusters and their agents, joined by a pair key.
struct Federation {
    home: LocalCluster,
    away: LocalCluster,
    agents: Vec<Agent>,
    /// Holds the pair key the agents read.
    _keys: tempfile::TempDir,
}

impl Federation {
    /// `fb-home` may borrow from `fb-away`, which lends to it and runs its jobs as `nobody`;
    /// each of `nodes` nodes, under first-come-first-served space sharing (a job waits for
    /// free nodes instead of time-sharing them). Returns once home sees away offer them all.
    fn start(nodes: u32) -> Result<Self> {
        let keys = tempfile::tempdir()?;
        let pair = keys.path().join("pair.key");
        storm_cluster::key::generate(&pair).context("making the pair key")?;
        let (p_home, p_away) = (free_port()?, free_port()?);
        let entry = |name: &str, port: u16, lend: bool| -> Result<PeerEntry> {
            Ok(PeerEntry {
                name: name.into(),
                address: format!("127.0.0.1:{port}").parse()?,
                key_file: pair.clone(),
                lend,
                borrow: !lend,
                flock_user: Some("nobody".into()),
                same_users: false,
                guest_file: None,
                mm_public_key_file: None,
                priority: 0,
            })
        };
        let scheduler = SchedulerSection {
            policy: PolicyKind::Fcfs,
            mpl: 1,
            ..SchedulerSection::default()
        };
        let home_peer = entry("fb-away", p_away, false)?;
        let home = start_cluster("fb-home", nodes, p_home, home_peer, &scheduler)?;
        let away_peer = entry("fb-home", p_home, true)?;
        let away = start_cluster("fb-away", nodes, p_away, away_peer, &scheduler)?;
        let agents = vec![start_agent(&home)?, start_agent(&away)?];
        wait_peer_offers(&home, nodes)?;
        Ok(Self {
            home,
            away,
            agents,
            _keys: keys,
        })
    }

    fn shutdown(mut self) {
        self.agents.clear();
        let _ = self.home.shutdown();
        let _ = self.away.shutdown();
    }
}

pub fn run(args: &FederationArgs, csv: &mut Csv) -> Result<Vec<Table>> {
    if args.nodes == 0 || args.jobs == 0 || args.min_run_ms > args.max_run_ms {
        bail!("--nodes and --jobs must be at least 1, and --min-run-ms at most --max-run-ms");
    }
    if !nix::unistd::Uid::effective().is_root() {
        bail!("storm-bench federation runs its jobs as nobody, as a user would, which needs root");
    }
    let jobs = workload(args);
    let node_seconds: f64 = jobs
        .iter()
        .map(|j| j.nodes as f64 * j.run_ms as f64 / 1000.0)
        .sum();

    let fed = Federation::start(args.nodes)?;
    let alone = run_workload(
        &fed.home,
        &jobs,
        "--no-flock",
        "no sharing",
        node_seconds / args.nodes as f64,
    )?;
    wait_peer_offers(&fed.home, args.nodes)?;
    let shared = run_workload(
        &fed.home,
        &jobs,
        "--flock",
        "sharing",
        node_seconds / (2 * args.nodes) as f64,
    )?;
    fed.shutdown();

    let mut table = Table::new(
        format!(
            "federation: {} jobs of 1..{} nodes, {:.1}-{:.1} s each ({:.0} node-seconds), \
             submitted at once to a cluster of {} nodes; the peer has {} idle nodes",
            jobs.len(),
            args.nodes,
            args.min_run_ms as f64 / 1000.0,
            args.max_run_ms as f64 / 1000.0,
            node_seconds,
            args.nodes,
            args.nodes
        ),
        &[
            "run",
            "jobs",
            "flocked",
            "mean wait",
            "p95 wait",
            "makespan",
            "floor",
        ],
    );
    for r in [&alone, &shared] {
        let head = [
            r.name.to_string(),
            r.outcomes.len().to_string(),
            r.flocked().to_string(),
        ];
        let secs = [
            r.mean_wait(),
            r.waits().quantile(0.95),
            r.makespan(),
            r.floor_s,
        ];
        let row = |fmt: fn(f64) -> String| head.iter().cloned().chain(secs.map(fmt)).collect();
        table.push(row(|s| format!("{s:.2} s")));
        csv.push(row(|s| format!("{s:.4}")));
    }
    let mut ratios = Table::new(
        "ratios, sharing over no sharing, in the same run (target: mean wait at most 0.5)",
        &["mean wait", "p95 wait", "makespan", "met"],
    );
    let mean_ratio = shared.mean_wait() / alone.mean_wait();
    ratios.push(vec![
        format!("{mean_ratio:.2}"),
        format!(
            "{:.2}",
            shared.waits().quantile(0.95) / alone.waits().quantile(0.95)
        ),
        format!("{:.2}", shared.makespan() / alone.makespan()),
        if mean_ratio <= 0.5 { "yes" } else { "no" }.to_string(),
    ]);
    let m = crate::lending::measure(args.nodes, args.lend_rounds, 5)?;
    let periods = |s: f64| s / m.period.as_secs_f64();
    let mut lending = Table::new(
        format!(
            "lending {} nodes at once, {} rounds, heartbeat period {:.1} ms (targets: lend or \
             return in at most 10 heartbeat periods; launch on borrowed nodes at most 1.2x \
             home, in the same run)",
            args.nodes,
            args.lend_rounds,
            m.period.as_secs_f64() * 1000.0
        ),
        &["measurement", "median", "p95", "in periods / ratio", "met"],
    );
    for (name, s) in [
        ("lend the nodes", &m.lend),
        ("lend right after a return", &m.lend_again),
        ("return them", &m.give_back),
    ] {
        let med = s.median();
        lending.push(vec![
            name.to_string(),
            crate::stats::fmt_time(med),
            crate::stats::fmt_time(s.quantile(0.95)),
            format!("{:.1} periods", periods(med)),
            if periods(med) <= 10.0 { "yes" } else { "no" }.to_string(),
        ]);
    }
    let ratio = m.launch_borrowed.median() / m.launch_home.median();
    for (name, s) in [
        ("launch on home nodes", &m.launch_home),
        ("launch on borrowed nodes", &m.launch_borrowed),
    ] {
        lending.push(vec![
            name.to_string(),
            crate::stats::fmt_time(s.median()),
            crate::stats::fmt_time(s.quantile(0.95)),
            format!("{:.2}x home", s.median() / m.launch_home.median()),
            if std::ptr::eq(s, &m.launch_home) {
                "-".to_string()
            } else if ratio <= 1.2 {
                "yes".to_string()
            } else {
                "no".to_string()
            },
        ]);
    }
    let ap = m.agent_period.as_secs_f64();
    let beyond_home = m.borrow_asked.median() - m.launch_home.median();
    lending.push(vec![
        "launch asking to borrow".to_string(),
        crate::stats::fmt_time(m.borrow_asked.median()),
        crate::stats::fmt_time(m.borrow_asked.quantile(0.95)),
        format!(
            "home + {:.1} agent periods of {:.0} ms",
            beyond_home / ap,
            ap * 1000.0
        ),
        "-".to_string(),
    ]);
    lending.push(vec![
        "given back after the job".to_string(),
        crate::stats::fmt_time(m.given_back.median()),
        crate::stats::fmt_time(m.given_back.quantile(0.95)),
        format!("{:.1} agent periods", m.given_back.median() / ap),
        "-".to_string(),
    ]);
    lending.push(vec![
        "called home under a job (notice)".to_string(),
        crate::stats::fmt_time(m.called_home.median()),
        crate::stats::fmt_time(m.called_home.quantile(0.95)),
        format!("{:.1} agent periods", m.called_home.median() / ap),
        "-".to_string(),
    ]);
    Ok(vec![table, ratios, lending])
}
