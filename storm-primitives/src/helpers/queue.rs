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
    op_timeout: Option<Duration>,
    on_arrival: bool,
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
            op_timeout: None,
            on_arrival: false,
        }
    }

    /// Gives each primitive of an ENQUEUE (the AWAIT-SPACE checks and the transfer) at most
    /// `timeout`, so that a consumer that stops answering is named within it.
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// Fail an ENQUEUE that waits longer than `timeout` for space.
    pub fn with_space_timeout(mut self, timeout: Duration) -> Self {
        self.space_timeout = Some(timeout);
        self
    }

    /// Sends each entry with [`Primitives::xfer_and_signal_on_arrival_within`]: one round
    /// trip instead of two where the backend commits in two phases, but an entry whose
    /// transfer fails may have reached some consumers. For a producer that sends such an entry
    /// again under the same sequence number ([`QueueProducer::unsend_last`]): the consumers
    /// that took it skip the repeat.
    pub fn applied_on_arrival(mut self) -> Self {
        self.on_arrival = true;
        self
    }

    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub fn dest(&self) -> &NodeSet {
        &self.dest
    }

    /// The absolute sequence number the next entry will carry.
    pub fn next_seq(&self) -> u64 {
        self.enqueued
    }

    /// Stops sending to `node` (it failed, or left). Space already confirmed stays confirmed:
    /// the remaining consumers are a subset of those that confirmed it.
    pub fn remove(&mut self, node: crate::NodeId) {
        self.dest.remove(node);
    }

    /// Starts sending to `node` from the next entry on. Its consumer must have joined at
    /// [`QueueProducer::next_seq`] (see [`QueueConsumer::join`]) before that entry is due, so
    /// that its `dequeued` counter never makes confirmed space look smaller than it is.
    pub fn add(&mut self, node: crate::NodeId) {
        self.dest.insert(node);
    }

    /// The last entry's transfer failed, so no consumer was signalled (XFER-AND-SIGNAL is all
    /// or nothing), or only some were (an entry [`applied_on_arrival`]): its sequence number
    /// and slot are used again by the next entry, which must be the same entry sent again.
    /// Consumers that were signalled all the same (a node failing during the commit, or any
    /// node for an entry applied on arrival) see it again and skip it as one they already
    /// took; a different entry in its place would be lost to them.
    ///
    /// [`applied_on_arrival`]: QueueProducer::applied_on_arrival
    pub fn unsend_last(&mut self) {
        if self.enqueued > self.base {
            self.enqueued -= 1;
        }
    }

    /// Entries enqueued so far in this epoch.
    pub fn count(&self) -> u64 {
        self.enqueued - self.base
    }

    /// Every consumer is known to have dequeued (released) every entry before this absolute
    /// sequence number; `None` until a check has shown that they joined this epoch.
    pub fn confirmed(&self) -> Option<u64> {
        self.confirmed
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
            && prims.compare_and_write_within(
                &self.dest,
                dequeued,
                crate::relation::Relation::Ge,
                hopeful,
                None,
                self.op_timeout,
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
            self.op_timeout,
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
        self.check_fits(payload.len())?;
        self.enqueue_entry(prims, QueueEntry::copied(payload), local)
    }

    /// ENQUEUE of an entry the caller filled in place (see [`QueueEntry`]), which saves the
    /// copy [`QueueProducer::enqueue`] makes: a file streamed through the queue is read
    /// straight into the slot image that goes on the wire.
    pub fn enqueue_entry<P: Primitives + ?Sized>(
        &mut self,
        prims: &P,
        entry: QueueEntry,
        local: Option<EventId>,
    ) -> Result<()> {
        self.check_fits(entry.payload().len())?;
        self.await_space(prims)?;
        let seq = self.enqueued;
        let slot = ((seq - self.base) % self.queue.slot_count as u64) as usize;
        let mut image = entry.0;
        image[8..QUEUE_SLOT_HEADER].copy_from_slice(&seq.to_le_bytes());
        let (offset, data, arrived) = (
            self.queue.slot_offset(slot),
            image.freeze(),
            Some(self.queue.arrived),
        );
        if self.on_arrival {
            prims.xfer_and_signal_on_arrival_within(
                &self.dest,
                offset,
                data,
                arrived,
                local,
                self.op_timeout,
            )?;
        } else {
            prims.xfer_and_signal_within(
                &self.dest,
                offset,
                data,
                arrived,
                local,
                self.op_timeout,
            )?;
        }
        self.enqueued += 1;
        Ok(())
    }

    fn check_fits(&self, len: usize) -> Result<()> {
        if len > self.queue.slot_payload {
            return Err(PrimError::InvalidArgument(format!(
                "entry of {len} bytes exceeds the queue's slot payload of {} bytes",
                self.queue.slot_payload
            )));
        }
        Ok(())
    }
}

