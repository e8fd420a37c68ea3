//! The fuzz targets: each decoder of bytes storm receives, followed by the first checks its
//! receiver makes on what it decoded (an index that is validated is only as good as the
//! validation).
//!
//! | target | bytes from | decoder |
//! | --- | --- | --- |
//! | `tcp-frame` | a tcp link (after the handshake: a key holder) | `tcp::wire::read_frame` |
//! | `rm-message` | global memory (heartbeats, reports, output, membership, PMI fences) | `messages::decode` |
//! | `control` | the MM's Unix socket (any local user) and its replies | `control::recv_within` |
//! | `journal` | the MM's journal on disk | `journal::decode_record` |
//! | `cluster-file` | the cluster file | `ClusterConfig::parse`, then `RmLayout::new` |
//! | `hostlist` | command lines, the cluster file, the control socket | `NodeSet::from_str` |
//! | `task-spec` | a PL's standard input, from its NM | `PlSpec::decode` |
//! | `ofi-bootstrap` | another node's slot in the ofi bootstrap | `PeerRecord::decode` |
//! | `pmi` | an MPI task's `PMI_FD` (any program a user runs) | `pmi::wire::Framer`, then `PmiJob::handle` |
//! | `pmix-helper` | the NM's PMIx helper (which parses any local user's PMIx connections) | `storm_pmix::wire::read_frame`, then `PmiJob`'s PMIx calls |
//! | `enrollment` | the enrolled nodes' keys (`nodes.pub`) and the MM's public keys (`mm.pub`) | `identity::Enrolled::parse`, `identity::parse_public` |
//! | `relay` | the manager-side control relay's TCP port (anyone on the network) | `relay::wire::handshake_as_manager` |
//! | `peer` | a peer agent's `[federation] listen` port (anyone on the network), and a peer link's messages (a holder of the pair key) | `storm_federation::wire::handshake_as_listener`, `PeerMessage` |
//! | `replica` | a replica's mailboxes in the managers' fabric (a holder of the group's key) | `replica::mailbox::Inbox::take`, then `replica::decode_peer_message` |
//! | `node-record` | a node's sample, health, usage and inventory slots in the MM's global memory | `sample::NodeSample::decode`, `health::NodeHealth::decode`, `usage::NodeUsage::decode`, `sample::NodeInventory::decode` |
//!
//! A target's check returns whether the input was accepted (decoded and passed the checks);
//! the acceptance rate tells whether the mutator still reaches past the first bytes.
//!
//! Why this file is over 1,000 lines: the table above is the whole attack surface of bytes
//! storm decodes, and each target is its decoder, its first checks and its seeds side by side
//! (a seed must be what the decoder takes); one module per target is the next step when a
//! target is added.

use std::io::{Cursor, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::Serialize;
use storm_cluster::control::{self, JobInfo, JobOutcome, JobRequest, NodeInfo, Reply, Request};
use storm_cluster::identity::{MmSigner, MmVerifier};
use storm_cluster::messages::{
    self, Command, FileInfo, Heartbeat, HeldJob, Inventory, LaunchSpec, Membership, NodeReport,
    OutputChunk, PmiFenced, PmiUp, Program, RankStatus, SealedMembership, Stream,
};
use storm_cluster::tasks::{Capacity, TaskRequest};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_mm::journal::{self, JobRecord, JobState, NodeRecord};
use storm_mm::nodes::NmProcess;
use storm_nm::pmi::job::{Effect, JobFacts, PmiJob, process_mapping};
use storm_nm::pmi::wire::Framer;
use storm_pl::PlSpec;
use storm_primitives::ofi::bootstrap::PeerRecord;
use storm_primitives::tcp::wire::{
    self, CawMsg, CawRequest, Control, Hello, OpKey, OutFrame, XferBegin, XferMsg,
};
use storm_primitives::{NodeSet, PrimError, Relation};

/// One decoder under test.
pub struct Target {
    pub name: &'static str,
    /// Valid inputs the mutator starts from.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Tokens of the format, inserted by the mutator.
    pub dictionary: &'static [&'static [u8]],
    /// Decodes and checks one input; true if it was accepted.
    pub check: fn(&[u8]) -> bool,
    /// The largest allocation a checked length may cause (a limit the decoder enforces
    /// before it allocates), beyond what the input's own size explains.
    pub checked_allocation: usize,
}

/// Every target, in the order of the table above.
pub fn all() -> &'static [Target] {
    TARGETS
}

/// The target called `name`.
pub fn by_name(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

static TARGETS: &[Target] = &[
    Target {
        name: "tcp-frame",
        seeds: tcp_frame_seeds,
        dictionary: &[b"STRM", &[1], &[2]],
        check: tcp_frame,
        checked_allocation: TCP_FRAME_LIMIT,
    },
    Target {
        name: "rm-message",
        seeds: rm_message_seeds,
        dictionary: &[],
        check: rm_message,
        checked_allocation: 0,
    },
    Target {
        name: "control",
        seeds: control_seeds,
        dictionary: &[],
        check: control_frame,
        checked_allocation: 0,
    },
    Target {
        name: "journal",
        seeds: journal_seeds,
        dictionary: &[],
        check: journal_record,
        checked_allocation: 0,
    },
    Target {
        name: "cluster-file",
        seeds: cluster_file_seeds,
        dictionary: &[
            b"[cluster]",
            b"[[node]]",
            b"[tcp]",
            b"[limits]",
            b"name = ",
            b"address = \"127.0.0.1:1\"\n",
            b"max_jobs = ",
            b"max_tasks_per_node = ",
            b"heartbeat_bytes = ",
            b"cpus = ",
            b"fanout = ",
            b"0",
            b"4294967295",
            b"18446744073709551615",
            b"-1",
            b"1e308",
            b"\"",
            b"\n",
        ],
        check: cluster_file,
        // A hostlist may name up to MAX_EXPANSION nodes; each costs its entry, its name and
        // its output queue's layout entries (well under 1 KiB).
        checked_allocation: storm_cluster::hostlist::MAX_EXPANSION * 1024,
    },
    Target {
        name: "hostlist",
        seeds: hostlist_seeds,
        dictionary: &[
            b"[",
            b"]",
            b"-",
            b",",
            b" ",
            b"0",
            b"4294967295",
            b"4294967296",
            b"99999999999999999999",
        ],
        check: hostlist,
        checked_allocation: 0,
    },
    Target {
        name: "task-spec",
        seeds: task_spec_seeds,
        dictionary: &[],
        check: task_spec,
        checked_allocation: 0,
    },
    Target {
        name: "ofi-bootstrap",
        seeds: ofi_bootstrap_seeds,
        dictionary: &[b"1IFO", &[0xff, 0xff, 0xff, 0xff]],
        check: ofi_bootstrap,
        checked_allocation: 0,
    },
    Target {
        name: "pmi",
        seeds: pmi_seeds,
        dictionary: &[
            b"cmd=",
            b"mcmd=",
            b" ",
            b"=",
            b";",
            b"\n",
            b"init pmi_version=1 pmi_subversion=1",
            b"init pmi_version=2 pmi_subversion=0",
            b"put kvsname=storm-9 key=",
            b" value=",
            b"get kvsname=storm-9 key=",
            b"barrier_in",
            b"kvs-fence;",
            b"kvs-put;key=",
            b"kvs-get;key=",
            b"info-putnodeattr;key=",
            b"finalize",
            b"abort",
            b"PMI_process_mapping",
            b"999999",
            b"000000",
        ],
        check: pmi,
        checked_allocation: 0,
    },
    Target {
        name: "pmix-helper",
        seeds: pmix_helper_seeds,
        dictionary: &[&[0, 0, 0, 0], &[7], b"storm-9", &[0xff, 0xff]],
        check: pmix_helper,
        // A frame's body is allocated once its length passed the NM's bound (one node's
        // fence data and 1 MiB), before it is read.
        checked_allocation: PMIX_HELPER_MAX,
    },
    Target {
        name: "enrollment",
        seeds: enrollment_seeds,
        dictionary: &[b" ", b"\n", b"#", b"node1", b"0123456789abcdef"],
        check: enrollment,
        checked_allocation: 0,
    },
    Target {
        name: "relay",
        seeds: relay_seeds,
        dictionary: &[&[1], &[0x20]],
        check: relay,
        checked_allocation: 4096,
    },
    Target {
        name: "peer",
        seeds: peer_seeds,
        dictionary: &[&[1], &[2, b'c', b'0'], &[2, b'c', b'1']],
        check: peer,
        checked_allocation: 4096,
    },
    Target {
        name: "replica",
        seeds: replica_seeds,
        dictionary: &[&[1, 0, 0, 0, 0, 0, 0, 0], &[0x08], &[0x22]],
        check: replica,
        // protobuf reserves room for a bytes field's claimed length up to 10,000,000 bytes
        // before reading it (its own bound; the rest it grows as bytes arrive). Only a
        // holder of the group's key writes a mailbox.
        checked_allocation: 10_000_000,
    },
    Target {
        name: "node-record",
        seeds: node_record_seeds,
        // A sequence number that closes what it opens, and the two versions.
        dictionary: &[
            &[7, 0, 0, 0, 0, 0, 0, 0],
            &[1],
            &[0x81],
            &[0xC1],
            &[0xA1],
            &[100],
            &[101],
        ],
        check: node_record,
        checked_allocation: 0,
    },
];

fn bincode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).expect("seed encodes")
}

