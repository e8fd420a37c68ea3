//! Who may command a node, and who a node is: ed25519 keys, and the MM's seals on what it
//! tells nodes to do.
//!
//! The cluster key (see [`crate::key`]) lets a host join the fabric; it says nothing about
//! which member is which, and every node holds it, so root on one compute node holds it too.
//! Two more kinds of key close what that leaves open:
//!
//! * **The MM's signing key** (`mm.key`, secret, on the MM's host only; its public half in
//!   `mm.pub`, beside the cluster file on every node). The MM seals every command an NM
//!   carries out (launch, signal, forget, receive a program, shut down) and every
//!   membership message; an NM acts on none whose seal does not verify. A seal covers the
//!   cluster's name, the MM process (its incarnation), the heartbeat's sequence number (or
//!   the node a membership message is for), when it was made, and the commands themselves:
//!   job, node set, uid, working directory, arguments, environment and the program's
//!   BLAKE3 hash. Tree relays pass the bytes on and cannot forge or alter them.
//! * **Each node's identity key** (`node.key`, secret, on that node only; its public half
//!   enrolled at the MM in `nodes.pub`). A node proves it in every handshake with the MM,
//!   so the MM knows which node each link belongs to, and takes from it only what that
//!   node may write.
//!
//! Keys are 32-byte seeds written as 64 hex digits; public keys likewise. No cryptography is
//! written here: signatures are `ed25519-dalek`'s.

use std::path::{Path, PathBuf};

pub use ed25519_dalek::VerifyingKey;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use serde::{Deserialize, Serialize};
use storm_primitives::NodeId;

use crate::key::{KeyError, read_private, write_private};
use crate::messages::{Command, Membership};

/// How long a seal stays good: a command older than this (or from this far in the future)
/// is refused, so a recorded one cannot be replayed later. Clocks of the MM and the nodes
/// must agree within it.
pub const SEAL_LIFETIME_MS: u64 = 5 * 60 * 1000;

/// A secret key (a 32-byte seed) written to `path` (which must not exist), mode 0600; its
/// public half is returned.
pub fn generate(path: &Path, what: &'static str) -> Result<VerifyingKey, KeyError> {
    let seed: [u8; 32] = storm_primitives::tcp::auth::random_bytes();
    let key = SigningKey::from_bytes(&seed);
    write_private(path, &hex(&seed), what)?;
    Ok(key.verifying_key())
}

/// Reads the secret key at `path`, after checking only this process's user can read it.
pub fn load(path: &Path, what: &'static str) -> Result<SigningKey, KeyError> {
    let text = read_private(path, what)?;
    let seed = unhex32(text.trim()).map_err(|why| KeyError::Malformed {
        what,
        path: path.to_path_buf(),
        why,
    })?;
    Ok(SigningKey::from_bytes(&seed))
}

/// A public key as 64 hex digits.
pub fn public_hex(key: &VerifyingKey) -> String {
    hex(key.as_bytes())
}

/// A public key from 64 hex digits.
pub fn parse_public(text: &str) -> Result<VerifyingKey, String> {
    let bytes = unhex32(text.trim())?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| format!("not an ed25519 public key: {e}"))
}

/// Reads a trust anchor: a file of public keys whose every line decides whom a daemon
/// obeys (`mm.pub`) or takes as a node (`nodes.pub`). Anyone may read it; only root, or the
/// user this daemon runs as, may have written it: it must belong to one of them and be
/// writable by no one else (a line added by another user would make their key the MM's).
/// It is opened without following a symlink, and judged by what was opened. `what` names it
/// in errors, with `hint` for a missing file.
pub fn read_trust_anchor(path: &Path, what: &str, hint: &str) -> Result<String, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => format!("{what} {} is a symlink: refused", path.display()),
            _ => format!("{what} {}: {e} ({hint})", path.display()),
        })?;
    let meta = f
        .metadata()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_file() {
        return Err(format!("{what} {} is not a regular file", path.display()));
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "{what} {} belongs to uid {}: it decides whom this daemon trusts, so it must be \
             root's (or this daemon's user's): run `chown root {}`, and check its keys",
            path.display(),
            meta.uid(),
            path.display()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{what} {} can be written by other users (mode {:04o}): run `chmod go-w {}`, and \
             check its keys",
            path.display(),
            meta.mode() & 0o7777,
            path.display()
        ));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(&mut f, 16 << 20), &mut text)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    Ok(text)
}

