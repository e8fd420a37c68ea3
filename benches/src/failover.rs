//! `storm-bench faults --managers 3`: a replicated MM's leader killed, and how soon the
//! cluster schedules again.
//!
//! An embedded cluster with a group of MM replicas, one long job running (its storm-submit
//! attached) that must not be disturbed: it prints a numbered line every 50 ms and writes the
//! same line to a file of its own. Each trial kills the leader with SIGKILL and at once
//! submits a one-task `/bin/true` job through the replicas' sockets, as storm-submit does
//! (waiting for an election); the time is taken from the kill until that job's launch (its
//! `Started` reply) and until its result. The killed replica is then started again and the
//! trial waits until it follows with the whole log. At the end every probe job must be in
//! the history once, completed, and the long job still running under the same id; told to
//! stop, it ends with exit 0, and what its storm-submit printed across every failover is
//! exactly the file it wrote: no job lost, none run twice, none disturbed, no output line
//! lost or duplicated. Baseline, same run: a fork/exec of `/bin/true`.
//!
//! With `--submitters N`, N clients each submit a short job (`sleep 0.1`) 50 ms before every
//! kill, so that jobs are being sent, queued, started, run and ended when the leader dies;
//! each follows the group as storm-submit does, and every one of their jobs must end in the
//! history once, completed. The probe then queues behind them (its times include that wait),
//! and a row gives the time from the kill until the last of them ended.
//!
//! With `--testbed` the group runs on the namespace testbed instead (`storm-testbed up
//! --managers 3`: each replica and each node in a network namespace of its own, linked by
//! veth pairs through a bridge), as the target asks; the clients stay on the host,
//! as they do on the testbed, through the replicas' control sockets.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::submit::{self, Progress};
use storm_cli::testbed::{Testbed, TestbedOptions};
use storm_cluster::config::ClusterConfig;
use storm_cluster::control::{Delivery, JobRequest, JobState, Reply, Request};
use storm_cluster::messages::JobId;
use storm_cluster::tasks::TaskRequest;
use storm_primitives::NodeSet;

use crate::faults::FaultsArgs;
use crate::report::{Csv, Table};

/// Records when the job was launched; follows the group, as storm-submit does, when the
/// replica it reached stops before answering (it may have been the one being killed).
struct Launched<'a> {
    at: Option<Instant>,
    sockets: &'a [std::path::PathBuf],
    supervisor: Supervisor<'a>,
}

/// Where the group runs: an embedded cluster on loopback, or the namespace testbed.
trait Replicas {
    fn config(&self) -> &ClusterConfig;
    fn config_path(&self) -> &Path;
    /// The replica that leads ("m1"), by which control socket answers.
    fn leader(&self) -> Option<String>;
    /// SIGKILL of replica `name`.
    fn kill_manager(&mut self, name: &str) -> Result<()>;
    /// Starts replica `name` again (it rejoins as a follower).
    fn restart_manager(&mut self, name: &str) -> Result<()>;
    fn is_running(&mut self, name: &str) -> bool;
    fn shut_down(self: Box<Self>) -> Result<()>;
    /// Where it runs, for the table's title.
    fn place(&self) -> String;
}

impl Replicas for LocalCluster {
    fn config(&self) -> &ClusterConfig {
        &self.config
    }
    fn config_path(&self) -> &Path {
        &self.config_path
    }
    fn leader(&self) -> Option<String> {
        LocalCluster::leader(self)
    }
    fn kill_manager(&mut self, name: &str) -> Result<()> {
        LocalCluster::kill_manager(self, name)
    }
    fn restart_manager(&mut self, name: &str) -> Result<()> {
        LocalCluster::restart_manager(self, name)
    }
    fn is_running(&mut self, name: &str) -> bool {
        LocalCluster::is_running(self, &format!("storm-mm {name}"))
    }
    fn shut_down(self: Box<Self>) -> Result<()> {
        self.shutdown()
    }
    fn place(&self) -> String {
        format!(
            "embedded {}-node cluster, tcp, loopback",
            self.config.nodes.len()
        )
    }
}

/// The testbed and the directory it lives in.
struct OnTestbed {
    testbed: Option<Testbed>,
    _dir: tempfile::TempDir,
}

impl OnTestbed {
    fn testbed(&self) -> &Testbed {
        self.testbed.as_ref().expect("up until shut down")
    }
    fn testbed_mut(&mut self) -> &mut Testbed {
        self.testbed.as_mut().expect("up until shut down")
    }
}

