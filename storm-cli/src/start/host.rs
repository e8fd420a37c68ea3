//! The host of `storm start`'s front end: the processes, pipes, files, signals and clock the
//! core ([`super::core`]) decides about. It starts the node agents ([`super::launch`]: one
//! `srun --overlap` step, or one ssh per host under `--hosts`, in process groups of their
//! own so that the terminal's Ctrl-C does not reach them), or, as the first task of `srun
//! --mpi=pmi2 -N K storm start`, accepts the links of the step's other tasks
//! ([`super::linked`]), reads their reports, writes the
//! instance's files (a directory of mode 0700 made for this instance, keys made for it),
//! sends the agents their bundle, runs the MM with a socket bound here, waits for the
//! nodes, runs the command, and tears everything down: the command, the agents (their
//! input closed; then `scancel JOB.STEP` or ssh killed), the MM, the files.

use std::ffi::OsString;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};

use super::StartArgs;
use super::agent::Placement;
use super::allocation::{self, Allocation};
use super::bootstrap::{self, StepRole};
use super::core::{Effect, Input, Limits, StartCore};
use super::instance::{InstanceSpec, instance_config};
use super::launch::Agents;
use super::link::Token;
use super::linked::LinkedAgents;
use super::report::{AgentReport, Bundle};
use crate::local::{Daemon, bin_dir, spawn_daemon, wait_for_nodes};

/// How often the host looks at its children, signals and the clock.
const TICK: Duration = Duration::from_millis(50);

/// Runs `storm start`; its exit code.
pub fn run(args: StartArgs) -> Result<i32> {
    if let Some(n) = args.local {
        return run_local(&args, n);
    }
    if let Some(source) = &args.hosts {
        let path = std::path::Path::new(source);
        let file = if path.is_file() {
            Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the host file {source}"))?,
            )
        } else {
            None
        };
        let alloc = allocation::from_hosts(source, file.as_deref())?;
        return Front::start(args, alloc, None)?.run();
    }
    // `srun -N K storm start`: every task of the step runs this. With Slurm's PMI the
    // tasks meet through it and are the agents themselves.
    if bootstrap::step_has_pmi(|k| std::env::var(k).ok()) {
        return run_step_task(args);
    }
    // Without: the first is the front end (it starts the agents itself, in a step of their
    // own), the others have nothing to do.
    if std::env::var_os("SLURM_STEP_ID").is_some()
        && std::env::var("SLURM_PROCID").is_ok_and(|r| r != "0")
    {
        return Ok(0);
    }
    let alloc = allocation::from_slurm(|k| std::env::var(k).ok())?;
    Front::start(args, alloc, None)?.run()
}

/// One task of `srun --mpi=pmi2 -N K storm start`: the front end, a node's agent, or a
/// spare task that leaves.
fn run_step_task(args: StartArgs) -> Result<i32> {
    match bootstrap::exchange(args.bind)? {
        StepRole::Spare => Ok(0),
        StepRole::Agent {
            front,
            token,
            index,
            name,
            mut pmi,
        } => {
            let linked = (|| {
                let placement = Placement {
                    index,
                    name,
                    step: super::agent::slurm_step().unwrap_or_default(),
                    ip: super::own_address(args.bind)?,
                };
                Ok((placement, super::agent::connect(front, &token, index)?))
            })();
            match linked {
                Ok((placement, link)) => {
                    let _ = pmi.finalize();
                    super::agent::serve(placement, link)
                }
                Err(e) => {
                    // No task should wait for this node: the step ends.
                    bootstrap::abort(pmi, &e);
                    Err(e)
                }
            }
        }
        StepRole::Front { listener, token } => {
            let alloc = allocation::from_slurm(|k| std::env::var(k).ok())?;
            Front::start(args, alloc, Some((listener, token)))?.run()
        }
    }
}