/// One selector byte, then the encoding: targets with several message types.
fn tagged<T: Serialize>(tag: u8, value: &T) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend(bincode(value));
    v
}

fn nodes(text: &str) -> NodeSet {
    text.parse().expect("seed node set")
}

// --- tcp frames -------------------------------------------------------------------------

/// The body limit the frames are read with: small, so that a length check that is missing
/// would show as an allocation past it.
const TCP_FRAME_LIMIT: usize = 64 << 10;

fn tcp_frame_seeds() -> Vec<Vec<u8>> {
    let key = OpKey { origin: 0, seq: 7 };
    let begin = XferBegin {
        key,
        dest: nodes("1-3"),
        fanout: 2,
        offset: 4096,
        len: 12,
        remote_event: Some(3),
        timeout_ms: 5000,
        on_arrival: false,
    };
    let caw = CawRequest {
        key,
        dest: nodes("1-15"),
        fanout: 2,
        var: 9,
        rel: Relation::Ge,
        value: 4,
        write: Some((10, 1)),
        timeout_ms: 5000,
    };
    let controls = [
        Control::Hello(Hello {
            node: 2,
            cluster_size: 4,
            layout_fingerprint: 0xfeed,
            protection: 1,
            nonce: [7; 32],
        }),
        Control::Challenge {
            nonce: [1; 32],
            proof: [2; 32],
        },
        Control::Proof([3; 32]),
        Control::Identify(vec![4; 64]),
        Control::HelloAck,
        Control::HelloReject("refused".into()),
        Control::Xfer(XferMsg::Begin(begin)),
        Control::Xfer(XferMsg::Nack(key, PrimError::TransferFailed("full".into()))),
        Control::Xfer(XferMsg::Commit(key)),
        Control::Caw(CawMsg::Request(caw)),
        Control::Caw(CawMsg::Vote(key, true)),
        Control::Caw(CawMsg::Done(
            key,
            Err(PrimError::Timeout {
                nodes: nodes("3"),
                timeout_ms: 5,
                detail: "slow".into(),
            }),
        )),
    ];
    let mut seeds: Vec<Vec<u8>> = controls
        .iter()
        .map(|c| OutFrame::control(c).to_vec())
        .collect();
    seeds.push(OutFrame::data(key, 4096, Bytes::from_static(b"hello, nodes")).to_vec());
    seeds
}

fn tcp_frame(input: &[u8]) -> bool {
    wire::read_frame(&mut Cursor::new(input), TCP_FRAME_LIMIT).is_ok()
}

// --- enrolled keys --------------------------------------------------------------------------

fn enrollment_seeds() -> Vec<Vec<u8>> {
    let a = storm_cluster::identity::public_hex(&mm_key().verifying_key());
    let b = storm_cluster::identity::public_hex(
        &ed25519_dalek::SigningKey::from_bytes(&[0x44; 32]).verifying_key(),
    );
    vec![
        format!("# enrolled\nnode0 {a}\nnode1 {b}\n").into_bytes(),
        format!("{a}\n{b}\n").into_bytes(),
    ]
}

/// What the MM reads from `nodes.pub` (and an NM from `mm.pub`, one key per line): the keys,
/// then what a handshake does with one (verify a signature).
fn enrollment(input: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(input) else {
        return false;
    };
    let enrolled = storm_cluster::identity::Enrolled::parse(text);
    let keys: Vec<_> = text
        .lines()
        .filter_map(|l| storm_cluster::identity::parse_public(l).ok())
        .collect();
    for key in &keys {
        use ed25519_dalek::Verifier;
        let _ = key.verify(
            b"handshake",
            &ed25519_dalek::Signature::from_bytes(&[7; 64]),
        );
    }
    enrolled.is_ok() || !keys.is_empty()
}

// --- the control relay's handshake ------------------------------------------------------------

fn relay_frame<T: Serialize>(value: &T) -> Vec<u8> {
    let body = bincode(value);
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&body);
    f
}

fn relay_seeds() -> Vec<Vec<u8>> {
    use storm_cli::relay::wire::{NodeHello, NodeProof, RELAY_VERSION};
    let mut both = relay_frame(&NodeHello {
        version: RELAY_VERSION,
        node: 1,
        nonce: [3; 32],
    });
    both.extend(relay_frame(&NodeProof {
        proof: [5; 32],
        signature: vec![6; 64],
    }));
    vec![both]
}

/// What the manager side of the relay makes of bytes from anyone on the network: a node's
/// greeting and proof. Accepted: decoded as far as the checks of the cluster key or the
/// node's identity (a forger without the keys gets no further).
fn relay(input: &[u8]) -> bool {
    use storm_cli::relay::wire::{FRAME_LIMIT, WireError, handshake_as_manager};
    use storm_primitives::tcp::auth::ClusterKey;
    let key = ClusterKey::from_bytes([9; 32]);
    let id = ed25519_dalek::SigningKey::from_bytes(&[0x44; 32]).verifying_key();
    match handshake_as_manager(
        Cursor::new(input),
        std::io::sink(),
        &key,
        4,
        |n| (n < 4).then_some(id),
        FRAME_LIMIT,
    ) {
        Ok(_) => true,
        Err(WireError::Refused(why)) => why.contains("cluster's key") || why.contains("identity"),
        Err(_) => false,
    }
}

