//! `storm`: look at and manage a storm cluster (queue, history, cancel, nodes, drain, resume,
//! shutdown).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use storm_cluster::control::{Client, NodeInfo, Reply, Request};
use storm_primitives::NodeSet;

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
    /// Jobs that ended (the last 1000), with their exit code and why they ended.
    History,
    /// Cancel a job (its owner or root only).
    Cancel { job: u64 },
    /// Nodes and their state.
    Nodes,
    /// Keep nodes out of allocation until resumed (jobs on them run to their end).
    Drain {
        /// Node ids (`0-3,7`) or names (`node0,node5`).
        nodes: String,
        /// Why (shown by `storm nodes`).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Let drained nodes take jobs again.
    Resume {
        /// Node ids (`0-3,7`) or names (`node0,node5`).
        nodes: String,
    },
    /// Stop the machine manager and every node manager.
    Shutdown,
}

fn run(args: Args) -> Result<(), String> {
    let socket = storm_cli::control_socket(args.socket, args.config)?;
    let client = Client::connect(&socket)?;
    let req = match args.command {
        Cmd::Queue => Request::Queue,
        Cmd::History => Request::History,
        Cmd::Cancel { job } => Request::Cancel { job },
        Cmd::Nodes => Request::Nodes,
        Cmd::Drain { nodes, reason } => Request::Drain {
            nodes: node_set(&client, &nodes)?,
            reason,
        },
        Cmd::Resume { nodes } => Request::Resume {
            nodes: node_set(&client, &nodes)?,
        },
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
        Reply::History(jobs) => {
            println!(
                "{:>6}  {:<16} {:>6} {:<10} {:>4} {:>10}  NODES / REASON",
                "JOB", "NAME", "UID", "STATE", "EXIT", "ELAPSED"
            );
            for j in jobs {
                let place = match &j.reason {
                    Some(why) if j.nodes.is_empty() => why.clone(),
                    Some(why) => format!("{}: {why}", j.nodes),
                    None => j.nodes.to_string(),
                };
                println!(
                    "{:>6}  {:<16} {:>6} {:<10} {:>4} {:>9.1}s  {}",
                    j.job,
                    j.name,
                    j.uid,
                    j.state,
                    j.exit_code.map(|c| c.to_string()).unwrap_or_default(),
                    j.elapsed_ms as f64 / 1000.0,
                    place
                );
            }
        }
        Reply::Nodes(nodes) => {
            println!(
                "{:>4}  {:<16} {:<10} {:<12} REASON",
                "ID", "NAME", "STATE", "JOBS"
            );
            for n in nodes {
                let jobs: Vec<String> = n.jobs.iter().map(u64::to_string).collect();
                println!(
                    "{:>4}  {:<16} {:<10} {:<12} {}",
                    n.id,
                    n.name,
                    n.state,
                    jobs.join(","),
                    n.reason.unwrap_or_default()
                );
            }
        }
        Reply::Done => {}
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    }
    Ok(())
}

/// Nodes named by ids (`0-3,7`) or by names (`node0,node5`).
fn node_set(client: &Client, text: &str) -> Result<NodeSet, String> {
    if let Ok(set) = text.parse::<NodeSet>() {
        return Ok(set);
    }
    let nodes: Vec<NodeInfo> = match client.call(&Request::Nodes)? {
        Reply::Nodes(n) => n,
        other => return Err(format!("unexpected reply {other:?}")),
    };
    text.split(',')
        .map(|name| {
            nodes
                .iter()
                .find(|n| n.name == name.trim())
                .map(|n| n.id)
                .ok_or_else(|| format!("no node is called {name:?} (see storm nodes)"))
        })
        .collect()
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
