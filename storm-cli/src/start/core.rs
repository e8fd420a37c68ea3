//! The front end of `storm start` as a core that only decides: what an allocation's private
//! instance does next, given what happened ([`Input`]), as effects ([`Effect`]) its host
//! (`start::host`) carries out. It owns no process, socket, file or clock.
//!
//! The life of an instance: its node agents report (each node's manager socket bound), the
//! instance is configured and its MM started, its nodes join, the user's command runs, and
//! then everything is torn down: when the command ends (the instance exits with its code),
//! on a signal (Ctrl-C, or the allocator's SIGTERM at the allocation's end: 128 + the
//! signal), or when the agents' step ends first (the allocation ended, a node failed: 1).
//! Waiting for agents and for nodes each has a deadline, named when it passes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::report::AgentReport;

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A line of the agents' standard output.
    AgentLine(String),
    /// The agents' step ended (its launcher exited with this code).
    StepEnded(Option<i32>),
    /// One node's agent ended (`--hosts`: its ssh exited with this code).
    AgentEnded { node: String, code: Option<i32> },
    /// One node's agent closed its link to the front end (`srun --mpi=pmi2 -N K storm
    /// start`: it ended, or its node did).
    LinkLost { node: String },
    /// The instance is configured: its MM runs (or why it does not).
    Configured(Result<(), String>),
    /// Every node joined the MM (or why not).
    NodesUp(Result<(), String>),
    /// The user's command ended, with this code (shell style: 128 + a signal).
    CommandEnded(i32),
    /// A signal to the front end.
    Signal(i32),
    /// The time now.
    Tick(Instant),
}

/// The code ssh exits with when it could not connect or log in.
const SSH_FAILED: i32 = 255;

/// What the host does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Every node's agent reported: write the instance's files, send the agents their
    /// bundle, start the MM, then say [`Input::Configured`].
    Configure(Vec<AgentReport>),
    /// Wait until every node joined the MM, then say [`Input::NodesUp`].
    AwaitNodes,
    /// Run the user's command against the instance.
    RunCommand,
    /// A line for the user (standard error).
    Say(String),
    /// Stop the command (if it runs), the agents' step and the MM, and remove the
    /// instance's files.
    Teardown,
    /// Exit with this code (after [`Effect::Teardown`]).
    Exit(i32),
}

/// Where the instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    Gathering,
    Configuring,
    Joining,
    Running,
    Done,
}

/// How long each wait may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From the start to every agent's report.
    pub agents: Duration,
    /// From the agents' reports to every node joined.
    pub join: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            agents: Duration::from_secs(60),
            join: Duration::from_secs(60),
        }
    }
}

/// The front end's state.
pub struct StartCore {
    /// The allocation's nodes, by index.
    nodes: Vec<String>,
    reports: BTreeMap<u32, AgentReport>,
    stage: Stage,
    deadline: Instant,
    limits: Limits,
    /// The latest time the host told ([`Input::Tick`]).
    now: Instant,
    /// The front end's host name: an agent elsewhere with a loopback address is unreachable.
    host: String,
}

impl StartCore {
    /// An instance over `nodes` (the allocation's, in order), started at `now` on `host`.
    pub fn new(nodes: Vec<String>, limits: Limits, now: Instant, host: String) -> Self {
        Self {
            nodes,
            reports: BTreeMap::new(),
            stage: Stage::Gathering,
            deadline: now + limits.agents,
            limits,
            now,
            host,
        }
    }

    /// Whether the instance is over (its last effect was [`Effect::Exit`]).
    pub fn done(&self) -> bool {
        self.stage == Stage::Done
    }

