//! Partition commands, their outcomes and their rejections.

use serde::{Deserialize, Serialize};

use crate::id::{Generation, GroupName, NameError, Offset, ProducerId, Sequence};
use crate::metadata::RetentionPolicy;
use crate::record::{Record, RecordError};

/// An idempotent producer's identity on one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerBatch {
    pub producer: ProducerId,
    /// This batch's sequence for this partition: 0 for the producer's first
    /// batch here, then one more for each batch.
    pub sequence: Sequence,
}

/// One producer's batch inside an [`PartitionCommand::AppendBatches`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendBatch {
    pub producer: Option<ProducerBatch>,
    pub records: Vec<Record>,
}

/// Most batches one [`PartitionCommand::AppendBatches`] carries.
pub const APPEND_BATCHES_MAX: usize = 4096;

/// A change to one partition. The leader stamps each with its own time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionCommand {
    /// Append a batch of records, idempotently if `producer` is set.
    Append { producer: Option<ProducerBatch>, records: Vec<Record> },
    /// Append several batches, each exactly as an `Append` of its own, in
    /// order: the leader gathers concurrent produce requests into one Raft
    /// entry. Each batch has its own outcome, rejection and sequence check.
    AppendBatches { batches: Vec<AppendBatch> },
    /// Claim the partition for a group's member in a generation (G5), as
    /// the member joined with `member_epoch`: from then on, commits from
    /// older generations, and from older joins of the same member id, are
    /// fenced.
    Claim { group: String, member: String, generation: Generation, member_epoch: u64 },
    /// Commit every offset up to and including `offset` for the group (G4).
    Commit { group: String, member: String, generation: Generation, member_epoch: u64, offset: Offset },
    /// Set a group's position (the next offset it reads) by hand; the admin
    /// path, allowed only while the group has no members (checked by the
    /// server against the metadata group).
    ResetPosition { group: String, position: Offset },
    /// Remove records that the topic's retention no longer keeps.
    ApplyRetention { policy: RetentionPolicy },
    /// Drop a group's position and claim here (the group is being deleted;
    /// the server checks that it has no members, as for `ResetPosition`).
    ForgetGroup { group: String },
    /// Drop the position and claim of a group no longer in the metadata
    /// (forgotten there, or deleted without its positions), if nothing has
    /// claimed, committed or reset it here for `idle_ms`: proposed by the
    /// partition leader with the cluster's `group_retention_ms`, so a group
    /// of that name re-created and used in between is kept.
    ForgetIdleGroup { group: String, idle_ms: u64 },
    /// The group's membership is about to follow the partition's placement
    /// of this `epoch` (the metadata counts a partition's moves): proposed
    /// by the leader before it changes voters or learners. A placement
    /// older than one already followed is refused, so a leader whose
    /// metadata lags (after a restart) cannot move the group back onto
    /// replicas that no longer run it.
    FollowPlacement { epoch: u64 },
}

/// What an applied partition command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionOutcome {
    /// The batch sits at `base_offset .. base_offset + count`. `duplicate`
    /// says it was a retry answered with the original offsets (G8).
    Appended {
        base_offset: Offset,
        count: u32,
        duplicate: bool,
    },
    /// The outcome of each batch of an `AppendBatches`, in order.
    AppendedBatches {
        results: Vec<PartitionResult>,
    },
    /// The claim holds; the member reads from `position`.
    Claimed {
        generation: Generation,
        position: Offset,
    },
    /// The group's position (next offset to read) is now `position`.
    Committed {
        position: Offset,
    },
    PositionReset {
        position: Offset,
    },
    /// The group has no position or claim here any more; `had_position`
    /// says whether it had one.
    GroupForgotten {
        had_position: bool,
    },
    /// Retention ran; groups whose position fell below the new log start
    /// are listed with their position (they lost records they had not read).
    Retained {
        log_start: Offset,
        removed_records: u64,
        groups_behind: Vec<(GroupName, Offset)>,
    },
    /// The group follows the placement of `epoch` from now on.
    PlacementFollowed {
        epoch: u64,
    },
}

