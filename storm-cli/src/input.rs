//! storm-submit's standard input, sent to the ranks `-i` names (rank 0 by default).
//!
//! A thread reads standard input in pieces; [`InputSender`] sends them to the MM as
//! [`Request::Input`], each with its offset in the stream, never more than
//! [`INPUT_WINDOW`] bytes past what the tasks acknowledged ([`Stream::InputTaken`] chunks,
//! which arrive with the output). So a task that does not read its input stops storm-submit
//! from reading more, as a pipe would, and nothing in between grows.
//!
//! What is sent and not yet acknowledged is kept: after the MM restarted it goes again (the
//! nodes keep each byte once). It also goes again when no acknowledgement has come for a
//! while ([`FIRST_RESEND`], doubling up to [`LAST_RESEND`]): a node that missed the heartbeat
//! carrying a piece would otherwise wait for it, and its task for its input, for ever. The
//! end of the stream is kept the same way until every rank acknowledged taking it
//! ([`INPUT_END`]): an end that was lost would leave a task waiting for end of file. A task
//! that is merely not reading costs a window's worth of repeats at those growing intervals. A requeued job runs again from its start, but the input it
//! read is gone: its new run reads an empty standard input, and storm-submit says so.
//!
//! [`Request::Input`]: storm_cluster::control::Request::Input
//! [`Stream::InputTaken`]: storm_cluster::messages::Stream::InputTaken

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use storm_cluster::control::Request;
use storm_cluster::messages::{INPUT_END, INPUT_WINDOW, InputTarget, JobId, MAX_INPUT_CHUNK};

/// How long storm-submit waits for an acknowledgement before it sends the unacknowledged
/// input again; each repeat without progress doubles the wait, up to [`LAST_RESEND`].
pub const FIRST_RESEND: Duration = Duration::from_secs(2);
pub const LAST_RESEND: Duration = Duration::from_secs(60);

/// A piece read from standard input; `None` at its end (or on a read error).
pub type Piece = Option<Vec<u8>>;

/// Reads `source` on a thread of its own, a piece at a time; the thread waits while the
/// piece it read is not taken (so at most two pieces are read ahead).
pub fn read_pieces(mut source: impl Read + Send + 'static) -> Receiver<Piece> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("storm-submit-stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; MAX_INPUT_CHUNK];
            loop {
                match source.read(&mut buf) {
                    Ok(0) => {
                        let _ = tx.send(None);
                        return;
                    }
                    Ok(n) => {
                        if tx.send(Some(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        eprintln!(
                            "storm-submit: reading standard input: {e}; the job's input ends here"
                        );
                        let _ = tx.send(None);
                        return;
                    }
                }
            }
        })
        .expect("start the standard input thread");
    rx
}

/// The sending side of the job's standard input.
pub struct InputSender {
    pieces: Receiver<Piece>,
    target: InputTarget,
    job: Option<JobId>,
    /// The ranks whose acknowledgements count, once the job started (`None` before).
    ranks: Option<Vec<u32>>,
    taken: HashMap<u32, u64>,
    /// Bytes from `acked` to `sent`, kept for sending again.
    unacked: VecDeque<u8>,
    acked: u64,
    sent: u64,
    /// A piece read and not sent yet (no room in the window).
    next: Option<Vec<u8>>,
    /// Standard input ended; the end went out.
    at_end: bool,
    end_sent: bool,
    /// The job was requeued: its next run gets an empty input.
    requeued: bool,
    /// When the unacknowledged input goes again if nothing is acknowledged meanwhile, and
    /// the wait after that.
    resend_at: Option<Instant>,
    resend_wait: Duration,
}

impl InputSender {
    pub fn new(pieces: Receiver<Piece>, target: InputTarget) -> Self {
        Self {
            pieces,
            target,
            job: None,
            ranks: None,
            taken: HashMap::new(),
            unacked: VecDeque::new(),
            acked: 0,
            sent: 0,
            next: None,
            at_end: false,
            end_sent: false,
            requeued: false,
            resend_at: None,
            resend_wait: FIRST_RESEND,
        }
    }

