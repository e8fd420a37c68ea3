//! What an idle cluster's daemons cost: each daemon's processor time (every thread's, user
//! and system, from the kernel's scheduler statistics) over a window in which no job runs,
//! as a fraction of one core. Issue 64's goal is at most 0.02 core each at a 1 ms timeslice.

use std::time::Duration;

use storm_cli::local::LocalCluster;

use crate::report::Table;

/// Each daemon's name and what it cost idle, in cores.
pub type IdleCost = Vec<(String, f64)>;

/// The most an idle daemon may cost, in cores.
pub const GOAL_CORES: f64 = 0.02;

/// Each daemon's processor time over `window` of an idle cluster, in cores, by name.
pub fn measure(cluster: &LocalCluster, window: Duration) -> IdleCost {
    let daemons: Vec<(String, u32)> = cluster
        .daemon_pids()
        .into_iter()
        .map(|(n, p)| (n.to_string(), p))
        .collect();
    let before: Vec<Option<u64>> = daemons.iter().map(|(_, p)| cpu_ns(*p)).collect();
    let start = std::time::Instant::now();
    std::thread::sleep(window);
    let secs = start.elapsed().as_secs_f64();
    daemons
        .into_iter()
        .zip(before)
        .filter_map(|((name, pid), before)| {
            let used = cpu_ns(pid)?.checked_sub(before?)?;
            Some((name, used as f64 / 1e9 / secs))
        })
        .collect()
}

/// The processor time process `pid` has used so far, every thread's, in nanoseconds
/// (`/proc/PID/task/*/schedstat`'s first field). A thread that ended in the meantime takes
/// its time with it: the daemons here keep theirs.
pub fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum(),
    )
}

/// The table of [`measure`]'s figures beside the goal.
pub fn table(figures: &[(String, f64)], window: Duration, timeslice_ms: f64) -> Table {
    let mut t = Table::new(
        format!(
            "An idle cluster: each daemon's processor time over {:.1} s with no job (timeslice \
             {timeslice_ms} ms), in cores, beside the goal of {GOAL_CORES} core",
            window.as_secs_f64()
        ),
        &["daemon", "cores", "/ goal"],
    );
    for (name, cores) in figures {
        t.push(vec![
            name.clone(),
            format!("{cores:.4}"),
            format!("{:.2}", cores / GOAL_CORES),
        ]);
    }
    t
}
