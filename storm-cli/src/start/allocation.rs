//! The nodes a private storm instance runs on, as the allocator gives them: Slurm's
//! environment inside `salloc`, `sbatch` or `srun` (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`,
//! `SLURM_JOB_CPUS_PER_NODE`), read the way Slurm writes it. Pure: the caller hands in the
//! variables.

use thiserror::Error;

/// An allocation: the job that holds it and its nodes, in the allocator's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The allocator's job id (Slurm's `SLURM_JOB_ID`).
    pub job: String,
    /// The nodes as the allocator wrote them (`node[1-4]`), for its launcher's `--nodelist`.
    pub list: String,
    /// Node names, in order.
    pub nodes: Vec<String>,
    /// CPUs allocated on each node, in the same order.
    pub cpus: Vec<u32>,
}

/// Why an allocation could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocationError {
    #[error(
        "not inside a Slurm allocation: {0} is not set (run storm start inside salloc, sbatch or srun, or use --hosts or --local)"
    )]
    NotInside(&'static str),
    #[error("{var} = {value:?}: {why}")]
    Malformed {
        var: &'static str,
        value: String,
        why: String,
    },
    #[error("SLURM_JOB_NODELIST names {nodes} nodes but SLURM_JOB_CPUS_PER_NODE gives {cpus}")]
    Mismatch { nodes: usize, cpus: usize },
    #[error("--hosts {given}: {why}")]
    Hosts { given: String, why: String },
}

/// The most hosts a host list may expand to (a bound on what a malformed variable costs).
pub const MAX_HOSTS: usize = 1 << 20;

/// The allocation Slurm describes in `var` (a lookup of its environment variables): inside
/// a step (`srun -N 2 storm start` in a larger allocation), the step's nodes.
pub fn from_slurm(var: impl Fn(&str) -> Option<String>) -> Result<Allocation, AllocationError> {
    let need = |name: &'static str| var(name).ok_or(AllocationError::NotInside(name));
    let job = need("SLURM_JOB_ID")?;
    let job_list = need("SLURM_JOB_NODELIST")?;
    let (list_var, list) = match var("SLURM_STEP_NODELIST") {
        Some(step) => ("SLURM_STEP_NODELIST", step),
        None => ("SLURM_JOB_NODELIST", job_list.clone()),
    };
    let nodes = expand_hostlist(&list).map_err(|why| AllocationError::Malformed {
        var: list_var,
        value: list.clone(),
        why,
    })?;
    // The job's CPU counts are by the job's nodes: a step's own nodes get one each (each
    // agent reports the CPUs it may use anyway).
    let cpus = match var("SLURM_JOB_CPUS_PER_NODE") {
        Some(text) if list == job_list => {
            expand_counts(&text).map_err(|why| AllocationError::Malformed {
                var: "SLURM_JOB_CPUS_PER_NODE",
                value: text.clone(),
                why,
            })?
        }
        _ => vec![1; nodes.len()],
    };
    if cpus.len() != nodes.len() {
        return Err(AllocationError::Mismatch {
            nodes: nodes.len(),
            cpus: cpus.len(),
        });
    }
    Ok(Allocation {
        job,
        list,
        nodes,
        cpus,
    })
}

/// The hosts given to `storm start --hosts`: `file` is the text of the host file named
/// `source` where there is one (one host per line; `#` starts a comment; what follows the
/// host on its line, such as an MPI host file's `slots=4`, and a trailing `:4`, is
/// ignored: each agent reports the CPUs it may use), else `source` is a host list
/// (`node[1-4],login`). A host named twice is refused: it would be two nodes of one host.
pub fn from_hosts(source: &str, file: Option<&str>) -> Result<Allocation, AllocationError> {
    let fail = |why: String| AllocationError::Hosts {
        given: source.to_string(),
        why,
    };
    let nodes: Vec<String> = match file {
        Some(text) => {
            let mut hosts = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("");
                let Some(word) = line.split_whitespace().next() else {
                    continue;
                };
                let host = match word.rsplit_once(':') {
                    Some((h, slots)) if slots.bytes().all(|b| b.is_ascii_digit()) => h,
                    _ => word,
                };
                if host.is_empty() || host.starts_with('-') {
                    return Err(fail(format!("line {}: {word:?} is not a host", n + 1)));
                }
                hosts.push(host.to_string());
                if hosts.len() > MAX_HOSTS {
                    return Err(fail(format!("more than {MAX_HOSTS} hosts")));
                }
            }
            if hosts.is_empty() {
                return Err(fail("the file names no host".into()));
            }
            hosts
        }
        None => {
            let hosts = expand_hostlist(source).map_err(fail)?;
            if let Some(h) = hosts.iter().find(|h| h.starts_with('-')) {
                return Err(fail(format!("{h:?} is not a host")));
            }
            hosts
        }
    };
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = nodes.iter().find(|h| !seen.insert(h.as_str())) {
        return Err(fail(format!("{twice} is named twice")));
    }
    Ok(Allocation {
        job: "hosts".into(),
        list: nodes.join(","),
        cpus: vec![1; nodes.len()],
        nodes,
    })
}

