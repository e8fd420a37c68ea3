//! Submitting a job and following it to the end: what storm-submit does once it knows the
//! job (see the binary for the options).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use storm_cluster::control::{self, Client, JobOutcome, JobRequest, Reply, Request};
use storm_cluster::messages::{JobId, Stream};
use storm_cluster::tasks::node_of_rank;

use crate::input::InputSender;
use crate::{LOSSES_IN_A_ROW, Losses};
use storm_primitives::NodeSet;

/// Finds the program as a shell would: a path with a slash is taken relative to `cwd`, a bare
/// name is looked up in `PATH`. The result must be an executable file.
pub fn resolve_program(
    program: &OsStr,
    cwd: &Path,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, String> {
    let shown = Path::new(program).display();
    let found = if program.as_bytes().contains(&b'/') {
        let p = cwd.join(program);
        if !p.exists() {
            return Err(format!("program {shown} not found"));
        }
        p
    } else {
        std::env::split_paths(path_var.unwrap_or_default())
            .filter(|d| !d.as_os_str().is_empty())
            .map(|d| d.join(program))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("program {shown} not found in PATH"))?
    };
    let meta = std::fs::metadata(&found).map_err(|e| format!("{}: {e}", found.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", found.display()));
    }
    if meta.permissions().mode() & 0o111 == 0
        || nix::unistd::access(&found, nix::unistd::AccessFlags::X_OK).is_err()
    {
        return Err(format!("{} is not executable", found.display()));
    }
    Ok(found)
}

/// Builds the job's environment from `--export` (Slurm's rules): `ALL` (the default) passes
/// this environment; `NONE` passes nothing; a list `VAR,VAR=value,...` passes only those,
/// unless it also names `ALL`.
/// Names and values are taken as the bytes they are (UTF-8 or not).
pub fn export_env(
    spec: Option<&str>,
    current: impl Iterator<Item = (OsString, OsString)>,
) -> Result<Vec<(OsString, OsString)>, String> {
    let current: Vec<(OsString, OsString)> = current.collect();
    let Some(spec) = spec else { return Ok(current) };
    let mut all = false;
    let mut chosen: Vec<(OsString, OsString)> = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item {
            "ALL" => all = true,
            "NONE" => {}
            _ => match item.split_once('=') {
                Some((k, v)) if !k.is_empty() => chosen.push((k.into(), v.into())),
                Some(_) => return Err(format!("--export: {item:?} has no variable name")),
                None => match current.iter().find(|(k, _)| k.as_os_str() == item) {
                    Some(kv) => chosen.push(kv.clone()),
                    None => return Err(format!("--export: {item} is not set in this environment")),
                },
            },
        }
    }
    let mut env = if all { current } else { Vec::new() };
    for (k, v) in chosen {
        env.retain(|(x, _)| *x != k);
        env.push((k, v));
    }
    Ok(env)
}

/// `env` with `STORM_UMASK` set to this process's umask, unless it is set already: the job's
/// tasks make their files under the submitter's mask, as Slurm's `SLURM_UMASK` has them do
/// (a user under `umask 077` does not get output others may read).
pub fn with_umask(mut env: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
    if env.iter().any(|(k, _)| k == "STORM_UMASK") {
        return env;
    }
    if let Some(mask) = current_umask() {
        env.push(("STORM_UMASK".into(), format!("{mask:04o}").into()));
    }
    env
}

/// This process's umask, read from `/proc/self/status` (reading it with `umask(2)` would
/// change it for a moment).
pub fn current_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// Where output goes and how it is labelled.
pub struct OutputSink {
    label: bool,
    partial: HashMap<(u32, bool), Vec<u8>>,
    /// Standard output is closed (`| head` read what it wanted): nothing more goes there.
    stdout_closed: bool,
}

impl OutputSink {
    pub fn new(label: bool) -> Self {
        Self {
            label,
            partial: HashMap::new(),
            stdout_closed: false,
        }
    }

    /// Whether standard output was found closed (a write failed with a broken pipe).
    pub fn stdout_closed(&self) -> bool {
        self.stdout_closed
    }

