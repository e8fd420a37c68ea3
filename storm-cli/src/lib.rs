//! # storm-cli: the user's tools
//!
//! * `storm-submit`: launch a parallel job and follow it (shaped like Slurm's `srun`), on a
//!   cluster or on an embedded local one (`--local N`, [`local`]).
//! * [`input`]: storm-submit's standard input, to the ranks `-i` names.
//! * `storm batch` ([`batch`], like sbatch) and `storm alloc` ([`alloc`], like salloc);
//!   [`job_options`]: the options that shape a job, shared with storm-submit.
//! * `storm`: `queue`, `history`, `nodes` (as tables, or JSON with `--json`: [`views`]),
//!   `metrics` (Prometheus text, printed or served over HTTP: [`metrics_http`]), `cancel`,
//!   `drain`, `resume`, `shutdown`; `stat` ([`job_stat`], like sstat): a running job's CPU and
//!   memory on each of its nodes.
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
pub mod job_stat;
pub mod local;
pub mod metrics_http;
pub mod node_filter;
pub mod node_history;
pub mod node_metrics;
pub mod plot;
pub mod relay;
pub mod run_windows;
pub mod start;
pub mod submit;
pub mod testbed;
pub mod top;
pub mod views;

use std::path::{Path, PathBuf};

use storm_cluster::ClusterConfig;
use storm_cluster::control::Client;

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
/// it (`[relay] socket`, when the cluster has a relay and the path names no `{node}`). With a
/// replicated MM, the socket of the replica that leads (the one that takes a connection:
/// followers do not listen), else the first replica's.
pub fn control_socket(socket: Option<PathBuf>, config: Option<PathBuf>) -> Result<PathBuf, String> {
    let sockets = control_sockets(socket, config)?;
    if sockets.len() == 1 {
        return Ok(sockets[0].clone());
    }
    Ok(connect_any(&sockets).map_or_else(|_| sockets[0].clone(), |(_, s)| s))
}

/// How long a replica of a replicated MM may take to answer a connection before the next is
/// tried (a frozen one takes the connection and never answers).
pub const REPLICA_ANSWER: std::time::Duration = std::time::Duration::from_secs(1);

