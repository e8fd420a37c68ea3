//! Remote queues: ENQUEUE (Algorithm 2) and DEQUEUE (Algorithm 3).
//!
//! A producer multicasts entries into a queue that lives in the global memory of every node of
//! a fixed node set. Each slot carries a 16-byte header (payload length, sequence number) and
//! the payload. The consumer's `dequeued` counter is a global variable, so the producer checks
//! for space with COMPARE-AND-WRITE (AWAIT-SPACE) before it writes a slot.
//!
//! Counters are absolute and carry an *epoch* in their high 32 bits, so a queue can be reused
//! for a new stream (a new file transfer, a node re-joining): the consumer restarts at the new
//! epoch's base, and a producer waiting for space never mistakes a stale counter from an older
//! stream for room in the new one.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};

use super::flow::{Backoff, await_space};
use crate::error::{PrimError, Result};
use crate::event::Wait;
use crate::layout::{EventId, QUEUE_SLOT_HEADER, QueueLayout};
use crate::nodeset::NodeSet;
use crate::prims::Primitives;

/// First sequence number of `epoch`.
pub fn epoch_base(epoch: u32) -> u64 {
    (epoch as u64) << 32
}

/// The producer side of a remote queue: one producer, a fixed set of consumers.
#[derive(Debug, Clone)]
pub struct QueueProducer {
    queue: QueueLayout,
    dest: NodeSet,
    base: u64,
    enqueued: u64,
    backoff: Backoff,
    space_timeout: Option<Duration>,
}

impl QueueProducer {
    /// A producer for `queue` on the nodes of `dest`, starting at `epoch`.
    pub fn new(queue: QueueLayout, dest: NodeSet, epoch: u32) -> Self {
        let base = epoch_base(epoch);
        Self {
            queue,
            dest,
            base,
            enqueued: base,
            backoff: Backoff::default(),
            space_timeout: None,
        }
    }

    /// Fail an ENQUEUE that waits longer than `timeout` for space.
    pub fn with_space_timeout(mut self, timeout: Duration) -> Self {
        self.space_timeout = Some(timeout);
        self
    }

    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub fn dest(&self) -> &NodeSet {
        &self.dest
    }

    /// Entries enqueued so far in this epoch.
    pub fn count(&self) -> u64 {
        self.enqueued - self.base
    }

    /// Largest payload one entry may carry.
    pub fn max_payload(&self) -> usize {
        self.queue.slot_payload
    }

    /// AWAIT-SPACE for the next entry.
    pub fn await_space<P: Primitives + ?Sized>(&self, prims: &P) -> Result<()> {
        let slots = self.queue.slot_count as u64;
        let needed = (self.enqueued + 1).saturating_sub(slots).max(self.base);
        let deadline = self.space_timeout.map(|t| Instant::now() + t);
        await_space(
            prims,
            &self.dest,
            &self.queue,
            needed,
            self.backoff,
            deadline,
        )
    }

    /// ENQUEUE: waits for space on every node, then multicasts `payload` into the next slot
    /// and signals each consumer. Non-blocking past the wait for space: the transfer's outcome
    /// arrives through `local` (if given).
    pub fn enqueue<P: Primitives + ?Sized>(
        &mut self,
        prims: &P,
        payload: &[u8],
        local: Option<EventId>,
    ) -> Result<()> {
        if payload.len() > self.queue.slot_payload {
            return Err(PrimError::InvalidArgument(format!(
                "entry of {} bytes exceeds the queue's slot payload of {} bytes",
                payload.len(),
                self.queue.slot_payload
            )));
        }
        self.await_space(prims)?;
        let seq = self.enqueued;
        let slot = ((seq - self.base) % self.queue.slot_count as u64) as usize;
        let mut buf = BytesMut::with_capacity(QUEUE_SLOT_HEADER + payload.len());
        buf.put_u64_le(payload.len() as u64);
        buf.put_u64_le(seq);
        buf.put_slice(payload);
        prims.xfer_and_signal(
            &self.dest,
            self.queue.slot_offset(slot),
            buf.freeze(),
            Some(self.queue.arrived),
            local,
        )?;
        self.enqueued += 1;
        Ok(())
    }
}

/// The consumer side of a remote queue, on one node.
#[derive(Debug, Clone)]
pub struct QueueConsumer {
    queue: QueueLayout,
    base: u64,
    head: u64,
}

impl QueueConsumer {
    /// Starts consuming `queue` at `epoch`: sets this node's `dequeued` counter to the epoch's
    /// base and discards signals left from an earlier epoch.
    pub fn new<P: Primitives + ?Sized>(prims: &P, queue: QueueLayout, epoch: u32) -> Result<Self> {
        let base = epoch_base(epoch);
        while prims.test_event(queue.arrived, Wait::Poll).unwrap_or(false) {}
        prims.memory().store(queue.dequeued, base);
        Ok(Self {
            queue,
            base,
            head: base,
        })
    }

    /// Entries dequeued so far in this epoch.
    pub fn count(&self) -> u64 {
        self.head - self.base
    }

    /// DEQUEUE: waits (as `wait` says) for the next entry and returns its payload, or `None`
    /// if none arrived in time.
    pub fn dequeue<P: Primitives + ?Sized>(
        &mut self,
        prims: &P,
        wait: Wait,
    ) -> Result<Option<Bytes>> {
        if !prims.test_event(self.queue.arrived, wait)? {
            return Ok(None);
        }
        let slot = ((self.head - self.base) % self.queue.slot_count as u64) as usize;
        let offset = self.queue.slot_offset(slot);
        let mut header = [0u8; QUEUE_SLOT_HEADER];
        prims.memory().read(offset, &mut header)?;
        let len = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let seq = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
        if seq != self.head || len > self.queue.slot_payload as u64 {
            return Err(PrimError::Protocol {
                node: prims.node_id(),
                detail: format!(
                    "queue slot {slot} holds entry {seq} of {len} bytes where entry {} was due \
                     (two producers on one queue, or a producer that skipped AWAIT-SPACE?)",
                    self.head
                ),
            });
        }
        let payload = prims
            .memory()
            .read_vec(offset + QUEUE_SLOT_HEADER as u64, len as usize)?;
        self.head += 1;
        prims.memory().store(self.queue.dequeued, self.head);
        Ok(Some(Bytes::from(payload)))
    }
}