    pub fn write(&mut self, rank: u32, stream: Stream, data: &[u8]) {
        let is_err = matches!(stream, Stream::Stderr | Stream::Notice);
        if !self.label {
            self.emit(is_err, data);
            return;
        }
        let buf = self.partial.entry((rank, is_err)).or_default();
        buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            out.extend_from_slice(format!("{rank}: ").as_bytes());
            out.extend_from_slice(&line);
        }
        self.emit(is_err, &out);
    }

    fn emit(&mut self, is_err: bool, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if is_err {
            let mut e = std::io::stderr();
            let _ = e.write_all(bytes).and_then(|()| e.flush());
        } else if !self.stdout_closed {
            let mut o = std::io::stdout();
            if let Err(e) = o.write_all(bytes).and_then(|()| o.flush())
                && e.kind() == std::io::ErrorKind::BrokenPipe
            {
                self.stdout_closed = true;
            }
        }
    }

    /// Writes out unfinished lines.
    pub fn flush(&mut self) {
        let mut keys: Vec<_> = self.partial.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let buf = self.partial.remove(&key).unwrap_or_default();
            if !buf.is_empty() {
                let mut out = format!("{}: ", key.0).into_bytes();
                out.extend_from_slice(&buf);
                out.push(b'\n');
                self.emit(key.1, &out);
            }
        }
    }
}

/// Hooks for what happens while a job runs.
pub trait Progress {
    fn accepted(&mut self, _job: JobId, _queued: Option<&str>) {}
    fn started(
        &mut self,
        _job: JobId,
        _nodes: &NodeSet,
        _names: &[String],
        _time_slot: Option<u32>,
    ) {
    }
    fn output(&mut self, _rank: u32, _stream: Stream, _data: &[u8]) {}
    /// The program is on its way to the job's nodes: `sent` of `total` bytes reached every
    /// one of them (first with `sent` 0 when the transfer starts).
    fn transfer(&mut self, _job: JobId, _sent: u64, _total: u64) {}
    /// A node of the job failed and the job went back to the queue (by itself if it had not
    /// started, with `--requeue` if it had); `had_output` says whether this run printed any.
    fn requeued(&mut self, _job: JobId, _reason: &str, _had_output: bool) {}
    /// The job went to peer cluster `peer`, which runs it (docs/federation.md).
    fn flocked(&mut self, _job: JobId, _peer: &str) {}
    /// The job was requeued after its run read standard input: the next run reads none.
    fn input_lost(&mut self, _job: JobId) {}
    /// The connection to the MM was lost while following `job` (`why`): a client connected
    /// to an MM that came back, to follow the job on, or `None` to give up.
    fn reconnect(&mut self, _job: JobId, _why: &str) -> Option<Client> {
        None
    }
    /// The connection to the MM was lost (`why`) before it answered the submission: a client
    /// connected to an MM that came back (or to the next leader of a replicated group), to
    /// send the submission again on, or `None` to give up. Asked only for a submission with a
    /// token, which the MM recognises if it already took it.
    fn resubmit(&mut self, _why: &str) -> Option<Client> {
        None
    }
    /// Asked between events: whether the user wants the job cancelled now.
    fn cancel_requested(&mut self) -> bool {
        false
    }
    /// Asked while the MM is quiet: whether the MM this connection reaches no longer leads
    /// a replicated group (another replica answers), so that the job is followed there.
    fn superseded(&mut self) -> bool {
        false
    }
}

enum Event {
    Reply(Reply),
    Lost(String),
}

/// A connection to the MM: replies arrive on `rx` (read by a thread); requests go out on
/// `requests`.
struct Connection {
    requests: std::os::unix::net::UnixStream,
    rx: crossbeam_channel::Receiver<Event>,
}

impl Connection {
    fn follow(client: Client) -> Result<Self, String> {
        let requests = client.sock.try_clone().map_err(|e| e.to_string())?;
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            loop {
                match client.next() {
                    Ok(r) => {
                        if tx.send(Event::Reply(r)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Event::Lost(e));
                        break;
                    }
                }
            }
        });
        Ok(Self { requests, rx })
    }
}

impl Drop for Connection {
    /// Closes the connection itself, not only this side's descriptor: the reader thread
    /// holds the other, and would keep the MM's end open (a connection counted against the
    /// user's limit) until the MM next wrote to it.
    fn drop(&mut self) {
        let _ = self.requests.shutdown(std::net::Shutdown::Both);
    }
}

