//! Replicas compare their state, as UCLA's CMM does, to find one that went wrong beyond
//! Raft's crash model: a write its disk lost, a bit flipped in its journal, a bug in applying.
//!
//! Raft keeps the replicas' logs equal; nothing checks that the journals built from them are.
//! So every `checksum_every` log entries (a *window*, `[replication]` in the cluster file),
//! each replica hashes its whole journal ([`digest`]) as it stands after applying the
//! window's last entry, and proposes the hash to the log as a [`Report`] (an entry marked
//! [`CONTEXT`]; a follower's proposal goes through the leader). Every replica applies every
//! report in the log's order and tallies them ([`Windows`]); once a majority of the group
//! reported the same hash for a window, that hash is the window's, and a replica that
//! reported another has diverged. Every replica reaches the same verdicts from the same
//! reports. A replica that restarts judges only the reports it applies after restarting.
//!
//! What is hashed is what a replica that leads would act on: the next job id, every job
//! record and every node record, in key order. Program copies are not hashed (a leader and its
//! followers delete them at different moments), nor is the log position the store records.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::journal::Restored;

/// The entry context that marks a replica's report of its state's hash.
pub const CONTEXT: &[u8] = b"checksum";

/// Windows whose reports are kept, counting back from the newest reported.
const KEPT: usize = 64;

/// A hash of a journal's state.
pub type Digest = [u8; 32];

/// The hash of everything `state` holds that a leader acts on.
pub fn digest(state: &Restored) -> Digest {
    let mut h = blake3::Hasher::new();
    let mut put = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    put(&state.next_job.to_le_bytes());
    for job in &state.jobs {
        put(&encode(job));
    }
    for (node, rec) in &state.nodes {
        put(&node.to_le_bytes());
        put(&encode(rec));
    }
    *h.finalize().as_bytes()
}

/// A record's bytes as the hash takes them (bincode, as the journal stores it).
fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(record, bincode::config::standard())
        .expect("journal records always encode")
}

/// Replica `replica`'s hash of its state after applying entry `window`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub replica: u32,
    pub window: u64,
    pub digest: Digest,
}

impl Report {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// A report read back from the log; the error says what is wrong with it.
    pub fn decode(data: &[u8]) -> Result<Self, String> {
        match bincode::serde::decode_from_slice(data, bincode::config::standard()) {
            Ok((report, used)) if used == data.len() => Ok(report),
            Ok((_, used)) => Err(format!(
                "a checksum report has {} bytes after its end",
                data.len() - used
            )),
            Err(e) => Err(format!("a checksum report does not decode: {e}")),
        }
    }
}

/// What the reports applied so far say about a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `replica`'s state after entry `window` is the one a majority holds.
    Agrees { replica: u32, window: u64 },
    /// `replica`'s state after entry `window` is not the one a majority holds.
    Diverged {
        replica: u32,
        window: u64,
        theirs: Digest,
        majority: Digest,
    },
    /// Every replica reported for `window`, and no majority holds one state.
    NoMajority { window: u64 },
}

#[derive(Debug, Default)]
struct Window {
    /// The first report of each replica (a replica that restarts may report again).
    reports: BTreeMap<u32, Digest>,
    decided: Option<Digest>,
}

/// The tally of the reports in the log, the same on every replica that applied them.
#[derive(Debug)]
pub struct Windows {
    replicas: usize,
    windows: BTreeMap<u64, Window>,
}

impl Windows {
    pub fn new(replicas: usize) -> Self {
        Self {
            replicas,
            windows: BTreeMap::new(),
        }
    }

    /// Counts `report`, and says what it settled: nothing until a majority agrees on the
    /// window, then a verdict on every replica that reported for it, and on each later one.
    pub fn record(&mut self, report: &Report) -> Vec<Verdict> {
        if report.replica as usize >= self.replicas {
            return Vec::new();
        }
        if let Some(&oldest) = self.windows.keys().next()
            && self.windows.len() >= KEPT
            && report.window < oldest
        {
            // Too late to count: its window was forgotten.
            return Vec::new();
        }
        let w = self.windows.entry(report.window).or_default();
        if w.reports.contains_key(&report.replica) {
            return Vec::new();
        }
        w.reports.insert(report.replica, report.digest);
        let verdict = |replica: u32, theirs: Digest, majority: Digest| {
            if theirs == majority {
                Verdict::Agrees {
                    replica,
                    window: report.window,
                }
            } else {
                Verdict::Diverged {
                    replica,
                    window: report.window,
                    theirs,
                    majority,
                }
            }
        };
        let verdicts = match w.decided {
            Some(majority) => vec![verdict(report.replica, report.digest, majority)],
            None => {
                let needed = self.replicas / 2 + 1;
                let majority = w
                    .reports
                    .values()
                    .find(|d| w.reports.values().filter(|o| o == d).count() >= needed)
                    .copied();
                match majority {
                    Some(m) => {
                        w.decided = Some(m);
                        w.reports.iter().map(|(&r, &d)| verdict(r, d, m)).collect()
                    }
                    None if w.reports.len() == self.replicas => {
                        vec![Verdict::NoMajority {
                            window: report.window,
                        }]
                    }
                    None => Vec::new(),
                }
            }
        };
        while self.windows.len() > KEPT {
            self.windows.pop_first();
        }
        verdicts
    }
}

