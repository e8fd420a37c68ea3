//! `storm-bench hpcc`: a real MPI application, HPC Challenge (Debian's `hpcc`, built with Open
//! MPI), under storm and under Open MPI's own `mpirun`, interleaved, on this host.
//!
//! Each run starts hpcc with R ranks on one node, from a fresh working directory holding an
//! `hpccinf.txt` sized by `--n` (HPL's matrix order; a P x Q grid as square as R allows), and
//! reads the figures hpcc writes to `hpccoutf.txt`:
//!
//! * under storm: an embedded one-node tcp cluster, `storm-submit -n R` with no `--mpi` flag
//!   and no `OMPI_MCA_*` variable, as a user types it;
//! * under `mpirun -np R` (with `--oversubscribe` when R exceeds the host's CPUs, as a user
//!   must pass it), in the same run, alternating with storm's.
//!
//! A run under either whose `CommWorldProcs` is not R (a world of singletons) is an error,
//! not a figure. The table gives each figure's median under both and storm's ratio, stated so
//! that above 1 always means storm is slower.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::submit::{self, Progress};
use storm_cluster::control::{Client, JobRequest};
use storm_cluster::messages::Stream;
use storm_cluster::tasks::TaskRequest;

use crate::report::{Csv, Table};
use crate::stats::Samples;

pub struct HpccArgs {
    /// Ranks, all on one node.
    pub ranks: u32,
    /// HPL's matrix order.
    pub n: u32,
    pub runs: usize,
    pub timeslice_ms: f64,
    pub program: PathBuf,
    pub mpirun: String,
}

pub const CSV_HEADER: &[&str] = &[
    "figure", "unit", "ranks", "runs", "storm", "mpirun", "ratio",
];

/// A figure hpcc reports: its key in `hpccoutf.txt`, what it is, its unit, and whether more
/// is better (a rate) or worse (a time).
struct Figure {
    key: &'static str,
    name: &'static str,
    unit: &'static str,
    higher_is_better: bool,
}

const FIGURES: &[Figure] = &[
    Figure {
        key: "HPL_Tflops",
        name: "HPL",
        unit: "Gflop/s",
        higher_is_better: true,
    },
    Figure {
        key: "StarDGEMM_Gflops",
        name: "DGEMM (each rank)",
        unit: "Gflop/s",
        higher_is_better: true,
    },
    Figure {
        key: "PTRANS_GBs",
        name: "PTRANS",
        unit: "GB/s",
        higher_is_better: true,
    },
    Figure {
        key: "MPIFFT_Gflops",
        name: "MPI FFT",
        unit: "Gflop/s",
        higher_is_better: true,
    },
    Figure {
        key: "MPIRandomAccess_GUPs",
        name: "MPI RandomAccess",
        unit: "GUP/s",
        higher_is_better: true,
    },
    Figure {
        key: "AvgPingPongLatency_usec",
        name: "ping-pong latency",
        unit: "us",
        higher_is_better: false,
    },
    Figure {
        key: "AvgPingPongBandwidth_GBytes",
        name: "ping-pong bandwidth",
        unit: "GB/s",
        higher_is_better: true,
    },
];

/// The `hpccinf.txt` for `ranks` ranks and matrix order `n`: Debian's example with one
/// problem size, block size 80 and a P x Q grid, P <= Q, as square as `ranks` allows.
fn input(ranks: u32, n: u32) -> String {
    let p = (1..=ranks)
        .filter(|p| ranks % p == 0 && p * p <= ranks)
        .max()
        .unwrap_or(1);
    let q = ranks / p;
    format!(
        "HPLinpack benchmark input file (storm-bench hpcc)\n\
         Innovative Computing Laboratory, University of Tennessee\n\
         HPL.out      output file name (if any)\n\
         8            device out (6=stdout,7=stderr,file)\n\
         1            # of problems sizes (N)\n\
         {n}         Ns\n\
         1            # of NBs\n\
         80           NBs\n\
         0            PMAP process mapping (0=Row-,1=Column-major)\n\
         1            # of process grids (P x Q)\n\
         {p}            Ps\n\
         {q}            Qs\n\
         16.0         threshold\n\
         1            # of panel fact\n\
         2            PFACTs (0=left, 1=Crout, 2=Right)\n\
         1            # of recursive stopping criterium\n\
         4            NBMINs (>= 1)\n\
         1            # of panels in recursion\n\
         2            NDIVs\n\
         1            # of recursive panel fact.\n\
         1            RFACTs (0=left, 1=Crout, 2=Right)\n\
         1            # of broadcast\n\
         1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)\n\
         1            # of lookahead depth\n\
         1            DEPTHs (>=0)\n\
         2            SWAP (0=bin-exch,1=long,2=mix)\n\
         64           swapping threshold\n\
         0            L1 in (0=transposed,1=no-transposed) form\n\
         0            U  in (0=transposed,1=no-transposed) form\n\
         1            Equilibration (0=no,1=yes)\n\
         8            memory alignment in double (> 0)\n\
         ##### This line (no. 32) is ignored (it serves as a separator). ######\n\
         0                      \t\tNumber of additional problem sizes for PTRANS\n\
         1200 10000 30000        \tvalues of N\n\
         0                       \tnumber of additional blocking sizes for PTRANS\n\
         40 9 8 13 13 20 16 32 64       \tvalues of NB\n"
    )
}

