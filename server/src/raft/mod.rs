//! Raft plumbing: the type configuration, the madsim runtime adapter and the
//! transport between brokers.

#[cfg(madsim)]
pub mod runtime_sim;
pub mod types;
