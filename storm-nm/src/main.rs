//! `storm-nm`: the node manager daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use anyhow::Result;
use clap::Parser;
use storm_cluster::ClusterConfig;
use storm_cluster::daemon;
use storm_cluster::endpoint::Listen;
use storm_cluster::guest_file::GuestSetup;
use storm_nm::daemon::Lease;
use storm_nm::guest::Told;
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
    /// Run as the guest NM of this node lent to peer cluster PEER (docs/federation.md; the
    /// node's own NM starts it, with the node's own cluster file as --config). It joins the
    /// peer's fabric as the guest slot that the peer's guest file (`[[peer]] guest_file`)
    /// names for this node, takes nothing else from the peer, and runs every job as the
    /// peer's `flock_user`.
    #[arg(long, requires = "lease", value_name = "PEER")]
    guest_of: Option<String>,
    /// A guest NM's lease end (Unix ms): it stops itself and its jobs then.
    #[arg(long, requires = "guest_of", group = "lease", value_name = "UNIX_MS")]
    lease_until: Option<u64>,
    /// A guest NM's lease grant, signed by this cluster's MM (hex), which it shows the
    /// borrower when it registers: the borrower admits a guest slot only with one.
    #[arg(long, requires = "lease_until", value_name = "HEX")]
    lease_grant: Option<String>,
    /// A warm guest NM, started ahead of a lend by the node's NM: it gets ready, then waits
    /// on its standard input for the lease's end (Unix ms), or `retire`; it goes if that
    /// closes first (docs/federation.md, warm guests).
    #[arg(long, requires = "guest_of", group = "lease")]
    warm: bool,
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
    let own = ClusterConfig::load(&args.config)?;
    let own_node = own
        .this_node(args.node.as_deref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    // A guest runs by the peer's topology and this cluster's own settings.
    let (config, node, guest_user) = match &args.guest_of {
        None => (own, own_node, None),
        Some(peer) => {
            let name = own.nodes[own_node as usize].name.clone();
            let setup = GuestSetup::load(&own, &name, peer)?;
            (setup.config, setup.slot, Some(setup.user))
        }
    };
    let nm_daemon::Helpers {
        pl_path,
        pmi_library,
        pmix_helper,
    } = nm_daemon::helpers(&config)?;
    // A warm guest waits at normal priority: its setup must not take a core from the daemons
    // of this node at work. It takes real-time priority once lent.
    if args.warm {
        // It may have been started real-time, as its node's NM runs.
        daemon::set_normal_priority();
    } else {
        daemon::set_rt_priority(config.scheduler.daemon_rt_priority);
    }
    let stop = daemon::stop_flag()?;
    let listen = args.listen_fd.map(Listen::Fd).unwrap_or(Listen::Configured);
    let guest = match &guest_user {
        Some(name) => {
            let user = nix::unistd::User::from_name(name)?
                .ok_or_else(|| anyhow::anyhow!("flock_user {name}: no such account here"))?;
            Some(nm_daemon::Guest {
                user: (user.uid.as_raw(), user.gid.as_raw()),
                lease: match args.lease_until {
                    Some(ms) => Lease::Until(ms),
                    None => Lease::OnLend,
                },
            })
        }
        None => None,
    };
    let mut ready = nm_daemon::prepare(NmOptions {
        config,
        config_path: guest.is_none().then(|| args.config.clone()),
        node,
        listen,
        pl_path,
        pmi_library,
        pmix_helper,
        stop: stop.clone(),
        guest,
    })?;
    let lease_until_ms = match guest.map(|g| g.lease) {
        None => None,
        Some(Lease::Until(ms)) => {
            if let Some(hex) = &args.lease_grant {
                let grant = storm_cluster::identity::LeaseGrant::from_hex(hex)
                    .map_err(|e| anyhow::anyhow!("--lease-grant: {e}"))?;
                ready.show_lease(grant);
            }
            Some(ms)
        }
        Some(Lease::OnLend) => loop {
            match storm_nm::guest::wait_for_lend(&mut std::io::stdin().lock())? {
                Told::Groups => ready.make_groups(),
                Told::Lease(ms, grant) if !stop.load(Ordering::Acquire) => {
                    if let Some(grant) = grant {
                        ready.show_lease(grant);
                    }
                    break Some(ms);
                }
                Told::Lease(..) | Told::Retire => {
                    tracing::debug!("a warm guest NM goes unlent");
                    return Ok(());
                }
                Told::NmGone => {
                    tracing::debug!("a warm guest NM goes unlent: its node's NM died");
                    // Its groups are left to the node's next NM (see Told::NmGone); its
                    // launcher dies with it.
                    std::process::exit(0);
                }
            }
        },
    };
    if args.warm {
        ready.take_rt_priority();
        // Lent, it owns the slot's groups (the guest before it has stopped).
        ready.make_groups();
    }
    let nm = ready.open(lease_until_ms)?;
    daemon::notify_ready();
    nm.run()
}
