//! The home MM's flocking rules, in virtual time (docs/federation.md): the real MM core, its
//! peer agent played by the test through the requests the agent sends (`PeerReport`,
//! `FlockOut`, `FlockReport`), and storm-submit's view through the replies.
//!
//! * A `--flock` job goes at once to the peer that offers room; a job that asks nothing
//!   waits `flock_after_ms` first; a `--no-flock` job never goes. The MM sends no more jobs
//!   than the offer has room for until the next offer, except that a flocked job's end
//!   gives its nodes back to its peer's room at once (unless that peer has a queue).
//! * The peer's news reaches the job's submitter under the job's own id: its start, its
//!   output, its end and exit code. News of a job not flocked to that peer is dropped.
//!   Output its submitter has not read past the unread limit is not taken (sent again).
//! * A peer away for `peer_timeout_ms` gives its jobs back: their submitter hears that they
//!   are queued at home again, and they run here once nodes are free.
//! * A flocked job's standard input, from its submitter's connection only, goes to the peer
//!   agent with the job's order, each piece once, at most the input window of it held.
//! * A job larger than its home that names only peers (`--clusters c1`) is sized against
//!   them: taken while a peer it names is large enough or not heard from yet, refused when
//!   none is, and sent to the peer once it offers room. A name that is no peer is refused.

use std::time::Duration;

use storm_cluster::control::{JobOutcome, JobState, Reply, Request, Timing};
use storm_cluster::federation::{FederationSection, Offer, PeerEntry, PeerInfo, PeerState};
use storm_cluster::flock::{Flock, FlockEvent, FlockOrder, FlockUpdate};
use storm_cluster::messages::{JobId, OutputChunk, RankStatus, Stream};
use storm_sim::{Sim, SimJob, SimOptions};

const TIMEOUT: Duration = Duration::from_millis(2000);

fn sim() -> Sim {
    Sim::up(SimOptions {
        nodes: 2,
        federation: FederationSection {
            listen: Some("127.0.0.1:7100".parse().unwrap()),
            advertise_ms: 200,
            peer_timeout_ms: TIMEOUT.as_millis() as u64,
            flock_after_ms: Some(500),
            ..Default::default()
        },
        peers: vec![PeerEntry {
            name: "c1".into(),
            address: "127.0.0.1:7101".parse().unwrap(),
            key_file: "/nonexistent/pair.key".into(),
            lend: false,
            borrow: true,
            flock_user: None,
            same_users: false,
            guest_file: None,
            mm_public_key_file: None,
            priority: 0,
        }],
        ..SimOptions::default()
    })
    .unwrap()
}

/// The agent's report: c1 `up` offering `idle` nodes (of one CPU each), or `down`.
fn report(sim: &mut Sim, idle: Option<u32>) {
    let info = PeerInfo {
        name: "c1".into(),
        address: "127.0.0.1:7101".parse().unwrap(),
        state: if idle.is_some() {
            PeerState::Up
        } else {
            PeerState::Down
        },
        lend: false,
        borrow: true,
        offer: idle.map(|n| Offer {
            idle_nodes: n,
            idle_cpus: n,
            nodes: 4,
            queued: 0,
        }),
        lag_us: Some(300),
        heard_ms_ago: Some(0),
        reason: None,
    };
    let r = sim
        .operator_request(Request::PeerReport(vec![info]))
        .unwrap();
    assert_eq!(r, Reply::Done);
}

fn flocked(sim: &mut Sim) -> Vec<FlockOrder> {
    match sim.operator_request(Request::FlockOut).unwrap() {
        Reply::FlockOut(o) => o,
        other => panic!("{other:?}"),
    }
}

fn tell(sim: &mut Sim, peer: &str, job: JobId, events: Vec<FlockEvent>) {
    let update = FlockUpdate {
        peer: peer.into(),
        job,
        events,
    };
    let n = update.events.len();
    let r = sim
        .operator_request(Request::FlockReport(vec![update]))
        .unwrap();
    assert_eq!(r, Reply::FlockTaken(vec![n]), "every event taken");
}

fn ids(orders: &[FlockOrder]) -> Vec<JobId> {
    orders.iter().map(|o| o.job).collect()
}