    /// The job started with `ntasks` tasks: input may go.
    pub fn started(&mut self, job: JobId, ntasks: u32) {
        self.job = Some(job);
        self.ranks = Some(match self.target {
            InputTarget::None => Vec::new(),
            InputTarget::Rank(r) => vec![r],
            InputTarget::All => (0..ntasks).collect(),
        });
    }

    /// A rank took its input up to `upto`.
    pub fn taken(&mut self, rank: u32, upto: u64) {
        let t = self.taken.entry(rank).or_default();
        *t = (*t).max(upto);
        let Some(ranks) = &self.ranks else { return };
        let least = ranks
            .iter()
            .map(|r| self.taken.get(r).copied().unwrap_or(0))
            .min()
            .unwrap_or(self.sent)
            .min(self.sent);
        if least > self.acked {
            self.unacked.drain(..(least - self.acked) as usize);
            self.acked = least;
            // Progress: the wait before a repeat starts again.
            self.resend_wait = FIRST_RESEND;
            self.resend_at = None;
        }
    }

    /// Whether every rank that gets the input took its end ([`INPUT_END`]).
    fn end_taken(&self) -> bool {
        self.ranks
            .as_ref()
            .is_some_and(|ranks| ranks.iter().all(|r| self.taken.get(r) == Some(&INPUT_END)))
    }

    /// The pieces to wait on: only while there is room to send one.
    pub fn waiting_on(&self) -> Option<&Receiver<Piece>> {
        (self.ranks.is_some() && !self.at_end && self.next.is_none() && !self.requeued)
            .then_some(&self.pieces)
    }

    /// Takes a piece that arrived while waiting (see [`InputSender::waiting_on`]).
    pub fn arrived(&mut self, piece: Piece) {
        match piece {
            Some(data) => self.next = Some(data),
            None => self.at_end = true,
        }
    }

    /// Sends what the window allows; `send` puts a request on the connection.
    pub fn pump(&mut self, send: impl FnMut(&Request)) {
        self.pump_at(Instant::now(), send)
    }

    /// [`InputSender::pump`] at time `now`: also sends the unacknowledged input again when
    /// its acknowledgement is overdue.
    pub fn pump_at(&mut self, now: Instant, mut send: impl FnMut(&Request)) {
        let Some(job) = self.job.filter(|_| self.ranks.is_some()) else {
            return;
        };
        // Bytes not acknowledged, or an end the ranks have not acknowledged taking.
        let waiting = self.sent > self.acked || (self.end_sent && !self.end_taken());
        match self.resend_at {
            Some(at) if waiting && !self.requeued && now >= at => {
                self.send_unacknowledged(job, &mut send);
                self.resend_wait = (self.resend_wait * 2).min(LAST_RESEND);
                self.resend_at = Some(now + self.resend_wait);
            }
            None if waiting => self.resend_at = Some(now + self.resend_wait),
            _ => {}
        }
        if self.requeued {
            if !self.end_sent {
                send(&Request::Input {
                    job,
                    offset: 0,
                    data: Vec::new(),
                    eof: true,
                });
                self.end_sent = true;
            }
            return;
        }
        loop {
            if self.next.is_none() && !self.at_end {
                match self.pieces.try_recv() {
                    Ok(p) => self.arrived(p),
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => self.at_end = true,
                }
            }
            let Some(data) = self.next.take() else { break };
            if self.sent - self.acked + data.len() as u64 > INPUT_WINDOW {
                self.next = Some(data);
                return;
            }
            send(&Request::Input {
                job,
                offset: self.sent,
                data: data.clone(),
                eof: false,
            });
            self.sent += data.len() as u64;
            self.unacked.extend(data);
            self.resend_at.get_or_insert(now + self.resend_wait);
        }
        if self.at_end && !self.end_sent {
            send(&Request::Input {
                job,
                offset: self.sent,
                data: Vec::new(),
                eof: true,
            });
            self.end_sent = true;
        }
    }

