//! The NM's requests to its node's launcher, over a Unix stream socket.
//!
//! A request is a 5-byte header, `[kind][body length, u32 little-endian]`, sent by one
//! `sendmsg` that also carries the task's descriptors (SCM_RIGHTS), then the body. The
//! descriptors travel with the header alone, so a reader that takes the header with
//! `recvmsg` gets them, and one that reads the body with `read` never meets any.
//!
//! - START: the body is the task's [`PlSpec`]; the descriptors are the task's standard output
//!   and error (write ends of the NM's pipes) and, for an MPI task, its end of the PMI socket.
//! - LOOK: no body, no descriptors: a held or cancelled slot changed, look at the kept
//!   requests again.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::PlSpec;

const START: u8 = 1;
const LOOK: u8 = 2;
const HEADER: usize = 5;
/// Most descriptors one request carries.
const MAX_FDS: usize = 3;
/// Longest task description taken (the heartbeat that carried the job bounds it far below).
const MAX_BODY: usize = 16 << 20;

/// A task to start, as the launcher receives it.
#[derive(Debug)]
pub struct StartTask {
    pub spec: PlSpec,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub pmi: Option<OwnedFd>,
}

/// One request, as the launcher receives it.
#[derive(Debug)]
pub enum Request {
    Start(StartTask),
    Look,
}

/// Why a request could not be read; the link is then out of step and is given up.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("reading a request: {0}")]
    Io(#[from] std::io::Error),
    #[error("request of unknown kind {0}")]
    Kind(u8),
    #[error("request body of {0} bytes is over the limit")]
    TooLong(usize),
    #[error("START request with {0} descriptors (2 or 3 expected)")]
    Descriptors(usize),
    #[error("LOOK request with a body or descriptors")]
    LookWithPayload,
    #[error("task description: {0}")]
    Spec(String),
}

/// NM: asks the launcher to start `spec`'s task with these descriptors.
pub fn send_start(
    link: &UnixStream,
    spec: &PlSpec,
    stdout: BorrowedFd<'_>,
    stderr: BorrowedFd<'_>,
    pmi: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let body = spec.encode();
    let mut fds = vec![stdout.as_raw_fd(), stderr.as_raw_fd()];
    fds.extend(pmi.map(|fd| fd.as_raw_fd()));
    send(link, START, &body, &fds)
}

/// NM: asks the launcher to look at its kept requests again.
pub fn send_look(link: &UnixStream) -> std::io::Result<()> {
    send(link, LOOK, &[], &[])
}

