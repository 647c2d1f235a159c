//! Target 4: decoding. The first byte picks a message; the rest is its
//! encoding. Public requests are protobuf (what gRPC hands the service);
//! Raft messages are postcard (what the transport decodes). Whatever
//! decodes goes through validation and the state machines it would reach;
//! the result must be a clear error or a valid value, never a panic.

use keel_core::metadata::{MetadataCommand, MetadataState};
use keel_core::partition::{MemoryLog, PartitionCommand, PartitionState};
use keel_core::record::Record;
use keel_core::{GroupName, Limits, MemberId, Offset, TimestampMs, TopicName};
use keel_proto::v1 as pb;
use keel_server::api::to_record;
use keel_server::raft::types::{Command, Request, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::EntryPayload;
use prost::Message;

pub fn decode(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else { return };
    match kind % 12 {
        0 => public::<pb::ProduceRequest>(bytes, produce),
        1 => public::<pb::PollRequest>(bytes, |r| names(&[&r.topic], &[&r.group], &[&r.member])),
        2 => public::<pb::AckRequest>(bytes, ack),
        3 => public::<pb::JoinGroupRequest>(bytes, join),
        4 => public::<pb::CreateTopicRequest>(bytes, create_topic),
        5 => public::<pb::ReadRequest>(bytes, |r| names(&[&r.topic], &[], &[])),
        6 => public::<pb::ResetGroupPositionRequest>(bytes, |r| names(&[&r.topic], &[&r.group], &[])),
        7 => public::<pb::MovePartitionRequest>(bytes, move_partition),
        8 => raft::<AppendEntriesRequest<TypeConfig>>(bytes, |r| {
            for entry in r.entries {
                if let EntryPayload::Normal(request) = entry.payload {
                    apply(request);
                }
            }
        }),
        9 => raft::<VoteRequest<u64>>(bytes, |_| {}),
        10 => raft::<InstallSnapshotRequest<TypeConfig>>(bytes, |_| {}),
        _ => raft::<Request>(bytes, apply),
    }
}

fn public<M: Message + Default>(bytes: &[u8], validate: impl FnOnce(M)) {
    if let Ok(message) = M::decode(bytes) {
        validate(message);
    }
}

fn raft<T: serde::de::DeserializeOwned>(bytes: &[u8], then: impl FnOnce(T)) {
    if let Ok(message) = postcard::from_bytes::<T>(bytes) {
        then(message);
    }
}

/// Names validate to a value or a clear error.
fn names(topics: &[&str], groups: &[&str], members: &[&str]) {
    for topic in topics {
        if let Err(error) = TopicName::new(*topic) {
            assert!(!error.to_string().is_empty());
        }
    }
    for group in groups {
        let _ = GroupName::new(*group);
    }
    for member in members {
        let _ = MemberId::new(*member);
    }
}

/// A produce request: each record validated, then the batch applied to a
/// partition, which appends it or records a rejection.
fn produce(request: pb::ProduceRequest) {
    names(&[&request.topic], &[], &[]);
    let limits = Limits::default();
    let records: Vec<Record> = request.records.into_iter().map(to_record).collect();
    for record in &records {
        let _ = record.validate(&limits);
    }
    let producer = request.idempotent.then_some(keel_core::partition::ProducerBatch {
        producer: keel_core::ProducerId(request.producer_id),
        sequence: keel_core::Sequence(request.sequence),
    });
    apply_partition(PartitionCommand::Append { producer, records });
}

fn ack(request: pb::AckRequest) {
    names(&[&request.topic], &[&request.group], &[&request.member]);
    apply_partition(PartitionCommand::Commit {
        group: request.group,
        member: request.member,
        generation: keel_core::Generation(request.generation),
        member_epoch: request.member_epoch,
        offset: Offset(request.offset),
    });
}

fn join(request: pb::JoinGroupRequest) {
    apply_metadata(MetadataCommand::JoinGroup {
        group: request.group,
        member: request.member,
        topics: request.topics,
        session_timeout_ms: request.session_timeout_ms,
        assignor: Default::default(),
    });
}

fn create_topic(request: pb::CreateTopicRequest) {
    apply_metadata(MetadataCommand::CreateTopic {
        topic: request.topic,
        partitions: request.partitions,
        replication_factor: request.replication_factor,
        retention: keel_core::metadata::RetentionPolicy {
            max_age_ms: request.retention_ms,
            max_bytes: request.retention_bytes,
        },
    });
}

fn move_partition(request: pb::MovePartitionRequest) {
    apply_metadata(MetadataCommand::MoveReplicas {
        topic: request.topic,
        partition: keel_core::PartitionIndex(request.partition),
        replicas: request.replicas.into_iter().map(keel_core::BrokerId).collect(),
    });
}

/// A decoded Raft entry's command, applied to fresh state machines of
/// both kinds (whichever group it reached).
fn apply(request: Request) {
    match std::sync::Arc::unwrap_or_clone(request.command) {
        Command::Metadata(command) => apply_metadata(command),
        Command::Partition(command) => apply_partition(command),
    }
}

fn apply_metadata(command: MetadataCommand) {
    let mut state = MetadataState::new(Limits::default());
    for broker in 1..=3 {
        let register = MetadataCommand::RegisterBroker {
            broker: keel_core::BrokerId(broker),
            address: format!("h:{broker}"),
            internal_address: format!("i:{broker}"),
        };
        state.apply(TimestampMs(1), &register).expect("registering a broker");
    }
    let before = state.clone();
    match state.apply(TimestampMs(2), &command) {
        Ok(_) => {}
        Err(rejection) => {
            assert!(!rejection.to_string().is_empty());
            assert_eq!(state.topics(), before.topics(), "a rejection changed the topics");
            assert_eq!(state.groups(), before.groups(), "a rejection changed the groups");
        }
    }
    state.check_invariants().expect("metadata invariants hold");
}

fn apply_partition(command: PartitionCommand) {
    let mut state = PartitionState::new(Limits::default());
    let mut log = MemoryLog::new();
    let seed = PartitionCommand::Append { producer: None, records: vec![Record::from_value(b"seed".to_vec())] };
    state.apply(&mut log, TimestampMs(1), &seed).expect("memory log").expect("appending a record");
    let before = state.clone();
    match state.apply(&mut log, TimestampMs(2), &command).expect("memory log") {
        Ok(_) => {}
        Err(rejection) => {
            assert!(!rejection.to_string().is_empty());
            assert_eq!(state.high_watermark(), before.high_watermark(), "a rejection changed the log");
            assert_eq!(state.groups(), before.groups(), "a rejection changed the groups");
        }
    }
    state.check_invariants(&log).expect("partition invariants hold");
}
