//! Node health: the checks of `[health]`, and the verdict each NM puts beside its sample.
//!
//! Every sample period the NM judges its node against the cluster file's thresholds (free
//! space where the spool and the state live, memory available) and against the site's own
//! health program, if one is set (Slurm's `HealthCheckProgram`). The verdict is a
//! [`NodeHealth`] record of [`RECORD_BYTES`], which goes to the MM with the sample in the
//! same transfer. The MM drains a node whose verdict is sick, giving the verdict's reason,
//! and lifts that drain once a fresh verdict says the node is healthy again. An operator's
//! drain (`storm drain`) is another thing: it stays until `storm resume`.
//!
//! The other health check, an NM falling behind its heartbeats, is the MM's own: such a node
//! is unresponsive at once and leaves allocation (`crate::config::FailureSection`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sample::{
    NodeSample, RECORD_BYTES, RecordError, at, cut, out_of_range, put_u64, sealed, text_at, u64_at,
};
use crate::size::ByteSize;

const HEALTH_VERSION: u8 = 0xC1;

/// The checks (`[health]` in the cluster file; docs/monitoring.md, "Health").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSection {
    /// A node whose spool file system has less free space than this is drained (0: never).
    pub spool_free_min: ByteSize,
    /// The same for the file system of `state_dir`.
    pub state_free_min: ByteSize,
    /// A node with less memory available than this is drained (0: never).
    pub mem_avail_min: ByteSize,
    /// The site's health program, run by the NM as root on its node: exit status 0 is
    /// healthy, anything else is sick, with the first line it printed as the reason.
    pub program: Option<PathBuf>,
    /// How often the program runs (milliseconds).
    pub program_every_ms: u64,
    /// A run that takes longer is killed, and the node is sick.
    pub program_timeout_ms: u64,
}

impl Default for HealthSection {
    fn default() -> Self {
        Self {
            spool_free_min: ByteSize::mib(64),
            state_free_min: ByteSize::mib(16),
            mem_avail_min: ByteSize(0),
            program: None,
            program_every_ms: 60_000,
            program_timeout_ms: 10_000,
        }
    }
}

impl HealthSection {
    pub fn program_every(&self) -> Duration {
        Duration::from_millis(self.program_every_ms)
    }

    pub fn program_timeout(&self) -> Duration {
        Duration::from_millis(self.program_timeout_ms)
    }

    /// The problems `sample` shows against the thresholds, each as its reason; `unreadable`
    /// names the file systems that could not be looked at (`"spool_dir"`, `"state_dir"`).
    ///
    /// A spool that cannot be looked at is a problem: the NM copies programs there. The state
    /// directory is the MM's: a node where that path does not exist (most compute nodes) has
    /// nothing to check there, so it is judged only where it can be looked at.
    pub fn judge(&self, sample: &NodeSample, unreadable: &[(&str, String)]) -> Vec<String> {
        let missing = |what: &str| unreadable.iter().find(|(w, _)| *w == what);
        let mut problems = Vec::new();
        if let Some((_, e)) = missing("spool_dir") {
            problems.push(format!("spool_dir cannot be looked at: {e}"));
        }
        let mut below = |what: &str, name: &str, have: u64, min: ByteSize| {
            if have < min.0 && missing(what).is_none() {
                problems.push(format!(
                    "{what} has {} free, below {name} {min}",
                    ByteSize(have)
                ));
            }
        };
        below(
            "spool_dir",
            "spool_free_min",
            sample.spool_free,
            self.spool_free_min,
        );
        below(
            "state_dir",
            "state_free_min",
            sample.state_free,
            self.state_free_min,
        );
        if sample.mem_avail < self.mem_avail_min.0 {
            problems.push(format!(
                "memory available is {}, below mem_avail_min {}",
                ByteSize(sample.mem_avail),
                self.mem_avail_min
            ));
        }
        problems
    }
}

/// An NM's verdict on its node, taken with the sample of the same `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeHealth {
    pub seq: u64,
    /// When it was judged (Unix time, ms).
    pub taken_ms: u64,
    /// Why the node is sick, the problems joined by `"; "`; `None`: healthy.
    pub sick: Option<String>,
}

/// Room for the reason in the record.
pub const REASON_BYTES: usize = RECORD_BYTES - 8 - AT_REASON;
const AT_SICK: usize = 9;
const AT_TAKEN: usize = 16;
const AT_REASON: usize = 24;

impl NodeHealth {
    /// The verdict of `problems` (none: healthy).
    pub fn of(seq: u64, taken_ms: u64, problems: &[String]) -> Self {
        Self {
            seq,
            taken_ms,
            sick: (!problems.is_empty()).then(|| problems.join("; ")),
        }
    }