/// The signals that stop an instance: recorded as they come, looked at each tick (SIGINT
/// only while no command runs: the command, an interactive shell say, has the terminal).
fn watch_signals() -> Result<Arc<AtomicUsize>> {
    let last = Arc::new(AtomicUsize::new(0));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let last = last.clone();
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                last.store(sig as usize, Ordering::Relaxed)
            })
        }
        .context("installing signal handlers")?;
    }
    Ok(last)
}

/// The front end of an allocation's instance.
struct Front {
    args: StartArgs,
    alloc: Allocation,
    dir: tempfile::TempDir,
    core: StartCore,
    agents: Agents,
    inputs: Receiver<Input>,
    tx: Sender<Input>,
    signals: Arc<AtomicUsize>,
    mm: Option<Daemon>,
    mm_listener: Option<TcpListener>,
    /// The manager side of the control relay: its listener until it runs, then it.
    relay_listener: Option<TcpListener>,
    relay: Option<Daemon>,
    command: Option<Child>,
    /// Whether the command runs in a process group of its own (its input is not a
    /// terminal): signals to the front end are passed to that group, and the teardown ends
    /// the whole group, not only the command's first process.
    command_group: bool,
    config_path: PathBuf,
    _notify: Option<UnixDatagram>,
}

impl Front {
    /// Starts the instance's front end over `alloc`; `links`: the agents are the step's own
    /// tasks and link to this listener with this token (else it starts them).
    fn start(
        args: StartArgs,
        alloc: Allocation,
        links: Option<(TcpListener, Token)>,
    ) -> Result<Self> {
        let signals = watch_signals()?;
        let dir = tempfile::Builder::new()
            .prefix("storm-start-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .context("making the instance's directory")?;
        storm_cluster::key::generate(&dir.path().join(storm_cluster::key::DEFAULT_NAME))?;
        let names: Vec<&str> = alloc.nodes.iter().map(String::as_str).collect();
        storm_cluster::identity::generate_for_one_host(dir.path(), &names)?;
        let ip = match (&args.bind, &args.hosts) {
            (None, Some(_)) => super::address_toward(&alloc.nodes[0])?,
            _ => super::own_address(args.bind)?,
        };
        let mm_listener = TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}"))?;
        let relay_listener = TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}"))?;
        let storm = std::env::current_exe().context("locating storm")?;
        let (tx, inputs) = crossbeam_channel::unbounded();
        let agents = if let Some((listener, token)) = links {
            let own: u32 = std::env::var("SLURM_NODEID")
                .context("SLURM_NODEID is not set")?
                .parse()
                .context("SLURM_NODEID is not a number")?;
            Agents::Linked(LinkedAgents::start(
                listener,
                token,
                &alloc.nodes,
                own,
                &storm,
                args.bind,
                &tx,
            )?)
        } else if args.hosts.is_some() {
            Agents::ssh(&args.ssh, &alloc, &storm, &tx)?
        } else {
            Agents::srun(&args.srun, &alloc, &storm, args.bind, &tx)?
        };
        let limits = Limits {
            agents: Duration::from_secs(args.start_timeout),
            join: Duration::from_secs(args.start_timeout),
        };
        let core = StartCore::new(
            alloc.nodes.clone(),
            limits,
            Instant::now(),
            super::host_name(),
        );
        let config_path = dir.path().join("cluster.toml");
        Ok(Self {
            args,
            alloc,
            dir,
            core,
            agents,
            inputs,
            tx,
            signals,
            mm: None,
            mm_listener: Some(mm_listener),
            relay_listener: Some(relay_listener),
            relay: None,
            command: None,
            command_group: false,
            config_path,
            _notify: None,
        })
    }

    fn run(mut self) -> Result<i32> {
        loop {
            let input = match self.inputs.recv_timeout(TICK) {
                Ok(input) => input,
                Err(_) => self.poll(),
            };
            for effect in self.core.step(input) {
                if let Some(code) = self.carry_out(effect) {
                    return Ok(code);
                }
            }
        }
    }

    /// What the clock, the signals and the children say now.
    fn poll(&mut self) -> Input {
        let sig = self.signals.swap(0, Ordering::Relaxed) as i32;
        if sig == libc::SIGINT
            && let Some(c) = &self.command
        {
            // A terminal's Ctrl-C reached the command's group itself; a SIGINT sent to the
            // front end alone (srun passes the user's Ctrl-C to its task) is passed on.
            if self.command_group {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(c.id() as i32),
                    nix::sys::signal::Signal::SIGINT,
                );
            }
        } else if sig != 0 {
            return Input::Signal(sig);
        }
        if let Some(c) = &mut self.command
            && let Ok(Some(status)) = c.try_wait()
        {
            self.command = None;
            return Input::CommandEnded(shell_code(status));
        }
        if let Some(ended) = self.agents.ended() {
            return ended;
        }
        Input::Tick(Instant::now())
    }

    /// Carries out `effect`; the exit code once the instance is over.
    fn carry_out(&mut self, effect: Effect) -> Option<i32> {
        match effect {
            Effect::Configure(reports) => {
                let result = self.configure(&reports).map_err(|e| format!("{e:#}"));
                self.agents
                    .set_step(reports.first().map(|r| r.step.clone()));
                let _ = self.tx.send(Input::Configured(result));
            }
            Effect::AwaitNodes => {
                let socket = self.dir.path().join("mm.sock");
                let own = self.alloc.nodes.len() as u32;
                let limit = Duration::from_secs(self.args.start_timeout);
                let tx = self.tx.clone();
                let _ = std::thread::Builder::new()
                    .name("storm-start-join".into())
                    .spawn(move || {
                        let up = wait_for_nodes(&[socket], own, limit, || Ok(()))
                            .map_err(|e| format!("{e:#}"));
                        let _ = tx.send(Input::NodesUp(up));
                    });
            }
            Effect::RunCommand => match self.run_command() {
                Ok(child) => self.command = Some(child),
                Err(e) => {
                    eprintln!("storm start: {e:#}");
                    let _ = self.tx.send(Input::CommandEnded(127));
                }
            },
            Effect::Say(text) => eprintln!("{text}"),
            Effect::Teardown => self.teardown(),
            Effect::Exit(code) => return Some(code),
        }
        None
    }

    /// Writes the instance's files, sends the agents theirs, starts the MM.
    fn configure(&mut self, reports: &[AgentReport]) -> Result<()> {
        let dir = self.dir.path();
        let listener = self.mm_listener.take().context("configured twice")?;
        let relay_listener = self.relay_listener.take().context("configured twice")?;
        let suffix = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("storm-start-"))
            .unwrap_or("0")
            .to_string();
        let rt = super::daemon_rt_priority();
        let spec = InstanceSpec {
            name: match self.args.hosts {
                Some(_) => format!("hosts-{suffix}"),
                None => format!("slurm-{}-{suffix}", self.alloc.job),
            },
            dir,
            mm: listener.local_addr()?,
            timeslice_ms: self
                .args
                .timeslice_ms
                .unwrap_or_else(|| super::default_quantum_ms(rt, self.args.policy)),
            scheduler: storm_cluster::config::SchedulerSection {
                policy: self.args.policy,
                mpl: self.args.mpl,
                daemon_rt_priority: rt,
                ..Default::default()
            },
            relay: relay_listener.local_addr()?,
            uid: nix::unistd::getuid().as_raw(),
        };
        let config = instance_config(&spec, reports);
        if rt == 0 && self.args.policy == storm_cluster::config::PolicyKind::Gang {
            eprintln!(
                "storm start: no real-time priority here (ulimit -r is 0): gang quantum {} ms",
                spec.timeslice_ms
            );
        }
        config.validate().map_err(anyhow::Error::msg)?;
        std::fs::write(&self.config_path, config.to_toml())?;
        let mut files = vec![("cluster.toml".to_string(), config.to_toml().into_bytes())];
        let mut add = |rel: String| -> Result<()> {
            let bytes = std::fs::read(dir.join(&rel)).with_context(|| format!("reading {rel}"))?;
            files.push((rel, bytes));
            Ok(())
        };
        add(storm_cluster::key::DEFAULT_NAME.to_string())?;
        add("mm.pub".into())?;
        add("nodes.pub".into())?;
        for r in reports {
            add(format!("keys/{}.key", r.name))?;
        }
        self.agents.send_all(&Bundle { files }.to_line())?;
        let notify_path = dir.join("notify.sock");
        self._notify = Some(UnixDatagram::bind(&notify_path)?);
        self.mm = Some(spawn_daemon(
            "storm-mm",
            &bin_dir()?.join("storm-mm"),
            &["--config".into(), self.config_path.display().to_string()],
            Some(&listener),
            &dir.join("mm.log"),
            None,
            &notify_path,
        )?);
        // Jobs' tasks reach the MM through their node's relay, which connects to this one.
        self.relay = Some(spawn_daemon(
            "storm-relay",
            &bin_dir()?.join("storm-relay"),
            &[
                "--manager".into(),
                "--config".into(),
                self.config_path.display().to_string(),
            ],
            Some(&relay_listener),
            &dir.join("relay.log"),
            None,
            &notify_path,
        )?);
        Ok(())
    }

    fn run_command(&mut self) -> Result<Child> {
        let mut argv: Vec<OsString> = self.args.command.clone();
        if argv.is_empty() {
            argv.push(std::env::var_os("SHELL").unwrap_or_else(|| "/bin/sh".into()));
        }
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("STORM_CONFIG", &self.config_path)
            .env_remove("STORM_SOCKET");
        // An interactive command keeps the terminal's process group (Ctrl-C reaches it);
        // any other runs in a group of its own, which the teardown ends whole.
        self.command_group = !std::io::IsTerminal::is_terminal(&std::io::stdin());
        if self.command_group {
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        cmd.spawn()
            .with_context(|| format!("running {}", argv[0].to_string_lossy()))
    }

    fn teardown(&mut self) {
        if let Some(mut c) = self.command.take() {
            if self.command_group {
                stop_group(&mut c, Duration::from_secs(2));
            } else {
                super::agent::stop_child(&mut c, Duration::from_secs(2));
            }
        }
        // The agents end at the end of their input: each stops its node manager and removes
        // its directory. One that does not is ended by its launcher.
        self.agents.stop();
        for daemon in [self.relay.take(), self.mm.take()].into_iter().flatten() {
            let mut child = daemon.child;
            super::agent::stop_child(&mut child, Duration::from_secs(5));
        }
    }
}

