//! Receiving a program (Algorithm 7): dequeue chunks from the chunk queue, write them to the
//! node-local spool, then dequeue the trailer the MM sends after the data and check size and
//! checksum against it; only then acknowledge in `file.ack`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use storm_cluster::RmLayout;
use storm_cluster::messages::{Checksum, FileInfo, FileTrailer};
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::{Primitives, Wait};

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

/// Starts the receiving thread. The acknowledgement is `2*transfer + 1` for a verified file,
/// `2*transfer` for a failure (written, so the MM learns of it instead of waiting); a
/// cancelled transfer writes none (nobody waits for it, and a later transfer may).
pub fn spawn(
    prims: Arc<dyn Primitives>,
    rm: RmLayout,
    info: FileInfo,
    path: PathBuf,
    owner: Option<(u32, u32)>,
    stall: Duration,
) -> Receiver {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let name = format!("storm-nm-recv-{}", info.job);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let ok = match receive(&*prims, &rm, &info, &path, owner, &flag, stall) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(job = info.job, "program transfer failed: {e}");
                let _ = std::fs::remove_file(&path);
                false
            }
        };
        if !flag.load(Ordering::Acquire) {
            let ack = 2 * info.transfer as u64 + u64::from(ok);
            prims.memory().store(rm.file_ack, ack);
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

fn receive(
    prims: &dyn Primitives,
    rm: &RmLayout,
    info: &FileInfo,
    path: &PathBuf,
    owner: Option<(u32, u32)>,
    cancel: &AtomicBool,
    stall: Duration,
) -> Result<(), String> {
    let mut consumer =
        QueueConsumer::new(prims, rm.chunks, info.transfer).map_err(|e| e.to_string())?;
    if let Some(dir) = path.parent() {
        // The job's directory is its user's alone: 0700, owned by them.
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o700)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut sum = Checksum::new();
    let mut written = 0u64;
    let mut last = Instant::now();
    // Waits for the next entry and hands it, in place in the queue slot, to `consume`.
    let mut next = |consume: &mut dyn FnMut(&[u8]) -> Result<(), String>| -> Result<(), String> {
        loop {
            if cancel.load(Ordering::Acquire) {
                return Err("cancelled".into());
            }
            let got = consumer
                .dequeue_with(
                    prims,
                    Wait::Timeout(Duration::from_millis(20)),
                    &mut *consume,
                )
                .map_err(|e| e.to_string())?;
            match got {
                Some(result) => {
                    last = Instant::now();
                    return result;
                }
                None if last.elapsed() > stall => return Err(format!("no data for {stall:?}")),
                None => {}
            }
        }
    };
    while written < info.size {
        next(&mut |chunk: &[u8]| {
            file.write_all(chunk)
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            sum.update(chunk);
            written += chunk.len() as u64;
            Ok(())
        })
        .map_err(|e| format!("{e} after {written} of {} bytes", info.size))?;
    }
    let mut trailer = None;
    next(&mut |bytes: &[u8]| {
        trailer = FileTrailer::from_bytes(bytes);
        Ok(())
    })?;
    let trailer = trailer.ok_or("the transfer did not end with a trailer")?;
    if written != info.size || trailer.size != written {
        return Err(format!(
            "received {written} bytes, expected {}",
            trailer.size
        ));
    }
    if sum.finish() != trailer.checksum {
        return Err("checksum mismatch: the received program differs from the one sent".into());
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", path.display()))?;
    }
    Ok(())
}
