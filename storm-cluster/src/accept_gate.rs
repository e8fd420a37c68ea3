//! How many connections a listener that anyone on the network can reach (the control
//! relay's manager side, the peer agent, the metrics exporter) holds before they have proved
//! anything: at most `total` at once, and at most `per_source` from one address, so that a
//! host without any key, opening connections and saying nothing, holds a few places and never
//! all of them. The cluster's own nodes and peers still get in. Refusals and failed
//! handshakes are logged at most [`LOG_BURST`] times every [`LOG_INTERVAL`], with the count
//! of the others: such a host cannot fill the disk either.
//!
//! The tcp links of the primitives keep the same rule in `storm_primitives::tcp`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use storm_primitives::log_limit::LogLimit;

/// How often refusals (and failed handshakes) are logged at most; the rest are counted.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Lines per [`LOG_INTERVAL`].
pub const LOG_BURST: u32 = 20;

/// The places of one listener (cheap to clone: shared).
#[derive(Clone)]
pub struct AcceptGate {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the listener is, for its log lines ("the control relay").
    what: &'static str,
    total: usize,
    per_source: usize,
    state: Mutex<State>,
}

struct State {
    held: usize,
    by_source: HashMap<IpAddr, usize>,
    refused: LogLimit,
    failed: LogLimit,
}

/// One connection's place, given back when it is dropped (once its handshake ended, or the
/// connection did).
pub struct Place {
    inner: Arc<Inner>,
    source: IpAddr,
}

impl AcceptGate {
    /// A gate of `total` places, at most `per_source` of them from one address.
    pub fn new(what: &'static str, total: usize, per_source: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                what,
                total: total.max(1),
                per_source: per_source.max(1),
                state: Mutex::new(State {
                    held: 0,
                    by_source: HashMap::new(),
                    refused: LogLimit::with_burst(LOG_INTERVAL, LOG_BURST),
                    failed: LogLimit::with_burst(LOG_INTERVAL, LOG_BURST),
                }),
            }),
        }
    }

    /// A place for a connection from `source`, or `None` (logged, within the limit) when
    /// its address or the listener has none left.
    pub fn admit(&self, source: IpAddr) -> Option<Place> {
        let mut st = self.inner.state.lock();
        let from = st.by_source.get(&source).copied().unwrap_or(0);
        let why = if st.held >= self.inner.total {
            Some(format!(
                "{} connections are already proving who they are",
                st.held
            ))
        } else if from >= self.inner.per_source {
            Some(format!(
                "{from} connections from {source} are already proving who they are (at most \
                 {} from one address)",
                self.inner.per_source
            ))
        } else {
            None
        };
        if let Some(why) = why {
            if let Some(unlogged) = st.refused.allow(Instant::now()) {
                tracing::warn!(
                    %source,
                    "{}: {why}; a new connection is closed ({unlogged} more closed since the \
                     last such line)",
                    self.inner.what
                );
            }
            return None;
        }
        st.held += 1;
        *st.by_source.entry(source).or_insert(0) += 1;
        Some(Place {
            inner: self.inner.clone(),
            source,
        })
    }

    /// Logs a connection whose handshake failed (no key, garbage, silence), unless many were
    /// logged lately.
    pub fn log_failure(&self, source: Option<std::net::SocketAddr>, why: &dyn std::fmt::Display) {
        let allowed = self.inner.state.lock().failed.allow(Instant::now());
        if let Some(unlogged) = allowed {
            tracing::warn!(
                ?source,
                "{}: refusing a connection: {why} ({unlogged} more refused since the last such \
                 line)",
                self.inner.what
            );
        }
    }

    /// Places held now (for tests and metrics).
    pub fn held(&self) -> usize {
        self.inner.state.lock().held
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock();
        st.held = st.held.saturating_sub(1);
        if let Some(n) = st.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                st.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One address holds at most its share; another still gets in; places come back.
    #[test]
    fn one_address_holds_its_share_and_no_more() {
        let gate = AcceptGate::new("test", 4, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = gate.admit(a).unwrap();
        let _second = gate.admit(a).unwrap();
        assert!(gate.admit(a).is_none(), "a third from one address");
        let _other = gate.admit(b).unwrap();
        let _other2 = gate.admit(b).unwrap();
        assert!(
            gate.admit("10.0.0.3".parse().unwrap()).is_none(),
            "past the total"
        );
        drop(first);
        assert!(gate.admit(a).is_some(), "a place given back is taken again");
    }
}
