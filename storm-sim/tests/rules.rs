//! The machine manager's rules, in virtual time: each test states a rule exactly, at the
//! timeslice it must hold, and runs the same on every machine however loaded.

use std::time::Duration;

use storm_cluster::config::PolicyKind;
use storm_cluster::control::NodeState;
use storm_cluster::control::Reply;
use storm_cluster::messages::{Command, OutputChunk, RankStatus, Stream, encode};
use storm_nm::JobState;
use storm_primitives::helpers::QueueProducer;
use storm_primitives::{NodeSet, Primitives};
use storm_sim::{Sim, SimJob, SimOptions, TransferModel};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_job_runs_for_its_work_and_ends_with_its_tasks_statuses() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let job = s.submit(&SimJob::new(4, ms(200))).unwrap();
    assert!(s.run_until(ms(2_000), |s| s.outcome(job).is_some()));
    let out = s.outcome(job).unwrap();
    assert_eq!(out.reason, None);
    assert_eq!(out.ranks.len(), 4);
    assert!(
        out.ranks.iter().all(|r| *r == Some(RankStatus::Exited(0))),
        "{out:?}"
    );
    let started = s.started(job)[0];
    let ended = s.finished(job).unwrap().0;
    let took = ended - started;
    assert!(
        took >= ms(200) && took <= ms(200) + 4 * s.config().timeslice(),
        "a 200 ms job took {took:?} from start to outcome"
    );
}