/// Sends `req` on `client` and follows the connection. A connection lost before the request
/// went out whole (the replica that answered stopped leading at once) shows as a loss on the
/// reader's side, where it is reconnected like any other; only the MM's refusal ends here.
fn resume(client: Client, req: &Request, fd: Option<BorrowedFd<'_>>) -> Result<Connection, String> {
    crate::sent_or_lost(client.try_request(req, fd))?;
    Connection::follow(client)
}

/// Submits `req` (with the open program for a broadcast) and follows it to its end. If the
/// connection to the MM is lost once the job is accepted, `progress` may reconnect; the job
/// is then followed on the new connection (`Attach`). Output that arrives twice (sent again
/// after the MM restarted, or after a node rejoined) is passed on once, by its stream offset.
pub fn run_job(
    client: Client,
    req: JobRequest,
    program: Option<&File>,
    progress: &mut dyn Progress,
) -> Result<(JobOutcome, NodeSet, Vec<String>), String> {
    run_job_with_input(client, req, program, None, progress)
}

/// [`run_job`], with `input` sent as the job's standard input once it starts (see
/// [`crate::input`]).
pub fn run_job_with_input(
    client: Client,
    req: JobRequest,
    program: Option<&File>,
    mut input: Option<InputSender>,
    progress: &mut dyn Progress,
) -> Result<(JobOutcome, NodeSet, Vec<String>), String> {
    // Kept to send again, if the MM is lost before it answers (see `JobRequest::token`).
    let again = req.token.is_some().then(|| req.clone());
    let mut conn = resume(
        client,
        &Request::Submit(Box::new(req)),
        program.map(|f| f.as_fd()),
    )?;
    let mut losses = Losses::default();
    let mut job = None;
    let mut nodes = NodeSet::new();
    let mut names = Vec::new();
    // The user asked to cancel; the request went out on the current connection.
    let (mut cancel_wanted, mut cancel_sent) = (false, false);
    // Bytes of each task's streams passed on so far (of the current run).
    let mut seen: HashMap<(u32, Stream), u64> = HashMap::new();
    loop {
        if let Some(id) = job {
            cancel_wanted = cancel_wanted || progress.cancel_requested();
            if cancel_wanted && !cancel_sent {
                // A failed send shows as a lost connection on the reader's side.
                let _ = control::send(&conn.requests, &Request::Cancel { job: id }, None);
                cancel_sent = true;
            }
        }
        if let Some(input) = input.as_mut() {
            // A failed send shows as a lost connection on the reader's side.
            input.pump(|r| {
                let _ = control::send(&conn.requests, r, None);
            });
        }
        let never = crossbeam_channel::never();
        let pieces = input
            .as_ref()
            .and_then(InputSender::waiting_on)
            .unwrap_or(&never);
        let ev = crossbeam_channel::select! {
            recv(conn.rx) -> ev => match ev {
                Ok(ev) => ev,
                Err(_) => Event::Lost("the connection closed".into()),
            },
            recv(pieces) -> piece => {
                if let Some(input) = input.as_mut() {
                    input.arrived(piece.unwrap_or(None));
                }
                continue;
            },
            default(std::time::Duration::from_millis(50)) => {
                if job.is_some() && progress.superseded() {
                    Event::Lost("another replica of the machine manager leads now".into())
                } else {
                    continue;
                }
            },
        };
        if matches!(ev, Event::Reply(_)) {
            losses.replied();
        }
        match ev {
            Event::Reply(Reply::Accepted { job: id, queued }) => {
                job = Some(id);
                progress.accepted(id, queued.as_deref());
            }
            Event::Reply(Reply::Started {
                job: id,
                ntasks,
                nodes: n,
                node_names,
                time_slot,
            }) => {
                progress.started(id, &n, &node_names, time_slot);
                if let Some(input) = input.as_mut() {
                    input.started(id, ntasks);
                }
                nodes = n;
                names = node_names;
            }
            Event::Reply(Reply::Output(c)) if c.stream == Stream::InputTaken => {
                if let Some(input) = input.as_mut() {
                    input.taken(c.rank, c.offset);
                }
            }
            Event::Reply(Reply::Output(c)) => {
                let seen = seen.entry((c.rank, c.stream)).or_default();
                if let Some(new) = c.unseen(*seen) {
                    progress.output(c.rank, c.stream, new);
                    *seen = c.offset.saturating_add(c.data.len() as u64);
                }
            }
            Event::Reply(Reply::Progress {
                job: id,
                sent,
                total,
            }) => progress.transfer(id, sent, total),
            Event::Reply(Reply::Requeued { job: id, reason }) => {
                // It runs again from the start: its streams too.
                let had_output = !seen.is_empty();
                seen.clear();
                progress.requeued(id, &reason, had_output);
                if let Some(input) = input.as_mut()
                    && input.requeue()
                {
                    progress.input_lost(id);
                }
            }
            Event::Reply(Reply::Flocked { job: id, peer }) => progress.flocked(id, &peer),
            Event::Reply(Reply::Finished(outcome)) => return Ok((outcome, nodes, names)),
            Event::Reply(Reply::Done) => {}
            Event::Reply(Reply::Error(e)) => return Err(e),
            Event::Reply(other) => return Err(format!("unexpected reply {other:?}")),
            Event::Lost(e) => {
                if !losses.lost() {
                    return Err(format!(
                        "lost the machine manager {LOSSES_IN_A_ROW} times in a row without a \
                         word from it ({e}); {}",
                        match job {
                            Some(id) => format!(
                                "job {id}'s outcome is unknown (see storm queue and storm \
                                 history)"
                            ),
                            None => "the job may have been accepted all the same (see storm \
                                     queue)"
                                .to_string(),
                        }
                    ));
                }
                let Some(id) = job else {
                    let client = again.as_ref().and_then(|_| progress.resubmit(&e));
                    let (Some(client), Some(req)) = (client, again.clone()) else {
                        return Err(format!(
                            "lost the machine manager ({e}) before it confirmed the job; it \
                             may have been accepted all the same (see storm queue)"
                        ));
                    };
                    // The MM that answers now follows the job if it holds it already, and
                    // takes the submission if not: it never makes two jobs of one.
                    conn = resume(
                        client,
                        &Request::Submit(Box::new(req)),
                        program.map(|f| f.as_fd()),
                    )?;
                    continue;
                };
                let Some(client) = progress.reconnect(id, &e) else {
                    return Err(format!(
                        "lost the machine manager ({e}): it stopped or restarted, and job \
                         {id}'s outcome is unknown (see storm queue and storm history)"
                    ));
                };
                conn = resume(client, &Request::Attach { job: id }, None)?;
                if let Some(input) = input.as_mut() {
                    input.reconnected(|r| {
                        let _ = control::send(&conn.requests, r, None);
                    });
                }
                // A cancel asked for before the loss is asked again.
                cancel_sent = false;
            }
        }
    }
}

