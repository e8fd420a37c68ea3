//! What replicas say to each other in their mailboxes ([`Wire`]): Raft's messages, and the
//! transfer of a whole state to a replica that diverged ([`super::checksum`]).
//!
//! A replica that diverged asks the leader for its state ([`Want`]); the leader hashes and
//! encodes its journal as it stands after the last entry it applied (an [`Image`]) and sends
//! it back in [`Part`]s of at most a mailbox slot, one for each [`Want`], so the transfer goes
//! at the pace of the receiver and a lost message only costs a request again ([`Fetch`]).
//! The receiver checks the image's hash before it takes it; it replaces its journal with it
//! once it has applied the log as far as the image, then applies again, from its own log,
//! what it applied beyond (whole records, so the journal ends as the log says).

use std::time::Instant;

use raft::eraftpb::Message;
use serde::{Deserialize, Serialize};

use super::checksum::{Digest, digest};
use crate::journal::Restored;
use storm_cluster::messages::JobId;

/// The largest state a replica takes from another.
pub const MAX_IMAGE: u64 = 16 << 30;

const RAFT: u8 = 0;
const WANT: u8 = 1;
const PART: u8 = 2;
const JOIN: u8 = 3;
const WELCOME: u8 = 4;
const WANT_COPY: u8 = 5;
const COPY_PART: u8 = 6;

/// A message between replicas, as a mailbox slot holds it: a tag byte, then the message.
#[derive(Debug)]
pub enum Wire {
    Raft(Message),
    Want(Want),
    Part(Part),
    /// A replica without a place in the group (started with `--join` on an empty state
    /// directory) asks to be taken in ([`super::member`]).
    Join,
    /// The leader's answer to [`Wire::Join`], or to a message from a Raft id that is no
    /// member.
    Welcome(super::member::Welcome),
    /// A request for a part of a program copy too large for the log ([`super::program`]).
    WantCopy(super::program::WantCopy),
    /// The answer: a part of the copy.
    CopyPart(super::program::Chunk),
}

impl Wire {
    /// What `bytes` hold; the error says what does not decode.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        use protobuf::Message as _;
        let (&tag, body) = bytes.split_first().ok_or("an empty replica message")?;
        match tag {
            RAFT => Message::parse_from_bytes(body)
                .map(Wire::Raft)
                .map_err(|e| format!("a Raft message does not decode: {e}")),
            WANT => Want::decode(body).map(Wire::Want),
            PART => Part::decode(body).map(Wire::Part),
            JOIN if body.is_empty() => Ok(Wire::Join),
            JOIN => Err(format!(
                "a request to join with {} bytes after it",
                body.len()
            )),
            WELCOME => super::member::Welcome::decode(body).map(Wire::Welcome),
            WANT_COPY => super::program::WantCopy::decode(body).map(Wire::WantCopy),
            COPY_PART => super::program::Chunk::decode(body).map(Wire::CopyPart),
            other => Err(format!("a replica message of unknown kind {other}")),
        }
    }

    /// Raft's message `msg` as a mailbox holds it.
    pub fn raft(msg: &Message) -> Result<Vec<u8>, String> {
        use protobuf::Message as _;
        let mut out = vec![RAFT];
        msg.write_to_vec(&mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// A request to join, as a mailbox holds it.
    pub fn join() -> Vec<u8> {
        vec![JOIN]
    }

    /// A request for a part of a program copy, as a mailbox holds it.
    pub fn want_copy(want: &super::program::WantCopy) -> Vec<u8> {
        let mut out = vec![WANT_COPY];
        out.extend(want.encode());
        out
    }

    /// A part of a program copy, as a mailbox holds it.
    pub fn copy_part(chunk: &super::program::Chunk) -> Vec<u8> {
        let mut out = vec![COPY_PART];
        out.extend(chunk.encode());
        out
    }

    /// An answer to a join, as a mailbox holds it.
    pub fn welcome(welcome: &super::member::Welcome) -> Result<Vec<u8>, String> {
        let mut out = vec![WELCOME];
        out.extend(welcome.encode()?);
        Ok(out)
    }
}

fn words<const N: usize>(body: &[u8], what: &str) -> Result<[u64; N], String> {
    if body.len() < N * 8 {
        return Err(format!(
            "{what} of {} bytes is shorter than its header",
            body.len()
        ));
    }
    Ok(std::array::from_fn(|i| {
        u64::from_le_bytes(body[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }))
}

/// "Send me your state from `offset` on": `id` names the image being sent (0: any, the
/// first request of a transfer); the image must be as of entry `at_least` or later (the
/// receiver's log may start there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub id: u64,
    pub offset: u64,
    pub at_least: u64,
}

impl Want {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![WANT];
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.at_least.to_le_bytes());
        out
    }

    fn decode(body: &[u8]) -> Result<Self, String> {
        if body.len() != 24 {
            return Err(format!("a state request has {} bytes, not 24", body.len()));
        }
        let [id, offset, at_least] = words::<3>(body, "a state request")?;
        Ok(Self {
            id,
            offset,
            at_least,
        })
    }
}