#[test]
fn jobs_flock_by_their_choice_within_the_offer_and_come_home_when_the_peer_goes() {
    let mut sim = sim();
    let work = Duration::from_secs(30);
    let hog = sim.submit(&SimJob::new(2, work)).unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| {
        s.mm()
            .queue_view()
            .iter()
            .any(|j| j.job == hog && j.state == JobState::Running)
    }));
    let at_once = sim
        .submit(&SimJob {
            flock: Flock::Now,
            ..SimJob::new(2, Duration::from_secs(1))
        })
        .unwrap();
    let after_wait = sim.submit(&SimJob::new(2, Duration::from_secs(1))).unwrap();
    let never = sim
        .submit(&SimJob {
            flock: Flock::Never,
            ..SimJob::new(2, Duration::from_secs(1))
        })
        .unwrap();

    // Room for one 2-node job: the one that asked goes at once, and no other until the next
    // offer, however long it waits.
    report(&mut sim, Some(2));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![at_once]);
    sim.run_for(Duration::from_millis(600));
    assert_eq!(
        ids(&flocked(&mut sim)),
        vec![at_once],
        "no room left in that offer"
    );
    assert!(
        sim.replies().iter().any(|(_, r)| *r
            == Reply::Flocked {
                job: at_once,
                peer: "c1".into()
            }),
        "its submitter hears where it went"
    );
    // A new offer made before `at_once` reached the peer counts it still: a job on its way
    // holds its room until it starts there (the offer saw its nodes idle).
    report(&mut sim, Some(2));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(
        ids(&flocked(&mut sim)),
        vec![at_once],
        "a job on its way holds its room"
    );
    // The peer's news of `at_once` reaches its submitter under its own id: it started.
    tell(
        &mut sim,
        "c1",
        at_once,
        vec![
            FlockEvent::Accepted { remote: 40 },
            FlockEvent::Started {
                ntasks: 2,
                node_names: vec!["n0".into(), "n1".into()],
            },
            FlockEvent::Output(OutputChunk {
                job: 40,
                rank: 1,
                stream: Stream::Stdout,
                offset: 0,
                data: b"far away\n".to_vec(),
            }),
        ],
    );
    // A new offer: the job that has waited past flock_after_ms goes; --no-flock never does.
    report(&mut sim, Some(2));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![at_once, after_wait]);
    report(&mut sim, Some(4));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![at_once, after_wait]);
    let listing = sim.queue_listing().unwrap();
    let row = |id: JobId| listing.iter().find(|j| j.job == id).unwrap().clone();
    assert_eq!(row(at_once).runs_on.as_deref(), Some("c1"));
    assert_eq!(row(never).runs_on, None);

    // News of a job not flocked to the peer that sends it is dropped.
    tell(&mut sim, "c9", after_wait, vec![FlockEvent::NotHere]);
    assert_eq!(
        ids(&flocked(&mut sim)),
        vec![at_once, after_wait],
        "c9 has no say"
    );
    assert_eq!(
        sim.output(at_once, Stream::Stdout)
            .get(&1)
            .map(String::as_str),
        Some("far away\n")
    );
    assert!(sim.replies().iter().any(|(_, r)| matches!(
        r,
        Reply::Started { job, node_names, .. } if *job == at_once && node_names == &["c1:n0", "c1:n1"]
    )));
    // Flow control: output the submitter has not read yet (over `[limits]
    // max_unread_reply_bytes`, 16 MiB) is not taken; the agent sends the rest again.
    let chunk = |offset: u64| {
        FlockEvent::Output(OutputChunk {
            job: 40,
            rank: 0,
            stream: Stream::Stdout,
            offset,
            data: vec![b'x'; 10 << 20],
        })
    };
    let burst = FlockUpdate {
        peer: "c1".into(),
        job: at_once,
        events: vec![chunk(0), chunk(10 << 20), chunk(20 << 20)],
    };
    let r = sim
        .operator_request(Request::FlockReport(vec![burst]))
        .unwrap();
    assert_eq!(
        r,
        Reply::FlockTaken(vec![2]),
        "the third waits for the first two to be read"
    );
    tell(&mut sim, "c1", at_once, vec![chunk(20 << 20)]);
    assert_eq!(sim.output(at_once, Stream::Stdout)[&0].len(), 30 << 20);
    let ended = JobOutcome {
        job: 40,
        ranks: vec![Some(RankStatus::Exited(0)), Some(RankStatus::Exited(7))],
        reason: None,
        abort_code: None,
        timing: Timing::default(),
        usage: Default::default(),
        cause: None,
        broadcast: false,
    };
    tell(
        &mut sim,
        "c1",
        at_once,
        vec![FlockEvent::Finished(ended.clone())],
    );
    let outcome = sim.outcome(at_once).expect("it ended").clone();
    assert_eq!((outcome.job, outcome.exit_code()), (at_once, 7));
    // Told twice, it ends once.
    tell(&mut sim, "c1", at_once, vec![FlockEvent::Finished(ended)]);
    assert_eq!(ids(&flocked(&mut sim)), vec![after_wait]);

    // c1 goes away: after the timeout its job is queued here again, and its submitter hears
    // so; once the hog is cancelled it runs here.
    report(&mut sim, None);
    sim.run_for(TIMEOUT - Duration::from_millis(300));
    assert_eq!(
        ids(&flocked(&mut sim)),
        vec![after_wait],
        "not before the timeout"
    );
    sim.run_for(Duration::from_millis(400));
    assert!(flocked(&mut sim).is_empty());
    assert!(sim.replies().iter().any(|(_, r)| matches!(
        r,
        Reply::Requeued { job, reason } if *job == after_wait && reason.contains("queued at home again")
    )));
    sim.cancel(hog);
    assert!(sim.run_until(Duration::from_secs(10), |s| s.outcome(after_wait).is_some()));
    assert_eq!(
        sim.outcome(after_wait).unwrap().exit_code(),
        0,
        "it ran here"
    );
}

