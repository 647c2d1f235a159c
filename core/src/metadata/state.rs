//! The metadata state and its apply function.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::command::{
    validate_member, validate_subscription, MetadataCommand, MetadataOutcome, MetadataRejection, MetadataResult,
    SETTLED_REPORTS_MAX,
};
use super::group::{GroupInfo, MemberInfo};
use super::rows::Rows;
use crate::access::AccessRules;
use crate::assignor::AssignorKind;
use crate::id::{
    BrokerId, Generation, GroupName, MemberId, PartitionIndex, ProducerId, TimestampMs, TopicName, TopicPartition,
};
use crate::invariant::{ensure, InvariantViolation};
use crate::limits::Limits;
use crate::placement::{place_partitions, PartitionPlacement, PlacementLoad};

/// A registered broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    /// Where clients reach it (`host:port`).
    pub address: String,
    /// Where other brokers reach it (`host:port`): its internal listener,
    /// for Raft and broker-to-broker requests.
    pub internal_address: String,
    pub registered_at: TimestampMs,
    /// Being drained: new topics place nothing here, and drains of other
    /// brokers move nothing here.
    pub draining: bool,
}

/// How long a topic keeps records. `None` keeps them forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RetentionPolicy {
    pub max_age_ms: Option<u64>,
    pub max_bytes: Option<u64>,
}

/// A topic and where its partitions live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    /// Unique among every topic ever created in the cluster, so a topic
    /// deleted and created again under the same name is a new set of Raft
    /// groups, never the old data.
    pub id: u64,
    pub partitions: Vec<PartitionPlacement>,
    pub replication_factor: u32,
    pub retention: RetentionPolicy,
    pub created_at: TimestampMs,
}

/// Where a newly created group's generation and member epochs start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GroupFloor {
    pub generation: Generation,
    pub member_epoch: u64,
}

/// The whole cluster metadata, as replicated by the metadata Raft group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataState {
    limits: Limits,
    brokers: Rows<BrokerId, BrokerInfo>,
    topics: Rows<TopicName, TopicInfo>,
    groups: Rows<GroupName, GroupInfo>,
    next_producer_id: ProducerId,
    next_topic_id: u64,
    /// Above every generation and member epoch a deleted group reached: a
    /// group created later starts here, so partition claims of a deleted
    /// group of the same name never fence the new one's members.
    deleted_groups_floor: GroupFloor,
    applied_commands: u64,
    rejected_commands: u64,
    /// Users and the rules that say what principals may do.
    access: AccessRules,
}

/// Keys of the brokers, topics and groups one or more applies changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataChanges {
    pub brokers: BTreeSet<BrokerId>,
    pub topics: BTreeSet<TopicName>,
    pub groups: BTreeSet<GroupName>,
}

/// [`MetadataState::head`], borrowed, to encode. Its fields and their order
/// are [`MetadataHead`]'s: the two must encode alike.
#[derive(Serialize)]
struct MetadataHeadRef<'a> {
    limits: &'a Limits,
    next_producer_id: ProducerId,
    next_topic_id: u64,
    deleted_groups_floor: GroupFloor,
    applied_commands: u64,
    rejected_commands: u64,
    access: &'a AccessRules,
}

/// The metadata state less its brokers, topics and groups, as decoded from
/// [`MetadataState::head`]'s encoding.
#[derive(Debug, Deserialize)]
pub struct MetadataHead {
    limits: Limits,
    next_producer_id: ProducerId,
    next_topic_id: u64,
    deleted_groups_floor: GroupFloor,
    applied_commands: u64,
    rejected_commands: u64,
    access: AccessRules,
}

