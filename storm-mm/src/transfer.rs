//! Sending a program (Algorithm 6), one worker thread per transfer.
//!
//! The worker reads the program in fixed-size chunks through the descriptor storm-submit
//! passed, and ENQUEUEs each into the chunk queue of the job's nodes. ENQUEUE waits for space
//! (AWAIT-SPACE) and then only starts the transfer, so the next chunk is read while the current
//! one travels: the double buffering of the paper. The checksum is computed in the same pass
//! and sent last, in a [`FileTrailer`], so the program is read exactly once.
//!
//! A worker waits for queue space and completions in short steps, so that a transfer the MM
//! cancelled (its job ended, or a node of it failed) stops within [`CANCEL_CHECK`], and a
//! failure says which nodes did not take a chunk.
//!
//! Once every chunk is delivered the worker waits, a little, for every node to have checked
//! the program and answered in `file.ack`, and only then reports and wakes the MM's loop: the
//! MM verifies the answers and records the launch at once instead of at its next timeslice.
//! The MM's verification stays the authority; the worker's wait only tells it when to look.
//!
//! A worker may also only check ([`Transfer::check_only`]): it hashes the program, sends
//! nothing, and waits the same way for the nodes' answers to whether they have it in place.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use storm_cluster::messages::{Checksum, FileTrailer, JobId, file_ack};
use storm_primitives::helpers::{QueueEntry, QueueProducer};
use storm_primitives::{EventId, NodeSet, PrimError, Primitives, Relation, VarId, Wait};

use crate::Waker;
use crate::env::{Failure, TransferDone, TransferTook};

/// How often a waiting worker looks whether its transfer was cancelled.
const CANCEL_CHECK: Duration = Duration::from_millis(100);

/// The first and the longest pause between two looks at the nodes' answers.
const ACK_PAUSE_FIRST: Duration = Duration::from_micros(20);
const ACK_PAUSE_MAX: Duration = Duration::from_millis(1);

/// A transfer to run.
pub struct Transfer {
    pub job: JobId,
    pub transfer: u32,
    pub nodes: NodeSet,
    pub file: File,
    pub size: u64,
    /// The worker slot, and its local completion event.
    pub worker: usize,
    pub event: EventId,
    pub cancel: Arc<AtomicBool>,
    /// Program bytes whose chunks have reached every node, for progress reports.
    pub delivered: Arc<AtomicU64>,
    /// Longest wait for queue space or a completion.
    pub timeout: Duration,
    /// Where each node answers once it checked the program ([`file_ack`]).
    pub file_ack: VarId,
    /// Longest wait, once the program is delivered, for every node's answer before the
    /// worker reports (the MM then finds the answers at a timeslice instead).
    pub ack_wait: Duration,
    /// Wakes the MM's loop when the worker has reported.
    pub wake: Waker,
    /// Send nothing: hash the program (remembered in `hashes`) and wait for the answers.
    pub check_only: bool,
    pub hashes: storm_cluster::program_hash::HashCache,
}

/// Runs transfer `t` on a thread of its own, sending its chunks through `queue`; reports on
/// `done` and wakes the MM's loop when it ends.
pub fn spawn(
    prims: Arc<dyn Primitives>,
    queue: storm_primitives::QueueLayout,
    t: Transfer,
    done: Sender<TransferDone>,
) {
    let (job, transfer, worker) = (t.job, t.transfer, t.worker);
    let report = done.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("storm-mm-send-{job}"))
        .spawn(move || {
            let started = Instant::now();
            let result = if t.check_only {
                t.hashes
                    .hash(&t.file, &|| t.cancel.load(Ordering::Acquire))
                    .map_err(|e| Failure::new(format!("cannot read the program: {e}")))
            } else {
                send(&*prims, queue, &t)
            };
            let delivered = Instant::now();
            if result.is_ok() {
                await_answers(&*prims, &t);
            }
            let took = if t.check_only {
                TransferTook::default()
            } else {
                TransferTook {
                    delivered: delivered - started,
                    answered: delivered.elapsed(),
                }
            };
            let _ = done.send(TransferDone {
                job,
                transfer,
                worker,
                result,
                took,
            });
            t.wake.wake();
        });
    if let Err(e) = spawned {
        let _ = report.send(TransferDone {
            job,
            transfer,
            worker,
            result: Err(Failure::new(format!("cannot start a transfer thread: {e}"))),
            took: TransferTook::default(),
        });
    }
}

/// Sends the program; whatever the outcome, returns only once every chunk sent has
/// completed or failed (or the timeout passed), so that no late completion lands on the
/// worker's event after the MM gave it to another transfer.
fn send(
    prims: &dyn Primitives,
    queue: storm_primitives::QueueLayout,
    t: &Transfer,
) -> Result<[u8; 32], Failure> {
    let mut outstanding = Outstanding::default();
    let result = send_chunks(prims, queue, t, &mut outstanding);
    let deadline = Instant::now() + t.timeout;
    while !outstanding.is_empty() && Instant::now() < deadline {
        match prims.test_event(t.event, Wait::Timeout(CANCEL_CHECK)) {
            Ok(true) | Err(_) => outstanding.completed(&t.delivered),
            Ok(false) => {}
        }
    }
    result
}

