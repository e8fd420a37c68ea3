//! The borrower MM's rules for asking lenders, in virtual time (docs/federation.md,
//! borrowing for a waiting job): the real MM core, its peer agent played by the test through
//! the requests the agent sends (`PeerReport`, `BorrowOut`).
//!
//! The cluster has one node of its own and guest slots for two nodes of each of two lenders,
//! `c1` (`[[peer]] priority` 10, offering one idle node) and `c2` (priority 0, offering two).
//! Nobody lends anything: the slots never come up.
//!
//! * `lenders = "most-free"`: a `--borrow` job of three nodes, the own node busy, asks `c2`,
//!   which offers the most, for both its nodes, and `c1` for the third.
//! * `lenders = "priority"`: it asks `c1` first; once `c1` has not lent within the patience
//!   (four `advertise_ms`), it asks `c2` instead, and `c1` again two patiences later.
//! * A job without `--borrow` asks nobody; a lender offering nothing is not asked.
//! * `--less`: a `--borrow` job nobody lends to starts on its one node after the patience.
//! * A lender calls home a slot a job runs on (`Recalled`, as the agent passes it on): the
//!   job ends with the lender's reason, the slot takes no new job, and it is given back.
//! * A slot lent on this cluster's asking and given back idle takes no new job until its
//!   guest stops (its owner takes it home); one its owner's operator lent takes jobs still.

use std::time::Duration;

use storm_cluster::control::{Reply, Request};
use storm_cluster::federation::{
    BorrowOrder, FederationSection, GuestOf, LenderOrder, LentNode, Offer, PeerEntry, PeerInfo,
    PeerState, Recalled,
};
use storm_sim::{Sim, SimJob, SimOptions};

const ADVERTISE: Duration = Duration::from_millis(200);

fn peer(name: &str, port: u16, priority: u32) -> PeerEntry {
    PeerEntry {
        name: name.into(),
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        key_file: "/nonexistent/pair.key".into(),
        lend: false,
        borrow: true,
        flock_user: None,
        same_users: false,
        guest_file: None,
        mm_public_key_file: None,
        priority,
    }
}

/// The cluster, its slots (nodes 1-4) never lent.
fn sim(lenders: LenderOrder) -> Sim {
    let guests = ["c1", "c2"]
        .iter()
        .flat_map(|c| {
            ["n0", "n1"].iter().map(move |n| GuestOf {
                cluster: c.to_string(),
                node: n.to_string(),
            })
        })
        .collect();
    let mut sim = Sim::new(SimOptions {
        nodes: 1,
        federation: FederationSection {
            listen: Some("127.0.0.1:7100".parse().unwrap()),
            advertise_ms: ADVERTISE.as_millis() as u64,
            peer_timeout_ms: 10 * ADVERTISE.as_millis() as u64,
            lenders,
            ..Default::default()
        },
        peers: vec![peer("c1", 7101, 10), peer("c2", 7102, 0)],
        guests,
        ..SimOptions::default()
    })
    .unwrap();
    for slot in 1..=4 {
        sim.kill(slot);
    }
    sim.run_for(Duration::from_secs(1));
    sim
}

/// The agent's report: each lender `up`, offering so many idle nodes.
fn report(sim: &mut Sim, offers: &[(&str, u32)]) {
    let infos = offers
        .iter()
        .map(|&(name, idle)| PeerInfo {
            name: name.into(),
            address: "127.0.0.1:7101".parse().unwrap(),
            state: PeerState::Up,
            lend: false,
            borrow: true,
            offer: Some(Offer {
                idle_nodes: idle,
                idle_cpus: idle,
                nodes: 2,
                queued: 0,
            }),
            lag_us: Some(300),
            heard_ms_ago: Some(0),
            reason: None,
        })
        .collect();
    let r = sim.operator_request(Request::PeerReport(infos)).unwrap();
    assert_eq!(r, Reply::Done);
}