fn send(mut link: &UnixStream, kind: u8, body: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut header = [0u8; HEADER];
    header[0] = kind;
    header[1..].copy_from_slice(&(body.len() as u32).to_le_bytes());
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    let mut sent = 0;
    while sent < HEADER {
        let iov = [IoSlice::new(&header[sent..])];
        // The descriptors go with the first piece only.
        let with = if sent == 0 { cmsgs } else { &[] };
        match sendmsg::<()>(link.as_raw_fd(), &iov, with, MsgFlags::empty(), None) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    link.write_all(body)
}

/// Launcher: the next request, or `None` once the NM closed its end.
pub fn recv(mut link: &UnixStream) -> Result<Option<Request>, RequestError> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    while got < HEADER {
        let mut iov = [IoSliceMut::new(&mut header[got..])];
        let msg = match recvmsg::<()>(
            link.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(RequestError::Io(e.into())),
        };
        let n = msg.bytes;
        for cmsg in msg.cmsgs().map_err(|e| RequestError::Io(e.into()))? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel just installed these descriptors in this process.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(RequestError::Descriptors(MAX_FDS + 1));
        }
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(RequestError::Io(std::io::ErrorKind::UnexpectedEof.into()))
            };
        }
        got += n;
    }
    let len = u32::from_le_bytes(header[1..].try_into().expect("4 bytes")) as usize;
    match header[0] {
        LOOK if len == 0 && fds.is_empty() => Ok(Some(Request::Look)),
        LOOK => Err(RequestError::LookWithPayload),
        START => {
            if len > MAX_BODY {
                return Err(RequestError::TooLong(len));
            }
            let mut body = vec![0u8; len];
            link.read_exact(&mut body)?;
            let spec = PlSpec::decode(&body).map_err(RequestError::Spec)?;
            let count = fds.len();
            let mut fds = fds.into_iter();
            match (fds.next(), fds.next(), fds.next()) {
                (Some(stdout), Some(stderr), pmi) if count <= MAX_FDS => {
                    Ok(Some(Request::Start(StartTask {
                        spec,
                        stdout,
                        stderr,
                        pmi,
                    })))
                }
                _ => Err(RequestError::Descriptors(count)),
            }
        }
        other => Err(RequestError::Kind(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn spec() -> PlSpec {
        spec_with(10)
    }

    fn spec_with(env_bytes: usize) -> PlSpec {
        PlSpec {
            job: 7,
            rank: 1,
            node: 2,
            slot: 3,
            program: "/bin/true".into(),
            args: vec!["a".into()],
            env: vec![("K".into(), "V".repeat(env_bytes))],
            cwd: "/".into(),
            uid: 1,
            gid: 2,
        }
    }

    #[test]
    fn a_start_arrives_with_its_descriptors_and_a_look_after_it_stays_separate() {
        let (nm, pl) = UnixStream::pair().unwrap();
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let (_err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        // A body larger than the socket's buffer: the sender blocks until the reader reads.
        let sender = std::thread::spawn(move || {
            let big = spec_with(300_000);
            send_start(&nm, &big, out_w.as_fd(), err_w.as_fd(), None).unwrap();
            send_look(&nm).unwrap();
            nm
        });
        let Some(Request::Start(task)) = recv(&pl).unwrap() else {
            panic!("expected a START");
        };
        assert_eq!(task.spec, spec_with(300_000));
        assert!(task.pmi.is_none());
        // The descriptor received is the pipe's write end: what goes in comes out.
        let mut out = std::fs::File::from(task.stdout);
        out.write_all(b"through").unwrap();
        drop(out);
        let mut read = String::new();
        let _ = sender.join().unwrap();
        let mut out_r = std::fs::File::from(out_r);
        out_r.read_to_string(&mut read).unwrap();
        assert_eq!(read, "through");
        assert!(matches!(recv(&pl).unwrap(), Some(Request::Look)));
    }

    #[test]
    fn a_closed_link_ends_and_malformed_requests_are_refused() {
        let (nm, pl) = UnixStream::pair().unwrap();
        drop(nm);
        assert!(matches!(recv(&pl), Ok(None)));

        let (mut nm, pl) = UnixStream::pair().unwrap();
        nm.write_all(&[9, 0, 0, 0, 0]).unwrap();
        assert!(matches!(recv(&pl), Err(RequestError::Kind(9))));

        let (mut nm, pl) = UnixStream::pair().unwrap();
        nm.write_all(&[START, 0xff, 0xff, 0xff, 0xff]).unwrap();
        assert!(matches!(recv(&pl), Err(RequestError::TooLong(_))));

        // A START whose task has no output descriptors.
        let (mut nm, pl) = UnixStream::pair().unwrap();
        let body = spec().encode();
        nm.write_all(&[START]).unwrap();
        nm.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
        nm.write_all(&body).unwrap();
        assert!(matches!(recv(&pl), Err(RequestError::Descriptors(0))));

        // Garbage where the description should be.
        let (mut nm, pl) = UnixStream::pair().unwrap();
        let (_r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        send(&nm, START, &[0xff; 40], &[w.as_raw_fd(), w.as_raw_fd()]).unwrap();
        nm.flush().unwrap();
        assert!(matches!(recv(&pl), Err(RequestError::Spec(_))));
    }
}
