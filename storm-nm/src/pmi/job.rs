//! One job's PMI server on one node, without I/O: requests from the local ranks go in,
//! replies and the node's part of each fence come out ([`Effect`]).
//!
//! The key space: a rank's `put` is kept in this node's copy at once and queued as this
//! node's contribution to the next fence. When every local rank has entered the fence
//! (`barrier_in`, `kvs-fence`), the contribution goes to the MM, which merges every node's
//! and sends the union back ([`PmiJob::fenced`]); only then are the ranks released, and every
//! `get` after it is answered from this node's copy, at once.

use std::collections::{BTreeMap, HashMap};

use storm_cluster::messages::{JobId, RankEnd, RankStatus};

use super::wire::{Request, Version, reply_v1, reply_v2};

/// What the job's tasks are told about the job, the same on every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFacts {
    pub job: JobId,
    pub size: u32,
    /// `PMI_process_mapping`: which ranks share a node.
    pub mapping: String,
    /// Which protocol versions are served (`--mpi`).
    pub v1: bool,
    pub v2: bool,
    /// The bytes of keys and values one fence's puts on one node may hold (`[cluster]
    /// pmi_node_bytes`); also the bound on `info-putnodeattr`'s node attributes.
    pub node_bytes: usize,
    /// The bytes of keys and values the job's whole key space may hold (`[cluster]
    /// pmi_job_bytes`).
    pub job_bytes: usize,
    /// The job's nodes, in its order: each one's name and ranks (PMIx's maps), and this
    /// node's index among them.
    pub nodes: Vec<(String, Vec<u32>)>,
    pub node: usize,
    /// The job's user and group (a PMIx client's credentials are checked against them).
    pub owner: (u32, u32),
}

impl JobFacts {
    pub fn kvsname(&self) -> String {
        format!("storm-{}", self.job)
    }
}

/// `PMI_process_mapping` for storm's block placement of `ntasks` on `nnodes` nodes: the
/// first `ntasks % nnodes` nodes run one task more (Flux RFC 13's vector form).
pub fn process_mapping(ntasks: u32, nnodes: u32) -> String {
    let base = ntasks / nnodes.max(1);
    let extra = ntasks % nnodes.max(1);
    let mut groups = Vec::new();
    if extra > 0 {
        groups.push(format!("(0,{extra},{})", base + 1));
    }
    if base > 0 && nnodes > extra {
        groups.push(format!("({extra},{},{base})", nnodes - extra));
    }
    format!("(vector,{})", groups.join(","))
}

/// Something the server must do for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write these bytes to the rank's socket.
    Reply(u32, Vec<u8>),
    /// Every local rank is in fence `epoch`: send these puts to the MM.
    Contribute {
        epoch: u32,
        pairs: Vec<(String, String)>,
    },
    /// End the job on every node: a rank asked for it (`abort`), or broke the protocol, or
    /// left without `finalize`.
    Abort {
        rank: u32,
        code: Option<i32>,
        message: String,
    },
    /// Close the rank's socket (after a protocol error).
    Close(u32),
}

#[derive(Debug, Default)]
struct Rank {
    version: Option<Version>,
    initialized: bool,
    finalized: bool,
    in_fence: bool,
    closed: bool,
}

/// One job's PMI state on this node.
#[derive(Debug)]
pub struct PmiJob {
    pub facts: JobFacts,
    ranks: BTreeMap<u32, Rank>,
    kvs: HashMap<String, String>,
    /// The bytes of keys and values in `kvs`, bounded by `facts.job_bytes`.
    kvs_bytes: usize,
    node_attrs: HashMap<String, String>,
    node_attr_bytes: usize,
    /// Puts since the last fence: this node's next contribution.
    pending: BTreeMap<String, String>,
    /// The bytes of keys and values in `pending`, bounded by `facts.node_bytes`.
    pending_bytes: usize,
    /// Fences completed.
    epoch: u32,
    /// This node's contribution to fence `epoch + 1` is with the MM.
    contributed: bool,
    aborted: bool,
}

impl PmiJob {
    pub fn new(facts: JobFacts, local_ranks: impl IntoIterator<Item = u32>) -> Self {
        Self {
            facts,
            ranks: local_ranks
                .into_iter()
                .map(|r| (r, Rank::default()))
                .collect(),
            kvs: HashMap::new(),
            kvs_bytes: 0,
            node_attrs: HashMap::new(),
            node_attr_bytes: 0,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            epoch: 0,
            contributed: false,
            aborted: false,
        }
    }

