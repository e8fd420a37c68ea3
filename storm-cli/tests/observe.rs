//! What operators and scripts read: `storm metrics` (Prometheus text, checked by promtool;
//! served over HTTP with `--listen`) and `storm queue | nodes | history --json`.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{TestCluster, script, text};

/// The value of one series in metrics text.
fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
}

fn metrics(c: &TestCluster) -> String {
    let out = c.storm(&["metrics"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn metrics_count_what_happened() {
    let c = TestCluster::start(2);
    let before = metrics(&c);
    assert_eq!(value(&before, "storm_nodes{state=\"idle\"}"), 2.0);
    assert_eq!(value(&before, "storm_jobs_submitted_total"), 0.0);
    let work = tempfile::tempdir().unwrap();
    let prog = script(work.path(), "hi.sh", "echo hello from $STORM_RANK\n");
    let size = std::fs::metadata(&prog).unwrap().len() as f64;
    // Copied (--bcast): the transfer's metrics count them.
    let out = c.submit(&["-N", "2", "--bcast", prog.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bad = c.submit(&["-N", "1", "--bcast", "sh", "-c", "exit 3"]);
    assert_eq!(bad.status.code(), Some(3));
    let after = metrics(&c);
    assert_eq!(value(&after, "storm_jobs_submitted_total"), 2.0);
    assert_eq!(value(&after, "storm_programs_in_place_total"), 0.0);
    assert_eq!(
        value(&after, "storm_jobs_ended_total{outcome=\"completed\"}"),
        1.0
    );
    assert_eq!(
        value(&after, "storm_jobs_ended_total{outcome=\"failed\"}"),
        1.0
    );
    assert_eq!(value(&after, "storm_launch_execute_seconds_count"), 2.0);
    assert_eq!(value(&after, "storm_launch_send_seconds_count"), 2.0);
    let sh = std::fs::metadata(std::fs::canonicalize("/bin/sh").unwrap())
        .unwrap()
        .len() as f64;
    assert_eq!(
        value(&after, "storm_program_bytes_total"),
        2.0 * size + sh,
        "each node's copy counted"
    );
    assert_eq!(
        value(&after, "storm_output_bytes_total"),
        "hello from 0\n".len() as f64 * 2.0
    );
    assert!(value(&after, "storm_heartbeat_round_trip_seconds_count") > 0.0);
    assert!(value(&after, "storm_journal_commit_seconds_count") >= 4.0);
    assert_eq!(value(&after, "storm_nodes{state=\"idle\"}"), 2.0);
    assert_eq!(value(&after, "storm_queue_length"), 0.0);
    // By default a program every node has (they share this file system) runs in place:
    // counted as such, and no byte of it is sent.
    let out = c.submit(&["-N", "2", prog.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let last = metrics(&c);
    assert_eq!(value(&last, "storm_programs_in_place_total"), 1.0);
    assert_eq!(
        value(&last, "storm_program_bytes_total"),
        value(&after, "storm_program_bytes_total")
    );
}

#[test]
#[cfg_attr(
    not(promtool),
    ignore = "promtool is not installed (apt-get install prometheus): it checks the metrics format"
)]
fn promtool_accepts_the_metrics() {
    let c = TestCluster::start(2);
    let out = c.submit(&["-N", "2", "true"]);
    assert!(out.status.success());
    let text_out = metrics(&c);
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text_out.as_bytes())
        .unwrap();
    let verdict = check.wait_with_output().unwrap();
    assert!(
        verdict.status.success(),
        "promtool check metrics: {}{}\n{text_out}",
        text(&verdict.stdout),
        text(&verdict.stderr)
    );
}

/// One HTTP GET; returns the status line, headers and body as text.
fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the exporter");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn metrics_are_served_for_scraping_and_a_lost_mm_is_a_503() {
    let mut c = TestCluster::start(1);
    let mut server = Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--socket")
        .arg(&c.socket)
        .args(["metrics", "--listen", "127.0.0.1:0", "--refresh-ms", "100"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start storm metrics --listen");
    let mut first = String::new();
    BufReader::new(server.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("storm metrics: serving http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    let reply = get(&addr, "/metrics");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        reply.contains("Content-Type: text/plain; version=0.0.4"),
        "{reply}"
    );
    assert!(reply.contains("storm_nodes{state=\"idle\"} 1"), "{reply}");
    assert!(get(&addr, "/elsewhere").starts_with("HTTP/1.1 404"));
    c.cluster.as_mut().unwrap().kill_mm().unwrap();
    // Scrapes are served from the snapshot refreshed every 100 ms: the next refresh finds the
    // MM gone.
    let since = std::time::Instant::now();
    let reply = loop {
        let reply = get(&addr, "/metrics");
        if !reply.starts_with("HTTP/1.1 200") || since.elapsed() > Duration::from_secs(10) {
            break reply;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains("unreachable"), "{reply}");
    server.kill().unwrap();
    server.wait().unwrap();
}

fn json(c: &TestCluster, what: &str) -> serde_json::Value {
    let out = c.storm(&[what, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("storm {what} --json: {e}: {}", text(&out.stdout)))
}

#[test]
fn listings_print_json_for_scripts() {
    let c = TestCluster::start(2);
    let nodes = json(&c, "nodes");
    let names: Vec<&str> = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["node0", "node1"]);
    assert_eq!(nodes["nodes"][0]["state"], "idle");
    let mut job = c.spawn(&["-N", "2", "-J", "sleeper", "sleep", "30"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let running = loop {
        let q = json(&c, "queue");
        if q["jobs"][0]["state"] == "running" {
            break q;
        }
        assert!(std::time::Instant::now() < deadline, "never running: {q}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let j = &running["jobs"][0];
    assert_eq!(j["name"], "sleeper");
    assert_eq!(j["nodes"], "0-1");
    assert_eq!(j["node_names"], serde_json::json!(["node0", "node1"]));
    assert_eq!(j["ntasks"], 2);
    assert_eq!(json(&c, "nodes")["nodes"][1]["state"], "allocated");
    let id = j["job"].as_u64().unwrap();
    let out = c.storm(&["cancel", &id.to_string()]);
    assert!(out.status.success());
    job.wait().unwrap();
    let history = json(&c, "history");
    let ended = history["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["job"].as_u64() == Some(id))
        .unwrap_or_else(|| panic!("job {id} not in {history}"));
    // A cancelled job is `cancelled` in the history, as in sacct (it said `failed` until
    // issue 33's accounting, which this test asserted).
    assert_eq!(ended["state"], "cancelled");
    assert_eq!(ended["exit_code"], 128 + 15);
    assert_eq!(ended["user"], storm_cli::views::user_name(0));
    assert!(
        ended["ended"].as_str().is_some_and(|t| t.len() == 19),
        "{ended}"
    );
    assert!(
        ended["reason"].as_str().unwrap().contains("cancelled"),
        "{ended}"
    ); // sacct's filters: by state, by user, by time.
    let only = |args: &[&str]| -> Vec<u64> {
        let mut a = vec!["history", "--json"];
        a.extend_from_slice(args);
        let v: serde_json::Value = serde_json::from_slice(&c.storm(&a).stdout).unwrap();
        v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|j| j["job"].as_u64())
            .collect()
    };
    assert!(only(&["--state", "cancelled"]).contains(&id));
    assert!(!only(&["--state", "completed,failed"]).contains(&id));
    assert!(only(&["--user", "root", "--since", "1h"]).contains(&id));
    assert!(!only(&["--user", "65534"]).contains(&id));
    let bad = c.storm(&["history", "--state", "running"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--state \"running\": expected one of"));
}
