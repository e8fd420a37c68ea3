//! The file a replica's Raft log lives in: `raft.wal`, a sequence of records only ever
//! appended to, in the state directory.
//!
//! The file starts with [`MAGIC`] and the format's version. Each record is framed as its
//! body's length (u32, little-endian), the body's XXH3-64 (u64), then the body: a kind byte
//! and the kind's fields ([`Record`]). An append writes its frames at the end in one write
//! and, when asked, syncs them with `fdatasync` before it returns.
//!
//! The file grows ahead of the records in zero-filled chunks ([`CHUNK`]), synced once each, so
//! that a record's sync flushes its data only, never the file's size or its extents. On this
//! project's test host that halves what each sync costs against a copy-on-write B-tree commit
//! (redb's, which the log used before). A zero length marks the end of the records.
//!
//! A crash during an append can leave a record cut short or half written: its checksum fails,
//! and opening the file clears it and what follows. Nothing in it was acknowledged, as its
//! sync had not returned. A record whose checksum holds but whose body does not decode is not
//! a crash's work, and opening fails with an error that names its offset.
//!
//! Compaction writes the records that still matter into `raft.wal.new`, syncs it, and
//! renames it over the log ([`Wal::rewrite`]): a crash leaves either the old file or the new.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState};
use storm_cluster::daemon_dir::DaemonDir;
use xxhash_rust::xxh3::xxh3_64;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"STORMWAL";
/// The format's version, after the magic (u32), then four bytes kept zero.
const VERSION: u32 = 1;
const HEADER: usize = 16;
/// A frame's length and checksum.
const FRAME: usize = 12;
/// How far the file grows ahead of its records at a time.
pub const CHUNK: u64 = 256 << 10;

/// What can go wrong with the log's file.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Corrupt(String),
}

/// One change to the log, as written.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Entries, which replace any held from the first one's index on, and the hard state
    /// written with them.
    Entries {
        entries: Vec<Entry>,
        hard: Option<HardState>,
    },
    /// The hard state (term, vote, commit index).
    Hard(HardState),
    /// Every entry up to this one is in the journal durably.
    Applied(u64),
    /// The entries up to `index` were dropped (the journal holds them); `term` is that
    /// entry's term.
    Compacted { index: u64, term: u64 },
    /// The leader's snapshot, a position only: every entry is dropped, the log starts after
    /// `index` (of `term`), and the journal wants a state as of `index`.
    Snapshot {
        index: u64,
        term: u64,
        hard: HardState,
    },
    /// The journal wants another replica's state as of this entry.
    WantsState(u64),
    /// The journal took another replica's state.
    StateTaken,
    /// The group's configuration after a change applied (or a snapshot taken): who votes,
    /// who learns. A log without one holds the group the cluster file names.
    Conf(ConfState),
    /// This replica's Raft id, given by the leader when it joined the group (a log without
    /// one is of a replica of the first generation: its position plus one).
    Identity(u64),
}

const ENTRIES: u8 = 1;
const HARD: u8 = 2;
const APPLIED: u8 = 3;
const COMPACTED: u8 = 4;
const SNAPSHOT: u8 = 5;
const WANTS_STATE: u8 = 6;
const STATE_TAKEN: u8 = 7;
const CONF: u8 = 8;
const IDENTITY: u8 = 9;

