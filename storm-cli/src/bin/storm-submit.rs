//! `storm-submit`: run a parallel job and wait for it, like `srun`.
//!
//! Exit status: 0 when every rank exited 0; otherwise the exit code of the lowest-numbered
//! rank that failed, or 128 + its signal; 1 when the job could not run at all (rejected,
//! cancelled before it started, program transfer failed) or storm-submit itself failed.

use std::ffi::OsString;
use std::fs::File;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use storm_cli::display::safe;
use storm_cli::input::{InputSender, read_pieces};
use storm_cli::job_options::JobShape;
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cli::submit::{self, OutputSink, Progress};
use storm_cluster::control::{Client, Delivery, JobRequest};
use storm_cluster::messages::{InputTarget, JobId, Stream};
use storm_primitives::NodeSet;

#[derive(Parser)]
#[command(
    name = "storm-submit",
    version,
    about = "Run a parallel job on a storm cluster and wait for it",
    after_help = "Options come before the program: everything from the program's name on \
                  (or after `--`) is the program's own."
)]
struct Args {
    #[command(flatten)]
    shape: JobShape,
    /// Prefix every output line with its rank.
    #[arg(short = 'l', long)]
    label: bool,
    /// Always copy the program to each node's spool directory. By default it runs in place
    /// where every node has it at its path, the same file (a shared file system), and is
    /// copied only otherwise.
    #[arg(long, conflicts_with = "no_bcast")]
    bcast: bool,
    /// Never copy the program: it is at that path on every node.
    #[arg(long)]
    no_bcast: bool,
    /// How MPI programs find each other (docs/mpi.md). auto (the default): whatever the
    /// program speaks, so MPICH and Open MPI programs start as one world (PMI-1 and PMI-2 on
    /// the socket `PMI_FD`, the task's first message deciding, and Open MPI 4 loading storm's
    /// PMI library through its flux component); both: PMI-1 and PMI-2 only; pmi1, pmi2: one;
    /// openmpi: as auto; none: no PMI, MPI programs start as singletons.
    #[arg(
        long,
        value_name = "auto|none|pmi1|pmi2|both|openmpi",
        default_value = "auto"
    )]
    mpi: storm_cluster::messages::MpiMode,
    /// A rank that exits with a non-zero code or is killed by a signal ends the whole job at
    /// once, and the job exits with its code (srun's `-K`). Without it, such a rank ends the
    /// job only if it had started MPI (docs/mpi.md); the others run on.
    #[arg(short = 'K', long)]
    kill_on_bad_exit: bool,
    /// End the job this many seconds after its first rank ends, if its other ranks still run
    /// then (srun's `-W`, Flux's `exit-timeout`); the job exits with the first rank's code
    /// (1 if it was 0). 0: let them run on as long as they like (docs/mpi.md).
    #[arg(
        short = 'W',
        long = "wait",
        value_name = "SECONDS",
        default_value_t = storm_cluster::control::DEFAULT_EXIT_WAIT_S
    )]
    exit_wait: u32,
    /// How each rank is bound to CPUs (srun's `--cpu-bind`): cores, each rank on CPUs of its
    /// own among the job's, an equal share each, when the node has no more ranks than CPUs;
    /// rank, local rank k on the job's k-th CPU; none. Default: the cluster's `[cluster]
    /// cpu_bind` (cores unless its operator chose otherwise). Tasks find theirs in
    /// STORM_CPU_BIND and STORM_CPU_BIND_LIST (docs/mpi.md).
    #[arg(long, value_name = "none|cores|rank")]
    cpu_bind: Option<storm_cluster::cpu_bind::CpuBind>,
    /// Which tasks read this standard input: a rank, `all`, or `none` (their standard input
    /// is then /dev/null). In the background of a terminal, none.
    #[arg(short = 'i', long, value_name = "RANK|all|none", default_value = "0")]
    input: InputTarget,
    /// Run as a step of this running job, on its nodes (default inside a job: its own,
    /// $STORM_JOB_ID).
    #[arg(long, value_name = "JOB")]
    jobid: Option<JobId>,
    /// If the connection to the machine manager is lost (it restarted), wait this many
    /// seconds for it to come back and follow the job on (0: give up at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    reconnect: u64,
    /// Print the send / execute / total times of the job, and its time slot.
    #[arg(long)]
    timing: bool,
    /// Say what happens (queueing, nodes).
    #[arg(short, long)]
    verbose: bool,
    /// Start an embedded cluster of this many nodes on this machine for this job.
    #[arg(long, value_name = "N")]
    local: Option<u32>,
    /// CPUs of each node of the embedded cluster (default: this machine's cores).
    #[arg(long, value_name = "CPUS")]
    local_cpus: Option<u32>,
    /// Timeslice of the embedded cluster, in milliseconds.
    #[arg(long, default_value_t = 1.0)]
    local_timeslice_ms: f64,
    /// Primitives backend of the embedded cluster: tcp, ofi (libfabric), or local (the MM and
    /// every NM as threads of one storm-local process).
    #[arg(long, default_value = "tcp")]
    backend: storm_cluster::config::BackendKind,
    /// libfabric provider of the embedded cluster with --backend ofi (e.g. 'tcp;ofi_rxm').
    #[arg(long)]
    provider: Option<String>,
    /// Scheduling policy of the embedded cluster: fcfs, easy or gang.
    #[arg(long, default_value = "fcfs")]
    policy: storm_cluster::config::PolicyKind,
    /// Multiprogramming level (time slots) of the embedded cluster's gang scheduler.
    #[arg(long, default_value_t = 2)]
    mpl: usize,
    /// Keep the embedded cluster's directory (logs, spools) and print where it is.
    #[arg(long)]
    keep: bool,
    /// The cluster file (default: $STORM_CONFIG, then /etc/storm/cluster.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The MM's control socket (instead of reading it from the cluster file).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    command: Vec<OsString>,
}

