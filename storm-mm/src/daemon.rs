//! The `storm-mm` daemon: the machine manager's core ([`crate::MachineManager`]) in a
//! process, with everything that does I/O around it.
//!
//! [`start`] reads the keys, lays out global memory, opens the journal (its commits written
//! on a thread of the host's, `crate::committer`), starts the fabric endpoint and the control socket, and makes the
//! core over them. [`Daemon::run`] hosts the core until a shutdown request or a signal: a
//! timeslice at each [`crate::MachineManager::poll_timeout`]; between them it waits on the
//! fabric for the termination event, and hands the core what arrived as
//! [`Input`]s (requests, finished transfers and program copies, an announced termination).
//!
//! [`DaemonEnv`] is the core's environment here: the system clock; each client's reply
//! channel, written count and socket; each submitted program's descriptor; a thread per
//! program transfer, one that copies programs beside the journal, and one that writes the
//! journal's batches.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};
use storm_cluster::clock::{Clock, SystemClock};
use storm_cluster::control::{self, Reply};
use storm_cluster::endpoint::{self, Listen};
use storm_cluster::identity::Enrolled;
use storm_cluster::keywatch::{Due, KeyWatch};
use storm_cluster::messages::JobId;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::Primitives;

use crate::committer::Committer;
use crate::control_server::{self, Incoming};
use crate::env::{
    ClientId, Input, MmEnv, ProgramId, ProgramSource, SubmittedProgram, TransferDone, TransferSpec,
};
use crate::journal::{Batch, Journal, ProgramStore};
use crate::manager::{MachineManager, MmParts};
use crate::replica::Replica;
use crate::saver::Saver;
use crate::transfer::{self, Transfer};
use crate::waker::{self, Waker, Woken};

/// How to start a machine manager.
pub struct MmOptions {
    pub config: ClusterConfig,
    /// Which `[[manager]]` replica this is, in a replicated group (a name, or an index; by
    /// default the entry named as this host).
    pub manager: Option<String>,
    /// A replica on a new state directory asks the group to admit it (in the place of a
    /// removed one) instead of starting the group the cluster file names.
    pub join: bool,
    pub listen: Listen,
    /// Set to stop the MM (signal handlers set it).
    pub stop: Arc<AtomicBool>,
}

/// A started machine manager daemon.
pub struct Daemon {
    core: MachineManager<DaemonEnv>,
    incoming: Receiver<Incoming>,
    stop: Arc<AtomicBool>,
    keys: KeyWatch,
    /// The replica this MM leads the group as, in a replicated group.
    replica: Option<Arc<Replica>>,
    /// The group's term this core leads (0: a single MM).
    term: u64,
    /// The control socket, taking clients while this core runs.
    control: Option<control_server::ControlServer>,
}

/// Where the journal's commits go: a thread of this daemon's that writes them to disk, or
/// the manager group, which writes them on a majority of the replicas.
enum Commits {
    Disk(Committer),
    /// The group, as its leader of this term.
    Group(Arc<Replica>, u64),
}

impl Commits {
    fn send(&self, batch: Batch) {
        match self {
            Commits::Disk(c) => c.send(batch),
            Commits::Group(r, term) => r.send(*term, batch),
        }
    }

    fn settled(&self) -> Vec<crate::journal::Settled> {
        match self {
            Commits::Disk(c) => c.settled(),
            Commits::Group(r, _) => r.settled(),
        }
    }
}

/// Which replica of `cfg`'s group this daemon is: `given`, else the entry named as this host.
fn this_manager(cfg: &ClusterConfig, given: Option<&str>) -> Result<usize> {
    let name = match given {
        Some(n) => n.to_string(),
        None => nix::unistd::gethostname()
            .context("reading this host's name (or give --manager)")?
            .to_string_lossy()
            .into_owned(),
    };
    cfg.manager_by_name(&name).map_err(anyhow::Error::msg)
}

/// Where a core's journal commits go (see [`Commits`]), before the waker they need exists.
enum Writes {
    /// A single MM's own disk, through the journal's store.
    Disk(Box<dyn crate::journal::JournalStore>),
    /// The manager group, as leader of this term.
    Group(Arc<Replica>, u64),
}

/// How a daemon's run as the cluster's MM ended.
enum Ended {
    /// A shutdown request, or a signal.
    Stopped,
    /// This replica may no longer act as the MM (deposed, its lease lost, or it handed the
    /// group over); it has stepped down.
    Fenced,
}