    /// The fence this node waits for, with its contribution, if it waits for one (sent again
    /// to a restarted MM).
    pub fn waiting_fence(&self) -> Option<(u32, Vec<(String, String)>)> {
        self.contributed
            .then(|| (self.epoch + 1, self.contribution()))
    }

    /// Handles one request from local rank `rank`.
    pub fn handle(&mut self, rank: u32, req: &Request) -> Vec<Effect> {
        let Some(r) = self.ranks.get_mut(&rank) else {
            return vec![Effect::Close(rank)];
        };
        let v2 = r.version == Some(Version::Two);
        let reply = |cmd: &str, pairs: &[(&str, &str)]| {
            Effect::Reply(
                rank,
                if v2 {
                    reply_v2(cmd, pairs)
                } else {
                    reply_v1(cmd, pairs)
                },
            )
        };
        let size = self.facts.size.to_string();
        match (r.version, req.cmd.as_str()) {
            (None, "init") => {
                let wants_v2 = req.get("pmi_version") == Some("2");
                let served = if wants_v2 {
                    self.facts.v2
                } else {
                    self.facts.v1
                };
                if !served {
                    // A mismatch is named, and ends the job: the rank would otherwise die
                    // of a closed socket (SIGPIPE) with no word of why.
                    let (speaks, served) = if wants_v2 { ("2", "1") } else { ("1", "2") };
                    let msg = format!(
                        "it speaks PMI-{speaks}, and this job serves PMI-{served} only \
                         (storm-submit --mpi pmi{served}); --mpi auto serves both"
                    );
                    let mut out = vec![Effect::Reply(
                        rank,
                        reply_v1("response_to_init", &[("rc", "-1"), ("msg", &msg)]),
                    )];
                    out.extend(self.abort(rank, None, msg));
                    out.push(Effect::Close(rank));
                    return out;
                }
                r.version = Some(if wants_v2 { Version::Two } else { Version::One });
                r.initialized = !wants_v2;
                let (version, sub) = if wants_v2 { ("2", "0") } else { ("1", "1") };
                let mut out = vec![Effect::Reply(
                    rank,
                    reply_v1(
                        "response_to_init",
                        &[
                            ("pmi_version", version),
                            ("pmi_subversion", sub),
                            ("rc", "0"),
                        ],
                    ),
                )];
                out.extend(self.ended_before_init());
                out
            }
            (None, other) => self.protocol_error(
                rank,
                format!("{other:?} before init (PMI needs init first)"),
            ),
            // ------------------------------------------------------------------ PMI-1
            (Some(Version::One), cmd) => match cmd {
                "get_maxes" => vec![reply(
                    "maxes",
                    &[
                        ("rc", "0"),
                        ("kvsname_max", "256"),
                        ("keylen_max", "64"),
                        ("vallen_max", "1024"),
                    ],
                )],
                "get_appnum" => vec![reply("appnum", &[("rc", "0"), ("appnum", "0")])],
                "get_universe_size" => {
                    vec![reply("universe_size", &[("rc", "0"), ("size", &size)])]
                }
                "get_my_kvsname" => vec![reply(
                    "my_kvsname",
                    &[("rc", "0"), ("kvsname", &self.facts.kvsname())],
                )],
                "put" => match (req.get("key"), req.get("value")) {
                    (Some(k), Some(v)) => match self.put(rank, k, v) {
                        Ok(()) => vec![reply("put_result", &[("rc", "0")])],
                        Err(mut abort) => {
                            abort.insert(0, reply("put_result", &[("rc", "-1"), ("msg", "full")]));
                            abort
                        }
                    },
                    _ => vec![reply(
                        "put_result",
                        &[("rc", "-1"), ("msg", "put_needs_key_and_value")],
                    )],
                },
                "get" => match req.get("key").and_then(|k| self.lookup(k)) {
                    Some(v) => vec![reply("get_result", &[("rc", "0"), ("value", &v)])],
                    None => vec![reply(
                        "get_result",
                        &[("rc", "-1"), ("msg", "key_not_found")],
                    )],
                },
                "barrier_in" => self.enter_fence(rank),
                "finalize" => {
                    self.ranks.get_mut(&rank).expect("rank").finalized = true;
                    vec![reply("finalize_ack", &[("rc", "0")])]
                }
                "abort" => self.abort(
                    rank,
                    req.get("exitcode").and_then(|c| c.parse().ok()),
                    req.get("msg").unwrap_or("MPI_Abort").to_string(),
                ),
                "publish_name" | "unpublish_name" | "lookup_name" | "spawn" => {
                    let result = format!("{cmd}_result");
                    vec![reply(&result, &[("rc", "-1"), ("msg", "not_supported")])]
                }
                other => self.protocol_error(rank, format!("unknown PMI-1 command {other:?}")),
            },
            // ------------------------------------------------------------------ PMI-2
            (Some(Version::Two), cmd) => match cmd {
                "fullinit" => {
                    self.ranks.get_mut(&rank).expect("rank").initialized = true;
                    let ended = self.ended_before_init();
                    if !ended.is_empty() {
                        return ended;
                    }
                    let me = rank.to_string();
                    vec![reply(
                        "fullinit-response",
                        &[
                            ("rc", "0"),
                            ("pmi-version", "2"),
                            ("pmi-subversion", "0"),
                            ("rank", &me),
                            ("size", &size),
                            ("appnum", "0"),
                            ("debugged", "FALSE"),
                            ("pmiverbose", "FALSE"),
                        ],
                    )]
                }
                "job-getid" => vec![reply(
                    "job-getid-response",
                    &[("rc", "0"), ("jobid", &self.facts.kvsname())],
                )],
                "info-getjobattr" => {
                    let value = match req.get("key") {
                        Some("PMI_process_mapping") => Some(self.facts.mapping.clone()),
                        Some("universeSize") => Some(size.clone()),
                        _ => None,
                    };
                    found_reply(&reply, "info-getjobattr-response", value)
                }
                "info-putnodeattr" => {
                    if let (Some(k), Some(v)) = (req.get("key"), req.get("value")) {
                        let bytes = self.node_attr_bytes + k.len() + v.len();
                        if bytes > self.facts.node_bytes {
                            let what = format!(
                                "rank {rank}'s node attributes exceed the {} bytes a node holds ([cluster] pmi_node_bytes)",
                                self.facts.node_bytes
                            );
                            let mut out = vec![reply(
                                "info-putnodeattr-response",
                                &[("rc", "-1"), ("errmsg", "the node attributes are full")],
                            )];
                            out.extend(self.abort(rank, None, what));
                            return out;
                        }
                        if let Some(old) = self.node_attrs.insert(k.to_string(), v.to_string()) {
                            self.node_attr_bytes -= k.len() + old.len();
                        }
                        self.node_attr_bytes += k.len() + v.len();
                    }
                    vec![reply("info-putnodeattr-response", &[("rc", "0")])]
                }
                "info-getnodeattr" => {
                    let value = req.get("key").and_then(|k| self.node_attrs.get(k).cloned());
                    found_reply(&reply, "info-getnodeattr-response", value)
                }
                "kvs-put" => match (req.get("key"), req.get("value")) {
                    (Some(k), Some(v)) => match self.put(rank, k, v) {
                        Ok(()) => vec![reply("kvs-put-response", &[("rc", "0")])],
                        Err(mut abort) => {
                            let full = [("rc", "-1"), ("errmsg", "the key space is full")];
                            abort.insert(0, reply("kvs-put-response", &full));
                            abort
                        }
                    },
                    _ => vec![reply(
                        "kvs-put-response",
                        &[("rc", "-1"), ("errmsg", "kvs-put needs key and value")],
                    )],
                },
                "kvs-get" => {
                    let value = req.get("key").and_then(|k| self.lookup(k));
                    found_reply(&reply, "kvs-get-response", value)
                }
                "kvs-fence" => self.enter_fence(rank),
                "finalize" => {
                    self.ranks.get_mut(&rank).expect("rank").finalized = true;
                    vec![reply("finalize-response", &[("rc", "0")])]
                }
                "abort" => self.abort(
                    rank,
                    None,
                    req.get("msg").unwrap_or("PMI2_Abort").to_string(),
                ),
                other => self.protocol_error(rank, format!("unknown PMI-2 command {other:?}")),
            },
        }
    }

