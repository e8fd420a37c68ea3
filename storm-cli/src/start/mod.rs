//! `storm start`: a private storm instance run by any user, without root, over the nodes
//! the allocator gave them, for as long as a command runs (docs/start.md).
//!
//! * Inside a Slurm allocation (`salloc`, `sbatch`): the front end (this process) reads the
//!   allocation ([`allocation`]), starts one node agent per node through Slurm's own step
//!   launcher (`srun --overlap`, no ssh), runs the MM itself, and runs the command with
//!   `STORM_CONFIG` naming the instance. Each agent ([`agent`]) binds its node manager's
//!   socket, says where ([`report`]), takes the instance's files, and runs `storm-nm`.
//! * As a step, `srun --mpi=pmi2 -N K storm start`: the step's tasks meet through Slurm's
//!   PMI ([`bootstrap`]); the first is the front end, the first on each other node that
//!   node's agent, linked to it over TCP ([`link`], [`linked`]). Without PMI in the step,
//!   the first task starts the agents in a step of their own, as inside `salloc`.
//! * `--hosts LIST|FILE`: one agent per host through ssh.
//! * `--local N`: today's embedded cluster under the same command.
//!
//! The front end is a core that decides ([`core`]) and a host that does the I/O
//! ([`host`]); the cluster file is derived purely from the agents' reports ([`instance`]).
//! Everything runs as the user: files in directories of mode 0700 made for this instance,
//! keys made for it, removed at the end.

pub mod agent;
pub mod allocation;
pub mod bootstrap;
pub mod core;
pub mod host;
pub mod instance;
pub mod launch;
pub mod link;
pub mod linked;
pub mod report;

use std::ffi::OsString;
use std::net::IpAddr;

use clap::Parser;

