//! storm-submit's standard input, from its connection to the nodes of the ranks that read it
//! (`-i`; rank 0 by default).
//!
//! storm-submit sends its input as [`Request::Input`] pieces, each with its offset in the
//! stream, and no further than [`INPUT_WINDOW`] bytes past what the tasks acknowledged
//! ([`Stream::InputTaken`] chunks, which come back with the output). The MM passes each piece
//! on as a [`Command::Input`] in the heartbeats, behind the job's launch: pieces that come
//! before the launch went out are held until it does. It keeps no input of its own once
//! passed on; after an MM restart storm-submit sends again what was not acknowledged, and the
//! nodes keep each byte once.
//!
//! **No user can stall the heartbeat with input.** The window bounds what a job may have
//! waiting in the heartbeat's commands (and held before its launch): a piece beyond it is
//! dropped, which only a client that ignores the acknowledgements ever sees.
//!
//! A flocked job's input goes to its peer instead: held for the peer agent, which takes it
//! with the job's order (`FlockOut`), each piece once; the tasks' acknowledgements come home
//! with the job's output.
//!
//! [`Request::Input`]: storm_cluster::control::Request::Input
//! [`Stream::InputTaken`]: storm_cluster::messages::Stream::InputTaken

use storm_cluster::flock::InputPiece;
use storm_cluster::messages::{Command, INPUT_WINDOW, InputTarget, JobId, MAX_INPUT_CHUNK};
use storm_cluster::tasks::node_of_rank;
use storm_primitives::NodeSet;

use super::job::tasks_launched;
use super::{ClientId, MachineManager, MmEnv, Phase};

/// A piece of input waiting for its job's launch: offset, bytes, end of stream.
pub(super) type HeldInput = (u64, Vec<u8>, bool);

impl<E: MmEnv> MachineManager<E> {
    /// A piece of `client`'s standard input for `job`.
    pub(super) fn input(
        &mut self,
        client: ClientId,
        job: JobId,
        offset: u64,
        data: Vec<u8>,
        eof: bool,
    ) -> Result<(), String> {
        if data.len() > MAX_INPUT_CHUNK {
            return Err(format!(
                "a piece of standard input of {} bytes is over the limit of {MAX_INPUT_CHUNK}",
                data.len()
            ));
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            // It ended: nobody reads its input any more.
            return Ok(());
        };
        if j.client != Some(client) || j.req.input == InputTarget::None {
            return Ok(());
        }
        if let Some(f) = &mut j.flocked {
            // Its peer runs it: the piece goes there through the peer agent, bounded by the
            // window (storm-submit sends none before it hears of the job's start).
            let held: usize = f.input.iter().map(|p| p.data.len()).sum();
            if held + data.len() <= INPUT_WINDOW as usize {
                f.input.push(InputPiece { offset, data, eof });
            }
            return Ok(());
        }
        let launched = matches!(
            j.phase,
            Phase::Launching | Phase::Running | Phase::Recovering
        );
        if !launched {
            // Held for the launch (the queue, a transfer, the journal); bounded by the window.
            let held: usize = j.held_input.iter().map(|(_, d, _)| d.len()).sum();
            if j.phase != Phase::Queued && held + data.len() <= INPUT_WINDOW as usize {
                j.held_input.push((offset, data, eof));
            }
            return Ok(());
        }
        let queued: usize = self
            .hb
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::Input { job: j, data, .. } if *j == job => Some(data.len()),
                _ => None,
            })
            .sum();
        if queued + data.len() > INPUT_WINDOW as usize {
            tracing::debug!(job, "dropping input beyond the window");
            return Ok(());
        }
        self.send_input(job, offset, data, eof);
        Ok(())
    }

    /// The job's launch went out: the input held for it follows.
    pub(super) fn release_held_input(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        for (offset, data, eof) in std::mem::take(&mut j.held_input) {
            self.send_input(job, offset, data, eof);
        }
    }

    /// Queues a piece for the nodes of the ranks that read the job's input, in pieces
    /// small enough for any heartbeat.
    fn send_input(&mut self, job: JobId, offset: u64, data: Vec<u8>, eof: bool) {
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let ntasks = tasks_launched(&j.req, &j.plan);
        let nnodes = j.nodes.len() as u32;
        let nodes: NodeSet = match j.req.input {
            InputTarget::None => return,
            InputTarget::All => j.nodes.clone(),
            InputTarget::Rank(rank) => node_of_rank(ntasks, nnodes, rank)
                .and_then(|k| j.nodes.iter().nth(k as usize))
                .into_iter()
                .collect(),
        };
        let piece = MAX_INPUT_CHUNK
            .min(self.cfg.cluster.heartbeat_bytes / 2)
            .max(1);
        // The end of the stream alone is one empty piece.
        let pieces: Vec<&[u8]> = if data.is_empty() {
            vec![&[]]
        } else {
            data.chunks(piece).collect()
        };
        let last = pieces.len() - 1;
        let mut at = offset;
        for (i, p) in pieces.into_iter().enumerate() {
            self.hb.commands.push_back(Command::Input {
                job,
                nodes: nodes.clone(),
                offset: at,
                data: p.to_vec(),
                eof: eof && i == last,
            });
            at += p.len() as u64;
        }
    }
}
