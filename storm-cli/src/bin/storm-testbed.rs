//! storm-testbed: a storm cluster whose nodes are network namespaces on this machine.
//!
//! ```text
//! storm-testbed up --nodes 8          # namespaces, bridge, MM and 8 NMs; prints how to use it
//! storm-submit --config /run/storm-testbed/storm/cluster.toml -N 8 hostname
//! storm-testbed link --node 3 down    # cut node 3's cable (and `up` to restore it)
//! storm-testbed down                  # kill the daemons, delete the namespaces
//!
//! storm-testbed up --clusters 2 --nodes 2   # clusters c0 and c1 that share (docs/federation.md)
//! storm-submit --config /run/storm-testbed/storm/c0/cluster.toml --clusters c1 hostname
//! storm-testbed link --cluster 1 down       # cut c1 off the other clusters
//! ```
//!
//! Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2. Every address lives inside the
//! testbed's namespaces (10.200.0.0/16); nothing is configured on the host's network.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use storm_cli::testbed::federation::{self, Federation};
use storm_cli::testbed::{Testbed, TestbedOptions, down_by_state, namespaces_available, set_link};
use storm_cluster::config::{PolicyKind, SchedulerSection};

#[derive(Parser)]
#[command(
    name = "storm-testbed",
    version,
    about = "A storm cluster in network namespaces on this machine"
)]
struct Cli {
    /// Name of the testbed (namespace prefix, 1-8 letters or digits).
    #[arg(long, default_value = "storm", global = true)]
    name: String,
    /// Directory of the testbed's files (default: /run/storm-testbed/NAME).
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the namespaces and start the MM and one NM per node.
    Up {
        #[arg(long, short = 'N')]
        nodes: u32,
        /// CPUs of every node (default: this machine's cores, which the nodes share).
        #[arg(long)]
        cpus: Option<u32>,
        /// Heartbeat period (and gang quantum), in milliseconds.
        #[arg(long, default_value_t = 1.0)]
        timeslice_ms: f64,
        /// Scheduling policy: fcfs, easy or gang.
        #[arg(long, default_value = "fcfs")]
        policy: PolicyKind,
        /// Time slots of the gang scheduler.
        #[arg(long, default_value_t = 2)]
        mpl: usize,
        /// `[scheduler] daemon_rt_priority` of the daemons (cluster default if not given).
        #[arg(long)]
        daemon_rt_priority: Option<u8>,
        /// MM replicas: 3 (or 5, 7) runs a replicated MM, each replica in a namespace of its
        /// own (`NAME-m0`..).
        #[arg(long, default_value_t = 1)]
        managers: u32,
        /// Clusters that share (2 to 9): c0, c1, … each with its own MM, key and nodes
        /// (`--nodes` each), files in DIR/c0, DIR/c1, …, their peer agents joined by one
        /// more bridge. Each lends to and borrows from every other.
        #[arg(long, default_value_t = 1)]
        clusters: u32,
        /// With --clusters: a peer silent this long is down, and its flocked jobs come home.
        #[arg(long, default_value_t = 5000)]
        peer_timeout_ms: u64,
        /// With --clusters: queued jobs flock after waiting this long (not given: only when
        /// they ask, --flock or --clusters).
        #[arg(long)]
        flock_after_ms: Option<u64>,
    },
    /// Stop the daemons and delete the namespaces and the testbed's files.
    Down,
    /// Cut or restore a node's link to the bridge, or a cluster's to the other clusters.
    Link {
        #[arg(long, required_unless_present = "cluster", conflicts_with = "cluster")]
        node: Option<u32>,
        /// The cluster (its number: 1 for c1) to cut off the others, or join again.
        #[arg(long)]
        cluster: Option<u32>,
        #[arg(value_parser = ["up", "down"])]
        state: String,
    },
}

fn main() -> std::process::ExitCode {
    storm_cluster::cli_docs::exit_if_asked::<Cli>();
    storm_cluster::daemon::exit_status("storm-testbed", run(Cli::parse()))
}

