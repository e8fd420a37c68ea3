//! `storm start --hosts` over ssh, as a user on a plain host list would run it: the
//! namespace testbed's network (every host a network namespace with its own address, joined
//! by a bridge), a real OpenSSH server (Debian's sshd) in each host's namespace standing in
//! for the site's, a user the test makes with a key of their own, and `storm start` run by
//! that user from another namespace.
//!
//! Seen from outside: where each rank of the user's job ran (its network namespace), as
//! whom, the command's exit code through `storm start`, and what is left afterwards; and
//! what a user sees when one host cannot be reached.
//!
//! Needs root (namespaces, sshd, the user) and sshd (`openssh-server`); without sshd each
//! test says NOT TESTED.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use storm_cli::testbed::{Testbed, node_addr};
use support::testbed::{can_run as can_make_namespaces, options};
use support::{bin_dir, text};

const SSHD: &str = "/usr/sbin/sshd";
const USER: &str = "storm-uh";

/// One test at a time: each looks at the user's processes.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn can_run(test: &str) -> bool {
    if !Path::new(SSHD).is_file() {
        support::say_not_tested(test, "no sshd here (apt install openssh-server)");
        return false;
    }
    if !support::root_or_say(test) || !can_make_namespaces(test) {
        return false;
    }
    support::ensure_daemons();
    true
}

/// The test's user (`useradd`), able to log in by key: an account made by useradd has a
/// locked password (`!`), which sshd without PAM reads as a locked account; `*` is no
/// password at all, not a lock.
fn user() -> (u32, u32) {
    let who = support::test_user(USER);
    let unlocked = Command::new("usermod")
        .args(["-p", "*", USER])
        .status()
        .expect("usermod");
    assert!(unlocked.success());
    who
}

/// A network of `hosts` namespaces under `work`, each running sshd on port 22 of its
/// address that lets the test's user in with the key it returns (`work/user/id`).
struct Site {
    tb: Testbed,
    key: PathBuf,
}

fn site(hosts: u32, work: &Path, who: (u32, u32)) -> Site {
    let mut tb = Testbed::network_only(&options(hosts, work)).expect("the hosts' network");
    let keygen = |file: &Path, as_user: bool| {
        let mut cmd = Command::new("ssh-keygen");
        cmd.args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(file);
        if as_user {
            cmd.uid(who.0).gid(who.1);
        }
        assert!(cmd.status().expect("ssh-keygen").success());
    };
    let host_key = work.join("host_key");
    keygen(&host_key, false);
    let user_dir = work.join("user");
    std::fs::create_dir(&user_dir).unwrap();
    std::fs::set_permissions(&user_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    nix::unistd::chown(&user_dir, Some(who.0.into()), Some(who.1.into())).unwrap();
    let key = user_dir.join("id");
    keygen(&key, true);
    let authorized = work.join("authorized_keys");
    std::fs::copy(key.with_extension("pub"), &authorized).unwrap();
    let config = work.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "HostKey {}\nAuthorizedKeysFile {}\nStrictModes no\nUsePAM no\nPidFile none\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nAllowUsers {USER}\n\
             LogLevel ERROR\n",
            host_key.display(),
            authorized.display()
        ),
    )
    .unwrap();
    // sshd's privilege separation directory, as its package's service makes it.
    std::fs::create_dir_all("/run/sshd").unwrap();
    for i in 0..hosts {
        let ns = tb.node_ns(i);
        tb.spawn_program(
            &ns,
            &format!("sshd-{i}"),
            Path::new(SSHD),
            &[
                "-D".into(),
                "-e".into(),
                "-f".into(),
                config.display().to_string(),
                "-o".into(),
                format!("ListenAddress={}", node_addr(i)),
            ],
        )
        .expect("sshd");
    }
    // Every sshd listens before the test goes on.
    let addrs: Vec<_> = (0..hosts).map(node_addr).collect();
    let listening = tb
        .in_node(0, move || {
            addrs.iter().all(|a| {
                (0..200).any(|_| {
                    let ok = std::net::TcpStream::connect((*a, 22)).is_ok();
                    if !ok {
                        std::thread::sleep(Duration::from_millis(25));
                    }
                    ok
                })
            })
        })
        .unwrap();
    assert!(listening, "every host's sshd listens");
    Site { tb, key }
}

