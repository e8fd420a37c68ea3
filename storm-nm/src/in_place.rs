//! Whether a job's program is already at its path on this node, identical to the one
//! submitted (a shared file system), so that it runs in place rather than from a copy.
//!
//! Asked by a heartbeat's `Command::CheckProgram`, a thread of its own opens the path with
//! the job's user's rights (its file-system ids and groups, set on that thread alone), hashes
//! the file, and writes its `program_digest` in `program.digest`, then answers in `file.ack`.
//! The MM compares every node's digest with one COMPARE-AND-WRITE.
//!
//! A path may sit on a file system that hangs, and a root daemon must not stall on a path a
//! user chose: the NM never waits for a checking thread. A thread answers only while its
//! check is the node's latest ([`Latest`]); a newer transfer or check, or a new membership,
//! makes a late answer harmless. At most [`MAX_CHECKING`] threads may be at work; past that a
//! check answers "not here" at once, and the program is copied.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use storm_cluster::RmLayout;
use storm_cluster::messages::{CheckProgram, ProgramStamp, file_ack, program_digest};
use storm_cluster::program_hash::HashCache;
use storm_primitives::Primitives;

/// Most checks at work at once on a node.
pub const MAX_CHECKING: usize = 16;

/// The transfer (or check) this node answers for now in `file.ack`: 0 for none. Set before a
/// receiver or checker starts; a checker answers only while it still names its own.
#[derive(Clone, Default)]
pub struct Latest(Arc<Mutex<u32>>);

impl Latest {
    pub fn set(&self, transfer: u32) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = transfer;
    }

    /// Runs `answer` if `transfer` is still the latest, with the latest held so that no newer
    /// one starts meanwhile.
    fn answer_if_current(&self, transfer: u32, answer: impl FnOnce()) -> bool {
        let latest = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if *latest == transfer {
            answer();
            true
        } else {
            false
        }
    }
}

/// One check at work: asking it to stop makes it give up between reads.
pub struct Checker {
    stop: Arc<AtomicBool>,
}

impl Checker {
    pub fn cancel(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// What the checking threads share.
#[derive(Clone, Default)]
pub struct Checking {
    pub latest: Latest,
    pub hashes: HashCache,
    at_work: Arc<AtomicUsize>,
}

impl Checking {
    /// Starts checking `check` (the caller has set it as the latest).
    pub fn spawn(&self, prims: Arc<dyn Primitives>, rm: RmLayout, check: CheckProgram) -> Checker {
        let stop = Arc::new(AtomicBool::new(false));
        let (transfer, job) = (check.transfer, check.job);
        let answer = {
            let (prims, rm, latest) = (prims.clone(), rm.clone(), self.latest.clone());
            move |digest: u64| {
                latest.answer_if_current(transfer, || {
                    let memory = prims.memory();
                    memory.store(rm.program_digest, digest);
                    memory.store(rm.file_ack, file_ack(transfer, true));
                })
            }
        };
        if self.at_work.fetch_add(1, Ordering::AcqRel) >= MAX_CHECKING {
            self.at_work.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(
                job,
                "{MAX_CHECKING} checks for programs in place are still at work (a file system \
                 that hangs?): the program will be copied"
            );
            answer(0);
            return Checker { stop };
        }
        let (flag, hashes, at_work) = (stop.clone(), self.hashes.clone(), self.at_work.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("storm-nm-check-{job}"))
            .spawn(move || {
                let digest = match digest_as_user(&check, &hashes, &flag) {
                    Ok(d) => d,
                    Err(why) => {
                        tracing::debug!(job, "the program is not in place here: {why}");
                        0
                    }
                };
                at_work.fetch_sub(1, Ordering::AcqRel);
                if !flag.load(Ordering::Acquire) {
                    answer(digest);
                }
            });
        if let Err(e) = spawned {
            self.at_work.fetch_sub(1, Ordering::AcqRel);
            tracing::error!(job, "cannot start a thread to check the program: {e}");
        }
        Checker { stop }
    }
}

/// The digest of the file at the check's path, read with its user's rights on this thread
/// (when the NM runs as root). Call only on a thread of its own: its ids stay changed.
fn digest_as_user(
    check: &CheckProgram,
    hashes: &HashCache,
    stop: &AtomicBool,
) -> Result<u64, String> {
    if nix::unistd::geteuid().is_root() {
        become_user_for_files(check.uid, check.gid)?;
    }
    let file = File::options()
        .read(true)
        // A FIFO at the path must not hold the thread until a writer comes.
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&check.path)
        .map_err(|e| format!("{}: {e}", check.path.display()))?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", check.path.display()));
    }
    let hash = hashes
        .hash(&file, &|| stop.load(Ordering::Acquire))
        .map_err(|e| format!("{}: {e}", check.path.display()))?;
    Ok(program_digest(&ProgramStamp::of(&meta), &hash))
}

