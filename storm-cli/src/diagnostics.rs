//! Reading what NMs log for tests and benchmarks: with `[scheduler] heartbeat_log`, each NM
//! appends `SEQ RECV_NS` to `<spool>/heartbeats.log` for every heartbeat it takes.

use std::path::Path;

use anyhow::{Context, Result};

/// When the NM whose spool is `spool` took each heartbeat (CLOCK_MONOTONIC, nanoseconds;
/// [`storm_cluster::daemon::monotonic_ns`]), in order.
pub fn heartbeat_times(spool: &Path) -> Result<Vec<u128>> {
    let path = spool.join("heartbeats.log");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .map(|line| {
            line.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("malformed line in {}: {line:?}", path.display()))
        })
        .collect()
}
