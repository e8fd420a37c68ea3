//! `storm-bench faults`: how fast storm notices a failed node and recovers.
//!
//! * detection: an embedded cluster (MM and N NMs as processes on loopback); in each trial one
//!   NM is killed with SIGKILL and the MM's node table is polled until it says DOWN. The
//!   latency is reported in milliseconds and in heartbeat intervals (the timeslice). Then the
//!   NM is started again and the time until the node is back up (re-registered and welcomed)
//!   is measured. Baseline, same run: how long the kernel takes to tell a client that nobody
//!   listens on a loopback port (a refused connect), the quickest notice of a dead process.
//!   The same for a frozen NM (SIGSTOP, as a swapping host or a hung file system would do):
//!   the time until DOWN, then SIGCONT and the time until it is idle again.
//! * heartbeat period: an embedded cluster whose NMs log every heartbeat they take; the gaps
//!   between heartbeats at the healthy nodes while one NM is frozen (p50, p99, max), against
//!   the same gaps with no node frozen, same run.
//! * heal: tcp nodes in this process, a binary tree over N nodes; an interior node (node 1,
//!   parent of a subtree) is shut down as a crash would, and the time is taken from then until
//!   an XFER-AND-SIGNAL to the remaining nodes has completed: the failed transfer that names
//!   the node, plus one on the tree rebuilt without it. Baseline, same run: one transfer of the
//!   same 8 bytes on the healthy tree.
//! * MM restart: the MM of an embedded cluster, with finished jobs in its journal, is killed
//!   with SIGKILL and started again; the time is taken from the start until the control
//!   socket answers (journal read, ready for requests) and until every node is idle again
//!   (every NM re-registered and welcomed: the cluster is ready). Then the same with one running
//!   job on every node (`sleep`, each with its storm-submit attached): until every job is
//!   re-adopted (running again, not recovering) and its node busy. Baseline, same run: a
//!   fork/exec of `/bin/true`.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cluster::control::{Client, Reply, Request};
use storm_primitives::conformance::test_layout;
use storm_primitives::tcp::{TcpConfig, TcpNode};
use storm_primitives::{NodeSet, PrimError, Primitives, Wait};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::launch::Quiet;
use crate::report::{Csv, Table};
use crate::stats::{Samples, fmt_time};
use storm_cluster::control::{JobState, NodeState};

pub struct FaultsArgs {
    pub nodes: u32,
    pub trials: usize,
    pub timeslice_ms: f64,
    pub heal_nodes: Vec<u32>,
    /// MM replicas: with more than one, the leader's failover is measured (and the single
    /// MM's restart beside it, same run) instead of the node faults.
    pub managers: u32,
    /// The replicas' Raft heartbeat and election timeout (milliseconds).
    pub replication: storm_cluster::config::ReplicationSection,
    /// Submitters whose jobs are under way when each leader is killed (`--submitters`).
    pub submitters: usize,
    /// Jobs for what replication costs per job, beside a single MM (`--cost-jobs`; 0: none).
    pub cost_jobs: usize,
    /// The failover on the namespace testbed instead of an embedded cluster (`--testbed`).
    pub testbed: bool,
}

pub const CSV_HEADER: &[&str] = &[
    "measure",
    "nodes",
    "trials",
    "median_s",
    "p90_s",
    "p99_s",
    "max_s",
    "heartbeats_median",
    "baseline_s",
    "ratio",
];

pub fn run(args: &FaultsArgs, csv: &mut Csv) -> Result<Vec<Table>> {
    if args.managers > 1 {
        let mut tables = vec![crate::failover::run(args, csv)?, mm_restart(args, csv)?];
        if args.cost_jobs > 0 {
            tables.extend(replication_cost(args)?);
        }
        return Ok(tables);
    }
    Ok(vec![
        detection(args, csv)?,
        heartbeat_period(args, csv)?,
        heal(args, csv)?,
        mm_restart(args, csv)?,
    ])
}

