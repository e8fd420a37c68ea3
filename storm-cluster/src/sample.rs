//! A node's sample: what its NM measured at one instant, as a fixed-size record.
//!
//! Every NM samples its node once per sample period (`[monitoring] sample_ms`, 1 s by
//! default) and puts the record, [`RECORD_BYTES`] long, into a slot of its own in the MM's
//! global memory, as Fountain's daemons keep their metrics for a query to gather. A query at
//! the MM then reads memory it already holds: no connection per node, no round per query.
//!
//! Two records describe a node:
//!
//! * [`NodeSample`], the dynamic figures of the last sample period: CPU utilization in total
//!   and per CPU, load averages, memory available, swap used, free space where the spool and
//!   the state live, the network interfaces' counters, the NM's own CPU, the jobs it holds;
//! * [`NodeInventory`], the static ones: CPUs, model, clock, RAM, swap, kernel, architecture.
//!
//! Where the CPU and memory figures come from is part of the record ([`Source`]): the host's
//! `/proc` on a node that is a host of its own, or the node's cgroup subtree where nodes share
//! one kernel (the namespace testbed), where `/proc/stat` and `/proc/meminfo` are the same for
//! every node.
//!
//! A record is written whole by one transfer, but a reader may see it while the next one
//! lands: its sequence number opens and closes it, and a record whose two differ is torn
//! ([`RecordError::Torn`]) and read again at the next look. Sequence 0 is a slot never
//! written. Decoding checks every field's range: bytes from the network never panic, and a
//! record that does not make sense says which field is wrong.

use thiserror::Error;

/// Bytes of each record, in memory and on the wire.
pub const RECORD_BYTES: usize = 256;

/// The records' format version (the byte after the opening sequence number).
pub const SAMPLE_VERSION: u8 = 1;
const INVENTORY_VERSION: u8 = 0x81;

/// Per-CPU utilization is kept for this many CPUs at most (the record's fixed size); a node
/// with more shows its first ones and says how many it has.
pub const MAX_CPUS_RECORDED: usize = 120;

/// Where a sample's CPU and memory figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The host's `/proc/stat` and `/proc/meminfo`: the node is a host of its own.
    #[default]
    Host,
    /// The node's cgroup subtree (its jobs): nodes share one kernel.
    NodeCgroup,
}

/// The dynamic figures of one sample.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct NodeSample {
    /// Larger for every sample of this NM process; never 0 once written.
    pub seq: u64,
    /// When it was taken (Unix time, ms).
    pub taken_ms: u64,
    /// The sample period it was taken at (ms).
    pub period_ms: u32,
    pub source: Source,
    /// CPUs the figures are over.
    pub cpus: u16,
    /// Jobs the NM holds.
    pub jobs: u16,
    /// CPU utilization of the node over the last period, 0.0 to 1.0 (Fountain's `--cpu`).
    pub cpu_util: f32,
    /// Utilization of each CPU over the last period, in percent (at most
    /// [`MAX_CPUS_RECORDED`]; empty where the source cannot tell CPUs apart).
    pub per_cpu: Vec<u8>,
    /// The kernel's load averages over 1, 5 and 15 minutes.
    pub load: [f32; 3],
    /// The NM's own CPU over the last period, as a fraction of one CPU.
    pub nm_cpu: f32,
    pub mem_total: u64,
    pub mem_avail: u64,
    pub swap_total: u64,
    pub swap_used: u64,
    /// Free bytes where `spool_dir` lives (for unprivileged users, as `df`).
    pub spool_free: u64,
    /// Free bytes where `state_dir` lives.
    pub state_free: u64,
    /// Counters of the node's network interfaces, loopback left out, summed.
    pub net_rx_bytes: u64,
    pub net_tx_bytes: u64,
    pub net_rx_packets: u64,
    pub net_tx_packets: u64,
}

// Samples are taken and decoded finite (`decode` rejects NaN): equality is reflexive.
impl Eq for NodeSample {}

