//! Receiving a program (Algorithm 7): dequeue chunks from the chunk queue, write them to a
//! [`ProgramSink`], then dequeue the trailer the MM sends after the data and check size and
//! checksum against it; only then acknowledge in `file.ack`.
//!
//! [`Reception`] is the receiver's core: it takes what has arrived each time it is stepped
//! and reads the time it is given, so a test drives it without threads or waits. The daemon
//! runs one on a thread per transfer ([`spawn`]) with a [`FileSink`] in the job's spool
//! directory.
//!
//! The spool and every job directory in it are the NM's own (root's, mode 0711): the job's
//! user can reach their program there but cannot add, remove or rename anything, so no name
//! the NM uses can be swapped under it. The program file is created afresh (`O_EXCL`,
//! `O_NOFOLLOW`), written, and handed to its user by `fchown` and `fchmod` on the descriptor.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use storm_cluster::RmLayout;
use storm_cluster::daemon_dir::{self, DaemonDir};
use storm_cluster::messages::{Checksum, FileInfo, FileTrailer, file_ack};
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::{Primitives, Wait};

/// How long the receiving thread waits for an entry before it looks at its cancel flag.
const DEQUEUE_WAIT: Duration = Duration::from_millis(20);

/// Most entries one step takes, so that a host looks at its other duties between them.
const ENTRIES_PER_STEP: usize = 64;

/// Where a received program goes.
pub trait ProgramSink: Send {
    /// The next piece of the program.
    fn write(&mut self, chunk: &[u8]) -> Result<(), String>;
    /// The program was received whole and verified.
    fn finish(&mut self) -> Result<(), String>;
    /// The transfer failed: remove what was written.
    fn discard(&mut self);
}

/// Where a reception stands after a step.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// More is to come.
    Pending,
    /// The program was received and verified, or why not.
    Done(Result<(), String>),
}

/// One program transfer being received.
pub struct Reception {
    info: FileInfo,
    consumer: QueueConsumer,
    sink: Box<dyn ProgramSink>,
    sum: Checksum,
    /// BLAKE3 of what arrived: the MM's sealed launch names the program by this hash.
    hash: blake3::Hasher,
    written: u64,
    /// When the last entry arrived (or the reception began).
    last: Instant,
    /// How long the transfer may make no progress before the receiver gives up.
    stall: Duration,
    trailer: Option<Option<FileTrailer>>,
}

impl Reception {
    /// Starts consuming the chunk queue at the transfer's epoch.
    pub fn new(
        prims: &dyn Primitives,
        rm: &RmLayout,
        info: FileInfo,
        sink: Box<dyn ProgramSink>,
        now: Instant,
        stall: Duration,
    ) -> Result<Self, String> {
        let consumer =
            QueueConsumer::new(prims, rm.chunks, info.transfer).map_err(|e| e.to_string())?;
        Ok(Self {
            info,
            consumer,
            sink,
            sum: Checksum::new(),
            hash: blake3::Hasher::new(),
            written: 0,
            last: now,
            stall,
            trailer: None,
        })
    }

    pub fn info(&self) -> &FileInfo {
        &self.info
    }

    /// The BLAKE3 hash of the bytes received so far (the whole program once it is done).
    pub fn hash(&self) -> [u8; 32] {
        *self.hash.finalize().as_bytes()
    }

    /// Takes the entries that arrived (waiting up to `wait` for the first), and says whether
    /// the transfer is over. A failed transfer's sink is discarded.
    pub fn step(&mut self, prims: &dyn Primitives, now: Instant, wait: Wait) -> Received {
        let done = match self.take(prims, now, wait) {
            Ok(false) => return Received::Pending,
            Ok(true) => self.verify().and_then(|()| self.sink.finish()),
            Err(e) => Err(e),
        };
        if done.is_err() {
            self.sink.discard();
        }
        Received::Done(done)
    }

    /// Takes entries; true once the trailer is in.
    fn take(
        &mut self,
        prims: &dyn Primitives,
        now: Instant,
        mut wait: Wait,
    ) -> Result<bool, String> {
        for _ in 0..ENTRIES_PER_STEP {
            let size = self.info.size;
            let (written, sum, hash, sink, trailer) = (
                &mut self.written,
                &mut self.sum,
                &mut self.hash,
                &mut self.sink,
                &mut self.trailer,
            );
            let got = self
                .consumer
                .dequeue_with(prims, wait, &mut |entry: &[u8]| {
                    if *written < size {
                        sink.write(entry)?;
                        sum.update(entry);
                        hash.update(entry);
                        *written += entry.len() as u64;
                    } else {
                        *trailer = Some(FileTrailer::from_bytes(entry));
                    }
                    Ok::<(), String>(())
                })
                .map_err(|e| e.to_string())?;
            match got {
                Some(result) => {
                    result.map_err(|e| format!("{e} after {} of {size} bytes", self.written))?;
                    self.last = now;
                    if self.trailer.is_some() {
                        return Ok(true);
                    }
                }
                None if now.saturating_duration_since(self.last) > self.stall => {
                    return Err(format!(
                        "no data for {:?} after {} of {size} bytes",
                        self.stall, self.written
                    ));
                }
                None => return Ok(false),
            }
            wait = Wait::Poll;
        }
        Ok(false)
    }

