//! A PMIx job's exchange beyond its fences, between its NMs through the MM (docs/mpi.md,
//! "Direct modex and ranks' ends"): each node's state up, the MM's answer down.
//!
//! Both directions carry whole states, never deltas: each NM rewrites its
//! `pmix_up[slot][node]` whenever its state changes, and the MM rewrites `pmix_down[slot]`
//! (on every node of the job) whenever what it derives from the nodes' states changes. A
//! message overwritten before it was read is therefore never lost: the next one says all
//! of it again.

use serde::{Deserialize, Serialize};

use super::JobId;

/// The PMIx events of a rank's end (`pmix_common.h`; `storm-pmix` checks them against
/// `pmix-sys`, whose layout test checks those against the installed headers).
pub mod events {
    /// It exited 0 without finalizing.
    pub const TERM_WO_SYNC: i32 = -200;
    /// A signal killed it.
    pub const ABORTED_BY_SIG: i32 = -402;
    /// It exited with a code other than 0.
    pub const EXIT_NONZERO: i32 = -404;
}

impl RankEnd {
    /// The event of rank `rank`'s end, if it ended badly: by a signal, with a code other
    /// than 0, or with 0 after initializing without finalizing (`began`, `finalized`).
    pub fn of(rank: u32, status: super::RankStatus, began: bool, finalized: bool) -> Option<Self> {
        let (status, exit_code) = match status {
            super::RankStatus::Signaled(s) => (events::ABORTED_BY_SIG, 128 + s),
            super::RankStatus::Exited(0) if began && !finalized => (events::TERM_WO_SYNC, 0),
            super::RankStatus::Exited(0) => return None,
            super::RankStatus::Exited(c) => (events::EXIT_NONZERO, c),
        };
        Some(Self {
            rank,
            status,
            exit_code,
        })
    }
}

/// A rank's end as its job's other ranks are told it: the PMIx event (`status`, a
/// `pmix_status_t` such as `PMIX_ERR_PROC_ABORTED_BY_SIG`) and its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEnd {
    pub rank: u32,
    pub status: i32,
    pub exit_code: i32,
}

/// NM to MM: what one node of a PMIx job asks for and offers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmixUp {
    pub job: JobId,
    /// Ranks of other nodes whose data a local client waits for (a direct modex), in order.
    pub wants: Vec<u32>,
    /// Data of local ranks the MM asked for (as the PMIx library packed it).
    pub serves: Vec<(u32, Vec<u8>)>,
    /// Local ranks asked for whose data cannot be given, and why.
    pub unservable: Vec<(u32, String)>,
    /// Local ranks that ended badly (before the job's end).
    pub ended: Vec<RankEnd>,
}

/// MM to every node of a PMIx job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmixDown {
    pub job: JobId,
    /// Ranks whose data some node wants and no node offers yet: their own nodes give it.
    pub asks: Vec<u32>,
    /// Data some node wants, from the rank's own node.
    pub blobs: Vec<(u32, Vec<u8>)>,
    /// Ranks some node wants whose data cannot be given, and why.
    pub failed: Vec<(u32, String)>,
    /// Every node's ranks that ended badly.
    pub ended: Vec<RankEnd>,
}

