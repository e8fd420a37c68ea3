//! The cluster file of a private instance (`storm start`), from its agents' reports: one
//! node per agent, at the address its agent bound, its spool in the agent's own directory;
//! the MM where the front end runs, its socket and state in the front end's directory, the
//! manager side of the control relay beside it and a node relay in each agent's directory; key
//! files named relative to the cluster file, so that the same file serves the front end and
//! every agent, each with the keys beside it. Pure: paths and addresses come in.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use storm_cluster::config::{ClusterConfig, ClusterSection, MmSection, NodeEntry, RelaySection};

use super::report::AgentReport;

/// An instance's settings beyond its nodes.
pub struct InstanceSpec<'a> {
    /// The cluster's name (unique on every node: it keys cgroups and scratch space).
    pub name: String,
    /// The front end's directory (mode 0700): the MM's socket and state.
    pub dir: &'a Path,
    /// Where the MM listens.
    pub mm: SocketAddr,
    /// The timeslice, in milliseconds.
    pub timeslice_ms: f64,
    /// Policy, MPL, and the daemons' real-time priority.
    pub scheduler: storm_cluster::config::SchedulerSection,
    /// Where the manager side of the control relay listens (beside the MM): jobs' tasks on
    /// every node reach the MM through their node's relay.
    pub relay: SocketAddr,
    /// The user the instance is (and serves).
    pub uid: u32,
}

/// Each node's relay socket, relative to the cluster file: in the node's own directory.
pub const RELAY_SOCKET: &str = "relay.sock";

/// The spool of the node whose agent wrote `report`.
pub fn spool_of(report: &AgentReport) -> PathBuf {
    report.dir.join("spool")
}

/// The instance's cluster file.
pub fn instance_config(spec: &InstanceSpec<'_>, reports: &[AgentReport]) -> ClusterConfig {
    let nodes = reports
        .iter()
        .map(|r| NodeEntry {
            name: r.name.clone(),
            address: r.address,
            spool: spool_of(r),
            cpus: r.cpus.max(1),
            mem: None,
            features: Vec::new(),
            guest_of: None,
        })
        .collect();
    ClusterConfig {
        cluster: ClusterSection {
            name: spec.name.clone(),
            timeslice_ms: spec.timeslice_ms,
            control_socket: spec.dir.join("mm.sock"),
            state_dir: spec.dir.join("mm-state"),
            key_file: Some(storm_cluster::key::DEFAULT_NAME.into()),
            mm_key_file: Some("mm.key".into()),
            mm_public_key_file: Some("mm.pub".into()),
            node_key_file: Some("keys/{node}.key".into()),
            enrolled_file: Some("nodes.pub".into()),
            ..ClusterSection::default()
        },
        tcp: Default::default(),
        security: Default::default(),
        limits: Default::default(),
        ofi: Default::default(),
        scheduler: spec.scheduler.clone(),
        failure: Default::default(),
        history: Default::default(),
        relay: RelaySection {
            address: Some(spec.relay),
            socket: RELAY_SOCKET.into(),
            // The user's own relays carry the user; root only where root is the user.
            root_from_nodes: spec.uid == 0,
            min_uid: spec.uid,
        },
        mm: MmSection { address: spec.mm },
        replication: Default::default(),
        monitoring: Default::default(),
        health: Default::default(),
        federation: Default::default(),
        peers: Vec::new(),
        managers: Vec::new(),
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every agent's node at its own address and spool; key files relative, so the file
    /// means the same keys in each agent's directory; the result is a valid cluster file.
    #[test]
    fn an_instance_lists_each_agents_node_and_names_keys_beside_the_file() {
        let reports: Vec<AgentReport> = (0..3)
            .map(|i| AgentReport {
                index: i,
                name: format!("node{}", i + 1),
                address: format!("127.0.0.1:{}", 5000 + i).parse().unwrap(),
                cpus: 2,
                dir: format!("/tmp/agent{i}").into(),
                step: "9.0".into(),
                host: "h".into(),
            })
            .collect();
        let dir = Path::new("/tmp/front");
        let spec = InstanceSpec {
            name: "slurm-9-abc".into(),
            dir,
            mm: "127.0.0.1:4999".parse().unwrap(),
            timeslice_ms: 1.0,
            scheduler: Default::default(),
            relay: "127.0.0.1:4998".parse().unwrap(),
            uid: 1001,
        };
        let cfg = instance_config(&spec, &reports);
        assert_eq!(cfg.nodes.len(), 3);
        assert_eq!(cfg.nodes[2].spool, Path::new("/tmp/agent2/spool"));
        assert_eq!(cfg.cluster.control_socket, dir.join("mm.sock"));
        assert!(cfg.cluster.node_key_file.as_ref().unwrap().is_relative());
        let text = cfg.to_toml();
        let back = ClusterConfig::parse(&text).expect("a valid cluster file");
        assert_eq!(back.nodes[1].address, reports[1].address);
        assert!(
            back.relay.socket.is_relative(),
            "each node's relay in its own directory"
        );
        assert_eq!(back.relay.min_uid, 1001);
        assert!(!back.relay.root_from_nodes);
    }
}
