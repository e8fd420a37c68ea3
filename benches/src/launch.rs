//! `storm-bench launch`: the paper's Fig. 2a on this machine.
//!
//! A do-nothing program padded to 4, 8 and 12 MB with a static array is launched on 1..32
//! nodes of an embedded cluster (storm-mm and N storm-nm processes over the tcp backend on
//! loopback, a cluster of exactly N nodes, 1 ms timeslice). For each launch the MM reports the
//! send time (nodes allocated to program verified on every node) and the execute time (launch
//! heartbeat to termination detected); storm-submit's side gives the end-to-end time from
//! submission to the job's result.
//!
//! Two floors, measured in the same run (with no cluster running, so the cluster's heartbeats
//! do not slow them):
//!
//! - the floor: copy the program into N directories, then fork/exec the N copies and wait for
//!   all of them. That is the least any launcher on one host must do.
//! - the TCP floor: send the program over N loopback TCP connections at once, each receiver
//!   writing it into its own directory, then fork/exec the N copies. That is the least a
//!   launcher must do whose nodes receive the program over the network, as storm's do (every
//!   node takes the whole program in once, whatever the tree), and it tells the cost of the
//!   link apart from the cost of storm's protocol.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::submit::{self, Progress};
use storm_cluster::control::{Client, JobRequest, Timing};
use storm_cluster::messages::MpiMode;
use storm_cluster::tasks::TaskRequest;

use crate::mm_metrics::{CountSum, MmMetrics};
use crate::report::{Csv, Table};
use crate::stats::{Budget, fmt_time, mb_per_s};

pub struct LaunchArgs {
    pub nodes: Vec<u32>,
    pub sizes_mb: Vec<u32>,
    pub runs: usize,
    pub timeslice_ms: f64,
    pub chunk_kb: Option<usize>,
    pub slots: Option<usize>,
    pub fanout: Option<usize>,
    pub backend: storm_cluster::config::BackendKind,
    pub provider: Option<String>,
    /// What PMI the do-nothing job is served (`storm-submit --mpi`; auto by default, as
    /// users run).
    pub mpi: storm_cluster::messages::MpiMode,
}

pub const CSV_HEADER: &[&str] = &[
    "size_mb",
    "nodes",
    "runs",
    "send_s",
    "execute_s",
    "mm_total_s",
    "end_to_end_s",
    "floor_s",
    "ratio",
    "tcp_floor_s",
    "tcp_ratio",
    "protected_floor_s",
    "protected_ratio",
];

/// Builds the padded do-nothing program with the C compiler.
fn build_program(dir: &Path, mb: u32) -> Result<PathBuf> {
    let src = dir.join(format!("donothing{mb}.c"));
    let bin = dir.join(format!("donothing{mb}"));
    std::fs::write(
        &src,
        format!(
            "/* storm-bench launch: a program that does nothing, padded with a static array */\n\
             __attribute__((used)) static const volatile char pad[{bytes}] = {{ 1 }};\n\
             int main(void) {{ return pad[0] - 1; }}\n",
            bytes = mb as usize * 1024 * 1024 - 16 * 1024
        ),
    )?;
    let status = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .context("running cc (install a C compiler: apt-get install build-essential)")?;
    if !status.success() {
        bail!("cc failed to build the {mb} MB program");
    }
    let size = std::fs::metadata(&bin)?.len();
    let want = mb as u64 * 1024 * 1024;
    if size < want - 64 * 1024 || size > want + 64 * 1024 {
        bail!("the {mb} MB program came out at {size} bytes (did the compiler drop the array?)");
    }
    Ok(bin)
}

/// Follows a job without showing anything.
pub(crate) struct Quiet;
impl Progress for Quiet {}

struct Sample {
    send: f64,
    execute: f64,
    mm_total: f64,
    end_to_end: f64,
    /// The MM's account of the job's phases.
    timing: Timing,
}

fn launch_once(cluster: &LocalCluster, program: &Path, n: u32, mpi: MpiMode) -> Result<Sample> {
    let client = Client::connect(cluster.socket()).map_err(anyhow::Error::msg)?;
    let file = File::open(program)?;
    let req = JobRequest {
        tasks: TaskRequest {
            nodes: Some(n),
            ntasks: Some(n),
            ..TaskRequest::default()
        },
        delivery: storm_cluster::control::Delivery::Broadcast,
        mpi,
        ..JobRequest::new("donothing", program.to_path_buf(), std::env::temp_dir())
    };
    let start = Instant::now();
    let (outcome, _, _) =
        submit::run_job(client, req, Some(&file), &mut Quiet).map_err(anyhow::Error::msg)?;
    let end_to_end = start.elapsed().as_secs_f64();
    if outcome.exit_code() != 0 {
        bail!("the do-nothing program failed: {outcome:?}");
    }
    let t = outcome.timing;
    Ok(Sample {
        send: t.send_us as f64 / 1e6,
        execute: t.execute_us as f64 / 1e6,
        mm_total: t.total_us as f64 / 1e6,
        end_to_end,
        timing: t,
    })
}