/// The peer's side: `c1` lends to `c0` and runs what `c0` flocks to it. Its own peer agent
/// follows each such job for `c0`; `agent_reports` says whether it still reports.
fn lender() -> Sim {
    Sim::up(SimOptions {
        nodes: 2,
        federation: FederationSection {
            listen: Some("127.0.0.1:7101".parse().unwrap()),
            advertise_ms: 200,
            peer_timeout_ms: TIMEOUT.as_millis() as u64,
            flock_after_ms: None,
            ..Default::default()
        },
        peers: vec![PeerEntry {
            name: "c0".into(),
            address: "127.0.0.1:7100".parse().unwrap(),
            key_file: "/nonexistent/pair.key".into(),
            lend: true,
            borrow: false,
            flock_user: Some("nobody".into()),
            same_users: false,
            guest_file: None,
            mm_public_key_file: None,
            priority: 0,
        }],
        ..SimOptions::default()
    })
    .unwrap()
}

/// The lender's agent reports `c0` up (what it says does not matter here: that it reports).
fn agent_reports(sim: &mut Sim) {
    let info = PeerInfo {
        name: "c0".into(),
        address: "127.0.0.1:7100".parse().unwrap(),
        state: PeerState::Up,
        lend: true,
        borrow: false,
        offer: None,
        lag_us: Some(300),
        heard_ms_ago: Some(0),
        reason: None,
    };
    assert_eq!(
        sim.operator_request(Request::PeerReport(vec![info]))
            .unwrap(),
        Reply::Done
    );
}

fn running(sim: &Sim, id: JobId) -> bool {
    sim.mm()
        .queue_view()
        .iter()
        .any(|j| j.job == id && j.state == JobState::Running)
}

