//! Samples of the node: what the NM measures once per sample period
//! (`storm_cluster::sample` defines the records).
//!
//! Where each figure comes from:
//!
//! | figure | [`Source::Host`] | [`Source::NodeCgroup`] |
//! | --- | --- | --- |
//! | CPU utilization | `/proc/stat`, busy jiffies over all (idle and iowait are not busy) | the node's cgroup subtree's CPU time over the period × its CPUs (`cpuacct.usage` or `cpu.stat`) |
//! | per-CPU utilization | `/proc/stat`'s `cpuN` lines | none (a cgroup does not tell CPUs apart) |
//! | memory available | `/proc/meminfo` `MemAvailable` | `MemTotal` less the subtree's usage (`memory.usage_in_bytes` or `memory.current`) |
//! | load, swap | `/proc/loadavg`, `/proc/meminfo` | the same (the kernel's) |
//! | spool and state free | `statvfs` of `spool_dir` and `state_dir` (`f_bavail`, as `df`) | the same |
//! | network | `/proc/net/dev` of the NM's network namespace, loopback left out | the same (each testbed node has a namespace of its own) |
//! | the NM's CPU | `getrusage(RUSAGE_SELF)` over the period | the same |
//!
//! [`Source::NodeCgroup`] is for nodes that share one kernel (the namespace testbed), where
//! `/proc/stat` and `/proc/meminfo` are the same for every node: the figures are then the
//! node's own jobs', whatever else the host runs.
//!
//! The parsers are functions of the files' text, so that they are tested on fixed inputs;
//! [`Sampler`] reads the files and keeps the previous sample's counters for the rates.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use storm_cluster::sample::{MAX_CPUS_RECORDED, NodeInventory, NodeSample, Source};

/// Busy and total jiffies of one CPU line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Jiffies {
    pub busy: u64,
    pub all: u64,
}

impl Jiffies {
    /// Utilization between `before` and `self`, 0.0 to 1.0 (0 if no time passed).
    fn since(self, before: Jiffies) -> f32 {
        let all = self.all.saturating_sub(before.all);
        if all == 0 {
            return 0.0;
        }
        (self.busy.saturating_sub(before.busy) as f64 / all as f64).clamp(0.0, 1.0) as f32
    }
}

/// `/proc/stat`'s CPU lines: the total, then each CPU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuTimes {
    pub total: Jiffies,
    pub per_cpu: Vec<Jiffies>,
}

/// Parses `/proc/stat`: `None` if it has no `cpu` line.
pub fn parse_stat(text: &str) -> Option<CpuTimes> {
    let mut out = CpuTimes::default();
    let mut found = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        let mut words = rest.split_ascii_whitespace();
        let total_line = rest.starts_with(' ');
        if !total_line {
            // cpuN
            if words.next().and_then(|n| n.parse::<u32>().ok()).is_none() {
                continue;
            }
        }
        // user nice system idle iowait irq softirq steal (guest time is in user already)
        let v: Vec<u64> = words.take(8).map_while(|w| w.parse().ok()).collect();
        if v.len() < 4 {
            continue;
        }
        let all: u64 = v.iter().sum();
        let idle = v[3] + v.get(4).copied().unwrap_or(0);
        let j = Jiffies {
            busy: all.saturating_sub(idle),
            all,
        };
        if total_line {
            out.total = j;
            found = true;
        } else {
            out.per_cpu.push(j);
        }
    }
    found.then_some(out)
}

/// What `/proc/meminfo` says, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub total: u64,
    pub available: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// Parses `/proc/meminfo` (values in kB).
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut m = MemInfo::default();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(kb) = rest
            .split_ascii_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        let bytes = kb.saturating_mul(1024);
        match key {
            "MemTotal" => m.total = bytes,
            "MemAvailable" => m.available = bytes,
            "SwapTotal" => m.swap_total = bytes,
            "SwapFree" => m.swap_free = bytes,
            _ => {}
        }
    }
    m.available = m.available.min(m.total);
    m.swap_free = m.swap_free.min(m.swap_total);
    m
}

/// Parses `/proc/loadavg`'s three averages.
pub fn parse_loadavg(text: &str) -> [f32; 3] {
    let mut out = [0.0; 3];
    for (o, w) in out.iter_mut().zip(text.split_ascii_whitespace()) {
        *o = w
            .parse::<f32>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .unwrap_or(0.0);
    }
    out
}

/// Counters of the network interfaces, loopback left out, summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetCounters {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
}