/// One run's figures, by [`FIGURES`] order, and its wall time.
struct Run {
    figures: Vec<f64>,
    wall: f64,
}

/// The figures of `hpccoutf.txt` (`text`), checked to come from a world of `ranks`.
fn parse_output(text: &str, ranks: u32) -> Result<Vec<f64>> {
    let value = |key: &str| -> Option<f64> {
        text.lines()
            .filter_map(|l| l.trim().split_once('='))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.trim().parse().ok())
    };
    let world = value("CommWorldProcs")
        .context("hpccoutf.txt names no CommWorldProcs: hpcc did not finish")?;
    if world != f64::from(ranks) {
        bail!(
            "hpcc ran in a world of {world} processes, not {ranks}: its ranks did not find each other"
        );
    }
    FIGURES
        .iter()
        .map(|f| {
            let v = value(f.key).with_context(|| format!("hpccoutf.txt has no {}", f.key))?;
            // HPL is reported in Tflop/s; the table shows Gflop/s.
            Ok(if f.key == "HPL_Tflops" { v * 1e3 } else { v })
        })
        .collect()
}

/// A fresh working directory for one run, readable and writable by the job's user.
fn fresh_dir(work: &Path, name: &str, args: &HpccArgs) -> Result<PathBuf> {
    let dir = work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir)?;
    std::fs::write(dir.join("hpccinf.txt"), input(args.ranks, args.n))?;
    Ok(dir)
}

fn read_output(dir: &Path, ranks: u32, under: &str) -> Result<Vec<f64>> {
    let text = std::fs::read_to_string(dir.join("hpccoutf.txt"))
        .with_context(|| format!("hpcc under {under} wrote no hpccoutf.txt"))?;
    parse_output(&text, ranks).with_context(|| format!("hpcc under {under}"))
}

/// Keeps the job's standard error, for the error of a failed run.
#[derive(Default)]
struct Stderr(Vec<u8>);

impl Progress for Stderr {
    fn output(&mut self, _rank: u32, stream: Stream, data: &[u8]) {
        if stream == Stream::Stderr && self.0.len() < 64 * 1024 {
            self.0.extend_from_slice(data);
        }
    }
}

fn storm_once(cluster: &LocalCluster, work: &Path, args: &HpccArgs, cpus: u32) -> Result<Run> {
    let dir = fresh_dir(work, "storm", args)?;
    let client = Client::connect(cluster.socket()).map_err(anyhow::Error::msg)?;
    let req = JobRequest {
        tasks: TaskRequest {
            nodes: Some(1),
            ntasks: Some(args.ranks),
            overcommit: args.ranks > cpus,
            ..TaskRequest::default()
        },
        delivery: storm_cluster::control::Delivery::InPlace,
        ..JobRequest::new("hpcc", args.program.clone(), dir.clone())
    };
    let mut err = Stderr::default();
    let start = Instant::now();
    let (outcome, _, _) =
        submit::run_job(client, req, None, &mut err).map_err(anyhow::Error::msg)?;
    let wall = start.elapsed().as_secs_f64();
    if outcome.exit_code() != 0 {
        bail!(
            "hpcc failed under storm: {outcome:?}\n{}",
            String::from_utf8_lossy(&err.0)
        );
    }
    Ok(Run {
        figures: read_output(&dir, args.ranks, "storm")?,
        wall,
    })
}

fn mpirun_once(work: &Path, args: &HpccArgs, cpus: u32) -> Result<Run> {
    let dir = fresh_dir(work, "mpirun", args)?;
    let mut cmd = Command::new(&args.mpirun);
    cmd.current_dir(&dir).args(["-np", &args.ranks.to_string()]);
    if args.ranks > cpus {
        cmd.arg("--oversubscribe");
    }
    if nix::unistd::geteuid().is_root() {
        cmd.arg("--allow-run-as-root");
    }
    let start = Instant::now();
    let out = cmd
        .arg(&args.program)
        .output()
        .with_context(|| format!("running {} (install openmpi-bin)", args.mpirun))?;
    let wall = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "hpcc failed under mpirun ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Run {
        figures: read_output(&dir, args.ranks, "mpirun")?,
        wall,
    })
}

/// Storm's figure as a ratio to mpirun's, above 1 when storm is slower.
fn slowdown(storm: f64, mpirun: f64, higher_is_better: bool) -> f64 {
    if higher_is_better {
        mpirun / storm
    } else {
        storm / mpirun
    }
}