/// One line per failed rank, like srun's "task N: Exited with exit code C".
pub fn failure_lines(outcome: &JobOutcome, nodes: &NodeSet, names: &[String]) -> Vec<String> {
    let ntasks = outcome.ranks.len() as u32;
    // A job that ran on a peer cluster has no node ids here, only its nodes' names there.
    let nnodes = if nodes.is_empty() {
        names.len()
    } else {
        nodes.len()
    } as u32;
    let node_of = |rank: u32| -> String {
        node_of_rank(ntasks, nnodes, rank)
            .and_then(|k| names.get(k as usize).cloned())
            .unwrap_or_else(|| "?".into())
    };
    outcome
        .ranks
        .iter()
        .enumerate()
        .filter_map(|(rank, s)| match s {
            Some(s) if s.success() => None,
            Some(s) => Some(format!("rank {rank} on {}: {s}", node_of(rank as u32))),
            None => Some(format!(
                "rank {rank} on {}: no exit status was reported",
                node_of(rank as u32)
            )),
        })
        .chain(outcome.usage.oom_kills.filter(|&n| n > 0).map(|n| {
            format!(
                "out of memory: the kernel's OOM killer killed {n} of its process{}",
                if n == 1 { "" } else { "es" }
            )
        }))
        .collect()
}

