//! A consumer group as the metadata state machine holds it: members, their
//! subscriptions, the assignment and its generation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::state::GroupFloor;
use crate::assignor::{assign, Assignment, AssignmentInput, AssignorKind};
use crate::id::{Generation, MemberId, TimestampMs, TopicName, TopicPartition};

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub topics: BTreeSet<TopicName>,
    pub session_timeout_ms: u64,
    /// Distinguishes this membership from an earlier one of the same id, so a
    /// late expiry of the old one cannot remove the new one.
    pub member_epoch: u64,
    pub joined_at: TimestampMs,
}

/// One consumer group.
///
/// A group stays, with no members, until it is deleted; its generation must
/// keep rising, or a re-created group would reuse generations that
/// partition claims have already fenced off: a group created after a
/// deletion starts above every deleted group's (`GroupFloor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    pub generation: Generation,
    pub assignor: AssignorKind,
    pub members: BTreeMap<MemberId, MemberInfo>,
    /// Shared: a change to the group (a copy of it, as the metadata's rows
    /// make on write) copies the assignment only when it is recomputed.
    pub assignment: Arc<Assignment>,
    /// The epoch the next joining member gets.
    pub next_member_epoch: u64,
    /// When its last member left (the leader's stamp), while it has none:
    /// an empty group is forgotten `group_retention_ms` after.
    pub empty_since: Option<TimestampMs>,
}

impl GroupInfo {
    pub fn new(assignor: AssignorKind) -> Self {
        Self::starting_at(assignor, GroupFloor::default())
    }

    /// A new group whose generation and member epochs start above `floor`.
    pub fn starting_at(assignor: AssignorKind, floor: GroupFloor) -> Self {
        GroupInfo {
            generation: floor.generation,
            assignor,
            members: BTreeMap::new(),
            assignment: Arc::default(),
            next_member_epoch: floor.member_epoch.max(1),
            empty_since: None,
        }
    }

    /// Whether any member subscribes to `topic`.
    pub fn subscribes_to(&self, topic: &TopicName) -> bool {
        self.members.values().any(|m| m.topics.contains(topic))
    }

    /// Recompute the assignment, given each topic's partition count (`None`:
    /// the topic does not exist); bump the generation if it changed. Looks
    /// up only the topics this group's members subscribe to.
    pub fn rebalance(&mut self, partition_count: impl Fn(&TopicName) -> Option<u32>) {
        let subscriptions: BTreeMap<MemberId, BTreeSet<TopicName>> =
            self.members.iter().map(|(id, member)| (id.clone(), member.topics.clone())).collect();
        let subscribed: BTreeSet<&TopicName> = subscriptions.values().flatten().collect();
        let topics: BTreeMap<TopicName, u32> = subscribed
            .into_iter()
            .filter_map(|topic| partition_count(topic).map(|count| (topic.clone(), count)))
            .collect();
        let next = assign(
            self.assignor,
            AssignmentInput { topics: &topics, members: &subscriptions, previous: &self.assignment },
        );
        if next != *self.assignment {
            self.assignment = Arc::new(next);
            self.generation = self.generation.next();
        }
    }

    /// The partitions a member owns.
    pub fn partitions_of(&self, member: &MemberId) -> Vec<TopicPartition> {
        self.assignment.partitions_of(member)
    }
}
