//! The MM's control socket: accepts storm-submit and storm, and turns their requests into
//! messages for the main loop, which alone decides. Each connection has a reader thread
//! (handshake, then requests) and a writer thread (replies, including streamed output). The
//! writer counts the replies it has written, so the main loop knows when output it passed on
//! is safely with the client (and may be let go of on the node; see `manager::output`).
//!
//! Descriptors are a resource every user shares: each connection holds three, and a program
//! sent with a job one more until the MM has copied it. A new connection, or a request that
//! brings a descriptor, is refused with the reason once fewer than [`USER_RESERVE`]
//! descriptors are left, so the last ones stay for root and the MM's own user (`storm
//! nodes`, `storm cancel`) and for the MM's own files.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use storm_cluster::config::LimitsSection;
use storm_cluster::control::{
    self, ConnectionCounts, ControlError, PROTOCOL_VERSION, Reply, Request,
};
use storm_cluster::daemon_dir::DaemonDir;
use storm_primitives::log_limit::LogLimit;

pub use crate::env::ClientId;

/// What the control threads tell the main loop.
pub enum Incoming {
    Connected {
        client: ClientId,
        uid: u32,
        gid: u32,
        /// The node a control relay says the user is on.
        relayed_from: Option<String>,
        tx: Sender<Reply>,
        /// Replies written to the client's socket so far.
        written: Arc<AtomicU64>,
        /// The connection, to close it when the client breaks a limit.
        closer: UnixStream,
    },

    Request {
        client: ClientId,
        req: Request,
        fds: Vec<OwnedFd>,
    },
    Gone {
        client: ClientId,
    },
}

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

/// Descriptors kept free of users' connections and programs: for operators, and for the MM.
pub const USER_RESERVE: u64 = 64;
/// Descriptors kept free of operators' connections: for the MM itself (journal, transfers).
pub const OPERATOR_RESERVE: u64 = 16;

/// An MM that does not run as root is one user's private instance (`storm start`, an
/// embedded cluster): its launchers cannot become anyone else, and no other user may see or
/// touch its queue. Only its own user, and root, are served.
fn private_instance_admits(operator: u32, uid: u32) -> Result<(), String> {
    if operator == 0 || uid == operator || uid == 0 {
        return Ok(());
    }
    Err(format!(
        "this machine manager runs as uid {operator}, not as root: it is that user's private \
         instance and serves no other user (uid {uid})"
    ))
}

/// Why a new connection or descriptor of user `uid` is refused, if it is: fewer than the
/// reserve of descriptors would be left.
fn out_of_descriptors(uid: u32, operator: u32) -> Option<String> {
    let reserve = if uid == 0 || uid == operator {
        OPERATOR_RESERVE
    } else {
        USER_RESERVE
    };
    let (open, limit) = storm_cluster::daemon::descriptors();
    (open + reserve >= limit).then(|| {
        format!(
            "the machine manager has {open} of its {limit} file descriptors in use and keeps \
             the last {reserve} for the cluster's operators; try again when jobs have ended \
             (an operator can raise the MM's LimitNOFILE)"
        )
    })
}

/// How long a new connection has to greet the MM (`Hello`, or a relay's `RelayHello`)
/// before it is dropped: storm-submit and storm greet at once; a connection that says
/// nothing only holds a thread and descriptors.
pub const GREETING_DEADLINE: Duration = Duration::from_secs(5);

/// Whom a control relay may act for (docs/security.md, "The control relay"). A relay's word
/// is its node's root's: it names the user, and nothing more of it is taken.
#[derive(Debug, Clone, Default)]
pub struct RelayedUsers {
    /// `[relay] min_uid`: no relay acts for a system account below it (root apart, whose
    /// rights through a relay are the core's to decide).
    pub min_uid: u32,
    /// Guest slots: nodes another cluster lends this one. Their keys are on the lender's
    /// nodes, whose root is not this cluster's to trust, so no relay acts from them.
    pub guest_slots: std::collections::BTreeSet<String>,
}

