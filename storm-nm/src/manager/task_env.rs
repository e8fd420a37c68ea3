//! What a rank's process starts with beside its program: its environment (storm's `STORM_*`
//! variables, PMI's and Open MPI's where the job is served them, the user's own) and its CPU
//! binding (`--cpu-bind`).

use super::*;

impl<E: NmEnv> NodeManager<E> {
    /// How local rank `local_rank` of `local_size` of job `spec` is bound: the mode (the
    /// request's, else this node's `[cluster] cpu_bind`; `none` where it binds nothing) and
    /// its CPUs, from those the job holds here ([`storm_cluster::cpu_bind::bind`]).
    pub(super) fn cpu_binding(
        &self,
        spec: &LaunchSpec,
        local_rank: u32,
        local_size: u32,
    ) -> (cpu_bind::CpuBind, Option<Vec<u32>>) {
        let mode = spec.cpu_bind.unwrap_or(self.cfg.cluster.cpu_bind);
        if self.cpus.is_empty() {
            return (cpu_bind::CpuBind::None, None);
        }
        let node_cpus = self.cfg.nodes[self.node as usize].cpus as usize;
        let index = |i: u32| self.cpus[i as usize % self.cpus.len()];
        // A node file saying more CPUs than the NM may use maps several onto one.
        let usable = node_cpus.min(self.cpus.len());
        let mut held: Vec<u32> = match &spec.cpus {
            Some(set) => set.iter().map(index).collect(),
            None => (0..usable as u32).map(index).collect(),
        };
        let mut seen = std::collections::BTreeSet::new();
        held.retain(|c| seen.insert(*c));
        match cpu_bind::bind(mode, &held, usable, local_rank, local_size) {
            Some(cpus) => (mode, Some(cpus)),
            None => (cpu_bind::CpuBind::None, None),
        }
    }

