//! `storm-mm`: the machine manager daemon.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Result;
use clap::Parser;
use storm_cluster::ClusterConfig;
use storm_cluster::endpoint::Listen;
use storm_mm::MmOptions;

#[derive(Parser)]
#[command(name = "storm-mm", about = "storm machine manager: one per cluster")]
struct Args {
    /// The cluster file.
    #[arg(long, short)]
    config: PathBuf,
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
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let listen = args.listen_fd.map(Listen::Fd).unwrap_or(Listen::Configured);
    storm_mm::run(MmOptions {
        config,
        listen,
        stop,
    })
}
