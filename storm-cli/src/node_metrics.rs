//! Prometheus series per node (`storm_node_cpu_utilization{node="n3"}` and the rest), made
//! from the same records `storm nodes --long` shows: each NM's last sample as the MM holds it.
//!
//! The exporter (`storm metrics --listen`) asks the MM for the nodes once per refresh, with
//! the metrics, and serves every scrape from that: at 16,384 nodes a refresh is one request
//! whose records the MM reads from its own memory (no round to the nodes), and a scrape costs
//! the MM nothing. A node whose sample is stale (frozen, down, cut off) gets no figures, only
//! `storm_node_sample_stale 1`, so that Prometheus never stores old figures as new.

use std::fmt::Write;

use storm_cluster::control::NodeInfo;
use storm_cluster::sample::NodeSample;

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
}
