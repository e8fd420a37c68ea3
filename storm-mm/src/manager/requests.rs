//! Requests from storm-submit and the other clients: who may ask what, submissions, and
//! replies to clients that read them too slowly. The limits a submission must fit are in
//! `limits`, where a job can run in `fit`, what `storm queue` and `storm nodes` are told in
//! `answers`.

use std::collections::VecDeque;

use anyhow::Result;
use storm_cluster::control::{self, ArrayElement, JobRef, JobRequest, Reply, Request};
use storm_cluster::messages::{Command, InputTarget, JobId, MAX_LAUNCH_BYTES, encode};
use storm_primitives::NodeSet;

use crate::env::{ClientId, Input, MmEnv, SubmittedProgram};

use super::{Job, MachineManager, NewJob, finished_info, launch_spec};

pub(super) struct Client {
    pub(super) uid: u32,
    pub(super) gid: u32,
    /// The node whose control relay vouched for the user, if one did.
    pub(super) relayed_from: Option<String>,
    /// Replies queued for this client so far (the outbox numbers them in order; the
    /// environment counts those written, `MmEnv::replies_written`).
    pub(super) queued: u64,
    /// Its replies other than output that may not be written yet, by number, with their size
    /// (output is flow-controlled end to end, see `output`; these are bounded by
    /// `[limits] max_unread_reply_bytes`).
    pub(super) unread: VecDeque<(u64, u64)>,
    /// The bytes of the replies in `unread`.
    pub(super) unread_bytes: u64,
}

impl<E: MmEnv> MachineManager<E> {
    /// Queues a reply; it is sent at the end of the timeslice, once the journal holds what
    /// it tells. Returns its number among the replies to this client (it is written to the
    /// client's socket once the client's `written` count reaches it), or `None` if the client
    /// is gone.
    pub(super) fn reply(&mut self, client: ClientId, r: Reply) -> Option<u64> {
        let written = self.env.replies_written(client);
        let c = self.outbox.clients.get_mut(&client)?;
        c.queued += 1;
        let n = c.queued;
        if !matches!(r, Reply::Output(_)) {
            while let Some(&(k, bytes)) = c.unread.front()
                && k <= written
            {
                c.unread.pop_front();
                c.unread_bytes -= bytes;
            }
            let bytes = control::encoded_len(&r) as u64;
            c.unread.push_back((n, bytes));
            c.unread_bytes += bytes;
            if c.unread_bytes > self.cfg.limits.max_unread_reply_bytes {
                self.drop_unreading_client(client);
                return None;
            }
        }
        self.outbox.replies.push((client, r, None));
        Some(n)
    }

    /// Lets go of a program that came with a request the core will not keep it for.
    fn release_submitted(&mut self, program: Option<Result<SubmittedProgram, String>>) {
        if let Some(Ok(p)) = program {
            self.env.release_program(p.id);
        }
    }

    /// Disconnects a client that leaves more than `[limits] max_unread_reply_bytes` of
    /// replies unread (it asks without reading the answers). Its jobs go on without it: their output
    /// is dropped, and their state stays in `storm queue`.
    pub(super) fn drop_unreading_client(&mut self, client: ClientId) {
        let Some(c) = self.outbox.clients.remove(&client) else {
            return;
        };
        let mut detached = 0;
        for j in self.jobs.values_mut().filter(|j| j.client == Some(client)) {
            j.client = None;
            detached += 1;
        }
        tracing::warn!(
            client,
            uid = c.uid,
            detached,
            "disconnecting a control client that left {} replies ({} bytes) unread ([limits] \
             max_unread_reply_bytes = {}); its jobs go on without it",
            c.unread.len(),
            c.unread_bytes,
            self.cfg.limits.max_unread_reply_bytes
        );
        self.env.hang_up(client);
    }

