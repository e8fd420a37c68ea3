//! Lending's figures for `storm-bench federation` (docs/federation.md, lending): the time to
//! lend a node and to return it, in heartbeat periods, and launch on borrowed nodes beside
//! launch on home nodes, measured in the same run.
//!
//! Two embedded clusters on loopback: `lb-borrow` has `nodes` nodes of its own and a guest
//! slot (feature `guest`) for each of the `nodes` nodes of `lb-lend`, which lends them and
//! runs the borrowed jobs as `nobody`. Each round:
//!
//! 1. **lend**: after the nodes have been home 200 ms, `storm lend` of every node of
//!    `lb-lend` at once, timed from the request to the moment `lb-borrow`'s MM shows every
//!    guest slot idle (each lent node's NM has handed the lease to its warm guest NM, which
//!    registered and joined the borrower's heartbeat);
//! 2. **launch**: a `true` of `nodes` nodes, as `nobody`, on home nodes (`-N`) and on the
//!    borrowed ones (`--borrow -C guest -N`), alternately; each is storm-submit's wall time;
//! 3. **return**: `storm reclaim --now`, timed from the request to the moment the lender's MM
//!    shows every node idle and the borrower's shows no guest slot up: the node's own trip
//!    home. (A reclaim with notice adds the agents' round trip to the borrower, which gives
//!    the node back: agent periods, not heartbeat periods; no agent runs in this part.)
//! 4. **lend again**: at once, the same lend, of nodes home for a few milliseconds: the
//!    lend the node's next warm guest must be ready for, though it had no time at home (it is
//!    started while the node is lent, and makes its groups as it comes home); then another
//!    return.
//!
//! Then borrowing on asking, with both clusters' peer agents running (`advertise_ms` 100):
//! each round a `--borrow -C guest` job of `nodes` nodes is submitted with no node lent, and
//! its storm-submit's wall time taken (the agents' asking, the lend and the launch); then the
//! time from its end until the borrower has given the nodes back (the lender shows them idle,
//! the borrower no guest slot up). Last, each round, a `--borrow -C guest` job that sleeps is
//! running on the lent nodes when the lender's operator calls them home with notice (`storm
//! reclaim` without `--now`): from the request until they are home (the lender's agent tells
//! the borrower's, whose MM ends the job there and gives them back). All three are reported
//! in agent periods.
//!
//! The MMs are asked with the control protocol directly, every millisecond: the poll adds at
//! most that to each time.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cluster::control::{Client, NodeInfo, NodeState, Reply, Request};
use storm_cluster::federation::{FederationSection, GuestOf, PeerEntry};
use storm_primitives::NodeSet;

use crate::stats::Samples;

/// The account the jobs run as, at home and (the lender's `flock_user`) on lent nodes.
const NOBODY: u32 = 65534;

/// What one run measured.
pub struct Lending {
    /// The heartbeat period of both clusters.
    pub period: Duration,
    /// A lend of nodes home for a moment ([`SETTLE`]), whose warm guests are ready.
    pub lend: Samples,
    /// A lend of nodes that came home just now (their warm guests started while they were
    /// lent).
    pub lend_again: Samples,
    pub give_back: Samples,
    pub launch_home: Samples,
    pub launch_borrowed: Samples,
    /// The agents' period (`advertise_ms`).
    pub agent_period: Duration,
    /// storm-submit's wall time for a job that borrows its nodes on asking.
    pub borrow_asked: Samples,
    /// From that job's end until its nodes are home.
    pub given_back: Samples,
    /// From `storm reclaim` (with notice) under a running borrowed job until its nodes are
    /// home: the agents tell the borrower, which ends the job and gives them back.
    pub called_home: Samples,
}

/// The agents' period in this bench.
const AGENT_PERIOD_MS: u64 = 100;

/// How long the nodes are home before a lend that finds their warm guests ready
/// (`[federation] warm_guests`; one starts as its node comes home).
const SETTLE: Duration = Duration::from_millis(200);

/// `storm lend` of `all` of the lender's nodes: from the request (its answer is part of the
/// time) until the borrower's MM shows every guest slot idle.
fn lend_all(pair: &Pair, all: &NodeSet, guest: impl Fn(&NodeInfo) -> bool) -> Result<Duration> {
    let asked = Instant::now();
    call(
        &pair.lender,
        &Request::Lend {
            nodes: all.clone(),
            peer: "lb-borrow".into(),
            for_ms: 600_000,
        },
    )?;
    until(pair, "the guest slots come up", |b, _| {
        b.iter()
            .filter(|n| guest(n))
            .all(|n| n.state == NodeState::Idle)
    })?;
    Ok(asked.elapsed())
}

/// `storm reclaim --now` of `all`: from the request until they are home ([`home_again`]).
fn return_all(pair: &Pair, all: &NodeSet) -> Result<Duration> {
    let asked = Instant::now();
    call(
        &pair.lender,
        &Request::Reclaim {
            nodes: all.clone(),
            now: true,
        },
    )?;
    until(pair, "the nodes come home", home_again)?;
    Ok(asked.elapsed())
}

