//! keel-proto: the `.proto` files and the code generated from them.
//!
//! - `v1`: the public API (produce, read, administer).
//! - `raft`: the internal broker-to-broker Raft transport (every group over
//!   one channel per peer).
//!
//! The public API (produce, consume, admin) joins it with the client-facing
//! services. Generated with madsim-tonic-build, so one build yields both the
//! real tonic code and the simulated one. No logic lives here: validation is
//! in `keel-server`, state machines in `keel-core`.

/// The encoded descriptors of every keel service, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/keel_descriptor.bin"));

/// The public API: produce, read, administer.
pub mod v1 {
    #![allow(clippy::all)]
    tonic::include_proto!("keel.v1");
}

/// The internal Raft transport between brokers.
pub mod raft {
    #![allow(clippy::all)]
    tonic::include_proto!("keel.raft");
}
