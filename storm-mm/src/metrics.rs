//! The machine manager's metrics, in the Prometheus (OpenMetrics) text format.
//!
//! `storm metrics` prints them and `storm metrics --listen ADDR` serves them for a Prometheus
//! server to scrape; both ask the MM over its control socket. Everything is named `storm_*`:
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `storm_nodes{state}` | gauge | nodes by state (`idle`, `allocated`, `down`, ...) |
//! | `storm_jobs{state}` | gauge | jobs by state (`queued`, `running`, `suspended`, ...) |
//! | `storm_queue_length` | gauge | jobs waiting for nodes |
//! | `storm_heartbeat_round_trip_seconds` | histogram | heartbeat issued to delivered everywhere |
//! | `storm_heartbeats_missed_total` | counter | heartbeats a member missed |
//! | `storm_launch_send_seconds` | histogram | nodes allocated to program ready everywhere |
//! | `storm_launch_execute_seconds` | histogram | launch heartbeat to termination detected |
//! | `storm_transfer_delivered_seconds` | histogram | a program transfer's worker started to every chunk delivered to every node |
//! | `storm_transfer_answered_seconds` | histogram | every chunk delivered to every node's answer (written, checked, closed) seen |
//! | `storm_program_bytes_total` | counter | program bytes delivered (each node counted) |
//! | `storm_programs_in_place_total` | counter | jobs whose program every node had, identical: run in place, not copied |
//! | `storm_output_bytes_total` | counter | task output forwarded to submitters |
//! | `storm_journal_commit_seconds` | histogram | one journal commit (under a manager group: proposal to applied, a majority holding it) |
//! | `storm_gang_switches_total` | counter | time-slot changes of the gang scheduler |
//! | `storm_jobs_submitted_total` | counter | jobs accepted |
//! | `storm_jobs_ended_total{outcome}` | counter | jobs ended: `completed`, `failed` |
//!
//! The gauges are set from the MM's state when the metrics are asked for; the rest are
//! updated as things happen.
//!
//! prometheus-client writes OpenMetrics; the MM answers in the classic Prometheus text format
//! (version 0.0.4, what `promtool check metrics` and every Prometheus server read), to which
//! [`classic_text`] converts it.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use storm_cluster::control::{JobState, NodeState};

/// Every state `storm nodes` can show, so that each series exists even at zero.
pub const NODE_STATES: [NodeState; 9] = [
    NodeState::Unknown,
    NodeState::Joining,
    NodeState::Idle,
    NodeState::Allocated,
    NodeState::Draining,
    NodeState::Drained,
    NodeState::Unresponsive,
    NodeState::Down,
    NodeState::Lent,
];