    pub(super) fn task_env(
        &self,
        spec: &LaunchSpec,
        rank: u32,
        (local_rank, local_size): (u32, u32),
        scratch: Option<&std::path::Path>,
    ) -> Vec<(OsString, OsString)> {
        let name = self.cfg.nodes[self.node as usize].name.clone();
        let mut ours: Vec<(&str, String)> = vec![
            ("STORM_JOB_ID", spec.job.to_string()),
            ("STORM_RANK", rank.to_string()),
            ("STORM_SIZE", spec.ntasks.to_string()),
            ("STORM_NODEID", self.node.to_string()),
            ("STORM_NODENAME", name.clone()),
            // The address the node is reached on (its NM's, in the cluster file): where a
            // job's own processes on different nodes can meet (storm-bench fabric).
            (
                "STORM_NODE_ADDR",
                self.cfg.nodes[self.node as usize].address.ip().to_string(),
            ),
            ("STORM_LOCAL_RANK", local_rank.to_string()),
            ("STORM_LOCAL_SIZE", local_size.to_string()),
            ("STORM_NNODES", spec.nodes.len().to_string()),
            ("STORM_NODELIST", spec.nodes.to_string()),
            // Where storm-submit inside the job finds the MM (for steps): the node's control
            // relay, where the cluster has one.
            (
                "STORM_SOCKET",
                match self.cfg.relay.address {
                    Some(_) => self.cfg.relay.socket_of(&name).display().to_string(),
                    None => self.cfg.cluster.control_socket.display().to_string(),
                },
            ),
            // The tasks of the job's allocation: a step's default (a batch script's own
            // STORM_SIZE is 1).
            (
                "STORM_NTASKS",
                spec.batch
                    .as_ref()
                    .map_or(spec.ntasks, |b| b.alloc_tasks)
                    .to_string(),
            ),
        ];
        // The submitter's umask (`STORM_UMASK`, set by storm-submit and storm batch; the
        // launcher applies it to the task), kept if it is one.
        if let Some((_, v)) = spec.env.iter().rev().find(|(k, _)| k == "STORM_UMASK")
            && let Some(mask) = v
                .to_str()
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
                .filter(|m| *m <= 0o777)
        {
            ours.push(("STORM_UMASK", format!("{mask:04o}")));
        }
        // `--cpu-bind`: the mode and, for a bound rank, its CPUs, which the launcher
        // applies before the program runs.
        let (bind, cpus) = self.cpu_binding(spec, local_rank, local_size);
        ours.push((cpu_bind::MODE_VAR, bind.name().to_string()));
        if let Some(cpus) = cpus {
            ours.push((cpu_bind::LIST_VAR, cpu_bind::format_list(&cpus)));
        }
        // The user's variables with these prefixes are replaced by ours.
        let mut ours_prefixes = vec!["STORM_"];
        // An element of a job array, as Slurm's SLURM_ARRAY_* say it.
        if let Some((array, index, count)) = spec.batch.as_ref().and_then(|b| b.array) {
            ours.extend([
                ("STORM_ARRAY_JOB_ID", array.to_string()),
                ("STORM_ARRAY_TASK_ID", index.to_string()),
                ("STORM_ARRAY_TASK_COUNT", count.to_string()),
            ]);
        }
        if spec.mpi != MpiMode::None {
            // The PMI server's socket (see `pmi`), as MPICH's and Slurm's launchers set it;
            // and the node's PMIx server's variables, added by the PMI server.
            ours_prefixes.push("PMI_");
            ours_prefixes.push("PMIX_");
            ours.extend([
                ("PMI_FD", crate::pmi::PMI_FD.to_string()),
                ("PMI_RANK", rank.to_string()),
                ("PMI_SIZE", spec.ntasks.to_string()),
                ("PMI_JOBID", format!("storm-{}", spec.job)),
            ]);
        }
        if serves_open_mpi(spec) {
            // Open MPI 4's `flux` component is chosen when FLUX_JOB_ID is set, and loads the
            // PMI-1 library named here (docs/mpi.md).
            ours_prefixes.push("FLUX_");
            ours.extend([
                ("FLUX_JOB_ID", spec.job.to_string()),
                (
                    "FLUX_PMI_LIBRARY_PATH",
                    self.pmi_library.display().to_string(),
                ),
            ]);
        }
        // What Open MPI reads, unless the user set it: its shared-memory segments and
        // session files in the job's own scratch directory (two nodes of one host, or two
        // jobs, never share them; storm removes it with the job), and, on a node running
        // more of the job's ranks than it has CPUs or time-sharing them under gang
        // scheduling, to yield when idle rather than spin, as mpirun tells it
        // (docs/mpi.md).
        let mut defaults: Vec<(&str, String)> = Vec::new();
        if serves_open_mpi(spec) {
            if let Some(dir) = scratch {
                let dir = dir.display().to_string();
                defaults.push(("OMPI_MCA_btl_vader_backing_directory", dir.clone()));
                defaults.push(("OMPI_MCA_orte_tmpdir_base", dir));
            }
            // Open MPI 4 keeps to its flux component where PMIx is served too (its PMIx
            // components would take the PMIx variables); Open MPI 5 has no such component
            // and speaks PMIx.
            defaults.push(("OMPI_MCA_pmix", "flux".into()));
            let cpus = self.cfg.nodes[self.node as usize].cpus;
            let shared =
                self.cfg.scheduler.policy == PolicyKind::Gang && self.cfg.scheduler.mpl > 1;
            if local_size > cpus || shared {
                defaults.push(("OMPI_MCA_mpi_yield_when_idle", "1".into()));
                defaults.push(("OMPI_MCA_mpi_oversubscribe", "1".into()));
            }
        }
        let set_by_user = |k: &str| spec.env.iter().any(|(x, _)| x.as_bytes() == k.as_bytes());
        ours.extend(defaults.into_iter().filter(|(k, _)| !set_by_user(k)));
        let theirs = |k: &OsString| {
            !ours_prefixes
                .iter()
                .any(|p| k.as_bytes().starts_with(p.as_bytes()))
        };
        spec.env
            .iter()
            .filter(|(k, _)| theirs(k))
            .cloned()
            .chain(ours.into_iter().map(|(k, v)| (k.into(), v.into())))
            .collect()
    }
}

/// Whether job `spec`'s tasks get what Open MPI 4 needs (storm's PMI library through its
/// `flux` component, and a scratch directory of the job's own on each node): asked for by
/// name (`--mpi openmpi`), or by default (`--mpi auto`) for a job of more than one rank (one
/// rank is a world of one either way, and a plain job costs no directory).
pub(super) fn serves_open_mpi(spec: &LaunchSpec) -> bool {
    match spec.mpi {
        MpiMode::OpenMpi => true,
        MpiMode::Auto => spec.ntasks > 1,
        _ => false,
    }
}
