//! Metadata commands, their outcomes and their rejections.
//!
//! Commands carry names as plain strings, exactly as a client sent them:
//! apply validates them again, so an entry that slipped past the edge (or was
//! written by another version) is rejected rather than applied or panicked on.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::state::RetentionPolicy;
use crate::access::{AccessOutcome, AccessRejection, Acl, Credential};
use crate::assignor::AssignorKind;
use crate::id::{
    BrokerId, Generation, GroupName, MemberId, NameError, PartitionIndex, ProducerId, TimestampMs, TopicName,
    TopicPartition,
};
use crate::limits::SettingError;
use crate::placement::{PartitionPlacement, PlacementError};

/// A change to the cluster's metadata. The leader stamps each with its own
/// time when it proposes it; apply receives that time as an argument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataCommand {
    /// Add a broker, or update a known broker's addresses: `address` for
    /// clients, `internal_address` for other brokers (Raft).
    RegisterBroker { broker: BrokerId, address: String, internal_address: String },
    /// Remove a broker that holds no replicas.
    RemoveBroker { broker: BrokerId },
    /// Create a topic and place all of its partitions, or none.
    CreateTopic { topic: String, partitions: u32, replication_factor: u32, retention: RetentionPolicy },
    /// Delete a topic and hand its partitions out of every group.
    DeleteTopic { topic: String },
    /// Move one partition's replicas to another set of brokers.
    MoveReplicas { topic: String, partition: PartitionIndex, replicas: Vec<BrokerId> },
    /// A partition's leader reports that its group's membership is exactly
    /// the placement of `epoch` (of the topic incarnation `topic_id`): the
    /// brokers the moves left may go.
    MoveSettled { topic: String, topic_id: u64, partition: PartitionIndex, epoch: u64 },
    /// Move every replica off `broker`, each to the least loaded other
    /// broker that does not hold the partition, and place nothing new on it.
    DrainBroker { broker: BrokerId },
    /// Add a member to a group (creating the group), or change its
    /// subscription. Every join gives the member a new epoch (fencing the
    /// holder of the older one); rejoining with the same subscription keeps
    /// the assignment and the generation.
    /// `assignor`: the one the member asks for; `None` takes the group's
    /// own (sticky for a new group), decided here in apply so that a join
    /// racing another cannot resolve it from stale metadata.
    JoinGroup {
        group: String,
        member: String,
        topics: Vec<String>,
        session_timeout_ms: u64,
        assignor: Option<AssignorKind>,
    },
    /// Remove a member; its partitions are handed on at once.
    LeaveGroup { group: String, member: String },
    /// Remove members whose sessions lapsed on the coordinator. Each member
    /// is named with the epoch it joined with, so a member that rejoined after
    /// the coordinator decided is left alone.
    ExpireMembers { group: String, members: Vec<(String, u64)> },
    /// Hand out a fresh idempotent producer id.
    AllocateProducerId,
    /// Change a topic's settings: its retention, and its partition count,
    /// which may only grow (the new partitions are placed as a new topic's
    /// would be, and groups reading the topic rebalance). `None` keeps a
    /// setting as it is.
    AlterTopic { topic: String, partitions: Option<u32>, retention: Option<RetentionPolicy> },
    /// Forget a group that has no members. Its partition positions are
    /// removed separately (`PartitionCommand::ForgetGroup`); a group of the
    /// same name created later starts above every generation and member
    /// epoch the deleted one reached, so its claims supersede any left.
    DeleteGroup { group: String },
    /// Create a user with a hashed secret, or (with `replace`) give an
    /// existing user a new one.
    SetUser { user: String, credential: Credential, replace: bool },
    /// Delete a user: its secret stops working at once. Its rules stay (a
    /// certificate may carry the same name).
    DeleteUser { user: String },
    /// Grant what the rule names.
    AddAcl { acl: Acl },
    /// Take back a rule added before.
    RemoveAcl { acl: Acl },
    /// Change a cluster setting (one of `Limits`): every replica applies it
    /// at the same point of the log, so all agree on what it admits.
    SetLimit { name: String, value: u64 },
    /// Forget a group that has had no members since `empty_since` (as the
    /// state records it) for at least `group_retention_ms`, as `DeleteGroup`
    /// does. Proposed by the metadata leader; naming `empty_since` makes a
    /// proposal about a group that was used again in between stale.
    ForgetGroup { group: String, empty_since: TimestampMs },
    /// What `MoveSettled` reports for one partition, for several of one
    /// topic at once (at most [`SETTLED_REPORTS_MAX`]): the metadata leader
    /// gathers concurrent reports into one entry. Each partition whose
    /// epoch still matches settles; the others are stale and stay as they
    /// are.
    MovesSettled { topic: String, topic_id: u64, partitions: Vec<(PartitionIndex, u64)> },
}

