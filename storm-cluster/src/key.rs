//! The cluster key file.
//!
//! `storm keygen` writes 32 random bytes as 64 hex digits to a new file of mode 0600. Every
//! daemon of the cluster reads the same key (`[cluster] key_file`, by default `storm.key` next
//! to the cluster file) and refuses to start if the file is missing, can be read by anyone but
//! its owner, or belongs to another user: a key others can read authenticates nothing. Users
//! never need it: they reach the MM through its Unix socket.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use storm_primitives::tcp::auth::ClusterKey;

/// The key file's name when the cluster file does not name one.
pub const DEFAULT_NAME: &str = "storm.key";

/// Why a key could not be made or used; each names the file (and what it holds) and the fix.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "{what} file {path} not found: make one with `storm keygen{flag} --out {path}`{copy}",
        flag = keygen_flag(what),
        copy = if *what == "cluster key" {
            " and copy it to every node of the cluster (mode 0600, owned by the daemons' user)"
        } else {
            ""
        }
    )]
    Missing { what: &'static str, path: PathBuf },
    #[error(
        "{what} file {path} can be read by other users (mode {mode:04o}): run `chmod 600 \
         {path}`, and make a new key if anyone else may have read it"
    )]
    Exposed {
        what: &'static str,
        path: PathBuf,
        mode: u32,
    },
    #[error(
        "{what} file {path} belongs to uid {owner}, not to this daemon's user (uid {me}): \
         run `chown {me} {path}`"
    )]
    NotOwned {
        what: &'static str,
        path: PathBuf,
        owner: u32,
        me: u32,
    },
    #[error("{what} file {path} does not hold a key ({why}): make one with `storm keygen{flag}`", flag = keygen_flag(what))]
    Malformed {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("{what} file {path} already exists: remove it first to replace the key")]
    Exists { what: &'static str, path: PathBuf },
    #[error("{what} file {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The `storm keygen` option that makes a key of this kind.
fn keygen_flag(what: &str) -> &'static str {
    match what {
        MM_KEY => " --mm",
        NODE_KEY => " --node NAME",
        _ => "",
    }
}

/// What each kind of key file holds, as messages name it.
pub const CLUSTER_KEY: &str = "cluster key";
pub const MM_KEY: &str = "MM signing key";
pub const NODE_KEY: &str = "node identity key";

/// Writes `text` to `path` (which must not exist yet), mode 0600, synced.
pub fn write_private(path: &Path, text: &str, what: &'static str) -> Result<(), KeyError> {
    let io = |source| KeyError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => KeyError::Exists {
                what,
                path: path.to_path_buf(),
            },
            _ => io(e),
        })?;
    writeln!(file, "{text}").map_err(io)?;
    file.sync_all().map_err(io)
}

/// Reads the key file at `path`, after checking that only this process's user can read it.
pub fn read_private(path: &Path, what: &'static str) -> Result<String, KeyError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(KeyError::Missing {
                what,
                path: path.to_path_buf(),
            });
        }
        Err(source) => {
            return Err(KeyError::Io {
                what,
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Exposed {
            what,
            path: path.to_path_buf(),
            mode,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(KeyError::NotOwned {
            what,
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    std::fs::read_to_string(path).map_err(|source| KeyError::Io {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a new random key to `path` (which must not exist yet), mode 0600.
pub fn generate(path: &Path) -> Result<ClusterKey, KeyError> {
    let key = ClusterKey::random();
    write_private(path, &key.to_hex(), CLUSTER_KEY)?;
    Ok(key)
}

/// Reads the key at `path`, after checking that only this process's user can read it.
pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
    let text = read_private(path, CLUSTER_KEY)?;
    ClusterKey::from_hex(&text).map_err(|why| KeyError::Malformed {
        what: CLUSTER_KEY,
        path: path.to_path_buf(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_generated_key_is_private_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = generate(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load(&path).unwrap(), key);
        assert!(matches!(generate(&path), Err(KeyError::Exists { .. })));
    }

    #[test]
    fn a_missing_exposed_or_malformed_key_is_refused_naming_the_file_and_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains("storm keygen"));
        generate(&path).unwrap();
        for mode in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = load(&path).unwrap_err().to_string();
            assert!(err.contains("chmod 600"), "{err}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not a key\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("does not hold a key"), "{err}");
    }

    #[test]
    fn a_key_of_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("NOT TESTED: a_key_of_another_user_is_refused: needs root to chown");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        generate(&path).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("uid 65534") && err.contains("chown 0"),
            "{err}"
        );
    }
}
