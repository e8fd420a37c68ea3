//! The control socket's wire: frames (a 4-byte little-endian length, a bincode body of at
//! most [`MAX_FRAME`] bytes) with a program's descriptor passed beside the first byte
//! (SCM_RIGHTS), the peer's credentials (SO_PEERCRED), the MM's count of each user's
//! connections, and the client that speaks it ([`Client`]).

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::Serialize;

use super::*;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("connection closed")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("frame of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
}

/// The size of `msg`'s frame body, without making it (what the MM counts against
/// `[limits] max_unread_reply_bytes`).
pub fn encoded_len<T: Serialize>(msg: &T) -> usize {
    struct Count(usize);
    impl bincode::enc::write::Writer for Count {
        fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
            self.0 += bytes.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = bincode::serde::encode_into_writer(msg, &mut count, bincode::config::standard());
    count.0
}

/// Sends one frame, with `fd` attached if given.
pub fn send<T: Serialize>(
    sock: &UnixStream,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ControlError> {
    let body = bincode::serde::encode_to_vec(msg, bincode::config::standard())
        .map_err(|e| ControlError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(ControlError::TooLarge {
            len: body.len(),
            limit: MAX_FRAME,
        });
    }
    let len = (body.len() as u32).to_le_bytes();
    match fd {
        None => {
            let mut w = sock;
            w.write_all(&len)?;
            w.write_all(&body)?;
        }
        Some(fd) => {
            let fds = [fd.as_raw_fd()];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            let iov = [IoSlice::new(&len)];
            // The descriptor rides on the length prefix; the body follows.
            let n = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
                .map_err(std::io::Error::from)?;
            if n != len.len() {
                let mut w = sock;
                w.write_all(&len[n..])?;
            }
            let mut w = sock;
            w.write_all(&body)?;
        }
    }
    Ok(())
}

/// Receives one frame and any descriptors attached to it.
pub fn recv<T: serde::de::DeserializeOwned>(
    sock: &UnixStream,
) -> Result<(T, Vec<OwnedFd>), ControlError> {
    recv_within(sock, MAX_FRAME)
}

/// Receives one frame of at most `limit` bytes (and at most [`MAX_FRAME`]) and any
/// descriptors attached to it. A frame over the limit is not read: the stream is then out of
/// step and must be closed.
pub fn recv_within<T: serde::de::DeserializeOwned>(
    sock: &UnixStream,
    limit: usize,
) -> Result<(T, Vec<OwnedFd>), ControlError> {
    let limit = limit.min(MAX_FRAME);
    let mut len = [0u8; 4];
    let mut fds = Vec::new();
    let mut got = 0;
    while got < len.len() {
        let mut cmsg_space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        let (n, received) = {
            let mut iov = [IoSliceMut::new(&mut len[got..])];
            let msg = recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg_space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            let mut received = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: the kernel just gave us these descriptors; we own them now.
                        received.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
            }
            (msg.bytes, received)
        };
        fds.extend(received);
        if n == 0 {
            return Err(ControlError::Closed);
        }
        got += n;
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(ControlError::TooLarge { len, limit });
    }
    // The buffer grows with the bytes that arrive, not with the length the peer claimed.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    if sock.take(len as u64).read_to_end(&mut body)? != len {
        return Err(ControlError::Closed);
    }
    let (msg, _) = storm_primitives::codec::decode(&body)
        .map_err(|e| ControlError::Malformed(e.to_string()))?;
    Ok((msg, fds))
}

/// The user and group of the process on the other end of `sock`.
pub fn peer_credentials(sock: &UnixStream) -> std::io::Result<(u32, u32)> {
    let cred =
        nix::sys::socket::getsockopt(&sock.as_fd(), nix::sys::socket::sockopt::PeerCredentials)
            .map_err(std::io::Error::from)?;
    Ok((cred.uid(), cred.gid()))
}

/// Hangs up on a control client: both directions are shut, so its reader and writer threads
/// end and the client sees end-of-file. (Here, so the resource-management crates, which may
/// not name `std::net`, can close a Unix socket.)
pub fn hang_up(sock: &UnixStream) {
    let _ = sock.shutdown(std::net::Shutdown::Both);
}

/// Ends a connection's reading side only: its reader sees the end, while replies already
/// queued for its writer still go out (the connection closes once both are done).
pub fn stop_reading(sock: &UnixStream) {
    let _ = sock.shutdown(std::net::Shutdown::Read);
}

/// How many control connections each user has open, against `[limits]
/// max_connections_per_user`: kept by the MM and by each control relay, so that no user can
/// take all of a daemon's descriptors and threads from the others.
pub struct ConnectionCounts {
    limit: u32,
    open: std::sync::Mutex<std::collections::HashMap<u32, u32>>,
}

/// One of a user's connections, counted while it lives.
pub struct Counted<'a> {
    counts: &'a ConnectionCounts,
    uid: u32,
}