/// `bytes` at `offset` of image `id`, which is `total` bytes long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub id: u64,
    pub total: u64,
    pub offset: u64,
    pub bytes: Vec<u8>,
}

impl Part {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(25 + self.bytes.len());
        out.push(PART);
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.total.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        out
    }

    fn decode(body: &[u8]) -> Result<Self, String> {
        let [id, total, offset] = words::<3>(body, "a part of a state")?;
        let bytes = body[24..].to_vec();
        if offset
            .checked_add(bytes.len() as u64)
            .is_none_or(|end| end > total)
        {
            return Err(format!(
                "a part of a state ({} bytes at {offset}) passes its size {total}",
                bytes.len()
            ));
        }
        Ok(Self {
            id,
            total,
            offset,
            bytes,
        })
    }
}

/// A replica's whole state after applying log entry `index`, with its hash, and the program
/// copies of the jobs that wait (which the replica would need to start them if it led).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Image {
    pub index: u64,
    pub digest: Digest,
    pub state: Restored,
    pub programs: Vec<(JobId, Vec<u8>)>,
}

impl Image {
    pub fn new(index: u64, state: Restored) -> Self {
        Self {
            index,
            digest: digest(&state),
            state,
            programs: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .expect("a journal's state always encodes")
    }

    /// An image received whole; refused if it does not decode or its state is not the one its
    /// sender hashed.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (image, used): (Self, usize) =
            bincode::serde::decode_from_slice(bytes, bincode::config::standard())
                .map_err(|e| format!("a replica's state does not decode: {e}"))?;
        if used != bytes.len() {
            return Err("a replica's state has bytes after its end".into());
        }
        if digest(&image.state) != image.digest {
            return Err("a replica's state is not the one its sender hashed".into());
        }
        Ok(image)
    }
}

/// An image a replica sends, kept while a receiver asks for its parts.
pub struct Offer {
    pub id: u64,
    /// The log entry the image is as of.
    pub index: u64,
    pub bytes: Vec<u8>,
    pub made: Instant,
    /// When a receiver last asked for a part of it.
    pub asked: Instant,
}

impl Offer {
    /// The part of this image from `offset` on, at most `limit` bytes.
    pub fn part(&self, offset: u64, limit: usize) -> Part {
        let start = (offset as usize).min(self.bytes.len());
        let end = (start + limit).min(self.bytes.len());
        Part {
            id: self.id,
            total: self.bytes.len() as u64,
            offset: start as u64,
            bytes: self.bytes[start..end].to_vec(),
        }
    }
}

/// A transfer under way to this replica, from replica `from`.
#[derive(Debug)]
pub struct Fetch {
    pub from: usize,
    /// The image must be as of this entry or later.
    at_least: u64,
    id: u64,
    bytes: Vec<u8>,
    pub asked: Instant,
}

impl Fetch {
    pub fn new(from: usize, at_least: u64) -> Self {
        Self {
            from,
            at_least,
            id: 0,
            bytes: Vec::new(),
            asked: Instant::now(),
        }
    }

    /// What to ask for next.
    pub fn want(&self) -> Want {
        Want {
            id: self.id,
            offset: self.bytes.len() as u64,
            at_least: self.at_least,
        }
    }

    /// Takes `part`: the image once it is whole (or why it is refused), else nothing. A first
    /// part of another image starts the transfer over with it; any other part out of order is
    /// dropped (the request goes again).
    pub fn take(&mut self, part: Part) -> Option<Result<Image, String>> {
        if part.total > MAX_IMAGE {
            return Some(Err(format!(
                "a state of {} bytes is larger than the {} GiB a replica takes",
                part.total,
                MAX_IMAGE >> 30
            )));
        }
        if part.offset == 0 && part.id != self.id {
            self.id = part.id;
            self.bytes.clear();
        }
        if part.id != self.id || part.offset != self.bytes.len() as u64 {
            return None;
        }
        self.bytes.extend_from_slice(&part.bytes);
        (self.bytes.len() as u64 == part.total).then(|| Image::decode(&self.bytes))
    }
}

/// Where a replica stands with its own state.
#[derive(Debug)]
pub enum Standing {
    /// Its state is taken to agree with the group's. `resynced_at`: the entry as of which it
    /// last took another's state (verdicts on earlier windows are no news; 0: none since
    /// the last window that found it agreeing).
    InStep { resynced_at: u64 },
    /// It must take a good replica's state before it stands for election again.
    Taking(Taking),
}

/// Why a replica takes another's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The comparison found its state diverged from the majority's.
    Diverged,
    /// Its journal is behind the log: it lacks entries the leader dropped.
    Behind,
}

/// A replica taking another's state: why, since when, from which entry on the state must be,
/// and how far the transfer is.
#[derive(Debug)]
pub struct Taking {
    pub why: Why,
    pub since: Instant,
    /// The state it takes must be as of this entry or later.
    pub at_least: u64,
    pub stage: Stage,
}

