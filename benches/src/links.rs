//! `storm-bench links`: what protecting the tcp backend's links costs. The same operations run
//! on clusters whose links are unprotected (the baseline, same run), authenticated (keyed
//! AES-256-GMAC tags), encrypted (AES-256-GCM, the default) and sealed (encrypted, with what the
//! MM's seal adds on the critical path: an ed25519 signature made before a small transfer and
//! checked after it, as a command carries; the BLAKE3 hash a node takes of a program it
//! received): XFER-AND-SIGNAL of a small and a large transfer and COMPARE-AND-WRITE, from node
//! 0 to nodes 1..N. The clusters are measured in turn, round after round, so that a noisy
//! neighbour hits them alike.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use bytes::Bytes;
use storm_primitives::tcp::auth::{ClusterKey, NONCE_LEN, Protection, Transcript};
use storm_primitives::tcp::{TcpConfig, TcpNode};
use storm_primitives::{NodeSet, Primitives, Relation, Wait};

use crate::prims::{BenchLayout, bench_layout};
use crate::report::{Csv, Table, size_label};
use crate::stats::{Samples, fmt_time};

pub const CSV_HEADER: &[&str] = &[
    "protection",
    "op",
    "nodes",
    "bytes",
    "median_s",
    "baseline_median_s",
    "ratio",
    "extra_s",
];

pub struct LinksArgs {
    pub nodes: Vec<u32>,
    pub sizes: Vec<usize>,
    pub rounds: usize,
    pub per_round: usize,
}

/// The links measured: the protection of their frames, and whether the MM's seal is added.
const PROTECTIONS: [(Protection, bool); 4] = [
    (Protection::Unprotected, false),
    (Protection::Authenticate, false),
    (Protection::Encrypt, false),
    (Protection::Encrypt, true),
];

fn name(p: Protection) -> &'static str {
    match p {
        Protection::Unprotected => "unprotected",
        Protection::Authenticate => "authenticated",
        Protection::Encrypt => "encrypted",
    }
}

fn link_name((p, sealed): (Protection, bool)) -> &'static str {
    if sealed { "encrypted+sealed" } else { name(p) }
}

/// What the MM's seal adds to one operation: a small one is a command, signed before it goes
/// and checked where it lands; a large one is a program, which the receiving node hashes
/// (BLAKE3) to compare with the hash its sealed launch names. Returns the time it took.
fn seal_cost(key: &ed25519_dalek::SigningKey, data: &[u8]) -> Duration {
    use ed25519_dalek::{Signer, Verifier};
    let t = Instant::now();
    if data.len() <= 4096 {
        let sig = key.sign(data);
        key.verifying_key()
            .verify(data, &sig)
            .expect("a signature checks with its own key");
    } else {
        std::hint::black_box(blake3::hash(data));
    }
    t.elapsed()
}

/// One XFER-AND-SIGNAL of `data` to `dest`, until the origin's event says it is complete.
pub(crate) fn xfer(
    origin: &dyn Primitives,
    bl: &BenchLayout,
    dest: &NodeSet,
    data: &Bytes,
) -> Result<Duration> {
    xfer_as(origin, bl, dest, data, false)
}

/// One XFER-AND-SIGNAL, all-or-nothing or applied on arrival, timed until the local event.
pub(crate) fn xfer_as(
    origin: &dyn Primitives,
    bl: &BenchLayout,
    dest: &NodeSet,
    data: &Bytes,
    on_arrival: bool,
) -> Result<Duration> {
    let t = Instant::now();
    let (offset, events) = (bl.data_offset, (Some(bl.arrived), Some(bl.done)));
    if on_arrival {
        origin.xfer_and_signal_on_arrival_within(
            dest,
            offset,
            data.clone(),
            events.0,
            events.1,
            None,
        )?;
    } else {
        origin.xfer_and_signal(dest, offset, data.clone(), events.0, events.1)?;
    }
    match origin.test_event(bl.done, Wait::Block) {
        Ok(true) => Ok(t.elapsed()),
        Ok(false) => Err(anyhow!("no completion")),
        Err(e) => Err(anyhow!("transfer failed: {e}")),
    }
}