/// Every state `storm queue` can show (a job that ended has left the queue).
pub const JOB_STATES: [JobState; 9] = [
    JobState::Queued,
    JobState::Starting,
    JobState::Sending,
    JobState::Launching,
    JobState::Recovering,
    JobState::Running,
    JobState::Suspended,
    JobState::Ending,
    JobState::Cancelling,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

/// The MM's metrics and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    nodes: Family<State, Gauge>,
    jobs: Family<State, Gauge>,
    queue_length: Gauge,
    heartbeat_round_trip: Histogram,
    heartbeats_missed: Counter,
    launch_send: Histogram,
    launch_execute: Histogram,
    transfer_delivered: Histogram,
    transfer_answered: Histogram,
    program_bytes: Counter,
    output_bytes: Counter,
    journal_commit: Histogram,
    tick: Histogram,
    gang_switches: Counter,
    programs_in_place: Counter,
    jobs_submitted: Counter,
    jobs_ended: Family<Outcome, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("storm");
        let nodes = Family::<State, Gauge>::default();
        registry.register("nodes", "Nodes by state", nodes.clone());
        let jobs = Family::<State, Gauge>::default();
        registry.register("jobs", "Jobs by state", jobs.clone());
        let queue_length = Gauge::default();
        registry.register(
            "queue_length",
            "Jobs waiting for nodes",
            queue_length.clone(),
        );
        // 25 us to ~3.4 s: a heartbeat on loopback to one stalled on a timeout.
        let heartbeat_round_trip = Histogram::new(exponential_buckets(25e-6, 2.0, 18));
        registry.register_with_unit(
            "heartbeat_round_trip",
            "Heartbeat issued to delivered to every member",
            Unit::Seconds,
            heartbeat_round_trip.clone(),
        );
        // A timeslice's work, 100 us to seconds: a tick longer than the heartbeat's deadline
        // delays every node's heartbeat.
        let tick = Histogram::new([
            1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
        ]);
        registry.register_with_unit(
            "main_loop_tick",
            "Time the MM's main loop spent on one timeslice's work",
            Unit::Seconds,
            tick.clone(),
        );
        let heartbeats_missed = Counter::default();
        registry.register(
            "heartbeats_missed",
            "Heartbeats a member missed",
            heartbeats_missed.clone(),
        );
        // 100 us to ~26 s.
        let launch_send = Histogram::new(exponential_buckets(1e-4, 2.0, 19));
        registry.register_with_unit(
            "launch_send",
            "Job launch: nodes allocated to program verified on every node",
            Unit::Seconds,
            launch_send.clone(),
        );
        // 1 ms to ~2.3 days.
        let launch_execute = Histogram::new(exponential_buckets(1e-3, 4.0, 14));
        registry.register_with_unit(
            "launch_execute",
            "Job launch: launch heartbeat to termination detected",
            Unit::Seconds,
            launch_execute.clone(),
        );
        // 100 us to ~26 s, as the send time they are parts of.
        let transfer_delivered = Histogram::new(exponential_buckets(1e-4, 2.0, 19));
        registry.register_with_unit(
            "transfer_delivered",
            "Program transfer: worker started to every chunk delivered to every node",
            Unit::Seconds,
            transfer_delivered.clone(),
        );
        // 10 us to ~2.6 s.
        let transfer_answered = Histogram::new(exponential_buckets(1e-5, 2.0, 19));
        registry.register_with_unit(
            "transfer_answered",
            "Program transfer: every chunk delivered to every node's answer seen",
            Unit::Seconds,
            transfer_answered.clone(),
        );
        let program_bytes = Counter::default();
        registry.register_with_unit(
            "program",
            "Program bytes delivered to nodes (each node counted)",
            Unit::Bytes,
            program_bytes.clone(),
        );
        let output_bytes = Counter::default();
        registry.register_with_unit(
            "output",
            "Task output forwarded to submitters",
            Unit::Bytes,
            output_bytes.clone(),
        );
        // 50 us to ~3.3 s.
        let journal_commit = Histogram::new(exponential_buckets(5e-5, 2.0, 17));
        registry.register_with_unit(
            "journal_commit",
            "One commit of the MM's journal",
            Unit::Seconds,
            journal_commit.clone(),
        );
        let gang_switches = Counter::default();
        registry.register(
            "gang_switches",
            "Changes of the jobs that run in a timeslice (gang scheduling)",
            gang_switches.clone(),
        );
        let programs_in_place = Counter::default();
        registry.register(
            "programs_in_place",
            "Jobs whose program every node had at its path, identical: run in place, not copied",
            programs_in_place.clone(),
        );
        let jobs_submitted = Counter::default();
        registry.register("jobs_submitted", "Jobs accepted", jobs_submitted.clone());
        let jobs_ended = Family::<Outcome, Counter>::default();
        registry.register("jobs_ended", "Jobs ended, by outcome", jobs_ended.clone());
        for outcome in ["completed", "failed"] {
            jobs_ended.get_or_create(&Outcome { outcome }).inc_by(0);
        }
        Self {
            registry,
            nodes,
            jobs,
            queue_length,
            heartbeat_round_trip,
            heartbeats_missed,
            launch_send,
            launch_execute,
            transfer_delivered,
            transfer_answered,
            program_bytes,
            output_bytes,
            journal_commit,
            tick,
            gang_switches,
            programs_in_place,
            jobs_submitted,
            jobs_ended,
        }
    }

    pub fn heartbeat_delivered(&self, round_trip: Duration) {
        self.heartbeat_round_trip.observe(round_trip.as_secs_f64());
    }

    pub fn heartbeat_missed(&self) {
        self.heartbeats_missed.inc();
    }

    /// A job that ran: its send time (if its program was sent) and execute time.
    pub fn launched(&self, send: Option<Duration>, execute: Duration) {
        if let Some(s) = send {
            self.launch_send.observe(s.as_secs_f64());
        }
        self.launch_execute.observe(execute.as_secs_f64());
    }

    /// A program transfer that succeeded: how long its chunks took to reach every node, and
    /// then the nodes' answers.
    pub fn transfer_took(&self, took: crate::env::TransferTook) {
        self.transfer_delivered
            .observe(took.delivered.as_secs_f64());
        self.transfer_answered.observe(took.answered.as_secs_f64());
    }

    pub fn program_delivered(&self, bytes: u64, nodes: u64) {
        self.program_bytes.inc_by(bytes.saturating_mul(nodes));
    }

    pub fn program_in_place(&self) {
        self.programs_in_place.inc();
    }

    pub fn output_forwarded(&self, bytes: usize) {
        self.output_bytes.inc_by(bytes as u64);
    }

    pub fn journal_committed(&self, took: Duration) {
        self.journal_commit.observe(took.as_secs_f64());
    }

    pub fn ticked(&self, took: Duration) {
        self.tick.observe(took.as_secs_f64());
    }

    pub fn gang_switched(&self) {
        self.gang_switches.inc();
    }

    pub fn job_submitted(&self) {
        self.jobs_submitted.inc();
    }

    pub fn job_ended(&self, completed: bool) {
        let outcome = if completed { "completed" } else { "failed" };
        self.jobs_ended.get_or_create(&Outcome { outcome }).inc();
    }

    /// The text a scrape gets, with the gauges set from the states given.
    pub fn encode(
        &self,
        node_states: impl IntoIterator<Item = NodeState>,
        job_states: impl IntoIterator<Item = JobState>,
        queue_length: usize,
    ) -> String {
        set_counts(&self.nodes, &NODE_STATES, node_states, NodeState::as_str);
        set_counts(&self.jobs, &JOB_STATES, job_states, JobState::as_str);
        self.queue_length.set(queue_length as i64);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        classic_text(&out)
    }
}