impl RelayedUsers {
    /// The rules of the cluster file `cfg`.
    pub fn of(cfg: &storm_cluster::ClusterConfig) -> Self {
        Self {
            min_uid: cfg.relay.min_uid,
            guest_slots: cfg
                .nodes
                .iter()
                .filter(|n| n.guest_of.is_some())
                .map(|n| n.name.clone())
                .collect(),
        }
    }

    /// The user and group a relay on `node` may act for when it names `uid`: the group is
    /// the user's own, from this host's user database (a relay's word for it would let root
    /// of a node run jobs with any group, root's or shadow's); or why not.
    fn resolve(&self, uid: u32, node: &str) -> Result<(u32, u32), String> {
        if self.guest_slots.contains(node) {
            return Err(format!(
                "node {node} is a guest slot (a node another cluster lends this one): its keys \
                 are on the lender's node, so no control relay acts from it"
            ));
        }
        if uid != 0 && uid < self.min_uid {
            return Err(format!(
                "a control relay may not act for uid {uid}: system accounts below [relay] \
                 min_uid = {} are not reached through relays",
                self.min_uid
            ));
        }
        match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
            Ok(Some(user)) => Ok((uid, user.gid.as_raw())),
            Ok(None) => Err(format!(
                "uid {uid} has no account on the machine manager's host; a relayed user must \
                 have one there (the same user database as the nodes')"
            )),
            Err(e) => Err(format!(
                "cannot look uid {uid} up on the machine manager's host: {e}"
            )),
        }
    }
}

/// What every connection thread shares: the cluster's identity, the limits, and how many
/// connections each user has open.
struct Shared {
    cluster: String,
    /// The MM's own user, an operator as root is.
    operator: u32,
    nodes: u32,
    limits: LimitsSection,
    relayed: RelayedUsers,
    open: ConnectionCounts,
    /// Connections that have not greeted yet, counted by the user the kernel says is at
    /// the other end (a relay's, before it names its user): bounded as `open` is, so no
    /// user holds more threads and descriptors with silent connections than with live ones.
    ungreeted: ConnectionCounts,
    /// Each ungreeted connection's descriptor (open while listed, as in `connections`) and
    /// its greeting deadline: the accepting thread shuts those past it down.
    greeting: parking_lot::Mutex<HashMap<ClientId, (RawFd, std::time::Instant)>>,
    /// Refusals are logged at most a few per 10 s: a user opening connections in a loop
    /// must not fill the MM's log.
    refusals: parking_lot::Mutex<LogLimit>,
    to_main: Sender<Incoming>,
    /// Wakes the MM's loop when a message is sent to it.
    wake: crate::Waker,
    /// Every connection being served (its reader's descriptor, open while it is listed: a
    /// connection's thread delists it before closing it), to end its reading when the server
    /// stops; `None` once it has (a connection made since is ended as it registers). Not a
    /// descriptor of its own: each connection holds three, and users share the MM's.
    connections: parking_lot::Mutex<Option<HashMap<ClientId, RawFd>>>,
}

/// A connection's place in [`Shared::connections`], given up when its thread ends.
struct Registered<'a> {
    shared: &'a Shared,
    client: ClientId,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(all) = self.shared.connections.lock().as_mut() {
            all.remove(&self.client);
        }
    }
}

