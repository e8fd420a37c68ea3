//! The regression check: each run's phase medians are kept, and the next run of the same
//! measurement is compared with them, naming every phase that grew.
//!
//! The machines are shared and noisy, so a phase is compared as a ratio to the baseline
//! measured in its own run (fork/exec for throughput, the cp+fork floor for launch): a phase
//! has grown when that ratio is more than [`GREW`] times the last run's and the phase also
//! takes more in absolute time by [`FLOOR_S`] and by [`FLOOR_SHARE`] of the whole (submit to
//! exit), so that a 20 us phase doubling, or a 300 us one in a 180 ms launch, is not news.
//!
//! Records are JSON files, one per measurement (`launch-12MB-8N-tcp.json`, ...), in
//! `--history DIR` (by default `$XDG_STATE_HOME/storm-bench`, or `~/.local/state/storm-bench`).
//! A run replaces the record it compared with, so the check is always against the last run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::report::Table;
use crate::stats::fmt_time;

/// A phase has grown when its share of the baseline grew by more than this factor...
pub const GREW: f64 = 1.5;
/// ...and it takes at least this much longer, in seconds...
pub const FLOOR_S: f64 = 200e-6;
/// ...and at least this share of the whole (the record's `submit to exit`) longer.
pub const FLOOR_SHARE: f64 = 0.02;

/// The phase every record ends with: the whole, as the submitter saw it.
pub const WHOLE: &str = "submit to exit";

/// One measurement's phases, as kept between runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// What was measured, as the file is named.
    pub key: String,
    /// Seconds since the epoch when it was measured.
    pub when_unix_s: u64,
    /// The same run's baseline, in seconds, and what it is.
    pub baseline: String,
    pub baseline_s: f64,
    /// Each phase's median, in seconds, in the table's order.
    pub phases: Vec<(String, f64)>,
}

/// How one phase compares with the last run.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub phase: String,
    pub last_s: f64,
    pub now_s: f64,
    /// This run's share of its baseline over the last run's.
    pub relative: f64,
    pub grew: bool,
}

/// Compares `now` with `last`, phase by phase (phases only one of them has are skipped).
pub fn compare(last: &Record, now: &Record) -> Vec<Change> {
    let whole = now
        .phases
        .iter()
        .find(|(p, _)| p == WHOLE)
        .map_or(0.0, |(_, s)| *s);
    let floor = FLOOR_S.max(FLOOR_SHARE * whole);
    now.phases
        .iter()
        .filter_map(|(phase, now_s)| {
            let (_, last_s) = last.phases.iter().find(|(p, _)| p == phase)?;
            let share = |s: f64, base: f64| if base > 0.0 { s / base } else { f64::NAN };
            let relative = share(*now_s, now.baseline_s) / share(*last_s, last.baseline_s);
            let grew = relative.is_finite() && relative > GREW && now_s - last_s >= floor;
            Some(Change {
                phase: phase.clone(),
                last_s: *last_s,
                now_s: *now_s,
                relative,
                grew,
            })
        })
        .collect()
}

/// Where records are kept when `--history` is not given.
pub fn default_dir() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/state")))?;
    Some(state.join("storm-bench"))
}

/// A file name for `key`: letters, digits, `.`, `-` and `_` kept, anything else `_`.
fn file_name(key: &str) -> String {
    let safe: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.json")
}

/// The last run's record of `key` in `dir`, if there is one that reads.
pub fn load(dir: &Path, key: &str) -> Result<Option<Record>> {
    let path = dir.join(file_name(key));
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let record = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a storm-bench record", path.display()))?;
    Ok(Some(record))
}

/// Keeps `record` as the last run of its key (written whole, then renamed into place).
pub fn store(dir: &Path, record: &Record) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(file_name(&record.key));
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(record)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Compares each record with the last run of its key in `dir`, stores it as the new last
/// run, and says what grew: a table of the phases that grew (or a line that none did, or
/// that there was nothing to compare with), and how many grew.
pub fn check(dir: &Path, records: &[Record]) -> Result<(Table, usize)> {
    let mut table = Table::new(
        format!(
            "Against the last recorded run ({}): phases whose share of their run's baseline \
             grew more than {GREW}x and by at least {} and {:.0}% of submit to exit",
            dir.display(),
            fmt_time(FLOOR_S),
            FLOOR_SHARE * 100.0
        ),
        &["measurement", "phase", "last", "now", "share of baseline"],
    );
    let mut grown = 0;
    for record in records {
        match load(dir, &record.key)? {
            None => table.push(vec![
                record.key.clone(),
                "(first recorded run: nothing to compare with)".into(),
                String::new(),
                String::new(),
                String::new(),
            ]),
            Some(last) => {
                let changes = compare(&last, record);
                let grew: Vec<&Change> = changes.iter().filter(|c| c.grew).collect();
                grown += grew.len();
                if grew.is_empty() {
                    table.push(vec![
                        record.key.clone(),
                        "(no phase grew)".into(),
                        String::new(),
                        String::new(),
                        String::new(),
                    ]);
                }
                for c in grew {
                    table.push(vec![
                        record.key.clone(),
                        format!("{} GREW", c.phase),
                        fmt_time(c.last_s),
                        fmt_time(c.now_s),
                        format!("{:.2}x", c.relative),
                    ]);
                }
            }
        }
        store(dir, record)?;
    }
    Ok((table, grown))
}