/// How long a program transfer runs before storm-submit shows its progress.
const SHOW_TRANSFER_AFTER: Duration = Duration::from_secs(1);

/// How often storm-submit, following a job through a quiet replica of a replicated MM, checks
/// whether another replica leads now (a frozen leader holds the connection and says nothing).
const SUPERSEDED_CHECK: Duration = Duration::from_secs(1);

/// The progress bar of a program transfer: shown on a terminal once the transfer has taken
/// [`SHOW_TRANSFER_AFTER`], cleared when it ends.
struct TransferBar {
    started: Instant,
    bar: Option<indicatif::ProgressBar>,
    /// When the bar appeared, and how much had been sent then: the rate counts from there.
    shown: Option<(Instant, u64)>,
}

impl TransferBar {
    fn update(&mut self, job: JobId, sent: u64, total: u64) {
        if self.bar.is_none() && sent < total && self.started.elapsed() >= SHOW_TRANSFER_AFTER {
            let style = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {prefix}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
            let bar = indicatif::ProgressBar::new(total)
                .with_style(style)
                .with_message(format!("storm-submit: job {job}: sending the program"));
            bar.set_position(sent);
            bar.enable_steady_tick(Duration::from_millis(200));
            self.bar = Some(bar);
            self.shown = Some((Instant::now(), sent));
        }
        if let (Some(bar), Some((since, from))) = (&self.bar, self.shown) {
            bar.set_position(sent);
            bar.set_prefix(rate_text(
                sent - from.min(sent),
                since.elapsed(),
                total - sent,
            ));
        }
    }

    fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

struct Terminal {
    sink: OutputSink,
    /// Standard error is a terminal (progress bars go there, and only there).
    stderr_tty: bool,
    transfer: Option<TransferBar>,
    verbose: bool,
    timing: bool,
    interrupts: Arc<AtomicUsize>,
    asked: usize,
    job: Option<JobId>,
    /// Where to reconnect to the MM (every replica of a replicated MM), and for how long to
    /// try.
    sockets: Vec<PathBuf>,
    reconnect: Duration,
    /// The socket of the connection in use, and when a quiet MM was last checked for having
    /// been replaced by another replica.
    current: Option<PathBuf>,
    checked: Instant,
}

impl Progress for Terminal {
    fn accepted(&mut self, job: JobId, queued: Option<&str>) {
        self.job = Some(job);
        match queued {
            Some(why) => eprintln!("storm-submit: job {job} queued: {}", safe(why)),
            None if self.verbose => eprintln!("storm-submit: job {job} accepted"),
            None => {}
        }
    }
    fn started(&mut self, job: JobId, nodes: &NodeSet, names: &[String], time_slot: Option<u32>) {
        if self.verbose || self.timing {
            let slot = time_slot
                .map(|s| format!(", time slot {s}"))
                .unwrap_or_default();
            eprintln!(
                "storm-submit: job {job} runs on nodes {nodes} ({}){slot}",
                safe(&names.join(","))
            );
        }
    }
    fn output(&mut self, rank: u32, stream: Stream, data: &[u8]) {
        self.end_transfer();
        self.sink.write(rank, stream, data);
    }
    fn transfer(&mut self, job: JobId, sent: u64, total: u64) {
        if !self.stderr_tty {
            return;
        }
        let t = self.transfer.get_or_insert_with(|| TransferBar {
            started: Instant::now(),
            bar: None,
            shown: None,
        });
        t.update(job, sent, total);
        if sent >= total {
            self.end_transfer();
        }
    }
    fn flocked(&mut self, job: JobId, peer: &str) {
        eprintln!(
            "storm-submit: job {job} flocked to peer cluster {}, which runs it",
            safe(peer)
        );
    }
    fn requeued(&mut self, job: JobId, reason: &str, had_output: bool) {
        self.end_transfer();
        let note = if had_output {
            " (the output above came from the interrupted run)"
        } else {
            ""
        };
        eprintln!(
            "storm-submit: job {job} requeued: {}; it will run from the start{note}",
            safe(reason)
        );
    }
    fn input_lost(&mut self, job: JobId) {
        eprintln!(
            "storm-submit: job {job}: the interrupted run read standard input; the new run's \
             standard input is empty"
        );
    }
    fn reconnect(&mut self, job: JobId, why: &str) -> Option<Client> {
        self.wait_for_mm(
            why,
            &format!("to follow job {job}"),
            &format!("following job {job}"),
        )
    }
    fn resubmit(&mut self, why: &str) -> Option<Client> {
        self.wait_for_mm(
            why,
            "to send the job again (an MM that took it already follows it instead)",
            "sending the job again",
        )
    }
    fn superseded(&mut self) -> bool {
        if self.sockets.len() < 2 || self.checked.elapsed() < SUPERSEDED_CHECK {
            return false;
        }
        self.checked = Instant::now();
        self.current
            .as_deref()
            .is_some_and(|c| storm_cli::superseded(&self.sockets, c))
    }
    fn cancel_requested(&mut self) -> bool {
        // A second interrupt ends storm-submit in its signal handler (see `run`).
        let n = self.interrupts.load(Ordering::Acquire);
        if self.sink.stdout_closed() && self.asked == 0 {
            // As srun, which SIGPIPE ends: the job ends too, and its output goes nowhere.
            self.asked = 1;
            if let Some(job) = self.job {
                eprintln!("storm-submit: standard output was closed; cancelling job {job}");
            }
            return true;
        }
        if n >= 1 && self.asked == 0 {
            self.asked = 1;
            if let Some(job) = self.job {
                eprintln!("storm-submit: cancelling job {job} (interrupt again to quit at once)");
            }
            return true;
        }
        false
    }
}

impl Terminal {
    /// Waits up to `--reconnect` for the machine manager to answer again, on any replica's
    /// socket, after the connection was lost (`why`); `what` says what for, and `then` what
    /// follows once it answers.
    fn wait_for_mm(&mut self, why: &str, what: &str, then: &str) -> Option<Client> {
        if self.reconnect.is_zero() {
            return None;
        }
        eprintln!(
            "storm-submit: {why}; waiting up to {} s for the machine manager to come back {what}",
            self.reconnect.as_secs()
        );
        let interrupts = &self.interrupts;
        let interrupted = || interrupts.load(Ordering::Acquire) > 0;
        match storm_cli::reconnect_within(&self.sockets, self.reconnect, interrupted) {
            Some((client, socket)) => {
                self.current = Some(socket);
                eprintln!("storm-submit: the machine manager is back; {then}");
                Some(client)
            }
            None if interrupted() => {
                eprintln!(
                    "storm-submit: interrupted while waiting for the machine manager {what}; \
                     nothing was cancelled"
                );
                None
            }
            None => None,
        }
    }

    /// Clears the transfer's progress bar, if one shows.
    fn end_transfer(&mut self) {
        if let Some(mut t) = self.transfer.take() {
            t.clear();
        }
    }
}

/// Whether standard input is a terminal this process is in the background of (`&`): reading
/// it would stop the process (SIGTTIN), so the job gets no input, where srun would stop.
fn in_terminal_background() -> bool {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return false;
    }
    nix::unistd::tcgetpgrp(stdin).is_ok_and(|fg| fg != nix::unistd::getpgrp())
}