impl Replicas for OnTestbed {
    fn config(&self) -> &ClusterConfig {
        &self.testbed().config
    }
    fn config_path(&self) -> &Path {
        &self.testbed().config_path
    }
    fn leader(&self) -> Option<String> {
        self.testbed().leader()
    }
    fn kill_manager(&mut self, name: &str) -> Result<()> {
        self.testbed_mut().kill(&format!("storm-mm {name}"))
    }
    fn restart_manager(&mut self, name: &str) -> Result<()> {
        let j = name
            .strip_prefix('m')
            .and_then(|j| j.parse().ok())
            .with_context(|| format!("{name} is not a testbed replica's name"))?;
        self.testbed_mut().start_manager(j)
    }
    fn is_running(&mut self, name: &str) -> bool {
        self.testbed_mut().is_running(&format!("storm-mm {name}"))
    }
    fn shut_down(mut self: Box<Self>) -> Result<()> {
        self.testbed.take().expect("up").down()
    }
    fn place(&self) -> String {
        format!(
            "namespace testbed of {} nodes, each replica and node in a namespace of its own \
             (veth pairs and a bridge), tcp",
            self.config().nodes.len()
        )
    }
}

/// Brings the group up where `args` asks.
fn start(args: &FaultsArgs) -> Result<Box<dyn Replicas>> {
    if !args.testbed {
        return Ok(Box::new(LocalCluster::start(&LocalOptions {
            timeslice_ms: args.timeslice_ms,
            managers: args.managers,
            replication: args.replication.clone(),
            cpus: Some(4),
            // KEEP=1 keeps the cluster's directory (the daemons' logs) for a look afterwards.
            keep: std::env::var_os("KEEP").is_some(),
            ..LocalOptions::new(args.nodes)
        })?));
    }
    if let Err(why) = storm_cli::testbed::namespaces_available() {
        bail!("--testbed needs network namespaces (run as root): {why}");
    }
    let dir = tempfile::tempdir()?;
    let testbed = Testbed::up(&TestbedOptions {
        name: format!("fo{:05}", std::process::id() % 100_000),
        nodes: args.nodes,
        cpus: 4,
        dir: dir.path().join("testbed"),
        timeslice_ms: args.timeslice_ms,
        scheduler: Default::default(),
        failure: Default::default(),
        managers: args.managers,
        replication: args.replication.clone(),
        health: Default::default(),
        sysfs: None,
        cluster_name: None,
        federation: Default::default(),
        peers: Vec::new(),
        net: storm_cli::testbed::SINGLE_NET,
        guests: Vec::new(),
        limits: Default::default(),
    })?;
    Ok(Box::new(OnTestbed {
        testbed: Some(testbed),
        _dir: dir,
    }))
}

/// What systemd's `Restart=on-failure` does for a replica that exits by itself: starts it
/// again, as a follower. None should: a leader that loses its lease or is deposed stays on
/// as a follower (before 28 November it exited, and this is how the bench kept the group
/// whole); the count is reported so that one that does shows. The replica a trial kills is
/// started again by the trial, once its probe ran.
struct Supervisor<'a> {
    cluster: &'a mut dyn Replicas,
    killed: &'a str,
    /// Replicas started again so far.
    restarted: &'a mut usize,
}

impl Supervisor<'_> {
    fn restart_stopped(&mut self) -> Result<()> {
        let names: Vec<String> = self
            .cluster
            .config()
            .managers
            .iter()
            .map(|m| m.name.clone())
            .collect();
        for name in names {
            if name != self.killed && !self.cluster.is_running(&name) {
                self.cluster.restart_manager(&name)?;
                *self.restarted += 1;
            }
        }
        Ok(())
    }
}

impl Progress for Launched<'_> {
    fn started(&mut self, _: JobId, _: &NodeSet, _: &[String], _: Option<u32>) {
        self.at.get_or_insert_with(Instant::now);
    }
    fn resubmit(&mut self, why: &str) -> Option<storm_cluster::control::Client> {
        self.again(why)
    }
    fn reconnect(&mut self, _job: JobId, why: &str) -> Option<storm_cluster::control::Client> {
        self.again(why)
    }
}

