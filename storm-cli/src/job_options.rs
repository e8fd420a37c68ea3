//! The options that shape a job, shared by `storm-submit` and `storm batch` (and the
//! `#STORM` / `#SBATCH` lines of a batch script): what it asks for, for how long, after what.

use std::path::PathBuf;

use storm_cluster::control::MemRequest;
use storm_cluster::dependency::Dependency;
use storm_cluster::flock::Flock;
use storm_cluster::tasks::TaskRequest;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct JobShape {
    /// Nodes to run on (alone: one task on each).
    #[arg(short = 'N', long = "nodes")]
    pub nodes: Option<u32>,
    /// Tasks (ranks) to run (alone: as many nodes as they need at one task per CPU).
    #[arg(short = 'n', long = "ntasks")]
    pub ntasks: Option<u32>,
    /// Tasks per node.
    #[arg(long)]
    pub ntasks_per_node: Option<u32>,
    /// Allow more tasks on a node than it has CPUs.
    #[arg(short = 'O', long)]
    pub overcommit: bool,
    /// Take whole nodes: a job whose tasks fit in some CPUs of one node otherwise shares the
    /// node with other jobs.
    #[arg(long)]
    pub exclusive: bool,
    /// Working directory of the tasks (default: the current one).
    #[arg(short = 'D', long)]
    pub chdir: Option<PathBuf>,
    /// Environment to pass: ALL (default), NONE, or VAR[=value],... (add ALL to keep the rest).
    #[arg(long)]
    pub export: Option<String>,
    /// Wall-clock limit: minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S (as Slurm's --time).
    #[arg(short = 't', long = "time", value_parser = storm_cluster::control::parse_time_limit)]
    pub time_limit_ms: Option<u64>,
    /// When a node of the job fails, run the job again from the start (on other nodes)
    /// instead of ending it.
    #[arg(long)]
    pub requeue: bool,
    /// Job name (default: the program's name).
    #[arg(short = 'J', long)]
    pub job_name: Option<String>,
    /// Start only once other jobs have: started (after:ID), ended (afterany:ID), ended with
    /// exit code 0 (afterok:ID), ended otherwise (afternotok:ID), or once this user's earlier
    /// jobs of the same name have ended (singleton). Several jobs: afterok:12:13; all of
    /// several conditions: `,`; any one of them: `?`. A job whose dependency can never be met
    /// ends, saying why.
    #[arg(short = 'd', long, value_name = "COND:ID[:ID...]")]
    pub dependency: Option<Dependency>,
    /// Memory on each node (as srun: a number is megabytes; or K, M, G, T). The job is
    /// placed only where it fits beside every other job, in every time slot, and is killed
    /// (`out_of_memory`) if it uses more.
    #[arg(long, value_parser = parse_mem, conflicts_with = "mem_per_cpu", value_name = "SIZE")]
    pub mem: Option<u64>,
    /// Memory per CPU the job holds on a node (megabytes, or K, M, G, T).
    #[arg(long, value_parser = parse_mem, value_name = "SIZE")]
    pub mem_per_cpu: Option<u64>,
    /// Only nodes with these features (the cluster file's `features`): one, or several
    /// joined by `&` or `,`, all of which each node must have.
    #[arg(short = 'C', long, value_name = "FEATURE[&FEATURE...]")]
    pub constraint: Option<String>,
    /// Run on a peer cluster that offers room now if this one cannot start the job first
    /// (the cluster file's `[[peer]]`s this cluster may borrow from).
    #[arg(long, conflicts_with_all = ["clusters", "no_flock"])]
    pub flock: bool,
    /// Run only on these clusters, whichever can start the job first (this cluster's own
    /// name among them lets it run here too).
    #[arg(
        short = 'M',
        long,
        value_name = "NAME[,NAME...]",
        conflicts_with = "no_flock"
    )]
    pub clusters: Option<String>,
    /// Run only on this cluster, even when the cluster file lets waiting jobs flock.
    #[arg(long)]
    pub no_flock: bool,
    /// Also run on nodes peer clusters lend to this one (its guest slots), beside its own
    /// (docs/federation.md): without it a job runs on this cluster's own nodes only.
    #[arg(long)]
    pub borrow: bool,
    /// Start on fewer nodes than asked for if that many cannot be had (Balloc's
    /// `--ba--less`): the nodes free now, keeping the tasks per node (docs/federation.md).
    #[arg(long)]
    pub less: bool,
    /// All of the job's nodes from one cluster: this one's own, or (with `--borrow`) one
    /// lender's, never both (Balloc's `--ba--one`).
    #[arg(long)]
    pub one_cluster: bool,
}

