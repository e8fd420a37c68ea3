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
    /// Every consumer is known to have dequeued at least this many (absolute) entries.
    /// `None` until a COMPARE-AND-WRITE has shown that every consumer joined this epoch.
    confirmed: Option<u64>,
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
            confirmed: None,
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
    ///
    /// A COMPARE-AND-WRITE that finds every consumer caught up tells the producer that the
    /// next `slots` entries fit, so while consumers keep up, one check covers about half a
    /// queue of entries instead of one each. When they lag, the producer waits for exactly
    /// the room it needs, as in Algorithm 1.
    pub fn await_space<P: Primitives + ?Sized>(&mut self, prims: &P) -> Result<()> {
        let slots = self.queue.slot_count as u64;
        let needed = (self.enqueued + 1).saturating_sub(slots).max(self.base);
        if self.confirmed.is_some_and(|c| c >= needed) {
            return Ok(());
        }
        // Ask for more room than needed: half a queue ahead of the wait.
        let hopeful = (self.enqueued + 1)
            .saturating_sub(slots / 2 + 1)
            .max(needed);
        let dequeued = self.queue.dequeued;
        if hopeful > needed
            && prims.compare_and_write(
                &self.dest,
                dequeued,
                crate::relation::Relation::Ge,
                hopeful,
                None,
            )?
        {
            self.confirmed = Some(hopeful);
            return Ok(());
        }
        let deadline = self.space_timeout.map(|t| Instant::now() + t);
        await_space(
            prims,
            &self.dest,
            &self.queue,
            needed,
            self.backoff,
            deadline,
        )?;
        self.confirmed = Some(needed);
        Ok(())
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
        self.dequeue_with(prims, wait, Bytes::copy_from_slice)
    }

    /// DEQUEUE without copying: `consume` gets the payload in place, in the queue slot; the
    /// slot is released (and may be overwritten by the producer) only after it returns.
    pub fn dequeue_with<P: Primitives + ?Sized, R>(
        &mut self,
        prims: &P,
        wait: Wait,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
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
        // SAFETY: the producer writes this slot again only after every consumer, this one
        // included, has advanced `dequeued` past it (AWAIT-SPACE), which happens below.
        let payload = unsafe {
            prims
                .memory()
                .view(offset + QUEUE_SLOT_HEADER as u64, len as usize)?
        };
        let result = consume(payload);
        self.head += 1;
        prims.memory().store(self.queue.dequeued, self.head);
        Ok(Some(result))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::layout::{Layout, VarId};
    use crate::local::{LocalFabric, LocalNode};
    use crate::memory::GlobalMemory;
    use crate::relation::Relation;

    /// A node that counts its COMPARE-AND-WRITEs.
    struct Counting(LocalNode, AtomicUsize);

    impl Primitives for Counting {
        fn node_id(&self) -> crate::NodeId {
            self.0.node_id()
        }
        fn nodes(&self) -> NodeSet {
            self.0.nodes()
        }
        fn layout(&self) -> &Layout {
            self.0.layout()
        }
        fn memory(&self) -> &GlobalMemory {
            self.0.memory()
        }
        fn xfer_and_signal(
            &self,
            d: &NodeSet,
            o: u64,
            b: Bytes,
            r: Option<EventId>,
            l: Option<EventId>,
        ) -> Result<()> {
            self.0.xfer_and_signal(d, o, b, r, l)
        }
        fn test_event(&self, e: EventId, w: Wait) -> Result<bool> {
            self.0.test_event(e, w)
        }
        fn compare_and_write(
            &self,
            d: &NodeSet,
            v: VarId,
            r: Relation,
            x: u64,
            w: Option<(VarId, u64)>,
        ) -> Result<bool> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.compare_and_write(d, v, r, x, w)
        }
    }

    fn setup(slots: usize) -> (Arc<LocalFabric>, QueueLayout) {
        let mut b = Layout::builder();
        let q = b.queue("q", slots, 64);
        (LocalFabric::new(3, b.build().unwrap()), q)
    }

    #[test]
    fn await_space_costs_one_check_per_half_queue_while_consumers_keep_up() {
        let (fabric, q) = setup(16);
        let producer_node = Counting(fabric.node(0), AtomicUsize::new(0));
        let mut consumers: Vec<_> = (1..3)
            .map(|i| {
                (
                    fabric.node(i),
                    QueueConsumer::new(&fabric.node(i), q, 3).unwrap(),
                )
            })
            .collect();
        let mut producer = QueueProducer::new(q, "1-2".parse().unwrap(), 3);
        for i in 0..160u64 {
            producer
                .enqueue(&producer_node, &i.to_le_bytes(), None)
                .unwrap();
            for (node, c) in &mut consumers {
                let got = c.dequeue(node, Wait::Poll).unwrap().expect("entry present");
                assert_eq!(&got[..], &i.to_le_bytes());
            }
        }
        let checks = producer_node.1.load(Ordering::Relaxed);
        assert!(
            checks <= 160 / 8 + 2,
            "{checks} COMPARE-AND-WRITEs for 160 entries in a 16-slot queue"
        );
        assert!(
            checks >= 1,
            "the first entry must check that the consumers joined the epoch"
        );
    }

    #[test]
    fn a_producer_that_starts_before_its_consumers_loses_nothing() {
        let (fabric, q) = setup(4);
        let f = fabric.clone();
        let producer = std::thread::spawn(move || {
            let mut p = QueueProducer::new(q, "1".parse().unwrap(), 9)
                .with_space_timeout(Duration::from_secs(30));
            for i in 0..20u64 {
                p.enqueue(&f.node(0), &i.to_le_bytes(), None).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        let node = fabric.node(1);
        let mut c = QueueConsumer::new(&node, q, 9).unwrap();
        for i in 0..20u64 {
            let got = c
                .dequeue(&node, Wait::Timeout(Duration::from_secs(30)))
                .unwrap()
                .expect("entry");
            assert_eq!(&got[..], &i.to_le_bytes());
        }
        producer.join().unwrap();
    }
}
