//! One PMIx job's exchange beyond its fences, on one node (docs/mpi.md, "Direct modex and
//! ranks' ends"): its local clients' direct modex requests for ranks of other nodes, the
//! data of its local ranks other nodes want, and its ranks' ends.
//!
//! This core only decides. Its inputs are what the node's PMIx server said (a client wants
//! a remote rank's data, the library gave a local rank's data), what the MM sent down
//! ([`PmixDown`]) and the NM's word that a local rank ended; its outputs are [`XEffect`]s
//! the PMI thread carries out: the node's whole state to the MM ([`PmixUp`], whenever it
//! changes), an answer to a waiting request, a request to the library, a PMIx event for the
//! job's local clients. A request's handle (`D`) is the host's; the core only holds it.
//!
//! The attacker is a local client of the job: it may ask for any rank, any number of times.
//! A rank outside the job, or one of this node's own, is refused at once; the ranks wanted
//! are at most the job's, each with at most [`MAX_WAITING`] requests.

use std::collections::{BTreeMap, BTreeSet};

use storm_cluster::messages::{JobId, PmixDown, PmixUp, RankEnd};

/// The most requests for one rank's data that may wait at once.
pub const MAX_WAITING: usize = 64;

/// What the PMI thread does for a job's exchange.
#[derive(Debug, PartialEq, Eq)]
pub enum XEffect<D> {
    /// Write this state to the MM (`pmix_up[slot][node]`).
    Send(PmixUp),
    /// Answer a direct modex: the rank's data, or why there is none.
    Answer(D, Result<Vec<u8>, String>),
    /// Ask the PMIx library for the data local rank `0` committed.
    Fetch(u32),
    /// Raise a PMIx event for the job's local clients: this rank ended.
    Tell(RankEnd),
}

/// One job's exchange state on this node.
pub struct Exchange<D> {
    job: JobId,
    size: u32,
    local: BTreeSet<u32>,
    /// Remote ranks local clients wait for, with their requests.
    wants: BTreeMap<u32, Vec<D>>,
    /// Local ranks' data the MM asked for.
    serving: BTreeMap<u32, Vec<u8>>,
    /// Local ranks asked of the library, not answered yet.
    fetching: BTreeSet<u32>,
    /// Local ranks asked for whose data cannot be given, and why.
    unservable: BTreeMap<u32, String>,
    /// Local ranks that ended badly.
    ended: BTreeMap<u32, RankEnd>,
    /// Ranks whose end this node's clients were told.
    told: BTreeSet<u32>,
    /// What the MM last got.
    sent: Option<PmixUp>,
    /// Bytes of a [`PmixUp`] (`[cluster] pmi_node_bytes`, less its seal).
    limit: usize,
}

impl<D> Exchange<D> {
    pub fn new(job: JobId, size: u32, local: impl IntoIterator<Item = u32>, limit: usize) -> Self {
        Self {
            job,
            size,
            local: local.into_iter().collect(),
            wants: BTreeMap::new(),
            serving: BTreeMap::new(),
            fetching: BTreeSet::new(),
            unservable: BTreeMap::new(),
            ended: BTreeMap::new(),
            told: BTreeSet::new(),
            sent: None,
            limit,
        }
    }

    /// A local client wants remote rank `rank`'s data; `done` answers it.
    pub fn want(&mut self, rank: u32, done: D) -> Vec<XEffect<D>> {
        if rank >= self.size {
            let why = format!("rank {rank} is not in the job of {} ranks", self.size);
            return vec![XEffect::Answer(done, Err(why))];
        }
        if self.local.contains(&rank) {
            let why = format!("rank {rank} runs on this node: its data is here");
            return vec![XEffect::Answer(done, Err(why))];
        }
        let waiting = self.wants.entry(rank).or_default();
        if waiting.len() >= MAX_WAITING {
            let why = format!("{MAX_WAITING} requests for rank {rank}'s data wait already");
            return vec![XEffect::Answer(done, Err(why))];
        }
        waiting.push(done);
        self.sync(Vec::new())
    }

    /// The library gave local rank `rank`'s data (or could not).
    pub fn fetched(&mut self, rank: u32, result: Result<Vec<u8>, String>) -> Vec<XEffect<D>> {
        if !self.fetching.remove(&rank) {
            return Vec::new();
        }
        match result {
            Ok(data) if data.len() + 64 <= self.limit => {
                self.serving.insert(rank, data);
            }
            Ok(data) => {
                let why = format!(
                    "{} bytes, more than a node's PMIx exchange holds ([cluster] pmi_node_bytes = {})",
                    data.len(),
                    self.limit
                );
                self.unservable.insert(rank, why);
            }
            Err(why) => {
                self.unservable.insert(rank, why);
            }
        }
        self.sync(Vec::new())
    }

