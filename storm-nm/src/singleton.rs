//! MPI singletons told, not silent: a rank of a multi-rank job that loaded an MPI library but
//! never spoke to its node's PMI or PMIx server ran `MPI_Init` as a world of one (or never
//! called it). When such a rank ends, its NM says so on the job's standard error (a
//! [`Stream::Notice`](storm_cluster::messages::Stream::Notice)).
//!
//! Whether a rank loaded an MPI library is read from its memory map while it runs
//! ([`crate::env::TaskRunner::mpi_library`]), a few times early in its life and then not at
//! all: [`Probe`] says when. The look stops once the rank has spoken to the PMI server, or the
//! library is found. A rank that is a script starting the MPI program as a child is not looked
//! into (docs/mpi.md).

use std::time::{Duration, Instant};

use storm_cluster::messages::MpiMode;

/// When a rank's memory map is read, after the NM first sees it running: early enough for a
/// hello-world that ends in a few hundred milliseconds, then rarely.
const LOOKS: [Duration; 5] = [
    Duration::from_millis(20),
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_secs(2),
    Duration::from_secs(10),
];

/// One rank's look for an MPI library.
#[derive(Debug, Default)]
pub struct Probe {
    /// When the NM first saw the rank running.
    since: Option<Instant>,
    /// Looks taken so far.
    looks: usize,
    /// The MPI library found in its memory map.
    pub library: Option<String>,
}

impl Probe {
    /// Whether to read the rank's memory map now (and count it as a look).
    pub fn due(&mut self, now: Instant) -> bool {
        if self.library.is_some() {
            return false;
        }
        let since = *self.since.get_or_insert(now);
        match LOOKS.get(self.looks) {
            Some(after) if now.saturating_duration_since(since) >= *after => {
                self.looks += 1;
                true
            }
            _ => false,
        }
    }
}

/// What the job's standard error says of rank `rank` of `size`, which loaded `library` and
/// never spoke to the PMI or PMIx server of node `node`.
pub fn notice(rank: u32, size: u32, node: u32, library: &str, mpi: MpiMode) -> String {
    let why = match mpi {
        MpiMode::None => "--mpi none: storm served it no PMI".to_string(),
        m => format!(
            "storm served PMI-1, PMI-2{} (--mpi {}), and it used none of them",
            if m.serves_pmix() { " and PMIx" } else { "" },
            m.name()
        ),
    };
    format!(
        "storm: rank {rank} of {size} (node {node}) loaded {library} but never contacted the \
         job's PMI or PMIx server: it ran as an MPI singleton (an MPI_COMM_WORLD of 1), not as \
         one of the job's {size} ranks ({why}; see docs/mpi.md, \"Singletons\")\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_come_early_then_stop() {
        let t0 = Instant::now();
        let mut p = Probe::default();
        assert!(
            !p.due(t0),
            "not at once: the task may not have executed yet"
        );
        assert!(p.due(t0 + Duration::from_millis(25)));
        assert!(!p.due(t0 + Duration::from_millis(30)));
        assert!(p.due(t0 + Duration::from_millis(100)));
        assert!(p.due(t0 + Duration::from_secs(1)));
        assert!(p.due(t0 + Duration::from_secs(3)));
        assert!(p.due(t0 + Duration::from_secs(11)));
        assert!(!p.due(t0 + Duration::from_secs(100)), "five looks at most");
    }

    #[test]
    fn a_found_library_ends_the_looks_and_the_notice_names_it() {
        let mut p = Probe {
            library: Some("/usr/lib/libmpi.so.40".into()),
            ..Probe::default()
        };
        assert!(!p.due(Instant::now() + Duration::from_secs(1)));
        let n = notice(3, 4, 1, "/usr/lib/libmpi.so.40", MpiMode::Auto);
        assert!(n.starts_with("storm: rank 3 of 4 (node 1) loaded /usr/lib/libmpi.so.40"));
        assert!(n.contains("PMI-1, PMI-2 and PMIx (--mpi auto)"), "{n}");
        assert!(notice(0, 2, 0, "x", MpiMode::None).contains("--mpi none"));
    }
}
