//! The MM's control socket: accepts storm-submit and storm, and turns their requests into
//! messages for the main loop, which alone decides. Each connection has a reader thread
//! (handshake, then requests) and a writer thread (replies, including streamed output). The
//! writer counts the replies it has written, so the main loop knows when output it passed on
//! is safely with the client (and may be let go of on the node; see `manager::output`).

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Sender};
use storm_cluster::control::{self, ControlError, PROTOCOL_VERSION, Reply, Request};

pub type ClientId = u64;

/// What the control threads tell the main loop.
pub enum Incoming {
    Connected {
        client: ClientId,
        uid: u32,
        gid: u32,
        tx: Sender<Reply>,
        /// Replies written to the client's socket so far.
        written: Arc<AtomicU64>,
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

/// Binds the control socket (replacing a stale one) and starts accepting.
pub fn start(
    path: &Path,
    cluster: String,
    nodes: u32,
    to_main: Sender<Incoming>,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "another machine manager already listens on {}",
                path.display()
            );
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot create the control socket {}: {e}", path.display()))?;
    // Every local user may submit; the MM checks who they are on each request.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    std::thread::Builder::new()
        .name("storm-mm-accept".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(sock) => serve(sock, cluster.clone(), nodes, to_main.clone()),
                    Err(e) => tracing::warn!("control socket accept failed: {e}"),
                }
            }
        })?;
    Ok(())
}

fn serve(sock: UnixStream, cluster: String, nodes: u32, to_main: Sender<Incoming>) {
    let client = NEXT_CLIENT.fetch_add(1, Ordering::Relaxed);
    let _ = std::thread::Builder::new().name(format!("storm-mm-client-{client}")).spawn(move || {
        let (uid, gid) = match control::peer_credentials(&sock) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("cannot identify a control client: {e}");
                return;
            }
        };
        match control::recv::<Request>(&sock) {
            Ok((Request::Hello { version }, _)) if version == PROTOCOL_VERSION => {
                let _ = control::send(&sock, &Reply::Hello { version: PROTOCOL_VERSION, cluster, nodes }, None);
            }
            Ok((Request::Hello { version }, _)) => {
                let msg = format!("control protocol {version} is not supported; this MM speaks {PROTOCOL_VERSION}");
                let _ = control::send(&sock, &Reply::Error(msg), None);
                return;
            }
            Ok(_) => {
                let _ = control::send(&sock, &Reply::Error("expected Hello first".into()), None);
                return;
            }
            Err(e) => {
                tracing::debug!("control client left during the handshake: {e}");
                return;
            }
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let Ok(writer_sock) = sock.try_clone() else { return };
        let written = Arc::new(AtomicU64::new(0));
        let counter = written.clone();
        let _ = std::thread::Builder::new()
            .name(format!("storm-mm-reply-{client}"))
            .spawn(move || write_replies(writer_sock, rx, &counter));
        if to_main.send(Incoming::Connected { client, uid, gid, tx, written }).is_err() {
            return;
        }
        loop {
            match control::recv::<Request>(&sock) {
                Ok((req, fds)) => {
                    if to_main.send(Incoming::Request { client, req, fds }).is_err() {
                        break;
                    }
                }
                Err(ControlError::Closed) => break,
                Err(e) => {
                    tracing::warn!(client, "dropping a control client: {e}");
                    break;
                }
            }
        }
        let _ = to_main.send(Incoming::Gone { client });
    });
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