/// What the MM wants of its lenders now: (lender, count, nodes asked about).
fn orders(sim: &mut Sim) -> Vec<(String, u32, Vec<String>)> {
    match sim
        .operator_request(Request::BorrowOut { lent: vec![] })
        .unwrap()
    {
        Reply::BorrowOut(o) => o
            .into_iter()
            .filter(|o: &BorrowOrder| o.count > 0)
            .map(|o| (o.peer, o.count, o.want))
            .collect(),
        other => panic!("{other:?}"),
    }
}

fn asked(lender: &str) -> Vec<(String, u32, Vec<String>)> {
    vec![(lender.to_string(), 2, vec!["n0".into(), "n1".into()])]
}

fn borrowing_job(sim: &mut Sim) {
    sim.submit(&SimJob {
        borrow: true,
        ..SimJob::new(3, Duration::from_secs(60))
    })
    .unwrap();
    sim.run_for(Duration::from_millis(100));
}

#[test]
fn most_free_asks_the_lender_offering_the_most() {
    let mut sim = sim(LenderOrder::MostFree);
    report(&mut sim, &[("c1", 1), ("c2", 2)]);
    sim.submit(&SimJob::new(1, Duration::from_secs(60)))
        .unwrap();
    sim.run_for(Duration::from_millis(100));
    assert!(
        orders(&mut sim).is_empty(),
        "a job without --borrow asks nobody"
    );
    // The job lacks all three nodes (the own node runs the first job): c2, offering the
    // most, is asked for both its nodes, and c1 for the third.
    borrowing_job(&mut sim);
    assert_eq!(
        orders(&mut sim),
        vec![
            (
                "c1".to_string(),
                1,
                vec!["n0".to_string(), "n1".to_string()]
            ),
            (
                "c2".to_string(),
                2,
                vec!["n0".to_string(), "n1".to_string()]
            ),
        ]
    );
}

#[test]
fn priority_asks_the_highest_first_then_the_next_after_the_patience() {
    let mut sim = sim(LenderOrder::Priority);
    report(&mut sim, &[("c1", 1), ("c2", 2)]);
    borrowing_job(&mut sim);
    assert_eq!(orders(&mut sim), asked("c1"), "c1 has the higher priority");
    let patience = ADVERTISE * 4;
    sim.run_for(patience + ADVERTISE);
    assert_eq!(
        orders(&mut sim),
        asked("c2"),
        "c1 did not lend within the patience: c2's turn"
    );
    sim.run_for(patience * 2);
    assert_eq!(orders(&mut sim), asked("c1"), "then c1 again");
}

#[test]
fn a_lender_offering_nothing_is_not_asked() {
    let mut sim = sim(LenderOrder::Priority);
    report(&mut sim, &[("c1", 0), ("c2", 2)]);
    borrowing_job(&mut sim);
    assert_eq!(orders(&mut sim), asked("c2"));
}

/// `--less`: a `--borrow` job that lenders do not serve waits the patience for them, then
/// starts on the one node it has (its request shrunk, its tasks per node kept).
#[test]
fn a_less_job_starts_on_what_it_has_once_its_lenders_had_their_chance() {
    let mut sim = sim(LenderOrder::MostFree);
    report(&mut sim, &[("c1", 1), ("c2", 2)]);
    let id = sim
        .submit(&SimJob {
            borrow: true,
            less: true,
            ..SimJob::new(3, Duration::from_secs(60))
        })
        .unwrap();
    sim.run_for(Duration::from_millis(100));
    assert!(!orders(&mut sim).is_empty(), "it asks its lenders first");
    assert!(sim.started(id).is_empty(), "and waits for them");
    sim.run_for(ADVERTISE * 4 + ADVERTISE);
    assert_eq!(sim.started(id).len(), 1, "it started on fewer nodes");
    let listing = sim.queue_listing().unwrap();
    let job = listing.iter().find(|j| j.job == id).unwrap();
    assert_eq!(job.nodes.to_string(), "0", "on its own node: {job:?}");
}