/// A sample is stale once it is this many sample periods old: the node stopped sampling
/// (frozen, down, or cut off from the MM), and its figures are the last it sent.
pub const STALE_PERIODS: u64 = 3;

/// What the MM shows of a node's records (`storm nodes --long`, `--json`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NodeRecords {
    pub sample: Option<NodeSample>,
    pub inventory: Option<NodeInventory>,
    /// What its jobs and fabric ports used, taken with the sample.
    #[serde(default)]
    pub usage: Option<crate::usage::NodeUsage>,
    /// The sample's age by the MM's clock (ms; 0 for one from the future).
    pub age_ms: u64,
    /// Older than [`STALE_PERIODS`] sample periods: never shown as fresh.
    pub stale: bool,
    /// Why a record could not be read, if one could not.
    pub error: Option<String>,
}

impl NodeRecords {
    /// The records of a node whose slots hold `sample`, `usage` and `inventory` (each read
    /// whole, or torn), at `now_ms` by the MM's clock, sampled every `period_ms`.
    pub fn judge(
        sample: Result<Option<NodeSample>, RecordError>,
        usage: Result<Option<crate::usage::NodeUsage>, RecordError>,
        inventory: Result<Option<NodeInventory>, RecordError>,
        now_ms: u64,
        period_ms: u64,
    ) -> Self {
        let mut error = None;
        let sample = sample.unwrap_or_else(|e| {
            error = Some(e.to_string());
            None
        });
        let inventory = inventory.unwrap_or_else(|e| {
            error.get_or_insert(e.to_string());
            None
        });
        let usage = usage.unwrap_or_else(|e| {
            error.get_or_insert(e.to_string());
            None
        });
        let age_ms = sample
            .as_ref()
            .map_or(0, |s| now_ms.saturating_sub(s.taken_ms));
        let period = sample
            .as_ref()
            .map_or(period_ms, |s| u64::from(s.period_ms).max(period_ms));
        NodeRecords {
            stale: sample.is_none() || age_ms > STALE_PERIODS * period,
            sample,
            inventory,
            usage,
            age_ms,
            error,
        }
    }
}

/// One point of a node's history (`storm nodes --history`): the figures of one sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HistoryPoint {
    /// When it was taken (Unix time, ms, by the node's clock).
    pub taken_ms: u64,
    /// CPU utilization, 0.0 to 1.0.
    pub cpu_util: f32,
    /// The 1-minute load average.
    pub load1: f32,
    /// Memory available (bytes; kept to the MiB).
    pub mem_avail: u64,
}

/// A node's history as the MM keeps it, oldest point first.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeTrace {
    pub name: String,
    /// The node's memory at its last sample.
    pub mem_total: u64,
    pub points: Vec<HistoryPoint>,
}

// Points are taken and kept finite (the MM packs them from checked records): equality is
// reflexive.
impl Eq for HistoryPoint {}
impl Eq for NodeTrace {}

/// The static figures of a node.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NodeInventory {
    pub seq: u64,
    /// Online CPUs of the host.
    pub cpus: u16,
    /// Clock of the first CPU (MHz, as `/proc/cpuinfo` says; 0 if it does not).
    pub mhz: u32,
    pub ram: u64,
    pub swap: u64,
    /// CPU model (at most [`MODEL_BYTES`] bytes).
    pub model: String,
    /// Kernel release (`uname -r`, at most [`KERNEL_BYTES`]).
    pub kernel: String,
    /// Machine architecture (`uname -m`, at most [`ARCH_BYTES`]).
    pub arch: String,
}

pub const MODEL_BYTES: usize = 112;
pub const KERNEL_BYTES: usize = 64;
pub const ARCH_BYTES: usize = 24;

/// Why bytes are not a record.
#[derive(Debug, Error, PartialEq)]
pub enum RecordError {
    #[error("a node record is {1} bytes, not {0}")]
    Length(usize, usize),
    #[error(
        "the node record was being written while it was read (sequence {0} opens it, {1} closes it)"
    )]
    Torn(u64, u64),
    #[error("node record version {0} is not one this storm reads")]
    Version(u8),
    #[error("node record field {field} holds {value}, out of range")]
    Field { field: &'static str, value: String },
}