/// The transfer's rate and time left, from `bytes` sent in `elapsed` since the bar appeared
/// with `left` to go; nothing before half a second has passed (indicatif's own rate, fed the
/// bytes sent before the bar appeared as if sent in its first instant, said 14 TiB/s).
fn rate_text(bytes: u64, elapsed: Duration, left: u64) -> String {
    let secs = elapsed.as_secs_f64();
    if secs < 0.5 || bytes == 0 {
        return String::new();
    }
    let rate = bytes as f64 / secs;
    let eta = Duration::from_secs_f64((left as f64 / rate).min(360_000.0));
    format!(
        "{}/s, {} left",
        indicatif::HumanBytes(rate as u64),
        indicatif::HumanDuration(eta)
    )
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

fn run(args: Args) -> Result<i32, String> {
    let here = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    // Inside a job (a batch script, `storm alloc`'s shell, a task): a step of it, shaped
    // like its allocation unless told otherwise. An embedded cluster is a cluster of its own.
    let step_of = match (args.local, args.jobid) {
        (Some(_), _) => None,
        (None, Some(id)) => Some(id),
        (None, None) => std::env::var("STORM_JOB_ID")
            .ok()
            .and_then(|v| v.parse::<JobId>().ok()),
    };
    let shape = match step_of {
        Some(_) => args.shape.clone().or_allocation(|k| std::env::var(k).ok()),
        None => args.shape.clone(),
    };
    let cwd = match &shape.chdir {
        Some(d) => here.join(d),
        None => here.clone(),
    };
    if !cwd.is_dir() {
        return Err(format!(
            "working directory {} does not exist",
            cwd.display()
        ));
    }
    let path_var = std::env::var_os("PATH");
    let program_name = &args.command[0];
    let program = match submit::resolve_program(program_name, &here, path_var.as_deref()) {
        Ok(p) => p,
        Err(_) if args.no_bcast && Path::new(program_name).is_absolute() => {
            PathBuf::from(program_name)
        }
        Err(e) => return Err(e),
    };
    let env = submit::with_umask(submit::export_env(
        shape.export.as_deref(),
        std::env::vars_os(),
    )?);
    let file = if args.no_bcast {
        None
    } else {
        Some(File::open(&program).map_err(|e| format!("cannot open {}: {e}", program.display()))?)
    };
    let mut tasks = shape.tasks();
    if let (Some(n), None, None, None) =
        (args.local, shape.nodes, shape.ntasks, shape.ntasks_per_node)
    {
        // `--local N` alone: one task on each of the N nodes.
        tasks.nodes = Some(n);
        tasks.ntasks = Some(n);
    }
    let req = JobRequest {
        name: shape.job_name.clone().unwrap_or_else(|| {
            program
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        }),
        program: program.clone(),
        args: args.command[1..].to_vec(),
        env,
        cwd,
        tasks,
        delivery: match (args.bcast, args.no_bcast) {
            (true, _) => Delivery::Broadcast,
            (_, true) => Delivery::InPlace,
            _ => Delivery::Auto,
        },
        time_limit_ms: shape.time_limit_ms,
        requeue: shape.requeue,
        mpi: args.mpi,
        input: args.input,
        dependency: shape.dependency.clone(),
        batch: None,
        step_of,
        array: None,
        element: None,
        token: Some(rand::random()),
        mem: shape.mem(),
        constraint: shape.constraint()?,
        flock: shape.flock()?,
        borrow: shape.borrow,
        less: shape.less,
        one_cluster: shape.one_cluster,
        kill_on_bad_exit: args.kill_on_bad_exit,
        exit_wait_s: args.exit_wait,
        cpu_bind: args.cpu_bind,
    };

    let local = match args.local {
        Some(n) => {
            if args.local_cpus == Some(0) {
                return Err("--local-cpus must be at least 1".into());
            }
            let c = LocalCluster::start(&LocalOptions {
                nodes: n,
                cpus: args.local_cpus,
                timeslice_ms: args.local_timeslice_ms,
                keep: args.keep,
                backend: args.backend,
                provider: args.provider.clone(),
                scheduler: storm_cluster::config::SchedulerSection {
                    policy: args.policy,
                    mpl: args.mpl,
                    ..Default::default()
                },
                ..LocalOptions::new(n)
            })
            .map_err(|e| format!("cannot start the local cluster: {e:#}"))?;
            if args.keep || args.verbose {
                eprintln!(
                    "storm-submit: local cluster of {n} nodes in {}",
                    c.root().display()
                );
            }
            Some(c)
        }
        None => None,
    };
    let sockets = match &local {
        Some(c) => vec![c.socket().to_path_buf()],
        None => storm_cli::control_sockets(args.socket.clone(), args.config.clone())?,
    };
    let interrupts = Arc::new(AtomicUsize::new(0));
    // Ctrl-C, a kill, or the terminal going away (a logout) cancel the job; a second one
    // quits at once, as the first one's message says.
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        let counter = interrupts.clone();
        // SAFETY: the handler touches only an atomic, and `_exit` is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                if counter.fetch_add(1, Ordering::AcqRel) >= 1 {
                    const QUIT: &[u8] =
                        b"storm-submit: interrupted twice; leaving without waiting\n";
                    libc::write(2, QUIT.as_ptr().cast(), QUIT.len());
                    // The daemons of an embedded cluster end with this process (their
                    // parent-death signal).
                    libc::_exit(130);
                }
            })
        }
        .map_err(|e| e.to_string())?;
    }
    let mut term = Terminal {
        sink: OutputSink::new(args.label),
        stderr_tty: std::io::stderr().is_terminal(),
        transfer: None,
        verbose: args.verbose,
        timing: args.timing,
        interrupts,
        asked: 0,
        job: None,
        sockets: sockets.clone(),
        current: None,
        checked: Instant::now(),
        // Nothing restarts the MM of an embedded cluster.
        reconnect: match local {
            Some(_) => Duration::ZERO,
            None => Duration::from_secs(args.reconnect),
        },
    };
    let input = match args.input {
        InputTarget::None => None,
        _ if in_terminal_background() => None,
        target => Some(InputSender::new(read_pieces(std::io::stdin()), target)),
    };
    let result = storm_cli::connect_any(&sockets).and_then(|(client, socket)| {
        term.current = Some(socket);
        submit::run_job_with_input(client, req, file.as_ref(), input, &mut term)
    });
    term.end_transfer();
    term.sink.flush();
    if let Some(c) = local
        && let Err(e) = c.shutdown()
    {
        eprintln!("storm-submit: stopping the local cluster: {e:#}");
    }
    let (outcome, nodes, names) = result?;
    let stdout_closed = term.sink.stdout_closed();
    if let Some(reason) = &outcome.reason {
        eprintln!("storm-submit: job {}: {}", outcome.job, safe(reason));
    }
    for line in submit::failure_lines(&outcome, &nodes, &names) {
        eprintln!("storm-submit: job {}: {}", outcome.job, safe(&line));
    }
    if let Some(hint) = submit::copied_program_hint(&outcome, &program, args.bcast) {
        eprintln!("storm-submit: job {}: {}", outcome.job, safe(&hint));
    }
    if args.timing {
        let t = outcome.timing;
        eprintln!(
            "storm-submit: job {} timing: queued {}, send {}, launch {} (journal {}), execute {} (start {} [seal checked {}, readied {}, handed to the launcher {}], run {}, report {}), total {}",
            outcome.job,
            ms(t.queued_us),
            ms(t.send_us),
            ms(t.launch_us),
            ms(t.record_us),
            ms(t.execute_us),
            ms(t.start_us),
            ms(t.verified_us),
            ms(t.prepared_us),
            ms(t.asked_us),
            ms(t.run_us),
            ms(t.report_us),
            ms(t.total_us)
        );
    }
    if stdout_closed {
        // What a shell sees of srun that SIGPIPE ended.
        return Ok(128 + libc::SIGPIPE);
    }
    Ok(outcome.exit_code())
}

fn main() -> ExitCode {
    storm_cluster::cli_docs::exit_if_asked::<Args>();
    let args = Args::parse();
    match run(args) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("storm-submit: error: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transfer_rate_counts_from_the_bar_and_waits_for_half_a_second() {
        // The first frame: 300 MB were sent before the bar appeared, none since.
        assert_eq!(rate_text(0, Duration::ZERO, 1 << 30), "");
        assert_eq!(rate_text(5 << 20, Duration::from_millis(100), 1 << 30), "");
        let text = rate_text(50 << 20, Duration::from_secs(2), 100 << 20);
        assert!(text.starts_with("25.00 MiB/s, "), "{text}");
        assert!(text.ends_with("4 seconds left"), "{text}");
    }
}
