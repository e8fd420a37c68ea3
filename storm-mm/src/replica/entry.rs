//! What the replicated log holds: the journal's commits, each cut into parts that fit a
//! mailbox slot.
//!
//! The leader's MM core commits its journal once per timeslice ([`Batch`]); the leader
//! proposes each as one or more [`Part`]s, and every replica applies each committed part to
//! its own journal store. A batch is settled (its replies and launches go out) once its last
//! part is applied on the leader, which happens only after a majority holds every part.
//! Changes are whole records, so a part applied twice (a replica replaying its log after a
//! restart) leaves the journal as it was.

use serde::{Deserialize, Serialize};
use storm_cluster::messages::JobId;

use crate::journal::{Batch, Change};

/// What marks a journal commit's part in the log (Raft's entry context): the journal's format,
/// so that a replica never reads a part written in another (bincode's records carry no
/// version of their own, and one format's bytes can decode as another's, wrongly).
pub const CONTEXT: &[u8] = b"journal-20";

/// Why a journal commit's part of an older mark (none until the journal's format 14) does not
/// decode.
pub const OLDER_FORMAT: &str = "a journal commit written by a storm-mm of journal format 19 \
     or older; upgrade a group's replicas together, once every entry is applied (see \
     docs/operations.md)";

/// One part of a journal commit, as the log holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// The commit's number in the leader process that made it.
    pub batch: u64,
    /// Whether this is the commit's last part.
    pub last: bool,
    pub changes: Vec<Change>,
    pub next_job: Option<JobId>,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(v, bincode::config::standard())
        .expect("journal changes always encode")
}

/// `batch` as parts of about `limit` encoded bytes each (a single change larger than that
/// goes alone), encoded. The next job id goes with the last part.
pub fn split(batch: &Batch, limit: usize) -> Vec<Vec<u8>> {
    let mut parts: Vec<Vec<Change>> = vec![Vec::new()];
    let mut size = 0;
    for change in &batch.changes {
        let len = encode(change).len();
        if size > 0 && size + len > limit {
            parts.push(Vec::new());
            size = 0;
        }
        size += len;
        parts
            .last_mut()
            .expect("one part at least")
            .push(change.clone());
    }
    let count = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, changes)| {
            let last = i + 1 == count;
            encode(&Part {
                batch: batch.number,
                last,
                changes,
                next_job: if last { batch.next_job } else { None },
            })
        })
        .collect()
}

/// A part read back from the log; the error says why it does not decode.
pub fn decode(bytes: &[u8]) -> Result<Part, String> {
    storm_primitives::codec::decode(bytes)
        .map(|(p, _)| p)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::NodeRecord;

    fn batch(n: usize) -> Batch {
        Batch {
            number: 7,
            changes: (0..n)
                .map(|i| Change::Node(i as u32, NodeRecord::default()))
                .chain([Change::RemoveJob(3)])
                .collect(),
            next_job: Some(42),
            unneeded: vec![],
        }
    }

    #[test]
    fn a_batch_cut_into_parts_comes_back_whole_with_its_next_job_id_last() {
        let b = batch(100);
        let parts: Vec<Part> = split(&b, 64).iter().map(|p| decode(p).unwrap()).collect();
        assert!(parts.len() > 1, "a small limit cuts the batch");
        let changes: Vec<Change> = parts.iter().flat_map(|p| p.changes.clone()).collect();
        assert_eq!(changes, b.changes);
        assert!(parts.iter().all(|p| p.batch == 7));
        let (last, rest) = parts.split_last().unwrap();
        assert!(last.last && last.next_job == Some(42));
        assert!(rest.iter().all(|p| !p.last && p.next_job.is_none()));
    }

    #[test]
    fn the_mark_of_a_part_names_the_journals_format() {
        assert_eq!(
            CONTEXT,
            format!("journal-{}", crate::journal::FORMAT).as_bytes()
        );
    }

    #[test]
    fn an_empty_batch_is_one_part_and_garbage_is_an_error() {
        let b = Batch {
            number: 1,
            changes: vec![],
            next_job: Some(2),
            unneeded: vec![],
        };
        assert_eq!(split(&b, 1024).len(), 1);
        assert!(decode(&[0xff; 9]).is_err());
    }
}
