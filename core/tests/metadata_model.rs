//! Model test of the metadata state machine: random sequences of valid and
//! invalid commands, each compared with a small reference model, with
//! `check_invariants()` after every step. The model decides independently
//! whether a command applies and which rejection it gets.

use std::collections::{BTreeMap, BTreeSet};

use keel_core::access::{AccessOutcome, Acl, Credential, Operation, PatternKind, ResourceKind};
use keel_core::assignor::AssignorKind;
use keel_core::metadata::{MetadataCommand, MetadataOutcome, MetadataRejection, MetadataState, RetentionPolicy};
use keel_core::{BrokerId, GroupName, Limits, MemberId, PartitionIndex, TimestampMs, TopicName};
use proptest::prelude::*;

#[path = "common/mod.rs"]
mod common;

fn limits() -> Limits {
    Limits {
        partitions_per_topic_max: 4,
        replication_factor_max: 3,
        topics_max: 3,
        brokers_max: 4,
        broker_address_bytes_max: 12,
        groups_max: 2,
        members_per_group_max: 3,
        subscriptions_per_member_max: 2,
        session_timeout_ms_min: 100,
        session_timeout_ms_max: 1000,
        ..Limits::default()
    }
}

const TOPICS: [&str; 5] = ["a", "b", "c", "", "bad name"];
const GROUPS: [&str; 3] = ["g1", "g2", "g/3"];
const MEMBERS: [&str; 5] = ["m1", "m2", "m3", "m4", ""];
const ADDRESSES: [&str; 4] = ["h:1", "h:2", "", "far-too-long:9999"];

fn command() -> impl Strategy<Value = MetadataCommand> {
    let name = |pool: &'static [&'static str]| proptest::sample::select(pool).prop_map(str::to_string);
    let assignor =
        proptest::sample::select(&[AssignorKind::StickyBalanced, AssignorKind::Range, AssignorKind::RoundRobin][..]);
    prop_oneof![
        3 => (1u64..6, name(&ADDRESSES)).prop_map(|(b, address)| MetadataCommand::RegisterBroker { broker: BrokerId(b), internal_address: address.clone(), address }),
        1 => (1u64..6).prop_map(|b| MetadataCommand::RemoveBroker { broker: BrokerId(b) }),
        3 => (name(&TOPICS), 0u32..6, 0u32..5).prop_map(|(topic, partitions, replication_factor)| MetadataCommand::CreateTopic {
            topic, partitions, replication_factor, retention: RetentionPolicy::default()
        }),
        1 => name(&TOPICS).prop_map(|topic| MetadataCommand::DeleteTopic { topic }),
        2 => (name(&TOPICS), 1u64..5, 0u32..5, 0u64..3).prop_map(|(topic, topic_id, p, epoch)| MetadataCommand::MoveSettled {
            topic, topic_id, partition: PartitionIndex(p), epoch
        }),
        2 => (name(&TOPICS), 1u64..5, proptest::collection::vec((0u32..5, 0u64..3), 0..4)).prop_map(|(topic, topic_id, reports)| MetadataCommand::MovesSettled {
            topic, topic_id, partitions: reports.into_iter().map(|(p, epoch)| (PartitionIndex(p), epoch)).collect()
        }),
        1 => (name(&TOPICS), 0u32..5, proptest::collection::vec(1u64..6, 0..4)).prop_map(|(topic, p, replicas)| MetadataCommand::MoveReplicas {
            topic, partition: PartitionIndex(p), replicas: replicas.into_iter().map(BrokerId).collect()
        }),
        6 => (name(&GROUPS), name(&MEMBERS), proptest::collection::vec(name(&TOPICS), 0..4), prop_oneof![Just(50u64), Just(100), Just(500), Just(1000), Just(1001)], proptest::option::of(assignor))
            .prop_map(|(group, member, topics, session_timeout_ms, assignor)| MetadataCommand::JoinGroup { group, member, topics, session_timeout_ms, assignor }),
        2 => (name(&GROUPS), name(&MEMBERS)).prop_map(|(group, member)| MetadataCommand::LeaveGroup { group, member }),
        2 => (name(&GROUPS), proptest::collection::vec((name(&MEMBERS), 0u64..6), 0..3)).prop_map(|(group, members)| MetadataCommand::ExpireMembers { group, members }),
        1 => Just(MetadataCommand::AllocateProducerId),
        2 => (name(&TOPICS), proptest::option::of(0u32..6), proptest::option::of((proptest::option::of(1u64..10), proptest::option::of(1u64..10))))
            .prop_map(|(topic, partitions, retention)| MetadataCommand::AlterTopic {
                topic, partitions, retention: retention.map(|(max_age_ms, max_bytes)| RetentionPolicy { max_age_ms, max_bytes })
            }),
        1 => name(&GROUPS).prop_map(|group| MetadataCommand::DeleteGroup { group }),
        2 => (name(&USERS), any::<bool>(), any::<bool>()).prop_map(|(user, usable, replace)| MetadataCommand::SetUser {
            user,
            // An unusable credential: a salt too short.
            credential: Credential::derive(b"secret", vec![7; if usable { 16 } else { 4 }], 1),
            replace,
        }),
        1 => name(&USERS).prop_map(|user| MetadataCommand::DeleteUser { user }),
        2 => acl().prop_map(|acl| MetadataCommand::AddAcl { acl }),
        1 => acl().prop_map(|acl| MetadataCommand::RemoveAcl { acl }),
    ]
}

