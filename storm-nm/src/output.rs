//! Forwarding the tasks' output to the MM.
//!
//! One thread per NM watches the stdout and stderr pipes of every local task with `poll`, and
//! ENQUEUEs what it reads into this node's output queue in the MM's global memory (one
//! producer per queue, so the plain remote queue of Algorithm 2 suffices). Each chunk carries
//! its offset in its stream.
//!
//! **Nothing is lost when the MM goes away.** The MM releases a queue entry only once it has
//! passed the chunk on to storm-submit (see the MM's `manager::output`), so an entry the
//! producer has not seen released may still be lost with the MM. The forwarder keeps those
//! entries, and when a new membership starts a new queue epoch (after the node was out of the
//! heartbeat, or the MM restarted) it sends them again, before anything new; receivers keep
//! each byte once by its offset. Sending is held from the moment the NM registers until
//! the new epoch starts: once the MM has the registration it may reset the queue's counters
//! to the new epoch, and those would pass for room, and for releases, in the old one. A
//! delivery that fails stops the forwarder until the next epoch, and asks the NM to
//! register again (which brings one).
//!
//! **Memory is bounded.** The queue has `output_slots` slots and the producer never runs more
//! than that ahead of what the MM released, so at most `output_slots` entries are kept for
//! sending again; and while a chunk waits to be sent (no room in the queue, or no MM), the
//! forwarder reads no pipe, so at most one chunk per watched pipe waits. Beyond that the
//! tasks' writes wait in their pipes (64 KiB each, then `write` blocks): a task that writes
//! faster than its output reaches the user, or while the MM is away, is slowed down rather
//! than losing output. In all, at most `(output_slots + 2 × local tasks) × output_bytes`.
//!
//! A task's output counts as *drained* once both its pipes reached end-of-file and every chunk
//! read from them was delivered; the NM reports a job's termination only after that, so
//! storm-submit always has a task's last words before it learns the task ended.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use storm_cluster::RmLayout;
use storm_cluster::messages::{JobId, OutputChunk, Stream, encode};
use storm_primitives::helpers::QueueProducer;
use storm_primitives::{NodeId, NodeSet, PrimError, Primitives, QueueLayout, Wait};

/// Bytes of a chunk's own fields in its encoding (job, rank, stream, offset, length).
const CHUNK_OVERHEAD: usize = 64;

/// How long a waiting chunk waits for room in the queue before the forwarder looks at its
/// messages again.
const SPACE_WAIT: Duration = Duration::from_millis(10);

/// How long the forwarder waits for the completions of the transfers it started before it
/// counts a closed pipe as drained, or a new epoch as flushed (it looks again after that).
const COMPLETION_WAIT: Duration = Duration::from_millis(100);

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
    /// A new membership: send from now on at this epoch of the queue.
    Epoch(u32),
}

/// What the forwarder tells the NM.
#[derive(Default)]
struct Shared {
    /// The latest epoch in which everything read before it began has been delivered.
    flushed: AtomicU32,
    /// A delivery failed: the forwarder waits for a new epoch.
    stalled: AtomicBool,
    /// Output waits to be sent: the pipes are not read meanwhile.
    backlogged: AtomicBool,
    /// The NM is registering: nothing is sent until the new epoch. Once the MM has taken the
    /// registration it may start the queue's next epoch, whose counters would pass for room
    /// (and for releases) in the old one.
    held: AtomicBool,
    /// Held by the forwarder while it sends, so that [`Output::hold`] can wait for a send
    /// under way to end.
    sending: Mutex<()>,
}

/// The handle the NM keeps on its output thread.
pub struct Output {
    tx: Sender<Msg>,
    wake: OwnedFd,
    shared: Arc<Shared>,
}

impl Output {
    /// Starts the forwarder; it sends nothing until the first [`Output::new_epoch`].
    pub fn start(
        prims: Arc<dyn Primitives>,
        rm: &RmLayout,
        node: NodeId,
        mm: NodeId,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (wake_rx, wake_tx) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let queue = rm.output[node as usize];
        let shared = Arc::new(Shared::default());
        let forwarder = Forwarder {
            prims,
            queue,
            mm,
            event: rm.output_sent,
            max: queue.slot_payload.saturating_sub(CHUNK_OVERHEAD).max(1),
            producer: None,
            sent: VecDeque::new(),
            unsent: VecDeque::new(),
            outstanding: 0,
            closing: Vec::new(),
            shared: shared.clone(),
        };
        std::thread::Builder::new()
            .name("storm-nm-output".into())
            .spawn(move || forwarder.run(rx, wake_rx))?;
        Ok(Self {
            tx,
            wake: wake_tx,
            shared,
        })
    }

    fn poke(&self) {
        let _ = nix::unistd::write(&self.wake, &[1]);
    }

