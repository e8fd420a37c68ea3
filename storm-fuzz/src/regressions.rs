//! Inputs that once found a problem, kept as `regressions/<target>-<what>.hex` and replayed
//! on every test run.

use std::path::{Path, PathBuf};

use crate::run::from_hex;
use crate::targets::{self, Target};

/// Where the saved inputs live in the source tree.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions")
}

/// One saved input.
pub struct Saved {
    pub file: PathBuf,
    pub target: &'static Target,
    pub input: Vec<u8>,
}

/// Every saved input under `dir`, each with the target its file name starts with.
pub fn load(dir: &Path) -> Result<Vec<Saved>, String> {
    let mut saved = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let file = entry.map_err(|e| e.to_string())?.path();
        if file.extension().is_none_or(|x| x != "hex") {
            continue;
        }
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let target = targets::all()
            .iter()
            .find(|t| {
                stem.strip_prefix(t.name)
                    .is_some_and(|r| r.starts_with('-'))
            })
            .ok_or_else(|| format!("{}: names no target", file.display()))?;
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        let input = from_hex(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        saved.push(Saved {
            file,
            target,
            input,
        });
    }
    saved.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(saved)
}