// --- peer clusters' agents ---------------------------------------------------------------

fn peer_seeds() -> Vec<Vec<u8>> {
    use storm_cluster::federation::{Offer, PeerMessage};
    use storm_cluster::flock::FlockEvent;
    use storm_federation::wire::{DiallerProof, PEER_VERSION, PeerHello};
    let mut both = relay_frame(&PeerHello {
        version: PEER_VERSION,
        from: "c0".into(),
        to: "c1".into(),
        nonce: [3; 32],
    });
    both.extend(relay_frame(&DiallerProof { proof: [5; 32] }));
    let advert = PeerMessage::Advert {
        offer: Some(Offer {
            idle_nodes: 2,
            idle_cpus: 8,
            nodes: 4,
            queued: 1,
        }),
        manager: true,
        token: 77,
    };
    let events = PeerMessage::Events {
        job: 12,
        since_ms: 1_700_000_000_000,
        epoch: 0xfeed,
        first: 3,
        events: vec![
            FlockEvent::Accepted { remote: 40 },
            FlockEvent::Started {
                ntasks: 2,
                node_names: vec!["n0".into()],
            },
            FlockEvent::Output(storm_cluster::messages::OutputChunk {
                job: 40,
                rank: 1,
                stream: storm_cluster::messages::Stream::Stdout,
                offset: 5,
                data: b"hello".to_vec(),
            }),
            FlockEvent::Requeued {
                reason: "node n1 failed".into(),
            },
            FlockEvent::Refused("no account".into()),
            FlockEvent::NotHere,
        ],
    };
    vec![
        both,
        bincode(&advert),
        bincode(&PeerMessage::Echo { token: 9 }),
        bincode(&PeerMessage::Input {
            job: 12,
            since_ms: 1_700_000_000_000,
            piece: storm_cluster::flock::InputPiece {
                offset: 4096,
                data: b"line of input\n".to_vec(),
                eof: true,
            },
        }),
        bincode(&PeerMessage::Want {
            jobs: vec![
                storm_cluster::federation::Wanted {
                    job: 12,
                    since_ms: 1_700_000_000_000,
                    epoch: 0xfeed,
                    taken: 2,
                },
                storm_cluster::federation::Wanted {
                    job: 13,
                    since_ms: 1,
                    epoch: 0,
                    taken: 0,
                },
            ],
        }),
        bincode(&PeerMessage::Submit {
            job: 12,
            since_ms: 1_700_000_000_000,
            user: "alice".into(),
            req: Box::new(job_request()),
        }),
        bincode(&events),
        bincode(&PeerMessage::Borrow {
            nodes: vec!["node0".into(), "node1".into()],
            count: 2,
            for_ms: 3_660_000,
        }),
        bincode(&PeerMessage::GiveBack {
            nodes: vec!["node1".into()],
        }),
        bincode(&PeerMessage::Lent {
            nodes: vec![
                storm_cluster::federation::LentNode {
                    node: "node0".into(),
                    on_asking: true,
                },
                storm_cluster::federation::LentNode {
                    node: "node1".into(),
                    on_asking: false,
                },
            ],
        }),
        bincode(&PeerMessage::Recall {
            nodes: vec![storm_cluster::federation::Recalled {
                node: "node0".into(),
                why: "reclaimed for its job 7, which waits there".into(),
            }],
        }),
    ]
}

/// What a peer agent's listener makes of bytes from anyone on the network (a dialler's
/// greeting and proof), and what it makes of a frame's body once a link is up (a
/// [`PeerMessage`](storm_cluster::federation::PeerMessage), which only a holder of the pair
/// key can seal). Accepted: the handshake decoded as far as the key's check, or a message.
fn peer(input: &[u8]) -> bool {
    use storm_cluster::federation::PeerMessage;
    use storm_cluster::sealed::WireError;
    use storm_federation::wire::handshake_as_listener;
    use storm_primitives::tcp::auth::ClusterKey;
    let message = storm_primitives::codec::decode::<PeerMessage>(input).is_ok();
    let handshake = match handshake_as_listener(Cursor::new(input), std::io::sink(), "c1", |n| {
        (n == "c0").then(|| ClusterKey::from_bytes([9; 32]))
    }) {
        Ok(_) => true,
        Err(WireError::Refused(why)) => why.contains("does not hold the key"),
        Err(_) => false,
    };
    message || handshake
}

// --- a replica's mailboxes ---------------------------------------------------------------

/// A mailbox slot as a replica writes it: incarnation, sequence, length, message, sequence.
fn replica_slot(seq: u64, message: &[u8]) -> Vec<u8> {
    let mut v = 7u64.to_le_bytes().to_vec();
    v.extend(seq.to_le_bytes());
    v.extend((message.len() as u64).to_le_bytes());
    v.extend_from_slice(message);
    v.extend(seq.to_le_bytes());
    v
}

fn replica_seeds() -> Vec<Vec<u8>> {
    use storm_mm::journal::{Batch, Change};
    use storm_mm::replica::{checksum, entry, resync};
    let part = entry::split(
        &Batch {
            number: 3,
            changes: vec![Change::RemoveJob(9)],
            next_job: Some(10),
            unneeded: vec![],
        },
        1024,
    )
    .remove(0);
    // A Raft append from replica 1 to replica 2 carrying the part.
    let msg = raft::eraftpb::Message {
        msg_type: raft::eraftpb::MessageType::MsgAppend,
        to: 2,
        from: 1,
        term: 5,
        index: 1,
        entries: vec![
            raft::eraftpb::Entry {
                term: 5,
                index: 2,
                context: entry::CONTEXT.to_vec().into(),
                data: part.into(),
                ..Default::default()
            },
            raft::eraftpb::Entry {
                term: 5,
                index: 3,
                context: storm_mm::replica::program::FAR_CONTEXT.to_vec().into(),
                data: storm_mm::replica::program::Far {
                    job: 9,
                    total: 100 << 20,
                }
                .encode()
                .into(),
                ..Default::default()
            },
            raft::eraftpb::Entry {
                term: 5,
                index: 4,
                context: checksum::CONTEXT.to_vec().into(),
                data: checksum::Report {
                    replica: 0,
                    window: 3,
                    digest: [7; 32],
                }
                .encode()
                .into(),
                ..Default::default()
            },
        ]
        .into(),
        ..Default::default()
    };
    let msg = resync::Wire::raft(&msg).expect("a raft message encodes");
    let want = resync::Want {
        id: 4,
        offset: 0,
        at_least: 2,
    }
    .encode();
    let part = resync::Part {
        id: 4,
        total: 3,
        offset: 0,
        bytes: vec![1, 2],
    }
    .encode();
    // A group change in the log: a replica of a new generation added as a learner.
    let added = storm_mm::replica::member::raft_id(2, 40);
    let change = raft::eraftpb::ConfChange {
        change_type: raft::eraftpb::ConfChangeType::AddLearnerNode,
        node_id: added,
        ..Default::default()
    };
    let mut change_entry = raft::eraftpb::Entry {
        term: 5,
        index: 40,
        data: protobuf::Message::write_to_bytes(&change)
            .expect("a change encodes")
            .into(),
        ..Default::default()
    };
    change_entry.set_entry_type(raft::eraftpb::EntryType::EntryConfChange);
    let change = resync::Wire::raft(&raft::eraftpb::Message {
        msg_type: raft::eraftpb::MessageType::MsgAppend,
        to: 2,
        from: 1,
        term: 5,
        index: 39,
        entries: vec![change_entry].into(),
        ..Default::default()
    })
    .expect("a raft message encodes");
    use storm_mm::replica::member::Welcome;
    let admitted = resync::Wire::welcome(&Welcome::Admitted {
        id: added,
        index: 41,
        term: 5,
        conf: raft::eraftpb::ConfState::from((vec![1, 2], vec![added])),
    })
    .expect("a welcome encodes");
    let refused = resync::Wire::welcome(&Welcome::Refused {
        id: 3,
        why: "removed".into(),
    })
    .expect("a refusal encodes");
    // A slot at the mailbox's start holds a sequence number that is a multiple of the slots.
    let seq = storm_mm::replica::mailbox::SLOTS as u64;
    vec![
        replica_slot(seq, &msg),
        replica_slot(seq, &want),
        replica_slot(seq, &part),
        replica_slot(seq, &change),
        replica_slot(seq, &resync::Wire::join()),
        replica_slot(
            seq,
            &resync::Wire::want_copy(&storm_mm::replica::program::WantCopy {
                job: 9,
                offset: 1 << 20,
            }),
        ),
        replica_slot(
            seq,
            &resync::Wire::copy_part(&storm_mm::replica::program::Chunk {
                job: 9,
                offset: 1 << 20,
                total: 100 << 20,
                bytes: vec![7; 64],
            }),
        ),
        replica_slot(seq, &admitted),
        replica_slot(seq, &refused),
        // An empty Raft message.
        replica_slot(seq, &[0]),
    ]
}

