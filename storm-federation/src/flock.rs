//! Flocking in the peer agent (docs/federation.md): passing this cluster's flocked jobs to
//! the peers that run them (the *home* side), and running the jobs peers flock here (the
//! *peer* side).
//!
//! **Home side.** Every period the reporter fetches the jobs this cluster's MM flocked
//! ([`Home::set_orders`]). On its link to each peer, the agent sends the peer the list of the
//! jobs flocked to it (`Want`, with how far the home MM took each job's events), and each job
//! the peer has not spoken of on this link yet (`Submit`). The events the peer sends back go
//! to the home MM in order ([`Home::events`]); only what the MM took counts as taken.
//! The job's standard input, which the MM hands over with the job's order, goes to the peer
//! once, piece by piece (`Input`), after the list.
//!
//! **Peer side.** A `Submit` starts a [`Follower`]: a thread that submits the job to this
//! cluster's MM as its owner's local account (the same name, or the peer's `flock_user`;
//! never root) and follows it as storm-submit would, numbering what it hears. The events go
//! to the home cluster's agent as they come, and again until the home side took them. A job
//! missing from a `Want`, or whose home has not been `up` for `peer_timeout_ms`, is
//! cancelled here: either side can walk away at any moment. A piece of a job's input goes to
//! the MM on its follower's own connection ([`Follower::input`]).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use storm_cluster::control::{Client, JobRequest, Reply, Request};
use storm_cluster::federation::{PeerEntry, PeerMessage, Wanted};
use storm_cluster::flock::{FlockEvent, FlockOrder, FlockUpdate, InputPiece};
use storm_cluster::messages::{INPUT_WINDOW, JobId, MAX_INPUT_CHUNK};

/// Output a follower keeps for its home side before that side takes it; past it, further
/// output of the job is dropped (and counted in the log).
pub const MAX_UNTAKEN_OUTPUT: usize = 64 << 20;

/// Bytes of output one `Events` message carries at most (a frame holds 4 MiB).
const EVENTS_PER_MESSAGE: usize = 1 << 20;

/// The home side: this cluster's flocked jobs and how far each peer's events were taken.
#[derive(Default)]
pub struct Home {
    /// The flocked jobs, by the peer that runs them (from the MM, every period).
    orders: HashMap<String, Vec<FlockOrder>>,
    /// Each job's follower on its peer, and its last event the home MM took.
    taken: HashMap<JobId, (u64, u64)>,
    /// Jobs (and when each was sent) the peer spoke of on the current link to it: their
    /// `Submit` need not go again.
    heard: HashMap<String, std::collections::HashSet<(JobId, u64)>>,
    /// Standard input of each job (by job and sending) for its peer, not sent yet: at most
    /// [`INPUT_WINDOW`] bytes a job (storm-submit sends no more ahead of the tasks, and
    /// sends again what they did not acknowledge).
    input: HashMap<(JobId, u64), Vec<InputPiece>>,
}

impl Home {
    pub fn set_orders(&mut self, orders: Vec<FlockOrder>) {
        let mut by_peer: HashMap<String, Vec<FlockOrder>> = HashMap::new();
        self.input
            .retain(|(job, since), _| orders.iter().any(|o| o.job == *job && o.since_ms == *since));
        for mut o in orders {
            let held = self.input.entry((o.job, o.since_ms)).or_default();
            let mut bytes: usize = held.iter().map(|p| p.data.len()).sum();
            for piece in std::mem::take(&mut o.input) {
                if piece.data.len() > MAX_INPUT_CHUNK
                    || bytes + piece.data.len() > INPUT_WINDOW as usize
                {
                    continue;
                }
                bytes += piece.data.len();
                held.push(piece);
            }
            by_peer.entry(o.peer.clone()).or_default().push(o);
        }
        self.input.retain(|_, pieces| !pieces.is_empty());
        self.taken
            .retain(|job, _| by_peer.values().flatten().any(|o| o.job == *job));
        for (peer, heard) in &mut self.heard {
            let orders = by_peer.get(peer).map(Vec::as_slice).unwrap_or(&[]);
            heard.retain(|(job, since)| {
                orders.iter().any(|o| o.job == *job && o.since_ms == *since)
            });
        }
        self.orders = by_peer;
    }

