//! What the node's jobs and fabric ports used, taken with each sample
//! ([`storm_cluster::usage::NodeUsage`]).
//!
//! * **Jobs**: every `job-<id>` group under the node's cgroup subtree (the groups
//!   [`crate::cgroup`] makes, confines and kills) is read for its CPU time, its memory now and
//!   its peak; the CPUs a job kept busy are its CPU time's growth over the time since the last
//!   look. The groups are the kernel's own account, so a job's figures include every process
//!   it forked, detached or not. Without cgroups no job is counted (the record says none).
//! * **Fabric**: the standard counters of every port under `SYSFS/class/infiniband/*/ports/*/
//!   counters` (InfiniBand, and RoCE or Omni-Path devices that register there), summed.
//!   `port_xmit_data` and `port_rcv_data` count 4-byte words (the InfiniBand specification's
//!   unit); the record holds bytes. Providers with no such counters (tcp, sockets, shm, as on
//!   this project's CI machine) leave the fabric out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use storm_cluster::messages::JobId;
use storm_cluster::usage::{FabricCounters, JobFigures, NodeUsage};

use crate::sample::{NodeCgroupFiles, read_number};

/// Reads the node's usage, one look per sample.
pub struct UsageSampler {
    cgroup: Option<NodeCgroupFiles>,
    infiniband: PathBuf,
    /// Each job's CPU time at the last look, for its rate.
    last: BTreeMap<JobId, (Instant, u64)>,
}

/// The jobs whose groups are under `dir` (`job-<id>`).
fn job_groups(dir: &Path) -> Vec<JobId> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut jobs: Vec<JobId> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            name.to_str()?.strip_prefix("job-")?.parse().ok()
        })
        .collect();
    jobs.sort_unstable();
    jobs
}

/// The counters of every fabric port under `infiniband` (`None` if there is none).
pub fn fabric_counters(infiniband: &Path) -> Option<FabricCounters> {
    let mut sum = FabricCounters::default();
    for device in std::fs::read_dir(infiniband).ok()?.flatten() {
        let Ok(ports) = std::fs::read_dir(device.path().join("ports")) else {
            continue;
        };
        for port in ports.flatten() {
            let counters = port.path().join("counters");
            let read = |name: &str| read_number(&counters.join(name));
            let Some(xmit_words) = read("port_xmit_data") else {
                continue;
            };
            sum.ports = sum.ports.saturating_add(1);
            sum.tx_bytes = sum.tx_bytes.saturating_add(xmit_words.saturating_mul(4));
            sum.rx_bytes = sum
                .rx_bytes
                .saturating_add(read("port_rcv_data").unwrap_or(0).saturating_mul(4));
            sum.tx_packets = sum
                .tx_packets
                .saturating_add(read("port_xmit_packets").unwrap_or(0));
            sum.rx_packets = sum
                .rx_packets
                .saturating_add(read("port_rcv_packets").unwrap_or(0));
        }
    }
    (sum.ports > 0).then_some(sum)
}

impl UsageSampler {
    /// A sampler of the jobs under `cgroup` (none without one) and the ports under
    /// `sys_dir/class/infiniband`.
    pub fn new(cgroup: Option<NodeCgroupFiles>, sys_dir: &Path) -> Self {
        Self {
            cgroup,
            infiniband: sys_dir.join("class/infiniband"),
            last: BTreeMap::new(),
        }
    }

