//! A cluster of `storm-prim-node` processes driven from an in-process node 0.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use storm_primitives::conformance::{PATIENCE, TestLayout, test_layout};
use storm_primitives::helpers::QueueProducer;
use storm_primitives::tcp::{TcpConfig, TcpNode};
use storm_primitives::{NodeId, NodeSet, Primitives, Relation, Wait};

pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    _stdin: ChildStdin,
}

/// Node 0 runs here; nodes 1.. are `storm-prim-node` processes.
pub struct ProcessCluster {
    pub node0: TcpNode,
    pub agents: Vec<Agent>,
    pub t: TestLayout,
    producer: QueueProducer,
    commands: u64,
}

fn read_line(out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    out.read_line(&mut line).expect("agent output");
    line.trim().to_string()
}

impl ProcessCluster {
    /// `n` nodes in all: this process plus `n - 1` agents.
    pub fn start(n: u32, config: &TcpConfig) -> Self {
        let t = test_layout();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut spawned = Vec::new();
        for id in 1..n {
            let mut child = Command::new(env!("CARGO_BIN_EXE_storm-prim-node"))
                .args(["--id", &id.to_string()])
                // The key goes by environment, never on the command line.
                .env("STORM_CLUSTER_KEY", config.key.to_hex())
                .args(["--fanout", &config.fanout.to_string()])
                .args(["--chunk-size", &config.chunk_size.to_string()])
                .args(["--timeout-ms", &config.op_timeout.as_millis().to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn storm-prim-node");
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let line = read_line(&mut out);
            let addr: SocketAddr = line
                .strip_prefix("LISTEN ")
                .unwrap_or_else(|| panic!("agent {id} said {line:?}"))
                .parse()
                .unwrap();
            spawned.push((child, addr, out));
        }
        let mut directory = vec![Some(listener.local_addr().unwrap())];
        directory.extend(spawned.iter().map(|(_, a, _)| Some(*a)));
        let peers = directory
            .iter()
            .map(|a| a.unwrap().to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let mut agents = Vec::new();
        for (id, (mut child, addr, mut out)) in spawned.into_iter().enumerate() {
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin, "PEERS {peers}").unwrap();
            stdin.flush().unwrap();
            assert_eq!(read_line(&mut out), "READY", "agent {}", id + 1);
            agents.push(Agent {
                child,
                addr,
                _stdin: stdin,
            });
        }
        let node0 =
            TcpNode::start(0, listener, directory, t.layout.clone(), config.clone()).unwrap();
        let producer =
            QueueProducer::new(t.queue, NodeSet::range(1, n - 1), 1).with_space_timeout(PATIENCE);
        ProcessCluster {
            node0,
            agents,
            t,
            producer,
            commands: 0,
        }
    }

    pub fn all(&self) -> NodeSet {
        NodeSet::first_n(self.agents.len() as u32 + 1)
    }

    pub fn agent_ids(&self) -> NodeSet {
        NodeSet::range(1, self.agents.len() as u32)
    }

    /// `kill -9` node `id`.
    pub fn kill(&mut self, id: NodeId) {
        let agent = &mut self.agents[id as usize - 1];
        agent.child.kill().unwrap();
        agent.child.wait().unwrap();
    }

    /// Sends `signal` to node `id`'s process (SIGSTOP freezes it, SIGCONT thaws it).
    pub fn signal(&self, id: NodeId, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.agents[id as usize - 1].child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Polls with COMPARE-AND-WRITE until `var = value` on every node of `on`.
    pub fn await_value(&self, on: &NodeSet, var: storm_primitives::VarId, value: u64) -> bool {
        let start = Instant::now();
        while start.elapsed() < PATIENCE {
            if self
                .node0
                .compare_and_write(on, var, Relation::Eq, value, None)
                .unwrap()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Sends a command to every agent and waits until all have answered; returns whether
    /// every agent's result equals `expect`.
    pub fn command(&mut self, text: &str, expect: u64) -> bool {
        self.producer
            .enqueue(&self.node0, text.as_bytes(), None)
            .unwrap();
        self.commands += 1;
        let agents = self.agent_ids();
        assert!(
            self.await_value(&agents, self.t.b, self.commands),
            "agents never finished {text:?}"
        );
        self.node0
            .compare_and_write(&agents, self.t.a, Relation::Eq, expect, None)
            .unwrap()
    }

    /// Transfers `data` to `dest` from node 0 and returns the local event's outcome.
    pub fn xfer(&self, dest: &NodeSet, offset: u64, data: Bytes) -> storm_primitives::Result<bool> {
        self.node0
            .xfer_and_signal(dest, offset, data, Some(self.t.data), Some(self.t.done))
            .unwrap();
        self.node0.test_event(self.t.done, Wait::Timeout(PATIENCE))
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for a in &mut self.agents {
            let _ = a.child.kill();
            let _ = a.child.wait();
        }
    }
}
