//! `storm-relay`: carries users' control connections from the compute nodes to the machine
//! manager (see `storm_cli::relay`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use storm_cluster::ClusterConfig;
use storm_cluster::daemon;

#[derive(Parser)]
#[command(
    name = "storm-relay",
    version,
    about = "storm control relay: lets users on the compute nodes reach the machine manager",
    long_about = "storm control relay: lets users on the compute nodes reach the machine \
                  manager, whose control socket is a Unix socket on its own host. Run \
                  `storm-relay --manager` on the MM's host and `storm-relay` on every node; \
                  storm-submit and storm on a node then work as on the MM's host, and a batch \
                  script's steps reach the MM through its node's relay."
)]
struct Args {
    /// The cluster file.
    #[arg(long, short, default_value = storm_cluster::config::DEFAULT_CLUSTER_FILE)]
    config: PathBuf,
    /// Run the manager side, on the MM's host: listen on `[relay] address`.
    #[arg(long, conflicts_with = "node")]
    manager: bool,
    /// The node side for this node (name or index in the cluster file; default: this
    /// host's name): take local users' connections on `[relay] socket`.
    #[arg(long)]
    node: Option<String>,
}

fn main() -> ExitCode {
    storm_cluster::cli_docs::exit_if_asked::<Args>();
    daemon::exit_status("storm-relay", run())
}

fn run() -> Result<()> {
    daemon::init_logging();
    daemon::raise_open_files_limit();
    let args = Args::parse();
    let config = ClusterConfig::load(&args.config)?;
    if args.manager {
        return storm_cli::relay::manager::serve(config);
    }
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
    storm_cli::relay::node::serve(config, node)
}