impl Site {
    /// `storm start --hosts HOSTS ARGS` as the user, from the MM's namespace (a login
    /// node beside the hosts), within `limit`.
    fn start(&self, who: (u32, u32), hosts: &str, args: &[&str], limit: Duration) -> Output {
        self.start_in(who, hosts, args, limit, None)
    }

    /// [`Site::start`], the front end's `TMPDIR` (its instance directory, the MM's socket)
    /// a file system of its own at `private` if given: as on a cluster whose login node's
    /// /tmp no compute node sees.
    fn start_in(
        &self,
        who: (u32, u32),
        hosts: &str,
        args: &[&str],
        limit: Duration,
        private: Option<&Path>,
    ) -> Output {
        let ssh = format!(
            "ssh -F /dev/null -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
             -o LogLevel=ERROR -o ConnectTimeout=5",
            self.key.display()
        );
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.tb.mm_ns()))
            .arg("--");
        if let Some(dir) = private {
            cmd.args(["unshare", "--mount", "--propagation", "private", "--"])
                .args([
                    "sh",
                    "-c",
                    r#"mount -t tmpfs -o mode=1777 tmpfs "$0" && exec "$@""#,
                ])
                .arg(dir)
                .env("TMPDIR", dir);
        }
        cmd.arg("setpriv")
            .arg(format!("--reuid={}", who.0))
            .arg(format!("--regid={}", who.1))
            .args(["--clear-groups", "--"])
            .arg(bin_dir().join("storm"))
            .args(["start", "--hosts", hosts, "--ssh", &ssh, "--"])
            .args(args)
            .current_dir("/tmp")
            .env("STORM_BIN_DIR", bin_dir())
            .env_remove("STORM_CONFIG")
            .env_remove("STORM_SOCKET");
        support::output_within(cmd, limit).expect("storm start ended in time")
    }
}

/// What `uid` left after sshd reaped its sessions (a moment after the last ssh ended):
/// its processes, and storm's directories of its in the temporary directory.
fn left_by(uid: u32) -> (Vec<(u32, String)>, Vec<PathBuf>) {
    for _ in 0..100 {
        if support::processes_of(uid).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (support::processes_of(uid), support::start_leftovers_of(uid))
}

/// What each test starts from: its turn, the user, a work directory others may enter, and a
/// site of hosts in it.
struct Setup {
    _one: std::sync::MutexGuard<'static, ()>,
    who: (u32, u32),
    work: tempfile::TempDir,
    site: Site,
}

/// A [`Setup`] with `hosts` hosts; `None` (said why) where the test cannot run here.
fn setup(test: &str, hosts: u32) -> Option<Setup> {
    if !can_run(test) {
        return None;
    }
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let who = user();
    let work = tempfile::tempdir().unwrap();
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let site = site(hosts, work.path(), who);
    Some(Setup {
        _one: one,
        who,
        work,
        site,
    })
}

/// Nothing of `uid`'s is left once sshd reaped its sessions: no process, no directory.
fn assert_nothing_left(uid: u32) {
    let (procs, dirs) = left_by(uid);
    assert!(procs.is_empty(), "the user's processes left: {procs:?}");
    assert!(dirs.is_empty(), "the instance's directories left: {dirs:?}");
}

/// The network namespace a rank reports (`readlink /proc/self/ns/net`: `net:[INODE]`) for
/// host `i` of the site.
fn namespace_of(tb: &Testbed, i: u32) -> String {
    let ino = std::fs::metadata(format!("/run/netns/{}", tb.node_ns(i)))
        .unwrap()
        .ino();
    format!("net:[{ino}]")
}

/// Over four hosts reached only by ssh, a user's `storm start --hosts` runs a 4-node job
/// with one rank in each host's own network namespace, as the user; the instance's exit
/// code is the command's; and afterwards nothing of it is left: no process of the user on
/// any host, no directory.
#[test]
fn a_user_starts_an_instance_over_ssh_on_a_host_list_and_it_leaves_nothing() {
    let test = "a_user_starts_an_instance_over_ssh_on_a_host_list_and_it_leaves_nothing";
    let Some(Setup {
        _one,
        who,
        work,
        site,
    }) = setup(test, 4)
    else {
        return;
    };
    let script = support::script(
        work.path(),
        "where.sh",
        "echo \"$STORM_NODEID $(readlink /proc/self/ns/net) $(id -u)\"\n",
    );
    let hosts: Vec<String> = (0..4).map(|i| node_addr(i).to_string()).collect();
    let out = site.start(
        who,
        &hosts.join(","),
        &[
            "sh",
            "-c",
            &format!(
                "{} -N 4 -n 4 {} && exit 7",
                bin_dir().join("storm-submit").display(),
                script.display()
            ),
        ],
        Duration::from_secs(120),
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "the command's code: stdout {stdout}\nstderr {}",
        text(&out.stderr)
    );
    let mut seen: Vec<(u32, String, u32)> = stdout
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 3, "NODEID NS UID: {l:?}");
            (
                w[0].parse().unwrap(),
                w[1].to_string(),
                w[2].parse().unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 4, "a rank on each host: {stdout}");
    for (i, (node, ns, uid)) in seen.iter().enumerate() {
        assert_eq!(*node, i as u32);
        assert_eq!(
            ns,
            &namespace_of(&site.tb, i as u32),
            "rank on node {i} ran in host {i}'s namespace"
        );
        assert_eq!(*uid, who.0, "as the user");
    }
    assert_nothing_left(who.0);
}