/// What replication costs per job, the third target beside the failover: the
/// throughput bench's passes (16 clients, 4 nodes of 2 CPUs, `/bin/true` in place) under a
/// single MM and under the group, same run, and its table of the two.
fn replication_cost(args: &FaultsArgs) -> Result<Option<Table>> {
    let cost = crate::throughput::ThroughputArgs {
        jobs: args.cost_jobs,
        clients: 16,
        nodes: 4,
        cpus: 2,
        timeslice_ms: args.timeslice_ms,
        delivery: storm_cluster::control::Delivery::InPlace,
        backend: storm_cluster::config::BackendKind::Tcp,
        provider: None,
        managers: args.managers,
        replication: args.replication.clone(),
    };
    // Its own rows (jobs/s) do not fit this bench's CSV of times.
    let mut rows = Csv::new(crate::throughput::CSV_HEADER);
    // Nor do its phase records belong to the regression check of `storm-bench throughput`.
    Ok(crate::throughput::run(&cost, &mut rows, &mut Vec::new())?.pop())
}

/// The MM's state for `node`.
fn node_state(client: &Client, node: u32) -> Result<NodeState> {
    match client.call(&Request::Nodes).map_err(anyhow::Error::msg)? {
        Reply::Nodes(n) => n
            .get(node as usize)
            .map(|n| n.state)
            .context("node missing from the MM's table"),
        other => bail!("unexpected reply {other:?}"),
    }
}

fn wait_state(
    socket: &std::path::Path,
    node: u32,
    want: &[NodeState],
    limit: Duration,
) -> Result<()> {
    let client = Client::connect(socket).map_err(anyhow::Error::msg)?;
    let start = Instant::now();
    loop {
        if want.contains(&node_state(&client, node)?) {
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!("node {node} did not become {want:?} within {limit:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The pid of node `node`'s NM.
fn nm_pid(cluster: &LocalCluster, node: u32) -> Result<Pid> {
    let name = format!("storm-nm node{node}");
    cluster
        .daemon_pids()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, pid)| Pid::from_raw(pid as i32))
        .with_context(|| format!("no {name} in the cluster"))
}

/// The gaps between the heartbeats node `node` took between `from` and `to` (CLOCK_MONOTONIC
/// ns), read from its heartbeat log, in seconds.
fn heartbeat_gaps(root: &std::path::Path, node: u32, from: u128, to: u128) -> Result<Vec<f64>> {
    let times: Vec<u128> =
        storm_cli::diagnostics::heartbeat_times(&root.join(format!("node{node}")))?
            .into_iter()
            .filter(|t| (from..to).contains(t))
            .collect();
    Ok(times
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 / 1e9)
        .collect())
}

/// How long each window of the heartbeat-period measurement lasts.
const PERIOD_WINDOW: Duration = Duration::from_secs(3);

/// The heartbeat period the healthy nodes see while one NM is frozen, against the period with
/// none frozen, same run.
fn heartbeat_period(args: &FaultsArgs, csv: &mut Csv) -> Result<Table> {
    if args.nodes < 2 {
        bail!("the heartbeat period needs at least 2 nodes");
    }
    let mut opts = LocalOptions::new(args.nodes);
    opts.timeslice_ms = args.timeslice_ms;
    opts.scheduler.heartbeat_log = true;
    let cluster = LocalCluster::start(&opts)?;
    let socket = cluster.socket().to_path_buf();
    let root = cluster.root().to_path_buf();
    let frozen = args.nodes - 1;
    let healthy = 0..frozen;
    let (mut calm, mut troubled) = (Vec::new(), Vec::new());
    for _ in 0..args.trials.min(3) {
        let from = storm_cluster::daemon::monotonic_ns();
        std::thread::sleep(PERIOD_WINDOW);
        let to = storm_cluster::daemon::monotonic_ns();
        for n in healthy.clone() {
            calm.extend(heartbeat_gaps(&root, n, from, to)?);
        }
        let pid = nm_pid(&cluster, frozen)?;
        let from = storm_cluster::daemon::monotonic_ns();
        kill(pid, Signal::SIGSTOP)?;
        std::thread::sleep(PERIOD_WINDOW);
        let to = storm_cluster::daemon::monotonic_ns();
        kill(pid, Signal::SIGCONT)?;
        for n in healthy.clone() {
            troubled.extend(heartbeat_gaps(&root, n, from, to)?);
        }
        wait_state(&socket, frozen, &[NodeState::Idle], Duration::from_secs(30))?;
    }
    cluster.shutdown()?;
    if calm.is_empty() || troubled.is_empty() {
        bail!("the healthy nodes logged no heartbeats");
    }
    let calm_s = Samples::from_secs(calm.clone());
    let troubled_s = Samples::from_secs(troubled.clone());
    let mut table = Table::new(
        format!(
            "Heartbeat period at the {} healthy nodes of an embedded {}-node cluster (tcp, \
             loopback, timeslice {} ms) in {} windows of {:?} from SIGSTOP of node {frozen}'s \
             NM (through its detection); baseline: the same nodes' period in windows with no \
             node frozen, same run",
            args.nodes - 1,
            args.nodes,
            args.timeslice_ms,
            args.trials.min(3),
            PERIOD_WINDOW,
        ),
        &[
            "measure",
            "gaps",
            "p50",
            "p99",
            "max",
            "ratio p50",
            "ratio p99",
        ],
    );
    for (name, s) in [
        ("heartbeat gap, none frozen", &calm_s),
        ("heartbeat gap, one frozen", &troubled_s),
    ] {
        table.push(vec![
            name.into(),
            s.len().to_string(),
            fmt_time(s.median()),
            fmt_time(s.quantile(0.99)),
            fmt_time(s.quantile(1.0)),
            format!("{:.2}", s.median() / calm_s.median()),
            format!("{:.2}", s.quantile(0.99) / calm_s.quantile(0.99)),
        ]);
    }
    for (name, v, s) in [
        ("heartbeat gap none frozen", calm, &calm_s),
        ("heartbeat gap one frozen", troubled, &troubled_s),
    ] {
        csv.push_distribution(name, v);
        csv.push(vec![
            name.replace(' ', "_"),
            args.nodes.to_string(),
            s.len().to_string(),
            format!("{:.6}", s.median()),
            format!("{:.6}", s.quantile(0.9)),
            format!("{:.6}", s.quantile(0.99)),
            format!("{:.6}", s.quantile(1.0)),
            String::new(),
            format!("{:.6}", calm_s.median()),
            format!("{:.2}", s.median() / calm_s.median()),
        ]);
    }
    Ok(table)
}

/// Median time for a loopback connect to a port nobody listens on to be refused.
fn refused_connect() -> Result<f64> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut v = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        if TcpStream::connect(port).is_ok() {
            bail!("something listens on {port}");
        }
        v.push(t.elapsed().as_secs_f64());
    }
    Ok(Samples::from_secs(v).median())
}

