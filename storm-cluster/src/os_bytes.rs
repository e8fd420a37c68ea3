//! Paths as the bytes Unix gives them, on the wire and in the journal.
//!
//! serde writes a `Path` only if it is UTF-8 (and fails otherwise), so a user whose working
//! directory, program or output file has a name in Latin-1 could not run a job. The fields
//! of the wire types that hold a user's path say `#[serde(with = "os_bytes::path")]` (or
//! `opt_path`, `paths`): they travel as their bytes, unchanged. Arguments and environment
//! are `OsString`s, which serde already carries as bytes on Unix.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// A path's bytes, for the `with` helpers below.
struct PathBytes<'a>(&'a Path);

impl Serialize for PathBytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0.as_os_str().as_bytes())
    }
}

/// A path read back from its bytes.
struct OwnedPath(PathBuf);

impl<'de> Deserialize<'de> for OwnedPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_byte_buf(BytesVisitor)
            .map(|b| OwnedPath(PathBuf::from(OsString::from_vec(b))))
    }
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a path's bytes")
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
        Ok(v.as_bytes().to_vec())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(b) = seq.next_element()? {
            out.push(b);
        }
        Ok(out)
    }
}

/// `#[serde(with = "os_bytes::path")]` on a `PathBuf`.
pub mod path {
    use super::*;

    pub fn serialize<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        PathBytes(p).serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        OwnedPath::deserialize(d).map(|p| p.0)
    }
}

/// `#[serde(with = "os_bytes::opt_path")]` on an `Option<PathBuf>`.
pub mod opt_path {
    use super::*;

    pub fn serialize<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        p.as_deref().map(PathBytes).serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        Option::<OwnedPath>::deserialize(d).map(|p| p.map(|p| p.0))
    }
}

/// `#[serde(with = "os_bytes::paths")]` on a `Vec<PathBuf>`.
pub mod paths {
    use super::*;

    pub fn serialize<S: Serializer>(p: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(p.iter().map(|p| PathBytes(p)))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
        Vec::<OwnedPath>::deserialize(d).map(|v| v.into_iter().map(|p| p.0).collect())
    }
}

/// The environment's `NAME=value` pairs as the process has them, UTF-8 or not
/// (`std::env::vars` panics on the first variable that is not).
pub fn vars() -> Vec<(OsString, OsString)> {
    std::env::vars_os().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        #[serde(with = "path")]
        one: PathBuf,
        #[serde(with = "opt_path")]
        maybe: Option<PathBuf>,
        #[serde(with = "paths")]
        many: Vec<PathBuf>,
        args: Vec<OsString>,
    }

    #[test]
    fn non_utf8_paths_and_arguments_survive_the_wire_byte_for_byte() {
        let latin1 = |b: &[u8]| PathBuf::from(OsString::from_vec(b.to_vec()));
        let h = Holder {
            one: latin1(b"/home/caf\xe9"),
            maybe: Some(latin1(b"out-\xff.txt")),
            many: vec![latin1(b"/a"), latin1(b"/\xfe")],
            args: vec![OsString::from_vec(b"--name=\xe9t\xe9".to_vec())],
        };
        let bytes = crate::messages::encode("test", &h, 1 << 16).expect("encodes");
        let back: Holder = crate::messages::decode("test", &bytes, 1 << 16).expect("decodes");
        assert_eq!(back, h);
        let none = Holder { maybe: None, ..h };
        let bytes = crate::messages::encode("test", &none, 1 << 16).unwrap();
        assert_eq!(
            crate::messages::decode::<Holder>("test", &bytes, 1 << 16).unwrap(),
            none
        );
    }
}
