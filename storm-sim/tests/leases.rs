//! A guest slot is a member only under a lease its lender's MM signed (issue 61, finding
//! H3). Root of a lending node holds the slot's identity key and the borrower's cluster key
//! for good: before, it could start its own guest NM for the slot at any time, and the
//! borrower took it as a member (and ran `--borrow` jobs there), lease or not. Now the real
//! MM core admits a guest slot's registration only with a grant that its lender's MM signed,
//! for that slot's node, lent to this cluster, that has not run out; and a member whose
//! lease runs out leaves. Each case here is a guest NM that registers as such a root would.

use std::time::Duration;

use storm_cluster::control::NodeState;
use storm_cluster::federation::{FederationSection, GuestOf, PeerEntry};
use storm_cluster::identity::MmSigner;
use storm_sim::{Sim, SimOptions, lender_signing_key};

/// This cluster (`home`, one node) and a guest slot (node 1) for node `n0` of `c1`, not up.
fn borrower() -> Sim {
    let mut sim = Sim::new(SimOptions {
        nodes: 1,
        federation: FederationSection {
            listen: Some("127.0.0.1:7100".parse().unwrap()),
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
        guests: vec![GuestOf {
            cluster: "c1".into(),
            node: "n0".into(),
        }],
        ..SimOptions::default()
    })
    .unwrap();
    sim.kill(1);
    sim.run_for(Duration::from_secs(1));
    sim
}

const SLOT: u32 = 1;

#[test]
fn a_guest_slot_is_a_member_only_under_a_lease_its_lender_signed() {
    let mut sim = borrower();
    let name = sim.config().cluster.name.clone();
    let lender = MmSigner::new(lender_signing_key(), "c1");
    let in_an_hour = sim.unix_ms() + 3_600_000;
    let forger = MmSigner::new(ed25519_dalek::SigningKey::from_bytes(&[7; 32]), "c1");
    let refused = [
        ("no grant at all", None),
        (
            "a grant signed by another key",
            Some(forger.grant_lease(&name, "n0", in_an_hour)),
        ),
        (
            "a grant of another node",
            Some(lender.grant_lease(&name, "n1", in_an_hour)),
        ),
        (
            "a grant to another cluster",
            Some(lender.grant_lease("elsewhere", "n0", in_an_hour)),
        ),
        (
            "a grant that ran out",
            Some(lender.grant_lease(&name, "n0", sim.unix_ms() - 1)),
        ),
    ];
    for (what, lease) in refused {
        sim.restart_nm_showing(SLOT, 0, lease);
        sim.run_for(Duration::from_secs(3));
        let state = sim.state(SLOT).state;
        assert_ne!(
            state,
            NodeState::Idle,
            "a guest NM showing {what} became a member"
        );
        sim.kill(SLOT);
        sim.run_for(Duration::from_millis(200));
    }
    // The lender's grant, for a few seconds: a member, then out when it runs out, and not
    // back however the guest NM goes on.
    let until = sim.unix_ms() + 4_000;
    sim.restart_nm_showing(SLOT, 0, Some(lender.grant_lease(&name, "n0", until)));
    assert!(
        sim.run_until(Duration::from_secs(3), |s| s.state(SLOT).state
            == NodeState::Idle),
        "a guest NM with its lender's grant becomes a member"
    );
    assert!(
        sim.run_until(Duration::from_secs(6), |s| s.state(SLOT).state
            == NodeState::Down),
        "a guest slot whose lease ran out leaves: {:?}",
        sim.state(SLOT)
    );
    let reason = sim.state(SLOT).reason.unwrap_or_default();
    assert!(
        reason.contains("lease") && reason.contains("ran out"),
        "{reason}"
    );
    sim.run_for(Duration::from_secs(3));
    assert_ne!(
        sim.state(SLOT).state,
        NodeState::Idle,
        "back after its lease"
    );
}