/// Waits until every node has answered for the program (verified or not), at most
/// `t.ack_wait`, looking with COMPARE-AND-WRITE at growing intervals. A node answers once it
/// wrote the last chunk, checked size and checksum, and closed the file, a moment after the
/// last chunk reached it. Whatever the outcome the MM checks the answers itself.
fn await_answers(prims: &dyn Primitives, t: &Transfer) {
    let answered = file_ack(t.transfer, false);
    let deadline = Instant::now() + t.ack_wait;
    let mut pause = ACK_PAUSE_FIRST;
    while !t.cancel.load(Ordering::Acquire) {
        let all = prims.compare_and_write_within(
            &t.nodes,
            t.file_ack,
            Relation::Ge,
            answered,
            None,
            Some(t.ack_wait),
        );
        if !matches!(all, Ok(false)) || Instant::now() + pause > deadline {
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(ACK_PAUSE_MAX);
    }
}

/// The sizes of the chunks sent and not yet completed, oldest first: completions come in the
/// order of the sends (one origin's XFER-AND-SIGNALs are signalled in issue order).
#[derive(Default)]
struct Outstanding(VecDeque<u64>);

impl Outstanding {
    fn sent(&mut self, program_bytes: u64) {
        self.0.push_back(program_bytes);
    }

    /// The oldest chunk completed (delivered or failed).
    fn completed(&mut self, delivered: &AtomicU64) {
        if let Some(n) = self.0.pop_front() {
            delivered.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn send_chunks(
    prims: &dyn Primitives,
    queue: storm_primitives::QueueLayout,
    t: &Transfer,
    outstanding: &mut Outstanding,
) -> Result<[u8; 32], Failure> {
    let mut producer = QueueProducer::new(queue, t.nodes.clone(), t.transfer)
        .with_space_timeout(CANCEL_CHECK)
        .applied_on_arrival();
    let chunk = queue.slot_payload;
    let mut sum = Checksum::new();
    let mut hash = blake3::Hasher::new();
    let mut offset = 0u64;
    let cancelled = || t.cancel.load(Ordering::Acquire);
    // Takes the completions there are; with `patient`, waits (up to the timeout) until no
    // chunk is outstanding.
    let collect = |outstanding: &mut Outstanding, patient: bool| -> Result<(), Failure> {
        let deadline = Instant::now() + t.timeout;
        while !outstanding.is_empty() {
            let wait = if patient {
                Wait::Timeout(CANCEL_CHECK)
            } else {
                Wait::Poll
            };
            match prims.test_event(t.event, wait) {
                Ok(true) => outstanding.completed(&t.delivered),
                Ok(false) if !patient => return Ok(()),
                Ok(false) if cancelled() => return Err(Failure::new("cancelled".into())),
                Ok(false) if Instant::now() >= deadline => {
                    return Err(Failure::new(format!(
                        "a chunk was not delivered within {:?}",
                        t.timeout
                    )));
                }
                Ok(false) => {}
                Err(e) => {
                    outstanding.completed(&AtomicU64::new(0));
                    return Err(Failure::from_prim("delivering a chunk".into(), &e));
                }
            }
        }
        Ok(())
    };
    // ENQUEUE, waiting for space in short steps (until the timeout, or a cancel).
    let enqueue = |producer: &mut QueueProducer, entry: QueueEntry, what: String| {
        let deadline = Instant::now() + t.timeout;
        loop {
            match producer.await_space(prims) {
                Ok(()) => break,
                Err(PrimError::QueueFull { .. } | PrimError::Timeout { .. }) if cancelled() => {
                    return Err(Failure::new("cancelled".into()));
                }
                Err(PrimError::QueueFull { .. } | PrimError::Timeout { .. })
                    if Instant::now() < deadline => {}
                Err(e) => return Err(Failure::from_prim(what, &e)),
            }
        }
        producer
            .enqueue_entry(prims, entry, Some(t.event))
            .map_err(|e| Failure::from_prim(what, &e))
    };
    while offset < t.size {
        if cancelled() {
            return Err(Failure::new("cancelled".into()));
        }
        let n = chunk.min((t.size - offset) as usize);
        // The chunk is read straight into the slot image that goes on the wire.
        let mut entry = QueueEntry::zeroed(n);
        t.file
            .read_exact_at(entry.payload_mut(), offset)
            .map_err(|e| {
                Failure::new(format!(
                    "reading the program at byte {offset}: {e} (was it changed or truncated?)"
                ))
            })?;
        sum.update(entry.payload());
        hash.update(entry.payload());
        enqueue(
            &mut producer,
            entry,
            format!("sending chunk at byte {offset}"),
        )?;
        outstanding.sent(n as u64);
        offset += n as u64;
        collect(outstanding, false)?;
    }
    // Exactly the size checked at submission went out; a program that grew since is not the
    // one its user submitted and limited (issue 31, finding 7).
    match t.file.metadata() {
        Ok(m) if m.len() != t.size => {
            return Err(Failure::new(format!(
                "the program changed after it was submitted: {} bytes were checked against the \
                 limits, it has {} now; submit it again once it is complete",
                t.size,
                m.len()
            )));
        }
        Ok(_) => {}
        Err(e) => return Err(Failure::new(format!("cannot inspect the program: {e}"))),
    }
    let trailer = FileTrailer {
        size: t.size,
        checksum: sum.finish(),
    };
    enqueue(
        &mut producer,
        QueueEntry::copied(&trailer.to_bytes()),
        "sending the trailer".into(),
    )?;
    outstanding.sent(0);
    collect(outstanding, true)?;
    Ok(*hash.finalize().as_bytes())
}
