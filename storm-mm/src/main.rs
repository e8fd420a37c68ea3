//! `storm-mm`: the machine manager daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use storm_cluster::ClusterConfig;
use storm_cluster::daemon;
use storm_cluster::endpoint::Listen;
use storm_mm::MmOptions;

#[derive(Parser)]
#[command(
    name = "storm-mm",
    version,
    about = "storm machine manager: one per cluster"
)]
struct Args {
    /// The cluster file.
    #[arg(long, short, default_value = storm_cluster::config::DEFAULT_CLUSTER_FILE)]
    config: PathBuf,
    /// Use this inherited, bound listening socket instead of binding the configured address.
    #[arg(long)]
    listen_fd: Option<i32>,
    /// Which replica of a replicated MM this is (a `[[manager]]` name or index; by default
    /// the entry named as this host).
    #[arg(long)]
    manager: Option<String>,
    /// Join the manager group in the place of a removed replica (`storm managers remove
    /// NAME`): with a new, empty state directory, ask the leader to admit this replica
    /// instead of starting the group the cluster file names. Ignored once the state
    /// directory holds a Raft log.
    #[arg(long)]
    join: bool,
}

fn main() -> ExitCode {
    storm_cluster::cli_docs::exit_if_asked::<Args>();
    daemon::exit_status("storm-mm", run())
}

fn run() -> Result<()> {
    daemon::init_logging();
    // Connections, programs and tasks' pipes are descriptors: the hard limit, not systemd's
    // default soft one of 1024.
    daemon::raise_open_files_limit();
    let args = Args::parse();
    let config = ClusterConfig::load(&args.config)?;
    daemon::set_rt_priority(config.scheduler.daemon_rt_priority);
    let stop = daemon::stop_flag()?;
    let listen = args.listen_fd.map(Listen::Fd).unwrap_or(Listen::Configured);
    storm_mm::run(MmOptions {
        config,
        manager: args.manager,
        join: args.join,
        listen,
        stop,
    })
}
