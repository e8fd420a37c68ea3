//! The layout of global memory: named variables, arrays, areas, queues and events at offsets
//! that every node computes identically.
//!
//! A global address is an offset into the node's global-memory region. Every node builds its
//! layout with the same sequence of builder calls, so the same name lands at the same offset
//! everywhere. The layout's fingerprint (a hash of every entry) is exchanged when nodes connect,
//! so two nodes that disagree about the layout refuse to talk instead of corrupting each other.
//!
//! A layout may end with a *home section* ([`LayoutBuilder::home_section`]): entries and events
//! that exist on one node only, for state one node keeps about every other node (the machine
//! manager's per-node output queues and reports). Every other node allocates only the shared
//! part, so its memory does not grow with the cluster. The shared part is a prefix of the home
//! node's, so a name has the same offset and event index wherever it exists. Operations that
//! name the home section are valid only when every destination is the home node.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::nodeset::{NodeId, NodeSet};

/// Variables are 8-byte words; areas start on cache-line boundaries.
const WORD: usize = 8;
const AREA_ALIGN: usize = 64;
/// Largest global-memory region a layout may describe (256 GiB: a home node's per-node areas
/// at 16,384 nodes take tens of GiB of address space, only touched pages being backed).
pub const MAX_LAYOUT_BYTES: usize = 1 << 38;

/// A u64 global variable, identified by its byte offset (always 8-byte aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VarId(pub(crate) u64);

impl VarId {
    pub fn offset(self) -> u64 {
        self.0
    }
}

/// `len` consecutive global variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VarArray {
    base: u64,
    len: usize,
}

impl VarArray {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The `i`th variable. Panics if `i` is out of range (a programming error).
    pub fn at(&self, i: usize) -> VarId {
        assert!(
            i < self.len,
            "index {i} outside an array of {} variables",
            self.len
        );
        VarId(self.base + (i * WORD) as u64)
    }
}

/// A block of bytes in global memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Area {
    pub offset: u64,
    pub len: usize,
}

/// A local event: a counter that remote signals raise (paper Sec. 2.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventId(pub(crate) u32);

impl EventId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The global-memory part of a remote queue (Algorithms 1-3): `slots` slots of
/// `slot_payload` bytes each, the consumer's `dequeued` counter, and the event a producer
/// signals on every enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueueLayout {
    pub slots: Area,
    pub slot_count: usize,
    pub slot_payload: usize,
    pub dequeued: VarId,
    pub arrived: EventId,
}

/// Bytes in front of each queue slot's payload: payload length and sequence number.
pub const QUEUE_SLOT_HEADER: usize = 16;

impl QueueLayout {
    /// Bytes one slot occupies (header + payload, rounded to a word).
    pub fn slot_stride(&self) -> usize {
        (QUEUE_SLOT_HEADER + self.slot_payload).next_multiple_of(WORD)
    }
    /// Offset of slot `index`.
    pub fn slot_offset(&self, index: usize) -> u64 {
        self.slots.offset + (index * self.slot_stride()) as u64
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Var,
    Array,
    Area,
    Queue,
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    kind: Kind,
    offset: u64,
    len: usize,
}

/// Why a layout could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("layout name {0:?} is used twice")]
    DuplicateName(String),
    #[error("{0:?} has zero size")]
    Empty(String),
    #[error("layout exceeds {MAX_LAYOUT_BYTES} bytes at {0:?}")]
    TooLarge(String),
    #[error("a layout has at most one home section")]
    SecondHomeSection,
}

/// Builds a [`Layout`]. Call the same methods in the same order on every node.
#[derive(Debug, Default)]
pub struct LayoutBuilder {
    entries: Vec<Entry>,
    events: Vec<String>,
    next: u64,
    names: HashSet<String>,
    error: Option<LayoutError>,
    /// The home node and where the shared part ended, once `home_section` was called.
    home: Option<(NodeId, Extent)>,
}