/// Why a partition command changed nothing. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PartitionRejection {
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error("the batch is empty: send at least one record")]
    EmptyBatch,
    #[error("the batch has {count} records; the limit is {max}: split it")]
    TooManyRecords { count: u64, max: u32 },
    #[error("the batch is {bytes} bytes; the limit is {max}: split it")]
    BatchTooLarge { bytes: u64, max: u32 },
    #[error("the entry carries {count} batches; the limit is {max}")]
    TooManyBatches { count: u64, max: u64 },
    #[error("record {index} of the batch: {error}")]
    InvalidRecord { index: u32, error: RecordError },
    #[error("producer {producer} sent sequence {got} but {expected} was next: resend the missing batches in order")]
    SequenceGap { producer: ProducerId, expected: Sequence, got: Sequence },
    #[error("producer {producer} resent sequence {got}, older than the retries this partition remembers: it was appended; do not resend it")]
    SequenceTooOld { producer: ProducerId, got: Sequence },
    #[error("producer {producer} is not known here and sent sequence {got}, not 0: its state expired; restart it with a new producer id")]
    UnknownProducer { producer: ProducerId, got: Sequence },
    #[error("the partition's offsets are exhausted")]
    OffsetOverflow,
    #[error(
        "group {group} generation {generation} is fenced: generation {current} holds this partition; rejoin the group"
    )]
    Fenced { group: GroupName, generation: Generation, current: Generation },
    #[error("group {group}: member {member} does not hold a claim on this partition in generation {generation}: poll first to claim it")]
    NotClaimed { group: GroupName, member: String, generation: Generation },
    #[error(
        "group {group}: member {member} joined again (member epoch {current} holds this partition), and this process \
         holds epoch {member_epoch}: it is fenced; stop it, or give each process its own member id"
    )]
    EpochFenced { group: GroupName, member: String, member_epoch: u64, current: u64 },
    #[error("commit of offset {offset} is beyond the high watermark {high_watermark}: commit only offsets you read")]
    CommitBeyondHighWatermark { offset: Offset, high_watermark: Offset },
    #[error("commit of offset {offset} would move the group back from position {position}: commits only go forward")]
    CommitBackwards { offset: Offset, position: Offset },
    #[error("position {position} is outside the log [{log_start}, {high_watermark}]")]
    PositionOutOfRange { position: Offset, log_start: Offset, high_watermark: Offset },
    #[error(
        "this partition already tracks {max} groups (groups_per_partition_max, fixed when its topic was created): \
         delete groups no longer used (keel group delete, which also removes their positions here)"
    )]
    TooManyGroups { max: u32 },
    #[error("group {group} was used here {idle_ms_ago} ms ago, within {idle_ms} ms: it is kept")]
    GroupActive { group: GroupName, idle_ms_ago: u64, idle_ms: u64 },
    #[error(
        "the placement of epoch {epoch} is older than epoch {current}, which this partition already follows: the \
         proposer's metadata lags; it retries once its metadata has caught up"
    )]
    StalePlacement { epoch: u64, current: u64 },
}

impl PartitionRejection {
    /// Every kind of rejection, by name (the simulation counts which occur).
    pub const KINDS: [&'static str; 19] = [
        "InvalidName",
        "EmptyBatch",
        "TooManyRecords",
        "BatchTooLarge",
        "TooManyBatches",
        "InvalidRecord",
        "SequenceGap",
        "SequenceTooOld",
        "UnknownProducer",
        "OffsetOverflow",
        "Fenced",
        "NotClaimed",
        "EpochFenced",
        "CommitBeyondHighWatermark",
        "CommitBackwards",
        "PositionOutOfRange",
        "TooManyGroups",
        "GroupActive",
        "StalePlacement",
    ];

    /// This rejection's kind: its variant's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidName(_) => "InvalidName",
            Self::EmptyBatch => "EmptyBatch",
            Self::TooManyRecords { .. } => "TooManyRecords",
            Self::BatchTooLarge { .. } => "BatchTooLarge",
            Self::TooManyBatches { .. } => "TooManyBatches",
            Self::InvalidRecord { .. } => "InvalidRecord",
            Self::SequenceGap { .. } => "SequenceGap",
            Self::SequenceTooOld { .. } => "SequenceTooOld",
            Self::UnknownProducer { .. } => "UnknownProducer",
            Self::OffsetOverflow => "OffsetOverflow",
            Self::Fenced { .. } => "Fenced",
            Self::NotClaimed { .. } => "NotClaimed",
            Self::EpochFenced { .. } => "EpochFenced",
            Self::CommitBeyondHighWatermark { .. } => "CommitBeyondHighWatermark",
            Self::CommitBackwards { .. } => "CommitBackwards",
            Self::PositionOutOfRange { .. } => "PositionOutOfRange",
            Self::TooManyGroups { .. } => "TooManyGroups",
            Self::GroupActive { .. } => "GroupActive",
            Self::StalePlacement { .. } => "StalePlacement",
        }
    }
}

/// The recorded result of applying one partition command.
pub type PartitionResult = Result<PartitionOutcome, PartitionRejection>;

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<E: std::error::Error + 'static> {
    #[error("offset {requested} is outside the log [{log_start}, {high_watermark}]: read from the log start or a committed position")]
    OffsetOutOfRange { requested: Offset, log_start: Offset, high_watermark: Offset },
    #[error("storage failed: {0}")]
    Storage(#[source] E),
}
