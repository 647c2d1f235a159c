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
    /// How long a consumer group with no members is kept (with its
    /// generation) before the cluster forgets it, in milliseconds; as
    /// Kafka's `offsets.retention.minutes`, 7 days by default.
    pub group_retention_ms: u64,
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
            group_retention_ms: 7 * 24 * 60 * 60 * 1000,
        }
    }
}

/// Where a setting takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SettingScope {
    /// Read from the cluster's metadata by each command: a change (`keel
    /// cluster config set`) applies to every later command.
    Cluster,
    /// Copied into each partition's state when its topic is created, and
    /// fixed there.
    Partition,
}

impl SettingScope {
    pub fn as_str(&self) -> &'static str {
        match self {
            SettingScope::Cluster => "cluster",
            SettingScope::Partition => "partition",
        }
    }
}

/// One setting, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    pub value: u64,
    pub scope: SettingScope,
}

/// Why a setting cannot take a value. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SettingError {
    #[error("there is no setting {name:?}: `keel cluster config` lists them")]
    Unknown { name: String },
    #[error(
        "{name} is fixed in each partition when its topic is created, so it cannot be changed on a running cluster \
         (start the brokers of a new cluster with the value instead)"
    )]
    Fixed { name: String },
    #[error("{name} cannot be {value}: {reason}")]
    Invalid { name: String, value: u64, reason: String },
}

