//! What the benchmark observes besides runtimes: the daemons' CPU time (every thread's
//! schedstat, the NMs' launchers included), the switches every NM recorded (`switches.log`,
//! written when `[scheduler] switch_log` is on), the strobe skew computed from them, and the
//! same-run wake-up baseline for that skew.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cli::local::LocalCluster;

/// CPU time one thread has run, in nanoseconds (first field of its schedstat); 0 for a thread
/// that ended meanwhile.
fn thread_cpu_ns(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The thread ids of process `pid`.
fn threads(pid: u32) -> Result<Vec<PathBuf>> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))?;
    Ok(entries.flatten().map(|e| e.path()).collect())
}

/// CPU time process `pid` has run, all its threads together, in nanoseconds. (The process's
/// own /proc/PID/schedstat counts its main thread only.)
fn process_cpu_ns(pid: u32) -> Result<u64> {
    Ok(threads(pid)?
        .iter()
        .map(|t| thread_cpu_ns(&t.join("schedstat")))
        .sum())
}

/// The launchers (`storm-pl`) process `pid` started: its children of that name.
fn launchers(pid: u32) -> Result<Vec<u32>> {
    let mut found = Vec::new();
    for t in threads(pid)? {
        let children = std::fs::read_to_string(t.join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            if comm.trim() == "storm-pl" {
                found.push(child);
            }
        }
    }
    Ok(found)
}

/// CPU time of the MM and of all NMs at one instant.
#[derive(Debug, Clone, Copy)]
pub struct DaemonCpu {
    pub mm_ns: u64,
    pub nms_ns: u64,
    pub nms: u32,
    at: Instant,
}

impl DaemonCpu {
    pub fn now(cluster: &LocalCluster) -> Result<Self> {
        let mut cpu = DaemonCpu {
            mm_ns: 0,
            nms_ns: 0,
            nms: 0,
            at: Instant::now(),
        };
        for (name, pid) in cluster.daemon_pids() {
            let ns = process_cpu_ns(pid)?;
            if name == "storm-mm" {
                cpu.mm_ns += ns;
            } else {
                // A node's share is its NM's threads and its launcher's.
                let launched: u64 = launchers(pid)?
                    .into_iter()
                    .map(process_cpu_ns)
                    .sum::<Result<u64>>()?;
                cpu.nms_ns += ns + launched;
                cpu.nms += 1;
            }
        }
        Ok(cpu)
    }

    /// CPU used between `self` and `later`: (MM seconds, NM seconds summed over nodes, wall
    /// seconds).
    pub fn used_until(&self, later: &DaemonCpu) -> (f64, f64, f64) {
        (
            later.mm_ns.saturating_sub(self.mm_ns) as f64 / 1e9,
            later.nms_ns.saturating_sub(self.nms_ns) as f64 / 1e9,
            later.at.duration_since(self.at).as_secs_f64(),
        )
    }
}

/// One line of an NM's switches.log: heartbeat sequence number, CLOCK_MONOTONIC times at which
/// the NM took the heartbeat and at which the switch was complete, and whether it stopped or
/// continued anything.
#[derive(Debug, Clone, Copy)]
struct Switch {
    seq: u64,
    ns: u64,
    recv_ns: u64,
    switched: bool,
}

/// A line of switches.log: a switch, or a lease that ran out (`lease=expired`: the NM
/// stopped its slot because the next heartbeat was late; no heartbeat's switch).
#[derive(Debug, Clone, Copy)]
enum Line {
    Switch(Switch),
    LeaseExpired,
}

/// One line of switches.log; `None` if it is malformed.
fn parse_line(line: &str) -> Option<Line> {
    if line.split_whitespace().any(|f| f == "lease=expired") {
        return Some(Line::LeaseExpired);
    }
    parse_switch(line).map(Line::Switch)
}

fn parse_switch(line: &str) -> Option<Switch> {
    let mut f = line.split_whitespace();
    let seq = f.next()?.parse().ok()?;
    let ns = f.next()?.parse().ok()?;
    let mut switched = false;
    let mut recv_ns = None;
    for field in f {
        let (key, value) = field.split_once('=')?;
        match key {
            "stop" | "cont" => switched |= !value.is_empty(),
            "recv" => recv_ns = Some(value.parse().ok()?),
            _ => {}
        }
    }
    Some(Switch {
        seq,
        ns,
        recv_ns: recv_ns?,
        switched,
    })
}

