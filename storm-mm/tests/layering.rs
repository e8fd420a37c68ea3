//! Keeps the layering of DESIGN.md true: resource-management crates reach other nodes only
//! through `storm-primitives`. Their sources may not name an IP socket API, and their manifests
//! may not depend on a networking crate. (The Unix-domain control socket between storm-submit
//! and the machine manager is local to one host and allowed.)

use std::path::{Path, PathBuf};

/// Crates that implement resource management on top of the primitives.
const RM_CRATES: &[&str] = &["storm-mm", "storm-nm", "storm-pl"];

/// Source text that would open a path to another node around the primitives.
const FORBIDDEN_SOURCE: &[&str] = &[
    "std::net",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "libc::socket",
    "libc::connect",
    "socket2",
    "tokio::net",
    "mio::net",
];

/// Dependencies that exist to talk over a network.
const FORBIDDEN_DEPS: &[&str] = &[
    "socket2", "tokio", "mio", "hyper", "reqwest", "tonic", "ofi-sys",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn resource_management_crates_use_no_ip_sockets() {
    let root = workspace_root();
    let mut offences = Vec::new();
    let mut scanned = 0;
    for krate in RM_CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files);
        for f in files {
            scanned += 1;
            let text = std::fs::read_to_string(&f).unwrap();
            for (no, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for bad in FORBIDDEN_SOURCE {
                    if code.contains(bad) {
                        offences.push(format!("{}:{}: uses {bad}", f.display(), no + 1));
                    }
                }
            }
        }
    }
    assert!(
        scanned >= RM_CRATES.len(),
        "found no sources to check under {}",
        root.display()
    );
    assert!(
        offences.is_empty(),
        "network access around the primitives:\n{}",
        offences.join("\n")
    );
}

#[test]
fn resource_management_crates_depend_on_no_networking_crate() {
    let root = workspace_root();
    for krate in RM_CRATES {
        let manifest = std::fs::read_to_string(root.join(krate).join("Cargo.toml")).unwrap();
        let mut in_deps = false;
        for line in manifest.lines() {
            let t = line.trim();
            if t.starts_with('[') {
                in_deps = t.contains("dependencies");
                continue;
            }
            if !in_deps {
                continue;
            }
            let name = t.split(['=', '.', ' ']).next().unwrap_or("");
            assert!(
                !FORBIDDEN_DEPS.contains(&name),
                "{krate} depends on {name}; resource management must go through storm-primitives"
            );
        }
    }
}

#[test]
fn the_check_itself_notices_a_socket() {
    // Guard against a scan that can never fail: the forbidden list matches real socket code.
    let sample = "let s = std::net::TcpStream::connect(addr)?;";
    assert!(FORBIDDEN_SOURCE.iter().any(|bad| sample.contains(bad)));
}

/// The managers' cores decide; their hosts do I/O (docs/architecture.md, "Cores and hosts").
/// A core may not start threads or processes, open files or sockets, share counters with
/// threads, or read the real clock: what it needs of the world comes as an input or through
/// its environment's trait (`storm_mm::env`, `storm_nm::env`), so that the simulator runs it
/// in virtual time and the same inputs give the same outputs.
const CORE_FILES: &[(&str, &str)] = &[
    ("storm-mm", "src/manager"),
    ("storm-nm", "src/manager"),
    ("storm-nm", "src/membership.rs"),
    ("storm-nm", "src/singleton.rs"),
    ("storm-nm", "src/report.rs"),
    // The PMI core: each MPI job's PMI-1, PMI-2 and PMIx decisions (its hosts are the PMI
    // thread and the PMIx helper's link).
    ("storm-nm", "src/pmi/job.rs"),
    // A PMIx job's direct modex and ranks' ends on one node (its host is the PMI thread).
    ("storm-nm", "src/pmi/exchange.rs"),
    // `storm start`'s front end decides here; its host is `start/host.rs` (and the
    // agents' `start/agent.rs`); what it reads and derives is pure too.
    ("storm-cli", "src/start/core.rs"),
    ("storm-cli", "src/start/allocation.rs"),
    ("storm-cli", "src/start/instance.rs"),
    ("storm-cli", "src/start/report.rs"),
];

