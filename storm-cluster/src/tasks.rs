//! Turning `-N`, `-n`, `--ntasks-per-node` and `--overcommit` into nodes and tasks, as srun
//! does, and placing ranks on nodes.
//!
//! * `-n T` alone takes as many nodes as T tasks need at one task per CPU, filling each
//!   node's CPUs in order: `-n 8` on nodes of 2 CPUs runs 2 tasks on each of 4 nodes.
//! * `-N N` alone runs one task per node; with `--ntasks-per-node K`, K per node.
//! * `-N N -n T` spreads T tasks over exactly N nodes.
//! * `-n T --ntasks-per-node K` takes ceil(T/K) nodes.
//! * More tasks on a node than it has CPUs is an error that says how many there are, unless
//!   `--overcommit` allows several tasks per CPU (with `-n` alone it then takes at most the
//!   whole cluster and shares its CPUs).
//!
//! Ranks are placed in blocks, as Slurm's default block distribution does: with 10 tasks on 4
//! nodes the nodes run ranks 0-2, 3-5, 6-7 and 8-9. A job on one node whose tasks leave some
//! of its CPUs free takes only as many CPUs as it has tasks (other jobs share the node),
//! unless `--exclusive`; any other job takes whole nodes. A cluster whose nodes have
//! different CPU counts is planned as if each had the smallest count.

use serde::{Deserialize, Serialize};

/// What the user asked for (`None` where the option was not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskRequest {
    pub nodes: Option<u32>,
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
    /// Allow more tasks on a node than it has CPUs (`--overcommit`, srun's `-O`).
    pub overcommit: bool,
    /// Take whole nodes even if the tasks fit in some CPUs of one (`--exclusive`).
    pub exclusive: bool,
}

/// The decided shape of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPlan {
    pub nodes: u32,
    pub ntasks: u32,
}

impl TaskRequest {
    /// The request of a job of `plan` shrunk to `nodes` nodes (`--less`): as many tasks per
    /// node as its fullest node had, and never more tasks than it asked for.
    pub fn shrunk(&self, plan: &TaskPlan, nodes: u32) -> TaskRequest {
        let per_node = plan.ntasks.div_ceil(plan.nodes.max(1));
        TaskRequest {
            nodes: Some(nodes),
            ntasks: Some(plan.ntasks.min(per_node.saturating_mul(nodes)).max(nodes)),
            ..*self
        }
    }
}

/// What a cluster offers a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Nodes in the cluster.
    pub nodes: u32,
    /// CPUs of the smallest node: what every node is planned with.
    pub cpus_per_node: u32,
    /// CPUs of the largest node (equal to `cpus_per_node` on a uniform cluster).
    pub max_cpus_per_node: u32,
    /// The cluster's limit of tasks per node and job, overcommitted or not.
    pub max_tasks_per_node: u32,
}

impl Capacity {
    /// A cluster of `nodes` nodes of `cpus` CPUs each.
    pub fn uniform(nodes: u32, cpus: u32, max_tasks_per_node: u32) -> Self {
        Self {
            nodes,
            cpus_per_node: cpus,
            max_cpus_per_node: cpus,
            max_tasks_per_node,
        }
    }

    /// "4 nodes of 2 CPUs" (and how a mixed cluster is counted).
    fn describe(&self) -> String {
        let nodes = plural(self.nodes, "node");
        if self.max_cpus_per_node > self.cpus_per_node {
            format!(
                "{nodes} of {} to {} CPUs, planned as {} each",
                self.cpus_per_node, self.max_cpus_per_node, self.cpus_per_node
            )
        } else {
            format!("{nodes} of {}", plural(self.cpus_per_node, "CPU"))
        }
    }
}

