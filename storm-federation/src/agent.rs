//! The peer agent (`storm-peer`), beside this cluster's MM: it keeps a link to every peer
//! cluster's agent, tells each what this cluster offers it, hears what each offers, and
//! reports the peers to its MM for `storm peers`.
//!
//! Threads, each with one job:
//!
//! * the **listener** takes the links peers dial, checks each handshake (at most
//!   [`MAX_HANDSHAKES`] at once, [`MAX_HANDSHAKES_PER_SOURCE`] from one address, each within
//!   [`HANDSHAKE_TIMEOUT`]; refusals logged within a rate), then reads that peer's
//!   adverts and echoes each;
//! * a **dialler** per peer keeps this agent's own link to it: it sends an advert every
//!   `[federation] advertise_ms` and hears the echoes (the link's round trip), and dials
//!   again after a failure;
//! * the **reporter** asks this cluster's MM for its nodes and queue every period (what it
//!   offers: its idle nodes and CPUs, to peers it lends to) and for the jobs it flocked, and
//!   reports the peer table back;
//! * a **follower** per job a peer flocked here (see [`crate::flock`]).
//!
//! Flocking rides on the same links: the dialler sends a peer the jobs this cluster flocked
//! to it, and hands the events the peer sends back to this cluster's MM; the listener's side
//! of a link runs the jobs its peer sends, and sends their events back on it.
//!
//! The agent is a process of its own, apart from the MM: if it fails, or a peer misbehaves,
//! the MM schedules its own jobs as before (Condor's rule for its flocking daemons). A
//! peer's messages are bounded frames, decoded without panicking, and change nothing but
//! that peer's line of the table.

use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use parking_lot::Mutex;
use storm_cluster::ClusterConfig;
use storm_cluster::accept_gate::{AcceptGate, Place};
use storm_cluster::control::{Client, NodeState, Reply, Request};
use storm_cluster::federation::{Offer, PeerEntry, PeerMessage};
use storm_cluster::sealed::WireError;
use storm_primitives::tcp::auth::ClusterKey;

use crate::flock::{self, Follower, Home, Hosted, Manager};
use crate::table::PeerTable;
use crate::wire;

/// Handshakes that may run at once on the listener.
pub const MAX_HANDSHAKES: usize = 16;
/// Of those, from one address: a host without a pair key holds a few, never all, so peers
/// that dial again after a link drop get in.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 4;

/// A link whose handshake takes longer is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the agent's threads share.
struct Agent {
    cluster: String,
    peers: Vec<(PeerEntry, ClusterKey)>,
    table: Mutex<PeerTable>,
    /// What this cluster offers now (`None`: its MM could not be asked).
    offer: Mutex<Option<Offer>>,
    every: Duration,
    timeout: Duration,
    /// The origin of the echo tokens.
    start: Instant,
    stop: Arc<AtomicBool>,
    handshakes: AcceptGate,
    /// This cluster's MM.
    mm: Manager,
    /// Flocking: this cluster's jobs on peers, and peers' jobs here.
    home: Mutex<Home>,
    hosted: Mutex<Hosted>,
    /// Borrowing: what this cluster's MM wants of its lenders.
    borrowing: Mutex<crate::lending::Borrowing>,
    /// Lending: the lent nodes this cluster's MM calls home, by borrower.
    recalls: Mutex<crate::lending::Recalls>,
    /// Numbers the links peers dialled.
    links: std::sync::atomic::AtomicU64,
}

