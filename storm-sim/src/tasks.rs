//! Tasks in virtual time: the simulated node's [`TaskRunner`].
//!
//! A task needs `work` of virtual CPU time (its first argument, in milliseconds) and exits 0
//! when it has had it. It runs while the NM lets it (launched and, under gang scheduling,
//! continued at its time slot; a halt stops it, as SIGSTOP would). A signal ends it at once
//! (`Signaled(n)`), except SIGTERM for a task given `ignore-sigterm`. Given `lines=N`, it
//! writes N lines to its standard output, `rank R line I`, spread evenly over its work (line
//! I once it has had I/N of it). Its streams are in memory ([`MemoryStream`]), read by the
//! NM's forwarder; both end when the task does. Given `reaped-after=MS`, its exit status is
//! known only MS after it ended, as a launcher that reaps its child a moment after the
//! child's pipes closed. Given `exit=N`, it exits N instead of 0.
//!
//! Every task keeps the windows of virtual time in which it ran ([`SimTasks::run_windows`]):
//! what a real task sees of gang scheduling, from its own side.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use storm_cluster::messages::{JobId, JobUsage, RankStatus, Stream};
use storm_nm::env::{StartedTask, TaskId, TaskRunner, TaskStart, TaskTimes};
use storm_nm::output::OutputSource;

/// The argument that makes a simulated task ignore SIGTERM.
pub const IGNORE_SIGTERM: &str = "ignore-sigterm";

/// The argument prefix that makes a simulated task write lines (`lines=N`).
pub const LINES: &str = "lines=";

/// The argument prefix that delays a simulated task's exit status (`reaped-after=MS`).
pub const REAPED_AFTER: &str = "reaped-after=";

/// The argument prefix that sets the exit code a simulated task ends with (`exit=N`).
pub const EXIT_CODE: &str = "exit=";

/// A stream in memory: what the task wrote and the forwarder has not read yet.
#[derive(Clone, Default)]
pub struct MemoryStream(Arc<Mutex<Written>>);

#[derive(Default)]
struct Written {
    bytes: VecDeque<u8>,
    ended: bool,
}

impl MemoryStream {
    fn write(&self, text: &str) {
        self.0.lock().expect("stream").bytes.extend(text.as_bytes());
    }

    fn end(&self) {
        self.0.lock().expect("stream").ended = true;
    }
}