/// The `storm-mm` daemon: starts a machine manager, tells the service manager it is ready
/// (control socket bound, endpoint up, journal restored), and hosts it until a shutdown
/// request or a signal.
///
/// A replica of a manager group follows the group until it leads, then hosts an MM core
/// over its journal as an MM restarted after a crash does. When it may no longer lead, it
/// drops that core (its endpoint, control socket, clients, transfers) and follows the group
/// again, as a follower: its replica, and with it the group's majority, stays up.
pub fn run(opts: MmOptions) -> Result<()> {
    let MmOptions {
        config: cfg,
        manager,
        join,
        listen,
        stop,
    } = opts;
    // A replica of a group sees the cluster with its own address, state and socket.
    let replica_index = match cfg.replicated() {
        true => Some(this_manager(&cfg, manager.as_deref())?),
        false if manager.is_some() => {
            anyhow::bail!("--manager: the cluster file has no [[manager]] entries (a single MM)")
        }
        false if join => {
            anyhow::bail!("--join: the cluster file has no [[manager]] entries (a single MM)")
        }
        false => None,
    };
    let cfg = match replica_index {
        Some(i) => cfg.as_manager(i),
        None => cfg,
    };
    // First: without its keys this daemon must not run at all.
    cfg.load_key().context("starting the machine manager")?;
    cfg.load_mm_signer()
        .context("starting the machine manager")?;
    let (journal, restored) =
        Journal::open(&cfg.cluster.state_dir).context("starting the machine manager")?;
    let programs = journal.program_store();
    let (journal, store) = journal.hand_off();
    let store = store.context("the journal's store was already handed off")?;
    let Some(index) = replica_index else {
        let daemon = assemble(
            &cfg,
            listen,
            &stop,
            (journal, restored),
            0,
            Writes::Disk(store),
        )
        .context("starting the machine manager")?;
        return daemon.run().map(|_| ());
    };
    // A replica waits, as a follower, until it leads the group; its journal then holds
    // every commit the group made, and it takes the cluster up from there as a restarted MM.
    let replica = Arc::new(
        Replica::start(&cfg, index, store, programs.clone(), join)
            .context("starting this manager's replica")?,
    );
    storm_cluster::daemon::notify_ready();
    let mut first = Some(journal);
    // The endpoint of the last term this replica led, until its threads let go of it.
    let mut last_endpoint: Option<std::sync::Weak<dyn Primitives>> = None;
    loop {
        let Some((term, restored)) = replica.wait_to_lead(&stop)? else {
            tracing::info!("stopping on a signal (a follower)");
            return Ok(());
        };
        // Each term's core starts from a journal front of its own; the store is the
        // replica's throughout.
        let journal = first
            .take()
            .unwrap_or_else(|| Journal::handed_off(programs.clone()));
        let assembled = assemble(
            &cfg,
            listen.again().map_err(anyhow::Error::msg)?,
            &stop,
            (journal, restored),
            term,
            Writes::Group(replica.clone(), term),
        )
        .context("starting the machine manager");
        let daemon = match (assembled, &last_endpoint) {
            (Ok(d), _) => d,
            // Its first term: what stops it (a cluster file it cannot act on) will again.
            (Err(e), None) => return Err(e),
            // Elected again before the last term's threads let go of its endpoint (a
            // leader deposed under load, re-elected within seconds): this replica hands the
            // term back and follows, rather than leave the group one replica short.
            (Err(e), Some(held)) => {
                tracing::error!(
                    term,
                    "cannot act as the cluster's MM in this term: {e:#}; handing the term back \
                     and following the group"
                );
                // To the most up-to-date replica it hears, so that the group need not wait
                // an election timeout (and may not elect this one again at once).
                let how = replica.hand_over(term, "elected, but cannot act as the cluster's MM");
                tracing::warn!(term, "{how}");
                replica.step_down(term);
                wait_released(held);
                continue;
            }
        };
        let fabric = Arc::downgrade(daemon.core.fabric().0);
        match daemon.run()? {
            Ended::Stopped => return Ok(()),
            Ended::Fenced => wait_released(&fabric),
        }
        last_endpoint = Some(fabric);
    }
}

/// Waits (a few seconds at most) until the last of a stopped core's threads has let go of its
/// endpoint, whose address the next term's endpoint binds again.
fn wait_released(fabric: &std::sync::Weak<dyn Primitives>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while fabric.strong_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if fabric.strong_count() > 0 {
        tracing::warn!("the stopped MM's endpoint is still held; the next term may not bind it");
    }
}

