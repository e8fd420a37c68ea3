//! Connections between tcp nodes.
//!
//! A node keeps at most one outgoing connection per peer in its table and sends everything for
//! that peer through it, so frames to one peer stay in order. Each connection has a writer
//! thread (which also makes the connection, so a slow connect never blocks the caller) and a
//! reader thread that decodes frames and hands them to the node. The first frame either way is
//! a handshake that checks protocol version, cluster size, layout fingerprint and cluster key.
//! When a connection fails, the node is told once, and every operation waiting on that peer
//! fails at once instead of waiting for its timeout.

use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use super::node::Inner;
use super::wire::{Control, Frame, Hello, OutFrame, WireError, read_frame};
use crate::nodeset::NodeId;

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

/// One TCP connection to a peer.
/// What the writer thread is asked to do.
enum Outgoing {
    Frame(OutFrame),
    Close,
}

pub(crate) struct Conn {
    pub peer: NodeId,
    pub id: u64,
    tx: Sender<Outgoing>,
    closed: AtomicBool,
    stream: Mutex<Option<TcpStream>>,
}

impl Conn {
    fn new(peer: NodeId) -> (Arc<Conn>, Receiver<Outgoing>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let conn = Arc::new(Conn {
            peer,
            id: NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed),
            tx,
            closed: AtomicBool::new(false),
            stream: Mutex::new(None),
        });
        (conn, rx)
    }

    /// Queues a frame; false if the connection is already closed.
    pub fn send(&self, frame: OutFrame) -> bool {
        !self.closed.load(Ordering::Acquire) && self.tx.send(Outgoing::Frame(frame)).is_ok()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
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
        let _ = self.tx.send(Outgoing::Close);
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
    let (conn, rx) = Conn::new(peer);
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
                    let reason = write_loop(&inner, &c, stream, rx);
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

/// Connects, shakes hands and starts the reader thread.
fn open(inner: &Arc<Inner>, conn: &Arc<Conn>, addr: SocketAddr) -> Result<TcpStream, String> {
    let timeout = inner.config.connect_timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream.set_nodelay(true).ok();
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
    Ok(stream)
}

/// Handles one accepted socket: handshake, then register and read.
pub(crate) fn accept(inner: &Arc<Inner>, mut stream: TcpStream) {
    let inner = inner.clone();
    let _ = std::thread::Builder::new()
        .name(format!("storm-accept-{}", inner.id))
        .spawn(move || {
            stream.set_nodelay(true).ok();
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
            let (conn, rx) = Conn::new(hello.node);
            let (Ok(reader), Ok(keep)) = (stream.try_clone(), stream.try_clone()) else {
                return;
            };
            *conn.stream.lock() = Some(keep);
            inner.adopt(conn.clone());
            let writer_inner = inner.clone();
            let writer_conn = conn.clone();
            let _ = std::thread::Builder::new()
                .name(format!("storm-tx-{}-{}", inner.id, hello.node))
                .spawn(move || {
                    let reason = write_loop(&writer_inner, &writer_conn, stream, rx);
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
    let mut reader = BufReader::with_capacity(256 * 1024, stream);
    let reason = loop {
        match read_frame(&mut reader, inner.config.max_frame) {
            Ok(frame) => {
                if let Err(why) = inner.dispatch(conn.peer, frame) {
                    break format!("protocol error: {why}");
                }
            }
            Err(WireError::Closed) => break "connection closed by peer".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    inner.conn_lost(conn, reason);
}

fn write_loop(inner: &Inner, conn: &Conn, stream: TcpStream, rx: Receiver<Outgoing>) -> String {
    let mut w = BufWriter::with_capacity(64 * 1024, stream);
    loop {
        let Ok(first) = rx.recv() else {
            return "connection dropped".into();
        };
        let mut next = Some(first);
        while let Some(item) = next {
            let Outgoing::Frame(frame) = item else {
                return "connection closed".into();
            };
            if conn.is_closed() || inner.is_shut_down() {
                return "connection closed".into();
            }
            if let Err(e) = w
                .write_all(frame.head())
                .and_then(|_| w.write_all(&frame.body))
            {
                return format!("send failed: {e}");
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = w.flush() {
            return format!("send failed: {e}");
        }
    }
}