/// Offsets of the sample's fields.
pub(crate) mod at {
    pub const SEQ: usize = 0;
    pub const VERSION: usize = 8;
    pub const SOURCE: usize = 9;
    pub const CPUS: usize = 10;
    pub const PER_CPU_COUNT: usize = 12;
    pub const JOBS: usize = 14;
    pub const TAKEN: usize = 16;
    pub const PERIOD: usize = 24;
    pub const CPU_UTIL: usize = 28;
    pub const LOAD: usize = 32;
    pub const NM_CPU: usize = 44;
    pub const MEM_TOTAL: usize = 48;
    pub const MEM_AVAIL: usize = 56;
    pub const SWAP_TOTAL: usize = 64;
    pub const SWAP_USED: usize = 72;
    pub const SPOOL_FREE: usize = 80;
    pub const STATE_FREE: usize = 88;
    pub const NET: usize = 96;
    pub const PER_CPU: usize = 128;
    pub const TRAILER: usize = super::RECORD_BYTES - 8;
}

pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_f32(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
pub(crate) fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn out_of_range(field: &'static str, value: impl std::fmt::Display) -> RecordError {
    RecordError::Field {
        field,
        value: value.to_string(),
    }
}

/// Whether `bytes` are all zero (a record's padding): compared a block at a time, as a
/// gather of every node's records checks hundreds of bytes per node.
pub(crate) fn zeros(bytes: &[u8]) -> bool {
    const BLOCK: [u8; 64] = [0; 64];
    bytes.chunks(BLOCK.len()).all(|c| c == &BLOCK[..c.len()])
}

/// A fraction checked to be finite and within `0.0..=max`.
fn fraction(field: &'static str, v: f32, max: f32) -> Result<f32, RecordError> {
    if v.is_finite() && (0.0..=max).contains(&v) {
        Ok(v)
    } else {
        Err(out_of_range(field, v))
    }
}

/// The sequence numbers that open and close `bytes`, checked: `None` for a slot never
/// written.
pub(crate) fn sealed(bytes: &[u8]) -> Result<Option<u64>, RecordError> {
    sealed_at(bytes, RECORD_BYTES)
}

/// [`sealed`] for a record `len` bytes long, closed by its last eight.
pub(crate) fn sealed_at(bytes: &[u8], len: usize) -> Result<Option<u64>, RecordError> {
    if bytes.len() != len {
        return Err(RecordError::Length(bytes.len(), len));
    }
    let (open, close) = (u64_at(bytes, at::SEQ), u64_at(bytes, len - 8));
    if open != close {
        return Err(RecordError::Torn(open, close));
    }
    Ok((open != 0).then_some(open))
}

impl NodeSample {
    /// The record's bytes. Figures beyond the record's room are clamped: per-CPU values to
    /// [`MAX_CPUS_RECORDED`] CPUs and 100 %.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        let per_cpu = &self.per_cpu[..self.per_cpu.len().min(MAX_CPUS_RECORDED)];
        put_u64(&mut b, at::SEQ, self.seq);
        b[at::VERSION] = SAMPLE_VERSION;
        b[at::SOURCE] = match self.source {
            Source::Host => 0,
            Source::NodeCgroup => 1,
        };
        put_u16(&mut b, at::CPUS, self.cpus);
        put_u16(&mut b, at::PER_CPU_COUNT, per_cpu.len() as u16);
        put_u16(&mut b, at::JOBS, self.jobs);
        put_u64(&mut b, at::TAKEN, self.taken_ms);
        put_u32(&mut b, at::PERIOD, self.period_ms);
        put_f32(&mut b, at::CPU_UTIL, self.cpu_util);
        for (i, l) in self.load.iter().enumerate() {
            put_f32(&mut b, at::LOAD + 4 * i, *l);
        }
        put_f32(&mut b, at::NM_CPU, self.nm_cpu);
        put_u64(&mut b, at::MEM_TOTAL, self.mem_total);
        put_u64(&mut b, at::MEM_AVAIL, self.mem_avail);
        put_u64(&mut b, at::SWAP_TOTAL, self.swap_total);
        put_u64(&mut b, at::SWAP_USED, self.swap_used);
        put_u64(&mut b, at::SPOOL_FREE, self.spool_free);
        put_u64(&mut b, at::STATE_FREE, self.state_free);
        let net = [
            self.net_rx_bytes,
            self.net_tx_bytes,
            self.net_rx_packets,
            self.net_tx_packets,
        ];
        for (i, v) in net.iter().enumerate() {
            put_u64(&mut b, at::NET + 8 * i, *v);
        }
        for (i, p) in per_cpu.iter().enumerate() {
            b[at::PER_CPU + i] = (*p).min(100);
        }
        put_u64(&mut b, at::TRAILER, self.seq);
        b
    }

    /// The sample in `bytes`: `None` for a slot never written; an error that names the
    /// problem for bytes that are not a whole, sensible record.
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, RecordError> {
        let Some(seq) = sealed(bytes)? else {
            return Ok(None);
        };
        let b = bytes;
        if b[at::VERSION] != SAMPLE_VERSION {
            return Err(RecordError::Version(b[at::VERSION]));
        }
        let source = match b[at::SOURCE] {
            0 => Source::Host,
            1 => Source::NodeCgroup,
            other => return Err(out_of_range("source", other)),
        };
        let count = u16_at(b, at::PER_CPU_COUNT) as usize;
        if count > MAX_CPUS_RECORDED {
            return Err(out_of_range("per_cpu_count", count));
        }
        let per_cpu = b[at::PER_CPU..at::PER_CPU + count].to_vec();
        if !zeros(&b[at::PER_CPU + count..at::TRAILER]) {
            return Err(out_of_range("per_cpu", "bytes after the last CPU's"));
        }
        if let Some(p) = per_cpu.iter().find(|p| **p > 100) {
            return Err(out_of_range("per_cpu", p));
        }
        let mut load = [0f32; 3];
        for (i, l) in load.iter_mut().enumerate() {
            *l = fraction("load", f32_at(b, at::LOAD + 4 * i), f32::MAX)?;
        }
        let (mem_total, mem_avail) = (u64_at(b, at::MEM_TOTAL), u64_at(b, at::MEM_AVAIL));
        if mem_avail > mem_total {
            return Err(out_of_range("mem_avail", mem_avail));
        }
        let (swap_total, swap_used) = (u64_at(b, at::SWAP_TOTAL), u64_at(b, at::SWAP_USED));
        if swap_used > swap_total {
            return Err(out_of_range("swap_used", swap_used));
        }
        Ok(Some(NodeSample {
            seq,
            taken_ms: u64_at(b, at::TAKEN),
            period_ms: u32_at(b, at::PERIOD),
            source,
            cpus: u16_at(b, at::CPUS),
            jobs: u16_at(b, at::JOBS),
            cpu_util: fraction("cpu_util", f32_at(b, at::CPU_UTIL), 1.0)?,
            per_cpu,
            load,
            nm_cpu: fraction("nm_cpu", f32_at(b, at::NM_CPU), f32::MAX)?,
            mem_total,
            mem_avail,
            swap_total,
            swap_used,
            spool_free: u64_at(b, at::SPOOL_FREE),
            state_free: u64_at(b, at::STATE_FREE),
            net_rx_bytes: u64_at(b, at::NET),
            net_tx_bytes: u64_at(b, at::NET + 8),
            net_rx_packets: u64_at(b, at::NET + 16),
            net_tx_packets: u64_at(b, at::NET + 24),
        }))
    }
}

