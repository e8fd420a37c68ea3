//! A host of the forwarder without a thread: each [`SteppedOutput::pump`] reads what every
//! stream holds now and steps the [`Forwarder`]. The simulator's tasks write into memory
//! streams and its nodes pump once per step, so output crosses the real forwarder, queue and
//! MM in virtual time.

use std::time::Instant;

use storm_cluster::messages::{JobId, Stream};

use super::{Drained, Forwarder, ForwarderState, InputFeeds, OutputSource, OutputStream};
use crate::env::OutputForwarder;

/// The forwarder and the streams it reads, stepped by its owner.
pub struct SteppedOutput {
    core: Forwarder,
    watches: Vec<(OutputStream, Box<dyn OutputSource>)>,
    inputs: InputFeeds,
    buf: Vec<u8>,
    /// The time of the last pump, for epochs begun between pumps.
    now: Instant,
}

impl SteppedOutput {
    pub fn new(core: Forwarder, now: Instant) -> Self {
        let buf = vec![0u8; core.chunk_bytes()];
        Self {
            core,
            watches: Vec::new(),
            inputs: InputFeeds::default(),
            buf,
            now,
        }
    }

    /// Reads what the streams hold (while nothing waits to be sent), sends it, and counts
    /// ended streams as drained once delivered. Streams must not block.
    pub fn pump(&mut self, now: Instant) {
        self.now = now;
        self.core.step(now);
        let mut ended = Vec::new();
        for (i, (s, source)) in self.watches.iter_mut().enumerate() {
            while self.core.reading() {
                match source.read(&mut self.buf) {
                    Ok(0) => {
                        ended.push(i);
                        break;
                    }
                    Ok(n) => {
                        self.core.data(s, &self.buf[..n]);
                        self.core.step(now);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        ended.push(i);
                        break;
                    }
                }
            }
        }
        for i in ended.into_iter().rev() {
            let (s, _) = self.watches.remove(i);
            self.core.closed(s);
        }
        self.inputs.pump(&mut self.core);
        self.core.step(now);
    }
}

impl OutputForwarder for SteppedOutput {
    fn watch(
        &mut self,
        job: JobId,
        rank: u32,
        stream: Stream,
        source: Box<dyn OutputSource>,
        remaining: Drained,
    ) {
        self.watches
            .push((OutputStream::new(job, rank, stream, remaining), source));
    }

    fn tell(&mut self, job: JobId, rank: u32, stream: Stream, text: &str, remaining: &Drained) {
        remaining.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.core.tell(job, rank, stream, text, remaining);
    }

    fn feed(&mut self, job: JobId, rank: u32, pipe: std::os::fd::OwnedFd) {
        self.inputs.feed(job, rank, pipe);
    }

    fn input(&mut self, job: JobId, rank: u32, offset: u64, data: Vec<u8>, eof: bool) {
        self.inputs.input(job, rank, offset, data, eof);
    }

    fn end_input(&mut self, job: JobId) {
        self.inputs.close_job(job);
    }

    fn close_job(&mut self, job: JobId) {
        self.inputs.close_job(job);
        let (closed, kept) = std::mem::take(&mut self.watches)
            .into_iter()
            .partition(|(s, _)| s.job == job);
        self.watches = kept;
        for (s, _) in closed {
            self.core.closed(s);
        }
    }

    fn discard_job(&mut self, job: JobId) {
        self.close_job(job);
        self.core.discard(job);
    }

    fn new_epoch(&mut self, epoch: u32) {
        self.core.new_epoch(epoch, self.now);
    }

    fn state(&self) -> &ForwarderState {
        self.core.state()
    }
}
