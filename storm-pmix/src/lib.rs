//! # storm-pmix
//!
//! The node's PMIx server. A node manager serves PMIx (OpenMPI 5, programs written for
//! `srun --mpi=pmix`, anything linked with libpmix) through a helper process of its own,
//! `storm-pmix`, which hosts the OpenPMIx server library ([`server`]) and speaks to the NM
//! over a socket ([`wire`]):
//!
//! * the library takes connections from any local process over loopback TCP and parses
//!   them in C; in a helper, a fault there or a flood of connections costs PMIx, not the
//!   node manager, and runs as an account of no use to anyone (an NM running as root starts
//!   it as `nobody`, without supplementary groups, not dumpable);
//! * a client proves its account with a MUNGE credential by default (`[cluster] pmix =
//!   "munge"`): over TCP the library's `native` check takes the client's word for it, and
//!   any local user could pose as a rank of another user's job;
//! * the library keeps one server per process: every NM, those of `storm-local` included,
//!   has its own.
//!
//! The decisions (what a fence contributes, when a job ends) are the NM's PMI core
//! (`storm_nm::pmi::job`), as for PMI-1 and PMI-2; docs/mpi.md has the user's view.

pub mod server;
pub mod wire;

#[cfg(test)]
mod tests {
    /// The events the NM's core decides (storm-cluster, which knows nothing of libpmix) are
    /// the library's own numbers (pmix-sys, checked against the installed headers).
    #[test]
    fn the_cores_rank_end_events_are_the_librarys() {
        use storm_cluster::messages::pmix_events as ours;
        assert_eq!(ours::TERM_WO_SYNC, pmix_sys::PMIX_ERR_PROC_TERM_WO_SYNC);
        assert_eq!(ours::ABORTED_BY_SIG, pmix_sys::PMIX_ERR_PROC_ABORTED_BY_SIG);
        assert_eq!(ours::EXIT_NONZERO, pmix_sys::PMIX_ERR_EXIT_NONZERO_TERM);
    }
}