/// Reads a public key file: one key per line (64 hex digits; `#` comments). More than one
/// while a key is rotated: a seal of any of them is the MM's. A trust anchor
/// ([`read_trust_anchor`]).
pub fn load_public(path: &Path) -> Result<Vec<VerifyingKey>, String> {
    let text = read_trust_anchor(
        path,
        "the MM's public key",
        "make it with `storm keygen --mm` on the MM's host, and copy it next to the cluster file",
    )?;
    let keys = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(parse_public)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if keys.is_empty() {
        return Err(format!("{}: no key in it", path.display()));
    }
    Ok(keys)
}

/// Writes a public key file (world-readable).
pub fn write_public(path: &Path, key: &VerifyingKey) -> std::io::Result<()> {
    write_anchor(path, &format!("{}\n", public_hex(key)))
}

/// Writes a trust anchor (`mm.pub`, `nodes.pub`): mode 0644 whatever the umask, so that it
/// is read by everyone and trusted ([`read_trust_anchor`]).
pub fn write_anchor(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(text: &str) -> Result<[u8; 32], String> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("expected 64 hex digits".into());
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// The nodes enrolled at the MM: their names and public identity keys, one per line
/// (`NAME HEX`; `#` comments), as `storm keygen --node` prints them.
#[derive(Debug, Clone, Default)]
pub struct Enrolled {
    keys: std::collections::BTreeMap<String, VerifyingKey>,
}

impl Enrolled {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys = std::collections::BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(key), None) = (words.next(), words.next(), words.next()) else {
                return Err(format!("line {}: expected `NAME KEY`", n + 1));
            };
            let key = parse_public(key).map_err(|e| format!("line {}: {e}", n + 1))?;
            if keys.insert(name.to_string(), key).is_some() {
                return Err(format!("line {}: {name} is enrolled twice", n + 1));
            }
        }
        Ok(Self { keys })
    }

    /// Reads the enrollment file at `path`, a trust anchor ([`read_trust_anchor`]).
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = read_trust_anchor(
            path,
            "the enrolled nodes' keys",
            "each node's `storm keygen --node NAME` prints its line",
        )?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn key(&self, name: &str) -> Option<&VerifyingKey> {
        self.keys.get(name)
    }

    pub fn insert(&mut self, name: &str, key: VerifyingKey) {
        self.keys.insert(name.to_string(), key);
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        self.keys
            .iter()
            .map(|(n, k)| format!("{n} {}\n", public_hex(k)))
            .collect()
    }
}

/// An MM's signature over what it tells nodes, and when it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    pub issued_ms: u64,
    /// 64 bytes.
    pub signature: Vec<u8>,
}

/// Why a node refuses what claims to come from the MM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("commands without the MM's seal")]
    Missing,
    #[error("a seal that is not a signature ({0} bytes)")]
    Malformed(usize),
    #[error("a seal the MM's key did not make (forged, altered, or for another cluster)")]
    Forged,
    #[error("a seal made {age_ms} ms from now, outside the {SEAL_LIFETIME_MS} ms it is good for")]
    Stale { age_ms: i64 },
    #[error(
        "heartbeat {seq}'s commands came again, or out of order (the last one carried out was \
         {last})"
    )]
    Replayed { seq: u64, last: u64 },
    #[error("commands before this node was welcomed by an MM")]
    NotWelcomed,
}

/// The commands of a heartbeat a seal covers: every one but the gang schedule, which is
/// protected by the links alone (see docs/security.md).
pub fn sealed_commands(commands: &[Command]) -> Vec<&Command> {
    commands
        .iter()
        .filter(|c| !matches!(c, Command::Schedule { .. }))
        .collect()
}