impl LayoutBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    fn claim(&mut self, name: &str, kind: Kind, len: usize, align: usize) -> u64 {
        if self.error.is_none() && !self.names.insert(name.to_string()) {
            self.error = Some(LayoutError::DuplicateName(name.to_string()));
        }
        if self.error.is_none() && len == 0 {
            self.error = Some(LayoutError::Empty(name.to_string()));
        }
        let offset = self.next.next_multiple_of(align as u64);
        let end = offset.saturating_add(len as u64);
        if self.error.is_none() && end > MAX_LAYOUT_BYTES as u64 {
            self.error = Some(LayoutError::TooLarge(name.to_string()));
        }
        self.next = end.min(MAX_LAYOUT_BYTES as u64);
        self.entries.push(Entry {
            name: name.to_string(),
            kind,
            offset,
            len,
        });
        offset
    }

    /// One u64 global variable.
    pub fn var(&mut self, name: &str) -> VarId {
        VarId(self.claim(name, Kind::Var, WORD, WORD))
    }

    /// `len` consecutive u64 global variables.
    pub fn array(&mut self, name: &str, len: usize) -> VarArray {
        let base = self.claim(name, Kind::Array, len.saturating_mul(WORD), WORD);
        VarArray { base, len }
    }

    /// A block of `len` bytes.
    pub fn area(&mut self, name: &str, len: usize) -> Area {
        let offset = self.claim(name, Kind::Area, len, AREA_ALIGN);
        Area { offset, len }
    }

    /// A local event.
    pub fn event(&mut self, name: &str) -> EventId {
        if self.error.is_none() && !self.names.insert(name.to_string()) {
            self.error = Some(LayoutError::DuplicateName(name.to_string()));
        }
        self.events.push(name.to_string());
        EventId((self.events.len() - 1) as u32)
    }

    /// A remote queue of `slots` slots carrying up to `slot_payload` bytes each.
    pub fn queue(&mut self, name: &str, slots: usize, slot_payload: usize) -> QueueLayout {
        let dequeued = self.var(&format!("{name}.dequeued"));
        let arrived = self.event(&format!("{name}.arrived"));
        let stride = (QUEUE_SLOT_HEADER + slot_payload).next_multiple_of(WORD);
        let bytes = if slot_payload == 0 {
            0
        } else {
            stride.saturating_mul(slots)
        };
        let offset = self.claim(&format!("{name}.slots"), Kind::Queue, bytes, AREA_ALIGN);
        QueueLayout {
            slots: Area { offset, len: bytes },
            slot_count: slots,
            slot_payload,
            dequeued,
            arrived,
        }
    }

    /// Everything claimed after this call (variables, areas, queues and events) exists on node
    /// `home` only. Call it once, after the shared entries.
    pub fn home_section(&mut self, home: NodeId) {
        if self.error.is_none() && self.home.is_some() {
            self.error = Some(LayoutError::SecondHomeSection);
        }
        // The home section starts where the shared part's memory ends.
        self.next = padded(self.next) as u64;
        self.home = Some((
            home,
            Extent {
                bytes: self.next as usize,
                events: self.events.len(),
            },
        ));
    }

    pub fn build(self) -> Result<Layout, LayoutError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let full = Extent {
            bytes: padded(self.next),
            events: self.events.len(),
        };
        let (shared, home) = match self.home {
            Some((node, shared)) => (shared, Some((node, full))),
            None => (full, None),
        };
        let size = full.bytes;
        let mut fingerprint = Fnv64::new();
        fingerprint.write(&(size as u64).to_le_bytes());
        fingerprint.write(&(shared.bytes as u64).to_le_bytes());
        if let Some((node, _)) = home {
            fingerprint.write(&node.to_le_bytes());
        }
        for e in &self.entries {
            fingerprint.write(e.name.as_bytes());
            fingerprint.write(&[e.kind.clone() as u8]);
            fingerprint.write(&e.offset.to_le_bytes());
            fingerprint.write(&(e.len as u64).to_le_bytes());
        }
        for name in &self.events {
            fingerprint.write(name.as_bytes());
            fingerprint.write(&[0xEE]);
        }
        Ok(Layout {
            shared,
            home,
            event_names: self.events.into(),
            fingerprint: fingerprint.finish(),
        })
    }
}

/// Bytes of global memory for a layout that claimed up to `next`.
fn padded(next: u64) -> usize {
    (next as usize).next_multiple_of(AREA_ALIGN).max(AREA_ALIGN)
}

/// How much of a layout one node holds: bytes of global memory and number of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub bytes: usize,
    pub events: usize,
}

/// The finished layout: how large each node's global memory is, how many events it has, and a
/// fingerprint that identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// What every node holds.
    shared: Extent,
    /// The home node and what it holds (the shared part and its home section).
    home: Option<(NodeId, Extent)>,
    /// Shared by clones: a layout with a home section names an event per node, and every
    /// node of a simulated cluster holds the layout.
    event_names: std::sync::Arc<[String]>,
    fingerprint: u64,
}

