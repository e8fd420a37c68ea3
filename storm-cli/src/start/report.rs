//! What a private instance's front end (`storm start`) and its node agents (`storm agent`,
//! one per node, started by the allocator's step launcher) say to each other, one line
//! each way over the step's standard output and input:
//!
//! * each agent, once its node manager's listening socket is bound: `storm-agent {json}`,
//!   an [`AgentReport`];
//! * the front end, once every agent reported: `storm-bundle {json}`, a [`Bundle`]: the
//!   instance's cluster file and keys, which each agent writes into its own directory.
//!
//! Lines are bounded ([`MAX_LINE`]) and parsed without panicking; anything else on the
//! stream (a message of srun's, say) is not a report.

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The longest line either side reads.
pub const MAX_LINE: usize = 4 << 20;

const REPORT_TAG: &str = "storm-agent ";
const BUNDLE_TAG: &str = "storm-bundle ";

/// One node's agent, ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReport {
    /// Its node's index in the allocation (Slurm's `SLURM_NODEID`).
    pub index: u32,
    /// Its node's name (`SLURMD_NODENAME`).
    pub name: String,
    /// Where its node manager listens (bound already, handed to it as descriptor 3).
    pub address: SocketAddr,
    /// The CPUs it may use (its affinity).
    pub cpus: u32,
    /// Its own directory on the node (mode 0700): the instance's files go there.
    pub dir: PathBuf,
    /// The allocator's step it runs in (`JOB.STEP`), which the front end ends at teardown
    /// (`ssh` when started through ssh).
    pub step: String,
    /// Its host's name (`gethostname`): a loopback address is of use only on the front end's.
    pub host: String,
}

impl AgentReport {
    pub fn to_line(&self) -> String {
        format!(
            "{REPORT_TAG}{}",
            serde_json::to_string(self).unwrap_or_default()
        )
    }

    /// The report in `line`, if it is one.
    pub fn parse(line: &str) -> Option<Self> {
        serde_json::from_str(line.trim_end().strip_prefix(REPORT_TAG)?).ok()
    }
}

/// Why a line is not a bundle an agent may write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error("not an instance bundle")]
    NotABundle,
    #[error("a malformed instance bundle: {0}")]
    Malformed(String),
    #[error("{0:?} is not a path inside the agent's directory")]
    Outside(String),
}

/// The instance's files, by path relative to an agent's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bundle {
    pub files: Vec<(String, Vec<u8>)>,
}

impl Bundle {
    pub fn to_line(&self) -> String {
        format!(
            "{BUNDLE_TAG}{}",
            serde_json::to_string(self).unwrap_or_default()
        )
    }

    /// The bundle in `line`; a file path that would leave the directory (absolute, or
    /// with `..`) is refused.
    pub fn parse(line: &str) -> Result<Self, BundleError> {
        let json = line
            .trim_end()
            .strip_prefix(BUNDLE_TAG)
            .ok_or(BundleError::NotABundle)?;
        let bundle: Bundle =
            serde_json::from_str(json).map_err(|e| BundleError::Malformed(e.to_string()))?;
        for (path, _) in &bundle.files {
            let p = Path::new(path);
            let inside = !path.is_empty()
                && p.components()
                    .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if !inside {
                return Err(BundleError::Outside(path.clone()));
            }
        }
        Ok(bundle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_and_bundles_round_trip_and_other_lines_are_not_reports() {
        let r = AgentReport {
            index: 2,
            name: "node3".into(),
            address: "127.0.0.1:4000".parse().unwrap(),
            cpus: 2,
            dir: "/tmp/storm agent x".into(),
            step: "7.0".into(),
            host: "n3".into(),
        };
        assert_eq!(AgentReport::parse(&r.to_line()), Some(r));
        assert_eq!(
            AgentReport::parse("srun: error: node3: task 2: Exited"),
            None
        );
        assert_eq!(AgentReport::parse("storm-agent {not json"), None);
        let b = Bundle {
            files: vec![("cluster.toml".into(), b"x".to_vec())],
        };
        assert_eq!(Bundle::parse(&b.to_line()), Ok(b));
    }

    /// A bundle cannot write outside the agent's directory.
    #[test]
    fn a_bundle_path_leaving_the_directory_is_refused() {
        for bad in ["/etc/passwd", "../x", "keys/../../x", ""] {
            let b = Bundle {
                files: vec![(bad.into(), Vec::new())],
            };
            assert_eq!(
                Bundle::parse(&b.to_line()),
                Err(BundleError::Outside(bad.into())),
                "{bad:?}"
            );
        }
    }
}
