//! Helpers built only on the three primitives (paper Sec. 2.4.2): global flow control and
//! remote queues. They are generic over the backend, so they work unchanged on every one.

mod flow;
mod queue;

pub use flow::{Backoff, await_space};
pub use queue::{QueueConsumer, QueueEntry, QueueProducer, epoch_base};
