//! Prometheus series per node (`storm_node_cpu_utilization{node="n3"}` and the rest), made
//! from the same records `storm nodes --long` shows: each NM's last sample as the MM holds it.
//!
//! The exporter (`storm metrics --listen`) asks the MM for the nodes once per refresh, with
//! the metrics, and serves every scrape from that: at 16,384 nodes a refresh is one request
//! whose records the MM reads from its own memory (no round to the nodes), and a scrape costs
//! the MM nothing. A node whose sample is stale (frozen, down, cut off) gets no figures, only
//! `storm_node_sample_stale 1`, so that Prometheus never stores old figures as new.
//!
//! From each node's usage record come the fabric ports' counters
//! (`storm_node_fabric_receive_bytes_total` and the rest, for nodes that have ports) and each
//! job's figures there (`storm_job_cpu_seconds_total{job="12",node="n3"}`,
//! `storm_job_cpus_busy`, `storm_job_memory_bytes`, `storm_job_memory_peak_bytes`): a series
//! per job and node it runs on, which `sum by (job)` adds up.

use std::fmt::Write;

use storm_cluster::control::NodeInfo;
use storm_cluster::sample::NodeSample;
use storm_cluster::usage::{FabricCounters, JobFigures, NodeUsage};

/// One family: name, type, help, and the figure of a sample.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&NodeSample) -> f64,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "storm_node_cpu_utilization",
        kind: "gauge",
        help: "CPU utilization of the node over its last sample period (0 to 1).",
        value: |s| f64::from(s.cpu_util),
    },
    Family {
        name: "storm_node_load1",
        kind: "gauge",
        help: "The node's 1-minute load average.",
        value: |s| f64::from(s.load[0]),
    },
    Family {
        name: "storm_node_memory_total_bytes",
        kind: "gauge",
        help: "Memory of the node.",
        value: |s| s.mem_total as f64,
    },
    Family {
        name: "storm_node_memory_available_bytes",
        kind: "gauge",
        help: "Memory available on the node.",
        value: |s| s.mem_avail as f64,
    },
    Family {
        name: "storm_node_swap_used_bytes",
        kind: "gauge",
        help: "Swap in use on the node.",
        value: |s| s.swap_used as f64,
    },
    Family {
        name: "storm_node_spool_free_bytes",
        kind: "gauge",
        help: "Free space where the node's spool lives.",
        value: |s| s.spool_free as f64,
    },
    Family {
        name: "storm_node_state_free_bytes",
        kind: "gauge",
        help: "Free space where the node's state_dir lives.",
        value: |s| s.state_free as f64,
    },
    Family {
        name: "storm_node_network_receive_bytes_total",
        kind: "counter",
        help: "Bytes received by the node's interfaces, loopback left out.",
        value: |s| s.net_rx_bytes as f64,
    },
    Family {
        name: "storm_node_network_transmit_bytes_total",
        kind: "counter",
        help: "Bytes sent by the node's interfaces, loopback left out.",
        value: |s| s.net_tx_bytes as f64,
    },
    Family {
        name: "storm_node_nm_cpu",
        kind: "gauge",
        help: "CPU of the node manager over the last sample period, in CPUs.",
        value: |s| f64::from(s.nm_cpu),
    },
    Family {
        name: "storm_node_jobs",
        kind: "gauge",
        help: "Jobs the node manager holds.",
        value: |s| f64::from(s.jobs),
    },
];

/// A family of the fabric ports' counters.
struct FabricFamily {
    name: &'static str,
    help: &'static str,
    value: fn(&FabricCounters) -> u64,
}

const FABRIC: &[FabricFamily] = &[
    FabricFamily {
        name: "storm_node_fabric_receive_bytes_total",
        help: "Bytes received by the node's fabric ports.",
        value: |f| f.rx_bytes,
    },
    FabricFamily {
        name: "storm_node_fabric_transmit_bytes_total",
        help: "Bytes sent by the node's fabric ports.",
        value: |f| f.tx_bytes,
    },
    FabricFamily {
        name: "storm_node_fabric_receive_packets_total",
        help: "Packets received by the node's fabric ports.",
        value: |f| f.rx_packets,
    },
    FabricFamily {
        name: "storm_node_fabric_transmit_packets_total",
        help: "Packets sent by the node's fabric ports.",
        value: |f| f.tx_packets,
    },
];

/// A family of a job's figures on a node.
struct JobFamily {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&JobFigures) -> f64,
}

const JOB_FAMILIES: &[JobFamily] = &[
    JobFamily {
        name: "storm_job_cpu_seconds_total",
        kind: "counter",
        help: "CPU time the job's processes on the node used (from its cgroup).",
        value: |j| j.cpu_us as f64 / 1e6,
    },
    JobFamily {
        name: "storm_job_cpus_busy",
        kind: "gauge",
        help: "CPUs the job kept busy on the node over the last sample period.",
        value: |j| f64::from(j.cpus_busy),
    },
    JobFamily {
        name: "storm_job_memory_bytes",
        kind: "gauge",
        help: "Memory the job's processes on the node hold (from its cgroup).",
        value: |j| j.mem as f64,
    },
    JobFamily {
        name: "storm_job_memory_peak_bytes",
        kind: "gauge",
        help: "The most memory the job's processes on the node held at once.",
        value: |j| j.mem_peak as f64,
    },
];

