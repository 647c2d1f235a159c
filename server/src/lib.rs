//! keel-server: a broker node.
//!
//! It hosts the metadata Raft group and one Raft group per partition
//! replica (openraft over one redb database per node), the Raft transport
//! between brokers over gRPC, and the node's clock. Every outcome is decided
//! by the state machines in `keel-core`; this crate only does I/O. The same
//! code runs on tokio and, built with `--cfg madsim`, in the simulation.

pub mod api;
pub mod clock;
pub mod group;
#[cfg(not(madsim))]
pub mod local_cluster;
pub mod metrics;
pub mod node;
pub mod raft;
pub mod storage;
