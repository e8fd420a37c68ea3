//! Waking the MM's loop between its timeslices.
//!
//! The daemon's loop waits on the fabric for the MM's termination event, where NMs announce
//! that a job's tasks ended (Algorithm 8), until the next timeslice is due. The MM's own
//! threads end that wait with a local wake-up (no signal: nothing is announced) when they
//! have something for it: the control socket's threads a request, the journal's thread a
//! settled commit whose replies may go.

use std::sync::Arc;

use storm_primitives::{EventId, Primitives};

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