impl Layout {
    pub fn builder() -> LayoutBuilder {
        LayoutBuilder::new()
    }
    /// What node `node` holds: the shared part, plus the home section on the home node.
    pub fn extent_at(&self, node: NodeId) -> Extent {
        match self.home {
            Some((home, full)) if home == node => full,
            _ => self.shared,
        }
    }
    /// Bytes of global memory on node `node`.
    pub fn size_at(&self, node: NodeId) -> usize {
        self.extent_at(node).bytes
    }
    /// Number of events on node `node`.
    pub fn event_count_at(&self, node: NodeId) -> usize {
        self.extent_at(node).events
    }
    /// What every node holds.
    pub fn shared(&self) -> Extent {
        self.shared
    }
    /// The node that holds the home section, if the layout has one.
    pub fn home(&self) -> Option<NodeId> {
        self.home.map(|(node, _)| node)
    }
    /// Bytes of global memory on the node that holds the most (the home node, if any).
    pub fn max_size(&self) -> usize {
        self.home.map_or(self.shared, |(_, full)| full).bytes
    }
    pub fn event_name(&self, id: EventId) -> Option<&str> {
        self.event_names.get(id.index()).map(String::as_str)
    }
    /// Identifies the layout; equal on two nodes iff they built the same layout.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
    /// Event `raw` on node `node`, if that node has it (for ids decoded from the network).
    pub fn event_at(&self, node: NodeId, raw: u32) -> Option<EventId> {
        ((raw as usize) < self.event_count_at(node)).then_some(EventId(raw))
    }
    /// The variable at `offset` on node `node`, if it is word-aligned and inside that node's
    /// global memory.
    pub fn var_at(&self, node: NodeId, offset: u64) -> Option<VarId> {
        (offset % WORD as u64 == 0 && self.contains_range_at(node, offset, WORD as u64))
            .then_some(VarId(offset))
    }
    /// Whether `offset..offset+len` lies inside node `node`'s global memory.
    pub fn contains_range_at(&self, node: NodeId, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.size_at(node) as u64)
    }
    /// Whether `offset..offset+len` lies inside the global memory of every node of `dest`.
    /// Constant time: a range past the shared part fits only a destination that is the home.
    pub fn fits(&self, dest: &NodeSet, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        end <= self.shared.bytes as u64
            || self
                .home
                .is_some_and(|(home, full)| end <= full.bytes as u64 && only(dest, home))
    }
    /// Whether `offset` is a word-aligned variable on every node of `dest`.
    pub fn var_fits(&self, dest: &NodeSet, offset: u64) -> bool {
        offset % WORD as u64 == 0 && self.fits(dest, offset, WORD as u64)
    }
    /// Whether every node of `dest` has event `ev`.
    pub fn has_event(&self, dest: &NodeSet, ev: EventId) -> bool {
        ev.index() < self.shared.events
            || self
                .home
                .is_some_and(|(home, full)| ev.index() < full.events && only(dest, home))
    }
}

/// Whether `dest` is exactly `{home}` (an empty set names no node, so it fits anywhere).
fn only(dest: &NodeSet, home: NodeId) -> bool {
    dest.iter().all(|n| n == home)
}

/// FNV-1a (64 bit) of `bytes`: tiny and stable across platforms and Rust versions.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv64::new();
    h.write(bytes);
    h.finish()
}

/// FNV-1a, 64 bit, incremental.
pub(crate) struct Fnv64(u64);

