//! `srun --mpi=pmi2 -N K storm start`: the step's tasks meet through Slurm's PMI.
//!
//! Every task of the step runs `storm start`. Where Slurm serves PMI on `PMI_FD` (its
//! `pmi2` plugin, which speaks the PMI-1 wire protocol too), the first task becomes the
//! front end: it listens for the agents' links ([`super::link`]) and puts that address and
//! a fresh token in the step's key-value space; after one barrier every other task reads
//! them, and the first task on each node becomes that node's agent and connects. Further
//! tasks on a node (`srun -n 8 -N 4`) have nothing to do and leave. So the step's own tasks
//! are the instance's agents: no second step, no `srun --overlap`.
//!
//! Without PMI (`--mpi=none`, or `pmix`, which has no `PMI_FD`) the first task starts the
//! agents itself in a step of their own, as inside `salloc` ([`super::host`]).

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

use anyhow::{Context, Result, anyhow, bail};

use super::link::Token;

/// The keys the front end puts: where it listens, and the links' token (Slurm's PMI-1
/// values end at a space: one key each).
const FRONT_KEY: &str = "storm-start-front";
const TOKEN_KEY: &str = "storm-start-token";

/// The step's PMI link.
pub type Pmi = storm_pmi::client::Client<UnixStream>;

/// What one task of the step is to be.
pub enum StepRole {
    /// The first task: the front end, with the agents' links to accept.
    Front { listener: TcpListener, token: Token },
    /// The first task on another node: that node's agent. It keeps the step's PMI until
    /// it is linked: if it cannot link, it ends the step through it ([`abort`]), so that
    /// no task waits for it.
    Agent {
        front: SocketAddr,
        token: Token,
        index: u32,
        name: String,
        pmi: Pmi,
    },
    /// A further task on a node that has its agent.
    Spare,
}

/// Whether this process is a task of a Slurm step that serves PMI on `PMI_FD`.
pub fn step_has_pmi(var: impl Fn(&str) -> Option<String>) -> bool {
    ["SLURM_STEP_ID", "PMI_FD", "PMI_RANK", "PMI_SIZE"]
        .iter()
        .all(|k| var(k).is_some())
}

/// Meets the step's other tasks through PMI and says what this one is.
pub fn exchange(bind: Option<IpAddr>) -> Result<StepRole> {
    let var = |k: &str| {
        std::env::var(k).with_context(|| format!("{k} is not set (in a Slurm step with PMI)"))
    };
    let number = |k: &str| -> Result<i32> {
        var(k)?
            .parse()
            .with_context(|| format!("{k} is not a number"))
    };
    let (fd, rank, size) = (number("PMI_FD")?, number("PMI_RANK")?, number("PMI_SIZE")?);
    if fd < 0 {
        bail!("PMI_FD {fd} is not a descriptor");
    }
    // SAFETY: PMI_FD is the socket Slurm's step daemon opened for this task; nothing else
    // in this process uses it.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    let pmi_err = |e: storm_pmi::client::Error| anyhow!("Slurm's PMI: {e}");
    let mut pmi = storm_pmi::client::Client::init(stream, rank, size).map_err(pmi_err)?;
    let role = if rank == 0 {
        let ip = super::own_address(bind)?;
        let listener = TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}"))?;
        let token = Token::new();
        pmi.put(FRONT_KEY, &listener.local_addr()?.to_string())
            .map_err(pmi_err)?;
        pmi.put(TOKEN_KEY, token.as_str()).map_err(pmi_err)?;
        pmi.barrier().map_err(pmi_err)?;
        pmi.finalize().map_err(pmi_err)?;
        StepRole::Front { listener, token }
    } else {
        pmi.barrier().map_err(pmi_err)?;
        let mut get = |key: &str| {
            pmi.get(key).map_err(pmi_err)?.with_context(|| {
                format!("the step's first task put no {key} (is it storm start too?)")
            })
        };
        let (front, token) = parse_front(&get(FRONT_KEY)?, &get(TOKEN_KEY)?)?;
        if var("SLURM_LOCALID")? == "0" {
            let index = var("SLURM_NODEID")?
                .parse()
                .context("SLURM_NODEID is not a number")?;
            StepRole::Agent {
                front,
                token,
                index,
                name: var("SLURMD_NODENAME")?,
                pmi,
            }
        } else {
            pmi.finalize().map_err(pmi_err)?;
            StepRole::Spare
        }
    };
    Ok(role)
}

/// Ends the whole step through its PMI, saying why: an agent that cannot link.
pub fn abort(mut pmi: Pmi, why: &anyhow::Error) {
    let _ = pmi.abort(1, &format!("storm start: {why:#}"));
}

/// The front end's address and token as it put them.
fn parse_front(addr: &str, token: &str) -> Result<(SocketAddr, Token)> {
    let addr = addr
        .parse()
        .with_context(|| format!("the front end's address {addr:?}"))?;
    let token = Token::parse(token).map_err(|e| anyhow!("the front end's token: {e}"))?;
    Ok((addr, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmi_is_used_only_in_a_step_that_serves_it() {
        let env = |set: &'static [&'static str]| move |k: &str| set.contains(&k).then(String::new);
        assert!(step_has_pmi(env(&[
            "SLURM_STEP_ID",
            "PMI_FD",
            "PMI_RANK",
            "PMI_SIZE"
        ])));
        // salloc's shell (no step), or a step with --mpi=none or pmix.
        assert!(!step_has_pmi(env(&["PMI_FD", "PMI_RANK", "PMI_SIZE"])));
        assert!(!step_has_pmi(env(&["SLURM_STEP_ID"])));
    }

    #[test]
    fn the_front_ends_value_parses_back_and_bad_ones_are_named() {
        let token = Token::new();
        let (addr, t) = parse_front("10.0.0.1:4000", token.as_str()).unwrap();
        assert_eq!(addr, "10.0.0.1:4000".parse().unwrap());
        assert_eq!(t, token);
        for (addr, tok) in [
            ("", token.as_str()),
            ("nonsense", token.as_str()),
            ("10.0.0.1:4000", "abc"),
        ] {
            assert!(parse_front(addr, tok).is_err(), "{addr:?} {tok:?}");
        }
    }
}