const USERS: [&str; 3] = ["alice", "bob", "bad name"];

/// Rules over a small pool, some unusable (an operation of another kind of
/// resource, a bad principal, a cluster rule with a name).
fn acl() -> impl Strategy<Value = Acl> {
    let kind = proptest::sample::select(&[ResourceKind::Topic, ResourceKind::Group, ResourceKind::Cluster][..]);
    let operation = proptest::sample::select(&Operation::ALL[..]);
    let principal = proptest::sample::select(&["alice", "*", "bad name"][..]).prop_map(str::to_string);
    let pattern = proptest::sample::select(&[PatternKind::Literal, PatternKind::Prefix][..]);
    let name = proptest::sample::select(&["a", "", "g1"][..]).prop_map(str::to_string);
    (principal, kind, pattern, name, operation).prop_map(|(principal, resource, pattern, name, operation)| Acl {
        principal,
        resource,
        pattern,
        name,
        operation,
    })
}

#[derive(Clone)]
struct ModelMember {
    topics: BTreeSet<String>,
    epoch: u64,
}

#[derive(Clone)]
struct ModelGroup {
    assignor: AssignorKind,
    members: BTreeMap<String, ModelMember>,
    next_epoch: u64,
}

/// The reference model: plain maps of strings, and the rules written out
/// once more in the order the documentation gives them.
#[derive(Clone)]
struct Model {
    limits: Limits,
    brokers: BTreeMap<u64, String>,
    /// Topic name to each partition's replicas.
    topics: BTreeMap<String, Vec<Vec<u64>>>,
    /// Brokers moved off a partition whose group may still name them.
    leaving: BTreeMap<(String, u32), BTreeSet<u64>>,
    /// Each topic's id, the next id, each partition's placement epoch, and
    /// the partitions whose group reported it started (MoveSettled).
    ids: BTreeMap<String, u64>,
    next_topic_id: u64,
    epochs: BTreeMap<(String, u32), u64>,
    started: BTreeSet<(String, u32)>,
    groups: BTreeMap<String, ModelGroup>,
    /// Where a group created from now on starts its member epochs: above
    /// every deleted group's.
    epoch_floor: u64,
    /// Each topic's retention.
    retention: BTreeMap<String, RetentionPolicy>,
    next_producer: u64,
    users: BTreeSet<String>,
    acls: BTreeSet<Acl>,
}

