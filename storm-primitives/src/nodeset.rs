//! `NodeSet`: a compact set of node ids, stored as sorted disjoint ranges.
//!
//! Node sets travel in every tree operation's header, so they must stay small however many nodes
//! a cluster has: `0-4095` is one range, not 4096 ids. The text form is the hostlist style that
//! HPC operators know from Slurm (`0-7,12,20-23`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A node's identity in a storm cluster: its index in the cluster's node table.
pub type NodeId = u32;

/// A set of node ids as sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "Vec<(NodeId, NodeId)>", into = "Vec<(NodeId, NodeId)>")]
pub struct NodeSet {
    ranges: Vec<(NodeId, NodeId)>,
}

/// Why a text or a range list is not a valid node set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeSetError {
    #[error("empty element in node list {0:?} (two commas in a row, or a trailing comma?)")]
    EmptyElement(String),
    #[error("{0:?} is not a node id (expected a number such as 7, or a range such as 0-7)")]
    NotANumber(String),
    #[error("range {lo}-{hi} runs backwards (write it {hi}-{lo})")]
    Backwards { lo: NodeId, hi: NodeId },
    #[error("ranges are not sorted and disjoint: {0:?}")]
    Unsorted(Vec<(NodeId, NodeId)>),
}

impl NodeSet {
    /// The empty set.
    pub fn new() -> Self {
        Self { ranges: Vec::new() }
    }

    /// All ids in `lo..=hi`. Empty when `hi < lo`.
    pub fn range(lo: NodeId, hi: NodeId) -> Self {
        if hi < lo {
            return Self::new();
        }
        Self {
            ranges: vec![(lo, hi)],
        }
    }

    /// The first `n` nodes, `0..n`.
    pub fn first_n(n: u32) -> Self {
        if n == 0 {
            Self::new()
        } else {
            Self::range(0, n - 1)
        }
    }

    /// A set holding one node.
    pub fn single(id: NodeId) -> Self {
        Self::range(id, id)
    }

    /// The ranges, sorted and disjoint, each inclusive.
    pub fn ranges(&self) -> &[(NodeId, NodeId)] {
        &self.ranges
    }

    /// Number of nodes in the set.
    pub fn len(&self) -> usize {
        self.ranges
            .iter()
            .map(|&(lo, hi)| (hi - lo) as usize + 1)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The smallest id, if any.
    pub fn first(&self) -> Option<NodeId> {
        self.ranges.first().map(|r| r.0)
    }

    /// The largest id, if any.
    pub fn last(&self) -> Option<NodeId> {
        self.ranges.last().map(|r| r.1)
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.find(id).is_ok()
    }

    /// Index of the range holding `id`, or where it would be inserted.
    fn find(&self, id: NodeId) -> Result<usize, usize> {
        self.ranges.binary_search_by(|&(lo, hi)| {
            if hi < id {
                std::cmp::Ordering::Less
            } else if lo > id {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
    }

    /// Position of `id` in ascending order (0 for the smallest member), if it is a member.
    pub fn rank(&self, id: NodeId) -> Option<usize> {
        let mut before = 0usize;
        for &(lo, hi) in &self.ranges {
            if id < lo {
                return None;
            }
            if id <= hi {
                return Some(before + (id - lo) as usize);
            }
            before += (hi - lo) as usize + 1;
        }
        None
    }

    /// The member at position `index` in ascending order.
    pub fn nth(&self, index: usize) -> Option<NodeId> {
        let mut left = index;
        for &(lo, hi) in &self.ranges {
            let width = (hi - lo) as usize + 1;
            if left < width {
                return Some(lo + left as u32);
            }
            left -= width;
        }
        None
    }

    /// Adds `id`; returns whether it was new.
    pub fn insert(&mut self, id: NodeId) -> bool {
        match self.find(id) {
            Ok(_) => false,
            Err(pos) => {
                self.ranges.insert(pos, (id, id));
                self.normalize_around(pos);
                true
            }
        }
    }

    /// Removes `id`; returns whether it was present.
    pub fn remove(&mut self, id: NodeId) -> bool {
        match self.find(id) {
            Err(_) => false,
            Ok(pos) => {
                let (lo, hi) = self.ranges[pos];
                match (id == lo, id == hi) {
                    (true, true) => {
                        self.ranges.remove(pos);
                    }
                    (true, false) => self.ranges[pos].0 = id + 1,
                    (false, true) => self.ranges[pos].1 = id - 1,
                    (false, false) => {
                        self.ranges[pos].1 = id - 1;
                        self.ranges.insert(pos + 1, (id + 1, hi));
                    }
                }
                true
            }
        }
    }

    /// Merges the range at `pos` with touching neighbours.
    fn normalize_around(&mut self, pos: usize) {
        if pos + 1 < self.ranges.len()
            && self.ranges[pos].1.saturating_add(1) >= self.ranges[pos + 1].0
        {
            self.ranges[pos].1 = self.ranges[pos].1.max(self.ranges[pos + 1].1);
            self.ranges.remove(pos + 1);
        }
        if pos > 0 && self.ranges[pos - 1].1.saturating_add(1) >= self.ranges[pos].0 {
            self.ranges[pos - 1].1 = self.ranges[pos - 1].1.max(self.ranges[pos].1);
            self.ranges.remove(pos);
        }
    }

    /// Builds a set from arbitrary (possibly overlapping, unsorted) inclusive ranges.
    fn from_loose_ranges(mut ranges: Vec<(NodeId, NodeId)>) -> Self {
        ranges.retain(|&(lo, hi)| lo <= hi);
        ranges.sort_unstable();
        let mut out: Vec<(NodeId, NodeId)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match out.last_mut() {
                Some(last) if last.1.saturating_add(1) >= lo => last.1 = last.1.max(hi),
                _ => out.push((lo, hi)),
            }
        }
        Self { ranges: out }
    }

    pub fn union(&self, other: &NodeSet) -> NodeSet {
        let mut all = self.ranges.clone();
        all.extend_from_slice(&other.ranges);
        Self::from_loose_ranges(all)
    }

    pub fn intersection(&self, other: &NodeSet) -> NodeSet {
        let (mut i, mut j) = (0, 0);
        let mut out = Vec::new();
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a_lo, a_hi) = self.ranges[i];
            let (b_lo, b_hi) = other.ranges[j];
            let lo = a_lo.max(b_lo);
            let hi = a_hi.min(b_hi);
            if lo <= hi {
                out.push((lo, hi));
            }
            if a_hi < b_hi {
                i += 1;
            } else {
                j += 1;
            }
        }
        Self { ranges: out }
    }

    pub fn difference(&self, other: &NodeSet) -> NodeSet {
        let mut out = Vec::new();
        let mut j = 0;
        for &(lo, hi) in &self.ranges {
            let mut cur = lo;
            let mut done = false;
            while j < other.ranges.len() && other.ranges[j].1 < cur {
                j += 1;
            }
            let mut k = j;
            while k < other.ranges.len() && other.ranges[k].0 <= hi {
                let (b_lo, b_hi) = other.ranges[k];
                if b_lo > cur {
                    out.push((cur, b_lo - 1));
                }
                if b_hi >= hi {
                    done = true;
                    break;
                }
                cur = b_hi + 1;
                k += 1;
            }
            if !done {
                out.push((cur, hi));
            }
        }
        Self { ranges: out }
    }

    pub fn is_subset(&self, other: &NodeSet) -> bool {
        self.difference(other).is_empty()
    }

    pub fn is_disjoint(&self, other: &NodeSet) -> bool {
        self.intersection(other).is_empty()
    }

    /// Members in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.ranges.iter().flat_map(|&(lo, hi)| lo..=hi)
    }

