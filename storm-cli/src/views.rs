//! What `storm queue`, `storm history` and `storm nodes` print: aligned tables for people,
//! or JSON (`--json`) for scripts.
//!
//! The JSON is one object per listing (`{"jobs": [...]}`, `{"nodes": [...]}`), each entry with
//! fixed keys; node sets are in the id-range form `storm` accepts (`"0-3,7"`), with the
//! nodes' names beside them. Durations are in seconds.
//!
//! Every text field of a table goes through [`safe`]: names and reasons are other users'
//! words, and must not act on the reader's terminal.

use std::fmt::Write as _;

use serde::Serialize;
use storm_cluster::control::{JobInfo, JobState, ManagerInfo, NodeInfo, NodeState};

use crate::display::safe;

/// A job as the JSON listings show it.
#[derive(Debug, Serialize)]
pub struct JobView {
    pub job: u64,
    pub name: String,
    pub uid: u32,
    /// The owner's user name on this host (its uid if it has none).
    pub user: String,
    pub state: JobState,
    /// Node ids, as ranges (`"0-3,7"`); empty while queued.
    pub nodes: String,
    /// The CPUs it holds of its one node, when it shares the node with other jobs.
    pub cpus: Option<String>,
    pub node_names: Vec<String>,
    pub ntasks: u32,
    pub elapsed_s: f64,
    /// Why a queued job waits, or why an ended one ended other than by its tasks finishing.
    pub reason: Option<String>,
    /// Gang scheduling: its row of the Ousterhout matrix.
    pub time_slot: Option<u32>,
    /// For an ended job, the exit code its submitter got.
    pub exit_code: Option<i32>,
    /// For an ended job, the CPU time its processes used on all its nodes, in seconds
    /// (from their cgroups; null where none was kept).
    pub cpu_s: Option<f64>,
    /// For an ended job, the largest memory its processes held at once on one node.
    pub max_memory_bytes: Option<u64>,
    /// For a job of an array: the array's id (`%A`) and this element's index (`%a`).
    pub array_job_id: Option<u64>,
    pub array_task_id: Option<u32>,
    /// When it was submitted, started and ended (local time, `2026-11-27T07:01:22`).
    pub submitted: String,
    pub started: Option<String>,
    pub ended: Option<String>,
    /// The peer cluster it was flocked to, which runs it (null: this cluster).
    pub cluster: Option<String>,
    /// The peer cluster whose job it is, for one flocked here (null: this cluster's own).
    pub from_cluster: Option<String>,
}

/// The name of user `uid` on this host, or its number.
pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

/// Milliseconds since the Unix epoch as local time, `2026-11-27T07:01:22`, as sacct shows it.
pub fn local_time(ms: u64) -> String {
    storm_cluster::clock::format_unix_ms(ms)
}

/// A node as the JSON listing shows it.
#[derive(Debug, Serialize)]
pub struct NodeView {
    pub id: u32,
    pub name: String,
    pub state: NodeState,
    pub jobs: Vec<u64>,
    pub reason: Option<String>,
    /// The node's last sample and inventory, whether stale, and its age.
    pub records: Option<storm_cluster::sample::NodeRecords>,
}

#[derive(Serialize)]
struct Jobs<'a> {
    jobs: &'a [JobView],
}

#[derive(Serialize)]
struct Nodes<'a> {
    nodes: &'a [NodeView],
}

/// The names of the nodes in `job`, from the node listing (ids it does not know show as
/// their number).
pub fn job_view(job: &JobInfo, nodes: &[NodeInfo]) -> JobView {
    let node_names = job
        .nodes
        .iter()
        .map(|id| {
            nodes
                .iter()
                .find(|n| n.id == id)
                .map_or_else(|| id.to_string(), |n| n.name.clone())
        })
        .collect();
    JobView {
        job: job.job,
        name: job.name.clone(),
        uid: job.uid,
        state: job.state,
        nodes: job.nodes.to_string(),
        cpus: job.cpus.as_ref().map(ToString::to_string),
        node_names,
        ntasks: job.ntasks,
        elapsed_s: job.elapsed_ms as f64 / 1000.0,
        reason: job.reason.clone(),
        time_slot: job.time_slot,
        exit_code: job.exit_code,
        cpu_s: job.usage.cpu_us.map(|us| us as f64 / 1e6),
        max_memory_bytes: job.usage.peak_memory_bytes,
        array_job_id: job.element.map(|e| e.array),
        array_task_id: job.element.map(|e| e.index),
        user: user_name(job.uid),
        submitted: local_time(job.submitted_ms),
        started: job.started_ms.map(local_time),
        ended: job.ended_ms.map(local_time),
        cluster: job.runs_on.clone(),
        from_cluster: job.from_cluster.clone(),
    }
}

