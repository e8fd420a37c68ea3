//! Requests from storm-submit and the other clients: who may ask what, the limits a submission
//! must fit, the answers (`storm queue`, `storm nodes`, metrics), and replies to clients that
//! read them too slowly.

use std::collections::VecDeque;
use std::path::Path;

use anyhow::Result;
use storm_cluster::control::{
    self, ArrayElement, JobInfo, JobRef, JobRequest, JobState, NodeInfo, Reply, Request,
};
use storm_cluster::messages::{Command, InputTarget, JobId, JobUsage, MAX_LAUNCH_BYTES, encode};
use storm_cluster::sample::{NodeInventory, NodeRecords, NodeSample, NodeTrace};
use storm_cluster::tasks::TaskPlan;
use storm_cluster::usage::NodeUsage;
use storm_primitives::{NodeId, NodeSet};

use crate::env::{ClientId, Input, MmEnv, SubmittedProgram};
use crate::policy::JobAsk;

use super::records::read_twice;
use super::{Job, MachineManager, NewJob, Phase, finished_info, job_ask, launch_spec, restart};

/// Samples one history answer holds at most (a point is about 20 bytes in a reply frame of
/// 16 MiB).
const MAX_HISTORY_POINTS: usize = 500_000;

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

    /// `[limits] max_program_bytes` and `max_spooled_bytes_per_user` for a program of
    /// `size` bytes that user `uid` sends with a new job.
    pub(super) fn check_program_limits(
        &self,
        uid: u32,
        program: &Path,
        size: u64,
    ) -> Result<(), String> {
        let l = &self.cfg.limits;
        if size > l.max_program_bytes {
            return Err(format!(
                "{} is {size} bytes, over the limit for a program sent with its job ([limits] \
                 max_program_bytes = {}); put it where every node can read it and submit with \
                 --no-bcast",
                program.display(),
                l.max_program_bytes
            ));
        }
        let held: u64 = self
            .jobs
            .values()
            .filter(|j| j.uid == uid && j.req.delivery.carries_program())
            .map(|j| j.size)
            .sum();
        if held + size > l.max_spooled_bytes_per_user {
            return Err(format!(
                "the machine manager already holds {held} bytes of programs for user {uid}'s \
                 unfinished jobs; {size} more would pass the limit ([limits] \
                 max_spooled_bytes_per_user = {}); wait for some jobs to finish",
                l.max_spooled_bytes_per_user
            ));
        }
        Ok(())
    }

    /// `[limits] max_job_name_bytes` and `max_argument_bytes` for a new job's request.
    pub(super) fn check_request_sizes(&self, req: &JobRequest) -> Result<(), String> {
        let l = &self.cfg.limits;
        if req.name.len() > l.max_job_name_bytes as usize {
            return Err(format!(
                "the job's name is {} bytes, over the limit ([limits] max_job_name_bytes = {}); \
                 give a shorter one with -J",
                req.name.len(),
                l.max_job_name_bytes
            ));
        }
        let args = argument_bytes(req);
        if args as u64 > l.max_argument_bytes {
            return Err(format!(
                "the job's arguments and environment are {args} bytes, over the cluster's limit \
                 of {} ([limits] max_argument_bytes in the cluster file raises it, up to the \
                 kernel's ARG_MAX on the nodes: `getconf ARG_MAX`); pass fewer variables with \
                 --export",
                l.max_argument_bytes
            ));
        }
        Ok(())
    }

    /// A job array's request (`--array`): a batch job within `[limits] max_array_size`; its
    /// indices, or `None` for a job that is not an array.
    pub(super) fn check_array(&self, req: &mut JobRequest) -> Result<Option<Vec<u32>>, String> {
        // Only the MM names elements.
        req.element = None;
        let Some(spec) = &req.array else {
            return Ok(None);
        };
        if req.batch.is_none() || req.step_of.is_some() {
            return Err("a job array is a batch job: use storm batch --array".into());
        }
        let limit = self.cfg.limits.max_array_size as usize;
        match spec.indices.len() {
            0 => Err("--array names no index".into()),
            n if n > limit => Err(format!(
                "--array asks for {n} elements, over the limit ([limits] max_array_size = \
                 {limit})"
            )),
            _ => Ok(Some(spec.indices.clone())),
        }
    }

    /// `[limits] max_held_request_bytes_per_user` for `count` new jobs of user `uid`, each
    /// with `req`'s arguments and environment.
    pub(super) fn check_held_request_bytes(
        &self,
        uid: u32,
        req: &JobRequest,
        count: usize,
    ) -> Result<(), String> {
        let limit = self.cfg.limits.max_held_request_bytes_per_user;
        let held: u64 = self
            .jobs
            .values()
            .filter(|j| j.uid == uid)
            .map(|j| argument_bytes(&j.req) as u64)
            .sum();
        let more = argument_bytes(req) as u64 * count as u64;
        if held + more > limit {
            return Err(format!(
                "the machine manager already holds {held} bytes of arguments and environment \
                 for user {uid}'s unfinished jobs; {more} more would pass the limit ([limits] \
                 max_held_request_bytes_per_user = {limit}); wait for some jobs to finish, or \
                 pass fewer variables (--export)"
            ));
        }
        Ok(())
    }

    /// `[limits] max_queued_jobs_per_user` for `count` new jobs of user `uid`.
    pub(super) fn check_queue_limit(&self, uid: u32, count: usize) -> Result<(), String> {
        let limit = self.cfg.limits.max_queued_jobs_per_user;
        let waiting = self
            .jobs
            .values()
            .filter(|j| j.uid == uid && j.phase == Phase::Queued)
            .count();
        if waiting + count > limit as usize {
            let more = if count > 1 {
                format!("; {count} more would pass it")
            } else {
                String::new()
            };
            return Err(format!(
                "user {uid} already has {waiting} jobs waiting to start, the limit ([limits] \
                 max_queued_jobs_per_user = {limit}){more}; wait for some to start, or cancel some"
            ));
        }
        Ok(())
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

    /// What job `j` asks of the scheduling policy.
    pub(super) fn ask(&self, j: &Job) -> JobAsk {
        job_ask(
            j.id,
            &j.req,
            &j.plan,
            self.cfg.capacity().cpus_per_node,
            self.feature_bits(&j.req, j.plan.nodes),
        )
    }

    /// The bits of `req`'s `--constraint`, and of where a job of `nodes` nodes may run
    /// ([`MachineManager::place_bits`]). A feature no node has any longer (the cluster file
    /// changed under a queued job) is a bit no node has: the job waits, and says so.
    pub(super) fn feature_bits(&self, req: &JobRequest, nodes: u32) -> u64 {
        self.constraint_bits(req) | self.place_bits(req, nodes)
    }

    /// The bits of `req`'s `--constraint` (`u64::MAX` for a feature no node has).
    fn constraint_bits(&self, req: &JobRequest) -> u64 {
        if req.constraint.is_empty() {
            return 0;
        }
        self.cfg.feature_mask(&req.constraint).unwrap_or(u64::MAX)
    }

    /// Where job `req` of `nodes` nodes may run, as feature bits, in a file that names guest
    /// slots (nothing to say otherwise):
    /// * without `--borrow`: on this cluster's own nodes
    ///   ([`storm_cluster::config::OWN_NODE_BIT`]);
    /// * with it: anywhere;
    /// * with `--one-cluster` too: on its own nodes if they are enough for it, else on the
    ///   guest slots of the first lender, by `[[peer]] priority` then the file's order, that
    ///   has enough of them (that lender's bit).
    pub(super) fn place_bits(&self, req: &JobRequest, nodes: u32) -> u64 {
        use storm_cluster::config::OWN_NODE_BIT;
        if !self.has_guests {
            return 0;
        }
        if !req.borrow {
            return OWN_NODE_BIT;
        }
        if !req.one_cluster {
            return 0;
        }
        let constraint = self.constraint_bits(req);
        let holds = |place: u64| self.nodes_with(constraint | place) >= nodes;
        if holds(OWN_NODE_BIT) {
            return OWN_NODE_BIT;
        }
        self.lenders_by_priority()
            .into_iter()
            .map(|l| self.cfg.lender_bit(&l))
            .find(|&bit| holds(bit))
            .unwrap_or(OWN_NODE_BIT)
    }

    /// Nodes of the cluster file with every feature bit of `bits`.
    pub(super) fn nodes_with(&self, bits: u64) -> u32 {
        self.node_features
            .iter()
            .filter(|&&m| m & bits == bits)
            .count() as u32
    }

    /// The clusters whose nodes this file has guest slots for, highest `[[peer]] priority`
    /// first (then in the file's order).
    pub(super) fn lenders_by_priority(&self) -> Vec<String> {
        let priority = |c: &str| {
            self.cfg
                .peers
                .iter()
                .find(|p| p.name == c)
                .map_or(0, |p| p.priority)
        };
        let mut lenders: Vec<String> = self.cfg.lenders().into_iter().map(String::from).collect();
        lenders.sort_by_key(|l| std::cmp::Reverse(priority(l)));
        lenders
    }

    /// The most nodes job `req` could ever have here (`--less` shrinks a larger job to it):
    /// the nodes with its features where it may run.
    fn most_nodes_for(&self, req: &JobRequest) -> u32 {
        use storm_cluster::config::OWN_NODE_BIT;
        let constraint = self.constraint_bits(req);
        if !self.has_guests || (req.borrow && !req.one_cluster) {
            return self.nodes_with(constraint);
        }
        let own = self.nodes_with(constraint | OWN_NODE_BIT);
        if !req.borrow {
            return own;
        }
        self.cfg
            .lenders()
            .into_iter()
            .map(|l| self.nodes_with(constraint | self.cfg.lender_bit(l)))
            .fold(own, u32::max)
    }

    /// Whether the cluster has the nodes `req` asks for at all: the features of
    /// `--constraint`, and the memory of `--mem` on as many nodes as `plan` takes (counting
    /// only nodes whose memory is known: declared, or told by their NM).
    pub(super) fn check_fit(&self, req: &JobRequest, plan: &TaskPlan) -> Result<(), String> {
        let place = self.place_bits(req, plan.nodes);
        if req.constraint.is_empty() && req.mem.is_none() && place == 0 {
            // Most jobs: nothing to look at per node.
            return Ok(());
        }
        let features = if req.constraint.is_empty() {
            0
        } else {
            self.cfg.feature_mask(&req.constraint)?
        } | place;
        let ask = self.ask_of(req, plan, features);
        let with_features: Vec<usize> = self
            .cfg
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| self.node_features[*i] & features == features)
            .map(|(i, _)| i)
            .collect();
        let cluster = &self.cfg.cluster.name;
        if (with_features.len() as u32) < plan.nodes && req.borrow && req.one_cluster {
            return Err(format!(
                "--one-cluster: the job needs {} nodes of one cluster, and neither cluster \
                 {cluster:?}'s own nodes nor any lender's guest slots here are that many \
                 (with those features)",
                plan.nodes
            ));
        }
        if (with_features.len() as u32) < plan.nodes && req.constraint.is_empty() {
            let guests = self.cfg.nodes.len() as u32 - self.cfg.home_node_count();
            return Err(format!(
                "the job needs {} nodes, and cluster {cluster:?} has {} of its own (and {guests} \
                 guest slots for nodes its peers may lend it: --borrow lets a job use them)",
                plan.nodes,
                with_features.len()
            ));
        }
        if (with_features.len() as u32) < plan.nodes {
            return Err(format!(
                "--constraint {}: the job needs {} nodes, and cluster {cluster:?} has {} with \
                 those features",
                req.constraint.join("&"),
                plan.nodes,
                with_features.len()
            ));
        }
        if ask.mem == 0 || with_features.iter().any(|&n| self.node_mem[n] == 0) {
            return Ok(());
        }
        let big_enough = with_features
            .iter()
            .filter(|&&n| self.node_mem[n] >= ask.mem)
            .count() as u32;
        if big_enough < plan.nodes {
            let largest = with_features.iter().map(|&n| self.node_mem[n]).max();
            return Err(format!(
                "the job needs {} of memory on each of {} nodes, and cluster {cluster:?} has {} \
                 nodes with that much (the largest has {})",
                storm_cluster::size::human_bytes(ask.mem),
                plan.nodes,
                big_enough,
                storm_cluster::size::human_bytes(largest.unwrap_or(0))
            ));
        }
        Ok(())
    }

    /// `--less`: a job larger than any place it may run here asks for the most nodes it
    /// could have instead (its tasks per node kept).
    fn shrink_to_cluster(&self, req: &mut JobRequest) {
        if !req.less {
            return;
        }
        let unbounded = storm_cluster::tasks::Capacity {
            nodes: u32::MAX / 2,
            ..self.cfg.capacity()
        };
        let most = self.most_nodes_for(req);
        if let Ok(wanted) = req.tasks.plan(&unbounded)
            && most > 0
            && wanted.nodes > most
        {
            req.tasks = req.tasks.shrunk(&wanted, most);
        }
    }

    /// What a job of `req` and `plan` would ask of the policy (its id aside).
    fn ask_of(&self, req: &JobRequest, plan: &TaskPlan, features: u64) -> JobAsk {
        job_ask(0, req, plan, self.cfg.capacity().cpus_per_node, features)
    }

    /// The shape of job `req` on this cluster, or why it does not fit. A job that may run
    /// only on peers (`--clusters` without this cluster) is not bounded by this cluster's
    /// node count: its peers size it ([`MachineManager::check_clusters`]), and the one it
    /// goes to plans it again on its own nodes.
    pub(super) fn plan(&self, req: &JobRequest) -> Result<TaskPlan, String> {
        let mut capacity = self.cfg.capacity();
        if !req.flock.may_run_at_home(&self.cfg.cluster.name) {
            capacity.nodes = u32::MAX / 2;
        }
        req.tasks
            .plan(&capacity)
            .map_err(|e| format!("{e} (cluster {:?})", self.cfg.cluster.name))
    }

    /// Why a queued job cannot start right now, if it cannot.
    pub(super) fn wait_reason(&self, job: JobId) -> Option<String> {
        if let Some(j) = self.jobs.get(&job) {
            if let Some(f) = &j.flocked {
                return Some(match f.remote {
                    Some(r) => format!("flocked to peer cluster {}, where it is job {r}", f.peer),
                    None => format!("flocked to peer cluster {}", f.peer),
                });
            }
            if !j.req.flock.may_run_at_home(&self.cfg.cluster.name) {
                return Some(format!(
                    "waiting for one of the clusters it may run on ({}) to offer room",
                    match &j.req.flock {
                        storm_cluster::flock::Flock::Only(names) => names.join(","),
                        _ => String::new(),
                    }
                ));
            }
        }
        if self.reattach.held.is_some() {
            return Some(format!(
                "held after a restart of the machine manager until the submitters of the queued \
                 jobs reattach (at most {} s)",
                restart::REATTACH_GRACE.as_secs()
            ));
        }
        if let Some(why) = self
            .jobs
            .get(&job)
            .and_then(|j| self.dependency_wait(j).or_else(|| self.throttle_wait(j)))
        {
            return Some(why);
        }
        let want = self.jobs.get(&job).map_or(0, |j| j.plan.nodes);
        let available = self.nodes.available_count();
        if want > available {
            return Some(format!(
                "waiting for {want} nodes: {available} of {} are up and not drained ({} up)",
                self.nodes.len(),
                self.nodes.up_count()
            ));
        }
        if self.slots.iter().all(Option::is_some) {
            return Some(format!(
                "waiting: {} jobs already run (max_jobs)",
                self.slots.len()
            ));
        }
        self.policy.reason(job)
    }

    pub(super) fn job_info(&self, j: &Job) -> JobInfo {
        let state = match (&j.cancel, j.phase) {
            (Some(_), _) => JobState::Cancelling,
            (None, Phase::Queued) if j.flocked.as_ref().is_some_and(|f| f.started) => {
                JobState::Running
            }
            (None, Phase::Queued) => JobState::Queued,
            (None, Phase::Allocated) => JobState::Starting,
            (None, Phase::Checking { .. } | Phase::Sending { .. } | Phase::Verifying { .. }) => {
                JobState::Sending
            }
            (None, Phase::Recording { .. } | Phase::Launching) => JobState::Launching,
            (None, Phase::Recovering) => JobState::Recovering,
            (None, Phase::Running) if j.terminating => JobState::Ending,
            // Gang scheduling: placed, but not in this timeslice's slot.
            (None, Phase::Running) if self.gang && !self.run_set.contains(&j.id) => {
                JobState::Suspended
            }
            (None, Phase::Running) => JobState::Running,
        };
        JobInfo {
            job: j.id,
            name: j.req.name.clone(),
            uid: j.uid,
            state,
            nodes: j.nodes.clone(),
            cpus: j.cpus.clone(),
            ntasks: j.plan.ntasks,
            elapsed_ms: self
                .now()
                .saturating_duration_since(j.submitted)
                .as_millis() as u64,
            reason: (j.phase == Phase::Queued && !j.flocked.as_ref().is_some_and(|f| f.started))
                .then(|| self.wait_reason(j.id))
                .flatten(),
            time_slot: (self.gang && j.phase != Phase::Queued).then_some(j.time_slot as u32),
            exit_code: None,
            usage: JobUsage::default(),
            element: j.req.element,
            submitted_ms: j.submitted_ms,
            started_ms: j.launched_ms,
            ended_ms: None,
            runs_on: j.flocked.as_ref().map(|f| f.peer.clone()),
            from_cluster: j.req.flock.flocked_from().map(str::to_string),
        }
    }

    pub(super) fn node_infos(&self) -> Vec<NodeInfo> {
        let now_ms = self.unix_ms();
        self.cfg
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = i as NodeId;
                let jobs: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.nodes.contains(id))
                    .map(|j| j.id)
                    .collect();
                let (state, mut reason) = self.nodes.describe(id, !jobs.is_empty());
                if let Some(g) = &n.guest_of {
                    // A guest slot says whose node it stands for, lent here or not.
                    let whose = match state {
                        control::NodeState::Idle | control::NodeState::Allocated => {
                            format!("borrowed from cluster {} (its {})", g.cluster, g.node)
                        }
                        _ => format!(
                            "guest slot for node {} of cluster {}, not lent here now",
                            g.node, g.cluster
                        ),
                    };
                    reason = Some(match reason {
                        Some(r) => format!("{whose}; {r}"),
                        None => whose,
                    });
                }
                NodeInfo {
                    id,
                    name: n.name.clone(),
                    state,
                    jobs,
                    reason,
                    records: Some(self.node_records(i, now_ms)),
                }
            })
            .collect()
    }

    /// The history of each node of `names` (all if none) over the last `window_ms`, or why
    /// not: a name that is no node, no history kept, or more points than a reply holds.
    fn node_traces(&self, names: &[String], window_ms: u64) -> Result<Vec<NodeTrace>, String> {
        if self.node_history.capacity() == 0 {
            return Err("this cluster keeps no node history ([monitoring] history_s = 0)".into());
        }
        let nodes: Vec<usize> = if names.is_empty() {
            (0..self.cfg.nodes.len()).collect()
        } else {
            names
                .iter()
                .map(|name| {
                    self.cfg
                        .node_by_name(name)
                        .map(|n| n as usize)
                        .ok_or_else(|| {
                            format!("no node {name:?} in cluster {:?}", self.cfg.cluster.name)
                        })
                })
                .collect::<Result<_, _>>()?
        };
        let since = self.unix_ms().saturating_sub(window_ms);
        let points: usize = nodes
            .iter()
            .map(|&n| self.node_history.count_since(n, since))
            .sum();
        if points > MAX_HISTORY_POINTS {
            return Err(format!(
                "the history asked for is {points} samples, more than one answer holds \
                 ({MAX_HISTORY_POINTS}): name fewer nodes (--node) or ask for a shorter window"
            ));
        }
        Ok(nodes
            .into_iter()
            .map(|n| {
                let (points, mem_total) = self.node_history.since(n, since);
                NodeTrace {
                    name: self.cfg.nodes[n].name.clone(),
                    mem_total,
                    points,
                }
            })
            .collect())
    }

    /// Node `node`'s sample, usage and inventory as its NM last put them into this MM's memory
    /// (`storm_cluster::sample`), judged fresh or stale at `now_ms`. A record caught while
    /// the next one lands is read again once.
    fn node_records(&self, node: usize, now_ms: u64) -> NodeRecords {
        let sample = || {
            self.read_record(self.rm.sample_offset(node))
                .and_then(|b| NodeSample::decode(&b))
        };
        let inventory = || {
            self.read_record(self.rm.inventory_record_offset(node))
                .and_then(|b| NodeInventory::decode(&b))
        };
        let usage = || {
            self.read_usage(self.rm.usage_record_offset(node))
                .and_then(|b| NodeUsage::decode(&b))
        };
        NodeRecords::judge(
            read_twice(sample),
            read_twice(usage),
            read_twice(inventory),
            now_ms,
            self.cfg.monitoring.sample_ms,
        )
    }

    /// The metrics, with the node and job gauges set from the state now.
    pub(super) fn metrics_text(&self) -> String {
        let busy = self
            .jobs
            .values()
            .fold(NodeSet::new(), |all, j| all.union(&j.nodes));
        let node_states =
            (0..self.cfg.node_count()).map(|n| self.nodes.describe(n, busy.contains(n)).0);
        let job_states = self.jobs.values().map(|j| self.job_info(j).state);
        let queued = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Queued)
            .count();
        self.metrics.encode(node_states, job_states, queued)
    }

    // ---------------------------------------------------------------- scheduling
}

/// The bytes of a job's arguments and environment, as the kernel counts them against
/// `ARG_MAX` (each string with its terminating zero; `KEY=VALUE` for a variable).
fn argument_bytes(req: &JobRequest) -> usize {
    req.args.iter().map(|a| a.len() + 1).sum::<usize>()
        + req
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>()
}
