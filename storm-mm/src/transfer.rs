//! Sending a program (Algorithm 6), one worker thread per transfer.
//!
//! The worker reads the program in fixed-size chunks through the descriptor storm-submit
//! passed, and ENQUEUEs each into the chunk queue of the job's nodes. ENQUEUE waits for space
//! (AWAIT-SPACE) and then only starts the transfer, so the next chunk is read while the current
//! one travels: the double buffering of the paper. The checksum is computed in the same pass
//! and sent last, in a [`FileTrailer`], so the program is read exactly once.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::Sender;
use storm_cluster::RmLayout;
use storm_cluster::messages::{Checksum, FileTrailer, JobId};
use storm_primitives::helpers::QueueProducer;
use storm_primitives::{EventId, NodeSet, Primitives, Wait};

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
    /// Longest wait for queue space or a completion.
    pub timeout: Duration,
}

/// What a worker reports when it is done. By then no completion of its transfer is still
/// due, so its slot and event may serve the next transfer.
pub struct TransferDone {
    pub job: JobId,
    pub transfer: u32,
    pub worker: usize,
    pub result: Result<(), String>,
}

pub fn spawn(prims: Arc<dyn Primitives>, rm: &RmLayout, t: Transfer, done: Sender<TransferDone>) {
    let queue = rm.chunks;
    let (job, transfer, worker) = (t.job, t.transfer, t.worker);
    let report = done.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("storm-mm-send-{job}"))
        .spawn(move || {
            let result = send(&*prims, queue, &t);
            let _ = done.send(TransferDone {
                job,
                transfer,
                worker,
                result,
            });
        });
    if let Err(e) = spawned {
        let _ = report.send(TransferDone {
            job,
            transfer,
            worker,
            result: Err(format!("cannot start a transfer thread: {e}")),
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
) -> Result<(), String> {
    let mut outstanding = 0u64;
    let result = send_chunks(prims, queue, t, &mut outstanding);
    while outstanding > 0 {
        match prims.test_event(t.event, Wait::Timeout(t.timeout)) {
            Ok(true) | Err(_) => outstanding -= 1,
            Ok(false) => break,
        }
    }
    result
}

fn send_chunks(
    prims: &dyn Primitives,
    queue: storm_primitives::QueueLayout,
    t: &Transfer,
    outstanding: &mut u64,
) -> Result<(), String> {
    let mut producer =
        QueueProducer::new(queue, t.nodes.clone(), t.transfer).with_space_timeout(t.timeout);
    let chunk = queue.slot_payload;
    let mut buf = vec![0u8; chunk];
    let mut sum = Checksum::new();
    let mut offset = 0u64;
    let collect = |outstanding: &mut u64, wait: Wait| -> Result<(), String> {
        while *outstanding > 0 {
            match prims.test_event(t.event, wait) {
                Ok(true) => *outstanding -= 1,
                Ok(false) if wait == Wait::Poll => return Ok(()),
                Ok(false) => {
                    return Err(format!("a chunk was not delivered within {:?}", t.timeout));
                }
                Err(e) => {
                    *outstanding -= 1;
                    return Err(e.to_string());
                }
            }
        }
        Ok(())
    };
    while offset < t.size {
        if t.cancel.load(Ordering::Acquire) {
            return Err("cancelled".into());
        }
        let n = chunk.min((t.size - offset) as usize);
        t.file.read_exact_at(&mut buf[..n], offset).map_err(|e| {
            format!("reading the program at byte {offset}: {e} (was it changed or truncated?)")
        })?;
        sum.update(&buf[..n]);
        producer
            .enqueue(prims, &buf[..n], Some(t.event))
            .map_err(|e| format!("sending chunk at byte {offset}: {e}"))?;
        *outstanding += 1;
        offset += n as u64;
        collect(outstanding, Wait::Poll)?;
    }
    let trailer = FileTrailer {
        size: t.size,
        checksum: sum.finish(),
    };
    producer
        .enqueue(prims, &trailer.to_bytes(), Some(t.event))
        .map_err(|e| format!("sending the trailer: {e}"))?;
    *outstanding += 1;
    collect(outstanding, Wait::Timeout(t.timeout))
}
