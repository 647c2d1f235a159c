//! keel-server: a broker node.
//!
//! It will host the metadata Raft group and one Raft group per partition
//! replica (openraft over redb), the Raft network and the public API over
//! tonic, configuration, metrics and the `keel` binary. Every outcome is
//! decided by the state machines in `keel-core`; this crate only does I/O.