/// Gives this thread, and only it, the file-system rights of user `uid`: its groups, then
/// its file-system gid and uid (raw system calls: the C library's would change every thread
/// of the daemon). A file-system uid other than 0 also drops the capabilities that would let
/// root read past permissions.
fn become_user_for_files(uid: u32, gid: u32) -> Result<(), String> {
    let groups = storm_cluster::daemon::user_groups(uid, gid);
    // SAFETY: raw system calls with a valid pointer and length; they change only this
    // thread's credentials.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
            return Err(format!(
                "cannot take user {uid}'s groups: {}",
                std::io::Error::last_os_error()
            ));
        }
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        // setfsuid answers with the previous id, never an error: ask again to see it took.
        let (now_uid, now_gid) = (
            libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32,
            libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32,
        );
        if (now_uid, now_gid) != (uid, gid) {
            return Err(format!("cannot take user {uid}'s file-system ids"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn check_of(path: &std::path::Path, uid: u32, gid: u32) -> CheckProgram {
        CheckProgram {
            transfer: 3,
            job: 9,
            nodes: storm_primitives::NodeSet::single(0),
            path: path.to_path_buf(),
            uid,
            gid,
        }
    }

    /// On a thread of its own, as the daemon runs it.
    fn digest_on_a_thread(check: CheckProgram) -> Result<u64, String> {
        std::thread::spawn(move || {
            digest_as_user(&check, &HashCache::default(), &AtomicBool::new(false))
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_digest_is_the_one_the_mm_computes_from_the_submitted_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        std::fs::write(&path, b"#!/bin/sh\necho hi\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let got = digest_on_a_thread(check_of(&path, me.0, me.1)).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let want = program_digest(
            &ProgramStamp::of(&meta),
            blake3::hash(b"#!/bin/sh\necho hi\n").as_bytes(),
        );
        assert_eq!(got, want);
        // Another mode is another digest: an identical file the user may not run is not it.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_ne!(
            digest_on_a_thread(check_of(&path, me.0, me.1)).unwrap(),
            want
        );
    }

    #[test]
    fn a_root_nm_reads_with_the_users_rights_not_its_own() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (the NM's own rights must not read for a user)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, b"root's only").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Root reads it; nobody (65534) may not, even though the NM asking is root.
        assert!(digest_on_a_thread(check_of(&path, 0, 0)).is_ok());
        let err = digest_on_a_thread(check_of(&path, 65534, 65534)).unwrap_err();
        assert!(err.contains("Permission denied"), "{err}");
        // The daemon's other threads keep root's rights.
        assert!(std::fs::read(&path).is_ok());
    }

    #[test]
    fn a_fifo_at_the_path_is_no_program_and_holds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let err = digest_on_a_thread(check_of(&path, me.0, me.1)).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_late_answer_for_an_older_check_writes_nothing() {
        let latest = Latest::default();
        latest.set(4);
        let mut wrote = false;
        assert!(!latest.answer_if_current(3, || wrote = true));
        assert!(!wrote);
        assert!(latest.answer_if_current(4, || wrote = true));
        assert!(wrote);
    }
}
