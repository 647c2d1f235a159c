//! Storage of a broker node: one redb database per node holding every
//! group's vote, state machine and indexes, and one segment log holding
//! every group's Raft log entries (and so its partition records; see
//! `store.rs` for how the two are committed, recovered and reclaimed).
//!
//! Why one database per node rather than one per group: a node hosts many
//! groups, and one database lets a single fsync make every group's pending
//! appends durable at once (group commit across partitions, see
//! [`NodeStore::flush`]). The benchmark `server/benches/store.rs` compares it
//! with one database per group.
//!
//! Durability rules (G1):
//! - Log entries are frames of the segment log, their rows committed
//!   without fsync (`Durability::None`) so they are readable at once;
//!   openraft is told they are persisted only after the log's next sync,
//!   which makes every earlier frame durable too.
//! - Votes are frames of the segment log, synced before `save_vote`
//!   returns (a restart replays them into their rows).
//! - State-machine writes are not synced: the Raft log replays them. Before
//!   a snapshot is handed out (after which openraft may purge the log), the
//!   state machine is made durable.
//! - After any storage error the store refuses further work (fatal).

pub mod crash_disk;
mod crash_image;
mod ledger;
mod log_rows;
mod log_store;
mod log_tail;
mod metadata_rows;
mod records;
pub mod segments;
pub mod snapshot_file;
mod state_machine;
mod store;

pub use ledger::{Ledger, PersistedMark};
pub use log_store::LogStore;
pub use records::{RecordReader, RecordWriter};
pub use state_machine::{GroupState, GroupStateMachine, SharedGroupState};
#[cfg(madsim)]
pub use store::sim_sync_latency;
pub use store::{LogUsage, NodeStore, StoreError};