/// Most partitions one `MovesSettled` names.
pub const SETTLED_REPORTS_MAX: usize = 1024;

/// What an applied metadata command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataOutcome {
    BrokerRegistered {
        broker: BrokerId,
    },
    BrokerRemoved {
        broker: BrokerId,
    },
    TopicCreated {
        topic: TopicName,
        placements: Vec<PartitionPlacement>,
    },
    TopicDeleted {
        topic: TopicName,
        partitions: u32,
    },
    ReplicasMoved {
        partition: TopicPartition,
        from: Vec<BrokerId>,
        to: Vec<BrokerId>,
    },
    MoveSettled {
        partition: TopicPartition,
    },
    /// `moved` replicas were moved off `broker`.
    BrokerDrained {
        broker: BrokerId,
        moved: u64,
    },
    /// The member is in the group; `partitions` are its assignment.
    Joined {
        generation: Generation,
        member_epoch: u64,
        partitions: Vec<TopicPartition>,
    },
    Left {
        generation: Generation,
    },
    MembersExpired {
        generation: Generation,
        expired: Vec<MemberId>,
    },
    ProducerIdAllocated {
        producer: ProducerId,
    },
    /// The topic now has `partitions` partitions; `added` are the new ones.
    TopicAltered {
        topic: TopicName,
        partitions: u32,
        added: Vec<PartitionPlacement>,
    },
    GroupDeleted {
        group: GroupName,
    },
    /// The setting `name` changed from `previous` to `value`.
    LimitSet {
        name: String,
        previous: u64,
        value: u64,
    },
    GroupForgotten {
        group: GroupName,
    },
    Access(AccessOutcome),
    /// Of a `MovesSettled`, the partitions that settled and those whose
    /// report was stale (another epoch).
    MovesSettled {
        topic: TopicName,
        settled: Vec<PartitionIndex>,
        stale: Vec<PartitionIndex>,
    },
}

