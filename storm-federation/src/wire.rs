//! The link between two peer clusters' agents: a handshake that proves the pair key both
//! ways, then sealed frames ([`storm_cluster::sealed`]) of
//! [`PeerMessage`](storm_cluster::federation::PeerMessage)s.
//!
//! 1. dialling agent → listening agent: [`PeerHello`] (link version, the dialler's cluster
//!    name, the name of the cluster it means to reach, a fresh nonce), in the clear;
//! 2. listening → dialling: [`ListenerHello`] (its fresh nonce and its proof of the key it
//!    shares with the cluster the dialler claims to be);
//! 3. dialling → listening: [`DiallerProof`], its proof of the same key.
//!
//! The transcript ([`Transcript::peer`]) binds both names and both nonces under a label of
//! its own, so a proof made for one pair, or in any other kind of storm handshake, proves
//! nothing here. The listener picks the key by the name the dialler claims: an agent that
//! holds the key of pair (c0, c1) cannot pass as c2, nor reach a cluster that does not list
//! it. Refusals name what was wrong, on the side that can see it.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use storm_cluster::sealed::{Link, WireError, link, recv_plain, send_plain};
use storm_primitives::tcp::auth::{ClusterKey, NONCE_LEN, Transcript, random_bytes};

/// The peer link's version, checked in the handshake. Version 2: flocking (`Want`, `Submit`,
/// `Events`). Version 3: `Want` and `Events` name the sending of each job (`since_ms`), so
/// that a follower of an earlier sending (an agent frozen while its home sent the job again)
/// is cancelled and its events are not taken for the new one's. Version 4: borrowing
/// (`Borrow`, `GiveBack`). Version 5: a lender calls lent nodes home with its reason
/// (`Recall`). Version 6: a flocked job's standard input (`Input`). Version 7: each node of
/// a `Lent` says whether it was lent on the borrower's asking (only those go home when given
/// back, so only those are held out of the borrower's allocation once given back). Version 8:
/// a flocked job's request carries `kill_on_bad_exit` and `exit_wait_s`.
pub const PEER_VERSION: u32 = 8;

/// The largest sealed frame either side takes: a flocked job's request (its arguments and
/// environment), or a message of its events.
pub const FRAME_LIMIT: usize = 4 << 20;

/// The dialler's greeting.
#[derive(Debug, Serialize, Deserialize)]
pub struct PeerHello {
    pub version: u32,
    /// The dialler's cluster.
    pub from: String,
    /// The cluster it means to reach.
    pub to: String,
    pub nonce: [u8; NONCE_LEN],
}

/// The listener's answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct ListenerHello {
    pub nonce: [u8; NONCE_LEN],
    pub proof: [u8; 32],
}

/// The dialler's proof.
#[derive(Debug, Serialize, Deserialize)]
pub struct DiallerProof {
    pub proof: [u8; 32],
}

/// Cluster names longer than this are refused before anything else is looked at.
const MAX_NAME: usize = 255;

/// The dialling side, as cluster `me` reaching cluster `them` under the key the two share.
pub fn handshake_as_dialler<R: Read, W: Write>(
    mut r: R,
    mut w: W,
    key: &ClusterKey,
    me: &str,
    them: &str,
) -> Result<Link<R, W>, WireError> {
    let nonce = random_bytes::<NONCE_LEN>();
    send_plain(
        &mut w,
        &PeerHello {
            version: PEER_VERSION,
            from: me.to_string(),
            to: them.to_string(),
            nonce,
        },
    )?;
    let answer: ListenerHello = recv_plain(&mut r).map_err(|e| match e {
        WireError::Closed => WireError::Refused(format!(
            "{them}'s peer agent closed the link during the handshake (does it list {me} as a \
             peer, and hold the same pair key? its log says which)"
        )),
        other => other,
    })?;
    let t = Transcript::peer(me, them, &nonce, &answer.nonce);
    if !t.verify(key, &answer.proof, true) {
        return Err(WireError::Refused(format!(
            "the agent at {them}'s address does not hold the key {me} shares with {them}"
        )));
    }
    send_plain(
        &mut w,
        &DiallerProof {
            proof: t.client_proof(key),
        },
    )?;
    Ok(link(&t, key, true, r, w, FRAME_LIMIT))
}