    pub fn step(&mut self, input: Input) -> Vec<Effect> {
        if self.stage == Stage::Done {
            return Vec::new();
        }
        match input {
            Input::AgentLine(line) => self.agent_line(&line),
            Input::Configured(Ok(())) if self.stage == Stage::Configuring => {
                self.stage = Stage::Joining;
                vec![Effect::AwaitNodes]
            }
            Input::Configured(Err(why)) => self.fail(format!("the instance did not start: {why}")),
            Input::NodesUp(Ok(())) if self.stage == Stage::Joining => {
                self.stage = Stage::Running;
                vec![Effect::RunCommand]
            }
            Input::NodesUp(Err(why)) if self.stage == Stage::Joining => {
                self.fail(format!("the instance's nodes did not join: {why}"))
            }
            Input::CommandEnded(code) if self.stage == Stage::Running => self.end(code),
            Input::StepEnded(code) => {
                let how = code.map_or("by a signal".to_string(), |c| format!("with code {c}"));
                let why = if self.stage == Stage::Running {
                    format!(
                        "the instance's node managers ended ({how}; the allocation ended, or a node failed): stopping"
                    )
                } else {
                    format!("the node agents' step ended {how} before the instance was up")
                };
                self.fail(why)
            }
            Input::AgentEnded { node, code } => {
                let how = code.map_or("by a signal".to_string(), |c| format!("with code {c}"));
                let why = if self.stage == Stage::Running {
                    format!("the node agent on {node} ended ({how}): stopping")
                } else if code == Some(SSH_FAILED) {
                    format!(
                        "the node agent on {node} ended with code {SSH_FAILED} before the \
                         instance was up: ssh could not reach or log in to {node} (try `ssh \
                         {node} true`; storm start needs ssh without a password, and storm at \
                         the same path there)"
                    )
                } else {
                    format!("the node agent on {node} ended {how} before the instance was up")
                };
                self.fail(why)
            }
            Input::LinkLost { node } => self.fail(if self.stage == Stage::Running {
                format!("the node agent on {node} closed its link (it ended, or its node failed): stopping")
            } else {
                format!("the node agent on {node} closed its link before the instance was up")
            }),
            Input::Signal(sig) => {
                let mut effects = vec![Effect::Say(format!(
                    "storm start: signal {sig}: stopping the instance"
                ))];
                effects.extend(self.end(128 + sig));
                effects
            }
            Input::Tick(now) => self.tick(now),
            // Out of order (a late word for a stage already left): nothing to do.
            _ => Vec::new(),
        }
    }

