//! The NM's PMI thread: serves the PMI sockets of every local task of every MPI job, sends
//! each fence's contribution (or an abort) to the MM, and takes the MM's fence results; for
//! PMIx jobs it is also the host of each job's exchange core ([`super::exchange`]: direct
//! modex and ranks' ends), between the node's PMIx helper and the MM.
//!
//! The thread sleeps in `poll` on the tasks' sockets and a wake-up pipe. A second thread
//! waits on `pmi_down_event` (the MM wrote a fence result) and writes to that pipe; the main
//! loop writes to it when it adds or removes a job.
//!
//! The thread serves every MPI task of every user on the node, so no task may stall it: the
//! sockets are non-blocking, and each task's answers wait in a buffer of their own of at
//! most [`MAX_UNREAD`] bytes, written as the task reads. A task that lets more pile up
//! (it asks and never reads) ends its own job, with the reason; the other jobs are served as
//! before.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use storm_cluster::RmLayout;
use storm_cluster::messages::{
    JobId, PmiFenced, PmiUp, PmixDown, RankStatus, decode_sealed, encode_sealed,
};
use storm_primitives::{NodeId, NodeSet, PrimError, Primitives, Wait};

use super::exchange::{Exchange, XEffect};
use super::job::{Effect, JobFacts, PmiJob};
use super::wire::Framer;
use crate::pmix::{FenceDone, HelperTx, ModexDone, PmixEvent};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

/// Key-value pairs of the PMI key space.
type Pairs = Vec<(String, String)>;

/// Bytes of answers one task may leave unread before its job is ended: far more than any
/// PMI exchange needs (a reply is at most [`super::wire::MAX_MESSAGE`]).
pub const MAX_UNREAD: usize = 1 << 20;

enum Msg {
    Add {
        slot: usize,
        facts: JobFacts,
        conns: Vec<(u32, UnixStream)>,
    },
    Remove(JobId),
    /// A local rank of the job ended.
    RankEnded {
        job: JobId,
        rank: u32,
        status: RankStatus,
    },
    /// A new membership (perhaps a restarted MM): send again the contributions of fences
    /// still waiting.
    Resend,
}

/// The ranks of each served job that spoke to the server at all (a PMI message, or a PMIx
/// client's connection), as the thread notes them for the NM's main loop.
type Contacts = Arc<Mutex<BTreeMap<JobId, BTreeSet<u32>>>>;

/// The handle the NM's main loop keeps.
pub struct PmiService {
    tx: Sender<Msg>,
    wake: Arc<OwnedFd>,
    contacts: Contacts,
}