/// A host that cannot be reached ends the start with 1 and a message that names it and
/// what ssh needs, and the agents already started on the other hosts stop: nothing is left.
#[test]
fn an_unreachable_host_is_named_and_the_others_leave_nothing() {
    let test = "an_unreachable_host_is_named_and_the_others_leave_nothing";
    let Some(Setup {
        _one,
        who,
        work,
        site,
    }) = setup(test, 2)
    else {
        return;
    };
    // A host file: the second line an address no namespace has.
    let hosts = work.path().join("hosts");
    std::fs::write(
        &hosts,
        format!("# two hosts\n{} slots=2\n{}\n", node_addr(0), node_addr(40)),
    )
    .unwrap();
    let out = site.start(
        who,
        hosts.to_str().unwrap(),
        &["true"],
        Duration::from_secs(60),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let unreachable = node_addr(40).to_string();
    assert!(
        stderr.contains(&format!(
            "the node agent on {unreachable} ended with code 255"
        )) && stderr.contains(&format!("ssh {unreachable} true")),
        "names the host and ssh: {stderr}"
    );
    assert_nothing_left(who.0);
}

/// A batch job's steps, on the hosts, reach the instance's MM through their node's control
/// relay: the MM's socket is only in the front end's own file system (a tmpfs in its mount
/// namespace, as a login node's /tmp that no compute node sees). The script's step runs on
/// both of its nodes and its code is 0.
#[test]
fn a_batch_scripts_steps_reach_the_instance_from_its_nodes() {
    let test = "a_batch_scripts_steps_reach_the_instance_from_its_nodes";
    let Some(Setup {
        _one,
        who,
        work,
        site,
    }) = setup(test, 2)
    else {
        return;
    };
    let private = work.path().join("front-tmp");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let script = support::script(
        work.path(),
        "steps.sh",
        &format!(
            "#!/bin/sh\n{} -N 2 -l sh -c 'echo \"step on $STORM_NODEID\"'\necho \"step rc=$?\"\n",
            bin_dir().join("storm-submit").display()
        ),
    );
    let out_file = work.path().join("user").join("steps.out");
    let hosts = format!("{},{}", node_addr(0), node_addr(1));
    let out = site.start_in(
        who,
        &hosts,
        &[
            bin_dir().join("storm").to_str().unwrap(),
            "batch",
            "-W",
            "-N",
            "2",
            "-o",
            out_file.to_str().unwrap(),
            script.to_str().unwrap(),
        ],
        Duration::from_secs(120),
        Some(&private),
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let written = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert!(
        written.contains("0: step on 0")
            && written.contains("1: step on 1")
            && written.contains("step rc=0"),
        "the step ran on both nodes: {written}\n{stderr}"
    );
    assert_nothing_left(who.0);
}