    /// The members as a vector, ascending.
    pub fn to_vec(&self) -> Vec<NodeId> {
        self.iter().collect()
    }
}

impl FromIterator<NodeId> for NodeSet {
    fn from_iter<I: IntoIterator<Item = NodeId>>(iter: I) -> Self {
        Self::from_loose_ranges(iter.into_iter().map(|id| (id, id)).collect())
    }
}

impl TryFrom<Vec<(NodeId, NodeId)>> for NodeSet {
    type Error = NodeSetError;

    /// Accepts only the canonical form (sorted, disjoint, non-adjacent, each `lo <= hi`), so a
    /// set decoded from the network is exactly the set that was sent.
    fn try_from(ranges: Vec<(NodeId, NodeId)>) -> Result<Self, Self::Error> {
        for &(lo, hi) in &ranges {
            if lo > hi {
                return Err(NodeSetError::Backwards { lo, hi });
            }
        }
        let canonical = ranges
            .windows(2)
            .all(|w| w[0].1.checked_add(1).is_some_and(|next| next < w[1].0));
        if !canonical {
            return Err(NodeSetError::Unsorted(ranges));
        }
        Ok(Self { ranges })
    }
}

impl From<NodeSet> for Vec<(NodeId, NodeId)> {
    fn from(set: NodeSet) -> Self {
        set.ranges
    }
}

impl fmt::Display for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeSet[{self}]")
    }
}

fn parse_id(text: &str) -> Result<NodeId, NodeSetError> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NodeSetError::NotANumber(text.to_string()));
    }
    t.parse::<NodeId>()
        .map_err(|_| NodeSetError::NotANumber(text.to_string()))
}

impl FromStr for NodeSet {
    type Err = NodeSetError;