    /// The MM's union of every node's contribution to fence `epoch`: the ranks in it go on.
    pub fn fenced(&mut self, epoch: u32, pairs: Vec<(String, String)>) -> Vec<Effect> {
        if !self.contributed || epoch != self.epoch + 1 {
            return Vec::new();
        }
        self.epoch = epoch;
        self.contributed = false;
        self.pending.clear();
        self.pending_bytes = 0;
        for (k, v) in pairs {
            let key_len = k.len();
            self.kvs_bytes += key_len + v.len();
            if let Some(old) = self.kvs.insert(k, v) {
                self.kvs_bytes -= key_len + old.len();
            }
        }
        let mut out = Vec::new();
        if self.kvs_bytes > self.facts.job_bytes {
            return self.abort(
                0,
                None,
                format!(
                    "the job's MPI key space outgrew the {} bytes it may hold ([cluster] pmi_job_bytes)",
                    self.facts.job_bytes
                ),
            );
        }
        for (&rank, r) in self.ranks.iter_mut() {
            if std::mem::take(&mut r.in_fence) {
                out.push(Effect::Reply(
                    rank,
                    match r.version {
                        Some(Version::Two) => reply_v2("kvs-fence-response", &[("rc", "0")]),
                        _ => reply_v1("barrier_out", &[("rc", "0")]),
                    },
                ));
            }
        }
        out
    }