/// Every control socket the MM may answer on, in the order to try them (see
/// [`control_socket`]): several for a replicated MM, whose leader may change.
pub fn control_sockets(
    socket: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<Vec<PathBuf>, String> {
    if let Some(s) = socket {
        return Ok(vec![s]);
    }
    if config.is_none()
        && let Some(s) = std::env::var_os("STORM_SOCKET")
    {
        return Ok(vec![PathBuf::from(s)]);
    }
    let cfg = ClusterConfig::load(&config_path(config))
        .map_err(|e| format!("{e} (use --local N for an embedded cluster, or --config FILE)"))?;
    let sockets = cfg.control_sockets();
    let relay = &cfg.relay;
    let relay_here = relay.address.is_some()
        && !relay.socket.to_string_lossy().contains("{node}")
        && relay.socket.exists();
    Ok(if !sockets.iter().any(|s| s.exists()) && relay_here {
        vec![relay.socket.clone()]
    } else {
        sockets
    })
}

/// A connection to the MM again (any replica of `sockets`, and which), after the one in use
/// was lost: tried for up to `within` (an MM restarting, a group electing), or until
/// `give_up` says so (the user interrupted); `None` if it did not answer.
pub fn reconnect_within(
    sockets: &[PathBuf],
    within: std::time::Duration,
    give_up: impl Fn() -> bool,
) -> Option<(Client, PathBuf)> {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline && !give_up() {
        if let Ok(found) = connect_any(sockets) {
            return Some(found);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    None
}

/// How many times in a row, with no reply between, a tool following a job may lose its
/// connection to the MM before it stops reconnecting: a failover loses it once, a leader that
/// steps down just after it answered a second time.
pub const LOSSES_IN_A_ROW: u32 = 10;

/// Connections to the MM lost since its last reply, for a tool that follows a job through
/// failovers: an MM that answers and then closes every connection at once is given up on
/// after [`LOSSES_IN_A_ROW`] losses rather than tried forever.
#[derive(Debug, Default)]
pub struct Losses(u32);

impl Losses {
    /// A reply arrived: the count starts over.
    pub fn replied(&mut self) {
        self.0 = 0;
    }

    /// The connection was lost once more: whether to reconnect (false once it was lost more
    /// than [`LOSSES_IN_A_ROW`] times in a row).
    pub fn lost(&mut self) -> bool {
        self.0 += 1;
        self.0 <= LOSSES_IN_A_ROW
    }

    /// [`Losses::replied`] or [`Losses::lost`], by what reading the next reply gave: whether
    /// to go on.
    pub fn after<T, E>(&mut self, next: &Result<T, E>) -> bool {
        match next {
            Ok(_) => {
                self.replied();
                true
            }
            Err(_) => self.lost(),
        }
    }
}

/// What a tool that follows a job through failovers makes of a request's fate: a connection
/// lost before the request went out whole (the replica that answered stopped leading at once)
/// shows again when the reply is read, and is reconnected there like any other loss; only the
/// MM's refusal is an error here.
pub fn sent_or_lost(sent: Result<(), storm_cluster::control::RequestFailed>) -> Result<(), String> {
    use storm_cluster::control::RequestFailed;
    match sent {
        Ok(()) | Err(RequestFailed::Lost(_)) => Ok(()),
        Err(RequestFailed::Refused(why)) => Err(why),
    }
}

/// How long a tool waits for a replicated MM to have a leader (an election after the leader
/// was lost takes one to two election timeouts) before it says that none answers.
pub const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects to the first of `sockets` that answers, and says which it was. With several
/// (the replicas of a replicated MM), each has [`REPLICA_ANSWER`] to answer, and while none
/// does (an election) they are tried again for up to [`LEADER_WAIT`].
pub fn connect_any(sockets: &[PathBuf]) -> Result<(Client, PathBuf), String> {
    let deadline = std::time::Instant::now() + LEADER_WAIT;
    loop {
        match connect_first(sockets) {
            Ok(found) => return Ok(found),
            Err(e) if sockets.len() < 2 || std::time::Instant::now() >= deadline => {
                return Err(e);
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// One try of each of `sockets`, in order.
fn connect_first(sockets: &[PathBuf]) -> Result<(Client, PathBuf), String> {
    let limit = (sockets.len() > 1).then_some(REPLICA_ANSWER);
    let mut failures = Vec::new();
    for s in sockets {
        match Client::connect_within(s, limit) {
            Ok(c) => return Ok((c, s.clone())),
            Err(e) => failures.push(e),
        }
    }
    Err(match failures.len() {
        0 => "no control socket to try".to_string(),
        1 => failures.remove(0),
        n => format!(
            "no replica of the machine manager answers ({n} tried: {}); a replicated MM \
             needs a majority of its replicas up to elect a leader",
            failures.join("; ")
        ),
    })
}

/// Whether the replica at `current` no longer answers while another of `sockets` does:
/// another replica leads now, and the one at `current` is frozen (or deposed, and about to
/// stop). A replica that answers is never left: its connection may hold output not yet read.
pub fn superseded(sockets: &[PathBuf], current: &Path) -> bool {
    let answers =
        |s: &Path| Client::connect_within(s, Some(std::time::Duration::from_millis(300))).is_ok();
    sockets.iter().any(|s| s.as_path() != current && answers(s)) && !answers(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool reconnects after each of `LOSSES_IN_A_ROW` losses in a row and gives up at the
    /// next; a reply between losses starts the count over.
    #[test]
    fn losses_in_a_row_end_the_following_and_a_reply_starts_them_over() {
        let mut losses = Losses::default();
        let lost: Result<(), ()> = Err(());
        for _ in 0..LOSSES_IN_A_ROW {
            assert!(losses.after(&lost), "reconnects");
        }
        assert!(losses.after(&Ok::<(), ()>(())));
        for _ in 0..LOSSES_IN_A_ROW {
            assert!(losses.lost(), "a reply started the count over");
        }
        assert!(
            !losses.after(&lost),
            "gives up once lost more than {LOSSES_IN_A_ROW} times"
        );
    }
}
