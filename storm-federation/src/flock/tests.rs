//! Tests of `flock`, apart so that its own file stays short.

use storm_cluster::messages::{OutputChunk, Stream};

use super::*;

fn order(job: JobId, peer: &str) -> FlockOrder {
    FlockOrder {
        job,
        peer: peer.into(),
        since_ms: 1,
        uid: 0,
        req: JobRequest::new("j", "/bin/true", "/"),
        input: Vec::new(),
    }
}

fn piece(offset: u64, data: &[u8], eof: bool) -> InputPiece {
    InputPiece {
        offset,
        data: data.to_vec(),
        eof,
    }
}

/// The pieces of standard input in `msgs`, as (job, offset, length, eof).
fn inputs(msgs: &[PeerMessage]) -> Vec<(JobId, u64, usize, bool)> {
    msgs.iter()
        .filter_map(|m| match m {
            PeerMessage::Input { job, piece, .. } => {
                Some((*job, piece.offset, piece.data.len(), piece.eof))
            }
            _ => None,
        })
        .collect()
}

fn output(offset: u64, data: &[u8]) -> FlockEvent {
    FlockEvent::Output(OutputChunk {
        job: 9,
        rank: 0,
        stream: Stream::Stdout,
        offset,
        data: data.to_vec(),
    })
}

/// The home side lists each peer's jobs, submits each until the peer speaks of it, takes
/// events in order once each (a repeat, or a gap, is not passed on), and starts counting
/// again for a new follower.
#[test]
fn the_home_side_takes_each_event_once_in_order() {
    let mut home = Home::default();
    home.set_orders(vec![order(1, "c1"), order(2, "c2")]);
    let (msgs, _) = home.messages_for("c1");
    assert!(matches!(&msgs[0], PeerMessage::Submit { job: 1, .. }));
    assert!(
        matches!(&msgs[1], PeerMessage::Want { jobs } if jobs == &vec![Wanted { job: 1, since_ms: 1, epoch: 0, taken: 0 }])
    );
    assert_eq!(msgs.len(), 2, "c2's job is not c1's business");
    let (from, fresh) = home
        .fresh(
            "c1",
            (1, 1),
            7,
            1,
            vec![FlockEvent::Accepted { remote: 40 }, output(0, b"a")],
        )
        .expect("the first events");
    assert_eq!((from, fresh.len()), (0, 2));
    home.took(1, 7, 2);
    assert_eq!(
        home.messages_for("c1").0.len(),
        1,
        "heard of: no Submit again"
    );
    // The same events again, and one more: only the new one.
    let (_, fresh) = home
        .fresh(
            "c1",
            (1, 1),
            7,
            1,
            vec![
                FlockEvent::Accepted { remote: 40 },
                output(0, b"a"),
                output(1, b"b"),
            ],
        )
        .unwrap();
    assert_eq!(fresh, vec![output(1, b"b")]);
    home.took(1, 7, 3);
    assert!(
        home.fresh("c1", (1, 1), 7, 5, vec![output(3, b"d")])
            .is_none(),
        "a gap"
    );
    assert!(
        home.fresh("c2", (1, 1), 7, 4, vec![output(2, b"c")])
            .is_none(),
        "not c2's job"
    );
    // A new follower numbers from 1.
    let (from, _) = home
        .fresh("c1", (1, 1), 8, 1, vec![output(0, b"a")])
        .unwrap();
    assert_eq!(from, 0);
    // A new link: the peer hears the Submit again.
    home.link_up("c1");
    assert_eq!(home.messages_for("c1").0.len(), 2);
    // Sent again after it came back: a new submission, which the peer hears.
    home.fresh("c1", (1, 1), 8, 1, vec![output(0, b"a")]);
    home.set_orders(vec![FlockOrder {
        since_ms: 2,
        ..order(1, "c1")
    }]);
    assert_eq!(home.messages_for("c1").0.len(), 2);
    home.set_orders(vec![]);
    assert!(matches!(&home.messages_for("c1").0[0], PeerMessage::Want { jobs } if jobs.is_empty()));
}