/// Why a metadata command changed nothing. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MetadataRejection {
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error("broker address {address:?} is not usable: {reason}")]
    InvalidBrokerAddress { address: String, reason: String },
    #[error("the cluster already has {max} brokers: raise brokers_max (keel cluster config set) or remove one")]
    TooManyBrokers { max: u32 },
    #[error("broker {broker} is not registered: register it first, or check the id")]
    UnknownBroker { broker: BrokerId },
    #[error(
        "broker {broker} still holds {replicas} partition replicas, or is still a member of their Raft groups while \
         they move: move them to other brokers first (keel cluster drain), and wait until their groups drop it"
    )]
    BrokerHoldsReplicas { broker: BrokerId, replicas: u64 },
    #[error(
        "partition {partition} of topic {topic} (id {topic_id}) is not at placement epoch {epoch} any more: the \
         report is stale, and the partition's leader reports again"
    )]
    StaleMoveReport { topic: String, topic_id: u64, partition: PartitionIndex, epoch: u64 },
    #[error(
        "partition {partition} has not started yet (its replicas have not run its Raft group; a topic created \
         while its brokers were down starts once they are back): retry the move once it has a leader"
    )]
    PartitionNotStarted { partition: TopicPartition },
    #[error(
        "broker {broker}'s replica of {partition} has nowhere to go: every other broker already holds it or is \
         draining; add a broker first"
    )]
    NowhereToDrain { broker: BrokerId, partition: TopicPartition },
    #[error("topic {topic} already exists: pick another name or delete it first")]
    TopicExists { topic: TopicName },
    #[error("topic {topic} does not exist: create it first, or check the name")]
    UnknownTopic { topic: String },
    #[error("a topic needs 1 to {max} partitions, not {requested}")]
    InvalidPartitionCount { requested: u32, max: u32 },
    #[error("replication factor {requested} is above the limit of {max}")]
    ReplicationFactorTooHigh { requested: u32, max: u32 },
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("the cluster already has {max} topics: delete one or raise topics_max (keel cluster config set)")]
    TooManyTopics { max: u32 },
    #[error("topic {topic} has {partitions} partitions, so partition {partition} does not exist")]
    UnknownPartition { topic: TopicName, partition: PartitionIndex, partitions: u32 },
    #[error("replica set {replicas:?} is not usable: {reason}")]
    InvalidReplicas { replicas: Vec<BrokerId>, reason: String },
    #[error("group {group} does not exist: join it first, or check the name")]
    UnknownGroup { group: String },
    #[error("member {member} is not in group {group}: join the group again")]
    UnknownMember { group: String, member: String },
    #[error("a member must subscribe to at least one topic")]
    EmptySubscription,
    #[error("a member may subscribe to at most {max} topics, not {count}")]
    TooManySubscriptions { count: u64, max: u32 },
    #[error("session timeout {requested} ms is outside {min}-{max} ms")]
    SessionTimeoutOutOfRange { requested: u64, min: u64, max: u64 },
    #[error(
        "the cluster already has {max} groups: raise groups_max (keel cluster config set groups_max N), delete \
         unused groups, or lower group_retention_ms so empty groups are forgotten sooner"
    )]
    TooManyGroups { max: u32 },
    #[error("group {group} already has {max} members: raise members_per_group_max (keel cluster config set)")]
    TooManyMembers { group: String, max: u32 },
    #[error("group {group} uses the {current:?} assignor, not {requested:?}: join with the group's assignor")]
    AssignorMismatch { group: String, current: AssignorKind, requested: AssignorKind },
    #[error("producer ids are exhausted")]
    ProducerIdsExhausted,
    #[error(
        "topic {topic} has {current} partitions and cannot shrink to {requested}: partitions can only be added \
         (create a new topic to have fewer)"
    )]
    PartitionCountDecrease { topic: TopicName, current: u32, requested: u32 },
    #[error("group {group} has {members} members: stop them, or wait for their sessions to expire, then delete it")]
    GroupHasMembers { group: GroupName, members: u32 },
    #[error(transparent)]
    Access(#[from] AccessRejection),
    #[error(transparent)]
    Setting(#[from] SettingError),
    #[error(
        "{name} cannot be {value}: the cluster already has {current} (e.g. {example}); remove some first, or choose \
         at least {current}"
    )]
    SettingBelowCurrent { name: String, value: u64, current: u64, example: String },
    #[error("group {group} is not forgotten: {reason}")]
    GroupNotExpired { group: String, reason: String },
    #[error("one report names {count} partitions, more than {max}: report them in several")]
    TooManyReports { count: usize, max: usize },
}

