//! Raft plumbing: the type configuration, the madsim runtime adapter and the
//! transport between brokers.

pub mod batch;
pub mod network;
#[cfg(madsim)]
pub mod runtime_sim;
pub mod types;
