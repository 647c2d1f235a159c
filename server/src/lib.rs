//! keel-server: a broker node.
//!
//! It hosts the metadata Raft group and one Raft group per partition
//! replica (openraft over one redb database per node), the Raft transport
//! between brokers over gRPC, and the node's clock. Every outcome is decided
//! by the state machines in `keel-core`; this crate only does I/O. The same
//! code runs on tokio and, built with `--cfg madsim`, in the simulation.
//!
//! openraft is 0.9.25 as `shared/design/STACK.md` pins it, but vendored
//! with the changes `vendor/README.md` lists: among them, it draws nothing
//! from tokio's thread RNG (a seed replays exactly inside a batch of runs),
//! and a leader replicates its entries while its own log flushes.

pub mod api;
pub mod clock;
pub mod encoding;
pub mod group;
#[cfg(not(madsim))]
pub mod local_cluster;
pub mod metrics;
pub mod node;
pub mod raft;
pub mod storage;
#[cfg(not(madsim))]
pub mod tls;
