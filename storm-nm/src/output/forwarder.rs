//! The output forwarder's core: chunks, the queue's epochs, what is kept for sending again,
//! and when a stream counts as drained. It reads no pipe and starts no thread; its host
//! hands it what the tasks wrote and steps it (see the module overview in [`super`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use storm_cluster::RmLayout;
use storm_cluster::messages::{JobId, OutputChunk, Stream, decode, encode};
use storm_primitives::helpers::QueueProducer;
use storm_primitives::{EventId, NodeId, NodeSet, PrimError, Primitives, QueueLayout, Wait};

use super::Drained;

/// Bytes of a chunk's own fields in its encoding (job, rank, stream, offset, length).
const CHUNK_OVERHEAD: usize = 64;

/// How long a new epoch waits for the old epoch's transfers to complete before it starts
/// without them (the old MM may be gone, and its transfers with it).
const SWITCH_WAIT: Duration = Duration::from_secs(5);

/// One stream of one task, and the bytes of it read so far.
pub struct OutputStream {
    pub job: JobId,
    pub rank: u32,
    pub stream: Stream,
    /// Bytes of the stream read so far: the next chunk's offset.
    pub offset: u64,
    /// The task's count of streams not yet drained.
    pub remaining: Drained,
}

impl OutputStream {
    pub fn new(job: JobId, rank: u32, stream: Stream, remaining: Drained) -> Self {
        Self {
            job,
            rank,
            stream,
            offset: 0,
            remaining,
        }
    }
}

/// What the NM reads of a forwarder, from any thread, and how it holds it.
#[derive(Default)]
pub struct ForwarderState {
    /// The latest epoch in which everything read before it began has been delivered.
    flushed: AtomicU32,
    /// A delivery failed: the forwarder waits for a new epoch.
    stalled: AtomicBool,
    /// Output waits to be sent: the streams are not read meanwhile.
    backlogged: AtomicBool,
    /// The NM is registering: nothing is sent until the new epoch. Once the MM has taken the
    /// registration it may start the queue's next epoch, whose counters would pass for room
    /// (and for releases) in the old one.
    held: AtomicBool,
    /// Held while the forwarder sends, so that [`ForwarderState::hold`] can wait for a send
    /// under way to end.
    sending: Mutex<()>,
}

impl ForwarderState {
    /// Stops sending until the next epoch, and returns once no send is under way: called
    /// before each registration with the MM goes out.
    pub fn hold(&self) {
        if !self.held.swap(true, Ordering::AcqRel) {
            drop(self.sending.lock());
        }
    }

    /// Whether everything read before `epoch` began has been delivered in it.
    pub fn flushed(&self, epoch: u32) -> bool {
        self.flushed.load(Ordering::Acquire) == epoch
    }

    /// Whether a delivery failed (the NM should register again, which brings a new epoch).
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// Whether output waits to be sent (so the tasks' streams are not being read).
    pub fn backlogged(&self) -> bool {
        self.backlogged.load(Ordering::Acquire)
    }

    /// A new epoch is coming: the stall it ends is over.
    pub(super) fn clear_stalled(&self) {
        self.stalled.store(false, Ordering::Release);
    }

    fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// A delivery failed: nothing more is sent until a new epoch.
    fn stall(&self, why: &PrimError) {
        if !self.stalled.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                "output cannot reach the MM ({why}); holding it until the node registers again"
            );
        }
    }
}

/// The forwarder of one node's output.
pub struct Forwarder {
    prims: Arc<dyn Primitives>,
    queue: QueueLayout,
    mm: NodeId,
    event: EventId,
    /// Largest piece of a stream one chunk carries.
    max: usize,
    /// How long one ENQUEUE waits for room before the forwarder does something else.
    space_wait: Duration,
    /// The producer of the current epoch (none before the first).
    producer: Option<QueueProducer>,
    /// Entries sent in this epoch that the MM has not released yet (oldest first), with their
    /// sequence numbers: sent again in the next epoch.
    sent: VecDeque<(u64, Bytes)>,
    /// Encoded chunks not sent yet, oldest first.
    unsent: VecDeque<Bytes>,
    /// Transfers started whose completion has not been taken.
    outstanding: u64,
    /// Streams at their end, counted as drained once what was read from them is delivered.
    closing: Vec<Drained>,
    /// A new epoch waiting for the old epoch's transfers to complete, and until when.
    switching: Option<(u32, Instant)>,
    state: Arc<ForwarderState>,
    /// Called when streams count as drained (see [`Forwarder::wake_on_drained`]).
    on_drained: Option<Box<dyn Fn() + Send>>,
}

