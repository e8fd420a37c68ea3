//! The thread that writes the Raft log's file ([`Wal`]), so that a slow sync holds up only
//! the records it writes and never the replica's thread: a leader whose thread waited 62 ms
//! on one `fdatasync` of a shared disk sent no heartbeat and read no answer meanwhile, and
//! lost its lease.
//!
//! Writes are done in the order they were given, each given a ticket (1, 2, …); the thread
//! reports each done ticket, in order, and wakes the replica. What depends on a write being
//! durable (an acknowledgement of entries, a vote) waits for its ticket; raft-rs's memory log
//! holds the records from the moment they are given (`advance_append_async` asks for that).

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::wal::{Record, Wal};

/// Called on the writer's thread after each write: wakes the replica's thread.
pub type Wake = Box<dyn Fn() + Send>;

enum Work {
    /// Records appended in one write, synced if `sync`.
    Append { records: Vec<Record>, sync: bool },
    /// The whole log replaced by these records ([`Wal::rewrite`]).
    Rewrite(Vec<Record>),
}

/// The writer thread, and what it has done.
pub struct Writer {
    work: Option<Sender<Work>>,
    done: Receiver<Result<u64, String>>,
    thread: Option<JoinHandle<()>>,
    wake: Arc<Mutex<Option<Wake>>>,
    /// The last ticket given out.
    given: u64,
    /// The last ticket known done.
    written: u64,
    /// A write that failed: every later call says so.
    failed: Option<String>,
}

impl Writer {
    /// Starts the thread that owns `wal`.
    pub fn start(mut wal: Wal) -> std::io::Result<Self> {
        let (work_tx, work_rx) = channel::<Work>();
        let (done_tx, done) = channel();
        let wake: Arc<Mutex<Option<Wake>>> = Arc::new(Mutex::new(None));
        let waker = wake.clone();
        let thread = std::thread::Builder::new()
            .name("raft-log".into())
            .spawn(move || {
                for (done, work) in work_rx.into_iter().enumerate() {
                    let ticket = done as u64 + 1;
                    let result = match work {
                        Work::Append { records, sync } => wal.append(&records, sync),
                        Work::Rewrite(records) => wal.rewrite(&records),
                    };
                    let failed = result.is_err();
                    let _ = done_tx.send(result.map(|()| ticket).map_err(|e| e.to_string()));
                    if let Some(wake) = &*waker.lock().unwrap_or_else(|p| p.into_inner()) {
                        wake();
                    }
                    if failed {
                        // Nothing after a failed write may land: the log would have a gap.
                        return;
                    }
                }
            })?;
        Ok(Self {
            work: Some(work_tx),
            done,
            thread: Some(thread),
            wake,
            given: 0,
            written: 0,
            failed: None,
        })
    }

    /// Sets what wakes the replica's thread once a write is done.
    pub fn set_wake(&self, wake: Wake) {
        *self.wake.lock().unwrap_or_else(|p| p.into_inner()) = Some(wake);
    }

    /// Queues `records` for one write (synced if `sync`): its ticket.
    pub fn append(&mut self, records: Vec<Record>, sync: bool) -> Result<u64, String> {
        self.give(Work::Append { records, sync })
    }

    /// Queues a rewrite of the whole log: its ticket.
    pub fn rewrite(&mut self, records: Vec<Record>) -> Result<u64, String> {
        self.give(Work::Rewrite(records))
    }

    fn give(&mut self, work: Work) -> Result<u64, String> {
        if let Some(why) = &self.failed {
            return Err(why.clone());
        }
        let sent = self.work.as_ref().is_some_and(|w| w.send(work).is_ok());
        if !sent {
            return Err(self.fail("the Raft log's writer thread is gone".into()));
        }
        self.given += 1;
        Ok(self.given)
    }

    /// The last ticket given out (0: none).
    pub fn given(&self) -> u64 {
        self.given
    }

