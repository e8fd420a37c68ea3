//! The machine manager's loop. It acts only at heartbeat boundaries: every timeslice it
//!
//! 1. takes the requests that arrived on the control socket;
//! 2. until every NM is up, checks their readiness with COMPARE-AND-WRITE;
//! 3. follows program transfers (Algorithm 6 runs in worker threads; the MM checks each
//!    node's acknowledgement with COMPARE-AND-WRITE);
//! 4. starts queued jobs that fit (FCFS, buddy allocation);
//! 5. escalates cancellations from SIGTERM to SIGKILL;
//! 6. issues the heartbeat with the commands due (Algorithm 4);
//! 7. forwards the tasks' output to storm-submit;
//! 8. detects terminations (Algorithm 8) and tells storm-submit how its job ended.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};
use storm_cluster::control::{JobInfo, JobOutcome, JobRequest, NodeInfo, Reply, Request, Timing};
use storm_cluster::endpoint::{self, Listen};
use storm_cluster::messages::{
    Command, FileInfo, Heartbeat, JobId, LaunchSpec, NodeReport, OutputChunk, Program, decode,
    encode,
};
use storm_cluster::tasks::TaskPlan;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::helpers::{QueueConsumer, QueueProducer};
use storm_primitives::{NodeId, NodeSet, Primitives, Relation, Wait};

use crate::buddy::Buddy;
use crate::control_server::{self, ClientId, Incoming};
use crate::fcfs::Fcfs;
use crate::transfer::{self, Transfer, TransferDone};

/// How to start a machine manager.
pub struct MmOptions {
    pub config: ClusterConfig,
    pub listen: Listen,
    /// Set to stop the MM (signal handlers set it).
    pub stop: Arc<AtomicBool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    /// A worker is sending the program.
    Sending {
        transfer: u32,
        worker: usize,
    },
    /// Sent; waiting for every node's acknowledgement.
    Verifying {
        transfer: u32,
    },
    /// The launch command is waiting for the next heartbeat.
    Launching,
    Running,
}

struct Cancel {
    reason: String,
    since: Instant,
    killed: bool,
}

struct Job {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest,
    plan: TaskPlan,
    program: Option<File>,
    size: u64,
    client: Option<ClientId>,
    phase: Phase,
    nodes: NodeSet,
    slot: Option<usize>,
    submitted: Instant,
    allocated: Option<Instant>,
    ready: Option<Instant>,
    launched: Option<Instant>,
    cancel: Option<Cancel>,
    worker_cancel: Option<Arc<AtomicBool>>,
    terminating: bool,
}

struct Client {
    uid: u32,
    gid: u32,
    tx: Sender<Reply>,
}

pub struct MachineManager {
    cfg: ClusterConfig,
    rm: RmLayout,
    prims: Arc<dyn Primitives>,
    all: NodeSet,
    incoming: Receiver<Incoming>,
    clients: HashMap<ClientId, Client>,
    jobs: BTreeMap<JobId, Job>,
    next_job: JobId,
    fcfs: Fcfs,
    buddy: Buddy,
    up: Vec<bool>,
    next_probe: Instant,
    heartbeats: QueueProducer,
    hb_seq: u64,
    hb_outstanding: u64,
    commands: VecDeque<Command>,
    outputs: Vec<QueueConsumer>,
    slots: Vec<Option<JobId>>,
    workers: Vec<Option<JobId>>,
    next_transfer: u32,
    worker_tx: Sender<TransferDone>,
    worker_rx: Receiver<TransferDone>,
    shutting_down: bool,
    stop: Arc<AtomicBool>,
}

