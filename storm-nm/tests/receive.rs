//! The program receiver's core, stepped by hand over the in-process fabric: the MM's side of
//! a transfer is a producer on the chunk queue, as in storm-mm's transfer worker, and time is
//! whatever the test says it is.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use storm_cluster::messages::{Checksum, FileInfo, FileTrailer};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_nm::receive::{ProgramSink, Received, Reception};
use storm_primitives::helpers::QueueProducer;
use storm_primitives::local::{LocalFabric, LocalNode};
use storm_primitives::{NodeSet, Primitives, Wait};

const STALL: Duration = Duration::from_secs(30);

/// A sink that keeps the program in memory, and what became of it.
#[derive(Clone, Default)]
struct Memory(Arc<Mutex<(Vec<u8>, &'static str)>>);

impl ProgramSink for Memory {
    fn write(&mut self, chunk: &[u8]) -> Result<(), String> {
        self.0.lock().unwrap().0.extend_from_slice(chunk);
        Ok(())
    }
    fn finish(&mut self) -> Result<(), String> {
        self.0.lock().unwrap().1 = "finished";
        Ok(())
    }
    fn discard(&mut self) {
        *self.0.lock().unwrap() = (Vec::new(), "discarded");
    }
}

struct Cluster {
    rm: RmLayout,
    mm: LocalNode,
    node: LocalNode,
}

fn cluster() -> Cluster {
    let cfg = ClusterConfig::parse(
        r#"
        [cluster]
        name = "receive"
        transfer_chunk_bytes = 4096
        transfer_slots = 2
        [mm]
        address = "127.0.0.1:7000"
        [[node]]
        name = "n0"
        address = "127.0.0.1:0"
        spool = "/nonexistent/receive"
        "#,
    )
    .expect("cluster file");
    let rm = RmLayout::new(&cfg).expect("layout");
    let fabric = LocalFabric::new(cfg.node_count() + 1, rm.layout.clone());
    Cluster {
        mm: fabric.node(cfg.mm_id()),
        node: fabric.node(0),
        rm,
    }
}

fn info(size: u64) -> FileInfo {
    FileInfo {
        transfer: 3,
        job: 7,
        nodes: NodeSet::single(0),
        size,
        name: "a.out".into(),
        uid: 0,
        gid: 0,
    }
}

/// The MM's side: sends `data` in chunks of the queue's payload, then `trailer`, as far as
/// there is room; returns how many entries went.
fn send(c: &Cluster, producer: &mut QueueProducer, entries: &[Vec<u8>]) -> usize {
    let mut sent = 0;
    for e in entries {
        if producer.enqueue(&c.mm, e, None).is_err() {
            break;
        }
        sent += 1;
    }
    sent
}

fn entries(c: &Cluster, program: &[u8], trailer: FileTrailer) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = program
        .chunks(c.rm.chunks.slot_payload)
        .map(<[u8]>::to_vec)
        .collect();
    v.push(trailer.to_bytes().to_vec());
    v
}

fn checksum(data: &[u8]) -> u64 {
    let mut sum = Checksum::new();
    sum.update(data);
    sum.finish()
}

/// A reception of a `size`-byte program into `sink`, begun at `now`.
fn reception(c: &Cluster, size: u64, sink: impl ProgramSink + 'static, now: Instant) -> Reception {
    Reception::new(&c.node, &c.rm, info(size), Box::new(sink), now, STALL).unwrap()
}

fn producer(c: &Cluster) -> QueueProducer {
    QueueProducer::new(c.rm.chunks, NodeSet::single(0), info(0).transfer)
        .with_space_timeout(Duration::ZERO)
}

/// Steps the reception, sending what fits between steps, until it is done.
fn run(c: &Cluster, r: &mut Reception, mut pending: &[Vec<u8>], now: Instant) -> Received {
    let mut producer = producer(c);
    for _ in 0..10_000 {
        let sent = send(c, &mut producer, pending);
        pending = &pending[sent..];
        match r.step(&c.node, now, Wait::Poll) {
            Received::Pending => {}
            done => return done,
        }
    }
    panic!("the reception never ended");
}

#[test]
fn a_program_larger_than_the_queue_is_received_whole_and_verified() {
    let c = cluster();
    let program: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sink = Memory::default();
    let now = Instant::now();
    let mut r = reception(&c, program.len() as u64, sink.clone(), now);
    let trailer = FileTrailer {
        size: program.len() as u64,
        checksum: checksum(&program),
    };
    let entries = entries(&c, &program, trailer);
    assert!(
        entries.len() > 2 * c.rm.chunks.slot_count,
        "more than the queue holds"
    );
    assert_eq!(run(&c, &mut r, &entries, now), Received::Done(Ok(())));
    let (got, end) = sink.0.lock().unwrap().clone();
    assert_eq!(end, "finished");
    assert!(got == program, "the received bytes differ from the program");
    r.acknowledge(&c.node, &c.rm, true);
    assert_eq!(c.node.memory().load(c.rm.file_ack), 2 * 3 + 1);
}

#[test]
fn a_program_whose_checksum_differs_is_refused_and_discarded() {
    let c = cluster();
    let program = vec![1u8; 10_000];
    let sink = Memory::default();
    let now = Instant::now();
    let mut r = reception(&c, 10_000, sink.clone(), now);
    let trailer = FileTrailer {
        size: 10_000,
        checksum: checksum(&program) ^ 1,
    };
    let got = run(&c, &mut r, &entries(&c, &program, trailer), now);
    assert!(
        matches!(&got, Received::Done(Err(e)) if e.contains("checksum mismatch")),
        "{got:?}"
    );
    assert_eq!(sink.0.lock().unwrap().1, "discarded");
    r.acknowledge(&c.node, &c.rm, false);
    assert_eq!(c.node.memory().load(c.rm.file_ack), 2 * 3);
}

#[test]
fn a_trailer_that_names_another_size_is_refused() {
    let c = cluster();
    let program = vec![2u8; 5_000];
    let now = Instant::now();
    let mut r = reception(&c, 5_000, Memory::default(), now);
    let trailer = FileTrailer {
        size: 6_000,
        checksum: checksum(&program),
    };
    let got = run(&c, &mut r, &entries(&c, &program, trailer), now);
    assert_eq!(
        got,
        Received::Done(Err("received 5000 bytes, expected 6000".into()))
    );
}

/// A sender that stops (the MM died mid-transfer) is given up on once the transfer has made
/// no progress for the stall time, and not one moment before.
#[test]
fn a_transfer_that_stops_is_given_up_after_the_stall_time() {
    let c = cluster();
    let program = vec![3u8; 20_000];
    let sink = Memory::default();
    let start = Instant::now();
    let mut r = reception(&c, 20_000, sink.clone(), start);
    // One chunk arrives, then nothing.
    let mut p = producer(&c);
    assert_eq!(send(&c, &mut p, &[program[..4096].to_vec()]), 1);
    let last = start + Duration::from_secs(1);
    assert_eq!(r.step(&c.node, last, Wait::Poll), Received::Pending);
    assert_eq!(r.step(&c.node, last + STALL, Wait::Poll), Received::Pending);
    let got = r.step(&c.node, last + STALL + Duration::from_millis(1), Wait::Poll);
    assert!(
        matches!(&got, Received::Done(Err(e)) if e.starts_with("no data for 30s after 4096 of 20000 bytes")),
        "{got:?}"
    );
    assert_eq!(sink.0.lock().unwrap().1, "discarded");
}

/// The MM launches a program as soon as its acknowledgement is in, so the spooled file must
/// be closed by then: a file still open for writing cannot be executed (ETXTBSY, seen in CI
/// as "Text file busy" when a requeued job started on a node that had just received it).
#[test]
fn a_received_program_can_be_executed_as_soon_as_it_is_verified() {
    let c = cluster();
    let dir = tempfile::tempdir().unwrap();
    let spool = storm_cluster::daemon_dir::DaemonDir::open_or_create(
        &dir.path().join("spool"),
        storm_nm::receive::SPOOL_DIR_MODE,
    )
    .unwrap();
    let path = spool.join("job-7").join("a.out");
    let program = b"#!/bin/sh\nexit 3\n".to_vec();
    let sink = storm_nm::receive::FileSink::create(&spool, 7, "a.out", None).unwrap();
    let now = Instant::now();
    let mut r = reception(&c, program.len() as u64, sink, now);
    let trailer = FileTrailer {
        size: program.len() as u64,
        checksum: checksum(&program),
    };
    assert_eq!(
        run(&c, &mut r, &entries(&c, &program, trailer), now),
        Received::Done(Ok(()))
    );
    // The reception is still alive, as it is until its thread ends.
    let status = std::process::Command::new(&path).status().unwrap();
    assert_eq!(status.code(), Some(3));
    drop(r);
}
