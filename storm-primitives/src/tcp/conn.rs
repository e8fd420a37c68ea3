//! Connections between tcp nodes.
//!
//! A node keeps at most one outgoing connection per peer in its table and sends everything for
//! that peer through it, so frames to one peer stay in order. Senders write to the socket
//! directly when they can (see [`Conn`]); each connection also has a writer thread (which makes
//! the connection, so a slow connect never blocks the caller, and writes what the socket could
//! not take at once) and a reader thread that decodes frames and hands them to the node. The first frame either way is
//! a handshake that checks protocol version, cluster size, layout fingerprint and cluster key.
//! When a connection fails, the node is told once, and every operation waiting on that peer
//! fails at once instead of waiting for its timeout.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::node::Inner;
use super::wire::{
    self, Control, DATA_PREFIX_LEN, Frame, HEADER_LEN, Hello, KIND_DATA, OutFrame, WireError,
    read_frame,
};
use crate::nodeset::NodeId;

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

/// Bytes waiting for the writer thread, in order.
#[derive(Default)]
struct Outbox {
    /// The socket (a duplicate owned here, so it lives exactly as long as senders may use it),
    /// once connected and past the handshake.
    sock: Option<TcpStream>,
    queue: VecDeque<Bytes>,
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
        let head = frame.head();
        let body = &frame.body[..];
        let mut written = 0;
        if let Some(sock) = &out.sock
            && !out.busy
            && out.queue.is_empty()
        {
            match send_nonblocking(sock.as_raw_fd(), &[head, body]) {
                Ok(n) => written = n,
                Err(_) => {
                    // The writer thread or the reader will notice and report the loss; keep
                    // the frame so the failure is reported once, through them.
                }
            }
        }
        let total = head.len() + body.len();
        if written < total {
            if written < head.len() {
                out.queue
                    .push_back(Bytes::copy_from_slice(&head[written..]));
                if !body.is_empty() {
                    out.queue.push_back(frame.body.clone());
                }
            } else {
                out.queue
                    .push_back(frame.body.slice(written - head.len()..));
            }
            self.wake.notify_one();
        }
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

    /// Makes the connection usable for direct sends.
    fn set_connected(&self, stream: &TcpStream) {
        let mut out = self.out.lock();
        if !out.closing {
            out.sock = stream.try_clone().ok();
        }
    }
}

fn hello_for(inner: &Inner) -> Hello {
    Hello {
        node: inner.id,
        cluster_size: inner.all.len() as u32,
        layout_fingerprint: inner.layout.fingerprint(),
        cluster_key: inner.config.cluster_key,
    }
}

/// Why we refuse a peer's handshake, if we do.
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
    if h.cluster_key != inner.config.cluster_key {
        return Err("cluster key differs".into());
    }
    Ok(())
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
                Some(addr) => open(&inner, &c, addr),
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

/// Connects, shakes hands and starts the reader thread.
fn open(inner: &Arc<Inner>, conn: &Arc<Conn>, addr: SocketAddr) -> Result<TcpStream, String> {
    let timeout = inner.config.connect_timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream.set_nodelay(true).ok();
    set_user_timeout(&stream, inner.config.peer_timeout);
    stream
        .write_all(&OutFrame::control(&Control::Hello(hello_for(inner))).to_vec())
        .map_err(|e| format!("handshake with {addr} failed: {e}"))?;
    stream.set_read_timeout(Some(timeout)).ok();
    let reply = read_frame(&mut stream, inner.config.max_frame);
    match reply {
        Ok(Frame::Control(Control::HelloAck)) => {}
        Ok(Frame::Control(Control::HelloReject(why))) => {
            return Err(format!("node {} at {addr} refused us: {why}", conn.peer));
        }
        Ok(other) => return Err(format!("unexpected handshake reply from {addr}: {other:?}")),
        Err(e) => return Err(format!("handshake with {addr} failed: {e}")),
    }
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
    spawn_reader(inner, conn, reader);
    conn.set_connected(&stream);
    Ok(stream)
}

