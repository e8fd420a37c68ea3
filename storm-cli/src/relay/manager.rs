//! The manager side of the control relay, on the MM's host: checks each node relay's link,
//! then opens a control connection to the MM for the user the link carries (see the module
//! overview in [`super`]).
//!
//! A peer that has not finished its handshake within [`super::HANDSHAKE_TIMEOUT`] is
//! dropped, and at most [`MAX_HANDSHAKES`] handshakes run at once, at most
//! [`MAX_HANDSHAKES_PER_SOURCE`] from one address, so a host that connects and says nothing
//! cannot use up the relay's threads, nor keep the nodes' relays out; refusals are logged
//! within a rate. A program arrives as its bytes and is kept in a file without a name in
//! the relay's own directory (`<state_dir>/relayed-programs`: disk rather than memory, each
//! user's bytes in transit bounded by `[limits] max_spooled_bytes_per_user`), with the
//! stamp (size, mode, mtime) of the user's file,
//! so the MM sees the same program it would have seen on its own host (and its check of a
//! program in place on the nodes compares the same stamp).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use storm_cluster::ClusterConfig;
use storm_cluster::accept_gate::{AcceptGate, Place};
use storm_cluster::control::{self, ConnectionCounts, Reply, Request};
use storm_cluster::daemon_dir::DaemonDir;
use storm_cluster::endpoint::Listen;
use storm_cluster::identity::Enrolled;
use storm_cluster::messages::ProgramStamp;
use storm_primitives::NodeId;
use storm_primitives::log_limit::LogLimit;
use storm_primitives::tcp::auth::ClusterKey;

use super::wire::{self, FRAME_LIMIT, Opened, SealedReader, SealedWriter, Up, WireError};

/// Handshakes that may run at once.
pub const MAX_HANDSHAKES: usize = 64;
/// Of those, from one source address: a host without the keys holds a few places, never all.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 8;

/// What every link's threads share.
struct ManagerRelay {
    /// Where it listens (named to the node relays when its MM does not take a connection).
    addr: std::net::SocketAddr,
    key: ClusterKey,
    names: Vec<String>,
    /// Which nodes are guest slots (lent by another cluster): refused as relays, whatever
    /// key they prove (the lender's root holds it).
    guests: Vec<bool>,
    enrolled: parking_lot::RwLock<Enrolled>,
    /// The MM's control socket; every replica's, in order, for a replicated MM served by one
    /// relay (followers do not listen: the leader's takes the connection); the one replica's
    /// it stands beside, for a relay per replica.
    control_sockets: Vec<PathBuf>,
    max_program_bytes: u64,
    /// Where programs in transit are held: files without names in a directory of the
    /// relay's own (disk, not memory), `<state_dir>/relayed-programs`.
    programs: DaemonDir,
    /// Bytes of programs each user has in transit here, and the most one may
    /// (`[limits] max_spooled_bytes_per_user`, as the MM's bound on what it holds).
    in_transit: Mutex<HashMap<u32, u64>>,
    max_in_transit: u64,
    counts: ConnectionCounts,
    handshakes: AcceptGate,
}

