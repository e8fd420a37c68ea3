//! What a node's jobs and its fabric ports used: the fourth of a node's records.
//!
//! Every sample period the NM reads each job's CPU time and memory from the job's cgroup
//! (the same group that confines and kills it), and the counters of the node's fabric ports
//! where the provider exposes them (InfiniBand and RoCE ports under
//! `/sys/class/infiniband`, as node_exporter reads them). It puts them in a [`NodeUsage`]
//! record of [`USAGE_BYTES`], in the same transfer as its sample and health verdict.
//! `storm stat JOB` (Slurm's `sstat`), `storm nodes --long` and the per-job Prometheus series
//! read it.
//!
//! The record holds [`MAX_JOBS_RECORDED`] jobs; a node holding more shows those using the
//! most memory, and says how many it holds. Like the other records it opens and closes with
//! its sequence number (a torn read is seen and read again), and decoding checks every field.

use serde::{Deserialize, Serialize};

use crate::messages::JobId;
use crate::sample::{
    RECORD_BYTES, RecordError, at, f32_at, out_of_range, put_f32, put_u16, put_u64, sealed_at,
    u16_at, u64_at, zeros,
};

/// Bytes of the record: two of the other records' size.
pub const USAGE_BYTES: usize = 2 * RECORD_BYTES;

const USAGE_VERSION: u8 = 0xA1;

/// One job's figures on one node.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct JobFigures {
    pub job: JobId,
    /// CPU time its processes here used so far (µs).
    pub cpu_us: u64,
    /// CPUs it kept busy over the last sample period (1.0: one CPU's worth).
    pub cpus_busy: f32,
    /// Memory its processes here hold now (bytes, page cache included, as the cgroup counts).
    pub mem: u64,
    /// The most memory they held at once (bytes; 0 where the kernel does not say).
    pub mem_peak: u64,
}

// Figures are decoded finite (`decode` rejects NaN): equality is reflexive.
impl Eq for JobFigures {}

/// The counters of a node's fabric ports, summed over its ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FabricCounters {
    /// Ports counted.
    pub ports: u16,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
}

/// A node's usage record.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeUsage {
    /// The sequence number of the sample taken with it.
    pub seq: u64,
    pub taken_ms: u64,
    /// Jobs whose groups the NM found (more than `jobs` holds when there are more than
    /// [`MAX_JOBS_RECORDED`]).
    pub jobs_total: u16,
    /// The jobs' figures (by job id as the NM takes them).
    pub jobs: Vec<JobFigures>,
    /// The fabric ports' counters; `None` where no port exposes them.
    pub fabric: Option<FabricCounters>,
}

mod off {
    pub const COUNT: usize = 9;
    pub const TOTAL: usize = 10;
    pub const PORTS: usize = 12;
    /// Two bytes of padding, zero.
    pub const PAD: usize = 14;
    pub const TAKEN: usize = 16;
    pub const FABRIC: usize = 24;
    pub const JOBS: usize = 56;
    pub const JOB_BYTES: usize = 36;
}

/// Bytes of a usage record before its jobs' figures.
pub const USAGE_HEADER_BYTES: usize = off::JOBS;

/// Jobs one record holds.
pub const MAX_JOBS_RECORDED: usize = (USAGE_BYTES - 8 - off::JOBS) / off::JOB_BYTES;

