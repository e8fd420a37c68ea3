//! The phase table: where a storm job's time went, from the [`Timing`] of each job's outcome
//! (the MM's clock, and each node's own from its taking the launch heartbeat). `storm-bench
//! launch` and `storm-bench throughput` print it with the same columns, so a phase that grows
//! is named whichever benchmark shows it.

use storm_cluster::control::Timing;

use crate::report::Table;
use crate::stats::fmt_time;

/// The columns after the row's label, in the order a job goes through them.
pub const COLUMNS: &[&str] = &[
    "queued",
    "send",
    "journal",
    "heartbeat",
    "verify",
    "ready",
    "hand over",
    "fork",
    "run",
    "node report",
    "MM sees",
    "MM total",
    "client",
];

/// What the columns mean, for a table's title.
pub const LEGEND: &str = "queued to nodes allocated, program sent (and checked on every \
    node), start recorded in the journal, launch heartbeat issued; on the node: seal checked, \
    job readied (program and PMI), tasks handed to the launcher (cgroup), first task forked; \
    its run; its report written (the node) and seen by the MM; the client's own part \
    (connect, submit, reply) is submit-to-exit less the MM's total";

/// The median of one part of the jobs' timings, in seconds.
pub fn median_us(timings: &[Timing], part: impl Fn(&Timing) -> u64) -> f64 {
    let mut v: Vec<u64> = timings.iter().map(part).collect();
    v.sort_unstable();
    v.get(v.len() / 2).map_or(f64::NAN, |&us| us as f64 / 1e6)
}

/// Each phase's median, in seconds, in [`COLUMNS`]' order; `client_s` is the median time
/// from submission to the submitter's exit, of which the MM's total is subtracted.
pub fn medians(timings: &[Timing], client_s: f64) -> Vec<f64> {
    let t = timings;
    vec![
        median_us(t, |t| t.queued_us),
        median_us(t, |t| t.send_us),
        median_us(t, |t| t.record_us),
        median_us(t, |t| t.launch_us.saturating_sub(t.record_us)),
        median_us(t, |t| t.verified_us),
        median_us(t, |t| t.prepared_us.saturating_sub(t.verified_us)),
        median_us(t, |t| t.asked_us.saturating_sub(t.prepared_us)),
        median_us(t, |t| t.start_us.saturating_sub(t.asked_us)),
        median_us(t, |t| t.run_us),
        median_us(t, |t| {
            t.reported_us
                .saturating_sub(t.start_us.saturating_add(t.run_us))
        }),
        median_us(t, |t| t.execute_us.saturating_sub(t.reported_us)),
        median_us(t, |t| t.total_us),
        client_s - median_us(t, |t| t.total_us),
    ]
}

/// The record the regression check keeps of these timings ([`crate::regress`]): each
/// phase's median, beside the run's own baseline.
pub fn record(
    key: String,
    baseline: &str,
    baseline_s: f64,
    timings: &[Timing],
    client_s: f64,
) -> crate::regress::Record {
    let mut phases: Vec<(String, f64)> = COLUMNS
        .iter()
        .map(|c| c.to_string())
        .zip(medians(timings, client_s))
        .collect();
    phases.push((crate::regress::WHOLE.into(), client_s));
    crate::regress::Record {
        key,
        when_unix_s: crate::regress::now_unix_s(),
        baseline: baseline.into(),
        baseline_s,
        phases,
    }
}

/// A phase table whose first column is `label`.
pub fn table(title: String, label: &str) -> Table {
    let mut columns = vec![label];
    columns.extend_from_slice(COLUMNS);
    Table::new(title, &columns)
}

/// One row: its label, then each phase's median.
pub fn row(label: String, timings: &[Timing], client_s: f64) -> Vec<String> {
    let mut row = vec![label];
    row.extend(medians(timings, client_s).into_iter().map(fmt_time));
    row
}
