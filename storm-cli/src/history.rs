//! `storm history`'s filters, as sacct's: `--since` (a time ago, `30m`, `2h`, `3d`, or a
//! local date, `2026-11-27` or `2026-11-27T08:00`), `--user` (a name or uid) and `--state`
//! (`completed,failed,cancelled,timeout,node_fail,out_of_memory,preempted`).

use storm_cluster::control::{JobInfo, JobState};

/// Which ended jobs to show.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HistoryFilter {
    /// Ended at or after this (milliseconds since the Unix epoch).
    pub since_ms: Option<u64>,
    pub uid: Option<u32>,
    /// Any of these states (all when empty).
    pub states: Vec<JobState>,
}

/// The states a job can end in.
const ENDED: [JobState; 7] = [
    JobState::Completed,
    JobState::Failed,
    JobState::Cancelled,
    JobState::Timeout,
    JobState::NodeFail,
    JobState::OutOfMemory,
    JobState::Preempted,
];

impl HistoryFilter {
    /// The filter `--since`, `--user` and `--state` give, with `now_ms` the time now.
    pub fn parse(
        since: Option<&str>,
        user: Option<&str>,
        state: Option<&str>,
        now_ms: u64,
    ) -> Result<Self, String> {
        let since_ms = since.map(|s| parse_since(s, now_ms)).transpose()?;
        let uid = user.map(parse_user).transpose()?;
        let states = match state {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|w| {
                    ENDED
                        .iter()
                        .copied()
                        .find(|s| s.as_str() == w.trim().to_lowercase())
                        .ok_or_else(|| {
                            let names: Vec<&str> = ENDED.iter().map(|s| s.as_str()).collect();
                            format!("--state {w:?}: expected one of {}", names.join(", "))
                        })
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(Self {
            since_ms,
            uid,
            states,
        })
    }

    /// Whether `job` passes.
    pub fn keeps(&self, job: &JobInfo) -> bool {
        self.since_ms
            .is_none_or(|since| job.ended_ms.is_some_and(|e| e >= since))
            && self.uid.is_none_or(|u| job.uid == u)
            && (self.states.is_empty() || self.states.contains(&job.state))
    }
}

fn parse_user(user: &str) -> Result<u32, String> {
    if let Ok(uid) = user.parse() {
        return Ok(uid);
    }
    nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
        .ok_or_else(|| format!("--user {user:?}: no such user here"))
}

/// `30m`, `2h`, `3d`, `45s` as milliseconds.
pub fn parse_ago(text: &str) -> Option<u64> {
    let units = [
        ('s', 1_000u64),
        ('m', 60_000),
        ('h', 3_600_000),
        ('d', 86_400_000),
    ];
    units.into_iter().find_map(|(unit, ms)| {
        let n = text.strip_suffix(unit)?.parse::<u64>().ok()?;
        Some(n.saturating_mul(ms))
    })
}

/// `30m`, `2h`, `3d`, `45s` before `now_ms`, or a local date and time.
fn parse_since(text: &str, now_ms: u64) -> Result<u64, String> {
    if let Some(ago) = parse_ago(text) {
        return Ok(now_ms.saturating_sub(ago));
    }
    local_date_ms(text).ok_or_else(|| {
        format!(
            "--since {text:?}: expected a time ago (30m, 2h, 3d) or a local date \
             (2026-11-27, 2026-11-27T08:00)"
        )
    })
}

/// `YYYY-MM-DD[THH:MM[:SS]]` in local time, as milliseconds since the Unix epoch.
fn local_date_ms(text: &str) -> Option<u64> {
    let (date, time) = text.split_once('T').unwrap_or((text, "00:00:00"));
    let d: Vec<i32> = date
        .split('-')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let t: Vec<i32> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let ([y, mo, day], [h, mi, rest @ ..]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    let sec = rest.first().copied().unwrap_or(0);
    if rest.len() > 1 || !(1..=12).contains(mo) || !(1..=31).contains(day) {
        return None;
    }
    // SAFETY: a zeroed tm is valid; mktime reads and normalises only it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = *day;
    tm.tm_hour = *h;
    tm.tm_min = *mi;
    tm.tm_sec = sec;
    tm.tm_isdst = -1;
    let secs = unsafe { libc::mktime(&mut tm) };
    (secs >= 0).then_some(secs as u64 * 1000)
}

/// Keeps the jobs `filter` passes.
pub fn filtered(jobs: Vec<JobInfo>, filter: &HistoryFilter) -> Vec<JobInfo> {
    jobs.into_iter().filter(|j| filter.keeps(j)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(uid: u32, state: JobState, ended_ms: u64) -> JobInfo {
        JobInfo {
            job: 1,
            name: "j".into(),
            uid,
            state,
            nodes: Default::default(),
            cpus: None,
            ntasks: 1,
            elapsed_ms: 0,
            reason: None,
            time_slot: None,
            exit_code: Some(0),
            usage: Default::default(),
            element: None,
            submitted_ms: 0,
            started_ms: None,
            ended_ms: Some(ended_ms),
            runs_on: None,
            from_cluster: None,
        }
    }

    #[test]
    fn since_user_and_state_select_as_sacct_does() {
        let now = 10 * 3_600_000;
        let f = HistoryFilter::parse(Some("2h"), Some("0"), Some("failed,timeout"), now).unwrap();
        assert_eq!(f.since_ms, Some(8 * 3_600_000));
        assert!(f.keeps(&job(0, JobState::Timeout, 9 * 3_600_000)));
        assert!(
            !f.keeps(&job(0, JobState::Completed, 9 * 3_600_000)),
            "state"
        );
        assert!(!f.keeps(&job(1, JobState::Failed, 9 * 3_600_000)), "user");
        assert!(
            !f.keeps(&job(0, JobState::Failed, 7 * 3_600_000)),
            "too old"
        );
        let all = HistoryFilter::parse(None, Some("root"), None, now).unwrap();
        assert_eq!(all.uid, Some(0));
        assert!(all.keeps(&job(0, JobState::NodeFail, 0)));
    }

    #[test]
    fn local_dates_and_bad_input() {
        let day = HistoryFilter::parse(Some("2026-11-27"), None, None, 0).unwrap();
        let later = HistoryFilter::parse(Some("2026-11-27T08:30"), None, None, 0).unwrap();
        assert_eq!(
            later.since_ms.unwrap() - day.since_ms.unwrap(),
            (8 * 60 + 30) * 60_000,
            "the same day, 8:30 later (local time)"
        );
        for (since, user, state, says) in [
            (
                Some("yesterday"),
                None,
                None,
                "--since \"yesterday\": expected",
            ),
            (None, Some("no-such-user-here"), None, "no such user"),
            (
                None,
                None,
                Some("running"),
                "--state \"running\": expected one of completed",
            ),
        ] {
            let e = HistoryFilter::parse(since, user, state, 0).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
