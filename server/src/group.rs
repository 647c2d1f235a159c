//! Raft group ids: the metadata group, or one partition's group.

use std::fmt;

use keel_core::{PartitionIndex, TopicName, TopicPartition};

/// Which Raft group a request, a log entry or a store row belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupId {
    /// Cluster metadata: on every broker.
    Metadata,
    /// One partition, on its replicas, of the topic with this id (a topic
    /// created again under the same name has a new id, so new groups).
    Partition(TopicPartition, u64),
}

/// A string that does not name a group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} does not name a Raft group: expected \"metadata\" or \"p/<topic>/<topic id>/<partition>\"")]
pub struct BadGroupKey(pub String);

impl GroupId {
    /// The stable key used on the wire and in the store: `metadata` or
    /// `p/<topic>/<topic id>/<partition>` (topic names cannot contain `/`).
    pub fn key(&self) -> String {
        match self {
            GroupId::Metadata => "metadata".to_string(),
            GroupId::Partition(tp, topic_id) => format!("p/{}/{topic_id}/{}", tp.topic, tp.partition),
        }
    }

    /// The partition, for a partition group.
    pub fn partition(&self) -> Option<&TopicPartition> {
        match self {
            GroupId::Metadata => None,
            GroupId::Partition(tp, _) => Some(tp),
        }
    }

    /// Parse a key made by [`GroupId::key`].
    pub fn parse(key: &str) -> Result<GroupId, BadGroupKey> {
        if key == "metadata" {
            return Ok(GroupId::Metadata);
        }
        let bad = || BadGroupKey(key.chars().take(300).collect());
        let rest = key.strip_prefix("p/").ok_or_else(bad)?;
        let (rest, index) = rest.rsplit_once('/').ok_or_else(bad)?;
        let (topic, topic_id) = rest.rsplit_once('/').ok_or_else(bad)?;
        let topic = TopicName::new(topic).map_err(|_| bad())?;
        let topic_id: u64 = topic_id.parse().map_err(|_| bad())?;
        let index: u32 = index.parse().map_err(|_| bad())?;
        Ok(GroupId::Partition(TopicPartition::new(topic, PartitionIndex(index)), topic_id))
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_bad_keys_are_refused() {
        let partition =
            GroupId::Partition(TopicPartition::new(TopicName::new("orders.v2").unwrap(), PartitionIndex(7)), 12);
        for group in [GroupId::Metadata, partition] {
            assert_eq!(GroupId::parse(&group.key()).unwrap(), group);
        }
        for bad in ["", "meta", "p/", "p/a", "p/a/1", "p/a/x/1", "p/a/1/x", "p/a b/1/1", "p//1/1", "q/a/1/1"] {
            assert!(GroupId::parse(bad).is_err(), "{bad}");
        }
    }
}