impl Shared {
    /// Lists connection `client` (read through `sock`) until the returned guard drops, which
    /// must be before `sock` closes; a server that stopped already ends its reading at once.
    fn register<'a>(&'a self, client: ClientId, sock: &UnixStream) -> Registered<'a> {
        match self.connections.lock().as_mut() {
            Some(all) => {
                all.insert(client, sock.as_raw_fd());
            }
            None => control::stop_reading(sock),
        }
        Registered {
            shared: self,
            client,
        }
    }

    /// Ends the reading of every connection being served: each reader sees the end and
    /// tells the main loop the client went (or finds the main loop gone), and its thread
    /// ends, with what it holds of the MM (its waker, and through it the endpoint). Replies
    /// already queued still go out.
    fn stop_all(&self) {
        if let Some(all) = self.connections.lock().take() {
            for &fd in all.values() {
                // SAFETY: a listed descriptor is open (its thread delists it, under this
                // lock, before closing it), and shutdown does not close it.
                unsafe { libc::shutdown(fd, libc::SHUT_RD) };
            }
        }
    }
}

/// A connection's place in [`Shared::greeting`], given up once it greeted (or its thread
/// ends), which must be before its socket closes.
struct AwaitingGreeting<'a> {
    shared: &'a Shared,
    client: ClientId,
}

impl Drop for AwaitingGreeting<'_> {
    fn drop(&mut self) {
        self.shared.greeting.lock().remove(&self.client);
    }
}

impl Shared {
    /// Lists connection `client` as owing its greeting by [`GREETING_DEADLINE`] from now.
    fn await_greeting<'a>(&'a self, client: ClientId, sock: &UnixStream) -> AwaitingGreeting<'a> {
        let deadline = std::time::Instant::now() + GREETING_DEADLINE;
        self.greeting
            .lock()
            .insert(client, (sock.as_raw_fd(), deadline));
        AwaitingGreeting {
            shared: self,
            client,
        }
    }

    /// Shuts down every connection past its greeting deadline: its reader sees the end and
    /// its thread goes, closing it. Returns how many.
    fn drop_silent(&self, now: std::time::Instant) -> usize {
        let mut greeting = self.greeting.lock();
        let late: Vec<ClientId> = greeting
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(&c, _)| c)
            .collect();
        for c in &late {
            if let Some((fd, _)) = greeting.remove(c) {
                // SAFETY: a listed descriptor is open (its thread delists it, under this
                // lock, before closing it), and shutdown does not close it.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
        }
        late.len()
    }

    /// Logs a refused connection, unless many were refused lately.
    fn log_refusal(&self, uid: u32, msg: &str) {
        if let Some(n) = self.refusals.lock().allow(std::time::Instant::now()) {
            tracing::warn!(
                uid,
                "refusing a control connection: {msg} ({n} more refused since the last such line)"
            );
        }
    }
}

impl Shared {
    /// Hands `msg` to the MM's loop and wakes it; false once the MM is gone.
    fn tell_main(&self, msg: Incoming) -> bool {
        let sent = self.to_main.send(msg).is_ok();
        self.wake.wake();
        sent
    }
}

impl Shared {
    /// Who a connection acts for, from its first request: the user on the other end for
    /// `Hello`; for a relay's `RelayHello`, the user it names, with that user's own group
    /// (the relay's word for the group is not taken), and their node, if the relay runs as
    /// root or the MM's own user and [`RelayedUsers`] allows it. (What root of a node may do
    /// through a relay is the core's to decide: `[relay] root_from_nodes`.)
    fn identify(
        &self,
        peer_uid: u32,
        peer_gid: u32,
        first: Request,
    ) -> Result<(u32, u32, Option<String>), String> {
        let (version, who) = match first {
            Request::Hello { version } => (version, (peer_uid, peer_gid, None)),
            Request::RelayHello {
                version,
                uid,
                gid,
                node,
            } => {
                if peer_uid != 0 && peer_uid != self.operator {
                    return Err(format!(
                        "user {peer_uid} sent a relay's greeting: only a control relay \
                         running as root or as the machine manager's own user may act for \
                         other users"
                    ));
                }
                let (uid, own_gid) = self.relayed.resolve(uid, &node)?;
                if gid != own_gid {
                    tracing::debug!(
                        uid,
                        said = gid,
                        gid = own_gid,
                        node,
                        "a relay named another group than the user's own: the user's is used"
                    );
                }
                tracing::debug!(uid, gid = own_gid, node, "a relayed control connection");
                (version, (uid, own_gid, Some(node)))
            }
            _ => return Err("expected Hello first".into()),
        };
        if version != PROTOCOL_VERSION {
            return Err(format!(
                "control protocol {version} is not supported; this MM speaks {PROTOCOL_VERSION}"
            ));
        }
        private_instance_admits(self.operator, who.0)?;
        Ok(who)
    }
}

