//! keel-core: the sans-IO heart of keel.
//!
//! Everything here is a plain, deterministic function of its inputs: the
//! metadata and partition state machines, group session bookkeeping, the
//! assignors, key routing and replica placement. Nothing here reads a clock,
//! draws a random number, touches a file or socket, or starts a thread: time
//! ([`id::TimestampMs`]) and any random choice are arguments. The server runs
//! these state machines under openraft; the simulation and the fuzzers run
//! them directly.
//!
//! The state machines are total (G7): `apply` takes any command, valid or
//! not, and either applies it or records a typed rejection that changed
//! nothing. Each has `check_invariants()`, which tests, the simulation and
//! the fuzzers call after every step.

// core/clippy.toml bans clocks, threads, file I/O and hash maps; make a
// breach an error, not a warning.
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod access;
pub mod assignor;
pub mod coordinator;
pub mod id;
pub mod invariant;
pub mod limits;
pub mod metadata;
pub mod partition;
pub mod placement;
#[cfg(madsim)]
pub mod planted;
pub mod record;
pub mod routing;

pub use id::{
    BrokerId, Generation, GroupName, MemberId, MonotonicMs, NameError, Offset, PartitionIndex, Principal, ProducerId,
    Sequence, TimestampMs, TopicName, TopicPartition,
};
pub use invariant::InvariantViolation;
pub use limits::Limits;