impl NodeUsage {
    /// The record's bytes, the jobs in their order; if there are more than it holds, those
    /// using the most memory, most first.
    pub fn encode(&self) -> [u8; USAGE_BYTES] {
        let mut b = [0u8; USAGE_BYTES];
        let mut jobs = self.jobs.clone();
        if jobs.len() > MAX_JOBS_RECORDED {
            jobs.sort_by(|a, b| b.mem.cmp(&a.mem).then(a.job.cmp(&b.job)));
            jobs.truncate(MAX_JOBS_RECORDED);
        }
        put_u64(&mut b, at::SEQ, self.seq);
        b[at::VERSION] = USAGE_VERSION;
        b[off::COUNT] = jobs.len() as u8;
        put_u16(
            &mut b,
            off::TOTAL,
            self.jobs_total
                .max(self.jobs.len().min(u16::MAX as usize) as u16),
        );
        put_u64(&mut b, off::TAKEN, self.taken_ms);
        if let Some(f) = &self.fabric {
            put_u16(&mut b, off::PORTS, f.ports.max(1));
            for (i, v) in [f.rx_bytes, f.tx_bytes, f.rx_packets, f.tx_packets]
                .iter()
                .enumerate()
            {
                put_u64(&mut b, off::FABRIC + 8 * i, *v);
            }
        }
        for (i, j) in jobs.iter().enumerate() {
            let at = off::JOBS + i * off::JOB_BYTES;
            put_u64(&mut b, at, j.job);
            put_u64(&mut b, at + 8, j.cpu_us);
            put_u64(&mut b, at + 16, j.mem);
            put_u64(&mut b, at + 24, j.mem_peak);
            put_f32(&mut b, at + 32, j.cpus_busy);
        }
        put_u64(&mut b, USAGE_BYTES - 8, self.seq);
        b
    }

    /// The record in `bytes` (`None`: never written), every field checked.
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, RecordError> {
        let Some(seq) = sealed_at(bytes, USAGE_BYTES)? else {
            return Ok(None);
        };
        let b = bytes;
        if b[at::VERSION] != USAGE_VERSION {
            return Err(RecordError::Version(b[at::VERSION]));
        }
        let count = b[off::COUNT] as usize;
        if count > MAX_JOBS_RECORDED {
            return Err(out_of_range("job_count", count));
        }
        let total = u16_at(b, off::TOTAL);
        if (total as usize) < count {
            return Err(out_of_range("jobs_total", total));
        }
        let end = off::JOBS + count * off::JOB_BYTES;
        if !zeros(&b[end..USAGE_BYTES - 8]) || u16_at(b, off::PAD) != 0 {
            return Err(out_of_range("usage", "bytes after its last field"));
        }
        let ports = u16_at(b, off::PORTS);
        let counter = |i: usize| u64_at(b, off::FABRIC + 8 * i);
        if ports == 0 && (0..4).any(|i| counter(i) != 0) {
            return Err(out_of_range("fabric", "counters of no port"));
        }
        let fabric = (ports > 0).then(|| FabricCounters {
            ports,
            rx_bytes: counter(0),
            tx_bytes: counter(1),
            rx_packets: counter(2),
            tx_packets: counter(3),
        });
        let mut jobs = Vec::with_capacity(count);
        for i in 0..count {
            let at = off::JOBS + i * off::JOB_BYTES;
            let busy = f32_at(b, at + 32);
            if !busy.is_finite() || busy < 0.0 {
                return Err(out_of_range("cpus_busy", busy));
            }
            jobs.push(JobFigures {
                job: u64_at(b, at),
                cpu_us: u64_at(b, at + 8),
                mem: u64_at(b, at + 16),
                mem_peak: u64_at(b, at + 24),
                cpus_busy: busy,
            });
        }
        Ok(Some(NodeUsage {
            seq,
            taken_ms: u64_at(b, off::TAKEN),
            jobs_total: total,
            jobs,
            fabric,
        }))
    }

    /// How many of a record's first bytes its header (the first [`USAGE_HEADER_BYTES`])
    /// says are in use; the rest, up to its closing sequence number, is zeros. A reader may
    /// read only those and the last eight bytes: a node that wrote more than its count says
    /// wrote nothing anyone reads. A count out of range gives the whole record, for
    /// [`NodeUsage::decode`] to refuse.
    pub fn used_bytes(header: &[u8]) -> usize {
        match header.get(off::COUNT).map(|c| *c as usize) {
            Some(count) if count <= MAX_JOBS_RECORDED => off::JOBS + count * off::JOB_BYTES,
            _ => USAGE_BYTES,
        }
    }

    /// Job `job`'s figures here, if the record holds them.
    pub fn job(&self, job: JobId) -> Option<&JobFigures> {
        self.jobs.iter().find(|j| j.job == job)
    }
}