    /// Takes an input: a client came, asked something or went; a transfer or a program copy
    /// ended; a node announced a termination. Replies go out at the end of the next
    /// timeslice, once the journal holds what they tell; the other inputs are taken up where
    /// the timeslice (or [`MachineManager::between_ticks`]) looks for them.
    pub fn handle(&mut self, input: Input) {
        self.back_to_cadence();
        match input {
            Input::Connected {
                client,
                uid,
                gid,
                relayed_from,
            } => {
                self.outbox.clients.insert(
                    client,
                    Client {
                        uid,
                        gid,
                        relayed_from,
                        queued: 0,
                        unread: VecDeque::new(),
                        unread_bytes: 0,
                    },
                );
            }
            Input::Gone { client } => {
                let Some(gone) = self.outbox.clients.remove(&client) else {
                    return;
                };
                // A batch job goes on without its submitter (which leaves once the job is
                // accepted); any other job ends with it, as srun's does. A job followed by
                // another user than its owner (root, or the peer agent that submitted a job
                // flocked here) goes on too: only its owner's leaving ends it.
                for j in self.jobs.values_mut().filter(|j| {
                    j.client == Some(client) && (j.req.batch.is_some() || j.uid != gone.uid)
                }) {
                    j.client = None;
                }
                let orphans: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.client == Some(client))
                    .map(|j| j.id)
                    .collect();
                for job in orphans {
                    self.cancel(job, "storm-submit went away".into());
                }
            }
            Input::Request {
                client,
                req,
                program,
            } => self.request(client, req, program),
            Input::TransferDone(done) => self.transfers.finished.push(done),
            Input::ProgramSaved { job, result } => self.outbox.saved_programs.push((job, result)),
            Input::TerminationSignalled => self.term_announced = true,
            Input::Persisted(settled) => self.outbox.journal.persisted(settled),
        }
    }

    pub(super) fn request(
        &mut self,
        client: ClientId,
        req: Request,
        program: Option<Result<SubmittedProgram, String>>,
    ) {
        let Some(uid) = self.outbox.clients.get(&client).map(|c| c.uid) else {
            self.release_submitted(program);
            return;
        };
        // Only a submission takes a program; the core holds it no longer than it needs it.
        let program = match req {
            Request::Submit(_) => program,
            _ => {
                self.release_submitted(program);
                None
            }
        };
        // The same submission sent again, after its submitter lost the MM before the answer
        // (this MM restarted, or leads the group now): it follows the job it made.
        if let Request::Submit(job) = &req
            && let Some(id) = job.token.and_then(|t| self.submission(uid, t))
        {
            self.release_submitted(program);
            tracing::info!(
                job = id,
                uid,
                "a submission sent again: its submitter follows the job it made"
            );
            self.follow_again(client, uid, id);
            return;
        }
        match req {
            Request::Hello { .. } | Request::RelayHello { .. } => {
                self.reply(client, Reply::Error("already connected".into()));
            }
            // Accepted is sent after the next scheduling decision, saying why the job waits.
            Request::Submit(job) => {
                let held = program.as_ref().and_then(|p| p.as_ref().ok()).map(|p| p.id);
                let submitted = self.submit(client, *job, program);
                // A job that holds its program lets go of it later; any other lets go now.
                let kept = submitted
                    .as_ref()
                    .ok()
                    .and_then(|id| self.jobs.get(id))
                    .and_then(|j| j.program);
                if let Some(p) = held
                    && kept != Some(p)
                {
                    self.env.release_program(p);
                }
                if let Err(e) = submitted {
                    self.reply(client, Reply::Error(e));
                }
            }
            Request::Cancel { job } => {
                let reply = self.cancel_request(client, uid, JobRef::Id(job));
                self.reply(client, reply.map_or_else(Reply::Error, |()| Reply::Done));
            }
            Request::CancelElement { array, index } => {
                let reply = self.cancel_request(client, uid, JobRef::Element { array, index });
                self.reply(client, reply.map_or_else(Reply::Error, |()| Reply::Done));
            }
            Request::Queue => {
                let list = self.jobs.values().map(|j| self.job_info(j)).collect();
                self.reply(client, Reply::Queue(list));
            }
            Request::History => {
                let list = self.finished.records().filter_map(finished_info).collect();
                self.reply(client, Reply::History(list));
            }
            Request::Attach { job } => self.attach(client, uid, job),
            Request::Input {
                job,
                offset,
                data,
                eof,
            } => {
                if let Err(e) = self.input(client, job, offset, data, eof) {
                    self.reply(client, Reply::Error(e));
                }
            }
            Request::Metrics => {
                let text = self.metrics_text();
                self.reply(client, Reply::Metrics(text));
            }
            Request::Nodes => {
                let list = self.node_infos();
                self.reply(client, Reply::Nodes(list));
            }
            Request::NodeHistory { nodes, window_ms } => {
                let reply = match self.node_traces(&nodes, window_ms) {
                    Ok(traces) => Reply::NodeHistory(traces),
                    Err(e) => Reply::Error(e),
                };
                self.reply(client, reply);
            }
            Request::PeerReport(peers) => {
                let reply = self
                    .operator(client, uid, "report the peer clusters")
                    .map(|()| {
                        self.peer_report(peers);
                        Reply::Done
                    });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::FlockOut => {
                let reply = self
                    .operator(client, uid, "take the flocked jobs")
                    .map(|()| Reply::FlockOut(self.flock_orders()));
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::FlockReport(updates) => {
                let reply = self
                    .operator(client, uid, "report flocked jobs")
                    .map(|()| Reply::FlockTaken(self.flock_report(updates)));
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::SubmitFlocked {
                origin,
                uid: as_uid,
                gid: as_gid,
                req,
            } => {
                if let Err(e) = self.operator(client, uid, "submit a job flocked from a peer") {
                    self.reply(client, Reply::Error(e));
                    return;
                }
                // Sent again (the agent lost this MM, or restarted): it follows the job it
                // made, as a resubmitting storm-submit does.
                if let Some(id) = req.token.and_then(|t| self.submission(as_uid, t)) {
                    match self.given_up_reason(id) {
                        Some(why) => {
                            self.reply(client, Reply::Error(why));
                        }
                        None => self.follow_again(client, uid, id),
                    }
                    return;
                }
                let submitted = self.submit_flocked(client, &origin, (as_uid, as_gid), *req, None);
                if let Err(e) = submitted {
                    self.reply(client, Reply::Error(e));
                }
            }
            Request::Peers => {
                let now = self.now();
                let reply = match &self.peers {
                    Some((at, peers)) => Reply::Peers {
                        peers: peers.clone(),
                        reported_ms_ago: Some(now.saturating_duration_since(*at).as_millis() as u64),
                    },
                    None => Reply::Peers {
                        peers: Vec::new(),
                        reported_ms_ago: None,
                    },
                };
                self.reply(client, reply);
            }
            Request::Managers => {
                let list = self.env.managers();
                self.reply(client, Reply::Managers(list));
            }
            Request::RemoveManager { name } => {
                let reply = self
                    .operator(client, uid, "remove a manager replica")
                    .and_then(|()| self.env.remove_manager(&name).map(Reply::Notice));
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Drain { nodes, reason } => {
                let reply = self.operator(client, uid, "drain nodes").and_then(|()| {
                    self.drain(&nodes, reason)?;
                    Ok(Reply::Done)
                });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Lend {
                nodes,
                peer,
                for_ms,
            } => {
                let reply = self.operator(client, uid, "lend nodes").and_then(|()| {
                    let span = std::time::Duration::from_millis(for_ms);
                    let until = self.lend(&nodes, &peer, span)?;
                    Ok(Reply::Notice(format!(
                        "lent {} node(s) to {peer} until {}",
                        nodes.len(),
                        storm_cluster::clock::format_unix_ms(until)
                    )))
                });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Reclaim { nodes, now } => {
                let reply = self.operator(client, uid, "reclaim nodes").and_then(|()| {
                    let (lent, home) = self.reclaim(&nodes, now)?;
                    Ok(Reply::Notice(if home == lent {
                        format!("{lent} lent node(s) home now")
                    } else {
                        format!(
                            "{lent} lent node(s) called home: {home} home now, the others once \
                             their borrower gives them back (it was told why), within {} ms",
                            self.cfg.federation.vacate_ms
                        )
                    }))
                });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Recalls => {
                let reply = self
                    .operator(client, uid, "take the nodes this cluster calls home")
                    .map(|()| Reply::Recalls(self.recalls()));
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Recalled { peer, nodes } => {
                let reply = self
                    .operator(client, uid, "pass on the nodes a lender calls home")
                    .map(|()| {
                        self.recalled(&peer, &nodes);
                        Reply::Done
                    });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::BorrowOut { lent } => {
                let reply = self
                    .operator(client, uid, "take what this cluster would borrow")
                    .map(|()| {
                        self.lenders_answered(lent);
                        Reply::BorrowOut(self.borrow_orders())
                    });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::LendAsked {
                peer,
                nodes,
                count,
                for_ms,
            } => {
                let reply = self
                    .operator(client, uid, "lend nodes a peer asked for")
                    .and_then(|()| self.lend_asked(&peer, &nodes, count, for_ms))
                    .map(Reply::Lent);
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::GiveBack { peer, nodes } => {
                let reply = self
                    .operator(client, uid, "give back borrowed nodes")
                    .map(|()| {
                        self.give_back(&peer, &nodes);
                        Reply::Done
                    });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Resume { nodes } => {
                let reply = self.operator(client, uid, "resume nodes").and_then(|()| {
                    self.resume(&nodes)?;
                    Ok(Reply::Done)
                });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Shutdown => {
                if let Err(e) = self.operator(client, uid, "shut the cluster down") {
                    self.reply(client, Reply::Error(e));
                    return;
                }
                for job in self.jobs.keys().copied().collect::<Vec<_>>() {
                    self.cancel(job, "the cluster is shutting down".into());
                }
                self.hb.commands.push_back(Command::Shutdown);
                self.shutting_down = true;
                self.reply(client, Reply::Done);
            }
        }
    }

    /// A submission sent again finds job `id` made by its first sending: `client` (of user
    /// `uid`) is answered as the first sending would have been (`attach` says so of a job
    /// that has not ended), then follows it.
    fn follow_again(&mut self, client: ClientId, uid: u32, id: JobId) {
        if self.finished.get(&id).is_some() {
            self.reply(
                client,
                Reply::Accepted {
                    job: id,
                    queued: None,
                },
            );
        }
        self.attach(client, uid, id);
    }

    /// `storm cancel`: a job, every element of an array that has not ended (by the array's
    /// id), or one element (`12_3`); by its owner, or root.
    fn cancel_request(&mut self, client: ClientId, uid: u32, named: JobRef) -> Result<(), String> {
        let targets: Vec<JobId> = match named {
            JobRef::Element { array, index } => {
                let id = self
                    .jobs
                    .values()
                    .find(|j| j.req.element.is_some_and(|e| e.array == array && e.index == index))
                    .map(|j| j.id)
                    .ok_or_else(|| {
                        format!("no element {index} of array job {array} is waiting or running (it may have finished already)")
                    })?;
                vec![id]
            }
            JobRef::Id(id) => {
                let elements: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.req.element.is_some_and(|e| e.array == id))
                    .map(|j| j.id)
                    .collect();
                if elements.is_empty() {
                    if !self.jobs.contains_key(&id) {
                        return Err(format!("no job {id} (it may have finished already)"));
                    }
                    vec![id]
                } else {
                    elements
                }
            }
        };
        // One owner for them all: an array's elements are one user's.
        let owner = self.jobs[&targets[0]].uid;
        let root = uid == 0 && self.root_rights(client).is_ok();
        if !root && uid != owner {
            let why = self
                .root_rights(client)
                .err()
                .filter(|_| uid == 0)
                .map_or(String::new(), |why| format!(" ({why})"));
            return Err(format!(
                "job {named} belongs to uid {owner}; only its owner or root may cancel it{why}"
            ));
        }
        for job in targets {
            self.cancel(job, format!("cancelled by uid {uid}"));
        }
        Ok(())
    }

    /// Whether `uid` may act on the cluster as an operator: root or the MM's own user, on
    /// the MM's host (or through a node's relay, where `[relay] root_from_nodes` allows).
    pub(super) fn operator(&self, client: ClientId, uid: u32, what: &str) -> Result<(), String> {
        let me = self.env.operator_uid();
        if uid != 0 && uid != me {
            return Err(format!("only root or the MM's own user may {what}"));
        }
        self.root_rights(client)
            .map_err(|why| format!("{why}: it may not {what}"))
    }

    /// Whether a client that is root or the MM's own user has their rights over the whole
    /// cluster: always on the MM's host; through a node's control relay only with `[relay]
    /// root_from_nodes`, since root of one node is not root of the cluster.
    pub(super) fn root_rights(&self, client: ClientId) -> Result<(), String> {
        match self
            .outbox
            .clients
            .get(&client)
            .and_then(|c| c.relayed_from.as_ref())
        {
            Some(node) if !self.cfg.relay.root_from_nodes => Err(format!(
                "root of node {node} is not root of the cluster through its control relay \
                 (run this on the machine manager's host, or set [relay] root_from_nodes = \
                 true)"
            )),
            _ => Ok(()),
        }
    }

    /// The job (live or kept in the history) that user `uid`'s submission with `token` made.
    fn submission(&self, uid: u32, token: u64) -> Option<JobId> {
        self.submissions
            .get(&(uid, token))
            .copied()
            .or_else(|| self.finished.submission(uid, token))
    }

    pub(super) fn submit(
        &mut self,
        client: ClientId,
        req: JobRequest,
        program: Option<Result<SubmittedProgram, String>>,
    ) -> Result<JobId, String> {
        let owner = self
            .outbox
            .clients
            .get(&client)
            .map(|c| (c.uid, c.gid))
            .ok_or("unknown client")?;
        if let Some(peer) = req.flock.flocked_from() {
            return Err(format!(
                "only this cluster's peer agent submits a job flocked from {peer}"
            ));
        }
        // A peer's jobs run here as its account: what they submit is no job of this
        // cluster's (it would outlive its peer's job, and be nobody's). Their steps are
        // steps of the peer's job, and end with it.
        if req.step_of.is_none()
            && let Some(peer) = self.env.peer_account(owner.0)
        {
            return Err(format!(
                "uid {} is the account peer cluster {peer}'s jobs run as here ([[peer]] \
                 flock_user): it submits no jobs of its own (a job flocked or lent here runs \
                 its steps within its own allocation)",
                owner.0
            ));
        }
        self.submit_as(client, owner, req, program)
    }

    /// [`MachineManager::submit`] for user `uid`/`gid`, whom `client` follows the job for.
    pub(super) fn submit_as(
        &mut self,
        client: ClientId,
        (uid, gid): (u32, u32),
        mut req: JobRequest,
        program: Option<Result<SubmittedProgram, String>>,
    ) -> Result<JobId, String> {
        if self.shutting_down {
            return Err("the cluster is shutting down".into());
        }
        if uid == 0 && !self.cfg.security.allow_root_jobs {
            return Err(
                "root may not run jobs on this cluster ([security] allow_root_jobs = false); \
                 submit as another user"
                    .into(),
            );
        }
        // Root (or the MM's user) of a node runs steps in its own allocations there, but no
        // new job across the cluster.
        let me = self.env.operator_uid();
        let root = if uid == 0 || uid == me {
            let rights = self.root_rights(client);
            if req.step_of.is_none()
                && let Err(why) = rights
            {
                return Err(format!(
                    "{why}: it may run steps of its own jobs, not new jobs"
                ));
            }
            rights.is_ok()
        } else {
            false
        };
        self.check_request_sizes(&req)?;
        self.shrink_to_cluster(&mut req);
        let plan = self.plan(&req)?;
        self.check_clusters(&req, plan.nodes)?;
        if req.flock.may_run_at_home(&self.cfg.cluster.name) {
            self.check_fit(&req, &plan)?;
        }
        if let InputTarget::Rank(rank) = req.input {
            let ntasks = super::job::tasks_launched(&req, &plan);
            if rank >= ntasks {
                return Err(format!(
                    "-i {rank}: the job has {ntasks} tasks (ranks 0 to {})",
                    ntasks - 1
                ));
            }
        }
        self.check_step(uid, root, &mut req, &plan)?;
        let indices = self.check_array(&mut req)?;
        let count = indices.as_ref().map_or(1, Vec::len);
        if let Some(dep) = req.dependency.take() {
            req.dependency = Some(self.expand_arrays(dep)?);
        }
        if !req.cwd.is_absolute() || !req.program.is_absolute() {
            return Err("program and working directory must be absolute paths".into());
        }
        let program = if req.delivery.carries_program() {
            let p = program
                .ok_or("the program's descriptor did not arrive with the request")?
                .map_err(|e| format!("cannot inspect the program: {e}"))?;
            if !p.regular {
                return Err(format!("{} is not a regular file", req.program.display()));
            }
            // A batch script is run by its interpreter line; its copy on the node is the
            // user's, mode 0700.
            if p.mode & 0o111 == 0 && req.batch.is_none() {
                return Err(format!("{} is not executable", req.program.display()));
            }
            // Each element of an array holds a copy.
            self.check_program_limits(uid, &req.program, p.len * count as u64)?;
            Some((p.id, p.len, p.stamp))
        } else {
            None
        };
        let (program, size, stamp) =
            program.map_or((None, 0, None), |(p, n, s)| (Some(p), n, Some(s)));
        self.check_queue_limit(uid, count)?;
        self.check_held_request_bytes(uid, &req, count)?;
        // The id is spent only by a job that is accepted.
        let id = self.next_job;
        let launch_probe = launch_spec(
            id,
            0,
            &req,
            &plan,
            &NodeSet::first_n(plan.nodes),
            (uid, gid),
            self.cfg.capacity().cpus_per_node,
        );
        // A launch too large for one heartbeat goes in pieces, up to what a node assembles.
        if let Err(e) = encode("launch", &launch_probe, MAX_LAUNCH_BYTES) {
            return Err(format!(
                "the job's launch is too large ({e}): pass fewer or shorter arguments or \
                 variables (--export)"
            ));
        }
        let new = |id: JobId, req: JobRequest| {
            Job::queued(NewJob {
                id,
                uid,
                gid,
                req,
                plan,
                program,
                size,
                stamp,
                client: Some(client),
                submitted: self.now(),
                submitted_ms: self.unix_ms(),
            })
        };
        // An array's elements: consecutive ids from the array's, one job each, sharing the
        // submitted program (each makes its copy beside the journal).
        let jobs: Vec<Job> = match &indices {
            None => vec![new(id, req)],
            Some(indices) => indices
                .iter()
                .zip(id..)
                .map(|(&index, job)| {
                    let mut r = req.clone();
                    r.array = None;
                    r.element = Some(ArrayElement {
                        array: id,
                        index,
                        count: count as u32,
                        throttle: req.array.as_ref().and_then(|a| a.throttle),
                    });
                    new(job, r)
                })
                .collect(),
        };
        self.check_dependency(&jobs[0])?;
        self.next_job += jobs.len() as JobId;
        self.outbox.journal.set_next_job(self.next_job);
        if let Some(p) = program {
            self.hold_program(p, jobs.len());
        }
        for job in jobs {
            let jid = job.id;
            // Held (a dependency, a throttle): looked at again at the next timeslice.
            self.queue_changed |= job.req.dependency.is_some() || job.req.element.is_some();
            self.add_job(job);
            // While jobs restored after a restart are held, new ones queue behind them (they
            // enter the policy together, in order, when the hold ends).
            self.admit_job(jid);
            self.outbox.unrecorded.insert(jid);
            self.metrics.job_submitted();
        }
        self.outbox.unanswered.push((client, id));
        tracing::info!(
            job = id,
            uid,
            nodes = plan.nodes,
            tasks = plan.ntasks,
            elements = indices.map(|i| i.len()),
            "job accepted"
        );
        Ok(id)
    }
}
