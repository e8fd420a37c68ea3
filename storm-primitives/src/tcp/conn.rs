//! Connections between tcp nodes.
//!
//! A node keeps at most one outgoing connection per peer in its table and sends everything for
//! that peer through it, so frames to one peer stay in order. Senders write to the socket
//! directly when they can (see [`Conn`]); each connection also has a writer thread (which makes
//! the connection, so a slow connect never blocks the caller, and writes what the socket could
//! not take at once) and a reader thread that decodes frames and hands them to the node.
//!
//! Every connection opens with a handshake, made within `connect_timeout` as a whole: the
//! protocol version, cluster size, layout fingerprint and frame protection must match, and
//! each side proves with a fresh nonce from the other that it holds the cluster key
//! ([`super::auth`]). After it, every frame carries a tag, checked before the frame is acted
//! on or its data written to memory; one that fails closes the connection and is logged with
//! the peer's address. A refused peer is told only "refused".
//! When a connection fails, the node is told once, and every operation waiting on that peer
//! fails at once instead of waiting for its timeout.

use std::collections::VecDeque;
use std::io::{BufReader, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::auth::{Opener, Sealer, Transcript, random_bytes};
use super::node::Inner;
use super::wire::{
    self, Control, DATA_PREFIX_LEN, Frame, HEADER_LEN, Hello, KIND_DATA, OutFrame, WireError,
    read_frame,
};
use crate::log_limit::LogLimit;
use crate::nodeset::NodeId;

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

/// The largest handshake frame accepted (a `Hello` is under 100 bytes).
const MAX_HANDSHAKE_FRAME: usize = 4096;

/// Something waiting for the writer thread: a frame not sealed yet (it gets its sequence
/// number when it goes out), or the rest of a sealed one that the fast path began.
enum Queued {
    Frame(OutFrame),
    Raw(Bytes),
}

/// What waits for the writer thread, in order.
#[derive(Default)]
struct Outbox {
    /// The socket (a duplicate owned here, so it lives exactly as long as senders may use it),
    /// once connected and past the handshake.
    sock: Option<TcpStream>,
    /// Seals outgoing frames, from the handshake on.
    sealer: Option<Sealer>,
    queue: VecDeque<Queued>,
    /// The writer thread is writing bytes it took from the queue.
    busy: bool,
    closing: bool,
}

/// One TCP connection to a peer.
///
/// Sending tries the fast path first: when nothing is queued and the writer thread is idle,
/// the caller writes the frame itself with a non-blocking `sendmsg`, which costs no thread
/// hand-off. Whatever does not fit in the socket buffer (and everything sent while the
/// connection is still opening) goes to the writer thread, which blocks on the socket so that
/// no caller ever does: two nodes forwarding to each other can never deadlock on full buffers.
pub(crate) struct Conn {
    pub peer: NodeId,
    pub id: u64,
    out: Mutex<Outbox>,
    wake: Condvar,
    closed: AtomicBool,
    stream: Mutex<Option<TcpStream>>,
}

/// Writes as much of `parts` as the socket takes now, without blocking. Returns the bytes
/// written, or an error for a broken connection.
fn send_nonblocking(fd: RawFd, parts: &[&[u8]]) -> std::io::Result<usize> {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: iov points to live slices for the duration of the call.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = std::io::Error::last_os_error();
        match err.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(err),
        }
    }
}

