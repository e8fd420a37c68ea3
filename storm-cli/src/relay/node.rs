//! The node side of the control relay: local users' connections, carried to the relay
//! beside the MM (see the module overview in [`super`]).
//!
//! Each user connection gets its own relay link and two threads: one carries the user's
//! requests up (turning a program's descriptor into its stamp and bytes), one carries the
//! MM's replies down. Nothing one user does holds up another's connection: a user who stops
//! reading stalls only their own link's thread, and `[limits] max_connections_per_user`
//! bounds what one user may hold here. SIGHUP reads this node's identity key again, for
//! the connections made after it (node key rotation).

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ed25519_dalek::SigningKey;
use storm_cluster::ClusterConfig;
use storm_cluster::control::{self, ConnectionCounts, ControlError, Reply, Request};
use storm_cluster::daemon_dir::DaemonDir;
use storm_cluster::messages::ProgramStamp;
use storm_primitives::NodeId;
use storm_primitives::tcp::auth::ClusterKey;

use super::wire::{self, CHUNK_BYTES, FRAME_LIMIT, Opened, SealedWriter, Up, WireError};

/// A relay link over TCP.
type Link = wire::Link<TcpStream, TcpStream>;

/// How a manager-side relay answered a user's connection.
enum Opening {
    /// Its MM took it.
    Ready(Link, TcpStream),
    /// Refused for the user (too many connections): no other relay is tried.
    Refused(String),
}

/// What every connection's threads share.
struct NodeRelay {
    /// The manager-side relays, in the order tried (one, or one per replica of a replicated
    /// MM, of which only the leader's takes connections).
    managers: Vec<SocketAddr>,
    /// The one that took the last connection: tried first.
    last_good: AtomicUsize,
    connect_timeout: Duration,
    key: ClusterKey,
    node: NodeId,
    cluster_size: u32,
    /// This node's identity key, read again on SIGHUP (node key rotation, docs/security.md):
    /// links opened after take the new one.
    identity: parking_lot::RwLock<SigningKey>,
    max_request_bytes: usize,
    max_program_bytes: u64,
    counts: ConnectionCounts,
}

