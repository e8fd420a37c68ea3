//! A guest NM's setup on a lent node (docs/federation.md, "Guest files"): what comes from
//! the borrower, and what from this node's own cluster.
//!
//! A guest NM runs as root on the lender's node, for a peer cluster this node's operator does
//! not run. So the peer says only where its fabric is: its cluster's name and sizes (which
//! shape the global memory every node of it must agree on), its nodes' names and addresses,
//! its MM's address, its links' and heartbeats' settings. Everything that executes or touches
//! files as root comes from the lender's own cluster file or is fixed here: the launcher and
//! PMI library, the cgroup mode, the spool, the state directory, the health checks, the sysfs
//! root the sampler reads, real-time priority, the logs, and the keys' paths.
//!
//! The guest file is the borrower's topology as the lender's operator installed it
//! (`[[peer]] guest_file`; `storm guest-file` writes one from the borrower's cluster file).
//! It is refused unless it and its directory belong to root (or to the user this daemon runs
//! as) and no one else may write them, and unless every setting it makes is on the list of
//! what a peer may say ([`ALLOWED`]): a setting not on it (say `[cluster] pl_path`, which
//! once ran the borrower's program as root here) is named in the refusal. The keys are at
//! fixed names beside it: the borrower's cluster key `storm.key`, its MM's public key
//! `mm.pub`, and each guest slot's identity key `keys/SLOT.key`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::config::ClusterConfig;
use crate::federation::PeerEntry;
use crate::health::HealthSection;
use storm_primitives::NodeId;

use crate::ConfigError;

/// The settings a guest file may make, by table: nothing else is taken from a peer.
/// `[[node]]` and `[[manager]]` entries are checked key by key, the others too.
pub const ALLOWED: &[(&str, &[&str])] = &[
    (
        "cluster",
        &[
            "name",
            "backend",
            "timeslice_ms",
            "max_jobs",
            "max_tasks_per_node",
            "heartbeat_slots",
            "heartbeat_bytes",
            "transfer_chunk_bytes",
            "transfer_slots",
            "max_transfers",
            "output_slots",
            "output_bytes",
            "pmi_node_bytes",
            "pmi_job_bytes",
            "kill_wait_ms",
        ],
    ),
    ("tcp", &["*"]),
    ("ofi", &["*"]),
    ("security", &["*"]),
    ("limits", &["*"]),
    (
        "scheduler",
        &[
            "policy",
            "mpl",
            "default_time_limit_s",
            "slot_lease",
            "slot_grace_ms",
        ],
    ),
    ("failure", &["*"]),
    ("history", &["*"]),
    ("mm", &["*"]),
    ("replication", &["*"]),
    ("monitoring", &["sample_ms", "source", "history_s"]),
    (
        "manager",
        &["name", "address", "peer_address", "relay_address"],
    ),
    (
        "node",
        &["name", "address", "cpus", "mem", "features", "guest_of"],
    ),
];

/// The borrower's cluster key, beside the guest file.
pub const CLUSTER_KEY: &str = "storm.key";
/// The borrower's MM's public key, beside the guest file.
pub const MM_PUBLIC_KEY: &str = "mm.pub";
/// What a borrowed job's tasks get as `STORM_SOCKET` on a lent node: a name in the guest's
/// spool (which no user can make), saying why nothing answers there.
pub const NO_CONTROL_SOCKET: &str = "no-machine-manager-is-reachable-from-a-lent-node";

/// Each guest slot's identity key, beside the guest file (`{node}`: the slot's name).
pub const SLOT_KEY: &str = "keys/{node}.key";

/// Why a guest NM cannot run from a peer's guest file.
#[derive(Debug, thiserror::Error)]
pub enum GuestFileError {
    #[error("this cluster does not lend to {0} ([[peer]] with lend = true)")]
    NotLent(String),
    #[error("[[peer]] {peer} names no {what}")]
    Missing { peer: String, what: &'static str },
    #[error("{path}: {why}")]
    Untrusted { path: PathBuf, why: String },
    #[error(
        "{path} sets {keys}: a guest NM runs as root on this node, so what it executes and \
         which files it touches come from this cluster's own file, not the peer's; a guest \
         file holds only the peer's topology (`storm guest-file` writes one; \
         docs/federation.md, guest files)"
    )]
    Forbidden { path: PathBuf, keys: String },
    #[error("{path}: {source}")]
    Config {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error("{path} has no guest slot for node {node} of cluster {cluster}")]
    NoSlot {
        path: PathBuf,
        cluster: String,
        node: String,
    },
}