impl PmiService {
    pub fn start(
        prims: Arc<dyn Primitives>,
        rm: &RmLayout,
        node: NodeId,
        mm: NodeId,
        op_timeout: Duration,
        pmix: Receiver<PmixEvent>,
    ) -> std::io::Result<Self> {
        let (wake_r, wake_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let wake_w = Arc::new(wake_w);
        let (tx, rx) = crossbeam_channel::unbounded();
        let contacts = Contacts::default();
        let server = Server {
            contacts: contacts.clone(),
            prims: prims.clone(),
            rm: rm.clone(),
            node,
            mm,
            op_timeout,
            jobs: BTreeMap::new(),
            pmix,
            helper: None,
        };
        std::thread::Builder::new()
            .name(format!("storm-pmi-{node}"))
            .spawn(move || server.run(rx, wake_r))?;
        let bridge_wake = wake_w.clone();
        let down = rm.pmi_down_event;
        std::thread::Builder::new()
            .name(format!("storm-pmi-wait-{node}"))
            .spawn(move || {
                loop {
                    match prims.test_event(down, Wait::Timeout(Duration::from_secs(1))) {
                        Ok(true) => poke(&bridge_wake),
                        Ok(false) => {}
                        Err(PrimError::ShutDown) => break,
                        Err(e) => {
                            tracing::warn!(node, "PMI: waiting for fence results: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })?;
        Ok(Self {
            tx,
            wake: wake_w,
            contacts,
        })
    }

    /// Serves the tasks of a job that just started here: `conns` are the NM's ends of their
    /// PMI sockets, by rank.
    pub fn add_job(&self, slot: usize, facts: JobFacts, conns: Vec<(u32, UnixStream)>) {
        let _ = self.tx.send(Msg::Add { slot, facts, conns });
        poke(&self.wake);
    }

    /// Whether rank `rank` of job `job` has spoken to this node's PMI or PMIx server.
    pub fn contacted(&self, job: JobId, rank: u32) -> bool {
        self.contacts
            .lock()
            .is_ok_and(|c| c.get(&job).is_some_and(|ranks| ranks.contains(&rank)))
    }

    pub fn remove_job(&self, job: JobId) {
        let _ = self.tx.send(Msg::Remove(job));
        poke(&self.wake);
    }

    pub fn resend(&self) {
        let _ = self.tx.send(Msg::Resend);
        poke(&self.wake);
    }

    /// Local rank `rank` of MPI job `job` ended with `status`.
    pub fn rank_ended(&self, job: JobId, rank: u32, status: RankStatus) {
        let _ = self.tx.send(Msg::RankEnded { job, rank, status });
        poke(&self.wake);
    }

    /// What wakes the thread (the node's PMIx server's callbacks write to it).
    pub fn waker(&self) -> Arc<OwnedFd> {
        self.wake.clone()
    }
}

fn poke(fd: &OwnedFd) {
    let _ = nix::unistd::write(fd, &[1]);
}

struct Conn {
    /// Non-blocking.
    stream: UnixStream,
    framer: Framer,
    /// Answers not yet taken by the task, oldest first.
    unread: std::collections::VecDeque<u8>,
}

impl Conn {
    /// Writes what the task will take now; an error if its socket is broken.
    fn flush(&mut self) -> std::io::Result<()> {
        while !self.unread.is_empty() {
            let (front, _) = self.unread.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.unread.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

struct Served {
    slot: usize,
    state: PmiJob,
    conns: BTreeMap<u32, Conn>,
    /// The node's PMIx server waits for this fence's result.
    pmix_fence: Option<FenceDone>,
    /// Direct modex and ranks' ends.
    exchange: Exchange<ModexDone>,
    /// The seal (length and checksum) of the last [`PmixDown`] taken: the same is not
    /// decoded again.
    down_seen: [u8; SEAL_BYTES],
}

/// A sealed message's length and checksum.
const SEAL_BYTES: usize = 12;

struct Server {
    contacts: Contacts,
    prims: Arc<dyn Primitives>,
    rm: RmLayout,
    node: NodeId,
    mm: NodeId,
    op_timeout: Duration,
    jobs: BTreeMap<JobId, Served>,
    /// What the node's PMIx server's callbacks say (nothing where it does not run).
    pmix: Receiver<PmixEvent>,
    /// The way to the node's PMIx helper, once it runs.
    helper: Option<HelperTx>,
}

impl Server {
    fn run(mut self, rx: Receiver<Msg>, wake: OwnedFd) {
        loop {
            let mut fds = vec![libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let mut who = Vec::new();
            for (&job, s) in &self.jobs {
                for (&rank, c) in &s.conns {
                    let out = if c.unread.is_empty() {
                        0
                    } else {
                        libc::POLLOUT
                    };
                    fds.push(libc::pollfd {
                        fd: c.stream.as_raw_fd(),
                        events: libc::POLLIN | out,
                        revents: 0,
                    });
                    who.push((job, rank));
                }
            }
            // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 200) };
            if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(node = self.node, "PMI: poll failed; the PMI server stops");
                return;
            }
            if fds[0].revents != 0 {
                let mut sink = [0u8; 64];
                while matches!(nix::unistd::read(&wake, &mut sink), Ok(n) if n > 0) {}
            }
            loop {
                match rx.try_recv() {
                    Ok(msg) => self.take(msg),
                    Err(crossbeam_channel::TryRecvError::Empty) => break,
                    Err(crossbeam_channel::TryRecvError::Disconnected) => return,
                }
            }
            while let Ok(event) = self.pmix.try_recv() {
                self.take_pmix(event);
            }
            self.collect_results();
            self.collect_exchanges();
            for (pfd, (job, rank)) in fds[1..].iter().zip(who) {
                if pfd.revents & libc::POLLOUT != 0 {
                    self.flush_to(job, rank);
                }
                if pfd.revents & !libc::POLLOUT != 0 {
                    self.read_from(job, rank);
                }
            }
        }
    }

    fn take(&mut self, msg: Msg) {
        match msg {
            Msg::Add { slot, facts, conns } => {
                let job = facts.job;
                let local: Vec<u32> = conns.iter().map(|(r, _)| *r).collect();
                let exchange = Exchange::new(
                    job,
                    facts.size,
                    local.iter().copied(),
                    self.rm.pmi_node_bytes.saturating_sub(SEAL_BYTES),
                );
                let state = PmiJob::new(facts, local);
                // What an earlier job of the slot was sent down is not this one's.
                let _ = self
                    .prims
                    .memory()
                    .write(self.rm.pmix_down_offset(slot), &[0u8; SEAL_BYTES]);
                let conns = conns
                    .into_iter()
                    .filter_map(|(rank, stream)| match stream.set_nonblocking(true) {
                        Ok(()) => Some((
                            rank,
                            Conn {
                                stream,
                                framer: Framer::default(),
                                unread: Default::default(),
                            },
                        )),
                        Err(e) => {
                            tracing::error!(job, rank, "PMI: cannot serve the task: {e}");
                            None
                        }
                    })
                    .collect();
                self.jobs.insert(
                    job,
                    Served {
                        slot,
                        state,
                        conns,
                        pmix_fence: None,
                        exchange,
                        down_seen: [0; SEAL_BYTES],
                    },
                );
            }
            Msg::Remove(job) => {
                if let Ok(mut c) = self.contacts.lock() {
                    c.remove(&job);
                }
                if let Some(mut s) = self.jobs.remove(&job) {
                    if let Some(done) = s.pmix_fence.take() {
                        done.complete(Err(format!("job {job} ended")));
                    }
                    let effects = s.exchange.close();
                    self.apply_exchange(job, effects);
                }
            }
            Msg::RankEnded { job, rank, status } => {
                let effects = self
                    .jobs
                    .get_mut(&job)
                    .and_then(|s| {
                        let end = s.state.end_event(rank, status)?;
                        Some(s.exchange.rank_ended(end))
                    })
                    .unwrap_or_default();
                self.apply_exchange(job, effects);
            }
            Msg::Resend => {
                let waiting: Vec<(JobId, u32, Pairs)> = self
                    .jobs
                    .iter()
                    .filter_map(|(&job, s)| s.state.waiting_fence().map(|(e, p)| (job, e, p)))
                    .collect();
                for (job, epoch, pairs) in waiting {
                    self.send_up(job, PmiUp::Fence { job, epoch, pairs });
                }
                let jobs: Vec<JobId> = self.jobs.keys().copied().collect();
                for job in jobs {
                    let effects = self
                        .jobs
                        .get_mut(&job)
                        .map(|s| s.exchange.resend())
                        .unwrap_or_default();
                    self.apply_exchange(job, effects);
                }
            }
        }
    }

    /// Takes the MM's fence results for the jobs waiting for one.
    fn collect_results(&mut self) {
        let limit = self.rm.pmi_job_bytes;
        let ready: Vec<(JobId, PmiFenced)> = self
            .jobs
            .iter()
            .filter(|(_, s)| s.state.waiting_fence().is_some())
            .filter_map(|(&job, s)| {
                let bytes = self
                    .prims
                    .memory()
                    .read_vec(self.rm.pmi_down_offset(s.slot), limit)
                    .ok()?;
                let msg: PmiFenced = decode_sealed("PMI fence result", &bytes, limit).ok()?;
                (msg.job == job).then_some((job, msg))
            })
            .collect();
        for (job, msg) in ready {
            let Some(s) = self.jobs.get_mut(&job) else {
                continue;
            };
            let before = s.state.waiting_fence().map(|(e, _)| e);
            let effects = s.state.fenced(msg.epoch, msg.pairs);
            // A PMIx fence that this result completed: every node's data, in node order.
            if before.is_some()
                && s.state.waiting_fence().is_none()
                && let Some(done) = s.pmix_fence.take()
            {
                let nodes = s.state.facts.nodes.len();
                let mut data = Vec::new();
                let mut bad = None;
                for (node, blob) in s.state.pmix_blobs(nodes).into_iter().enumerate() {
                    match BASE64.decode(blob) {
                        Ok(bytes) => data.extend(bytes),
                        Err(e) => bad = Some(format!("node {node}'s fence data: {e}")),
                    }
                }
                done.complete(bad.map_or(Ok(data), Err));
            }
            self.apply(job, effects);
        }
    }

    /// Takes what the MM sent down for each job's exchange, if it is new.
    fn collect_exchanges(&mut self) {
        let limit = self.rm.pmi_job_bytes;
        let mem = self.prims.memory();
        let mut fresh = Vec::new();
        for (&job, s) in self.jobs.iter_mut() {
            let offset = self.rm.pmix_down_offset(s.slot);
            let mut seal = [0u8; SEAL_BYTES];
            if mem.read(offset, &mut seal).is_err() || seal == s.down_seen || seal == [0; 12] {
                continue;
            }
            let len = u32::from_le_bytes([seal[0], seal[1], seal[2], seal[3]]) as usize;
            let Ok(bytes) = mem.read_vec(offset, (SEAL_BYTES + len).min(limit)) else {
                continue;
            };
            // Still arriving, or overwritten while read: taken at the next wake.
            let Ok(msg) = decode_sealed::<PmixDown>("PMIx exchange", &bytes, limit) else {
                continue;
            };
            s.down_seen = seal;
            fresh.push((job, msg));
        }
        for (job, msg) in fresh {
            let effects = self
                .jobs
                .get_mut(&job)
                .map(|s| s.exchange.down(msg))
                .unwrap_or_default();
            self.apply_exchange(job, effects);
        }
    }

    /// Carries out what a job's exchange core decided.
    fn apply_exchange(&mut self, job: JobId, effects: Vec<XEffect<ModexDone>>) {
        let nspace = format!("storm-{job}");
        for effect in effects {
            match effect {
                XEffect::Send(up) => {
                    let Some(slot) = self.jobs.get(&job).map(|s| s.slot) else {
                        continue;
                    };
                    match encode_sealed("PMIx exchange", &up, self.rm.pmi_node_bytes) {
                        Ok(bytes) => {
                            let offset = self.rm.pmix_up_offset(slot, self.node as usize);
                            self.write_to_mm(job, offset, bytes);
                        }
                        Err(e) => tracing::error!(node = self.node, job, "PMIx exchange: {e}"),
                    }
                }
                XEffect::Answer(done, result) => done.complete(result),
                XEffect::Fetch(rank) => match &self.helper {
                    Some(helper) => helper.serve_modex(&nspace, rank),
                    None => {
                        let effects = self
                            .jobs
                            .get_mut(&job)
                            .map(|s| s.exchange.fetched(rank, Err("no PMIx server here".into())))
                            .unwrap_or_default();
                        self.apply_exchange(job, effects);
                    }
                },
                XEffect::Tell(end) => {
                    if let Some(helper) = &self.helper {
                        helper.notify(&nspace, end);
                    }
                }
            }
        }
    }

    /// Carries out what the node's PMIx server said, for the job whose namespace it names
    /// (a job not served here is no one's), then answers the client's waiting call.
    fn take_pmix(&mut self, event: PmixEvent) {
        let job_of = |jobs: &BTreeMap<JobId, Served>, nspace: &str| {
            jobs.iter()
                .find(|(_, s)| s.state.facts.kvsname() == nspace)
                .map(|(&j, _)| j)
        };
        match event {
            PmixEvent::Connected { nspace, rank, done } => {
                if let Some(job) = job_of(&self.jobs, &nspace) {
                    self.contacted(job, rank);
                    let effects = self
                        .jobs
                        .get_mut(&job)
                        .map(|s| s.state.pmix_connected(rank))
                        .unwrap_or_default();
                    self.apply(job, effects);
                }
                done.complete();
            }
            PmixEvent::Finalized { nspace, rank, done } => {
                if let Some(job) = job_of(&self.jobs, &nspace)
                    && let Some(s) = self.jobs.get_mut(&job)
                {
                    s.state.pmix_finalized(rank);
                }
                done.complete();
            }
            PmixEvent::Abort {
                nspace,
                rank,
                status,
                message,
                done,
            } => {
                if let Some(job) = job_of(&self.jobs, &nspace) {
                    let effects = self
                        .jobs
                        .get_mut(&job)
                        .map(|s| s.state.pmix_abort(rank, status, message))
                        .unwrap_or_default();
                    self.apply(job, effects);
                }
                done.complete();
            }
            PmixEvent::Fence { nspace, data, done } => {
                let Some(s) = job_of(&self.jobs, &nspace).and_then(|j| self.jobs.get_mut(&j))
                else {
                    done.complete(Err(format!("no job {nspace} here")));
                    return;
                };
                let job = s.state.facts.job;
                let node = s.state.facts.node;
                let effects = s.state.pmix_fence(node, BASE64.encode(&data));
                if let Some(earlier) = s.pmix_fence.replace(done) {
                    earlier.complete(Err("a later fence replaced it".into()));
                }
                self.apply(job, effects);
            }
            PmixEvent::Started { tx } => self.helper = Some(tx),
            PmixEvent::DirectModex { nspace, rank, done } => {
                let Some(job) = job_of(&self.jobs, &nspace) else {
                    done.complete(Err(format!("no job {nspace} here")));
                    return;
                };
                let effects = self
                    .jobs
                    .get_mut(&job)
                    .map(|s| s.exchange.want(rank, done))
                    .unwrap_or_default();
                self.apply_exchange(job, effects);
            }
            PmixEvent::ModexData {
                nspace,
                rank,
                result,
            } => {
                if let Some(job) = job_of(&self.jobs, &nspace) {
                    let effects = self
                        .jobs
                        .get_mut(&job)
                        .map(|s| s.exchange.fetched(rank, result))
                        .unwrap_or_default();
                    self.apply_exchange(job, effects);
                }
            }
            PmixEvent::FenceTooLarge {
                nspace,
                bytes,
                done,
            } => {
                let why = format!("{bytes} bytes of this node's PMIx data to one fence");
                if let Some(job) = job_of(&self.jobs, &nspace) {
                    let effects = self
                        .jobs
                        .get_mut(&job)
                        .map(|s| s.state.pmix_fence_too_large(bytes))
                        .unwrap_or_default();
                    self.apply(job, effects);
                }
                done.complete(Err(why));
            }
        }
    }

    /// Notes that rank `rank` of `job` spoke to the server.
    fn contacted(&self, job: JobId, rank: u32) {
        if let Ok(mut seen) = self.contacts.lock() {
            seen.entry(job).or_default().insert(rank);
        }
    }

    fn read_from(&mut self, job: JobId, rank: u32) {
        let Some(s) = self.jobs.get_mut(&job) else {
            return;
        };
        let Some(c) = s.conns.get_mut(&rank) else {
            return;
        };
        let mut buf = [0u8; 16 * 1024];
        let effects = match c.stream.read(&mut buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                return;
            }
            Ok(0) | Err(_) => {
                s.conns.remove(&rank);
                s.state.closed(rank)
            }
            Ok(n) => {
                if let Ok(mut seen) = self.contacts.lock() {
                    seen.entry(job).or_default().insert(rank);
                }
                c.framer.push(&buf[..n]);
                let mut effects = Vec::new();
                loop {
                    match c.framer.next_request() {
                        Ok(Some(req)) => effects.extend(s.state.handle(rank, &req)),
                        Ok(None) => break,
                        Err(e) => {
                            effects.extend(s.state.malformed(rank, e.to_string()));
                            break;
                        }
                    }
                }
                effects
            }
        };
        self.apply(job, effects);
    }

    fn apply(&mut self, job: JobId, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Reply(rank, bytes) => {
                    if let Some(c) = self.jobs.get_mut(&job).and_then(|s| s.conns.get_mut(&rank)) {
                        c.unread.extend(&bytes);
                    }
                    self.flush_to(job, rank);
                }
                Effect::Contribute { epoch, pairs } => {
                    self.send_up(job, PmiUp::Fence { job, epoch, pairs })
                }
                Effect::Abort {
                    rank,
                    code,
                    message,
                } => {
                    tracing::warn!(node = self.node, job, rank, ?code, "PMI: {message}");
                    self.send_up(
                        job,
                        PmiUp::Abort {
                            job,
                            rank,
                            code,
                            message,
                        },
                    )
                }
                Effect::Close(rank) => {
                    if let Some(s) = self.jobs.get_mut(&job) {
                        s.conns.remove(&rank);
                    }
                }
            }
        }
    }

    /// Writes what task `rank` of `job` takes now of its answers. A task whose socket broke
    /// loses its connection; one that leaves more than [`MAX_UNREAD`] bytes unread ends its
    /// job (the server serves everyone else meanwhile).
    fn flush_to(&mut self, job: JobId, rank: u32) {
        let Some(c) = self.jobs.get_mut(&job).and_then(|s| s.conns.get_mut(&rank)) else {
            return;
        };
        if let Err(e) = c.flush() {
            // A closed socket: nobody takes these answers, and reading it tells the job.
            tracing::debug!(node = self.node, job, rank, "PMI: the task's socket: {e}");
            c.unread.clear();
            return;
        }
        let unread = c.unread.len();
        if unread <= MAX_UNREAD {
            return;
        }
        let message = format!(
            "rank {rank} sends PMI requests and does not read the answers ({unread} bytes \
             unread, more than the {MAX_UNREAD} a task may leave)"
        );
        if let Some(s) = self.jobs.get_mut(&job) {
            s.conns.remove(&rank);
        }
        tracing::warn!(
            node = self.node,
            job,
            rank,
            "PMI: {message}; ending the job"
        );
        self.send_up(
            job,
            PmiUp::Abort {
                job,
                rank,
                code: None,
                message,
            },
        );
    }

    /// Writes this node's message for `job` into its area at the MM.
    fn send_up(&mut self, job: JobId, msg: PmiUp) {
        let Some(slot) = self.jobs.get(&job).map(|s| s.slot) else {
            return;
        };
        let limit = self.rm.pmi_node_bytes;
        let bytes = match encode_sealed("PMI message", &msg, limit) {
            Ok(b) => b,
            Err(e) => {
                let abort = PmiUp::Abort {
                    job,
                    rank: 0,
                    code: None,
                    message: format!(
                        "node {}'s MPI puts for one fence are too large ({e}; raise [cluster] pmi_node_bytes)",
                        self.node
                    ),
                };
                match encode_sealed("PMI message", &abort, limit) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::error!(node = self.node, job, "PMI: no room for an abort: {e}");
                        return;
                    }
                }
            }
        };
        let offset = self.rm.pmi_up_offset(slot, self.node as usize);
        self.write_to_mm(job, offset, bytes);
    }

    /// Writes `bytes` at `offset` of the MM's memory (one of this node's areas there),
    /// raising `pmi_up_event`.
    fn write_to_mm(&self, job: JobId, offset: u64, bytes: Vec<u8>) {
        let mm = NodeSet::single(self.mm);
        let sent = self
            .prims
            .xfer_and_signal(
                &mm,
                offset,
                Bytes::from(bytes),
                Some(self.rm.pmi_up_event),
                Some(self.rm.pmi_up_sent),
            )
            .and_then(|()| {
                self.prims
                    .test_event(self.rm.pmi_up_sent, Wait::Timeout(self.op_timeout))
            });
        match sent {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                node = self.node,
                job,
                "PMI: the MM did not confirm in time; sent again at the next membership"
            ),
            Err(e) => tracing::warn!(
                node = self.node,
                job,
                "PMI: cannot reach the MM ({e}); sent again at the next membership"
            ),
        }
    }
}