fn caw(origin: &TcpNode, bl: &BenchLayout, dest: &NodeSet) -> Result<Duration> {
    let t = Instant::now();
    origin.compare_and_write(dest, bl.var, Relation::Ge, 0, None)?;
    Ok(t.elapsed())
}

pub fn run(args: &LinksArgs, csv: &mut Csv) -> Result<Table> {
    let max = args.sizes.iter().copied().max().unwrap_or(8);
    let bl = bench_layout(max)?;
    let mut table = Table::new(
        format!(
            "Link protection on the tcp backend (fanout 2, chunk 256 KiB): node 0 to nodes 1..N, \
             {} rounds of {} operations per cluster, clusters taken in turn; baseline: the same \
             operation on unprotected links, same run",
            args.rounds, args.per_round
        ),
        &[
            "N",
            "operation",
            "protection",
            "median",
            "unprotected",
            "ratio",
            "extra",
        ],
    );
    for &n in &args.nodes {
        let clusters: Vec<Vec<TcpNode>> = PROTECTIONS
            .iter()
            .map(|&(protection, _)| {
                let cfg = TcpConfig {
                    protection,
                    ..TcpConfig::default()
                };
                TcpNode::local_cluster(n + 1, &bl.layout, &cfg)
            })
            .collect::<Result<_, _>>()?;
        let dest = NodeSet::range(1, n);
        let mut ops: Vec<(String, usize)> = args
            .sizes
            .iter()
            .map(|&s| (format!("XFER-AND-SIGNAL {}", size_label(s)), s))
            .collect();
        ops.push(("COMPARE-AND-WRITE".into(), 8));
        // samples[op][protection]
        let mut samples = vec![vec![Vec::new(); PROTECTIONS.len()]; ops.len()];
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        for _ in 0..args.rounds {
            for (o, (label, size)) in ops.iter().enumerate() {
                let data = Bytes::from(vec![0x5au8; *size]);
                for (p, cluster) in clusters.iter().enumerate() {
                    let sealed = PROTECTIONS[p].1;
                    for _ in 0..args.per_round {
                        let d = if label.starts_with("COMPARE") {
                            // The MM's checks of nodes are not commands: no seal.
                            caw(&cluster[0], &bl, &dest)?
                        } else if sealed {
                            xfer(&cluster[0], &bl, &dest, &data)? + seal_cost(&key, &data)
                        } else {
                            xfer(&cluster[0], &bl, &dest, &data)?
                        };
                        samples[o][p].push(d.as_secs_f64());
                    }
                }
            }
        }
        for (o, (label, size)) in ops.iter().enumerate() {
            let base = Samples::from_secs(samples[o][0].clone()).median();
            for (p, &link) in PROTECTIONS.iter().enumerate() {
                let med = Samples::from_secs(samples[o][p].clone()).median();
                table.push(vec![
                    n.to_string(),
                    label.clone(),
                    link_name(link).into(),
                    fmt_time(med),
                    fmt_time(base),
                    format!("{:.3}", med / base),
                    fmt_time(med - base),
                ]);
                csv.push(vec![
                    link_name(link).into(),
                    label.split(' ').next().unwrap_or_default().into(),
                    n.to_string(),
                    size.to_string(),
                    format!("{med:.9}"),
                    format!("{base:.9}"),
                    format!("{:.4}", med / base),
                    format!("{:.9}", med - base),
                ]);
            }
        }
        for c in clusters {
            for node in c {
                node.shutdown();
            }
        }
    }
    Ok(table)
}