/// The regression check's options, shared by the benchmarks that keep records.
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryArgs {
    /// Where the last run's phase medians are kept and compared with (default:
    /// $XDG_STATE_HOME/storm-bench, or ~/.local/state/storm-bench).
    #[arg(long, value_name = "DIR")]
    pub history: Option<PathBuf>,
    /// Neither compare with nor keep this run's phases.
    #[arg(long, conflicts_with_all = ["history", "fail_on_growth"])]
    pub no_history: bool,
    /// Exit with status 3 when a phase grew since the last recorded run.
    #[arg(long)]
    pub fail_on_growth: bool,
}

impl HistoryArgs {
    /// Runs the check on `records` as asked, printing its table; says whether to fail. A
    /// history that cannot be read or written is an error with `--fail-on-growth` (the check
    /// was asked for and could not be made); otherwise a warning naming it, after the
    /// benchmark's own tables.
    pub fn run(&self, records: &[Record]) -> Result<bool> {
        if self.no_history || records.is_empty() {
            return Ok(false);
        }
        let Some(dir) = self.history.clone().or_else(default_dir) else {
            eprintln!("storm-bench: no --history and no HOME: the run is not compared or kept");
            return Ok(false);
        };
        match check(&dir, records) {
            Ok((table, grown)) => {
                println!("{}", table.render());
                Ok(grown > 0 && self.fail_on_growth)
            }
            Err(e) if !self.fail_on_growth => {
                eprintln!(
                    "storm-bench: the run is not compared with the last one or kept: {e:#} \
                     (--history DIR keeps it elsewhere, --no-history not at all)"
                );
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// Seconds since the epoch, now.
pub fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(baseline_s: f64, phases: &[(&str, f64)]) -> Record {
        Record {
            key: "launch-12MB-8N-tcp".into(),
            when_unix_s: 1,
            baseline: "floor".into(),
            baseline_s,
            phases: phases.iter().map(|(p, s)| (p.to_string(), *s)).collect(),
        }
    }

    #[test]
    fn a_phase_that_doubled_against_the_same_baseline_is_named() {
        let last = record(0.010, &[("send", 0.020), ("journal", 0.002)]);
        let now = record(0.010, &[("send", 0.021), ("journal", 0.004)]);
        let grew: Vec<String> = compare(&last, &now)
            .into_iter()
            .filter(|c| c.grew)
            .map(|c| c.phase)
            .collect();
        assert_eq!(grew, ["journal"]);
    }

    #[test]
    fn a_phase_that_grew_with_its_baseline_is_the_machine_not_storm() {
        // The host was twice as slow: the floor and every phase doubled.
        let last = record(0.010, &[("send", 0.020), ("journal", 0.002)]);
        let now = record(0.020, &[("send", 0.040), ("journal", 0.004)]);
        assert!(compare(&last, &now).iter().all(|c| !c.grew));
    }

    #[test]
    fn a_tiny_phase_tripling_is_noise() {
        let last = record(0.010, &[("verify", 0.000_050)]);
        let now = record(0.010, &[("verify", 0.000_150)]);
        let c = &compare(&last, &now)[0];
        assert!(c.relative > 2.9 && !c.grew, "{c:?}");
    }

    #[test]
    fn a_phase_growing_by_less_than_a_fiftieth_of_the_whole_is_noise() {
        let last = record(0.030, &[("queued", 0.000_035), (WHOLE, 0.180)]);
        let now = record(0.030, &[("queued", 0.000_293), (WHOLE, 0.180)]);
        assert!(compare(&last, &now).iter().all(|c| !c.grew));
        let now = record(0.030, &[("queued", 0.004), (WHOLE, 0.184)]);
        assert!(compare(&last, &now)[0].grew);
    }

    #[test]
    fn check_names_growth_once_then_compares_with_the_new_run() {
        let dir = tempfile::tempdir().unwrap();
        let last = record(0.010, &[("send", 0.020)]);
        let (_, grown) = check(dir.path(), std::slice::from_ref(&last)).unwrap();
        assert_eq!(grown, 0, "a first run has nothing to compare with");
        let slower = record(0.010, &[("send", 0.050)]);
        let (table, grown) = check(dir.path(), std::slice::from_ref(&slower)).unwrap();
        assert_eq!(grown, 1);
        assert!(table.render().contains("send GREW"), "{}", table.render());
        // The slower run is now the last one: the same figure again is no regression.
        let (_, grown) = check(dir.path(), &[slower]).unwrap();
        assert_eq!(grown, 0);
    }

    #[test]
    fn an_unwritable_history_fails_the_run_only_when_the_check_was_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the history's directory should be.
        let history = dir.path().join("not-a-dir");
        std::fs::write(&history, "").unwrap();
        let r = record(0.010, &[("send", 0.020)]);
        let args = |fail_on_growth| HistoryArgs {
            history: Some(history.clone()),
            no_history: false,
            fail_on_growth,
        };
        assert!(!args(false).run(std::slice::from_ref(&r)).unwrap());
        let err = format!("{:#}", args(true).run(&[r]).unwrap_err());
        assert!(err.contains("not-a-dir"), "{err}");
    }

    #[test]
    fn a_damaged_record_is_an_error_that_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(0.010, &[("send", 0.020)]);
        std::fs::write(dir.path().join(file_name(&r.key)), "{not json").unwrap();
        let err = format!("{:#}", check(dir.path(), &[r]).unwrap_err());
        assert!(err.contains("launch-12MB-8N-tcp.json"), "{err}");
    }
}