impl Forwarder {
    /// A forwarder for `node`'s output queue at the MM; it sends nothing until the first
    /// [`Forwarder::new_epoch`]. An ENQUEUE waits at most `space_wait` for room.
    pub fn new(
        prims: Arc<dyn Primitives>,
        rm: &RmLayout,
        node: NodeId,
        mm: NodeId,
        space_wait: Duration,
    ) -> Self {
        let queue = rm.output[node as usize];
        Self {
            prims,
            queue,
            mm,
            event: rm.output_sent,
            max: queue.slot_payload.saturating_sub(CHUNK_OVERHEAD).max(1),
            space_wait,
            producer: None,
            sent: VecDeque::new(),
            unsent: VecDeque::new(),
            outstanding: 0,
            closing: Vec::new(),
            switching: None,
            state: Arc::new(ForwarderState::default()),
            on_drained: None,
        }
    }

    /// Calls `wake` each time streams count as drained: a task's end may then be reported,
    /// and an NM that waits for its next heartbeat need not wait that long.
    pub fn wake_on_drained(&mut self, wake: Box<dyn Fn() + Send>) {
        self.on_drained = Some(wake);
    }

    /// What the NM reads of this forwarder (shared with another thread by the daemon).
    pub fn state(&self) -> &Arc<ForwarderState> {
        &self.state
    }

    /// Most bytes of a stream one chunk carries: read at most this much at a time.
    pub fn chunk_bytes(&self) -> usize {
        self.max
    }

    /// Whether the streams may be read: nothing waits to be sent (else the tasks wait).
    pub fn reading(&self) -> bool {
        self.unsent.is_empty()
    }

    /// Whether stepping again soon may do something without new input: a new epoch waits
    /// for the old one's transfers, or chunks wait for room.
    pub fn busy(&self) -> bool {
        self.switching.is_some() || !(self.unsent.is_empty() || self.state.stalled())
    }

    /// `data` was read from stream `s`: it becomes a chunk to send.
    pub fn data(&mut self, s: &mut OutputStream, data: &[u8]) {
        let chunk = OutputChunk {
            job: s.job,
            rank: s.rank,
            stream: s.stream,
            offset: s.offset,
            data: data.to_vec(),
        };
        s.offset += data.len() as u64;
        match encode("output", &chunk, self.queue.slot_payload) {
            Ok(b) => self.unsent.push_back(Bytes::from(b)),
            Err(e) => tracing::error!(job = s.job, rank = s.rank, "cannot encode output: {e}"),
        }
    }

    /// Stream `s` ended: it counts as drained once what was read from it is delivered.
    pub fn closed(&mut self, s: OutputStream) {
        self.closing.push(s.remaining);
    }

    /// Tells the MM (and through it storm-submit) that the rank took its standard input up
    /// to `upto` bytes: a chunk of no data, which no stream's drain waits on.
    pub fn input_taken(&mut self, job: JobId, rank: u32, upto: u64) {
        let chunk = OutputChunk {
            job,
            rank,
            stream: Stream::InputTaken,
            offset: upto,
            data: Vec::new(),
        };
        match encode("output", &chunk, self.queue.slot_payload) {
            Ok(b) => self.unsent.push_back(Bytes::from(b)),
            Err(e) => tracing::error!(job, rank, "cannot encode an input acknowledgement: {e}"),
        }
    }

    /// Delivers `text` as the rank's `stream` (its standard error, or storm's notice), as a
    /// stream that ends with it. The caller has counted it in `remaining`.
    pub fn tell(&mut self, job: JobId, rank: u32, stream: Stream, text: &str, remaining: &Drained) {
        let mut s = OutputStream::new(job, rank, stream, remaining.clone());
        self.data(&mut s, text.as_bytes());
        self.closed(s);
    }

