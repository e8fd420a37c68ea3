//! How replicas pass Raft's messages to each other: mailboxes in the managers' own fabric,
//! written with XFER-AND-SIGNAL.
//!
//! The replicas are the nodes of a small fabric of their own (ids 0..R, on each
//! `[[manager]] peer_address`). In every replica's global memory, each other replica has a
//! mailbox of [`SLOTS`] slots it writes round-robin, and one event ([`GroupLayout::arrived`])
//! says that something arrived. A slot is written with one transfer:
//!
//! ```text
//! [sender's incarnation u64][seq u64][len u64][len bytes][seq u64]
//! ```
//!
//! Raft tolerates lost messages (it sends again), so nothing waits for room: a sender that
//! laps a slow receiver overwrites its oldest slots, and the receiver skips to the oldest it
//! still holds. A slot read while it is being overwritten shows two different sequence
//! numbers and is dropped. A sender that restarted has a larger incarnation, and its
//! receivers start over with it.

use bytes::{BufMut, Bytes, BytesMut};
use storm_primitives::{Area, EventId, Layout, LayoutBuilder, NodeId, NodeSet, Primitives};

/// Slots in each mailbox.
pub const SLOTS: usize = 8;
const HEADER: usize = 24;
const TRAILER: usize = 8;

/// Where the mailboxes are in every replica's memory.
#[derive(Debug, Clone)]
pub struct GroupLayout {
    pub layout: Layout,
    /// `mailboxes[s]`: the mailbox sender `s` writes.
    mailboxes: Vec<Area>,
    /// Raised with every message.
    pub arrived: EventId,
    slot_bytes: usize,
}

impl GroupLayout {
    /// The layout of a group of `replicas`, each message at most `max_message` bytes.
    pub fn new(replicas: usize, max_message: usize) -> Self {
        let slot_bytes = (HEADER + max_message + TRAILER).next_multiple_of(64);
        let mut b = LayoutBuilder::new();
        let mailboxes = (0..replicas)
            .map(|s| b.area(&format!("mailbox-{s}"), SLOTS * slot_bytes))
            .collect();
        let arrived = b.event("arrived");
        Self {
            layout: b.build().expect("a group's layout is small"),
            mailboxes,
            arrived,
            slot_bytes,
        }
    }

    /// The mailbox sender `sender` writes.
    pub fn mailbox(&self, sender: usize) -> Area {
        self.mailboxes[sender]
    }

    /// The largest message a slot holds.
    pub fn max_message(&self) -> usize {
        self.slot_bytes - HEADER - TRAILER
    }

    fn slot_offset(&self, sender: usize, seq: u64) -> u64 {
        self.mailboxes[sender].offset + (seq % SLOTS as u64) * self.slot_bytes as u64
    }
}

/// A replica's sending side: one sequence per receiver.
pub struct Outbox {
    me: NodeId,
    incarnation: u64,
    sent: Vec<u64>,
    timeout: std::time::Duration,
}

impl Outbox {
    pub fn new(me: NodeId, replicas: usize, timeout: std::time::Duration) -> Self {
        Self {
            me,
            // Larger for every later start of this replica.
            incarnation: storm_cluster::daemon::unix_ms() << 16
                | (std::process::id() as u64 & 0xffff),
            sent: vec![0; replicas],
            timeout,
        }
    }