    // ------------------------------------------------------------------ PMIx
    //
    // A PMIx client speaks to the node's PMIx server (the OpenPMIx library in the NM's
    // process, `crate::pmix`), not to its PMI socket. The library collects the local ranks'
    // data and asks for a fence once per node, with this node's blob; here that blob becomes
    // this node's contribution to the job's fence at the MM, like the PMI puts of a node's
    // ranks, under a key of its own (`pmix.fence.N`). Connection and finalization count as
    // PMI's init and finalize do, so a PMIx rank that leaves without finalizing (its task's
    // PMI socket closes) ends the job the same way.

    /// PMIx rank `rank` connected to the node's PMIx server: it is an MPI rank now.
    pub fn pmix_connected(&mut self, rank: u32) -> Vec<Effect> {
        if let Some(r) = self.ranks.get_mut(&rank) {
            r.initialized = true;
        }
        self.ended_before_init()
    }

    /// The PMIx event of local rank `rank`'s end with `status`, if it ended badly (for the
    /// job's other ranks: [`super::exchange`]).
    pub fn end_event(&self, rank: u32, status: RankStatus) -> Option<RankEnd> {
        let r = self.ranks.get(&rank)?;
        RankEnd::of(rank, status, r.initialized, r.finalized)
    }

    /// PMIx rank `rank` finalized.
    pub fn pmix_finalized(&mut self, rank: u32) {
        if let Some(r) = self.ranks.get_mut(&rank) {
            r.finalized = true;
        }
    }

    /// PMIx rank `rank` called `PMIx_Abort`: the job ends with `status`, as with
    /// `MPI_Abort` through PMI. The helper's word is a claim: a rank not of this node is no
    /// one's, and changes nothing.
    pub fn pmix_abort(&mut self, rank: u32, status: i32, message: String) -> Vec<Effect> {
        if !self.ranks.contains_key(&rank) {
            return Vec::new();
        }
        self.abort(rank, Some(status), message)
    }

    /// The node's PMIx server asks for a fence with this node's `blob` (every local rank
    /// is in it): this node's contribution goes to the MM. Its key is this node's
    /// (`node`, the node's index among the job's); every node puts one each fence, so after
    /// the fence the key space holds every node's latest ([`PmiJob::pmix_blobs`]).
    pub fn pmix_fence(&mut self, node: usize, blob: String) -> Vec<Effect> {
        if self.contributed {
            return Vec::new();
        }
        // Too much data is charged to the node's first rank (the library merged them all).
        let first = self.ranks.keys().next().copied().unwrap_or(0);
        if let Err(abort) = self.put(first, &pmix_key(node), &blob) {
            return abort;
        }
        self.contributed = true;
        vec![Effect::Contribute {
            epoch: self.epoch + 1,
            pairs: self.contribution(),
        }]
    }

    /// The node's PMIx server had more of this node's data for a fence than a node may
    /// give one (`bytes`): the job ends, naming the limit, as a PMI put over it does.
    pub fn pmix_fence_too_large(&mut self, bytes: u64) -> Vec<Effect> {
        let first = self.ranks.keys().next().copied().unwrap_or(0);
        let limit = self.facts.node_bytes;
        self.abort(
            first,
            None,
            format!(
                "this node's ranks gave one PMIx fence {bytes} bytes, more than the {limit} allowed for one fence's puts on a node ([cluster] pmi_node_bytes)"
            ),
        )
    }

    /// Every node's blob of the last fence, in node order (what the PMIx server takes as the
    /// fence's collected data); `nodes` is the job's node count. A node that put none counts
    /// as empty.
    pub fn pmix_blobs(&self, nodes: usize) -> Vec<&str> {
        (0..nodes)
            .map(|n| self.kvs.get(&pmix_key(n)).map_or("", String::as_str))
            .collect()
    }

