//! `storm-relay`: carries users' control connections from the compute nodes to the machine
//! manager (see `storm_cli::relay`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
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
                  `storm-relay --manager` on the MM's host (with a replicated MM, `storm-relay \
                  --manager --replica NAME` beside every replica) and `storm-relay` on every \
                  node; storm-submit and storm on a node then work as on the MM's host, and a \
                  batch script's steps reach the MM through its node's relay."
)]
struct Args {
    /// The cluster file.
    #[arg(long, short, default_value = storm_cluster::config::DEFAULT_CLUSTER_FILE)]
    config: PathBuf,
    /// Run the manager side, on the MM's host: listen on `[relay] address`.
    #[arg(long, conflicts_with = "node")]
    manager: bool,
    /// With --manager, for a replicated MM whose `[[manager]]` entries have a
    /// `relay_address`: the replica (name or index) this relay stands beside. It listens on
    /// that replica's relay_address and carries users only to that replica, while it leads.
    #[arg(long, requires = "manager")]
    replica: Option<String>,
    /// The node side for this node (name or index in the cluster file; default: this
    /// host's name): take local users' connections on `[relay] socket`.
    #[arg(long)]
    node: Option<String>,
    /// With --manager: listen on this inherited, bound socket instead of binding `[relay]
    /// address` (its address must be the one the cluster file gives).
    #[arg(long, requires = "manager", value_name = "FD")]
    listen_fd: Option<i32>,
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
        let beside = args
            .replica
            .as_deref()
            .map(|r| config.manager_by_name(r))
            .transpose()
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
        let listen = args
            .listen_fd
            .map(storm_cluster::endpoint::Listen::Fd)
            .unwrap_or(storm_cluster::endpoint::Listen::Configured);
        return storm_cli::relay::manager::serve(config, beside, listen);
    }
    let node = config
        .this_node(args.node.as_deref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    storm_cli::relay::node::serve(config, node)
}