/// What sealing one frame and checking it cost in CPU time, without the network: the share of
/// a small operation that protection adds (each operation sends a few such frames), and the
/// per-byte cost of a transfer chunk. The baseline is copying the frame's body once, measured
/// in the same run.
pub fn frame_costs(sizes: &[usize]) -> Table {
    let mut table = Table::new(
        "Sealing and checking one frame, in process (no network); baseline: one memcpy of the \
         frame's body, same run"
            .to_string(),
        &[
            "body",
            "protection",
            "seal+check",
            "memcpy",
            "ratio",
            "GB/s",
        ],
    );
    let t = Transcript::new(
        1,
        0,
        2,
        0,
        Protection::Authenticate,
        &[1; NONCE_LEN],
        &[2; NONCE_LEN],
    );
    let key = ClusterKey::random();
    let head = [0u8; 24];
    for &size in sizes {
        let body = Bytes::from(vec![0x5au8; size]);
        // Enough repetitions for about 50 ms of work at a few GB/s, and at least 1,000.
        let reps = (200_000_000 / size.max(1)).clamp(1_000, 1_000_000);
        let mut copy = vec![0u8; size];
        let memcpy = per_rep(reps, || {
            copy.copy_from_slice(&body);
            std::hint::black_box(&copy);
        });
        for protection in [Protection::Authenticate, Protection::Encrypt] {
            let mut sealer = t.session(&key, protection, true).sealer;
            let mut opener = t.session(&key, protection, false).opener;
            let mut buf = vec![0u8; size];
            let cost = per_rep(reps, || {
                let (sealed, tag) = sealer.seal(&head, body.clone());
                buf.copy_from_slice(&sealed);
                opener
                    .open(&head, &mut buf, &tag)
                    .expect("a frame sealed by its own session opens");
            });
            // The copy into `buf` stands for the read from the socket, which the unprotected
            // link does too; it is not counted as protection's cost.
            let extra = (cost - memcpy).max(0.0);
            table.push(vec![
                size_label(size),
                name(protection).into(),
                fmt_time(extra),
                fmt_time(memcpy),
                format!("{:.2}", extra / memcpy),
                format!("{:.2}", size as f64 / extra.max(1e-12) / 1e9),
            ]);
        }
    }
    table
}

/// What the MM's seal costs in CPU time, in process: signing a heartbeat that launches a job
/// (at the MM, once per heartbeat) and checking it (at each node it concerns). Baseline: one
/// memcpy of the heartbeat's bytes, same run.
pub fn seal_costs() -> Table {
    use ed25519_dalek::{Signer, Verifier};
    use storm_cluster::messages::{Command, LaunchSpec, MpiMode, Program};
    let mut table = Table::new(
        "The MM's seal on a heartbeat that launches a job, in process; baseline: one memcpy of the \
         heartbeat's encoded bytes, same run"
            .to_string(),
        &["step", "time", "memcpy", "ratio"],
    );
    let launch = Command::Launch(LaunchSpec {
        job: 42,
        slot: 3,
        nodes: "0-15".parse().expect("a node set"),
        ntasks: 64,
        program: Program::Spooled("a.out".into()),
        program_hash: Some([7; 32]),
        args: vec!["-n".into(), "100".into()],
        env: (0..30)
            .map(|i| (format!("VAR{i}").into(), "x".repeat(40).into()))
            .collect(),
        cwd: "/home/user/run".into(),
        uid: 1000,
        gid: 1000,
        reporter: 15,
        mpi: MpiMode::Both,
        input: Default::default(),
        batch: None,
        mem: None,
        kill_on_bad_exit: false,
        exit_wait_s: 0,
        cpu_bind: None,
        cpus: None,
    });
    let bytes =
        storm_cluster::messages::encode("heartbeat", &[launch], 1 << 20).expect("a launch encodes");
    let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let public = key.verifying_key();
    let sig = key.sign(&bytes);
    let reps = 2_000;
    let mut copy = vec![0u8; bytes.len()];
    let memcpy = per_rep(reps * 10, || {
        copy.copy_from_slice(&bytes);
        std::hint::black_box(&copy);
    });
    let sign = per_rep(reps, || {
        std::hint::black_box(key.sign(&bytes));
    });
    let check = per_rep(reps, || {
        public.verify(&bytes, &sig).expect("checks");
    });
    for (step, t) in [
        (format!("MM signs ({} B)", bytes.len()), sign),
        ("a node checks".to_string(), check),
    ] {
        table.push(vec![
            step,
            fmt_time(t),
            fmt_time(memcpy),
            format!("{:.0}", t / memcpy),
        ]);
    }
    table
}

/// Mean seconds per call of `f` over `reps` calls.
fn per_rep(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() / reps as f64
}
