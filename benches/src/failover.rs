//! `storm-bench faults --managers 3`: a replicated MM's leader killed, and how soon the
//! cluster schedules again.
//!
//! An embedded cluster with a group of MM replicas, one long job running (its storm-submit
//! attached) that must not be disturbed. Each trial kills the leader with SIGKILL and at once
//! submits a one-task `/bin/true` job through the replicas' sockets, as storm-submit does
//! (waiting for an election); the time is taken from the kill until that job's launch (its
//! `Started` reply) and until its result. The killed replica is then started again and the
//! trial waits until it follows with the whole log. At the end every probe job must be in
//! the history once, completed, and the long job still running under the same id: no job
//! lost, none run twice, none disturbed. Baseline, same run: a fork/exec of `/bin/true`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::submit::{self, Progress};
use storm_cluster::control::{Delivery, JobRequest, JobState, Reply, Request};
use storm_cluster::messages::JobId;
use storm_cluster::tasks::TaskRequest;
use storm_primitives::NodeSet;

use crate::faults::FaultsArgs;
use crate::report::{Csv, Table};

/// Records when the job was launched.
struct Launched(Option<Instant>);

impl Progress for Launched {
    fn started(&mut self, _: JobId, _: &NodeSet, _: &[String], _: Option<u32>) {
        self.0.get_or_insert_with(Instant::now);
    }
}

fn probe_request() -> JobRequest {
    JobRequest {
        name: "failover-probe".into(),
        program: "/bin/true".into(),
        args: vec![],
        env: vec![],
        cwd: "/".into(),
        tasks: TaskRequest {
            ntasks: Some(1),
            ..Default::default()
        },
        delivery: Delivery::InPlace,
        time_limit_ms: None,
        requeue: false,
        mpi: Default::default(),
        input: Default::default(),
        dependency: None,
        batch: None,
        step_of: None,
        array: None,
        element: None,
    }
}

/// `storm managers`, as (name, role, lag).
fn managers(sockets: &[std::path::PathBuf]) -> Result<Vec<(String, String, u64)>> {
    let (client, _) = storm_cli::connect_any(sockets).map_err(anyhow::Error::msg)?;
    match client
        .call(&Request::Managers)
        .map_err(anyhow::Error::msg)?
    {
        Reply::Managers(m) => Ok(m.into_iter().map(|m| (m.name, m.role, m.lag)).collect()),
        other => bail!("unexpected reply {other:?}"),
    }
}

pub fn run(args: &FaultsArgs, csv: &mut Csv) -> Result<Table> {
    let mut cluster = LocalCluster::start(&LocalOptions {
        timeslice_ms: args.timeslice_ms,
        managers: args.managers,
        replication: args.replication.clone(),
        cpus: Some(4),
        ..LocalOptions::new(args.nodes)
    })?;
    let sockets = cluster.config.control_sockets();
    let election_ms = cluster.config.replication.election_timeout_ms;
    // The long job that must run on undisturbed.
    let submit_bin = storm_cli::local::bin_dir()?.join("storm-submit");
    let mut long = std::process::Command::new(&submit_bin)
        .arg("--config")
        .arg(&cluster.config_path)
        .args(["-N", "1", "-J", "undisturbed", "sleep", "3600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", submit_bin.display()))?;
    let long_id = wait_running(&sockets, "undisturbed")?;
    let baseline = crate::faults::fork_exec()?;
    let (mut to_launch, mut to_result) = (Vec::new(), Vec::new());
    for trial in 0..args.trials {
        let leader = cluster.leader().context("no leader")?;
        cluster.kill_manager(&leader)?;
        let killed = Instant::now();
        let (client, _) = storm_cli::connect_any(&sockets).map_err(anyhow::Error::msg)?;
        let mut launched = Launched(None);
        let (outcome, _, _) = submit::run_job(client, probe_request(), None, &mut launched)
            .map_err(|e| anyhow::anyhow!("trial {trial}: the probe job: {e}"))?;
        to_result.push(killed.elapsed().as_secs_f64());
        if outcome.exit_code() != 0 {
            bail!("trial {trial}: the probe job failed: {outcome:?}");
        }
        let at = launched
            .0
            .context("the probe job was never reported started")?;
        to_launch.push((at - killed).as_secs_f64());
        cluster.restart_manager(&leader)?;
        let since = Instant::now();
        while managers(&sockets)?
            .iter()
            .any(|(_, role, lag)| role == "unreachable" || *lag > 0)
        {
            if since.elapsed() > Duration::from_secs(30) {
                bail!("trial {trial}: {leader} did not rejoin the group within 30 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Nothing lost, nothing twice, nothing disturbed.
    let (client, _) = storm_cli::connect_any(&sockets).map_err(anyhow::Error::msg)?;
    let history = match client.call(&Request::History).map_err(anyhow::Error::msg)? {
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
    if wait_running(&sockets, "undisturbed")? != long_id {
        bail!("the long job is not the one that ran before the failovers");
    }
    let _ = long.kill();
    let _ = long.wait();
    cluster.shutdown()?;
    let mut table = Table::new(
        format!(
            "Failover: kill -9 of the leader of {} MM replicas (embedded {}-node cluster, tcp, \
             loopback, timeslice {} ms, replica heartbeat {} ms, election timeout {election_ms} \
             ms), until the first \
             job submitted after it is launched and until its result; {} trials, {} probe jobs \
             each completed once, the running job undisturbed; baseline: fork/exec of \
             /bin/true, same run",
            args.managers,
            args.nodes,
            args.timeslice_ms,
            args.replication.heartbeat_ms,
            args.trials,
            args.trials
        ),
        &["measure", "median", "p90", "max", "baseline", "ratio"],
    );
    for (name, v) in [
        ("leader killed to new job launched", to_launch),
        ("leader killed to new job's result", to_result),
    ] {
        crate::faults::push_measure(&mut table, csv, name, args.nodes, v, None, baseline);
    }
    Ok(table)
}

/// The id of the running job named `name`, once it runs.
fn wait_running(sockets: &[std::path::PathBuf], name: &str) -> Result<JobId> {
    let since = Instant::now();
    loop {
        let (client, _) = storm_cli::connect_any(sockets).map_err(anyhow::Error::msg)?;
        if let Reply::Queue(jobs) = client.call(&Request::Queue).map_err(anyhow::Error::msg)?
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