    fn send(&self, msg: Msg) {
        let _ = self.tx.send(msg);
        self.poke();
    }

    pub fn watch(&self, w: Watch) {
        self.send(Msg::Watch(w));
    }

    pub fn close_job(&self, job: JobId) {
        self.send(Msg::Close(job));
    }

    /// Stops sending until the next epoch, and returns once no send is under way: called
    /// before each registration with the MM goes out.
    pub fn hold(&self) {
        if !self.shared.held.swap(true, Ordering::AcqRel) {
            drop(self.shared.sending.lock());
        }
    }

    /// A new membership starts the output queue at `epoch`: what the MM may not have passed
    /// on goes again, first. (Sending stays held until the forwarder has switched.)
    pub fn new_epoch(&self, epoch: u32) {
        self.shared.stalled.store(false, Ordering::Release);
        self.send(Msg::Epoch(epoch));
    }

    /// Whether everything read before `epoch` began has been delivered in it.
    pub fn flushed(&self, epoch: u32) -> bool {
        self.shared.flushed.load(Ordering::Acquire) == epoch
    }

    /// Whether a delivery failed (the NM should register again, which brings a new epoch).
    pub fn stalled(&self) -> bool {
        self.shared.stalled.load(Ordering::Acquire)
    }

    /// Whether output waits to be sent (so the tasks' pipes are not being read).
    pub fn backlogged(&self) -> bool {
        self.shared.backlogged.load(Ordering::Acquire)
    }
}

/// A watched pipe, and the bytes of its stream read so far.
struct Watched {
    w: Watch,
    offset: u64,
}

struct Forwarder {
    prims: Arc<dyn Primitives>,
    queue: QueueLayout,
    mm: NodeId,
    event: storm_primitives::EventId,
    max: usize,
    /// The producer of the current epoch (none before the first).
    producer: Option<QueueProducer>,
    /// Entries sent in this epoch that the MM has not released yet (oldest first), with their
    /// sequence numbers: sent again in the next epoch.
    sent: VecDeque<(u64, Bytes)>,
    /// Encoded chunks not sent yet, oldest first.
    unsent: VecDeque<Bytes>,
    /// Transfers started whose completion has not been taken.
    outstanding: u64,
    /// Pipes at end-of-file, counted as drained once what was read from them is delivered.
    closing: Vec<Watch>,
    shared: Arc<Shared>,
}