/// How the tables name a job: its id, or `ARRAY_INDEX` for an element of an array.
pub(crate) fn label(j: &JobInfo) -> String {
    match j.element {
        Some(e) => format!("{}_{}", e.array, e.index),
        None => j.job.to_string(),
    }
}

pub fn node_view(n: &NodeInfo) -> NodeView {
    NodeView {
        id: n.id,
        name: n.name.clone(),
        state: n.state,
        jobs: n.jobs.clone(),
        reason: n.reason.clone(),
        records: n.records.clone(),
    }
}

/// `{"jobs": [...]}`.
pub fn jobs_json(jobs: &[JobView]) -> String {
    serde_json::to_string_pretty(&Jobs { jobs }).unwrap_or_default()
}

/// `{"nodes": [...]}`.
pub fn nodes_json(nodes: &[NodeView]) -> String {
    serde_json::to_string_pretty(&Nodes { nodes }).unwrap_or_default()
}

/// Bytes as `df -h` shows them: `3.2G`, `512M`.
pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[unit])
    } else {
        format!("{v:.0}{}", UNITS[unit])
    }
}

/// `storm nodes --long`: each node's last sample, its age (`stale` once its NM stopped
/// sampling) and where its CPU and memory figures come from (`host`: `/proc`;
/// `node_cgroup`: the node's cgroup subtree, where nodes share a kernel); under a fresh one,
/// its jobs' CPU and memory and its fabric ports' counters.
pub fn nodes_long_table(nodes: &[NodeInfo]) -> String {
    let mut out = format!(
        "{:>4}  {:<16} {:<10} {:>5} {:>6} {:>7} {:>7} {:>6} {:>7} {:>7} {:>6} {:>9} {:>9}  {:<11} {}\n",
        "ID",
        "NAME",
        "STATE",
        "JOBS",
        "CPU%",
        "LOAD",
        "MEMAVL",
        "MEMTOT",
        "SWAPUSE",
        "SPOOLFR",
        "NMCPU%",
        "NET RX",
        "NET TX",
        "SOURCE",
        "SAMPLED"
    );
    for n in nodes {
        let sample = n.records.as_ref().and_then(|r| r.sample.as_ref());
        let (age, stale) = n
            .records
            .as_ref()
            .map_or((0, true), |r| (r.age_ms, r.stale));
        let _ = match sample {
            Some(s) => writeln!(
                out,
                "{:>4}  {:<16} {:<10} {:>5} {:>6.1} {:>7.2} {:>7} {:>7} {:>7} {:>7} {:>6.2} {:>9} {:>9}  {:<11} {}",
                n.id,
                safe(&n.name),
                n.state.as_str(),
                n.jobs.len(),
                s.cpu_util * 100.0,
                s.load[0],
                size(s.mem_avail),
                size(s.mem_total),
                size(s.swap_used),
                size(s.spool_free),
                s.nm_cpu * 100.0,
                size(s.net_rx_bytes),
                size(s.net_tx_bytes),
                match s.source {
                    storm_cluster::sample::Source::Host => "host",
                    storm_cluster::sample::Source::NodeCgroup => "node_cgroup",
                },
                if stale {
                    format!("STALE, {:.1} s ago", age as f64 / 1000.0)
                } else {
                    format!("{:.1} s ago", age as f64 / 1000.0)
                }
            ),
            None => writeln!(
                out,
                "{:>4}  {:<16} {:<10} {:>5}  no sample{}",
                n.id,
                safe(&n.name),
                n.state.as_str(),
                n.jobs.len(),
                n.records
                    .as_ref()
                    .and_then(|r| r.error.as_deref())
                    .map(|e| format!(" ({})", safe(e)))
                    .unwrap_or_default()
            ),
        };
        if let Some(u) = n.fresh_usage() {
            usage_lines(&mut out, u);
        }
    }
    out
}

