//! How refusals become gRPC statuses, with messages that say what to do.

use keel_core::metadata::MetadataRejection;
use keel_core::partition::PartitionRejection;
use keel_core::NameError;
use tonic::{Code, Status};

use crate::node::{MembershipError, ProposeError};

/// Response metadata naming the leader to retry at: `<id>@<host:port>`.
pub const LEADER_METADATA: &str = "keel-leader";
/// Response metadata naming a partition's replicas: `<id>@<host:port>,...`.
pub const REPLICAS_METADATA: &str = "keel-replicas";
/// Response metadata marking a member epoch fenced by a later join.
pub const FENCED_METADATA: &str = "keel-fenced";
/// Response metadata marking a topic incarnation that was deleted.
pub const TOPIC_GONE_METADATA: &str = "keel-topic-gone";
/// Response metadata marking a producer the partition no longer knows.
pub const PRODUCER_LOST_METADATA: &str = "keel-producer-lost";
/// Response metadata marking a batch refused because its sequence is ahead
/// of the next expected (so it was not appended).
pub const SEQUENCE_GAP_METADATA: &str = "keel-sequence-gap";

fn with_metadata(mut status: Status, key: &'static str, value: &str) -> Status {
    if let Ok(value) = value.parse() {
        status.metadata_mut().insert(key, value);
    }
    status
}

/// A refusal naming the leader to retry at.
pub(super) fn with_leader(status: Status, leader: u64, address: &str) -> Status {
    with_metadata(status, LEADER_METADATA, &format!("{leader}@{address}"))
}

/// A member epoch that a later join of the same member id replaced: this
/// process is fenced for good (rejoining would fence the other one).
pub(super) fn fenced_member(error: &keel_core::coordinator::HeartbeatError) -> Status {
    with_metadata(Status::failed_precondition(error.to_string()), FENCED_METADATA, "member-epoch")
}

/// A refusal naming a deleted topic incarnation.
pub(super) fn topic_gone(status: Status) -> Status {
    with_metadata(status, TOPIC_GONE_METADATA, "true")
}

pub(super) fn invalid_name(error: NameError) -> Status {
    Status::invalid_argument(error.to_string())
}

pub(super) fn not_leader(error: ProposeError) -> Status {
    match &error {
        ProposeError::NotLeader { leader: Some(leader), address: Some(address), .. } => with_metadata(
            Status::failed_precondition(error.to_string()),
            LEADER_METADATA,
            &format!("{leader}@{address}"),
        ),
        ProposeError::NotLeader { .. } => {
            Status::unavailable(format!("{error}: no leader is known yet, retry shortly"))
        }
        ProposeError::GroupNotHere { .. } => Status::failed_precondition(error.to_string()),
        ProposeError::Raft { .. } => Status::unavailable(format!("{error}: retry shortly")),
        ProposeError::LeadershipLost { .. } => Status::unavailable(error.to_string()),
    }
}

pub(super) fn membership_error(error: MembershipError) -> Status {
    match error {
        MembershipError::Propose(error) => not_leader(error),
        MembershipError::Rejected(rejection) => metadata_rejection(rejection),
        MembershipError::CatchUpTimeout { .. } => Status::deadline_exceeded(error.to_string()),
        MembershipError::LastBroker { .. } => Status::failed_precondition(error.to_string()),
        MembershipError::Busy { .. } => Status::unavailable(error.to_string()),
    }
}

/// A partition hosted elsewhere: name its replicas.
pub(super) fn elsewhere(message: String, replicas: &str) -> Status {
    with_metadata(Status::failed_precondition(message), REPLICAS_METADATA, replicas)
}

pub(super) fn metadata_rejection(rejection: MetadataRejection) -> Status {
    use MetadataRejection::*;
    let code = match &rejection {
        InvalidName(_)
        | InvalidBrokerAddress { .. }
        | InvalidPartitionCount { .. }
        | ReplicationFactorTooHigh { .. } => Code::InvalidArgument,
        Placement(_) | InvalidReplicas { .. } | EmptySubscription | SessionTimeoutOutOfRange { .. } => {
            Code::InvalidArgument
        }
        TooManySubscriptions { .. } => Code::InvalidArgument,
        TopicExists { .. } => Code::AlreadyExists,
        UnknownBroker { .. }
        | UnknownTopic { .. }
        | UnknownPartition { .. }
        | UnknownGroup { .. }
        | UnknownMember { .. } => Code::NotFound,
        TooManyBrokers { .. }
        | TooManyTopics { .. }
        | TooManyGroups { .. }
        | TooManyMembers { .. }
        | ProducerIdsExhausted => Code::ResourceExhausted,
        // Clients retry: the group starts as soon as its brokers are up.
        PartitionNotStarted { .. } => Code::Unavailable,
        BrokerHoldsReplicas { .. } | AssignorMismatch { .. } | StaleMoveReport { .. } | NowhereToDrain { .. } => {
            Code::FailedPrecondition
        }
        PartitionCountDecrease { .. } | TooManyReports { .. } => Code::InvalidArgument,
        GroupHasMembers { .. } => Code::FailedPrecondition,
        Setting(keel_core::limits::SettingError::Unknown { .. }) => Code::NotFound,
        Setting(_) => Code::InvalidArgument,
        SettingBelowCurrent { .. } | GroupNotExpired { .. } => Code::FailedPrecondition,
        Access(access) => {
            use keel_core::access::AccessRejection as A;
            match access {
                A::InvalidName(_) | A::InvalidCredential { .. } | A::InvalidAcl { .. } => Code::InvalidArgument,
                A::UserExists { .. } => Code::AlreadyExists,
                A::UnknownUser { .. } | A::UnknownAcl { .. } => Code::NotFound,
                A::TooManyUsers { .. } | A::TooManyAcls { .. } => Code::ResourceExhausted,
            }
        }
    };
    Status::new(code, rejection.to_string())
}

pub(super) fn partition_rejection(rejection: PartitionRejection) -> Status {
    use PartitionRejection::*;
    let code = match &rejection {
        InvalidName(_) | EmptyBatch | InvalidRecord { .. } | PositionOutOfRange { .. } => Code::InvalidArgument,
        TooManyRecords { .. }
        | BatchTooLarge { .. }
        | TooManyBatches { .. }
        | TooManyGroups { .. }
        | OffsetOverflow => Code::ResourceExhausted,
        SequenceGap { .. } | SequenceTooOld { .. } | UnknownProducer { .. } => Code::FailedPrecondition,
        Fenced { .. } | NotClaimed { .. } => Code::Aborted,
        EpochFenced { .. } | GroupActive { .. } => Code::FailedPrecondition,
        // Internal only (membership changes); a lagging replica: retry.
        StalePlacement { .. } => Code::Unavailable,
        CommitBeyondHighWatermark { .. } | CommitBackwards { .. } => Code::OutOfRange,
    };
    let lost = matches!(rejection, SequenceTooOld { .. } | UnknownProducer { .. });
    let fenced = matches!(rejection, EpochFenced { .. });
    // A producer unknown here that sent a sequence past 0 may just be ahead
    // of its own first batch (several in flight): a gap too.
    let gap = matches!(rejection, SequenceGap { .. } | UnknownProducer { .. });
    let mut status = Status::new(code, rejection.to_string());
    if gap {
        status = with_metadata(status, SEQUENCE_GAP_METADATA, "true");
    }
    if lost {
        return with_metadata(status, PRODUCER_LOST_METADATA, "true");
    }
    if fenced {
        return with_metadata(status, FENCED_METADATA, "member-epoch");
    }
    status
}