    /// The last ticket written (every one before it too), without waiting.
    pub fn written(&mut self) -> Result<u64, String> {
        while let Ok(done) = self.done.try_recv() {
            self.take(done)?;
        }
        match &self.failed {
            Some(why) => Err(why.clone()),
            None => Ok(self.written),
        }
    }

    /// Waits until `ticket` (and every one before it) is written.
    pub fn wait(&mut self, ticket: u64) -> Result<(), String> {
        self.written()?;
        while self.written < ticket {
            match self.done.recv() {
                Ok(done) => self.take(done)?,
                Err(_) => return Err(self.fail("the Raft log's writer thread is gone".into())),
            }
        }
        Ok(())
    }

    fn take(&mut self, done: Result<u64, String>) -> Result<(), String> {
        match done {
            Ok(ticket) => {
                self.written = ticket;
                Ok(())
            }
            Err(why) => Err(self.fail(why)),
        }
    }

    fn fail(&mut self, why: String) -> String {
        self.failed.get_or_insert(why).clone()
    }
}

impl Drop for Writer {
    /// Lets the thread finish what it was given, and waits for it.
    fn drop(&mut self) {
        self.work = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::wal::tests::entry;
    use super::*;
    use storm_cluster::daemon_dir::DaemonDir;

    fn records(first: u64, bytes: usize) -> Vec<Record> {
        vec![Record::Entries {
            entries: vec![entry(first, 1, &vec![7u8; bytes])],
            hard: None,
        }]
    }

    /// A write that fails (here a full disk) is reported for its ticket, and every later
    /// call says so: nothing given after it may land, or the log would have a gap.
    /// Needs root (it mounts a small tmpfs); says NOT TESTED otherwise.
    #[test]
    fn a_failed_write_is_reported_and_nothing_after_it_is_written() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!(
                "NOT TESTED: a_failed_write_is_reported_and_nothing_after_it_is_written needs \
                 root (it mounts a tmpfs to fill)"
            );
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=600k,mode=0700", "tmpfs"])
            .arg(tmp.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "mounting a tmpfs");
        let outcome = std::panic::catch_unwind(|| {
            let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
            let wal = Wal::create(&dir, "raft.wal", &[]).unwrap();
            let mut writer = Writer::start(wal).unwrap();
            // Records of 100 KiB until the disk is full: the log grows by 256 KiB chunks.
            let mut last = 0;
            let failed = (1..=20u64).find_map(|i| {
                last = writer.append(records(i, 100 << 10), true).unwrap();
                writer.wait(last).err()
            });
            let why = failed.expect("a 600 KiB disk took 2 MB of records");
            assert!(why.contains("No space"), "the error names the cause: {why}");
            assert_eq!(writer.written(), Err(why.clone()));
            assert_eq!(writer.append(records(99, 10), true), Err(why.clone()));
            assert!(writer.written().is_err());
            assert!(last > 1, "some writes succeeded before the disk filled");
        });
        let _ = std::process::Command::new("umount")
            .arg(tmp.path())
            .status();
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    /// Tickets are done in the order given.
    #[test]
    fn tickets_are_written_in_the_order_given() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let wal = Wal::create(&dir, "raft.wal", &[]).unwrap();
        let mut writer = Writer::start(wal).unwrap();
        let tickets: Vec<u64> = (1..=30u64)
            .map(|i| writer.append(records(i, 100), i % 2 == 0).unwrap())
            .collect();
        assert_eq!(tickets, (1..=30).collect::<Vec<_>>());
        writer.wait(30).unwrap();
        assert_eq!(writer.written(), Ok(30));
        drop(writer);
        let (_, read) = Wal::open(&dir, "raft.wal").unwrap();
        let firsts: Vec<u64> = read
            .iter()
            .map(|r| match r {
                Record::Entries { entries, .. } => entries[0].index,
                other => panic!("not an entries record: {other:?}"),
            })
            .collect();
        assert_eq!(firsts, (1..=30).collect::<Vec<_>>());
    }
}