/// `storm start`'s options.
#[derive(Parser, Debug, Clone)]
#[command(name = "storm start")]
pub struct StartArgs {
    /// Run today's embedded cluster of N nodes on this host instead of an allocation's.
    #[arg(long, value_name = "N")]
    pub local: Option<u32>,
    /// The timeslice of the instance's scheduler, in milliseconds (its gang quantum).
    /// Default: 1 where the daemons get real-time priority; else 48 with --policy gang,
    /// the smallest quantum at which gang scheduling held under the normal policy, and 4
    /// otherwise (docs/start.md, "Scheduling").
    #[arg(long)]
    pub timeslice_ms: Option<f64>,
    /// Scheduling policy: fcfs, easy or gang (gang timeslices the user's own jobs).
    #[arg(long, default_value = "fcfs")]
    pub policy: storm_cluster::config::PolicyKind,
    /// Multiprogramming level (time slots) of the gang scheduler.
    #[arg(long, default_value_t = 2)]
    pub mpl: usize,
    /// The address the MM and every node manager listen on, where the node's own name does
    /// not resolve to the network the nodes share (default: the address of the host's
    /// name).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// Start the instance over these hosts through ssh instead of an allocation: a host
    /// list (`node[1-4],login`) or a host file (one host per line; `#` comments; MPI's
    /// `slots=N` ignored). storm must be at the same path on every host, and ssh must log
    /// in without a password.
    #[arg(long, value_name = "LIST|FILE", conflicts_with = "local")]
    pub hosts: Option<String>,
    /// The ssh command `--hosts` runs, split at spaces (`ssh -i KEY -p 2222`).
    #[arg(long, default_value = "ssh", value_name = "COMMAND")]
    pub ssh: String,
    /// Slurm's step launcher (for a wrapper, or a site's path).
    #[arg(long, default_value = "srun", value_name = "PROGRAM")]
    pub srun: String,
    /// How long the node agents and then the nodes may take to come up, in seconds.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub start_timeout: u64,
    /// The command to run against the instance (default: $SHELL, or /bin/sh); the instance
    /// ends when it ends, with its exit code.
    #[arg(trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// `storm agent`'s options (started by `storm start` on each node; not for users).
#[derive(Parser, Debug, Clone)]
#[command(name = "storm agent")]
pub struct AgentArgs {
    /// The address the node manager listens on (default: under ssh, the address ssh
    /// reached this host on; else the address of the host's name).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// This node's index in the instance (`--hosts`: given by the front end; under srun,
    /// Slurm's `SLURM_NODEID`).
    #[arg(long, requires = "node")]
    pub index: Option<u32>,
    /// This node's name in the instance (`--hosts`: the host as the user named it; under
    /// srun, `SLURMD_NODENAME`).
    #[arg(long, requires = "index")]
    pub node: Option<String>,
    /// Link to the front end at this address instead of standard input and output (the
    /// front end's own node under `srun --mpi=pmi2 -N K storm start`; the link's token is
    /// the first line of standard input).
    #[arg(long, value_name = "ADDR:PORT", requires = "index")]
    pub front: Option<std::net::SocketAddr>,
}

/// The real-time priority an unprivileged instance's daemons take: storm's default where
/// the user may have it (`ulimit -r`, RLIMIT_RTPRIO, as rtkit or limits.conf grant), as
/// much as the limit allows below that, else none (the normal policy, and no warning).
pub fn rt_priority_allowed(rtprio_limit: u64) -> u8 {
    let default = storm_cluster::config::DEFAULT_DAEMON_RT_PRIORITY as u64;
    rtprio_limit.min(default) as u8
}

/// The real-time priority this user's daemons take: root's default for root (who needs no
/// allowance), else [`rt_priority_allowed`] by this process's limit.
pub fn daemon_rt_priority() -> u8 {
    if nix::unistd::geteuid().is_root() {
        storm_cluster::config::DEFAULT_DAEMON_RT_PRIORITY
    } else {
        rt_priority_allowed(rtprio_limit())
    }
}

/// The quantum of an instance whose daemons run at real-time priority `rt` (0: none): 1 ms
/// as in a root cluster; without it, [`UNPRIVILEGED_QUANTUM_MS`] under gang scheduling
/// (where the quantum must hold the nodes' slots aligned), else
/// [`UNPRIVILEGED_TIMESLICE_MS`] (only heartbeats and launches wait on it).
pub fn default_quantum_ms(rt: u8, policy: storm_cluster::config::PolicyKind) -> f64 {
    match (rt > 0, policy) {
        (true, _) => 1.0,
        (false, storm_cluster::config::PolicyKind::Gang) => UNPRIVILEGED_QUANTUM_MS,
        (false, _) => UNPRIVILEGED_TIMESLICE_MS,
    }
}

/// The timeslice of an unprivileged instance that does not gang-schedule: a launch and its
/// report each wait for a timeslice, so it sets launch time (`storm-submit -N 4 /bin/true`
/// inside a 4-node instance, a user, medians: 65 ms at 32 ms, 16.7 ms at 8 ms, 12.8 ms at 4
/// ms, 13.0 ms at 2 ms; srun 43 ms). At 4 ms with ten processes spinning on the 2-core host
/// for 30 s, no node missed a heartbeat's deadline.
pub const UNPRIVILEGED_TIMESLICE_MS: f64 = 4.0;

/// The smallest quantum at which gang scheduling held without real-time priority, seen from
/// the tasks inside a Slurm allocation (`storm-bench report --parts gang`, as a user, 2
/// nodes on this 2-core host, the daemons with their short kernel slice, medians: 32 ms
/// gave 2.6 % overlap and 0.91 co-run over 8 runs, 48 ms 1.4-1.6 % and 0.90-0.95 over 3, 64
/// ms 0.9-1.4 % and 0.92-0.94; the target is at most 2 % and at least 0.90).
pub const UNPRIVILEGED_QUANTUM_MS: f64 = 48.0;

/// This process's RLIMIT_RTPRIO (0 where it cannot be read).
pub fn rtprio_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_RTPRIO)
        .map(|(soft, _)| soft)
        .unwrap_or(0)
}