/// A guest NM's whole setup: the cluster file it runs by (the peer's topology with this
/// cluster's settings), its slot there, and the local account its jobs run as.
#[derive(Debug, Clone)]
pub struct GuestSetup {
    pub config: ClusterConfig,
    pub slot: NodeId,
    /// `[[peer]] flock_user`: every job of the peer runs as this account here.
    pub user: String,
    /// The guest file it was made from.
    pub file: PathBuf,
}

impl GuestSetup {
    /// The setup of node `node`'s guest NM for peer `peer`, from this cluster's file
    /// `lender` and the peer's guest file it names.
    pub fn load(lender: &ClusterConfig, node: &str, peer: &str) -> Result<Self, GuestFileError> {
        let entry = lender
            .peers
            .iter()
            .find(|p| p.name == peer && p.lend)
            .ok_or_else(|| GuestFileError::NotLent(peer.to_string()))?;
        let (file, user) = files_of(entry)?;
        let spool = lender
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map(|n| n.spool.join(format!("guest-{peer}")))
            .ok_or_else(|| GuestFileError::Config {
                path: file.clone(),
                source: ConfigError::Invalid(format!("node {node} is not in this cluster")),
            })?;
        let theirs = read_guest_file(&file)?;
        let slot = theirs
            .guest_slot(&lender.cluster.name, node)
            .ok_or_else(|| GuestFileError::NoSlot {
                path: file.clone(),
                cluster: lender.cluster.name.clone(),
                node: node.to_string(),
            })?;
        let config = with_lenders_settings(theirs, lender, &file, &spool);
        config.validate().map_err(|source| GuestFileError::Config {
            path: file.clone(),
            source,
        })?;
        Ok(Self {
            config,
            slot,
            user,
            file,
        })
    }
}

/// The guest file and the account of peer `entry`.
fn files_of(entry: &PeerEntry) -> Result<(PathBuf, String), GuestFileError> {
    let file = entry.guest_file.clone().ok_or(GuestFileError::Missing {
        peer: entry.name.clone(),
        what: "guest_file (the peer's topology on this node)",
    })?;
    let user = entry.flock_user.clone().ok_or(GuestFileError::Missing {
        peer: entry.name.clone(),
        what: "flock_user (the account its jobs run as on lent nodes)",
    })?;
    Ok((file, user))
}

