//! Gang scheduling when one node takes a heartbeat late (issue 32), seen from the tasks'
//! own run windows in virtual time.
//!
//! Two jobs share four nodes in two time slots. Every heartbeat switches slots on every node
//! at once, except that one node takes one heartbeat late, by a chosen amount: it runs the
//! old slot while the other nodes run the new one, so both jobs run at once, each on part of
//! its nodes. The slot's lease bounds that: a node whose next heartbeat has not come within
//! `slot_grace_ms` of the timeslice's end stops its tasks until it comes. These tests state
//! the bound, and show that without the lease the same late heartbeat breaks it.

use std::time::{Duration, Instant};

use storm_cluster::config::PolicyKind;
use storm_cluster::messages::JobId;
use storm_sim::{Sim, SimJob, SimOptions};

const NODES: u32 = 4;
const LATE_NODE: u32 = 2;
const TIMESLICE: Duration = Duration::from_millis(10);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Intervals of time, sorted and disjoint.
type Windows = Vec<(Instant, Instant)>;

/// The union of `w`, sorted and disjoint.
fn union(mut w: Windows) -> Windows {
    w.retain(|(a, b)| a < b);
    w.sort();
    let mut out: Windows = Vec::new();
    for (a, b) in w {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The intersection of two unions.
fn intersect(x: &Windows, y: &Windows) -> Windows {
    let mut out = Vec::new();
    for &(a, b) in x {
        for &(c, d) in y {
            let (from, to) = (a.max(c), b.min(d));
            if from < to {
                out.push((from, to));
            }
        }
    }
    union(out)
}

/// How much of `w` falls in `[from, to)`.
fn measure(w: &Windows, from: Instant, to: Instant) -> Duration {
    w.iter()
        .map(|&(a, b)| b.min(to).saturating_duration_since(a.max(from)))
        .sum()
}

/// When job `job` ran on node `n`: the union of its tasks' windows there.
fn ran_on(s: &Sim, n: u32, job: JobId) -> Windows {
    union(s.node(n).run_windows(job).into_iter().flatten().collect())
}

/// When job `job` ran on any of the cluster's nodes.
fn ran_anywhere(s: &Sim, job: JobId) -> Windows {
    union((0..NODES).flat_map(|n| ran_on(s, n, job)).collect())
}

/// When job `job` ran on every node at once.
fn ran_everywhere(s: &Sim, job: JobId) -> Windows {
    (1..NODES).fold(ran_on(s, 0, job), |all, n| {
        intersect(&all, &ran_on(s, n, job))
    })
}

/// What the tasks saw over `[from, to)`.
#[derive(Debug)]
struct Seen {
    /// Time both jobs ran at once, anywhere: one's ranks ran in the other's slot.
    overlap: Duration,
    /// Per job: time it ran somewhere but not on all its nodes.
    apart: [Duration; 2],
    /// Per job: time it ran on all its nodes at once.
    together: [Duration; 2],
}

fn seen(s: &Sim, jobs: [JobId; 2], from: Instant, to: Instant) -> Seen {
    let any = jobs.map(|j| ran_anywhere(s, j));
    let all = jobs.map(|j| ran_everywhere(s, j));
    Seen {
        overlap: measure(&intersect(&any[0], &any[1]), from, to),
        apart: [0, 1].map(|i| measure(&any[i], from, to) - measure(&all[i], from, to)),
        together: [0, 1].map(|i| measure(&all[i], from, to)),
    }
}

/// A cluster of four nodes in two time slots, each running one rank of two long jobs, past
/// their start; the jobs' ids.
fn two_jobs_taking_turns(slot_grace: Option<Duration>) -> (Sim, [JobId; 2]) {
    let mut s = Sim::new(SimOptions {
        nodes: NODES,
        policy: PolicyKind::Gang,
        mpl: 2,
        timeslice: TIMESLICE,
        slot_grace,
        ..SimOptions::default()
    })
    .unwrap();
    s.run_until_up(Duration::from_secs(5)).unwrap();
    let a = s.submit(&SimJob::new(NODES, ms(3_600_000))).unwrap();
    let b = s.submit(&SimJob::new(NODES, ms(3_600_000))).unwrap();
    assert!(
        s.run_until(ms(1_000), |s| (0..NODES).all(|n| [a, b]
            .iter()
            .all(|&j| !s.node(n).run_windows(j).is_empty()))),
        "both jobs did not start on every node"
    );
    s.run_for(ms(100));
    (s, [a, b])
}

/// One node takes the next heartbeat `late`; what the tasks saw from just before it until
/// 100 ms after, and the grace the cluster was configured with.
fn one_late_heartbeat(slot_grace: Option<Duration>, late: Duration) -> Seen {
    let (mut s, jobs) = two_jobs_taking_turns(slot_grace);
    let from = s.now();
    s.delay_next_heartbeat(LATE_NODE, late);
    s.run_for(late + ms(100));
    seen(&s, jobs, from, s.now())
}

/// Heartbeats on time: every node switches at once, the two jobs never run at the same time,
/// and each runs on all its nodes whenever it runs, half the time each.
#[test]
fn on_time_heartbeats_keep_every_rank_of_a_job_in_its_own_slot() {
    let (mut s, jobs) = two_jobs_taking_turns(Some(ms(2)));
    let from = s.now();
    s.run_for(ms(500));
    let seen = seen(&s, jobs, from, s.now());
    assert_eq!(seen.overlap, Duration::ZERO, "{seen:?}");
    assert_eq!(seen.apart, [Duration::ZERO; 2], "{seen:?}");
    for together in seen.together {
        assert!(
            together >= ms(240) && together <= ms(260),
            "each job ran on all its nodes for half of 500 ms: {seen:?}"
        );
    }
}

/// A heartbeat late by less than the grace, by more, and by several timeslices: the late
/// node runs the old slot beside the others' new one for at most `slot_grace_ms`, then
/// stops it until the heartbeat comes, and is back in step from the heartbeat on. Without
/// the lease (the code before it) the late node runs the old slot as long as the heartbeat
/// is late, and the jobs run at once for that long.
#[test]
fn a_late_heartbeat_lets_a_jobs_ranks_run_in_different_slots_for_at_most_the_grace() {
    let grace = ms(2);
    for late in [ms(1), ms(5), ms(9), ms(15), ms(25)] {
        let leased = one_late_heartbeat(Some(grace), late);
        assert!(
            leased.overlap <= grace.min(late),
            "heartbeat {late:?} late: the jobs ran at once for {:?}, more than the grace \
             {grace:?} ({leased:?})",
            leased.overlap
        );
        assert!(
            leased.overlap >= grace.min(late),
            "heartbeat {late:?} late: the late node ran its old slot for only {:?} past the \
             timeslice, less than the grace {grace:?} and the lateness ({leased:?})",
            leased.overlap
        );
        let unleased = one_late_heartbeat(None, late);
        // The late node ran the old slot until the heartbeat came: for `late`, less the
        // timeslices in which the slot it ran was the others' slot too.
        assert!(
            unleased.overlap >= late.min(TIMESLICE),
            "without the lease, a heartbeat {late:?} late let the jobs run at once for only \
             {:?} ({unleased:?})",
            unleased.overlap
        );
        if late > grace {
            assert!(unleased.overlap > leased.overlap);
        }
    }
}

/// The late node's jobs are not lost: it rejoins the rotation with the heartbeat, and over
/// the next timeslices each job runs on all its nodes whenever it runs.
#[test]
fn after_a_late_heartbeat_the_late_node_switches_with_the_others_again() {
    let (mut s, jobs) = two_jobs_taking_turns(Some(ms(2)));
    s.delay_next_heartbeat(LATE_NODE, ms(25));
    s.run_for(ms(40));
    let from = s.now();
    s.run_for(ms(200));
    let seen = seen(&s, jobs, from, s.now());
    assert_eq!(seen.overlap, Duration::ZERO, "{seen:?}");
    assert_eq!(seen.apart, [Duration::ZERO; 2], "{seen:?}");
    assert!(
        seen.together.iter().all(|t| *t >= ms(90)),
        "each job ran on all its nodes for half of 200 ms: {seen:?}"
    );
}