impl MetadataState {
    /// An empty cluster with these limits. Every replica must start from the
    /// same limits: they decide which commands are rejected.
    pub fn new(limits: Limits) -> Self {
        MetadataState {
            limits,
            brokers: Rows::new(),
            topics: Rows::new(),
            groups: Rows::new(),
            next_producer_id: ProducerId(1),
            next_topic_id: 1,
            deleted_groups_floor: GroupFloor::default(),
            applied_commands: 0,
            rejected_commands: 0,
            access: AccessRules::default(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn brokers(&self) -> &Rows<BrokerId, BrokerInfo> {
        &self.brokers
    }

    pub fn topics(&self) -> &Rows<TopicName, TopicInfo> {
        &self.topics
    }

    pub fn topic(&self, topic: &TopicName) -> Option<&TopicInfo> {
        self.topics.get(topic)
    }

    pub fn groups(&self) -> &Rows<GroupName, GroupInfo> {
        &self.groups
    }

    pub fn group(&self, group: &GroupName) -> Option<&GroupInfo> {
        self.groups.get(group)
    }

    /// Users and access rules.
    pub fn access(&self) -> &AccessRules {
        &self.access
    }

    /// The brokers, topics and groups changed since the last call: what a
    /// store that keeps them as rows must write (or delete, for keys no
    /// longer present).
    pub fn take_changes(&mut self) -> MetadataChanges {
        MetadataChanges {
            brokers: self.brokers.take_changed(),
            topics: self.topics.take_changed(),
            groups: self.groups.take_changed(),
        }
    }

    /// Everything but the brokers, topics and groups (which a store keeps
    /// as rows of their own), to encode; decodes as a [`MetadataHead`].
    pub fn head(&self) -> impl Serialize + '_ {
        MetadataHeadRef {
            limits: &self.limits,
            next_producer_id: self.next_producer_id,
            next_topic_id: self.next_topic_id,
            deleted_groups_floor: self.deleted_groups_floor,
            applied_commands: self.applied_commands,
            rejected_commands: self.rejected_commands,
            access: &self.access,
        }
    }

    /// The state a store kept as a head and rows, with nothing marked
    /// changed.
    pub fn from_rows(
        head: MetadataHead,
        brokers: Rows<BrokerId, BrokerInfo>,
        topics: Rows<TopicName, TopicInfo>,
        groups: Rows<GroupName, GroupInfo>,
    ) -> Self {
        MetadataState {
            limits: head.limits,
            brokers,
            topics,
            groups,
            next_producer_id: head.next_producer_id,
            next_topic_id: head.next_topic_id,
            deleted_groups_floor: head.deleted_groups_floor,
            applied_commands: head.applied_commands,
            rejected_commands: head.rejected_commands,
            access: head.access,
        }
    }

    /// Commands applied and commands rejected so far.
    pub fn command_counts(&self) -> (u64, u64) {
        (self.applied_commands, self.rejected_commands)
    }

    /// Apply one committed command, stamped by the leader at `at`. Never
    /// panics; a rejected command changes nothing but the rejection count.
    pub fn apply(&mut self, at: TimestampMs, command: &MetadataCommand) -> MetadataResult {
        let result = self.apply_inner(at, command);
        match &result {
            Ok(_) => self.applied_commands += 1,
            Err(_rejection) => {
                self.rejected_commands += 1;
                #[cfg(madsim)]
                crate::planted::note_rejection("metadata", _rejection.kind());
            }
        }
        result
    }

    fn apply_inner(&mut self, at: TimestampMs, command: &MetadataCommand) -> MetadataResult {
        match command {
            MetadataCommand::RegisterBroker { broker, address, internal_address } => {
                self.register_broker(at, *broker, address, internal_address)
            }
            MetadataCommand::RemoveBroker { broker } => self.remove_broker(*broker),
            MetadataCommand::CreateTopic { topic, partitions, replication_factor, retention } => {
                self.create_topic(at, topic, *partitions, *replication_factor, *retention)
            }
            MetadataCommand::DeleteTopic { topic } => self.delete_topic(topic),
            MetadataCommand::MoveReplicas { topic, partition, replicas } => {
                self.move_replicas(topic, *partition, replicas)
            }
            MetadataCommand::MoveSettled { topic, topic_id, partition, epoch } => {
                self.move_settled(topic, *topic_id, *partition, *epoch)
            }
            MetadataCommand::MovesSettled { topic, topic_id, partitions } => {
                self.moves_settled(topic, *topic_id, partitions)
            }
            MetadataCommand::DrainBroker { broker } => self.drain_broker(*broker),
            MetadataCommand::JoinGroup { group, member, topics, session_timeout_ms, assignor } => {
                self.join_group(at, group, member, topics, *session_timeout_ms, *assignor)
            }
            MetadataCommand::LeaveGroup { group, member } => self.leave_group(at, group, member),
            MetadataCommand::ExpireMembers { group, members } => self.expire_members(at, group, members),
            MetadataCommand::AllocateProducerId => self.allocate_producer_id(),
            MetadataCommand::AlterTopic { topic, partitions, retention } => {
                self.alter_topic(topic, *partitions, *retention)
            }
            MetadataCommand::DeleteGroup { group } => self.delete_group(group),
            MetadataCommand::SetUser { user, credential, replace } => {
                Ok(MetadataOutcome::Access(self.access.set_user(user, credential, *replace)?))
            }
            MetadataCommand::DeleteUser { user } => Ok(MetadataOutcome::Access(self.access.delete_user(user)?)),
            MetadataCommand::AddAcl { acl } => Ok(MetadataOutcome::Access(self.access.add_acl(acl)?)),
            MetadataCommand::RemoveAcl { acl } => Ok(MetadataOutcome::Access(self.access.remove_acl(acl)?)),
            MetadataCommand::SetLimit { name, value } => self.set_limit(name, *value),
            MetadataCommand::ForgetGroup { group, empty_since } => self.forget_group(at, group, *empty_since),
        }
    }

    fn register_broker(
        &mut self,
        at: TimestampMs,
        broker: BrokerId,
        address: &str,
        internal_address: &str,
    ) -> MetadataResult {
        let max = self.limits.broker_address_bytes_max as usize;
        for address in [address, internal_address] {
            let reason = if address.is_empty() {
                Some("it is empty: give host:port".to_string())
            } else if address.len() > max {
                Some(format!("it is longer than {max} bytes"))
            } else if address.chars().any(|c| c.is_whitespace() || c.is_control()) {
                Some("it contains whitespace or control characters".to_string())
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(MetadataRejection::InvalidBrokerAddress {
                    address: address.chars().take(max).collect(),
                    reason,
                });
            }
        }
        if !self.brokers.contains_key(&broker) && self.brokers.len() as u64 >= u64::from(self.limits.brokers_max) {
            return Err(MetadataRejection::TooManyBrokers { max: self.limits.brokers_max });
        }
        let registered_at = self.brokers.get(&broker).map_or(at, |known| known.registered_at);
        let draining = self.brokers.get(&broker).is_some_and(|known| known.draining);
        let info = BrokerInfo {
            address: address.to_string(),
            internal_address: internal_address.to_string(),
            registered_at,
            draining,
        };
        self.brokers.insert(broker, info);
        Ok(MetadataOutcome::BrokerRegistered { broker })
    }

    fn remove_broker(&mut self, broker: BrokerId) -> MetadataResult {
        if !self.brokers.contains_key(&broker) {
            return Err(MetadataRejection::UnknownBroker { broker });
        }
        let replicas = self.replicas_on(broker);
        if replicas > 0 {
            return Err(MetadataRejection::BrokerHoldsReplicas { broker, replicas });
        }
        self.brokers.remove(&broker);
        Ok(MetadataOutcome::BrokerRemoved { broker })
    }

    /// How many partition replicas a broker holds, counting those moved off
    /// it whose groups may still name it.
    pub fn replicas_on(&self, broker: BrokerId) -> u64 {
        self.topics
            .values()
            .flat_map(|t| &t.partitions)
            .filter(|p| p.replicas.contains(&broker) || p.leaving.contains(&broker))
            .count() as u64
    }

    fn create_topic(
        &mut self,
        at: TimestampMs,
        topic: &str,
        partitions: u32,
        replication_factor: u32,
        retention: RetentionPolicy,
    ) -> MetadataResult {
        let topic = TopicName::new(topic)?;
        if self.topics.contains_key(&topic) {
            return Err(MetadataRejection::TopicExists { topic });
        }
        if partitions == 0 || partitions > self.limits.partitions_per_topic_max {
            return Err(MetadataRejection::InvalidPartitionCount {
                requested: partitions,
                max: self.limits.partitions_per_topic_max,
            });
        }
        if replication_factor > self.limits.replication_factor_max {
            return Err(MetadataRejection::ReplicationFactorTooHigh {
                requested: replication_factor,
                max: self.limits.replication_factor_max,
            });
        }
        if self.topics.len() as u64 >= u64::from(self.limits.topics_max) {
            return Err(MetadataRejection::TooManyTopics { max: self.limits.topics_max });
        }
        let brokers: BTreeSet<BrokerId> = self.brokers.iter().filter(|(_, b)| !b.draining).map(|(id, _)| *id).collect();
        let placements = place_partitions(&brokers, &self.placement_load(), partitions, replication_factor)?;
        let info = TopicInfo {
            id: self.next_topic_id,
            partitions: placements.clone(),
            replication_factor,
            retention,
            created_at: at,
        };
        self.next_topic_id += 1;
        self.topics.insert(topic.clone(), info);
        self.rebalance_groups_subscribed_to(&topic);
        Ok(MetadataOutcome::TopicCreated { topic, placements })
    }

    fn placement_load(&self) -> PlacementLoad {
        let mut load = PlacementLoad::default();
        for topic in self.topics.values() {
            load.add(&topic.partitions);
        }
        load
    }

    fn delete_topic(&mut self, topic: &str) -> MetadataResult {
        let name = TopicName::new(topic)?;
        let Some(info) = self.topics.remove(&name) else {
            return Err(MetadataRejection::UnknownTopic { topic: topic.to_string() });
        };
        self.rebalance_groups_subscribed_to(&name);
        Ok(MetadataOutcome::TopicDeleted { topic: name, partitions: info.partitions.len() as u32 })
    }

    fn alter_topic(
        &mut self,
        topic: &str,
        partitions: Option<u32>,
        retention: Option<RetentionPolicy>,
    ) -> MetadataResult {
        let name = TopicName::new(topic)?;
        let Some(info) = self.topics.get(&name) else {
            return Err(MetadataRejection::UnknownTopic { topic: topic.to_string() });
        };
        let current = info.partitions.len() as u32;
        let requested = partitions.unwrap_or(current);
        if requested < current {
            return Err(MetadataRejection::PartitionCountDecrease { topic: name, current, requested });
        }
        if requested > self.limits.partitions_per_topic_max {
            return Err(MetadataRejection::InvalidPartitionCount {
                requested,
                max: self.limits.partitions_per_topic_max,
            });
        }
        let added = requested - current;
        let placements = if added > 0 {
            let brokers: BTreeSet<BrokerId> =
                self.brokers.iter().filter(|(_, b)| !b.draining).map(|(id, _)| *id).collect();
            place_partitions(&brokers, &self.placement_load(), added, info.replication_factor)?
        } else {
            Vec::new()
        };
        let info = self.topics.get_mut(&name).expect("looked up above");
        info.partitions.extend(placements.iter().cloned());
        if let Some(retention) = retention {
            info.retention = retention;
        }
        if added > 0 {
            self.rebalance_groups_subscribed_to(&name);
        }
        Ok(MetadataOutcome::TopicAltered { topic: name, partitions: requested, added: placements })
    }

    fn delete_group(&mut self, group: &str) -> MetadataResult {
        let name = GroupName::new(group)?;
        let Some(info) = self.groups.get(&name) else {
            return Err(MetadataRejection::UnknownGroup { group: group.to_string() });
        };
        if !info.members.is_empty() {
            return Err(MetadataRejection::GroupHasMembers { group: name, members: info.members.len() as u32 });
        }
        self.remove_group(&name);
        Ok(MetadataOutcome::GroupDeleted { group: name })
    }

    /// Remove a group, raising the floor a later group of its name starts
    /// from above everything it handed out.
    fn remove_group(&mut self, name: &GroupName) {
        let Some(info) = self.groups.remove(name) else { return };
        let floor = &mut self.deleted_groups_floor;
        floor.generation = floor.generation.max(info.generation.next());
        floor.member_epoch = floor.member_epoch.max(info.next_member_epoch);
    }

    fn forget_group(&mut self, at: TimestampMs, group: &str, empty_since: TimestampMs) -> MetadataResult {
        let name = GroupName::new(group)?;
        let not_expired = |reason: String| MetadataRejection::GroupNotExpired { group: group.to_string(), reason };
        let Some(info) = self.groups.get(&name) else {
            return Err(MetadataRejection::UnknownGroup { group: group.to_string() });
        };
        if info.empty_since != Some(empty_since) {
            return Err(not_expired(format!(
                "it has had members since {empty_since} (empty since: {:?})",
                info.empty_since.map(|t| t.0)
            )));
        }
        let retention = self.limits.group_retention_ms;
        if at.0 < empty_since.0.saturating_add(retention) {
            return Err(not_expired(format!(
                "it has been empty for {} ms of the {retention} ms group_retention_ms keeps it",
                at.0.saturating_sub(empty_since.0)
            )));
        }
        self.remove_group(&name);
        Ok(MetadataOutcome::GroupForgotten { group: name })
    }

    /// Change a cluster setting, unless the state already holds more than
    /// the new value admits (the invariants bound every count by its limit).
    fn set_limit(&mut self, name: &str, value: u64) -> MetadataResult {
        // The value itself first (unknown, fixed or out of range), then
        // against what the state holds.
        let mut limits = self.limits.clone();
        let previous = limits.set(name, value)?;
        let largest = |items: Vec<(u64, String)>| items.into_iter().max_by_key(|(count, _)| *count);
        let held: Option<(u64, String)> = match name {
            "topics_max" => Some((self.topics.len() as u64, format!("{} topics", self.topics.len()))),
            "brokers_max" => Some((self.brokers.len() as u64, format!("{} brokers", self.brokers.len()))),
            "groups_max" => Some((self.groups.len() as u64, format!("{} groups", self.groups.len()))),
            "partitions_per_topic_max" => {
                largest(self.topics.iter().map(|(n, t)| (t.partitions.len() as u64, format!("topic {n}"))).collect())
            }
            "replication_factor_max" => largest(
                self.topics.iter().map(|(n, t)| (u64::from(t.replication_factor), format!("topic {n}"))).collect(),
            ),
            // A broker registers again on every start: its addresses must
            // stay admissible.
            "broker_address_bytes_max" => largest(
                self.brokers
                    .iter()
                    .map(|(id, b)| {
                        let longest = b.address.len().max(b.internal_address.len()) as u64;
                        (longest, format!("broker {id}'s address"))
                    })
                    .collect(),
            ),
            "members_per_group_max" => {
                largest(self.groups.iter().map(|(n, g)| (g.members.len() as u64, format!("group {n}"))).collect())
            }
            _ => None,
        };
        if let Some((current, example)) = held.filter(|(current, _)| value < *current) {
            return Err(MetadataRejection::SettingBelowCurrent { name: name.to_string(), value, current, example });
        }
        self.limits = limits;
        Ok(MetadataOutcome::LimitSet { name: name.to_string(), previous, value })
    }

    fn move_replicas(&mut self, topic: &str, partition: PartitionIndex, replicas: &[BrokerId]) -> MetadataResult {
        let name = TopicName::new(topic)?;
        let distinct: BTreeSet<BrokerId> = replicas.iter().copied().collect();
        let reason = if replicas.is_empty() {
            Some("it is empty: name at least one broker".to_string())
        } else if distinct.len() != replicas.len() {
            Some("it names a broker twice".to_string())
        } else if replicas.len() as u64 > u64::from(self.limits.replication_factor_max) {
            Some(format!("it has more than {} replicas", self.limits.replication_factor_max))
        } else {
            distinct.iter().find(|b| !self.brokers.contains_key(b)).map(|b| format!("broker {b} is not registered"))
        };
        let Some(info) = self.topics.get_mut(&name) else {
            return Err(MetadataRejection::UnknownTopic { topic: topic.to_string() });
        };
        let partitions = info.partitions.len() as u32;
        if partition.0 >= partitions {
            return Err(MetadataRejection::UnknownPartition { topic: name, partition, partitions });
        }
        let reason = reason.or_else(|| {
            (replicas.len() as u64 != u64::from(info.replication_factor)).then(|| {
                format!(
                    "it has {} replicas, and topic {name} has replication factor {}: name exactly that many brokers",
                    replicas.len(),
                    info.replication_factor
                )
            })
        });
        if let Some(reason) = reason {
            return Err(MetadataRejection::InvalidReplicas { replicas: replicas.to_vec(), reason });
        }
        let Some(placement) = info.partitions.get_mut(partition.0 as usize) else {
            return Err(MetadataRejection::UnknownPartition { topic: name, partition, partitions });
        };
        if !placement.started {
            return Err(MetadataRejection::PartitionNotStarted { partition: TopicPartition::new(name, partition) });
        }
        let from = std::mem::replace(&mut placement.replicas, replicas.to_vec());
        placement.epoch = placement.epoch.saturating_add(1);
        placement.leaving = leaving_after_move(&placement.leaving, &from, replicas);
        Ok(MetadataOutcome::ReplicasMoved {
            partition: TopicPartition::new(name, partition),
            from,
            to: replicas.to_vec(),
        })
    }

    fn move_settled(&mut self, topic: &str, topic_id: u64, partition: PartitionIndex, epoch: u64) -> MetadataResult {
        let name = TopicName::new(topic)?;
        let stale = || MetadataRejection::StaleMoveReport { topic: topic.to_string(), topic_id, partition, epoch };
        let Some(info) = self.topics.get_mut(&name).filter(|t| t.id == topic_id) else { return Err(stale()) };
        let Some(placement) = info.partitions.get_mut(partition.0 as usize).filter(|p| p.epoch == epoch) else {
            return Err(stale());
        };
        placement.leaving.clear();
        placement.started = true;
        Ok(MetadataOutcome::MoveSettled { partition: TopicPartition::new(name, partition) })
    }

    fn moves_settled(&mut self, topic: &str, topic_id: u64, partitions: &[(PartitionIndex, u64)]) -> MetadataResult {
        if partitions.len() > SETTLED_REPORTS_MAX {
            return Err(MetadataRejection::TooManyReports { count: partitions.len(), max: SETTLED_REPORTS_MAX });
        }
        let name = TopicName::new(topic)?;
        let Some(info) = self.topics.get_mut(&name).filter(|t| t.id == topic_id) else {
            let (partition, epoch) = partitions.first().copied().unwrap_or((PartitionIndex(0), 0));
            return Err(MetadataRejection::StaleMoveReport { topic: topic.to_string(), topic_id, partition, epoch });
        };
        let (mut settled, mut stale) = (Vec::new(), Vec::new());
        for &(partition, epoch) in partitions {
            match info.partitions.get_mut(partition.0 as usize).filter(|p| p.epoch == epoch) {
                Some(placement) => {
                    placement.leaving.clear();
                    placement.started = true;
                    settled.push(partition);
                }
                None => stale.push(partition),
            }
        }
        Ok(MetadataOutcome::MovesSettled { topic: name, settled, stale })
    }

    /// Move every replica off `broker` (all or nothing): each to the other
    /// broker with the fewest replicas (ties: lowest id) that is not
    /// draining and does not hold the partition.
    fn drain_broker(&mut self, broker: BrokerId) -> MetadataResult {
        if !self.brokers.contains_key(&broker) {
            return Err(MetadataRejection::UnknownBroker { broker });
        }
        let mut load: BTreeMap<BrokerId, u64> =
            self.brokers.iter().filter(|(id, b)| **id != broker && !b.draining).map(|(id, _)| (*id, 0)).collect();
        for placement in self.topics.values().flat_map(|t| &t.partitions) {
            for replica in &placement.replicas {
                if let Some(count) = load.get_mut(replica) {
                    *count += 1;
                }
            }
        }
        // All or nothing: the moves are made on a copy (O(1): the rows
        // share structure), kept only if every replica found a place.
        let mut topics = self.topics.clone();
        let holding: Vec<TopicName> = topics
            .iter()
            .filter(|(_, info)| info.partitions.iter().any(|p| p.replicas.contains(&broker)))
            .map(|(name, _)| name.clone())
            .collect();
        let mut moved = 0u64;
        for name in holding {
            let info = topics.get_mut(&name).expect("listed above");
            for (index, placement) in info.partitions.iter_mut().enumerate() {
                let Some(slot) = placement.replicas.iter().position(|b| *b == broker) else { continue };
                if !placement.started {
                    let partition = TopicPartition::new(name.clone(), PartitionIndex(index as u32));
                    return Err(MetadataRejection::PartitionNotStarted { partition });
                }
                let target = load
                    .iter()
                    .filter(|(candidate, _)| !placement.replicas.contains(candidate))
                    .min_by_key(|(candidate, count)| (**count, **candidate))
                    .map(|(candidate, _)| *candidate);
                let Some(target) = target else {
                    let partition = TopicPartition::new(name.clone(), PartitionIndex(index as u32));
                    return Err(MetadataRejection::NowhereToDrain { broker, partition });
                };
                *load.get_mut(&target).expect("a candidate") += 1;
                let from = placement.replicas.clone();
                placement.replicas[slot] = target;
                placement.epoch = placement.epoch.saturating_add(1);
                placement.leaving = leaving_after_move(&placement.leaving, &from, &placement.replicas);
                moved += 1;
            }
        }
        self.topics = topics;
        self.brokers.get_mut(&broker).expect("checked above").draining = true;
        Ok(MetadataOutcome::BrokerDrained { broker, moved })
    }

    fn join_group(
        &mut self,
        at: TimestampMs,
        group: &str,
        member: &str,
        topics: &[String],
        session_timeout_ms: u64,
        assignor: Option<AssignorKind>,
    ) -> MetadataResult {
        let group_name = GroupName::new(group)?;
        let assignor =
            assignor.unwrap_or_else(|| self.groups.get(&group_name).map_or_else(AssignorKind::default, |g| g.assignor));
        let member_id = validate_member(member)?;
        let subscription = validate_subscription(topics, self.limits.subscriptions_per_member_max)?;
        let (min, max) = (self.limits.session_timeout_ms_min, self.limits.session_timeout_ms_max);
        if !(min..=max).contains(&session_timeout_ms) {
            return Err(MetadataRejection::SessionTimeoutOutOfRange { requested: session_timeout_ms, min, max });
        }
        if !self.groups.contains_key(&group_name) && self.groups.len() as u64 >= u64::from(self.limits.groups_max) {
            return Err(MetadataRejection::TooManyGroups { max: self.limits.groups_max });
        }
        if let Some(existing) = self.groups.get(&group_name) {
            if existing.assignor != assignor && !existing.members.is_empty() {
                return Err(MetadataRejection::AssignorMismatch {
                    group: group.to_string(),
                    current: existing.assignor,
                    requested: assignor,
                });
            }
            if !existing.members.contains_key(&member_id)
                && existing.members.len() as u64 >= u64::from(self.limits.members_per_group_max)
            {
                return Err(MetadataRejection::TooManyMembers {
                    group: group.to_string(),
                    max: self.limits.members_per_group_max,
                });
            }
        }
        if !self.groups.contains_key(&group_name) {
            self.groups.insert(group_name.clone(), GroupInfo::starting_at(assignor, self.deleted_groups_floor));
        }
        let topics = &self.topics;
        let info = self.groups.get_mut(&group_name).expect("inserted above");
        info.assignor = assignor;
        info.empty_since = None;
        // Every join is a new membership with its own epoch, so that an
        // older process (or an earlier join) of the same member id is
        // fenced; only a changed subscription moves partitions.
        let resubscribed = info.members.get(&member_id).is_none_or(|m| m.topics != subscription);
        let member_epoch = info.next_member_epoch;
        info.next_member_epoch += 1;
        info.members.insert(
            member_id.clone(),
            MemberInfo { topics: subscription, session_timeout_ms, member_epoch, joined_at: at },
        );
        if resubscribed {
            info.rebalance(|topic| partition_count(topics, topic));
        }
        Ok(MetadataOutcome::Joined {
            generation: info.generation,
            member_epoch: info.members[&member_id].member_epoch,
            partitions: info.partitions_of(&member_id),
        })
    }

    fn leave_group(&mut self, at: TimestampMs, group: &str, member: &str) -> MetadataResult {
        let (group_name, member_id) = (GroupName::new(group)?, validate_member(member)?);
        if !self.groups.get(&group_name).is_some_and(|info| info.members.contains_key(&member_id)) {
            return Err(match self.groups.contains_key(&group_name) {
                true => MetadataRejection::UnknownMember { group: group.to_string(), member: member.to_string() },
                false => MetadataRejection::UnknownGroup { group: group.to_string() },
            });
        }
        let topics = &self.topics;
        let info = self.groups.get_mut(&group_name).expect("checked above");
        info.members.remove(&member_id);
        if info.members.is_empty() {
            info.empty_since = Some(at);
        }
        info.rebalance(|topic| partition_count(topics, topic));
        Ok(MetadataOutcome::Left { generation: info.generation })
    }

    fn expire_members(&mut self, at: TimestampMs, group: &str, members: &[(String, u64)]) -> MetadataResult {
        let group_name = GroupName::new(group)?;
        let Some(current) = self.groups.get(&group_name) else {
            return Err(MetadataRejection::UnknownGroup { group: group.to_string() });
        };
        if !members.iter().any(|(member, epoch)| {
            MemberId::new(member.as_str())
                .is_ok_and(|id| current.members.get(&id).is_some_and(|m| m.member_epoch == *epoch))
        }) {
            return Ok(MetadataOutcome::MembersExpired { generation: current.generation, expired: Vec::new() });
        }
        let topics = &self.topics;
        let info = self.groups.get_mut(&group_name).expect("looked up above");
        let mut expired = Vec::new();
        for (member, epoch) in members {
            let Ok(member_id) = MemberId::new(member.as_str()) else {
                continue;
            };
            if info.members.get(&member_id).is_some_and(|m| m.member_epoch == *epoch) {
                info.members.remove(&member_id);
                expired.push(member_id);
            }
        }
        if !expired.is_empty() {
            if info.members.is_empty() {
                info.empty_since = Some(at);
            }
            info.rebalance(|topic| partition_count(topics, topic));
        }
        Ok(MetadataOutcome::MembersExpired { generation: info.generation, expired })
    }

    fn allocate_producer_id(&mut self) -> MetadataResult {
        let producer = self.next_producer_id;
        if producer.0 == u64::MAX {
            return Err(MetadataRejection::ProducerIdsExhausted);
        }
        self.next_producer_id = ProducerId(producer.0 + 1);
        Ok(MetadataOutcome::ProducerIdAllocated { producer })
    }

    /// Every existing topic's partition count.
    pub fn partition_counts(&self) -> BTreeMap<TopicName, u32> {
        self.topics.iter().map(|(name, info)| (name.clone(), info.partitions.len() as u32)).collect()
    }

    fn rebalance_groups_subscribed_to(&mut self, topic: &TopicName) {
        let subscribed: Vec<GroupName> =
            self.groups.iter().filter(|(_, g)| g.subscribes_to(topic)).map(|(name, _)| name.clone()).collect();
        let topics = &self.topics;
        for name in subscribed {
            let info = self.groups.get_mut(&name).expect("listed above");
            info.rebalance(|topic| partition_count(topics, topic));
        }
    }

    /// Check every invariant of the metadata state.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        ensure(self.brokers.len() as u64 <= u64::from(self.limits.brokers_max), || {
            "more brokers than brokers_max".into()
        })?;
        ensure(self.topics.len() as u64 <= u64::from(self.limits.topics_max), || "more topics than topics_max".into())?;
        ensure(self.groups.len() as u64 <= u64::from(self.limits.groups_max), || "more groups than groups_max".into())?;
        ensure(self.next_producer_id.0 >= 1, || "producer id 0 is reserved".into())?;
        self.access.check_invariants().map_err(InvariantViolation)?;
        let ids: BTreeSet<u64> = self.topics.values().map(|t| t.id).collect();
        ensure(ids.len() == self.topics.len(), || "two topics share an id".into())?;
        ensure(ids.iter().all(|id| *id >= 1 && *id < self.next_topic_id), || "a topic id was not allocated".into())?;
        for (name, topic) in self.topics.iter() {
            let count = topic.partitions.len() as u64;
            ensure(count >= 1 && count <= u64::from(self.limits.partitions_per_topic_max), || {
                format!("topic {name} has {count} partitions")
            })?;
            for (index, placement) in topic.partitions.iter().enumerate() {
                ensure(placement.leaving.iter().all(|b| !placement.replicas.contains(b)), || {
                    format!("{name}/{index} lists a placed broker as leaving")
                })?;
                ensure(placement.leaving.iter().all(|b| self.brokers.contains_key(b)), || {
                    format!("{name}/{index} lists an unknown broker as leaving")
                })?;
                let distinct: BTreeSet<_> = placement.replicas.iter().collect();
                ensure(!placement.replicas.is_empty(), || format!("{name}/{index} has no replicas"))?;
                ensure(distinct.len() == placement.replicas.len(), || format!("{name}/{index} repeats a broker"))?;
                for broker in &placement.replicas {
                    ensure(self.brokers.contains_key(broker), || {
                        format!("{name}/{index} is on unknown broker {broker}")
                    })?;
                }
            }
        }
        let counts = self.partition_counts();
        for (name, group) in self.groups.iter() {
            ensure(group.members.len() as u64 <= u64::from(self.limits.members_per_group_max), || {
                format!("group {name} is over members_per_group_max")
            })?;
            for (partition, owner) in group.assignment.iter() {
                let member = group.members.get(owner);
                ensure(member.is_some(), || format!("group {name}: {partition} owned by non-member {owner}"))?;
                ensure(member.is_some_and(|m| m.topics.contains(&partition.topic)), || {
                    format!("group {name}: {owner} owns unsubscribed {partition}")
                })?;
                ensure(counts.get(&partition.topic).is_some_and(|c| partition.partition.0 < *c), || {
                    format!("group {name}: {partition} does not exist")
                })?;
                ensure(group.members.values().all(|m| m.member_epoch < group.next_member_epoch), || {
                    format!("group {name}: member epoch not below next")
                })?;
            }
            let expected: u64 = counts.iter().filter(|(t, _)| group.subscribes_to(t)).map(|(_, c)| u64::from(*c)).sum();
            ensure(group.assignment.len() as u64 == expected, || {
                format!("group {name}: {} of {expected} partitions assigned", group.assignment.len())
            })?;
        }
        Ok(())
    }
}

/// A topic's partition count, if it exists.
fn partition_count(topics: &Rows<TopicName, TopicInfo>, topic: &TopicName) -> Option<u32> {
    topics.get(topic).map(|info| info.partitions.len() as u32)
}

/// The brokers that may still be members of a partition's group after its
/// replicas moved from `from` to `to`: those that already were, and the
/// replicas moved off, less the ones placed again.
fn leaving_after_move(leaving: &[BrokerId], from: &[BrokerId], to: &[BrokerId]) -> Vec<BrokerId> {
    let set: BTreeSet<BrokerId> = leaving.iter().chain(from).filter(|b| !to.contains(b)).copied().collect();
    set.into_iter().collect()
}
