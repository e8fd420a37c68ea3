//! What this cluster's agent knows of each peer: pure bookkeeping, no I/O. The agent's
//! threads tell it what happened on the links (with the time), and ask it what `storm peers`
//! shows ([`PeerTable::infos`]).
//!
//! Each pair of agents keeps two links: the one this agent dials (it sends adverts there,
//! and hears echoes) and the one the peer dials (it hears the peer's adverts there, and
//! echoes them). A peer is `up` while the link this agent dialled is up and the peer was
//! heard within `peer_timeout_ms`; `refused` while either side refuses the other's
//! handshake; `down` otherwise.

use std::time::{Duration, Instant};

use storm_cluster::federation::{Offer, PeerEntry, PeerInfo, PeerState};

/// The link this agent dials to one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outbound {
    /// Not up yet (or again), with why the last attempt failed.
    Down(Option<String>),
    /// The peer's agent refused the handshake (or is not the agent of that cluster).
    Refused(String),
    Up,
}

#[derive(Debug, Clone)]
struct Peer {
    entry: PeerEntry,
    outbound: Outbound,
    /// A link the peer dialled that this agent refused, and why.
    inbound_refused: Option<(Instant, String)>,
    /// When the peer was last heard (an advert on its link, an echo on this agent's).
    heard: Option<Instant>,
    offer: Option<Offer>,
    /// The peer's last advert said its agent reaches its MM.
    manager: bool,
    lag: Option<Duration>,
}

/// Every peer's state.
#[derive(Debug, Clone)]
pub struct PeerTable {
    peers: Vec<Peer>,
    timeout: Duration,
}

impl PeerTable {
    /// The peers of `entries`, none heard yet; a peer not heard for `timeout` is down.
    pub fn new(entries: &[PeerEntry], timeout: Duration) -> Self {
        Self {
            peers: entries
                .iter()
                .map(|e| Peer {
                    entry: e.clone(),
                    outbound: Outbound::Down(None),
                    inbound_refused: None,
                    heard: None,
                    offer: None,
                    manager: true,
                    lag: None,
                })
                .collect(),
            timeout,
        }
    }

    fn peer(&mut self, name: &str) -> Option<&mut Peer> {
        self.peers.iter_mut().find(|p| p.entry.name == name)
    }

    /// The link this agent dialled to `name` finished its handshake.
    pub fn outbound_up(&mut self, name: &str) {
        if let Some(p) = self.peer(name) {
            p.outbound = Outbound::Up;
        }
    }

    /// The link this agent dialled to `name` failed or could not be made; `refused`: the
    /// peer's agent refused it (a key or name that does not match).
    pub fn outbound_failed(&mut self, name: &str, why: String, refused: bool) {
        if let Some(p) = self.peer(name) {
            p.outbound = if refused {
                Outbound::Refused(why)
            } else {
                Outbound::Down(Some(why))
            };
            p.lag = None;
        }
    }

    /// This agent refused a link claiming to come from `name`, at `now`.
    pub fn inbound_refused(&mut self, name: &str, why: String, now: Instant) {
        if let Some(p) = self.peer(name) {
            p.inbound_refused = Some((now, why));
        }
    }

    /// `name`'s advert arrived at `now` on the link it dialled.
    pub fn advert(&mut self, name: &str, offer: Option<Offer>, manager: bool, now: Instant) {
        if let Some(p) = self.peer(name) {
            p.heard = Some(now);
            p.offer = offer;
            p.manager = manager;
            p.inbound_refused = None;
        }
    }

    /// `name` echoed an advert this agent sent `round_trip` ago, at `now`.
    pub fn echo(&mut self, name: &str, round_trip: Duration, now: Instant) {
        if let Some(p) = self.peer(name) {
            p.heard = Some(now);
            p.lag = Some(round_trip);
        }
    }

