//! How `storm start` runs its node agents, one per node, and talks to them: through the
//! allocator's step launcher (`srun --overlap`: one step, its tasks' output merged, its
//! input given to every task) or through ssh (`--hosts`: one `ssh HOST storm agent` per
//! host, each with its own input and output). Either way each agent's lines come to the
//! front end as [`Input::AgentLine`], the instance's files go to every agent as one line,
//! and closing the agents' input is the instance's end on every node.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crossbeam_channel::Sender;

use super::allocation::Allocation;
use super::core::Input;
use super::report::MAX_LINE;

/// The node agents of an instance, as started.
pub enum Agents {
    /// One Slurm step of one task per node.
    Srun {
        child: Child,
        input: Option<ChildStdin>,
        /// The step (`JOB.STEP`) the agents reported, cancelled if they do not stop.
        step: Option<String>,
    },
    /// One ssh per host, in the allocation's order.
    Ssh(Vec<SshAgent>),
    /// The step's own tasks, linked to the front end over TCP (`srun --mpi=pmi2 -N K storm
    /// start`).
    Linked(super::linked::LinkedAgents),
}

/// One host's `ssh HOST storm agent`.
pub struct SshAgent {
    host: String,
    child: Child,
    input: Option<ChildStdin>,
    /// Its end, once seen (reported once).
    ended: bool,
}

impl Agents {
    /// `srun --overlap` over the allocation's nodes, each task `storm agent`.
    pub fn srun(
        srun: &str,
        alloc: &Allocation,
        storm: &Path,
        bind: Option<IpAddr>,
        tx: &Sender<Input>,
    ) -> Result<Self> {
        let k = alloc.nodes.len().to_string();
        // Each agent's task holds as many CPUs as the allocation gives every node (where
        // the site binds tasks, its NM then sees them as its own).
        let cpus = alloc
            .cpus
            .iter()
            .min()
            .copied()
            .unwrap_or(1)
            .max(1)
            .to_string();
        let mut cmd = Command::new(srun);
        cmd.args([
            "--overlap",
            "--nodes",
            &k,
            "--ntasks",
            &k,
            "--ntasks-per-node=1",
        ])
        .args(["--nodelist", &alloc.list])
        .args(["--cpus-per-task", &cpus])
        .args(["--kill-on-bad-exit=1", "--mpi=none", "--quiet"])
        .args(["--job-name", "storm-agents"])
        .arg(storm)
        .arg("agent");
        if let Some(ip) = bind {
            cmd.arg("--bind").arg(ip.to_string());
        }
        let (child, input) = spawn_piped(cmd, tx, "srun")
            .with_context(|| format!("starting the node agents with {srun}"))?;
        Ok(Agents::Srun {
            child,
            input: Some(input),
            step: None,
        })
    }

    /// `SSH HOST storm agent --index K --node HOST` for each host, `ssh` being the
    /// command line `ssh` (split at spaces: `ssh -i KEY -p 2222`). Batch mode: ssh never
    /// asks for a password (the front end's input is not its terminal).
    pub fn ssh(ssh: &str, alloc: &Allocation, storm: &Path, tx: &Sender<Input>) -> Result<Self> {
        let words: Vec<&str> = ssh.split_whitespace().collect();
        let Some((program, options)) = words.split_first() else {
            bail!("--ssh is empty");
        };
        let mut agents = Vec::new();
        for (index, host) in alloc.nodes.iter().enumerate() {
            let remote = remote_command(&[
                storm.as_os_str().to_owned(),
                "agent".into(),
                "--index".into(),
                index.to_string().into(),
                "--node".into(),
                host.into(),
            ]);
            let mut cmd = Command::new(program);
            cmd.args(options)
                .args(["-T", "-o", "BatchMode=yes", "--", host])
                .arg(remote);
            let (child, input) = spawn_piped(cmd, tx, host)
                .with_context(|| format!("starting the node agent on {host} with {program}"))?;
            agents.push(SshAgent {
                host: host.clone(),
                child,
                input: Some(input),
                ended: false,
            });
        }
        Ok(Agents::Ssh(agents))
    }

    /// Remembers the step the agents reported (srun: cancelled at teardown if need be).
    pub fn set_step(&mut self, reported: Option<String>) {
        if let Agents::Srun { step, .. } = self {
            *step = reported;
        }
    }

