//! `storm`: look at and manage a storm cluster (queue, history, stat, cancel, nodes, top,
//! metrics, drain, resume, shutdown), and make its key (keygen).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use storm_cli::alloc::AllocArgs;
use storm_cli::batch::{BatchArgs, Script};
use storm_cli::{metrics_http, views};
use storm_cluster::control::{Client, NodeInfo, Reply, Request};
use storm_primitives::NodeSet;

#[derive(Parser)]
#[command(name = "storm", version, about = "Look at and manage a storm cluster")]
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

/// `storm managers` changes to the manager group (operators only).
#[derive(Subcommand)]
enum ManagersCmd {
    /// Remove a replica from the group (a Raft configuration change the leader proposes):
    /// for a replica whose state directory is lost, before a new one joins in its place
    /// (`storm-mm --manager NAME --join` on an empty state directory). Refused for the
    /// leader itself, and when the voters left that answer would not make a majority.
    Remove {
        /// The replica's `[[manager]]` name.
        name: String,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Submit a batch script (like sbatch): prints the job id at once; the script runs on
    /// the first node of its allocation with its output in a file, and `storm-submit` in it
    /// runs steps on the allocation's nodes.
    Batch(Box<BatchArgs>),
    /// Get an allocation and run a command (default: your shell) here with it (like salloc):
    /// `storm-submit` in the command runs steps on the allocation's nodes; the allocation is
    /// given back when the command ends.
    Alloc(Box<AllocArgs>),
    /// Start a private storm instance over this Slurm allocation's nodes, as you, and run a
    /// command (default: your shell) against it; the instance ends with the command
    /// (`storm start -- storm-submit -N 4 hostname`; `--local N` on this host alone).
    Start(Box<storm_cli::start::StartArgs>),
    /// One node of a private instance (started by `storm start` on each node).
    #[command(hide = true)]
    Agent(storm_cli::start::AgentArgs),
    /// Jobs queued and running.
    Queue {
        /// Print JSON (`{"jobs": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Jobs that ended (the last 1000), with their exit code and why they ended.
    History {
        /// Print JSON (`{"jobs": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
        /// Only jobs that ended since: a time ago (30m, 2h, 3d) or a local date
        /// (2026-11-27, 2026-11-27T08:00).
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// Only this user's jobs (a name or uid).
        #[arg(long, short = 'u')]
        user: Option<String>,
        /// Only jobs that ended so: completed, failed, cancelled, timeout, node_fail
        /// (several, separated by commas).
        #[arg(long, short = 's')]
        state: Option<String>,
    },
    /// Cancel a job (its owner or root only): `12`; an array job's id cancels every element
    /// not yet ended, `12_3` only element 3.
    Cancel {
        #[arg(value_parser = clap::value_parser!(storm_cluster::control::JobRef))]
        job: storm_cluster::control::JobRef,
    },
    /// Nodes and their state.
    Nodes {
        /// Print JSON (`{"nodes": [...]}`, with each node's last sample and inventory)
        /// instead of a table.
        #[arg(long)]
        json: bool,
        /// Show each node's last sample: CPU, load, memory, disks, network, the NM's own CPU,
        /// its age, and where the CPU and memory figures come from.
        #[arg(long, short)]
        long: bool,
        /// Only the nodes whose last sample matches, with Fountain's operators:
        /// `cpu>0.5,mem_avail<4G`, `name like node1*` (docs/monitoring.md).
        #[arg(long = "where", value_name = "FILTER")]
        filter: Option<String>,
        /// Each node's samples over the last WINDOW (`90s`, `10m`, `1h`), as the machine
        /// manager keeps them (`[monitoring] history_s`).
        #[arg(long, value_name = "WINDOW", conflicts_with_all = ["long", "filter"])]
        history: Option<String>,
        /// With --history: only these nodes (`--node n3`, `--node 'n[1-4]'`; every node if
        /// not given).
        #[arg(long, value_name = "NODES", requires = "history")]
        node: Vec<String>,
        /// With --history: draw CPU and memory over time into this PNG file.
        #[arg(long, value_name = "FILE.png", requires = "history")]
        plot: Option<PathBuf>,
    },
    /// What a running job uses now, node by node (like sstat): the CPUs it keeps busy, its
    /// CPU time so far, its memory now and its peak, from its cgroup on each node.
    Stat {
        #[arg(value_parser = clap::value_parser!(storm_cluster::control::JobRef))]
        job: storm_cluster::control::JobRef,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A live view of the cluster in the terminal: each node's state, jobs, CPU, load, memory
    /// and spool, the jobs running and waiting (q quits; c, m, n sort).
    Top {
        /// How often the view asks the machine manager.
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        interval_ms: u64,
    },
    /// The peer clusters, as this cluster's peer agent (storm-peer) sees them: state, what
    /// each offers this cluster (idle nodes and CPUs), the link's lag (docs/federation.md).
    Peers {
        /// Print JSON (`{"peers": [...], "reported_ms_ago": N}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The replicas of a replicated machine manager, as the leader sees them: role, term,
    /// the last log entry each holds, how far each lags, when each was last heard from.
    Managers {
        /// Print JSON (`{"managers": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        change: Option<ManagersCmd>,
    },
    /// The machine manager's metrics, in the Prometheus text format.
    Metrics {
        /// Serve them over HTTP (`GET /metrics`) for Prometheus to scrape, instead of
        /// printing them once: on loopback (127.0.0.1:9464) unless an address is given; an
        /// address other than loopback needs --token-file.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = metrics_http::DEFAULT_LISTEN)]
        listen: Option<SocketAddr>,
        /// A file (mode 0600) whose first line is the bearer token every scrape must send
        /// (`Authorization: Bearer TOKEN`).
        #[arg(long, value_name = "FILE", requires = "listen")]
        token_file: Option<PathBuf>,
        /// How often the exporter asks the machine manager; scrapes are answered from the
        /// last answer, so they cost the MM nothing.
        #[arg(long, value_name = "MS", default_value_t = 1000, requires = "listen")]
        refresh_ms: u64,
    },
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
    /// Lend idle nodes to a peer cluster for a while (docs/federation.md): each runs the
    /// peer's jobs, as the [[peer]]'s flock_user, until reclaimed or the lease ends.
    Lend {
        /// Node ids (`0-3,7`) or names (`node0,node5`).
        nodes: String,
        /// The peer cluster that borrows them (a [[peer]] this cluster lends to).
        #[arg(long)]
        to: String,
        /// How long the lease lasts (minutes, or [D-]HH:MM:SS as --time takes it).
        #[arg(long = "for", value_name = "DURATION", value_parser = storm_cluster::control::parse_time_limit)]
        for_ms: u64,
    },
    /// Call lent nodes home. The borrower is told why, and its jobs there end (or are
    /// requeued if they asked for it) with that reason; the nodes come home once it gives
    /// them back, or after `[federation] vacate_ms` at the latest.
    Reclaim {
        /// Node ids (`0-3,7`) or names (`node0,node5`).
        nodes: String,
        /// Take them home at once, without telling the borrower (its jobs there see their
        /// nodes fail).
        #[arg(long)]
        now: bool,
        /// Return once the borrower was told, without waiting for the nodes to come home
        /// (by default the command returns when they are: within `[federation] vacate_ms`).
        #[arg(long)]
        no_wait: bool,
    },
    /// Stop the machine manager and every node manager.
    Shutdown,
    /// Make a key: by default the cluster's secret key, a new file of mode 0600 that every
    /// daemon reads (copy it to every node, owned by the daemons' user). Users never need it.
    Keygen {
        /// Where to write it (default: where the cluster file says the daemons look for it).
        /// A key written elsewhere serves as a pair key for a `[[peer]]` (docs/federation.md).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Make the MM's signing key instead (`mm.key`, on the MM's host only) and its public
        /// half (`mm.pub` beside it; copy it next to the cluster file on every node).
        #[arg(long, conflicts_with = "node")]
        mm: bool,
        /// Make node NAME's identity key instead (`node.key`, on that node only); it prints
        /// the line that enrolls the node at the MM (`storm enroll`).
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
    },
    /// Write this cluster's guest file into DIR, for the operators of peer clusters that
    /// lend it nodes (docs/federation.md, guest files): its topology alone (`cluster.toml`,
    /// the settings a peer may make), with the keys their nodes' guest NMs need beside it,
    /// where this host has them: the cluster key (`storm.key`), the MM's public key
    /// (`mm.pub`) and each guest slot's identity key (`keys/SLOT.key`). Hand DIR over as
    /// you would the cluster key; the lender installs it, root's, as its `[[peer]]
    /// guest_file`.
    GuestFile {
        /// The directory to write (made if missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// Enroll a node's identity key at the MM (run on the MM's host): adds `NAME KEY`, as
    /// `storm keygen --node NAME` printed it, to the enrolled keys the MM reads (at start and
    /// on SIGHUP).
    Enroll {
        name: String,
        key: String,
        /// Replace the key a node already has enrolled (key rotation).
        #[arg(long)]
        replace: bool,
    },
}

fn run(args: Args) -> Result<(), String> {
    match args.command {
        Cmd::Keygen { out, mm, node } => return keygen(out, args.config, mm, node),
        Cmd::Enroll { name, key, replace } => return enroll(args.config, &name, &key, replace),
        Cmd::GuestFile { out } => return guest_file(args.config, &out),
        Cmd::Start(start) => {
            let code = storm_cli::start::host::run(*start).map_err(|e| format!("{e:#}"))?;
            std::process::exit(code);
        }
        Cmd::Agent(agent) => {
            let code = storm_cli::start::agent::run(agent).map_err(|e| format!("{e:#}"))?;
            std::process::exit(code);
        }
        _ => {}
    }
    let sockets = storm_cli::control_sockets(args.socket.clone(), args.config.clone())?;
    let socket = storm_cli::control_socket(args.socket, args.config.clone())?;
    let mut filter = storm_cli::history::HistoryFilter::default();
    let mut node_filter = None;
    let mut long_nodes = false;
    let (req, json) = match args.command {
        Cmd::Batch(batch) => return submit_batch(*batch, &socket, &sockets),
        Cmd::Alloc(alloc) => {
            let config = args
                .config
                .as_deref()
                .map(|c| std::path::absolute(c).unwrap_or_else(|_| c.to_path_buf()));
            let code = storm_cli::alloc::run(*alloc, &sockets, config.as_deref())?;
            std::process::exit(code);
        }
        Cmd::Metrics {
            listen,
            token_file,
            refresh_ms,
        } => return metrics(&socket, listen, token_file, refresh_ms),
        Cmd::Top { interval_ms } => {
            let cluster = storm_cluster::config::ClusterConfig::load(&storm_cli::config_path(
                args.config.clone(),
            ))
            .map_or_else(|_| "storm".to_string(), |c| c.cluster.name);
            return storm_cli::top::run(
                cluster,
                || connect(&socket, &sockets),
                std::time::Duration::from_millis(interval_ms.max(100)),
            );
        }
        Cmd::Stat { job, json } => return job_stat(&connect(&socket, &sockets)?, &job, json),
        Cmd::Queue { json } => (Request::Queue, json),
        Cmd::History {
            json,
            ref since,
            ref user,
            ref state,
        } => {
            let now = storm_cluster::daemon::unix_ms();
            filter = storm_cli::history::HistoryFilter::parse(
                since.as_deref(),
                user.as_deref(),
                state.as_deref(),
                now,
            )?;
            (Request::History, json)
        }
        Cmd::Cancel { job } => (
            match job {
                storm_cluster::control::JobRef::Id(job) => Request::Cancel { job },
                storm_cluster::control::JobRef::Element { array, index } => {
                    Request::CancelElement { array, index }
                }
            },
            false,
        ),
        Cmd::Nodes {
            json,
            history: Some(ref window),
            ref node,
            ref plot,
            ..
        } => {
            return node_history(&socket, &sockets, window, node, json, plot.as_deref());
        }
        Cmd::Nodes {
            json,
            long,
            filter: ref text,
            ..
        } => {
            node_filter = text
                .as_deref()
                .map(storm_cli::node_filter::NodeFilter::parse)
                .transpose()?;
            long_nodes = long;
            (Request::Nodes, json)
        }
        Cmd::Peers { json } => (Request::Peers, json),
        Cmd::Managers { json, change: None } => (Request::Managers, json),
        Cmd::Managers {
            change: Some(ManagersCmd::Remove { name }),
            ..
        } => (Request::RemoveManager { name }, false),
        Cmd::Drain { nodes, reason } => (
            Request::Drain {
                nodes: node_set(&socket, &nodes)?,
                reason,
            },
            false,
        ),
        Cmd::Resume { nodes } => (
            Request::Resume {
                nodes: node_set(&socket, &nodes)?,
            },
            false,
        ),
        Cmd::Lend { nodes, to, for_ms } => (
            Request::Lend {
                nodes: node_set(&socket, &nodes)?,
                peer: to,
                for_ms,
            },
            false,
        ),
        Cmd::Reclaim {
            nodes,
            now,
            no_wait,
        } => {
            let set = node_set(&socket, &nodes)?;
            let client = connect(&socket, &sockets)?;
            let req = Request::Reclaim {
                nodes: set.clone(),
                now,
            };
            match client.call(&req)? {
                Reply::Notice(text) => println!("{text}"),
                Reply::Error(e) => return Err(e),
                other => return Err(format!("unexpected reply {other:?}")),
            }
            if !no_wait {
                wait_home(&client, &set)?;
            }
            return Ok(());
        }
        Cmd::Shutdown => (Request::Shutdown, false),
        Cmd::Keygen { .. }
        | Cmd::Enroll { .. }
        | Cmd::GuestFile { .. }
        | Cmd::Start(_)
        | Cmd::Agent(_) => {
            unreachable!("handled above")
        }
    };
    let client = connect(&socket, &sockets)?;
    let reply = match client.call(&req)? {
        Reply::History(jobs) => Reply::History(storm_cli::history::filtered(jobs, &filter)),
        Reply::Nodes(nodes) => Reply::Nodes(match &node_filter {
            Some(f) => nodes.into_iter().filter(|n| f.matches(n)).collect(),
            None => nodes,
        }),
        other => other,
    };
    match reply {
        Reply::Queue(jobs) | Reply::History(jobs) if json => {
            let nodes = node_list(&client)?;
            let views: Vec<_> = jobs.iter().map(|j| views::job_view(j, &nodes)).collect();
            println!("{}", views::jobs_json(&views));
        }
        Reply::Queue(jobs) => print!("{}", views::queue_table(&jobs)),
        Reply::History(jobs) => print!("{}", views::history_table(&jobs)),
        Reply::Nodes(nodes) if json => {
            let views: Vec<_> = nodes.iter().map(views::node_view).collect();
            println!("{}", views::nodes_json(&views));
        }
        Reply::Nodes(nodes) if long_nodes => print!("{}", views::nodes_long_table(&nodes)),
        Reply::Nodes(nodes) => print!("{}", views::nodes_table(&nodes)),
        Reply::Peers {
            peers,
            reported_ms_ago,
        } if json => println!("{}", views::peers_json(&peers, reported_ms_ago)),
        Reply::Peers {
            peers,
            reported_ms_ago,
        } => print!("{}", views::peers_table(&peers, reported_ms_ago)),
        Reply::Managers(managers) if json => println!("{}", views::managers_json(&managers)),
        Reply::Managers(managers) => print!("{}", views::managers_table(&managers)),
        Reply::Done => {}
        Reply::Notice(text) => println!("{text}"),
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    }
    Ok(())
}

/// `storm nodes --history`: the nodes' samples as a table, JSON, or a plot.
fn node_history(
    socket: &Path,
    sockets: &[PathBuf],
    window: &str,
    names: &[String],
    json: bool,
    plot: Option<&Path>,
) -> Result<(), String> {
    let window_ms = storm_cli::node_history::parse_window(window)?;
    let mut nodes = Vec::new();
    for n in names {
        nodes.extend(storm_cluster::hostlist::expand(n).map_err(|e| format!("--node {n:?}: {e}"))?);
    }
    let client = connect(socket, sockets)?;
    let traces = match client.call(&Request::NodeHistory { nodes, window_ms })? {
        Reply::NodeHistory(t) => t,
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    if let Some(path) = plot {
        storm_cli::node_history::plot(&traces, path)
            .map_err(|e| format!("--plot {}: {e:#}", path.display()))?;
    }
    if json {
        println!("{}", storm_cli::node_history::json(&traces));
    } else if plot.is_none() {
        print!("{}", storm_cli::node_history::table(&traces));
    }
    Ok(())
}

/// A connection to the MM at `socket`, or where it answers none, the error that says why of
/// every socket the MM may be on (a replicated MM without a leader).
fn connect(socket: &Path, sockets: &[PathBuf]) -> Result<Client, String> {
    if sockets.len() > 1 {
        return storm_cli::connect_any(sockets).map(|(c, _)| c);
    }
    Client::connect(socket)
}

/// `storm keygen`: writes a new key where the cluster file says the daemons look for it.
fn keygen(
    out: Option<PathBuf>,
    config: Option<PathBuf>,
    mm: bool,
    node: Option<String>,
) -> Result<(), String> {
    use storm_cluster::identity;
    let cfg = || {
        storm_cluster::config::ClusterConfig::load(&storm_cli::config_path(config.clone()))
            .map_err(|e| format!("{e} (or give the key's path with --out)"))
    };
    if mm {
        let (secret, public_path) = match out {
            // Beside it, with `.pub` added (never over the `mm.pub` in use while rotating).
            Some(p) => {
                let mut public = p.clone().into_os_string();
                public.push(".pub");
                (p, PathBuf::from(public))
            }
            None => cfg()?.mm_key_paths(),
        };
        let public =
            identity::generate(&secret, storm_cluster::key::MM_KEY).map_err(|e| e.to_string())?;
        identity::write_public(&public_path, &public)
            .map_err(|e| format!("{}: {e}", public_path.display()))?;
        eprintln!(
            "storm keygen: wrote the MM's signing key to {} (mode 0600; keep it on the MM's host \
             only) and its public key to {}; copy {} next to the cluster file on every node",
            secret.display(),
            public_path.display(),
            public_path.display()
        );
        return Ok(());
    }
    if let Some(name) = node {
        let path = match out {
            Some(p) => p,
            None => cfg()?.node_key_path(&name),
        };
        let public =
            identity::generate(&path, storm_cluster::key::NODE_KEY).map_err(|e| e.to_string())?;
        eprintln!(
            "storm keygen: wrote node {name}'s identity key to {} (mode 0600; keep it on that \
             node only); enroll it on the MM's host with:",
            path.display()
        );
        println!("storm enroll {name} {}", identity::public_hex(&public));
        return Ok(());
    }
    let path = match out {
        Some(p) => p,
        None => cfg()?
            .cluster
            .key_file
            .expect("a loaded cluster file names its key file"),
    };
    storm_cluster::key::generate(&path).map_err(|e| e.to_string())?;
    eprintln!(
        "storm keygen: wrote a new cluster key to {} (mode 0600); copy it to every node",
        path.display()
    );
    Ok(())
}

/// `storm enroll`: adds (or with `replace`, replaces) a node's public identity key in the
/// enrolled keys the MM reads.
fn guest_file(config: Option<PathBuf>, out: &std::path::Path) -> Result<(), String> {
    let cfg = storm_cluster::config::ClusterConfig::load(&storm_cli::config_path(config))
        .map_err(|e| e.to_string())?;
    let written = storm_cluster::guest_file::write_guest_dir(&cfg, out)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    for f in &written {
        println!("{}", f.display());
    }
    eprintln!(
        "storm guest-file: give {} to the operators of the clusters that lend to {:?}; each \
         installs it root's, not writable by others, and names its cluster.toml as the \
         [[peer]] guest_file",
        out.display(),
        cfg.cluster.name
    );
    Ok(())
}

fn enroll(config: Option<PathBuf>, name: &str, key: &str, replace: bool) -> Result<(), String> {
    let cfg = storm_cluster::config::ClusterConfig::load(&storm_cli::config_path(config))
        .map_err(|e| e.to_string())?;
    if cfg.node_by_name(name).is_none() {
        return Err(format!("no node {name:?} in the cluster file"));
    }
    let public = storm_cluster::identity::parse_public(key).map_err(|e| format!("{key}: {e}"))?;
    let path = cfg.enrolled_path();
    let mut enrolled = match std::fs::read_to_string(&path) {
        Ok(text) => storm_cluster::identity::Enrolled::parse(&text)
            .map_err(|e| format!("{}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if enrolled.key(name).is_some() && !replace {
        return Err(format!(
            "{name} is already enrolled in {}: give --replace to replace its key",
            path.display()
        ));
    }
    enrolled.insert(name, public);
    // Written aside and renamed, so the MM never reads half a file.
    let partial = path.with_extension("partial");
    storm_cluster::identity::write_anchor(&partial, &enrolled.to_text())
        .and_then(|()| std::fs::rename(&partial, &path))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "storm enroll: {name} enrolled in {}; a running MM reads it on SIGHUP",
        path.display()
    );
    Ok(())
}

/// `storm metrics`: print them once, or serve them.
fn metrics(
    socket: &std::path::Path,
    listen: Option<SocketAddr>,
    token_file: Option<PathBuf>,
    refresh_ms: u64,
) -> Result<(), String> {
    let Some(addr) = listen else {
        print!("{}", metrics_http::fetch(socket)?);
        return Ok(());
    };
    let token = token_file
        .map(|p| metrics_http::read_token(&p))
        .transpose()?;
    let opts = metrics_http::ExporterOptions {
        listen: addr,
        token,
        refresh: std::time::Duration::from_millis(refresh_ms),
    };
    let server = metrics_http::MetricsServer::bind(opts, socket.to_path_buf())?;
    let bound = server.local_addr().unwrap_or(addr);
    eprintln!("storm metrics: serving http://{bound}/metrics");
    server.serve();
    Ok(())
}

/// The MM's node listing.
/// `storm stat JOB`: the job's figures on each of its nodes.
fn job_stat(
    client: &Client,
    job: &storm_cluster::control::JobRef,
    json: bool,
) -> Result<(), String> {
    let jobs = match client.call(&Request::Queue)? {
        Reply::Queue(jobs) => jobs,
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    let stat = storm_cli::job_stat::stat(job, &jobs, &node_list(client)?)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&stat).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", storm_cli::job_stat::table(&stat));
    }
    Ok(())
}

fn node_list(client: &Client) -> Result<Vec<NodeInfo>, String> {
    match client.call(&Request::Nodes)? {
        Reply::Nodes(n) => Ok(n),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// Waits until none of `nodes` is lent any more (a node called home comes home once its
/// borrower gives it back, or `[federation] vacate_ms` after the call), and says so: the
/// next command then finds the borrower already without them.
fn wait_home(client: &Client, nodes: &NodeSet) -> Result<(), String> {
    let limit = std::time::Duration::from_secs(600);
    let start = std::time::Instant::now();
    let mut waited = false;
    loop {
        let still: Vec<String> = node_list(client)?
            .into_iter()
            .filter(|n| nodes.contains(n.id) && n.state == storm_cluster::control::NodeState::Lent)
            .map(|n| n.name)
            .collect();
        if still.is_empty() {
            if waited {
                println!("home now: {} node(s)", nodes.len());
            }
            return Ok(());
        }
        waited = true;
        if start.elapsed() > limit {
            return Err(format!(
                "{} still lent after {} s (see storm nodes)",
                still.join(","),
                limit.as_secs()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Nodes named by ids (`0-3,7`) or by names (`node0,node5`, looked up with the MM).
fn node_set(socket: &std::path::Path, text: &str) -> Result<NodeSet, String> {
    if let Ok(set) = text.parse::<NodeSet>() {
        return Ok(set);
    }
    let nodes = node_list(&Client::connect(socket)?)?;
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
    storm_cluster::cli_docs::exit_if_asked::<Args>();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storm: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// A new connection to the MM (any replica's socket of `sockets`), tried for up to `within`,
/// after the one that was lost (`why`): `what` says what for, `then` what follows, and
/// `gave_up` the error if it does not come back.
fn reconnect_to(
    sockets: &[PathBuf],
    within: std::time::Duration,
    why: &str,
    (what, then): (&str, &str),
    gave_up: impl Fn() -> String,
) -> Result<Client, String> {
    if within.is_zero() {
        return Err(gave_up());
    }
    eprintln!(
        "storm batch: {why}; waiting up to {} s for the machine manager to come back {what}",
        within.as_secs()
    );
    match storm_cli::reconnect_within(sockets, within, || false) {
        Some((client, _)) => {
            eprintln!("storm batch: the machine manager is back; {then}");
            Ok(client)
        }
        None => Err(gave_up()),
    }
}

/// `storm batch`: submits the script with its job and prints the id once the MM accepted it
/// (it holds the script and the job in its journal by then); the job goes on without us.
/// With `--wait`, follows the job (every element of an array) to its end and exits with its
/// exit code (the highest of an array's, as sbatch --wait); if the MM restarts meanwhile, it
/// reconnects and follows the elements that have not ended (`--reconnect`). A submission
/// whose answer the MM's restart (or a failover) cut off is sent again with its token: an MM
/// that holds it already answers with the job it made.
fn submit_batch(
    args: BatchArgs,
    socket: &std::path::Path,
    sockets: &[PathBuf],
) -> Result<(), String> {
    let here = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let (parsable, wait) = (args.parsable, args.wait);
    let reconnect = std::time::Duration::from_secs(args.reconnect);
    let user = storm_cli::batch::user_name();
    let (mut req, script) = storm_cli::batch::request(args, &here, std::env::vars_os(), &user)?;
    req.token = Some(rand::random());
    let mut to_end = req.array.as_ref().map_or(1, |a| a.indices.len());
    let mut worst = 0;
    let file = match script {
        Script::File(path) => std::fs::File::open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?,
        // A file of no name, sent like any script.
        Script::Text(text) => {
            use std::io::{Seek, Write};
            let mut f = tempfile::tempfile().map_err(|e| format!("a file for --wrap: {e}"))?;
            f.write_all(text.as_bytes())
                .and_then(|()| f.rewind())
                .map_err(|e| format!("a file for --wrap: {e}"))?;
            f
        }
    };
    let elements = to_end as u64;
    let mut client = Client::connect(socket)?;
    let submit = |client: &Client| {
        storm_cli::sent_or_lost(client.try_request(
            &Request::Submit(Box::new(req.clone())),
            Some(std::os::fd::AsFd::as_fd(&file)),
        ))
    };
    submit(&client)?;
    // The array's (or job's) id, once accepted; the elements that have ended.
    let mut accepted: Option<u64> = None;
    let mut ended = std::collections::BTreeSet::new();
    let mut losses = storm_cli::Losses::default();
    loop {
        let next = client.next();
        let go_on = losses.after(&next);
        let reply = match (next, accepted) {
            (Ok(r), _) => r,
            (Err(e), _) if !go_on => {
                return Err(format!(
                    "lost the machine manager {} times in a row without a word \
                     from it ({e}); see storm queue for the job",
                    storm_cli::LOSSES_IN_A_ROW
                ));
            }
            (Err(e), None) => {
                let what = (
                    "to send the job again (an MM that took it already answers with its id)",
                    "sending the job again",
                );
                client = reconnect_to(sockets, reconnect, &e, what, || {
                    format!(
                        "lost the machine manager ({e}) before it confirmed the job; it may \
                         have been accepted all the same (see storm queue)"
                    )
                })?;
                submit(&client)?;
                continue;
            }
            (Err(e), Some(job)) => {
                // Follow the elements that have not ended on a new connection, as storm-submit
                // follows its job.
                let (what, then) = (
                    format!("to follow job {job}"),
                    format!("following job {job}"),
                );
                client = reconnect_to(sockets, reconnect, &e, (&what, &then), || {
                    format!(
                        "lost the machine manager ({e}); job {job} goes on without us (see \
                         storm queue and storm history)"
                    )
                })?;
                for id in (job..job + elements).filter(|id| !ended.contains(id)) {
                    storm_cli::sent_or_lost(
                        client.try_request(&Request::Attach { job: id }, None),
                    )?;
                }
                continue;
            }
        };
        match reply {
            // Sent again for each element followed after a reconnection.
            Reply::Accepted { .. } if accepted.is_some() => {}
            Reply::Accepted { job, queued } => {
                accepted = Some(job);
                if parsable {
                    println!("{job}");
                } else {
                    println!("Submitted batch job {job}");
                    if let Some(why) = queued {
                        eprintln!(
                            "storm batch: job {job} queued: {}",
                            storm_cli::display::safe(&why)
                        );
                    }
                }
                if !wait {
                    return Ok(());
                }
            }
            // A batch script writes to its files: what comes here is a node saying why the
            // script could not start.
            Reply::Output(chunk) => {
                for line in String::from_utf8_lossy(&chunk.data).lines() {
                    eprintln!("{}", storm_cli::display::safe(line));
                }
            }
            Reply::Finished(outcome) => {
                if let Some(why) = &outcome.reason {
                    eprintln!(
                        "storm batch: job {}: {}",
                        outcome.job,
                        storm_cli::display::safe(why)
                    );
                }
                if !ended.insert(outcome.job) {
                    continue;
                }
                worst = worst.max(outcome.exit_code());
                to_end -= 1;
                if to_end == 0 {
                    std::process::exit(worst);
                }
            }
            Reply::Error(e) => return Err(e),
            _ => {}
        }
    }
}