/// Offsets of the inventory's fields (after the same opening sequence and version).
mod inv {
    pub const CPUS: usize = 10;
    pub const MHZ: usize = 12;
    pub const RAM: usize = 16;
    pub const SWAP: usize = 24;
    pub const MODEL: usize = 32;
    pub const KERNEL: usize = MODEL + super::MODEL_BYTES;
    pub const ARCH: usize = KERNEL + super::KERNEL_BYTES;
    pub const END: usize = ARCH + super::ARCH_BYTES;
    const _: () = assert!(END <= super::RECORD_BYTES - 8);
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A text field of `len` bytes: UTF-8, padded with zeros.
pub(crate) fn text_at(
    b: &[u8],
    at: usize,
    len: usize,
    field: &'static str,
) -> Result<String, RecordError> {
    let raw = &b[at..at + len];
    let end = raw.iter().position(|c| *c == 0).unwrap_or(len);
    if !zeros(&raw[end..]) {
        return Err(out_of_range(field, "bytes after its end"));
    }
    String::from_utf8(raw[..end].to_vec()).map_err(|_| out_of_range(field, "invalid UTF-8"))
}

impl NodeInventory {
    /// The record's bytes; texts longer than their room are cut.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        put_u64(&mut b, at::SEQ, self.seq);
        b[at::VERSION] = INVENTORY_VERSION;
        put_u16(&mut b, inv::CPUS, self.cpus);
        put_u32(&mut b, inv::MHZ, self.mhz);
        put_u64(&mut b, inv::RAM, self.ram);
        put_u64(&mut b, inv::SWAP, self.swap);
        for (at, len, s) in [
            (inv::MODEL, MODEL_BYTES, &self.model),
            (inv::KERNEL, KERNEL_BYTES, &self.kernel),
            (inv::ARCH, ARCH_BYTES, &self.arch),
        ] {
            let s = cut(s, len);
            b[at..at + s.len()].copy_from_slice(s.as_bytes());
        }
        put_u64(&mut b, at::TRAILER, self.seq);
        b
    }