/// SIGTERM to `child`'s process group (it leads one), SIGKILL to the group if `child` is
/// still there after `grace`; `child` reaped.
fn stop_group(child: &mut Child, grace: Duration) {
    use nix::sys::signal::{Signal, killpg};
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // What is left of the group (the command's children) goes too.
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait();
}

/// A process's end as a shell gives it: its code, or 128 + its signal.
fn shell_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// `storm start --local N`: the embedded cluster, and the command against it.
fn run_local(args: &StartArgs, nodes: u32) -> Result<i32> {
    let rt = super::daemon_rt_priority();
    let mut opts = crate::local::LocalOptions::new(nodes);
    opts.timeslice_ms = args
        .timeslice_ms
        .unwrap_or_else(|| super::default_quantum_ms(rt, args.policy));
    opts.scheduler.policy = args.policy;
    opts.scheduler.mpl = args.mpl;
    opts.scheduler.daemon_rt_priority = rt;
    let cluster = crate::local::LocalCluster::start(&opts)?;
    let mut argv: Vec<OsString> = args.command.clone();
    if argv.is_empty() {
        argv.push(std::env::var_os("SHELL").unwrap_or_else(|| "/bin/sh".into()));
    }
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .env("STORM_CONFIG", &cluster.config_path)
        .env_remove("STORM_SOCKET")
        .status()
        .with_context(|| format!("running {}", argv[0].to_string_lossy()));
    cluster.shutdown()?;
    Ok(shell_code(status?))
}
