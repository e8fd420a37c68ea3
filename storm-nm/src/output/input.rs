//! Standard input for the tasks that read storm-submit's (`-i`), on the forwarder's host.
//!
//! The MM passes storm-submit's input to the nodes as [`Command::Input`] pieces, each with
//! its offset in the stream. [`InputFeeds`] keeps, per rank, the bytes not yet written into
//! the task's pipe, writes them without blocking as the pipe takes them, and tells the MM how
//! far the rank took its input with an [`Stream::InputTaken`] chunk through the forwarder.
//! storm-submit sends more only as far as those chunks let it, so what waits here is bounded
//! by storm-submit's window, whatever the task does: a task that does not read slows
//! storm-submit down rather than growing the NM.
//!
//! A piece sent again (after an MM restart) is kept once, by its offset. Input that arrives
//! before the task's pipe (a gang-scheduled job starts at its first time slot) waits for it.
//! A task that closed its standard input, or ended, takes everything from then on: the bytes
//! are dropped and acknowledged, so storm-submit never waits on it. The end of the stream is
//! acknowledged too ([`INPUT_END`]), once the task's pipe is closed after the last byte, so
//! an end lost on its way (a missed heartbeat) is sent again rather than leaving the task
//! waiting for end of file.
//!
//! [`Command::Input`]: storm_cluster::messages::Command::Input
//! [`Stream::InputTaken`]: storm_cluster::messages::Stream::InputTaken

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use storm_cluster::messages::{INPUT_END, JobId};

use super::Forwarder;

/// One rank's standard input.
#[derive(Default)]
struct Feed {
    /// The write end of the task's stdin (non-blocking); `None` before it is fed, and once
    /// the stream ended or the task closed it.
    pipe: Option<OwnedFd>,
    /// Bytes received and not yet written; they start at offset `written`.
    waiting: Vec<u8>,
    written: u64,
    /// The stream ends after what was received.
    eof: bool,
    /// Nothing more is written (end of stream reached, or the task is not reading any more).
    done: bool,
    /// The offset last acknowledged to the MM.
    acknowledged: u64,
}

impl Feed {
    fn received(&self) -> u64 {
        self.written + self.waiting.len() as u64
    }

    /// What to acknowledge to the MM now, if anything new: how far the task took its input,
    /// or, once the end is delivered (or the task takes nothing more), [`INPUT_END`]:
    /// storm-submit sends the end again until it hears that.
    fn acknowledgement(&mut self) -> Option<u64> {
        let upto = if self.done && self.eof && self.waiting.is_empty() {
            INPUT_END
        } else {
            self.written
        };
        (upto > self.acknowledged).then(|| {
            self.acknowledged = upto;
            upto
        })
    }
}

/// The standard input of every local rank that reads the job's input.
#[derive(Default)]
pub struct InputFeeds {
    feeds: HashMap<(JobId, u32), Feed>,
}

impl InputFeeds {
    /// The rank's input goes into `pipe` from now on.
    pub fn feed(&mut self, job: JobId, rank: u32, pipe: OwnedFd) {
        if let Err(e) = nix::fcntl::fcntl(
            &pipe,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        ) {
            tracing::warn!(job, rank, "standard input pipe: {e}");
        }
        let f = self.feeds.entry((job, rank)).or_default();
        if !f.done {
            f.pipe = Some(pipe);
        }
    }

    /// The rank's input from `offset` on; what it already has is dropped, and a piece past
    /// what it has (an earlier one lost) waits for the one before it, which storm-submit
    /// sends again.
    pub fn input(&mut self, job: JobId, rank: u32, offset: u64, data: Vec<u8>, eof: bool) {
        let f = self.feeds.entry((job, rank)).or_default();
        let have = f.received();
        let end = offset.saturating_add(data.len() as u64);
        if offset > have || f.eof {
            return;
        }
        if end > have {
            let skip = (have - offset) as usize;
            if f.done {
                f.written = end;
            } else {
                f.waiting.extend_from_slice(&data[skip..]);
            }
        }
        if eof && end >= have {
            f.eof = true;
        }
    }

    /// Stops writing the job's input (its tasks ended).
    pub fn close_job(&mut self, job: JobId) {
        self.feeds.retain(|&(j, _), _| j != job);
    }

    /// The pipes with bytes waiting for room, to wait on for POLLOUT, by (job, rank).
    pub fn waiting_pipes(&self) -> Vec<((JobId, u32), BorrowedFd<'_>)> {
        self.feeds
            .iter()
            .filter(|(_, f)| !f.waiting.is_empty())
            .filter_map(|(&k, f)| f.pipe.as_ref().map(|p| (k, p.as_fd())))
            .collect()
    }

    /// Writes what the pipes take now, closes the streams that ended, and acknowledges to
    /// the MM (through `fwd`) how far each rank took its input.
    pub fn pump(&mut self, fwd: &mut Forwarder) {
        for (&(job, rank), f) in self.feeds.iter_mut() {
            while !f.waiting.is_empty() && !f.done {
                let Some(pipe) = &f.pipe else { break };
                match nix::unistd::write(pipe, &f.waiting) {
                    Ok(n) => {
                        f.waiting.drain(..n);
                        f.written += n as u64;
                    }
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(nix::errno::Errno::EAGAIN) => break,
                    // EPIPE: the task closed its standard input or ended. It takes nothing
                    // more: what waits, and whatever comes, is dropped and acknowledged.
                    Err(_) => {
                        f.done = true;
                        f.pipe = None;
                    }
                }
            }
            if f.done {
                f.written = f.received();
                f.waiting.clear();
            }
            if f.eof && f.waiting.is_empty() && f.pipe.is_some() {
                // The end of the stream: the task reads end of file.
                f.pipe = None;
                f.done = true;
            }
            if let Some(upto) = f.acknowledgement() {
                fwd.input_taken(job, rank, upto);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(feeds: &InputFeeds, job: JobId, rank: u32) -> (u64, usize) {
        let f = &feeds.feeds[&(job, rank)];
        (f.written, f.waiting.len())
    }

    #[test]
    fn the_end_is_acknowledged_once_the_task_has_it() {
        let mut f = Feed {
            waiting: b"abc".to_vec(),
            eof: true,
            ..Default::default()
        };
        // Nothing written yet: nothing to say.
        assert_eq!(f.acknowledgement(), None);
        f.waiting.clear();
        f.written = 3;
        assert_eq!(f.acknowledgement(), Some(3), "the bytes, not yet the end");
        // The pipe closed after the last byte: the task reads end of file.
        f.done = true;
        assert_eq!(f.acknowledgement(), Some(INPUT_END));
        assert_eq!(f.acknowledgement(), None, "said once");
    }

    #[test]
    fn pieces_are_kept_once_by_offset_and_a_gap_waits_for_the_piece_before_it() {
        let mut feeds = InputFeeds::default();
        feeds.input(1, 0, 0, b"hello ".to_vec(), false);
        // Sent again after an MM restart, overlapping what is here.
        feeds.input(1, 0, 3, b"lo world".to_vec(), false);
        // A piece past a lost one is not taken.
        feeds.input(1, 0, 20, b"later".to_vec(), false);
        let f = &feeds.feeds[&(1, 0)];
        assert_eq!(f.waiting, b"hello world");
        assert!(!f.eof);
        feeds.input(1, 0, 11, Vec::new(), true);
        assert!(feeds.feeds[&(1, 0)].eof);
        // Nothing after the end.
        feeds.input(1, 0, 11, b"x".to_vec(), false);
        assert_eq!(taken(&feeds, 1, 0), (0, 11));
    }
}