/// One queue entry as it goes into a slot: the slot header, then the payload. The producer
/// writes the sequence number at ENQUEUE; the caller fills the payload in place.
#[derive(Debug)]
pub struct QueueEntry(BytesMut);

impl QueueEntry {
    /// An entry of `len` payload bytes, all zero, for the caller to fill.
    pub fn zeroed(len: usize) -> Self {
        let mut image = BytesMut::zeroed(QUEUE_SLOT_HEADER + len);
        image[..8].copy_from_slice(&(len as u64).to_le_bytes());
        Self(image)
    }

    /// An entry holding a copy of `payload`.
    pub fn copied(payload: &[u8]) -> Self {
        let mut image = BytesMut::with_capacity(QUEUE_SLOT_HEADER + payload.len());
        image.put_u64_le(payload.len() as u64);
        image.put_u64_le(0);
        image.put_slice(payload);
        Self(image)
    }

    pub fn payload(&self) -> &[u8] {
        &self.0[QUEUE_SLOT_HEADER..]
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.0[QUEUE_SLOT_HEADER..]
    }
}

/// The consumer side of a remote queue, on one node.
#[derive(Debug, Clone)]
pub struct QueueConsumer {
    queue: QueueLayout,
    base: u64,
    head: u64,
    /// What `dequeued` says (the producer may reuse the slots before it). Equal to `head`,
    /// except while entries taken with [`QueueConsumer::take`] await their release.
    released: u64,
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
            released: base,
        })
    }

    /// Joins a running stream of `epoch` at absolute sequence number `head` (a node that
    /// (re)joins a queue whose producer has already sent entries). Unlike
    /// [`QueueConsumer::new`] it leaves pending signals alone: the caller has discarded those
    /// that belong to the time before it joined, and entries from `head` on may already have
    /// arrived.
    pub fn join<P: Primitives + ?Sized>(
        prims: &P,
        queue: QueueLayout,
        epoch: u32,
        head: u64,
    ) -> Self {
        let base = epoch_base(epoch);
        let head = head.max(base);
        prims.memory().store(queue.dequeued, head);
        Self {
            queue,
            base,
            head,
            released: head,
        }
    }

    /// Discards every signal that has arrived so far.
    pub fn discard_signals<P: Primitives + ?Sized>(prims: &P, queue: QueueLayout) {
        while prims.test_event(queue.arrived, Wait::Poll).unwrap_or(false) {}
    }

    /// Entries dequeued so far in this epoch.
    pub fn count(&self) -> u64 {
        self.head - self.base
    }

    /// The absolute sequence number of the next entry this consumer takes.
    pub fn head(&self) -> u64 {
        self.head
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
        let taken = self.take_with(prims, wait, |_, payload| consume(payload))?;
        if taken.is_some() {
            self.release(prims, self.head);
        }
        Ok(taken)
    }

    /// DEQUEUE that keeps the entry's slot: returns the entry's absolute sequence number and a
    /// copy of its payload, but the producer may not reuse the slot (nor any after it) until
    /// [`QueueConsumer::release`] says so. A consumer that must pass entries on before it lets
    /// them go (and have them sent again if it fails first) releases them once they are
    /// safely elsewhere; the producer can then run at most a queue's length ahead.
    pub fn take<P: Primitives + ?Sized>(
        &mut self,
        prims: &P,
        wait: Wait,
    ) -> Result<Option<(u64, Bytes)>> {
        self.take_with(prims, wait, |seq, payload| {
            (seq, Bytes::copy_from_slice(payload))
        })
    }

    /// Lets the producer reuse the slots of every entry before absolute sequence number
    /// `upto` (at most the next entry to take).
    pub fn release<P: Primitives + ?Sized>(&mut self, prims: &P, upto: u64) {
        let upto = upto.min(self.head);
        if upto > self.released {
            self.released = upto;
            prims.memory().store(self.queue.dequeued, upto);
        }
    }

    /// Entries taken and not yet released.
    pub fn unreleased(&self) -> u64 {
        self.head - self.released
    }

    fn take_with<P: Primitives + ?Sized, R>(
        &mut self,
        prims: &P,
        wait: Wait,
        consume: impl FnOnce(u64, &[u8]) -> R,
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
        if seq < self.head {
            // A signal for an entry this consumer already took (sent again after a failed
            // transfer that reached it all the same), or one left from before it joined.
            return Ok(None);
        }
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
        // included, has advanced `dequeued` past it (AWAIT-SPACE), which happens only after
        // `consume` returns (in `dequeue_with`, or later through `release`).
        let payload = unsafe {
            prims
                .memory()
                .view(offset + QUEUE_SLOT_HEADER as u64, len as usize)?
        };
        let result = consume(seq, payload);
        self.head += 1;
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

    /// A node that counts its COMPARE-AND-WRITEs and its transfers applied on arrival.
    struct Counting(LocalNode, AtomicUsize, AtomicUsize);

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
        fn xfer_and_signal_within(
            &self,
            d: &NodeSet,
            o: u64,
            b: Bytes,
            r: Option<EventId>,
            l: Option<EventId>,
            t: Option<Duration>,
        ) -> Result<()> {
            self.0.xfer_and_signal_within(d, o, b, r, l, t)
        }
        fn xfer_and_signal_on_arrival_within(
            &self,
            d: &NodeSet,
            o: u64,
            b: Bytes,
            r: Option<EventId>,
            l: Option<EventId>,
            t: Option<Duration>,
        ) -> Result<()> {
            self.2.fetch_add(1, Ordering::Relaxed);
            self.0.xfer_and_signal_within(d, o, b, r, l, t)
        }
        fn test_event(&self, e: EventId, w: Wait) -> Result<bool> {
            self.0.test_event(e, w)
        }
        fn wake_local(&self, e: EventId) -> Result<()> {
            self.0.wake_local(e)
        }
        fn ready_events(&self, out: &mut Vec<EventId>) {
            self.0.ready_events(out)
        }
        fn compare_and_write_within(
            &self,
            d: &NodeSet,
            v: VarId,
            r: Relation,
            x: u64,
            w: Option<(VarId, u64)>,
            t: Option<Duration>,
        ) -> Result<bool> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.compare_and_write_within(d, v, r, x, w, t)
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
        let producer_node = Counting(fabric.node(0), AtomicUsize::new(0), AtomicUsize::new(0));
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

    /// A producer made `applied_on_arrival` sends every entry with the one-phase transfer (the
    /// MM's heartbeats rely on it for their cost), and its consumers take every entry once.
    #[test]
    fn a_producer_applied_on_arrival_sends_each_entry_by_the_one_phase_transfer() {
        let (fabric, q) = setup(4);
        let producer_node = Counting(fabric.node(0), AtomicUsize::new(0), AtomicUsize::new(0));
        let node = fabric.node(1);
        let mut consumer = QueueConsumer::new(&node, q, 1).unwrap();
        let mut producer = QueueProducer::new(q, "1".parse().unwrap(), 1).applied_on_arrival();
        for i in 0..10u64 {
            producer
                .enqueue(&producer_node, &i.to_le_bytes(), None)
                .unwrap();
            let got = consumer.dequeue(&node, Wait::Poll).unwrap().unwrap();
            assert_eq!(&got[..], &i.to_le_bytes());
        }
        assert_eq!(producer_node.2.load(Ordering::Relaxed), 10);
        // A plain producer does not.
        let (fabric, q) = setup(4);
        let producer_node = Counting(fabric.node(0), AtomicUsize::new(0), AtomicUsize::new(0));
        let _consumer = QueueConsumer::new(&fabric.node(1), q, 1).unwrap();
        let mut plain = QueueProducer::new(q, "1".parse().unwrap(), 1);
        plain.enqueue(&producer_node, b"x", None).unwrap();
        assert_eq!(producer_node.2.load(Ordering::Relaxed), 0);
    }

    /// A consumer's wait may be ended by a local wake-up (the NM's output thread does so when
    /// a task's streams are drained). DEQUEUE then returns nothing, reads no slot (one may
    /// still hold an entry of an older stream with a higher number: the heartbeat queue after
    /// the MM restarted), and every entry is still taken once.
    #[test]
    fn a_wake_up_ends_dequeue_with_nothing_and_loses_nothing() {
        let (fabric, q) = setup(4);
        let node = fabric.node(1);
        // An older stream left entry 40 in the slot the new stream starts at.
        let mut old = QueueProducer::new(q, "1".parse().unwrap(), 1);
        let mut old_consumer = QueueConsumer::new(&node, q, 1).unwrap();
        for i in 0..41u64 {
            old.enqueue(&fabric.node(0), &i.to_le_bytes(), None)
                .unwrap();
            old_consumer.dequeue(&node, Wait::Poll).unwrap().unwrap();
        }
        // A new stream (a restarted producer) from the start of the epoch.
        let mut consumer = QueueConsumer::join(&node, q, 1, epoch_base(1));
        let mut producer = QueueProducer::new(q, "1".parse().unwrap(), 1);
        let mut taken = Vec::new();
        let long = Wait::Timeout(Duration::from_secs(600));
        for i in 0..10u64 {
            node.wake_local(q.arrived).unwrap();
            assert_eq!(consumer.dequeue(&node, long).unwrap(), None, "woken");
            producer
                .enqueue(&fabric.node(0), &i.to_le_bytes(), None)
                .unwrap();
            while let Some(b) = consumer.dequeue(&node, Wait::Poll).unwrap() {
                taken.push(u64::from_le_bytes(b[..].try_into().unwrap()));
            }
        }
        assert_eq!(taken, (0..10).collect::<Vec<u64>>());
        assert_eq!(consumer.dequeue(&node, Wait::Poll).unwrap(), None);
    }

    /// An entry filled in place arrives as the same payload `enqueue` would send, with its
    /// own length and sequence number, between entries sent the other way.
    #[test]
    fn entries_filled_in_place_arrive_like_copied_ones() {
        let (fabric, q) = setup(4);
        let node = fabric.node(1);
        let mut consumer = QueueConsumer::new(&node, q, 2).unwrap();
        let mut producer = QueueProducer::new(q, "1".parse().unwrap(), 2);
        producer.enqueue(&fabric.node(0), b"first", None).unwrap();
        let mut entry = QueueEntry::zeroed(7);
        entry.payload_mut().copy_from_slice(b"in situ");
        producer
            .enqueue_entry(&fabric.node(0), entry, None)
            .unwrap();
        producer
            .enqueue_entry(&fabric.node(0), QueueEntry::copied(b"3rd"), None)
            .unwrap();
        let mut got = Vec::new();
        while let Some((seq, b)) = consumer.take(&node, Wait::Poll).unwrap() {
            got.push((seq - epoch_base(2), b.to_vec()));
        }
        assert_eq!(
            got,
            [
                (0, b"first".to_vec()),
                (1, b"in situ".to_vec()),
                (2, b"3rd".to_vec())
            ]
        );
        let too_big = QueueEntry::zeroed(q.slot_payload + 1);
        assert!(matches!(
            producer.enqueue_entry(&fabric.node(0), too_big, None),
            Err(PrimError::InvalidArgument(_))
        ));
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

    #[test]
    fn a_consumer_joins_a_running_stream_where_it_is_told() {
        let (fabric, q) = setup(4);
        let mut first = QueueConsumer::new(&fabric.node(1), q, 1).unwrap();
        let mut producer = QueueProducer::new(q, "1".parse().unwrap(), 1);
        for i in 0..6u64 {
            producer
                .enqueue(&fabric.node(0), &i.to_le_bytes(), None)
                .unwrap();
            first
                .dequeue(&fabric.node(1), Wait::Poll)
                .unwrap()
                .expect("entry");
        }
        // Node 2 joins at the next entry; what came before is not for it.
        let node2 = fabric.node(2);
        QueueConsumer::discard_signals(&node2, q);
        let mut late = QueueConsumer::join(&node2, q, 1, producer.next_seq());
        producer.add(2);
        for i in 6..12u64 {
            producer
                .enqueue(&fabric.node(0), &i.to_le_bytes(), None)
                .unwrap();
            for (node, c) in [(fabric.node(1), &mut first), (fabric.node(2), &mut late)] {
                let got = c.dequeue(&node, Wait::Poll).unwrap().expect("entry");
                assert_eq!(&got[..], &i.to_le_bytes());
            }
        }
        assert_eq!(late.head(), producer.next_seq(), "caught up");
        producer.remove(1);
        producer.enqueue(&fabric.node(0), b"only 2", None).unwrap();
        assert_eq!(
            &late.dequeue(&node2, Wait::Poll).unwrap().unwrap()[..],
            b"only 2"
        );
        assert!(
            first
                .dequeue(&fabric.node(1), Wait::Poll)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn an_entry_sent_again_is_taken_once() {
        let (fabric, q) = setup(4);
        let node1 = fabric.node(1);
        let mut c = QueueConsumer::new(&node1, q, 1).unwrap();
        let mut p = QueueProducer::new(q, "1".parse().unwrap(), 1);
        p.enqueue(&fabric.node(0), b"a", None).unwrap();
        assert_eq!(&c.dequeue(&node1, Wait::Poll).unwrap().unwrap()[..], b"a");
        // The transfer reported failure, but this consumer was signalled all the same: the
        // producer sends the entry again under the same sequence number.
        p.unsend_last();
        p.enqueue(&fabric.node(0), b"a", None).unwrap();
        assert!(
            c.dequeue(&node1, Wait::Poll).unwrap().is_none(),
            "the repeat is skipped"
        );
        p.enqueue(&fabric.node(0), b"b", None).unwrap();
        assert_eq!(&c.dequeue(&node1, Wait::Poll).unwrap().unwrap()[..], b"b");
    }

    #[test]
    fn taken_entries_hold_their_slots_until_released() {
        let (fabric, q) = setup(2);
        let node1 = fabric.node(1);
        let mut c = QueueConsumer::new(&node1, q, 1).unwrap();
        let mut p = QueueProducer::new(q, "1".parse().unwrap(), 1)
            .with_space_timeout(Duration::from_millis(20));
        p.enqueue(&fabric.node(0), b"a", None).unwrap();
        p.enqueue(&fabric.node(0), b"b", None).unwrap();
        let (seq_a, a) = c.take(&node1, Wait::Poll).unwrap().unwrap();
        let (seq_b, b) = c.take(&node1, Wait::Poll).unwrap().unwrap();
        assert_eq!((&a[..], &b[..], seq_b), (&b"a"[..], &b"b"[..], seq_a + 1));
        assert_eq!(c.unreleased(), 2);
        assert!(
            matches!(
                p.enqueue(&fabric.node(0), b"c", None),
                Err(PrimError::QueueFull { .. })
            ),
            "both slots are still taken: the producer must wait"
        );
        c.release(&node1, seq_a + 1);
        p.enqueue(&fabric.node(0), b"c", None).unwrap();
        assert!(p.confirmed().is_some_and(|x| x > seq_a));
        assert_eq!(&c.take(&node1, Wait::Poll).unwrap().unwrap().1[..], b"c");
    }
}
