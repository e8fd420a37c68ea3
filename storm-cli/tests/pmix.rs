//! PMIx under storm-submit, seen from the tasks and from another local user: a PMIx program
//! is one world with no flags on pretend nodes, `PMIx_Abort` ends its job with its status,
//! the node's PMIx server runs apart as its unprivileged account and leaves nothing behind,
//! and a local user who claims another user's account cannot join that user's job.
//!
//! Needs OpenPMIx's headers (Debian: libpmix-dev, found with pkg-config) and a running munged
//! (Debian: munge; `.ci/run` installs and starts both); without them each test says NOT
//! TESTED.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use storm_cli::local::LocalOptions;
use storm_cluster::config::PmixSecurity;
use support::mpi::{pmix_program, sorted_lines};
use support::{TestCluster, text};

/// A job's account in the attack (Debian's `daemon`) and the attacker's (`bin`).
const VICTIM: u32 = 1;
const ATTACKER: u32 = 2;

/// The inodes of the TCP sockets listening on loopback at `ports` (from /proc/net/tcp).
fn listening_inodes(ports: &[u16]) -> Vec<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            (f.get(3) == Some(&"0A") && ports.contains(&port)).then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

/// The processes named `storm-pmix`: (pid, real uid, effective uid).
fn helpers() -> Vec<(u32, u32, u32)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if !status.lines().any(|l| l == "Name:\tstorm-pmix") {
            continue;
        }
        let uids: Vec<u32> = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        found.push((pid, uids[0], uids[1]));
    }
    found
}

/// A PMIx program of 4 ranks on 2 pretend nodes, with no option: every rank sees a job of
/// 4, its local rank, and its neighbour's key across the fence, whichever node that
/// neighbour is on. Each node's PMIx server is a helper process of `nobody` (the NMs run as
/// root here), not of root; when the cluster stops, nothing of theirs is left in the nodes'
/// scratch space.
#[test]
fn a_pmix_program_is_one_world_with_no_flags_on_pretend_nodes() {
    let test = "pmix: one world with no flags";
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = pmix_program(test, dir.path(), "pmix_client") else {
        return;
    };
    let c = TestCluster::start(2);
    let name = c.cluster.as_ref().unwrap().config().cluster.name.clone();
    // Five runs: a rank's PMIx_Finalize returns only once its NM has taken it, so its exit
    // never overtakes it (before, one run in two ended 'left without calling MPI_Finalize').
    for run in 1..=5 {
        let out = c.submit(&["-N", "2", "-n", "4", client.to_str().unwrap()]);
        assert!(out.status.success(), "run {run}: {}", text(&out.stderr));
        assert_eq!(
            sorted_lines(&out.stdout),
            [
                "rank 0 of 4 (local 0) got: hello from 1",
                "rank 1 of 4 (local 1) got: hello from 2",
                "rank 2 of 4 (local 0) got: hello from 3",
                "rank 3 of 4 (local 1) got: hello from 0",
            ],
            "run {run}: {}",
            text(&out.stderr)
        );
    }
    let root = nix::unistd::geteuid().is_root();
    if root {
        let nobody = nix::unistd::User::from_name("nobody")
            .unwrap()
            .expect("a nobody account")
            .uid
            .as_raw();
        let ours: Vec<_> = helpers()
            .into_iter()
            .filter(|(pid, ..)| {
                std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|cmd| cmd.contains(&format!("storm-{name}-node")))
            })
            .collect();
        assert_eq!(ours.len(), 2, "one PMIx helper per node: {ours:?}");
        // The NMs' listening sockets (handed to them as descriptor 3) are not the
        // helpers': unprivileged, a helper holding one could accept the NM's connections.
        let ports: Vec<u16> = c
            .cluster
            .as_ref()
            .unwrap()
            .config()
            .nodes
            .iter()
            .map(|n| n.address.port())
            .collect();
        let nm_listeners = listening_inodes(&ports);
        assert_eq!(nm_listeners.len(), 2, "both NMs listen: {nm_listeners:?}");
        for (pid, ruid, euid) in ours {
            assert_eq!((ruid, euid), (nobody, nobody), "helper {pid} is nobody's");
            let held: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .flatten()
                .filter_map(|e| {
                    let link = std::fs::read_link(e.path()).ok()?;
                    let link = link.to_str()?;
                    link.strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .parse()
                        .ok()
                })
                .collect();
            assert!(
                !held.iter().any(|i| nm_listeners.contains(i)),
                "helper {pid} holds an NM's listening socket"
            );
        }
    }
    drop(c);
    for node in ["node0", "node1"] {
        let root = Path::new("/dev/shm").join(format!("storm-{name}-{node}"));
        assert!(
            !root.exists(),
            "{} is left, holding {:?}",
            root.display(),
            std::fs::read_dir(&root)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
    }
}