/// The switch logs of every NM of a cluster, read from a mark onwards.
pub struct SwitchLogs {
    paths: Vec<PathBuf>,
    from: Vec<u64>,
}

impl SwitchLogs {
    /// Marks the current end of every node's log: `read` returns only what comes after.
    pub fn mark(root: &Path, nodes: u32) -> Self {
        let paths: Vec<PathBuf> = (0..nodes)
            .map(|i| root.join(format!("node{i}")).join("switches.log"))
            .collect();
        let from = paths
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .collect();
        Self { paths, from }
    }

    fn read(&self) -> Result<Vec<Vec<Switch>>> {
        self.paths
            .iter()
            .zip(&self.from)
            .map(|(path, &from)| {
                let mut text = String::new();
                let mut f = std::fs::File::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(from))?;
                f.read_to_string(&mut text)?;
                let mut switches = Vec::new();
                for l in text.lines() {
                    match parse_line(l) {
                        Some(Line::Switch(s)) => switches.push(s),
                        Some(Line::LeaseExpired) => {}
                        None => bail!("malformed line in {}: {l:?}", path.display()),
                    }
                }
                Ok(switches)
            })
            .collect()
    }

    /// Switches since the mark: how many each node made, and the skew of every heartbeat at
    /// which all nodes switched.
    pub fn summary(&self) -> Result<SwitchSummary> {
        let per_node = self.read()?;
        let switches: usize = per_node
            .iter()
            .map(|v| v.iter().filter(|s| s.switched).count())
            .sum();
        let mut by_seq: BTreeMap<u64, Vec<Switch>> = BTreeMap::new();
        for node in &per_node {
            for s in node.iter().filter(|s| s.switched) {
                by_seq.entry(s.seq).or_default().push(*s);
            }
        }
        let nodes = per_node.len();
        let heartbeats = by_seq.len();
        let spread = |times: &mut dyn Iterator<Item = u64>| {
            let (lo, hi) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
            hi.saturating_sub(lo) as f64 / 1e9
        };
        let complete: Vec<&Vec<Switch>> = by_seq.values().filter(|v| v.len() == nodes).collect();
        // Heartbeats are numbered: from the first switch to the last, time over numbers.
        let first = by_seq.iter().next().map(|(seq, v)| (*seq, v[0].recv_ns));
        let last = by_seq
            .iter()
            .next_back()
            .map(|(seq, v)| (*seq, v[0].recv_ns));
        let heartbeat_period = match (first, last) {
            (Some((s0, t0)), Some((s1, t1))) if s1 > s0 => {
                Some(t1.saturating_sub(t0) as f64 / 1e9 / (s1 - s0) as f64)
            }
            _ => None,
        };
        Ok(SwitchSummary {
            switches,
            heartbeats,
            heartbeat_period,
            skews: complete
                .iter()
                .map(|v| spread(&mut v.iter().map(|s| s.ns)))
                .collect(),
            receipt_skews: complete
                .iter()
                .map(|v| spread(&mut v.iter().map(|s| s.recv_ns)))
                .collect(),
            handling: per_node
                .iter()
                .flatten()
                .filter(|s| s.switched)
                .map(|s| s.ns.saturating_sub(s.recv_ns) as f64 / 1e9)
                .collect(),
        })
    }
}

pub struct SwitchSummary {
    /// Switches summed over nodes.
    pub switches: usize,
    /// Heartbeats at which at least one node switched.
    pub heartbeats: usize,
    /// Time between two heartbeats as the NMs took them, in seconds (the real quantum).
    pub heartbeat_period: Option<f64>,
    /// First-to-last spread, in seconds, of the switch's completion, for each heartbeat at
    /// which every node switched.
    pub skews: Vec<f64>,
    /// The same for the heartbeat's receipt by the NMs.
    pub receipt_skews: Vec<f64>,
    /// On each node, from taking the heartbeat to the switch being complete, in seconds.
    pub handling: Vec<f64>,
}