/// A job flocked here runs while this cluster's agent reports; once the agent has been
/// silent for half the peer timeout, the job is given up (its home, hearing nothing, queues
/// it again after the whole timeout), so a dead or frozen agent does not leave a copy running
/// beside the one its home starts. The agent, back, is told so when it submits the job again.
#[test]
fn a_job_flocked_here_is_given_up_when_the_agent_that_follows_it_falls_silent() {
    let mut sim = lender();
    agent_reports(&mut sim);
    let job = SimJob::new(2, Duration::from_secs(60)).with_token(77);
    let id = sim.submit_flocked("c0", &job).unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| running(s, id)));
    let row = sim.mm().queue_view().into_iter().find(|j| j.job == id);
    assert_eq!(
        row.and_then(|j| j.from_cluster).as_deref(),
        Some("c0"),
        "the queue says whose job it is"
    );

    // Reported every 200 ms for three peer timeouts: it runs on.
    for _ in 0..30 {
        agent_reports(&mut sim);
        sim.run_for(Duration::from_millis(200));
    }
    assert!(running(&sim, id), "followed, it runs on");

    // Silent: still running a little before half the timeout, given up after it.
    sim.run_for(TIMEOUT / 2 - Duration::from_millis(300));
    assert!(running(&sim, id), "not given up before half the timeout");
    assert!(
        sim.run_until(Duration::from_millis(600), |s| {
            !s.mm().queue_view().iter().any(|j| j.job == id)
        }),
        "given up once its agent was silent for half the timeout: {:?}",
        sim.mm().queue_view()
    );
    let Reply::History(ended) = sim.operator_request(Request::History).unwrap() else {
        panic!("no history");
    };
    let record = ended.iter().find(|j| j.job == id).expect("in the history");
    assert_eq!(record.state, JobState::Cancelled, "{record:?}");
    assert_eq!(record.from_cluster.as_deref(), Some("c0"), "{record:?}");
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("has not reported")),
        "{record:?}"
    );

    // The agent comes back and submits the job again, under its token: told it was given
    // up (it passes that home as a refusal, and the home runs the job itself). So it is after
    // this MM restarted, from its history.
    agent_reports(&mut sim);
    let again = sim.submit_flocked("c0", &job).unwrap_err();
    assert!(again.contains("gave up job"), "{again}");
    sim.restart_mm().unwrap();
    agent_reports(&mut sim);
    let again = sim.submit_flocked("c0", &job).unwrap_err();
    assert!(again.contains("gave up job"), "after a restart: {again}");

    // Only the agent marks a job as flocked from a peer: a user's submission that does is
    // refused.
    let forged = sim
        .submit(&SimJob {
            flock: Flock::From("c0".into()),
            ..SimJob::new(1, Duration::from_secs(1))
        })
        .unwrap_err();
    assert!(
        forged.contains("only this cluster's peer agent"),
        "{forged}"
    );
}

/// Runs `sim` for `d`, its agent reporting every 200 ms.
fn reporting_for(sim: &mut Sim, d: Duration) {
    let step = Duration::from_millis(200);
    let mut left = d;
    while !left.is_zero() {
        agent_reports(sim);
        let now = left.min(step);
        sim.run_for(now);
        left -= now;
    }
}

/// A job flocked here that no follower follows while the agent still reports (the agent
/// withdrew it while this MM was down, so its cancel never arrived) is given up after the
/// peer timeout: nobody else would end it, and its home runs it again. A restart of this MM
/// is no such loss: the agent's follower submits the job again under its token, and the job
/// runs on. (Before, such a job ran on here for good, beside the copy its home ran.)
#[test]
fn a_job_flocked_here_that_nobody_follows_is_given_up_after_the_peer_timeout() {
    let mut sim = lender();
    agent_reports(&mut sim);
    let job = SimJob::new(2, Duration::from_secs(600)).with_token(78);
    let id = sim.submit_flocked("c0", &job).unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| running(s, id)));

    // This MM restarts; the follower is back within a second, and the job runs on.
    sim.restart_mm().unwrap();
    reporting_for(&mut sim, Duration::from_millis(800));
    assert_eq!(
        sim.submit_flocked("c0", &job),
        Ok(id),
        "the same job, followed again"
    );
    reporting_for(&mut sim, TIMEOUT * 3);
    assert!(running(&sim, id), "followed again, it runs on");

    // The follower leaves for good: still running a little before the timeout, given up
    // after it, though the agent reports all along.
    sim.drop_followers();
    reporting_for(&mut sim, TIMEOUT - Duration::from_millis(400));
    assert!(running(&sim, id), "not given up before the timeout");
    reporting_for(&mut sim, Duration::from_millis(800));
    assert!(
        !sim.mm().queue_view().iter().any(|j| j.job == id),
        "given up once nobody followed it for the timeout: {:?}",
        sim.mm().queue_view()
    );
    let Reply::History(ended) = sim.operator_request(Request::History).unwrap() else {
        panic!("no history");
    };
    let record = ended.iter().find(|j| j.job == id).expect("in the history");
    assert_eq!(record.state, JobState::Cancelled, "{record:?}");
    assert!(
        record.reason.as_deref().is_some_and(|r| r.contains(
            "this cluster's peer agent has not followed the job for its home cluster c0 \
                 for 2000 ms: given up"
        )),
        "{record:?}"
    );
}