/// Under a node of `storm nodes --long`: a line per job it holds (from its cgroup) and one
/// for its fabric ports, where they have counters.
fn usage_lines(out: &mut String, u: &storm_cluster::usage::NodeUsage) {
    for j in &u.jobs {
        let _ = writeln!(
            out,
            "{:>6}job {}: {:.2} CPUs busy, {:.1} s CPU, {} memory (peak {})",
            "",
            j.job,
            j.cpus_busy,
            j.cpu_us as f64 / 1e6,
            size(j.mem),
            size(j.mem_peak)
        );
    }
    let more = usize::from(u.jobs_total).saturating_sub(u.jobs.len());
    if more > 0 {
        let _ = writeln!(out, "{:>6}and {more} more jobs", "");
    }
    if let Some(f) = &u.fabric {
        let _ = writeln!(
            out,
            "{:>6}fabric: {} port{}, rx {} ({} packets), tx {} ({} packets)",
            "",
            f.ports,
            if f.ports == 1 { "" } else { "s" },
            size(f.rx_bytes),
            f.rx_packets,
            size(f.tx_bytes),
            f.tx_packets
        );
    }
}

/// "3-4", or "2 CPUs 0-1" for a job that shares its node.
fn placed_on(j: &JobInfo) -> String {
    if let Some(peer) = &j.runs_on {
        return format!("on peer cluster {}", safe(peer));
    }
    let placed = match &j.cpus {
        Some(cpus) => format!("{} CPUs {cpus}", j.nodes),
        None => j.nodes.to_string(),
    };
    for_peer(placed, j)
}

/// `place`, and the peer cluster whose job `j` is, for one flocked here.
fn for_peer(place: String, j: &JobInfo) -> String {
    match &j.from_cluster {
        Some(home) => format!("{place}, for peer cluster {}", safe(home)),
        None => place,
    }
}

/// `storm queue`: queued and running jobs.
pub fn queue_table(jobs: &[JobInfo]) -> String {
    let mut out = format!(
        "{:>6}  {:<16} {:<8} {:<10} {:>6} {:>10}  NODES / REASON\n",
        "JOB", "NAME", "USER", "STATE", "TASKS", "ELAPSED"
    );
    let mut i = 0;
    while i < jobs.len() {
        let j = &jobs[i];
        // An array's waiting elements on one line, as squeue shows them: `12_[4-99]`.
        let mut name = label(j);
        if let (Some(e), JobState::Queued) = (j.element, j.state) {
            let same = jobs[i..]
                .iter()
                .take_while(|o| {
                    o.state == JobState::Queued
                        && o.element.is_some_and(|oe| oe.array == e.array)
                        && o.reason == j.reason
                })
                .count();
            if same > 1 {
                let indices: Vec<u32> = jobs[i..i + same]
                    .iter()
                    .filter_map(|o| o.element.map(|e| e.index))
                    .collect();
                name = format!(
                    "{}_[{}]",
                    e.array,
                    storm_cluster::control::index_ranges(&indices)
                );
            }
            i += same.max(1);
        } else {
            i += 1;
        }
        let place = match (&j.reason, j.time_slot) {
            (Some(why), _) => safe(why).into_owned(),
            (None, Some(slot)) => format!("{} (time slot {slot})", placed_on(j)),
            (None, None) => placed_on(j),
        };
        let _ = writeln!(
            out,
            "{:>6}  {:<16} {:<8} {:<10} {:>6} {:>9.1}s  {}",
            name,
            safe(&j.name),
            safe(&user_name(j.uid)),
            j.state.as_str(),
            j.ntasks,
            j.elapsed_ms as f64 / 1000.0,
            place
        );
    }
    out
}

/// `storm history`: jobs that ended.
pub fn history_table(jobs: &[JobInfo]) -> String {
    let mut out = format!(
        "{:>6}  {:<16} {:<8} {:<10} {:>4} {:<19} {:>10}  NODES / REASON\n",
        "JOB", "NAME", "USER", "STATE", "EXIT", "ENDED", "ELAPSED"
    );
    for j in jobs {
        let place = match &j.reason {
            Some(why) if j.nodes.is_empty() => safe(why).into_owned(),
            Some(why) => format!("{}: {}", j.nodes, safe(why)),
            None => j.nodes.to_string(),
        };
        let place = for_peer(place, j);
        let _ = writeln!(
            out,
            "{:>6}  {:<16} {:<8} {:<10} {:>4} {:<19} {:>9.1}s  {}",
            label(j),
            safe(&j.name),
            safe(&user_name(j.uid)),
            j.state.as_str(),
            j.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            j.ended_ms.map(local_time).unwrap_or_default(),
            j.elapsed_ms as f64 / 1000.0,
            place
        );
    }
    out
}

/// `storm nodes`.
pub fn nodes_table(nodes: &[NodeInfo]) -> String {
    let mut out = format!(
        "{:>4}  {:<16} {:<10} {:<12} REASON\n",
        "ID", "NAME", "STATE", "JOBS"
    );
    for n in nodes {
        let jobs: Vec<String> = n.jobs.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "{:>4}  {:<16} {:<10} {:<12} {}",
            n.id,
            safe(&n.name),
            n.state.as_str(),
            jobs.join(","),
            safe(n.reason.as_deref().unwrap_or_default())
        );
    }
    out
}