/// Whether `meta` is of a file only root, or the user this process runs as, may change.
fn check_owner_and_mode(path: &Path, meta: &std::fs::Metadata) -> Result<(), GuestFileError> {
    let me = nix::unistd::geteuid().as_raw();
    let untrusted = |why: String| GuestFileError::Untrusted {
        path: path.to_path_buf(),
        why,
    };
    if meta.uid() != 0 && meta.uid() != me {
        return Err(untrusted(format!(
            "belongs to uid {}: a guest file and its directory must be root's, as this \
             cluster's operator installed them",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(untrusted(format!(
            "can be written by others (mode {:o}): run `chmod go-w {}`",
            meta.mode() & 0o7777,
            path.display()
        )));
    }
    Ok(())
}

/// Reads a guest file that only this cluster's operator can have written, and that makes
/// only the settings a peer may make.
pub fn read_guest_file(path: &Path) -> Result<ClusterConfig, GuestFileError> {
    let untrusted = |why: String| GuestFileError::Untrusted {
        path: path.to_path_buf(),
        why,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    for (p, what) in [(dir, "directory"), (&dir.join("keys"), "keys directory")] {
        match std::fs::symlink_metadata(p) {
            Ok(meta) => check_owner_and_mode(p, &meta)?,
            Err(e) if what == "keys directory" && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(untrusted(format!("its {what}: {e}"))),
        }
    }
    // Opened without following a symlink, and judged by what was opened.
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| untrusted(format!("cannot open it (a symlink is refused): {e}")))?;
    let meta = f
        .metadata()
        .map_err(|e| untrusted(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(untrusted("is not a regular file".into()));
    }
    check_owner_and_mode(path, &meta)?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(&mut f, 16 << 20), &mut text)
        .map_err(|e| untrusted(format!("cannot read it: {e}")))?;
    check_settings(path, &text)?;
    let mut cfg: ClusterConfig = toml::from_str(&text).map_err(|e| GuestFileError::Config {
        path: path.to_path_buf(),
        source: ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().trim().replace('\n', "; "),
        },
    })?;
    cfg.default_mm_address();
    Ok(cfg)
}

/// Refuses any setting of `text` not in [`ALLOWED`], naming every one.
fn check_settings(path: &Path, text: &str) -> Result<(), GuestFileError> {
    let value: toml::Table = toml::from_str(text).map_err(|e| GuestFileError::Config {
        path: path.to_path_buf(),
        source: ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().trim().replace('\n', "; "),
        },
    })?;
    let mut forbidden: Vec<String> = Vec::new();
    for (table, v) in &value {
        let Some((_, keys)) = ALLOWED.iter().find(|(t, _)| t == table) else {
            forbidden.push(format!("[{table}]"));
            continue;
        };
        if keys.contains(&"*") {
            continue;
        }
        let entries: Vec<&toml::Table> = match v {
            toml::Value::Table(t) => vec![t],
            toml::Value::Array(a) => a.iter().filter_map(toml::Value::as_table).collect(),
            _ => {
                forbidden.push(table.clone());
                continue;
            }
        };
        let mut here: Vec<&str> = entries
            .iter()
            .flat_map(|e| e.keys())
            .map(String::as_str)
            .filter(|k| !keys.contains(k))
            .collect();
        here.sort_unstable();
        here.dedup();
        forbidden.extend(here.into_iter().map(|k| format!("[{table}] {k}")));
    }
    if forbidden.is_empty() {
        Ok(())
    } else {
        Err(GuestFileError::Forbidden {
            path: path.to_path_buf(),
            keys: forbidden.join(", "),
        })
    }
}

/// The peer's topology `theirs` (read from `file`) with every setting that executes or
/// touches files as root taken from `lender`, or fixed: the guest's spool is `spool`, its
/// keys are beside `file`.
fn with_lenders_settings(
    mut theirs: ClusterConfig,
    lender: &ClusterConfig,
    file: &Path,
    spool: &Path,
) -> ClusterConfig {
    let dir = file.parent().unwrap_or(Path::new("."));
    let c = &mut theirs.cluster;
    c.pl_path = lender.cluster.pl_path.clone();
    c.pmi_library = lender.cluster.pmi_library.clone();
    c.cgroups = lender.cluster.cgroups;
    c.pmix = lender.cluster.pmix;
    c.pmix_user = lender.cluster.pmix_user.clone();
    c.state_dir = lender.cluster.state_dir.clone();
    // What its tasks get as STORM_SOCKET: neither this cluster's MM (its jobs are the
    // peer's) nor the peer's (whose control socket is on the peer's host, and whose relays
    // take no guest slot). A storm command inside a borrowed job says it cannot reach it.
    c.control_socket = spool.join(NO_CONTROL_SOCKET);
    c.key_file = Some(dir.join(CLUSTER_KEY));
    c.mm_public_key_file = Some(dir.join(MM_PUBLIC_KEY));
    c.node_key_file = Some(dir.join(SLOT_KEY));
    // Never read by an NM; named so that nothing falls back to a path of the peer's.
    c.mm_key_file = Some(dir.join("mm.key"));
    c.enrolled_file = Some(dir.join("nodes.pub"));
    theirs.scheduler.daemon_rt_priority = lender.scheduler.daemon_rt_priority;
    theirs.scheduler.switch_log = false;
    theirs.scheduler.heartbeat_log = false;
    theirs.monitoring.sysfs = lender.monitoring.sysfs.clone();
    // The node's own NM runs its health checks; the guest runs none.
    theirs.health = HealthSection {
        program: None,
        spool_free_min: crate::size::ByteSize(0),
        state_free_min: crate::size::ByteSize(0),
        mem_avail_min: crate::size::ByteSize(0),
        ..HealthSection::default()
    };
    // A guest never lends, relays nor flocks: it is a node of the peer's fabric, no more.
    theirs.relay = Default::default();
    theirs.federation = Default::default();
    theirs.peers.clear();
    for m in &mut theirs.managers {
        m.state_dir = None;
        m.control_socket = None;
    }
    for n in &mut theirs.nodes {
        n.spool = spool.to_path_buf();
        n.guest_of = None;
    }
    theirs
}

/// Writes into `dir` the guest file of the cluster whose file is `cfg` (its topology, only
/// the settings [`ALLOWED`]) with the keys a lender's guests need beside it, where `cfg`'s
/// host has them: the cluster key, the MM's public key and each guest slot's identity key.
/// What a borrower's operator hands the lender's (`storm guest-file`). Returns the files
/// written.
pub fn write_guest_dir(cfg: &ClusterConfig, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir.join("keys"))?;
    let mut written = Vec::new();
    let file = dir.join("cluster.toml");
    std::fs::write(&file, guest_text(cfg))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
    written.push(file);
    let mut copy = |from: PathBuf, to: PathBuf, mode: u32| -> std::io::Result<()> {
        if from.exists() {
            std::fs::copy(&from, &to)?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
            written.push(to);
        }
        Ok(())
    };
    copy(cfg.key_path(), dir.join(CLUSTER_KEY), 0o600)?;
    copy(cfg.mm_key_paths().1, dir.join(MM_PUBLIC_KEY), 0o644)?;
    for n in cfg.nodes.iter().filter(|n| n.guest_of.is_some()) {
        let to = dir.join(SLOT_KEY.replace("{node}", &n.name));
        copy(cfg.node_key_path(&n.name), to, 0o600)?;
    }
    Ok(written)
}