fn legal(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c))
        && name != "."
        && name != ".."
}

type Expected = Result<(), &'static str>;

impl Model {
    fn new() -> Self {
        Model {
            limits: limits(),
            brokers: BTreeMap::new(),
            topics: BTreeMap::new(),
            leaving: BTreeMap::new(),
            ids: BTreeMap::new(),
            next_topic_id: 1,
            epochs: BTreeMap::new(),
            started: BTreeSet::new(),
            groups: BTreeMap::new(),
            epoch_floor: 1,
            retention: BTreeMap::new(),
            next_producer: 1,
            users: BTreeSet::new(),
            acls: BTreeSet::new(),
        }
    }

    /// What the command should do; `Ok` commands also update the model
    /// (topic placements are taken from the real outcome, then checked).
    fn expect(&self, command: &MetadataCommand) -> Expected {
        let l = &self.limits;
        match command {
            MetadataCommand::RegisterBroker { broker, address, .. } => {
                if address.is_empty()
                    || address.len() > l.broker_address_bytes_max as usize
                    || address.contains(char::is_whitespace)
                {
                    return Err("InvalidBrokerAddress");
                }
                if !self.brokers.contains_key(&broker.0) && self.brokers.len() >= l.brokers_max as usize {
                    return Err("TooManyBrokers");
                }
                Ok(())
            }
            MetadataCommand::RemoveBroker { broker } => {
                if !self.brokers.contains_key(&broker.0) {
                    return Err("UnknownBroker");
                }
                if self.topics.values().flatten().any(|r| r.contains(&broker.0))
                    || self.leaving.values().any(|l| l.contains(&broker.0))
                {
                    return Err("BrokerHoldsReplicas");
                }
                Ok(())
            }
            MetadataCommand::CreateTopic { topic, partitions, replication_factor, .. } => {
                if !legal(topic) {
                    return Err("InvalidName");
                }
                if self.topics.contains_key(topic) {
                    return Err("TopicExists");
                }
                if *partitions == 0 || *partitions > l.partitions_per_topic_max {
                    return Err("InvalidPartitionCount");
                }
                if *replication_factor > l.replication_factor_max {
                    return Err("ReplicationFactorTooHigh");
                }
                if self.topics.len() >= l.topics_max as usize {
                    return Err("TooManyTopics");
                }
                if *replication_factor == 0 || *replication_factor as usize > self.brokers.len() {
                    return Err("Placement");
                }
                Ok(())
            }
            MetadataCommand::DeleteTopic { topic } => {
                if !legal(topic) {
                    return Err("InvalidName");
                }
                if !self.topics.contains_key(topic) {
                    return Err("UnknownTopic");
                }
                Ok(())
            }
            MetadataCommand::MoveReplicas { topic, partition, replicas } => {
                if !legal(topic) {
                    return Err("InvalidName");
                }
                let Some(partitions) = self.topics.get(topic) else {
                    return Err("UnknownTopic");
                };
                if partition.0 as usize >= partitions.len() {
                    return Err("UnknownPartition");
                }
                let distinct: BTreeSet<_> = replicas.iter().collect();
                if replicas.is_empty()
                    || distinct.len() != replicas.len()
                    || replicas.len() > l.replication_factor_max as usize
                    || replicas.iter().any(|b| !self.brokers.contains_key(&b.0))
                    || replicas.len() != partitions[0].len()
                {
                    return Err("InvalidReplicas");
                }
                if !self.started.contains(&(topic.clone(), partition.0)) {
                    return Err("PartitionNotStarted");
                }
                Ok(())
            }
            MetadataCommand::MoveSettled { topic, topic_id, partition, epoch } => {
                if !legal(topic) {
                    return Err("InvalidName");
                }
                if self.ids.get(topic) != Some(topic_id)
                    || self.epochs.get(&(topic.clone(), partition.0)) != Some(epoch)
                {
                    return Err("StaleMoveReport");
                }
                Ok(())
            }
            // Stale partitions are listed in the outcome, not refused.
            MetadataCommand::MovesSettled { topic, topic_id, .. } => {
                if !legal(topic) {
                    return Err("InvalidName");
                }
                if self.ids.get(topic) != Some(topic_id) {
                    return Err("StaleMoveReport");
                }
                Ok(())
            }
            MetadataCommand::JoinGroup { group, member, topics, session_timeout_ms, assignor } => {
                if !legal(group) || !legal(member) {
                    return Err("InvalidName");
                }
                if topics.is_empty() {
                    return Err("EmptySubscription");
                }
                if topics.len() > l.subscriptions_per_member_max as usize {
                    return Err("TooManySubscriptions");
                }
                if !topics.iter().all(|t| legal(t)) {
                    return Err("InvalidName");
                }
                if !(l.session_timeout_ms_min..=l.session_timeout_ms_max).contains(session_timeout_ms) {
                    return Err("SessionTimeoutOutOfRange");
                }
                match self.groups.get(group) {
                    None if self.groups.len() >= l.groups_max as usize => Err("TooManyGroups"),
                    None => Ok(()),
                    // No assignor named: the group's own, never a mismatch.
                    Some(g) if assignor.is_some_and(|a| a != g.assignor) && !g.members.is_empty() => {
                        Err("AssignorMismatch")
                    }
                    Some(g)
                        if !g.members.contains_key(member) && g.members.len() >= l.members_per_group_max as usize =>
                    {
                        Err("TooManyMembers")
                    }
                    Some(_) => Ok(()),
                }
            }
            MetadataCommand::LeaveGroup { group, member } => {
                if !legal(group) || !legal(member) {
                    return Err("InvalidName");
                }
                let Some(g) = self.groups.get(group) else {
                    return Err("UnknownGroup");
                };
                if !g.members.contains_key(member) {
                    return Err("UnknownMember");
                }
                Ok(())
            }
            MetadataCommand::ExpireMembers { group, .. } => {
                if !legal(group) {
                    return Err("InvalidName");
                }
                if !self.groups.contains_key(group) {
                    return Err("UnknownGroup");
                }
                Ok(())
            }
            MetadataCommand::AllocateProducerId => Ok(()),
            MetadataCommand::AlterTopic { topic, partitions, .. } => {
                if !legal(topic) {
                    return Err("InvalidName");
                }
                let Some(placed) = self.topics.get(topic) else {
                    return Err("UnknownTopic");
                };
                let requested = partitions.unwrap_or(placed.len() as u32);
                if (requested as usize) < placed.len() {
                    return Err("PartitionCountDecrease");
                }
                if requested > l.partitions_per_topic_max {
                    return Err("InvalidPartitionCount");
                }
                if requested as usize > placed.len() && placed[0].len() > self.brokers.len() {
                    return Err("Placement");
                }
                Ok(())
            }
            MetadataCommand::DeleteGroup { group } => {
                if !legal(group) {
                    return Err("InvalidName");
                }
                match self.groups.get(group) {
                    None => Err("UnknownGroup"),
                    Some(g) if !g.members.is_empty() => Err("GroupHasMembers"),
                    Some(_) => Ok(()),
                }
            }
            MetadataCommand::SetUser { user, credential, replace } => {
                let usable = legal(user) && credential.salt.len() >= 16;
                if !usable || (self.users.contains(user) && !replace) {
                    return Err("Access");
                }
                Ok(())
            }
            MetadataCommand::DeleteUser { user } => {
                if !self.users.contains(user) {
                    return Err("Access");
                }
                Ok(())
            }
            MetadataCommand::AddAcl { acl } => {
                let usable = (acl.principal == "*" || legal(&acl.principal))
                    && acl.operation.applies_to(acl.resource)
                    && match acl.resource {
                        ResourceKind::Cluster => acl.name.is_empty(),
                        _ => legal(&acl.name) || (acl.pattern == PatternKind::Prefix && acl.name.is_empty()),
                    };
                if !usable {
                    return Err("Access");
                }
                Ok(())
            }
            MetadataCommand::RemoveAcl { acl } => {
                if !self.acls.contains(acl) {
                    return Err("Access");
                }
                Ok(())
            }
            // Not generated: moves settling and drains are tested by example
            // in tests/rejections.rs.
            MetadataCommand::DrainBroker { .. } => unreachable!("not generated"),
            // Not generated: settings and group forgetting are tested by
            // example in tests/rejections.rs.
            MetadataCommand::SetLimit { .. } | MetadataCommand::ForgetGroup { .. } => unreachable!("not generated"),
        }
    }

