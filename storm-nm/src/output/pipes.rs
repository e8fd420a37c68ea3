//! The daemon's host of the forwarder: one thread per NM waits with `poll` on the stdout and
//! stderr pipes of every local task, and hands what it reads to the [`Forwarder`] it owns.
//! The NM's loop talks to it through [`Output`].

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use storm_cluster::RmLayout;
use storm_cluster::messages::{JobId, Stream};
use storm_primitives::{NodeId, Primitives};

use super::{Drained, Forwarder, ForwarderState, InputFeeds, OutputSource, OutputStream};

/// How long a chunk waits for room in the queue before the thread looks at its messages and
/// pipes again; also how often streams without a pipe are read.
const SPACE_WAIT: Duration = Duration::from_millis(10);

/// How long the thread waits for the completions of the transfers it started before it
/// looks at its messages again.
const COMPLETION_WAIT: Duration = Duration::from_millis(100);

/// How long the thread sleeps in `poll` when nothing is under way.
const IDLE_WAIT: u16 = 1000;

enum Msg {
    Watch(OutputStream, Box<dyn OutputSource>),
    /// Stop reading a job's pipes (its tasks ended long ago but something still holds them).
    Close(JobId),
    /// A new membership: send from now on at this epoch of the queue.
    Epoch(u32),
    /// The job ended with an earlier membership: stop reading it, drop what waits of it.
    Discard(JobId),
    /// Text for a rank's standard error.
    Tell(JobId, u32, Stream, String, Drained),
    /// The write end of a rank's standard input.
    Feed(JobId, u32, OwnedFd),
    /// The job is gone: close its input pipes.
    EndInput(JobId),
    /// A piece of a rank's standard input.
    Input {
        job: JobId,
        rank: u32,
        offset: u64,
        data: Vec<u8>,
        eof: bool,
    },
}

/// The handle the NM keeps on its output thread.
pub struct Output {
    tx: Sender<Msg>,
    wake: OwnedFd,
    state: Arc<ForwarderState>,
}

impl Output {
    /// Starts the forwarder's thread; it sends nothing until the first new epoch.
    pub fn start(
        prims: Arc<dyn Primitives>,
        rm: &RmLayout,
        node: NodeId,
        mm: NodeId,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (wake_rx, wake_tx) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let mut core = Forwarder::new(prims.clone(), rm, node, mm, SPACE_WAIT);
        // A task's streams drained: end the NM's wait for its next heartbeat, so that it
        // reports the task's end now. A wake-up is no signal: DEQUEUE returns nothing and
        // reads no slot.
        let heartbeat = rm.heartbeat.arrived;
        core.wake_on_drained(Box::new(move || {
            let _ = prims.wake_local(heartbeat);
        }));
        let state = core.state().clone();
        std::thread::Builder::new()
            .name("storm-nm-output".into())
            .spawn(move || run(core, rx, wake_rx))?;
        Ok(Self {
            tx,
            wake: wake_tx,
            state,
        })
    }

    fn send(&self, msg: Msg) {
        let _ = self.tx.send(msg);
        let _ = nix::unistd::write(&self.wake, &[1]);
    }
}

/// A watched stream.
struct Watched {
    s: OutputStream,
    source: Box<dyn OutputSource>,
}

/// Stops reading job `job`'s streams: each counts as closed from here.
fn stop_watching(watches: &mut Vec<Watched>, core: &mut Forwarder, job: JobId) {
    let (closed, kept): (Vec<_>, Vec<_>) = watches.drain(..).partition(|w| w.s.job == job);
    *watches = kept;
    for w in closed {
        core.closed(w.s);
    }
}