impl MetadataRejection {
    /// Every kind of rejection, by name (the simulation counts which occur).
    pub const KINDS: [&'static str; 32] = [
        "InvalidName",
        "InvalidBrokerAddress",
        "TooManyBrokers",
        "UnknownBroker",
        "BrokerHoldsReplicas",
        "StaleMoveReport",
        "PartitionNotStarted",
        "NowhereToDrain",
        "TopicExists",
        "UnknownTopic",
        "InvalidPartitionCount",
        "ReplicationFactorTooHigh",
        "Placement",
        "TooManyTopics",
        "UnknownPartition",
        "InvalidReplicas",
        "UnknownGroup",
        "UnknownMember",
        "EmptySubscription",
        "TooManySubscriptions",
        "SessionTimeoutOutOfRange",
        "TooManyGroups",
        "TooManyMembers",
        "AssignorMismatch",
        "ProducerIdsExhausted",
        "PartitionCountDecrease",
        "GroupHasMembers",
        "Access",
        "Setting",
        "SettingBelowCurrent",
        "GroupNotExpired",
        "TooManyReports",
    ];

    /// This rejection's kind: its variant's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidName(_) => "InvalidName",
            Self::InvalidBrokerAddress { .. } => "InvalidBrokerAddress",
            Self::TooManyBrokers { .. } => "TooManyBrokers",
            Self::UnknownBroker { .. } => "UnknownBroker",
            Self::BrokerHoldsReplicas { .. } => "BrokerHoldsReplicas",
            Self::StaleMoveReport { .. } => "StaleMoveReport",
            Self::PartitionNotStarted { .. } => "PartitionNotStarted",
            Self::NowhereToDrain { .. } => "NowhereToDrain",
            Self::TopicExists { .. } => "TopicExists",
            Self::UnknownTopic { .. } => "UnknownTopic",
            Self::InvalidPartitionCount { .. } => "InvalidPartitionCount",
            Self::ReplicationFactorTooHigh { .. } => "ReplicationFactorTooHigh",
            Self::Placement(_) => "Placement",
            Self::TooManyTopics { .. } => "TooManyTopics",
            Self::UnknownPartition { .. } => "UnknownPartition",
            Self::InvalidReplicas { .. } => "InvalidReplicas",
            Self::UnknownGroup { .. } => "UnknownGroup",
            Self::UnknownMember { .. } => "UnknownMember",
            Self::EmptySubscription => "EmptySubscription",
            Self::TooManySubscriptions { .. } => "TooManySubscriptions",
            Self::SessionTimeoutOutOfRange { .. } => "SessionTimeoutOutOfRange",
            Self::TooManyGroups { .. } => "TooManyGroups",
            Self::TooManyMembers { .. } => "TooManyMembers",
            Self::AssignorMismatch { .. } => "AssignorMismatch",
            Self::ProducerIdsExhausted => "ProducerIdsExhausted",
            Self::PartitionCountDecrease { .. } => "PartitionCountDecrease",
            Self::GroupHasMembers { .. } => "GroupHasMembers",
            Self::Access(_) => "Access",
            Self::Setting(_) => "Setting",
            Self::SettingBelowCurrent { .. } => "SettingBelowCurrent",
            Self::GroupNotExpired { .. } => "GroupNotExpired",
            Self::TooManyReports { .. } => "TooManyReports",
        }
    }
}

/// The recorded result of applying one metadata command.
pub type MetadataResult = Result<MetadataOutcome, MetadataRejection>;

/// Subscriptions as a set of validated names.
pub(super) fn validate_subscription(topics: &[String], max: u32) -> Result<BTreeSet<TopicName>, MetadataRejection> {
    if topics.is_empty() {
        return Err(MetadataRejection::EmptySubscription);
    }
    if topics.len() as u64 > u64::from(max) {
        return Err(MetadataRejection::TooManySubscriptions { count: topics.len() as u64, max });
    }
    topics.iter().map(|t| TopicName::new(t.as_str()).map_err(MetadataRejection::from)).collect()
}

/// A validated member id.
pub(super) fn validate_member(member: &str) -> Result<MemberId, MetadataRejection> {
    Ok(MemberId::new(member)?)
}