/// What a replica makes of its mailbox from another: the slot's framing, then the message
/// (Raft's, a part of a state sent to a replica that diverged or a request for one, a request
/// to join the group or the answer to one, a part of a program copy or a request for one) and
/// what the Raft message's entries carry (journal parts, program chunks and notes, reports,
/// changes of the group). Accepted: a message with its entries decoded.
fn replica(input: &[u8]) -> bool {
    use storm_mm::replica::decode_peer_message;
    use storm_mm::replica::mailbox::{GroupLayout, Inbox};
    let group = GroupLayout::new(2, 4096);
    let fabric = storm_primitives::local::LocalFabric::new(2, group.layout.clone());
    let me = fabric.node(1);
    use storm_primitives::Primitives as _;
    let at = group.mailbox(0).offset;
    let len = input.len().min(group.max_message() + 64);
    if me.memory().write(at, &input[..len]).is_err() {
        return false;
    }
    let mut accepted = false;
    for (_, bytes) in Inbox::new(1, 2).take(&me, &group) {
        accepted |= decode_peer_message(&bytes).is_ok();
    }
    accepted |= decode_peer_message(input).is_ok();
    accepted
}

// --- RM messages through global memory ---------------------------------------------------

/// The sizes the daemons decode with (docs/architecture.md's example cluster).
const HEARTBEAT_BYTES: usize = 65536;
const REPORT_BYTES: usize = 4096;
const OUTPUT_BYTES: usize = 16384;
/// The default `[cluster] pmi_node_bytes` and `pmi_job_bytes`.
const PMI_NODE_BYTES: usize = 32 << 10;
const PMI_JOB_BYTES: usize = 1 << 20;
const MAX_JOBS: usize = 32;
const NODE_COUNT: u32 = 16;
const MAX_TASKS_PER_NODE: usize = 64;

fn launch_spec() -> LaunchSpec {
    LaunchSpec {
        job: 42,
        slot: 3,
        nodes: nodes("0-3"),
        ntasks: 8,
        program: Program::Spooled("a.out".into()),
        program_hash: Some([0x42; 32]),
        args: vec!["-n".into(), "5".into()],
        env: vec![("PATH".into(), "/usr/bin".into())],
        cwd: "/home/user".into(),
        uid: 1000,
        gid: 1000,
        reporter: 0,
        mpi: Default::default(),
        input: Default::default(),
        batch: Some(storm_cluster::messages::BatchLaunch {
            files: storm_cluster::messages::BatchOutput {
                output: "out-%j-%N.txt".into(),
                error: Some("err-%t".into()),
            },
            alloc_tasks: 8,
            array: Some((40, 2, 10)),
        }),
        mem: Some(256 << 20),
        kill_on_bad_exit: true,
        exit_wait_s: 30,
        cpu_bind: Some(storm_cluster::cpu_bind::CpuBind::Rank),
        cpus: Some(NodeSet::from_iter([2, 3])),
    }
}

/// The key the seeds' seals are made with, and what the targets check them with.
fn mm_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[0x33; 32])
}

const SEAL_CLUSTER: &str = "fuzz";
const SEAL_INCARNATION: u64 = 77;
const SEAL_MS: u64 = 1_700_000_000_000;

fn signer() -> MmSigner {
    MmSigner::new(mm_key(), SEAL_CLUSTER)
}

fn verifier() -> MmVerifier {
    MmVerifier::new(mm_key().verifying_key(), SEAL_CLUSTER)
}

/// A membership message as the MM writes it: sealed for node 1.
fn sealed_membership(msg: Membership) -> SealedMembership {
    SealedMembership {
        seal: signer().seal_membership(1, &msg, SEAL_MS),
        msg,
    }
}

fn rm_message_seeds() -> Vec<Vec<u8>> {
    let mut heartbeat = Heartbeat {
        seq: 99,
        commands: vec![
            Command::ReceiveFile(FileInfo {
                transfer: 1,
                job: 42,
                nodes: nodes("0-3"),
                size: 1 << 20,
                name: "a.out".into(),
                uid: 1000,
                gid: 1000,
            }),
            Command::Launch(launch_spec()),
            Command::Signal {
                job: 42,
                signal: 15,
            },
            Command::Forget { job: 41 },
            Command::LaunchPiece {
                job: 42,
                nodes: nodes("0-3"),
                index: 1,
                count: 3,
                bytes: vec![0x5a; 300],
            },
            Command::Input {
                job: 42,
                nodes: nodes("0"),
                offset: 4096,
                data: b"line of input\n".to_vec(),
                eof: true,
            },
            Command::Schedule {
                run: vec![42, 43],
                lease_us: 12_000,
            },
            Command::Lend {
                nodes: nodes("1"),
                peer: "c0".into(),
                until_ms: 1_700_000_600_000,
                grant: signer().grant_lease("c0", "node1", 1_700_000_600_000),
            },
            Command::EndLend { nodes: nodes("1") },
            Command::Shutdown,
        ],
        seal: None,
    };
    heartbeat.seal = signer().seal_commands(SEAL_INCARNATION, 99, &heartbeat.commands, SEAL_MS);
    vec![
        tagged(0, &heartbeat),
        tagged(
            1,
            &NodeReport {
                job: 42,
                statuses: vec![(0, RankStatus::Exited(0)), (1, RankStatus::Signaled(9))],
                timing: messages::NodeTiming {
                    verified_us: Some(40),
                    prepared_us: Some(300),
                    asked_us: Some(900),
                    first_started_us: Some(1_200),
                    last_exited_us: Some(9_000),
                    reported_us: 9_400,
                    usage: messages::JobUsage {
                        cpu_us: Some(8_000),
                        peak_memory_bytes: Some(3 << 20),
                        oom_kills: Some(1),
                    },
                },
                culprit: Some(1),
                first_ended: Some(1),
                waited: true,
            },
        ),
        tagged(
            2,
            &OutputChunk {
                job: 42,
                rank: 1,
                stream: Stream::Stderr,
                offset: 4096,
                data: b"warning: x\n".to_vec(),
            },
        ),
        tagged(
            3,
            &Inventory {
                stamp: 5,
                since_ms: 100,
                jobs: vec![HeldJob {
                    job: 42,
                    slot: 3,
                    ended: false,
                }],
                mem: 8 << 30,
                lease: Some(signer().grant_lease("c9", "node1", 1_700_000_600_000)),
            },
        ),
        tagged(
            4,
            &sealed_membership(Membership::Welcome {
                stamp: 5,
                output_epoch: 2,
                incarnation: 77,
                keep: vec![42],
            }),
        ),
        tagged(
            4,
            &sealed_membership(Membership::Start { stamp: 5, seq: 9 }),
        ),
        tagged(
            5,
            &PmiUp::Fence {
                job: 42,
                epoch: 1,
                pairs: vec![("card-0".into(), "tcp://127.0.0.1:5".into())],
            },
        ),
        tagged(
            5,
            &PmiUp::Abort {
                job: 42,
                rank: 3,
                code: Some(7),
                message: "MPI_Abort".into(),
            },
        ),
        tagged(
            6,
            &PmiFenced {
                job: 42,
                epoch: 1,
                pairs: vec![("card-0".into(), "tcp://127.0.0.1:5".into())],
            },
        ),
    ]
}

