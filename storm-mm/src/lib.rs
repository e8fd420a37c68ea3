//! # storm-mm: the machine manager
//!
//! One per cluster (paper Sec. 2.2). It will own the job queue, node allocation (buddy tree,
//! Ousterhout matrix), the heartbeat, job launch, termination and failure detection. It reaches
//! the nodes only through `storm-primitives`. Filled in by the job-launch issue.