fn run(cli: Cli) -> Result<()> {
    let dir = cli
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/run/storm-testbed").join(&cli.name));
    match cli.command {
        Cmd::Up {
            nodes,
            cpus,
            timeslice_ms,
            policy,
            mpl,
            daemon_rt_priority,
            managers,
            clusters,
            peer_timeout_ms,
            flock_after_ms,
        } => {
            if dir.exists() {
                bail!(
                    "{} exists: testbed {:?} is up, or was not taken down (storm-testbed --name {} down)",
                    dir.display(),
                    cli.name,
                    cli.name
                );
            }
            if let Err(why) = namespaces_available() {
                bail!("cannot create network namespaces here (run as root): {why}");
            }
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let opts = TestbedOptions {
                name: cli.name.clone(),
                nodes,
                cpus: cpus.unwrap_or_else(storm_cli::local::host_cpus).max(1),
                cluster_name: None,
                dir: dir.clone(),
                timeslice_ms,
                scheduler: {
                    let defaults = SchedulerSection::default();
                    SchedulerSection {
                        policy,
                        mpl,
                        daemon_rt_priority: daemon_rt_priority
                            .unwrap_or(defaults.daemon_rt_priority),
                        ..defaults
                    }
                },
                failure: Default::default(),
                sysfs: None,
                managers,
                replication: Default::default(),
                health: Default::default(),
                federation: storm_cluster::federation::FederationSection {
                    advertise_ms: (peer_timeout_ms / 5).max(1),
                    peer_timeout_ms,
                    flock_after_ms,
                    ..Default::default()
                },
                peers: Vec::new(),
                net: storm_cli::testbed::SINGLE_NET,
                guests: Vec::new(),
                limits: Default::default(),
            };
            if clusters > 1 {
                let fed = Federation::up(&opts, clusters)?;
                println!(
                    "testbed {} up: {clusters} clusters of {nodes} nodes (c0..c{}), each lending \
                     to and borrowing from the others",
                    cli.name,
                    clusters - 1
                );
                for (k, path) in fed.config_paths().iter().enumerate() {
                    println!("cluster c{k}: {}", path.display());
                }
                let c0 = fed.config_paths()[0].display().to_string();
                let c1 = fed.config_paths()[1].display().to_string();
                println!(
                    "try: storm peers --config {c0}\n\
                     try: storm-submit --config {c0} --clusters c1 -N {nodes} hostname\n\
                     try: storm lend --config {c1} node0 --to c0 --for 10, then storm-submit \
                     --config {c0} --borrow -N {} hostname\n\
                     stop: storm-testbed --name {} down",
                    nodes + 1,
                    cli.name
                );
                fed.detach();
                return Ok(());
            }
            let tb = Testbed::up(&opts)?;
            if managers > 1 {
                println!(
                    "a replicated MM: {managers} replicas in namespaces {}-m0..{}-m{}; \
                     storm managers --config {} shows them",
                    cli.name,
                    cli.name,
                    managers - 1,
                    tb.config_path.display()
                );
            }
            println!(
                "testbed {} up: {nodes} nodes in namespaces {}-n0..{}-n{}, MM in {}-mm\n\
                 cluster file: {}\n\
                 try: storm-submit --config {} -N {nodes} hostname\n\
                 stop: storm-testbed --name {} down",
                cli.name,
                cli.name,
                cli.name,
                nodes - 1,
                cli.name,
                tb.config_path.display(),
                tb.config_path.display(),
                cli.name
            );
            tb.detach();
        }
        Cmd::Down => {
            if !dir.exists() {
                bail!(
                    "no testbed {:?} ({} does not exist)",
                    cli.name,
                    dir.display()
                );
            }
            if federation::is_federation(&dir) {
                federation::down(&dir)?;
            } else {
                down_by_state(&dir)?;
            }
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            println!("testbed {} down", cli.name);
        }
        Cmd::Link {
            node,
            cluster,
            state,
        } => match (node, cluster) {
            (_, Some(k)) => federation::set_link(&format!("{}-fed", cli.name), k, state == "up")
                .with_context(|| format!("is testbed {:?} up with --clusters?", cli.name))?,
            (Some(i), None) => set_link(&cli.name, i, state == "up")
                .with_context(|| format!("is testbed {:?} up?", cli.name))?,
            (None, None) => bail!("--node or --cluster: which link?"),
        },
    }
    Ok(())
}