/// The listening side, as cluster `me`: which peer dialled, and the link. `key_of` gives the
/// key this cluster shares with a peer it lists (`None`: not a peer of this cluster).
pub fn handshake_as_listener<R: Read, W: Write>(
    mut r: R,
    mut w: W,
    me: &str,
    key_of: impl Fn(&str) -> Option<ClusterKey>,
) -> Result<(String, Link<R, W>), WireError> {
    let hello: PeerHello = recv_plain(&mut r)?;
    if hello.version != PEER_VERSION {
        return Err(WireError::Refused(format!(
            "a peer agent speaks peer link version {}, this one {PEER_VERSION}",
            hello.version
        )));
    }
    if hello.from.len() > MAX_NAME || hello.to.len() > MAX_NAME {
        return Err(WireError::Refused(
            "a peer agent sent a cluster name longer than 255 bytes".into(),
        ));
    }
    if hello.to != me {
        return Err(WireError::Refused(format!(
            "a peer agent claiming {:?} meant to reach cluster {:?}, and this is {me:?}",
            hello.from, hello.to
        )));
    }
    let Some(key) = key_of(&hello.from) else {
        return Err(WireError::Refused(format!(
            "a peer agent claims cluster {:?}, which is not a [[peer]] of this cluster",
            hello.from
        )));
    };
    let nonce = random_bytes::<NONCE_LEN>();
    let t = Transcript::peer(&hello.from, me, &hello.nonce, &nonce);
    send_plain(
        &mut w,
        &ListenerHello {
            nonce,
            proof: t.server_proof(&key),
        },
    )?;
    let proof: DiallerProof = recv_plain(&mut r)?;
    if !t.verify(&key, &proof.proof, false) {
        return Err(WireError::Refused(format!(
            "a peer agent claiming {:?} does not hold the key this cluster shares with it",
            hello.from
        )));
    }
    Ok((hello.from, link(&t, &key, false, r, w, FRAME_LIMIT)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use storm_cluster::federation::{Offer, PeerMessage};

    type Dialled = Result<Link<UnixStream, UnixStream>, WireError>;
    type Listened = Result<(String, Link<UnixStream, UnixStream>), WireError>;

    /// `me` dials `them` with `key`; the listener (`listener`) knows the keys in `keys`.
    fn handshake(
        me: &str,
        them: &str,
        key: &ClusterKey,
        listener: &str,
        keys: Vec<(&'static str, ClusterKey)>,
    ) -> (Dialled, Listened) {
        let (a, b) = UnixStream::pair().unwrap();
        let (me, them, key) = (me.to_string(), them.to_string(), key.clone());
        let dialler = std::thread::spawn(move || {
            let r = a.try_clone().unwrap();
            handshake_as_dialler(r, a, &key, &me, &them)
        });
        let r = b.try_clone().unwrap();
        let listened = handshake_as_listener(r, b, listener, |name| {
            keys.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, k)| k.clone())
        });
        (dialler.join().unwrap(), listened)
    }

    #[test]
    fn peers_with_their_pair_key_get_a_sealed_link_both_ways() {
        let key = ClusterKey::random();
        let (dialled, listened) = handshake("c0", "c1", &key, "c1", vec![("c0", key.clone())]);
        let mut dialled = dialled.unwrap();
        let (who, mut listened) = listened.unwrap();
        assert_eq!(who, "c0");
        let advert = PeerMessage::Advert {
            offer: Some(Offer {
                idle_nodes: 2,
                idle_cpus: 8,
                nodes: 4,
                queued: 0,
            }),
            manager: true,
            token: 42,
        };
        dialled.writer.send(&advert).unwrap();
        assert_eq!(listened.reader.recv::<PeerMessage>().unwrap(), advert);
        listened
            .writer
            .send(&PeerMessage::Echo { token: 42 })
            .unwrap();
        assert_eq!(
            dialled.reader.recv::<PeerMessage>().unwrap(),
            PeerMessage::Echo { token: 42 }
        );
    }

    #[test]
    fn a_wrong_key_an_unlisted_cluster_or_a_false_name_is_refused_by_name() {
        let (k01, k02) = (ClusterKey::random(), ClusterKey::random());
        // The dialler lacks the key: it sees the listener's proof fail, and leaves.
        let (dialled, listened) = handshake(
            "c0",
            "c1",
            &ClusterKey::random(),
            "c1",
            vec![("c0", k01.clone())],
        );
        let e = dialled.err().unwrap().to_string();
        assert!(e.contains("does not hold the key c0 shares with c1"), "{e}");
        assert!(matches!(listened, Err(WireError::Closed)));
        // A cluster the listener does not list.
        let (_, listened) = handshake("c9", "c1", &k01, "c1", vec![("c0", k01.clone())]);
        let e = listened.err().unwrap().to_string();
        assert!(e.contains("\"c9\", which is not a [[peer]]"), "{e}");
        // The holder of c0's pair key claims to be c2: c2's key is another. The listener
        // proves c2's key, which the dialler cannot check, and the link goes no further.
        let (dialled, listened) = handshake(
            "c2",
            "c1",
            &k01,
            "c1",
            vec![("c0", k01.clone()), ("c2", k02.clone())],
        );
        let e = dialled.err().unwrap().to_string();
        assert!(e.contains("does not hold the key c2 shares with c1"), "{e}");
        assert!(listened.is_err(), "no link for a false name");
        // A dialler that meant another cluster.
        let (_, listened) = handshake("c0", "c5", &k01, "c1", vec![("c0", k01.clone())]);
        let e = listened.err().unwrap().to_string();
        assert!(e.contains("meant to reach cluster \"c5\""), "{e}");
    }

    #[test]
    fn a_dialler_that_answers_without_the_key_is_refused_by_the_listener() {
        use storm_cluster::sealed::{recv_plain, send_plain};
        let key = ClusterKey::random();
        let (a, b) = UnixStream::pair().unwrap();
        let forger = std::thread::spawn(move || {
            let mut w = a.try_clone().unwrap();
            let mut r = a;
            send_plain(
                &mut w,
                &PeerHello {
                    version: PEER_VERSION,
                    from: "c0".into(),
                    to: "c1".into(),
                    nonce: [1; NONCE_LEN],
                },
            )
            .unwrap();
            // It ignores the listener's proof, and answers with a guess.
            let _: ListenerHello = recv_plain(&mut r).unwrap();
            send_plain(&mut w, &DiallerProof { proof: [7; 32] }).unwrap();
        });
        let r = b.try_clone().unwrap();
        let listened = handshake_as_listener(r, b, "c1", |n| (n == "c0").then(|| key.clone()));
        forger.join().unwrap();
        let e = listened.err().unwrap().to_string();
        assert!(e.contains("claiming \"c0\" does not hold the key"), "{e}");
    }
}
