//! A borrowing site against the nodes it borrows (issue 61, finding C1): two embedded
//! clusters on loopback, as root. `lt-lend` lends its `node0` to `lt-borrow`; the borrower's
//! side is the attacker. Its operator hands the lender a guest file, and a user of the
//! borrower's (say, in a flocked job) has left two scripts as `nobody` on the lender's node.
//!
//! Before issue 61, a lent node's NM started the guest NM, as root, from the borrower's own
//! cluster file: a file naming those scripts as `[cluster] pl_path` and `[health] program`
//! had the lender run both as uid 0 (a warm guest even before any lease). Now the guest takes
//! only the borrower's topology from its file, which is refused, naming the setting, if it
//! says anything more, or if anyone but root could have written it. Seen from outside:
//!
//! * no script ran, as anyone; the lender's node log names the refused setting; the slot
//!   never comes up at the borrower;
//! * the same refusal for a clean file that `nobody` owns;
//! * with the clean file as root installed it, the lend works and the borrowed task runs as
//!   the lender's account for the peer, its launcher the lender's own; that task reaches no
//!   MM through its STORM_SOCKET, and the lender's MM refuses jobs of that account (L1);
//! * once the node is home, its root runs a guest NM of its own for the slot (it holds the
//!   slot's keys): without a lease grant, or with one it signed itself, the borrower admits
//!   neither (H3).

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use storm_cli::local::LocalOptions;
use storm_cluster::federation::{FederationSection, GuestOf, PeerEntry};
use support::{NOBODY, TestCluster, text};

fn free_port() -> u16 {
    storm_cli::local::free_loopback_port().expect("a free loopback port")
}

fn peer(name: &str, port: u16, key: &Path) -> PeerEntry {
    PeerEntry {
        name: name.into(),
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        key_file: key.to_path_buf(),
        lend: false,
        borrow: false,
        flock_user: None,
        same_users: false,
        guest_file: None,
        mm_public_key_file: None,
        priority: 0,
    }
}

fn federation(port: u16) -> FederationSection {
    FederationSection {
        listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
        ..Default::default()
    }
}