const _: () = assert!(off::JOBS + MAX_JOBS_RECORDED * off::JOB_BYTES <= USAGE_BYTES - 8);
const _: () = assert!(off::FABRIC + 32 == off::JOBS);

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> NodeUsage {
        NodeUsage {
            seq: 12,
            taken_ms: 1_790_000_000_000,
            jobs_total: 2,
            jobs: vec![
                JobFigures {
                    job: 7,
                    cpu_us: 3_500_000,
                    cpus_busy: 1.98,
                    mem: 64 << 20,
                    mem_peak: 80 << 20,
                },
                JobFigures {
                    job: 9,
                    cpu_us: 1_000,
                    cpus_busy: 0.0,
                    mem: 1 << 20,
                    mem_peak: 0,
                },
            ],
            fabric: Some(FabricCounters {
                ports: 2,
                rx_bytes: 1 << 40,
                tx_bytes: 3,
                rx_packets: 4,
                tx_packets: 5,
            }),
        }
    }

    #[test]
    fn a_usage_record_comes_back_as_it_was_written() {
        let u = usage();
        assert_eq!(NodeUsage::decode(&u.encode()), Ok(Some(u.clone())));
        let none = NodeUsage {
            fabric: None,
            jobs: vec![],
            jobs_total: 0,
            ..u
        };
        assert_eq!(NodeUsage::decode(&none.encode()), Ok(Some(none)));
        assert_eq!(NodeUsage::decode(&[0u8; USAGE_BYTES]), Ok(None));
    }

    #[test]
    fn a_node_with_more_jobs_than_the_record_holds_keeps_the_largest_and_their_number() {
        let many = NodeUsage {
            jobs_total: 40,
            jobs: (0..40)
                .map(|j| JobFigures {
                    job: j,
                    mem: j << 20,
                    ..JobFigures::default()
                })
                .collect(),
            ..usage()
        };
        let back = NodeUsage::decode(&many.encode()).unwrap().unwrap();
        assert_eq!(back.jobs_total, 40);
        assert_eq!(back.jobs.len(), MAX_JOBS_RECORDED);
        assert_eq!(back.jobs[0].job, 39, "most memory first");
        assert!(back.job(0).is_none(), "the smallest is left out");
    }

    #[test]
    fn a_record_read_as_far_as_its_count_decodes_as_the_whole() {
        let whole = usage().encode();
        let used = NodeUsage::used_bytes(&whole[..USAGE_HEADER_BYTES]);
        assert_eq!(used, USAGE_HEADER_BYTES + 2 * off::JOB_BYTES);
        let mut part = [0u8; USAGE_BYTES];
        part[..used].copy_from_slice(&whole[..used]);
        part[USAGE_BYTES - 8..].copy_from_slice(&whole[USAGE_BYTES - 8..]);
        assert_eq!(NodeUsage::decode(&part), NodeUsage::decode(&whole));
        let mut bad = whole;
        bad[off::COUNT] = 99;
        assert_eq!(
            NodeUsage::used_bytes(&bad[..USAGE_HEADER_BYTES]),
            USAGE_BYTES
        );
    }

    #[test]
    fn bad_usage_records_name_the_problem() {
        let good = usage().encode();
        let mut b = good;
        b[off::COUNT] = 200;
        assert!(matches!(
            NodeUsage::decode(&b),
            Err(RecordError::Field {
                field: "job_count",
                ..
            })
        ));
        let mut b = good;
        let busy = off::JOBS + 32;
        b[busy..busy + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            NodeUsage::decode(&b),
            Err(RecordError::Field {
                field: "cpus_busy",
                ..
            })
        ));
        let mut b = good;
        b[off::PORTS..off::PORTS + 2].copy_from_slice(&[0, 0]);
        assert!(NodeUsage::decode(&b).is_err(), "counters without a port");
        let mut b = good;
        b[100] ^= 1;
        b[USAGE_BYTES - 1] ^= 1;
        assert!(matches!(NodeUsage::decode(&b), Err(RecordError::Torn(..))));
        assert_eq!(
            NodeUsage::decode(&good[..RECORD_BYTES]),
            Err(RecordError::Length(RECORD_BYTES, USAGE_BYTES))
        );
    }
}