fn rm_message(input: &[u8]) -> bool {
    let Some((&tag, bytes)) = input.split_first() else {
        return false;
    };
    match tag % 7 {
        0 => messages::decode::<Heartbeat>("heartbeat", bytes, HEARTBEAT_BYTES)
            .map(|hb| {
                // What an NM checks before acting: the MM's seal, then each command.
                let _ = verifier().check_commands(
                    SEAL_INCARNATION,
                    hb.seq,
                    &hb.commands,
                    hb.seal.as_ref(),
                    SEAL_MS,
                );
                for c in &hb.commands {
                    match c {
                        Command::Launch(l) => {
                            let _ = l.problem(NODE_COUNT, MAX_JOBS, MAX_TASKS_PER_NODE);
                        }
                        Command::ReceiveFile(f) => {
                            let _ = f.problem(1 << 30);
                        }
                        _ => {}
                    }
                    let _ = c.nodes().map(|n| n.contains(NODE_COUNT - 1));
                }
            })
            .is_ok(),
        1 => sealed::<NodeReport>("report", bytes, REPORT_BYTES),
        2 => messages::decode::<OutputChunk>("output", bytes, OUTPUT_BYTES)
            .map(|chunk| {
                // What the MM does with a chunk: keep the bytes it has not seen.
                for seen in [0, chunk.offset, u64::MAX] {
                    let _ = chunk.unseen(seen);
                }
            })
            .is_ok(),
        3 => sealed::<Inventory>("inventory", bytes, messages::inventory_bytes(MAX_JOBS)),
        4 => {
            let limit = messages::membership_bytes(MAX_JOBS);
            let _ = messages::decode_sealed::<SealedMembership>("membership", bytes, limit);
            let area = messages::seal(bytes);
            messages::decode_sealed::<SealedMembership>("membership", &area, limit)
                .map(|m| {
                    let _ = verifier().check_membership(1, &m.msg, &m.seal, SEAL_MS);
                })
                .is_ok()
        }
        5 => sealed::<PmiUp>("PMI message", bytes, PMI_NODE_BYTES),
        _ => sealed::<PmiFenced>("PMI fence result", bytes, PMI_JOB_BYTES),
    }
}

/// What a daemon decodes from an area its writer overwrites in place: the input as a whole
/// area (its first bytes taken for the length and checksum, almost always refused), and the
/// input as the body of a sealed message (sealed here so that the checksum holds and the
/// body's decoder is what is fuzzed). Accepted if the body decodes.
fn sealed<T: serde::de::DeserializeOwned>(what: &'static str, bytes: &[u8], limit: usize) -> bool {
    let _ = messages::decode_sealed::<T>(what, bytes, limit);
    let area = messages::seal(bytes);
    messages::decode_sealed::<T>(what, &area, limit).is_ok()
}

// --- the control socket -------------------------------------------------------------------

/// `[limits] max_request_bytes` by default.
const MAX_REQUEST_BYTES: usize = 4 << 20;

fn job_request() -> JobRequest {
    JobRequest {
        name: "hello".into(),
        program: "/bin/hostname".into(),
        args: vec!["-s".into()],
        env: vec![("HOME".into(), "/home/user".into())],
        cwd: "/tmp".into(),
        tasks: TaskRequest {
            nodes: Some(2),
            ntasks: Some(4),
            ntasks_per_node: None,
            overcommit: false,
            exclusive: false,
        },
        delivery: storm_cluster::control::Delivery::Broadcast,
        time_limit_ms: Some(60_000),
        requeue: false,
        mpi: Default::default(),
        input: Default::default(),
        dependency: Some("afterok:1:2,singleton".parse().expect("a valid dependency")),
        batch: None,
        step_of: None,
        array: Some("0-9:2,20%3".parse().expect("a valid --array")),
        element: Some(storm_cluster::control::ArrayElement {
            array: 7,
            index: 4,
            count: 6,
            throttle: Some(3),
        }),
        token: Some(0x5eed_0fa5_ab1e),
        mem: Some(storm_cluster::control::MemRequest::PerCpu(512 << 20)),
        constraint: vec!["ib".into()],
        flock: storm_cluster::flock::Flock::Only(vec!["c0".into(), "c1".into()]),
        borrow: true,
        less: true,
        one_cluster: true,
        kill_on_bad_exit: true,
        exit_wait_s: 30,
        cpu_bind: Some(storm_cluster::cpu_bind::CpuBind::Rank),
    }
}

fn framed(tag: u8, body: Vec<u8>) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend((body.len() as u32).to_le_bytes());
    v.extend(body);
    v
}