    /// Sends `line` to every agent.
    pub fn send_all(&mut self, line: &str) -> Result<()> {
        let send = |input: &mut Option<ChildStdin>, whom: &str| -> Result<()> {
            let input = input
                .as_mut()
                .with_context(|| format!("{whom}: the agents' input is closed"))?;
            input
                .write_all(line.as_bytes())
                .and_then(|()| input.write_all(b"\n"))
                .and_then(|()| input.flush())
                .with_context(|| format!("sending {whom} the instance's files"))
        };
        match self {
            Agents::Linked(linked) => linked.send_all(line),
            Agents::Srun { input, .. } => send(input, "the node agents"),
            Agents::Ssh(agents) => agents
                .iter_mut()
                .try_for_each(|a| send(&mut a.input, &format!("the agent on {}", a.host))),
        }
    }

    /// An agent (or the step) that ended since the last call, if one did.
    pub fn ended(&mut self) -> Option<Input> {
        match self {
            Agents::Linked(linked) => linked.ended(),
            Agents::Srun { child, .. } => match child.try_wait() {
                Ok(Some(status)) => Some(Input::StepEnded(status.code())),
                _ => None,
            },
            Agents::Ssh(agents) => agents.iter_mut().filter(|a| !a.ended).find_map(|a| {
                let status = a.child.try_wait().ok().flatten()?;
                a.ended = true;
                Some(Input::AgentEnded {
                    node: a.host.clone(),
                    code: status.code(),
                })
            }),
        }
    }

    /// Ends the agents: their input closed (each stops its node manager, removes its
    /// directory and exits), up to 10 s for that, then the step cancelled or ssh killed.
    pub fn stop(&mut self) {
        let mut children: Vec<&mut Child> = match self {
            Agents::Linked(linked) => return linked.stop(),
            Agents::Srun { child, input, .. } => {
                drop(input.take());
                vec![child]
            }
            Agents::Ssh(agents) => agents
                .iter_mut()
                .map(|a| {
                    drop(a.input.take());
                    &mut a.child
                })
                .collect(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && children
                .iter_mut()
                .any(|c| matches!(c.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let late = children
            .iter_mut()
            .any(|c| matches!(c.try_wait(), Ok(None)));
        if late {
            eprintln!("storm start: the node agents did not stop in 10 s: ending them");
            if let Agents::Srun {
                step: Some(step), ..
            } = self
            {
                let _ = Command::new("scancel")
                    .args(["--quiet", step])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        match self {
            Agents::Linked(_) => {}
            Agents::Srun { child, .. } => super::agent::stop_child(child, Duration::from_secs(5)),
            Agents::Ssh(agents) => {
                for a in agents {
                    super::agent::stop_child(&mut a.child, Duration::from_secs(5));
                }
            }
        }
    }
}

/// Starts `cmd` with its input a pipe (returned) and its output read line by line into
/// `tx`, in a process group of its own: the terminal's Ctrl-C does not reach it.
fn spawn_piped(mut cmd: Command, tx: &Sender<Input>, what: &str) -> Result<(Child, ChildStdin)> {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().context("the agent's output")?;
    let input = child.stdin.take().context("the agent's input")?;
    let tx = tx.clone();
    std::thread::Builder::new()
        .name(format!("storm-start-{what}"))
        .spawn(move || forward_lines(stdout, &tx))?;
    Ok((child, input))
}

/// Each line of `out` (bounded by [`MAX_LINE`]) as an [`Input::AgentLine`], to its end.
pub(super) fn forward_lines(out: impl Read, tx: &Sender<Input>) {
    let mut reader = BufReader::new(out);
    loop {
        let mut line = String::new();
        match (&mut reader).take(MAX_LINE as u64).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if tx.send(Input::AgentLine(line)).is_err() {
                    return;
                }
            }
        }
    }
}

/// `argv` as one command line for the remote shell ssh hands it to: each word in single
/// quotes (a quote inside as `'\''`), so paths and names with spaces, shell characters or
/// bytes that are not UTF-8 arrive as they are.
pub fn remote_command(argv: &[OsString]) -> OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut line = Vec::new();
    for (i, word) in argv.iter().enumerate() {
        if i > 0 {
            line.push(b' ');
        }
        line.push(b'\'');
        for &b in word.as_bytes() {
            if b == b'\'' {
                line.extend_from_slice(b"'\\''");
            } else {
                line.push(b);
            }
        }
        line.push(b'\'');
    }
    OsString::from_vec(line)
}

#[cfg(test)]
mod tests {
    use super::remote_command;

    /// The remote shell sees each word whole: spaces, quotes and `$` are not interpreted.
    #[test]
    fn a_remote_command_line_keeps_each_word_whole() {
        let line = remote_command(&["/opt/my storm/storm".into(), "it's $HOME;x".into()]);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\n' {}", line.to_string_lossy()))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/opt/my storm/storm\nit's $HOME;x\n"
        );
    }
}
