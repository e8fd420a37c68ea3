//! `storm-prim-node`: one tcp-backend node as its own process, for tests and benchmarks that
//! need nodes in separate processes (and something to `kill -9`).
//!
//! Start-up on standard input/output:
//! 1. prints `LISTEN <addr>` once its listener is bound;
//! 2. reads one line `PEERS <addr0> <addr1> ...` (one address per node, `-` if unknown);
//! 3. starts the node with the conformance layout and prints `READY`.
//!
//! It then takes commands from node 0 through the layout's remote queue (epoch 1), each a line
//! of text, and answers by writing global variables that node 0 checks with
//! COMPARE-AND-WRITE: the command's result in `a`, then its sequence number in `b`.
//! A background thread consumes every signal of the `data` event and counts it in `signals`,
//! so node 0 can check how many transfers each process saw.
//!
//! * `checksum <offset> <len>`: FNV-1a of that part of global memory.
//! * `cas <count> <nodes>`: `count` increments of `counter` on `nodes` by compare-and-swap.
//! * `exit`.

use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use std::sync::Arc;
use storm_primitives::conformance::test_layout;
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::tcp::{TcpConfig, TcpNode};
use storm_primitives::{NodeSet, PrimError, Primitives, Relation, Wait, fnv1a64};

#[derive(Parser)]
#[command(about = "Run one storm tcp node as a process (test and benchmark agent)")]
struct Args {
    /// This node's id.
    #[arg(long)]
    id: u32,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Tree fanout.
    #[arg(long, default_value_t = 2)]
    fanout: usize,
    /// Bytes per data frame.
    #[arg(long, default_value_t = 256 * 1024)]
    chunk_size: usize,
    /// Operation timeout in milliseconds.
    #[arg(long, default_value_t = 3000)]
    timeout_ms: u64,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        // Plain text in a file or a pipe: colour codes only on a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let key = std::env::var("STORM_CLUSTER_KEY")
        .context("STORM_CLUSTER_KEY must hold the cluster key (64 hex digits)")?;
    let key = storm_primitives::tcp::auth::ClusterKey::from_hex(&key)
        .map_err(|e| anyhow::anyhow!("STORM_CLUSTER_KEY: {e}"))?;
    let listener =
        TcpListener::bind(args.bind).with_context(|| format!("binding {}", args.bind))?;
    let mut out = std::io::stdout();
    writeln!(out, "LISTEN {}", listener.local_addr()?)?;
    out.flush()?;

    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let Some(rest) = line.trim().strip_prefix("PEERS ") else {
        bail!("expected a PEERS line on standard input, got {line:?}");
    };
    let directory: Vec<Option<SocketAddr>> = rest
        .split_whitespace()
        .map(|a| {
            if a == "-" {
                Ok(None)
            } else {
                a.parse().map(Some)
            }
        })
        .collect::<Result<_, _>>()
        .context("bad address in the PEERS line")?;

    let t = test_layout();
    let config = TcpConfig {
        fanout: args.fanout,
        chunk_size: args.chunk_size,
        op_timeout: Duration::from_millis(args.timeout_ms),
        key,
        ..TcpConfig::default()
    };
    let node = Arc::new(TcpNode::start(
        args.id,
        listener,
        directory,
        t.layout.clone(),
        config,
    )?);
    let mut commands = QueueConsumer::new(&*node, t.queue, 1)?;
    let counter = node.clone();
    std::thread::spawn(move || {
        loop {
            match counter.test_event(t.data, Wait::Block) {
                Ok(true) => {
                    counter.memory().fetch_add(t.signals, 1);
                }
                Ok(false) => {}
                Err(PrimError::ShutDown) => return,
                Err(e) => tracing::warn!("data event failed: {e}"),
            }
        }
    });
    writeln!(out, "READY")?;
    out.flush()?;

    let mut seq = 0u64;
    loop {
        let Some(cmd) = commands.dequeue(&*node, Wait::Block)? else {
            continue;
        };
        seq += 1;
        let text = String::from_utf8_lossy(&cmd).to_string();
        let words: Vec<&str> = text.split_whitespace().collect();
        let result = match words.as_slice() {
            ["checksum", offset, len] => {
                let bytes = node.memory().read_vec(offset.parse()?, len.parse()?)?;
                fnv1a64(&bytes)
            }
            ["cas", count, nodes] => {
                let nodes: NodeSet = nodes.parse()?;
                let count: u64 = count.parse()?;
                let mut done = 0;
                while done < count {
                    let seen = node.memory().load(t.counter);
                    if node.compare_and_write(
                        &nodes,
                        t.counter,
                        Relation::Eq,
                        seen,
                        Some((t.counter, seen + 1)),
                    )? {
                        done += 1;
                    }
                }
                done
            }
            ["exit"] => return Ok(()),
            _ => bail!("unknown command {text:?}"),
        };
        node.memory().store(t.a, result);
        node.memory().store(t.b, seq);
    }
}