fn control_seeds() -> Vec<Vec<u8>> {
    let requests = [
        Request::Hello { version: 4 },
        Request::Submit(Box::new(job_request())),
        Request::Cancel { job: 3 },
        Request::Input {
            job: 3,
            offset: 12,
            data: b"input".to_vec(),
            eof: false,
        },
        Request::Queue,
        Request::Drain {
            nodes: nodes("2-5"),
            reason: "disk".into(),
        },
        Request::Lend {
            nodes: nodes("0-1"),
            peer: "c0".into(),
            for_ms: 600_000,
        },
        Request::Reclaim {
            nodes: nodes("1"),
            now: false,
        },
        Request::Recalls,
        Request::Recalled {
            peer: "c1".into(),
            nodes: vec![storm_cluster::federation::Recalled {
                node: "n0".into(),
                why: "its lease ends at 12:00:00".into(),
            }],
        },
        Request::BorrowOut {
            lent: vec![(
                "c1".into(),
                vec![storm_cluster::federation::LentNode {
                    node: "n0".into(),
                    on_asking: true,
                }],
            )],
        },
        Request::LendAsked {
            peer: "c0".into(),
            nodes: vec!["n0".into(), "n1".into()],
            count: 1,
            for_ms: 3_600_000,
        },
        Request::GiveBack {
            peer: "c0".into(),
            nodes: vec!["n1".into()],
        },
        Request::Attach { job: 9 },
    ];
    let outcome = JobOutcome {
        job: 3,
        ranks: vec![Some(RankStatus::Exited(0)), None],
        reason: Some("node 1 failed".into()),
        abort_code: None,
        timing: Default::default(),
        usage: messages::JobUsage {
            cpu_us: Some(1_500_000),
            peak_memory_bytes: None,
            oom_kills: Some(1),
        },
        cause: Some(storm_cluster::control::EndCause::NodeFail),
        broadcast: true,
    };
    let replies = [
        Reply::Hello {
            version: 4,
            cluster: "prod".into(),
            nodes: 16,
        },
        Reply::Started {
            job: 3,
            ntasks: 4,
            nodes: nodes("0-1"),
            node_names: vec!["n0".into(), "n1".into()],
            time_slot: Some(1),
        },
        Reply::Output(OutputChunk {
            job: 3,
            rank: 0,
            stream: Stream::Stdout,
            offset: 0,
            data: b"hi\n".to_vec(),
        }),
        Reply::Finished(outcome),
        Reply::Queue(vec![JobInfo {
            job: 3,
            name: "hello".into(),
            uid: 1000,
            state: storm_cluster::control::JobState::Running,
            nodes: nodes("0-1"),
            cpus: None,
            ntasks: 4,
            elapsed_ms: 10,
            reason: None,
            time_slot: None,
            exit_code: None,
            usage: Default::default(),
            element: None,
            submitted_ms: 1_700_000_000_000,
            started_ms: Some(1_700_000_000_500),
            ended_ms: None,
            runs_on: Some("c1".into()),
            from_cluster: None,
        }]),
        Reply::Nodes(vec![NodeInfo {
            id: 0,
            name: "n0".into(),
            state: storm_cluster::control::NodeState::Idle,
            jobs: vec![3],
            reason: None,
            records: None,
        }]),
    ];
    let mut seeds: Vec<Vec<u8>> = requests.iter().map(|r| framed(0, bincode(r))).collect();
    seeds.extend(replies.iter().map(|r| framed(1, bincode(r))));
    seeds
}

/// The bytes after the selector go through a real socket into the real receiver: the MM's
/// for requests (with its request limit), storm-submit's for replies.
fn control_frame(input: &[u8]) -> bool {
    let Some((&tag, bytes)) = input.split_first() else {
        return false;
    };
    let (mut ours, theirs) = UnixStream::pair().expect("socketpair");
    // Inputs are far smaller than a socket's buffer, so this never blocks.
    ours.write_all(bytes).expect("write to socketpair");
    drop(ours);
    if tag % 2 == 0 {
        control::recv_within::<Request>(&theirs, MAX_REQUEST_BYTES)
            .map(|(request, _fds)| {
                // What the MM checks first in a submission.
                if let Request::Submit(job) = request {
                    let _ = job.tasks.plan(&Capacity {
                        nodes: NODE_COUNT,
                        cpus_per_node: 4,
                        max_cpus_per_node: 8,
                        max_tasks_per_node: MAX_TASKS_PER_NODE as u32,
                    });
                }
            })
            .is_ok()
    } else {
        control::recv::<Reply>(&theirs)
            .map(|(reply, _fds)| {
                if let Reply::Finished(outcome) = reply {
                    let _ = outcome.exit_code();
                }
            })
            .is_ok()
    }
}

// --- the journal --------------------------------------------------------------------------

fn journal_seeds() -> Vec<Vec<u8>> {
    let record = |state| JobRecord {
        id: 7,
        uid: 1000,
        gid: 1000,
        req: job_request(),
        submitted_ms: 1_700_000_000_000,
        state,
    };
    vec![
        tagged(0, &record(JobState::Queued)),
        tagged(
            0,
            &record(JobState::Started {
                nodes: nodes("0-3"),
                cpus: None,
                slot: 2,
                time_slot: 1,
                launched_ms: Some(1_700_000_000_500),
                program_hash: Some([7; 32]),
                launched_to: vec![(
                    2,
                    NmProcess {
                        pid: 41,
                        started_ms: 1_700_000_000_000,
                    },
                )],
            }),
        ),
        tagged(
            0,
            &record(JobState::Started {
                nodes: nodes("5"),
                cpus: Some(nodes("2-3")),
                slot: 3,
                time_slot: 0,
                launched_ms: Some(1_700_000_000_600),
                program_hash: None,
                launched_to: Vec::new(),
            }),
        ),
        tagged(
            0,
            &record(JobState::Finished {
                nodes: nodes("0-3"),
                outcome: JobOutcome {
                    job: 7,
                    ranks: vec![Some(RankStatus::Signaled(9))],
                    reason: Some("time limit".into()),
                    abort_code: None,
                    timing: Default::default(),
                    usage: messages::JobUsage {
                        cpu_us: Some(42_000),
                        peak_memory_bytes: Some(1 << 30),
                        oom_kills: Some(1),
                    },
                    cause: Some(storm_cluster::control::EndCause::Timeout),
                    broadcast: false,
                },
                ended_ms: 1_700_000_001_000,
            }),
        ),
        tagged(
            1,
            &NodeRecord {
                drain: Some("bad fan".into()),
                lent: Some(storm_cluster::federation::Lease {
                    peer: "c0".into(),
                    until_ms: 1_700_000_002_000,
                    asked: true,
                    recall: Some(storm_cluster::federation::Recall {
                        why: "its owner's operator reclaimed it".into(),
                        by_ms: 1_700_000_001_500,
                    }),
                }),
            },
        ),
    ]
}

fn journal_record(input: &[u8]) -> bool {
    let Some((&tag, bytes)) = input.split_first() else {
        return false;
    };
    let path = Path::new("journal.redb");
    if tag % 2 == 0 {
        journal::decode_record::<JobRecord>(path, "job 7", bytes).is_ok()
    } else {
        journal::decode_record::<NodeRecord>(path, "node 1", bytes).is_ok()
    }
}

// --- the cluster file ---------------------------------------------------------------------

const CLUSTER_FILE: &str = r#"[cluster]
name = "prod"
backend = "tcp"
timeslice_ms = 1.0
control_socket = "/run/storm/mm.sock"
max_jobs = 32
max_tasks_per_node = 64
heartbeat_slots = 16
heartbeat_bytes = 65536
transfer_chunk_bytes = 524288
transfer_slots = 2
max_transfers = 4
output_slots = 8
output_bytes = 16384
kill_wait_ms = 2000
state_dir = "/var/lib/storm"

[tcp]
fanout = 2
chunk_bytes = 262144
op_timeout_ms = 5000
connect_timeout_ms = 1000
encrypt = false

[security]
allow_root_jobs = true

[scheduler]
policy = "gang"
mpl = 2

[limits]
max_queued_jobs_per_user = 10000
max_request_bytes = 4194304

[mm]
address = "127.0.0.1:7000"

[[node]]
name = "node0"
address = "127.0.0.1:7001"
spool = "/var/spool/storm"
cpus = 16

[[node]]
name = "node1"
address = "127.0.0.1:7002"
spool = "/var/spool/storm"
"#;

