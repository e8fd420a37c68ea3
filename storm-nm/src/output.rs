//! Forwarding the tasks' output to the MM.
//!
//! One thread per NM watches the stdout and stderr pipes of every local task with `poll`, and
//! ENQUEUEs what it reads into this node's output queue in the MM's global memory (one
//! producer per queue, so the plain remote queue of Algorithm 2 suffices). A full queue makes
//! the thread wait in AWAIT-SPACE, and a waiting thread stops reading the pipes, so a task that
//! writes faster than the output reaches the user is slowed down rather than losing output.
//!
//! A task's output counts as *drained* once both its pipes reached end-of-file and every chunk
//! read from them was delivered; the NM reports a job's termination only after that, so
//! storm-submit always has a task's last words before it learns the task ended.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use storm_cluster::RmLayout;
use storm_cluster::messages::{JobId, OutputChunk, Stream, encode};
use storm_primitives::helpers::QueueProducer;
use storm_primitives::{NodeId, NodeSet, Primitives, Wait};

/// Bytes of a chunk's own fields in its encoding (job, rank, stream, length).
const CHUNK_OVERHEAD: usize = 64;

/// Streams of one task still open or undelivered; 0 means drained.
pub type Drained = Arc<AtomicU32>;

/// A pipe to watch.
pub struct Watch {
    pub job: JobId,
    pub rank: u32,
    pub stream: Stream,
    pub fd: OwnedFd,
    pub remaining: Drained,
}

enum Msg {
    Watch(Watch),
    /// Stop reading a job's pipes (its tasks ended long ago but something still holds them).
    Close(JobId),
}

/// The handle the NM keeps on its output thread.
pub struct Output {
    tx: Sender<Msg>,
    wake: OwnedFd,
}

impl Output {
    pub fn start(
        prims: Arc<dyn Primitives>,
        rm: &RmLayout,
        node: NodeId,
        mm: NodeId,
        epoch: u32,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (wake_rx, wake_tx) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let producer = QueueProducer::new(rm.output[node as usize], NodeSet::single(mm), epoch);
        let event = rm.output_sent;
        let max = rm.output[node as usize]
            .slot_payload
            .saturating_sub(CHUNK_OVERHEAD)
            .max(1);
        std::thread::Builder::new()
            .name("storm-nm-output".into())
            .spawn(move || {
                Forwarder {
                    prims,
                    producer,
                    event,
                    max,
                    outstanding: 0,
                }
                .run(rx, wake_rx)
            })?;
        Ok(Self { tx, wake: wake_tx })
    }

    fn poke(&self) {
        let _ = nix::unistd::write(&self.wake, &[1]);
    }

    pub fn watch(&self, w: Watch) {
        let _ = self.tx.send(Msg::Watch(w));
        self.poke();
    }

    pub fn close_job(&self, job: JobId) {
        let _ = self.tx.send(Msg::Close(job));
        self.poke();
    }
}

struct Forwarder {
    prims: Arc<dyn Primitives>,
    producer: QueueProducer,
    event: storm_primitives::EventId,
    max: usize,
    outstanding: u64,
}

impl Forwarder {
    fn run(mut self, rx: Receiver<Msg>, wake: OwnedFd) {
        let mut watches: Vec<Watch> = Vec::new();
        let mut buf = vec![0u8; self.max];
        loop {
            loop {
                match rx.try_recv() {
                    Ok(Msg::Watch(w)) => watches.push(w),
                    Ok(Msg::Close(job)) => {
                        let (closed, kept): (Vec<_>, Vec<_>) =
                            watches.drain(..).partition(|w| w.job == job);
                        watches = kept;
                        for w in closed {
                            self.finish(w);
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    // The NM is gone (shutting down): nothing left to forward to.
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            let ready: Vec<(bool, bool)> = {
                let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
                fds.extend(
                    watches
                        .iter()
                        .map(|w| PollFd::new(w.fd.as_fd(), PollFlags::POLLIN)),
                );
                match poll(&mut fds, PollTimeout::from(1000u16)) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::error!("output poll failed: {e}");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        continue;
                    }
                }
                fds.iter()
                    .map(|f| {
                        let r = f.revents().unwrap_or(PollFlags::empty());
                        (
                            r.contains(PollFlags::POLLIN),
                            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR),
                        )
                    })
                    .collect()
            };
            if ready[0].1 {
                // The wake pipe's writer closed: the NM is gone. Without this the hung-up
                // pipe would make every poll return at once, and the thread spin.
                return;
            }
            if ready[0].0 {
                let mut sink = [0u8; 64];
                while matches!(nix::unistd::read(&wake, &mut sink), Ok(n) if n > 0) {}
            }
            let mut ended = Vec::new();
            for (i, (readable, hung_up)) in ready.into_iter().skip(1).enumerate() {
                if !(readable || hung_up) {
                    continue;
                }
                let w = &watches[i];
                match nix::unistd::read(&w.fd, &mut buf) {
                    Ok(0) => ended.push(i),
                    Ok(n) => self.send(w, &buf[..n]),
                    Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
                    Err(_) => ended.push(i),
                }
            }
            for i in ended.into_iter().rev() {
                let w = watches.remove(i);
                self.finish(w);
            }
            self.collect(Wait::Poll);
        }
    }

    fn send(&mut self, w: &Watch, data: &[u8]) {
        let chunk = OutputChunk {
            job: w.job,
            rank: w.rank,
            stream: w.stream,
            data: data.to_vec(),
        };
        let bytes = match encode("output", &chunk, self.producer.max_payload()) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("cannot encode output: {e}");
                return;
            }
        };
        match self
            .producer
            .enqueue(&*self.prims, &bytes, Some(self.event))
        {
            Ok(()) => self.outstanding += 1,
            Err(e) => tracing::warn!(
                job = w.job,
                rank = w.rank,
                "output lost: cannot reach the MM: {e}"
            ),
        }
    }

    /// Counts finished deliveries.
    fn collect(&mut self, wait: Wait) {
        while self.outstanding > 0 {
            match self.prims.test_event(self.event, wait) {
                Ok(true) => self.outstanding -= 1,
                Ok(false) => break,
                Err(e) => {
                    self.outstanding -= 1;
                    tracing::warn!("output delivery failed: {e}");
                }
            }
        }
    }

    /// A pipe is done: wait until everything read from it was delivered, then count it.
    fn finish(&mut self, w: Watch) {
        self.collect(Wait::Timeout(std::time::Duration::from_secs(30)));
        drop(w.fd);
        w.remaining.fetch_sub(1, Ordering::AcqRel);
    }
}