/// Parses `/proc/net/dev`.
pub fn parse_net_dev(text: &str) -> NetCounters {
    let mut c = NetCounters::default();
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if name.trim() == "lo" {
            continue;
        }
        let v: Vec<u64> = rest
            .split_ascii_whitespace()
            .map_while(|w| w.parse().ok())
            .collect();
        if v.len() < 10 {
            continue;
        }
        c.rx_bytes = c.rx_bytes.saturating_add(v[0]);
        c.rx_packets = c.rx_packets.saturating_add(v[1]);
        c.tx_bytes = c.tx_bytes.saturating_add(v[8]);
        c.tx_packets = c.tx_packets.saturating_add(v[9]);
    }
    c
}

/// The first CPU's model name and clock (MHz) in `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> (String, u32) {
    let (mut model, mut mhz) = (String::new(), 0);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "model name" if model.is_empty() => model = value.trim().to_string(),
            "cpu MHz" if mhz == 0 => {
                mhz = value.trim().parse::<f64>().map_or(0, |v| v.round() as u32)
            }
            _ => {}
        }
    }
    (model, mhz)
}

/// CPU time of a cgroup in ns: v1 `cpuacct.usage` (a number of ns) or v2 `cpu.stat`
/// (`usage_usec N`).
pub fn parse_cgroup_cpu(text: &str) -> Option<u64> {
    if let Some(line) = text.lines().find(|l| l.starts_with("usage_usec ")) {
        return line[11..].trim().parse::<u64>().ok().map(|us| us * 1000);
    }
    text.trim().parse().ok()
}

/// Which cgroup version a subtree is of: its files' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The node's cgroup subtree: where its CPU time and memory usage are read, and its jobs'
/// groups (`job-<id>`) beneath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCgroupFiles {
    pub version: CgroupVersion,
    /// The node's group in the hierarchy that counts CPU time (v1 `cpuacct`; v2's one).
    pub cpu_dir: PathBuf,
    /// The node's group in the hierarchy that counts memory (v1 `memory`; v2's one).
    pub memory_dir: PathBuf,
}

impl NodeCgroupFiles {
    /// The CPU time of the group at `dir` (ns).
    pub fn cpu_ns(&self, dir: &Path) -> Option<u64> {
        let name = match self.version {
            CgroupVersion::V1 => "cpuacct.usage",
            CgroupVersion::V2 => "cpu.stat",
        };
        parse_cgroup_cpu(&std::fs::read_to_string(dir.join(name)).ok()?)
    }

    /// The memory the group at `dir` holds now (bytes).
    pub fn memory(&self, dir: &Path) -> Option<u64> {
        let name = match self.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        };
        read_number(&dir.join(name))
    }

    /// The most memory the group at `dir` held at once (bytes; v2 kernels before 5.19 do
    /// not say).
    pub fn memory_peak(&self, dir: &Path) -> Option<u64> {
        let name = match self.version {
            CgroupVersion::V1 => "memory.max_usage_in_bytes",
            CgroupVersion::V2 => "memory.peak",
        };
        read_number(&dir.join(name))
    }
}

/// The number a one-number file holds.
pub(crate) fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What the sampler needs to know of the node.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    pub source: Source,
    /// The node's CPUs (the cluster file's `cpus`): what its cgroup's CPU time is over.
    pub node_cpus: u32,
    pub spool_dir: PathBuf,
    pub state_dir: PathBuf,
    /// The node's subtree: its figures for [`Source::NodeCgroup`], and its jobs' groups.
    pub cgroup: Option<NodeCgroupFiles>,
    /// Where sysfs is: the fabric ports' counters are under `class/infiniband`.
    pub sys_dir: PathBuf,
    pub period: Duration,
    /// Where `/proc` is (tests point it elsewhere).
    pub proc_dir: PathBuf,
}

/// Counters of the previous sample, for rates.
#[derive(Debug, Clone)]
struct Previous {
    at: Instant,
    cpu: Option<CpuTimes>,
    cgroup_cpu_ns: Option<u64>,
    nm_cpu: Duration,
}

/// Takes the node's samples.
pub struct Sampler {
    opts: SamplerOptions,
    seq: u64,
    previous: Option<Previous>,
    /// The file systems the last sample could not look at, and why (for the health checks).
    pub unreadable: Vec<(&'static str, String)>,
}

/// The NM's own user and system CPU time so far.
fn own_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let t = |tv: nix::sys::time::TimeVal| {
            Duration::new(tv.tv_sec().max(0) as u64, tv.tv_usec().max(0) as u32 * 1000)
        };
        t(u.user_time()) + t(u.system_time())
    })
}

