//! Sizes as people write them: `64M`, `4G`, `512MB`, `1.5T` (powers of 1024).
//!
//! The cluster file takes [`ByteSize`] for thresholds and node memory (a number of bytes, or
//! a string with a suffix); `--mem` and `--mem-per-cpu` take srun's form, where a number
//! with no suffix counts megabytes ([`parse_size`] with [`Unit::Mega`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a bare number counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// MiB, as srun's `--mem` reads a number without a suffix.
    Mega,
}

/// `text` as bytes: digits (a fraction allowed) with an optional `K M G T` suffix, `B`
/// after it allowed, both in either case. `None` for anything else, for a negative, and for
/// a size past `u64::MAX`.
pub fn parse_size(text: &str, bare: Unit) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let last = t.chars().last()?;
    let (digits, scale) = match last {
        'k' | 'K' => (&t[..t.len() - 1], 1u64 << 10),
        'm' | 'M' => (&t[..t.len() - 1], 1 << 20),
        'g' | 'G' => (&t[..t.len() - 1], 1 << 30),
        't' | 'T' => (&t[..t.len() - 1], 1 << 40),
        _ if text.trim().ends_with(['B', 'b']) => (t, 1),
        _ => (
            t,
            match bare {
                Unit::Bytes => 1,
                Unit::Mega => 1 << 20,
            },
        ),
    };
    if digits.is_empty() || digits.starts_with(['-', '+']) {
        return None;
    }
    if let Ok(whole) = digits.parse::<u64>() {
        return whole.checked_mul(scale);
    }
    let v: f64 = digits.parse().ok()?;
    let bytes = v * scale as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// `bytes` the short way people read them (`64 MiB`, `1.5 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v >= 100.0 || v.fract() < 0.05 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A size in the cluster file: `1073741824`, or `"1G"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn mib(n: u64) -> Self {
        Self(n << 20)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human_bytes(self.0))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(u64),
            Text(String),
        }
        match Written::deserialize(d)? {
            Written::Number(n) => Ok(ByteSize(n)),
            Written::Text(t) => parse_size(&t, Unit::Bytes).map(ByteSize).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "{t:?} is not a size (a number of bytes, or one with K, M, G or T)"
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("64M", Unit::Bytes), Some(64 << 20));
        assert_eq!(parse_size("512MB", Unit::Bytes), Some(512 << 20));
        assert_eq!(parse_size("1.5g", Unit::Bytes), Some(3 << 29));
        assert_eq!(parse_size("4096", Unit::Bytes), Some(4096));
        assert_eq!(parse_size("4096B", Unit::Mega), Some(4096));
        // srun: a bare number is megabytes.
        assert_eq!(parse_size("100", Unit::Mega), Some(100 << 20));
        for bad in ["", "G", "-1G", "x", "1Q", "99999999999T", "nan", "inf"] {
            assert_eq!(parse_size(bad, Unit::Bytes), None, "{bad:?}");
        }
    }

    #[test]
    fn sizes_print_short() {
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(100), "100 B");
    }

    #[test]
    fn cluster_file_sizes_take_a_number_or_a_suffix() {
        #[derive(Deserialize)]
        struct T {
            a: ByteSize,
            b: ByteSize,
        }
        let t: T = toml::from_str("a = 1024\nb = \"2K\"").unwrap();
        assert_eq!((t.a, t.b), (ByteSize(1024), ByteSize(2048)));
        let e = toml::from_str::<T>("a = 1\nb = \"2Q\"").err().unwrap();
        assert!(e.to_string().contains("\"2Q\" is not a size"), "{e}");
    }
}