impl MachineManager {
    pub fn start(opts: MmOptions) -> Result<Self> {
        let MmOptions {
            config: cfg,
            listen,
            stop,
        } = opts;
        let rm = RmLayout::new(&cfg)?;
        let prims = endpoint::start(&cfg, &rm, cfg.mm_id(), listen).map_err(anyhow::Error::msg)?;
        let all = NodeSet::first_n(cfg.node_count());
        let outputs = (0..cfg.node_count() as usize)
            .map(|i| QueueConsumer::new(&*prims, rm.output[i], 1))
            .collect::<Result<Vec<_>, _>>()?;
        let (tx, incoming) = crossbeam_channel::unbounded();
        control_server::start(
            &cfg.cluster.control_socket,
            cfg.cluster.name.clone(),
            cfg.node_count(),
            tx,
        )?;
        let (worker_tx, worker_rx) = crossbeam_channel::unbounded();
        let op_timeout = Duration::from_millis(cfg.tcp.op_timeout_ms);
        tracing::info!(
            cluster = %cfg.cluster.name,
            nodes = cfg.node_count(),
            socket = %cfg.cluster.control_socket.display(),
            timeslice = ?cfg.timeslice(),
            "machine manager started"
        );
        Ok(Self {
            heartbeats: QueueProducer::new(rm.heartbeat, all.clone(), 1)
                .with_space_timeout(op_timeout),
            buddy: Buddy::new(cfg.node_count()),
            up: vec![false; cfg.node_count() as usize],
            slots: vec![None; cfg.cluster.max_jobs],
            workers: vec![None; cfg.cluster.max_transfers],
            next_probe: Instant::now(),
            incoming,
            clients: HashMap::new(),
            jobs: BTreeMap::new(),
            next_job: 1,
            fcfs: Fcfs::default(),
            hb_seq: 0,
            hb_outstanding: 0,
            commands: VecDeque::new(),
            next_transfer: 1,
            worker_tx,
            worker_rx,
            shutting_down: false,
            outputs,
            all,
            rm,
            prims,
            cfg,
            stop,
        })
    }

    fn all_up(&self) -> bool {
        self.up.iter().all(|&u| u)
    }

    /// Runs until a shutdown request or a signal.
    pub fn run(mut self) -> Result<()> {
        let slice = self.cfg.timeslice();
        let mut next = Instant::now();
        loop {
            self.tick();
            if self.stop.load(Ordering::Acquire) {
                tracing::info!("stopping on a signal");
                break;
            }
            if self.shutting_down && self.commands.is_empty() {
                self.wait_heartbeats(Duration::from_millis(self.cfg.tcp.op_timeout_ms));
                tracing::info!("shut down");
                break;
            }
            next += slice;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
        let _ = std::fs::remove_file(&self.cfg.cluster.control_socket);
        Ok(())
    }

    fn tick(&mut self) {
        while let Ok(msg) = self.incoming.try_recv() {
            self.handle(msg);
        }
        if !self.all_up() {
            self.probe_nodes();
        }
        while let Ok(done) = self.worker_rx.try_recv() {
            self.transfer_done(done);
        }
        self.verify_transfers();
        if self.all_up() && !self.shutting_down {
            self.schedule();
        }
        self.escalate_cancels();
        if self.all_up() {
            self.issue_heartbeat();
        }
        self.forward_output(&self.all.clone());
        self.detect_terminations();
    }

    // ---------------------------------------------------------------- control requests

    fn reply(&self, client: ClientId, r: Reply) {
        if let Some(c) = self.clients.get(&client) {
            let _ = c.tx.send(r);
        }
    }

    fn handle(&mut self, msg: Incoming) {
        match msg {
            Incoming::Connected {
                client,
                uid,
                gid,
                tx,
            } => {
                self.clients.insert(client, Client { uid, gid, tx });
            }
            Incoming::Gone { client } => {
                self.clients.remove(&client);
                let orphans: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.client == Some(client))
                    .map(|j| j.id)
                    .collect();
                for job in orphans {
                    self.cancel(job, "storm-submit went away".into());
                }
            }
            Incoming::Request { client, req, fds } => self.request(client, req, fds),
        }
    }

