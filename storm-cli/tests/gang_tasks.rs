//! Gang scheduling from the tasks' own view, on a namespace testbed in the default
//! configuration: CPU-bound ranks record the wall-time windows in which they actually ran
//! (`storm_cli::run_windows`), and the test reads the promise of gang scheduling off those
//! windows alone:
//!
//! * two jobs never run at once, anywhere: their overlap is at most 5 % of the shorter run;
//! * a job's ranks run together: each job's co-run fraction is at least 80 % (counted until
//!   the job's first rank finishes: `run_windows`).
//!
//! The testbed's two nodes share the host's two cores with the MM and the kernel's workers,
//! and the probes never leave their CPUs, so any other work on the host (a kernel worker for
//! 2.8 ms, seen with `perf sched`) holds one rank off its core while its peer runs on. That
//! only ever lowers co-run: nothing on the host can put a rank on a CPU the scheduler stopped
//! it from using. So the test makes up to three attempts and needs one of them to reach 80 %
//! co-run, while every attempt must keep the overlap bound. A node that switches out of step
//! fails every attempt: with a 0-3 ms random delay before each SIGCONT the three read
//! 0.64-0.66, and the normal-policy daemons of the original regression fail the first attempt
//! on overlap (0.08-0.14). Idle here one attempt reads 0.89-0.97; CI's host alone once took a
//! single attempt to 0.79, which failed the test when it made one attempt.
//!
//! Both are fractions of the run, not wall-clock limits; `storm-bench gang --part tasks`
//! reports the same figures against their targets. The daemons' own logs (switches.log) are
//! not consulted: they said all was well while the tasks saw a fifth of the run overlap.
//!
//! Needs root (network namespaces); where they cannot be made the test fails and says why,
//! unless STORM_ALLOW_NO_NETNS=1 is set, in which case it prints NOT TESTED.

mod support;

use storm_cli::run_windows::{GangView, ProbeClock, ProbeJobs, build_probe, run_probes};
use storm_cli::testbed::{Testbed, TestbedOptions};
use storm_cluster::config::{FailureSection, PolicyKind, SchedulerSection};
use support::testbed::{can_run, logs, submit, unique_name};

/// Runs `jobs` jobs of one rank per node on a `nodes`-node gang testbed at `quantum_ms`, each
/// rank spinning for `cpu_s` of CPU time, and returns what the ranks saw.
fn tasks_view(nodes: u32, jobs: usize, quantum_ms: f64, cpu_s: f64) -> GangView {
    support::ensure_daemons();
    let work = support::shared_tempdir();
    let probe = build_probe(work.path()).expect("the probe");
    let tb = Testbed::up(&TestbedOptions {
        name: unique_name(),
        nodes,
        // One CPU per node: every job needs the whole node, so jobs take turns.
        cpus: 1,
        dir: work.path().join("testbed"),
        timeslice_ms: quantum_ms,
        scheduler: SchedulerSection {
            policy: PolicyKind::Gang,
            mpl: jobs,
            ..SchedulerSection::default()
        },
        failure: FailureSection::default(),
        managers: 1,
        replication: Default::default(),
        health: Default::default(),
        sysfs: None,
        cluster_name: None,
        federation: Default::default(),
        peers: Vec::new(),
        net: storm_cli::testbed::SINGLE_NET,
        guests: Vec::new(),
        limits: Default::default(),
    })
    .expect("testbed up");
    let out = work.path().join("windows");
    let runs = run_probes(
        || submit(&tb, &[]),
        &probe,
        &out,
        &ProbeJobs {
            nodes,
            ranks_per_node: 1,
            jobs,
            cpu_s,
            quantum_ms,
            clock: ProbeClock::Monotonic,
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&tb)));
    drop(tb);
    let view = GangView::of(&runs);
    eprintln!(
        "{nodes} nodes, {jobs} jobs, {quantum_ms} ms quantum: overlap {:.3}, co-run min {:.3}, \
         run window p50 {:.2} ms p99 {:.2} ms ({} windows), skew p50 {:.2} ms p90 {:.2} ms p99 \
         {:.2} ms",
        view.overlap,
        view.corun_min,
        view.window_p50_ns as f64 / 1e6,
        view.window_p99_ns as f64 / 1e6,
        view.windows,
        view.skew_p50_ns as f64 / 1e6,
        view.skew_p90_ns as f64 / 1e6,
        view.skew_p99_ns as f64 / 1e6,
    );
    view
}

/// How many runs the co-run bound gets (see the module's overview); the overlap bound holds
/// in each.
const ATTEMPTS: usize = 3;

#[test]
fn two_gang_jobs_never_run_at_once_and_each_runs_its_ranks_together() {
    let test = "two_gang_jobs_never_run_at_once_and_each_runs_its_ranks_together";
    if !support::root_or_say(test) || !can_run(test) {
        return;
    }
    let mut coruns = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let view = tasks_view(2, 2, 5.0, 1.5);
        assert!(
            view.windows > 20,
            "the jobs took turns (run windows between switches): {view:?}"
        );
        assert!(
            view.overlap <= 0.05,
            "attempt {attempt}: two jobs ran at once for {:.1} % of the shorter one's run: \
             {view:?}",
            view.overlap * 100.0
        );
        coruns.push(view.corun_min);
        if view.corun_min >= 0.80 {
            return;
        }
        eprintln!(
            "attempt {attempt} of {ATTEMPTS}: a job's ranks ran together for {:.1} % of its \
             run; trying again (the host's other work only ever lowers it)",
            view.corun_min * 100.0
        );
    }
    panic!(
        "in each of {ATTEMPTS} attempts a job's ranks ran together for less than 80 % of its \
         run: {coruns:?}"
    );
}
