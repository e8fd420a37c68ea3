//! What a PL is told about its task.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One task, as the NM hands it to its PL (bincode on the PL's standard input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlSpec {
    pub job: u64,
    pub rank: u32,
    pub node: u32,
    /// Slot of this task in the NM's table.
    pub slot: u32,
    #[serde(with = "storm_cluster::os_bytes::path")]
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// The complete environment of the task (STORM_* included).
    pub env: Vec<(OsString, OsString)>,
    #[serde(with = "storm_cluster::os_bytes::path")]
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// The `cgroup.procs` files of the job's cgroup (one per hierarchy; none without
    /// cgroups): the task's process writes itself into each before it executes the program.
    #[serde(with = "storm_cluster::os_bytes::paths")]
    pub cgroups: Vec<PathBuf>,
    /// A batch script's output file (relative to `cwd` unless absolute), opened by the task
    /// as its user in place of the pipe to the NM; standard error goes there too unless
    /// `error_file` is given.
    #[serde(with = "storm_cluster::os_bytes::opt_path")]
    pub output_file: Option<PathBuf>,
    #[serde(with = "storm_cluster::os_bytes::opt_path")]
    pub error_file: Option<PathBuf>,
    /// The START request carries the task's standard input (the read end of the NM's pipe)
    /// after its standard error; without it the task reads `/dev/null`.
    pub stdin: bool,
}

impl PlSpec {
    pub fn encode(&self) -> Vec<u8> {
        storm_cluster::messages::encode("task description", self, 16 << 20)
            .expect("task description encodes")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        storm_cluster::messages::decode("task description", bytes, 16 << 20)
            .map_err(|e| e.to_string())
    }
}
