//! Tests of `control`, apart so that its own file stays short.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use super::*;
use std::io::Seek;

/// The MM refuses a request over its size limit before reading it all: it says why and
/// closes. The rest of the client's write then fails (EPIPE), and the client reports the
/// MM's reason, not a lost connection.
#[test]
fn a_request_refused_before_it_was_read_reports_the_refusal() {
    let (client, server) = UnixStream::pair().unwrap();
    send(
        &server,
        &Reply::Error("a request of N bytes exceeds the limit".into()),
        None,
    )
    .unwrap();
    drop(server);
    let client = Client {
        sock: client,
        cluster: "t".into(),
        nodes: 1,
    };
    let big = Request::Drain {
        nodes: NodeSet::new(),
        reason: "x".repeat(1 << 20),
    };
    assert_eq!(
        client.try_request(&big, None),
        Err(RequestFailed::Refused(
            "a request of N bytes exceeds the limit".to_string()
        ))
    );
    // With nothing said, it is a lost connection.
    let (client, server) = UnixStream::pair().unwrap();
    drop(server);
    let client = Client {
        sock: client,
        cluster: "t".into(),
        nodes: 1,
    };
    match client.try_request(&big, None) {
        Err(RequestFailed::Lost(err)) => {
            assert!(err.starts_with("lost the machine manager"), "{err}")
        }
        other => panic!("a closed connection is a lost one, not {other:?}"),
    }
}

#[test]
fn frames_and_descriptors_cross_a_socketpair() {
    let (a, b) = UnixStream::pair().unwrap();
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(b"#!/bin/true\n").unwrap();
    file.rewind().unwrap();
    let req = Request::Cancel { job: 42 };
    send(&a, &req, Some(file.as_fd())).unwrap();
    send(&a, &Request::Queue, None).unwrap();
    let (got, fds) = recv::<Request>(&b).unwrap();
    assert_eq!(got, req);
    assert_eq!(fds.len(), 1);
    let mut passed = std::fs::File::from(fds.into_iter().next().unwrap());
    let mut text = String::new();
    passed.read_to_string(&mut text).unwrap();
    assert_eq!(text, "#!/bin/true\n", "the descriptor is the very file");
    let (got, fds) = recv::<Request>(&b).unwrap();
    assert_eq!(got, Request::Queue);
    assert!(fds.is_empty());
    let (uid, _) = peer_credentials(&b).unwrap();
    assert_eq!(uid, nix::unistd::getuid().as_raw());
}

#[test]
fn bad_frames_are_errors() {
    let (a, b) = UnixStream::pair().unwrap();
    let mut w = &a;
    w.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(matches!(
        recv::<Request>(&b),
        Err(ControlError::TooLarge { .. })
    ));
    let (a, b) = UnixStream::pair().unwrap();
    let mut w = &a;
    w.write_all(&3u32.to_le_bytes()).unwrap();
    w.write_all(&[0xff, 0xff, 0xff]).unwrap();
    assert!(matches!(
        recv::<Request>(&b),
        Err(ControlError::Malformed(_))
    ));
    drop(a);
    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    assert!(matches!(recv::<Request>(&b), Err(ControlError::Closed)));
}

#[test]
fn time_limits_parse_like_slurm() {
    assert_eq!(parse_time_limit("10"), Ok(600_000));
    assert_eq!(parse_time_limit("0:30"), Ok(30_000));
    assert_eq!(parse_time_limit("1:00:00"), Ok(3_600_000));
    assert_eq!(
        parse_time_limit("2-12"),
        Ok((2 * 86_400 + 12 * 3600) * 1000)
    );
    assert_eq!(parse_time_limit("1-0:0:5"), Ok((86_400 + 5) * 1000));
    assert!(
        parse_time_limit("abc")
            .unwrap_err()
            .contains("not a time limit")
    );
    assert!(parse_time_limit("0").unwrap_err().contains("zero"));
    assert!(parse_time_limit("1:2:3:4").is_err());
}

#[test]
fn exit_code_is_the_lowest_failing_rank() {
    let outcome = |ranks: Vec<Option<RankStatus>>| JobOutcome {
        job: 1,
        ranks,
        reason: None,
        abort_code: None,
        timing: Timing::default(),
        usage: Default::default(),
        cause: None,
        broadcast: false,
    };
    assert_eq!(outcome(vec![Some(RankStatus::Exited(0)); 3]).exit_code(), 0);
    // An MPI_Abort's code wins over the statuses of the ranks it had killed.
    let aborted = JobOutcome {
        abort_code: Some(7),
        ..outcome(vec![
            Some(RankStatus::Signaled(9)),
            Some(RankStatus::Exited(7)),
        ])
    };
    assert_eq!(aborted.exit_code(), 7);
    assert_eq!(
        outcome(vec![
            Some(RankStatus::Exited(0)),
            Some(RankStatus::Signaled(11)),
            Some(RankStatus::Exited(3))
        ])
        .exit_code(),
        139
    );
    assert_eq!(
        outcome(vec![Some(RankStatus::Exited(0)), None]).exit_code(),
        1
    );
}