    /// What `storm peers` shows, at `now`.
    pub fn infos(&self, now: Instant) -> Vec<PeerInfo> {
        self.peers
            .iter()
            .map(|p| {
                let heard_ago = p.heard.map(|h| now.saturating_duration_since(h));
                let fresh = heard_ago.is_some_and(|a| a <= self.timeout);
                let refused_in = p
                    .inbound_refused
                    .as_ref()
                    .filter(|(at, _)| now.saturating_duration_since(*at) <= self.timeout)
                    .map(|(_, why)| why.clone());
                let (state, reason) = match (&p.outbound, refused_in) {
                    (Outbound::Refused(why), _) => (PeerState::Refused, Some(why.clone())),
                    (_, Some(why)) => (PeerState::Refused, Some(why)),
                    (Outbound::Up, None) if fresh && !p.manager => (
                        PeerState::Down,
                        Some("its machine manager does not answer its peer agent".into()),
                    ),
                    (Outbound::Up, None) if fresh => (PeerState::Up, None),
                    (Outbound::Up, None) => (
                        PeerState::Down,
                        Some(match heard_ago {
                            Some(a) => format!("not heard for {:.1} s", a.as_secs_f64()),
                            None => "not heard from yet".into(),
                        }),
                    ),
                    (Outbound::Down(why), None) => (
                        PeerState::Down,
                        Some(why.clone().unwrap_or_else(|| "connecting".into())),
                    ),
                };
                PeerInfo {
                    name: p.entry.name.clone(),
                    address: p.entry.address,
                    state,
                    lend: p.entry.lend,
                    borrow: p.entry.borrow,
                    // A peer that is not up offers nothing now: its last offer is not shown
                    // as if it held.
                    offer: if state == PeerState::Up {
                        p.offer.clone()
                    } else {
                        None
                    },
                    lag_us: if state == PeerState::Up {
                        p.lag.map(|l| l.as_micros().min(u64::MAX as u128) as u64)
                    } else {
                        None
                    },
                    heard_ms_ago: heard_ago.map(|a| a.as_millis().min(u64::MAX as u128) as u64),
                    reason,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<PeerEntry> {
        vec![PeerEntry {
            name: "c1".into(),
            address: "127.0.0.1:7100".parse().unwrap(),
            key_file: "c1.pair".into(),
            lend: true,
            borrow: true,
            flock_user: None,
            same_users: false,
            guest_file: None,
            mm_public_key_file: None,
            priority: 0,
        }]
    }

    fn offer() -> Offer {
        Offer {
            idle_nodes: 2,
            idle_cpus: 8,
            nodes: 2,
            queued: 0,
        }
    }

    #[test]
    fn a_peer_is_up_while_its_link_is_and_it_was_heard_then_down_and_its_offer_gone() {
        let t0 = Instant::now();
        let mut t = PeerTable::new(&entries(), Duration::from_secs(5));
        assert_eq!(t.infos(t0)[0].state, PeerState::Down);
        assert_eq!(t.infos(t0)[0].reason.as_deref(), Some("connecting"));
        t.outbound_up("c1");
        t.advert("c1", Some(offer()), true, t0);
        t.echo("c1", Duration::from_micros(350), t0);
        let up = &t.infos(t0 + Duration::from_secs(1))[0];
        assert_eq!(up.state, PeerState::Up);
        assert_eq!(up.offer, Some(offer()));
        assert_eq!((up.lag_us, up.heard_ms_ago), (Some(350), Some(1000)));
        // Silent for longer than the timeout: down, and its offer no longer shown.
        let silent = &t.infos(t0 + Duration::from_secs(6))[0];
        assert_eq!(silent.state, PeerState::Down);
        assert_eq!(silent.offer, None);
        assert!(
            silent
                .reason
                .as_deref()
                .unwrap()
                .contains("not heard for 6.0 s")
        );
        // Heard, but its agent cannot reach its MM: down, with why.
        t.advert("c1", Some(offer()), false, t0);
        let headless = &t.infos(t0)[0];
        assert_eq!(headless.state, PeerState::Down);
        assert!(
            headless
                .reason
                .as_deref()
                .unwrap()
                .contains("machine manager")
        );
        // Its link breaks: down, with why.
        t.outbound_failed("c1", "connection refused".into(), false);
        let broken = &t.infos(t0)[0];
        assert_eq!(
            (broken.state, broken.reason.as_deref()),
            (PeerState::Down, Some("connection refused"))
        );
    }

    #[test]
    fn a_refusal_either_way_shows_with_its_reason() {
        let t0 = Instant::now();
        let mut t = PeerTable::new(&entries(), Duration::from_secs(5));
        t.outbound_failed("c1", "does not hold the key".into(), true);
        assert_eq!(t.infos(t0)[0].state, PeerState::Refused);
        t.outbound_up("c1");
        t.inbound_refused("c1", "claiming \"c1\" does not hold the key".into(), t0);
        let info = &t.infos(t0)[0];
        assert_eq!(info.state, PeerState::Refused);
        assert!(info.reason.as_deref().unwrap().contains("does not hold"));
        // A later good advert clears it.
        t.advert("c1", None, true, t0);
        assert_eq!(t.infos(t0)[0].state, PeerState::Up);
        // Names it does not list change nothing.
        t.advert("c7", Some(offer()), true, t0);
        assert_eq!(t.infos(t0).len(), 1);
    }
}