/// What the MM sends down, given each node's state (`parts[k]`: the job's `k`-th node's, in
/// node-set order; `None`: a node that wrote none) for a job of `ntasks` ranks placed as
/// storm places them ([`crate::tasks::ranks_on`]), in at most `limit` bytes of encoded
/// message: data some node wants goes down as long as it fits, the rest at a later round
/// (when the first wants are met). A node speaks only for its own ranks: what it offers or
/// says of another node's rank (root of that node, lying) is not taken.
pub fn pmix_down(job: JobId, parts: &[Option<PmixUp>], ntasks: u32, limit: usize) -> PmixDown {
    use std::collections::{BTreeMap, BTreeSet};
    let nnodes = parts.len() as u32;
    let parts: Vec<(std::ops::Range<u32>, &PmixUp)> = parts
        .iter()
        .enumerate()
        .filter_map(|(k, p)| {
            let p = p.as_ref().filter(|p| p.job == job)?;
            let (first, count) = crate::tasks::ranks_on(ntasks, nnodes, k as u32);
            Some((first..first + count, p))
        })
        .collect();
    let wants: BTreeSet<u32> = parts
        .iter()
        .flat_map(|(_, p)| p.wants.iter().copied())
        .filter(|&r| r < ntasks)
        .collect();
    let mut offered: BTreeMap<u32, &Vec<u8>> = BTreeMap::new();
    let mut unservable: BTreeMap<u32, &String> = BTreeMap::new();
    let mut ended: BTreeMap<u32, RankEnd> = BTreeMap::new();
    for (own, p) in &parts {
        for (rank, data) in p.serves.iter().filter(|(r, _)| own.contains(r)) {
            offered.entry(*rank).or_insert(data);
        }
        for (rank, why) in p.unservable.iter().filter(|(r, _)| own.contains(r)) {
            unservable.entry(*rank).or_insert(why);
        }
        for e in p.ended.iter().filter(|e| own.contains(&e.rank)) {
            ended.entry(e.rank).or_insert(*e);
        }
    }
    let mut down = PmixDown {
        job,
        ended: ended.into_values().collect(),
        ..PmixDown::default()
    };
    // What the rest takes, roughly (bincode's varints are at most this long).
    let mut used = 64 + 5 * wants.len() + 16 * down.ended.len();
    for rank in wants {
        if let Some(data) = offered.get(&rank) {
            let cost = data.len() + 16;
            if used + cost <= limit {
                used += cost;
                down.blobs.push((rank, data.to_vec()));
            }
        } else if let Some(why) = unservable.get(&rank) {
            used += why.len() + 16;
            down.failed.push((rank, why.to_string()));
        } else {
            down.asks.push(rank);
        }
    }
    down
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(wants: &[u32], serves: &[(u32, &[u8])]) -> Option<PmixUp> {
        Some(PmixUp {
            job: 7,
            wants: wants.to_vec(),
            serves: serves.iter().map(|(r, d)| (*r, d.to_vec())).collect(),
            ..PmixUp::default()
        })
    }

    /// A wanted rank nobody offers is asked for; once its node offers it, its data goes
    /// down (and it is no longer asked for); once nobody wants it, neither.
    #[test]
    fn a_wanted_rank_is_asked_for_then_delivered_then_dropped() {
        // Ranks 0-1 on the first node, 2-3 on the second.
        let asked = pmix_down(7, &[up(&[3], &[]), up(&[], &[])], 4, 1 << 20);
        assert_eq!(asked.asks, vec![3]);
        assert!(asked.blobs.is_empty());
        let given = pmix_down(7, &[up(&[3], &[]), up(&[], &[(3, b"addr")])], 4, 1 << 20);
        assert!(given.asks.is_empty());
        assert_eq!(given.blobs, vec![(3, b"addr".to_vec())]);
        let done = pmix_down(7, &[up(&[], &[]), up(&[], &[(3, b"addr")])], 4, 1 << 20);
        assert_eq!(
            done,
            PmixDown {
                job: 7,
                ..PmixDown::default()
            }
        );
    }

    /// Another job's state (an earlier job of the slot) counts for nothing; a rank that
    /// cannot be served fails for whoever wants it; ends go to every node. A node that
    /// offers data or tells ends of another node's ranks is not believed.
    #[test]
    fn other_jobs_and_other_nodes_ranks_are_ignored_failures_and_ends_pass_down() {
        // 8 ranks on 4 nodes: 0-1, 2-3, 4-5, 6-7.
        let mut stale = up(&[1], &[]).unwrap();
        stale.job = 6;
        let mut liar = up(&[4], &[(6, b"forged")]).unwrap();
        liar.ended = vec![RankEnd {
            rank: 0,
            status: -402,
            exit_code: 137,
        }];
        let mut owner = up(&[], &[]).unwrap();
        owner.unservable = vec![(4, "too large".into())];
        owner.ended = vec![RankEnd {
            rank: 5,
            status: -402,
            exit_code: 139,
        }];
        let wants_six = up(&[6, 99], &[]);
        let down = pmix_down(
            7,
            &[Some(stale), Some(liar), Some(owner), wants_six],
            8,
            1 << 20,
        );
        assert_eq!(down.failed, vec![(4, "too large".to_string())]);
        assert_eq!(down.ended.iter().map(|e| e.rank).collect::<Vec<_>>(), [5]);
        assert!(
            down.blobs.is_empty(),
            "rank 6's data comes only from its own node"
        );
        assert_eq!(
            down.asks,
            vec![6],
            "job 6's want is not job 7's; rank 99 is none"
        );
    }

    /// Data beyond the limit waits for a later round; what fits goes now.
    #[test]
    fn data_beyond_the_limit_waits() {
        let big = vec![1u8; 600];
        let down = pmix_down(
            7,
            &[up(&[2, 3], &[]), up(&[], &[(2, &big), (3, &big)])],
            4,
            1000,
        );
        assert_eq!(down.blobs.len(), 1);
        assert!(down.asks.is_empty(), "rank 3 is offered: not asked again");
    }
}
