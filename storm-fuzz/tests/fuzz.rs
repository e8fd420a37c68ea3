//! The bounded fuzz run CI makes: every target for 100,000 inputs (no panic, no allocation
//! its input does not explain, no hang), and every saved regression input replayed. The long
//! run is `storm-bench fuzz`.

use storm_fuzz::{guard, regressions, run, targets};

#[global_allocator]
static GUARD: storm_fuzz::Guard = storm_fuzz::Guard;

/// The issue asks for at least this many generated inputs per target in CI.
const INPUTS: u64 = 100_000;

fn fuzz(name: &str) {
    assert!(
        guard::installed(),
        "the counting allocator is not installed"
    );
    let target = targets::by_name(name).expect("a target of that name");
    match run::run(target, INPUTS, 0x5709_u64 ^ name.len() as u64) {
        Ok(summary) => {
            // A mutator that never gets past the first bytes would test nothing deep.
            assert!(
                summary.accepted * 100 >= summary.inputs,
                "{name}: only {} of {} inputs accepted: the mutants no longer reach the decoder",
                summary.accepted,
                summary.inputs
            );
            println!(
                "{name}: {} inputs, {} accepted, peak {} bytes, {:.0} inputs/s",
                summary.inputs,
                summary.accepted,
                summary.peak,
                summary.per_second()
            );
        }
        Err(finding) => panic!(
            "{finding}\nsave the input as storm-fuzz/regressions/{name}-<what>.hex with the fix"
        ),
    }
}

#[test]
fn tcp_frames() {
    fuzz("tcp-frame");
}

#[test]
fn rm_messages() {
    fuzz("rm-message");
}

#[test]
fn the_control_protocol() {
    fuzz("control");
}

#[test]
fn journal_records() {
    fuzz("journal");
}

#[test]
fn the_cluster_file() {
    fuzz("cluster-file");
}

#[test]
fn hostlists() {
    fuzz("hostlist");
}

#[test]
fn task_descriptions() {
    fuzz("task-spec");
}

#[test]
fn ofi_bootstrap_records() {
    fuzz("ofi-bootstrap");
}

#[test]
fn enrolled_keys() {
    fuzz("enrollment");
}

#[test]
fn relay_handshakes() {
    fuzz("relay");
}

#[test]
fn peer_handshakes_and_messages() {
    fuzz("peer");
}

#[test]
fn replica_mailboxes() {
    fuzz("replica");
}

#[test]
fn node_records() {
    fuzz("node-record");
}

#[test]
fn every_target_is_fuzzed_here() {
    let here = include_str!("fuzz.rs");
    for t in targets::all() {
        assert!(
            here.contains(&format!("fuzz(\"{}\")", t.name)),
            "target {} has no test here",
            t.name
        );
    }
}

#[test]
fn saved_inputs_that_once_found_problems_stay_fixed() {
    let saved = regressions::load(&regressions::dir()).expect("regression inputs load");
    let failing: Vec<String> = saved
        .iter()
        .filter_map(|s| {
            run::check_one(s.target, &s.input)
                .err()
                .map(|problem| format!("{} fails again: {problem}", s.file.display()))
        })
        .collect();
    assert!(failing.is_empty(), "{}", failing.join("\n"));
    println!("{} saved inputs replayed", saved.len());
}

#[test]
fn the_guard_notices_a_trusted_length() {
    // The check itself must be able to fail: a decoder that reserves what a length claims.
    let target = targets::Target {
        name: "trusting",
        seeds: Vec::new,
        dictionary: &[],
        check: |input| {
            let claimed = u32::from_le_bytes(input[..4].try_into().unwrap()) as usize;
            std::hint::black_box(Vec::<u8>::with_capacity(claimed));
            true
        },
        checked_allocation: 0,
    };
    let huge = 256u32 << 20;
    assert!(matches!(
        run::check_one(&target, &huge.to_le_bytes()),
        Err(run::Problem::Allocation { .. })
    ));
    assert!(run::check_one(&target, &16u32.to_le_bytes()).is_ok());
    assert!(matches!(
        run::check_one(&target, &[1]),
        Err(run::Problem::Panic(_))
    ));
}

#[test]
fn pmi_messages_from_mpi_tasks() {
    fuzz("pmi");
}

#[test]
fn what_the_pmix_helper_says() {
    fuzz("pmix-helper");
}