    /// Parses `0-7,12,20-23`. Brackets around the list (`[0-7,12]`) are accepted; the empty
    /// string is the empty set. Overlapping or unsorted elements are merged.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let inner = trimmed
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(trimmed);
        if inner.trim().is_empty() {
            return Ok(NodeSet::new());
        }
        let mut ranges = Vec::new();
        for element in inner.split(',') {
            if element.trim().is_empty() {
                return Err(NodeSetError::EmptyElement(text.to_string()));
            }
            match element.split_once('-') {
                None => {
                    let id = parse_id(element)?;
                    ranges.push((id, id));
                }
                Some((lo, hi)) => {
                    let (lo, hi) = (parse_id(lo)?, parse_id(hi)?);
                    if lo > hi {
                        return Err(NodeSetError::Backwards { lo, hi });
                    }
                    ranges.push((lo, hi));
                }
            }
        }
        Ok(Self::from_loose_ranges(ranges))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn parses_and_prints_hostlist_text() {
        let set: NodeSet = "0-7,12,20-23".parse().unwrap();
        assert_eq!(set.len(), 13);
        assert_eq!(set.to_string(), "0-7,12,20-23");
        assert!(set.contains(12) && !set.contains(13) && set.contains(23));
        let merged: NodeSet = "[5,3-4,0-1,2]".parse().unwrap();
        assert_eq!(merged.to_string(), "0-5");
        assert_eq!("".parse::<NodeSet>().unwrap(), NodeSet::new());
    }

    #[test]
    fn bad_text_is_an_error_naming_the_problem() {
        assert_eq!(
            "1,,2".parse::<NodeSet>(),
            Err(NodeSetError::EmptyElement("1,,2".into()))
        );
        assert_eq!(
            "7-3".parse::<NodeSet>(),
            Err(NodeSetError::Backwards { lo: 7, hi: 3 })
        );
        assert!(matches!(
            "node1".parse::<NodeSet>(),
            Err(NodeSetError::NotANumber(_))
        ));
        assert!(matches!(
            "99999999999".parse::<NodeSet>(),
            Err(NodeSetError::NotANumber(_))
        ));
        assert!(matches!(
            "-3".parse::<NodeSet>(),
            Err(NodeSetError::NotANumber(_))
        ));
        let msg = "4-x".parse::<NodeSet>().unwrap_err().to_string();
        assert!(msg.contains("\"x\""), "{msg}");
    }

    #[test]
    fn large_contiguous_sets_stay_one_range() {
        let set = NodeSet::first_n(100_000);
        assert_eq!(set.ranges().len(), 1);
        assert_eq!(set.len(), 100_000);
        assert_eq!(set.rank(99_999), Some(99_999));
        assert_eq!(set.nth(4242), Some(4242));
    }

    #[test]
    fn non_canonical_ranges_from_the_wire_are_rejected() {
        assert!(NodeSet::try_from(vec![(0, 3), (4, 5)]).is_err(), "adjacent");
        assert!(NodeSet::try_from(vec![(4, 5), (0, 1)]).is_err(), "unsorted");
        assert!(NodeSet::try_from(vec![(5, 4)]).is_err(), "backwards");
        assert!(NodeSet::try_from(vec![(u32::MAX, u32::MAX), (0, 1)]).is_err());
        assert!(NodeSet::try_from(vec![(0, 3), (5, 5)]).is_ok());
    }

    fn model(ids: &[u32]) -> BTreeSet<u32> {
        ids.iter().copied().collect()
    }

    proptest! {
        #[test]
        fn set_operations_match_a_btreeset(a in proptest::collection::vec(0u32..64, 0..40),
                                           b in proptest::collection::vec(0u32..64, 0..40),
                                           removals in proptest::collection::vec(0u32..64, 0..10)) {
            let (sa, sb): (NodeSet, NodeSet) = (a.iter().copied().collect(), b.iter().copied().collect());
            let (ma, mb) = (model(&a), model(&b));
            prop_assert_eq!(sa.to_vec(), ma.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(sa.union(&sb).to_vec(), ma.union(&mb).copied().collect::<Vec<_>>());
            prop_assert_eq!(sa.intersection(&sb).to_vec(), ma.intersection(&mb).copied().collect::<Vec<_>>());
            prop_assert_eq!(sa.difference(&sb).to_vec(), ma.difference(&mb).copied().collect::<Vec<_>>());
            prop_assert_eq!(sa.is_subset(&sb), ma.is_subset(&mb));
            for (i, id) in ma.iter().enumerate() {
                prop_assert_eq!(sa.rank(*id), Some(i));
                prop_assert_eq!(sa.nth(i), Some(*id));
            }
            prop_assert_eq!(sa.nth(ma.len()), None);
            let text = sa.to_string();
            prop_assert_eq!(text.parse::<NodeSet>().unwrap(), sa.clone());
            let mut s = sa.clone();
            let mut m = ma.clone();
            for r in removals {
                prop_assert_eq!(s.remove(r), m.remove(&r));
                prop_assert_eq!(s.insert(r + 1), m.insert(r + 1));
            }
            prop_assert_eq!(s.to_vec(), m.iter().copied().collect::<Vec<_>>());
            // Canonical form survives a round trip through the wire representation.
            let wire: Vec<(u32, u32)> = s.clone().into();
            prop_assert_eq!(NodeSet::try_from(wire).unwrap(), s);
        }
    }
}