/// Copies the program into `n` directories and runs the copies, as fast as one host can.
fn floor_once(dir: &Path, program: &Path, n: u32) -> Result<f64> {
    let dirs = fresh_dirs(dir, "floor", n)?;
    let start = Instant::now();
    let copies = dirs
        .iter()
        .map(|d| {
            let dest = d.join("prog");
            std::fs::copy(program, &dest).map(|_| dest)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    run_all(&copies)?;
    let took = start.elapsed().as_secs_f64();
    remove_dirs(&dirs);
    Ok(took)
}

/// Sends the program over `n` loopback TCP connections at once into `n` directories, and runs
/// the copies: the floor of a launch whose nodes receive the program over the network.
fn tcp_floor_once(dir: &Path, program: &Path, n: u32) -> Result<f64> {
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    let dirs = fresh_dirs(dir, "tcp", n)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let start = Instant::now();
    let receivers: Vec<_> = dirs
        .iter()
        .map(|d| {
            let dest = d.join("prog");
            let conn = std::net::TcpStream::connect(addr);
            std::thread::spawn(move || -> std::io::Result<PathBuf> {
                let mut conn = conn?;
                let mut file = File::create(&dest)?;
                let mut buf = vec![0u8; 512 * 1024];
                loop {
                    let got = conn.read(&mut buf)?;
                    if got == 0 {
                        break;
                    }
                    file.write_all(&buf[..got])?;
                }
                file.set_permissions(std::fs::Permissions::from_mode(0o755))?;
                Ok(dest)
            })
        })
        .collect();
    let senders: Vec<_> = (0..n)
        .map(|_| {
            let (conn, _) = listener.accept()?;
            let program = program.to_path_buf();
            Ok(std::thread::spawn(move || -> std::io::Result<()> {
                let mut conn = conn;
                std::io::copy(&mut File::open(program)?, &mut conn)?;
                Ok(())
            }))
        })
        .collect::<std::io::Result<_>>()?;
    for s in senders {
        s.join().expect("sender thread")?;
    }
    let copies = receivers
        .into_iter()
        .map(|r| r.join().expect("receiver thread"))
        .collect::<std::io::Result<Vec<_>>>()?;
    run_all(&copies)?;
    let took = start.elapsed().as_secs_f64();
    remove_dirs(&dirs);
    Ok(took)
}

/// `n` empty directories `{prefix}0`.. under `dir`.
fn fresh_dirs(dir: &Path, prefix: &str, n: u32) -> Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("{prefix}{i}"))).collect();
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
    }
    Ok(dirs)
}

