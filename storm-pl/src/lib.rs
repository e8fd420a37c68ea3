//! # storm-pl: the program launcher
//!
//! One per application process (paper Sec. 2.2). It will set up a process's environment and
//! run it, reporting its exit to the node manager through shared memory. Filled in by the
//! job-launch issue.