/// This host's name (empty if the kernel does not say).
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Why this host's address for the instance is not known.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("this host's name: {0}")]
    NoName(nix::Error),
    #[error("resolving this host's name {name:?}: {source} (use --bind ADDR)")]
    Resolve {
        name: String,
        source: std::io::Error,
    },
    #[error("this host's name {0:?} has no address (use --bind ADDR)")]
    NoAddress(String),
}

/// The address the other hosts reach this one on, under ssh: the server's address in
/// `SSH_CONNECTION` (`client port server port`), which ssh sets for the remote command.
pub fn ssh_server_address(ssh_connection: Option<&str>) -> Option<IpAddr> {
    ssh_connection?.split_whitespace().nth(2)?.parse().ok()
}

/// The address of this host on the way to `host` (the source address the kernel picks for
/// it): where the front end of `--hosts` listens, so that the hosts can reach it.
pub fn address_toward(host: &str) -> Result<IpAddr, AddressError> {
    use std::net::{ToSocketAddrs, UdpSocket};
    let resolve = |source: std::io::Error| AddressError::Resolve {
        name: host.to_string(),
        source,
    };
    let to = (host, 22)
        .to_socket_addrs()
        .map_err(resolve)?
        .next()
        .ok_or_else(|| AddressError::NoAddress(host.to_string()))?;
    let any: IpAddr = if to.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    // A UDP socket's connect only chooses a route: nothing is sent.
    let socket = UdpSocket::bind((any, 0)).map_err(resolve)?;
    socket.connect(to).map_err(resolve)?;
    Ok(socket.local_addr().map_err(resolve)?.ip())
}

/// The address of this host's name, for daemons the other nodes must reach: `bind` if
/// given, else the first IPv4 address the name resolves to.
pub fn own_address(bind: Option<IpAddr>) -> Result<IpAddr, AddressError> {
    if let Some(ip) = bind {
        return Ok(ip);
    }
    let name = nix::unistd::gethostname()
        .map_err(AddressError::NoName)?
        .to_string_lossy()
        .into_owned();
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = (name.as_str(), 0)
        .to_socket_addrs()
        .map_err(|source| AddressError::Resolve {
            name: name.clone(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(|a| a.ip())
        .ok_or(AddressError::NoAddress(name))
}

#[cfg(test)]
mod tests {
    /// Under ssh, an agent listens where ssh reached its host; without the variable, or
    /// with one it cannot read, it does not guess from it.
    #[test]
    fn an_agent_under_ssh_listens_where_ssh_reached_it() {
        assert_eq!(
            super::ssh_server_address(Some("10.200.0.1 51234 10.200.0.3 22")),
            Some("10.200.0.3".parse().unwrap())
        );
        assert_eq!(super::ssh_server_address(None), None);
        assert_eq!(super::ssh_server_address(Some("garbage")), None);
        // The route toward a loopback host starts on loopback.
        assert!(super::address_toward("127.0.0.1").unwrap().is_loopback());
    }

    /// Root (no limit) gets the default; a user gets what `ulimit -r` allows, up to it;
    /// without an allowance, the normal policy.
    #[test]
    fn real_time_priority_is_taken_only_as_far_as_the_limit_allows() {
        let default = storm_cluster::config::DEFAULT_DAEMON_RT_PRIORITY;
        assert_eq!(super::rt_priority_allowed(u64::MAX), default);
        assert_eq!(super::rt_priority_allowed(0), 0);
        assert_eq!(super::rt_priority_allowed(1), 1.min(default));
        use storm_cluster::config::PolicyKind;
        assert_eq!(super::default_quantum_ms(default, PolicyKind::Gang), 1.0);
        assert_eq!(super::default_quantum_ms(default, PolicyKind::Fcfs), 1.0);
        assert_eq!(
            super::default_quantum_ms(0, PolicyKind::Gang),
            super::UNPRIVILEGED_QUANTUM_MS
        );
        assert_eq!(
            super::default_quantum_ms(0, PolicyKind::Fcfs),
            super::UNPRIVILEGED_TIMESLICE_MS
        );
    }
}