    /// Apply an accepted command to the model.
    fn apply(&mut self, command: &MetadataCommand, outcome: &MetadataOutcome) -> Result<(), TestCaseError> {
        match (command, outcome) {
            (MetadataCommand::RegisterBroker { broker, address, .. }, _) => {
                self.brokers.insert(broker.0, address.clone());
            }
            (MetadataCommand::RemoveBroker { broker }, _) => {
                self.brokers.remove(&broker.0);
            }
            (
                MetadataCommand::CreateTopic { topic, partitions, replication_factor, .. },
                MetadataOutcome::TopicCreated { placements, .. },
            ) => {
                prop_assert_eq!(placements.len(), *partitions as usize);
                for placement in placements {
                    prop_assert_eq!(placement.replicas.len(), *replication_factor as usize);
                }
                self.topics.insert(
                    topic.clone(),
                    placements.iter().map(|p| p.replicas.iter().map(|b| b.0).collect()).collect(),
                );
                self.ids.insert(topic.clone(), self.next_topic_id);
                self.next_topic_id += 1;
                for p in 0..placements.len() as u32 {
                    self.epochs.insert((topic.clone(), p), 0);
                }
            }
            (MetadataCommand::DeleteTopic { topic }, _) => {
                self.topics.remove(topic);
                self.leaving.retain(|(t, _), _| t != topic);
                self.ids.remove(topic);
                self.retention.remove(topic);
                self.epochs.retain(|(t, _), _| t != topic);
                self.started.retain(|(t, _)| t != topic);
            }
            (MetadataCommand::MoveSettled { topic, partition, .. }, MetadataOutcome::MoveSettled { .. }) => {
                self.leaving.remove(&(topic.clone(), partition.0));
                self.started.insert((topic.clone(), partition.0));
            }
            (
                MetadataCommand::MovesSettled { topic, partitions, .. },
                MetadataOutcome::MovesSettled { settled, stale, .. },
            ) => {
                let mut expected_settled = Vec::new();
                let mut expected_stale = Vec::new();
                for (partition, epoch) in partitions {
                    if self.epochs.get(&(topic.clone(), partition.0)) == Some(epoch) {
                        self.leaving.remove(&(topic.clone(), partition.0));
                        self.started.insert((topic.clone(), partition.0));
                        expected_settled.push(*partition);
                    } else {
                        expected_stale.push(*partition);
                    }
                }
                assert_eq!((settled, stale), (&expected_settled, &expected_stale), "the partitions settled and stale");
            }
            (MetadataCommand::MoveReplicas { topic, partition, replicas }, _) => {
                let to: Vec<u64> = replicas.iter().map(|b| b.0).collect();
                let from =
                    std::mem::replace(&mut self.topics.get_mut(topic).unwrap()[partition.0 as usize], to.clone());
                let leaving = self.leaving.entry((topic.clone(), partition.0)).or_default();
                leaving.extend(from);
                leaving.retain(|b| !to.contains(b));
                *self.epochs.get_mut(&(topic.clone(), partition.0)).expect("a placed partition") += 1;
            }
            (
                MetadataCommand::JoinGroup { group, member, topics, assignor, .. },
                MetadataOutcome::Joined { member_epoch, .. },
            ) => {
                let assignor =
                    assignor.unwrap_or_else(|| self.groups.get(group).map_or(AssignorKind::default(), |g| g.assignor));
                let entry = self.groups.entry(group.clone()).or_insert(ModelGroup {
                    assignor,
                    members: BTreeMap::new(),
                    next_epoch: self.epoch_floor,
                });
                entry.assignor = assignor;
                let topics: BTreeSet<String> = topics.iter().cloned().collect();
                // Every join is a new membership epoch.
                entry.members.insert(member.clone(), ModelMember { topics, epoch: entry.next_epoch });
                entry.next_epoch += 1;
                prop_assert_eq!(entry.members[member].epoch, *member_epoch);
            }
            (MetadataCommand::LeaveGroup { group, member }, _) => {
                self.groups.get_mut(group).unwrap().members.remove(member);
            }
            (MetadataCommand::ExpireMembers { group, members }, MetadataOutcome::MembersExpired { expired, .. }) => {
                let g = self.groups.get_mut(group).unwrap();
                let mut expected = Vec::new();
                for (member, epoch) in members {
                    if g.members.get(member).is_some_and(|m| m.epoch == *epoch) {
                        g.members.remove(member);
                        expected.push(member.clone());
                    }
                }
                let got: Vec<String> = expired.iter().map(|m| m.as_str().to_string()).collect();
                prop_assert_eq!(got, expected);
            }
            (
                MetadataCommand::AlterTopic { topic, partitions, retention },
                MetadataOutcome::TopicAltered { partitions: now, added, .. },
            ) => {
                let placed = self.topics.get_mut(topic).unwrap();
                let replication_factor = placed[0].len();
                prop_assert_eq!(*now as usize, partitions.map_or(placed.len(), |p| p as usize));
                prop_assert_eq!(placed.len() + added.len(), *now as usize);
                for placement in added {
                    prop_assert_eq!(placement.replicas.len(), replication_factor);
                    prop_assert_eq!(placement.epoch, 0);
                    self.epochs.insert((topic.clone(), placed.len() as u32), 0);
                    placed.push(placement.replicas.iter().map(|b| b.0).collect());
                }
                if let Some(retention) = retention {
                    self.retention.insert(topic.clone(), *retention);
                }
            }
            (MetadataCommand::DeleteGroup { group }, MetadataOutcome::GroupDeleted { .. }) => {
                let deleted = self.groups.remove(group).unwrap();
                self.epoch_floor = self.epoch_floor.max(deleted.next_epoch);
            }
            (MetadataCommand::SetUser { user, replace, .. }, MetadataOutcome::Access(outcome)) => {
                let existed = !self.users.insert(user.clone());
                prop_assert!(*replace || !existed);
                let replaced = matches!(outcome, AccessOutcome::UserSet { replaced: true, .. });
                prop_assert_eq!(replaced, existed);
            }
            (MetadataCommand::DeleteUser { user }, MetadataOutcome::Access(AccessOutcome::UserDeleted { .. })) => {
                prop_assert!(self.users.remove(user));
            }
            (MetadataCommand::AddAcl { acl }, MetadataOutcome::Access(AccessOutcome::AclAdded { added })) => {
                prop_assert_eq!(*added, self.acls.insert(acl.clone()));
            }
            (MetadataCommand::RemoveAcl { acl }, MetadataOutcome::Access(AccessOutcome::AclRemoved)) => {
                prop_assert!(self.acls.remove(acl));
            }
            (MetadataCommand::AllocateProducerId, MetadataOutcome::ProducerIdAllocated { producer }) => {
                prop_assert_eq!(producer.0, self.next_producer);
                self.next_producer += 1;
            }
            (command, outcome) => {
                prop_assert!(false, "{command:?} gave the wrong outcome kind {outcome:?}")
            }
        }
        Ok(())
    }

