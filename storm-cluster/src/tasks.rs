//! Turning `-N`, `-n` and `--ntasks-per-node` into nodes and tasks, and placing ranks on
//! nodes. Ranks are placed in blocks, as Slurm's default does: with 10 tasks on 4 nodes the
//! nodes run ranks 0-2, 3-5, 6-7 and 8-9.

use serde::{Deserialize, Serialize};

/// What the user asked for (`None` where the option was not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskRequest {
    pub nodes: Option<u32>,
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
}

/// The decided shape of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPlan {
    pub nodes: u32,
    pub ntasks: u32,
}

impl TaskRequest {
    /// Decides nodes and tasks. `cpus` is the processors of one node (used when only `-n` is
    /// given); `max_per_node` is the cluster's limit of tasks per node and job.
    pub fn plan(&self, cpus: u32, max_per_node: u32) -> Result<TaskPlan, String> {
        if self.nodes == Some(0) || self.ntasks == Some(0) || self.ntasks_per_node == Some(0) {
            return Err("node and task counts must be at least 1".into());
        }
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
            (None, Some(t), None) => TaskPlan {
                nodes: t.div_ceil(cpus.max(1)),
                ntasks: t,
            },
            (None, None, per) => TaskPlan {
                nodes: 1,
                ntasks: per.unwrap_or(1),
            },
        };
        let busiest = plan.ntasks.div_ceil(plan.nodes);
        if busiest > max_per_node {
            return Err(format!(
                "{} tasks on {} nodes put {busiest} tasks on a node; the cluster allows {max_per_node} per node and job",
                plan.ntasks, plan.nodes
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

#[cfg(test)]
mod tests {
    use super::*;

    fn req(nodes: Option<u32>, ntasks: Option<u32>, per: Option<u32>) -> TaskRequest {
        TaskRequest {
            nodes,
            ntasks,
            ntasks_per_node: per,
        }
    }

    #[test]
    fn the_options_combine_like_srun() {
        assert_eq!(
            req(Some(4), None, None).plan(1, 64),
            Ok(TaskPlan {
                nodes: 4,
                ntasks: 4
            })
        );
        assert_eq!(
            req(Some(4), None, Some(3)).plan(1, 64),
            Ok(TaskPlan {
                nodes: 4,
                ntasks: 12
            })
        );
        assert_eq!(
            req(Some(4), Some(10), None).plan(1, 64),
            Ok(TaskPlan {
                nodes: 4,
                ntasks: 10
            })
        );
        assert_eq!(
            req(None, Some(10), Some(4)).plan(1, 64),
            Ok(TaskPlan {
                nodes: 3,
                ntasks: 10
            })
        );
        assert_eq!(
            req(None, Some(10), None).plan(4, 64),
            Ok(TaskPlan {
                nodes: 3,
                ntasks: 10
            })
        );
        assert_eq!(
            req(None, None, None).plan(4, 64),
            Ok(TaskPlan {
                nodes: 1,
                ntasks: 1
            })
        );
    }

    #[test]
    fn impossible_shapes_are_explained() {
        assert!(
            req(Some(4), Some(2), None)
                .plan(1, 64)
                .unwrap_err()
                .contains("cannot cover")
        );
        assert!(
            req(Some(2), Some(10), Some(4))
                .plan(1, 64)
                .unwrap_err()
                .contains("do not fit")
        );
        assert!(
            req(Some(1), Some(100), None)
                .plan(1, 64)
                .unwrap_err()
                .contains("allows 64")
        );
        assert!(req(Some(0), None, None).plan(1, 64).is_err());
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