    /// This start of the replica (larger for every later one).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Writes `message` into `to`'s mailbox for this replica; false if it is too large to
    /// send. The transfer's outcome is not awaited: a lost message is Raft's to send again.
    pub fn send(
        &mut self,
        prims: &dyn Primitives,
        group: &GroupLayout,
        to: NodeId,
        message: &[u8],
    ) -> bool {
        if message.len() > group.max_message() || to as usize >= self.sent.len() || to == self.me {
            return false;
        }
        self.sent[to as usize] += 1;
        let seq = self.sent[to as usize];
        let mut slot = BytesMut::with_capacity(HEADER + message.len() + TRAILER);
        slot.put_u64_le(self.incarnation);
        slot.put_u64_le(seq);
        slot.put_u64_le(message.len() as u64);
        slot.put_slice(message);
        slot.put_u64_le(seq);
        let offset = group.slot_offset(self.me as usize, seq);
        if let Err(e) = prims.xfer_and_signal_on_arrival_within(
            &NodeSet::single(to),
            offset,
            slot.freeze(),
            Some(group.arrived),
            None,
            Some(self.timeout),
        ) {
            tracing::debug!(to, "a replica message did not go out: {e}");
        }
        true
    }
}

/// Where a replica is in one sender's mailbox.
#[derive(Debug, Clone, Copy, Default)]
struct Cursor {
    incarnation: u64,
    next: u64,
}

/// A replica's receiving side.
pub struct Inbox {
    me: NodeId,
    cursors: Vec<Cursor>,
}

struct SlotHead {
    incarnation: u64,
    seq: u64,
}

impl Inbox {
    pub fn new(me: NodeId, replicas: usize) -> Self {
        Self {
            me,
            cursors: vec![Cursor::default(); replicas],
        }
    }

    /// Every message that arrived since the last call, by sender, oldest first.
    pub fn take(&mut self, prims: &dyn Primitives, group: &GroupLayout) -> Vec<(NodeId, Bytes)> {
        let mut out = Vec::new();
        for sender in 0..self.cursors.len() {
            if sender as NodeId == self.me {
                continue;
            }
            self.take_from(prims, group, sender, &mut out);
        }
        out
    }

    fn head(prims: &dyn Primitives, at: u64) -> Option<SlotHead> {
        let mut h = [0u8; 16];
        prims.memory().read(at, &mut h).ok()?;
        let incarnation = u64::from_le_bytes(h[..8].try_into().ok()?);
        let seq = u64::from_le_bytes(h[8..].try_into().ok()?);
        (seq > 0).then_some(SlotHead { incarnation, seq })
    }

    fn take_from(
        &mut self,
        prims: &dyn Primitives,
        group: &GroupLayout,
        sender: usize,
        out: &mut Vec<(NodeId, Bytes)>,
    ) {
        let c = &mut self.cursors[sender];
        loop {
            let at = group.slot_offset(sender, c.next);
            match Self::head(prims, at) {
                Some(h) if h.incarnation == c.incarnation && h.seq == c.next && c.next > 0 => {
                    if let Some(m) = Self::read_slot(prims, group, at, h.seq) {
                        out.push((sender as NodeId, m));
                    }
                    c.next += 1;
                    continue;
                }
                _ => {}
            }
            // Nothing new at the cursor: the sender restarted, lapped us, or sent nothing.
            let heads: Vec<SlotHead> = (0..SLOTS as u64)
                .filter_map(|i| Self::head(prims, group.slot_offset(sender, i)))
                .collect();
            let Some(newest) = heads.iter().map(|h| h.incarnation).max() else {
                return;
            };
            let oldest_ahead = heads
                .iter()
                .filter(|h| h.incarnation == newest)
                .filter(|h| newest != c.incarnation || h.seq >= c.next)
                .map(|h| h.seq)
                .min();
            match oldest_ahead {
                Some(seq) if newest > c.incarnation || seq > c.next => {
                    c.incarnation = newest;
                    c.next = seq;
                }
                _ => return,
            }
        }
    }