    /// A new connection to a restarted MM: what was not acknowledged goes again.
    pub fn reconnected(&mut self, mut send: impl FnMut(&Request)) {
        let Some(job) = self.job else { return };
        if self.requeued {
            self.end_sent = false;
            return;
        }
        self.send_unacknowledged(job, &mut send);
    }

    /// Sends again, from the acknowledged offset, what was sent and not acknowledged, and
    /// the end of the stream if it went out.
    fn send_unacknowledged(&self, job: JobId, send: &mut impl FnMut(&Request)) {
        let bytes: Vec<u8> = self.unacked.iter().copied().collect();
        let mut offset = self.acked;
        for piece in bytes.chunks(MAX_INPUT_CHUNK) {
            send(&Request::Input {
                job,
                offset,
                data: piece.to_vec(),
                eof: false,
            });
            offset += piece.len() as u64;
        }
        if self.end_sent {
            send(&Request::Input {
                job,
                offset,
                data: Vec::new(),
                eof: true,
            });
        }
    }

    /// The job went back to the queue: its next run reads an empty input. Whether any was
    /// read by the run that ended (for the user's notice).
    pub fn requeue(&mut self) -> bool {
        let had = self.sent > 0;
        self.requeued = true;
        self.end_sent = false;
        self.ranks = None;
        had
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(pieces: Vec<Piece>) -> InputSender {
        let (tx, rx) = crossbeam_channel::unbounded();
        for p in pieces {
            tx.send(p).unwrap();
        }
        InputSender::new(rx, InputTarget::Rank(0))
    }

    fn sent(s: &mut InputSender) -> Vec<(u64, usize, bool)> {
        let mut out = Vec::new();
        s.pump(|r| {
            if let Request::Input {
                offset, data, eof, ..
            } = r
            {
                out.push((*offset, data.len(), *eof));
            }
        });
        out
    }

    #[test]
    fn nothing_goes_before_the_job_starts_and_the_window_holds_the_rest() {
        let piece = vec![7u8; MAX_INPUT_CHUNK];
        let mut s = sender(
            vec![Some(piece.clone()); 6]
                .into_iter()
                .chain([None])
                .collect(),
        );
        assert!(sent(&mut s).is_empty(), "not started");
        s.started(1, 4);
        let first = sent(&mut s);
        // 64 KiB of window: four pieces of 16 KiB.
        assert_eq!(first.len(), 4, "{first:?}");
        assert_eq!(first[3].0, 3 * MAX_INPUT_CHUNK as u64);
        assert!(sent(&mut s).is_empty(), "window full");
        // Another rank's acknowledgement does not count for -i 0.
        s.taken(1, 4 * MAX_INPUT_CHUNK as u64);
        assert!(sent(&mut s).is_empty());
        s.taken(0, 2 * MAX_INPUT_CHUNK as u64);
        let more = sent(&mut s);
        assert_eq!(more.len(), 3, "two pieces and the end: {more:?}");
        assert_eq!(more[2], (6 * MAX_INPUT_CHUNK as u64, 0, true));
    }

    #[test]
    fn after_a_reconnect_the_unacknowledged_bytes_go_again_from_the_acknowledged_offset() {
        let mut s = sender(vec![
            Some(b"hello ".to_vec()),
            Some(b"world".to_vec()),
            None,
        ]);
        s.started(3, 1);
        assert_eq!(sent(&mut s).len(), 3);
        s.taken(0, 4);
        let mut again = Vec::new();
        s.reconnected(|r| {
            if let Request::Input {
                offset, data, eof, ..
            } = r
            {
                again.push((*offset, data.clone(), *eof));
            }
        });
        assert_eq!(
            again,
            vec![(4, b"o world".to_vec(), false), (11, Vec::new(), true)]
        );
    }

    /// A piece a node never got (it missed that heartbeat) would hold the task's input for
    /// ever: with no acknowledgement for a while, the unacknowledged bytes go again, at
    /// doubling intervals, and progress starts the wait afresh.
    #[test]
    fn unacknowledged_input_goes_again_when_its_acknowledgement_is_overdue() {
        let mut s = sender(vec![Some(b"abc".to_vec()), Some(b"def".to_vec())]);
        s.started(1, 1);
        let t0 = Instant::now();
        let at = |s: &mut InputSender, after: Duration| {
            let mut out = Vec::new();
            s.pump_at(t0 + after, |r| {
                if let Request::Input { offset, data, .. } = r {
                    out.push((*offset, data.clone()));
                }
            });
            out
        };
        // Standard input ended after them: the two pieces and the end go.
        assert_eq!(at(&mut s, Duration::ZERO).len(), 3);
        assert!(
            at(&mut s, Duration::from_secs(1)).is_empty(),
            "not overdue yet"
        );
        let again = at(&mut s, FIRST_RESEND + Duration::from_millis(1));
        assert_eq!(again, vec![(0, b"abcdef".to_vec()), (6, Vec::new())]);
        // The next repeat waits twice as long.
        assert!(at(&mut s, FIRST_RESEND * 2).is_empty());
        assert_eq!(at(&mut s, FIRST_RESEND * 4).len(), 2);
        // Every byte taken, but not the end yet: the end alone goes again, a wait after.
        s.taken(0, 6);
        assert!(at(&mut s, FIRST_RESEND * 20).is_empty());
        assert_eq!(
            at(&mut s, FIRST_RESEND * 21 + Duration::from_millis(1)),
            vec![(6, Vec::new())]
        );
        // The end taken too: nothing goes again.
        s.taken(0, INPUT_END);
        assert!(at(&mut s, FIRST_RESEND * 100).is_empty());
    }

    /// The end of the input, on its own, lost on its way (the node missed that heartbeat):
    /// the task would wait for end of file for ever. It goes again until the rank says it
    /// took it.
    #[test]
    fn an_end_of_input_that_was_not_acknowledged_goes_again() {
        let mut s = sender(vec![Some(b"abc".to_vec()), None]);
        s.started(1, 1);
        let t0 = Instant::now();
        let at = |s: &mut InputSender, after: Duration| {
            let mut out = Vec::new();
            s.pump_at(t0 + after, |r| {
                if let Request::Input {
                    offset, data, eof, ..
                } = r
                {
                    out.push((*offset, data.len(), *eof));
                }
            });
            out
        };
        assert_eq!(
            at(&mut s, Duration::ZERO),
            vec![(0, 3, false), (3, 0, true)]
        );
        // The bytes arrived and were taken; the end did not arrive.
        s.taken(0, 3);
        assert!(at(&mut s, Duration::from_secs(1)).is_empty());
        let again = at(
            &mut s,
            Duration::from_secs(1) + FIRST_RESEND + Duration::from_millis(1),
        );
        assert_eq!(again, vec![(3, 0, true)]);
        s.taken(0, INPUT_END);
        assert!(at(&mut s, FIRST_RESEND * 100).is_empty());
    }

    #[test]
    fn with_all_ranks_the_slowest_rank_holds_the_window() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut s = InputSender::new(rx, InputTarget::All);
        for _ in 0..5 {
            tx.send(Some(vec![1u8; MAX_INPUT_CHUNK])).unwrap();
        }
        s.started(1, 2);
        assert_eq!(sent(&mut s).len(), 4);
        s.taken(0, 4 * MAX_INPUT_CHUNK as u64);
        assert!(sent(&mut s).is_empty(), "rank 1 took nothing yet");
        s.taken(1, MAX_INPUT_CHUNK as u64);
        assert_eq!(sent(&mut s).len(), 1);
    }
}
