//! CPU binding (`storm-submit --cpu-bind`, srun's `--cpu-bind`): which CPUs each rank of a
//! job may run on, decided by its NM and applied by the launcher before the program runs.
//!
//! The NM knows the CPUs it may use itself (its own affinity: the whole machine, or a Slurm
//! allocation's cpuset) and which of the node's CPUs the job holds (all of them, or the ones
//! the MM gave a job sharing the node). [`bind`] decides a rank's CPUs from those; the NM
//! tells the task in `STORM_CPU_BIND` (the mode applied) and `STORM_CPU_BIND_LIST` (its CPUs,
//! as [`format_list`] writes them), and the launcher applies the list ([`parse_list`],
//! `sched_setaffinity`). docs/mpi.md gives the rules beside srun's.

use serde::{Deserialize, Serialize};

/// The variable naming the binding a task got: `none`, `cores` or `rank`.
pub const MODE_VAR: &str = "STORM_CPU_BIND";
/// The variable listing the CPUs a task is bound to (`0-3,8`); absent when unbound.
pub const LIST_VAR: &str = "STORM_CPU_BIND_LIST";
/// The highest CPU number a list may name (the kernel's `cpu_set_t` holds 1024).
pub const MAX_CPU: u32 = 1023;

/// How a job's ranks are bound to CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CpuBind {
    /// Not bound: a rank runs on any CPU its node manager may use.
    None,
    /// Each rank on CPUs of its own among those the job holds on the node, an equal block
    /// each (srun's `cores`), when the node runs no more of the job's ranks than it holds
    /// CPUs; on a node holding fewer CPUs than ranks, every rank on all of the job's CPUs.
    #[default]
    Cores,
    /// Local rank `k` on the job's `k`-th CPU of the node, counting round (srun's `rank`):
    /// one CPU each, shared by several ranks when there are more ranks than CPUs.
    Rank,
}

impl CpuBind {
    /// How `--cpu-bind` names it.
    pub fn name(self) -> &'static str {
        match self {
            CpuBind::None => "none",
            CpuBind::Cores => "cores",
            CpuBind::Rank => "rank",
        }
    }
}

impl std::str::FromStr for CpuBind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" | "no" => Ok(CpuBind::None),
            "cores" | "core" => Ok(CpuBind::Cores),
            "rank" => Ok(CpuBind::Rank),
            other => Err(format!(
                "unknown --cpu-bind {other:?} (expected none, cores or rank)"
            )),
        }
    }
}

impl std::fmt::Display for CpuBind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The CPUs local rank `local_rank` of `local_size` is bound to under `mode`, given the CPUs
/// the job holds on the node (`held`, in order); `None`: not bound. `node_cpus` is how many
/// CPUs the NM may use: a job that holds all of them under `Cores` with more ranks than CPUs
/// is left unbound (binding would change nothing).
pub fn bind(
    mode: CpuBind,
    held: &[u32],
    node_cpus: usize,
    local_rank: u32,
    local_size: u32,
) -> Option<Vec<u32>> {
    if held.is_empty() || local_size == 0 {
        return None;
    }
    let (c, l, k) = (held.len(), local_size as usize, local_rank as usize);
    match mode {
        CpuBind::None => None,
        CpuBind::Rank => Some(vec![held[k % c]]),
        CpuBind::Cores if l <= c => {
            // An equal block each; the first `c % l` ranks get one more.
            let (each, extra) = (c / l, c % l);
            let start = k * each + k.min(extra);
            let len = each + usize::from(k < extra);
            Some(held[start..start + len].to_vec())
        }
        CpuBind::Cores if c < node_cpus => Some(held.to_vec()),
        CpuBind::Cores => None,
    }
}

/// A CPU list as the kernel writes one (`0-3,8,10-11`), from CPUs in any order.
pub fn format_list(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // The same format as Slurm's array indices.
    crate::control::index_ranges(&sorted)
}

/// The CPUs of a list such as `0-3,8` (the kernel's format), each at most [`MAX_CPU`].
pub fn parse_list(text: &str) -> Result<Vec<u32>, String> {
    let cpu = |s: &str| -> Result<u32, String> {
        let n: u32 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} in CPU list {text:?} is not a CPU number"))?;
        if n > MAX_CPU {
            return Err(format!("CPU {n} in {text:?} is above {MAX_CPU}"));
        }
        Ok(n)
    };
    let mut out = Vec::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (cpu(a)?, cpu(b)?);
                if a > b {
                    return Err(format!(
                        "range {part:?} in CPU list {text:?} runs backwards"
                    ));
                }
                out.extend(a..=b);
            }
            None => out.push(cpu(part)?),
        }
    }
    if out.is_empty() {
        return Err(format!("CPU list {text:?} names no CPU"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_gives_each_rank_an_equal_block_of_the_held_cpus() {
        let held = [4, 5, 6, 7];
        assert_eq!(bind(CpuBind::Cores, &held, 8, 0, 2), Some(vec![4, 5]));
        assert_eq!(bind(CpuBind::Cores, &held, 8, 1, 2), Some(vec![6, 7]));
        assert_eq!(bind(CpuBind::Cores, &held, 8, 3, 4), Some(vec![7]));
        // Three ranks on four CPUs: the first gets the spare one.
        assert_eq!(bind(CpuBind::Cores, &held, 8, 0, 3), Some(vec![4, 5]));
        assert_eq!(bind(CpuBind::Cores, &held, 8, 2, 3), Some(vec![7]));
    }

    #[test]
    fn cores_on_an_oversubscribed_node_keeps_ranks_to_the_job_s_cpus_or_leaves_them_be() {
        // Part of the node: all ranks on the job's CPUs.
        assert_eq!(bind(CpuBind::Cores, &[2, 3], 8, 2, 3), Some(vec![2, 3]));
        // The whole node: nothing to bind.
        assert_eq!(bind(CpuBind::Cores, &[0, 1], 2, 2, 3), None);
    }

    #[test]
    fn rank_counts_round_the_held_cpus_and_none_binds_nothing() {
        assert_eq!(bind(CpuBind::Rank, &[0, 1], 2, 3, 4), Some(vec![1]));
        assert_eq!(bind(CpuBind::None, &[0, 1], 2, 0, 1), None);
        assert_eq!(bind(CpuBind::Cores, &[], 2, 0, 1), None);
    }

    #[test]
    fn lists_read_back_what_they_write_and_bad_ones_are_named() {
        assert_eq!(format_list(&[8, 0, 1, 2, 3, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_list("0-3,8,10-11").unwrap(), [0, 1, 2, 3, 8, 10, 11]);
        assert!(parse_list("3-1").unwrap_err().contains("backwards"));
        assert!(parse_list("1024").unwrap_err().contains("above 1023"));
        assert!(parse_list("x").unwrap_err().contains("not a CPU number"));
        assert!(parse_list("").unwrap_err().contains("names no CPU"));
    }
}