fn plural(n: u32, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

impl TaskRequest {
    /// Decides nodes and tasks on a cluster of capacity `cap`, or says why the request does
    /// not fit.
    pub fn plan(&self, cap: &Capacity) -> Result<TaskPlan, String> {
        if self.nodes == Some(0) || self.ntasks == Some(0) || self.ntasks_per_node == Some(0) {
            return Err("node and task counts must be at least 1".into());
        }
        let cpus = cap.cpus_per_node.max(1);
        let plan = match (self.nodes, self.ntasks, self.ntasks_per_node) {
            (Some(n), Some(t), per) => {
                if t < n {
                    return Err(format!(
                        "{t} tasks cannot cover {n} nodes (each node needs at least one task)"
                    ));
                }
                if let Some(k) = per
                    && t > n.saturating_mul(k)
                {
                    return Err(format!(
                        "{t} tasks do not fit on {n} nodes at {k} tasks per node"
                    ));
                }
                TaskPlan {
                    nodes: n,
                    ntasks: t,
                }
            }
            (Some(n), None, per) => TaskPlan {
                nodes: n,
                ntasks: n.saturating_mul(per.unwrap_or(1)),
            },
            (None, Some(t), Some(k)) => TaskPlan {
                nodes: t.div_ceil(k),
                ntasks: t,
            },
            (None, Some(t), None) => {
                let need = t.div_ceil(cpus);
                if need <= cap.nodes {
                    TaskPlan {
                        nodes: need,
                        ntasks: t,
                    }
                } else if self.overcommit {
                    TaskPlan {
                        nodes: cap.nodes.max(1),
                        ntasks: t,
                    }
                } else {
                    return Err(format!(
                        "the job asks for {t} tasks but the cluster has {} CPUs ({}); use \
                         --overcommit to run more tasks than CPUs",
                        cap.nodes.saturating_mul(cpus),
                        cap.describe()
                    ));
                }
            }
            (None, None, per) => TaskPlan {
                nodes: 1,
                ntasks: per.unwrap_or(1),
            },
        };
        if plan.nodes > cap.nodes {
            return Err(format!(
                "the job asks for {} but the cluster has {}",
                plural(plan.nodes, "node"),
                cap.nodes
            ));
        }
        let busiest = plan.ntasks.div_ceil(plan.nodes);
        if busiest > cap.max_tasks_per_node {
            return Err(format!(
                "{} tasks on {} put {busiest} tasks on a node; the cluster allows {} per node and job",
                plan.ntasks,
                plural(plan.nodes, "node"),
                cap.max_tasks_per_node
            ));
        }
        if busiest > cpus && !self.overcommit {
            return Err(format!(
                "{} tasks on {} put {busiest} tasks on a node, which has {} (the cluster has {}); \
                 ask for more nodes with -N, or allow several tasks per CPU with --overcommit",
                plan.ntasks,
                plural(plan.nodes, "node"),
                plural(cpus, "CPU"),
                cap.describe()
            ));
        }
        Ok(plan)
    }
}

/// Ranks on the `k`-th node (in node-set order) of a job of `ntasks` tasks on `nnodes`
/// nodes: `(first rank, count)`.
pub fn ranks_on(ntasks: u32, nnodes: u32, k: u32) -> (u32, u32) {
    let base = ntasks / nnodes;
    let extra = ntasks % nnodes;
    let count = base + u32::from(k < extra);
    let first = k * base + k.min(extra);
    (first, count)
}

/// Which node (its position `k` in node-set order) holds `rank` of a job of `ntasks` tasks
/// on `nnodes` nodes; `None` for a rank the job does not have.
pub fn node_of_rank(ntasks: u32, nnodes: u32, rank: u32) -> Option<u32> {
    (0..nnodes).find(|&k| {
        let (first, count) = ranks_on(ntasks, nnodes, k);
        (first..first + count).contains(&rank)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(nodes: Option<u32>, ntasks: Option<u32>, per: Option<u32>) -> TaskRequest {
        TaskRequest {
            nodes,
            ntasks,
            ntasks_per_node: per,
            overcommit: false,
            exclusive: false,
        }
    }

    fn plan(nodes: u32, ntasks: u32) -> Result<TaskPlan, String> {
        Ok(TaskPlan { nodes, ntasks })
    }

    /// 4 nodes of 2 CPUs, 64 tasks per node at most.
    fn four_by_two() -> Capacity {
        Capacity::uniform(4, 2, 64)
    }

    /// `--less`: a job shrunk to fewer nodes keeps as many tasks per node as its fullest
    /// node had, never more tasks than it asked for, and at least one per node.
    #[test]
    fn a_shrunk_job_keeps_its_tasks_per_node() {
        let cap = Capacity::uniform(64, 4, 64);
        let shrink = |r: TaskRequest, to: u32| {
            let p = r.plan(&cap).unwrap();
            r.shrunk(&p, to).plan(&cap)
        };
        assert_eq!(shrink(req(Some(5), None, None), 2), plan(2, 2));
        assert_eq!(shrink(req(Some(4), None, Some(3)), 2), plan(2, 6));
        assert_eq!(shrink(req(None, Some(8), None), 1), plan(1, 4));
        assert_eq!(shrink(req(Some(4), Some(10), None), 2), plan(2, 6));
        assert_eq!(shrink(req(Some(4), Some(5), None), 3), plan(3, 5));
    }

    #[test]
    fn n_alone_fills_each_nodes_cpus_like_srun() {
        let cap = four_by_two();
        assert_eq!(req(None, Some(8), None).plan(&cap), plan(4, 8));
        assert_eq!(req(None, Some(5), None).plan(&cap), plan(3, 5));
        assert_eq!(req(None, Some(2), None).plan(&cap), plan(1, 2));
        assert_eq!(req(None, Some(1), None).plan(&cap), plan(1, 1));
    }

    #[test]
    fn big_n_alone_runs_one_task_per_node() {
        let cap = four_by_two();
        assert_eq!(req(Some(4), None, None).plan(&cap), plan(4, 4));
        assert_eq!(req(Some(3), None, Some(2)).plan(&cap), plan(3, 6));
        assert_eq!(req(None, None, None).plan(&cap), plan(1, 1));
    }

    #[test]
    fn big_n_with_n_spreads_over_exactly_those_nodes() {
        let cap = four_by_two();
        assert_eq!(req(Some(4), Some(6), None).plan(&cap), plan(4, 6));
        assert_eq!(req(Some(2), Some(4), None).plan(&cap), plan(2, 4));
        assert_eq!(req(None, Some(6), Some(2)).plan(&cap), plan(3, 6));
    }

    #[test]
    fn more_tasks_than_cpus_is_an_error_that_counts_them() {
        let cap = four_by_two();
        let err = req(None, Some(9), None).plan(&cap).unwrap_err();
        assert!(err.contains("9 tasks"), "{err}");
        assert!(err.contains("8 CPUs (4 nodes of 2 CPUs)"), "{err}");
        assert!(err.contains("--overcommit"), "{err}");
        let err = req(Some(2), Some(6), None).plan(&cap).unwrap_err();
        assert!(err.contains("3 tasks on a node, which has 2 CPUs"), "{err}");
        let err = req(Some(1), None, Some(3)).plan(&cap).unwrap_err();
        assert!(err.contains("which has 2 CPUs"), "{err}");
    }

    #[test]
    fn overcommit_shares_cpus_but_keeps_the_per_node_limit() {
        let cap = four_by_two();
        let over = |nodes, ntasks, per| TaskRequest {
            overcommit: true,
            ..req(nodes, ntasks, per)
        };
        assert_eq!(over(None, Some(12), None).plan(&cap), plan(4, 12));
        assert_eq!(over(None, Some(3), None).plan(&cap), plan(2, 3));
        assert_eq!(over(Some(2), Some(6), None).plan(&cap), plan(2, 6));
        let err = over(Some(1), Some(100), None).plan(&cap).unwrap_err();
        assert!(err.contains("allows 64"), "{err}");
    }

    #[test]
    fn impossible_shapes_are_explained() {
        let cap = Capacity::uniform(8, 64, 64);
        assert!(
            req(Some(4), Some(2), None)
                .plan(&cap)
                .unwrap_err()
                .contains("cannot cover")
        );
        assert!(
            req(Some(2), Some(10), Some(4))
                .plan(&cap)
                .unwrap_err()
                .contains("do not fit")
        );
        let err = req(Some(9), None, None).plan(&cap).unwrap_err();
        assert!(
            err.contains("asks for 9 nodes but the cluster has 8"),
            "{err}"
        );
        assert!(req(Some(0), None, None).plan(&cap).is_err());
    }

    #[test]
    fn a_mixed_cluster_is_planned_with_its_smallest_node() {
        let cap = Capacity {
            nodes: 4,
            cpus_per_node: 2,
            max_cpus_per_node: 8,
            max_tasks_per_node: 64,
        };
        assert_eq!(req(None, Some(8), None).plan(&cap), plan(4, 8));
        let err = req(None, Some(9), None).plan(&cap).unwrap_err();
        assert!(
            err.contains("4 nodes of 2 to 8 CPUs, planned as 2 each"),
            "{err}"
        );
    }

    #[test]
    fn ranks_are_placed_in_blocks_covering_every_rank_once() {
        let placed: Vec<_> = (0..4).map(|k| ranks_on(10, 4, k)).collect();
        assert_eq!(placed, vec![(0, 3), (3, 3), (6, 2), (8, 2)]);
        for (t, n) in [(7u32, 7u32), (100, 7), (5, 1), (64, 32)] {
            let mut next = 0;
            for k in 0..n {
                let (first, count) = ranks_on(t, n, k);
                assert_eq!(first, next);
                assert!(count >= 1);
                next += count;
            }
            assert_eq!(next, t);
        }
    }
}