pub fn run(args: &HpccArgs, csv: &mut Csv) -> Result<Table> {
    if !args.program.is_file() {
        bail!(
            "{} not found (install Debian's hpcc: apt-get install hpcc)",
            args.program.display()
        );
    }
    let work = tempfile::Builder::new()
        .prefix("storm-bench-hpcc-")
        .tempdir()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let cluster = LocalCluster::start(&LocalOptions {
        timeslice_ms: args.timeslice_ms,
        ..LocalOptions::new(1)
    })?;
    // Warm-up: page cache, libraries.
    storm_once(&cluster, work.path(), args, cpus)?;
    mpirun_once(work.path(), args, cpus)?;
    // Interleaved, so that a noisy moment of the machine falls on both.
    let (mut storm, mut mpirun) = (Vec::new(), Vec::new());
    for i in 0..args.runs {
        storm.push(storm_once(&cluster, work.path(), args, cpus)?);
        mpirun.push(mpirun_once(work.path(), args, cpus)?);
        eprintln!("  run {} of {}", i + 1, args.runs);
    }
    cluster.shutdown()?;
    let mut table = Table::new(
        format!(
            "HPC Challenge ({}, N = {}) with {} ranks on one node, median of {} runs: \
             storm-submit -n {} on an embedded one-node cluster (no --mpi, no OMPI_MCA_*) \
             against {} -np {}, interleaved; ratio above 1: storm slower",
            args.program.display(),
            args.n,
            args.ranks,
            args.runs,
            args.ranks,
            args.mpirun,
            args.ranks
        ),
        &["figure", "unit", "storm", "mpirun", "ratio"],
    );
    let median = |v: Vec<f64>| Samples::from_secs(v).median();
    let mut rows: Vec<(String, &str, f64, f64, f64)> = FIGURES
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let s = median(storm.iter().map(|r| r.figures[i]).collect());
            let m = median(mpirun.iter().map(|r| r.figures[i]).collect());
            (
                f.name.to_string(),
                f.unit,
                s,
                m,
                slowdown(s, m, f.higher_is_better),
            )
        })
        .collect();
    let s = median(storm.iter().map(|r| r.wall).collect());
    let m = median(mpirun.iter().map(|r| r.wall).collect());
    rows.push(("whole run, wall time".into(), "s", s, m, s / m));
    for (name, unit, s, m, ratio) in rows {
        table.push(vec![
            name.clone(),
            unit.to_string(),
            format!("{s:.4}"),
            format!("{m:.4}"),
            format!("{ratio:.2}"),
        ]);
        csv.push(vec![
            name,
            unit.to_string(),
            args.ranks.to_string(),
            args.runs.to_string(),
            format!("{s:.6}"),
            format!("{m:.6}"),
            format!("{ratio:.4}"),
        ]);
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "Begin of Summary section.\nVersionMajor=1\nCommWorldProcs=2\n\
        HPL_Tflops=0.00657099\nStarDGEMM_Gflops=3.43709\nPTRANS_GBs=1.5\n\
        MPIRandomAccess_GUPs=0.0393776\nMPIFFT_Gflops=3.77644\n\
        AvgPingPongLatency_usec=0.240991\nAvgPingPongBandwidth_GBytes=6.6297\n\
        End of Summary section.\n";

    #[test]
    fn the_summary_gives_every_figure_with_hpl_in_gflops() {
        let got = parse_output(OUTPUT, 2).unwrap();
        assert_eq!(got.len(), FIGURES.len());
        assert!(
            (got[0] - 6.57099).abs() < 1e-9,
            "HPL in Gflop/s: {}",
            got[0]
        );
        assert_eq!(got[5], 0.240991);
    }

    #[test]
    fn a_world_of_singletons_is_an_error_not_a_figure() {
        let err = parse_output(&OUTPUT.replace("CommWorldProcs=2", "CommWorldProcs=1"), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a world of 1 processes, not 2"), "{err}");
        let err = parse_output("HPL_Tflops=1\n", 2).unwrap_err().to_string();
        assert!(err.contains("did not finish"), "{err}");
    }

    #[test]
    fn the_grid_is_as_square_as_the_ranks_allow() {
        let grid = |r| {
            let text = input(r, 1000);
            let get = |what: &str| {
                text.lines()
                    .find(|l| l.ends_with(what))
                    .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok())
                    .unwrap()
            };
            (get("Ps"), get("Qs"))
        };
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(2), (1, 2));
        assert_eq!(grid(4), (2, 2));
        assert_eq!(grid(6), (2, 3));
        assert_eq!(grid(7), (1, 7));
    }

    #[test]
    fn a_ratio_above_one_means_storm_is_slower_for_rates_and_times() {
        assert_eq!(slowdown(2.0, 4.0, true), 2.0);
        assert_eq!(slowdown(4.0, 2.0, false), 2.0);
    }
}