    /// The message in the slot at `at`, if it is whole (not being overwritten).
    fn read_slot(prims: &dyn Primitives, group: &GroupLayout, at: u64, seq: u64) -> Option<Bytes> {
        let mut len = [0u8; 8];
        prims.memory().read(at + 16, &mut len).ok()?;
        let len = u64::from_le_bytes(len) as usize;
        if len > group.max_message() {
            return None;
        }
        let body = prims
            .memory()
            .read_vec(at + HEADER as u64, len + TRAILER)
            .ok()?;
        let trailer = u64::from_le_bytes(body[len..].try_into().ok()?);
        let again = Self::head(prims, at)?;
        (trailer == seq && again.seq == seq).then(|| Bytes::copy_from_slice(&body[..len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storm_primitives::Wait;
    use storm_primitives::local::LocalFabric;

    fn group(n: u32) -> (GroupLayout, Vec<Box<dyn Primitives>>) {
        let g = GroupLayout::new(n as usize, 1024);
        let fabric = LocalFabric::new(n, g.layout.clone());
        let nodes = (0..n)
            .map(|i| Box::new(fabric.node(i)) as Box<dyn Primitives>)
            .collect();
        (g, nodes)
    }

    fn wait(p: &dyn Primitives, g: &GroupLayout) {
        p.test_event(g.arrived, Wait::Timeout(std::time::Duration::from_secs(5)))
            .unwrap();
    }

    #[test]
    fn messages_arrive_in_order_from_each_sender() {
        let (g, nodes) = group(3);
        let t = std::time::Duration::from_secs(1);
        let (mut a, mut b) = (Outbox::new(0, 3, t), Outbox::new(1, 3, t));
        assert!(a.send(&*nodes[0], &g, 2, b"a1"));
        assert!(b.send(&*nodes[1], &g, 2, b"b1"));
        assert!(a.send(&*nodes[0], &g, 2, b"a2"));
        for _ in 0..3 {
            wait(&*nodes[2], &g);
        }
        let mut inbox = Inbox::new(2, 3);
        let got: Vec<(NodeId, Vec<u8>)> = inbox
            .take(&*nodes[2], &g)
            .into_iter()
            .map(|(s, m)| (s, m.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, b"a1".to_vec()),
                (0, b"a2".to_vec()),
                (1, b"b1".to_vec())
            ]
        );
        assert!(
            inbox.take(&*nodes[2], &g).is_empty(),
            "each message is taken once"
        );
    }

    #[test]
    fn a_lapped_receiver_takes_the_newest_slots_and_a_restarted_sender_is_heard() {
        let (g, nodes) = group(2);
        let t = std::time::Duration::from_secs(1);
        let mut a = Outbox::new(0, 2, t);
        let total = SLOTS as u64 + 3;
        for i in 0..total {
            a.send(&*nodes[0], &g, 1, format!("m{i}").as_bytes());
            wait(&*nodes[1], &g);
        }
        let mut inbox = Inbox::new(1, 2);
        let got: Vec<Vec<u8>> = inbox
            .take(&*nodes[1], &g)
            .into_iter()
            .map(|(_, m)| m.to_vec())
            .collect();
        let want: Vec<Vec<u8>> = (total - SLOTS as u64..total)
            .map(|i| format!("m{i}").into_bytes())
            .collect();
        assert_eq!(
            got, want,
            "the oldest overwritten messages are lost, the rest in order"
        );
        // The sender restarts: its sequence starts again at 1 under a newer incarnation.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut again = Outbox::new(0, 2, t);
        again.send(&*nodes[0], &g, 1, b"after restart");
        wait(&*nodes[1], &g);
        let got: Vec<Vec<u8>> = inbox
            .take(&*nodes[1], &g)
            .into_iter()
            .map(|(_, m)| m.to_vec())
            .collect();
        assert_eq!(got, vec![b"after restart".to_vec()]);
    }

    #[test]
    fn an_oversized_message_is_refused_not_cut() {
        let (g, nodes) = group(2);
        let mut a = Outbox::new(0, 2, std::time::Duration::from_secs(1));
        assert!(!a.send(&*nodes[0], &g, 1, &vec![0u8; g.max_message() + 1]));
        assert!(a.send(&*nodes[0], &g, 1, &vec![7u8; g.max_message()]));
    }
}
