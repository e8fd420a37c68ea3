//! The NM's sampling thread: once per sample period (`[monitoring] sample_ms`) it samples the
//! node ([`crate::sample`]), judges its health (`[health]`, with the site program's last
//! verdict, [`crate::health`]), reads what its jobs and fabric ports used
//! ([`crate::usage`]), and puts the three records into the node's slots in the MM's global
//! memory with one XFER-AND-SIGNAL (no signal: the MM reads the slots when it is
//! asked, and looks at the verdicts once per period). The node's inventory goes first, and
//! again with every tenth sample, so that an MM that restarted (or a new leader) has it
//! without asking.
//!
//! A transfer that fails (the MM is restarting, or a new leader is being elected) costs that
//! sample only: the next one goes in the next period. What a sample costs the node is
//! measured by `storm-bench sample`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use storm_cluster::RmLayout;
use storm_cluster::health::{HealthSection, NodeHealth};
use storm_cluster::sample::RECORD_BYTES;
use storm_cluster::usage::USAGE_BYTES;
use storm_primitives::{NodeId, NodeSet, Primitives, Wait};

use crate::health::HealthProgram;
use crate::sample::{Sampler, SamplerOptions};
use crate::usage::UsageSampler;

/// Samples between two copies of the inventory.
const INVENTORY_EVERY: u64 = 10;

/// The sampling thread; dropped, it stops.
pub struct Monitor {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts sampling node `node` (named `name`) every `opts.period` and judging it by
    /// `health`, its records going to the MM at `mm`. `jobs` is how many jobs the NM holds
    /// (the core keeps it current).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        prims: Arc<dyn Primitives>,
        rm: &RmLayout,
        node: NodeId,
        name: &str,
        mm: NodeId,
        opts: SamplerOptions,
        health: HealthSection,
        jobs: Arc<AtomicUsize>,
        timeout: Duration,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel();
        let program = match &health.program {
            Some(p) => Some(HealthProgram::start(
                p.clone(),
                health.program_every(),
                health.program_timeout(),
                name.to_string(),
            )?),
            None => None,
        };
        let (sample_at, inventory_at) = (
            rm.sample_offset(node as usize),
            rm.inventory_record_offset(node as usize),
        );
        let sent = rm.record_sent;
        let period = opts.period;
        let thread = std::thread::Builder::new()
            .name("storm-sample".into())
            .spawn(move || {
                let mut usage = UsageSampler::new(opts.cgroup.clone(), &opts.sys_dir);
                let mut sampler = Sampler::new(opts);
                let send = |offset: u64, bytes: &[u8]| {
                    let dest = NodeSet::single(mm);
                    let data = Bytes::copy_from_slice(bytes);
                    match prims.xfer_and_signal_within(
                        &dest,
                        offset,
                        data,
                        None,
                        Some(sent),
                        Some(timeout),
                    ) {
                        Ok(()) => {
                            if let Err(e) = prims.test_event(sent, Wait::Timeout(timeout * 2)) {
                                tracing::debug!("a node record did not reach the MM: {e}");
                            }
                        }
                        Err(e) => tracing::debug!("a node record did not go out: {e}"),
                    }
                };
                let inventory = sampler.inventory();
                let mut taken = 0u64;
                loop {
                    if taken % INVENTORY_EVERY == 0 {
                        send(inventory_at, &inventory.encode());
                    }
                    let sample = sampler.take(
                        storm_cluster::daemon::unix_ms(),
                        jobs.load(Ordering::Relaxed),
                    );
                    let mut problems = health.judge(&sample, &sampler.unreadable);
                    problems.extend(program.as_ref().and_then(HealthProgram::verdict));
                    let verdict = NodeHealth::of(sample.seq, sample.taken_ms, &problems);
                    let used = usage.take(sample.seq, sample.taken_ms);
                    // The sample, its verdict and the usage are neighbours: one transfer.
                    let mut all = [0u8; 2 * RECORD_BYTES + USAGE_BYTES];
                    all[..RECORD_BYTES].copy_from_slice(&sample.encode());
                    all[RECORD_BYTES..2 * RECORD_BYTES].copy_from_slice(&verdict.encode());
                    all[2 * RECORD_BYTES..].copy_from_slice(&used.encode());
                    send(sample_at, &all);
                    taken += 1;
                    match stopped.recv_timeout(period) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        // Told to stop, or the NM dropped its handle.
                        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