/// A lender calls home the slot a job of this cluster runs on: the job ends with the
/// lender's own reason (before, it ended only once the guest went silent, with a reason that
/// named three causes), no job starts on the slot again, and the next orders give it back.
/// Once its guest stops, the slot is down, and nothing of the call is left.
#[test]
fn a_slot_called_home_ends_its_job_with_the_lenders_reason_and_goes_back() {
    let mut sim = one_slot();
    let why = "reclaimed for its job 7, which waits there";
    let (job, reason) = job_called_home(&mut sim, why);
    assert!(
        reason.contains(&format!(
            "borrowed from cluster c1: its owner took it back ({why})"
        )),
        "{reason}"
    );
    assert!(
        !reason.contains("failed"),
        "a call home is not a failure: {reason}"
    );
    assert_eq!(
        sim.outcome(job).unwrap().state(),
        storm_cluster::control::JobState::Preempted,
        "storm history's state"
    );

    let next = sim
        .submit(&SimJob {
            borrow: true,
            ..SimJob::new(2, Duration::from_secs(1))
        })
        .unwrap();
    sim.run_for(Duration::from_secs(1));
    assert!(
        sim.started(next).is_empty(),
        "a job started on a slot called home"
    );
    assert_eq!(
        give_backs(&mut sim),
        vec!["n0".to_string()],
        "the slot is not given back"
    );

    // Its guest stops: the slot is down, and holds no call home for the next lending.
    sim.kill(1);
    sim.run_for(Duration::from_secs(2));
    let info = sim.state(1);
    assert_eq!(
        info.state,
        storm_cluster::control::NodeState::Down,
        "{info:?}"
    );
    assert!(
        !info.reason.unwrap_or_default().contains("calls it home"),
        "the call home outlived the guest"
    );
}

/// A `--borrow` job runs on the own node and the slot; `c1` calls the slot home for `why`
/// (as the agent passes it on); the job ends. Its id, and the reason it ended with.
fn job_called_home(sim: &mut Sim, why: &str) -> (u64, String) {
    let job = sim
        .submit(&SimJob {
            borrow: true,
            ..SimJob::new(2, Duration::from_secs(600))
        })
        .unwrap();
    let started = sim.run_until(Duration::from_secs(5), |s| !s.started(job).is_empty());
    assert!(started, "the job did not start on its node and the slot");
    let reply = sim
        .operator_request(Request::Recalled {
            peer: "c1".into(),
            nodes: vec![Recalled {
                node: "n0".into(),
                why: why.into(),
            }],
        })
        .unwrap();
    assert_eq!(reply, Reply::Done);
    let ended = sim.run_until(Duration::from_secs(10), |s| s.outcome(job).is_some());
    assert!(ended, "the job on the slot called home did not end");
    let reason = sim.outcome(job).unwrap().reason.clone().unwrap_or_default();
    (job, reason)
}

/// One node of this cluster's own and a guest slot for `c1`'s `n0`, up (its guest runs).
fn one_slot() -> Sim {
    Sim::up(SimOptions {
        nodes: 1,
        federation: FederationSection {
            listen: Some("127.0.0.1:7100".parse().unwrap()),
            advertise_ms: ADVERTISE.as_millis() as u64,
            peer_timeout_ms: 10 * ADVERTISE.as_millis() as u64,
            ..Default::default()
        },
        peers: vec![peer("c1", 7101, 0)],
        guests: vec![GuestOf {
            cluster: "c1".into(),
            node: "n0".into(),
        }],
        ..SimOptions::default()
    })
    .unwrap()
}

/// A lender's reason goes into this cluster's job records: a long one is cut to a line, so
/// that a peer cannot fill them.
#[test]
fn a_lenders_long_reason_is_cut_to_a_line() {
    let mut sim = one_slot();
    let (_, reason) = job_called_home(&mut sim, &"x".repeat(100_000));
    assert!(
        reason.len() < 1000
            && reason.contains("its owner took it back (xxx")
            && reason.contains("…"),
        "{} bytes: {}",
        reason.len(),
        &reason[..reason.len().min(300)]
    );
}

/// A `--borrow` job of two nodes (the own node and the slot) that runs 200 ms.
fn short_borrowing_pair(sim: &mut Sim) -> u64 {
    sim.submit(&SimJob {
        borrow: true,
        ..SimJob::new(2, Duration::from_millis(200))
    })
    .unwrap()
}

