//! `storm agent`: one node of a private instance, started by `storm start` through the
//! allocator's step launcher (one task per node) or through ssh (`--hosts`), or one of the
//! step's own tasks linked to the front end over TCP (`srun --mpi=pmi2 -N K storm start`:
//! [`Link::Tcp`], [`super::link`]). It binds the node manager's listening socket, tells the
//! front end where it is and where its directory is ([`AgentReport`] on standard output or
//! the link), takes the instance's files from standard input or the link ([`Bundle`]),
//! writes them into its own directory (mode 0700, made here for this
//! instance), and runs `storm-nm` there with that socket, and the node side of the control
//! relay beside it. When its input ends (the front end's teardown closes it, and so does the
//! front end's death) or the step is signalled (the allocation's end: SIGTERM,
//! SIGINT or SIGHUP) it stops the node manager and the relay and removes the directory.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::AgentArgs;
use super::report::{AgentReport, Bundle, MAX_LINE};

/// Where an agent's report goes, and where its files and its end come from.
pub enum Link {
    /// Its standard output and input: srun's or ssh's.
    Stdio,
    /// A connection to the front end ([`super::link`]), its hello said.
    Tcp(TcpStream),
}

/// Where an agent runs: its node in the instance and the address its node manager takes.
pub struct Placement {
    pub index: u32,
    pub name: String,
    /// The allocator's step (`JOB.STEP`), or `ssh`.
    pub step: String,
    pub ip: IpAddr,
}

/// Runs the agent until its node manager ends or the step is stopped; its exit code.
pub fn run(args: AgentArgs) -> Result<i32> {
    let var = |k: &str| {
        std::env::var(k)
            .with_context(|| format!("{k} is not set (storm agent runs under storm start's srun)"))
    };
    // Under ssh (`storm start --hosts`) or beside the front end (`--front`) the front end
    // names the node; under srun, Slurm.
    let placement = match (args.index, &args.node) {
        (Some(index), Some(name)) => {
            let ssh = std::env::var("SSH_CONNECTION").ok();
            let ip = match args.bind.or(super::ssh_server_address(ssh.as_deref())) {
                Some(ip) => ip,
                None => super::own_address(None)?,
            };
            Placement {
                index,
                name: name.clone(),
                step: slurm_step().unwrap_or_else(|| "ssh".into()),
                ip,
            }
        }
        _ => Placement {
            index: var("SLURM_NODEID")?
                .parse()
                .context("SLURM_NODEID is not a number")?,
            name: var("SLURMD_NODENAME")?,
            step: slurm_step().context("SLURM_JOB_ID or SLURM_STEP_ID is not set")?,
            ip: super::own_address(args.bind)?,
        },
    };
    let link = match args.front {
        Some(front) => {
            // The token comes on standard input (an environment variable would pass on to
            // the node manager and the jobs).
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .take(super::link::MAX_HELLO as u64)
                .read_line(&mut line)
                .context("reading the link's token")?;
            let token = super::link::Token::parse(line.trim_end())
                .map_err(|e| anyhow::anyhow!("the link's token on standard input: {e}"))?;
            connect(front, &token, placement.index)?
        }
        None => Link::Stdio,
    };
    serve(placement, link)
}

/// `JOB.STEP` of the Slurm step this process runs in, if it runs in one.
pub fn slurm_step() -> Option<String> {
    let job = std::env::var("SLURM_JOB_ID").ok()?;
    let step = std::env::var("SLURM_STEP_ID").ok()?;
    Some(format!("{job}.{step}"))
}

/// Connects to the front end at `front` and says hello as node `index`.
pub fn connect(front: SocketAddr, token: &super::link::Token, index: u32) -> Result<Link> {
    let mut stream = TcpStream::connect_timeout(&front, Duration::from_secs(10))
        .with_context(|| format!("connecting to storm start's front end at {front}"))?;
    stream
        .write_all(super::link::hello_line(token, index).as_bytes())
        .with_context(|| format!("saying hello to the front end at {front}"))?;
    Ok(Link::Tcp(stream))
}