fn detection(args: &FaultsArgs, csv: &mut Csv) -> Result<Table> {
    if args.nodes < 2 {
        bail!("detection needs at least 2 nodes");
    }
    let mut opts = LocalOptions::new(args.nodes);
    opts.timeslice_ms = args.timeslice_ms;
    let mut cluster = LocalCluster::start(&opts)?;
    let socket = cluster.socket().to_path_buf();
    let baseline = refused_connect()?;
    let (mut detect, mut rejoin) = (Vec::new(), Vec::new());
    let (mut frozen_down, mut thawed_up) = (Vec::new(), Vec::new());
    for trial in 0..args.trials {
        let node = trial as u32 % args.nodes;
        let pid = nm_pid(&cluster, node)?;
        let t = Instant::now();
        kill(pid, Signal::SIGSTOP)?;
        let down = wait_state(&socket, node, &[NodeState::Down], Duration::from_secs(30));
        let t_down = t.elapsed().as_secs_f64();
        let t = Instant::now();
        kill(pid, Signal::SIGCONT)?;
        down?;
        frozen_down.push(t_down);
        wait_state(&socket, node, &[NodeState::Idle], Duration::from_secs(30))?;
        thawed_up.push(t.elapsed().as_secs_f64());
    }
    for trial in 0..args.trials {
        let node = trial as u32 % args.nodes;
        let t = Instant::now();
        cluster.kill_nm(node)?;
        wait_state(&socket, node, &[NodeState::Down], Duration::from_secs(30))?;
        detect.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        cluster.restart_nm(node)?;
        wait_state(&socket, node, &[NodeState::Idle], Duration::from_secs(30))?;
        rejoin.push(t.elapsed().as_secs_f64());
    }
    cluster.shutdown()?;
    let slice = args.timeslice_ms / 1000.0;
    let mut table = Table::new(
        format!(
            "Failure detection: SIGSTOP (frozen) or kill -9 of one NM of an embedded {}-node \
             cluster (tcp, loopback, timeslice {} ms) until the MM reports it DOWN, and SIGCONT \
             or restart until it is idle again; {} trials each; baseline: a refused loopback \
             connect, same run",
            args.nodes, args.timeslice_ms, args.trials
        ),
        &[
            "measure",
            "median",
            "p90",
            "max",
            "heartbeats",
            "baseline",
            "ratio",
        ],
    );
    for (name, v) in [
        ("freeze to DOWN", frozen_down),
        ("thaw to UP", thawed_up),
        ("kill to DOWN", detect),
        ("restart to UP", rejoin),
    ] {
        push_measure(&mut table, csv, name, args.nodes, v, Some(slice), baseline);
    }
    Ok(table)
}

