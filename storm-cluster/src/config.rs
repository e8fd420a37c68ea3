//! The cluster file (TOML): the nodes, the backend and the tunables every daemon reads.
//!
//! ```toml
//! [cluster]
//! name = "demo"
//! backend = "tcp"
//! timeslice_ms = 1.0
//! control_socket = "/run/storm/mm.sock"
//! state_dir = "/var/lib/storm"
//!
//! [mm]
//! address = "10.0.0.1:7000"
//!
//! [[node]]
//! name = "node0"
//! address = "10.0.0.10:7001"
//! spool = "/var/spool/storm"
//! cpus = 16
//! ```
//!
//! Everything but the nodes and addresses has a default; unknown keys are errors (a typo
//! should not be silently ignored).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use storm_primitives::NodeId;
use storm_primitives::tcp::TcpConfig;
use storm_primitives::tcp::auth::{ClusterKey, Protection};

/// Why a cluster file is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read cluster file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cluster file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cluster file: {0}")]
    Invalid(String),
}

mod sections;
pub use sections::*;

/// Distinct node features a cluster may have (`--constraint` selects by them).
pub const MAX_FEATURES: usize = 63;

/// The feature bit of a cluster's own nodes (not guest slots) in a file that names guest
/// slots: a job that does not allow borrowing asks for it, and so goes on own nodes only
/// (the last bit, which no named feature takes).
pub const OWN_NODE_BIT: u64 = 1 << 63;

/// A whole cluster file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub cluster: ClusterSection,
    #[serde(default)]
    pub tcp: TcpSection,
    #[serde(default)]
    pub security: SecuritySection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub ofi: OfiSection,
    #[serde(default)]
    pub scheduler: SchedulerSection,
    #[serde(default)]
    pub failure: FailureSection,
    #[serde(default)]
    pub history: HistorySection,
    #[serde(default)]
    pub relay: RelaySection,
    #[serde(default)]
    pub mm: MmSection,
    #[serde(default)]
    pub replication: ReplicationSection,
    #[serde(default)]
    pub monitoring: MonitoringSection,
    #[serde(default)]
    pub health: crate::health::HealthSection,
    #[serde(default)]
    pub federation: crate::federation::FederationSection,
    /// Peer clusters (docs/federation.md).
    #[serde(rename = "peer", default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<crate::federation::PeerEntry>,
    /// The replicas of a replicated MM, if the cluster runs one (none: a single MM at
    /// `[mm] address`).
    #[serde(rename = "manager", default, skip_serializing_if = "Vec::is_empty")]
    pub managers: Vec<ManagerEntry>,
    /// One entry per node; in the file, a `[[node]]` table may name many (see [`NodeTable`]).
    #[serde(rename = "node", default, deserialize_with = "expand_nodes")]
    pub nodes: Vec<NodeEntry>,
}

/// A `[[node]]` table as written: `name` and `address` may be hostlist expressions
/// (`name = "node[0000-1023]"`, `address = "10.1.[0-3].[1-254]:7001"`), one node per name.
/// An address that expands to one entry is used by every name (valid only with port 0, for
/// single-host testing); otherwise both must expand to the same count, paired in order.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeTable {
    name: String,
    address: String,
    /// Required of a cluster's own file ([`ClusterConfig::validate`]); a guest file names
    /// none (its guests' spool is the lender's).
    #[serde(default)]
    spool: PathBuf,
    #[serde(default = "one")]
    cpus: u32,
    #[serde(default)]
    mem: Option<crate::size::ByteSize>,
    #[serde(default)]
    features: Vec<String>,
    /// A guest slot's lender (one node per table: two slots never stand for one node).
    #[serde(default)]
    guest_of: Option<crate::federation::GuestOf>,
}