    /// A new link to `peer`: it hears every job's `Submit` again.
    pub fn link_up(&mut self, peer: &str) {
        self.heard.remove(peer);
    }

    /// What goes to `peer` this period: the submissions it has not spoken of on this link,
    /// then the list of the jobs flocked to it, then their standard input (taken: it goes
    /// once); and the jobs too large for a frame of the link, with why (the caller tells the
    /// home MM, which takes them back).
    pub fn messages_for(&mut self, peer: &str) -> (Vec<PeerMessage>, Vec<(JobId, String)>) {
        let orders = self.orders.get(peer).map(Vec::as_slice).unwrap_or(&[]);
        let heard = self.heard.get(peer);
        let want = PeerMessage::Want {
            jobs: orders
                .iter()
                .map(|o| {
                    let (epoch, taken) = self.taken.get(&o.job).copied().unwrap_or((0, 0));
                    Wanted {
                        job: o.job,
                        since_ms: o.since_ms,
                        epoch,
                        taken,
                    }
                })
                .collect(),
        };
        // The submissions first: a job the peer does not know when it reads the list is one
        // it gave up.
        let mut out = Vec::new();
        let mut too_large = Vec::new();
        for o in orders
            .iter()
            .filter(|o| !heard.is_some_and(|h| h.contains(&(o.job, o.since_ms))))
        {
            let submit = PeerMessage::Submit {
                job: o.job,
                since_ms: o.since_ms,
                user: user_name(o.uid),
                req: Box::new(o.req.clone()),
            };
            let len = storm_cluster::control::encoded_len(&submit);
            if len > crate::wire::FRAME_LIMIT {
                too_large.push((
                    o.job,
                    format!(
                        "its request is {len} bytes, over the {} a peer link carries (pass \
                         fewer or shorter arguments or variables)",
                        crate::wire::FRAME_LIMIT
                    ),
                ));
            } else {
                out.push(submit);
            }
        }
        out.push(want);
        for o in orders {
            for piece in self
                .input
                .remove(&(o.job, o.since_ms))
                .into_iter()
                .flatten()
            {
                out.push(PeerMessage::Input {
                    job: o.job,
                    since_ms: o.since_ms,
                    piece,
                });
            }
        }
        (out, too_large)
    }

    /// Events of `job`, as sent at `since_ms`, from `peer`'s follower `epoch`, numbered from
    /// `first`: the ones not taken yet, in order, or none if some before them are missing. The
    /// events of a sending other than the job's current one are old news: none.
    pub fn fresh(
        &mut self,
        peer: &str,
        (job, since_ms): (JobId, u64),
        epoch: u64,
        first: u64,
        events: Vec<FlockEvent>,
    ) -> Option<(u64, Vec<FlockEvent>)> {
        let current = self.orders.get(peer)?;
        if !current
            .iter()
            .any(|o| o.job == job && o.since_ms == since_ms)
        {
            return None;
        }
        self.heard
            .entry(peer.to_string())
            .or_default()
            .insert((job, since_ms));
        let taken = match self.taken.get(&job) {
            Some(&(e, t)) if e == epoch => t,
            // Another follower (the peer's agent restarted): its numbers start again.
            _ => 0,
        };
        if first > taken + 1 {
            return None;
        }
        let skip = (taken + 1 - first) as usize;
        let fresh: Vec<FlockEvent> = events.into_iter().skip(skip).collect();
        (!fresh.is_empty()).then_some((taken, fresh))
    }

    /// The home MM took `job`'s events up to `upto`, of follower `epoch`.
    pub fn took(&mut self, job: JobId, epoch: u64, upto: u64) {
        self.taken.insert(job, (epoch, upto));
    }
}

/// The name of user `uid` on this host, or `#uid` if it has none (which no peer maps).
fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| format!("#{uid}"), |u| u.name)
}

/// A job flocked here: what its follower heard, numbered from 1.
pub struct Follower {
    pub origin: String,
    pub job: JobId,
    /// The sending it runs (its `Submit`'s `since_ms`).
    pub since_ms: u64,
    /// Drawn at random: the home side tells a restarted agent's followers from this one.
    pub epoch: u64,
    state: Mutex<FollowerState>,
    /// The connection on which it submitted the job to this cluster's MM, while it lasts: the
    /// job's standard input goes on it (the MM takes a job's input from its submitter's
    /// connection only).
    conn: Mutex<Option<Arc<Client>>>,
}