/// Makes the MM core, not yet running, and everything it does I/O through: its endpoint
/// among the nodes (from `listen`), its control socket, and where its journal commits go.
/// `term` is the group's term it leads (0: a single MM).
fn assemble(
    cfg: &ClusterConfig,
    listen: Listen,
    stop: &Arc<AtomicBool>,
    (journal, restored): (Journal, crate::journal::Restored),
    term: u64,
    writes: Writes,
) -> Result<Daemon> {
    let key = cfg.load_key()?;
    let signer = cfg.load_mm_signer()?;
    // Every node must prove which it is: its key is enrolled here.
    let enrolled = Arc::new(parking_lot::RwLock::new(
        cfg.load_enrolled().map_err(anyhow::Error::msg)?,
    ));
    let rm = RmLayout::new(cfg)?;
    tracing::info!(
        mm_mib = rm.layout.size_at(cfg.mm_id()) >> 20,
        nm_mib = rm.layout.size_at(0) >> 20,
        nodes = cfg.node_count(),
        "global memory laid out (address space; untouched pages take no memory)"
    );
    let programs = journal.program_store();
    let fabric = endpoint::start(
        cfg,
        &rm,
        cfg.mm_id(),
        listen,
        key,
        endpoint::LinkIdentity::Manager(enrolled.clone()),
    )
    .map_err(anyhow::Error::msg)?;
    let waker = Waker::new(fabric.clone(), rm.term_event);
    // The disk's fsync stays off the MM's loop; replies wait for their commit instead.
    let commits = match writes {
        Writes::Group(r, term) => {
            r.set_waker(waker.clone());
            Commits::Group(r, term)
        }
        Writes::Disk(store) => Commits::Disk(
            Committer::start(store, programs.clone(), waker.clone())
                .context("starting the journal's thread")?,
        ),
    };
    let (tx, incoming) = crossbeam_channel::unbounded();
    let control = control_server::start(
        &cfg.cluster.control_socket,
        cfg.cluster.name.clone(),
        cfg.node_count(),
        cfg.limits.clone(),
        control_server::RelayedUsers::of(cfg),
        tx,
        waker.clone(),
    )?;
    let keys = KeyWatch::new(
        vec![
            (storm_cluster::key::CLUSTER_KEY, cfg.key_path()),
            (storm_cluster::key::MM_KEY, cfg.mm_key_paths().0),
        ],
        Duration::from_secs(cfg.security.key_check_interval_s),
    )?;
    let replica = match &commits {
        Commits::Group(r, _) => Some(r.clone()),
        Commits::Disk(_) => None,
    };
    let env = DaemonEnv::new(
        fabric.clone(),
        waker,
        programs,
        commits,
        enrolled,
        (
            peer_accounts(cfg),
            cfg.peers
                .iter()
                .filter_map(|p| Some((p.name.clone(), p.mm_public_key_file.clone()?)))
                .collect(),
        ),
    );
    let parts = MmParts {
        config: cfg.clone(),
        rm,
        fabric,
        journal,
        restored,
        incarnation: incarnation(term),
        signer,
    };
    Ok(Daemon {
        core: MachineManager::new(parts, env)?,
        incoming,
        stop: stop.clone(),
        keys,
        replica,
        term,
        control: Some(control),
    })
}

impl Daemon {
    /// Hosts the core until a shutdown request or a signal (see the module's overview), or,
    /// for a replica, until it may no longer lead.
    fn run(mut self) -> Result<Ended> {
        storm_cluster::daemon::notify_ready();
        let mut fenced = None;
        loop {
            if self.keys.poll(Instant::now()) == Due::Reload {
                self.reload_keys();
            }
            // A replica that may no longer lead sends nothing more to anyone.
            if let Some(why) = self.replica.as_ref().and_then(|r| r.fenced()) {
                fenced = Some(why);
                break;
            }
            // A leader that hears the replicas but not its nodes lets one that may reach them
            // lead, before it marks any node DOWN (the core says when).
            if let Some(replica) = &self.replica {
                if let Some(cut) = self.core.hand_over_due() {
                    fenced = Some(
                        replica.hand_over(self.term, &format!("cut off from its nodes: {cut}")),
                    );
                    break;
                }
            }
            self.hand_over_arrivals();
            if Instant::now() >= self.core.poll_timeout() {
                let started = Instant::now();
                self.core.tick();
                // The real time the timeslice took, whatever clock decisions use.
                self.core.tick_took(started.elapsed());
            } else {
                self.core.between_ticks();
            }
            if self.stop.load(Ordering::Acquire) {
                tracing::info!("stopping on a signal");
                break;
            }
            if self.core.is_done() {
                let linger = Duration::from_millis(self.core.config().tcp.op_timeout_ms);
                self.core.wait_heartbeats(linger);
                tracing::info!("shut down");
                break;
            }
            self.wait(self.core.poll_timeout());
        }
        // No more clients; those connected hear the connection close, and reconnect to
        // whichever MM leads.
        self.control.take();
        let (Some(why), Some(replica)) = (fenced, &self.replica) else {
            return Ok(Ended::Stopped);
        };
        tracing::warn!(
            "this replica no longer leads the manager group ({why}): it stops acting as the \
             cluster's MM and follows the group again"
        );
        // At once, before the core's threads are let go of: a Raft leader whose core
        // stopped must not hold the group up.
        replica.step_down(self.term);
        Ok(Ended::Fenced)
    }

