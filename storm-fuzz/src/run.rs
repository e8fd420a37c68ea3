//! Drives a target: mutated inputs, each checked for a panic, an allocation its size does not
//! explain, and a hang. The first problem stops the run with the input that caused it.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use crate::guard;
use crate::mutate::{Rng, mutate};
use crate::targets::Target;

/// Inputs are cut to this length: decoders' limits are tested by claimed lengths, which need
/// no bulk behind them.
pub const MAX_INPUT: usize = 4096;

/// What an input may allocate beyond the target's checked limit: serde reserves at most
/// 1 MiB for a sequence before its elements arrive ("cautious" size hints), and every input
/// byte may become a few dozen bytes of decoded structure.
pub fn allowed_allocation(target: &Target, input_len: usize) -> usize {
    (1 << 20) + (1 << 16) + 64 * input_len + target.checked_allocation
}

/// How long one input may run before it counts as a hang.
pub const HANG_AFTER: Duration = Duration::from_secs(10);

/// What went wrong with one input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("panicked: {0}")]
    Panic(String),
    #[error(
        "allocated {largest} bytes at once and held {peak} (at most {allowed} allowed for \
         this input): a length was trusted before its bytes arrived"
    )]
    Allocation {
        largest: usize,
        peak: usize,
        allowed: usize,
    },
}

/// A problem and the input that shows it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{target}: {problem}\ninput ({} bytes): {}", input.len(), to_hex(input))]
pub struct Finding {
    pub target: &'static str,
    pub input: Vec<u8>,
    pub problem: Problem,
}

/// What a clean run did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub target: &'static str,
    pub inputs: u64,
    /// Inputs the target accepted (decoded and passed its checks).
    pub accepted: u64,
    /// The most any input held at once, in bytes.
    pub peak: usize,
    pub elapsed: Duration,
}

impl Summary {
    pub fn per_second(&self) -> f64 {
        self.inputs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

thread_local! {
    /// The input being checked on this thread, for the report of a hopeless allocation.
    static CURRENT: std::cell::RefCell<(&'static str, Vec<u8>)> =
        const { std::cell::RefCell::new(("", Vec::new())) };
    static PANIC_MESSAGE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Panics inside a target are findings, not noise: the hook records them on the fuzzing
/// thread and stays silent there; elsewhere it behaves as before.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.with(|q| q.get()) {
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                PANIC_MESSAGE.with(|m| *m.borrow_mut() = Some(format!("{msg}{at}")));
            } else {
                previous(info);
            }
        }));
    });
}

fn report_hopeless(size: usize) {
    CURRENT.with(|c| {
        let (target, input) = &*c.borrow();
        eprintln!(
            "storm-fuzz: {target}: allocated {size} bytes at once (the process aborts): a \
             length was trusted before its bytes arrived\ninput ({} bytes): {}",
            input.len(),
            to_hex(input)
        );
    });
}

/// Runs one input through `target`: whether it was accepted and what it allocated, or the
/// problem it shows. An allocation too large to survive aborts the process after printing
/// the input.
pub fn check_one(target: &Target, input: &[u8]) -> Result<(bool, guard::Usage), Problem> {
    install_panic_hook();
    guard::on_hopeless(report_hopeless);
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        c.0 = target.name;
        c.1.clear();
        c.1.extend_from_slice(input);
    });
    QUIET.with(|q| q.set(true));
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        guard::measure(|| (target.check)(input))
    }));
    QUIET.with(|q| q.set(false));
    guard::stop();
    let (accepted, usage) = outcome.map_err(|_| {
        Problem::Panic(
            PANIC_MESSAGE
                .with(|m| m.borrow_mut().take())
                .unwrap_or_else(|| "(no message)".into()),
        )
    })?;
    let allowed = allowed_allocation(target, input.len());
    if usage.largest > allowed || usage.peak > allowed * 4 {
        return Err(Problem::Allocation {
            largest: usage.largest,
            peak: usage.peak,
            allowed,
        });
    }
    Ok((accepted, usage))
}

/// Watches a run from another thread: if one input takes longer than [`HANG_AFTER`], it
/// prints the input and aborts the process (a hung decoder cannot be unwound).
struct Watchdog {
    progress: Arc<AtomicU64>,
    current: Arc<Mutex<Vec<u8>>>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(target: &'static str) -> Self {
        let progress = Arc::new(AtomicU64::new(0));
        let current = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let (progress, current, done) = (progress.clone(), current.clone(), done.clone());
            std::thread::spawn(move || {
                let mut last = (0, Instant::now());
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    let now = progress.load(Ordering::Relaxed);
                    if now != last.0 {
                        last = (now, Instant::now());
                    } else if last.1.elapsed() > HANG_AFTER {
                        let input = current.lock().map(|c| c.clone()).unwrap_or_default();
                        eprintln!(
                            "storm-fuzz: {target}: one input ran for more than {HANG_AFTER:?}; \
                             input ({} bytes): {}",
                            input.len(),
                            to_hex(&input)
                        );
                        std::process::abort();
                    }
                }
            })
        };
        Self {
            progress,
            current,
            done,
            thread: Some(thread),
        }
    }

    fn begin(&self, input: &[u8]) {
        if let Ok(mut c) = self.current.lock() {
            c.clear();
            c.extend_from_slice(input);
        }
    }

    fn end(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `inputs` mutated inputs through `target`, starting from its seeds, with the random
/// sequence `seed`. The seeds themselves go first.
pub fn run(target: &'static Target, inputs: u64, seed: u64) -> Result<Summary, Finding> {
    let seeds = (target.seeds)();
    let mut rng = Rng::new(seed);
    let watchdog = Watchdog::start(target.name);
    let start = Instant::now();
    let (mut accepted, mut peak) = (0, 0);
    for i in 0..inputs {
        let input = match seeds.get(i as usize) {
            Some(s) => s.clone(),
            None => {
                let base = &seeds[rng.below(seeds.len())];
                mutate(&mut rng, base, &seeds, target.dictionary, MAX_INPUT)
            }
        };
        watchdog.begin(&input);
        let outcome = check_one(target, &input);
        watchdog.end();
        match outcome {
            Ok((ok, usage)) => {
                accepted += u64::from(ok);
                peak = peak.max(usage.peak);
            }
            Err(problem) => {
                return Err(Finding {
                    target: target.name,
                    input,
                    problem,
                });
            }
        }
    }
    Ok(Summary {
        target: target.name,
        inputs,
        accepted,
        peak,
        elapsed: start.elapsed(),
    })
}

/// Lowercase hex, the form regression files and reports use.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads hex back (whitespace ignored).
pub fn from_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if digits.len() % 2 != 0 {
        return Err(format!("{} hex digits: an odd number", digits.len()));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).map_err(|e| e.to_string())?;
            u8::from_str_radix(s, 16).map_err(|_| format!("{s:?} is not a hex byte"))
        })
        .collect()
}
