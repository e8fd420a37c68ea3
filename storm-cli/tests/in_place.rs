//! Programs that find files next to themselves (issue 33, item 4), as their tasks see it: by
//! default a program that every node has at its path, the same file, runs in place, so a
//! binary that loads its library through `$ORIGIN` and a script that reads
//! `$(dirname "$0")/data` work as under srun; a program that is not the same on every node is
//! copied as it was submitted; and a copied program that then fails is told about
//! `--no-bcast`.
//!
//! Every node of these clusters sees this machine's file system, as nodes on a shared file
//! system do.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{TestCluster, script, text};

const LIBRARY: &str = r#"
const char *greeting(void) { return "hello from the library next to me"; }
"#;

const MAIN: &str = r#"
#include <stdio.h>
const char *greeting(void);
int main(void) { puts(greeting()); return 0; }
"#;

/// Builds `dir/app`, which loads `dir/libnext.so` through `-rpath '$ORIGIN'` (and only
/// there: no other search path has the library). `None` without a C compiler.
fn origin_binary(test: &str, dir: &Path) -> Option<std::path::PathBuf> {
    let lib = dir.join("libnext.so");
    let src = dir.join("next.c");
    std::fs::write(&src, LIBRARY).unwrap();
    let built = match std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            support::say_not_tested(test, &format!("needs a C compiler (cc): {e}"));
            return None;
        }
    };
    assert!(built.status.success(), "{}", text(&built.stderr));
    let app = dir.join("app");
    let main_src = dir.join("app.c");
    std::fs::write(&main_src, MAIN).unwrap();
    let out = std::process::Command::new("cc")
        .arg("-o")
        .arg(&app)
        .arg(&main_src)
        .arg(format!("-L{}", dir.display()))
        .args(["-lnext", "-Wl,-rpath,$ORIGIN"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    Some(app)
}

#[test]
fn programs_that_find_files_next_to_themselves_run_in_place() {
    let test = "programs_that_find_files_next_to_themselves_run_in_place";
    let c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    // A script that reads the file beside it, and says where it ran from.
    std::fs::write(work.path().join("data.txt"), "the data beside me\n").unwrap();
    let reader = script(
        work.path(),
        "reader.sh",
        "echo \"$0\"\ncat \"$(dirname \"$0\")/data.txt\"\n",
    );
    let out = c.submit(&["-N", "2", "-l", reader.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("{rank}: {}\n", reader.display())),
            "rank {rank} ran the program at its own path: {stdout}"
        );
        assert!(
            stdout.contains(&format!("{rank}: the data beside me\n")),
            "rank {rank} read the file next to it: {stdout}"
        );
    }

    let Some(app) = origin_binary(test, work.path()) else {
        return;
    };
    let out = c.submit(&["-N", "2", app.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        stdout.matches("hello from the library next to me").count(),
        2,
        "{stdout}{stderr}"
    );

    // Copied (--bcast), it has no library beside it: the loader fails (127), and the user is
    // told why and what runs it in place.
    let out = c.submit(&["-N", "2", "--bcast", app.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(stderr.contains("libnext.so"), "{stderr}");
    assert!(
        stderr.contains("ran from a copy") && stderr.contains("--no-bcast"),
        "{stderr}"
    );
    // --no-bcast runs it in place, with no check.
    let out = c.submit(&["-N", "2", "--no-bcast", app.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A program replaced at its path after submission is not the one submitted: the nodes'
/// digests differ from the MM's, so the job runs a copy of the program as it was submitted,
/// as it would without a shared file system.
#[test]
fn a_program_replaced_after_submission_runs_as_submitted_from_a_copy() {
    let c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    let gate = work.path().join("gate");
    let holder = script(
        work.path(),
        "holder.sh",
        &format!("while [ ! -e {} ]; do sleep 0.05; done\n", gate.display()),
    );
    let first = c.spawn(&["-N", "2", "--exclusive", holder.to_str().unwrap()]);
    // Wait until the holder runs, so that the next job must wait for the nodes.
    let until = Instant::now() + Duration::from_secs(30);
    while !text(&c.storm(&["queue"]).stdout).contains("running") {
        assert!(Instant::now() < until, "the first job never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    let prog = script(work.path(), "versioned.sh", "echo \"version 1 from $0\"\n");
    let second = c.spawn(&["-N", "2", "-l", prog.to_str().unwrap()]);
    let until = Instant::now() + Duration::from_secs(30);
    while c.queued_jobs().len() < 2 {
        assert!(Instant::now() < until, "the second job was never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Replaced (a new file renamed over it, as an editor or a build does) while it waits.
    let replacement = script(work.path(), "versioned.new", "echo \"version 2 from $0\"\n");
    std::fs::rename(&replacement, &prog).unwrap();
    std::fs::write(&gate, b"").unwrap();
    assert!(first.wait_with_output().unwrap().status.success());
    let out = second.wait_with_output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.matches("version 1 from").count(), 2, "{stdout}");
    assert!(!stdout.contains("version 2"), "{stdout}");
    for rank in 0..2 {
        let spool = c.root.join(format!("node{rank}"));
        assert!(
            stdout.contains(&format!("{rank}: version 1 from {}", spool.display())),
            "rank {rank} ran its node's copy: {stdout}"
        );
    }
}