/// Binds node `node`'s relay socket and serves it until the process ends.
pub fn serve(cfg: ClusterConfig, node: NodeId) -> Result<()> {
    let managers = cfg.relay_addresses();
    if managers.is_empty() {
        bail!(
            "the cluster file has no [relay] address (nor a relay_address for each \
             [[manager]]): there is no manager-side relay to carry users' connections to"
        );
    }
    let name = cfg.nodes[node as usize].name.clone();
    let cfg_name = name.clone();
    let key = cfg.load_key()?;
    let identity = cfg.load_node_key(&name)?;
    let path = cfg.relay.socket_of(&name);
    let (Some(dir), Some(file)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        bail!(
            "[relay] socket {} needs a directory and a file name",
            path.display()
        );
    };
    let dir = DaemonDir::open_or_create(dir, 0o755)
        .map_err(|e| anyhow::anyhow!("the relay socket's directory: {e}"))?;
    if dir.contains(file) && UnixStream::connect(dir.via_descriptor(file)).is_ok() {
        bail!("another relay already listens on {}", path.display());
    }
    // Every local user may connect; each is told apart by the kernel.
    let listener = dir
        .bind_socket(file, 0o666)
        .with_context(|| format!("cannot create the relay socket {}", path.display()))?;
    let relay = Arc::new(NodeRelay {
        managers: managers.clone(),
        last_good: AtomicUsize::new(0),
        connect_timeout: Duration::from_millis(cfg.tcp.connect_timeout_ms),
        key,
        node,
        cluster_size: cfg.node_count(),
        identity: parking_lot::RwLock::new(identity),
        max_request_bytes: cfg.limits.max_request_bytes as usize,
        max_program_bytes: cfg.limits.max_program_bytes,
        counts: ConnectionCounts::new(cfg.limits.max_connections_per_user),
    });
    // SIGHUP reads this node's identity key again, at once (its default action would end
    // the relay).
    let reloaded = relay.clone();
    super::on_sighup(move || match cfg.load_node_key(&name) {
        Ok(k) => {
            *reloaded.identity.write() = k;
            tracing::info!("read this node's identity key again");
        }
        Err(e) => tracing::error!("keeping this node's identity key in use: {e}"),
    })?;
    tracing::info!(node = %cfg_name, socket = %path.display(), ?managers, "relaying users' control connections");
    storm_cluster::daemon::notify_ready();
    for conn in listener.incoming() {
        match conn {
            Ok(user) => {
                let relay = relay.clone();
                let spawned = std::thread::Builder::new()
                    .name("storm-relay-user".into())
                    .spawn(move || relay.serve_user(user));
                if let Err(e) = spawned {
                    tracing::warn!("cannot start a thread for a user's connection: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("accepting a user's connection failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}

/// The user's socket, written by both of a connection's threads one frame at a time.
struct ToUser(Mutex<UnixStream>);

impl ToUser {
    fn send(&self, reply: &Reply) -> bool {
        let sock = self.0.lock().unwrap_or_else(|e| e.into_inner());
        control::send(&sock, reply, None).is_ok()
    }
}

impl NodeRelay {
    fn serve_user(&self, user: UnixStream) {
        let Ok(out) = user.try_clone() else {
            return;
        };
        let out = Arc::new(ToUser(Mutex::new(out)));
        let (uid, gid) = match control::peer_credentials(&user) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("cannot identify a user's connection: {e}");
                return;
            }
        };
        if let Some(msg) = super::out_of_descriptors() {
            tracing::warn!(uid, "refusing a connection: {msg}");
            out.send(&Reply::Error(msg));
            return;
        }
        let _counted = match self.counts.admit(uid) {
            Ok(c) => c,
            Err(msg) => {
                tracing::warn!(uid, "refusing a connection: {msg}");
                out.send(&Reply::Error(msg));
                return;
            }
        };
        let version = match control::recv_within::<Request>(&user, self.max_request_bytes) {
            Ok((Request::Hello { version }, _)) => version,
            Ok(_) => {
                out.send(&Reply::Error("expected Hello first".into()));
                return;
            }
            Err(_) => return,
        };
        let (link, closer) = match self.open_link(uid, gid, version) {
            Ok(l) => l,
            Err(msg) => {
                tracing::warn!(uid, "{msg}");
                out.send(&Reply::Error(msg));
                return;
            }
        };
        let _ = closer.set_read_timeout(None);
        let mut up = link.writer;
        let mut down = link.reader;
        let down_out = out.clone();
        let user_closer = user.try_clone();
        let down_thread = std::thread::Builder::new()
            .name("storm-relay-down".into())
            .spawn(move || {
                while let Ok(reply) = down.recv::<Reply>() {
                    if !down_out.send(&reply) {
                        break;
                    }
                }
                // The MM (or the link) went: so does the user's connection.
                if let Ok(u) = user_closer {
                    control::hang_up(&u);
                }
            });
        if down_thread.is_err() {
            return;
        }
        self.carry_up(&user, &out, &mut up, uid);
        let _ = closer.shutdown(std::net::Shutdown::Both);
    }

    /// A link, opened for `uid`/`gid`, to a manager-side relay whose MM took the connection:
    /// the one that took the last, then the others in order. The error names what each said.
    fn open_link(&self, uid: u32, gid: u32, version: u32) -> Result<(Link, TcpStream), String> {
        let first = self.last_good.load(Ordering::Relaxed);
        let mut why = Vec::new();
        for k in 0..self.managers.len() {
            let i = (first + k) % self.managers.len();
            match self.open_link_to(self.managers[i], uid, gid, version) {
                Ok(Opening::Ready(link, tcp)) => {
                    self.last_good.store(i, Ordering::Relaxed);
                    return Ok((link, tcp));
                }
                Ok(Opening::Refused(msg)) => return Err(msg),
                Err(e) => why.push(e),
            }
        }
        Err(if why.len() == 1 {
            why.remove(0)
        } else {
            format!(
                "no machine manager takes connections through any of the {} manager-side \
                 relays: {}",
                why.len(),
                why.join("; ")
            )
        })
    }

    /// Connects to the manager side at `addr`, proves who this node is and opens the user's
    /// connection; `Err` says why this relay cannot carry it (another may).
    fn open_link_to(
        &self,
        addr: SocketAddr,
        uid: u32,
        gid: u32,
        version: u32,
    ) -> Result<Opening, String> {
        let tcp = TcpStream::connect_timeout(&addr, self.connect_timeout).map_err(|e| {
            format!(
                "cannot reach the machine manager's relay at {addr}: {e} (is storm-relay \
                 --manager running there?)"
            )
        })?;
        super::keep_alive(&tcp);
        // A manager side that answers nothing does not hold the user forever.
        let _ = tcp.set_read_timeout(Some(super::HANDSHAKE_TIMEOUT));
        let (Ok(r), Ok(w)) = (tcp.try_clone(), tcp.try_clone()) else {
            return Err(format!("cannot use the link to the relay at {addr}"));
        };
        let failed =
            |e: WireError| format!("the relay at {addr} could not reach the machine manager: {e}");
        let mut link = wire::handshake_as_node(
            r,
            w,
            &self.key,
            self.node,
            self.cluster_size,
            &self.identity.read().clone(),
            FRAME_LIMIT,
        )
        .map_err(failed)?;
        link.writer
            .send(&Up::Open { uid, gid, version })
            .map_err(failed)?;
        match link.reader.recv::<Opened>().map_err(failed)? {
            Opened::Ready => Ok(Opening::Ready(link, tcp)),
            Opened::NoManager(why) => Err(why),
            Opened::Refused(msg) => Ok(Opening::Refused(msg)),
        }
    }

    /// Carries the user's requests up until either side goes.
    fn carry_up(
        &self,
        user: &UnixStream,
        out: &ToUser,
        up: &mut SealedWriter<TcpStream>,
        uid: u32,
    ) {
        loop {
            let (req, mut fds) = match control::recv_within::<Request>(user, self.max_request_bytes)
            {
                Ok(r) => r,
                Err(ControlError::TooLarge { len, limit }) => {
                    out.send(&Reply::Error(format!(
                        "a request of {len} bytes exceeds the limit of {limit} bytes ([limits] \
                         max_request_bytes); submit fewer environment variables or arguments"
                    )));
                    return;
                }
                Err(_) => return,
            };
            if let Some(fd) = fds.pop() {
                if let Err(msg) = self.send_program(fd, up) {
                    tracing::info!(uid, "refusing a program: {msg}");
                    out.send(&Reply::Error(msg));
                    return;
                }
            }
            if up.send(&Up::Request(req)).is_err() {
                return;
            }
        }
    }

    /// Sends the program behind the user's descriptor: its stamp, then its bytes. The
    /// descriptor is the user's own (their command opened it), so reading it reads only
    /// what they could read.
    fn send_program(&self, fd: OwnedFd, up: &mut SealedWriter<TcpStream>) -> Result<(), String> {
        let file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot read the program sent with the job: {e}"))?;
        let stamp = ProgramStamp::of(&meta);
        let regular = meta.is_file();
        if regular && stamp.size > self.max_program_bytes {
            return Err(format!(
                "the program is {} bytes, over the limit for a program sent with its job \
                 ([limits] max_program_bytes = {}); put it where every node can read it and \
                 submit with --no-bcast",
                stamp.size, self.max_program_bytes
            ));
        }
        let size = stamp.size;
        let sent = |e: wire::WireError| format!("the link to the machine manager failed: {e}");
        up.send(&Up::Program { stamp, regular }).map_err(sent)?;
        if !regular {
            return Ok(());
        }
        let mut offset = 0u64;
        let mut buf = vec![0u8; CHUNK_BYTES];
        while offset < size {
            let want = (size - offset).min(CHUNK_BYTES as u64) as usize;
            let n = file
                .read_at(&mut buf[..want], offset)
                .map_err(|e| format!("cannot read the program sent with the job: {e}"))?;
            if n == 0 {
                return Err(format!(
                    "the program changed while it was read: it has {offset} bytes, not the \
                     {size} it had a moment before; submit again once it is written"
                ));
            }
            up.send(&Up::Chunk(buf[..n].to_vec())).map_err(sent)?;
            offset += n as u64;
        }
        Ok(())
    }
}
