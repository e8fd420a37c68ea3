//! # storm-cli: the user's tools
//!
//! * `storm-submit`: launch a parallel job and follow it (shaped like Slurm's `srun`), on a
//!   cluster or on an embedded local one (`--local N`, [`local`]).
//! * [`input`]: storm-submit's standard input, to the ranks `-i` names.
//! * `storm batch` ([`batch`], like sbatch) and `storm alloc` ([`alloc`], like salloc);
//!   [`job_options`]: the options that shape a job, shared with storm-submit.
//! * `storm`: `queue`, `history`, `nodes` (as tables, or JSON with `--json`: [`views`]),
//!   `metrics` (Prometheus text, printed or served over HTTP: [`metrics_http`]), `cancel`,
//!   `drain`, `resume`, `shutdown`.
//! * `storm-testbed`: a cluster whose nodes are network namespaces on this machine
//!   ([`testbed`]), for fault tests and by hand.
//! * `storm-relay`: carries users' connections from the compute nodes to the machine
//!   manager ([`relay`]).
//!
//! Text other users wrote (job names, reasons) goes through [`display::safe`] on its way to
//! a terminal.
//!
//! They talk only to the machine manager, over its Unix control socket: on its host
//! directly, elsewhere through their node's control relay.

pub mod alloc;
pub mod batch;
pub mod diagnostics;
pub mod display;
pub mod history;
pub mod input;
pub mod job_options;
pub mod local;
pub mod metrics_http;
pub mod relay;
pub mod run_windows;
pub mod submit;
pub mod testbed;
pub mod views;

use std::path::PathBuf;

use storm_cluster::ClusterConfig;

/// The default cluster file, when neither `--config` nor `$STORM_CONFIG` names one.
pub const DEFAULT_CONFIG: &str = storm_cluster::config::DEFAULT_CLUSTER_FILE;

/// The cluster file: `config` if given, else `$STORM_CONFIG`, else the default path.
pub fn config_path(config: Option<PathBuf>) -> PathBuf {
    config
        .or_else(|| std::env::var_os("STORM_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG))
}

/// The MM's control socket: `--socket`; else the `control_socket` of the cluster file named
/// by `--config`; else, inside a job, `$STORM_SOCKET` (which every task gets from its node);
/// else the cluster file named by `$STORM_CONFIG`, or [`DEFAULT_CONFIG`]. Away from the MM's
/// host, where its `control_socket` is not, the node's control relay's socket stands in for
/// it (`[relay] socket`, when the cluster has a relay and the path names no `{node}`).
pub fn control_socket(socket: Option<PathBuf>, config: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(s) = socket {
        return Ok(s);
    }
    if config.is_none()
        && let Some(s) = std::env::var_os("STORM_SOCKET")
    {
        return Ok(PathBuf::from(s));
    }
    let cfg = ClusterConfig::load(&config_path(config))
        .map_err(|e| format!("{e} (use --local N for an embedded cluster, or --config FILE)"))?;
    let direct = cfg.cluster.control_socket;
    let relay = &cfg.relay;
    let relay_here = relay.address.is_some()
        && !relay.socket.to_string_lossy().contains("{node}")
        && relay.socket.exists();
    Ok(if !direct.exists() && relay_here {
        relay.socket.clone()
    } else {
        direct
    })
}