    /// The inventory in `bytes` (`None`: never written).
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, RecordError> {
        let Some(seq) = sealed(bytes)? else {
            return Ok(None);
        };
        let b = bytes;
        if b[at::VERSION] != INVENTORY_VERSION {
            return Err(RecordError::Version(b[at::VERSION]));
        }
        if b[at::SOURCE] != 0 || !zeros(&b[inv::END..at::TRAILER]) {
            return Err(out_of_range("inventory", "bytes after its last field"));
        }
        Ok(Some(NodeInventory {
            seq,
            cpus: u16_at(b, inv::CPUS),
            mhz: u32_at(b, inv::MHZ),
            ram: u64_at(b, inv::RAM),
            swap: u64_at(b, inv::SWAP),
            model: text_at(b, inv::MODEL, MODEL_BYTES, "model")?,
            kernel: text_at(b, inv::KERNEL, KERNEL_BYTES, "kernel")?,
            arch: text_at(b, inv::ARCH, ARCH_BYTES, "arch")?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeSample {
        NodeSample {
            seq: 7,
            taken_ms: 1_790_000_000_123,
            period_ms: 1000,
            source: Source::NodeCgroup,
            cpus: 4,
            jobs: 2,
            cpu_util: 0.625,
            per_cpu: vec![100, 50, 0, 100],
            load: [1.5, 0.75, 0.25],
            nm_cpu: 0.001,
            mem_total: 8 << 30,
            mem_avail: 3 << 30,
            swap_total: 1 << 30,
            swap_used: 1 << 20,
            spool_free: 10 << 30,
            state_free: 20 << 30,
            net_rx_bytes: 123_456,
            net_tx_bytes: 654_321,
            net_rx_packets: 1_000,
            net_tx_packets: 2_000,
        }
    }

    #[test]
    fn a_sample_comes_back_as_it_was_written() {
        let s = sample();
        assert_eq!(NodeSample::decode(&s.encode()), Ok(Some(s)));
    }

    #[test]
    fn a_slot_never_written_is_no_sample() {
        assert_eq!(NodeSample::decode(&[0u8; RECORD_BYTES]), Ok(None));
        assert_eq!(NodeInventory::decode(&[0u8; RECORD_BYTES]), Ok(None));
    }

    #[test]
    fn a_record_caught_while_the_next_lands_is_torn() {
        let old = sample().encode();
        let new = NodeSample { seq: 8, ..sample() }.encode();
        // The first half of the new record over the old one's second half.
        let mut seen = old;
        seen[..RECORD_BYTES / 2].copy_from_slice(&new[..RECORD_BYTES / 2]);
        assert_eq!(NodeSample::decode(&seen), Err(RecordError::Torn(8, 7)));
    }

    #[test]
    fn figures_out_of_range_are_named() {
        let mut b = sample().encode();
        b[at::CPU_UTIL..at::CPU_UTIL + 4].copy_from_slice(&1.5f32.to_le_bytes());
        assert!(matches!(
            NodeSample::decode(&b),
            Err(RecordError::Field {
                field: "cpu_util",
                ..
            })
        ));
        let mut b = sample().encode();
        b[at::CPU_UTIL..at::CPU_UTIL + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(NodeSample::decode(&b).is_err());
        let mut b = sample().encode();
        b[at::PER_CPU_COUNT] = 200;
        assert!(matches!(
            NodeSample::decode(&b),
            Err(RecordError::Field {
                field: "per_cpu_count",
                ..
            })
        ));
        assert_eq!(
            NodeSample::decode(&[1u8; 10]),
            Err(RecordError::Length(10, RECORD_BYTES))
        );
    }

    #[test]
    fn more_cpus_than_the_record_holds_keep_the_first_ones() {
        let s = NodeSample {
            cpus: 256,
            per_cpu: vec![30; 256],
            ..sample()
        };
        let back = NodeSample::decode(&s.encode()).unwrap().unwrap();
        assert_eq!(back.cpus, 256);
        assert_eq!(back.per_cpu, vec![30; MAX_CPUS_RECORDED]);
    }

    #[test]
    fn a_sample_older_than_three_periods_is_stale_and_a_missing_one_too() {
        let s = sample();
        let at = s.taken_ms;
        let fresh = NodeRecords::judge(Ok(Some(s.clone())), Ok(None), Ok(None), at + 2_999, 1000);
        assert!(!fresh.stale);
        assert_eq!(fresh.age_ms, 2_999);
        let old = NodeRecords::judge(Ok(Some(s.clone())), Ok(None), Ok(None), at + 3_001, 1000);
        assert!(old.stale);
        assert!(NodeRecords::judge(Ok(None), Ok(None), Ok(None), at, 1000).stale);
        let torn = NodeRecords::judge(Err(RecordError::Torn(8, 7)), Ok(None), Ok(None), at, 1000);
        assert!(torn.stale && torn.error.unwrap().contains("being written"));
        // A node sampling less often than the MM's setting says is judged by its own period.
        let slow = NodeSample {
            period_ms: 10_000,
            ..s
        };
        assert!(!NodeRecords::judge(Ok(Some(slow)), Ok(None), Ok(None), at + 20_000, 1000).stale);
    }

    #[test]
    fn an_inventory_comes_back_and_long_texts_are_cut_on_a_character() {
        let i = NodeInventory {
            seq: 3,
            cpus: 2,
            mhz: 2_100,
            ram: 24 << 30,
            swap: 0,
            model: "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz".into(),
            kernel: "6.1.0-27-amd64".into(),
            arch: "x86_64".into(),
        };
        assert_eq!(NodeInventory::decode(&i.encode()), Ok(Some(i.clone())));
        let long = NodeInventory {
            model: "é".repeat(100),
            ..i
        };
        let back = NodeInventory::decode(&long.encode()).unwrap().unwrap();
        assert_eq!(back.model, "é".repeat(MODEL_BYTES / 2));
        // A sample is not an inventory.
        assert!(matches!(
            NodeInventory::decode(&sample().encode()),
            Err(RecordError::Version(SAMPLE_VERSION))
        ));
    }
}