/// Slurm's host list (`node[1-3,07],gpu01,rack[1-2]n[1-2]`) as the names it stands for, in
/// Slurm's order: each comma-separated item expanded by [`storm_cluster::hostlist`] (ranges
/// keep the width of their first bound; several groups multiply out, the first slowest).
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_top_level(list)? {
        if item.is_empty() {
            continue;
        }
        if item.contains(']') && !item.contains('[')
            || item.matches('[').count() != item.matches(']').count()
        {
            return Err(format!("{item:?}: unbalanced brackets"));
        }
        let names = storm_cluster::hostlist::expand(item).map_err(|e| e.to_string())?;
        if names.iter().any(|n| n.contains('[')) {
            return Err(format!("{item:?}: a bracket that is not a list of numbers"));
        }
        hosts.extend(names);
        if hosts.len() > MAX_HOSTS {
            return Err(format!("more than {MAX_HOSTS} hosts"));
        }
    }
    if hosts.is_empty() {
        return Err("no hosts".into());
    }
    Ok(hosts)
}

/// The comma-separated items of a host list, commas inside brackets kept.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("nested or unbalanced brackets".into());
        }
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// Slurm's counts per node (`2(x3),1`) as one count per node (`2 2 2 1`).
pub fn expand_counts(text: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let (count, times) = match part.split_once("(x") {
            Some((c, rest)) => {
                let t = rest
                    .strip_suffix(')')
                    .ok_or_else(|| format!("{part:?}: a '(x' without its ')'"))?;
                (
                    c,
                    t.parse::<usize>()
                        .map_err(|_| format!("{part:?}: not a repeat count"))?,
                )
            }
            None => (part, 1),
        };
        let count: u32 = count
            .parse()
            .map_err(|_| format!("{part:?}: not a count"))?;
        if out.len() + times > MAX_HOSTS {
            return Err(format!("more than {MAX_HOSTS} nodes"));
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand_hostlist(list).unwrap()
    }

    /// Slurm's own forms: ranges, lists in brackets, zero padding, several groups, plain
    /// names, in Slurm's order.
    #[test]
    fn host_lists_expand_as_slurm_writes_them() {
        assert_eq!(hosts("node[1-3]"), ["node1", "node2", "node3"]);
        assert_eq!(hosts("n[08-10],login"), ["n08", "n09", "n10", "login"]);
        assert_eq!(hosts("a[1,3-4]-ib"), ["a1-ib", "a3-ib", "a4-ib"]);
        assert_eq!(hosts("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(hosts("vm"), ["vm"]);
    }

    /// What is not a host list is named, never a panic, and a huge range is refused
    /// before it is built.
    #[test]
    fn malformed_host_lists_are_refused_naming_the_fault() {
        for bad in [
            "",
            "n[1-",
            "n]1",
            "n[a-b]",
            "n[3-1]",
            "n[[1]]",
            "n[1-99999999999]",
        ] {
            assert!(expand_hostlist(bad).is_err(), "{bad:?}");
        }
    }

    /// `--hosts` takes a host list or a host file (MPI's forms of slots ignored, comments
    /// and blank lines skipped); a host named twice, an option where a host should be, and
    /// an empty file are refused naming the fault.
    #[test]
    fn hosts_come_from_a_list_or_a_host_file() {
        let a = from_hosts("n[1-3],login", None).unwrap();
        assert_eq!(a.nodes, ["n1", "n2", "n3", "login"]);
        let file = "# the nodes\nn1 slots=4\n\nn2:8  # fast\n10.0.0.7\n";
        let b = from_hosts("hosts.txt", Some(file)).unwrap();
        assert_eq!(b.nodes, ["n1", "n2", "10.0.0.7"]);
        assert_eq!(b.cpus.len(), 3);
        for (source, file, says) in [
            ("n1,n[1-2]", None, "n1 is named twice"),
            ("f", Some("n1\nn1:2\n"), "n1 is named twice"),
            ("f", Some("# none\n"), "names no host"),
            ("f", Some("-oProxyCommand=x\n"), "is not a host"),
            ("-oProxyCommand=x", None, "is not a host"),
            ("n[1-", None, "unbalanced"),
        ] {
            let err = from_hosts(source, file).unwrap_err().to_string();
            assert!(err.contains(says), "{source:?}: {err}");
        }
    }

    #[test]
    fn cpu_counts_expand_with_repeats() {
        assert_eq!(expand_counts("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_counts("48").unwrap(), [48]);
        assert!(expand_counts("2(x").is_err());
        assert!(expand_counts("x").is_err());
        assert!(expand_counts("1(x99999999999)").is_err());
    }

    /// The allocation from Slurm's variables; outside one, the missing variable is named.
    #[test]
    fn an_allocation_is_read_from_slurms_variables() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let a = from_slurm(env(&[
            ("SLURM_JOB_ID", "12"),
            ("SLURM_JOB_NODELIST", "node[1-4]"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x4)"),
        ]))
        .unwrap();
        assert_eq!(a.nodes.len(), 4);
        assert_eq!(a.cpus, [2, 2, 2, 2]);
        assert_eq!(
            from_slurm(env(&[("SLURM_JOB_ID", "12")])),
            Err(AllocationError::NotInside("SLURM_JOB_NODELIST"))
        );
        let mismatch = from_slurm(env(&[
            ("SLURM_JOB_ID", "12"),
            ("SLURM_JOB_NODELIST", "node[1-4]"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x3)"),
        ]));
        assert_eq!(
            mismatch,
            Err(AllocationError::Mismatch { nodes: 4, cpus: 3 })
        );
        let step = from_slurm(env(&[
            ("SLURM_JOB_ID", "12"),
            ("SLURM_JOB_NODELIST", "node[1-4]"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x4)"),
            ("SLURM_STEP_NODELIST", "node[3-4]"),
        ]))
        .unwrap();
        assert_eq!(step.nodes, ["node3", "node4"], "a step's own nodes");
        assert_eq!(step.list, "node[3-4]");
        assert_eq!(step.cpus, [1, 1]);
    }
}