impl Agent {
    fn token(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Runs the agent of the cluster `cfg` describes until `stop` is set.
pub fn run(cfg: ClusterConfig, stop: Arc<AtomicBool>) -> Result<()> {
    if cfg.peers.is_empty() {
        anyhow::bail!("the cluster file names no [[peer]]: there is nothing for storm-peer to do");
    }
    let listen = cfg
        .federation
        .listen
        .context("the cluster file has no [federation] listen")?;
    let mut peers = Vec::new();
    for p in &cfg.peers {
        let key = storm_cluster::key::load(&p.key_file)
            .with_context(|| format!("peer {}: its pair key", p.name))?;
        peers.push((p.clone(), key));
    }
    let listener = TcpListener::bind(listen)
        .with_context(|| format!("cannot listen on [federation] listen {listen}"))?;
    listener.set_nonblocking(true)?;
    let agent = Arc::new(Agent {
        cluster: cfg.cluster.name.clone(),
        table: Mutex::new(PeerTable::new(&cfg.peers, cfg.federation.peer_timeout())),
        peers,
        offer: Mutex::new(None),
        every: cfg.federation.advertise_every(),
        timeout: cfg.federation.peer_timeout(),
        start: Instant::now(),
        stop,
        handshakes: AcceptGate::new("the peer agent", MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE),
        mm: Manager {
            sockets: cfg.control_sockets(),
            // Half the peer timeout (at most the handshake's): an MM that does not answer
            // for that long shows in this cluster's adverts before its peers give up on it.
            answer_within: (cfg.federation.peer_timeout() / 2).min(HANDSHAKE_TIMEOUT),
        },
        home: Mutex::new(Home::default()),
        hosted: Mutex::new(Hosted::default()),
        borrowing: Mutex::new(Default::default()),
        recalls: Mutex::new(Default::default()),
        links: std::sync::atomic::AtomicU64::new(0),
    });
    tracing::info!(%listen, cluster = %agent.cluster, peers = agent.peers.len(), "peer agent started");
    let mut threads = Vec::new();
    for i in 0..agent.peers.len() {
        let a = agent.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("peer-{}", agent.peers[i].0.name))
                .spawn(move || dial(&a, i))?,
        );
    }
    let a = agent.clone();
    threads.push(
        std::thread::Builder::new()
            .name("peer-report".into())
            .spawn(move || report(&a, &cfg))?,
    );
    storm_cluster::daemon::notify_ready();
    accept(&agent, &listener);
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// Takes peers' links until the agent stops.
fn accept(agent: &Arc<Agent>, listener: &TcpListener) {
    while !agent.stopped() {
        match listener.accept() {
            Ok((tcp, from)) => {
                let Some(place) = agent.handshakes.admit(from.ip()) else {
                    continue;
                };
                let a = agent.clone();
                let spawned = std::thread::Builder::new()
                    .name("peer-in".into())
                    .spawn(move || serve_inbound(&a, tcp, from, place));
                if let Err(e) = spawned {
                    tracing::warn!("cannot serve a peer link: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!("accepting a peer link failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A link a peer dialled: its handshake, then its adverts, each echoed.
fn serve_inbound(agent: &Arc<Agent>, tcp: TcpStream, from: std::net::SocketAddr, place: Place) {
    let claimed = std::cell::RefCell::new(None::<String>);
    let linked = (|| {
        tcp.set_nonblocking(false)?;
        tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let r = BufReader::new(tcp.try_clone()?);
        let w = BufWriter::new(tcp.try_clone()?);
        wire::handshake_as_listener(r, w, &agent.cluster, |name| {
            *claimed.borrow_mut() = Some(name.to_string());
            agent
                .peers
                .iter()
                .find(|(p, _)| p.name == name)
                .map(|(_, k)| k.clone())
        })
    })();
    drop(place);
    let (name, mut link) = match linked {
        Ok(l) => l,
        Err(e) => {
            agent.handshakes.log_failure(Some(from), &e);
            if let (Some(name), WireError::Refused(why)) = (claimed.into_inner(), &e) {
                agent
                    .table
                    .lock()
                    .inbound_refused(&name, why.clone(), Instant::now());
            }
            return;
        }
    };
    tracing::info!(peer = %name, %from, "a peer's link is up");
    // A peer silent for longer than its timeout has gone: the link ends, it dials again.
    let _ = tcp.set_read_timeout(Some(agent.timeout));
    // What goes back on this link (echoes, the events of the jobs it flocked here) goes
    // through one writer thread.
    let (tx, rx) = std::sync::mpsc::sync_channel::<PeerMessage>(flock::LINK_QUEUE);
    let mut writer = link.writer;
    let writing = {
        let (name, tcp) = (name.clone(), tcp.try_clone());
        std::thread::Builder::new()
            .name(format!("peer-out-{name}"))
            .spawn(move || {
                for m in rx {
                    if let Err(e) = writer.send(&m) {
                        tracing::info!(peer = %name, "a peer's link ended: {e}");
                        if let Ok(t) = &tcp {
                            let _ = t.shutdown(std::net::Shutdown::Both);
                        }
                        return;
                    }
                }
            })
    };
    let Ok(writing) = writing else {
        tracing::warn!(peer = %name, "cannot start a writer for a peer's link");
        return;
    };
    let id = agent.links.fetch_add(1, Ordering::Relaxed);
    agent.hosted.lock().link_up(&name, id, tx.clone());
    while !agent.stopped() {
        match link.reader.recv::<PeerMessage>() {
            Ok(PeerMessage::Advert {
                offer,
                manager,
                token,
            }) => {
                agent
                    .table
                    .lock()
                    .advert(&name, offer, manager, Instant::now());
                // A full queue (a slow link) drops the echo: the lag shows it.
                if let Err(std::sync::mpsc::TrySendError::Disconnected(_)) =
                    tx.try_send(PeerMessage::Echo { token })
                {
                    break;
                }
            }
            Ok(PeerMessage::Want { jobs }) => {
                let withdrawn = agent.hosted.lock().want(&name, &jobs);
                for f in withdrawn {
                    flock::withdraw(&agent.mm, &f);
                }
            }
            Ok(PeerMessage::Submit {
                job,
                since_ms,
                user,
                req,
            }) => host(agent, &name, job, &user, (since_ms, *req)),
            Ok(PeerMessage::Input {
                job,
                since_ms,
                piece,
            }) => {
                // Outside the lock: the write to the MM may wait (up to the MM's answer
                // time).
                let follower = agent.hosted.lock().follower(&name, job, since_ms);
                if let Some(f) = follower {
                    f.input(piece);
                }
            }
            Ok(PeerMessage::Borrow {
                nodes,
                count,
                for_ms,
            }) => {
                if lends_to(agent, &name) {
                    match crate::lending::lend(&agent.mm, &name, nodes, count, for_ms) {
                        // A full queue drops the answer: the next asking has one.
                        Ok(nodes) => {
                            if let Err(std::sync::mpsc::TrySendError::Disconnected(_)) =
                                tx.try_send(PeerMessage::Lent { nodes })
                            {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(peer = %name, "the MM lent nothing the peer asked for: {e}")
                        }
                    }
                } else {
                    tracing::warn!(peer = %name, "a peer this cluster does not lend to asked for nodes");
                }
            }
            Ok(PeerMessage::GiveBack { nodes }) => {
                if lends_to(agent, &name)
                    && let Err(e) = crate::lending::give_back(&agent.mm, &name, nodes)
                {
                    tracing::warn!(peer = %name, "the MM did not take back the nodes given back: {e}");
                }
            }
            Ok(PeerMessage::Recall { nodes }) => {
                if !borrows_from(agent, &name) {
                    tracing::warn!(peer = %name, "a peer this cluster does not borrow from called nodes home");
                } else if let Err(e) = crate::lending::recalled(&agent.mm, &name, nodes) {
                    // The lender says it again next period.
                    tracing::warn!(peer = %name, "the MM did not take the nodes called home: {e}");
                }
            }
            Ok(
                PeerMessage::Echo { .. } | PeerMessage::Events { .. } | PeerMessage::Lent { .. },
            ) => {
                tracing::warn!(peer = %name, "a peer sent an answer on its own link: link ended");
                break;
            }
            Err(e) => {
                tracing::info!(peer = %name, "a peer's link ended: {e}");
                break;
            }
        }
    }
    agent.hosted.lock().link_down(&name, id);
    drop(tx);
    let _ = tcp.shutdown(std::net::Shutdown::Both);
    let _ = writing.join();
}

/// Whether this cluster's file lends to peer `name`.
fn lends_to(agent: &Agent, name: &str) -> bool {
    agent.peers.iter().any(|(p, _)| p.name == name && p.lend)
}

/// Whether this cluster's file lets it borrow from peer `name`.
fn borrows_from(agent: &Agent, name: &str) -> bool {
    agent.peers.iter().any(|(p, _)| p.name == name && p.borrow)
}

/// Peer side: `origin` flocked its job `job` here for its user `user`: a follower runs it,
/// unless it runs already or this cluster will not run it (then the refusal goes back).
fn host(
    agent: &Arc<Agent>,
    origin: &str,
    job: u64,
    user: &str,
    req: (u64, storm_cluster::control::JobRequest),
) {
    if agent.hosted.lock().has(origin, job, req.0) {
        return;
    }
    let f = Follower::new(origin, job, req.0);
    let entry = agent
        .peers
        .iter()
        .find(|(p, _)| p.name == origin)
        .map(|(p, _)| p);
    let account = match entry {
        Some(p) if p.lend => flock::local_account(user, p, &agent.cluster),
        _ => Err(format!("{} does not lend to {origin}", agent.cluster)),
    };
    let account = match account {
        Ok(a) => a,
        Err(why) => {
            tracing::warn!(%origin, job, "refused a flocked job: {why}");
            f.push_refusal(why);
            agent.hosted.lock().add(f);
            return;
        }
    };
    tracing::info!(%origin, job, %user, uid = account.0, "running a job flocked here");
    agent.hosted.lock().add(f.clone());
    let a = agent.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("flock-{origin}-{job}"))
        .spawn(move || flock::follow(&a.mm, &a.hosted, &f, account, req, &|| a.stopped()));
    if let Err(e) = spawned {
        tracing::warn!(%origin, job, "cannot start a follower for a flocked job: {e}");
    }
}

/// Keeps this agent's link to peer `i`: adverts out, echoes in; dials again after a failure.
fn dial(agent: &Arc<Agent>, i: usize) {
    let (entry, key) = &agent.peers[i];
    let name = &entry.name;
    let mut backoff = agent.every;
    while !agent.stopped() {
        let outcome = link_to(agent, entry, key);
        let (why, refused) = match outcome {
            Ok(()) => {
                backoff = agent.every;
                ("its link ended".to_string(), false)
            }
            Err(e) => {
                let refused = matches!(e.downcast_ref::<WireError>(), Some(WireError::Refused(_)));
                (format!("{e:#}"), refused)
            }
        };
        tracing::info!(peer = %name, "no link to the peer: {why}");
        agent.table.lock().outbound_failed(name, why, refused);
        let until = Instant::now() + backoff;
        while Instant::now() < until && !agent.stopped() {
            std::thread::sleep(Duration::from_millis(50));
        }
        backoff = (backoff * 2).min(agent.timeout);
    }
}

/// One link to `entry`'s agent, until it fails (`Ok`: it ended after working).
fn link_to(agent: &Arc<Agent>, entry: &PeerEntry, key: &ClusterKey) -> Result<()> {
    let tcp = TcpStream::connect_timeout(&entry.address, HANDSHAKE_TIMEOUT)
        .with_context(|| format!("cannot reach {} at {}", entry.name, entry.address))?;
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let link = wire::handshake_as_dialler(
        BufReader::new(tcp.try_clone()?),
        BufWriter::new(tcp.try_clone()?),
        key,
        &agent.cluster,
        &entry.name,
    )?;
    tracing::info!(peer = %entry.name, "link to the peer is up");
    agent.table.lock().outbound_up(&entry.name);
    agent.home.lock().link_up(&entry.name);
    tcp.set_read_timeout(Some(agent.timeout))?;
    let (mut reader, mut writer) = (link.reader, link.writer);
    let ended = Arc::new(AtomicBool::new(false));
    let echoes = {
        let (agent, ended, name) = (agent.clone(), ended.clone(), entry.name.clone());
        std::thread::Builder::new()
            .name(format!("peer-echo-{name}"))
            .spawn(move || {
                while !agent.stopped() {
                    match reader.recv::<PeerMessage>() {
                        Ok(PeerMessage::Echo { token }) => {
                            let rtt = agent.token().saturating_sub(token);
                            agent.table.lock().echo(
                                &name,
                                Duration::from_micros(rtt),
                                Instant::now(),
                            );
                        }
                        Ok(PeerMessage::Events {
                            job,
                            since_ms,
                            epoch,
                            first,
                            events,
                        }) => pass_home(&agent, &name, (job, since_ms), epoch, first, events),
                        Ok(PeerMessage::Lent { nodes }) => {
                            agent.borrowing.lock().answered(&name, nodes)
                        }
                        Ok(
                            PeerMessage::Advert { .. }
                            | PeerMessage::Want { .. }
                            | PeerMessage::Submit { .. }
                            | PeerMessage::Input { .. }
                            | PeerMessage::Borrow { .. }
                            | PeerMessage::GiveBack { .. }
                            | PeerMessage::Recall { .. },
                        ) => {
                            tracing::warn!(peer = %name, "a request on this agent's own link: link ended");
                            break;
                        }
                        Err(e) => {
                            tracing::info!(peer = %name, "the link to the peer ended: {e}");
                            break;
                        }
                    }
                }
                ended.store(true, Ordering::Release);
            })?
    };
    let result = loop {
        if agent.stopped() || ended.load(Ordering::Acquire) {
            break Ok(());
        }
        let offer = if entry.lend {
            agent.offer.lock().clone()
        } else {
            None
        };
        let advert = PeerMessage::Advert {
            offer,
            manager: agent.offer.lock().is_some(),
            token: agent.token(),
        };
        if let Err(e) = writer.send(&advert) {
            break Err(anyhow::Error::new(e).context("sending an advert"));
        }
        if entry.borrow {
            let (flocking, too_large) = agent.home.lock().messages_for(&entry.name);
            if let Some(e) = flocking.iter().find_map(|m| writer.send(m).err()) {
                break Err(anyhow::Error::new(e).context("sending flocked jobs"));
            }
            for (job, why) in too_large {
                let update = storm_cluster::flock::FlockUpdate {
                    peer: entry.name.clone(),
                    job,
                    events: vec![storm_cluster::flock::FlockEvent::Refused(why)],
                };
                if let Err(e) = agent.mm.report(update) {
                    tracing::warn!(
                        job,
                        "cannot give a job too large for the link back to the MM: {e}"
                    );
                }
            }
            let borrowing = agent.borrowing.lock().messages_for(&entry.name);
            if let Some(e) = borrowing.iter().find_map(|m| writer.send(m).err()) {
                break Err(anyhow::Error::new(e).context("sending what this cluster borrows"));
            }
        }
        if entry.lend
            && let Some(recall) = agent.recalls.lock().message_for(&entry.name)
            && let Err(e) = writer.send(&recall)
        {
            break Err(anyhow::Error::new(e).context("calling lent nodes home"));
        }
        std::thread::sleep(agent.every);
    };
    let _ = tcp.shutdown(std::net::Shutdown::Both);
    let _ = echoes.join();
    result
}

/// Home side: events of this cluster's job `job` from peer `peer`, to this cluster's MM; what
/// it takes counts as taken (and is not passed on again).
fn pass_home(
    agent: &Agent,
    peer: &str,
    (job, since_ms): (u64, u64),
    epoch: u64,
    first: u64,
    events: Vec<storm_cluster::flock::FlockEvent>,
) {
    let fresh = agent
        .home
        .lock()
        .fresh(peer, (job, since_ms), epoch, first, events);
    let Some((taken, fresh)) = fresh else {
        return;
    };
    let n = fresh.len() as u64;
    let update = storm_cluster::flock::FlockUpdate {
        peer: peer.to_string(),
        job,
        events: fresh,
    };
    match agent.mm.report(update) {
        Ok(took) => agent
            .home
            .lock()
            .took(job, epoch, taken + (took as u64).min(n)),
        Err(e) => {
            tracing::warn!(%peer, job, "the MM did not take a flocked job's news (the peer sends it again): {e}")
        }
    }
}

/// Every period: this cluster's offer from its MM, and the peer table back to it. An MM that
/// does not answer within [`Manager::answer_within`] (frozen, or gone) counts as unreachable:
/// this cluster then offers nothing, and its adverts say its MM does not answer.
fn report(agent: &Agent, cfg: &ClusterConfig) {
    let sockets = cfg.control_sockets();
    let mut warned = false;
    while !agent.stopped() {
        let asked = agent.mm.connect_for_calls().ok().and_then(|client| {
            let offer = offer_of(&client, cfg).ok()?;
            Some((client, offer))
        });
        match asked {
            Some((client, offer)) => {
                *agent.offer.lock() = Some(offer);
                if cfg.peers.iter().any(|p| p.borrow) {
                    match client.call(&Request::FlockOut) {
                        Ok(Reply::FlockOut(orders)) => agent.home.lock().set_orders(orders),
                        Ok(Reply::Error(e)) | Err(e) => {
                            tracing::warn!("cannot take the flocked jobs from the MM: {e}")
                        }
                        Ok(other) => tracing::warn!("unexpected reply to FlockOut: {other:?}"),
                    }
                    let lent = agent.borrowing.lock().take_answers();
                    match client.call(&Request::BorrowOut { lent }) {
                        Ok(Reply::BorrowOut(orders)) => agent.borrowing.lock().set_orders(orders),
                        Ok(Reply::Error(e)) | Err(e) => {
                            tracing::warn!("cannot take what this cluster borrows from the MM: {e}")
                        }
                        Ok(other) => tracing::warn!("unexpected reply to BorrowOut: {other:?}"),
                    }
                }
                if cfg.peers.iter().any(|p| p.lend) {
                    match client.call(&Request::Recalls) {
                        Ok(Reply::Recalls(recalls)) => agent.recalls.lock().set(recalls),
                        Ok(Reply::Error(e)) | Err(e) => {
                            tracing::warn!(
                                "cannot take the nodes this cluster calls home from the MM: {e}"
                            )
                        }
                        Ok(other) => tracing::warn!("unexpected reply to Recalls: {other:?}"),
                    }
                }
                let infos = agent.table.lock().infos(Instant::now());
                // Jobs flocked here from a home gone for the timeout are cancelled.
                let states: Vec<(String, bool, Option<Duration>)> = infos
                    .iter()
                    .map(|i| {
                        (
                            i.name.clone(),
                            i.state == storm_cluster::federation::PeerState::Up,
                            i.heard_ms_ago.map(Duration::from_millis),
                        )
                    })
                    .collect();
                let gone = agent
                    .hosted
                    .lock()
                    .homes(&states, Instant::now(), agent.timeout);
                for f in gone {
                    tracing::warn!(origin = %f.origin, job = f.job, "its home cluster has been away for the peer timeout: the flocked job is cancelled here");
                    flock::withdraw(&agent.mm, &f);
                }
                match client.call(&Request::PeerReport(infos)) {
                    Ok(Reply::Done) => warned = false,
                    Ok(Reply::Error(e)) | Err(e) => {
                        if !warned {
                            tracing::warn!("the machine manager did not take the peer report: {e}");
                            warned = true;
                        }
                    }
                    Ok(other) => tracing::warn!("unexpected reply to the peer report: {other:?}"),
                }
            }
            None => {
                // Without its own MM this cluster offers nothing.
                *agent.offer.lock() = None;
                if !warned {
                    tracing::warn!(sockets = ?sockets, "cannot reach this cluster's machine manager: offering nothing");
                    warned = true;
                }
            }
        }
        let until = Instant::now() + agent.every;
        while Instant::now() < until && !agent.stopped() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What this cluster offers: its idle nodes and their CPUs, and its own queue.
fn offer_of(client: &Client, cfg: &ClusterConfig) -> Result<Offer, String> {
    let nodes = match client.call(&Request::Nodes)? {
        Reply::Nodes(n) => n,
        other => return Err(format!("unexpected reply {other:?}")),
    };
    let queued = match client.call(&Request::Queue)? {
        Reply::Queue(jobs) => jobs
            .iter()
            .filter(|j| j.state == storm_cluster::control::JobState::Queued)
            .count(),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    let idle: Vec<_> = nodes
        .iter()
        .filter(|n| n.state == NodeState::Idle)
        .collect();
    Ok(Offer {
        idle_nodes: idle.len() as u32,
        idle_cpus: idle
            .iter()
            .filter_map(|n| cfg.nodes.get(n.id as usize))
            .map(|e| e.cpus)
            .sum(),
        nodes: nodes.len() as u32,
        queued: queued as u32,
    })
}
