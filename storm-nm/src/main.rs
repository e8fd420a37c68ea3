//! `storm-nm`: the node manager daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use storm_cluster::ClusterConfig;
use storm_cluster::daemon;
use storm_cluster::endpoint::Listen;
use storm_nm::{NmOptions, daemon as nm_daemon};

#[derive(Parser)]
#[command(
    name = "storm-nm",
    version,
    about = "storm node manager: one per compute node"
)]
struct Args {
    /// The cluster file.
    #[arg(long, short, default_value = storm_cluster::config::DEFAULT_CLUSTER_FILE)]
    config: PathBuf,
    /// This node's name (or index) in the cluster file (default: this host's name).
    #[arg(long)]
    node: Option<String>,
    /// Use this inherited, bound listening socket instead of binding the configured address.
    #[arg(long)]
    listen_fd: Option<i32>,
}

fn main() -> ExitCode {
    storm_cluster::cli_docs::exit_if_asked::<Args>();
    daemon::exit_status("storm-nm", run())
}

fn run() -> Result<()> {
    daemon::init_logging();
    // Connections, programs and tasks' pipes are descriptors: the hard limit, not systemd's
    // default soft one of 1024.
    daemon::raise_open_files_limit();
    let args = Args::parse();
    let config = ClusterConfig::load(&args.config)?;
    let name = match args.node {
        Some(n) => n,
        None => nix::unistd::gethostname()
            .context("reading this host's name (or give --node)")?
            .to_string_lossy()
            .into_owned(),
    };
    let node = match config.node_by_name(&name) {
        Some(id) => id,
        None => match name.parse::<u32>() {
            Ok(id) if id < config.node_count() => id,
            _ => bail!("no node {name:?} in {}", args.config.display()),
        },
    };
    let (pl_path, pmi_library) = nm_daemon::helpers(&config)?;
    daemon::set_rt_priority(config.scheduler.daemon_rt_priority);
    let stop = daemon::stop_flag()?;
    let listen = args.listen_fd.map(Listen::Fd).unwrap_or(Listen::Configured);
    let nm = nm_daemon::start(NmOptions {
        config,
        node,
        listen,
        pl_path,
        pmi_library,
        stop,
    })?;
    daemon::notify_ready();
    nm.run()
}
