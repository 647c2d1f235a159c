//! Limits: a named bound for every size and count a request can grow.
//!
//! Limits are part of each state machine's replicated state (set when the
//! group is created and carried in snapshots), never read from a node's local
//! config during apply: replicas with different limits would otherwise
//! disagree on which commands are rejected (G7).

use serde::{Deserialize, Serialize};

/// Bounds enforced at the edge and again inside apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Most partitions one topic may have.
    pub partitions_per_topic_max: u32,
    /// Most replicas one partition may have.
    pub replication_factor_max: u32,
    /// Most topics in the cluster.
    pub topics_max: u32,
    /// Most brokers in the cluster.
    pub brokers_max: u32,
    /// Longest broker address, in bytes.
    pub broker_address_bytes_max: u32,
    /// Most consumer groups in the cluster.
    pub groups_max: u32,
    /// Most members in one consumer group.
    pub members_per_group_max: u32,
    /// Most topics one member may subscribe to.
    pub subscriptions_per_member_max: u32,
    /// Shortest and longest session timeout a member may ask for.
    pub session_timeout_ms_min: u64,
    pub session_timeout_ms_max: u64,
    /// Largest record key, in bytes.
    pub record_key_bytes_max: u32,
    /// Largest record value, in bytes.
    pub record_value_bytes_max: u32,
    /// Most headers on one record.
    pub record_headers_max: u32,
    /// Largest record (key + value + header keys and values), in bytes.
    pub record_bytes_max: u32,
    /// Most records in one produce batch.
    pub batch_records_max: u32,
    /// Largest produce batch (sum of record sizes), in bytes.
    pub batch_bytes_max: u32,
    /// Most records one read returns.
    pub read_records_max: u32,
    /// Producers whose sequence state one partition remembers; the least
    /// recently used is forgotten beyond this.
    pub producers_per_partition_max: u32,
    /// Recent batches remembered per producer, so their retries are answered
    /// with the original offsets (G8).
    pub producer_batches_remembered_max: u32,
    /// Consumer groups that may hold a claim or commit on one partition.
    pub groups_per_partition_max: u32,
    /// Most records one retention command removes, so that apply stays short.
    pub retention_records_per_apply_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            partitions_per_topic_max: 1024,
            replication_factor_max: 7,
            topics_max: 10_000,
            brokers_max: 256,
            broker_address_bytes_max: 255,
            groups_max: 10_000,
            members_per_group_max: 1024,
            subscriptions_per_member_max: 64,
            session_timeout_ms_min: 1_000,
            session_timeout_ms_max: 300_000,
            record_key_bytes_max: 64 * 1024,
            record_value_bytes_max: 1024 * 1024,
            record_headers_max: 64,
            record_bytes_max: 1024 * 1024 + 128 * 1024,
            batch_records_max: 10_000,
            batch_bytes_max: 4 * 1024 * 1024,
            read_records_max: 10_000,
            producers_per_partition_max: 10_000,
            producer_batches_remembered_max: 5,
            groups_per_partition_max: 10_000,
            retention_records_per_apply_max: 100_000,
        }
    }
}