impl ConnectionCounts {
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            open: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, u32>> {
        // A count is whole at every unlock, so a panicked holder left nothing half-done.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection of `uid`, or says why it is refused.
    pub fn admit(&self, uid: u32) -> Result<Counted<'_>, String> {
        let mut open = self.lock();
        let n = open.entry(uid).or_insert(0);
        if *n >= self.limit {
            return Err(format!(
                "user {uid} already has {n} connections to the machine manager, the limit \
                 ([limits] max_connections_per_user = {}); close some (finished storm-submit \
                 or storm commands) and try again",
                self.limit
            ));
        }
        *n += 1;
        Ok(Counted { counts: self, uid })
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let mut open = self.counts.lock();
        if let Some(n) = open.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

/// Why a request did not reach the MM ([`Client::try_request`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestFailed {
    /// The MM said why it will not read the request, and closed.
    Refused(String),
    /// The connection closed (the MM stopped, or the replica no longer leads) before the
    /// request was written whole.
    Lost(String),
}

/// A connection to the MM, past the version handshake.
pub struct Client {
    pub sock: UnixStream,
    pub cluster: String,
    pub nodes: u32,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, String> {
        Self::connect_within(path, None)
    }

    /// [`Client::connect`], failing if the MM has not answered the handshake within `limit`
    /// (`None`: no limit). A process that holds the socket but does not run (a stopped or
    /// frozen MM) takes the connection and never answers.
    pub fn connect_within(
        path: &Path,
        limit: Option<std::time::Duration>,
    ) -> Result<Client, String> {
        let sock = UnixStream::connect(path).map_err(|e| {
            format!(
                "cannot reach the machine manager at {}: {e} (is storm-mm running, and is this the control_socket of its cluster file?)",
                path.display()
            )
        })?;
        // An MM that refuses the connection (a limit) says why and hangs up, possibly before
        // the hello is written: its reason is still there to read.
        let sent = send(
            &sock,
            &Request::Hello {
                version: PROTOCOL_VERSION,
            },
            None,
        );
        if limit.is_some() {
            sock.set_read_timeout(limit)
                .map_err(|e| format!("setting a read timeout: {e}"))?;
        }
        let reply = match recv::<Reply>(&sock) {
            Ok((reply, _)) => reply,
            Err(e) => {
                return Err(match sent {
                    Err(sent) => sent.to_string(),
                    Ok(()) => format!("machine manager handshake failed: {e}"),
                });
            }
        };
        match reply {
            Reply::Hello {
                version,
                cluster,
                nodes,
            } if version == PROTOCOL_VERSION => {
                if limit.is_some() {
                    sock.set_read_timeout(None)
                        .map_err(|e| format!("clearing a read timeout: {e}"))?;
                }
                Ok(Client {
                    sock,
                    cluster,
                    nodes,
                })
            }
            Reply::Hello { version, .. } => Err(format!(
                "the machine manager speaks control protocol {version}, this tool speaks {PROTOCOL_VERSION}"
            )),
            Reply::Error(e) => Err(e),
            other => Err(format!("unexpected handshake reply {other:?}")),
        }
    }

    pub fn request(&self, req: &Request, fd: Option<BorrowedFd<'_>>) -> Result<(), String> {
        self.try_request(req, fd).map_err(|e| match e {
            RequestFailed::Refused(why) | RequestFailed::Lost(why) => why,
        })
    }

    /// [`Client::request`], saying whether the MM refused the request or the connection was
    /// lost: a client that follows a job through a failover sends its request again on the
    /// next connection after a loss, never after a refusal.
    pub fn try_request(
        &self,
        req: &Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), RequestFailed> {
        match send(&self.sock, req, fd) {
            Ok(()) => Ok(()),
            // The MM refuses a request it will not read to the end (one over `[limits]
            // max_request_bytes`): it says why and closes, which can fail the rest of the
            // write. Its last word is then waiting to be read.
            Err(ControlError::Io(e)) => match self.last_word() {
                Some(why) => Err(RequestFailed::Refused(why)),
                None => Err(RequestFailed::Lost(format!(
                    "lost the machine manager: i/o error: {e}"
                ))),
            },
            Err(e) => Err(RequestFailed::Lost(format!(
                "lost the machine manager: {e}"
            ))),
        }
    }

    /// The error the MM sent before it closed the connection, if it sent one.
    fn last_word(&self) -> Option<String> {
        self.sock
            .set_read_timeout(Some(std::time::Duration::from_secs(1)))
            .ok()?;
        match recv::<Reply>(&self.sock) {
            Ok((Reply::Error(why), _)) => Some(why),
            _ => None,
        }
    }

    pub fn next(&self) -> Result<Reply, String> {
        recv::<Reply>(&self.sock)
            .map(|(r, _)| r)
            .map_err(|e| format!("lost the machine manager: {e}"))
    }

    /// One request, one reply.
    pub fn call(&self, req: &Request) -> Result<Reply, String> {
        self.request(req, None)?;
        self.next()
    }
}
