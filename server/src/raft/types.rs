//! The openraft type configuration shared by every group, and the commands
//! and responses carried in its log.

use keel_core::metadata::{MetadataCommand, MetadataResult};
use keel_core::partition::{PartitionCommand, PartitionResult};
use keel_core::TimestampMs;
use serde::{Deserialize, Serialize};

/// The async runtime openraft runs on: tokio in production, madsim in the
/// simulation (see `runtime_sim`).
#[cfg(not(madsim))]
pub type Runtime = openraft::TokioRuntime;
#[cfg(madsim)]
pub type Runtime = super::runtime_sim::MadsimRuntime;

/// A broker's id as openraft sees it.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// keel's Raft types: one configuration for the metadata group and all
    /// partition groups.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::storage::snapshot_file::SnapshotFile,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
        AsyncRuntime = Runtime,
);

/// A command for one group's state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Metadata(MetadataCommand),
    Partition(PartitionCommand),
}

/// A log entry's application data: a command and the time the leader
/// stamped on it. Apply reads time only from here (G7).
///
/// The command is shared, so that an entry costs no copy of its records
/// when the log's in-memory tail hands it to apply and to each follower's
/// replication (it encodes as the command itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub at: TimestampMs,
    pub command: std::sync::Arc<Command>,
}

impl Request {
    pub fn new(at: TimestampMs, command: Command) -> Self {
        Request { at, command: std::sync::Arc::new(command) }
    }
}

/// What applying one entry produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Metadata(MetadataResult),
    Partition(PartitionResult),
    /// A command for another kind of group reached this one; recorded and
    /// ignored (it cannot happen through keel's own code paths).
    WrongGroup,
    /// Blank and membership entries.
    None,
}

/// openraft's aliases, filled in with keel's types.
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type StorageError = openraft::StorageError<NodeId>;