/// `--mem`'s value: srun's sizes, where a bare number is megabytes.
fn parse_mem(text: &str) -> Result<u64, String> {
    match storm_cluster::size::parse_size(text, storm_cluster::size::Unit::Mega) {
        Some(0) => Err("must be more than 0".into()),
        Some(b) => Ok(b),
        None => Err(format!(
            "{text:?} is not a size: megabytes, or a number with K, M, G or T"
        )),
    }
}

impl JobShape {
    /// These options, each taken from `other` where this one does not give it (a batch
    /// script's lines under the command line's options).
    pub fn or(self, other: JobShape) -> JobShape {
        JobShape {
            nodes: self.nodes.or(other.nodes),
            ntasks: self.ntasks.or(other.ntasks),
            ntasks_per_node: self.ntasks_per_node.or(other.ntasks_per_node),
            overcommit: self.overcommit || other.overcommit,
            exclusive: self.exclusive || other.exclusive,
            chdir: self.chdir.or(other.chdir),
            export: self.export.or(other.export),
            time_limit_ms: self.time_limit_ms.or(other.time_limit_ms),
            requeue: self.requeue || other.requeue,
            job_name: self.job_name.or(other.job_name),
            dependency: self.dependency.or(other.dependency),
            // One memory option wins whole: the command line's over the script's.
            mem: if self.mem.is_some() || self.mem_per_cpu.is_some() {
                self.mem
            } else {
                other.mem
            },
            mem_per_cpu: if self.mem.is_some() || self.mem_per_cpu.is_some() {
                self.mem_per_cpu
            } else {
                other.mem_per_cpu
            },
            constraint: self.constraint.or(other.constraint),
            // One choice of where to run wins whole: the command line's over the script's.
            flock: if self.flock || self.clusters.is_some() || self.no_flock {
                self.flock
            } else {
                other.flock
            },
            no_flock: if self.flock || self.clusters.is_some() || self.no_flock {
                self.no_flock
            } else {
                other.no_flock
            },
            clusters: if self.flock || self.clusters.is_some() || self.no_flock {
                self.clusters
            } else {
                other.clusters
            },
            borrow: self.borrow || other.borrow,
            less: self.less || other.less,
            one_cluster: self.one_cluster || other.one_cluster,
        }
    }

    /// Where these options let the job run.
    pub fn flock(&self) -> Result<Flock, String> {
        if let Some(text) = &self.clusters {
            let mut names: Vec<String> = Vec::new();
            for n in text.split(',').map(str::trim) {
                if n.is_empty() || n.contains(char::is_whitespace) {
                    return Err(format!(
                        "--clusters {text:?}: cluster names are joined by commas; {n:?} is not one"
                    ));
                }
                if !names.iter().any(|m| m == n) {
                    names.push(n.to_string());
                }
            }
            return Ok(Flock::Only(names));
        }
        Ok(if self.flock {
            Flock::Now
        } else if self.no_flock {
            Flock::Never
        } else {
            Flock::AfterWait
        })
    }

    /// The memory these options ask for.
    pub fn mem(&self) -> Option<MemRequest> {
        self.mem
            .map(MemRequest::PerNode)
            .or(self.mem_per_cpu.map(MemRequest::PerCpu))
    }

    /// The features `--constraint` asks for, each named once.
    pub fn constraint(&self) -> Result<Vec<String>, String> {
        let Some(text) = &self.constraint else {
            return Ok(Vec::new());
        };
        let mut features: Vec<String> = Vec::new();
        for f in text.split(['&', ',']).map(str::trim) {
            if f.is_empty() || f.contains(['|', '[', ']', '*', ' ']) {
                return Err(format!(
                    "--constraint {text:?}: features are joined by & or , (all required); \
                     {f:?} is not a feature name"
                ));
            }
            if !features.iter().any(|g| g == f) {
                features.push(f.to_string());
            }
        }
        Ok(features)
    }

    /// The task request these options make.
    pub fn tasks(&self) -> TaskRequest {
        TaskRequest {
            nodes: self.nodes,
            ntasks: self.ntasks,
            ntasks_per_node: self.ntasks_per_node,
            overcommit: self.overcommit,
            exclusive: self.exclusive,
        }
    }

    /// Inside a job (a step): what was not given is the job's allocation, from the
    /// variables its tasks get (`STORM_NNODES`, `STORM_NTASKS`), as srun inside sbatch.
    pub fn or_allocation(mut self, vars: impl Fn(&str) -> Option<String>) -> JobShape {
        if self.nodes.is_none() && self.ntasks.is_none() && self.ntasks_per_node.is_none() {
            let num = |k: &str| vars(k).and_then(|v| v.parse::<u32>().ok());
            self.nodes = num("STORM_NNODES");
            self.ntasks = num("STORM_NTASKS");
        }
        self
    }
}