/// Handles one accepted socket: handshake, then register and read.
pub(crate) fn accept(inner: &Arc<Inner>, mut stream: TcpStream) {
    let inner = inner.clone();
    let _ = std::thread::Builder::new()
        .name(format!("storm-accept-{}", inner.id))
        .spawn(move || {
            stream.set_nodelay(true).ok();
            set_user_timeout(&stream, inner.config.peer_timeout);
            inner.wait_while_frozen();
            stream
                .set_read_timeout(Some(inner.config.connect_timeout))
                .ok();
            let peer_addr = stream.peer_addr().ok();
            let hello = match read_frame(&mut stream, inner.config.max_frame) {
                Ok(Frame::Control(Control::Hello(h))) => h,
                Ok(other) => {
                    tracing::warn!(
                        node = inner.id,
                        ?peer_addr,
                        "expected a handshake, got {other:?}; closing"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(node = inner.id, ?peer_addr, "bad handshake: {e}; closing");
                    return;
                }
            };
            if let Err(why) = check_hello(&inner, &hello) {
                tracing::warn!(
                    node = inner.id,
                    ?peer_addr,
                    "refusing node {}: {why}",
                    hello.node
                );
                let _ = stream.write_all(&OutFrame::control(&Control::HelloReject(why)).to_vec());
                return;
            }
            if stream
                .write_all(&OutFrame::control(&Control::HelloAck).to_vec())
                .is_err()
            {
                return;
            }
            stream.set_read_timeout(None).ok();
            stream
                .set_write_timeout(Some(inner.config.op_timeout.max(Duration::from_secs(1))))
                .ok();
            let conn = Conn::new(hello.node);
            let (Ok(reader), Ok(keep)) = (stream.try_clone(), stream.try_clone()) else {
                return;
            };
            *conn.stream.lock() = Some(keep);
            conn.set_connected(&stream);
            inner.adopt(conn.clone());
            let writer_inner = inner.clone();
            let writer_conn = conn.clone();
            let _ = std::thread::Builder::new()
                .name(format!("storm-tx-{}-{}", inner.id, hello.node))
                .spawn(move || {
                    let reason = write_loop(&writer_inner, &writer_conn, stream);
                    writer_inner.conn_lost(&writer_conn, reason);
                });
            read_loop(&inner, &conn, reader);
        });
}

fn spawn_reader(inner: &Arc<Inner>, conn: &Arc<Conn>, stream: TcpStream) {
    let inner = inner.clone();
    let conn = conn.clone();
    let _ = std::thread::Builder::new()
        .name(format!("storm-rx-{}-{}", inner.id, conn.peer))
        .spawn(move || read_loop(&inner, &conn, stream));
}

fn read_loop(inner: &Arc<Inner>, conn: &Arc<Conn>, stream: TcpStream) {
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let reason = loop {
        inner.wait_while_frozen();
        if let Err(why) = read_one(inner, conn.peer, &mut reader) {
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

/// Reads and handles one frame. Transfer data goes straight from the socket into global
/// memory, the way a NIC would place it; nothing is copied through an intermediate buffer.
fn read_one(
    inner: &Arc<Inner>,
    from: NodeId,
    reader: &mut BufReader<TcpStream>,
) -> Result<(), String> {
    let mut head = [0u8; HEADER_LEN];
    wire::read_exact(reader, &mut head).map_err(describe)?;
    let (kind, len) = wire::parse_header(&head, inner.config.max_frame).map_err(describe)?;
    if kind != KIND_DATA {
        let mut body = vec![0u8; len];
        wire::read_exact(reader, &mut body).map_err(describe)?;
        let frame = wire::decode_body(kind, Bytes::from(body)).map_err(describe)?;
        return inner
            .dispatch(from, frame)
            .map_err(|why| format!("protocol error: {why}"));
    }
    let mut prefix = [0u8; DATA_PREFIX_LEN];
    wire::read_exact(reader, &mut prefix).map_err(describe)?;
    let (key, at) = wire::parse_data_prefix(&prefix);
    let payload = len - DATA_PREFIX_LEN;
    match inner
        .xfer_data_target(from, key, at, payload)
        .map_err(|why| format!("protocol error: {why}"))?
    {
        Some(target) => {
            read_into_memory(inner, reader, target.offset, payload)?;
            inner.xfer_data_arrived(key, at, payload, target);
        }
        None => {
            // The transfer was aborted: read its bytes and drop them.
            std::io::copy(
                &mut reader.by_ref().take(payload as u64),
                &mut std::io::sink(),
            )
            .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Moves `len` bytes from the connection into global memory at `offset`: what the reader has
/// buffered first, then the rest by `read(2)` straight into the region.
fn read_into_memory(
    inner: &Inner,
    reader: &mut BufReader<TcpStream>,
    offset: u64,
    len: usize,
) -> Result<(), String> {
    let buffered = reader.buffer();
    let n = buffered.len().min(len);
    inner
        .memory
        .write(offset, &buffered[..n])
        .map_err(|e| e.to_string())?;
    reader.consume(n);
    let mut done = n;
    if done == len {
        return Ok(());
    }
    let target = inner
        .memory
        .target(offset + done as u64, len - done)
        .map_err(|e| e.to_string())?;
    let fd = reader.get_ref().as_raw_fd();
    while done < len {
        // SAFETY: `target` points to `len - n` bytes of global memory that this transfer owns
        // until it commits; the kernel writes them as a NIC would.
        let r = unsafe { libc::read(fd, target.add(done - n).cast(), len - done) };
        match r {
            0 => return Err("connection closed by peer".into()),
            r if r > 0 => done += r as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e.to_string());
                }
            }
        }
    }
    std::sync::atomic::fence(Ordering::Release);
    Ok(())
}

/// Writes what the fast path could not, blocking on the socket as long as it takes.
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
            out.queue.drain(..).collect()
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