    /// Hands the core, as inputs, what the control socket's threads, the transfer workers
    /// and the program saver brought since the last look.
    fn hand_over_arrivals(&mut self) {
        while let Ok(msg) = self.incoming.try_recv() {
            let input = self.core.env_mut().admit(msg);
            self.core.handle(input);
        }
        for input in self.core.env_mut().finished() {
            self.core.handle(input);
        }
    }

    /// Waits on the fabric until `until` (a timeslice is due), or until something arrives
    /// for the MM: a node announces a termination, or one of the MM's threads wakes it (see
    /// [`crate::waker`]).
    fn wait(&mut self, until: Instant) {
        let (fabric, rm) = self.core.fabric();
        if waker::wait_until(&**fabric, rm.term_event, until) == Woken::Signalled {
            self.core.handle(Input::TerminationSignalled);
        }
    }

    /// SIGHUP: reads the MM's signing key and the enrolled nodes' keys again (a key being
    /// rotated, docs/security.md). A file that does not read keeps the keys in use.
    fn reload_keys(&mut self) {
        let cfg = self.core.config();
        let signer = cfg.load_mm_signer();
        let enrolled = cfg.load_enrolled();
        match signer {
            Ok(signer) => {
                tracing::info!(
                    public_key = %storm_cluster::identity::public_hex(&signer.public()),
                    "read the MM's signing key again"
                );
                self.core.replace_signer(signer);
            }
            Err(e) => tracing::error!("keeping the MM's signing key in use: {e}"),
        }
        match enrolled {
            Ok(e) => {
                *self.core.env().enrolled.write() = e;
                tracing::info!("read the enrolled nodes' keys again");
            }
            Err(e) => tracing::error!("keeping the enrolled nodes' keys in use: {e}"),
        }
    }
}

/// A number that tells this MM process from any other that ran the cluster: the Raft term
/// it leads (0 for a single MM), its start time and pid (see
/// [`storm_cluster::messages::incarnation`]).
fn incarnation(term: u64) -> u64 {
    storm_cluster::messages::incarnation(term, crate::journal::now_ms(), std::process::id())
}

/// A control client's connection, as the daemon holds it.
struct ClientLink {
    tx: Sender<Reply>,
    /// Replies written to its socket so far (counted by its writer thread).
    written: Arc<AtomicU64>,
    /// The connection, to close when the client breaks a limit.
    closer: UnixStream,
}

/// A transfer worker at work: how to stop it, and how far it got.
struct Worker {
    cancel: Arc<AtomicBool>,
    delivered: Arc<AtomicU64>,
}

/// The environment of the `storm-mm` daemon (see the module's overview).
pub struct DaemonEnv {
    clock: SystemClock,
    fabric: Arc<dyn Primitives>,
    waker: Waker,
    /// The nodes' enrolled identity keys the MM's links check (read again on SIGHUP).
    enrolled: Arc<parking_lot::RwLock<Enrolled>>,
    clients: HashMap<ClientId, ClientLink>,
    programs: HashMap<ProgramId, File>,
    next_program: ProgramId,
    workers: HashMap<u32, Worker>,
    /// The hashes of programs checked before (whether they are in place on the nodes).
    hashes: storm_cluster::program_hash::HashCache,
    worker_tx: Sender<TransferDone>,
    worker_rx: Receiver<TransferDone>,
    /// Program copies beside the journal (`None`: a journal that keeps none).
    store: Option<ProgramStore>,
    saver: Saver,
    /// Writes the journal's batches (on a thread of its own, or through the manager group).
    commits: Commits,
    /// The local accounts peers' jobs run as (`[[peer]] flock_user` of peers this cluster
    /// lends to), by uid, with the peer's name: resolved once, at start.
    peer_accounts: HashMap<u32, String>,
    /// Where each peer this cluster borrows from keeps its MM's public key (`[[peer]]
    /// mm_public_key_file`): read when a guest slot of it registers (so a lender's key
    /// installed or rotated later is taken without a restart).
    lender_key_files: HashMap<String, std::path::PathBuf>,
}