/// A PMIx program whose fence collects no data (PMIx_Fence's default), or that has no fence
/// at all, still reads a neighbour's key on the other node: its node's PMIx server fetches
/// it from that rank's node (a direct modex, through the MM), waiting, without a fence,
/// until that rank has committed it. Before, the server answered "not supported" and the
/// client's PMIx_Get failed (exit 4).
#[test]
fn a_remote_key_no_fence_collected_comes_by_direct_modex() {
    let test = "pmix: direct modex";
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = pmix_program(test, dir.path(), "pmix_client") else {
        return;
    };
    let c = TestCluster::start(2);
    for mode in ["dmodex", "nofence", "dmodex"] {
        let out = support::output_within(
            c.submit_cmd(&["-N", "2", "-n", "4", client.to_str().unwrap(), mode]),
            Duration::from_secs(60),
        )
        .expect("the job ended");
        assert!(out.status.success(), "{mode}: {}", text(&out.stderr));
        assert_eq!(
            sorted_lines(&out.stdout),
            [
                "rank 0 of 4 (local 0) got: hello from 1",
                "rank 1 of 4 (local 1) got: hello from 2",
                "rank 2 of 4 (local 0) got: hello from 3",
                "rank 3 of 4 (local 1) got: hello from 0",
            ],
            "{mode}: {}",
            text(&out.stderr)
        );
    }
}

/// A rank's end is a PMIx event for its job's other ranks, as PRRTE raises it: rank 3 of
/// 4 (node 1) exits 7 after finalizing; rank 2 beside it and ranks 0 and 1 on the other
/// node each hear "rank 3 ended" with its code, and finish. Before, nothing was raised and
/// each waited its 30 s in vain.
#[test]
fn a_ranks_end_is_a_pmix_event_for_the_others_on_every_node() {
    let test = "pmix: rank end events";
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = pmix_program(test, dir.path(), "pmix_client") else {
        return;
    };
    let c = TestCluster::start(2);
    let out = support::output_within(
        c.submit_cmd(&["-N", "2", "-n", "4", client.to_str().unwrap(), "ends"]),
        Duration::from_secs(90),
    )
    .expect("the job ended");
    // PMIX_ERR_EXIT_NONZERO_TERM.
    let heard = "heard: rank 3 ended: event -404 exit code 7";
    assert_eq!(
        sorted_lines(&out.stdout),
        [0, 1, 2].map(|r| format!("rank {r} {heard}")),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
}

/// `PMIx_Abort(5)` in one rank ends the whole job, on both nodes, with exit code 5, and the
/// reason names the rank and its message.
#[test]
fn pmix_abort_ends_the_job_with_its_status() {
    let test = "pmix: PMIx_Abort";
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = pmix_program(test, dir.path(), "pmix_client") else {
        return;
    };
    let c = TestCluster::start(2);
    let out = support::output_within(
        c.submit_cmd(&["-N", "2", "-n", "4", client.to_str().unwrap(), "abort", "5"]),
        Duration::from_secs(60),
    )
    .expect("the aborted job ended");
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("rank 1") && text(&out.stderr).contains("rank 1 gives up"),
        "{}",
        text(&out.stderr)
    );
}