    fn request(&mut self, client: ClientId, req: Request, fds: Vec<OwnedFd>) {
        let Some(uid) = self.clients.get(&client).map(|c| c.uid) else {
            return;
        };
        match req {
            Request::Hello { .. } => self.reply(client, Reply::Error("already connected".into())),
            Request::Submit(job) => match self.submit(client, job, fds) {
                Ok((id, queued)) => self.reply(client, Reply::Accepted { job: id, queued }),
                Err(e) => self.reply(client, Reply::Error(e)),
            },
            Request::Cancel { job } => {
                let reply = match self.jobs.get(&job) {
                    None => Reply::Error(format!("no job {job} (it may have finished already)")),
                    Some(j) if uid != 0 && uid != j.uid => Reply::Error(format!(
                        "job {job} belongs to uid {}; only its owner or root may cancel it",
                        j.uid
                    )),
                    Some(_) => {
                        self.cancel(job, format!("cancelled by uid {uid}"));
                        Reply::Done
                    }
                };
                self.reply(client, reply);
            }
            Request::Queue => {
                let list = self.jobs.values().map(|j| self.job_info(j)).collect();
                self.reply(client, Reply::Queue(list));
            }
            Request::Nodes => {
                let list = self.node_infos();
                self.reply(client, Reply::Nodes(list));
            }
            Request::Shutdown => {
                let me = nix::unistd::geteuid().as_raw();
                if uid != 0 && uid != me {
                    self.reply(
                        client,
                        Reply::Error(
                            "only root or the MM's own user may shut the cluster down".into(),
                        ),
                    );
                    return;
                }
                for job in self.jobs.keys().copied().collect::<Vec<_>>() {
                    self.cancel(job, "the cluster is shutting down".into());
                }
                self.commands.push_back(Command::Shutdown);
                self.shutting_down = true;
                self.reply(client, Reply::Done);
            }
        }
    }

    fn submit(
        &mut self,
        client: ClientId,
        req: JobRequest,
        mut fds: Vec<OwnedFd>,
    ) -> Result<(JobId, Option<String>), String> {
        if self.shutting_down {
            return Err("the cluster is shutting down".into());
        }
        let (uid, gid) = self
            .clients
            .get(&client)
            .map(|c| (c.uid, c.gid))
            .ok_or("unknown client")?;
        let cpus = self.cfg.nodes.iter().map(|n| n.cpus).min().unwrap_or(1);
        let plan = req
            .tasks
            .plan(cpus, self.cfg.cluster.max_tasks_per_node as u32)?;
        if plan.nodes > self.cfg.node_count() {
            return Err(format!(
                "the job asks for {} nodes but cluster {:?} has {}",
                plan.nodes,
                self.cfg.cluster.name,
                self.cfg.node_count()
            ));
        }
        if !req.cwd.is_absolute() || !req.program.is_absolute() {
            return Err("program and working directory must be absolute paths".into());
        }
        let (program, size) = if req.bcast {
            let fd = fds
                .pop()
                .ok_or("the program's descriptor did not arrive with the request")?;
            let file = File::from(fd);
            let meta = file
                .metadata()
                .map_err(|e| format!("cannot inspect the program: {e}"))?;
            if !meta.is_file() {
                return Err(format!("{} is not a regular file", req.program.display()));
            }
            if meta.permissions().mode() & 0o111 == 0 {
                return Err(format!("{} is not executable", req.program.display()));
            }
            (Some(file), meta.len())
        } else {
            (None, 0)
        };
        let id = self.next_job;
        self.next_job += 1;
        let launch_probe = launch_spec(
            id,
            0,
            &req,
            &plan,
            &NodeSet::first_n(plan.nodes),
            (uid, gid),
        );
        let limit = self.cfg.cluster.heartbeat_bytes - 256;
        if let Err(e) = encode("launch", &Command::Launch(launch_probe), limit) {
            return Err(format!(
                "the job description is too large for a heartbeat ({e}); export fewer variables"
            ));
        }
        self.jobs.insert(
            id,
            Job {
                id,
                uid,
                gid,
                plan,
                program,
                size,
                client: Some(client),
                phase: Phase::Queued,
                nodes: NodeSet::new(),
                slot: None,
                submitted: Instant::now(),
                allocated: None,
                ready: None,
                launched: None,
                cancel: None,
                worker_cancel: None,
                terminating: false,
                req,
            },
        );
        self.fcfs.push(id, plan.nodes);
        tracing::info!(
            job = id,
            uid,
            nodes = plan.nodes,
            tasks = plan.ntasks,
            "job accepted"
        );
        let queued = self.wait_reason(id);
        Ok((id, queued))
    }

    /// Why a queued job cannot start right now, if it cannot.
    fn wait_reason(&self, job: JobId) -> Option<String> {
        if !self.all_up() {
            let up = self.up.iter().filter(|&&u| u).count();
            return Some(format!(
                "waiting for the node managers to come up ({up} of {} up)",
                self.up.len()
            ));
        }
        if self.slots.iter().all(Option::is_some) {
            return Some(format!(
                "waiting: {} jobs already run (max_jobs)",
                self.slots.len()
            ));
        }
        let reason = self.fcfs.reason(job, &self.buddy)?;
        let head_fits = self
            .fcfs
            .head_fits(&self.buddy)
            .is_some_and(|(j, _)| j == job);
        (!head_fits).then_some(reason)
    }