/// A core that stops (a shutdown, or a replica that no longer leads) leaves nothing running:
/// its clients' connections close once the replies already given to their writers are
/// written (and the clients follow whichever MM leads), and its transfers stop.
impl Drop for DaemonEnv {
    fn drop(&mut self) {
        for (_, c) in self.clients.drain() {
            // The reader sees the end; the writer ends with its channel, after what it has.
            control::stop_reading(&c.closer);
            drop(c.tx);
        }
        for w in self.workers.values() {
            w.cancel.store(true, Ordering::Release);
        }
    }
}

impl std::fmt::Debug for DaemonEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonEnv")
            .field("clients", &self.clients.len())
            .field("programs", &self.programs.len())
            .field("transfers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

/// The local accounts the peers this cluster lends to run their jobs as (their
/// `flock_user`), by uid; an account this host does not know is left out (its peer's jobs are
/// refused anyway, by the peer agent).
fn peer_accounts(cfg: &ClusterConfig) -> HashMap<u32, String> {
    cfg.peers
        .iter()
        .filter(|p| p.lend)
        .filter_map(|p| {
            let name = p.flock_user.as_ref()?;
            let user = nix::unistd::User::from_name(name).ok()??;
            Some((user.uid.as_raw(), p.name.clone()))
        })
        .collect()
}

impl DaemonEnv {
    fn new(
        fabric: Arc<dyn Primitives>,
        waker: Waker,
        store: Option<ProgramStore>,
        commits: Commits,
        enrolled: Arc<parking_lot::RwLock<Enrolled>>,
        (peer_accounts, lender_key_files): (
            HashMap<u32, String>,
            HashMap<String, std::path::PathBuf>,
        ),
    ) -> Self {
        let (worker_tx, worker_rx) = crossbeam_channel::unbounded();
        Self {
            clock: SystemClock,
            fabric,
            waker,
            enrolled,
            clients: HashMap::new(),
            programs: HashMap::new(),
            next_program: 1,
            workers: HashMap::new(),
            hashes: Default::default(),
            worker_tx,
            worker_rx,
            saver: Saver::new(store.clone()),
            store,
            commits,
            peer_accounts,
            lender_key_files,
        }
    }

    /// Turns what a control thread brought into the core's input, keeping the connection's
    /// handles and the program's descriptor here.
    fn admit(&mut self, msg: Incoming) -> Input {
        match msg {
            Incoming::Connected {
                client,
                uid,
                gid,
                relayed_from,
                tx,
                written,
                closer,
            } => {
                self.clients.insert(
                    client,
                    ClientLink {
                        tx,
                        written,
                        closer,
                    },
                );
                Input::Connected {
                    client,
                    uid,
                    gid,
                    relayed_from,
                }
            }
            Incoming::Request {
                client,
                req,
                mut fds,
            } => Input::Request {
                client,
                req,
                program: fds.pop().map(|fd| self.hold_program(fd)),
            },
            Incoming::Gone { client } => {
                self.clients.remove(&client);
                Input::Gone { client }
            }
        }
    }

    /// Keeps a submitted program's descriptor, saying what it is.
    fn hold_program(&mut self, fd: OwnedFd) -> Result<SubmittedProgram, String> {
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| e.to_string())?;
        let id = self.next_program;
        self.next_program += 1;
        self.programs.insert(id, file);
        Ok(SubmittedProgram {
            id,
            len: meta.len(),
            regular: meta.is_file(),
            mode: meta.permissions().mode(),
            stamp: storm_cluster::messages::ProgramStamp::of(&meta),
        })
    }

    /// What the transfer workers, the program saver and the journal's thread finished since
    /// the last look.
    fn finished(&mut self) -> Vec<Input> {
        let mut inputs: Vec<Input> = self
            .commits
            .settled()
            .into_iter()
            .map(Input::Persisted)
            .collect();
        while let Ok(done) = self.worker_rx.try_recv() {
            self.workers.remove(&done.transfer);
            inputs.push(Input::TransferDone(done));
        }
        for (job, result) in self.saver.finished() {
            inputs.push(Input::ProgramSaved { job, result });
        }
        inputs
    }

    fn open_program(&self, source: ProgramSource) -> Result<File, String> {
        match source {
            ProgramSource::Submitted(p) => self
                .programs
                .get(&p)
                .ok_or_else(|| "it is no longer at hand".to_string())?
                .try_clone()
                .map_err(|e| e.to_string()),
            ProgramSource::Saved(job) => self
                .store
                .as_ref()
                .and_then(|s| s.open(job))
                .ok_or_else(|| "its copy beside the journal is missing".to_string()),
        }
    }
}