/// OpenMetrics text as the classic Prometheus text format (0.0.4): a counter's `HELP` and
/// `TYPE` name its samples' `_total` name, and the `UNIT` and `EOF` lines go.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Sets one gauge per known state to how many of `states` are in it.
fn set_counts<T: Copy + PartialEq>(
    family: &Family<State, Gauge>,
    known: &[T],
    states: impl IntoIterator<Item = T>,
    name: fn(T) -> &'static str,
) {
    let mut counts = vec![0i64; known.len()];
    for s in states {
        if let Some(i) = known.iter().position(|k| *k == s) {
            counts[i] += 1;
        }
    }
    for (&state, n) in known.iter().zip(counts) {
        family.get_or_create(&State { state: name(state) }).set(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn counters_are_named_by_their_samples_in_the_classic_format() {
        let om = "# HELP storm_x Things.\n# TYPE storm_x counter\nstorm_x_total 3\n\
                  # HELP storm_t Time.\n# TYPE storm_t_seconds histogram\n# UNIT storm_t_seconds seconds\n\
                  storm_t_seconds_count 1\n# EOF\n";
        assert_eq!(
            classic_text(om),
            "# HELP storm_x_total Things.\n# TYPE storm_x_total counter\nstorm_x_total 3\n\
             # HELP storm_t Time.\n# TYPE storm_t_seconds histogram\nstorm_t_seconds_count 1\n"
        );
        let text = Metrics::new().encode([], [], 0);
        assert!(
            text.contains("# TYPE storm_heartbeats_missed_total counter"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }

    #[test]
    fn gauges_count_states_and_every_state_has_a_series() {
        let m = Metrics::new();
        let text = m.encode(
            [
                NodeState::Idle,
                NodeState::Idle,
                NodeState::Down,
                NodeState::Allocated,
            ],
            [JobState::Running, JobState::Recovering],
            3,
        );
        assert_eq!(value(&text, "storm_nodes{state=\"idle\"}"), 2.0);
        assert_eq!(value(&text, "storm_nodes{state=\"down\"}"), 1.0);
        assert_eq!(value(&text, "storm_nodes{state=\"drained\"}"), 0.0);
        assert_eq!(value(&text, "storm_jobs{state=\"running\"}"), 1.0);
        // A job the restarted MM is taking up counts too (it had no series before states
        // were typed).
        assert_eq!(value(&text, "storm_jobs{state=\"recovering\"}"), 1.0);
        assert_eq!(value(&text, "storm_jobs{state=\"queued\"}"), 0.0);
        assert_eq!(value(&text, "storm_queue_length"), 3.0);
        // A later scrape reflects the state then, not a sum.
        let text = m.encode([NodeState::Idle], [], 0);
        assert_eq!(value(&text, "storm_nodes{state=\"idle\"}"), 1.0);
        assert_eq!(value(&text, "storm_nodes{state=\"down\"}"), 0.0);
    }

    #[test]
    fn events_are_counted_and_observed() {
        let m = Metrics::new();
        m.heartbeat_delivered(Duration::from_micros(100));
        m.heartbeat_delivered(Duration::from_micros(300));
        m.heartbeat_missed();
        m.launched(Some(Duration::from_millis(5)), Duration::from_millis(20));
        m.launched(None, Duration::from_millis(40));
        m.program_delivered(1000, 4);
        m.output_forwarded(12);
        m.journal_committed(Duration::from_micros(400));
        m.ticked(Duration::from_micros(300));
        m.ticked(Duration::from_millis(1500));
        m.gang_switched();
        m.job_submitted();
        m.job_ended(true);
        m.job_ended(false);
        m.job_ended(false);
        let text = m.encode([], [], 0);
        assert_eq!(
            value(&text, "storm_heartbeat_round_trip_seconds_count"),
            2.0
        );
        assert!((value(&text, "storm_heartbeat_round_trip_seconds_sum") - 4e-4).abs() < 1e-9);
        assert_eq!(value(&text, "storm_heartbeats_missed_total"), 1.0);
        assert_eq!(value(&text, "storm_launch_send_seconds_count"), 1.0);
        assert_eq!(value(&text, "storm_launch_execute_seconds_count"), 2.0);
        assert_eq!(value(&text, "storm_program_bytes_total"), 4000.0);
        assert_eq!(value(&text, "storm_output_bytes_total"), 12.0);
        assert_eq!(value(&text, "storm_journal_commit_seconds_count"), 1.0);
        assert_eq!(value(&text, "storm_main_loop_tick_seconds_count"), 2.0);
        assert_eq!(
            value(&text, "storm_main_loop_tick_seconds_bucket{le=\"1.0\"}"),
            1.0,
            "one tick took longer than a second"
        );
        assert_eq!(value(&text, "storm_gang_switches_total"), 1.0);
        assert_eq!(value(&text, "storm_jobs_submitted_total"), 1.0);
        assert_eq!(
            value(&text, "storm_jobs_ended_total{outcome=\"completed\"}"),
            1.0
        );
        assert_eq!(
            value(&text, "storm_jobs_ended_total{outcome=\"failed\"}"),
            2.0
        );
    }
}
