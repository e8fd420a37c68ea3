//! `storm-local`: a whole cluster in one process on the local backend.
//!
//! The machine manager and every node's node manager run as threads sharing one in-process
//! fabric (`storm_primitives::local`): the same daemons' code as `storm-mm` and `storm-nm`,
//! with no sockets between them. Tasks are real processes (one storm-pl each), as on a real
//! node. `storm-submit --local N --backend local` starts one for its embedded cluster.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{Result, bail};
use clap::Parser;
use storm_cluster::config::BackendKind;
use storm_cluster::daemon;
use storm_cluster::endpoint::Listen;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_mm::MmOptions;
use storm_nm::NmOptions;
use storm_primitives::local::LocalFabric;

#[derive(Parser)]
#[command(
    name = "storm-local",
    version,
    about = "storm on one machine: the MM and every node's NM as threads of one process (backend \"local\")"
)]
struct Args {
    /// The cluster file; its backend must be "local".
    #[arg(long, short)]
    config: PathBuf,
}

fn main() -> Result<()> {
    storm_cluster::cli_docs::exit_if_asked::<Args>();
    daemon::init_logging();
    // Connections, programs and tasks' pipes are descriptors: the hard limit, not systemd's
    // default soft one of 1024.
    daemon::raise_open_files_limit();
    let args = Args::parse();
    let config = ClusterConfig::load(&args.config)?;
    if config.cluster.backend != BackendKind::Local {
        bail!(
            "{} uses backend {:?}: storm-local runs clusters whose backend is \"local\" (start \
             storm-mm and storm-nm for the others)",
            args.config.display(),
            config.cluster.backend
        );
    }
    let rm = RmLayout::new(&config)?;
    let fabric = LocalFabric::new(config.node_count() + 1, rm.layout.clone());
    let stop = daemon::stop_flag()?;
    let storm_nm::daemon::Helpers {
        pl_path,
        pmi_library,
        pmix_helper,
    } = storm_nm::daemon::helpers(&config)?;
    // Every NM is started (or has failed to) before the MM starts and says it is ready.
    let mut nms = Vec::new();
    // Guest slots run no NM here: a lent node's own NM starts their guest.
    for node in (0..config.node_count()).filter(|&n| !config.is_guest(n)) {
        let opts = NmOptions {
            config: config.clone(),
            config_path: None,
            node,
            listen: Listen::Local(fabric.clone()),
            pl_path: pl_path.clone(),
            pmi_library: pmi_library.clone(),
            pmix_helper: pmix_helper.clone(),
            stop: stop.clone(),
            guest: None,
        };
        let (started_tx, started) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name(format!("storm-nm-{node}"))
            .spawn(move || -> Result<()> {
                let nm = match storm_nm::daemon::start(opts) {
                    Ok(nm) => {
                        let _ = started_tx.send(Ok(()));
                        nm
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(format!("{e:#}")));
                        return Ok(());
                    }
                };
                nm.run()
            })?;
        match started.recv() {
            Ok(Ok(())) => nms.push((node, thread)),
            Ok(Err(e)) => bail!("node {node}: {e}"),
            Err(_) => bail!("node {node}: its node manager ended while starting"),
        }
    }
    let mm = storm_mm::run(MmOptions {
        config,
        manager: None,
        join: false,
        listen: Listen::Local(fabric),
        stop: stop.clone(),
    });
    // The MM told the nodes to shut down, or a signal stopped it: stop every NM too.
    stop.store(true, Ordering::Release);
    for (node, thread) in nms {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(node, "node manager: {e:#}"),
            Err(_) => tracing::error!(node, "node manager panicked"),
        }
    }
    mm
}
