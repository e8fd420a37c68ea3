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