/// The wake-up spread of this host, the floor under any strobe skew measured on it: one
/// thread writes a byte to each of `n` sockets, `n` threads blocked in read(2) note when
/// they wake, and the spread between the first and the last is one sample.
pub fn wakeup_spread(n: u32, samples: usize) -> Result<Vec<f64>> {
    let origin = Instant::now();
    let mut writers = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, u32, f64)>();
    let mut threads = Vec::new();
    for node in 0..n {
        let (w, mut r) = UnixStream::pair()?;
        writers.push(w);
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            let mut round = 0usize;
            while r.read_exact(&mut byte).is_ok() && byte[0] == 1 {
                let _ = tx.send((round, node, origin.elapsed().as_secs_f64()));
                round += 1;
            }
        }));
    }
    drop(tx);
    let mut spreads = Vec::with_capacity(samples);
    for round in 0..samples {
        for w in &mut writers {
            w.write_all(&[1])?;
        }
        let mut times = Vec::with_capacity(n as usize);
        while times.len() < n as usize {
            let (r, _, t) = rx
                .recv_timeout(Duration::from_secs(5))
                .context("a wake-up thread did not answer")?;
            if r != round {
                bail!("wake-up rounds out of step");
            }
            times.push(t);
        }
        let lo = times.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = times.iter().copied().fold(0.0, f64::max);
        spreads.push(hi - lo);
        std::thread::sleep(Duration::from_millis(1));
    }
    for w in &mut writers {
        let _ = w.write_all(&[0]);
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(spreads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_line_says_whether_anything_was_stopped_or_continued() {
        let s = parse_switch("42 1000 stop=1 cont=2 start= recv=900").unwrap();
        assert_eq!((s.seq, s.ns, s.recv_ns, s.switched), (42, 1000, 900, true));
        let started_only = parse_switch("43 2000 stop= cont= start=3 recv=1990").unwrap();
        assert!(!started_only.switched);
        assert!(parse_switch("43 x stop= cont= start= recv=1").is_none());
        assert!(parse_switch("43 2000 stop= cont= start=").is_none());
        assert!(
            matches!(
                parse_line("43 2000 stop=1 cont= start= recv=1990 from=43 lease=expired"),
                Some(Line::LeaseExpired)
            ),
            "a lease that ran out is no switch, and no malformed line"
        );
        assert!(matches!(
            parse_line("42 1000 stop=1 cont=2 start= recv=900"),
            Some(Line::Switch(_))
        ));
        assert!(parse_line("43 2000 nonsense").is_none());
        assert!(parse_switch("43 2000 nonsense").is_none());
    }

    #[test]
    fn skew_counts_only_heartbeats_every_node_switched_at() {
        let dir = tempfile::tempdir().unwrap();
        for (i, text) in [
            "1 100 stop=1 cont=2 start= recv=90\n2 200 stop=2 cont=1 start= recv=190\n",
            // Node 1's lease for heartbeat 1 ran out before heartbeat 2 came: that line is
            // no switch, and not malformed.
            "1 130 stop=1 cont=2 start= recv=95\n1 170 stop=2 cont= start= recv=170 from=1 \
             lease=expired\n3 400 stop=2 cont=1 start= recv=380\n",
        ]
        .iter()
        .enumerate()
        {
            let d = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("switches.log"), text).unwrap();
        }
        let summary = SwitchLogs::mark(dir.path(), 2);
        // Nothing after the mark yet.
        assert_eq!(summary.summary().unwrap().switches, 0);
        let all = SwitchLogs {
            paths: summary.paths.clone(),
            from: vec![0, 0],
        }
        .summary()
        .unwrap();
        assert_eq!(all.switches, 4);
        assert_eq!(all.heartbeats, 3);
        // Heartbeat 1 taken at 90 ns (node 0's line comes first), heartbeat 3 at 380 ns.
        assert_eq!(all.heartbeat_period, Some(145e-9));
        assert_eq!(all.skews, vec![30e-9]);
        assert_eq!(all.receipt_skews, vec![5e-9]);
        assert_eq!(all.handling.len(), 4);
    }

    #[test]
    fn the_wakeup_baseline_gives_one_spread_per_round() {
        let spreads = wakeup_spread(3, 5).unwrap();
        assert_eq!(spreads.len(), 5);
        assert!(spreads.iter().all(|s| *s >= 0.0 && s.is_finite()));
    }
}