/// The give-backs in the MM's orders now (the lender's names).
fn give_backs(sim: &mut Sim) -> Vec<String> {
    match sim
        .operator_request(Request::BorrowOut { lent: vec![] })
        .unwrap()
    {
        Reply::BorrowOut(o) => o.into_iter().flat_map(|o| o.give_back).collect(),
        other => panic!("{other:?}"),
    }
}

/// A two-node `--borrow` job, its second node borrowed: the slot is down, the job asks `c1`
/// for `n0`, `c1` answers that it lends it (`on_asking`: on this cluster's asking, or by its
/// operator), the slot's guest comes up, and the job runs on both nodes to its end. The slot
/// is idle then, and no job waits: the next orders give it back.
fn borrow_the_slot_for_a_job(sim: &mut Sim, on_asking: bool) {
    sim.kill(1);
    sim.run_for(Duration::from_secs(1));
    report(sim, &[("c1", 1)]);
    let job = short_borrowing_pair(sim);
    sim.run_for(Duration::from_millis(100));
    assert_eq!(
        orders(sim),
        vec![("c1".to_string(), 1, vec!["n0".to_string()])]
    );
    let answer = vec![(
        "c1".to_string(),
        vec![LentNode {
            node: "n0".into(),
            on_asking,
        }],
    )];
    let reply = sim
        .operator_request(Request::BorrowOut { lent: answer })
        .unwrap();
    assert!(matches!(reply, Reply::BorrowOut(_)), "{reply:?}");
    sim.restart_nm(1, 0);
    sim.assert_ran_once_to_its_end(job, 2, Duration::from_secs(10));
    assert_eq!(
        give_backs(sim),
        vec!["n0".to_string()],
        "the idle slot goes back"
    );
}

/// A slot lent on this cluster's asking and given back takes no new job until its guest
/// stops: its owner takes it home on the giving back, so a job placed on it in between lost
/// it without notice (seen in CI: lending.rs, frozen lender, "went silent without notice").
/// It is given back again each period until then; once home, it is asked for again, and the
/// waiting job runs when it is lent anew.
#[test]
fn a_slot_lent_on_asking_and_given_back_takes_no_job_until_it_is_home() {
    let mut sim = one_slot();
    borrow_the_slot_for_a_job(&mut sim, true);
    let next = short_borrowing_pair(&mut sim);
    sim.run_for(Duration::from_secs(1));
    assert!(
        sim.started(next).is_empty(),
        "a job started on a slot given back to its owner"
    );
    let info = sim.state(1);
    assert!(
        info.reason
            .as_deref()
            .unwrap_or_default()
            .contains("given back to its owner"),
        "storm nodes does not say why the slot takes no job: {info:?}"
    );
    assert_eq!(
        give_backs(&mut sim),
        vec!["n0".to_string()],
        "given back again until it is home"
    );

    // Its owner takes it home: the guest stops, and the slot is down.
    sim.kill(1);
    sim.run_for(Duration::from_secs(2));
    assert_eq!(sim.state(1).state, storm_cluster::control::NodeState::Down);
    // Asked for and lent again, it runs the waiting job.
    report(&mut sim, &[("c1", 1)]);
    assert_eq!(
        orders(&mut sim),
        vec![("c1".to_string(), 1, vec!["n0".to_string()])]
    );
    sim.restart_nm(1, 0);
    sim.assert_ran_once_to_its_end(next, 2, Duration::from_secs(10));
}

/// A slot its owner's operator lent (`storm lend`) stays open to jobs when given back: that
/// lease runs to its end whatever the borrower says, so holding the slot out would leave it
/// idle for the rest of the lease.
#[test]
fn a_slot_lent_by_its_owners_operator_takes_jobs_after_it_is_given_back() {
    let mut sim = one_slot();
    borrow_the_slot_for_a_job(&mut sim, false);
    let next = short_borrowing_pair(&mut sim);
    sim.assert_ran_once_to_its_end(next, 2, Duration::from_secs(10));
}