fn expand_nodes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<NodeEntry>, D::Error> {
    use serde::de::Error;
    let tables = Vec::<NodeTable>::deserialize(d)?;
    let mut nodes = Vec::new();
    for t in tables {
        let names = crate::hostlist::expand(&t.name).map_err(D::Error::custom)?;
        let addresses = crate::hostlist::expand(&t.address).map_err(D::Error::custom)?;
        if addresses.len() != 1 && addresses.len() != names.len() {
            return Err(D::Error::custom(format!(
                "node name {:?} stands for {} nodes but address {:?} for {} addresses",
                t.name,
                names.len(),
                t.address,
                addresses.len()
            )));
        }
        for (i, name) in names.into_iter().enumerate() {
            let text = &addresses[i.min(addresses.len() - 1)];
            let address = text
                .parse()
                .map_err(|e| D::Error::custom(format!("node {name}: address {text:?}: {e}")))?;
            nodes.push(NodeEntry {
                name,
                address,
                spool: t.spool.clone(),
                cpus: t.cpus,
                mem: t.mem,
                features: t.features.clone(),
                guest_of: t.guest_of.clone(),
            });
        }
        if nodes.len() > crate::hostlist::MAX_EXPANSION {
            return Err(D::Error::custom(format!(
                "more than {} [[node]] entries",
                crate::hostlist::MAX_EXPANSION
            )));
        }
    }
    Ok(nodes)
}

/// A TOML error in one line: where (line and column) and what, without the snippet that
/// toml's own message draws over several lines.
fn toml_error_line(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}

/// The longest name of a cluster, node or peer (bytes): a guest's lease grant, which names
/// three, must fit its registration (`messages::LEASE_GRANT_BYTES`).
pub const MAX_NAME_BYTES: usize = 255;

/// The most replicas a replicated MM may have (each commit waits for a majority of them).
pub const MAX_MANAGERS: usize = 7;

/// Where the daemons and the commands look for the cluster file by default.
pub const DEFAULT_CLUSTER_FILE: &str = "/etc/storm/cluster.toml";

