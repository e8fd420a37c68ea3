//! `storm-bench fuzz`: the long fuzz run. Every decoder storm exposes (storm-fuzz's targets)
//! gets millions of mutated inputs; a panic, an allocation its input does not explain, or a
//! hang stops the run with the input, saved for a regression test. CI runs 100,000 inputs
//! per target (`cargo test -p storm-fuzz`).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use storm_fuzz::{guard, run, targets};

use crate::report::Table;

pub struct FuzzArgs {
    /// Targets by name; empty: all.
    pub targets: Vec<String>,
    pub inputs: u64,
    pub seed: u64,
    /// Where a finding's input is written.
    pub save: PathBuf,
}

pub fn run(args: &FuzzArgs) -> Result<Table> {
    if !guard::installed() {
        bail!("storm-bench was built without the counting allocator; allocations go unchecked");
    }
    let chosen: Vec<&'static targets::Target> = if args.targets.is_empty() {
        targets::all().iter().collect()
    } else {
        args.targets
            .iter()
            .map(|name| {
                targets::by_name(name).ok_or_else(|| {
                    let known: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
                    anyhow::anyhow!("no fuzz target {name:?}; there are: {}", known.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    let mut table = Table::new(
        format!(
            "fuzzing, {} inputs per target, seed {}",
            args.inputs, args.seed
        ),
        &["target", "inputs", "accepted", "peak held", "inputs/s"],
    );
    for target in chosen {
        eprintln!("fuzzing {} ...", target.name);
        match run::run(target, args.inputs, args.seed) {
            Ok(s) => table.push(vec![
                s.target.to_string(),
                s.inputs.to_string(),
                format!(
                    "{:.1} %",
                    100.0 * s.accepted as f64 / s.inputs.max(1) as f64
                ),
                format!("{} KiB", s.peak / 1024),
                format!("{:.0}", s.per_second()),
            ]),
            Err(finding) => {
                let file = save(&args.save, &finding)?;
                bail!("{finding}\nsaved as {}", file.display());
            }
        }
    }
    Ok(table)
}

fn save(dir: &Path, finding: &run::Finding) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let hash = xxhash_rust::xxh3::xxh3_64(&finding.input);
    let file = dir.join(format!("{}-found-{hash:016x}.hex", finding.target));
    std::fs::write(&file, run::to_hex(&finding.input) + "\n")?;
    Ok(file)
}