/// A setting's field, to change.
enum FieldMut<'a> {
    U32(&'a mut u32),
    U64(&'a mut u64),
}

impl<'a> From<&'a mut u32> for FieldMut<'a> {
    fn from(field: &'a mut u32) -> FieldMut<'a> {
        FieldMut::U32(field)
    }
}

impl<'a> From<&'a mut u64> for FieldMut<'a> {
    fn from(field: &'a mut u64) -> FieldMut<'a> {
        FieldMut::U64(field)
    }
}

/// Every limit is a setting, under its field's name.
macro_rules! settings {
    ($($field:ident: $scope:ident,)*) => {
        impl Limits {
            /// Every setting with its value, in a fixed order.
            pub fn settings(&self) -> Vec<Setting> {
                vec![$(Setting { name: stringify!($field), value: self.$field as u64, scope: SettingScope::$scope },)*]
            }

            fn field_mut(&mut self, name: &str) -> Option<(SettingScope, FieldMut<'_>)> {
                match name {
                    $(stringify!($field) => Some((SettingScope::$scope, FieldMut::from(&mut self.$field))),)*
                    _ => None,
                }
            }
        }
    };
}

settings! {
    partitions_per_topic_max: Cluster,
    replication_factor_max: Cluster,
    topics_max: Cluster,
    brokers_max: Cluster,
    broker_address_bytes_max: Cluster,
    groups_max: Cluster,
    members_per_group_max: Cluster,
    subscriptions_per_member_max: Cluster,
    session_timeout_ms_min: Cluster,
    session_timeout_ms_max: Cluster,
    group_retention_ms: Cluster,
    record_key_bytes_max: Partition,
    record_value_bytes_max: Partition,
    record_headers_max: Partition,
    record_bytes_max: Partition,
    batch_records_max: Partition,
    batch_bytes_max: Partition,
    read_records_max: Partition,
    producers_per_partition_max: Partition,
    producer_batches_remembered_max: Partition,
    groups_per_partition_max: Partition,
    retention_records_per_apply_max: Partition,
}

/// The values a cluster-scoped setting may take. The ceilings keep one
/// command's apply bounded on every replica (a topic's placements are
/// allocated at once; a group's assignment spans its members); the floor
/// of `group_retention_ms` keeps an empty group (a consumer restarting)
/// from being forgotten between two duty rounds.
fn setting_bounds(name: &str) -> (u64, u64) {
    const DAY_MS: u64 = 24 * 60 * 60 * 1000;
    match name {
        "partitions_per_topic_max" => (1, 100_000),
        "replication_factor_max" => (1, 15),
        "topics_max" => (1, 1_000_000),
        "brokers_max" => (1, 10_000),
        "broker_address_bytes_max" => (1, 4_096),
        "groups_max" => (1, 10_000_000),
        "members_per_group_max" => (1, 100_000),
        "subscriptions_per_member_max" => (1, 10_000),
        "session_timeout_ms_min" | "session_timeout_ms_max" => (1, DAY_MS),
        "group_retention_ms" => (1_000, 365 * DAY_MS),
        _ => (1, u64::from(u32::MAX)),
    }
}

impl Limits {
    /// A setting's value, if it exists.
    pub fn setting(&self, name: &str) -> Option<u64> {
        self.settings().into_iter().find(|s| s.name == name).map(|s| s.value)
    }

    /// Set a cluster-scoped setting; returns the value it had. Checks only
    /// the value itself (at least 1, within the field's range, the session
    /// bounds in order); what the state holds (e.g. more groups than a new
    /// `groups_max`) is the metadata state machine's to check.
    pub fn set(&mut self, name: &str, value: u64) -> Result<u64, SettingError> {
        let invalid = |reason: &str| SettingError::Invalid { name: name.to_string(), value, reason: reason.into() };
        let (min, max) = (self.session_timeout_ms_min, self.session_timeout_ms_max);
        let Some((scope, field)) = self.field_mut(name) else {
            return Err(SettingError::Unknown { name: name.to_string() });
        };
        if scope == SettingScope::Partition {
            return Err(SettingError::Fixed { name: name.to_string() });
        }
        let (least, most) = setting_bounds(name);
        if value < least || value > most {
            return Err(invalid(&format!("it must be {least} to {most}")));
        }
        if name == "session_timeout_ms_min" && value > max {
            return Err(invalid(&format!("it is above session_timeout_ms_max ({max} ms)")));
        }
        if name == "session_timeout_ms_max" && value < min {
            return Err(invalid(&format!("it is below session_timeout_ms_min ({min} ms)")));
        }
        match field {
            FieldMut::U32(field) => {
                let value = u32::try_from(value).map_err(|_| invalid(&format!("it must be at most {}", u32::MAX)))?;
                Ok(u64::from(std::mem::replace(field, value)))
            }
            FieldMut::U64(field) => Ok(std::mem::replace(field, value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_is_listed_and_only_cluster_settings_change() {
        let mut limits = Limits::default();
        let settings = limits.settings();
        // Every field of Limits is listed (a field missing from `settings!`
        // would be neither shown nor settable).
        let fields = serde_json::to_value(&limits).unwrap().as_object().unwrap().len();
        assert_eq!(settings.len(), fields, "a field of Limits is missing from settings!");
        assert_eq!(limits.set("groups_max", 20), Ok(10_000));
        assert_eq!(limits.groups_max, 20);
        assert_eq!(limits.set("group_retention_ms", 1_000), Ok(7 * 24 * 60 * 60 * 1000));
        assert_eq!(limits.setting("group_retention_ms"), Some(1_000));
        assert!(matches!(limits.set("batch_bytes_max", 5), Err(SettingError::Fixed { .. })));
        assert!(matches!(limits.set("no_such", 5), Err(SettingError::Unknown { .. })));
        assert!(matches!(limits.set("groups_max", 0), Err(SettingError::Invalid { .. })));
        assert!(matches!(limits.set("topics_max", u64::from(u32::MAX) + 1), Err(SettingError::Invalid { .. })));
        assert!(matches!(limits.set("partitions_per_topic_max", 100_001), Err(SettingError::Invalid { .. })));
        assert!(matches!(limits.set("group_retention_ms", 999), Err(SettingError::Invalid { .. })));
        assert!(matches!(limits.set("session_timeout_ms_min", 400_000), Err(SettingError::Invalid { .. })));
        assert!(matches!(limits.set("session_timeout_ms_max", 10), Err(SettingError::Invalid { .. })));
        assert_eq!(limits.groups_max, 20, "a refused value changes nothing");
    }
}