/// The control socket's accepting thread; dropping it stops accepting, and removes the socket
/// (an MM core that stops, such as a replica that no longer leads, takes no more clients).
/// Connections already made end as the core's environment hangs them up.
pub struct ControlServer {
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
    dir: DaemonDir,
    name: String,
    shared: Arc<Shared>,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = self.dir.remove_file(&self.name);
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // Connections the core never heard of (made in its last moments, their greeting
        // still on the way) would otherwise keep their threads, and the endpoint, until
        // their clients left: a replica deposed under load could not lead again.
        self.shared.stop_all();
    }
}

/// How long the accepting thread waits for a connection before it looks whether to stop.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// Binds the control socket (replacing a stale one) and starts accepting. The socket's
/// directory must be the MM's alone (see `storm_cluster::daemon_dir`): it is bound and given
/// its mode through the directory's descriptor.
pub fn start(
    path: &Path,
    cluster: String,
    nodes: u32,
    limits: LimitsSection,
    relayed: RelayedUsers,
    to_main: Sender<Incoming>,
    wake: crate::Waker,
) -> anyhow::Result<ControlServer> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        anyhow::bail!(
            "the control socket {} needs a directory and a file name",
            path.display()
        );
    };
    let dir = DaemonDir::open_or_create(dir, 0o755)
        .map_err(|e| anyhow::anyhow!("the control socket's directory: {e}"))?;
    if dir.contains(name) && UnixStream::connect(dir.via_descriptor(name)).is_ok() {
        anyhow::bail!(
            "another machine manager already listens on {}",
            path.display()
        );
    }
    // Every local user may submit; the MM checks who they are on each request.
    let listener = dir
        .bind_socket(name, 0o666)
        .map_err(|e| anyhow::anyhow!("cannot create the control socket {}: {e}", path.display()))?;
    let max_connections = limits.max_connections_per_user;
    let shared = Arc::new(Shared {
        cluster,
        operator: nix::unistd::geteuid().as_raw(),
        nodes,
        limits,
        relayed,
        open: ConnectionCounts::new(max_connections),
        ungreeted: ConnectionCounts::new(max_connections),
        greeting: parking_lot::Mutex::new(HashMap::new()),
        refusals: parking_lot::Mutex::new(LogLimit::with_burst(Duration::from_secs(10), 20)),
        to_main,
        wake,
        connections: parking_lot::Mutex::new(Some(HashMap::new())),
    });
    let served = shared.clone();
    // Polled, so that the thread can stop (a blocked accept would never return).
    listener
        .set_nonblocking(true)
        .map_err(|e| anyhow::anyhow!("the control socket {}: {e}", path.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let accept = std::thread::Builder::new()
        .name("storm-mm-accept".into())
        .spawn(move || {
            let mut refused = LogLimit::new(Duration::from_secs(10));
            let mut silent = LogLimit::new(Duration::from_secs(10));
            while !stopped.load(Ordering::Acquire) {
                let now = std::time::Instant::now();
                let dropped = shared.drop_silent(now);
                if dropped > 0
                    && let Some(n) = silent.allow(now)
                {
                    tracing::warn!(
                        "dropped {} control connection(s) that did not greet the MM within {} s",
                        dropped as u64 + n,
                        GREETING_DEADLINE.as_secs()
                    );
                }
                match listener.accept() {
                    // Accepted sockets do not inherit the listener's non-blocking mode.
                    Ok((sock, _)) => serve(sock, shared.clone()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        let fd = std::os::fd::AsFd::as_fd(&listener);
                        let mut polled = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
                        let _ = nix::poll::poll(
                            &mut polled,
                            nix::poll::PollTimeout::from(ACCEPT_POLL.as_millis() as u16),
                        );
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // Out of descriptors (or threads): waiting frees some, and spinning
                        // on accept would only fill the log.
                        if let Some(n) = refused.allow(std::time::Instant::now()) {
                            tracing::warn!(
                                "control socket accept failed: {e} ({n} more since the last warning)"
                            );
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })?;
    Ok(ControlServer {
        stop,
        accept: Some(accept),
        dir,
        name: name.to_string(),
        shared: served,
    })
}

fn serve(sock: UnixStream, shared: Arc<Shared>) {
    let client = NEXT_CLIENT.fetch_add(1, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name(format!("storm-mm-client-{client}"))
        .spawn(move || run_client(client, sock, &shared));
    if let Err(e) = spawned {
        // The connection closes as `sock` drops with the closure.
        tracing::warn!("cannot start a thread for a control client: {e}");
    }
}

/// Identifies the client, checks its limits and protocol version, then passes its requests
/// to the main loop until it goes.
fn run_client(client: ClientId, sock: UnixStream, shared: &Shared) {
    // Delisted (dropped) before `sock`, a parameter, closes.
    let _registered = shared.register(client, &sock);
    let refuse = |msg: String| {
        let _ = control::send(&sock, &Reply::Error(msg), None);
    };
    let (peer_uid, peer_gid) = match control::peer_credentials(&sock) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("cannot identify a control client: {e}");
            return;
        }
    };
    if let Some(msg) = out_of_descriptors(peer_uid, shared.operator) {
        shared.log_refusal(peer_uid, &msg);
        return refuse(msg);
    }
    // Counted by who is at the other end until it greets, and dropped if it has not by the
    // deadline.
    let ungreeted = match shared.ungreeted.admit(peer_uid) {
        Ok(c) => c,
        Err(msg) => {
            let msg = format!("{msg} (counting those that have not greeted it yet)");
            shared.log_refusal(peer_uid, &msg);
            return refuse(msg);
        }
    };
    let awaiting = shared.await_greeting(client, &sock);
    let limit = shared.limits.max_request_bytes as usize;
    let first = control::recv_within::<Request>(&sock, limit);
    drop(awaiting);
    drop(ungreeted);
    let first = match first {
        Ok((req, _)) => req,
        Err(e) => {
            tracing::debug!("control client left during the handshake: {e}");
            return;
        }
    };
    let (uid, gid, relayed_from) = match shared.identify(peer_uid, peer_gid, first) {
        Ok(who) => who,
        Err(msg) => {
            shared.log_refusal(peer_uid, &msg);
            return refuse(msg);
        }
    };
    // A relayed user keeps to a user's reserve, not to the relay's.
    if uid != peer_uid
        && let Some(msg) = out_of_descriptors(uid, shared.operator)
    {
        tracing::warn!(uid, "refusing a relayed control connection: {msg}");
        return refuse(msg);
    }
    let _counted = match shared.open.admit(uid) {
        Ok(c) => c,
        Err(msg) => {
            shared.log_refusal(uid, &msg);
            return refuse(msg);
        }
    };
    let hello = Reply::Hello {
        version: PROTOCOL_VERSION,
        cluster: shared.cluster.clone(),
        nodes: shared.nodes,
    };
    if control::send(&sock, &hello, None).is_err() {
        return;
    }
    let (tx, rx) = crossbeam_channel::unbounded();
    let Ok(writer_sock) = sock.try_clone() else {
        return;
    };
    let Ok(closer) = sock.try_clone() else {
        return;
    };
    let written = Arc::new(AtomicU64::new(0));
    let counter = written.clone();
    let writer = std::thread::Builder::new()
        .name(format!("storm-mm-reply-{client}"))
        .spawn(move || write_replies(writer_sock, rx, &counter));
    if writer.is_err() {
        return refuse("the machine manager cannot start a thread for this client".into());
    }
    // The last word to a client dropped for a request over the limit.
    let last_word = tx.clone();
    let connected = Incoming::Connected {
        client,
        uid,
        gid,
        relayed_from,
        tx,
        written,
        closer,
    };
    if !shared.tell_main(connected) {
        return;
    }
    loop {
        match control::recv_within::<Request>(&sock, limit) {
            Ok((req, fds)) => {
                // A program's descriptor is held until the MM has copied it.
                if !fds.is_empty()
                    && let Some(msg) = out_of_descriptors(uid, shared.operator)
                {
                    tracing::warn!(client, uid, "refusing a request: {msg}");
                    drop(fds);
                    let _ = last_word.send(Reply::Error(msg));
                    continue;
                }
                if !shared.tell_main(Incoming::Request { client, req, fds }) {
                    break;
                }
            }
            Err(ControlError::Closed) => break,
            Err(ControlError::TooLarge { len, limit }) => {
                // Unread, the rest of the frame leaves the stream out of step: close it.
                let msg = format!(
                    "a request of {len} bytes exceeds the limit of {limit} bytes ([limits] \
                     max_request_bytes); submit fewer environment variables or arguments"
                );
                tracing::warn!(client, uid, "dropping a control client: {msg}");
                let _ = last_word.send(Reply::Error(msg));
                break;
            }
            Err(e) => {
                tracing::warn!(client, "dropping a control client: {e}");
                break;
            }
        }
    }
    shared.tell_main(Incoming::Gone { client });
}

fn write_replies(sock: UnixStream, rx: Receiver<Reply>, written: &AtomicU64) {
    for reply in rx {
        if control::send(&sock, &reply, None).is_err() {
            break;
        }
        written.fetch_add(1, Ordering::Release);
    }
    drop(sock);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root MM serves everyone; one running as a user serves that user and root only.
    #[test]
    fn a_private_instance_serves_its_own_user_alone() {
        assert!(private_instance_admits(0, 1000).is_ok());
        assert!(private_instance_admits(1000, 1000).is_ok());
        assert!(private_instance_admits(1000, 0).is_ok());
        let refused = private_instance_admits(1000, 1001).unwrap_err();
        assert!(refused.contains("private instance"), "{refused}");
    }

    /// A connection whose greeting the main loop never took up (it was still queued when the
    /// core stopped: a replica deposed while clients reconnected) ends with the server: its
    /// client sees the connection close and goes to find the MM, and its threads let go of
    /// what they hold of the MM (the waker, and through it the endpoint, which the replica
    /// binds again when it next leads). Before, the reader waited for the client forever.
    #[test]
    fn stopping_the_server_ends_connections_the_main_loop_never_took_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mm.sock");
        let (to_main, from_clients) = crossbeam_channel::unbounded();
        let server = start(
            &path,
            "test".into(),
            1,
            LimitsSection::default(),
            RelayedUsers::default(),
            to_main,
            crate::Waker::none(),
        )
        .unwrap();
        let client = UnixStream::connect(&path).unwrap();
        control::send(
            &client,
            &Request::Hello {
                version: PROTOCOL_VERSION,
            },
            None,
        )
        .unwrap();
        let (hello, _) = control::recv::<Reply>(&client).unwrap();
        assert!(matches!(hello, Reply::Hello { .. }), "{hello:?}");
        // The greeting reaches the main loop's channel, which nobody reads.
        let connected = from_clients.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(connected, Incoming::Connected { .. }));
        drop(server);
        // The main loop is gone, with what it had not taken up.
        drop(connected);
        drop(from_clients);
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        match control::recv::<Reply>(&client) {
            Err(ControlError::Closed) => {}
            other => panic!("the connection should have closed, got {other:?}"),
        }
    }
}