    /// Size and checksum against the trailer.
    fn verify(&mut self) -> Result<(), String> {
        let trailer = self
            .trailer
            .take()
            .flatten()
            .ok_or("the transfer did not end with a trailer")?;
        if self.written != self.info.size || trailer.size != self.written {
            return Err(format!(
                "received {} bytes, expected {}",
                self.written, trailer.size
            ));
        }
        if std::mem::replace(&mut self.sum, Checksum::new()).finish() != trailer.checksum {
            return Err("checksum mismatch: the received program differs from the one sent".into());
        }
        Ok(())
    }

    /// Tells the MM how the transfer ended ([`file_ack`]), a failure too, so that the MM
    /// learns of it instead of waiting. A cancelled transfer writes none: nobody waits for
    /// it, and a later transfer may.
    pub fn acknowledge(&self, prims: &dyn Primitives, rm: &RmLayout, ok: bool) {
        prims
            .memory()
            .store(rm.file_ack, file_ack(self.info.transfer, ok));
    }
}

/// The mode of the spool and of each job's directory: the NM's, reachable by the jobs' users
/// (who need to execute their program in it), listable and changeable by nobody else.
pub const SPOOL_DIR_MODE: u32 = 0o711;

/// The name of job `job`'s directory in the spool.
pub fn job_dir_name(job: storm_cluster::JobId) -> String {
    format!("job-{job}")
}

/// A program file in the job's spool directory, written by the NM and handed to the job's
/// user (mode 0700) once complete. It is closed when finished or discarded: a program still
/// open for writing cannot be executed (ETXTBSY), and the acknowledgement that lets the MM
/// launch it follows the finish.
pub struct FileSink {
    dir: DaemonDir,
    name: String,
    file: Option<std::fs::File>,
    owner: Option<(u32, u32)>,
}

impl FileSink {
    /// Creates `name` afresh in job `job`'s directory of `spool` (making the directory).
    pub fn create(
        spool: &DaemonDir,
        job: storm_cluster::JobId,
        name: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<Self, String> {
        let dir = spool
            .subdir(&job_dir_name(job), SPOOL_DIR_MODE)
            .map_err(|e| format!("cannot make the job's directory: {e}"))?;
        let file = dir
            .create_file(name)
            .map_err(|e| format!("cannot create {}: {e}", dir.join(name).display()))?;
        Ok(Self {
            dir,
            name: name.to_string(),
            file: Some(file),
            owner,
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

impl ProgramSink for FileSink {
    fn write(&mut self, chunk: &[u8]) -> Result<(), String> {
        let path = self.path();
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| format!("writing {}: already closed", path.display()))?;
        file.write_all(chunk)
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    fn finish(&mut self) -> Result<(), String> {
        let file = self
            .file
            .take()
            .ok_or_else(|| format!("{}: already closed", self.path().display()))?;
        // On the descriptor: the name is never looked up again.
        daemon_dir::hand_over(&file, self.owner, 0o700)
            .map_err(|e| format!("handing {} to its user: {e}", self.path().display()))?;
        // Closed here, before anyone may execute it.
        drop(file);
        Ok(())
    }

    fn discard(&mut self) {
        drop(self.file.take());
        let _ = self.dir.remove_file(&self.name);
    }
}

/// A receiving thread.
pub struct Receiver {
    cancel: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Asks the thread to stop; it does within one dequeue wait.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Cancels the thread and waits for it: two receivers must never take signals from the
    /// one chunk queue at the same time.
    pub fn stop(mut self) {
        self.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The hashes of the programs received, by job: what a launch is checked against.
pub type ProgramHashes =
    Arc<std::sync::Mutex<std::collections::BTreeMap<storm_cluster::JobId, [u8; 32]>>>;

/// Starts a thread that receives the program of `info` into its job's directory of `spool`,
/// records its hash in `hashes`, and acknowledges it (see [`Reception::acknowledge`]).
pub fn spawn(
    prims: Arc<dyn Primitives>,
    rm: RmLayout,
    info: FileInfo,
    spool: DaemonDir,
    owner: Option<(u32, u32)>,
    stall: Duration,
    hashes: ProgramHashes,
) -> Receiver {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let name = format!("storm-nm-recv-{}", info.job);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let job = info.job;
        let transfer = info.transfer;
        let name = info.name.clone();
        let reception = FileSink::create(&spool, job, &name, owner).and_then(|sink| {
            Reception::new(&*prims, &rm, info, Box::new(sink), Instant::now(), stall)
        });
        let mut reception = match reception {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(job, "program transfer failed: {e}");
                if !flag.load(Ordering::Acquire) {
                    prims.memory().store(rm.file_ack, file_ack(transfer, false));
                }
                return;
            }
        };
        let ok = loop {
            if flag.load(Ordering::Acquire) {
                reception.sink.discard();
                return;
            }
            match reception.step(&*prims, Instant::now(), Wait::Timeout(DEQUEUE_WAIT)) {
                Received::Pending => {}
                Received::Done(Ok(())) => {
                    // Recorded before the acknowledgement that lets the MM launch it.
                    hashes
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(job, reception.hash());
                    break true;
                }
                Received::Done(Err(e)) => {
                    tracing::error!(job, "program transfer failed: {e}");
                    break false;
                }
            }
        };
        if !flag.load(Ordering::Acquire) {
            reception.acknowledge(&*prims, &rm, ok);
        }
    });
    let thread = match spawned {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!("cannot start a receiving thread: {e}");
            None
        }
    };
    Receiver { cancel, thread }
}
