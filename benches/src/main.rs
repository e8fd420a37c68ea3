//! # storm-bench
//!
//! Measures storm the way the STORM paper does, and always beside a baseline measured in the
//! same run on the same machine (memcpy, raw TCP, cp, fork/exec), reported as a ratio: the
//! machines are shared and noisy, ratios travel and absolute times do not.
//!
//! * `storm-bench prims`: the three primitives (latency and bandwidth against nodes and size).
//! * `storm-bench launch`: job launch of a padded do-nothing program (the paper's Fig. 2a).
//! * `storm-bench throughput`: single-task jobs per second from many clients, and their
//!   submit-to-exit latency, beside fork/exec of the same program from as many threads.
//! * `storm-bench gang`: gang scheduling against quantum and MPL, its CPU cost and strobe skew
//!   (the paper's Figs. 3 and 5).
//! * `storm-bench faults`: failure detection latency, rejoin time, tree healing and MM restart.
//! * `storm-bench startup`: daemon start-up, fork/exec to ready, on each backend.
//! * `storm-bench links`: what authenticated and encrypted tcp links cost.
//! * `storm-bench sample`: what one sample of a node costs its NM, as a share of one core.
//! * `storm-bench mpi`: MPI wire-up (`MPI_Init` to the first barrier) against MPICH's Hydra.
//! * `storm-bench fuzz`: the long fuzz run of every decoder (CI runs a bounded one).
//! * `storm-bench scale`: the real MM driving simulated clusters up to 16,384 nodes (storm-sim),
//!   with each figure's growth per 8× nodes.

mod baseline;
mod fabric;
mod failover;
mod faults;
mod federation;
mod fuzz;
mod gang;
mod hpcc;
mod idle;
mod instance_gang;
mod instance_report;
mod launch;
mod lending;
mod links;
mod mm_metrics;
mod mpi;
mod phases;
mod plot;
mod prims;
mod regress;
mod report;
mod sample;
mod scale;
mod start;
mod startup;
mod stats;
mod throughput;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Counts allocations around each fuzz input (`storm-bench fuzz`); elsewhere it only forwards.
#[global_allocator]
static GUARD: storm_fuzz::Guard = storm_fuzz::Guard;
use storm_primitives::tcp::TcpConfig;