impl Conn {
    fn new(peer: NodeId) -> Arc<Conn> {
        Arc::new(Conn {
            peer,
            id: NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed),
            out: Mutex::new(Outbox::default()),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
            stream: Mutex::new(None),
        })
    }

    /// Sends a frame (in order with everything sent before); false if the connection is closed.
    pub fn send(&self, frame: OutFrame) -> bool {
        if self.is_closed() {
            return false;
        }
        let mut out = self.out.lock();
        if out.closing {
            return false;
        }
        let out = &mut *out;
        if let (Some(sock), Some(sealer)) = (&out.sock, out.sealer.as_mut())
            && !out.busy
            && out.queue.is_empty()
        {
            // Next in line: sealed now, written as far as the socket takes it.
            let head = frame.head();
            let (body, tag) = sealer.seal(head, frame.body.clone());
            let parts = [head, &body[..], &tag[..]];
            // An error is noticed and reported once by the writer thread or the reader;
            // the frame stays queued meanwhile.
            let mut skip = send_nonblocking(sock.as_raw_fd(), &parts).unwrap_or(0);
            if skip == head.len() + body.len() + tag.len() {
                return true;
            }
            for part in [Bytes::copy_from_slice(head), body, tag] {
                if skip >= part.len() {
                    skip -= part.len();
                } else {
                    out.queue.push_back(Queued::Raw(part.slice(skip..)));
                    skip = 0;
                }
            }
            self.wake.notify_one();
            return true;
        }
        out.queue.push_back(Queued::Frame(frame));
        self.wake.notify_one();
        true
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Past the handshake and open.
    pub fn is_connected(&self) -> bool {
        !self.is_closed() && self.out.lock().sock.is_some()
    }

    /// Marks the connection closed; true for the first caller only.
    pub fn mark_closed(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// Closes the socket; the reader and writer threads end.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(s) = self.stream.lock().take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let mut out = self.out.lock();
        out.closing = true;
        out.sock = None;
        self.wake.notify_all();
    }

    /// Makes the connection usable for direct sends, sealing with `sealer`.
    fn set_connected(&self, stream: &TcpStream, sealer: Sealer) {
        let mut out = self.out.lock();
        out.sealer = Some(sealer);
        if !out.closing {
            out.sock = stream.try_clone().ok();
        }
    }
}

fn hello_for(inner: &Inner, nonce: [u8; 32]) -> Hello {
    Hello {
        node: inner.id,
        cluster_size: inner.all.len() as u32,
        layout_fingerprint: inner.layout.fingerprint(),
        protection: inner.config.protection.code(),
        nonce,
    }
}

/// Why we refuse a peer's handshake, if we do (logged here, never told to the peer).
fn check_hello(inner: &Inner, h: &Hello) -> Result<(), String> {
    if h.cluster_size != inner.all.len() as u32 {
        return Err(format!(
            "cluster size differs: peer says {}, this node says {}",
            h.cluster_size,
            inner.all.len()
        ));
    }
    if h.node >= h.cluster_size || h.node == inner.id {
        return Err(format!("peer claims impossible node id {}", h.node));
    }
    if h.layout_fingerprint != inner.layout.fingerprint() {
        return Err(format!(
            "global-memory layout differs (peer {:016x}, this node {:016x})",
            h.layout_fingerprint,
            inner.layout.fingerprint()
        ));
    }
    if h.protection != inner.config.protection.code() {
        return Err(format!(
            "frame protection differs (peer {}, this node {:?})",
            h.protection, inner.config.protection
        ));
    }
    Ok(())
}

/// What a handshake binds, from either side.
fn transcript(
    inner: &Inner,
    client: NodeId,
    server: NodeId,
    c: &[u8; 32],
    s: &[u8; 32],
) -> Transcript {
    Transcript::new(
        client,
        server,
        inner.all.len() as u32,
        inner.layout.fingerprint(),
        inner.config.protection,
        c,
        s,
    )
}

/// Reads from a socket until a deadline for the whole exchange, not per read: a peer that
/// trickles its handshake a byte at a time still runs out of time.
struct Deadline<'a> {
    stream: &'a TcpStream,
    at: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the handshake took too long",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        (&*self.stream).read(buf)
    }
}

