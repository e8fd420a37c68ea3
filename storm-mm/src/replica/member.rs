//! Who is in the manager group: the replicas' Raft ids, and how a replica with a new disk
//! joins the group in the place of a lost one.
//!
//! Each `[[manager]]` entry is a *position* in the group: a name, addresses, a mailbox in the
//! managers' fabric. The replica at a position has a Raft id that says both: its low 16 bits
//! are the position plus one, the rest its *generation*. A group starts with generation 0
//! (ids 1, 2, 3, as before membership could change). Raft may never count on a replica that
//! forgot what it acknowledged, so a replica whose disk was lost comes back as a new member
//! under a new id: the operator removes the old id (`storm managers remove NAME`, a Raft
//! configuration change), the replica is started on an empty state directory with `--join`
//! and asks the group to take it in ([`super::resync::Wire::Join`]); the leader adds it as a
//! learner of a new generation (the index of the log entry that adds it, so no id is ever
//! given twice), welcomes it with the group's configuration and the position of its own
//! journal ([`Welcome`]), and promotes it to a voter once its log holds everything committed.
//! A message from an id that is not a member is dropped, and its sender told so.

use raft::eraftpb::{ConfChange, ConfChangeSingle, ConfChangeV2, ConfState, Entry, EntryType};

/// Bits of a Raft id that hold the position (plus one).
const POSITION_BITS: u32 = 16;

/// The Raft id of the replica of `generation` at `position`.
pub fn raft_id(position: usize, generation: u64) -> u64 {
    (generation << POSITION_BITS) | (position as u64 + 1)
}

/// The position a Raft id names (`None`: it names none).
pub fn position_of(id: u64) -> Option<usize> {
    let low = id & ((1 << POSITION_BITS) - 1);
    (low > 0).then(|| low as usize - 1)
}

/// Every member of `conf`: voters (of either half of a joint configuration) and learners.
pub fn members(conf: &ConfState) -> impl Iterator<Item = u64> + '_ {
    conf.voters
        .iter()
        .chain(&conf.voters_outgoing)
        .chain(&conf.learners)
        .chain(&conf.learners_next)
        .copied()
}

/// Whether `id` is a member of `conf`.
pub fn is_member(conf: &ConfState, id: u64) -> bool {
    members(conf).any(|m| m == id)
}

/// Whether `id` votes in `conf` (in either half of a joint configuration).
pub fn is_voter(conf: &ConfState, id: u64) -> bool {
    conf.voters.contains(&id) || conf.voters_outgoing.contains(&id)
}

/// The member of `conf` at `position`, if any (the newest, should there be two while a
/// replacement is under way).
pub fn member_at(conf: &ConfState, position: usize) -> Option<u64> {
    members(conf)
        .filter(|&id| position_of(id) == Some(position))
        .max()
}

/// Whether the replicas `counted` make a majority of `conf`'s voters (of both halves of a
/// joint configuration).
pub fn has_quorum(conf: &ConfState, counted: impl Fn(u64) -> bool) -> bool {
    let majority =
        |voters: &[u64]| voters.iter().filter(|&&v| counted(v)).count() > voters.len() / 2;
    !conf.voters.is_empty()
        && majority(&conf.voters)
        && (conf.voters_outgoing.is_empty() || majority(&conf.voters_outgoing))
}

/// Whether `id` was a member once and is no more: it is none now, and the log entry that
/// would have added it (its generation) is applied here already. A member this replica has
/// not yet learnt of (a newer generation, added by an entry not applied here) is not.
pub fn was_removed(conf: &ConfState, id: u64, applied: u64) -> bool {
    !is_member(conf, id) && id >> POSITION_BITS <= applied
}

/// `conf` as the log shows it: `voters 1, 3, 2752514 (learner)`.
pub fn describe(conf: &ConfState, names: &[String]) -> String {
    let name = |id: u64| {
        position_of(id)
            .and_then(|p| names.get(p))
            .map_or_else(|| format!("id {id}"), |n| format!("{n} (id {id})"))
    };
    let mut parts: Vec<String> = conf.voters.iter().map(|&v| name(v)).collect();
    parts.extend(
        conf.learners
            .iter()
            .map(|&l| format!("{} learning", name(l))),
    );
    if !conf.voters_outgoing.is_empty() {
        let out: Vec<String> = conf.voters_outgoing.iter().map(|&v| name(v)).collect();
        parts.push(format!("(leaving {})", out.join(", ")));
    }
    parts.join(", ")
}