    /// What the MM sent down.
    pub fn down(&mut self, msg: PmixDown) -> Vec<XEffect<D>> {
        if msg.job != self.job {
            return Vec::new();
        }
        let mut effects = Vec::new();
        for (rank, data) in &msg.blobs {
            for done in self.wants.remove(rank).unwrap_or_default() {
                effects.push(XEffect::Answer(done, Ok(data.clone())));
            }
        }
        for (rank, why) in &msg.failed {
            for done in self.wants.remove(rank).unwrap_or_default() {
                let why = format!("rank {rank}'s data cannot be given: {why}");
                effects.push(XEffect::Answer(done, Err(why)));
            }
        }
        for &rank in &msg.asks {
            let new = self.local.contains(&rank)
                && !self.serving.contains_key(&rank)
                && !self.unservable.contains_key(&rank)
                && self.fetching.insert(rank);
            if new {
                effects.push(XEffect::Fetch(rank));
            }
        }
        // Offered while some node still wants it: asked for, or on its way down.
        let wanted: BTreeSet<u32> = msg
            .asks
            .iter()
            .chain(msg.blobs.iter().map(|(r, _)| r))
            .chain(msg.failed.iter().map(|(r, _)| r))
            .copied()
            .collect();
        self.serving.retain(|r, _| wanted.contains(r));
        self.unservable.retain(|r, _| wanted.contains(r));
        for end in &msg.ended {
            if self.told.insert(end.rank) {
                effects.push(XEffect::Tell(*end));
            }
        }
        self.sync(effects)
    }

    /// Local rank `end.rank` ended badly: the job's local clients are told now, the other
    /// nodes' through the MM.
    pub fn rank_ended(&mut self, end: RankEnd) -> Vec<XEffect<D>> {
        if !self.local.contains(&end.rank) || self.ended.contains_key(&end.rank) {
            return Vec::new();
        }
        self.ended.insert(end.rank, end);
        let mut effects = Vec::new();
        if self.told.insert(end.rank) {
            effects.push(XEffect::Tell(end));
        }
        self.sync(effects)
    }

    /// The state again, whatever the MM had (a new membership, perhaps a new MM).
    pub fn resend(&mut self) -> Vec<XEffect<D>> {
        self.sent = None;
        self.sync(Vec::new())
    }

    /// The job ended here: every waiting request fails.
    pub fn close(&mut self) -> Vec<XEffect<D>> {
        std::mem::take(&mut self.wants)
            .into_values()
            .flatten()
            .map(|done| XEffect::Answer(done, Err("the job ended".to_string())))
            .collect()
    }

    /// Whether the MM has anything of this node's to act on (else nothing need be sent).
    fn is_empty(up: &PmixUp) -> bool {
        up.wants.is_empty()
            && up.serves.is_empty()
            && up.unservable.is_empty()
            && up.ended.is_empty()
    }

    /// `effects`, then the state to the MM if it changed.
    fn sync(&mut self, mut effects: Vec<XEffect<D>>) -> Vec<XEffect<D>> {
        let mut up = PmixUp {
            job: self.job,
            wants: self.wants.keys().copied().collect(),
            serves: Vec::new(),
            unservable: self
                .unservable
                .iter()
                .map(|(r, why)| (*r, why.clone()))
                .collect(),
            ended: self.ended.values().copied().collect(),
        };
        // As much data as fits; the rest once what went is taken (no longer asked for).
        let mut used = 64
            + 5 * up.wants.len()
            + 16 * up.ended.len()
            + up.unservable
                .iter()
                .map(|(_, w)| w.len() + 16)
                .sum::<usize>();
        for (rank, data) in &self.serving {
            if used + data.len() + 16 <= self.limit {
                used += data.len() + 16;
                up.serves.push((*rank, data.clone()));
            }
        }
        let changed = match &self.sent {
            Some(sent) => *sent != up,
            None => !Self::is_empty(&up),
        };
        if changed {
            self.sent = Some(up.clone());
            effects.push(XEffect::Send(up));
        }
        effects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 0 of a 4-rank job holds ranks 0 and 1.
    fn node0() -> Exchange<&'static str> {
        Exchange::new(9, 4, [0, 1], 32 * 1024)
    }

    fn sent<D>(effects: &[XEffect<D>]) -> Option<&PmixUp> {
        effects.iter().find_map(|e| match e {
            XEffect::Send(up) => Some(up),
            _ => None,
        })
    }