fn heal(args: &FaultsArgs, csv: &mut Csv) -> Result<Table> {
    let mut table = Table::new(
        format!(
            "Tree healing (tcp, binary tree, 8-byte XFER-AND-SIGNAL from node 0): interior node 1 \
             crashes; time until a transfer to the remaining nodes completes (the failed transfer \
             naming node 1, then one on the rebuilt tree); {} trials; baseline: one transfer on \
             the healthy tree, same run",
            args.trials
        ),
        &["N", "heal median", "heal p90", "healthy xfer", "ratio"],
    );
    let t = test_layout();
    let cfg = TcpConfig {
        fanout: 2,
        ..TcpConfig::default()
    };
    for &n in &args.heal_nodes {
        if n < 4 {
            bail!("healing needs at least 4 nodes (node 1 must have children)");
        }
        let (mut heal, mut healthy) = (Vec::new(), Vec::new());
        for _ in 0..args.trials {
            let nodes = TcpNode::local_cluster(n, &t.layout, &cfg)?;
            let all = NodeSet::range(1, n - 1);
            let xfer = |dest: &NodeSet| -> Result<(), PrimError> {
                nodes[0].xfer_and_signal(
                    dest,
                    t.small.offset,
                    Bytes::from_static(b"strobe!!"),
                    Some(t.data),
                    Some(t.done),
                )?;
                match nodes[0].test_event(t.done, Wait::Timeout(Duration::from_secs(30)))? {
                    true => Ok(()),
                    false => Err(PrimError::TransferFailed("no completion".into())),
                }
            };
            // Warm the connections, then time a healthy transfer.
            xfer(&all)?;
            let start = Instant::now();
            xfer(&all)?;
            healthy.push(start.elapsed().as_secs_f64());
            nodes[1].shutdown();
            let start = Instant::now();
            match xfer(&all) {
                Err(PrimError::Unreachable { node: 1, .. }) => {}
                other => bail!("the transfer over the dead node should fail naming it: {other:?}"),
            }
            let mut rest = all.clone();
            rest.remove(1);
            xfer(&rest)?;
            heal.push(start.elapsed().as_secs_f64());
        }
        let (heal, healthy) = (Samples::from_secs(heal), Samples::from_secs(healthy));
        let ratio = heal.median() / healthy.median();
        table.push(vec![
            n.to_string(),
            fmt_time(heal.median()),
            fmt_time(heal.quantile(0.9)),
            fmt_time(healthy.median()),
            format!("{ratio:.2}"),
        ]);
        csv.push(vec![
            "tree_heal".into(),
            n.to_string(),
            heal.len().to_string(),
            format!("{:.6}", heal.median()),
            format!("{:.6}", heal.quantile(0.9)),
            format!("{:.6}", heal.quantile(0.99)),
            format!("{:.6}", heal.quantile(1.0)),
            String::new(),
            format!("{:.6}", healthy.median()),
            format!("{ratio:.2}"),
        ]);
    }
    Ok(table)
}