/// `storm managers`.
pub fn managers_table(managers: &[ManagerInfo]) -> String {
    let mut out = format!(
        "{:<16} {:<12} {:>6} {:>10} {:>6} HEARD\n",
        "NAME", "ROLE", "TERM", "MATCHED", "LAG"
    );
    for m in managers {
        let heard = m
            .heard_ms_ago
            .map_or_else(|| "-".to_string(), |ms| format!("{ms} ms ago"));
        let _ = writeln!(
            out,
            "{:<16} {:<12} {:>6} {:>10} {:>6} {heard}",
            safe(&m.name),
            safe(&m.role),
            m.term,
            m.matched,
            m.lag
        );
    }
    out
}

/// `storm peers`: each peer's state, what it offers this cluster, the link's lag.
pub fn peers_table(
    peers: &[storm_cluster::federation::PeerInfo],
    reported_ms_ago: Option<u64>,
) -> String {
    let Some(ago) = reported_ms_ago else {
        return "no peer agent has reported to this machine manager since it started (is \
                storm-peer running beside it? docs/federation.md)\n"
            .into();
    };
    let mut out = format!(
        "peer agent reported {:.1} s ago\n{:<16} {:<8} {:<11} {:>10} {:>9} {:>9} {:>8}  {}\n",
        ago as f64 / 1000.0,
        "PEER",
        "STATE",
        "SHARING",
        "IDLE NODES",
        "IDLE CPUS",
        "QUEUED",
        "LAG",
        "REASON"
    );
    for p in peers {
        let sharing = match (p.lend, p.borrow) {
            (true, true) => "lend+borrow",
            (true, false) => "lend",
            (false, true) => "borrow",
            (false, false) => "-",
        };
        let (idle, cpus, queued) = match &p.offer {
            Some(o) => (
                format!("{}/{}", o.idle_nodes, o.nodes),
                o.idle_cpus.to_string(),
                o.queued.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let lag = p
            .lag_us
            .map_or("-".into(), |us| format!("{:.2}ms", us as f64 / 1000.0));
        let _ = writeln!(
            out,
            "{:<16} {:<8} {:<11} {:>10} {:>9} {:>9} {:>8}  {}",
            safe(&p.name),
            p.state.as_str(),
            sharing,
            idle,
            cpus,
            queued,
            lag,
            p.reason.as_deref().map(safe).unwrap_or_default()
        );
    }
    out
}

/// `{"peers": [...], "reported_ms_ago": N}`.
pub fn peers_json(
    peers: &[storm_cluster::federation::PeerInfo],
    reported_ms_ago: Option<u64>,
) -> String {
    serde_json::to_string_pretty(
        &serde_json::json!({ "peers": peers, "reported_ms_ago": reported_ms_ago }),
    )
    .unwrap_or_default()
}

/// `{"managers": [...]}`.
pub fn managers_json(managers: &[ManagerInfo]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "managers": managers })).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use storm_primitives::NodeSet;

    fn node(id: u32, name: &str) -> NodeInfo {
        NodeInfo {
            id,
            name: name.into(),
            state: NodeState::Allocated,
            jobs: vec![7],
            reason: None,
            records: None,
        }
    }

    #[test]
    fn json_names_the_nodes_and_parses_back() {
        let nodes = vec![node(0, "a0"), node(1, "a1"), node(2, "a2")];
        let job = JobInfo {
            job: 7,
            name: "hello".into(),
            uid: 1000,
            state: JobState::Running,
            nodes: "0,2".parse::<NodeSet>().unwrap(),
            cpus: None,
            ntasks: 4,
            elapsed_ms: 1500,
            reason: None,
            time_slot: Some(1),
            exit_code: None,
            usage: Default::default(),
            element: None,
            submitted_ms: 0,
            started_ms: None,
            ended_ms: None,
            runs_on: None,
            from_cluster: None,
        };
        let text = jobs_json(&[job_view(&job, &nodes)]);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let j = &v["jobs"][0];
        assert_eq!(j["job"], 7);
        // States are enums inside, and the same words in JSON as before they were typed.
        assert_eq!(j["state"], "running");
        assert_eq!(j["nodes"], "0,2");
        assert_eq!(j["node_names"], serde_json::json!(["a0", "a2"]));
        assert_eq!(j["elapsed_s"], 1.5);
        assert_eq!(j["time_slot"], 1);
        assert!(j["exit_code"].is_null());
        let text = nodes_json(&nodes.iter().map(node_view).collect::<Vec<_>>());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["nodes"][1]["name"], "a1");
        assert_eq!(v["nodes"][1]["state"], "allocated");
        assert_eq!(v["nodes"][1]["jobs"], serde_json::json!([7]));
    }

    #[test]
    fn peers_show_their_offer_only_when_up_and_a_missing_agent_is_said() {
        use storm_cluster::federation::{Offer, PeerInfo, PeerState};
        let peer = |name: &str, state: PeerState, reason: Option<&str>| PeerInfo {
            name: name.into(),
            address: "127.0.0.1:7100".parse().unwrap(),
            state,
            lend: true,
            borrow: false,
            offer: (state == PeerState::Up).then_some(Offer {
                idle_nodes: 2,
                idle_cpus: 8,
                nodes: 4,
                queued: 1,
            }),
            lag_us: (state == PeerState::Up).then_some(250),
            heard_ms_ago: Some(100),
            reason: reason.map(str::to_string),
        };
        let text = peers_table(
            &[
                peer("c1", PeerState::Up, None),
                peer("c2", PeerState::Refused, Some("does not hold the key")),
            ],
            Some(1500),
        );
        assert!(
            text.starts_with("peer agent reported 1.5 s ago\n"),
            "{text}"
        );
        let c1 = text.lines().find(|l| l.starts_with("c1")).unwrap();
        assert!(
            c1.contains("up") && c1.contains("2/4") && c1.contains("0.25ms"),
            "{c1}"
        );
        let c2 = text.lines().find(|l| l.starts_with("c2")).unwrap();
        assert!(
            c2.contains("refused") && c2.contains(" - ") && c2.ends_with("does not hold the key"),
            "{c2}"
        );
        assert!(peers_table(&[], None).contains("no peer agent has reported"));
    }

    #[test]
    fn long_shows_a_fresh_nodes_jobs_and_fabric_and_no_usage_of_a_stale_one() {
        use storm_cluster::sample::{NodeRecords, NodeSample};
        use storm_cluster::usage::{FabricCounters, JobFigures, NodeUsage};
        let with = |id: u32, stale: bool| NodeInfo {
            records: Some(NodeRecords {
                sample: Some(NodeSample {
                    seq: 1,
                    ..Default::default()
                }),
                usage: Some(NodeUsage {
                    seq: 1,
                    jobs_total: 3,
                    jobs: vec![JobFigures {
                        job: 7 + u64::from(id),
                        cpu_us: 1_500_000,
                        cpus_busy: 0.98,
                        mem: 64 << 20,
                        mem_peak: 80 << 20,
                    }],
                    fabric: Some(FabricCounters {
                        ports: 1,
                        rx_bytes: 3 << 30,
                        rx_packets: 5,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                stale,
                ..Default::default()
            }),
            ..node(id, &format!("a{id}"))
        };
        let text = nodes_long_table(&[with(0, false), with(1, true)]);
        assert!(
            text.contains("job 7: 0.98 CPUs busy, 1.5 s CPU, 64M memory (peak 80M)"),
            "{text}"
        );
        assert!(text.contains("and 2 more jobs"), "{text}");
        assert!(
            text.contains("fabric: 1 port, rx 3.0G (5 packets)"),
            "{text}"
        );
        assert!(
            !text.contains("job 8:"),
            "a stale node's jobs are not shown: {text}"
        );
    }

    #[test]
    fn an_arrays_waiting_elements_share_a_line_and_the_others_are_named_by_index() {
        let element = |job: u64, index: u32, state: JobState| JobInfo {
            job,
            name: "arr".into(),
            uid: 1000,
            state,
            nodes: NodeSet::new(),
            cpus: None,
            ntasks: 1,
            elapsed_ms: 0,
            reason: (state == JobState::Queued).then(|| "waiting".to_string()),
            time_slot: None,
            exit_code: None,
            usage: Default::default(),
            element: Some(storm_cluster::control::ArrayElement {
                array: 12,
                index,
                count: 6,
                throttle: None,
            }),
            submitted_ms: 0,
            started_ms: None,
            ended_ms: None,
            runs_on: None,
            from_cluster: None,
        };
        let jobs = [
            element(12, 0, JobState::Running),
            element(13, 1, JobState::Queued),
            element(14, 2, JobState::Queued),
            element(15, 3, JobState::Queued),
            element(16, 5, JobState::Queued),
        ];
        let table = queue_table(&jobs);
        let first: Vec<&str> = table
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(first, ["12_0", "12_[1-3,5]"], "{table}");
    }
}