/// What is signed: a label for the kind of message, the cluster, the numbers that place it,
/// when it was made, and its bytes.
fn transcript(label: &str, cluster: &str, numbers: &[u64], issued_ms: u64, body: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(64 + body.len());
    for part in [label.as_bytes(), cluster.as_bytes()] {
        t.extend((part.len() as u64).to_le_bytes());
        t.extend(part);
    }
    for n in numbers.iter().chain([&issued_ms]) {
        t.extend(n.to_le_bytes());
    }
    t.extend(body);
    t
}

fn encoded<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap_or_default()
}

const COMMANDS: &str = "storm MM commands v1";
const MEMBERSHIP: &str = "storm MM membership v1";
const LEASE: &str = "storm lease grant v1";

/// A lender's word that its node `node` is lent to cluster `borrower` until `until_ms`,
/// signed by the lender's MM (docs/federation.md, "What a lender's root can do"). The lent
/// node's guest NM shows it when it registers with the borrower, which admits the guest
/// slot only with a grant its lender's MM signed, for that slot's node, that has not run
/// out. Root of the lending node holds the slot's keys for good; a grant it cannot make: it
/// cannot join the borrower's fabric outside a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub lender: String,
    pub borrower: String,
    pub node: String,
    pub until_ms: u64,
    pub signature: Vec<u8>,
}

impl LeaseGrant {
    fn transcript(lender: &str, borrower: &str, node: &str, until_ms: u64) -> Vec<u8> {
        let body = encoded(&(borrower, node));
        transcript(LEASE, lender, &[], until_ms, &body)
    }

    /// Whether one of `keys` (the lender's MM's public keys) signed it, for node `node` of
    /// cluster `lender` lent to `borrower`, and it still runs at `now_ms`; why not otherwise.
    pub fn check(
        &self,
        keys: &[VerifyingKey],
        (lender, node): (&str, &str),
        borrower: &str,
        now_ms: u64,
    ) -> Result<(), String> {
        if self.lender != lender || self.node != node || self.borrower != borrower {
            return Err(format!(
                "its grant lends node {} of {} to {}, not node {node} of {lender} to {borrower}",
                self.node, self.lender, self.borrower
            ));
        }
        if self.until_ms <= now_ms {
            return Err(format!(
                "its lease ran out {} s ago",
                (now_ms - self.until_ms) / 1000
            ));
        }
        let Ok(bytes) = <[u8; 64]>::try_from(self.signature.as_slice()) else {
            return Err("its grant's signature is malformed".into());
        };
        let signature = Signature::from_bytes(&bytes);
        let t = Self::transcript(&self.lender, &self.borrower, &self.node, self.until_ms);
        if keys.iter().any(|k| k.verify(&t, &signature).is_ok()) {
            Ok(())
        } else {
            Err(format!(
                "its grant was not signed by {lender}'s machine manager (the key its [[peer]] \
                 mm_public_key_file holds)"
            ))
        }
    }

    /// As text, for a guest NM's command line or input (hex of its encoding).
    pub fn to_hex(&self) -> String {
        hex(&encoded(self))
    }

    pub fn from_hex(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.len() % 2 != 0 || text.len() > 4096 || !text.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err("a lease grant is an even number of hex digits".into());
        }
        let bytes: Vec<u8> = (0..text.len() / 2)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect();
        crate::messages::decode("lease grant", &bytes, 4096).map_err(|e| e.to_string())
    }
}

/// The MM's side: seals what it sends.
pub struct MmSigner {
    key: SigningKey,
    cluster: String,
}

impl MmSigner {
    pub fn new(key: SigningKey, cluster: &str) -> Self {
        Self {
            key,
            cluster: cluster.to_string(),
        }
    }