impl Record {
    /// The record's body: its kind, then its fields.
    fn body(&self) -> Result<Vec<u8>, WalError> {
        let proto = |m: &dyn protobuf::Message| {
            m.write_to_bytes()
                .map_err(|e| WalError::Corrupt(format!("cannot encode a log record: {e}")))
        };
        let mut out = Vec::new();
        match self {
            Record::Entries { entries, hard } => {
                out.push(ENTRIES);
                match hard {
                    Some(hs) => {
                        out.push(1);
                        put_bytes(&mut out, &proto(hs)?);
                    }
                    None => out.push(0),
                }
                put_u32(&mut out, entries.len());
                for e in entries {
                    put_bytes(&mut out, &proto(e)?);
                }
            }
            Record::Hard(hs) => {
                out.push(HARD);
                put_bytes(&mut out, &proto(hs)?);
            }
            Record::Applied(index) => {
                out.push(APPLIED);
                out.extend_from_slice(&index.to_le_bytes());
            }
            Record::Compacted { index, term } => {
                out.push(COMPACTED);
                out.extend_from_slice(&index.to_le_bytes());
                out.extend_from_slice(&term.to_le_bytes());
            }
            Record::Snapshot { index, term, hard } => {
                out.push(SNAPSHOT);
                out.extend_from_slice(&index.to_le_bytes());
                out.extend_from_slice(&term.to_le_bytes());
                put_bytes(&mut out, &proto(hard)?);
            }
            Record::WantsState(index) => {
                out.push(WANTS_STATE);
                out.extend_from_slice(&index.to_le_bytes());
            }
            Record::StateTaken => out.push(STATE_TAKEN),
            Record::Conf(conf) => {
                out.push(CONF);
                put_bytes(&mut out, &proto(conf)?);
            }
            Record::Identity(id) => {
                out.push(IDENTITY);
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
        Ok(out)
    }

    /// Decodes a record's body; the error says what is wrong.
    pub fn decode(body: &[u8]) -> Result<Record, String> {
        let mut r = Reader(body);
        let record = match r.u8()? {
            ENTRIES => {
                let hard = match r.u8()? {
                    0 => None,
                    1 => Some(hard_state(r.bytes()?)?),
                    other => return Err(format!("a hard-state flag of {other}")),
                };
                let count = r.u32()?;
                // Each entry takes at least its length's four bytes.
                if count > r.0.len() / 4 {
                    return Err(format!("{count} entries in {} bytes", r.0.len()));
                }
                let mut entries = Vec::with_capacity(count);
                for i in 0..count {
                    let e = Entry::parse_from_bytes(r.bytes()?)
                        .map_err(|e| format!("entry {i} of the record: {e}"))?;
                    entries.push(e);
                }
                Record::Entries { entries, hard }
            }
            HARD => Record::Hard(hard_state(r.bytes()?)?),
            APPLIED => Record::Applied(r.u64()?),
            COMPACTED => Record::Compacted {
                index: r.u64()?,
                term: r.u64()?,
            },
            SNAPSHOT => Record::Snapshot {
                index: r.u64()?,
                term: r.u64()?,
                hard: hard_state(r.bytes()?)?,
            },
            WANTS_STATE => Record::WantsState(r.u64()?),
            STATE_TAKEN => Record::StateTaken,
            CONF => Record::Conf(
                ConfState::parse_from_bytes(r.bytes()?)
                    .map_err(|e| format!("a group configuration: {e}"))?,
            ),
            IDENTITY => Record::Identity(r.u64()?),
            kind => return Err(format!("an unknown record kind {kind}")),
        };
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the record", r.0.len()));
        }
        Ok(record)
    }
}

fn hard_state(bytes: &[u8]) -> Result<HardState, String> {
    HardState::parse_from_bytes(bytes).map_err(|e| format!("a hard state: {e}"))
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Reads fields off the front of a body.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("{n} bytes wanted, {} left", self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<usize, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut word = [0; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()?;
        self.take(n)
    }
}

/// `records` framed, one after the other.
fn frames(records: &[Record]) -> Result<Vec<u8>, WalError> {
    let mut out = Vec::new();
    for rec in records {
        let body = rec.body()?;
        let len = u32::try_from(body.len())
            .map_err(|_| WalError::Corrupt(format!("a log record of {} bytes", body.len())))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
        out.extend_from_slice(&body);
    }
    Ok(out)
}

/// What reading a log's bytes found.
#[derive(Debug)]
pub struct Scan {
    pub records: Vec<Record>,
    /// Where the records end.
    pub end: usize,
    /// Whether they end at a record cut short or half written (else at zeros or the file's
    /// end).
    pub torn: bool,
}

/// Reads the records of a whole log file's bytes.
pub fn scan(bytes: &[u8]) -> Result<Scan, String> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err("not a storm Raft log (its first bytes are not STORMWAL)".into());
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != VERSION {
        return Err(format!(
            "format {version}, and this storm reads format {VERSION}"
        ));
    }
    let mut records = Vec::new();
    let mut pos = HEADER;
    let torn = loop {
        let Some(frame) = bytes.get(pos..pos + FRAME) else {
            // Fewer bytes left than a frame takes: zeros are the file's unused end.
            break bytes[pos.min(bytes.len())..].iter().any(|&b| b != 0);
        };
        let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        if len == 0 {
            break false;
        }
        let mut sum = [0; 8];
        sum.copy_from_slice(&frame[4..]);
        let Some(body) = bytes.get(pos + FRAME..pos + FRAME + len) else {
            break true;
        };
        if xxh3_64(body) != u64::from_le_bytes(sum) {
            break true;
        }
        let record =
            Record::decode(body).map_err(|why| format!("the record at byte {pos}: {why}"))?;
        records.push(record);
        pos += FRAME + len;
    };
    Ok(Scan {
        records,
        end: pos,
        torn,
    })
}

/// The log's file, open for appending.
pub struct Wal {
    dir: DaemonDir,
    name: String,
    file: File,
    /// Where the next record goes.
    end: u64,
    /// The file's length: zeros from `end` to here.
    allocated: u64,
}

impl Wal {
    /// Opens the log `name` in `dir` and reads its records. A record cut short by a crash is
    /// cleared, with what follows it.
    pub fn open(dir: &DaemonDir, name: &str) -> Result<(Self, Vec<Record>), WalError> {
        let mut bytes = Vec::new();
        dir.open_file(name)?.read_to_end(&mut bytes)?;
        let scan = scan(&bytes).map_err(WalError::Corrupt)?;
        let wal = Wal {
            dir: dir.try_clone()?,
            name: name.to_owned(),
            file: dir.open_for_writing(name)?,
            end: scan.end as u64,
            allocated: bytes.len() as u64,
        };
        if scan.torn {
            tracing::warn!(
                offset = scan.end,
                "the Raft log {} ends in a record cut short (a crash during a write, never \
                 acknowledged): it is cleared",
                dir.join(name).display()
            );
            wal.zero(wal.end, wal.allocated)?;
            wal.file.sync_data()?;
        }
        Ok((wal, scan.records))
    }

