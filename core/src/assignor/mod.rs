//! Assignors: which group member consumes which partition.
//!
//! An assignor is a pure function of the group's subscriptions, the topics'
//! partition counts and (for the sticky assignor) the previous assignment.
//! Inputs are ordered maps, so the result never depends on the order in
//! which members joined or topics were listed. Every partition of a
//! subscribed topic gets exactly one owner, always a member subscribed to
//! that topic.
//!
//! - [`AssignorKind::StickyBalanced`] (the default): keeps every partition
//!   where it was unless balance requires a move; member counts differ by at
//!   most one when members share a subscription.
//! - [`AssignorKind::Range`]: each topic's partitions in contiguous ranges.
//!   Balanced per topic, not across topics (as in Kafka).
//! - [`AssignorKind::RoundRobin`]: all partitions dealt in order.

mod range;
mod round_robin;
mod sticky;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::id::{MemberId, PartitionIndex, TopicName, TopicPartition};

/// Which assignment strategy a group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AssignorKind {
    #[default]
    StickyBalanced,
    Range,
    RoundRobin,
}

/// Partition owners of one group: topic, then partition, then member.
///
/// Nested maps rather than a map keyed by [`TopicPartition`], so that the
/// assignment also encodes as JSON (whose map keys must be strings).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Assignment {
    owners: BTreeMap<TopicName, BTreeMap<PartitionIndex, MemberId>>,
}

impl Assignment {
    /// The member that owns a partition, if any.
    pub fn owner(&self, partition: &TopicPartition) -> Option<&MemberId> {
        self.owners.get(&partition.topic)?.get(&partition.partition)
    }

    /// Give a partition to a member, replacing any previous owner.
    pub fn set_owner(&mut self, partition: TopicPartition, member: MemberId) {
        self.owners.entry(partition.topic).or_default().insert(partition.partition, member);
    }

    /// Every (partition, owner), in partition order.
    pub fn iter(&self) -> impl Iterator<Item = (TopicPartition, &MemberId)> + '_ {
        self.owners.iter().flat_map(|(topic, partitions)| {
            partitions.iter().map(move |(index, member)| (TopicPartition::new(topic.clone(), *index), member))
        })
    }

    /// The partitions a member owns, in order.
    pub fn partitions_of(&self, member: &MemberId) -> Vec<TopicPartition> {
        let mut owned = Vec::new();
        for (topic, partitions) in &self.owners {
            let mine = partitions.iter().filter(|(_, owner)| *owner == member);
            owned.extend(mine.map(|(index, _)| TopicPartition::new(topic.clone(), *index)));
        }
        owned
    }

    /// How many partitions each member owns (members owning none are absent).
    pub fn counts(&self) -> BTreeMap<MemberId, u64> {
        let mut counts = BTreeMap::new();
        for (_, member) in self.iter() {
            *counts.entry(member.clone()).or_default() += 1;
        }
        counts
    }

    /// Number of owned partitions.
    pub fn len(&self) -> usize {
        self.owners.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an assignor sees.
#[derive(Debug, Clone, Copy)]
pub struct AssignmentInput<'a> {
    /// Partition count of every existing topic.
    pub topics: &'a BTreeMap<TopicName, u32>,
    /// Each member's subscribed topics.
    pub members: &'a BTreeMap<MemberId, BTreeSet<TopicName>>,
    /// The assignment of the previous generation (used by the sticky
    /// assignor; the others ignore it).
    pub previous: &'a Assignment,
}

impl AssignmentInput<'_> {
    /// Every partition of a topic that exists and has a subscriber, in order,
    /// with the members subscribed to it, in order.
    fn eligible_partitions(&self) -> Vec<(TopicPartition, Vec<&MemberId>)> {
        let mut result = Vec::new();
        for (topic, count) in self.topics {
            let subscribers: Vec<&MemberId> =
                self.members.iter().filter(|(_, topics)| topics.contains(topic)).map(|(member, _)| member).collect();
            if subscribers.is_empty() {
                continue;
            }
            for index in 0..*count {
                result.push((TopicPartition::new(topic.clone(), PartitionIndex(index)), subscribers.clone()));
            }
        }
        result
    }
}

/// Compute a group's assignment.
pub fn assign(kind: AssignorKind, input: AssignmentInput<'_>) -> Assignment {
    match kind {
        AssignorKind::StickyBalanced => sticky::assign(input),
        AssignorKind::Range => range::assign(input),
        AssignorKind::RoundRobin => round_robin::assign(input),
    }
}
