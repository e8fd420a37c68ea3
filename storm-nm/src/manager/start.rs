//! Starting a job's local ranks: each through the node's launcher, with its PMI socket, its
//! output streams and its input; a rank that cannot start ends at once with the reason on its
//! standard error.

use super::task_env::serves_open_mpi;
use super::*;

impl<E: NmEnv> NodeManager<E> {
    pub(super) fn spawn_job(&mut self, spec: LaunchSpec) {
        let Some(k) = spec.nodes.rank(self.node) else {
            return;
        };
        let (first, count) = ranks_on(spec.ntasks, spec.nodes.len() as u32, k as u32);
        let program = match &spec.program {
            Program::Spooled(name) => {
                // Only the file the MM sent, as its sealed launch names it by hash.
                if let Err(why) = self.env.spool().verify(spec.job, spec.program_hash) {
                    let ranks = (first..first + count)
                        .map(|rank| self.failed_rank(&spec, rank, &why))
                        .collect();
                    self.jobs
                        .insert(spec.job, LocalJob::new(spec, ranks, true, self.heard_ns));
                    return;
                }
                self.env.spool().job_dir(spec.job).join(name)
            }
            Program::Path(p) => p.clone(),
        };
        let ranks: Vec<u32> = (first..first + count).collect();
        // Jobs Open MPI may run in: a scratch directory of their own on this node.
        let scratch = serves_open_mpi(&spec)
            .then(|| self.env.spool().scratch_dir(spec.job, spec.uid, spec.gid))
            .flatten();
        // MPI jobs: the PMI server serves them from before they start.
        let pmi = if spec.mpi == MpiMode::None {
            Ok(crate::env::PmiStart::default())
        } else {
            let nnodes = spec.nodes.len() as u32;
            let facts = JobFacts {
                job: spec.job,
                size: spec.ntasks,
                mapping: process_mapping(spec.ntasks, nnodes),
                v1: spec.mpi.serves_v1(),
                v2: spec.mpi.serves_v2(),
                node_bytes: self.rm.pmi_node_bytes,
                job_bytes: self.rm.pmi_job_bytes,
                nodes: spec
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        let (first, count) = ranks_on(spec.ntasks, nnodes, i as u32);
                        let name = self
                            .cfg
                            .nodes
                            .get(n as usize)
                            .map_or_else(|| format!("node{n}"), |e| e.name.clone());
                        (name, (first..first + count).collect())
                    })
                    .collect(),
                node: k,
                owner: (spec.uid, spec.gid),
            };
            self.env
                .pmi()
                .start_job(spec.slot as usize, spec.mpi, facts, &ranks)
        };
        let prepared_ns = self.env.stamp_ns();
        let mut started = Vec::new();
        for (local, &rank) in ranks.iter().enumerate() {
            let r = match &pmi {
                Ok(started) => {
                    // The task's end is closed here once the launcher has it: the PMI server
                    // sees end of file when the task is gone (the launcher closes its copy
                    // once the task has started).
                    let end = started.ends.get(local).and_then(Option::as_ref);
                    let pmix = started.env.get(local).map_or(&[][..], Vec::as_slice);
                    let at = (local as u32, count);
                    self.start_rank(&spec, &program, rank, at, (end, pmix), scratch.as_deref())
                }
                Err(why) => self.failed_rank(&spec, rank, why),
            };
            started.push(r);
        }
        tracing::info!(node = self.node, job = spec.job, ranks = count, "launched");
        let mut job = LocalJob::new(spec, started, false, self.heard_ns);
        job.stamps = LaunchStamps {
            verified_ns: Some(self.verified_ns),
            prepared_ns: Some(prepared_ns),
            asked_ns: Some(self.env.stamp_ns()),
        };
        self.jobs.insert(job.spec.job, job);
    }

    /// A job whose tasks never started on this node: report them with `status`.
    pub(super) fn record_unstarted(&mut self, spec: LaunchSpec, status: RankStatus) {
        let Some(k) = spec.nodes.rank(self.node) else {
            return;
        };
        let (first, count) = ranks_on(spec.ntasks, spec.nodes.len() as u32, k as u32);
        let ranks = (first..first + count)
            .map(|rank| LocalRank::unstarted(rank, status))
            .collect();
        let job = LocalJob::new(spec, ranks, true, self.heard_ns);
        self.jobs.insert(job.spec.job, job);
    }

    pub(super) fn start_rank(
        &mut self,
        spec: &LaunchSpec,
        program: &std::path::Path,
        rank: u32,
        (local, count): (u32, u32),
        (pmi, pmix_env): (Option<&std::os::fd::OwnedFd>, &[(OsString, OsString)]),
        scratch: Option<&std::path::Path>,
    ) -> LocalRank {
        let name = &self.cfg.nodes[self.node as usize].name;
        let array = spec
            .batch
            .as_ref()
            .and_then(|b| b.array)
            .map(|(a, i, _)| (a, i));
        let file =
            |pattern: &str| expand_output_pattern(pattern, spec.job, array, name, rank).into();
        let files = spec.batch.as_ref().map(|b| &b.files);
        let output_file = files.map(|f| file(&f.output));
        let error_file = files
            .and_then(|f| f.error.as_deref())
            .map(file)
            .filter(|e| Some(e) != output_file.as_ref());
        let task = TaskStart {
            job: spec.job,
            rank,
            program,
            args: &spec.args,
            env: {
                let mut env = self.task_env(spec, rank, (local, count), scratch);
                env.extend(pmix_env.iter().cloned());
                env
            },
            cwd: &spec.cwd,
            uid: spec.uid,
            gid: spec.gid,
            pmi,
            output_file,
            error_file,
            stdin: spec.input.includes(rank),
            mem: spec.mem,
        };
        match self.env.tasks().start(task) {
            Ok(started) => {
                let output: Drained = Arc::new(AtomicU32::new(started.output.len() as u32));
                for (stream, source) in started.output {
                    self.env
                        .output()
                        .watch(spec.job, rank, stream, source, output.clone());
                }
                if let Some(pipe) = started.input {
                    self.env.output().feed(spec.job, rank, pipe);
                }
                // Once per node, on its first rank's standard error.
                if let Some(notice) = started.notice.filter(|_| local == 0) {
                    let text = format!("storm: node {name}: {notice}\n");
                    self.env
                        .output()
                        .tell(spec.job, rank, Stream::Notice, &text, &output);
                }
                LocalRank {
                    rank,
                    task: Some(started.id),
                    status: None,
                    output,
                    stopped: false,
                    mpi: Default::default(),
                }
            }
            Err(why) => self.failed_rank(spec, rank, &why),
        }
    }

    /// A task that could not start: it ends with 127, and the user learns why on its
    /// standard error.
    pub(super) fn failed_rank(&mut self, spec: &LaunchSpec, rank: u32, why: &str) -> LocalRank {
        tracing::error!(node = self.node, job = spec.job, rank, "{why}");
        let r = LocalRank::unstarted(rank, RankStatus::Exited(127));
        let text = format!("storm-nm: rank {rank} on node {}: {why}\n", self.node);
        self.env
            .output()
            .tell(spec.job, rank, Stream::Stderr, &text, &r.output);
        r
    }
}