impl Launched<'_> {
    /// A connection to whichever replica leads now, after the one in use was lost (`why`).
    /// A replica that stopped may not have exited yet when its connection closes: a round
    /// that finds no leader starts whatever stopped since, and tries again.
    fn again(&mut self, why: &str) -> Option<storm_cluster::control::Client> {
        for _ in 0..3 {
            if let Err(e) = self.supervisor.restart_stopped() {
                eprintln!("storm-bench: cannot start a stopped replica again: {e:#}");
            }
            match storm_cli::connect_any(self.sockets) {
                Ok((c, _)) => return Some(c),
                Err(e) => eprintln!("storm-bench: the probe lost its replica ({why}), and {e}"),
            }
        }
        None
    }
}

/// The probe job of trial `trial`, with a token of its own (so that a submission sent again
/// after a lost answer is recognised).
fn probe_request(trial: usize) -> JobRequest {
    JobRequest {
        tasks: TaskRequest {
            ntasks: Some(1),
            ..Default::default()
        },
        delivery: Delivery::InPlace,
        token: Some(u64::from(std::process::id()) << 32 | trial as u64),
        ..JobRequest::new("failover-probe", "/bin/true", "/")
    }
}

/// A client with a job under way across a failover (`--submitters`): it finds the next
/// leader as storm-submit does (its request goes again with its token, or it follows its job).
struct Follow<'a> {
    sockets: &'a [std::path::PathBuf],
}

impl Follow<'_> {
    fn again(&self, why: &str) -> Option<storm_cluster::control::Client> {
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(30) {
            if let Ok((c, _)) = storm_cli::connect_any(self.sockets) {
                return Some(c);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("storm-bench: a submitter lost its replica ({why}) and found no leader in 30 s");
        None
    }
}

impl Progress for Follow<'_> {
    fn resubmit(&mut self, why: &str) -> Option<storm_cluster::control::Client> {
        self.again(why)
    }
    fn reconnect(&mut self, _job: JobId, why: &str) -> Option<storm_cluster::control::Client> {
        self.again(why)
    }
}

/// The most submitters per failover (their tokens hold the index in 12 bits).
pub const MAX_SUBMITTERS: usize = 4096;

/// The job of submitter `i` in trial `trial`: a tenth of a second of `sleep`, so that the
/// jobs are in every phase (sent, queued, starting, running, ending) when the leader dies.
fn load_request(trial: usize, i: usize) -> JobRequest {
    JobRequest {
        args: vec!["0.1".into()],
        tasks: TaskRequest {
            ntasks: Some(1),
            ..Default::default()
        },
        delivery: Delivery::InPlace,
        token: Some(
            u64::from(std::process::id()) << 32 | 1 << 31 | (trial as u64) << 12 | i as u64,
        ),
        ..JobRequest::new("failover-load", "/bin/sleep", "/")
    }
}

/// Runs submitter `i`'s job of trial `trial` to its end, following the group; when it ended.
fn load_job(sockets: &[std::path::PathBuf], trial: usize, i: usize) -> Result<Instant> {
    let (client, _) = storm_cli::connect_any(sockets).map_err(anyhow::Error::msg)?;
    let (outcome, _, _) = submit::run_job(
        client,
        load_request(trial, i),
        None,
        &mut Follow { sockets },
    )
    .map_err(|e| anyhow::anyhow!("trial {trial}: submitter {i}: {e}"))?;
    if outcome.exit_code() != 0 {
        bail!("trial {trial}: submitter {i}'s job failed: {outcome:?}");
    }
    Ok(Instant::now())
}

/// How long the submitters run before the leader is killed: their jobs are then sent,
/// queued, running or ending.
const LOAD_HEAD_START: Duration = Duration::from_millis(50);