    /// A client's request for a remote rank goes up as a want; the data that comes down
    /// answers it (every request for that rank), and the want goes.
    #[test]
    fn a_direct_modex_is_asked_up_and_answered_from_below() {
        let mut x = node0();
        let e = x.want(3, "a");
        assert_eq!(sent(&e).unwrap().wants, vec![3]);
        let e = x.want(3, "b");
        assert!(sent(&e).is_none(), "the same want: nothing new to send");
        let down = PmixDown {
            job: 9,
            blobs: vec![(3, b"addr3".to_vec())],
            ..PmixDown::default()
        };
        let e = x.down(down);
        assert!(e.contains(&XEffect::Answer("a", Ok(b"addr3".to_vec()))));
        assert!(e.contains(&XEffect::Answer("b", Ok(b"addr3".to_vec()))));
        assert!(sent(&e).unwrap().wants.is_empty());
    }

    /// A rank outside the job, or one of this node's own, is refused at once and never
    /// reaches the MM; a rank's requests are bounded.
    #[test]
    fn bad_and_excess_requests_are_refused_here() {
        let mut x = node0();
        for rank in [4, u32::MAX, 1] {
            let e = x.want(rank, "x");
            assert!(
                matches!(e.as_slice(), [XEffect::Answer("x", Err(_))]),
                "{rank}: {e:?}"
            );
        }
        for _ in 0..MAX_WAITING {
            x.want(2, "w");
        }
        let e = x.want(2, "over");
        assert!(matches!(e.as_slice(), [XEffect::Answer("over", Err(_))]));
        assert_eq!(
            x.close().len(),
            MAX_WAITING,
            "every waiting request fails at the end"
        );
    }

    /// The MM asks for a local rank's data: the library is asked once; its data goes up
    /// and stays offered while some node wants it, then goes.
    #[test]
    fn asked_data_is_fetched_once_and_offered_while_wanted() {
        let mut x = node0();
        let ask = PmixDown {
            job: 9,
            asks: vec![1, 3],
            ..PmixDown::default()
        };
        let e = x.down(ask.clone());
        assert_eq!(e, vec![XEffect::Fetch(1)], "rank 3 is not this node's");
        assert!(
            x.down(ask).is_empty(),
            "asked again while the library has not answered"
        );
        let e = x.fetched(1, Ok(b"one".to_vec()));
        assert_eq!(sent(&e).unwrap().serves, vec![(1, b"one".to_vec())]);
        let delivering = PmixDown {
            job: 9,
            blobs: vec![(1, b"one".to_vec())],
            ..PmixDown::default()
        };
        assert!(
            x.down(delivering).is_empty(),
            "still offered while on its way"
        );
        let e = x.down(PmixDown {
            job: 9,
            ..PmixDown::default()
        });
        assert!(sent(&e).unwrap().serves.is_empty());
    }

    /// Data too large for the node's area, or the library's refusal, goes up as unservable
    /// and fails the remote request with the reason.
    #[test]
    fn unservable_data_fails_the_request_with_its_reason() {
        let mut x: Exchange<&str> = Exchange::new(9, 4, [0, 1], 1000);
        x.down(PmixDown {
            job: 9,
            asks: vec![0],
            ..PmixDown::default()
        });
        let e = x.fetched(0, Ok(vec![0; 5000]));
        let up = sent(&e).unwrap();
        assert!(up.serves.is_empty());
        assert!(up.unservable[0].1.contains("pmi_node_bytes"), "{up:?}");
        // The requesting side.
        let mut y: Exchange<&str> = Exchange::new(9, 4, [2, 3], 1000);
        y.want(0, "r");
        let e = y.down(PmixDown {
            job: 9,
            failed: vec![(0, "too large".into())],
            ..PmixDown::default()
        });
        assert!(
            matches!(&e[0], XEffect::Answer("r", Err(w)) if w.contains("too large")),
            "{e:?}"
        );
    }

    /// A local rank's end is told here at once and sent up; a remote one, once it comes
    /// down; neither twice. Another job's message is ignored.
    #[test]
    fn ends_are_told_once_here_and_there() {
        let mut x = node0();
        let end = RankEnd {
            rank: 1,
            status: -402,
            exit_code: 139,
        };
        let e = x.rank_ended(end);
        assert!(e.contains(&XEffect::Tell(end)));
        assert_eq!(sent(&e).unwrap().ended, vec![end]);
        assert!(x.rank_ended(end).is_empty());
        let remote = RankEnd {
            rank: 3,
            status: -404,
            exit_code: 2,
        };
        let down = PmixDown {
            job: 9,
            ended: vec![end, remote],
            ..PmixDown::default()
        };
        assert_eq!(x.down(down.clone()), vec![XEffect::Tell(remote)]);
        assert!(x.down(down.clone()).is_empty());
        let other = PmixDown { job: 8, ..down };
        assert!(x.down(other).is_empty());
    }
}
