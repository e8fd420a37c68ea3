//! Tests of `messages`, apart so that its own file stays short.

use super::*;

/// Two fence parts of one node shaped like MPICH's (segmented hex business cards).
fn fence_parts() -> (PmiUp, PmiUp) {
    let part = |epoch: u32, digit: char| PmiUp::Fence {
        job: 7,
        epoch,
        pairs: (0..3)
            .map(|i| {
                (
                    format!("-allgather-shm-{epoch}-2-seg-{}/3", i + 1),
                    std::iter::repeat_n(digit, 1022).collect(),
                )
            })
            .collect(),
    };
    (part(2, 'a'), part(3, '3'))
}

/// What an area of `area` bytes holds while `new` is written over `old` a word at a
/// time, front to back, after `words` words.
fn torn(old: &[u8], new: &[u8], area: usize, words: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; area];
    bytes[..old.len()].copy_from_slice(old);
    let done = (words * 8).min(new.len());
    bytes[..done].copy_from_slice(&new[..done]);
    bytes
}

#[test]
fn a_sealed_message_read_while_it_is_overwritten_is_refused_never_mixed() {
    let (old, new) = fence_parts();
    let area = 8192;
    let old_bytes = encode_sealed("PMI message", &old, area).unwrap();
    let new_bytes = encode_sealed("PMI message", &new, area).unwrap();
    let mut refused = 0;
    for words in 0..=new_bytes.len().div_ceil(8) {
        let bytes = torn(&old_bytes, &new_bytes, area, words);
        match decode_sealed::<PmiUp>("PMI message", &bytes, area) {
            Ok(got) => assert!(
                got == old || got == new,
                "after {words} words a mixture was taken for a message: {got:?}"
            ),
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 0, "every partly written state was refused");
    assert_eq!(
        decode_sealed::<PmiUp>("PMI message", &new_bytes, area).unwrap(),
        new,
        "the whole message decodes"
    );
    // An area never written (zeroes) holds no message.
    assert!(decode_sealed::<PmiUp>("PMI message", &[0u8; 64], area).is_err());
}

#[test]
fn a_file_name_that_leaves_the_spool_directory_is_refused() {
    let info = |name: &str| FileInfo {
        transfer: 0,
        job: 1,
        nodes: NodeSet::single(0),
        size: 1,
        name: name.into(),
        uid: 0,
        gid: 0,
    };
    assert_eq!(info("a.out").problem(1), None);
    for bad in ["", "..", "../x", "/etc/passwd", "a/b", "."] {
        assert!(info(bad).problem(1).is_some(), "{bad:?}");
    }
}

#[test]
fn a_file_over_the_program_size_limit_is_refused_naming_it() {
    let info = FileInfo {
        transfer: 0,
        job: 1,
        nodes: NodeSet::single(0),
        size: 1001,
        name: "a.out".into(),
        uid: 0,
        gid: 0,
    };
    let why = info.problem(1000).expect("refused");
    assert!(why.contains("max_program_bytes = 1000"), "{why}");
    assert_eq!(info.problem(1001), None);
}

#[test]
fn a_launch_with_indices_outside_the_layout_is_named_before_use() {
    let ok = LaunchSpec {
        job: 1,
        slot: 3,
        nodes: "0-1".parse().unwrap(),
        ntasks: 8,
        program: Program::Path("/bin/true".into()),
        program_hash: None,
        args: vec![],
        env: vec![],
        cwd: "/".into(),
        uid: 0,
        gid: 0,
        reporter: 0,
        mpi: MpiMode::Both,
        input: Default::default(),
        batch: None,
        mem: None,
        kill_on_bad_exit: false,
        exit_wait_s: 0,
        cpu_bind: Default::default(),
        cpus: None,
    };
    assert_eq!(ok.problem(4, 4, 4), None);
    let bad = |f: &dyn Fn(&mut LaunchSpec)| {
        let mut s = ok.clone();
        f(&mut s);
        s.problem(4, 4, 4).expect("refused")
    };
    assert!(bad(&|s| s.slot = 4).contains("job slot 4"));
    assert!(bad(&|s| s.slot = u32::MAX).contains("job slot"));
    assert!(bad(&|s| s.nodes = "2-9".parse().unwrap()).contains("node 9"));
    assert!(bad(&|s| s.reporter = 7).contains("reporter 7"));
    assert!(bad(&|s| s.ntasks = 9).contains("5 tasks per node"));
}
use proptest::prelude::*;

#[test]
fn heartbeats_round_trip_and_respect_limits() {
    let hb = Heartbeat {
        seq: 7,
        commands: vec![
            Command::Signal { job: 3, signal: 15 },
            Command::Launch(LaunchSpec {
                job: 3,
                slot: 1,
                nodes: "0-3".parse().unwrap(),
                ntasks: 8,
                program: Program::Spooled("a.out".into()),
                program_hash: Some([7; 32]),
                args: vec!["-x".into()],
                env: vec![("A".into(), "1".into())],
                cwd: "/tmp".into(),
                uid: 1000,
                gid: 1000,
                reporter: 3,
                mpi: MpiMode::Pmi1,
                input: Default::default(),
                batch: None,
                mem: None,
                kill_on_bad_exit: false,
                exit_wait_s: 0,
                cpu_bind: Default::default(),
                cpus: None,
            }),
        ],
        seal: Some(crate::identity::Seal {
            issued_ms: 1,
            signature: vec![3; 64],
        }),
    };
    let bytes = encode("heartbeat", &hb, 4096).unwrap();
    assert_eq!(decode::<Heartbeat>("heartbeat", &bytes, 4096).unwrap(), hb);
    assert!(
        encode("heartbeat", &hb, 10)
            .unwrap_err()
            .to_string()
            .contains("limit")
    );
    assert!(decode::<Heartbeat>("heartbeat", &bytes, 10).is_err());
}

#[test]
fn statuses_follow_the_shell_convention() {
    assert_eq!(RankStatus::Exited(3).shell_code(), 3);
    assert_eq!(RankStatus::Signaled(9).shell_code(), 137);
    assert!(RankStatus::Signaled(9).to_string().contains("SIGKILL"));
    assert!(RankStatus::Exited(0).success());
}

#[test]
fn the_largest_inventory_and_welcome_fit_their_areas() {
    for max_jobs in [1, 32, 1000] {
        let jobs = (0..max_jobs as u64)
            .map(|i| HeldJob {
                job: u64::MAX - i,
                slot: u32::MAX,
                ended: true,
            })
            .collect::<Vec<_>>();
        let name = |c: char| c.to_string().repeat(crate::config::MAX_NAME_BYTES);
        let inv = Inventory {
            stamp: u64::MAX,
            since_ms: u64::MAX,
            jobs: jobs.clone(),
            mem: u64::MAX,
            lease: Some(crate::identity::LeaseGrant {
                lender: name('l'),
                borrower: name('b'),
                node: name('n'),
                until_ms: u64::MAX,
                signature: vec![0xff; 64],
            }),
        };
        encode_sealed("inventory", &inv, inventory_bytes(max_jobs)).unwrap();
        let welcome = Membership::Welcome {
            stamp: u64::MAX,
            output_epoch: u32::MAX,
            incarnation: u64::MAX,
            keep: jobs.iter().map(|h| h.job).collect(),
        };
        encode_sealed("membership", &welcome, membership_bytes(max_jobs)).unwrap();
    }
}

#[test]
fn a_receiver_keeps_each_byte_of_a_stream_once() {
    let chunk = OutputChunk {
        job: 1,
        rank: 0,
        stream: Stream::Stdout,
        offset: 10,
        data: b"abcdef".to_vec(),
    };
    assert_eq!(
        chunk.unseen(0),
        Some(&b"abcdef"[..]),
        "a gap keeps all of it"
    );
    assert_eq!(chunk.unseen(10), Some(&b"abcdef"[..]));
    assert_eq!(
        chunk.unseen(13),
        Some(&b"def"[..]),
        "the overlap is dropped"
    );
    assert_eq!(chunk.unseen(16), None, "seen already");
    assert_eq!(chunk.unseen(99), None);
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode::<Heartbeat>("heartbeat", &bytes, 1 << 20);
        let _ = decode::<NodeReport>("report", &bytes, 1 << 20);
        let _ = decode::<OutputChunk>("output", &bytes, 1 << 20);
        let _ = decode::<Inventory>("inventory", &bytes, 1 << 20);
        let _ = decode::<Membership>("membership", &bytes, 1 << 20);
        let _ = decode_sealed::<PmiUp>("PMI message", &bytes, 1 << 20);
        let _ = decode_sealed::<PmiFenced>("PMI fence result", &seal(&bytes), 1 << 20);
    }
}