/// The change of the group's configuration log entry `e` holds, if it holds one; the error
/// says what does not decode.
pub fn conf_change(e: &Entry) -> Option<Result<ConfChangeV2, String>> {
    use protobuf::Message as _;
    match e.get_entry_type() {
        // A simple change, as raft-rs reads one of the first format.
        EntryType::EntryConfChange => Some(
            ConfChange::parse_from_bytes(&e.data)
                .map(|cc| {
                    let mut single = ConfChangeSingle::default();
                    single.set_change_type(cc.get_change_type());
                    single.node_id = cc.node_id;
                    let mut v2 = ConfChangeV2::default();
                    v2.mut_changes().push(single);
                    v2
                })
                .map_err(|err| err.to_string()),
        ),
        EntryType::EntryConfChangeV2 => {
            Some(ConfChangeV2::parse_from_bytes(&e.data).map_err(|err| err.to_string()))
        }
        EntryType::EntryNormal => None,
    }
}

/// The leader's answer to a replica that asks to join.
#[derive(Debug, Clone, PartialEq)]
pub enum Welcome {
    /// It is a member under `id`: its log starts after entry `index` of `term` (which every
    /// replica holds committed), where the group's configuration is `conf`; its journal then
    /// takes the leader's state as of `index` (`super::resync`).
    Admitted {
        id: u64,
        index: u64,
        term: u64,
        conf: ConfState,
    },
    /// Not (yet): why. `id` is the Raft id refused (0: a replica that has none yet); a
    /// replica under that id stops, since it is no member of the group.
    Refused { id: u64, why: String },
}

const ADMITTED: u8 = 1;
const REFUSED: u8 = 2;