    /// Creates the log `name` in `dir` afresh, holding `records` (in the way of
    /// [`Wal::rewrite`]).
    pub fn create(dir: &DaemonDir, name: &str, records: &[Record]) -> Result<Self, WalError> {
        let (file, end, allocated) = write_new(dir, name, records)?;
        Ok(Wal {
            dir: dir.try_clone()?,
            name: name.to_owned(),
            file,
            end,
            allocated,
        })
    }

    /// Appends `records` in one write, synced before it returns if `sync`.
    pub fn append(&mut self, records: &[Record], sync: bool) -> Result<(), WalError> {
        let bytes = frames(records)?;
        let needed = self.end + bytes.len() as u64;
        if needed > self.allocated {
            let grown = needed.div_ceil(CHUNK) * CHUNK;
            self.zero(self.allocated, grown)?;
            self.allocated = grown;
            // The new length is durable now, so that syncing a record needs no metadata.
            self.file.sync_data()?;
        }
        self.file.write_all_at(&bytes, self.end)?;
        self.end = needed;
        if sync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Replaces the whole log with `records`: written to a new file, synced, and renamed over
    /// the log, so that a crash leaves the old log or the new one.
    pub fn rewrite(&mut self, records: &[Record]) -> Result<(), WalError> {
        let (file, end, allocated) = write_new(&self.dir, &self.name, records)?;
        self.file = file;
        self.end = end;
        self.allocated = allocated;
        Ok(())
    }

    /// Bytes the records take.
    pub fn len(&self) -> u64 {
        self.end
    }

    /// Whether the log holds no record.
    pub fn is_empty(&self) -> bool {
        self.end <= HEADER as u64
    }

    /// Writes zeros over `from..to`.
    fn zero(&self, from: u64, to: u64) -> std::io::Result<()> {
        let zeros = vec![0u8; (to - from).min(1 << 20) as usize];
        let mut at = from;
        while at < to {
            let n = (to - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
}

/// A log file's first bytes: the magic, the format's version, four zeros.
fn header() -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes
}

/// Writes a log holding `records` to `NAME.new`, syncs it and renames it to `name`; returns the
/// file, where its records end and its length.
fn write_new(
    dir: &DaemonDir,
    name: &str,
    records: &[Record],
) -> Result<(File, u64, u64), WalError> {
    let fresh = format!("{name}.new");
    let file = dir.create_file(&fresh)?;
    let mut bytes = header();
    bytes.extend_from_slice(&frames(records)?);
    let end = bytes.len() as u64;
    let allocated = (end + 1).div_ceil(CHUNK) * CHUNK;
    bytes.resize(allocated as usize, 0);
    file.write_all_at(&bytes, 0)?;
    file.sync_all()?;
    dir.rename(&fresh, name)?;
    dir.sync()?;
    Ok((file, end, allocated))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An entry of `term` at `index` holding `data` (the log's tests use it too).
    pub(in crate::replica) fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    fn sample() -> Vec<Record> {
        let hs = HardState {
            term: 3,
            vote: 2,
            commit: 7,
            ..Default::default()
        };
        vec![
            Record::Compacted { index: 4, term: 2 },
            Record::Entries {
                entries: vec![entry(5, 2, b"five"), entry(6, 3, b"six")],
                hard: Some(hs.clone()),
            },
            Record::Entries {
                entries: vec![],
                hard: None,
            },
            Record::Hard(hs.clone()),
            Record::Applied(6),
            Record::Snapshot {
                index: 9,
                term: 3,
                hard: hs,
            },
            Record::WantsState(9),
            Record::Conf(ConfState::from((vec![1, 3], vec![(7 << 16) | 2]))),
            Record::Identity((7 << 16) | 2),
            Record::StateTaken,
        ]
    }

    #[test]
    fn every_kind_of_record_reads_back_as_written_across_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let all = sample();
        {
            let mut wal = Wal::create(&dir, "raft.wal", &all[..2]).unwrap();
            wal.append(&all[2..5], true).unwrap();
            wal.append(&all[5..], false).unwrap();
        }
        let (_, got) = Wal::open(&dir, "raft.wal").unwrap();
        assert_eq!(got, all);
    }

    #[test]
    fn the_file_grows_in_zeroed_chunks_so_a_sync_writes_data_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let mut wal = Wal::create(&dir, "raft.wal", &[]).unwrap();
        let len = || {
            std::fs::metadata(tmp.path().join("raft.wal"))
                .unwrap()
                .len()
        };
        assert_eq!(len(), CHUNK);
        let big = entry(1, 1, &vec![7; CHUNK as usize]);
        wal.append(
            &[Record::Entries {
                entries: vec![big.clone()],
                hard: None,
            }],
            true,
        )
        .unwrap();
        assert_eq!(len(), 2 * CHUNK, "grown by whole chunks");
        wal.append(&[Record::Applied(1)], true).unwrap();
        assert_eq!(len(), 2 * CHUNK, "a small record fits in what was grown");
        drop(wal);
        let (wal, got) = Wal::open(&dir, "raft.wal").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], Record::Applied(1));
        assert!(wal.len() < 2 * CHUNK);
    }