/// A follower sends each event once per link, again after a new link or a `Want` that
/// shows the home side did not take it, and lets go of what was taken.
#[test]
fn a_follower_sends_until_taken() {
    let f = Follower::new("c0", 5, 1);
    f.push(FlockEvent::Accepted { remote: 3 });
    f.push(output(0, b"hello"));
    let m = f.unsent();
    assert!(
        matches!(&m[0], (PeerMessage::Events { first: 1, events, .. }, 2) if events.len() == 2)
    );
    assert_eq!(f.unsent().len(), 1, "not sent until the link took it");
    f.sent_upto(2);
    assert!(f.unsent().is_empty(), "sent once");
    f.taken(1);
    let m = f.unsent();
    assert!(
        matches!(&m[0], (PeerMessage::Events { first: 2, events, .. }, 2) if events == &vec![output(0, b"hello")]),
        "{m:?}"
    );
    f.sent_upto(2);
    f.taken(2);
    assert!(f.unsent().is_empty());
    assert_eq!(f.state.lock().held_bytes, 0);
}

/// A home that stays away for the timeout loses the jobs it flocked here; one back in
/// time keeps them; a `Want` without a job withdraws it.
#[test]
fn the_peer_side_withdraws_what_its_home_gave_up() {
    let mut hosted = Hosted::default();
    hosted.add(Follower::new("c0", 1, 1));
    hosted.add(Follower::new("c0", 2, 1));
    hosted.add(Follower::new("c2", 1, 1));
    let t0 = Instant::now();
    let timeout = Duration::from_secs(5);
    let t0 = t0 + timeout * 10;
    let states = vec![
        ("c0".to_string(), false, Some(Duration::ZERO)),
        ("c2".to_string(), true, Some(Duration::ZERO)),
    ];
    assert!(hosted.homes(&states, t0, timeout).is_empty());
    let back = vec![
        ("c0".to_string(), true, Some(Duration::ZERO)),
        ("c2".to_string(), true, Some(Duration::ZERO)),
    ];
    assert!(hosted.homes(&back, t0 + timeout, timeout).is_empty());
    hosted.homes(&states, t0 + timeout * 2, timeout);
    let gone = hosted.homes(&states, t0 + timeout * 3, timeout);
    assert_eq!(gone.len(), 2, "c0's two jobs");
    // Silent: away from when it was last heard, not from when it was seen down.
    hosted.add(Follower::new("c0", 4, 1));
    let silent = vec![("c0".to_string(), false, Some(timeout))];
    assert_eq!(hosted.homes(&silent, t0 + timeout * 5, timeout).len(), 1);
    assert!(hosted.has("c2", 1, 1));
    hosted.add(Follower::new("c0", 3, 1));
    let gone = hosted.want("c0", &[]);
    assert_eq!(gone.len(), 1);
    assert!(!hosted.has("c0", 3, 1) && hosted.has("c2", 1, 1));
}

/// A job sent again to the same peer (it came back home, then went out again) is a new
/// sending: the peer cancels the follower of the earlier one, and the home side never
/// takes that follower's events for the new one's. Before, a follower still there (a
/// link that failed one way: home saw the peer away, the peer still heard home) went on
/// as the new sending, mid-way, though its home had said the job runs from the start.
#[test]
fn a_follower_of_an_earlier_sending_is_withdrawn_and_its_news_is_not_taken() {
    let mut home = Home::default();
    home.set_orders(vec![FlockOrder {
        since_ms: 2,
        ..order(1, "c1")
    }]);
    let ended = FlockEvent::Refused("the old sending".into());
    assert!(
        home.fresh("c1", (1, 1), 7, 1, vec![ended.clone()])
            .is_none(),
        "the earlier sending's events are old news"
    );
    assert_eq!(
        home.messages_for("c1").0.len(),
        2,
        "and do not count as the peer having heard of the new one: Submit goes again"
    );
    let (_, fresh) = home.fresh("c1", (1, 2), 8, 1, vec![ended]).unwrap();
    assert_eq!(fresh.len(), 1, "the current sending's are taken");

    let mut hosted = Hosted::default();
    hosted.add(Follower::new("c0", 1, 1));
    hosted.add(Follower::new("c0", 1, 2));
    let wanted = |since_ms| Wanted {
        job: 1,
        since_ms,
        epoch: 0,
        taken: 0,
    };
    let gone = hosted.want("c0", &[wanted(2)]);
    assert_eq!(
        gone.iter().map(|f| f.since_ms).collect::<Vec<_>>(),
        vec![1],
        "the earlier sending's follower is withdrawn"
    );
    assert!(hosted.has("c0", 1, 2) && !hosted.has("c0", 1, 1));
    assert!(
        hosted.want("c0", &[wanted(2)]).is_empty(),
        "the current one stays"
    );
}