impl OutputSource for MemoryStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut w = self.0.lock().expect("stream");
        if w.bytes.is_empty() {
            return if w.ended {
                Ok(0)
            } else {
                Err(std::io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(w.bytes.len());
        for (b, byte) in buf.iter_mut().zip(w.bytes.drain(..n)) {
            *b = byte;
        }
        Ok(n)
    }

    fn pipe(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

struct SimTask {
    job: JobId,
    rank: u32,
    work: Duration,
    /// Virtual CPU time the task still needs.
    left: Duration,
    lines: u32,
    written: u32,
    ignore_term: bool,
    /// What it exits with once it has had its work.
    exit_code: i32,
    /// How long after its end its status is known.
    reaped_after: Duration,
    halted: bool,
    status: Option<RankStatus>,
    /// The windows it ran in, and since when it runs if it does.
    windows: Vec<(Instant, Instant)>,
    running_since: Option<Instant>,
    started: Instant,
    ended: Option<Instant>,
    stdout: MemoryStream,
    stderr: MemoryStream,
}

impl SimTask {
    /// Writes the lines its progress has reached.
    fn write_due(&mut self) {
        let done = self.work.saturating_sub(self.left).as_nanos();
        let work = self.work.as_nanos().max(1);
        let due = if self.left.is_zero() {
            self.lines
        } else {
            (done * self.lines as u128 / work) as u32
        };
        while self.written < due {
            self.written += 1;
            self.stdout
                .write(&format!("rank {} line {}\n", self.rank, self.written));
        }
    }

    /// Runs from `at` on, unless it ended or runs already.
    fn run_from(&mut self, at: Instant) {
        if self.status.is_none() && self.running_since.is_none() {
            self.running_since = Some(at);
        }
    }

    /// Runs no more from `at` on.
    fn pause_at(&mut self, at: Instant) {
        if let Some(from) = self.running_since.take() {
            self.windows.push((from, at));
        }
    }

    fn end(&mut self, status: RankStatus, at: Instant) {
        self.pause_at(at);
        self.status = Some(status);
        self.ended = Some(at);
        self.stdout.end();
        self.stderr.end();
    }
}

/// The tasks of one simulated node.
pub struct SimTasks {
    tasks: HashMap<TaskId, SimTask>,
    next: TaskId,
    /// When the tasks last progressed.
    last: Instant,
    /// Time zero of the node's stamps ([`TaskTimes`]).
    origin: Instant,
    /// How many tasks of each job this node ever started (kept after their release).
    started: HashMap<JobId, u32>,
}

impl SimTasks {
    /// Tasks whose times are stamped from `origin`.
    pub fn new(origin: Instant) -> Self {
        Self {
            tasks: HashMap::new(),
            next: 1,
            last: origin,
            origin,
            started: HashMap::new(),
        }
    }

    /// How many tasks of job `job` this node ever started, released ones included.
    pub fn started(&self, job: JobId) -> u32 {
        self.started.get(&job).copied().unwrap_or(0)
    }

    /// Every task that may run has run from the last advance until `now`.
    pub fn advance(&mut self, now: Instant) {
        let from = self.last;
        let ran = now.saturating_duration_since(from);
        self.last = now;
        for t in self
            .tasks
            .values_mut()
            .filter(|t| t.status.is_none() && !t.halted)
        {
            let needed = t.left;
            t.left = t.left.saturating_sub(ran);
            t.write_due();
            if t.left.is_zero() {
                t.end(RankStatus::Exited(t.exit_code), from + needed);
            }
        }
    }

    fn stamp(&self, at: Instant) -> u128 {
        at.saturating_duration_since(self.origin).as_nanos()
    }

    /// The windows of virtual time in which job `job`'s tasks here ran, each task's in
    /// order, up to the last advance (a task running then ends its last window there).
    /// Released tasks are no longer known.
    pub fn run_windows(&self, job: JobId) -> Vec<Vec<(Instant, Instant)>> {
        let mut tasks: Vec<&SimTask> = self.tasks.values().filter(|t| t.job == job).collect();
        tasks.sort_by_key(|t| t.rank);
        tasks
            .into_iter()
            .map(|t| {
                let mut w = t.windows.clone();
                w.extend(t.running_since.map(|from| (from, self.last)));
                w
            })
            .collect()
    }
}

impl TaskRunner for SimTasks {
    fn start(&mut self, task: TaskStart<'_>) -> Result<StartedTask, String> {
        // The simulated program's arguments are ours, so UTF-8.
        let args: Vec<&str> = task.args.iter().filter_map(|a| a.to_str()).collect();
        let work = args
            .first()
            .and_then(|a| a.parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        let lines = args
            .iter()
            .find_map(|a| a.strip_prefix(LINES)?.parse().ok())
            .unwrap_or(0);
        let id = self.next;
        self.next += 1;
        *self.started.entry(task.job).or_default() += 1;
        let mut t = SimTask {
            job: task.job,
            rank: task.rank,
            work,
            left: work,
            lines,
            written: 0,
            ignore_term: args.contains(&IGNORE_SIGTERM),
            exit_code: args
                .iter()
                .find_map(|a| a.strip_prefix(EXIT_CODE)?.parse().ok())
                .unwrap_or(0),
            reaped_after: args
                .iter()
                .find_map(|a| a.strip_prefix(REAPED_AFTER)?.parse().ok())
                .map_or(Duration::ZERO, Duration::from_millis),
            halted: false,
            status: None,
            windows: Vec::new(),
            running_since: None,
            started: self.last,
            ended: None,
            stdout: MemoryStream::default(),
            stderr: MemoryStream::default(),
        };
        t.run_from(self.last);
        let output: Vec<(Stream, Box<dyn OutputSource>)> = vec![
            (Stream::Stdout, Box::new(t.stdout.clone())),
            (Stream::Stderr, Box::new(t.stderr.clone())),
        ];
        self.tasks.insert(id, t);
        Ok(StartedTask {
            id,
            output,
            // Simulated tasks read no input, and have every limit kept.
            input: None,
            notice: None,
        })
    }

    fn halt(&mut self, task: TaskId) -> bool {
        if let Some(t) = self.tasks.get_mut(&task) {
            t.halted = true;
            t.pause_at(self.last);
        }
        true
    }

    fn resume(&mut self, task: TaskId) {
        if let Some(t) = self.tasks.get_mut(&task) {
            t.halted = false;
            t.run_from(self.last);
        }
    }

    fn signal(&mut self, task: TaskId, signal: i32) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        if t.status.is_none() && !(signal == libc::SIGTERM && t.ignore_term) {
            t.end(RankStatus::Signaled(signal), self.last);
        }
    }

    fn status(&mut self, task: TaskId) -> Option<RankStatus> {
        let t = self.tasks.get(&task)?;
        let reaped = t.ended.is_some_and(|at| self.last >= at + t.reaped_after);
        t.status.filter(|_| reaped)
    }

    fn times(&mut self, task: TaskId) -> TaskTimes {
        let Some(t) = self.tasks.get(&task) else {
            return TaskTimes::default();
        };
        TaskTimes {
            started_ns: Some(self.stamp(t.started)),
            exited_ns: t.ended.map(|at| self.stamp(at)),
        }
    }

    fn wait_stopped(&mut self, _tasks: &[TaskId], _wait: Duration) -> bool {
        // A halted simulated task stops at once.
        true
    }

    fn release(&mut self, task: TaskId) {
        self.tasks.remove(&task);
    }

    /// Simulated tasks leave nothing behind and use nothing anyone measures.
    fn end_job(&mut self, _job: JobId) -> JobUsage {
        JobUsage::default()
    }

    fn poll(&mut self) {}

    // Simulated tasks load no library.
    fn mpi_library(&mut self, _task: TaskId) -> Option<String> {
        None
    }
}