/// Paper Sec. 2.4.3: a node that takes no heartbeat for K periods is DOWN, not one
/// timeslice earlier.
#[test]
fn a_frozen_node_is_down_at_exactly_k_missed_heartbeats() {
    let k = 5;
    let mut s = Sim::up(SimOptions {
        missed_heartbeats: k,
        record: true,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    s.run_for(ms(100));
    s.freeze(2, true);
    let last = s.node(2).heard().last().expect("node 2 took heartbeats").at;
    let slice = s.config().timeslice();
    let due = last + slice * k;
    assert!(s.run_until(ms(5_000), |s| s.state(2).state == NodeState::Down));
    assert_eq!(
        s.now(),
        due,
        "DOWN {:?} after its last heartbeat, not K = {k} periods ({:?})",
        s.now() - last,
        slice * k
    );
    assert!(
        s.state(2)
            .reason
            .unwrap()
            .contains("took no heartbeat for 5")
    );
    for n in [0, 1, 3] {
        assert_eq!(
            s.state(n).state,
            NodeState::Idle,
            "node {n} must not be blamed"
        );
    }
}

/// The same rule wherever the MM's heartbeat queue stands: every eighth heartbeat the MM
/// first asks every member for space (AWAIT-SPACE, a COMPARE-AND-WRITE). A node that does not
/// answer that question by the deadline misses the heartbeat as surely as one that does not
/// take the transfer; it is not left for the receipt check, which comes up to 100 ms later
/// (that made DOWN 6 periods late at some phases).
#[test]
fn a_frozen_node_is_down_at_k_whatever_the_heartbeat_queues_phase() {
    let k = 3;
    let slots = Sim::up(SimOptions::default())
        .expect("a simulated cluster, every node up")
        .config()
        .cluster
        .heartbeat_slots as u32;
    for phase in 0..slots {
        let mut s = Sim::up(SimOptions {
            nodes: 4,
            missed_heartbeats: k,
            record: true,
            ..SimOptions::default()
        })
        .expect("a simulated cluster, every node up");
        let slice = s.config().timeslice();
        s.run_for(slice * (20 + phase));
        s.freeze(3, true);
        let last = s.node(3).heard().last().expect("node 3 took heartbeats").at;
        assert!(s.run_until(ms(5_000), |s| s.state(3).state == NodeState::Down));
        assert_eq!(
            s.now() - last,
            slice * k,
            "at phase {phase}: DOWN {:?} after the last heartbeat node 3 took, not K = {k} periods",
            s.now() - last
        );
    }
}

#[test]
fn a_thawed_node_registers_again_and_takes_jobs() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    s.freeze(1, true);
    assert!(s.run_until(ms(5_000), |s| s.state(1).state == NodeState::Down));
    s.freeze(1, false);
    assert!(
        s.run_until(ms(5_000), |s| s.state(1).state == NodeState::Idle),
        "node 1 did not rejoin: {:?}",
        s.state(1)
    );
    let job = s.submit(&SimJob::new(4, ms(50))).unwrap();
    assert!(s.run_until(ms(2_000), |s| s.outcome(job).is_some()));
    assert_eq!(
        s.outcome(job).unwrap().reason,
        None,
        "the rejoined node ran its task"
    );
}

/// A pulled cable, the NM running on behind it: the node is DOWN at K missed heartbeats like
/// a stopped one, its job ends naming it, and once mended the NM registers again, learns that
/// its job is gone (and drops it), and the node takes work.
#[test]
fn a_cut_node_is_down_at_k_and_its_running_nm_rejoins_without_the_ended_job_once_mended() {
    let k = 4;
    let mut s = Sim::up(SimOptions {
        missed_heartbeats: k,
        record: true,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let job = s.submit(&SimJob::new(4, ms(60_000))).unwrap();
    assert!(s.run_until(ms(1_000), |s| s.node(3).running(job)));
    s.cut(3, true);
    let last = s.node(3).heard().last().unwrap().at;
    assert!(s.run_until(ms(5_000), |s| s.state(3).state == NodeState::Down));
    assert_eq!(s.now(), last + s.config().timeslice() * k);
    assert!(s.run_until(ms(5_000), |s| s.outcome(job).is_some()));
    let reason = s.outcome(job).unwrap().reason.clone().unwrap_or_default();
    assert!(reason.contains(&s.config().nodes[3].name), "{reason}");
    assert!(
        s.node(3).running(job),
        "behind the cut the NM cannot hear the end, so its task runs on"
    );
    s.cut(3, false);
    assert!(
        s.run_until(ms(5_000), |s| s.state(3).state == NodeState::Idle),
        "node 3 did not rejoin: {:?}",
        s.state(3)
    );
    assert!(
        s.node(3).jobs().is_empty(),
        "the rejoined NM kept the ended job: {:?}",
        s.node(3).jobs()
    );
    let next = s.submit(&SimJob::new(4, ms(50))).unwrap();
    assert!(s.run_until(ms(2_000), |s| s.outcome(next).is_some()));
    assert_eq!(s.outcome(next).unwrap().reason, None);
}

/// `--requeue`: a job whose node dies goes back to the queue and runs again on the nodes that
/// are left; without it, the job ends with a reason naming the node.
#[test]
fn a_job_on_a_node_that_dies_is_requeued_only_if_it_asked() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let kept = s
        .submit(&SimJob {
            requeue: true,
            ..SimJob::new(2, ms(10_000))
        })
        .unwrap();
    let lost = s.submit(&SimJob::new(2, ms(10_000))).unwrap();
    s.run_for(ms(100));
    let nodes_of = |s: &Sim, job| {
        s.mm()
            .queue_view()
            .into_iter()
            .find(|j| j.job == job)
            .map(|j| j.nodes)
    };
    let kept_node = nodes_of(&s, kept).unwrap().iter().next().unwrap();
    let lost_node = nodes_of(&s, lost).unwrap().iter().next().unwrap();
    s.kill(kept_node);
    s.kill(lost_node);
    let requeued = |s: &Sim, job| {
        s.replies
            .iter()
            .any(|(_, r)| matches!(r, Reply::Requeued { job: j, .. } if *j == job))
    };
    assert!(s.run_until(ms(5_000), |s| s.outcome(lost).is_some()
        && requeued(s, kept)));
    let reason = s.outcome(lost).unwrap().reason.clone().unwrap_or_default();
    let name = &s.config().nodes[lost_node as usize].name;
    assert!(
        reason.contains(name.as_str()),
        "the reason names {name}: {reason}"
    );
    assert!(
        !requeued(&s, lost),
        "a job without --requeue went back to the queue"
    );
    assert!(s.run_until(ms(5_000), |s| s.started(kept).len() == 2));
    let again = nodes_of(&s, kept).unwrap();
    for dead in [kept_node, lost_node] {
        assert!(
            !again.contains(dead),
            "ran again on the dead node {dead}: {again}"
        );
    }
}

/// A cancelled job gets SIGTERM, then SIGKILL exactly `kill_wait_ms` later if it has not
/// ended (both go out with the heartbeat of the timeslice that decides them).
#[test]
fn sigkill_follows_sigterm_after_kill_wait() {
    let wait = ms(300);
    let mut s = Sim::up(SimOptions {
        kill_wait: wait,
        record: true,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let job = s
        .submit(&SimJob {
            ignore_sigterm: true,
            ..SimJob::new(2, ms(60_000))
        })
        .unwrap();
    s.run_for(ms(100));
    s.cancel(job);
    assert!(s.run_until(ms(5_000), |s| s.outcome(job).is_some()));
    let nodes = s.outcome(job).unwrap().ranks.len();
    assert_eq!(nodes, 2);
    let signals = |sig| {
        s.node(0)
            .heard()
            .iter()
            .find(|h| {
                h.commands
                    .iter()
                    .any(|c| matches!(c, Command::Signal { signal, .. } if *signal == sig))
            })
            .map(|h| h.at)
            .expect("signal sent")
    };
    let (term, kill) = (signals(libc::SIGTERM), signals(libc::SIGKILL));
    assert!(
        kill - term == wait,
        "SIGKILL came {:?} after SIGTERM; kill_wait is {wait:?}",
        kill - term
    );
    let out = s.outcome(job).unwrap();
    assert!(
        out.ranks
            .iter()
            .all(|r| *r == Some(RankStatus::Signaled(libc::SIGKILL))),
        "{out:?}"
    );
}

/// A job that never got SIGTERM-proof is ended by SIGTERM alone: no SIGKILL goes out.
#[test]
fn a_job_that_ends_on_sigterm_gets_no_sigkill() {
    let mut s = Sim::up(SimOptions {
        record: true,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let job = s.submit(&SimJob::new(1, ms(60_000))).unwrap();
    s.run_for(ms(50));
    s.cancel(job);
    assert!(s.run_until(ms(5_000), |s| s.outcome(job).is_some()));
    s.run_for(ms(1_000));
    let kills = (0..4)
        .flat_map(|n| s.node(n).heard().to_vec())
        .flat_map(|h| h.commands)
        .filter(|c| matches!(c, Command::Signal { signal, .. } if *signal == libc::SIGKILL))
        .count();
    assert_eq!(kills, 0);
}

/// The time limit is enforced in virtual time: cancelled once it passes, not before.
#[test]
fn a_job_is_cancelled_when_its_time_limit_passes() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let job = s
        .submit(&SimJob {
            time_limit: Some(ms(1_000)),
            ..SimJob::new(1, ms(60_000))
        })
        .unwrap();
    let started = s.started(job)[0];
    assert!(s.run_until(ms(5_000), |s| s.outcome(job).is_some()));
    let out = s.outcome(job).unwrap();
    assert!(
        out.reason.as_deref().unwrap_or("").contains("time limit"),
        "{out:?}"
    );
    let ended = s.finished(job).unwrap().0;
    assert!(
        ended - started >= ms(1_000),
        "ended {:?} after it started",
        ended - started
    );
}

#[test]
fn the_same_workload_gives_the_same_history() {
    fn history() -> Vec<(Duration, String)> {
        let mut s = Sim::up(SimOptions {
            policy: PolicyKind::Easy,
            ..SimOptions::default()
        })
        .expect("a simulated cluster, every node up");
        let t0 = s.now();
        for (i, n) in [3u32, 1, 4, 2, 2, 1, 4].iter().enumerate() {
            s.submit(&SimJob::new(*n, ms(37 * (i as u64 + 1)))).unwrap();
        }
        s.run_for(ms(3_000));
        s.replies
            .iter()
            .map(|(t, r)| (*t - t0, format!("{r:?}")))
            .collect()
    }
    assert_eq!(history(), history());
}

/// Gang scheduling (paper Sec. 3.3): every heartbeat carries the strobe, every node runs what
/// the MM's policy decided for that timeslice, and over 10,000 slices jobs that share nodes
/// take turns, one at a time, in equal shares.
#[test]
fn gang_strobes_carry_the_policys_decisions_for_10000_slices() {
    let mut s = Sim::up(SimOptions {
        policy: PolicyKind::Gang,
        mpl: 3,
        record: true,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let jobs: Vec<_> = (0..3)
        .map(|_| s.submit(&SimJob::new(4, ms(3_600_000))).unwrap())
        .collect();
    s.run_for(ms(100));
    let first = s.node(3).heard().len();
    let mut decided = Vec::new();
    for _ in 0..10_000 {
        s.step();
        decided.push(s.mm().run_set().to_vec());
    }
    for n in 0..4 {
        let heard = &s.node(n).heard()[first..];
        assert_eq!(heard.len(), 10_000, "node {n} missed strobes");
        for (h, want) in heard.iter().zip(&decided) {
            let strobes: Vec<_> = h
                .commands
                .iter()
                .filter_map(|c| match c {
                    Command::Schedule { run, .. } => Some(run),
                    _ => None,
                })
                .collect();
            assert_eq!(strobes, vec![want], "node {n}, heartbeat {}", h.seq);
        }
    }
    for job in &jobs {
        let share = decided.iter().filter(|run| run.contains(job)).count();
        assert!(
            (3_300..=3_367).contains(&share),
            "job {job} ran {share} of 10,000 slices"
        );
    }
    assert!(
        decided.iter().all(|run| run.len() == 1),
        "jobs sharing nodes ran together"
    );
    assert!(jobs.iter().all(|j| s.outcome(*j).is_none()));
}

/// The NM's side of gang scheduling: a node never runs two slots' tasks at once, and a task
/// makes progress only in its own slots (two jobs of 200 ms sharing nodes both end after
/// about 400 ms, not 200).
#[test]
fn a_gang_job_runs_only_in_its_own_time_slots() {
    let mut s = Sim::up(SimOptions {
        policy: PolicyKind::Gang,
        mpl: 2,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let a = s.submit(&SimJob::new(4, ms(200))).unwrap();
    let b = s.submit(&SimJob::new(4, ms(200))).unwrap();
    let mut suspended = 0;
    while s.outcome(a).is_none() || s.outcome(b).is_none() {
        assert!(s.elapsed() < ms(5_000), "the two jobs did not end");
        s.step();
        for n in 0..4 {
            let node = s.node(n);
            assert!(
                !(node.running(a) && node.running(b)),
                "node {n} runs both time slots at {:?}",
                s.elapsed()
            );
            suspended += [a, b]
                .iter()
                .filter(|&&j| node.job_state(j) == Some(JobState::Suspended))
                .count();
        }
    }
    assert!(suspended > 0, "no job was ever suspended on its nodes");
    let slice = s.config().timeslice();
    let begin = s.started(a)[0].min(s.started(b)[0]);
    for job in [a, b] {
        assert_eq!(s.outcome(job).unwrap().reason, None);
        let took = s.finished(job).unwrap().0 - begin;
        assert!(
            took >= ms(390) && took <= ms(400) + 4 * slice,
            "job {job}: 200 ms of work in alternate slots took {took:?}"
        );
    }
}

/// A welcome the MM sends again (the node's acknowledgement was lost) keeps the node's
/// output queue as it is. The NM sends output from its first welcome on; a consumer reset to
/// the epoch's start would look for entries the producer has long overwritten and pass on
/// nothing more from that node, so the end of a job's output was lost (seen under 10% packet
/// loss in storm-cli's chaos tests).
#[test]
fn a_welcome_sent_again_keeps_the_nodes_output_queue() {
    let mut s = Sim::up(SimOptions {
        nodes: 1,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let k = s.config().failure.missed_heartbeats;
    let slice = s.config().timeslice();
    // The node leaves the heartbeat and registers again: a new membership, a new epoch.
    s.freeze(0, true);
    assert!(s.run_until(slice * (k + 5), |s| s.state(0).state == NodeState::Down));
    s.freeze(0, false);
    assert!(s.run_until(ms(5_000), |s| s.state(0).state == NodeState::Joining));
    // The NM took the welcome and acknowledged it in this timeslice; the MM reads the
    // acknowledgement in the next one. Lose it.
    let mm = s.fabric().node(s.config().mm_id());
    let rm = s.layout().clone();
    mm.memory().store(rm.join_ack.at(0), 0);
    let queue = rm.output[0];
    let epoch = (mm.memory().load(queue.dequeued) >> 32) as u32;
    let node = s.fabric().node(0);
    let mut producer = QueueProducer::new(queue, NodeSet::single(s.config().mm_id()), epoch);
    let mut send = |s: &mut Sim, i: u64| {
        let chunk = OutputChunk {
            job: 999,
            rank: 0,
            stream: Stream::Stdout,
            offset: i,
            data: vec![b'x'],
        };
        let bytes = encode("output", &chunk, queue.slot_payload).unwrap();
        producer
            .enqueue(&node, &bytes, Some(rm.output_sent))
            .expect("room in the output queue");
        s.step();
        producer.next_seq()
    };
    // More entries than the queue has slots, each passed on (to nobody: job 999 is unknown)
    // and released by the MM.
    for i in 0..queue.slot_count as u64 + 2 {
        let sent = send(&mut s, i);
        assert_eq!(mm.memory().load(queue.dequeued), sent, "entry {i} released");
    }
    // The MM welcomes again, the NM acknowledges again, and it is a member.
    assert!(s.run_until(ms(3_000), |s| s.state(0).state == NodeState::Idle));
    let sent = send(&mut s, 100);
    assert_eq!(
        mm.memory().load(queue.dequeued),
        sent,
        "the entry sent after the repeated welcome was taken and released"
    );
}

/// A restarted MM takes up what its journal held: a running job goes on (its nodes
/// re-register and keep it) and ends normally; a queued job still runs.
#[test]
fn running_and_queued_jobs_survive_a_restart_of_the_mm() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let running = s.submit(&SimJob::new(4, ms(1_000))).unwrap();
    let queued = s.submit(&SimJob::new(2, ms(100))).unwrap();
    s.run_for(ms(200));
    assert!(s.node(0).running(running));
    s.restart_mm().unwrap();
    assert!(s.run_until(ms(10_000), |s| s.outcome(running).is_some()));
    assert_eq!(
        s.outcome(running).unwrap().reason,
        None,
        "{:?}",
        s.outcome(running)
    );
    assert!(s.run_until(ms(10_000), |s| s.outcome(queued).is_some()));
    assert_eq!(
        s.outcome(queued).unwrap().reason,
        None,
        "{:?}",
        s.outcome(queued)
    );
}

/// A queued job whose program storm-submit sent survives a restart of the MM: its program
/// was copied beside the journal before the job was acknowledged, the MM let go of the
/// submitted program then (it holds no descriptor per waiting job), and the restarted MM
/// sends the copy when the job starts. A job that ran at once needed no copy, and every
/// program the MM held is let go of by the end.
#[test]
fn a_queued_job_with_a_program_survives_a_restart_of_the_mm() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let running = s
        .submit(&SimJob::new(4, ms(1_000)).with_program(4 << 20))
        .unwrap();
    let queued = s
        .submit(&SimJob::new(2, ms(100)).with_program(1 << 20))
        .unwrap();
    s.run_for(ms(200));
    assert!(
        s.node(0).running(running),
        "the first job runs on all nodes"
    );
    assert_eq!(
        s.mm().env().programs_held(),
        0,
        "the waiting job's program is read from its copy, not held"
    );
    s.restart_mm().unwrap();
    assert!(s.run_until(ms(10_000), |s| s.outcome(queued).is_some()));
    assert_eq!(
        s.outcome(queued).unwrap().reason,
        None,
        "{:?}",
        s.outcome(queued)
    );
    assert_eq!(s.outcome(queued).unwrap().exit_code(), 0);
    let progress: Vec<(u64, u64)> = s
        .replies()
        .iter()
        .filter_map(|(_, r)| match r {
            Reply::Progress { job, sent, total } if *job == queued => Some((*sent, *total)),
            _ => None,
        })
        .collect();
    assert_eq!(
        progress.last(),
        Some(&(1 << 20, 1 << 20)),
        "the restarted MM sent the whole program: {progress:?}"
    );
    assert!(s.run_until(ms(10_000), |s| s.outcome(running).is_some()));
    assert_eq!(s.outcome(running).unwrap().reason, None);
    assert_eq!(
        s.mm().env().programs_held(),
        0,
        "a program was never let go of"
    );
}

/// A seeded random workload of `count` jobs (sizes 1..=4 nodes, work 10..400 ms), all
/// submitted before the first starts.
fn random_workload(s: &mut Sim, seed: u64, count: usize) -> Vec<u64> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let nodes = rng.random_range(1..=4);
            let work = ms(rng.random_range(10..400));
            let job = SimJob {
                time_limit: Some(work + ms(200)),
                ..SimJob::new(nodes, work)
            };
            s.submit(&job).unwrap()
        })
        .collect()
}

/// FCFS: no job starts before one submitted earlier; every job ends, none by its time limit.
#[test]
fn fcfs_starts_jobs_in_submission_order_under_random_workloads() {
    for seed in 1..=5 {
        let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
        let jobs = random_workload(&mut s, seed, 40);
        assert!(
            s.run_until(ms(60_000), |s| jobs.iter().all(|j| s.outcome(*j).is_some())),
            "seed {seed}: not every job ended"
        );
        let starts: Vec<_> = jobs.iter().map(|j| s.started(*j)[0]).collect();
        assert!(
            starts.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: a job started before an earlier one"
        );
        for j in &jobs {
            assert_eq!(s.outcome(*j).unwrap().reason, None, "seed {seed}, job {j}");
        }
    }
}

/// EASY backfilling and gang scheduling: every job of a random workload ends, none is
/// starved, and EASY lets some later job start before an earlier one (it backfills).
#[test]
fn easy_and_gang_finish_every_job_of_random_workloads() {
    let mut backfilled = false;
    for (policy, seed) in [
        (PolicyKind::Easy, 1),
        (PolicyKind::Easy, 2),
        (PolicyKind::Gang, 3),
    ] {
        let mut s = Sim::up(SimOptions {
            policy,
            mpl: 2,
            ..SimOptions::default()
        })
        .expect("a simulated cluster, every node up");
        let jobs = random_workload(&mut s, seed, 40);
        assert!(
            s.run_until(ms(120_000), |s| jobs
                .iter()
                .all(|j| s.outcome(*j).is_some())),
            "{policy:?}, seed {seed}: not every job ended"
        );
        if policy == PolicyKind::Easy {
            let starts: Vec<_> = jobs.iter().map(|j| s.started(*j)[0]).collect();
            backfilled |= starts.windows(2).any(|w| w[1] < w[0]);
            for j in &jobs {
                assert_eq!(s.outcome(*j).unwrap().reason, None, "seed {seed}, job {j}");
            }
        }
    }
    assert!(
        backfilled,
        "EASY never started a later job ahead of an earlier one"
    );
}

/// A job that sends its program (storm-submit's default) waits for the transfer, which takes
/// the launch model's time, and for the MM to find every node's acknowledgement at its next
/// heartbeat; the launch follows in the heartbeat after. Nothing else stands in between.
#[test]
fn a_job_launches_a_heartbeat_after_its_program_reached_every_node() {
    let slice = ms(1);
    let mut s = Sim::up(SimOptions {
        nodes: 64,
        timeslice: slice,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let bytes = 12_000_000;
    let transfer = TransferModel::default().time(64, bytes);
    let job = s
        .submit(&SimJob::new(64, Duration::ZERO).with_program(bytes))
        .unwrap();
    assert!(s.run_until(ms(5_000), |s| s.outcome(job).is_some()));
    let o = s.outcome(job).unwrap();
    assert_eq!(o.exit_code(), 0, "{o:?}");
    let t = &o.timing;
    let send = Duration::from_micros(t.send_us);
    assert!(
        send >= transfer && send <= transfer + slice * 2,
        "program ready {send:?} after allocation; the transfer takes {transfer:?}"
    );
    assert!(
        Duration::from_micros(t.execute_us) <= slice * 3,
        "a task of no work: launch, report and detection take a few heartbeats, not {t:?}"
    );
    assert_eq!(
        t.total_us,
        t.queued_us + t.send_us + t.execute_us,
        "the launch heartbeat leaves in the timeslice that found the program ready: {t:?}"
    );
}

/// The outcome's timing comes from when the tasks ran on the nodes: a 200 ms job's tasks
/// start in the step that took the launch heartbeat and run exactly their work; the MM
/// learns of their end within the timeslices termination detection takes.
#[test]
fn the_outcome_times_start_run_and_report_from_the_nodes() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let slice = s.config().timeslice();
    let job = s.submit(&SimJob::new(4, ms(200))).unwrap();
    assert!(s.run_until(ms(2_000), |s| s.outcome(job).is_some()));
    let t = s.outcome(job).unwrap().timing;
    assert_eq!(t.start_us, 0, "{t:?}");
    assert_eq!(t.run_us, 200_000, "{t:?}");
    assert!(t.report_us <= 3 * slice.as_micros() as u64, "{t:?}");
    assert_eq!(t.start_us + t.run_us + t.report_us, t.execute_us, "{t:?}");
    assert_eq!(
        t.queued_us + t.send_us + t.launch_us + t.execute_us,
        t.total_us,
        "{t:?}"
    );
    // The parts (issue 64's phase table): each within the phase it belongs to, in order.
    assert!(t.record_us <= t.launch_us, "{t:?}");
    assert!(
        t.verified_us <= t.prepared_us && t.prepared_us <= t.asked_us,
        "{t:?}"
    );
    assert!(t.asked_us <= t.start_us + t.run_us, "{t:?}");
    assert!(
        t.reported_us >= t.start_us + t.run_us && t.reported_us <= t.execute_us,
        "the node wrote its report after its tasks ended and before the MM saw it: {t:?}"
    );
}

/// A task's end is reported once the NM knows its exit status, which its launcher writes a
/// moment after the task's streams closed (it reaps the task first). The NM, woken by the
/// streams, looks again soon for the status, sooner than its next heartbeat, and less often
/// the longer it waits; once the job is reported it waits for heartbeats again.
#[test]
fn an_nm_looks_again_soon_for_the_status_of_a_task_whose_output_drained() {
    let slice = ms(20);
    let mut s = Sim::up(SimOptions {
        nodes: 1,
        timeslice: slice,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let idle = s.node(0).poll_timeout();
    assert!(idle >= slice, "an idle NM waits {idle:?}");
    let job = s
        .submit(&SimJob::new(1, ms(5)).with_reap_delay(ms(200)))
        .unwrap();
    assert!(
        s.run_until(ms(1_000), |s| s.node(0).poll_timeout() < slice),
        "the NM waited for its next heartbeat to learn the task's status"
    );
    let first = s.node(0).poll_timeout();
    s.step();
    assert!(
        s.outcome(job).is_none(),
        "reported before the status was known"
    );
    let later = s.node(0).poll_timeout();
    assert!(
        later > first,
        "the looks do not space out ({first:?}, then {later:?})"
    );
    assert!(s.run_until(ms(1_000), |s| s.outcome(job).is_some()));
    assert_eq!(s.outcome(job).unwrap().exit_code(), 0);
    assert_eq!(s.node(0).poll_timeout(), idle);
}

/// Issue 64: an idle cluster is not woken every timeslice. With nothing new to say (no
/// command, the same members), the MM sends a heartbeat only each quiet period
/// (`[failure] quiet_heartbeat_ms`, 50 ms at the defaults); yet a job submitted meanwhile
/// starts at the usual cadence, and a node that freezes is still DOWN exactly K periods
/// after the last heartbeat it took.
#[test]
fn an_idle_cluster_is_heartbeat_each_quiet_period_yet_jobs_and_failures_keep_their_times() {
    let slice = ms(1);
    let k = 1000;
    let mut s = Sim::up(SimOptions {
        timeslice: slice,
        missed_heartbeats: k,
        record: true,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let quiet = s.config().quiet_heartbeat_period();
    assert_eq!(quiet, ms(50), "the defaults' quiet period");
    s.run_for(ms(100));
    let from = s.now();
    s.run_for(ms(1_000));
    let taken: Vec<_> = s
        .node(1)
        .heard()
        .iter()
        .map(|h| h.at)
        .filter(|&at| at >= from)
        .collect();
    assert!(
        (19..=21).contains(&taken.len()),
        "{} heartbeats in 1 s of an idle cluster, not one per {quiet:?}",
        taken.len()
    );
    for pair in taken.windows(2) {
        assert!(
            pair[1] - pair[0] <= quiet,
            "{:?} between two heartbeats of an idle cluster",
            pair[1] - pair[0]
        );
    }
    // Between two quiet heartbeats: the job's launch does not wait for the next one.
    s.run_for(ms(7));
    let submitted = s.now();
    let job = s.submit(&SimJob::new(4, ms(20))).unwrap();
    assert!(s.run_until(ms(1_000), |s| !s.started(job).is_empty()));
    let waited = s.started(job)[0] - submitted;
    assert!(
        waited <= slice * 5,
        "a job submitted to an idle cluster started {waited:?} later"
    );
    assert!(s.run_until(ms(1_000), |s| s.outcome(job).is_some()));
    // Idle again: a node that freezes now is DOWN K periods after its last heartbeat.
    s.run_for(ms(200));
    s.freeze(2, true);
    let last = s.node(2).heard().last().expect("node 2 took heartbeats").at;
    assert!(s.run_until(ms(5_000), |s| s.state(2).state == NodeState::Down));
    assert_eq!(
        s.now(),
        last + slice * k,
        "DOWN {:?} after its last heartbeat",
        s.now() - last
    );
}
