//! The front end's side of agents it did not start (`srun --mpi=pmi2 -N K storm start`,
//! [`super::bootstrap`]): the agents of the other nodes connect to it ([`super::link`]),
//! and the agent of its own node is a child it starts the same way. Each link, once its
//! hello is accepted, is one agent's standard streams: its lines come as
//! [`Input::AgentLine`], the instance's files go down it, its end is
//! [`Input::LinkLost`], and closing it is the instance's end on that node.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::Sender;
use parking_lot::Mutex;

use super::core::Input;
use super::link::{self, Token};

/// How long a connection may take to say hello.
const HELLO_DEADLINE: Duration = Duration::from_secs(5);

/// The most connections saying hello at once, from one address and from all: more are
/// closed at once (an agent says hello as soon as it connects).
const MAX_PENDING_PER_SOURCE: usize = 8;
const MAX_PENDING: usize = 256;

/// Connections saying hello, by source address.
#[derive(Default)]
struct Pending(Mutex<HashMap<IpAddr, usize>>);

impl Pending {
    /// Counts one more from `ip`, if both bounds allow it.
    fn admit(&self, ip: IpAddr) -> bool {
        let mut map = self.0.lock();
        let total: usize = map.values().sum();
        let here = map.entry(ip).or_default();
        if *here >= MAX_PENDING_PER_SOURCE || total >= MAX_PENDING {
            return false;
        }
        *here += 1;
        true
    }

    fn done(&self, ip: IpAddr) {
        let mut map = self.0.lock();
        if let Some(n) = map.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&ip);
            }
        }
    }
}

/// The agents linked to the front end.
pub struct LinkedAgents {
    /// The agent of the front end's own node.
    own: Child,
    own_node: String,
    own_ended: bool,
    /// Each node's link (its writing side), by node index, once it said hello.
    links: Arc<Mutex<Vec<Option<TcpStream>>>>,
    /// Links whose reading side has not ended.
    open: Arc<AtomicUsize>,
}

impl LinkedAgents {
    /// Accepts the agents' links on `listener` and starts the own node's agent (`storm agent
    /// --front`) as node `own_index`.
    pub fn start(
        listener: TcpListener,
        token: Token,
        nodes: &[String],
        own_index: u32,
        storm: &Path,
        bind: Option<IpAddr>,
        tx: &Sender<Input>,
    ) -> Result<Self> {
        let front = listener.local_addr()?;
        let links = Arc::new(Mutex::new(
            (0..nodes.len()).map(|_| None).collect::<Vec<_>>(),
        ));
        let open = Arc::new(AtomicUsize::new(0));
        {
            let (links, open, tx, nodes) =
                (links.clone(), open.clone(), tx.clone(), nodes.to_vec());
            let token = token.clone();
            std::thread::Builder::new()
                .name("storm-start-links".into())
                .spawn(move || accept(listener, &token, &nodes, &links, &open, &tx))?;
        }
        let own_node = nodes
            .get(own_index as usize)
            .cloned()
            .with_context(|| format!("node index {own_index} is not one of the step's nodes"))?;
        let mut cmd = Command::new(storm);
        cmd.arg("agent")
            .args(["--front", &front.to_string()])
            .args(["--index", &own_index.to_string(), "--node", &own_node]);
        if let Some(ip) = bind {
            cmd.arg("--bind").arg(ip.to_string());
        }
        let own = spawn_own(cmd, &token)?;
        Ok(Self {
            own,
            own_node,
            own_ended: false,
            links,
            open,
        })
    }

    /// Sends `line` to every linked agent.
    pub fn send_all(&mut self, line: &str) -> Result<()> {
        let mut links = self.links.lock();
        for (index, link) in links.iter_mut().enumerate() {
            let link = link
                .as_mut()
                .with_context(|| format!("node {index} has no link"))?;
            link.write_all(line.as_bytes())
                .and_then(|()| link.write_all(b"\n"))
                .and_then(|()| link.flush())
                .with_context(|| format!("sending node {index}'s agent the instance's files"))?;
        }
        Ok(())
    }

    /// The own node's agent, if it ended since the last call (the others' ends come as
    /// [`Input::LinkLost`]).
    pub fn ended(&mut self) -> Option<Input> {
        if self.own_ended {
            return None;
        }
        let status = self.own.try_wait().ok().flatten()?;
        self.own_ended = true;
        Some(Input::AgentEnded {
            node: self.own_node.clone(),
            code: status.code(),
        })
    }

