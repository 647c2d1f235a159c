//! The partition state machine: one per partition replica, fed by that
//! partition's Raft group.
//!
//! The log's records live in a [`RecordLog`] that the caller owns (redb in
//! the server, [`MemoryLog`] in tests and the simulation's models); the
//! [`PartitionState`] holds everything else: log bounds, idempotent producer
//! sequences (G8), group claims (G5) and committed positions (G4).
//! [`PartitionState::apply`] validates the whole command before it changes
//! anything, so a rejection changes nothing; a storage error from the log is
//! fatal for this replica (the caller must stop and recover from Raft).

mod command;
mod log;
mod producer;
mod state;

pub use command::{
    AppendBatch, PartitionCommand, PartitionOutcome, PartitionRejection, PartitionResult, ProducerBatch, ReadError,
    APPEND_BATCHES_MAX,
};
pub use log::{MemoryLog, RecordLog, RecordPlace};
pub use producer::{ProducerState, RememberedBatch};
pub use state::{Claim, GroupPosition, PartitionState};