/// Listens on `[relay] address` and serves node relays until the process ends. SIGHUP reads
/// the enrolled nodes' keys again, as it does for the MM.
///
/// `beside`: the replica of a replicated MM this relay stands beside (its `[[manager]]`
/// index). It then listens on that replica's `relay_address` and carries users only to that
/// replica's control socket: while the replica does not lead (it does not listen), a node
/// relay is told so ([`Opened::NoManager`]) and tries the next replica's relay.
///
/// `listen`: bind that address, or take an inherited listening socket (`--listen-fd`: a
/// private instance binds a free port itself and writes it into its cluster file).
pub fn serve(cfg: ClusterConfig, beside: Option<usize>, listen: Listen) -> Result<()> {
    let (addr, control_sockets, state_dir) = match beside {
        None => {
            if cfg.managers.iter().any(|m| m.relay_address.is_some()) {
                anyhow::bail!(
                    "the [[manager]] entries have relay addresses: run one `storm-relay \
                     --manager --replica NAME` beside each replica"
                );
            }
            let addr = cfg.relay.address.context(
                "the cluster file has no [relay] address: set where the manager-side relay \
                 listens",
            )?;
            (addr, cfg.control_sockets(), cfg.cluster.state_dir.clone())
        }
        Some(i) => {
            let m = &cfg.managers[i];
            let addr = m.relay_address.with_context(|| {
                format!(
                    "manager {:?} has no relay_address in the cluster file: set where the \
                     relay beside it listens, or run one relay with [relay] address",
                    m.name
                )
            })?;
            let mine = cfg.as_manager(i).cluster;
            (addr, vec![mine.control_socket], mine.state_dir)
        }
    };
    let programs = DaemonDir::open_or_create(&state_dir.join("relayed-programs"), 0o700)
        .map_err(|e| anyhow::anyhow!("the directory for relayed programs: {e}"))?;
    let key = cfg.load_key()?;
    let enrolled = cfg.load_enrolled().map_err(anyhow::Error::msg)?;
    let listener = storm_cluster::endpoint::listener(listen, addr)
        .map_err(|e| anyhow::anyhow!("[relay] address: {e}"))?;
    let relay = Arc::new(ManagerRelay {
        addr,
        key,
        names: cfg.nodes.iter().map(|n| n.name.clone()).collect(),
        guests: cfg.nodes.iter().map(|n| n.guest_of.is_some()).collect(),
        enrolled: parking_lot::RwLock::new(enrolled),
        control_sockets,
        max_program_bytes: cfg.limits.max_program_bytes,
        programs,
        in_transit: Mutex::new(HashMap::new()),
        max_in_transit: cfg.limits.max_spooled_bytes_per_user,
        counts: ConnectionCounts::new(cfg.limits.max_connections_per_user),
        handshakes: AcceptGate::new(
            "the control relay",
            MAX_HANDSHAKES,
            MAX_HANDSHAKES_PER_SOURCE,
        ),
    });
    // SIGHUP reads the enrolled nodes' keys again, at once, as it does for the MM.
    let reloaded = relay.clone();
    let enrolled_cfg = cfg.clone();
    super::on_sighup(move || match enrolled_cfg.load_enrolled() {
        Ok(e) => {
            *reloaded.enrolled.write() = e;
            tracing::info!("read the enrolled nodes' keys again");
        }
        Err(e) => tracing::error!("keeping the enrolled nodes' keys in use: {e}"),
    })?;
    tracing::info!(%addr, mm = ?relay.control_sockets, "relaying the nodes' users to the machine manager");
    storm_cluster::daemon::notify_ready();
    let mut refused = LogLimit::new(Duration::from_secs(10));
    for conn in listener.incoming() {
        let tcp = match conn {
            Ok(t) => t,
            Err(e) => {
                if let Some(n) = refused.allow(std::time::Instant::now()) {
                    tracing::warn!("accepting a relay link failed: {e} ({n} more since)");
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Some(place) = tcp
            .peer_addr()
            .ok()
            .and_then(|a| relay.handshakes.admit(a.ip()))
        else {
            continue;
        };
        let for_link = relay.clone();
        let spawned = std::thread::Builder::new()
            .name("storm-relay-link".into())
            .spawn(move || for_link.serve_link(tcp, place));
        if let Err(e) = spawned {
            // Its handshake never began: its place went with the closure.
            tracing::warn!("cannot start a thread for a relay link: {e}");
        }
    }
    Ok(())
}

/// The link's writer, used by both of its threads one frame at a time.
struct Down(Mutex<SealedWriter<TcpStream>>);

impl Down {
    fn send<T: serde::Serialize>(&self, reply: &T) -> bool {
        let mut w = self.0.lock().unwrap_or_else(|e| e.into_inner());
        w.send(reply).is_ok()
    }
}

impl ManagerRelay {
    /// The identity key node `node` must prove; none for a guest slot, which no relay
    /// speaks for.
    fn enrolled_key(&self, node: NodeId) -> Option<ed25519_dalek::VerifyingKey> {
        if self.guests.get(node as usize).copied().unwrap_or(true) {
            return None;
        }
        let name = self.names.get(node as usize)?;
        self.enrolled.read().key(name).copied()
    }

    fn serve_link(&self, tcp: TcpStream, place: Place) {
        let peer = tcp.peer_addr().ok();
        super::keep_alive(&tcp);
        let _ = tcp.set_read_timeout(Some(super::HANDSHAKE_TIMEOUT));
        let handshake = match (tcp.try_clone(), tcp.try_clone()) {
            (Ok(r), Ok(w)) => wire::handshake_as_manager(
                r,
                w,
                &self.key,
                self.names.len() as u32,
                |n| self.enrolled_key(n),
                FRAME_LIMIT,
            ),
            (Err(e), _) | (_, Err(e)) => Err(WireError::Io(e)),
        };
        drop(place);
        let (node, link) = match handshake {
            Ok(l) => l,
            Err(WireError::Closed) => {
                self.handshakes.log_failure(
                    peer,
                    &"the link closed during its handshake (a node relay that does not hold \
                      this cluster's key leaves there)",
                );
                return;
            }
            Err(e) => {
                self.handshakes.log_failure(peer, &e);
                return;
            }
        };
        let _ = tcp.set_read_timeout(None);
        let name = self.names[node as usize].clone();
        let down = Arc::new(Down(Mutex::new(link.writer)));
        let mut up = link.reader;
        let (uid, gid, version) = match up.recv::<Up>() {
            Ok(Up::Open { uid, gid, version }) => (uid, gid, version),
            Ok(_) | Err(_) => {
                tracing::warn!(node = %name, "a relay link did not open with its user");
                return;
            }
        };
        let _counted = match self.counts.admit(uid) {
            Ok(c) => c,
            Err(msg) => {
                down.send(&Opened::Refused(msg));
                return;
            }
        };
        let mut failures = Vec::new();
        let mm = self
            .control_sockets
            .iter()
            .find_map(|s| match UnixStream::connect(s) {
                Ok(c) => Some(c),
                Err(e) => {
                    failures.push(format!("{}: {e}", s.display()));
                    None
                }
            });
        let Some(mm) = mm else {
            down.send(&Opened::NoManager(format!(
                "no machine manager takes connections beside the relay at {} ({})",
                self.addr,
                failures.join("; ")
            )));
            return;
        };
        let hello = Request::RelayHello {
            version,
            uid,
            gid,
            node: name.clone(),
        };
        if control::send(&mm, &hello, None).is_err() || !down.send(&Opened::Ready) {
            return;
        }
        let (Ok(mm_in), Ok(mm_closer)) = (mm.try_clone(), mm.try_clone()) else {
            return;
        };
        let Ok(tcp_closer) = tcp.try_clone() else {
            return;
        };
        let to_node = down.clone();
        let down_thread = std::thread::Builder::new()
            .name("storm-relay-reply".into())
            .spawn(move || {
                while let Ok((reply, _)) = control::recv::<Reply>(&mm_in) {
                    if !to_node.send(&reply) {
                        break;
                    }
                }
                let _ = tcp_closer.shutdown(std::net::Shutdown::Both);
            });
        if down_thread.is_err() {
            return;
        }
        if let Err(msg) = self.carry_up(&mut up, &mm, uid) {
            tracing::info!(node = %name, uid, "closing a relayed connection: {msg}");
            down.send(&Reply::Error(msg));
        }
        control::hang_up(&mm_closer);
        let _ = tcp.shutdown(std::net::Shutdown::Both);
    }

    /// Carries a link's requests to the MM until either side goes; an error is for the user.
    fn carry_up(
        &self,
        up: &mut SealedReader<TcpStream>,
        mm: &UnixStream,
        uid: u32,
    ) -> Result<(), String> {
        let mut program: Option<(OwnedFd, InTransit<'_>)> = None;
        loop {
            match up.recv::<Up>() {
                Ok(Up::Program { stamp, regular }) => {
                    // The one before it, if never sent with a request, is let go of first.
                    drop(program.take());
                    program = Some(self.receive_program(up, stamp, regular, uid)?);
                }
                Ok(Up::Request(req)) => {
                    let held = program.take();
                    let fd = held.as_ref().map(|(f, _)| f.as_fd());
                    if control::send(mm, &req, fd).is_err() {
                        return Ok(());
                    }
                }
                Ok(Up::Open { .. } | Up::Chunk(_)) => {
                    return Err("the node's relay sent a frame out of order".into());
                }
                Err(WireError::Closed) => return Ok(()),
                Err(e) => return Err(format!("the relay link failed: {e}")),
            }
        }
    }

    /// Counts `bytes` more of user `uid`'s programs in transit, or says why not.
    fn take_in_transit(&self, uid: u32, bytes: u64) -> Result<InTransit<'_>, String> {
        let mut held = self.in_transit.lock().unwrap_or_else(|e| e.into_inner());
        let now = held.get(&uid).copied().unwrap_or(0);
        if now.saturating_add(bytes) > self.max_in_transit {
            return Err(format!(
                "the control relay already holds {now} bytes of programs on their way to the \
                 machine manager for user {uid}; {bytes} more would pass the limit ([limits] \
                 max_spooled_bytes_per_user = {}); wait for your other submissions",
                self.max_in_transit
            ));
        }
        held.insert(uid, now + bytes);
        Ok(InTransit {
            relay: self,
            uid,
            bytes,
        })
    }

    /// A program's bytes, into a file without a name in the relay's own directory (disk,
    /// counted against user `uid`'s bytes in transit) that carries the user's file's stamp.
    /// What is not a regular file arrives as an empty pipe, which the MM refuses as it would
    /// the user's own descriptor.
    fn receive_program(
        &self,
        up: &mut SealedReader<TcpStream>,
        stamp: ProgramStamp,
        regular: bool,
        uid: u32,
    ) -> Result<(OwnedFd, InTransit<'_>), String> {
        if !regular {
            let (read, _write) =
                nix::unistd::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
            return Ok((read, self.take_in_transit(uid, 0)?));
        }
        if stamp.size > self.max_program_bytes {
            return Err(format!(
                "the program is {} bytes, over the limit for a program sent with its job \
                 ([limits] max_program_bytes = {}); put it where every node can read it and \
                 submit with --no-bcast",
                stamp.size, self.max_program_bytes
            ));
        }
        let counted = self.take_in_transit(uid, stamp.size)?;
        let mut file = self
            .programs
            .anonymous_file()
            .map_err(|e| format!("cannot hold the program: {e}"))?;
        let mut got = 0u64;
        while got < stamp.size {
            let chunk = match up.recv::<Up>() {
                Ok(Up::Chunk(c)) => c,
                Ok(_) => return Err("the node's relay sent a frame out of order".into()),
                Err(e) => return Err(format!("the relay link failed: {e}")),
            };
            got += chunk.len() as u64;
            if got > stamp.size {
                return Err("the node's relay sent more of the program than its size".into());
            }
            file.write_all(&chunk)
                .map_err(|e| format!("cannot hold the program: {e}"))?;
        }
        let fd = OwnedFd::from(file);
        stamp_as(&fd, &stamp).map_err(|e| format!("cannot stamp the program: {e}"))?;
        let mut file = File::from(fd);
        file.rewind()
            .map_err(|e| format!("cannot hold the program: {e}"))?;
        Ok((OwnedFd::from(file), counted))
    }
}

/// Bytes of a user's program in transit, counted until the program has been handed to the
/// MM (or given up).
struct InTransit<'a> {
    relay: &'a ManagerRelay,
    uid: u32,
    bytes: u64,
}

impl Drop for InTransit<'_> {
    fn drop(&mut self) {
        let mut held = self
            .relay
            .in_transit
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.uid) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                held.remove(&self.uid);
            }
        }
    }
}

/// Gives `fd` the mode and modification time of `stamp`.
fn stamp_as(fd: &OwnedFd, stamp: &ProgramStamp) -> nix::Result<()> {
    use nix::sys::stat::{Mode, fchmod, futimens};
    use nix::sys::time::TimeSpec;
    fchmod(fd, Mode::from_bits_truncate(stamp.mode))?;
    let mtime = TimeSpec::new(stamp.mtime_s, i64::from(stamp.mtime_ns));
    futimens(fd, &TimeSpec::UTIME_OMIT, &mtime)
}