/// Median time to fork and exec `/bin/true` and wait for it.
pub(crate) fn fork_exec() -> Result<f64> {
    let mut v = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let status = std::process::Command::new("/bin/true").status()?;
        if !status.success() {
            bail!("/bin/true failed");
        }
        v.push(t.elapsed().as_secs_f64());
    }
    Ok(Samples::from_secs(v).median())
}

/// Jobs run before the MM restarts, so that its journal has records to read.
const JOURNALED_JOBS: usize = 20;

fn mm_restart(args: &FaultsArgs, csv: &mut Csv) -> Result<Table> {
    let mut opts = LocalOptions::new(args.nodes);
    opts.timeslice_ms = args.timeslice_ms;
    let mut cluster = LocalCluster::start(&opts)?;
    let socket = cluster.socket().to_path_buf();
    for _ in 0..JOURNALED_JOBS {
        let client = Client::connect(&socket).map_err(anyhow::Error::msg)?;
        let req = storm_cluster::control::JobRequest {
            tasks: storm_cluster::tasks::TaskRequest {
                nodes: Some(args.nodes),
                ..Default::default()
            },
            delivery: storm_cluster::control::Delivery::InPlace,
            ..storm_cluster::control::JobRequest::new("journaled", "/bin/true", "/")
        };
        storm_cli::submit::run_job(client, req, None, &mut Quiet).map_err(anyhow::Error::msg)?;
    }
    let baseline = fork_exec()?;
    let (mut answering, mut ready) = (Vec::new(), Vec::new());
    for _ in 0..args.trials {
        let (client, answered) = restart_mm(&mut cluster, &socket)?;
        answering.push(answered);
        let t = Instant::now() - Duration::from_secs_f64(answered);
        wait_until(&client, t, "every node idle", |jobs, nodes| {
            jobs.is_empty() && nodes.iter().all(|n| n.state == NodeState::Idle)
        })?;
        ready.push(t.elapsed().as_secs_f64());
    }
    // One running job on every node, each with its storm-submit attached (it reattaches).
    // Its task sleeps for an hour under a duration no other process has, so that the bench
    // can see every task running before it kills the MM.
    let submit = storm_cli::local::bin_dir()?.join("storm-submit");
    let hour = format!("3600.{}", std::process::id());
    let mut submitters = Vec::new();
    for _ in 0..args.nodes {
        submitters.push(
            std::process::Command::new(&submit)
                .arg("--socket")
                .arg(&socket)
                .args(["-N", "1", "--exclusive", "-J", "readopted", "sleep", &hour])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", submit.display()))?,
        );
    }
    let running = |jobs: &[storm_cluster::control::JobInfo]| {
        jobs.len() == args.nodes as usize && jobs.iter().all(|j| j.state == JobState::Running)
    };
    let client = Client::connect(&socket).map_err(anyhow::Error::msg)?;
    wait_until(&client, Instant::now(), "the jobs running", |jobs, _| {
        running(jobs)
    })?;
    // "running" means the launch is on its way; a node that has not taken it when the MM is
    // killed is one the restarted MM cannot tell from a node that lost the job, if its NM
    // started within a second of the launch (the rule's margin for clocks). Wait for the tasks.
    let since = Instant::now();
    // The task runs a spooled copy of sleep (`.../job-N/sleep 3600.PID`); its submitter's
    // command line has the words too, but not behind a slash.
    let task = format!("/sleep {}$", hour.replace('.', "\\."));
    while tasks_running(&task)? < args.nodes as usize {
        if since.elapsed() > Duration::from_secs(30) {
            bail!("the readopted jobs' tasks did not all start within 30 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (mut answering_busy, mut readopted) = (Vec::new(), Vec::new());
    for _ in 0..args.trials {
        let (client, answered) = restart_mm(&mut cluster, &socket)?;
        answering_busy.push(answered);
        let t = Instant::now() - Duration::from_secs_f64(answered);
        wait_until(&client, t, "every job re-adopted", |jobs, nodes| {
            running(jobs)
                && nodes
                    .iter()
                    .all(|n| n.state != NodeState::Idle && n.state != NodeState::Down)
        })?;
        readopted.push(t.elapsed().as_secs_f64());
    }
    cluster.shutdown()?;
    for mut s in submitters {
        let _ = s.kill();
        let _ = s.wait();
    }
    let mut table = Table::new(
        format!(
            "MM restart: kill -9 of the MM of an embedded {}-node cluster (tcp, loopback, \
             timeslice {} ms, {JOURNALED_JOBS} jobs in the journal), from its restart until it \
             answers requests and until every node is idle again; then with a running job on \
             every node, until each is re-adopted; {} trials each; baseline: fork/exec of \
             /bin/true, same run",
            args.nodes, args.timeslice_ms, args.trials
        ),
        &["measure", "median", "p90", "max", "baseline", "ratio"],
    );
    for (name, v) in [
        ("restart to answering", answering),
        ("restart to ready", ready),
        (
            &*format!("restart to answering, {} jobs", args.nodes),
            answering_busy,
        ),
        (
            &*format!("restart to {} jobs re-adopted", args.nodes),
            readopted,
        ),
    ] {
        push_measure(&mut table, csv, name, args.nodes, v, None, baseline);
    }
    Ok(table)
}

/// Kills the MM with SIGKILL and starts it again; returns a client once it answers, and how
/// long after the restart that was (seconds).
fn restart_mm(cluster: &mut LocalCluster, socket: &std::path::Path) -> Result<(Client, f64)> {
    cluster.kill_mm()?;
    let t = Instant::now();
    cluster.restart_mm()?;
    loop {
        if let Ok(c) = Client::connect(socket) {
            return Ok((c, t.elapsed().as_secs_f64()));
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("the MM did not come back within 30 s");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Polls the MM's queue and node table until `done` says so (at most 30 s after `since`).
/// How many processes have a command line that matches `pattern` (an extended regular
/// expression, as pgrep takes it).
fn tasks_running(pattern: &str) -> Result<usize> {
    let out = std::process::Command::new("pgrep")
        .args(["-c", "-f", pattern])
        .output()
        .context("running pgrep")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0))
}

fn wait_until(
    client: &Client,
    since: Instant,
    what: &str,
    mut done: impl FnMut(
        &[storm_cluster::control::JobInfo],
        &[storm_cluster::control::NodeInfo],
    ) -> bool,
) -> Result<()> {
    loop {
        let jobs = match client.call(&Request::Queue).map_err(anyhow::Error::msg)? {
            Reply::Queue(j) => j,
            other => bail!("unexpected reply {other:?}"),
        };
        let nodes = match client.call(&Request::Nodes).map_err(anyhow::Error::msg)? {
            Reply::Nodes(n) => n,
            other => bail!("unexpected reply {other:?}"),
        };
        if done(&jobs, &nodes) {
            return Ok(());
        }
        if since.elapsed() > Duration::from_secs(30) {
            let history = client.call(&Request::History).map_err(anyhow::Error::msg)?;
            bail!("not {what} 30 s after the MM restarted: {jobs:?} {nodes:?}; ended: {history:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One measurement: a row of `table` (median, p90, max, heartbeats if given, baseline,
/// ratio) and of the CSV.
pub(crate) fn push_measure(
    table: &mut Table,
    csv: &mut Csv,
    name: &str,
    nodes: u32,
    samples: Vec<f64>,
    slice: Option<f64>,
    baseline: f64,
) {
    csv.push_distribution(name, samples.clone());
    let s = Samples::from_secs(samples);
    let (med, p90, max) = (s.median(), s.quantile(0.9), s.quantile(1.0));
    let p99 = s.quantile(0.99);
    let mut row = vec![name.into(), fmt_time(med), fmt_time(p90), fmt_time(max)];
    if let Some(slice) = slice {
        row.push(format!("{:.1}", med / slice));
    }
    row.extend([fmt_time(baseline), format!("{:.0}", med / baseline)]);
    table.push(row);
    csv.push(vec![
        name.replace(' ', "_"),
        nodes.to_string(),
        s.len().to_string(),
        format!("{med:.6}"),
        format!("{p90:.6}"),
        format!("{p99:.6}"),
        format!("{max:.6}"),
        slice
            .map(|sl| format!("{:.2}", med / sl))
            .unwrap_or_default(),
        format!("{baseline:.6}"),
        format!("{:.2}", med / baseline),
    ]);
}
