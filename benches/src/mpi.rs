//! `storm-bench mpi`: MPI wire-up under storm against MPICH's own launcher, Hydra.
//!
//! One program, built with `mpicc`, measures in every rank the time from just before
//! `MPI_Init` to the return of the first `MPI_Barrier` (the wire-up: PMI init, the business
//! card exchange through the key space, the first connections) and reports the largest over
//! the ranks. It runs with `ppn` ranks on each of N nodes:
//!
//! * under storm: an embedded cluster of exactly N nodes (storm-mm and N storm-nm processes
//!   over tcp on loopback), `storm-submit --mpi both`;
//! * under Hydra, in the same run on the same host: `mpiexec -launcher fork -hosts h0,...`,
//!   one Hydra proxy per pretend host, so MPICH sees N nodes as it does under storm.
//!
//! Both the wire-up and the end-to-end time (submission to the job's result) are reported,
//! with storm's as a ratio of Hydra's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::submit::{self, Progress};
use storm_cluster::control::{Client, JobRequest};
use storm_cluster::messages::{MpiMode, Stream};
use storm_cluster::tasks::TaskRequest;

use crate::report::{Csv, Table};
use crate::stats::{Samples, fmt_time};

pub struct MpiArgs {
    pub nodes: Vec<u32>,
    pub ppn: u32,
    pub runs: usize,
    pub timeslice_ms: f64,
}

pub const CSV_HEADER: &[&str] = &[
    "nodes",
    "ranks",
    "runs",
    "storm_wireup_s",
    "hydra_wireup_s",
    "wireup_ratio",
    "storm_end_to_end_s",
    "hydra_end_to_end_s",
    "end_to_end_ratio",
];

const PROGRAM: &str = r#"/* storm-bench mpi: MPI_Init to the first barrier, the largest over the ranks */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    double start = now(), mine, worst = 0;
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    mine = now() - start;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("wireup %.9f\n", worst);
    MPI_Finalize();
    return 0;
}
"#;

/// MPICH's `tool`: `tool.mpich` where Debian's alternatives installed it so (plain `tool` may
/// be Open MPI's), else `tool`.
fn mpich_tool(tool: &str) -> String {
    let named = format!("{tool}.mpich");
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(&named).is_file()));
    if found { named } else { tool.to_string() }
}

/// Builds the wire-up program with MPICH's compiler wrapper.
fn build_program(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("wireup.c");
    let bin = dir.join("wireup");
    std::fs::write(&src, PROGRAM)?;
    let status = Command::new(mpich_tool("mpicc"))
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .context("running mpicc (install MPICH: apt-get install mpich libmpich-dev)")?;
    if !status.success() {
        bail!("mpicc failed to build the wire-up program");
    }
    Ok(bin)
}

/// The `wireup <seconds>` line rank 0 prints.
fn parse_wireup(stdout: &[u8]) -> Result<f64> {
    let text = String::from_utf8_lossy(stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("wireup ")?.trim().parse().ok())
        .with_context(|| format!("the program printed no wire-up time: {text:?}"))
}

struct Sample {
    wireup: f64,
    end_to_end: f64,
}

/// Keeps the job's standard output.
#[derive(Default)]
struct Stdout(Vec<u8>);

impl Progress for Stdout {
    fn output(&mut self, _rank: u32, stream: Stream, data: &[u8]) {
        if stream == Stream::Stdout {
            self.0.extend_from_slice(data);
        }
    }
}

fn storm_once(cluster: &LocalCluster, program: &Path, nodes: u32, ppn: u32) -> Result<Sample> {
    let client = Client::connect(cluster.socket()).map_err(anyhow::Error::msg)?;
    let req = JobRequest {
        tasks: TaskRequest {
            nodes: Some(nodes),
            ntasks: Some(nodes * ppn),
            ..TaskRequest::default()
        },
        delivery: storm_cluster::control::Delivery::InPlace,
        mpi: MpiMode::Both,
        ..JobRequest::new("wireup", program.to_path_buf(), std::env::temp_dir())
    };
    let mut out = Stdout::default();
    let start = Instant::now();
    let (outcome, _, _) =
        submit::run_job(client, req, None, &mut out).map_err(anyhow::Error::msg)?;
    let end_to_end = start.elapsed().as_secs_f64();
    if outcome.exit_code() != 0 {
        bail!("the wire-up program failed under storm: {outcome:?}");
    }
    Ok(Sample {
        wireup: parse_wireup(&out.0)?,
        end_to_end,
    })
}

