//! # storm-nm: the node manager
//!
//! One per compute node (paper Sec. 2.2). It will receive heartbeats, write transferred
//! programs to node-local storage, start program launchers and report terminations, talking to
//! the machine manager only through `storm-primitives`. Filled in by the job-launch issue.
