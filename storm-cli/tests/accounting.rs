//! Accounting as sacct users read it (issue 33, item 5), from the outside: a job the kernel
//! kills for want of memory ends `out_of_memory` and its submitter is told so, and the
//! history keeps what the cluster file's `[history]` says, across a restart of the MM.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use storm_cluster::config::{CgroupMode, HistorySection};
use support::{TestCluster, script, text};

/// The `storm history --json` records, oldest first.
fn history(c: &TestCluster) -> Vec<serde_json::Value> {
    let out = c.storm(&["history", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["jobs"].as_array().cloned().unwrap_or_default()
}

fn wait_for(path: &Path) {
    assert!(
        support::wait_for_path(path, Duration::from_secs(30)),
        "{} never appeared",
        path.display()
    );
}

/// The memory hierarchy the job's cgroup is in, as its task wrote /proc/self/cgroup, with
/// the file that caps its memory: v1's `memory.limit_in_bytes`, or v2's `memory.max`.
fn memory_limit_file(proc_cgroup: &str) -> Option<std::path::PathBuf> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some(Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')))
                .map(|d| d.join("memory.limit_in_bytes"));
        }
        if controllers.is_empty() {
            // The unified hierarchy; it caps memory only where the controller is enabled.
            let unified = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .into_iter()
                .map(|root| Path::new(root).join(path.trim_start_matches('/')))
                .find(|d| d.join("memory.max").exists());
            if let Some(d) = unified {
                return Some(d.join("memory.max"));
            }
        }
    }
    None
}

/// A task that outgrows the memory its job's cgroup allows (capped here from outside, as an
/// administrator would; `--mem` caps it from the job's own request, tests/memory.rs) is killed by the kernel. sacct says OUT_OF_MEMORY,
/// not FAILED, and srun says the step was OOM-killed: so do `storm history` and storm-submit.
#[test]
fn a_job_the_kernel_kills_for_memory_ends_out_of_memory() {
    let test = "a_job_the_kernel_kills_for_memory_ends_out_of_memory";
    if !support::root_or_say(test) {
        return;
    }
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cgroups: CgroupMode::Auto,
        ..storm_cli::local::LocalOptions::new(1)
    });
    let work = support::shared_tempdir();
    let (ready, go) = (work.path().join("ready"), work.path().join("go"));
    // `tail` keeps a "line" of 512 MiB of zeroes (no newline) in memory.
    let hog = script(
        work.path(),
        "hog.sh",
        &format!(
            "cat /proc/self/cgroup > {r}.tmp && mv {r}.tmp {r}\n\
             while [ ! -e {g} ]; do sleep 0.02; done\n\
             head -c 512M /dev/zero | tail > /dev/null\n",
            r = ready.display(),
            g = go.display()
        ),
    );
    let job = c.spawn(&["-N", "1", "--no-bcast", hog.to_str().unwrap()]);
    wait_for(&ready);
    let cgroups = std::fs::read_to_string(&ready).unwrap();
    let Some(limit) = memory_limit_file(&cgroups).filter(|f| f.exists()) else {
        support::say_not_tested(
            test,
            &format!("the job's cgroup has no memory controller here: {cgroups}"),
        );
        std::fs::write(&go, b"").unwrap();
        let _ = job.wait_with_output();
        return;
    };
    std::fs::write(&limit, b"67108864").unwrap();
    std::fs::write(&go, b"").unwrap();
    let out = job.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    // The shell's last command was killed (SIGKILL): it exits 137.
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("out of memory") && stderr.contains("OOM killer"),
        "{stderr}"
    );
    let jobs = history(&c);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["state"], "out_of_memory", "{jobs:?}");
    let listed = text(&c.storm(&["history", "--state", "out_of_memory"]).stdout);
    assert!(listed.contains("hog.sh"), "{listed}");
    // A job that merely fails is `failed`, not out of memory.
    let out = c.submit(&["-N", "1", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(history(&c)[1]["state"], "failed");
}

/// `[history] max_jobs`: past it the oldest ended jobs go, from `storm history` and from the
/// journal, so a restarted MM does not bring them back.
#[test]
fn the_history_keeps_at_most_max_jobs_across_an_mm_restart() {
    let mut c = TestCluster::with(storm_cli::local::LocalOptions {
        history: HistorySection {
            keep_days: 30,
            max_jobs: 2,
        },
        ..storm_cli::local::LocalOptions::new(1)
    });
    for n in 1..=4 {
        let out = c.submit(&["-N", "1", "-J", &format!("job{n}"), "true"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let names = |c: &TestCluster| -> Vec<String> {
        history(c)
            .iter()
            .map(|j| j["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&c), ["job3", "job4"]);
    let cluster = c.cluster.as_mut().unwrap();
    cluster.kill_mm().unwrap();
    cluster.restart_mm().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = c.storm(&["history", "--json"]);
        if out.status.success() {
            break;
        }
        assert!(Instant::now() < until, "the MM did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(names(&c), ["job3", "job4"]);
}
