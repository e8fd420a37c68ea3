//! `storm alloc [COMMAND...]`, shaped like `salloc`: waits for an allocation, runs the
//! command (default: the user's shell) here, on the submit host, with the allocation in its
//! environment, and gives the allocation back when the command ends. `storm-submit` in the
//! command runs steps on the allocation's nodes.
//!
//! The allocation is a job that holds its nodes with a sleeping placeholder task per slot
//! (`/bin/sleep infinity`, never sent: every node has it), so it is scheduled, gang-switched,
//! time-limited and journaled like any job. It is followed on this connection: if `storm
//! alloc` goes away, the MM ends the allocation, as it ends storm-submit's jobs; if the
//! allocation ends first (a time limit, a cancel, a node failure), the command is sent SIGTERM
//! and `storm alloc` says why.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Parser;
use storm_cluster::control::{Client, JobRequest, Reply, Request};
use storm_cluster::messages::{JobId, MpiMode};

use crate::display::safe;
use crate::job_options::JobShape;

/// `storm alloc`'s options.
#[derive(Parser, Debug, Clone)]
#[command(name = "storm alloc")]
pub struct AllocArgs {
    #[command(flatten)]
    pub shape: JobShape,
    /// The command to run with the allocation (default: $SHELL, or /bin/sh).
    #[arg(trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// The program that holds an allocation's nodes.
const PLACEHOLDER: &str = "/bin/sleep";

/// How long the allocation's end may take to be confirmed once given back.
const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// The placeholder job that holds the allocation.
fn request(shape: &JobShape, here: &Path) -> JobRequest {
    JobRequest {
        name: shape.job_name.clone().unwrap_or_else(|| "alloc".into()),
        program: PathBuf::from(PLACEHOLDER),
        args: vec!["infinity".into()],
        env: Vec::new(),
        cwd: here.to_path_buf(),
        tasks: shape.tasks(),
        delivery: storm_cluster::control::Delivery::InPlace,
        time_limit_ms: shape.time_limit_ms,
        requeue: false,
        mpi: MpiMode::None,
        input: Default::default(),
        dependency: shape.dependency.clone(),
        batch: None,
        step_of: None,
        array: None,
        element: None,
        token: None,
    }
}

/// The allocation's task count as a step's default: `-n`, else `--ntasks-per-node` times the
/// nodes, else one per node.
fn tasks_of(shape: &JobShape, nodes: usize) -> usize {
    shape
        .ntasks
        .map(|n| n as usize)
        .or(shape.ntasks_per_node.map(|p| p as usize * nodes))
        .unwrap_or(nodes)
}

/// Runs `storm alloc`; its exit code is the command's.
pub fn run(args: AllocArgs, socket: &Path) -> Result<i32, String> {
    let here = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let client = Client::connect(socket)?;
    client.request(
        &Request::Submit(Box::new(request(&args.shape, &here))),
        None,
    )?;
    let mut job = None;
    let (nodes, names) = loop {
        match client.next()? {
            Reply::Accepted { job: id, queued } => {
                job = Some(id);
                match queued {
                    Some(why) => {
                        eprintln!("storm alloc: pending job allocation {id}: {}", safe(&why))
                    }
                    None => eprintln!("storm alloc: pending job allocation {id}"),
                }
            }
            Reply::Started {
                nodes, node_names, ..
            } => break (nodes, node_names),
            Reply::Finished(outcome) => {
                return Err(format!(
                    "job allocation {} ended before it was granted: {}",
                    outcome.job,
                    outcome.reason.as_deref().map(safe).unwrap_or_default()
                ));
            }
            Reply::Error(e) => return Err(e),
            _ => {}
        }
    };
    let job: JobId = job.ok_or("the machine manager granted an allocation it never accepted")?;
    eprintln!(
        "storm alloc: granted job allocation {job} on {}",
        names.join(",")
    );
    let (program, cmd_args) = match args.command.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => (
            std::env::var_os("SHELL").unwrap_or_else(|| "/bin/sh".into()),
            Vec::new(),
        ),
    };
    // Interrupts are the command's while it runs (a handler, not SIG_IGN, which the command
    // would inherit); until then they end storm alloc, and the MM ends the allocation with
    // the connection.
    let interrupted = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted)
        .map_err(|e| e.to_string())?;
    let mut child = Command::new(&program)
        .args(&cmd_args)
        .env("STORM_JOB_ID", job.to_string())
        .env("STORM_NNODES", nodes.len().to_string())
        .env(
            "STORM_NTASKS",
            tasks_of(&args.shape, nodes.len()).to_string(),
        )
        // Node ids, as every task's STORM_NODELIST says them.
        .env("STORM_NODELIST", nodes.to_string())
        .env("STORM_SOCKET", socket)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", Path::new(&program).display()))?;
    // The allocation may end first: watch the connection while the command runs.
    let ended = Arc::new(std::sync::Mutex::new(None::<String>));
    let watcher = {
        let sock = client.sock.try_clone().map_err(|e| e.to_string())?;
        let ended = ended.clone();
        let pid = child.id() as libc::pid_t;
        std::thread::spawn(move || {
            let watch = Client {
                sock,
                cluster: String::new(),
                nodes: 0,
            };
            while let Ok(reply) = watch.next() {
                if let Reply::Finished(outcome) = reply {
                    let why = outcome
                        .reason
                        .unwrap_or_else(|| "its placeholder tasks ended".into());
                    *ended.lock().expect("ended") = Some(why);
                    // SAFETY: a signal to our own child, which we have not reaped yet.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                    break;
                }
            }
        })
    };
    let status = child.wait().map_err(|e| e.to_string())?;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    if let Some(why) = ended.lock().expect("ended").clone() {
        eprintln!(
            "storm alloc: job allocation {job} was revoked: {}",
            safe(&why)
        );
        return Ok(code);
    }
    eprintln!("storm alloc: relinquishing job allocation {job}");
    client.request(&Request::Cancel { job }, None)?;
    // The watcher sees the allocation's end (or the connection close).
    let _ = client
        .sock
        .set_read_timeout(Some(RELEASE_WAIT))
        .map_err(|e| e.to_string());
    let _ = watcher.join();
    Ok(code)
}