    fn agent_line(&mut self, line: &str) -> Vec<Effect> {
        let Some(report) = AgentReport::parse(line) else {
            // Not a report: the agents' own words (an error) go to the user.
            let text = line.trim_end();
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Effect::Say(text.to_string())]
            };
        };
        if self.stage != Stage::Gathering {
            return Vec::new();
        }
        match self.nodes.get(report.index as usize) {
            Some(name) if *name == report.name => {}
            _ => {
                return self.fail(format!(
                    "an agent reported as node {} ({}), which is not the allocation's node {} ({})",
                    report.index,
                    report.name,
                    report.index,
                    self.nodes
                        .get(report.index as usize)
                        .map_or("none", String::as_str)
                ));
            }
        }
        if report.address.ip().is_loopback() && report.host != self.host {
            return self.fail(format!(
                "node {}'s name resolves to a loopback address ({}) on host {}: no other host can \
                 reach it; make its name resolve to the address the nodes share (or use --bind \
                 ADDR where all nodes share one)",
                report.name,
                report.address.ip(),
                report.host
            ));
        }
        if self.reports.insert(report.index, report).is_some() {
            return self.fail("two agents reported for one node".into());
        }
        if self.reports.len() < self.nodes.len() {
            return Vec::new();
        }
        self.stage = Stage::Configuring;
        self.deadline = self.now + self.limits.join;
        let reports = std::mem::take(&mut self.reports).into_values().collect();
        vec![Effect::Configure(reports)]
    }

    fn tick(&mut self, now: Instant) -> Vec<Effect> {
        self.now = self.now.max(now);
        if now < self.deadline {
            return Vec::new();
        }
        match self.stage {
            Stage::Gathering => {
                let missing: Vec<&str> = self
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !self.reports.contains_key(&(*i as u32)))
                    .map(|(_, n)| n.as_str())
                    .collect();
                let limit = self.limits.agents.as_secs();
                self.fail(format!(
                    "no node agent reported within {limit} s from {}",
                    missing.join(",")
                ))
            }
            Stage::Configuring | Stage::Joining => {
                let limit = self.limits.join.as_secs();
                self.fail(format!(
                    "the instance's nodes did not join within {limit} s"
                ))
            }
            _ => Vec::new(),
        }
    }

    fn fail(&mut self, why: String) -> Vec<Effect> {
        let mut effects = vec![Effect::Say(format!("storm start: {why}"))];
        effects.extend(self.end(1));
        effects
    }

    fn end(&mut self, code: i32) -> Vec<Effect> {
        self.stage = Stage::Done;
        vec![Effect::Teardown, Effect::Exit(code)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(index: u32, name: &str) -> String {
        AgentReport {
            index,
            name: name.into(),
            address: "127.0.0.1:1".parse().unwrap(),
            cpus: 2,
            dir: "/tmp/a".into(),
            step: "1.0".into(),
            host: "front".into(),
        }
        .to_line()
    }

    fn core(now: Instant) -> StartCore {
        StartCore::new(
            vec!["n1".into(), "n2".into()],
            Limits::default(),
            now,
            "front".into(),
        )
    }

    /// An agent on another host that can only be reached on loopback ends the start,
    /// naming the node and the fix (Debian names itself 127.0.1.1 by default).
    #[test]
    fn an_agent_elsewhere_on_loopback_is_named() {
        let mut c = core(Instant::now());
        let elsewhere = AgentReport {
            index: 1,
            name: "n2".into(),
            address: "127.0.1.1:7".parse().unwrap(),
            cpus: 2,
            dir: "/tmp/b".into(),
            step: "1.0".into(),
            host: "other".into(),
        };
        let e = c.step(Input::AgentLine(elsewhere.to_line()));
        assert!(matches!(&e[0], Effect::Say(s) if s.contains("n2") && s.contains("loopback")));
        assert_eq!(e.last(), Some(&Effect::Exit(1)));
    }

    /// Reports in any order, then configure, join, run; the command's code is the
    /// instance's, after teardown.
    #[test]
    fn an_instance_runs_the_command_once_every_node_is_up_and_exits_with_its_code() {
        let now = Instant::now();
        let mut c = core(now);
        assert!(c.step(Input::AgentLine(report(1, "n2"))).is_empty());
        let e = c.step(Input::AgentLine(report(0, "n1")));
        assert!(matches!(&e[..], [Effect::Configure(r)] if r.len() == 2 && r[0].index == 0));
        assert_eq!(c.step(Input::Configured(Ok(()))), vec![Effect::AwaitNodes]);
        assert_eq!(c.step(Input::NodesUp(Ok(()))), vec![Effect::RunCommand]);
        assert_eq!(
            c.step(Input::CommandEnded(3)),
            vec![Effect::Teardown, Effect::Exit(3)]
        );
        assert!(c.done());
        assert!(c.step(Input::Signal(2)).is_empty(), "over is over");
    }

    /// A missing agent is named when its deadline passes; a report from a node not of the
    /// allocation, or twice for one node, ends the start; srun's own lines are passed on.
    #[test]
    fn missing_wrong_and_doubled_agents_end_the_start_naming_them() {
        let now = Instant::now();
        let mut c = core(now);
        c.step(Input::AgentLine(report(0, "n1")));
        assert!(
            c.step(Input::Tick(now + Duration::from_secs(59)))
                .is_empty()
        );
        let e = c.step(Input::Tick(now + Duration::from_secs(61)));
        assert!(matches!(&e[0], Effect::Say(s) if s.contains("n2") && !s.contains("n1,")));
        assert_eq!(&e[1..], [Effect::Teardown, Effect::Exit(1)]);

        let mut c = core(now);
        let e = c.step(Input::AgentLine(report(1, "n9")));
        assert!(matches!(&e[0], Effect::Say(s) if s.contains("n9")));
        let mut c = core(now);
        c.step(Input::AgentLine(report(0, "n1")));
        let e = c.step(Input::AgentLine(report(0, "n1")));
        assert!(e.contains(&Effect::Exit(1)));

        let mut c = core(now);
        let e = c.step(Input::AgentLine("srun: error: n2: task 1: Exited".into()));
        assert_eq!(
            e,
            vec![Effect::Say("srun: error: n2: task 1: Exited".into())]
        );
    }

    /// The agents' step ending (the allocation ended) stops a running instance with 1; a
    /// signal with 128 + the signal; nodes that never join are named at their deadline.
    #[test]
    fn the_allocations_end_a_signal_and_a_join_timeout_stop_the_instance() {
        let now = Instant::now();
        let up = |c: &mut StartCore| {
            c.step(Input::AgentLine(report(0, "n1")));
            c.step(Input::AgentLine(report(1, "n2")));
            c.step(Input::Configured(Ok(())));
        };
        let mut c = core(now);
        up(&mut c);
        c.step(Input::NodesUp(Ok(())));
        let e = c.step(Input::StepEnded(Some(0)));
        assert!(matches!(&e[0], Effect::Say(s) if s.contains("allocation ended")));
        assert_eq!(e.last(), Some(&Effect::Exit(1)));

        let mut c = core(now);
        up(&mut c);
        c.step(Input::NodesUp(Ok(())));
        assert_eq!(c.step(Input::Signal(15)).last(), Some(&Effect::Exit(143)));

        let mut c = core(now);
        up(&mut c);
        let e = c.step(Input::Tick(now + Duration::from_secs(61)));
        assert!(matches!(&e[0], Effect::Say(s) if s.contains("did not join")));
    }

    /// Under `--hosts`, an ssh that fails before the instance is up names its host and
    /// what ssh needs; one node's agent ending later stops the instance naming it.
    #[test]
    fn one_hosts_agent_ending_names_the_host() {
        let now = Instant::now();
        let mut c = core(now);
        c.step(Input::AgentLine(report(0, "n1")));
        let e = c.step(Input::AgentEnded {
            node: "n2".into(),
            code: Some(255),
        });
        assert!(
            matches!(&e[0], Effect::Say(s) if s.contains("n2") && s.contains("ssh n2 true")),
            "{e:?}"
        );
        assert_eq!(e.last(), Some(&Effect::Exit(1)));

        let mut c = core(now);
        c.step(Input::AgentLine(report(0, "n1")));
        c.step(Input::AgentLine(report(1, "n2")));
        c.step(Input::Configured(Ok(())));
        c.step(Input::NodesUp(Ok(())));
        let e = c.step(Input::AgentEnded {
            node: "n1".into(),
            code: None,
        });
        assert!(matches!(&e[0], Effect::Say(s) if s.contains("on n1 ended (by a signal)")));
        assert_eq!(e.last(), Some(&Effect::Exit(1)));
    }

    /// A linked agent (`srun --mpi=pmi2 -N K storm start`) that closes its link stops a
    /// running instance with 1, naming its node.
    #[test]
    fn a_lost_link_stops_the_instance_naming_the_node() {
        let now = Instant::now();
        let mut c = core(now);
        c.step(Input::AgentLine(report(0, "n1")));
        c.step(Input::AgentLine(report(1, "n2")));
        c.step(Input::Configured(Ok(())));
        c.step(Input::NodesUp(Ok(())));
        let e = c.step(Input::LinkLost { node: "n2".into() });
        assert!(
            matches!(&e[0], Effect::Say(s) if s.contains("on n2 closed its link")),
            "{e:?}"
        );
        assert!(e.contains(&Effect::Teardown));
        assert_eq!(e.last(), Some(&Effect::Exit(1)));
    }
}
