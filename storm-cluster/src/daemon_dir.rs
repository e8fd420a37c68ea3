//! Directories a root daemon writes in for its users, touched only through descriptors.
//!
//! A daemon that runs as root and acts for a user must never look a path up twice: between a
//! check and a use, the user could swap a name for a symlink to `/etc/shadow`, rename it, or
//! hard-link a root file into place. [`DaemonDir`] is the one way the daemons reach the files
//! they keep for users (spools, program copies, the control socket):
//!
//! * the directory is opened once, with `O_DIRECTORY | O_NOFOLLOW`, and then only used
//!   through that descriptor (`openat`, `mkdirat`, `unlinkat`, `renameat`);
//! * it must be owned by this process's user (or root) and writable by nobody else, so no
//!   user can add, remove or rename an entry in it: every name in it is the daemon's;
//! * files are created afresh (`O_CREAT | O_EXCL | O_NOFOLLOW`), and their owner and mode are
//!   set on the descriptor (`fchown`, `fchmod`), never by name.
//!
//! docs/security.md lists every file operation the daemons make for users and why each is
//! safe.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

/// Why a daemon directory cannot be used; the message names the directory and the fix.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}: {message}")]
    Unsafe { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A directory only this daemon (or root) may change, held open.
#[derive(Debug)]
pub struct DaemonDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// `name` if it is one plain name (no `/`, not `.` or `..`, not empty), else an error.
fn plain(name: &str) -> std::io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not one plain file name"),
        ));
    }
    Ok(name)
}

/// Whether a directory with this status is one only `euid` (or root) can change.
fn check_private(st: &FileStat, euid: u32) -> Result<(), String> {
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        return Err("is not a directory".into());
    }
    if st.st_uid != euid && st.st_uid != 0 {
        return Err(format!(
            "is owned by uid {}, not by this daemon's user (uid {euid}) or root: run `chown {euid} PATH`",
            st.st_uid
        ));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "can be changed by other users (mode {mode:04o}): run `chmod go-w PATH`"
        ));
    }
    Ok(())
}