/// A job whose ranks give one fence more data than a node may (`pmi_node_bytes`, 32 KiB)
/// ends, the reason naming the limit; the node's PMIx server goes on serving the next job
/// (the helper does not pass such data on, so the NM never gives up its link to it).
#[test]
fn pmix_data_over_the_node_limit_ends_the_job_naming_it_and_pmix_goes_on() {
    let test = "pmix: a fence over pmi_node_bytes";
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = pmix_program(test, dir.path(), "pmix_client") else {
        return;
    };
    let c = TestCluster::start(2);
    let client = client.to_str().unwrap();
    let out = support::output_within(
        c.submit_cmd(&["-N", "2", "-n", "4", client, "big", "100000"]),
        Duration::from_secs(60),
    )
    .expect("the job ended");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("pmi_node_bytes"),
        "the reason names the limit: {}",
        text(&out.stderr)
    );
    let out = c.submit(&["-N", "2", "-n", "4", client]);
    assert!(
        out.status.success() && text(&out.stdout).lines().count() == 4,
        "the next PMIx job: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// What a local user obtains by claiming a victim's account to the node's PMIx server: the
/// intruder's own output and the victim's job.
fn attack(
    test: &str,
    pmix: PmixSecurity,
    modes: &[Option<&str>],
) -> Option<(String, std::process::Output)> {
    let work = support::shared_tempdir();
    let intruder = pmix_program(test, work.path(), "pmix_intruder")?;
    let c = TestCluster::with(LocalOptions {
        cpus: Some(2),
        pmix,
        ..LocalOptions::new(1)
    });
    let w = work.path().display();
    // Rank 0 leaves its PMIx variables where the test finds them (what an attacker learns
    // from /proc/net/tcp and the job's number); rank 1 never connects. Both wait for the
    // attack to be over.
    let victim_script = support::script(
        work.path(),
        "victim",
        &format!(
            "if [ \"$PMIX_RANK\" = 0 ]; then env | grep '^PMIX_' > {w}/env.tmp && mv {w}/env.tmp {w}/env; fi\n\
             for i in $(seq 300); do [ -e {w}/over ] && break; sleep 0.1; done\n\
             echo \"rank $PMIX_RANK done\"\n"
        ),
    );
    let victim = c
        .submit_cmd_as(VICTIM, &["-n", "2", victim_script.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        support::wait_for_path(&work.path().join("env"), Duration::from_secs(30)),
        "the victim's job did not start"
    );
    let vars = std::fs::read_to_string(work.path().join("env")).unwrap();
    // Once per mode: with the check the server named (PMIX_SECURITY_MODE, `None`), or
    // insisting on another (the library's native one, where the claim is all there is).
    let mut said = String::new();
    for &mode in modes {
        let mut cmd = Command::new(&intruder);
        cmd.env_clear();
        for line in vars.lines() {
            if let Some((k, v)) = line.split_once('=') {
                cmd.env(k, if k == "PMIX_RANK" { "1" } else { v });
            }
        }
        if let Some(mode) = mode {
            cmd.env("PMIX_SECURITY_MODE", mode);
        }
        {
            use std::os::unix::process::CommandExt;
            cmd.env("FORGE_UID", VICTIM.to_string())
                .env("FORGE_GID", VICTIM.to_string())
                .uid(ATTACKER)
                .gid(ATTACKER);
        }
        // What it printed, whether it ends or hangs in PMIx_Init (refused by a server that
        // never answers it); a hang counts as refused, once it has had 15 s.
        let log = work.path().join("intruder.out");
        let file = std::fs::File::create(&log).unwrap();
        let mut child = cmd
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(15);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let hung = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let _ = child.wait();
        let out = std::fs::read_to_string(&log).unwrap();
        said += &if hung && out.is_empty() {
            "refused: no answer in 15 s\n".to_string()
        } else {
            out
        };
    }
    std::fs::write(work.path().join("over"), "").unwrap();
    let victim = victim.wait_with_output().unwrap();
    Some((said, victim))
}

/// The attacker is a local user (`bin`) who claims another user's account (`daemon`) to the
/// node's PMIx server, as rank 1 of that user's job, and calls `PMIx_Abort(42)`. Over TCP the
/// library's own check takes the claim; with `[cluster] pmix = "native"` the intruder joins
/// the job and ends it with 42 (the control: the attack is real). With MUNGE, the default, it
/// is refused, whichever check it asks for, and the victim's job runs to its end.
#[test]
fn a_local_user_cannot_pose_as_a_rank_of_another_users_job() {
    let test = "pmix: a local user posing as another's rank";
    if !support::root_or_say(test) {
        return;
    }
    let Some((intruder, victim)) = attack(test, PmixSecurity::Native, &[None]) else {
        return;
    };
    assert!(
        intruder.contains("connected as rank 1 of storm-"),
        "the control: with native checks the intruder joins: {intruder}"
    );
    assert_eq!(
        victim.status.code(),
        Some(42),
        "the control: the intruder ended the job: {}",
        text(&victim.stderr)
    );

    let (intruder, victim) = attack(test, PmixSecurity::Munge, &[None, Some("native")]).unwrap();
    assert!(
        intruder.lines().count() == 2 && intruder.lines().all(|l| l.starts_with("refused")),
        "the intruder joined another user's job: {intruder}"
    );
    assert!(
        victim.status.success(),
        "the victim's job was ended: {}",
        text(&victim.stderr)
    );
    assert_eq!(sorted_lines(&victim.stdout), ["rank 0 done", "rank 1 done"]);
}