/// A home's new link (the old one ended while a job of it ran here) sends again what the
/// home has not taken, on the new link, and returns: it used to hang for good, holding
/// every follower, when a follower was there.
#[test]
fn a_new_link_to_a_home_sends_again_what_it_did_not_take() {
    let mut hosted = Hosted::default();
    let f = Follower::new("c0", 1, 1);
    f.push(FlockEvent::Accepted { remote: 3 });
    let (tx, rx) = std::sync::mpsc::sync_channel(LINK_QUEUE);
    hosted.link_up("c0", 1, tx.clone());
    hosted.add(f.clone());
    assert!(
        matches!(rx.try_recv(), Ok(PeerMessage::Events { first: 1, .. })),
        "sent on the link"
    );
    // On a thread, so that a hang fails the test instead of stalling it.
    let hosted = Arc::new(Mutex::new(hosted));
    let (done, returned) = std::sync::mpsc::channel();
    let h = hosted.clone();
    std::thread::spawn(move || {
        h.lock().link_up("c0", 2, tx);
        let _ = done.send(());
    });
    assert!(
        returned.recv_timeout(Duration::from_secs(10)).is_ok(),
        "a new link to a home with a follower here returns"
    );
    hosted.lock().flush(&f);
    assert!(
        matches!(rx.try_recv(), Ok(PeerMessage::Events { first: 1, .. })),
        "not taken: sent again on the new link"
    );
}

/// By default a peer's jobs run as its `flock_user` whatever owner it names (its word
/// reaches no local user's files); with `same_users`, as the account of the owner's name
/// if there is one; never as root.
#[test]
fn a_flocked_job_runs_as_the_dedicated_account_unless_users_are_shared_never_as_root() {
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let daemon = nix::unistd::User::from_name("daemon").unwrap().unwrap();
    let peer = PeerEntry {
        name: "c0".into(),
        address: "127.0.0.1:1".parse().unwrap(),
        key_file: "k".into(),
        lend: true,
        borrow: false,
        flock_user: None,
        same_users: false,
        guest_file: None,
        mm_public_key_file: None,
        priority: 0,
    };
    let e = local_account("daemon", &peer, "c1").unwrap_err();
    assert!(e.contains("names no flock_user"), "{e}");
    let dedicated = PeerEntry {
        flock_user: Some("nobody".into()),
        ..peer.clone()
    };
    for user in ["daemon", "root", "no-such-user-here"] {
        let (uid, _) = local_account(user, &dedicated, "c1").unwrap();
        assert_eq!(
            uid,
            nobody.uid.as_raw(),
            "{user} runs as the dedicated account"
        );
    }
    let shared = PeerEntry {
        same_users: true,
        guest_file: None,
        mm_public_key_file: None,
        ..dedicated.clone()
    };
    assert_eq!(
        local_account("daemon", &shared, "c1").unwrap().0,
        daemon.uid.as_raw()
    );
    assert_eq!(
        local_account("no-such-user-here", &shared, "c1").unwrap().0,
        nobody.uid.as_raw()
    );
    let e = local_account("root", &shared, "c1").unwrap_err();
    assert!(e.contains("never run as root"), "{e}");
    let e = local_account(
        "no-such-user-here",
        &PeerEntry {
            flock_user: None,
            ..shared
        },
        "c1",
    )
    .unwrap_err();
    assert!(e.contains("no account on c1"), "{e}");
    let root_account = PeerEntry {
        flock_user: Some("root".into()),
        ..dedicated
    };
    assert!(local_account("daemon", &root_account, "c1").is_err());
}

