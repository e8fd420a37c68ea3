//! Waking the MM's loop between its timeslices.
//!
//! The daemon's loop waits on the fabric for the MM's termination event, where NMs announce
//! that a job's tasks ended (Algorithm 8), until the next timeslice is due. The MM's own
//! threads end that wait with a local wake-up (no signal: nothing is announced) when they
//! have something for it: the control socket's threads a request, the journal's thread a
//! settled commit whose replies may go.

use std::sync::Arc;
use std::time::Instant;

use storm_primitives::{EventId, Primitives, Wait};

/// A handle that wakes the MM's loop; [`Waker::none`] wakes nothing (a simulated MM, which
/// is stepped, not woken).
#[derive(Clone)]
pub struct Waker(Option<(Arc<dyn Primitives>, EventId)>);

impl Waker {
    /// Wakes a loop waiting for `event` on the MM's own endpoint.
    pub fn new(prims: Arc<dyn Primitives>, event: EventId) -> Self {
        Self(Some((prims, event)))
    }

    pub fn none() -> Self {
        Self(None)
    }

    pub fn wake(&self) {
        if let Some((prims, event)) = &self.0 {
            // Fails only once the endpoint is shut down: nobody waits any more.
            let _ = prims.wake_local(*event);
        }
    }
}

/// What ended a [`wait_until`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The event was signalled: a node announced a termination.
    Signalled,
    /// A local wake-up, or `until` came.
    Woken,
}

/// Waits on `prims` until `until`, or until `event` is signalled or woken ([`Waker::wake`]).
/// An endpoint that is closed (shutting down) sleeps out the wait instead of returning at
/// once, so that a loop around it does not spin.
pub fn wait_until(prims: &dyn Primitives, event: EventId, until: Instant) -> Woken {
    let left = until.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Woken::Woken;
    }
    match prims.test_event(event, Wait::Timeout(left)) {
        Ok(true) => Woken::Signalled,
        Ok(false) => Woken::Woken,
        Err(_) => {
            std::thread::sleep(left);
            Woken::Woken
        }
    }
}