impl MmEnv for DaemonEnv {
    fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    fn operator_uid(&self) -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    fn peer_account(&self, uid: u32) -> Option<&str> {
        self.peer_accounts.get(&uid).map(String::as_str)
    }

    fn lender_keys(&mut self, peer: &str) -> Vec<storm_cluster::identity::VerifyingKey> {
        let Some(path) = self.lender_key_files.get(peer) else {
            return Vec::new();
        };
        match storm_cluster::identity::load_public(path) {
            Ok(keys) => keys,
            Err(e) => {
                tracing::error!(%peer, "cannot check a lease of {peer}'s: {e}");
                Vec::new()
            }
        }
    }

    fn managers(&self) -> Vec<storm_cluster::control::ManagerInfo> {
        match &self.commits {
            Commits::Group(r, _) => r.managers(),
            Commits::Disk(_) => vec![storm_cluster::control::ManagerInfo::single()],
        }
    }

    fn remove_manager(&mut self, name: &str) -> Result<String, String> {
        match &self.commits {
            Commits::Group(r, _) => r.remove(name),
            Commits::Disk(_) => Err(crate::env::no_group_to_remove_from(name)),
        }
    }

    fn send(&mut self, client: ClientId, reply: Reply) {
        if let Some(c) = self.clients.get(&client) {
            let _ = c.tx.send(reply);
        }
    }

    fn replies_written(&self, client: ClientId) -> u64 {
        self.clients
            .get(&client)
            .map_or(u64::MAX, |c| c.written.load(Ordering::Acquire))
    }

    fn hang_up(&mut self, client: ClientId) {
        if let Some(c) = self.clients.remove(&client) {
            control::hang_up(&c.closer);
        }
    }

    fn start_transfer(&mut self, t: TransferSpec) -> Result<(), String> {
        let file = self.open_program(t.program)?;
        let worker = Worker {
            cancel: Arc::new(AtomicBool::new(false)),
            delivered: Arc::new(AtomicU64::new(0)),
        };
        let transfer = Transfer {
            job: t.job,
            transfer: t.transfer,
            nodes: t.nodes,
            file,
            size: t.size,
            worker: t.worker,
            event: t.event,
            cancel: worker.cancel.clone(),
            delivered: worker.delivered.clone(),
            timeout: t.timeout,
            file_ack: t.file_ack,
            ack_wait: t.ack_wait,
            wake: self.waker.clone(),
            check_only: t.check_only,
            hashes: self.hashes.clone(),
        };
        self.workers.insert(t.transfer, worker);
        transfer::spawn(
            self.fabric.clone(),
            t.chunks,
            transfer,
            self.worker_tx.clone(),
        );
        Ok(())
    }

    fn cancel_transfer(&mut self, transfer: u32) {
        if let Some(w) = self.workers.get(&transfer) {
            w.cancel.store(true, Ordering::Release);
        }
    }

    fn transfer_delivered(&self, transfer: u32) -> Option<u64> {
        self.workers
            .get(&transfer)
            .map(|w| w.delivered.load(Ordering::Relaxed))
    }

    fn save_program(&mut self, job: JobId, program: ProgramId, size: u64) -> bool {
        let Some(copy) = self.programs.get(&program).and_then(|f| f.try_clone().ok()) else {
            return false;
        };
        self.saver.save(job, copy, size)
    }

    fn saved_program_len(&self, job: JobId) -> Option<u64> {
        let copy = self.store.as_ref()?.open(job)?;
        copy.metadata().ok().map(|m| m.len())
    }

    fn remove_saved_program(&mut self, job: JobId) {
        if let Some(store) = &self.store {
            store.remove(job);
        }
    }

    fn release_program(&mut self, program: ProgramId) {
        self.programs.remove(&program);
    }

    fn persist(&mut self, batch: Batch) {
        self.commits.send(batch);
    }
}