impl Fnv64 {
    pub(crate) fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Layout, VarId, VarArray, Area, QueueLayout, EventId) {
        let mut b = Layout::builder();
        let v = b.var("heartbeat");
        let arr = b.array("terminated", 10);
        let area = b.area("scratch", 100);
        let q = b.queue("hb", 4, 200);
        let ev = b.event("done");
        (b.build().unwrap(), v, arr, area, q, ev)
    }

    #[test]
    fn same_builder_calls_give_the_same_offsets_and_fingerprint() {
        let (l1, v1, a1, area1, q1, e1) = sample();
        let (l2, v2, a2, area2, q2, e2) = sample();
        assert_eq!(l1, l2);
        assert_eq!((v1, a1, area1, q1, e1), (v2, a2, area2, q2, e2));
        assert_eq!(area1.offset % 64, 0);
        assert!(q1.slots.offset >= area1.offset + 100);
        assert_eq!(q1.slot_stride(), 216);
        assert_eq!(q1.slots.len, 4 * 216);
        assert!(l1.max_size() >= (q1.slots.offset as usize + q1.slots.len));
        assert_eq!(l1.event_count_at(0), 2, "queue event plus 'done'");
        assert_eq!(l1.event_name(e1), Some("done"));
    }

    #[test]
    fn different_layouts_have_different_fingerprints() {
        let (l1, ..) = sample();
        let mut b = Layout::builder();
        b.var("heartbeat");
        b.array("terminated", 11);
        assert_ne!(b.build().unwrap().fingerprint(), l1.fingerprint());
    }

    #[test]
    fn builder_mistakes_are_reported() {
        let mut b = Layout::builder();
        b.var("x");
        b.var("x");
        assert_eq!(b.build(), Err(LayoutError::DuplicateName("x".into())));
        let mut b = Layout::builder();
        b.area("nothing", 0);
        assert_eq!(b.build(), Err(LayoutError::Empty("nothing".into())));
        let mut b = Layout::builder();
        b.area("huge", usize::MAX);
        assert!(matches!(b.build(), Err(LayoutError::TooLarge(_))));
    }

    #[test]
    fn network_supplied_offsets_are_validated() {
        let (l, v, ..) = sample();
        let size = l.size_at(0) as u64;
        assert_eq!(l.var_at(0, v.offset()), Some(v));
        assert_eq!(l.var_at(0, 3), None, "misaligned");
        assert_eq!(l.var_at(0, size), None, "past the end");
        assert_eq!(l.var_at(0, u64::MAX - 7), None, "overflow");
        assert!(l.contains_range_at(0, 0, size));
        assert!(!l.contains_range_at(0, 1, size));
        assert!(!l.contains_range_at(0, u64::MAX, 2));
        assert_eq!(l.event_at(0, 2), None);
    }

    /// A layout whose node 3 also holds one area, one variable and one event per other node.
    fn with_home(nodes: usize) -> (Layout, VarId, Area, EventId, Area, VarArray, EventId) {
        let mut b = Layout::builder();
        let v = b.var("shared.var");
        let area = b.area("shared.area", 1000);
        let ev = b.event("shared.event");
        b.home_section(3);
        let per_node = b.area("home.per-node", 4096 * nodes);
        let vars = b.array("home.vars", nodes);
        let home_ev = b.event("home.event");
        (b.build().unwrap(), v, area, ev, per_node, vars, home_ev)
    }

    #[test]
    fn only_the_home_node_holds_the_home_section_and_the_rest_does_not_grow_with_it() {
        let (small, ..) = with_home(4);
        let (large, v, area, ev, per_node, vars, home_ev) = with_home(16_384);
        assert_eq!(
            small.size_at(0),
            large.size_at(0),
            "a non-home node's memory"
        );
        assert_eq!(small.event_count_at(7), large.event_count_at(7));
        assert!(large.size_at(3) >= per_node.offset as usize + 4096 * 16_384);
        assert_eq!(large.event_count_at(3), 2);
        assert_eq!(large.home(), Some(3));
        assert_ne!(small.fingerprint(), large.fingerprint());

        let home = NodeSet::from_iter([3]);
        let others = NodeSet::from_iter([0, 1]);
        let mixed = NodeSet::from_iter([1, 3]);
        assert!(large.fits(&mixed, area.offset, area.len as u64), "shared");
        assert!(large.fits(&home, per_node.offset, 100));
        assert!(!large.fits(&others, per_node.offset, 100));
        assert!(!large.fits(&mixed, per_node.offset, 100));
        assert!(!large.fits(&home, per_node.offset, u64::MAX));
        assert!(large.has_event(&mixed, ev));
        assert!(large.has_event(&home, home_ev));
        assert!(!large.has_event(&mixed, home_ev));
        assert!(
            per_node.offset >= large.shared().bytes as u64,
            "after the shared part"
        );
        assert_eq!(large.var_at(0, v.offset()), Some(v));
        assert_eq!(large.var_at(0, vars.at(0).offset()), None, "not on node 0");
        assert_eq!(large.var_at(3, vars.at(0).offset()), Some(vars.at(0)));
        assert_eq!(large.event_at(0, 1), None);
        assert_eq!(large.event_at(3, 1), Some(home_ev));
    }

    #[test]
    fn a_second_home_section_is_refused() {
        let mut b = Layout::builder();
        b.var("x");
        b.home_section(0);
        b.home_section(1);
        assert_eq!(b.build(), Err(LayoutError::SecondHomeSection));
    }
}
