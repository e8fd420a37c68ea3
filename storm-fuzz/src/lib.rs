//! Fuzzing for every decoder of bytes storm receives: tcp frames, the RM messages in global
//! memory, the control socket, journal records, the cluster file, hostlists, a PL's task
//! description and the ofi bootstrap records ([`targets`]).
//!
//! cargo-fuzz needs a nightly compiler; storm builds with stable Rust alone, so the inputs
//! come from a deterministic mutator ([`mutate`]) that edits each target's valid seeds. Each
//! input runs under [`run::check_one`], which reports a panic, an allocation larger than the
//! input and the decoder's checked limits explain ([`guard`]), and, from a watchdog, a hang.
//!
//! * `cargo test -p storm-fuzz` runs every target for 100,000 inputs (CI) and replays every
//!   input saved under `storm-fuzz/regressions/` (inputs that once found a problem);
//! * `storm-bench fuzz --inputs 10000000` is the long run, with its rate per target.
//!
//! A finding prints the target, the problem and the input in hex; save it as
//! `regressions/<target>-<what>.hex` when fixing it.

pub mod guard;
pub mod mutate;
pub mod regressions;
pub mod run;
pub mod targets;

pub use guard::Guard;
