//! The jobs that ended, as `storm history` lists them and the journal keeps them, for as long
//! as the cluster file's `[history]` says: `keep_days` after each job's end, and never more
//! than `max_jobs` (the oldest go first).
//!
//! The history decides what goes; its caller stages the same removals in the journal, so a
//! restarted MM restores exactly what was kept.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use storm_cluster::config::HistorySection;
use storm_cluster::messages::JobId;

use crate::journal::{JobRecord, JobState};

/// How often records past their age are looked for.
const EXPIRE_EVERY: Duration = Duration::from_secs(60);

pub(super) struct History {
    records: BTreeMap<JobId, JobRecord>,
    /// The records of jobs that submissions made, by submitter's uid and token.
    submissions: HashMap<(u32, u64), JobId>,
    keep: HistorySection,
    /// When records past their age were last looked for.
    expired_at: Option<Instant>,
}

impl History {
    pub(super) fn new(keep: HistorySection) -> Self {
        Self {
            records: BTreeMap::new(),
            submissions: HashMap::new(),
            keep,
            expired_at: None,
        }
    }

    pub(super) fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.records.get(id)
    }

    /// The ended job that the submission of user `uid` with `token` made, if it is kept.
    pub(super) fn submission(&self, uid: u32, token: u64) -> Option<JobId> {
        self.submissions.get(&(uid, token)).copied()
    }

    /// Oldest first.
    pub(super) fn records(&self) -> impl Iterator<Item = &JobRecord> {
        self.records.values()
    }

    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Keeps an ended job's record; says which records went to make room (`max_jobs`), the
    /// oldest (by id) first.
    pub(super) fn insert(&mut self, rec: JobRecord) -> Vec<JobId> {
        if let Some(key) = super::job::submission_key(rec.id, rec.uid, &rec.req) {
            self.submissions.insert(key, rec.id);
        }
        self.records.insert(rec.id, rec);
        let mut gone = Vec::new();
        while self.records.len() > self.keep.max_jobs.max(1) {
            let (id, rec) = self.records.pop_first().expect("more than one");
            self.forget_submission(&rec);
            gone.push(id);
        }
        gone
    }

    fn forget_submission(&mut self, rec: &JobRecord) {
        if let Some(key) = super::job::submission_key(rec.id, rec.uid, &rec.req)
            && self.submissions.get(&key) == Some(&rec.id)
        {
            self.submissions.remove(&key);
        }
    }

    /// Drops the records of jobs that ended more than `keep_days` before `now_ms`, looking at
    /// most every [`EXPIRE_EVERY`]; says which went.
    pub(super) fn expire(&mut self, now: Instant, now_ms: u64) -> Vec<JobId> {
        if self
            .expired_at
            .is_some_and(|at| now.saturating_duration_since(at) < EXPIRE_EVERY)
        {
            return Vec::new();
        }
        self.expired_at = Some(now);
        let cutoff = now_ms.saturating_sub(self.keep.keep().as_millis() as u64);
        let old: Vec<JobId> = self
            .records
            .values()
            .filter(|r| matches!(r.state, JobState::Finished { ended_ms, .. } if ended_ms < cutoff))
            .map(|r| r.id)
            .collect();
        for id in &old {
            if let Some(rec) = self.records.remove(id) {
                self.forget_submission(&rec);
            }
        }
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::tests::finished;

    const DAY_MS: u64 = 86_400_000;

    fn ended(id: JobId, ended_at: u64) -> JobRecord {
        let mut rec = finished(id);
        if let JobState::Finished { ended_ms, .. } = &mut rec.state {
            *ended_ms = ended_at;
        }
        rec
    }

    #[test]
    fn records_go_after_their_days_and_beyond_the_most_kept() {
        let mut h = History::new(HistorySection {
            keep_days: 2,
            max_jobs: 3,
        });
        let t0 = Instant::now();
        let now_ms = 10 * DAY_MS;
        assert!(h.insert(ended(1, now_ms - 3 * DAY_MS)).is_empty());
        assert!(h.insert(ended(2, now_ms - DAY_MS)).is_empty());
        assert!(h.insert(ended(3, now_ms)).is_empty());
        // Past three records, the oldest goes.
        assert_eq!(h.insert(ended(4, now_ms)), [1]);
        assert_eq!(h.expire(t0, now_ms), Vec::<JobId>::new());
        // A day later job 2 is two days past its end; looked for only once a minute.
        let later = now_ms + DAY_MS + 1;
        assert_eq!(
            h.expire(t0 + Duration::from_secs(1), later),
            Vec::<JobId>::new()
        );
        assert_eq!(h.expire(t0 + EXPIRE_EVERY, later), [2]);
        assert_eq!(h.records().map(|r| r.id).collect::<Vec<_>>(), [3, 4]);
    }
}
