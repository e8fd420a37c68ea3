//! `storm stat JOB` (Slurm's `sstat`): what a running job uses now, node by node, from the
//! usage records its nodes' NMs put beside their samples (`storm_cluster::usage`): the CPUs
//! it keeps busy, the CPU time it used so far, its memory now and its peak, each from the
//! job's cgroup on that node.
//!
//! Figures are only shown from fresh records: a node whose sample is stale (its NM frozen,
//! down or cut off) says so instead. A job that is not running is refused with where to
//! look (`storm queue` for one that waits, `storm history` for one that ended).

use std::fmt::Write as _;

use serde::Serialize;
use storm_cluster::control::{JobInfo, JobRef, JobState, NodeInfo};

use crate::display::safe;
use crate::views::{label, size};

/// One node's figures for the job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeStat {
    pub node: String,
    /// CPUs the job kept busy there over the last sample period.
    pub cpus_busy: Option<f32>,
    /// CPU time used there so far (seconds).
    pub cpu_s: Option<f64>,
    pub mem_bytes: Option<u64>,
    pub mem_peak_bytes: Option<u64>,
    /// Age of the figures (ms).
    pub age_ms: Option<u64>,
    /// Why there are no figures, when there are none.
    pub missing: Option<String>,
}

/// The job's figures over all its nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobStat {
    pub job: String,
    pub name: String,
    pub state: JobState,
    pub nodes: Vec<NodeStat>,
    /// Sums over the nodes with figures.
    pub cpus_busy: f32,
    pub cpu_s: f64,
    pub mem_bytes: u64,
    /// The largest peak of one node, and that node.
    pub max_mem_peak_bytes: u64,
    pub max_mem_peak_node: Option<String>,
}

/// Whether `j` is the job `want` names.
fn names(j: &JobInfo, want: &JobRef) -> bool {
    match want {
        JobRef::Id(id) => j.job == *id,
        JobRef::Element { array, index } => j
            .element
            .is_some_and(|e| e.array == *array && e.index == *index),
    }
}

/// The figures of the job `want` names among `jobs` (the queue), from `nodes`' records.
pub fn stat(want: &JobRef, jobs: &[JobInfo], nodes: &[NodeInfo]) -> Result<JobStat, String> {
    let shown = want.to_string();
    let Some(job) = jobs.iter().find(|j| names(j, want)) else {
        return Err(format!(
            "job {shown} is not queued or running (storm history shows jobs that ended, with \
             their CPU time and peak memory)"
        ));
    };
    match job.state {
        JobState::Running | JobState::Suspended | JobState::Ending | JobState::Recovering => {}
        JobState::Queued => {
            return Err(format!(
                "job {shown} is queued, not running: storm queue says why"
            ));
        }
        other => {
            return Err(format!(
                "job {shown} is {}, not running: nothing of it runs to measure yet",
                other.as_str()
            ));
        }
    }
    let mut out = JobStat {
        job: label(job),
        name: job.name.clone(),
        state: job.state,
        nodes: Vec::new(),
        cpus_busy: 0.0,
        cpu_s: 0.0,
        mem_bytes: 0,
        max_mem_peak_bytes: 0,
        max_mem_peak_node: None,
    };
    for id in job.nodes.iter() {
        let Some(node) = nodes.iter().find(|n| n.id == id) else {
            continue;
        };
        let mut row = NodeStat {
            node: node.name.clone(),
            cpus_busy: None,
            cpu_s: None,
            mem_bytes: None,
            mem_peak_bytes: None,
            age_ms: None,
            missing: None,
        };
        match (node.fresh_usage(), node.records.as_ref()) {
            (Some(usage), Some(records)) => match usage.job(job.job) {
                Some(f) => {
                    row.cpus_busy = Some(f.cpus_busy);
                    row.cpu_s = Some(f.cpu_us as f64 / 1e6);
                    row.mem_bytes = Some(f.mem);
                    row.mem_peak_bytes = Some(f.mem_peak);
                    row.age_ms = Some(records.age_ms);
                    out.cpus_busy += f.cpus_busy;
                    out.cpu_s += f.cpu_us as f64 / 1e6;
                    out.mem_bytes += f.mem;
                    if f.mem_peak >= out.max_mem_peak_bytes {
                        out.max_mem_peak_bytes = f.mem_peak;
                        out.max_mem_peak_node = Some(node.name.clone());
                    }
                }
                None if usage.jobs_total as usize > usage.jobs.len() => {
                    row.missing = Some(format!(
                        "the node holds {} jobs; its record keeps the {} using the most memory",
                        usage.jobs_total,
                        usage.jobs.len()
                    ))
                }
                None => {
                    row.missing =
                        Some("no cgroup of the job there yet (or the node keeps no cgroups)".into())
                }
            },
            (None, Some(r)) if r.sample.is_some() => {
                row.missing = Some(format!(
                    "the node's records are stale ({:.1} s old)",
                    r.age_ms as f64 / 1000.0
                ))
            }
            _ => row.missing = Some("the node has not sampled yet".into()),
        }
        out.nodes.push(row);
    }
    Ok(out)
}