struct Pair {
    borrower: LocalCluster,
    lender: LocalCluster,
    _keys: tempfile::TempDir,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Pair {
    fn start(nodes: u32) -> Result<Self> {
        let keys = tempfile::tempdir()?;
        let pair = keys.path().join("pair.key");
        storm_cluster::key::generate(&pair).context("making the pair key")?;
        let (p_borrow, p_lend) = (free_port()?, free_port()?);
        let peer = |name: &str, port: u16| -> Result<PeerEntry> {
            Ok(PeerEntry {
                name: name.into(),
                address: format!("127.0.0.1:{port}").parse()?,
                key_file: pair.clone(),
                lend: false,
                borrow: false,
                flock_user: None,
                same_users: false,
                guest_file: None,
                mm_public_key_file: None,
                priority: 0,
            })
        };
        let federation = |port: u16| -> Result<FederationSection> {
            Ok(FederationSection {
                listen: Some(format!("127.0.0.1:{port}").parse()?),
                advertise_ms: AGENT_PERIOD_MS,
                peer_timeout_ms: 20 * AGENT_PERIOD_MS,
                warm_guests: true,
                ..Default::default()
            })
        };
        let open = |c: LocalCluster| -> Result<LocalCluster> {
            // The jobs are submitted as `nobody`: they must reach the socket.
            std::fs::set_permissions(
                c.root(),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )?;
            Ok(c)
        };
        let borrower = open(LocalCluster::start(&LocalOptions {
            name: Some("lb-borrow".into()),
            federation: federation(p_borrow)?,
            peers: vec![PeerEntry {
                borrow: true,
                mm_public_key_file: Some(keys.path().join("lender-mm.pub")),
                ..peer("lb-lend", p_lend)?
            }],
            guests: (0..nodes)
                .map(|i| GuestOf {
                    cluster: "lb-lend".into(),
                    node: format!("node{i}"),
                })
                .collect(),
            ..LocalOptions::new(nodes)
        })?)?;
        // The borrower's topology and keys as the lender's operator installs them.
        let guest_dir = borrower.root().join("guest-export");
        storm_cluster::guest_file::write_guest_dir(borrower.config(), &guest_dir)?;
        let lender = open(LocalCluster::start(&LocalOptions {
            name: Some("lb-lend".into()),
            federation: federation(p_lend)?,
            peers: vec![PeerEntry {
                lend: true,
                // An account of its own (nobody, who submits here, is no peer's).
                flock_user: Some("daemon".into()),
                guest_file: Some(guest_dir.join("cluster.toml")),
                mm_public_key_file: None,
                ..peer("lb-borrow", p_borrow)?
            }],
            ..LocalOptions::new(nodes)
        })?)?;
        // The lender's MM key, where the borrower checks its leases with it.
        let at = keys.path().join("lender-mm.pub");
        std::fs::copy(lender.config().mm_key_paths().1, &at)?;
        std::fs::set_permissions(&at, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        Ok(Self {
            borrower,
            lender,
            _keys: keys,
        })
    }
}

fn nodes_of(c: &LocalCluster) -> Result<Vec<NodeInfo>> {
    let reply = Client::connect(c.socket())
        .and_then(|client| client.call(&Request::Nodes))
        .map_err(anyhow::Error::msg)?;
    match reply {
        Reply::Nodes(n) => Ok(n),
        other => bail!("storm nodes: {other:?}"),
    }
}

fn call(c: &LocalCluster, req: &Request) -> Result<()> {
    let reply = Client::connect(c.socket())
        .and_then(|client| client.call(req))
        .map_err(anyhow::Error::msg)?;
    match reply {
        Reply::Error(e) => bail!("{e}"),
        _ => Ok(()),
    }
}

/// Polls every millisecond until `done` holds of the answers of both MMs; how long it took.
fn until(
    pair: &Pair,
    what: &str,
    done: impl Fn(&[NodeInfo], &[NodeInfo]) -> bool,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let (b, l) = (nodes_of(&pair.borrower)?, nodes_of(&pair.lender)?);
        if done(&b, &l) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("{what}: not within 30 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every lent node is home: idle at the lender, and no guest slot up at the borrower.
fn home_again(borrower: &[NodeInfo], lender: &[NodeInfo]) -> bool {
    lender.iter().all(|n| n.state == NodeState::Idle)
        && borrower
            .iter()
            .filter(|n| n.name.starts_with("lb-lend-"))
            .all(|n| !matches!(n.state, NodeState::Idle | NodeState::Allocated))
}

/// storm-submit's wall time for `true` on `cluster` with `args`, as `nobody`.
fn launch(cluster: &LocalCluster, args: &[&str]) -> Result<Duration> {
    let start = Instant::now();
    let out = Command::new(storm_cli::local::bin_dir()?.join("storm-submit"))
        .arg("--socket")
        .arg(cluster.socket())
        .args(args)
        .arg("/bin/true")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let took = start.elapsed();
    if !out.status.success() {
        bail!(
            "storm-submit {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}

/// `rounds` rounds of lend, launch (`launches` of each kind) and return, on clusters of
/// `nodes` nodes each.
pub fn measure(nodes: u32, rounds: usize, launches: usize) -> Result<Lending> {
    let pair = Pair::start(nodes)?;
    let guest = |n: &NodeInfo| n.name.starts_with("lb-lend-");
    let all = NodeSet::first_n(nodes);
    let n = nodes.to_string();
    let mut m = Lending {
        period: Duration::from_secs_f64(
            storm_cluster::ClusterConfig::load(&pair.borrower.root().join("cluster.toml"))?
                .cluster
                .timeslice_ms
                / 1000.0,
        ),
        lend: Samples::from_secs(Vec::new()),
        lend_again: Samples::from_secs(Vec::new()),
        give_back: Samples::from_secs(Vec::new()),
        launch_home: Samples::from_secs(Vec::new()),
        launch_borrowed: Samples::from_secs(Vec::new()),
        agent_period: Duration::from_millis(AGENT_PERIOD_MS),
        borrow_asked: Samples::from_secs(Vec::new()),
        given_back: Samples::from_secs(Vec::new()),
        called_home: Samples::from_secs(Vec::new()),
    };
    let (mut lend, mut lend_again, mut back, mut home, mut borrowed) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        // The nodes have been home a moment: their warm guests are ready.
        std::thread::sleep(SETTLE);
        lend.push(lend_all(&pair, &all, guest)?.as_secs_f64());
        for _ in 0..launches {
            home.push(launch(&pair.borrower, &["-N", &n])?.as_secs_f64());
            borrowed.push(
                launch(&pair.borrower, &["--borrow", "-C", "guest", "-N", &n])?.as_secs_f64(),
            );
        }
        back.push(return_all(&pair, &all)?.as_secs_f64());
        // Lent again at once: the warm guests that waited during the lease take it.
        lend_again.push(lend_all(&pair, &all, guest)?.as_secs_f64());
        back.push(return_all(&pair, &all)?.as_secs_f64());
    }
    m.lend_again = Samples::from_secs(lend_again);
    m.lend = Samples::from_secs(lend);
    m.give_back = Samples::from_secs(back);
    m.launch_home = Samples::from_secs(home);
    m.launch_borrowed = Samples::from_secs(borrowed);

    // Borrowing on asking, through the agents.
    let agents = (
        crate::federation::start_agent(&pair.borrower)?,
        crate::federation::start_agent(&pair.lender)?,
    );
    let offered = || -> Result<bool> {
        let client = Client::connect(pair.borrower.socket()).map_err(anyhow::Error::msg)?;
        Ok(
            match client.call(&Request::Peers).map_err(anyhow::Error::msg)? {
                Reply::Peers { peers, .. } => peers
                    .iter()
                    .any(|p| p.offer.as_ref().is_some_and(|o| o.idle_nodes == nodes)),
                _ => false,
            },
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !offered()? {
        if Instant::now() > deadline {
            bail!("the borrower never saw the lender's offer of {nodes} idle nodes");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (mut asked, mut given) = (vec![], vec![]);
    for _ in 0..rounds {
        asked.push(launch(&pair.borrower, &["--borrow", "-C", "guest", "-N", &n])?.as_secs_f64());
        let ended = Instant::now();
        until(&pair, "the borrowed nodes go back", home_again)?;
        given.push(ended.elapsed().as_secs_f64());
    }
    // Called home with notice under a running borrowed job: the lender's agent tells the
    // borrower's, whose MM ends the job there and gives the nodes back.
    let mut called = vec![];
    for _ in 0..rounds {
        let job = Command::new(storm_cli::local::bin_dir()?.join("storm-submit"))
            .arg("--socket")
            .arg(pair.borrower.socket())
            .args(["--borrow", "-C", "guest", "-N", &n, "/bin/sleep", "60"])
            .uid(NOBODY)
            .gid(NOBODY)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut job = Killed(job);
        until(&pair, "the borrowed job runs", |b, _| {
            b.iter()
                .filter(|n| guest(n))
                .all(|n| n.state == NodeState::Allocated)
        })?;
        let asked = Instant::now();
        call(
            &pair.lender,
            &Request::Reclaim {
                nodes: all.clone(),
                now: false,
            },
        )?;
        until(&pair, "the nodes called home come home", home_again)?;
        called.push(asked.elapsed().as_secs_f64());
        let _ = job.0.wait();
    }
    drop(agents);
    m.borrow_asked = Samples::from_secs(asked);
    m.given_back = Samples::from_secs(given);
    m.called_home = Samples::from_secs(called);
    let _ = pair.borrower.shutdown();
    let _ = pair.lender.shutdown();
    Ok(m)
}

/// A child killed when dropped (a bench that fails midway leaves no job's storm-submit).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