/// Bytes free for unprivileged users where `path` lives.
fn free_bytes(path: &Path) -> Result<u64, nix::Error> {
    nix::sys::statvfs::statvfs(path).map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

impl Sampler {
    pub fn new(opts: SamplerOptions) -> Self {
        Self {
            opts,
            seq: 0,
            previous: None,
            unreadable: Vec::new(),
        }
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.opts.proc_dir.join(name)).unwrap_or_default()
    }

    /// The static figures.
    pub fn inventory(&self) -> NodeInventory {
        let (model, mhz) = parse_cpuinfo(&self.read("cpuinfo"));
        let mem = parse_meminfo(&self.read("meminfo"));
        let cpus = parse_stat(&self.read("stat")).map_or(0, |t| t.per_cpu.len());
        NodeInventory {
            seq: 1,
            cpus: cpus.min(u16::MAX as usize) as u16,
            mhz,
            ram: mem.total,
            swap: mem.swap_total,
            model,
            kernel: self.read("sys/kernel/osrelease").trim().to_string(),
            arch: std::env::consts::ARCH.to_string(),
        }
    }

    /// Takes a sample now (Unix time `now_ms`), the NM holding `jobs` jobs. Rates are over
    /// the time since the previous sample (0 for the first one).
    pub fn take(&mut self, now_ms: u64, jobs: usize) -> NodeSample {
        let now = Instant::now();
        let mem = parse_meminfo(&self.read("meminfo"));
        let net = parse_net_dev(&self.read("net/dev"));
        let nm_cpu = own_cpu();
        self.unreadable.clear();
        let mut free = |what: &'static str, path: &Path| {
            free_bytes(path).unwrap_or_else(|e| {
                self.unreadable
                    .push((what, format!("{}: {e}", path.display())));
                0
            })
        };
        let spool_free = free("spool_dir", &self.opts.spool_dir);
        let state_free = free("state_dir", &self.opts.state_dir);
        let prev = self.previous.take();
        let elapsed = prev.as_ref().map(|p| now - p.at);
        let nm_share = match (&prev, elapsed) {
            (Some(p), Some(e)) if !e.is_zero() => {
                (nm_cpu.saturating_sub(p.nm_cpu).as_secs_f64() / e.as_secs_f64()) as f32
            }
            _ => 0.0,
        };
        let mut sample = NodeSample {
            seq: 0,
            taken_ms: now_ms,
            period_ms: self.opts.period.as_millis().min(u32::MAX as u128) as u32,
            source: self.opts.source,
            cpus: 0,
            jobs: jobs.min(u16::MAX as usize) as u16,
            cpu_util: 0.0,
            per_cpu: Vec::new(),
            load: parse_loadavg(&self.read("loadavg")),
            nm_cpu: nm_share.max(0.0),
            mem_total: mem.total,
            mem_avail: mem.available,
            swap_total: mem.swap_total,
            swap_used: mem.swap_total - mem.swap_free,
            spool_free,
            state_free,
            net_rx_bytes: net.rx_bytes,
            net_tx_bytes: net.tx_bytes,
            net_rx_packets: net.rx_packets,
            net_tx_packets: net.tx_packets,
        };
        let (mut cpu, mut cgroup_cpu_ns) = (None, None);
        match (self.opts.source, &self.opts.cgroup) {
            (Source::NodeCgroup, Some(files)) => {
                let used = files.memory(&files.memory_dir).unwrap_or(0);
                sample.mem_avail = mem.total.saturating_sub(used);
                sample.cpus = self.opts.node_cpus.min(u16::MAX as u32) as u16;
                cgroup_cpu_ns = files.cpu_ns(&files.cpu_dir);
                if let (Some(p), Some(e), Some(ns)) = (
                    prev.as_ref().and_then(|p| p.cgroup_cpu_ns),
                    elapsed,
                    cgroup_cpu_ns,
                ) {
                    let capacity = e.as_secs_f64() * self.opts.node_cpus.max(1) as f64;
                    if capacity > 0.0 {
                        sample.cpu_util =
                            ((ns.saturating_sub(p) as f64 / 1e9) / capacity).clamp(0.0, 1.0) as f32;
                    }
                }
            }
            _ => {
                sample.source = Source::Host;
                cpu = parse_stat(&self.read("stat"));
                if let Some(t) = &cpu {
                    sample.cpus = t.per_cpu.len().min(u16::MAX as usize) as u16;
                    if let Some(before) = prev.as_ref().and_then(|p| p.cpu.as_ref()) {
                        sample.cpu_util = t.total.since(before.total);
                        sample.per_cpu = t
                            .per_cpu
                            .iter()
                            .zip(&before.per_cpu)
                            .take(MAX_CPUS_RECORDED)
                            .map(|(now, then)| (now.since(*then) * 100.0).round() as u8)
                            .collect();
                    }
                }
            }
        }
        self.seq += 1;
        sample.seq = self.seq;
        self.previous = Some(Previous {
            at: now,
            cpu,
            cgroup_cpu_ns,
            nm_cpu,
        });
        sample
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 0 50 800 50 0 0 0 0 0\n\
                        cpu0 60 0 20 400 20 0 0 0 0 0\n\
                        cpu1 40 0 30 400 30 0 0 0 0 0\n\
                        intr 12345\nctxt 999\n";

    #[test]
    fn proc_stat_gives_busy_and_all_jiffies_per_cpu() {
        let t = parse_stat(STAT).unwrap();
        assert_eq!(
            t.total,
            Jiffies {
                busy: 150,
                all: 1000
            }
        );
        assert_eq!(
            t.per_cpu,
            vec![
                Jiffies { busy: 80, all: 500 },
                Jiffies { busy: 70, all: 500 }
            ]
        );
        assert_eq!(parse_stat("intr 1\n"), None);
        let later = Jiffies {
            busy: 150 + 90,
            all: 1000 + 100,
        };
        assert!((later.since(t.total) - 0.9).abs() < 1e-6);
        assert_eq!(t.total.since(t.total), 0.0);
    }

    #[test]
    fn meminfo_loadavg_net_dev_and_cpuinfo_parse() {
        let m = parse_meminfo(
            "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   20000000 kB\n\
             SwapTotal:       1000 kB\nSwapFree:         400 kB\n",
        );
        assert_eq!(m.total, 24_000_000 * 1024);
        assert_eq!(m.available, 20_000_000 * 1024);
        assert_eq!(m.swap_total - m.swap_free, 600 * 1024);
        assert_eq!(
            parse_loadavg("0.50 1.25 2.00 3/400 1234\n"),
            [0.5, 1.25, 2.0]
        );
        assert_eq!(parse_loadavg("garbage"), [0.0, 0.0, 0.0]);
        let net = parse_net_dev(
            "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo: 5000 50 0 0 0 0 0 0 5000 50 0 0 0 0 0 0\n  \
             eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n  \
             eth1: 1 1 0 0 0 0 0 0 2 2 0 0 0 0 0 0\n",
        );
        assert_eq!(
            net,
            NetCounters {
                rx_bytes: 1001,
                rx_packets: 11,
                tx_bytes: 2002,
                tx_packets: 22
            }
        );
        let (model, mhz) = parse_cpuinfo(
            "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU\ncpu MHz\t\t: 2899.998\n\
             processor\t: 1\nmodel name\t: other\ncpu MHz\t\t: 1.0\n",
        );
        assert_eq!((model.as_str(), mhz), ("Intel(R) Xeon(R) CPU", 2900));
        assert_eq!(parse_cgroup_cpu("123456789\n"), Some(123_456_789));
        assert_eq!(
            parse_cgroup_cpu("usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n"),
            Some(2_500_000)
        );
    }

    /// A fake /proc and cgroup whose counters the test moves.
    struct Fake {
        dir: tempfile::TempDir,
    }

    impl Fake {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("net")).unwrap();
            std::fs::create_dir_all(dir.path().join("sys/kernel")).unwrap();
            std::fs::write(dir.path().join("sys/kernel/osrelease"), "6.1.0-test\n").unwrap();
            std::fs::write(
                dir.path().join("meminfo"),
                "MemTotal: 1000 kB\nMemAvailable: 600 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
            )
            .unwrap();
            std::fs::write(dir.path().join("loadavg"), "1.00 0.50 0.25 1/1 1\n").unwrap();
            std::fs::write(dir.path().join("net/dev"), "h\nh\n").unwrap();
            std::fs::write(dir.path().join("cpuinfo"), "model name : Test CPU\n").unwrap();
            let fake = Fake { dir };
            fake.set_stat(0, 0);
            fake.set_cgroup(0, 0);
            fake
        }
        fn set_stat(&self, busy0: u64, busy1: u64) {
            std::fs::write(
                self.dir.path().join("stat"),
                format!(
                    "cpu  {} 0 0 {} 0 0 0 0\ncpu0 {busy0} 0 0 {} 0 0 0 0\ncpu1 {busy1} 0 0 {} 0 0 0 0\n",
                    busy0 + busy1,
                    2000 - busy0 - busy1,
                    1000 - busy0,
                    1000 - busy1
                ),
            )
            .unwrap();
        }
        fn set_cgroup(&self, cpu_ns: u64, mem: u64) {
            std::fs::write(self.dir.path().join("cpuacct.usage"), cpu_ns.to_string()).unwrap();
            std::fs::write(
                self.dir.path().join("memory.usage_in_bytes"),
                mem.to_string(),
            )
            .unwrap();
        }
        fn sampler(&self, source: Source) -> Sampler {
            Sampler::new(SamplerOptions {
                source,
                node_cpus: 2,
                spool_dir: self.dir.path().into(),
                state_dir: self.dir.path().into(),
                cgroup: Some(NodeCgroupFiles {
                    version: CgroupVersion::V1,
                    cpu_dir: self.dir.path().into(),
                    memory_dir: self.dir.path().into(),
                }),
                period: Duration::from_secs(1),
                proc_dir: self.dir.path().into(),
                sys_dir: self.dir.path().join("sys"),
            })
        }
    }

    #[test]
    fn host_figures_are_rates_between_samples_and_per_cpu() {
        let fake = Fake::new();
        let mut s = fake.sampler(Source::Host);
        let first = s.take(1, 0);
        assert_eq!((first.seq, first.cpu_util, first.cpus), (1, 0.0, 2));
        assert!(first.per_cpu.is_empty(), "no rate before a second sample");
        // Over the next jiffies, CPU 0 was busy all the time and CPU 1 a quarter of it.
        std::fs::write(
            fake.dir.path().join("stat"),
            "cpu  1250 0 0 2750 0 0 0 0\ncpu0 1000 0 0 1000 0 0 0 0\ncpu1 250 0 0 1750 0 0 0 0\n",
        )
        .unwrap();
        let second = s.take(2, 3);
        assert_eq!(second.seq, 2);
        assert_eq!(second.per_cpu, vec![100, 25]);
        assert!(
            (second.cpu_util - 0.625).abs() < 1e-6,
            "{}",
            second.cpu_util
        );
        assert_eq!(
            (second.mem_total, second.mem_avail),
            (1000 * 1024, 600 * 1024)
        );
        assert_eq!(second.jobs, 3);
        assert_eq!(second.load, [1.0, 0.5, 0.25]);
        assert!(second.spool_free > 0, "statvfs of the spool");
        // What the record carries back is what was taken.
        let back = NodeSample::decode(&second.encode()).unwrap().unwrap();
        assert_eq!(back, second);
    }

    #[test]
    fn a_nodes_cgroup_figures_are_its_own_jobs() {
        let fake = Fake::new();
        let mut s = fake.sampler(Source::NodeCgroup);
        s.take(1, 0);
        // The host's CPUs turn busy, the node's jobs used 1 s of CPU meanwhile.
        fake.set_stat(1000, 1000);
        fake.set_cgroup(1_000_000_000, 100 * 1024);
        std::thread::sleep(Duration::from_millis(20));
        let t = s.take(2, 1);
        assert_eq!(t.source, Source::NodeCgroup);
        assert_eq!(t.cpus, 2);
        assert!(t.per_cpu.is_empty(), "a cgroup does not tell CPUs apart");
        // 1 s of CPU in about 20 ms on 2 CPUs: saturated.
        assert_eq!(t.cpu_util, 1.0);
        assert_eq!(
            t.mem_avail,
            (1000 - 100) * 1024,
            "the host's total less its jobs'"
        );
        // Nothing used since: idle, whatever the host's /proc/stat says.
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.take(3, 1).cpu_util, 0.0);
    }

    #[test]
    fn the_inventory_names_the_cpu_the_kernel_and_the_memory() {
        let fake = Fake::new();
        let inv = fake.sampler(Source::Host).inventory();
        assert_eq!(inv.model, "Test CPU");
        assert_eq!(inv.kernel, "6.1.0-test");
        assert_eq!(inv.cpus, 2);
        assert_eq!(inv.ram, 1000 * 1024);
        assert_eq!(inv.arch, std::env::consts::ARCH);
    }
}
