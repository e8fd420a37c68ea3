//! Building the MPI and PMIx test programs (`tests/mpi/*.c`) with the MPIs Debian installs,
//! or saying why a test cannot run without them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{say_not_tested, text};

/// `tool.<flavour>` if Debian's alternatives installed it under that name, else `tool`.
pub fn mpi_tool(tool: &str, flavour: &str) -> String {
    let named = format!("{tool}.{flavour}");
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(&named).is_file()));
    if found { named } else { tool.to_string() }
}

/// Compiles `tests/mpi/<name>.c` with MPICH's mpicc into `dir`, or says why the test cannot
/// run.
pub fn mpi_program(test: &str, dir: &Path, name: &str) -> Option<PathBuf> {
    compile(
        test,
        &mpi_tool("mpicc", "mpich"),
        dir,
        name,
        "mpich and libmpich-dev",
    )
}

/// Compiles `tests/mpi/<name>.c` with Open MPI's mpicc into `dir`, or says why the test
/// cannot run.
pub fn open_mpi_program(test: &str, dir: &Path, name: &str) -> Option<PathBuf> {
    let mpicc = mpi_tool("mpicc", "openmpi");
    if mpicc == "mpicc" {
        say_not_tested(
            test,
            "mpicc.openmpi is not installed; install openmpi-bin and libopenmpi-dev",
        );
        return None;
    }
    compile(test, &mpicc, dir, name, "openmpi-bin and libopenmpi-dev")
}

/// Compiles `tests/mpi/<name>.c` with `mpicc` into `dir`, or says why the test cannot run
/// (`packages` to install).
pub fn compile(test: &str, mpicc: &str, dir: &Path, name: &str, packages: &str) -> Option<PathBuf> {
    let src = source(name);
    let out = dir.join(name);
    match Command::new(mpicc).arg("-o").arg(&out).arg(&src).output() {
        Ok(o) if o.status.success() => Some(out),
        Ok(o) => panic!("{mpicc} failed on {}: {}", src.display(), text(&o.stderr)),
        Err(e) => {
            say_not_tested(
                test,
                &format!("{mpicc} is not installed ({e}); install {packages}"),
            );
            None
        }
    }
}

/// Compiles `tests/mpi/<name>.c` against OpenPMIx into `dir`, or says why the test cannot
/// run (no libpmix-dev, or no munged to check credentials with).
pub fn pmix_program(test: &str, dir: &Path, name: &str) -> Option<PathBuf> {
    let flags = match Command::new("pkg-config")
        .args(["--cflags", "--libs", "pmix"])
        .output()
    {
        Ok(o) if o.status.success() => text(&o.stdout),
        _ => {
            say_not_tested(test, "OpenPMIx is not installed (install libpmix-dev)");
            return None;
        }
    };
    let munged = Command::new("munge")
        .arg("-n")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !munged.is_ok_and(|s| s.success()) {
        say_not_tested(
            test,
            "munged is not running (install munge and start munged): PMIx is served only with MUNGE",
        );
        return None;
    }
    let src = source(name);
    let out = dir.join(name);
    let o = Command::new("cc")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(flags.split_whitespace())
        .output()
        .expect("cc");
    assert!(
        o.status.success(),
        "cc {}: {}",
        src.display(),
        text(&o.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(out)
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mpi")
        .join(format!("{name}.c"))
}

/// The lines of `b`, sorted (ranks print in any order).
pub fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = text(b).lines().map(str::to_string).collect();
    v.sort();
    v
}