    /// The state agrees with the model on everything the model tracks.
    fn compare(&self, state: &MetadataState) -> Result<(), TestCaseError> {
        let users: BTreeSet<String> = state.access().users().map(ToString::to_string).collect();
        prop_assert_eq!(&users, &self.users);
        let acls: BTreeSet<Acl> = state.access().acls().collect();
        prop_assert_eq!(&acls, &self.acls);
        let brokers: BTreeMap<u64, String> = state.brokers().iter().map(|(id, b)| (id.0, b.address.clone())).collect();
        prop_assert_eq!(&brokers, &self.brokers);
        let topics: BTreeMap<String, Vec<Vec<u64>>> = state
            .topics()
            .iter()
            .map(|(name, t)| {
                (name.to_string(), t.partitions.iter().map(|p| p.replicas.iter().map(|b| b.0).collect()).collect())
            })
            .collect();
        prop_assert_eq!(&topics, &self.topics);
        for (name, retention) in &self.retention {
            if let Some(topic) = state.topic(&TopicName::new(name.as_str()).unwrap()) {
                prop_assert_eq!(&topic.retention, retention);
            }
        }
        prop_assert_eq!(state.groups().len(), self.groups.len());
        for (name, group) in &self.groups {
            let real = state.group(&GroupName::new(name.as_str()).unwrap()).unwrap();
            prop_assert_eq!(real.members.len(), group.members.len());
            for (member, m) in &group.members {
                let r = &real.members[&MemberId::new(member.as_str()).unwrap()];
                let topics: BTreeSet<String> = r.topics.iter().map(TopicName::to_string).collect();
                prop_assert_eq!(&topics, &m.topics);
                prop_assert_eq!(r.member_epoch, m.epoch);
            }
        }
        Ok(())
    }
}