impl Welcome {
    /// The message's body (after [`super::resync::Wire`]'s tag).
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        use protobuf::Message as _;
        let mut out = Vec::new();
        match self {
            Welcome::Admitted {
                id,
                index,
                term,
                conf,
            } => {
                out.push(ADMITTED);
                for word in [id, index, term] {
                    out.extend_from_slice(&word.to_le_bytes());
                }
                conf.write_to_vec(&mut out).map_err(|e| e.to_string())?;
            }
            Welcome::Refused { id, why } => {
                out.push(REFUSED);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(why.as_bytes());
            }
        }
        Ok(out)
    }

    /// What `body` holds; the error says what does not decode.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        use protobuf::Message as _;
        let (&kind, rest) = body.split_first().ok_or("an empty answer to a join")?;
        let word = |i: usize| -> Result<u64, String> {
            rest.get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| format!("an answer to a join of {} bytes is cut short", body.len()))
        };
        match kind {
            ADMITTED => {
                let (id, index, term) = (word(0)?, word(1)?, word(2)?);
                let conf = ConfState::parse_from_bytes(&rest[24..])
                    .map_err(|e| format!("the group's configuration does not decode: {e}"))?;
                if position_of(id).is_none() {
                    return Err(format!(
                        "an admission under Raft id {id}, which names no place"
                    ));
                }
                Ok(Welcome::Admitted {
                    id,
                    index,
                    term,
                    conf,
                })
            }
            REFUSED => Ok(Welcome::Refused {
                id: word(0)?,
                why: String::from_utf8_lossy(&rest[8..]).into_owned(),
            }),
            other => Err(format!("an answer to a join of unknown kind {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_position_in_every_generation_and_generation_zero_is_the_old_numbering() {
        assert_eq!(raft_id(0, 0), 1);
        assert_eq!(raft_id(2, 0), 3);
        for generation in [0, 1, 41, 1 << 40] {
            for position in [0, 1, 2, 6] {
                let id = raft_id(position, generation);
                assert_eq!(position_of(id), Some(position));
            }
        }
        assert_ne!(raft_id(2, 0), raft_id(2, 7));
        assert_eq!(position_of(1 << 16), None);
        assert_eq!(position_of(0), None);
    }

    #[test]
    fn the_member_at_a_position_is_the_newest_of_its_ids_whatever_its_role() {
        let mut conf = ConfState::from((vec![1, 2, raft_id(2, 9)], vec![]));
        assert_eq!(member_at(&conf, 2), Some(raft_id(2, 9)));
        conf.voters.retain(|&v| v != raft_id(2, 9));
        conf.learners.push(raft_id(2, 12));
        assert_eq!(member_at(&conf, 2), Some(raft_id(2, 12)));
        assert!(is_member(&conf, raft_id(2, 12)) && !is_voter(&conf, raft_id(2, 12)));
        assert!(!is_member(&conf, 3));
        assert_eq!(member_at(&conf, 5), None);
    }

    #[test]
    fn a_majority_counts_voters_only_and_both_halves_of_a_joint_configuration() {
        let conf = ConfState::from((vec![1, 2, 3], vec![raft_id(2, 50)]));
        assert!(has_quorum(&conf, |id| id == 1 || id == 2));
        assert!(!has_quorum(&conf, |id| id == 1 || id == raft_id(2, 50)));
        let two = ConfState::from((vec![1, 2], vec![]));
        assert!(!has_quorum(&two, |id| id == 1), "one of two is no majority");
        let mut joint = ConfState::from((vec![1, 2], vec![]));
        joint.voters_outgoing = vec![1, 2, 3];
        assert!(has_quorum(&joint, |id| id <= 2));
        assert!(!has_quorum(&joint, |id| id == 1 || id == 3));
        assert!(!has_quorum(&ConfState::default(), |_| true));
    }

    #[test]
    fn an_id_is_removed_once_its_addition_is_applied_and_it_is_no_member() {
        let conf = ConfState::from((vec![1, 2], vec![]));
        assert!(
            was_removed(&conf, 3, 0),
            "the first generation was there from the start"
        );
        let newer = raft_id(2, 80);
        assert!(
            !was_removed(&conf, newer, 79),
            "added by an entry not applied here yet"
        );
        assert!(was_removed(&conf, newer, 80));
        assert!(!was_removed(&conf, 2, 500));
    }

    #[test]
    fn a_group_change_of_either_format_reads_as_one_and_garbage_is_an_error() {
        use protobuf::Message as _;
        use raft::eraftpb::ConfChangeType;
        let cc = ConfChange {
            change_type: ConfChangeType::AddLearnerNode,
            node_id: raft_id(1, 9),
            ..Default::default()
        };
        let mut e = Entry::default();
        e.set_entry_type(EntryType::EntryConfChange);
        e.data = cc.write_to_bytes().unwrap().into();
        let v2 = conf_change(&e).unwrap().unwrap();
        assert_eq!(v2.changes.len(), 1);
        assert_eq!(
            v2.changes[0].get_change_type(),
            ConfChangeType::AddLearnerNode
        );
        assert_eq!(v2.changes[0].node_id, raft_id(1, 9));
        e.data = vec![0xff, 0xff, 0xff].into();
        assert!(conf_change(&e).unwrap().is_err());
        // raft-rs's way out of a joint configuration: an empty change of the second format.
        e.set_entry_type(EntryType::EntryConfChangeV2);
        e.data = Vec::new().into();
        assert!(conf_change(&e).unwrap().unwrap().changes.is_empty());
        e.set_entry_type(EntryType::EntryNormal);
        assert!(conf_change(&e).is_none());
    }

    #[test]
    fn welcomes_read_back_as_written_and_a_cut_one_is_an_error() {
        for w in [
            Welcome::Admitted {
                id: raft_id(1, 33),
                index: 40,
                term: 3,
                conf: ConfState::from((vec![1, 3], vec![raft_id(1, 33)])),
            },
            Welcome::Refused {
                id: 2,
                why: "no place".into(),
            },
        ] {
            let bytes = w.encode().unwrap();
            assert_eq!(Welcome::decode(&bytes).unwrap(), w);
            assert!(Welcome::decode(&bytes[..5]).is_err());
        }
        assert!(Welcome::decode(&[]).is_err());
        assert!(Welcome::decode(&[9]).is_err());
    }
}