/// The series of the nodes' usage records: fabric ports, and jobs per node.
fn usage_series(out: &mut String, nodes: &[NodeInfo]) {
    let fresh: Vec<(&str, &NodeUsage)> = nodes
        .iter()
        .filter_map(|n| Some((n.name.as_str(), n.fresh_usage()?)))
        .collect();
    for f in FABRIC {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} counter", f.name);
        for (name, u) in &fresh {
            if let Some(counters) = &u.fabric {
                let _ = writeln!(
                    out,
                    "{}{{node=\"{}\"}} {}",
                    f.name,
                    escape(name),
                    (f.value)(counters)
                );
            }
        }
    }
    for f in JOB_FAMILIES {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (name, u) in &fresh {
            for j in &u.jobs {
                let _ = writeln!(
                    out,
                    "{}{{job=\"{}\",node=\"{}\"}} {}",
                    f.name,
                    j.job,
                    escape(name),
                    (f.value)(j)
                );
            }
        }
    }
}

/// The per-node series of `nodes`, in the Prometheus text format.
pub fn node_series(nodes: &[NodeInfo]) -> String {
    let mut out = String::with_capacity(64 * nodes.len() * (FAMILIES.len() + 2));
    let fresh: Vec<(&str, &NodeSample)> = nodes
        .iter()
        .filter_map(|n| Some((n.name.as_str(), n.fresh_sample()?)))
        .collect();
    for f in FAMILIES {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (name, s) in &fresh {
            let _ = writeln!(
                out,
                "{}{{node=\"{}\"}} {}",
                f.name,
                escape(name),
                (f.value)(s)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP storm_node_sample_stale Whether the node's last sample is stale (older than \
         three sample periods): its figures are left out."
    );
    let _ = writeln!(out, "# TYPE storm_node_sample_stale gauge");
    for n in nodes {
        let stale = n.records.as_ref().is_none_or(|r| r.stale);
        let _ = writeln!(
            out,
            "storm_node_sample_stale{{node=\"{}\"}} {}",
            escape(&n.name),
            u8::from(stale)
        );
    }
    usage_series(&mut out, nodes);
    out
}

/// A label value as the text format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use storm_cluster::control::NodeState;
    use storm_cluster::sample::NodeRecords;

    fn node(name: &str, stale: bool, cpu: f32) -> NodeInfo {
        NodeInfo {
            id: 0,
            name: name.into(),
            state: NodeState::Idle,
            jobs: vec![],
            reason: None,
            records: Some(NodeRecords {
                sample: Some(NodeSample {
                    seq: 1,
                    cpu_util: cpu,
                    mem_total: 8 << 30,
                    ..Default::default()
                }),
                stale,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn fresh_nodes_have_figures_and_stale_ones_only_say_so() {
        let text = node_series(&[node("n0", false, 0.5), node("n\"1", true, 0.9)]);
        assert!(
            text.contains("storm_node_cpu_utilization{node=\"n0\"} 0.5\n"),
            "{text}"
        );
        assert!(text.contains("storm_node_memory_total_bytes{node=\"n0\"} 8589934592\n"));
        assert!(
            !text.contains("0.9"),
            "a stale node's figures are left out: {text}"
        );
        assert!(
            text.contains("storm_node_sample_stale{node=\"n\\\"1\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("storm_node_sample_stale{node=\"n0\"} 0\n"));
        assert!(text.contains("# TYPE storm_node_network_receive_bytes_total counter\n"));
    }

    #[test]
    fn each_job_has_its_series_on_each_fresh_node_and_ports_their_counters() {
        let with_usage = |name: &str, stale: bool, job: u64, fabric: bool| {
            let mut n = node(name, stale, 0.5);
            n.records.as_mut().unwrap().usage = Some(NodeUsage {
                seq: 1,
                jobs_total: 1,
                jobs: vec![JobFigures {
                    job,
                    cpu_us: 2_500_000,
                    cpus_busy: 1.5,
                    mem: 64 << 20,
                    mem_peak: 96 << 20,
                }],
                fabric: fabric.then_some(FabricCounters {
                    ports: 1,
                    rx_bytes: 4096,
                    ..Default::default()
                }),
                ..Default::default()
            });
            n
        };
        let text = node_series(&[
            with_usage("n0", false, 12, true),
            with_usage("n1", false, 12, false),
            with_usage("n2", true, 99, true),
        ]);
        for node in ["n0", "n1"] {
            assert!(
                text.contains(&format!(
                    "storm_job_cpu_seconds_total{{job=\"12\",node=\"{node}\"}} 2.5\n"
                )),
                "{text}"
            );
            assert!(text.contains(&format!(
                "storm_job_memory_bytes{{job=\"12\",node=\"{node}\"}} 67108864\n"
            )));
        }
        assert!(text.contains("storm_job_cpus_busy{job=\"12\",node=\"n0\"} 1.5\n"));
        assert!(text.contains("storm_node_fabric_receive_bytes_total{node=\"n0\"} 4096\n"));
        assert!(
            !text.contains("fabric_receive_bytes_total{node=\"n1\"}"),
            "a node without ports has no fabric series: {text}"
        );
        assert!(
            !text.contains("job=\"99\"") && !text.contains("node=\"n2\"} 4096"),
            "a stale node's usage is left out: {text}"
        );
    }
}