    /// The public half, for nodes to check with.
    pub fn public(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The seal of heartbeat `seq`'s commands from MM process `incarnation`, or `None`
    /// when it carries nothing that needs one.
    pub fn seal_commands(
        &self,
        incarnation: u64,
        seq: u64,
        commands: &[Command],
        now_ms: u64,
    ) -> Option<Seal> {
        let sealed = sealed_commands(commands);
        if sealed.is_empty() {
            return None;
        }
        let t = transcript(
            COMMANDS,
            &self.cluster,
            &[incarnation, seq],
            now_ms,
            &encoded(&sealed),
        );
        Some(Seal {
            issued_ms: now_ms,
            signature: self.key.sign(&t).to_bytes().to_vec(),
        })
    }

    /// This MM's grant of its node `node` to cluster `borrower` until `until_ms`.
    pub fn grant_lease(&self, borrower: &str, node: &str, until_ms: u64) -> LeaseGrant {
        let t = LeaseGrant::transcript(&self.cluster, borrower, node, until_ms);
        LeaseGrant {
            lender: self.cluster.clone(),
            borrower: borrower.to_string(),
            node: node.to_string(),
            until_ms,
            signature: self.key.sign(&t).to_bytes().to_vec(),
        }
    }

    /// The seal of membership message `msg` for node `node`.
    pub fn seal_membership(&self, node: NodeId, msg: &Membership, now_ms: u64) -> Seal {
        let t = transcript(
            MEMBERSHIP,
            &self.cluster,
            &[node as u64],
            now_ms,
            &encoded(msg),
        );
        Seal {
            issued_ms: now_ms,
            signature: self.key.sign(&t).to_bytes().to_vec(),
        }
    }
}

/// A node's side: checks the MM's seals (with any of the MM's public keys: two while its key
/// is rotated).
#[derive(Clone)]
pub struct MmVerifier {
    keys: Vec<VerifyingKey>,
    cluster: String,
}

impl MmVerifier {
    pub fn new(key: VerifyingKey, cluster: &str) -> Self {
        Self::with_keys(vec![key], cluster)
    }

    pub fn with_keys(keys: Vec<VerifyingKey>, cluster: &str) -> Self {
        Self {
            keys,
            cluster: cluster.to_string(),
        }
    }

    fn check(&self, t: &[u8], seal: &Seal, now_ms: u64) -> Result<(), SealError> {
        let bytes: [u8; 64] = seal
            .signature
            .as_slice()
            .try_into()
            .map_err(|_| SealError::Malformed(seal.signature.len()))?;
        let signature = Signature::from_bytes(&bytes);
        if !self.keys.iter().any(|k| k.verify(t, &signature).is_ok()) {
            return Err(SealError::Forged);
        }
        let age_ms = now_ms as i64 - seal.issued_ms as i64;
        if age_ms.unsigned_abs() > SEAL_LIFETIME_MS {
            return Err(SealError::Stale { age_ms });
        }
        Ok(())
    }

    /// Whether heartbeat `seq`'s commands, from MM process `incarnation`, are the MM's: a
    /// heartbeat with nothing but a schedule needs no seal.
    pub fn check_commands(
        &self,
        incarnation: u64,
        seq: u64,
        commands: &[Command],
        seal: Option<&Seal>,
        now_ms: u64,
    ) -> Result<(), SealError> {
        let sealed = sealed_commands(commands);
        if sealed.is_empty() {
            return Ok(());
        }
        let seal = seal.ok_or(SealError::Missing)?;
        let t = transcript(
            COMMANDS,
            &self.cluster,
            &[incarnation, seq],
            seal.issued_ms,
            &encoded(&sealed),
        );
        self.check(&t, seal, now_ms)
    }

    /// Whether membership message `msg` for node `node` is the MM's.
    pub fn check_membership(
        &self,
        node: NodeId,
        msg: &Membership,
        seal: &Seal,
        now_ms: u64,
    ) -> Result<(), SealError> {
        let t = transcript(
            MEMBERSHIP,
            &self.cluster,
            &[node as u64],
            seal.issued_ms,
            &encoded(msg),
        );
        self.check(&t, seal, now_ms)
    }
}

/// For a cluster whose daemons all read one directory (an embedded `--local` cluster, the
/// namespace testbed): every key its daemons need besides the cluster key, made in `dir`:
/// `mm.key` and `mm.pub`, a key per node in `keys/NAME.key` (the cluster file then sets
/// `node_key_file = "keys/{node}.key"`), and `nodes.pub` enrolling them all.
pub fn generate_for_one_host(dir: &Path, nodes: &[&str]) -> Result<(), KeyError> {
    let mm = generate(&dir.join("mm.key"), crate::key::MM_KEY)?;
    let io = |path: PathBuf| {
        move |source| KeyError::Io {
            what: crate::key::NODE_KEY,
            path,
            source,
        }
    };
    write_public(&dir.join("mm.pub"), &mm).map_err(io(dir.join("mm.pub")))?;
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).map_err(io(keys.clone()))?;
    let mut enrolled = Enrolled::default();
    for name in nodes {
        let public = generate(&keys.join(format!("{name}.key")), crate::key::NODE_KEY)?;
        enrolled.insert(name, public);
    }
    write_anchor(&dir.join("nodes.pub"), &enrolled.to_text()).map_err(io(dir.join("nodes.pub")))
}