/// The figures as a table.
pub fn table(s: &JobStat) -> String {
    let mut out = format!(
        "job {} ({}), {}\n{:<16} {:>9} {:>10} {:>8} {:>8}  {}\n",
        s.job,
        safe(&s.name),
        s.state.as_str(),
        "NODE",
        "CPUS",
        "CPU TIME",
        "MEM",
        "PEAK",
        "SAMPLED"
    );
    for n in &s.nodes {
        let _ = match (n.cpus_busy, n.cpu_s, n.mem_bytes, n.mem_peak_bytes) {
            (Some(busy), Some(cpu), Some(mem), Some(peak)) => writeln!(
                out,
                "{:<16} {:>9.2} {:>9.1}s {:>8} {:>8}  {:.1} s ago",
                safe(&n.node),
                busy,
                cpu,
                size(mem),
                size(peak),
                n.age_ms.unwrap_or(0) as f64 / 1000.0
            ),
            _ => writeln!(
                out,
                "{:<16} {}",
                safe(&n.node),
                n.missing.as_deref().unwrap_or("no figures")
            ),
        };
    }
    let _ = writeln!(
        out,
        "{:<16} {:>9.2} {:>9.1}s {:>8} {:>8}  {}",
        "TOTAL",
        s.cpus_busy,
        s.cpu_s,
        size(s.mem_bytes),
        size(s.max_mem_peak_bytes),
        s.max_mem_peak_node
            .as_deref()
            .map(|n| format!("peak: the largest of one node ({})", safe(n)))
            .unwrap_or_default()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use storm_cluster::control::NodeState;
    use storm_cluster::sample::{NodeRecords, NodeSample};
    use storm_cluster::usage::{JobFigures, NodeUsage};
    use storm_primitives::NodeSet;

    fn running(job: u64, nodes: &[u32]) -> JobInfo {
        JobInfo {
            job,
            name: "sim".into(),
            uid: 0,
            state: JobState::Running,
            nodes: nodes
                .iter()
                .fold(NodeSet::new(), |s, n| s.union(&NodeSet::single(*n))),
            cpus: None,
            ntasks: 2,
            elapsed_ms: 0,
            reason: None,
            time_slot: None,
            exit_code: None,
            usage: Default::default(),
            element: None,
            submitted_ms: 0,
            started_ms: None,
            ended_ms: None,
            runs_on: None,
            from_cluster: None,
        }
    }

    fn node(id: u32, stale: bool, figures: Vec<JobFigures>) -> NodeInfo {
        NodeInfo {
            id,
            name: format!("n{id}"),
            state: NodeState::Allocated,
            jobs: figures.iter().map(|f| f.job).collect(),
            reason: None,
            records: Some(NodeRecords {
                sample: Some(NodeSample {
                    seq: 3,
                    ..Default::default()
                }),
                usage: Some(NodeUsage {
                    seq: 3,
                    jobs_total: figures.len() as u16,
                    jobs: figures,
                    ..Default::default()
                }),
                stale,
                age_ms: if stale { 9_000 } else { 400 },
                ..Default::default()
            }),
        }
    }

    fn figures(job: u64, busy: f32, mem_mib: u64) -> JobFigures {
        JobFigures {
            job,
            cpu_us: 2_000_000,
            cpus_busy: busy,
            mem: mem_mib << 20,
            mem_peak: (2 * mem_mib) << 20,
        }
    }

    #[test]
    fn a_running_job_is_summed_over_its_fresh_nodes_and_a_stale_one_says_so() {
        let jobs = [running(12, &[0, 1, 2])];
        let nodes = [
            node(0, false, vec![figures(12, 1.0, 64), figures(13, 2.0, 512)]),
            node(1, false, vec![figures(12, 0.5, 100)]),
            node(2, true, vec![figures(12, 9.0, 900)]),
        ];
        let s = stat(&JobRef::Id(12), &jobs, &nodes).unwrap();
        assert_eq!(s.nodes.len(), 3);
        assert_eq!(
            s.cpus_busy, 1.5,
            "job 13's CPUs and the stale node's are not counted"
        );
        assert_eq!(s.mem_bytes, 164 << 20);
        assert_eq!(s.cpu_s, 4.0);
        assert_eq!(
            (s.max_mem_peak_bytes, s.max_mem_peak_node.as_deref()),
            (200 << 20, Some("n1"))
        );
        assert!(s.nodes[2].missing.as_deref().unwrap().contains("stale"));
        let text = table(&s);
        assert!(text.contains("TOTAL"), "{text}");
        assert!(
            text.contains("n2               the node's records are stale"),
            "{text}"
        );
    }

    #[test]
    fn a_job_not_running_is_refused_with_where_to_look() {
        let mut queued = running(5, &[]);
        queued.state = JobState::Queued;
        let e = stat(&JobRef::Id(5), &[queued], &[]).unwrap_err();
        assert!(e.contains("queued") && e.contains("storm queue"), "{e}");
        let e = stat(&JobRef::Id(6), &[], &[]).unwrap_err();
        assert!(e.contains("storm history"), "{e}");
    }
}
