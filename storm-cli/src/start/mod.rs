//! `storm start`: a private storm instance run by any user, without root, over the nodes
//! the allocator gave them, for as long as a command runs (docs/start.md).
//!
//! * Inside a Slurm allocation (`salloc`, `sbatch`): the front end (this process) reads the
//!   allocation ([`allocation`]), starts one node agent per node through Slurm's own step
//!   launcher (`srun --overlap`, no ssh), runs the MM itself, and runs the command with
//!   `STORM_CONFIG` naming the instance. Each agent ([`agent`]) binds its node manager's
//!   socket, says where ([`report`]), takes the instance's files, and runs `storm-nm`.
//! * `--local N`: today's embedded cluster under the same command.
//!
//! The front end is a core that decides ([`core`]) and a host that does the I/O
//! ([`host`]); the cluster file is derived purely from the agents' reports ([`instance`]).
//! Everything runs as the user: files in directories of mode 0700 made for this instance,
//! keys made for it, removed at the end.

pub mod agent;
pub mod allocation;
pub mod core;
pub mod host;
pub mod instance;
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
    /// The timeslice of the instance's gang scheduler, in milliseconds.
    #[arg(long, default_value_t = 1.0)]
    pub timeslice_ms: f64,
    /// The address the MM and every node manager listen on, where the node's own name does
    /// not resolve to the network the nodes share (default: the address of the host's
    /// name).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
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
    /// The address the node manager listens on (default: the address of the host's name).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
}

/// The address of this host's name, for daemons the other nodes must reach: `bind` if
/// given, else the first IPv4 address the name resolves to.
pub fn own_address(bind: Option<IpAddr>) -> Result<IpAddr, String> {
    if let Some(ip) = bind {
        return Ok(ip);
    }
    let name = nix::unistd::gethostname()
        .map_err(|e| format!("this host's name: {e}"))?
        .to_string_lossy()
        .into_owned();
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = (name.as_str(), 0)
        .to_socket_addrs()
        .map_err(|e| format!("resolving this host's name {name:?}: {e} (use --bind ADDR)"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(|a| a.ip())
        .ok_or_else(|| format!("this host's name {name:?} has no address (use --bind ADDR)"))
}
