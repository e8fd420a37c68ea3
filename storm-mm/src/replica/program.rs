//! Program copies through the replicated log: the program of a job that a next leader may
//! have to run from its beginning (it waits, or it got its nodes but its launch is not out
//! yet, or it may be requeued: `JobRecord::needs_program_copy`), which the leader copied
//! beside its journal (`programs/`), travels to every replica before the job's record does,
//! so that whichever replica leads next can send it.
//!
//! The leader reads its copy when it proposes the batch that first records the job, and
//! proposes it ahead of that batch as entries marked [`CONTEXT`] (Raft's entry
//! context), each a [`Chunk`] of at most a log part. The log keeps its order: a replica that
//! holds the job's record holds every chunk before it. Each replica writes the chunks to a
//! file aside and renames it into place with the last one, as the leader's own copy is made.
//! A program larger than [`MAX_REPLICATED`] would take that much of every replica's log in
//! memory: the log carries only a note that the copy exists ([`Far`], marked
//! [`FAR_CONTEXT`]), and each replica that applies it fetches the copy from the leader beside
//! the log, a [`Chunk`] at a time, by asking for it ([`WantCopy`]; `super::copies`).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;

use storm_cluster::messages::JobId;

/// The entry context that marks a chunk of a program copy.
pub const CONTEXT: &[u8] = b"program";

/// The largest program copy that goes through the log.
pub const MAX_REPLICATED: u64 = 64 << 20;

/// The entry context that marks a note of a program copy too large for the log ([`Far`]).
pub const FAR_CONTEXT: &[u8] = b"program-far";

/// Job `job` has a program copy of `total` bytes, larger than [`MAX_REPLICATED`]: a replica
/// fetches it from the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Far {
    pub job: JobId,
    pub total: u64,
}

impl Far {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.job.to_le_bytes().to_vec();
        out.extend_from_slice(&self.total.to_le_bytes());
        out
    }

    pub fn decode(data: &[u8]) -> Result<Self, String> {
        let words: [u8; 16] = data
            .try_into()
            .map_err(|_| format!("a note of a program copy has {} bytes, not 16", data.len()))?;
        let word = |i: usize| u64::from_le_bytes(words[i * 8..i * 8 + 8].try_into().expect("8"));
        Ok(Self {
            job: word(0),
            total: word(1),
        })
    }
}

/// "Send me job `job`'s program copy from `offset` on" (one [`Chunk`] in answer; a chunk of
/// size 0 says the replica asked holds no copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WantCopy {
    pub job: JobId,
    pub offset: u64,
}

impl WantCopy {
    pub fn encode(&self) -> Vec<u8> {
        Far {
            job: self.job,
            total: self.offset,
        }
        .encode()
    }

    pub fn decode(data: &[u8]) -> Result<Self, String> {
        let far = Far::decode(data).map_err(|_| {
            format!(
                "a request for a program copy has {} bytes, not 16",
                data.len()
            )
        })?;
        Ok(Self {
            job: far.job,
            offset: far.total,
        })
    }
}

/// One chunk of job `job`'s program copy: `bytes` at `offset` of `total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub job: JobId,
    pub offset: u64,
    pub total: u64,
    pub bytes: Vec<u8>,
}

const HEADER: usize = 24;

impl Chunk {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.bytes.len());
        out.extend_from_slice(&self.job.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.total.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        out
    }

    /// A chunk read back from the log; the error says what is wrong with it.
    pub fn decode(data: &[u8]) -> Result<Self, String> {
        if data.len() < HEADER {
            return Err(format!(
                "a program chunk of {} bytes is shorter than its header",
                data.len()
            ));
        }
        let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
        let (job, offset, total) = (word(0), word(1), word(2));
        let bytes = data[HEADER..].to_vec();
        if offset
            .checked_add(bytes.len() as u64)
            .is_none_or(|end| end > total)
        {
            return Err(format!(
                "a chunk of job {job}'s program ({} bytes at {offset}) passes its size {total}",
                bytes.len()
            ));
        }
        Ok(Self {
            job,
            offset,
            total,
            bytes,
        })
    }

    /// Whether this chunk completes the copy.
    pub fn is_last(&self) -> bool {
        self.offset + self.bytes.len() as u64 == self.total
    }
}

/// `program` (job `job`'s copy, `total` bytes) cut into chunks of at most `limit` bytes.
pub fn chunks(job: JobId, program: &[u8], limit: usize) -> Vec<Chunk> {
    let total = program.len() as u64;
    if program.is_empty() {
        return vec![Chunk {
            job,
            offset: 0,
            total,
            bytes: Vec::new(),
        }];
    }
    program
        .chunks(limit.max(1))
        .scan(0u64, |offset, bytes| {
            let c = Chunk {
                job,
                offset: *offset,
                total,
                bytes: bytes.to_vec(),
            };
            *offset += bytes.len() as u64;
            Some(c)
        })
        .collect()
}