impl ClusterConfig {
    /// Reads and validates a cluster file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let c = &mut cfg.cluster;
        for (file, default) in [
            (&mut c.key_file, crate::key::DEFAULT_NAME),
            (&mut c.mm_key_file, "mm.key"),
            (&mut c.mm_public_key_file, "mm.pub"),
            (&mut c.node_key_file, "node.key"),
            (&mut c.enrolled_file, "nodes.pub"),
        ] {
            let named = file.take().unwrap_or_else(|| PathBuf::from(default));
            *file = Some(dir.join(named));
        }
        // A relative relay socket is beside the file too (each node of a private instance
        // has its own copy of the file, in its own directory).
        cfg.relay.socket = dir.join(&cfg.relay.socket);
        for p in &mut cfg.peers {
            p.key_file = dir.join(&p.key_file);
            p.guest_file = p.guest_file.as_ref().map(|f| dir.join(f));
            p.mm_public_key_file = p.mm_public_key_file.as_ref().map(|f| dir.join(f));
        }
        Ok(cfg)
    }

    /// A key file the cluster file names (made absolute by [`ClusterConfig::load`]), or its
    /// default name, with `{node}` replaced by `node`.
    fn key_file(&self, file: &Option<PathBuf>, default: &str, node: Option<&str>) -> PathBuf {
        let pattern = file.clone().unwrap_or_else(|| PathBuf::from(default));
        crate::identity::key_path(Path::new(""), &pattern, node)
    }

    /// The MM's sealer: its signing key (see [`crate::identity`]).
    pub fn load_mm_signer(&self) -> Result<crate::identity::MmSigner, crate::key::KeyError> {
        let path = self.key_file(&self.cluster.mm_key_file, "mm.key", None);
        let key = crate::identity::load(&path, crate::key::MM_KEY)?;
        Ok(crate::identity::MmSigner::new(key, &self.cluster.name))
    }

    /// The key of the managers' own links (a replicated MM): derived from the MM's signing
    /// key, which every replica holds and no compute node does, so that a node holding only
    /// the cluster key cannot pass for a replica.
    pub fn load_group_key(&self) -> Result<ClusterKey, crate::key::KeyError> {
        let path = self.key_file(&self.cluster.mm_key_file, "mm.key", None);
        let key = crate::identity::load(&path, crate::key::MM_KEY)?;
        Ok(ClusterKey::from_bytes(blake3::derive_key(
            "storm manager group links 2026",
            &key.to_bytes(),
        )))
    }

    /// What nodes check the MM's seals with: its public key.
    pub fn load_mm_verifier(&self) -> Result<crate::identity::MmVerifier, String> {
        let path = self.key_file(&self.cluster.mm_public_key_file, "mm.pub", None);
        let keys = crate::identity::load_public(&path)?;
        Ok(crate::identity::MmVerifier::with_keys(
            keys,
            &self.cluster.name,
        ))
    }

    /// Node `name`'s identity key.
    pub fn load_node_key(
        &self,
        name: &str,
    ) -> Result<ed25519_dalek::SigningKey, crate::key::KeyError> {
        let path = self.key_file(&self.cluster.node_key_file, "node.key", Some(name));
        crate::identity::load(&path, crate::key::NODE_KEY)
    }

    /// Where node `name`'s identity key is.
    pub fn node_key_path(&self, name: &str) -> PathBuf {
        self.key_file(&self.cluster.node_key_file, "node.key", Some(name))
    }

    /// Where the cluster key is.
    pub fn key_path(&self) -> PathBuf {
        self.key_file(&self.cluster.key_file, crate::key::DEFAULT_NAME, None)
    }

    /// Where the MM's keys are: (secret, public).
    pub fn mm_key_paths(&self) -> (PathBuf, PathBuf) {
        (
            self.key_file(&self.cluster.mm_key_file, "mm.key", None),
            self.key_file(&self.cluster.mm_public_key_file, "mm.pub", None),
        )
    }

    /// Where the enrolled nodes' keys are.
    pub fn enrolled_path(&self) -> PathBuf {
        self.key_file(&self.cluster.enrolled_file, "nodes.pub", None)
    }

    /// The nodes enrolled at the MM; every node of the cluster must be.
    pub fn load_enrolled(&self) -> Result<crate::identity::Enrolled, String> {
        let enrolled = crate::identity::Enrolled::load(&self.enrolled_path())?;
        let missing: Vec<&str> = self
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .filter(|n| enrolled.key(n).is_none())
            .take(5)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "{}: no identity key enrolled for node {} (run `storm keygen --node NAME` on \
                 the node and add the line it prints)",
                self.enrolled_path().display(),
                missing.join(", ")
            ));
        }
        Ok(enrolled)
    }

    /// Reads the cluster key (see [`crate::key`]). A config parsed from text rather than
    /// loaded from a file must name its `key_file`.
    pub fn load_key(&self) -> Result<ClusterKey, crate::key::KeyError> {
        let path = self
            .cluster
            .key_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::key::DEFAULT_NAME));
        crate::key::load(&path)
    }

    /// Parses and validates cluster-file text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut cfg: ClusterConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: toml_error_line(text, &e),
        })?;
        cfg.default_mm_address();
        cfg.validate()?;
        Ok(cfg)
    }

    /// A group's NMs dial the first replica until they find the leader: its address is the
    /// MM's when `[mm]` is not set.
    pub fn default_mm_address(&mut self) {
        if self.mm == MmSection::default()
            && let Some(first) = self.managers.first()
        {
            self.mm.address = first.address;
        }
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config always serialises")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.nodes.is_empty() {
            return bad("no [[node]] entries: a cluster needs at least one node".into());
        }
        let names = std::iter::once(("cluster", &self.cluster.name))
            .chain(self.nodes.iter().map(|n| ("node", &n.name)))
            .chain(self.peers.iter().map(|p| ("[[peer]]", &p.name)));
        for (what, name) in names {
            if name.len() > MAX_NAME_BYTES {
                return bad(format!(
                    "{what} name {:?}... is {} bytes: at most {MAX_NAME_BYTES}",
                    name.chars().take(20).collect::<String>(),
                    name.len()
                ));
            }
        }
        if let Some(n) = self.nodes.iter().find(|n| n.spool.as_os_str().is_empty()) {
            return bad(format!(
                "node {} has no spool (the directory its NM keeps programs in)",
                n.name
            ));
        }
        crate::federation::validate(&self.cluster.name, &self.federation, &self.peers)
            .map_err(ConfigError::Invalid)?;
        self.validate_guest_slots().map_err(ConfigError::Invalid)?;
        let c = &self.cluster;
        let features = self.features();
        let lenders = self.lenders().len();
        if features.len() + lenders > MAX_FEATURES {
            return bad(format!(
                "the nodes have {} features in all, and the guest slots stand for {lenders} \
                 lending clusters; at most {MAX_FEATURES} of both are allowed",
                features.len()
            ));
        }
        if let Some(f) = features
            .iter()
            .find(|f| f.is_empty() || f.contains(['&', ',', '|', ' ', '[', ']', '*']))
        {
            return bad(format!(
                "feature {f:?}: a feature is a non-empty name without & , | [ ] * or spaces"
            ));
        }
        let h = &self.health;
        if h.program_every_ms < 1000 || h.program_timeout_ms == 0 {
            return bad(format!(
                "[health] program_every_ms = {} must be at least 1000, and program_timeout_ms \
                 = {} above 0",
                h.program_every_ms, h.program_timeout_ms
            ));
        }
        if let Some(p) = h.program.as_ref().filter(|p| !p.is_absolute()) {
            return bad(format!("[health] program = {p:?} must be an absolute path"));
        }
        if self.monitoring.history_s > 7 * 86_400 {
            return bad(format!(
                "[monitoring] history_s = {} is more than a week (604800)",
                self.monitoring.history_s
            ));
        }
        if !(10..=3_600_000).contains(&self.monitoring.sample_ms) {
            return bad(format!(
                "[monitoring] sample_ms = {} must be between 10 and 3600000",
                self.monitoring.sample_ms
            ));
        }
        if !(c.timeslice_ms > 0.0 && c.timeslice_ms <= 60_000.0) {
            return bad(format!(
                "timeslice_ms = {} must be in (0, 60000]",
                c.timeslice_ms
            ));
        }
        // Counts size tables, events and threads before any memory is laid out: each has a
        // ceiling far above any real cluster's and far below what a typo can ask for.
        for (name, v, most) in [
            ("max_jobs", c.max_jobs, 1 << 16),
            ("max_tasks_per_node", c.max_tasks_per_node, 1 << 16),
            ("heartbeat_slots", c.heartbeat_slots, 1 << 16),
            ("heartbeat_bytes", c.heartbeat_bytes, usize::MAX),
            ("transfer_chunk_bytes", c.transfer_chunk_bytes, usize::MAX),
            ("transfer_slots", c.transfer_slots, 1 << 16),
            ("max_transfers", c.max_transfers, 256),
            ("output_slots", c.output_slots, 1 << 16),
            ("output_bytes", c.output_bytes, usize::MAX),
            ("pmi_node_bytes", c.pmi_node_bytes, 1 << 26),
            ("pmi_job_bytes", c.pmi_job_bytes, 1 << 30),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
            if v > most {
                return bad(format!(
                    "{name} = {v} is more than the {most} storm supports"
                ));
            }
        }
        let l = &self.limits;
        for (name, v) in [
            (
                "max_queued_jobs_per_user",
                l.max_queued_jobs_per_user as u64,
            ),
            ("max_program_bytes", l.max_program_bytes),
            ("max_spooled_bytes_per_user", l.max_spooled_bytes_per_user),
            (
                "max_connections_per_user",
                l.max_connections_per_user as u64,
            ),
            ("max_unread_reply_bytes", l.max_unread_reply_bytes),
            ("max_job_name_bytes", l.max_job_name_bytes as u64),
            ("max_argument_bytes", l.max_argument_bytes),
            ("max_array_size", l.max_array_size as u64),
            (
                "max_held_request_bytes_per_user",
                l.max_held_request_bytes_per_user,
            ),
        ] {
            if v == 0 {
                return bad(format!("[limits] {name} must be at least 1"));
            }
        }
        if !(4096..=crate::control::MAX_FRAME as u32).contains(&l.max_request_bytes) {
            return bad(format!(
                "[limits] max_request_bytes = {} must be in 4096..={}",
                l.max_request_bytes,
                crate::control::MAX_FRAME
            ));
        }
        if self.scheduler.mpl == 0 || self.scheduler.mpl > 64 {
            return bad(format!(
                "[scheduler] mpl = {} must be in 1..=64",
                self.scheduler.mpl
            ));
        }
        let grace = self.scheduler.slot_grace_ms;
        if !(0.0..=60_000.0).contains(&grace) {
            return bad(format!(
                "[scheduler] slot_grace_ms = {grace} must be in [0, 60000]"
            ));
        }
        if self.scheduler.default_time_limit_s == 0 {
            return bad("[scheduler] default_time_limit_s must be at least 1".into());
        }
        if c.heartbeat_bytes < 1024 {
            return bad("heartbeat_bytes must be at least 1024".into());
        }
        let f = &self.failure;
        if f.missed_heartbeats == 0
            || f.deadline_heartbeats == 0
            || f.check_interval_ms == 0
            || f.readopt_within_ms == 0
        {
            return bad(
                "[failure] missed_heartbeats, deadline_heartbeats, check_interval_ms and \
                 readopt_within_ms must be at least 1"
                    .into(),
            );
        }
        if self.heartbeat_deadline() >= self.timeslice() * f.missed_heartbeats {
            return bad(format!(
                "[failure] a heartbeat's deadline ({} ms: deadline_heartbeats = {} periods, at \
                 least deadline_min_ms = {}) must be shorter than missed_heartbeats = {} \
                 periods: a member must leave the heartbeat before it counts as DOWN",
                self.heartbeat_deadline().as_millis(),
                f.deadline_heartbeats,
                f.deadline_min_ms,
                f.missed_heartbeats
            ));
        }
        if self.scheduler.daemon_rt_priority > 99 {
            return bad(format!(
                "[scheduler] daemon_rt_priority = {} is not a SCHED_FIFO priority (1-99, or 0 \
                 for the normal policy)",
                self.scheduler.daemon_rt_priority
            ));
        }
        if f.task_start_timeout_ms == 0 {
            return bad("[failure] task_start_timeout_ms must be at least 1".into());
        }
        if f.launcher_timeout_ms == 0 {
            return bad(
                "[failure] launcher_timeout_ms must be at least 1: a launcher needs some time \
                 to take a task"
                    .into(),
            );
        }
        if f.rejoin_after_ms <= self.tcp.peer_timeout_ms {
            return bad(format!(
                "[failure] rejoin_after_ms = {} must exceed [tcp] peer_timeout_ms = {}: an NM \
                 would leave a cluster that is only waiting for a failed peer",
                f.rejoin_after_ms, self.tcp.peer_timeout_ms
            ));
        }
        self.tcp_config(ClusterKey::from_bytes([0; 32]))
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("[tcp] {e}")))?;
        if self.mm == MmSection::default() && self.managers.is_empty() {
            return bad("no [mm] address: the cluster file must say where the MM listens".into());
        }
        self.validate_managers()?;
        let mut names = HashSet::new();
        let mut addrs = HashSet::from([self.mm.address]);
        for n in &self.nodes {
            if n.name.is_empty() {
                return bad("a node has an empty name".into());
            }
            if !names.insert(&n.name) {
                return bad(format!("node name {:?} appears twice", n.name));
            }
            if !addrs.insert(n.address) && n.address.port() != 0 {
                return bad(format!("address {} is used twice", n.address));
            }
            if n.cpus == 0 {
                return bad(format!("node {} has cpus = 0", n.name));
            }
        }
        Ok(())
    }

    /// The `[[manager]]` entries: distinct names and addresses, an odd count of at most
    /// [`MAX_MANAGERS`], on the tcp backend.
    fn validate_managers(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let m = &self.managers;
        if m.is_empty() {
            return Ok(());
        }
        if m.len() > MAX_MANAGERS {
            return bad(format!(
                "{} [[manager]] entries: a group has at most {MAX_MANAGERS} replicas",
                m.len()
            ));
        }
        if m.len() % 2 == 0 {
            return bad(format!(
                "{} [[manager]] entries: a group needs an odd count (2f+1 replicas survive f \
                 failures; an even count survives no more than one fewer)",
                m.len()
            ));
        }
        let r = &self.replication;
        if r.heartbeat_ms == 0 || r.election_timeout_ms < 4 * r.heartbeat_ms {
            return bad(format!(
                "[replication] election_timeout_ms = {} must be at least 4 heartbeats \
                 (heartbeat_ms = {}, at least 1)",
                r.election_timeout_ms, r.heartbeat_ms
            ));
        }
        if self.cluster.backend != BackendKind::Tcp {
            return bad(format!(
                "[[manager]] entries need backend \"tcp\": a replicated MM on {:?} is not \
                 supported yet (docs/operations.md)",
                self.cluster.backend
            ));
        }
        let mut names = HashSet::new();
        let mut addrs = HashSet::new();
        for e in m {
            if e.name.is_empty() {
                return bad("a [[manager]] entry has an empty name".into());
            }
            if !names.insert(&e.name) {
                return bad(format!("manager name {:?} appears twice", e.name));
            }
            for a in [e.address, e.peer_address] {
                if !addrs.insert(a) || self.nodes.iter().any(|n| n.address == a) {
                    return bad(format!("address {a} is used twice"));
                }
            }
        }
        let with_relay = m.iter().filter(|e| e.relay_address.is_some()).count();
        if with_relay > 0 {
            if let Some(e) = m.iter().find(|e| e.relay_address.is_none()) {
                return bad(format!(
                    "manager {:?} has no relay_address while others have one: give every \
                     [[manager]] entry a relay_address, or none",
                    e.name
                ));
            }
            if let Some(a) = self.relay.address {
                return bad(format!(
                    "[relay] address = {a} and the [[manager]] entries' relay_address both say \
                     where the manager-side relay listens: keep one"
                ));
            }
            for a in m.iter().filter_map(|e| e.relay_address) {
                if !addrs.insert(a) || self.nodes.iter().any(|n| n.address == a) {
                    return bad(format!("address {a} is used twice"));
                }
            }
        }
        if !m.iter().any(|e| e.address == self.mm.address) {
            return bad(format!(
                "[mm] address {} is none of the [[manager]] entries' addresses (leave [mm] out \
                 with a replicated group)",
                self.mm.address
            ));
        }
        Ok(())
    }

    /// Whether the MM is a replicated group.
    pub fn replicated(&self) -> bool {
        !self.managers.is_empty()
    }

    /// Replica `name`'s index among the `[[manager]]` entries (a name, or an index).
    pub fn manager_by_name(&self, name: &str) -> Result<usize, String> {
        self.managers
            .iter()
            .position(|m| m.name == name)
            .or_else(|| {
                name.parse::<usize>()
                    .ok()
                    .filter(|&i| i < self.managers.len())
            })
            .ok_or_else(|| {
                format!(
                    "no manager {name:?} in the cluster file (its [[manager]] entries: {})",
                    self.managers
                        .iter()
                        .map(|m| m.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    /// The cluster as replica `index` sees it: its own endpoint address, state directory and
    /// control socket in `[mm]` and `[cluster]`.
    pub fn as_manager(&self, index: usize) -> ClusterConfig {
        let mut cfg = self.clone();
        if let Some(m) = self.managers.get(index) {
            cfg.mm.address = m.address;
            if let Some(d) = &m.state_dir {
                cfg.cluster.state_dir = d.clone();
            }
            if let Some(s) = &m.control_socket {
                cfg.cluster.control_socket = s.clone();
            }
        }
        cfg
    }

    /// Every control socket a client may find the MM on: the replicas' in order, or the one
    /// MM's.
    pub fn control_sockets(&self) -> Vec<PathBuf> {
        if self.managers.is_empty() {
            return vec![self.cluster.control_socket.clone()];
        }
        (0..self.managers.len())
            .map(|i| self.as_manager(i).cluster.control_socket)
            .collect()
    }

    /// Where the manager side of the control relay may listen, in the order node relays try
    /// them: every replica's `relay_address`, or `[relay] address` (empty: no relay).
    pub fn relay_addresses(&self) -> Vec<SocketAddr> {
        let per_replica: Vec<SocketAddr> = self
            .managers
            .iter()
            .filter_map(|m| m.relay_address)
            .collect();
        if per_replica.is_empty() {
            self.relay.address.into_iter().collect()
        } else {
            per_replica
        }
    }

    /// Every address the MM's endpoint may be at: the replicas' in order, or the one MM's.
    pub fn mm_addresses(&self) -> Vec<SocketAddr> {
        if self.managers.is_empty() {
            return vec![self.mm.address];
        }
        self.managers.iter().map(|m| m.address).collect()
    }

    /// Compute nodes in the cluster.
    pub fn node_count(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// What the cluster offers a job: its nodes, their CPUs and the per-node task limit.
    pub fn capacity(&self) -> crate::tasks::Capacity {
        let cpus = self.nodes.iter().map(|n| n.cpus);
        crate::tasks::Capacity {
            nodes: self.node_count(),
            cpus_per_node: cpus.clone().min().unwrap_or(1),
            max_cpus_per_node: cpus.max().unwrap_or(1),
            max_tasks_per_node: self.cluster.max_tasks_per_node as u32,
        }
    }

    /// Every feature a node of the cluster has, each once, in order: feature `i` is bit `i`
    /// of [`ClusterConfig::feature_mask`].
    pub fn features(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .nodes
            .iter()
            .flat_map(|n| n.features.iter().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The bits of `wanted` (`--constraint`), or which feature no node has.
    pub fn feature_mask(&self, wanted: &[String]) -> Result<u64, String> {
        let all = self.features();
        let mut mask = 0u64;
        for w in wanted {
            match all.iter().position(|f| f == w) {
                Some(i) if i < MAX_FEATURES => mask |= 1 << i,
                _ => {
                    return Err(format!(
                        "--constraint {w}: no node of cluster {:?} has feature {w:?} (it has: {})",
                        self.cluster.name,
                        if all.is_empty() {
                            "none".to_string()
                        } else {
                            all.join(", ")
                        }
                    ));
                }
            }
        }
        Ok(mask)
    }

    /// Each node's features as bits (see [`ClusterConfig::features`]); where the file names
    /// guest slots, the cluster's own nodes also have [`OWN_NODE_BIT`], and each slot its
    /// lender's bit ([`ClusterConfig::lender_bit`]).
    pub fn node_feature_masks(&self) -> Vec<u64> {
        let guests = self.has_guest_slots();
        self.nodes
            .iter()
            .map(|n| {
                let place = match &n.guest_of {
                    Some(g) => self.lender_bit(&g.cluster),
                    None if guests => OWN_NODE_BIT,
                    None => 0,
                };
                self.feature_mask(&n.features).unwrap_or(0) | place
            })
            .collect()
    }

    /// The clusters this file's guest slots stand for nodes of, in the file's order.
    pub fn lenders(&self) -> Vec<&str> {
        let mut all: Vec<&str> = Vec::new();
        for g in self.nodes.iter().filter_map(|n| n.guest_of.as_ref()) {
            if !all.contains(&g.cluster.as_str()) {
                all.push(&g.cluster);
            }
        }
        all
    }

    /// The feature bit every guest slot of lender `cluster` has (0: no slot stands for its
    /// nodes): the bits below [`OWN_NODE_BIT`], downwards, one per lender, so that
    /// `--one-cluster` keeps a job on one lender's nodes. Named features take the bits from
    /// the bottom; validation keeps the two apart.
    pub fn lender_bit(&self, cluster: &str) -> u64 {
        self.lenders()
            .iter()
            .position(|c| *c == cluster)
            .map_or(0, |i| OWN_NODE_BIT >> (1 + i))
    }

    /// Whether node `id` is a guest slot (a node a peer lends here), not one of this
    /// cluster's own.
    pub fn is_guest(&self, id: NodeId) -> bool {
        self.nodes
            .get(id as usize)
            .is_some_and(|n| n.guest_of.is_some())
    }

    /// Whether the file names any guest slot.
    pub fn has_guest_slots(&self) -> bool {
        self.nodes.iter().any(|n| n.guest_of.is_some())
    }

    /// This cluster's own nodes (guest slots left out).
    pub fn home_node_count(&self) -> u32 {
        self.nodes.iter().filter(|n| n.guest_of.is_none()).count() as u32
    }

    /// The guest slot that stands for node `node` of peer `cluster`.
    pub fn guest_slot(&self, cluster: &str, node: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| {
                n.guest_of
                    .as_ref()
                    .is_some_and(|g| g.cluster == cluster && g.node == node)
            })
            .map(|i| i as NodeId)
    }

    /// Guest slots stand for nodes of peers this cluster may borrow from, each node once, and
    /// the cluster keeps at least one node of its own.
    fn validate_guest_slots(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.nodes {
            let Some(g) = &n.guest_of else { continue };
            let Some(peer) = self.peers.iter().find(|p| p.name == g.cluster && p.borrow) else {
                return Err(format!(
                    "node {}: guest_of cluster {:?} is not a [[peer]] this cluster may borrow \
                     from (borrow = true)",
                    n.name, g.cluster
                ));
            };
            if peer.mm_public_key_file.is_none() {
                return Err(format!(
                    "node {}: [[peer]] {:?} names no mm_public_key_file (its MM's public key), \
                     with which this cluster checks the lease of each node it lends here",
                    n.name, g.cluster
                ));
            }
            if !seen.insert(g) {
                return Err(format!(
                    "node {}: another guest slot already stands for node {} of cluster {}",
                    n.name, g.node, g.cluster
                ));
            }
        }
        if self.home_node_count() == 0 {
            return Err("every [[node]] is a guest slot: a cluster needs a node of its own".into());
        }
        Ok(())
    }

    /// The MM's id in the primitives fabric: one past the last compute node.
    pub fn mm_id(&self) -> NodeId {
        self.nodes.len() as NodeId
    }

    /// Node `id`'s index by name.
    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| i as NodeId)
    }

    /// The node a node daemon runs as: `given` (a name, or an index in the file), else the
    /// node named as this host. The error names what was looked for.
    pub fn this_node(&self, given: Option<&str>) -> Result<NodeId, String> {
        let name = match given {
            Some(n) => n.to_string(),
            None => nix::unistd::gethostname()
                .map_err(|e| format!("reading this host's name (or give --node): {e}"))?
                .to_string_lossy()
                .into_owned(),
        };
        self.node_by_name(&name)
            .or_else(|| {
                name.parse::<NodeId>()
                    .ok()
                    .filter(|&id| id < self.node_count())
            })
            .ok_or_else(|| format!("no node {name:?} in the cluster file"))
    }

    /// Every fabric endpoint's address: compute nodes first, then the MM.
    pub fn directory(&self) -> Vec<Option<SocketAddr>> {
        self.nodes
            .iter()
            .map(|n| Some(n.address))
            .chain(std::iter::once(Some(self.mm.address)))
            .collect()
    }

    /// How long a member has to take a heartbeat (and the bound on every primitive the MM's
    /// loop waits for): `deadline_heartbeats` periods, at least `deadline_min_ms` (and 1 ms).
    pub fn heartbeat_deadline(&self) -> Duration {
        (self.timeslice() * self.failure.deadline_heartbeats)
            .max(Duration::from_millis(self.failure.deadline_min_ms.max(1)))
    }

    /// How often a heartbeat goes that carries nothing new (`quiet_heartbeat_ms`): never
    /// more often than each timeslice, and never so seldom that failure detection slows, at
    /// most a quarter of a heartbeat's deadline and of K periods. Not for a cluster that
    /// shares nodes with peers (`[[peer]]`, guest slots), nor for a replicated MM
    /// (`[[manager]]`): there, with quiet heartbeats, a node lent did not run the borrower's
    /// job (`lending.rs`), and the replicated group's tests failed 3 full runs of 6 (0 of 6
    /// without); one cause, output lost across a failover, is mended, and they still fail 1
    /// run of 6 (a diverged leader leading again). Until the rest is found, every timeslice
    /// sends one there, as before.
    pub fn quiet_heartbeat_period(&self) -> Duration {
        let slice = self.timeslice();
        if !self.peers.is_empty()
            || !self.managers.is_empty()
            || self.nodes.iter().any(|n| n.guest_of.is_some())
        {
            return slice;
        }
        let bound = (self.heartbeat_deadline() / 4)
            .min(slice.saturating_mul(self.failure.missed_heartbeats) / 4);
        Duration::from_millis(self.failure.quiet_heartbeat_ms)
            .min(bound)
            .max(slice)
    }

    pub fn timeslice(&self) -> Duration {
        Duration::from_secs_f64(self.cluster.timeslice_ms / 1000.0)
    }

    /// How long a gang slot may run on a node after the heartbeat that began it, when the
    /// next timeslice runs other jobs (`None`: `slot_lease` is off).
    pub fn slot_lease(&self) -> Option<Duration> {
        self.scheduler.slot_lease.then(|| {
            self.timeslice() + Duration::from_secs_f64(self.scheduler.slot_grace_ms / 1000.0)
        })
    }

    /// How the cluster's tcp links protect their frames (`[tcp] encrypt`).
    pub fn protection(&self) -> Protection {
        if self.tcp.encrypt {
            Protection::Encrypt
        } else {
            Protection::Authenticate
        }
    }

    /// The tcp backend's settings, with the cluster's key.
    pub fn tcp_config(&self, key: ClusterKey) -> TcpConfig {
        TcpConfig {
            fanout: self.tcp.fanout,
            chunk_size: self.tcp.chunk_bytes,
            op_timeout: Duration::from_millis(self.tcp.op_timeout_ms),
            connect_timeout: Duration::from_millis(self.tcp.connect_timeout_ms),
            peer_timeout: Duration::from_millis(self.tcp.peer_timeout_ms),
            key,
            protection: self.protection(),
            ..TcpConfig::default()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