fn remove_dirs(dirs: &[PathBuf]) {
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Runs every copy at once and waits for all of them.
fn run_all(copies: &[PathBuf]) -> Result<()> {
    let children = copies
        .iter()
        .map(|p| Command::new(p).spawn())
        .collect::<std::io::Result<Vec<_>>>()?;
    for mut c in children {
        c.wait()?;
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The MM's metrics of program transfers: its send times and their parts.
struct SendParts {
    send: CountSum,
    delivered: CountSum,
    answered: CountSum,
}

impl SendParts {
    fn now(socket: &Path) -> Result<Self> {
        let m = MmMetrics::fetch(socket)?;
        Ok(Self {
            send: m.histogram("storm_launch_send_seconds"),
            delivered: m.histogram("storm_transfer_delivered_seconds"),
            answered: m.histogram("storm_transfer_answered_seconds"),
        })
    }

    fn since(&self, earlier: &Self) -> Self {
        Self {
            send: self.send.since(earlier.send),
            delivered: self.delivered.since(earlier.delivered),
            answered: self.answered.since(earlier.answered),
        }
    }
}

/// The launch table, the phase table of the same launches, and what the program's bytes
/// cost on their own on this host (copy, hash, seal, loopback TCP), measured in the same run.
/// Each point's phases go to `records` for the regression check.
pub fn run(
    args: &LaunchArgs,
    csv: &mut Csv,
    records: &mut Vec<crate::regress::Record>,
) -> Result<Vec<Table>> {
    let work = tempfile::Builder::new()
        .prefix("storm-bench-launch-")
        .tempdir()?;
    let programs: Vec<(u32, PathBuf)> = args
        .sizes_mb
        .iter()
        .map(|&mb| build_program(work.path(), mb).map(|p| (mb, p)))
        .collect::<Result<_>>()?;
    let chunk = args
        .chunk_kb
        .map(|k| k * 1024)
        .unwrap_or(storm_cluster::config::ClusterSection::default().transfer_chunk_bytes);
    let costs: Vec<ByteCosts> = args
        .sizes_mb
        .iter()
        .map(|&mb| ByteCosts::measure(mb, chunk))
        .collect::<Result<_>>()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut table = Table::new(
        format!(
            "Job launch (paper Fig. 2a): do-nothing program on N nodes of an N-node embedded {:?} cluster{}, \
             --mpi {}, timeslice {} ms, median of {} runs; floor: cp into N dirs + fork/exec of the N copies; \
             TCP floor: the program over N loopback TCP connections into N dirs + fork/exec; \
             protected floor: the floor plus the AES-GCM and BLAKE3 passes the defaults need \
             (2N seals and opens, N + 1 hashes, each at its own rate measured below) over the \
             host's {} CPUs; same run",
            args.backend,
            args.provider
                .as_ref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default(),
            args.mpi.name(),
            args.timeslice_ms,
            args.runs,
            cpus
        ),
        &[
            "size",
            "N",
            "send",
            "execute",
            "MM total",
            "end to end",
            "floor",
            "ratio",
            "TCP floor",
            "ratio",
            "protected floor",
            "ratio",
        ],
    );
    let mut phases = crate::phases::table(
        format!(
            "Where each launch's time went, phase by phase (median over the runs): {}",
            crate::phases::LEGEND
        ),
        "size, N",
    );
    let mut send_table = Table::new(
        "The send phase (program sent and checked on every node; means over the runs, from \
         the MM's metrics): the transfer's worker started to every chunk delivered to every \
         node (the program read, hashed and sent; its rate per node), then to every node's \
         answer (its last write, its size, checksum and hash checks, its file closed), and \
         the MM's own part (the worker's start, its look at the answers)",
        &[
            "size",
            "N",
            "send",
            "delivered",
            "MB/s",
            "answered",
            "MM's part",
        ],
    );
    for &n in &args.nodes {
        // The floor is measured with no cluster running (half before, half after), so the
        // cluster's own heartbeats do not slow it down.
        let mut floors: Vec<Vec<(f64, f64)>> = vec![Vec::new(); programs.len()];
        let floor_runs = |floors: &mut Vec<Vec<(f64, f64)>>, runs: usize| -> Result<()> {
            for (i, (_, program)) in programs.iter().enumerate() {
                for _ in 0..runs {
                    floors[i].push((
                        floor_once(work.path(), program, n)?,
                        tcp_floor_once(work.path(), program, n)?,
                    ));
                }
            }
            Ok(())
        };
        floor_runs(&mut floors, args.runs.div_ceil(2))?;
        let cluster = LocalCluster::start(&LocalOptions {
            timeslice_ms: args.timeslice_ms,
            transfer_chunk_bytes: args.chunk_kb.map(|k| k * 1024),
            transfer_slots: args.slots,
            fanout: args.fanout,
            backend: args.backend,
            provider: args.provider.clone(),
            ..LocalOptions::new(n)
        })?;
        let mut launches: Vec<Vec<Sample>> = Vec::new();
        let mut sends: Vec<SendParts> = Vec::new();
        for (_, program) in &programs {
            launch_once(&cluster, program, n, args.mpi)?; // warm-up: page cache, connections
            let before = SendParts::now(cluster.socket())?;
            let mut samples = Vec::new();
            for _ in 0..args.runs {
                samples.push(launch_once(&cluster, program, n, args.mpi)?);
            }
            launches.push(samples);
            sends.push(SendParts::now(cluster.socket())?.since(&before));
        }
        cluster.shutdown()?;
        std::thread::sleep(Duration::from_millis(100));
        floor_runs(&mut floors, args.runs / 2)?;
        for (((((mb, _), samples), floors), parts), cost) in programs
            .iter()
            .zip(launches)
            .zip(floors)
            .zip(sends)
            .zip(&costs)
        {
            let send = median(samples.iter().map(|s| s.send).collect());
            let execute = median(samples.iter().map(|s| s.execute).collect());
            let mm_total = median(samples.iter().map(|s| s.mm_total).collect());
            let e2e = median(samples.iter().map(|s| s.end_to_end).collect());
            let tcp_floor = median(floors.iter().map(|f| f.1).collect());
            let floor = median(floors.iter().map(|f| f.0).collect());
            let protected = floor + cost.protections(n, cpus);
            let timings: Vec<Timing> = samples.iter().map(|s| s.timing).collect();
            phases.push(crate::phases::row(format!("{mb} MB, {n}"), &timings, e2e));
            let (send_mean, delivered, answered) = (
                parts.send.mean(),
                parts.delivered.mean(),
                parts.answered.mean(),
            );
            send_table.push(vec![
                format!("{mb} MB"),
                n.to_string(),
                fmt_time(send_mean),
                fmt_time(delivered),
                format!("{:.0}", mb_per_s(*mb as usize * 1024 * 1024, delivered)),
                fmt_time(answered),
                fmt_time(send_mean - delivered - answered),
            ]);
            records.push(crate::phases::record(
                format!(
                    "launch-{mb}MB-{n}N-{:?}-{}-mpi-{}",
                    args.backend,
                    args.provider.as_deref().unwrap_or("default"),
                    args.mpi.name()
                ),
                "cp+fork floor",
                floor,
                &timings,
                e2e,
            ));
            table.push(vec![
                format!("{mb} MB"),
                n.to_string(),
                fmt_time(send),
                fmt_time(execute),
                fmt_time(mm_total),
                fmt_time(e2e),
                fmt_time(floor),
                format!("{:.2}", e2e / floor),
                fmt_time(tcp_floor),
                format!("{:.2}", e2e / tcp_floor),
                fmt_time(protected),
                format!("{:.2}", e2e / protected),
            ]);
            csv.push(vec![
                mb.to_string(),
                n.to_string(),
                args.runs.to_string(),
                format!("{send:.6}"),
                format!("{execute:.6}"),
                format!("{mm_total:.6}"),
                format!("{e2e:.6}"),
                format!("{floor:.6}"),
                format!("{:.4}", e2e / floor),
                format!("{tcp_floor:.6}"),
                format!("{:.4}", e2e / tcp_floor),
                format!("{protected:.6}"),
                format!("{:.4}", e2e / protected),
            ]);
        }
        eprintln!("  measured N = {n}");
    }
    Ok(vec![table, phases, send_table, bytes_table(&costs, chunk)])
}

/// What one program size costs on its own on this host, in this run, in seconds (medians).
struct ByteCosts {
    mb: u32,
    memcpy: f64,
    blake3: f64,
    aes_gcm: f64,
    raw_tcp: f64,
}

impl ByteCosts {
    /// One memcpy, one BLAKE3 hash (nodes hash what they receive, the MM what it sends),
    /// AES-256-GCM sealing in the transfer's `chunk`-byte pieces (the tcp backend encrypts
    /// by default), one loopback TCP transfer.
    fn measure(mb: u32, chunk: usize) -> Result<Self> {
        let len = mb as usize * 1024 * 1024;
        let budget = Budget {
            min_samples: 5,
            max_samples: 50,
            time: Duration::from_millis(300),
        };
        Ok(Self {
            mb,
            memcpy: crate::baseline::memcpy(len, budget)?.median(),
            blake3: crate::baseline::blake3(len, budget)?.median(),
            aes_gcm: crate::baseline::aes_gcm(len, chunk, budget)?.median(),
            raw_tcp: crate::baseline::raw_tcp(len, budget)?.median(),
        })
    }

    /// What the protections add to the cp+fork floor at `n` nodes, spread over `cpus`: every
    /// node's link seals and opens the program once (2N AES-GCM passes, forwarding nodes
    /// included), and the MM and every node hash it (N + 1 BLAKE3 passes). On one host all
    /// of it shares the same CPUs; on a real cluster each node pays only its own.
    fn protections(&self, n: u32, cpus: usize) -> f64 {
        let n = f64::from(n);
        (2.0 * n * self.aes_gcm + (n + 1.0) * self.blake3) / cpus.max(1) as f64
    }
}

/// The byte costs as a table.
fn bytes_table(costs: &[ByteCosts], chunk: usize) -> Table {
    let mut table = Table::new(
        format!(
            "The program's bytes on their own, same run (median; MB/s): one memcpy, one \
             BLAKE3 hash, AES-256-GCM sealing in {} KiB chunks, one loopback TCP transfer",
            chunk / 1024
        ),
        &["size", "memcpy", "BLAKE3", "AES-256-GCM", "raw TCP"],
    );
    for c in costs {
        let len = c.mb as usize * 1024 * 1024;
        let cell = |secs: f64| format!("{} ({:.0})", fmt_time(secs), mb_per_s(len, secs));
        table.push(vec![
            format!("{} MB", c.mb),
            cell(c.memcpy),
            cell(c.blake3),
            cell(c.aes_gcm),
            cell(c.raw_tcp),
        ]);
    }
    table
}
