//! The submitter's umask reaches their job (issue 61, finding L2), as Slurm's `SLURM_UMASK`
//! carries it: a user under `umask 077` gets output files and task files that no one else
//! may read, from `storm-submit` and from `storm batch -o`. Before, both were 0644 whatever
//! the submitter's mask (the launcher's own, 022).

mod support;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use support::{NOBODY, TestCluster, text};

/// Runs `sh -c script` as nobody under `umask mask`, with this cluster's socket.
fn as_nobody_with_umask(c: &TestCluster, mask: &str, script: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("umask {mask}; {script}"))
        .env("SOCK", &c.socket)
        .env("SUBMIT", env!("CARGO_BIN_EXE_storm-submit"))
        .env("STORM", env!("CARGO_BIN_EXE_storm"))
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap()
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o777
}

#[test]
fn a_jobs_files_are_made_under_its_submitters_umask() {
    let test = "a_jobs_files_are_made_under_its_submitters_umask";
    if !support::root_or_say(test) {
        return;
    }
    let c = TestCluster::start(1);
    let work = support::shared_tempdir();
    let d = work.path().display();
    for (mask, want) in [("077", 0o600), ("022", 0o644)] {
        let task_file = work.path().join(format!("task-{mask}"));
        let out = as_nobody_with_umask(
            &c,
            mask,
            &format!("\"$SUBMIT\" --socket \"$SOCK\" sh -c 'echo x > {d}/task-{mask}'"),
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            mode(&task_file),
            want,
            "a file a task made under the submitter's umask {mask}"
        );
        let batch_out = work.path().join(format!("batch-{mask}.out"));
        let made = work.path().join(format!("batch-made-{mask}"));
        let out = as_nobody_with_umask(
            &c,
            mask,
            &format!(
                "cd {d} && \"$STORM\" --socket \"$SOCK\" batch --wait -o {} --wrap 'echo hi; \
                 echo y > {}'",
                batch_out.display(),
                made.display()
            ),
        );
        assert!(
            out.status.success(),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert_eq!(
            mode(&batch_out),
            want,
            "a batch job's -o file, umask {mask}"
        );
        assert_eq!(mode(&made), want, "a batch script's own file, umask {mask}");
    }
}
