//! `storm-submit --cpu-bind=none|cores|rank` (srun's `--cpu-bind`): which CPUs each rank may
//! run on, seen from inside the ranks: the kernel's `Cpus_allowed_list` in
//! `/proc/self/status`, beside what storm told them in `STORM_CPU_BIND` and
//! `STORM_CPU_BIND_LIST`. The clusters here have one node of this host's CPUs (the NM may use
//! the CPUs this test process may), so that the default binds as on a real node.

mod support;

use std::collections::BTreeMap;

use storm_cli::local::LocalOptions;
use storm_cluster::cpu_bind::{format_list, parse_list};
use support::{TestCluster, script, text};

/// The CPUs this process may run on, in order (what the cluster's NM inherits).
fn own_cpus() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status");
    parse_list(line.trim()).unwrap()
}

/// A cluster of `nodes` nodes of this host's CPUs each.
fn cluster(nodes: u32) -> TestCluster {
    TestCluster::with(LocalOptions {
        cpus: Some(own_cpus().len() as u32),
        ..LocalOptions::new(nodes)
    })
}

/// What each rank saw: rank -> (STORM_CPU_BIND, STORM_CPU_BIND_LIST or "unset", the CPUs
/// the kernel lets it use).
fn seen(c: &TestCluster, args: &[&str]) -> BTreeMap<u32, (String, String, Vec<u32>)> {
    let dir = tempfile::tempdir().unwrap();
    let prog = script(
        dir.path(),
        "where.sh",
        "echo \"$STORM_RANK ${STORM_CPU_BIND:-unset} ${STORM_CPU_BIND_LIST:-unset} \
         $(grep Cpus_allowed_list /proc/self/status | cut -f2)\"\n",
    );
    let mut all = args.to_vec();
    all.push(prog.to_str().unwrap());
    let out = c.submit(&all);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    stdout
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "a rank's line: {l:?}");
            (
                f[0].parse().unwrap(),
                (
                    f[1].to_string(),
                    f[2].to_string(),
                    parse_list(f[3]).unwrap(),
                ),
            )
        })
        .collect()
}

/// The default on a node running no more ranks than it has CPUs: each rank on CPUs of its
/// own, an equal share, and told which.
#[test]
fn by_default_each_rank_runs_on_cpus_of_its_own_and_is_told_which() {
    let cpus = own_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: this host lets the test use only {cpus:?}");
        return;
    }
    let c = cluster(1);
    let ranks = seen(&c, &["-n", "2"]);
    assert_eq!(ranks.len(), 2);
    let half = cpus.len() / 2;
    for (rank, want) in [(0, &cpus[..half]), (1, &cpus[half..])] {
        let (mode, list, allowed) = &ranks[&rank];
        assert_eq!(mode, "cores", "rank {rank}");
        assert_eq!(
            &allowed[..],
            want,
            "rank {rank} runs on its own half of the node"
        );
        assert_eq!(list, &format_list(want), "rank {rank} is told its CPUs");
    }
}

/// More ranks than CPUs (`-O`): `cores` leaves them on the whole node (nothing to share
/// out), while `rank` puts local rank k on the k-th CPU, round; `none` binds nothing.
#[test]
fn oversubscribed_ranks_are_left_unbound_unless_bound_by_rank() {
    let cpus = own_cpus();
    let c = cluster(1);
    let n = (cpus.len() * 2).to_string();
    let default = seen(&c, &["-O", "-n", &n]);
    for (rank, (mode, list, allowed)) in &default {
        assert_eq!(
            (mode.as_str(), list.as_str()),
            ("none", "unset"),
            "rank {rank}"
        );
        assert_eq!(allowed, &cpus, "rank {rank} may run anywhere");
    }
    let by_rank = seen(&c, &["-O", "-n", &n, "--cpu-bind", "rank"]);
    for (rank, (mode, _, allowed)) in &by_rank {
        assert_eq!(mode, "rank");
        assert_eq!(allowed, &[cpus[*rank as usize % cpus.len()]], "rank {rank}");
    }
    let none = seen(&c, &["-n", "1", "--cpu-bind", "none"]);
    assert_eq!(none[&0].2, cpus, "--cpu-bind none: the whole node");
    assert_eq!(none[&0].0, "none");
}

/// Two one-rank jobs sharing a node hold different CPUs of it (the MM's placement), and
/// each runs on its own: the placement reaches the kernel.
#[test]
fn jobs_sharing_a_node_run_on_the_cpus_each_holds() {
    let cpus = own_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: this host lets the test use only {cpus:?}");
        return;
    }
    let c = cluster(1);
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    // Each job says where it runs, then holds its CPU until both have said so.
    let prog = script(
        dir.path(),
        "hold.sh",
        &format!(
            "grep Cpus_allowed_list /proc/self/status | cut -f2\n\
             while [ ! -e {go} ]; do sleep 0.05; done\n",
            go = go.display()
        ),
    );
    let start = || {
        c.submit_cmd(&["-n", "1", prog.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    support::wait_until(std::time::Duration::from_secs(60), "both jobs run", || {
        let q = c.storm(&["queue"]);
        let running = text(&q.stdout).matches("running").count();
        (running < 2).then(|| format!("{running} running"))
    });
    std::fs::write(&go, b"").unwrap();
    let cpus_of = |child: std::process::Child| {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        parse_list(text(&out.stdout).trim()).unwrap()
    };
    let (a, b) = (cpus_of(a), cpus_of(b));
    assert_eq!((a.len(), b.len()), (1, 1), "one CPU each: {a:?} {b:?}");
    assert_ne!(a, b, "the two jobs run on different CPUs");
}

/// Two pretend nodes of one host share its CPUs and number them alike: by default neither
/// binds, so their ranks are not piled onto the same first CPU (as they were when an embedded
/// cluster whose nodes fit the host's CPUs was written with `cores`: CI's gang test then saw
/// a job's two ranks take turns on CPU 0).
#[test]
fn pretend_nodes_sharing_the_host_do_not_pile_their_ranks_onto_one_cpu() {
    let cpus = own_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: this host lets the test use only {cpus:?}");
        return;
    }
    let c = TestCluster::with(LocalOptions {
        cpus: Some(1),
        ..LocalOptions::new(2)
    });
    let ranks = seen(&c, &["-N", "2", "-n", "2"]);
    for (rank, (mode, list, allowed)) in &ranks {
        assert_eq!(
            (mode.as_str(), list.as_str()),
            ("none", "unset"),
            "rank {rank}"
        );
        assert_eq!(
            allowed, &cpus,
            "rank {rank} may run on any of the host's CPUs"
        );
    }
}

/// A mode storm does not know is refused before anything runs, naming the choices.
#[test]
fn an_unknown_mode_is_refused_naming_the_choices() {
    let c = TestCluster::start(1);
    let out = c.submit(&["--cpu-bind", "sockets", "true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("unknown --cpu-bind \"sockets\"") && err.contains("none, cores or rank"),
        "{err}"
    );
}