    /// The usage now, recorded with the sample of sequence `seq` taken at `taken_ms`.
    pub fn take(&mut self, seq: u64, taken_ms: u64) -> NodeUsage {
        let now = Instant::now();
        let mut jobs = Vec::new();
        let mut last = BTreeMap::new();
        if let Some(files) = &self.cgroup {
            for job in job_groups(&files.cpu_dir) {
                let name = format!("job-{job}");
                // A group removed between the listing and the read: the job has ended.
                let Some(cpu_ns) = files.cpu_ns(&files.cpu_dir.join(&name)) else {
                    continue;
                };
                let memory_dir = files.memory_dir.join(&name);
                let cpus_busy = match self.last.get(&job) {
                    Some((then, before)) if now > *then => {
                        (cpu_ns.saturating_sub(*before) as f64 / 1e9 / (now - *then).as_secs_f64())
                            as f32
                    }
                    _ => 0.0,
                };
                jobs.push(JobFigures {
                    job,
                    cpu_us: cpu_ns / 1000,
                    cpus_busy,
                    mem: files.memory(&memory_dir).unwrap_or(0),
                    mem_peak: files.memory_peak(&memory_dir).unwrap_or(0),
                });
                last.insert(job, (now, cpu_ns));
            }
        }
        self.last = last;
        NodeUsage {
            seq,
            taken_ms,
            jobs_total: jobs.len().min(u16::MAX as usize) as u16,
            jobs,
            fabric: fabric_counters(&self.infiniband),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::CgroupVersion;
    use std::time::Duration;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn each_jobs_group_gives_its_cpu_rate_its_memory_and_its_peak() {
        let dir = tempfile::tempdir().unwrap();
        let (cpu, mem) = (dir.path().join("cpuacct"), dir.path().join("memory"));
        let files = NodeCgroupFiles {
            version: CgroupVersion::V1,
            cpu_dir: cpu.clone(),
            memory_dir: mem.clone(),
        };
        let job = |id: u64, cpu_ns: u64, bytes: u64| {
            write(
                &cpu.join(format!("job-{id}/cpuacct.usage")),
                &cpu_ns.to_string(),
            );
            write(
                &mem.join(format!("job-{id}/memory.usage_in_bytes")),
                &bytes.to_string(),
            );
            write(
                &mem.join(format!("job-{id}/memory.max_usage_in_bytes")),
                &(2 * bytes).to_string(),
            );
        };
        job(7, 0, 64 << 20);
        job(9, 5_000, 1 << 20);
        // Not a job's group.
        std::fs::create_dir_all(cpu.join("other")).unwrap();
        let mut s = UsageSampler::new(Some(files), dir.path());
        let first = s.take(1, 100);
        assert_eq!(first.jobs_total, 2);
        assert_eq!(first.jobs.iter().map(|j| j.job).collect::<Vec<_>>(), [7, 9]);
        assert!(first.jobs.iter().all(|j| j.cpus_busy == 0.0), "no rate yet");
        assert_eq!(first.fabric, None, "no fabric port here");
        // Job 7 uses 2 s of CPU in about 50 ms: many CPUs' worth; job 9 none.
        std::thread::sleep(Duration::from_millis(50));
        job(7, 2_000_000_000, 64 << 20);
        let second = s.take(2, 200);
        let seven = second.job(7).unwrap();
        assert_eq!(seven.cpu_us, 2_000_000);
        assert!(seven.cpus_busy > 1.0, "{}", seven.cpus_busy);
        assert_eq!((seven.mem, seven.mem_peak), (64 << 20, 128 << 20));
        assert_eq!(second.job(9).unwrap().cpus_busy, 0.0);
        // A job whose group is gone is no longer counted.
        std::fs::remove_dir_all(cpu.join("job-9")).unwrap();
        assert!(s.take(3, 300).job(9).is_none());
    }

    #[test]
    fn fabric_ports_are_summed_in_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let ib = dir.path().join("class/infiniband");
        for (dev, port, words) in [("mlx5_0", 1, 1000u64), ("mlx5_1", 1, 24)] {
            let c = ib.join(format!("{dev}/ports/{port}/counters"));
            write(&c.join("port_xmit_data"), &words.to_string());
            write(&c.join("port_rcv_data"), &(2 * words).to_string());
            write(&c.join("port_xmit_packets"), "10");
            write(&c.join("port_rcv_packets"), "20");
        }
        // A device without counters (as some virtual ones) is no port.
        std::fs::create_dir_all(ib.join("rxe0/ports/1")).unwrap();
        let mut s = UsageSampler::new(None, dir.path());
        let u = s.take(1, 0);
        assert_eq!(
            u.fabric,
            Some(FabricCounters {
                ports: 2,
                tx_bytes: 4 * 1024,
                rx_bytes: 8 * 1024,
                tx_packets: 20,
                rx_packets: 40,
            })
        );
        assert!(u.jobs.is_empty(), "no cgroups, no jobs counted");
    }
}