fn run(mut core: Forwarder, rx: Receiver<Msg>, wake: OwnedFd) {
    let mut watches: Vec<Watched> = Vec::new();
    let mut inputs = InputFeeds::default();
    let mut buf = vec![0u8; core.chunk_bytes()];
    loop {
        loop {
            match rx.try_recv() {
                Ok(Msg::Watch(s, source)) => watches.push(Watched { s, source }),
                Ok(Msg::Discard(job)) => {
                    stop_watching(&mut watches, &mut core, job);
                    core.discard(job);
                }
                Ok(Msg::Close(job)) => {
                    stop_watching(&mut watches, &mut core, job);
                    inputs.close_job(job);
                }
                Ok(Msg::Feed(job, rank, pipe)) => inputs.feed(job, rank, pipe),
                Ok(Msg::EndInput(job)) => inputs.close_job(job),
                Ok(Msg::Input {
                    job,
                    rank,
                    offset,
                    data,
                    eof,
                }) => inputs.input(job, rank, offset, data, eof),
                Ok(Msg::Epoch(epoch)) => core.new_epoch(epoch, Instant::now()),
                Ok(Msg::Tell(job, rank, stream, text, remaining)) => {
                    core.tell(job, rank, stream, &text, &remaining)
                }
                Err(TryRecvError::Empty) => break,
                // The NM is gone (shutting down): nothing left to forward to.
                Err(TryRecvError::Disconnected) => return,
            }
        }
        inputs.pump(&mut core);
        core.step(Instant::now());
        if core.awaiting_completions() {
            core.await_completions(COMPLETION_WAIT);
            core.step(Instant::now());
        }
        // Read the pipes only when nothing waits to be sent: the tasks wait meanwhile.
        let reading = core.reading();
        let unpolled = watches.iter().any(|w| w.source.pipe().is_none());
        let timeout = if core.busy() || (reading && unpolled) {
            PollTimeout::from(SPACE_WAIT.as_millis() as u16)
        } else {
            PollTimeout::from(IDLE_WAIT)
        };
        let ready: Vec<bool> = {
            let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
            // Pipes of standard input with bytes waiting for room: pumped after the poll.
            for (_, fd) in inputs.waiting_pipes() {
                fds.push(PollFd::new(fd, PollFlags::POLLOUT));
            }
            let first_output = fds.len();
            let mut polled = Vec::new();
            if reading {
                for (i, w) in watches.iter().enumerate() {
                    if let Some(fd) = w.source.pipe() {
                        fds.push(PollFd::new(fd, PollFlags::POLLIN));
                        polled.push(i);
                    }
                }
            }
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!("output poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            let revents = |f: &PollFd| f.revents().unwrap_or(PollFlags::empty());
            if revents(&fds[0]).intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
                // The wake pipe's writer closed: the NM is gone. Without this the hung-up
                // pipe would make every poll return at once, and the thread spin.
                return;
            }
            if revents(&fds[0]).contains(PollFlags::POLLIN) {
                let mut sink = [0u8; 64];
                while matches!(nix::unistd::read(&wake, &mut sink), Ok(n) if n > 0) {}
            }
            // Which watches to read: every stream without a pipe, and the pipes with news.
            let mut ready: Vec<bool> = watches
                .iter()
                .map(|w| reading && w.source.pipe().is_none())
                .collect();
            for (f, &i) in fds[first_output..].iter().zip(&polled) {
                ready[i] = revents(f)
                    .intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR);
            }
            ready
        };
        let mut ended = Vec::new();
        for (i, _) in ready.iter().enumerate().filter(|(_, r)| **r) {
            let w = &mut watches[i];
            match w.source.read(&mut buf) {
                Ok(0) => ended.push(i),
                Ok(n) => core.data(&mut w.s, &buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                    ) => {}
                Err(_) => ended.push(i),
            }
        }
        for i in ended.into_iter().rev() {
            core.closed(watches.remove(i).s);
        }
        inputs.pump(&mut core);
        core.step(Instant::now());
    }
}

/// The NM's view of the thread, as its environment's forwarder.
impl crate::env::OutputForwarder for Output {
    fn watch(
        &mut self,
        job: JobId,
        rank: u32,
        stream: Stream,
        source: Box<dyn OutputSource>,
        remaining: Drained,
    ) {
        let s = OutputStream::new(job, rank, stream, remaining);
        self.send(Msg::Watch(s, source));
    }

    fn tell(&mut self, job: JobId, rank: u32, stream: Stream, text: &str, remaining: &Drained) {
        // Counted now: the NM must not take the rank as drained before the thread has it.
        remaining.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.send(Msg::Tell(
            job,
            rank,
            stream,
            text.to_string(),
            remaining.clone(),
        ));
    }

    fn feed(&mut self, job: JobId, rank: u32, pipe: OwnedFd) {
        self.send(Msg::Feed(job, rank, pipe));
    }

    fn input(&mut self, job: JobId, rank: u32, offset: u64, data: Vec<u8>, eof: bool) {
        self.send(Msg::Input {
            job,
            rank,
            offset,
            data,
            eof,
        });
    }

    fn close_job(&mut self, job: JobId) {
        self.send(Msg::Close(job));
    }

    fn end_input(&mut self, job: JobId) {
        self.send(Msg::EndInput(job));
    }

    fn discard_job(&mut self, job: JobId) {
        self.send(Msg::Discard(job));
    }

    /// Sending stays held until the thread has switched to the new epoch.
    fn new_epoch(&mut self, epoch: u32) {
        // The NM looks at `stalled` before the thread has the message.
        self.state.clear_stalled();
        self.send(Msg::Epoch(epoch));
    }

    fn state(&self) -> &ForwarderState {
        &self.state
    }
}