/// The copies a replica is receiving: the file aside of each, while its chunks arrive.
#[derive(Default)]
pub struct Receiving {
    files: HashMap<JobId, (File, u64)>,
}

impl Receiving {
    /// Writes `chunk` into its copy in `store` (a first chunk starts it; the last syncs it and
    /// renames it into place). A replica that already holds the whole copy (the leader that
    /// made it, or one that applies its log again) skips it; so does one that missed the
    /// copy's start (it restarted in the middle), saying so.
    pub fn take(
        &mut self,
        store: &crate::journal::ProgramStore,
        chunk: Chunk,
    ) -> std::io::Result<()> {
        if chunk.offset == 0 {
            if store.open(chunk.job).is_some() {
                return Ok(());
            }
            self.files.remove(&chunk.job);
            let file = store.create_partial(chunk.job)?;
            self.files.insert(chunk.job, (file, 0));
        }
        let Some((file, at)) = self.files.get_mut(&chunk.job) else {
            if store.open(chunk.job).is_none() {
                tracing::warn!(
                    job = chunk.job,
                    "a chunk of a program copy whose start this replica did not apply: the \
                     copy is not kept here"
                );
            }
            return Ok(());
        };
        if *at != chunk.offset {
            let expected = *at;
            self.files.remove(&chunk.job);
            return Err(std::io::Error::other(format!(
                "job {}'s program copy: a chunk at {} where {expected} was expected",
                chunk.job, chunk.offset
            )));
        }
        file.write_all(&chunk.bytes)?;
        *at += chunk.bytes.len() as u64;
        if chunk.is_last() {
            let (file, _) = self.files.remove(&chunk.job).expect("looked up above");
            file.sync_all()?;
            store.complete_partial(chunk.job)?;
        }
        Ok(())
    }

    /// Job `job`'s copy is needed no more (its job ended while it arrived): the part written
    /// aside is deleted.
    pub fn abandon(&mut self, store: &crate::journal::ProgramStore, job: JobId) {
        if self.files.remove(&job).is_some() {
            store.remove_partial(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_goes_in_chunks_that_decode_to_what_was_cut() {
        let program: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let parts = chunks(7, &program, 300);
        assert_eq!(parts.len(), 4);
        assert!(parts[3].is_last() && !parts[2].is_last());
        let mut whole = Vec::new();
        for c in &parts {
            let back = Chunk::decode(&c.encode()).unwrap();
            assert_eq!(&back, c);
            whole.extend(back.bytes);
        }
        assert_eq!(whole, program);
        assert!(chunks(8, &[], 300)[0].is_last());
    }

    #[test]
    fn notes_and_requests_of_far_copies_read_back_and_a_cut_one_is_an_error() {
        let far = Far {
            job: 12,
            total: 100 << 20,
        };
        assert_eq!(Far::decode(&far.encode()).unwrap(), far);
        let want = WantCopy {
            job: 12,
            offset: 256 << 10,
        };
        assert_eq!(WantCopy::decode(&want.encode()).unwrap(), want);
        assert!(Far::decode(&far.encode()[..15]).is_err());
        assert!(WantCopy::decode(&[0; 17]).is_err());
    }

    /// A copy whose job ended while it arrived leaves nothing behind: the part written aside
    /// is deleted, and a whole copy arriving later is still kept.
    #[test]
    fn an_abandoned_copy_leaves_no_part_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = crate::journal::Journal::open(&dir.path().join("state")).unwrap();
        let store = journal.program_store().unwrap();
        let programs = dir.path().join("state/programs");
        let parts = chunks(4, &[9; 1000], 300);
        let mut receiving = Receiving::default();
        receiving.take(&store, parts[0].clone()).unwrap();
        assert!(programs.join("job-4.partial").exists());
        receiving.abandon(&store, 4);
        assert!(!programs.join("job-4.partial").exists());
        assert!(store.open(4).is_none());
        for part in chunks(5, &[1; 10], 300) {
            receiving.take(&store, part).unwrap();
        }
        receiving.abandon(&store, 5);
        assert!(store.open(5).is_some(), "a whole copy is not abandoned");
    }

    #[test]
    fn a_chunk_that_lies_about_its_place_is_refused() {
        let mut c = chunks(7, &[1, 2, 3], 2)[1].encode();
        assert!(Chunk::decode(&c[..10]).unwrap_err().contains("shorter"));
        // Its size says 3, its offset 2, and it carries 1 byte: now say the size is 2.
        c[16..24].copy_from_slice(&2u64.to_le_bytes());
        assert!(Chunk::decode(&c).unwrap_err().contains("passes its size"));
    }
}
