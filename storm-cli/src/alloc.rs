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
//! and `storm alloc` says why. If the MM restarts or a replicated MM fails over, `storm alloc`
//! follows the allocation on a connection to the MM that comes back (its submission sent again
//! with its token if the answer was lost), and the command's steps find it too.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
fn request(shape: &JobShape, here: &Path) -> Result<JobRequest, String> {
    Ok(JobRequest {
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
        mem: shape.mem(),
        constraint: shape.constraint()?,
        // Its steps run on its nodes, at home: an allocation never flocks.
        flock: storm_cluster::flock::Flock::Never,
        borrow: shape.borrow,
        less: shape.less,
        one_cluster: shape.one_cluster,
        kill_on_bad_exit: false,
        exit_wait_s: 0,
        cpu_bind: None,
    })
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

/// Runs `storm alloc` on the MM at `sockets` (several: the replicas of a replicated MM, whose
/// leader may change while the allocation is held); its exit code is the command's. `config`,
/// the cluster file named on the command line, is passed on to the command's steps.
pub fn run(args: AllocArgs, sockets: &[PathBuf], config: Option<&Path>) -> Result<i32, String> {
    let here = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let (mut client, _) = crate::connect_any(sockets)?;
    let mut req = request(&args.shape, &here)?;
    // A submission whose answer a failover cut off is sent again with it: the MM that holds
    // the job already answers by following it.
    req.token = Some(rand::random());
    let submit = Request::Submit(Box::new(req));
    crate::sent_or_lost(client.try_request(&submit, None))?;
    let mut job = None;
    let mut losses = crate::Losses::default();
    let (nodes, names) = loop {
        let next = client.next();
        let go_on = losses.after(&next);
        let reply = match next {
            Ok(reply) => reply,
            Err(e) if !go_on => {
                return Err(format!(
                    "lost the machine manager {} times in a row without a word from it ({e}) \
                     before the allocation was granted; see storm queue",
                    crate::LOSSES_IN_A_ROW
                ));
            }
            Err(e) => {
                client = reconnect(sockets, &e, || false).ok_or_else(|| {
                    format!(
                        "lost the machine manager ({e}) before the allocation was granted; \
                         it may have been accepted all the same (see storm queue)"
                    )
                })?;
                crate::sent_or_lost(client.try_request(&submit, None))?;
                continue;
            }
        };
        match reply {
            Reply::Accepted { job: id, queued } => {
                if job.replace(id).is_some() {
                    continue;
                }
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
    let mut command = Command::new(&program);
    command
        .args(&cmd_args)
        .env("STORM_JOB_ID", job.to_string())
        .env("STORM_NNODES", nodes.len().to_string())
        .env(
            "STORM_NTASKS",
            tasks_of(&args.shape, nodes.len()).to_string(),
        )
        // Node ids, as every task's STORM_NODELIST says them.
        .env("STORM_NODELIST", nodes.to_string());
    // Steps reach the MM as this does: one socket, or every replica's from the cluster file.
    match (sockets, config) {
        ([one], _) => {
            command.env("STORM_SOCKET", one);
        }
        (_, Some(config)) => {
            command
                .env_remove("STORM_SOCKET")
                .env("STORM_CONFIG", config);
        }
        (_, None) => {
            command.env_remove("STORM_SOCKET");
        }
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", Path::new(&program).display()))?;
    // The allocation may end first: watch it while the command runs, on this connection and,
    // after a failover, on one to the next leader.
    let ended = Arc::new(std::sync::Mutex::new(None::<String>));
    let releasing = Arc::new(AtomicBool::new(false));
    let (done, watched) = std::sync::mpsc::channel::<()>();
    {
        let ended = ended.clone();
        let releasing = releasing.clone();
        let sockets = sockets.to_vec();
        let pid = child.id() as libc::pid_t;
        std::thread::spawn(move || {
            let mut watch = client;
            let mut losses = crate::Losses::default();
            loop {
                let next = watch.next();
                let go_on = losses.after(&next);
                match next {
                    Ok(Reply::Finished(outcome)) if outcome.job == job => {
                        let why = outcome
                            .reason
                            .unwrap_or_else(|| "its placeholder tasks ended".into());
                        *ended.lock().expect("ended") = Some(why);
                        if !releasing.load(Ordering::Acquire) {
                            // SAFETY: a signal to our own child, which we have not reaped yet.
                            unsafe { libc::kill(pid, libc::SIGTERM) };
                        }
                        break;
                    }
                    Ok(_) => {}
                    Err(_) if !go_on => break,
                    Err(e) => {
                        let gone = || releasing.load(Ordering::Acquire);
                        let Some(next) = reconnect(&sockets, &e, gone) else {
                            break;
                        };
                        if crate::sent_or_lost(next.try_request(&Request::Attach { job }, None))
                            .is_err()
                        {
                            break;
                        }
                        eprintln!("storm alloc: following job allocation {job} again");
                        watch = next;
                    }
                }
            }
            let _ = done.send(());
        });
    }
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
    releasing.store(true, Ordering::Release);
    // On a connection of its own: the watcher's may be between two leaders.
    let (canceller, _) = crate::connect_any(sockets).or_else(|e| {
        crate::reconnect_within(sockets, RECONNECT, || false)
            .ok_or_else(|| format!("cannot give job allocation {job} back: {e}"))
    })?;
    canceller.request(&Request::Cancel { job }, None)?;
    // The watcher sees the allocation's end (or gives up on the connection).
    let _ = watched.recv_timeout(RELEASE_WAIT);
    Ok(code)
}

/// How long `storm alloc` waits for the MM to come back (an MM restarting, a group electing).
const RECONNECT: Duration = Duration::from_secs(60);

/// A connection to the MM again after the one in use was lost (`why`), or `None` if none
/// answered within [`RECONNECT`] or `give_up` says to stop.
fn reconnect(sockets: &[PathBuf], why: &str, give_up: impl Fn() -> bool) -> Option<Client> {
    eprintln!(
        "storm alloc: lost the machine manager ({why}); waiting up to {} s for it",
        RECONNECT.as_secs()
    );
    crate::reconnect_within(sockets, RECONNECT, give_up).map(|(c, _)| c)
}