/// A home whose own agent has stopped reporting sends no job to a peer: the peer's last
/// offer is stale, and no agent would carry the job there (it would only come back after the
/// peer timeout, having waited for nothing). Once the agent reports again, the job goes.
#[test]
fn a_home_whose_agent_stopped_reporting_flocks_nothing() {
    let mut sim = sim();
    let hog = sim
        .submit(&SimJob::new(2, Duration::from_secs(30)))
        .unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| running(s, hog)));
    report(&mut sim, Some(2));
    // Seven reports missed, over half the peer timeout: the offer is stale.
    sim.run_for(Duration::from_millis(1500));
    let job = sim
        .submit(&SimJob {
            flock: Flock::Now,
            ..SimJob::new(2, Duration::from_secs(1))
        })
        .unwrap();
    sim.run_for(Duration::from_millis(500));
    assert!(
        flocked(&mut sim).is_empty(),
        "a job went out on an offer reported 2 s ago, with no agent reporting"
    );
    report(&mut sim, Some(2));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(
        ids(&flocked(&mut sim)),
        vec![job],
        "reported again: it goes"
    );
}

#[test]
fn a_job_larger_than_its_home_that_names_only_peers_is_sized_against_them() {
    let mut sim = sim();
    let only_c1 = |nodes: u32| SimJob {
        flock: Flock::Only(vec!["c1".into()]),
        ..SimJob::new(nodes, Duration::from_secs(1))
    };

    // Before any report, c1's size is unknown: a 3-node job (home has 2) waits for it.
    let early = sim.submit(&only_c1(3)).unwrap();
    // A job that may run at home is still held to home's size.
    let err = sim
        .submit(&SimJob {
            flock: Flock::Only(vec!["sim".into(), "c1".into()]),
            ..SimJob::new(3, Duration::from_secs(1))
        })
        .unwrap_err();
    assert!(
        err.contains("the job asks for 3 nodes but the cluster has 2"),
        "{err}"
    );
    let err = sim
        .submit(&SimJob {
            flock: Flock::Only(vec!["c9".into()]),
            ..SimJob::new(1, Duration::from_secs(1))
        })
        .unwrap_err();
    assert!(
        err.contains(
            "--clusters: \"c9\" is neither this cluster nor a peer it may run jobs on (those \
             are: sim, c1)"
        ),
        "{err}"
    );

    // c1 reports 4 nodes, all idle: the 3-node job goes there; one of 5 is refused, naming
    // c1's size.
    report(&mut sim, Some(4));
    let err = sim.submit(&only_c1(5)).unwrap_err();
    assert!(
        err.contains("the job needs 5 nodes") && err.contains("c1 has 4"),
        "{err}"
    );
    let later = sim.submit(&only_c1(4)).unwrap();
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![early], "no room left for 4");
    // The first started there; c1 offers its 4 nodes again: the 4-node job goes too.
    tell(
        &mut sim,
        "c1",
        early,
        vec![
            FlockEvent::Accepted { remote: 7 },
            FlockEvent::Started {
                ntasks: 3,
                node_names: vec!["n0".into(), "n1".into(), "n2".into()],
            },
        ],
    );
    report(&mut sim, Some(4));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![early, later]);
}

/// A flocked job that ends on its peer gives its nodes back to that peer's room at once: the
/// next queued job goes without waiting for the peer's next advert (up to `advertise_ms`,
/// time it would spend idle in the queue). A peer with a queue of its own keeps them for it.
#[test]
fn a_flocked_jobs_end_makes_room_for_the_next_before_the_peers_next_advert() {
    let mut sim = sim();
    let hog = sim
        .submit(&SimJob::new(2, Duration::from_secs(30)))
        .unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| running(s, hog)));
    let to_c1 = || SimJob {
        flock: Flock::Now,
        ..SimJob::new(2, Duration::from_secs(1))
    };
    let first = sim.submit(&to_c1()).unwrap();
    let second = sim.submit(&to_c1()).unwrap();
    report(&mut sim, Some(2));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![first], "room for one");
    let started = |remote: JobId| {
        vec![
            FlockEvent::Accepted { remote },
            FlockEvent::Started {
                ntasks: 2,
                node_names: vec!["n0".into(), "n1".into()],
            },
        ]
    };
    tell(&mut sim, "c1", first, started(40));
    // c1's advert while `first` runs there: no idle node.
    report(&mut sim, Some(0));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![first]);
    let ended = |remote: JobId| {
        FlockEvent::Finished(JobOutcome {
            job: remote,
            ranks: vec![Some(RankStatus::Exited(0)); 2],
            reason: None,
            abort_code: None,
            timing: Timing::default(),
            usage: Default::default(),
            cause: None,
            broadcast: false,
        })
    };
    tell(&mut sim, "c1", first, vec![ended(40)]);
    // No new advert: `first`'s two nodes are room again, and `second` takes them.
    sim.run_for(Duration::from_millis(100));
    assert_eq!(
        ids(&flocked(&mut sim)),
        vec![second],
        "the nodes `first` freed went unused until c1's next advert"
    );

    // A peer with a queue of its own: what a flocked job frees there is its queue's.
    let third = sim.submit(&to_c1()).unwrap();
    tell(&mut sim, "c1", second, started(41));
    let busy = PeerInfo {
        name: "c1".into(),
        address: "127.0.0.1:7101".parse().unwrap(),
        state: PeerState::Up,
        lend: false,
        borrow: true,
        offer: Some(Offer {
            idle_nodes: 0,
            idle_cpus: 0,
            nodes: 4,
            queued: 1,
        }),
        lag_us: Some(300),
        heard_ms_ago: Some(0),
        reason: None,
    };
    let r = sim
        .operator_request(Request::PeerReport(vec![busy]))
        .unwrap();
    assert_eq!(r, Reply::Done);
    tell(&mut sim, "c1", second, vec![ended(41)]);
    sim.run_for(Duration::from_millis(100));
    assert!(
        flocked(&mut sim).is_empty(),
        "job {third} went to a peer whose own queue waits for those nodes"
    );
}