    /// The record's bytes; a reason longer than [`REASON_BYTES`] is cut.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        put_u64(&mut b, at::SEQ, self.seq);
        b[at::VERSION] = HEALTH_VERSION;
        put_u64(&mut b, AT_TAKEN, self.taken_ms);
        if let Some(reason) = &self.sick {
            b[AT_SICK] = 1;
            let r = cut(reason, REASON_BYTES);
            b[AT_REASON..AT_REASON + r.len()].copy_from_slice(r.as_bytes());
        }
        put_u64(&mut b, at::TRAILER, self.seq);
        b
    }

    /// The verdict in `bytes` (`None`: never written).
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, RecordError> {
        let Some(seq) = sealed(bytes)? else {
            return Ok(None);
        };
        if bytes[at::VERSION] != HEALTH_VERSION {
            return Err(RecordError::Version(bytes[at::VERSION]));
        }
        let reason = text_at(bytes, AT_REASON, REASON_BYTES, "reason")?;
        let sick = match bytes[AT_SICK] {
            0 if reason.is_empty() => None,
            0 => return Err(out_of_range("reason", "a reason for a healthy node")),
            1 if reason.is_empty() => return Err(out_of_range("reason", "none for a sick node")),
            1 => Some(reason),
            other => return Err(out_of_range("sick", other)),
        };
        if bytes[AT_SICK + 1..AT_TAKEN].iter().any(|b| *b != 0) {
            return Err(out_of_range("padding", "not zero"));
        }
        Ok(Some(NodeHealth {
            seq,
            taken_ms: u64_at(bytes, AT_TAKEN),
            sick,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeSample {
        NodeSample {
            seq: 3,
            mem_total: 8 << 30,
            mem_avail: 4 << 30,
            spool_free: 10 << 30,
            state_free: 10 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn thresholds_name_what_is_short() {
        let h = HealthSection {
            mem_avail_min: ByteSize(1 << 30),
            ..Default::default()
        };
        assert!(h.judge(&sample(), &[]).is_empty());
        let full = NodeSample {
            spool_free: 12 << 20,
            mem_avail: 100 << 20,
            ..sample()
        };
        assert_eq!(
            h.judge(&full, &[]),
            [
                "spool_dir has 12 MiB free, below spool_free_min 64 MiB",
                "memory available is 100 MiB, below mem_avail_min 1 GiB"
            ]
        );
        let zero = NodeSample {
            spool_free: 0,
            state_free: 0,
            ..sample()
        };
        let no_state = vec![("state_dir", "No such file or directory".to_string())];
        assert!(
            h.judge(&zero, &no_state)
                .iter()
                .all(|p| !p.contains("state_dir")),
            "a node without the MM's state directory has nothing to check there"
        );
        let no_spool = vec![("spool_dir", "No such file or directory".to_string())];
        let no_spool_sample = NodeSample {
            spool_free: 0,
            ..sample()
        };
        assert_eq!(
            h.judge(&no_spool_sample, &no_spool),
            ["spool_dir cannot be looked at: No such file or directory"],
            "a spool that cannot be looked at is named once, not also as 0 B free"
        );
        let off = HealthSection {
            spool_free_min: ByteSize(0),
            ..Default::default()
        };
        assert!(off.judge(&full, &[]).is_empty(), "0 turns a check off");
    }

    #[test]
    fn verdicts_round_trip_and_bad_bytes_are_named() {
        for h in [
            NodeHealth::of(7, 1234, &[]),
            NodeHealth::of(8, 99, &["a".into(), "b".into()]),
        ] {
            assert_eq!(NodeHealth::decode(&h.encode()), Ok(Some(h)));
        }
        let long = NodeHealth::of(9, 1, &["é".repeat(400)]);
        let back = NodeHealth::decode(&long.encode()).unwrap().unwrap();
        assert!(back.sick.unwrap().len() <= REASON_BYTES);
        assert_eq!(NodeHealth::decode(&[0u8; RECORD_BYTES]), Ok(None));
        let mut b = NodeHealth::of(7, 1, &[]).encode();
        b[AT_SICK] = 5;
        assert!(matches!(
            NodeHealth::decode(&b),
            Err(RecordError::Field { field: "sick", .. })
        ));
        let mut b = NodeHealth::of(7, 1, &[]).encode();
        b[at::TRAILER] = 8;
        assert!(matches!(NodeHealth::decode(&b), Err(RecordError::Torn(..))));
        assert_eq!(
            NodeHealth::decode(&[1u8; 3]),
            Err(RecordError::Length(3, RECORD_BYTES))
        );
    }
}
