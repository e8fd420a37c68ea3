//! `storm`: look at and manage a storm cluster (queue, cancel, nodes, shutdown).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use storm_cluster::control::{Client, Reply, Request};

#[derive(Parser)]
#[command(name = "storm", about = "Look at and manage a storm cluster")]
struct Args {
    /// The cluster file (default: $STORM_CONFIG, then /etc/storm/cluster.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// The MM's control socket (instead of reading it from the cluster file).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Jobs queued and running.
    Queue,
    /// Cancel a job (its owner or root only).
    Cancel { job: u64 },
    /// Nodes and their state.
    Nodes,
    /// Stop the machine manager and every node manager.
    Shutdown,
}

fn run(args: Args) -> Result<(), String> {
    let socket = storm_cli::control_socket(args.socket, args.config)?;
    let client = Client::connect(&socket)?;
    let req = match args.command {
        Cmd::Queue => Request::Queue,
        Cmd::Cancel { job } => Request::Cancel { job },
        Cmd::Nodes => Request::Nodes,
        Cmd::Shutdown => Request::Shutdown,
    };
    match client.call(&req)? {
        Reply::Queue(jobs) => {
            println!(
                "{:>6}  {:<16} {:>6} {:<10} {:>6} {:>10}  NODES / REASON",
                "JOB", "NAME", "UID", "STATE", "TASKS", "ELAPSED"
            );
            for j in jobs {
                let place = match (&j.reason, j.time_slot) {
                    (Some(why), _) => why.clone(),
                    (None, Some(slot)) => format!("{} (time slot {slot})", j.nodes),
                    (None, None) => j.nodes.to_string(),
                };
                println!(
                    "{:>6}  {:<16} {:>6} {:<10} {:>6} {:>9.1}s  {}",
                    j.job,
                    j.name,
                    j.uid,
                    j.state,
                    j.ntasks,
                    j.elapsed_ms as f64 / 1000.0,
                    place
                );
            }
        }
        Reply::Nodes(nodes) => {
            println!("{:>4}  {:<16} {:<10} JOBS", "ID", "NAME", "STATE");
            for n in nodes {
                let jobs: Vec<String> = n.jobs.iter().map(u64::to_string).collect();
                println!(
                    "{:>4}  {:<16} {:<10} {}",
                    n.id,
                    n.name,
                    n.state,
                    jobs.join(",")
                );
            }
        }
        Reply::Done => {}
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storm: error: {e}");
            ExitCode::from(1)
        }
    }
}