#[derive(Parser)]
#[command(
    name = "storm-bench",
    version,
    about = "Microbenchmarks of storm's primitives and RM functions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// XFER-AND-SIGNAL and COMPARE-AND-WRITE against node count and size.
    Prims {
        /// Backends to measure, in one run (e.g. tcp,ofi).
        #[arg(long, value_enum, value_delimiter = ',', default_value = "tcp")]
        backend: Vec<prims::Backend>,
        /// libfabric provider for the ofi backend.
        #[arg(long, default_value = "tcp;ofi_rxm")]
        provider: String,
        /// Destination node counts (the origin is one more node).
        #[arg(long, default_value = "1,2,4,8,16,32", value_parser = report::parse_counts)]
        nodes: std::vec::Vec<u32>,
        /// Transfer sizes (K, M suffixes are powers of 1024).
        #[arg(long, default_value = "8,4K,64K,1M,12M", value_parser = report::parse_sizes)]
        sizes: std::vec::Vec<usize>,
        /// Tree fanout (tcp).
        #[arg(long, default_value_t = 2)]
        fanout: usize,
        /// Chunk size in bytes (tcp).
        #[arg(long, default_value_t = 256 * 1024)]
        chunk_size: usize,
        /// Time spent sampling each measurement, in milliseconds.
        #[arg(long, default_value_t = 300)]
        time_ms: u64,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Also draw the figure (time against nodes, per size, beside the baseline) into this PNG file.
        #[arg(long, value_name = "FILE.png")]
        plot: Option<PathBuf>,
    },
    /// Launch a do-nothing program padded to 4, 8, 12 MB on 1..32 nodes (paper Fig. 2a).
    Launch {
        /// Node counts.
        #[arg(long, default_value = "1,2,4,8,16,32", value_parser = report::parse_counts)]
        nodes: std::vec::Vec<u32>,
        /// Program sizes in MB.
        #[arg(long, default_value = "4,8,12", value_parser = report::parse_counts)]
        sizes_mb: std::vec::Vec<u32>,
        /// Measured runs per point (after one warm-up).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Timeslice of the cluster, in milliseconds.
        #[arg(long, default_value_t = 1.0)]
        timeslice_ms: f64,
        /// Program transfer chunk size in KiB (cluster default if not given).
        #[arg(long)]
        chunk_kb: Option<usize>,
        /// Program transfer queue slots (cluster default if not given).
        #[arg(long)]
        slots: Option<usize>,
        /// Tree fanout (cluster default if not given).
        #[arg(long)]
        fanout: Option<usize>,
        /// Primitives backend of the cluster: tcp or ofi.
        #[arg(long, default_value = "tcp")]
        backend: storm_cluster::config::BackendKind,
        /// libfabric provider for --backend ofi.
        #[arg(long)]
        provider: Option<String>,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Also draw the figure (paper Fig. 2a: launch time against nodes, with the floor) into this PNG file.
        #[arg(long, value_name = "FILE.png")]
        plot: Option<PathBuf>,
        /// What PMI the job is served, as `storm-submit --mpi` (auto: PMI-1, PMI-2 and PMIx,
        /// what users get; none: no PMI at all).
        #[arg(long, default_value = "auto")]
        mpi: storm_cluster::messages::MpiMode,
        #[command(flatten)]
        history: regress::HistoryArgs,
    },
    /// Single-task jobs per second from concurrent clients, with p50/p99 submit-to-exit
    /// latency, beside fork/exec of /bin/true from as many threads in the same run.
    Throughput {
        /// Jobs submitted in all.
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        /// Concurrent clients (each follows one job at a time).
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Nodes of the embedded cluster.
        #[arg(long, default_value_t = 4)]
        nodes: u32,
        /// CPUs of every node.
        #[arg(long, default_value_t = 2)]
        cpus: u32,
        /// Timeslice of the cluster, in milliseconds.
        #[arg(long, default_value_t = 1.0)]
        timeslice_ms: f64,
        /// Copy the program to the nodes with every job (storm-submit's --bcast) instead of
        /// running the nodes' own /bin/true (--no-bcast).
        #[arg(long, conflicts_with = "check")]
        bcast: bool,
        /// Check that /bin/true is in place on the job's nodes before every job (storm-submit's
        /// default: one COMPARE-AND-WRITE over their digests) instead of --no-bcast.
        #[arg(long)]
        check: bool,
        /// Primitives backend of the cluster: tcp, ofi or local.
        #[arg(long, default_value = "tcp")]
        backend: storm_cluster::config::BackendKind,
        /// libfabric provider for --backend ofi.
        #[arg(long)]
        provider: Option<String>,
        /// MM replicas: 3 (or 5) also runs the jobs under a replicated MM and reports what
        /// replication costs per job beside a single MM, same run.
        #[arg(long, default_value_t = 1)]
        managers: u32,
        /// Log entries between the replicas' comparisons of their journals (`[replication]
        /// checksum_every`; 0: none). By default the cluster's.
        #[arg(long)]
        checksum_every: Option<u64>,
        /// Replicas do not sync their Raft logs (`[replication] unsafe_no_log_sync`; a killed
        /// replica then loses its last second of log and votes): measures what the sync costs.
        #[arg(long)]
        no_log_sync: bool,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        #[command(flatten)]
        history: regress::HistoryArgs,
    },
    /// Failure detection (kill to DOWN), rejoin (restart to UP), tree healing and MM restart to ready.
    Faults {
        /// Nodes of the embedded cluster for detection.
        #[arg(long, default_value_t = 8)]
        nodes: u32,
        /// Trials of each measurement.
        #[arg(long, default_value_t = 10)]
        trials: usize,
        /// Timeslice (heartbeat interval) of the cluster, in milliseconds.
        #[arg(long, default_value_t = 1.0)]
        timeslice_ms: f64,
        /// Node counts of the tree-healing measurement.
        #[arg(long, default_value = "8,16,32", value_parser = report::parse_counts)]
        heal_nodes: std::vec::Vec<u32>,
        /// MM replicas: 3 (or 5) measures a replicated MM's failover (leader killed to the
        /// next job launched), beside a single MM's restart in the same run, and what
        /// replication costs per job (see --cost-jobs).
        #[arg(long, default_value_t = 1)]
        managers: u32,
        /// The replicas' Raft heartbeat ([replication] heartbeat_ms).
        #[arg(long, default_value_t = storm_cluster::config::ReplicationSection::default().heartbeat_ms)]
        replica_heartbeat_ms: u64,
        /// The replicas' election timeout ([replication] election_timeout_ms).
        #[arg(long, default_value_t = storm_cluster::config::ReplicationSection::default().election_timeout_ms)]
        election_timeout_ms: u64,
        /// With --managers: submitters whose jobs are under way when each leader is killed
        /// (besides the timed probe), each a client that follows the group as storm-submit
        /// does; every one of their jobs must run once.
        #[arg(long, default_value_t = 0)]
        submitters: usize,
        /// With --managers: single-task jobs run under a single MM and then under the group,
        /// for what replication costs per job (`storm-bench throughput --managers`'s table,
        /// with the same replication settings); 0 leaves it out.
        #[arg(long, default_value_t = 2000)]
        cost_jobs: usize,
        /// With --managers: the failover on the namespace testbed (each replica and node in
        /// a network namespace of its own; needs root) instead of an embedded cluster.
        #[arg(long)]
        testbed: bool,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Also draw the figure (each measured time as a CDF; tree healing against nodes) into this PNG file.
        #[arg(long, value_name = "FILE.png")]
        plot: Option<PathBuf>,
    },
    /// What authenticated and encrypted tcp links cost, beside unprotected links in the same
    /// run.
    Links {
        /// Destination node counts (the origin is one more node).
        #[arg(long, default_value = "1,4", value_parser = report::parse_counts)]
        nodes: std::vec::Vec<u32>,
        /// Transfer sizes (K, M suffixes are powers of 1024).
        #[arg(long, default_value = "8,12M", value_parser = report::parse_sizes)]
        sizes: std::vec::Vec<usize>,
        /// Rounds; each runs every operation on every cluster.
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Operations per cluster per round.
        #[arg(long, default_value_t = 5)]
        per_round: usize,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// What one sample of a node (node monitoring) costs its NM: CPU per sample and as a
    /// share of one core at the sample period, beside fork/exec in the same run.
    Sample {
        /// Samples to take (the mean is reported).
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        /// The sample period the share of one core is taken at ([monitoring] sample_ms).
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
    },
    /// MPI wire-up (MPI_Init to the first barrier) and end to end on 1..32 nodes, against
    /// MPICH's own launcher (Hydra) in the same run. Needs mpich and libmpich-dev.
    Mpi {
        /// Node counts.
        #[arg(long, default_value = "1,2,4,8,16,32", value_parser = report::parse_counts)]
        nodes: std::vec::Vec<u32>,
        /// Ranks per node.
        #[arg(long, default_value_t = 1)]
        ppn: u32,
        /// Measured runs per point (after one warm-up).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Timeslice of the cluster, in milliseconds.
        #[arg(long, default_value_t = 1.0)]
        timeslice_ms: f64,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// HPC Challenge (Debian's hpcc, Open MPI) under storm-submit with no MPI flag and under
    /// mpirun, interleaved on this host; each figure's ratio (above 1: storm slower).
    Hpcc {
        /// Ranks, all on one node.
        #[arg(long, default_value_t = 2)]
        ranks: u32,
        /// HPL's matrix order.
        #[arg(long, default_value_t = 2000)]
        n: u32,
        /// Measured runs under each (after one warm-up of each).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Timeslice of the cluster, in milliseconds.
        #[arg(long, default_value_t = 1.0)]
        timeslice_ms: f64,
        /// The hpcc binary.
        #[arg(long, default_value = "/usr/bin/hpcc")]
        program: PathBuf,
        /// Open MPI's launcher, the baseline.
        #[arg(long, default_value = "mpirun")]
        mpirun: String,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Daemon start-up (fork/exec to ready) on each backend, beside fork/exec of /bin/true.
    Startup {
        /// Backends to measure, in one run (default: tcp, and ofi where libfabric is
        /// installed).
        #[arg(long, value_delimiter = ',')]
        backend: Vec<storm_cluster::config::BackendKind>,
        /// libfabric provider for the ofi backend (default: the best one found).
        #[arg(long)]
        provider: Option<String>,
        /// Clusters started per backend (after one warm-up).
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Inside a Slurm allocation: `storm start` (an instance up, one job, torn down) to its
    /// first output and exit, and launch inside one instance, each beside `srun` in the same
    /// allocation (`salloc -N 4 storm-bench start`).
    Start {
        /// Measured runs of each (after one warm-up of each).
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// The launch measurement, run as an instance's command (by `storm-bench start`
        /// itself).
        #[arg(long, hide = true)]
        inner: bool,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Inside an instance (`storm start -- storm-bench fabric`): the primitives between its
    /// nodes on storm's tcp fabric and on every libfabric provider here that reaches other
    /// hosts, in OSU's and perftest's columns, beside fi_pingpong in the same run.
    Fabric(fabric::FabricCli),
    /// One rank of `storm-bench fabric`'s measuring job (not for users).
    #[command(hide = true)]
    FabricRank(fabric::RankArgs),
    /// Inside an instance (`storm start -- storm-bench report --out DIR`): the whole report
    /// for a fresh allocation: the primitives on every fabric (`fabric`), launch against
    /// node count beside srun where Slurm gave the nodes, the heartbeat, and gang scheduling
    /// where the instance gang-schedules, as tables, CSV, JSON and PNG.
    Report {
        /// Where the report goes (made if missing; on a file system every node sees, for
        /// the gang part).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Which parts to measure.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "fabric,launch,heartbeat,gang"
        )]
        parts: Vec<instance_report::Part>,
        /// CPU seconds of each rank of the gang part's probe jobs.
        #[arg(long, default_value_t = 2.0)]
        gang_cpu_s: f64,
        /// Ranks per node of the gang part's probe jobs (default: the fewest CPUs a node
        /// has, so that two jobs cannot share a time slot).
        #[arg(long, value_name = "N")]
        gang_ranks_per_node: Option<u32>,
        /// Measured round trips per size.
        #[arg(long, default_value_t = 1000)]
        iterations: u32,
        /// Measured launches per node count.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Gang scheduling: quantum sweep (Fig. 3), MPL sweep (Fig. 5), CPU per switch, skew.
    Gang {
        /// Nodes of the cluster, and ranks of every SPMD job.
        #[arg(long, default_value_t = 8)]
        nodes: u32,
        /// Jobs run together in the quantum sweep.
        #[arg(long, default_value_t = 2)]
        mpl: usize,
        /// Which measurements to make.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "tasks,quantum,mpl,skew"
        )]
        parts: Vec<gang::Part>,
        /// Quanta (timeslices) of the quantum sweep, in ms.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "0.3,0.5,1,2,4,16,64,256,1000"
        )]
        quanta_ms: Vec<f64>,
        /// Multiprogramming levels of the MPL sweep.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        mpls: Vec<usize>,
        /// Quantum of the MPL sweep, in ms.
        #[arg(long, default_value_t = 1.0)]
        mpl_quantum_ms: f64,
        /// Node counts of the light-job skew measurement.
        #[arg(long, value_delimiter = ',', default_value = "8,16")]
        skew_nodes: Vec<u32>,
        /// Quantum of the skew measurement, in ms.
        #[arg(long, default_value_t = 1.0)]
        skew_quantum_ms: f64,
        /// How long the light jobs of the skew measurement sleep, in seconds.
        #[arg(long, default_value_t = 3.0)]
        skew_seconds: f64,
        /// Tree fanout of the tcp backend (cluster default if not given).
        #[arg(long)]
        fanout: Option<usize>,
        /// Target runtime of one SPMD job run bare, in seconds.
        #[arg(long, default_value_t = 2.0)]
        alone_s: f64,
        /// CPU time every rank computes between two barriers, in ms.
        #[arg(long, default_value_t = 1.0)]
        sync_ms: f64,
        /// Run the MM and NMs under SCHED_FIFO at this priority (0: the normal policy), as
        /// `[scheduler] daemon_rt_priority` does (its default unless given).
        #[arg(long, default_value_t = storm_cluster::config::DEFAULT_DAEMON_RT_PRIORITY)]
        daemon_rt_priority: u8,
        /// Nodes of the `tasks` part (one rank of each job per node).
        #[arg(long, default_value_t = 2)]
        tasks_nodes: u32,
        /// Quanta of the `tasks` part, in ms.
        #[arg(long, value_delimiter = ',', default_value = "1,2,5,16")]
        tasks_quanta_ms: Vec<f64>,
        /// CPU time every rank of the `tasks` part runs, in seconds.
        #[arg(long, default_value_t = 1.5)]
        tasks_cpu_s: f64,
        /// Percent of packets the last node's link drops in the `tasks` part (namespace
        /// testbed only).
        #[arg(long, default_value_t = 0)]
        tasks_loss: u32,
        /// `[scheduler] slot_lease` settings the `tasks` part compares (true,false: both).
        #[arg(long, value_delimiter = ',', default_value = "true")]
        tasks_lease: Vec<bool>,
        /// Primitives backend of the cluster: tcp or ofi.
        #[arg(long, default_value = "tcp")]
        backend: storm_cluster::config::BackendKind,
        /// libfabric provider for --backend ofi.
        #[arg(long)]
        provider: Option<String>,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Also draw the figures (paper Figs. 3 and 5, strobe-skew CDF) into this PNG file.
        #[arg(long, value_name = "FILE.png")]
        plot: Option<PathBuf>,
    },
    /// The real MM core driving simulated clusters (storm-sim, virtual time): its processor
    /// time per timeslice, memory per role, launch, failure detection and draining a queue,
    /// with the growth per 8× nodes.
    Scale {
        /// Node counts, smallest first.
        #[arg(long, value_delimiter = ',', default_value = "32,256,2048,16384")]
        nodes: Vec<u32>,
        /// Single-node jobs queued at once and drained.
        #[arg(long, default_value_t = 10_000)]
        drain_jobs: usize,
        /// Idle timeslices the idle processor time is averaged over.
        #[arg(long, default_value_t = 200)]
        idle_slices: u64,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Sharing between two clusters (issue 36): a workload of parallel jobs submitted at once
    /// to one cluster, run without and with flocking to an idle peer; mean and p95 wait and
    /// the makespan of each run, and their ratios. Then lending: the time to lend and return
    /// nodes, in heartbeat periods, and launch on borrowed nodes beside home nodes.
    Federation {
        /// Nodes of each cluster.
        #[arg(long, default_value_t = 2)]
        nodes: u32,
        /// Jobs in the workload.
        #[arg(long, default_value_t = 24)]
        jobs: usize,
        /// Shortest run time of a job, in milliseconds.
        #[arg(long, default_value_t = 500)]
        min_run_ms: u64,
        /// Longest run time of a job, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        max_run_ms: u64,
        /// Seed of the workload's generator (the same seed, the same workload).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Rounds of lending (lend every node of a cluster, launch, return them).
        #[arg(long, default_value_t = 5)]
        lend_rounds: usize,
        /// Also write the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Every decoder of received bytes fed mutated inputs: no panic, no allocation its input
    /// does not explain, no hang.
    Fuzz {
        /// Targets (default: all): tcp-frame, rm-message, control, journal, cluster-file,
        /// hostlist, task-spec, ofi-bootstrap, pmi.
        #[arg(long, value_delimiter = ',')]
        target: Vec<String>,
        /// Inputs per target.
        #[arg(long, default_value_t = 10_000_000)]
        inputs: u64,
        /// Seed of the mutator (default: from the clock, printed so a run can be repeated).
        #[arg(long)]
        seed: Option<u64>,
        /// Directory a finding's input is written to.
        #[arg(long, default_value = "storm-fuzz/regressions")]
        save: PathBuf,
    },
}

fn main() -> Result<()> {
    storm_cluster::cli_docs::exit_if_asked::<Cli>();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Plain text in a file or a pipe: colour codes only on a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Prims {
            backend,
            provider,
            nodes,
            sizes,
            fanout,
            chunk_size,
            time_ms,
            csv,
            plot,
        } => {
            let mut out = report::Csv::new(prims::CSV_HEADER);
            for backend in backend {
                let args = prims::PrimsArgs {
                    backend,
                    provider: provider.clone(),
                    nodes: nodes.clone(),
                    sizes: sizes.clone(),
                    tcp: TcpConfig {
                        fanout,
                        chunk_size,
                        ..TcpConfig::default()
                    },
                    budget: stats::Budget {
                        time: Duration::from_millis(time_ms),
                        ..Default::default()
                    },
                };
                for t in prims::run(&args, &mut out)? {
                    println!("{}", t.render());
                }
            }
            out.write_if_asked(csv.as_deref())?;
            plot_if_asked(plot.as_deref(), plot::prims(&out))?;
        }
        Command::Launch {
            nodes,
            sizes_mb,
            runs,
            timeslice_ms,
            chunk_kb,
            slots,
            fanout,
            backend,
            provider,
            csv,
            plot,
            mpi,
            history,
        } => {
            let args = launch::LaunchArgs {
                mpi,
                nodes,
                sizes_mb,
                runs: runs.max(1),
                timeslice_ms,
                chunk_kb,
                slots,
                fanout,
                backend,
                provider,
            };
            let mut out = report::Csv::new(launch::CSV_HEADER);
            let mut records = Vec::new();
            for table in launch::run(&args, &mut out, &mut records)? {
                println!("{}", table.render());
            }
            out.write_if_asked(csv.as_deref())?;
            plot_if_asked(plot.as_deref(), plot::launch(&out))?;
            if history.run(&records)? {
                std::process::exit(3);
            }
        }
        Command::Throughput {
            jobs,
            clients,
            nodes,
            cpus,
            timeslice_ms,
            bcast,
            check,
            backend,
            provider,
            managers,
            checksum_every,
            no_log_sync,
            csv,
            history,
        } => {
            use storm_cluster::control::Delivery;
            let args = throughput::ThroughputArgs {
                jobs,
                clients,
                nodes,
                cpus,
                timeslice_ms,
                delivery: match (bcast, check) {
                    (true, _) => Delivery::Broadcast,
                    (_, true) => Delivery::Auto,
                    _ => Delivery::InPlace,
                },
                backend,
                provider,
                managers,
                replication: storm_cluster::config::ReplicationSection {
                    checksum_every: checksum_every.unwrap_or(
                        storm_cluster::config::ReplicationSection::default().checksum_every,
                    ),
                    unsafe_no_log_sync: no_log_sync,
                    ..Default::default()
                },
            };
            let mut out = report::Csv::new(throughput::CSV_HEADER);
            let mut records = Vec::new();
            for t in throughput::run(&args, &mut out, &mut records)? {
                println!("{}", t.render());
            }
            out.write_if_asked(csv.as_deref())?;
            if history.run(&records)? {
                std::process::exit(3);
            }
        }
        Command::Faults {
            nodes,
            trials,
            timeslice_ms,
            heal_nodes,
            managers,
            replica_heartbeat_ms,
            election_timeout_ms,
            submitters,
            cost_jobs,
            testbed,
            csv,
            plot,
        } => {
            if trials == 0 || timeslice_ms <= 0.0 {
                anyhow::bail!("--trials and --timeslice-ms must be positive");
            }
            if submitters > 0 && managers < 2 {
                anyhow::bail!("--submitters goes with --managers 3 (or 5): it loads a failover");
            }
            if testbed && managers < 2 {
                anyhow::bail!("--testbed goes with --managers 3 (or 5): it places a failover");
            }
            let args = faults::FaultsArgs {
                nodes,
                trials,
                timeslice_ms,
                heal_nodes,
                managers,
                submitters,
                cost_jobs,
                testbed,
                replication: storm_cluster::config::ReplicationSection {
                    heartbeat_ms: replica_heartbeat_ms,
                    election_timeout_ms,
                    ..Default::default()
                },
            };
            let mut out = report::Csv::new(faults::CSV_HEADER);
            for table in faults::run(&args, &mut out)? {
                println!("{}", table.render());
            }
            out.write_if_asked(csv.as_deref())?;
            plot_if_asked(plot.as_deref(), plot::faults(&out))?;
        }
        Command::Fuzz {
            target,
            inputs,
            seed,
            save,
        } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
            let args = fuzz::FuzzArgs {
                targets: target,
                inputs,
                seed,
                save,
            };
            println!("{}", fuzz::run(&args)?.render());
        }
        Command::Links {
            nodes,
            sizes,
            rounds,
            per_round,
            csv,
        } => {
            if rounds == 0 || per_round == 0 {
                anyhow::bail!("--rounds and --per-round must be positive");
            }
            let args = links::LinksArgs {
                nodes,
                sizes,
                rounds,
                per_round,
            };
            let mut out = report::Csv::new(links::CSV_HEADER);
            println!("{}", links::run(&args, &mut out)?.render());
            println!("{}", links::frame_costs(&[8, 256 * 1024]).render());
            println!("{}", links::seal_costs().render());
            out.write_if_asked(csv.as_deref())?;
        }
        Command::Sample { samples, period_ms } => {
            if samples == 0 || period_ms == 0 {
                anyhow::bail!("--samples and --period-ms must be positive");
            }
            let args = sample::SampleArgs {
                samples,
                period: std::time::Duration::from_millis(period_ms),
            };
            println!("{}", sample::run(&args)?.render());
        }
        Command::Mpi {
            nodes,
            ppn,
            runs,
            timeslice_ms,
            csv,
        } => {
            if ppn == 0 || timeslice_ms <= 0.0 {
                anyhow::bail!("--ppn and --timeslice-ms must be positive");
            }
            let args = mpi::MpiArgs {
                nodes,
                ppn,
                runs: runs.max(1),
                timeslice_ms,
            };
            let mut out = report::Csv::new(mpi::CSV_HEADER);
            println!("{}", mpi::run(&args, &mut out)?.render());
            out.write_if_asked(csv.as_deref())?;
        }
        Command::Hpcc {
            ranks,
            n,
            runs,
            timeslice_ms,
            program,
            mpirun,
            csv,
        } => {
            if ranks == 0 || n == 0 || timeslice_ms <= 0.0 {
                anyhow::bail!("--ranks, --n and --timeslice-ms must be positive");
            }
            let args = hpcc::HpccArgs {
                ranks,
                n,
                runs: runs.max(1),
                timeslice_ms,
                program,
                mpirun,
            };
            let mut out = report::Csv::new(hpcc::CSV_HEADER);
            println!("{}", hpcc::run(&args, &mut out)?.render());
            out.write_if_asked(csv.as_deref())?;
        }
        Command::Startup {
            backend,
            provider,
            runs,
            csv,
        } => {
            let backends = if backend.is_empty() {
                startup::available_backends()
            } else {
                backend
            };
            let args = startup::StartupArgs {
                backends,
                provider,
                runs: runs.max(1),
            };
            let mut out = report::Csv::new(startup::CSV_HEADER);
            println!("{}", startup::run(&args, &mut out)?.render());
            out.write_if_asked(csv.as_deref())?;
        }
        Command::Fabric(cli) => cli.run()?,
        Command::FabricRank(args) => fabric::rank(&args)?,
        Command::Report {
            out,
            parts,
            gang_cpu_s,
            gang_ranks_per_node,
            iterations,
            runs,
        } => instance_report::run(
            &out,
            &instance_report::ReportArgs {
                parts,
                iterations,
                runs: runs.max(1),
                gang_cpu_s,
                gang_ranks_per_node,
            },
        )?,
        Command::Start { runs, inner, csv } => {
            let bin = storm_cli::local::bin_dir()?;
            if inner {
                start::inner(&bin, runs.max(1))?;
            } else {
                let mut out = report::Csv::new(start::CSV_HEADER);
                for table in start::run(&bin, runs.max(1), &mut out)? {
                    println!("{}", table.render());
                }
                out.write_if_asked(csv.as_deref())?;
            }
        }
        Command::Federation {
            nodes,
            jobs,
            min_run_ms,
            max_run_ms,
            seed,
            lend_rounds,
            csv,
        } => {
            let args = federation::FederationArgs {
                nodes,
                jobs,
                min_run_ms,
                max_run_ms,
                seed,
                lend_rounds,
            };
            let mut out = report::Csv::new(federation::CSV_HEADER);
            for t in federation::run(&args, &mut out)? {
                println!("{}", t.render());
            }
            out.write_if_asked(csv.as_deref())?;
        }
        Command::Scale {
            nodes,
            drain_jobs,
            idle_slices,
            csv,
        } => {
            if nodes.is_empty() || nodes.contains(&0) || drain_jobs == 0 || idle_slices == 0 {
                anyhow::bail!("--nodes, --drain-jobs and --idle-slices must be at least 1");
            }
            let args = scale::ScaleArgs {
                nodes,
                drain_jobs,
                idle_slices,
            };
            let mut out = report::Csv::new(scale::CSV_HEADER);
            for table in scale::run(&args, &mut out)? {
                println!("{}", table.render());
            }
            out.write_if_asked(csv.as_deref())?;
        }
        Command::Gang {
            nodes,
            mpl,
            parts,
            quanta_ms,
            mpls,
            mpl_quantum_ms,
            skew_nodes,
            skew_quantum_ms,
            skew_seconds,
            fanout,
            alone_s,
            sync_ms,
            daemon_rt_priority,
            tasks_nodes,
            tasks_quanta_ms,
            tasks_cpu_s,
            tasks_loss,
            tasks_lease,
            backend,
            provider,
            csv,
            plot,
        } => {
            if nodes == 0 || mpl == 0 || mpls.contains(&0) || skew_nodes.contains(&0) {
                anyhow::bail!("node counts and multiprogramming levels must be at least 1");
            }
            if tasks_loss > 100 {
                anyhow::bail!("--tasks-loss {tasks_loss} is a percentage: 0-100");
            }
            if tasks_loss > 0 && tasks_nodes < 2 {
                anyhow::bail!("--tasks-loss needs at least 2 --tasks-nodes (one lossy, one not)");
            }
            if quanta_ms
                .iter()
                .chain([&mpl_quantum_ms, &skew_quantum_ms])
                .any(|q| *q <= 0.0)
                || alone_s <= 0.0
                || sync_ms <= 0.0
                || skew_seconds <= 0.0
            {
                anyhow::bail!("quanta, --alone-s, --sync-ms and --skew-seconds must be positive");
            }
            let args = gang::GangArgs {
                nodes,
                mpl,
                parts,
                quanta_ms,
                mpls,
                mpl_quantum_ms,
                skew_nodes,
                skew_quantum_ms,
                skew_seconds,
                alone_s,
                sync_ms,
                backend,
                provider,
                fanout,
                daemon_rt_priority,
                tasks_nodes,
                tasks_quanta_ms,
                tasks_cpu_s,
                tasks_loss_percent: tasks_loss,
                tasks_leases: tasks_lease,
            };
            let mut out = report::Csv::new(gang::CSV_HEADER);
            for table in gang::run(&args, &mut out)? {
                println!("{}", table.render());
            }
            out.write_if_asked(csv.as_deref())?;
            plot_if_asked(plot.as_deref(), plot::gang(&out))?;
        }
    }
    Ok(())
}

/// Draws the figure if the user asked for one (`--plot`), and says where.
pub(crate) fn plot_if_asked(
    path: Option<&std::path::Path>,
    panels: Vec<plot::Panel>,
) -> Result<()> {
    if let Some(path) = path {
        plot::draw(&panels, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