/// How far a replica is in taking a state.
#[derive(Debug)]
pub enum Stage {
    /// Nothing asked for yet (or the last transfer was refused).
    Idle,
    /// A transfer under way.
    Fetching(Fetch),
    /// The whole image, until this replica has applied the log as far.
    Holding(Image),
}

impl Standing {
    /// A replica that begins to take another's state.
    pub fn taking(why: Why, at_least: u64) -> Self {
        Standing::Taking(Taking {
            why,
            since: Instant::now(),
            at_least,
            stage: Stage::Idle,
        })
    }

    /// Whether this replica is taking another's state (and so is not elected meanwhile).
    pub fn is_taking(&self) -> bool {
        matches!(self, Standing::Taking(_))
    }

    /// The transfer under way, if it comes from replica `from`.
    pub fn fetch_from(&mut self, from: usize) -> Option<&mut Fetch> {
        match self {
            Standing::Taking(Taking {
                stage: Stage::Fetching(f),
                ..
            }) if f.from == from => Some(f),
            _ => None,
        }
    }

    /// How `storm managers` names it, if not by its Raft role.
    pub fn role(&self) -> Option<&'static str> {
        match self {
            Standing::InStep { .. } => None,
            Standing::Taking(Taking {
                why: Why::Behind, ..
            }) => Some("catching up"),
            Standing::Taking(Taking {
                why: Why::Diverged, ..
            }) => Some("diverged"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::NodeRecord;

    fn state() -> Restored {
        let mut s = Restored {
            next_job: 42,
            ..Default::default()
        };
        s.nodes.insert(
            3,
            NodeRecord {
                drain: Some("fan".into()),
                lent: None,
            },
        );
        s
    }

    #[test]
    fn an_image_goes_over_in_parts_and_arrives_whole() {
        let image = Image::new(17, state());
        let offer = Offer {
            id: 9,
            index: 17,
            bytes: image.encode(),
            made: Instant::now(),
            asked: Instant::now(),
        };
        let mut fetch = Fetch::new(0, 0);
        let mut got = None;
        for _ in 0..offer.bytes.len() {
            let want = fetch.want();
            let part = offer.part(want.offset, 5);
            // Through the wire, as a mailbox carries it.
            let Ok(Wire::Part(part)) = Wire::decode(&part.encode()) else {
                panic!("a part reads back");
            };
            if let Some(done) = fetch.take(part) {
                got = Some(done.unwrap());
                break;
            }
        }
        assert_eq!(got, Some(image));
    }

    #[test]
    fn a_part_out_of_order_is_dropped_and_a_new_image_starts_over() {
        let a = Offer {
            id: 1,
            index: 1,
            bytes: Image::new(1, state()).encode(),
            made: Instant::now(),
            asked: Instant::now(),
        };
        let b = Offer {
            id: 2,
            index: 2,
            bytes: Image::new(2, Restored::default()).encode(),
            made: Instant::now(),
            asked: Instant::now(),
        };
        let mut fetch = Fetch::new(0, 0);
        assert!(fetch.take(a.part(0, 4)).is_none());
        assert!(fetch.take(a.part(8, 4)).is_none(), "a gap");
        assert_eq!(
            fetch.want(),
            Want {
                id: 1,
                offset: 4,
                at_least: 0
            }
        );
        // The sender made another image meanwhile: its first part starts over.
        let done = fetch.take(b.part(0, 1 << 20)).expect("whole in one part");
        assert_eq!(done.unwrap().index, 2);
    }

    #[test]
    fn an_image_carries_the_program_copies_of_waiting_jobs() {
        let mut image = Image::new(3, state());
        image.programs = vec![(7, b"#!/bin/sh\necho waited\n".to_vec())];
        let back = Image::decode(&image.encode()).unwrap();
        assert_eq!(back.programs, image.programs);
    }

    #[test]
    fn an_image_whose_state_is_not_what_was_hashed_is_refused() {
        let mut image = Image::new(5, state());
        image.state.next_job = 43;
        let err = Image::decode(&image.encode()).unwrap_err();
        assert!(err.contains("not the one its sender hashed"), "{err}");
    }

    #[test]
    fn malformed_messages_name_what_is_wrong() {
        assert!(Wire::decode(&[]).unwrap_err().contains("empty"));
        assert!(Wire::decode(&[7]).unwrap_err().contains("unknown kind 7"));
        assert!(Wire::decode(&[WANT, 1, 2]).unwrap_err().contains("not 24"));
        let mut part = Part {
            id: 1,
            total: 2,
            offset: 0,
            bytes: vec![1, 2, 3],
        }
        .encode();
        assert!(Wire::decode(&part).unwrap_err().contains("passes its size"));
        part.truncate(10);
        assert!(Wire::decode(&part).unwrap_err().contains("shorter"));
    }
}