/// The state `storm nodes --json` gives node `name` on `c`.
fn state_of(c: &TestCluster, name: &str) -> String {
    let out = c.storm(&["nodes", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == name))
        .map(|n| n["state"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// A script, written by `nobody` as a user's job would, that leaves a marker saying who ran
/// it.
fn planted(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let marker = dir.join(format!("{name}.ran"));
    let script = dir.join(format!("{name}.sh"));
    std::fs::write(
        &script,
        format!("#!/bin/sh\nid -u > '{}'\nexit 0\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&script, Some(NOBODY), Some(NOBODY)).unwrap();
    (script, marker)
}

#[test]
fn a_borrowers_guest_file_runs_nothing_of_the_borrowers_as_root_on_the_lender() {
    let test = "a_borrowers_guest_file_runs_nothing_of_the_borrowers_as_root_on_the_lender";
    if !support::root_or_say(test) {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("pair.key");
    storm_cluster::key::generate(&pair).unwrap();
    let (borrower_port, lender_port) = (free_port(), free_port());
    let borrower = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some("lt-borrow".into()),
        federation: federation(borrower_port),
        peers: vec![PeerEntry {
            borrow: true,
            mm_public_key_file: Some(pair.with_file_name("lender-mm.pub")),
            ..peer("lt-lend", lender_port, &pair)
        }],
        guests: vec![GuestOf {
            cluster: "lt-lend".into(),
            node: "node0".into(),
        }],
        ..LocalOptions::new(1)
    });
    let guest_file = support::guest_file_of(&borrower);
    let clean = std::fs::read_to_string(&guest_file).unwrap();
    // What the borrower's side planted on the lender's node, and the file naming it.
    let shared = support::shared_tempdir();
    let (pl, pl_ran) = planted(shared.path(), "launcher");
    let (health, health_ran) = planted(shared.path(), "health");
    // The borrower's own cluster file, as operators installed it before issue 61, naming
    // them.
    let own = std::fs::read_to_string(borrower.root.join("cluster.toml")).unwrap();
    let mut hostile: toml::Table = toml::from_str(&own).unwrap();
    hostile["cluster"]
        .as_table_mut()
        .unwrap()
        .insert("pl_path".into(), pl.display().to_string().into());
    let mut program = toml::Table::new();
    program.insert("program".into(), health.display().to_string().into());
    hostile.insert("health".into(), program.into());
    std::fs::write(&guest_file, toml::to_string(&hostile).unwrap()).unwrap();

    let lender = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some("lt-lend".into()),
        federation: FederationSection {
            warm_guests: true,
            ..federation(lender_port)
        },
        peers: vec![PeerEntry {
            lend: true,
            flock_user: Some("daemon".into()),
            guest_file: Some(guest_file.clone()),
            mm_public_key_file: None,
            ..peer("lt-borrow", borrower_port, &pair)
        }],
        ..LocalOptions::new(1)
    });
    support::install_lender_key(&lender, &pair.with_file_name("lender-mm.pub"));
    let node_log = || std::fs::read_to_string(lender.root.join("node0.log")).unwrap_or_default();
    let lend = || {
        let out = lender.storm(&["lend", "node0", "--to", "lt-borrow", "--for", "60"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    let reclaim = || {
        let out = lender.storm(&["reclaim", "--now", "node0"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        support::wait_until(Duration::from_secs(30), "the node comes home", || {
            (state_of(&lender, "node0") != "idle").then(|| state_of(&lender, "node0"))
        });
    };

    // The hostile file: lent, and nothing of it runs; the lender's log says why.
    lend();
    let refused = |log: &str| log.contains("[cluster] pl_path") && log.contains("[health]");
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !refused(&node_log()) && !pl_ran.exists() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    for marker in [&pl_ran, &health_ran] {
        assert!(
            !marker.exists(),
            "the borrower's script {} ran on the lender, as uid {}",
            marker.display(),
            std::fs::read_to_string(marker).unwrap_or_default().trim()
        );
    }
    assert!(
        refused(&node_log()),
        "the lender's NM log names the refused settings: {}",
        node_log()
    );
    assert_ne!(
        state_of(&borrower, "lt-lend-node0"),
        "idle",
        "a guest ran from a refused file"
    );
    reclaim();

    // The clean topology, but a file `nobody` owns: refused too.
    std::fs::write(&guest_file, &clean).unwrap();
    std::os::unix::fs::chown(&guest_file, Some(NOBODY), Some(NOBODY)).unwrap();
    lend();
    support::wait_until(
        Duration::from_secs(20),
        "the lender's NM refuses a guest file root did not install",
        || (!node_log().contains(&format!("belongs to uid {NOBODY}"))).then(&node_log),
    );
    assert_ne!(state_of(&borrower, "lt-lend-node0"), "idle");
    reclaim();

    // As root installed it: the lend works, and the borrowed task runs as the lender's
    // account, under the lender's own launcher.
    std::os::unix::fs::chown(&guest_file, Some(0), Some(0)).unwrap();
    lend();
    support::wait_until(Duration::from_secs(30), "the slot comes up", || {
        (state_of(&borrower, "lt-lend-node0") != "idle")
            .then(|| state_of(&borrower, "lt-lend-node0"))
    });
    // The task also tries to submit jobs of its own (issue 61, L1): through its STORM_SOCKET,
    // and straight to the lender's MM, as the lender's account for the borrower.
    let probe = support::script(
        shared.path(),
        "probe.sh",
        &format!(
            "echo \"$STORM_NODENAME uid=$(id -u)\"\n\
             if [ \"$STORM_NODENAME\" = lt-lend-node0 ]; then\n\
               {submit} --socket \"$STORM_SOCKET\" /bin/true 2>&1 | head -c 300; echo\n\
               env -u STORM_JOB_ID {submit} --socket {lender_sock} /bin/true 2>&1 | head -c 400; echo\n\
             fi\n",
            submit = env!("CARGO_BIN_EXE_storm-submit"),
            lender_sock = lender.socket.display(),
        ),
    );
    let out = borrower.submit_as(
        NOBODY,
        &["-N", "2", "--borrow", "--label", probe.to_str().unwrap()],
    );
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.contains("lt-lend-node0 uid=1"), "{said}");
    assert!(
        said.contains("no-machine-manager-is-reachable-from-a-lent-node"),
        "a borrowed task's STORM_SOCKET reaches no MM: {said}"
    );
    assert!(
        said.contains("flock_user") && said.contains("submits no jobs of its own"),
        "the lender's MM refuses a job of the borrower's account: {said}"
    );
    let q = text(&lender.storm(&["history"]).stdout);
    assert!(
        !q.lines().any(|l| l.contains("true")),
        "a job of the borrower's account ran at the lender: {q}"
    );
    for marker in [&pl_ran, &health_ran] {
        assert!(!marker.exists(), "a planted script ran");
    }
    reclaim();
    support::wait_until(Duration::from_secs(20), "the slot goes down", || {
        (state_of(&borrower, "lt-lend-node0") == "idle").then(|| "still idle".to_string())
    });

    // Issue 61, H3: the node is home, and its root (who holds the slot's keys for good) runs
    // a guest NM of its own for the slot: without a grant, then with one it signed itself.
    // The borrower admits neither; before, it took the slot as a member, lease or not.
    let forged = storm_cluster::identity::MmSigner::new(
        ed25519_dalek::SigningKey::from_bytes(&[7; 32]),
        "lt-lend",
    )
    .grant_lease(
        "lt-borrow",
        "node0",
        storm_cluster::daemon::unix_ms() + 600_000,
    );
    for grant in [None, Some(forged.to_hex())] {
        let until = (storm_cluster::daemon::unix_ms() + 600_000).to_string();
        let mut rogue = std::process::Command::new(support::bin_dir().join("storm-nm"));
        rogue
            .arg("--config")
            .arg(lender.root.join("cluster.toml"))
            .args([
                "--node",
                "node0",
                "--guest-of",
                "lt-borrow",
                "--lease-until",
                &until,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        if let Some(g) = &grant {
            rogue.args(["--lease-grant", g]);
        }
        let mut rogue = rogue.spawn().unwrap();
        std::thread::sleep(Duration::from_secs(4));
        let state = state_of(&borrower, "lt-lend-node0");
        let _ = rogue.kill();
        let _ = rogue.wait();
        assert_ne!(
            state, "idle",
            "the lending node's root joined the borrower outside a lease (grant: {grant:?})"
        );
    }
    let mm_log = std::fs::read_to_string(borrower.root.join("mm.log")).unwrap_or_default();
    assert!(
        mm_log.contains("refusing the registration of a guest slot"),
        "the borrower says why: {mm_log}"
    );
}