fn io_at(path: &Path, e: impl Into<std::io::Error>) -> DirError {
    DirError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

impl DaemonDir {
    /// Opens the directory at `path`, creating it (and its parents) with `mode` if it is not
    /// there. It must then be owned by this process's user or root and writable by nobody
    /// else; otherwise the error names the directory and the command that fixes it.
    pub fn open_or_create(path: &Path, mode: u32) -> Result<Self, DirError> {
        let created = match std::fs::DirBuilder::new()
            .recursive(false)
            .mode(mode)
            .create(path)
        {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io_at(parent, e))?;
                }
                match std::fs::DirBuilder::new().mode(mode).create(path) {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                    Err(e) => return Err(io_at(path, e)),
                }
            }
            Err(e) => return Err(io_at(path, e)),
        };
        let fd = nix::fcntl::open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR => DirError::Unsafe {
                path: path.to_path_buf(),
                message: "is a symbolic link or not a directory; a daemon's directory must be a real directory".into(),
            },
            e => io_at(path, e),
        })?;
        let dir = Self {
            fd,
            path: path.to_path_buf(),
        };
        if created {
            // The umask may have taken bits away.
            nix::sys::stat::fchmod(&dir.fd, Mode::from_bits_truncate(mode))
                .map_err(|e| io_at(path, e))?;
        }
        dir.check()?;
        Ok(dir)
    }

    /// A second handle on the same directory (a duplicated descriptor), for another thread.
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    /// The status of the directory, checked again: still ours alone.
    pub fn check(&self) -> Result<(), DirError> {
        let st = nix::sys::stat::fstat(&self.fd).map_err(|e| io_at(&self.path, e))?;
        check_private(&st, nix::unistd::geteuid().as_raw()).map_err(|m| DirError::Unsafe {
            path: self.path.clone(),
            message: m.replace("PATH", &self.path.display().to_string()),
        })
    }

    /// Where the directory was when it was opened (for messages, and for the users' own
    /// processes, which look it up with their own rights).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory (for messages and for users' processes).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The subdirectory `name` with `mode`, created if missing. One left behind that is not
    /// private to this daemon (an older storm made job directories their users') is removed
    /// with what it holds and made again.
    pub fn subdir(&self, name: &str, mode: u32) -> Result<DaemonDir, DirError> {
        let path = self.path.join(name);
        plain(name).map_err(|e| io_at(&path, e))?;
        for attempt in 0..2 {
            match nix::sys::stat::mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(io_at(&path, e)),
            }
            let fd = nix::fcntl::openat(
                &self.fd,
                name,
                OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
                Mode::empty(),
            );
            let fd = match fd {
                Ok(fd) => fd,
                // Not a directory (a file, or a symlink): ours to remove, as the parent is.
                Err(Errno::ELOOP | Errno::ENOTDIR) if attempt == 0 => {
                    self.remove_file(name).map_err(|e| io_at(&path, e))?;
                    continue;
                }
                Err(e) => return Err(io_at(&path, e)),
            };
            let sub = DaemonDir {
                fd,
                path: path.clone(),
            };
            let st = nix::sys::stat::fstat(&sub.fd).map_err(|e| io_at(&path, e))?;
            let euid = nix::unistd::geteuid().as_raw();
            if check_private(&st, euid).is_ok() {
                nix::sys::stat::fchmod(&sub.fd, Mode::from_bits_truncate(mode))
                    .map_err(|e| io_at(&path, e))?;
                return Ok(sub);
            }
            if attempt == 0 {
                drop(sub);
                self.remove_tree(name).map_err(|e| io_at(&path, e))?;
            }
        }
        Err(DirError::Unsafe {
            path,
            message: "cannot be made private to this daemon".into(),
        })
    }

    /// Creates `name` afresh for writing, mode 0600 (an entry of that name is removed first):
    /// the file is this daemon's until it sets another owner or mode on the descriptor.
    pub fn create_file(&self, name: &str) -> std::io::Result<File> {
        plain(name)?;
        match nix::unistd::unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(Errno::EISDIR) => self.remove_tree(name)?,
            Err(e) => return Err(e.into()),
        }
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        Ok(File::from(fd))
    }

    /// A new file in this directory with no name (`O_TMPFILE`), mode 0600, for reading and
    /// writing: it takes disk, not memory, and is gone when its last descriptor closes,
    /// whatever becomes of this daemon.
    pub fn anonymous_file(&self) -> std::io::Result<File> {
        match nix::fcntl::openat(
            &self.fd,
            ".",
            OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => Ok(File::from(fd)),
            // A file system without O_TMPFILE: a fresh name, removed at once.
            Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {
                let name = format!(".anonymous-{:016x}", rand_u64());
                let fd = nix::fcntl::openat(
                    &self.fd,
                    name.as_str(),
                    OFlag::O_RDWR
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )?;
                nix::unistd::unlinkat(&self.fd, name.as_str(), UnlinkatFlags::NoRemoveDir)?;
                Ok(File::from(fd))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives this directory to `uid`/`gid` with `mode`, through its descriptor: a directory
    /// this daemon made for a user (say, a job's scratch space) that the user may then
    /// write, and whose parent the user still cannot change.
    pub fn give_to(&self, uid: u32, gid: u32, mode: u32) -> std::io::Result<()> {
        nix::unistd::fchown(
            &self.fd,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
        nix::sys::stat::fchmod(&self.fd, Mode::from_bits_truncate(mode))?;
        Ok(())
    }

    /// Opens `name` for reading (never through a symlink).
    pub fn open_file(&self, name: &str) -> std::io::Result<File> {
        self.open_existing(name, OFlag::O_RDONLY)
    }

    /// Opens the existing file `name` for writing at any offset, neither truncating nor
    /// creating it (never through a symlink).
    pub fn open_for_writing(&self, name: &str) -> std::io::Result<File> {
        self.open_existing(name, OFlag::O_WRONLY)
    }

    /// Opens the existing file `name` with `access`, never through a symlink.
    fn open_existing(&self, name: &str, access: OFlag) -> std::io::Result<File> {
        plain(name)?;
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            access | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// Makes the directory's entries durable (after a create or a rename in it).
    pub fn sync(&self) -> std::io::Result<()> {
        nix::unistd::fsync(&self.fd)?;
        Ok(())
    }

    /// Opens `name` for appending, creating it with mode 0600 (never through a symlink).
    pub fn append_file(&self, name: &str) -> std::io::Result<File> {
        plain(name)?;
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_WRONLY
                | OFlag::O_APPEND
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        Ok(File::from(fd))
    }

    /// Whether an entry `name` exists (not following a symlink).
    pub fn contains(&self, name: &str) -> bool {
        plain(name).is_ok()
            && nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// Renames `from` to `to`, both in this directory.
    pub fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        nix::fcntl::renameat(&self.fd, plain(from)?, &self.fd, plain(to)?)?;
        Ok(())
    }

    /// Removes the file `name`; a missing one is not an error.
    pub fn remove_file(&self, name: &str) -> std::io::Result<()> {
        match nix::unistd::unlinkat(&self.fd, plain(name)?, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes `name` and everything under it, descending only through descriptors opened
    /// with `O_NOFOLLOW`; a missing one is not an error.
    pub fn remove_tree(&self, name: &str) -> std::io::Result<()> {
        plain(name)?;
        remove_tree_at(self.fd.as_fd(), OsStr::new(name))
    }

    /// Binds a Unix socket at `name` in this directory (an old entry of that name is removed
    /// first) and gives it `mode`. The socket is reached through the directory's descriptor
    /// (`/proc/self/fd`), and its mode is set by name in a directory nobody else can change.
    pub fn bind_socket(&self, name: &str, mode: u32) -> std::io::Result<UnixListener> {
        self.remove_file(name)?;
        let listener = UnixListener::bind(self.via_descriptor(name))?;
        nix::sys::stat::fchmodat(
            &self.fd,
            name,
            Mode::from_bits_truncate(mode),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )?;
        Ok(listener)
    }

    /// Sets the directory's own mode (on the descriptor).
    pub fn set_mode(&self, mode: u32) -> std::io::Result<()> {
        nix::sys::stat::fchmod(&self.fd, Mode::from_bits_truncate(mode))?;
        Ok(())
    }

    /// A path to `name` that goes through this directory's descriptor
    /// (`/proc/self/fd/N/name`), for a library that opens files only by path: it reaches
    /// this directory whatever happened to the path it was opened by.
    pub fn via_descriptor(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()))
    }

    /// The names of the entries (not `.` and `..`), as UTF-8 (others are skipped).
    pub fn names(&self) -> std::io::Result<Vec<String>> {
        let mut listing = listing_of(self.fd.as_fd())?;
        Ok(listing
            .iter()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
            .filter(|n| n != "." && n != "..")
            .collect())
    }

    /// The directory's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A listing of `dir` from its start: a new open of "." through the descriptor, so that no
/// other reader's position is shared.
fn listing_of(dir: BorrowedFd<'_>) -> std::io::Result<nix::dir::Dir> {
    let fd = nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )?;
    Ok(nix::dir::Dir::from_fd(fd)?)
}

/// Removes the entry `name` of the directory `dir`, and everything under it if it is one.
fn remove_tree_at(dir: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<()> {
    match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(e.into()),
    }
    let sub = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )?;
    let names: Vec<Vec<u8>> = {
        let mut listing = listing_of(sub.as_fd())?;
        listing
            .iter()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .collect()
    };
    for child in names {
        remove_tree_at(sub.as_fd(), OsStr::from_bytes(&child))?;
    }
    match nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gives the file behind `file` its owner and mode, on the descriptor (never by name).
pub fn hand_over(file: &File, owner: Option<(u32, u32)>, mode: u32) -> std::io::Result<()> {
    nix::sys::stat::fchmod(file, Mode::from_bits_truncate(mode))?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(
            file,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
        // chown clears set-id bits; the mode is set again after it.
        nix::sys::stat::fchmod(file, Mode::from_bits_truncate(mode))?;
    }
    Ok(())
}

/// A random number for a name no one can guess (from the kernel's generator).
fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into the live buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // Not reached on Linux since 3.17; the name is only made unlikely to collide then.
        return std::process::id() as u64
            ^ (std::time::UNIX_EPOCH
                .elapsed()
                .map_or(0, |d| d.as_nanos() as u64));
    }
    u64::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn a_directory_others_can_write_is_refused_naming_the_fix() {
        let t = tmp();
        let p = t.path().join("spool");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = DaemonDir::open_or_create(&p, 0o755)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mode 0777") && err.contains("chmod go-w"),
            "{err}"
        );
    }

    #[test]
    fn a_symlink_in_place_of_the_directory_is_refused() {
        let t = tmp();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = t.path().join("spool");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = DaemonDir::open_or_create(&link, 0o755)
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
    }

    #[test]
    fn a_new_directory_gets_its_mode_whatever_the_umask() {
        let t = tmp();
        let p = t.path().join("a/b/spool");
        let d = DaemonDir::open_or_create(&p, 0o711).unwrap();
        assert_eq!(
            std::fs::metadata(d.path()).unwrap().permissions().mode() & 0o7777,
            0o711
        );
    }

    #[test]
    fn a_file_is_created_afresh_never_through_a_symlink_left_in_its_place() {
        let t = tmp();
        let d = DaemonDir::open_or_create(&t.path().join("d"), 0o700).unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("prog")).unwrap();
        let mut f = d.create_file("prog").unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        assert_eq!(std::fs::read(d.join("prog")).unwrap(), b"new");
        assert!(
            !std::fs::symlink_metadata(d.join("prog"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn a_subdirectory_swapped_for_a_symlink_is_replaced_not_followed() {
        let t = tmp();
        let d = DaemonDir::open_or_create(&t.path().join("d"), 0o700).unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("keep"), b"x").unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.join("job-1")).unwrap();
        let sub = d.subdir("job-1", 0o711).unwrap();
        sub.create_file("prog").unwrap();
        assert!(elsewhere.join("keep").exists());
        assert!(!elsewhere.join("prog").exists());
        assert!(std::fs::symlink_metadata(d.join("job-1")).unwrap().is_dir());
    }

    #[test]
    fn removing_a_tree_never_follows_a_symlink_inside_it() {
        let t = tmp();
        let d = DaemonDir::open_or_create(&t.path().join("d"), 0o700).unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let sub = d.subdir("job-2", 0o711).unwrap();
        sub.subdir("deeper", 0o700)
            .unwrap()
            .create_file("f")
            .unwrap();
        std::os::unix::fs::symlink(&outside, sub.join("link")).unwrap();
        d.remove_tree("job-2").unwrap();
        assert!(!d.contains("job-2"));
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn names_that_leave_the_directory_are_refused() {
        let t = tmp();
        let d = DaemonDir::open_or_create(&t.path().join("d"), 0o700).unwrap();
        for bad in ["", ".", "..", "../x", "a/b"] {
            assert!(d.create_file(bad).is_err(), "{bad:?}");
            assert!(d.subdir(bad, 0o700).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_socket_is_bound_in_the_directory_with_its_mode() {
        let t = tmp();
        let d = DaemonDir::open_or_create(&t.path().join("run"), 0o755).unwrap();
        let _l = d.bind_socket("mm.sock", 0o666).unwrap();
        let meta = std::fs::symlink_metadata(d.join("mm.sock")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o666);
        assert!(std::os::unix::net::UnixStream::connect(d.join("mm.sock")).is_ok());
    }
}