#[derive(Default)]
struct FollowerState {
    /// Events after the first `base`, which the home side took.
    events: Vec<FlockEvent>,
    base: u64,
    /// Events sent on the current link (numbered up to this).
    sent: u64,
    /// Output bytes held in `events`.
    held_bytes: usize,
    dropped_bytes: u64,
    remote: Option<JobId>,
    withdrawn: bool,
    ended: bool,
}

impl Follower {
    pub fn new(origin: &str, job: JobId, since_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            origin: origin.to_string(),
            job,
            since_ms,
            epoch: u64::from_le_bytes(storm_primitives::tcp::auth::random_bytes()),
            state: Mutex::new(FollowerState::default()),
            conn: Mutex::new(None),
        })
    }

    /// A piece of the job's standard input from its home: passed to this cluster's MM for
    /// the job, if the MM took it and the follower's connection is up (else dropped: its
    /// submitter sends again what the tasks did not acknowledge). A piece larger than the MM
    /// takes is dropped here: the MM's refusal would come back on the follower's connection
    /// as if the job were refused.
    pub fn input(&self, piece: InputPiece) {
        let Some(remote) = self.state.lock().remote else {
            return;
        };
        if piece.data.len() > MAX_INPUT_CHUNK {
            tracing::warn!(origin = %self.origin, job = self.job, bytes = piece.data.len(), "a piece of standard input over the limit: dropped");
            return;
        }
        let conn = self.conn.lock();
        let Some(client) = conn.as_ref() else {
            return;
        };
        // A bare write: `Client::request` would read the MM's last word on a failure, which
        // is the follower's to read.
        let sent = storm_cluster::control::send(
            &client.sock,
            &Request::Input {
                job: remote,
                offset: piece.offset,
                data: piece.data,
                eof: piece.eof,
            },
            None,
        );
        if let Err(e) = sent {
            // Maybe half written (a frozen MM: the write timed out): the connection is of no
            // more use. The follower connects again and follows the job it made.
            tracing::info!(origin = %self.origin, job = self.job, "cannot pass standard input to the MM: {e}");
            let _ = client.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    fn push(&self, event: FlockEvent) {
        let mut s = self.state.lock();
        if let FlockEvent::Output(c) = &event {
            if s.held_bytes + c.data.len() > MAX_UNTAKEN_OUTPUT {
                s.dropped_bytes += c.data.len() as u64;
                if s.dropped_bytes == c.data.len() as u64 {
                    tracing::warn!(origin = %self.origin, job = self.job, "the home cluster takes this flocked job's output too slowly: output dropped");
                }
                return;
            }
            s.held_bytes += c.data.len();
        }
        if let FlockEvent::Accepted { remote } = &event {
            s.remote = Some(*remote);
        }
        if matches!(event, FlockEvent::Finished(_) | FlockEvent::Refused(_)) {
            s.ended = true;
        }
        s.events.push(event);
    }

    /// The job will not run here, for `why`: the one event its home hears of it.
    pub fn push_refusal(&self, why: String) {
        self.push(FlockEvent::Refused(why));
    }

    /// The home side took events up to `upto`: they are let go, and sending goes on after
    /// them.
    fn taken(&self, upto: u64) {
        let mut s = self.state.lock();
        if upto > s.base {
            let n = ((upto - s.base) as usize).min(s.events.len());
            let freed: usize = s.events[..n]
                .iter()
                .map(|e| match e {
                    FlockEvent::Output(c) => c.data.len(),
                    _ => 0,
                })
                .sum();
            s.events.drain(..n);
            s.base += n as u64;
            s.held_bytes -= freed;
        }
        s.sent = s.base;
    }

    /// The messages carrying the events not sent on this link yet, each with the number of
    /// its last event; none counts as sent until [`Follower::sent_upto`] says so.
    fn unsent(&self) -> Vec<(PeerMessage, u64)> {
        let s = self.state.lock();
        if s.withdrawn {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut at = s.sent.max(s.base);
        while at < s.base + s.events.len() as u64 {
            let first = at;
            let mut bytes = 0;
            let mut batch = Vec::new();
            for e in &s.events[(at - s.base) as usize..] {
                let size = match e {
                    FlockEvent::Output(c) => c.data.len(),
                    _ => 64,
                };
                if !batch.is_empty() && bytes + size > EVENTS_PER_MESSAGE {
                    break;
                }
                bytes += size;
                batch.push(e.clone());
            }
            at += batch.len() as u64;
            out.push((
                PeerMessage::Events {
                    job: self.job,
                    since_ms: self.since_ms,
                    epoch: self.epoch,
                    first: first + 1,
                    events: batch,
                },
                at,
            ));
        }
        out
    }

    /// The events up to `upto` went on the link.
    fn sent_upto(&self, upto: u64) {
        let mut s = self.state.lock();
        s.sent = s.sent.max(upto);
    }
}

/// Messages queued for one link's writer at most: past them, events wait (unsent) for room,
/// so that a slow link holds no more than this many messages (of 1 MiB at most) in memory.
pub const LINK_QUEUE: usize = 64;

/// The peer side: the jobs peers flocked here, and the links to send their events on.
#[derive(Default)]
pub struct Hosted {
    /// By home cluster, job and sending.
    followers: HashMap<(String, JobId, u64), Arc<Follower>>,
    /// The sender of each home cluster's link (the one it dialled), by name.
    links: HashMap<String, (u64, SyncSender<PeerMessage>)>,
    /// When each home cluster was last seen not `up`, without a break since.
    down_since: HashMap<String, Instant>,
}

impl Hosted {
    /// `origin`'s link is up: messages to it go to `tx` (`id` tells this link from a later
    /// one).
    pub fn link_up(&mut self, origin: &str, id: u64, tx: SyncSender<PeerMessage>) {
        self.links.insert(origin.to_string(), (id, tx));
        for f in self.followers.values().filter(|f| f.origin == origin) {
            // Read first: the guard of a lock taken in the call's argument would live
            // through the call, which takes the same lock.
            let base = f.state.lock().base;
            f.taken(base);
        }
    }

    pub fn link_down(&mut self, origin: &str, id: u64) {
        if self.links.get(origin).is_some_and(|(i, _)| *i == id) {
            self.links.remove(origin);
        }
    }

    /// Sends what `f` has not sent yet, if its home's link is up and its queue has room
    /// (the rest goes at the next flush).
    fn flush(&self, f: &Follower) {
        if let Some((_, tx)) = self.links.get(&f.origin) {
            for (m, upto) in f.unsent() {
                match tx.try_send(m) {
                    Ok(()) => f.sent_upto(upto),
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => break,
                }
            }
        }
    }

    /// `origin`'s list of the jobs it flocked here: the others, and the earlier sendings of
    /// listed ones, are withdrawn (returned, for the caller to cancel), and the listed ones'
    /// taken events let go. A listed job with no follower here is one this side gave up (its
    /// home was away): its home hears so.
    pub fn want(&mut self, origin: &str, jobs: &[Wanted]) -> Vec<Arc<Follower>> {
        for w in jobs {
            if !self.has(origin, w.job, w.since_ms)
                && let Some((_, tx)) = self.links.get(origin)
            {
                let _ = tx.try_send(PeerMessage::Events {
                    job: w.job,
                    since_ms: w.since_ms,
                    epoch: 0,
                    first: 1,
                    events: vec![FlockEvent::NotHere],
                });
            }
        }
        let mut withdrawn = Vec::new();
        self.followers.retain(|(o, job, since), f| {
            if o != origin {
                return true;
            }
            match jobs.iter().find(|w| w.job == *job && w.since_ms == *since) {
                Some(w) => {
                    f.taken(if w.epoch == f.epoch { w.taken } else { 0 });
                    true
                }
                None => {
                    withdrawn.push(f.clone());
                    false
                }
            }
        });
        for f in self.followers.values().filter(|f| f.origin == origin) {
            self.flush(f);
        }
        withdrawn
    }

    /// The follower of `origin`'s job `job` as sent at `since_ms`, if there is one.
    pub fn follower(&self, origin: &str, job: JobId, since_ms: u64) -> Option<Arc<Follower>> {
        self.followers
            .get(&(origin.to_string(), job, since_ms))
            .cloned()
    }

    /// Whether `origin`'s job `job`, as sent at `since_ms`, has a follower here already.
    pub fn has(&self, origin: &str, job: JobId, since_ms: u64) -> bool {
        self.followers
            .contains_key(&(origin.to_string(), job, since_ms))
    }

    pub fn add(&mut self, f: Arc<Follower>) {
        self.followers
            .insert((f.origin.clone(), f.job, f.since_ms), f.clone());
        self.flush(&f);
    }

    /// The home clusters' states, every period (each: whether it is `up`, and how long ago
    /// it was last heard): the jobs of one away for `timeout` (not `up`, counted from when it
    /// was last heard) are withdrawn (returned, for the caller to cancel).
    pub fn homes(
        &mut self,
        states: &[(String, bool, Option<Duration>)],
        now: Instant,
        timeout: Duration,
    ) -> Vec<Arc<Follower>> {
        for (name, up, heard_ago) in states {
            if *up {
                self.down_since.remove(name);
            } else {
                let heard = heard_ago
                    .and_then(|ago| now.checked_sub(ago))
                    .unwrap_or(now);
                self.down_since.entry(name.clone()).or_insert(heard);
            }
        }
        let gone: Vec<String> = self
            .down_since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= timeout)
            .map(|(n, _)| n.clone())
            .collect();
        let mut withdrawn = Vec::new();
        self.followers.retain(|(o, _, _), f| {
            if gone.contains(o) {
                withdrawn.push(f.clone());
                false
            } else {
                true
            }
        });
        withdrawn
    }
}

/// How to reach this cluster's MM.
#[derive(Clone)]
pub struct Manager {
    pub sockets: Vec<PathBuf>,
    /// How long the MM has to answer the handshake and each request made through
    /// [`Manager::call`] or [`Manager::connect_for_calls`]: a frozen MM takes the connection
    /// (the kernel queues it) and never answers, and the agent must not wait on it for good.
    pub answer_within: Duration,
}

impl Manager {
    /// A connection past the handshake, which then waits as long as it takes (a follower's
    /// events come when its job has news).
    pub fn connect(&self) -> Result<Client, String> {
        let mut last = "no control socket".to_string();
        for s in &self.sockets {
            match Client::connect_within(s, Some(self.answer_within)) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A connection whose every request must be answered within `answer_within`.
    pub fn connect_for_calls(&self) -> Result<Client, String> {
        let client = self.connect()?;
        let limit = Some(self.answer_within);
        client
            .sock
            .set_read_timeout(limit)
            .and_then(|()| client.sock.set_write_timeout(limit))
            .map_err(|e| format!("setting the MM connection's timeouts: {e}"))?;
        Ok(client)
    }

    /// One request, answered within `answer_within`.
    pub fn call(&self, req: &Request) -> Result<Reply, String> {
        self.connect_for_calls()?.call(req)
    }

    /// Hands `update` to the MM; how many of its events it took (in order: the rest go
    /// again).
    pub fn report(&self, update: FlockUpdate) -> Result<usize, String> {
        match self.call(&Request::FlockReport(vec![update]))? {
            Reply::FlockTaken(n) => n.first().copied().ok_or_else(|| "no count".into()),
            Reply::Error(e) => Err(e),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }

    /// Cancels job `remote` here (the agent is an operator of this cluster).
    pub fn cancel(&self, remote: JobId) -> Result<(), String> {
        match self.call(&Request::Cancel { job: remote })? {
            Reply::Done => Ok(()),
            Reply::Error(e) => Err(e),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }
}

/// Ends a withdrawn follower's job here (once the MM has taken it: a follower withdrawn
/// before that cancels it itself when it hears its number).
pub fn withdraw(mm: &Manager, f: &Follower) {
    let remote = {
        let mut s = f.state.lock();
        s.withdrawn = true;
        if s.ended { None } else { s.remote }
    };
    if let Some(r) = remote {
        tracing::info!(origin = %f.origin, job = f.job, remote = r, "its home withdrew a flocked job: cancelled here");
        if let Err(e) = mm.cancel(r) {
            tracing::warn!(remote = r, "cannot cancel a withdrawn flocked job: {e}");
        }
    }
}

/// The local account that runs a job of `user` flocked from `peer`: with `same_users`, the
/// account of that name if there is one; else the peer's `flock_user`; never root.
pub fn local_account(user: &str, peer: &PeerEntry, cluster: &str) -> Result<(u32, u32), String> {
    let lookup = |name: &str| {
        nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .map(|u| (u.uid.as_raw(), u.gid.as_raw()))
    };
    let same = if peer.same_users { lookup(user) } else { None };
    let (account, ids) = match same {
        Some(ids) => (user.to_string(), ids),
        None => match &peer.flock_user {
            Some(f) => (
                f.clone(),
                lookup(f).ok_or_else(|| {
                    format!(
                        "[[peer]] {} flock_user {f} has no account on {cluster}",
                        peer.name
                    )
                })?,
            ),
            None if peer.same_users => {
                return Err(format!(
                    "user {user} has no account on {cluster}, and its [[peer]] {} names no \
                     flock_user",
                    peer.name
                ));
            }
            None => {
                return Err(format!(
                    "{cluster}'s [[peer]] {} names no flock_user to run its jobs as (nor \
                     same_users)",
                    peer.name
                ));
            }
        },
    };
    if ids.0 == 0 {
        return Err(format!(
            "{account} is root on {cluster}: flocked jobs never run as root"
        ));
    }
    Ok(ids)
}

/// The submission token of `origin`'s job `job`: the same whenever the job is submitted here
/// again (after this agent or this MM restarted), so that the MM follows the job it made.
pub fn token(origin: &str, job: JobId, since_ms: u64, req: &JobRequest) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ("storm-flock", origin, job, since_ms, req.token, &req.name).hash(&mut h);
    h.finish()
}

/// The follower's thread: submits the job to this cluster's MM for `account`, follows it to
/// its end, and submits it again (the same token: the MM follows the job it made) whenever
/// the MM is lost.
pub fn follow(
    mm: &Manager,
    hosted: &Mutex<Hosted>,
    f: &Follower,
    account: (u32, u32),
    (since_ms, req): (u64, JobRequest),
    stop: &dyn Fn() -> bool,
) {
    let req = JobRequest {
        token: Some(token(&f.origin, f.job, since_ms, &req)),
        ..req
    };
    let mut warned = false;
    while !stop() && !f.state.lock().withdrawn {
        let client = match mm.connect() {
            Ok(c) => c,
            Err(e) => {
                if !warned {
                    tracing::warn!(origin = %f.origin, job = f.job, "cannot reach this cluster's MM for a flocked job: {e}");
                    warned = true;
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let sent = client.request(
            &Request::SubmitFlocked {
                origin: f.origin.clone(),
                uid: account.0,
                gid: account.1,
                req: Box::new(req.clone()),
            },
            None,
        );
        if sent.is_err() {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        // Input is written on it from the link's thread: a frozen MM must not hold that
        // thread for long (a failed write ends the connection, see `Follower::input`).
        let _ = client.sock.set_write_timeout(Some(mm.answer_within));
        let client = Arc::new(client);
        *f.conn.lock() = Some(client.clone());
        loop {
            let event = match client.next() {
                Ok(Reply::Accepted { job, .. }) => {
                    let known = f.state.lock().remote == Some(job);
                    if f.state.lock().withdrawn {
                        let _ = mm.cancel(job);
                    }
                    if known {
                        continue;
                    }
                    FlockEvent::Accepted { remote: job }
                }
                Ok(Reply::Started {
                    ntasks, node_names, ..
                }) => FlockEvent::Started { ntasks, node_names },
                Ok(Reply::Output(c)) => FlockEvent::Output(c),
                Ok(Reply::Requeued { reason, .. }) => FlockEvent::Requeued { reason },
                Ok(Reply::Finished(o)) => FlockEvent::Finished(o),
                Ok(Reply::Error(e)) => FlockEvent::Refused(e),
                Ok(_) => continue,
                Err(_) => break,
            };
            let last = matches!(event, FlockEvent::Finished(_) | FlockEvent::Refused(_));
            f.push(event);
            hosted.lock().flush(f);
            if last {
                *f.conn.lock() = None;
                return;
            }
        }
        *f.conn.lock() = None;
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests;