/// What to tell the user of a job whose program ran from a copy and then exited with an
/// error: the copy has nothing next to it, so a program that loads libraries through
/// `$ORIGIN` or reads `$(dirname "$0")/data` fails, and `--no-bcast` runs it in place.
/// `forced`: the copy was asked for (`--bcast`), rather than made because the program is not
/// the same file at its path on every node.
pub fn copied_program_hint(outcome: &JobOutcome, program: &Path, forced: bool) -> Option<String> {
    let exited_badly = outcome
        .ranks
        .iter()
        .any(|s| matches!(s, Some(storm_cluster::messages::RankStatus::Exited(c)) if *c != 0));
    if !outcome.broadcast || !exited_badly {
        return None;
    }
    let why = if forced {
        "(--bcast)".to_string()
    } else {
        format!(
            "because {} is not the same file on every node",
            program.display()
        )
    };
    Some(format!(
        "the program ran from a copy in each node's spool directory {why}: nothing next to it \
         was copied. If it failed looking for files beside itself, put them on a path every \
         node sees, or run it in place with --no-bcast"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::os::unix::net::UnixStream;
    use storm_cluster::control::Delivery;
    use storm_cluster::messages::{OutputChunk, RankStatus};
    use storm_cluster::tasks::TaskRequest;

    /// A client, and the fake MM's end of its connection.
    fn connection() -> (Client, UnixStream) {
        let (client, mm) = UnixStream::pair().unwrap();
        let client = Client {
            sock: client,
            cluster: "t".into(),
            nodes: 1,
        };
        (client, mm)
    }

    fn job_request() -> JobRequest {
        JobRequest {
            tasks: TaskRequest {
                ntasks: Some(1),
                ..Default::default()
            },
            delivery: Delivery::InPlace,
            token: Some(1),
            ..JobRequest::new("j", "/bin/true", "/")
        }
    }

    /// A fake MM that takes the submission, says it accepted it as job 7, and is lost.
    fn accepts_and_is_lost() -> (Client, std::thread::JoinHandle<()>) {
        let (client, mm) = connection();
        let mm = std::thread::spawn(move || {
            let (req, _) = control::recv::<Request>(&mm).unwrap();
            assert!(matches!(req, Request::Submit(_)), "{req:?}");
            let accepted = Reply::Accepted {
                job: 7,
                queued: None,
            };
            control::send(&mm, &accepted, None).unwrap();
        });
        (client, mm)
    }

    /// Hands out `next` in turn when the connection is lost, and keeps what the job printed.
    struct Reconnects {
        next: VecDeque<Client>,
        losses: Vec<String>,
        printed: Vec<u8>,
    }

    impl Progress for Reconnects {
        fn reconnect(&mut self, _job: JobId, why: &str) -> Option<Client> {
            self.losses.push(why.to_string());
            self.next.pop_front()
        }
        fn output(&mut self, _rank: u32, _stream: Stream, data: &[u8]) {
            self.printed.extend_from_slice(data);
        }
    }

    /// The replica that answers after a failover may stop leading at once (deposed, or its
    /// lease lost under load), closing the connection before the request to follow the job
    /// went out: the write fails (EPIPE). That is one more lost connection, reconnected like
    /// the first, and the job is followed to its end on the next replica; storm-submit used
    /// to give up there, with "lost the machine manager: i/o error: Broken pipe".
    #[test]
    fn a_connection_lost_again_before_the_job_is_followed_is_reconnected_once_more() {
        let (first, lost) = accepts_and_is_lost();
        let (second, closed) = connection();
        drop(closed);
        let (third, mm) = connection();
        let follows = std::thread::spawn(move || {
            let (req, _) = control::recv::<Request>(&mm).unwrap();
            assert!(matches!(req, Request::Attach { job: 7 }), "{req:?}");
            let line = Reply::Output(OutputChunk {
                job: 7,
                rank: 0,
                stream: Stream::Stdout,
                offset: 0,
                data: b"done\n".to_vec(),
            });
            control::send(&mm, &line, None).unwrap();
            let outcome = JobOutcome {
                job: 7,
                ranks: vec![Some(RankStatus::Exited(0))],
                reason: None,
                abort_code: None,
                timing: Default::default(),
                usage: Default::default(),
                cause: None,
                broadcast: false,
            };
            control::send(&mm, &Reply::Finished(outcome), None).unwrap();
        });
        let mut progress = Reconnects {
            next: VecDeque::from([second, third]),
            losses: vec![],
            printed: vec![],
        };
        let (outcome, _, _) = run_job(first, job_request(), None, &mut progress)
            .expect("the job is followed to its end on the third connection");
        lost.join().unwrap();
        follows.join().unwrap();
        assert_eq!(outcome.job, 7);
        assert_eq!(outcome.ranks, vec![Some(RankStatus::Exited(0))]);
        assert_eq!(progress.printed, b"done\n");
        assert_eq!(progress.losses.len(), 2, "{:?}", progress.losses);
    }

    /// An MM that answers and closes every connection at once is given up on after
    /// `LOSSES_IN_A_ROW` tries, with an error that says so, rather than tried forever.
    #[test]
    fn connections_lost_again_and_again_are_given_up_on() {
        let (first, lost) = accepts_and_is_lost();
        let next = (0..LOSSES_IN_A_ROW + 5)
            .map(|_| connection().0)
            .collect::<VecDeque<_>>();
        let mut progress = Reconnects {
            next,
            losses: vec![],
            printed: vec![],
        };
        let err = run_job(first, job_request(), None, &mut progress).unwrap_err();
        lost.join().unwrap();
        assert!(err.contains("times in a row"), "{err}");
        assert!(err.contains("job 7"), "{err}");
        assert_eq!(progress.losses.len(), LOSSES_IN_A_ROW as usize);
    }

    #[test]
    fn a_copied_program_that_exits_with_an_error_hears_of_no_bcast() {
        let outcome = |ranks: Vec<Option<RankStatus>>, broadcast: bool| JobOutcome {
            job: 4,
            ranks,
            reason: None,
            abort_code: None,
            timing: Default::default(),
            usage: Default::default(),
            cause: None,
            broadcast,
        };
        let prog = Path::new("/home/u/app");
        let failed = vec![Some(RankStatus::Exited(0)), Some(RankStatus::Exited(127))];
        let hint = copied_program_hint(&outcome(failed.clone(), true), prog, false).unwrap();
        assert!(hint.contains("--no-bcast"), "{hint}");
        assert!(hint.contains("/home/u/app is not the same file"), "{hint}");
        assert!(
            copied_program_hint(&outcome(failed.clone(), true), prog, true)
                .unwrap()
                .contains("(--bcast)")
        );
        // Run in place, it is the program's own failure; a success or a kill says nothing.
        assert_eq!(
            copied_program_hint(&outcome(failed, false), prog, false),
            None
        );
        let fine = vec![Some(RankStatus::Exited(0))];
        assert_eq!(copied_program_hint(&outcome(fine, true), prog, false), None);
        let killed = vec![Some(RankStatus::Signaled(9))];
        assert_eq!(
            copied_program_hint(&outcome(killed, true), prog, false),
            None
        );
    }

    fn env() -> impl Iterator<Item = (OsString, OsString)> {
        vec![("HOME".into(), "/h".into()), ("A".into(), "1".into())].into_iter()
    }

    #[test]
    fn export_follows_slurm() {
        assert_eq!(export_env(None, env()).unwrap().len(), 2);
        assert_eq!(export_env(Some("NONE"), env()).unwrap(), vec![]);
        assert_eq!(
            export_env(Some("A,B=2"), env()).unwrap(),
            vec![("A".into(), "1".into()), ("B".into(), "2".into())]
        );
        let all = export_env(Some("ALL,A=9"), env()).unwrap();
        assert_eq!(
            all,
            vec![("HOME".into(), "/h".into()), ("A".into(), "9".into())]
        );
        assert!(
            export_env(Some("NOPE"), env())
                .unwrap_err()
                .contains("NOPE")
        );
        assert!(export_env(Some("=x"), env()).is_err());
    }

    #[test]
    fn programs_are_found_like_a_shell_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("prog");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        let plain = dir.path().join("data");
        std::fs::write(&plain, "x").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().to_str().unwrap();
        assert_eq!(
            resolve_program("prog".as_ref(), Path::new("/"), Some(path.as_ref())).unwrap(),
            exe
        );
        assert_eq!(
            resolve_program("./prog".as_ref(), dir.path(), None).unwrap(),
            dir.path().join("./prog")
        );
        assert!(
            resolve_program("nope".as_ref(), Path::new("/"), Some(path.as_ref()))
                .unwrap_err()
                .contains("not found in PATH")
        );
        assert!(
            resolve_program("./data".as_ref(), dir.path(), None)
                .unwrap_err()
                .contains("not executable")
        );
        assert!(
            resolve_program("./missing".as_ref(), dir.path(), None)
                .unwrap_err()
                .contains("not found")
        );
    }
}
