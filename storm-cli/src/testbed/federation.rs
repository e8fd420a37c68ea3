//! Several testbed clusters that share (docs/federation.md): `storm-testbed up --clusters 2`.
//!
//! Each cluster `c<k>` is a testbed of its own ([`super::Testbed`], named `NAME<k>`, files in
//! `DIR/c<k>`, its cluster file at `DIR/c<k>/cluster.toml`), with its own MM, key and bridge,
//! and its own addresses, 10.(200 + k).0.0/16. The clusters' MM namespaces are joined by one
//! more bridge, in namespace `NAME-fed`: each MM namespace has a second link, `fed0`, with
//! address 10.199.0.(1 + k)/24, where the cluster's peer agent (`storm-peer`) listens on port
//! 7100. The MM namespaces route between the clusters over that bridge, so a node of one
//! cluster reaches the nodes and MM of another: each cluster's file has a guest slot (feature
//! `guest`) for every node of the others, at that node's address and [`GUEST_PORT`], and
//! names the others' guest files (`DIR/c<k>/guest/cluster.toml`, their topology and keys)
//! as its `[[peer]] guest_file`, so any node may be lent (`storm lend`). Cutting a cluster's `fed0` cuts its lent nodes off from their borrowers too. Every pair of clusters shares a
//! pair key (`DIR/keys/c<i>-c<j>.key`); each cluster lends to and borrows from every other,
//! and runs their jobs as its dedicated account, [`FLOCK_USER`] (`flock_user`, made if the
//! host has none; `same_users` is off, the default).
//!
//! [`Federation::set_link`] cuts a cluster's link to the others (its `fed0` cable), and
//! restores it; [`Federation::set_loss`] makes that link drop packets at random. [`down`]
//! takes every cluster down from the files, for `storm-testbed down`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cluster::config::NodeEntry;
use storm_cluster::control::{Client, Reply, Request};
use storm_cluster::federation::{FederationSection, GuestOf, PeerEntry, PeerState};

use super::{Testbed, TestbedOptions, ip, mm_addr_in, node_addr_in};

/// Where each cluster's peer agent listens, on its `fed0` address.
pub const PEER_AGENT_PORT: u16 = 7100;

/// What records the federation's own namespace, in its directory.
const STATE_FILE: &str = "federation.state";

/// At most this many clusters.
pub const MAX_CLUSTERS: u32 = 9;

/// Cluster `k`'s address on the bridge between the clusters.
pub fn fed_addr(k: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 199, 0, 1 + k as u8)
}

/// The account each cluster runs its peers' jobs as (`[[peer]] flock_user`): one of its
/// own, as docs/federation.md asks (a peer's account submits no jobs of its own, so an
/// account users share, such as `nobody`, would lose that right). Made if missing.
pub const FLOCK_USER: &str = "storm-flock";