fn hydra_once(program: &Path, nodes: u32, ppn: u32) -> Result<Sample> {
    let hosts: Vec<String> = (0..nodes).map(|i| format!("storm-bench-h{i}")).collect();
    let start = Instant::now();
    let out = Command::new(mpich_tool("mpiexec"))
        .args(["-launcher", "fork", "-hosts", &hosts.join(",")])
        .args(["-ppn", &ppn.to_string(), "-n", &(nodes * ppn).to_string()])
        .arg(program)
        .output()
        .context("running mpiexec (install MPICH: apt-get install mpich)")?;
    let end_to_end = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "the wire-up program failed under mpiexec: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Sample {
        wireup: parse_wireup(&out.stdout)?,
        end_to_end,
    })
}

pub fn run(args: &MpiArgs, csv: &mut Csv) -> Result<Table> {
    let work = tempfile::Builder::new()
        .prefix("storm-bench-mpi-")
        .tempdir()?;
    let program = build_program(work.path())?;
    let mut table = Table::new(
        format!(
            "MPI wire-up (MPI_Init to the first barrier, largest over the ranks) and end to end, \
             {} rank(s) per node, median of {} runs: storm-submit on an N-node embedded tcp cluster \
             (timeslice {} ms) against Hydra (mpiexec -launcher fork, N pretend hosts), same run",
            args.ppn, args.runs, args.timeslice_ms
        ),
        &[
            "N",
            "ranks",
            "storm wire-up",
            "Hydra wire-up",
            "ratio",
            "storm end to end",
            "Hydra end to end",
            "ratio",
        ],
    );
    for &n in &args.nodes {
        let cluster = LocalCluster::start(&LocalOptions {
            timeslice_ms: args.timeslice_ms,
            ..LocalOptions::new(n)
        })?;
        storm_once(&cluster, &program, n, args.ppn)?; // warm-up: page cache, connections
        hydra_once(&program, n, args.ppn)?;
        // Interleaved, so that a noisy moment of the machine falls on both.
        let (mut storm, mut hydra) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            storm.push(storm_once(&cluster, &program, n, args.ppn)?);
            hydra.push(hydra_once(&program, n, args.ppn)?);
        }
        cluster.shutdown()?;
        let median = |samples: &[Sample], f: fn(&Sample) -> f64| {
            Samples::from_secs(samples.iter().map(f).collect()).median()
        };
        let s_wire = median(&storm, |s| s.wireup);
        let h_wire = median(&hydra, |s| s.wireup);
        let s_e2e = median(&storm, |s| s.end_to_end);
        let h_e2e = median(&hydra, |s| s.end_to_end);
        let ranks = n * args.ppn;
        table.push(vec![
            n.to_string(),
            ranks.to_string(),
            fmt_time(s_wire),
            fmt_time(h_wire),
            format!("{:.2}", s_wire / h_wire),
            fmt_time(s_e2e),
            fmt_time(h_e2e),
            format!("{:.2}", s_e2e / h_e2e),
        ]);
        csv.push(vec![
            n.to_string(),
            ranks.to_string(),
            args.runs.to_string(),
            format!("{s_wire:.6}"),
            format!("{h_wire:.6}"),
            format!("{:.4}", s_wire / h_wire),
            format!("{s_e2e:.6}"),
            format!("{h_e2e:.6}"),
            format!("{:.4}", s_e2e / h_e2e),
        ]);
        eprintln!("  measured N = {n}");
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wireup_line_is_found_among_other_output() {
        assert_eq!(parse_wireup(b"hello\nwireup 0.125000000\n").unwrap(), 0.125);
        let err = parse_wireup(b"no such line\n").unwrap_err().to_string();
        assert!(err.contains("no wire-up time"), "{err}");
    }
}