impl Forwarder {
    fn run(mut self, rx: Receiver<Msg>, wake: OwnedFd) {
        let mut watches: Vec<Watched> = Vec::new();
        let mut buf = vec![0u8; self.max];
        loop {
            loop {
                match rx.try_recv() {
                    Ok(Msg::Watch(w)) => watches.push(Watched { w, offset: 0 }),
                    Ok(Msg::Close(job)) => {
                        let (closed, kept): (Vec<_>, Vec<_>) =
                            watches.drain(..).partition(|w| w.w.job == job);
                        watches = kept;
                        self.closing.extend(closed.into_iter().map(|w| w.w));
                    }
                    Ok(Msg::Epoch(epoch)) => self.switch(epoch),
                    Err(TryRecvError::Empty) => break,
                    // The NM is gone (shutting down): nothing left to forward to.
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            self.collect(Wait::Poll);
            self.flush();
            self.settle();
            // Read the pipes only when nothing waits to be sent: the tasks wait meanwhile.
            let reading = self.unsent.is_empty();
            self.shared
                .backlogged
                .store(!reading || self.stalled(), Ordering::Release);
            let timeout = if reading || self.stalled() {
                PollTimeout::from(1000u16)
            } else {
                PollTimeout::from(SPACE_WAIT.as_millis() as u16)
            };
            let ready: Vec<(bool, bool)> = {
                let mut fds = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
                if reading {
                    fds.extend(
                        watches
                            .iter()
                            .map(|w| PollFd::new(w.w.fd.as_fd(), PollFlags::POLLIN)),
                    );
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
                let w = &mut watches[i];
                match nix::unistd::read(&w.w.fd, &mut buf) {
                    Ok(0) => ended.push(i),
                    Ok(n) => self.read(w, &buf[..n]),
                    Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
                    Err(_) => ended.push(i),
                }
            }
            for i in ended.into_iter().rev() {
                self.closing.push(watches.remove(i).w);
            }
            self.flush();
        }
    }

    fn stalled(&self) -> bool {
        self.shared.stalled.load(Ordering::Acquire)
    }

    fn stall(&self, why: &PrimError) {
        stall(&self.shared, why);
    }

    /// Bytes read from a pipe become a chunk to send.
    fn read(&mut self, w: &mut Watched, data: &[u8]) {
        let chunk = OutputChunk {
            job: w.w.job,
            rank: w.w.rank,
            stream: w.w.stream,
            offset: w.offset,
            data: data.to_vec(),
        };
        w.offset += data.len() as u64;
        match encode("output", &chunk, self.queue.slot_payload) {
            Ok(b) => self.unsent.push_back(Bytes::from(b)),
            Err(e) => tracing::error!(job = w.w.job, rank = w.w.rank, "cannot encode output: {e}"),
        }
    }

    /// Sends what waits, in order, while there is room and the MM takes it.
    fn flush(&mut self) {
        let shared = self.shared.clone();
        let _sending = shared.sending.lock();
        let may_send =
            || !(shared.held.load(Ordering::Acquire) || shared.stalled.load(Ordering::Acquire));
        if !may_send() {
            return;
        }
        let Some(producer) = self.producer.as_mut() else {
            return;
        };
        while let Some(bytes) = self.unsent.front() {
            if !may_send() {
                return;
            }
            let seq = producer.next_seq();
            match producer.enqueue(&*self.prims, bytes, Some(self.event)) {
                Ok(()) => {
                    self.outstanding += 1;
                    let bytes = self.unsent.pop_front().expect("front");
                    self.sent.push_back((seq, bytes));
                }
                // No room yet (the MM has not released enough): the tasks wait.
                Err(PrimError::QueueFull { .. } | PrimError::Timeout { .. }) => break,
                Err(e) => {
                    stall(&self.shared, &e);
                    break;
                }
            }
        }
        // What the MM released is with storm-submit: no need to send it again.
        let slots = self.queue.slot_count as u64;
        let floor = producer
            .confirmed()
            .unwrap_or(0)
            .max(producer.next_seq().saturating_sub(slots));
        while self.sent.front().is_some_and(|(seq, _)| *seq < floor) {
            self.sent.pop_front();
        }
    }

    /// Takes the completions of finished transfers.
    fn collect(&mut self, wait: Wait) {
        while self.outstanding > 0 {
            match self.prims.test_event(self.event, wait) {
                Ok(true) => self.outstanding -= 1,
                Ok(false) => break,
                Err(e) => {
                    self.outstanding -= 1;
                    self.stall(&e);
                }
            }
        }
    }

    /// Waits (briefly) until every transfer started has completed; true if none is left and
    /// nothing waits to be sent.
    fn delivered(&mut self) -> bool {
        if !self.unsent.is_empty() || self.stalled() {
            return false;
        }
        let deadline = Instant::now() + COMPLETION_WAIT;
        while self.outstanding > 0 && Instant::now() < deadline {
            self.collect(Wait::Timeout(deadline - Instant::now()));
        }
        self.outstanding == 0 && !self.stalled()
    }

    /// Counts closed pipes as drained, and the epoch as flushed, once what came before is
    /// delivered.
    fn settle(&mut self) {
        let Some(producer) = &self.producer else {
            return;
        };
        let epoch = (producer.next_seq() >> 32) as u32;
        let flushed = self.shared.flushed.load(Ordering::Acquire) == epoch;
        if (self.closing.is_empty() && flushed) || !self.delivered() {
            return;
        }
        for w in self.closing.drain(..) {
            drop(w.fd);
            w.remaining.fetch_sub(1, Ordering::AcqRel);
        }
        self.shared.flushed.store(epoch, Ordering::Release);
    }

    /// A new epoch: what the MM has not released goes again, ahead of what waits.
    fn switch(&mut self, epoch: u32) {
        // Transfers of the old epoch complete (or fail: the old MM may be gone) first, so
        // that their outcome is not taken for one of the new epoch's.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.outstanding > 0 && Instant::now() < deadline {
            match self
                .prims
                .test_event(self.event, Wait::Timeout(COMPLETION_WAIT))
            {
                Ok(true) | Err(_) => self.outstanding -= 1,
                Ok(false) => {}
            }
        }
        self.outstanding = 0;
        let again = self.sent.len();
        for (_, bytes) in self.sent.drain(..).rev() {
            self.unsent.push_front(bytes);
        }
        self.producer = Some(
            QueueProducer::new(self.queue, NodeSet::single(self.mm), epoch)
                .with_space_timeout(SPACE_WAIT),
        );
        self.shared.stalled.store(false, Ordering::Release);
        self.shared.held.store(false, Ordering::Release);
        if again > 0 {
            tracing::info!(
                epoch,
                again,
                "sending again the output the MM may not have passed on"
            );
        }
    }
}

/// A delivery failed: nothing more is sent until a new epoch.
fn stall(shared: &Shared, why: &PrimError) {
    if !shared.stalled.swap(true, Ordering::AcqRel) {
        tracing::warn!(
            "output cannot reach the MM ({why}); holding it until the node registers again"
        );
    }
}