    /// Drops what of job `job`'s output waits to go, sent or not: the job ended here with an
    /// earlier membership (the MM no longer runs it here), and what it wrote then must not
    /// reach the MM late, where it would pass for a later run's (a job queued again).
    pub fn discard(&mut self, job: JobId) {
        let limit = self.queue.slot_payload;
        let other =
            |b: &Bytes| decode::<OutputChunk>("output", b, limit).map_or(true, |c| c.job != job);
        let before = self.unsent.len() + self.sent.len();
        self.unsent.retain(other);
        self.sent.retain(|(_, b)| other(b));
        let dropped = before - self.unsent.len() - self.sent.len();
        if dropped > 0 {
            tracing::info!(
                job,
                dropped,
                "dropped the output of a job that ended here earlier"
            );
        }
    }

    /// A new membership starts the output queue at `epoch`: what the MM may not have passed
    /// on goes again, first, once the old epoch's transfers have completed. Sending stays
    /// held until then.
    pub fn new_epoch(&mut self, epoch: u32, now: Instant) {
        self.state.clear_stalled();
        self.switching = Some((epoch, now + SWITCH_WAIT));
    }

    /// Takes completions, starts a new epoch that is due, sends what waits while there is
    /// room, and counts closed streams as drained once what came before them is delivered.
    pub fn step(&mut self, now: Instant) {
        self.collect(Wait::Poll);
        if let Some((epoch, deadline)) = self.switching
            && (self.outstanding == 0 || now >= deadline)
        {
            self.switching = None;
            self.switch(epoch);
        }
        self.flush();
        self.collect(Wait::Poll);
        self.settle();
        let backlogged = !self.reading() || self.state.stalled();
        self.state.backlogged.store(backlogged, Ordering::Release);
    }

    /// Whether transfers started have not completed while something waits on them (a
    /// drained stream, the epoch's flush, a new epoch).
    pub fn awaiting_completions(&self) -> bool {
        let flushed = self
            .producer
            .as_ref()
            .is_none_or(|p| self.state.flushed((p.next_seq() >> 32) as u32));
        self.outstanding > 0 && (self.switching.is_some() || !self.closing.is_empty() || !flushed)
    }

    /// Waits up to `wait` for the completions of the transfers started (for a host with a
    /// thread of its own; [`Forwarder::step`] only looks).
    pub fn await_completions(&mut self, wait: Duration) {
        let deadline = Instant::now() + wait;
        while self.outstanding > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let before = self.outstanding;
            self.collect(Wait::Timeout(left));
            if self.outstanding == before {
                break;
            }
        }
    }

    /// Sends what waits, in order, while there is room and the MM takes it.
    fn flush(&mut self) {
        let state = self.state.clone();
        let _sending = state.sending.lock();
        let may_send = || !(state.held() || state.stalled());
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
                    state.stall(&e);
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
                    self.state.stall(&e);
                }
            }
        }
    }

    /// Counts closed streams as drained, and the epoch as flushed, once everything read
    /// before is delivered (sent, and every transfer completed).
    fn settle(&mut self) {
        let Some(producer) = &self.producer else {
            return;
        };
        let epoch = (producer.next_seq() >> 32) as u32;
        if self.closing.is_empty() && self.state.flushed(epoch) {
            return;
        }
        let delivered = self.unsent.is_empty()
            && self.outstanding == 0
            && self.switching.is_none()
            && !self.state.stalled();
        if !delivered {
            return;
        }
        let drained = !self.closing.is_empty();
        for remaining in self.closing.drain(..) {
            remaining.fetch_sub(1, Ordering::AcqRel);
        }
        self.state.flushed.store(epoch, Ordering::Release);
        if drained && let Some(wake) = &self.on_drained {
            wake();
        }
    }

    /// A new epoch: what the MM has not released goes again, ahead of what waits. Transfers
    /// of the old epoch not completed by now are given up.
    fn switch(&mut self, epoch: u32) {
        self.outstanding = 0;
        let again = self.sent.len();
        for (_, bytes) in self.sent.drain(..).rev() {
            self.unsent.push_front(bytes);
        }
        self.producer = Some(
            QueueProducer::new(self.queue, NodeSet::single(self.mm), epoch)
                .with_space_timeout(self.space_wait),
        );
        self.state.stalled.store(false, Ordering::Release);
        self.state.held.store(false, Ordering::Release);
        if again > 0 {
            tracing::info!(
                epoch,
                again,
                "sending again the output the MM may not have passed on"
            );
        }
    }
}