/// Makes the account [`FLOCK_USER`] if this host has none (no home, no login shell).
fn ensure_flock_user() -> Result<()> {
    if nix::unistd::User::from_name(FLOCK_USER)?.is_some() {
        return Ok(());
    }
    let out = std::process::Command::new("useradd")
        .args([
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "--user-group",
            "--comment",
            "storm testbed peer jobs",
            FLOCK_USER,
        ])
        .output()
        .context("running useradd")?;
    // Another testbed made it meanwhile.
    if !out.status.success() && nix::unistd::User::from_name(FLOCK_USER)?.is_none() {
        bail!(
            "cannot make the account {FLOCK_USER} that runs the peers' jobs: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Where cluster `k`'s guest file and the keys its guests need are, for the nodes of the
/// other clusters (docs/federation.md, guest files).
fn guest_dir(dir: &Path, k: u32) -> PathBuf {
    dir.join(cluster_name(k)).join("guest")
}

/// Where a lent node's guest NM listens, beside the node's own NM (on port 7000).
pub const GUEST_PORT: u16 = 7002;

/// The second octet of cluster `k`'s addresses (10.NET.0.0/16).
pub fn net_of(k: u32) -> u8 {
    super::SINGLE_NET + k as u8
}

/// Lets namespace `ns` forward packets between its links.
fn forward(ns: &str) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ])
        .output()
        .context("running ip netns exec ... sysctl")?;
    if !out.status.success() {
        bail!(
            "enabling forwarding in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The name of cluster `k`.
pub fn cluster_name(k: u32) -> String {
    format!("c{k}")
}

/// Running clusters that share. Dropping it takes them down.
#[derive(Debug)]
pub struct Federation {
    pub dir: PathBuf,
    pub clusters: Vec<Testbed>,
    fed_ns: String,
    torn_down: bool,
}

impl Federation {
    /// `clusters` testbeds as `base` describes each (its name at most 7 characters: each
    /// cluster's testbed is named with its number after it), joined, their agents started;
    /// returns once every cluster sees every other `up`.
    pub fn up(base: &TestbedOptions, clusters: u32) -> Result<Self> {
        if !(2..=MAX_CLUSTERS).contains(&clusters) {
            bail!("a testbed of clusters has 2 to {MAX_CLUSTERS} of them, not {clusters}");
        }
        if base.name.is_empty() || base.name.len() > 7 {
            bail!(
                "testbed name {:?}: use 1 to 7 letters or digits with --clusters (each cluster's \
                 namespaces get its number)",
                base.name
            );
        }
        if base.managers != 1 {
            bail!("--clusters runs one MM per cluster (not --managers)");
        }
        ensure_flock_user()?;
        std::fs::create_dir(&base.dir)
            .with_context(|| format!("creating {}", base.dir.display()))?;
        std::fs::set_permissions(
            &base.dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let keys = base.dir.join("keys");
        std::fs::create_dir(&keys)?;
        let pair_key = |i: u32, j: u32| keys.join(format!("c{}-c{}.key", i.min(j), i.max(j)));
        for i in 0..clusters {
            for j in i + 1..clusters {
                storm_cluster::key::generate(&pair_key(i, j))?;
            }
        }
        let fed_ns = format!("{}-fed", base.name);
        let mut fed = Federation {
            dir: base.dir.clone(),
            clusters: Vec::new(),
            fed_ns: fed_ns.clone(),
            torn_down: false,
        };
        ip(&["netns", "add", &fed_ns])?;
        std::fs::write(base.dir.join(STATE_FILE), format!("ns {fed_ns}\n"))?;
        ip(&["-n", &fed_ns, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &fed_ns, "link", "set", "br0", "up"])?;
        for k in 0..clusters {
            let peers = (0..clusters)
                .filter(|&j| j != k)
                .map(|j| PeerEntry {
                    name: cluster_name(j),
                    address: SocketAddr::V4(SocketAddrV4::new(fed_addr(j), PEER_AGENT_PORT)),
                    key_file: pair_key(k, j),
                    lend: true,
                    borrow: true,
                    priority: 0,
                    flock_user: Some(FLOCK_USER.into()),
                    same_users: false,
                    // The borrower's guest file (its topology and keys), where this
                    // host's nodes read it: written once that cluster is up.
                    guest_file: Some(guest_dir(&base.dir, j).join("cluster.toml")),
                    // The lender's MM key, in the guest directory it writes for its peers.
                    mm_public_key_file: Some(
                        guest_dir(&base.dir, j).join(storm_cluster::guest_file::MM_PUBLIC_KEY),
                    ),
                })
                .collect();
            // A guest slot for every node of every other cluster, at that node's address
            // (its guest NM listens beside its own NM, on GUEST_PORT).
            let guests = (0..clusters)
                .filter(|&j| j != k)
                .flat_map(|j| (0..base.nodes).map(move |i| (j, i)))
                .map(|(j, i)| NodeEntry {
                    name: format!("{}-node{i}", cluster_name(j)),
                    address: SocketAddr::V4(SocketAddrV4::new(
                        node_addr_in(net_of(j), i),
                        GUEST_PORT,
                    )),
                    spool: base
                        .dir
                        .join(cluster_name(k))
                        .join(format!("guest-{}-node{i}", cluster_name(j))),
                    cpus: base.cpus,
                    mem: None,
                    features: vec!["guest".into()],
                    guest_of: Some(GuestOf {
                        cluster: cluster_name(j),
                        node: format!("node{i}"),
                    }),
                })
                .collect();
            let opts = TestbedOptions {
                name: format!("{}{k}", base.name),
                dir: base.dir.join(cluster_name(k)),
                cluster_name: Some(cluster_name(k)),
                federation: FederationSection {
                    listen: Some(SocketAddr::V4(SocketAddrV4::new(
                        fed_addr(k),
                        PEER_AGENT_PORT,
                    ))),
                    ..base.federation.clone()
                },
                peers,
                net: net_of(k),
                guests,
                ..base.clone()
            };
            let mut tb = Testbed::up(&opts)?;
            let mm_ns = tb.mm_ns();
            let sw_end = cluster_name(k);
            ip(&[
                "link", "add", &sw_end, "netns", &fed_ns, "type", "veth", "peer", "name", "fed0",
                "netns", &mm_ns,
            ])?;
            ip(&["-n", &fed_ns, "link", "set", &sw_end, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &mm_ns,
                "addr",
                "add",
                &format!("{}/24", fed_addr(k)),
                "dev",
                "fed0",
            ])?;
            ip(&["-n", &mm_ns, "link", "set", "fed0", "up"])?;
            // Routed to the other clusters' nodes through the MM namespaces and the bridge
            // between them: a lent node reaches its borrower's fabric, and back.
            forward(&mm_ns)?;
            for j in (0..clusters).filter(|&j| j != k) {
                let far = format!("10.{}.0.0/16", net_of(j));
                // From the MM's own address on its cluster's bridge, which the nodes of the
                // other cluster reach back (they have no route to the bridge between MMs).
                ip(&[
                    "-n",
                    &mm_ns,
                    "route",
                    "add",
                    &far,
                    "via",
                    &fed_addr(j).to_string(),
                    "src",
                    &mm_addr_in(net_of(k)).to_string(),
                ])?;
                for i in 0..base.nodes {
                    ip(&[
                        "-n",
                        &tb.node_ns(i),
                        "route",
                        "add",
                        &far,
                        "via",
                        &mm_addr_in(net_of(k)).to_string(),
                    ])?;
                }
            }
            tb.start_peer_agent()?;
            // What the other clusters' operators install for lending to this one (their
            // warm guests find it at their next look).
            storm_cluster::guest_file::write_guest_dir(&tb.config, &guest_dir(&base.dir, k))
                .context("writing the guest file")?;
            fed.clusters.push(tb);
        }
        fed.wait_all_up(Duration::from_secs(30))?;
        Ok(fed)
    }

    /// Waits until every cluster's `storm peers` shows every other `up`.
    pub fn wait_all_up(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        for tb in &self.clusters {
            loop {
                let peers = peers_of(tb.socket());
                let others = self.clusters.len() - 1;
                match &peers {
                    Ok(p) if p.iter().filter(|p| p.state == PeerState::Up).count() == others => {
                        break;
                    }
                    _ if Instant::now() > deadline => bail!(
                        "{}'s peers are not all up within {limit:?}: {peers:?}\n{}",
                        tb.config.cluster.name,
                        super::tail(&tb.dir.join("storm-peer.log"))
                    ),
                    _ => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        Ok(())
    }

    /// Cuts (`up` false) or restores cluster `k`'s link to the other clusters.
    pub fn set_link(&self, k: u32, up: bool) -> Result<()> {
        set_link(&self.fed_ns, k, up)
    }

    /// Makes cluster `k`'s link to the others (its MM namespace's `fed0`) drop `percent` % of
    /// the packets it sends and of those it receives, at random (0 restores it): an nftables
    /// rule, as [`Testbed::set_loss`] for a node's link.
    pub fn set_loss(&self, k: u32, percent: u32) -> Result<()> {
        let tb = self
            .clusters
            .get(k as usize)
            .with_context(|| format!("no cluster {k}"))?;
        let ns = tb.mm_ns();
        // Deleting a table that is not there fails; that is fine.
        let _ = super::nft(&ns, "delete table inet storm_fed_loss");
        if percent == 0 {
            return Ok(());
        }
        super::nft(
            &ns,
            &format!(
                "table inet storm_fed_loss {{ \
                   chain input {{ type filter hook input priority 0; \
                     iifname \"fed0\" numgen random mod 100 < {percent} drop; }}; \
                   chain output {{ type filter hook output priority 0; \
                     oifname \"fed0\" numgen random mod 100 < {percent} drop; }}; }}"
            ),
        )
    }

    /// The cluster files, by cluster.
    pub fn config_paths(&self) -> Vec<PathBuf> {
        self.clusters
            .iter()
            .map(|t| t.config_path.clone())
            .collect()
    }

    /// Leaves the clusters running (`storm-testbed up`); [`down`] takes them down.
    pub fn detach(mut self) {
        self.torn_down = true;
        for tb in self.clusters.drain(..) {
            tb.detach();
        }
    }

    fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let mut failed = Vec::new();
        for tb in self.clusters.drain(..) {
            if let Err(e) = tb.down() {
                failed.push(format!("{e:#}"));
            }
        }
        if let Err(e) = ip(&["netns", "del", &self.fed_ns]) {
            failed.push(format!("{e:#}"));
        }
        if !failed.is_empty() {
            bail!("{}", failed.join("; "));
        }
        Ok(())
    }
}

impl Drop for Federation {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("storm-testbed: tearing down {}: {e:#}", self.dir.display());
        }
    }
}

/// What cluster `socket`'s MM says of its peers.
pub fn peers_of(socket: &Path) -> Result<Vec<storm_cluster::federation::PeerInfo>, String> {
    match Client::connect(socket)?.call(&Request::Peers)? {
        Reply::Peers { peers, .. } => Ok(peers),
        Reply::Error(e) => Err(e),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// Cuts or restores cluster `k`'s link in the federation namespace `fed_ns`.
pub fn set_link(fed_ns: &str, k: u32, up: bool) -> Result<()> {
    ip(&[
        "-n",
        fed_ns,
        "link",
        "set",
        &cluster_name(k),
        if up { "up" } else { "down" },
    ])
}

/// Whether `dir` holds clusters that share (`storm-testbed up --clusters`).
pub fn is_federation(dir: &Path) -> bool {
    dir.join(STATE_FILE).exists()
}

/// Takes down the clusters of the federation in `dir` from its files: each cluster's
/// daemons and namespaces, then the namespace between them.
pub fn down(dir: &Path) -> Result<()> {
    let mut failed = Vec::new();
    let mut k = 0;
    while dir.join(cluster_name(k)).is_dir() {
        if let Err(e) = super::down_by_state(&dir.join(cluster_name(k))) {
            failed.push(format!("{e:#}"));
        }
        k += 1;
    }
    let state = dir.join(STATE_FILE);
    let text =
        std::fs::read_to_string(&state).with_context(|| format!("reading {}", state.display()))?;
    for line in text.lines() {
        if let Some(ns) = line.strip_prefix("ns ")
            && let Err(e) = ip(&["netns", "del", ns])
            && super::ip_netns_exists(ns)
        {
            failed.push(format!("{e:#}"));
        }
    }
    if !failed.is_empty() {
        bail!("some of the testbed remains: {}", failed.join("; "));
    }
    Ok(())
}