/// The guest-file text of cluster file `cfg`: its topology, only the settings [`ALLOWED`].
pub fn guest_text(cfg: &ClusterConfig) -> String {
    let full: toml::Table =
        toml::from_str(&cfg.to_toml()).expect("a cluster file reads back as TOML");
    let mut out = toml::Table::new();
    for (table, keys) in ALLOWED {
        let Some(v) = full.get(*table) else { continue };
        let keep = |t: &toml::Table| -> toml::Table {
            t.iter()
                .filter(|(k, _)| keys.contains(&"*") || keys.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let kept = match v {
            toml::Value::Table(t) => toml::Value::Table(keep(t)),
            toml::Value::Array(a) => toml::Value::Array(
                a.iter()
                    .filter_map(toml::Value::as_table)
                    .map(|t| toml::Value::Table(keep(t)))
                    .collect(),
            ),
            other => other.clone(),
        };
        out.insert(table.to_string(), kept);
    }
    format!(
        "# The topology of cluster {:?} for the nodes that lend to it (a guest file, \
         docs/federation.md):\n# only the settings a peer may make. Its keys go beside it: \
         {CLUSTER_KEY}, {MM_PUBLIC_KEY}, {SLOT_KEY}.\n{}",
        cfg.cluster.name,
        toml::to_string_pretty(&out).expect("a table serialises")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A borrower `far` with one node and a guest slot for node `n0` of `home`, its file
    /// setting everything a cluster's own file may (a launcher, keys, a health program).
    fn borrower(dir: &Path) -> ClusterConfig {
        let text = format!(
            r#"
[cluster]
name = "far"
pl_path = "{d}/evil-pl"
state_dir = "{d}/state"
key_file = "{d}/storm.key"
[mm]
address = "127.0.0.1:7200"
[health]
program = "{d}/evil-health"
[federation]
listen = "127.0.0.1:7100"
[[peer]]
name = "home"
address = "127.0.0.1:7101"
key_file = "{d}/pair.key"
mm_public_key_file = "{d}/home-mm.pub"
borrow = true
[[node]]
name = "f0"
address = "127.0.0.1:7000"
spool = "{d}/spool"
[[node]]
name = "home-n0"
address = "127.0.0.1:7002"
spool = "{d}/spool-guest"
guest_of = {{ cluster = "home", node = "n0" }}
"#,
            d = dir.display()
        );
        ClusterConfig::parse(&text).unwrap()
    }

    /// The lender `home`, lending `n0` to `far` with its guest file at `guest`.
    fn lender(dir: &Path, guest: &Path) -> ClusterConfig {
        let text = format!(
            r#"
[cluster]
name = "home"
pl_path = "/usr/libexec/storm/storm-pl"
cgroups = "none"
[mm]
address = "127.0.0.1:7201"
[scheduler]
daemon_rt_priority = 7
[federation]
listen = "127.0.0.1:7101"
[[peer]]
name = "far"
address = "127.0.0.1:7100"
key_file = "{d}/pair.key"
lend = true
flock_user = "nobody"
guest_file = "{g}"
[[node]]
name = "n0"
address = "127.0.0.1:7001"
spool = "{d}/home-spool"
"#,
            d = dir.display(),
            g = guest.display()
        );
        ClusterConfig::parse(&text).unwrap()
    }

    /// The exported guest file holds the borrower's topology only, and the guest runs by it
    /// with everything that executes or touches files as root from the lender: its launcher,
    /// cgroups, priority and spool, no health program, keys beside the guest file.
    #[test]
    fn a_guest_takes_the_peers_topology_and_the_lenders_settings() {
        let dir = tempfile::tempdir().unwrap();
        let far = borrower(dir.path());
        let text = guest_text(&far);
        for absent in [
            "evil",
            "pl_path",
            "state_dir",
            "key_file",
            "[health]",
            "[[peer]]",
            "spool =",
        ] {
            assert!(
                !text.contains(absent),
                "the guest file holds {absent}:\n{text}"
            );
        }
        let export = dir.path().join("export");
        write_guest_dir(&far, &export).unwrap();
        let guest = export.join("cluster.toml");
        let home = lender(dir.path(), &guest);
        let setup = GuestSetup::load(&home, "n0", "far").unwrap();
        let c = &setup.config;
        assert_eq!(c.cluster.name, "far");
        assert_eq!(c.nodes[setup.slot as usize].name, "home-n0");
        assert_eq!(c.node_count(), 2, "the borrower's whole topology");
        assert_eq!(c.cluster.pl_path, home.cluster.pl_path);
        assert_eq!(c.cluster.cgroups, home.cluster.cgroups);
        assert_eq!(c.scheduler.daemon_rt_priority, 7);
        assert!(c.health.program.is_none());
        assert_eq!(
            c.nodes[setup.slot as usize].spool,
            dir.path().join("home-spool").join("guest-far")
        );
        assert_eq!(c.key_path(), export.join("storm.key"));
        assert_eq!(c.node_key_path("home-n0"), export.join("keys/home-n0.key"));
        assert_eq!(setup.user, "nobody");
        // The layout the borrower's MM expects: the same global memory.
        assert_eq!(
            crate::RmLayout::new(c).unwrap().layout.fingerprint(),
            crate::RmLayout::new(&far).unwrap().layout.fingerprint()
        );
    }

    /// Every setting outside the list is refused, named: the one that once ran a peer's
    /// program as root (`[cluster] pl_path`), a health program, a spool, a peer entry.
    #[test]
    fn a_guest_file_that_sets_what_runs_as_root_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let far = borrower(dir.path());
        let export = dir.path().join("export");
        write_guest_dir(&far, &export).unwrap();
        let guest = export.join("cluster.toml");
        let clean = std::fs::read_to_string(&guest).unwrap();
        let home = lender(dir.path(), &guest);
        let clean: toml::Table = toml::from_str(&clean).unwrap();
        for (table, key, named) in [
            ("cluster", "pl_path", "[cluster] pl_path"),
            ("cluster", "key_file", "[cluster] key_file"),
            ("health", "program", "[health]"),
            ("monitoring", "sysfs", "[monitoring] sysfs"),
            (
                "scheduler",
                "daemon_rt_priority",
                "[scheduler] daemon_rt_priority",
            ),
            ("relay", "socket", "[relay]"),
            ("federation", "listen", "[federation]"),
        ] {
            let mut t = clean.clone();
            let entry = t
                .entry(table)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            entry
                .as_table_mut()
                .unwrap()
                .insert(key.into(), toml::Value::String("/tmp/x".into()));
            std::fs::write(&guest, toml::to_string(&t).unwrap()).unwrap();
            let err = GuestSetup::load(&home, "n0", "far")
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{named}: {err}");
        }
        let clean = toml::to_string(&clean).unwrap();
        let with_spool = clean.replacen("name = \"f0\"", "name = \"f0\"\nspool = \"/x\"", 1);
        std::fs::write(&guest, with_spool).unwrap();
        let err = GuestSetup::load(&home, "n0", "far")
            .unwrap_err()
            .to_string();
        assert!(err.contains("[node] spool"), "{err}");
    }

    /// A guest file anyone else could have written is refused: writable by others, in a
    /// directory others may write, or a symlink.
    #[test]
    fn a_guest_file_others_could_have_written_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let far = borrower(dir.path());
        let export = dir.path().join("export");
        write_guest_dir(&far, &export).unwrap();
        let guest = export.join("cluster.toml");
        let home = lender(dir.path(), &guest);
        assert!(GuestSetup::load(&home, "n0", "far").is_ok());
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&guest, 0o666);
        let err = GuestSetup::load(&home, "n0", "far")
            .unwrap_err()
            .to_string();
        assert!(err.contains("written by others"), "{err}");
        mode(&guest, 0o644);
        mode(&export, 0o777);
        let err = GuestSetup::load(&home, "n0", "far")
            .unwrap_err()
            .to_string();
        assert!(err.contains("written by others"), "{err}");
        mode(&export, 0o755);
        let real = export.join("real.toml");
        std::fs::rename(&guest, &real).unwrap();
        std::os::unix::fs::symlink(&real, &guest).unwrap();
        let err = GuestSetup::load(&home, "n0", "far")
            .unwrap_err()
            .to_string();
        assert!(err.contains("symlink"), "{err}");
    }
}
