//! `storm-bench start`, inside a Slurm allocation: what a private instance costs and gives,
//! beside Slurm's own step launcher in the same allocation, interleaved run by run.
//!
//! * **Start**: `storm start -- storm-submit -N K hostname`, from its fork/exec to the first
//!   line of output and to its exit (a whole instance up, one job, torn down), beside
//!   `srun --overlap -N K hostname` (one step, no instance).
//! * **Launch inside**: in one instance, `storm-submit -N K /bin/true` beside `srun --overlap
//!   -N K /bin/true`, each to its exit (the instance is started once, with this program as
//!   its command in `--inner` mode).
//!
//! The allocation's nodes are its nodes (`SLURM_JOB_NUM_NODES`); the figures are medians.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::report::{Csv, Table};
use crate::stats::{Samples, fmt_time};

pub const CSV_HEADER: &[&str] = &[
    "measure",
    "nodes",
    "runs",
    "storm_median_s",
    "srun_median_s",
    "ratio",
];

/// The allocation's node count, or why this is not inside one.
pub fn allocation_nodes() -> Result<u32> {
    let n = std::env::var("SLURM_JOB_NUM_NODES").context(
        "storm-bench start runs inside a Slurm allocation (salloc -N 4 storm-bench start)",
    )?;
    n.parse().context("SLURM_JOB_NUM_NODES is not a number")
}

/// Runs `cmd` to its exit; the time to its first line of output and to its exit.
fn timed(mut cmd: Command) -> Result<(Duration, Duration)> {
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut out = BufReader::new(child.stdout.take().context("stdout")?);
    let mut first = None;
    let mut line = String::new();
    while out.read_line(&mut line)? > 0 {
        first.get_or_insert_with(|| t.elapsed());
        line.clear();
    }
    let status = child.wait()?;
    let end = t.elapsed();
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok((first.unwrap_or(end), end))
}

fn srun(nodes: u32, program: &str) -> Command {
    let mut c = Command::new("srun");
    c.args([
        "--overlap",
        "--quiet",
        "-N",
        &nodes.to_string(),
        "--ntasks-per-node=1",
    ])
    .arg(program);
    c
}

/// The whole measurement (outside an instance).
pub fn run(bin: &Path, runs: usize, csv: &mut Csv) -> Result<Vec<Table>> {
    let nodes = allocation_nodes()?;
    let storm = bin.join("storm");
    let submit = bin.join("storm-submit");
    let start = || {
        let mut c = Command::new(&storm);
        c.args(["start", "--"])
            .arg(&submit)
            .args(["-N", &nodes.to_string(), "hostname"])
            .env_remove("STORM_CONFIG");
        c
    };
    // One warm-up of each (page cache, Slurm's first step).
    timed(start())?;
    timed(srun(nodes, "hostname"))?;
    let (mut s_first, mut s_end, mut r_first, mut r_end) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        let (f, e) = timed(start())?;
        s_first.push(f.as_secs_f64());
        s_end.push(e.as_secs_f64());
        let (f, e) = timed(srun(nodes, "hostname"))?;
        r_first.push(f.as_secs_f64());
        r_end.push(e.as_secs_f64());
    }
    let mut start_table = Table::new(
        format!(
            "storm start -- storm-submit -N {nodes} hostname (an instance up, one job, torn down) beside srun --overlap -N {nodes} hostname, same allocation, interleaved, median of {runs}"
        ),
        &["measure", "storm start", "srun", "ratio"],
    );
    for (what, s, r) in [
        ("to first output", s_first, r_first),
        ("to exit", s_end, r_end),
    ] {
        push(&mut start_table, csv, what, nodes, s, r);
    }
    // Launch inside one instance: this program, inner mode, as the instance's command.
    let me = std::env::current_exe()?;
    let out = Command::new(&storm)
        .args(["start", "--"])
        .arg(&me)
        .args(["start", "--inner", "--runs", &runs.to_string()])
        .env("STORM_BIN_DIR", bin)
        .stderr(Stdio::inherit())
        .output()
        .context("running the launch measurement inside an instance")?;
    if !out.status.success() {
        bail!(
            "the launch measurement inside the instance failed: {}",
            out.status
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut launch_table = Table::new(
        format!(
            "launch inside one instance: storm-submit -N {nodes} /bin/true beside srun --overlap -N {nodes} /bin/true, to exit, interleaved, median of {runs}"
        ),
        &["measure", "storm-submit", "srun", "ratio"],
    );
    let samples: Vec<Vec<f64>> = text
        .lines()
        .filter_map(|l| l.strip_prefix("samples "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .collect();
    let [s, r] = <[Vec<f64>; 2]>::try_from(samples)
        .map_err(|_| anyhow::anyhow!("the inner measurement printed no samples: {text}"))?;
    push(&mut launch_table, csv, "launch to exit", nodes, s, r);
    Ok(vec![start_table, launch_table])
}

fn push(table: &mut Table, csv: &mut Csv, what: &str, nodes: u32, storm: Vec<f64>, srun: Vec<f64>) {
    let (s, r) = (Samples::from_secs(storm), Samples::from_secs(srun));
    let ratio = s.median() / r.median();
    table.push(vec![
        what.into(),
        fmt_time(s.median()),
        fmt_time(r.median()),
        format!("{ratio:.2}"),
    ]);
    csv.push(vec![
        what.into(),
        nodes.to_string(),
        s.len().to_string(),
        format!("{:.6}", s.median()),
        format!("{:.6}", r.median()),
        format!("{ratio:.3}"),
    ]);
}

/// Inner mode, the instance's command: launches timed both ways, printed as two lines of
/// samples (`samples S1 S2 ...`: storm-submit's, then srun's).
pub fn inner(bin: &Path, runs: usize) -> Result<()> {
    let nodes = allocation_nodes()?;
    let submit: PathBuf = bin.join("storm-submit");
    let storm_job = || {
        let mut c = Command::new(&submit);
        c.args(["-N", &nodes.to_string(), "/bin/true"]);
        c
    };
    timed(storm_job())?;
    timed(srun(nodes, "/bin/true"))?;
    let (mut s, mut r) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        s.push(timed(storm_job())?.1.as_secs_f64());
        r.push(timed(srun(nodes, "/bin/true"))?.1.as_secs_f64());
    }
    let line = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.6}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("samples {}", line(&s));
    println!("samples {}", line(&r));
    Ok(())
}