fn rejection_kind(rejection: &MetadataRejection) -> &'static str {
    match rejection {
        MetadataRejection::InvalidName(_) => "InvalidName",
        MetadataRejection::InvalidBrokerAddress { .. } => "InvalidBrokerAddress",
        MetadataRejection::TooManyBrokers { .. } => "TooManyBrokers",
        MetadataRejection::UnknownBroker { .. } => "UnknownBroker",
        MetadataRejection::BrokerHoldsReplicas { .. } => "BrokerHoldsReplicas",
        MetadataRejection::StaleMoveReport { .. } => "StaleMoveReport",
        MetadataRejection::TooManyReports { .. } => "TooManyReports",
        MetadataRejection::PartitionNotStarted { .. } => "PartitionNotStarted",
        MetadataRejection::NowhereToDrain { .. } => "NowhereToDrain",
        MetadataRejection::TopicExists { .. } => "TopicExists",
        MetadataRejection::UnknownTopic { .. } => "UnknownTopic",
        MetadataRejection::InvalidPartitionCount { .. } => "InvalidPartitionCount",
        MetadataRejection::ReplicationFactorTooHigh { .. } => "ReplicationFactorTooHigh",
        MetadataRejection::Placement(_) => "Placement",
        MetadataRejection::TooManyTopics { .. } => "TooManyTopics",
        MetadataRejection::UnknownPartition { .. } => "UnknownPartition",
        MetadataRejection::InvalidReplicas { .. } => "InvalidReplicas",
        MetadataRejection::UnknownGroup { .. } => "UnknownGroup",
        MetadataRejection::UnknownMember { .. } => "UnknownMember",
        MetadataRejection::EmptySubscription => "EmptySubscription",
        MetadataRejection::TooManySubscriptions { .. } => "TooManySubscriptions",
        MetadataRejection::SessionTimeoutOutOfRange { .. } => "SessionTimeoutOutOfRange",
        MetadataRejection::TooManyGroups { .. } => "TooManyGroups",
        MetadataRejection::TooManyMembers { .. } => "TooManyMembers",
        MetadataRejection::AssignorMismatch { .. } => "AssignorMismatch",
        MetadataRejection::ProducerIdsExhausted => "ProducerIdsExhausted",
        MetadataRejection::Access(_) => "Access",
        MetadataRejection::PartitionCountDecrease { .. } => "PartitionCountDecrease",
        MetadataRejection::GroupHasMembers { .. } => "GroupHasMembers",
        MetadataRejection::Setting(_) => "Setting",
        MetadataRejection::SettingBelowCurrent { .. } => "SettingBelowCurrent",
        MetadataRejection::GroupNotExpired { .. } => "GroupNotExpired",
    }
}

