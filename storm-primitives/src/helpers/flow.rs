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
/// poll, with exponential backoff in between). Fails with a timeout after `deadline`.
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
) -> Result<()> {
    let mut pause = backoff.first;
    loop {
        if prims.compare_and_write(dest, queue.dequeued, Relation::Ge, needed, None)? {
            return Ok(());
        }
        if let Some(deadline) = deadline
            && Instant::now() + pause > deadline
        {
            return Err(PrimError::Timeout {
                nodes: dest.clone(),
                timeout_ms: 0,
                detail: format!("a queue stayed full (waiting for {needed} entries dequeued)"),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(backoff.max);
    }
}
