//! The NM's requests to its node's launcher, over a Unix stream socket.
//!
//! A request is a 5-byte header, `[kind][body length, u32 little-endian]`, then the body.
//! The task's descriptors (SCM_RIGHTS) go with the request's first byte, so the reader that
//! takes the header with `recvmsg` gets them (the kernel hands a message's descriptors to
//! the first read of its bytes), and the `read` of the body never meets any.
//!
//! The NM sends through an [`Outbox`], which never blocks: a launcher that is stopped or
//! starved leaves requests queued, and the NM goes on with its heartbeats. The launcher reads
//! with [`recv`], blocking, as a request it started to read always arrives whole.
//!
//! - START: the body is the task's [`PlSpec`]; the descriptors are the task's standard output
//!   and error (write ends of the NM's pipes) and, for an MPI task, its end of the PMI socket.
//! - LOOK: no body, no descriptors: a held or cancelled slot changed, look at the kept
//!   requests again.

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::PlSpec;

const START: u8 = 1;
const LOOK: u8 = 2;
const HEADER: usize = 5;
/// Most descriptors one request carries.
const MAX_FDS: usize = 4;
/// Longest task description taken (the heartbeat that carried the job bounds it far below).
const MAX_BODY: usize = 16 << 20;

/// A task to start, as the launcher receives it.
#[derive(Debug)]
pub struct StartTask {
    pub spec: PlSpec,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The task's standard input, when its spec says it has one (else `/dev/null`).
    pub stdin: Option<OwnedFd>,
    pub pmi: Option<OwnedFd>,
}

/// One request, as the launcher receives it.
#[derive(Debug)]
pub enum Request {
    /// Boxed: a task description is far larger than a LOOK.
    Start(Box<StartTask>),
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
    #[error("START request with {0} descriptors (2 to 4 expected)")]
    Descriptors(usize),
    #[error("LOOK request with a body or descriptors")]
    LookWithPayload,
    #[error("task description: {0}")]
    Spec(String),
}

/// The NM's end of the link. Requests queue here and go out as fast as the launcher takes
/// them: the link does not block, so a stopped or starved launcher never holds up the NM.
/// The queue is bounded by the table (a START per claimed slot) and one LOOK.
#[derive(Debug)]
pub struct Outbox {
    link: UnixStream,
    queue: VecDeque<Outgoing>,
}

/// One request on its way: its bytes (header then body), how many went out, and the
/// descriptors that go with the first byte.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    sent: usize,
    fds: Vec<OwnedFd>,
}

impl Outbox {
    /// Makes `link` non-blocking and sends on it.
    pub fn new(link: UnixStream) -> std::io::Result<Self> {
        link.set_nonblocking(true)?;
        Ok(Self {
            link,
            queue: VecDeque::new(),
        })
    }

    /// Asks the launcher to start `spec`'s task with these descriptors: its standard output
    /// and error (write ends of the NM's pipes) and, for an MPI task, its PMI socket. They
    /// are closed here once they went out.
    /// `stdin` must be given exactly when `spec.stdin` says so.
    pub fn start(
        &mut self,
        spec: &PlSpec,
        stdout: OwnedFd,
        stderr: OwnedFd,
        stdin: Option<OwnedFd>,
        pmi: Option<OwnedFd>,
    ) -> std::io::Result<()> {
        debug_assert_eq!(spec.stdin, stdin.is_some());
        let mut fds = vec![stdout, stderr];
        fds.extend(stdin);
        fds.extend(pmi);
        self.queue
            .push_back(Outgoing::new(START, &spec.encode(), fds));
        self.flush().map(|_| ())
    }

    /// Asks the launcher to look at its kept requests again (once: a LOOK not yet sent
    /// already asks).
    pub fn look(&mut self) -> std::io::Result<()> {
        let unsent = |o: &Outgoing| o.sent == 0 && o.bytes[0] == LOOK;
        if !self.queue.back().is_some_and(unsent) {
            self.queue.push_back(Outgoing::new(LOOK, &[], Vec::new()));
        }
        self.flush().map(|_| ())
    }