    /// Rank `rank`'s socket closed (the task ended). After init and before finalize that
    /// ends the job: the other ranks would wait for it for ever. So does a rank that ended
    /// before init in a job another local rank initialized (an MPI job): this node's part of
    /// every fence needs it, and the others would wait in `MPI_Init` until the time limit.
    pub fn closed(&mut self, rank: u32) -> Vec<Effect> {
        let Some(r) = self.ranks.get_mut(&rank) else {
            return Vec::new();
        };
        r.closed = true;
        if r.initialized && !r.finalized {
            return self.abort(
                rank,
                None,
                "it left without calling MPI_Finalize".to_string(),
            );
        }
        self.ended_before_init()
    }

    /// Ends the job if a local rank ended without initializing while another initialized:
    /// the fence the initialized ones enter can never be whole on this node.
    fn ended_before_init(&mut self) -> Vec<Effect> {
        let gone = self
            .ranks
            .iter()
            .find(|(_, r)| r.closed && !r.initialized)
            .map(|(&rank, _)| rank);
        match gone {
            Some(rank) if self.ranks.values().any(|r| r.initialized) => self.abort(
                rank,
                None,
                "it ended before calling MPI_Init, while the job's other ranks wait for it there"
                    .to_string(),
            ),
            _ => Vec::new(),
        }
    }

    /// Rank `rank` sent bytes that are no PMI message: the job ends, the socket closes.
    pub fn malformed(&mut self, rank: u32, what: String) -> Vec<Effect> {
        self.protocol_error(rank, what)
    }

    /// Keeps a put in this node's copy and its next contribution, or, past either limit,
    /// ends the job (the effects to carry that out) and keeps nothing.
    fn put(&mut self, rank: u32, key: &str, value: &str) -> Result<(), Vec<Effect>> {
        let size = key.len() + value.len();
        let replaced = self.kvs.get(key).map_or(0, |old| key.len() + old.len());
        let replaced_pending = self.pending.get(key).map_or(0, |old| key.len() + old.len());
        let (limit, what) = if self.pending_bytes + size - replaced_pending > self.facts.node_bytes
        {
            (
                self.facts.node_bytes,
                "one fence's puts on a node ([cluster] pmi_node_bytes)",
            )
        } else if self.kvs_bytes + size - replaced > self.facts.job_bytes {
            (
                self.facts.job_bytes,
                "the job's key space ([cluster] pmi_job_bytes)",
            )
        } else {
            self.kvs.insert(key.to_string(), value.to_string());
            self.kvs_bytes = self.kvs_bytes + size - replaced;
            self.pending.insert(key.to_string(), value.to_string());
            self.pending_bytes = self.pending_bytes + size - replaced_pending;
            return Ok(());
        };
        Err(self.abort(
            rank,
            None,
            format!("rank {rank}'s MPI puts exceed the {limit} bytes allowed for {what}"),
        ))
    }

    /// This node's puts since the last fence, as sent to the MM.
    fn contribution(&self) -> Vec<(String, String)> {
        self.pending
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn lookup(&self, key: &str) -> Option<String> {
        if key == "PMI_process_mapping" {
            return Some(self.facts.mapping.clone());
        }
        self.kvs.get(key).cloned()
    }

    fn enter_fence(&mut self, rank: u32) -> Vec<Effect> {
        self.ranks.get_mut(&rank).expect("rank").in_fence = true;
        if self.contributed || !self.ranks.values().all(|r| r.in_fence) {
            return Vec::new();
        }
        self.contributed = true;
        vec![Effect::Contribute {
            epoch: self.epoch + 1,
            pairs: self.contribution(),
        }]
    }

    fn abort(&mut self, rank: u32, code: Option<i32>, message: String) -> Vec<Effect> {
        if std::mem::replace(&mut self.aborted, true) {
            return Vec::new();
        }
        vec![Effect::Abort {
            rank,
            code,
            message,
        }]
    }

    fn protocol_error(&mut self, rank: u32, what: String) -> Vec<Effect> {
        let mut out = self.abort(
            rank,
            None,
            format!("rank {rank} broke the PMI protocol: {what}"),
        );
        out.push(Effect::Close(rank));
        out
    }
}

/// The key under which node `node` (its index in the job) puts its PMIx fence blob.
fn pmix_key(node: usize) -> String {
    format!("pmix.fence.{node}")
}

fn found_reply(
    reply: &impl Fn(&str, &[(&str, &str)]) -> Effect,
    cmd: &str,
    value: Option<String>,
) -> Vec<Effect> {
    vec![match value {
        Some(v) => reply(cmd, &[("rc", "0"), ("found", "TRUE"), ("value", &v)]),
        None => reply(cmd, &[("rc", "0"), ("found", "FALSE")]),
    }]
}

#[cfg(test)]
mod tests {
    use super::super::wire::{Framer, parse_v1};
    use super::*;

