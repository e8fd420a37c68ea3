//! Key files looked at again while a daemon runs.
//!
//! A daemon refuses to start with a key file others can read (see [`crate::key`]), but that
//! says nothing of a `chmod 644` made while it runs: a user who then copies the key holds it.
//! So a running daemon looks at its key files again every `[security]
//! key_check_interval_s` and on SIGHUP. A file found readable by others (or owned by
//! another user) is made private again, on a descriptor opened without following a symlink,
//! and the daemon says loudly that the key may be in other hands and must be rotated. On
//! SIGHUP the daemon also reads its keys again, which is how keys are rotated without a
//! restart (docs/security.md).
//!
//! Between those looks, a thread of the watch follows the key files' directories with
//! inotify: a key file whose mode or owner changes, or that is replaced, is looked at at once
//! (a `chmod 644` is undone within milliseconds, not at the next timer).

use std::collections::BTreeMap;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What [`KeyWatch::poll`] asks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing this time.
    Nothing,
    /// The key files were looked at (and any exposed one made private again).
    Checked,
    /// SIGHUP: they were looked at, and the daemon should read its keys again.
    Reload,
}

/// A daemon's key files, and when to look at them next.
pub struct KeyWatch {
    files: Vec<(&'static str, PathBuf)>,
    every: Duration,
    next: Instant,
    reload: Arc<AtomicBool>,
}

impl KeyWatch {
    /// Watches `files` ((what it holds, path)) every `every`, and on SIGHUP.
    pub fn new(files: Vec<(&'static str, PathBuf)>, every: Duration) -> std::io::Result<Self> {
        let reload = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())?;
        if let Err(e) = watch_changes(&files) {
            tracing::warn!(
                "key files are looked at every {} s and on SIGHUP only: cannot follow their \
                 changes ({e})",
                every.as_secs()
            );
        }
        Ok(Self {
            files,
            every: every.max(Duration::from_secs(1)),
            next: Instant::now() + every,
            reload,
        })
    }

    /// How long until the next look (for a daemon's wait; a SIGHUP interrupts it anyway).
    pub fn until_due(&self, now: Instant) -> Duration {
        self.next.saturating_duration_since(now)
    }

    /// Looks at the files if it is time, or if SIGHUP came.
    pub fn poll(&mut self, now: Instant) -> Due {
        let reload = self.reload.swap(false, Ordering::AcqRel);
        if !reload && now < self.next {
            return Due::Nothing;
        }
        self.next = now + self.every;
        for (what, path) in &self.files {
            check_private(what, path);
        }
        if reload { Due::Reload } else { Due::Checked }
    }
}

/// Starts a thread that looks at a key file of `files` as soon as inotify says its mode,
/// owner or content changed, or it was replaced, in its directory. It runs for the rest of
/// the process.
fn watch_changes(files: &[(&'static str, PathBuf)]) -> std::io::Result<()> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(std::io::Error::from)?;
    // Each watched directory, with the key files in it by name.
    let mut dirs: BTreeMap<PathBuf, Vec<(&'static str, PathBuf)>> = BTreeMap::new();
    for (what, path) in files {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        dirs.entry(dir.to_path_buf())
            .or_default()
            .push((what, path.clone()));
    }
    let mut by_watch = Vec::new();
    for (dir, in_it) in dirs {
        let wd = inotify
            .add_watch(
                &dir,
                AddWatchFlags::IN_ATTRIB
                    | AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_CLOSE_WRITE,
            )
            .map_err(std::io::Error::from)?;
        by_watch.push((wd, in_it));
    }
    std::thread::Builder::new()
        .name("storm-keywatch".into())
        .spawn(move || {
            loop {
                let events = match inotify.read_events() {
                    Ok(e) => e,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::warn!("following the key files' changes stopped: {e}");
                        return;
                    }
                };
                for ev in events {
                    let Some((_, in_it)) = by_watch.iter().find(|(wd, _)| *wd == ev.wd) else {
                        continue;
                    };
                    for (what, path) in in_it {
                        if ev.name.as_deref() == path.file_name() {
                            check_private(what, path);
                        }
                    }
                }
            }
        })?;
    Ok(())
}

/// Makes the key file at `path` private again if it is not: mode 0600, this process's user.
/// Returns whether it had to.
pub fn check_private(what: &str, path: &std::path::Path) -> bool {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let fd = match nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!("{what} file {}: {e}", path.display());
            return false;
        }
    };
    let file = std::fs::File::from(fd);
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 && meta.uid() == me {
        return false;
    }
    let fixed = nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(0o600))
        .and_then(|()| nix::unistd::fchown(&file, Some(nix::unistd::Uid::from_raw(me)), None));
    tracing::error!(
        "{what} file {} could be read by others or belonged to another user (mode {mode:04o}, \
         uid {}): {}; anyone who read it holds the key: rotate it (docs/security.md, \"Rotating \
         keys\")",
        path.display(),
        meta.uid(),
        match fixed {
            Ok(()) => "made private again".to_string(),
            Err(e) => format!("could not make it private again: {e}"),
        }
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_exposed_key_file_is_made_private_again_and_a_private_one_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, "x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(!check_private("cluster key", &path));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(check_private("cluster key", &path));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_symlink_in_place_of_a_key_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("k");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(!check_private("cluster key", &link));
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "the symlink's target is not touched");
    }
}