    /// Sends what the launcher takes now; whether everything went out. An error means the
    /// launcher's end is gone.
    pub fn flush(&mut self) -> std::io::Result<bool> {
        while let Some(next) = self.queue.front_mut() {
            let raw: Vec<RawFd> = next.fds.iter().map(|fd| fd.as_raw_fd()).collect();
            let rights = [ControlMessage::ScmRights(&raw)];
            let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
            let iov = [IoSlice::new(&next.bytes[next.sent..])];
            let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
            match sendmsg::<()>(self.link.as_raw_fd(), &iov, cmsgs, flags, None) {
                // The descriptors went with the first byte sent.
                Ok(n) => {
                    next.sent += n;
                    next.fds.clear();
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
            if next.sent == next.bytes.len() {
                self.queue.pop_front();
            }
        }
        Ok(true)
    }

    /// How many requests wait, in part or whole, for the launcher to take them.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Sends everything, waiting up to `within` for the launcher to take it; whether it all
    /// went out.
    pub fn flush_within(&mut self, within: Duration) -> std::io::Result<bool> {
        let deadline = Instant::now() + within;
        loop {
            if self.flush()? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let mut fds = [PollFd::new(self.link.as_fd(), PollFlags::POLLOUT)];
            let wait = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, wait) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Outgoing {
    fn new(kind: u8, body: &[u8], fds: Vec<OwnedFd>) -> Self {
        let mut bytes = Vec::with_capacity(HEADER + body.len());
        bytes.push(kind);
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(body);
        Self {
            bytes,
            sent: 0,
            fds,
        }
    }
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
            // stdout, stderr, then stdin if the spec says so, then the PMI socket if any.
            let count = fds.len();
            let needed = 2 + usize::from(spec.stdin);
            if count < needed || count > needed + 1 {
                return Err(RequestError::Descriptors(count));
            }
            let mut fds = fds.into_iter();
            let (Some(stdout), Some(stderr)) = (fds.next(), fds.next()) else {
                return Err(RequestError::Descriptors(count));
            };
            let stdin = if spec.stdin { fds.next() } else { None };
            Ok(Some(Request::Start(Box::new(StartTask {
                spec,
                stdout,
                stderr,
                stdin,
                pmi: fds.next(),
            }))))
        }
        other => Err(RequestError::Kind(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
            env: vec![("K".into(), "V".repeat(env_bytes).into())],
            cwd: "/".into(),
            uid: 1,
            gid: 2,
            cgroups: Vec::new(),
            output_file: Some("out-7".into()),
            error_file: None,
            stdin: false,
        }
    }

    /// The NM queues a request larger than the socket's buffer and goes on at once; the
    /// launcher, reading later, gets it whole with its descriptors, then a single LOOK for the
    /// two asked while the first was still queued.
    #[test]
    fn requests_queue_without_blocking_and_arrive_whole_with_their_descriptors() {
        let (nm, pl) = UnixStream::pair().unwrap();
        let mut outbox = Outbox::new(nm).unwrap();
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let (_err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        // Nobody reads yet: a blocking send would never return here.
        outbox
            .start(&spec_with(300_000), out_w, err_w, None, None)
            .unwrap();
        assert_eq!(outbox.queued(), 1, "the START cannot all fit in the socket");
        outbox.look().unwrap();
        outbox.look().unwrap();
        assert_eq!(outbox.queued(), 2, "a LOOK not yet sent already asks");

        let reader = std::thread::spawn(move || {
            let first = recv(&pl).unwrap();
            let second = recv(&pl).unwrap();
            (first, second, pl)
        });
        assert!(outbox.flush_within(Duration::from_secs(20)).unwrap());
        assert_eq!(outbox.queued(), 0);
        drop(outbox);
        let (first, second, pl) = reader.join().unwrap();
        let Some(Request::Start(task)) = first else {
            panic!("expected a START, got {first:?}");
        };
        assert_eq!(task.spec, spec_with(300_000));
        assert!(task.pmi.is_none());
        // The descriptor received is the pipe's write end: what goes in comes out.
        let mut out = std::fs::File::from(task.stdout);
        out.write_all(b"through").unwrap();
        drop(out);
        let mut read = String::new();
        let mut out_r = std::fs::File::from(out_r);
        out_r.read_to_string(&mut read).unwrap();
        assert_eq!(read, "through");
        assert!(matches!(second, Some(Request::Look)));
        assert!(matches!(recv(&pl), Ok(None)), "one LOOK only, then the end");
    }

    /// A task that reads the job's input gets its stdin pipe as the third descriptor, and
    /// the PMI socket stays the last: each lands where it belongs.
    #[test]
    fn a_start_with_standard_input_and_pmi_keeps_each_descriptor_in_its_place() {
        let (nm, pl) = UnixStream::pair().unwrap();
        let mut outbox = Outbox::new(nm).unwrap();
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let ((_o, out_w), (_e, err_w), (in_r, in_w)) = (pipe(), pipe(), pipe());
        let (pmi_nm, pmi_task) = UnixStream::pair().unwrap();
        let spec = PlSpec {
            stdin: true,
            ..spec_with(10)
        };
        outbox
            .start(&spec, out_w, err_w, Some(in_r), Some(pmi_task.into()))
            .unwrap();
        assert!(outbox.flush_within(Duration::from_secs(5)).unwrap());
        let Some(Request::Start(task)) = recv(&pl).unwrap() else {
            panic!("expected a START");
        };
        let mut stdin = std::fs::File::from(task.stdin.expect("the stdin pipe"));
        nix::unistd::write(&in_w, b"typed").unwrap();
        let mut got = [0u8; 5];
        stdin.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"typed");
        let mut pmi = UnixStream::from(task.pmi.expect("the PMI socket"));
        (&pmi_nm).write_all(b"cmd=init\n").unwrap();
        let mut line = [0u8; 9];
        pmi.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"cmd=init\n");
    }

    /// Once the launcher's end is gone, sending says so instead of queueing forever.
    #[test]
    fn sending_to_a_launcher_that_is_gone_is_an_error() {
        let (nm, pl) = UnixStream::pair().unwrap();
        let mut outbox = Outbox::new(nm).unwrap();
        drop(pl);
        assert!(outbox.look().is_err());
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
        let (nm, pl) = UnixStream::pair().unwrap();
        let (_r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let mut outbox = Outbox::new(nm).unwrap();
        let fds = vec![w.try_clone().unwrap(), w];
        outbox
            .queue
            .push_back(Outgoing::new(START, &[0xff; 40], fds));
        assert!(outbox.flush().unwrap());
        assert!(matches!(recv(&pl), Err(RequestError::Spec(_))));
    }
}