    fn facts() -> JobFacts {
        JobFacts {
            job: 9,
            size: 4,
            mapping: process_mapping(4, 2),
            v1: true,
            v2: true,
            node_bytes: 32 << 10,
            job_bytes: 1 << 20,
            nodes: vec![("node0".into(), vec![0, 1]), ("node1".into(), vec![2, 3])],
            node: 0,
            owner: (65534, 65534),
        }
    }

    /// A PMIx fence: the node's server hands this node's data once; it goes to the MM as
    /// this node's contribution, under the node's own key. The MM's result (every node's
    /// data) gives the server every node's blob in node order, this one's included; a
    /// second fence replaces each node's blob.
    #[test]
    fn a_pmix_fence_is_one_contribution_per_node_and_gives_every_nodes_data_in_order() {
        let mut job = PmiJob::new(facts(), [0, 1]);
        match job.pmix_fence(0, "QUJD".into()).as_slice() {
            [Effect::Contribute { epoch: 1, pairs }] => {
                assert_eq!(pairs, &[("pmix.fence.0".to_string(), "QUJD".to_string())]);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            job.pmix_fence(0, "QUJD".into()).is_empty(),
            "one contribution per fence"
        );
        let union = vec![
            ("pmix.fence.1".to_string(), "REVG".to_string()),
            ("pmix.fence.0".to_string(), "QUJD".to_string()),
        ];
        assert!(job.fenced(1, union).is_empty(), "no PMI rank waits");
        assert_eq!(job.pmix_blobs(2), ["QUJD", "REVG"]);
        assert!(matches!(
            job.pmix_fence(0, "WFla".into()).as_slice(),
            [Effect::Contribute { epoch: 2, .. }]
        ));
        job.fenced(
            2,
            vec![
                ("pmix.fence.0".to_string(), "WFla".to_string()),
                ("pmix.fence.1".to_string(), "".to_string()),
            ],
        );
        assert_eq!(job.pmix_blobs(2), ["WFla", ""]);
    }

    /// PMIx_Abort ends the job with its status, once; an abort the helper claims for a rank
    /// of another node changes nothing.
    #[test]
    fn a_pmix_abort_ends_the_job_only_for_a_rank_of_this_node() {
        let mut job = PmiJob::new(facts(), [0, 1]);
        assert!(job.pmix_abort(2, 9, "not here".into()).is_empty());
        assert_eq!(
            job.pmix_abort(1, 9, "PMIx_Abort: bye".into()),
            [Effect::Abort {
                rank: 1,
                code: Some(9),
                message: "PMIx_Abort: bye".into()
            }]
        );
        assert!(job.pmix_abort(0, 3, "again".into()).is_empty(), "once");
    }

    /// More PMIx data from this node to one fence than a node may give ends the job, naming
    /// the limit; nothing goes to the MM.
    #[test]
    fn pmix_data_over_the_node_limit_ends_the_job_naming_it() {
        let mut job = PmiJob::new(facts(), [0, 1]);
        match job.pmix_fence_too_large(1 << 20).as_slice() {
            [
                Effect::Abort {
                    rank: 0,
                    code: None,
                    message,
                },
            ] => {
                assert!(message.contains("pmi_node_bytes"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Data the helper passed on whose base64 is over the limit is refused by the put.
        let mut job = PmiJob::new(facts(), [0, 1]);
        match job.pmix_fence(0, "A".repeat(40 << 10)).as_slice() {
            [Effect::Abort { message, .. }] => {
                assert!(message.contains("pmi_node_bytes"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// A PMIx client's connection counts as PMI's init: one that leaves without finalizing
    /// ends the job; one that finalized may leave.
    #[test]
    fn a_pmix_client_that_leaves_without_finalizing_ends_the_job() {
        let mut job = PmiJob::new(facts(), [0, 1]);
        assert!(job.pmix_connected(0).is_empty());
        assert!(job.pmix_connected(1).is_empty());
        job.pmix_finalized(0);
        assert!(job.closed(0).is_empty(), "rank 0 finalized");
        assert!(matches!(
            job.closed(1).as_slice(),
            [Effect::Abort {
                rank: 1,
                code: None,
                ..
            }]
        ));
    }

    fn v1(job: &mut PmiJob, rank: u32, line: &str) -> Vec<Effect> {
        job.handle(rank, &parse_v1(line.as_bytes()).unwrap())
    }

    fn replies(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Reply(_, b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_mapping_follows_the_block_placement() {
        assert_eq!(process_mapping(4, 2), "(vector,(0,2,2))");
        assert_eq!(process_mapping(10, 4), "(vector,(0,2,3),(2,2,2))");
        assert_eq!(process_mapping(3, 4), "(vector,(0,3,1))");
        assert_eq!(process_mapping(1, 1), "(vector,(0,1,1))");
    }

    #[test]
    fn a_fence_waits_for_every_local_rank_and_publishes_the_union() {
        let mut job = PmiJob::new(facts(), [0, 1]);
        for r in [0, 1] {
            v1(&mut job, r, "cmd=init pmi_version=1 pmi_subversion=1");
        }
        assert_eq!(
            replies(&v1(&mut job, 0, "cmd=put kvsname=storm-9 key=a value=1")),
            ["cmd=put_result rc=0\n"]
        );
        // Absent keys answer at once, as Open MPI's probing needs.
        assert_eq!(
            replies(&v1(&mut job, 1, "cmd=get kvsname=storm-9 key=z")),
            ["cmd=get_result rc=-1 msg=key_not_found\n"]
        );
        assert!(
            v1(&mut job, 0, "cmd=barrier_in").is_empty(),
            "rank 1 not in yet"
        );
        let e = v1(&mut job, 1, "cmd=barrier_in");
        assert_eq!(
            e,
            [Effect::Contribute {
                epoch: 1,
                pairs: vec![("a".into(), "1".into())]
            }]
        );
        assert!(
            job.fenced(2, vec![]).is_empty(),
            "another fence's answer is ignored"
        );
        let e = job.fenced(1, vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert_eq!(replies(&e), ["cmd=barrier_out rc=0\n"; 2]);
        assert_eq!(
            replies(&v1(&mut job, 0, "cmd=get kvsname=storm-9 key=b")),
            ["cmd=get_result rc=0 value=2\n"]
        );
        // The next fence contributes only what was put since.
        v1(&mut job, 0, "cmd=barrier_in");
        assert_eq!(
            v1(&mut job, 1, "cmd=barrier_in"),
            [Effect::Contribute {
                epoch: 2,
                pairs: vec![]
            }]
        );
    }

    #[test]
    fn pmi2_speaks_its_own_framing_after_a_v1_init() {
        let mut job = PmiJob::new(facts(), [2]);
        let mut f = Framer::default();
        f.push(b"cmd=init pmi_version=2 pmi_subversion=0\n");
        let init = f.next_request().unwrap().unwrap();
        assert_eq!(
            replies(&job.handle(2, &init)),
            ["cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n"]
        );
        let body = "cmd=info-getjobattr;key=PMI_process_mapping;";
        f.push(format!("{:<6}{body}", body.len()).as_bytes());
        let r = replies(&job.handle(2, &f.next_request().unwrap().unwrap()));
        assert!(
            r[0].ends_with("cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,2,2));"),
            "{r:?}"
        );
    }

    #[test]
    fn abort_early_exit_and_bad_requests_end_the_job_once() {
        let mut job = PmiJob::new(facts(), [0, 1]);
        v1(&mut job, 0, "cmd=init pmi_version=1 pmi_subversion=1");
        v1(&mut job, 1, "cmd=init pmi_version=1 pmi_subversion=1");
        assert_eq!(
            v1(&mut job, 1, "cmd=abort exitcode=7"),
            [Effect::Abort {
                rank: 1,
                code: Some(7),
                message: "MPI_Abort".into()
            }]
        );
        assert!(job.closed(0).is_empty(), "the job is already ending");

        // A rank that ends before init, in a job another rank initialized, ends the job:
        // the others would wait for it in MPI_Init until the time limit. (Before issue 62 this
        // test said "a task that never used PMI may leave", and protected that hang.) Either
        // order: it ends after the other's init, or before it.
        for closed_first in [false, true] {
            let mut job = PmiJob::new(facts(), [0, 1]);
            let init = |job: &mut PmiJob| v1(job, 0, "cmd=init pmi_version=1 pmi_subversion=1");
            let effects = if closed_first {
                assert!(job.closed(1).is_empty(), "no rank initialized yet");
                init(&mut job)
            } else {
                init(&mut job);
                job.closed(1)
            };
            assert!(
                effects.iter().any(|e| matches!(e,
                    Effect::Abort { rank: 1, code: None, message }
                        if message.contains("before calling MPI_Init"))),
                "closed first: {closed_first}: {effects:?}"
            );
        }
        let mut job = PmiJob::new(facts(), [0, 1]);
        v1(&mut job, 0, "cmd=init pmi_version=1 pmi_subversion=1");
        v1(&mut job, 1, "cmd=init pmi_version=1 pmi_subversion=1");
        match job.closed(0).as_slice() {
            [
                Effect::Abort {
                    rank: 0,
                    code: None,
                    message,
                },
            ] => {
                assert!(
                    message.contains("without calling MPI_Finalize"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }

        let mut job = PmiJob::new(facts(), [0]);
        let e = v1(&mut job, 0, "cmd=get_maxes");
        assert!(matches!(e.last(), Some(Effect::Close(0))), "{e:?}");
        let mut job = PmiJob::new(
            JobFacts {
                v2: false,
                ..facts()
            },
            [0],
        );
        let e = v1(&mut job, 0, "cmd=init pmi_version=2 pmi_subversion=0");
        assert!(replies(&e)[0].contains("rc=-1"), "{e:?}");
    }

    /// A job's key space is bounded on the NM: a put past one fence's node limit, or past the
    /// job's whole key space, fails, ends the job naming the limit, and is not kept, so a
    /// program that puts in a loop cannot grow the node manager without bound.
    #[test]
    fn puts_past_the_key_space_limits_end_the_job_naming_the_limit() {
        let small = JobFacts {
            node_bytes: 100,
            job_bytes: 150,
            ..facts()
        };
        let mut job = PmiJob::new(small.clone(), [0]);
        v1(&mut job, 0, "cmd=init pmi_version=1 pmi_subversion=1");
        let value = "v".repeat(40);
        for k in ["k1", "k2"] {
            let e = v1(
                &mut job,
                0,
                &format!("cmd=put kvsname=storm-9 key={k} value={value}"),
            );
            assert_eq!(replies(&e), ["cmd=put_result rc=0\n"]);
        }
        // Overwriting a key does not count it twice against the job's key space.
        let e = v1(
            &mut job,
            0,
            &format!("cmd=put kvsname=storm-9 key=k1 value={value}"),
        );
        assert_eq!(
            replies(&e),
            ["cmd=put_result rc=0\n"],
            "84 of 100 bytes pending"
        );
        let e = v1(
            &mut job,
            0,
            &format!("cmd=put kvsname=storm-9 key=k3 value={value}"),
        );
        assert_eq!(replies(&e)[0], "cmd=put_result rc=-1 msg=full\n");
        match &e[1] {
            Effect::Abort {
                rank: 0,
                code: None,
                message,
            } => assert!(
                message.contains("100 bytes") && message.contains("pmi_node_bytes"),
                "{message}"
            ),
            other => panic!("expected an abort, got {other:?}"),
        }
        assert_eq!(
            v1(&mut job, 0, "cmd=get kvsname=storm-9 key=k3"),
            [Effect::Reply(
                0,
                b"cmd=get_result rc=-1 msg=key_not_found\n".to_vec()
            )],
            "a refused put is not kept"
        );

        // The job-wide limit counts what fences brought from other nodes.
        let mut job = PmiJob::new(small, [0]);
        v1(&mut job, 0, "cmd=init pmi_version=1 pmi_subversion=1");
        v1(&mut job, 0, "cmd=barrier_in");
        let theirs = vec![("far".to_string(), "x".repeat(140))];
        assert_eq!(replies(&job.fenced(1, theirs)), ["cmd=barrier_out rc=0\n"]);
        let e = v1(
            &mut job,
            0,
            "cmd=put kvsname=storm-9 key=k value=0123456789",
        );
        match &e[1] {
            Effect::Abort { message, .. } => {
                assert!(message.contains("pmi_job_bytes"), "{message}")
            }
            other => panic!("expected an abort, got {other:?}"),
        }
        let mut job = PmiJob::new(
            JobFacts {
                job_bytes: 100,
                ..facts()
            },
            [0],
        );
        v1(&mut job, 0, "cmd=init pmi_version=1 pmi_subversion=1");
        v1(&mut job, 0, "cmd=barrier_in");
        let theirs = vec![("far".to_string(), "x".repeat(140))];
        assert!(
            matches!(job.fenced(1, theirs).as_slice(), [Effect::Abort { message, .. }] if message.contains("pmi_job_bytes")),
            "a fence result past the job's key space ends the job"
        );
    }
}