/// Command sequences, valid and invalid, for the model test and the fuzzer.
pub fn commands() -> impl Strategy<Value = Vec<MetadataCommand>> {
    proptest::collection::vec(command(), 1..80)
}

/// Apply `commands` to the state machine and to the model side by side,
/// checking invariants, rejections and round trips after every step.
pub fn check_commands(commands: &[MetadataCommand]) -> Result<(), TestCaseError> {
    let mut state = MetadataState::new(limits());
    let mut model = Model::new();
    let mut deleted_generations: BTreeMap<GroupName, keel_core::Generation> = BTreeMap::new();
    for (step, command) in commands.iter().enumerate() {
        let at = TimestampMs(step as u64 * 10);
        let before = state.clone();
        let expected = model.expect(command);
        let result = state.apply(at, command);
        common::round_trip(command)?;
        common::round_trip(&result)?;
        common::round_trip(&state)?;
        state.check_invariants().map_err(|e| TestCaseError::fail(format!("step {step} {command:?}: {e}")))?;
        match (&expected, &result) {
            (Ok(()), Ok(outcome)) => model.apply(command, outcome)?,
            (Err(kind), Err(rejection)) => {
                prop_assert_eq!(*kind, rejection_kind(rejection), "step {} {:?}", step, command);
                // The kind the simulation counts is the same name, and listed.
                prop_assert_eq!(rejection.kind(), rejection_kind(rejection));
                prop_assert!(MetadataRejection::KINDS.contains(&rejection.kind()));
                prop_assert!(!rejection.to_string().is_empty());
                prop_assert_eq!(state.brokers(), before.brokers());
                prop_assert_eq!(state.topics(), before.topics());
                prop_assert_eq!(state.groups(), before.groups());
            }
            _ => prop_assert!(false, "step {step} {command:?}: model expected {expected:?}, state gave {result:?}"),
        }
        model.compare(&state)?;
        // Generations never go back, and move by one exactly when the
        // assignment changed.
        if let (MetadataCommand::DeleteGroup { .. }, Ok(MetadataOutcome::GroupDeleted { group })) = (command, &result) {
            let deleted = before.group(group).unwrap().generation;
            let highest = deleted_generations.entry(group.clone()).or_insert(deleted);
            *highest = (*highest).max(deleted);
        }
        for (name, group) in state.groups().iter() {
            let Some(old) = before.group(name) else {
                // A group created after a deletion of the same name starts
                // above the deleted one's generation (its claims are fenced).
                if let Some(deleted) = deleted_generations.get(name) {
                    prop_assert!(group.generation > *deleted, "group {} restarted at {:?}", name, group.generation);
                }
                continue;
            };
            let changed = old.assignment != group.assignment;
            prop_assert_eq!(group.generation.0, old.generation.0 + u64::from(changed), "group {}", name);
        }
        if let Ok(MetadataOutcome::Joined { generation, partitions, .. }) = &result {
            if let MetadataCommand::JoinGroup { group, member, .. } = command {
                let info = state.group(&GroupName::new(group.as_str()).unwrap()).unwrap();
                prop_assert_eq!(*generation, info.generation);
                prop_assert_eq!(partitions, &info.partitions_of(&MemberId::new(member.as_str()).unwrap()));
            }
        }
    }
    let (applied, rejected) = state.command_counts();
    prop_assert_eq!(applied + rejected, commands.len() as u64);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn metadata_matches_the_model(commands in commands()) {
        check_commands(&commands)?;
    }
}
