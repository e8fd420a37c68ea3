//! The SPMD test program (spmd.c): building it, running it bare (fork/exec, no resource
//! manager), and running it as storm jobs.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use storm_cli::local::LocalCluster;
use storm_cli::submit::{self, Progress};
use storm_cluster::control::{Client, JobRequest};
use storm_cluster::messages::{JobId, Stream};
use storm_cluster::tasks::TaskRequest;
use storm_primitives::NodeSet;

const SOURCE: &str = include_str!("../spmd.c");

/// The compiled program and the work it is asked to do.
pub struct Spmd {
    pub binary: PathBuf,
    pub iterations: u64,
    pub loops: u64,
}

/// One run of the program as rank 0 saw it: from the first barrier to the last
/// (CLOCK_MONOTONIC, nanoseconds).
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Span {
    pub fn secs(&self) -> f64 {
        (self.end_ns - self.start_ns) as f64 / 1e9
    }

    /// From the first start to the last end of several concurrent runs.
    pub fn makespan(spans: &[Span]) -> f64 {
        let start = spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
        let end = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
        end.saturating_sub(start) as f64 / 1e9
    }
}

/// Every run gets its own barrier name, even when a new cluster reuses job ids.
fn next_tag() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn parse_span(stdout: &str) -> Result<Span> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("spmd "))
        .with_context(|| format!("the SPMD program printed no timing line: {stdout:?}"))?;
    let mut it = line.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(start_ns)), Some(Ok(end_ns))) if end_ns >= start_ns => {
            Ok(Span { start_ns, end_ns })
        }
        _ => bail!("malformed timing line from the SPMD program: {line:?}"),
    }
}

impl Spmd {
    /// Compiles spmd.c into `dir`.
    pub fn build(dir: &Path) -> Result<PathBuf> {
        let src = dir.join("spmd.c");
        let bin = dir.join("spmd");
        std::fs::write(&src, SOURCE)?;
        let status = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .context("running cc (install a C compiler: apt-get install build-essential)")?;
        if !status.success() {
            bail!("cc failed to build the SPMD test program");
        }
        Ok(bin)
    }

    /// Sizes the work so that every rank computes `sync_ms` of CPU time between barriers and
    /// `ranks` ranks sharing this machine's cores take about `alone_s` seconds bare.
    pub fn calibrate(binary: PathBuf, ranks: u32, sync_ms: f64, alone_s: f64) -> Result<Self> {
        let probe = 20_000_000u64;
        let probe_run = Spmd {
            binary: binary.clone(),
            iterations: 1,
            loops: probe,
        };
        let t = Instant::now();
        probe_run.run_bare(1)?;
        let loops_per_s = probe as f64 / t.elapsed().as_secs_f64();
        let loops = (loops_per_s * sync_ms / 1e3).max(1.0) as u64;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let share = (ranks as f64).max(cores) / cores;
        let iterations = (alone_s / (sync_ms / 1e3 * share)).max(1.0) as u64;
        Ok(Spmd {
            binary,
            iterations,
            loops,
        })
    }

    fn args(&self) -> Vec<String> {
        vec![
            self.iterations.to_string(),
            self.loops.to_string(),
            next_tag(),
        ]
    }

    /// Runs `ranks` ranks by fork/exec on this machine, with no resource manager.
    pub fn run_bare(&self, ranks: u32) -> Result<Span> {
        let args = self.args();
        let mut children = Vec::new();
        for rank in 0..ranks {
            let child = Command::new(&self.binary)
                .args(&args)
                .env("STORM_RANK", rank.to_string())
                .env("STORM_SIZE", ranks.to_string())
                .env("STORM_JOB_ID", "bare")
                .stdout(if rank == 0 {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .spawn()
                .with_context(|| format!("starting {}", self.binary.display()))?;
            children.push(child);
        }
        let mut span = None;
        for (rank, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "bare rank {rank} of the SPMD program failed: {}",
                    out.status
                );
            }
            if rank == 0 {
                span = Some(parse_span(&String::from_utf8_lossy(&out.stdout))?);
            }
        }
        span.context("no ranks")
    }

    /// Submits one job of `nodes` ranks and waits for it; returns rank 0's span and the time
    /// slot the MM placed it in.
    pub fn run_job(&self, cluster: &LocalCluster, nodes: u32) -> Result<(Span, Option<u32>)> {
        let mut seen = Rank0::default();
        submit(cluster, &self.binary, self.args(), nodes, &mut seen)?;
        let span = parse_span(&String::from_utf8_lossy(&seen.stdout))?;
        Ok((span, seen.slot))
    }

    /// Submits `jobs` jobs of `nodes` ranks at once and waits for all of them.
    pub fn run_jobs(&self, cluster: &LocalCluster, nodes: u32, jobs: usize) -> Result<Vec<Span>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..jobs)
                .map(|_| s.spawn(|| self.run_job(cluster, nodes)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| anyhow::anyhow!("a submitting thread panicked"))?
                        .map(|(span, _)| span)
                })
                .collect()
        })
    }
}

/// Submits `program` as a job of one task on each of `nodes` nodes, broadcast by storm, and
/// waits for it to succeed.
pub fn submit(
    cluster: &LocalCluster,
    program: &Path,
    args: Vec<String>,
    nodes: u32,
    progress: &mut Rank0,
) -> Result<()> {
    let client = Client::connect(cluster.socket()).map_err(anyhow::Error::msg)?;
    let file = File::open(program).with_context(|| format!("opening {}", program.display()))?;
    let req = JobRequest {
        args: args.into_iter().map(Into::into).collect(),
        tasks: TaskRequest {
            nodes: Some(nodes),
            ntasks: Some(nodes),
            ..TaskRequest::default()
        },
        delivery: storm_cluster::control::Delivery::Broadcast,
        ..JobRequest::new(
            program
                .file_name()
                .map_or("job".into(), |n| n.to_string_lossy().into_owned()),
            program.to_path_buf(),
            std::env::temp_dir(),
        )
    };
    let (outcome, _, _) =
        submit::run_job(client, req, Some(&file), progress).map_err(anyhow::Error::msg)?;
    if outcome.exit_code() != 0 {
        bail!(
            "{} failed: {outcome:?}\n{}",
            program.display(),
            String::from_utf8_lossy(&progress.stderr)
        );
    }
    Ok(())
}

/// Collects rank 0's output and the job's time slot.
#[derive(Default)]
pub struct Rank0 {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    slot: Option<u32>,
}

impl Progress for Rank0 {
    fn started(
        &mut self,
        _job: JobId,
        _nodes: &NodeSet,
        _names: &[String],
        time_slot: Option<u32>,
    ) {
        self.slot = time_slot;
    }

    fn output(&mut self, rank: u32, stream: Stream, data: &[u8]) {
        match (rank, stream) {
            (0, Stream::Stdout) => self.stdout.extend_from_slice(data),
            (_, Stream::Stderr) => self.stderr.extend_from_slice(data),
            _ => {}
        }
    }
}
