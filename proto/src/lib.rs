//! keel-proto: the `.proto` files and the code generated from them.
//!
//! It will hold the public API (produce, consume, admin) and the internal
//! broker-to-broker Raft RPC, generated with madsim-tonic-build so that one
//! build yields both the real tonic code and the simulated one. It holds no
//! logic: validation lives in `keel-server`, state machines in `keel-core`.
