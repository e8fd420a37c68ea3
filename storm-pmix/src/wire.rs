//! What a node manager and its PMIx helper say to each other, over the Unix stream socket
//! that is the helper's standard input.
//!
//! A message is a frame: its body's length (u32, little-endian), then the body (bincode,
//! standard configuration). Each side bounds what it reads ([`read_frame`]'s `max`): the NM
//! takes from the helper at most one node's fence data and what goes with it, the helper
//! from the NM at most a fence's whole result. The helper hosts a C library that parses what
//! any local user sends it, so the NM treats every [`Event`] as a claim: it is decoded
//! without panicking, bounded, and acted on only for a job the NM registered with it.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

/// One MPI job, as the NM registers it with its helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// `storm-JOB`.
    pub nspace: String,
    /// Ranks in the job.
    pub size: u32,
    /// The job's nodes' names, in the job's order, and each node's ranks.
    pub nodes: Vec<(String, Vec<u32>)>,
    /// This node's index among them.
    pub node: u32,
    /// The account its tasks run as: a client's credential must name it.
    pub uid: u32,
    pub gid: u32,
}

/// A variable for a task's environment (bytes: names and values need not be UTF-8).
pub type EnvVar = (Vec<u8>, Vec<u8>);

/// From the NM to its helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Serve job `job`'s local `ranks`; answered by [`Event::Registered`].
    Register { job: JobInfo, ranks: Vec<u32> },
    /// The job is gone: forget it.
    Deregister { nspace: String },
    /// Fence `id`'s result: every node's data, in node order; or why it failed.
    FenceResult {
        id: u64,
        result: Result<Vec<u8>, String>,
    },
    /// The NM has taken event `id` (a connection, finalization or abort): the client's
    /// call may return. Its next act (say, exiting) then cannot overtake the event.
    Done { id: u64 },
    /// Direct modex `id`'s answer: the remote rank's data, or why there is none.
    ModexResult {
        id: u64,
        result: Result<Vec<u8>, String>,
    },
    /// Another node wants the data of local rank `rank` of job `nspace`: answered by
    /// [`Event::ModexData`] once the rank has committed it.
    ServeModex { nspace: String, rank: u32 },
    /// Rank `rank` of job `nspace` ended (on this node or another): tell the job's local
    /// clients, as PMIx event `status` (`PMIX_ERR_PROC_ABORTED_BY_SIG`, ...) with the
    /// rank's exit code.
    Notify {
        nspace: String,
        rank: u32,
        status: i32,
        exit_code: i32,
    },
}

/// From the helper to its NM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// The server runs (the first message): the library's version.
    Ready { version: String },
    /// The server could not start (the only message; the helper then exits).
    Failed { why: String },
    /// Job `nspace` is registered: each rank's additions to its environment, in the order
    /// the ranks were asked for; or why not.
    Registered {
        nspace: String,
        result: Result<Vec<Vec<EnvVar>>, String>,
    },
    /// A client connected (its credential checked against its job's account). Its
    /// `PMIx_Init` returns when the NM answers [`Request::Done`] with `id` (0: answer none).
    Connected { nspace: String, rank: u32, id: u64 },
    /// It called `PMIx_Finalize` (which returns at the NM's `Done`).
    Finalized { nspace: String, rank: u32, id: u64 },
    /// It called `PMIx_Abort` (which returns at the NM's `Done`); the message is cut to
    /// [`MAX_ABORT_MESSAGE`] bytes.
    Abort {
        nspace: String,
        rank: u32,
        status: i32,
        message: String,
        id: u64,
    },
    /// Every local client of job `nspace` entered fence `id`: this node's data.
    Fence {
        id: u64,
        nspace: String,
        data: Vec<u8>,
    },
    /// Every local client of job `nspace` entered fence `id` with more data than one
    /// node may give a fence (`bytes`, above the helper's `--max-fence-bytes`).
    FenceTooLarge { id: u64, nspace: String, bytes: u64 },
    /// A local client of job `nspace` asks for the data of rank `rank`, which runs on
    /// another node (a direct modex: the job's fences did not collect it). Answered by
    /// [`Request::ModexResult`] with `id`.
    DirectModex { id: u64, nspace: String, rank: u32 },
    /// The data of local rank `rank` the NM asked for ([`Request::ServeModex`]); more than
    /// one node may give a fence is refused here, naming its size.
    ModexData {
        nspace: String,
        rank: u32,
        result: Result<Vec<u8>, String>,
    },
}

