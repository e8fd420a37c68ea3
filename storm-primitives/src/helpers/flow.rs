//! AWAIT-SPACE (Algorithm 1): wait until no node of a set has a full queue.

use std::time::{Duration, Instant};

use crate::error::{PrimError, Result};
use crate::layout::QueueLayout;
use crate::nodeset::NodeSet;
use crate::prims::Primitives;
use crate::relation::Relation;

/// Exponential backoff between polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_micros(20),
            max: Duration::from_millis(5),
        }
    }
}

/// AWAIT-SPACE: returns once every node of `dest` has dequeued at least `needed` entries of
/// `queue`, that is `global[queue.dequeued] >= needed` everywhere (one COMPARE-AND-WRITE per
/// poll, with exponential backoff in between). Each COMPARE-AND-WRITE has `op_timeout`
/// (`None`: the backend's). Fails with a timeout after `deadline`, naming the nodes whose
/// queue is still full; a node that does not answer at all fails it sooner, named by the
/// COMPARE-AND-WRITE's own error.
///
/// The producer computes `needed` as `enqueued + 1 - slots`: the paper's condition that no
/// node's queue is full.
pub fn await_space<P: Primitives + ?Sized>(
    prims: &P,
    dest: &NodeSet,
    queue: &QueueLayout,
    needed: u64,
    backoff: Backoff,
    deadline: Option<Instant>,
    op_timeout: Option<Duration>,
) -> Result<()> {
    let mut pause = backoff.first;
    loop {
        if prims.compare_and_write_within(
            dest,
            queue.dequeued,
            Relation::Ge,
            needed,
            None,
            op_timeout,
        )? {
            return Ok(());
        }
        if let Some(deadline) = deadline
            && Instant::now() + pause > deadline
        {
            return Err(PrimError::QueueFull {
                nodes: lagging(prims, dest, queue, needed, op_timeout),
                needed,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(backoff.max);
    }
}

/// The nodes of `dest` that have not dequeued `needed` entries (or do not say), found by
/// halving: one COMPARE-AND-WRITE per half that holds, so k laggards cost O(k log n) checks.
fn lagging<P: Primitives + ?Sized>(
    prims: &P,
    dest: &NodeSet,
    queue: &QueueLayout,
    needed: u64,
    op_timeout: Option<Duration>,
) -> NodeSet {
    let nodes: Vec<_> = dest.iter().collect();
    let mut out = NodeSet::new();
    let mut todo = vec![nodes.as_slice()];
    while let Some(part) = todo.pop() {
        let set: NodeSet = part.iter().copied().collect();
        let holds = prims
            .compare_and_write_within(&set, queue.dequeued, Relation::Ge, needed, None, op_timeout)
            .unwrap_or(false);
        if holds {
            continue;
        }
        if let [one] = part {
            out.insert(*one);
        } else {
            let (a, b) = part.split_at(part.len() / 2);
            todo.extend([a, b]);
        }
    }
    out
}
