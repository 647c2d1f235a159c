//! Raft group ids: the metadata group, or one partition's group.

use std::fmt;

use keel_core::{PartitionIndex, TopicName, TopicPartition};

/// Which Raft group a request, a log entry or a store row belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupId {
    /// Cluster metadata: on every broker.
    Metadata,
    /// One partition, on its replicas.
    Partition(TopicPartition),
}

/// A string that does not name a group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} does not name a Raft group: expected \"metadata\" or \"p/<topic>/<partition>\"")]
pub struct BadGroupKey(pub String);

impl GroupId {
    /// The stable key used on the wire and in the store: `metadata` or
    /// `p/<topic>/<partition>` (topic names cannot contain `/`).
    pub fn key(&self) -> String {
        match self {
            GroupId::Metadata => "metadata".to_string(),
            GroupId::Partition(tp) => format!("p/{}/{}", tp.topic, tp.partition),
        }
    }

    /// Parse a key made by [`GroupId::key`].
    pub fn parse(key: &str) -> Result<GroupId, BadGroupKey> {
        if key == "metadata" {
            return Ok(GroupId::Metadata);
        }
        let bad = || BadGroupKey(key.chars().take(300).collect());
        let rest = key.strip_prefix("p/").ok_or_else(bad)?;
        let (topic, index) = rest.rsplit_once('/').ok_or_else(bad)?;
        let topic = TopicName::new(topic).map_err(|_| bad())?;
        let index: u32 = index.parse().map_err(|_| bad())?;
        Ok(GroupId::Partition(TopicPartition::new(topic, PartitionIndex(index))))
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
            GroupId::Partition(TopicPartition::new(TopicName::new("orders.v2").unwrap(), PartitionIndex(7)));
        for group in [GroupId::Metadata, partition] {
            assert_eq!(GroupId::parse(&group.key()).unwrap(), group);
        }
        for bad in ["", "meta", "p/", "p/a", "p/a/x", "p/a b/1", "p//1", "q/a/1"] {
            assert!(GroupId::parse(bad).is_err(), "{bad}");
        }
    }
}
