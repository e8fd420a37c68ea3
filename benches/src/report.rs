//! Tables for the terminal and CSV files for plotting.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

/// Rows of named columns, printed aligned and written as CSV.
#[derive(Debug, Default)]
pub struct Table {
    pub title: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Self {
        Self {
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.columns.iter().map(|c| c.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.title);
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:>w$}"))
                .collect::<Vec<_>>()
                .join("  ")
        };
        let _ = writeln!(out, "{}", line(&self.columns));
        for row in &self.rows {
            let _ = writeln!(out, "{}", line(row));
        }
        out
    }
}

/// Machine-readable results: one CSV file, one row per measurement; plus the raw samples of
/// the measurements whose distribution a figure shows (not written to the CSV).
#[derive(Debug, Default)]
pub struct Csv {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    distributions: Vec<(String, Vec<f64>)>,
}

impl Csv {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            distributions: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.header.len());
        self.rows.push(row);
    }

    /// Keeps the samples (seconds) of one measurement, for a figure of their distribution.
    pub fn push_distribution(&mut self, name: impl Into<String>, samples: Vec<f64>) {
        self.distributions.push((name.into(), samples));
    }

    pub fn distributions(&self) -> &[(String, Vec<f64>)] {
        &self.distributions
    }

    /// The index of column `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let mut text = self.header.join(",");
        text.push('\n');
        for row in &self.rows {
            text.push_str(&row.join(","));
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Writes the file if the user asked for one (`--csv`), and says where.
    pub fn write_if_asked(&self, path: Option<&Path>) -> Result<()> {
        if let Some(path) = path {
            self.write(path)?;
            eprintln!("wrote {}", path.display());
        }
        Ok(())
    }
}

/// Parses `8,4K,64K,1M,12M` (binary multiples).
pub fn parse_sizes(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(|s| {
            let s = s.trim();
            let (num, mult) = match s.chars().last() {
                Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
                Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
                Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
                _ => (s, 1),
            };
            num.parse::<usize>()
                .map(|n| n * mult)
                .map_err(|_| format!("{s:?} is not a size (examples: 8, 4K, 1M)"))
        })
        .collect()
}

/// Parses `1,2,4,8`.
pub fn parse_counts(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{s:?} is not a positive node count"))
        })
        .collect()
}

/// `12M`-style label for a byte count.
pub fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_counts_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_sizes("8,4K,64K,1M,12M").unwrap(),
            vec![8, 4096, 65536, 1 << 20, 12 << 20]
        );
        assert!(parse_sizes("8,x").unwrap_err().contains("\"x\""));
        assert_eq!(parse_counts("1,2,32").unwrap(), vec![1, 2, 32]);
        assert!(parse_counts("0").is_err());
        assert_eq!(size_label(12 << 20), "12M");
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(8), "8");
    }

    #[test]
    fn tables_align_columns() {
        let mut t = Table::new("T", &["a", "bbb"]);
        t.push(vec!["1000".into(), "2".into()]);
        assert_eq!(t.render(), "T\n   a  bbb\n1000    2\n");
    }
}