    /// Ends the agents: every link's writing side closed (each agent stops its node manager,
    /// removes its directory, exits and so closes its link), up to 10 s for that.
    pub fn stop(&mut self) {
        for link in self.links.lock().iter().flatten() {
            let _ = link.shutdown(Shutdown::Write);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && (self.open.load(Ordering::Relaxed) > 0 || matches!(self.own.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.open.load(Ordering::Relaxed) > 0 {
            eprintln!(
                "storm start: {} node agents did not stop in 10 s (Slurm ends them with the step)",
                self.open.load(Ordering::Relaxed)
            );
        }
        super::agent::stop_child(&mut self.own, Duration::from_secs(5));
    }
}

/// Starts the own node's agent, the token its first line of input (not its environment,
/// which would pass on to its node manager and the jobs), in a process group of its own:
/// the terminal's Ctrl-C does not reach it.
fn spawn_own(mut cmd: Command, token: &Token) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0);
    let mut child = cmd.spawn().context("starting this node's agent")?;
    let mut input = child.stdin.take().context("this node's agent's input")?;
    input
        .write_all(format!("{}\n", token.as_str()).as_bytes())
        .context("giving this node's agent the link's token")?;
    Ok(child)
}

/// Accepts links until every node has one; then the listener is closed.
fn accept(
    listener: TcpListener,
    token: &Token,
    nodes: &[String],
    links: &Arc<Mutex<Vec<Option<TcpStream>>>>,
    open: &Arc<AtomicUsize>,
    tx: &Sender<Input>,
) {
    let pending = Arc::new(Pending::default());
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !links.lock().iter().all(Option::is_some) {
        let (conn, from) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(_) => continue,
        };
        if conn.set_nonblocking(false).is_err() || !pending.admit(from.ip()) {
            continue;
        }
        let (token, nodes, links, open, tx, left) = (
            token.clone(),
            nodes.to_vec(),
            links.clone(),
            open.clone(),
            tx.clone(),
            pending.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("storm-start-link".into())
            .spawn(move || {
                let linked = hello(conn, &token, &nodes, &links);
                left.done(from.ip());
                if let Some((index, reader)) = linked {
                    open.fetch_add(1, Ordering::AcqRel);
                    super::launch::forward_lines(reader, &tx);
                    open.fetch_sub(1, Ordering::AcqRel);
                    let _ = tx.send(Input::LinkLost {
                        node: nodes[index as usize].clone(),
                    });
                }
            });
        if spawned.is_err() {
            pending.done(from.ip());
        }
    }
}

/// Reads `conn`'s hello; if it is a node's first link, records it and gives its index and
/// reading side.
fn hello(
    mut conn: TcpStream,
    token: &Token,
    nodes: &[String],
    links: &Mutex<Vec<Option<TcpStream>>>,
) -> Option<(u32, TcpStream)> {
    conn.set_read_timeout(Some(HELLO_DEADLINE)).ok()?;
    let line = link::read_hello(&mut conn)?;
    let index = link::check_hello(&line, token, nodes.len()).ok()?;
    conn.set_read_timeout(None).ok()?;
    let writer = conn.try_clone().ok()?;
    let mut links = links.lock();
    let slot = links.get_mut(index as usize)?;
    if slot.is_some() {
        return None;
    }
    *slot = Some(writer);
    Some((index, conn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::SocketAddr;

    /// A TCP connection to `to` from the loopback address `from`.
    fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
        use std::os::fd::FromRawFd;
        let sockaddr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(ip),
            },
            sin_zero: [0; 8],
        };
        let SocketAddr::V4(to) = to else {
            unreachable!("the test listens on IPv4")
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: a new socket, owned by the stream made of it; the addresses are
        // sockaddr_in values that live across the calls.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let stream = TcpStream::from_raw_fd(fd);
            let here = sockaddr(from, 0);
            assert_eq!(libc::bind(fd, (&raw const here).cast(), len), 0);
            let there = sockaddr(to.ip().octets(), to.port());
            assert_eq!(libc::connect(fd, (&raw const there).cast(), len), 0);
            stream
        }
    }

    /// Whether the front end closed `s` (within a second), rather than still waiting on it.
    fn closed(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        matches!(s.read(&mut [0u8; 64]), Ok(0))
    }

    /// As a peer without the token, at the front end's port: a wrong token is closed at
    /// once; silent connections from one address beyond its bound are closed at once and
    /// hold no agent up; a node already linked cannot be linked again; once every node is
    /// linked the port is closed; and the linked agents' lines, the instance's files and
    /// the end go both ways.
    #[test]
    fn only_the_steps_own_agents_link_and_each_node_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let token = Token::new();
        let nodes = vec!["n1".to_string(), "n2".to_string()];
        let links = Arc::new(Mutex::new(vec![None, None]));
        let open = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = crossbeam_channel::unbounded();
        {
            let (token, nodes, links, open) =
                (token.clone(), nodes.clone(), links.clone(), open.clone());
            std::thread::spawn(move || accept(listener, &token, &nodes, &links, &open, &tx));
        }
        let mut silent: Vec<TcpStream> = (0..MAX_PENDING_PER_SOURCE)
            .map(|_| connect_from([127, 0, 0, 2], addr))
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut one_more = connect_from([127, 0, 0, 2], addr);
        assert!(closed(&mut one_more), "over the bound from one address");
        let mut wrong = connect_from([127, 0, 0, 3], addr);
        wrong
            .write_all(link::hello_line(&Token::new(), 0).as_bytes())
            .unwrap();
        assert!(closed(&mut wrong), "a wrong token");

        let mut agent1 = connect_from([127, 0, 0, 1], addr);
        agent1
            .write_all(format!("{}report of n2\n", link::hello_line(&token, 1)).as_bytes())
            .unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            Input::AgentLine("report of n2\n".into()),
            "linked while the silent ones wait"
        );
        let mut again = connect_from([127, 0, 0, 4], addr);
        again
            .write_all(link::hello_line(&token, 1).as_bytes())
            .unwrap();
        assert!(closed(&mut again), "node 1 is linked already");
        assert!(
            !closed(&mut silent[0]),
            "a silent connection waits its deadline"
        );

        let mut agent0 = connect_from([127, 0, 0, 1], addr);
        agent0
            .write_all(link::hello_line(&token, 0).as_bytes())
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(addr).is_ok() {
            assert!(Instant::now() < deadline, "the port closes once all linked");
            std::thread::sleep(Duration::from_millis(20));
        }

        for link in links.lock().iter_mut().flatten() {
            link.write_all(b"bundle\n").unwrap();
            link.shutdown(Shutdown::Write).unwrap();
        }
        for agent in [&mut agent0, &mut agent1] {
            let mut got = String::new();
            agent.read_to_string(&mut got).unwrap();
            assert_eq!(got, "bundle\n", "the files, then the end");
        }
        drop(agent1);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            Input::LinkLost { node: "n2".into() }
        );
    }
}