    fn job_info(&self, j: &Job) -> JobInfo {
        let state = match (&j.cancel, j.phase) {
            (Some(_), Phase::Queued) => "cancelling",
            (Some(_), _) => "cancelling",
            (None, Phase::Queued) => "queued",
            (None, Phase::Sending { .. } | Phase::Verifying { .. }) => "sending",
            (None, Phase::Launching) => "launching",
            (None, Phase::Running) if j.terminating => "ending",
            (None, Phase::Running) => "running",
        };
        JobInfo {
            job: j.id,
            name: j.req.name.clone(),
            uid: j.uid,
            state: state.into(),
            nodes: j.nodes.clone(),
            ntasks: j.plan.ntasks,
            elapsed_ms: j.submitted.elapsed().as_millis() as u64,
            reason: (j.phase == Phase::Queued)
                .then(|| self.wait_reason(j.id))
                .flatten(),
        }
    }

    fn node_infos(&self) -> Vec<NodeInfo> {
        let free = self.buddy.free_set();
        self.cfg
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = i as NodeId;
                let jobs: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.nodes.contains(id))
                    .map(|j| j.id)
                    .collect();
                let state = if !self.up[i] {
                    "unknown"
                } else if free.contains(id) {
                    "idle"
                } else {
                    "allocated"
                };
                NodeInfo {
                    id,
                    name: n.name.clone(),
                    state: state.into(),
                    jobs,
                }
            })
            .collect()
    }

    // ---------------------------------------------------------------- nodes and scheduling

    fn probe_nodes(&mut self) {
        if Instant::now() < self.next_probe {
            return;
        }
        self.next_probe = Instant::now() + Duration::from_millis(50);
        for i in 0..self.up.len() {
            if self.up[i] {
                continue;
            }
            let one = NodeSet::single(i as NodeId);
            if let Ok(true) =
                self.prims
                    .compare_and_write(&one, self.rm.nm_ready, Relation::Ne, 0, None)
            {
                self.up[i] = true;
                tracing::info!(node = i, name = %self.cfg.nodes[i].name, "node manager is up");
            }
        }
        if self.all_up() {
            tracing::info!("all {} node managers are up", self.up.len());
        }
    }

    fn schedule(&mut self) {
        loop {
            let Some(slot) = self.slots.iter().position(Option::is_none) else {
                return;
            };
            let Some((job, _)) = self.fcfs.head_fits(&self.buddy) else {
                return;
            };
            let bcast = self.jobs[&job].program.is_some();
            let worker = self.workers.iter().position(Option::is_none);
            if bcast && worker.is_none() {
                return;
            }
            let Some((job, nodes)) = self.fcfs.start_head(&mut self.buddy) else {
                return;
            };
            self.slots[slot] = Some(job);
            self.start_job(job, nodes, slot, worker);
        }
    }

    fn start_job(&mut self, id: JobId, nodes: NodeSet, slot: usize, worker: Option<usize>) {
        let names: Vec<String> = nodes
            .iter()
            .map(|n| self.cfg.nodes[n as usize].name.clone())
            .collect();
        let op_timeout = Duration::from_millis(self.cfg.tcp.op_timeout_ms);
        let transfer = self.next_transfer;
        let j = self.jobs.get_mut(&id).expect("job");
        j.nodes = nodes.clone();
        j.slot = Some(slot);
        j.allocated = Some(Instant::now());
        tracing::info!(job = id, nodes = %nodes, "job starts");
        let started = Reply::Started {
            job: id,
            nodes: nodes.clone(),
            node_names: names,
        };
        let client = j.client;
        match (j.program.as_ref(), worker) {
            (Some(file), Some(worker)) => {
                let file = match file.try_clone() {
                    Ok(f) => f,
                    Err(e) => {
                        self.fail(id, format!("cannot read the program: {e}"));
                        return;
                    }
                };
                self.next_transfer += 1;
                let name = j
                    .req
                    .program
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "program".into());
                let cancel = Arc::new(AtomicBool::new(false));
                j.worker_cancel = Some(cancel.clone());
                j.phase = Phase::Sending { transfer, worker };
                let info = FileInfo {
                    transfer,
                    job: id,
                    nodes: nodes.clone(),
                    size: j.size,
                    name,
                    uid: j.uid,
                    gid: j.gid,
                };
                let size = j.size;
                self.workers[worker] = Some(id);
                self.commands.push_back(Command::ReceiveFile(info));
                transfer::spawn(
                    self.prims.clone(),
                    &self.rm,
                    Transfer {
                        job: id,
                        transfer,
                        nodes,
                        file,
                        size,
                        event: self.rm.chunk_sent[worker],
                        cancel,
                        timeout: op_timeout * 6,
                    },
                    self.worker_tx.clone(),
                );
            }
            _ => {
                j.ready = Some(Instant::now());
                self.queue_launch(id);
            }
        }
        if let Some(c) = client {
            self.reply(c, started);
        }
    }

    fn queue_launch(&mut self, id: JobId) {
        let j = &self.jobs[&id];
        let spec = launch_spec(
            id,
            j.slot.expect("slot"),
            &j.req,
            &j.plan,
            &j.nodes,
            (j.uid, j.gid),
        );
        self.commands.push_back(Command::Launch(spec));
        self.jobs.get_mut(&id).expect("job").phase = Phase::Launching;
    }

    // ---------------------------------------------------------------- program transfer

    fn transfer_done(&mut self, done: TransferDone) {
        let Some(j) = self.jobs.get_mut(&done.job) else {
            return;
        };
        let Phase::Sending { transfer, worker } = j.phase else {
            return;
        };
        self.workers[worker] = None;
        match done.result {
            Ok(()) => j.phase = Phase::Verifying { transfer },
            Err(e) => {
                let reason = j
                    .cancel
                    .as_ref()
                    .map(|c| c.reason.clone())
                    .unwrap_or(format!("program transfer failed: {e}"));
                self.fail(done.job, reason);
            }
        }
    }

    fn verify_transfers(&mut self) {
        let verifying: Vec<(JobId, u32, NodeSet)> = self
            .jobs
            .values()
            .filter_map(|j| match j.phase {
                Phase::Verifying { transfer } => Some((j.id, transfer, j.nodes.clone())),
                _ => None,
            })
            .collect();
        for (id, transfer, nodes) in verifying {
            let good = 2 * transfer as u64 + 1;
            let ack = self.rm.file_ack;
            let answered =
                match self
                    .prims
                    .compare_and_write(&nodes, ack, Relation::Ge, good - 1, None)
                {
                    Ok(a) => a,
                    Err(e) => {
                        self.fail(id, format!("cannot check the program on the nodes: {e}"));
                        continue;
                    }
                };
            if !answered {
                continue;
            }
            // Every node has answered; find those that did not verify the program.
            let bad: NodeSet = nodes
                .iter()
                .filter(|&n| {
                    let one = NodeSet::single(n);
                    !matches!(
                        self.prims
                            .compare_and_write(&one, ack, Relation::Eq, good, None),
                        Ok(true)
                    )
                })
                .collect();
            if bad.is_empty() {
                self.jobs.get_mut(&id).expect("job").ready = Some(Instant::now());
                self.queue_launch(id);
            } else {
                self.fail(
                    id,
                    format!("the program did not arrive intact on nodes {bad}"),
                );
            }
        }
    }

    // ---------------------------------------------------------------- cancellation

    fn cancel(&mut self, id: JobId, reason: String) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if j.cancel.is_some() {
            return;
        }
        tracing::info!(job = id, "{reason}");
        match j.phase {
            Phase::Queued => {
                self.fcfs.remove(id);
                self.finish(id, Some(format!("{reason} before it started")), Vec::new());
            }
            Phase::Sending { .. } | Phase::Verifying { .. } => {
                if let Some(c) = &j.worker_cancel {
                    c.store(true, Ordering::Release);
                }
                j.cancel = Some(Cancel {
                    reason: reason.clone(),
                    since: Instant::now(),
                    killed: true,
                });
                if matches!(j.phase, Phase::Verifying { .. }) {
                    self.fail(id, format!("{reason} during program transfer"));
                }
            }
            Phase::Launching | Phase::Running => {
                j.cancel = Some(Cancel {
                    reason,
                    since: Instant::now(),
                    killed: false,
                });
                self.commands.push_back(Command::Signal {
                    job: id,
                    signal: libc::SIGTERM,
                });
            }
        }
    }

    fn escalate_cancels(&mut self) {
        let wait = Duration::from_millis(self.cfg.cluster.kill_wait_ms);
        let mut kill = Vec::new();
        for j in self.jobs.values_mut() {
            if let Some(c) = &mut j.cancel
                && !c.killed
                && c.since.elapsed() >= wait
            {
                c.killed = true;
                kill.push(j.id);
            }
        }
        for job in kill {
            self.commands.push_back(Command::Signal {
                job,
                signal: libc::SIGKILL,
            });
        }
    }

    // ---------------------------------------------------------------- heartbeat

    fn issue_heartbeat(&mut self) {
        while self.hb_outstanding > 0 {
            match self.prims.test_event(self.rm.hb_sent, Wait::Poll) {
                Ok(true) => self.hb_outstanding -= 1,
                Ok(false) => break,
                Err(e) => {
                    self.hb_outstanding -= 1;
                    tracing::error!("a heartbeat did not reach every node: {e}");
                }
            }
        }
        let limit = self.cfg.cluster.heartbeat_bytes;
        let mut hb = Heartbeat {
            seq: self.hb_seq,
            commands: Vec::new(),
        };
        let mut taken = 0;
        for cmd in &self.commands {
            hb.commands.push(cmd.clone());
            if encode("heartbeat", &hb, limit).is_err() {
                hb.commands.pop();
                break;
            }
            taken += 1;
        }
        let bytes = match encode("heartbeat", &hb, limit) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("cannot encode a heartbeat: {e}");
                return;
            }
        };
        match self
            .heartbeats
            .enqueue(&*self.prims, &bytes, Some(self.rm.hb_sent))
        {
            Ok(()) => {
                self.hb_seq += 1;
                self.hb_outstanding += 1;
                let sent: Vec<Command> = self.commands.drain(..taken).collect();
                let now = Instant::now();
                for cmd in sent {
                    if let Command::Launch(spec) = cmd
                        && let Some(j) = self.jobs.get_mut(&spec.job)
                    {
                        j.launched = Some(now);
                        j.phase = Phase::Running;
                    }
                }
            }
            Err(e) => tracing::error!("cannot issue the heartbeat: {e}"),
        }
    }

    fn wait_heartbeats(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.hb_outstanding > 0 && Instant::now() < deadline {
            match self
                .prims
                .test_event(self.rm.hb_sent, Wait::Timeout(deadline - Instant::now()))
            {
                Ok(true) | Err(_) => self.hb_outstanding -= 1,
                Ok(false) => break,
            }
        }
    }

    // ---------------------------------------------------------------- output and termination

    fn forward_output(&mut self, nodes: &NodeSet) {
        for n in nodes.iter() {
            loop {
                let entry = match self.outputs[n as usize].dequeue(&*self.prims, Wait::Poll) {
                    Ok(Some(e)) => e,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(node = n, "output queue: {e}");
                        break;
                    }
                };
                match decode::<OutputChunk>("output", &entry, self.cfg.cluster.output_bytes) {
                    Ok(chunk) => {
                        if let Some(c) = self.jobs.get(&chunk.job).and_then(|j| j.client) {
                            self.reply(c, Reply::Output(chunk));
                        }
                    }
                    Err(e) => tracing::error!(node = n, "{e}"),
                }
            }
        }
    }

    /// Algorithm 8.
    fn detect_terminations(&mut self) {
        let mut announced = false;
        while let Ok(true) = self.prims.test_event(self.rm.term_event, Wait::Poll) {
            announced = true;
        }
        if announced {
            let mem = self.prims.memory();
            for j in self.jobs.values_mut().filter(|j| j.phase == Phase::Running) {
                if let Some(slot) = j.slot
                    && mem.load(self.rm.term_hint.at(slot)) == j.id
                {
                    j.terminating = true;
                }
            }
        }
        let ending: Vec<(JobId, usize, NodeSet)> = self
            .jobs
            .values()
            .filter(|j| j.terminating)
            .map(|j| {
                (
                    j.id,
                    j.slot.expect("running jobs have a slot"),
                    j.nodes.clone(),
                )
            })
            .collect();
        for (id, slot, nodes) in ending {
            let flag = self.rm.terminated.at(slot);
            match self
                .prims
                .compare_and_write(&nodes, flag, Relation::Eq, id, Some((flag, 0)))
            {
                Ok(true) => self.job_ended(id, slot, &nodes),
                Ok(false) => {}
                Err(e) => tracing::warn!(job = id, "termination check failed: {e}"),
            }
        }
    }

    fn job_ended(&mut self, id: JobId, slot: usize, nodes: &NodeSet) {
        // Everything the tasks wrote was delivered before their nodes reported; forward it
        // before the outcome.
        self.forward_output(nodes);
        let ntasks = self.jobs[&id].plan.ntasks as usize;
        let mut ranks = vec![None; ntasks];
        for n in nodes.iter() {
            let offset = self.rm.report_offset(slot, n as usize);
            let bytes = self
                .prims
                .memory()
                .read_vec(offset, self.rm.report_bytes)
                .unwrap_or_default();
            match decode::<NodeReport>("report", &bytes, self.rm.report_bytes) {
                Ok(r) if r.job == id => {
                    for (rank, status) in r.statuses {
                        if let Some(slot) = ranks.get_mut(rank as usize) {
                            *slot = Some(status);
                        }
                    }
                }
                Ok(r) => tracing::error!(job = id, node = n, "report is for job {}", r.job),
                Err(e) => tracing::error!(job = id, node = n, "{e}"),
            }
        }
        self.prims.memory().store(self.rm.term_hint.at(slot), 0);
        let reason = self.jobs[&id].cancel.as_ref().map(|c| c.reason.clone());
        self.finish(id, reason, ranks);
    }

    /// Ends a job that failed before or while starting.
    fn fail(&mut self, id: JobId, reason: String) {
        tracing::warn!(job = id, "{reason}");
        self.finish(id, Some(reason), Vec::new());
    }

    /// Removes a job, frees what it held, and tells its submitter how it ended.
    fn finish(
        &mut self,
        id: JobId,
        reason: Option<String>,
        ranks: Vec<Option<storm_cluster::messages::RankStatus>>,
    ) {
        let Some(j) = self.jobs.remove(&id) else {
            return;
        };
        if let Some(slot) = j.slot {
            self.slots[slot] = None;
        }
        if let Phase::Sending { worker, .. } = j.phase {
            // The worker reports back and is forgotten; its slot frees when it does.
            if let Some(c) = &j.worker_cancel {
                c.store(true, Ordering::Release);
            }
            self.workers[worker] = None;
        }
        if !j.nodes.is_empty() {
            self.buddy.release(&j.nodes);
            self.commands.push_back(Command::Forget { job: id });
        }
        let now = Instant::now();
        let us = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) if b >= a => (b - a).as_micros() as u64,
            _ => 0,
        };
        let timing = Timing {
            queued_us: us(Some(j.submitted), j.allocated),
            send_us: us(j.allocated, j.ready),
            execute_us: us(j.launched, Some(now)),
            total_us: us(Some(j.submitted), Some(now)),
        };
        tracing::info!(job = id, ?timing, "job ended");
        if let Some(c) = j.client {
            self.reply(
                c,
                Reply::Finished(JobOutcome {
                    job: id,
                    ranks,
                    reason,
                    timing,
                }),
            );
        }
    }
}

/// The launch command of a job placed on `nodes`.
fn launch_spec(
    id: JobId,
    slot: usize,
    req: &JobRequest,
    plan: &TaskPlan,
    nodes: &NodeSet,
    (uid, gid): (u32, u32),
) -> LaunchSpec {
    let program = if req.bcast {
        Program::Spooled(
            req.program
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "program".into()),
        )
    } else {
        Program::Path(req.program.clone())
    };
    LaunchSpec {
        job: id,
        slot: slot as u32,
        nodes: nodes.clone(),
        ntasks: plan.ntasks,
        program,
        args: req.args.clone(),
        env: req.env.clone(),
        cwd: req.cwd.clone(),
        uid,
        gid,
        reporter: nodes.last().unwrap_or(0),
    }
}

impl std::fmt::Debug for MachineManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MachineManager({} jobs)", self.jobs.len())
    }
}

/// Runs a machine manager until it is told to stop.
pub fn run(opts: MmOptions) -> Result<()> {
    MachineManager::start(opts)
        .context("starting the machine manager")?
        .run()
}
