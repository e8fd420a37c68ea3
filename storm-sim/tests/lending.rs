//! The lender MM's leases across its restarts, in virtual time (docs/federation.md,
//! lending): the real MM core over its journal.
//!
//! * A node lent to a peer stays lent when the MM restarts: the borrower keeps it, and the
//!   lender's own two-node job waits.
//! * The operator takes the peer out of the cluster file (walking away) and restarts the MM:
//!   the node comes home at once, and the waiting job runs on both nodes. (Without this, the
//!   node stayed lent, serving a cluster this one no longer knows, until its lease ended.)
//! * The lender's own waiting job takes back a node lent on asking only if that lets it
//!   start: not for a job the node lacks a feature for, nor for one that needs nodes still
//!   busy at home.

use std::time::Duration;

use storm_cluster::control::{NodeState, Reply, Request};
use storm_cluster::federation::{FederationSection, PeerEntry};
use storm_primitives::NodeSet;
use storm_sim::{Sim, SimJob, SimOptions};

/// The peer `c1`, which this cluster lends to (its guests run as `nobody`).
fn lends_to_c1() -> PeerEntry {
    PeerEntry {
        name: "c1".into(),
        address: "127.0.0.1:7101".parse().unwrap(),
        key_file: "/nonexistent/pair.key".into(),
        lend: true,
        borrow: false,
        flock_user: Some("nobody".into()),
        same_users: false,
        guest_file: Some("/nonexistent/c1.toml".into()),
        priority: 0,
    }
}

/// Node `name`'s state, as `storm nodes` shows it.
fn state_of(sim: &mut Sim, name: &str) -> NodeState {
    match sim.operator_request(Request::Nodes).unwrap() {
        Reply::Nodes(nodes) => nodes
            .into_iter()
            .find(|n| n.name == name)
            .map(|n| n.state)
            .unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_lease_survives_a_restart_and_ends_when_the_file_no_longer_lends_to_the_peer() {
    let mut sim = Sim::up(SimOptions {
        nodes: 2,
        federation: FederationSection {
            listen: Some("127.0.0.1:7100".parse().unwrap()),
            ..Default::default()
        },
        peers: vec![lends_to_c1()],
        ..SimOptions::default()
    })
    .unwrap();
    let lent = sim.config().nodes[0].name.clone();
    let reply = sim
        .operator_request(Request::Lend {
            nodes: NodeSet::single(0),
            peer: "c1".into(),
            for_ms: 3_600_000,
        })
        .unwrap();
    assert!(matches!(reply, Reply::Notice(_)), "{reply:?}");
    assert_eq!(state_of(&mut sim, &lent), NodeState::Lent);
    let job = sim
        .submit(&SimJob::new(2, Duration::from_millis(100)))
        .unwrap();

    sim.restart_mm().unwrap();
    sim.run_for(Duration::from_secs(2));
    assert_eq!(
        state_of(&mut sim, &lent),
        NodeState::Lent,
        "the lease outlives the MM's restart"
    );
    assert!(
        sim.outcome(job).is_none(),
        "the job waits for the lent node"
    );

    sim.restart_mm_with(|cfg| cfg.peers.clear()).unwrap();
    let ran = sim.run_until(Duration::from_secs(10), |s| s.outcome(job).is_some());
    assert!(ran, "the job never ran on the node that came home");
    assert_eq!(sim.outcome(job).unwrap().exit_code(), 0);
    assert_ne!(state_of(&mut sim, &lent), NodeState::Lent);
}

/// A job of the lender's own that the lent node would not let start leaves it lent: the
/// borrower keeps it. The lender has two nodes, `gpu` on the first only; its second is lent
/// on the peer's asking, and a `gpu` job of its own runs on the first.
///
/// * A two-node job of its own waits: the lent node alone cannot start it (the first is
///   busy), so it stays lent.
/// * A one-node `--constraint gpu` job waits: the lent node has no `gpu`; it stays lent.
/// * A one-node job that any node suits: the lent node comes home for it, and it runs.
///
/// (Before, any waiting job of the lender's own took back as many nodes as it lacked, and
/// the first two cases idled a node the borrower was using.)
#[test]
fn the_lenders_own_job_takes_back_only_a_node_that_lets_it_start() {
    let mut sim = Sim::up(SimOptions {
        nodes: 2,
        federation: FederationSection {
            listen: Some("127.0.0.1:7100".parse().unwrap()),
            reclaim_after_ms: 500,
            ..Default::default()
        },
        peers: vec![lends_to_c1()],
        features: vec![(0, vec!["gpu".into()])],
        ..SimOptions::default()
    })
    .unwrap();
    let second = sim.config().nodes[1].name.clone();
    let reply = sim
        .operator_request(Request::LendAsked {
            peer: "c1".into(),
            nodes: vec![second.clone()],
            count: 1,
            for_ms: 3_600_000,
        })
        .unwrap();
    assert_eq!(reply, Reply::Lent(vec![second.clone()]));
    let gpu = |nodes: u32| SimJob {
        constraint: vec!["gpu".into()],
        ..SimJob::new(nodes, Duration::from_secs(600))
    };
    let running = sim.submit(&gpu(1)).unwrap();
    sim.run_for(Duration::from_secs(1));
    assert!(sim.outcome(running).is_none());

    let wide = sim
        .submit(&SimJob::new(2, Duration::from_millis(100)))
        .unwrap();
    sim.run_for(Duration::from_secs(3));
    assert_eq!(
        state_of(&mut sim, &second),
        NodeState::Lent,
        "a two-node job whose other node is busy took the lent node back"
    );
    sim.cancel(wide);

    let wants_gpu = sim.submit(&gpu(1)).unwrap();
    sim.run_for(Duration::from_secs(3));
    assert_eq!(
        state_of(&mut sim, &second),
        NodeState::Lent,
        "a gpu job took back a node without gpu"
    );
    sim.cancel(wants_gpu);

    let any = sim
        .submit(&SimJob::new(1, Duration::from_millis(100)))
        .unwrap();
    let ran = sim.run_until(Duration::from_secs(10), |s| s.outcome(any).is_some());
    assert!(ran, "a job any node suits did not get the lent node back");
    assert_eq!(sim.outcome(any).unwrap().exit_code(), 0);
}
