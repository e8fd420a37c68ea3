//! Borrowing nodes over the peer links (docs/federation.md, lending).
//!
//! **Borrower.** The reporter fetches this cluster's [`BorrowOrder`]s from its MM every
//! period; the dialler to each lender sends that lender's order as it stands: a
//! [`PeerMessage::Borrow`] while jobs lack nodes, a [`PeerMessage::GiveBack`] while borrowed
//! nodes sit idle. Each is sent again every period, so a lost message or a restarted agent
//! costs a period, never a node.
//!
//! **Lender.** The listener passes a peer's `Borrow` and `GiveBack` to this cluster's MM
//! ([`Request::LendAsked`], [`Request::GiveBack`]), for peers this cluster lends to. The MM
//! decides: it lends only idle nodes, only while no job of its own waits, and takes back only
//! what it lent on asking or calls home.
//!
//! **Calling nodes home.** The reporter fetches the lent nodes this cluster's MM calls home
//! ([`Request::Recalls`]) every period, and the dialler to each borrower sends it its
//! [`PeerMessage::Recall`] as it stands, every period until they are home. The borrower's
//! listener passes it to its MM ([`Request::Recalled`]), which preempts its jobs there with
//! the owner's reason and gives the nodes back.

use std::collections::HashMap;

use storm_cluster::control::{Reply, Request};
use storm_cluster::federation::{BorrowOrder, LentNode, PeerMessage, Recalled};

use crate::flock::Manager;

/// This cluster's orders to its lenders, as its MM last gave them, and the lenders' last
/// answers.
#[derive(Debug, Default)]
pub struct Borrowing {
    orders: HashMap<String, BorrowOrder>,
    answers: HashMap<String, Vec<LentNode>>,
}

impl Borrowing {
    pub fn set_orders(&mut self, orders: Vec<BorrowOrder>) {
        self.orders = orders.into_iter().map(|o| (o.peer.clone(), o)).collect();
    }

    /// Lender `peer` answered that it lends this cluster `nodes` (of those asked for).
    pub fn answered(&mut self, peer: &str, nodes: Vec<LentNode>) {
        self.answers.insert(peer.to_string(), nodes);
    }

    /// The lenders' answers heard since the last call, for the MM (each lender's latest).
    pub fn take_answers(&mut self) -> Vec<(String, Vec<LentNode>)> {
        self.answers.drain().collect()
    }

    /// What goes to lender `peer` this period.
    pub fn messages_for(&self, peer: &str) -> Vec<PeerMessage> {
        let Some(o) = self.orders.get(peer) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if o.count > 0 {
            out.push(PeerMessage::Borrow {
                nodes: o.want.clone(),
                count: o.count,
                for_ms: o.for_ms,
            });
        }
        if !o.give_back.is_empty() {
            out.push(PeerMessage::GiveBack {
                nodes: o.give_back.clone(),
            });
        }
        out
    }
}

/// The lent nodes this cluster's MM calls home, by borrower, as it last said.
#[derive(Debug, Default)]
pub struct Recalls {
    by_peer: HashMap<String, Vec<Recalled>>,
}

impl Recalls {
    pub fn set(&mut self, recalls: Vec<(String, Vec<Recalled>)>) {
        self.by_peer = recalls.into_iter().collect();
    }

    /// What goes to borrower `peer` this period (nothing while none of its nodes is called
    /// home).
    pub fn message_for(&self, peer: &str) -> Option<PeerMessage> {
        let nodes = self.by_peer.get(peer).filter(|n| !n.is_empty())?;
        Some(PeerMessage::Recall {
            nodes: nodes.clone(),
        })
    }
}

/// Borrower side: lender `peer` calls `nodes` home; this cluster's MM preempts its jobs there.
pub fn recalled(mm: &Manager, peer: &str, nodes: Vec<Recalled>) -> Result<(), String> {
    done(
        mm,
        &Request::Recalled {
            peer: peer.to_string(),
            nodes,
        },
    )
}

/// Lender side: peer `peer` asks for up to `count` of `nodes` for `for_ms`; what this
/// cluster's MM lent it of them, and how.
pub fn lend(
    mm: &Manager,
    peer: &str,
    nodes: Vec<String>,
    count: u32,
    for_ms: u64,
) -> Result<Vec<LentNode>, String> {
    let ask = Request::LendAsked {
        peer: peer.to_string(),
        nodes,
        count,
        for_ms,
    };
    match mm.call(&ask)? {
        Reply::Lent(nodes) => Ok(nodes),
        Reply::Error(e) => Err(e),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// Lender side: peer `peer` gives back `nodes`.
pub fn give_back(mm: &Manager, peer: &str, nodes: Vec<String>) -> Result<(), String> {
    done(
        mm,
        &Request::GiveBack {
            peer: peer.to_string(),
            nodes,
        },
    )
}

/// Asks this cluster's MM `req`, which it answers with `Done` or an error.
fn done(mm: &Manager, req: &Request) -> Result<(), String> {
    match mm.call(req)? {
        Reply::Done => Ok(()),
        Reply::Error(e) => Err(e),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(peer: &str, count: u32, give_back: &[&str]) -> BorrowOrder {
        BorrowOrder {
            peer: peer.into(),
            want: vec!["n0".into(), "n1".into()],
            count,
            for_ms: 60_000,
            give_back: give_back.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Each lender hears its own order only: an asking while jobs lack nodes, a giving back
    /// while borrowed nodes are idle, and nothing once the MM wants nothing of it.
    #[test]
    fn each_lender_hears_its_own_order_as_it_stands() {
        let mut b = Borrowing::default();
        b.set_orders(vec![order("c1", 1, &[]), order("c2", 0, &["n3"])]);
        assert_eq!(
            b.messages_for("c1"),
            vec![PeerMessage::Borrow {
                nodes: vec!["n0".into(), "n1".into()],
                count: 1,
                for_ms: 60_000
            }]
        );
        assert_eq!(
            b.messages_for("c2"),
            vec![PeerMessage::GiveBack {
                nodes: vec!["n3".into()]
            }]
        );
        b.set_orders(vec![order("c2", 0, &["n3"])]);
        assert!(
            b.messages_for("c1").is_empty(),
            "c1 is asked for nothing now"
        );
    }

    /// Each borrower hears only of its own nodes called home, and nothing once they are home.
    #[test]
    fn each_borrower_hears_of_its_own_nodes_called_home() {
        let mut r = Recalls::default();
        let n0 = Recalled {
            node: "n0".into(),
            why: "reclaimed for its job 7, which waits there".into(),
        };
        r.set(vec![("c0".into(), vec![n0.clone()]), ("c2".into(), vec![])]);
        assert_eq!(
            r.message_for("c0"),
            Some(PeerMessage::Recall { nodes: vec![n0] })
        );
        assert_eq!(r.message_for("c2"), None, "nothing of c2's is called home");
        assert_eq!(r.message_for("c9"), None);
        r.set(vec![]);
        assert_eq!(r.message_for("c0"), None, "home now: nothing more to say");
    }

    /// A lender's latest answer reaches the MM once: an answer passed on is not news again.
    #[test]
    fn each_answer_is_passed_on_once_the_latest_of_its_lender() {
        let lent = |node: &str| LentNode {
            node: node.into(),
            on_asking: true,
        };
        let mut b = Borrowing::default();
        b.answered("c1", vec![lent("n0")]);
        b.answered("c1", vec![lent("n0"), lent("n1")]);
        assert_eq!(
            b.take_answers(),
            vec![("c1".to_string(), vec![lent("n0"), lent("n1")])]
        );
        assert!(b.take_answers().is_empty());
    }
}