/// Source text that does I/O, or reads real time, on its own.
const IMPURE_SOURCE: &[&str] = &[
    "std::thread",
    "thread::spawn",
    "thread::sleep",
    "std::process",
    "std::fs",
    "File::",
    "Instant::now",
    "SystemTime::now",
    "crossbeam_channel",
    "UnixStream",
    "Atomic",
];

/// What the NM's core still does that the rule forbids, each named with why it is allowed for
/// now. A new line that matches a forbidden pattern is not covered by these: the test fails.
const KNOWN_NM_EXCEPTIONS: &[(&str, &str)] = &[
    // The `Drained` count of output chunks, shared with the output thread: to become a count
    // the `OutputForwarder` reports.
    (
        "src/manager/mod.rs",
        "use std::sync::atomic::{AtomicU32, Ordering};",
    ),
    ("src/manager/mod.rs", "output: Arc::new(AtomicU32::new(0)),"),
    (
        "src/manager/start.rs",
        "let output: Drained = Arc::new(AtomicU32::new(started.output.len() as u32));",
    ),
    // Its process id, part of its identity: to move into `NmParts`.
    ("src/membership.rs", "pid: std::process::id(),"),
];

/// The lines of `text` before its tests (`#[cfg(test)]`): tests may use real time.
fn non_test_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| !l.trim_start().starts_with("#[cfg(test)]"))
}

fn impurities(krate: &str, rel: &Path, text: &str) -> Vec<String> {
    let rel_s = rel.to_string_lossy();
    let mut found = Vec::new();
    for (no, line) in non_test_lines(text) {
        let code = line.split("//").next().unwrap_or("");
        let allowed = krate == "storm-nm"
            && KNOWN_NM_EXCEPTIONS
                .iter()
                .any(|(f, l)| rel_s == *f && code.trim() == *l);
        if allowed {
            continue;
        }
        for bad in IMPURE_SOURCE {
            if code.contains(bad) {
                found.push(format!("{krate}/{rel_s}:{}: uses {bad}", no + 1));
            }
        }
    }
    found
}

#[test]
fn the_managers_cores_do_no_io_of_their_own() {
    let root = workspace_root();
    let mut offences = Vec::new();
    let mut scanned = 0;
    for (krate, part) in CORE_FILES {
        let base = root.join(krate);
        let path = base.join(part);
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path);
        }
        for f in files {
            let text = std::fs::read_to_string(&f)
                .unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
            scanned += 1;
            offences.extend(impurities(krate, f.strip_prefix(&base).unwrap(), &text));
        }
    }
    assert!(
        scanned >= 15,
        "scanned only {scanned} core files under {}",
        root.display()
    );
    assert!(
        offences.is_empty(),
        "I/O in a manager's core (move it to the host, daemon.rs, behind the env trait):\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_purity_check_itself_notices_io_and_spares_tests() {
    let core = "fn tick(&mut self) {\n    let t = Instant::now();\n}\n";
    assert_eq!(
        impurities("storm-mm", Path::new("src/manager/mod.rs"), core).len(),
        1
    );
    let thread = "let h = std::thread::spawn(|| ());";
    assert!(!impurities("storm-mm", Path::new("src/manager/x.rs"), thread).is_empty());
    // The NM's known exceptions do not excuse the same text in the MM's core.
    let counter = "    output: Arc::new(AtomicU32::new(0)),";
    assert!(!impurities("storm-mm", Path::new("src/manager/mod.rs"), counter).is_empty());
    assert!(impurities("storm-nm", Path::new("src/manager/mod.rs"), counter).is_empty());
    let tests = "fn f() {}\n#[cfg(test)]\nmod tests { fn t() { let _ = Instant::now(); } }\n";
    assert!(impurities("storm-mm", Path::new("src/manager/mod.rs"), tests).is_empty());
}
