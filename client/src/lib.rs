//! keel-client: the one client library, used by the `keel` command line,
//! the integration tests and the simulation.
//!
//! - [`Client`]: connections to brokers, routing of each request to the
//!   broker that must take it (following the `keel-leader` and
//!   `keel-replicas` hints of a refusing broker), and retries with backoff
//!   through elections.
//! - [`Consumer`]: a consumer-group member (join, heartbeats, polls, acks,
//!   rejoining on rebalances and fences).
//! - [`Producer`]: the idempotent producer (G8): a producer id from the
//!   cluster, one sequence per partition, and retries of a batch with the
//!   same sequence, so a retried batch is appended once.
//! - [`BatchingProducer`]: the same guarantee for a stream of records:
//!   batches gathered per partition (size and linger) with several in
//!   flight per partition.
//!
//! It uses tokio's monotonic clock (madsim's simulated one under
//! simulation) only for retry deadlines and heartbeat intervals, never for
//! anything a broker decides on, and madsim-tonic, so the same code runs
//! deterministically inside the simulation.

mod batching;
mod client;
mod consumer;
mod produce_stream;
mod producer;

pub use batching::{Ack, BatchingConfig, BatchingProducer, Delivered, SendError};
#[cfg(not(madsim))]
pub use client::ClientTls;
pub use client::{
    Api, Client, ClientError, Credentials, RetryPolicy, Route, FENCED_METADATA, PRODUCER_LOST_METADATA,
    RETRY_AFTER_METADATA, SEQUENCE_GAP_METADATA, TOPIC_GONE_METADATA,
};
pub use consumer::{Consumer, Delivery};
pub use keel_proto::v1 as pb;
pub use producer::{Producer, Sent};