/// A flocked job's standard input goes to the peer agent with its order (`FlockOut`), each
/// piece once and in order; input from another connection than its submitter's is not its
/// input; at most the input window is held for the agent.
#[test]
fn a_flocked_jobs_input_goes_to_the_agent_once_from_its_submitter_only() {
    use storm_cluster::flock::InputPiece;
    use storm_cluster::messages::{INPUT_WINDOW, InputTarget, MAX_INPUT_CHUNK};
    let mut sim = sim();
    let hog = sim
        .submit(&SimJob::new(2, Duration::from_secs(30)))
        .unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| running(s, hog)));
    let job = sim
        .submit(&SimJob {
            flock: Flock::Now,
            input: InputTarget::Rank(0),
            ..SimJob::new(2, Duration::from_secs(1))
        })
        .unwrap();
    report(&mut sim, Some(2));
    sim.run_for(Duration::from_millis(100));
    assert_eq!(ids(&flocked(&mut sim)), vec![job]);
    tell(
        &mut sim,
        "c1",
        job,
        vec![
            FlockEvent::Accepted { remote: 40 },
            FlockEvent::Started {
                ntasks: 2,
                node_names: vec!["n0".into(), "n1".into()],
            },
        ],
    );
    let input_of = |orders: Vec<FlockOrder>| -> Vec<InputPiece> {
        orders
            .into_iter()
            .find(|o| o.job == job)
            .map(|o| o.input)
            .unwrap_or_default()
    };
    sim.send_input(job, 0, b"hello\n", false);
    sim.send_input(job, 6, b"", true);
    // Not its submitter: someone else's piece for the job is not its input.
    let r = sim.operator_request(Request::Input {
        job,
        offset: 0,
        data: b"forged\n".to_vec(),
        eof: false,
    });
    assert!(!matches!(r, Ok(Reply::Error(_))), "{r:?}");
    sim.run_for(Duration::from_millis(10));
    assert_eq!(
        input_of(flocked(&mut sim)),
        vec![
            InputPiece {
                offset: 0,
                data: b"hello\n".to_vec(),
                eof: false,
            },
            InputPiece {
                offset: 6,
                data: Vec::new(),
                eof: true,
            },
        ],
        "the submitter's input, in order, and nobody else's"
    );
    assert!(input_of(flocked(&mut sim)).is_empty(), "each piece once");

    // More than the window while the agent does not ask: the window is held, the rest is
    // dropped (storm-submit sends it again once the tasks acknowledge what they read).
    let chunk = vec![b'x'; MAX_INPUT_CHUNK];
    let chunks = INPUT_WINDOW as usize / MAX_INPUT_CHUNK;
    for i in 0..=chunks {
        sim.send_input(job, (i * MAX_INPUT_CHUNK) as u64, &chunk, false);
    }
    sim.run_for(Duration::from_millis(10));
    let held = input_of(flocked(&mut sim));
    assert_eq!(
        held.iter().map(|p| p.offset).collect::<Vec<_>>(),
        (0..chunks)
            .map(|i| (i * MAX_INPUT_CHUNK) as u64)
            .collect::<Vec<_>>()
    );
}