/// Asks whichever replica leads, as `storm` does: a connection lost to a leader that stopped
/// (under load a leader can lose its lease between a connection and its request) is made
/// again, for up to 30 s.
fn ask(sockets: &[std::path::PathBuf], req: &Request) -> Result<Reply> {
    let since = Instant::now();
    loop {
        let asked = storm_cli::connect_any(sockets)
            .and_then(|(client, _)| client.call(req).map_err(|e| e.to_string()));
        match asked {
            Ok(reply) => return Ok(reply),
            Err(e) if since.elapsed() > Duration::from_secs(30) => {
                bail!("no replica answered {req:?} within 30 s: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `storm managers`, as (name, role, lag).
fn managers(sockets: &[std::path::PathBuf]) -> Result<Vec<(String, String, u64)>> {
    match ask(sockets, &Request::Managers)? {
        Reply::Managers(m) => Ok(m.into_iter().map(|m| (m.name, m.role, m.lag)).collect()),
        other => bail!("unexpected reply {other:?}"),
    }
}

pub fn run(args: &FaultsArgs, csv: &mut Csv) -> Result<Table> {
    if args.submitters > MAX_SUBMITTERS {
        bail!("--submitters: at most {MAX_SUBMITTERS}");
    }
    let mut cluster = start(args)?;
    let sockets = cluster.config().control_sockets();
    let election_ms = cluster.config().replication.election_timeout_ms;
    // The long job that must run on undisturbed, and the lines it printed, as it saw them.
    let work = tempfile::tempdir()?;
    let (stop, truth) = (work.path().join("stop"), work.path().join("printed"));
    let counter = work.path().join("counter.sh");
    std::fs::write(
        &counter,
        format!(
            "#!/bin/sh\ni=1\nwhile [ ! -e '{}' ]; do echo \"line $i\"; echo \"line $i\" >> '{}'; \
             i=$((i+1)); sleep 0.05; done\n",
            stop.display(),
            truth.display()
        ),
    )?;
    std::fs::set_permissions(
        &counter,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let submit_bin = storm_cli::local::bin_dir()?.join("storm-submit");
    let mut long = std::process::Command::new(&submit_bin)
        .arg("--config")
        .arg(cluster.config_path())
        .args(["-N", "1", "-J", "undisturbed", "--reconnect", "60"])
        .arg(&counter)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(work.path().join("submit.log"))?)
        .spawn()
        .with_context(|| format!("starting {}", submit_bin.display()))?;
    // Read as it comes: a full pipe would hold storm-submit up, and the MM up with it.
    let long_out = long.stdout.take().context("the long job's output")?;
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = std::io::Read::read_to_end(&mut { long_out }, &mut all);
        all
    });
    let long_id = wait_running(&sockets, "undisturbed")?;
    let baseline = crate::faults::fork_exec()?;
    let (mut to_launch, mut to_result, mut to_load_done) = (Vec::new(), Vec::new(), Vec::new());
    let mut restarted = 0;
    let mut unseen_starts = 0;
    for trial in 0..args.trials {
        Supervisor {
            cluster: &mut *cluster,
            killed: "",
            restarted: &mut restarted,
        }
        .restart_stopped()?;
        let leader = cluster.leader().context("no leader")?;
        // The load: submitters whose jobs are under way when the leader dies.
        let load: Vec<_> = (0..args.submitters)
            .map(|i| {
                let sockets = sockets.clone();
                std::thread::spawn(move || load_job(&sockets, trial, i))
            })
            .collect();
        if !load.is_empty() {
            std::thread::sleep(LOAD_HEAD_START);
        }
        cluster.kill_manager(&leader)?;
        let killed = Instant::now();
        let (client, _) = storm_cli::connect_any(&sockets).map_err(anyhow::Error::msg)?;
        let mut launched = Launched {
            at: None,
            sockets: &sockets,
            supervisor: Supervisor {
                cluster: &mut *cluster,
                killed: &leader,
                restarted: &mut restarted,
            },
        };
        let (outcome, _, _) = submit::run_job(client, probe_request(trial), None, &mut launched)
            .map_err(|e| anyhow::anyhow!("trial {trial}: the probe job: {e}"))?;
        let result_at = Instant::now();
        to_result.push((result_at - killed).as_secs_f64());
        if outcome.exit_code() != 0 {
            bail!("trial {trial}: the probe job failed: {outcome:?}");
        }
        let at = match launched.at {
            Some(at) => at,
            // The probe followed its job to a later leader (a second leader change in the
            // trial: one that lost its lease) that had it ended already: its start is placed
            // by the MM's own timing, launch to end, counted back from the result (a little
            // late, by the result's way to the client).
            None => {
                unseen_starts += 1;
                result_at
                    .checked_sub(Duration::from_micros(outcome.timing.execute_us))
                    .context("the probe job's timing")?
            }
        };
        to_launch.push(at.saturating_duration_since(killed).as_secs_f64());
        let mut last_ended = None;
        for submitter in load {
            let ended = submitter
                .join()
                .map_err(|_| anyhow::anyhow!("trial {trial}: a submitter panicked"))??;
            last_ended = last_ended.max(Some(ended));
        }
        if let Some(t) = last_ended {
            to_load_done.push(t.saturating_duration_since(killed).as_secs_f64());
        }
        cluster.restart_manager(&leader)?;
        let since = Instant::now();
        while managers(&sockets)?
            .iter()
            .any(|(_, role, lag)| role == "unreachable" || *lag > 0)
        {
            if since.elapsed() > Duration::from_secs(30) {
                bail!("trial {trial}: {leader} did not rejoin the group within 30 s");
            }
            Supervisor {
                cluster: &mut *cluster,
                killed: "",
                restarted: &mut restarted,
            }
            .restart_stopped()?;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Nothing lost, nothing twice, nothing disturbed.
    let history = match ask(&sockets, &Request::History)? {
        Reply::History(h) => h,
        other => bail!("unexpected reply {other:?}"),
    };
    let probes: Vec<_> = history
        .iter()
        .filter(|j| j.name == "failover-probe")
        .collect();
    let completed = probes
        .iter()
        .filter(|j| j.state == JobState::Completed)
        .count();
    if probes.len() != args.trials || completed != args.trials {
        bail!(
            "{} trials, but {} probe jobs in the history ({completed} completed): {probes:?}",
            args.trials,
            probes.len()
        );
    }
    let load: Vec<_> = history
        .iter()
        .filter(|j| j.name == "failover-load")
        .collect();
    let load_done = load
        .iter()
        .filter(|j| j.state == JobState::Completed)
        .count();
    let want = args.trials * args.submitters;
    if load.len() != want || load_done != want {
        bail!(
            "{want} jobs of the submitters, but {} in the history ({load_done} completed)",
            load.len()
        );
    }
    if wait_running(&sockets, "undisturbed")? != long_id {
        bail!("the long job is not the one that ran before the failovers");
    }
    std::fs::write(&stop, "")?;
    let out = long.wait_with_output()?;
    let stdout = reader.join().unwrap_or_default();
    if !out.status.success() {
        bail!(
            "the long job's storm-submit: {}, {}",
            out.status,
            std::fs::read_to_string(work.path().join("submit.log")).unwrap_or_default()
        );
    }
    let printed = std::fs::read_to_string(&truth)?;
    let received = String::from_utf8_lossy(&stdout);
    if received != printed {
        let (got, want) = (received.lines().count(), printed.lines().count());
        bail!(
            "the long job's output across the failovers is not what it printed: {got} lines \
             received, {want} printed (first difference at line {})",
            received
                .lines()
                .zip(printed.lines())
                .position(|(a, b)| a != b)
                .map_or(got.min(want) + 1, |i| i + 1)
        );
    }
    let lines = printed.lines().count();
    let place = cluster.place();
    cluster.shut_down()?;
    let mut table = Table::new(
        format!(
            "Failover: kill -9 of the leader of {} MM replicas ({place}, timeslice {} ms, \
             replica heartbeat {} ms, election timeout {election_ms} ms), until the first \
             job submitted after it is launched and until its result; {} trials, {} probe jobs \
             each completed once, {} submitters' jobs under way at each kill (each completed \
             once), the running job undisturbed, its {lines} output lines each \
             received once and in order; {restarted} replicas that stopped by themselves (a \
             leader's lease lost under load) started again, as systemd's Restart= does; \
             {unseen_starts} probes whose start their client did not see (it followed the job \
             to a later leader that had it ended), launched as the MM's timing says; \
             baseline: fork/exec of /bin/true, same run",
            args.managers,
            args.timeslice_ms,
            args.replication.heartbeat_ms,
            args.trials,
            args.trials,
            args.submitters
        ),
        &["measure", "median", "p90", "max", "baseline", "ratio"],
    );
    let mut rows = vec![
        ("leader killed to new job launched", to_launch),
        ("leader killed to new job's result", to_result),
    ];
    if args.submitters > 0 {
        // With the load, the probe waits in the queue behind the submitters' jobs: its
        // times are the failover's plus that wait.
        rows.push(("leader killed to every submitter's job ended", to_load_done));
    }
    for (name, v) in rows {
        crate::faults::push_measure(&mut table, csv, name, args.nodes, v, None, baseline);
    }
    Ok(table)
}

/// The id of the running job named `name`, once it runs.
fn wait_running(sockets: &[std::path::PathBuf], name: &str) -> Result<JobId> {
    let since = Instant::now();
    loop {
        if let Reply::Queue(jobs) = ask(sockets, &Request::Queue)?
            && let Some(j) = jobs
                .iter()
                .find(|j| j.name == name && j.state == JobState::Running)
        {
            return Ok(j.job);
        }
        if since.elapsed() > Duration::from_secs(30) {
            bail!("job {name} is not running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