/// Reads one handshake frame before `at`.
fn read_handshake(stream: &TcpStream, at: Instant) -> Result<Control, String> {
    match read_frame(&mut Deadline { stream, at }, MAX_HANDSHAKE_FRAME) {
        Ok(Frame::Control(c)) => Ok(c),
        Ok(Frame::Data(_)) => Err("a data frame during the handshake".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The handshakes a node is making with accepted connections, capped in total
/// (`max_handshakes`) and per source address (`max_handshakes_per_source`): a flood from one
/// host can hold a few places, never all of them, so the cluster's own nodes still get in.
/// Refusals and failed handshakes are logged at most [`REFUSAL_LOG_BURST`] times every
/// [`REFUSAL_LOG_INTERVAL`], with the count in between: each is logged while they are rare, and
/// a peer without the key cannot fill the disk with warnings.
#[derive(Default)]
pub(crate) struct Handshakes {
    state: Mutex<HandshakeCount>,
}

/// How often refused or failed handshakes are logged at most (the rest are counted).
pub(crate) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
pub(crate) const REFUSAL_LOG_BURST: u32 = 20;

struct HandshakeCount {
    total: usize,
    by_source: std::collections::HashMap<std::net::IpAddr, usize>,
    refused: LogLimit,
    failed: LogLimit,
}

impl Default for HandshakeCount {
    fn default() -> Self {
        Self {
            total: 0,
            by_source: Default::default(),
            refused: LogLimit::with_burst(REFUSAL_LOG_INTERVAL, REFUSAL_LOG_BURST),
            failed: LogLimit::with_burst(REFUSAL_LOG_INTERVAL, REFUSAL_LOG_BURST),
        }
    }
}

impl Handshakes {
    /// Whether a failed handshake may be logged now, and how many went unlogged before it.
    fn log_failure(&self) -> Option<u64> {
        self.state.lock().failed.allow(Instant::now())
    }
}

/// One handshake in progress on an accepted connection, counted in its node's
/// [`Handshakes`] while it lives.
struct HandshakeSlot {
    inner: Arc<Inner>,
    source: Option<std::net::IpAddr>,
}

impl HandshakeSlot {
    /// A place for a handshake from `source`, or `None` (logged, at most once an interval)
    /// when its source or the node has none left.
    fn take(inner: &Arc<Inner>, source: Option<std::net::IpAddr>) -> Option<Self> {
        let cfg = &inner.config;
        let mut st = inner.handshakes.state.lock();
        let from_source = source.map_or(0, |ip| st.by_source.get(&ip).copied().unwrap_or(0));
        let why = if st.total >= cfg.max_handshakes {
            Some(format!("{} handshakes already in progress", st.total))
        } else if from_source >= cfg.max_handshakes_per_source {
            Some(format!(
                "{from_source} handshakes already in progress from that address \
                 (max_handshakes_per_source)"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            if let Some(unlogged) = st.refused.allow(Instant::now()) {
                tracing::warn!(
                    node = inner.id,
                    ?source,
                    "{why}; closing a new connection ({unlogged} more closed since the last \
                     warning)"
                );
            }
            return None;
        }
        st.total += 1;
        if let Some(ip) = source {
            *st.by_source.entry(ip).or_insert(0) += 1;
        }
        Some(HandshakeSlot {
            inner: inner.clone(),
            source,
        })
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut st = self.inner.handshakes.state.lock();
        st.total -= 1;
        if let Some(ip) = self.source
            && let Some(n) = st.by_source.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                st.by_source.remove(&ip);
            }
        }
    }
}

/// Starts an outgoing connection to `peer`; frames may be queued at once.
pub(crate) fn connect(inner: &Arc<Inner>, peer: NodeId, addr: Option<SocketAddr>) -> Arc<Conn> {
    let conn = Conn::new(peer);
    let inner = inner.clone();
    let c = conn.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("storm-tx-{}-{}", inner.id, peer))
        .spawn(move || {
            let stream = match addr {
                None => Err(format!("no address known for node {peer}")),
                Some(addr) => open_any(&inner, &c, addr),
            };
            match stream {
                Ok(stream) => {
                    let reason = write_loop(&inner, &c, stream);
                    inner.conn_lost(&c, reason);
                }
                Err(reason) => inner.conn_lost(&c, reason),
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start a connection thread: {e}");
        conn.close();
    }
    conn
}

/// Makes the kernel close the connection when sent data stays unacknowledged for `timeout`
/// (a cut link, a powered-off host), so the peer's operations fail with `Unreachable` naming
/// it rather than with a timeout naming nobody.
fn set_user_timeout(stream: &TcpStream, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let ms: libc::c_uint = timeout.as_millis().clamp(1, u32::MAX as u128) as libc::c_uint;
    // SAFETY: a valid socket and a pointer to a c_uint of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "cannot set TCP_USER_TIMEOUT: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// What the connecting side says when the accepting side's proof does not match its key.
const KEY_MISMATCH_HERE: &str = "the peer did not prove it holds the cluster key: the two \
     nodes hold different cluster keys (every node needs the same storm.key)";

/// What the accepting side says when the connecting side refused its proof.
const KEY_MISMATCH_THERE: &str =
    "the two nodes hold different cluster keys (every node needs the same storm.key)";

/// Connects to the peer at `addr`, or where it has no answer, at its alternate addresses in
/// turn ([`super::TcpConfig::alternates`]); the directory keeps the address that answered.
fn open_any(inner: &Arc<Inner>, conn: &Arc<Conn>, addr: SocketAddr) -> Result<TcpStream, String> {
    let others: Vec<SocketAddr> = inner
        .config
        .alternates
        .iter()
        .filter(|(n, _)| *n == conn.peer)
        .flat_map(|(_, a)| a.iter().copied())
        .filter(|a| *a != addr)
        .collect();
    let mut failures = Vec::new();
    for a in std::iter::once(addr).chain(others) {
        match open(inner, conn, a) {
            Ok(stream) => {
                if a != addr {
                    tracing::info!(peer = conn.peer, %a, "reached the peer at another of its addresses");
                    inner.set_address(conn.peer, a);
                }
                return Ok(stream);
            }
            Err(e) => failures.push(e),
        }
    }
    Err(failures.join("; "))
}

/// Connects, shakes hands and starts the reader thread.
fn open(inner: &Arc<Inner>, conn: &Arc<Conn>, addr: SocketAddr) -> Result<TcpStream, String> {
    let timeout = inner.config.connect_timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let deadline = Instant::now() + timeout;
    stream.set_nodelay(true).ok();
    set_user_timeout(&stream, inner.config.peer_timeout);
    let failed = |e: String| format!("handshake with node {} at {addr} failed: {e}", conn.peer);
    let nonce = random_bytes();
    stream
        .write_all(&OutFrame::control(&Control::Hello(hello_for(inner, nonce))).to_vec())
        .map_err(|e| failed(e.to_string()))?;
    let (their_nonce, proof) = match read_handshake(&stream, deadline).map_err(failed)? {
        Control::Challenge { nonce, proof } => (nonce, proof),
        Control::HelloReject(_) => return Err(format!("node {} at {addr} refused us", conn.peer)),
        other => return Err(failed(format!("unexpected reply {other:?}"))),
    };
    let t = transcript(inner, inner.id, conn.peer, &nonce, &their_nonce);
    if !t.verify(&inner.config.key, &proof, true) {
        // Told, so that the peer names the mismatch too instead of seeing a reset: the
        // refusal says nothing it did not know (its own proof failed here).
        let reject = OutFrame::control(&Control::HelloReject("refused".into()));
        let _ = stream.write_all(&reject.to_vec());
        tracing::warn!(
            node = inner.id,
            peer = conn.peer,
            %addr,
            "the peer did not prove it holds the cluster key; closing"
        );
        return Err(failed(KEY_MISMATCH_HERE.into()));
    }
    let mut answer = Vec::new();
    if let Some(identity) = &inner.config.identity {
        use ed25519_dalek::Signer;
        let sig = identity.read().sign(&t.identity_message());
        answer.extend(OutFrame::control(&Control::Identify(sig.to_bytes().to_vec())).to_vec());
    }
    answer.extend(OutFrame::control(&Control::Proof(t.client_proof(&inner.config.key))).to_vec());
    stream
        .write_all(&answer)
        .map_err(|e| failed(e.to_string()))?;
    match read_handshake(&stream, deadline).map_err(failed)? {
        Control::HelloAck => {}
        Control::HelloReject(_) => return Err(format!("node {} at {addr} refused us", conn.peer)),
        other => return Err(failed(format!("unexpected reply {other:?}"))),
    }
    let session = t.session(&inner.config.key, inner.config.protection, true);
    stream.set_read_timeout(None).ok();
    stream
        .set_write_timeout(Some(inner.config.op_timeout.max(Duration::from_secs(1))))
        .ok();
    let reader = stream.try_clone().map_err(|e| e.to_string())?;
    *conn.stream.lock() = Some(stream.try_clone().map_err(|e| e.to_string())?);
    if conn.is_closed() {
        let _ = stream.shutdown(Shutdown::Both);
        return Err("connection closed while opening".into());
    }
    spawn_reader(inner, conn, reader, session.opener);
    conn.set_connected(&stream, session.sealer);
    Ok(stream)
}

/// The accepting side of a handshake up to the peer's proof; the peer's id and this
/// connection's session, or why it was refused (to log; the peer is told only "refused").
/// The caller sends the `HelloAck` once the connection is adopted.
fn accept_handshake(
    inner: &Inner,
    stream: &mut TcpStream,
) -> Result<(NodeId, super::auth::Session), String> {
    let deadline = Instant::now() + inner.config.connect_timeout;
    let refuse = |stream: &mut TcpStream, why: String| {
        let reject = OutFrame::control(&Control::HelloReject("refused".into()));
        let _ = stream.write_all(&reject.to_vec());
        Err(why)
    };
    let hello = match read_handshake(stream, deadline)? {
        Control::Hello(h) => h,
        other => return Err(format!("expected a handshake, got {other:?}")),
    };
    if let Err(why) = check_hello(inner, &hello) {
        return refuse(stream, format!("node {} claimed: {why}", hello.node));
    }
    let nonce = random_bytes();
    let t = transcript(inner, hello.node, inner.id, &hello.nonce, &nonce);
    let challenge = Control::Challenge {
        nonce,
        proof: t.server_proof(&inner.config.key),
    };
    stream
        .write_all(&OutFrame::control(&challenge).to_vec())
        .map_err(|e| e.to_string())?;
    let key_mismatch = || {
        format!(
            "a peer claiming node {} refused this node's proof: {KEY_MISMATCH_THERE}",
            hello.node
        )
    };
    let (identity, proof) = match read_handshake(stream, deadline)? {
        Control::Identify(sig) => match read_handshake(stream, deadline)? {
            Control::Proof(p) => (Some(sig), p),
            Control::HelloReject(_) => return Err(key_mismatch()),
            other => return Err(format!("expected the handshake's proof, got {other:?}")),
        },
        Control::Proof(p) => (None, p),
        // The peer found that this node's proof does not match its key.
        Control::HelloReject(_) => return Err(key_mismatch()),
        other => return Err(format!("expected the handshake's proof, got {other:?}")),
    };
    if !t.verify(&inner.config.key, &proof, false) {
        return refuse(
            stream,
            format!(
                "a peer claiming node {} did not prove it holds the cluster key",
                hello.node
            ),
        );
    }
    if let Some(keys) = &inner.config.peer_keys
        && let Err(why) = check_identity(keys, hello.node, identity.as_deref(), &t)
    {
        return refuse(stream, why);
    }
    Ok((
        hello.node,
        t.session(&inner.config.key, inner.config.protection, false),
    ))
}

/// Whether the peer that claims node `node` proved it with the identity key enrolled for it:
/// `sig` must be its signature over this handshake.
fn check_identity(
    keys: &super::config::PeerKeys,
    node: NodeId,
    sig: Option<&[u8]>,
    t: &Transcript,
) -> Result<(), String> {
    use ed25519_dalek::Verifier;
    let Some(key) = (keys.0)(node) else {
        return Err(format!(
            "a peer claiming node {node}, which has no identity key enrolled here"
        ));
    };
    let Some(sig) = sig else {
        return Err(format!(
            "a peer claiming node {node} did not prove its identity (no node key)"
        ));
    };
    let sig: [u8; 64] = sig
        .try_into()
        .map_err(|_| format!("a peer claiming node {node} sent a malformed identity"))?;
    key.verify(
        &t.identity_message(),
        &ed25519_dalek::Signature::from_bytes(&sig),
    )
    .map_err(|_| format!("a peer claiming node {node} did not prove its identity"))
}

/// Handles one accepted socket: handshake, then register and read.
pub(crate) fn accept(inner: &Arc<Inner>, mut stream: TcpStream) {
    let peer_addr = stream.peer_addr().ok();
    let Some(slot) = HandshakeSlot::take(inner, peer_addr.map(|a| a.ip())) else {
        return;
    };
    let inner = inner.clone();
    let _ = std::thread::Builder::new()
        .name(format!("storm-accept-{}", inner.id))
        .spawn(move || {
            stream.set_nodelay(true).ok();
            set_user_timeout(&stream, inner.config.peer_timeout);
            inner.wait_while_frozen();
            let (peer, session) = match accept_handshake(&inner, &mut stream) {
                Ok(done) => done,
                Err(why) => {
                    if let Some(unlogged) = inner.handshakes.log_failure() {
                        tracing::warn!(
                            node = inner.id,
                            ?peer_addr,
                            "refused a connection: {why} ({unlogged} more refused since the \
                             last warning)"
                        );
                    }
                    return;
                }
            };
            drop(slot);
            stream.set_read_timeout(None).ok();
            stream
                .set_write_timeout(Some(inner.config.op_timeout.max(Duration::from_secs(1))))
                .ok();
            let conn = Conn::new(peer);
            let (Ok(reader), Ok(keep)) = (stream.try_clone(), stream.try_clone()) else {
                return;
            };
            *conn.stream.lock() = Some(keep);
            // Adopted before the peer hears `HelloAck`: a connection the peer opens after
            // this one is then adopted after it, and closes this one, never the reverse.
            // It is marked connected only once the ack is written: until then frames sent to
            // it wait in its queue for the writer started below, and none can reach the
            // socket ahead of the ack (which the peer must read first).
            inner.adopt(conn.clone());
            if let Err(e) = (&stream).write_all(&OutFrame::control(&Control::HelloAck).to_vec()) {
                inner.conn_lost(&conn, format!("sending the handshake's ack: {e}"));
                return;
            }
            conn.set_connected(&stream, session.sealer);
            let writer_inner = inner.clone();
            let writer_conn = conn.clone();
            let _ = std::thread::Builder::new()
                .name(format!("storm-tx-{}-{}", inner.id, peer))
                .spawn(move || {
                    let reason = write_loop(&writer_inner, &writer_conn, stream);
                    writer_inner.conn_lost(&writer_conn, reason);
                });
            read_loop(&inner, &conn, reader, session.opener);
        });
}

fn spawn_reader(inner: &Arc<Inner>, conn: &Arc<Conn>, stream: TcpStream, opener: Opener) {
    let inner = inner.clone();
    let conn = conn.clone();
    let _ = std::thread::Builder::new()
        .name(format!("storm-rx-{}-{}", inner.id, conn.peer))
        .spawn(move || read_loop(&inner, &conn, stream, opener));
}

fn read_loop(inner: &Arc<Inner>, conn: &Arc<Conn>, stream: TcpStream, mut opener: Opener) {
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let reason = loop {
        if let Err(why) = read_one(inner, conn.peer, &mut reader, &mut opener) {
            break why;
        }
    };
    inner.conn_lost(conn, reason);
}

fn describe(e: WireError) -> String {
    match e {
        WireError::Closed => "connection closed by peer".to_string(),
        e => e.to_string(),
    }
}

/// Reads the tag after a frame and checks the frame (decrypting its body in place). A frame
/// that fails is logged with the peer's address, and the connection closes.
fn check(
    inner: &Inner,
    from: NodeId,
    reader: &mut BufReader<TcpStream>,
    opener: &mut Opener,
    head: &[u8],
    body: &mut [u8],
) -> Result<(), String> {
    let mut tag = [0u8; 32];
    let tag = &mut tag[..inner.config.protection.tag_len()];
    wire::read_exact(reader, tag).map_err(describe)?;
    opener.open(head, body, tag).map_err(|e| {
        let addr = reader.get_ref().peer_addr().ok();
        tracing::warn!(
            node = inner.id,
            peer = from,
            ?addr,
            "{e}; closing the connection"
        );
        e.to_string()
    })
}

/// Reads, checks and handles one frame. Nothing is acted on before the frame's tag is
/// checked; transfer data is kept with its transfer and reaches global memory only when the
/// transfer commits (see `xfer`).
fn read_one(
    inner: &Arc<Inner>,
    from: NodeId,
    reader: &mut BufReader<TcpStream>,
    opener: &mut Opener,
) -> Result<(), String> {
    let mut head = [0u8; HEADER_LEN + DATA_PREFIX_LEN];
    wire::read_exact(reader, &mut head[..HEADER_LEN]).map_err(describe)?;
    // A frozen node (a test's SIGSTOP) handles nothing, not even a frame it was waiting for.
    inner.wait_while_frozen();
    let (kind, len) = wire::parse_header(
        head[..HEADER_LEN].try_into().expect("header length"),
        inner.config.max_frame,
    )
    .map_err(describe)?;
    if kind != KIND_DATA {
        let mut body = wire::read_body(reader, len).map_err(describe)?;
        check(inner, from, reader, opener, &head[..HEADER_LEN], &mut body)?;
        let frame = wire::decode_body(kind, Bytes::from(body)).map_err(describe)?;
        return inner
            .dispatch(from, frame)
            .map_err(|why| format!("protocol error: {why}"));
    }
    wire::read_exact(reader, &mut head[HEADER_LEN..]).map_err(describe)?;
    let (key, at) = wire::parse_data_prefix(head[HEADER_LEN..].try_into().expect("prefix"));
    let mut payload = wire::read_body(reader, len - DATA_PREFIX_LEN).map_err(describe)?;
    check(inner, from, reader, opener, &head, &mut payload)?;
    inner
        .xfer_data(from, key, at, Bytes::from(payload))
        .map_err(|why| format!("protocol error: {why}"))
}

/// Writes what the fast path could not, blocking on the socket as long as it takes. Frames
/// are sealed here, in queue order, which is the order they go out.
fn write_loop(inner: &Inner, conn: &Conn, mut stream: TcpStream) -> String {
    loop {
        let batch: Vec<Bytes> = {
            let mut out = conn.out.lock();
            out.busy = false;
            while out.queue.is_empty() && !out.closing {
                conn.wake.wait(&mut out);
            }
            if out.closing || inner.is_shut_down() {
                return "connection closed".into();
            }
            out.busy = true;
            let out = &mut *out;
            let Some(sealer) = out.sealer.as_mut() else {
                return "no session on a connected link".into();
            };
            let mut batch = Vec::with_capacity(out.queue.len() * 3);
            for queued in out.queue.drain(..) {
                match queued {
                    Queued::Raw(bytes) => batch.push(bytes),
                    Queued::Frame(frame) => {
                        let head = Bytes::copy_from_slice(frame.head());
                        let (body, tag) = sealer.seal(&head, frame.body);
                        batch.extend([head, body, tag].into_iter().filter(|b| !b.is_empty()));
                    }
                }
            }
            batch
        };
        if let Err(e) = write_all_vectored(&mut stream, batch) {
            let mut out = conn.out.lock();
            out.busy = false;
            out.sock = None;
            return format!("send failed: {e}");
        }
    }
}

/// Writes every buffer, in order, with as few system calls as the kernel allows.
fn write_all_vectored(stream: &mut TcpStream, mut bufs: Vec<Bytes>) -> std::io::Result<()> {
    let mut first = 0;
    while first < bufs.len() {
        let slices: Vec<IoSlice<'_>> = bufs[first..]
            .iter()
            .take(64)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut n = match stream.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while n > 0 {
            let len = bufs[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                bufs[first] = bufs[first].slice(n..);
                n = 0;
            }
        }
    }
    Ok(())
}