/// A digest's first bytes, to name it in a log line.
pub fn short(d: &Digest) -> String {
    d[..6].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(replica: u32, window: u64, d: u8) -> Report {
        Report {
            replica,
            window,
            digest: [d; 32],
        }
    }

    #[test]
    fn a_replica_that_differs_from_the_majority_is_named_whenever_it_reports() {
        let mut w = Windows::new(3);
        // The odd one reports first: nothing is settled by one report.
        assert!(w.record(&report(2, 8, 9)).is_empty());
        assert!(w.record(&report(0, 8, 1)).is_empty());
        let verdicts = w.record(&report(1, 8, 1));
        assert!(verdicts.contains(&Verdict::Diverged {
            replica: 2,
            window: 8,
            theirs: [9; 32],
            majority: [1; 32],
        }));
        assert!(verdicts.contains(&Verdict::Agrees {
            replica: 0,
            window: 8
        }));
        assert_eq!(verdicts.len(), 3);
        // The next window: the majority is settled before the odd one reports.
        w.record(&report(0, 16, 3));
        w.record(&report(1, 16, 3));
        assert_eq!(
            w.record(&report(2, 16, 4)),
            vec![Verdict::Diverged {
                replica: 2,
                window: 16,
                theirs: [4; 32],
                majority: [3; 32],
            }]
        );
    }

    #[test]
    fn the_leader_is_the_one_that_diverged_when_both_followers_agree_without_it() {
        let mut w = Windows::new(3);
        w.record(&report(0, 4, 7));
        w.record(&report(1, 4, 5));
        let verdicts = w.record(&report(2, 4, 5));
        assert!(
            verdicts
                .iter()
                .any(|v| matches!(v, Verdict::Diverged { replica: 0, .. }))
        );
    }

    #[test]
    fn three_different_states_settle_nothing_and_say_so() {
        let mut w = Windows::new(3);
        w.record(&report(0, 4, 1));
        w.record(&report(1, 4, 2));
        assert_eq!(
            w.record(&report(2, 4, 3)),
            vec![Verdict::NoMajority { window: 4 }]
        );
    }

    #[test]
    fn a_second_report_of_a_replica_for_a_window_counts_once() {
        let mut w = Windows::new(3);
        w.record(&report(0, 4, 1));
        // Replica 0 restarted and reported again, with another state: only its first counts.
        assert!(w.record(&report(0, 4, 2)).is_empty());
        assert!(w.record(&report(5, 4, 1)).is_empty(), "no such replica");
        assert_eq!(w.record(&report(1, 4, 1)).len(), 2);
    }

    #[test]
    fn the_hash_changes_with_any_record_and_not_with_nothing() {
        use crate::journal::NodeRecord;
        let mut a = Restored {
            next_job: 5,
            ..Default::default()
        };
        a.nodes.insert(1, NodeRecord::default());
        let same = digest(&a);
        assert_eq!(digest(&a), same);
        a.nodes.insert(
            1,
            NodeRecord {
                drain: Some("disk".into()),
                lent: None,
            },
        );
        assert_ne!(digest(&a), same);
        let drained = digest(&a);
        a.next_job = 6;
        assert_ne!(digest(&a), drained);
    }

    #[test]
    fn a_report_reads_back_and_trailing_bytes_are_refused() {
        let r = report(1, 64, 3);
        let mut bytes = r.encode();
        assert_eq!(Report::decode(&bytes), Ok(r));
        bytes.push(0);
        assert!(
            Report::decode(&bytes)
                .unwrap_err()
                .contains("after its end")
        );
        assert!(Report::decode(&[0xff]).is_err());
    }
}
