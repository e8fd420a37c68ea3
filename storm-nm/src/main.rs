//! `storm-nm`: the node manager daemon.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use clap::Parser;
use storm_cluster::ClusterConfig;
use storm_cluster::endpoint::Listen;
use storm_nm::{NmOptions, NodeManager};

#[derive(Parser)]
#[command(name = "storm-nm", about = "storm node manager: one per compute node")]
struct Args {
    /// The cluster file.
    #[arg(long, short)]
    config: PathBuf,
    /// This node's name (or index) in the cluster file.
    #[arg(long)]
    node: String,
    /// Use this inherited, bound listening socket instead of binding the configured address.
    #[arg(long)]
    listen_fd: Option<i32>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = ClusterConfig::load(&args.config)?;
    let node = match config.node_by_name(&args.node) {
        Some(id) => id,
        None => match args.node.parse::<u32>() {
            Ok(id) if id < config.node_count() => id,
            _ => bail!("no node {:?} in {}", args.node, args.config.display()),
        },
    };
    let pl_path = match &config.cluster.pl_path {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("locating storm-nm")?
            .with_file_name("storm-pl"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let listen = args.listen_fd.map(Listen::Fd).unwrap_or(Listen::Configured);
    NodeManager::start(NmOptions {
        config,
        node,
        listen,
        pl_path,
        stop,
    })?
    .run()
}