/// The longest abort message passed on, in bytes.
pub const MAX_ABORT_MESSAGE: usize = 1024;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the link is closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a message of {len} bytes exceeds the {max} allowed")]
    TooLong { len: usize, max: usize },
    #[error("a malformed message: {0}")]
    Malformed(String),
}

/// Writes `msg` as one frame.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), WireError> {
    let body = bincode::serde::encode_to_vec(msg, bincode::config::standard())
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    let len = u32::try_from(body.len()).map_err(|_| WireError::TooLong {
        len: body.len(),
        max: u32::MAX as usize,
    })?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame of at most `max` body bytes. The end of the link before a frame begins
/// is [`WireError::Closed`]; a frame longer than `max` is refused before its body is read
/// (the link is then out of step and must be given up).
pub fn read_frame<T: serde::de::DeserializeOwned>(
    r: &mut impl Read,
    max: usize,
) -> Result<T, WireError> {
    let mut head = [0u8; 4];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(WireError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > max {
        return Err(WireError::TooLong { len, max });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let (msg, used) = storm_primitives::codec::decode::<T>(&body)
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != len {
        return Err(WireError::Malformed(format!(
            "{} bytes after the message",
            len - used
        )));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message comes back as it went, one after another on one stream.
    #[test]
    fn frames_carry_messages_whole_and_in_order() {
        let sent = vec![
            Event::Ready {
                version: "4.2.2".into(),
            },
            Event::Fence {
                id: 7,
                nspace: "storm-3".into(),
                data: vec![0, 1, 2, 255],
            },
            Event::Registered {
                nspace: "storm-3".into(),
                result: Ok(vec![vec![(b"PMIX_RANK".to_vec(), b"0".to_vec())]]),
            },
            Event::DirectModex {
                id: 9,
                nspace: "storm-3".into(),
                rank: 5,
            },
            Event::ModexData {
                nspace: "storm-3".into(),
                rank: 1,
                result: Err("too large".into()),
            },
        ];
        let mut requests = Vec::new();
        write_frame(&mut requests, &Request::Done { id: 3 }).unwrap();
        assert_eq!(
            read_frame::<Request>(&mut &requests[..], 64).unwrap(),
            Request::Done { id: 3 }
        );
        let mut buf = Vec::new();
        for m in &sent {
            write_frame(&mut buf, m).unwrap();
        }
        let mut r = &buf[..];
        let got: Vec<Event> = (0..sent.len())
            .map(|_| read_frame(&mut r, 1 << 20).unwrap())
            .collect();
        assert_eq!(got, sent);
        assert!(matches!(
            read_frame::<Event>(&mut r, 1 << 20),
            Err(WireError::Closed)
        ));
    }

    /// A frame longer than the reader allows is refused from its length alone, before any
    /// of its body is taken; a body that is not a message, or has bytes after one, is
    /// refused too. None of them panics.
    #[test]
    fn oversized_and_malformed_frames_are_refused() {
        let mut big = Vec::new();
        write_frame(
            &mut big,
            &Event::Fence {
                id: 1,
                nspace: "storm-1".into(),
                data: vec![9; 1000],
            },
        )
        .unwrap();
        assert!(matches!(
            read_frame::<Event>(&mut &big[..], 100),
            Err(WireError::TooLong { max: 100, .. })
        ));
        // A length that claims 4 GiB.
        let huge = [0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<Event>(&mut &huge[..], 1 << 20),
            Err(WireError::TooLong { .. })
        ));
        for body in [vec![200u8, 1, 2, 3], vec![5u8; 40], Vec::new()] {
            let mut frame = (body.len() as u32).to_le_bytes().to_vec();
            frame.extend(&body);
            assert!(
                matches!(
                    read_frame::<Event>(&mut &frame[..], 1 << 20),
                    Err(WireError::Malformed(_))
                ),
                "{body:?}"
            );
        }
        let mut trailing = Vec::new();
        write_frame(&mut trailing, &Request::Deregister { nspace: "x".into() }).unwrap();
        trailing[0] += 1;
        trailing.push(0);
        assert!(matches!(
            read_frame::<Request>(&mut &trailing[..], 1 << 20),
            Err(WireError::Malformed(_))
        ));
    }
}
