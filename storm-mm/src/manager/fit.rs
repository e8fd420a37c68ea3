//! Whether and where a job can run: its plan of nodes and tasks, the features and clusters
//! its nodes must have, what it asks the scheduling policy for, and the refusal of a job that
//! could never fit.

use storm_cluster::control::JobRequest;
use storm_cluster::tasks::TaskPlan;

use crate::env::MmEnv;
use crate::policy::JobAsk;

use super::{Job, MachineManager, job_ask};

impl<E: MmEnv> MachineManager<E> {
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
    pub(super) fn constraint_bits(&self, req: &JobRequest) -> u64 {
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
    pub(super) fn most_nodes_for(&self, req: &JobRequest) -> u32 {
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
    pub(super) fn shrink_to_cluster(&self, req: &mut JobRequest) {
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
    pub(super) fn ask_of(&self, req: &JobRequest, plan: &TaskPlan, features: u64) -> JobAsk {
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
}