/// Points `cfg`'s key files at those [`generate_for_one_host`] makes in `dir`.
pub fn use_one_host_keys(cfg: &mut crate::ClusterConfig, dir: &Path) {
    let c = &mut cfg.cluster;
    c.key_file = Some(dir.join(crate::key::DEFAULT_NAME));
    c.mm_key_file = Some(dir.join("mm.key"));
    c.mm_public_key_file = Some(dir.join("mm.pub"));
    c.node_key_file = Some(dir.join("keys/{node}.key"));
    c.enrolled_file = Some(dir.join("nodes.pub"));
}

/// Where a key file named in the cluster file is: `{node}` replaced by the node's name, and
/// a relative path taken from the cluster file's directory.
pub fn key_path(dir: &Path, pattern: &Path, node: Option<&str>) -> PathBuf {
    let text = pattern.to_string_lossy();
    let named = match node {
        Some(n) => text.replace("{node}", n),
        None => text.into_owned(),
    };
    dir.join(named)
}

#[cfg(test)]
mod tests {

    /// `mm.pub` and `nodes.pub` decide whom a daemon obeys and takes as a node: one that
    /// others may write, that another user owns, or a symlink is refused, naming the fix
    /// (issue 61, L4; before, any owner and mode were taken, so a user who could write
    /// `mm.pub` had their key obeyed). Readable by all is fine: they are public.
    #[test]
    fn a_trust_anchor_others_could_have_written_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = SigningKey::from_bytes(&[3; 32]).verifying_key();
        let mm = dir.path().join("mm.pub");
        write_public(&mm, &key).unwrap();
        assert_eq!(load_public(&mm).unwrap(), vec![key]);
        let nodes = dir.path().join("nodes.pub");
        write_anchor(&nodes, &format!("n0 {}\n", public_hex(&key))).unwrap();
        assert!(Enrolled::load(&nodes).is_ok());
        for mode in [0o666, 0o646, 0o664] {
            std::fs::set_permissions(&mm, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = load_public(&mm).unwrap_err();
            assert!(err.contains("chmod go-w"), "{mode:o}: {err}");
            std::fs::set_permissions(&nodes, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = Enrolled::load(&nodes).unwrap_err();
            assert!(err.contains("chmod go-w"), "{mode:o}: {err}");
        }
        std::fs::set_permissions(&mm, std::fs::Permissions::from_mode(0o644)).unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&mm, Some(65534), None).unwrap();
            let err = load_public(&mm).unwrap_err();
            assert!(err.contains("belongs to uid 65534"), "{err}");
            std::os::unix::fs::chown(&mm, Some(0), None).unwrap();
        }
        let link = dir.path().join("link.pub");
        std::os::unix::fs::symlink(&mm, &link).unwrap();
        let err = load_public(&link).unwrap_err();
        assert!(err.contains("symlink"), "{err}");
    }

    use super::*;
    use crate::messages::{LaunchSpec, MpiMode, Program};

    fn launch(uid: u32) -> Command {
        Command::Launch(LaunchSpec {
            job: 7,
            slot: 0,
            nodes: "0-1".parse().unwrap(),
            ntasks: 2,
            program: Program::Path("/bin/true".into()),
            program_hash: None,
            args: vec![],
            env: vec![],
            cwd: "/".into(),
            uid,
            gid: uid,
            reporter: 1,
            mpi: MpiMode::None,
            input: Default::default(),
            batch: None,
            mem: None,
            kill_on_bad_exit: false,
            exit_wait_s: 0,
            cpu_bind: Default::default(),
            cpus: None,
        })
    }

    fn pair() -> (MmSigner, MmVerifier) {
        let key = SigningKey::from_bytes(&[9; 32]);
        let verifier = MmVerifier::new(key.verifying_key(), "c1");
        (MmSigner::new(key, "c1"), verifier)
    }

    #[test]
    fn a_sealed_heartbeat_checks_out_and_any_change_is_refused() {
        let (mm, node) = pair();
        let cmds = vec![launch(1000)];
        let seal = mm.seal_commands(3, 40, &cmds, 1_000).unwrap();
        assert_eq!(
            node.check_commands(3, 40, &cmds, Some(&seal), 1_000),
            Ok(())
        );
        // Another user, another heartbeat, another MM process, another cluster.
        assert_eq!(
            node.check_commands(3, 40, &[launch(0)], Some(&seal), 1_000),
            Err(SealError::Forged)
        );
        assert_eq!(
            node.check_commands(3, 41, &cmds, Some(&seal), 1_000),
            Err(SealError::Forged)
        );
        assert_eq!(
            node.check_commands(4, 40, &cmds, Some(&seal), 1_000),
            Err(SealError::Forged)
        );
        let other = MmVerifier::new(mm.public(), "c2");
        assert_eq!(
            other.check_commands(3, 40, &cmds, Some(&seal), 1_000),
            Err(SealError::Forged)
        );
        // No seal, a short one, an old one.
        assert_eq!(
            node.check_commands(3, 40, &cmds, None, 1_000),
            Err(SealError::Missing)
        );
        let mut short = seal.clone();
        short.signature.pop();
        assert_eq!(
            node.check_commands(3, 40, &cmds, Some(&short), 1_000),
            Err(SealError::Malformed(63))
        );
        assert!(matches!(
            node.check_commands(3, 40, &cmds, Some(&seal), 1_000 + SEAL_LIFETIME_MS + 1),
            Err(SealError::Stale { .. })
        ));
    }

    #[test]
    fn a_schedule_alone_needs_no_seal_but_rides_with_one() {
        let (mm, node) = pair();
        let schedule = Command::Schedule {
            run: vec![7],
            lease_us: 0,
        };
        assert!(
            mm.seal_commands(1, 1, std::slice::from_ref(&schedule), 0)
                .is_none()
        );
        assert_eq!(
            node.check_commands(1, 1, std::slice::from_ref(&schedule), None, 0),
            Ok(())
        );
        let cmds = vec![launch(5), schedule];
        let seal = mm.seal_commands(1, 2, &cmds, 0).unwrap();
        assert_eq!(node.check_commands(1, 2, &cmds, Some(&seal), 0), Ok(()));
    }

    #[test]
    fn a_membership_message_is_sealed_for_one_node() {
        let (mm, node) = pair();
        let msg = Membership::Start { stamp: 5, seq: 9 };
        let seal = mm.seal_membership(2, &msg, 0);
        assert_eq!(node.check_membership(2, &msg, &seal, 0), Ok(()));
        assert_eq!(
            node.check_membership(3, &msg, &seal, 0),
            Err(SealError::Forged)
        );
    }

    #[test]
    fn keys_round_trip_through_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mm.key");
        let public = generate(&path, crate::key::MM_KEY).unwrap();
        let key = load(&path, crate::key::MM_KEY).unwrap();
        assert_eq!(key.verifying_key(), public);
        assert_eq!(parse_public(&public_hex(&public)).unwrap(), public);
        let enrolled = Enrolled::parse(&format!("# nodes\nn1 {}\n", public_hex(&public))).unwrap();
        assert_eq!(enrolled.key("n1"), Some(&public));
        assert!(Enrolled::parse("n1 zz").is_err());
        assert!(Enrolled::parse(&format!("a {0}\na {0}\n", public_hex(&public))).is_err());
    }
}