fn cluster_file_seeds() -> Vec<Vec<u8>> {
    let minimal = "[cluster]\nname = \"x\"\n[mm]\naddress = \"127.0.0.1:1\"\n\
                   [[node]]\nname = \"a\"\naddress = \"127.0.0.1:2\"\nspool = \"/s\"\n";
    vec![CLUSTER_FILE.into(), minimal.into()]
}

/// What a daemon does with its cluster file: parse and check it, then lay out global
/// memory from it.
fn cluster_file(input: &[u8]) -> bool {
    let text = String::from_utf8_lossy(input);
    match ClusterConfig::parse(&text) {
        Ok(cfg) => {
            let _ = cfg.to_toml();
            RmLayout::new(&cfg).is_ok()
        }
        Err(_) => false,
    }
}

// --- hostlists ----------------------------------------------------------------------------

fn hostlist_seeds() -> Vec<Vec<u8>> {
    ["0-7,12,20-23", "[0-4095]", "5", "", "0,2,4,6-9,4294967295"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect()
}

/// Parses; a set that parses prints as text that parses back to the same set.
fn hostlist(input: &[u8]) -> bool {
    let text = String::from_utf8_lossy(input);
    let Ok(set) = text.parse::<NodeSet>() else {
        return false;
    };
    let again: NodeSet = set
        .to_string()
        .parse()
        .unwrap_or_else(|e| panic!("{set} (from {text:?}) does not parse back: {e}"));
    assert_eq!(again, set, "{text:?} does not round-trip");
    let _ = (set.len(), set.last(), set.contains(0));
    true
}

// --- a PL's task description --------------------------------------------------------------

fn task_spec_seeds() -> Vec<Vec<u8>> {
    vec![
        PlSpec {
            job: 42,
            rank: 3,
            node: 1,
            slot: 2,
            program: PathBuf::from("/var/spool/storm/job-42/a.out"),
            args: vec!["x".into()],
            env: vec![("STORM_RANK".into(), "3".into())],
            cwd: "/home/user".into(),
            uid: 1000,
            gid: 1000,
            cgroups: vec![PathBuf::from(
                "/sys/fs/cgroup/memory/storm/c/node1/job-42/cgroup.procs",
            )],
            output_file: Some("storm-42.out".into()),
            error_file: None,
            stdin: true,
        }
        .encode(),
    ]
}

fn task_spec(input: &[u8]) -> bool {
    PlSpec::decode(input).is_ok()
}

// --- the ofi bootstrap --------------------------------------------------------------------

fn ofi_bootstrap_seeds() -> Vec<Vec<u8>> {
    let record = PeerRecord {
        name: vec![2, 0, 0x1f, 0x90, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        key: 0x1234,
        base: 0x7f00_0000_0000,
    };
    // As the decoder reads it: a whole 512-byte slot. Records carry a checksum of their
    // contents, so mutants of the record itself are mostly refused; those of the rest of the
    // slot must still decode.
    let mut slot = record.encode().expect("seed record encodes");
    slot.resize(512, 0);
    vec![slot]
}

fn ofi_bootstrap(input: &[u8]) -> bool {
    PeerRecord::decode(input).is_some()
}

// --- the NM's PMIx helper --------------------------------------------------------------------

/// The bound the NM puts on one frame from its helper in this target (its `pmi_node_bytes`
/// and 1 MiB in the daemon; smaller here to keep the run fast).
const PMIX_HELPER_MAX: usize = 64 << 10;

fn pmix_helper_seeds() -> Vec<Vec<u8>> {
    use storm_pmix::wire::{Event, write_frame};
    let events = [
        Event::Connected {
            nspace: "storm-9".into(),
            rank: 1,
            id: 1,
        },
        Event::Fence {
            id: 1,
            nspace: "storm-9".into(),
            data: vec![1, 2, 3],
        },
        Event::Abort {
            nspace: "storm-9".into(),
            rank: 0,
            status: 7,
            message: "PMIx_Abort".into(),
            id: 3,
        },
        Event::Finalized {
            nspace: "storm-9".into(),
            rank: 0,
            id: 4,
        },
        Event::FenceTooLarge {
            id: 5,
            nspace: "storm-9".into(),
            bytes: 1 << 30,
        },
    ];
    let mut all = Vec::new();
    let mut seeds = Vec::new();
    for e in &events {
        let mut one = Vec::new();
        write_frame(&mut one, e).unwrap();
        all.extend_from_slice(&one);
        seeds.push(one);
    }
    seeds.push(all);
    seeds
}

/// What an NM does with the bytes its PMIx helper sends: cut them into frames under the
/// NM's bound, and carry each event out on a job core of this node (ranks 0 and 1 of 4 on 2
/// nodes), a fence's result as the MM would give it. Accepted if an event was decoded.
fn pmix_helper(input: &[u8]) -> bool {
    use base64::Engine;
    use storm_pmix::wire::{Event, read_frame};
    let facts = JobFacts {
        job: 9,
        size: 4,
        mapping: process_mapping(4, 2),
        v1: true,
        v2: true,
        node_bytes: 4 << 10,
        job_bytes: 16 << 10,
        nodes: vec![("node0".into(), vec![0, 1]), ("node1".into(), vec![2, 3])],
        node: 0,
        owner: (65534, 65534),
    };
    let mut job = PmiJob::new(facts, [0, 1]);
    let mut r = input;
    let mut decoded = 0;
    while let Ok(event) = read_frame::<Event>(&mut r, PMIX_HELPER_MAX) {
        decoded += 1;
        let effects = match event {
            Event::Connected { rank, .. } => job.pmix_connected(rank),
            Event::Finalized { rank, .. } => {
                job.pmix_finalized(rank);
                Vec::new()
            }
            Event::Abort {
                rank,
                status,
                message,
                ..
            } => job.pmix_abort(rank, status, message),
            Event::Fence { data, .. } => {
                let blob = base64::engine::general_purpose::STANDARD.encode(&data);
                job.pmix_fence(0, blob)
            }
            Event::FenceTooLarge { bytes, .. } => job.pmix_fence_too_large(bytes),
            _ => Vec::new(),
        };
        for effect in effects {
            if let Effect::Contribute { epoch, pairs } = effect {
                let _ = job.fenced(epoch, pairs);
                let _ = job.pmix_blobs(2);
            }
        }
    }
    let _ = job.closed(0);
    decoded > 0
}

// --- an MPI task's PMI socket --------------------------------------------------------------

fn pmi_seeds() -> Vec<Vec<u8>> {
    let v2 = |body: &str| format!("{:<6}{body}", body.len());
    let one = [
        "cmd=init pmi_version=1 pmi_subversion=1\n",
        "cmd=get_maxes\ncmd=get_my_kvsname\ncmd=get_universe_size\ncmd=get_appnum\n",
        "cmd=put kvsname=storm-9 key=card-0 value=tcp://127.0.0.1:5 x\n",
        "cmd=barrier_in\n",
        "cmd=get kvsname=storm-9 key=card-0\ncmd=get kvsname=storm-9 key=nope\n",
        "cmd=finalize\n",
    ]
    .concat();
    let two = [
        "cmd=init pmi_version=2 pmi_subversion=0\n".to_string(),
        v2("cmd=fullinit;pmirank=0;"),
        v2("cmd=job-getid;"),
        v2("cmd=info-getjobattr;key=PMI_process_mapping;"),
        v2("cmd=info-putnodeattr;key=shm;value=/dev/shm/x;"),
        v2("cmd=info-getnodeattr;key=shm;wait=FALSE;"),
        v2("cmd=kvs-put;key=card-0;value=ofi://x;"),
        v2("cmd=kvs-fence;"),
        v2("cmd=kvs-get;jobid=storm-9;srcid=-1;key=card-0;"),
        v2("cmd=finalize;"),
    ]
    .concat();
    let abort = "cmd=init pmi_version=1 pmi_subversion=1\ncmd=abort exitcode=7\n";
    // The first byte says how the rest is cut into reads: 0 for all at once.
    [(0, one.as_str()), (7, two.as_str()), (3, abort)]
        .iter()
        .map(|(cut, text)| {
            let mut v = vec![*cut];
            v.extend_from_slice(text.as_bytes());
            v
        })
        .collect()
}

/// What an NM does with the bytes one task writes to its PMI socket: cut them into messages
/// as they arrive, answer each, and carry fences out as the MM would. Every reply must be
/// one well-framed message, whatever the task put in the key space (a value must never
/// forge a second reply). Accepted if at least one request was served before anything
/// closed the socket.
fn pmi(input: &[u8]) -> bool {
    let Some((&cut, bytes)) = input.split_first() else {
        return false;
    };
    let facts = JobFacts {
        job: 9,
        size: 2,
        mapping: process_mapping(2, 1),
        v1: true,
        v2: true,
        node_bytes: 4 << 10,
        job_bytes: 16 << 10,
        nodes: vec![("node0".into(), vec![0, 1])],
        node: 0,
        owner: (65534, 65534),
    };
    let mut job = PmiJob::new(facts, [0]);
    let mut framer = Framer::default();
    let mut served = 0;
    let step = if cut == 0 {
        bytes.len().max(1)
    } else {
        usize::from(cut)
    };
    for read in bytes.chunks(step) {
        framer.push(read);
        loop {
            let mut effects = match framer.next_request() {
                Ok(Some(request)) => job.handle(0, &request),
                Ok(None) => break,
                Err(e) => {
                    let _ = job.malformed(0, e.to_string());
                    return served > 0;
                }
            };
            served += 1;
            while let Some(effect) = effects.pop() {
                match effect {
                    Effect::Reply(_, reply) => check_pmi_reply(&framer, &reply),
                    Effect::Contribute { epoch, pairs } => effects.extend(job.fenced(epoch, pairs)),
                    Effect::Close(_) => return served > 1,
                    Effect::Abort { .. } => {}
                }
            }
        }
    }
    let _ = job.closed(0);
    served > 0
}

fn check_pmi_reply(framer: &Framer, reply: &[u8]) {
    use storm_nm::pmi::wire::Version;
    let text = String::from_utf8_lossy(reply);
    let v2_body = (framer.version() == Some(Version::Two)
        && !text.starts_with("cmd=response_to_init"))
    .then(|| reply.get(6..))
    .flatten();
    match v2_body {
        Some(body) => {
            let len: usize = text[..6]
                .trim()
                .parse()
                .expect("a PMI-2 reply's length is a number");
            assert_eq!(
                len,
                body.len(),
                "a PMI-2 reply's length is its body's: {text:?}"
            );
        }
        None => assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "a PMI-1 reply is one line: {text:?}"
        ),
    }
}

// --- a node's sample and inventory ------------------------------------------------------

fn node_record_seeds() -> Vec<Vec<u8>> {
    use storm_cluster::sample::{NodeInventory, NodeSample, Source};
    let sample = NodeSample {
        seq: 7,
        taken_ms: 1_790_000_000_000,
        period_ms: 1000,
        source: Source::Host,
        cpus: 4,
        jobs: 1,
        cpu_util: 0.5,
        per_cpu: vec![100, 0, 50, 0],
        load: [1.0, 0.5, 0.25],
        nm_cpu: 0.001,
        mem_total: 8 << 30,
        mem_avail: 4 << 30,
        swap_total: 0,
        swap_used: 0,
        spool_free: 1 << 30,
        state_free: 1 << 30,
        net_rx_bytes: 1000,
        net_tx_bytes: 2000,
        net_rx_packets: 10,
        net_tx_packets: 20,
    };
    let inventory = NodeInventory {
        seq: 7,
        cpus: 4,
        mhz: 2900,
        ram: 8 << 30,
        swap: 0,
        model: "Test CPU".into(),
        kernel: "6.1.0".into(),
        arch: "x86_64".into(),
    };
    let sick = storm_cluster::health::NodeHealth::of(
        7,
        1_790_000_000_000,
        &["spool_dir has 1 MiB free, below spool_free_min 64 MiB".into()],
    );
    let usage = storm_cluster::usage::NodeUsage {
        seq: 7,
        taken_ms: 1_790_000_000_000,
        jobs_total: 2,
        jobs: vec![
            storm_cluster::usage::JobFigures {
                job: 12,
                cpu_us: 2_000_000,
                cpus_busy: 1.0,
                mem: 64 << 20,
                mem_peak: 80 << 20,
            },
            storm_cluster::usage::JobFigures {
                job: 13,
                ..Default::default()
            },
        ],
        fabric: Some(storm_cluster::usage::FabricCounters {
            ports: 1,
            rx_bytes: 4096,
            tx_bytes: 8192,
            rx_packets: 1,
            tx_packets: 2,
        }),
    };
    vec![
        sample.encode().to_vec(),
        inventory.encode().to_vec(),
        sick.encode().to_vec(),
        usage.encode().to_vec(),
    ]
}

fn node_record(input: &[u8]) -> bool {
    use storm_cluster::health::NodeHealth;
    use storm_cluster::sample::{NodeInventory, NodeSample};
    // Every kind is tried on every input: a node may write any bytes into any of its slots.
    let sample = NodeSample::decode(input);
    let inventory = NodeInventory::decode(input);
    let health = NodeHealth::decode(input);
    if let Ok(Some(h)) = &health {
        assert_eq!(
            &h.encode()[..],
            input,
            "a health verdict does not encode back"
        );
    }
    if let Ok(Some(s)) = &sample {
        // What decodes encodes back to the same bytes: nothing is lost or invented.
        assert_eq!(&s.encode()[..], input, "a sample does not encode back");
    }
    if let Ok(Some(i)) = &inventory {
        assert_eq!(&i.encode()[..], input, "an inventory does not encode back");
    }
    let usage = storm_cluster::usage::NodeUsage::decode(input);
    if let Ok(Some(u)) = &usage {
        assert_eq!(
            &u.encode()[..],
            input,
            "a usage record does not encode back"
        );
    }
    matches!(sample, Ok(Some(_)))
        || matches!(usage, Ok(Some(_)))
        || matches!(inventory, Ok(Some(_)))
        || matches!(health, Ok(Some(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_is_accepted_by_its_target() {
        // A seed its own target rejects would start the mutator from nothing.
        for target in all() {
            for (i, seed) in (target.seeds)().iter().enumerate() {
                assert!(
                    (target.check)(seed),
                    "{}: seed {i} is rejected",
                    target.name
                );
            }
        }
    }

    #[test]
    fn names_are_unique() {
        for t in all() {
            assert!(std::ptr::eq(by_name(t.name).unwrap(), t), "{}", t.name);
        }
    }
}