/// Runs the agent at `placement`, talking to the front end over `link`; its exit code.
pub fn serve(placement: Placement, link: Link) -> Result<i32> {
    let Placement {
        index,
        name,
        step,
        ip,
    } = placement;
    let (mut input, mut output): (Box<dyn BufRead + Send>, Box<dyn Write>) = match link {
        Link::Stdio => (
            Box::new(BufReader::new(std::io::stdin())),
            Box::new(std::io::stdout()),
        ),
        Link::Tcp(stream) => (
            Box::new(BufReader::new(stream.try_clone()?)),
            Box::new(stream),
        ),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let dir = tempfile::Builder::new()
        .prefix("storm-agent-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("making the agent's directory")?;
    let listener = TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}"))?;
    let report = AgentReport {
        index,
        name: name.clone(),
        address: listener.local_addr()?,
        cpus: crate::local::host_cpus(),
        dir: dir.path().to_path_buf(),
        step,
        host: super::host_name(),
    };
    writeln!(output, "{}", report.to_line())?;
    output.flush()?;
    let mut line = String::new();
    let read = (&mut input)
        .take(MAX_LINE as u64)
        .read_line(&mut line)
        .context("reading the instance's files")?;
    if read == 0 {
        // The front end ended before the instance was up, and says why itself.
        return Ok(0);
    }
    let bundle = Bundle::parse(&line)
        .map_err(|why| anyhow::anyhow!("node {name}: the instance's files: {why}"))?;
    for (rel, bytes) in &bundle.files {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(bytes))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    // The end of the front end's input is the instance's end.
    let eof = stop.clone();
    std::thread::Builder::new()
        .name("storm-agent-input".into())
        .spawn(move || {
            let mut sink = [0u8; 4096];
            while matches!(input.read(&mut sink), Ok(n) if n > 0) {}
            eof.store(true, Ordering::Relaxed);
        })?;
    let notify_path = dir.path().join("notify.sock");
    let _notify = UnixDatagram::bind(&notify_path)?;
    let log = dir.path().join("nm.log");
    let mut nm = crate::local::spawn_daemon(
        &format!("storm-nm {name}"),
        &crate::local::bin_dir()?.join("storm-nm"),
        &[
            "--config".into(),
            dir.path().join("cluster.toml").display().to_string(),
            "--node".into(),
            name.clone(),
        ],
        Some(&listener),
        &log,
        None,
        &notify_path,
    )?;
    drop(listener);
    // The node side of the control relay: the jobs' tasks here (a batch script's steps)
    // reach the MM through it (`STORM_SOCKET`).
    let relay_log = dir.path().join("relay.log");
    let mut relay = crate::local::spawn_daemon(
        &format!("storm-relay {name}"),
        &crate::local::bin_dir()?.join("storm-relay"),
        &[
            "--config".into(),
            dir.path().join("cluster.toml").display().to_string(),
            "--node".into(),
            name.clone(),
        ],
        None,
        &relay_log,
        None,
        &notify_path,
    )?;
    let code = loop {
        if let Some(status) = nm.child.try_wait()? {
            if !status.success() {
                eprintln!(
                    "storm agent: node {name}: storm-nm ended ({status}):\n{}",
                    crate::local::tail(&log)
                );
            }
            break status.code().unwrap_or(1);
        }
        if let Ok(Some(status)) = relay.child.try_wait() {
            eprintln!(
                "storm agent: node {name}: storm-relay ended ({status}):\n{}",
                crate::local::tail(&relay_log)
            );
            stop_child(&mut nm.child, Duration::from_secs(3));
            break 1;
        }
        if stop.load(Ordering::Relaxed) {
            stop_child(&mut nm.child, Duration::from_secs(3));
            break 0;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    stop_child(&mut relay.child, Duration::from_secs(3));
    drop(dir);
    // Closing the output tells a linked front end this node is done.
    drop(output);
    Ok(code)
}

/// SIGTERM to `child`, then SIGKILL if it is still there after `grace`; reaped.
pub(crate) fn stop_child(child: &mut std::process::Child, grace: Duration) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}
