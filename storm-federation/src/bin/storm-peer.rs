//! `storm-peer`: this cluster's agent towards its peer clusters (see `storm_federation`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use storm_cluster::ClusterConfig;
use storm_cluster::daemon;

#[derive(Parser)]
#[command(
    name = "storm-peer",
    version,
    about = "storm peer agent: links this cluster with the peer clusters its cluster file names",
    long_about = "storm peer agent: links this cluster with the peer clusters its cluster file \
                  names ([federation] and [[peer]]), over links authenticated and encrypted \
                  under a key each pair of clusters shares. Run one beside the machine \
                  manager, as root; `storm peers` shows what it sees. Stopping it stops \
                  nothing else: the cluster schedules its own jobs as before."
)]
struct Args {
    /// The cluster file.
    #[arg(long, short, default_value = storm_cluster::config::DEFAULT_CLUSTER_FILE)]
    config: PathBuf,
}

fn main() -> ExitCode {
    storm_cluster::cli_docs::exit_if_asked::<Args>();
    daemon::exit_status("storm-peer", run())
}

fn run() -> Result<()> {
    daemon::init_logging();
    let args = Args::parse();
    let config = ClusterConfig::load(&args.config)?;
    let stop = daemon::stop_flag()?;
    storm_federation::agent::run(config, stop)
}