    #[test]
    fn a_record_cut_short_by_a_crash_is_cleared_and_the_log_goes_on_after_the_last_whole_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let all = sample();
        let whole_end;
        {
            let mut wal = Wal::create(&dir, "raft.wal", &all[..2]).unwrap();
            whole_end = wal.len();
            wal.append(&all[3..4], true).unwrap();
            // The crash: the last record's last bytes never reached the disk.
            let cut = wal.len() - 3;
            wal.zero(cut, wal.len()).unwrap();
        }
        let (mut wal, got) = Wal::open(&dir, "raft.wal").unwrap();
        assert_eq!(got, all[..2], "the torn record is not read");
        assert_eq!(wal.len(), whole_end);
        wal.append(&[Record::Applied(6)], true).unwrap();
        drop(wal);
        let (_, got) = Wal::open(&dir, "raft.wal").unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[2],
            Record::Applied(6),
            "appends go on after the last whole record"
        );
    }

    #[test]
    fn garbage_after_the_records_is_cleared_so_it_cannot_pass_for_a_record_later() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let end;
        {
            let wal = Wal::create(&dir, "raft.wal", &sample()[..1]).unwrap();
            end = wal.len();
            // A half-written frame: a length and a checksum that do not match.
            wal.file.write_all_at(&[9, 0, 0, 0, 1, 2, 3], end).unwrap();
        }
        let _ = Wal::open(&dir, "raft.wal").unwrap();
        let bytes = std::fs::read(tmp.path().join("raft.wal")).unwrap();
        assert!(bytes[end as usize..].iter().all(|&b| b == 0));
    }

    #[test]
    fn records_that_end_a_few_bytes_before_the_files_end_are_not_taken_for_a_torn_one() {
        let mut bytes = header();
        bytes.extend_from_slice(&frames(&[Record::Applied(3)]).unwrap());
        let end = bytes.len();
        bytes.extend_from_slice(&[0; FRAME - 1]);
        let clean = scan(&bytes).unwrap();
        assert_eq!((clean.end, clean.torn), (end, false));
        bytes[end + 2] = 7;
        assert!(
            scan(&bytes).unwrap().torn,
            "a few bytes that are not zeros are"
        );
    }

    #[test]
    fn a_rewrite_replaces_the_records_and_leaves_no_new_file_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let all = sample();
        let mut wal = Wal::create(&dir, "raft.wal", &all).unwrap();
        wal.rewrite(&all[3..5]).unwrap();
        wal.append(&[Record::StateTaken], true).unwrap();
        drop(wal);
        let (_, got) = Wal::open(&dir, "raft.wal").unwrap();
        assert_eq!(got, [&all[3..5], &[Record::StateTaken]].concat());
        assert!(!dir.contains("raft.wal.new"));
    }

    #[test]
    fn a_record_whose_checksum_holds_but_does_not_decode_is_an_error_naming_its_offset() {
        let mut bytes = header();
        let body = [APPLIED, 1, 2];
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&xxh3_64(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        let err = scan(&bytes).unwrap_err();
        assert!(err.contains("byte 16"), "{err}");
        let err = scan(b"SQLite format 3\0").unwrap_err();
        assert!(err.contains("not a storm Raft log"), "{err}");
    }

    proptest::proptest! {
        /// Whatever the bytes after the header, reading them gives records or an error, never
        /// a panic (the file is this replica's own, but a disk can hand back anything).
        #[test]
        fn any_bytes_scan_without_panicking(tail in proptest::collection::vec(0u8..=255, 0..512)) {
            let mut bytes = header();
            bytes.extend_from_slice(&tail);
            let _ = scan(&bytes);
            let _ = Record::decode(&tail);
        }
    }
}
