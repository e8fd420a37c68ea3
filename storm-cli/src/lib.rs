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
//!
//! Text other users wrote (job names, reasons) goes through [`display::safe`] on its way to
//! a terminal.
//!
//! They talk only to the machine manager, over its Unix control socket.

pub mod alloc;
pub mod batch;
pub mod diagnostics;
pub mod display;
pub mod history;
pub mod input;
pub mod job_options;
pub mod local;
pub mod metrics_http;
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
/// else the cluster file named by `$STORM_CONFIG`, or [`DEFAULT_CONFIG`].
pub fn control_socket(socket: Option<PathBuf>, config: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(s) = socket {
        return Ok(s);
    }
    if config.is_none()
        && let Some(s) = std::env::var_os("STORM_SOCKET")
    {
        return Ok(PathBuf::from(s));
    }
    ClusterConfig::load(&config_path(config))
        .map(|c| c.cluster.control_socket)
        .map_err(|e| format!("{e} (use --local N for an embedded cluster, or --config FILE)"))
}