/// The home side sends each piece of a job's standard input to the job's peer once,
/// after the job's `Submit` and the list; keeps at most the window of it a job while the
/// link is down; drops a piece larger than the MM takes, and the input of a job no longer
/// flocked.
#[test]
fn the_home_side_sends_each_piece_of_input_once_within_the_window() {
    let mut home = Home::default();
    home.set_orders(vec![FlockOrder {
        input: vec![piece(0, b"ab", false), piece(2, b"cd", true)],
        ..order(1, "c1")
    }]);
    assert!(
        inputs(&home.messages_for("c2").0).is_empty(),
        "not c2's job"
    );
    let (msgs, _) = home.messages_for("c1");
    assert!(matches!(&msgs[0], PeerMessage::Submit { job: 1, .. }));
    assert!(matches!(&msgs[1], PeerMessage::Want { .. }));
    assert_eq!(inputs(&msgs), vec![(1, 0, 2, false), (1, 2, 2, true)]);
    assert!(inputs(&home.messages_for("c1").0).is_empty(), "sent once");

    // Fetches while the link is down: kept up to the window (four full chunks); a piece
    // over the MM's limit never goes.
    let chunk = vec![b'x'; MAX_INPUT_CHUNK];
    let chunks = INPUT_WINDOW as usize / MAX_INPUT_CHUNK;
    home.set_orders(vec![FlockOrder {
        input: vec![
            piece(0, &chunk, false),
            piece(0, &vec![b'y'; MAX_INPUT_CHUNK + 1], false),
        ],
        ..order(1, "c1")
    }]);
    home.set_orders(vec![FlockOrder {
        input: (1..=chunks)
            .map(|i| piece((i * MAX_INPUT_CHUNK) as u64, &chunk, false))
            .collect(),
        ..order(1, "c1")
    }]);
    let expected: Vec<_> = (0..chunks)
        .map(|i| (1, (i * MAX_INPUT_CHUNK) as u64, MAX_INPUT_CHUNK, false))
        .collect();
    assert_eq!(
        inputs(&home.messages_for("c1").0),
        expected,
        "over the window, or the chunk limit, is dropped"
    );

    // A job no longer flocked takes its unsent input along.
    home.set_orders(vec![FlockOrder {
        input: vec![piece(0, b"late", false)],
        ..order(1, "c1")
    }]);
    home.set_orders(vec![]);
    home.set_orders(vec![order(1, "c1")]);
    assert!(inputs(&home.messages_for("c1").0).is_empty());
}

/// The peer side passes a piece of input to the MM on the follower's own connection (the
/// MM takes input from the job's submitter only), as the MM's id of the job; before the
/// MM took the job, or with no connection, or over the MM's limit, nothing goes.
#[test]
fn a_follower_passes_input_on_its_own_connection() {
    use std::os::unix::net::UnixStream;
    let f = Follower::new("c0", 5, 1);
    let (ours, mm_end) = UnixStream::pair().unwrap();
    *f.conn.lock() = Some(Arc::new(Client {
        sock: ours,
        cluster: "c1".into(),
        nodes: 1,
    }));
    f.input(piece(0, b"early", false));
    f.push(FlockEvent::Accepted { remote: 40 });
    f.input(piece(0, &vec![b'y'; MAX_INPUT_CHUNK + 1], false));
    f.input(piece(3, b"hello\n", true));
    *f.conn.lock() = None;
    f.input(piece(9, b"lost", false));
    mm_end.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    while let Ok((r, _)) = storm_cluster::control::recv::<Request>(&mm_end) {
        got.push(r);
    }
    assert_eq!(
        got,
        vec![Request::Input {
            job: 40,
            offset: 3,
            data: b"hello\n".to_vec(),
            eof: true,
        }]
    );
}
